//! The ADD's phase timings, sent to ipamd as one unix datagram beside its socket
//! ([`ipamd_proto::setup_timings`]) so they reach `awscni_pod_network_setup_seconds`. Fire and
//! forget: non-blocking, never retried, every failure ignored (ipamd older or away, its queue
//! full) — a pod's set-up never waits for its own measurement. Must not: write stdout, fail the
//! verb.

use std::os::unix::net::UnixDatagram;
use std::path::Path;

use ipamd_proto::setup_timings::{Report, path};

/// Sends `report` to the ipamd listening beside `ipamd_socket`.
pub fn send(ipamd_socket: &Path, report: &Report) {
    let to = path(ipamd_socket);
    let sent = UnixDatagram::unbound().and_then(|socket| {
        socket.set_nonblocking(true)?;
        socket.send_to(report.to_datagram().as_bytes(), &to)
    });
    if let Err(e) = sent {
        tracing::debug!(to = %to.display(), error = %e, "set-up timings not sent");
    }
}
