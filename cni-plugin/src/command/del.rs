//! DEL: release the address in ipamd (best effort), read the host state, and remove only the
//! wiring that provably belongs to this sandbox (`plan::plan_teardown`; docs/plugin.md, "What
//! DEL may touch"). Idempotent: a retry, or a DEL of a sandbox whose pod was re-created under
//! the same name, leaves other sandboxes' veths, routes and rules alone.

use ipamd_proto::del_reason::POD_DELETED;

use super::del_request;
use crate::apply::{Datapath, reply_addresses};
use crate::ipam::Ipamd;
use crate::plan::{IpamdRelease, plan_teardown, teardown_veth_names};
use crate::spec::error::chain;
use crate::spec::{CniEnv, ErrorCode, NetConf, SpecError};

pub(super) async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), SpecError> {
    let release = match Ipamd::connect(&conf.ipamd_socket).await {
        Ok(ipamd) => match ipamd.del(del_request(env, conf, POD_DELETED)).await {
            Ok(reply) => IpamdRelease::Released(reply_addresses(&reply.ip_allocation_metadata)),
            Err(e) if e.is_unknown_pod() => IpamdRelease::UnknownPod,
            Err(e) => {
                tracing::warn!(error = %chain(&e), "ipamd DelNetwork failed; tearing down what is provably this sandbox's");
                IpamdRelease::Unavailable
            }
        },
        Err(e) => {
            tracing::warn!(error = %chain(&e), "ipamd unreachable; tearing down what is provably this sandbox's");
            IpamdRelease::Unavailable
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
    if errors.is_empty() {
        return Ok(());
    }
    let details = errors
        .iter()
        .map(|e| chain(e))
        .collect::<Vec<_>>()
        .join("; ");
    tracing::error!(%details, "teardown incomplete");
    Err(SpecError {
        code: ErrorCode::SetupFailed,
        msg: "teardown pod network".to_owned(),
        details,
    })
}
