//! The fleet's recorder: samples the account's API counters and the ready-pod count every
//! 500 ms on its own thread, for the report's time series. Must not call EC2 or touch a node.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::report::{self, Sample};

/// Samples the account's counters and the ready-pod count every 500 ms until stopped.
pub(super) struct Recorder {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Vec<Sample>>>,
}

impl Recorder {
    pub(super) fn start(
        world: Arc<vpcsim::World>,
        ready: Arc<AtomicUsize>,
        throttling: Arc<AtomicU64>,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let t0 = Instant::now();
        let base = world.api_counts();
        let handle = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut out = Vec::new();
                let mut last_throttled = 0;
                loop {
                    let d = report::delta(&base, &world.api_counts());
                    let (accepted, mutating, throttled) = report::totals(&d);
                    // remember when throttling was last seen (ms since t0)
                    if throttled > last_throttled {
                        throttling.store(
                            u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX) + 1,
                            Ordering::SeqCst,
                        );
                        last_throttled = throttled;
                    }
                    out.push(Sample {
                        t: t0.elapsed().as_secs_f64(),
                        pods_ready: ready.load(Ordering::SeqCst),
                        accepted,
                        mutating,
                        throttled,
                    });
                    if stop.load(Ordering::SeqCst) {
                        return out;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        };
        Self {
            stop,
            handle: Some(handle),
        }
    }

    pub(super) fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
