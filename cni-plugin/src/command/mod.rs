//! The CNI verbs. Each takes the parsed environment and configuration and returns the stdout
//! payload or a [`SpecError`]; this is the one place where domain errors become CNI codes.
//! Owns the verbs' order of work and the ipamd request messages. Must not: write stdout or
//! choose the exit code (`run` and `main` do).

mod add;
mod check;
mod del;
mod policy;
mod status;

use ipamd_proto::rpc::{AddNetworkRequest, DelNetworkRequest};

use crate::ipam::IpamdCallError;
use crate::spec::{CniEnv, Command, ErrorCode, NetConf, SpecError};

/// Runs `env.command` (not VERSION, which needs no configuration). `Ok(None)` means success
/// with no output (DEL, CHECK, STATUS, GC).
pub async fn dispatch(env: &CniEnv, conf: &NetConf) -> Result<Option<String>, SpecError> {
    // ADD and DEL of one pod never overlap on the node (`pod_lock`: a DEL's "no other sandbox
    // is wired" and its `DeletePodNp` are not split by a same-name pod's ADD).
    let _pod_lock = match env.command {
        Command::Add | Command::Del => {
            let key = crate::pod_lock::pod_key(env);
            Some(
                crate::pod_lock::acquire(&key, crate::pod_lock::LOCK_WAIT)
                    .await
                    .map_err(|e| SpecError::new(ErrorCode::TryAgainLater, e.to_string(), &e))?,
            )
        }
        _ => None,
    };
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
        requires_multi_nic_attachment: requires_multi_nic(conf),
        k8s_pod_uid: env.k8s.pod_uid.clone(),
    }
}

/// The pod annotation that asks for one interface per network card, and its one value (read from
/// the runtime's `io.kubernetes.cri.pod-annotations`, which the conflist's capability asks for).
pub const MULTI_NIC_ANNOTATION: &str = "k8s.amazonaws.com/nicConfig";
/// See [`MULTI_NIC_ANNOTATION`].
pub const MULTI_NIC_ATTACHMENT: &str = "multi-nic-attachment";

/// Whether the pod asks for a multi-NIC attachment (any other value of the annotation is the
/// default, one interface).
fn requires_multi_nic(conf: &NetConf) -> bool {
    conf.pod_annotations
        .get(MULTI_NIC_ANNOTATION)
        .is_some_and(|v| v == MULTI_NIC_ATTACHMENT)
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

fn ipam_error(msg: &str, e: &IpamdCallError) -> SpecError {
    let code = if e.is_transient() {
        ErrorCode::TryAgainLater
    } else {
        ErrorCode::IpamdRefused
    };
    SpecError::new(code, msg, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(annotations: &str) -> NetConf {
        NetConf::parse(
            format!(
                r#"{{"cniVersion":"1.0.0","name":"aws-cni","type":"aws-cni",
                "capabilities":{{"io.kubernetes.cri.pod-annotations":true}},
                "runtimeConfig":{{"io.kubernetes.cri.pod-annotations":{annotations}}}}}"#
            )
            .as_bytes(),
        )
        .expect("netconf")
    }

    /// upstream `cmd/routed-eni-cni-plugin/cni.go` add(): the pod annotation
    /// `k8s.amazonaws.com/nicConfig` with the value `multi-nic-attachment` sets
    /// `RequiresMultiNICAttachment`; any other value (or none) is one interface.
    #[test]
    fn the_multi_nic_annotation_asks_ipamd_for_one_interface_per_card() {
        let yes = conf(r#"{"k8s.amazonaws.com/nicConfig":"multi-nic-attachment"}"#);
        assert!(requires_multi_nic(&yes));
        for other in [
            r#"{"k8s.amazonaws.com/nicConfig":"single"}"#,
            r#"{"other":"multi-nic-attachment"}"#,
            "{}",
        ] {
            assert!(!requires_multi_nic(&conf(other)), "{other}");
        }
    }
}
