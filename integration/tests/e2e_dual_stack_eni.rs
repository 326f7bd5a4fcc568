//! Dual-stack pods on a secondary ENI (root only): two m5.large nodes launched with an IPv6
//! (`SimConfig::ipv6`), the real `ipamd` with `ENABLE_DUAL_STACK_PODS=true` and the real
//! `aws-cni`. Node 0 gets pods until one's IPv4 (and so its IPv6, from that ENI's /80) is on a
//! secondary ENI; that pod reaches the IPv6 internet host and a dual-stack pod on node 1 over
//! IPv6, through the ENI's table (rule 1536) whose default route ipamd points at the VPC
//! router's `fe80:ec2::1`. The node plays the IPv6 sysctls of upstream's init
//! (`all/forwarding=1`). The VPC goes on drop, also when an assertion fails.
#![allow(clippy::tests_outside_test_module)]

use std::net::Ipv6Addr;
use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{Pod, Sim, SimConfig, eventually, exec_in};
use vpcsim::fabric::names::INTERNET_HOST_ADDR6;

const READY: Duration = Duration::from_secs(60);

const DUAL_ENV: &[(&str, &str)] = &[
    ("ENABLE_DUAL_STACK_PODS", "true"),
    ("IPAMD_POOL_TICK_SECONDS", "1"),
];

fn out(ns: &str, args: &[&str]) -> String {
    let o = exec_in(ns, args);
    assert!(
        o.status.success(),
        "{args:?} in {ns}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The pod's IPv6 from its ADD result.
fn pod_v6(pod: &Pod) -> Ipv6Addr {
    pod.result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["address"].as_str())
        .filter_map(|a| a.split('/').next()?.parse().ok())
        .next()
        .unwrap_or_else(|| panic!("{}: no IPv6 in {}", pod.name, pod.result))
}

/// The table rule 1536 sends `v6` to, if the plugin added one (a secondary-ENI address).
fn v6_table(sim: &Sim, node: usize, v6: Ipv6Addr) -> Option<u32> {
    let rules = out(
        &sim.nodes[node].netns,
        &["ip", "-6", "rule", "show", "pref", "1536"],
    );
    rules
        .lines()
        .find(|l| l.contains(&format!("from {v6} ")))
        .and_then(|l| l.rsplit(' ').next()?.trim().parse().ok())
}

fn ping6(ns: &str, to: Ipv6Addr) -> Result<(), String> {
    let o = exec_in(
        ns,
        &[
            "busybox",
            "ping",
            "-6",
            "-c",
            "1",
            "-W",
            "2",
            &to.to_string(),
        ],
    );
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ping6 {to} from {ns}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

fn add_pod(sim: &mut Sim, node: usize, name: &str) -> Pod {
    // The pool may be growing (a new ENI): retry while ipamd has no address yet.
    eventually(Duration::from_secs(30), || {
        sim.add_pod(node, name).map_err(|e| e.to_string())
    })
    .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", sim.ipamd_log_tail(node, 40)))
}

#[test]
fn dual_stack_pod_on_a_secondary_eni_reaches_ipv6_destinations() {
    if !can_run_kernel_tests() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 2,
        ipv6: true,
        ..SimConfig::default()
    })
    .expect("sim");
    for i in 0..2 {
        // upstream's init for IPv6: the node forwards IPv6 (new links inherit it)
        out(
            &sim.nodes[i].netns,
            &["sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1"],
        );
        sim.start_ipamd(i, DUAL_ENV, READY)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let peer = add_pod(&mut sim, 1, "ds-peer");
    let peer_v6 = pod_v6(&peer);

    // m5.large: 9 pod addresses on the primary ENI; the tenth pod at the latest is on eth1.
    let mut pods = Vec::new();
    let mut on_secondary = None;
    for k in 0..12 {
        let pod = add_pod(&mut sim, 0, &format!("ds-{k}"));
        let v6 = pod_v6(&pod);
        pods.push(pod.clone());
        if let Some(table) = v6_table(&sim, 0, v6) {
            on_secondary = Some((pod, v6, table));
            break;
        }
    }
    let (pod, v6, table) = on_secondary.expect("no pod landed on a secondary ENI");
    assert!(table > 1, "table {table}");

    // ipamd's ENI set-up routed the table's IPv6 through EC2's gateway address
    let routes = out(
        &sim.nodes[0].netns,
        &["ip", "-6", "route", "show", "table", &table.to_string()],
    );
    assert!(
        routes.contains("default via fe80:ec2::1 dev eth"),
        "{routes}"
    );

    eventually(Duration::from_secs(10), || {
        ping6(&pod.netns, INTERNET_HOST_ADDR6)
    })
    .unwrap_or_else(|e| panic!("{} ({v6}) -> IPv6 internet: {e}", pod.name));
    eventually(Duration::from_secs(10), || ping6(&pod.netns, peer_v6))
        .unwrap_or_else(|e| panic!("{} ({v6}) -> {peer_v6} on node 1: {e}", pod.name));
    eventually(Duration::from_secs(10), || ping6(&peer.netns, v6))
        .unwrap_or_else(|e| panic!("{peer_v6} on node 1 -> {} ({v6}): {e}", pod.name));

    pods.push(peer);
    for p in &pods {
        sim.del_pod(p)
            .unwrap_or_else(|e| panic!("DEL {}: {e}", p.name));
    }
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}
