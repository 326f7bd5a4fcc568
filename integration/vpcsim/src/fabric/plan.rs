//! The reconcile plan: a pure diff from `Observed` to `Desired`, as an ordered list of `Op`s,
//! plus the router firewall (source/destination check, IGW) rendered as iptables-restore text.
//! Must not touch the kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net};

use super::branch::{self, WantedBranchPort};
use super::groups;
use super::model::{BranchPort, Desired, DesiredEni, Neighbour, Observed, RouteTarget, host};
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
    /// Delete a branch port (a VLAN sub-interface of a trunk's port) in the router.
    DeleteBranchPort {
        /// router-side branch port
        port: String,
    },
    /// Create a branch port: 802.1Q id `vlan_id` on the trunk's port, alias = branch ENI id.
    CreateBranchPort {
        /// the trunk ENI's router port
        trunk_port: String,
        /// router-side branch port
        port: String,
        /// 802.1Q VLAN id
        vlan_id: u16,
        /// branch ENI id (stored as ifalias)
        eni_id: String,
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
    /// Put the primary ENI's IPv6 address on the node's `eth0` (/128, no DAD, as DHCPv6 does
    /// on EC2) with a default route via the router's link-local gateway; remove stale ones.
    SetNodeIpv6 {
        /// instance id
        instance_id: String,
        /// node-side link (`eth0`)
        dev: String,
        /// address to add (`None`: only remove)
        add: Option<Ipv6Addr>,
        /// addresses to remove
        remove: Vec<Ipv6Addr>,
    },
    /// Delete a router route.
    DeleteRoute {
        /// destination
        dst: IpNet,
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
        dst: IpNet,
        /// target
        target: RouteTarget,
    },
    /// Replace the router's `mangle` and `filter` tables with this iptables-restore input.
    LoadFirewall {
        /// iptables-restore text
        rules: String,
    },
    /// Replace the router's IPv6 `mangle` and `filter` tables with this ip6tables-restore input.
    LoadFirewall6 {
        /// ip6tables-restore text
        rules: String,
    },
}

/// What the router's routing table must hold.
/// IPv6: the VPC's /56 is unreachable, and every /128 and /80 an ENI owns goes `via` the node
/// end's link-local address on the ENI's port (a permanent neighbour, like IPv4's primary).
pub fn desired_routes(desired: &Desired) -> BTreeMap<IpNet, RouteTarget> {
    let mut routes: BTreeMap<IpNet, RouteTarget> = desired
        .vpc_cidrs
        .iter()
        .map(|c| (IpNet::V4(*c), RouteTarget::Unreachable))
        .collect();
    if let Some(c) = desired.vpc_ipv6_cidr {
        routes.insert(IpNet::V6(c), RouteTarget::Unreachable);
    }
    for eni in enis(desired) {
        let dev = eni_port(&eni.eni_id);
        routes.insert(
            host(eni.primary_ip).into(),
            RouteTarget::Port { dev: dev.clone() },
        );
        let via = RouteTarget::Via {
            via: IpAddr::V4(eni.primary_ip),
            dev: dev.clone(),
        };
        for ip in &eni.secondary_ips {
            routes.insert(host(*ip).into(), via.clone());
        }
        for p in &eni.prefixes {
            routes.insert((*p).into(), via.clone());
        }
        let via6 = RouteTarget::Via {
            via: IpAddr::V6(eni.link_local()),
            dev,
        };
        for net in eni.owned6() {
            routes.insert(net.into(), via6.clone());
        }
    }
    routes.extend(branch::routes(desired));
    routes
}

/// The permanent neighbours: each ENI's primary IP -> its MAC on its port (the next hop of every
/// address the ENI owns: the VPC delivers to the ENI's MAC without asking ARP, as AWS does).
/// ENIs with IPv6 also get `<node link-local> -> <ENI MAC>`.
pub fn desired_neighbours(desired: &Desired) -> BTreeSet<Neighbour> {
    let mut out = BTreeSet::new();
    for e in enis(desired) {
        let dev = eni_port(&e.eni_id);
        let mac = e.mac.to_ascii_lowercase();
        out.insert(Neighbour {
            dev: dev.clone(),
            ip: IpAddr::V4(e.primary_ip),
            mac: mac.clone(),
        });
        if e.has_ipv6() {
            out.insert(Neighbour {
                dev,
                ip: IpAddr::V6(e.link_local()),
                mac,
            });
        }
    }
    out.extend(branch::neighbours(desired));
    out
}

/// The router's IPv6 firewall. `mangle PREROUTING`: the source/destination check as for IPv4
/// (an ENI port's packet must come from a /128 or /80 of that ENI), with neighbour discovery let
/// through (link-local sources, link-scope multicast destinations; neither is ever forwarded).
/// `filter FORWARD`: the egress-only internet gateway: any source of the VPC's IPv6 CIDR may go
/// out; from the internet only replies (conntrack `ESTABLISHED,RELATED`) come in.
pub fn firewall6_lines(desired: &Desired) -> (Vec<String>, Vec<String>) {
    let mut mangle = Vec::new();
    for eni in enis(desired) {
        let port = eni_port(&eni.eni_id);
        for net in eni.owned6() {
            mangle.push(format!("-A PREROUTING -s {net} -i {port} -j ACCEPT"));
        }
    }
    mangle.push(format!(
        "-A PREROUTING -s fe80::/10 -i {ENI_PORT_PREFIX}+ -j ACCEPT"
    ));
    mangle.push(format!(
        "-A PREROUTING -d ff02::/16 -i {ENI_PORT_PREFIX}+ -j ACCEPT"
    ));
    mangle.push(format!("-A PREROUTING -i {ENI_PORT_PREFIX}+ -j DROP"));
    let mut filter = Vec::new();
    if let Some(c) = desired.vpc_ipv6_cidr {
        filter.push(format!("-A FORWARD -s {c} -o {IGW_ROUTER_DEV} -j ACCEPT"));
    }
    filter.push(format!("-A FORWARD -o {IGW_ROUTER_DEV} -j DROP"));
    filter.push(format!(
        "-A FORWARD -i {IGW_ROUTER_DEV} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    ));
    filter.push(format!("-A FORWARD -i {IGW_ROUTER_DEV} -j DROP"));
    (mangle, filter)
}

fn restore_text(mangle: &[String], filter: &[String]) -> String {
    let mut s = String::from("*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n");
    s.push_str(":FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n");
    for l in mangle {
        s.push_str(l);
        s.push('\n');
    }
    s.push_str(
        "COMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n",
    );
    let mut declared = BTreeSet::new();
    for chain in filter.iter().filter_map(|l| l.split_whitespace().nth(1)) {
        if !["INPUT", "FORWARD", "OUTPUT"].contains(&chain) && declared.insert(chain) {
            s.push_str(&format!(":{chain} - [0:0]\n"));
        }
    }
    for l in filter {
        s.push_str(l);
        s.push('\n');
    }
    s.push_str("COMMIT\n");
    s
}

/// `restore` (iptables-restore text) with each rule that `saved` (`iptables-save -c` of the same
/// namespace) already holds, same table and same text, prefixed with its packet and byte
/// counters, for `iptables-restore --counters`: reloading the router's firewall when one branch
/// or group changes keeps every other rule's counters (tests read the drops of a branch's
/// chain). Pure.
#[must_use]
pub fn carry_counters(saved: &str, restore: &str) -> String {
    let mut counters: BTreeMap<(String, String), std::collections::VecDeque<String>> =
        BTreeMap::new();
    let mut table = String::new();
    for line in saved.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_owned();
        } else if line.starts_with('[')
            && let Some((counter, rule)) = line.split_once("] ")
            && rule.starts_with("-A ")
        {
            counters
                .entry((table.clone(), rule.to_owned()))
                .or_default()
                .push_back(format!("{counter}]"));
        }
    }
    let mut out = String::with_capacity(restore.len());
    for line in restore.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim().to_owned();
        }
        if line.starts_with("-A ")
            && let Some(c) = counters
                .get_mut(&(table.clone(), line.to_owned()))
                .and_then(std::collections::VecDeque::pop_front)
        {
            out.push_str(&c);
            out.push(' ');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// ip6tables-restore input replacing the router's IPv6 `mangle` and `filter` tables.
pub fn firewall6_restore(desired: &Desired) -> String {
    let (mangle, filter) = firewall6_lines(desired);
    restore_text(&mangle, &filter)
}

fn enis(desired: &Desired) -> impl Iterator<Item = &DesiredEni> {
    desired.nodes.values().flat_map(|n| n.enis.values())
}

/// The `-A` lines of the router firewall, `mangle` first, in iptables-save's canonical form.
///
/// `mangle PREROUTING`: the source/destination check (a packet entering from an ENI port must be
/// sourced from an address or prefix of that ENI). `filter FORWARD`: the IGW, which passes only
/// node primary addresses in both directions. With branch ENIs: their source check and
/// security groups ([`branch::mangle_lines`], [`groups::filter_lines`]).
pub fn firewall_lines(desired: &Desired) -> (Vec<String>, Vec<String>) {
    let mut mangle = Vec::new();
    for eni in enis(desired) {
        let port = eni_port(&eni.eni_id);
        for net in eni.owned() {
            mangle.push(format!("-A PREROUTING -s {net} -i {port} -j ACCEPT"));
        }
    }
    mangle.push(format!("-A PREROUTING -i {ENI_PORT_PREFIX}+ -j DROP"));
    mangle.extend(branch::mangle_lines(desired));
    let primaries: Vec<Ipv4Addr> = desired
        .nodes
        .values()
        .filter_map(|n| n.primary_ip())
        .collect();
    let mut filter = groups::filter_lines(desired);
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
    restore_text(&mangle, &filter)
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
    // branch ports: right when the VLAN sits on the kept trunk port with the branch's id and
    // alias; anything else is deleted (a deleted trunk port took its VLANs already) and made
    // again
    let wanted_branches = branch::branch_ports(desired);
    let deleted_trunks = deleted_ports.clone();
    let branch_ok = |port: &str, w: &WantedBranchPort| -> bool {
        !deleted_trunks.contains(&w.trunk_port)
            && observed.branch_ports.get(port)
                == Some(&BranchPort {
                    parent: w.trunk_port.clone(),
                    vlan_id: w.branch.vlan_id,
                    alias: Some(w.branch.eni_id.clone()),
                })
    };
    let stale_branches: Vec<(String, bool)> = observed
        .branch_ports
        .iter()
        .filter(|(port, _)| {
            !wanted_branches
                .get(port.as_str())
                .is_some_and(|w| branch_ok(port, w))
        })
        .map(|(port, seen)| (port.clone(), deleted_trunks.contains(&seen.parent)))
        .collect();
    for (port, parent_gone) in stale_branches {
        if !parent_gone {
            ops.push(Op::DeleteBranchPort { port: port.clone() });
        }
        deleted_ports.insert(port);
    }
    let fresh_branch = |port: &str| {
        wanted_branches
            .get(port)
            .is_some_and(|w| !branch_ok(port, w))
    };
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
    for (port, w) in &wanted_branches {
        if !branch_ok(port, w) {
            ops.push(Op::CreateBranchPort {
                trunk_port: w.trunk_port.clone(),
                port: port.clone(),
                vlan_id: w.branch.vlan_id,
                eni_id: w.branch.eni_id.clone(),
            });
        }
    }
    // the primary ENI's IPv6 on eth0 (a recreated link comes up without it)
    for (id, node) in &desired.nodes {
        let Some(eth0) = node.enis.get(&0) else {
            continue;
        };
        let fresh = !link_ok(id, eth0);
        let have: BTreeSet<Ipv6Addr> = if fresh {
            BTreeSet::new()
        } else {
            observed.node_ipv6.get(id).cloned().unwrap_or_default()
        };
        let want = node.primary_ipv6();
        let remove: Vec<Ipv6Addr> = have.iter().filter(|a| Some(**a) != want).copied().collect();
        let add = want.filter(|w| !have.contains(w));
        if add.is_some() || !remove.is_empty() {
            ops.push(Op::SetNodeIpv6 {
                instance_id: id.clone(),
                dev: eni_dev(0),
                add,
                remove,
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
        let fresh = fresh_branch(&n.dev)
            || (!wanted_branches.contains_key(&n.dev)
                && !link_ok_for_port(&wanted_ports, &n.dev, &link_ok));
        if fresh || !observed.neighbours.contains(n) {
            ops.push(Op::ReplaceNeighbour {
                neighbour: n.clone(),
            });
        }
    }
    for (dst, target) in &want_routes {
        let dev_fresh = match target {
            RouteTarget::Port { dev } | RouteTarget::Via { dev, .. } => {
                fresh_branch(dev)
                    || (!wanted_branches.contains_key(dev)
                        && !link_ok_for_port(&wanted_ports, dev, &link_ok))
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
    if by_chain(&observed.firewall) != by_chain(&want_fw) {
        ops.push(Op::LoadFirewall {
            rules: firewall_restore(desired),
        });
    }
    let (mangle6, filter6) = firewall6_lines(desired);
    let want_fw6: Vec<String> = mangle6.into_iter().chain(filter6).collect();
    if observed.firewall6 != want_fw6 {
        ops.push(Op::LoadFirewall6 {
            rules: firewall6_restore(desired),
        });
    }
    ops
}

/// `-A` lines by chain, in order within each: iptables-save lists user chains in its own
/// order (alphabetical), which says nothing about the rules.
fn by_chain(lines: &[String]) -> BTreeMap<&str, Vec<&str>> {
    let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for l in lines {
        let chain = l.split_whitespace().nth(1).unwrap_or_default();
        out.entry(chain).or_default().push(l);
    }
    out
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
    use super::super::groups::tests::rule as sg_rule;
    use super::super::model::{DesiredBranch, DesiredNode, NodeLink, host6};
    use super::*;
    use crate::view::SecurityGroupView;

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
            ipv6_addresses: Vec::new(),
            ipv6_prefixes: BTreeSet::new(),
            security_groups: BTreeSet::new(),
            branches: BTreeMap::new(),
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
            vpc_ipv6_cidr: Some("2001:db8:1200::/56".parse().unwrap()),
            gateways: [Ipv4Addr::new(198, 18, 0, 1)].into_iter().collect(),
            nodes: [("i-1".to_owned(), node)].into_iter().collect(),
            security_groups: BTreeMap::new(),
            eni_groups_enforced: false,
        }
    }

    /// What the kernel would read back after applying `plan(d, empty)` perfectly.
    fn converged(d: &Desired) -> Observed {
        let (m, f) = firewall_lines(d);
        let (m6, f6) = firewall6_lines(d);
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
            firewall6: m6.into_iter().chain(f6).collect(),
            node_ipv6: d
                .nodes
                .iter()
                .map(|(id, n)| (id.clone(), n.primary_ipv6().into_iter().collect()))
                .collect(),
            branch_ports: branch::branch_ports(d)
                .into_iter()
                .map(|(port, w)| {
                    let seen = BranchPort {
                        parent: w.trunk_port,
                        vlan_id: w.branch.vlan_id,
                        alias: Some(w.branch.eni_id),
                    };
                    (port, seen)
                })
                .collect(),
        }
    }

    fn branch(id: &str, vlan: u16, ip: [u8; 4], groups: &[&str]) -> DesiredBranch {
        DesiredBranch {
            eni_id: id.into(),
            vlan_id: vlan,
            mac: format!("02:bb:00:00:00:{vlan:02x}"),
            primary_ip: Ipv4Addr::from(ip),
            security_groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    /// `world()` with eth1 a trunk carrying two branches: VLAN 5 in `sg-web` (HTTP from
    /// `sg-client`, ping from anywhere in the VPC; egress anywhere), VLAN 6 in `sg-client`
    /// (egress: HTTP to `sg-web` only; no ingress). eth0 carries `sg-node`.
    fn trunk_world() -> Desired {
        let mut d = world();
        let node = d.nodes.get_mut("i-1").unwrap();
        node.enis
            .get_mut(&0)
            .unwrap()
            .security_groups
            .insert("sg-node".into());
        let trunk = node.enis.get_mut(&1).unwrap();
        trunk.branches.insert(
            5,
            branch("eni-00000000b005", 5, [198, 18, 1, 5], &["sg-web"]),
        );
        trunk.branches.insert(
            6,
            branch("eni-00000000b006", 6, [198, 18, 1, 6], &["sg-client"]),
        );
        d.security_groups.insert(
            "sg-web".into(),
            SecurityGroupView {
                group_id: "sg-web".into(),
                ingress: vec![
                    sg_rule("tcp", Some((80, 80)), &[], &["sg-client"]),
                    sg_rule("icmp", Some((-1, -1)), &["198.18.0.0/16"], &[]),
                ],
                egress: vec![sg_rule("-1", None, &["0.0.0.0/0"], &[])],
            },
        );
        d.security_groups.insert(
            "sg-client".into(),
            SecurityGroupView {
                group_id: "sg-client".into(),
                ingress: Vec::new(),
                egress: vec![sg_rule("tcp", Some((80, 80)), &[], &["sg-web"])],
            },
        );
        d
    }

    #[test]
    fn no_branches_no_vlan_and_no_branch_firewall() {
        let d = world();
        let ops = plan(&d, &Observed::default());
        assert!(!ops.iter().any(|o| matches!(o, Op::CreateBranchPort { .. })));
        let (m, f) = firewall_lines(&d);
        assert!(!m.iter().chain(&f).any(|l| l.contains("vb")), "{m:?} {f:?}");
        assert!(!firewall_restore(&d).contains("vsim-sg"));
    }

    #[test]
    fn trunk_branches_get_vlan_ports_routes_neighbours_after_the_trunk() {
        let d = trunk_world();
        let ops = plan(&d, &Observed::default());
        let pos = |f: &dyn Fn(&Op) -> bool| ops.iter().position(f).unwrap();
        let trunk = pos(&|o| matches!(o, Op::CreateEni { dev, .. } if dev == "eth1"));
        let b5 = pos(&|o| matches!(o, Op::CreateBranchPort { vlan_id: 5, .. }));
        let route5 = pos(&|o| {
            matches!(o, Op::ReplaceRoute { dst, target: RouteTarget::Port { dev } }
                if *dst == IpNet::from(host(Ipv4Addr::new(198, 18, 1, 5))) && dev == "vb00000000b005")
        });
        assert!(trunk < b5 && b5 < route5, "{ops:?}");
        assert!(ops.contains(&Op::CreateBranchPort {
            trunk_port: eni_port("eni-00000000000b"),
            port: "vb00000000b006".into(),
            vlan_id: 6,
            eni_id: "eni-00000000b006".into(),
        }));
        assert!(ops.contains(&Op::ReplaceNeighbour {
            neighbour: Neighbour {
                dev: "vb00000000b005".into(),
                ip: IpAddr::V4(Ipv4Addr::new(198, 18, 1, 5)),
                mac: "02:bb:00:00:00:05".into(),
            }
        }));
        assert_eq!(plan(&d, &converged(&d)), vec![]);
    }

    #[test]
    fn branch_security_groups_render_stateful_chains() {
        let d = trunk_world();
        let (m, f) = firewall_lines(&d);
        assert!(
            m.contains(&"-A PREROUTING -s 198.18.1.5/32 -i vb00000000b005 -j ACCEPT".to_owned())
        );
        assert_eq!(
            m.last().map(String::as_str),
            Some("-A PREROUTING -i vb+ -j DROP")
        );
        let chain = |name: &str| -> Vec<&str> {
            f.iter()
                .filter(|l| l.split_whitespace().nth(1) == Some(name))
                .map(String::as_str)
                .collect()
        };
        // branch dispatch first in FORWARD, the internet gateway after it
        assert_eq!(f[0], "-A FORWARD -i vb+ -j vsim-sg-out");
        assert_eq!(f[1], "-A FORWARD -o vb+ -j vsim-sg-in");
        assert_eq!(
            chain("vsim-sg-in"),
            [
                "-A vsim-sg-in -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
                "-A vsim-sg-in -o vb00000000b005 -j in-vb00000000b005",
                "-A vsim-sg-in -o vb00000000b006 -j in-vb00000000b006",
            ]
        );
        // group peer = the members' addresses (branch 6 carries sg-client)
        assert_eq!(
            chain("in-vb00000000b005"),
            [
                "-A in-vb00000000b005 -s 198.18.1.6/32 -p tcp -m tcp --dport 80 -j RETURN",
                "-A in-vb00000000b005 -s 198.18.0.0/16 -p icmp -j RETURN",
                "-A in-vb00000000b005 -j DROP",
            ]
        );
        assert_eq!(
            chain("out-vb00000000b005"),
            [
                "-A out-vb00000000b005 -j RETURN",
                "-A out-vb00000000b005 -j DROP"
            ]
        );
        // no ingress rule: default deny
        assert_eq!(chain("in-vb00000000b006"), ["-A in-vb00000000b006 -j DROP"]);
        assert_eq!(
            chain("out-vb00000000b006"),
            [
                "-A out-vb00000000b006 -d 198.18.1.5/32 -p tcp -m tcp --dport 80 -j RETURN",
                "-A out-vb00000000b006 -j DROP",
            ]
        );
        let text = firewall_restore(&d);
        for c in [
            "vsim-sg-in",
            "vsim-sg-out",
            "in-vb00000000b005",
            "out-vb00000000b006",
        ] {
            assert!(text.contains(&format!(":{c} - [0:0]\n")), "{text}");
        }
    }

    #[test]
    fn with_the_knob_every_eni_port_is_filtered_by_its_groups() {
        let mut d = world();
        let node = d.nodes.get_mut("i-1").unwrap();
        node.enis
            .get_mut(&0)
            .unwrap()
            .security_groups
            .insert("sg-node".into());
        d.security_groups.insert(
            "sg-node".into(),
            SecurityGroupView {
                group_id: "sg-node".into(),
                ingress: vec![sg_rule("-1", None, &[], &["sg-node"])],
                egress: vec![sg_rule("-1", None, &["0.0.0.0/0"], &[])],
            },
        );
        // off (the default): no chain at all without branches
        assert!(!firewall_restore(&d).contains("vsim-sg"));
        d.eni_groups_enforced = true;
        let (_, f) = firewall_lines(&d);
        let chain = |name: &str| -> Vec<&str> {
            f.iter()
                .filter(|l| l.split_whitespace().nth(1) == Some(name))
                .map(String::as_str)
                .collect()
        };
        assert!(
            f.contains(&"-A FORWARD -i vp+ -j vsim-sg-out".to_owned()),
            "{f:?}"
        );
        assert!(
            f.contains(&"-A FORWARD -o vp+ -j vsim-sg-in".to_owned()),
            "{f:?}"
        );
        // eth0 (sg-node): in from the group's members (its own addresses), out anywhere
        assert_eq!(
            chain("in-vp00000000000a"),
            [
                "-A in-vp00000000000a -s 198.18.0.10/32 -j RETURN",
                "-A in-vp00000000000a -s 198.18.0.11/32 -j RETURN",
                "-A in-vp00000000000a -j DROP",
            ]
        );
        assert_eq!(
            chain("out-vp00000000000a"),
            [
                "-A out-vp00000000000a -j RETURN",
                "-A out-vp00000000000a -j DROP"
            ]
        );
        // eth1 carries no group: default deny both ways
        assert_eq!(chain("in-vp00000000000b"), ["-A in-vp00000000000b -j DROP"]);
        assert_eq!(
            chain("out-vp00000000000b"),
            ["-A out-vp00000000000b -j DROP"]
        );
    }

    #[test]
    fn removed_branch_deletes_its_port_and_a_changed_vlan_recreates_it() {
        let before = trunk_world();
        let mut after = before.clone();
        let trunk = after
            .nodes
            .get_mut("i-1")
            .unwrap()
            .enis
            .get_mut(&1)
            .unwrap();
        trunk.branches.remove(&6);
        let mut moved = trunk.branches.remove(&5).unwrap();
        moved.vlan_id = 7;
        trunk.branches.insert(7, moved);
        let ops = plan(&after, &converged(&before));
        assert!(ops.contains(&Op::DeleteBranchPort {
            port: "vb00000000b006".into()
        }));
        let del5 = ops
            .iter()
            .position(|o| {
                *o == Op::DeleteBranchPort {
                    port: "vb00000000b005".into(),
                }
            })
            .expect("delete vlan 5");
        let add7 = ops
            .iter()
            .position(|o| matches!(o, Op::CreateBranchPort { vlan_id: 7, port, .. } if port == "vb00000000b005"))
            .expect("create vlan 7");
        assert!(del5 < add7);
        // the recreated port gets its route and neighbour again; the deleted one's went with it
        assert!(ops.iter().any(|o| matches!(o, Op::ReplaceRoute { target: RouteTarget::Port { dev }, .. } if dev == "vb00000000b005")));
        assert!(
            !ops.iter()
                .any(|o| matches!(o, Op::DeleteRoute { .. } | Op::DeleteNeighbour { .. }))
        );
        assert!(ops.iter().any(|o| matches!(o, Op::LoadFirewall { .. })));
        // the trunk detached: its port goes, taking the VLANs; no separate delete
        let mut detached = before.clone();
        detached.nodes.get_mut("i-1").unwrap().enis.remove(&1);
        let ops = plan(&detached, &converged(&before));
        assert!(ops.contains(&Op::DeletePort {
            port: eni_port("eni-00000000000b")
        }));
        assert!(
            !ops.iter().any(|o| matches!(o, Op::DeleteBranchPort { .. })),
            "{ops:?}"
        );
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
        // 2 unreachable (v4 block, v6 /56) + 2 primaries + 1 secondary + 1 prefix
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, Op::ReplaceRoute { .. }))
                .count(),
            6
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
            if *dst == IpNet::from(host(ip)) && *via == IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10)))
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

    fn world6() -> Desired {
        let mut d = world();
        let node = d.nodes.get_mut("i-1").unwrap();
        let e0 = node.enis.get_mut(&0).unwrap();
        e0.ipv6_addresses = vec!["2001:db8:1200::4".parse().unwrap()];
        e0.ipv6_prefixes
            .insert("2001:db8:1200:0:1::/80".parse().unwrap());
        d
    }

    #[test]
    fn ipv6_addresses_and_prefixes_route_via_the_node_link_local() {
        let d = world6();
        let routes = desired_routes(&d);
        let ll: Ipv6Addr = "fe80::ff:fe00:a".parse().unwrap();
        let via = RouteTarget::Via {
            via: IpAddr::V6(ll),
            dev: eni_port("eni-00000000000a"),
        };
        assert_eq!(
            routes[&"2001:db8:1200::4/128".parse::<IpNet>().unwrap()],
            via
        );
        assert_eq!(
            routes[&"2001:db8:1200:0:1::/80".parse::<IpNet>().unwrap()],
            via
        );
        assert_eq!(
            routes[&"2001:db8:1200::/56".parse::<IpNet>().unwrap()],
            RouteTarget::Unreachable
        );
        assert!(desired_neighbours(&d).contains(&Neighbour {
            dev: eni_port("eni-00000000000a"),
            ip: IpAddr::V6(ll),
            mac: "02:00:00:00:00:0a".into(),
        }));
        // the v4-only ENI gets no IPv6 neighbour
        assert_eq!(desired_neighbours(&d).len(), 3);
        assert_eq!(host6(ll).prefix_len(), 128);
    }

    #[test]
    fn ipv6_on_a_converged_node_sets_eth0_routes_and_firewall6() {
        let before = world();
        let after = world6();
        let ops = plan(&after, &converged(&before));
        assert!(ops.contains(&Op::SetNodeIpv6 {
            instance_id: "i-1".into(),
            dev: "eth0".into(),
            add: Some("2001:db8:1200::4".parse().unwrap()),
            remove: vec![],
        }));
        assert!(ops.iter().any(|o| matches!(o, Op::LoadFirewall6 { rules }
            if rules.contains("-A PREROUTING -s 2001:db8:1200:0:1::/80 -i vp00000000000a -j ACCEPT"))));
        assert!(!ops.iter().any(|o| matches!(o, Op::LoadFirewall { .. })));
        assert_eq!(plan(&after, &converged(&after)), vec![]);
    }

    #[test]
    fn egress_only_gateway_passes_vpc_sources_out_and_only_replies_in() {
        let (mangle, filter) = firewall6_lines(&world6());
        assert_eq!(mangle.last().unwrap(), "-A PREROUTING -i vp+ -j DROP");
        assert_eq!(
            filter,
            vec![
                "-A FORWARD -s 2001:db8:1200::/56 -o igw -j ACCEPT",
                "-A FORWARD -o igw -j DROP",
                "-A FORWARD -i igw -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
                "-A FORWARD -i igw -j DROP",
            ]
        );
    }

    #[test]
    fn reloading_the_firewall_keeps_the_counters_of_unchanged_rules() {
        let saved = "*mangle\n:PREROUTING ACCEPT [0:0]\n[3:180] -A PREROUTING -j x\nCOMMIT\n\
                     *filter\n:FORWARD ACCEPT [0:0]\n[7:588] -A in-vb1 -j DROP\n\
                     [2:100] -A in-vb2 -s 198.18.0.4/32 -j RETURN\n[9:9] -A in-vb2 -j DROP\nCOMMIT\n";
        let restore = "*mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j x\nCOMMIT\n\
                       *filter\n:FORWARD ACCEPT [0:0]\n-A in-vb1 -j DROP\n\
                       -A in-vb2 -s 198.18.0.5/32 -j RETURN\n-A in-vb2 -j DROP\n-A in-vb1 -j DROP\nCOMMIT\n";
        let out = carry_counters(saved, restore);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[2], "[3:180] -A PREROUTING -j x");
        assert_eq!(lines[6], "[7:588] -A in-vb1 -j DROP");
        assert_eq!(
            lines[7], "-A in-vb2 -s 198.18.0.5/32 -j RETURN",
            "a new rule starts at 0"
        );
        assert_eq!(lines[8], "[9:9] -A in-vb2 -j DROP");
        assert_eq!(
            lines[9], "-A in-vb1 -j DROP",
            "one saved counter, used once"
        );
        assert_eq!(carry_counters("", restore), restore);
    }
}
