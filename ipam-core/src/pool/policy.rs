//! Warm-pool policy: PURE. Pool statistics + targets + limits + now → one [`Decision`]. Must
//! not: call the provider, mutate the datastore, read the clock or the environment.
//!
//! Why: the warm targets mean what operators' existing settings expect, with one deliberate change:
//! addresses in cooldown are NOT available, so the pool grows to cover them instead of failing pods
//! while every free address is cooling.

use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;

use crate::datastore::PoolStats;

pub mod adaptive;

/// Addresses per /28 prefix.
pub const PREFIX_SIZE: u32 = 16;
/// Minimum interval between two shrink actions.
pub const SHRINK_INTERVAL: Duration = Duration::from_secs(30);
/// How long the pool must have had a spare (freeable) ENI without interruption before one is freed.
/// Freeing and re-creating an ENI costs five mutating calls (Detach, Delete; Create, Attach,
/// Modify) and a pod wait; keeping a spare one costs only its subnet addresses. Under a steady
/// churn the pool dips below its target every time a deleted pod's address cools down (30 s) and
/// the next pod arrives, so two minutes of continuous excess (4 address cooldowns, 4 shrink
/// intervals, 24 pool ticks) do not happen while pods still come and go, and a node that really
/// scaled down still returns the ENI within ~2.5 minutes, to the same steady state as freeing at
/// once.
pub const ENI_EXCESS_HOLD: Duration = Duration::from_secs(120);

/// Targets and limits the policy decides against (config merged with instance limits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Targets {
    /// `WARM_ENI_TARGET` (used when no IP target is set and PD is off).
    pub warm_eni: u32,
    /// `WARM_IP_TARGET`.
    pub warm_ip: u32,
    /// `MINIMUM_IP_TARGET`.
    pub minimum_ip: u32,
    /// `WARM_PREFIX_TARGET` (PD only).
    pub warm_prefix: u32,
    /// `ENABLE_PREFIX_DELEGATION`.
    pub prefix_delegation: bool,
    /// min(instance ENI limit, `MAX_ENI`), minus ENIs reserved (trunk).
    pub max_enis: u32,
    /// Secondary /32s (or /28 slots) per ENI: instance IPv4-per-ENI limit − 1.
    pub cidrs_per_eni: u32,
    /// kubelet max-pods: the pool never grows beyond it.
    pub max_pods: Option<u32>,
}

/// What the pool of a network card other than 0 keeps (warm and minimum IP target), whatever the
/// node's settings.
pub const OTHER_CARD_WARM_IP_TARGET: u32 = 1;

/// `ENABLE_PREFIX_DELEGATION` on an instance type whose ENIs take no /28 prefixes: IPv6 mode needs
/// prefixes and cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Prefix Delegation is not supported on non-nitro instance {0}. IPv6 is only supported in Prefix delegation Mode."
)]
pub struct PrefixDelegationUnsupported(pub String);

/// Whether the pool works in /28 prefixes: `requested` (`ENABLE_PREFIX_DELEGATION`) on an instance
/// type that `supported`s them; requested on one that does not, IPv4 falls back to secondary IPs
/// (the caller warns) and IPv6 mode is refused.
pub fn prefix_delegation_on(
    requested: bool,
    ipv6_mode: bool,
    supported: bool,
    instance_type: &str,
) -> Result<bool, PrefixDelegationUnsupported> {
    match (requested, supported) {
        (true, false) if ipv6_mode => Err(PrefixDelegationUnsupported(instance_type.to_owned())),
        (true, false) => Ok(false),
        (requested, _) => Ok(requested),
    }
}
/// See [`OTHER_CARD_WARM_IP_TARGET`].
pub const OTHER_CARD_MINIMUM_IP_TARGET: u32 = 1;

impl Targets {
    /// The targets of `card`'s pool: the node's for card 0; for any other card the node's limits
    /// and mode with fixed IP targets (warm 1, minimum 1; its WARM_ENI/WARM_PREFIX targets do not
    /// apply).
    #[must_use]
    pub fn of_card(&self, card: u32) -> Self {
        if card == 0 {
            return self.clone();
        }
        Self {
            warm_eni: 0,
            warm_ip: OTHER_CARD_WARM_IP_TARGET,
            minimum_ip: OTHER_CARD_MINIMUM_IP_TARGET,
            warm_prefix: 0,
            ..self.clone()
        }
    }

    fn ip_targets(&self) -> bool {
        self.warm_ip > 0 || self.minimum_ip > 0
    }

    fn unit(&self) -> u32 {
        if self.prefix_delegation {
            PREFIX_SIZE
        } else {
            1
        }
    }

    /// Addresses a full ENI holds.
    fn ips_per_eni(&self) -> u32 {
        self.cidrs_per_eni * self.unit()
    }
}

/// Why growth is impossible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// Total addresses reached max-pods.
    MaxPods,
    /// Every ENI is full and no more ENIs can be attached.
    InstanceLimit,
    /// The node carries the `node.kubernetes.io/unschedulable` taint and
    /// `AWS_MANAGE_ENIS_NON_SCHEDULABLE` is false: no address or ENI is attached.
    NodeUnschedulable,
    /// Every ENI with room is in a subnet that ran out of addresses
    /// ([`crate::datastore::EniStats::subnet_dry`]) and no more ENIs can be attached.
    SubnetsDry,
}

/// The one thing to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The pool is where it should be.
    Nothing,
    /// More addresses are needed but cannot be had.
    Blocked(Blocked),
    /// Assign `count` secondary /32s to an existing ENI.
    AssignIps {
        /// ENI.
        eni_id: String,
        /// How many.
        count: u32,
    },
    /// Assign `count` /28 prefixes to an existing ENI.
    AssignPrefixes {
        /// ENI.
        eni_id: String,
        /// How many.
        count: u32,
    },
    /// Create and attach an ENI carrying `count` /32s or prefixes (per mode).
    AllocateEni {
        /// How many CIDRs with it.
        count: u32,
    },
    /// Release these free /32s from one ENI.
    ReleaseIps {
        /// ENI.
        eni_id: String,
        /// Addresses.
        ips: Vec<Ipv4Addr>,
    },
    /// Release these free prefixes from one ENI.
    ReleasePrefixes {
        /// ENI.
        eni_id: String,
        /// Prefixes.
        prefixes: Vec<Ipv4Net>,
    },
    /// Detach and delete this ENI.
    FreeEni {
        /// ENI.
        eni_id: String,
    },
}

impl Decision {
    /// True for actions that shrink the pool (paced by [`SHRINK_INTERVAL`]).
    #[must_use]
    pub fn is_shrink(&self) -> bool {
        matches!(
            self,
            Self::ReleaseIps { .. } | Self::ReleasePrefixes { .. } | Self::FreeEni { .. }
        )
    }
}

/// Inputs besides stats and targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    /// Now.
    pub now: SystemTime,
    /// When the last shrink action happened.
    pub last_shrink: Option<SystemTime>,
    /// AddNetwork calls waiting for an address right now.
    pub waiting_pods: u32,
    /// Network changes are allowed (false while shutting down or provisioning is disabled).
    pub changes_allowed: bool,
    /// Addresses and ENIs may be attached, and ENIs freed: false on a node tainted
    /// `node.kubernetes.io/unschedulable` (a cordoned, draining node) unless
    /// `AWS_MANAGE_ENIS_NON_SCHEDULABLE=true`. Releasing free addresses stays allowed.
    pub eni_attachment_allowed: bool,
    /// Since when the pool has had a spare ENI without interruption (the caller keeps it with
    /// [`track_excess`]); an ENI is freed only [`ENI_EXCESS_HOLD`] after it.
    pub excess_since: Option<SystemTime>,
}

/// The caller's "spare ENI since" after looking at the pool now: kept while the pool still has
/// a freeable ENI, started now when it first has one, cleared when it has none (or pods wait).
#[must_use]
pub fn track_excess(
    since: Option<SystemTime>,
    stats: &PoolStats,
    t: &Targets,
    now: SystemTime,
    waiting_pods: u32,
) -> Option<SystemTime> {
    let spare =
        waiting_pods == 0 && shortfall(stats, t, 0) == 0 && freeable_eni(stats, t).is_some();
    spare.then(|| since.unwrap_or(now))
}

/// Addresses missing (>0) to satisfy the targets, in addresses.
fn shortfall(stats: &PoolStats, t: &Targets, waiting: u32) -> u32 {
    let available = stats.available();
    let total = stats.total;
    let target_short = if t.ip_targets() {
        t.warm_ip
            .saturating_sub(available)
            .max(t.minimum_ip.saturating_sub(total))
    } else if t.prefix_delegation {
        // Low when free < 16 × WARM_PREFIX_TARGET.
        (PREFIX_SIZE * t.warm_prefix).saturating_sub(available)
    } else {
        let want = t.ips_per_eni() * t.warm_eni;
        if t.warm_eni == 0 && available == 0 {
            1
        } else {
            want.saturating_sub(available)
        }
    };
    target_short.max(waiting.saturating_sub(available))
}

/// Addresses over the IP targets (only meaningful with WARM_IP/MINIMUM_IP).
fn excess(stats: &PoolStats, t: &Targets) -> u32 {
    let available = stats.available();
    available
        .saturating_sub(t.warm_ip)
        .min(stats.total.saturating_sub(t.minimum_ip))
}

/// Decides the next pool action.
#[must_use]
pub fn decide(stats: &PoolStats, t: &Targets, m: Conditions) -> Decision {
    if !m.changes_allowed {
        return Decision::Nothing;
    }
    if let Some(d) = release_excluded(stats) {
        return d;
    }
    let short = shortfall(stats, t, m.waiting_pods);
    if short > 0 {
        if !m.eni_attachment_allowed {
            return Decision::Blocked(Blocked::NodeUnschedulable);
        }
        return grow(stats, t, short);
    }
    let paced = m.last_shrink.is_none_or(|last| {
        m.now
            .duration_since(last)
            .is_ok_and(|d| d >= SHRINK_INTERVAL)
    });
    if !paced || m.waiting_pods > 0 {
        return Decision::Nothing;
    }
    if let Some(eni_id) = freeable_eni(stats, t).filter(|_| m.eni_attachment_allowed) {
        let held = m.excess_since.is_some_and(|since| {
            m.now
                .duration_since(since)
                .is_ok_and(|d| d >= ENI_EXCESS_HOLD)
        });
        if held {
            return Decision::FreeEni { eni_id };
        }
        // Not yet: the spare ENI stays. With WARM_ENI_TARGET nothing else happens; with IP targets
        // or PD the usual release of excess addresses goes on meanwhile.
    }
    release(stats, t)
}

fn grow(stats: &PoolStats, t: &Targets, short: u32) -> Decision {
    let unit = t.unit();
    let mut need = short;
    if let Some(max) = t.max_pods {
        let room = max.saturating_sub(stats.total);
        if room == 0 {
            return Decision::Blocked(Blocked::MaxPods);
        }
        need = need.min(room);
    }
    let need_cidrs = need.div_ceil(unit);
    // Fill existing ENIs first (lowest device number); an ENI whose subnet ran dry is passed over
    // (the next ENI, then a new ENI in the freest subnet).
    let room_in = |e: &&crate::datastore::EniStats| !e.is_special && e.cidr_count < t.cidrs_per_eni;
    let with_room = stats.enis.iter().filter(room_in).find(|e| !e.subnet_dry);
    if let Some(eni) = with_room {
        let room = t.cidrs_per_eni - eni.cidr_count;
        // WARM_ENI_TARGET mode fills the whole ENI in one call.
        let count = if t.ip_targets() || t.prefix_delegation {
            need_cidrs.min(room)
        } else {
            room
        };
        let eni_id = eni.id.clone();
        return if t.prefix_delegation {
            Decision::AssignPrefixes { eni_id, count }
        } else {
            Decision::AssignIps { eni_id, count }
        };
    }
    if u32::try_from(stats.enis.len()).unwrap_or(u32::MAX) < t.max_enis {
        let count = if t.ip_targets() || t.prefix_delegation {
            need_cidrs.min(t.cidrs_per_eni)
        } else {
            t.cidrs_per_eni
        };
        return Decision::AllocateEni {
            count: count.max(1),
        };
    }
    if stats.enis.iter().any(|e| room_in(&e)) {
        return Decision::Blocked(Blocked::SubnetsDry);
    }
    Decision::Blocked(Blocked::InstanceLimit)
}

/// A deletable ENI that is not needed for the targets. Never one whose /80 holds a pod's
/// /128 (a dual-stack pod's IPv6 goes with the ENI), nor any while a pod's /128 is on no
/// known ENI.
fn freeable_eni(stats: &PoolStats, t: &Targets) -> Option<String> {
    if stats.ipv6_unplaced > 0 {
        return None;
    }
    let available = stats.available();
    let mut candidates: Vec<_> = stats
        .enis
        .iter()
        .filter(|e| {
            !e.is_primary
                && !e.is_special
                && e.past_min_lifetime
                && e.assigned == 0
                && e.cooling == 0
                && e.ipv6_assigned == 0
        })
        .collect();
    // The highest device number first: keep low devices stable.
    candidates.sort_by_key(|e| std::cmp::Reverse(e.device_number));
    candidates.into_iter().find_map(|e| {
        let after_available = available.saturating_sub(e.total);
        let after_total = stats.total.saturating_sub(e.total);
        let keep = if t.ip_targets() {
            after_available >= t.warm_ip && after_total >= t.minimum_ip
        } else if t.prefix_delegation {
            after_available >= PREFIX_SIZE * t.warm_prefix
        } else {
            // Free one when a whole ENI beyond the target is free.
            after_available >= t.ips_per_eni() * t.warm_eni
        };
        keep.then(|| e.id.clone())
    })
}

fn release(stats: &PoolStats, t: &Targets) -> Decision {
    if t.ip_targets() {
        let over = excess(stats, t);
        if t.prefix_delegation {
            let n = usize::try_from(over / PREFIX_SIZE).unwrap_or(0);
            let d = release_from_one(stats, n, true);
            if d != Decision::Nothing {
                return d;
            }
            // Free /32s above the IP targets (left from before PD, or fallback ones).
            return release_from_one(stats, usize::try_from(over).unwrap_or(0), false);
        }
        return release_from_one(stats, usize::try_from(over).unwrap_or(0), false);
    }
    if t.prefix_delegation {
        let n = stats.free_prefixes.saturating_sub(t.warm_prefix);
        // Never leave the pool below the warm target by releasing.
        let available_after = stats.available().saturating_sub(n * PREFIX_SIZE);
        if n > 0 && available_after >= PREFIX_SIZE * t.warm_prefix {
            let d = release_from_one(stats, usize::try_from(n).unwrap_or(0), true);
            if d != Decision::Nothing {
                return d;
            }
        }
        // Free secondary /32s (left from before PD was switched on, or from the fragmentation
        // fallback) go while the pool still meets the warm target without them; fallback /32s
        // that ARE the warm pool stay, so there is no release/re-assign churn.
        let free_ips = stats
            .enis
            .iter()
            .filter(|e| !e.is_special)
            .flat_map(|e| &e.free_cidrs)
            .filter(|c| c.prefix_len() == 32)
            .count();
        let spare = stats
            .available()
            .saturating_sub(PREFIX_SIZE * t.warm_prefix);
        let n = free_ips.min(usize::try_from(spare).unwrap_or(0));
        return release_from_one(stats, n, false);
    }
    // WARM_ENI_TARGET never releases single IPs.
    Decision::Nothing
}

/// Free CIDRs of an excluded ENI go back to EC2 whatever the targets (at start, and when a pod
/// leaves one): an ENI in a subnet tagged `kubernetes.io/role/cni=0` keeps only what its pods hold.
fn release_excluded(stats: &PoolStats) -> Option<Decision> {
    let eni = stats
        .enis
        .iter()
        .find(|e| e.is_excluded && !e.free_cidrs.is_empty())?;
    let eni_id = eni.id.clone();
    let prefixes: Vec<Ipv4Net> = eni
        .free_cidrs
        .iter()
        .filter(|c| c.prefix_len() < 32)
        .copied()
        .collect();
    if !prefixes.is_empty() {
        return Some(Decision::ReleasePrefixes { eni_id, prefixes });
    }
    Some(Decision::ReleaseIps {
        eni_id,
        ips: eni.free_cidrs.iter().map(Ipv4Net::addr).collect(),
    })
}

/// Releases up to `n` free CIDRs from the ENI with the fewest assigned addresses (so it empties
/// and can be freed), preferring non-primary ENIs.
fn release_from_one(stats: &PoolStats, n: usize, prefixes: bool) -> Decision {
    if n == 0 {
        return Decision::Nothing;
    }
    let eni = stats
        .enis
        .iter()
        .filter(|e| {
            !e.is_special
                && e.free_cidrs
                    .iter()
                    .any(|c| (c.prefix_len() < 32) == prefixes)
        })
        .min_by_key(|e| (e.assigned, e.is_primary, std::cmp::Reverse(e.device_number)));
    let Some(eni) = eni else {
        return Decision::Nothing;
    };
    let cidrs: Vec<Ipv4Net> = eni
        .free_cidrs
        .iter()
        .filter(|c| (c.prefix_len() < 32) == prefixes)
        .take(n)
        .copied()
        .collect();
    if cidrs.is_empty() {
        return Decision::Nothing;
    }
    let eni_id = eni.id.clone();
    if prefixes {
        Decision::ReleasePrefixes {
            eni_id,
            prefixes: cidrs,
        }
    } else {
        Decision::ReleaseIps {
            eni_id,
            ips: cidrs.iter().map(Ipv4Net::addr).collect(),
        }
    }
}

#[cfg(test)]
mod tests;
