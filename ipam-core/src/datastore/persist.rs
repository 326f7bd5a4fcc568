//! The datastore's side of persistence: assignments to and from checkpoint entries, cooldowns
//! across restarts, and restored entries pending verification. Must not: do I/O (the
//! checkpoint port writes).

use std::net::Ipv4Addr;
use std::time::SystemTime;

use super::{CheckpointData, CheckpointEntry, DataStore, IpamKey, PendingEntry, Slot, is_cooling};

impl DataStore {
    /// Free addresses still in their cooldown at `now`, with their release time.
    #[must_use]
    pub fn cooling_entries(&self, now: SystemTime) -> Vec<(Ipv4Addr, SystemTime)> {
        self.enis
            .values()
            .flat_map(|e| e.cidrs.values())
            .flat_map(|c| c.slots.iter())
            .filter_map(|(ip, slot)| match slot {
                Slot::Free {
                    unassigned_at: Some(t),
                    ..
                } if is_cooling(slot, now, self.cooldown) => Some((*ip, *t)),
                _ => None,
            })
            .collect()
    }

    /// Puts recorded cooldowns back on free addresses (after a restart), so a just-released
    /// address is not handed out again before its cooldown ends.
    pub fn restore_cooling(&mut self, cooling: &[(Ipv4Addr, SystemTime)]) {
        for (ip, t) in cooling {
            for eni in self.enis.values_mut() {
                for cidr in eni.cidrs.values_mut() {
                    if let Some(Slot::Free { unassigned_at, .. }) = cidr.slots.get_mut(ip) {
                        *unassigned_at = Some(*t);
                    }
                }
            }
        }
    }

    /// Restored entries still waiting for their address to appear on a known ENI.
    #[must_use]
    pub fn pending(&self) -> Vec<PendingEntry> {
        self.pending.values().cloned().collect()
    }

    /// Marks the pending entries whose address EC2 lists on none of this node's ENIs
    /// (`listed` says whether it lists an address): they stop asking for confirmation.
    pub fn mark_pending_absent(&mut self, listed: impl Fn(Ipv4Addr) -> bool) {
        let pending = &self.pending;
        self.absent.retain(|k| pending.contains_key(k));
        for p in self.pending.values() {
            if !listed(p.ip) {
                self.absent.insert(p.key.clone());
            }
        }
    }

    /// Pending entries not yet confirmed absent by EC2: their address may be on one of our
    /// ENIs that the datastore has not caught up with.
    #[must_use]
    pub fn unconfirmed_pending(&self) -> usize {
        self.pending
            .keys()
            .filter(|k| !self.absent.contains(*k))
            .count()
    }

    /// Drops a pending entry after the caller confirmed (e.g. with EC2) the address is gone.
    pub fn drop_pending(&mut self, key: &IpamKey) -> Option<PendingEntry> {
        self.pending.remove(key)
    }

    /// Every assignment as checkpoint entries (incl. pending), sorted by key.
    #[must_use]
    pub fn checkpoint_data(&self) -> CheckpointData {
        let mut allocations: Vec<CheckpointEntry> = Vec::with_capacity(self.assigned_count());
        for eni in self.enis.values() {
            for cidr in eni.cidrs.values() {
                for (ip, slot) in &cidr.slots {
                    if let Slot::Assigned {
                        key,
                        metadata,
                        assigned_at,
                        ..
                    } = slot
                    {
                        allocations.push(CheckpointEntry::new(
                            key.clone(),
                            *ip,
                            metadata.clone(),
                            *assigned_at,
                        ));
                    }
                }
            }
        }
        for p in self.pending.values() {
            allocations.push(CheckpointEntry::new(
                p.key.clone(),
                p.ip,
                p.metadata.clone(),
                p.assigned_at,
            ));
        }
        allocations.sort_by(|a, b| a.key.cmp(&b.key));
        CheckpointData::new(allocations)
    }

    /// Restores assignments from a checkpoint (call after ENIs and CIDRs are registered).
    /// Entries whose address is on no known CIDR are kept as pending (never dropped). An entry
    /// whose address or key is already taken is skipped and returned (a corrupt duplicate).
    pub fn restore(&mut self, data: &CheckpointData) -> Vec<CheckpointEntry> {
        let mut rejected = Vec::new();
        for entry in &data.allocations {
            let Some(ip) = entry.ipv4() else {
                rejected.push(entry.clone());
                continue;
            };
            if self.by_key.contains_key(&entry.key)
                || self.pending.contains_key(&entry.key)
                || self.holder_of(ip).is_some()
            {
                rejected.push(entry.clone());
                continue;
            }
            let when = entry.allocated_at();
            let pending = PendingEntry {
                key: entry.key.clone(),
                ip,
                metadata: entry.metadata.clone(),
                assigned_at: when,
            };
            let mut placed = false;
            for eni in self.enis.values_mut() {
                for cidr in eni.cidrs.values_mut() {
                    if let Some(slot) = cidr.slots.get_mut(&ip) {
                        *slot = Slot::Assigned {
                            key: entry.key.clone(),
                            metadata: entry.metadata.clone(),
                            assigned_at: when,
                            unassigned_at: None,
                        };
                        self.by_key
                            .insert(entry.key.clone(), (eni.spec.id.clone(), cidr.net, ip));
                        placed = true;
                    }
                }
            }
            if !placed {
                self.pending.insert(entry.key.clone(), pending);
            }
        }
        rejected
    }
}
