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

/// Runs `ip <args>` in namespace `ns`; its stdout, or the failure.
fn ip_ns(ns: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(["-n", ns])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip -n {ns} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn multi_nic_checkpoint(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_default())
        .unwrap_or(serde_json::Value::Null)
}

fn entry_of<'a>(cp: &'a serde_json::Value, container: &str) -> Option<&'a serde_json::Value> {
    cp["allocations"]
        .as_array()?
        .iter()
        .find(|e| e["containerID"] == container)
}

/// Issue 26 item 2 (multi-NIC) and item 4 of the takeover: a `c6in.32xlarge` node laid out as
/// upstream v1.23.1 with `ENABLE_MULTI_NIC` leaves it, as its code does it (the steps are
/// written here from upstream's code, nothing of ours lays it out):
/// - EC2: an ENI on network card 1, device 0 (`tryAllocateENI(ctx, 1)` → `attachENI` with
///   `NetworkCardIndex`), tagged as upstream's;
/// - host: that ENI's table 10100 (`CalculateRouteTableId(0, 1)`, `setupENINetwork`) and its
///   rule 32765;
/// - a multi-NIC pod wired by upstream's plugin (`driver.SetupPodNetwork`, index 0 and 1):
///   `eth0` and `mNicIf1` (pod table 1, rule at priority 1, gateway 169.254.1.2), host
///   veths `eni<sha1(ns.name)>` and `eni<sha1(ns.name.1)>`, rules 512 and 1536 → 10100;
/// - `ipam.json` and `ipam-nic-1.json` written by Go's encoding/json, `interfacesCount` 2
///   (`datastore.InitializeDataStores`, `AddNetwork` `InterfacesCount: ipsRequired`).
///
/// Our ipamd with `ENABLE_MULTI_NIC=true` takes it over: both addresses stay the pod's (card
/// 0's in `/v1/enis` under card 0, card 1's under card 1, the card file rewritten with the
/// entry), traffic through each interface goes on, a new multi-NIC pod gets other addresses
/// on both cards (nothing double-assigned), and DEL through our plugin frees both.
#[test]
fn ipamd_takes_over_an_upstream_multi_nic_node() {
    if !integration::can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 2,
        instance_type: "c6in.32xlarge".into(),
        ..SimConfig::default()
    })
    .expect("sim");
    let go = UpstreamIpam::build(sim.dir()).expect("go helper");
    let node_ns = sim.nodes[0].netns.clone();
    let instance = sim.nodes[0].instance_id.clone();

    // EC2 as upstream's ipamd leaves it.
    let (primary_eni, subnet_id) = sim.world.read(|s| {
        let e = s.enis_of(&instance);
        e.iter()
            .find(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.device_index == 0 && a.network_card_index == 0)
            })
            .map(|e| (e.id.clone(), e.subnet_id.clone()))
            .unwrap()
    });
    let card1 = sim
        .world
        .mutate(|s, now| {
            s.assign_ipv4(
                &primary_eni,
                vpcsim::state::AssignIpv4 {
                    count: 2,
                    ..Default::default()
                },
            )?;
            let id = s.create_eni(vpcsim::state::CreateEni {
                subnet_id: subnet_id.clone(),
                description: format!("aws-K8S-{instance}"),
                secondary_count: 2,
                tags: [
                    (
                        "node.k8s.amazonaws.com/instance_id".to_owned(),
                        instance.clone(),
                    ),
                    (
                        "node.k8s.amazonaws.com/createdAt".to_owned(),
                        "2026-01-01T00:00:00Z".to_owned(),
                    ),
                    (
                        "cluster.k8s.amazonaws.com/name".to_owned(),
                        "vpcsim-e2e".to_owned(),
                    ),
                ]
                .into_iter()
                .collect(),
                ..Default::default()
            })?;
            s.stamp_created(&id, now);
            s.attach_eni_on_card(&id, &instance, 0, 1, now)?;
            Ok(id)
        })
        .expect("EC2 layout");
    let view = vpcsim::World::fabric_view(&sim.world, sim.world.now());
    let inst = view.instance(&instance).unwrap();
    let eth0 = inst
        .enis
        .iter()
        .find(|e| e.network_card_index == 0 && e.device_index == 0)
        .unwrap()
        .clone();
    let card1_view = inst
        .enis
        .iter()
        .find(|e| e.eni_id == card1)
        .unwrap()
        .clone();
    assert_eq!(card1_view.network_card_index, 1);
    let (ip0, ip1) = (eth0.secondary_ips[0], card1_view.secondary_ips[0]);
    eventually(Duration::from_secs(20), || {
        std::process::Command::new("ip")
            .args(["-n", &node_ns, "link", "show", "eth100"])
            .status()
            .ok()
            .filter(std::process::ExitStatus::success)
            .map(drop)
            .ok_or_else(|| "eth100 not there yet".to_owned())
    })
    .unwrap();

    // Host: upstream's setupENINetwork for the card-1 ENI (table 10100).
    let gw = Ipv4Addr::from_bits(card1_view.subnet_cidr.network().to_bits() + 1).to_string();
    let eni_ip = card1_view.primary_ip.to_string();
    ip_ns(&node_ns, &["link", "set", "eth100", "mtu", "9001", "up"]);
    ip_ns(
        &node_ns,
        &[
            "addr",
            "add",
            &format!("{eni_ip}/{}", card1_view.subnet_cidr.prefix_len()),
            "dev",
            "eth100",
        ],
    );
    ip_ns(
        &node_ns,
        &[
            "route", "add", &gw, "dev", "eth100", "scope", "link", "table", "10100",
        ],
    );
    ip_ns(
        &node_ns,
        &[
            "route", "add", "default", "via", &gw, "dev", "eth100", "table", "10100",
        ],
    );
    ip_ns(
        &node_ns,
        &[
            "route",
            "del",
            &card1_view.subnet_cidr.to_string(),
            "dev",
            "eth100",
        ],
    );
    ip_ns(
        &node_ns,
        &[
            "rule", "add", "from", &eni_ip, "lookup", "10100", "priority", "32765",
        ],
    );

    // The pod, wired by upstream's plugin (index 0 on the primary ENI, index 1 on card 1).
    let pod_ns = format!("{}mnicup", sim.prefix());
    integration::supervisor::add_netns(&pod_ns).unwrap();
    let container = format!("{:064x}", 0x6d6e_6963_u128);
    let spec = |ip: Ipv4Addr| {
        serde_json::json!({
            "containerID": container, "namespace": "default", "name": "mnic-up",
            "ipv4": ip.to_string(), "allocationTimestamp": 1_767_225_600_000_000_000_i64,
            "interfacesCount": 2,
        })
    };
    let veths = go.write(&sim.nodes[0].checkpoint(), &[spec(ip0)]).unwrap();
    let card1_file = sim.nodes[0].dir.join("ipam-nic-1.json");
    go.write(&card1_file, &[spec(ip1)]).unwrap();
    let veth0 = veths[0].clone();
    let veth1 = dataplane::conventions::host_veth_name_at("eni", "default", "mnic-up", 1);
    for (index, veth, ifname, ip, table) in [
        (0_u32, veth0.as_str(), "eth0", ip0, None),
        (1, veth1.as_str(), "mNicIf1", ip1, Some("10100")),
    ] {
        let gw = format!("169.254.1.{}", index + 1);
        ip_ns(
            &node_ns,
            &[
                "link", "add", veth, "type", "veth", "peer", "name", ifname, "netns", &pod_ns,
            ],
        );
        ip_ns(&node_ns, &["link", "set", veth, "up"]);
        ip_ns(&pod_ns, &["link", "set", ifname, "up"]);
        let pod_table = if index == 0 {
            "main".to_owned()
        } else {
            index.to_string()
        };
        ip_ns(
            &pod_ns,
            &[
                "route", "add", &gw, "dev", ifname, "scope", "link", "table", &pod_table,
            ],
        );
        if index > 0 {
            ip_ns(
                &pod_ns,
                &[
                    "rule",
                    "add",
                    "from",
                    &format!("{ip}/32"),
                    "lookup",
                    &pod_table,
                    "priority",
                    "1",
                ],
            );
        }
        ip_ns(
            &pod_ns,
            &[
                "route", "add", "default", "via", &gw, "dev", ifname, "table", &pod_table,
            ],
        );
        ip_ns(
            &pod_ns,
            &["addr", "add", &format!("{ip}/32"), "dev", ifname],
        );
        let j: serde_json::Value =
            serde_json::from_str(&ip_ns(&node_ns, &["-j", "link", "show", veth])).unwrap();
        let mac = j[0]["address"].as_str().unwrap().to_owned();
        ip_ns(
            &pod_ns,
            &[
                "neigh",
                "add",
                &gw,
                "lladdr",
                &mac,
                "dev",
                ifname,
                "nud",
                "permanent",
            ],
        );
        let ip = ip.to_string();
        ip_ns(
            &node_ns,
            &["route", "add", &ip, "dev", veth, "scope", "link"],
        );
        ip_ns(
            &node_ns,
            &[
                "rule", "add", "to", &ip, "lookup", "main", "priority", "512",
            ],
        );
        if let Some(t) = table {
            ip_ns(
                &node_ns,
                &["rule", "add", "from", &ip, "lookup", t, "priority", "1536"],
            );
        }
    }
    sim.start_ipamd(1, &[], Duration::from_secs(60))
        .expect("ipamd node 1");
    let other = sim.nodes[1].primary_ip.to_string();
    let ping_from = |src: Ipv4Addr| {
        let src = src.to_string();
        eventually(Duration::from_secs(15), || {
            let out = integration::sim::exec_in(
                &pod_ns,
                &["busybox", "ping", "-c", "1", "-W", "2", "-I", &src, &other],
            );
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ping from {src}: {}",
                    String::from_utf8_lossy(&out.stdout)
                ))
            }
        })
    };
    // upstream's wiring carries traffic on both interfaces before the swap
    ping_from(ip0).expect("eth0 before the swap");
    ping_from(ip1).expect("mNicIf1 before the swap");

    // The swap.
    sim.start_ipamd(
        0,
        &[
            ("ENABLE_MULTI_NIC", "true"),
            ("IPAMD_POOL_TICK_SECONDS", "1"),
        ],
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let assigned = eventually(Duration::from_secs(10), || {
        let a = sim.assigned(0)?;
        if a.get(&ip0).is_some_and(|(_, pod)| pod == "mnic-up")
            && a.get(&ip1)
                .is_some_and(|(eni, pod)| pod == "mnic-up" && *eni == card1)
        {
            Ok(a)
        } else {
            Err(format!("{a:?}\n{}", sim.ipamd_log_tail(0, 30)))
        }
    })
    .unwrap();
    let cp = multi_nic_checkpoint(&card1_file);
    let e = entry_of(&cp, &container).unwrap_or_else(|| panic!("{cp}"));
    assert_eq!(
        (
            e["ipv4"].as_str(),
            e["metadata"]["interfacesCount"].as_u64()
        ),
        (Some(ip1.to_string().as_str()), Some(2))
    );
    ping_from(ip0).expect("eth0 after the swap");
    ping_from(ip1).expect("mNicIf1 after the swap");

    // A new multi-NIC pod: other addresses on both cards.
    let mut target = PluginTarget::of(&sim, 0);
    let mut conf: serde_json::Value = serde_json::from_str(&target.netconf).unwrap();
    conf["runtimeConfig"] = serde_json::json!({
        "io.kubernetes.cri.pod-annotations": {"k8s.amazonaws.com/nicConfig": "multi-nic-attachment"}
    });
    target.netconf = conf.to_string();
    let new_ns = sim.new_pod_netns().unwrap();
    let new_sandbox = Sandbox {
        pod_name: "mnic-new",
        container_id: "mnicnew000000000000000001",
        netns: &new_ns,
    };
    let bin = integration::sim::Bins::beside_current_exe()
        .unwrap()
        .aws_cni;
    let result = eventually(Duration::from_secs(30), || {
        run_plugin(&bin, &target, "ADD", new_sandbox, None).map_err(|(c, o)| format!("{c}: {o}"))
    })
    .unwrap_or_else(|e| panic!("ADD: {e}\n{}", sim.ipamd_log_tail(0, 30)));
    let new_ips: Vec<String> = result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            i["address"]
                .as_str()
                .unwrap()
                .split('/')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(new_ips.len(), 2, "{result}");
    assert!(
        !new_ips.contains(&ip0.to_string()) && !new_ips.contains(&ip1.to_string()),
        "{new_ips:?} double-assigned"
    );
    assert!(assigned.len() >= 2);

    // DEL of the upstream pod through our plugin (the runtime's cache may be gone: no
    // prevResult): both interfaces and both addresses go.
    let up_sandbox = Sandbox {
        pod_name: "mnic-up",
        container_id: &container,
        netns: &pod_ns,
    };
    run_plugin(&bin, &target, "DEL", up_sandbox, None).unwrap_or_else(|e| panic!("DEL: {e:?}"));
    run_plugin(&bin, &target, "DEL", new_sandbox, Some(&result))
        .unwrap_or_else(|e| panic!("DEL new: {e:?}"));
    let a = sim.assigned(0).unwrap();
    assert!(!a.contains_key(&ip0) && !a.contains_key(&ip1), "{a:?}");
    assert!(entry_of(&multi_nic_checkpoint(&card1_file), &container).is_none());
    let rules = ip_ns(&node_ns, &["rule", "show"]);
    assert!(
        !rules.contains(&format!("{ip1} ")) && !rules.contains(&format!("{ip0} ")),
        "{rules}"
    );
    for v in [&veth0, &veth1] {
        assert!(
            !ip_ns(&node_ns, &["-o", "link", "show"]).contains(v.as_str()),
            "{v} left"
        );
    }
    integration::supervisor::delete_netns(&pod_ns);
    integration::supervisor::delete_netns(&new_ns);
}
