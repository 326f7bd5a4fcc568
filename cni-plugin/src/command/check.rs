//! CHECK: compare the live wiring with prevResult; any difference is an error. Must not:
//! change anything (it only reads, through `apply::Datapath::check`), or talk to ipamd.

use crate::apply::Datapath;
use crate::spec::{CniEnv, ErrorCode, NetConf, SpecError};

pub(super) async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), SpecError> {
    let prev = conf.prev_result.as_ref().ok_or_else(|| {
        SpecError::msg(
            ErrorCode::InvalidNetworkConfig,
            "prevResult is required for CHECK",
        )
    })?;
    let netns_path = env
        .netns
        .as_ref()
        .ok_or_else(|| SpecError::msg(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))?;
    let pod = dataplane::NetNs::open(netns_path)
        .map_err(|e| SpecError::new(ErrorCode::UnknownContainer, "open pod netns", &e))?;
    let datapath = Datapath::open_current()
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "open host netlink", &e))?;
    let drift = datapath
        .check(prev, &pod, &env.ifname, conf.pod_sg_enforcing_mode)
        .await
        .map_err(|e| SpecError::new(ErrorCode::Io, "inspect pod network", &e))?;
    if drift.is_empty() {
        Ok(())
    } else {
        tracing::warn!(?drift, "check found drift");
        Err(SpecError {
            code: ErrorCode::Drift,
            msg: "pod network differs from prevResult".to_owned(),
            details: drift.join("; "),
        })
    }
}
