//! Read-only inspection of the current network namespace's host side, for ipamd's checkpoint
//! recovery and its reclaim of addresses whose pod is gone: which pod addresses are routed to
//! which host veth (`<ip>/32 dev <veth> scope link` routes in the main table, `<ip>/128 dev
//! <veth>` IPv6 routes), and which links exist. Must not: change anything, enter other
//! namespaces.
//!
//! Reads `/proc/net/route`, `/proc/net/ipv6_route` and `/proc/net/dev` (all of the reading
//! process's netns), which need no netlink socket and no runtime.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Names of every link in the reading process's network namespace.
pub fn link_names() -> std::io::Result<BTreeSet<String>> {
    let text = std::fs::read_to_string("/proc/net/dev")?;
    Ok(parse_proc_net_dev(&text))
}

/// Parses `/proc/net/dev` text: two header lines, then `<name>: <counters>` per link.
#[must_use]
pub fn parse_proc_net_dev(text: &str) -> BTreeSet<String> {
    text.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect()
}

/// Host routes to pods: `(pod address, host veth)` for every /32 route in the main table whose
/// device starts with `veth_prefix`.
pub fn pod_routes(veth_prefix: &str) -> std::io::Result<Vec<(Ipv4Addr, String)>> {
    let text = std::fs::read_to_string("/proc/net/route")?;
    Ok(parse_proc_net_route(&text, veth_prefix))
}

/// Parses `/proc/net/route` text (destination and mask are the raw network-order bytes printed
/// as a native-endian hex word).
#[must_use]
pub fn parse_proc_net_route(text: &str, veth_prefix: &str) -> Vec<(Ipv4Addr, String)> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let (Some(iface), Some(dst), Some(mask)) = (cols.first(), cols.get(1), cols.get(7)) else {
            continue;
        };
        if !iface.starts_with(veth_prefix) {
            continue;
        }
        let (Ok(dst), Ok(mask)) = (u32::from_str_radix(dst, 16), u32::from_str_radix(mask, 16))
        else {
            continue;
        };
        if mask == u32::MAX {
            out.push((Ipv4Addr::from(dst.to_ne_bytes()), (*iface).to_owned()));
        }
    }
    out
}

/// Host routes to pods of both families: [`pod_routes`] then [`pod_routes_v6`].
pub fn pod_host_routes(veth_prefix: &str) -> std::io::Result<Vec<(IpAddr, String)>> {
    let v4 = pod_routes(veth_prefix)?;
    let v6 = pod_routes_v6(veth_prefix)?;
    Ok(v4
        .into_iter()
        .map(|(ip, dev)| (ip.into(), dev))
        .chain(v6.into_iter().map(|(ip, dev)| (ip.into(), dev)))
        .collect())
}

/// `RTF_LOCAL` in `/proc/net/ipv6_route`'s flags: the host's own addresses (table local).
const RTF_LOCAL: u32 = 0x8000_0000;

/// IPv6 host routes to pods: `(pod address, host veth)` for every `/128` unicast route (any
/// table: the file does not say which) whose device starts with `veth_prefix`; the host's own
/// addresses (`local` routes), link-local and multicast destinations and `lo` are left out.
pub fn pod_routes_v6(veth_prefix: &str) -> std::io::Result<Vec<(Ipv6Addr, String)>> {
    match std::fs::read_to_string("/proc/net/ipv6_route") {
        Ok(text) => Ok(parse_proc_net_ipv6_route(&text, veth_prefix)),
        // A kernel (or netns) without IPv6 has no IPv6 pod.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Parses `/proc/net/ipv6_route` text: per line destination (32 hex digits), its prefix length
/// (hex), source, source length, next hop, metric, refcount, use, flags, device.
#[must_use]
pub fn parse_proc_net_ipv6_route(text: &str, veth_prefix: &str) -> Vec<(Ipv6Addr, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        let [dst, plen, _, _, _, _, _, _, flags, iface] = cols[..] else {
            continue;
        };
        if !iface.starts_with(veth_prefix) || iface == "lo" {
            continue;
        }
        let (Ok(dst), Ok(128), Ok(flags)) = (
            u128::from_str_radix(dst, 16),
            u8::from_str_radix(plen, 16),
            u32::from_str_radix(flags, 16),
        ) else {
            continue;
        };
        let ip = Ipv6Addr::from(dst);
        if flags & RTF_LOCAL != 0 || ip.is_unicast_link_local() || ip.is_multicast() {
            continue;
        }
        out.push((ip, iface.to_owned()));
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pod_host_routes() {
        let ip: Ipv4Addr = "198.18.0.21".parse().unwrap();
        let hex = |a: Ipv4Addr| format!("{:08X}", u32::from_ne_bytes(a.octets()));
        let text = format!(
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
             eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
             eni1234567890a\t{}\t00000000\t0005\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n\
             eth0\t{}\t00000000\t0005\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n",
            hex(ip),
            hex("198.18.0.22".parse().unwrap())
        );
        assert_eq!(
            parse_proc_net_route(&text, "eni"),
            vec![(ip, "eni1234567890a".to_owned())]
        );
    }

    #[test]
    fn parses_ipv6_pod_host_routes() {
        // Captured from a netns: a pod route in main and in table 7 (the file shows every
        // table), an on-link /64, link-local and multicast routes, the host's own address
        // (RTF_LOCAL), a /128 kernel route of a /128 address on a non-veth device, lo.
        let z = "00000000000000000000000000000000";
        let text = format!(
            "20010db8000000000000000000000006 80 {z} 00 {z} 00000400 00000001 00000000 00000001   eniAB\n\
             {z} 00 {z} 00 {z} ffffffff 00000001 00000000 00200200       lo\n\
             20010db8000000000000000000000005 80 {z} 00 {z} 00000400 00000002 00000000 00000001   eniAB\n\
             20010db8000000000000000000000005 80 {z} 00 {z} 00000400 00000002 00000000 00000001   eniAB\n\
             20010db8000100000000000000000000 40 {z} 00 {z} 00000100 00000001 00000000 00000001       p1\n\
             fe800000000000000000000000000001 80 {z} 00 {z} 00000100 00000001 00000000 00000001   eniAB\n\
             ff000000000000000000000000000000 08 {z} 00 {z} 00000100 00000002 00000000 00000001   eniAB\n\
             20010db8000100000000000000000009 80 {z} 00 {z} 00000000 00000003 00000000 80200001   eniAB\n\
             20010db8000200000000000000000001 80 {z} 00 {z} 00000100 00000001 00000000 00000001       p1\n"
        );
        let want = |a: &str| (a.parse::<Ipv6Addr>().unwrap(), "eniAB".to_owned());
        assert_eq!(
            parse_proc_net_ipv6_route(&text, "eni"),
            vec![want("2001:db8::5"), want("2001:db8::6")]
        );
        // With no prefix every device counts, still not the host's own (local) addresses.
        let all = parse_proc_net_ipv6_route(&text, "");
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(all.contains(&("2001:db8:2::1".parse().unwrap(), "p1".to_owned())));
    }

    #[test]
    fn parses_link_names() {
        let text = "Inter-|   Receive                            |  Transmit\n                     face |bytes    packets errs drop fifo frame compressed multicast|bytes\n                        lo:  1000      10    0    0    0     0          0         0     1000\n                      eth0: 2000      20    0    0    0     0          0         0     2000\n                    eni1234567890a: 0 0 0 0 0 0 0 0 0\n";
        let names: Vec<String> = parse_proc_net_dev(text).into_iter().collect();
        assert_eq!(names, ["eni1234567890a", "eth0", "lo"]);
    }

    #[test]
    fn reads_this_namespaces_links() {
        // Every Linux netns has `lo`; the reader must see it.
        assert!(link_names().unwrap().contains("lo"));
    }
}
