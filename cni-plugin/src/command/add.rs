//! ADD: ask ipamd for an address, plan, wire, have the network-policy agent enforce the pod's
//! policy; on a wiring or policy failure undo and give the address back (`SetupNSFailed`).

use ipamd_proto::del_reason::SETUP_NS_FAILED;

use super::{add_request, del_request, ipam_error, policy};
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
        .map_err(|e| add_error(env, conf, &e))?;
    let reply = ipamd
        .add(add_request(env, conf))
        .await
        .map_err(|e| add_error(env, conf, &e))?;
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
    let applied = match datapath.setup(&plan, &pod).await {
        Ok(applied) => applied,
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
            return Err(SpecError {
                code: ErrorCode::SetupFailed,
                msg: format!("setup pod network: {}", setup.cause),
                details,
            });
        }
    };
    tracing::info!(veth = %plan.host_veth, address = %plan.address, table = plan.route_table, more = ?plan.more.iter().map(|m| (&m.container_ifname, m.address, m.route_table)).collect::<Vec<_>>(), "pod wired");

    // Network policy before the result (upstream's order): the agent filters the pod before
    // the runtime starts it. Refused: the wiring is taken back and the address released, so
    // an unenforced pod is never left reachable (docs/plugin.md, "Network policy at pod start").
    let interfaces = reply.ip_allocation_metadata.len();
    if let Err(e) = policy::enforce(conf, env, &reply.network_policy_mode, interfaces).await {
        let mut err = policy::enforce_error(&e);
        crate::failure::spool(
            conf,
            env,
            ipamd_proto::ErrorReason::PolicyAgentUnavailable,
            &e.to_string(),
        );
        let cleanup = datapath.unwire(&applied).await;
        for c in &cleanup {
            err.details.push_str(&format!("; cleanup: {}", chain(c)));
        }
        if cleanup.is_empty() {
            if let Some(r) = release(&ipamd, env, conf).await {
                err.details.push_str(&format!("; release: {r}"));
            }
        } else {
            // Something of the wiring is left: the address stays assigned (and routed) until
            // the runtime's DEL, which removes what is provably this sandbox's and releases it.
            tracing::error!(
                ?cleanup,
                "wiring not fully taken back; the address stays assigned until DEL"
            );
            err.details
                .push_str("; address kept until DEL (the wiring was not fully taken back)");
        }
        return Err(err);
    }
    Ok(plan
        .result_with(&applied.macs(), &netns_path.display().to_string())
        .to_json(conf.cni_version))
}

/// The CNI error of a failed connection to ipamd or AddNetwork: the reason code and what to
/// do in the message ([`crate::failure::add_message`]); a failure ipamd did not see (it is
/// unreachable) goes to its spool.
fn add_error(env: &CniEnv, conf: &NetConf, e: &crate::ipam::IpamError) -> SpecError {
    let (msg, unseen) = crate::failure::add_message(conf, e);
    if let Some((reason, what)) = unseen {
        crate::failure::spool(conf, env, reason, &what);
    }
    let mut err = ipam_error(&msg, e);
    if matches!(e, crate::ipam::IpamError::Refused { .. }) {
        // the message already says everything the refusal carried
        err.details.clear();
    }
    err
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
