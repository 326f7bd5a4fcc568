//! PURE: turns ipamd's reply, the netconf and the CNI environment into the pod's network plan
//! (names, addresses, routes, rules, sysctls) and the teardown plan. Must not: touch the
//! kernel, the network, the clock or the environment.

use std::net::IpAddr;

use dataplane::conventions::{
    FROM_POD_RULE_PRIORITY, MAIN_TABLE, MIN_MTU_V6, POD_GATEWAY_V4, POD_GATEWAY_V6,
    TO_POD_RULE_PRIORITY, host_veth_name, host_veth_name_for_container, route_table_for_device,
};
use dataplane::{Family, MacAddr, Neighbour, Route, Rule, Scope};
use ipamd_proto::rpc::AddNetworkReply;
use ipnet::IpNet;

use crate::spec::{CniEnv, CniResult, Interface, IpConfig, NetConf, RouteEntry};

/// Why ipamd's answer cannot be wired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// `Success` was false.
    #[error("ipamd did not assign an address")]
    NotAssigned,
    /// No allocation, or one without an address.
    #[error("ipamd reply carries no address")]
    NoAddress,
    /// An address that does not parse.
    #[error("ipamd reply has invalid address {0:?}")]
    BadAddress(String),
    /// A branch-ENI (security groups for pods) allocation: needs VLAN links.
    #[error("branch eni (vlan {0}) pods are not supported")]
    BranchEni(i32),
    /// The MTU is too small for IPv6.
    #[error("mtu {0} is below the IPv6 minimum {MIN_MTU_V6}")]
    MtuTooSmallForV6(u32),
}

/// Everything ADD programs for one pod interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetworkPlan {
    /// Host-side veth name.
    pub host_veth: String,
    /// Container-side interface name (`CNI_IFNAME`).
    pub container_ifname: String,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// Pod address (/32 or /128).
    pub address: IpNet,
    /// Link-local gateway the pod routes through.
    pub gateway: IpAddr,
    /// ENI device number the address belongs to.
    pub device_number: u32,
    /// Route table of that ENI (`main` for the primary ENI).
    pub route_table: u32,
    /// Sysctls for the host veth, written in the host netns before it goes up.
    pub host_sysctls: Vec<(String, String)>,
    /// Sysctls written in the pod netns.
    pub pod_sysctls: Vec<(String, String)>,
    /// Rules added in the host netns.
    pub host_rules: Vec<Rule>,
}

impl PodNetworkPlan {
    /// Pod routes: `<gw> dev <if> scope link` and `default via <gw> dev <if>`.
    #[must_use]
    pub fn pod_routes(&self, ifindex: u32) -> [Route; 2] {
        let any = match self.gateway {
            IpAddr::V4(_) => IpNet::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0),
            IpAddr::V6(_) => IpNet::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 0),
        }
        .unwrap_or_default();
        [
            Route {
                dst: IpNet::from(self.gateway),
                gateway: None,
                oif: Some(ifindex),
                table: MAIN_TABLE,
                scope: Scope::Link,
            },
            Route {
                dst: any,
                gateway: Some(self.gateway),
                oif: Some(ifindex),
                table: MAIN_TABLE,
                scope: Scope::Universe,
            },
        ]
    }

    /// The permanent neighbour mapping the gateway to the host veth's MAC, in the pod.
    #[must_use]
    pub fn gateway_neighbour(&self, ifindex: u32, host_mac: MacAddr) -> Neighbour {
        Neighbour {
            ifindex,
            ip: self.gateway,
            mac: Some(host_mac),
            permanent: true,
        }
    }

    /// Host route `<podIP> dev <hostveth> scope link` in main.
    #[must_use]
    pub fn host_route(&self, veth_index: u32) -> Route {
        Route {
            dst: self.address,
            gateway: None,
            oif: Some(veth_index),
            table: MAIN_TABLE,
            scope: Scope::Link,
        }
    }

    /// The CNI result: host veth, container interface, and the VLAN marker interface whose
    /// `sandbox` is the ENI device number, as upstream, and whose `mac` carries the VLAN id
    /// (always 0 here) MAC-shaped (`00:00:00:00:00:00`): upstream writes a bare `"0"`, which
    /// runtimes that parse MACs (podman) reject.
    #[must_use]
    pub fn result(&self, host_mac: MacAddr, container_mac: MacAddr, netns: &str) -> CniResult {
        let any = if self.address.addr().is_ipv4() {
            "0.0.0.0/0"
        } else {
            "::/0"
        };
        CniResult {
            interfaces: vec![
                Interface {
                    name: self.host_veth.clone(),
                    mac: host_mac.to_string(),
                    sandbox: None,
                },
                Interface {
                    name: self.container_ifname.clone(),
                    mac: container_mac.to_string(),
                    sandbox: Some(netns.to_owned()),
                },
                Interface {
                    name: vlan_marker_name(&self.host_veth),
                    mac: MacAddr([0; 6]).to_string(),
                    sandbox: Some(self.device_number.to_string()),
                },
            ],
            ips: vec![IpConfig {
                address: self.address,
                gateway: Some(self.gateway),
                interface: Some(1),
            }],
            routes: vec![RouteEntry {
                dst: any.parse().unwrap_or_default(),
                gw: Some(self.gateway),
            }],
        }
    }
}

/// Name of the marker interface in results (`dummy` + the host veth's hash part).
#[must_use]
pub fn vlan_marker_name(host_veth: &str) -> String {
    let hash = host_veth
        .get(host_veth.len().saturating_sub(11)..)
        .unwrap_or(host_veth);
    format!("dummy{hash}")
}

/// The host veth name for this invocation: from the K8S pod identity when present,
/// otherwise from the container id and interface name.
#[must_use]
pub fn host_veth_for(conf: &NetConf, env: &CniEnv) -> String {
    if env.k8s.has_pod() {
        host_veth_name(&conf.veth_prefix, &env.k8s.pod_namespace, &env.k8s.pod_name)
    } else {
        host_veth_name_for_container(&conf.veth_prefix, &env.container_id, &env.ifname)
    }
}

/// Plans ADD from ipamd's reply.
pub fn plan_add(
    reply: &AddNetworkReply,
    conf: &NetConf,
    env: &CniEnv,
) -> Result<PodNetworkPlan, PlanError> {
    if !reply.success {
        return Err(PlanError::NotAssigned);
    }
    if reply.pod_vlan_id != 0 {
        return Err(PlanError::BranchEni(reply.pod_vlan_id));
    }
    // Multi-NIC replies carry one allocation per card; we wire the first (see docs/plugin.md).
    let alloc = reply
        .ip_allocation_metadata
        .first()
        .ok_or(PlanError::NoAddress)?;
    let (ip, gateway): (IpAddr, IpAddr) = if !alloc.i_pv4_addr.is_empty() {
        let ip = alloc
            .i_pv4_addr
            .parse()
            .map_err(|_| PlanError::BadAddress(alloc.i_pv4_addr.clone()))?;
        (IpAddr::V4(ip), IpAddr::V4(POD_GATEWAY_V4))
    } else if !alloc.i_pv6_addr.is_empty() {
        let ip = alloc
            .i_pv6_addr
            .parse()
            .map_err(|_| PlanError::BadAddress(alloc.i_pv6_addr.clone()))?;
        if conf.mtu < MIN_MTU_V6 {
            return Err(PlanError::MtuTooSmallForV6(conf.mtu));
        }
        (IpAddr::V6(ip), IpAddr::V6(POD_GATEWAY_V6))
    } else {
        return Err(PlanError::NoAddress);
    };
    let device_number = u32::try_from(alloc.device_number).unwrap_or(0);
    // Upstream treats table ids 0 and 1 as "not set" (main); an old ipamd may send only the
    // device number.
    let route_table = match u32::try_from(alloc.route_table_id) {
        Ok(t) if t > 1 => t,
        _ => route_table_for_device(device_number),
    };
    let address = IpNet::from(ip);
    let host_veth = host_veth_for(conf, env);
    let family = Family::of(ip);
    let mut host_rules = vec![Rule {
        dst: Some(address),
        ..Rule::lookup(family, TO_POD_RULE_PRIORITY, MAIN_TABLE)
    }];
    if route_table != MAIN_TABLE {
        // Current upstream adds one `from <podIP>` rule whatever UseExternalSNAT and the VPC
        // CIDRs say (older versions added one per VPC CIDR; teardown removes all of them).
        host_rules.push(Rule {
            src: Some(address),
            ..Rule::lookup(family, FROM_POD_RULE_PRIORITY, route_table)
        });
    }
    let host_sysctls = [
        ("accept_ra", "0"),
        ("accept_redirects", "1"),
        ("forwarding", "0"),
    ]
    .iter()
    .map(|(k, v)| (format!("net/ipv6/conf/{host_veth}/{k}"), (*v).to_owned()))
    .collect();
    let pod_sysctls = if ip.is_ipv6() {
        vec![
            (
                format!("net/ipv6/conf/{}/disable_ipv6", env.ifname),
                "0".to_owned(),
            ),
            ("net/ipv6/conf/lo/disable_ipv6".to_owned(), "0".to_owned()),
        ]
    } else {
        Vec::new()
    };
    Ok(PodNetworkPlan {
        host_veth,
        container_ifname: env.ifname.clone(),
        mtu: conf.mtu,
        address,
        gateway,
        device_number,
        route_table,
        host_sysctls,
        pod_sysctls,
        host_rules,
    })
}

/// What DEL removes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TeardownPlan {
    /// Host veths to delete (computed name plus any named in prevResult).
    pub host_veths: Vec<String>,
    /// Pod addresses whose host rules and routes go.
    pub addresses: Vec<IpNet>,
}

impl TeardownPlan {
    /// Whether `rule` was installed for one of the pod addresses (`to <ip>` at 512, or any
    /// `from <ip>` at 1536, including the per-VPC-CIDR rules of old upstream versions).
    #[must_use]
    pub fn owns_rule(&self, rule: &Rule) -> bool {
        self.addresses.iter().any(|a| {
            (rule.priority == TO_POD_RULE_PRIORITY && rule.dst == Some(*a) && rule.src.is_none())
                || (rule.priority == FROM_POD_RULE_PRIORITY && rule.src == Some(*a))
        })
    }

    /// Whether `route` is the host route to one of the pod addresses.
    #[must_use]
    pub fn owns_route(&self, route: &Route) -> bool {
        route.table == MAIN_TABLE && self.addresses.contains(&route.dst)
    }
}

/// The pod addresses the host routes to through the pod's host veths (`<ip>/32 dev <veth>` in
/// the main table): what DEL still knows of the pod when neither ipamd nor prevResult answered.
#[must_use]
pub fn addresses_routed_to(routes: &[Route], veth_indexes: &[u32]) -> Vec<IpNet> {
    routes
        .iter()
        .filter(|r| {
            r.table == MAIN_TABLE
                && r.dst.prefix_len() == r.dst.max_prefix_len()
                && r.oif.is_some_and(|i| veth_indexes.contains(&i))
        })
        .map(|r| r.dst)
        .collect()
}

/// Plans DEL: addresses from ipamd's answer when it gave one, else from prevResult (else, when
/// applied, from the host routes through the pod's veth: [`addresses_routed_to`]).
#[must_use]
pub fn plan_teardown(conf: &NetConf, env: &CniEnv, ipamd_addresses: &[IpAddr]) -> TeardownPlan {
    let mut plan = TeardownPlan {
        host_veths: vec![host_veth_for(conf, env)],
        addresses: ipamd_addresses.iter().copied().map(IpNet::from).collect(),
    };
    if let Some(prev) = &conf.prev_result {
        if let Some(host) = prev.interfaces.first()
            && host.sandbox.is_none()
            && !host.name.is_empty()
            && !plan.host_veths.contains(&host.name)
        {
            plan.host_veths.push(host.name.clone());
        }
        if plan.addresses.is_empty() {
            plan.addresses = prev
                .ips
                .iter()
                .map(|ip| IpNet::from(ip.address.addr()))
                .collect();
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::netconf::NetConf;
    use ipamd_proto::rpc::IpAllocationMetadata;
    use std::collections::HashMap;

    pub(crate) fn mk_env(k8s: bool) -> CniEnv {
        let mut v: HashMap<String, String> = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/var/run/netns/p"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        if k8s {
            v.insert(
                "CNI_ARGS".into(),
                "K8S_POD_NAME=nginx;K8S_POD_NAMESPACE=default".into(),
            );
        }
        CniEnv::from_vars(&v).unwrap()
    }

    fn mk_conf() -> NetConf {
        NetConf::parse(br#"{"cniVersion":"1.0.0","name":"aws-cni","mtu":"9001"}"#).unwrap()
    }

    fn mk_reply(v4: &str, v6: &str, device: i32, table: i32) -> AddNetworkReply {
        AddNetworkReply {
            success: true,
            ip_allocation_metadata: vec![IpAllocationMetadata {
                i_pv4_addr: v4.into(),
                i_pv6_addr: v6.into(),
                device_number: device,
                route_table_id: table,
            }],
            vp_cv4_cid_rs: vec!["198.18.0.0/16".into()],
            ..Default::default()
        }
    }

    #[test]
    fn primary_eni_pod_gets_only_the_to_rule() {
        let plan = plan_add(
            &mk_reply("198.18.0.10", "", 0, 254),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
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
        let plan = plan_add(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        assert_eq!(plan.route_table, 2);
        let from = &plan.host_rules[1];
        assert_eq!(from.priority, FROM_POD_RULE_PRIORITY);
        assert_eq!(from.src, Some(plan.address));
        assert_eq!(from.dst, None);
        assert_eq!(from.table, 2);
        // Table id absent: derived from the device number.
        let plan = plan_add(
            &mk_reply("198.18.1.10", "", 2, 0),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        assert_eq!(plan.route_table, 3);
    }

    #[test]
    fn ipv6_pod() {
        let plan = plan_add(
            &mk_reply("", "2001:db8::5", 0, 0),
            &mk_conf(),
            &mk_env(false),
        )
        .unwrap();
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

    #[test]
    fn refusals() {
        let conf = mk_conf();
        let env = mk_env(true);
        let mut r = mk_reply("198.18.0.1", "", 0, 0);
        r.success = false;
        assert_eq!(plan_add(&r, &conf, &env), Err(PlanError::NotAssigned));
        let mut r = mk_reply("198.18.0.1", "", 0, 0);
        r.pod_vlan_id = 7;
        assert_eq!(plan_add(&r, &conf, &env), Err(PlanError::BranchEni(7)));
        assert_eq!(
            plan_add(&mk_reply("", "", 0, 0), &conf, &env),
            Err(PlanError::NoAddress)
        );
        assert!(matches!(
            plan_add(&mk_reply("300.1.1.1", "", 0, 0), &conf, &env),
            Err(PlanError::BadAddress(_))
        ));
    }

    #[test]
    fn result_has_marker_interface() {
        let plan = plan_add(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        let r = plan.result(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            "/ns",
        );
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.interfaces[2].name, "dummyc440f455693");
        assert_eq!(r.interfaces[2].mac, "00:00:00:00:00:00");
        assert_eq!(r.interfaces[2].sandbox.as_deref(), Some("1"));
        assert_eq!(r.ips[0].interface, Some(1));
    }

    #[test]
    fn addresses_routed_to_the_pods_veth_only() {
        let route = |dst: &str, oif: u32, table: u32| Route {
            dst: dst.parse().unwrap(),
            gateway: None,
            oif: Some(oif),
            table,
            scope: Scope::Link,
        };
        let routes = [
            route("198.18.0.7/32", 7, MAIN_TABLE),
            route("198.18.0.8/32", 8, MAIN_TABLE),
            route("198.18.0.0/24", 7, MAIN_TABLE),
            route("198.18.0.9/32", 7, 2),
        ];
        assert_eq!(
            addresses_routed_to(&routes, &[7]),
            vec!["198.18.0.7/32".parse::<IpNet>().unwrap()]
        );
        assert!(addresses_routed_to(&routes, &[]).is_empty());
    }

    #[test]
    fn teardown_uses_prev_result_when_ipamd_silent() {
        let conf = NetConf::parse(
            br#"{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"1.0.0",
            "interfaces":[{"name":"enizzz","mac":"02:00:00:00:00:01"},{"name":"eth0","sandbox":"/x"}],
            "ips":[{"address":"198.18.1.10/32","interface":1}]}}"#,
        )
        .unwrap();
        let env = mk_env(true);
        let plan = plan_teardown(&conf, &env, &[]);
        assert_eq!(
            plan.host_veths,
            vec!["enic440f455693".to_owned(), "enizzz".to_owned()]
        );
        let addr: IpNet = "198.18.1.10/32".parse().unwrap();
        assert_eq!(plan.addresses, vec![addr]);
        assert!(plan.owns_rule(&Rule {
            src: Some(addr),
            dst: Some("198.18.0.0/16".parse().unwrap()),
            ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, 2)
        }));
        assert!(plan.owns_rule(&Rule {
            dst: Some(addr),
            ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
        }));
        assert!(!plan.owns_rule(&Rule {
            dst: Some("198.18.1.11/32".parse().unwrap()),
            ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
        }));
        // ipamd's answer wins over prevResult.
        let plan = plan_teardown(&conf, &env, &["198.18.0.7".parse().unwrap()]);
        assert_eq!(
            plan.addresses,
            vec!["198.18.0.7/32".parse::<IpNet>().unwrap()]
        );
    }
}
