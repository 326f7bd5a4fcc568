//! Shared by the security-groups-for-pods VM suites (`sgp_branch_vm.rs`, `sgp_fabric_vm.rs`):
//! the tools built on the host before the VM starts, the pod's `vpc.amazonaws.com/pod-eni`
//! annotation file `test-ipamd --branch-dir` answers from, the aws-cni conflist and libcni's
//! `cnitool` as the runtime. Must not: create namespaces or start processes of its own.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use integration::binaries::built_binary;
use integration::sim::Cnitool;

/// Where the host builds `cnitool` before the VM starts (outside /tmp, which the VM hides).
pub fn tool_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("vm-tools")
}

/// On the host, before the VM: the plugin, `test-ipamd` and `cnitool` (the VM cannot build).
pub fn prepare() {
    let _ = built_binary("aws-cni");
    let _ = built_binary("test-ipamd");
    let dir = tool_dir();
    std::fs::create_dir_all(&dir).expect("tool dir");
    Cnitool::build(&dir).expect("build cnitool");
}

/// One branch ENI as the pod's annotation carries it.
#[derive(Clone, Copy, Debug)]
pub struct Branch {
    /// 802.1Q id.
    pub vlan: u16,
    /// The branch's address.
    pub ip: &'static str,
    /// Its subnet.
    pub subnet: &'static str,
    /// The subnet's gateway.
    pub gateway: &'static str,
    /// The branch MAC.
    pub mac: &'static str,
}

/// Writes pod `default/<pod>`'s annotation (branch `b` on the trunk link `parent`) where
/// `test-ipamd --branch-dir dir` reads it.
pub fn write_annotation(dir: &Path, pod: &str, b: &Branch, parent: u32) {
    let body = serde_json::json!({
        "annotation": [{
            "eniId": format!("eni-branch{}", b.vlan),
            "ifAddress": b.mac,
            "privateIp": b.ip,
            "vlanID": b.vlan,
            "subnetCidr": b.subnet,
        }],
        "parentIfIndex": parent,
    });
    std::fs::write(dir.join(format!("default_{pod}.json")), body.to_string()).expect("annotation");
}

/// A one-plugin aws-cni conflist in `dir/net.d-<mode>` for `POD_SECURITY_GROUP_ENFORCING_MODE`
/// `mode`, logging to `dir/plugin.log`.
pub fn conflist(dir: &Path, ipamd_socket: &Path, mode: &str) -> PathBuf {
    let net_d = dir.join(format!("net.d-{mode}"));
    std::fs::create_dir_all(&net_d).expect("net.d");
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "aws-cni",
        "disableCheck": false,
        "plugins": [{
            "type": "aws-cni", "name": "aws-cni", "mtu": "9001", "vethPrefix": "eni",
            "podSGEnforcingMode": mode,
            "ipamdSocket": ipamd_socket,
            "pluginLogFile": dir.join("plugin.log"), "pluginLogLevel": "Debug",
        }],
    });
    std::fs::write(net_d.join("10-aws.conflist"), conf.to_string()).expect("conflist");
    net_d
}

/// Runs `cnitool <action> aws-cni <netns>` for pod `default/<pod>` (sandbox `sandbox-<pod>`)
/// through `in_node` (a command that runs its argument in the node's network namespace),
/// with the cache and the plugin log under `dir`; panics with the plugin log on failure.
pub fn cnitool(
    in_node: impl Fn(&Path) -> Command,
    dir: &Path,
    netconf: &Path,
    action: &str,
    pod: &str,
    netns: &str,
) -> String {
    let bin = tool_dir().join("cnitool");
    let plugins = built_binary("aws-cni")
        .parent()
        .expect("plugin dir")
        .display()
        .to_string();
    let out = in_node(&bin)
        .args([action, "aws-cni", netns])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("NETCONFPATH", netconf)
        .env("CNI_PATH", plugins)
        .env("CNI_CACHE_DIR", dir.join("cni-cache"))
        .env("CNI_CONTAINERID", format!("sandbox-{pod}"))
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}"),
        )
        .output()
        .expect("run cnitool");
    assert!(
        out.status.success(),
        "cnitool {action}: {}{}\nplugin log:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(dir.join("plugin.log")).unwrap_or_default()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
