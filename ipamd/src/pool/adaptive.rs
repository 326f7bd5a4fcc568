//! The adaptive warm pool's state in the executor (`WARM_POOL_POLICY=adaptive`): feeds the
//! pure estimators of `ipam_core::pool::policy::adaptive` with what only the daemon sees (the
//! cumulative ADD count, the time each grow action took until its addresses were usable) and
//! turns card 0's targets into the adaptive ones before every decision. Must not: decide (the
//! pure policy does), do I/O.

use std::time::{Duration, SystemTime};

use crate::pool::policy::adaptive::{
    self, ArrivalRate, Bursts, Demand, Growth, Peaks, RefillTimes,
};
use crate::pool::policy::{Decision, Targets};
use ipam_core::datastore::PoolStats;

/// How long an ADD that takes the pool under its warm target waits before the pool loop looks:
/// the ADD wakes it (`PoolSignal::refill_wanted`), so only the wake-up and a pass already under
/// way, not the loop's tick.
pub const WOKEN_REACTION: Duration = Duration::from_millis(250);

/// Estimators of one node's card-0 pool.
#[derive(Debug, Clone)]
pub struct AdaptivePool {
    rate: ArrivalRate,
    bursts: Bursts,
    refill: RefillTimes,
    /// How long an ADD may wait before the loop looks (the wake-up, [`WOKEN_REACTION`]).
    reaction: Duration,
    /// The last warm target (logged when it changes).
    last_warm: Option<u32>,
    /// The ADD rate the last target was computed from.
    last_rate: f64,
}

impl AdaptivePool {
    /// For a pool loop that looks within `reaction` of an ADD taking the pool under its target
    /// ([`WOKEN_REACTION`] in the daemon).
    #[must_use]
    pub fn new(reaction: Duration) -> Self {
        Self {
            rate: ArrivalRate::default(),
            bursts: Bursts::default(),
            refill: RefillTimes::default(),
            reaction,
            last_warm: None,
            last_rate: 0.0,
        }
    }

    /// The targets to decide with now: `base` with the adaptive warm target, after taking the
    /// cumulative ADD count `adds`; `subnet_free`: what the node's subnets can still give as far
    /// as ipamd knows ([`ipam_core::pool::capacity::SubnetRoom::known_free`]).
    pub fn targets(
        &mut self,
        base: &Targets,
        stats: &PoolStats,
        now: SystemTime,
        adds: u64,
        subnet_free: Option<u32>,
    ) -> Targets {
        self.rate.observe(now, adds);
        self.bursts.observe(now, adds);
        let peaks = Peaks {
            assign: self
                .bursts
                .peak(self.reaction + self.refill.of(Growth::Assign)),
            new_eni: self
                .bursts
                .peak(self.reaction + self.refill.of(Growth::NewEni)),
        };
        let demand = Demand {
            rate: self.rate.per_second(now),
            reaction: self.reaction,
            refill: self.refill,
            subnet_free,
            peaks,
        };
        let t = adaptive::targets(base, stats, &demand);
        if self.last_warm != Some(t.warm_ip) {
            tracing::info!(
                warm_ip = t.warm_ip,
                adds_per_second = demand.rate,
                burst_in_assign_window = peaks.assign,
                assign_refill_ms = demand.refill.of(Growth::Assign).as_millis(),
                eni_refill_ms = demand.refill.of(Growth::NewEni).as_millis(),
                subnet_free = ?subnet_free,
                "adaptive warm pool target"
            );
            self.last_warm = Some(t.warm_ip);
        }
        self.last_rate = demand.rate;
        t
    }

    /// The last warm target and the ADD rate it was computed from (None before the first).
    #[must_use]
    pub fn last(&self) -> Option<(u32, f64)> {
        self.last_warm.map(|w| (w, self.last_rate))
    }

    /// A grow `decision` taken at `decided` whose addresses are usable at `usable`.
    pub fn grown(&mut self, decision: &Decision, decided: SystemTime, usable: SystemTime) {
        let growth = match decision {
            Decision::AssignIps { .. } | Decision::AssignPrefixes { .. } => Growth::Assign,
            Decision::AllocateEni { .. } => Growth::NewEni,
            _ => return,
        };
        self.refill
            .record(growth, usable.duration_since(decided).unwrap_or_default());
    }

    /// Publishes the last target and what it was computed from as `awscni_adaptive_*`.
    pub fn publish(&self, metrics: &crate::metrics::Metrics) {
        let Some((warm, rate)) = self.last() else {
            return;
        };
        metrics.adaptive_warm_ip_target.set([], f64::from(warm));
        metrics.adaptive_add_rate.set([], rate);
        for (growth, label) in [(Growth::Assign, "assign"), (Growth::NewEni, "new_eni")] {
            metrics
                .adaptive_refill_seconds
                .set([label], self.refill.of(growth).as_secs_f64());
        }
    }

    /// The measured refill times.
    #[must_use]
    pub fn refill(&self) -> RefillTimes {
        self.refill
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::policy::adaptive::{PRIOR_ENI_REFILL, warm_for};

    fn base() -> Targets {
        Targets {
            warm_eni: 1,
            warm_ip: 0,
            minimum_ip: 3,
            warm_prefix: 0,
            prefix_delegation: false,
            max_enis: 3,
            cidrs_per_eni: 10,
            max_pods: Some(60),
        }
    }

    #[test]
    fn the_add_count_and_the_measured_refill_set_the_warm_target() {
        let mut a = AdaptivePool::new(Duration::from_secs(5));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let stats = PoolStats::default();
        // no ADD yet: 1 warm address, WARM_ENI_TARGET replaced, the minimum kept
        let t = a.targets(&base(), &stats, t0, 0, None);
        assert_eq!((t.warm_ip, t.warm_eni, t.minimum_ip), (1, 0, 3));
        // 30 ADDs in a second: 1 ADD/s, and a burst of 30 within any window; no ENI with room,
        // so the new-ENI window (prior 5 s): the burst is more than the rate's quantile
        let t = a.targets(&base(), &stats, t0 + Duration::from_secs(1), 30, None);
        let by_rate = warm_for(1.0, Duration::from_secs(5) + PRIOR_ENI_REFILL);
        assert!(by_rate < 30, "{by_rate}");
        assert_eq!(t.warm_ip, 30);
        // a measured 12 s ENI refill lengthens the window; an assign measurement does not
        a.grown(
            &Decision::AllocateEni { count: 10 },
            t0,
            t0 + Duration::from_secs(12),
        );
        a.grown(
            &Decision::AssignIps {
                eni_id: "eni-1".into(),
                count: 1,
            },
            t0,
            t0 + Duration::from_millis(300),
        );
        a.grown(&Decision::Nothing, t0, t0 + Duration::from_secs(60));
        assert_eq!(a.refill().of(Growth::NewEni), Duration::from_secs(12));
        assert_eq!(a.refill().of(Growth::Assign), Duration::from_millis(300));
        let t = a.targets(&base(), &stats, t0 + Duration::from_secs(1), 30, None);
        assert_eq!(t.warm_ip, warm_for(1.0, Duration::from_secs(17)).max(30));
        // bounded by max-pods
        let capped = Targets {
            max_pods: Some(20),
            ..base()
        };
        assert_eq!(
            a.targets(&capped, &stats, t0 + Duration::from_secs(1), 30, None)
                .warm_ip,
            20
        );
        // bounded by what the subnets can still give (nothing held free here): a dry subnet
        // leaves 1, the floor
        assert_eq!(
            a.targets(&base(), &stats, t0 + Duration::from_secs(1), 30, Some(4))
                .warm_ip,
            4
        );
        assert_eq!(
            a.targets(&base(), &stats, t0 + Duration::from_secs(1), 30, Some(0))
                .warm_ip,
            1
        );
        assert_eq!(a.last().map(|(w, _)| w), Some(1));
    }
}
