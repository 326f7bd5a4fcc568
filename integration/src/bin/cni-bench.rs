//! `cni-bench`: the benchmark's CNI client. Like `cnitool` (libcni), it executes a plugin with
//! the CNI environment and the network configuration on stdin, here `warmup + n` times in
//! sequence: ADD (timed), then DEL with prevResult (timed), each pod in its own netns
//! `<prefix>-<i>` that the caller created beforehand (and deletes). Prints one JSON line with
//! per-operation wall times in milliseconds; with `--rss`, the plugin's peak RSS measured by
//! `busybox time` instead (timings of that pass include `time` and are not used). Run it
//! inside the node netns.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Plugin executable.
    #[arg(long)]
    plugin: PathBuf,
    /// Network configuration file (a single plugin's config).
    #[arg(long)]
    conf: PathBuf,
    /// `CNI_PATH` for the plugin (where it finds IPAM plugins).
    #[arg(long, default_value = "/usr/lib/cni")]
    cni_path: String,
    /// Pods to run.
    #[arg(long, default_value_t = 50)]
    n: usize,
    /// Untimed warm-up pods.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Pod netns name prefix (must be unique to this run).
    #[arg(long)]
    netns_prefix: String,
    /// Label in the output.
    #[arg(long)]
    label: String,
    /// Run every plugin call under `busybox time -v` and report the largest "Maximum resident
    /// set size" of the plugin calls instead of timings. BusyBox (1.35) prints `ru_maxrss`
    /// multiplied by 4 (it treats the KiB value as pages); the value reported here is divided
    /// back. `time` forks from a ~1 MiB static process, so the floor is well below a plugin's.
    #[arg(long)]
    rss: bool,
}

/// One plugin call: (wall ms, stdout, busybox-reported max RSS in KiB when `--rss`).
fn exec(
    args: &Args,
    command: &str,
    id: &str,
    netns: &str,
    stdin: &[u8],
) -> (f64, String, Option<u64>) {
    let start = Instant::now();
    let mut cmd = if args.rss {
        let mut c = Command::new("busybox");
        c.args(["time", "-v"]).arg(&args.plugin);
        c
    } else {
        Command::new(&args.plugin)
    };
    let mut child = cmd
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &args.cni_path)
        .env("CNI_ARGS", "IgnoreUnknown=1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn plugin");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait plugin");
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} {command} failed: {stdout}",
        args.label
    );
    let rss = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|v| v / 4);
    (ms, stdout, rss)
}

fn main() {
    let args = Args::parse();
    let conf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&args.conf).expect("read conf")).expect("conf json");
    let mut add = Vec::new();
    let mut del = Vec::new();
    let mut rss_kib = 0_u64;
    for i in 0..args.warmup + args.n {
        let name = format!("{}-{i}", args.netns_prefix);
        let netns = format!("/var/run/netns/{name}");
        let id = format!("bench{i}");
        let (t_add, result, rss_add) = exec(&args, "ADD", &id, &netns, conf.to_string().as_bytes());
        let mut with_prev = conf.clone();
        with_prev["prevResult"] = serde_json::from_str(&result).expect("result json");
        let (t_del, _, rss_del) = exec(&args, "DEL", &id, &netns, with_prev.to_string().as_bytes());
        rss_kib = rss_kib.max(rss_add.unwrap_or(0)).max(rss_del.unwrap_or(0));
        if i >= args.warmup {
            add.push(t_add);
            del.push(t_del);
        }
    }
    // Without `--rss` this is RUSAGE_CHILDREN's ru_maxrss, which for posix_spawn'ed children
    // also counts this process's own RSS at exec time (the kernel records the pre-exec mm).
    let children = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage")
        .max_rss();
    println!(
        "{}",
        serde_json::json!({
            "label": args.label,
            "add_ms": add,
            "del_ms": del,
            "children_maxrss_kib": children,
            "plugin_maxrss_kib": if args.rss { rss_kib } else { 0 },
        })
    );
}
