//! A pod's AddNetwork and DelNetwork for every family it has (IPv4, IPv6 mode's /128, or both
//! for a dual-stack pod), decided by the IPAM service under one lock with one checkpoint write,
//! so the gRPC edge does not switch on the family and a pod never holds one family without the
//! other. Must not: know gRPC types, hold the lock across `.await`, touch the host.

use std::time::SystemTime;

use super::release::record_cooling;
use super::{Core, Ipam, IpamError};
use crate::config::AddressFamily;
use crate::datastore::{Assignment, IpamKey, PodMetadata, V6Assignment};

/// A pod's addresses: its IPv4 (IPv4 and dual-stack pods) and its IPv6 (IPv6 mode and
/// dual-stack pods).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAddresses {
    /// The IPv4 assignment.
    pub v4: Option<Assignment>,
    /// The IPv6 assignment.
    pub v6: Option<V6Assignment>,
}

impl Ipam {
    /// AddNetwork: the addresses of `key` for the node's pod `family` (the same ones on a
    /// repeated call). IPv4 and dual-stack pods may wait for the pool manager
    /// ([`Self::add`]); a dual-stack pod gets both addresses in one step or neither.
    pub async fn add_pod(
        &self,
        family: AddressFamily,
        key: &IpamKey,
        metadata: PodMetadata,
    ) -> Result<PodAddresses, IpamError> {
        match family {
            AddressFamily::V6 => self.add_v6(key, metadata).map(|v6| PodAddresses {
                v4: None,
                v6: Some(v6),
            }),
            AddressFamily::V4 | AddressFamily::DualStack => {
                let dual = family == AddressFamily::DualStack;
                let (v4, v6) = self.add_families(key, metadata, dual).await?;
                Ok(PodAddresses { v4: Some(v4), v6 })
            }
        }
    }

    /// DelNetwork: releases every address `key` holds (into cooldown), both families in one
    /// step with one checkpoint write; a failed write puts everything back. Falls back to the
    /// keys only this sandbox can hold ([`Self::del_candidates`]); an entry recovered from host
    /// state that only the pod name matches is left to `reclaim`. Unknown pod when neither
    /// family holds anything for the sandbox.
    pub fn del_pod(
        &self,
        key: &IpamKey,
        pod_namespace: &str,
        pod_name: &str,
        reason: &str,
    ) -> Result<PodAddresses, IpamError> {
        self.metrics.del_ip_req(reason);
        let now = self.now();
        let mut core = self.core();
        let held_v4 = |core: &Core, k: &IpamKey| {
            core.ds.lookup(k).is_some() || core.ds.pending().iter().any(|p| &p.key == k)
        };
        let held_v6 = |core: &Core, k: &IpamKey| core.v6.lookup(k).is_some();
        let candidates = self.del_candidates(key);
        let v4_key = candidates.iter().find(|k| held_v4(&core, k)).cloned();
        let v6_key = candidates.iter().find(|k| held_v6(&core, k)).cloned();
        if v4_key.is_none() && v6_key.is_none() {
            let recovered = self
                .recovered_by_pod_name(pod_namespace, pod_name)
                .filter(|k| held_v4(&core, k) || held_v6(&core, k));
            drop(core);
            self.ask_reclaim(key, recovered);
            return Err(IpamError::UnknownPod(key.clone()));
        }
        let released = Self::release_both(&mut core, v4_key.as_ref(), v6_key.as_ref(), now)?;
        drop(core);
        self.refresh_gauges();
        self.offer_to_waiters();
        Ok(released)
    }

    /// Releases the given keys' addresses and writes the checkpoint once; on a failed write
    /// both families are put back exactly as they were.
    fn release_both(
        core: &mut Core,
        v4_key: Option<&IpamKey>,
        v6_key: Option<&IpamKey>,
        now: SystemTime,
    ) -> Result<PodAddresses, IpamError> {
        let details = v4_key.and_then(|k| core.ds.assignment_details(k));
        let before_v6 = v6_key.map(|_| core.v6.clone());
        let v4 = match v4_key {
            Some(k) => Some(
                core.ds
                    .unassign(k, now)
                    .map_err(|e| IpamError::Internal(e.to_string()))?,
            ),
            None => None,
        };
        let put_back_v4 = |core: &mut Core| {
            if let (Some(k), Some(a), Some((metadata, at))) = (v4_key, &v4, details.clone()) {
                core.ds.reassign_exact(k, a.ip, metadata, at);
            }
        };
        let v6 = match v6_key {
            Some(k) => match core.v6.unassign(k, now) {
                Ok(a) => Some(a),
                Err(e) => {
                    put_back_v4(core);
                    return Err(super::v6::v6_error(e));
                }
            },
            None => None,
        };
        if let Err(e) = core.persist() {
            put_back_v4(core);
            if let Some(before) = before_v6 {
                core.v6 = before;
            }
            tracing::error!(error = %e, v4 = ?v4_key, v6 = ?v6_key, "checkpoint write failed; release rolled back");
            return Err(IpamError::CheckpointFailed(e.to_string()));
        }
        record_cooling(core, now);
        Ok(PodAddresses { v4, v6 })
    }
}
