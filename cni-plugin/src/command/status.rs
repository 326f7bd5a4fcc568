//! STATUS: the plugin is available when ipamd answers its health check with SERVING. Must
//! not: touch the datapath.

use crate::ipam::Ipamd;
use crate::spec::{ErrorCode, NetConf, SpecError};

pub(super) async fn run(conf: &NetConf) -> Result<(), SpecError> {
    let ipamd = Ipamd::connect(&conf.ipamd_socket)
        .await
        .map_err(|e| SpecError::new(ErrorCode::PluginNotAvailable, "ipamd unreachable", &e))?;
    match ipamd.serving().await {
        Ok(true) => Ok(()),
        Ok(false) => Err(SpecError::msg(
            ErrorCode::PluginNotAvailable,
            "ipamd is not serving",
        )),
        Err(e) => Err(SpecError::new(
            ErrorCode::PluginNotAvailable,
            "ipamd health check failed",
            &e,
        )),
    }
}
