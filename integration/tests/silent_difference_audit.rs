//! The "silent difference" audit (issue 26): every environment variable upstream's aws-node and
//! init containers read, set to a value other than its default, changes what this project does
//! or is refused. None is parsed and ignored.
//!
//! The list is upstream v1.23.1's, taken from its code (`cmd/aws-vpc-cni/main.go` for the
//! entrypoint and the conflist it writes, `cmd/aws-vpc-cni-init/main.go` for the init
//! container, `pkg/ipamd/ipamd.go`, `pkg/awsutils/awsutils.go`, `pkg/networkutils/network.go`,
//! `pkg/k8sapi/k8sutils.go`, `pkg/utils/logger` for ipamd), written here as data. Three readers
//! stand for ours: ipamd's `Config` (one parse at the edge), the conflist filler the aws-node
//! start-up runs (`aws_cni::conflist::fill` on the chart's template), and the chart's shell
//! steps (the init script and `files/aws-node.sh`), whose behaviour per value
//! `integration/chart/check_chart.py` runs in a throwaway network namespace.
#![allow(clippy::tests_outside_test_module)]

use std::collections::HashMap;
use std::path::Path;

/// Who reads a variable here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    /// ipamd's configuration.
    Ipamd,
    /// The conflist the aws-node start-up writes.
    Conflist,
    /// A shell step of the chart (the init container or `files/aws-node.sh`), exercised per
    /// value by `check_chart.py`.
    Chart,
}

/// One upstream variable: a non-default value, extra variables it needs to matter (e.g. the
/// IPv4 egress of an IPv6 cluster), and who reads it here.
struct Var {
    name: &'static str,
    value: &'static str,
    with: &'static [(&'static str, &'static str)],
    reader: Reader,
}

const fn v(name: &'static str, value: &'static str, reader: Reader) -> Var {
    Var {
        name,
        value,
        with: &[],
        reader,
    }
}

/// What the kubelet gives every pod (the in-cluster API) and the manifest's `MY_NODE_NAME`
/// (`valueFrom: spec.nodeName`): the variables that only matter with a Kubernetes client.
const IN_CLUSTER: &[(&str, &str)] = &[
    ("KUBERNETES_SERVICE_HOST", "10.100.0.1"),
    ("KUBERNETES_SERVICE_PORT", "443"),
    ("MY_NODE_NAME", "audit-node"),
];

/// Security groups for pods: the in-cluster API with `ENABLE_POD_ENI`.
const POD_ENI_CLUSTER: &[(&str, &str)] = &[
    ("KUBERNETES_SERVICE_HOST", "10.100.0.1"),
    ("KUBERNETES_SERVICE_PORT", "443"),
    ("MY_NODE_NAME", "audit-node"),
    ("ENABLE_POD_ENI", "true"),
];

const IPV6_CLUSTER: &[(&str, &str)] = &[
    ("ENABLE_IPv6", "true"),
    ("ENABLE_IPv4", "false"),
    ("ENABLE_PREFIX_DELEGATION", "true"),
];

/// Every variable upstream's aws-node and init containers read (upstream v1.23.1).
fn upstream_variables() -> Vec<Var> {
    use Reader::{Chart, Conflist, Ipamd};
    vec![
        v("ADDITIONAL_ENI_TAGS", r#"{"team":"net"}"#, Ipamd),
        v("ANNOTATE_POD_IP", "true", Ipamd),
        v("AWS_EC2_ENDPOINT", "http://127.0.0.1:4566", Ipamd),
        v("AWS_EXTERNAL_SERVICE_CIDRS", "10.9.0.0/16", Ipamd),
        v("AWS_MANAGE_ENIS_NON_SCHEDULABLE", "true", Ipamd),
        v("AWS_VPC_CNI_NODE_PORT_SUPPORT", "false", Ipamd),
        v("AWS_VPC_ENI_MTU", "1500", Ipamd),
        v(
            "AWS_VPC_K8S_CNI_BACKING_STORE",
            "/tmp/audit-ipam.json",
            Ipamd,
        ),
        v("AWS_VPC_K8S_CNI_CONNMARK", "0x100", Ipamd),
        v("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true", Ipamd),
        v("AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS", "10.9.0.0/16", Ipamd),
        v("AWS_VPC_K8S_CNI_EXTERNALSNAT", "true", Ipamd),
        v("AWS_VPC_K8S_CNI_LOGLEVEL", "ERROR", Ipamd),
        v("AWS_VPC_K8S_CNI_LOG_FILE", "/tmp/audit-ipamd.log", Ipamd),
        v("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "none", Ipamd),
        v("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "none", Conflist),
        v("AWS_VPC_K8S_CNI_VETHPREFIX", "abc", Ipamd),
        v("AWS_VPC_K8S_CNI_VETHPREFIX", "abc", Conflist),
        Var {
            name: "AWS_VPC_K8S_EGRESS_V4_PLUGIN_LOG_FILE",
            value: "/tmp/audit-egress4.log",
            with: IPV6_CLUSTER,
            reader: Conflist,
        },
        Var {
            name: "AWS_VPC_K8S_EGRESS_V6_PLUGIN_LOG_FILE",
            value: "/tmp/audit-egress6.log",
            with: &[("ENABLE_V6_EGRESS", "true")],
            reader: Conflist,
        },
        v(
            "AWS_VPC_K8S_PLUGIN_LOG_FILE",
            "/tmp/audit-plugin.log",
            Conflist,
        ),
        v("AWS_VPC_K8S_PLUGIN_LOG_FILE", "stdout", Ipamd),
        v("AWS_VPC_K8S_PLUGIN_LOG_LEVEL", "ERROR", Conflist),
        Var {
            name: "CLUSTER_ENDPOINT",
            value: "https://127.0.0.1:6443",
            with: IN_CLUSTER,
            reader: Ipamd,
        },
        v("CLUSTER_NAME", "audit", Ipamd),
        v("DISABLE_INTROSPECTION", "true", Ipamd),
        v("DISABLE_LEAKED_ENI_CLEANUP", "true", Ipamd),
        v("DISABLE_METRICS", "true", Ipamd),
        v("DISABLE_NETWORK_RESOURCE_PROVISIONING", "true", Ipamd),
        v("DISABLE_POD_V6", "true", Conflist),
        v("DISABLE_TCP_EARLY_DEMUX", "true", Chart),
        v("ENABLE_BANDWIDTH_PLUGIN", "true", Conflist),
        v("ENABLE_IMDS_ONLY_MODE", "true", Ipamd),
        v("ENABLE_IPv4", "false", Ipamd),
        v("ENABLE_IPv6", "true", Ipamd),
        v("ENABLE_IPv6", "true", Chart),
        v("ENABLE_MULTI_NIC", "true", Ipamd),
        Var {
            name: "ENABLE_POD_ENI",
            value: "true",
            with: IN_CLUSTER,
            reader: Ipamd,
        },
        v("ENABLE_PREFIX_DELEGATION", "true", Ipamd),
        v("ENABLE_SUBNET_DISCOVERY", "false", Ipamd),
        Var {
            name: "ENABLE_V4_EGRESS",
            value: "false",
            with: IPV6_CLUSTER,
            reader: Conflist,
        },
        v("ENABLE_V6_EGRESS", "true", Ipamd),
        v("ENABLE_V6_EGRESS", "true", Conflist),
        v("ENABLE_V6_EGRESS", "true", Chart),
        v("ENI_CONFIG_ANNOTATION_DEF", "audit/eniconfig", Ipamd),
        v("ENI_CONFIG_LABEL_DEF", "audit/eniconfig", Ipamd),
        v("HOST_CNI_BIN_PATH", "/host/audit/bin", Chart),
        v("HOST_CNI_CONFDIR_PATH", "/host/audit/net.d", Chart),
        // Upstream's minimum is 10 s (a smaller value is its default).
        v("HTTP_TIMEOUT", "30", Ipamd),
        v("INTROSPECTION_BIND_ADDRESS", "127.0.0.1:61680", Ipamd),
        v("IP_COOLDOWN_PERIOD", "5", Ipamd),
        v("MANAGE_UNTAGGED_ENI", "false", Ipamd),
        v("MAX_ENI", "2", Ipamd),
        v("MINIMUM_IP_TARGET", "5", Ipamd),
        Var {
            name: "MY_NODE_NAME",
            value: "audit-node",
            with: &[
                ("KUBERNETES_SERVICE_HOST", "10.100.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
            ],
            reader: Ipamd,
        },
        Var {
            name: "MY_POD_NAME",
            value: "aws-node-audit",
            with: IN_CLUSTER,
            reader: Ipamd,
        },
        v("NETWORK_POLICY_ENFORCING_MODE", "strict", Ipamd),
        v("POD_MTU", "1500", Conflist),
        v("POD_SECURITY_GROUP_ENFORCING_MODE", "standard", Conflist),
        Var {
            name: "POD_SECURITY_GROUP_ENFORCING_MODE",
            value: "standard",
            with: POD_ENI_CLUSTER,
            reader: Ipamd,
        },
        v("VPC_CNI_VERSION", "v9.9.9-audit", Ipamd),
        v("WARM_ENI_TARGET", "3", Ipamd),
        v("WARM_IP_TARGET", "3", Ipamd),
        v("WARM_PREFIX_TARGET", "2", Ipamd),
    ]
}

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// What the chart's aws-node container always sets (upstream's manifest too): an IPv4
/// cluster. Each case's own variables come after it and win.
const IPAMD_BASE: &[(&str, &str)] = &[("ENABLE_IPv4", "true"), ("ENABLE_IPv6", "false")];

/// ipamd's configuration without its warnings (what it does, not what it says), or the
/// refusal.
fn ipamd_config(pairs: &[(&str, &str)]) -> Result<String, String> {
    let mut all = IPAMD_BASE.to_vec();
    all.extend_from_slice(pairs);
    ipamd::config::Config::from_env_map(&env(&all))
        .map(|mut c| {
            c.warnings.clear();
            format!("{c:?}")
        })
        .map_err(|e| e.to_string())
}

/// The chart's conflist template (`files/10-aws.conflist`, also in the aws-node image).
fn conflist_template() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join("charts/aws-vpc-cni/files/10-aws.conflist"))
        .expect("the conflist template")
}

fn conflist(template: &str, pairs: &[(&str, &str)]) -> Result<String, String> {
    let primary = |f: aws_cni::conflist::NodeIpFamily| -> Result<String, String> {
        Ok(match f {
            aws_cni::conflist::NodeIpFamily::V4 => "198.18.0.10".to_owned(),
            aws_cni::conflist::NodeIpFamily::V6 => "2001:db8::10".to_owned(),
        })
    };
    aws_cni::conflist::fill(template, &env(pairs), &primary)
        .map(|f| f.text)
        .map_err(|e| e.to_string())
}

/// The chart's shell steps, as text.
fn chart_shell() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/aws-vpc-cni");
    [
        "templates/daemonset.yaml",
        "files/aws-node.sh",
        "files/aws-vpc-cni-init.sh",
    ]
    .iter()
    .map(|f| std::fs::read_to_string(root.join(f)).expect("a chart file"))
    .collect()
}

#[test]
fn no_upstream_variable_is_parsed_and_ignored() {
    let template = conflist_template();
    let shell = chart_shell();
    let mut silent = Vec::new();
    for var in upstream_variables() {
        let mut with_var: Vec<(&str, &str)> = var.with.to_vec();
        with_var.push((var.name, var.value));
        let changed = match var.reader {
            Reader::Ipamd => {
                let base = ipamd_config(var.with).expect("the base configuration is accepted");
                ipamd_config(&with_var).map_or(true, |c| c != base)
            }
            Reader::Conflist => {
                let base = conflist(&template, var.with).expect("the base conflist is filled");
                conflist(&template, &with_var).map_or(true, |c| c != base)
            }
            // What each value does there is run by check_chart.py; here: the step reads it.
            Reader::Chart => {
                shell.contains(&format!("${{{}", var.name))
                    || shell.contains(&format!("parse_bool {}", var.name))
            }
        };
        if !changed {
            silent.push(format!("{}={} ({:?})", var.name, var.value, var.reader));
        }
    }
    assert!(
        silent.is_empty(),
        "upstream variables parsed and ignored (set, and nothing changes nor is refused): {silent:#?}"
    );
}

/// The audit's own check: a variable nobody reads is reported (so the test above can fail).
#[test]
fn the_audit_sees_a_variable_nobody_reads() {
    let base = ipamd_config(&[]).unwrap();
    assert_eq!(
        ipamd_config(&[("AWS_VPC_K8S_CNI_NOT_A_VARIABLE", "true")]).unwrap(),
        base
    );
    let template = conflist_template();
    assert_eq!(
        conflist(&template, &[("NOT_A_VARIABLE", "1")]).unwrap(),
        conflist(&template, &[]).unwrap()
    );
}
