//! Network policy at pod start and end: when ipamd hands out a `NetworkPolicyMode`, ADD has the
//! network-policy agent enforce the pod's policy before the result is printed, and DEL has it
//! forget the pod. Decides when to call and what a failure means for the verb; logs each call's
//! outcome and duration. Must not: touch the datapath or ipamd (add.rs/del.rs undo and release).

use std::time::Instant;

use crate::policy::{CALL_TIMEOUT, CONNECT_TIMEOUT, PodRef, PolicyAgent, PolicyError};
use crate::spec::{CniEnv, ErrorCode, NetConf, SpecError};

fn pod(env: &CniEnv) -> PodRef<'_> {
    PodRef {
        name: &env.k8s.pod_name,
        namespace: &env.k8s.pod_namespace,
    }
}

/// ADD, after the pod is wired: `EnforceNpToPod` with ipamd's `mode` and the allocation's interface
/// count. An empty mode is the opt-out: no connection at all.
pub(super) async fn enforce(
    conf: &NetConf,
    env: &CniEnv,
    mode: &str,
    interface_count: usize,
) -> Result<(), PolicyError> {
    if mode.is_empty() {
        tracing::info!("NETWORK_POLICY_ENFORCING_MODE is not set: no network policy agent call");
        return Ok(());
    }
    let started = Instant::now();
    let count = i32::try_from(interface_count).unwrap_or(i32::MAX);
    let result = async {
        let agent = PolicyAgent::connect(&conf.npa_socket, CONNECT_TIMEOUT).await?;
        agent.enforce(pod(env), mode, count, CALL_TIMEOUT).await
    }
    .await;
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    match &result {
        Ok(()) => tracing::info!(
            mode,
            interface_count = count,
            duration_ms,
            "network policy agent enforced the pod's policy"
        ),
        Err(e) => tracing::error!(
            mode,
            interface_count = count,
            duration_ms,
            error = %e,
            "network policy agent did not enforce the pod's policy"
        ),
    }
    result
}

/// The CNI error of a failed [`enforce`] (the established message is the prefix).
pub(super) fn enforce_error(e: &PolicyError) -> SpecError {
    let code = match e {
        PolicyError::Refused { .. } => ErrorCode::PolicyNotEnforced,
        PolicyError::Unreachable { .. } | PolicyError::Call { .. } => ErrorCode::TryAgainLater,
    };
    SpecError::new(
        code,
        format!(
            "add cmd: failed to setup network policy: {}: {e}",
            ipamd_proto::add_failure_code(ipamd_proto::ErrorReason::PolicyAgentUnavailable)
        ),
        e,
    )
}

/// Why DEL does not call the agent although the mode is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Skip {
    /// A host veth under this pod's name belongs to another sandbox (the pod was re-created
    /// under the same name and is wired): the agent's state for the name is that sandbox's.
    AnotherSandboxIsWired,
}

/// DEL, after the teardown: `DeletePodNp` when `mode` is set and nothing says the name now belongs
/// to another sandbox. Unreachable agent or failed call: a DEL error (kubelet retries; the retry
/// asks again). `Success=false`: logged (the agent answered; a retry would get the same).
pub(super) async fn forget(
    conf: &NetConf,
    env: &CniEnv,
    mode: &str,
    skip: Option<Skip>,
) -> Result<(), SpecError> {
    if mode.is_empty() {
        tracing::info!("NETWORK_POLICY_ENFORCING_MODE is not set: no network policy agent call");
        return Ok(());
    }
    if let Some(why) = skip {
        tracing::info!(
            ?why,
            "another sandbox of this pod is wired: its network policy is left in place"
        );
        return Ok(());
    }
    let started = Instant::now();
    let result = async {
        let agent = PolicyAgent::connect(&conf.npa_socket, CONNECT_TIMEOUT).await?;
        agent.delete(pod(env), CALL_TIMEOUT).await
    }
    .await;
    let duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok(()) => {
            tracing::info!(duration_ms, "network policy agent forgot the pod's policy");
            Ok(())
        }
        Err(e @ PolicyError::Refused { .. }) => {
            tracing::error!(duration_ms, error = %e, "network policy agent could not forget the pod's policy");
            Ok(())
        }
        Err(e) => {
            tracing::error!(duration_ms, error = %e, "network policy agent not reached; DEL fails so that it is retried");
            let msg = if e.is_unreachable() {
                "del cmd: failed to connect to network policy agent"
            } else {
                "del cmd: network policy agent call failed"
            };
            Err(SpecError::new(
                ErrorCode::TryAgainLater,
                format!("{msg}: {e}"),
                &e,
            ))
        }
    }
}
