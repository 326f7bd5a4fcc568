//! The node's addresses: the [`Index`] (every card's pool behind the one lock: snapshots and
//! intents), the [`PoolSignal`] (the AddNetwork ↔ pool loop handshake), the [`NodeState`]
//! (max-pods, cordon, trunk slot, shutdown), and [`Ipam`], the pod flows over them (AddNetwork's
//! bounded wait for the pool, DelNetwork, reclaim). Must not: know gRPC/HTTP types, call EC2 or
//! the host, hold the lock across `.await`, read env or the clock (a [`Clock`] is injected).
//! Start-up and restore live in `restore.rs`.

mod index;
mod multi_nic;
mod node_state;
mod pod;
mod pool;
mod release;
mod restore;
mod signal;
mod v6;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::datastore::{Assignment, DatastoreError, IpamKey, PodMetadata, V6Assignment};
use crate::metrics::Metrics;
use index::Core;
pub use index::{Capacity, EniSnapshot, Index, RecordError, Scope};
use ipam_core::pool::ec2_port::{NodeNetwork, ProviderError};
use ipam_core::pool::policy::{Blocked, Targets};
pub use multi_nic::CardAssignments;
pub use node_state::{EniConfigWarm, NodeState, NodeWarm};
pub use pod::PodAddresses;
pub use pool::pool_checkpoint_path;
pub use release::ReclaimAsks;
pub use restore::{
    HostPodRoutes, HostUnreadable, RestoreOutcome, host_used, host_used_v6, recovered_key,
};
pub use signal::{PoolActionInFlight, PoolEvent, PoolSignal};

/// Source of `now` (injected so tests can move time).
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Current wall-clock time.
    fn now(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Why an IPAM call failed (translated to a gRPC status once, in `rpc`). The shortage variants name
/// why a pod got no address precisely enough to send an operator to the right fix (each has its
/// reason code, `ipamd_proto::add_failure_code`, and a runbook section in docs/operations.md). Each
/// variant carries what happened; what the operator should do is rendered once, at the rpc edge,
/// from its reason's guidance (`rpc::GUIDANCE`, the "what to do" column of docs/operations.md).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// Nothing free, nothing under way to change that, no cause known, after waiting.
    #[error("no free address after waiting {}s and no pool growth under way (is DISABLE_NETWORK_RESOURCE_PROVISIONING set, or the warm targets zero?): see `ipamd status`", .0.as_secs())]
    NoAvailableAddress(Duration),
    /// The pool was growing (an ENI being attached, addresses being assigned) and nothing
    /// arrived before the deadline.
    #[error("waited {}s for {}: nothing arrived before the deadline; kubelet retries (if it lasts, see `ipamd status` and EC2's attach times)", .waited.as_secs(), .what)]
    PoolWarming {
        /// How long the call waited.
        waited: Duration,
        /// What was under way.
        what: &'static str,
    },
    /// The instance's ENI limit: every ENI full, no more attachable (`EniLimit`).
    #[error("instance limit reached: {0}")]
    InstanceLimit(LimitCause),
    /// The node's max-pods reached.
    #[error("max pods reached: the pool holds the node's max-pods ({max_pods}) addresses")]
    MaxPods {
        /// The node's max-pods.
        max_pods: u32,
    },
    /// The node is unschedulable and ENIs are not managed there.
    #[error(
        "the node is unschedulable (taint node.kubernetes.io/unschedulable): no addresses or ENIs are attached while it drains (AWS_MANAGE_ENIS_NON_SCHEDULABLE=false)"
    )]
    NodeUnschedulable,
    /// Every free address is cooling down after its release.
    #[error(
        "{}; {count} free address(es) are cooling down after their release (IP_COOLDOWN_PERIOD={}s): the first is free again in {}s",
        if *.at_instance_limit { "instance limit reached: every ENI is full and no more ENIs can be attached" } else { "max pods reached" },
        .cooldown.as_secs(),
        .first_free_in.as_secs().max(1)
    )]
    CoolingDown {
        /// Free addresses cooling down.
        count: usize,
        /// When the first of them is free again.
        first_free_in: Duration,
        /// `IP_COOLDOWN_PERIOD`.
        cooldown: Duration,
        /// The limit is the instance's (else max-pods).
        at_instance_limit: bool,
    },
    /// The subnet has no free address (EC2 `InsufficientFreeAddressesInSubnet`; `SubnetFull`).
    #[error("subnet exhausted: {0}")]
    SubnetExhausted(SubnetCause),
    /// The subnet has no free aligned /28 (EC2 `InsufficientCidrBlocks`).
    #[error("no free /28 prefix: {0}")]
    NoFreePrefix(PrefixCause),
    /// EC2 kept throttling the pool's calls.
    #[error(
        "EC2 throttled ipamd's calls (RequestLimitExceeded): the pool's last EC2 call was refused after its retries"
    )]
    Ec2Throttled,
    /// EC2 refused a call for a missing IAM permission; names the action.
    #[error("EC2 denied {action} (UnauthorizedOperation)")]
    Ec2Unauthorized {
        /// The EC2 action (`ec2:…`).
        action: String,
    },
    /// EC2 could not be reached or failed otherwise.
    #[error("EC2 unavailable: {}", unavailable_detail(.0))]
    Ec2Unavailable(Box<ProviderError>),
    /// Custom networking placed no ENI.
    #[error("custom networking created no ENI: {0}")]
    CustomNetworkingConfig(ipam_core::pool::ec2_port::Unplaceable),
    /// The key holds nothing.
    #[error("unknown pod {0}")]
    UnknownPod(IpamKey),
    /// The checkpoint write failed; the change was rolled back.
    #[error("checkpoint write failed, change rolled back: {0}")]
    CheckpointFailed(String),
    /// Starting or shutting down.
    #[error("ipamd is not ready: {0}")]
    NotReady(&'static str),
    /// The request asks for something this ipamd does not do or has not enabled.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// A multi-NIC pod's network card (other than 0) has no address for it now: the pod gets
    /// one interface per card or none.
    #[error(
        "multi-NIC pod: network card {card} has no address for it: {why}; the pod gets one interface per network card or none"
    )]
    CardUnavailable {
        /// The card.
        card: u32,
        /// Why (no ENI yet, nothing free).
        why: String,
    },
    /// The request names a pod that is another one now (a same-name pod re-created since
    /// this sandbox was made: its `K8S_POD_UID` differs); the sandbox is stale.
    #[error("stale sandbox: {0}; the pod was re-created, its new sandbox is wired instead")]
    StaleSandbox(String),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

/// What `Ec2Unavailable` names of the provider's failure: the resource, the refusal or the
/// failure itself (the wording of the wire message since before the causes were structured).
fn unavailable_detail(e: &ProviderError) -> String {
    match e {
        ProviderError::NotFound { resource } => resource.clone(),
        ProviderError::InUse(b) => b.to_string(),
        ProviderError::Other(f) => f.to_string(),
        other => other.to_string(),
    }
}

/// Which instance limit a pod met ([`IpamError::InstanceLimit`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitCause {
    /// The pool policy: every ENI is full and no more can be attached.
    #[error("every ENI is full and no more ENIs can be attached")]
    EnisFull,
    /// EC2 refused.
    #[error(transparent)]
    Ec2(ipam_core::pool::ec2_port::InstanceLimit),
}

/// Why a subnet gave no address ([`IpamError::SubnetExhausted`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubnetCause {
    /// EC2's refusal.
    #[error("{0}")]
    Ec2(ipam_core::pool::ec2_port::SubnetShortage),
    /// The policy: every ENI with room is in a subnet backing off, no ENI can be added.
    #[error(
        "the subnet of every ENI with room ran out of addresses and no more ENIs can be attached: asked again after the 120 s back-off"
    )]
    AllDry,
}

/// Why no /28 could be had ([`IpamError::NoFreePrefix`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefixCause {
    /// EC2's refusal.
    #[error(transparent)]
    Ec2(ipam_core::pool::ec2_port::PrefixShortage),
    /// The instance limit met while a fragmented subnet gives /32s in place of /28s.
    #[error(
        "{subnet} has no free aligned /28 (InsufficientCidrBlocks): ipamd fell back to /32 addresses and {limit}"
    )]
    FellBackToAddresses {
        /// The subnet.
        subnet: String,
        /// The limit met.
        limit: LimitCause,
    },
}

impl IpamError {
    /// The pool could not give the pod an address (any capacity or EC2 reason), as opposed to
    /// a refused request or ipamd's own failure.
    #[must_use]
    pub fn is_shortage(&self) -> bool {
        matches!(
            self,
            Self::NoAvailableAddress(_)
                | Self::PoolWarming { .. }
                | Self::InstanceLimit(_)
                | Self::MaxPods { .. }
                | Self::NodeUnschedulable
                | Self::CoolingDown { .. }
                | Self::SubnetExhausted(_)
                | Self::NoFreePrefix(_)
                | Self::Ec2Throttled
                | Self::Ec2Unauthorized { .. }
                | Self::Ec2Unavailable(_)
                | Self::CustomNetworkingConfig(_)
        )
    }

    /// What a failed pool action means for the pods waiting on it (decided once, here): the
    /// hard limits fail them at once (`blocking`), the others are the reason given when their
    /// wait ends with nothing ([`PoolEvent::last_failure`]).
    #[must_use]
    pub fn from_pool_failure(e: &ProviderError) -> (Self, bool) {
        match e {
            ProviderError::InstanceLimit(l) => (Self::InstanceLimit(LimitCause::Ec2(*l)), true),
            ProviderError::SubnetExhausted(s) => {
                (Self::SubnetExhausted(SubnetCause::Ec2(s.clone())), true)
            }
            ProviderError::NoFreePrefix(p) => {
                (Self::NoFreePrefix(PrefixCause::Ec2(p.clone())), true)
            }
            ProviderError::Throttled => (Self::Ec2Throttled, false),
            ProviderError::Unauthorized { action } => (
                Self::Ec2Unauthorized {
                    action: action.clone(),
                },
                false,
            ),
            ProviderError::Misconfigured(u) => (Self::CustomNetworkingConfig(u.clone()), false),
            ProviderError::NotFound { .. } | ProviderError::InUse(_) | ProviderError::Other(_) => {
                (Self::Ec2Unavailable(Box::new(e.clone())), false)
            }
            ProviderError::NotApplied(last) => Self::from_pool_failure(last),
        }
    }
}

/// Static settings of the service.
#[derive(Debug, Clone)]
pub struct IpamSettings {
    /// Pool targets and limits.
    pub targets: Targets,
    /// How long AddNetwork waits for an allocation.
    pub add_wait_timeout: Duration,
    /// Longest an AddNetwork waits while a pool action is in flight ([`BUSY_POOL_WAIT`]
    /// unless `IPAMD_BUSY_POOL_WAIT_SECONDS` shortens it).
    pub busy_pool_wait: Duration,
    /// Host veth prefix (for DelNetwork's recovered-key fallback).
    pub veth_prefix: String,
    /// Network changes allowed at all (`DISABLE_NETWORK_RESOURCE_PROVISIONING` = false).
    pub provisioning: bool,
}

/// A pod's addresses on this node: AddNetwork, DelNetwork and reclaim over the [`Index`],
/// with the pool loop through the [`PoolSignal`], bounded by the [`NodeState`].
#[derive(Debug)]
pub struct Ipam {
    /// Every card's pool behind the one lock: snapshots and intents.
    pub index: Index,
    /// The AddNetwork ↔ pool loop handshake.
    pub signal: PoolSignal,
    /// Run-time node flags (max-pods, cordon, trunk slot, shutdown).
    pub node_state: NodeState,
    /// Settings.
    pub settings: IpamSettings,
    /// Node network facts for replies.
    pub node: NodeNetwork,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// DelNetwork ↔ reclaim: entries only the pod name matched.
    pub reclaim_asks: ReclaimAsks,
}

impl Ipam {
    /// Now, from the injected clock.
    pub fn now(&self) -> SystemTime {
        self.index.now()
    }

    /// From now on no ENI/IP changes and no new waits.
    pub fn begin_shutdown(&self) {
        self.node_state.set_shutting_down();
        self.signal.wake_all();
    }

    /// True once shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.node_state.is_shutting_down()
    }

    /// The pool targets now: the settings with the node's own warm targets over them (its
    /// annotations, when accepted), the live max-pods, when one was set, and one ENI slot fewer
    /// while a trunk is awaited.
    #[must_use]
    pub fn targets(&self) -> ipam_core::pool::policy::Targets {
        let mut t = self
            .node_state
            .warm()
            .in_force
            .apply(&self.settings.targets);
        if let Some(live) = self.node_state.max_pods() {
            t.max_pods = Some(live);
        }
        if self.needs_trunk() {
            t.max_enis = t.max_enis.saturating_sub(1);
        }
        t
    }

    /// Publishes a pool change (or a hard limit) to waiting AddNetwork calls and refreshes the
    /// datastore gauges: what the pool loop does after every change it made.
    pub fn publish(&self, blocked: Option<IpamError>) {
        self.signal.publish(blocked);
        self.index.refresh_gauges();
    }

    /// Publishes a failed pool action that is no hard limit ([`PoolSignal::publish_failure`])
    /// and refreshes the datastore gauges.
    pub fn publish_failure(&self, failure: IpamError) {
        self.signal.publish_failure(failure);
        self.index.refresh_gauges();
    }

    /// True while ipamd waits for a trunk ENI (the reconciler then looks at every pass).
    #[must_use]
    pub fn needs_trunk(&self) -> bool {
        self.node_state.trunk_slot_reserved()
            && self
                .index
                .read(crate::datastore::DataStore::trunk_eni)
                .is_none()
    }

    /// True while addresses are on their way: a pool action (EC2 allocation) runs, an ENI
    /// EC2 attached waits for its host networking (its link has not appeared yet; the pool
    /// loop retries the set-up and then its addresses become assignable), or a dual-stack pod
    /// waits for an ENI's /80. A waiting AddNetwork outlasts its timeout for any, up to
    /// [`BUSY_POOL_WAIT`].
    #[must_use]
    pub fn pool_in_flight(&self) -> bool {
        self.signal.busy() || self.host_setup_pending()
    }

    /// True while an ENI EC2 attached waits for its host networking (addresses held back).
    fn host_setup_pending(&self) -> bool {
        self.index.read(|ds| !ds.enis_awaiting_host().is_empty())
    }

    /// Maps a policy block to the error waiting pods get, in words that send the operator to
    /// the right fix: when free addresses are only cooling down after their release, it says
    /// so and when the first is free again (`CoolingDown`, not "every ENI is full" alone).
    #[must_use]
    pub fn blocked_error(&self, b: Blocked) -> IpamError {
        match b {
            Blocked::NodeUnschedulable => return IpamError::NodeUnschedulable,
            Blocked::SubnetsDry => return IpamError::SubnetExhausted(SubnetCause::AllDry),
            Blocked::MaxPods | Blocked::InstanceLimit => {}
        }
        match (self.cooling_frees_in(), b) {
            (Some((count, first_free_in)), _) => IpamError::CoolingDown {
                count,
                first_free_in,
                cooldown: self.index.core().pools[0].ds.cooldown(),
                at_instance_limit: b == Blocked::InstanceLimit,
            },
            (None, Blocked::MaxPods) => IpamError::MaxPods {
                max_pods: self.targets().max_pods.unwrap_or_default(),
            },
            (None, _) => IpamError::InstanceLimit(LimitCause::EnisFull),
        }
    }

    /// How many free addresses are cooling down now, and when the first of them is free again.
    fn cooling_frees_in(&self) -> Option<(usize, Duration)> {
        let now = self.now();
        let core = self.index.core();
        let cooldown = core.pools[0].ds.cooldown();
        let cooling = core.pools[0].ds.cooling_entries(now);
        let first = cooling
            .iter()
            .map(|(_, at)| (*at + cooldown).duration_since(now).unwrap_or_default())
            .min()?;
        Some((cooling.len(), first))
    }

    /// One attempt at `key`'s addresses under one lock, with one checkpoint write per pool
    /// changed: its IPv4 (the same one on a repeated call); for a dual-stack pod (`dual`), a
    /// /128 of the /80 of that IPv4's ENI; for a multi-NIC pod (`multi_nic`), one address of
    /// every other serving card. All are taken or none: when the ENI's /80 is not known yet,
    /// a new IPv4 is put back and the caller waits for the pool loop to register the prefix
    /// ([`AssignFailure::NeedPrefix`]); when a card has no address, every fresh one is put
    /// back ([`AssignFailure::Card`]).
    fn try_assign(
        &self,
        key: &IpamKey,
        metadata: PodMetadata,
        dual: bool,
        multi_nic: bool,
    ) -> Result<Assigned, AssignFailure> {
        let now = self.now();
        let mut core = self.index.core();
        // A pod without the multi-NIC annotation holds one IPv4, on card 0 or, when card 0 had
        // none for it, on the card that gave it ([`multi_nic::assign_on_another_card`]).
        let single = !multi_nic && !dual;
        let existing = core.pools[0].ds.lookup(key).or_else(|| {
            single
                .then(|| core.pools[1..].iter().find_map(|p| p.ds.lookup(key)))
                .flatten()
        });
        let existing_v6 = if dual {
            core.pools[0].v6.lookup(key)
        } else {
            None
        };
        let existing_cards = multi_nic.then(|| multi_nic::held_on_cards(&core, key));
        if let Some(a) = &existing
            && (!dual || existing_v6.is_some())
            && existing_cards.as_ref().is_none_or(|(_, all)| *all)
        {
            // A retried ADD: the pod is being wired (again) now; reclaim must not count its
            // wiring as missing since the first attempt.
            for pool in &mut core.pools {
                if pool.ds.lookup(key).is_some() {
                    pool.ds.refresh_assigned_at(key, now);
                    if let Err(e) = pool.persist() {
                        tracing::warn!(card = pool.card, error = %e, %key, "checkpoint write of a refreshed assignment failed");
                    }
                }
            }
            return Ok(Assigned {
                v4: a.clone(),
                v6: existing_v6,
                cards: existing_cards.map(|(c, _)| c).unwrap_or_default(),
            });
        }
        // Once shutting down, no new assignment: the next instance (a maxSurge update) is
        // about to take the node over; the pod's retry goes to it.
        if self.is_shutting_down() {
            return Err(AssignFailure::ShuttingDown);
        }
        let a = match existing.clone() {
            Some(a) => a,
            None => match core.pools[0].ds.assign(key, metadata.clone(), now) {
                Ok(a) => a,
                Err(DatastoreError::NoAvailableAddress) if single && core.pools.len() > 1 => {
                    return multi_nic::assign_on_another_card(&mut core, key, &metadata, now)
                        .map_err(AssignFailure::Checkpoint)?
                        .map(|v4| Assigned {
                            v4,
                            v6: None,
                            cards: Vec::new(),
                        })
                        .ok_or(AssignFailure::Datastore(DatastoreError::NoAvailableAddress));
                }
                Err(e) => return Err(AssignFailure::Datastore(e)),
            },
        };
        let undo_v4 = |core: &mut Core| {
            if existing.is_none() {
                core.pools[0].ds.undo_assign(key);
            }
        };
        let before_v6 = dual.then(|| core.pools[0].v6.clone());
        let v6 = if dual {
            if core.pools[0].v6.prefix_of(&a.eni_id).is_none() {
                undo_v4(&mut core);
                return Err(AssignFailure::NeedPrefix(a));
            }
            match core.pools[0]
                .v6
                .assign(key, metadata.clone(), Some(&a.eni_id), now)
            {
                Ok(v6) => Some(v6),
                Err(e) => {
                    undo_v4(&mut core);
                    return Err(AssignFailure::V6(v6::v6_error(e)));
                }
            }
        } else {
            None
        };
        let undo_v6 = |core: &mut Core| {
            if let Some(before) = before_v6.clone() {
                core.pools[0].v6 = before;
            }
        };
        let (cards, fresh) = if multi_nic {
            match multi_nic::assign_cards(&mut core, key, &metadata, now) {
                Ok(c) => c,
                Err(e) => {
                    undo_v4(&mut core);
                    undo_v6(&mut core);
                    return Err(AssignFailure::Card(e));
                }
            }
        } else {
            (Vec::new(), Vec::new())
        };
        if let Err(e) = multi_nic::persist_cards(&mut core, &fresh).and_then(|()| {
            core.persist()
                .map_err(|source| multi_nic::CardWriteError { card: 0, source })
        }) {
            multi_nic::undo_cards(&mut core, key, &fresh);
            undo_v4(&mut core);
            undo_v6(&mut core);
            tracing::error!(error = %e, %key, "checkpoint write failed; assignment rolled back");
            return Err(AssignFailure::Checkpoint(e));
        }
        Ok(Assigned { v4: a, v6, cards })
    }

    /// AddNetwork of an IPv4 pod: the address for `key` (same one on a repeated call). Waits up
    /// to the configured deadline for the pool manager when nothing is free.
    #[cfg(any(test, feature = "fake"))]
    pub async fn add(&self, key: &IpamKey, metadata: PodMetadata) -> Result<Assignment, IpamError> {
        self.add_families(key, metadata, false, false)
            .await
            .map(|a| a.v4)
    }

    /// [`Self::add`] for both families when `dual`: the IPv4 and a /128 of its ENI's /80,
    /// decided together ([`Self::try_assign`]). An ENI whose /80 is not registered yet is
    /// asked of the pool loop (which asks EC2, delegating one if the ENI has none) and waited
    /// for like an address; EC2's refusal fails the call.
    pub(super) async fn add_families(
        &self,
        key: &IpamKey,
        metadata: PodMetadata,
        dual: bool,
        multi_nic: bool,
    ) -> Result<Assigned, IpamError> {
        self.metrics.add_ip_req_count.inc();
        let started = tokio::time::Instant::now();
        let mut deadline = started + self.settings.add_wait_timeout;
        let mut events = self.signal.subscribe();
        // Counted as waiting while this guard lives: a cancelled call (client gone, gRPC
        // deadline, stream reset) drops its future and with it the count.
        let mut registered: Option<signal::WaitingGuard<'_>> = None;
        let mut woken = false;
        // The ENI whose /80 this call asked the pool loop for.
        let mut asked_prefix: Option<String> = None;
        // The last card (other than 0) a multi-NIC pod found without an address: the reason
        // given when the wait ends with nothing.
        let mut short_on_a_card: Option<IpamError> = None;
        let result = loop {
            let mut for_prefix = false;
            match blocking(|| self.try_assign(key, metadata.clone(), dual, multi_nic)) {
                Ok(a) => break Ok(a),
                Err(AssignFailure::Card(e)) => short_on_a_card = Some(e),
                Err(AssignFailure::NeedPrefix(a)) => {
                    if asked_prefix.as_deref() == Some(a.eni_id.as_str()) {
                        if let Some(msg) = self.signal.ipv6_prefix_failure(&a.eni_id) {
                            break Err(IpamError::Internal(msg));
                        }
                    } else {
                        self.signal.want_ipv6_prefix(&a.eni_id);
                        asked_prefix = Some(a.eni_id);
                    }
                    for_prefix = true;
                }
                Err(AssignFailure::V6(e)) => break Err(e),
                Err(AssignFailure::Datastore(DatastoreError::NoAvailableAddress)) => {}
                Err(AssignFailure::Checkpoint(e)) => {
                    break Err(IpamError::CheckpointFailed(e.to_string()));
                }
                Err(AssignFailure::ShuttingDown) => {
                    break Err(IpamError::NotReady("shutting down"));
                }
                Err(AssignFailure::Datastore(DatastoreError::PendingVerification(_))) => {
                    break Err(IpamError::NotReady(
                        "address of this pod is pending verification",
                    ));
                }
                Err(AssignFailure::Datastore(e)) => break Err(IpamError::Internal(e.to_string())),
            }
            if self.is_shutting_down() {
                break Err(IpamError::NotReady("shutting down"));
            }
            if registered.is_none() {
                // Count as waiting, forget reports older than this call, and try once more:
                // an address freed before the count went up is taken by this retry, one freed
                // after it wakes us (`offer_to_waiters` reads the count after the release).
                registered = Some(self.signal.waiting());
                events.borrow_and_update();
                continue;
            }
            // A pool limit does not concern a call that waits only for an ENI's /80.
            let blocked = if woken && !for_prefix {
                events.borrow().blocked.clone()
            } else {
                None
            };
            // Addresses cooling down that are free again before this call's deadline: a
            // limit that ends by itself; wait for them as for a pool action.
            let cooling_in_time = self
                .cooling_frees_in()
                .is_some_and(|(_, first)| tokio::time::Instant::now() + first < deadline);
            if let Some(err) = blocked
                && !self.host_setup_pending()
                && !cooling_in_time
            {
                // A limit, unless an ENI of the node waits for its host set-up: its addresses
                // are on their way (the policy counts them as taken until then), so the
                // limit does not hold for this pod; it keeps waiting as for a pool action.
                break Err(err);
            }
            self.signal.demand();
            if tokio::time::timeout_at(deadline, events.changed())
                .await
                .is_err()
            {
                // The pool manager is still working on an allocation (e.g. its EC2 calls are
                // backing off on RequestLimitExceeded), or a new ENI waits for its host
                // set-up: keep waiting for it, up to BUSY_POOL_WAIT in all, instead of failing
                // the pod while the node is throttled or the ENI's link is on its way.
                let cap = started
                    + self
                        .settings
                        .busy_pool_wait
                        .max(self.settings.add_wait_timeout);
                let mut busy = self.pool_in_flight();
                if !busy && woken {
                    // A failed pool action (e.g. its throttle retries ran out) reported just
                    // now: the manager starts the next one at once on our demand; give it
                    // that moment before concluding nothing is in flight.
                    tokio::time::sleep(POOL_RESTART_GRACE).await;
                    busy = self.pool_in_flight();
                }
                let now = tokio::time::Instant::now();
                if busy && now < cap {
                    deadline = (now + Duration::from_millis(500)).min(cap);
                    continue;
                }
                // the time actually waited (the timeout, or up to BUSY_POOL_WAIT), in seconds
                let waited = Duration::from_secs(now.duration_since(started).as_secs());
                // Why nothing came, as precisely as known: the pool's last failure (EC2
                // throttled, IAM, custom networking), else what was still under way.
                let last_failure = events.borrow().last_failure.clone();
                break Err(match last_failure.or(short_on_a_card) {
                    Some(f) => f,
                    None if busy => IpamError::PoolWarming {
                        waited,
                        what: if self.host_setup_pending() {
                            "an ENI being attached (its link and host set-up)"
                        } else if for_prefix {
                            "the ENI's IPv6 /80 from EC2"
                        } else {
                            "addresses or an ENI being allocated by EC2"
                        },
                    },
                    None => IpamError::NoAvailableAddress(waited),
                });
            }
            woken = true;
        };
        drop(registered);
        self.metrics
            .add_network_duration(result.is_ok(), started.elapsed().as_secs_f64());
        if result.is_ok() {
            self.metrics
                .setup_phase(crate::metrics::SetupPhase::AddressWait, started.elapsed());
        }
        match &result {
            Ok(_) => {
                let available = self.index.refresh_gauges();
                // The adaptive pool refills when an ADD takes it under its warm target, not at
                // the loop's next tick (its window then holds no tick: docs/pool-policy.md).
                if self.signal.refill_wanted(available) {
                    self.signal.demand();
                }
            }
            Err(e) => {
                if e.is_shortage() {
                    self.metrics.no_available_ip_addresses.inc();
                }
                self.metrics.ipamd_error("AddNetwork");
            }
        }
        result
    }

    /// Wakes waiting AddNetwork calls when an address is assignable now (freed by a DEL with no
    /// cooldown, or out of its cooldown), clearing any earlier limit report so they retry
    /// instead of failing. Does nothing when no call waits or nothing is assignable, so a
    /// waiter is never spun through retries that cannot succeed.
    pub fn offer_to_waiters(&self) {
        if self.signal.waiting_pods() == 0 {
            return;
        }
        let assignable = {
            let now = self.now();
            self.index.core().pools[0].ds.stats(now).available() > 0
        };
        if assignable {
            self.signal.publish_assignable();
        }
    }
}

/// Runs a short section that may fsync (the checkpoint write under the datastore lock) without
/// stalling other tasks on a multi-thread runtime; inline on a current-thread runtime (tests).
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Longest an AddNetwork waits while a pool action is in flight, e.g. through a brown-out of
/// the account's EC2 budget: below the plugin's AddNetwork deadline (110 s), itself below
/// kubelet's 2-minute `--runtime-request-timeout` for the sandbox that runs the plugin. The
/// default of `IPAMD_BUSY_POOL_WAIT_SECONDS` (a test's knob: it may only shorten the wait).
pub const BUSY_POOL_WAIT: Duration = Duration::from_secs(100);
/// How long a waiting AddNetwork gives the pool manager to start its next action after the
/// previous one failed, before it concludes nothing is in flight.
const POOL_RESTART_GRACE: Duration = Duration::from_millis(250);

/// What one assignment attempt took for a pod: its IPv4 on card 0, its IPv6 (dual-stack), one
/// address of every other serving card (multi-NIC pods).
#[derive(Debug, Clone)]
pub(super) struct Assigned {
    pub(super) v4: Assignment,
    pub(super) v6: Option<V6Assignment>,
    pub(super) cards: CardAssignments,
}

/// Why one assignment attempt failed.
#[derive(Debug)]
enum AssignFailure {
    /// A card other than 0 has no address for a multi-NIC pod (everything taken put back).
    Card(IpamError),
    Datastore(DatastoreError),
    Checkpoint(multi_nic::CardWriteError),
    /// Shutdown began: no new assignment.
    ShuttingDown,
    /// A dual-stack pod's IPv4 is on an ENI whose /80 is not known yet (the IPv4 was put back).
    NeedPrefix(Assignment),
    /// The IPv6 half could not be taken (the IPv4 was put back).
    V6(IpamError),
}

/// Shared handle.
pub type SharedIpam = Arc<Ipam>;
