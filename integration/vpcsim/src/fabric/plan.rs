//! The reconcile plan: a pure diff from `Observed` to `Desired`, as an ordered list of `Op`s,
//! plus the router firewall (source/destination check, IGW) rendered as iptables-restore text.
//! Must not touch the kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::model::{Desired, DesiredEni, Neighbour, Observed, RouteTarget, host};
use super::names::{ENI_PORT_PREFIX, IGW_ROUTER_DEV, eni_dev, eni_port};

/// One step of a reconcile, applied in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Delete a node namespace (its ENI links go with it).
    DeleteNode {
        /// instance id
        instance_id: String,
    },
    /// Delete an ENI link (router port and node end go together).
    DeletePort {
        /// router-side port
        port: String,
    },
    /// Delete a stray link in a node namespace (an `ethN` whose router end is gone).
    DeleteNodeLink {
        /// instance id
        instance_id: String,
        /// link name
        name: String,
    },
    /// Create a node namespace with IMDS and EC2 endpoint addresses on `lo`.
    CreateNode {
        /// instance id
        instance_id: String,
    },
    /// Create an ENI link: a veth `port` (router) <-> `ethN` (node) carrying the ENI's MAC.
    /// The primary ENI (`primary` set) comes up configured as DHCP would configure it; others
    /// stay down and unconfigured.
    CreateEni {
        /// instance id
        instance_id: String,
        /// ENI id (stored as ifalias on both ends)
        eni_id: String,
        /// router-side port
        port: String,
        /// node-side name
        dev: String,
        /// MAC as EC2 reports it
        mac: String,
        /// primary-ENI configuration: address with subnet prefix, default gateway
        primary: Option<(Ipv4Net, Ipv4Addr)>,
    },
    /// Delete a router route.
    DeleteRoute {
        /// destination
        dst: Ipv4Net,
    },
    /// Delete a permanent neighbour.
    DeleteNeighbour {
        /// the entry
        neighbour: Neighbour,
    },
    /// Remove a gateway address from the router's `lo`.
    DeleteGateway {
        /// address
        ip: Ipv4Addr,
    },
    /// Add a gateway address (/32) to the router's `lo`.
    AddGateway {
        /// address
        ip: Ipv4Addr,
    },
    /// Add or replace a permanent neighbour.
    ReplaceNeighbour {
        /// the entry
        neighbour: Neighbour,
    },
    /// Add or replace a router route.
    ReplaceRoute {
        /// destination
        dst: Ipv4Net,
        /// target
        target: RouteTarget,
    },
    /// Replace the router's `mangle` and `filter` tables with this iptables-restore input.
    LoadFirewall {
        /// iptables-restore text
        rules: String,
    },
}

/// What the router's routing table must hold.
pub fn desired_routes(desired: &Desired) -> BTreeMap<Ipv4Net, RouteTarget> {
    let mut routes: BTreeMap<Ipv4Net, RouteTarget> = desired
        .vpc_cidrs
        .iter()
        .map(|c| (*c, RouteTarget::Unreachable))
        .collect();
    for eni in enis(desired) {
        let dev = eni_port(&eni.eni_id);
        routes.insert(host(eni.primary_ip), RouteTarget::Port { dev: dev.clone() });
        let via = RouteTarget::Via {
            via: eni.primary_ip,
            dev,
        };
        for ip in &eni.secondary_ips {
            routes.insert(host(*ip), via.clone());
        }
        for p in &eni.prefixes {
            routes.insert(*p, via.clone());
        }
    }
    routes
}

/// The permanent neighbours: each ENI's primary IP -> its MAC on its port (the next hop of every
/// address the ENI owns: the VPC delivers to the ENI's MAC without asking ARP, as AWS does).
pub fn desired_neighbours(desired: &Desired) -> BTreeSet<Neighbour> {
    enis(desired)
        .map(|e| Neighbour {
            dev: eni_port(&e.eni_id),
            ip: e.primary_ip,
            mac: e.mac.to_ascii_lowercase(),
        })
        .collect()
}

fn enis(desired: &Desired) -> impl Iterator<Item = &DesiredEni> {
    desired.nodes.values().flat_map(|n| n.enis.values())
}

/// The `-A` lines of the router firewall, `mangle` first, in iptables-save's canonical form.
///
/// `mangle PREROUTING`: the source/destination check (a packet entering from an ENI port must be
/// sourced from an address or prefix of that ENI). `filter FORWARD`: the IGW, which passes only
/// node primary addresses in both directions.
pub fn firewall_lines(desired: &Desired) -> (Vec<String>, Vec<String>) {
    let mut mangle = Vec::new();
    for eni in enis(desired) {
        let port = eni_port(&eni.eni_id);
        for net in eni.owned() {
            mangle.push(format!("-A PREROUTING -s {net} -i {port} -j ACCEPT"));
        }
    }
    mangle.push(format!("-A PREROUTING -i {ENI_PORT_PREFIX}+ -j DROP"));
    let primaries: Vec<Ipv4Addr> = desired
        .nodes
        .values()
        .filter_map(|n| n.primary_ip())
        .collect();
    let mut filter = Vec::new();
    for ip in &primaries {
        filter.push(format!(
            "-A FORWARD -s {ip}/32 -o {IGW_ROUTER_DEV} -j ACCEPT"
        ));
    }
    filter.push(format!("-A FORWARD -o {IGW_ROUTER_DEV} -j DROP"));
    for ip in &primaries {
        filter.push(format!(
            "-A FORWARD -d {ip}/32 -i {IGW_ROUTER_DEV} -j ACCEPT"
        ));
    }
    filter.push(format!("-A FORWARD -i {IGW_ROUTER_DEV} -j DROP"));
    (mangle, filter)
}

/// iptables-restore input replacing the router's `mangle` and `filter` tables.
pub fn firewall_restore(desired: &Desired) -> String {
    let (mangle, filter) = firewall_lines(desired);
    let mut s = String::from("*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n");
    s.push_str(":FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n");
    for l in &mangle {
        s.push_str(l);
        s.push('\n');
    }
    s.push_str(
        "COMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
    );
    for l in &filter {
        s.push_str(l);
        s.push('\n');
    }
    s.push_str("COMMIT\n");
    s
}

/// The ordered steps that turn `observed` into `desired`. Empty when they agree.
pub fn plan(desired: &Desired, observed: &Observed) -> Vec<Op> {
    let mut ops = Vec::new();

    // namespaces
    for id in &observed.node_namespaces {
        if !desired.nodes.contains_key(id) {
            ops.push(Op::DeleteNode {
                instance_id: id.clone(),
            });
        }
    }

    // ENI links: a link is right when its port carries the ENI id and the node holds `ethN`
    // with the same alias and MAC; anything else is deleted and recreated.
    let mut wanted_ports: BTreeMap<String, (&str, &DesiredEni)> = BTreeMap::new();
    for (id, node) in &desired.nodes {
        for eni in node.enis.values() {
            wanted_ports.insert(eni_port(&eni.eni_id), (id.as_str(), eni));
        }
    }
    let link_ok = |id: &str, eni: &DesiredEni| -> bool {
        observed.ports.get(&eni_port(&eni.eni_id)) == Some(&Some(eni.eni_id.clone()))
            && observed.node_links.get(id).is_some_and(|links| {
                links.iter().any(|l| {
                    l.name == eni_dev(eni.device_index)
                        && l.alias.as_deref() == Some(eni.eni_id.as_str())
                        && l.mac.eq_ignore_ascii_case(&eni.mac)
                })
            })
    };
    let mut deleted_ports = BTreeSet::new();
    for port in observed.ports.keys() {
        let keep = wanted_ports
            .get(port)
            .is_some_and(|(id, eni)| link_ok(id, eni));
        if !keep {
            ops.push(Op::DeletePort { port: port.clone() });
            deleted_ports.insert(port.clone());
        }
    }
    // node-side links with no (kept) router end: left over or taking a wanted name
    for (id, links) in &observed.node_links {
        if !desired.nodes.contains_key(id) {
            continue;
        }
        for l in links {
            // a deleted port takes its node end with it
            let backed = l
                .alias
                .as_deref()
                .is_some_and(|a| observed.ports.contains_key(&eni_port(a)));
            if !backed {
                ops.push(Op::DeleteNodeLink {
                    instance_id: id.clone(),
                    name: l.name.clone(),
                });
            }
        }
    }
    for id in desired.nodes.keys() {
        if !observed.node_namespaces.contains(id) {
            ops.push(Op::CreateNode {
                instance_id: id.clone(),
            });
        }
    }
    for (port, (id, eni)) in &wanted_ports {
        if !link_ok(id, eni) {
            let primary = (eni.device_index == 0).then(|| {
                let net = Ipv4Net::new(eni.primary_ip, eni.subnet_cidr.prefix_len())
                    .unwrap_or_else(|_| host(eni.primary_ip));
                (net, eni.gateway)
            });
            ops.push(Op::CreateEni {
                instance_id: (*id).to_owned(),
                eni_id: eni.eni_id.clone(),
                port: port.clone(),
                dev: eni_dev(eni.device_index),
                mac: eni.mac.to_ascii_lowercase(),
                primary,
            });
        }
    }
    // a recreated port loses its routes and neighbours with it
    let survives = |dev: &str| !deleted_ports.contains(dev);

    // routes, neighbours, gateways
    let want_routes = desired_routes(desired);
    for (dst, target) in &observed.routes {
        let dev_alive = match target {
            RouteTarget::Port { dev } | RouteTarget::Via { dev, .. } => survives(dev),
            RouteTarget::Unreachable => true,
        };
        if dev_alive && !want_routes.contains_key(dst) {
            ops.push(Op::DeleteRoute { dst: *dst });
        }
    }
    let want_neigh = desired_neighbours(desired);
    for n in &observed.neighbours {
        if survives(&n.dev) && !want_neigh.iter().any(|w| w.dev == n.dev && w.ip == n.ip) {
            ops.push(Op::DeleteNeighbour {
                neighbour: n.clone(),
            });
        }
    }
    for ip in observed.gateways.difference(&desired.gateways) {
        ops.push(Op::DeleteGateway { ip: *ip });
    }
    for ip in desired.gateways.difference(&observed.gateways) {
        ops.push(Op::AddGateway { ip: *ip });
    }
    for n in &want_neigh {
        if !link_ok_for_port(&wanted_ports, &n.dev, &link_ok) || !observed.neighbours.contains(n) {
            ops.push(Op::ReplaceNeighbour {
                neighbour: n.clone(),
            });
        }
    }
    for (dst, target) in &want_routes {
        let dev_fresh = match target {
            RouteTarget::Port { dev } | RouteTarget::Via { dev, .. } => {
                !link_ok_for_port(&wanted_ports, dev, &link_ok)
            }
            RouteTarget::Unreachable => false,
        };
        if dev_fresh || observed.routes.get(dst) != Some(target) {
            ops.push(Op::ReplaceRoute {
                dst: *dst,
                target: target.clone(),
            });
        }
    }

    // firewall
    let (mangle, filter) = firewall_lines(desired);
    let want_fw: Vec<String> = mangle.into_iter().chain(filter).collect();
    if observed.firewall != want_fw {
        ops.push(Op::LoadFirewall {
            rules: firewall_restore(desired),
        });
    }
    ops
}

fn link_ok_for_port(
    wanted: &BTreeMap<String, (&str, &DesiredEni)>,
    port: &str,
    link_ok: &impl Fn(&str, &DesiredEni) -> bool,
) -> bool {
    wanted.get(port).is_some_and(|(id, eni)| link_ok(id, eni))
}

#[cfg(test)]
mod tests {
    use super::super::model::{DesiredNode, NodeLink};
    use super::*;

    fn eni(id: &str, idx: u32, ip: [u8; 4], mac: &str) -> DesiredEni {
        DesiredEni {
            eni_id: id.into(),
            device_index: idx,
            mac: mac.into(),
            primary_ip: Ipv4Addr::from(ip),
            secondary_ips: BTreeSet::new(),
            prefixes: BTreeSet::new(),
            subnet_cidr: "198.18.0.0/20".parse().unwrap(),
            gateway: Ipv4Addr::new(198, 18, 0, 1),
        }
    }

    fn world() -> Desired {
        let mut e0 = eni("eni-00000000000a", 0, [198, 18, 0, 10], "02:00:00:00:00:0a");
        e0.secondary_ips.insert(Ipv4Addr::new(198, 18, 0, 11));
        let mut e1 = eni("eni-00000000000b", 1, [198, 18, 0, 20], "02:00:00:00:00:0B");
        e1.prefixes.insert("198.18.0.32/28".parse().unwrap());
        let node = DesiredNode {
            instance_id: "i-1".into(),
            enis: [(0, e0), (1, e1)].into_iter().collect(),
        };
        Desired {
            vpc_cidrs: ["198.18.0.0/16".parse().unwrap()].into_iter().collect(),
            gateways: [Ipv4Addr::new(198, 18, 0, 1)].into_iter().collect(),
            nodes: [("i-1".to_owned(), node)].into_iter().collect(),
        }
    }

    /// What the kernel would read back after applying `plan(d, empty)` perfectly.
    fn converged(d: &Desired) -> Observed {
        let (m, f) = firewall_lines(d);
        Observed {
            node_namespaces: d.nodes.keys().cloned().collect(),
            ports: enis(d)
                .map(|e| (eni_port(&e.eni_id), Some(e.eni_id.clone())))
                .collect(),
            node_links: d
                .nodes
                .iter()
                .map(|(id, n)| {
                    let links = n
                        .enis
                        .values()
                        .map(|e| NodeLink {
                            name: eni_dev(e.device_index),
                            mac: e.mac.to_ascii_lowercase(),
                            alias: Some(e.eni_id.clone()),
                        })
                        .collect();
                    (id.clone(), links)
                })
                .collect(),
            routes: desired_routes(d),
            neighbours: desired_neighbours(d),
            gateways: d.gateways.clone(),
            firewall: m.into_iter().chain(f).collect(),
        }
    }

    #[test]
    fn empty_kernel_gets_everything_in_dependency_order() {
        let d = world();
        let ops = plan(&d, &Observed::default());
        let pos = |f: &dyn Fn(&Op) -> bool| ops.iter().position(f).unwrap();
        let node = pos(&|o| matches!(o, Op::CreateNode { .. }));
        let eth0 = pos(&|o| matches!(o, Op::CreateEni { dev, .. } if dev == "eth0"));
        let route = pos(&|o| matches!(o, Op::ReplaceRoute { .. }));
        let fw = pos(&|o| matches!(o, Op::LoadFirewall { .. }));
        assert!(node < eth0 && eth0 < route && route < fw);
        let primary = ops.iter().find_map(|o| match o {
            Op::CreateEni { dev, primary, .. } if dev == "eth0" => Some(*primary),
            _ => None,
        });
        assert_eq!(
            primary,
            Some(Some((
                "198.18.0.10/20".parse().unwrap(),
                Ipv4Addr::new(198, 18, 0, 1)
            )))
        );
        let eth1_primary = ops.iter().find_map(|o| match o {
            Op::CreateEni {
                dev, primary, mac, ..
            } if dev == "eth1" => Some((*primary, mac.clone())),
            _ => None,
        });
        assert_eq!(eth1_primary, Some((None, "02:00:00:00:00:0b".to_owned())));
        // 1 unreachable + 2 primaries + 1 secondary + 1 prefix
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, Op::ReplaceRoute { .. }))
                .count(),
            5
        );
    }

    #[test]
    fn converged_state_plans_nothing() {
        let d = world();
        assert_eq!(plan(&d, &converged(&d)), vec![]);
    }

    #[test]
    fn new_secondary_ip_adds_route_and_firewall_only() {
        let before = world();
        let mut after = before.clone();
        let ip = Ipv4Addr::new(198, 18, 0, 12);
        after
            .nodes
            .get_mut("i-1")
            .unwrap()
            .enis
            .get_mut(&0)
            .unwrap()
            .secondary_ips
            .insert(ip);
        let ops = plan(&after, &converged(&before));
        assert_eq!(ops.len(), 2, "{ops:?}");
        assert!(
            matches!(&ops[0], Op::ReplaceRoute { dst, target: RouteTarget::Via { via, .. } }
            if *dst == host(ip) && *via == Ipv4Addr::new(198, 18, 0, 10))
        );
        assert!(
            matches!(&ops[1], Op::LoadFirewall { rules } if rules.contains("-s 198.18.0.12/32"))
        );
    }

    #[test]
    fn detach_deletes_port_and_its_addresses() {
        let before = world();
        let mut after = before.clone();
        after.nodes.get_mut("i-1").unwrap().enis.remove(&1);
        let ops = plan(&after, &converged(&before));
        assert!(ops.contains(&Op::DeletePort {
            port: eni_port("eni-00000000000b")
        }));
        // routes through the deleted port vanish with it; no explicit delete needed
        assert!(!ops.iter().any(|o| matches!(o, Op::DeleteRoute { .. })));
        assert!(!ops.iter().any(|o| matches!(o, Op::CreateEni { .. })));
    }

    #[test]
    fn mac_mismatch_recreates_the_link() {
        let d = world();
        let mut obs = converged(&d);
        obs.node_links.get_mut("i-1").unwrap()[1].mac = "02:ff:ff:ff:ff:ff".into();
        let ops = plan(&d, &obs);
        let port = eni_port("eni-00000000000b");
        assert!(ops.contains(&Op::DeletePort { port: port.clone() }));
        assert!(
            ops.iter()
                .any(|o| matches!(o, Op::CreateEni { port: p, .. } if *p == port))
        );
        // routes and the neighbour of the recreated port are put back
        assert!(
            ops.iter()
                .any(|o| matches!(o, Op::ReplaceNeighbour { neighbour } if neighbour.dev == port))
        );
        assert!(ops.iter().any(|o| matches!(o, Op::ReplaceRoute { target: RouteTarget::Port { dev }, .. } if *dev == port)));
    }

    #[test]
    fn terminated_instance_deletes_namespace() {
        let before = world();
        let after = Desired {
            nodes: BTreeMap::new(),
            ..before.clone()
        };
        let ops = plan(&after, &converged(&before));
        assert_eq!(
            ops[0],
            Op::DeleteNode {
                instance_id: "i-1".into()
            }
        );
    }

    #[test]
    fn firewall_allows_owned_sources_then_drops() {
        let (mangle, filter) = firewall_lines(&world());
        assert_eq!(mangle.last().unwrap(), "-A PREROUTING -i vp+ -j DROP");
        assert!(
            mangle.contains(
                &"-A PREROUTING -s 198.18.0.32/28 -i vp00000000000b -j ACCEPT".to_owned()
            )
        );
        assert!(
            mangle.contains(
                &"-A PREROUTING -s 198.18.0.11/32 -i vp00000000000a -j ACCEPT".to_owned()
            )
        );
        assert!(
            !mangle.contains(
                &"-A PREROUTING -s 198.18.0.11/32 -i vp00000000000b -j ACCEPT".to_owned()
            )
        );
        assert_eq!(
            filter,
            vec![
                "-A FORWARD -s 198.18.0.10/32 -o igw -j ACCEPT",
                "-A FORWARD -o igw -j DROP",
                "-A FORWARD -d 198.18.0.10/32 -i igw -j ACCEPT",
                "-A FORWARD -i igw -j DROP",
            ]
        );
    }
}
