//! The logging section: ipamd's level and target (`AWS_VPC_K8S_CNI_LOGLEVEL`,
//! `AWS_VPC_K8S_CNI_LOG_FILE`). Must not: install a subscriber or open files (the composition
//! root does).

use std::path::PathBuf;

use super::env::Env;

/// The default ipamd log file.
pub const DEFAULT_LOG_FILE: &str = "/host/var/log/aws-routed-eni/ipamd.log";

/// Where a log goes (`AWS_VPC_K8S_CNI_LOG_FILE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    /// `stdout`.
    Stdout,
    /// `stderr`.
    Stderr,
    /// A file path.
    File(PathBuf),
}

/// Log level (`AWS_VPC_K8S_CNI_LOGLEVEL`), case-insensitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// `DEBUG`.
    Debug,
    /// `INFO`.
    Info,
    /// `WARN`.
    Warn,
    /// `ERROR`.
    Error,
    /// `FATAL` (logged as error).
    Fatal,
}

/// ipamd's own log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSection {
    /// `AWS_VPC_K8S_CNI_LOGLEVEL` (DEBUG).
    pub level: LogLevel,
    /// `AWS_VPC_K8S_CNI_LOG_FILE` ([`DEFAULT_LOG_FILE`]).
    pub file: LogTarget,
}

impl LogSection {
    /// Reads the section; an unknown level falls back to DEBUG.
    pub(super) fn parse(e: &mut Env<'_>) -> Self {
        // An unknown level falls back to DEBUG.
        let level = match e
            .get("AWS_VPC_K8S_CNI_LOGLEVEL")
            .map(str::to_ascii_uppercase)
            .as_deref()
        {
            None | Some("DEBUG") => LogLevel::Debug,
            Some("INFO") => LogLevel::Info,
            Some("WARN" | "WARNING") => LogLevel::Warn,
            Some("ERROR") => LogLevel::Error,
            Some("FATAL") => LogLevel::Fatal,
            Some(v) => {
                let v = v.to_owned();
                e.fallback("AWS_VPC_K8S_CNI_LOGLEVEL", &v, "DEBUG");
                LogLevel::Debug
            }
        };
        let file = match e.get("AWS_VPC_K8S_CNI_LOG_FILE") {
            None => LogTarget::File(PathBuf::from(DEFAULT_LOG_FILE)),
            Some(v) if v.eq_ignore_ascii_case("stdout") => LogTarget::Stdout,
            Some(v) if v.eq_ignore_ascii_case("stderr") => LogTarget::Stderr,
            Some(v) => LogTarget::File(PathBuf::from(v)),
        };
        Self { level, file }
    }
}

#[cfg(test)]
mod tests {
    use super::super::env::with_warnings;
    use super::*;

    #[test]
    fn levels_and_targets() {
        let (l, w) = with_warnings(&[], LogSection::parse);
        assert_eq!(l.level, LogLevel::Debug);
        assert_eq!(l.file, LogTarget::File(DEFAULT_LOG_FILE.into()));
        assert!(w.is_empty());
        for (level, want) in [
            ("info", LogLevel::Info),
            ("Warning", LogLevel::Warn),
            ("ERROR", LogLevel::Error),
            ("fatal", LogLevel::Fatal),
        ] {
            let (l, _) = with_warnings(&[("AWS_VPC_K8S_CNI_LOGLEVEL", level)], LogSection::parse);
            assert_eq!(l.level, want, "{level}");
        }
        for (file, want) in [
            ("STDOUT", LogTarget::Stdout),
            ("stderr", LogTarget::Stderr),
            ("/tmp/x.log", LogTarget::File("/tmp/x.log".into())),
        ] {
            let (l, _) = with_warnings(&[("AWS_VPC_K8S_CNI_LOG_FILE", file)], LogSection::parse);
            assert_eq!(l.file, want, "{file}");
        }
    }

    #[test]
    fn unknown_level_is_debug_with_a_warning() {
        let (l, w) = with_warnings(&[("AWS_VPC_K8S_CNI_LOGLEVEL", "chatty")], LogSection::parse);
        assert_eq!(l.level, LogLevel::Debug);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].var, "AWS_VPC_K8S_CNI_LOGLEVEL");
    }
}
