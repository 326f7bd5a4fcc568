//! A two-card node keeps card 0's guarantees on every card (issue 38, H2 and the kill storm):
//! the real `ipamd` (`ENABLE_MULTI_NIC=true`) and the real `aws-cni` on the simulated VPC
//! (`c6in.32xlarge`, two network cards), multi-NIC pods (`k8s.amazonaws.com/nicConfig:
//! multi-nic-attachment`) with one address per card. When card 1's checkpoint
//! (`ipam-nic-1.json`) is lost or corrupt while ipamd is down, ipamd starts (a corrupt file is
//! set aside, not a crash loop) and recovers the live pods' card-1 addresses from the host's
//! routes and rules, so new pods never get them; SIGKILLs at any instant of ADDs and DELs leave
//! every live pod's two addresses held once, in the right card's checkpoint. Root only.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{PluginTarget, Sandbox, Sim, SimConfig, eventually, run_plugin};

const READY: Duration = Duration::from_secs(60);

/// A multi-NIC pod: its namespace, sandbox id, ADD result and its two addresses.
#[derive(Debug, Clone)]
struct MultiPod {
    name: String,
    netns: String,
    container_id: String,
    result: serde_json::Value,
    card0: Ipv4Addr,
    card1: Ipv4Addr,
}

impl MultiPod {
    fn sandbox(&self) -> Sandbox<'_> {
        Sandbox {
            pod_name: &self.name,
            container_id: &self.container_id,
            netns: &self.netns,
        }
    }
}

fn aws_cni() -> PathBuf {
    integration::sim::Bins::beside_current_exe()
        .expect("binaries built")
        .aws_cni
}

fn two_card_node() -> Sim {
    two_card_node_with(&[])
}

/// A one-node simulated VPC of `c6in.32xlarge` (two network cards) whose ipamd serves both
/// (`ENABLE_MULTI_NIC`, a pool pass every second), with `extra` env.
fn two_card_node_with(extra: &[(&str, &str)]) -> Sim {
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        instance_type: "c6in.32xlarge".into(),
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    let mut env = vec![
        ("ENABLE_MULTI_NIC", "true"),
        ("IPAMD_POOL_TICK_SECONDS", "1"),
    ];
    env.extend_from_slice(extra);
    sim.start_ipamd(0, &env, READY).expect("ipamd");
    sim
}

/// The addresses of an ADD result, by interface order: card 0's, then card 1's.
fn addresses(result: &serde_json::Value) -> Vec<Ipv4Addr> {
    result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["address"].as_str()?.split('/').next()?.parse().ok())
        .collect()
}

/// ADD of the multi-NIC pod `n` in a namespace made beforehand; kubelet's retries while ipamd
/// restarts or the card's pool grows.
fn add(bin: &Path, target: &PluginTarget, netns: String, n: usize) -> Result<MultiPod, String> {
    let name = format!("multi-{n}");
    let container_id = format!(
        "{:016x}{:08x}",
        0x4d4e_4943_0000_u64 + n as u64,
        std::process::id()
    );
    let sandbox = Sandbox {
        pod_name: &name,
        container_id: &container_id,
        netns: &netns,
    };
    let result = eventually(Duration::from_secs(90), || {
        run_plugin(bin, target, "ADD", sandbox, None).map_err(|(c, o)| format!("{c}: {o}"))
    })?;
    let ips = addresses(&result);
    if ips.len() != 2 {
        return Err(format!("{name}: not one address per card: {result}"));
    }
    Ok(MultiPod {
        name,
        netns,
        container_id,
        result,
        card0: ips[0],
        card1: ips[1],
    })
}

/// DEL of every pod (with its ADD result), its namespace gone; nothing of them left on the node.
fn del_all(sim: &Sim, bin: &Path, target: &PluginTarget, pods: &[MultiPod]) {
    for p in pods {
        run_plugin(bin, target, "DEL", p.sandbox(), Some(&p.result))
            .unwrap_or_else(|e| panic!("DEL: {e:?}"));
        integration::supervisor::delete_netns(&p.netns);
    }
    let left = sim.pod_leftovers(0);
    assert!(left.is_empty(), "left on the node: {left:?}");
}

/// The addresses a checkpoint holds, with their container ids.
fn held(path: &Path) -> Vec<(String, Ipv4Addr)> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap_or_default()).unwrap_or_default();
    v["allocations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["containerID"].as_str()?.to_owned(),
                e["ipv4"].as_str()?.parse().ok()?,
            ))
        })
        .collect()
}

/// Every live pod's two addresses are distinct from every other pod's, and each is held,
/// exactly once, in its own card's checkpoint (by the pod, or by an entry recovered from the
/// host for it).
fn check(sim: &Sim, pods: &[MultiPod]) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    for p in pods {
        for ip in [p.card0, p.card1] {
            if !seen.insert(ip) {
                return Err(format!("{ip} given to two live pods ({})", p.name));
            }
        }
    }
    for (card, pick) in [(0, 0), (1, 1)] {
        let path = sim.nodes[0].card_checkpoint(card);
        let h = held(&path);
        for p in pods {
            let ip = if pick == 0 { p.card0 } else { p.card1 };
            let n = h.iter().filter(|(_, a)| *a == ip).count();
            if n != 1 {
                return Err(format!(
                    "{} ({ip}) held {n} times in {}: {h:?}",
                    p.name,
                    path.display()
                ));
            }
        }
    }
    Ok(())
}

fn multi_nic_pods_keep_their_card_addresses_when_the_card_checkpoint_is(corrupt: bool) {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = two_card_node();
    let bin = aws_cni();
    let target = PluginTarget::multi_nic(&sim, 0);
    let mut pods = Vec::new();
    for n in 0..3 {
        let netns = sim.new_pod_netns().unwrap();
        let p = add(&bin, &target, netns, n)
            .unwrap_or_else(|e| panic!("ADD: {e}\n{}", sim.ipamd_log_tail(0, 40)));
        pods.push(p);
    }
    check(&sim, &pods).unwrap();
    // ipamd dies; card 1's file is lost or damaged while it is down
    sim.stop_ipamd(0, true);
    let path = sim.nodes[0].card_checkpoint(1);
    if corrupt {
        std::fs::write(&path, b"\x00garbage{{not json").unwrap();
    } else {
        std::fs::remove_file(&path).unwrap();
    }
    sim.restart_ipamd_process(0, READY).unwrap_or_else(|e| {
        panic!(
            "ipamd did not start again with card 1's checkpoint {}: {e}\n{}",
            if corrupt { "corrupt" } else { "missing" },
            sim.ipamd_log_tail(0, 40)
        )
    });
    if corrupt {
        let mut aside = path.as_os_str().to_owned();
        aside.push(".corrupt");
        assert!(
            Path::new(&aside).exists(),
            "the corrupt card file is set aside for humans"
        );
    }
    // the live pods' card-1 addresses are held again (recovered from the host's routes and
    // rules), and new pods get others
    for n in 3..7 {
        let netns = sim.new_pod_netns().unwrap();
        let p = add(&bin, &target, netns, n)
            .unwrap_or_else(|e| panic!("ADD: {e}\n{}", sim.ipamd_log_tail(0, 40)));
        pods.push(p);
    }
    check(&sim, &pods).unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    del_all(&sim, &bin, &target, &pods);
}

#[test]
fn multi_nic_pods_keep_their_card_addresses_when_the_card_checkpoint_is_missing() {
    multi_nic_pods_keep_their_card_addresses_when_the_card_checkpoint_is(false);
}

#[test]
fn multi_nic_pods_keep_their_card_addresses_when_the_card_checkpoint_is_corrupt() {
    multi_nic_pods_keep_their_card_addresses_when_the_card_checkpoint_is(true);
}

/// SIGKILL at several instants of a multi-NIC ADD and of a DEL (0 ms to 800 ms in): after
/// every restart, kubelet's retries end with every live pod holding its two addresses once,
/// in its card's checkpoint, none given twice.
#[test]
fn a_two_card_node_keeps_every_address_once_through_a_kill_storm() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = two_card_node();
    let bin = aws_cni();
    let target = PluginTarget::multi_nic(&sim, 0);
    let mut pods: Vec<MultiPod> = Vec::new();
    for (round, delay_ms) in [0_u64, 30, 80, 150, 300, 800].into_iter().enumerate() {
        let netns = sim.new_pod_netns().unwrap();
        // a DEL of the oldest pod runs at the same time in every other round
        let leaving = (round % 2 == 1 && !pods.is_empty()).then(|| pods.remove(0));
        let (added, deleted) = std::thread::scope(|s| {
            let adding = s.spawn(|| add(&bin, &target, netns, round));
            let deleting = leaving.as_ref().map(|p| {
                s.spawn(|| {
                    eventually(Duration::from_secs(90), || {
                        run_plugin(&bin, &target, "DEL", p.sandbox(), Some(&p.result))
                            .map_err(|(c, o)| format!("{c}: {o}"))
                    })
                })
            });
            std::thread::sleep(Duration::from_millis(delay_ms));
            sim.stop_ipamd(0, true);
            sim.restart_ipamd_process(0, READY)
                .unwrap_or_else(|e| panic!("restart: {e}\n{}", sim.ipamd_log_tail(0, 40)));
            (
                adding.join().expect("ADD thread"),
                deleting.map(|d| d.join().expect("DEL thread")),
            )
        });
        let p = added.unwrap_or_else(|e| panic!("ADD {round}: {e}\n{}", sim.ipamd_log_tail(0, 40)));
        pods.push(p);
        if let Some(d) = deleted {
            d.unwrap_or_else(|e| panic!("DEL: {e}"));
        }
        if let Some(p) = leaving {
            integration::supervisor::delete_netns(&p.netns);
        }
        check(&sim, &pods)
            .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", sim.ipamd_log_tail(0, 40)));
    }
    del_all(&sim, &bin, &target, &pods);
}

/// The secondary addresses EC2 has on node 0's card-1 ENI now (the state, not a Describe).
fn card1_secondaries(sim: &Sim) -> usize {
    let inst = sim.nodes[0].instance_id.clone();
    sim.world.read(|s| {
        s.enis_of(&inst)
            .into_iter()
            .filter(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.network_card_index == 1)
            })
            .map(|e| e.private_ips.len().saturating_sub(1))
            .sum()
    })
}

/// H3: card 1's pool releases addresses it no longer needs (recorded in its release log
/// before EC2 is asked), then ipamd is SIGKILLed and started again while EC2's Describe and
/// IMDS still list them on the card-1 ENI (vpcsim's `release_lag_ms`, `imds_lag_ms`). The new
/// ipamd must not take them back into card 1's pool: EC2 may give them to another node any
/// moment. Before one pool per card, card 1's releases were never recorded, so the start-up
/// Describe put them back for good.
#[test]
fn a_card_1_release_is_not_taken_back_from_a_lagging_describe_after_a_restart() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = two_card_node_with(&[("IP_COOLDOWN_PERIOD", "1")]);
    let bin = aws_cni();
    let target = PluginTarget::multi_nic(&sim, 0);
    let mut pods = Vec::new();
    for n in 0..4 {
        let netns = sim.new_pod_netns().unwrap();
        pods.push(
            add(&bin, &target, netns, n)
                .unwrap_or_else(|e| panic!("ADD: {e}\n{}", sim.ipamd_log_tail(0, 40))),
        );
    }
    let grown = card1_secondaries(&sim);
    assert!(grown >= 4, "card 1 holds the pods' addresses: {grown}");
    // EC2 turns eventually consistent, then the pods go: card 1's pool releases down to its
    // one warm address
    sim.set_knobs(|k| {
        k.release_lag_ms = 60_000;
        k.imds_lag_ms = 60_000;
    });
    for p in &pods {
        run_plugin(&bin, &target, "DEL", p.sandbox(), Some(&p.result))
            .unwrap_or_else(|e| panic!("DEL: {e:?}"));
        integration::supervisor::delete_netns(&p.netns);
    }
    // (one shrink, or two when a DEL's address was still cooling at the first: shrinks are
    // paced 30 s apart; the lag outlasts both)
    eventually(Duration::from_secs(45), || {
        let n = card1_secondaries(&sim);
        if n <= 1 {
            Ok(())
        } else {
            Err(format!("card 1 still has {n} addresses in EC2"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    // killed and started again while Describe and IMDS still list the released addresses, by
    // a rollout that stops pool changes (DISABLE_NETWORK_RESOURCE_PROVISIONING), so only the
    // release log can keep them out: no shrink takes them out again
    sim.stop_ipamd(0, true);
    sim.start_ipamd(
        0,
        &[
            ("ENABLE_MULTI_NIC", "true"),
            ("IPAMD_POOL_TICK_SECONDS", "1"),
            ("IP_COOLDOWN_PERIOD", "1"),
            ("DISABLE_NETWORK_RESOURCE_PROVISIONING", "true"),
        ],
        READY,
    )
    .unwrap_or_else(|e| panic!("restart: {e}\n{}", sim.ipamd_log_tail(0, 40)));
    for look in 0..12 {
        let foreign: Vec<Ipv4Addr> = {
            let owners = sim.ec2_owners();
            sim.pool_addresses(0)
                .unwrap_or_else(|e| panic!("{e}"))
                .into_keys()
                .filter(|ip| owners.get(ip) != Some(&0))
                .collect()
        };
        assert!(
            foreign.is_empty(),
            "look {look}: ipamd holds addresses EC2 no longer has on this node: {foreign:?}\n{}",
            sim.ipamd_log_tail(0, 40)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
