//! End to end (root only): `REMOVE_STARTUP_TAINT` (chart `startupTaint`, ours) with the real
//! ipamd on the simulated VPC and the Kubernetes API simulator, through the chart's RBAC. The
//! node registers with a start-up taint (as Karpenter's `startupTaints` or a bootstrap flag
//! puts it); ipamd removes it only once it can hand out an address, keeps every other taint,
//! and records the start-up phases. Without the chart's `patch` on nodes the taint stays and
//! ipamd says why.
#![allow(clippy::tests_outside_test_module)]

use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{KubeOptions, METRICS, Sim, SimConfig, eventually};
use serde_json::{Value, json};
use vpcsim::knobs::Bucket;

const READY: Duration = Duration::from_secs(60);
const KEY: &str = "aws-vpc-cni.networking/agent-not-ready";

/// Node `i`'s taints as the API server has them.
fn taints(sim: &Sim, i: usize) -> Vec<String> {
    let kube = sim.kube().expect("kube on");
    let node = kube
        .api
        .get_object("v1", "Node", None, kube.node_name(i))
        .expect("the Node");
    node["spec"]["taints"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["key"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Registers node `i` with the start-up taint and another one ipamd must keep.
fn taint(sim: &Sim, i: usize) {
    let kube = sim.kube().expect("kube on");
    let mut node = kube
        .api
        .get_object("v1", "Node", None, kube.node_name(i))
        .expect("the Node");
    if let Some(meta) = node["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
    }
    node["spec"]["taints"] = json!([
        {"key": KEY, "effect": "NoSchedule"},
        {"key": "example.com/keep", "value": "yes", "effect": "NoSchedule"},
    ]);
    kube.api.cluster().apply_object(node).expect("Node updated");
}

/// `awscni_startup_phase_seconds{phase}` from node `i`'s ipamd.
fn phase(sim: &Sim, i: usize, phase: &str) -> Option<f64> {
    let text = sim.http_get(i, METRICS, "/metrics").ok()?;
    let prefix = format!("awscni_startup_phase_seconds{{phase=\"{phase}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

fn with_chart(values: Value) -> SimConfig {
    SimConfig {
        nodes: 1,
        kube: Some(KubeOptions {
            chart_values: values,
            ..KubeOptions::default()
        }),
        ..SimConfig::default()
    }
}

#[test]
fn the_startup_taint_goes_once_ipamd_can_hand_out_an_address_and_no_earlier() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&with_chart(json!({"startupTaint": {"enabled": true}})))
        .expect("simulated VPC with kube");
    taint(&sim, 0);
    // EC2 refuses every address assignment: the primary ENI has no secondary address, so
    // ipamd serves its socket but could answer no ADD.
    sim.set_knobs(|k| {
        k.throttle.enabled = true;
        k.throttle.mutate = Bucket {
            capacity: 0,
            refill_per_sec: 0.0,
        };
    });
    sim.start_ipamd(0, &[("REMOVE_STARTUP_TAINT", KEY)], READY)
        .expect("ipamd serves");
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        taints(&sim, 0).contains(&KEY.to_owned()),
        "removed while no address could be handed out: {}",
        sim.ipamd_log_tail(0, 30)
    );
    assert_eq!(phase(&sim, 0, "first_address"), None);
    assert!(phase(&sim, 0, "imds").is_some() && phase(&sim, 0, "ec2_describe").is_some());
    // EC2 answers again: the pool fills, the taint goes, the other one stays.
    sim.set_knobs(|k| k.throttle.enabled = false);
    eventually(Duration::from_secs(60), || {
        let t = taints(&sim, 0);
        (!t.contains(&KEY.to_owned()))
            .then_some(())
            .ok_or_else(|| format!("taints {t:?}"))
    })
    .expect("the start-up taint is removed");
    assert_eq!(taints(&sim, 0), ["example.com/keep"]);
    // A pod scheduled now gets an address at once.
    let pod = sim
        .add_pod(0, "first")
        .expect("a pod right after the taint went");
    let first = phase(&sim, 0, "first_address").expect("first_address recorded");
    let removed = phase(&sim, 0, "startup_taint_removed").expect("removal recorded");
    assert!(
        first <= removed,
        "first address {first} s, removed {removed} s"
    );
    assert!(phase(&sim, 0, "imds").unwrap() <= phase(&sim, 0, "ec2_describe").unwrap());
    sim.del_pod(&pod).unwrap();
    // The taint added again (a bootstrap re-registering the node): removed again.
    taint(&sim, 0);
    eventually(Duration::from_secs(20), || {
        let t = taints(&sim, 0);
        (t == ["example.com/keep"])
            .then_some(())
            .ok_or_else(|| format!("taints {t:?}"))
    })
    .expect("removed again");
}

#[test]
fn without_the_charts_patch_on_nodes_the_taint_stays_and_ipamd_says_why() {
    if !can_run_kernel_tests() {
        return;
    }
    // startupTaint.enabled=false: the ClusterRole has no patch on nodes; the variable is set
    // by hand anyway.
    let mut sim = Sim::start(&with_chart(json!({}))).expect("simulated VPC with kube");
    taint(&sim, 0);
    sim.start_ipamd(0, &[("REMOVE_STARTUP_TAINT", KEY)], READY)
        .expect("ipamd serves");
    eventually(Duration::from_secs(30), || {
        let log = sim.ipamd_log_tail(0, 200);
        log.contains("cannot remove the start-up taint")
            .then_some(())
            .ok_or_else(|| "no error logged yet".to_owned())
    })
    .expect("the refusal is logged");
    assert!(taints(&sim, 0).contains(&KEY.to_owned()));
    // pods are still served (the taint only keeps the scheduler away)
    let pod = sim.add_pod(0, "a").expect("ADD works");
    sim.del_pod(&pod).unwrap();
}
