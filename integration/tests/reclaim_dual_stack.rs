//! Issue 28 finding 2 with the real binaries (root only): one IPv6-launched m5.large node of
//! the simulated VPC, the chart's conflist and the real `ipamd` with
//! `ENABLE_DUAL_STACK_PODS=true`, a 2 s reclaim grace and a 2 s address cooldown. One pod
//! loses its `/32` host route, another its `/128` (`ip route del` in the node, as an agent
//! flushing a table would). Their veths live, so reclaim must release nothing: after well over
//! grace + cooldown, `/v1/enis` still lists both families of both pods, ipamd logged no
//! release, and a new pod gets addresses of its own in both families. Before the fix, the
//! address whose route was gone was released ("the pod has had no host veth and no host
//! route") and, lowest-first, the released /128 went to the next pod. The VPC goes on drop,
//! also when an assertion fails.
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use integration::can_run_kernel_tests;
use integration::sim::{Pod, Sim, SimConfig, exec_in};

const READY: Duration = Duration::from_secs(60);
/// `IPAMD_RECLAIM_UNWIRED_SECONDS` (reclaim looks every second) and `IP_COOLDOWN_PERIOD`.
const GRACE_S: u64 = 2;
const COOLDOWN_S: u64 = 2;

/// The pods' /128s node `i`'s ipamd lists as assigned (`/v1/enis`, `IPv6Cidrs`).
fn assigned_v6(sim: &Sim, i: usize) -> BTreeSet<Ipv6Addr> {
    let v = sim.introspect(i, "/v1/enis").expect("/v1/enis");
    let mut out = BTreeSet::new();
    for card in v.as_object().into_iter().flat_map(|c| c.values()) {
        for eni in card["ENIs"]
            .as_object()
            .into_iter()
            .flat_map(|e| e.values())
        {
            for cidr in eni["IPv6Cidrs"]
                .as_object()
                .into_iter()
                .flat_map(|c| c.values())
            {
                for ip in cidr["IPAddresses"]
                    .as_object()
                    .into_iter()
                    .flat_map(|a| a.keys())
                {
                    assert!(out.insert(ip.parse().expect("IPv6")), "{ip} listed twice");
                }
            }
        }
    }
    out
}

fn assigned_v4(sim: &Sim, i: usize) -> BTreeSet<Ipv4Addr> {
    sim.assigned(i).expect("/v1/enis").into_keys().collect()
}

fn run(ns: &str, args: &[&str]) {
    let o = exec_in(ns, args);
    assert!(
        o.status.success(),
        "{args:?} in {ns}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Whether the pod still has `addr` on its `eth0`.
fn pod_has(pod: &Pod, family: &str, addr: &str) -> bool {
    let o = exec_in(
        &pod.netns,
        &["ip", family, "-o", "addr", "show", "dev", "eth0"],
    );
    String::from_utf8_lossy(&o.stdout).contains(&format!(" {addr}/"))
}

#[test]
fn a_dual_stack_pod_missing_one_host_route_keeps_both_addresses() {
    if !can_run_kernel_tests() {
        eprintln!("skipped: needs root");
        return;
    }
    let started = Instant::now();
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        ipv6: true,
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    sim.install_conflist(0, &[("ENABLE_DUAL_STACK_PODS", "true")])
        .expect("conflist");
    let (grace, cooldown) = (GRACE_S.to_string(), COOLDOWN_S.to_string());
    sim.start_ipamd(
        0,
        &[
            ("ENABLE_DUAL_STACK_PODS", "true"),
            ("IPAMD_RECLAIM_UNWIRED_SECONDS", &grace),
            ("IP_COOLDOWN_PERIOD", &cooldown),
            ("IPAMD_POOL_TICK_SECONDS", "1"),
        ],
        READY,
    )
    .expect("ipamd ready");
    let add = |sim: &mut Sim, name: &str| {
        let pod = sim
            .add_pod(0, name)
            .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", sim.ipamd_log_tail(0, 40)));
        let v6 = pod
            .ipv6
            .unwrap_or_else(|| panic!("{name}: no IPv6 in {}", pod.result));
        (pod, v6)
    };
    let (a, a6) = add(&mut sim, "lost-v4-route");
    let (b, b6) = add(&mut sim, "lost-v6-route");
    let node = sim.nodes[0].netns.clone();
    run(
        &node,
        &["ip", "-4", "route", "del", &format!("{}/32", a.ip)],
    );
    run(&node, &["ip", "-6", "route", "del", &format!("{b6}/128")]);

    // Well past grace (+ a reclaim round to notice, + the assignment's own age) + cooldown:
    // before the fix both lost addresses were released by now and free again.
    std::thread::sleep(Duration::from_secs(GRACE_S + COOLDOWN_S + 6));

    // Every violation is collected, then reported together.
    let mut broken = Vec::new();
    let log = std::fs::read_to_string(sim.nodes[0].ipamd_log()).unwrap_or_default();
    broken.extend(
        log.lines()
            .filter(|l| l.contains("released: the pod has had no host veth"))
            .map(|l| format!("ipamd released a live pod's address: {l}")),
    );
    let (v4, v6) = (assigned_v4(&sim, 0), assigned_v6(&sim, 0));
    for (pod, pod6) in [(&a, a6), (&b, b6)] {
        assert!(pod_has(pod, "-4", &pod.ip.to_string()) && pod_has(pod, "-6", &pod6.to_string()));
        if !v4.contains(&pod.ip) || !v6.contains(&pod6) {
            broken.push(format!(
                "{} ({} / {pod6}, both on its eth0) no longer assigned: ipamd holds {v4:?} {v6:?}",
                pod.name, pod.ip
            ));
        }
    }
    // A new pod gets neither family of a live pod.
    let (c, c6) = add(&mut sim, "after");
    if [a.ip, b.ip].contains(&c.ip) || [a6, b6].contains(&c6) {
        broken.push(format!(
            "{} got {} / {c6}, held by a live pod ({} / {a6}, {} / {b6})",
            c.name, c.ip, a.ip, b.ip
        ));
    }
    assert!(
        broken.is_empty(),
        "{broken:#?}\n{}",
        sim.ipamd_log_tail(0, 20)
    );
    sim.check_addresses().expect("IPv4: unique, owned, listed");
    assert_eq!(assigned_v6(&sim, 0), [a6, b6, c6].into());

    for p in [&a, &b, &c] {
        sim.del_pod(p)
            .unwrap_or_else(|e| panic!("DEL {}: {e}", p.name));
    }
    sim.check_addresses().expect("nothing assigned after DEL");
    assert_eq!(assigned_v6(&sim, 0), BTreeSet::new());
    eprintln!("reclaim_dual_stack: {:?}", started.elapsed());
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}
