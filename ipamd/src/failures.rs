//! Failed ADDs with their reasons: each is counted in
//! `awscni_add_failures_total{reason}`, kept in a short list per pod and reason for
//! `ipamd status` (`/v1/add-failures`), and handed to the Kubernetes layer for a Warning Event
//! on the pod. Plugin-side failures (ipamd unreachable, network-policy agent down) arrive
//! through the failure spool the plugin appends to ([`ipamd_proto::failure_spool`]), read
//! here. Must not: decide a reason (the code comes from where the failure is known), talk to
//! the API server, hold its lock across `.await`.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ipamd_proto::failure_spool::Record;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// How many distinct (pod, reason) failures `ipamd status` keeps.
pub const RECENT: usize = 50;
/// How many failures wait for the Event writer before new ones are dropped (still counted).
const EVENT_QUEUE: usize = 256;

/// One failed ADD of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFailure {
    /// Reason code (`ipamd_proto::add_failure_code`).
    pub code: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// What the pod was told (without the plugin's prefix).
    pub message: String,
    /// When it failed.
    pub at: SystemTime,
}

/// A failure as `ipamd status` shows it: the same pod and reason aggregated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FailureEntry {
    /// Reason code.
    pub reason: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// The latest message.
    pub message: String,
    /// How many times.
    pub count: u64,
    /// First time (Unix seconds).
    pub first: u64,
    /// Last time (Unix seconds).
    pub last: u64,
}

/// `/v1/add-failures`: totals per reason since ipamd started, and the latest failures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct FailuresView {
    /// Reason code → failures since start.
    pub totals: BTreeMap<String, u64>,
    /// Latest first.
    pub recent: Vec<FailureEntry>,
}

#[derive(Debug, Default)]
struct Log {
    totals: BTreeMap<String, u64>,
    /// Oldest first.
    recent: VecDeque<FailureEntry>,
}

/// The node's failed ADDs.
#[derive(Debug)]
pub struct AddFailures {
    metrics: Arc<Metrics>,
    log: Mutex<Log>,
    events: mpsc::Sender<PodFailure>,
    receiver: Mutex<Option<mpsc::Receiver<PodFailure>>>,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

impl AddFailures {
    /// An empty log counting into `metrics`.
    #[must_use]
    pub fn new(metrics: Arc<Metrics>) -> Self {
        let (events, receiver) = mpsc::channel(EVENT_QUEUE);
        Self {
            metrics,
            log: Mutex::new(Log::default()),
            events,
            receiver: Mutex::new(Some(receiver)),
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records one failed ADD: counted, listed, queued for the pod's Event.
    pub fn record(&self, f: PodFailure) {
        self.metrics.add_failure(&f.code);
        {
            let mut log = self.log();
            *log.totals.entry(f.code.clone()).or_default() += 1;
            let at = unix(f.at);
            let found = log
                .recent
                .iter()
                .position(|e| e.reason == f.code && e.namespace == f.namespace && e.pod == f.name);
            let mut entry = match found.and_then(|i| log.recent.remove(i)) {
                Some(mut e) => {
                    e.count += 1;
                    e.first = e.first.min(at);
                    e.last = e.last.max(at);
                    e.message.clone_from(&f.message);
                    e
                }
                None => FailureEntry {
                    reason: f.code.clone(),
                    namespace: f.namespace.clone(),
                    pod: f.name.clone(),
                    message: f.message.clone(),
                    count: 1,
                    first: at,
                    last: at,
                },
            };
            if entry.message.len() > 1024 {
                let mut end = 1024;
                while !entry.message.is_char_boundary(end) {
                    end -= 1;
                }
                entry.message.truncate(end);
            }
            log.recent.push_back(entry);
            while log.recent.len() > RECENT {
                log.recent.pop_front();
            }
        }
        if f.name.is_empty() {
            return;
        }
        if let Err(e) = self.events.try_send(f) {
            tracing::debug!(error = %e, "pod failure event dropped (queue full or no writer)");
        }
    }

    /// The Event writer's end of the queue (once; `None` afterwards).
    pub fn take_events(&self) -> Option<mpsc::Receiver<PodFailure>> {
        self.receiver
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Totals and the latest failures, latest first.
    #[must_use]
    pub fn view(&self) -> FailuresView {
        let log = self.log();
        FailuresView {
            totals: log.totals.clone(),
            recent: log.recent.iter().rev().cloned().collect(),
        }
    }

    /// Records every failure in the spool at `spool` and empties it; returns how many. The
    /// spool is renamed first, so a plugin appending meanwhile starts a new one.
    pub fn ingest_spool(&self, spool: &Path) -> usize {
        let reading = spool.with_extension("reading");
        match std::fs::rename(spool, &reading) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return 0,
            Err(e) => {
                tracing::warn!(path = %spool.display(), error = %e, "failure spool not read");
                return 0;
            }
        }
        let text = std::fs::read_to_string(&reading).unwrap_or_default();
        let _ = std::fs::remove_file(&reading);
        let mut n = 0;
        for r in text.lines().filter_map(Record::parse) {
            tracing::warn!(reason = %r.code, ns = %r.namespace, pod = %r.name, message = %r.message, "ADD failed in the plugin (reported through the failure spool)");
            self.record(PodFailure {
                code: r.code,
                namespace: r.namespace,
                name: r.name,
                message: r.message,
                at: SystemTime::UNIX_EPOCH + Duration::from_secs(r.at),
            });
            n += 1;
        }
        n
    }
}

/// How often the failure spool (plugin-side failures) is read.
const FAILURE_SPOOL_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// Failed ADDs to the outside: the plugin's spool read into the log (counted there), and each
/// failure a Warning Event on its pod when a Kubernetes client is configured.
pub async fn report(
    failures: Arc<AddFailures>,
    spool: std::path::PathBuf,
    cluster: Option<crate::k8s::Cluster>,
    token: tokio_util::sync::CancellationToken,
) {
    let Some(mut events) = failures.take_events() else {
        return;
    };
    let mut tick = tokio::time::interval(FAILURE_SPOOL_PERIOD);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            _ = tick.tick() => {
                let failures = failures.clone();
                let spool = spool.clone();
                let _ = tokio::task::spawn_blocking(move || failures.ingest_spool(&spool)).await;
            }
            Some(f) = events.recv() => {
                let Some(cluster) = &cluster else { continue };
                let message = format!("failed to assign an IP address to container: {}", f.message);
                match cluster.pod_warning(&f.namespace, &f.name, &f.code, &message).await {
                    Ok(true) => {}
                    Ok(false) => tracing::debug!(ns = %f.namespace, pod = %f.name, "no Event: the pod does not exist"),
                    Err(e) => tracing::warn!(ns = %f.namespace, pod = %f.name, reason = %f.code, error = %e, "Warning Event on the pod not written"),
                }
            }
        }
    }
}

/// [`report`] as a task of the daemon.
pub fn reporter(
    failures: Arc<AddFailures>,
    socket: &Path,
    cluster: Option<crate::k8s::Cluster>,
    token: tokio_util::sync::CancellationToken,
) -> crate::task::Task {
    let spool = ipamd_proto::failure_spool::path(socket);
    crate::task::Task::new("add failure reporter", async move {
        report(failures, spool, cluster, token).await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: &str, pod: &str, msg: &str, at: u64) -> PodFailure {
        PodFailure {
            code: code.into(),
            namespace: "default".into(),
            name: pod.into(),
            message: msg.into(),
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
        }
    }

    #[test]
    fn failures_are_counted_aggregated_per_pod_and_reason_and_queued() {
        let metrics = Arc::new(Metrics::new());
        let f = AddFailures::new(metrics.clone());
        let mut rx = f.take_events().unwrap();
        assert!(f.take_events().is_none());
        f.record(failure("SubnetFull", "a", "m1", 10));
        f.record(failure("SubnetFull", "a", "m2", 20));
        f.record(failure("MaxPods", "b", "m3", 30));
        let v = f.view();
        assert_eq!(v.totals["SubnetFull"], 2);
        assert_eq!(v.totals["MaxPods"], 1);
        assert_eq!(v.recent.len(), 2);
        assert_eq!(v.recent[0].reason, "MaxPods");
        let a = &v.recent[1];
        assert_eq!(
            (a.count, a.first, a.last, a.message.as_str()),
            (2, 10, 20, "m2")
        );
        assert_eq!(
            metrics
                .add_failures_total
                .get(["SubnetFull"])
                .map(|s| s.value),
            Some(2.0)
        );
        assert_eq!(rx.try_recv().unwrap().message, "m1");
        assert_eq!(rx.try_recv().unwrap().message, "m2");
        assert_eq!(rx.try_recv().unwrap().code, "MaxPods");
    }

    #[test]
    fn the_spool_is_read_once_and_torn_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let spool = dir.path().join("ipamd.sock.add-failures");
        let rec = Record {
            at: 5,
            code: "IpamdUnavailable".into(),
            namespace: "default".into(),
            name: "p".into(),
            message: "ipamd down".into(),
        };
        std::fs::write(&spool, format!("{}torn", rec.to_line())).unwrap();
        let f = AddFailures::new(Arc::new(Metrics::new()));
        assert_eq!(f.ingest_spool(&spool), 1);
        assert!(!spool.exists());
        assert_eq!(f.ingest_spool(&spool), 0);
        assert_eq!(f.view().totals["IpamdUnavailable"], 1);
        assert_eq!(f.view().recent[0].first, 5);
    }
}
