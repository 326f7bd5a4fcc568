//! ADD: ask ipamd for an address, plan, wire; on a wiring failure undo and give the address
//! back (`SetupNSFailed`).

use ipamd_proto::del_reason::SETUP_NS_FAILED;

use super::{add_request, del_request, ipam_error};
use crate::apply::Datapath;
use crate::ipam::Ipamd;
use crate::plan::{PlanError, plan_add};
use crate::spec::error::chain;
use crate::spec::{CniEnv, ErrorCode, NetConf, SpecError};

pub(super) async fn run(env: &CniEnv, conf: &NetConf) -> Result<String, SpecError> {
    let netns_path = env
        .netns
        .as_ref()
        .ok_or_else(|| SpecError::msg(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))?;
    let pod = dataplane::NetNs::open(netns_path)
        .map_err(|e| SpecError::new(ErrorCode::UnknownContainer, "open pod netns", &e))?;
    let ipamd = Ipamd::connect(&conf.ipamd_socket)
        .await
        .map_err(|e| ipam_error("ipamd unreachable", &e))?;
    let reply = ipamd
        .add(add_request(env, conf))
        .await
        .map_err(|e| ipam_error("add cmd: failed to assign an ip address to container", &e))?;
    tracing::info!(ips = ?reply.ip_allocation_metadata, "ipamd assigned");

    let plan = match plan_add(&reply, conf, env) {
        Ok(plan) => plan,
        Err(e) => {
            let release = release(&ipamd, env, conf).await;
            let code = match e {
                PlanError::NotAssigned => ErrorCode::IpamdRefused,
                _ => ErrorCode::UnsupportedAllocation,
            };
            let mut err = SpecError::new(code, e.to_string(), &e);
            if let Some(r) = release {
                err.details.push_str(&format!("; release: {r}"));
            }
            return Err(err);
        }
    };
    tracing::debug!(?plan, "planned");

    let datapath = Datapath::open_current()
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "open host netlink", &e))?;
    match datapath.setup(&plan, &pod).await {
        Ok(applied) => {
            tracing::info!(veth = %plan.host_veth, address = %plan.address, table = plan.route_table, "pod wired");
            Ok(plan
                .result(
                    applied.host_mac,
                    applied.container_mac,
                    &netns_path.display().to_string(),
                )
                .to_json(conf.cni_version))
        }
        Err(setup) => {
            tracing::error!(error = %chain(&setup), cleanup = ?setup.cleanup, "setup failed, undone");
            let release = release(&ipamd, env, conf).await;
            let mut details = chain(&setup);
            for c in &setup.cleanup {
                details.push_str(&format!("; cleanup: {}", chain(c)));
            }
            if let Some(r) = release {
                details.push_str(&format!("; release: {r}"));
            }
            Err(SpecError {
                code: ErrorCode::SetupFailed,
                msg: format!("setup pod network: {}", setup.cause),
                details,
            })
        }
    }
}

/// Gives the address back; returns the failure text, if any.
async fn release(ipamd: &Ipamd, env: &CniEnv, conf: &NetConf) -> Option<String> {
    match ipamd.del(del_request(env, conf, SETUP_NS_FAILED)).await {
        Ok(_) => None,
        Err(e) if e.is_unknown_pod() => None,
        Err(e) => {
            tracing::error!(error = %chain(&e), "release after failed setup");
            Some(chain(&e))
        }
    }
}
