//! The end-to-end harness on the simulated VPC: a [`Sim`] owns one vpcsim world + fabric (node,
//! router and internet namespaces), the `ipamd` processes it starts inside the node namespaces
//! (per-node socket, checkpoint and log paths), the pod namespaces it creates below the nodes
//! and wires with `aws-cni`, and a count of every EC2 call the nodes make. Everything goes on
//! drop, also during a panic's unwinding: pods (namespaces), ipamd processes (by PID), the
//! fabric (every `vsim<run>-*` namespace), the run directory. Leftovers of crashed runs (their
//! ipamd processes, verified by PID + start time, and directories) are removed at the next
//! start. Must not: touch the root network namespace, or processes it did not start.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vpcsim::fabric::{Fabric, FabricConfig, names};
use vpcsim::{Knobs, Layout, World, WorldConfig};

mod calls;
mod kube;
mod net;

use calls::CountingWorld;
pub use calls::{CallLog, call_delta, is_mutating};
pub use kube::{KubeOptions, SimKube};
use net::start_time;
pub use net::{EchoServer, eventually, exec_in, in_netns, ping, remove_stale_runs, tcp_echo};

/// Where runs keep their files (`<run id>/`: per-node sockets, checkpoints, logs, pid list).
pub const RUN_ROOT: &str = "/run/vpcsim-e2e";
/// The internet host of the fabric (ping, TCP echo on [`INTERNET_ECHO_PORT`]).
pub const INTERNET_HOST: Ipv4Addr = names::INTERNET_HOST_ADDR;
/// TCP echo port of the internet host.
pub const INTERNET_ECHO_PORT: u16 = names::INTERNET_ECHO_PORT;
/// ipamd's introspection address inside a node (default; each node has its own loopback).
pub const INTROSPECTION: &str = "127.0.0.1:61679";
/// ipamd's metrics address inside a node.
pub const METRICS: &str = "127.0.0.1:61678";

/// What to bring up.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Number of nodes (instances).
    pub nodes: u32,
    /// Their instance type.
    pub instance_type: String,
    /// The VPC: zones, subnets per zone, a secondary CIDR block (default: one zone, the two
    /// default subnets).
    pub layout: Layout,
    /// Zone index of each node (node `i` in zone `placement[i]`, launched into that zone's
    /// first primary-block subnet); nodes beyond the list go round-robin over the zones.
    pub placement: Vec<u32>,
    /// Start kubesim beside the EC2 API (Nodes, aws-node Pods, chart CRDs and RBAC,
    /// per-node kubeconfigs reaching it through the fabric's relay).
    pub kube: Option<KubeOptions>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            nodes: 2,
            instance_type: "m5.large".into(),
            layout: Layout::default(),
            placement: Vec::new(),
            kube: None,
        }
    }
}

impl SimConfig {
    /// The zone index of node `i`.
    #[must_use]
    pub fn zone_of(&self, i: u32) -> u32 {
        self.placement
            .get(i as usize)
            .copied()
            .unwrap_or(i % self.layout.azs.max(1))
    }
}

/// One simulated node (EC2 instance) and the ipamd the harness runs in it.
#[derive(Debug)]
pub struct SimNode {
    /// Index in [`Sim::nodes`].
    pub index: usize,
    /// EC2 instance id.
    pub instance_id: String,
    /// Its network namespace.
    pub netns: String,
    /// Primary private IP (`eth0`).
    pub primary_ip: Ipv4Addr,
    /// Per-node directory (socket, checkpoint, logs, plugin log).
    pub dir: PathBuf,
    ipamd: Option<Child>,
    ipamd_env: Vec<(String, String)>,
}

impl SimNode {
    /// ipamd's gRPC socket.
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir.join("ipamd.sock")
    }
    /// ipamd's checkpoint (`AWS_VPC_K8S_CNI_BACKING_STORE`).
    #[must_use]
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("ipam.json")
    }
    /// ipamd's log file.
    #[must_use]
    pub fn ipamd_log(&self) -> PathBuf {
        self.dir.join("ipamd.log")
    }
    /// The plugin's log file.
    #[must_use]
    pub fn plugin_log(&self) -> PathBuf {
        self.dir.join("plugin.log")
    }
    /// PID of the running ipamd.
    #[must_use]
    pub fn ipamd_pid(&self) -> Option<u32> {
        self.ipamd.as_ref().map(Child::id)
    }
    /// The plugin's network configuration for this node.
    #[must_use]
    pub fn netconf(&self) -> String {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "aws-cni",
            "type": "aws-cni",
            "mtu": "9001",
            "vethPrefix": "eni",
            "ipamdSocket": self.socket(),
            "pluginLogFile": self.plugin_log(),
            "pluginLogLevel": "Debug",
        })
        .to_string()
    }
}

/// A pod: a namespace below a node, wired by `aws-cni`.
#[derive(Debug, Clone)]
pub struct Pod {
    /// Pod name (`K8S_POD_NAME`, namespace `default`).
    pub name: String,
    /// Node index.
    pub node: usize,
    /// Its network namespace.
    pub netns: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// Address ipamd gave it.
    pub ip: Ipv4Addr,
    /// The plugin's ADD result (prevResult for DEL).
    pub result: serde_json::Value,
}

/// A failed plugin call: exit code and the spec error JSON it printed.
#[derive(Debug, Clone)]
pub struct CniFailure {
    /// Exit code.
    pub code: i32,
    /// The error JSON (`code`, `msg`, `details`) or raw stdout/stderr.
    pub output: String,
}

impl std::fmt::Display for CniFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "aws-cni exit {}: {}", self.code, self.output)
    }
}

/// Harness errors (setup, processes); test assertions panic instead.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The fabric.
    #[error(transparent)]
    Fabric(#[from] vpcsim::fabric::FabricError),
    /// Launching instances.
    #[error("launch: {0}")]
    Launch(String),
    /// A file or process.
    #[error("{what}: {source}")]
    Io {
        /// what was done
        what: String,
        /// cause
        source: std::io::Error,
    },
    /// ipamd did not become ready.
    #[error("ipamd on node {node} not ready: {why}\n--- log tail ---\n{log}")]
    IpamdNotReady {
        /// node index
        node: usize,
        /// reason
        why: String,
        /// last lines of its log
        log: String,
    },
    /// A binary is missing.
    #[error("{0} not built (cargo build --workspace --bins)")]
    NotBuilt(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SimError {
    let what = what.into();
    move |source| SimError::Io { what, source }
}

/// One simulated VPC with its nodes, ipamds and pods. Dropping it removes everything.
pub struct Sim {
    /// The simulated EC2 world (state, knobs).
    pub world: Arc<World>,
    /// The nodes.
    pub nodes: Vec<SimNode>,
    /// Every EC2 call of every node.
    pub calls: Arc<CallLog>,
    pods: Vec<Pod>,
    fabric: Option<Fabric>,
    dir: PathBuf,
    bins: Bins,
    pod_seq: u32,
    cancel: Arc<std::sync::atomic::AtomicBool>,
    kube: Option<SimKube>,
    // last: dropped after the fabric (its servers run on it)
    rt: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("dir", &self.dir)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

/// Paths of the binaries the harness runs.
#[derive(Debug, Clone)]
pub struct Bins {
    /// `ipamd`.
    pub ipamd: PathBuf,
    /// `aws-cni`.
    pub aws_cni: PathBuf,
}

impl Bins {
    /// `ipamd` and `aws-cni` next to the running executable (test or demo driver).
    pub fn beside_current_exe() -> Result<Self, SimError> {
        let exe = std::env::current_exe().map_err(io("current exe"))?;
        let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
        if dir.ends_with("deps") {
            dir.pop();
        }
        let find = |name: &str| {
            let p = dir.join(name);
            if p.exists() {
                Ok(p)
            } else {
                Err(SimError::NotBuilt(p.display().to_string()))
            }
        };
        Ok(Self {
            ipamd: find("ipamd")?,
            aws_cni: find("aws-cni")?,
        })
    }
}

impl Sim {
    /// Remove crashed runs' leftovers, create the world, launch the nodes and build the fabric.
    pub fn start(config: &SimConfig) -> Result<Self, SimError> {
        let bins = Bins::beside_current_exe()?;
        remove_stale_runs();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(io("tokio runtime"))?;
        let world_config = WorldConfig::with_layout(&config.layout);
        world_config
            .validate()
            .map_err(|e| SimError::Launch(e.to_string()))?;
        let world = World::new(world_config);
        let ids = launch(&world, config)?;
        let calls = Arc::new(CallLog::default());
        let counting = CountingWorld {
            world: world.clone(),
            log: calls.clone(),
        };
        let run_id = names::fresh_run_id();
        let dir = Path::new(RUN_ROOT).join(&run_id);
        let kube = match &config.kube {
            Some(opts) => match rt.block_on(kube::start_kube(&dir.join("kube"), opts)) {
                Ok(k) => Some(k),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
            },
            None => None,
        };
        let fabric = Fabric::start(
            Arc::new(counting),
            rt.handle().clone(),
            &FabricConfig {
                run_id: Some(run_id),
                kube_upstream: kube.as_ref().map(|k| k.api.addr()),
                ..FabricConfig::default()
            },
        )
        .inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&dir);
        })?;
        let names = fabric.names().clone();
        let mut sim = Self {
            world,
            nodes: Vec::new(),
            calls,
            pods: Vec::new(),
            fabric: Some(fabric),
            dir: dir.clone(),
            bins,
            pod_seq: 0,
            cancel: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            kube,
            rt: Some(rt),
        };
        // from here on Drop removes everything
        std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
        let view = World::fabric_view(&sim.world, sim.world.now());
        for (index, id) in ids.iter().enumerate() {
            let primary_ip = view
                .instance(id)
                .and_then(|i| i.primary())
                .map_or(Ipv4Addr::UNSPECIFIED, |e| e.primary_ip);
            let ndir = dir.join(format!("node{index}"));
            std::fs::create_dir_all(&ndir).map_err(io(format!("create {}", ndir.display())))?;
            sim.nodes.push(SimNode {
                index,
                instance_id: id.clone(),
                netns: names.node_ns(id),
                primary_ip,
                dir: ndir,
                ipamd: None,
                ipamd_env: Vec::new(),
            });
        }
        if sim.kube.is_some() {
            sim.register_nodes()?;
        }
        Ok(sim)
    }

    /// A flag that, once set, makes the harness's waits give up (the demo sets it on Ctrl-C).
    pub fn set_cancel(&mut self, flag: Arc<std::sync::atomic::AtomicBool>) {
        self.cancel = flag;
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Serve the simulator's JSON control API (`/state`, `/knobs`, `/view`) on
    /// `127.0.0.1:<any port>` for the life of the run; returns its address.
    pub fn serve_control(&self) -> Result<SocketAddr, SimError> {
        let rt = self
            .rt
            .as_ref()
            .ok_or_else(|| SimError::Launch("stopped".into()))?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
            .map_err(io("bind control API"))?;
        let addr = listener.local_addr().map_err(io("control API address"))?;
        let router = vpcsim::control::router(self.world.clone());
        rt.spawn(vpcsim::serve(listener, router, std::future::pending()));
        Ok(addr)
    }

    /// This run's directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Namespace-name prefix of this run (`vsim<run>-`).
    #[must_use]
    pub fn prefix(&self) -> String {
        self.fabric
            .as_ref()
            .map(|f| f.names().prefix())
            .unwrap_or_default()
    }

    /// The internet namespace.
    #[must_use]
    pub fn internet_ns(&self) -> String {
        self.fabric
            .as_ref()
            .map(|f| f.names().internet_ns())
            .unwrap_or_default()
    }

    /// The pods alive now.
    #[must_use]
    pub fn pods(&self) -> &[Pod] {
        &self.pods
    }

    /// Change the simulator's knobs (throttling, latency, attach delay, IMDS lag, ...).
    pub fn set_knobs(&self, f: impl FnOnce(&mut Knobs)) {
        let mut k = self.world.knobs();
        f(&mut k);
        self.world.set_knobs(k);
    }

    /// The environment ipamd gets inside node `i` (AWS SDK endpoints of the simulator, per-node
    /// paths), plus `extra` (later entries win).
    #[must_use]
    pub fn ipamd_env(&self, i: usize, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let n = &self.nodes[i];
        let region = self.world.config().region.clone();
        let mut env = names::node_env(&region, &n.netns, &n.instance_id);
        env.extend([
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("IPAMD_SOCKET_PATH".into(), n.socket().display().to_string()),
            (
                "AWS_VPC_K8S_CNI_BACKING_STORE".into(),
                n.checkpoint().display().to_string(),
            ),
            (
                "AWS_VPC_K8S_CNI_LOG_FILE".into(),
                n.ipamd_log().display().to_string(),
            ),
            ("AWS_VPC_K8S_CNI_LOGLEVEL".into(), "DEBUG".into()),
            // as the DaemonSet manifest sets it (the code default is false)
            ("ENABLE_IPv4".into(), "true".into()),
            ("MY_NODE_NAME".into(), format!("node{i}")),
            ("CLUSTER_NAME".into(), "vpcsim-e2e".into()),
        ]);
        if let Some(k) = &self.kube {
            env.retain(|(key, _)| key != "MY_NODE_NAME");
            env.extend(k.node_env(i));
        }
        for (k, v) in extra {
            env.retain(|(ek, _)| ek != k);
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
        env
    }

    fn record_pid(&self, pid: u32) {
        let line = format!("{pid} {}\n", start_time(pid).unwrap_or_default());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("pids"))
        {
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// Start ipamd in node `i` with [`Sim::ipamd_env`]`(i, extra)` and wait (up to `timeout`)
    /// until its socket and introspection answer.
    pub fn start_ipamd(
        &mut self,
        i: usize,
        extra: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<(), SimError> {
        let env = self.ipamd_env(i, extra);
        self.nodes[i].ipamd_env = env;
        self.restart_ipamd_process(i, timeout)
    }

    fn restart_ipamd_process(&mut self, i: usize, timeout: Duration) -> Result<(), SimError> {
        let node = &self.nodes[i];
        let _ = std::fs::remove_file(node.socket());
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.dir.join("ipamd.stdout"))
            .map_err(io("ipamd stdout file"))?;
        let err = out.try_clone().map_err(io("ipamd stdout file"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &node.netns])
            .arg(&self.bins.ipamd)
            .env_clear()
            .envs(node.ipamd_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // its own process group: a terminal's Ctrl-C reaches the driver, which stops it
            .process_group(0)
            .spawn()
            .map_err(io("spawn ipamd"))?;
        let pid = child.id();
        self.nodes[i].ipamd = Some(child);
        self.record_pid(pid);
        self.wait_ipamd_ready(i, timeout)
    }

    fn wait_ipamd_ready(&mut self, i: usize, timeout: Duration) -> Result<(), SimError> {
        let deadline = Instant::now() + timeout;
        loop {
            let node = &mut self.nodes[i];
            if let Some(child) = node.ipamd.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                node.ipamd = None;
                return Err(SimError::IpamdNotReady {
                    node: i,
                    why: format!("exited: {status}"),
                    log: self.ipamd_log_tail(i, 30),
                });
            }
            if self.nodes[i].socket().exists() && self.introspect(i, "/v1/enis").is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline || self.cancelled() {
                return Err(SimError::IpamdNotReady {
                    node: i,
                    why: format!("no socket/introspection after {timeout:?}"),
                    log: self.ipamd_log_tail(i, 30),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Restart node `i`'s ipamd with the same environment: SIGKILL (crash) when `kill`, else
    /// SIGTERM (graceful), then start and wait until ready.
    pub fn restart_ipamd(
        &mut self,
        i: usize,
        kill: bool,
        timeout: Duration,
    ) -> Result<(), SimError> {
        self.stop_ipamd(i, kill);
        self.restart_ipamd_process(i, timeout)
    }

    /// Stop node `i`'s ipamd (SIGKILL when `kill`, else SIGTERM with a 10 s grace, then SIGKILL).
    pub fn stop_ipamd(&mut self, i: usize, kill: bool) {
        if let Some(mut child) = self.nodes[i].ipamd.take() {
            stop_child(&mut child, kill);
        }
    }

    /// The last `n` lines of node `i`'s ipamd log (file log, then stdout/stderr).
    #[must_use]
    pub fn ipamd_log_tail(&self, i: usize, n: usize) -> String {
        let node = &self.nodes[i];
        let mut text = String::new();
        for f in [node.ipamd_log(), node.dir.join("ipamd.stdout")] {
            let content = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = content.lines().collect();
            let start = lines.len().saturating_sub(n);
            text.push_str(&format!(
                "[{}]\n{}\n",
                f.display(),
                lines[start..].join("\n")
            ));
        }
        text
    }

    /// `GET <path>` on node `i`'s introspection endpoint, as JSON.
    pub fn introspect(&self, i: usize, path: &str) -> Result<serde_json::Value, String> {
        let body = self.http_get(i, INTROSPECTION, path)?;
        serde_json::from_str(&body).map_err(|e| format!("{path}: not JSON ({e}): {body}"))
    }

    /// `GET http://<addr><path>` from inside node `i` (plain HTTP/1.0, 5 s).
    pub fn http_get(&self, i: usize, addr: &str, path: &str) -> Result<String, String> {
        let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        let raw = in_netns(&self.nodes[i].netns, move || {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(req.as_bytes())?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })?;
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw.as_str(), ""));
        if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") {
            Ok(body.to_owned())
        } else {
            Err(format!("GET {path}: {}", head.lines().next().unwrap_or("")))
        }
    }

    /// Assigned addresses in node `i`'s `/v1/enis`: address → (ENI id, pod name from metadata).
    pub fn assigned(&self, i: usize) -> Result<BTreeMap<Ipv4Addr, (String, String)>, String> {
        let v = self.introspect(i, "/v1/enis")?;
        let mut out = BTreeMap::new();
        let cards = v.as_object().ok_or("/v1/enis: not an object")?;
        for card in cards.values() {
            let Some(enis) = card.get("ENIs").and_then(|e| e.as_object()) else {
                continue;
            };
            for (eni_id, eni) in enis {
                let Some(cidrs) = eni.get("AvailableIPv4Cidrs").and_then(|c| c.as_object()) else {
                    continue;
                };
                for cidr in cidrs.values() {
                    let Some(addrs) = cidr.get("IPAddresses").and_then(|a| a.as_object()) else {
                        continue;
                    };
                    for (ip, info) in addrs {
                        let net = info["IPAMKey"]["networkName"].as_str().unwrap_or("");
                        if net.is_empty() {
                            continue;
                        }
                        let pod = info["IPAMMetadata"]["k8sPodName"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned();
                        let ip: Ipv4Addr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
                        if out.insert(ip, (eni_id.clone(), pod)).is_some() {
                            return Err(format!("{ip} listed twice in /v1/enis"));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every live pod's address is unique across the VPC, owned in EC2 by an ENI of its node,
    /// and listed as assigned to that pod in its node's `/v1/enis`, which assigns nothing else.
    pub fn check_addresses(&self) -> Result<(), String> {
        let mut seen = std::collections::BTreeSet::new();
        for p in &self.pods {
            if !seen.insert(p.ip) {
                return Err(format!("duplicate pod address {}", p.ip));
            }
            if self.eni_of(p.node, p.ip).is_none() {
                return Err(format!(
                    "{} ({}) is not assigned to any ENI of node {} in EC2",
                    p.name, p.ip, p.node
                ));
            }
        }
        for i in 0..self.nodes.len() {
            let got: BTreeMap<Ipv4Addr, String> = self
                .assigned(i)?
                .into_iter()
                .map(|(ip, (_, pod))| (ip, pod))
                .collect();
            let want: BTreeMap<Ipv4Addr, String> = self
                .pods
                .iter()
                .filter(|p| p.node == i)
                .map(|p| (p.ip, p.name.clone()))
                .collect();
            if got != want {
                return Err(format!(
                    "node {i}: /v1/enis assignments differ from live pods\n  ipamd: {got:?}\n  pods:  {want:?}"
                ));
            }
        }
        Ok(())
    }

    /// EC2's view of node `i`: ENI id → (device index, secondary IPs).
    #[must_use]
    pub fn ec2_enis(&self, i: usize) -> BTreeMap<String, (u32, Vec<Ipv4Addr>)> {
        let id = self.nodes[i].instance_id.clone();
        self.world.read(|s| {
            s.enis_of(&id)
                .into_iter()
                .map(|e| {
                    let dev = e.attachment.as_ref().map_or(u32::MAX, |a| a.device_index);
                    (
                        e.id.clone(),
                        (dev, e.private_ips.iter().skip(1).copied().collect()),
                    )
                })
                .collect()
        })
    }

    /// The ENI (id) that EC2 says owns `ip` on node `i`, if any.
    #[must_use]
    pub fn eni_of(&self, i: usize, ip: Ipv4Addr) -> Option<String> {
        let view = World::fabric_view(&self.world, self.world.now());
        view.instance(&self.nodes[i].instance_id)?
            .enis
            .iter()
            .find(|e| e.owns_ipv4(ip))
            .map(|e| e.eni_id.clone())
    }

    fn run_cni(
        &self,
        node: usize,
        command: &str,
        container_id: &str,
        netns: &str,
        pod_name: &str,
        stdin: &str,
    ) -> Result<serde_json::Value, CniFailure> {
        let n = &self.nodes[node];
        let mut child = Command::new("ip")
            .args(["netns", "exec", &n.netns])
            .arg(&self.bins.aws_cni)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", container_id)
            .env("CNI_NETNS", format!("{}/{netns}", names::NETNS_DIR))
            .env("CNI_IFNAME", "eth0")
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod_name};K8S_POD_INFRA_CONTAINER_ID={container_id}"
                ),
            )
            .env("CNI_PATH", "/usr/lib/cni")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| CniFailure {
                code: -1,
                output: format!("spawn aws-cni: {e}"),
            })?;
        if let Some(mut stdin_pipe) = child.stdin.take() {
            let _ = stdin_pipe.write_all(stdin.as_bytes());
        }
        let out = child.wait_with_output().map_err(|e| CniFailure {
            code: -1,
            output: format!("wait aws-cni: {e}"),
        })?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(CniFailure {
                code: out.status.code().unwrap_or(-1),
                output: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
            });
        }
        if stdout.trim().is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_str(&stdout).map_err(|e| CniFailure {
            code: 0,
            output: format!("result not JSON ({e}): {stdout}"),
        })
    }

    /// Create a pod namespace below node `node` and wire it with `aws-cni` ADD. On failure the
    /// namespace is removed again and the plugin's error is returned.
    pub fn add_pod(&mut self, node: usize, name: &str) -> Result<Pod, CniFailure> {
        self.pod_seq += 1;
        let netns = format!("{}p{}", self.prefix(), self.pod_seq);
        let container_id = format!("{:016x}{:08x}", self.pod_seq, std::process::id());
        let mk = Command::new("ip").args(["netns", "add", &netns]).output();
        if !mk.as_ref().is_ok_and(|o| o.status.success()) {
            return Err(CniFailure {
                code: -1,
                output: format!("ip netns add {netns}: {mk:?}"),
            });
        }
        let _ = Command::new("ip")
            .args(["-n", &netns, "link", "set", "lo", "up"])
            .output();
        let conf = self.nodes[node].netconf();
        match self.run_cni(node, "ADD", &container_id, &netns, name, &conf) {
            Ok(result) => {
                let ip = result["ips"][0]["address"]
                    .as_str()
                    .and_then(|a| a.split('/').next())
                    .and_then(|a| a.parse().ok());
                let Some(ip) = ip else {
                    delete_netns(&netns);
                    return Err(CniFailure {
                        code: 0,
                        output: format!("no IPv4 in result: {result}"),
                    });
                };
                let pod = Pod {
                    name: name.to_owned(),
                    node,
                    netns,
                    container_id,
                    ip,
                    result,
                };
                self.pods.push(pod.clone());
                Ok(pod)
            }
            Err(e) => {
                delete_netns(&netns);
                Err(e)
            }
        }
    }

    /// `aws-cni` DEL for `pod` (with its ADD result as prevResult), then delete its namespace.
    pub fn del_pod(&mut self, pod: &Pod) -> Result<(), CniFailure> {
        let mut conf: serde_json::Value =
            serde_json::from_str(&self.nodes[pod.node].netconf()).unwrap_or_default();
        conf["prevResult"] = pod.result.clone();
        let r = self.run_cni(
            pod.node,
            "DEL",
            &pod.container_id,
            &pod.netns,
            &pod.name,
            &conf.to_string(),
        );
        delete_netns(&pod.netns);
        self.pods.retain(|p| p.netns != pod.netns);
        r.map(drop)
    }

    /// Pod-related state left in node `i` (veths, pod rules 512/1536, routes via veths).
    #[must_use]
    pub fn pod_leftovers(&self, i: usize) -> Vec<String> {
        let ns = &self.nodes[i].netns;
        let lines = |args: &[&str]| -> Vec<String> {
            let mut full = vec!["-n", ns.as_str()];
            full.extend_from_slice(args);
            let out = Command::new("ip").args(&full).output();
            out.map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect()
            })
            .unwrap_or_default()
        };
        let mut left: Vec<String> = lines(&["-o", "link", "show", "type", "veth"])
            .into_iter()
            .filter(|l| l.contains(": eni"))
            .collect();
        left.extend(
            lines(&["-4", "rule", "show"])
                .into_iter()
                .filter(|l| l.starts_with("512:") || l.starts_with("1536:")),
        );
        left.extend(
            lines(&["-4", "route", "show", "table", "all"])
                .into_iter()
                .filter(|l| l.contains(" dev eni")),
        );
        left
    }

    /// Stop everything now (same as drop), reporting teardown errors.
    pub fn shutdown(mut self) -> Vec<String> {
        self.teardown()
    }

    fn teardown(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        for pod in std::mem::take(&mut self.pods) {
            delete_netns(&pod.netns);
        }
        for i in 0..self.nodes.len() {
            self.stop_ipamd(i, false);
        }
        if let Some(f) = self.fabric.take() {
            errors.extend(f.shutdown().into_iter().map(|e| e.to_string()));
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
        if self.dir.starts_with(RUN_ROOT) && self.dir != Path::new(RUN_ROOT) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        errors
    }
}

/// Launch `config.nodes` instances, node `i` into the first primary-block subnet of its zone.
fn launch(world: &Arc<World>, config: &SimConfig) -> Result<Vec<String>, SimError> {
    let cfg = world.config();
    let mut ids = Vec::new();
    for i in 0..config.nodes {
        let zone = vpcsim::config::az_name(&cfg.region, config.zone_of(i));
        let subnet = world.read(|s| {
            s.subnets
                .values()
                .find(|sn| sn.availability_zone == zone && s.vpc.cidr.contains(&sn.cidr))
                .map(|sn| sn.id.clone())
        });
        let Some(subnet) = subnet else {
            return Err(SimError::Launch(format!(
                "no primary-block subnet in zone {zone}"
            )));
        };
        let mut got = world
            .mutate(|s, now| {
                s.run_instances(
                    vpcsim::state::RunInstances {
                        instance_type: config.instance_type.clone(),
                        subnet_id: Some(subnet.clone()),
                        count: 1,
                        ..Default::default()
                    },
                    now,
                )
            })
            .map_err(|e| SimError::Launch(e.to_string()))?;
        ids.append(&mut got);
    }
    Ok(ids)
}

impl Drop for Sim {
    fn drop(&mut self) {
        for e in self.teardown() {
            eprintln!("sim teardown: {e}");
        }
    }
}

fn delete_netns(ns: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", ns])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn stop_child(child: &mut Child, kill: bool) {
    let Ok(pid) = i32::try_from(child.id()) else {
        return;
    };
    let pid = nix::unistd::Pid::from_raw(pid);
    if !kill {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}
