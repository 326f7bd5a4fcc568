//! Typed metric handles: a family is declared once with its name, help, kind and label names,
//! and recorded through its handle with exactly as many label values as it has label names
//! (checked by the compiler). Owns the series' storage; must not render or know metric names.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Prometheus' default histogram buckets (client_golang `DefBuckets`), which the start-up
/// histograms use.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Pod set-up phases' buckets: 1 ms to 100 s in 1-2.5-5 steps, so one histogram resolves a
/// 2 ms ADD and a pod that waited a minute for EC2 alike.
pub const SETUP_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0,
];

/// The most buckets a histogram family may declare.
pub const MAX_BUCKETS: usize = 16;

/// The Prometheus type of a family (`Histogram`: sum, count and its buckets).
pub use prometheus_text::Kind;

/// One series' value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Counter/gauge value, or a summary's/histogram's sum.
    pub value: f64,
    /// Summary/histogram: observations.
    pub count: u64,
    /// Histogram: cumulative count per bound of its family ([`FamilySnapshot::bounds`]).
    pub buckets: [u64; MAX_BUCKETS],
}

/// A family as the encoder reads it.
#[derive(Debug, Clone)]
pub struct FamilySnapshot {
    /// The default name (`METRICS_NAMING=upstream`).
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// Type.
    pub kind: Kind,
    /// A histogram's bucket bounds (empty for the other kinds).
    pub bounds: &'static [f64],
    /// Series: labels (name, value) in declaration order → value.
    pub series: Vec<(Vec<(&'static str, String)>, Sample)>,
}

/// What the registry asks of every family.
pub trait Collect: Send + Sync {
    /// The family's name.
    fn name(&self) -> &'static str;
    /// A copy of the family's series.
    fn snapshot(&self) -> FamilySnapshot;
}

/// A family with `N` labels.
#[derive(Debug)]
pub struct Family<const N: usize> {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    labels: [&'static str; N],
    bounds: &'static [f64],
    series: Mutex<BTreeMap<[String; N], Sample>>,
}

impl<const N: usize> Family<N> {
    fn new(name: &'static str, help: &'static str, kind: Kind, labels: [&'static str; N]) -> Self {
        let bounds: &'static [f64] = if kind == Kind::Histogram {
            &DEFAULT_BUCKETS
        } else {
            &[]
        };
        Self {
            name,
            help,
            kind,
            labels,
            bounds,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<[String; N], Sample>) -> R) -> R {
        let mut g = self
            .series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut g)
    }

    fn key(values: [&str; N]) -> [String; N] {
        values.map(str::to_owned)
    }

    fn add(&self, values: [&str; N], v: f64) {
        self.with(|s| s.entry(Self::key(values)).or_default().value += v);
    }

    fn set(&self, values: [&str; N], v: f64) {
        self.with(|s| {
            s.insert(
                Self::key(values),
                Sample {
                    value: v,
                    ..Sample::default()
                },
            )
        });
    }

    fn observe(&self, values: [&str; N], v: f64, histogram: bool) {
        self.with(|s| {
            let e = s.entry(Self::key(values)).or_default();
            e.value += v;
            e.count += 1;
            if histogram {
                for (count, bound) in e.buckets.iter_mut().zip(self.bounds) {
                    if v <= *bound {
                        *count += 1;
                    }
                }
            }
        });
    }

    /// The value of one series (None: never recorded).
    #[must_use]
    pub fn get(&self, values: [&str; N]) -> Option<Sample> {
        self.with(|s| s.get(&Self::key(values)).copied())
    }
}

impl<const N: usize> Collect for Family<N> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn snapshot(&self) -> FamilySnapshot {
        let series = self.with(|s| {
            s.iter()
                .map(|(values, sample)| {
                    let labels = self
                        .labels
                        .iter()
                        .copied()
                        .zip(values.iter().cloned())
                        .collect();
                    (labels, *sample)
                })
                .collect()
        });
        FamilySnapshot {
            name: self.name,
            help: self.help,
            kind: self.kind,
            bounds: self.bounds,
            series,
        }
    }
}

/// A label-less counter, always exposed (0 until incremented).
#[derive(Debug)]
pub struct Counter {
    name: &'static str,
    help: &'static str,
    value: AtomicU64,
}

impl Counter {
    /// Declares the counter.
    #[must_use]
    pub fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            value: AtomicU64::new(0),
        }
    }

    /// +1.
    pub fn inc(&self) {
        self.value.fetch_add(1, Ordering::Relaxed);
    }

    /// +n.
    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    /// Current value.
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

impl Collect for Counter {
    fn name(&self) -> &'static str {
        self.name
    }

    fn snapshot(&self) -> FamilySnapshot {
        #[allow(clippy::cast_precision_loss)]
        let value = self.get() as f64;
        FamilySnapshot {
            name: self.name,
            help: self.help,
            kind: Kind::Counter,
            bounds: &[],
            series: vec![(
                Vec::new(),
                Sample {
                    value,
                    ..Sample::default()
                },
            )],
        }
    }
}

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $kind:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name<const N: usize>(Family<N>);

        impl<const N: usize> $name<N> {
            /// Declares the family.
            #[must_use]
            pub fn new(name: &'static str, help: &'static str, labels: [&'static str; N]) -> Self {
                Self(Family::new(name, help, $kind, labels))
            }

            /// The value of one series (None: never recorded).
            #[must_use]
            pub fn get(&self, values: [&str; N]) -> Option<Sample> {
                self.0.get(values)
            }
        }

        impl<const N: usize> Collect for $name<N> {
            fn name(&self) -> &'static str {
                self.0.name()
            }
            fn snapshot(&self) -> FamilySnapshot {
                self.0.snapshot()
            }
        }
    };
}

handle!(
    /// A counter family with `N` labels.
    CounterVec,
    Kind::Counter
);
handle!(
    /// A gauge family with `N` labels (`N` = 0: one plain gauge).
    GaugeVec,
    Kind::Gauge
);
handle!(
    /// A summary family (sum and count) with `N` labels.
    SummaryVec,
    Kind::Summary
);
handle!(
    /// A histogram family with `N` labels, over [`DEFAULT_BUCKETS`] or its own bounds
    /// ([`HistogramVec::with_buckets`]).
    HistogramVec,
    Kind::Histogram
);

impl<const N: usize> CounterVec<N> {
    /// +1 on the series `values`.
    pub fn inc(&self, values: [&str; N]) {
        self.0.add(values, 1.0);
    }

    /// +n on the series `values` (0 registers the series).
    pub fn add(&self, values: [&str; N], n: u64) {
        #[allow(clippy::cast_precision_loss)]
        self.0.add(values, n as f64);
    }
}

impl<const N: usize> GaugeVec<N> {
    /// Sets the series `values`.
    pub fn set(&self, values: [&str; N], v: f64) {
        self.0.set(values, v);
    }

    /// Adds to the series `values`.
    pub fn add(&self, values: [&str; N], v: f64) {
        self.0.add(values, v);
    }

    /// Replaces every series by `series`.
    pub fn replace(&self, series: impl IntoIterator<Item = ([String; N], f64)>) {
        self.0.with(|s| {
            *s = series
                .into_iter()
                .map(|(k, v)| {
                    (
                        k,
                        Sample {
                            value: v,
                            ..Sample::default()
                        },
                    )
                })
                .collect();
        });
    }
}

impl<const N: usize> SummaryVec<N> {
    /// Records one observation.
    pub fn observe(&self, values: [&str; N], v: f64) {
        self.0.observe(values, v, false);
    }
}

impl<const N: usize> HistogramVec<N> {
    /// Registers the series `values` with no observation (exposed with zero counts).
    pub fn register(&self, values: [&str; N]) {
        self.0.with(|s| {
            s.entry(Family::<N>::key(values)).or_default();
        });
    }

    /// Declares the family over `bounds` (ascending, at most [`MAX_BUCKETS`]).
    ///
    /// # Panics
    /// When `bounds` has more than [`MAX_BUCKETS`] entries or is not ascending (a declaration
    /// error, found by the registry's tests).
    #[must_use]
    pub fn with_buckets(
        name: &'static str,
        help: &'static str,
        labels: [&'static str; N],
        bounds: &'static [f64],
    ) -> Self {
        assert!(bounds.len() <= MAX_BUCKETS, "{name}: too many buckets");
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "{name}: bounds not ascending"
        );
        let mut family = Family::new(name, help, Kind::Histogram, labels);
        family.bounds = bounds;
        Self(family)
    }

    /// Records one observation.
    pub fn observe(&self, values: [&str; N], v: f64) {
        self.0.observe(values, v, true);
    }
}
