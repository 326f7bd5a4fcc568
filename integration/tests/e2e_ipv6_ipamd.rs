//! ipamd in upstream's IPv6 mode on the simulated VPC (root only): one dual-stack m5.large
//! node running the real `ipamd` (`ENABLE_IPv6=true`, `ENABLE_IPv4=false`,
//! `ENABLE_PREFIX_DELEGATION=true`, `WARM_PREFIX_TARGET=1` as the chart sets it) against vpcsim's
//! EC2 API and IMDS inside the node namespace, driven over its gRPC socket: the primary ENI gets
//! a /80 (AssignIpv6Addresses), pods get /128s inside it, no ENI or IPv4 address is added, the
//! host has no SNAT chain but the FORWARD reject of the egress range and the IPv6 fwmark rule;
//! a SIGKILL and restart keeps every pod's address (upstream's checkpoint shape), DEL releases.
//! The pod datapath across nodes is the 2-node IPv6 cluster suite's. The VPC goes on drop.
#![allow(clippy::tests_outside_test_module)]

use std::net::Ipv6Addr;
use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{Sim, SimConfig};
use ipamd_proto::rpc::{AddNetworkRequest, DelNetworkRequest};
use ipnet::Ipv6Net;

const READY: Duration = Duration::from_secs(60);

const V6_ENV: &[(&str, &str)] = &[
    ("ENABLE_IPv4", "false"),
    ("ENABLE_IPv6", "true"),
    ("ENABLE_PREFIX_DELEGATION", "true"),
    ("WARM_PREFIX_TARGET", "1"),
    ("IPAMD_POOL_TICK_SECONDS", "1"),
];

fn add_req(id: &str) -> AddNetworkRequest {
    AddNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        k8s_pod_name: format!("pod-{id}"),
        k8s_pod_namespace: "default".into(),
        container_id: id.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        netns: format!("/var/run/netns/{id}"),
        ..Default::default()
    }
}

fn del_req(id: &str) -> DelNetworkRequest {
    DelNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        k8s_pod_name: format!("pod-{id}"),
        k8s_pod_namespace: "default".into(),
        container_id: id.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        reason: ipamd_proto::del_reason::POD_DELETED.into(),
        ..Default::default()
    }
}

/// ADD over node 0's socket: the pod's IPv6 (and the reply's VPCv6CIDRs).
fn add(rt: &tokio::runtime::Runtime, sim: &Sim, id: &str) -> (Ipv6Addr, Vec<String>) {
    let socket = sim.nodes[0].socket();
    let reply = rt
        .block_on(async {
            let mut c = integration::fleet::connect(socket).await?;
            c.add_network(add_req(id))
                .await
                .map(tonic::Response::into_inner)
                .map_err(|e| e.to_string())
        })
        .unwrap_or_else(|e| panic!("ADD {id}: {e}\n{}", sim.ipamd_log_tail(0, 40)));
    assert!(
        reply.success,
        "ADD {id} refused\n{}",
        sim.ipamd_log_tail(0, 40)
    );
    let [m] = reply.ip_allocation_metadata.as_slice() else {
        panic!("ADD {id}: one allocation expected: {reply:?}");
    };
    assert!(
        m.i_pv4_addr.is_empty(),
        "IPv6 mode hands out no IPv4: {m:?}"
    );
    assert_eq!((m.device_number, m.route_table_id), (0, 254), "{m:?}");
    let ip: Ipv6Addr = m
        .i_pv6_addr
        .parse()
        .unwrap_or_else(|_| panic!("IPv6Addr is a bare address: {m:?}"));
    (ip, reply.vp_cv6_cid_rs)
}

fn del(rt: &tokio::runtime::Runtime, sim: &Sim, id: &str) -> Result<Ipv6Addr, String> {
    let socket = sim.nodes[0].socket();
    rt.block_on(async {
        let mut c = integration::fleet::connect(socket).await?;
        let r = c
            .del_network(del_req(id))
            .await
            .map_err(|e| format!("{:?}: {}", e.code(), e.message()))?
            .into_inner();
        r.ip_allocation_metadata
            .first()
            .and_then(|m| m.i_pv6_addr.parse().ok())
            .ok_or_else(|| format!("DEL {id}: no IPv6 in {r:?}"))
    })
}

/// The checkpoint's `ipv6` entries by container id (upstream's `vpc-cni-ipam/1` shape).
fn checkpoint_v6(sim: &Sim) -> Vec<(String, Ipv6Addr)> {
    let text = std::fs::read_to_string(sim.nodes[0].checkpoint()).expect("checkpoint");
    let v: serde_json::Value = serde_json::from_str(&text).expect("checkpoint JSON");
    assert_eq!(v["version"], "vpc-cni-ipam/1");
    let mut out: Vec<(String, Ipv6Addr)> = v["allocations"]
        .as_array()
        .expect("allocations")
        .iter()
        .map(|a| {
            assert!(a.get("ipv4").is_none(), "no ipv4 in IPv6 mode: {a}");
            (
                a["containerID"].as_str().unwrap_or_default().to_owned(),
                a["ipv6"]
                    .as_str()
                    .unwrap_or_default()
                    .parse()
                    .expect("ipv6"),
            )
        })
        .collect();
    out.sort();
    out
}

/// (ENI count, IPv4 secondaries + prefixes, IPv6 prefixes) of the node in EC2.
fn ec2_of(sim: &Sim) -> (usize, usize, Vec<Ipv6Net>) {
    let id = sim.nodes[0].instance_id.clone();
    sim.world.read(|s| {
        let enis: Vec<_> = s
            .enis
            .values()
            .filter(|e| e.attachment.as_ref().is_some_and(|a| a.instance_id == id))
            .collect();
        let v4 = enis
            .iter()
            .map(|e| e.private_ips.len() - 1 + e.ipv4_prefixes.len())
            .sum();
        let v6 = enis
            .iter()
            .flat_map(|e| e.ipv6_prefixes.iter().copied())
            .collect();
        (enis.len(), v4, v6)
    })
}

fn node_cmd(sim: &Sim, program: &str, args: &[&str]) -> String {
    let out = integration::supervisor::netns_exec(&sim.nodes[0].netns, program)
        .args(args)
        .output()
        .expect("run in node");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn ipamd_ipv6_mode_on_the_simulated_vpc() {
    if !can_run_kernel_tests() {
        eprintln!("skipped: needs root");
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        ipv6: true,
        ..SimConfig::default()
    })
    .expect("sim");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert!(ec2_of(&sim).2.is_empty(), "no /80 before ipamd");
    sim.start_ipamd(0, V6_ENV, READY)
        .unwrap_or_else(|e| panic!("{e}"));

    // node init delegated exactly one /80 to the primary ENI
    let (enis, v4, prefixes) = ec2_of(&sim);
    let [prefix] = prefixes.as_slice() else {
        panic!("one /80 expected: {prefixes:?}");
    };
    assert_eq!(prefix.prefix_len(), 80);
    let vpc_v6 = sim.world.read(|s| s.vpc.ipv6_cidr).expect("VPC IPv6 CIDR");

    let ids = ["a", "b", "c"];
    let mut got = Vec::new();
    for id in ids {
        let (ip, vpc) = add(&rt, &sim, id);
        assert!(prefix.contains(&ip), "{ip} not in {prefix}");
        assert_eq!(vpc, vec![vpc_v6.to_string()], "VPCv6CIDRs");
        got.push((id.to_owned(), ip));
    }
    let distinct: std::collections::BTreeSet<_> = got.iter().map(|(_, ip)| *ip).collect();
    assert_eq!(distinct.len(), 3, "{got:?}");
    // a retried ADD gets the same address
    assert_eq!(add(&rt, &sim, "a").0, got[0].1);
    assert_eq!(checkpoint_v6(&sim), got);

    // no warm pool: after several pool ticks, no ENI and no IPv4 address was added
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        ec2_of(&sim),
        (enis, v4, prefixes.clone()),
        "IPv6 mode grows nothing"
    );
    assert_eq!(enis, 1);

    // host: no SNAT chain; upstream's FORWARD reject of egress-cni's IPv4 range; rule 1024 in v6
    let nat = node_cmd(&sim, "iptables", &["-t", "nat", "-S"]);
    assert!(!nat.contains("AWS-SNAT-CHAIN"), "{nat}");
    let fwd = node_cmd(&sim, "iptables", &["-t", "filter", "-S", "FORWARD"]);
    let reject = fwd
        .lines()
        .find(|l| l.contains("Block Node Local Pod access via IPv4"))
        .unwrap_or_else(|| panic!("no FORWARD reject: {fwd}"));
    assert!(
        reject.contains("169.254.172.0/22") && reject.contains("REJECT"),
        "{reject}"
    );
    let rules6 = node_cmd(&sim, "ip", &["-6", "rule", "show", "pref", "1024"]);
    assert!(rules6.contains("fwmark 0x80/0x80"), "{rules6}");

    // SIGKILL and restart: every pod keeps its address; the rule is not duplicated
    sim.restart_ipamd(0, true, READY)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(checkpoint_v6(&sim), got, "restart keeps the checkpoint");
    for (id, ip) in &got {
        assert_eq!(add(&rt, &sim, id).0, *ip, "{id} keeps its address");
    }
    assert_eq!(ec2_of(&sim).2, prefixes, "the same /80 after the restart");
    let (d, _) = add(&rt, &sim, "d");
    assert!(prefix.contains(&d) && !distinct.contains(&d), "{d}");
    let fwd = node_cmd(&sim, "iptables", &["-t", "filter", "-S", "FORWARD"]);
    assert_eq!(
        fwd.matches("Block Node Local Pod access via IPv4").count(),
        1,
        "{fwd}"
    );

    // introspection shows the pods' addresses
    let enis_json = sim.introspect(0, "/v1/enis").expect("introspection");
    let text = enis_json.to_string();
    assert!(text.contains(&got[0].1.to_string()), "{text}");

    // DEL releases each address once
    for (id, ip) in got.iter().chain(std::iter::once(&("d".to_owned(), d))) {
        assert_eq!(del(&rt, &sim, id).as_ref(), Ok(ip), "DEL {id}");
        let again = del(&rt, &sim, id).unwrap_err();
        assert!(again.contains("unknown pod"), "second DEL {id}: {again}");
    }
    assert!(checkpoint_v6(&sim).is_empty());
    let leftovers = sim.shutdown();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
