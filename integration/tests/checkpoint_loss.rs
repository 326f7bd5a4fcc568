//! Issue 15: ipamd losing its checkpoint while pods run must never hand their addresses out
//! again. The real `ipamd` (in-memory ENI provider, TEST/DEMO ONLY) in a throwaway node netns
//! and the real `aws-cni` wiring pods: 10 pods, SIGKILL ipamd, the checkpoint deleted /
//! emptied / truncated / overwritten with garbage, ipamd restarted, 10 more pods. Every case
//! must end with 20 distinct addresses, ipamd holding exactly those 20, and nothing after DEL
//! of all. (Before the fix a *missing* file was trusted as "fresh node" and live pods'
//! addresses went to new pods.)

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use integration::{CniCall, PodNs, TestNode, can_run_kernel_tests};

fn start_ipamd(node: &mut TestNode) -> u32 {
    node.start_ipamd("max_enis=3,ipv4_per_eni=10", &[])
}

fn log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("ipamd.log")).unwrap_or_default()
}

fn conf(node: &TestNode) -> String {
    node.aws_cni_conf()
}

fn call(cmd: &str, i: usize, pod: &PodNs, conf: &str) -> CniCall {
    CniCall::for_pod(cmd, i, pod, conf)
}

/// Addresses the checkpoint holds.
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

/// `AssignedIPs` of `/v1/enis`, from inside the node.
fn assigned_ips(node: &TestNode) -> u64 {
    let out = node
        .command("curl")
        .args(["-sf", "--max-time", "5", "http://127.0.0.1:61679/v1/enis"])
        .output()
        .unwrap();
    assert!(out.status.success(), "curl /v1/enis failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["0"]["AssignedIPs"].as_u64().unwrap()
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    Missing,
    Empty,
    Truncated,
    Garbage,
}

fn damage(path: &Path, how: Damage) {
    match how {
        Damage::Missing => std::fs::remove_file(path).unwrap(),
        Damage::Empty => std::fs::write(path, b"").unwrap(),
        Damage::Truncated => {
            let bytes = std::fs::read(path).unwrap();
            std::fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
        }
        Damage::Garbage => std::fs::write(path, b"\x00garbage{{not json").unwrap(),
    }
}

fn live_pods_keep_their_addresses_when_the_checkpoint_is(how: Damage) {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new(&format!("ckloss-{how:?}").to_lowercase());
    let mut pid = start_ipamd(&mut node);
    let conf = conf(&node);
    let pods: Vec<PodNs> = (0..20)
        .map(|i| node.add_pod_netns(&format!("p{i}")))
        .collect();
    let add = |node: &TestNode, i: usize| -> String {
        let res = node.cni(&call("ADD", i, &pods[i], &conf)).ok().json();
        res["ips"][0]["address"]
            .as_str()
            .unwrap()
            .trim_end_matches("/32")
            .to_owned()
    };
    let mut ips: Vec<String> = (0..10).map(|i| add(&node, i)).collect();

    node.kill(pid);
    damage(&node.dir().join("ipam.json"), how);
    pid = start_ipamd(&mut node);
    ips.extend((10..20).map(|i| add(&node, i)));

    let unique: BTreeSet<&String> = ips.iter().collect();
    assert_eq!(
        unique.len(),
        20,
        "{how:?}: an address went to two live pods: {ips:?}\nlog:\n{}",
        log(node.dir())
    );
    let mut checkpoint = held(node.dir());
    checkpoint.sort();
    let mut want = ips.clone();
    want.sort();
    assert_eq!(
        checkpoint, want,
        "{how:?}: ipamd must hold exactly the live pods"
    );
    assert_eq!(assigned_ips(&node), 20, "{how:?}");

    for (i, pod) in pods.iter().enumerate() {
        node.cni(&call("DEL", i, pod, &conf)).ok();
    }
    // Pods recovered from host state are matched by pod name only: ipamd releases them as soon
    // as their veth and route are gone (it cannot tell which sandbox owns them), within a
    // second or two of the DEL.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !held(node.dir()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{how:?}: still held after DEL of all: {:?}\nlog:\n{}",
            held(node.dir()),
            log(node.dir())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(assigned_ips(&node), 0, "{how:?}");
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    node.kill(pid);
}

#[test]
fn live_pods_keep_their_addresses_when_the_checkpoint_is_missing() {
    live_pods_keep_their_addresses_when_the_checkpoint_is(Damage::Missing);
}

#[test]
fn live_pods_keep_their_addresses_when_the_checkpoint_is_empty() {
    live_pods_keep_their_addresses_when_the_checkpoint_is(Damage::Empty);
}

#[test]
fn live_pods_keep_their_addresses_when_the_checkpoint_is_truncated() {
    live_pods_keep_their_addresses_when_the_checkpoint_is(Damage::Truncated);
}

#[test]
fn live_pods_keep_their_addresses_when_the_checkpoint_is_garbage() {
    live_pods_keep_their_addresses_when_the_checkpoint_is(Damage::Garbage);
}
