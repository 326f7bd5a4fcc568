//! Multi-NIC pods (`ENABLE_MULTI_NIC`, one pool per network card): a pod annotated
//! `k8s.amazonaws.com/nicConfig: multi-nic-attachment` gets its card-0 address and one of every
//! other serving card's pool (in card order), all or none, in the same critical section as its
//! card-0 address ([`Ipam::try_assign`]); its DelNetwork releases every card's at once
//! ([`Ipam::del_pod`]). The pools themselves are ordinary [`super::Pool`]s. Must not: call EC2 or
//! the host, hold the lock across `.await`.

use std::time::SystemTime;

use super::{Core, Ipam, IpamError, PodAddresses};
use crate::config::AddressFamily;
use crate::datastore::{Assignment, DatastoreError, IpamKey, PodMetadata};

/// A pod's addresses on the cards other than 0, in card order (the reply's order after card
/// 0's entry).
pub type CardAssignments = Vec<(u32, Assignment)>;

/// What `key` holds on the cards other than 0, and whether it holds one on every such card.
pub(super) fn held_on_cards(core: &Core, key: &IpamKey) -> (CardAssignments, bool) {
    let mut all = true;
    let mut out = Vec::new();
    for pool in &core.pools[1..] {
        match pool.ds.lookup(key) {
            Some(a) => out.push((pool.card, a)),
            None => all = false,
        }
    }
    (out, all)
}

/// One address of every serving card other than 0 for `key` (the same ones it holds
/// already), no checkpoint written: returns them and the cards assigned afresh. When a card
/// has none, the fresh ones are undone and the error names the card.
pub(super) fn assign_cards(
    core: &mut Core,
    key: &IpamKey,
    metadata: &PodMetadata,
    now: SystemTime,
) -> Result<(CardAssignments, Vec<u32>), IpamError> {
    let mut out = Vec::new();
    let mut fresh = Vec::new();
    for i in 1..core.pools.len() {
        let pool = &mut core.pools[i];
        let held = pool.ds.lookup(key).is_some();
        match pool.ds.assign(key, metadata.clone(), now) {
            Ok(a) => {
                if !held {
                    fresh.push(pool.card);
                }
                out.push((pool.card, a));
            }
            Err(e) => {
                let err = no_address_on(pool.card, pool.ds.enis().len(), &e);
                for card in &fresh {
                    if let Some(p) = core.pool_mut(*card) {
                        p.ds.undo_assign(key);
                    }
                }
                return Err(err);
            }
        }
    }
    Ok((out, fresh))
}

/// AddNetwork for a pod that needs one address: when card 0's pool has none free, the other serving
/// cards' pools are looked through in card order and the first with a free address gives it (its
/// checkpoint written; a failed write undoes it and is the error). `None` when no card has one (the
/// caller waits for card 0's pool as before). The pod's traffic then leaves by that card's ENI (its
/// table in the reply; the plugin's `from` rule).
pub(super) fn assign_on_another_card(
    core: &mut Core,
    key: &IpamKey,
    metadata: &PodMetadata,
    now: SystemTime,
) -> Result<Option<Assignment>, CardWriteError> {
    for pool in &mut core.pools[1..] {
        match pool.ds.assign(key, metadata.clone(), now) {
            Ok(a) => {
                if let Err(e) = pool.persist() {
                    pool.ds.undo_assign(key);
                    tracing::error!(card = pool.card, error = %e, %key, "checkpoint write failed; assignment rolled back");
                    return Err(CardWriteError {
                        card: pool.card,
                        source: e,
                    });
                }
                tracing::info!(card = pool.card, %key, ip = %a.ip, "network card 0 has no free address: the pod's address comes from another network card (upstream's fallback)");
                return Ok(Some(a));
            }
            Err(e) => {
                tracing::debug!(card = pool.card, %key, error = %e, "no address on this network card either");
            }
        }
    }
    Ok(None)
}

/// Writes the checkpoint of each of `cards`.
pub(super) fn persist_cards(core: &mut Core, cards: &[u32]) -> Result<(), CardWriteError> {
    for card in cards {
        if let Some(p) = core.pool_mut(*card) {
            p.persist().map_err(|source| CardWriteError {
                card: *card,
                source,
            })?;
        }
    }
    Ok(())
}

/// A network card's checkpoint not written (the change it held was rolled back).
#[derive(Debug, thiserror::Error)]
#[error("network card {card}: {source}")]
pub(super) struct CardWriteError {
    /// The card.
    pub(super) card: u32,
    /// Why.
    #[source]
    pub(super) source: crate::datastore::checkpoint::CheckpointError,
}

/// The cards' assignments of `key` undone (fresh assignments of a failed multi-NIC ADD), each
/// card's checkpoint rewritten.
pub(super) fn undo_cards(core: &mut Core, key: &IpamKey, cards: &[u32]) {
    for card in cards {
        if let Some(p) = core.pool_mut(*card) {
            p.ds.undo_assign(key);
            if let Err(e) = p.persist() {
                tracing::error!(card, error = %e, "checkpoint of the network card not rewritten after a rollback");
            }
        }
    }
}

/// The per-pod error of a card that has no address for it, naming the card.
fn no_address_on(card: u32, enis: usize, e: &DatastoreError) -> IpamError {
    let why = if enis == 0 {
        "it has no ENI yet (the pool loop attaches one)".to_owned()
    } else {
        e.to_string()
    };
    IpamError::CardUnavailable { card, why }
}

impl Ipam {
    /// AddNetwork of a multi-NIC pod: its card-0 address and one of every other serving card, taken
    /// in one critical section, all or nothing; it may wait for the pool manager for any of them,
    /// and when the wait ends with a card short the error names the card; no earlier card's address
    /// stays assigned until the runtime's DEL. IPv4 pods only.
    pub async fn add_multi_nic_pod(
        &self,
        family: AddressFamily,
        key: &IpamKey,
        metadata: PodMetadata,
    ) -> Result<PodAddresses, IpamError> {
        if family != AddressFamily::V4 {
            return Err(IpamError::Unsupported(format!(
                "multi-NIC pods (k8s.amazonaws.com/nicConfig: multi-nic-attachment) in {family:?} mode are not implemented: this ipamd gives them IPv4 addresses only"
            )));
        }
        let interfaces = u32::try_from(self.index.cards().len()).unwrap_or(u32::MAX);
        let metadata = PodMetadata {
            interfaces_count: interfaces,
            ..metadata
        };
        let a = self.add_families(key, metadata, false, true).await?;
        Ok(PodAddresses {
            v4: Some(a.v4),
            v6: None,
            cards: a.cards,
        })
    }
}
