//! End to end (root only): the node's security groups follow onto its secondary ENIs. Upstream
//! (v1.23.1 `nodeInit` → `RefreshSGIDs`, at start and every 30 s with provisioning on, not
//! under custom networking) reads the primary ENI's groups from IMDS and, when they changed,
//! sets them on every ENI it manages. Here the real ipamd on the simulated VPC with the router
//! enforcing every ENI's groups (`Knobs::enforce_eni_security_groups`): an operator replaces
//! node 0's groups with one that lets nothing in; a pod of node 1, allowed before, must lose
//! its way to node 0's pod on a secondary ENI, not only to node 0 itself.
#![allow(clippy::tests_outside_test_module)]

use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{Sim, SimConfig, eventually, ping};
use vpcsim::state::ModifyEni;

const READY: Duration = Duration::from_secs(60);

#[test]
fn a_node_security_group_change_reaches_the_pods_on_its_secondary_enis() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig::default()).expect("simulated VPC");
    let mut knobs = sim.world.knobs();
    knobs.enforce_eni_security_groups = true;
    sim.world.set_knobs(knobs);
    sim.start_ipamd(
        0,
        &[
            ("IPAMD_POOL_TICK_SECONDS", "1"),
            ("IPAMD_SECURITY_GROUP_CHECK_SECONDS", "1"),
        ],
        READY,
    )
    .expect("ipamd ready");

    // more pods than the primary ENI has addresses (9): one lands on a secondary ENI
    let mut pods = Vec::new();
    for k in 0..11 {
        let name = format!("sg-{k}");
        pods.push(
            sim.add_pod(0, &name)
                .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", sim.ipamd_log_tail(0, 40))),
        );
    }
    let enis = sim.ec2_enis(0);
    let on_secondary = pods
        .iter()
        .find(|p| {
            sim.eni_of(0, p.ip)
                .and_then(|e| enis.get(&e).map(|(dev, _)| *dev != 0))
                .unwrap_or(false)
        })
        .expect("a pod on a secondary ENI")
        .clone();
    let on_primary = pods
        .iter()
        .find(|p| {
            sim.eni_of(0, p.ip)
                .and_then(|e| enis.get(&e).map(|(dev, _)| *dev == 0))
                .unwrap_or(false)
        })
        .expect("a pod on the primary ENI")
        .clone();
    let secondary = sim.eni_of(0, on_secondary.ip).expect("its eni");
    let node0 = sim.nodes[0].instance_id.clone();
    let (primary, before, closed) = sim.world.read(|s| {
        let primary = s
            .enis_of(&node0)
            .into_iter()
            .find(|e| e.attachment.as_ref().is_some_and(|a| a.device_index == 0))
            .expect("primary eni")
            .clone();
        let closed = s
            .security_groups
            .values()
            .find(|g| g.name == "pods")
            .expect("the world's `pods` group (no ingress rule)")
            .id
            .clone();
        (primary.id.clone(), primary.groups.clone(), closed)
    });
    let groups_of = |sim: &Sim, eni: &str| {
        sim.world
            .read(|s| s.enis.get(eni).map(|e| e.groups.clone()))
    };
    assert_eq!(
        groups_of(&sim, &secondary),
        Some(before.clone()),
        "a new ENI gets the node's groups"
    );

    // a pod on node 1; both nodes in the default group (its members may reach each other)
    sim.start_ipamd(1, &[("IPAMD_POOL_TICK_SECONDS", "1")], READY)
        .expect("ipamd node 1");
    let peer = sim
        .add_pod(1, "peer")
        .unwrap_or_else(|e| panic!("ADD peer: {e}\n{}", sim.ipamd_log_tail(1, 40)))
        .netns;
    eventually(Duration::from_secs(10), || ping(&peer, on_primary.ip)).expect(
        "node 1's pod -> node 0's pod on the primary ENI while both are in the default group",
    );
    eventually(Duration::from_secs(10), || ping(&peer, on_secondary.ip))
        .expect("node 1's pod -> node 0's pod on a secondary ENI");

    // the operator tightens node 0: its primary ENI now lets nothing in
    sim.world
        .mutate(|s, _| {
            s.modify_eni(
                &primary,
                ModifyEni {
                    groups: Some(vec![closed.clone()]),
                    ..ModifyEni::default()
                },
            )
        })
        .expect("groups changed");
    // the fabric enforces the change on the primary ENI at once
    eventually(Duration::from_secs(10), || {
        match ping(&peer, on_primary.ip) {
            Ok(()) => Err("node 0's primary ENI still reachable".to_owned()),
            Err(_) => Ok(()),
        }
    })
    .expect("the router applies node 0's new groups");
    // ipamd follows them onto the secondary ENI: the pod is closed as well
    eventually(Duration::from_secs(20), || {
        let now = groups_of(&sim, &secondary);
        (now == Some(vec![closed.clone()]))
            .then_some(())
            .ok_or_else(|| format!("{secondary}: {now:?}\n{}", sim.ipamd_log_tail(0, 20)))
    })
    .expect("ipamd sets the node's groups on its secondary ENI");
    eventually(Duration::from_secs(10), || {
        match ping(&peer, on_secondary.ip) {
            Ok(()) => Err("the pod on the secondary ENI is still reachable".to_owned()),
            Err(_) => Ok(()),
        }
    })
    .expect("the pod is closed like its node");
    // every ENI of the node carries the primary's groups, also one whose creation read the old
    // groups and that IMDS listed only after the check that applied the change: the next check
    // sets them (CI once saw such an ENI keep the old groups for good)
    eventually(Duration::from_secs(10), || {
        let stale: Vec<String> = sim
            .ec2_enis(0)
            .into_keys()
            .filter(|eni| groups_of(&sim, eni) != Some(vec![closed.clone()]))
            .collect();
        stale
            .is_empty()
            .then_some(())
            .ok_or_else(|| format!("old groups on {stale:?}\n{}", sim.ipamd_log_tail(0, 20)))
    })
    .expect("every ENI of node 0 carries its groups");
    eventually(Duration::from_secs(5), || {
        sim.ipamd_log_tail(0, 300)
            .contains(&format!("Found primary SG {closed}, added to ipamd cache"))
            .then_some(())
            .ok_or_else(|| sim.ipamd_log_tail(0, 20))
    })
    .expect("the change is logged as upstream logs it");
}
