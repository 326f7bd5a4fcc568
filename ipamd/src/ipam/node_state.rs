//! Node state learnt at run time that bounds the pool: max-pods (the Node's capacity), the
//! cordon (`node.kubernetes.io/unschedulable`), the trunk ENI's reserved slot, the node's own
//! warm targets (its and its ENIConfig's annotations, or why they were refused), shutdown. Set by
//! the Kubernetes and shutdown paths, read by the pool and AddNetwork. Must not: touch the
//! pools, wait, decide.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use ipam_core::pool::warm_override::WarmOverrides;

/// Flags set from outside the pool (see the module header).
#[derive(Debug, Default)]
pub struct NodeState {
    shutting_down: AtomicBool,
    /// max-pods learnt at run time (the Node's capacity, or its fallbacks); 0 = none, the settings'
    /// value applies.
    live_max_pods: AtomicU32,
    /// [`Self::reserve_trunk_slot`].
    trunk_slot: AtomicBool,
    /// The Node carries the `node.kubernetes.io/unschedulable:NoSchedule` taint and ENIs are not
    /// managed on such a node (`AWS_MANAGE_ENIS_NON_SCHEDULABLE=false`, the default).
    node_unschedulable: AtomicBool,
    /// The node's warm targets ([`Self::set_warm`]).
    warm: Mutex<NodeWarm>,
    /// [`Self::set_subnet_free`] + 1; 0 (the default): not known.
    subnet_free: AtomicU32,
}

/// The node's own warm targets as the Kubernetes layer last read them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeWarm {
    /// In force over the environment's targets (empty: the environment's).
    pub in_force: WarmOverrides,
    /// The node's annotations giving them (key → value), for status.
    pub annotations: Vec<(String, String)>,
    /// Why the node's values were refused (the environment's targets are then in force).
    pub refused: Option<String>,
    /// The node's ENIConfig's warm-target annotations (custom networking), the level under
    /// the node's; None when the node has no ENIConfig or it carries none.
    pub eni_config: Option<EniConfigWarm>,
}

/// The warm-target annotations of the node's ENIConfig as last read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EniConfigWarm {
    /// The ENIConfig's name.
    pub name: String,
    /// Its annotations giving them (key → value).
    pub annotations: Vec<(String, String)>,
    /// Why its values were refused (then they count for nothing; the node's and the
    /// environment's are in force).
    pub refused: Option<String>,
}

impl NodeState {
    /// From now on no ENI/IP changes and no new waits (see `Ipam::begin_shutdown`).
    pub(super) fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// True once shutdown began.
    #[must_use]
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Sets the max-pods the pool stops growing at (Kubernetes layer; `IPAMD_MAX_PODS`, when
    /// set, was already applied by the caller).
    pub fn set_max_pods(&self, max_pods: u32) {
        self.live_max_pods.store(max_pods, Ordering::Relaxed);
    }

    /// The max-pods learnt at run time, if any.
    #[must_use]
    pub fn max_pods(&self) -> Option<u32> {
        Some(self.live_max_pods.load(Ordering::Relaxed)).filter(|m| *m > 0)
    }

    /// Records whether the node is unschedulable with ENIs unmanaged there (Kubernetes layer:
    /// the Node's taint, when `AWS_MANAGE_ENIS_NON_SCHEDULABLE` is false).
    pub fn set_node_unschedulable(&self, yes: bool) {
        self.node_unschedulable.store(yes, Ordering::Relaxed);
    }

    /// True while the pool may attach no address or ENI and free no ENI (cordoned node,
    /// `AWS_MANAGE_ENIS_NON_SCHEDULABLE` false).
    #[must_use]
    pub fn node_unschedulable(&self) -> bool {
        self.node_unschedulable.load(Ordering::Relaxed)
    }

    /// Security groups for pods on a trunking-capable instance: the pool keeps one ENI slot free
    /// for the trunk until the VPC Resource Controller attached it.
    pub fn reserve_trunk_slot(&self, yes: bool) {
        self.trunk_slot.store(yes, Ordering::Relaxed);
    }

    /// True when a slot is kept for the trunk ENI.
    #[must_use]
    pub fn trunk_slot_reserved(&self) -> bool {
        self.trunk_slot.load(Ordering::Relaxed)
    }

    /// Records the node's warm targets (Kubernetes layer; the pool picks them up on its next
    /// pass).
    pub fn set_warm(&self, warm: NodeWarm) {
        *self
            .warm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = warm;
    }

    /// What the subnets of card 0's ENIs can still give as the address capacity last knew it
    /// (`SubnetRoom::known_free`: ipamd's listing, cni-metrics-helper's recount, a refusal);
    /// None: not known. Set by the address-capacity task every second.
    pub fn set_subnet_free(&self, free: Option<u32>) {
        self.subnet_free
            .store(free.map_or(0, |f| f.saturating_add(1)), Ordering::Relaxed);
    }

    /// [`Self::set_subnet_free`]'s last value (None before the first, or not known).
    #[must_use]
    pub fn subnet_free(&self) -> Option<u32> {
        self.subnet_free.load(Ordering::Relaxed).checked_sub(1)
    }

    /// The node's warm targets now.
    #[must_use]
    pub fn warm(&self) -> NodeWarm {
        self.warm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subnets_room_is_not_known_until_set_and_a_zero_is_kept() {
        let s = NodeState::default();
        assert_eq!(
            s.subnet_free(),
            None,
            "not known before the capacity task's first pass"
        );
        s.set_subnet_free(Some(0));
        assert_eq!(s.subnet_free(), Some(0));
        s.set_subnet_free(Some(u32::MAX));
        assert_eq!(s.subnet_free(), Some(u32::MAX - 1));
        s.set_subnet_free(None);
        assert_eq!(s.subnet_free(), None);
    }
}
