//! The churn replay (issue 41): plays a pod-churn trace ([`super::churn`]) on a fleet of real
//! ipamds against the simulated VPC (with EC2 latency and attach delay switched on) once per
//! warm-pool policy, each on a fresh fleet, and records per (trace, policy): the share of ADDs
//! answered without waiting for EC2, idle address-hours held, the peak of subnet addresses the
//! fleet took, mutating EC2 calls, time to an address p50/p99; plus the invariants (no address
//! held by two live pods, every ADD answered, every DEL accepted, counts adding up). Owns the
//! replay's tasks and its sampler thread; the processes belong to [`Fleet`], the trace to
//! `churn`.
//!
//! "Answered without waiting for EC2": the AddNetwork's first attempt succeeded in less than
//! half the EC2 latency the replay sets (every EC2 call then takes at least the full latency,
//! so an ADD that waited for one cannot be that fast; an ADD slowed by the host only counts
//! against its policy).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::churn::{Trace, TraceKind, generate};
use super::report;
use super::{Fleet, FleetConfig, add_request, del_request};

/// A warm-pool policy: its name and the ipamd environment that selects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Report name.
    pub name: &'static str,
    /// ipamd environment.
    pub env: Vec<(String, String)>,
}

/// The tuned static setting's `WARM_IP_TARGET` and `MINIMUM_IP_TARGET` (the usual advice: a
/// minimum around the node's usual pod count, a small warm target above it).
pub const TUNED: (u32, u32) = (5, 10);

impl Policy {
    /// Upstream's default: `WARM_ENI_TARGET=1`.
    #[must_use]
    pub fn default_static() -> Self {
        Self {
            name: "default",
            env: Vec::new(),
        }
    }

    /// `WARM_IP_TARGET` / `MINIMUM_IP_TARGET` = [`TUNED`].
    #[must_use]
    pub fn tuned() -> Self {
        Self {
            name: "tuned",
            env: vec![
                ("WARM_IP_TARGET".into(), TUNED.0.to_string()),
                ("MINIMUM_IP_TARGET".into(), TUNED.1.to_string()),
            ],
        }
    }

    /// `WARM_POOL_POLICY=adaptive`.
    #[must_use]
    pub fn adaptive() -> Self {
        Self {
            name: "adaptive",
            env: vec![("WARM_POOL_POLICY".into(), "adaptive".into())],
        }
    }

    /// The three, in report order.
    #[must_use]
    pub fn all() -> Vec<Self> {
        vec![Self::default_static(), Self::tuned(), Self::adaptive()]
    }

    /// The policy named `name`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::all().into_iter().find(|p| p.name == name)
    }
}

/// What to replay.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    /// Nodes (≥ 20 for the report).
    pub nodes: u32,
    /// Instance type.
    pub instance_type: String,
    /// Trace length (replay seconds).
    pub length: f64,
    /// Seed of the trace generator.
    pub seed: u64,
    /// Traces.
    pub traces: Vec<TraceKind>,
    /// Policies.
    pub policies: Vec<Policy>,
    /// EC2 latency set for the replay (ms, every request).
    pub latency_ms: u64,
    /// EC2 attach delay (ms: a new ENI's link appears this long after the attach).
    pub attach_delay_ms: u64,
    /// Where `churn.md` and the SVGs go (None: print only).
    pub out_dir: Option<PathBuf>,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            nodes: 20,
            instance_type: "t3.large".into(),
            length: 90.0,
            seed: 41,
            traces: TraceKind::ALL.to_vec(),
            policies: Policy::all(),
            latency_ms: 400,
            attach_delay_ms: 2000,
            out_dir: None,
        }
    }
}

/// One (trace, policy) run.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// Trace name.
    pub trace: &'static str,
    /// Policy name.
    pub policy: &'static str,
    /// Pods in the trace (all ADDs made).
    pub pods: usize,
    /// ADDs in the measured window.
    pub adds: usize,
    /// Of those, answered without waiting for EC2.
    pub fast: usize,
    /// Of those, answered at all (possibly after retries).
    pub answered: usize,
    /// Pods of the whole trace that never got an address.
    pub gave_up: usize,
    /// AddNetwork attempts that failed (retried after 1 s).
    pub failed_attempts: usize,
    /// Idle address-hours in the measured window (secondary addresses held in EC2 by the
    /// fleet's ENIs minus pods holding one), in replay hours.
    pub idle_address_hours: f64,
    /// Mean idle addresses per node over the window.
    pub idle_per_node: f64,
    /// Peak of addresses the fleet took from the subnet (every address of its ENIs, primaries
    /// included, /28s as 16), in the measured window.
    pub peak_subnet: usize,
    /// Mutating EC2 calls in the measured window.
    pub ec2_mutating: u64,
    /// Time to an address (from the trace's ADD time to the answer, retries included), p50, s.
    pub p50: f64,
    /// The same, p99.
    pub p99: f64,
    /// The same, max.
    pub max: f64,
    /// Invariant violations.
    pub violations: Vec<String>,
    /// Idle addresses over time (replay seconds, fleet-wide).
    pub idle_series: Vec<(f64, f64)>,
    /// Each node's `awscni_adaptive_warm_ip_target` at the end of the run (None: not
    /// published, as under the static policy, or the scrape failed).
    pub adaptive_targets: Vec<Option<f64>>,
}

impl Row {
    /// Share of measured ADDs answered without waiting for EC2.
    #[must_use]
    pub fn fast_share(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let s = self.fast as f64 / self.adds.max(1) as f64;
        s
    }
}

/// One pod's outcome.
#[derive(Debug, Clone, Copy)]
struct AddOutcome {
    add_at: f64,
    /// Seconds from its ADD time to its address (None: never).
    took: Option<f64>,
    fast: bool,
    failed_attempts: usize,
}

/// One sample of the account: (replay seconds, secondary addresses held, all subnet
/// addresses of the fleet's ENIs, pods holding an address).
type Held = (f64, usize, usize, usize);

/// The fleet's addresses in EC2: (secondary held on attached ENIs, all addresses of its ENIs).
fn addresses_held(world: &vpcsim::World) -> (usize, usize) {
    world.read(|s| {
        s.enis.values().fold((0, 0), |(sec, all), e| {
            let n = e.private_ips.len() + 16 * e.ipv4_prefixes.len();
            let secondary = if e.attachment.is_some() {
                n.saturating_sub(1)
            } else {
                0
            };
            (sec + secondary, all + n)
        })
    })
}

impl Fleet {
    /// Waits until the fleet made no mutating EC2 call for `quiet` (at most `max`).
    pub fn wait_quiet(&self, quiet: Duration, max: Duration) {
        let t = Instant::now();
        let mut last = report::totals(&self.sim.world.api_counts()).1;
        let mut since = Instant::now();
        while since.elapsed() < quiet && t.elapsed() < max {
            std::thread::sleep(Duration::from_millis(250));
            let now = report::totals(&self.sim.world.api_counts()).1;
            if now != last {
                (last, since) = (now, Instant::now());
            }
        }
    }

    /// Plays `trace` on this fleet (node `i` of the trace on node `i % len`); ADDs answered in
    /// less than `fast_under` on their first attempt count as answered without EC2.
    #[must_use]
    pub fn replay(&self, trace: &Trace, fast_under: Duration) -> Row {
        let t0 = Instant::now();
        let alive = Arc::new(AtomicUsize::new(0));
        let live: Arc<Mutex<BTreeMap<Ipv4Addr, String>>> = Arc::default();
        let violations: Arc<Mutex<Vec<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let measure_from = trace.measure_from;
        // the sampler: addresses held in EC2, every 250 ms; the call counters at the window's
        // start
        let sampler = {
            let (world, alive, stop) = (self.sim.world.clone(), alive.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut out: Vec<Held> = Vec::new();
                let mut calls_at_start = None;
                loop {
                    let t = t0.elapsed().as_secs_f64();
                    if calls_at_start.is_none() && t >= measure_from {
                        calls_at_start = Some(world.api_counts());
                    }
                    let (held, all) = addresses_held(&world);
                    out.push((t, held, all, alive.load(Ordering::SeqCst)));
                    if stop.load(Ordering::SeqCst) {
                        return (out, calls_at_start.unwrap_or_default());
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
            })
        };
        let mut tasks = Vec::new();
        for (k, p) in trace.pods.iter().copied().enumerate() {
            let node = p.node % self.len();
            let mut client = self.clients[node].clone();
            let id = format!("churn-{}-n{node}-{k}", trace.kind.name());
            let (alive, live, violations) = (alive.clone(), live.clone(), violations.clone());
            tasks.push(self.rt.spawn(async move {
                let add_at = tokio::time::Instant::from_std(t0 + Duration::from_secs_f64(p.add_at));
                let del_at = tokio::time::Instant::from_std(t0 + Duration::from_secs_f64(p.del_at));
                tokio::time::sleep_until(add_at).await;
                // kubelet retries a failed sandbox; give up 60 s after the pod's DEL time
                let give_up = del_at + Duration::from_secs(60);
                let mut failed = 0;
                let mut fast = false;
                let ip = loop {
                    let attempt = tokio::time::Instant::now();
                    let r = client.add_network(add_request(&id)).await;
                    let ip: Option<Ipv4Addr> = r.ok().and_then(|r| {
                        let r = r.into_inner();
                        r.success
                            .then(|| r.ip_allocation_metadata.first()?.i_pv4_addr.parse().ok())
                            .flatten()
                    });
                    if let Some(ip) = ip {
                        fast = failed == 0 && attempt.elapsed() < fast_under;
                        break Some(ip);
                    }
                    failed += 1;
                    if tokio::time::Instant::now() > give_up {
                        break None;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                };
                let took = ip.map(|_| add_at.elapsed().as_secs_f64());
                if let Some(ip) = ip {
                    let other = live
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(ip, id.clone());
                    if let Some(other) = other {
                        violations
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(format!("{ip} handed to {id} while {other} holds it"));
                    }
                    alive.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep_until(del_at).await;
                    live.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .remove(&ip);
                    alive.fetch_sub(1, Ordering::SeqCst);
                }
                // the DEL comes whether the ADD succeeded or not (kubelet's teardown)
                let del = client.del_network(del_request(&id)).await;
                if !matches!(&del, Ok(r) if r.get_ref().success) {
                    violations
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(format!("DEL {id} refused: {del:?}"));
                }
                AddOutcome {
                    add_at: p.add_at,
                    took,
                    fast,
                    failed_attempts: failed,
                }
            }));
        }
        let outcomes: Vec<AddOutcome> = self.rt.block_on(async {
            let mut out = Vec::new();
            for t in tasks {
                if let Ok(o) = t.await {
                    out.push(o);
                }
            }
            out
        });
        stop.store(true, Ordering::SeqCst);
        let (samples, calls_at_start) = sampler.join().unwrap_or_default();
        let calls = report::delta(&calls_at_start, &self.sim.world.api_counts());
        let mut violations = std::mem::take(
            &mut *violations
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if outcomes.len() != trace.pods.len() {
            violations.push(format!(
                "{} of {} pod tasks ended",
                outcomes.len(),
                trace.pods.len()
            ));
        }
        let still = live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len();
        if still > 0 {
            violations.push(format!("{still} addresses still held after every DEL"));
        }
        let mut row = summarize(trace, &outcomes, &samples, &calls, violations, self.len());
        row.adaptive_targets = (0..self.len())
            .map(|i| {
                let text = self.sim.http_get(i, crate::sim::METRICS, "/metrics").ok()?;
                text.lines().find_map(|l| {
                    l.strip_prefix("awscni_adaptive_warm_ip_target ")
                        .and_then(|v| v.trim().parse().ok())
                })
            })
            .collect();
        row
    }
}

fn summarize(
    trace: &Trace,
    outcomes: &[AddOutcome],
    samples: &[Held],
    calls: &BTreeMap<String, vpcsim::world::ApiCount>,
    violations: Vec<String>,
    nodes: usize,
) -> Row {
    let measured: Vec<&AddOutcome> = outcomes
        .iter()
        .filter(|o| o.add_at >= trace.measure_from)
        .collect();
    let mut took: Vec<f64> = measured.iter().filter_map(|o| o.took).collect();
    took.sort_by(f64::total_cmp);
    // idle addresses integrated over the measured window (trapezoids between samples)
    let window: Vec<(f64, f64)> = samples
        .iter()
        .filter(|s| s.0 >= trace.measure_from && s.0 <= trace.length)
        .map(|&(t, held, _, alive)| {
            #[allow(clippy::cast_precision_loss)]
            let idle = held.saturating_sub(alive) as f64;
            (t, idle)
        })
        .collect();
    let idle_seconds: f64 = window
        .windows(2)
        .map(|w| (w[1].0 - w[0].0) * (w[0].1 + w[1].1) / 2.0)
        .sum();
    let span = match (window.first(), window.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => b.0 - a.0,
        _ => 1.0,
    };
    #[allow(clippy::cast_precision_loss)]
    let idle_per_node = idle_seconds / span / nodes.max(1) as f64;
    Row {
        trace: trace.kind.name(),
        policy: "",
        pods: trace.pods.len(),
        adds: measured.len(),
        fast: measured.iter().filter(|o| o.fast).count(),
        answered: measured.iter().filter(|o| o.took.is_some()).count(),
        gave_up: outcomes.iter().filter(|o| o.took.is_none()).count(),
        failed_attempts: outcomes.iter().map(|o| o.failed_attempts).sum(),
        idle_address_hours: idle_seconds / 3600.0,
        idle_per_node,
        peak_subnet: samples
            .iter()
            .filter(|s| s.0 >= trace.measure_from)
            .map(|s| s.2)
            .max()
            .unwrap_or(0),
        ec2_mutating: report::totals(calls).1,
        p50: report::percentile(&took, 50.0).unwrap_or(0.0),
        p99: report::percentile(&took, 99.0).unwrap_or(0.0),
        max: took.last().copied().unwrap_or(0.0),
        violations,
        idle_series: samples
            .iter()
            .map(|&(t, held, _, alive)| {
                #[allow(clippy::cast_precision_loss)]
                let idle = held.saturating_sub(alive) as f64;
                (t, idle)
            })
            .collect(),
        adaptive_targets: Vec::new(),
    }
}

/// Runs every (trace, policy) of `cfg`, each on a fresh fleet, printing each row as it ends;
/// writes `churn.md` and one SVG per trace into the output directory. Errors: a fleet did not
/// come up.
pub fn replay_all(cfg: &ReplayConfig) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    let fast_under = Duration::from_millis(cfg.latency_ms / 2);
    for &kind in &cfg.traces {
        let trace = generate(kind, cfg.nodes as usize, cfg.length, cfg.seed);
        for policy in &cfg.policies {
            println!(
                "churn replay: {} ({} pods) × {} on {} nodes ...",
                kind.name(),
                trace.pods.len(),
                policy.name,
                cfg.nodes
            );
            let fleet = Fleet::start(&FleetConfig {
                nodes: cfg.nodes,
                instance_type: cfg.instance_type.clone(),
                ipamd_env: policy.env.clone(),
                keep_logs: cfg.out_dir.as_ref().map(|d| {
                    d.join("logs")
                        .join(format!("{}-{}", kind.name(), policy.name))
                }),
                ..FleetConfig::default()
            })?;
            fleet.sim.set_knobs(|k| {
                k.latency_ms = cfg.latency_ms;
                k.attach_delay_ms = cfg.attach_delay_ms;
            });
            // the pools as the policy leaves an empty node
            fleet.wait_quiet(Duration::from_secs(8), Duration::from_secs(90));
            let mut row = fleet.replay(&trace, fast_under);
            row.policy = policy.name;
            println!("{}", row_line(&row));
            drop(fleet);
            rows.push(row);
        }
        if let Some(dir) = &cfg.out_dir {
            let series: Vec<(&str, &[(f64, f64)])> = rows
                .iter()
                .filter(|r| r.trace == kind.name())
                .map(|r| (r.policy, r.idle_series.as_slice()))
                .collect();
            let svg = report::lines_svg(
                &format!(
                    "churn replay, {} trace: idle addresses held by {} nodes",
                    kind.name(),
                    cfg.nodes
                ),
                &series,
                trace.measure_from,
            );
            let _ = std::fs::create_dir_all(dir);
            let _ = std::fs::write(dir.join(format!("churn-{}.svg", kind.name())), svg);
        }
    }
    if let Some(dir) = &cfg.out_dir {
        let _ = std::fs::write(dir.join("churn.md"), markdown(cfg, &rows));
    }
    Ok(rows)
}

fn row_line(r: &Row) -> String {
    format!(
        "| {} | {} | {} | {:.2} % | {:.3} ({:.1}/node) | {} | {} | {:.2} / {:.2} s | {} |",
        r.trace,
        r.policy,
        r.adds,
        100.0 * r.fast_share(),
        r.idle_address_hours,
        r.idle_per_node,
        r.peak_subnet,
        r.ec2_mutating,
        r.p50,
        r.p99,
        if r.violations.is_empty() && r.gave_up == 0 {
            "none".to_owned()
        } else {
            format!(
                "{} gave up; {}",
                r.gave_up,
                r.violations.first().map_or("", String::as_str)
            )
        }
    )
}

/// The report: the table and the acceptance reading.
#[must_use]
pub fn markdown(cfg: &ReplayConfig, rows: &[Row]) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Churn replay: {} × {}, traces of {:.0} s (seed {}), EC2 latency {} ms per request, \
         attach delay {} ms; an ADD counts as answered without EC2 when its first attempt \
         succeeded in < {} ms.\n",
        cfg.nodes,
        cfg.instance_type,
        cfg.length,
        cfg.seed,
        cfg.latency_ms,
        cfg.attach_delay_ms,
        cfg.latency_ms / 2
    );
    md.push_str(
        "| trace | policy | ADDs measured | without EC2 | idle address-hours (mean idle per node) \
         | peak subnet addresses | EC2 mutating calls | time to address p50 / p99 | \
         violations |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let _ = writeln!(md, "{}", row_line(r));
    }
    let _ = writeln!(md, "\n{}", acceptance(rows));
    md
}

/// The acceptance reading, per trace: adaptive ≥ 99.5 % without EC2, ≤ 1/3 of the default's
/// idle address-hours, ≤ the tuned setting's EC2 calls.
#[must_use]
pub fn acceptance(rows: &[Row]) -> String {
    let mut out = String::from(
        "| trace | adaptive without EC2 ≥ 99.5 % | idle ≤ 1/3 of default | EC2 calls ≤ tuned |\n|---|---|---|---|\n",
    );
    let mut traces: Vec<&str> = rows.iter().map(|r| r.trace).collect();
    traces.dedup();
    for t in traces {
        let get = |p: &str| rows.iter().find(|r| r.trace == t && r.policy == p);
        let Some(a) = get("adaptive") else { continue };
        let fast = format!(
            "{} ({:.2} %)",
            yes(a.fast_share() >= 0.995),
            100.0 * a.fast_share()
        );
        let idle = get("default").map_or("n/a".into(), |d| {
            format!(
                "{} ({:.2}×)",
                yes(a.idle_address_hours * 3.0 <= d.idle_address_hours),
                a.idle_address_hours / d.idle_address_hours.max(1e-9)
            )
        });
        let calls = get("tuned").map_or("n/a".into(), |s| {
            format!(
                "{} ({} vs {})",
                yes(a.ec2_mutating <= s.ec2_mutating),
                a.ec2_mutating,
                s.ec2_mutating
            )
        });
        let _ = writeln!(out, "| {t} | {fast} | {idle} | {calls} |");
    }
    out
}

fn yes(b: bool) -> &'static str {
    if b { "met" } else { "NOT met" }
}
