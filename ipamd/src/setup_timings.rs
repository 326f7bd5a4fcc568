//! The plugin's half of `awscni_pod_network_setup_seconds`: the datagram socket beside ipamd's
//! (`ipamd_proto::setup_timings`) on which every successful ADD reports its phases (plugin total,
//! the AddNetwork call as the plugin waited for it, host wiring, the network-policy agent's call),
//! observed into the metrics registry. ipamd's own phases (address wait, EC2 calls) are observed
//! where they run. Owns the socket file (bound at start, removed at stop when still the one it
//! bound); must not: answer the plugin (it never waits), hold anything per pod.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipamd_proto::setup_timings::{MAX_BYTES, Report, path};
use tokio::net::UnixDatagram;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, SetupPhase};

/// Observes one report's phases.
pub fn observe(metrics: &Metrics, report: &Report) {
    metrics.setup_phase(SetupPhase::PluginTotal, report.plugin_total);
    metrics.setup_phase(SetupPhase::IpamdCall, report.ipamd_call);
    metrics.setup_phase(SetupPhase::HostWiring, report.host_wiring);
    if let Some(policy) = report.policy_agent {
        metrics.setup_phase(SetupPhase::PolicyAgent, policy);
    }
}

/// Binds the datagram socket beside `socket` (a leftover socket file of an earlier ipamd is
/// replaced; the instance lock keeps a second ipamd of this socket away).
pub fn bind(socket: &Path) -> std::io::Result<(UnixDatagram, PathBuf)> {
    let at = path(socket);
    match std::fs::symlink_metadata(&at) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            std::fs::remove_file(&at)?;
        }
        _ => {}
    }
    Ok((UnixDatagram::bind(&at)?, at))
}

/// Receives reports until `stop`; a datagram that is not a report is skipped (counted in the
/// debug log only: anyone on the node who can reach the socket file can send one).
pub async fn receive(
    socket: UnixDatagram,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let mut buf = [0_u8; MAX_BYTES + 1];
    loop {
        let n = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            r = socket.recv(&mut buf) => r?,
        };
        match Report::parse(&buf[..n]) {
            Some(report) => observe(&metrics, &report),
            None => tracing::debug!(
                bytes = n,
                "a datagram on the set-up timings socket that is not a report"
            ),
        }
    }
}

/// [`receive`] as a task of the daemon, the socket file removed when it ends. A socket that
/// cannot be bound is logged and the task ends: the phases measured by ipamd are still observed.
pub fn listener(
    metrics: Arc<Metrics>,
    socket: &Path,
    stop: CancellationToken,
) -> crate::task::Task {
    let socket = socket.to_owned();
    crate::task::Task::new("set-up timings", async move {
        let (datagrams, at) = match bind(&socket) {
            Ok(bound) => bound,
            Err(e) => {
                tracing::warn!(socket = %path(&socket).display(), error = %e, "set-up timings socket not bound: the plugin's phases are not observed");
                return Ok(());
            }
        };
        let bound = crate::rpc::socket_identity(&at);
        let result = receive(datagrams, metrics, stop).await;
        // Only the socket this process bound: the next ipamd of a rollout may have bound the
        // path since.
        if bound.is_some() && crate::rpc::socket_identity(&at) == bound {
            let _ = std::fs::remove_file(&at);
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "set-up timings socket failed: the plugin's phases are no longer observed");
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn reports_are_observed_and_foreign_datagrams_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ipamd.sock");
        // a leftover of an earlier ipamd is replaced
        drop(std::os::unix::net::UnixDatagram::bind(path(&socket)).unwrap());
        let (datagrams, at) = bind(&socket).unwrap();
        let metrics = Arc::new(Metrics::new());
        let stop = CancellationToken::new();
        let task = tokio::spawn(receive(datagrams, metrics.clone(), stop.clone()));
        let send = std::os::unix::net::UnixDatagram::unbound().unwrap();
        send.send_to(b"not a report", &at).unwrap();
        let report = Report {
            plugin_total: Duration::from_millis(3),
            ipamd_call: Duration::from_micros(400),
            host_wiring: Duration::from_millis(1),
            policy_agent: None,
        };
        send.send_to(report.to_datagram().as_bytes(), &at).unwrap();
        let count = |phase: SetupPhase| {
            metrics
                .pod_network_setup_seconds
                .get([phase.as_str()])
                .map_or(0, |s| s.count)
        };
        for _ in 0..200 {
            if count(SetupPhase::PluginTotal) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(count(SetupPhase::PluginTotal), 1);
        assert_eq!(count(SetupPhase::IpamdCall), 1);
        assert_eq!(count(SetupPhase::HostWiring), 1);
        assert_eq!(
            count(SetupPhase::PolicyAgent),
            0,
            "no policy call, no observation"
        );
        let total = metrics
            .pod_network_setup_seconds
            .get(["plugin_total"])
            .unwrap();
        assert!((total.value - 0.003).abs() < 1e-9);
        // 3 ms lands in the 5 ms bucket and above, not in the 2.5 ms one
        assert_eq!(&total.buckets[..4], &[0, 0, 1, 1]);
        stop.cancel();
        task.await.unwrap().unwrap();
    }
}
