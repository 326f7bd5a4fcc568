//! Warm-pool policy: PURE. Pool statistics + targets + limits + now → one [`Decision`]. Must
//! not: call the provider, mutate the datastore, read the clock or the environment.
//!
//! Upstream semantics (`ipamd.go`), with one deliberate change: addresses in cooldown are NOT
//! available (upstream #2896), so the pool grows to cover them instead of failing pods.

use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;

use crate::datastore::PoolStats;

/// Addresses per /28 prefix.
pub const PREFIX_SIZE: u32 = 16;
/// Minimum interval between two shrink actions (upstream 30 s).
pub const SHRINK_INTERVAL: Duration = Duration::from_secs(30);
/// How long the pool must have had a spare (freeable) ENI without interruption before one is
/// freed (ours; upstream frees at the next 30 s shrink pass). Freeing and re-creating an ENI
/// costs five mutating calls (Detach, Delete; Create, Attach, Modify) and a pod wait; keeping a
/// spare one costs only its subnet addresses. Under a steady churn the pool dips below its
/// target every time a deleted pod's address cools down (30 s, #2896) and the next pod arrives,
/// so two minutes of continuous excess (4 address cooldowns, 4 shrink intervals, 24 pool ticks)
/// do not happen while pods still come and go, and a node that really scaled down still
/// returns the ENI within ~2.5 minutes, to the same steady state as upstream.
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

impl Targets {
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
pub struct Moment {
    /// Now.
    pub now: SystemTime,
    /// When the last shrink action happened.
    pub last_shrink: Option<SystemTime>,
    /// AddNetwork calls waiting for an address right now.
    pub waiting_pods: u32,
    /// Network changes are allowed (false while shutting down or provisioning is disabled).
    pub changes_allowed: bool,
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
        // Upstream: low when free < 16 × WARM_PREFIX_TARGET.
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
pub fn decide(stats: &PoolStats, t: &Targets, m: Moment) -> Decision {
    if !m.changes_allowed {
        return Decision::Nothing;
    }
    let short = shortfall(stats, t, m.waiting_pods);
    if short > 0 {
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
    if let Some(eni_id) = freeable_eni(stats, t) {
        let held = m.excess_since.is_some_and(|since| {
            m.now
                .duration_since(since)
                .is_ok_and(|d| d >= ENI_EXCESS_HOLD)
        });
        if held {
            return Decision::FreeEni { eni_id };
        }
        // Not yet: the spare ENI stays. With WARM_ENI_TARGET nothing else happens; with IP
        // targets or PD the usual release of excess addresses goes on meanwhile (upstream).
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
    // Fill existing ENIs first (lowest device number), as upstream.
    let with_room = stats
        .enis
        .iter()
        .filter(|e| !e.is_special)
        .find(|e| e.cidr_count < t.cidrs_per_eni);
    if let Some(eni) = with_room {
        let room = t.cidrs_per_eni - eni.cidr_count;
        // WARM_ENI_TARGET mode fills the whole ENI in one call, as upstream does.
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
    Decision::Blocked(Blocked::InstanceLimit)
}

/// A deletable ENI that is not needed for the targets.
fn freeable_eni(stats: &PoolStats, t: &Targets) -> Option<String> {
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
            // Upstream shouldRemoveExtraENIs: free one when a whole ENI beyond the target is free.
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
    // WARM_ENI_TARGET never releases single IPs (upstream).
    Decision::Nothing
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
mod tests {
    //! Table-driven from upstream docs/eni-and-ip-target.md and docs/prefix-and-ip-target.md:
    //! pods arrive one by one; after each, decisions are applied to a simulated node until the
    //! policy says Nothing; then the node's shape is compared with the documented row.
    use super::*;
    use crate::datastore::{DataStore, EniSpec, IpamKey, PodMetadata};

    struct Sim {
        ds: DataStore,
        t: Targets,
        next_ip: u32,
        next_dev: u32,
        now: SystemTime,
        pods: u32,
    }

    impl Sim {
        fn new(t: Targets) -> Self {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
            let mut ds = DataStore::new(Duration::from_secs(30));
            ds.add_eni(spec("eni-0", 0), now).unwrap();
            let mut s = Self {
                ds,
                t,
                next_ip: u32::from(Ipv4Addr::new(198, 18, 0, 0)),
                next_dev: 1,
                now,
                pods: 0,
            };
            s.settle();
            s
        }

        fn cidr(&mut self) -> (Ipv4Net, bool) {
            if self.t.prefix_delegation {
                let n = Ipv4Net::new(Ipv4Addr::from(self.next_ip), 28).unwrap();
                self.next_ip += 16;
                (n, true)
            } else {
                let n = Ipv4Net::new(Ipv4Addr::from(self.next_ip), 32).unwrap();
                self.next_ip += 1;
                (n, false)
            }
        }

        fn settle(&mut self) {
            for _ in 0..100 {
                let stats = self.ds.stats(self.now);
                let d = decide(
                    &stats,
                    &self.t,
                    Moment {
                        now: self.now,
                        last_shrink: None,
                        waiting_pods: 0,
                        changes_allowed: true,
                        excess_since: None,
                    },
                );
                match d {
                    Decision::Nothing | Decision::Blocked(_) => return,
                    Decision::AssignIps { eni_id, count }
                    | Decision::AssignPrefixes { eni_id, count } => {
                        for _ in 0..count {
                            let (n, p) = self.cidr();
                            self.ds.add_cidr(&eni_id, n, p).unwrap();
                        }
                    }
                    Decision::AllocateEni { count } => {
                        let id = format!("eni-{}", self.next_dev);
                        self.ds.add_eni(spec(&id, self.next_dev), self.now).unwrap();
                        self.next_dev += 1;
                        for _ in 0..count {
                            let (n, p) = self.cidr();
                            self.ds.add_cidr(&id, n, p).unwrap();
                        }
                    }
                    other => panic!("unexpected shrink while growing: {other:?}"),
                }
            }
            panic!("policy did not settle");
        }

        fn add_pods(&mut self, n: u32) {
            for _ in 0..n {
                self.pods += 1;
                let k = IpamKey::new("aws-cni", &format!("c{}", self.pods), "eth0");
                self.ds
                    .assign(&k, PodMetadata::default(), self.now)
                    .unwrap();
                self.settle();
            }
        }

        /// (ENIs, total addresses or prefixes, unused addresses)
        fn shape(&self) -> (usize, u32, u32) {
            let s = self.ds.stats(self.now);
            let units = if self.t.prefix_delegation {
                s.prefixes
            } else {
                s.total
            };
            (s.enis.len(), units, s.available())
        }
    }

    fn spec(id: &str, dev: u32) -> EniSpec {
        EniSpec {
            id: id.into(),
            device_number: dev,
            network_card: 0,
            is_primary: dev == 0,
            is_trunk: false,
            is_efa: false,
            is_excluded: false,
            subnet_id: String::new(),
            subnet: "198.18.0.0/16".parse().unwrap(),
        }
    }

    fn targets(
        warm_eni: u32,
        warm_ip: u32,
        min_ip: u32,
        warm_prefix: u32,
        pd: bool,
        max_enis: u32,
        per_eni: u32,
    ) -> Targets {
        Targets {
            warm_eni,
            warm_ip,
            minimum_ip: min_ip,
            warm_prefix,
            prefix_delegation: pd,
            max_enis,
            cidrs_per_eni: per_eni,
            max_pods: None,
        }
    }

    #[test]
    fn eni_and_ip_target_doc_table() {
        // (instance, WARM_ENI, WARM_IP, MIN_IP, pods, ENIs, secondary IPs, unused)
        let t3_small = (3, 3);
        let p3dn = (15, 49);
        let rows = [
            (t3_small, 1, 0, 0, 0, 1, 3, 3),
            (t3_small, 1, 0, 0, 5, 3, 9, 4),
            (t3_small, 1, 0, 0, 9, 3, 9, 0),
            (t3_small, 0, 1, 1, 0, 1, 1, 1),
            (t3_small, 0, 1, 1, 5, 2, 6, 1),
            (t3_small, 0, 1, 1, 9, 3, 9, 0),
            (t3_small, 0, 2, 5, 0, 2, 5, 5),
            (t3_small, 0, 2, 5, 5, 3, 7, 2),
            (t3_small, 0, 2, 5, 9, 3, 9, 0),
            (p3dn, 1, 0, 0, 0, 1, 49, 49),
            (p3dn, 1, 0, 0, 3, 2, 98, 95),
            (p3dn, 1, 0, 0, 95, 3, 147, 52),
            (p3dn, 0, 5, 10, 0, 1, 10, 10),
            (p3dn, 0, 5, 10, 7, 1, 12, 5),
            (p3dn, 0, 5, 10, 15, 1, 20, 5),
            (p3dn, 0, 5, 10, 45, 2, 50, 5),
        ];
        for ((max_enis, per_eni), warm_eni, warm_ip, min_ip, pods, enis, ips, unused) in rows {
            let mut sim = Sim::new(targets(
                warm_eni, warm_ip, min_ip, 0, false, max_enis, per_eni,
            ));
            sim.add_pods(pods);
            assert_eq!(
                sim.shape(),
                (enis, ips, unused),
                "row eni={warm_eni} ip={warm_ip} min={min_ip} pods={pods}"
            );
        }
    }

    #[test]
    fn prefix_and_ip_target_doc_table() {
        // t3.small: 3 ENIs x 3 prefix slots. (WARM_PREFIX, WARM_IP, MIN_IP, pods, ENIs, prefixes, unused IPs)
        let rows = [
            (1, 0, 0, 0, 1, 1, 16),
            (1, 0, 0, 5, 1, 2, 27),
            (1, 0, 0, 16, 1, 2, 16),
            (1, 0, 0, 17, 1, 3, 31),
            (1, 0, 0, 58, 2, 5, 22),
            (0, 1, 1, 0, 1, 1, 16),
            (0, 1, 1, 5, 1, 1, 11),
            (0, 1, 1, 17, 1, 2, 15),
            (0, 1, 1, 58, 2, 4, 6),
            (0, 7, 20, 5, 1, 2, 27),
            (0, 7, 20, 17, 1, 2, 15),
            (0, 7, 20, 58, 2, 5, 22),
        ];
        for (warm_prefix, warm_ip, min_ip, pods, enis, prefixes, unused) in rows {
            let mut sim = Sim::new(targets(0, warm_ip, min_ip, warm_prefix, true, 3, 3));
            sim.add_pods(pods);
            assert_eq!(
                sim.shape(),
                (enis, prefixes, unused),
                "row prefix={warm_prefix} ip={warm_ip} min={min_ip} pods={pods}"
            );
        }
    }

    fn moment(now: SystemTime) -> Moment {
        Moment {
            now,
            last_shrink: None,
            waiting_pods: 0,
            changes_allowed: true,
            excess_since: None,
        }
    }

    #[test]
    fn pd_releases_free_secondary_ips_only_above_the_warm_target() {
        // WARM_PREFIX_TARGET=1 after PD was switched on: (free /32s, free /28s) -> /32s released.
        let t = targets(0, 0, 0, 1, true, 3, 3);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        for (ips, prefix, released) in [
            (5, true, 5),   // a free /28 is the warm pool: every leftover /32 goes
            (20, false, 4), // no /28 yet: keep 16 addresses' worth of /32s
            (16, false, 0), // the fragmentation fallback's /32s ARE the warm pool: no churn
        ] {
            let mut ds = DataStore::new(Duration::from_secs(30));
            ds.add_eni(spec("eni-0", 0), now).unwrap();
            ds.add_eni(spec("eni-1", 1), now).unwrap();
            for i in 0..ips {
                ds.add_cidr(
                    "eni-0",
                    format!("198.18.1.{}/32", i + 10).parse().unwrap(),
                    false,
                )
                .unwrap();
            }
            if prefix {
                // On the other ENI, so the /32s' ENI must be found by what it holds.
                ds.add_cidr("eni-1", "198.18.2.16/28".parse().unwrap(), true)
                    .unwrap();
            }
            let d = decide(&ds.stats(now), &t, moment(now));
            let got = match &d {
                Decision::ReleaseIps { eni_id, ips } => {
                    assert_eq!(eni_id, "eni-0");
                    ips.len()
                }
                Decision::Nothing => 0,
                other => panic!("{other:?}"),
            };
            assert_eq!(got, released, "ips={ips} prefix={prefix}: {d:?}");
        }
        // With WARM_IP_TARGET=2 instead: only the excess over the IP target goes.
        let t = targets(0, 2, 0, 0, true, 3, 3);
        let mut ds = DataStore::new(Duration::from_secs(30));
        ds.add_eni(spec("eni-0", 0), now).unwrap();
        for i in 0..5 {
            ds.add_cidr(
                "eni-0",
                format!("198.18.1.{}/32", i + 10).parse().unwrap(),
                false,
            )
            .unwrap();
        }
        match decide(&ds.stats(now), &t, moment(now)) {
            Decision::ReleaseIps { ips, .. } => assert_eq!(ips.len(), 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cooling_addresses_make_the_pool_grow() {
        // #2896: 1 free IP that is cooling must not count as the warm IP.
        let t = targets(0, 1, 0, 0, false, 3, 3);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let mut ds = DataStore::new(Duration::from_secs(30));
        ds.add_eni(spec("eni-0", 0), now).unwrap();
        ds.add_cidr("eni-0", "198.18.0.5/32".parse().unwrap(), false)
            .unwrap();
        let k = IpamKey::new("n", "c", "eth0");
        ds.assign(&k, PodMetadata::default(), now).unwrap();
        ds.unassign(&k, now).unwrap();
        let d = decide(&ds.stats(now + Duration::from_secs(1)), &t, moment(now));
        assert_eq!(
            d,
            Decision::AssignIps {
                eni_id: "eni-0".into(),
                count: 1
            }
        );
    }

    #[test]
    fn shrink_is_paced_and_releases_only_excess() {
        let t = targets(0, 2, 0, 0, false, 3, 10);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let mut ds = DataStore::new(Duration::ZERO);
        ds.add_eni(spec("eni-0", 0), now).unwrap();
        for i in 10..16 {
            ds.add_cidr("eni-0", format!("198.18.0.{i}/32").parse().unwrap(), false)
                .unwrap();
        }
        let stats = ds.stats(now);
        let d = decide(&stats, &t, moment(now));
        let Decision::ReleaseIps { ips, .. } = &d else {
            panic!("{d:?}")
        };
        assert_eq!(ips.len(), 4);
        let recent = Moment {
            last_shrink: Some(now - Duration::from_secs(10)),
            ..moment(now)
        };
        assert_eq!(decide(&stats, &t, recent), Decision::Nothing);
        let shutting = Moment {
            changes_allowed: false,
            ..moment(now)
        };
        assert_eq!(decide(&stats, &t, shutting), Decision::Nothing);
    }

    #[test]
    fn empty_old_eni_is_freed_young_one_is_not() {
        let t = targets(1, 0, 0, 0, false, 3, 2);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let mut ds = DataStore::new(Duration::ZERO);
        ds.add_eni(spec("eni-0", 0), t0).unwrap();
        ds.add_cidr("eni-0", "198.18.0.10/32".parse().unwrap(), false)
            .unwrap();
        ds.add_cidr("eni-0", "198.18.0.11/32".parse().unwrap(), false)
            .unwrap();
        for (dev, base) in [(1, 20), (2, 30)] {
            ds.add_eni(spec(&format!("eni-{dev}"), dev), t0).unwrap();
            ds.add_cidr(
                &format!("eni-{dev}"),
                format!("198.18.0.{base}/32").parse().unwrap(),
                false,
            )
            .unwrap();
            ds.add_cidr(
                &format!("eni-{dev}"),
                format!("198.18.0.{}/32", base + 1).parse().unwrap(),
                false,
            )
            .unwrap();
        }
        // 6 free, target 1 ENI (2 IPs): two ENIs are surplus, but none is 60 s old yet.
        assert_eq!(
            decide(
                &ds.stats(t0 + Duration::from_secs(30)),
                &t,
                moment(t0 + Duration::from_secs(30))
            ),
            Decision::Nothing
        );
        let later = t0 + Duration::from_secs(61);
        let spare_long_ago = Moment {
            excess_since: Some(later - ENI_EXCESS_HOLD),
            ..moment(later)
        };
        assert_eq!(
            decide(&ds.stats(later), &t, spare_long_ago),
            Decision::FreeEni {
                eni_id: "eni-2".into()
            }
        );
    }

    /// A node with WARM_ENI_TARGET=1 (2 addresses per ENI): eni-0 full with pods, eni-1 and
    /// eni-2 (both old) free: one of them is spare.
    fn node_with_a_spare_eni(t0: SystemTime) -> DataStore {
        let mut ds = DataStore::new(Duration::from_secs(30));
        for dev in 0..3 {
            ds.add_eni(spec(&format!("eni-{dev}"), dev), t0).unwrap();
            for k in 0..2 {
                ds.add_cidr(
                    &format!("eni-{dev}"),
                    format!("198.18.0.{}/32", 10 * (dev + 1) + k)
                        .parse()
                        .unwrap(),
                    false,
                )
                .unwrap();
            }
        }
        for i in 0..2 {
            ds.assign(
                &IpamKey::new("n", &format!("p{i}"), "eth0"),
                PodMetadata::default(),
                t0,
            )
            .unwrap();
        }
        ds
    }

    #[test]
    fn a_spare_eni_is_freed_only_after_the_pool_has_been_in_excess_for_the_hold() {
        let t = targets(1, 0, 0, 0, false, 3, 2);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let ds = node_with_a_spare_eni(t0);
        let at = t0 + Duration::from_secs(120);
        let stats = ds.stats(at);
        // the tracker starts the clock when it first sees the spare ENI and keeps it
        let since = track_excess(None, &stats, &t, at, 0);
        assert_eq!(since, Some(at));
        assert_eq!(
            track_excess(since, &stats, &t, at + Duration::from_secs(5), 0),
            since
        );
        // a waiting pod is not excess
        assert_eq!(track_excess(since, &stats, &t, at, 1), None);
        let with = |since: Option<SystemTime>, now: SystemTime| Moment {
            excess_since: since,
            ..moment(now)
        };
        // past every other pacing (ENI lifetime, shrink interval) but not the hold: nothing
        // (WARM_ENI_TARGET never releases single addresses)
        assert_eq!(decide(&stats, &t, with(since, at)), Decision::Nothing);
        let almost = at + ENI_EXCESS_HOLD - Duration::from_secs(1);
        assert_eq!(
            decide(&ds.stats(almost), &t, with(since, almost)),
            Decision::Nothing
        );
        assert_eq!(
            decide(&ds.stats(almost), &t, with(None, almost)),
            Decision::Nothing
        );
        let held = at + ENI_EXCESS_HOLD;
        assert_eq!(
            decide(&ds.stats(held), &t, with(since, held)),
            Decision::FreeEni {
                eni_id: "eni-2".into()
            }
        );
    }

    #[test]
    fn a_churning_pool_restarts_the_hold_at_every_dip_below_the_target() {
        // Pods replaced one by one: each deleted address cools down for 30 s, during which
        // the spare ENI is needed for the warm target; the hold never runs out, so the ENI
        // is neither freed nor (after a free) created again.
        let t = targets(1, 0, 0, 0, false, 3, 2);
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let mut ds = node_with_a_spare_eni(t0);
        let mut since = None;
        let mut now = t0 + Duration::from_secs(60);
        let mut pod = 2;
        let mut dips = 0;
        for step in 0..120 {
            // every 50 s one pod is replaced on this node
            if step % 10 == 0 {
                let old = IpamKey::new("n", &format!("p{}", pod - 2), "eth0");
                ds.unassign(&old, now).unwrap();
                ds.assign(
                    &IpamKey::new("n", &format!("p{pod}"), "eth0"),
                    PodMetadata::default(),
                    now,
                )
                .unwrap();
                pod += 1;
            }
            let stats = ds.stats(now);
            since = track_excess(since, &stats, &t, now, 0);
            if since.is_none() {
                dips += 1;
            }
            let d = decide(
                &stats,
                &t,
                Moment {
                    excess_since: since,
                    ..moment(now)
                },
            );
            assert!(!matches!(d, Decision::FreeEni { .. }), "step {step}: {d:?}");
            now += Duration::from_secs(5);
        }
        assert!(
            dips > 0,
            "the churn never dipped below the target: the test proves nothing"
        );
        // the churn stops: the hold after the last dip (and not before) the spare ENI goes
        let quiet = now + Duration::from_secs(30);
        since = track_excess(since, &ds.stats(quiet), &t, quiet, 0);
        let since_t = since.expect("a quiet pool is in excess");
        let at = |now: SystemTime| {
            decide(
                &ds.stats(now),
                &t,
                Moment {
                    excess_since: since,
                    ..moment(now)
                },
            )
        };
        assert_eq!(
            at(since_t + ENI_EXCESS_HOLD - Duration::from_secs(1)),
            Decision::Nothing
        );
        assert!(matches!(
            at(since_t + ENI_EXCESS_HOLD),
            Decision::FreeEni { .. }
        ));
    }

    #[test]
    fn limits_block_growth() {
        let mut t = targets(0, 5, 0, 0, false, 1, 2);
        let now = SystemTime::UNIX_EPOCH;
        let mut ds = DataStore::new(Duration::ZERO);
        ds.add_eni(spec("eni-0", 0), now).unwrap();
        ds.add_cidr("eni-0", "198.18.0.10/32".parse().unwrap(), false)
            .unwrap();
        ds.add_cidr("eni-0", "198.18.0.11/32".parse().unwrap(), false)
            .unwrap();
        assert_eq!(
            decide(&ds.stats(now), &t, moment(now)),
            Decision::Blocked(Blocked::InstanceLimit)
        );
        t.max_pods = Some(2);
        assert_eq!(
            decide(&ds.stats(now), &t, moment(now)),
            Decision::Blocked(Blocked::MaxPods)
        );
    }

    #[test]
    fn waiting_pods_force_growth_even_when_targets_are_met() {
        let t = targets(0, 0, 1, 0, false, 3, 3);
        let now = SystemTime::UNIX_EPOCH;
        let mut ds = DataStore::new(Duration::ZERO);
        ds.add_eni(spec("eni-0", 0), now).unwrap();
        ds.add_cidr("eni-0", "198.18.0.10/32".parse().unwrap(), false)
            .unwrap();
        let k = IpamKey::new("n", "c", "eth0");
        ds.assign(&k, PodMetadata::default(), now).unwrap();
        assert_eq!(decide(&ds.stats(now), &t, moment(now)), Decision::Nothing);
        let waiting = Moment {
            waiting_pods: 2,
            ..moment(now)
        };
        assert_eq!(
            decide(&ds.stats(now), &t, waiting),
            Decision::AssignIps {
                eni_id: "eni-0".into(),
                count: 2
            }
        );
    }
}
