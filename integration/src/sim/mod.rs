//! The end-to-end harness on the simulated VPC: a [`Sim`] owns one vpcsim world + fabric (node,
//! router and internet namespaces), the `ipamd` processes it starts inside the node namespaces
//! (per-node socket, checkpoint and log paths), the pod namespaces it creates below the nodes
//! and wires with `aws-cni`, a count of every EC2 call the nodes make, and optionally the
//! Kubernetes API (kubesim, `kube.rs`) relayed into every node. Everything goes on
//! drop, also during a panic's unwinding: pods (namespaces), ipamd processes (by PID), the
//! fabric (every `vsim<run>-*` namespace), the run directory. Leftovers of crashed runs (their
//! ipamd processes, verified by PID + start time, and directories) are removed at the next
//! start. Must not: touch the root network namespace, or processes it did not start.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vpcsim::fabric::{Fabric, FabricConfig, names};
use vpcsim::{Knobs, Layout, World, WorldConfig};

mod calls;
mod chain;
mod ipamd;
mod kube;
mod net;
mod plugin;
mod pods;
mod policy;

use crate::supervisor::{PidList, Stop, Supervised, delete_netns};
use calls::CountingWorld;
pub use calls::{CallLog, call_delta, is_mutating};
pub use chain::{Cnitool, STANDARD_PLUGINS, chart_conflist_template};
pub use kube::{KubeOptions, SimKube};
pub use net::{
    AddressWatch, Attempt, EchoServer, PingCount, PingStream, TcpProbe, eventually, exec_in,
    in_netns, ping, ping6, remove_stale_runs, tcp_echo,
};
pub use plugin::{PluginTarget, Sandbox, netns_path, run_plugin};

/// Where runs keep their files (`<run id>/`: per-node sockets, checkpoints, logs, pid list).
pub const RUN_ROOT: &str = "/run/vpcsim-e2e";
/// The internet host of the fabric (ping, TCP echo on [`INTERNET_ECHO_PORT`]).
pub const INTERNET_HOST: Ipv4Addr = names::INTERNET_HOST_ADDR;
/// The IPv6 internet host of the fabric, behind the egress-only gateway (ping6, TCP echo on
/// [`INTERNET_ECHO_PORT`]).
pub const INTERNET_HOST6: Ipv6Addr = names::INTERNET_HOST_ADDR6;
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
    /// Launch the nodes dual-stack (an IPv6 address on the primary ENI, as an EKS IPv6
    /// cluster's nodes), so ipamd can run in IPv6 mode.
    pub ipv6: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            nodes: 2,
            instance_type: "m5.large".into(),
            layout: Layout::default(),
            placement: Vec::new(),
            kube: None,
            ipv6: false,
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
    /// The primary ENI's first IPv6 address (on `eth0`), when launched with one.
    pub primary_ipv6: Option<Ipv6Addr>,
    /// Per-node directory (socket, checkpoint, logs, plugin log).
    pub dir: PathBuf,
    ipamd: Option<Supervised>,
    ipamd_env: Vec<(String, String)>,
    /// The node's installed conflist (`Sim::install_conflist`), with this run's paths; pods
    /// of the node then go through its whole chain instead of `aws-cni` alone.
    conflist: Option<serde_json::Value>,
}

impl SimNode {
    /// ipamd's gRPC socket.
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir.join("ipamd.sock")
    }
    /// Where the plugin dials the network-policy agent (the conflist's `npaSocket`; this run's
    /// stand-in for `/var/run/aws-node/npa.sock`).
    #[must_use]
    pub fn npa_socket(&self) -> PathBuf {
        self.dir.join("npa.sock")
    }
    /// ipamd's checkpoint (`AWS_VPC_K8S_CNI_BACKING_STORE`).
    #[must_use]
    pub fn checkpoint(&self) -> PathBuf {
        self.dir.join("ipam.json")
    }
    /// The checkpoint of network card `card` (`ipam-nic-N.json` beside `ipam.json`).
    #[must_use]
    pub fn card_checkpoint(&self, card: u32) -> PathBuf {
        if card == 0 {
            return self.checkpoint();
        }
        self.dir.join(format!("ipam-nic-{card}.json"))
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
        self.ipamd.as_ref().map(Supervised::pid)
    }
    /// The conflist installed by [`Sim::install_conflist`], if any.
    #[must_use]
    pub fn conflist(&self) -> Option<&serde_json::Value> {
        self.conflist.as_ref()
    }
    /// The node's CNI configuration directory (`NETCONFPATH`, holds `10-aws.conflist`).
    #[must_use]
    pub fn netconf_dir(&self) -> PathBuf {
        self.dir.join("net.d")
    }
    /// host-local's lease directory of egress-cni (this run's stand-in for upstream's
    /// `/run/cni/v4pd/egress-v6-ipam` / `/run/cni/v6pd/egress-v4-ipam`).
    #[must_use]
    pub fn egress_lease_dir(&self) -> PathBuf {
        self.dir.join("egress-ipam")
    }
    /// egress-cni's log file (upstream: `/var/log/aws-routed-eni/egress-v6-plugin.log` or
    /// `egress-v4-plugin.log`).
    #[must_use]
    pub fn egress_plugin_log(&self) -> PathBuf {
        self.dir.join("egress-plugin.log")
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
            "npaSocket": self.npa_socket(),
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
    /// The IPv4 address ipamd gave it (`0.0.0.0` for an IPv6-only pod).
    pub ip: Ipv4Addr,
    /// The IPv6 address ipamd gave it (IPv6 and dual-stack pods).
    pub ipv6: Option<Ipv6Addr>,
    /// The ADD result (prevResult for DEL): `aws-cni`'s, or the whole chain's when the node
    /// has a conflist (what libcni caches).
    pub result: serde_json::Value,
}

impl Pod {
    /// The pod's sandbox as the runtime names it to the plugins.
    #[must_use]
    pub fn sandbox(&self) -> Sandbox<'_> {
        Sandbox {
            pod_name: &self.name,
            container_id: &self.container_id,
            netns: &self.netns,
        }
    }
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
        let find = |name: &str| {
            crate::binaries::find_built(name)
                .map_err(|p| SimError::NotBuilt(p.display().to_string()))
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
        // The run is live from before its first file: a concurrent run's `remove_stale_runs`
        // (another test of this binary, another process) would otherwise delete the kube
        // directory written before the fabric registers the run.
        let run_names = names::RunNames::new(run_id.clone());
        vpcsim::fabric::netns::register_run(&run_names)
            .map_err(|e| SimError::Launch(e.to_string()))?;
        let kube = match &config.kube {
            Some(opts) => match rt.block_on(kube::start_kube(&dir.join("kube"), opts)) {
                Ok(k) => Some(k),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    vpcsim::fabric::netns::unregister_run(&run_names);
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
            vpcsim::fabric::netns::unregister_run(&run_names);
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
            let primary_ipv6 = view.instance(id).and_then(|i| i.primary_ipv6());
            let ndir = dir.join(format!("node{index}"));
            std::fs::create_dir_all(&ndir).map_err(io(format!("create {}", ndir.display())))?;
            sim.nodes.push(SimNode {
                index,
                instance_id: id.clone(),
                netns: names.node_ns(id),
                primary_ip,
                primary_ipv6,
                dir: ndir,
                ipamd: None,
                ipamd_env: Vec::new(),
                conflist: None,
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
                        ipv6_count: u32::from(config.ipv6),
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
