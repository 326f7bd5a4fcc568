//! Pool statistics from the datastore: what the pool policy decides on (totals, assigned,
//! cooling, per ENI). Owns only the projection; must not change the datastore.

use std::time::SystemTime;

use ipnet::Ipv4Net;

use super::{DataStore, Eni};

/// Per-ENI statistics for the pool policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniStats {
    /// ENI id.
    pub id: String,
    /// Device number.
    pub device_number: u32,
    /// Primary ENI.
    pub is_primary: bool,
    /// Trunk/EFA/excluded: never used for pods, never freed by the pool.
    pub is_special: bool,
    /// Excluded (e.g. its subnet is tagged `kubernetes.io/role/cni=0`), not the primary ENI,
    /// host-ready and still in EC2: its free CIDRs are released, its pods keep theirs.
    pub is_excluded: bool,
    /// Number of CIDRs (/32s or /28s): what counts against the per-ENI limit.
    pub cidr_count: u32,
    /// Addresses.
    pub total: u32,
    /// Assigned.
    pub assigned: u32,
    /// Cooling.
    pub cooling: u32,
    /// Old enough to be freed (min lifetime elapsed).
    pub past_min_lifetime: bool,
    /// CIDRs with no assigned and no cooling address (releasable).
    pub free_cidrs: Vec<Ipv4Net>,
    /// Pods' IPv6 /128s of this ENI's /80 (dual-stack pods): the IPv4 index knows none, so
    /// [`DataStore::stats`] leaves 0 and `Index::pool_stats` fills it from the IPv6 index. An
    /// ENI with any is never freed, whatever its IPv4s.
    pub ipv6_assigned: u32,
    /// Its subnet gave no address at the last ask (EC2 `InsufficientFreeAddressesInSubnet`,
    /// also for one address): the pool grows elsewhere (another ENI, a new ENI in another
    /// subnet) until the back-off ends. The datastore leaves it false; the pool manager marks it.
    pub subnet_dry: bool,
}

/// Pool statistics: what the policy decides on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Addresses on usable ENIs.
    pub total: u32,
    /// Assigned (incl. pending verification).
    pub assigned: u32,
    /// Free but cooling.
    pub cooling: u32,
    /// Prefixes held.
    pub prefixes: u32,
    /// Prefixes with nothing assigned or cooling.
    pub free_prefixes: u32,
    /// Restored entries not yet on a known ENI.
    pub pending: u32,
    /// Assigned addresses in quarantined CIDRs/ENIs (EC2 no longer lists them): in
    /// `assigned`, not in `total`.
    pub quarantined: u32,
    /// Pods' IPv6 /128s on no known ENI (a restored record whose /80 is not registered yet and
    /// whose pod holds no IPv4 on a known ENI): while any, no ENI is freed. Filled by
    /// `Index::pool_stats`, as [`EniStats::ipv6_assigned`].
    pub ipv6_unplaced: u32,
    /// Assigned addresses on excluded ENIs: in `assigned`, not in `total`.
    pub excluded_assigned: u32,
    /// Per ENI, by device number.
    pub enis: Vec<EniStats>,
}

impl PoolStats {
    /// Assignable now: total − assigned − cooling (a cooling address is not free).
    #[must_use]
    pub fn available(&self) -> u32 {
        self.total
            .saturating_sub(self.assigned_on_enis())
            .saturating_sub(self.cooling)
    }

    fn assigned_on_enis(&self) -> u32 {
        self.assigned
            .saturating_sub(self.pending)
            .saturating_sub(self.quarantined)
            .saturating_sub(self.excluded_assigned)
    }
}

impl DataStore {
    /// Pool statistics at `now`.
    #[must_use]
    pub fn stats(&self, now: SystemTime) -> PoolStats {
        let mut s = PoolStats {
            pending: u32_of(self.pending.len()),
            assigned: u32_of(self.pending.len()),
            ..PoolStats::default()
        };
        let mut enis: Vec<&Eni> = self.enis.values().collect();
        enis.sort_by_key(|e| (e.spec.network_card, e.spec.device_number));
        for eni in enis {
            let special = eni.spec.is_trunk
                || eni.spec.is_efa
                || eni.spec.is_excluded
                || eni.gone
                || !eni.host_ready;
            let mut es = EniStats {
                id: eni.spec.id.clone(),
                device_number: eni.spec.device_number,
                is_primary: eni.spec.is_primary,
                is_special: special,
                is_excluded: eni.spec.is_excluded
                    && !eni.spec.is_primary
                    && !eni.gone
                    && eni.host_ready,
                cidr_count: u32_of(eni.cidrs.values().filter(|c| !c.gone).count()),
                total: 0,
                assigned: 0,
                cooling: 0,
                past_min_lifetime: now
                    .duration_since(eni.created_at)
                    .is_ok_and(|d| d >= self.min_eni_lifetime),
                free_cidrs: Vec::new(),
                ipv6_assigned: 0,
                subnet_dry: false,
            };
            for cidr in eni.cidrs.values() {
                let (a, c) = (
                    u32_of(cidr.assigned()),
                    u32_of(cidr.cooling(now, self.cooldown)),
                );
                if cidr.gone || eni.gone {
                    // Held for its pods only: not in the pool, never released through EC2.
                    es.assigned += a;
                    s.quarantined += a;
                    continue;
                }
                es.total += u32_of(cidr.slots.len());
                es.assigned += a;
                es.cooling += c;
                if a == 0 && c == 0 {
                    es.free_cidrs.push(cidr.net);
                }
                if cidr.is_prefix {
                    s.prefixes += 1;
                    if a == 0 && c == 0 {
                        s.free_prefixes += 1;
                    }
                }
            }
            s.assigned += es.assigned;
            if !special {
                s.total += es.total;
                s.cooling += es.cooling;
            } else if !eni.host_ready && !eni.gone {
                // Not assignable until its host setup is done (neither filled nor freed by the
                // policy meanwhile): its assigned addresses are outside the pool.
                s.quarantined += es.assigned;
            } else if eni.spec.is_excluded && !eni.gone {
                s.excluded_assigned += es.assigned;
            }
            if !eni.gone {
                // A quarantined ENI is no longer attached in EC2: it takes no device slot.
                s.enis.push(es);
            }
        }
        s
    }
}

/// `n` as u32, saturating.
pub(super) fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
