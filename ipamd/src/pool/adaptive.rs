//! The adaptive warm pool's state in the executor (`WARM_POOL_POLICY=adaptive`): feeds the
//! pure estimators of `ipam_core::pool::policy::adaptive` with what only the daemon sees (the
//! cumulative ADD count, the time each grow action took until its addresses were usable) and
//! turns card 0's targets into the adaptive ones before every decision. Must not: decide (the
//! pure policy does), do I/O.

use std::time::{Duration, SystemTime};

use crate::pool::policy::adaptive::{self, ArrivalRate, Demand, Growth, RefillTimes};
use crate::pool::policy::{Decision, Targets};
use ipam_core::datastore::PoolStats;

/// Estimators of one node's card-0 pool.
#[derive(Debug, Clone)]
pub struct AdaptivePool {
    rate: ArrivalRate,
    refill: RefillTimes,
    /// How long an ADD may wait before the loop looks: its tick.
    reaction: Duration,
    /// The last warm target (logged when it changes).
    last_warm: Option<u32>,
}

impl AdaptivePool {
    /// For a pool loop ticking every `tick`.
    #[must_use]
    pub fn new(tick: Duration) -> Self {
        Self {
            rate: ArrivalRate::default(),
            refill: RefillTimes::default(),
            reaction: tick,
            last_warm: None,
        }
    }

    /// The targets to decide with now: `base` with the adaptive warm target, after taking the
    /// cumulative ADD count `adds`.
    pub fn targets(
        &mut self,
        base: &Targets,
        stats: &PoolStats,
        now: SystemTime,
        adds: u64,
    ) -> Targets {
        self.rate.observe(now, adds);
        let demand = Demand {
            rate: self.rate.per_second(now),
            reaction: self.reaction,
            refill: self.refill,
            subnet_free: None,
        };
        let t = adaptive::targets(base, stats, &demand);
        if self.last_warm != Some(t.warm_ip) {
            tracing::info!(
                warm_ip = t.warm_ip,
                adds_per_second = demand.rate,
                assign_refill_ms = demand.refill.of(Growth::Assign).as_millis(),
                eni_refill_ms = demand.refill.of(Growth::NewEni).as_millis(),
                "adaptive warm pool target"
            );
            self.last_warm = Some(t.warm_ip);
        }
        t
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

    /// The measured refill times.
    #[must_use]
    pub fn refill(&self) -> RefillTimes {
        self.refill
    }
}
