//! Planning of node-wide host networking: the primary ENI's MTU, the `fwmark` rule (priority 1024)
//! that sends marked replies through main, the `AWS_EXTERNAL_SERVICE_CIDRS` rules (priority 1535),
//! and the clean-up of per-pod rules (priorities 512 and 1536) whose IP is no longer assigned; the
//! verdict on the primary interface's reverse-path filtering ([`RpFilter`], read by the caller, set
//! by the init container). Pure. Must not: perform I/O, or touch rules at other priorities.

use std::net::{IpAddr, Ipv4Addr};

use dataplane::conventions::{
    CONNMARK_RULE_PRIORITY, EXTERNAL_SERVICE_RULE_PRIORITY, FROM_POD_RULE_PRIORITY,
    LOCAL_RULE_PRIORITY, LOCAL_TABLE, MAIN_TABLE, TO_POD_RULE_PRIORITY, branch_vlan_of_table,
};
use dataplane::{Family, MacAddr, Rule};
use ipnet::{IpNet, Ipv4Net};

use super::ops::{HostOp, Observed};
use super::snat::{RandomizeSnat, SnatConfig};

/// Node-wide host networking inputs (parsed config plus what IMDS says about the primary ENI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// MAC of the primary ENI (how its link is found).
    pub primary_mac: MacAddr,
    /// Primary private IPv4 of the primary ENI (the SNAT source).
    pub primary_ip: Ipv4Addr,
    /// `AWS_VPC_ENI_MTU`, applied to the primary ENI.
    pub mtu: u32,
    /// The VPC's IPv4 CIDRs.
    pub vpc_cidrs: Vec<Ipv4Net>,
    /// `AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS`.
    pub exclude_snat_cidrs: Vec<Ipv4Net>,
    /// `AWS_VPC_K8S_CNI_EXTERNALSNAT`.
    pub external_snat: bool,
    /// `AWS_VPC_K8S_CNI_RANDOMIZESNAT`.
    pub randomize_snat: RandomizeSnat,
    /// `AWS_VPC_CNI_NODE_PORT_SUPPORT`.
    pub node_port_support: bool,
    /// `AWS_VPC_K8S_CNI_CONNMARK`.
    pub connmark: u32,
    /// `AWS_VPC_K8S_CNI_VETHPREFIX`.
    pub veth_prefix: String,
    /// `AWS_EXTERNAL_SERVICE_CIDRS`.
    pub external_service_cidrs: Vec<Ipv4Net>,
    /// IPv6 mode: the fwmark rule is an IPv6 rule, no IPv4 external-service rules, no SNAT/connmark
    /// iptables rules, and the IPv4 FORWARD reject of `169.254.172.0/22`.
    pub ipv6: bool,
    /// IPv4 mode with `ENABLE_V6_EGRESS`: the ip6tables FORWARD reject of `fd00::ac:00/118`.
    pub block_v6_egress_range: bool,
}

impl NodeSpec {
    /// The SNAT inputs, given the primary interface's name.
    #[must_use]
    pub fn snat_config(&self, primary_interface: &str) -> SnatConfig {
        SnatConfig {
            external_snat: self.external_snat,
            vpc_cidrs: self.vpc_cidrs.clone(),
            exclude_cidrs: self.exclude_snat_cidrs.clone(),
            randomization: self.randomize_snat,
            node_port_support: self.node_port_support,
            connmark: self.connmark,
            veth_prefix: self.veth_prefix.clone(),
            primary_ip: self.primary_ip,
            primary_interface: primary_interface.to_owned(),
        }
    }

    /// Whether the `fwmark` rule is needed: NodePort replies, or replies to pods' SNATed
    /// connections, carry the mark.
    #[must_use]
    pub fn wants_connmark_rule(&self) -> bool {
        self.node_port_support || !self.external_snat
    }

    /// The family of the node's rules.
    #[must_use]
    pub fn family(&self) -> Family {
        if self.ipv6 { Family::V6 } else { Family::V4 }
    }

    fn desired_rules(&self) -> Vec<Rule> {
        let mut rules = Vec::new();
        if self.wants_connmark_rule() {
            rules.push(Rule {
                fwmark: Some((self.connmark, self.connmark)),
                ..Rule::lookup(self.family(), CONNMARK_RULE_PRIORITY, MAIN_TABLE)
            });
        }
        if self.ipv6 {
            return rules;
        }
        for cidr in &self.external_service_cidrs {
            let rule = Rule {
                dst: Some(IpNet::V4(cidr.trunc())),
                ..Rule::lookup(Family::V4, EXTERNAL_SERVICE_RULE_PRIORITY, MAIN_TABLE)
            };
            if !rules.contains(&rule) {
                rules.push(rule);
            }
        }
        rules
    }
}

/// Why node setup cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodePlanError {
    /// No link carries the primary ENI's MAC.
    #[error("no primary link with mac {0}")]
    NoPrimaryLink(MacAddr),
}

/// Node-wide routing changes: primary MTU, rule 1024, rules 1535. Any other rule found at 1024
/// or 1535 (an older layout's `not to <VPC>` rule, a changed mark, a removed external CIDR) is
/// deleted. Returns the ops and the primary interface's name.
pub fn plan(node: &NodeSpec, observed: &Observed) -> Result<(Vec<HostOp>, String), NodePlanError> {
    let link = observed
        .link_by_mac(node.primary_mac)
        .ok_or(NodePlanError::NoPrimaryLink(node.primary_mac))?;
    let mut ops = Vec::new();
    if link.mtu != node.mtu {
        ops.push(HostOp::SetMtu {
            ifindex: link.index,
            mtu: node.mtu,
        });
    }
    let desired = node.desired_rules();
    let mut seen: Vec<&Rule> = Vec::new();
    for r in observed.rules.iter().filter(|r| {
        r.family == node.family()
            && matches!(
                r.priority,
                CONNMARK_RULE_PRIORITY | EXTERNAL_SERVICE_RULE_PRIORITY
            )
    }) {
        if desired.contains(r) && !seen.contains(&r) {
            seen.push(r);
        } else {
            ops.push(HostOp::DeleteRule(r.clone()));
        }
    }
    ops.extend(
        desired
            .iter()
            .filter(|r| !seen.contains(r))
            .cloned()
            .map(HostOp::AddRule),
    );
    Ok((ops, link.name.clone()))
}

/// Reverse-path filtering on the primary interface as the kernel applies it: the larger of
/// `net.ipv4.conf.all.rp_filter` and `net.ipv4.conf.<primary>.rp_filter`. The init container
/// (`aws-vpc-cni-init`, privileged) sets the interface's value to 2: replies to pods on secondary
/// ENIs whose connections were SNATed to the primary IP arrive on the primary interface while their
/// source routes out of another ENI's table, which strict filtering drops. ipamd only reads it (its
/// container's sysctl tree is read-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpFilter {
    /// 0: no filtering.
    Off,
    /// 1: strict; breaks pods on secondary ENIs.
    Strict,
    /// 2: loose, what the init container sets.
    Loose,
}

impl RpFilter {
    /// The node-wide key (relative to the sysctl tree).
    pub const ALL_KEY: &'static str = "net/ipv4/conf/all/rp_filter";

    /// The key of `interface` (relative to the sysctl tree).
    #[must_use]
    pub fn key(interface: &str) -> String {
        format!("net/ipv4/conf/{interface}/rp_filter")
    }

    /// The effective mode from the two values as read; `None` if either is not a number.
    #[must_use]
    pub fn effective(all: &str, interface: &str) -> Option<Self> {
        let all: u8 = all.trim().parse().ok()?;
        let interface: u8 = interface.trim().parse().ok()?;
        Some(match all.max(interface) {
            0 => Self::Off,
            1 => Self::Strict,
            _ => Self::Loose,
        })
    }

    /// `off`, `strict` or `loose`.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Strict => "strict",
            Self::Loose => "loose",
        }
    }
}

/// Security groups for pods, strict mode: `lookup local` at [`LOCAL_RULE_PRIORITY`] added, then the
/// kernel's priority-0 one removed (in that order: the local table is never unreachable). IPv6 also
/// gets [`ipv6_gateway_rule`] at priority 0, so the router's ICMPv6 (neighbour discovery answers
/// from `fe80:ec2::1`) still reaches the local table and branch VLAN links resolve their gateway.
/// Empty once done.
#[must_use]
pub fn plan_local_rule(family: Family, observed: &Observed) -> Vec<HostOp> {
    let moved = Rule::lookup(family, LOCAL_RULE_PRIORITY, LOCAL_TABLE);
    let kernel = Rule::lookup(family, 0, LOCAL_TABLE);
    let mut ops = Vec::new();
    if !observed.rules.contains(&moved) {
        ops.push(HostOp::AddRule(moved));
    }
    if family == Family::V6 {
        let gateway = ipv6_gateway_rule();
        if !observed.rules.contains(&gateway) {
            ops.push(HostOp::AddRule(gateway));
        }
    }
    if observed.rules.contains(&kernel) {
        ops.push(HostOp::DeleteRule(kernel));
    }
    ops
}

/// Strict mode's IPv6 gateway rule: `from fe80:ec2::1/128 ipproto ipv6-icmp lookup local` at
/// priority 0.
#[must_use]
pub fn ipv6_gateway_rule() -> Rule {
    Rule {
        src: Some(IpNet::from(IpAddr::V6(
            dataplane::conventions::ENI_GATEWAY_V6,
        ))),
        ip_proto: Some(ICMPV6),
        ..Rule::lookup(Family::V6, 0, LOCAL_TABLE)
    }
}

/// IP protocol number of ICMPv6 (`IPPROTO_ICMPV6`).
const ICMPV6: u8 = 58;

/// The addresses (either family) named by per-pod rules (512 `to <ip>`, 1536 `from <ip>`,
/// host prefixes only): host evidence that a pod was given that address, read at startup, and
/// what reclaim prunes when no pod holds it. Branch-ENI pods' addresses
/// ([`branch_pod_addresses`]) are not among them: their ENI is the VPC Resource Controller's,
/// never ipamd's to hold or hand out, and their rules are their own.
#[must_use]
pub fn pod_rule_addresses(observed: &Observed) -> Vec<IpAddr> {
    let branch = branch_pod_addresses(observed);
    let mut out: Vec<IpAddr> = observed
        .rules
        .iter()
        .filter_map(|r| match r.priority {
            TO_POD_RULE_PRIORITY => r.dst,
            FROM_POD_RULE_PRIORITY => r.src,
            _ => None,
        })
        .filter(|n| n.prefix_len() == n.max_prefix_len())
        .map(|n| n.addr())
        .filter(|ip| !branch.contains(ip))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Addresses of branch-ENI pods wired in standard mode (security groups for pods): a
/// `from <ip> lookup <branch VLAN table>` rule at 1536 (table `vlan id + 100`). Strict mode's pods
/// have only `iif` rules at 10 and their route in the VLAN table, so no per-pod rule or main-table
/// route names them.
#[must_use]
pub fn branch_pod_addresses(observed: &Observed) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = observed
        .rules
        .iter()
        .filter(|r| r.priority == FROM_POD_RULE_PRIORITY && branch_vlan_of_table(r.table).is_some())
        .filter_map(|r| r.src)
        .filter(|n| n.prefix_len() == n.max_prefix_len())
        .map(|n| n.addr())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Deletes the per-pod rules (512 `to <ip>`, 1536 `from <ip>`) naming one of `ips`, as
/// `observed` shows the host now (read again just before the deletion). Never a branch-ENI
/// pod's: an address `observed` shows as a branch pod's ([`branch_pod_addresses`]) is
/// skipped whole, and a `from` rule to a VLAN table is never deleted. The plugin adds a
/// standard-mode branch pod's `from` rule to its VLAN table before its `to` rule, so the
/// pod's `to` rule is never seen alone (docs/security-groups-for-pods.md, "Stale-rule
/// prune").
#[must_use]
pub fn plan_delete_pod_rules(ips: &[std::net::Ipv4Addr], observed: &Observed) -> Vec<HostOp> {
    let branch = branch_pod_addresses(observed);
    observed
        .rules
        .iter()
        .filter(|r| {
            !(r.priority == FROM_POD_RULE_PRIORITY && branch_vlan_of_table(r.table).is_some())
        })
        .filter(|r| {
            let net = match r.priority {
                TO_POD_RULE_PRIORITY => r.dst,
                FROM_POD_RULE_PRIORITY => r.src,
                _ => None,
            };
            matches!(net, Some(IpNet::V4(n)) if n.prefix_len() == 32
                && ips.contains(&n.addr())
                && !branch.contains(&IpAddr::V4(n.addr())))
        })
        .cloned()
        .map(HostOp::DeleteRule)
        .collect()
}

/// Deletes per-pod rules whose IP is not in `assigned` (a restart after pods went away while
/// ipamd was down, or a DEL that never reached the plugin): `to <ip> lookup main` at 512 and
/// `from <ip> lookup <table>` at 1536, either family, host prefixes only.
#[must_use]
pub fn plan_prune_pod_rules(assigned: &[IpAddr], observed: &Observed) -> Vec<HostOp> {
    let host_ip = |net: Option<IpNet>| {
        net.filter(|n| n.prefix_len() == n.max_prefix_len())
            .map(|n| n.addr())
    };
    observed
        .rules
        .iter()
        .filter(|r| {
            let ip = match r.priority {
                TO_POD_RULE_PRIORITY => host_ip(r.dst),
                FROM_POD_RULE_PRIORITY => host_ip(r.src),
                _ => None,
            };
            ip.is_some_and(|ip| !assigned.contains(&ip))
        })
        .cloned()
        .map(HostOp::DeleteRule)
        .collect()
}

#[cfg(test)]
mod tests {
    use dataplane::Link;

    use super::*;

    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);

    fn node() -> NodeSpec {
        NodeSpec {
            primary_mac: MAC,
            primary_ip: Ipv4Addr::new(198, 18, 0, 10),
            mtu: 9001,
            vpc_cidrs: vec!["198.18.0.0/16".parse().unwrap()],
            exclude_snat_cidrs: vec![],
            external_snat: false,
            randomize_snat: RandomizeSnat::Prng,
            node_port_support: true,
            connmark: 0x80,
            veth_prefix: "eni".into(),
            external_service_cidrs: vec!["203.0.113.0/24".parse().unwrap()],
            ipv6: false,
            block_v6_egress_range: false,
        }
    }

    /// The kernel applies the larger of `all` and the interface's value: the init
    /// container's 2 on the interface wins over a strict `all`; a strict interface value
    /// is strict whatever `all` says (0 or 1).
    #[test]
    fn rp_filter_is_the_larger_of_all_and_the_interface() {
        assert_eq!(RpFilter::effective("0", "2"), Some(RpFilter::Loose));
        assert_eq!(RpFilter::effective("1", "2"), Some(RpFilter::Loose));
        assert_eq!(RpFilter::effective("1", "0"), Some(RpFilter::Strict));
        assert_eq!(RpFilter::effective("0", "1\n"), Some(RpFilter::Strict));
        assert_eq!(RpFilter::effective("0", "0"), Some(RpFilter::Off));
        assert_eq!(RpFilter::effective("2", "0"), Some(RpFilter::Loose));
        assert_eq!(RpFilter::effective("x", "2"), None);
        assert_eq!(RpFilter::key("eth0"), "net/ipv4/conf/eth0/rp_filter");
    }

    /// IPv6 mode (upstream `SetupHostNetwork` with `v6Enabled`): the fwmark rule in the IPv6
    /// family only, no external-service rules; an IPv4 fwmark rule left by IPv4 mode stays
    /// (upstream does not touch it either).
    #[test]
    fn ipv6_mode_rules() {
        let n = NodeSpec {
            ipv6: true,
            ..node()
        };
        let (ops, _) = plan(&n, &observed(vec![])).unwrap();
        let t = text(&ops);
        assert_eq!(t.len(), 1, "{t:?}");
        assert!(t[0].contains("pref 1024") && t[0].contains("fwmark 0x80/0x80"));
        assert!(matches!(&ops[0], HostOp::AddRule(r) if r.family == Family::V6));
        let (again, _) = plan(&n, &observed(n.desired_rules())).unwrap();
        assert!(again.is_empty(), "{:?}", text(&again));
    }

    fn observed(rules: Vec<Rule>) -> Observed {
        Observed {
            links: vec![Link {
                index: 2,
                name: "eth0".into(),
                mac: Some(MAC),
                mtu: 9001,
                up: true,
                kind: None,
            }],
            rules,
            ..Observed::default()
        }
    }

    fn text(ops: &[HostOp]) -> Vec<String> {
        ops.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn fresh_node_gets_fwmark_and_external_service_rules() {
        let (ops, name) = plan(&node(), &observed(vec![])).unwrap();
        assert_eq!(name, "eth0");
        assert_eq!(
            text(&ops),
            vec![
                "add rule pref 1024 fwmark 0x80/0x80 lookup 254",
                "add rule pref 1535 to 203.0.113.0/24 lookup 254",
            ]
        );
        let rules = ops
            .into_iter()
            .filter_map(|op| match op {
                HostOp::AddRule(r) => Some(r),
                _ => None,
            })
            .collect();
        assert!(plan(&node(), &observed(rules)).unwrap().0.is_empty());
    }

    #[test]
    fn knobs_decide_the_fwmark_rule() {
        let n = NodeSpec {
            external_snat: true,
            node_port_support: false,
            external_service_cidrs: vec![],
            mtu: 1500,
            ..node()
        };
        let existing = node().desired_rules();
        let (ops, _) = plan(&n, &observed(existing)).unwrap();
        assert_eq!(
            text(&ops),
            vec![
                "link 2 mtu 1500",
                "delete rule pref 1024 fwmark 0x80/0x80 lookup 254",
                "delete rule pref 1535 to 203.0.113.0/24 lookup 254",
            ]
        );
        // External SNAT alone still needs the mark for NodePort.
        let n = NodeSpec {
            external_snat: true,
            ..node()
        };
        assert!(n.wants_connmark_rule());
    }

    #[test]
    fn older_layout_rules_at_our_priorities_are_removed() {
        let old = Rule {
            dst: Some("198.18.0.0/16".parse().unwrap()),
            ..Rule::lookup(Family::V4, CONNMARK_RULE_PRIORITY, MAIN_TABLE)
        };
        let changed_mark = Rule {
            fwmark: Some((0x4000, 0x4000)),
            ..Rule::lookup(Family::V4, CONNMARK_RULE_PRIORITY, MAIN_TABLE)
        };
        let (ops, _) = plan(&node(), &observed(vec![old.clone(), changed_mark.clone()])).unwrap();
        assert!(ops.contains(&HostOp::DeleteRule(old)));
        assert!(ops.contains(&HostOp::DeleteRule(changed_mark)));
        assert_eq!(
            ops.iter()
                .filter(|o| matches!(o, HostOp::AddRule(_)))
                .count(),
            2
        );
    }

    #[test]
    fn missing_primary_link() {
        assert_eq!(
            plan(&node(), &Observed::default()),
            Err(NodePlanError::NoPrimaryLink(MAC))
        );
    }

    #[test]
    fn prune_keeps_assigned_and_foreign_rules() {
        let to = |ip: &str| Rule {
            dst: Some(ip.parse().unwrap()),
            ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
        };
        let from = |ip: &str, t| Rule {
            src: Some(ip.parse().unwrap()),
            ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, t)
        };
        let rules = vec![
            to("198.18.1.5/32"),
            to("198.18.1.6/32"),
            from("198.18.1.6/32", 2),
            from("198.18.1.7/32", 3),
            // Not a pod rule: a prefix, and another priority.
            to("198.18.0.0/16"),
            Rule {
                src: Some("198.18.1.6/32".parse().unwrap()),
                ..Rule::lookup(Family::V4, 32765, 2)
            },
        ];
        let assigned: Vec<IpAddr> = vec!["198.18.1.5".parse().unwrap()];
        let ops = plan_prune_pod_rules(&assigned, &observed(rules));
        assert_eq!(
            text(&ops),
            vec![
                "delete rule pref 512 to 198.18.1.6/32 lookup 254",
                "delete rule pref 1536 from 198.18.1.6/32 lookup 2",
                "delete rule pref 1536 from 198.18.1.7/32 lookup 3",
            ]
        );
    }

    /// Strict mode: lookup local at 20 first, then the kernel's at 0 removed; then nothing.
    #[test]
    fn strict_mode_moves_the_local_rule() {
        let kernel = Rule::lookup(Family::V4, 0, LOCAL_TABLE);
        let moved = Rule::lookup(Family::V4, LOCAL_RULE_PRIORITY, LOCAL_TABLE);
        let mut o = Observed::default();
        o.rules.push(kernel.clone());
        assert_eq!(
            plan_local_rule(Family::V4, &o),
            [HostOp::AddRule(moved.clone()), HostOp::DeleteRule(kernel)]
        );
        o.rules = vec![moved];
        assert!(plan_local_rule(Family::V4, &o).is_empty());
    }

    /// A standard-mode branch pod's 512/1536 rules (1536 to a VLAN table) are neither start-up
    /// evidence nor prunable: only regular pods' addresses are named.
    #[test]
    fn branch_pods_rules_are_not_pod_evidence() {
        let rule = |prio: u32, table: u32, src: Option<&str>, dst: Option<&str>| Rule {
            src: src.map(|s| s.parse().unwrap()),
            dst: dst.map(|s| s.parse().unwrap()),
            ..Rule::lookup(Family::V4, prio, table)
        };
        let o = Observed {
            rules: vec![
                rule(
                    TO_POD_RULE_PRIORITY,
                    MAIN_TABLE,
                    None,
                    Some("198.18.0.7/32"),
                ),
                rule(FROM_POD_RULE_PRIORITY, 2, Some("198.18.0.7/32"), None),
                rule(
                    TO_POD_RULE_PRIORITY,
                    MAIN_TABLE,
                    None,
                    Some("198.18.9.5/32"),
                ),
                rule(FROM_POD_RULE_PRIORITY, 105, Some("198.18.9.5/32"), None),
                rule(
                    TO_POD_RULE_PRIORITY,
                    MAIN_TABLE,
                    None,
                    Some("198.18.0.8/32"),
                ),
            ],
            ..Observed::default()
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(branch_pod_addresses(&o), [ip("198.18.9.5")]);
        assert_eq!(pod_rule_addresses(&o), [ip("198.18.0.7"), ip("198.18.0.8")]);
        assert_eq!(branch_vlan_of_table(100), None);
        assert_eq!(branch_vlan_of_table(101), Some(1));
        assert_eq!(branch_vlan_of_table(4194), Some(4094));
        assert_eq!(branch_vlan_of_table(4195), None);
        assert_eq!(branch_vlan_of_table(2), None);
    }

    /// H7 (issue 38): the prune found 198.18.9.5's `to` rule alone (a standard-mode branch
    /// pod's ADD between its two rules, or a stale rule the pod's ADD found in place) and
    /// fenced it as stale. Read again before deleting, the host shows the `from` rule to VLAN
    /// table 105 that makes it a branch pod's: nothing of it goes. A `from` rule to a VLAN
    /// table is never deleted, even for an address named stale; a regular stale address's
    /// rules still go.
    #[test]
    fn stale_rule_deletion_rereads_and_never_touches_a_branch_pods_rules() {
        let rule = |prio: u32, table: u32, src: Option<&str>, dst: Option<&str>| Rule {
            src: src.map(|s| s.parse().unwrap()),
            dst: dst.map(|s| s.parse().unwrap()),
            ..Rule::lookup(Family::V4, prio, table)
        };
        let branch_to = rule(
            TO_POD_RULE_PRIORITY,
            MAIN_TABLE,
            None,
            Some("198.18.9.5/32"),
        );
        let branch_from = rule(FROM_POD_RULE_PRIORITY, 105, Some("198.18.9.5/32"), None);
        let stale_to = rule(
            TO_POD_RULE_PRIORITY,
            MAIN_TABLE,
            None,
            Some("198.18.0.8/32"),
        );
        let stale_from = rule(FROM_POD_RULE_PRIORITY, 2, Some("198.18.0.8/32"), None);
        let v4 = |s: &str| s.parse::<std::net::Ipv4Addr>().unwrap();
        let stale = [v4("198.18.9.5"), v4("198.18.0.8")];
        let now = observed(vec![
            branch_to.clone(),
            stale_to.clone(),
            branch_from.clone(),
            stale_from.clone(),
        ]);
        assert_eq!(
            plan_delete_pod_rules(&stale, &now),
            vec![HostOp::DeleteRule(stale_to), HostOp::DeleteRule(stale_from)]
        );
        // The branch pod's `from` rule alone (its DEL between its two rules): kept.
        let now = observed(vec![branch_from]);
        assert!(plan_delete_pod_rules(&stale, &now).is_empty());
    }

    /// Strict IPv6 also adds upstream's ICMPv6 gateway rule at 0 (from fe80:ec2::1, ipproto 58,
    /// lookup local); IPv4 never does.
    #[test]
    fn strict_ipv6_adds_the_icmpv6_gateway_rule() {
        let kernel = Rule::lookup(Family::V6, 0, LOCAL_TABLE);
        let moved = Rule::lookup(Family::V6, LOCAL_RULE_PRIORITY, LOCAL_TABLE);
        let gateway = ipv6_gateway_rule();
        assert_eq!(
            dataplane::netlink::describe_rule(&gateway),
            "pref 0 from fe80:ec2::1/128 ipproto 58 lookup 255"
        );
        let mut o = Observed::default();
        o.rules.push(kernel.clone());
        assert_eq!(
            plan_local_rule(Family::V6, &o),
            [
                HostOp::AddRule(moved.clone()),
                HostOp::AddRule(gateway.clone()),
                HostOp::DeleteRule(kernel)
            ]
        );
        o.rules = vec![moved, gateway.clone()];
        assert!(plan_local_rule(Family::V6, &o).is_empty());
        assert!(
            !plan_local_rule(Family::V4, &Observed::default()).contains(&HostOp::AddRule(gateway))
        );
    }
}
