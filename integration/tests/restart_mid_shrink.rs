//! Issue 28 finding 1 with the real binaries (root only): a rollout that lowers
//! `WARM_IP_TARGET` restarts ipamd with free addresses above its new target, and EC2 is
//! eventually consistent (vpcsim's `release_lag_ms`: Describe keeps listing a released address
//! for a while; IMDS lags too). The restarted ipamd's first pass releases seven addresses and
//! its first reconcile round comes milliseconds later. Before the fix that round re-added them
//! as free (the reconciler learnt of releases only by comparing with its previous view, none
//! at start), while EC2 handed them to the other node of the subnet: one address in use on two
//! nodes. Two m5.large nodes in one subnet (vpcsim hands out the lowest free address, so the
//! other node's growth takes exactly the released addresses). Node 0 is then killed and
//! started again while EC2 still describes the released addresses on it.
#![allow(clippy::tests_outside_test_module)]

use std::time::{Duration, Instant};

use integration::can_run_kernel_tests;
use integration::sim::{Sim, SimConfig, eventually};

const READY: Duration = Duration::from_secs(60);

/// No node of `running` (those whose ipamd runs) holds in its pool an address EC2 has on
/// another node's ENI (it could hand it to a pod while the other node does too); with both
/// running, every live pod's address is unique, EC2's on its node and listed by its ipamd
/// (`Sim::check_addresses`).
fn check(sim: &Sim, running: &[usize], when: &str) {
    for &i in running {
        let foreign = sim
            .foreign_in_pool(i)
            .unwrap_or_else(|e| panic!("{when}: node {i}: {e}"));
        assert!(
            foreign.is_empty(),
            "{when}: node {i}'s ipamd holds addresses EC2 has on another node (address, node): \
             {foreign:?}\n{}",
            sim.ipamd_log_tail(i, 30)
        );
    }
    if running.len() < sim.nodes.len() {
        return;
    }
    if let Err(e) = sim.check_addresses() {
        panic!(
            "{when}: {e}\n{}\n{}",
            sim.ipamd_log_tail(0, 30),
            sim.ipamd_log_tail(1, 30)
        );
    }
}

fn secondaries(sim: &Sim, i: usize) -> usize {
    sim.ec2_enis(i).values().map(|(_, ips)| ips.len()).sum()
}

#[test]
fn a_restart_mid_shrink_never_puts_an_address_on_two_nodes() {
    if !can_run_kernel_tests() {
        return;
    }
    let t0 = Instant::now();
    let mut sim = Sim::start(&SimConfig::default()).expect("simulated VPC");
    let tick = ("IPAMD_POOL_TICK_SECONDS", "1");
    sim.start_ipamd(0, &[tick, ("WARM_IP_TARGET", "8")], READY)
        .expect("ipamd node 0");
    eventually(Duration::from_secs(20), || {
        let n = secondaries(&sim, 0);
        if n == 8 {
            Ok(())
        } else {
            Err(format!("node 0 has {n} addresses"))
        }
    })
    .expect("node 0's warm pool of 8");
    check(&sim, &[0], "with the large warm pool");

    // EC2 turns eventually consistent: a released address stays in DescribeNetworkInterfaces
    // for 20 s, IMDS shows the node as it was 20 s ago.
    sim.set_knobs(|k| {
        k.release_lag_ms = 20_000;
        k.imds_lag_ms = 20_000;
    });
    // The rollout lowers WARM_IP_TARGET: the new ipamd's first pass releases seven.
    sim.stop_ipamd(0, false);
    sim.start_ipamd(0, &[tick, ("WARM_IP_TARGET", "1")], READY)
        .expect("ipamd node 0 restarted");
    eventually(Duration::from_secs(20), || {
        let n = secondaries(&sim, 0);
        if n == 1 {
            Ok(())
        } else {
            Err(format!("node 0 has {n} addresses"))
        }
    })
    .expect("node 0 released down to its new target");
    eprintln!("[{:?}] node 0 restarted and released seven", t0.elapsed());
    check(&sim, &[0], "after the release");

    // The other node grows and EC2 gives it the lowest free addresses: the released ones.
    sim.start_ipamd(1, &[tick, ("WARM_IP_TARGET", "8")], READY)
        .expect("ipamd node 1");
    eventually(Duration::from_secs(20), || {
        let n = secondaries(&sim, 1);
        if n >= 8 {
            Ok(())
        } else {
            Err(format!("node 1 has {n} addresses"))
        }
    })
    .expect("node 1's warm pool");
    check(&sim, &[0, 1], "after node 1 grew");

    // Pods on both nodes, rounds over the release lag; node 0's ipamd is killed and started
    // again in the middle (its start-up Describe still lists the released addresses on it).
    for round in 0..8 {
        if round == 3 {
            sim.restart_ipamd(0, true, READY)
                .expect("node 0 restarted after SIGKILL");
            check(&sim, &[0, 1], "after node 0's second restart");
            let log = std::fs::read_to_string(sim.nodes[0].ipamd_log()).unwrap_or_default();
            eprintln!(
                "[{:?}] node 0 killed and restarted; withdrawals of released addresses a \
                 lagging Describe listed at start: {}",
                t0.elapsed(),
                log.matches("still described: withdrawn from the pool")
                    .count()
            );
        }
        for node in 0..2 {
            let name = format!("r{round}-n{node}");
            if let Err(e) = sim.add_pod(node, &name) {
                panic!("ADD {name}: {e}\n{}", sim.ipamd_log_tail(node, 30));
            }
        }
        check(&sim, &[0, 1], &format!("round {round}"));
        std::thread::sleep(Duration::from_secs(2));
    }
    let elapsed = t0.elapsed();
    eprintln!("[{elapsed:?}] 16 pods, no address on two nodes");
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "teardown: {errors:?}");
}
