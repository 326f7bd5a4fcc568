//! Plugin logging: JSON lines appended to `pluginLogFile` at `pluginLogLevel`, never stdout.
//! A log file that cannot be opened disables logging rather than failing the verb.

use std::fs::OpenOptions;
use std::sync::Mutex;

use tracing::level_filters::LevelFilter;
use tracing::subscriber::DefaultGuard;

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
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_current_span(true)
        .with_writer(Mutex::new(file))
        .with_max_level(level)
        .finish();
    Some(tracing::subscriber::set_default(subscriber))
}
