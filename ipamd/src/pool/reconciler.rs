//! The reconciler (rules in [`crate::pool::reconcile_plan`]): paces its rounds, compares the cheap
//! hint with the datastore, asks EC2 once on a difference and has [`Ipam`] apply the pure plan;
//! then sets up or tears down the host networking of adopted or dropped ENIs, and retries the host
//! set-up of ENIs not host-ready. It reads the pool manager's releases from the pools' release logs
//! (kept in memory by the index, loaded once at start: [`crate::ipam::Index::recorded_releases`]),
//! learns of its additions as values ([`Reconciler::take_over`]), and at start withdraws what the
//! logs say was released before a restart ([`Reconciler::restore`]). It keeps every card's pool
//! (ENI ids are unique across cards; each change goes to the pool of its ENI); the ENIs of cards
//! that serve no pods are left alone. Must not: touch the datastore but through `Ipam`'s intents,
//! hold a lock across `.await`, act while shutting down.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;

use super::host_port::EniHost;
use super::manager::Ec2Changes;
use crate::ipam::Ipam;
use crate::pool::ec2_port::{AttachedEni, EniProvider};
pub use crate::pool::reconcile_plan::FREED_COOLDOWN;
use crate::pool::reconcile_plan::{
    Difference, ImdsView, Plan, RecentChanges, RecentlyAdded, RecentlyFreed, StoreView, difference,
    plan, store_view,
};

/// Idle cadence of reconciliation, and the quiet time required after a pool change.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(60);
/// An absence (an address, a restored entry's address, on none of the node's ENIs) seen by a
/// Describe taken less than this after ipamd's start or after the pool manager asked EC2 for
/// a change is not EC2's word (reconcile rule 6): EC2's and IMDS's views lag behind changes
/// by seconds, sometimes more (no bound is published). It is the settle time the reconciler
/// already grants a pool change before it looks at all ([`RECONCILE_INTERVAL`], rule 5), so
/// only the eager first round after a start (and a round after a failed call that changed
/// nothing in the datastore) is affected: such a round still adds what EC2 lists, but confirms
/// nothing absent, and the next round asks again.
pub const ABSENCE_TRUST_WINDOW: Duration = RECONCILE_INTERVAL;
/// An ENI whose host set-up failed is retried at most this often.
pub const HOST_RETRY_INTERVAL: Duration = Duration::from_secs(10);
/// After EC2 refused an assign the datastore thought had room (a stale view of the ENI), a
/// round runs at once, but at most this often (the refusal repeats on every pass).
pub const REFUSAL_RECHECK: Duration = Duration::from_secs(10);
/// The same IMDS/datastore difference is re-confirmed with EC2 at most this often.
pub const CONFIRM_INTERVAL: Duration = Duration::from_secs(300);

/// What one round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Too soon after the last round or a pool change, or shutting down.
    Skipped,
    /// The hint matched the store: no EC2 call.
    InSync,
    /// A difference already confirmed recently: not asked again yet.
    Unconfirmed(Difference),
    /// EC2 was asked; this plan was applied.
    Applied(Plan),
    /// A call failed.
    Failed(String),
}

/// The reconciler's memory between rounds.
#[derive(Debug, Default)]
pub struct Reconciler {
    last_view: Option<BTreeMap<String, BTreeSet<Ipv4Net>>>,
    changed_at: Option<SystemTime>,
    /// Released by the pool manager: the pools' release logs as read at the start of the round
    /// (kept here because the plan is made under the index's lock, where the logs cannot be
    /// asked for again); never re-added from a view for [`FREED_COOLDOWN`].
    freed: RecentlyFreed,
    /// Added by the pool manager (handed over as values): never removed on a view's absence
    /// for [`crate::pool::reconcile_plan::ADDITION_SETTLE`] (rule 7).
    added: RecentlyAdded,
    /// When the reconciler first saw the datastore ([`Reconciler::restore`]: ipamd's start).
    started: Option<SystemTime>,
    /// When the pool manager last asked EC2 for a change.
    mutated_at: Option<SystemTime>,
    last_round: Option<SystemTime>,
    last_confirm: Option<(SystemTime, Difference)>,
    /// Start with a round right away (after a restart the store may lack a mid-grow ENI).
    pub eager: bool,
    /// When a round last ran because EC2 refused an assign ([`REFUSAL_RECHECK`]).
    refusal_round: Option<SystemTime>,
    /// The next round asks EC2 whatever the hint says (the hint may lag as the store does).
    describe_now: bool,
    /// Last host set-up attempt of each ENI not host-ready, with the host's link generation
    /// then.
    host_attempts: BTreeMap<String, (SystemTime, u64)>,
}

fn within(now: SystemTime, t: Option<SystemTime>, d: Duration) -> bool {
    t.is_some_and(|t| now.duration_since(t).map_or(true, |e| e < d))
}

impl Reconciler {
    /// A reconciler whose first round runs at once.
    pub fn new() -> Self {
        Self {
            eager: true,
            ..Self::default()
        }
    }

    /// At start, before the pool manager's first pass (idempotent; [`Self::tick`] calls it
    /// too): the releases recorded beside the checkpoint before a restart join the freed set,
    /// and what of them the datastore holds again (registered at start from a Describe that
    /// still listed them) is taken out before it can be handed out.
    pub fn restore(&mut self, ipam: &Ipam) {
        if self.started.is_some() {
            return;
        }
        self.started = Some(ipam.now());
        let recorded = ipam.index.recorded_releases();
        if recorded.is_empty() {
            return;
        }
        self.freed = recorded.clone();
        let (cidrs, enis) = recorded.withdrawable(&store_view(&ipam.index.usage()));
        for eni in &enis {
            match ipam.index.take_eni(eni) {
                Ok(_) => tracing::warn!(
                    eni,
                    "eni freed before the restart but still described: withdrawn from the pool"
                ),
                Err(e) => {
                    tracing::warn!(eni, error = %e, "eni freed before the restart is in use: kept")
                }
            }
        }
        let mut by_eni: BTreeMap<&str, Vec<Ipv4Net>> = BTreeMap::new();
        for (eni, cidr) in &cidrs {
            by_eni.entry(eni).or_default().push(*cidr);
        }
        for (eni, cidrs) in by_eni {
            let taken = ipam.index.take_cidrs(eni, &cidrs);
            tracing::warn!(eni, cidrs = ?taken, "addresses released before the restart but still described: withdrawn from the pool");
        }
        if !cidrs.is_empty() || !enis.is_empty() {
            ipam.publish(None);
        }
    }

    /// What the pool manager did since the last pass ([`super::manager::Manager::hand_over`]):
    /// its additions enter the added set (rule 7; adding them ended their release's cooldown
    /// in the log), and its last change asked of EC2 restarts the absence trust window (rule
    /// 6). Its releases are in the release logs, read at every round.
    pub fn take_over(&mut self, handover: Ec2Changes) {
        for a in &handover.additions {
            self.added.record(a);
        }
        if let Some(at) = handover.refused_at
            && !within(at, self.refusal_round, REFUSAL_RECHECK)
        {
            // EC2 says the ENI is full where the datastore sees room: ask EC2 now (with the
            // difference unconfirmed afresh) rather than at the next paced round, also while
            // AddNetwork calls wait: they wait for exactly this.
            self.refusal_round = Some(at);
            self.eager = true;
            self.describe_now = true;
            self.last_confirm = None;
        }
        self.mutated_at = self.mutated_at.max(handover.mutated_at);
    }

    /// Whether an absence seen now may be taken as EC2's word (rule 6).
    fn absence_trusted(&self, now: SystemTime) -> bool {
        !within(now, self.started.max(self.mutated_at), ABSENCE_TRUST_WINDOW)
    }

    /// Notice whether the datastore's ENIs and CIDRs changed since the last look (any change
    /// postpones the next round), and forget releases past their cooldown.
    fn observe(&mut self, store: &StoreView, now: SystemTime) {
        let current: BTreeMap<String, BTreeSet<Ipv4Net>> = store
            .iter()
            .map(|(id, c)| (id.clone(), c.keys().copied().collect()))
            .collect();
        if self.last_view.as_ref().is_some_and(|last| *last != current) {
            self.changed_at = Some(now);
        }
        self.last_view = Some(current);
        self.freed.expire(now);
        self.added.expire(now);
    }

    fn guard(&self) -> RecentChanges {
        RecentChanges::of(&self.freed, &self.added)
    }

    /// Sets up the host networking of every ENI the datastore holds as not host-ready (its
    /// set-up failed at node init, at creation or at adoption) and marks it ready on success,
    /// so its addresses become assignable. Each ENI is retried at most every
    /// [`HOST_RETRY_INTERVAL`], and at once when the host announced a link since its last
    /// attempt (its link may be the new one). Call on every pass of the pool loop.
    pub async fn ensure_host<H: EniHost>(&mut self, ipam: &Ipam, host: &H) {
        let now = ipam.now();
        let links = host.link_generation();
        let not_ready = ipam.index.enis_awaiting_host();
        self.host_attempts.retain(|id, _| not_ready.contains(id));
        let due: Vec<String> = not_ready
            .into_iter()
            .filter(|id| match self.host_attempts.get(id) {
                None => true,
                Some((at, generation)) => {
                    *generation != links || !within(now, Some(*at), HOST_RETRY_INTERVAL)
                }
            })
            .collect();
        if due.is_empty() || ipam.is_shutting_down() {
            return;
        }
        let mut readied = false;
        for id in due {
            self.host_attempts.insert(id.clone(), (now, links));
            // The datastore's description (MAC, primary address, device number).
            let Some(e) = ipam.index.eni_description(&id) else {
                continue;
            };
            match host.setup(&e).await {
                Ok(table) => {
                    ipam.index.set_eni_table(&id, table);
                    if ipam.index.mark_host_ready(&id) {
                        tracing::info!(eni = %id, "host setup of eni done; its addresses are assignable");
                        readied = true;
                    }
                }
                Err(err) => {
                    tracing::warn!(eni = %id, error = %err, "host setup of eni failed again; retrying");
                }
            }
        }
        if readied {
            ipam.publish(None);
        }
    }

    /// One round (call after every pool-manager pass; it paces itself).
    pub async fn tick<P: EniProvider + ImdsView, H: EniHost>(
        &mut self,
        ipam: &Ipam,
        provider: &P,
        host: &H,
    ) -> Outcome {
        let now = ipam.now();
        if ipam.is_shutting_down() {
            return Outcome::Skipped;
        }
        self.restore(ipam);
        self.freed = ipam.index.recorded_releases();
        let served = ipam.index.cards();
        let store = store_view(&ipam.index.usage());
        self.observe(&store, now);
        // While a trunk is awaited every pass looks: the hint is IMDS only, EC2 is asked once the
        // trunk shows up there.
        let eager = std::mem::take(&mut self.eager) || ipam.needs_trunk();
        if !eager
            && (within(now, self.last_round, RECONCILE_INTERVAL)
                || within(now, self.changed_at, RECONCILE_INTERVAL))
        {
            return Outcome::Skipped;
        }
        self.last_round = Some(now);
        let hint = match provider.hinted_enis().await {
            Ok(h) => served_only(h, &served),
            Err(e) => return Outcome::Failed(format!("hint: {e}")),
        };
        let guard = self.guard();
        let store = store_view(&ipam.index.usage());
        let diff = difference(&store, &hint, &guard);
        // Restored entries not on a known ENI trigger a confirmation until EC2 has said once
        // that their address is on none of this node's ENIs (then they are left to their DEL
        // or to reclaim, instead of a Describe every 5 min forever).
        let pending = ipam.index.unconfirmed_pending() > 0;
        let describe_now = std::mem::take(&mut self.describe_now);
        if diff.is_empty() && !pending && !describe_now {
            return Outcome::InSync;
        }
        if !describe_now
            && let Some((t, d)) = &self.last_confirm
            && *d == diff
            && within(now, Some(*t), CONFIRM_INTERVAL)
        {
            return Outcome::Unconfirmed(diff);
        }
        let truth = match provider.list_enis().await {
            Ok(t) => served_only(t, &served),
            Err(e) => return Outcome::Failed(format!("describe: {e}")),
        };
        let trusted = self.absence_trusted(now);
        if trusted || !pending {
            self.last_confirm = Some((now, diff));
        } else {
            // Asked again at the next round, whatever the difference.
            tracing::debug!(
                "describe taken right after start or a change: restored entries not on a known eni are not confirmed absent yet"
            );
        }
        self.apply(ipam, host, &truth, trusted).await
    }

    async fn apply<H: EniHost>(
        &mut self,
        ipam: &Ipam,
        host: &H,
        truth: &[AttachedEni],
        trust_absence: bool,
    ) -> Outcome {
        let now = ipam.now();
        let (plan, after, dropped) = ipam.index.apply_ec2_truth(truth, trust_absence, |store| {
            // Under the lock: the view the plan is made on. (The manager runs in the same
            // task: its releases were handed over before this round.)
            self.observe(store, now);
            plan(store, truth, &self.guard())
        });
        self.last_view = Some(
            after
                .into_iter()
                .map(|(id, c)| (id, c.into_keys().collect()))
                .collect(),
        );
        for e in &plan.add_enis {
            match host.setup(e).await {
                Ok(table) => {
                    ipam.index.set_eni_table(&e.id, table);
                    ipam.index.mark_host_ready(&e.id);
                }
                Err(err) => {
                    tracing::warn!(eni = %e.id, error = %err, "reconcile: host setup of eni failed; its addresses are held back and the setup retried");
                }
            }
        }
        for e in &dropped {
            // EC2 no longer has it (no pod held an address on it): its link is gone, remove
            // its route table and rules now rather than when the device number is reused.
            match host.teardown(e).await {
                Ok(()) => {
                    tracing::info!(eni = %e.id, "eni gone from ec2: dropped, host state removed")
                }
                Err(err) => {
                    tracing::warn!(eni = %e.id, error = %err, "eni gone from ec2: dropped; host teardown failed");
                }
            }
        }
        if !plan.is_empty() {
            ipam.publish(None);
            tracing::info!(?plan, "reconciled with ec2");
        }
        Outcome::Applied(plan)
    }
}

/// The ENIs of the cards whose pools this reconciler keeps (card 0, and the serving cards of
/// `ENABLE_MULTI_NIC`); the other cards' ENIs are unmanaged.
fn served_only(enis: Vec<AttachedEni>, served: &[u32]) -> Vec<AttachedEni> {
    enis.into_iter()
        .filter(|e| served.contains(&e.network_card))
        .collect()
}
