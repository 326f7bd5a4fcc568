//! `aws-cni` invoked as a CNI runtime does for a pod of the simulated VPC: the target node
//! ([`PluginTarget`], owned so a kubelet-like thread can use it without the [`Sim`]), the
//! sandbox ([`Sandbox`]) and the call ([`run_plugin`]; every plugin call in a node, also each
//! of a chain's (`chain.rs`), goes through `exec_in_node` and [`crate::cni::exec_plugin`]).
//! Used by the harness's pods and by the upstream-node fixture's plugin builds. Must not
//! touch namespaces other than the run's.

use std::path::Path;

use super::Sim;
use crate::cni::{CniCall, CniOutput, exec_plugin};

/// Where a plugin runs: the node namespace and the node's netconf (its ipamd socket).
#[derive(Debug, Clone)]
pub struct PluginTarget {
    /// The node's network namespace.
    pub node_netns: String,
    /// The node's netconf ([`super::SimNode::netconf`]).
    pub netconf: String,
    /// Prefix for pod namespaces that the simulated VPC removes with itself.
    pub pod_prefix: String,
}

impl PluginTarget {
    /// Node `node` of `sim`, for a pod annotated `k8s.amazonaws.com/nicConfig:
    /// multi-nic-attachment` (the runtime's `io.kubernetes.cri.pod-annotations`): one interface
    /// per network card with `ENABLE_MULTI_NIC`.
    #[must_use]
    pub fn multi_nic(sim: &Sim, node: usize) -> Self {
        let mut target = Self::of(sim, node);
        let mut conf: serde_json::Value = serde_json::from_str(&target.netconf).unwrap_or_default();
        conf["runtimeConfig"] = serde_json::json!({
            "io.kubernetes.cri.pod-annotations": {"k8s.amazonaws.com/nicConfig": "multi-nic-attachment"}
        });
        target.netconf = conf.to_string();
        target
    }

    /// Node `node` of `sim`.
    #[must_use]
    pub fn of(sim: &Sim, node: usize) -> Self {
        Self {
            node_netns: sim.nodes[node].netns.clone(),
            netconf: sim.nodes[node].netconf(),
            pod_prefix: sim.prefix(),
        }
    }
}

/// One sandbox as the runtime names it to the plugin.
#[derive(Debug, Clone, Copy)]
pub struct Sandbox<'a> {
    /// `K8S_POD_NAME` (namespace `default`).
    pub pod_name: &'a str,
    /// `CNI_CONTAINERID`.
    pub container_id: &'a str,
    /// The pod's network namespace name.
    pub netns: &'a str,
}

/// Run `aws-cni` binary `bin` for `sandbox` as a CNI runtime does (`prev_result`, with its
/// `cniVersion`, for DEL). The plugin's result JSON (`Null` for an empty stdout), or its exit
/// code and output.
pub fn run_plugin(
    bin: &Path,
    target: &PluginTarget,
    command: &str,
    sandbox: Sandbox<'_>,
    prev_result: Option<&serde_json::Value>,
) -> Result<serde_json::Value, (i32, String)> {
    let mut conf: serde_json::Value = serde_json::from_str(&target.netconf).unwrap_or_default();
    if let Some(prev) = prev_result {
        conf["cniVersion"] = prev["cniVersion"].clone();
        conf["prevResult"] = prev.clone();
    }
    let out = exec_in_node(bin, &target.node_netns, command, sandbox, &conf)?;
    if out.stdout.trim().is_empty() {
        return Ok(serde_json::Value::Null);
    }
    serde_json::from_str(&out.stdout).map_err(|e| {
        (
            0,
            format!("result not JSON ({e}): {}{}", out.stdout, out.stderr),
        )
    })
}

/// One plugin call in a node as a runtime makes it: `bin` run in `node_netns` with `conf` (a
/// netconf, or one plugin of a conflist) on stdin and `sandbox` in the CNI environment. Its
/// output when it exits 0, else its exit code (-1: not started) and output. The single
/// plugin ([`run_plugin`]) and the chain ([`Sim::run_chain`]) both call plugins through here.
pub(super) fn exec_in_node(
    bin: &Path,
    node_netns: &str,
    command: &str,
    sandbox: Sandbox<'_>,
    conf: &serde_json::Value,
) -> Result<CniOutput, (i32, String)> {
    let call = CniCall::for_sandbox(
        command,
        sandbox.container_id,
        sandbox.pod_name,
        netns_path(sandbox.netns).into(),
        conf.to_string(),
    );
    let out = exec_plugin(
        crate::supervisor::netns_exec(node_netns, bin),
        &call,
        &[("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")],
    )
    .map_err(|e| (-1, format!("spawn {}: {e}", bin.display())))?;
    if out.code != 0 {
        return Err((out.code, format!("{}{}", out.stdout, out.stderr)));
    }
    Ok(out)
}

/// `/run/netns/<name>`.
#[must_use]
pub fn netns_path(name: &str) -> String {
    format!("{}/{name}", vpcsim::fabric::names::NETNS_DIR)
}
