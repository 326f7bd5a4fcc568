//! Security groups in the router, as EC2 applies them: stateful iptables chains per guarded
//! port (every branch ENI; every ENI when `Desired::eni_groups_enforced`), a rule's peer being
//! a CIDR or every address of a group's members. Pure: derives `filter` lines from `Desired`;
//! must not touch the kernel. Nothing here exists while no port is guarded.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::{IpNet, Ipv4Net};

use super::model::{Desired, host};
use super::names::{BRANCH_PORT_PREFIX, ENI_PORT_PREFIX, eni_port};
use crate::view::SgRuleView;

/// Dispatch chain for traffic leaving a guarded port (its groups' egress rules).
pub const SG_OUT_CHAIN: &str = "vsim-sg-out";
/// Dispatch chain for traffic to a guarded port (its groups' ingress rules).
pub const SG_IN_CHAIN: &str = "vsim-sg-in";

/// A router port whose traffic its ENI's security groups filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guarded<'a> {
    /// The ENI (or branch ENI) behind the port.
    pub eni_id: &'a str,
    /// Its groups (none: nothing passes).
    pub groups: &'a BTreeSet<String>,
}

/// Every guarded port by router-side name: each branch port; with `eni_groups_enforced`, each
/// ENI port too (a trunk's own port carries only the trunk's traffic: its branches have theirs).
pub fn guarded_ports(desired: &Desired) -> BTreeMap<String, Guarded<'_>> {
    let mut out = BTreeMap::new();
    for trunk in desired.nodes.values().flat_map(|n| n.enis.values()) {
        for b in trunk.branches.values() {
            out.insert(
                super::names::branch_port(&b.eni_id),
                Guarded {
                    eni_id: &b.eni_id,
                    groups: &b.security_groups,
                },
            );
        }
    }
    if desired.eni_groups_enforced {
        for eni in desired.nodes.values().flat_map(|n| n.enis.values()) {
            out.insert(
                eni_port(&eni.eni_id),
                Guarded {
                    eni_id: &eni.eni_id,
                    groups: &eni.security_groups,
                },
            );
        }
    }
    out
}

/// The security groups of every guarded port ([`guarded_ports`]) as `filter` lines (first in
/// `FORWARD`, before the internet gateway's lines), EC2's semantics: stateful (packets of a connection already allowed pass:
/// conntrack `RELATED,ESTABLISHED`), a packet leaving an ENI passes if an egress rule of one
/// of its groups matches its destination and protocol, a packet to a branch if an ingress rule
/// matches its source, everything else to or from a branch is dropped (no group: nothing
/// passes). A rule's peer is a CIDR or a group, i.e. every address of every ENI and branch
/// carrying that group. Allowed packets `RETURN` so that the rest of `FORWARD` (the other
/// side's groups for branch-to-branch traffic, the internet gateway) still applies. Only IPv4:
/// IPv6 CIDRs, `icmpv6` and protocols other than all/tcp/udp/icmp match nothing (stricter, never
/// looser, than EC2). Empty without branches.
pub fn filter_lines(desired: &Desired) -> Vec<String> {
    let ports = guarded_ports(desired);
    if ports.is_empty() {
        return Vec::new();
    }
    let mut out = vec![
        format!("-A FORWARD -i {BRANCH_PORT_PREFIX}+ -j {SG_OUT_CHAIN}"),
        format!("-A FORWARD -o {BRANCH_PORT_PREFIX}+ -j {SG_IN_CHAIN}"),
    ];
    if desired.eni_groups_enforced {
        out.push(format!(
            "-A FORWARD -i {ENI_PORT_PREFIX}+ -j {SG_OUT_CHAIN}"
        ));
        out.push(format!("-A FORWARD -o {ENI_PORT_PREFIX}+ -j {SG_IN_CHAIN}"));
    }
    for chain in [SG_IN_CHAIN, SG_OUT_CHAIN] {
        out.push(format!(
            "-A {chain} -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"
        ));
    }
    for port in ports.keys() {
        out.push(format!("-A {SG_IN_CHAIN} -o {port} -j in-{port}"));
        out.push(format!("-A {SG_OUT_CHAIN} -i {port} -j out-{port}"));
    }
    for (port, guarded) in &ports {
        for (chain, ingress) in [(format!("in-{port}"), true), (format!("out-{port}"), false)] {
            let mut lines: Vec<String> = Vec::new();
            for group in guarded.groups {
                let Some(sg) = desired.security_groups.get(group) else {
                    tracing::warn!(%group, eni = %guarded.eni_id, "unknown security group: no rule");
                    continue;
                };
                let rules = if ingress { &sg.ingress } else { &sg.egress };
                for rule in rules {
                    for line in rule_lines(desired, &chain, ingress, rule) {
                        if !lines.contains(&line) {
                            lines.push(line);
                        }
                    }
                }
            }
            lines.push(format!("-A {chain} -j DROP"));
            out.extend(lines);
        }
    }
    out
}

/// Every IPv4 address (as networks) of the ENIs and branches carrying `group`.
pub fn group_members(desired: &Desired, group: &str) -> BTreeSet<Ipv4Net> {
    let mut out = BTreeSet::new();
    for eni in desired.nodes.values().flat_map(|n| n.enis.values()) {
        if eni.security_groups.contains(group) {
            out.extend(eni.owned());
        }
        for b in eni.branches.values() {
            if b.security_groups.contains(group) {
                out.insert(host(b.primary_ip));
            }
        }
    }
    out
}

/// The protocol part of an iptables line for `rule`, in iptables-save's form; `None` when the
/// IPv4 filter cannot express it (it then matches nothing).
fn protocol_match(rule: &SgRuleView) -> Option<String> {
    let range = |from: Option<i32>, to: Option<i32>| -> String {
        match (from.filter(|p| *p >= 0), to.filter(|p| *p >= 0)) {
            (Some(a), Some(b)) if a == b => format!(" --dport {a}"),
            (Some(a), Some(b)) => format!(" --dport {a}:{b}"),
            (Some(a), None) => format!(" --dport {a}"),
            _ => String::new(),
        }
    };
    match rule.protocol.to_ascii_lowercase().as_str() {
        "-1" | "all" => Some(String::new()),
        "tcp" | "6" => Some(format!(
            "-p tcp -m tcp{}",
            range(rule.from_port, rule.to_port)
        )),
        "udp" | "17" => Some(format!(
            "-p udp -m udp{}",
            range(rule.from_port, rule.to_port)
        )),
        "icmp" | "1" => Some(
            match (
                rule.from_port.filter(|t| *t >= 0),
                rule.to_port.filter(|c| *c >= 0),
            ) {
                (None, _) => "-p icmp".to_owned(),
                (Some(t), None) => format!("-p icmp -m icmp --icmp-type {t}"),
                (Some(t), Some(c)) => format!("-p icmp -m icmp --icmp-type {t}/{c}"),
            },
        ),
        _ => None,
    }
}

fn rule_lines(desired: &Desired, chain: &str, ingress: bool, rule: &SgRuleView) -> Vec<String> {
    let Some(proto) = protocol_match(rule) else {
        return Vec::new();
    };
    let mut peers: BTreeSet<Ipv4Net> = rule
        .cidrs
        .iter()
        .filter_map(|c| match c {
            IpNet::V4(v4) => Some(v4.trunc()),
            IpNet::V6(_) => None,
        })
        .collect();
    for g in &rule.groups {
        peers.extend(group_members(desired, g));
    }
    peers
        .into_iter()
        .map(|peer| {
            let mut line = format!("-A {chain}");
            if peer.prefix_len() > 0 {
                line.push_str(&format!(" {} {peer}", if ingress { "-s" } else { "-d" }));
            }
            if !proto.is_empty() {
                line.push(' ');
                line.push_str(&proto);
            }
            line.push_str(" -j RETURN");
            line
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::view::SecurityGroupView;

    /// A security-group rule: protocol, port range, CIDR peers, group peers.
    pub(in crate::fabric) fn rule(
        protocol: &str,
        ports: Option<(i32, i32)>,
        cidrs: &[&str],
        groups: &[&str],
    ) -> SgRuleView {
        SgRuleView {
            protocol: protocol.into(),
            from_port: ports.map(|p| p.0),
            to_port: ports.map(|p| p.1),
            cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    #[test]
    fn protocols_in_iptables_save_form() {
        let m = |p: &str, ports| protocol_match(&rule(p, ports, &[], &[]));
        assert_eq!(m("-1", None).as_deref(), Some(""));
        assert_eq!(
            m("tcp", Some((80, 80))).as_deref(),
            Some("-p tcp -m tcp --dport 80")
        );
        assert_eq!(
            m("udp", Some((1000, 2000))).as_deref(),
            Some("-p udp -m udp --dport 1000:2000")
        );
        assert_eq!(m("icmp", Some((-1, -1))).as_deref(), Some("-p icmp"));
        assert_eq!(
            m("icmp", Some((8, -1))).as_deref(),
            Some("-p icmp -m icmp --icmp-type 8")
        );
        assert_eq!(
            m("icmp", Some((8, 0))).as_deref(),
            Some("-p icmp -m icmp --icmp-type 8/0")
        );
        assert_eq!(m("icmpv6", None), None);
        assert_eq!(m("47", None), None);
    }

    #[test]
    fn peers_are_cidrs_and_group_members() {
        let sg = SecurityGroupView {
            group_id: "sg-a".into(),
            ingress: vec![rule(
                "tcp",
                Some((80, 80)),
                &["10.1.2.3/8", "0.0.0.0/0", "2001:db8::/32"],
                &["sg-b"],
            )],
            egress: Vec::new(),
        };
        let mut d = Desired::default();
        d.security_groups.insert("sg-a".into(), sg.clone());
        // no member of sg-b: only the CIDRs (the IPv6 one matches nothing)
        let lines = rule_lines(&d, "in-vbx", true, &sg.ingress[0]);
        assert_eq!(
            lines,
            [
                "-A in-vbx -p tcp -m tcp --dport 80 -j RETURN",
                "-A in-vbx -s 10.0.0.0/8 -p tcp -m tcp --dport 80 -j RETURN",
            ]
        );
        let egress = rule_lines(
            &d,
            "out-vbx",
            false,
            &rule("-1", None, &["198.18.0.0/16"], &[]),
        );
        assert_eq!(egress, ["-A out-vbx -d 198.18.0.0/16 -j RETURN"]);
    }
}
