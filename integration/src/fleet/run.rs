//! Runs the fleet scenarios in order (boot, scale-out storm, `aws-cni` sample, churn,
//! brown-out, idle, teardown), prints progress, and writes the report (`report.md` plus SVG
//! plots) into an output directory. Owns the scenario sequence and the report text; the
//! processes belong to [`Fleet`], the arithmetic to [`report`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::report::{self, NodeShape};
use super::{Fleet, FleetConfig, GrpcPod, Wave};

/// Time after deleting pods for cooldowns to pass and the pools to shrink.
const SETTLE: Duration = Duration::from_secs(40);

/// Scenario parameters.
#[derive(Debug, Clone)]
pub struct Scenarios {
    /// The fleet.
    pub fleet: FleetConfig,
    /// Pods per node in the storm.
    pub storm_pods: usize,
    /// Real `aws-cni` pods per node after the storm (datapath sample).
    pub cni_pods: usize,
    /// Churn duration (0: skip) and rate (pods created and deleted per second, fleet-wide).
    pub churn: Duration,
    /// Churn rate.
    pub churn_rate: f64,
    /// Pods per node deleted after the storm, before the churn (headroom).
    pub shrink_pods: usize,
    /// Brown-out: cut the account's buckets this long after the storm's pods arrived.
    pub brownout_at: Option<Duration>,
    /// Bucket scale during the brown-out.
    pub brownout_scale: f64,
    /// How long the buckets stay cut.
    pub brownout: Duration,
    /// Idle window (0: skip).
    pub idle: Duration,
    /// The idle window starts once the fleet made no mutating call for this long (longer than
    /// the pool's ENI hold, `ipamd::pool::policy::ENI_EXCESS_HOLD`, so the last spare ENIs
    /// freed after the churn are not counted as idle calls).
    pub rest_quiet: Duration,
    /// Longest wait for the fleet to come to rest.
    pub rest_max: Duration,
    /// Time compression of ipamd's leaked-ENI clean-up (its period becomes 3600 / this, via
    /// `IPAMD_LEAKED_ENI_PERIOD_SECONDS`) when there is an idle window; 1: real time.
    pub idle_compression: u32,
    /// Where `report.md` and the SVGs go (None: print only).
    pub out_dir: Option<PathBuf>,
}

impl Default for Scenarios {
    fn default() -> Self {
        Self {
            fleet: FleetConfig::default(),
            storm_pods: 30,
            cni_pods: 1,
            churn: Duration::from_secs(180),
            churn_rate: 5.0,
            shrink_pods: 20,
            brownout_at: None,
            brownout_scale: 0.1,
            brownout: Duration::from_secs(60),
            idle: Duration::from_secs(600),
            rest_quiet: Duration::from_secs(180),
            rest_max: Duration::from_secs(900),
            idle_compression: 12,
            out_dir: None,
        }
    }
}

/// What the run found (also what the test asserts on).
#[derive(Debug, Default)]
pub struct Outcome {
    /// The report (markdown).
    pub markdown: String,
    /// Pods that never got an address (all scenarios).
    pub gave_up: usize,
    /// Failed `AddNetwork` attempts while the account was throttling.
    pub failed_while_throttled: u64,
    /// Invariant violations (duplicate/unowned addresses, leaked ENIs, DEL failures).
    pub violations: Vec<String>,
    /// The ipamds' RSS at the end of the storm (`VmRSS`, and its anonymous part `RssAnon`).
    pub rss_storm: (report::RssSummary, report::RssSummary),
    /// The same at the end of the run (everything deleted, before the ipamds stop).
    pub rss_end: (report::RssSummary, report::RssSummary),
    /// Stretches of the storm of 5 s or more with pods waiting, no EC2 request and no address
    /// handed out (`(from, to)` seconds; issue 30's "idle minutes").
    pub storm_stalls: Vec<(f64, f64)>,
}

fn say(line: &str) {
    println!("{line}");
}

fn wave_lines(md: &mut String, name: &str, w: &Wave, pods: usize) {
    let (accepted, mutating, throttled) = report::totals(&w.calls);
    let _ = writeln!(
        md,
        "- {name}: {} of {pods} pods got an address in {:.1} s ({} gave up); {} AddNetwork \
         attempts failed ({} of them while the account was throttling); EC2: {accepted} \
         requests ({mutating} mutating), {throttled} `RequestLimitExceeded`",
        w.pods.len(),
        w.seconds,
        w.gave_up,
        w.failed_attempts,
        w.failed_while_throttled,
    );
    say(md.lines().last().unwrap_or(""));
}

fn write(out: &Option<PathBuf>, name: &str, text: &str) {
    if let Some(dir) = out {
        let _ = std::fs::create_dir_all(dir);
        let p = dir.join(name);
        if let Err(e) = std::fs::write(&p, text) {
            eprintln!("write {}: {e}", p.display());
        }
    }
}

/// The fleet's ipamd memory: `VmRSS` and `RssAnon` summaries and the per-node line (`VmRSS`
/// with `RssFile`), each field read once per node.
fn rss(fleet: &Fleet) -> ((report::RssSummary, report::RssSummary), String) {
    let total = fleet.ipamd_memory_kib("VmRSS:");
    let line = report::rss_nodes_line(&total, &fleet.ipamd_memory_kib("RssFile:"));
    (
        (
            report::rss_summary(&total),
            report::rss_summary(&fleet.ipamd_memory_kib("RssAnon:")),
        ),
        line,
    )
}

/// Run everything; errors are setup failures (the fleet did not come up).
pub fn run(sc: &Scenarios) -> Result<Outcome, String> {
    let mut out = Outcome::default();
    let mut md = String::new();
    let n = sc.fleet.nodes;
    let limits = vpcsim::limits::lookup(&sc.fleet.instance_type)
        .ok_or_else(|| format!("unknown instance type {}", sc.fleet.instance_type))?;
    let shape = NodeShape {
        max_enis: limits.max_enis,
        ipv4_per_eni: limits.ipv4_per_eni,
    };
    say(&format!("fleet: {n} × {} ...", sc.fleet.instance_type));
    let compression = if sc.idle.is_zero() {
        1
    } else {
        sc.idle_compression.clamp(1, 60)
    };
    let mut fleet_config = sc.fleet.clone();
    if compression > 1 {
        fleet_config.ipamd_env.push((
            "IPAMD_LEAKED_ENI_PERIOD_SECONDS".into(),
            (3600 / compression).to_string(),
        ));
    }
    let mut fleet = Fleet::start(&fleet_config)?;
    let _ = writeln!(
        md,
        "## Boot\n\n- {n} × {}: simulated VPC (namespaces, IMDS, fabric) up in {:.1} s; all {n} \
         ipamds spawned at once answered on their sockets within {:.1} s; ipamds that exited \
         during boot and were restarted (as kubelet would): {:?}",
        sc.fleet.instance_type, fleet.vpc_seconds, fleet.boot_seconds, fleet.boot_restarts
    );
    say(md.lines().last().unwrap_or(""));
    let throttle = fleet.sim.world.knobs().throttle;

    // --- storm
    let _ = writeln!(md, "\n## Scale-out storm\n");
    let normal = fleet.sim.world.knobs();
    let world = fleet.sim.world.clone();
    let (mut cut, mut restored) = (false, false);
    let brownout = sc.brownout_at.map(|at| (at, at + sc.brownout));
    let storm = fleet.wave(
        &vec![sc.storm_pods; fleet.len()],
        Duration::from_secs(900),
        |elapsed| {
            let Some((from, to)) = brownout else { return };
            if !cut && elapsed >= from {
                let mut k = normal.clone();
                k.throttle.scale = sc.brownout_scale;
                world.set_knobs(k);
                cut = true;
            } else if cut && !restored && elapsed >= to {
                world.set_knobs(normal.clone());
                restored = true;
            }
        },
    );
    fleet.sim.world.set_knobs(normal);
    let (rss_storm, rss_storm_nodes) = rss(&fleet);
    out.rss_storm = rss_storm;
    wave_lines(&mut md, "storm", &storm, sc.storm_pods * fleet.len());
    if let Some((from, to)) = brownout {
        let _ = writeln!(
            md,
            "- brown-out: the account's buckets were cut to {:.0} % from {:.0} s to {:.0} s into \
             the storm (shaded in the plot)",
            sc.brownout_scale * 100.0,
            from.as_secs_f64(),
            to.as_secs_f64()
        );
    }
    out.gave_up += storm.gave_up;
    out.failed_while_throttled += storm.failed_while_throttled;
    let since_start = fleet.sim.world.api_counts();
    let (_, mutating_total, _) = report::totals(&since_start);
    let pods_u32 = u32::try_from(sc.storm_pods).unwrap_or(u32::MAX);
    let mut ec2_bound = None;
    if let Some(per_node) = report::min_calls_per_node(shape, pods_u32) {
        let bound = report::fleet_calls(&per_node, n);
        let bound_total: u32 = bound.values().sum();
        let allowed = report::bucket_seconds_with_brownout(
            &throttle,
            &bound,
            brownout.map(|(a, b)| (a.as_secs_f64(), b.as_secs_f64(), sc.brownout_scale)),
        ) * 1.5;
        // The bound assumes every call made at t = 0 from full buckets: when the lower bound
        // fits the full buckets it is 0 s (degenerate); with a brown-out that starts after
        // that burst it ignores the cut. The cut-from-the-first-call variant is the bound
        // that says something then.
        ec2_bound = (allowed > 0.0).then_some(allowed);
        let degenerate = if allowed <= 0.0 {
            " (degenerate: the lower bound fits the account's full buckets at once, so the \
             bound is 0 s and cannot be met by any fleet; it says only that EC2's buckets \
             did not limit this storm)"
        } else {
            ""
        };
        let _ = writeln!(
            md,
            "- mutating calls since boot: {mutating_total}; lower bound {bound_total} \
             ({} per node: {per_node:?}); ratio {:.2} (target ≤ 1.2)\n- time the account's \
             per-action mutating buckets allow for the lower bound × 1.5, all calls at t = 0 \
             from full buckets: {allowed:.1} s{degenerate}; last pod had its address after \
             {:.1} s",
            bound_total / n.max(1),
            f64::from(u32::try_from(mutating_total).unwrap_or(u32::MAX))
                / f64::from(bound_total.max(1)),
            storm.seconds
        );
        say(md.lines().rev().nth(1).unwrap_or(""));
        say(md.lines().last().unwrap_or(""));
        if let Some((from, to)) = brownout {
            let len = (to - from).as_secs_f64();
            let from_start = report::bucket_seconds_with_brownout(
                &throttle,
                &bound,
                Some((0.0, len, sc.brownout_scale)),
            ) * 1.5;
            let _ = writeln!(
                md,
                "- the same bound with the cut applied from the first call (from 0 s to \
                 {len:.0} s, the bound that is not degenerate when the lower bound's burst fits \
                 the buckets before the cut starts): {from_start:.1} s; last pod after {:.1} s: \
                 {}",
                storm.seconds,
                if storm.seconds <= from_start {
                    "met"
                } else {
                    "NOT met"
                }
            );
            say(md.lines().last().unwrap_or(""));
        }
    }
    if let Some(t) = report::time_to(&storm.samples, storm.pods.len() / 2) {
        let _ = writeln!(md, "- half of the pods had their address after {t:.1} s");
    }
    let tta = &storm.time_to_address;
    if let (Some(p50), Some(p90), Some(p99), Some(max)) = (
        report::percentile(tta, 50.0),
        report::percentile(tta, 90.0),
        report::percentile(tta, 99.0),
        tta.last(),
    ) {
        let _ = writeln!(
            md,
            "- time to an address per pod (from the storm's start, retries included): p50 \
             {p50:.1} s, p90 {p90:.1} s, p99 {p99:.1} s, max {max:.1} s{} (CDF: storm-cdf.svg)",
            ec2_bound.map_or(String::new(), |b| format!(
                "; the EC2 bucket-bound time (× 1.5) is {b:.1} s"
            ))
        );
        say(md.lines().last().unwrap_or(""));
    }
    out.storm_stalls = report::stalls(&storm.samples, sc.storm_pods * fleet.len(), 5.0);
    let _ = writeln!(
        md,
        "- stretches of 5 s or more with ADDs waiting, no EC2 request and no address handed \
         out: {}",
        if out.storm_stalls.is_empty() {
            "none".to_owned()
        } else {
            out.storm_stalls
                .iter()
                .map(|(a, b)| format!("{a:.1}–{b:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    say(md.lines().last().unwrap_or(""));
    write(
        &sc.out_dir,
        "storm-cdf.svg",
        &report::cdf_svg(
            &format!("time to an address: {n} nodes × {} pods", sc.storm_pods),
            tta,
            ec2_bound.map(|b| (b, "EC2 bucket bound × 1.5")),
        ),
    );
    let _ = writeln!(
        md,
        "{}",
        report::rss_line(
            "at the end of the storm",
            &out.rss_storm.0,
            &out.rss_storm.1
        )
    );
    say(md.lines().last().unwrap_or(""));
    let _ = writeln!(md, "{rss_storm_nodes}");
    if let Some((from, to)) = brownout {
        let ready_at_end = storm
            .samples
            .iter()
            .take_while(|s| s.t <= to.as_secs_f64())
            .last()
            .map_or(0, |s| s.pods_ready);
        let _ = writeln!(
            md,
            "- recovery: {ready_at_end} pods had their address when the brown-out ended; the last \
             one {:.1} s after it ended (target: within 2 × the brown-out = {:.0} s)",
            (storm.seconds - to.as_secs_f64()).max(0.0),
            2.0 * (to - from).as_secs_f64()
        );
        say(md.lines().last().unwrap_or(""));
    }
    let _ = writeln!(
        md,
        "\nCalls since boot (boot + storm):\n\n{}",
        report::calls_table(&since_start)
    );
    write(
        &sc.out_dir,
        "storm.svg",
        &report::svg(
            &format!(
                "scale-out storm: {n} nodes × {} pods{}",
                sc.storm_pods,
                if brownout.is_some() {
                    " with a brown-out"
                } else {
                    ""
                }
            ),
            &storm.samples,
            sc.storm_pods * fleet.len(),
            brownout.map(|(a, b)| (a.as_secs_f64(), b.as_secs_f64())),
        ),
    );
    if let Err(e) = fleet.check_pods(&storm.pods) {
        out.violations.push(format!("after the storm: {e}"));
    }
    let mut pods = storm.pods;

    // --- aws-cni sample (real pods, datapath)
    let mut sim_ok = 0;
    if sc.cni_pods > 0 {
        let t = Instant::now();
        for node in 0..fleet.len() {
            for k in 0..sc.cni_pods {
                match fleet.sim.add_pod(node, &format!("cni-n{node}-{k}")) {
                    Ok(_) => sim_ok += 1,
                    Err(e) => out
                        .violations
                        .push(format!("aws-cni ADD on node {node}: {e}")),
                }
            }
        }
        let sample: Vec<_> = fleet.sim.pods().to_vec();
        let mut pinged = String::from("no ping (fewer than 2 pods)");
        if let (Some(a), Some(b)) = (sample.first(), sample.last())
            && a.node != b.node
        {
            // the fabric may still be adding the router's route for the new pod address
            let t = Instant::now();
            let mut r = crate::sim::ping(&a.netns, b.ip);
            while r.is_err() && t.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_secs(1));
                r = crate::sim::ping(&a.netns, b.ip);
            }
            pinged = match r {
                Ok(()) => format!("ping node {} → node {} ok", a.node, b.node),
                Err(e) => {
                    out.violations
                        .push(format!("ping {} → {}: {e}", a.ip, b.ip));
                    format!("ping node {} → node {} FAILED", a.node, b.node)
                }
            };
        }
        let _ = writeln!(
            md,
            "\n## Datapath sample\n\n- {sim_ok} real `aws-cni` pods ({} per node) in {:.1} s; {pinged}",
            sc.cni_pods,
            t.elapsed().as_secs_f64()
        );
        say(md.lines().last().unwrap_or(""));
    }

    // --- shrink: churn needs headroom (a full node fails ADDs at once while freed addresses
    // cool down)
    if sc.shrink_pods > 0 && !sc.churn.is_zero() {
        let mut by_node: BTreeMap<usize, usize> = BTreeMap::new();
        let (gone, keep): (Vec<GrpcPod>, Vec<GrpcPod>) = pods.into_iter().partition(|p| {
            let c = by_node.entry(p.node).or_default();
            *c += 1;
            *c <= sc.shrink_pods
        });
        out.violations.extend(fleet.delete(&gone));
        pods = keep;
        let before = fleet.sim.world.api_counts();
        std::thread::sleep(SETTLE);
        let d = report::delta(&before, &fleet.sim.world.api_counts());
        let _ = writeln!(
            md,
            "\n## Shrink\n\n- {} pods per node deleted, {} s to settle: EC2 {:?} (accepted, mutating, throttled)",
            sc.shrink_pods,
            SETTLE.as_secs(),
            report::totals(&d)
        );
        say(md.lines().last().unwrap_or(""));
    }

    // --- churn
    if !sc.churn.is_zero() {
        let (alive, w) = fleet.churn(pods, sc.churn_rate, sc.churn);
        pods = alive;
        let (accepted, mutating, throttled) = report::totals(&w.calls);
        let created = w.samples.last().map_or(0, |s| s.pods_ready);
        let _ = writeln!(
            md,
            "\n## Churn\n\n- {:.0} s at {} pods/s created and deleted across the fleet: {created} \
             created, {} ADD/DEL failures; EC2: {accepted} requests ({mutating} mutating, {:.2} \
             per pod created), {throttled} throttled\n\n{}",
            w.seconds,
            sc.churn_rate,
            w.failed_attempts,
            mutating as f64 / created.max(1) as f64,
            report::calls_table(&w.calls)
        );
        say(&format!(
            "churn: {created} created, {mutating} mutating calls, {throttled} throttled"
        ));
        if let Err(e) = fleet.check_pods(&pods) {
            out.violations.push(format!("after churn: {e}"));
        }
    }

    // --- idle: first wait until the fleet is at rest (no mutating call for `rest_quiet`)
    if !sc.idle.is_zero() {
        say(&format!(
            "waiting for the fleet to rest (no mutating call for {} s) ...",
            sc.rest_quiet.as_secs()
        ));
        let settle_from = fleet.sim.world.api_counts();
        let t = Instant::now();
        let mut last = report::totals(&settle_from).1;
        let mut quiet_since = Instant::now();
        while quiet_since.elapsed() < sc.rest_quiet && t.elapsed() < sc.rest_max {
            std::thread::sleep(Duration::from_secs(1));
            let now = report::totals(&fleet.sim.world.api_counts()).1;
            if now != last {
                (last, quiet_since) = (now, Instant::now());
            }
        }
        let settle = report::delta(&settle_from, &fleet.sim.world.api_counts());
        let (_, settle_mutating, _) = report::totals(&settle);
        let _ = writeln!(
            md,
            "\n## Idle\n\n- after the churn: {:.0} s until the fleet was at rest ({}: no mutating \
             call for {} s); {settle_mutating} mutating calls meanwhile (pools shrinking)",
            t.elapsed().as_secs_f64(),
            if quiet_since.elapsed() >= sc.rest_quiet {
                "reached"
            } else {
                "NOT reached"
            },
            sc.rest_quiet.as_secs(),
        );
        say(md.lines().last().unwrap_or(""));
        let before = fleet.sim.world.api_counts();
        let t = Instant::now();
        say(&format!("idle for {} s ...", sc.idle.as_secs()));
        std::thread::sleep(sc.idle);
        let d = report::delta(&before, &fleet.sim.world.api_counts());
        let (accepted, mutating, throttled) = report::totals(&d);
        let describes = accepted - mutating;
        let real_hours = f64::from(n) * t.elapsed().as_secs_f64() / 3600.0;
        let _ = writeln!(
            md,
            "- {:.0} s at rest (= {:.1} node-hours; ipamd's hourly leaked-ENI clean-up compressed \
             {compression}×: every {} s): {mutating} mutating calls, {describes} Describe calls, \
             {throttled} throttled = {:.2} Describe per node-hour (the clean-up's time \
             compressed; {:.2} per real node-hour) (target 0 mutating, ≤ 2 Describe per \
             node-hour)\n\n{}",
            t.elapsed().as_secs_f64(),
            real_hours * f64::from(compression),
            3600 / compression,
            describes as f64 / (real_hours * f64::from(compression)).max(1e-9),
            describes as f64 / real_hours.max(1e-9),
            report::calls_table(&d)
        );
        say(md.lines().rev().nth(2).unwrap_or(""));
    }

    // --- teardown checks
    out.violations.extend(fleet.delete(&pods));
    for p in fleet.sim.pods().to_vec() {
        if let Err(e) = fleet.sim.del_pod(&p) {
            out.violations.push(format!("aws-cni DEL {}: {e}", p.name));
        }
    }
    let leaked = fleet.unattached_enis();
    if !leaked.is_empty() {
        out.violations
            .push(format!("unattached (leaked) ENIs: {leaked:?}"));
    }
    let enis = fleet.enis_per_node();
    let (rss_end, rss_end_nodes) = rss(&fleet);
    out.rss_end = rss_end;
    let _ = writeln!(
        md,
        "\n## End\n\n- all pods deleted; ENIs per node now {:?}..; unattached ENIs in the account: {}; \
         invariant violations: {}",
        &enis[..enis.len().min(10)],
        leaked.len(),
        if out.violations.is_empty() {
            "none".to_owned()
        } else {
            let first: Vec<&str> = out.violations.iter().take(5).map(String::as_str).collect();
            format!("{} (first: {})", out.violations.len(), first.join("; "))
        }
    );
    say(md.lines().last().unwrap_or(""));
    let _ = writeln!(
        md,
        "{}",
        report::rss_line("at the end of the run", &out.rss_end.0, &out.rss_end.1)
    );
    say(md.lines().last().unwrap_or(""));
    let _ = writeln!(md, "{rss_end_nodes}");
    let _ = writeln!(
        md,
        "{}",
        report::major_faults_line(&fleet.ipamd_major_faults())
    );
    say(md.lines().last().unwrap_or(""));
    write(&sc.out_dir, "report.md", &md);
    out.markdown = md;
    drop(fleet);
    Ok(out)
}
