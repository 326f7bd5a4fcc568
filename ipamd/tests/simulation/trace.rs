//! The run's clock (ipamd's `Clock` and the trace's time) and its event trace.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ipamd::ipam::Clock as _;

/// Wall-clock time as ipamd sees it; moved only by the harness, in step with tokio's paused
/// clock.
#[derive(Debug)]
pub struct SimClock(Mutex<SystemTime>);

/// Where every run's clock starts.
pub const T0: SystemTime = SystemTime::UNIX_EPOCH;

impl SimClock {
    pub fn new() -> Arc<Self> {
        Arc::new(Self(Mutex::new(T0 + Duration::from_secs(1_800_000_000))))
    }

    pub fn advance(&self, d: Duration) {
        *self.0.lock().unwrap() += d;
    }

    /// Seconds since the run began.
    pub fn secs(&self) -> u64 {
        self.now()
            .duration_since(T0 + Duration::from_secs(1_800_000_000))
            .map_or(0, |d| d.as_secs())
    }
}

impl ipamd::ipam::Clock for SimClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

/// The events of one run, each stamped with its step and simulated second.
#[derive(Debug, Clone)]
pub struct Trace(Arc<Mutex<Inner>>);

#[derive(Debug)]
struct Inner {
    lines: Vec<String>,
    step: u64,
    clock: Arc<SimClock>,
    /// The task being polled (who makes an EC2 call).
    actor: String,
    /// The last message, and how often it came again since (collapsed into one line).
    last: String,
    repeats: u64,
}

impl Trace {
    pub fn new(clock: Arc<SimClock>) -> Self {
        Self(Arc::new(Mutex::new(Inner {
            lines: Vec::new(),
            step: 0,
            clock,
            actor: String::new(),
            last: String::new(),
            repeats: 0,
        })))
    }

    pub fn set_step(&self, step: u64) {
        self.0.lock().unwrap().step = step;
    }

    pub fn set_actor(&self, actor: &str) {
        actor.clone_into(&mut self.0.lock().unwrap().actor);
    }

    pub fn actor(&self) -> String {
        self.0.lock().unwrap().actor.clone()
    }

    pub fn log(&self, msg: impl AsRef<str>) {
        let mut t = self.0.lock().unwrap();
        let msg = msg.as_ref();
        if msg == t.last {
            t.repeats += 1;
            return;
        }
        t.flush_repeats();
        let line = format!("#{:<5} t={:>5}s  {msg}", t.step, t.clock.secs());
        t.lines.push(line);
        msg.clone_into(&mut t.last);
    }

    pub fn lines(&self) -> Vec<String> {
        let mut t = self.0.lock().unwrap();
        t.flush_repeats();
        t.lines.clone()
    }
}

impl Inner {
    fn flush_repeats(&mut self) {
        if self.repeats > 0 {
            let line = format!(
                "#{:<5} t={:>5}s  (the line above {} more time(s), until now)",
                self.step,
                self.clock.secs(),
                self.repeats
            );
            self.lines.push(line);
            self.repeats = 0;
        }
    }
}
