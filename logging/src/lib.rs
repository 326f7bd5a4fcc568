//! The node's log files, shared by `aws-cni` and `ipamd`: one JSON object per line in zap's
//! production shape (`level`, `ts`, `caller`, `msg`, then the event's and its spans' fields at the
//! top level), and size-based rotation with lumberjack's numbers (100 MB, 5 backups,
//! gzip-compressed). Why this shape: log pipelines already parse `ipamd.log`/`plugin.log` in it.
//! Backups older than 30 days are deleted (lumberjack's `MaxAge`). Must not: decide what is logged,
//! or at which level.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use file_rotate::compression::Compression;
use file_rotate::suffix::{AppendTimestamp, FileLimit};
use file_rotate::{ContentLimit, FileRotate};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use time::macros::format_description;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Lumberjack's `MaxSize`: a log file is rotated once it passes 100 MB.
pub const MAX_BYTES: usize = 100 * 1024 * 1024;
/// Lumberjack's `MaxBackups`.
pub const MAX_BACKUPS: usize = 5;
/// Lumberjack's `MaxAge`: backups older than 30 days are deleted.
pub const MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Rotation limits (the production numbers by default; tests use small ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate once the file passes this many bytes (after a complete write).
    pub max_bytes: usize,
    /// Rotated files kept (older ones are deleted); rotated files are gzip-compressed.
    pub max_backups: usize,
    /// Rotated files older than this are deleted (at open and after every rotation).
    pub max_age: Duration,
}

impl Default for Rotation {
    fn default() -> Self {
        Self {
            max_bytes: MAX_BYTES,
            max_backups: MAX_BACKUPS,
            max_age: MAX_AGE,
        }
    }
}

/// A rotating, appending log file: rotated files are `<name>.<timestamp>.gz` beside it, at
/// most `max_backups` of them and none older than `max_age`.
pub struct LogFile {
    path: PathBuf,
    rotation: Rotation,
    inner: FileRotate<AppendTimestamp>,
    /// Bytes in the live file, counted as FileRotate counts them, so a rotation is known
    /// without asking FileRotate (which would allocate its backup list on every line).
    written: u64,
}

impl fmt::Debug for LogFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogFile")
            .field("path", &self.path)
            .field("rotation", &self.rotation)
            .finish_non_exhaustive()
    }
}

/// A [`LogFile`] shared by the subscriber's writers.
pub type RotatingFile = Mutex<LogFile>;

/// Opens `path` for appending with `rotation`, creating its directory and deleting backups
/// older than `rotation.max_age`.
pub fn open_rotating(path: &Path, rotation: Rotation) -> io::Result<RotatingFile> {
    LogFile::open(path, rotation).map(Mutex::new)
}

/// A [`LogFile`] opened on the first line written, not before: a short-lived process that logs
/// nothing at its level (the CNI plugin on a successful ADD at `Warn`) creates, lists and prunes
/// nothing. A file that cannot be opened then discards the lines (as [`open_rotating`]'s caller
/// disables logging), and is not tried again.
#[derive(Debug)]
pub struct LazyLogFile {
    path: PathBuf,
    rotation: Rotation,
    state: LazyState,
}

#[derive(Debug)]
enum LazyState {
    Unopened,
    Open(Box<LogFile>),
    Failed,
}

/// A [`LazyLogFile`] shared by the subscriber's writers.
pub type LazyRotatingFile = Mutex<LazyLogFile>;

/// [`open_rotating`], deferred to the first write.
#[must_use]
pub fn open_rotating_lazily(path: &Path, rotation: Rotation) -> LazyRotatingFile {
    Mutex::new(LazyLogFile {
        path: path.to_owned(),
        rotation,
        state: LazyState::Unopened,
    })
}

impl LazyLogFile {
    fn file(&mut self) -> Option<&mut LogFile> {
        if matches!(self.state, LazyState::Unopened) {
            self.state = match LogFile::open(&self.path, self.rotation) {
                Ok(file) => LazyState::Open(Box::new(file)),
                Err(_) => LazyState::Failed,
            };
        }
        match &mut self.state {
            LazyState::Open(file) => Some(file),
            _ => None,
        }
    }

    /// Whether the file has been opened (a line was written).
    #[must_use]
    pub fn is_open(&self) -> bool {
        matches!(self.state, LazyState::Open(_))
    }
}

impl io::Write for LazyLogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.file() {
            Some(file) => file.write(buf),
            None => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.file() {
            Some(file) => file.flush(),
            None => Ok(()),
        }
    }
}

impl LogFile {
    fn open(path: &Path, rotation: Rotation) -> io::Result<Self> {
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)?;
        }
        // FileRotate panics on an unopenable file; find out first, so the caller can report it.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        prune_aged(path, rotation.max_age, SystemTime::now());
        let inner = Self::rotate_file(path, rotation);
        let written = std::fs::metadata(path).map_or(0, |m| m.len());
        Ok(Self {
            path: path.to_owned(),
            rotation,
            inner,
            written,
        })
    }

    fn rotate_file(path: &Path, rotation: Rotation) -> FileRotate<AppendTimestamp> {
        let mut options = std::fs::OpenOptions::new();
        options.create(true).append(true);
        FileRotate::new(
            path,
            AppendTimestamp::default(FileLimit::MaxFiles(rotation.max_backups)),
            ContentLimit::BytesSurpassed(rotation.max_bytes),
            Compression::OnRotate(0),
            Some(options),
        )
    }
}

impl io::Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // `BytesSurpassed`: FileRotate rotates before a write once the file has passed the limit.
        let rotates = self.written > self.rotation.max_bytes as u64;
        let n = self.inner.write(buf)?;
        if rotates {
            self.written = 0;
            // Drop the backups past their age, and let FileRotate re-read what is left (it
            // keeps its own list of backups).
            if prune_aged(&self.path, self.rotation.max_age, SystemTime::now()) > 0 {
                self.inner = Self::rotate_file(&self.path, self.rotation);
            }
        }
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Deletes `<path>.*` backups last modified more than `max_age` before `now`; returns how many.
fn prune_aged(path: &Path, max_age: Duration, now: SystemTime) -> usize {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return 0;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let prefix = format!("{name}.");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut pruned = 0;
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if !file_name.starts_with(&prefix) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age > max_age);
        if old && std::fs::remove_file(entry.path()).is_ok() {
            pruned += 1;
        }
    }
    pruned
}

/// The zap production JSON line: `{"level":"info","ts":"2026-11-23T07:24:23.123Z",
/// "caller":"pool/manager.rs:88","msg":"...",<fields>}`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZapJson;

impl<S, N> FormatEvent<S, N> for ZapJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert("level".into(), Value::from(zap_level(*meta.level())));
        line.insert(
            "ts".into(),
            Value::from(timestamp(OffsetDateTime::now_utc())),
        );
        if let (Some(file), Some(no)) = (meta.file(), meta.line()) {
            line.insert("caller".into(), Value::from(short_caller(file, no)));
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        line.insert(
            "msg".into(),
            Value::from(fields.message.unwrap_or_default()),
        );
        // Span fields (outermost first), then the event's own, at the top level as zap's
        // `With` fields are. Spans must be formatted with `JsonFields` for them to appear.
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(Value::Object(span_fields)) = ext
                    .get::<FormattedFields<N>>()
                    .and_then(|f| serde_json::from_str::<Value>(f).ok())
                {
                    for (k, v) in span_fields {
                        line.entry(k).or_insert(v);
                    }
                }
            }
        }
        for (k, v) in fields.rest {
            line.insert(k, v);
        }
        let text = serde_json::to_string(&Value::Object(line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// zap's level names.
fn zap_level(level: Level) -> &'static str {
    match level {
        Level::TRACE | Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warn",
        Level::ERROR => "error",
    }
}

/// zap's `ISO8601TimeEncoder` (`2006-01-02T15:04:05.000Z0700`), in UTC as on a node.
fn timestamp(t: OffsetDateTime) -> String {
    t.format(format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    ))
    .unwrap_or_default()
}

/// zap's short caller: the last directory and the file, `dir/file.rs:line`.
fn short_caller(file: &str, line: u32) -> String {
    let mut parts = file.rsplit('/');
    let name = parts.next().unwrap_or(file);
    match parts.next() {
        Some(dir) => format!("{dir}/{name}:{line}"),
        None => format!("{name}:{line}"),
    }
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    rest: Vec<(String, Value)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
        } else {
            self.rest.push((field.name().to_owned(), Value::from(text)));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = Some(value.to_owned());
        } else {
            self.rest
                .push((field.name().to_owned(), Value::from(value)));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest
            .push((field.name().to_owned(), Value::from(value)));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.rest
            .push((field.name().to_owned(), Value::from(value)));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.rest
            .push((field.name().to_owned(), Value::from(value)));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.rest
            .push((field.name().to_owned(), Value::from(value)));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    fn subscriber(path: &Path, rotation: Rotation) -> impl Subscriber + Send + Sync {
        let file = open_rotating(path, rotation).unwrap();
        tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(ZapJson)
                .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                .with_writer(file),
        )
    }

    /// zap's production encoder keys, as upstream's `ipamd.log` lines carry them.
    #[test]
    fn lines_have_zaps_shape() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ipamd.log");
        tracing::subscriber::with_default(subscriber(&path, Rotation::default()), || {
            let span = tracing::info_span!("AddNetwork", pod = "web-0");
            let _g = span.enter();
            tracing::warn!(ip = "198.18.0.5", attempts = 3u64, "assigned");
        });
        let text = std::fs::read_to_string(&path).unwrap();
        let v: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(v["level"], "warn");
        assert_eq!(v["msg"], "assigned");
        assert_eq!(v["ip"], "198.18.0.5");
        assert_eq!(v["attempts"], 3);
        assert_eq!(v["pod"], "web-0");
        assert!(
            v["caller"].as_str().unwrap().starts_with("src/lib.rs:"),
            "{v}"
        );
        let ts = v["ts"].as_str().unwrap();
        assert_eq!(ts.len(), "2026-11-23T07:24:23.123Z".len(), "{ts}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T');
    }

    /// Past the size limit the file is rotated to a gzip backup; at most `max_backups` stay.
    #[test]
    fn rotates_compresses_and_keeps_only_the_backups_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plugin.log");
        let rotation = Rotation {
            max_bytes: 2_000,
            max_backups: 2,
            ..Rotation::default()
        };
        tracing::subscriber::with_default(subscriber(&path, rotation), || {
            for i in 0..200 {
                tracing::info!(
                    i,
                    "a line long enough to fill the file quickly, over and over"
                );
                // Timestamped backups need distinct names (one-second resolution plus a
                // counter); a few rotations are enough.
            }
        });
        let mut backups: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p != &path)
            .collect();
        backups.sort();
        assert!(!backups.is_empty(), "no rotation happened");
        assert!(backups.len() <= 2, "{backups:?}");
        assert!(std::fs::metadata(&path).unwrap().len() < 4_000);
        let gz = backups
            .iter()
            .find(|p| p.extension().is_some_and(|e| e == "gz"))
            .unwrap_or_else(|| panic!("no compressed backup in {backups:?}"));
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(gz).unwrap())
            .read_to_string(&mut text)
            .unwrap();
        assert!(
            text.lines()
                .all(|l| serde_json::from_str::<Value>(l).is_ok())
        );
    }

    /// lumberjack's `MaxAge`: backups older than 30 days go, younger ones and other files stay.
    #[test]
    fn backups_past_their_age_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ipamd.log");
        let aged = |name: &str, days: u64| {
            let p = dir.path().join(name);
            let f = std::fs::File::create(&p).unwrap();
            f.set_modified(SystemTime::now() - Duration::from_secs(days * 24 * 3600))
                .unwrap();
            p
        };
        let old = aged("ipamd.log.20260101T000000.gz", 40);
        let young = aged("ipamd.log.20261120T000000.gz", 3);
        let other = aged("plugin.log.20260101T000000.gz", 40);
        let _file = open_rotating(&path, Rotation::default()).unwrap();
        assert!(!old.exists(), "a 40-day-old backup is deleted");
        assert!(young.exists() && other.exists());
    }

    /// Nothing at the level: no directory, no file, no listing; the first line opens it; an
    /// unopenable path discards lines without an error.
    #[test]
    fn the_lazy_file_is_created_by_the_first_line_only() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/plugin.log");
        let lazy = open_rotating_lazily(&path, Rotation::default());
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::WARN)
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(ZapJson)
                    .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                    .with_writer(lazy),
            );
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("below the level");
            assert!(
                !dir.path().join("sub").exists(),
                "nothing made before a line"
            );
            tracing::warn!(n = 1, "the first line");
        });
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("the first line"));

        let blocked = dir.path().join("a-file");
        std::fs::write(&blocked, "").unwrap();
        let mut broken = open_rotating_lazily(&blocked.join("x.log"), Rotation::default())
            .into_inner()
            .unwrap();
        assert_eq!(broken.write(b"line\n").unwrap(), 5);
        assert!(!broken.is_open());
    }

    #[test]
    fn caller_is_short() {
        assert_eq!(
            short_caller("ipamd/src/pool/manager.rs", 7),
            "pool/manager.rs:7"
        );
        assert_eq!(short_caller("main.rs", 1), "main.rs:1");
    }
}
