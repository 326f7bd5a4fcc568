//! The network fabric: one namespace per instance whose links are its ENIs, a VPC router
//! namespace (delivery, source/destination check, gateways), an internet namespace behind an
//! IGW, and IMDS / EC2 endpoints (and optionally a Kubernetes API relay) inside every node. Reconciled from the world's `FabricView`.
//! Owns every `vsim<run>-*` namespace of its run; must never touch the root netns or another
//! run's namespaces (except removing those of crashed runs).

pub mod apply;
pub mod branch;
pub mod exec;
pub mod groups;
pub mod model;
pub mod names;
pub mod netns;
pub mod observe;
pub mod plan;
pub mod serve;
mod world;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::task::AbortHandle;

use crate::view::FabricView;
pub use exec::ExecError;
use model::Desired;
pub use names::RunNames;
pub use netns::NetnsError;

/// What the fabric needs from the simulated EC2 world.
pub trait FabricWorld: Send + Sync + 'static {
    /// The snapshot to reconcile to, at the world's "now".
    fn fabric_view(&self) -> FabricView;
    /// IMDS as seen from `instance_id`.
    fn imds_router(&self, instance_id: &str) -> axum::Router;
    /// The EC2 Query API.
    fn ec2_router(&self) -> axum::Router;
    /// A change notification, if the world has one: the loop reconciles as soon as it fires
    /// instead of at the next poll (polling stays, for time-driven changes like attach delays).
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// The fabric could not be built or reconciled.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// A kernel command failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// Entering a namespace or registering the run failed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The reconcile thread could not be started.
    #[error("reconcile thread: {0}")]
    Thread(std::io::Error),
}

/// Tuning of a fabric run.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    /// Run id (namespace prefix `vsim<run id>-`); fresh when `None`.
    pub run_id: Option<String>,
    /// How often the world is polled.
    pub poll: Duration,
    /// How often the kernel is re-read even when the world did not change (heals drift).
    pub resync: Duration,
    /// Where the Kubernetes API relay on every node's `169.254.169.201:443` forwards to
    /// (kubesim's loopback HTTPS address); no relay when `None`.
    pub kube_upstream: Option<std::net::SocketAddr>,
}

impl Default for FabricConfig {
    fn default() -> Self {
        Self {
            run_id: None,
            poll: Duration::from_millis(100),
            resync: Duration::from_secs(2),
            kube_upstream: None,
        }
    }
}

/// Progress of the reconcile loop, for callers that wait or report.
#[derive(Debug, Clone, Default)]
pub struct FabricStatus {
    /// Completed reconciles that changed something.
    pub changes: u64,
    /// Error of the last reconcile, if it failed.
    pub last_error: Option<String>,
}

struct Shared {
    names: RunNames,
    world: Arc<dyn FabricWorld>,
    rt: Handle,
    stop: AtomicBool,
    /// serialises reconciles (loop vs `converge`) and owns the node servers
    servers: Mutex<serve::NodeServers>,
    status: Mutex<FabricStatus>,
}

/// A running fabric. Dropping it stops the loop, stops the servers and deletes every namespace
/// of the run (also during a panic's unwinding).
pub struct Fabric {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    echo: Option<AbortHandle>,
    down: bool,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("run", &self.shared.names.run_id())
            .finish_non_exhaustive()
    }
}

impl Fabric {
    /// Remove crashed runs' leftovers, build the router and internet namespaces, reconcile once
    /// and start the reconcile loop. Blocking (runs `ip`); servers go on `rt`.
    pub fn start(
        world: Arc<dyn FabricWorld>,
        rt: Handle,
        config: &FabricConfig,
    ) -> Result<Self, FabricError> {
        let removed = netns::remove_stale_runs();
        if !removed.is_empty() {
            tracing::info!(?removed, "removed namespaces of crashed runs");
        }
        let names = RunNames::new(config.run_id.clone().unwrap_or_else(names::fresh_run_id));
        netns::register_run(&names)?;
        let shared = Arc::new(Shared {
            names,
            world,
            rt,
            stop: AtomicBool::new(false),
            servers: Mutex::new(serve::NodeServers::new(config.kube_upstream)),
            status: Mutex::new(FabricStatus::default()),
        });
        // from here on, Drop cleans up whatever was built
        let mut fabric = Self {
            shared: shared.clone(),
            thread: None,
            echo: None,
            down: false,
        };
        let view = shared.world.fabric_view();
        apply::build_base(&shared.names, &view.vpc_cidrs, view.vpc_ipv6_cidr)?;
        fabric.echo = Some(serve::serve_echo(
            &shared.rt,
            &shared.names,
            view.vpc_ipv6_cidr.is_some(),
        )?);
        fabric.converge()?;
        let (poll, resync) = (config.poll, config.resync);
        let loop_shared = shared.clone();
        fabric.thread = Some(
            std::thread::Builder::new()
                .name("vpcsim-fabric".into())
                .spawn(move || reconcile_loop(&loop_shared, poll, resync))
                .map_err(FabricError::Thread)?,
        );
        Ok(fabric)
    }

    /// Names of this run's namespaces.
    pub fn names(&self) -> &RunNames {
        &self.shared.names
    }

    /// Reconcile now, on the calling thread (blocking); returns the number of operations.
    pub fn converge(&self) -> Result<usize, FabricError> {
        converge(
            &self.shared,
            &Desired::from_view(&self.shared.world.fabric_view()),
        )
    }

    /// The environment for an SDK client (ipamd) inside the node of `instance_id`; run it with
    /// `ip netns exec <names().node_ns(instance_id)>`.
    pub fn node_env(&self, instance_id: &str) -> Vec<(String, String)> {
        let region = self.shared.world.fabric_view().region;
        names::node_env(
            &region,
            &self.shared.names.node_ns(instance_id),
            instance_id,
        )
    }

    /// Progress of the loop.
    pub fn status(&self) -> FabricStatus {
        self.shared
            .status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Stop and delete everything; returns the errors of deletes that failed.
    pub fn shutdown(mut self) -> Vec<ExecError> {
        self.stop()
    }

    fn stop(&mut self) -> Vec<ExecError> {
        if self.down {
            return Vec::new();
        }
        self.down = true;
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(e) = self.echo.take() {
            e.abort();
        }
        if let Ok(mut s) = self.shared.servers.lock() {
            s.stop_all();
        }
        let errors = apply::teardown(&self.shared.names);
        netns::unregister_run(&self.shared.names);
        errors
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for e in self.stop() {
            tracing::warn!(error = %e, "fabric teardown");
        }
    }
}

fn converge(shared: &Shared, desired: &Desired) -> Result<usize, FabricError> {
    // a poisoned lock only means a previous reconcile panicked; the kernel is re-read anyway
    let mut servers = shared
        .servers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let observed = observe::observe(&shared.names)?;
    let ops = plan::plan(desired, &observed);
    let result = apply::apply(&shared.names, &ops);
    servers.sync(
        &shared.rt,
        &shared.names,
        shared.world.as_ref(),
        desired.nodes.keys(),
    );
    drop(servers);
    let mut status = shared
        .status
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match result {
        Ok(()) => {
            if !ops.is_empty() {
                status.changes += 1;
                tracing::debug!(ops = ops.len(), "fabric reconciled");
            }
            status.last_error = None;
            Ok(ops.len())
        }
        Err(e) => {
            status.last_error = Some(e.to_string());
            Err(e.into())
        }
    }
}

/// Sleep up to `poll`, waking early (10 ms granularity) when the world signals a change or the
/// fabric is stopping. Runtime-free: only the watch channel's version counter is read.
fn wait_for_change(
    shared: &Shared,
    changes: &mut Option<tokio::sync::watch::Receiver<u64>>,
    poll: Duration,
) {
    const STEP: Duration = Duration::from_millis(10);
    let until = Instant::now() + poll;
    while Instant::now() < until && !shared.stop.load(Ordering::SeqCst) {
        if let Some(rx) = changes.as_mut()
            && rx.has_changed().unwrap_or(false)
        {
            rx.mark_unchanged();
            return;
        }
        std::thread::sleep(STEP);
    }
}

fn reconcile_loop(shared: &Shared, poll: Duration, resync: Duration) {
    let mut changes = shared.world.changes();
    let mut last: Option<Desired> = None;
    let mut last_full = Instant::now();
    while !shared.stop.load(Ordering::SeqCst) {
        let desired = Desired::from_view(&shared.world.fabric_view());
        if last.as_ref() != Some(&desired) || last_full.elapsed() >= resync {
            match converge(shared, &desired) {
                Ok(_) => last = Some(desired),
                Err(e) => {
                    tracing::warn!(error = %e, "fabric reconcile failed; retrying");
                    last = None;
                }
            }
            last_full = Instant::now();
        }
        wait_for_change(shared, &mut changes, poll);
    }
}

impl Fabric {
    /// `start` for the simulated EC2 world.
    pub fn start_world(
        world: Arc<crate::World>,
        rt: Handle,
        config: &FabricConfig,
    ) -> Result<Self, FabricError> {
        Self::start(Arc::new(world), rt, config)
    }
}
