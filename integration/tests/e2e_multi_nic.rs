//! Multi-NIC pods end to end on the simulated VPC (root only; issue 26 item 2): two
//! `c6in.32xlarge` nodes (two network cards each, upstream `vpc_ip_resource_limit.go`), the real
//! `ipamd` with `ENABLE_MULTI_NIC=true` on node 0 and the real `aws-cni`, wired as upstream
//! v1.23.1 does it:
//! - ipamd attaches an ENI on network card 1 itself (upstream `tryAllocateENI(ctx,
//!   networkCard)` → `attachENI` with `NetworkCardIndex`, device 0 of that card), sets up its
//!   route table 10100 (`networkutils.CalculateRouteTableId`) and writes card 1's checkpoint
//!   `ipam-nic-1.json` beside `ipam.json` (`datastore.InitializeDataStores`);
//! - a pod annotated `k8s.amazonaws.com/nicConfig: multi-nic-attachment` gets one interface per
//!   card (`cni.go` `add`, `driver.SetupPodNetwork`): `eth0` and `mNicIf1`, and each one
//!   carries traffic through its own card's ENI to the other node;
//! - CHECK passes; DEL (with prevResult, then again without netns) removes everything and
//!   frees both addresses; a pod without the annotation gets one interface;
#![allow(clippy::tests_outside_test_module)]

use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{PluginTarget, Sandbox, Sim, SimConfig, eventually, exec_in, run_plugin};

const READY: Duration = Duration::from_secs(60);

fn aws_cni() -> std::path::PathBuf {
    integration::sim::Bins::beside_current_exe()
        .expect("binaries built")
        .aws_cni
}

fn ip_in(netns: &str, args: &[&str]) -> String {
    let mut full = vec!["ip", "-n", netns];
    full.extend_from_slice(args);
    let out = std::process::Command::new(full[0])
        .args(&full[1..])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn card1_checkpoint(sim: &Sim) -> serde_json::Value {
    let path = sim.nodes[0].dir.join("ipam-nic-1.json");
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_default())
        .unwrap_or(serde_json::Value::Null)
}

#[test]
fn a_multi_nic_pod_has_one_working_interface_per_card_and_del_cleans_everything() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 2,
        instance_type: "c6in.32xlarge".into(),
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    let env = [
        ("ENABLE_MULTI_NIC", "true"),
        ("IPAMD_POOL_TICK_SECONDS", "1"),
    ];
    sim.start_ipamd(0, &env, READY).expect("ipamd node 0");
    sim.start_ipamd(1, &[("IPAMD_POOL_TICK_SECONDS", "1")], READY)
        .expect("ipamd node 1");
    let bin = aws_cni();
    let target = PluginTarget::multi_nic(&sim, 0);

    // ipamd attaches an ENI on card 1 by itself (its pool keeps one warm address there).
    let card1_eni = eventually(Duration::from_secs(30), || {
        sim.world.read(|s| {
            let inst = &sim.nodes[0].instance_id;
            s.enis_of(inst)
                .into_iter()
                .find_map(|e| {
                    let a = e.attachment.as_ref()?;
                    (a.network_card_index == 1).then(|| (e.id.clone(), a.device_index))
                })
                .ok_or_else(|| "no ENI on network card 1 yet".to_owned())
        })
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    assert_eq!(card1_eni.1, 0, "device indexes restart at 0 on every card");
    let node_ns = sim.nodes[0].netns.clone();
    // its route table, 10000 + 100 × card + device
    eventually(Duration::from_secs(20), || {
        let t = ip_in(&node_ns, &["route", "show", "table", "10100"]);
        if t.contains("default via") {
            Ok(())
        } else {
            Err(format!("table 10100: {t}"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));

    // The annotated pod: one interface per card.
    let netns = sim.new_pod_netns().unwrap();
    let container_id = "multinic0000000000000001";
    let sandbox = Sandbox {
        pod_name: "multi",
        container_id,
        netns: &netns,
    };
    let result = eventually(Duration::from_secs(30), || {
        run_plugin(&bin, &target, "ADD", sandbox, None).map_err(|(c, o)| format!("{c}: {o}"))
    })
    .unwrap_or_else(|e| panic!("ADD: {e}\n{}", sim.ipamd_log_tail(0, 40)));
    let names: Vec<&str> = result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 5, "{result}");
    assert_eq!((names[1], names[3]), ("eth0", "mNicIf1"), "{result}");
    assert!(names[4].starts_with("dummy"));
    let ips: Vec<(String, u64)> = result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["address"]
                    .as_str()
                    .unwrap()
                    .split('/')
                    .next()
                    .unwrap()
                    .to_owned(),
                i["interface"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ips.len(), 2, "{result}");
    assert_eq!((ips[0].1, ips[1].1), (1, 3));
    let (ip0, ip1) = (ips[0].0.clone(), ips[1].0.clone());
    // ip1 is an address of the card-1 ENI in EC2
    let on_card1 = sim.world.read(|s| {
        s.eni(&card1_eni.0)
            .map(|e| e.private_ips.iter().any(|p| p.to_string() == ip1))
            .unwrap_or(false)
    });
    assert!(on_card1, "{ip1} is not on {}", card1_eni.0);
    // in the pod: mNicIf1 routes through its own table 1 (rule at priority 1)
    let rules = ip_in(&netns, &["rule", "show"]);
    assert!(
        rules.contains(&format!("1:\tfrom {ip1} lookup 1")),
        "pod rules: {rules}"
    );
    assert!(
        ip_in(&netns, &["route", "show", "table", "1"])
            .contains("default via 169.254.1.2 dev mNicIf1")
    );
    // on the node: the card-1 address leaves through table 10100
    let host_rules = ip_in(&node_ns, &["rule", "show"]);
    assert!(
        host_rules.contains(&format!("from {ip1} lookup 10100")),
        "{host_rules}"
    );
    // each interface carries traffic to the other node, through its own card's ENI
    let other = sim.nodes[1].primary_ip.to_string();
    // (the card-1 ENI is the node's `eth100`: the fabric names a card-N ENI eth<100N+device>)
    let tx_card1 = || -> u64 {
        let j: serde_json::Value =
            serde_json::from_str(&ip_in(&node_ns, &["-j", "-s", "link", "show", "eth100"]))
                .unwrap_or_default();
        j[0]["stats64"]["tx"]["packets"].as_u64().unwrap_or(0)
    };
    let before = tx_card1();
    for src in [&ip0, &ip1] {
        eventually(Duration::from_secs(15), || {
            let out = exec_in(
                &netns,
                &["busybox", "ping", "-c", "1", "-W", "2", "-I", src, &other],
            );
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ping from {src}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ))
            }
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(
        tx_card1() > before,
        "the card-1 interface's traffic did not leave through the card-1 ENI"
    );
    // card 1's checkpoint holds the pod, upstream's interfacesCount = 2
    let cp = card1_checkpoint(&sim);
    let entry = cp["allocations"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["containerID"] == container_id))
        .cloned()
        .unwrap_or_else(|| panic!("card 1 checkpoint: {cp}"));
    assert_eq!(entry["ipv4"], ip1.as_str());
    assert_eq!(entry["metadata"]["interfacesCount"], 2);

    // CHECK passes on both interfaces
    run_plugin(&bin, &target, "CHECK", sandbox, Some(&result))
        .unwrap_or_else(|e| panic!("CHECK: {e:?}"));

    // Pod `multi.1` computes the host veth name of `multi`'s interface 1 (upstream hashes
    // `<ns>.<pod>.<index>`): its ADD is refused with a clear error, and `multi`'s interface 1
    // keeps its link and its traffic (issue 38: ADD deleted whatever link had the name).
    let other_netns = sim.new_pod_netns().unwrap();
    let refused = run_plugin(
        &bin,
        &PluginTarget::of(&sim, 0),
        "ADD",
        Sandbox {
            pod_name: "multi.1",
            container_id: "multidot1000000000000001",
            netns: &other_netns,
        },
        None,
    );
    let (code, out) = refused.expect_err("ADD of pod multi.1 refused");
    assert_ne!(code, 0);
    assert!(
        out.contains("is in use") && out.contains("multi's interface 1"),
        "{out}"
    );
    assert!(
        ip_in(&netns, &["link", "show", "mNicIf1"]).contains("mNicIf1"),
        "multi's interface 1 is still there"
    );
    let out = exec_in(
        &netns,
        &["busybox", "ping", "-c", "1", "-W", "2", "-I", &ip1, &other],
    );
    assert!(
        out.status.success(),
        "multi's interface 1 still carries traffic"
    );
    integration::supervisor::delete_netns(&other_netns);

    // A pod without the annotation: one interface, nothing from card 1.
    let plain = sim.add_pod(0, "plain").expect("plain pod");
    assert_eq!(plain.result["interfaces"].as_array().unwrap().len(), 3);

    // DEL with prevResult, then again without netns: everything goes, both addresses freed
    run_plugin(&bin, &target, "DEL", sandbox, Some(&result))
        .unwrap_or_else(|e| panic!("DEL: {e:?}"));
    // kubelet's retried DEL once the sandbox is gone: empty CNI_NETNS, no prevResult
    let mut call = integration::cni::CniCall::for_sandbox(
        "DEL",
        container_id,
        "multi",
        std::path::PathBuf::new(),
        target.netconf.clone(),
    );
    call.netns = None;
    let out = integration::cni::exec_plugin(
        integration::supervisor::netns_exec(&node_ns, &bin),
        &call,
        &[("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")],
    )
    .unwrap();
    assert_eq!(out.code, 0, "second DEL: {}{}", out.stdout, out.stderr);
    sim.del_pod(&plain).expect("DEL plain");
    integration::supervisor::delete_netns(&netns);
    let left = sim.pod_leftovers(0);
    assert!(left.is_empty(), "left on the node: {left:?}");
    let cp = card1_checkpoint(&sim);
    assert!(
        !cp["allocations"]
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["containerID"] == container_id)),
        "{cp}"
    );
    assert!(!ip_in(&node_ns, &["rule", "show"]).contains(&ip1));
}

/// upstream `AddNetwork` (v1.23.1): a pod without the multi-NIC annotation whose card 0 has no
/// free address gets one of the next card (`ErrNoAvailableIPInDataStore` → `continue`). Card 0
/// capped at two addresses (`IPAMD_MAX_PODS=2`, `MINIMUM_IP_TARGET=2`): the third plain pod's address is card 1's,
/// wired through card 1's ENI (its `from` rule looks up table 10100) and reaching node 1; its
/// DEL frees it in card 1's checkpoint and leaves nothing on the host.
#[test]
fn a_pod_without_the_annotation_uses_card_1_when_card_0_has_no_address() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 2,
        instance_type: "c6in.32xlarge".into(),
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    let env = [
        ("ENABLE_MULTI_NIC", "true"),
        ("IPAMD_POOL_TICK_SECONDS", "1"),
        ("IPAMD_MAX_PODS", "2"),
        ("WARM_IP_TARGET", "1"),
        ("MINIMUM_IP_TARGET", "2"),
        ("IPAMD_ADD_WAIT_TIMEOUT", "2"),
    ];
    sim.start_ipamd(0, &env, READY).expect("ipamd node 0");
    let card1_eni = eventually(Duration::from_secs(30), || {
        sim.world.read(|s| {
            s.enis_of(&sim.nodes[0].instance_id)
                .into_iter()
                .find_map(|e| {
                    let a = e.attachment.as_ref()?;
                    (a.network_card_index == 1 && e.private_ips.len() > 1).then(|| e.id.clone())
                })
                .ok_or_else(|| "no ENI with an address on network card 1 yet".to_owned())
        })
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    // card 0's pool at its cap (two addresses on the primary ENI) before the pods come: a
    // pod finding card 0 empty for a moment takes card 1's, as upstream's
    let card0_addresses = |sim: &Sim| {
        sim.world.read(|s| {
            s.enis_of(&sim.nodes[0].instance_id)
                .into_iter()
                .find(|e| {
                    e.attachment
                        .as_ref()
                        .is_some_and(|a| a.network_card_index == 0 && a.device_index == 0)
                })
                .map_or(0, |e| e.private_ips.len() - 1)
        })
    };
    eventually(Duration::from_secs(20), || match card0_addresses(&sim) {
        2 => Ok(()),
        n => Err(format!("{n} addresses on card 0")),
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}
{}",
            sim.ipamd_log_tail(0, 40)
        )
    });
    let p0 = sim.add_pod(0, "plain-0").expect("plain-0");
    let p1 = sim.add_pod(0, "plain-1").expect("plain-1");
    for p in [&p0, &p1] {
        assert_ne!(sim.eni_of(0, p.ip), Some(card1_eni.clone()), "card 0 first");
    }
    let p2 = sim
        .add_pod(0, "plain-2")
        .unwrap_or_else(|e| panic!("ADD plain-2: {e}\n{}", sim.ipamd_log_tail(0, 40)));
    assert_eq!(
        sim.eni_of(0, p2.ip),
        Some(card1_eni.clone()),
        "card 0 is full: card 1's address"
    );
    assert_eq!(
        p2.result["interfaces"].as_array().unwrap().len(),
        3,
        "one interface"
    );
    let node_ns = sim.nodes[0].netns.clone();
    let rules = ip_in(&node_ns, &["rule", "show"]);
    assert!(
        rules.contains(&format!("from {} lookup 10100", p2.ip)),
        "the pod's traffic leaves by card 1's ENI: {rules}"
    );
    assert!(
        card1_checkpoint(&sim)
            .to_string()
            .contains(&p2.ip.to_string()),
        "card 1's checkpoint holds it"
    );
    let peer = sim.nodes[1].primary_ip;
    eventually(Duration::from_secs(10), || {
        integration::sim::ping(&p2.netns, peer)
    })
    .expect("the pod reaches node 1 through card 1's ENI");
    sim.del_pod(&p2).expect("DEL plain-2");
    assert!(
        !card1_checkpoint(&sim)
            .to_string()
            .contains(&p2.ip.to_string()),
        "freed on card 1"
    );
    let rules = ip_in(&node_ns, &["rule", "show"]);
    assert!(!rules.contains(&p2.ip.to_string()), "{rules}");
}

/// upstream `getRouteTableNumberForENI` (v1.23.1 `networkutils`): on an AMI that configures
/// every interface itself (AL2023's `amazon-ec2-net-utils`: `from <its address> lookup <table>`),
/// a card-1 ENI keeps the OS's table: its routes go there, its pods' rules look it up, and no
/// second rule from its address is added. The card-1 ENI is attached before ipamd starts and
/// the "OS" rule put on the node as such an AMI would.
#[test]
fn a_card_1_eni_the_os_already_routes_keeps_the_os_table() {
    if !can_run_kernel_tests() {
        return;
    }
    const OS_TABLE: &str = "10001";
    let mut sim = Sim::start(&SimConfig {
        nodes: 2,
        instance_type: "c6in.32xlarge".into(),
        ..SimConfig::default()
    })
    .expect("simulated VPC");
    let node = sim.nodes[0].instance_id.clone();
    let (eni_id, eni_ip) = sim
        .world
        .mutate(|s, now| {
            let subnet = s.instances[&node].subnet_id.clone();
            let id = s.create_eni(vpcsim::state::CreateEni {
                subnet_id: subnet,
                description: "configured by the AMI".into(),
                secondary_count: 2,
                ..vpcsim::state::CreateEni::default()
            })?;
            s.attach_eni_on_card(&id, &node, 0, 1, now)?;
            let ip = s.eni(&id)?.primary_ip();
            Ok((id, ip))
        })
        .expect("a card-1 ENI");
    let node_ns = sim.nodes[0].netns.clone();
    eventually(Duration::from_secs(20), || {
        let l = ip_in(&node_ns, &["link", "show", "eth100"]);
        if l.contains("eth100") {
            Ok(())
        } else {
            Err("no eth100 yet".to_owned())
        }
    })
    .expect("the card-1 ENI's link");
    let os_rule = exec_in(
        &node_ns,
        &[
            "ip",
            "rule",
            "add",
            "from",
            &format!("{eni_ip}/32"),
            "lookup",
            OS_TABLE,
            "priority",
            OS_TABLE,
        ],
    );
    assert!(os_rule.status.success(), "{os_rule:?}");
    sim.start_ipamd(
        0,
        &[
            ("ENABLE_MULTI_NIC", "true"),
            ("IPAMD_POOL_TICK_SECONDS", "1"),
        ],
        READY,
    )
    .expect("ipamd node 0");

    let bin = aws_cni();
    let target = PluginTarget::multi_nic(&sim, 0);
    let netns = sim.new_pod_netns().unwrap();
    let sandbox = Sandbox {
        pod_name: "multi-os",
        container_id: "multinicos00000000000001",
        netns: &netns,
    };
    let result = eventually(Duration::from_secs(30), || {
        run_plugin(&bin, &target, "ADD", sandbox, None).map_err(|(c, o)| format!("{c}: {o}"))
    })
    .unwrap_or_else(|e| panic!("ADD: {e}\n{}", sim.ipamd_log_tail(0, 40)));
    let ip1 = result["ips"][1]["address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .expect("the card-1 address")
        .to_owned();
    let on_eni = sim.world.read(|s| {
        s.eni(&eni_id)
            .map(|e| e.private_ips.iter().any(|p| p.to_string() == ip1))
            .unwrap_or(false)
    });
    assert!(on_eni, "{ip1} is on the pre-attached card-1 ENI");
    let host_rules = ip_in(&node_ns, &["rule", "show"]);
    assert!(
        host_rules.contains(&format!("from {ip1} lookup {OS_TABLE}")),
        "the pod's card-1 address leaves by the OS's table: {host_rules}"
    );
    assert!(!host_rules.contains("lookup 10100"), "{host_rules}");
    assert_eq!(
        host_rules.matches(&format!("from {eni_ip} lookup")).count(),
        1,
        "no second rule from the ENI's address: {host_rules}"
    );
    assert!(
        ip_in(&node_ns, &["route", "show", "table", OS_TABLE]).contains("default via"),
        "the ENI's default route in the OS's table"
    );
    let other = sim.nodes[1].primary_ip.to_string();
    eventually(Duration::from_secs(15), || {
        let out = exec_in(
            &netns,
            &["busybox", "ping", "-c", "1", "-W", "2", "-I", &ip1, &other],
        );
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stdout).into_owned())
        }
    })
    .unwrap_or_else(|e| panic!("ping from {ip1}: {e}"));
    run_plugin(&bin, &target, "DEL", sandbox, Some(&result))
        .unwrap_or_else(|e| panic!("DEL: {e:?}"));
    let host_rules = ip_in(&node_ns, &["rule", "show"]);
    assert!(!host_rules.contains(&ip1), "{host_rules}");
    assert!(
        host_rules.contains(&format!("from {eni_ip} lookup {OS_TABLE}")),
        "the OS's rule stays: {host_rules}"
    );
    integration::supervisor::delete_netns(&netns);
}
