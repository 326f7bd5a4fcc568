//! Runs the `aws-cni` binary directly, as a runtime would, inside a node's netns: the one
//! invocation ([`exec_plugin`]: CNI environment, stdin, exit code and output) behind the node
//! fixture's calls, the simulated VPC's pods and the upstream-node fixture's plugin runs.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::node::TestNode;

/// One plugin invocation.
#[derive(Debug, Clone)]
pub struct CniCall {
    /// `CNI_COMMAND`.
    pub command: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS` (empty string when `None`).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`.
    pub args: String,
    /// Network configuration (stdin).
    pub stdin: String,
}

impl CniCall {
    /// `command` for pod `default/pod-<i>` in sandbox `container-<i>` (netns `pod`), with the
    /// `CNI_ARGS` kubelet passes.
    #[must_use]
    pub fn for_pod(command: &str, i: usize, pod: &crate::PodNs, conf: &str) -> Self {
        let mut c = Self::new(
            command,
            &format!("container-{i}"),
            Some(pod.path.clone()),
            conf.to_owned(),
        );
        c.args = format!("IgnoreUnknown=1;K8S_POD_NAME=pod-{i};K8S_POD_NAMESPACE=default");
        c
    }

    /// `command` for pod `default/<pod_name>` in sandbox `container_id` as kubelet names it
    /// (`CNI_ARGS` with `K8S_POD_INFRA_CONTAINER_ID`), netns at `netns`.
    #[must_use]
    pub fn for_sandbox(
        command: &str,
        container_id: &str,
        pod_name: &str,
        netns: PathBuf,
        conf: String,
    ) -> Self {
        let mut c = Self::new(command, container_id, Some(netns), conf);
        c.args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod_name};K8S_POD_INFRA_CONTAINER_ID={container_id}"
        );
        c
    }

    /// A call with `eth0`, no args.
    #[must_use]
    pub fn new(command: &str, container_id: &str, netns: Option<PathBuf>, stdin: String) -> Self {
        Self {
            command: command.to_owned(),
            container_id: container_id.to_owned(),
            netns,
            ifname: "eth0".to_owned(),
            args: String::new(),
            stdin,
        }
    }
}

/// What the plugin printed and returned.
#[derive(Debug, Clone)]
pub struct CniOutput {
    /// Exit code.
    pub code: i32,
    /// Stdout.
    pub stdout: String,
    /// Stderr.
    pub stderr: String,
}

impl CniOutput {
    /// Stdout as JSON (panics if it is not JSON).
    #[must_use]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", self.stdout))
    }

    /// Panics unless the call succeeded.
    pub fn ok(self) -> Self {
        assert_eq!(
            self.code, 0,
            "plugin failed: {} {}",
            self.stdout, self.stderr
        );
        self
    }
}

/// Runs the plugin command `cmd` (program and namespace chosen by the caller) with exactly the
/// CNI environment of `call` plus `extra_env`, `call.stdin` on its stdin.
pub fn exec_plugin(
    mut cmd: Command,
    call: &CniCall,
    extra_env: &[(&str, &str)],
) -> std::io::Result<CniOutput> {
    let mut child = cmd
        .env_clear()
        .envs(extra_env.iter().copied())
        .env("CNI_COMMAND", &call.command)
        .env("CNI_CONTAINERID", &call.container_id)
        .env(
            "CNI_NETNS",
            call.netns
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        )
        .env("CNI_IFNAME", &call.ifname)
        .env("CNI_ARGS", &call.args)
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // a plugin that exits before reading leaves a broken pipe: its output says why
        let _ = stdin.write_all(call.stdin.as_bytes());
    }
    let out = child.wait_with_output()?;
    Ok(CniOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs `aws-cni` (with `bin`) inside `node`'s netns.
#[must_use]
pub fn run_plugin(node: &TestNode, bin: &std::path::Path, call: &CniCall) -> CniOutput {
    exec_plugin(node.command(bin), call, &[]).expect("run aws-cni")
}

impl TestNode {
    /// Runs `aws-cni` in this node.
    #[must_use]
    pub fn cni(&self, call: &CniCall) -> CniOutput {
        run_plugin(self, &crate::built_binary("aws-cni"), call)
    }
}
