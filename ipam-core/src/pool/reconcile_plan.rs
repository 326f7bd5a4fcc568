//! Reconciliation of the datastore with the cloud, EC2 being the source of truth. Why the rules
//! below: a reconcile that force-releases what a pod holds, or re-adds what was just released from
//! a stale view, hands one address to two pods.
//!
//! Rules:
//! 1. IMDS is a hint. Every round compares IMDS's ENIs/CIDRs with the datastore; when they
//!    agree nothing else happens (no EC2 call at steady state).
//! 2. On a difference, ONE `DescribeNetworkInterfaces` decides. The same unexplained
//!    difference (e.g. IMDS persistently omitting a prefix) is re-confirmed at most every
//!    `CONFIRM_INTERVAL`.
//! 3. A CIDR or ENI EC2 no longer has is removed only when no pod holds an address in it; one
//!    holding pods is kept (and logged) until those pods are deleted. Nothing is ever
//!    force-released.
//! 4. CIDRs and ENIs the pool manager released in the last [`FREED_COOLDOWN`] are never re-added
//!    from a (stale) view. The manager hands each release ([`Release`]) to the reconciler as a
//!    value when it makes it, and records it beside the checkpoint before EC2 is asked
//!    ([`RecentlyFreed`]), so this holds on the first pass after a start and across a restart (were
//!    it learnt by comparing with the previous view, a release made before the first view, or
//!    before a restart, would be re-added from a lagging Describe).
//! 5. No round within `RECONCILE_INTERVAL` of the previous one or of a pool change.
//! 6. An absence seen within `ABSENCE_TRUST_WINDOW` of ipamd's start or of a change the
//!    manager asked EC2 for is not EC2's word: it does not confirm a restored entry absent
//!    (which would lift the FreeEni guard on its ENI).
//! 7. CIDRs and ENIs the pool manager added (its own Assign, or a CreateNetworkInterface it
//!    attached) in the last [`ADDITION_SETTLE`] are not removed because a view lacks them: such a
//!    view lags behind ipamd's own change (seen in simulation: a Describe right after the pool's
//!    assign dropped the new addresses, and the pool then asked EC2 for addresses the ENI already
//!    had until a later round). An addition of a CIDR also ends its rule-4 cooldown: EC2 gave it
//!    back to this node, so its release no longer speaks for it (in memory, and in the side file
//!    through `Ipam::add_assigned`).
//!
//! This module holds the pure part: the views, the difference and the plan ([`plan`]), the
//! recently freed and added sets ([`RecentlyFreed`], [`RecentlyAdded`]) and what they forbid
//! a view to change ([`RecentChanges`]), and the cheap-hint port ([`ImdsView`]). The reconciler
//! (`crate::pool::reconciler`) gathers the inputs and has `Ipam` apply the plan. Must not:
//! do I/O, know `Ipam`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;

use super::ec2_port::{AttachedEni, ProviderError};
use crate::datastore::Usage;
use crate::datastore::checkpoint::FreedRecord;

/// CIDRs/ENIs released by ipamd are not re-added from stale views for this long (rule 4).
/// Longer than the reconciler's pacing (`RECONCILE_INTERVAL`, 60 s): a round never runs
/// within that interval of a pool change, so a cooldown no longer than it never applied (the
/// rule was dead at 60 s).
pub const FREED_COOLDOWN: Duration = Duration::from_secs(300);
/// A CIDR or ENI the pool manager added is not removed on a view's absence for this long
/// (rule 7): the reconciler's settle time after a pool change (`RECONCILE_INTERVAL`), so only
/// a round that runs early (the eager first round after a start) is concerned.
pub const ADDITION_SETTLE: Duration = Duration::from_secs(60);

/// An addition the pool manager made: CIDRs EC2 assigned to an ENI, or an ENI it created and
/// attached (`whole_eni`, with the CIDRs it was created with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addition {
    /// The ENI.
    pub eni_id: String,
    /// The CIDRs EC2 answered with.
    pub cidrs: Vec<Ipv4Net>,
    /// The ENI itself is new.
    pub whole_eni: bool,
    /// When.
    pub at: SystemTime,
}

/// The CIDRs and ENIs added in the last [`ADDITION_SETTLE`] (rule 7). Pure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentlyAdded {
    cidrs: BTreeMap<Ipv4Net, SystemTime>,
    enis: BTreeMap<String, SystemTime>,
}

impl RecentlyAdded {
    /// Adds an addition (a later one of the same CIDR or ENI keeps the later time).
    pub fn record(&mut self, a: &Addition) {
        for c in &a.cidrs {
            let t = self.cidrs.entry(*c).or_insert(a.at);
            *t = (*t).max(a.at);
        }
        if a.whole_eni {
            let t = self.enis.entry(a.eni_id.clone()).or_insert(a.at);
            *t = (*t).max(a.at);
        }
    }

    /// Forgets what was added [`ADDITION_SETTLE`] or longer before `now` (a time after `now`,
    /// the clock stepped back, is kept).
    pub fn expire(&mut self, now: SystemTime) {
        let live = |at: &SystemTime| {
            now.duration_since(*at)
                .map_or(true, |d| d < ADDITION_SETTLE)
        };
        self.cidrs.retain(|_, at| live(at));
        self.enis.retain(|_, at| live(at));
    }
}

/// What a view may not change in the store now: re-add what was released (rule 4), remove
/// what was just added (rule 7).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentChanges {
    /// CIDRs released recently.
    pub freed: BTreeSet<Ipv4Net>,
    /// ENIs freed recently.
    pub freed_enis: BTreeSet<String>,
    /// CIDRs added recently.
    pub added: BTreeSet<Ipv4Net>,
    /// ENIs added recently.
    pub added_enis: BTreeSet<String>,
    /// Releases of the last [`FREED_COOLDOWN`] are not all known (a release log was lost):
    /// nothing the store lacks is taken from a view.
    pub blind: bool,
}

impl RecentChanges {
    /// The guard of these releases and additions.
    #[must_use]
    pub fn of(freed: &RecentlyFreed, added: &RecentlyAdded) -> Self {
        Self {
            freed: freed.cidrs(),
            freed_enis: freed.enis(),
            added: added.cidrs.keys().copied().collect(),
            added_enis: added.enis.keys().cloned().collect(),
            blind: freed.unknown_before.is_some(),
        }
    }
}

/// A release the pool manager made: CIDRs of an ENI taken out of the pool before an
/// `Unassign`, or a whole ENI (with the CIDRs it had) before a `FreeEni`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The ENI.
    pub eni_id: String,
    /// The CIDRs released (all of the ENI's for a freed ENI).
    pub cidrs: Vec<Ipv4Net>,
    /// The ENI itself was freed.
    pub whole_eni: bool,
    /// When.
    pub at: SystemTime,
}

/// The CIDRs and ENIs released in the last [`FREED_COOLDOWN`] (rule 4), with their ENI and
/// release time. Pure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecentlyFreed {
    cidrs: BTreeMap<Ipv4Net, (String, SystemTime)>,
    enis: BTreeMap<String, SystemTime>,
    /// Releases before this moment are unknown (a lost release log).
    unknown_before: Option<SystemTime>,
}

impl RecentlyFreed {
    /// Adds a release (a later release of the same CIDR or ENI keeps the later time).
    pub fn record(&mut self, r: &Release) {
        for c in &r.cidrs {
            self.add_cidr(*c, &r.eni_id, r.at);
        }
        if r.whole_eni {
            self.add_eni(&r.eni_id, r.at);
        }
    }

    fn add_cidr(&mut self, cidr: Ipv4Net, eni_id: &str, at: SystemTime) {
        let e = self
            .cidrs
            .entry(cidr)
            .or_insert_with(|| (eni_id.to_owned(), at));
        if at >= e.1 {
            *e = (eni_id.to_owned(), at);
        }
    }

    fn add_eni(&mut self, eni_id: &str, at: SystemTime) {
        let e = self.enis.entry(eni_id.to_owned()).or_insert(at);
        *e = (*e).max(at);
    }

    /// Ends the cooldown of `cidrs` released before `at` (EC2 assigned them to this node again
    /// at `at`: rule 7).
    pub fn supersede(&mut self, cidrs: &[Ipv4Net], at: SystemTime) {
        for c in cidrs {
            if self.cidrs.get(c).is_some_and(|(_, t)| *t <= at) {
                self.cidrs.remove(c);
            }
        }
    }

    /// Releases before `at` are unknown (the release log was lost): until [`FREED_COOLDOWN`]
    /// after `at` the guard is blind (nothing the store lacks is taken from a view) and every
    /// start assumes what no pod holds released ([`Self::unknown_releases`]).
    pub fn mark_unknown(&mut self, at: SystemTime) {
        self.unknown_before = Some(self.unknown_before.map_or(at, |t| t.max(at)));
    }

    /// See [`Self::mark_unknown`].
    #[must_use]
    pub fn unknown_before(&self) -> Option<SystemTime> {
        self.unknown_before
    }

    /// Adds every release of `other`.
    pub fn merge(&mut self, other: &Self) {
        if let Some(t) = other.unknown_before {
            self.mark_unknown(t);
        }
        for (c, (eni, at)) in &other.cidrs {
            self.add_cidr(*c, eni, *at);
        }
        for (eni, at) in &other.enis {
            self.add_eni(eni, *at);
        }
    }

    /// Forgets what was released [`FREED_COOLDOWN`] or longer before `now` (a release time
    /// after `now`, the clock stepped back, is kept).
    pub fn expire(&mut self, now: SystemTime) {
        let live = |at: &SystemTime| now.duration_since(*at).map_or(true, |d| d < FREED_COOLDOWN);
        self.cidrs.retain(|_, (_, at)| live(at));
        self.enis.retain(|_, at| live(at));
        if self.unknown_before.is_some_and(|t| !live(&t)) {
            self.unknown_before = None;
        }
    }

    /// The CIDRs.
    #[must_use]
    pub fn cidrs(&self) -> BTreeSet<Ipv4Net> {
        self.cidrs.keys().copied().collect()
    }

    /// The ENIs freed.
    #[must_use]
    pub fn enis(&self) -> BTreeSet<String> {
        self.enis.keys().cloned().collect()
    }

    /// Nothing released.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.cidrs.is_empty() && self.enis.is_empty() && self.unknown_before.is_none()
    }

    /// What a start without its release log (lost, unreadable) must assume it released just
    /// before: every CIDR of `store` no pod holds, and every ENI but `exempt` (those that never
    /// serve pods: the primary, the trunk, EFA and excluded ENIs) none of whose CIDRs a pod
    /// holds, released `at`. A Describe that lags behind an
    /// Unassign or a detach the previous instance made would otherwise put them back in the
    /// pool while EC2 gives them to another node; held out, they come back from EC2's view
    /// once [`FREED_COOLDOWN`] has passed.
    #[must_use]
    pub fn unknown_releases(
        store: &StoreView,
        exempt: &BTreeSet<String>,
        at: SystemTime,
    ) -> Vec<Release> {
        let mut out = Vec::new();
        for (eni, cidrs) in store {
            let free: Vec<Ipv4Net> = cidrs
                .iter()
                .filter(|(_, held)| !**held)
                .map(|(c, _)| *c)
                .collect();
            let whole_eni = !exempt.contains(eni) && free.len() == cidrs.len();
            if free.is_empty() && !whole_eni {
                continue;
            }
            out.push(Release {
                eni_id: eni.clone(),
                cidrs: free,
                whole_eni,
                at,
            });
        }
        out
    }

    /// As the side file keeps them.
    #[must_use]
    pub fn records(&self) -> Vec<FreedRecord> {
        let cidrs = self.cidrs.iter().map(|(c, (eni, at))| FreedRecord {
            eni_id: eni.clone(),
            cidr: Some(*c),
            released_at: *at,
        });
        let enis = self.enis.iter().map(|(eni, at)| FreedRecord {
            eni_id: eni.clone(),
            cidr: None,
            released_at: *at,
        });
        cidrs.chain(enis).collect()
    }

    /// From the side file's records.
    #[must_use]
    pub fn from_records(records: &[FreedRecord]) -> Self {
        let mut f = Self::default();
        for r in records {
            match r.cidr {
                Some(c) => f.add_cidr(c, &r.eni_id, r.released_at),
                None => f.add_eni(&r.eni_id, r.released_at),
            }
        }
        f
    }

    /// What of `store` these releases say is no longer this node's: ENIs freed, and CIDRs
    /// released (not on such an ENI) that no pod holds. At start a Describe that still lists
    /// them registered them again; they are taken out before any is handed out.
    #[must_use]
    pub fn withdrawable(&self, store: &StoreView) -> (Vec<(String, Ipv4Net)>, Vec<String>) {
        let enis: Vec<String> = store
            .keys()
            .filter(|id| self.enis.contains_key(*id))
            .cloned()
            .collect();
        let cidrs = store
            .iter()
            .filter(|(id, _)| !self.enis.contains_key(*id))
            .flat_map(|(id, cidrs)| {
                cidrs
                    .iter()
                    .filter(|(c, held)| !**held && self.cidrs.contains_key(*c))
                    .map(move |(c, _)| (id.clone(), *c))
            })
            .collect();
        (cidrs, enis)
    }
}

/// What the datastore holds: ENI → (CIDR → held by a pod).
pub type StoreView = BTreeMap<String, BTreeMap<Ipv4Net, bool>>;

/// The datastore's ENIs and CIDRs (from its [`Usage`]), with "a pod holds an address in it".
#[must_use]
pub fn store_view(usage: &Usage) -> StoreView {
    usage
        .iter()
        .map(|(id, cidrs)| {
            (
                id.clone(),
                cidrs.iter().map(|(n, a)| (*n, *a > 0)).collect(),
            )
        })
        .collect()
}

/// What `enis` list: ENI → CIDRs (secondary /32s and prefixes).
#[must_use]
pub fn cloud_view(enis: &[AttachedEni]) -> BTreeMap<String, BTreeSet<Ipv4Net>> {
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

/// How `seen` (IMDS or EC2) differs from the store, ignoring what `guard` keeps as it is
/// (cooling down after a release, just added). `missing_*`: in `seen`, not in the store.
/// `extra_*`: in the store, not in `seen`.
pub fn difference(store: &StoreView, seen: &[AttachedEni], guard: &RecentChanges) -> Difference {
    let (freed, freed_enis) = (&guard.freed, &guard.freed_enis);
    let seen = cloud_view(seen);
    let mut d = Difference::default();
    for (id, cidrs) in &seen {
        match store.get(id) {
            None if !freed_enis.contains(id) && !guard.blind => {
                d.missing_enis.insert(id.clone());
            }
            None => {}
            Some(have) => {
                for c in cidrs
                    .iter()
                    .filter(|c| !have.contains_key(*c) && !freed.contains(*c) && !guard.blind)
                {
                    d.missing_cidrs.insert((id.clone(), *c));
                }
                for c in have
                    .keys()
                    .filter(|c| !cidrs.contains(*c) && !guard.added.contains(*c))
                {
                    d.extra_cidrs.insert((id.clone(), *c));
                }
            }
        }
    }
    for id in store
        .keys()
        .filter(|id| !seen.contains_key(*id) && !guard.added_enis.contains(*id))
    {
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

/// PURE: the changes that make the store match EC2's `truth`, under rules 3, 4 and 7.
pub fn plan(store: &StoreView, truth: &[AttachedEni], guard: &RecentChanges) -> Plan {
    let freed = &guard.freed;
    let d = difference(store, truth, guard);
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

/// Where the cheap hint comes from. The EC2 provider answers from IMDS; any other provider
/// answers with its (cheap) source of truth.
pub trait ImdsView: Send + Sync {
    /// The ENIs and addresses as the cheap source sees them.
    fn hinted_enis(&self) -> impl Future<Output = Result<Vec<AttachedEni>, ProviderError>> + Send;
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
            subnet_excluded: false,
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

    /// Issue 38: without its release log a start assumes everything no pod holds was just
    /// released: free CIDRs of every ENI, and whole ENIs none of whose CIDRs is held, but
    /// never the primary or the trunk as an ENI.
    #[test]
    fn a_lost_release_log_assumes_every_unheld_cidr_and_eni_released() {
        let s = store(&[
            (
                "eni-p",
                &[("198.18.0.5/32", true), ("198.18.0.6/32", false)],
            ),
            (
                "eni-a",
                &[("198.18.0.7/32", false), ("198.18.0.8/32", false)],
            ),
            ("eni-b", &[("198.18.0.9/32", true)]),
            ("eni-t", &[]),
            ("eni-c", &[]),
        ]);
        let exempt: BTreeSet<String> = ["eni-p".to_owned(), "eni-t".to_owned()].into();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let got = RecentlyFreed::unknown_releases(&s, &exempt, at);
        let mut f = RecentlyFreed::default();
        for r in &got {
            f.record(r);
        }
        assert_eq!(
            f.cidrs(),
            [
                net("198.18.0.6/32"),
                net("198.18.0.7/32"),
                net("198.18.0.8/32")
            ]
            .into()
        );
        assert_eq!(f.enis(), ["eni-a".to_owned(), "eni-c".to_owned()].into());
        // What the start then withdraws: the assumed CIDRs and ENIs, nothing a pod holds.
        let (cidrs, enis) = f.withdrawable(&s);
        assert_eq!(enis, vec!["eni-a".to_owned(), "eni-c".to_owned()]);
        assert_eq!(cidrs, vec![("eni-p".to_owned(), net("198.18.0.6/32"))]);
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
            let guard = RecentChanges {
                freed: c.freed.clone(),
                freed_enis: no_enis.clone(),
                ..RecentChanges::default()
            };
            assert_eq!(plan(&c.store, &c.truth, &guard), c.want, "{}", c.name);
        }
    }

    #[test]
    fn recently_freed_keeps_releases_for_the_cooldown_and_withdraws_what_no_pod_holds() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut f = RecentlyFreed::default();
        f.record(&Release {
            eni_id: "eni-0".into(),
            cidrs: vec![net("198.18.0.21/32"), net("198.18.0.22/32")],
            whole_eni: false,
            at: t0,
        });
        f.record(&Release {
            eni_id: "eni-1".into(),
            cidrs: vec![net("198.18.0.32/28")],
            whole_eni: true,
            at: t0 + Duration::from_secs(100),
        });
        assert_eq!(
            f.cidrs(),
            [
                net("198.18.0.21/32"),
                net("198.18.0.22/32"),
                net("198.18.0.32/28")
            ]
            .into()
        );
        assert_eq!(f.enis(), ["eni-1".to_owned()].into());
        assert_eq!(RecentlyFreed::from_records(&f.records()), f, "side file");
        // At start, a lagging Describe registered them again: out, unless a pod holds one.
        let s = store(&[
            (
                "eni-0",
                &[
                    ("198.18.0.20/32", false),
                    ("198.18.0.21/32", false),
                    ("198.18.0.22/32", true),
                ],
            ),
            ("eni-1", &[("198.18.0.32/28", false)]),
        ]);
        assert_eq!(
            f.withdrawable(&s),
            (
                vec![("eni-0".to_owned(), net("198.18.0.21/32"))],
                vec!["eni-1".to_owned()]
            )
        );
        let mut g = RecentlyFreed::default();
        g.merge(&f);
        assert_eq!(g, f);
        f.expire(t0 + FREED_COOLDOWN);
        assert_eq!(
            f.cidrs(),
            [net("198.18.0.32/28")].into(),
            "the first expired"
        );
        f.expire(t0 - Duration::from_secs(1));
        assert!(!f.is_empty(), "a clock stepped back keeps them");
        f.expire(t0 + FREED_COOLDOWN + Duration::from_secs(100));
        assert!(f.is_empty());
    }

    #[test]
    fn difference_ignores_cooling_cidrs_and_sees_missing_ones() {
        let s = store(&[("eni-0", &[("198.18.0.20/32", false)])]);
        let hint = vec![eni("eni-0", 0, &["198.18.0.20", "198.18.0.21"], &[])];
        let cooling = RecentChanges {
            freed: [net("198.18.0.21/32")].into(),
            ..RecentChanges::default()
        };
        assert!(difference(&s, &hint, &cooling).is_empty());
        assert!(!difference(&s, &hint, &RecentChanges::default()).is_empty());
    }

    /// Rule 7 (seed 67 of the simulation): a Describe that lags behind the pool's own assign
    /// does not drop the addresses just assigned, nor an ENI just created; once the settle
    /// time has passed, an absence removes them as before. A later assign of a released CIDR
    /// ends its cooldown.
    #[test]
    fn a_view_lagging_behind_an_addition_removes_nothing_added() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let s = store(&[
            (
                "eni-0",
                &[("198.18.0.20/32", false), ("198.18.0.21/32", false)],
            ),
            ("eni-1", &[("198.18.0.40/32", false)]),
        ]);
        let lagging = vec![eni("eni-0", 0, &["198.18.0.20"], &[])];
        let mut added = RecentlyAdded::default();
        added.record(&Addition {
            eni_id: "eni-0".into(),
            cidrs: vec![net("198.18.0.21/32")],
            whole_eni: false,
            at: t0,
        });
        added.record(&Addition {
            eni_id: "eni-1".into(),
            cidrs: vec![net("198.18.0.40/32")],
            whole_eni: true,
            at: t0,
        });
        let freed = RecentlyFreed::default();
        assert_eq!(
            plan(&s, &lagging, &RecentChanges::of(&freed, &added)),
            Plan::default(),
            "nothing just added is dropped"
        );
        added.expire(t0 + ADDITION_SETTLE);
        assert_eq!(
            plan(&s, &lagging, &RecentChanges::of(&freed, &added)),
            Plan {
                remove_cidrs: vec![("eni-0".into(), net("198.18.0.21/32"))],
                remove_enis: vec!["eni-1".into()],
                ..Plan::default()
            },
            "after the settle time an absence is EC2's word again"
        );
        let mut f = RecentlyFreed::default();
        f.record(&Release {
            eni_id: "eni-0".into(),
            cidrs: vec![net("198.18.0.21/32"), net("198.18.0.22/32")],
            whole_eni: false,
            at: t0,
        });
        f.supersede(&[net("198.18.0.21/32")], t0 + Duration::from_secs(5));
        f.supersede(&[net("198.18.0.22/32")], t0 - Duration::from_secs(5));
        assert_eq!(
            f.cidrs(),
            [net("198.18.0.22/32")].into(),
            "an assign after the release ends its cooldown; one before it does not"
        );
    }
}
