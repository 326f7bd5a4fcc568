//! The index: every network card's pool (datastore, IPv6 index, checkpoint, release log)
//! behind the node's one lock, read through snapshots and changed through intents (the results
//! of pool decisions, host set-up and EC2's description), both families inside. Must not: wait,
//! call EC2 or the host, decide, hold the lock across `.await`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use super::Clock;
use super::pool::Pool;
use super::restore::register_eni;
use crate::datastore::checkpoint::CheckpointError;
use crate::datastore::{
    CheckpointEntry, DataStore, DatastoreError, EniView, PoolStats, Usage, V6Prefix,
};
use crate::metrics::{Metrics, Reconciled};
use ipam_core::pool::ec2_port::AttachedEni;
use ipam_core::pool::reconcile_plan::{
    Plan, RecentlyFreed, Release, StoreView, cloud_view, store_view,
};

/// What ipamd can do now, for the readiness phases and the start-up taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// An ENI with addresses is ready for pods.
    pub has_addresses: bool,
    /// An ADD could be answered now (a free address; in IPv6 mode the /80).
    pub can_assign: bool,
}

/// The node's pools behind one lock (see the module header).
#[derive(Debug)]
pub struct Index {
    core: Mutex<Core>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
}

/// Which assignments [`Index::allocations`] lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every card's IPv4 assignments, card 0's first.
    V4,
    /// One card's IPv4 assignments.
    V4OfCard(u32),
    /// The pods' IPv6 assignments.
    V6,
}

/// Why a release was not recorded (and so must not be asked of EC2).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// No pool serves the card.
    #[error("network card {0} has no pool")]
    UnknownCard(u32),
    /// The side file was not written durably.
    #[error("release not recorded beside the checkpoint: {0}")]
    Write(#[from] crate::datastore::checkpoint::CheckpointError),
}

impl Index {
    /// The index over `core`'s pools.
    pub(super) fn new(core: Core, clock: Arc<dyn Clock>, metrics: Arc<Metrics>) -> Self {
        Self {
            core: Mutex::new(core),
            clock,
            metrics,
        }
    }

    /// Locks the pools. Never hold the guard across `.await`.
    pub(super) fn core(&self) -> MutexGuard<'_, Core> {
        self.core
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Now, from the injected clock.
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    // ---- read-only snapshots -------------------------------------------------------------

    /// Runs `f` on the datastore, read-only, under the lock (never across `.await`: `f` is
    /// synchronous). For snapshots the named methods below do not cover.
    pub fn read<R>(&self, f: impl FnOnce(&DataStore) -> R) -> R {
        f(&self.core().pools[0].ds)
    }

    /// Runs `f` on `card`'s datastore, read-only, under the lock (None: no such pool).
    pub fn read_card<R>(&self, card: u32, f: impl FnOnce(&DataStore) -> R) -> Option<R> {
        self.core().pool(card).map(|p| f(&p.ds))
    }

    /// `card`'s pool statistics now (what the policy decides on), with the IPv6 /128s pods
    /// hold per ENI (`ipv6_assigned`, `ipv6_unplaced`: no ENI a pod's IPv6 lives on is freed).
    /// None: no pool serves the card.
    #[must_use]
    pub fn pool_stats(&self, card: u32) -> Option<PoolStats> {
        let now = self.now();
        let core = self.core();
        let pool = core.pool(card)?;
        let mut stats = pool.ds.stats(now);
        pool.count_ipv6_pins(&mut stats);
        Some(stats)
    }

    /// What ipamd could do for an ADD now (`readiness`): an ENI with addresses ready for pods,
    /// and a free address to hand out (IPv6 mode: the /80 registered).
    #[must_use]
    pub fn capacity(&self) -> Capacity {
        let now = self.now();
        let core = self.core();
        let stats = core.pools[0].ds.stats(now);
        let v6 = !core.pools[0].v6.prefixes().is_empty();
        Capacity {
            has_addresses: stats.total > 0 || v6,
            can_assign: stats.available() > 0 || (stats.total == 0 && v6),
        }
    }

    /// Every ENI as introspection shows it, with the pool totals.
    #[must_use]
    pub fn eni_snapshot(&self) -> EniSnapshot {
        let now = self.now();
        let core = self.core();
        // Every card's ENIs (`/v1/enis` lists every card's pool).
        let enis = core.pools.iter().flat_map(|p| p.ds.eni_views()).collect();
        let main = &core.pools[0];
        EniSnapshot {
            enis,
            stats: main.ds.stats(now),
            ipv6_prefixes: main.v6.prefixes().to_vec(),
            ipv6: main.v6.assignments(),
        }
    }

    /// The assignments of `scope` (incl. pending), as checkpoint entries, each pool's sorted
    /// by key (a multi-NIC pod's key appears once per card with [`Scope::V4`]).
    #[must_use]
    pub fn allocations(&self, scope: Scope) -> Vec<CheckpointEntry> {
        let core = self.core();
        match scope {
            Scope::V4 => core
                .pools
                .iter()
                .flat_map(|p| p.ds.checkpoint_data().allocations)
                .collect(),
            Scope::V4OfCard(card) => core
                .pool(card)
                .map(|p| p.ds.checkpoint_data().allocations)
                .unwrap_or_default(),
            Scope::V6 => core.pools[0].v6.checkpoint_entries(),
        }
    }

    /// The cards with a pool, card 0 first, then the serving cards of `ENABLE_MULTI_NIC`.
    #[must_use]
    pub fn cards(&self) -> Vec<u32> {
        self.core().pools.iter().map(|p| p.card).collect()
    }

    /// Runs `f` on the IPv6 index (the /80s, the pods' /128s), read-only, under the lock.
    pub fn read_v6<R>(&self, f: impl FnOnce(&crate::datastore::V6Store) -> R) -> R {
        f(&self.core().pools[0].v6)
    }

    /// Registers an ENI's /80 (IPv6 mode: the primary ENI's, at node init; dual-stack: by
    /// `Ipam::register_ipv6_prefix`).
    pub(super) fn add_ipv6_prefix(&self, prefix: V6Prefix) {
        self.core().pools[0].v6.add_prefix(prefix);
        self.refresh_gauges();
    }

    /// Updates the datastore gauges (card 0's pool and the IPv6 /80s); returns card 0's
    /// available addresses as the gauges saw them (for the adaptive pool's low-water mark).
    pub fn refresh_gauges(&self) -> u32 {
        let now = self.now();
        // Under the lock: two refreshes never publish out of order.
        let core = self.core();
        let main = &core.pools[0];
        let v6: Vec<(String, ipnet::Ipv6Net, u32)> = main
            .v6
            .prefixes()
            .iter()
            .map(|p| {
                let n = u32::try_from(main.v6.assigned_in(&p.net)).unwrap_or(u32::MAX);
                (p.eni_id.clone(), p.net, n)
            })
            .collect();
        let stats = main.ds.stats(now);
        self.metrics
            .observe_datastores(&stats, &main.ds.usage(), &v6);
        stats.available()
    }

    /// Restored entries, on every card, not yet confirmed absent by EC2 (see
    /// [`DataStore::unconfirmed_pending`]).
    #[must_use]
    pub fn unconfirmed_pending(&self) -> usize {
        self.core()
            .pools
            .iter()
            .map(|p| p.ds.unconfirmed_pending())
            .sum()
    }

    /// Ids of the ENIs, on every card, whose host networking is not set up yet.
    #[must_use]
    pub fn enis_awaiting_host(&self) -> Vec<String> {
        self.core()
            .pools
            .iter()
            .flat_map(|p| p.ds.enis_awaiting_host())
            .collect()
    }

    /// Per ENI (of every card: ENI ids are unique) and CIDR, the addresses pods hold.
    #[must_use]
    pub fn usage(&self) -> Usage {
        let core = self.core();
        let mut usage = Usage::new();
        for p in &core.pools {
            usage.extend(p.ds.usage());
        }
        usage
    }

    /// A copy of the datastore (unit tests of this crate).
    #[cfg(test)]
    pub(crate) fn store(&self) -> DataStore {
        self.read(Clone::clone)
    }

    // ---- intents: results of pool decisions and host set-up ------------------------------

    /// Adds the CIDRs EC2 just assigned to `eni_id` (a `/32` is a secondary address, anything
    /// wider a delegated prefix); returns those refused, with the reason.
    pub fn add_assigned(
        &self,
        eni_id: &str,
        cidrs: &[ipnet::Ipv4Net],
    ) -> Vec<(ipnet::Ipv4Net, DatastoreError)> {
        let now = self.now();
        let mut core = self.core();
        let Some(pool) = core.pool_of_eni(eni_id) else {
            return cidrs
                .iter()
                .map(|c| (*c, DatastoreError::UnknownEni(eni_id.to_owned())))
                .collect();
        };
        let failed = cidrs
            .iter()
            .filter_map(|c| {
                pool.ds
                    .add_cidr(eni_id, *c, c.prefix_len() < 32)
                    .err()
                    .map(|e| (*c, e))
            })
            .collect();
        // EC2 gave them to this node again: a release of theirs in the log no longer speaks
        // for them (reconcile rule 7), or a restart would withdraw them.
        pool.supersede(cidrs, now);
        core.settle_pending();
        failed
    }

    /// Registers an ENI EC2 just attached (or that the reconciler adopts), with its
    /// addresses; they are handed out only once `host_ready`.
    /// The ENI goes to the pool of its network card (refused when no pool serves the card).
    pub fn adopt_eni(&self, eni: &AttachedEni, host_ready: bool) -> Result<(), DatastoreError> {
        let now = self.now();
        let mut core = self.core();
        let pool = core.pool_mut(eni.network_card).ok_or_else(|| {
            DatastoreError::UnknownEni(format!(
                "{} (network card {} serves no pods)",
                eni.id, eni.network_card
            ))
        })?;
        register_eni(&mut pool.ds, eni, host_ready, now)?;
        let cidrs: Vec<ipnet::Ipv4Net> = eni
            .secondary_ips
            .iter()
            .map(|ip| ipnet::Ipv4Net::from(*ip))
            .chain(eni.prefixes.iter().copied())
            .collect();
        pool.supersede(&cidrs, now);
        core.settle_pending();
        Ok(())
    }

    /// Takes `cidrs` of `eni_id` out of the pool before they are released in EC2 (so no pod
    /// can be given one); returns those taken (a CIDR holding a pod is not).
    pub fn take_cidrs(&self, eni_id: &str, cidrs: &[ipnet::Ipv4Net]) -> Vec<ipnet::Ipv4Net> {
        let mut core = self.core();
        let Some(pool) = core.pool_of_eni(eni_id) else {
            return Vec::new();
        };
        cidrs
            .iter()
            .filter(|c| pool.ds.remove_cidr(eni_id, **c).is_ok())
            .copied()
            .collect()
    }

    /// Takes an ENI out of the pool before it is freed in EC2; refused while pods hold
    /// addresses on it, IPv4 or IPv6 (a /128 of its /80, or one on no known ENI). Returns the
    /// CIDRs it had.
    pub fn take_eni(&self, eni_id: &str) -> Result<Vec<ipnet::Ipv4Net>, DatastoreError> {
        let mut core = self.core();
        let pool = core
            .pool_of_eni(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        if pool.ipv6_pins(eni_id) {
            return Err(DatastoreError::InUse(format!("{eni_id} (IPv6)")));
        }
        pool.ds
            .remove_eni(eni_id)
            .map(|e| e.cidrs.keys().copied().collect())
    }

    /// Records `release` (of `card`'s pool) in the pool's release log, written durably beside the
    /// checkpoint, before EC2 is asked to apply it: a Describe or IMDS view that still lists it
    /// after a restart does not put it back (rule 4 of [`ipam_core::pool::reconcile_plan`]). An
    /// error means the release must not be asked of EC2.
    pub fn record_release(&self, card: u32, release: &Release) -> Result<(), RecordError> {
        let now = self.now();
        let mut core = self.core();
        let pool = core.pool_mut(card).ok_or(RecordError::UnknownCard(card))?;
        pool.record_release(release, now)?;
        Ok(())
    }

    /// Every pool's release log, still in its reconcile cooldown (releases by this instance
    /// or the one before a restart). From memory: loaded once at start.
    #[must_use]
    pub fn recorded_releases(&self) -> RecentlyFreed {
        let now = self.now();
        let core = self.core();
        let mut freed = RecentlyFreed::default();
        for p in &core.pools {
            freed.merge(&p.released);
        }
        freed.expire(now);
        freed
    }

    /// Holds back the addresses of ENIs whose host networking failed at node init (before
    /// the socket serves): none is handed out until the pool loop's retry succeeds.
    pub fn hold_back_host(&self, eni_ids: &[String]) {
        let mut core = self.core();
        for id in eni_ids {
            let r = match core.pool_of_eni(id) {
                Some(p) => p.ds.set_host_ready(id, false),
                None => Err(DatastoreError::UnknownEni(id.clone())),
            };
            if let Err(e) = r {
                tracing::warn!(eni = %id, error = %e, "eni without host networking is unknown");
            }
        }
    }

    /// The datastore's description of `eni_id` (what its host set-up and teardown need), if
    /// the node holds it.
    #[must_use]
    pub fn eni_description(&self, eni_id: &str) -> Option<AttachedEni> {
        self.core()
            .pools
            .iter()
            .find_map(|p| p.ds.enis().get(eni_id).map(|e| AttachedEni::from(&e.spec)))
    }

    /// Records what the ENI's host set-up found (`EniHost::setup`): `Some(table)`, the node's
    /// OS routes the ENI by `table`, which its assignments then answer; `None` keeps ipamd's
    /// own. Before the ENI's addresses are handed out (its set-up precedes host readiness).
    pub fn set_eni_table(&self, eni_id: &str, os_table: Option<u32>) {
        let Some(table) = os_table else { return };
        if let Some(p) = self.core().pool_of_eni(eni_id)
            && let Err(e) = p.ds.set_route_table(eni_id, table)
        {
            tracing::warn!(eni = eni_id, error = %e, "route table of the eni not recorded");
        }
    }

    /// Marks an ENI's host networking as set up: its addresses become assignable. False when
    /// the ENI is unknown.
    pub fn mark_host_ready(&self, eni_id: &str) -> bool {
        self.core()
            .pool_of_eni(eni_id)
            .is_some_and(|p| p.ds.set_host_ready(eni_id, true).is_ok())
    }

    /// Applies EC2's description of the node's ENIs (`truth`): `decide` sees the datastore's view
    /// (under the lock, so nothing changes between the view and the plan) and returns the plan,
    /// which is applied here (rule 3 of [`ipam_core::pool::reconcile_plan`]: what EC2 no longer
    /// lists but pods hold is quarantined, never released) and checkpointed. Restored entries whose
    /// address `truth` lists on no ENI are confirmed absent only when `trust_absence` (rule 6: not
    /// for a Describe taken right after start or a change). Returns the plan, the datastore's view
    /// after it, and the descriptions of the ENIs it dropped (for their host teardown: the
    /// datastore held the node's only description of them).
    pub fn apply_ec2_truth(
        &self,
        truth: &[AttachedEni],
        trust_absence: bool,
        decide: impl FnOnce(&StoreView) -> Plan,
    ) -> (Plan, StoreView, Vec<AttachedEni>) {
        let now = self.now();
        let mut core = self.core();
        let mut usage = Usage::new();
        for p in &core.pools {
            usage.extend(p.ds.usage());
        }
        let plan = decide(&store_view(&usage));
        // Each change goes to the pool of its ENI (ENI ids are unique across cards; a new ENI
        // to the pool of its network card); the pools changed are checkpointed.
        let mut changed = std::collections::BTreeSet::new();
        // awscni_reconcile_count{fn} per change applied, awscni_ipamd_error_count{fn} per change
        // refused.
        let m = &self.metrics;
        for e in &plan.add_enis {
            // Not host-ready until the host setup (or a later retry) succeeds.
            let r = match core.pool_mut(e.network_card) {
                Some(pool) => register_eni(&mut pool.ds, e, false, now),
                None => Err(DatastoreError::UnknownEni(format!(
                    "{} (network card {} serves no pods)",
                    e.id, e.network_card
                ))),
            };
            match r {
                Ok(()) => {
                    changed.insert(e.network_card);
                    m.reconciled(Reconciled::EniAdd);
                }
                Err(err) => {
                    m.ipamd_error("eniReconcileAdd");
                    tracing::warn!(eni = %e.id, error = %err, "reconcile: eni not registered");
                }
            }
        }
        for (eni, cidr) in &plan.add_cidrs {
            let r = core.on_pool_of_eni(eni, |ds| ds.add_cidr(eni, *cidr, cidr.prefix_len() < 32));
            match r {
                Ok(((), card)) => {
                    changed.insert(card);
                    m.reconciled(Reconciled::CidrAdd);
                }
                Err(err) => {
                    m.ipamd_error("ipReconcileAdd");
                    tracing::warn!(eni, %cidr, error = %err, "reconcile: cidr not added");
                }
            }
        }
        for (eni, cidr) in &plan.remove_cidrs {
            let r = core.on_pool_of_eni(eni, |ds| ds.remove_cidr(eni, *cidr));
            match r {
                Ok(((), card)) => {
                    changed.insert(card);
                    m.reconciled(Reconciled::CidrDel);
                }
                Err(err) => {
                    m.ipamd_error("ipReconcileDel");
                    tracing::warn!(eni, %cidr, error = %err, "reconcile: cidr kept");
                }
            }
        }
        let mut dropped = Vec::new();
        for eni in &plan.remove_enis {
            let r = core.on_pool_of_eni(eni, |ds| ds.remove_eni(eni));
            match r {
                Ok((e, card)) => {
                    changed.insert(card);
                    dropped.push(AttachedEni::from(&e.spec));
                    m.reconciled(Reconciled::EniDel);
                }
                Err(err) => {
                    m.ipamd_error("eniReconcileDel");
                    tracing::warn!(eni, error = %err, "reconcile: eni kept");
                }
            }
        }
        // Rule 3's other half: what EC2 no longer lists is kept for its pods only; its
        // free addresses are never handed out (the same IP could be live on another node)
        // and it leaves the pool's totals. EC2 listing it again lifts the quarantine.
        let listed = cloud_view(truth);
        let listed_vec: std::collections::BTreeMap<String, Vec<ipnet::Ipv4Net>> = listed
            .iter()
            .map(|(id, c)| (id.clone(), c.iter().copied().collect()))
            .collect();
        for pool in &mut core.pools {
            pool.ds.unquarantine_listed(&listed_vec);
        }
        for (eni, cidr) in &plan.kept_in_use {
            tracing::warn!(eni, %cidr, "ec2 no longer lists this cidr but pods hold it; kept for them, quarantined (no new pods) until they are deleted");
            let r = core.on_pool_of_eni(eni, |ds| ds.quarantine_cidr(eni, *cidr));
            if let Err(err) = r {
                tracing::warn!(eni, %cidr, error = %err, "reconcile: quarantine failed");
            }
        }
        for eni in &plan.kept_enis {
            let r = core.on_pool_of_eni(eni, |ds| ds.quarantine_eni(eni));
            if let Err(err) = r {
                tracing::warn!(eni, error = %err, "reconcile: quarantine of eni failed");
            }
        }
        // Entries restored into another card's pool follow their address's CIDR (before any
        // absence is judged: such an entry is not absent, it is on another card).
        core.settle_pending();
        if trust_absence {
            for pool in &mut core.pools {
                pool.ds.mark_pending_absent(|ip| {
                    listed
                        .values()
                        .any(|cidrs| cidrs.iter().any(|c| c.contains(&ip)))
                });
            }
        }
        for pool in &mut core.pools {
            if changed.contains(&pool.card)
                && let Err(e) = pool.persist()
            {
                tracing::warn!(card = pool.card, error = %e, "reconcile: checkpoint write failed");
            }
        }
        let mut after = Usage::new();
        for p in &core.pools {
            after.extend(p.ds.usage());
        }
        (plan, store_view(&after), dropped)
    }
}

impl Pool {
    /// The ENI each pod's /128 lives on: the one whose registered /80 holds it, else the ENI
    /// of the same pod's IPv4 (dual-stack: both come from one ENI; a restored record's /80 is
    /// registered only when that ENI serves its next dual-stack pod), else none known.
    fn ipv6_enis(&self) -> Vec<Option<String>> {
        self.v6
            .assignments()
            .into_iter()
            .map(|(key, _, a)| {
                if a.eni_id.is_empty() {
                    self.ds.lookup(&key).map(|v4| v4.eni_id)
                } else {
                    Some(a.eni_id)
                }
            })
            .collect()
    }

    /// Adds the pods' /128s to `stats` (per ENI, and those on no known ENI), so the pool
    /// policy never frees an ENI a pod's IPv6 lives on. A /128 of an ENI outside the pool's
    /// list (quarantined: EC2 no longer lists it) pins nothing the policy could free.
    pub(super) fn count_ipv6_pins(&self, stats: &mut crate::datastore::PoolStats) {
        for eni in self.ipv6_enis() {
            match eni {
                Some(id) => {
                    if let Some(e) = stats.enis.iter_mut().find(|e| e.id == id) {
                        e.ipv6_assigned += 1;
                    }
                }
                None => stats.ipv6_unplaced += 1,
            }
        }
    }

    /// Whether a pod's /128 may live on `eni_id` (on it, or on no known ENI).
    pub(super) fn ipv6_pins(&self, eni_id: &str) -> bool {
        self.ipv6_enis()
            .iter()
            .any(|e| e.as_deref().is_none_or(|id| id == eni_id))
    }
}

/// What introspection shows: every ENI, and the pool totals.
#[derive(Debug, Clone)]
pub struct EniSnapshot {
    /// ENIs by id.
    pub enis: Vec<EniView>,
    /// Pool statistics at the time of the snapshot.
    pub stats: PoolStats,
    /// The IPv6 /80 prefixes (IPv6 mode, dual-stack pods).
    pub ipv6_prefixes: Vec<crate::datastore::V6Prefix>,
    /// The pods' IPv6 addresses.
    pub ipv6: Vec<(
        crate::datastore::IpamKey,
        crate::datastore::PodMetadata,
        crate::datastore::V6Assignment,
    )>,
}

/// Every network card's pool ([`Pool`]: datastore, IPv6 index, checkpoint, release log),
/// always changed under one lock (private to [`Ipam`]: others change it through intent methods
/// and read it through snapshots). `pools[0]` is card 0, the card every pod's first address
/// comes from; the others are the serving cards of `ENABLE_MULTI_NIC`, ascending.
#[derive(Debug)]
pub(super) struct Core {
    pub(super) pools: Vec<Pool>,
}

impl Core {
    /// The pool of `card`.
    pub(super) fn pool_mut(&mut self, card: u32) -> Option<&mut Pool> {
        self.pools.iter_mut().find(|p| p.card == card)
    }

    /// The pool of `card`.
    pub(super) fn pool(&self, card: u32) -> Option<&Pool> {
        self.pools.iter().find(|p| p.card == card)
    }

    /// The pool holding ENI `eni_id` (ENI ids are unique across cards).
    pub(super) fn pool_of_eni(&mut self, eni_id: &str) -> Option<&mut Pool> {
        self.pools
            .iter_mut()
            .find(|p| p.ds.enis().contains_key(eni_id))
    }

    /// Runs `f` on the datastore of the pool holding ENI `eni_id`; returns its result and the
    /// pool's card (`UnknownEni` when no pool holds it).
    pub(super) fn on_pool_of_eni<R>(
        &mut self,
        eni_id: &str,
        f: impl FnOnce(&mut crate::datastore::DataStore) -> Result<R, DatastoreError>,
    ) -> Result<(R, u32), DatastoreError> {
        let pool = self
            .pool_of_eni(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        f(&mut pool.ds).map(|r| (r, pool.card))
    }

    /// Writes card 0's checkpoint (its IPv4 and IPv6 records).
    pub(super) fn persist(&mut self) -> Result<(), CheckpointError> {
        self.pools[0].persist()
    }

    /// Moves every pending entry (restored, its address on none of its pool's CIDRs) whose
    /// address is in another pool's CIDRs now to that pool, placed there, and rewrites both
    /// files. Start-up gives host evidence in no pool's CIDRs to card 0 (a Describe that lags an
    /// assign does not show it on the card-N ENI yet); when the CIDR reaches card N's pool (the
    /// reconciler, the pool manager), the pod's entry must follow, or card N would hand the
    /// live address out as free. Call under the lock after
    /// adding CIDRs, before the lock is released.
    pub(super) fn settle_pending(&mut self) {
        let mut moves = Vec::new();
        for (i, pool) in self.pools.iter().enumerate() {
            for e in pool.ds.pending() {
                let Some(j) = self.pools.iter().position(|q| q.ds.holds_cidr_of(e.ip)) else {
                    continue;
                };
                // Only into a free slot: an address another key holds there stays held by both
                // (never handed out) rather than be overwritten.
                let taken = self.pools[j].ds.lookup(&e.key).is_some()
                    || self.pools[j].ds.pending().iter().any(|q| q.key == e.key)
                    || self.pools[j].ds.holder_of(e.ip).is_some();
                if j != i && !taken {
                    moves.push((i, j, e));
                }
            }
        }
        let mut changed = std::collections::BTreeSet::new();
        for (i, j, e) in moves {
            if self.pools[i].ds.drop_pending(&e.key).is_none() {
                continue;
            }
            tracing::info!(key = %e.key, ip = %e.ip, from = self.pools[i].card, to = self.pools[j].card, "restored entry moved to the pool of the network card whose ENI has its address");
            self.pools[j]
                .ds
                .reassign_exact(&e.key, e.ip, e.metadata, e.assigned_at);
            changed.extend([i, j]);
        }
        for i in changed {
            if let Err(e) = self.pools[i].persist() {
                tracing::warn!(card = self.pools[i].card, error = %e, "checkpoint not rewritten after a restored entry moved");
            }
        }
    }
}
