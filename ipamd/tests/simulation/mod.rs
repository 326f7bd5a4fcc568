//! The whole-daemon simulation (issue 28): see `harness` for what is modelled and checked,
//! `cloud` for EC2's eventual consistency, `host` for the host, `daemon` for the ipamd process,
//! `exec` for the scheduler, `rng` for the tape every choice comes from. This file runs seeds
//! within a budget, replays one, and shrinks a failing tape to a short trace.

pub mod cloud;
pub mod cluster;
pub mod daemon;
pub mod disk;
pub mod exec;
pub mod harness;
pub mod host;
pub mod rng;
pub mod trace;

use std::time::{Duration, Instant};

pub use harness::{Outcome, Profile, RunConfig};
use rng::Tape;

/// A seed's run from its seed.
pub fn run_seed(seed: u64, profile: Profile) -> (RunConfig, Outcome) {
    let cfg = RunConfig::from_seed(seed, profile);
    let out = harness::run(&cfg, Tape::from_seed(seed));
    (cfg, out)
}

/// A run of `cfg` from its seed.
pub fn run_config(cfg: &RunConfig) -> Outcome {
    harness::run(cfg, Tape::from_seed(cfg.seed))
}

/// What a search did.
pub struct Search {
    pub seeds_run: u64,
    pub elapsed: Duration,
    pub failure: Option<(RunConfig, Outcome)>,
}

/// Runs seeds `first..` until one fails, `max_seeds` ran, or `budget` is spent (at least
/// `min_seeds` run whatever the time).
pub fn search(
    profile: Profile,
    first: u64,
    max_seeds: u64,
    min_seeds: u64,
    budget: Option<Duration>,
) -> Search {
    let started = Instant::now();
    let mut seeds_run = 0;
    for seed in first..first + max_seeds {
        if seeds_run >= min_seeds && budget.is_some_and(|b| started.elapsed() >= b) {
            break;
        }
        let (cfg, out) = run_seed(seed, profile);
        seeds_run += 1;
        if out.violation.is_some() {
            return Search {
                seeds_run,
                elapsed: started.elapsed(),
                failure: Some((cfg, out)),
            };
        }
    }
    Search {
        seeds_run,
        elapsed: started.elapsed(),
        failure: None,
    }
}

/// Shrinks a failing run's tape while the same kind of violation still happens and the
/// trace gets shorter: first whole steps are deleted (chunks of halving size, the choices of
/// the steps left stay aligned to their steps), then single entries are zeroed (0 is every
/// choice's quiet answer).
pub fn shrink(cfg: &RunConfig, failing: &Outcome, budget: Duration) -> Outcome {
    let started = Instant::now();
    let Some(kind) = failing.violation.as_ref().map(|v| v.kind) else {
        return failing.clone();
    };
    let left = || started.elapsed() < budget;
    let fails = |tape: &[u64]| {
        let o = harness::run(cfg, Tape::replay(tape.to_vec()));
        (o.violation.as_ref().map(|v| v.kind) == Some(kind)).then_some(o)
    };
    let Some(mut best) = fails(&failing.tape) else {
        // Not reproducible from its tape: a bug of the harness (a choice not from the tape).
        let mut o = failing.clone();
        o.trace
            .push("!! the failing tape did not reproduce: the run is not deterministic".into());
        return o;
    };
    let better = |o: &Outcome, best: &Outcome| {
        (o.steps, o.trace.len(), o.tape.len()) < (best.steps, best.trace.len(), best.tape.len())
    };
    let mut improved = true;
    while improved && left() {
        improved = false;
        // Whole steps.
        let mut size = (best.step_starts.len() / 2).max(1);
        loop {
            let mut i = best.step_starts.len();
            while i >= size && i > 0 && left() {
                let bounds =
                    |o: &Outcome, k: usize| o.step_starts.get(k).copied().unwrap_or(o.tape.len());
                let (a, b) = (bounds(&best, i - size), bounds(&best, i));
                let mut cand = best.tape[..a.min(best.tape.len())].to_vec();
                cand.extend_from_slice(&best.tape[b.min(best.tape.len())..]);
                match fails(&cand) {
                    Some(o) if better(&o, &best) => {
                        best = o;
                        improved = true;
                        i = i.min(best.step_starts.len());
                    }
                    _ => i -= size,
                }
            }
            if size == 1 || !left() {
                break;
            }
            size /= 2;
        }
        // Single entries zeroed.
        let mut i = 0;
        while i < best.tape.len() && left() {
            if best.tape[i] != 0 {
                let mut cand = best.tape.clone();
                cand[i] = 0;
                if let Some(o) = fails(&cand)
                    && !better(&best, &o)
                {
                    improved |= better(&o, &best);
                    best = o;
                }
            }
            i += 1;
        }
    }
    best
}

/// The report of a failing seed: how to replay it, the violation, the (shrunk) trace.
pub fn report(cfg: &RunConfig, original: &Outcome, shrunk: &Outcome) -> String {
    let v = shrunk
        .violation
        .as_ref()
        .or(original.violation.as_ref())
        .expect("a violation");
    let mut s = format!(
        "SIMULATION FOUND A VIOLATION: {}: {}\n{}\nreplay: SIM_SEED={} SIM_PROFILE={} cargo test --workspace --test suite simulation:: -- --nocapture\n",
        v.kind,
        v.detail,
        cfg.describe(),
        cfg.seed,
        cfg.profile.name,
    );
    s.push_str(&format!(
        "original run: {} steps, {} trace lines; shrunk run: {} trace lines\n",
        original.steps,
        original.trace.len(),
        shrunk.trace.len()
    ));
    let lines = &shrunk.trace;
    let shown = if lines.len() > 80 {
        s.push_str(&format!("(last 80 of {} events)\n", lines.len()));
        &lines[lines.len() - 80..]
    } else {
        &lines[..]
    };
    for l in shown {
        s.push_str("  ");
        s.push_str(l);
        s.push('\n');
    }
    if let Some(v) = &shrunk.violation {
        s.push_str(&format!("  => {}: {}\n", v.kind, v.detail));
    }
    s
}

/// Environment knobs: `SIM_SEED` (replay one), `SIM_SEEDS` (how many), `SIM_FIRST_SEED`,
/// `SIM_SECS` (time budget), `SIM_SHRINK_SECS`, `SIM_PROFILE`.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}
