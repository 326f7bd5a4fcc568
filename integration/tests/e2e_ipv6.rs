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
    Cnitool, EchoServer, INTERNET_ECHO_PORT, INTERNET_HOST, INTERNET_HOST6, Pod, Sandbox, Sim,
    SimConfig, eventually, exec_in, ping, ping6, tcp_echo,
};

const READY: Duration = Duration::from_secs(60);
const POD_PORT: u16 = 8080;

fn ipv6_nodes() -> SimConfig {
    SimConfig {
        ipv6: true,
        ..SimConfig::default()
    }
}

/// ADD `n` pods on `node`; right after each ADD the pod has no tentative IPv6 address (the
/// plugins wait for duplicate address detection, as upstream's).
fn add_pods(sim: &mut Sim, node: usize, n: usize, tag: &str) -> Vec<Pod> {
    (0..n)
        .map(|k| {
            let name = format!("{tag}-n{node}-{k}");
            let pod = sim.add_pod(node, &name).unwrap_or_else(|e| {
                panic!(
                    "ADD {name}: {e}\n{}\n{}",
                    sim.ipamd_log_tail(node, 40),
                    std::fs::read_to_string(sim.nodes[node].egress_plugin_log())
                        .unwrap_or_default()
                )
            });
            // Only interfaces given an IPv6 wait (an IPv4 pod's eth0 link-local may still be
            // tentative, as with upstream).
            let has = |ifname: &str| {
                pod.result["interfaces"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|i| i["name"] == ifname))
            };
            let v6_ifs = [("eth0", pod.ipv6.is_some()), ("v6if0", has("v6if0"))];
            for (ifname, _) in v6_ifs.iter().filter(|(_, v6)| *v6) {
                let out = exec_in(
                    &pod.netns,
                    &["ip", "-6", "-o", "addr", "show", "dev", ifname, "tentative"],
                );
                let tentative = String::from_utf8_lossy(&out.stdout).into_owned();
                assert_eq!(
                    tentative.trim(),
                    "",
                    "{name}: tentative on {ifname} after ADD"
                );
            }
            pod
        })
        .collect()
}

/// The pod's global addresses on `ifname` (`ip -o addr` lines).
fn pod_addrs(pod: &Pod, family: &str, ifname: &str) -> String {
    let out = exec_in(
        &pod.netns,
        &[
            "ip", family, "-o", "addr", "show", "dev", ifname, "scope", "global",
        ],
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The allocations in node `i`'s ipamd checkpoint (upstream's `ipam.json`, both families).
fn checkpoint_allocations(sim: &Sim, i: usize) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(sim.nodes[i].checkpoint()).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["allocations"].as_array().cloned().unwrap_or_default()
}

/// Node `i`'s checkpoint ends empty after every pod's DEL. Entries recovered from host state
/// (a lost checkpoint) are matched by pod name only: released as soon as their veth and route
/// are gone, within a reclaim round or two of the DEL.
fn assert_checkpoint_drains(sim: &Sim, i: usize) {
    eventually(Duration::from_secs(15), || {
        let left = checkpoint_allocations(sim, i);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("node {i} still holds {left:?}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(i, 40)));
}

/// The node's `eth0` as EC2 configures an IPv6 instance: its /128 and `default via fe80::1`.
fn assert_node_eth0_v6(sim: &Sim, i: usize) {
    let v6 = sim.nodes[i].primary_ipv6.expect("IPv6 node");
    let ns = &sim.nodes[i].netns;
    let addrs = String::from_utf8_lossy(
        &exec_in(ns, &["ip", "-6", "-o", "addr", "show", "dev", "eth0"]).stdout,
    )
    .into_owned();
    assert!(addrs.contains(&format!("inet6 {v6}/128")), "{addrs}");
    let routes =
        String::from_utf8_lossy(&exec_in(ns, &["ip", "-6", "route", "show"]).stdout).into_owned();
    assert!(routes.contains("default via fe80::1 dev eth0"), "{routes}");
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
        assert_node_eth0_v6(&sim, i);
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
        assert_eq!(checkpoint_allocations(&sim, i).len(), 2, "node {i}");
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
        assert_eq!(
            checkpoint_allocations(&sim, i),
            Vec::<serde_json::Value>::new()
        );
        // egress-cni logs to its pluginLogFile, as upstream's.
        let log = std::fs::read_to_string(sim.nodes[i].egress_plugin_log()).unwrap_or_default();
        for want in [
            "received a ADD request",
            "ADD done",
            "DEL done",
            "\"level\":\"debug\"",
        ] {
            assert!(log.contains(want), "egress-cni log lacks {want:?}:\n{log}");
        }
    }
    sim.check_addresses().expect("no assignment left");
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}

/// `cnitool` (libcni) on node `node`'s installed conflist, `disableCheck` turned off so that
/// CHECK reaches every plugin: ADD (the result names `egress_if` last, and the pod reaches
/// `target` through it), CHECK, DEL, DEL again; nothing is left (node, ipamd, libcni's cache).
fn cnitool_round(
    sim: &mut Sim,
    node: usize,
    egress_if: &str,
    reach: impl Fn(&str) -> Result<(), String>,
) {
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
    sim.check_addresses()
        .expect("ipamd holds nothing for the pod");
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

/// aws-node's environment for upstream's IPv6 mode (`WARM_PREFIX_TARGET=1` as upstream's
/// manifest sets it).
const IPV6_MODE: [(&str, &str); 4] = [
    ("ENABLE_IPv6", "true"),
    ("ENABLE_IPv4", "false"),
    ("ENABLE_PREFIX_DELEGATION", "true"),
    ("WARM_PREFIX_TARGET", "1"),
];

/// The /80s EC2 delegated to node `i`'s ENIs.
fn node_v6_prefixes(sim: &Sim, i: usize) -> Vec<ipnet::Ipv6Net> {
    let view = vpcsim::World::fabric_view(&sim.world, sim.world.now());
    view.instance(&sim.nodes[i].instance_id)
        .map(|inst| {
            inst.enis
                .iter()
                .flat_map(|e| e.ipv6_prefixes.iter().copied())
                .collect()
        })
        .unwrap_or_default()
}

/// Every live pod's IPv6 is a /128 inside a /80 EC2 delegated to its own node, and unique.
fn assert_v6_addresses(sim: &Sim) {
    let mut seen = std::collections::BTreeSet::new();
    for p in sim.pods() {
        let Some(v6) = p.ipv6 else { continue };
        assert!(seen.insert(v6), "{v6} handed out twice");
        let prefixes = node_v6_prefixes(sim, p.node);
        assert!(
            prefixes
                .iter()
                .any(|n| n.prefix_len() == 80 && n.contains(&v6)),
            "{} ({v6}) not in node {}'s /80s {prefixes:?}",
            p.name,
            p.node
        );
        let cidr = p.result["ips"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["address"].as_str())
            .find(|a| a.contains(':'))
            .unwrap_or_default()
            .to_owned();
        assert_eq!(cidr, format!("{v6}/128"), "{}", p.result);
    }
}

fn v6_pair(from: &Pod, to: &Pod) {
    let v6 = to.ipv6.expect("IPv6 pod");
    eventually(Duration::from_secs(10), || ping6(&from.netns, v6))
        .unwrap_or_else(|e| panic!("{} -> {}: {e}", from.name, to.name));
    tcp_echo(&from.netns, SocketAddr::from((v6, POD_PORT)))
        .unwrap_or_else(|e| panic!("tcp6 {} -> {}: {e}", from.name, to.name));
}

fn v6_servers(pods: &[Pod]) -> Vec<EchoServer> {
    pods.iter()
        .map(|p| {
            EchoServer::start_at(
                &p.netns,
                SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, POD_PORT)),
            )
            .expect("echo server")
        })
        .collect()
}

/// Issue 11's IPv6 cluster of 2 nodes (upstream's IPv6 mode: `ENABLE_IPv6=true`,
/// `ENABLE_IPv4=false`, `ENABLE_PREFIX_DELEGATION=true`; the conflist as the entrypoint
/// renders it, egress-cni giving IPv4 egress): pods get /128s from their node's /80; ping6 and
/// TCP pod↔pod on one node and across nodes; pod → IPv4 internet host through egress-cni
/// (SNAT to the node IPv4: the fabric's IGW drops any other source) and → IPv6 internet host
/// through the egress-only gateway; CHECK; ipamd SIGKILL and SIGTERM restarts keep every pod's
/// IPv6 (still reachable, not handed to a new pod, released by its DEL), and so does a restart
/// that lost the checkpoint (recovered from the host's routes); DEL and DEL again leave
/// nothing.
#[test]
fn ipv6_cluster_pods_reach_pods_and_both_internets() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&ipv6_nodes()).expect("simulated VPC");
    for i in 0..2 {
        let rendered = sim.install_conflist(i, &IPV6_MODE).expect("conflist");
        let eg = &rendered["plugins"][1];
        assert_eq!(eg["enabled"], "true", "{rendered}");
        assert_eq!(eg["nodeIP"], sim.nodes[i].primary_ip.to_string());
        assert_eq!(eg["ipam"]["ranges"][0][0]["subnet"], "169.254.172.0/22");
        assert_eq!(eg["ipam"]["routes"][0]["dst"], "0.0.0.0/0");
        assert_eq!(eg["ipam"]["dataDir"], "/run/cni/v6pd/egress-v4-ipam");
        assert_eq!(
            eg["pluginLogFile"],
            "/var/log/aws-routed-eni/egress-v4-plugin.log"
        );
        sim.start_ipamd(i, &IPV6_MODE, READY).expect("ipamd ready");
    }
    let mut pods = add_pods(&mut sim, 0, 2, "v6");
    pods.extend(add_pods(&mut sim, 1, 2, "v6"));
    assert_v6_addresses(&sim);
    let servers = v6_servers(&pods);
    for p in &pods {
        assert!(p.ip.is_unspecified(), "IPv6-only: {}", p.result);
        let v4 = pod_addrs(p, "-4", "v4if0");
        assert!(v4.contains("inet 169.254.17"), "{}: {v4}", p.name);
    }
    // pod <-> pod: same node, across nodes
    v6_pair(&pods[0], &pods[1]);
    v6_pair(&pods[1], &pods[0]);
    v6_pair(&pods[0], &pods[2]);
    v6_pair(&pods[3], &pods[1]);
    for p in &pods {
        eventually(Duration::from_secs(10), || ping(&p.netns, INTERNET_HOST))
            .unwrap_or_else(|e| panic!("{} -> internet v4: {e}", p.name));
        tcp_echo(
            &p.netns,
            SocketAddr::from((INTERNET_HOST, INTERNET_ECHO_PORT)),
        )
        .unwrap_or_else(|e| panic!("tcp {} -> internet v4: {e}", p.name));
        ping6(&p.netns, INTERNET_HOST6)
            .unwrap_or_else(|e| panic!("{} -> internet v6: {e}", p.name));
        tcp_echo(
            &p.netns,
            SocketAddr::from((INTERNET_HOST6, INTERNET_ECHO_PORT)),
        )
        .unwrap_or_else(|e| panic!("tcp {} -> internet v6: {e}", p.name));
        sim.check_pod(p)
            .unwrap_or_else(|e| panic!("CHECK {}: {e}", p.name));
    }
    for i in 0..2 {
        assert_node_eth0_v6(&sim, i);
        let allocs = checkpoint_allocations(&sim, i);
        assert_eq!(allocs.len(), 2, "node {i}: {allocs:?}");
        let rules = nat(&sim, i, "iptables");
        assert_eq!(rules.matches("-N CNI-E4-").count(), 2, "{rules}");
        assert!(
            rules.contains(&format!("--to-source {}", sim.nodes[i].primary_ip)),
            "{rules}"
        );
    }

    // ipamd crash (node 0) and graceful restart (node 1) with pods running.
    sim.restart_ipamd(0, true, READY)
        .expect("restart after SIGKILL");
    sim.restart_ipamd(1, false, READY)
        .expect("restart after SIGTERM");
    let before: Vec<_> = pods.iter().map(|p| p.ipv6).collect();
    for node in 0..2 {
        let fresh = add_pods(&mut sim, node, 1, "after-restart").remove(0);
        assert!(
            !before.contains(&fresh.ipv6),
            "{:?} was handed out again while its pod lives",
            fresh.ipv6
        );
        pods.push(fresh);
    }
    assert_v6_addresses(&sim);
    v6_pair(&pods[0], &pods[3]);
    v6_pair(&pods[2], &pods[1]);

    // The checkpoint lost (node 0): the live pods' /128s are recovered from the host's IPv6
    // routes and never handed to a new pod; they keep talking.
    sim.restart_ipamd_without_checkpoint(0, READY)
        .expect("restart without checkpoint");
    let live: Vec<_> = pods.iter().map(|p| p.ipv6).collect();
    let fresh = add_pods(&mut sim, 0, 2, "after-loss");
    for f in &fresh {
        assert!(
            !live.contains(&f.ipv6),
            "{:?} was handed out again while its pod lives (checkpoint lost)\n{}",
            f.ipv6,
            sim.ipamd_log_tail(0, 40)
        );
    }
    pods.extend(fresh);
    assert_v6_addresses(&sim);
    v6_pair(&pods[0], &pods[1]);
    v6_pair(&pods[3], &pods[0]);
    drop(servers);

    for p in &pods {
        sim.del_pod(p)
            .unwrap_or_else(|e| panic!("DEL {}: {e}", p.name));
        sim.del_pod_again(p)
            .unwrap_or_else(|e| panic!("DEL again {}: {e}", p.name));
    }
    for i in 0..2 {
        assert_eq!(sim.pod_leftovers(i), Vec::<String>::new(), "node {i}");
        assert!(!nat(&sim, i, "iptables").contains("CNI-E4"));
        assert_checkpoint_drains(&sim, i);
    }
    // Every address released: as many new pods as before get addresses, none reused twice.
    let again = add_pods(&mut sim, 0, 3, "again");
    assert_v6_addresses(&sim);
    for p in &again {
        sim.del_pod(p).expect("DEL");
    }
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}

/// Dual-stack pods (ours, `ENABLE_DUAL_STACK_PODS=true` in an IPv4 cluster whose nodes have
/// an IPv6): each pod gets an IPv4 from the warm pool and a /128 from its node's /80 on the
/// same `eth0`; ping and TCP in both families across nodes; the IPv6 internet host directly
/// (global /80 address, egress-only gateway) and the IPv4 one through SNAT; a restart that lost
/// the checkpoint hands neither family of a live pod to a new pod; DEL and DEL again leave
/// nothing.
#[test]
fn dual_stack_pods_reach_both_families_across_nodes() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&ipv6_nodes()).expect("simulated VPC");
    for i in 0..2 {
        sim.install_conflist(i, &[("ENABLE_DUAL_STACK_PODS", "true")])
            .expect("conflist");
        sim.start_ipamd(
            i,
            &[
                ("ENABLE_DUAL_STACK_PODS", "true"),
                ("IPAMD_POOL_TICK_SECONDS", "1"),
            ],
            READY,
        )
        .expect("ipamd ready");
    }
    let mut pods = add_pods(&mut sim, 0, 2, "ds");
    pods.extend(add_pods(&mut sim, 1, 2, "ds"));
    sim.check_addresses().expect("IPv4 addresses");
    assert_v6_addresses(&sim);
    let v4_servers: Vec<EchoServer> = pods
        .iter()
        .map(|p| EchoServer::start(&p.netns, POD_PORT + 1).expect("echo server"))
        .collect();
    let v6_servers = v6_servers(&pods);
    for p in &pods {
        assert!(!p.ip.is_unspecified() && p.ipv6.is_some(), "{}", p.result);
        let peer = pods.iter().find(|q| q.node != p.node).unwrap();
        ping(&p.netns, peer.ip).unwrap_or_else(|e| panic!("{} -> {}: {e}", p.name, peer.name));
        tcp_echo(&p.netns, SocketAddr::from((peer.ip, POD_PORT + 1)))
            .unwrap_or_else(|e| panic!("tcp {} -> {}: {e}", p.name, peer.name));
        v6_pair(p, peer);
        ping(&p.netns, INTERNET_HOST).unwrap_or_else(|e| panic!("{} -> internet: {e}", p.name));
        eventually(Duration::from_secs(10), || ping6(&p.netns, INTERNET_HOST6))
            .unwrap_or_else(|e| panic!("{} -> internet v6: {e}", p.name));
        sim.check_pod(p)
            .unwrap_or_else(|e| panic!("CHECK {}: {e}", p.name));
    }
    // The checkpoint lost (node 0): neither family of a live pod goes to a new pod.
    sim.restart_ipamd_without_checkpoint(0, READY)
        .expect("restart without checkpoint");
    let fresh = add_pods(&mut sim, 0, 1, "ds-after-loss").remove(0);
    for p in &pods {
        assert!(
            fresh.ip != p.ip && fresh.ipv6 != p.ipv6,
            "{} got {} / {:?} of the live {}\n{}",
            fresh.name,
            fresh.ip,
            fresh.ipv6,
            p.name,
            sim.ipamd_log_tail(0, 40)
        );
    }
    pods.push(fresh);
    // ipamd holds exactly node 0's live IPv4s (the recovered ones carry no pod name).
    let held: Vec<_> = sim.assigned(0).expect("/v1/enis").into_keys().collect();
    let mut live: Vec<_> = pods.iter().filter(|p| p.node == 0).map(|p| p.ip).collect();
    live.sort();
    assert_eq!(held, live);
    assert_v6_addresses(&sim);
    v6_pair(&pods[0], &pods[2]);
    drop((v4_servers, v6_servers));
    for p in &pods {
        sim.del_pod(p)
            .unwrap_or_else(|e| panic!("DEL {}: {e}", p.name));
        sim.del_pod_again(p)
            .unwrap_or_else(|e| panic!("DEL again {}: {e}", p.name));
    }
    for i in 0..2 {
        assert_eq!(sim.pod_leftovers(i), Vec::<String>::new(), "node {i}");
        assert_checkpoint_drains(&sim, i);
    }
    sim.check_addresses().expect("nothing assigned");
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}

/// cnitool with the conflist rendered for an IPv6 cluster (aws-cni + egress-cni with IPv4
/// egress + portmap): the IPv6 pod reaches the IPv4 internet host through `v4if0`.
#[test]
fn cnitool_add_check_del_with_the_ipv6_conflist() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        ..ipv6_nodes()
    })
    .expect("simulated VPC");
    sim.install_conflist(0, &IPV6_MODE).expect("conflist");
    sim.start_ipamd(0, &IPV6_MODE, READY).expect("ipamd ready");
    cnitool_round(&mut sim, 0, "v4if0", |ns| {
        ping(ns, INTERNET_HOST)?;
        ping6(ns, INTERNET_HOST6)
    });
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}

/// `ENABLE_V6_EGRESS=true` on a node whose primary ENI has no IPv6: vpcsim's IMDS answers 404
/// for `ipv6`, so the rendered conflist has egress-cni disabled (upstream's entrypoint warns
/// and goes on) and pods are wired without `v6if0`.
#[test]
fn v6_egress_without_a_node_ipv6_renders_egress_disabled() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    assert_eq!(sim.nodes[0].primary_ipv6, None);
    sim.start_ipamd(0, &[], READY).expect("ipamd ready");
    let rendered = sim
        .install_conflist(0, &[("ENABLE_V6_EGRESS", "true")])
        .expect("conflist");
    assert_eq!(rendered["plugins"][1]["enabled"], "false", "{rendered}");
    assert_eq!(rendered["plugins"][1]["nodeIP"], "", "{rendered}");
    let pod = add_pods(&mut sim, 0, 1, "nov6").remove(0);
    let names: Vec<&str> = pod.result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert!(!names.contains(&"v6if0"), "{}", pod.result);
    ping(&pod.netns, INTERNET_HOST).expect("IPv4 internet");
    sim.del_pod(&pod).expect("DEL");
    assert_eq!(sim.pod_leftovers(0), Vec::<String>::new());
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}
