//! DEL touches only what provably belongs to its own sandbox (issue 18): kernel tests with the
//! real `aws-cni` executed as a runtime does (CNI environment, libcni-style `prevResult`).
//!
//! - A StatefulSet pod re-created on the same node (sandbox C2 added before C1 is deleted, both
//!   computing the same host veth name), with the real `ipamd`: C1's DELs leave C2 wired.
//! - A retried DEL whose address ipamd already released and gave to another pod (the first DEL
//!   was killed right after ipamd answered, before any teardown), with `test-ipamd` (which
//!   hands out the lowest free address at once): the other pod keeps its route and rules,
//!   whether ipamd answers "unknown pod" or is down.
//! - ADD after such an unfinished teardown: an earlier owner's `from X` rule to another
//!   ENI's table is removed, so the new pod's egress leaves by its own ENI.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::process::Command;

use integration::node::{SECONDARY_TABLE, VPC_SERVICE_IP};
use integration::{CniCall, PodNs, TestNode, can_run_kernel_tests};

/// An address on the node (on `lo`) that pods and the node ping each other with.
const NODE_ADDR: &str = "203.0.113.10";

fn with_prev(conf: &str, result: &serde_json::Value) -> String {
    let mut v: serde_json::Value = serde_json::from_str(conf).unwrap();
    v["prevResult"] = result.clone();
    v.to_string()
}

/// A call carrying the CNI_ARGS kubelet (through containerd) passes for a pod sandbox.
fn k8s_call(
    cmd: &str,
    sandbox: &str,
    pod: &PodNs,
    name: &str,
    uid: &str,
    stdin: String,
) -> CniCall {
    let mut c = CniCall::new(cmd, sandbox, Some(pod.path.clone()), stdin);
    c.args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};\
         K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID={uid}"
    );
    c
}

fn ip_of(result: &serde_json::Value) -> String {
    result["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned()
}

fn pod_ip(pod: &PodNs, args: &[&str]) -> String {
    let out = Command::new("ip")
        .arg("-n")
        .arg(&pod.name)
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn ping_from_pod(pod: &PodNs, dst: &str) -> bool {
    Command::new("ip")
        .args([
            "netns", "exec", &pod.name, "busybox", "ping", "-c", "1", "-W", "2", dst,
        ])
        .output()
        .unwrap()
        .status
        .success()
}

fn ping_from_node(node: &TestNode, dst: &str) -> bool {
    node.command("busybox")
        .args(["ping", "-c", "1", "-W", "2", dst])
        .output()
        .unwrap()
        .status
        .success()
}

/// Asserts that the pod `pod` is fully wired with `addr` through `veth`: `eth0` with the
/// address, the host route through the veth, rule 512 and (when `table` is set) rule 1536.
fn assert_wired(node: &TestNode, pod: &PodNs, addr: &str, veth: &str, table: Option<u32>) {
    let eth0 = pod_ip(pod, &["-4", "addr", "show", "eth0"]);
    assert!(
        eth0.contains(&format!("inet {addr}/32")),
        "pod lost eth0 or its address: {eth0:?}"
    );
    let routes = node.ip_lines(&["-4", "route", "show", "table", "main"]);
    assert!(
        routes
            .iter()
            .any(|l| l.starts_with(&format!("{addr} dev {veth} "))),
        "host route to {addr} via {veth} gone: {routes:?}"
    );
    let rules = node.ip_lines(&["-4", "rule", "show"]);
    assert!(
        rules.contains(&format!("512: from all to {addr} lookup main")),
        "rule 512 for {addr} gone: {rules:?}"
    );
    if let Some(t) = table {
        assert!(
            rules.contains(&format!("1536: from {addr} lookup {t}")),
            "rule 1536 for {addr} gone: {rules:?}"
        );
    }
}

// ------------------------------------------------------------ real ipamd

fn start_ipamd(node: &mut TestNode) -> u32 {
    node.start_ipamd("max_enis=2,ipv4_per_eni=2", &[])
}

/// ipamd's checkpoint: (container id, address) of every assignment.
fn ipamd_assignments(node: &TestNode) -> Vec<(String, String)> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.dir().join("ipam.json")).unwrap()).unwrap();
    let mut out: Vec<(String, String)> = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["containerID"].as_str().unwrap_or_default().to_owned(),
                a["ipv4"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn statefulset_pod_recreated_on_the_same_node_keeps_its_network() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("sts");
    node.ip(&["addr", "add", &format!("{NODE_ADDR}/32"), "dev", "lo"]);
    let pid = start_ipamd(&mut node);
    let conf = node.aws_cni_conf();
    let (c1, c2) = ("sandbox-c1", "sandbox-c2");
    let ns1 = node.add_pod_netns("c1");
    let ns2 = node.add_pod_netns("c2");

    // ADD C1, then (force delete: the pod object is re-created with a new uid before C1 is
    // torn down) ADD C2 for the same pod name.
    let res1 = node
        .cni(&k8s_call("ADD", c1, &ns1, "web-0", "uid-1", conf.clone()))
        .ok()
        .json();
    let x1 = ip_of(&res1);
    let res2 = node
        .cni(&k8s_call("ADD", c2, &ns2, "web-0", "uid-2", conf.clone()))
        .ok()
        .json();
    let x2 = ip_of(&res2);
    assert_ne!(x1, x2);
    let veth = res2["interfaces"][0]["name"].as_str().unwrap().to_owned();
    assert_eq!(
        res1["interfaces"][0]["name"], veth,
        "both sandboxes name the host veth from namespace/name"
    );
    assert_eq!(
        res2["interfaces"][2]["sandbox"], "1",
        "C2 on the secondary ENI"
    );
    assert_wired(&node, &ns2, &x2, &veth, Some(SECONDARY_TABLE));
    assert_eq!(
        ipamd_assignments(&node),
        vec![(c1.to_owned(), x1.clone()), (c2.to_owned(), x2.clone())]
    );

    // DEL C1 as libcni sends it (its cached result as prevResult), then kubelet's retry: libcni
    // dropped the cache after the first success, so the retry carries no prevResult. A third
    // DEL with prevResult again is the shape of a retry after a failed first DEL.
    let dels = [
        with_prev(&conf, &res1),
        conf.clone(),
        with_prev(&conf, &res1),
    ];
    for (n, stdin) in dels.into_iter().enumerate() {
        node.cni(&k8s_call("DEL", c1, &ns1, "web-0", "uid-1", stdin))
            .ok();
        assert_wired(&node, &ns2, &x2, &veth, Some(SECONDARY_TABLE));
        assert!(ping_from_node(&node, &x2), "node -> C2 after DEL #{n}");
        assert!(ping_from_pod(&ns2, NODE_ADDR), "C2 -> node after DEL #{n}");
        assert_eq!(
            ipamd_assignments(&node),
            vec![(c2.to_owned(), x2.clone())],
            "after DEL #{n}: ipamd holds C2's address, C1's is released"
        );
    }
    let rules = node.ip_lines(&["-4", "rule", "show"]);
    assert!(
        !rules
            .iter()
            .any(|l| l.contains(&format!(" {x1} ")) || l.ends_with(&format!(" {x1}"))),
        "C1's rules are gone: {rules:?}"
    );

    // C2's own DEL removes everything.
    node.cni(&k8s_call(
        "DEL",
        c2,
        &ns2,
        "web-0",
        "uid-2",
        with_prev(&conf, &res2),
    ))
    .ok();
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    assert_eq!(ipamd_assignments(&node), Vec::new());
    node.kill(pid);
}

// ------------------------------------------------------------ test-ipamd

/// Sandbox A's first DEL was killed right after ipamd released its address X (nothing torn
/// down); X went to pod B at once; then A's DEL is retried with A's prevResult, with ipamd
/// answering "unknown pod" (`ipamd_up`) or down. B must keep its route and rules.
fn retried_del_scenario(ipamd_up: bool) {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new(if ipamd_up { "del-unk" } else { "del-down" });
    node.attach_vpc();
    let ipamd = node.start_test_ipamd();
    let conf = node.aws_cni_conf();
    let ns_a = node.add_pod_netns("a");
    let ns_b = node.add_pod_netns("b");
    // "secondary" in the pod name: test-ipamd serves the secondary ENI (table 2).
    let res_a = node
        .cni(&k8s_call(
            "ADD",
            "sandbox-a",
            &ns_a,
            "secondary-a",
            "uid-a",
            conf.clone(),
        ))
        .ok()
        .json();
    let x = ip_of(&res_a);

    // DEL #1 of A: ipamd releases X, then the plugin dies before touching the kernel.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ipamd_conn = aws_cni::ipam::Ipamd::connect(&ipamd.socket).await.unwrap();
        let reply = ipamd_conn
            .del(ipamd_proto::rpc::DelNetworkRequest {
                client_version: ipamd_proto::BUILD_VERSION.to_owned(),
                k8s_pod_name: "secondary-a".into(),
                k8s_pod_namespace: "default".into(),
                k8s_pod_infra_container_id: "sandbox-a".into(),
                reason: "PodDeleted".into(),
                container_id: "sandbox-a".into(),
                if_name: "eth0".into(),
                network_name: "aws-cni".into(),
                k8s_pod_uid: "uid-a".into(),
            })
            .await
            .unwrap();
        assert_eq!(reply.ip_allocation_metadata[0].i_pv4_addr, x);
    });
    assert!(ipamd.allocations().is_empty());

    // X goes to pod B, whose ADD takes over the host route and keeps the rules it finds.
    let res_b = node
        .cni(&k8s_call(
            "ADD",
            "sandbox-b",
            &ns_b,
            "secondary-b",
            "uid-b",
            conf.clone(),
        ))
        .ok()
        .json();
    assert_eq!(
        ip_of(&res_b),
        x,
        "test-ipamd hands out the lowest free address"
    );
    let veth_b = res_b["interfaces"][0]["name"].as_str().unwrap().to_owned();
    assert_wired(&node, &ns_b, &x, &veth_b, Some(SECONDARY_TABLE));
    assert!(
        ping_from_pod(&ns_b, VPC_SERVICE_IP),
        "B -> VPC through eth1"
    );

    if !ipamd_up {
        node.kill(ipamd.pid);
    }
    // Kubelet retries A's DEL (libcni still has A's result: the first DEL never returned).
    for _ in 0..2 {
        node.cni(&k8s_call(
            "DEL",
            "sandbox-a",
            &ns_a,
            "secondary-a",
            "uid-a",
            with_prev(&conf, &res_a),
        ))
        .ok();
        assert_wired(&node, &ns_b, &x, &veth_b, Some(SECONDARY_TABLE));
        assert!(
            ping_from_pod(&ns_b, VPC_SERVICE_IP),
            "B -> VPC after A's DEL"
        );
    }
    // A's own wiring is gone: its veth (proven A's: its peer is A's eth0) went.
    let veth_a = res_a["interfaces"][0]["name"].as_str().unwrap();
    assert!(
        !node
            .ip(&["-o", "link", "show"])
            .contains(&format!(" {veth_a}@")),
        "A's host veth removed"
    );
    assert!(!pod_ip(&ns_a, &["-o", "link", "show"]).contains("eth0"));
    if ipamd_up {
        let held: Vec<String> = ipamd
            .allocations()
            .iter()
            .map(|a| a["containerID"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(held, vec!["sandbox-b".to_owned()]);
    }
}

#[test]
fn retried_del_on_unknown_pod_leaves_the_new_owner_of_its_address_alone() {
    retried_del_scenario(true);
}

#[test]
fn retried_del_without_ipamd_leaves_the_new_owner_of_its_address_alone() {
    retried_del_scenario(false);
}

// ------------------------------------------------------------ ADD after an unfinished teardown

#[test]
fn add_removes_a_stale_from_rule_left_by_the_addresses_previous_owner() {
    // An earlier owner of X, wired on another ENI (table 3), left its `from X` rule at 1536
    // (its DEL could not prove X its own, or never ran). Older at the same priority, it would
    // win over the new pod's rule and send the pod's egress out of the wrong ENI.
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("stale-rule");
    node.attach_vpc();
    let _ipamd = node.start_test_ipamd();
    let x = "198.18.1.10";
    node.ip(&[
        "route",
        "add",
        "default",
        "via",
        "198.18.0.1",
        "dev",
        "eth0",
        "table",
        "3",
    ]);
    node.ip(&["rule", "add", "pref", "1536", "from", x, "lookup", "3"]);
    let conf = node.aws_cni_conf();
    let ns = node.add_pod_netns("b");
    let res = node
        .cni(&k8s_call(
            "ADD",
            "sandbox-b",
            &ns,
            "secondary-b",
            "uid-b",
            conf.clone(),
        ))
        .ok()
        .json();
    assert_eq!(ip_of(&res), x);
    let rules: Vec<String> = node
        .ip_lines(&["-4", "rule", "show"])
        .into_iter()
        .filter(|l| l.starts_with("1536:"))
        .collect();
    assert_eq!(
        rules,
        vec![format!("1536: from {x} lookup {SECONDARY_TABLE}")],
        "only the new owner's rule"
    );
    assert!(
        ping_from_pod(&ns, VPC_SERVICE_IP),
        "pod -> VPC through eth1"
    );
    node.cni(&k8s_call(
        "DEL",
        "sandbox-b",
        &ns,
        "secondary-b",
        "uid-b",
        with_prev(&conf, &res),
    ))
    .ok();
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
}

/// Issue 28 finding 5: with `IP_COOLDOWN_PERIOD=0` ipamd may give an address to the next pod
/// the moment DelNetwork released it, while the releasing DEL is still running. Rules are
/// removed by selector, so a DEL that removed its address's rules after the release could
/// remove the next owner's. DEL removes what is provably its own (veth, the addresses routed
/// through it, their rules) before it asks ipamd to release anything: here test-ipamd installs
/// the next owner's `from X lookup 77` inside DelNetwork, and it survives A's DEL, while A's own
/// rules and veth are gone.
#[test]
fn del_removes_its_own_rules_before_the_release_so_the_next_owners_survive() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("del-order");
    node.attach_vpc();
    let ipamd = node.start_test_ipamd_with(&["--next-owner-rule-on-del", "77"]);
    let conf = node.aws_cni_conf();
    let ns_a = node.add_pod_netns("a");
    let res_a = node
        .cni(&k8s_call(
            "ADD",
            "sandbox-a",
            &ns_a,
            "secondary-a",
            "uid-a",
            conf.clone(),
        ))
        .ok()
        .json();
    let x = ip_of(&res_a);
    let veth_a = res_a["interfaces"][0]["name"].as_str().unwrap().to_owned();
    assert_wired(&node, &ns_a, &x, &veth_a, Some(SECONDARY_TABLE));
    node.cni(&k8s_call(
        "DEL",
        "sandbox-a",
        &ns_a,
        "secondary-a",
        "uid-a",
        with_prev(&conf, &res_a),
    ))
    .ok();
    let rules = node.ip_lines(&["-4", "rule", "show"]);
    assert!(
        rules.contains(&format!("1536: from {x} lookup 77")),
        "the next owner's rule was removed by the releasing DEL: {rules:?}"
    );
    assert!(
        !rules.contains(&format!("1536: from {x} lookup {SECONDARY_TABLE}"))
            && !rules.contains(&format!("512: from all to {x} lookup main")),
        "A's own rules are gone: {rules:?}"
    );
    let links = node.ip_lines(&["-o", "link", "show", "type", "veth"]);
    assert!(
        !links.iter().any(|l| l.contains(&veth_a)),
        "A's veth is gone: {links:?}"
    );
    assert!(ipamd.allocations().is_empty());
}
