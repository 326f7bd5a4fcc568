//! Issue 18 item 5: per-pod rules (512 `to <ip>`, 1536 `from <ip>`) that no pod holds any more
//! (a DEL whose teardown failed, a pod gone while ipamd was away) must be removed by ipamd: at
//! the same priority a stale 1536 rule shadows the next pod given that address. The real
//! `ipamd` (in-memory ENI provider, TEST/DEMO ONLY) and `aws-cni` in a throwaway node netns.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::time::{Duration, Instant};

use integration::{CniCall, PodNs, TestNode, can_run_kernel_tests};

fn start_ipamd(node: &mut TestNode) -> u32 {
    node.start_ipamd(
        "max_enis=2,ipv4_per_eni=6",
        &[("IPAMD_RECLAIM_UNWIRED_SECONDS", "1")],
    )
}

fn conf(node: &TestNode) -> String {
    node.aws_cni_conf()
}

fn call(cmd: &str, i: usize, pod: &PodNs, conf: &str) -> CniCall {
    CniCall::for_pod(cmd, i, pod, conf)
}

fn add(node: &TestNode, i: usize, pod: &PodNs, conf: &str) -> String {
    let res = node.cni(&call("ADD", i, pod, conf)).ok().json();
    res["ips"][0]["address"]
        .as_str()
        .unwrap()
        .trim_end_matches("/32")
        .to_owned()
}

fn pod_rules(node: &TestNode, ip: &str) -> Vec<String> {
    node.ip_lines(&["-4", "rule", "show"])
        .into_iter()
        .filter(|l| {
            (l.starts_with("512:") || l.starts_with("1536:")) && l.contains(&format!(" {ip} "))
        })
        .collect()
}

fn held(dir: &Path) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("ipam.json")).unwrap()).unwrap();
    v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["ipv4"].as_str().unwrap().to_owned())
        .collect()
}

/// What a DEL whose netlink teardown failed leaves behind: the pod's rules, with the table of
/// another ENI (the address moves when it is handed out again). Both adds must succeed; a
/// running ipamd may prune them at any instant after, so only the caller with ipamd stopped
/// can count them.
fn leave_stale_rules(node: &TestNode, ip: &str) {
    node.ip(&[
        "rule",
        "add",
        "to",
        &format!("{ip}/32"),
        "lookup",
        "main",
        "pref",
        "512",
    ]);
    node.ip(&[
        "rule",
        "add",
        "from",
        &format!("{ip}/32"),
        "lookup",
        "3",
        "pref",
        "1536",
    ]);
}

fn wait_until(what: &str, node: &TestNode, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}; ipamd log:\n{}",
            std::fs::read_to_string(node.dir().join("ipamd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn stale_pod_rules_of_a_released_address_are_removed_and_live_pods_keep_theirs() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("stale-rules");
    let pid = start_ipamd(&mut node);
    let conf = conf(&node);
    let pods: Vec<PodNs> = (0..2)
        .map(|i| node.add_pod_netns(&format!("s{i}")))
        .collect();
    let gone = add(&node, 0, &pods[0], &conf);
    let live = add(&node, 1, &pods[1], &conf);
    let live_rules = pod_rules(&node, &live);
    node.cni(&call("DEL", 0, &pods[0], &conf)).ok();
    leave_stale_rules(&node, &gone);
    wait_until(
        "stale rules of a released address were never removed",
        &node,
        || pod_rules(&node, &gone).is_empty(),
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        pod_rules(&node, &live),
        live_rules,
        "a live pod's rules are untouched"
    );
    assert_eq!(held(node.dir()), vec![live.clone()]);
    node.cni(&call("DEL", 1, &pods[1], &conf)).ok();
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    node.kill(pid);
}

#[test]
fn a_rule_only_address_at_restart_is_held_then_released_with_its_rules() {
    // ipamd restarts and finds rules for an address of its pool that no pod route or veth
    // backs: held at once (it could be a pod ipamd forgot), then released with its rules
    // once the reclaim grace shows no pod.
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("rule-only");
    let mut pid = start_ipamd(&mut node);
    let conf = conf(&node);
    let pod = node.add_pod_netns("r0");
    let ip = add(&node, 0, &pod, &conf);
    node.cni(&call("DEL", 0, &pod, &conf)).ok();
    node.kill(pid);
    leave_stale_rules(&node, &ip);
    assert_eq!(pod_rules(&node, &ip).len(), 2, "the rules wait for ipamd");
    pid = start_ipamd(&mut node);
    wait_until(
        "the rule-only address was never released with its rules",
        &node,
        || pod_rules(&node, &ip).is_empty() && !held(node.dir()).contains(&ip),
    );
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    node.kill(pid);
}
