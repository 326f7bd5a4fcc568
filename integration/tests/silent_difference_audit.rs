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
use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{KubeOptions, Sim, SimConfig, call_delta, exec_in};
use ipamd::aws::{ENI_DESCRIPTION_PREFIX, TAG_CLUSTER_NAME, TAG_CREATED_AT, TAG_INSTANCE_ID};

/// Who reads a variable here, and so where its effect is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reader {
    /// ipamd: the real binary on a simulated node in a context ([`Ctx`]), observed
    /// ([`fingerprint`]): a refused start, its EC2 calls and the node's ENIs in EC2, the
    /// node's rules, routes, iptables/nftables and link MTUs, its listening sockets, the files
    /// it writes, the levels it logs at, a pod's ADD, the node's Kubernetes objects.
    Ipamd(Ctx),
    /// The conflist the aws-node start-up writes.
    Conflist,
    /// A shell step of the chart (the init container or `files/aws-node.sh`), exercised per
    /// value by `check_chart.py`.
    Chart,
    /// Its effect needs a scenario of its own (minutes of EC2 latency, a cordoned node, an
    /// ENIConfig chosen by a custom key, an untagged ENI, the hourly clean-up...): the named
    /// test sets the value and asserts the effect; the audit checks that the test exists.
    Pinned(&'static str),
}

/// Where ipamd runs for a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Ctx {
    /// An m5.large node of the simulated VPC, no Kubernetes API.
    Plain,
    /// A c6in.32xlarge (two network cards).
    MultiCard,
    /// An m5.large with the simulated Kubernetes API (the chart's RBAC, the node's Node and
    /// aws-node Pod; the in-cluster environment the kubelet gives the pod), and an IAM policy
    /// without `ec2:CreateTags`, so that ipamd posts an Event on its pod.
    Kube,
    /// [`Ctx::Kube`] with custom networking: ENIConfigs `cfg-a` and `cfg-b` (two more subnets
    /// of the node's zone); the Node labelled `k8s.amazonaws.com/eniConfig=cfg-a` and, under the
    /// key `audit/eniconfig`, labelled and annotated `cfg-b`.
    CustomNetworking,
    /// An m5.large beside a subnet of its zone tagged `kubernetes.io/role/cni=1` with more free
    /// addresses than the node's.
    TaggedSubnet,
    /// An m5.large, a leaked ENI of the cluster in the VPC (available, tagged by an instance
    /// that is gone, created long ago) and the clean-up every minute (first run within 5 s):
    /// whether it is still there 8 s after ipamd started.
    LeakedEni,
    /// An m5.large with an ENI attached before ipamd starts that carries no tag at all.
    Untagged,
    /// An m5.large whose pool is capped at two addresses: pods a and b, a deleted, 6 s later
    /// pod c: whether c gets a's address (its cooldown over) or nothing.
    Churn,
}

impl Ctx {
    /// What the context's node runs ipamd with, besides the case's variables.
    fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::LeakedEni => &[("IPAMD_LEAKED_ENI_PERIOD_SECONDS", "60")],
            Self::Churn => &[
                ("WARM_IP_TARGET", "1"),
                ("MINIMUM_IP_TARGET", "2"),
                ("IPAMD_MAX_PODS", "2"),
                ("IPAMD_ADD_WAIT_TIMEOUT", "1"),
            ],
            Self::CustomNetworking => &[("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true")],
            _ => &[],
        }
    }
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

const IPV6_CLUSTER: &[(&str, &str)] = &[
    ("ENABLE_IPv6", "true"),
    ("ENABLE_IPv4", "false"),
    ("ENABLE_PREFIX_DELEGATION", "true"),
];

const fn on(ctx: Ctx, name: &'static str, value: &'static str) -> Var {
    v(name, value, Reader::Ipamd(ctx))
}

/// Every variable upstream's aws-node and init containers read (upstream v1.23.1).
#[allow(clippy::too_many_lines)]
fn upstream_variables() -> Vec<Var> {
    use Ctx::{Churn, CustomNetworking, Kube, LeakedEni, MultiCard, Plain, TaggedSubnet, Untagged};
    use Reader::{Chart, Conflist, Pinned};
    vec![
        on(Plain, "ADDITIONAL_ENI_TAGS", r#"{"team":"net"}"#),
        // without a Kubernetes client: warned at start; with one, the pod's annotation
        on(Plain, "ANNOTATE_POD_IP", "true"),
        on(Plain, "AWS_EC2_ENDPOINT", "http://127.0.0.1:4566"),
        on(Plain, "AWS_EXTERNAL_SERVICE_CIDRS", "10.9.0.0/16"),
        v(
            "AWS_MANAGE_ENIS_NON_SCHEDULABLE",
            "true",
            Pinned("e2e_unschedulable::"),
        ),
        on(Plain, "AWS_VPC_CNI_NODE_PORT_SUPPORT", "false"),
        on(Plain, "AWS_VPC_ENI_MTU", "1500"),
        on(
            Plain,
            "AWS_VPC_K8S_CNI_BACKING_STORE",
            "/tmp/audit-ipam.json",
        ),
        on(Plain, "AWS_VPC_K8S_CNI_CONNMARK", "0x100"),
        on(Plain, "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true"),
        on(Plain, "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS", "10.9.0.0/16"),
        on(Plain, "AWS_VPC_K8S_CNI_EXTERNALSNAT", "true"),
        on(Plain, "AWS_VPC_K8S_CNI_LOGLEVEL", "ERROR"),
        on(Plain, "AWS_VPC_K8S_CNI_LOG_FILE", "/tmp/audit-ipamd.log"),
        on(Plain, "AWS_VPC_K8S_CNI_RANDOMIZESNAT", "none"),
        v("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "none", Conflist),
        on(Plain, "AWS_VPC_K8S_CNI_VETHPREFIX", "abc"),
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
        on(Plain, "AWS_VPC_K8S_PLUGIN_LOG_FILE", "stdout"),
        v("AWS_VPC_K8S_PLUGIN_LOG_LEVEL", "ERROR", Conflist),
        on(Kube, "CLUSTER_ENDPOINT", "https://127.0.0.1:6443"),
        on(Plain, "CLUSTER_NAME", "audit"),
        on(Plain, "DISABLE_INTROSPECTION", "true"),
        on(LeakedEni, "DISABLE_LEAKED_ENI_CLEANUP", "true"),
        on(Plain, "DISABLE_METRICS", "true"),
        on(Plain, "DISABLE_NETWORK_RESOURCE_PROVISIONING", "true"),
        v("DISABLE_POD_V6", "true", Conflist),
        v("DISABLE_TCP_EARLY_DEMUX", "true", Chart),
        v("ENABLE_BANDWIDTH_PLUGIN", "true", Conflist),
        on(Plain, "ENABLE_IMDS_ONLY_MODE", "true"),
        on(Plain, "ENABLE_IPv4", "false"),
        on(Plain, "ENABLE_IPv6", "true"),
        v("ENABLE_IPv6", "true", Chart),
        on(MultiCard, "ENABLE_MULTI_NIC", "true"),
        on(Kube, "ENABLE_POD_ENI", "true"),
        on(Plain, "ENABLE_PREFIX_DELEGATION", "true"),
        on(TaggedSubnet, "ENABLE_SUBNET_DISCOVERY", "false"),
        Var {
            name: "ENABLE_V4_EGRESS",
            value: "false",
            with: IPV6_CLUSTER,
            reader: Conflist,
        },
        on(Plain, "ENABLE_V6_EGRESS", "true"),
        v("ENABLE_V6_EGRESS", "true", Conflist),
        v("ENABLE_V6_EGRESS", "true", Chart),
        on(
            CustomNetworking,
            "ENI_CONFIG_ANNOTATION_DEF",
            "audit/eniconfig",
        ),
        on(CustomNetworking, "ENI_CONFIG_LABEL_DEF", "audit/eniconfig"),
        v("HOST_CNI_BIN_PATH", "/host/audit/bin", Chart),
        v("HOST_CNI_CONFDIR_PATH", "/host/audit/net.d", Chart),
        // Upstream's minimum is 10 s (a smaller value is its default).
        v(
            "HTTP_TIMEOUT",
            "30",
            Pinned("aws_vpcsim::http_timeout_bounds_each_ec2_attempt"),
        ),
        on(Plain, "INTROSPECTION_BIND_ADDRESS", "127.0.0.1:61680"),
        on(Churn, "IP_COOLDOWN_PERIOD", "5"),
        on(Untagged, "MANAGE_UNTAGGED_ENI", "false"),
        on(Plain, "MAX_ENI", "1"),
        on(Plain, "MINIMUM_IP_TARGET", "5"),
        on(Kube, "MY_NODE_NAME", "audit-node"),
        on(Kube, "MY_POD_NAME", "aws-node-audit"),
        on(Plain, "NETWORK_POLICY_ENFORCING_MODE", "strict"),
        v("POD_MTU", "1500", Conflist),
        v("POD_SECURITY_GROUP_ENFORCING_MODE", "standard", Conflist),
        Var {
            name: "POD_SECURITY_GROUP_ENFORCING_MODE",
            value: "standard",
            with: &[("ENABLE_POD_ENI", "true")],
            reader: Reader::Ipamd(Kube),
        },
        on(Plain, "VPC_CNI_VERSION", "v9.9.9-audit"),
        on(Plain, "WARM_ENI_TARGET", "3"),
        on(Plain, "WARM_IP_TARGET", "3"),
        Var {
            name: "WARM_PREFIX_TARGET",
            value: "2",
            with: &[("ENABLE_PREFIX_DELEGATION", "true")],
            reader: Reader::Ipamd(Plain),
        },
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

/// ipamd's configuration without its warnings, or the refusal: only for the audit's own
/// check that an unknown variable is ignored by the parser (the audit proper runs ipamd).
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

/// Where a node's ipamd runs for `ctx`.
fn sim_config(ctx: Ctx) -> SimConfig {
    SimConfig {
        nodes: 1,
        instance_type: match ctx {
            Ctx::MultiCard => "c6in.32xlarge".into(),
            _ => "m5.large".into(),
        },
        kube: matches!(ctx, Ctx::Kube | Ctx::CustomNetworking).then(KubeOptions::default),
        layout: vpcsim::Layout {
            azs: 1,
            subnets_per_az: if ctx == Ctx::CustomNetworking { 3 } else { 2 },
            secondary_cidr: None,
        },
        ..SimConfig::default()
    }
}

/// Paths the audit's values point ipamd at, outside the run's directory (removed at the end).
const AUDIT_FILES: &[&str] = &["/tmp/audit-ipam.json", "/tmp/audit-ipamd.log"];

fn sh(ns: &str, args: &[&str]) -> String {
    String::from_utf8_lossy(&exec_in(ns, args).stdout).into_owned()
}

/// Counters and comments out of a ruleset dump: what is configured, not what traffic did.
fn rules_only(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let l = match l.find(" counter packets ") {
                Some(i) => &l[..i],
                None => l,
            };
            if l.starts_with(':') {
                // `:CHAIN POLICY [packets:bytes]`
                l.rsplit_once(' ').map_or(l, |(head, _)| head)
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every route of `family` (`-4`, `-6`) in every table, but the kernel's link-local ones.
fn routes(ns: &str, family: &str) -> String {
    sh(ns, &["ip", family, "route", "show", "table", "all"])
        .lines()
        .filter(|l| !l.starts_with("local fe80:"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The node as ipamd left it: its ENIs in EC2, its host networking, its sockets and files.
fn node_state(sim: &Sim) -> String {
    let id = sim.nodes[0].instance_id.clone();
    let enis = sim.world.read(|s| {
        let mut v: Vec<String> = s
            .enis
            .values()
            .filter_map(|e| {
                let a = e.attachment.as_ref().filter(|a| a.instance_id == id)?;
                let tags: Vec<String> = e
                    .tags
                    .iter()
                    .filter(|(k, _)| !k.contains("createdAt"))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                Some(format!(
                    "card {} device {}: {}, {} addresses, {} prefixes, tags {tags:?}, groups {:?}",
                    a.network_card_index,
                    a.device_index,
                    e.subnet_id,
                    e.private_ips.len(),
                    e.ipv4_prefixes.len() + e.ipv6_prefixes.len(),
                    e.groups
                ))
            })
            .collect();
        v.sort();
        v
    });
    let ns = &sim.nodes[0].netns;
    let links: Vec<String> = sh(ns, &["ip", "-o", "link", "show"])
        .lines()
        .filter_map(|l| {
            let name = l.split(": ").nth(1)?;
            let mtu = l.split(" mtu ").nth(1)?.split(' ').next()?;
            Some(format!("{name} mtu {mtu}"))
        })
        .collect();
    let mut sockets: Vec<String> = sh(ns, &["ss", "-ltnH"])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_owned))
        .collect();
    sockets.sort();
    let mut files: Vec<String> = std::fs::read_dir(&sim.nodes[0].dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    format!(
        "enis {enis:#?}\nlinks {links:?}\nsockets {sockets:?}\nfiles {files:?}\n\
         rules\n{}\n{}\nroutes\n{}\n{}\niptables\n{}\nip6tables\n{}\nnft\n{}",
        sh(ns, &["ip", "rule", "show"]),
        sh(ns, &["ip", "-6", "rule", "show"]),
        // (a veth's link-local address follows its random MAC: the kernel's, not ipamd's)
        routes(ns, "-4"),
        routes(ns, "-6"),
        rules_only(&sh(ns, &["iptables-save"])),
        rules_only(&sh(ns, &["ip6tables-save"])),
        rules_only(&sh(ns, &["nft", "list", "ruleset"])),
    )
}

/// The node's Kubernetes objects ipamd may change (its Node's labels, annotations and taints,
/// its CNINode) and the reasons of the Events ipamd posted.
fn kube_state(sim: &Sim) -> String {
    let Some(k) = sim.kube() else {
        return String::new();
    };
    let name = k.node_name(0).to_owned();
    let node = k
        .api
        .get_object("v1", "Node", None, &name)
        .unwrap_or_default();
    let cni_node = k
        .api
        .get_object("networking.k8s.aws/v1alpha1", "CNINode", None, &name)
        .map(|c| c["spec"].clone())
        .unwrap_or_default();
    let mut reasons: Vec<String> = sim
        .kube_events(None)
        .unwrap_or_default()
        .iter()
        .filter_map(|e| {
            let reason = e["reason"].as_str()?;
            Some(format!("{reason} on {}", e["involvedObject"]["name"]))
        })
        .collect();
    reasons.sort();
    reasons.dedup();
    format!(
        "labels {}\nannotations {}\ntaints {}\ncninode {cni_node}\nevents {reasons:?}",
        node["metadata"]["labels"], node["metadata"]["annotations"], node["spec"]["taints"]
    )
}

/// What the real ipamd does on a fresh simulated node of `ctx` with `pairs` (after the
/// harness's own environment): refused at start, or the node after it settled plus one pod's
/// ADD, its EC2 calls (which actions) and the levels of its log.
fn fingerprint(ctx: Ctx, pairs: &[(&str, &str)]) -> String {
    let mut sim = Sim::start(&sim_config(ctx)).expect("simulated VPC");
    let mut all: Vec<(&str, &str)> = vec![("IPAMD_POOL_TICK_SECONDS", "1")];
    all.extend_from_slice(ctx.env());
    all.extend_from_slice(pairs);
    let node = sim.nodes[0].instance_id.clone();
    let extra_eni = match ctx {
        Ctx::LeakedEni | Ctx::Untagged => {
            let eni = sim
                .world
                .mutate(|s, now| {
                    let subnet = s.instances[&node].subnet_id.clone();
                    let tags = if ctx == Ctx::LeakedEni {
                        [
                            (TAG_CLUSTER_NAME, "vpcsim-e2e"),
                            (TAG_INSTANCE_ID, "i-0000000000000dead"),
                            (TAG_CREATED_AT, "2020-01-01T00:00:00Z"),
                        ]
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect()
                    } else {
                        std::collections::BTreeMap::new()
                    };
                    let id = s.create_eni(vpcsim::state::CreateEni {
                        subnet_id: subnet,
                        description: format!("{ENI_DESCRIPTION_PREFIX}i-0000000000000dead"),
                        secondary_count: 2,
                        tags,
                        ..vpcsim::state::CreateEni::default()
                    })?;
                    if ctx == Ctx::Untagged {
                        s.attach_eni(&id, &node, 1, now)?;
                    }
                    Ok(id)
                })
                .expect("the context's ENI");
            Some(eni)
        }
        _ => None,
    };
    prepare(&sim, ctx);
    let before = sim.calls.snapshot();
    let started = std::time::Instant::now();
    if let Err(e) = sim.start_ipamd(0, &all, Duration::from_secs(30)) {
        let tail = sim.ipamd_log_tail(0, 3);
        return format!(
            "refused at start ({}): {tail}",
            e.to_string().lines().next().unwrap_or("")
        );
    }
    settle(&sim);
    let pod = if ctx == Ctx::Churn {
        churn(&mut sim)
    } else {
        match sim.add_pod(0, "audit") {
            Ok(p) => format!(
                "pod ADD ok: {} interfaces, ipv6 {}",
                p.result["interfaces"].as_array().map_or(0, Vec::len),
                p.ipv6.is_some()
            ),
            Err(e) => format!("pod ADD failed: code {}", e.code),
        }
    };
    let extra = match (ctx, &extra_eni) {
        (Ctx::LeakedEni, Some(eni)) => {
            std::thread::sleep(Duration::from_secs(8).saturating_sub(started.elapsed()));
            format!(
                "leaked eni still there: {}",
                sim.world.read(|s| s.enis.contains_key(eni))
            )
        }
        _ => String::new(),
    };
    settle(&sim);
    let actions: Vec<String> = call_delta(&before, &sim.calls.snapshot())
        .into_keys()
        .collect();
    let log = std::fs::read_to_string(sim.nodes[0].ipamd_log()).unwrap_or_default();
    let mut levels: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|j| j["level"].as_str().map(str::to_owned))
        .collect();
    levels.sort();
    levels.dedup();
    let warnings: std::collections::BTreeSet<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|j| j["level"] == "warn" && j["variable"].is_string())
        .filter_map(|j| j["variable"].as_str().map(str::to_owned))
        .collect();
    let apps = sim.calls.user_agent_apps();
    let out = format!(
        "{pod}\n{extra}\nec2 actions {actions:?}\nuser agents {apps:?}\nlog levels {levels:?}\n\
         warned about {warnings:?}\n{}\n{}",
        node_state(&sim),
        kube_state(&sim)
    );
    drop(sim);
    out
}

/// One fingerprint to take: a context and the whole environment of the case.
type Job = (Ctx, Vec<(&'static str, &'static str)>);

/// The fingerprints of `jobs`, three simulated nodes at a time (each run mostly waits).
fn fingerprints(jobs: &[Job]) -> Vec<String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out: Vec<std::sync::Mutex<String>> = jobs
        .iter()
        .map(|_| std::sync::Mutex::new(String::new()))
        .collect();
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some((ctx, env)) = jobs.get(i) else {
                        return;
                    };
                    let f = fingerprint(*ctx, env);
                    *out[i]
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = f;
                }
            });
        }
    });
    out.into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        })
        .collect()
}

/// What a context puts in place before ipamd starts (besides its ENIs).
fn prepare(sim: &Sim, ctx: Ctx) {
    let node = sim.nodes[0].instance_id.clone();
    let own = sim.world.read(|s| s.instances[&node].subnet_id.clone());
    let others: Vec<String> = sim
        .subnets_in_zone(&sim.node_zone(0))
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| *id != own)
        .collect();
    match ctx {
        Ctx::Kube | Ctx::CustomNetworking => {
            let mut knobs = sim.world.knobs();
            knobs.denied_actions = vec!["CreateTags".into()];
            sim.world.set_knobs(knobs);
        }
        Ctx::TaggedSubnet => {
            sim.world
                .mutate(|s, _| {
                    s.create_tags(
                        &[others[0].clone()],
                        &std::collections::BTreeMap::from([(
                            "kubernetes.io/role/cni".to_owned(),
                            "1".to_owned(),
                        )]),
                    )
                })
                .expect("subnet tagged");
        }
        _ => {}
    }
    if ctx == Ctx::CustomNetworking {
        sim.apply_eniconfig("cfg-a", &others[0], &[])
            .expect("ENIConfig cfg-a");
        sim.apply_eniconfig("cfg-b", &others[1], &[])
            .expect("ENIConfig cfg-b");
        let k = sim.kube().expect("kube");
        let mut n = k
            .api
            .get_object("v1", "Node", None, k.node_name(0))
            .expect("the Node");
        if let Some(meta) = n["metadata"].as_object_mut() {
            meta.remove("resourceVersion");
        }
        n["metadata"]["labels"]["k8s.amazonaws.com/eniConfig"] = "cfg-a".into();
        n["metadata"]["labels"]["audit/eniconfig"] = "cfg-b".into();
        if !n["metadata"]["annotations"].is_object() {
            n["metadata"]["annotations"] = serde_json::json!({});
        }
        n["metadata"]["annotations"]["audit/eniconfig"] = "cfg-b".into();
        k.api.cluster().apply_object(n).expect("Node labelled");
    }
}

/// Waits until the node is unchanged for 2.5 s (at most 30 s): the pool loop's answer to a
/// start or a pod (a warm ENI after the first pod) is part of what a variable changes.
fn settle(sim: &Sim) {
    let mut last = String::new();
    let mut same = 0;
    for _ in 0..60 {
        let now = node_state(sim);
        same = if now == last { same + 1 } else { 0 };
        last = now;
        if same >= 5 {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// [`Ctx::Churn`]'s pods: a and b take the pool's two addresses, a goes, c comes 6 s later.
fn churn(sim: &mut Sim) -> String {
    let a = match sim.add_pod(0, "churn-a") {
        Ok(p) => p,
        Err(e) => return format!("pod a failed: code {}", e.code),
    };
    if let Err(e) = sim.add_pod(0, "churn-b") {
        return format!("pod b failed: code {}", e.code);
    }
    if let Err(e) = sim.del_pod(&a) {
        return format!("DEL a failed: code {}", e.code);
    }
    std::thread::sleep(Duration::from_secs(6));
    match sim.add_pod(0, "churn-c") {
        Ok(c) => format!("pod c got a's address: {}", c.ip == a.ip),
        Err(e) => format!("pod c failed: code {}", e.code),
    }
}

#[test]
fn no_upstream_variable_is_parsed_and_ignored() {
    if !can_run_kernel_tests() {
        return;
    }
    let template = conflist_template();
    let shell = chart_shell();
    let tests_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Every fingerprint the cases need, each environment once; the audit's own checks first:
    // the same environment gives the same fingerprint, and a variable nobody reads changes
    // nothing (else every case would pass whatever ipamd does).
    let base_of = |var: &Var| -> Vec<(&'static str, &'static str)> {
        let mut env = IPAMD_BASE.to_vec();
        env.extend_from_slice(var.with);
        env
    };
    let mut unknown = IPAMD_BASE.to_vec();
    unknown.push(("AWS_VPC_K8S_CNI_NOT_A_VARIABLE", "true"));
    let mut jobs: Vec<Job> = vec![
        (Ctx::Plain, IPAMD_BASE.to_vec()),
        (Ctx::Plain, IPAMD_BASE.to_vec()),
        (Ctx::Plain, unknown),
    ];
    let vars = upstream_variables();
    for var in &vars {
        if let Reader::Ipamd(ctx) = var.reader {
            let base = (ctx, base_of(var));
            if !jobs[1..].contains(&base) {
                jobs.push(base);
            }
            let mut env = base_of(var);
            env.push((var.name, var.value));
            jobs.push((ctx, env));
        }
    }
    let prints = fingerprints(&jobs);
    for f in AUDIT_FILES {
        let _ = std::fs::remove_file(f);
    }
    assert_eq!(prints[0], prints[1], "the fingerprint is stable");
    assert_eq!(prints[0], prints[2], "an unknown variable changes nothing");
    let print_of = |job: &Job| -> &String {
        let i = jobs[1..].iter().position(|j| j == job).expect("taken") + 1;
        &prints[i]
    };
    let mut silent = Vec::new();
    for var in &vars {
        let mut with_var: Vec<(&str, &str)> = var.with.to_vec();
        with_var.push((var.name, var.value));
        let changed = match var.reader {
            Reader::Ipamd(ctx) => {
                let base = print_of(&(ctx, base_of(var)));
                let mut env = base_of(var);
                env.push((var.name, var.value));
                let got = print_of(&(ctx, env));
                if got == base {
                    eprintln!(
                        "{}={}: nothing observable changed\n{got}",
                        var.name, var.value
                    );
                }
                got != base
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
            Reader::Pinned(test) => pinned_test_exists(&tests_dir, test, var.name),
        };
        if !changed {
            silent.push(format!("{}={} ({:?})", var.name, var.value, var.reader));
        }
    }
    assert!(
        silent.is_empty(),
        "upstream variables parsed and ignored (set, and nothing observable changes nor is the start refused): {silent:#?}"
    );
}

/// Whether a test named `module::prefix` (a test file or a module path of ipamd's unit tests,
/// then the start of a test function's name; an empty prefix: any test of it) exists in a file
/// that sets `var`.
fn pinned_test_exists(root: &Path, test: &str, var: &str) -> bool {
    let (module, prefix) = test.rsplit_once("::").unwrap_or((test, ""));
    let mut candidates = vec![root.join(format!("integration/tests/{module}.rs"))];
    let path = module.replace("::", "/");
    candidates.push(root.join(format!("ipamd/src/{path}.rs")));
    candidates.push(root.join(format!("ipamd/src/{path}/mod.rs")));
    candidates.push(root.join(format!("ipamd/tests/{path}.rs")));
    candidates.iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|text| {
            text.contains(var)
                && text.lines().collect::<Vec<_>>().windows(2).any(|w| {
                    w[0].trim_start().starts_with("#[")
                        && w[0].contains("test")
                        && w[1]
                            .trim_start()
                            .trim_start_matches("async ")
                            .starts_with(&format!("fn {prefix}"))
                })
        })
    })
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
