//! DEL's plan for a branch-ENI pod's VLAN objects: the VLAN link, its table's rules and routes, and
//! the proven addresses' rules, kept whenever the host shows another sandbox owns the VLAN now.
//! Must not: decide which host veths are this sandbox's (`teardown.rs` proves them; [`BranchProof`]
//! carries that proof here), or plan ADD.

use std::net::IpAddr;

use dataplane::conventions::{
    FROM_POD_RULE_PRIORITY, TO_POD_RULE_PRIORITY, VLAN_RULE_PRIORITY, branch_route_table,
    branch_vlan_link_name,
};
use dataplane::{Route, Rule};
use ipnet::IpNet;

use super::HostLink;

/// What a branch-ENI pod's DEL removes besides its veth (by the VLAN id prevResult recorded): the
/// VLAN link, the rules at 10 to its table (both modes' layouts, since the mode may have changed
/// since ADD), the pod address's 512/1536 rules and its route in the VLAN table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BranchTeardown {
    /// The VLAN link to delete, unless the table is provably another sandbox's.
    pub vlan_link: Option<String>,
    /// Rules to delete.
    pub rules: Vec<Rule>,
    /// Routes to delete (the pod address in the VLAN table).
    pub routes: Vec<Route>,
    /// Why the VLAN link and its table were kept, if they were.
    pub kept: Option<String>,
}

/// What proves a branch-ENI pod's host objects are this sandbox's, read while its host veth
/// still exists: the host veths [`super::plan_teardown`] proved its own (paired with the sandbox's
/// interface, or carrying the name and MAC prevResult recorded) and the addresses the host
/// routes through them, in any table (main in standard mode, the VLAN table in strict mode).
/// A name proves nothing: every sandbox of a pod computes the same veth name, and the VPC
/// Resource Controller reuses VLAN ids and addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BranchProof {
    /// This sandbox's host veths (name, index), present when the proof was read.
    pub veths: Vec<(String, u32)>,
    /// Host-prefix route destinations through those veths.
    pub addresses: Vec<IpNet>,
}

impl BranchProof {
    /// The proof from the veths [`super::plan_teardown`] proved this sandbox's and the host's
    /// routes (every table).
    #[must_use]
    pub fn of(own_veths: &[HostLink], routes: &[Route]) -> Self {
        let veths: Vec<(String, u32)> = own_veths
            .iter()
            .map(|l| (l.name.clone(), l.index))
            .collect();
        let mut addresses = Vec::new();
        for r in routes {
            if r.dst.prefix_len() == r.dst.max_prefix_len()
                && r.oif.is_some_and(|i| veths.iter().any(|(_, v)| *v == i))
                && !addresses.contains(&r.dst)
            {
                addresses.push(r.dst);
            }
        }
        Self { veths, addresses }
    }

    /// Whether nothing proves any object this sandbox's (its veth is gone or another
    /// sandbox's).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.veths.is_empty()
    }

    fn names_veth(&self, name: &str) -> bool {
        self.veths.iter().any(|(n, _)| n == name)
    }
}

/// Plans a branch-ENI pod's teardown from the host's rules and routes. The VLAN id comes from
/// prevResult (or ipamd's answer without one), and VLAN ids, veth names and addresses are
/// reused for other sandboxes (a StatefulSet pod re-created under its name gets the same veth
/// name, and often the same VLAN id): only what `proof` shows is this sandbox's goes.
/// - Nothing proven (the sandbox's veth is gone, or the one under its name is another
///   sandbox's): nothing is touched; the VLAN link and rules are whoever's wired them last.
/// - A rule or route of the VLAN table naming something else (an `iif` that is neither the
///   VLAN link nor a proven veth, a `from` address not proven, a route through another link):
///   another sandbox owns the VLAN now, and only the rules naming the proven veths and
///   addresses go.
/// - Otherwise the VLAN link, every rule at 10 to its table, the proven addresses' 512/1536
///   rules and their routes in the VLAN table go.
#[must_use]
pub fn plan_branch_teardown(
    vlan_id: u16,
    proof: &BranchProof,
    rules: &[Rule],
    routes: &[Route],
) -> BranchTeardown {
    let table = branch_route_table(vlan_id);
    let vlan_link = branch_vlan_link_name(vlan_id);
    let mut plan = BranchTeardown::default();
    if proof.is_empty() {
        plan.kept = Some(format!(
            "no host veth proven this sandbox's: {vlan_link}, table {table} and their rules may be another sandbox's"
        ));
        return plan;
    }
    let addresses = &proof.addresses;
    // The VLAN table's own routes: the default route via the subnet gateway and the gateway's
    // link route.
    let gateways: Vec<IpAddr> = routes
        .iter()
        .filter(|r| r.table == table)
        .filter_map(|r| r.gateway)
        .collect();
    let foreign_rule = rules.iter().find(|r| {
        r.table == table
            && ((r.priority == VLAN_RULE_PRIORITY
                && r.iif
                    .as_ref()
                    .is_some_and(|i| *i != vlan_link && !proof.names_veth(i)))
                || (r.priority == FROM_POD_RULE_PRIORITY
                    && r.src.is_some_and(|s| !addresses.contains(&s))))
    });
    let foreign_route = routes.iter().find(|r| {
        r.table == table
            && r.dst.prefix_len() == r.dst.max_prefix_len()
            && r.gateway.is_none()
            && !addresses.contains(&r.dst)
            && !gateways.contains(&r.dst.addr())
            && r.oif
                .is_some_and(|i| !proof.veths.iter().any(|(_, v)| *v == i))
    });
    let ours = |r: &Rule| {
        (r.priority == VLAN_RULE_PRIORITY
            && r.table == table
            && r.iif.as_ref().is_some_and(|i| proof.names_veth(i)))
            || (r.priority == TO_POD_RULE_PRIORITY
                && r.src.is_none()
                && r.dst.is_some_and(|d| addresses.contains(&d)))
            || (r.priority == FROM_POD_RULE_PRIORITY
                && r.src.is_some_and(|s| addresses.contains(&s)))
    };
    if let Some(r) = foreign_rule {
        plan.kept = Some(format!(
            "table {table} is another sandbox's ({})",
            dataplane::netlink::describe_rule(r)
        ));
        plan.rules = rules.iter().filter(|r| ours(r)).cloned().collect();
    } else if let Some(r) = foreign_route {
        plan.kept = Some(format!(
            "table {table} routes {} through another link (index {:?})",
            r.dst, r.oif
        ));
        plan.rules = rules.iter().filter(|r| ours(r)).cloned().collect();
    } else {
        plan.vlan_link = Some(vlan_link);
        plan.rules = rules
            .iter()
            .filter(|r| (r.priority == VLAN_RULE_PRIORITY && r.table == table) || ours(r))
            .cloned()
            .collect();
    }
    plan.routes = routes
        .iter()
        .filter(|r| r.table == table && addresses.contains(&r.dst))
        .copied()
        .collect();
    plan
}

#[cfg(test)]
mod tests {
    use dataplane::conventions::MAIN_TABLE;
    use dataplane::{Family, MacAddr, Scope};

    use super::super::fixtures::{branch_reply, mk_conf, mk_env, plan_reply};
    use super::super::{IpamdRelease, PodEnd, TeardownView, plan_teardown};
    use super::*;
    use crate::spec::netconf::SgEnforcingMode;

    /// A strict-mode branch pod's host as the plugin wired it: `vlan.eth.5` (index 20) with
    /// table 105's gateway and default routes, the pod's `/32` in table 105 through its veth
    /// `veth` (index `veth_index`), and `iif` rules at 10 for the VLAN link and `veth`.
    fn strict_branch_host(veth: &str, veth_index: u32, pod: &str) -> (Vec<Rule>, Vec<Route>) {
        let iif = |name: &str| Rule {
            iif: Some(name.into()),
            ..Rule::lookup(Family::V4, VLAN_RULE_PRIORITY, 105)
        };
        let gw: IpAddr = "198.18.8.1".parse().unwrap();
        let routes = vec![
            Route {
                dst: IpNet::from(gw),
                gateway: None,
                oif: Some(20),
                table: 105,
                scope: Scope::Link,
            },
            Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gateway: Some(gw),
                oif: Some(20),
                table: 105,
                scope: Scope::Universe,
            },
            Route {
                dst: pod.parse().unwrap(),
                gateway: None,
                oif: Some(veth_index),
                table: 105,
                scope: Scope::Link,
            },
        ];
        (vec![iif("vlan.eth.5"), iif(veth)], routes)
    }

    fn link(name: &str, index: u32) -> HostLink {
        HostLink {
            index,
            name: name.into(),
            mac: Some(MacAddr([2, 0, 0, 0, 0, 9])),
            peer_index: Some(2),
        }
    }

    /// This sandbox's veth is proven (paired with its interface): the VLAN link, every rule at
    /// 10 to table 105 and the pod's route there go. A rule naming another veth, or a route
    /// in table 105 through another link, is another sandbox's VLAN: only this sandbox's own
    /// rules and route go, the link stays.
    #[test]
    fn branch_teardown_keeps_a_vlan_another_sandbox_owns() {
        let (rules, routes) = strict_branch_host("vlanaaa", 9, "198.18.8.10/32");
        let proof = BranchProof::of(&[link("vlanaaa", 9)], &routes);
        assert_eq!(
            proof.addresses,
            vec!["198.18.8.10/32".parse::<IpNet>().unwrap()]
        );
        let plan = plan_branch_teardown(5, &proof, &rules, &routes);
        assert_eq!(plan.vlan_link.as_deref(), Some("vlan.eth.5"));
        assert_eq!(plan.rules, rules);
        assert_eq!(plan.routes, vec![routes[2]]);
        assert_eq!(plan.kept, None);

        // A rule naming another veth: that sandbox has VLAN 5 now.
        let mut other = rules.clone();
        other.push(Rule {
            iif: Some("vlanbbb".into()),
            ..Rule::lookup(Family::V4, VLAN_RULE_PRIORITY, 105)
        });
        let plan = plan_branch_teardown(5, &proof, &other, &routes);
        assert_eq!(plan.vlan_link, None);
        assert_eq!(plan.rules, vec![rules[1].clone()]);
        assert_eq!(plan.routes, vec![routes[2]]);
        assert!(plan.kept.is_some());

        // A route in table 105 through another link (an ADD between its route and its rule).
        let mut other = routes.clone();
        other.push(Route {
            dst: "198.18.8.77/32".parse().unwrap(),
            oif: Some(33),
            ..routes[2]
        });
        let plan = plan_branch_teardown(5, &proof, &rules, &other);
        assert_eq!(plan.vlan_link, None);
        assert_eq!(plan.rules, vec![rules[1].clone()]);
        assert!(plan.kept.is_some());
    }

    /// H5 (issue 38): a StatefulSet pod re-created under its name is wired on the same veth
    /// name and, when the controller reuses the VLAN id, the same `vlan.eth.5` and table 105.
    /// The old sandbox's late DEL finds that veth under its name, but neither paired with its
    /// interface (gone) nor with the MAC its prevResult recorded: nothing proves anything
    /// this sandbox's, so the new pod's VLAN link, rules and route all stay (and its network
    /// policy: the veth is another sandbox's). The old code decided by the name and deleted
    /// them: the new pod's egress then left through the node's eth0, outside its groups.
    #[test]
    fn late_del_of_an_old_sandbox_keeps_the_vlan_of_the_pod_recreated_under_its_name() {
        let env = mk_env(true);
        let new_pod = plan_reply(&branch_reply(5), &mk_conf(), &env).unwrap();
        let old_sandbox = new_pod.result_with(
            &[(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]))],
            "/var/run/netns/old",
        );
        let mut conf = mk_conf();
        conf.prev_result = Some(old_sandbox);
        // The new sandbox's veth: same name, another MAC, paired with an interface elsewhere.
        let (rules, routes) = strict_branch_host(&new_pod.interface.host_veth, 9, "198.18.8.10/32");
        let view = TeardownView {
            host_links: vec![link(&new_pod.interface.host_veth, 9)],
            pod_end: None,
            other_card_pod_ends: Vec::new(),
            host_routes: Vec::new(),
        };
        let plan = plan_teardown(&conf, &env, &IpamdRelease::NotAskedYet, &view);
        assert!(plan.host_veths.is_empty(), "{plan:?}");
        assert_eq!(plan.foreign_veths.len(), 1);
        assert!(plan.addresses.is_empty());
        let proof = BranchProof::of(&plan.host_veths, &routes);
        let branch = plan_branch_teardown(5, &proof, &rules, &routes);
        assert_eq!(branch.vlan_link, None, "{branch:?}");
        assert!(branch.rules.is_empty(), "{branch:?}");
        assert!(branch.routes.is_empty(), "{branch:?}");
        assert!(branch.kept.is_some());

        // The same DEL while its own veth is still there (paired with its interface): all of
        // VLAN 5 is its own.
        let view = TeardownView {
            host_links: vec![link(&new_pod.interface.host_veth, 9)],
            pod_end: Some(PodEnd {
                index: 2,
                peer_index: Some(9),
            }),
            other_card_pod_ends: Vec::new(),
            host_routes: Vec::new(),
        };
        let plan = plan_teardown(&conf, &env, &IpamdRelease::NotAskedYet, &view);
        let proof = BranchProof::of(&plan.host_veths, &routes);
        let branch = plan_branch_teardown(5, &proof, &rules, &routes);
        assert_eq!(branch.vlan_link.as_deref(), Some("vlan.eth.5"));
        assert_eq!(branch.rules.len(), 2);
    }

    /// H6 (issue 38): prevResult's address is no proof. A standard-mode branch pod's old
    /// sandbox (VLAN 5, 198.18.8.10) is torn down while another pod holds 198.18.8.10 now
    /// (routed through its veth, index 12, with its 512/1536 rules to its VLAN 6): those rules
    /// stay. Only the address routed through this sandbox's own veth (198.18.8.11) goes.
    #[test]
    fn branch_del_removes_only_the_rules_of_addresses_routed_through_its_own_veth() {
        let mut conf = mk_conf();
        conf.pod_sg_enforcing_mode = SgEnforcingMode::Standard;
        let env = mk_env(true);
        let old = plan_reply(&branch_reply(5), &conf, &env).unwrap();
        let own_mac = MacAddr([2, 0, 0, 0, 0, 1]);
        let mut prev = old.result_with(&[(own_mac, MacAddr([2, 0, 0, 0, 0, 2]))], "/ns");
        // prevResult names .10; this sandbox's veth routes .11 (say a resync re-wired it).
        assert_eq!(prev.ips[0].address.addr().to_string(), "198.18.8.10");
        conf.prev_result = Some(prev.clone());
        let rules_of = |ip: &str, table: u32| {
            let a: IpNet = format!("{ip}/32").parse().unwrap();
            vec![
                Rule {
                    dst: Some(a),
                    ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
                },
                Rule {
                    src: Some(a),
                    ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, table)
                },
            ]
        };
        let main_route = |ip: &str, oif: u32| Route {
            dst: format!("{ip}/32").parse().unwrap(),
            gateway: None,
            oif: Some(oif),
            table: MAIN_TABLE,
            scope: Scope::Link,
        };
        let mut rules = rules_of("198.18.8.10", 106);
        rules.extend(rules_of("198.18.8.11", 105));
        let routes = vec![main_route("198.18.8.10", 12), main_route("198.18.8.11", 9)];
        let mut own = link(&old.interface.host_veth, 9);
        own.mac = Some(own_mac);
        let view = TeardownView {
            host_links: vec![own],
            pod_end: None,
            other_card_pod_ends: Vec::new(),
            host_routes: routes.clone(),
        };
        let plan = plan_teardown(&conf, &env, &IpamdRelease::NotAskedYet, &view);
        assert_eq!(
            plan.host_veths.len(),
            1,
            "proven by prevResult's name and MAC"
        );
        let proof = BranchProof::of(&plan.host_veths, &routes);
        assert_eq!(
            proof.addresses,
            vec!["198.18.8.11/32".parse::<IpNet>().unwrap()]
        );
        let branch = plan_branch_teardown(5, &proof, &rules, &routes);
        assert_eq!(branch.rules, rules_of("198.18.8.11", 105));
        assert_eq!(branch.vlan_link.as_deref(), Some("vlan.eth.5"));
        assert!(
            !plan.addresses.contains(&"198.18.8.10/32".parse().unwrap()),
            "{plan:?}"
        );
        // Nothing proven (the veth is another sandbox's): no rule at all goes.
        prev.interfaces[0].mac = "02:00:00:00:00:99".into();
        conf.prev_result = Some(prev);
        let plan = plan_teardown(&conf, &env, &IpamdRelease::NotAskedYet, &view);
        let proof = BranchProof::of(&plan.host_veths, &routes);
        let branch = plan_branch_teardown(5, &proof, &rules, &routes);
        assert!(
            branch.rules.is_empty() && branch.vlan_link.is_none(),
            "{branch:?}"
        );
    }
}
