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
    /// Fraction (0..=1) of EC2 requests that are carried out and whose answer is then lost
    /// (the connection dropped mid-answer, as [`Knobs::drop_connection_rate`] but after the
    /// action was applied): the caller cannot tell, and a retry of it meets the world as the
    /// action left it (issue 38). Only successful answers are lost.
    pub lost_answer_rate: f64,
    /// Time after an attach before the ENI is visible on the instance (IMDS and fabric),
    /// in milliseconds. EC2's Describe* calls see the attachment at once ("attached").
    pub attach_delay_ms: u64,
    /// IMDS serves the instance's metadata as it was this many milliseconds ago.
    pub imds_lag_ms: u64,
    /// EC2 eventual consistency: for this many milliseconds after `CreateNetworkInterface`
    /// the new ENI is missing from `DescribeNetworkInterfaces` (asked by id:
    /// `InvalidNetworkInterfaceID.NotFound`). Other actions see it at once.
    pub describe_lag_ms: u64,
    /// EC2 eventual consistency the other way: for this many milliseconds after an
    /// `UnassignPrivateIpAddresses` / `UnassignIpv6Addresses` / `DetachNetworkInterface`
    /// returned, `DescribeNetworkInterfaces` still lists the released addresses and prefixes
    /// on the ENI, and the ENI as attached (even once deleted). Every other action sees the
    /// change at once: a released address can be assigned to another ENI meanwhile.
    pub release_lag_ms: u64,
    /// When set, IMDS lists at most this many entries in `ipv4-prefix` (upstream #3824:
    /// IMDS returned a partial prefix list and ipamd force-removed the rest).
    pub imds_partial_prefixes: Option<usize>,
    /// EC2 actions the caller's IAM policy does not allow (e.g. `AssignPrivateIpAddresses`):
    /// answered `UnauthorizedOperation` (HTTP 403) before anything is done.
    pub denied_actions: Vec<String>,
    /// The router filters every ENI's traffic by the ENI's security groups, as EC2 does (a
    /// group change applies at once). Off by default: branch ENIs are always filtered, but the
    /// scenarios written before this knob reach pods and nodes across groups that let nothing
    /// in (the default world's `pods` group), which EC2 would drop.
    #[serde(default)]
    pub enforce_eni_security_groups: bool,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            throttle: Throttle::default(),
            latency_ms: 0,
            error_5xx_rate: 0.0,
            drop_connection_rate: 0.0,
            lost_answer_rate: 0.0,
            attach_delay_ms: 0,
            imds_lag_ms: 0,
            describe_lag_ms: 0,
            release_lag_ms: 0,
            imds_partial_prefixes: None,
            denied_actions: Vec::new(),
            enforce_eni_security_groups: false,
        }
    }
}

/// EC2's request-rate throttling, per account (= per `World`), as "Request throttling for the
/// Amazon EC2 API" describes it: token buckets whose size and refill depend on the action's
/// category; since EC2 evaluates every API on its own ("requests for other APIs are not
/// affected"), by default each action has its own bucket of its category's size
/// ([`ThrottleScope::Action`]). Defaults are EC2's published account defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Throttle {
    /// When false no request is throttled.
    pub enabled: bool,
    /// One bucket per action (EC2 today) or one per category (EC2's older scheme).
    pub scope: ThrottleScope,
    /// Non-mutating actions (`Describe*`) with filters, ids or pagination: 100 / 20 s⁻¹.
    pub describe: Bucket,
    /// Unfiltered and unpaginated non-mutating actions (e.g. `DescribeNetworkInterfaces`
    /// without filters, ids or `MaxResults`): 50 / 10 s⁻¹.
    pub unfiltered: Bucket,
    /// Mutating actions (ENI create/attach/assign, tags, ...): 200 / 5 s⁻¹.
    pub mutate: Bucket,
    /// Resource-intensive actions (`RunInstances`, `TerminateInstances`): 50 / 5 s⁻¹.
    pub instances: Bucket,
    /// Multiplies every bucket's size and refill (e.g. 0.1 for a brown-out). Changing it
    /// does not refill the buckets: levels above the new size are cut to it.
    pub scale: f64,
}

/// Which requests share a token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ThrottleScope {
    /// Each action (and, for the unfiltered variant of a `Describe*`, that variant) has its
    /// own bucket of its category's size.
    #[default]
    Action,
    /// All actions of a category share one bucket.
    Category,
}

impl Default for Throttle {
    fn default() -> Self {
        Self {
            enabled: true,
            scope: ThrottleScope::Action,
            describe: Bucket {
                capacity: 100,
                refill_per_sec: 20.0,
            },
            unfiltered: Bucket {
                capacity: 50,
                refill_per_sec: 10.0,
            },
            mutate: Bucket {
                capacity: 200,
                refill_per_sec: 5.0,
            },
            instances: Bucket {
                capacity: 50,
                refill_per_sec: 5.0,
            },
            scale: 1.0,
        }
    }
}

impl Throttle {
    /// The effective bucket (scale applied) of `class`.
    #[must_use]
    pub fn bucket(&self, class: ActionClass) -> Bucket {
        let b = match class {
            ActionClass::Describe => self.describe,
            ActionClass::Unfiltered => self.unfiltered,
            ActionClass::Mutate => self.mutate,
            ActionClass::Instances => self.instances,
        };
        let scale = if self.scale.is_finite() {
            self.scale.max(0.0)
        } else {
            1.0
        };
        let capacity = (f64::from(b.capacity) * scale)
            .round()
            .clamp(0.0, f64::from(u32::MAX));
        Bucket {
            // clamped to u32's range just above
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            capacity: capacity as u32,
            refill_per_sec: b.refill_per_sec * scale,
        }
    }

    /// The bucket key of a request of `action` in `class` under this scope.
    fn key(&self, action: &str, class: ActionClass) -> String {
        match self.scope {
            ThrottleScope::Action if class == ActionClass::Unfiltered => {
                format!("{action}/unfiltered")
            }
            ThrottleScope::Action => action.to_owned(),
            ThrottleScope::Category => class.name().to_owned(),
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

/// EC2's throttling categories (for the actions the simulator implements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionClass {
    /// Non-mutating `Describe*` (filtered, by id, or paginated).
    Describe,
    /// Non-mutating `Describe*` asked without filters, ids or pagination.
    Unfiltered,
    /// Mutating.
    Mutate,
    /// Resource-intensive (instance lifecycle).
    Instances,
}

impl ActionClass {
    /// Stable lower-case name (bucket key in category scope, counters).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Describe => "describe",
            Self::Unfiltered => "unfiltered",
            Self::Mutate => "mutate",
            Self::Instances => "instances",
        }
    }
}

/// Live token levels, one per bucket key (action or category), created full on first use.
#[derive(Debug, Clone, Default)]
pub struct TokenBuckets {
    levels: std::collections::HashMap<String, (f64, Instant, ActionClass)>,
}

impl TokenBuckets {
    /// Take one token for a request of `action` in `class`; false means it is throttled.
    pub fn take(
        &mut self,
        throttle: &Throttle,
        action: &str,
        class: ActionClass,
        now: Instant,
    ) -> bool {
        if !throttle.enabled {
            return true;
        }
        let bucket = throttle.bucket(class);
        let capacity = f64::from(bucket.capacity);
        let (level, last, _) = self
            .levels
            .entry(throttle.key(action, class))
            .or_insert((capacity, now, class));
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *level = (*level + elapsed * bucket.refill_per_sec).min(capacity);
        *last = now;
        if *level >= 1.0 {
            *level -= 1.0;
            true
        } else {
            false
        }
    }

    /// The knobs change from `old` to `new` at `now`: bring every level up to date under the
    /// old settings, then cut it to the new size. Nothing is refilled by a change (a brown-out
    /// must not hand out a fresh burst); a change of scope starts over with full buckets.
    pub fn retune(&mut self, old: &Throttle, new: &Throttle, now: Instant) {
        if old.scope != new.scope {
            self.levels.clear();
            return;
        }
        for (level, last, class) in self.levels.values_mut() {
            let before = old.bucket(*class);
            let after = new.bucket(*class);
            let elapsed = now.saturating_duration_since(*last).as_secs_f64();
            *level = (*level + elapsed * before.refill_per_sec)
                .min(f64::from(before.capacity))
                .min(f64::from(after.capacity));
            *last = now;
        }
    }

    /// Forget all levels (buckets start full again).
    pub fn reset(&mut self) {
        self.levels.clear();
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
        let d = "DescribeSubnets";
        assert!(buckets.take(&throttle, d, ActionClass::Describe, t0));
        assert!(buckets.take(&throttle, d, ActionClass::Describe, t0));
        assert!(!buckets.take(&throttle, d, ActionClass::Describe, t0));
        // other classes have their own bucket
        assert!(buckets.take(&throttle, "CreateTags", ActionClass::Mutate, t0));
        let t1 = t0 + Duration::from_secs(1);
        assert!(buckets.take(&throttle, d, ActionClass::Describe, t1));
        assert!(!buckets.take(&throttle, d, ActionClass::Describe, t1));
    }

    #[test]
    fn per_action_scope_gives_every_action_its_own_bucket_of_the_category_size() {
        let throttle = Throttle {
            mutate: Bucket {
                capacity: 1,
                refill_per_sec: 0.0,
            },
            ..Throttle::default()
        };
        let mut b = TokenBuckets::default();
        let t0 = Instant::now();
        assert!(b.take(
            &throttle,
            "AssignPrivateIpAddresses",
            ActionClass::Mutate,
            t0
        ));
        assert!(!b.take(
            &throttle,
            "AssignPrivateIpAddresses",
            ActionClass::Mutate,
            t0
        ));
        assert!(b.take(&throttle, "CreateNetworkInterface", ActionClass::Mutate, t0));
        // the unfiltered variant of a Describe is a bucket of its own
        let tiny = Throttle {
            describe: Bucket {
                capacity: 1,
                refill_per_sec: 0.0,
            },
            unfiltered: Bucket {
                capacity: 1,
                refill_per_sec: 0.0,
            },
            ..Throttle::default()
        };
        let n = "DescribeNetworkInterfaces";
        assert!(b.take(&tiny, n, ActionClass::Describe, t0));
        assert!(b.take(&tiny, n, ActionClass::Unfiltered, t0));
        assert!(!b.take(&tiny, n, ActionClass::Describe, t0));
        // category scope: one bucket for all mutating actions
        let shared = Throttle {
            scope: ThrottleScope::Category,
            ..throttle
        };
        let mut c = TokenBuckets::default();
        assert!(c.take(&shared, "AssignPrivateIpAddresses", ActionClass::Mutate, t0));
        assert!(!c.take(&shared, "CreateNetworkInterface", ActionClass::Mutate, t0));
    }

    #[test]
    fn a_brown_out_cuts_levels_without_refilling_and_scales_the_refill() {
        let normal = Throttle::default();
        let brown = Throttle {
            scale: 0.1,
            ..Throttle::default()
        };
        let mut b = TokenBuckets::default();
        let t0 = Instant::now();
        let a = "AssignPrivateIpAddresses";
        for _ in 0..195 {
            assert!(b.take(&normal, a, ActionClass::Mutate, t0));
        }
        // 5 left; the brown-out's bucket is 20, so 5 stay
        b.retune(&normal, &brown, t0);
        let granted = (0..10)
            .filter(|_| b.take(&brown, a, ActionClass::Mutate, t0))
            .count();
        assert_eq!(granted, 5);
        // refill at 0.5/s: one token after 2 s
        let t2 = t0 + Duration::from_secs(2);
        assert!(b.take(&brown, a, ActionClass::Mutate, t2));
        assert!(!b.take(&brown, a, ActionClass::Mutate, t2));
        // back to normal: no fresh burst either
        b.retune(&brown, &normal, t2);
        assert!(!b.take(&normal, a, ActionClass::Mutate, t2));
    }

    #[test]
    fn disabled_never_throttles() {
        let throttle = Throttle {
            enabled: false,
            ..Throttle::default()
        };
        let mut buckets = TokenBuckets::default();
        let t0 = Instant::now();
        assert!((0..10_000).all(|_| buckets.take(
            &throttle,
            "CreateTags",
            ActionClass::Mutate,
            t0
        )));
    }
}
