//! Start-up of the IPAM service: registering the provider's ENIs, restoring the checkpoint and
//! both families' cooldowns, and recovering from host evidence the addresses pods use, IPv4 and
//! IPv6, by one decision (`decide`; the host is read on every start). Must not: serve, talk to
//! the pool loop, touch the host itself (the evidence is handed in).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::pool::Pool;
use super::{Clock, Core, Ipam, IpamError, IpamSettings};
use crate::datastore::checkpoint::{Checkpoint, CheckpointData, CheckpointEntry};
use crate::datastore::{
    DataStore, DatastoreError, EniIdentity, IpamKey, PodMetadata, RECOVERED_IF_NAME,
    RECOVERED_NETWORK_NAME, V6Store,
};
use crate::metrics::Metrics;
use ipam_core::pool::ec2_port::{AttachedEni, NodeDescription};

/// How startup found the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreOutcome {
    /// No file and no pod on the host: fresh node.
    Fresh,
    /// No file, but the host shows pods: their addresses were recovered as assignments.
    MissingRecoveredFromHost {
        /// Assignments rebuilt from host state.
        recovered: usize,
    },
    /// Restored; counts of entries placed, pending and rejected (duplicates), and of addresses
    /// the host shows in use that the file did not hold (recovered as assignments).
    Restored {
        /// Entries on known ENIs.
        placed: usize,
        /// Entries kept pending verification.
        pending: usize,
        /// Duplicate entries skipped.
        rejected: usize,
        /// Host-used addresses missing from the file, recovered.
        from_host: usize,
    },
    /// The file was unreadable; assignments were rebuilt from host state.
    RecoveredFromHost {
        /// The load error.
        error: String,
        /// Assignments rebuilt.
        recovered: usize,
    },
}

/// Host-side evidence of pods, read at every start: `(pod IP, device)` for every `/32` route in
/// the host's main table and every `/128` IPv6 route (any device), and `(pod IP, "")` for an
/// address that only a pod rule (512 `to <ip>` / 1536 `from <ip>`) names.
pub type HostPodRoutes = Vec<(IpAddr, String)>;

fn has_prefix(dev: &str, veth_prefix: &str) -> bool {
    !veth_prefix.is_empty() && dev.starts_with(veth_prefix)
}

/// Where an address lies with respect to the pod addresses this node hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// In one of this node's CIDRs (IPv4: a CIDR of a registered ENI; IPv6: a registered /80).
    Ours,
    /// In none of them, and the node knows all of them (IPv4: every ENI is registered at start).
    NotOurs,
    /// In none known yet, and more may come (IPv6: the /80s are registered after start, at
    /// IPv6 node init or a dual-stack pod's first ADD on an ENI).
    NotKnownYet,
}

/// One piece of host evidence (a route, or a pod rule alone) as the start-up decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evidence<'a> {
    /// The device of a route naming the address; "" when only a pod rule names it.
    pub device: &'a str,
    /// Where the address lies.
    pub space: Space,
    /// An index already holds the address.
    pub held: bool,
}

/// What start-up does with an address the host shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Held now as a recovered entry (never handed out until `reclaim` sees its pod gone).
    Recover,
    /// Held as a recovered entry once a CIDR of this node holds it ([`V6Store::defer`]).
    Defer,
    /// Not a pod address of this node (or held already).
    Ignore,
}

/// What the host evidence `e` means, one rule for both families: an address in this node's
/// address space that no index holds is a pod's, whatever the device of its route or with a
/// pod rule alone (the pod may have been wired under another veth prefix: an older conflist's,
/// or one the env disagrees with); so is one routed through a device with the configured veth
/// prefix (wherever it lies: kept pending until its CIDR is known). Where the space is not
/// known yet (IPv6 at start), a pod rule is a pod's too (only the plugin installs pod rules),
/// but a route through another device waits until it is ([`Verdict::Defer`]): the kernel
/// routes the node's own /128s and the subnet-router anycast through its ENI devices. A route
/// and a rule of one address in a known space count alike, so evidence the host reader folds
/// together (it keeps a rule only for an address no route names) loses nothing. Pure.
#[must_use]
pub fn decide(e: Evidence<'_>, veth_prefix: &str) -> Verdict {
    let rule = e.device.is_empty();
    let prefixed = !rule && has_prefix(e.device, veth_prefix);
    match (e.held, e.space) {
        (true, _) => Verdict::Ignore,
        (false, Space::Ours) => Verdict::Recover,
        (false, _) if prefixed => Verdict::Recover,
        (false, Space::NotKnownYet) if rule => Verdict::Recover,
        (false, Space::NotKnownYet) => Verdict::Defer,
        (false, Space::NotOurs) => Verdict::Ignore,
    }
}

/// The indexes start-up recovers into; `None` leaves that family out.
#[derive(Debug, Clone, Copy)]
pub struct Indexes<'a> {
    /// The IPv4 index.
    pub v4: Option<&'a DataStore>,
    /// The IPv6 index.
    pub v6: Option<&'a V6Store>,
}

impl Indexes<'_> {
    /// The evidence a route through `device` ("" for a pod rule alone) naming `ip` gives, or
    /// `None` when `ip`'s family is left out.
    #[must_use]
    pub fn evidence<'d>(&self, ip: IpAddr, device: &'d str) -> Option<Evidence<'d>> {
        match ip {
            IpAddr::V4(ip) => self.v4.map(|ds| Evidence {
                device,
                space: if ds.holds_cidr_of(ip) {
                    Space::Ours
                } else {
                    Space::NotOurs
                },
                held: ds.holder_of(ip).is_some(),
            }),
            IpAddr::V6(ip) => self.v6.map(|v6| Evidence {
                device,
                space: if v6.prefixes().iter().any(|p| p.net.contains(&ip)) {
                    Space::Ours
                } else {
                    Space::NotKnownYet
                },
                // A deferred entry waits for its /80: already kept.
                held: v6.holds(ip) || v6.deferred().iter().any(|e| e.ipv6() == Some(ip)),
            }),
        }
    }

    /// The addresses `host` shows in use by pods that the indexes do not hold yet, sorted,
    /// each with what to do ([`decide`]: `Recover` or `Defer`; `Recover` when any evidence of
    /// the address says so) and the device of a route that names it ("" for rule-only
    /// evidence; a route that counts is preferred, as the recovered key names its veth).
    #[must_use]
    pub fn used_by_pods(
        &self,
        host: &HostPodRoutes,
        veth_prefix: &str,
    ) -> BTreeMap<IpAddr, (String, Verdict)> {
        let mut out = BTreeMap::<IpAddr, (String, Verdict)>::new();
        for (ip, dev) in host {
            let v = self
                .evidence(*ip, dev)
                .map_or(Verdict::Ignore, |e| decide(e, veth_prefix));
            if v == Verdict::Ignore {
                continue;
            }
            let slot = out.entry(*ip).or_insert_with(|| (dev.clone(), v));
            if slot.0.is_empty() {
                slot.0.clone_from(dev);
            }
            if v == Verdict::Recover {
                slot.1 = Verdict::Recover;
            }
        }
        out
    }
}

/// The IPv4 addresses `host` shows in use by pods that `ds` does not hold yet (`decide`: IPv4 knows
/// its whole address space at start, so nothing is deferred). Pure.
#[must_use]
pub fn host_used(
    ds: &DataStore,
    host: &HostPodRoutes,
    veth_prefix: &str,
) -> Vec<(Ipv4Addr, String)> {
    let indexes = Indexes {
        v4: Some(ds),
        v6: None,
    };
    indexes
        .used_by_pods(host, veth_prefix)
        .into_iter()
        .filter_map(|(ip, (dev, _))| match ip {
            IpAddr::V4(ip) => Some((ip, dev)),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// The IPv6 addresses `host` shows in use by pods that `v6` does not hold yet, with what to do
/// (`decide`: the same rule as IPv4; an address outside every registered /80 and not routed through
/// a veth of the configured prefix is deferred (`Verdict::Defer`)). Pure.
#[must_use]
pub fn host_used_v6(
    v6: &V6Store,
    host: &HostPodRoutes,
    veth_prefix: &str,
) -> Vec<(Ipv6Addr, String, Verdict)> {
    let indexes = Indexes {
        v4: None,
        v6: Some(v6),
    };
    indexes
        .used_by_pods(host, veth_prefix)
        .into_iter()
        .filter_map(|(ip, (dev, v))| match ip {
            IpAddr::V6(ip) => Some((ip, dev, v)),
            IpAddr::V4(_) => None,
        })
        .collect()
}

/// Why the host's pod evidence could not be read (the reader's error).
pub type HostUnreadable = Box<dyn std::error::Error + Send + Sync>;

/// The recovered key of a host-used address: the host veth when a route names one, else
/// `rule-<ip>`.
#[must_use]
pub fn recovered_key(ip: IpAddr, device: &str) -> IpamKey {
    let id = if device.is_empty() {
        format!("rule-{ip}")
    } else {
        device.to_owned()
    };
    IpamKey::new(RECOVERED_NETWORK_NAME, &id, RECOVERED_IF_NAME)
}

/// Recovered entries for host-used addresses (either family): keyed by [`recovered_key`],
/// or `<device>@<ip>` when that key is `taken` or repeats (two addresses through one veth).
fn recovered_entries(
    used: impl IntoIterator<Item = (IpAddr, String)>,
    taken: impl Fn(&IpamKey) -> bool,
    now: SystemTime,
) -> Vec<CheckpointEntry> {
    let mut ids = std::collections::BTreeSet::new();
    used.into_iter()
        .map(|(ip, dev)| {
            let mut key = recovered_key(ip, &dev);
            if taken(&key) || !ids.insert(key.clone()) {
                key.container_id = format!("{dev}@{ip}");
            }
            match ip {
                IpAddr::V4(ip) => CheckpointEntry::new(key, ip, PodMetadata::default(), now),
                IpAddr::V6(ip) => CheckpointEntry::new_v6(key, ip, PodMetadata::default(), now),
            }
        })
        .collect()
}

/// Adds every host-used address the indexes do not hold as a recovered assignment (never
/// handed out until `reclaim` sees its pod gone): one decision for both families
/// ([`Indexes::used_by_pods`]), IPv4 ones to `ds`, IPv6 ones to `v6` (deferred ones until a
/// /80 holding them is registered), keyed alike so a dual-stack pod's two recovered entries
/// share its veth's key. Returns how many are held now (deferred ones are not counted: most are
/// the node's own addresses).
fn recover_all(
    ds: &mut DataStore,
    v6: &mut V6Store,
    host: &HostPodRoutes,
    veth_prefix: &str,
    now: SystemTime,
) -> usize {
    let used = Indexes {
        v4: Some(ds),
        v6: Some(v6),
    }
    .used_by_pods(host, veth_prefix);
    let deferred: BTreeSet<IpAddr> = used
        .iter()
        .filter(|(_, (_, v))| *v == Verdict::Defer)
        .map(|(ip, _)| *ip)
        .collect();
    let (four, six): (Vec<_>, Vec<_>) = used
        .into_iter()
        .map(|(ip, (dev, _))| (ip, dev))
        .partition(|(ip, _)| ip.is_ipv4());
    let four = recovered_entries(four, |k| ds.lookup(k).is_some(), now);
    let (later, six): (Vec<_>, Vec<_>) = recovered_entries(six, |k| v6.lookup(k).is_some(), now)
        .into_iter()
        .partition(|e| e.ip().is_some_and(|ip| deferred.contains(&ip)));
    let offered = four.len() + six.len();
    let rejected = ds.restore(&CheckpointData::new(four)).len() + v6.restore(&six).len();
    if !later.is_empty() {
        let ips: Vec<String> = later.iter().map(|e| e.ipv6.clone()).collect();
        tracing::info!(addresses = ?ips, "IPv6 addresses routed through a device without the veth prefix: held as a pod's once a /80 of this node holds them");
        v6.defer(later);
    }
    let left = Indexes {
        v4: Some(ds),
        v6: Some(v6),
    }
    .used_by_pods(host, veth_prefix);
    for ip in left.keys() {
        tracing::error!(%ip, "host-used address could not be recovered");
    }
    offered - rejected
}

/// Released addresses of one family with their release time.
type Cooling<A> = Vec<(A, SystemTime)>;

/// Splits recorded cooldowns by family.
fn split_families(cooling: Cooling<IpAddr>) -> (Cooling<Ipv4Addr>, Cooling<Ipv6Addr>) {
    let mut four = Vec::new();
    let mut six = Vec::new();
    for (ip, t) in cooling {
        match ip {
            IpAddr::V4(ip) => four.push((ip, t)),
            IpAddr::V6(ip) => six.push((ip, t)),
        }
    }
    (four, six)
}

fn spec_of(e: &AttachedEni) -> EniIdentity {
    EniIdentity {
        id: e.id.clone(),
        device_number: e.device_number,
        network_card: e.network_card,
        is_primary: e.is_primary,
        is_trunk: e.is_trunk,
        is_efa: e.is_efa,
        is_excluded: e.is_excluded,
        subnet_id: e.subnet_id.clone(),
        subnet: e.subnet,
        mac: e.mac.clone(),
        primary_ip: e.primary_ip,
    }
}

/// Registers an attached ENI and its addresses in the datastore, host-ready as given (the
/// pool loop sets up and marks a not-ready one).
pub(super) fn register_eni(
    ds: &mut DataStore,
    e: &AttachedEni,
    host_ready: bool,
    now: SystemTime,
) -> Result<(), DatastoreError> {
    ds.add_eni(spec_of(e), now)?;
    ds.set_host_ready(&e.id, host_ready)?;
    for ip in &e.secondary_ips {
        ds.add_cidr(&e.id, ipnet::Ipv4Net::from(*ip), false)?;
    }
    for p in &e.prefixes {
        ds.add_cidr(&e.id, *p, true)?;
    }
    Ok(())
}

/// One card's pool restored at start: its checkpoint (or the host evidence in its CIDRs when
/// the file is missing or unreadable), its cooldowns and release log (the side file, read this
/// once). An unreadable file is set aside. Pure but for the checkpoint's I/O.
/// What every pool's start-up shares.
struct StartOf<'a> {
    veth_prefix: &'a str,
    cooldown: Duration,
    now: SystemTime,
    metrics: &'a Arc<Metrics>,
}

fn restore_pool(
    card: u32,
    mut ds: DataStore,
    checkpoint: Box<dyn Checkpoint>,
    host: &HostPodRoutes,
    start: &StartOf<'_>,
) -> (Pool, RestoreOutcome) {
    let StartOf {
        veth_prefix,
        cooldown,
        now,
        metrics,
    } = *start;
    let mut v6 = V6Store::new(cooldown);
    // Cooldowns and releases recorded before the restart (side file, both families).
    let side = checkpoint.load_side();
    let (cool4, cool6) = split_families(side.cooling);
    ds.restore_cooling(&cool4);
    v6.restore_cooling(&cool6);
    let mut released = ipam_core::pool::reconcile_plan::RecentlyFreed::from_records(&side.freed);
    if let Some(t) = side.unknown_before {
        released.mark_unknown(t);
    }
    if side.lost {
        released.mark_unknown(now);
    }
    released.expire(now);
    // The host is consulted on every start, whatever the checkpoint says: a missing file
    // does not prove a fresh node, and a readable one may come from another node or an
    // older path. Addresses the host shows in use by pods are never handed out.
    let outcome = match checkpoint.load() {
        Ok(None) => {
            let recovered = recover_all(&mut ds, &mut v6, host, veth_prefix, now);
            if recovered == 0 {
                RestoreOutcome::Fresh
            } else {
                RestoreOutcome::MissingRecoveredFromHost { recovered }
            }
        }
        Ok(Some(data)) => {
            // IPv6 records go to the IPv6 index (kept in every mode: never lose a pod's
            // address), the others to the IPv4 datastore.
            let (v6_entries, v4_entries): (Vec<_>, Vec<_>) = data
                .allocations
                .iter()
                .cloned()
                .partition(|e| e.ipv4.is_empty() && e.ipv6().is_some());
            let v6_rejected = v6.restore(&v6_entries).len();
            let rejected_v4 = ds.restore(&CheckpointData::new(v4_entries));
            for r in &rejected_v4 {
                tracing::error!(card, key = %r.key, ip = %r.ipv4, "duplicate entry in the checkpoint skipped");
            }
            let rejected = rejected_v4.len() + v6_rejected;
            let pending = ds.pending().len();
            let placed = ds.assigned_count() - pending + v6.assigned_count();
            let from_host = recover_all(&mut ds, &mut v6, host, veth_prefix, now);
            RestoreOutcome::Restored {
                placed,
                pending,
                rejected,
                from_host,
            }
        }
        Err(load_err) => {
            let recovered = recover_all(&mut ds, &mut v6, host, veth_prefix, now);
            RestoreOutcome::RecoveredFromHost {
                error: load_err.to_string(),
                recovered,
            }
        }
    };
    // Within the cooldown of a lost release log (this start's, or an earlier one's still
    // recorded), every start takes what no pod holds as released: a view may lag behind a
    // release made before the loss, or one an instance made in between.
    let lost_log = released.unknown_before().is_some();
    if lost_log {
        // What was released before the loss is unknown, so everything no pod holds is taken
        // as released now (withdrawn before the socket serves, not put back by a lagging view
        // for FREED_COOLDOWN).
        let exempt: std::collections::BTreeSet<String> = ds
            .enis()
            .values()
            .filter(|e| e.spec.is_primary || e.spec.is_trunk || e.spec.is_efa || e.spec.is_excluded)
            .map(|e| e.spec.id.clone())
            .collect();
        let store = ipam_core::pool::reconcile_plan::store_view(&ds.usage());
        let assumed =
            ipam_core::pool::reconcile_plan::RecentlyFreed::unknown_releases(&store, &exempt, now);
        tracing::warn!(
            card,
            releases = assumed.len(),
            "the release log beside the checkpoint is unreadable (now, or within the last reconcile cooldown): every address and ENI no pod holds is taken as released just now and held out of the pool for the reconcile cooldown"
        );
        for r in &assumed {
            released.record(r);
        }
    }
    let mut checkpoint = checkpoint;
    if let RestoreOutcome::RecoveredFromHost { .. } = &outcome {
        match checkpoint.set_aside() {
            Ok(Some(p)) => {
                tracing::error!(card, path = %p.display(), "unreadable checkpoint kept aside");
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(card, error = %e, "could not keep the unreadable checkpoint aside");
            }
        }
    }
    let mut pool = Pool {
        card,
        ds,
        v6,
        checkpoint,
        released,
        metrics: metrics.clone(),
    };
    // The assumed releases are written at once (durably), so a restart within the cooldown
    // keeps them even before the next release rewrites the file.
    if lost_log && let Err(e) = pool.write_side(now) {
        tracing::warn!(card, error = %e, "the assumed releases could not be written beside the checkpoint");
    }
    (pool, outcome)
}

/// Host evidence split by card: each address goes to the pool whose CIDRs hold it (a card's
/// pods' addresses are that card's to recover), one of no pool's CIDRs to card 0's (index
/// 0: a pod route through a veth of the configured prefix is recovered there, pending).
fn split_evidence(dss: &[DataStore], host: HostPodRoutes) -> Vec<HostPodRoutes> {
    let mut out = vec![HostPodRoutes::new(); dss.len().max(1)];
    for (ip, dev) in host {
        let i = match ip {
            IpAddr::V4(v4) => dss.iter().position(|ds| ds.holds_cidr_of(v4)).unwrap_or(0),
            IpAddr::V6(_) => 0,
        };
        out[i].push((ip, dev));
    }
    out
}

impl Ipam {
    /// Builds the service with card 0's pool alone (no multi-NIC card serves pods): see
    /// [`Self::start_pools`]; returns card 0's outcome.
    pub fn start(
        described: NodeDescription,
        settings: IpamSettings,
        cooldown: Duration,
        checkpoint: Box<dyn Checkpoint>,
        host_routes: impl FnOnce() -> Result<HostPodRoutes, HostUnreadable>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, RestoreOutcome), IpamError> {
        let (ipam, mut outcomes) = Self::start_pools(
            described,
            settings,
            cooldown,
            vec![(0, checkpoint)],
            host_routes,
            clock,
            metrics,
        )?;
        Ok((ipam, outcomes.remove(0).1))
    }

    /// Builds the service from what the caller described (the node's ENIs and network, read from
    /// EC2/IMDS by the caller: the index does no I/O of its own but its checkpoints), one pool per
    /// serving card in `pools` (card 0 first, then ascending; each with its checkpoint): registers
    /// each card's ENIs in its pool (the ENIs of other cards are unmanaged), reads the host once
    /// and gives each pool the evidence in its CIDRs, restores every pool by the same rules
    /// (missing or unreadable file: recovered from the host evidence; unreadable: set aside) and
    /// rewrites its file. Returns each card's outcome, in `pools`' order.
    pub fn start_pools(
        described: NodeDescription,
        settings: IpamSettings,
        cooldown: Duration,
        pools: Vec<(u32, Box<dyn Checkpoint>)>,
        host_routes: impl FnOnce() -> Result<HostPodRoutes, HostUnreadable>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, Vec<(u32, RestoreOutcome)>), IpamError> {
        let NodeDescription {
            enis,
            network: node,
        } = described;
        if pools.first().map(|(card, _)| *card) != Some(0)
            || pools.windows(2).any(|w| w[0].0 >= w[1].0)
        {
            return Err(IpamError::Internal(
                "pools must be card 0 first, then ascending cards".into(),
            ));
        }
        let now = clock.now();
        let mut dss = Vec::new();
        for (card, _) in &pools {
            let mut ds = DataStore::new(cooldown);
            for e in enis.iter().filter(|e| e.network_card == *card) {
                register_eni(&mut ds, e, true, now).map_err(|e| {
                    IpamError::Internal(format!("network card {card}: register eni: {e}"))
                })?;
            }
            dss.push(ds);
        }
        let host = host_routes().map_err(|e| {
            IpamError::Internal(format!(
                "host state unreadable, cannot tell which addresses pods use: {e}"
            ))
        })?;
        let evidence = split_evidence(&dss, host);
        let mut restored = Vec::new();
        let mut outcomes = Vec::new();
        for (((card, checkpoint), ds), host) in pools.into_iter().zip(dss).zip(evidence) {
            let start = StartOf {
                veth_prefix: &settings.veth_prefix,
                cooldown,
                now,
                metrics: &metrics,
            };
            let (mut pool, outcome) = restore_pool(card, ds, checkpoint, &host, &start);
            pool.persist()
                .map_err(|e| IpamError::CheckpointFailed(format!("network card {card}: {e}")))?;
            restored.push(pool);
            outcomes.push((card, outcome));
        }
        let mut core = Core { pools: restored };
        core.settle_pending();
        let ipam = Self {
            index: super::Index::new(core, clock, metrics.clone()),
            signal: super::PoolSignal::new(),
            node_state: super::NodeState::default(),
            settings,
            node,
            metrics,
            reclaim_asks: super::ReclaimAsks::default(),
        };
        ipam.index.refresh_gauges();
        Ok((ipam, outcomes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::V6Prefix;

    const T0: Duration = Duration::from_secs(1_700_000_000);

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + T0
    }

    /// An index with one ENI holding 198.18.0.16/28 (a prefix) and 198.18.0.40, held by a pod.
    fn datastore() -> DataStore {
        let mut ds = DataStore::new(Duration::from_secs(30));
        ds.add_eni(
            EniIdentity {
                id: "eni-1".into(),
                device_number: 0,
                network_card: 0,
                is_primary: true,
                is_trunk: false,
                is_efa: false,
                is_excluded: false,
                subnet_id: "subnet-1".into(),
                subnet: "198.18.0.0/24".parse().unwrap(),
                mac: "02:00:00:00:00:01".into(),
                primary_ip: std::net::Ipv4Addr::new(198, 18, 0, 10),
            },
            now(),
        )
        .unwrap();
        ds.add_cidr("eni-1", "198.18.0.16/28".parse().unwrap(), true)
            .unwrap();
        ds.add_cidr("eni-1", "198.18.0.40/32".parse().unwrap(), false)
            .unwrap();
        let held = CheckpointEntry::new(
            IpamKey::new("aws-cni", "held", "eth0"),
            "198.18.0.40".parse().unwrap(),
            PodMetadata::default(),
            now(),
        );
        assert!(ds.restore(&CheckpointData::new(vec![held])).is_empty());
        ds
    }

    fn prefix80(net: &str) -> V6Prefix {
        V6Prefix {
            eni_id: "eni-1".into(),
            net: net.parse().unwrap(),
            device_number: 0,
            route_table: 254,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn what_the_host_shows_is_decided_by_one_rule_for_both_families() {
        use Space::{NotKnownYet, NotOurs, Ours};
        use Verdict::{Defer, Ignore, Recover};
        // (device, space, held, veth prefix) -> verdict
        #[rustfmt::skip]
        let table: &[(&str, Space, bool, &str, Verdict, &str)] = &[
            ("eni1a", NotOurs, false, "eni", Recover, "prefixed route, on no CIDR: kept pending"),
            ("eni1a", NotKnownYet, false, "eni", Recover, "prefixed route, IPv6 space unknown yet"),
            ("eni1a", Ours, false, "eni", Recover, "prefixed route in our space"),
            ("abc1a", Ours, false, "eni", Recover, "route through another prefix, in our space"),
            ("abc1a", NotOurs, false, "eni", Ignore, "route through another device, not ours"),
            ("abc1a", NotKnownYet, false, "eni", Defer, "another device, space unknown yet"),
            ("", Ours, false, "eni", Recover, "a pod rule alone, in our space"),
            ("", NotOurs, false, "eni", Ignore, "a pod rule alone, not ours"),
            ("", NotKnownYet, false, "eni", Recover, "a pod rule alone, space unknown: a pod's"),
            ("eni1a", Ours, true, "eni", Ignore, "already held"),
            ("", NotKnownYet, true, "eni", Ignore, "already held (or deferred)"),
            ("eni1a", NotOurs, false, "", Ignore, "no veth prefix configured matches nothing"),
            ("eni1a", NotKnownYet, false, "", Defer, "no veth prefix configured, space unknown"),
        ];
        for &(device, space, held, prefix, want, why) in table {
            let e = Evidence {
                device,
                space,
                held,
            };
            assert_eq!(decide(e, prefix), want, "{why}: {e:?} prefix {prefix:?}");
        }
    }

    #[test]
    fn the_address_space_of_each_family() {
        let ds = datastore();
        let mut v6 = V6Store::new(Duration::from_secs(30));
        v6.add_prefix(prefix80("2001:db8:0:101:1::/80"));
        let both = Indexes {
            v4: Some(&ds),
            v6: Some(&v6),
        };
        let six_only = Indexes {
            v4: None,
            v6: Some(&v6),
        };
        // (indexes, ip) -> (space, held); None when the family is left out
        type Row<'a> = (&'a Indexes<'a>, &'a str, Option<(Space, bool)>, &'a str);
        #[rustfmt::skip]
        let table: &[Row<'_>] = &[
            (&both, "198.18.0.17", Some((Space::Ours, false)), "in a /28 of an ENI"),
            (&both, "198.18.0.40", Some((Space::Ours, true)), "held"),
            (&both, "198.18.0.99", Some((Space::NotOurs, false)), "in the subnet, on no ENI"),
            (&both, "2001:db8:0:101:1::5", Some((Space::Ours, false)), "in a registered /80"),
            (&both, "2001:db8:0:101::10", Some((Space::NotKnownYet, false)), "in no /80 yet"),
            (&six_only, "198.18.0.17", None, "IPv4 left out"),
        ];
        for &(indexes, addr, want, why) in table {
            let got = indexes.evidence(ip(addr), "x").map(|e| (e.space, e.held));
            assert_eq!(got, want, "{why}: {addr}");
        }
    }

    #[test]
    fn a_v6_pod_under_another_veth_prefix_is_held_once_its_80_is_known() {
        // A dual-stack pod wired under the old prefix `abc`, its /128 in the /80 registered
        // later; the node's own /128 and the subnet-router anycast, both routed through eth0
        // (the kernel adds them: a DHCPv6 /128, forwarding on); a pod rule naming a /128; an
        // IPv4 rule outside every CIDR.
        let mut ds = datastore();
        let mut v6 = V6Store::new(Duration::from_secs(30));
        let host: HostPodRoutes = vec![
            (ip("198.18.0.18"), "abc0123".into()),
            (ip("2001:db8:0:101:1::1"), "abc0123".into()),
            (ip("2001:db8:0:101::10"), "eth0".into()),
            (ip("2001:db8:0:101::"), "eth0".into()),
            (ip("2001:db8:0:101:1::2"), String::new()),
            (ip("10.9.9.9"), String::new()),
        ];
        assert_eq!(
            host_used(&ds, &host, "eni"),
            vec![("198.18.0.18".parse().unwrap(), "abc0123".into())]
        );
        let six: Vec<(String, Verdict)> = host_used_v6(&v6, &host, "eni")
            .into_iter()
            .map(|(ip, _, v)| (ip.to_string(), v))
            .collect();
        assert_eq!(
            six,
            vec![
                ("2001:db8:0:101::".into(), Verdict::Defer),
                ("2001:db8:0:101::10".into(), Verdict::Defer),
                ("2001:db8:0:101:1::1".into(), Verdict::Defer),
                ("2001:db8:0:101:1::2".into(), Verdict::Recover),
            ]
        );

        assert_eq!(recover_all(&mut ds, &mut v6, &host, "eni", now()), 2);
        let veth_key = recovered_key(ip("198.18.0.18"), "abc0123");
        assert_eq!(
            ds.lookup(&veth_key).map(|a| a.ip),
            "198.18.0.18".parse().ok()
        );
        assert_eq!(
            v6.assigned_count(),
            1,
            "only the rule's address before its /80 is known"
        );
        assert_eq!(v6.deferred().len(), 3);
        assert_eq!(
            recover_all(&mut ds, &mut v6, &host, "eni", now()),
            0,
            "nothing twice"
        );

        // The pod's /80 is registered (IPv6 node init, or the ENI's first dual-stack ADD):
        // its two addresses are held before any address of it is handed out; the node's own
        // addresses never are.
        v6.add_prefix(prefix80("2001:db8:0:101:1::/80"));
        let held: Vec<(IpamKey, Ipv6Addr)> = v6
            .assignments()
            .into_iter()
            .map(|(k, _, a)| (k, a.ip))
            .collect();
        assert_eq!(
            held,
            vec![
                (veth_key, "2001:db8:0:101:1::1".parse().unwrap()),
                (
                    recovered_key(ip("2001:db8:0:101:1::2"), ""),
                    "2001:db8:0:101:1::2".parse().unwrap()
                ),
            ],
            "a dual-stack pod's two halves share its veth's key"
        );
        assert_eq!(v6.deferred().len(), 2, "the node's own /128s stay out");
        let next = v6
            .assign(
                &IpamKey::new("aws-cni", "new", "eth0"),
                PodMetadata::default(),
                None,
                now(),
            )
            .unwrap();
        assert_eq!(next.ip, "2001:db8:0:101:1::3".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn a_rule_of_an_address_also_routed_through_another_device_recovers_it_under_the_route() {
        let v6 = V6Store::new(Duration::from_secs(30));
        let host: HostPodRoutes = vec![
            (ip("2001:db8:0:101:1::1"), "abc0123".into()),
            (ip("2001:db8:0:101:1::1"), String::new()),
            (ip("2001:db8:0:101:1::2"), String::new()),
            (ip("2001:db8:0:101:1::2"), "abc4567".into()),
        ];
        let a = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        assert_eq!(
            host_used_v6(&v6, &host, "eni"),
            vec![
                (a("2001:db8:0:101:1::1"), "abc0123".into(), Verdict::Recover),
                (a("2001:db8:0:101:1::2"), "abc4567".into(), Verdict::Recover),
            ]
        );
    }

    #[test]
    fn recorded_cooldowns_split_by_family() {
        let t = now();
        let (four, six) = split_families(vec![
            (ip("198.18.0.5"), t),
            (ip("2001:db8::1"), t),
            (ip("198.18.0.6"), t),
        ]);
        assert_eq!(
            four,
            vec![
                ("198.18.0.5".parse().unwrap(), t),
                ("198.18.0.6".parse().unwrap(), t)
            ]
        );
        assert_eq!(six, vec![("2001:db8::1".parse().unwrap(), t)]);
    }
}
