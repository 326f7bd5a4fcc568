//! The fleet driver: N nodes (each a real `ipamd` in its own vpcsim node namespace, with its
//! own IMDS and host networking) against ONE simulated account, pods created through
//! `AddNetwork` on each node's socket (no pod namespaces: the control plane is what is
//! measured) plus a sample of real `aws-cni` pods, and the scenarios of issue 12 (scale-out
//! storm, churn, brown-out, idle) recorded as time series for [`report`]. Owns the ipamd
//! processes it starts (killed by PID on drop, before the [`Sim`] goes); must not touch the
//! root network namespace or edit the harness (`sim`), whose public API it uses.

pub mod churn;
mod recorder;
pub mod replay;
pub mod report;
pub mod run;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipamd_proto::rpc::cni_backend_client::CniBackendClient;
use ipamd_proto::rpc::{AddNetworkRequest, DelNetworkRequest};
use tonic::transport::Channel;
use vpcsim::world::ApiCount;

use crate::sim::{Bins, Sim, SimConfig};
use crate::supervisor::{self, Supervised};
use recorder::Recorder;
use report::Sample;

/// What to bring up.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Nodes.
    pub nodes: u32,
    /// Their instance type (t3.large: 3 ENIs × 12 addresses, 33 pod addresses, fits 30 pods
    /// per node and 100 nodes in the default /20 subnet).
    pub instance_type: String,
    /// Extra ipamd environment (later entries win over the harness's).
    pub ipamd_env: Vec<(String, String)>,
    /// How long a node's ipamd may take to answer after the fleet boots.
    pub boot_timeout: Duration,
    /// Copy every node's ipamd log here (`node<i>.log`) before the run directory goes.
    pub keep_logs: Option<PathBuf>,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            nodes: 100,
            instance_type: "t3.large".into(),
            ipamd_env: Vec::new(),
            boot_timeout: Duration::from_secs(180),
            keep_logs: None,
        }
    }
}

/// A pod created through `AddNetwork`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcPod {
    /// Node index.
    pub node: usize,
    /// Container id (= pod name).
    pub id: String,
    /// Its address.
    pub ip: Ipv4Addr,
}

/// A pod of a wave and its seconds from the wave's start to its address.
type TimedPod = (GrpcPod, f64);

/// Outcome of a wave of pods created at once.
#[derive(Debug, Clone, Default)]
pub struct Wave {
    /// Pods that got an address.
    pub pods: Vec<GrpcPod>,
    /// `AddNetwork` attempts answered `Success=false` or with an error status (retried after
    /// 1 s like kubelet, until the wave's deadline).
    pub failed_attempts: u64,
    /// Failed attempts made while the account was throttling someone (the second before).
    pub failed_while_throttled: u64,
    /// Pods that never got an address before the deadline.
    pub gave_up: usize,
    /// Samples (about every 500 ms) from the wave's start.
    pub samples: Vec<Sample>,
    /// Per-action calls during the wave.
    pub calls: BTreeMap<String, ApiCount>,
    /// Seconds until the last pod had its address.
    pub seconds: f64,
    /// Each pod's time from the wave's start to its address (seconds, ascending).
    pub time_to_address: Vec<f64>,
}

/// N nodes running ipamd against one simulated account. Dropping it stops the ipamds (by PID)
/// and then the simulated VPC.
pub struct Fleet {
    procs: Vec<Supervised>,
    clients: Vec<CniBackendClient<Channel>>,
    rt: tokio::runtime::Runtime,
    /// The harness (world, fabric, nodes); its pods are the real `aws-cni` sample.
    pub sim: Sim,
    /// Seconds from spawning the first ipamd until every node answered.
    pub boot_seconds: f64,
    /// Seconds to bring up the simulated VPC (namespaces, IMDS, fabric).
    pub vpc_seconds: f64,
    seq: AtomicU64,
    keep_logs: Option<PathBuf>,
    /// Nodes whose ipamd exited during boot and was started again, with how often.
    pub boot_restarts: BTreeMap<usize, u32>,
}

/// How often a node's ipamd that exits during boot is started again (as kubelet would).
const BOOT_RESTARTS: u32 = 5;

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("nodes", &self.procs.len())
            .finish_non_exhaustive()
    }
}

/// A CNIBackend client on the ipamd socket at `socket` (unix socket, reachable from any
/// namespace: it is a file). Used by the fleet and the ipamd-level end-to-end suites.
pub async fn connect(socket: PathBuf) -> Result<CniBackendClient<Channel>, String> {
    Ok(CniBackendClient::new(crate::unix_channel(socket).await?))
}

fn add_request(id: &str) -> AddNetworkRequest {
    AddNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        container_id: id.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        k8s_pod_name: id.into(),
        k8s_pod_namespace: "fleet".into(),
        k8s_pod_infra_container_id: id.into(),
        netns: format!("/var/run/netns/{id}"),
        ..Default::default()
    }
}

fn del_request(id: &str) -> DelNetworkRequest {
    DelNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        container_id: id.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        k8s_pod_name: id.into(),
        k8s_pod_namespace: "fleet".into(),
        k8s_pod_infra_container_id: id.into(),
        reason: "PodDeleted".into(),
        ..Default::default()
    }
}

impl Fleet {
    /// Bring up the VPC, spawn every node's ipamd at once, wait until all answer, connect.
    pub fn start(config: &FleetConfig) -> Result<Self, String> {
        let t = Instant::now();
        let sim = Sim::start(&SimConfig {
            nodes: config.nodes,
            instance_type: config.instance_type.clone(),
            ..SimConfig::default()
        })
        .map_err(|e| e.to_string())?;
        let vpc_seconds = t.elapsed().as_secs_f64();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        let mut fleet = Self {
            procs: Vec::new(),
            clients: Vec::new(),
            rt,
            sim,
            boot_seconds: 0.0,
            vpc_seconds,
            seq: AtomicU64::new(0),
            keep_logs: config.keep_logs.clone(),
            boot_restarts: BTreeMap::new(),
        };
        let bins = Bins::beside_current_exe().map_err(|e| e.to_string())?;
        // AddNetwork-only pods have no veth or route: ipamd's reclaim of unwired assignments
        // would release them after 300 s, so it is off in the fleet
        let mut extra: Vec<(&str, &str)> = vec![
            ("AWS_VPC_K8S_CNI_LOGLEVEL", "INFO"),
            ("IPAMD_RECLAIM_UNWIRED_SECONDS", "0"),
        ];
        extra.extend(
            config
                .ipamd_env
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        let t = Instant::now();
        for i in 0..fleet.sim.nodes.len() {
            let env = fleet.sim.ipamd_env(i, &extra);
            let child = fleet
                .sim
                .spawn_ipamd_process(i, &bins.ipamd, &env)
                .map_err(|e| e.to_string())?;
            fleet.procs.push(child);
        }
        let deadline = Instant::now() + config.boot_timeout;
        let mut waiting: BTreeSet<usize> = (0..fleet.procs.len()).collect();
        // nodes whose ipamd exited, with when it is started again
        let mut restart_at: BTreeMap<usize, Instant> = BTreeMap::new();
        while !waiting.is_empty() {
            waiting.retain(|&i| !fleet.sim.ipamd_ready(i));
            for &i in &waiting {
                if let Some(&at) = restart_at.get(&i) {
                    if Instant::now() >= at {
                        restart_at.remove(&i);
                        let env = fleet.sim.ipamd_env(i, &extra);
                        fleet.procs[i] = fleet
                            .sim
                            .spawn_ipamd_process(i, &bins.ipamd, &env)
                            .map_err(|e| e.to_string())?;
                    }
                    continue;
                }
                if let Some(c) = fleet.procs.get_mut(i)
                    && let Some(st) = c.exited()
                {
                    // kubelet restarts an aws-node container that exited (e.g. IMDS did not
                    // answer in time while 100 nodes booted on 2 shared cores), with a
                    // back-off (CrashLoopBackOff: 10 s, 20 s, 40 s, ...): so does the fleet, a
                    // few times, and the report counts it
                    let n = fleet.boot_restarts.get(&i).copied().unwrap_or(0);
                    if n >= BOOT_RESTARTS {
                        return Err(format!(
                            "ipamd on node {i} exited ({st}), restarted {n} times:\n{}",
                            fleet.sim.ipamd_log_tail(i, 30)
                        ));
                    }
                    let delay = Duration::from_secs(10 << n.min(2));
                    eprintln!(
                        "ipamd on node {i} exited at boot ({st}); restarting it in {delay:?} like kubelet:\n{}",
                        fleet.sim.ipamd_log_tail(i, 3)
                    );
                    fleet.boot_restarts.insert(i, n + 1);
                    restart_at.insert(i, Instant::now() + delay);
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} nodes not ready after {:?} (first: node {})",
                    waiting.len(),
                    config.boot_timeout,
                    waiting.first().copied().unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        fleet.boot_seconds = t.elapsed().as_secs_f64();
        let sockets: Vec<PathBuf> = fleet.sim.nodes.iter().map(|n| n.socket()).collect();
        fleet.clients = fleet
            .rt
            .block_on(async { futures_join(sockets.into_iter().map(connect)).await })
            .into_iter()
            .collect::<Result<_, _>>()?;
        Ok(fleet)
    }

    /// Number of nodes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// True with no nodes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    fn next_id(&self, node: usize) -> String {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        format!("fleet-n{node}-{n}")
    }

    /// `per_node` pods on every node at once (plus `extra` pods on given nodes), each
    /// `AddNetwork` retried every second on failure until `deadline`; while it runs,
    /// `during(elapsed)` is called every 500 ms (e.g. to start a brown-out).
    pub fn wave(
        &self,
        per_node: &[usize],
        deadline: Duration,
        mut during: impl FnMut(Duration),
    ) -> Wave {
        let ready = Arc::new(AtomicUsize::new(0));
        let throttling = Arc::new(AtomicU64::new(0));
        let before = self.sim.world.api_counts();
        let recorder = Recorder::start(self.sim.world.clone(), ready.clone(), throttling.clone());
        let t0 = Instant::now();
        let failed = Arc::new(AtomicU64::new(0));
        let failed_throttled = Arc::new(AtomicU64::new(0));
        let results: Arc<Mutex<Vec<Option<TimedPod>>>> = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (node, &n) in per_node.iter().enumerate() {
            for _ in 0..n {
                let id = self.next_id(node);
                let mut client = self.clients[node].clone();
                let (ready, failed, failed_throttled, results, throttling) = (
                    ready.clone(),
                    failed.clone(),
                    failed_throttled.clone(),
                    results.clone(),
                    throttling.clone(),
                );
                tasks.push(self.rt.spawn(async move {
                    let got = loop {
                        let r = client.add_network(add_request(&id)).await;
                        let ip = r.ok().and_then(|r| {
                            let r = r.into_inner();
                            r.success
                                .then(|| r.ip_allocation_metadata.first()?.i_pv4_addr.parse().ok())
                                .flatten()
                        });
                        if let Some(ip) = ip {
                            ready.fetch_add(1, Ordering::SeqCst);
                            break Some((GrpcPod { node, id, ip }, t0.elapsed().as_secs_f64()));
                        }
                        failed.fetch_add(1, Ordering::SeqCst);
                        let now_ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX);
                        let last = throttling.load(Ordering::SeqCst);
                        if last > 0 && now_ms.saturating_sub(last) < 1_500 {
                            failed_throttled.fetch_add(1, Ordering::SeqCst);
                        }
                        if t0.elapsed() > deadline {
                            break None;
                        }
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    };
                    results
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(got);
                }));
            }
        }
        let total = tasks.len();
        while !tasks.iter().all(tokio::task::JoinHandle::is_finished) {
            during(t0.elapsed());
            std::thread::sleep(Duration::from_millis(500));
        }
        let seconds = t0.elapsed().as_secs_f64();
        // one more sample after the last pod
        std::thread::sleep(Duration::from_millis(600));
        let samples = recorder.finish();
        let results = std::mem::take(
            &mut *results
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let (pods, mut time_to_address): (Vec<GrpcPod>, Vec<f64>) =
            results.into_iter().flatten().unzip();
        time_to_address.sort_by(f64::total_cmp);
        Wave {
            time_to_address,
            gave_up: total - pods.len(),
            pods,
            failed_attempts: failed.load(Ordering::SeqCst),
            failed_while_throttled: failed_throttled.load(Ordering::SeqCst),
            samples,
            calls: report::delta(&before, &self.sim.world.api_counts()),
            seconds,
        }
    }

    /// `DelNetwork` for `pods` (all at once); returns the failures.
    pub fn delete(&self, pods: &[GrpcPod]) -> Vec<String> {
        let tasks: Vec<_> = pods
            .iter()
            .map(|p| {
                let mut c = self.clients[p.node].clone();
                let id = p.id.clone();
                self.rt.spawn(async move {
                    match c.del_network(del_request(&id)).await {
                        Ok(r) if r.get_ref().success => None,
                        Ok(_) => Some(format!("{id}: Success=false")),
                        Err(e) => Some(format!("{id}: {e}")),
                    }
                })
            })
            .collect();
        self.rt.block_on(async {
            let mut out = Vec::new();
            for t in tasks {
                if let Ok(Some(e)) = t.await {
                    out.push(e);
                }
            }
            out
        })
    }

    /// Churn: for `duration`, every `1 / rate` s delete the oldest of `pods` and create one
    /// on its node. Returns the pods alive at the end and the wave-like
    /// record (failed attempts are ADDs that failed, not retried).
    pub fn churn(
        &self,
        mut pods: Vec<GrpcPod>,
        rate: f64,
        duration: Duration,
    ) -> (Vec<GrpcPod>, Wave) {
        let ready = Arc::new(AtomicUsize::new(0));
        let throttling = Arc::new(AtomicU64::new(0));
        let before = self.sim.world.api_counts();
        let recorder = Recorder::start(self.sim.world.clone(), ready.clone(), throttling);
        let t0 = Instant::now();
        let period = Duration::from_secs_f64(1.0 / rate.max(0.01));
        let mut failed = 0;
        let mut k = 0usize;
        while t0.elapsed() < duration {
            // a pod replaced on its node (a Deployment's rollout), round robin on an empty fleet
            let node = if pods.is_empty() {
                k % self.len()
            } else {
                let old = pods.remove(0);
                failed += self.delete(std::slice::from_ref(&old)).len() as u64;
                old.node
            };
            k += 1;
            let id = self.next_id(node);
            let mut c = self.clients[node].clone();
            let r = self.rt.block_on(async move {
                c.add_network(add_request(&id))
                    .await
                    .map(|r| (id, r.into_inner()))
            });
            match r {
                Ok((id, r)) if r.success => {
                    if let Some(ip) = r
                        .ip_allocation_metadata
                        .first()
                        .and_then(|m| m.i_pv4_addr.parse().ok())
                    {
                        ready.fetch_add(1, Ordering::SeqCst);
                        pods.push(GrpcPod { node, id, ip });
                    }
                }
                _ => failed += 1,
            }
            let next = period * u32::try_from(k).unwrap_or(u32::MAX);
            if let Some(wait) = next.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        let samples = recorder.finish();
        let wave = Wave {
            pods: Vec::new(),
            failed_attempts: failed,
            failed_while_throttled: 0,
            gave_up: 0,
            samples,
            calls: report::delta(&before, &self.sim.world.api_counts()),
            seconds,
            time_to_address: Vec::new(),
        };
        (pods, wave)
    }

    /// Every address unique across the fleet, owned in EC2 by an ENI of the pod's node.
    pub fn check_pods(&self, pods: &[GrpcPod]) -> Result<(), String> {
        let mut seen = BTreeSet::new();
        for p in pods {
            if !seen.insert(p.ip) {
                return Err(format!("address {} handed out twice", p.ip));
            }
        }
        for p in self.sim.pods() {
            if !seen.insert(p.ip) {
                return Err(format!("address {} handed out twice (aws-cni pod)", p.ip));
            }
        }
        let view = vpcsim::World::fabric_view(&self.sim.world, self.sim.world.now());
        for p in pods {
            let inst = view
                .instance(&self.sim.nodes[p.node].instance_id)
                .ok_or_else(|| format!("node {} not in the view", p.node))?;
            if !inst.enis.iter().any(|e| e.owns_ipv4(p.ip)) {
                return Err(format!(
                    "{} ({}) is on no ENI of node {} in EC2",
                    p.id, p.ip, p.node
                ));
            }
        }
        Ok(())
    }

    /// ENIs in the account that are not attached to any instance (leaks).
    #[must_use]
    pub fn unattached_enis(&self) -> Vec<String> {
        self.sim.world.read(|s| {
            s.enis
                .values()
                .filter(|e| e.attachment.is_none())
                .map(|e| e.id.clone())
                .collect()
        })
    }

    /// Each node's ipamd memory in KiB, `key` of `/proc/<pid>/status` (`VmRSS:`: resident
    /// set size; `RssAnon:`: its anonymous part) of the process this fleet spawned (`ip netns
    /// exec` execs ipamd in the same pid, which the status's `Name` confirms); None for a node
    /// whose process is gone or not ipamd.
    #[must_use]
    pub fn ipamd_memory_kib(&self, key: &str) -> Vec<Option<u64>> {
        self.procs
            .iter()
            .map(|p| {
                let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid())).ok()?;
                report::parse_status_kib(&status, "ipamd", key)
            })
            .collect()
    }

    /// Each node's ipamd major page faults since its start ([`report::parse_stat_major_faults`]
    /// of `/proc/<pid>/stat`); None for a node whose process is gone or not ipamd.
    #[must_use]
    pub fn ipamd_major_faults(&self) -> Vec<Option<u64>> {
        self.procs
            .iter()
            .map(|p| {
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.pid())).ok()?;
                report::parse_stat_major_faults(&stat, "ipamd")
            })
            .collect()
    }

    /// ENIs per node in EC2.
    #[must_use]
    pub fn enis_per_node(&self) -> Vec<usize> {
        (0..self.len())
            .map(|i| self.sim.ec2_enis(i).len())
            .collect()
    }
}

async fn futures_join<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut out = Vec::new();
    for f in futs {
        out.push(f.await);
    }
    out
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // SIGTERM all first (they shut down in parallel), then reap, SIGKILL stragglers
        supervisor::stop_all(&mut self.procs, Duration::from_secs(15));
        self.procs.clear();
        if let Some(dir) = &self.keep_logs {
            let _ = std::fs::create_dir_all(dir);
            for (i, n) in self.sim.nodes.iter().enumerate() {
                let _ = std::fs::copy(n.ipamd_log(), dir.join(format!("node{i}.log")));
            }
        }
    }
}
