//! The multi-card pod's planner (annotation `k8s.amazonaws.com/nicConfig: multi-nic-attachment`;
//! one interface per `IPAllocationMetadata`): `CNI_IFNAME` wired as a regular IPv4 pod's, then one
//! interface per other network card, `mNicIf<i>`, routing by its own pod table. Must not: plan IPv6
//! (a multi-card reply is IPv4 only: `allocation` refuses the others) or a branch-ENI pod.

use std::net::{IpAddr, Ipv4Addr};

use dataplane::conventions::{
    MAIN_TABLE, POD_FROM_INTERFACE_RULE_PRIORITY, pod_gateway_v4, pod_interface_name,
};
use dataplane::{Family, Rule};
use ipnet::IpNet;

use super::interface::{InterfacePlan, PodAddress, address_rules, host_link_v6_sysctls};
use super::{MarkerSpelling, PodNetworkPlan, host_veth_at, pod, veth_name_shared_with};
use crate::allocation::EniAddress;
use crate::spec::{CniEnv, NetConf};

/// Plans a multi-card pod: `first` on `CNI_IFNAME`, `other_cards` on interfaces 1, 2, ...
pub(super) fn plan(
    first: EniAddress<Ipv4Addr>,
    other_cards: &[EniAddress<Ipv4Addr>],
    conf: &NetConf,
    env: &CniEnv,
) -> PodNetworkPlan {
    PodNetworkPlan {
        interface: pod::first_interface(first.widen(), None, conf, env),
        other_cards: other_cards
            .iter()
            .zip(1u32..)
            .map(|(card, index)| card_interface(conf, env, index, *card))
            .collect(),
        branch: None,
        marker: MarkerSpelling::for_env(env),
    }
}

/// A multi-card pod's interface `index` > 0: `mNicIf<index>` in the pod with the address, gateway
/// `169.254.1.<index + 1>`, its routes in pod table `index` and `from <address> lookup <index>` at
/// priority 1; on the host, `to <address> lookup main` and
/// `from <address> lookup <its ENI's table>` (`10000 + 100 × card + device`).
fn card_interface(
    conf: &NetConf,
    env: &CniEnv,
    index: u32,
    card: EniAddress<Ipv4Addr>,
) -> InterfacePlan {
    let address = IpNet::from(IpAddr::V4(card.ip));
    let gateway = IpAddr::V4(pod_gateway_v4(index));
    let host_veth = host_veth_at(conf, env, index);
    let host_rules = address_rules(&PodAddress {
        address,
        gateway,
        route_table: card.route_table,
    });
    InterfacePlan {
        host_sysctls: host_link_v6_sysctls(&host_veth),
        host_veth,
        container_ifname: pod_interface_name(&env.ifname, index),
        mtu: conf.mtu,
        address,
        gateway,
        device_number: card.device_number,
        route_table: card.route_table,
        pod_sysctls: Vec::new(),
        host_rules,
        dual_stack_ipv6: None,
        host_route_table: MAIN_TABLE,
        pod_table: index,
        pod_rules: vec![Rule {
            src: Some(address),
            ..Rule::lookup(Family::V4, POD_FROM_INTERFACE_RULE_PRIORITY, index)
        }],
        host_veth_shared_with: veth_name_shared_with(env, index),
    }
}

#[cfg(test)]
mod tests {
    use dataplane::MacAddr;
    use dataplane::conventions::{FROM_POD_RULE_PRIORITY, TO_POD_RULE_PRIORITY};
    use ipamd_proto::rpc::IpAllocationMetadata;

    use super::super::PlanError;
    use super::super::fixtures::{mk_conf, mk_env, mk_reply, plan_reply};
    use super::*;
    use crate::allocation::AllocationError;

    /// A multi-NIC reply (upstream `rpc_handler.go`: one `IPAllocationMetadata` per network
    /// card) → one interface per entry, as upstream's `cni.go` `add` and
    /// `driver.createVethPairContext.run` wire them: interface `i` > 0 is `mNicIf<i>`
    /// (`GenerateContainerVethName`), its host veth `GeneratePodHostVethName(prefix, ns,
    /// name, i)` = sha1 of `<ns>.<name>.<i>`, gateway `169.254.1.<i+1>`
    /// (`CalculatePodIPv4GatewayIP`), routes in pod table `i` with `from <ip> lookup i` at
    /// priority 1 (`FromInterfaceRulePriority`); on the host `to <ip>` at 512 and
    /// `from <ip> lookup <RouteTableId>` at 1536.
    #[test]
    fn multi_nic_reply_wires_one_interface_per_card() {
        let mut reply = mk_reply("198.18.0.10", "", 0, 254);
        for (ip, table) in [("198.19.0.11", 10100), ("198.20.0.12", 10201)] {
            reply.ip_allocation_metadata.push(IpAllocationMetadata {
                i_pv4_addr: ip.into(),
                i_pv6_addr: String::new(),
                device_number: table % 100,
                route_table_id: table,
            });
        }
        let plan = plan_reply(&reply, &mk_conf(), &mk_env(true)).unwrap();
        assert_eq!(plan.interface.host_veth, "enic440f455693");
        assert_eq!(plan.interface.pod_table, MAIN_TABLE);
        assert!(plan.interface.pod_rules.is_empty());
        assert_eq!(plan.other_cards.len(), 2);
        let one = &plan.other_cards[0];
        assert_eq!(one.host_veth, "enie48ae9c2f34");
        assert_eq!(one.container_ifname, "mNicIf1");
        assert_eq!(one.gateway.to_string(), "169.254.1.2");
        assert_eq!(one.pod_table, 1);
        assert_eq!(
            one.pod_rules,
            [Rule {
                src: Some("198.19.0.11/32".parse().unwrap()),
                ..Rule::lookup(Family::V4, 1, 1)
            }]
        );
        assert_eq!(
            one.host_rules,
            [
                Rule {
                    dst: Some("198.19.0.11/32".parse().unwrap()),
                    ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
                },
                Rule {
                    src: Some("198.19.0.11/32".parse().unwrap()),
                    ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, 10100)
                }
            ]
        );
        assert!(one.pod_routes(7).iter().all(|r| r.table == 1));
        let two = &plan.other_cards[1];
        assert_eq!(
            (two.host_veth.as_str(), two.container_ifname.as_str()),
            ("eni1266d167117", "mNicIf2")
        );
        assert_eq!(
            (two.gateway.to_string(), two.route_table),
            ("169.254.1.3".to_owned(), 10201)
        );
        // the result lists every interface pair, then the marker; each address on its
        // container interface (upstream: `containerInterfaceIndex = len(podInterfaces) - 1`)
        let mac = |b: u8| MacAddr([2, 0, 0, 0, 0, b]);
        let r = plan.result_with(
            &[(mac(1), mac(2)), (mac(3), mac(4)), (mac(5), mac(6))],
            "/ns",
        );
        let names: Vec<&str> = r.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "enic440f455693",
                "eth0",
                "enie48ae9c2f34",
                "mNicIf1",
                "eni1266d167117",
                "mNicIf2",
                "dummyc440f455693"
            ]
        );
        let on: Vec<(String, Option<usize>)> = r
            .ips
            .iter()
            .map(|i| (i.address.to_string(), i.interface))
            .collect();
        assert_eq!(
            on,
            [
                ("198.18.0.10/32".to_owned(), Some(1)),
                ("198.19.0.11/32".to_owned(), Some(3)),
                ("198.20.0.12/32".to_owned(), Some(5))
            ]
        );
        assert_eq!(
            r.routes.len(),
            1,
            "only the first interface routes by default"
        );
    }

    /// Issue 38: pod `x`'s interface 1 and pod `x.1`'s first interface have the same host veth
    /// name (upstream's hash of `<ns>.<pod>.<index>`). Each plan names the other, so ADD
    /// refuses a link found under the name instead of deleting it; a pod whose name cannot
    /// collide keeps upstream's clean-up of an earlier sandbox's leftover.
    #[test]
    fn multi_nic_veth_names_shared_with_another_pod_are_named() {
        let pod = |name: &str| {
            let mut env = mk_env(true);
            env.k8s.pod_name = name.into();
            env
        };
        let mut reply = mk_reply("198.18.0.10", "", 0, 254);
        reply.ip_allocation_metadata.push(IpAllocationMetadata {
            i_pv4_addr: "198.19.0.11".into(),
            i_pv6_addr: String::new(),
            device_number: 0,
            route_table_id: 10100,
        });
        let x = plan_reply(&reply, &mk_conf(), &pod("x")).unwrap();
        let x1 = plan_reply(
            &mk_reply("198.18.0.12", "", 0, 254),
            &mk_conf(),
            &pod("x.1"),
        )
        .unwrap();
        assert_eq!(
            x.other_cards[0].host_veth, x1.interface.host_veth,
            "the names collide"
        );
        assert_eq!(x.interface.host_veth_shared_with, None);
        assert_eq!(
            x.other_cards[0].host_veth_shared_with.as_deref(),
            Some("pod default/x.1's first interface")
        );
        assert_eq!(
            x1.interface.host_veth_shared_with.as_deref(),
            Some("pod default/x's interface 1")
        );
        for name in ["web-0", "x.0", "x.01", ".1", "x.32", "x.y"] {
            assert_eq!(veth_name_shared_with(&pod(name), 0), None, "{name}");
        }
        let container = mk_env(false);
        assert!(veth_name_shared_with(&container, 1).is_some());
    }

    /// Several interfaces are IPv4 only: a multi-NIC reply with an IPv6 (or several IPv6
    /// entries) is refused, never wired as one interface in silence.
    #[test]
    fn multi_nic_reply_with_ipv6_is_refused() {
        let mut reply = mk_reply("198.18.0.10", "2001:db8::1", 0, 254);
        reply.ip_allocation_metadata.push(IpAllocationMetadata {
            i_pv4_addr: "198.19.0.11".into(),
            route_table_id: 10100,
            ..Default::default()
        });
        assert_eq!(
            plan_reply(&reply, &mk_conf(), &mk_env(true)),
            Err(PlanError::Allocation(AllocationError::MultiCardNotV4(1)))
        );
        let mut v6 = mk_reply("", "2001:db8::1", 0, 254);
        v6.ip_allocation_metadata.push(IpAllocationMetadata {
            i_pv6_addr: "2001:db8:1::1".into(),
            route_table_id: 10100,
            ..Default::default()
        });
        assert_eq!(
            plan_reply(&v6, &mk_conf(), &mk_env(true)),
            Err(PlanError::Allocation(AllocationError::MultiCardNotV4(2)))
        );
    }
}
