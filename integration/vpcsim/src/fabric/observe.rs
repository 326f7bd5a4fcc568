//! Reading back the kernel state the fabric manages (router routes, neighbours, gateways,
//! firewall, ENI links in node namespaces). Parsing is pure; `observe` is the thin I/O part.
//! Must not change anything.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde_json::Value;

use super::exec::{self, ExecError};
use super::model::{BranchPort, Neighbour, NodeLink, Observed, RouteTarget};
use super::names::{BRANCH_PORT_PREFIX, ENI_PORT_PREFIX, NETNS_DIR, RunNames, is_managed_port};

/// Read the whole managed state of run `names`.
pub fn observe(names: &RunNames) -> Result<Observed, ExecError> {
    let router = names.router_ns();
    let node_namespaces = list_netns()
        .into_iter()
        .filter_map(|ns| names.instance_of_ns(&ns).map(str::to_owned))
        .collect::<BTreeSet<_>>();
    let mut node_links = BTreeMap::new();
    let mut node_ipv6 = BTreeMap::new();
    for id in &node_namespaces {
        let ns = names.node_ns(id);
        let [links, addrs] =
            exec::ip_json_batch(&ns, &[], ["link show", "addr show scope global"])?;
        node_links.insert(id.clone(), parse_node_links(&links));
        node_ipv6.insert(id.clone(), parse_global_ipv6(&addrs, "eth0"));
    }
    // `neigh show` without a family lists both; IPv6 routes need `-6` and link details `-d`,
    // options a batch line cannot carry, so those stay calls of their own.
    let [routes4, neighbours, lo] = exec::ip_json_batch(
        &router,
        &[],
        ["route show", "neigh show nud permanent", "addr show dev lo"],
    )?;
    let mut routes = parse_routes(&routes4);
    routes.extend(parse_routes(&exec::ip_json(
        &router,
        &["-6", "route", "show"],
    )?));
    let router_links = exec::ip_json(&router, &["-d", "link", "show"])?;
    let neighbours = parse_neighbours(&neighbours);
    Ok(Observed {
        ports: parse_ports(&router_links),
        branch_ports: parse_branch_ports(&router_links),
        routes,
        neighbours,
        gateways: parse_lo_addrs(&lo),
        firewall: parse_firewall(&exec::iptables_save(&router)?),
        firewall6: parse_firewall(&exec::ip6tables_save(&router)?),
        node_namespaces,
        node_links,
        node_ipv6,
    })
}

/// Names under `/run/netns`.
pub fn list_netns() -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn items(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

/// Router-side ENI ports (`vp*`) with their alias.
pub fn parse_ports(links: &Value) -> BTreeMap<String, Option<String>> {
    items(links)
        .filter_map(|l| {
            let name = str_of(l, "ifname")?;
            name.starts_with(ENI_PORT_PREFIX)
                .then(|| (name.to_owned(), str_of(l, "ifalias").map(str::to_owned)))
        })
        .collect()
}

/// Router-side branch ports (`vb*`, 802.1Q sub-interfaces) with parent, VLAN id and alias
/// (`ip -d -j link show`).
pub fn parse_branch_ports(links: &Value) -> BTreeMap<String, BranchPort> {
    items(links)
        .filter_map(|l| {
            let name = str_of(l, "ifname")?;
            if !name.starts_with(BRANCH_PORT_PREFIX) {
                return None;
            }
            let info = l.get("linkinfo")?;
            let vlan_id = (str_of(info, "info_kind") == Some("vlan"))
                .then(|| info.get("info_data")?.get("id")?.as_u64())
                .flatten()
                .and_then(|id| u16::try_from(id).ok())
                .unwrap_or(0);
            Some((
                name.to_owned(),
                BranchPort {
                    parent: str_of(l, "link").unwrap_or_default().to_owned(),
                    vlan_id,
                    alias: str_of(l, "ifalias").map(str::to_owned),
                },
            ))
        })
        .collect()
}

/// `ethN` links of a node namespace.
pub fn parse_node_links(links: &Value) -> Vec<NodeLink> {
    items(links)
        .filter_map(|l| {
            let name = str_of(l, "ifname")?;
            let n = name.strip_prefix("eth")?;
            (!n.is_empty() && n.chars().all(|c| c.is_ascii_digit())).then(|| NodeLink {
                name: name.to_owned(),
                mac: str_of(l, "address")
                    .unwrap_or_default()
                    .to_ascii_lowercase(),
                alias: str_of(l, "ifalias").map(str::to_owned),
            })
        })
        .collect()
}

fn parse_dst(s: &str) -> Option<IpNet> {
    if s.contains('/') {
        s.parse().ok()
    } else {
        s.parse::<IpAddr>().ok().map(IpNet::from)
    }
}

/// Global IPv6 addresses on link `dev` (`ip -6 -j addr show scope global`).
pub fn parse_global_ipv6(addrs: &Value, dev: &str) -> BTreeSet<Ipv6Addr> {
    items(addrs)
        .filter(|l| str_of(l, "ifname") == Some(dev))
        .flat_map(|l| items(l.get("addr_info").unwrap_or(&Value::Null)))
        .filter(|a| str_of(a, "family") == Some("inet6"))
        .filter_map(|a| str_of(a, "local")?.parse::<Ipv6Addr>().ok())
        .collect()
}

/// Routes on ENI ports and unreachable routes of the router's main table (either family; the
/// kernel's own link-local routes are not the fabric's).
pub fn parse_routes(routes: &Value) -> BTreeMap<IpNet, RouteTarget> {
    items(routes)
        .filter_map(|r| {
            if str_of(r, "protocol") == Some("kernel") {
                return None;
            }
            let dst = parse_dst(str_of(r, "dst")?)?;
            if str_of(r, "type") == Some("unreachable") {
                return Some((dst, RouteTarget::Unreachable));
            }
            let dev = str_of(r, "dev")?;
            if !is_managed_port(dev) {
                return None;
            }
            let target = match str_of(r, "gateway").and_then(|g| g.parse().ok()) {
                Some(via) => RouteTarget::Via {
                    via,
                    dev: dev.to_owned(),
                },
                None => RouteTarget::Port {
                    dev: dev.to_owned(),
                },
            };
            Some((dst, target))
        })
        .collect()
}

/// Permanent neighbours on ENI and branch ports.
pub fn parse_neighbours(neigh: &Value) -> BTreeSet<Neighbour> {
    items(neigh)
        .filter_map(|n| {
            let dev = str_of(n, "dev")?;
            if !is_managed_port(dev) {
                return None;
            }
            Some(Neighbour {
                dev: dev.to_owned(),
                ip: str_of(n, "dst")?.parse().ok()?,
                mac: str_of(n, "lladdr")?.to_ascii_lowercase(),
            })
        })
        .collect()
}

/// IPv4 /32 addresses on `lo` other than loopback ones.
pub fn parse_lo_addrs(addrs: &Value) -> BTreeSet<Ipv4Addr> {
    items(addrs)
        .flat_map(|l| items(l.get("addr_info").unwrap_or(&Value::Null)))
        .filter(|a| str_of(a, "family") == Some("inet"))
        .filter_map(|a| str_of(a, "local")?.parse::<Ipv4Addr>().ok())
        .filter(|ip| !ip.is_loopback())
        .collect()
}

/// `-A` lines of `mangle`, then of `filter`.
pub fn parse_firewall(save: &str) -> Vec<String> {
    let mut table = "";
    let (mut mangle, mut filter) = (Vec::new(), Vec::new());
    for line in save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = if t == "mangle" {
                "mangle"
            } else if t == "filter" {
                "filter"
            } else {
                ""
            };
        } else if line.starts_with("-A ") {
            match table {
                "mangle" => mangle.push(line.to_owned()),
                "filter" => filter.push(line.to_owned()),
                _ => {}
            }
        }
    }
    mangle.into_iter().chain(filter).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn routes_keep_managed_ones_only() {
        let v = json!([
            {"type":"unreachable","dst":"198.18.0.0/16","flags":[]},
            {"dst":"default","gateway":"203.0.113.2","dev":"igw","flags":[]},
            {"dst":"203.0.113.0/24","dev":"igw","protocol":"kernel","scope":"link","prefsrc":"203.0.113.1","flags":[]},
            {"dst":"198.18.0.10","dev":"vpa","scope":"link","flags":[]},
            {"dst":"198.18.0.32/28","gateway":"198.18.0.10","dev":"vpa","flags":["onlink"]}
        ]);
        let r = parse_routes(&v);
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[&"198.18.0.0/16".parse().unwrap()],
            RouteTarget::Unreachable
        );
        assert_eq!(
            r[&"198.18.0.10/32".parse().unwrap()],
            RouteTarget::Port { dev: "vpa".into() }
        );
        assert_eq!(
            r[&"198.18.0.32/28".parse().unwrap()],
            RouteTarget::Via {
                via: "198.18.0.10".parse().unwrap(),
                dev: "vpa".into()
            }
        );
    }

    #[test]
    fn branch_ports_are_vlan_sub_interfaces() {
        let v = json!([
            {"ifname":"vp00000000000a","ifalias":"eni-00000000000a",
             "linkinfo":{"info_kind":"veth"}},
            {"ifname":"vb00000000b005","link":"vp00000000000a","ifalias":"eni-00000000b005",
             "linkinfo":{"info_kind":"vlan","info_data":{"protocol":"802.1Q","id":5}}},
            {"ifname":"vb00000000b006","link":"vp00000000000a",
             "linkinfo":{"info_kind":"veth"}}
        ]);
        let b = parse_branch_ports(&v);
        assert_eq!(b.len(), 2);
        assert_eq!(
            b["vb00000000b005"],
            BranchPort {
                parent: "vp00000000000a".into(),
                vlan_id: 5,
                alias: Some("eni-00000000b005".into())
            }
        );
        // not a VLAN: VLAN id 0, never what a plan wants, so it is replaced
        assert_eq!(b["vb00000000b006"].vlan_id, 0);
    }

    #[test]
    fn node_links_are_eth_n_only() {
        let v = json!([
            {"ifname":"lo","address":"00:00:00:00:00:00"},
            {"ifname":"eth0","address":"02:AA:00:00:00:01","ifalias":"eni-1"},
            {"ifname":"eni1234","address":"02:aa:00:00:00:02"},
            {"ifname":"eth","address":"02:aa:00:00:00:03"}
        ]);
        assert_eq!(
            parse_node_links(&v),
            vec![NodeLink {
                name: "eth0".into(),
                mac: "02:aa:00:00:00:01".into(),
                alias: Some("eni-1".into())
            }]
        );
    }

    #[test]
    fn firewall_lines_by_table() {
        let save = "# x\n*filter\n:INPUT ACCEPT [0:0]\n-A FORWARD -o igw -j DROP\nCOMMIT\n*mangle\n-A PREROUTING -i vp+ -j DROP\nCOMMIT\n*nat\n-A POSTROUTING -j MASQUERADE\nCOMMIT\n";
        assert_eq!(
            parse_firewall(save),
            vec!["-A PREROUTING -i vp+ -j DROP", "-A FORWARD -o igw -j DROP"]
        );
    }

    #[test]
    fn lo_gateways_skip_loopback() {
        let v = json!([{"ifname":"lo","addr_info":[
            {"family":"inet","local":"127.0.0.1","prefixlen":8},
            {"family":"inet","local":"198.18.0.1","prefixlen":32},
            {"family":"inet6","local":"::1","prefixlen":128}]}]);
        assert_eq!(
            parse_lo_addrs(&v),
            [Ipv4Addr::new(198, 18, 0, 1)].into_iter().collect()
        );
    }
}
