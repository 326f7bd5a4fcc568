//! Simulated time: where the world reads "now" from. Owns the `Clock` seam only; it must not
//! sleep or schedule anything.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Source of "now" for the world (attach delay, IMDS lag, throttle refill, timestamps).
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The process's monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when told to: makes delays and lag testable without sleeping.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    offset: Mutex<Duration>,
}

impl ManualClock {
    /// A clock frozen at the moment of creation.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        }
    }

    /// Move the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut offset = self.offset.lock().unwrap();
        *offset += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.lock().unwrap()
    }
}
