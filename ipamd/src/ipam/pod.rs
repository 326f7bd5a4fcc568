//! A pod's AddNetwork and DelNetwork for every family it has (IPv4, IPv6 mode's /128, or both
//! for a dual-stack pod), decided by the IPAM service under one lock with one checkpoint write,
//! so the gRPC edge does not switch on the family and a pod never holds one family without the
//! other. Must not: know gRPC types, hold the lock across `.await`, touch the host.

use std::time::SystemTime;

use super::{Core, Ipam, IpamError};
use crate::config::AddressFamily;
use crate::datastore::{Assignment, IpamKey, PodMetadata, V6Assignment};

/// A pod's addresses: its IPv4 (IPv4 and dual-stack pods), its IPv6 (IPv6 mode and
/// dual-stack pods), and a multi-NIC pod's addresses on the other cards.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodAddresses {
    /// The IPv4 assignment: card 0's; for a pod without the multi-NIC annotation, the card's that
    /// gave it when card 0 had none (`super::multi_nic`'s fallback); in a DelNetwork answer, card
    /// 0's only (the other cards' are in `cards`).
    pub v4: Option<Assignment>,
    /// The IPv6 assignment.
    pub v6: Option<V6Assignment>,
    /// The addresses on the cards other than 0 (multi-NIC pods), in card order.
    pub cards: super::CardAssignments,
}

/// One IPv4 released by [`Ipam::release_all`], to put back: the pool's index, the key, the
/// assignment, and its metadata and assignment time.
type Released = (
    usize,
    IpamKey,
    Assignment,
    Option<(PodMetadata, SystemTime)>,
);

impl Ipam {
    /// AddNetwork: the addresses of `key` for the node's pod `family` (the same ones on a repeated
    /// call). IPv4 and dual-stack pods may wait for the pool manager (`Self::add`); a dual-stack
    /// pod gets both addresses in one step or neither.
    pub async fn add_pod(
        &self,
        family: AddressFamily,
        key: &IpamKey,
        metadata: PodMetadata,
    ) -> Result<PodAddresses, IpamError> {
        match family {
            AddressFamily::V6 => self.add_v6(key, metadata).map(|v6| PodAddresses {
                v6: Some(v6),
                ..PodAddresses::default()
            }),
            AddressFamily::V4 | AddressFamily::DualStack => {
                let dual = family == AddressFamily::DualStack;
                let a = self.add_families(key, metadata, dual, false).await?;
                Ok(PodAddresses {
                    v4: Some(a.v4),
                    v6: a.v6,
                    cards: a.cards,
                })
            }
        }
    }

    /// DelNetwork: releases every address `key` holds, on every card's pool (into cooldown), both
    /// families, in one step under one lock with one checkpoint write per pool changed; a failed
    /// write puts everything back. Falls back to the keys only this sandbox can hold
    /// (`Self::del_candidates`); an entry recovered from host state that only the pod name matches
    /// is left to `reclaim`. Unknown pod when no pool holds anything for the sandbox.
    pub fn del_pod(
        &self,
        key: &IpamKey,
        pod_namespace: &str,
        pod_name: &str,
        reason: &str,
    ) -> Result<PodAddresses, IpamError> {
        self.metrics.del_ip_req(reason);
        let now = self.now();
        let mut core = self.index.core();
        let candidates = self.del_candidates(key);
        let v4_keys: Vec<Option<IpamKey>> = core
            .pools
            .iter()
            .map(|p| candidates.iter().find(|k| p.holds_v4(k)).cloned())
            .collect();
        let v6_key = candidates
            .iter()
            .find(|k| core.pools[0].v6.lookup(k).is_some())
            .cloned();
        if v4_keys.iter().all(Option::is_none) && v6_key.is_none() {
            let recovered = self
                .recovered_by_pod_name(pod_namespace, pod_name)
                .filter(|k| {
                    core.pools
                        .iter()
                        .any(|p| p.holds_v4(k) || p.v6.lookup(k).is_some())
                });
            drop(core);
            self.ask_reclaim(key, recovered);
            return Err(IpamError::UnknownPod(key.clone()));
        }
        let released = Self::release_all(&mut core, &v4_keys, v6_key.as_ref(), now)?;
        drop(core);
        self.index.refresh_gauges();
        self.offer_to_waiters();
        Ok(released)
    }

    /// Releases the given keys' addresses (`v4_keys[i]` in `pools[i]`, the IPv6 in card 0's)
    /// and writes each changed pool's checkpoint once; when a write fails, every pool is put
    /// back exactly as it was.
    fn release_all(
        core: &mut Core,
        v4_keys: &[Option<IpamKey>],
        v6_key: Option<&IpamKey>,
        now: SystemTime,
    ) -> Result<PodAddresses, IpamError> {
        let mut undo: Vec<Released> = Vec::new();
        let put_back = |core: &mut Core, undo: &[Released]| {
            for (i, k, a, details) in undo {
                if let Some((metadata, at)) = details.clone() {
                    core.pools[*i].ds.reassign_exact(k, a.ip, metadata, at);
                }
            }
        };
        for (i, k) in v4_keys.iter().enumerate() {
            let Some(k) = k else { continue };
            let details = core.pools[i].ds.assignment_details(k);
            match core.pools[i].ds.unassign(k, now) {
                Ok(a) => undo.push((i, k.clone(), a, details)),
                Err(e) => {
                    put_back(core, &undo);
                    return Err(IpamError::Internal(e.to_string()));
                }
            }
        }
        let before_v6 = v6_key.map(|_| core.pools[0].v6.clone());
        let v6 = match v6_key {
            Some(k) => match core.pools[0].v6.unassign(k, now) {
                Ok(a) => Some(a),
                Err(e) => {
                    put_back(core, &undo);
                    return Err(super::v6::v6_error(e));
                }
            },
            None => None,
        };
        let mut changed: Vec<usize> = undo.iter().map(|(i, ..)| *i).collect();
        if v6.is_some() && !changed.contains(&0) {
            changed.insert(0, 0);
        }
        for (n, i) in changed.iter().enumerate() {
            if let Err(e) = core.pools[*i].persist() {
                put_back(core, &undo);
                if let Some(before) = before_v6 {
                    core.pools[0].v6 = before;
                }
                // Pools written before this one are rewritten as they are now (put back).
                for j in &changed[..n] {
                    if let Err(w) = core.pools[*j].persist() {
                        tracing::error!(card = core.pools[*j].card, error = %w, "checkpoint not rewritten after a rolled-back release");
                    }
                }
                let card = core.pools[*i].card;
                tracing::error!(card, error = %e, v4 = ?v4_keys, v6 = ?v6_key, "checkpoint write failed; release rolled back");
                return Err(IpamError::CheckpointFailed(format!(
                    "network card {card}: {e}"
                )));
            }
        }
        for i in &changed {
            core.pools[*i].record_cooling(now);
        }
        let mut out = PodAddresses {
            v6,
            ..PodAddresses::default()
        };
        for (i, _, a, _) in undo {
            if i == 0 {
                out.v4 = Some(a);
            } else {
                out.cards.push((core.pools[i].card, a));
            }
        }
        Ok(out)
    }
}
