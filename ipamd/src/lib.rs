//! ipamd library: the composition root ([`run`]) and the daemon's modules. `run` is the only
//! place that builds real ports, spawns tasks and wires shutdown. Must not (here): decide policy
//! or parse env (see `config`).
//!
//! Modules: `config` (env → Config), `datastore` (pure index + checkpoint format/port), `pool`
//! (pure policy and reconcile plan, provider port, in-memory provider), `ipam` (the stateful
//! index: datastore + checkpoint behind a private lock), `pool::run` (manager and reconciler
//! executing decisions against the EC2 and host ports), `metrics` (typed registry, encoder),
//! `rpc` (gRPC edge), `http` (introspection, serving metrics), `aws`, `host`, `k8s` (ports'
//! implementations), `node_init` (EC2 node-init helpers). [`run`] is the one composition
//! root: it picks the ports from `Config` and hands them to [`run_composed`].

#![warn(missing_docs)]

pub mod aws;
pub mod config;
pub use ipam_core::datastore;
pub mod failures;
pub mod host;
pub mod http;
pub mod instance;
pub mod ipam;
pub mod k8s;
pub mod metrics;
pub mod node_init;
pub mod pods;
pub mod pool;
pub mod readiness;
pub mod reclaim;
pub mod rpc;
pub mod sgp;
pub mod status;

use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, LogLevel, LogTarget, ProviderKind};
use crate::datastore::checkpoint::FileCheckpoint;
use crate::ipam::{Ipam, IpamSettings, RestoreOutcome, SystemClock};
use crate::pool::ec2_port::EniProvider;
use crate::pool::manager::Manager;
use crate::pool::policy::Targets;

/// Initialises `tracing` to `AWS_VPC_K8S_CNI_LOG_FILE` at `AWS_VPC_K8S_CNI_LOGLEVEL`, in
/// upstream's zap JSON line shape; a file is rotated as upstream's lumberjack rotates it (100 MB,
/// 5 gzip backups), so a node's disk does not fill with ipamd's DEBUG log.
pub fn init_logging(config: &Config) -> anyhow::Result<()> {
    let level = match config.log.level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error | LogLevel::Fatal => "error",
    };
    let filter = tracing_subscriber::EnvFilter::new(format!("ipamd={level},warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
        .event_format(logging::ZapJson);
    match &config.log.file {
        LogTarget::Stdout => builder.with_writer(std::io::stdout).try_init(),
        LogTarget::Stderr => builder.with_writer(std::io::stderr).try_init(),
        LogTarget::File(path) => {
            let file = logging::open_rotating(path, logging::Rotation::default())
                .with_context(|| format!("open log file {}", path.display()))?;
            builder.with_writer(file).try_init()
        }
    }
    .map_err(|e| anyhow::anyhow!("init logging: {e}"))
}

/// Waits while another ipamd serves `socket` (the old pod during a DaemonSet `maxSurge`
/// update): two instances must not manage one node, nor remove each other's socket. Returns
/// false if `shutdown` came first.
pub async fn wait_for_socket(socket: &std::path::Path, shutdown: &CancellationToken) -> bool {
    let mut logged = false;
    while rpc::socket_is_live(socket) {
        if !logged {
            tracing::warn!(socket = %socket.display(), "another ipamd serves this socket; waiting for it to stop");
            logged = true;
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
        }
    }
    if logged {
        tracing::info!(socket = %socket.display(), "the other ipamd stopped; starting");
    }
    true
}

/// Runs ipamd until SIGTERM/SIGINT: the daemon and the signal watcher side by side (nothing
/// detached); the watcher cancels the daemon's token and ends with it.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let done = CancellationToken::new();
    let (result, ()) = tokio::join!(
        async {
            let r = run_until(config, shutdown.clone()).await;
            done.cancel();
            r
        },
        cancel_on_signal(shutdown.clone(), done.clone()),
    );
    result
}

/// Cancels `shutdown` on SIGTERM or SIGINT; returns when that happened or `done` is cancelled.
pub async fn cancel_on_signal(shutdown: CancellationToken, done: CancellationToken) {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        () = done.cancelled() => return,
    }
    shutdown.cancel();
}

/// [`run`] until `shutdown` is cancelled.
async fn run_until(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    // One ipamd per node: the lock first (held until exit; an instance of ours still running,
    // e.g. the old pod of a maxSurge update, has it until it has exited), then the socket (an
    // instance that takes no lock: upstream's aws-node during a takeover).
    let Some(_node_lock) = instance::NodeLock::acquire(
        &instance::LockPaths::new(&config.node.socket_path, &config.node.backing_store),
        &shutdown,
        instance::LOCK_POLL,
    )
    .await?
    else {
        return Ok(());
    };
    if !wait_for_socket(&config.node.socket_path, &shutdown).await {
        return Ok(());
    }
    // The Kubernetes client's tasks (the Node and ENIConfig watches, the event poster) run
    // beside everything that follows, from before the API-server wait until the daemon has
    // stopped, and are awaited then (k8s::ClusterTasks::beside): nothing detached.
    let (cluster, kube_tasks) = start_kubernetes(&config, &shutdown).await?;
    kube_tasks
        .beside(
            &shutdown,
            run_started(config, cluster, started, shutdown.clone()),
        )
        .await
}

/// [`run_until`] once the Kubernetes client exists: the API-server wait, the ports, the daemon.
async fn run_started(
    config: Config,
    cluster: Option<k8s::Cluster>,
    started: std::time::Instant,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let with_api_server = match &cluster {
        Some(cluster) => wait_for_kubernetes(&config, cluster, &shutdown).await?,
        None => false,
    };
    let startup = Startup {
        started,
        with_api_server,
    };
    if shutdown.is_cancelled() {
        return Ok(());
    }
    // The ports, picked from Config: the EC2 provider with host networking (node init first),
    // or the test-only in-memory provider without.
    let metrics = Arc::new(metrics::Metrics::new());
    metrics.begin_startup(started);
    match config.aws.provider.clone() {
        #[cfg(feature = "memory-provider")]
        ProviderKind::Memory(spec) => {
            tracing::warn!(
                "using the in-memory ENI provider: TEST/DEMO ONLY, addresses are invented"
            );
            anyhow::ensure!(
                !config.kube.custom_network_cfg,
                "the in-memory ENI provider has no ENIConfig subnets: custom networking needs the EC2 provider"
            );
            let ports = Ports {
                provider: aws::memory::MemoryProvider::from_spec(spec),
                custom_network: None,
                host: pool::host_port::NoHost,
                not_ready: Vec::new(),
                os_tables: Vec::new(),
                tasks: Vec::new(),
                vpc_v4_follow: None,
                trunking_compatible: false,
            };
            run_composed(config, ports, metrics, cluster, startup, shutdown).await
        }
        ProviderKind::Ec2 => {
            let node = node_init::init_ec2(&config, cluster.as_ref(), &metrics).await?;
            let mut tasks: Vec<Task> = Vec::new();
            // As upstream (`disableLeakedENICleanup`): no leaked-ENI clean-up in IPv6 mode.
            if !config.aws.disable_leaked_eni_cleanup
                && !config.aws.disable_network_resource_provisioning
                && !config.family.is_v6_only()
            {
                let loop_ = node_init::leaked_eni_loop(
                    node.provider.clone(),
                    config.aws.leaked_eni_period,
                    shutdown.child_token(),
                );
                tasks.push(Task::until_stopped("leaked-ENI clean-up", async move {
                    loop_.await;
                    Ok(())
                }));
            }
            if let Some(follower) = node.group_follower {
                let run = follower.run(
                    node.provider.clone(),
                    config.aws.security_group_check,
                    shutdown.child_token(),
                );
                tasks.push(Task::until_stopped("security-group follower", async move {
                    run.await;
                    Ok(())
                }));
            }
            let mut vpc_v4_follow = None;
            if let Some(follower) = node.cidr_follower {
                // Upstream's `updateCIDRsRulesOnChange`: the VPC's blocks followed while ipamd
                // runs (node_init::CidrFollower).
                let initial = node
                    .provider
                    .node_network()
                    .await
                    .map(|n| follower.reply_cidrs(&n.vpc_v4_cidrs))
                    .unwrap_or_default();
                let (tx, rx) = tokio::sync::watch::channel(initial);
                vpc_v4_follow = Some(rx);
                let run = follower.run(
                    node.provider.clone(),
                    config.pool.vpc_cidr_check,
                    tx,
                    shutdown.child_token(),
                );
                tasks.push(Task::until_stopped("VPC CIDR follower", async move {
                    run.await;
                    Ok(())
                }));
            }
            let ports = Ports {
                provider: node.provider,
                custom_network: node.custom_network,
                host: node.host,
                not_ready: node.not_ready,
                os_tables: node.os_tables,
                tasks,
                vpc_v4_follow,
                trunking_compatible: node.trunking_compatible,
            };
            run_composed(config, ports, metrics, cluster, startup, shutdown).await
        }
    }
}

/// The ports the daemon runs on, as `run` picked them.
#[derive(Debug)]
pub struct Ports<P, H> {
    /// The EC2 port.
    pub provider: P,
    /// Custom networking's inputs: the pool manager places new ENIs by the node's ENIConfig.
    pub custom_network: Option<k8s::CustomNetwork>,
    /// The host port for ENIs.
    pub host: H,
    /// ENIs whose host set-up failed at node init: their addresses are held back until the
    /// pool loop's retry succeeds.
    pub not_ready: Vec<String>,
    /// ENIs the node's OS already routes by a table of its own, found at their host set-up:
    /// their assignments answer that table.
    pub os_tables: Vec<(String, u32)>,
    /// Long-running work of the ports (the leaked-ENI clean-up, the VPC CIDR follower),
    /// supervised with the daemon's own tasks.
    pub tasks: Vec<Task>,
    /// `VPCv4CIDRs` as the VPC CIDR follower keeps them (EC2 nodes in IPv4 mode).
    pub vpc_v4_follow: Option<tokio::sync::watch::Receiver<Vec<String>>>,
    /// The instance type takes a trunk ENI (security groups for pods keep a slot for it).
    pub trunking_compatible: bool,
}

/// A long-running task of the daemon, not started yet: [`Daemon::serve`] runs every one in one
/// supervised set (the first to fail ends the daemon; all are awaited at shutdown), none
/// detached.
pub struct Task {
    name: &'static str,
    work: std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>,
    /// Dropped when the daemon stops (work that does not watch the daemon's own token).
    drop_on_stop: bool,
}

impl Task {
    /// A named task that ends by itself once the daemon's token (given to it) is cancelled.
    pub fn new(
        name: &'static str,
        work: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> Self {
        Self {
            name,
            work: Box::pin(work),
            drop_on_stop: false,
        }
    }

    /// A named task made before the daemon's token existed (the ports' own): dropped when the
    /// daemon stops, for any reason.
    pub fn until_stopped(
        name: &'static str,
        work: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> Self {
        Self {
            drop_on_stop: true,
            ..Self::new(name, work)
        }
    }
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The Kubernetes client, and its tasks (made, not started: the caller runs them beside the
/// daemon, [`k8s::ClusterTasks::beside`]; they end once `shutdown` is cancelled). None and no
/// tasks when no API is configured.
pub async fn start_kubernetes(
    config: &Config,
    shutdown: &CancellationToken,
) -> anyhow::Result<(Option<k8s::Cluster>, k8s::ClusterTasks)> {
    let Some(settings) = config.kube.api.clone() else {
        return Ok((None, k8s::ClusterTasks::default()));
    };
    let (cluster, tasks) =
        k8s::Cluster::connect(settings, config.kube.custom_network_cfg, shutdown)
            .await
            .context("kubernetes client")?;
    Ok((Some(cluster), tasks))
}

/// The Kubernetes API at start-up, as upstream's `aws-k8s-agent` (the client's tasks running):
/// with custom networking, `ANNOTATE_POD_IP` (or SGP) ipamd waits until the API server answers
/// (retrying, never exiting); otherwise it tries for 30 s and starts without it, the Node and
/// ENIConfig watches connecting in the background. Returns whether the API server answered
/// before ipamd went on (upstream's `withApiServer`).
pub async fn wait_for_kubernetes(
    config: &Config,
    cluster: &k8s::Cluster,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let dependence = if config.kube.custom_network_cfg
        || config.kube.annotate_pod_ip
        || config.kube.pod_eni.is_some()
    {
        tracing::info!(
            "SGP, custom networking or pod annotation feature is in use, waiting for API server connectivity to start IPAMD"
        );
        k8s::cluster::ApiDependence::Required
    } else {
        tracing::info!("Waiting to connect API server for up to 30s...");
        k8s::cluster::ApiDependence::Optional
    };
    let reached = cluster.wait_reachable(dependence, shutdown).await;
    if reached {
        // upstream `nodeInit` with the API server: the Node is read (max pods; here also the
        // first ENI's placement from its labels and whether it is cordoned); a Node that cannot
        // be read fails the start ("Failed to get node"), so a wrong MY_NODE_NAME is never
        // served in silence.
        let mut node = cluster.node();
        let found = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            node.wait_for(Option::is_some),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        if !found && !shutdown.is_cancelled() {
            anyhow::bail!(
                "Failed to get node {:?}: the API server answers but has no such Node after 10 s \
                 (MY_NODE_NAME must be the node's name: the DaemonSet sets it from spec.nodeName)",
                cluster.node_name()
            );
        }
    }
    Ok(reached)
}

/// What `run` measured before the ports existed, for the start-up metrics.
#[derive(Debug, Clone, Copy)]
pub struct Startup {
    /// When `run` began (node initialization and start-up durations count from here).
    pub started: std::time::Instant,
    /// The API server answered during start-up (`with_api_server` label).
    pub with_api_server: bool,
}

/// What the composition does with the cluster once the pool exists: max-pods from the Node
/// (upstream's fallbacks: the instance's eni-max-pods value, then 110; `IPAMD_MAX_PODS`
/// overrides), the `/v1/eni-configs` name, and whether the pool may attach and free ENIs (not
/// on a node tainted `node.kubernetes.io/unschedulable` unless
/// `AWS_MANAGE_ENIS_NON_SCHEDULABLE=true`, as upstream).
fn follow_node(
    cluster: &k8s::Cluster,
    config: &Config,
    limits: pool::ec2_port::InstanceLimits,
    ipam: &Arc<Ipam>,
    eni_config_name: tokio::sync::watch::Sender<Option<String>>,
    shutdown: CancellationToken,
) -> Task {
    let table = limits
        .max_enis
        .saturating_mul(limits.ipv4_per_eni.saturating_sub(1))
        .saturating_add(2);
    let override_ = config.pool.max_pods;
    let keys = config.kube.eni_config_keys.clone();
    let manage_unschedulable = config.kube.manage_enis_non_schedulable;
    ipam.node_state
        .set_max_pods(k8s::effective_max_pods(override_, None, Some(table)));
    let mut node = cluster.node();
    // Before the pool loop's first pass: a cordoned node attaches nothing from the start.
    if let Some(f) = node.borrow().as_ref() {
        ipam.node_state
            .set_node_unschedulable(f.unschedulable && !manage_unschedulable);
    }
    let ipam = ipam.clone();
    Task::new("node follower", async move {
        loop {
            let facts = node.borrow_and_update().clone();
            if let Some(f) = facts {
                let max = k8s::effective_max_pods(override_, f.capacity_pods, Some(table));
                ipam.node_state.set_max_pods(max);
                eni_config_name.send_replace(Some(k8s::eni_config_name(&f, &keys)));
                let frozen = f.unschedulable && !manage_unschedulable;
                if frozen != ipam.node_state.node_unschedulable() {
                    if frozen {
                        tracing::info!(
                            "node is unschedulable (taint node.kubernetes.io/unschedulable): no addresses or ENIs are attached and no ENI is freed while it drains (AWS_MANAGE_ENIS_NON_SCHEDULABLE=false)"
                        );
                    } else {
                        tracing::info!("node is schedulable: the pool manages ENIs again");
                    }
                    ipam.node_state.set_node_unschedulable(frozen);
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                r = node.changed() => if r.is_err() { return Ok(()) },
            }
        }
    })
}

/// Security groups for pods (`ENABLE_POD_ENI`): the pool keeps a slot for the trunk on a
/// trunking-capable type; with custom networking the node's ENIConfig goes on its `CNINode`
/// (`CustomNetworking`, upstream `nodeInit`: a failure counts
/// `awscni_pod_eni_error_count{fn="nodeInit"}` and ends the start, as upstream's); the
/// `SecurityGroupsForPods` feature loop becomes a task; branch pods are answered from their
/// annotation with the trunk's link from the host netns.
#[allow(clippy::too_many_arguments)]
async fn start_pod_eni(
    config: &Config,
    mode: config::PodSgMode,
    cluster: &k8s::Cluster,
    ipam: &Arc<Ipam>,
    metrics: &Arc<metrics::Metrics>,
    host: Option<Arc<host::HostNetwork>>,
    trunking_compatible: bool,
    max_enis: u32,
    inner: &CancellationToken,
    tasks: &mut Vec<Task>,
) -> anyhow::Result<sgp::BranchPods> {
    tracing::info!(
        mode = mode.as_str(),
        trunking_compatible,
        "security groups for pods (ENABLE_POD_ENI): branch pods answered from their vpc.amazonaws.com/pod-eni annotation"
    );
    ipam.node_state.reserve_trunk_slot(trunking_compatible);
    if config.kube.custom_network_cfg {
        let name = cluster
            .node()
            .borrow()
            .as_ref()
            .map(|f| k8s::eni_config_name(f, &config.kube.eni_config_keys));
        match name {
            Some(name) if name != k8s::DEFAULT_ENI_CONFIG_NAME => {
                if let Err(e) = cluster
                    .add_cninode_feature(k8s::FEATURE_CUSTOM_NETWORKING, &name)
                    .await
                {
                    metrics.pod_eni_error_count.inc(["nodeInit"]);
                    return Err(anyhow::anyhow!(e)
                        .context("Failed to add feature custom networking into CNINode"));
                }
                tracing::info!(eni_config = %name, "Enabled feature CustomNetworking in CNINode if not existing");
            }
            _ => tracing::error!("No ENIConfig could be found for this node"),
        }
    }
    let ipv6 = config.family.is_v6_only();
    let loop_ = sgp::advertise_trunk_feature(
        cluster.clone(),
        ipam.clone(),
        metrics.clone(),
        ipv6,
        max_enis,
        inner.clone(),
    );
    tasks.push(Task::new("CNINode SecurityGroupsForPods", async move {
        loop_.await;
        Ok(())
    }));
    let links = host.map(|h| h as Arc<dyn sgp::LinkIndex>);
    Ok(sgp::BranchPods::new(
        Arc::new(cluster.clone()),
        ipam.clone(),
        links,
        ipv6,
    ))
}

/// Pool targets from config and instance limits.
#[must_use]
pub fn targets(config: &Config, limits: pool::ec2_port::InstanceLimits) -> Targets {
    let max_enis = config
        .pool
        .max_eni
        .map_or(limits.max_enis, |m| m.min(limits.max_enis));
    Targets {
        warm_eni: config.pool.warm_eni_target,
        warm_ip: config.pool.warm_ip_target,
        minimum_ip: config.pool.minimum_ip_target,
        warm_prefix: config.pool.warm_prefix_target,
        prefix_delegation: config.pool.enable_prefix_delegation,
        max_enis,
        cidrs_per_eni: limits.ipv4_per_eni.saturating_sub(1),
        max_pods: config.pool.max_pods,
    }
}

/// The network cards other than 0 that serve pods: with `ENABLE_MULTI_NIC` in an IPv4
/// cluster, every card of the instance type but those holding only EFA ENIs (upstream
/// `markUnmanagedNetworkCards`); none otherwise (upstream marks every card but 0 unmanaged).
#[must_use]
pub fn serving_cards(
    config: &Config,
    limits: pool::ec2_port::InstanceLimits,
    enis: &[pool::ec2_port::AttachedEni],
) -> Vec<u32> {
    if !config.aws.enable_multi_nic || config.family != config::AddressFamily::V4 {
        return Vec::new();
    }
    (1..limits.network_cards)
        .filter(|card| {
            let on: Vec<_> = enis.iter().filter(|e| e.network_card == *card).collect();
            let efa_only = on.iter().any(|e| e.is_efa) && on.iter().all(|e| e.is_efa || e.is_excluded);
            if efa_only {
                tracing::info!(card, "network card holds only EFA ENIs: not used for pods (upstream markUnmanagedNetworkCards)");
            }
            !efa_only
        })
        .collect()
}

/// What the host netns shows of pods, read before any address is handed out: every `/32`
/// route of the main table and every `/128` IPv6 route with its device
/// (`dataplane::host_state`), plus the addresses only a pod rule (512/1536) names, with an empty
/// device; branch-ENI pods' addresses left out. See [`ipam::HostPodRoutes`].
pub async fn host_pod_evidence() -> Result<ipam::HostPodRoutes, String> {
    let mut out: ipam::HostPodRoutes =
        tokio::task::spawn_blocking(|| dataplane::host_state::pod_host_routes(""))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("read host routes: {e}"))?;
    let netlink = dataplane::NetNs::current()
        .map_err(|e| format!("host netns: {e}"))?
        .connect()
        .await
        .map_err(|e| format!("host netlink: {e}"))?;
    let observed = host::Observed::read(&netlink)
        .await
        .map_err(|e| format!("read host rules: {e}"))?;
    for ip in host::node::pod_rule_addresses(&observed) {
        if !out.iter().any(|(a, _)| *a == ip) {
            out.push((ip, String::new()));
        }
    }
    // A standard-mode branch pod's main-table route (through a veth with the pods' prefix)
    // names an address of the controller's branch ENI: never ipamd's.
    let branch = host::node::branch_pod_addresses(&observed);
    out.retain(|(ip, _)| !branch.contains(ip));
    Ok(out)
}

/// The daemon on the given ports ([`build`], then [`Daemon::serve`]): checkpoint restore, gRPC,
/// introspection and metrics, the pool loop with reconciliation, reclaim. `startup`: when `run`
/// began (node initialization and start-up durations count from it) and whether the API
/// server answered.
pub async fn run_composed<P, H>(
    config: Config,
    ports: Ports<P, H>,
    metrics: Arc<metrics::Metrics>,
    cluster: Option<k8s::Cluster>,
    startup: Startup,
    shutdown: CancellationToken,
) -> anyhow::Result<()>
where
    P: EniProvider + pool::reconcile_plan::ImdsView,
    H: pool::host_port::EniHost,
{
    build(config, ports, metrics, cluster, startup, shutdown)
        .await?
        .serve()
        .await
}

/// Builds the daemon on the given ports: the IPAM service restored from the checkpoint and the
/// host, stale pod rules pruned, IPv6 mode's prefix, the reply settings, and the long-running
/// tasks (made, not started: [`Daemon::serve`] starts them once the socket is bound).
pub async fn build<P, H>(
    config: Config,
    ports: Ports<P, H>,
    metrics: Arc<metrics::Metrics>,
    cluster: Option<k8s::Cluster>,
    startup: Startup,
    shutdown: CancellationToken,
) -> anyhow::Result<Daemon>
where
    P: EniProvider + pool::reconcile_plan::ImdsView,
    H: pool::host_port::EniHost,
{
    let Ports {
        provider,
        custom_network,
        host,
        not_ready,
        os_tables,
        tasks: port_tasks,
        vpc_v4_follow,
        trunking_compatible,
    } = ports;
    for w in &config.warnings {
        tracing::warn!(variable = w.var, kind = w.kind.as_str(), "CONFIG: {w}");
        metrics.config_warning(w.var, w.kind.as_str());
    }
    let limits = provider
        .instance_limits()
        .await
        .context("instance limits")?;
    let described = pool::ec2_port::NodeDescription::describe(&provider)
        .await
        .context("node init: describe the node's ENIs")?;
    metrics.startup_phase("ec2_describe");
    // Prefix delegation on a type without it (upstream `isConfigValid`): IPv4 falls back to
    // secondary IPs, loudly; IPv6 mode cannot start.
    let mut config = config;
    let requested = config.pool.enable_prefix_delegation;
    config.pool.enable_prefix_delegation = pool::policy::prefix_delegation_on(
        requested,
        config.family.is_v6_only(),
        limits.prefix_delegation,
        &described.network.instance_type,
    )?;
    if requested && !config.pool.enable_prefix_delegation {
        tracing::warn!(
            "Prefix delegation is not supported on non-nitro instance {} hence falling back to default (secondary IP) mode",
            described.network.instance_type
        );
        metrics.config_warning(
            "ENABLE_PREFIX_DELEGATION",
            config::WarningKind::Fallback.as_str(),
        );
    }
    let targets = targets(&config, limits);
    let per_eni = if targets.prefix_delegation {
        targets.cidrs_per_eni * pool::policy::PREFIX_SIZE
    } else {
        targets.cidrs_per_eni
    };
    metrics.set_limits(targets.max_enis, targets.max_enis * per_eni);
    let settings = IpamSettings {
        targets,
        add_wait_timeout: config.pool.add_wait_timeout,
        veth_prefix: config.node.veth_prefix.clone(),
        provisioning: !config.aws.disable_network_resource_provisioning,
    };
    // One pool per serving card, card 0 first, each with its checkpoint file (upstream's
    // names: `ipam.json`, `ipam-nic-N.json`).
    let pools: Vec<(u32, Box<dyn datastore::checkpoint::Checkpoint>)> = std::iter::once(0)
        .chain(serving_cards(&config, limits, &described.enis))
        .map(|card| {
            let path = ipam::pool_checkpoint_path(&config.node.backing_store, card);
            let c: Box<dyn datastore::checkpoint::Checkpoint> = Box::new(FileCheckpoint::new(path));
            (card, c)
        })
        .collect();
    let host_pods = host_pod_evidence().await;
    let (ipam, outcomes) = Ipam::start_pools(
        described,
        settings,
        config.pool.ip_cooldown_period,
        pools,
        move || host_pods,
        Arc::new(SystemClock),
        metrics.clone(),
    )
    .context("node init")?;
    ipam.index.hold_back_host(&not_ready);
    for (eni, table) in os_tables {
        ipam.index.set_eni_table(&eni, Some(table));
    }
    // Startup failures end the process before the metrics server runs, so only successes are
    // ever observable: they are the only ones recorded.
    metrics.node_initialization(true, startup.started.elapsed().as_secs_f64());
    for (card, outcome) in &outcomes {
        let card = *card;
        if let RestoreOutcome::Restored { pending, .. } = outcome {
            metrics
                .unrecovered_checkpoint_entries
                .add(u64::try_from(*pending).unwrap_or(u64::MAX));
        }
        let path = ipam::pool_checkpoint_path(&config.node.backing_store, card);
        match outcome {
            RestoreOutcome::RecoveredFromHost { error, recovered } => {
                tracing::error!(card, %error, recovered, "CHECKPOINT UNREADABLE: assignments rebuilt from host routes; unreadable file replaced");
            }
            RestoreOutcome::MissingRecoveredFromHost { recovered } => {
                tracing::error!(card, recovered, path = %path.display(), "CHECKPOINT MISSING but pods are wired on this host: their addresses were rebuilt from host routes and rules");
            }
            RestoreOutcome::Restored { from_host, .. } if *from_host > 0 => {
                tracing::error!(card, outcome = ?outcome, "checkpoint lacked addresses pods use on this host: recovered from host routes and rules");
            }
            other => tracing::info!(card, outcome = ?other, "checkpoint restored"),
        }
    }
    let ipam = Arc::new(ipam);
    if config.family.is_v6_only() {
        // Upstream's IPv6 mode (`setupENI` → `assignIPv6Prefix`): the primary ENI's /80,
        // delegated by EC2 now if it has none, serves every pod; no warm pool.
        let prefix = pool::run::init_ipv6_mode(&ipam, &provider)
            .await
            .context("IPv6 prefix of the primary ENI")?;
        tracing::info!(eni = %prefix.eni_id, prefix = %prefix.net, "IPv6 mode: pods get /128s of the primary ENI's prefix");
    }
    // Pod rules no pod holds (a teardown that failed, a pod gone while ipamd was away) would
    // shadow the next pod given that address: removed before the socket serves, and then by
    // the reclaim loop.
    let pod_rules = match host::HostNetwork::for_current_netns(host::BackendChoice::Auto).await {
        Ok(h) => Some(Arc::new(h)),
        Err(e) => {
            tracing::warn!(error = %e, "host netlink unavailable: stale pod rules are not pruned");
            None
        }
    };
    if let Some(h) = &pod_rules {
        match reclaim::prune_stale_pod_rules(&ipam, h.as_ref()).await {
            Ok(s) if !s.is_empty() => {
                tracing::warn!(addresses = ?s, "stale pod rules (no pod holds the address) removed at start");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "stale pod rules not pruned at start"),
        }
    }
    let vpc = node_init::reply_v4_cidrs(
        &ipam.node.vpc_v4_cidrs,
        &config.snat.exclude_snat_cidrs,
        config.snat.external_snat,
    );
    let reply = rpc::ReplySettings {
        vpc_v4_cidrs: vpc,
        vpc_v4_follow,
        use_external_snat: config.snat.external_snat,
        network_policy_mode: config
            .node
            .network_policy_mode
            .as_ref()
            .map(|m| m.as_str().to_owned())
            .unwrap_or_default(),
        multi_nic: config.aws.enable_multi_nic,
        node_ipv4: rpc::agent_node_ipv4(config.family, ipam.node.primary_ip),
        instance_id: ipam.node.instance_id.clone(),
        region: ipam.node.region.clone(),
        family: config.family,
        vpc_v6_cidrs: ipam
            .node
            .vpc_v6_cidrs
            .iter()
            .map(ToString::to_string)
            .collect(),
        node_ipv6: if config.family.is_v6_only() {
            ipam.node
                .primary_ipv6
                .map(|ip| ip.to_string())
                .unwrap_or_default()
        } else {
            String::new()
        },
        pod_annotations: cluster.clone().filter(|_| config.kube.annotate_pod_ip),
        pod_eni: None,
    };
    let mut debug = http::DebugSettings::from_config(&config);
    let mut tasks = port_tasks;
    let inner = shutdown.child_token();
    let mut reply = reply;
    if let (Some(mode), Some(cluster)) = (config.kube.pod_eni, &cluster) {
        reply.pod_eni = Some(
            start_pod_eni(
                &config,
                mode,
                cluster,
                &ipam,
                &metrics,
                pod_rules.clone(),
                trunking_compatible,
                ipam.settings.targets.max_enis,
                &inner,
                &mut tasks,
            )
            .await?,
        );
        debug.branch_pods.clone_from(&reply.pod_eni);
    }
    let failures = Arc::new(failures::AddFailures::new(metrics.clone()));
    {
        let failures = failures.clone();
        let spool = ipamd_proto::failure_spool::path(&config.node.socket_path);
        let cluster = cluster.clone();
        let token = inner.clone();
        tasks.push(Task::new("add failure reporter", async move {
            report_add_failures(failures, spool, cluster, token).await;
            Ok(())
        }));
    }
    if let Some(cluster) = &cluster {
        let (tx, rx) = tokio::sync::watch::channel(None);
        debug.eni_config = rx;
        tasks.push(follow_node(
            cluster,
            &config,
            limits,
            &ipam,
            tx,
            inner.clone(),
        ));
    }
    // As upstream's `StartNodeIPPoolManager`: no pool manager in IPv6 mode (no extra ENIs, no
    // IPv4 addresses); the host port is not needed either.
    if config.family.is_v6_only() {
        if config.kube.pod_eni.is_some() {
            // Security groups for pods: the trunk is still awaited and set up (upstream's
            // `checkForTrunkENI`).
            let (ipam, token, tick) = (ipam.clone(), inner.clone(), config.pool.pool_tick);
            tasks.push(Task::new("trunk ENI (IPv6 mode)", async move {
                pool::run::await_trunk(ipam, provider, host, tick, token).await;
                Ok(())
            }));
        } else {
            drop((provider, host));
        }
    } else {
        let ipam = ipam.clone();
        let token = inner.clone();
        let tick = config.pool.pool_tick;
        // Before the socket serves: addresses released before a restart that EC2 may still
        // describe (and the start-up Describe registered again) are withdrawn now, so no ADD
        // answered once the socket serves can get one (the pool loop's own restore is then a
        // no-op). Issue 28 finding 1.
        let mut reconciler = pool::reconciler::Reconciler::new();
        reconciler.restore(&ipam);
        tasks.push(Task::new("pool loop", async move {
            pool::run::run(
                Manager::with_host(provider, host)
                    .with_custom_network(custom_network)
                    .with_every_ipv6_prefix(config.family == config::AddressFamily::DualStack),
                reconciler,
                ipam,
                tick,
                token,
            )
            .await;
            Ok(())
        }));
    }
    {
        // the start-up phases, and REMOVE_STARTUP_TAINT: started once the socket is bound
        let taint = cluster.clone().zip(config.kube.startup_taint.clone());
        let run = readiness::run(ipam.clone(), metrics.clone(), taint, inner.clone());
        tasks.push(Task::new("readiness", async move {
            run.await;
            Ok(())
        }));
    }
    let host_net = pod_rules.clone();
    if let Some(grace) = config.pool.reclaim_unwired_after {
        let ipam = ipam.clone();
        let reclaimer = reclaim::Reclaimer::new(grace, &config.node.veth_prefix);
        let period = (grace / 4).clamp(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(60),
        );
        let token = inner.clone();
        tasks.push(Task::new("reclaim", async move {
            reclaim::run(ipam, reclaimer, period, pod_rules, token).await;
            Ok(())
        }));
    }
    if !config.http.disable_introspection {
        let router = http::introspection_router(ipam.clone(), debug, failures.clone());
        let bind = config.http.introspection_bind.clone();
        let token = inner.clone();
        tasks.push(Task::new("introspection server", async move {
            http::serve(router, bind, token)
                .await
                .context("introspection server")
        }));
    }
    if !config.http.disable_metrics {
        let router = http::metrics_router(metrics.clone(), config.http.metrics_naming);
        let bind = config::BindAddress::Tcp(config.http.metrics_bind.to_string());
        let token = inner.clone();
        tasks.push(Task::new("metrics server", async move {
            http::serve(router, bind, token)
                .await
                .context("metrics server")
        }));
    }
    Ok(Daemon {
        config,
        ipam,
        reply,
        host: host_net,
        metrics,
        startup,
        shutdown,
        inner,
        tasks,
        failures,
    })
}

/// How often the failure spool (plugin-side failures) is read.
const FAILURE_SPOOL_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// Failed ADDs to the outside: the plugin's spool read into the log (counted there), and each
/// failure a Warning Event on its pod when a Kubernetes client is configured.
async fn report_add_failures(
    failures: Arc<failures::AddFailures>,
    spool: std::path::PathBuf,
    cluster: Option<k8s::Cluster>,
    token: CancellationToken,
) {
    let Some(mut events) = failures.take_events() else {
        return;
    };
    let mut tick = tokio::time::interval(FAILURE_SPOOL_PERIOD);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = tick.tick() => {
                let failures = failures.clone();
                let spool = spool.clone();
                let _ = tokio::task::spawn_blocking(move || failures.ingest_spool(&spool)).await;
            }
            Some(f) = events.recv() => {
                let Some(cluster) = &cluster else { continue };
                let message = format!("failed to assign an IP address to container: {}", f.message);
                match cluster.pod_warning(&f.namespace, &f.name, &f.code, &message).await {
                    Ok(true) => {}
                    Ok(false) => tracing::debug!(ns = %f.namespace, pod = %f.name, "no Event: the pod does not exist"),
                    Err(e) => tracing::warn!(ns = %f.namespace, pod = %f.name, reason = %f.code, error = %e, "Warning Event on the pod not written"),
                }
            }
        }
    }
}

/// The daemon, built ([`build`]: checkpoint restored, host pruned, tasks made) and not yet
/// serving.
#[derive(Debug)]
pub struct Daemon {
    config: Config,
    ipam: Arc<Ipam>,
    reply: rpc::ReplySettings,
    /// The node namespace's host networking (the conntrack flush at handout), when netlink
    /// could be reached.
    host: Option<Arc<host::HostNetwork>>,
    metrics: Arc<metrics::Metrics>,
    startup: Startup,
    shutdown: CancellationToken,
    inner: CancellationToken,
    tasks: Vec<Task>,
    failures: Arc<failures::AddFailures>,
}

impl Daemon {
    /// Binds the socket first, then starts every task (gRPC, the pool loop, reclaim, the HTTP
    /// servers, the ports' own) in one supervised set: no loop runs before this instance owns
    /// the socket. Runs until `shutdown` or the first task that fails; then no new ENI/IP
    /// changes, every task is awaited, and the socket this process bound is removed.
    pub async fn serve(self) -> anyhow::Result<()> {
        let Self {
            config,
            ipam,
            reply,
            host: host_net,
            metrics,
            startup,
            shutdown,
            inner,
            tasks: work,
            failures,
        } = self;
        let listener = rpc::bind_socket(&config.node.socket_path)?;
        let bound = rpc::socket_identity(&config.node.socket_path);
        metrics.ipamd_startup(
            None,
            startup.with_api_server,
            startup.started.elapsed().as_secs_f64(),
        );
        tracing::info!(socket = %config.node.socket_path.display(), elapsed = ?startup.started.elapsed(), "serving CNIBackend");
        match reply.network_policy_mode.as_str() {
            "" => tracing::info!(
                "NETWORK_POLICY_ENFORCING_MODE is not set: the plugin does not hand pods to the network policy agent"
            ),
            mode => tracing::info!(
                mode,
                "NetworkPolicyMode handed to the plugin: every ADD waits for the network policy agent (npa.sock) to enforce the pod's policy"
            ),
        }
        let mut tasks = tokio::task::JoinSet::new();
        {
            let ipam = ipam.clone();
            let token = inner.clone();
            let gate = if config.kube.custom_network_cfg
                && !config.aws.disable_network_resource_provisioning
            {
                rpc::ReadyGate::OnceAnEniHasAddresses
            } else {
                rpc::ReadyGate::Serving
            };
            tasks.spawn(async move {
                rpc::serve(listener, ipam, reply, host_net, failures, gate, token)
                    .await
                    .context("grpc server")
            });
        }
        for task in work {
            let Task {
                name,
                work,
                drop_on_stop,
            } = task;
            let stop = inner.clone();
            tasks.spawn(async move {
                let result = if drop_on_stop {
                    tokio::select! {
                        r = work => r,
                        () = stop.cancelled() => Ok(()),
                    }
                } else {
                    work.await
                };
                result.with_context(|| format!("task {name}"))
            });
        }

        let result = tokio::select! {
            () = shutdown.cancelled() => Ok(()),
            Some(r) = tasks.join_next() => r.map_err(anyhow::Error::from).and_then(|r| r),
        };
        // No ENI/IP changes once shutting down.
        ipam.begin_shutdown();
        inner.cancel();
        while let Some(r) = tasks.join_next().await {
            if let Ok(Err(e)) = r {
                tracing::warn!(error = %e, "task ended with error during shutdown");
            }
        }
        // Only the socket this process bound: another instance may have bound the path since.
        if bound.is_some() && rpc::socket_identity(&config.node.socket_path) == bound {
            let _ = std::fs::remove_file(&config.node.socket_path);
        }
        result
    }
}
