//! Behaviour knobs: faults and staleness a test can switch on at run time (throttling, latency,
//! 5xx, dropped connections, attach delay, IMDS lag, partial prefix lists). Owns the knob values
//! and the EC2-style token buckets; it must not know HTTP or the state model.

use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Every fault/staleness switch of the simulator. JSON shape of the control API's `/knobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Knobs {
    /// EC2 request throttling (`RequestLimitExceeded`, HTTP 503) per action class.
    pub throttle: Throttle,
    /// Added latency before every EC2 answer, in milliseconds.
    pub latency_ms: u64,
    /// Fraction (0..=1) of EC2 requests answered `InternalError` with HTTP 500.
    pub error_5xx_rate: f64,
    /// Fraction (0..=1) of EC2 requests whose connection is dropped mid-answer.
    pub drop_connection_rate: f64,
    /// Time after an attach before the ENI is visible on the instance (IMDS and fabric),
    /// in milliseconds. EC2's Describe* calls see the attachment at once ("attached").
    pub attach_delay_ms: u64,
    /// IMDS serves the instance's metadata as it was this many milliseconds ago.
    pub imds_lag_ms: u64,
    /// EC2 eventual consistency: for this many milliseconds after `CreateNetworkInterface`
    /// the new ENI is missing from `DescribeNetworkInterfaces` (asked by id:
    /// `InvalidNetworkInterfaceID.NotFound`). Other actions see it at once.
    pub describe_lag_ms: u64,
    /// When set, IMDS lists at most this many entries in `ipv4-prefix` (upstream #3824:
    /// IMDS returned a partial prefix list and ipamd force-removed the rest).
    pub imds_partial_prefixes: Option<usize>,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            throttle: Throttle::default(),
            latency_ms: 0,
            error_5xx_rate: 0.0,
            drop_connection_rate: 0.0,
            attach_delay_ms: 0,
            imds_lag_ms: 0,
            describe_lag_ms: 0,
            imds_partial_prefixes: None,
        }
    }
}

/// Token-bucket settings per EC2 action class. Defaults are EC2's published account defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Throttle {
    /// When false no request is throttled.
    pub enabled: bool,
    /// `Describe*` (non-mutating) actions.
    pub describe: Bucket,
    /// Mutating actions (ENI create/attach/assign, tags, ...).
    pub mutate: Bucket,
    /// Resource-intensive actions (`RunInstances`, `TerminateInstances`).
    pub instances: Bucket,
}

impl Default for Throttle {
    fn default() -> Self {
        Self {
            enabled: true,
            describe: Bucket {
                capacity: 100,
                refill_per_sec: 20.0,
            },
            mutate: Bucket {
                capacity: 200,
                refill_per_sec: 5.0,
            },
            instances: Bucket {
                capacity: 50,
                refill_per_sec: 2.0,
            },
        }
    }
}

/// Size and refill rate of one token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Maximum tokens (burst).
    pub capacity: u32,
    /// Tokens added per second.
    pub refill_per_sec: f64,
}

/// EC2's throttling classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionClass {
    /// Non-mutating `Describe*`.
    Describe,
    /// Mutating.
    Mutate,
    /// Instance lifecycle.
    Instances,
}

/// Live token counts for the three classes.
#[derive(Debug, Clone)]
pub struct TokenBuckets {
    levels: [(f64, Option<Instant>); 3],
}

impl Default for TokenBuckets {
    fn default() -> Self {
        Self {
            levels: [(f64::NAN, None); 3],
        }
    }
}

impl TokenBuckets {
    /// Take one token for `class`; false means the request is throttled.
    pub fn take(&mut self, throttle: &Throttle, class: ActionClass, now: Instant) -> bool {
        if !throttle.enabled {
            return true;
        }
        let (bucket, slot) = match class {
            ActionClass::Describe => (throttle.describe, 0),
            ActionClass::Mutate => (throttle.mutate, 1),
            ActionClass::Instances => (throttle.instances, 2),
        };
        let capacity = f64::from(bucket.capacity);
        let (level, last) = &mut self.levels[slot];
        if level.is_nan() {
            *level = capacity;
        }
        if let Some(last) = *last {
            let elapsed = now.saturating_duration_since(last).as_secs_f64();
            *level = (*level + elapsed * bucket.refill_per_sec).min(capacity);
        }
        *last = Some(now);
        *level = level.min(capacity);
        if *level >= 1.0 {
            *level -= 1.0;
            true
        } else {
            false
        }
    }

    /// Forget all levels (buckets start full again), e.g. after the knobs changed.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_empties_then_refills() {
        let throttle = Throttle {
            enabled: true,
            describe: Bucket {
                capacity: 2,
                refill_per_sec: 1.0,
            },
            ..Throttle::default()
        };
        let mut buckets = TokenBuckets::default();
        let t0 = Instant::now();
        assert!(buckets.take(&throttle, ActionClass::Describe, t0));
        assert!(buckets.take(&throttle, ActionClass::Describe, t0));
        assert!(!buckets.take(&throttle, ActionClass::Describe, t0));
        // other classes have their own bucket
        assert!(buckets.take(&throttle, ActionClass::Mutate, t0));
        assert!(buckets.take(
            &throttle,
            ActionClass::Describe,
            t0 + Duration::from_secs(1)
        ));
        assert!(!buckets.take(
            &throttle,
            ActionClass::Describe,
            t0 + Duration::from_secs(1)
        ));
    }

    #[test]
    fn disabled_never_throttles() {
        let throttle = Throttle {
            enabled: false,
            ..Throttle::default()
        };
        let mut buckets = TokenBuckets::default();
        let t0 = Instant::now();
        assert!((0..10_000).all(|_| buckets.take(&throttle, ActionClass::Mutate, t0)));
    }
}
