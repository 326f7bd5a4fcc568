//! Start-up of the IPAM service: registering the provider's ENIs, restoring the checkpoint, and
//! recovering from host evidence the addresses pods use, IPv4 and IPv6 (read on every start).
//! Must not: serve, talk to the pool loop.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, watch};

use super::{Clock, Core, Ipam, IpamError, IpamSettings, PoolEvent};
use crate::datastore::checkpoint::{Checkpoint, CheckpointData, CheckpointEntry};
use crate::datastore::{
    DataStore, DatastoreError, EniSpec, IpamKey, PodMetadata, RECOVERED_IF_NAME,
    RECOVERED_NETWORK_NAME, V6Store,
};
use crate::metrics::Metrics;
use crate::pool::provider::{AttachedEni, EniProvider, ProviderError};

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

/// The host-used addresses `counts` accepts (given the address and its device, "" for rule-only
/// evidence), each with the device of a route that names one (preferred over rule-only
/// evidence), sorted.
fn used_by_pods(
    host: &HostPodRoutes,
    counts: impl Fn(IpAddr, &str) -> bool,
) -> std::collections::BTreeMap<IpAddr, String> {
    let mut out = std::collections::BTreeMap::<IpAddr, String>::new();
    for (ip, dev) in host.iter().filter(|(ip, dev)| counts(*ip, dev)) {
        let slot = out.entry(*ip).or_default();
        if slot.is_empty() {
            slot.clone_from(dev);
        }
    }
    out
}

fn has_prefix(dev: &str, veth_prefix: &str) -> bool {
    !veth_prefix.is_empty() && dev.starts_with(veth_prefix)
}

/// The addresses `host` shows in use by pods that `ds` does not hold yet, as recovered
/// entries. A route counts when its device has the configured veth prefix (the pod's address
/// may be on no ENI we know yet: kept pending) or, whatever the device (the prefix changed, or
/// the conflist and env disagree), when its address is on a CIDR we hold and could hand out.
/// A rule-only address counts too when it is on such a CIDR. Pure.
#[must_use]
pub fn host_used(
    ds: &DataStore,
    host: &HostPodRoutes,
    veth_prefix: &str,
) -> Vec<(Ipv4Addr, String)> {
    let counts = |ip: IpAddr, dev: &str| match ip {
        IpAddr::V4(ip) => {
            (ds.holds_cidr_of(ip) || (!dev.is_empty() && has_prefix(dev, veth_prefix)))
                && ds.holder_of(ip).is_none()
        }
        IpAddr::V6(_) => false,
    };
    used_by_pods(host, counts)
        .into_iter()
        .filter_map(|(ip, dev)| match ip {
            IpAddr::V4(ip) => Some((ip, dev)),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// The IPv6 addresses `host` shows in use by pods that `v6` does not hold yet: a `/128` route
/// through a device with the configured veth prefix, or a pod rule naming the address. (The
/// /80 prefixes are not known this early, so the device is what counts; an address outside
/// every prefix is never handed out anyway.) Pure.
#[must_use]
pub fn host_used_v6(
    v6: &V6Store,
    host: &HostPodRoutes,
    veth_prefix: &str,
) -> Vec<(Ipv6Addr, String)> {
    let counts = |ip: IpAddr, dev: &str| match ip {
        IpAddr::V6(ip) => (dev.is_empty() || has_prefix(dev, veth_prefix)) && !v6.holds(ip),
        IpAddr::V4(_) => false,
    };
    used_by_pods(host, counts)
        .into_iter()
        .filter_map(|(ip, dev)| match ip {
            IpAddr::V6(ip) => Some((ip, dev)),
            IpAddr::V4(_) => None,
        })
        .collect()
}

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
/// handed out until `reclaim` sees its pod gone): IPv4 ones to `ds`, IPv6 ones to `v6`, keyed
/// alike so a dual-stack pod's two recovered entries share its veth's key. Returns how many.
fn recover_all(
    ds: &mut DataStore,
    v6: &mut V6Store,
    host: &HostPodRoutes,
    veth_prefix: &str,
    now: SystemTime,
) -> usize {
    let widen = |(ip, dev): (Ipv4Addr, String)| (IpAddr::from(ip), dev);
    let v4 = recovered_entries(
        host_used(ds, host, veth_prefix).into_iter().map(widen),
        |k| ds.lookup(k).is_some(),
        now,
    );
    let six = recovered_entries(
        host_used_v6(v6, host, veth_prefix)
            .into_iter()
            .map(|(ip, dev)| (IpAddr::from(ip), dev)),
        |k| v6.lookup(k).is_some(),
        now,
    );
    let offered = v4.len() + six.len();
    let rejected = ds.restore(&CheckpointData::new(v4)).len() + v6.restore(&six).len();
    let left = host_used(ds, host, veth_prefix)
        .into_iter()
        .map(|(ip, _)| IpAddr::from(ip))
        .chain(
            host_used_v6(v6, host, veth_prefix)
                .into_iter()
                .map(|(ip, _)| ip.into()),
        );
    for ip in left {
        tracing::error!(%ip, "host-used address could not be recovered");
    }
    offered - rejected
}

fn spec_of(e: &AttachedEni) -> EniSpec {
    EniSpec {
        id: e.id.clone(),
        device_number: e.device_number,
        network_card: e.network_card,
        is_primary: e.is_primary,
        is_trunk: e.is_trunk,
        is_efa: e.is_efa,
        is_excluded: e.is_excluded,
        subnet_id: e.subnet_id.clone(),
        subnet: e.subnet,
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

impl<P: EniProvider> Ipam<P> {
    /// Builds the service: registers the provider's ENIs, restores the checkpoint (or recovers
    /// from `host_routes` when it is unreadable) and rewrites it.
    pub async fn start(
        provider: P,
        settings: IpamSettings,
        cooldown: Duration,
        checkpoint: Box<dyn Checkpoint>,
        host_routes: impl FnOnce() -> Result<HostPodRoutes, String>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, RestoreOutcome), IpamError> {
        let provider_err = |e: ProviderError| IpamError::Internal(format!("list enis: {e}"));
        let enis = provider.list_enis().await.map_err(provider_err)?;
        let node = provider.node_network().await.map_err(provider_err)?;
        let now = clock.now();
        let mut ds = DataStore::new(cooldown);
        let mut v6 = V6Store::new(cooldown);
        for e in &enis {
            register_eni(&mut ds, e, true, now)
                .map_err(|e| IpamError::Internal(format!("register eni: {e}")))?;
        }
        ds.restore_cooling(&checkpoint.load_cooling());
        // The host is consulted on every start, whatever the checkpoint says: a missing file
        // does not prove a fresh node, and a readable one may come from another node or an
        // older path (issue 15). Addresses the host shows in use by pods are never handed out.
        let host = host_routes().map_err(|e| {
            IpamError::Internal(format!(
                "host state unreadable, cannot tell which addresses pods use: {e}"
            ))
        })?;
        let outcome = match checkpoint.load() {
            Ok(None) => {
                let recovered = recover_all(&mut ds, &mut v6, &host, &settings.veth_prefix, now);
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
                let data = CheckpointData::new(v4_entries);
                let rejected = ds.restore(&data).len() + v6_rejected;
                let pending = ds.pending().len();
                let placed = ds.assigned_count() - pending + v6.assigned_count();
                let from_host = recover_all(&mut ds, &mut v6, &host, &settings.veth_prefix, now);
                RestoreOutcome::Restored {
                    placed,
                    pending,
                    rejected,
                    from_host,
                }
            }
            Err(load_err) => {
                let recovered = recover_all(&mut ds, &mut v6, &host, &settings.veth_prefix, now);
                RestoreOutcome::RecoveredFromHost {
                    error: load_err.to_string(),
                    recovered,
                }
            }
        };
        let mut checkpoint = checkpoint;
        if let RestoreOutcome::RecoveredFromHost { .. } = &outcome {
            match checkpoint.set_aside() {
                Ok(Some(p)) => {
                    tracing::error!(path = %p.display(), "unreadable checkpoint kept aside")
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, "could not keep the unreadable checkpoint aside")
                }
            }
        }
        let mut core = Core { ds, v6, checkpoint };
        core.persist()
            .map_err(|e| IpamError::CheckpointFailed(e.to_string()))?;
        let (events, _) = watch::channel(PoolEvent::default());
        let ipam = Self {
            core: Mutex::new(core),
            provider,
            settings,
            node,
            clock,
            metrics,
            demand: Notify::new(),
            waiting: AtomicU32::new(0),
            pool_busy: AtomicU32::new(0),
            shutting_down: AtomicBool::new(false),
            events,
            del_seen: Mutex::new(std::collections::BTreeSet::new()),
            reclaim_wake: Notify::new(),
            live_max_pods: AtomicU32::new(0),
        };
        ipam.refresh_gauges();
        Ok((ipam, outcome))
    }
}
