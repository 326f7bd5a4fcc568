//! End to end under EC2 faults (root only): 2 m5.large nodes running `ipamd` on the simulated
//! VPC; with throttling (tiny token buckets), added latency, a delay before attached ENIs
//! appear and IMDS lagging EC2 by more than the reconcile interval, pods keep being created and
//! deleted (ADDs retried like kubelet does), ipamd is crashed and restarted while IMDS is stale,
//! and through all of it no pod loses its address: every live pod's address stays assigned in
//! EC2, in ipamd's `/v1/enis`, unique, and reachable.
#![allow(clippy::tests_outside_test_module)]

use std::time::{Duration, Instant};

use integration::can_run_kernel_tests;
use integration::sim::{Pod, Sim, SimConfig, ping};

const READY: Duration = Duration::from_secs(90);

/// ADD with retries, as kubelet retries a failed sandbox; returns the pod and the failures.
fn add_retrying(sim: &mut Sim, node: usize, name: &str, failures: &mut Vec<String>) -> Pod {
    for _ in 0..6 {
        match sim.add_pod(node, name) {
            Ok(p) => return p,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                std::thread::sleep(Duration::from_secs(2));
            }
        }
    }
    panic!(
        "ADD {name} kept failing: {failures:#?}\n{}",
        sim.ipamd_log_tail(node, 40)
    );
}

fn assert_consistent(sim: &Sim, when: &str) {
    if let Err(e) = sim.check_addresses() {
        panic!(
            "{when}: {e}\n{}\n{}",
            sim.ipamd_log_tail(0, 40),
            sim.ipamd_log_tail(1, 40)
        );
    }
}

fn assert_reachable(sim: &Sim, when: &str) {
    let pods = sim.pods().to_vec();
    for p in &pods {
        let peer = pods
            .iter()
            .find(|q| q.node != p.node)
            .expect("a pod on the other node");
        ping(&p.netns, peer.ip)
            .unwrap_or_else(|e| panic!("{when}: {} -> {}: {e}", p.name, peer.name));
    }
}

#[test]
fn e2e_faults_no_pod_loses_its_address() {
    if !can_run_kernel_tests() {
        return;
    }
    let t0 = Instant::now();
    let mut sim = Sim::start(&SimConfig::default()).expect("simulated VPC");
    let env0 = [("IPAMD_POOL_TICK_SECONDS", "1")];
    let env1 = [
        ("IPAMD_POOL_TICK_SECONDS", "1"),
        ("WARM_IP_TARGET", "2"),
        ("IP_COOLDOWN_PERIOD", "1"),
    ];
    sim.start_ipamd(0, &env0, READY).expect("ipamd node 0");
    sim.start_ipamd(1, &env1, READY).expect("ipamd node 1");
    let mut failures = Vec::new();
    for node in 0..2 {
        for k in 0..8 {
            add_retrying(&mut sim, node, &format!("calm-{node}-{k}"), &mut failures);
        }
    }
    assert!(
        failures.is_empty(),
        "ADD failed without faults: {failures:?}"
    );
    assert_consistent(&sim, "before faults");
    eprintln!("[{:?}] 16 pods up; switching faults on", t0.elapsed());

    sim.set_knobs(|k| {
        k.throttle.enabled = true;
        k.throttle.describe.capacity = 5;
        k.throttle.describe.refill_per_sec = 1.0;
        k.throttle.mutate.capacity = 5;
        k.throttle.mutate.refill_per_sec = 1.0;
        k.latency_ms = 150;
        k.attach_delay_ms = 3000;
        // longer than the reconcile interval (60 s): every reconcile sees a stale IMDS
        k.imds_lag_ms = 75_000;
    });

    // growth past the first ENI on both nodes (new ENIs appear only after the attach delay)
    for node in 0..2 {
        for k in 0..8 {
            add_retrying(&mut sim, node, &format!("storm-{node}-{k}"), &mut failures);
        }
    }
    assert_consistent(&sim, "after growth under faults");
    // churn
    let victims: Vec<Pod> = sim
        .pods()
        .iter()
        .filter(|p| p.name.ends_with("-1") || p.name.ends_with("-5"))
        .cloned()
        .collect();
    for p in &victims {
        sim.del_pod(p).expect("DEL under faults");
    }
    for node in 0..2 {
        for k in 0..3 {
            add_retrying(&mut sim, node, &format!("churn-{node}-{k}"), &mut failures);
        }
    }
    assert_consistent(&sim, "after churn under faults");
    eprintln!(
        "[{:?}] {} pods under faults ({} ADD attempts failed and were retried)",
        t0.elapsed(),
        sim.pods().len(),
        failures.len()
    );

    // a crash while IMDS is stale: node init must trust EC2 for every pod's address
    sim.restart_ipamd(0, true, READY)
        .expect("restart ipamd 0 under faults");
    assert_consistent(&sim, "after crash-restart with stale IMDS");

    // stay under faults past the reconcile interval; check every 10 s
    let until = Instant::now() + Duration::from_secs(80);
    while Instant::now() < until {
        std::thread::sleep(Duration::from_secs(10));
        assert_consistent(&sim, "during stale-IMDS reconciles");
    }
    assert_reachable(&sim, "after stale-IMDS reconciles");
    eprintln!(
        "[{:?}] addresses kept through reconciles; faults off",
        t0.elapsed()
    );

    sim.set_knobs(|k| *k = vpcsim::Knobs::default());
    for p in sim.pods().to_vec() {
        sim.del_pod(&p).expect("DEL");
    }
    for i in 0..2 {
        assert!(
            sim.assigned(i).expect("/v1/enis").is_empty(),
            "node {i} still assigns"
        );
        let left = sim.pod_leftovers(i);
        assert!(left.is_empty(), "node {i} leftovers: {left:?}");
    }
    eprintln!("[{:?}] EC2 calls: {:?}", t0.elapsed(), sim.calls.snapshot());
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "teardown: {errors:?}");
}
