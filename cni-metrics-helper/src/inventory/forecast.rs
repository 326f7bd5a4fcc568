//! Consumption rate and time to exhaustion of one quantity (a subnet's free addresses or free
//! `/28` blocks) from its recent samples: a least-squares line over a sliding window. Pure;
//! time comes in as seconds from any fixed origin. Must not know EC2 or subnets.

use std::collections::VecDeque;

/// Fewest samples for a rate: two points make a line, a third keeps one late Describe from
/// deciding it alone.
pub const MIN_SAMPLES: usize = 3;

/// Samples of one quantity inside a window.
#[derive(Debug, Clone, PartialEq)]
pub struct History {
    window_secs: f64,
    samples: VecDeque<(f64, f64)>,
}

/// What the history says now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Forecast {
    /// Units consumed per second (negative: the quantity grows).
    pub consumption_per_sec: f64,
    /// Seconds until the quantity reaches zero at that rate; `None` when it is not shrinking.
    pub exhaustion_secs: Option<f64>,
}

impl History {
    /// Keeps samples younger than `window_secs`.
    #[must_use]
    pub fn new(window_secs: f64) -> Self {
        Self {
            window_secs,
            samples: VecDeque::new(),
        }
    }

    /// Records `value` seen at `at` (seconds, non-decreasing) and drops samples that left
    /// the window.
    pub fn record(&mut self, at: f64, value: f64) {
        self.samples.push_back((at, value));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at - t > self.window_secs)
        {
            self.samples.pop_front();
        }
    }

    /// The fitted rate and the time to zero from the last sample; `None` with fewer than
    /// [`MIN_SAMPLES`] samples or when they all share one instant.
    #[must_use]
    pub fn forecast(&self) -> Option<Forecast> {
        if self.samples.len() < MIN_SAMPLES {
            return None;
        }
        #[allow(clippy::cast_precision_loss)]
        let n = self.samples.len() as f64;
        let mean_t = self.samples.iter().map(|(t, _)| t).sum::<f64>() / n;
        let mean_v = self.samples.iter().map(|(_, v)| v).sum::<f64>() / n;
        let (mut sxy, mut sxx) = (0.0, 0.0);
        for (t, v) in &self.samples {
            sxy += (t - mean_t) * (v - mean_v);
            sxx += (t - mean_t) * (t - mean_t);
        }
        if sxx <= f64::EPSILON {
            return None;
        }
        let consumption_per_sec = -(sxy / sxx);
        let (_, last) = *self.samples.back()?;
        let exhaustion_secs =
            (consumption_per_sec > 1e-9).then(|| (last.max(0.0)) / consumption_per_sec);
        Some(Forecast {
            consumption_per_sec,
            exhaustion_secs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_consumption_gives_its_rate_and_the_time_left() {
        let mut h = History::new(600.0);
        for i in 0..10 {
            h.record(f64::from(i) * 30.0, 1000.0 - f64::from(i) * 60.0);
        }
        let f = h.forecast().unwrap();
        assert!((f.consumption_per_sec - 2.0).abs() < 1e-9);
        // last value 1000 - 540 = 460, at 2/s
        assert!((f.exhaustion_secs.unwrap() - 230.0).abs() < 1e-6);
    }

    #[test]
    fn no_forecast_without_enough_samples_or_while_growing() {
        let mut h = History::new(600.0);
        h.record(0.0, 10.0);
        h.record(30.0, 9.0);
        assert_eq!(h.forecast(), None);
        let mut h = History::new(600.0);
        for i in 0..5 {
            h.record(f64::from(i), 10.0 + f64::from(i));
        }
        let f = h.forecast().unwrap();
        assert!(f.consumption_per_sec < 0.0);
        assert_eq!(f.exhaustion_secs, None);
    }

    #[test]
    fn old_samples_leave_the_window() {
        let mut h = History::new(100.0);
        // fast consumption long ago, then flat
        for i in 0..5 {
            h.record(f64::from(i) * 10.0, 1000.0 - f64::from(i) * 100.0);
        }
        for i in 0..5 {
            h.record(500.0 + f64::from(i) * 10.0, 600.0);
        }
        let f = h.forecast().unwrap();
        assert!(f.consumption_per_sec.abs() < 1e-9, "{f:?}");
        assert_eq!(f.exhaustion_secs, None);
    }

    #[test]
    fn samples_at_one_instant_give_no_rate() {
        let mut h = History::new(100.0);
        for v in [3.0, 2.0, 1.0] {
            h.record(5.0, v);
        }
        assert_eq!(h.forecast(), None);
    }
}
