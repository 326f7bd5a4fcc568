//! The kubelet stand-in of one node: runs [`PodPlan`]s through the node's CRI as kubelet's pod
//! workers do — volumes made, `RunPodSandbox` (retried while the runtime's network is not
//! ready or the CNI ADD fails), init containers run to completion in order, then the
//! containers; exec and TCP probes on their periods (readiness gates `ready`, liveness failures
//! restart the container); exited containers restarted with kubelet's back-off (immediately,
//! then 10 s doubling to 5 min); deletion stops the containers with the grace period, then
//! stops and removes the sandbox. Must not: reach anything but its node's CRI socket and the
//! node's directories.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::containerd::{NodeRuntime, RuntimeError, cri as cri_err};
use super::pod::{ContainerPlan, CreateKind, PodPlan, ProbeAction, ProbePlan};

/// The state of one container as the stand-in sees it.
#[derive(Debug, Clone, Default)]
pub struct ContainerState {
    /// CRI container id of the current attempt.
    pub id: String,
    /// Restarts so far.
    pub restarts: u32,
    /// Running now.
    pub running: bool,
    /// Readiness (true without a readiness probe once running).
    pub ready: bool,
    /// Exit code of the last exit.
    pub last_exit: Option<i32>,
}

/// The state of one pod.
#[derive(Debug, Clone, Default)]
pub struct PodState {
    /// CRI sandbox id.
    pub sandbox_id: String,
    /// The sandbox's IP (pod network) or empty.
    pub ip: String,
    /// Init containers done.
    pub initialized: bool,
    /// Containers by name.
    pub containers: BTreeMap<String, ContainerState>,
    /// What happened (kubelet's events: sandbox failures, restarts, probe failures).
    pub events: Vec<String>,
    /// The worker has stopped the pod (deleted).
    pub terminated: bool,
}

impl PodState {
    /// Every container running and ready.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.initialized
            && !self.containers.is_empty()
            && self.containers.values().all(|c| c.running && c.ready)
    }
}

type Shared = Arc<Mutex<PodState>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, PodState> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running pod worker.
#[derive(Debug)]
struct Worker {
    state: Shared,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// One node's kubelet: its pods' workers on a runtime of their own.
#[derive(Debug)]
pub struct Kubelet {
    rt: tokio::runtime::Runtime,
    node: Arc<NodeRuntime>,
    pods: BTreeMap<String, Worker>,
}

/// kubelet's container restart back-off: the first restart at once, then 10 s doubling to
/// 5 min; a container that ran 10 min starts over.
#[must_use]
pub fn backoff(restarts: u32) -> Duration {
    if restarts == 0 {
        return Duration::ZERO;
    }
    let secs = 10u64.saturating_mul(1 << (restarts - 1).min(5));
    Duration::from_secs(secs.min(300))
}

impl Kubelet {
    /// A kubelet for `node`.
    pub fn new(node: Arc<NodeRuntime>) -> Result<Self, RuntimeError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|source| RuntimeError::Io {
                what: "kubelet runtime".into(),
                source,
            })?;
        Ok(Self {
            rt,
            node,
            pods: BTreeMap::new(),
        })
    }

    /// Start a worker for `plan` (the pod named `<namespace>/<name>`); `config_maps` holds
    /// the data of the ConfigMaps its volumes name.
    pub fn run_pod(
        &mut self,
        plan: PodPlan,
        config_maps: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> Result<(), RuntimeError> {
        let key = format!("{}/{}", plan.meta.namespace, plan.meta.name);
        self.prepare_volumes(&plan, config_maps)?;
        let state: Shared = Arc::default();
        let (stop, stop_rx) = watch::channel(false);
        let node = self.node.clone();
        let st = state.clone();
        let task = self.rt.spawn(async move {
            if let Err(e) = pod_worker(&node, &plan, &st, stop_rx).await {
                lock(&st).events.push(format!("worker: {e}"));
            }
        });
        self.pods.insert(key, Worker { state, stop, task });
        Ok(())
    }

    fn prepare_volumes(
        &self,
        plan: &PodPlan,
        config_maps: &BTreeMap<String, BTreeMap<String, String>>,
    ) -> Result<(), RuntimeError> {
        let io = |what: String| move |source| RuntimeError::Io { what, source };
        for h in &plan.host_paths {
            let p = self.node.host_path(&h.path);
            match h.create {
                Some(CreateKind::Directory) => {
                    std::fs::create_dir_all(&p).map_err(io(format!("hostPath {}", h.path)))?;
                }
                Some(CreateKind::File) => {
                    if let Some(parent) = p.parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(io(format!("hostPath {}", h.path)))?;
                    }
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&p)
                        .map_err(io(format!("hostPath {}", h.path)))?;
                }
                None => {}
            }
        }
        for cm in &plan.config_maps {
            let data = config_maps.get(&cm.name).ok_or_else(|| RuntimeError::Io {
                what: format!("configMap {}", cm.name),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })?;
            std::fs::create_dir_all(&cm.dir).map_err(io(format!("configMap {}", cm.name)))?;
            for (k, v) in data {
                std::fs::write(cm.dir.join(k), v).map_err(io(format!("configMap {k}")))?;
            }
        }
        Ok(())
    }

    /// The state of pod `namespace/name`.
    #[must_use]
    pub fn pod(&self, key: &str) -> Option<PodState> {
        self.pods.get(key).map(|w| lock(&w.state).clone())
    }

    /// Wait until pod `key` is ready (every container running and ready).
    pub fn wait_ready(&self, key: &str, timeout: Duration) -> Result<PodState, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.pod(key).ok_or_else(|| format!("no pod {key}"))?;
            if st.ready() {
                return Ok(st);
            }
            if Instant::now() > deadline {
                return Err(format!("{key} not ready after {timeout:?}: {st:#?}"));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Delete pod `key` as kubelet does on an API delete: containers stopped with the grace
    /// period, the sandbox stopped (CNI DEL) and removed. Waits for the worker.
    pub fn delete_pod(&mut self, key: &str) -> Result<PodState, String> {
        let w = self
            .pods
            .remove(key)
            .ok_or_else(|| format!("no pod {key}"))?;
        let _ = w.stop.send(true);
        self.rt
            .block_on(w.task)
            .map_err(|e| format!("{key} worker: {e}"))?;
        Ok(lock(&w.state).clone())
    }

    /// `ExecSync` of `cmd` in container `container` of pod `key`: exit code, stdout, stderr.
    pub fn exec(
        &self,
        key: &str,
        container: &str,
        cmd: &[&str],
        timeout: Duration,
    ) -> Result<(i32, String, String), String> {
        let st = self.pod(key).ok_or_else(|| format!("no pod {key}"))?;
        let id = st
            .containers
            .get(container)
            .map(|c| c.id.clone())
            .ok_or_else(|| format!("{key} has no container {container}"))?;
        self.rt
            .block_on(async {
                let mut rs = self.node.runtime().await?;
                exec_sync(
                    &mut rs,
                    &id,
                    cmd.iter().map(|s| (*s).to_owned()).collect(),
                    timeout,
                )
                .await
            })
            .map_err(|e| e.to_string())
    }

    /// The PID of container `container` of pod `key` (its init process), from the runtime's
    /// verbose status.
    pub fn container_pid(&self, key: &str, container: &str) -> Result<u32, String> {
        let st = self.pod(key).ok_or_else(|| format!("no pod {key}"))?;
        let id = st
            .containers
            .get(container)
            .map(|c| c.id.clone())
            .ok_or_else(|| format!("{key} has no container {container}"))?;
        let info = self
            .rt
            .block_on(async {
                self.node
                    .runtime()
                    .await?
                    .container_status(cri::ContainerStatusRequest {
                        container_id: id,
                        verbose: true,
                    })
                    .await
                    .map_err(cri_err("ContainerStatus"))
            })
            .map_err(|e| e.to_string())?
            .into_inner()
            .info;
        let v: serde_json::Value =
            serde_json::from_str(info.get("info").ok_or("no info")?).map_err(|e| e.to_string())?;
        v["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| format!("no pid in {v}"))
    }

    /// Stop every pod (as on a node drain).
    pub fn stop_all(&mut self) {
        let keys: Vec<String> = self.pods.keys().cloned().collect();
        for k in keys {
            let _ = self.delete_pod(&k);
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop_all();
    }
}

async fn exec_sync(
    rs: &mut RuntimeServiceClient<Channel>,
    id: &str,
    cmd: Vec<String>,
    timeout: Duration,
) -> Result<(i32, String, String), RuntimeError> {
    let r = rs
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd,
            timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        })
        .await
        .map_err(cri_err("ExecSync"))?
        .into_inner();
    Ok((
        r.exit_code,
        String::from_utf8_lossy(&r.stdout).into_owned(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    ))
}

/// A container's running attempt and its probes' bookkeeping.
#[derive(Debug)]
struct Running {
    plan: ContainerPlan,
    attempt: u32,
    id: String,
    started: Instant,
    exited_at: Option<Instant>,
    next_readiness: Instant,
    next_liveness: Instant,
    liveness_failures: u32,
    readiness_failures: u32,
    readiness_successes: u32,
}

impl Running {
    fn new(plan: ContainerPlan, attempt: u32, id: String) -> Self {
        let now = Instant::now();
        let delay = |p: &Option<ProbePlan>| {
            now + Duration::from_secs(p.as_ref().map_or(0, |p| p.initial_delay))
        };
        Self {
            next_readiness: delay(&plan.readiness),
            next_liveness: delay(&plan.liveness),
            plan,
            attempt,
            id,
            started: now,
            exited_at: None,
            liveness_failures: 0,
            readiness_failures: 0,
            readiness_successes: 0,
        }
    }
}

async fn pod_worker(
    node: &NodeRuntime,
    plan: &PodPlan,
    state: &Shared,
    mut stop: watch::Receiver<bool>,
) -> Result<(), RuntimeError> {
    let mut rs = node.runtime().await?;
    // the sandbox, retried as kubelet retries FailedCreatePodSandBox
    let mut tries = 0u32;
    let sandbox_id = loop {
        if *stop.borrow() {
            lock(state).terminated = true;
            return Ok(());
        }
        if !plan.host_network && !network_ready(&mut rs).await {
            sleep_or_stop(&mut stop, Duration::from_millis(500)).await;
            continue;
        }
        match rs
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(plan.sandbox.clone()),
                runtime_handler: String::new(),
            })
            .await
        {
            Ok(r) => break r.into_inner().pod_sandbox_id,
            Err(s) => {
                tries += 1;
                lock(state)
                    .events
                    .push(format!("FailedCreatePodSandBox: {}", s.message()));
                sleep_or_stop(&mut stop, Duration::from_secs(u64::from(tries.min(5)))).await;
            }
        }
    };
    let ip = rs
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.clone(),
            verbose: false,
        })
        .await
        .map_err(cri_err("PodSandboxStatus"))?
        .into_inner()
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    {
        let mut s = lock(state);
        s.sandbox_id.clone_from(&sandbox_id);
        s.ip.clone_from(&ip);
    }
    let result = run_containers(
        &mut rs,
        plan,
        &sandbox_id,
        &ip,
        node.netns(),
        state,
        &mut stop,
    )
    .await;
    // deletion (or a failure): stop the containers with the grace period, then the sandbox
    let ids: Vec<String> = lock(state)
        .containers
        .values()
        .map(|c| c.id.clone())
        .collect();
    for id in ids {
        let _ = rs
            .stop_container(cri::StopContainerRequest {
                container_id: id,
                timeout: plan.grace_seconds,
            })
            .await;
    }
    let _ = rs
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox_id.clone(),
        })
        .await
        .map_err(|s| {
            lock(state)
                .events
                .push(format!("StopPodSandbox: {}", s.message()));
        });
    let _ = rs
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id,
        })
        .await;
    lock(state).terminated = true;
    result
}

async fn network_ready(rs: &mut RuntimeServiceClient<Channel>) -> bool {
    let Ok(r) = rs.status(cri::StatusRequest { verbose: false }).await else {
        return false;
    };
    r.into_inner().status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.r#type == "NetworkReady" && c.status)
    })
}

async fn sleep_or_stop(stop: &mut watch::Receiver<bool>, d: Duration) {
    let _ = tokio::time::timeout(d, stop.changed()).await;
}

async fn create_and_start(
    rs: &mut RuntimeServiceClient<Channel>,
    plan: &PodPlan,
    sandbox_id: &str,
    c: &ContainerPlan,
    attempt: u32,
) -> Result<String, RuntimeError> {
    let mut config = c.config.clone();
    if let Some(m) = config.metadata.as_mut() {
        m.attempt = attempt;
    }
    config.log_path = format!("{}/{attempt}.log", c.name);
    let id = rs
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(plan.sandbox.clone()),
        })
        .await
        .map_err(cri_err("CreateContainer"))?
        .into_inner()
        .container_id;
    rs.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .map_err(cri_err("StartContainer"))?;
    Ok(id)
}

/// `Some(exit code)` once the container has exited.
async fn exited(
    rs: &mut RuntimeServiceClient<Channel>,
    id: &str,
) -> Result<Option<i32>, RuntimeError> {
    let st = rs
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        })
        .await
        .map_err(cri_err("ContainerStatus"))?
        .into_inner()
        .status;
    Ok(st
        .filter(|s| s.state == cri::ContainerState::ContainerExited as i32)
        .map(|s| s.exit_code))
}

async fn run_containers(
    rs: &mut RuntimeServiceClient<Channel>,
    plan: &PodPlan,
    sandbox_id: &str,
    ip: &str,
    netns: &str,
    state: &Shared,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), RuntimeError> {
    // init containers: each to completion, in order; a failed one is restarted with back-off
    for c in &plan.init {
        let mut attempt = 0u32;
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            let id = create_and_start(rs, plan, sandbox_id, c, attempt).await?;
            lock(state).containers.insert(
                c.name.clone(),
                ContainerState {
                    id: id.clone(),
                    restarts: attempt,
                    running: true,
                    ..Default::default()
                },
            );
            let code = loop {
                if let Some(code) = exited(rs, &id).await? {
                    break code;
                }
                if *stop.borrow() {
                    return Ok(());
                }
                sleep_or_stop(stop, Duration::from_millis(250)).await;
            };
            lock(state).containers.remove(&c.name);
            if code == 0 {
                break;
            }
            lock(state)
                .events
                .push(format!("init container {} exited {code}", c.name));
            attempt += 1;
            sleep_or_stop(stop, backoff(attempt)).await;
        }
    }
    lock(state).initialized = true;
    let mut running = Vec::new();
    for c in &plan.containers {
        let id = create_and_start(rs, plan, sandbox_id, c, 0).await?;
        lock(state).containers.insert(
            c.name.clone(),
            ContainerState {
                id: id.clone(),
                running: true,
                ready: c.readiness.is_none(),
                ..Default::default()
            },
        );
        running.push(Running::new(c.clone(), 0, id));
    }
    while !*stop.borrow() {
        let now = Instant::now();
        for r in &mut running {
            if r.exited_at.is_none() {
                if let Some(code) = exited(rs, &r.id).await? {
                    r.exited_at = Some(now);
                    let mut s = lock(state);
                    s.events
                        .push(format!("container {} exited {code}", r.plan.name));
                    if let Some(cs) = s.containers.get_mut(&r.plan.name) {
                        cs.running = false;
                        cs.ready = false;
                        cs.last_exit = Some(code);
                    }
                    continue;
                }
                probe_container(rs, r, ip, netns, state).await?;
            } else if r.exited_at.is_some_and(|t| {
                // a container that ran 10 min starts its back-off over
                let restarts = if t.duration_since(r.started) > Duration::from_secs(600) {
                    0
                } else {
                    r.attempt
                };
                now >= t + backoff(restarts)
            }) {
                let _ = rs
                    .remove_container(cri::RemoveContainerRequest {
                        container_id: r.id.clone(),
                    })
                    .await;
                let attempt = r.attempt + 1;
                let id = create_and_start(rs, plan, sandbox_id, &r.plan, attempt).await?;
                *r = Running::new(r.plan.clone(), attempt, id.clone());
                lock(state).containers.insert(
                    r.plan.name.clone(),
                    ContainerState {
                        id,
                        restarts: attempt,
                        running: true,
                        ready: r.plan.readiness.is_none(),
                        last_exit: None,
                    },
                );
            }
        }
        sleep_or_stop(stop, Duration::from_millis(500)).await;
    }
    Ok(())
}

async fn run_probe(
    rs: &mut RuntimeServiceClient<Channel>,
    id: &str,
    p: &ProbePlan,
    ip: &str,
    netns: &str,
) -> bool {
    let timeout = Duration::from_secs(p.timeout.max(1));
    match &p.action {
        ProbeAction::Exec(cmd) => {
            matches!(exec_sync(rs, id, cmd.clone(), timeout).await, Ok((0, _, _)))
        }
        ProbeAction::Tcp(port) => {
            // kubelet connects from the node: inside the node's network namespace
            let Ok(ip) = ip.parse::<IpAddr>() else {
                return false;
            };
            let to = SocketAddr::new(ip, *port);
            let ns = netns.to_owned();
            tokio::task::spawn_blocking(move || {
                crate::sim::in_netns(&ns, move || {
                    std::net::TcpStream::connect_timeout(&to, timeout).map(drop)
                })
                .is_ok()
            })
            .await
            .unwrap_or(false)
        }
    }
}

async fn probe_container(
    rs: &mut RuntimeServiceClient<Channel>,
    r: &mut Running,
    ip: &str,
    netns: &str,
    state: &Shared,
) -> Result<(), RuntimeError> {
    let now = Instant::now();
    if let Some(p) = r.plan.readiness.clone()
        && now >= r.next_readiness
    {
        r.next_readiness = now + Duration::from_secs(p.period.max(1));
        let ok = run_probe(rs, &r.id, &p, ip, netns).await;
        let mut s = lock(state);
        if ok {
            r.readiness_failures = 0;
            r.readiness_successes += 1;
            if r.readiness_successes >= p.success_threshold
                && let Some(cs) = s.containers.get_mut(&r.plan.name)
            {
                cs.ready = true;
            }
        } else {
            r.readiness_successes = 0;
            r.readiness_failures += 1;
            if r.readiness_failures >= p.failure_threshold
                && let Some(cs) = s.containers.get_mut(&r.plan.name)
            {
                cs.ready = false;
            }
        }
    }
    if let Some(p) = r.plan.liveness.clone()
        && now >= r.next_liveness
    {
        r.next_liveness = now + Duration::from_secs(p.period.max(1));
        if run_probe(rs, &r.id, &p, ip, netns).await {
            r.liveness_failures = 0;
        } else {
            r.liveness_failures += 1;
            if r.liveness_failures >= p.failure_threshold {
                lock(state).events.push(format!(
                    "container {} failed liveness, restarting",
                    r.plan.name
                ));
                rs.stop_container(cri::StopContainerRequest {
                    container_id: r.id.clone(),
                    timeout: 10,
                })
                .await
                .map_err(cri_err("StopContainer"))?;
                r.liveness_failures = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_as_kubelets() {
        let secs: Vec<u64> = (0..8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [0, 10, 20, 40, 80, 160, 300, 300]);
    }
}
