//! Plugin logging: upstream's zap JSON lines appended to `pluginLogFile` at `pluginLogLevel`,
//! rotated as upstream's lumberjack rotates `plugin.log` (100 MB, 5 gzip backups), never stdout.
//! A log file that cannot be opened disables logging rather than failing the verb.

use tracing::level_filters::LevelFilter;
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;

use crate::spec::netconf::{LogLevel, NetConf};

/// Installs the file logger for the current thread; logging stops when the guard drops.
pub fn init(conf: &NetConf) -> Option<DefaultGuard> {
    init_file(conf.plugin_log_file.as_deref(), conf.plugin_log_level)
}

/// The file logger of `path` at `level` for the current thread (no file: no logging); also
/// `egress-cni`'s, whose `pluginLogFile`/`pluginLogLevel` upstream reads the same way.
pub fn init_file(path: Option<&std::path::Path>, level: LogLevel) -> Option<DefaultGuard> {
    let file = logging::open_rotating(path?, logging::Rotation::default()).ok()?;
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
            .with_writer(file),
    );
    Some(tracing::subscriber::set_default(subscriber))
}
