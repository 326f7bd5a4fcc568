//! The daemon composed: the ports picked from `Config`, the index opened, every feature's tasks
//! made and run in one supervised set once the socket is bound; shutdown wired. The list of
//! features is [`build`]; each feature owns its start (`sgp::start`, `pool::run::task`,
//! `reclaim::task`, `http::servers`, …). Must not: decide policy or parse env.

mod index;
mod ports;

use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ProviderKind};
use crate::ipam::Ipam;
use crate::pool::ec2_port::EniProvider;
use crate::task::Task;
use crate::{
    capacity, failures, flows, host, http, instance, k8s, metrics, pool, readiness, reclaim,
    residency, rpc, setup_timings, sgp,
};
pub use ports::Ports;

/// [`run`] until `shutdown` is cancelled.
pub(crate) async fn run_until(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    // One ipamd per node: the lock first (held until exit; an instance of ours still running, e.g.
    // the old pod of a maxSurge update, has it until it has exited), then the socket (an instance
    // that takes no lock: another CNI's aws-node during a takeover).
    let Some(_node_lock) = instance::NodeLock::acquire(
        &instance::LockPaths::new(&config.node.socket_path, &config.node.backing_store),
        &shutdown,
        instance::LOCK_POLL,
    )
    .await?
    else {
        return Ok(());
    };
    if !instance::wait_for_socket(&config.node.socket_path, &shutdown).await {
        return Ok(());
    }
    // The Kubernetes client's tasks (the Node and ENIConfig watches, the event poster) run
    // beside everything that follows, from before the API-server wait until the daemon has
    // stopped, and are awaited then (k8s::ClusterTasks::beside): nothing detached.
    let (cluster, kube_tasks) = k8s::startup::start_kubernetes(&config, &shutdown).await?;
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
        Some(cluster) => k8s::startup::wait_for_kubernetes(&config, cluster, &shutdown).await?,
        None => false,
    };
    let startup = Startup {
        started,
        with_api_server,
    };
    if shutdown.is_cancelled() {
        return Ok(());
    }
    let metrics = Arc::new(metrics::Metrics::new());
    metrics.begin_startup(started);
    // The ports, picked from Config: the EC2 provider with host networking (node init first),
    // or the test-only in-memory provider without.
    match config.aws.provider.clone() {
        #[cfg(feature = "memory-provider")]
        ProviderKind::Memory(spec) => {
            let ports = ports::memory(&config, spec)?;
            run_composed(config, ports, metrics, cluster, startup, shutdown).await
        }
        ProviderKind::Ec2 => {
            let ports = ports::ec2(&config, cluster.as_ref(), &metrics, &shutdown).await?;
            run_composed(config, ports, metrics, cluster, startup, shutdown).await
        }
    }
}

/// What `run` measured before the ports existed, for the start-up metrics.
#[derive(Debug, Clone, Copy)]
pub struct Startup {
    /// When `run` began (node initialization and start-up durations count from here).
    pub started: std::time::Instant,
    /// The API server answered during start-up (`with_api_server` label).
    pub with_api_server: bool,
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

/// Builds the daemon on the given ports: the index opened (checkpoints restored, the host's
/// evidence read, stale pod rules pruned), the reply settings, and every feature's tasks (made,
/// not started: [`Daemon::serve`] starts them once the socket is bound).
pub async fn build<P, H>(
    mut config: Config,
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
        mut tasks,
        vpc_v4_follow,
        trunking_compatible,
    } = ports;
    let index::Opened {
        ipam,
        limits,
        host: host_net,
    } = index::open(
        &mut config,
        &provider,
        &metrics,
        startup,
        &not_ready,
        os_tables,
    )
    .await?;
    let inner = shutdown.child_token();
    // Conntrack-safe handouts: the task that owns the table walks and the events ledger.
    let flows = host_net.as_ref().map(|h| {
        let (flows, task) = flows::start(h.clone(), index::free_addresses(&ipam), &inner);
        tasks.push(task);
        flows
    });
    let mut reply = rpc::ReplySettings::new(&config, &ipam, cluster.clone(), vpc_v4_follow);
    let mut debug = http::DebugSettings::from_config(&config);
    let failures = Arc::new(failures::AddFailures::new(metrics.clone()));
    if let (Some(mode), Some(cluster)) = (config.kube.pod_eni, &cluster) {
        let max_enis = ipam.settings.targets.max_enis;
        let branch = sgp::start(
            &config,
            mode,
            cluster,
            &ipam,
            &metrics,
            host_net.clone(),
            trunking_compatible,
            max_enis,
            &inner,
            &mut tasks,
        )
        .await?;
        debug.branch_pods = Some(branch.clone());
        reply.pod_eni = Some(branch);
    }
    tasks.push(failures::reporter(
        failures.clone(),
        &config.node.socket_path,
        cluster.clone(),
        inner.clone(),
    ));
    tasks.push(setup_timings::listener(
        metrics.clone(),
        &config.node.socket_path,
        inner.clone(),
    ));
    if let Some(cluster) = &cluster {
        let (tx, rx) = tokio::sync::watch::channel(None);
        debug.eni_config = rx;
        tasks.push(k8s::node_follower::follow_node(
            cluster,
            &config,
            limits,
            &ipam,
            tx,
            inner.clone(),
        ));
    }
    tasks.extend(pool::run::task(
        &config,
        &ipam,
        provider,
        host,
        custom_network,
        &inner,
    ));
    tasks.push(capacity::task(
        &ipam,
        &metrics,
        &debug.capacity,
        capacity::Publication {
            cluster: cluster.clone(),
            condition: config.kube.address_capacity_condition,
            taint: config.kube.address_capacity_taint,
            inventory: config.kube.subnet_inventory.clone(),
        },
        &inner,
    ));
    let taint = cluster.clone().zip(config.kube.startup_taint.clone());
    tasks.push(readiness::task(&ipam, &metrics, taint, &inner));
    if config.node.release_code_pages {
        tasks.push(residency::task(
            &ipam,
            &metrics,
            config.node.read_code_on_demand,
            &inner,
        ));
    }
    tasks.extend(reclaim::task(&config, &ipam, host_net.clone(), &inner));
    tasks.extend(http::servers(
        &config,
        &ipam,
        &metrics,
        debug,
        failures.clone(),
        &inner,
    ));
    Ok(Daemon {
        config,
        ipam,
        reply,
        host: host_net,
        flows,
        metrics,
        startup,
        shutdown,
        inner,
        tasks,
        failures,
    })
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
    /// The conntrack safety of handouts, when host networking could be reached.
    flows: Option<flows::Flows>,
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
            flows,
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
                let host = host_net
                    .zip(flows)
                    .map(|(network, flows)| rpc::NodeHost { network, flows });
                rpc::serve(listener, ipam, reply, host, failures, gate, token)
                    .await
                    .context("grpc server")
            });
        }
        for task in work {
            let (name, work, drop_on_stop) = task.into_parts();
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
