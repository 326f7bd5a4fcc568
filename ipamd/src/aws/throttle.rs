//! The node's client-side EC2 token bucket: every EC2 call of this ipamd takes one token first,
//! so a burst of pod creations, reconciles and clean-ups can never exceed the node's share of
//! the account's EC2 request budget (upstream pain point 5). Uses tokio's clock, so tests can
//! pause time. It must not know about any particular API.

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
            }),
        }
    }

    /// Take one token, waiting for the refill when the bucket is empty. Returns how long it
    /// waited.
    pub async fn acquire(&self) -> Duration {
        let start = Instant::now();
        loop {
            let wait = {
                let mut s = self
                    .state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let now = Instant::now();
                let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
                s.tokens = (s.tokens + elapsed * self.refill_per_sec).min(self.capacity);
                s.last = now;
                if s.tokens >= 1.0 {
                    s.tokens -= 1.0;
                    None
                } else {
                    Some(Duration::from_secs_f64(
                        (1.0 - s.tokens) / self.refill_per_sec,
                    ))
                }
            };
            match wait {
                None => return start.elapsed(),
                Some(d) => tokio::time::sleep(d).await,
            }
        }
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
}
