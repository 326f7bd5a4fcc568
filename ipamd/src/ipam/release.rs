//! The releasing intents of the IPAM service: DelNetwork's release (the keys only this sandbox
//! can hold, the recovered entries matched by pod name only and handed to `reclaim`), and
//! `reclaim`'s release of an address whose pod is gone, with the fence kept while its rules go.
//! Each change checkpointed before it is answered, rolled back when the write fails. Must not:
//! hold the lock across `.await`, know gRPC types, touch the host.

use std::net::Ipv4Addr;
use std::time::SystemTime;

use super::pool::Pool;
use super::{Assignment, Ipam, IpamError};
use crate::datastore::{IpamKey, RECOVERED_IF_NAME, RECOVERED_NETWORK_NAME};

impl Ipam {
    /// Releases `key`'s address `ip` (either family) for the reclaim loop (the pod is gone and
    /// its DEL never came), only if `key` still holds `ip` and was not given it again since
    /// `seen_assigned_at`. Returns whether it released. An IPv4 stays fenced until
    /// [`Self::unfence`] (the caller removes the gone pod's rules first); either cools down as
    /// after a DEL.
    pub fn reclaim(
        &self,
        key: &IpamKey,
        ip: impl Into<std::net::IpAddr>,
        seen_assigned_at: SystemTime,
    ) -> Result<bool, IpamError> {
        match ip.into() {
            std::net::IpAddr::V4(v4) => self.reclaim_v4(key, v4, seen_assigned_at),
            std::net::IpAddr::V6(v6) => self.reclaim_v6(key, v6, seen_assigned_at),
        }
    }

    /// DelNetwork of the IPv4 half alone: releases `key`'s address (into cooldown). Falls back to
    /// the keys of assignments recovered from host state or migrated from the CRI-era checkpoint.
    /// Test builds only: the daemon releases every family of a pod at once ([`Self::del_pod`]).
    #[cfg(any(test, feature = "fake"))]
    pub fn del(
        &self,
        key: &IpamKey,
        pod_namespace: &str,
        pod_name: &str,
        reason: &str,
    ) -> Result<Assignment, IpamError> {
        self.metrics.del_ip_req(reason);
        let now = self.now();
        let mut core = self.index.core();
        let Some(found) = self
            .del_candidates(key)
            .into_iter()
            .find(|k| core.pools[0].holds_v4(k))
        else {
            let by_pod_name = self.recovered_by_pod_name(pod_namespace, pod_name);
            let recovered = by_pod_name.filter(|k| core.pools[0].holds_v4(k));
            drop(core);
            self.ask_reclaim(key, recovered);
            return Err(IpamError::UnknownPod(key.clone()));
        };
        let a = Self::release(&mut core.pools[0], &found, now)?;
        drop(core);
        self.index.refresh_gauges();
        self.offer_to_waiters();
        Ok(a)
    }

    /// The keys DelNetwork of `key` may release: its own, the CRI-era migration key (by container
    /// id), and a recovered entry whose veth is named after this container id — keys that can only
    /// be this sandbox's.
    pub(super) fn del_candidates(&self, key: &IpamKey) -> [IpamKey; 3] {
        let container_veth = dataplane::conventions::host_veth_name_for_container(
            &self.settings.veth_prefix,
            &key.container_id,
            &key.if_name,
        );
        [
            key.clone(),
            IpamKey::new("_migrated-from-cri", &key.container_id, "unknown"),
            IpamKey::new(RECOVERED_NETWORK_NAME, &container_veth, RECOVERED_IF_NAME),
        ]
    }

    /// The recovered key whose veth is named after the pod (namespace/name), if a pod is named.
    /// Such an entry may belong to another sandbox of the same pod (a StatefulSet pod
    /// re-created before its old sandbox was deleted), so a DEL must not release it: it is
    /// released by `reclaim` as soon as the host shows neither its route nor its veth, which
    /// this DEL's teardown removes if the sandbox was the owner.
    pub(super) fn recovered_by_pod_name(&self, namespace: &str, name: &str) -> Option<IpamKey> {
        (!name.is_empty()).then(|| {
            let veth =
                dataplane::conventions::host_veth_name(&self.settings.veth_prefix, namespace, name);
            IpamKey::new(RECOVERED_NETWORK_NAME, &veth, RECOVERED_IF_NAME)
        })
    }

    /// Asks `reclaim` to look at `recovered` (held, matched by pod name only) now.
    pub(super) fn ask_reclaim(&self, key: &IpamKey, recovered: Option<IpamKey>) {
        let Some(recovered) = recovered else { return };
        tracing::info!(%key, %recovered, "DelNetwork of a pod recovered from host state, matched by pod name only: released once its veth and route are gone");
        self.reclaim_asks.ask(recovered);
    }

    /// Releases `key`'s address into cooldown and writes the checkpoint; a failed write puts
    /// the assignment back exactly as it was.
    fn release(pool: &mut Pool, key: &IpamKey, now: SystemTime) -> Result<Assignment, IpamError> {
        let details = pool.ds.assignment_details(key);
        let a = pool
            .ds
            .unassign(key, now)
            .map_err(|e| IpamError::Internal(e.to_string()))?;
        if let Err(e) = pool.persist() {
            if let Some((metadata, at)) = details {
                pool.ds.reassign_exact(key, a.ip, metadata, at);
            }
            tracing::error!(card = pool.card, error = %e, %key, "checkpoint write failed; release rolled back");
            return Err(IpamError::CheckpointFailed(e.to_string()));
        }
        pool.record_cooling(now);
        Ok(a)
    }

    /// Releases `key`'s address for the reclaim loop (`reclaim`) (the pod is gone and its DEL never
    /// came), only if `key` still holds `ip` (on a known ENI, or pending: a pending entry of a gone
    /// pod is simply dropped). Returns whether it released. A released address stays fenced (never
    /// handed out) until [`Self::unfence`]: the caller removes the gone pod's rules first.
    /// `seen_assigned_at` is the assignment time the decision saw: a retried ADD since then (which
    /// refreshes it) cancels the release.
    fn reclaim_v4(
        &self,
        key: &IpamKey,
        ip: Ipv4Addr,
        seen_assigned_at: SystemTime,
    ) -> Result<bool, IpamError> {
        let now = self.now();
        let mut core = self.index.core();
        // The pool (card) where `key` holds `ip`: a multi-NIC pod holds one per card.
        let Some(pool) = core.pools.iter_mut().find(|p| {
            p.ds.lookup(key).map(|a| a.ip) == Some(ip)
                || p.ds.pending().iter().any(|e| &e.key == key && e.ip == ip)
        }) else {
            return Ok(false);
        };
        if pool
            .ds
            .assignment_details(key)
            .is_some_and(|(_, at)| at > seen_assigned_at)
        {
            return Ok(false);
        }
        Self::release(pool, key, now)?;
        pool.ds.fence_unheld(&[ip]);
        drop(core);
        self.index.refresh_gauges();
        self.offer_to_waiters();
        Ok(true)
    }

    /// Recovered entries a DelNetwork matched by pod name only (see `Self::del`); forgets those no
    /// longer held.
    pub fn del_seen(&self) -> std::collections::BTreeSet<IpamKey> {
        let core = self.index.core();
        self.reclaim_asks.retain(|k| {
            core.pools
                .iter()
                .any(|p| p.ds.lookup(k).is_some() || p.v6.lookup(k).is_some())
        })
    }

    /// Of `ips` (addresses named by pod rules on the host), fences and returns those no pod
    /// holds: their rules are stale and may be deleted until [`Self::unfence`].
    /// Every card's pool decides for the addresses of its own CIDRs; one of no pool's CIDR
    /// is decided by card 0's (it fences what it holds in none).
    pub fn fence_unheld(&self, ips: &[Ipv4Addr]) -> Vec<Ipv4Addr> {
        let mut core = self.index.core();
        let held_anywhere = |core: &super::Core, ip: Ipv4Addr| {
            core.pools.iter().any(|p| p.ds.holder_of(ip).is_some())
        };
        let unheld: Vec<Ipv4Addr> = ips
            .iter()
            .copied()
            .filter(|ip| !held_anywhere(&core, *ip))
            .collect();
        let mut out = Vec::new();
        for ip in unheld {
            let i = core
                .pools
                .iter()
                .position(|p| p.ds.holds_cidr_of(ip))
                .unwrap_or(0);
            out.extend(core.pools[i].ds.fence_unheld(&[ip]));
        }
        out
    }

    /// Lifts a fence set by [`Self::fence_unheld`] or [`Self::reclaim`].
    pub fn unfence(&self, ips: &[Ipv4Addr]) {
        for pool in &mut self.index.core().pools {
            pool.ds.unfence(ips);
        }
        self.offer_to_waiters();
    }
}

/// Recovered entries a DelNetwork matched only through the pod-name veth, handed to `reclaim`:
/// released as soon as the host shows neither their route nor their veth.
#[derive(Debug, Default)]
pub struct ReclaimAsks {
    seen: std::sync::Mutex<std::collections::BTreeSet<IpamKey>>,
    wake: tokio::sync::Notify,
}

impl ReclaimAsks {
    fn seen(&self) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<IpamKey>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks `reclaim` to look at `recovered` now.
    fn ask(&self, recovered: IpamKey) {
        self.seen().insert(recovered);
        self.wake.notify_one();
    }

    /// Keeps the entries `held` says are still held; returns them.
    fn retain(&self, held: impl Fn(&IpamKey) -> bool) -> std::collections::BTreeSet<IpamKey> {
        let mut seen = self.seen();
        seen.retain(|k| held(k));
        seen.clone()
    }

    /// Resolves when a DelNetwork asked `reclaim` to look at a recovered entry.
    pub async fn wanted(&self) {
        self.wake.notified().await;
    }
}
