//! PURE: turns an [`Allocation`], the netconf and the CNI environment into the pod's network
//! plan (names, addresses, routes, rules, sysctls), and the host state into the teardown
//! plans. One planner per kind of pod, as netavark has one driver per network kind: `pod.rs`
//! (a regular pod), `multi_card.rs` (one interface per network card), `branch.rs` (a
//! branch-ENI pod's VLAN); the pieces they share are `interface.rs` (one pod interface: its
//! routes, rules, sysctls), `veth_name.rs` and `result.rs` (the CNI result and its marker
//! interface); DEL's plans are `teardown.rs` and `branch_teardown.rs`. [`crate::apply`]
//! executes the plans. Must not: touch the kernel, the network, the clock or the environment,
//! or read ipamd's wire types ([`crate::allocation`] decodes them).

mod branch;
mod branch_teardown;
mod interface;
mod multi_card;
mod pod;
mod result;
mod teardown;
mod veth_name;

#[cfg(test)]
mod fixtures;

use dataplane::conventions::MIN_MTU_V6;

pub use branch::BranchPlan;
pub use branch_teardown::{BranchProof, BranchTeardown, plan_branch_teardown};
pub use interface::{InterfacePlan, LinkPlan, PodAddress};
pub use pod::first_link;
pub use result::{MarkerSpelling, marker_vlan, vlan_marker_mac, vlan_marker_name};
pub use teardown::{
    HostLink, IpamdRelease, KeptReason, PodEnd, TeardownPlan, TeardownView, plan_teardown,
    prev_extra_interfaces, teardown_veth_names, teardown_veth_names_with,
};
pub use veth_name::{
    MAX_EXTRA_INTERFACES, branch_host_veth, host_veth_at, host_veth_for, veth_name_shared_with,
};

use crate::allocation::{Allocation, AllocationError};
use crate::spec::{CniEnv, NetConf};

/// Why ipamd's answer cannot be wired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The reply is no allocation the plugin can wire.
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    /// The MTU is too small for IPv6.
    #[error("mtu {0} is below the IPv6 minimum {MIN_MTU_V6}")]
    MtuTooSmallForV6(u32),
}

impl PlanError {
    /// The error of a reply that did not decode, with the configured `mtu`: a multi-card reply
    /// with an IPv6 is refused for too small an MTU first, when it is (the order the plugin
    /// has always checked them in).
    #[must_use]
    pub fn of_reply(e: AllocationError, mtu: u32) -> Self {
        match e {
            AllocationError::MultiCardNotV4(_) if mtu < MIN_MTU_V6 => Self::MtuTooSmallForV6(mtu),
            e => Self::Allocation(e),
        }
    }
}

/// Everything ADD programs for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetworkPlan {
    /// The interface `CNI_IFNAME` (every pod has it).
    pub interface: InterfacePlan,
    /// A multi-card pod's interfaces on its other network cards, in ipamd's order: interface
    /// 1, 2, ... (`mNicIf<i>`); empty for every other pod.
    pub other_cards: Vec<InterfacePlan>,
    /// A branch-ENI pod's VLAN link (security groups for pods); its rules are in the
    /// interface's [`InterfacePlan::host_rules`].
    pub branch: Option<BranchPlan>,
    /// How the result's marker interface spells the VLAN id in its `mac`.
    pub marker: MarkerSpelling,
}

impl PodNetworkPlan {
    /// Every interface of the pod: `CNI_IFNAME`'s, then a multi-card pod's others.
    pub fn interfaces(&self) -> impl Iterator<Item = &InterfacePlan> {
        std::iter::once(&self.interface).chain(self.other_cards.iter())
    }
}

/// Plans ADD for what ipamd allocated.
pub fn plan_add(
    allocation: &Allocation,
    conf: &NetConf,
    env: &CniEnv,
) -> Result<PodNetworkPlan, PlanError> {
    match allocation {
        Allocation::Pod { families } => pod::plan(families, conf, env),
        Allocation::MultiCard { first, other_cards } => {
            Ok(multi_card::plan(*first, other_cards, conf, env))
        }
        Allocation::Branch(eni) => branch::plan(eni, conf, env),
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{mk_conf, mk_env, mk_reply, plan_reply};
    use super::*;

    #[test]
    fn refusals() {
        let conf = mk_conf();
        let env = mk_env(true);
        let mut r = mk_reply("198.18.0.1", "", 0, 0);
        r.success = false;
        assert_eq!(
            plan_reply(&r, &conf, &env),
            Err(PlanError::Allocation(AllocationError::NotAssigned))
        );
        let mut r = mk_reply("198.18.0.1", "", 0, 0);
        r.pod_vlan_id = 7;
        assert!(matches!(
            plan_reply(&r, &conf, &env),
            Err(PlanError::Allocation(AllocationError::BadBranchReply {
                vlan: 7,
                ..
            }))
        ));
        assert_eq!(
            plan_reply(&mk_reply("", "", 0, 0), &conf, &env),
            Err(PlanError::Allocation(AllocationError::NoAddress))
        );
        assert!(matches!(
            plan_reply(&mk_reply("300.1.1.1", "", 0, 0), &conf, &env),
            Err(PlanError::Allocation(AllocationError::BadAddress(_)))
        ));
    }

    /// A multi-card reply with an IPv6 under too small an MTU is refused for the MTU, as it
    /// always was (the MTU was checked before the reply's shape).
    #[test]
    fn the_mtu_is_checked_before_the_multi_card_shape() {
        use ipamd_proto::rpc::IpAllocationMetadata;
        let mut reply = mk_reply("198.18.0.10", "2001:db8::1", 0, 254);
        reply.ip_allocation_metadata.push(IpAllocationMetadata {
            i_pv4_addr: "198.19.0.11".into(),
            route_table_id: 10100,
            ..Default::default()
        });
        let mut conf = mk_conf();
        assert_eq!(
            plan_reply(&reply, &conf, &mk_env(true)),
            Err(PlanError::Allocation(AllocationError::MultiCardNotV4(1)))
        );
        conf.mtu = 1200;
        assert_eq!(
            plan_reply(&reply, &conf, &mk_env(true)),
            Err(PlanError::MtuTooSmallForV6(1200))
        );
    }
}
