//! The datastore: which ENIs and CIDRs this node holds and which pod (IPAM key) holds which
//! address. PURE and synchronous: every method that depends on time takes `now`. Must not: do
//! I/O, call EC2/netlink/kube, read the clock, be async. Persistence is the caller's job via
//! [`checkpoint`] (the datastore only converts to and from checkpoint entries).
//!
//! Invariants (checked by the property tests):
//! - an address is held by at most one key, and a key holds at most one address;
//! - an assignment is never dropped except by `unassign`/`drop_pending` for that key.

pub mod checkpoint;
mod model;
mod persist;
mod stats;
pub mod v6;
mod views;

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;

pub use checkpoint::{CheckpointData, CheckpointEntry};
use model::is_cooling;
pub use model::{
    Assignment, Cidr, DatastoreError, Eni, EniIdentity, IpamKey, PendingEntry, PodMetadata,
    RECOVERED_IF_NAME, RECOVERED_NETWORK_NAME, Slot,
};
pub use stats::{EniStats, PoolStats};
pub use v6::{V6Assignment, V6Error, V6Prefix, V6Store};
pub use views::{AddressView, CidrView, EniView, Usage};

/// The datastore.
#[derive(Debug, Clone)]
pub struct DataStore {
    enis: BTreeMap<String, Eni>,
    /// key → (eni id, cidr, address) for O(log n) idempotency and DEL.
    by_key: HashMap<IpamKey, (String, Ipv4Net, Ipv4Addr)>,
    pending: BTreeMap<IpamKey, PendingEntry>,
    /// Addresses not to hand out for a moment (their stale pod rules are being deleted).
    fenced: std::collections::BTreeSet<Ipv4Addr>,
    /// Pending entries EC2's Describe confirmed are on none of this node's ENIs.
    absent: std::collections::BTreeSet<IpamKey>,
    cooldown: Duration,
    min_eni_lifetime: Duration,
}

/// The minimum ENI lifetime before it may be freed.
pub const MIN_ENI_LIFETIME: Duration = Duration::from_secs(60);

impl DataStore {
    /// An empty datastore with `IP_COOLDOWN_PERIOD`.
    #[must_use]
    pub fn new(cooldown: Duration) -> Self {
        Self {
            enis: BTreeMap::new(),
            by_key: HashMap::new(),
            pending: BTreeMap::new(),
            fenced: std::collections::BTreeSet::new(),
            absent: std::collections::BTreeSet::new(),
            cooldown,
            min_eni_lifetime: MIN_ENI_LIFETIME,
        }
    }

    /// The configured cooldown.
    #[must_use]
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// Registers an ENI.
    pub fn add_eni(&mut self, spec: EniIdentity, now: SystemTime) -> Result<(), DatastoreError> {
        if self.enis.contains_key(&spec.id) {
            return Err(DatastoreError::DuplicateEni(spec.id));
        }
        let route_table =
            dataplane::conventions::route_table_for(spec.device_number, spec.network_card);
        self.enis.insert(
            spec.id.clone(),
            Eni {
                spec,
                route_table,
                created_at: now,
                cidrs: BTreeMap::new(),
                gone: false,
                host_ready: true,
            },
        );
        Ok(())
    }

    /// Adds a /32 (`is_prefix = false`) or a /28 prefix to an ENI, and attaches any pending
    /// restored entries inside it.
    pub fn add_cidr(
        &mut self,
        eni_id: &str,
        net: Ipv4Net,
        is_prefix: bool,
    ) -> Result<(), DatastoreError> {
        let net = net.trunc();
        if let Some(c) = self
            .enis
            .get_mut(eni_id)
            .and_then(|e| e.cidrs.get_mut(&net))
            .filter(|c| c.gone && c.is_prefix == is_prefix)
        {
            // EC2 gave this ENI the quarantined CIDR again: it is ours again.
            c.gone = false;
            return Ok(());
        }
        let moved_from = self.enis.iter().find_map(|(id, e)| {
            e.cidrs
                .get(&net)
                .filter(|c| c.gone && c.is_prefix == is_prefix && id != eni_id)
                .map(|_| id.clone())
        });
        if let Some(from) = moved_from
            && self.enis.contains_key(eni_id)
        {
            // EC2 put a quarantined CIDR on another of our ENIs (e.g. a new ENI got the gone
            // ENI's addresses): it moves there with its pods' assignments, assignable again.
            let mut cidr = self
                .enis
                .get_mut(&from)
                .and_then(|e| e.cidrs.remove(&net))
                .ok_or(DatastoreError::UnknownCidr(net))?;
            cidr.gone = false;
            for slot in cidr.slots.values() {
                if let Slot::Assigned { key, .. } = slot
                    && let Some(entry) = self.by_key.get_mut(key)
                {
                    entry.0 = eni_id.to_owned();
                }
            }
            if let Some(e) = self.enis.get_mut(eni_id) {
                e.cidrs.insert(net, cidr);
            }
            if self
                .enis
                .get(&from)
                .is_some_and(|e| e.gone && e.cidrs.is_empty())
            {
                self.enis.remove(&from);
            }
            return Ok(());
        }
        if self.enis.values().any(|e| {
            e.cidrs
                .keys()
                .any(|c| c.contains(&net.network()) || net.contains(&c.network()))
        }) {
            return Err(DatastoreError::DuplicateCidr(net));
        }
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        let mut cidr = Cidr::new(net, is_prefix);
        let adopt: Vec<IpamKey> = self
            .pending
            .values()
            .filter(|p| net.contains(&p.ip))
            .map(|p| p.key.clone())
            .collect();
        for key in adopt {
            if let Some(p) = self.pending.remove(&key) {
                cidr.slots.insert(
                    p.ip,
                    Slot::Assigned {
                        key: p.key.clone(),
                        metadata: p.metadata,
                        assigned_at: p.assigned_at,
                        unassigned_at: None,
                    },
                );
                self.by_key.insert(p.key, (eni.spec.id.clone(), net, p.ip));
            }
        }
        eni.cidrs.insert(net, cidr);
        Ok(())
    }

    /// A repeated ADD of `key` (kubelet retrying): its assignment counts as fresh again, so
    /// `reclaim` does not take it while the retried wiring is in flight.
    pub fn refresh_assigned_at(&mut self, key: &IpamKey, now: SystemTime) {
        if let Some((eni_id, net, ip)) = self.by_key.get(key)
            && let Some(Slot::Assigned { assigned_at, .. }) = self
                .enis
                .get_mut(eni_id)
                .and_then(|e| e.cidrs.get_mut(net))
                .and_then(|c| c.slots.get_mut(ip))
        {
            *assigned_at = now;
        }
    }

    /// Of `ips`, fences (no `assign` hands them out until [`Self::unfence`]) and returns those
    /// no key holds.
    pub fn fence_unheld(&mut self, ips: &[Ipv4Addr]) -> Vec<Ipv4Addr> {
        let unheld: Vec<Ipv4Addr> = ips
            .iter()
            .copied()
            .filter(|ip| self.holder_of(*ip).is_none())
            .collect();
        self.fenced.extend(unheld.iter().copied());
        unheld
    }

    /// Lifts a fence.
    pub fn unfence(&mut self, ips: &[Ipv4Addr]) {
        for ip in ips {
            self.fenced.remove(ip);
        }
    }

    /// The ENI's route table is `table` (the node's OS routes it by its own, found by its host
    /// set-up), not the conventional one: every assignment on it answers `table` from now on.
    pub fn set_route_table(&mut self, eni_id: &str, table: u32) -> Result<(), DatastoreError> {
        self.enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?
            .route_table = table;
        Ok(())
    }

    /// Marks an ENI's host networking as set up (or not): addresses of a not-ready ENI are
    /// never assigned and not counted as available.
    pub fn set_host_ready(&mut self, eni_id: &str, ready: bool) -> Result<(), DatastoreError> {
        self.enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?
            .host_ready = ready;
        Ok(())
    }

    /// Removes a CIDR with nothing assigned. Cooling addresses block it unless `force_cooling`.
    pub fn remove_cidr(&mut self, eni_id: &str, net: Ipv4Net) -> Result<(), DatastoreError> {
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        let cidr = eni
            .cidrs
            .get(&net)
            .ok_or(DatastoreError::UnknownCidr(net))?;
        if cidr.assigned() > 0 {
            return Err(DatastoreError::InUse(net.to_string()));
        }
        eni.cidrs.remove(&net);
        Ok(())
    }

    /// Removes an ENI with nothing assigned.
    pub fn remove_eni(&mut self, eni_id: &str) -> Result<Eni, DatastoreError> {
        let eni = self
            .enis
            .get(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        if eni.cidrs.values().any(|c| c.assigned() > 0) {
            return Err(DatastoreError::InUse(eni_id.to_owned()));
        }
        self.enis
            .remove(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))
    }

    /// Assigns an address to `key`. Idempotent: a key that holds one gets the same one back.
    /// Picks, on the lowest-device usable ENI with room, the fullest prefix (so empty ones stay
    /// releasable), then the address free the longest (never-used first).
    pub fn assign(
        &mut self,
        key: &IpamKey,
        metadata: PodMetadata,
        now: SystemTime,
    ) -> Result<Assignment, DatastoreError> {
        if let Some(a) = self.lookup(key) {
            return Ok(a);
        }
        if let Some(p) = self.pending.get(key) {
            return Err(DatastoreError::PendingVerification(p.ip));
        }
        let cooldown = self.cooldown;
        let mut best: Option<(u32, usize, Option<SystemTime>, String, Ipv4Net, Ipv4Addr)> = None;
        for eni in self.enis.values().filter(|e| {
            !(e.spec.is_trunk || e.spec.is_efa || e.spec.is_excluded || e.gone || !e.host_ready)
        }) {
            for cidr in eni.cidrs.values().filter(|c| !c.gone) {
                let fullness = usize::MAX - cidr.assigned();
                for (addr, slot) in &cidr.slots {
                    let Slot::Free { unassigned_at, .. } = slot else {
                        continue;
                    };
                    if is_cooling(slot, now, cooldown) || self.fenced.contains(addr) {
                        continue;
                    }
                    let cand = (
                        eni.spec.device_number,
                        fullness,
                        *unassigned_at,
                        eni.spec.id.clone(),
                        cidr.net,
                        *addr,
                    );
                    let better = match &best {
                        None => true,
                        Some(b) => (cand.0, cand.1, cand.2, cand.5) < (b.0, b.1, b.2, b.5),
                    };
                    if better {
                        best = Some(cand);
                    }
                }
            }
        }
        let (_, _, _, eni_id, net, ip) = best.ok_or(DatastoreError::NoAvailableAddress)?;
        let eni = self
            .enis
            .get_mut(&eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.clone()))?;
        let slot = eni
            .cidrs
            .get_mut(&net)
            .and_then(|c| c.slots.get_mut(&ip))
            .ok_or(DatastoreError::UnknownCidr(net))?;
        let prev = match slot {
            Slot::Free { unassigned_at, .. } => *unassigned_at,
            Slot::Assigned { .. } => None,
        };
        *slot = Slot::Assigned {
            key: key.clone(),
            metadata,
            assigned_at: now,
            unassigned_at: prev,
        };
        self.by_key.insert(key.clone(), (eni_id, net, ip));
        self.lookup(key).ok_or(DatastoreError::NoAvailableAddress)
    }

    /// The address `key` holds on a known ENI.
    #[must_use]
    pub fn lookup(&self, key: &IpamKey) -> Option<Assignment> {
        let (eni_id, _, ip) = self.by_key.get(key)?;
        let eni = self.enis.get(eni_id)?;
        Some(Assignment {
            ip: *ip,
            eni_id: eni.spec.id.clone(),
            device_number: eni.spec.device_number,
            route_table: eni.route_table,
        })
    }

    /// Releases `key`'s address; it enters cooldown. Returns what it held. A pending entry is
    /// dropped (returned with no ENI).
    pub fn unassign(
        &mut self,
        key: &IpamKey,
        now: SystemTime,
    ) -> Result<Assignment, DatastoreError> {
        if let Some(p) = self.pending.remove(key) {
            return Ok(Assignment {
                ip: p.ip,
                eni_id: String::new(),
                device_number: 0,
                route_table: 0,
            });
        }
        let a = self
            .lookup(key)
            .ok_or_else(|| DatastoreError::UnknownPod(key.clone()))?;
        let (eni_id, net, ip) = self
            .by_key
            .remove(key)
            .ok_or_else(|| DatastoreError::UnknownPod(key.clone()))?;
        if let Some(slot) = self
            .enis
            .get_mut(&eni_id)
            .and_then(|e| e.cidrs.get_mut(&net))
            .and_then(|c| c.slots.get_mut(&ip))
        {
            let last_assigned_at = match slot {
                Slot::Assigned { assigned_at, .. } => Some(*assigned_at),
                Slot::Free {
                    last_assigned_at, ..
                } => *last_assigned_at,
            };
            *slot = Slot::Free {
                unassigned_at: Some(now),
                last_assigned_at,
            };
        }
        self.drop_empty_gone(&eni_id, net);
        Ok(a)
    }

    /// Removes a quarantined CIDR once nothing in it is assigned, and a quarantined ENI once
    /// nothing on it is.
    fn drop_empty_gone(&mut self, eni_id: &str, net: Ipv4Net) {
        let Some(eni) = self.enis.get_mut(eni_id) else {
            return;
        };
        if (eni.gone || eni.cidrs.get(&net).is_some_and(|c| c.gone))
            && eni.cidrs.get(&net).is_some_and(|c| c.assigned() == 0)
        {
            eni.cidrs.remove(&net);
        }
        if eni.gone && eni.cidrs.values().all(|c| c.assigned() == 0) {
            self.enis.remove(eni_id);
        }
    }

    /// Quarantines a CIDR EC2 no longer lists: removed now if nothing in it is assigned,
    /// otherwise kept for its pods but never handed out again and not counted in the pool.
    pub fn quarantine_cidr(&mut self, eni_id: &str, net: Ipv4Net) -> Result<(), DatastoreError> {
        let cidr = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?
            .cidrs
            .get_mut(&net)
            .ok_or(DatastoreError::UnknownCidr(net))?;
        cidr.gone = true;
        self.drop_empty_gone(eni_id, net);
        Ok(())
    }

    /// Quarantines an ENI EC2 no longer lists (all its CIDRs too); removed at once when empty.
    pub fn quarantine_eni(&mut self, eni_id: &str) -> Result<(), DatastoreError> {
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        eni.gone = true;
        let nets: Vec<Ipv4Net> = eni.cidrs.keys().copied().collect();
        for c in eni.cidrs.values_mut() {
            c.gone = true;
        }
        for net in nets {
            self.drop_empty_gone(eni_id, net);
        }
        if self.enis.get(eni_id).is_some_and(|e| e.cidrs.is_empty()) {
            self.enis.remove(eni_id);
        }
        Ok(())
    }

    /// Lifts the quarantine of every ENI/CIDR EC2 lists again (`listed`: ENI id → CIDRs).
    pub fn unquarantine_listed(&mut self, listed: &BTreeMap<String, Vec<Ipv4Net>>) {
        for (id, nets) in listed {
            if let Some(eni) = self.enis.get_mut(id) {
                eni.gone = false;
                for net in nets {
                    if let Some(c) = eni.cidrs.get_mut(net) {
                        c.gone = false;
                    }
                }
            }
        }
    }

    /// Puts back an assignment exactly as it was (rollback of a failed `unassign`).
    pub fn reassign_exact(
        &mut self,
        key: &IpamKey,
        ip: Ipv4Addr,
        metadata: PodMetadata,
        assigned_at: SystemTime,
    ) {
        for eni in self.enis.values_mut() {
            for cidr in eni.cidrs.values_mut() {
                if let Some(slot) = cidr.slots.get_mut(&ip) {
                    *slot = Slot::Assigned {
                        key: key.clone(),
                        metadata,
                        assigned_at,
                        unassigned_at: None,
                    };
                    self.by_key
                        .insert(key.clone(), (eni.spec.id.clone(), cidr.net, ip));
                    return;
                }
            }
        }
        self.pending.insert(
            key.clone(),
            PendingEntry {
                key: key.clone(),
                ip,
                metadata,
                assigned_at,
            },
        );
    }

    /// Undoes a fresh `assign` (rollback of a failed checkpoint write): the address goes back
    /// to free WITHOUT cooldown, as if never handed out.
    pub fn undo_assign(&mut self, key: &IpamKey) {
        if let Some((eni_id, net, ip)) = self.by_key.remove(key)
            && let Some(slot) = self
                .enis
                .get_mut(&eni_id)
                .and_then(|e| e.cidrs.get_mut(&net))
                .and_then(|c| c.slots.get_mut(&ip))
        {
            let prev = match slot {
                Slot::Assigned { unassigned_at, .. } | Slot::Free { unassigned_at, .. } => {
                    *unassigned_at
                }
            };
            *slot = Slot::Free {
                unassigned_at: prev,
                last_assigned_at: None,
            };
        }
    }

    /// Metadata and assignment time of `key` (for exact rollback).
    #[must_use]
    pub fn assignment_details(&self, key: &IpamKey) -> Option<(PodMetadata, SystemTime)> {
        if let Some(p) = self.pending.get(key) {
            return Some((p.metadata.clone(), p.assigned_at));
        }
        let (eni_id, net, ip) = self.by_key.get(key)?;
        match self.enis.get(eni_id)?.cidrs.get(net)?.slots.get(ip)? {
            Slot::Assigned {
                metadata,
                assigned_at,
                ..
            } => Some((metadata.clone(), *assigned_at)),
            Slot::Free { .. } => None,
        }
    }

    /// Every ENI, by id.
    #[must_use]
    pub fn enis(&self) -> &BTreeMap<String, Eni> {
        &self.enis
    }

    /// The trunk ENI attached to the node (id, MAC), if any.
    #[must_use]
    pub fn trunk_eni(&self) -> Option<(String, String)> {
        self.enis
            .values()
            .find(|e| e.spec.is_trunk && !e.gone)
            .map(|e| (e.spec.id.clone(), e.spec.mac.clone()))
    }

    /// Number of keys holding an address (incl. pending).
    #[must_use]
    pub fn assigned_count(&self) -> usize {
        self.by_key.len() + self.pending.len()
    }

    /// True when `ip` lies in a CIDR of a registered ENI (an address ipamd could hand out).
    #[must_use]
    pub fn holds_cidr_of(&self, ip: Ipv4Addr) -> bool {
        self.enis
            .values()
            .any(|e| e.cidrs.keys().any(|c| c.contains(&ip)))
    }

    /// The key holding `ip`, if any (incl. pending).
    #[must_use]
    pub fn holder_of(&self, ip: Ipv4Addr) -> Option<IpamKey> {
        for eni in self.enis.values() {
            for cidr in eni.cidrs.values() {
                if let Some(Slot::Assigned { key, .. }) = cidr.slots.get(&ip) {
                    return Some(key.clone());
                }
            }
        }
        self.pending
            .values()
            .find(|p| p.ip == ip)
            .map(|p| p.key.clone())
    }
}

#[cfg(test)]
mod tests;
