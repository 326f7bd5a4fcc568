//! Issue 14 items 1 and 2: our ipamd adopts nodes laid out as upstream aws-node v1.23 leaves
//! them (pods, rules, chains in the current and the older chain-per-CIDR layout, `ipam.json`
//! written by Go's encoding/json), with every pod keeping its address and traffic; restarts
//! change nothing; DEL of upstream's pods works through our plugin; and the node we hand back is
//! what upstream's restore accepts. On a node whose iptables is nf_tables, upstream v1.23 keeps
//! the pod connmark in its table `ip aws-cni` (issue 26 item 4): node 0 is laid out so, node 1
//! (the older layout) with the iptables connmark, and both end with the table only. Root only
//! (network namespaces); needs `go` (golang-go) and `nft`.

#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use integration::sim::{INTERNET_HOST, Sim, SimConfig, eventually};
use integration::sim::{PingStream, PluginTarget, Sandbox, netns_path, run_plugin};
use integration::upstream_node::{
    ChainLayout, UpstreamIpam, UpstreamNode, aws_cni_table, host_links, iptables_save, lay_out,
    rules_and_routes,
};

/// Replies a pod may lose across the swap: the last request in flight when the stream stops.
/// Our ipamd changes nothing a pod's packets use (measured: 0 beyond that one).
const LOSS_WINDOW: u64 = 1;

/// Whether node `i`'s iptables is nf_tables, where upstream v1.23 (and we) keep the pod
/// connmark in the table `ip aws-cni` instead of `AWS-CONNMARK-CHAIN-0` (issue 26 item 4).
fn nft_node(sim: &Sim, i: usize) -> bool {
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &sim.nodes[i].netns,
            "iptables",
            "--version",
        ])
        .output()
        .expect("iptables --version");
    String::from_utf8_lossy(&out.stdout).contains("nf_tables")
}

/// The chains upstream v1.23 keeps on node `i`.
fn upstream_chains(sim: &Sim, i: usize) -> &'static [&'static str] {
    if nft_node(sim, i) {
        &[":AWS-SNAT-CHAIN-0 -"]
    } else {
        &[":AWS-CONNMARK-CHAIN-0 -", ":AWS-SNAT-CHAIN-0 -"]
    }
}

/// Our iptables lines (and the `ip aws-cni` table listing with handles, as one more line),
/// rules and routes of node `i`.
fn aws_state(sim: &Sim, i: usize) -> (Vec<String>, Vec<String>, Vec<String>) {
    let save = iptables_save(sim, i).unwrap();
    let mut ipt: Vec<String> = save
        .lines()
        .filter(|l| (l.starts_with("-A") || l.starts_with(':')) && l.contains("AWS"))
        .map(|l| l.split(" [").next().unwrap_or(l).to_owned())
        .collect();
    ipt.extend(aws_cni_table(sim, i).unwrap());
    let (rules, routes) = rules_and_routes(sim, i).unwrap();
    (ipt, rules, routes)
}

fn assert_no_duplicates(what: &str, lines: &[String]) {
    let mut seen = std::collections::BTreeSet::new();
    for l in lines {
        assert!(
            seen.insert(l),
            "{what}: duplicate {l:?} in\n{}",
            lines.join("\n")
        );
    }
}

fn expected_assignments(nodes: &[UpstreamNode], i: usize) -> BTreeMap<Ipv4Addr, String> {
    nodes[i]
        .pods
        .iter()
        .map(|p| (p.ip, p.name.clone()))
        .collect()
}

#[test]
fn ipamd_adopts_upstream_nodes_and_hands_them_back() {
    if !integration::can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig::default()).expect("sim");
    let go = UpstreamIpam::build(sim.dir()).expect("go helper");
    let nodes = vec![
        lay_out(&sim, &go, 0, 3, 2, ChainLayout::Current).expect("node 0"),
        lay_out(&sim, &go, 1, 2, 2, ChainLayout::ChainPerCidr).expect("node 1"),
    ];
    let pods: Vec<_> = nodes.iter().flat_map(|n| n.pods.clone()).collect();
    // Upstream's wiring carries traffic before we touch anything: every pod to the internet
    // host (SNAT, connmark) and to a pod on the other node.
    let peer = |node: usize| nodes[1 - node].pods[0].ip;
    for p in &pods {
        eventually(Duration::from_secs(5), || {
            integration::sim::ping(&p.netns, INTERNET_HOST)
        })
        .unwrap_or_else(|e| panic!("{} before the swap: {e}", p.name));
        integration::sim::ping(&p.netns, peer(p.node)).expect("pod to pod before the swap");
    }
    let ec2_before: Vec<_> = pods.iter().map(|p| sim.eni_of(p.node, p.ip)).collect();
    assert!(ec2_before.iter().all(Option::is_some));
    let mut streams = Vec::new();
    for p in &pods {
        streams.push(PingStream::start(&p.netns, INTERNET_HOST).unwrap());
        streams.push(PingStream::start(&p.netns, peer(p.node)).unwrap());
    }
    std::thread::sleep(Duration::from_secs(1));

    // The swap: our ipamd starts on the upstream nodes.
    for i in 0..2 {
        // the fixture leaves 2 free addresses per node: the pool is already what ipamd wants,
        // so no ENI is attached while the idempotency of the host layout is measured
        sim.start_ipamd(i, &[("WARM_IP_TARGET", "2")], Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for i in 0..2 {
        let got: BTreeMap<Ipv4Addr, String> = eventually(Duration::from_secs(10), || {
            let got: BTreeMap<_, _> = sim
                .assigned(i)?
                .into_iter()
                .map(|(ip, (_, pod))| (ip, pod))
                .collect();
            if got == expected_assignments(&nodes, i) {
                Ok(got)
            } else {
                Err(format!("node {i}: {got:?}"))
            }
        })
        .unwrap();
        assert_eq!(got.len(), nodes[i].pods.len());
    }
    std::thread::sleep(Duration::from_secs(3));
    let adopted: Vec<_> = (0..2).map(|i| aws_state(&sim, i)).collect();
    for (i, (ipt, rules, _)) in adopted.iter().enumerate() {
        assert_no_duplicates("iptables", ipt);
        assert_no_duplicates("rules", rules);
        let text = ipt.join("\n");
        for gone in ["AWS-SNAT-CHAIN-1", "AWS-CONNMARK-CHAIN-1", "--state NEW"] {
            assert!(
                !text.contains(gone),
                "node {i}: upstream's {gone} left:\n{text}"
            );
        }
        for kept in upstream_chains(&sim, i) {
            assert!(text.contains(kept), "node {i}: {kept} missing:\n{text}");
        }
        // Exactly one connmark: the table on an nf_tables node (node 0 keeps upstream v1.23's
        // table as it was, node 1's chain-per-CIDR iptables connmark moves into one), the
        // iptables chain on a legacy one.
        let table = text.contains("table ip aws-cni");
        if nft_node(&sim, i) {
            assert!(
                table && !text.contains("AWS-CONNMARK-CHAIN"),
                "node {i}:\n{text}"
            );
        } else {
            assert!(!table, "node {i}:\n{text}");
        }
    }
    // Idempotent adoption: restarts (graceful and crash) change no rule, route or chain.
    for round in 0..3 {
        for i in 0..2 {
            sim.restart_ipamd(i, round == 1, Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        std::thread::sleep(Duration::from_secs(2));
        for (i, before) in adopted.iter().enumerate() {
            assert_eq!(
                &aws_state(&sim, i),
                before,
                "node {i} changed at restart {round}"
            );
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    for s in streams {
        let what = s.what().to_owned();
        let c = s.stop().unwrap();
        eprintln!("{what}: sent {} lost {}", c.sent, c.lost());
        assert!(c.sent > 100, "{what}: only {} sent", c.sent);
        assert!(
            c.lost() <= LOSS_WINDOW,
            "{what}: lost {} of {}",
            c.lost(),
            c.sent
        );
    }
    for (p, before) in pods.iter().zip(&ec2_before) {
        assert_eq!(
            &sim.eni_of(p.node, p.ip),
            before,
            "{}: EC2 owner moved",
            p.name
        );
    }

    // Pods under our ipamd: new ones through our plugin, next to upstream's.
    let mut ours = Vec::new();
    for i in 0..2 {
        for k in 0..2 {
            ours.push(
                sim.add_pod(i, &format!("ours-{i}-{k}"))
                    .expect("add under ours"),
            );
        }
    }

    // Hand-back: the node as upstream's restore reads it.
    for (i, node) in nodes.iter().enumerate() {
        sim.stop_ipamd(i, false);
        let links = host_links(&sim, i).unwrap();
        let kept = go
            .read(&sim.nodes[i].checkpoint(), &links)
            .expect("upstream restore");
        let mut got: BTreeMap<String, (String, String)> = BTreeMap::new();
        for e in &kept {
            assert_eq!(e["networkName"], "aws-cni");
            assert_eq!(e["ifName"], "eth0");
            assert!(e["allocated"].as_str().unwrap().starts_with("20"), "{e}");
            got.insert(
                e["ipv4"].as_str().unwrap().to_owned(),
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["containerID"].as_str().unwrap().to_owned(),
                ),
            );
        }
        let mut want: BTreeMap<String, (String, String)> = node
            .pods
            .iter()
            .map(|p| (p.ip.to_string(), (p.name.clone(), p.container_id.clone())))
            .collect();
        want.extend(
            ours.iter()
                .filter(|p| p.node == i)
                .map(|p| (p.ip.to_string(), (p.name.clone(), p.container_id.clone()))),
        );
        assert_eq!(got, want, "node {i}: what upstream would restore");
        let (ipt, rules, _) = aws_state(&sim, i);
        let mut chains: Vec<&str> = ipt
            .iter()
            .filter(|l| l.starts_with(':'))
            .map(String::as_str)
            .collect();
        chains.sort_unstable();
        assert_eq!(
            chains,
            upstream_chains(&sim, i),
            "node {i}: chains upstream expects"
        );
        assert_eq!(
            ipt.iter().any(|l| l.contains("table ip aws-cni")),
            nft_node(&sim, i),
            "node {i}: the table upstream v1.23 expects on an nf_tables node"
        );
        for ip in want.keys() {
            assert!(
                rules
                    .iter()
                    .any(|r| r == &format!("512: from all to {ip} lookup main")),
                "node {i}: rule 512 for {ip}\n{rules:?}"
            );
        }
        sim.restart_ipamd(i, false, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    // DEL of every pod through our plugin: upstream's with the result upstream's plugin gave.
    let aws_cni = integration::upstream_node::built("aws-cni").unwrap();
    for p in &pods {
        let prev = p.prev_result(&netns_path(&p.netns));
        let sandbox = Sandbox {
            pod_name: &p.name,
            container_id: &p.container_id,
            netns: &p.netns,
        };
        run_plugin(
            &aws_cni,
            &PluginTarget::of(&sim, p.node),
            "DEL",
            sandbox,
            Some(&prev),
        )
        .unwrap_or_else(|e| panic!("DEL {}: {e:?}", p.name));
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &p.netns])
            .status();
    }
    for p in &ours {
        sim.del_pod(p).expect("DEL ours");
    }
    for i in 0..2 {
        eventually(Duration::from_secs(10), || {
            let held = sim.assigned(i)?;
            let left = sim.pod_leftovers(i);
            if held.is_empty() && left.is_empty() {
                Ok(())
            } else {
                Err(format!("node {i}: held {held:?}, left {left:?}"))
            }
        })
        .unwrap();
        sim.stop_ipamd(i, false);
        let kept = go
            .read(&sim.nodes[i].checkpoint(), &host_links(&sim, i).unwrap())
            .unwrap();
        assert!(kept.is_empty(), "node {i}: {kept:?}");
    }
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}
