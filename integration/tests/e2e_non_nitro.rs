//! `ENABLE_PREFIX_DELEGATION=true` on an instance type without prefix delegation (a Xen
//! `m4.large`; EC2, here the simulated VPC, refuses /28 prefixes on it), with the real ipamd and
//! the real `aws-cni` (root only; issue 39). Upstream v1.23.1 `isConfigValid`: in IPv4 it warns
//! "Prefix delegation is not supported on non-nitro instance … hence falling back to default
//! (secondary IP) mode" and serves secondary IPs; in IPv6 mode (which needs prefixes) it
//! refuses to start. Before issue 39 ours asked EC2 for /28s on every pass, EC2 refused, and no
//! pod ever got an address.
#![allow(clippy::tests_outside_test_module)]

use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{Sim, SimConfig, SimError};

const READY: Duration = Duration::from_secs(60);

#[test]
fn prefix_delegation_on_a_non_nitro_type_falls_back_to_secondary_ips() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        instance_type: "m4.large".into(),
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    sim.start_ipamd(
        0,
        &[
            ("ENABLE_PREFIX_DELEGATION", "true"),
            ("WARM_PREFIX_TARGET", "1"),
            ("IPAMD_POOL_TICK_SECONDS", "1"),
        ],
        READY,
    )
    .expect("ipamd");
    let mut pods = Vec::new();
    for i in 0..3 {
        let pod = sim
            .add_pod(0, &format!("pd-{i}"))
            .unwrap_or_else(|f| panic!("ADD pd-{i}: {f:?}\n{}", sim.ipamd_log_tail(0, 40)));
        pods.push(pod);
    }
    // Secondary /32s, no prefix: every pod's address is one of its ENI's secondary IPs in EC2,
    // and no ENI of the node has a /28.
    let enis = sim.ec2_enis(0);
    for p in &pods {
        assert!(
            enis.values().any(|(_, ips)| ips.contains(&p.ip)),
            "{} is no secondary IP of the node: {enis:?}",
            p.ip
        );
    }
    let prefixes = sim.world.read(|s| {
        s.enis_of(&sim.nodes[0].instance_id)
            .iter()
            .map(|e| e.ipv4_prefixes.len())
            .sum::<usize>()
    });
    assert_eq!(prefixes, 0, "no /28 asked of EC2 on a non-Nitro type");
    let log = std::fs::read_to_string(sim.nodes[0].ipamd_log()).unwrap_or_default();
    assert!(
        log.contains("Prefix delegation is not supported on non-nitro instance m4.large"),
        "the fallback is logged: {}",
        sim.ipamd_log_tail(0, 30)
    );
    let enis_view = sim.introspect(0, "/v1/enis").expect("/v1/enis");
    assert!(
        !enis_view.to_string().contains("\"IsPrefix\":true"),
        "the datastore holds no prefix: {enis_view}"
    );
    for p in &pods {
        sim.del_pod(p).expect("DEL");
    }
    sim.shutdown();
}

#[test]
fn ipv6_mode_on_a_non_nitro_type_refuses_to_start() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        instance_type: "m4.large".into(),
        ipv6: true,
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    let r = sim.start_ipamd(
        0,
        &[
            ("ENABLE_IPv4", "false"),
            ("ENABLE_IPv6", "true"),
            ("ENABLE_PREFIX_DELEGATION", "true"),
            ("WARM_PREFIX_TARGET", "1"),
        ],
        READY,
    );
    match r {
        Err(SimError::IpamdNotReady { why, log, .. }) => {
            assert!(why.contains("exited"), "{why}\n{log}");
            assert!(
                log.contains("IPv6 is only supported in Prefix delegation Mode"),
                "{log}"
            );
        }
        other => panic!("ipamd must refuse IPv6 on m4.large: {other:?}"),
    }
    sim.shutdown();
}
