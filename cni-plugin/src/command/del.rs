//! DEL: release the address in ipamd (best effort) and remove the wiring, using ipamd's answer
//! or, when ipamd is unreachable or does not know the pod, prevResult. Idempotent.

use ipamd_proto::del_reason::POD_DELETED;

use super::del_request;
use crate::apply::{Datapath, reply_addresses};
use crate::ipam::Ipamd;
use crate::plan::plan_teardown;
use crate::spec::error::chain;
use crate::spec::{CniEnv, ErrorCode, NetConf, SpecError};

pub(super) async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), SpecError> {
    let released = match Ipamd::connect(&conf.ipamd_socket).await {
        Ok(ipamd) => match ipamd.del(del_request(env, conf, POD_DELETED)).await {
            Ok(reply) => reply_addresses(&reply.ip_allocation_metadata),
            Err(e) => {
                if !e.is_unknown_pod() {
                    tracing::warn!(error = %chain(&e), "ipamd DelNetwork failed; tearing down from prevResult");
                }
                Vec::new()
            }
        },
        Err(e) => {
            tracing::warn!(error = %chain(&e), "ipamd unreachable; tearing down from prevResult");
            Vec::new()
        }
    };
    let plan = plan_teardown(conf, env, &released);
    tracing::debug!(?plan, "teardown");
    // The netns may already be gone (containerd calls DEL with an empty CNI_NETNS).
    let pod = env
        .netns
        .as_ref()
        .and_then(|p| dataplane::NetNs::open(p).ok());
    let datapath = Datapath::open_current()
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "open host netlink", &e))?;
    let errors = datapath
        .teardown(&plan, pod.as_ref().map(|ns| (ns, env.ifname.as_str())))
        .await;
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
