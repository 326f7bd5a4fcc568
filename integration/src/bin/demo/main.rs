//! `demo`: the main job on the embedded default (run by `integration/demo.sh`). Brings up the
//! simulated VPC with 2 nodes running ipamd, creates pods with `aws-cni`, shows connectivity and
//! `/v1/enis`, prints how to explore, and tears everything down on Ctrl-C / SIGTERM or at the
//! end. `demo bench` prints the e2e benchmarks (empty-pool ADD latency vs EC2 latency, EC2
//! calls per pod and per idle node-hour); figures only, nothing asserted. Must not: touch the
//! root network namespace (everything lives in the run's `vsim<run>-*` namespaces).
//! Split by job: this file has the command line, signals, steps and the shared start-up;
//! `tour.rs` the default walk-through, `bench.rs` the benchmarks.

mod bench;
mod tour;

use bench::bench;
use tour::tour;

use std::io::{IsTerminal as _, Write as _};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use integration::sim::{
    EchoServer, INTERNET_ECHO_PORT, INTERNET_HOST, Pod, Sim, SimConfig, call_delta, is_mutating,
    ping, tcp_echo,
};

#[derive(Debug, Parser)]
#[command(about = "ipamd + aws-cni on a simulated VPC (2 nodes), one command")]
struct Args {
    #[command(subcommand)]
    mode: Option<Mode>,
    /// Pods per node (more than 9 puts pods on a secondary ENI of an m5.large).
    #[arg(long, default_value_t = 12)]
    pods_per_node: usize,
    /// Instance type of the nodes.
    #[arg(long, default_value = "m5.large")]
    instance_type: String,
    /// Tear down right after the tour instead of waiting for Ctrl-C.
    #[arg(long)]
    no_hold: bool,
    /// Also run the Kubernetes API simulator (chart CRDs and RBAC, a Node and an aws-node Pod
    /// per instance); ipamd reads its Node through it (max-pods, /v1/eni-configs).
    #[arg(long)]
    kube: bool,
    /// Custom networking (implies --kube): two zones, a secondary VPC block 100.64.0.0/16, one
    /// ENIConfig per zone (its 100.64 subnet, security group `pods`) selected by
    /// topology.kubernetes.io/zone; pods get addresses there, never on the primary ENI.
    #[arg(long)]
    custom_networking: bool,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Print the e2e benchmarks (figures, not assertions).
    Bench {
        /// Simulated EC2 latencies (ms) for the empty-pool ADD figures.
        #[arg(long, value_delimiter = ',', default_value = "0,100,250,500")]
        latencies: Vec<u64>,
        /// ADDs per latency.
        #[arg(long, default_value_t = 6)]
        adds: usize,
        /// Pods per node for the calls-per-pod figures.
        #[arg(long, default_value_t = 20)]
        pods: usize,
        /// Idle window (s) for the calls-per-idle-node-hour figure.
        #[arg(long, default_value_t = 330)]
        idle_seconds: u64,
    },
    /// Fleet scale (issue 12): N nodes against one simulated account; storm, churn,
    /// brown-out, idle; writes report.md and SVG plots (docs/scale.md).
    Fleet {
        /// Nodes.
        #[arg(long, default_value_t = 100)]
        nodes: u32,
        /// Instance type (t3.large fits 30 pods per node and 100 nodes in the /20 subnet).
        #[arg(long, default_value = "t3.large")]
        fleet_type: String,
        /// Pods per node in the scale-out storm (AddNetwork, all at once).
        #[arg(long, default_value_t = 30)]
        pods: usize,
        /// Real aws-cni pods per node after the storm.
        #[arg(long, default_value_t = 1)]
        cni_pods: usize,
        /// Churn duration (s; 0 skips).
        #[arg(long, default_value_t = 180)]
        churn_seconds: u64,
        /// Churn rate (pods created + deleted per second, fleet-wide).
        #[arg(long, default_value_t = 5.0)]
        churn_rate: f64,
        /// Pods per node deleted after the storm to give the churn headroom.
        #[arg(long, default_value_t = 20)]
        shrink_pods: usize,
        /// Cut the account's buckets this many seconds into the storm (brown-out; unset: none).
        #[arg(long)]
        brownout_at: Option<f64>,
        /// Bucket scale during the brown-out.
        #[arg(long, default_value_t = 0.1)]
        brownout_scale: f64,
        /// Brown-out duration (s).
        #[arg(long, default_value_t = 60)]
        brownout_seconds: u64,
        /// Idle window (s; 0 skips).
        #[arg(long, default_value_t = 600)]
        idle_seconds: u64,
        /// The idle window starts once no mutating call was made for this long (s).
        #[arg(long, default_value_t = 180)]
        rest_quiet_seconds: u64,
        /// Time compression of ipamd's hourly leaked-ENI clean-up (the only periodic EC2
        /// caller at rest): its period becomes 3600 / this (1: real time).
        #[arg(long, default_value_t = 12)]
        idle_compression: u32,
        /// Output directory for report.md and the SVGs.
        #[arg(long, default_value = "fleet-report")]
        out: std::path::PathBuf,
    },
    /// Churn replay (issue 41): pod-churn traces (steady, diurnal, rollout, cronjob, storm)
    /// replayed on a fresh fleet per warm-pool policy (default, tuned, adaptive); writes
    /// churn.md and one SVG per trace (docs/performance.md, "Churn replay").
    Churn {
        /// Nodes.
        #[arg(long, default_value_t = 20)]
        nodes: u32,
        /// Trace length (s).
        #[arg(long, default_value_t = 90.0)]
        seconds: f64,
        /// Seed of the trace generator.
        #[arg(long, default_value_t = 41)]
        seed: u64,
        /// Traces, comma-separated (steady,diurnal,rollout,cronjob,storm).
        #[arg(long, default_value = "steady,diurnal,rollout,cronjob,storm")]
        traces: String,
        /// Policies, comma-separated (default,tuned,adaptive).
        #[arg(long, default_value = "default,tuned,adaptive")]
        policies: String,
        /// EC2 latency per request (ms).
        #[arg(long, default_value_t = 400)]
        latency_ms: u64,
        /// EC2 attach delay (ms).
        #[arg(long, default_value_t = 2000)]
        attach_delay_ms: u64,
        /// Output directory.
        #[arg(long, default_value = "churn-report")]
        out: std::path::PathBuf,
    },
}

/// Set on SIGINT/SIGTERM; every wait gives up and the run is torn down.
static STOP: AtomicBool = AtomicBool::new(false);

fn stopped() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Wait for SIGINT/SIGTERM on a dedicated thread with its own small runtime (handlers, not a
/// blocked signal mask: children such as ipamd must inherit an empty mask to see SIGTERM).
fn install_signal_thread(flag: Arc<AtomicBool>) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("signal runtime: {e}"))?;
    let (mut int, mut term) = rt
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        })
        .map_err(|e| format!("signal handlers: {e}"))?;
    std::thread::spawn(move || {
        let sig = rt.block_on(async {
            tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            }
        });
        eprintln!("\n{sig}: tearing everything down ...");
        STOP.store(true, Ordering::SeqCst);
        flag.store(true, Ordering::SeqCst);
    });
    Ok(())
}

/// Runs a slow step with a live elapsed-time line (on a terminal) and a result line.
fn step<T>(label: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    if stopped() {
        return Err("interrupted".into());
    }
    run_step(label, f)
}

/// [`step`] that also runs after Ctrl-C (teardown).
fn run_step<T>(label: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let t0 = Instant::now();
    let tty = std::io::stdout().is_terminal();
    let done = Arc::new(AtomicBool::new(false));
    let ticker = {
        let done = done.clone();
        let label = label.to_owned();
        std::thread::spawn(move || {
            let spin = ['|', '/', '-', '\\'];
            let mut k = 0usize;
            while !done.load(Ordering::SeqCst) {
                if tty {
                    print!(
                        "\r  {} {label} ({:.1}s)",
                        spin[k % 4],
                        t0.elapsed().as_secs_f64()
                    );
                    let _ = std::io::stdout().flush();
                } else if k > 0 && k.is_multiple_of(50) {
                    println!(
                        "  ... {label}: still working ({:.0}s)",
                        t0.elapsed().as_secs_f64()
                    );
                }
                k += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    if !tty {
        println!("  - {label} ...");
    }
    let r = f();
    done.store(true, Ordering::SeqCst);
    let _ = ticker.join();
    let secs = t0.elapsed().as_secs_f64();
    match &r {
        Ok(_) => println!("\r  ✓ {label} ({secs:.1}s)          "),
        Err(e) => println!("\r  ✗ {label} ({secs:.1}s): {e}"),
    }
    r
}

fn main() -> ExitCode {
    let args = Args::parse();
    if !integration::can_run_kernel_tests() {
        eprintln!(
            "demo: run as root (it creates network namespaces; nothing in the root one changes)"
        );
        return ExitCode::from(2);
    }
    let cancel = Arc::new(AtomicBool::new(false));
    if let Err(e) = install_signal_thread(cancel.clone()) {
        eprintln!("demo: {e}");
        return ExitCode::FAILURE;
    }
    let result = match args.mode {
        None => tour(&args, cancel),
        Some(Mode::Bench {
            ref latencies,
            adds,
            pods,
            idle_seconds,
        }) => bench(&args, latencies, adds, pods, idle_seconds, cancel),
        Some(Mode::Fleet {
            nodes,
            ref fleet_type,
            pods,
            cni_pods,
            churn_seconds,
            churn_rate,
            shrink_pods,
            brownout_at,
            brownout_scale,
            brownout_seconds,
            idle_seconds,
            rest_quiet_seconds,
            idle_compression,
            ref out,
        }) => {
            let sc = integration::fleet::run::Scenarios {
                fleet: integration::fleet::FleetConfig {
                    nodes,
                    instance_type: fleet_type.clone(),
                    keep_logs: Some(out.join("logs")),
                    ..integration::fleet::FleetConfig::default()
                },
                storm_pods: pods,
                cni_pods,
                churn: Duration::from_secs(churn_seconds),
                churn_rate,
                shrink_pods,
                brownout_at: brownout_at.map(Duration::from_secs_f64),
                brownout_scale,
                brownout: Duration::from_secs(brownout_seconds),
                idle: Duration::from_secs(idle_seconds),
                rest_quiet: Duration::from_secs(rest_quiet_seconds),
                idle_compression,
                out_dir: Some(out.clone()),
                ..integration::fleet::run::Scenarios::default()
            };
            integration::fleet::run::run(&sc).and_then(|o| {
                println!("report: {}", out.join("report.md").display());
                if o.violations.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "{} invariant violations (see the report), first: {:?}",
                        o.violations.len(),
                        o.violations.first()
                    ))
                }
            })
        }
        Some(Mode::Churn {
            nodes,
            seconds,
            seed,
            ref traces,
            ref policies,
            latency_ms,
            attach_delay_ms,
            ref out,
        }) => churn(
            nodes,
            seconds,
            seed,
            traces,
            policies,
            latency_ms,
            attach_delay_ms,
            out,
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if stopped() => {
            eprintln!("demo: stopped ({e}); everything was removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn start_sim(instance_type: &str, cancel: Arc<AtomicBool>) -> Result<Sim, String> {
    start_sim_with(
        SimConfig {
            nodes: 2,
            instance_type: instance_type.to_owned(),
            ..SimConfig::default()
        },
        "simulated VPC up (EC2 API, IMDS, router, internet, 2 nodes)",
        cancel,
    )
}

fn start_sim_with(config: SimConfig, label: &str, cancel: Arc<AtomicBool>) -> Result<Sim, String> {
    let mut sim = step(label, || Sim::start(&config).map_err(|e| e.to_string()))?;
    sim.set_cancel(cancel);
    Ok(sim)
}

/// The tour's world: the default, or two zones with the API simulator (and ENIConfigs).
fn start_tour_sim(args: &Args, cancel: Arc<AtomicBool>) -> Result<Sim, String> {
    if !(args.kube || args.custom_networking) {
        return start_sim(&args.instance_type, cancel);
    }
    let sim = start_sim_with(
        SimConfig {
            nodes: 2,
            instance_type: args.instance_type.clone(),
            layout: vpcsim::Layout {
                azs: 2,
                subnets_per_az: 1,
                secondary_cidr: Some("100.64.0.0/16".parse().expect("CIDR")),
            },
            kube: Some(integration::sim::KubeOptions::default()),
            ..SimConfig::default()
        },
        "simulated VPC (2 zones, secondary block 100.64.0.0/16) and Kubernetes API up",
        cancel,
    )?;
    if args.custom_networking {
        step(
            "one ENIConfig per zone (100.64 subnet, security group pods)",
            || {
                let pods_sg = sim.world.read(|s| {
                    s.security_groups
                        .values()
                        .find(|g| g.name == "pods")
                        .map(|g| g.id.clone())
                });
                for i in 0..sim.nodes.len() {
                    let zone = sim.node_zone(i);
                    let subnet = sim
                        .subnets_in_zone(&zone)
                        .into_iter()
                        .find(|(_, c)| c.to_string().starts_with("100.64."))
                        .ok_or_else(|| format!("no 100.64 subnet in {zone}"))?;
                    sim.apply_eniconfig(&zone, &subnet.0, pods_sg.as_slice())?;
                }
                Ok(())
            },
        )?;
    }
    Ok(sim)
}

fn start_ipamds(sim: &mut Sim, env: &[(&str, &str)]) -> Result<(), String> {
    for i in 0..sim.nodes.len() {
        let label = format!(
            "ipamd on node {i} ({}, {}): node init, first warm ENI",
            sim.nodes[i].instance_id, sim.nodes[i].primary_ip
        );
        step(&label, || {
            sim.start_ipamd(i, env, Duration::from_secs(90))
                .map_err(|e| e.to_string())
        })?;
    }
    Ok(())
}

fn add_pods(sim: &mut Sim, per_node: usize) -> Result<(), String> {
    for node in 0..sim.nodes.len() {
        let label = format!("{per_node} pods on node {node} via aws-cni ADD");
        step(&label, || {
            for k in 0..per_node {
                if stopped() {
                    return Err("interrupted".into());
                }
                let name = format!("pod-{node}-{k}");
                sim.add_pod(node, &name)
                    .map_err(|e| format!("{name}: {e}"))?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

fn eni_label(sim: &Sim, p: &Pod) -> String {
    let eni = sim.eni_of(p.node, p.ip).unwrap_or_default();
    let dev = sim
        .ec2_enis(p.node)
        .get(&eni)
        .map_or(String::from("?"), |(d, _)| format!("eth{d}"));
    format!("node{} {eni} {dev}", p.node)
}

fn mark(r: &Result<(), String>) -> &'static str {
    if r.is_ok() { "ok" } else { "FAIL" }
}

/// `demo churn`: the churn replay of issue 41.
#[allow(clippy::too_many_arguments)]
fn churn(
    nodes: u32,
    seconds: f64,
    seed: u64,
    traces: &str,
    policies: &str,
    latency_ms: u64,
    attach_delay_ms: u64,
    out: &std::path::Path,
) -> Result<(), String> {
    use integration::fleet::churn::TraceKind;
    use integration::fleet::replay::{self, Policy, ReplayConfig};
    let traces = traces
        .split(',')
        .map(|t| TraceKind::parse(t.trim()).ok_or_else(|| format!("unknown trace {t}")))
        .collect::<Result<Vec<_>, _>>()?;
    let policies = policies
        .split(',')
        .map(|p| Policy::parse(p.trim()).ok_or_else(|| format!("unknown policy {p}")))
        .collect::<Result<Vec<_>, _>>()?;
    let cfg = ReplayConfig {
        nodes,
        length: seconds,
        seed,
        traces,
        policies,
        latency_ms,
        attach_delay_ms,
        out_dir: Some(out.to_path_buf()),
        ..ReplayConfig::default()
    };
    let rows = replay::replay_all(&cfg)?;
    println!("{}", replay::markdown(&cfg, &rows));
    println!("report: {}", out.join("churn.md").display());
    let bad: Vec<_> = rows
        .iter()
        .filter(|r| !r.violations.is_empty() || r.gave_up > 0)
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} runs broke an invariant (see the report)",
            bad.len()
        ))
    }
}
