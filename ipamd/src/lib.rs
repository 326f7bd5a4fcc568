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
mod daemon;
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
pub mod task;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, LogLevel, LogTarget};

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
