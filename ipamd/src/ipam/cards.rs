//! Network cards other than card 0 (`ENABLE_MULTI_NIC`, upstream's one datastore per network
//! card, `datastore.InitializeDataStores`): each serving card has its own datastore and its own
//! checkpoint file (`ipam-nic-N.json` beside `ipam.json`, upstream's names), so a pod annotated
//! `k8s.amazonaws.com/nicConfig: multi-nic-attachment` gets one address per card, all or none
//! (upstream `AddNetwork` with `RequiresMultiNICAttachment`), and DelNetwork frees each.
//! Card 0 stays the main index ([`super::Core::ds`]): everything else in ipamd (reconcile,
//! reclaim, introspection) sees card 0 only. Must not: call EC2 or the host, hold the lock
//! across `.await`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::{Core, Ipam, IpamError};
use crate::config::AddressFamily;
use crate::datastore::checkpoint::{Checkpoint, CheckpointError};
use crate::datastore::{Assignment, DataStore, DatastoreError, IpamKey, PodMetadata, PoolStats};
use crate::pool::provider::AttachedEni;

/// The checkpoint file of network card `card` beside `default` (upstream
/// `InitializeDataStores`: card 0 keeps `ipam.json`, card N writes `ipam-nic-N.json`).
#[must_use]
pub fn card_checkpoint_path(default: &Path, card: u32) -> PathBuf {
    if card == 0 {
        return default.to_path_buf();
    }
    let s = default.to_string_lossy();
    let base = s.strip_suffix(".json").unwrap_or(&s);
    PathBuf::from(format!("{base}-nic-{card}.json"))
}

/// One serving card's index and checkpoint.
#[derive(Debug)]
pub(super) struct CardStore {
    ds: DataStore,
    checkpoint: Box<dyn Checkpoint>,
}

impl CardStore {
    fn persist(&mut self) -> Result<(), CheckpointError> {
        self.checkpoint.store(&self.ds.checkpoint_data())
    }
}

/// A pod's addresses on the cards other than 0, in card order (the reply's order after card
/// 0's entry).
pub type CardAssignments = Vec<(u32, Assignment)>;

/// How a card's checkpoint was restored at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CardRestore {
    /// The card.
    pub card: u32,
    /// Entries placed on the card's ENIs.
    pub placed: usize,
    /// Entries kept pending (their address is on none of the card's ENIs yet).
    pub pending: usize,
}

impl Core {
    /// The ENIs of every card other than 0 (introspection).
    pub(super) fn card_eni_views(&self) -> Vec<crate::datastore::EniView> {
        self.cards.values().flat_map(|c| c.ds.eni_views()).collect()
    }

    /// The cards' assignments of `key` undone (fresh assignments of a failed multi-NIC ADD).
    fn undo_cards(&mut self, key: &IpamKey, cards: &[u32]) {
        for card in cards {
            if let Some(c) = self.cards.get_mut(card) {
                c.ds.undo_assign(key);
                if let Err(e) = c.persist() {
                    tracing::error!(card, error = %e, "checkpoint of the network card not rewritten after a rollback");
                }
            }
        }
    }
}

impl Ipam {
    /// Starts the serving cards other than 0: registers each card's ENIs (`enis` on that
    /// card; those in `not_ready` hold their addresses back until their host set-up succeeds), restores its checkpoint file (entries not on a known ENI of the card are kept
    /// pending: never lost) and rewrites it. Call once, before the socket serves.
    pub fn start_cards(
        &self,
        cards: Vec<(u32, Box<dyn Checkpoint>)>,
        enis: &[AttachedEni],
        not_ready: &[String],
    ) -> Result<Vec<CardRestore>, IpamError> {
        let now = self.now();
        let cooldown = self.core().ds.cooldown();
        let mut out = Vec::new();
        let mut stores = BTreeMap::new();
        for (card, checkpoint) in cards {
            let mut ds = DataStore::new(cooldown);
            for e in enis.iter().filter(|e| e.network_card == card) {
                super::restore::register_eni(&mut ds, e, !not_ready.contains(&e.id), now)
                    .map_err(|e| IpamError::Internal(format!("network card {card}: {e}")))?;
            }
            let data = checkpoint.load().map_err(|e| {
                IpamError::Internal(format!("checkpoint of network card {card} unreadable: {e}"))
            })?;
            if let Some(data) = data {
                let rejected = ds.restore(&data);
                for r in rejected {
                    tracing::error!(card, key = %r.key, ip = %r.ipv4, "duplicate entry in the network card's checkpoint skipped");
                }
            }
            let pending = ds.pending().len();
            out.push(CardRestore {
                card,
                placed: ds.assigned_count() - pending,
                pending,
            });
            let mut store = CardStore { ds, checkpoint };
            store
                .persist()
                .map_err(|e| IpamError::CheckpointFailed(format!("network card {card}: {e}")))?;
            stores.insert(card, store);
        }
        self.core().cards = stores;
        Ok(out)
    }

    /// The cards other than 0 that serve pods, ascending (empty without `ENABLE_MULTI_NIC`).
    #[must_use]
    pub fn serving_cards(&self) -> Vec<u32> {
        self.core().cards.keys().copied().collect()
    }

    /// True when `ip` is an address of an ENI of a card other than 0, or held there.
    #[must_use]
    pub fn held_on_cards(&self, ip: Ipv4Addr) -> bool {
        self.core()
            .cards
            .values()
            .any(|c| c.ds.holds_cidr_of(ip) || c.ds.holder_of(ip).is_some())
    }

    /// AddNetwork of a multi-NIC pod (upstream `AddNetwork` with `RequiresMultiNICAttachment`:
    /// `ipsRequired = len(DataStores)`, one address per datastore in card order): card 0's
    /// address as every pod's (it may wait for the pool manager), then one of every other
    /// serving card, all or nothing: when a card has none (no ENI yet, or no free address),
    /// every address this call took is given back and the error names the card. Upstream
    /// leaves the earlier cards' addresses assigned until the runtime's DEL; here none is
    /// leaked. IPv4 pods only.
    pub async fn add_multi_nic_pod(
        &self,
        family: AddressFamily,
        key: &IpamKey,
        metadata: PodMetadata,
    ) -> Result<(super::PodAddresses, CardAssignments), IpamError> {
        if family != AddressFamily::V4 {
            return Err(IpamError::Unsupported(format!(
                "multi-NIC pods (k8s.amazonaws.com/nicConfig: multi-nic-attachment) in {family:?} mode are not implemented: this ipamd gives them IPv4 addresses only"
            )));
        }
        let cards = self.serving_cards();
        let interfaces = u32::try_from(cards.len() + 1).unwrap_or(u32::MAX);
        let metadata = PodMetadata {
            interfaces_count: interfaces,
            ..metadata
        };
        let held_before = self.core().ds.lookup(key).is_some();
        let pod = self.add_pod(family, key, metadata.clone()).await?;
        match super::blocking(|| self.assign_cards(key, &metadata)) {
            Ok(on_cards) => Ok((pod, on_cards)),
            Err(e) => {
                if !held_before {
                    super::blocking(|| {
                        let mut core = self.core();
                        core.ds.undo_assign(key);
                        if let Err(w) = core.persist() {
                            tracing::error!(error = %w, "checkpoint not rewritten after the rollback of a multi-NIC pod's card 0 address");
                        }
                    });
                    self.refresh_gauges();
                    self.offer_to_waiters();
                }
                Err(e)
            }
        }
    }

    /// One address of every serving card other than 0 for `key` (the same ones on a repeated
    /// call), under one lock, each card's checkpoint written; all or nothing.
    fn assign_cards(
        &self,
        key: &IpamKey,
        metadata: &PodMetadata,
    ) -> Result<CardAssignments, IpamError> {
        let now = self.now();
        let mut core = self.core();
        let mut out = Vec::new();
        let mut fresh = Vec::new();
        let cards: Vec<u32> = core.cards.keys().copied().collect();
        for card in cards {
            let Some(store) = core.cards.get_mut(&card) else {
                continue;
            };
            let held = store.ds.lookup(key).is_some();
            let r = store.ds.assign(key, metadata.clone(), now);
            let a = match r {
                Ok(a) => a,
                Err(e) => {
                    let enis = store.ds.enis().len();
                    core.undo_cards(key, &fresh);
                    return Err(card_error(card, enis, &e));
                }
            };
            if !held {
                fresh.push(card);
                if let Err(e) = store.persist() {
                    core.undo_cards(key, &fresh);
                    return Err(IpamError::CheckpointFailed(format!(
                        "network card {card}: {e}"
                    )));
                }
            }
            out.push((card, a));
        }
        Ok(out)
    }

    /// DelNetwork on the cards other than 0: releases every address `key` holds there (into
    /// cooldown), each card's checkpoint written; what a failed write released is put back
    /// and the call fails.
    pub fn release_cards(&self, key: &IpamKey) -> Result<CardAssignments, IpamError> {
        let now = self.now();
        let mut core = self.core();
        let mut out = Vec::new();
        for (card, store) in &mut core.cards {
            let held =
                store.ds.lookup(key).is_some() || store.ds.pending().iter().any(|p| &p.key == key);
            if !held {
                continue;
            }
            let details = store.ds.assignment_details(key);
            let a = store
                .ds
                .unassign(key, now)
                .map_err(|e| IpamError::Internal(format!("network card {card}: {e}")))?;
            if let Err(e) = store.persist() {
                if let Some((metadata, at)) = details {
                    store.ds.reassign_exact(key, a.ip, metadata, at);
                }
                return Err(IpamError::CheckpointFailed(format!(
                    "network card {card}: {e}"
                )));
            }
            out.push((*card, a));
        }
        Ok(out)
    }

    /// A card's pool statistics now (the card pool loop decides on them).
    #[must_use]
    pub fn card_pool_stats(&self, card: u32) -> Option<PoolStats> {
        let now = self.now();
        self.core().cards.get(&card).map(|c| c.ds.stats(now))
    }

    /// Registers an ENI EC2 attached on `card` with its addresses (host-ready as given).
    pub fn card_adopt_eni(
        &self,
        card: u32,
        eni: &AttachedEni,
        host_ready: bool,
    ) -> Result<(), DatastoreError> {
        let now = self.now();
        let mut core = self.core();
        let store = core
            .cards
            .get_mut(&card)
            .ok_or_else(|| DatastoreError::UnknownEni(eni.id.clone()))?;
        super::restore::register_eni(&mut store.ds, eni, host_ready, now)
    }

    /// Adds CIDRs EC2 assigned to an ENI of `card`.
    pub fn card_add_cidrs(&self, card: u32, eni_id: &str, cidrs: &[ipnet::Ipv4Net]) {
        let mut core = self.core();
        let Some(store) = core.cards.get_mut(&card) else {
            return;
        };
        for c in cidrs {
            if let Err(e) = store.ds.add_cidr(eni_id, *c, c.prefix_len() < 32) {
                tracing::warn!(card, eni = eni_id, cidr = %c, error = %e, "address of the network card not added");
            }
        }
    }

    /// Takes free CIDRs of an ENI of `card` out of its pool before EC2 releases them; returns
    /// those taken (one holding or cooling an address is not).
    pub fn card_take_cidrs(
        &self,
        card: u32,
        eni_id: &str,
        cidrs: &[ipnet::Ipv4Net],
    ) -> Vec<ipnet::Ipv4Net> {
        let mut core = self.core();
        let Some(store) = core.cards.get_mut(&card) else {
            return Vec::new();
        };
        cidrs
            .iter()
            .filter(|c| store.ds.remove_cidr(eni_id, **c).is_ok())
            .copied()
            .collect()
    }

    /// Takes an ENI of `card` out of its pool before it is freed; refused while pods hold
    /// addresses on it. Returns its description (for the host teardown).
    pub fn card_take_eni(&self, card: u32, eni_id: &str) -> Result<AttachedEni, DatastoreError> {
        let mut core = self.core();
        let store = core
            .cards
            .get_mut(&card)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        store
            .ds
            .remove_eni(eni_id)
            .map(|e| AttachedEni::from(&e.spec))
    }

    /// The ENIs of `card` whose host networking is not set up yet, with their description.
    #[must_use]
    pub fn card_enis_awaiting_host(&self, card: u32) -> Vec<AttachedEni> {
        let core = self.core();
        let Some(store) = core.cards.get(&card) else {
            return Vec::new();
        };
        let waiting = store.ds.enis_awaiting_host();
        store
            .ds
            .enis()
            .values()
            .filter(|e| waiting.contains(&e.spec.id))
            .map(|e| AttachedEni::from(&e.spec))
            .collect()
    }

    /// Marks an ENI of `card` host-ready (its addresses become assignable).
    pub fn card_mark_host_ready(&self, card: u32, eni_id: &str) {
        if let Some(store) = self.core().cards.get_mut(&card)
            && let Err(e) = store.ds.set_host_ready(eni_id, true)
        {
            tracing::warn!(card, eni = eni_id, error = %e, "eni of the network card not marked host-ready");
        }
    }

    /// Every card's assignments as checkpoint entries, by card (introspection, tests).
    #[must_use]
    pub fn card_allocations(&self) -> BTreeMap<u32, Vec<crate::datastore::CheckpointEntry>> {
        self.core()
            .cards
            .iter()
            .map(|(card, s)| (*card, s.ds.checkpoint_data().allocations))
            .collect()
    }
}

/// The per-pod error of a card that has no address for it, naming the card.
fn card_error(card: u32, enis: usize, e: &DatastoreError) -> IpamError {
    let why = if enis == 0 {
        "it has no ENI yet (the pool loop attaches one)".to_owned()
    } else {
        e.to_string()
    };
    IpamError::CardUnavailable { card, why }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream `datastore.InitializeDataStores`: card 0 keeps the default path, card N > 0
    /// writes `strings.TrimSuffix(path, ".json") + "-nic-N.json"`.
    #[test]
    fn card_files_are_named_as_upstream() {
        let p = Path::new("/var/run/aws-node/ipam.json");
        assert_eq!(card_checkpoint_path(p, 0), p);
        assert_eq!(
            card_checkpoint_path(p, 1),
            Path::new("/var/run/aws-node/ipam-nic-1.json")
        );
        assert_eq!(
            card_checkpoint_path(p, 31),
            Path::new("/var/run/aws-node/ipam-nic-31.json")
        );
        assert_eq!(
            card_checkpoint_path(Path::new("/tmp/state"), 2),
            Path::new("/tmp/state-nic-2")
                .with_extension("json")
                .as_path()
        );
    }
}
