//! Test builders shared by the planners' tests: a CNI environment, a netconf, ipamd replies,
//! and ADD planned from a reply as `command::add` plans it. Must not: be compiled outside
//! tests.

use std::collections::HashMap;

use ipamd_proto::rpc::{AddNetworkReply, IpAllocationMetadata};

use super::{PlanError, PodNetworkPlan, plan_add};
use crate::allocation::Allocation;
use crate::spec::{CniEnv, NetConf};

/// ADD's environment: pod `default/nginx` (`k8s`), or container `c1` without a pod identity.
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

/// The default netconf, MTU 9001.
pub(crate) fn mk_conf() -> NetConf {
    NetConf::parse(br#"{"cniVersion":"1.0.0","name":"aws-cni","mtu":"9001"}"#).unwrap()
}

/// A reply with one allocation entry.
pub(crate) fn mk_reply(v4: &str, v6: &str, device: i32, table: i32) -> AddNetworkReply {
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

/// A branch-ENI reply: VLAN `vlan`, 198.18.8.10 behind gateway 198.18.8.1, trunk index 3.
pub(crate) fn branch_reply(vlan: i32) -> AddNetworkReply {
    AddNetworkReply {
        success: true,
        ip_allocation_metadata: vec![IpAllocationMetadata {
            i_pv4_addr: "198.18.8.10".into(),
            i_pv6_addr: String::new(),
            device_number: -1,
            route_table_id: 0,
        }],
        pod_vlan_id: vlan,
        pod_enimac: "02:aa:00:00:00:05".into(),
        pod_eni_subnet_gw: "198.18.8.1".into(),
        parent_if_index: 3,
        ..Default::default()
    }
}

/// ADD's plan for `reply`, as `command::add` makes it: decode, then plan.
pub(crate) fn plan_reply(
    reply: &AddNetworkReply,
    conf: &NetConf,
    env: &CniEnv,
) -> Result<PodNetworkPlan, PlanError> {
    let allocation = Allocation::decode(reply).map_err(|e| PlanError::of_reply(e, conf.mtu))?;
    plan_add(&allocation, conf, env)
}
