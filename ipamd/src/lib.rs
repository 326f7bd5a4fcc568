//! ipamd, the library of the L-IPAMD daemon: its modules, logging, and [`run`] (the daemon and
//! the signal watcher side by side). The daemon is composed in `daemon` (ports from `Config`,
//! the index opened, every feature's tasks in one supervised set). Must not (here): decide
//! policy, parse env (`config` does), start work (the features do, through `daemon`).
//!
//! Layers, lowest first: the `ipam-core` crate (datastore, pool policy, reconcile plan, EC2 port;
//! re-exported as `datastore` and `pool::{policy, reconcile_plan, ec2_port}`); `config`, `metrics`,
//! `task`; `ipam` (the index, the pool signal, node state, the pod flows); the executors and edges
//! (`pool`'s manager and reconciler, `pods`, `rpc`, `http`, `sgp`, `reclaim`, `readiness`,
//! `failures`, `residency`); the adapters (`aws`, `host`, `k8s`, `node_init`, `instance`); `daemon`; beside them
//! `status`, the `ipamd status` client of the node's own introspection. docs/architecture.md draws
//! it; `tests/module_layering.rs` keeps it acyclic.

#![warn(missing_docs)]

pub mod aws;
pub mod capacity;
pub mod config;
mod daemon;
pub use ipam_core::datastore;
pub mod failures;
pub mod flows;
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
pub mod residency;
pub mod rpc;
pub mod setup_timings;
pub mod sgp;
pub mod status;
pub mod task;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, LogLevel, LogTarget};

/// Initialises `tracing` to `AWS_VPC_K8S_CNI_LOG_FILE` at `AWS_VPC_K8S_CNI_LOGLEVEL`, in zap's JSON
/// line shape ([`logging`]); a file is rotated at 100 MB into 5 gzip backups, so a node's disk does
/// not fill with ipamd's DEBUG log.
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

/// Runs ipamd until SIGTERM/SIGINT: the daemon and the signal watcher side by side (nothing
/// detached); the watcher cancels the daemon's token and ends with it.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let done = CancellationToken::new();
    let (result, ()) = tokio::join!(
        async {
            let r = daemon::run_until(config, shutdown.clone()).await;
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
