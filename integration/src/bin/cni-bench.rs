//! `cni-bench`: the benchmark's CNI client. Like `cnitool` (libcni), it executes a plugin with
//! the CNI environment and the network configuration on stdin, here `warmup + n` times in
//! sequence: ADD (timed), then DEL with prevResult (timed), each pod in its own netns
//! `<prefix>-<i>` that the caller created beforehand (and deletes). It starts no other
//! process, so the peak RSS of its children is the plugin's (including processes the plugin
//! ran, e.g. host-local). Prints one JSON line with per-operation wall times in milliseconds.
//! Run it inside the node netns.

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
}

fn exec(args: &Args, command: &str, id: &str, netns: &str, stdin: &[u8]) -> (f64, String) {
    let start = Instant::now();
    let mut child = Command::new(&args.plugin)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &args.cni_path)
        .env("CNI_ARGS", "IgnoreUnknown=1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
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
    (ms, stdout)
}

fn main() {
    let args = Args::parse();
    let conf: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&args.conf).expect("read conf")).expect("conf json");
    let mut add = Vec::new();
    let mut del = Vec::new();
    for i in 0..args.warmup + args.n {
        let name = format!("{}-{i}", args.netns_prefix);
        let netns = format!("/var/run/netns/{name}");
        let id = format!("bench{i}");
        let (t_add, result) = exec(&args, "ADD", &id, &netns, conf.to_string().as_bytes());
        let mut with_prev = conf.clone();
        with_prev["prevResult"] = serde_json::from_str(&result).expect("result json");
        let (t_del, _) = exec(&args, "DEL", &id, &netns, with_prev.to_string().as_bytes());
        if i >= args.warmup {
            add.push(t_add);
            del.push(t_del);
        }
    }
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    println!(
        "{}",
        serde_json::json!({
            "label": args.label,
            "add_ms": add,
            "del_ms": del,
            // ru_maxrss is in KiB on Linux.
            "plugin_maxrss_kib": usage.max_rss(),
        })
    );
}
