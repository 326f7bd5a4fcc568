//! DEL: release the address in ipamd (best effort), read the host state, remove only the
//! wiring that provably belongs to this sandbox (`plan::plan_teardown`; docs/plugin.md, "What
//! DEL may touch"), then have the network-policy agent forget the pod when ipamd's mode says
//! so. Idempotent: a retry, or a DEL of a sandbox whose pod was re-created under the same
//! name, leaves other sandboxes' veths, routes, rules and network policy alone.

use ipamd_proto::del_reason::POD_DELETED;

use super::del_request;
use super::policy::{self, Skip};
use crate::apply::{Datapath, reply_addresses};
use crate::ipam::Ipamd;
use crate::plan::{IpamdRelease, plan_teardown, teardown_veth_names};
use crate::spec::error::chain;
use crate::spec::{CniEnv, ErrorCode, NetConf, SpecError};

/// Where DEL learns ipamd's `NetworkPolicyMode`.
enum PolicyMode {
    /// From the `DelNetwork` reply.
    Replied(String),
    /// `DelNetwork` answered "unknown pod" (a retried DEL, or an ADD that failed): asked with
    /// `GetNetworkPolicyConfigs`, so a DEL that failed at the agent still reaches it on retry.
    Ask(Ipamd),
    /// ipamd unreachable: unknown, so no agent call (upstream's plugin makes none either).
    Unknown,
}

pub(super) async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), SpecError> {
    let (release, mode) = match Ipamd::connect(&conf.ipamd_socket).await {
        Ok(ipamd) => match ipamd.del(del_request(env, conf, POD_DELETED)).await {
            Ok(reply) => (
                IpamdRelease::Released(reply_addresses(&reply.ip_allocation_metadata)),
                PolicyMode::Replied(reply.network_policy_mode),
            ),
            Err(e) if e.is_unknown_pod() => (IpamdRelease::UnknownPod, PolicyMode::Ask(ipamd)),
            Err(e) => {
                tracing::warn!(error = %chain(&e), "ipamd DelNetwork failed; tearing down what is provably this sandbox's");
                (IpamdRelease::Unavailable, PolicyMode::Unknown)
            }
        },
        Err(e) => {
            tracing::warn!(error = %chain(&e), "ipamd unreachable; tearing down what is provably this sandbox's");
            (IpamdRelease::Unavailable, PolicyMode::Unknown)
        }
    };
    // The netns may already be gone (containerd calls DEL with an empty CNI_NETNS).
    let pod = env
        .netns
        .as_ref()
        .and_then(|p| dataplane::NetNs::open(p).ok());
    let pod_if = pod.as_ref().map(|ns| (ns, env.ifname.as_str()));
    let datapath = Datapath::open_current()
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "open host netlink", &e))?;
    let view = datapath
        .observe_teardown(&teardown_veth_names(conf, env), pod_if)
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "read host network state", &e))?;
    let plan = plan_teardown(conf, env, &release, &view);
    tracing::debug!(?release, ?view, ?plan, "teardown");
    for link in &plan.foreign_veths {
        tracing::info!(veth = %link.name, "host veth belongs to another sandbox; kept");
    }
    for (address, reason) in &plan.kept {
        tracing::warn!(%address, ?reason, "address not provably this sandbox's; its rules and route kept");
    }
    let errors = datapath.teardown(&plan, pod_if).await;
    if !errors.is_empty() {
        let details = errors
            .iter()
            .map(|e| chain(e))
            .collect::<Vec<_>>()
            .join("; ");
        tracing::error!(%details, "teardown incomplete");
        return Err(SpecError {
            code: ErrorCode::SetupFailed,
            msg: "teardown pod network".to_owned(),
            details,
        });
    }
    let mode = match mode {
        PolicyMode::Replied(mode) => mode,
        PolicyMode::Ask(ipamd) => match ipamd.network_policy_mode().await {
            Ok(mode) => mode,
            Err(e) => {
                tracing::warn!(error = %chain(&e), "network policy mode unknown (ipamd did not answer); no network policy agent call");
                String::new()
            }
        },
        PolicyMode::Unknown => {
            tracing::warn!(
                "network policy mode unknown (ipamd unreachable); no network policy agent call"
            );
            String::new()
        }
    };
    let skip = (!plan.foreign_veths.is_empty()).then_some(Skip::AnotherSandboxIsWired);
    policy::forget(conf, env, &mode, skip).await
}
