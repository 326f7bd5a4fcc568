//! End to end (root only): `AWS_MANAGE_ENIS_NON_SCHEDULABLE` with the real ipamd on the
//! simulated VPC and the Kubernetes API simulator. Upstream (v1.23.1 `pkg/ipamd/ipamd.go`
//! `isNodeNonSchedulable`, `isENIAttachmentAllowed`, `tryFreeENI`): on a node whose Node carries
//! the taint `node.kubernetes.io/unschedulable:NoSchedule` (a cordoned, draining node) and with
//! the variable false (the default), ipamd attaches no address or ENI and frees no ENI; pods
//! still get addresses from what is attached. Once the taint is gone the pool grows again; with
//! the variable true the taint changes nothing.
#![allow(clippy::tests_outside_test_module)]

use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{KubeOptions, Sim, SimConfig, eventually};
use serde_json::json;

const READY: Duration = Duration::from_secs(60);

/// Sets (`true`) or removes the cordon taint on node `i`'s Node, as the node lifecycle
/// controller does after `kubectl cordon`.
fn cordon(sim: &Sim, i: usize, on: bool) {
    let kube = sim.kube().expect("kube on");
    let mut node = kube
        .api
        .get_object("v1", "Node", None, kube.node_name(i))
        .expect("the Node");
    if let Some(meta) = node["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    node["spec"]["unschedulable"] = json!(on);
    node["spec"]["taints"] = if on {
        json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    kube.api.cluster().apply_object(node).expect("Node updated");
}

/// Node 0's secondary addresses as EC2 has them, over all its ENIs.
fn ec2_addresses(sim: &Sim) -> usize {
    sim.ec2_enis(0).values().map(|(_, ips)| ips.len()).sum()
}

fn settled_at(sim: &Sim, n: usize) -> Result<(), String> {
    eventually(Duration::from_secs(30), || {
        (ec2_addresses(sim) == n)
            .then_some(())
            .ok_or_else(|| format!("{} addresses in EC2, want {n}", ec2_addresses(sim)))
    })
}

#[test]
fn a_cordoned_node_attaches_nothing_until_uncordoned_and_pods_use_what_is_attached() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        kube: Some(KubeOptions::default()),
        ..SimConfig::default()
    })
    .expect("simulated VPC with kube");
    // WARM_IP_TARGET=2: two free addresses on the primary ENI, one ENI.
    sim.start_ipamd(0, &[("WARM_IP_TARGET", "2")], READY)
        .expect("ipamd ready");
    settled_at(&sim, 2).expect("the warm pool");
    cordon(&sim, 0, true);
    eventually(Duration::from_secs(20), || {
        let log = sim.ipamd_log_tail(0, 400);
        log.contains("node is unschedulable")
            .then_some(())
            .ok_or_else(|| "ipamd has not seen the taint yet".to_owned())
    })
    .expect("ipamd follows the Node's taint");
    // Pods still get what is attached; the pool does not refill behind them.
    let a = sim.add_pod(0, "a").expect("a pod on the cordoned node");
    let b = sim
        .add_pod(0, "b")
        .expect("another pod on the cordoned node");
    assert_ne!(a.ip, b.ip);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        ec2_addresses(&sim),
        2,
        "a cordoned node attached addresses: {}",
        sim.ipamd_log_tail(0, 20)
    );
    assert_eq!(sim.ec2_enis(0).len(), 1, "a cordoned node attached an ENI");
    // Nothing left: the next pod is refused with the reason, at once.
    let refused = sim.add_pod(0, "c").expect_err("nothing attached is free");
    assert!(
        refused.output.contains("node.kubernetes.io/unschedulable"),
        "{refused:?}"
    );
    // Uncordoned: the pool refills and pods get addresses again.
    cordon(&sim, 0, false);
    settled_at(&sim, 4).expect("the pool grows once the node is schedulable");
    let c = sim
        .add_pod(0, "c")
        .expect("a pod once the node is schedulable");
    for p in [&a, &b, &c] {
        sim.del_pod(p).unwrap();
    }
}

#[test]
fn with_manage_enis_non_schedulable_a_cordoned_node_keeps_its_pool() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        kube: Some(KubeOptions::default()),
        ..SimConfig::default()
    })
    .expect("simulated VPC with kube");
    // Cordoned before ipamd starts (its first pass already knows: the Node watch is awaited
    // at start), but told to manage ENIs anyway.
    cordon(&sim, 0, true);
    sim.start_ipamd(
        0,
        &[
            ("WARM_IP_TARGET", "2"),
            ("AWS_MANAGE_ENIS_NON_SCHEDULABLE", "true"),
        ],
        READY,
    )
    .expect("ipamd ready");
    settled_at(&sim, 2).expect("ENIs are managed on a cordoned node when asked to");
    let a = sim.add_pod(0, "a").expect("a pod");
    settled_at(&sim, 3).expect("the pool refills behind the pod");
    sim.del_pod(&a).unwrap();
}
