//! Benchmark (prints figures, asserts nothing): spawns the given `ipamd` binary with the
//! in-memory provider and its checkpoint on tmpfs, then measures over the real unix socket
//! 1. sequential AddNetwork+DelNetwork round trips (p50/p99),
//! 2. throughput with concurrent clients,
//! 3. resident memory (VmRSS, its anonymous and file-backed parts, the peak VmHWM) idle, with 250
//!    pods on the fresh daemon, and with 250 assignments after the load of 1 and 2.
//!
//! Usage: `[IPAMD_BENCH_DIR=/dir] [IPAMD_BENCH_TUNABLES=...] [IPAMD_BENCH_MAPPINGS=1] [IPAMD_BENCH_RELEASE=false] ipamd_bench <path-to-ipamd> [rounds]` (see
//! integration/bench/ipamd-bench.sh). The checkpoint goes to IPAMD_BENCH_DIR (default /dev/shm).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use ipamd_proto::rpc::cni_backend_client::CniBackendClient;
use ipamd_proto::rpc::{AddNetworkRequest, DelNetworkRequest};
use tonic::transport::{Channel, Endpoint};

async fn client(socket: PathBuf) -> CniBackendClient<Channel> {
    let ch = Endpoint::try_from("http://[::]:50051")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
        .expect("connect");
    CniBackendClient::new(ch)
}

fn add(c: &str) -> AddNetworkRequest {
    AddNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        container_id: c.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        k8s_pod_name: c.into(),
        k8s_pod_namespace: "bench".into(),
        ..Default::default()
    }
}

fn del(c: &str) -> DelNetworkRequest {
    DelNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        container_id: c.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        reason: "PodDeleted".into(),
        ..Default::default()
    }
}

/// One `/proc/<pid>/status` reading: resident now, its anonymous (heap, stacks, relocated data)
/// and file-backed (the binary's code pages) parts, and the peak (`VmHWM`).
struct Memory {
    rss: u64,
    anon: u64,
    file: u64,
    peak: u64,
}

fn memory(pid: u32) -> Memory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    Memory {
        rss: field("VmRSS:"),
        anon: field("RssAnon:"),
        file: field("RssFile:"),
        peak: field("VmHWM:"),
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |k: u64| k as f64 / 1024.0;
        write!(
            f,
            "{:.1} MiB (anon {:.1}, file {:.1}; peak {:.1} MiB)",
            mib(self.rss),
            mib(self.anon),
            mib(self.file),
            mib(self.peak)
        )
    }
}

/// Where the resident pages are, per mapping (`/proc/<pid>/smaps`), largest first: printed when
/// `IPAMD_BENCH_MAPPINGS=1`, to tell the binary's code from its data, libc and the heap.
fn mappings(pid: u32) -> String {
    if std::env::var_os("IPAMD_BENCH_MAPPINGS").is_none() {
        return String::new();
    }
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut rows: Vec<(u64, String)> = Vec::new();
    let mut name = String::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: range, perms, offset, dev, inode, path.
            let perms = words.next().unwrap_or("");
            let path = words.nth(3).unwrap_or("[anon]");
            name = format!("{perms} {path}");
        } else if first == "Rss:" {
            let kib: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if kib > 0 {
                rows.push((kib, name.clone()));
            }
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    rows.iter()
        .take(12)
        .map(|(kib, name)| format!("\n    {kib:>6} KiB  {name}"))
        .collect()
}

/// Nearest-rank percentile; `pct` in whole percent.
fn pct(sorted: &[Duration], pct: usize) -> Duration {
    let n = sorted.len();
    let rank = (pct * n).div_ceil(100).max(1);
    sorted[(rank - 1).min(n - 1)]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let ipamd = args
        .get(1)
        .expect("usage: ipamd_bench <ipamd binary> [rounds]");
    let rounds: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(2000);
    // Where the checkpoint lives: real nodes keep it on tmpfs (/var/run); override to measure disk.
    let base = std::env::var("IPAMD_BENCH_DIR").unwrap_or_else(|_| {
        if Path::new("/dev/shm").is_dir() {
            "/dev/shm".into()
        } else {
            "/tmp".into()
        }
    });
    let base = base.as_str();
    // ipamd's own default (give start-up's code pages back); false for a side-by-side reading
    let release = std::env::var("IPAMD_BENCH_RELEASE").map_or(true, |v| v != "false");
    let dir = tempfile::Builder::new()
        .prefix("ipamd-bench-")
        .tempdir_in(base)
        .expect("tempdir");
    let socket = dir.path().join("ipamd.sock");
    let mut child = Command::new(ipamd)
        .env_clear()
        .env("ENABLE_IPv4", "true")
        .env("IPAMD_ENI_PROVIDER", "memory")
        .env(
            "IPAMD_MEMORY_PROVIDER",
            "subnet=198.18.0.0/22,max_enis=10,ipv4_per_eni=50",
        )
        .env(
            "AWS_VPC_K8S_CNI_BACKING_STORE",
            dir.path().join("ipam.json"),
        )
        .env("IPAMD_SOCKET_PATH", &socket)
        .env("AWS_VPC_K8S_CNI_LOG_FILE", dir.path().join("ipamd.log"))
        .env("AWS_VPC_K8S_CNI_LOGLEVEL", "INFO")
        .env("DISABLE_INTROSPECTION", "true")
        .env("DISABLE_METRICS", "true")
        .env("WARM_IP_TARGET", "20")
        .env("IP_COOLDOWN_PERIOD", "0")
        // The allocator setting the image starts ipamd with (charts/aws-vpc-cni/files/
        // aws-node.sh: one malloc arena, no per-thread cache); IPAMD_BENCH_TUNABLES replaces
        // it ("" = glibc's default), for experiments.
        .env(
            "GLIBC_TUNABLES",
            std::env::var("IPAMD_BENCH_TUNABLES")
                .unwrap_or_else(|_| "glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0".into()),
        )
        .env("IPAMD_RELEASE_CODE_PAGES", release.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ipamd");
    let deadline = Instant::now() + Duration::from_secs(15);
    while tokio::net::UnixStream::connect(&socket).await.is_err() {
        assert!(Instant::now() < deadline, "ipamd did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Idle means start-up is over: ipamd says so when it gives start-up's code pages back
    // (ipamd::residency; with IPAMD_BENCH_RELEASE=false ipamd keeps them, and the reading is
    // taken at the same point without).
    let log = dir.path().join("ipamd.log");
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("start-up over")
    {
        if !release || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = child.id();
    println!("ipamd idle RSS: {}{}", memory(pid), mappings(pid));

    // 1. A node's working set: 250 pods on a fresh daemon (no load before), then freed again.
    let mut c = client(socket.clone()).await;
    for i in 0..250 {
        c.add_network(add(&format!("pod-{i}"))).await.expect("add");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!(
        "ipamd RSS with 250 pods (fresh): {}{}",
        memory(pid),
        mappings(pid)
    );
    for i in 0..250 {
        c.del_network(del(&format!("pod-{i}"))).await.expect("del");
    }

    // 2. Sequential round trips.
    let mut lat = Vec::with_capacity(rounds);
    let started = Instant::now();
    for i in 0..rounds {
        let id = format!("seq-{i}");
        let t = Instant::now();
        c.add_network(add(&id)).await.expect("add");
        c.del_network(del(&id)).await.expect("del");
        lat.push(t.elapsed());
    }
    let total = started.elapsed();
    lat.sort();
    println!(
        "AddNetwork+DelNetwork round trip ({rounds} sequential, checkpoint fsync on {base}): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {:.0} round trips/s",
        pct(&lat, 50).as_secs_f64() * 1e3,
        pct(&lat, 99).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
        rounds as f64 / total.as_secs_f64()
    );

    // 3. Concurrent throughput.
    let clients = 16;
    let per = rounds / clients;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..clients {
        let socket = socket.clone();
        tasks.spawn(async move {
            let mut c = client(socket).await;
            for i in 0..per {
                let id = format!("par-{w}-{i}");
                c.add_network(add(&id)).await.expect("add");
                c.del_network(del(&id)).await.expect("del");
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let el = started.elapsed();
    println!(
        "throughput ({clients} concurrent clients): {:.0} AddNetwork+DelNetwork pairs/s ({} pairs in {:.2} s)",
        (clients * per) as f64 / el.as_secs_f64(),
        clients * per,
        el.as_secs_f64()
    );

    // 4. Memory with 250 assignments after the load above.
    for i in 0..250 {
        c.add_network(add(&format!("held-{i}"))).await.expect("add");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!(
        "ipamd RSS with 250 assignments after the load: {} (target <= 8 MiB; upstream 40-64 MiB){}",
        memory(pid),
        mappings(pid)
    );

    // SIGTERM, as the kubelet stops it: ipamd shuts down cleanly (and a profiler wrapping it,
    // scripts/code-order.sh, writes its data on the way out).
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
}
