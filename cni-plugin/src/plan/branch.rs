//! The branch-ENI pod's planner (security groups for pods): one address on a veth, the VLAN link
//! `vlan.eth.<id>` on the trunk ENI's link with the branch MAC and table `<id>+100`, and the
//! enforcing mode's rules ([`BranchPlan`]). Must not: plan DEL (`branch_teardown.rs`), or more than
//! one interface (a branch-ENI pod is never multi-card).

use std::net::IpAddr;

use dataplane::conventions::{
    FROM_POD_RULE_PRIORITY, MAIN_TABLE, MIN_MTU_V6, TO_POD_RULE_PRIORITY, VLAN_RULE_PRIORITY,
    branch_route_table, branch_vlan_link_name,
};
use dataplane::{Family, MacAddr, Route, Rule, Scope};
use ipnet::IpNet;

use super::interface::{
    InterfacePlan, any_of, host_link_v6_sysctls, pod_gateway_of, pod_v6_sysctls,
};
use super::{MarkerSpelling, PlanError, PodNetworkPlan, branch_host_veth, veth_name_shared_with};
use crate::allocation::BranchEni;
use crate::spec::netconf::SgEnforcingMode;
use crate::spec::{CniEnv, NetConf};

/// The branch-ENI half of a pod's plan: the VLAN link on the trunk ENI's link and its route table;
/// the mode's rules are in the interface's [`InterfacePlan::host_rules`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchPlan {
    /// VLAN id of the branch ENI.
    pub vlan_id: u16,
    /// `vlan.eth.<id>`.
    pub vlan_link: String,
    /// The trunk ENI's link index (`ParentIfIndex`).
    pub parent_index: u32,
    /// The branch ENI's MAC, given to the VLAN link.
    pub mac: MacAddr,
    /// The branch ENI subnet's gateway.
    pub subnet_gateway: IpAddr,
    /// `<vlan id> + 100`.
    pub table: u32,
    /// The enforcing mode the rules follow.
    pub mode: SgEnforcingMode,
}

impl BranchPlan {
    /// Routes of the VLAN table: `<gw> dev vlan.eth.<id> scope link` and `default via <gw>`.
    #[must_use]
    pub fn routes(&self, vlan_index: u32) -> Vec<Route> {
        [
            Route {
                dst: IpNet::from(self.subnet_gateway),
                gateway: None,
                oif: Some(vlan_index),
                table: self.table,
                scope: Scope::Link,
            },
            Route {
                dst: any_of(self.subnet_gateway),
                gateway: Some(self.subnet_gateway),
                oif: Some(vlan_index),
                table: self.table,
                scope: Scope::Universe,
            },
        ]
        .to_vec()
    }

    /// The IPv6 sysctls of the VLAN link (as for a host veth).
    #[must_use]
    pub fn sysctls(&self) -> Vec<(String, String)> {
        host_link_v6_sysctls(&self.vlan_link)
    }

    /// The `iif <host veth>` rules at priority 10 an earlier sandbox of the same pod may have left
    /// (all removed before the new ones are added).
    #[must_use]
    pub fn is_old_veth_rule(rule: &Rule, host_veth: &str) -> bool {
        rule.priority == VLAN_RULE_PRIORITY && rule.iif.as_deref() == Some(host_veth)
    }

    /// A rule ADD removes before it takes the VLAN over: an earlier sandbox's `iif <host
    /// veth>` rule at 10 ([`Self::is_old_veth_rule`]), and every rule to this VLAN's table at
    /// 10 or 1536. The controller gives a VLAN id to one live branch ENI of the trunk at a
    /// time and ipamd answered it for this pod: whatever else routes into the table was left
    /// by a sandbox that held the id before (a DEL that could not prove it its own, or never
    /// came). Kept, a leftover `from <old address> lookup <table>` would also make this
    /// sandbox's own DEL take the table for another sandbox's and keep the VLAN link.
    #[must_use]
    pub fn is_stale_rule(&self, rule: &Rule, host_veth: &str) -> bool {
        Self::is_old_veth_rule(rule, host_veth)
            || (rule.table == self.table
                && (rule.priority == VLAN_RULE_PRIORITY || rule.priority == FROM_POD_RULE_PRIORITY))
    }
}

/// Plans a branch-ENI pod: its address on a veth, the VLAN link on the trunk's link, and the
/// enforcing mode's rules: strict, `iif vlan.eth.<id>` and `iif <host veth>` at 10 to the VLAN
/// table with the host route in it (everything the pod sends or receives crosses the branch ENI);
/// standard, the regular pod's `to <ip> lookup main` at 512 and `from <ip> lookup <table>` at 1536
/// with the host route in main. An IPv6 address needs an MTU of at least 1280.
pub(super) fn plan(
    eni: &BranchEni,
    conf: &NetConf,
    env: &CniEnv,
) -> Result<PodNetworkPlan, PlanError> {
    let ip = eni.address;
    if ip.is_ipv6() && conf.mtu < MIN_MTU_V6 {
        return Err(PlanError::MtuTooSmallForV6(conf.mtu));
    }
    let table = branch_route_table(eni.vlan_id);
    let vlan_link = branch_vlan_link_name(eni.vlan_id);
    let host_veth = branch_host_veth(conf, env);
    let address = IpNet::from(ip);
    let family = Family::of(ip);
    let mode = conf.pod_sg_enforcing_mode;
    let (host_rules, host_route_table) = match mode {
        SgEnforcingMode::Strict => (
            vec![
                Rule {
                    iif: Some(vlan_link.clone()),
                    ..Rule::lookup(family, VLAN_RULE_PRIORITY, table)
                },
                Rule {
                    iif: Some(host_veth.clone()),
                    ..Rule::lookup(family, VLAN_RULE_PRIORITY, table)
                },
            ],
            table,
        ),
        // The `from` rule to the VLAN table first: it is what marks the address a branch
        // pod's to ipamd's stale-rule prune, which must never see this pod's `to` rule alone
        // (docs/security-groups-for-pods.md, "Stale-rule prune").
        SgEnforcingMode::Standard => (
            vec![
                Rule {
                    src: Some(address),
                    ..Rule::lookup(family, FROM_POD_RULE_PRIORITY, table)
                },
                Rule {
                    dst: Some(address),
                    ..Rule::lookup(family, TO_POD_RULE_PRIORITY, MAIN_TABLE)
                },
            ],
            MAIN_TABLE,
        ),
    };
    Ok(PodNetworkPlan {
        interface: InterfacePlan {
            host_sysctls: host_link_v6_sysctls(&host_veth),
            pod_sysctls: pod_v6_sysctls(ip.is_ipv6(), &env.ifname),
            host_veth,
            container_ifname: env.ifname.clone(),
            mtu: conf.mtu,
            address,
            gateway: pod_gateway_of(ip),
            device_number: 0,
            route_table: table,
            host_rules,
            dual_stack_ipv6: None,
            host_route_table,
            pod_table: MAIN_TABLE,
            pod_rules: Vec::new(),
            host_veth_shared_with: veth_name_shared_with(env, 0),
        },
        other_cards: Vec::new(),
        branch: Some(BranchPlan {
            vlan_id: eni.vlan_id,
            vlan_link,
            parent_index: eni.parent_index,
            mac: eni.mac,
            subnet_gateway: eni.subnet_gateway,
            table,
            mode,
        }),
        marker: MarkerSpelling::for_env(env),
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{branch_reply, mk_conf, mk_env, plan_reply};
    use super::super::{marker_vlan, prev_extra_interfaces, teardown_veth_names};
    use super::*;
    use crate::allocation::AllocationError;

    /// upstream driver.go `SetupBranchENIPodNetwork`: strict = `iif vlan.eth.<id>` and
    /// `iif <vlan veth>` at 10 to table <id>+100 with the host route there; standard = the
    /// `eni` veth, 512/1536 rules and the host route in main. The result's marker carries the
    /// VLAN id, its address the subnet gateway.
    #[test]
    fn branch_pod_plans_per_enforcing_mode() {
        let strict = plan_reply(&branch_reply(5), &mk_conf(), &mk_env(true)).unwrap();
        let b = strict.branch.clone().unwrap();
        assert_eq!((b.vlan_id, b.table, b.parent_index), (5, 105, 3));
        assert_eq!(b.vlan_link, "vlan.eth.5");
        assert!(
            strict.interface.host_veth.starts_with("vlan"),
            "{}",
            strict.interface.host_veth
        );
        assert_eq!(strict.interface.host_route_table, 105);
        let iifs: Vec<_> = strict
            .interface
            .host_rules
            .iter()
            .map(|r| (r.priority, r.iif.clone().unwrap_or_default(), r.table))
            .collect();
        assert_eq!(
            iifs,
            [
                (10, "vlan.eth.5".to_owned(), 105),
                (10, strict.interface.host_veth.clone(), 105)
            ]
        );
        assert_eq!(b.routes(7)[1].gateway, Some("198.18.8.1".parse().unwrap()));
        let r = strict.result(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            "/ns",
        );
        assert_eq!(
            r.interfaces[2].mac, "5",
            "upstream's spelling for kubelet's pods"
        );
        assert_eq!(r.interfaces[2].sandbox, None);
        assert_eq!(r.ips[0].gateway, Some("198.18.8.1".parse().unwrap()));
        assert_eq!(marker_vlan(&r), Some(5));

        let mut conf = mk_conf();
        conf.pod_sg_enforcing_mode = SgEnforcingMode::Standard;
        let standard = plan_reply(&branch_reply(5), &conf, &mk_env(true)).unwrap();
        assert!(standard.interface.host_veth.starts_with("eni"));
        assert_eq!(standard.interface.host_route_table, MAIN_TABLE);
        let rules: Vec<_> = standard
            .interface
            .host_rules
            .iter()
            .map(|r| (r.priority, r.table, r.src.is_some(), r.dst.is_some()))
            .collect();
        // The `from` rule to the VLAN table first: ipamd's stale-rule prune takes a `to` rule
        // without it for a regular pod's leftover (H7, issue 38).
        assert_eq!(
            rules,
            [(1536, 105, true, false), (512, MAIN_TABLE, false, true)]
        );

        // Refused: no trunk index, a bad MAC, VLAN 0 never reaches here, 4095 is out of range.
        let mut bad = branch_reply(5);
        bad.parent_if_index = 0;
        assert!(matches!(
            plan_reply(&bad, &conf, &mk_env(true)),
            Err(PlanError::Allocation(
                AllocationError::BadBranchReply { .. }
            ))
        ));
        let mut bad = branch_reply(5);
        bad.pod_enimac = "nope".into();
        assert!(matches!(
            plan_reply(&bad, &conf, &mk_env(true)),
            Err(PlanError::Allocation(
                AllocationError::BadBranchReply { .. }
            ))
        ));
        assert!(matches!(
            plan_reply(&branch_reply(4095), &conf, &mk_env(true)),
            Err(PlanError::Allocation(
                AllocationError::BadBranchReply { .. }
            ))
        ));
    }

    /// A branch pod's ADD takes its VLAN's table over: every rule into table 105 at 10 or
    /// 1536 (an earlier holder of VLAN 5 whose DEL could not prove them its own) and its own
    /// name's `iif` rule into any table go; other tables' rules and the 512 rules stay.
    #[test]
    fn branch_add_takes_the_vlan_table_over_from_stale_rules() {
        let mut conf = mk_conf();
        conf.pod_sg_enforcing_mode = SgEnforcingMode::Standard;
        let plan = plan_reply(&branch_reply(5), &conf, &mk_env(true)).unwrap();
        let b = plan.branch.clone().unwrap();
        let rule = |prio: u32, table: u32, iif: Option<&str>, src: Option<&str>| Rule {
            iif: iif.map(Into::into),
            src: src.map(|s| s.parse().unwrap()),
            ..Rule::lookup(Family::V4, prio, table)
        };
        let stale = [
            rule(VLAN_RULE_PRIORITY, 105, Some("vlan.eth.5"), None),
            rule(VLAN_RULE_PRIORITY, 105, Some("vlanold"), None),
            rule(
                VLAN_RULE_PRIORITY,
                106,
                Some(&plan.interface.host_veth),
                None,
            ),
            rule(FROM_POD_RULE_PRIORITY, 105, None, Some("198.18.8.9/32")),
        ];
        let kept = [
            rule(VLAN_RULE_PRIORITY, 106, Some("vlan.eth.6"), None),
            rule(FROM_POD_RULE_PRIORITY, 106, None, Some("198.18.8.9/32")),
            rule(TO_POD_RULE_PRIORITY, MAIN_TABLE, None, None),
        ];
        for r in &stale {
            assert!(b.is_stale_rule(r, &plan.interface.host_veth), "{r:?}");
        }
        for r in &kept {
            assert!(!b.is_stale_rule(r, &plan.interface.host_veth), "{r:?}");
        }
    }

    /// A branch-ENI pod beside multi-NIC support: it has one interface (no other cards' interfaces,
    /// pod table main, no pod rules); its result, read back as prevResult, counts no further
    /// interface (its marker has no `sandbox`, as upstream's, and is not a host veth), and DEL's
    /// names are its `vlan<hash>` veth and the configured one, nothing of `host_veth_at`.
    #[test]
    fn branch_pod_result_is_one_interface_for_multi_nic_teardown() {
        let env = mk_env(true);
        let plan = plan_reply(&branch_reply(5), &mk_conf(), &env).unwrap();
        assert!(plan.other_cards.is_empty());
        assert_eq!(plan.interface.pod_table, MAIN_TABLE);
        assert!(plan.interface.pod_rules.is_empty());
        let mac = |b: u8| MacAddr([2, 0, 0, 0, 0, b]);
        let result = plan.result_with(&[(mac(1), mac(2))], "/ns");
        assert_eq!(result.interfaces.len(), 3);
        assert_eq!(result.interfaces[2].mac, "5");
        assert_eq!(result.ips[0].interface, Some(1));
        assert_eq!(result.ips[0].gateway, Some("198.18.8.1".parse().unwrap()));
        let mut conf = mk_conf();
        conf.prev_result = Some(result);
        assert_eq!(prev_extra_interfaces(&conf), 0);
        assert_eq!(
            teardown_veth_names(&conf, &env),
            vec![
                "enic440f455693".to_owned(),
                plan.interface.host_veth.clone()
            ]
        );
        assert!(plan.interface.host_veth.starts_with("vlan"));
    }
}
