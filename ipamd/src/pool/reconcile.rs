//! Reconciliation of the datastore with the cloud, EC2 being the source of truth (upstream
//! `nodeIPPoolReconcile`, with its force-release bugs designed out: #3824, #3887, #3019).
//!
//! Rules:
//! 1. IMDS is a hint. Every round compares IMDS's ENIs/CIDRs with the datastore; when they
//!    agree nothing else happens (no EC2 call at steady state).
//! 2. On a difference, ONE `DescribeNetworkInterfaces` decides. The same unexplained
//!    difference (e.g. IMDS persistently omitting a prefix) is re-confirmed at most every
//!    [`CONFIRM_INTERVAL`].
//! 3. A CIDR or ENI EC2 no longer has is removed only when no pod holds an address in it; one
//!    holding pods is kept (and logged) until those pods are deleted. Nothing is ever
//!    force-released.
//! 4. CIDRs and ENIs the pool manager released in the last [`FREED_COOLDOWN`] are never
//!    re-added from a (stale) view.
//! 5. No round within [`RECONCILE_INTERVAL`] of the previous one or of a pool change.
//!
//! The plan is a pure function ([`plan`]); [`Reconciler::tick`] gathers inputs and applies it.
//! Must not: hold the datastore lock across `.await`, act while shutting down.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;
use tokio_util::sync::CancellationToken;

use super::manager::Manager;
use super::provider::{AttachedEni, EniProvider, ProviderError};
use crate::datastore::{DataStore, Slot};
use crate::ipam::{Ipam, register_eni};

/// Idle cadence of reconciliation, and the quiet time required after a pool change.
pub const RECONCILE_INTERVAL: Duration = Duration::from_secs(60);
/// CIDRs/ENIs released by ipamd are not re-added from stale views for this long. Longer than
/// [`RECONCILE_INTERVAL`]: a round never runs within that interval of a pool change, so a
/// cooldown no longer than it never applied (the rule was dead at 60 s).
pub const FREED_COOLDOWN: Duration = Duration::from_secs(300);
/// An ENI whose host set-up failed is retried at most this often.
pub const HOST_RETRY_INTERVAL: Duration = Duration::from_secs(10);
/// The same IMDS/datastore difference is re-confirmed with EC2 at most this often.
pub const CONFIRM_INTERVAL: Duration = Duration::from_secs(300);

/// What the datastore holds: ENI → (CIDR → held by a pod).
pub type StoreView = BTreeMap<String, BTreeMap<Ipv4Net, bool>>;

/// The datastore's ENIs and CIDRs, with "a pod holds an address in it".
pub fn store_view(ds: &DataStore) -> StoreView {
    ds.enis()
        .iter()
        .map(|(id, e)| {
            let cidrs = e
                .cidrs
                .iter()
                .map(|(net, c)| {
                    (
                        *net,
                        c.slots.values().any(|s| matches!(s, Slot::Assigned { .. })),
                    )
                })
                .collect();
            (id.clone(), cidrs)
        })
        .collect()
}

fn cloud_view(enis: &[AttachedEni]) -> BTreeMap<String, BTreeSet<Ipv4Net>> {
    enis.iter()
        .map(|e| {
            let cidrs = e
                .secondary_ips
                .iter()
                .map(|ip| Ipv4Net::from(*ip))
                .chain(e.prefixes.iter().copied())
                .collect();
            (e.id.clone(), cidrs)
        })
        .collect()
}

/// A canonical description of how a view differs from the datastore (empty: in sync).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Difference {
    /// ENIs seen but not in the store.
    pub missing_enis: BTreeSet<String>,
    /// ENIs in the store but not seen.
    pub extra_enis: BTreeSet<String>,
    /// CIDRs seen on a known ENI but not in the store.
    pub missing_cidrs: BTreeSet<(String, Ipv4Net)>,
    /// CIDRs in the store but not seen.
    pub extra_cidrs: BTreeSet<(String, Ipv4Net)>,
}

impl Difference {
    /// In sync.
    pub fn is_empty(&self) -> bool {
        self.missing_enis.is_empty()
            && self.extra_enis.is_empty()
            && self.missing_cidrs.is_empty()
            && self.extra_cidrs.is_empty()
    }
}

/// How `seen` (IMDS or EC2) differs from the store, ignoring what is cooling down after release.
/// `missing_*`: in `seen`, not in the store. `extra_*`: in the store, not in `seen`.
pub fn difference(
    store: &StoreView,
    seen: &[AttachedEni],
    freed: &BTreeSet<Ipv4Net>,
    freed_enis: &BTreeSet<String>,
) -> Difference {
    let seen = cloud_view(seen);
    let mut d = Difference::default();
    for (id, cidrs) in &seen {
        match store.get(id) {
            None if !freed_enis.contains(id) => {
                d.missing_enis.insert(id.clone());
            }
            None => {}
            Some(have) => {
                for c in cidrs
                    .iter()
                    .filter(|c| !have.contains_key(*c) && !freed.contains(*c))
                {
                    d.missing_cidrs.insert((id.clone(), *c));
                }
                for c in have.keys().filter(|c| !cidrs.contains(*c)) {
                    d.extra_cidrs.insert((id.clone(), *c));
                }
            }
        }
    }
    for id in store.keys().filter(|id| !seen.contains_key(*id)) {
        d.extra_enis.insert(id.clone());
    }
    d
}

/// What a confirmed (EC2) difference leads to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// ENIs attached in EC2 the store lacks (registered with their CIDRs, host set up).
    pub add_enis: Vec<AttachedEni>,
    /// CIDRs EC2 has on a known ENI that the store lacks.
    pub add_cidrs: Vec<(String, Ipv4Net)>,
    /// CIDRs gone from EC2 and held by no pod.
    pub remove_cidrs: Vec<(String, Ipv4Net)>,
    /// ENIs gone from EC2 whose CIDRs are held by no pod.
    pub remove_enis: Vec<String>,
    /// Gone from EC2 but held by pods: kept until the pods are deleted (never force-released),
    /// quarantined meanwhile (no new assignments, not in the pool's totals).
    pub kept_in_use: Vec<(String, Ipv4Net)>,
    /// ENIs gone from EC2 with pods on them: kept and quarantined as a whole.
    pub kept_enis: Vec<String>,
}

impl Plan {
    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        self.add_enis.is_empty()
            && self.add_cidrs.is_empty()
            && self.remove_cidrs.is_empty()
            && self.remove_enis.is_empty()
    }
}

/// PURE: the changes that make the store match EC2's `truth`, under rules 3 and 4.
pub fn plan(
    store: &StoreView,
    truth: &[AttachedEni],
    freed: &BTreeSet<Ipv4Net>,
    freed_enis: &BTreeSet<String>,
) -> Plan {
    let d = difference(store, truth, freed, freed_enis);
    let mut p = Plan::default();
    for e in truth.iter().filter(|e| d.missing_enis.contains(&e.id)) {
        let mut e = e.clone();
        e.secondary_ips
            .retain(|ip| !freed.contains(&Ipv4Net::from(*ip)));
        e.prefixes.retain(|c| !freed.contains(c));
        p.add_enis.push(e);
    }
    p.add_cidrs = d.missing_cidrs.into_iter().collect();
    for (eni, cidr) in d.extra_cidrs {
        let held = store
            .get(&eni)
            .and_then(|c| c.get(&cidr))
            .copied()
            .unwrap_or(false);
        if held {
            p.kept_in_use.push((eni, cidr))
        } else {
            p.remove_cidrs.push((eni, cidr))
        }
    }
    for eni in d.extra_enis {
        let held: Vec<Ipv4Net> = store
            .get(&eni)
            .map(|c| c.iter().filter(|(_, h)| **h).map(|(n, _)| *n).collect())
            .unwrap_or_default();
        if held.is_empty() {
            p.remove_enis.push(eni);
        } else {
            p.kept_in_use
                .extend(held.into_iter().map(|n| (eni.clone(), n)));
            p.kept_enis.push(eni);
        }
    }
    p
}

/// Host networking of ENIs the reconciler discovers or drops (implemented over
/// `host::HostNetwork` by `node_init`; a no-op in tests without a kernel).
pub trait EniHost: Send + Sync {
    /// Set up the ENI's link, table and rules (idempotent).
    fn setup(&self, eni: &AttachedEni) -> impl Future<Output = Result<(), String>> + Send;
    /// Remove a freed ENI's table and rules.
    fn teardown(&self, eni: &AttachedEni) -> impl Future<Output = Result<(), String>> + Send;
}

/// No host networking (unit tests, namespaces-less runs).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHost;

impl EniHost for NoHost {
    async fn setup(&self, _eni: &AttachedEni) -> Result<(), String> {
        Ok(())
    }
    async fn teardown(&self, _eni: &AttachedEni) -> Result<(), String> {
        Ok(())
    }
}

/// Where the cheap hint comes from. The EC2 provider answers from IMDS; any other provider
/// answers with its (cheap) source of truth.
pub trait Hint: Send + Sync {
    /// The ENIs and addresses as the cheap source sees them.
    fn hinted_enis(&self) -> impl Future<Output = Result<Vec<AttachedEni>, ProviderError>> + Send;
}

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
    freed: BTreeMap<Ipv4Net, SystemTime>,
    freed_enis: BTreeMap<String, SystemTime>,
    last_round: Option<SystemTime>,
    last_confirm: Option<(SystemTime, Difference)>,
    /// The last description (hint or EC2) of every ENI the store holds: what a teardown needs
    /// (device number, primary IP) once EC2 no longer describes the ENI.
    seen: BTreeMap<String, AttachedEni>,
    /// Start with a round right away (after a restart the store may lack a mid-grow ENI).
    pub eager: bool,
    /// Last host set-up attempt of each ENI not host-ready.
    host_attempts: BTreeMap<String, SystemTime>,
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

    /// Notice what the pool manager changed since the last look: released CIDRs/ENIs enter the
    /// cooldown, and any change postpones the next round.
    fn observe(&mut self, store: &StoreView, now: SystemTime) {
        let current: BTreeMap<String, BTreeSet<Ipv4Net>> = store
            .iter()
            .map(|(id, c)| (id.clone(), c.keys().copied().collect()))
            .collect();
        if let Some(last) = &self.last_view
            && *last != current
        {
            self.changed_at = Some(now);
            for (id, cidrs) in last {
                match current.get(id) {
                    None => {
                        self.freed_enis.insert(id.clone(), now);
                        self.freed.extend(cidrs.iter().map(|c| (*c, now)));
                    }
                    Some(cur) => self.freed.extend(cidrs.difference(cur).map(|c| (*c, now))),
                }
            }
        }
        self.last_view = Some(current);
        self.freed
            .retain(|_, t| within(now, Some(*t), FREED_COOLDOWN));
        self.freed_enis
            .retain(|_, t| within(now, Some(*t), FREED_COOLDOWN));
    }

    /// Remembers `enis` as described now; forgets ENIs neither the store nor `enis` has.
    fn remember(&mut self, store: &StoreView, enis: &[AttachedEni]) {
        self.seen
            .retain(|id, _| store.contains_key(id) || enis.iter().any(|e| &e.id == id));
        for e in enis {
            self.seen.insert(e.id.clone(), e.clone());
        }
    }

    fn freed_sets(&self) -> (BTreeSet<Ipv4Net>, BTreeSet<String>) {
        (
            self.freed.keys().copied().collect(),
            self.freed_enis.keys().cloned().collect(),
        )
    }

    /// Sets up the host networking of every ENI the datastore holds as not host-ready (its
    /// set-up failed at node init, at creation or at adoption) and marks it ready on success,
    /// so its addresses become assignable. Each ENI is retried at most every
    /// [`HOST_RETRY_INTERVAL`]. Call on every pass of the pool loop.
    pub async fn ensure_host<P: EniProvider + Hint, H: EniHost>(
        &mut self,
        ipam: &Ipam<P>,
        host: &H,
    ) {
        let now = ipam.now();
        let not_ready: Vec<String> = ipam
            .core()
            .ds
            .enis()
            .values()
            .filter(|e| !e.host_ready && !e.gone)
            .map(|e| e.id.clone())
            .collect();
        self.host_attempts.retain(|id, _| not_ready.contains(id));
        let due: Vec<String> = not_ready
            .into_iter()
            .filter(|id| {
                !within(
                    now,
                    self.host_attempts.get(id).copied(),
                    HOST_RETRY_INTERVAL,
                )
            })
            .collect();
        if due.is_empty() || ipam.is_shutting_down() {
            return;
        }
        if due.iter().any(|id| !self.seen.contains_key(id)) {
            // The set-up needs the ENI's MAC and primary address: IMDS has them (no EC2 call).
            match ipam.provider.hinted_enis().await {
                Ok(h) => {
                    for e in h {
                        self.seen.insert(e.id.clone(), e);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "host setup retry: no eni description"),
            }
        }
        let mut readied = false;
        for id in due {
            self.host_attempts.insert(id.clone(), now);
            let Some(e) = self.seen.get(&id).cloned() else {
                continue;
            };
            match host.setup(&e).await {
                Ok(()) => {
                    if ipam.core().ds.set_host_ready(&id, true).is_ok() {
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
    pub async fn tick<P: EniProvider + Hint, H: EniHost>(
        &mut self,
        ipam: &Ipam<P>,
        host: &H,
    ) -> Outcome {
        let now = ipam.now();
        if ipam.is_shutting_down() {
            return Outcome::Skipped;
        }
        let store = store_view(&ipam.core().ds);
        self.observe(&store, now);
        let eager = std::mem::take(&mut self.eager);
        if !eager
            && (within(now, self.last_round, RECONCILE_INTERVAL)
                || within(now, self.changed_at, RECONCILE_INTERVAL))
        {
            return Outcome::Skipped;
        }
        self.last_round = Some(now);
        let hint = match ipam.provider.hinted_enis().await {
            Ok(h) => h,
            Err(e) => return Outcome::Failed(format!("hint: {e}")),
        };
        let (freed, freed_enis) = self.freed_sets();
        let store = store_view(&ipam.core().ds);
        self.remember(&store, &hint);
        let diff = difference(&store, &hint, &freed, &freed_enis);
        // Restored entries not on a known ENI trigger a confirmation until EC2 has said once
        // that their address is on none of this node's ENIs (then they are left to their DEL
        // or to reclaim, instead of a Describe every 5 min forever).
        let pending = ipam.core().ds.unconfirmed_pending() > 0;
        if diff.is_empty() && !pending {
            return Outcome::InSync;
        }
        if let Some((t, d)) = &self.last_confirm
            && *d == diff
            && within(now, Some(*t), CONFIRM_INTERVAL)
        {
            return Outcome::Unconfirmed(diff);
        }
        let truth = match ipam.provider.list_enis().await {
            Ok(t) => t,
            Err(e) => return Outcome::Failed(format!("describe: {e}")),
        };
        self.last_confirm = Some((now, diff));
        self.apply(ipam, host, &truth).await
    }

    async fn apply<P: EniProvider, H: EniHost>(
        &mut self,
        ipam: &Ipam<P>,
        host: &H,
        truth: &[AttachedEni],
    ) -> Outcome {
        let now = ipam.now();
        let plan = {
            let mut core = ipam.core();
            // Re-read under the lock: anything the manager released meanwhile is cooling down.
            let store = store_view(&core.ds);
            self.observe(&store, now);
            self.remember(&store, truth);
            let (freed, freed_enis) = self.freed_sets();
            let plan = plan(&store, truth, &freed, &freed_enis);
            // Counted as upstream counts them: awscni_reconcile_count{fn} per change applied,
            // awscni_ipamd_error_count{fn} per change refused (ipamd.go's reconcile loops).
            let m = &ipam.metrics;
            for e in &plan.add_enis {
                // Not host-ready until the setup below (or a later retry) succeeds.
                match register_eni(&mut core.ds, e, false, now) {
                    Ok(_) => m.reconciled("eniReconcileAdd"),
                    Err(err) => {
                        m.ipamd_error("eniReconcileAdd");
                        tracing::warn!(eni = %e.id, error = %err, "reconcile: eni not registered");
                    }
                }
            }
            for (eni, cidr) in &plan.add_cidrs {
                match core.ds.add_cidr(eni, *cidr, cidr.prefix_len() < 32) {
                    Ok(()) => m.reconciled("eniDataStorePoolReconcileAdd"),
                    Err(err) => {
                        m.ipamd_error("ipReconcileAdd");
                        tracing::warn!(eni, %cidr, error = %err, "reconcile: cidr not added");
                    }
                }
            }
            for (eni, cidr) in &plan.remove_cidrs {
                match core.ds.remove_cidr(eni, *cidr) {
                    Ok(()) => m.reconciled("eniIPPoolReconcileDel"),
                    Err(err) => {
                        m.ipamd_error("ipReconcileDel");
                        tracing::warn!(eni, %cidr, error = %err, "reconcile: cidr kept");
                    }
                }
            }
            for eni in &plan.remove_enis {
                match core.ds.remove_eni(eni) {
                    Ok(_) => m.reconciled("eniReconcileDel"),
                    Err(err) => {
                        m.ipamd_error("eniReconcileDel");
                        tracing::warn!(eni, error = %err, "reconcile: eni kept");
                    }
                }
            }
            // Rule 3's other half: what EC2 no longer lists is kept for its pods only; its
            // free addresses are never handed out (the same IP could be live on another node)
            // and it leaves the pool's totals. EC2 listing it again lifts the quarantine.
            let listed: BTreeMap<String, Vec<Ipv4Net>> = cloud_view(truth)
                .into_iter()
                .map(|(id, c)| (id, c.into_iter().collect()))
                .collect();
            core.ds.unquarantine_listed(&listed);
            for (eni, cidr) in &plan.kept_in_use {
                tracing::warn!(eni, %cidr, "ec2 no longer lists this cidr but pods hold it; kept for them, quarantined (no new pods) until they are deleted");
                if let Err(err) = core.ds.quarantine_cidr(eni, *cidr) {
                    tracing::warn!(eni, %cidr, error = %err, "reconcile: quarantine failed");
                }
            }
            for eni in &plan.kept_enis {
                if let Err(err) = core.ds.quarantine_eni(eni) {
                    tracing::warn!(eni, error = %err, "reconcile: quarantine of eni failed");
                }
            }
            let on_node = cloud_view(truth);
            core.ds.mark_pending_absent(|ip| {
                on_node
                    .values()
                    .any(|cidrs| cidrs.iter().any(|c| c.contains(&ip)))
            });
            if !plan.is_empty()
                && let Err(e) = core.persist()
            {
                tracing::warn!(error = %e, "reconcile: checkpoint write failed");
            }
            self.last_view = Some(
                store_view(&core.ds)
                    .into_iter()
                    .map(|(id, c)| (id, c.into_keys().collect()))
                    .collect(),
            );
            plan
        };
        for e in &plan.add_enis {
            match host.setup(e).await {
                Ok(()) => {
                    let _ = ipam.core().ds.set_host_ready(&e.id, true);
                }
                Err(err) => {
                    tracing::warn!(eni = %e.id, error = %err, "reconcile: host setup of eni failed; its addresses are held back and the setup retried");
                }
            }
        }
        for eni in &plan.remove_enis {
            // EC2 no longer has it (no pod held an address on it): its link is gone, remove
            // its route table and rules now rather than when the device number is reused.
            match self.seen.remove(eni) {
                Some(e) => match host.teardown(&e).await {
                    Ok(()) => tracing::info!(eni, "eni gone from ec2: dropped, host state removed"),
                    Err(err) => {
                        tracing::warn!(eni, error = %err, "eni gone from ec2: dropped; host teardown failed");
                    }
                },
                None => tracing::warn!(
                    eni,
                    "eni gone from ec2: dropped; never described, so its host state is pruned when its device number is set up again"
                ),
            }
        }
        if !plan.is_empty() {
            ipam.publish(None);
            tracing::info!(?plan, "reconciled with ec2");
        }
        Outcome::Applied(plan)
    }
}

/// The pool loop for a provider with a hint: every tick, or at once when an AddNetwork waits,
/// the manager settles the pool, then the reconciler takes its (self-paced) round. Running both
/// in one task means a reconcile never interleaves with a half-done pool action.
pub async fn run<P: EniProvider + Hint, H: EniHost>(
    mut manager: Manager,
    mut reconciler: Reconciler,
    ipam: Arc<Ipam<P>>,
    host: Arc<H>,
    tick: Duration,
    shutdown: CancellationToken,
) {
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = interval.tick() => {}
            () = ipam.demanded() => {}
        }
        if ipam.is_shutting_down() {
            return;
        }
        manager.settle(&ipam).await;
        reconciler.ensure_host(&ipam, &*host).await;
        if ipam.waiting_pods() == 0 {
            let span = tracing::debug_span!("reconcile_round");
            let outcome =
                tracing::Instrument::instrument(reconciler.tick(&ipam, &*host), span).await;
            if let Outcome::Failed(e) = &outcome {
                tracing::warn!(error = %e, "reconcile failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn eni(id: &str, dev: u32, ips: &[&str], prefixes: &[&str]) -> AttachedEni {
        AttachedEni {
            id: id.into(),
            device_number: dev,
            network_card: 0,
            is_primary: dev == 0,
            is_trunk: false,
            is_efa: false,
            is_excluded: false,
            mac: format!("02:00:00:00:00:0{dev}"),
            subnet_id: "subnet-1".into(),
            subnet: "198.18.0.0/24".parse().unwrap(),
            primary_ip: Ipv4Addr::new(198, 18, 0, 10 + u8::try_from(dev).unwrap()),
            secondary_ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            prefixes: prefixes.iter().map(|s| s.parse().unwrap()).collect(),
        }
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn store(entries: &[(&str, &[(&str, bool)])]) -> StoreView {
        entries
            .iter()
            .map(|(id, c)| {
                (
                    (*id).to_owned(),
                    c.iter().map(|(n, h)| (net(n), *h)).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn table_of_reconcile_rules() {
        let none = BTreeSet::new();
        let no_enis = BTreeSet::new();
        struct Case {
            name: &'static str,
            store: StoreView,
            truth: Vec<AttachedEni>,
            freed: BTreeSet<Ipv4Net>,
            want: Plan,
        }
        let cases = vec![
            Case {
                name: "in sync: nothing",
                store: store(&[("eni-0", &[("198.18.0.20/32", true)])]),
                truth: vec![eni("eni-0", 0, &["198.18.0.20"], &[])],
                freed: none.clone(),
                want: Plan::default(),
            },
            Case {
                name: "#3824: prefix gone from ec2 but held by a pod is kept, not force-released",
                store: store(&[(
                    "eni-0",
                    &[("198.18.0.32/28", true), ("198.18.0.48/28", false)],
                )]),
                truth: vec![eni("eni-0", 0, &[], &[])],
                freed: none.clone(),
                want: Plan {
                    remove_cidrs: vec![("eni-0".into(), net("198.18.0.48/28"))],
                    kept_in_use: vec![("eni-0".into(), net("198.18.0.32/28"))],
                    ..Plan::default()
                },
            },
            Case {
                name: "#3887: a cidr ipamd just released is not re-added from a stale view",
                store: store(&[("eni-0", &[])]),
                truth: vec![eni("eni-0", 0, &["198.18.0.21"], &[])],
                freed: [net("198.18.0.21/32")].into(),
                want: Plan::default(),
            },
            Case {
                name: "an address ec2 has and the store lacks is added",
                store: store(&[("eni-0", &[])]),
                truth: vec![eni("eni-0", 0, &["198.18.0.22"], &[])],
                freed: none.clone(),
                want: Plan {
                    add_cidrs: vec![("eni-0".into(), net("198.18.0.22/32"))],
                    ..Plan::default()
                },
            },
            Case {
                name: "#66: an eni attached mid-grow before a restart is adopted",
                store: store(&[("eni-0", &[])]),
                truth: vec![
                    eni("eni-0", 0, &[], &[]),
                    eni("eni-1", 1, &["198.18.0.30"], &[]),
                ],
                freed: none.clone(),
                want: Plan {
                    add_enis: vec![eni("eni-1", 1, &["198.18.0.30"], &[])],
                    ..Plan::default()
                },
            },
            Case {
                name: "#1967: an eni gone from ec2 with pods on it is kept",
                store: store(&[("eni-0", &[]), ("eni-1", &[("198.18.0.30/32", true)])]),
                truth: vec![eni("eni-0", 0, &[], &[])],
                freed: none.clone(),
                want: Plan {
                    kept_in_use: vec![("eni-1".into(), net("198.18.0.30/32"))],
                    kept_enis: vec!["eni-1".into()],
                    ..Plan::default()
                },
            },
            Case {
                name: "an empty eni gone from ec2 is dropped",
                store: store(&[("eni-0", &[]), ("eni-1", &[("198.18.0.30/32", false)])]),
                truth: vec![eni("eni-0", 0, &[], &[])],
                freed: none.clone(),
                want: Plan {
                    remove_enis: vec!["eni-1".into()],
                    ..Plan::default()
                },
            },
        ];
        for c in cases {
            assert_eq!(
                plan(&c.store, &c.truth, &c.freed, &no_enis),
                c.want,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn difference_ignores_cooling_cidrs_and_sees_missing_ones() {
        let s = store(&[("eni-0", &[("198.18.0.20/32", false)])]);
        let hint = vec![eni("eni-0", 0, &["198.18.0.20", "198.18.0.21"], &[])];
        assert!(
            difference(&s, &hint, &[net("198.18.0.21/32")].into(), &BTreeSet::new()).is_empty()
        );
        assert!(!difference(&s, &hint, &BTreeSet::new(), &BTreeSet::new()).is_empty());
    }
}
