//! Why an ADD failed, in the words kubelet shows (`kubectl describe pod`): the established message
//! as the prefix (clients match it), then the reason code (`ipamd_proto::add_failure_code`) and
//! what to do. Failures ipamd cannot have seen (its socket unreachable, the network-policy agent
//! down) are appended to the failure spool beside ipamd's socket (`ipamd_proto::failure_spool`),
//! which ipamd reads to count them and to put the Event on the pod (docs/operations.md). The spool
//! is the plugin's only file besides its log: written only, never read, bounded. Must not: decide a
//! CNI code.

use std::io::Write as _;
use std::time::SystemTime;

use ipamd_proto::failure_spool::{self, Record};
use ipamd_proto::{ErrorReason, add_failure_code};

use crate::ipam::IpamdCallError;
use crate::spec::{CniEnv, NetConf};

/// The text of a refused AddNetwork, the prefix of ours.
pub const ADD_REFUSED: &str = "add cmd: failed to assign an IP address to container";
/// The text of an AddNetwork call that failed.
pub const ADD_CALL_FAILED: &str = "add cmd: Error received from AddNetwork gRPC call";
/// The text when ipamd's socket cannot be reached.
pub const CONNECT_FAILED: &str = "add cmd: failed to connect to backend server";

/// The CNI message of a failed AddNetwork (or connection to ipamd), and the reason when the
/// failure is the plugin's to report ([`spool`]): ipamd unreachable.
#[must_use]
pub fn add_message(conf: &NetConf, e: &IpamdCallError) -> (String, Option<(ErrorReason, String)>) {
    if e.is_unreachable() {
        let what = unreachable_text(conf);
        let prefix = match e {
            IpamdCallError::Connect { .. } => CONNECT_FAILED,
            _ => ADD_CALL_FAILED,
        };
        let code = add_failure_code(ErrorReason::IpamdUnavailable);
        return (
            format!("{prefix}: {code}: {what}"),
            Some((ErrorReason::IpamdUnavailable, what)),
        );
    }
    let msg = match e {
        IpamdCallError::Refused {
            reason: Some(r),
            message,
            ..
        } => format!("{ADD_REFUSED}: {}: {message}", add_failure_code(*r)),
        // an ipamd without typed reasons: Success=false and nothing else
        IpamdCallError::Refused { reason: None, .. } => ADD_REFUSED.to_owned(),
        IpamdCallError::Status {
            status,
            reason: Some(r),
            ..
        } => format!(
            "{ADD_CALL_FAILED}: {}: {}",
            add_failure_code(*r),
            status.message()
        ),
        IpamdCallError::Status { status, .. } => format!("{ADD_CALL_FAILED}: {}", status.message()),
        IpamdCallError::Connect { .. } => CONNECT_FAILED.to_owned(),
    };
    (msg, None)
}

fn unreachable_text(conf: &NetConf) -> String {
    format!(
        "ipamd is not reachable at {}: is aws-node running and ready on this node? (kubectl -n kube-system get pods -l k8s-app=aws-node -o wide, and its aws-node container's logs)",
        conf.ipamd_socket.display()
    )
}

/// Appends a failure ipamd has not seen to the spool beside its socket (best effort: a
/// failure here is logged, never the pod's error).
pub fn spool(conf: &NetConf, env: &CniEnv, reason: ErrorReason, message: &str) {
    let path = failure_spool::path(&conf.ipamd_socket);
    let record = Record {
        at: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        code: add_failure_code(reason).to_owned(),
        namespace: env.k8s.pod_namespace.clone(),
        name: env.k8s.pod_name.clone(),
        message: message.to_owned(),
    };
    let append = || -> std::io::Result<()> {
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > failure_spool::MAX_BYTES) {
            return Ok(());
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        // one write: O_APPEND keeps concurrent plugins' lines whole
        f.write_all(record.to_line().as_bytes())
    };
    if let Err(e) = append() {
        tracing::warn!(path = %path.display(), error = %e, "failure not reported to ipamd's spool");
    }
}
