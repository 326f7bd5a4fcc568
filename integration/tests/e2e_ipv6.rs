//! End to end on the simulated IPv6 VPC (root only): 2 m5.large nodes launched as IPv6 EKS
//! nodes (primary ENI with one IPv6: IMDS `ipv6s`, the /128 and `default via fe80::1` on the
//! node's `eth0`), the real `ipamd`, and the chain aws-node installs — the chart's conflist
//! template filled in by the real `aws-cni-conflist` inside each node (egress-cni's `nodeIP`
//! from vpcsim's IMDS), run as libcni runs it: `aws-cni`, `egress-cni`, `portmap`.
//!
//! - IPv4 cluster with `ENABLE_V6_EGRESS=true`: pods reach the IPv6 internet host through the
//!   egress-only gateway, SNATed to the node's IPv6 (the fabric's IPv6 source/destination check
//!   drops anything else); every DEL, and a second one, leaves no address, veth, rule, chain
//!   or host-local lease.
//!
//! - A real CNI client, `cnitool` on libcni (`integration/cnitool`), with the installed
//!   conflist: ADD → CHECK → DEL → DEL again succeed and leave nothing.
//!
//! The whole VPC goes on drop, also when an assertion fails.
#![allow(clippy::tests_outside_test_module)]

use std::net::SocketAddr;
use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{
    Cnitool, EchoServer, INTERNET_ECHO_PORT, INTERNET_HOST6, Pod, Sandbox, Sim, SimConfig,
    eventually, exec_in, ping, ping6, tcp_echo,
};

const READY: Duration = Duration::from_secs(60);
const POD_PORT: u16 = 8080;

fn ipv6_nodes() -> SimConfig {
    SimConfig {
        ipv6: true,
        ..SimConfig::default()
    }
}

fn add_pods(sim: &mut Sim, node: usize, n: usize, tag: &str) -> Vec<Pod> {
    (0..n)
        .map(|k| {
            let name = format!("{tag}-n{node}-{k}");
            sim.add_pod(node, &name).unwrap_or_else(|e| {
                panic!(
                    "ADD {name}: {e}\n{}\n{}",
                    sim.ipamd_log_tail(node, 40),
                    std::fs::read_to_string(sim.nodes[node].egress_plugin_log())
                        .unwrap_or_default()
                )
            })
        })
        .collect()
}

/// The pod's global addresses on `ifname` (`ip -o addr` lines).
fn pod_addrs(pod: &Pod, family: &str, ifname: &str) -> String {
    let out = exec_in(
        &pod.netns,
        &["ip", family, "-o", "addr", "show", "dev", ifname, "scope", "global"],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn nat(sim: &Sim, node: usize, tool: &str) -> String {
    let out = exec_in(&sim.nodes[node].netns, &[tool, "-w", "-t", "nat", "-S"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// IPv4 cluster, `ENABLE_V6_EGRESS=true` (issue 11, acceptance: "an IPv4 cluster with
/// ENABLE_V6_EGRESS=true reaches the IPv6 host").
#[test]
fn ipv4_cluster_with_v6_egress_reaches_the_ipv6_internet() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&ipv6_nodes()).expect("simulated VPC");
    let env = [("ENABLE_V6_EGRESS", "true")];
    for i in 0..2 {
        sim.start_ipamd(i, &[("IPAMD_POOL_TICK_SECONDS", "1")], READY)
            .expect("ipamd ready");
        let node_v6 = sim.nodes[i].primary_ipv6.expect("IPv6 node");
        let rendered = sim.install_conflist(i, &env).expect("conflist");
        // As upstream's entrypoint renders it for an IPv4 cluster with IPv6 egress; nodeIP is
        // IMDS `ipv6` (vpcsim's IMDS inside the node).
        let eg = &rendered["plugins"][1];
        assert_eq!(eg["type"], "egress-cni", "{rendered}");
        assert_eq!(eg["enabled"], "true", "{rendered}");
        assert_eq!(eg["nodeIP"], node_v6.to_string(), "{rendered}");
        assert_eq!(eg["ipam"]["ranges"][0][0]["subnet"], "fd00::ac:00/118");
        assert_eq!(eg["ipam"]["routes"][0]["dst"], "::/0");
        assert_eq!(eg["ipam"]["dataDir"], "/run/cni/v4pd/egress-v6-ipam");
        assert_eq!(
            eg["pluginLogFile"],
            "/var/log/aws-routed-eni/egress-v6-plugin.log"
        );
        assert_eq!(rendered["plugins"][0]["type"], "aws-cni");
        assert_eq!(rendered["plugins"][2]["type"], "portmap");
    }

    let mut pods = add_pods(&mut sim, 0, 2, "v6eg");
    pods.extend(add_pods(&mut sim, 1, 2, "v6eg"));
    sim.check_addresses().expect("addresses");
    let servers: Vec<EchoServer> = pods
        .iter()
        .map(|p| EchoServer::start(&p.netns, POD_PORT).expect("echo server"))
        .collect();
    for p in &pods {
        assert!(p.ipv6.is_none(), "an IPv4 pod: {}", p.result);
        // The chain's result: aws-cni's, plus egress-cni's host veth and v6if0.
        let names: Vec<&str> = p.result["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| i["name"].as_str())
            .collect();
        assert_eq!(names.last(), Some(&"v6if0"), "{}", p.result);
        let v6 = pod_addrs(p, "-6", "v6if0");
        assert!(v6.contains("inet6 fd00::ac:"), "{}: {v6}", p.name);
        // IPv4 still works: the pod on the other node.
        let peer = pods.iter().find(|q| q.node != p.node).unwrap();
        ping(&p.netns, peer.ip).unwrap_or_else(|e| panic!("{} -> {}: {e}", p.name, peer.name));
        tcp_echo(&p.netns, SocketAddr::from((peer.ip, POD_PORT)))
            .unwrap_or_else(|e| panic!("tcp {} -> {}: {e}", p.name, peer.name));
        // The IPv6 internet host through v6if0, the node and the egress-only gateway. The
        // fabric drops a source that is not the node's (src/dst check): a reply proves SNAT.
        eventually(Duration::from_secs(10), || ping6(&p.netns, INTERNET_HOST6))
            .unwrap_or_else(|e| panic!("{} -> internet v6: {e}", p.name));
        tcp_echo(
            &p.netns,
            SocketAddr::from((INTERNET_HOST6, INTERNET_ECHO_PORT)),
        )
        .unwrap_or_else(|e| panic!("tcp {} -> internet v6: {e}", p.name));
    }
    for i in 0..2 {
        let rules = nat(&sim, i, "ip6tables");
        let node_v6 = sim.nodes[i].primary_ipv6.unwrap();
        assert_eq!(rules.matches("-N CNI-E6-").count(), 2, "{rules}");
        assert!(rules.contains(&format!("--to-source {node_v6}")), "{rules}");
        assert_eq!(sim.egress_leases(i).len(), 2);
    }
    for p in &pods {
        sim.check_pod(p)
            .unwrap_or_else(|e| panic!("CHECK {}: {e}", p.name));
    }
    drop(servers);

    // DEL through the chain (reverse order), then again, as a runtime retries.
    for p in &pods {
        sim.del_pod(p)
            .unwrap_or_else(|e| panic!("DEL {}: {e}", p.name));
        sim.del_pod_again(p)
            .unwrap_or_else(|e| panic!("DEL again {}: {e}", p.name));
    }
    for i in 0..2 {
        assert_eq!(sim.pod_leftovers(i), Vec::<String>::new(), "node {i}");
        assert!(!nat(&sim, i, "ip6tables").contains("CNI-E6"));
    }
    sim.check_addresses().expect("no assignment left");
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}

/// `cnitool` (libcni) on node `node`'s installed conflist, `disableCheck` turned off so that
/// CHECK reaches every plugin: ADD (the result names `egress_if` last, and the pod reaches
/// `target` through it), CHECK, DEL, DEL again; nothing is left (node, ipamd, libcni's cache).
fn cnitool_round(sim: &mut Sim, node: usize, egress_if: &str, reach: impl Fn(&str) -> Result<(), String>) {
    let tool = Cnitool::build(sim.dir()).expect("build cnitool");
    sim.edit_conflist(node, |c| c["disableCheck"] = false.into())
        .expect("conflist");
    let netns = sim.new_pod_netns().expect("pod netns");
    let sandbox = Sandbox {
        pod_name: "cnitool-pod",
        container_id: "cnitool0123456789",
        netns: &netns,
    };
    let out = sim
        .cnitool(&tool, node, "add", sandbox)
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(node, 30)));
    let result: serde_json::Value = serde_json::from_str(&out).expect("ADD result JSON");
    let names: Vec<&str> = result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names.last(), Some(&egress_if), "{result}");
    eventually(Duration::from_secs(10), || reach(&netns))
        .unwrap_or_else(|e| panic!("cnitool pod: {e}"));
    sim.cnitool(&tool, node, "check", sandbox)
        .expect("CHECK through every plugin");
    sim.cnitool(&tool, node, "del", sandbox).expect("DEL");
    sim.cnitool(&tool, node, "del", sandbox).expect("DEL again");
    assert_eq!(sim.pod_leftovers(node), Vec::<String>::new());
    sim.check_addresses().expect("ipamd holds nothing for the pod");
    let cached = std::fs::read_dir(sim.nodes[node].dir.join("cni-cache/results"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(cached, 0, "libcni's cache entry goes with DEL");
}

/// cnitool with the conflist rendered for an IPv4 cluster with `ENABLE_V6_EGRESS=true`.
#[test]
fn cnitool_add_check_del_with_the_v6_egress_conflist() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        ..ipv6_nodes()
    })
    .expect("simulated VPC");
    sim.start_ipamd(0, &[], READY).expect("ipamd ready");
    sim.install_conflist(0, &[("ENABLE_V6_EGRESS", "true")])
        .expect("conflist");
    cnitool_round(&mut sim, 0, "v6if0", |ns| ping6(ns, INTERNET_HOST6));
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}
