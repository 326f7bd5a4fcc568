//! The CNI verbs. Each takes the parsed environment and configuration and returns the stdout
//! payload or a [`SpecError`]; this is the one place where domain errors become CNI codes.

mod add;
mod check;
mod del;
mod policy;
mod status;

use ipamd_proto::rpc::{AddNetworkRequest, DelNetworkRequest};

use crate::ipam::IpamError;
use crate::spec::{CniEnv, Command, ErrorCode, NetConf, SpecError};

/// Runs `env.command` (not VERSION, which needs no configuration). `Ok(None)` means success
/// with no output (DEL, CHECK, STATUS, GC).
pub async fn dispatch(env: &CniEnv, conf: &NetConf) -> Result<Option<String>, SpecError> {
    match env.command {
        Command::Add => add::run(env, conf).await.map(Some),
        Command::Del => del::run(env, conf).await.map(|()| None),
        Command::Check => check::run(env, conf).await.map(|()| None),
        Command::Status => status::run(conf).await.map(|()| None),
        // ipamd has no "list allocations" RPC, so nothing is collectable here: DEL already
        // releases everything (see docs/plugin.md).
        Command::Gc => Ok(None),
        Command::Version => Ok(Some(crate::spec::result::version_json(conf.cni_version))),
    }
}

fn add_request(env: &CniEnv, conf: &NetConf) -> AddNetworkRequest {
    AddNetworkRequest {
        client_version: ipamd_proto::build_version().to_owned(),
        k8s_pod_name: env.k8s.pod_name.clone(),
        k8s_pod_namespace: env.k8s.pod_namespace.clone(),
        k8s_pod_infra_container_id: env.k8s.infra_container_id.clone(),
        container_id: env.container_id.clone(),
        if_name: env.ifname.clone(),
        network_name: conf.name.clone(),
        netns: env
            .netns
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        requires_multi_nic_attachment: false,
    }
}

fn del_request(env: &CniEnv, conf: &NetConf, reason: &str) -> DelNetworkRequest {
    DelNetworkRequest {
        client_version: ipamd_proto::build_version().to_owned(),
        k8s_pod_name: env.k8s.pod_name.clone(),
        k8s_pod_namespace: env.k8s.pod_namespace.clone(),
        k8s_pod_infra_container_id: env.k8s.infra_container_id.clone(),
        reason: reason.to_owned(),
        container_id: env.container_id.clone(),
        if_name: env.ifname.clone(),
        network_name: conf.name.clone(),
        k8s_pod_uid: env.k8s.pod_uid.clone(),
    }
}

fn ipam_error(msg: &str, e: &IpamError) -> SpecError {
    let code = if e.is_transient() {
        ErrorCode::TryAgainLater
    } else {
        ErrorCode::IpamdRefused
    };
    SpecError::new(code, msg, e)
}
