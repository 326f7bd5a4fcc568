//! Plugin logging: zap-shaped JSON lines at `pluginLogLevel`, appended to `pluginLogFile` and
//! rotated as `plugin.log` always was (100 MB, 5 gzip backups), or written to the process's
//! stderr/stdout when `pluginLogFile` names that stream (stdout only when the configuration asks
//! for it). The file is opened by the first line written; one that cannot be opened discards the
//! lines rather than failing the verb. Must not: write the CNI result.

use tracing::level_filters::LevelFilter;
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;

use crate::spec::netconf::{LogLevel, LogSink, NetConf};

/// Installs the logger for the current thread; logging stops when the guard drops.
pub fn init(conf: &NetConf) -> Option<DefaultGuard> {
    init_sink(&conf.plugin_log_file, conf.plugin_log_level)
}

/// The logger writing to `sink` at `level` for the current thread (a file that cannot be opened: no
/// logging); also `egress-cni`'s, whose `pluginLogFile`/`pluginLogLevel` are read the same way.
/// The file is opened by the first line at the level, not before: an ADD that logs nothing (a
/// success at `Warn`) spends no time creating, listing and pruning the log directory.
pub fn init_sink(sink: &LogSink, level: LogLevel) -> Option<DefaultGuard> {
    match sink {
        LogSink::File(path) => {
            let file = logging::open_rotating_lazily(path, logging::Rotation::default());
            Some(install(file, level))
        }
        LogSink::Stderr => Some(install(std::io::stderr, level)),
        LogSink::Stdout => Some(install(std::io::stdout, level)),
    }
}

fn install<W>(writer: W, level: LogLevel) -> DefaultGuard
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let level = match level {
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Info => LevelFilter::INFO,
        LogLevel::Warn => LevelFilter::WARN,
        LogLevel::Error => LevelFilter::ERROR,
    };
    // Our crates at the configured level; libraries (h2, tonic, hyper) only when they warn.
    let filter = Targets::new()
        .with_target("aws_cni", level)
        .with_target("dataplane", level)
        .with_default(LevelFilter::WARN.min(level));
    let subscriber = tracing_subscriber::registry().with(filter).with(
        tracing_subscriber::fmt::layer()
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(logging::ZapJson)
            .with_writer(writer),
    );
    tracing::subscriber::set_default(subscriber)
}
