//! Benchmark (prints figures, asserts nothing): spawns the given `ipamd` binary with the
//! in-memory provider and its checkpoint on tmpfs, then measures over the real unix socket
//! 1. sequential AddNetwork+DelNetwork round trips (p50/p99),
//! 2. throughput with concurrent clients,
//! 3. resident memory (VmRSS) with 250 assignments.
//!
//! Usage: `[IPAMD_BENCH_DIR=/dir] ipamd_bench <path-to-ipamd> [rounds]` (see
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

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
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
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ipamd");
    let deadline = Instant::now() + Duration::from_secs(15);
    while tokio::net::UnixStream::connect(&socket).await.is_err() {
        assert!(Instant::now() < deadline, "ipamd did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = child.id();
    println!("ipamd idle RSS: {:.1} MiB", rss_kib(pid) as f64 / 1024.0);

    // 1. Sequential round trips.
    let mut c = client(socket.clone()).await;
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

    // 2. Concurrent throughput.
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

    // 3. Memory with 250 assignments.
    for i in 0..250 {
        c.add_network(add(&format!("held-{i}"))).await.expect("add");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss = rss_kib(pid);
    println!(
        "ipamd RSS with 250 assignments: {:.1} MiB (target <= 16 MiB; upstream 40-64 MiB)",
        rss as f64 / 1024.0
    );

    let _ = child.kill();
    let _ = child.wait();
}
