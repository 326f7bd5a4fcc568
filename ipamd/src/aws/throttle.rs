//! The node's client-side EC2 token bucket: every EC2 call of this ipamd takes one token first, so
//! a burst of pod creations, reconciles and clean-ups can never exceed the node's share of the
//! account's EC2 request budget. It is also budget-aware: when EC2 answers `RequestLimitExceeded`
//! (the ACCOUNT's bucket is empty, shared by every node), the whole node pauses for a jittered,
//! exponentially growing back-off (capped at 8 s, so a node notices within seconds that the account
//! recovered) and halves its own refill rate; once calls go through again, each success doubles the
//! rate back (a node needs a handful of calls to catch up, not fifty), so a fleet of throttled
//! nodes spreads out instead of retrying in lock-step and resumes quickly. Uses tokio's clock, so
//! tests can pause time. It must not know about any particular API.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Default burst of EC2 calls a node may make without waiting.
pub const DEFAULT_BURST: u32 = 20;
/// Default sustained EC2 calls per second per node.
pub const DEFAULT_REFILL_PER_SEC: f64 = 5.0;

/// A token bucket shared (behind an `Arc`) by all EC2 calls of the node.
#[derive(Debug)]
pub struct TokenBucket {
    capacity: f64,
    refill_per_sec: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    tokens: f64,
    last: Instant,
    /// Current refill rate (≤ the configured one after throttling).
    rate: f64,
    /// Consecutive throttled answers.
    streak: u32,
    /// No call starts before this instant (node-wide back-off).
    paused_until: Option<Instant>,
}

/// First node-wide back-off after a `RequestLimitExceeded`.
pub const THROTTLE_BACKOFF_BASE: Duration = Duration::from_millis(500);
/// Longest node-wide back-off. Each try is one request (the SDK does not retry throttling,
/// `sdk::ThrottlingIsNodeWide`), so a throttled node sends at most one request per 4–8 s: 100
/// nodes probe the account at ~17 s⁻¹ while it is browned out, and each learns within 8 s that
/// it is not any more.
pub const THROTTLE_BACKOFF_MAX: Duration = Duration::from_secs(8);
/// Lowest refill rate throttling can push the node to.
const MIN_RATE: f64 = 0.2;

/// The back-off after the `streak`-th consecutive throttled answer, before jitter:
/// base × 2^(streak-1), capped.
#[must_use]
pub fn throttle_backoff(streak: u32) -> Duration {
    let exp = streak.saturating_sub(1).min(16);
    THROTTLE_BACKOFF_BASE
        .saturating_mul(1u32 << exp)
        .min(THROTTLE_BACKOFF_MAX)
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `refill_per_sec`.
    pub fn new(burst: u32, refill_per_sec: f64) -> Self {
        let capacity = f64::from(burst.max(1));
        Self {
            capacity,
            refill_per_sec: refill_per_sec.max(0.001),
            state: Mutex::new(BucketState {
                tokens: capacity,
                last: Instant::now(),
                rate: refill_per_sec.max(0.001),
                streak: 0,
                paused_until: None,
            }),
        }
    }

    /// Take one token, waiting for the refill when the bucket is empty. Returns how long it
    /// waited.
    pub async fn acquire(&self) -> Duration {
        let start = Instant::now();
        loop {
            let wait = {
                let mut s = self.lock();
                let now = Instant::now();
                let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
                s.tokens = (s.tokens + elapsed * s.rate).min(self.capacity);
                s.last = now;
                match s.paused_until {
                    Some(until) if until > now => Some(until - now),
                    _ if s.tokens >= 1.0 => {
                        s.tokens -= 1.0;
                        None
                    }
                    // At least the timer's resolution: a float shortfall (0.999… tokens)
                    // gives a zero wait, a sleep that returns at once, and with tokio's
                    // paused clock (tests) a loop that never lets time move.
                    _ => Some(
                        Duration::from_secs_f64((1.0 - s.tokens) / s.rate)
                            .max(Duration::from_millis(1)),
                    ),
                }
            };
            match wait {
                None => return start.elapsed(),
                Some(d) => tokio::time::sleep(d).await,
            }
        }
    }
}

impl TokenBucket {
    fn lock(&self) -> std::sync::MutexGuard<'_, BucketState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// EC2 answered `RequestLimitExceeded`: pause every call of the node for a jittered
    /// back-off (`jitter` in 0..=1 picks between half and all of [`throttle_backoff`]), empty
    /// the bucket and halve the refill rate. Returns the pause.
    pub fn throttled(&self, jitter: f64) -> Duration {
        let mut s = self.lock();
        s.streak = s.streak.saturating_add(1);
        let full = throttle_backoff(s.streak);
        let pause = full.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0));
        let now = Instant::now();
        let until = now + pause;
        s.paused_until = Some(s.paused_until.map_or(until, |u| u.max(until)));
        s.tokens = 0.0;
        s.last = now;
        s.rate = (s.rate / 2.0).max(MIN_RATE.min(self.refill_per_sec));
        pause
    }

    /// A call went through: the streak ends and the rate doubles (at least a tenth of the
    /// configured rate more), up to the configured one: from the lowest rate a node is back
    /// at full speed after five successes.
    pub fn succeeded(&self) {
        let mut s = self.lock();
        s.streak = 0;
        s.rate = (s.rate * 2.0)
            .max(s.rate + self.refill_per_sec / 10.0)
            .min(self.refill_per_sec);
    }

    /// The node's refill rate now (below the configured one while recovering from throttling).
    pub fn current_rate(&self) -> f64 {
        self.lock().rate
    }
}

impl Default for TokenBucket {
    fn default() -> Self {
        Self::new(DEFAULT_BURST, DEFAULT_REFILL_PER_SEC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_is_free_then_calls_are_paced_by_refill() {
        let bucket = TokenBucket::new(3, 2.0);
        let t0 = Instant::now();
        for _ in 0..3 {
            bucket.acquire().await;
        }
        assert_eq!(t0.elapsed(), Duration::ZERO);
        bucket.acquire().await;
        bucket.acquire().await;
        // two more tokens at 2/s take one second of (paused, auto-advanced) time
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(990) && waited <= Duration::from_millis(1100),
            "{waited:?}"
        );
    }

    /// A bucket a rounding error short of a token (what refills after a throttle leave,
    /// seen as `0.9999999999999999` at rate 0.2) waits for it: before, the wait rounded to
    /// zero and `acquire` spun without ever letting tokio's paused clock move (run on its own
    /// thread, so a spin fails the test instead of hanging it).
    #[test]
    fn a_bucket_a_rounding_error_short_of_a_token_waits_instead_of_spinning() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .expect("runtime");
            let waited = rt.block_on(async {
                let bucket = TokenBucket::new(1, 0.2);
                {
                    let mut s = bucket.lock();
                    s.tokens = 1.0 - f64::EPSILON;
                    s.rate = 0.2;
                }
                bucket.acquire().await
            });
            let _ = tx.send(waited);
        });
        let waited = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("acquire returns instead of spinning");
        assert!(waited <= Duration::from_millis(1), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_pauses_the_whole_node_and_slows_it_until_successes_restore_the_rate() {
        let bucket = TokenBucket::new(10, 4.0);
        let t0 = Instant::now();
        // full jitter: the first back-off is the base
        let pause = bucket.throttled(1.0);
        assert_eq!(pause, THROTTLE_BACKOFF_BASE);
        bucket.acquire().await;
        bucket.acquire().await;
        // the first call waited the pause (the bucket refilled one token meanwhile at the
        // halved rate of 2/s), the second one for a token at that rate (0.5 s)
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(990) && waited <= Duration::from_millis(1100),
            "{waited:?}"
        );
        assert!((bucket.current_rate() - 2.0).abs() < 1e-9);
        // a second throttled answer in a row doubles the back-off (half of it at jitter 0)
        bucket.throttled(1.0);
        assert_eq!(bucket.throttled(0.0), THROTTLE_BACKOFF_BASE * 2);
        // three throttled answers took the rate from 4 to 0.5; successes double it back
        bucket.succeeded();
        assert!((bucket.current_rate() - 1.0).abs() < 1e-9);
        bucket.succeeded();
        bucket.succeeded();
        assert!((bucket.current_rate() - 4.0).abs() < 1e-9);
        bucket.succeeded();
        assert!(
            (bucket.current_rate() - 4.0).abs() < 1e-9,
            "never above the configured rate"
        );
        assert_eq!(throttle_backoff(30), THROTTLE_BACKOFF_MAX);
    }
}
