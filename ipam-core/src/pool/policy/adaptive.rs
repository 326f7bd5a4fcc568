//! The adaptive warm pool (`WARM_POOL_POLICY=adaptive`): PURE. The node's ADD arrival rate
//! (from the cumulative ADD count, time passed in) and the measured refill time of the pool
//! (from a grow decision until its addresses are usable, measured by the executor) → the warm
//! IP target the static policy ([`super::decide`]) then keeps. Must not: read the clock or the
//! environment, call the provider, know the daemon.
//!
//! The target: the smallest `k` such that at least [`QUANTILE`] of Poisson(λ·W) arrivals are
//! ≤ `k`, where λ is the estimated ADD rate and W the refill window (the pool loop's reaction
//! time plus the measured refill time of the growth the pool would need next: an assign to an
//! ENI with room, or a new ENI), and at least the most ADDs the node saw arrive within one such
//! window over the last [`BURST_MEMORY`] ([`Bursts`]: what a rate cannot foresee). At least 1, at most what max-pods still allows
//! and what the subnet still has. It replaces `WARM_IP_TARGET`, `WARM_ENI_TARGET` and
//! `WARM_PREFIX_TARGET`; `MINIMUM_IP_TARGET` stays a floor on the pool's total.
//!
//! Growing fast, shrinking slowly: every ADD raises the rate by `1 / RISE_TAU` at the next
//! observation (a burst of n ADDs raises it by n/30 s⁻¹ at once), and the estimate held falls
//! only with [`FALL_TAU`] (10 minutes: it halves in ~7 minutes without ADDs); the static
//! policy's shrink pacing (`SHRINK_INTERVAL`, `ENI_EXCESS_HOLD`) applies on top.

use std::time::{Duration, SystemTime};

use super::Targets;
use crate::datastore::PoolStats;

/// Share of refill windows whose arrivals the warm target covers (99.9 %).
pub const QUANTILE: f64 = 0.999;
/// Time constant of the fast rate estimate (each ADD adds `1 / RISE_TAU`; it forgets with it).
pub const RISE_TAU: Duration = Duration::from_secs(30);
/// Time constant with which the held estimate falls once ADDs slow down.
pub const FALL_TAU: Duration = Duration::from_secs(600);
/// Refill time assumed until the first one of its kind is measured (an assign; a new ENI:
/// create, attach, its link and host set-up).
pub const PRIOR_ASSIGN_REFILL: Duration = Duration::from_secs(1);
/// See [`PRIOR_ASSIGN_REFILL`].
pub const PRIOR_ENI_REFILL: Duration = Duration::from_secs(5);
/// Weight of a new refill measurement below the current estimate (one above replaces it: the
/// estimate rises at once and falls over a few measurements).
pub const REFILL_FALL_WEIGHT: f64 = 0.25;

/// The node's ADD arrival rate, from the cumulative ADD count observed now and then.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ArrivalRate {
    /// Fast exponentially weighted rate (per second) at `at`.
    fast: f64,
    /// The held estimate (per second) at `at`: ≥ `fast`, falling with [`FALL_TAU`].
    held: f64,
    /// Last observation: when, and the cumulative count then.
    last: Option<(SystemTime, u64)>,
}

impl ArrivalRate {
    /// Takes the cumulative ADD count `adds` seen at `now`. The first observation only sets the
    /// origin (ADDs before it are not counted); a count that went down (a restarted counter) is
    /// taken as a new origin.
    pub fn observe(&mut self, now: SystemTime, adds: u64) {
        let Some((at, seen)) = self.last else {
            self.last = Some((now, adds));
            return;
        };
        let dt = now.duration_since(at).unwrap_or_default().as_secs_f64();
        #[allow(clippy::cast_precision_loss)]
        let arrived = adds.saturating_sub(seen) as f64;
        let rise = RISE_TAU.as_secs_f64();
        self.fast = self.fast * (-dt / rise).exp() + arrived / rise;
        self.held = self
            .fast
            .max(self.held * (-dt / FALL_TAU.as_secs_f64()).exp());
        self.last = Some((now.max(at), adds));
    }

    /// The estimated ADDs per second at `now`.
    #[must_use]
    pub fn per_second(&self, now: SystemTime) -> f64 {
        let Some((at, _)) = self.last else {
            return 0.0;
        };
        let dt = now.duration_since(at).unwrap_or_default().as_secs_f64();
        self.held * (-dt / FALL_TAU.as_secs_f64()).exp()
    }
}

/// How long a burst of ADDs is remembered ([`Bursts`]): as long as the rate takes to fall.
pub const BURST_MEMORY: Duration = FALL_TAU;
/// Observations closer than this are merged (bounds [`Bursts`] to `BURST_MEMORY / 1 s`
/// samples, whatever the ADD rate).
pub const BURST_RESOLUTION: Duration = Duration::from_secs(1);

/// The node's recent bursts: the cumulative ADD count over the last [`BURST_MEMORY`], so the
/// warm target can cover the most ADDs the node has seen arrive within one refill window — what
/// a Poisson rate cannot foresee (a CronJob's pods every few minutes, a Deployment's rollout
/// batches). The ADDs between two observations are counted as having come together
/// (observations are the pool loop's passes: at most a tick apart, and at every ADD that takes
/// the pool under its target), so the figure errs on the side of more warm addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bursts {
    /// (when, cumulative ADD count), oldest first, at least [`BURST_RESOLUTION`] apart.
    samples: std::collections::VecDeque<(SystemTime, u64)>,
}

impl Bursts {
    /// Takes the cumulative ADD count `adds` seen at `now` (a count that went down starts
    /// over).
    pub fn observe(&mut self, now: SystemTime, adds: u64) {
        if self.samples.back().is_some_and(|&(_, c)| adds < c) {
            self.samples.clear();
        }
        let several = self.samples.len() > 1;
        match self.samples.back_mut() {
            // within the resolution of the last sample: it takes the new count (the ADDs
            // since count from the sample before, which only widens a burst)
            Some((at, count))
                if several && now.duration_since(*at).unwrap_or_default() < BURST_RESOLUTION =>
            {
                *count = adds;
            }
            _ => self.samples.push_back((now, adds)),
        }
        while self
            .samples
            .front()
            .is_some_and(|&(at, _)| now.duration_since(at).unwrap_or_default() > BURST_MEMORY)
        {
            self.samples.pop_front();
        }
    }

    /// The most ADDs seen within `window` (each span between two observations counted whole)
    /// over the last [`BURST_MEMORY`].
    #[must_use]
    pub fn peak(&self, window: Duration) -> u32 {
        let mut peak = 0;
        let mut first = 0;
        for j in 1..self.samples.len() {
            let (tj, cj) = self.samples[j];
            // the earliest sample i ≥ 1 whose span (from sample i-1) ends within the window
            while first + 1 < j
                && tj
                    .duration_since(self.samples[first + 1].0)
                    .unwrap_or_default()
                    > window
            {
                first += 1;
            }
            let arrived = cj.saturating_sub(self.samples[first.min(j - 1)].1);
            peak = peak.max(u32::try_from(arrived).unwrap_or(u32::MAX));
        }
        peak
    }
}

/// The largest bursts within each refill window ([`Bursts::peak`]), for [`Demand`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peaks {
    /// Within the reaction time plus an assign's refill time.
    pub assign: u32,
    /// Within the reaction time plus a new ENI's refill time.
    pub new_eni: u32,
}

/// What kind of growth a refill time was measured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// Addresses (or prefixes) assigned to an ENI the node has.
    Assign,
    /// A new ENI created and attached with its addresses, its host networking set up.
    NewEni,
}

/// The measured refill times (from the grow decision until the addresses are usable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefillTimes {
    assign: Option<Duration>,
    new_eni: Option<Duration>,
}

impl RefillTimes {
    /// Records one measurement: above the estimate it replaces it; below it, moves it by
    /// [`REFILL_FALL_WEIGHT`].
    pub fn record(&mut self, growth: Growth, took: Duration) {
        let slot = match growth {
            Growth::Assign => &mut self.assign,
            Growth::NewEni => &mut self.new_eni,
        };
        *slot = Some(match *slot {
            Some(est) if took < est => est.saturating_sub((est - took).mul_f64(REFILL_FALL_WEIGHT)),
            _ => took,
        });
    }

    /// The estimate for `growth` (the prior until one is measured).
    #[must_use]
    pub fn of(&self, growth: Growth) -> Duration {
        match growth {
            Growth::Assign => self.assign.unwrap_or(PRIOR_ASSIGN_REFILL),
            Growth::NewEni => self.new_eni.unwrap_or(PRIOR_ENI_REFILL),
        }
    }
}

/// What the adaptive target is computed from besides the pool.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Estimated ADDs per second ([`ArrivalRate::per_second`]).
    pub rate: f64,
    /// The pool loop's reaction time: how long an ADD may wait before the loop looks (its tick).
    pub reaction: Duration,
    /// Measured refill times.
    pub refill: RefillTimes,
    /// Addresses the node's subnets still have (None: unknown; not bounded by it).
    pub subnet_free: Option<u32>,
    /// The largest bursts of the last [`BURST_MEMORY`] within each window.
    pub peaks: Peaks,
}

/// Largest mean the quantile is computed for (beyond it the answer exceeds any max-pods).
const MAX_MEAN: f64 = 100_000.0;

/// The smallest `k` with P(N ≤ k) ≥ `q` for N ~ Poisson(`mean`); 0 for a mean ≤ 0.
#[must_use]
pub fn poisson_quantile(mean: f64, q: f64) -> u32 {
    if mean.is_nan() || mean <= 0.0 {
        return 0;
    }
    let mean = mean.min(MAX_MEAN);
    // in log space: the first terms underflow for a large mean
    let ln_mean = mean.ln();
    let mut ln_p = -mean;
    let mut cdf = ln_p.exp();
    let mut k: u32 = 0;
    while cdf < q && k < u32::MAX {
        k += 1;
        ln_p += ln_mean - f64::from(k).ln();
        cdf += ln_p.exp();
        // past the mean the terms only shrink: once they no longer add anything, stop
        if f64::from(k) > mean && ln_p.exp() < f64::EPSILON * 1e-3 {
            break;
        }
    }
    k
}

/// The warm target for `rate` ADDs per second over a refill `window`: [`poisson_quantile`] at
/// [`QUANTILE`], at least 1.
#[must_use]
pub fn warm_for(rate: f64, window: Duration) -> u32 {
    poisson_quantile(rate * window.as_secs_f64(), QUANTILE).max(1)
}

/// Addresses the ENIs the pool has can still take without a new ENI.
fn room_on_enis(stats: &PoolStats, t: &Targets) -> u32 {
    let unit = if t.prefix_delegation {
        super::PREFIX_SIZE
    } else {
        1
    };
    stats
        .enis
        .iter()
        .filter(|e| !e.is_special && !e.subnet_dry)
        .map(|e| t.cidrs_per_eni.saturating_sub(e.cidr_count) * unit)
        .sum()
}

/// The adaptive warm IP target for the pool as it is: [`warm_for`] over the reaction time plus
/// the assign refill time (at least the largest burst seen within that window, [`Peaks`]), or plus the longer of the new-ENI and assign refill times when the
/// ENIs the node has cannot hold that many more; never below what is available up to the longer window's target (no
/// release right after an ENI's growth); then at most what max-pods leaves (`max_pods − assigned`) and what the
/// subnet has (`available + subnet_free`), at least 1.
#[must_use]
pub fn warm_target(stats: &PoolStats, t: &Targets, d: &Demand) -> u32 {
    let available = stats.available();
    let by_assign = warm_for(d.rate, d.reaction + d.refill.of(Growth::Assign)).max(d.peaks.assign);
    let by_new_eni =
        warm_for(d.rate, d.reaction + d.refill.of(Growth::NewEni)).max(d.peaks.new_eni);
    let grow_to = if by_assign > available + room_on_enis(stats, t) {
        // The longer of the two windows: a new ENI measured faster than an assign (it
        // happens) must not make a higher rate ask for fewer addresses.
        by_new_eni.max(by_assign)
    } else {
        by_assign
    };
    // Hysteresis: what is held up to the longer window's target stays (a pool that just grew
    // by an ENI has room again, and would otherwise release down to the assign window's target
    // at once).
    let mut warm = grow_to.max(available.min(by_assign.max(by_new_eni)));
    if let Some(max) = t.max_pods {
        warm = warm.min(max.saturating_sub(stats.assigned));
    }
    if let Some(free) = d.subnet_free {
        warm = warm.min(available.saturating_add(free));
    }
    warm.max(1)
}

/// The targets [`super::decide`] is asked with under the adaptive policy: `base` with the warm
/// IP target of [`warm_target`] in place of every WARM_* target; `MINIMUM_IP_TARGET`, the
/// limits and the mode unchanged.
#[must_use]
pub fn targets(base: &Targets, stats: &PoolStats, d: &Demand) -> Targets {
    Targets {
        warm_eni: 0,
        warm_prefix: 0,
        warm_ip: warm_target(stats, base, d),
        ..base.clone()
    }
}
