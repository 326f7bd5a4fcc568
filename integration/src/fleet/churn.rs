//! Pod-churn traces for the churn replay (issue 41): a seeded generator of pod lifetimes
//! (node, ADD time, DEL time) for five shapes — steady Poisson, diurnal, Deployment rollouts,
//! CronJob spikes, a scale-from-zero storm — in replay seconds. PURE: the same seed gives the
//! same trace. Must not: do I/O, know the fleet's processes (the replay, `replay.rs`, plays it).
//!
//! Time is compressed: a trace is `length` replay seconds (90 by default); the diurnal trace's
//! "day" is that long (86 400 s → 90 s, a factor of 960), a rollout or CronJob period is 30 s.
//! EC2's latency, ipamd's pool tick and the address cooldown are NOT compressed, so every trace
//! is harsher for a warm pool than the cluster time it stands for (more arrivals per refill
//! window). Every trace but the storm has a pre-roll (its first `measure_from` seconds, not
//! measured) that builds the node's population, so the policies are judged on a node that has
//! been running.

/// One pod of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PodLife {
    /// Node index.
    pub node: usize,
    /// Seconds from the trace's start to its ADD.
    pub add_at: f64,
    /// Seconds from the trace's start to its DEL (≤ the trace's length: every pod is deleted).
    pub del_at: f64,
}

/// The shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceKind {
    /// Poisson arrivals at a constant rate per node, exponential lifetimes.
    Steady,
    /// Poisson arrivals whose rate follows one compressed day (trough at the start, peak in
    /// the middle: 0.1× to 1.9× the mean).
    Diurnal,
    /// A steady Deployment population replaced twice (rollouts, maxSurge 25 %).
    Rollout,
    /// A low steady background plus CronJob spikes every 30 s (short-lived pods, all nodes).
    CronJob,
    /// Nothing, then every node gets most of its max-pods at once (scale from zero).
    Storm,
}

impl TraceKind {
    /// All, in report order.
    pub const ALL: [Self; 5] = [
        Self::Steady,
        Self::Diurnal,
        Self::Rollout,
        Self::CronJob,
        Self::Storm,
    ];

    /// Its name in the report and on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Steady => "steady",
            Self::Diurnal => "diurnal",
            Self::Rollout => "rollout",
            Self::CronJob => "cronjob",
            Self::Storm => "storm",
        }
    }

    /// The kind named `name`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A generated trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Its shape.
    pub kind: TraceKind,
    /// Nodes.
    pub nodes: usize,
    /// Seconds.
    pub length: f64,
    /// Metrics are taken from this second on (the pre-roll before it builds the population).
    pub measure_from: f64,
    /// Pods, by ADD time.
    pub pods: Vec<PodLife>,
}

/// Rate and lifetime constants (per node, replay seconds).
pub mod shape {
    /// Steady: ADDs per second per node.
    pub const STEADY_RATE: f64 = 0.1;
    /// Mean lifetime of a churned pod (s).
    pub const LIFETIME: f64 = 60.0;
    /// Long-lived pods per node built in the pre-roll (every trace but the storm).
    pub const BASE_PODS: usize = 8;
    /// Pre-roll (s).
    pub const PRE_ROLL: f64 = 20.0;
    /// Diurnal mean rate (per node per second) and its swing (0.1× to 1.9×).
    pub const DIURNAL_RATE: f64 = 0.1;
    /// See [`DIURNAL_RATE`].
    pub const DIURNAL_SWING: f64 = 0.9;
    /// Deployment pods per node replaced by each rollout.
    pub const ROLLOUT_PODS: usize = 12;
    /// Rollouts start at these seconds; a batch of 25 % every `ROLLOUT_STEP` s.
    pub const ROLLOUTS_AT: [f64; 2] = [30.0, 60.0];
    /// See [`ROLLOUTS_AT`].
    pub const ROLLOUT_STEP: f64 = 3.0;
    /// An old pod is deleted this long after its replacement's ADD (readiness).
    pub const ROLLOUT_READY: f64 = 2.0;
    /// CronJob background rate per node and the spikes: every `CRON_PERIOD` s from
    /// `CRON_FIRST`, `CRON_PODS` pods per node within 1 s, living 10–15 s.
    pub const CRON_BACKGROUND: f64 = 0.02;
    /// See [`CRON_BACKGROUND`].
    pub const CRON_PERIOD: f64 = 30.0;
    /// See [`CRON_BACKGROUND`].
    pub const CRON_FIRST: f64 = 25.0;
    /// See [`CRON_BACKGROUND`].
    pub const CRON_PODS: usize = 6;
    /// Storm: pods per node, arriving within `STORM_SPREAD` s of `STORM_AT`, living to the end.
    pub const STORM_PODS: usize = 25;
    /// See [`STORM_PODS`].
    pub const STORM_AT: f64 = 2.0;
    /// See [`STORM_PODS`].
    pub const STORM_SPREAD: f64 = 2.0;
}

/// SplitMix64: small, seeded, good enough for traces.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let x = (self.next_u64() >> 11) as f64;
        x / (1u64 << 53) as f64
    }

    /// Exponential with `mean`.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// Poisson arrivals on one node with rate `rate(t)` ≤ `peak` (thinning), each living an
/// exponential `lifetime` (cut at `end`).
fn poisson(
    rng: &mut Rng,
    node: usize,
    (from, end): (f64, f64),
    peak: f64,
    rate: impl Fn(f64) -> f64,
    lifetime: f64,
    out: &mut Vec<PodLife>,
) {
    let mut t = from;
    loop {
        t += rng.exp(1.0 / peak);
        if t >= end {
            return;
        }
        if rng.unit() * peak <= rate(t) {
            let del_at = (t + rng.exp(lifetime)).min(end);
            out.push(PodLife {
                node,
                add_at: t,
                del_at,
            });
        }
    }
}

/// The long-lived population of the pre-roll: `n` pods per node arriving over it, living to
/// the end.
fn base(rng: &mut Rng, node: usize, n: usize, length: f64, out: &mut Vec<PodLife>) {
    for _ in 0..n {
        out.push(PodLife {
            node,
            add_at: rng.unit() * shape::PRE_ROLL * 0.75,
            del_at: length,
        });
    }
}

/// The trace of `kind` for `nodes` nodes, `length` seconds, from `seed` (the same seed gives
/// the same trace; each node draws from its own stream).
#[must_use]
pub fn generate(kind: TraceKind, nodes: usize, length: f64, seed: u64) -> Trace {
    use shape::*;
    let mut pods = Vec::new();
    let mut measure_from = PRE_ROLL;
    for node in 0..nodes {
        let mut rng = Rng::new(seed ^ (kind as u64) << 32 ^ (node as u64).wrapping_mul(0x1_0001));
        match kind {
            TraceKind::Steady => {
                base(&mut rng, node, BASE_PODS, length, &mut pods);
                poisson(
                    &mut rng,
                    node,
                    (0.0, length),
                    STEADY_RATE,
                    |_| STEADY_RATE,
                    LIFETIME,
                    &mut pods,
                );
            }
            TraceKind::Diurnal => {
                base(&mut rng, node, BASE_PODS, length, &mut pods);
                let rate = |t: f64| {
                    DIURNAL_RATE
                        * (1.0 - DIURNAL_SWING * (2.0 * std::f64::consts::PI * t / length).cos())
                };
                poisson(
                    &mut rng,
                    node,
                    (0.0, length),
                    DIURNAL_RATE * (1.0 + DIURNAL_SWING),
                    rate,
                    LIFETIME,
                    &mut pods,
                );
            }
            TraceKind::Rollout => {
                base(&mut rng, node, BASE_PODS / 2, length, &mut pods);
                // the Deployment's pods, created in the pre-roll
                let mut current: Vec<f64> = (0..ROLLOUT_PODS)
                    .map(|_| rng.unit() * PRE_ROLL * 0.75)
                    .collect();
                for at in ROLLOUTS_AT.into_iter().filter(|a| *a < length) {
                    let batch = ROLLOUT_PODS.div_ceil(4);
                    let mut next = Vec::new();
                    for (i, added) in current.iter().enumerate() {
                        #[allow(clippy::cast_precision_loss)]
                        let step = (i / batch) as f64;
                        let new_at = (at + step * ROLLOUT_STEP + rng.unit()).min(length);
                        pods.push(PodLife {
                            node,
                            add_at: *added,
                            del_at: (new_at + ROLLOUT_READY).min(length),
                        });
                        next.push(new_at);
                    }
                    current = next;
                }
                pods.extend(current.into_iter().map(|add_at| PodLife {
                    node,
                    add_at,
                    del_at: length,
                }));
                poisson(
                    &mut rng,
                    node,
                    (0.0, length),
                    STEADY_RATE / 5.0,
                    |_| STEADY_RATE / 5.0,
                    LIFETIME,
                    &mut pods,
                );
            }
            TraceKind::CronJob => {
                base(&mut rng, node, BASE_PODS, length, &mut pods);
                poisson(
                    &mut rng,
                    node,
                    (0.0, length),
                    CRON_BACKGROUND,
                    |_| CRON_BACKGROUND,
                    LIFETIME,
                    &mut pods,
                );
                let mut at = CRON_FIRST;
                while at < length {
                    for _ in 0..CRON_PODS {
                        let add_at = at + rng.unit();
                        pods.push(PodLife {
                            node,
                            add_at,
                            del_at: (add_at + 10.0 + 5.0 * rng.unit()).min(length),
                        });
                    }
                    at += CRON_PERIOD;
                }
            }
            TraceKind::Storm => {
                measure_from = 0.0;
                for _ in 0..STORM_PODS {
                    pods.push(PodLife {
                        node,
                        add_at: STORM_AT + rng.unit() * STORM_SPREAD,
                        del_at: length,
                    });
                }
            }
        }
    }
    pods.retain(|p| p.add_at < length);
    pods.sort_by(|a, b| a.add_at.total_cmp(&b.add_at));
    Trace {
        kind,
        nodes,
        length,
        measure_from,
        pods,
    }
}

impl Trace {
    /// Most pods alive at once on one node (must stay below the node's max-pods).
    #[must_use]
    pub fn peak_per_node(&self) -> usize {
        (0..self.nodes)
            .map(|n| {
                let mut ev: Vec<(f64, i32)> = self
                    .pods
                    .iter()
                    .filter(|p| p.node == n)
                    .flat_map(|p| [(p.add_at, 1), (p.del_at, -1)])
                    .collect();
                // at equal times the DEL first
                ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let (mut cur, mut peak) = (0i32, 0i32);
                for (_, d) in ev {
                    cur += d;
                    peak = peak.max(cur);
                }
                usize::try_from(peak).unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_are_seeded_bounded_and_fit_a_t3_large() {
        for kind in TraceKind::ALL {
            let a = generate(kind, 20, 90.0, 41);
            assert_eq!(
                a,
                generate(kind, 20, 90.0, 41),
                "{kind:?} is not reproducible"
            );
            assert_ne!(
                a.pods,
                generate(kind, 20, 90.0, 42).pods,
                "{kind:?} ignores the seed"
            );
            assert!(!a.pods.is_empty());
            for p in &a.pods {
                assert!(
                    p.add_at >= 0.0 && p.add_at <= p.del_at && p.del_at <= 90.0,
                    "{p:?}"
                );
                assert!(p.node < 20);
            }
            // t3.large: 33 pod addresses, max-pods 35
            assert!(a.peak_per_node() <= 30, "{kind:?}: {}", a.peak_per_node());
            assert_eq!(TraceKind::parse(kind.name()), Some(kind));
        }
        // the steady trace's rate is what it says: 0.1 ADD/s per node after the base
        let s = generate(TraceKind::Steady, 20, 90.0, 7);
        let churned = s.pods.len() - 20 * shape::BASE_PODS;
        #[allow(clippy::cast_precision_loss)]
        let rate = churned as f64 / (20.0 * 90.0);
        assert!((rate - shape::STEADY_RATE).abs() < 0.02, "{rate}");
    }
}
