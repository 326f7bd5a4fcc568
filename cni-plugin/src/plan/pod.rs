//! The regular pod's planner: one veth pair on `CNI_IFNAME` with its IPv4, its IPv6, or both;
//! `to <ip>` rules in main and, off the primary ENI, `from <ip>` rules to the ENI's table. Also
//! plans the first interface of a multi-card pod, which is wired the same way. Must not: plan a
//! branch-ENI pod's VLAN or a multi-card pod's other interfaces.

use dataplane::conventions::{MAIN_TABLE, MIN_MTU_V6};
use ipnet::IpNet;

use super::interface::{
    InterfacePlan, LinkPlan, PodAddress, address_rules, host_link_v6_sysctls, pod_gateway_of,
    pod_v6_sysctls,
};
use super::{MarkerSpelling, PlanError, PodNetworkPlan, host_veth_for, veth_name_shared_with};
use crate::allocation::{EniAddress, Families};
use crate::spec::{CniEnv, NetConf};

/// Plans a regular pod. IPv6 needs an MTU of at least 1280.
pub(super) fn plan(
    families: &Families,
    conf: &NetConf,
    env: &CniEnv,
) -> Result<PodNetworkPlan, PlanError> {
    if families.has_ipv6() && conf.mtu < MIN_MTU_V6 {
        return Err(PlanError::MtuTooSmallForV6(conf.mtu));
    }
    Ok(PodNetworkPlan {
        interface: first_interface(families.first(), families.dual_stack_ipv6(), conf, env),
        other_cards: Vec::new(),
        branch: None,
        marker: MarkerSpelling::for_env(env),
    })
}

/// A pod address routed through the link-local gateway of its family.
fn pod_address(a: EniAddress) -> PodAddress {
    PodAddress {
        address: IpNet::from(a.ip),
        gateway: pod_gateway_of(a.ip),
        route_table: a.route_table,
    }
}

/// `CNI_IFNAME`'s interface with `first` (and a dual-stack pod's IPv6): the host veth named
/// from the pod identity, each address's `to` and `from` rules, IPv6 on in the pod when it
/// has one.
pub(super) fn first_interface(
    first: EniAddress,
    dual_stack_ipv6: Option<EniAddress>,
    conf: &NetConf,
    env: &CniEnv,
) -> InterfacePlan {
    let primary = pod_address(first);
    let dual_stack_ipv6 = dual_stack_ipv6.map(pod_address);
    let host_rules = std::iter::once(&primary)
        .chain(&dual_stack_ipv6)
        .flat_map(address_rules)
        .collect();
    let ipv6 = first.ip.is_ipv6() || dual_stack_ipv6.is_some();
    let LinkPlan {
        host_veth,
        container_ifname,
        mtu,
        host_sysctls,
        host_veth_shared_with,
    } = first_link(conf, env);
    InterfacePlan {
        host_sysctls,
        pod_sysctls: pod_v6_sysctls(ipv6, &env.ifname),
        host_veth,
        container_ifname,
        mtu,
        address: primary.address,
        gateway: primary.gateway,
        device_number: first.device_number,
        route_table: primary.route_table,
        host_rules,
        dual_stack_ipv6,
        host_route_table: MAIN_TABLE,
        pod_table: MAIN_TABLE,
        pod_rules: Vec::new(),
        host_veth_shared_with,
    }
}

/// `CNI_IFNAME`'s link, known before ipamd answers: every kind of pod (regular, multi-card,
/// branch-ENI) wires its first interface on this veth pair, so ADD creates it while the address
/// is being assigned ([`first_interface`] builds its plan from the same values).
#[must_use]
pub fn first_link(conf: &NetConf, env: &CniEnv) -> LinkPlan {
    let host_veth = host_veth_for(conf, env);
    LinkPlan {
        host_sysctls: host_link_v6_sysctls(&host_veth),
        host_veth,
        container_ifname: env.ifname.clone(),
        mtu: conf.mtu,
        host_veth_shared_with: veth_name_shared_with(env, 0),
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use dataplane::conventions::{
        FROM_POD_RULE_PRIORITY, POD_GATEWAY_V4, POD_GATEWAY_V6, TO_POD_RULE_PRIORITY,
        host_veth_name_for_container,
    };
    use dataplane::{Family, MacAddr};
    use ipamd_proto::rpc::IpAllocationMetadata;

    use super::super::fixtures::{mk_conf, mk_env, mk_reply, plan_reply};
    use super::*;

    #[test]
    fn primary_eni_pod_gets_only_the_to_rule() {
        let plan = plan_reply(
            &mk_reply("198.18.0.10", "", 0, 254),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap()
        .interface;
        assert_eq!(plan.host_veth, "enic440f455693");
        assert_eq!(plan.address.to_string(), "198.18.0.10/32");
        assert_eq!(plan.gateway, IpAddr::V4(POD_GATEWAY_V4));
        assert_eq!(plan.route_table, MAIN_TABLE);
        assert_eq!(plan.host_rules.len(), 1);
        assert_eq!(plan.host_rules[0].priority, TO_POD_RULE_PRIORITY);
        assert_eq!(plan.host_rules[0].dst, Some(plan.address));
        assert!(plan.pod_sysctls.is_empty());
        assert_eq!(
            plan.host_sysctls[0].0,
            "net/ipv6/conf/enic440f455693/accept_ra"
        );
    }

    #[test]
    fn secondary_eni_pod_gets_from_rule_to_its_table() {
        let plan = plan_reply(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap()
        .interface;
        assert_eq!(plan.route_table, 2);
        let from = &plan.host_rules[1];
        assert_eq!(from.priority, FROM_POD_RULE_PRIORITY);
        assert_eq!(from.src, Some(plan.address));
        assert_eq!(from.dst, None);
        assert_eq!(from.table, 2);
        // Table id absent: derived from the device number.
        let plan = plan_reply(
            &mk_reply("198.18.1.10", "", 2, 0),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap()
        .interface;
        assert_eq!(plan.route_table, 3);
    }

    #[test]
    fn ipv6_pod() {
        let plan = plan_reply(
            &mk_reply("", "2001:db8::5", 0, 0),
            &mk_conf(),
            &mk_env(false),
        )
        .unwrap()
        .interface;
        assert_eq!(plan.address.to_string(), "2001:db8::5/128");
        assert_eq!(plan.gateway, IpAddr::V6(POD_GATEWAY_V6));
        assert_eq!(plan.pod_sysctls.len(), 2);
        assert_eq!(plan.host_rules[0].family, Family::V6);
        // No K8S args: name from the container id.
        assert_eq!(
            plan.host_veth,
            host_veth_name_for_container("eni", "c1", "eth0")
        );
    }

    /// Dual-stack: an IPv4 and an IPv6 in one allocation, or in two: both on eth0 (IPv4
    /// first), both gateways, both host routes and rules, both in the result.
    #[test]
    fn dual_stack_reply_wires_both_families_on_one_interface() {
        let one = mk_reply("198.18.1.10", "fd00:198:18::10", 1, 2);
        let mut two = mk_reply("198.18.1.10", "", 1, 2);
        two.ip_allocation_metadata.push(IpAllocationMetadata {
            i_pv4_addr: String::new(),
            i_pv6_addr: "fd00:198:18::10".into(),
            device_number: 0,
            route_table_id: 0,
        });
        for (reply, v6_table) in [(one, 2), (two, MAIN_TABLE)] {
            let pod = plan_reply(&reply, &mk_conf(), &mk_env(true)).unwrap();
            let plan = &pod.interface;
            let addrs = plan.addresses();
            assert_eq!(addrs.len(), 2);
            assert_eq!(addrs[0].address.to_string(), "198.18.1.10/32");
            assert_eq!(addrs[1].address.to_string(), "fd00:198:18::10/128");
            assert_eq!(addrs[1].gateway, IpAddr::V6(POD_GATEWAY_V6));
            assert_eq!(addrs[1].route_table, v6_table);
            assert_eq!(plan.pod_routes(3).len(), 4);
            assert_eq!(
                plan.gateway_neighbours(3, MacAddr([2, 0, 0, 0, 0, 1]))
                    .len(),
                2
            );
            assert_eq!(
                plan.host_routes(9)
                    .iter()
                    .map(|r| r.dst.to_string())
                    .collect::<Vec<_>>(),
                ["198.18.1.10/32", "fd00:198:18::10/128"]
            );
            // IPv6 enabled in the pod although the primary address is IPv4.
            assert_eq!(plan.pod_sysctls.len(), 2);
            let to_rules = plan
                .host_rules
                .iter()
                .filter(|r| r.priority == TO_POD_RULE_PRIORITY)
                .count();
            assert_eq!(to_rules, 2);
            let from_v6 = plan
                .host_rules
                .iter()
                .any(|r| r.priority == FROM_POD_RULE_PRIORITY && r.family == Family::V6);
            assert_eq!(from_v6, v6_table != MAIN_TABLE);
            let r = pod.result(
                MacAddr([2, 0, 0, 0, 0, 1]),
                MacAddr([2, 0, 0, 0, 0, 2]),
                "/ns",
            );
            assert_eq!(r.ips.len(), 2);
            assert_eq!(r.routes.len(), 2);
            assert_eq!(r.routes[1].dst.to_string(), "::/0");
            assert!(r.ips.iter().all(|i| i.interface == Some(1)));
        }
        // Too small an MTU for the IPv6 half.
        let mut conf = mk_conf();
        conf.mtu = 1200;
        assert_eq!(
            plan_reply(
                &mk_reply("198.18.1.10", "fd00:198:18::10", 0, 0),
                &conf,
                &mk_env(true)
            ),
            Err(PlanError::MtuTooSmallForV6(1200))
        );
    }
}
