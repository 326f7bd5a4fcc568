//! Plugin logging: JSON lines appended to `pluginLogFile` at `pluginLogLevel`, never stdout.
//! A log file that cannot be opened disables logging rather than failing the verb.

use std::fs::OpenOptions;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;

use crate::spec::netconf::{LogLevel, NetConf};

/// Installs the file logger for the current thread; logging stops when the guard drops.
pub fn init(conf: &NetConf) -> Option<DefaultGuard> {
    let path = conf.plugin_log_file.as_ref()?;
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .ok()?;
    let level = match conf.plugin_log_level {
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
            .json()
            .with_current_span(true)
            .with_writer(Mutex::new(file)),
    );
    Some(tracing::subscriber::set_default(subscriber))
}
