//! Custom networking end to end (root only): a two-zone simulated VPC with a secondary
//! 100.64.0.0/16 block, the Kubernetes API simulator with the chart's CRDs and RBAC (rendered by
//! real Helm, enforced on every request), one ENIConfig per zone selected by
//! `topology.kubernetes.io/zone`, and the real `ipamd` in each node's namespace talking to the
//! API through the fabric's relay with the aws-node service account.
//!
//! - Every pod's address comes from its zone's ENIConfig subnet in the secondary block, on a
//!   secondary ENI carrying that ENIConfig's security groups; the primary ENI holds none; pods
//!   reach each other across nodes and the internet host (whose gateway passes only primary
//!   addresses, so that proves SNAT to the node's primary IP).
//! - Relabel a node to another ENIConfig: the next ENI is created in its subnet.
//! - Delete an ENIConfig: an Event and a metric appear, existing pods keep working, ipamd serves.
//! - The API server away at start, for two minutes, and dropping watches: without custom
//!   networking ipamd serves within 30 s; with it, it waits and converges once the API returns;
//!   nothing crash-loops, no pod loses its address.
//! - Warm targets from the node's ENIConfig's annotations, under the node's own: followed live,
//!   a bad value refused on its level alone (ours, issue 41).
//! - The chart's ClusterRole without `list` on ENIConfigs: the same start no longer converges
//!   (the simulator answers 403), which is what makes the RBAC part of this test meaningful.
//!   (Without `watch` alone a client still converges: kube-rs's watcher falls back to relisting.)
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use integration::can_run_kernel_tests;
use integration::sim::{
    INTERNET_HOST, KubeOptions, METRICS, Pod, Sim, SimConfig, eventually, ping,
};
use ipnet::Ipv4Net;
use kubesim::Outage;
use serde_json::json;

const READY: Duration = Duration::from_secs(90);
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

fn config(kube: KubeOptions) -> SimConfig {
    SimConfig {
        layout: vpcsim::Layout {
            azs: 2,
            subnets_per_az: 2,
            secondary_cidr: Some("100.64.0.0/16".parse().unwrap()),
        },
        kube: Some(kube),
        ..SimConfig::default()
    }
}

/// ipamd's environment for custom networking; `warm_ips` keeps one ENI until pods need more.
fn cn_env(warm_ips: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("IPAMD_POOL_TICK_SECONDS", "1"),
        ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true"),
        ("ENI_CONFIG_LABEL_DEF", ZONE_LABEL),
        ("WARM_IP_TARGET", warm_ips),
    ]
}

/// The id of security group `name` in the world.
fn sg(sim: &Sim, name: &str) -> String {
    sim.world.read(|s| {
        s.security_groups
            .values()
            .find(|g| g.name == name)
            .map(|g| g.id.clone())
            .unwrap_or_else(|| panic!("no security group {name}"))
    })
}

/// Node `i`'s primary ENI (device index 0).
fn primary_eni(sim: &Sim, i: usize) -> String {
    let id = sim.nodes[i].instance_id.clone();
    sim.world.read(|s| {
        s.enis
            .values()
            .find(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == id && a.device_index == 0)
            })
            .map(|e| e.id.clone())
            .expect("primary ENI")
    })
}

/// (subnet id, CIDR) of zone `zone`'s subnet in the secondary block, and of its second
/// primary-block subnet.
fn zone_subnets(sim: &Sim, zone: &str) -> ((String, Ipv4Net), (String, Ipv4Net)) {
    let all = sim.subnets_in_zone(zone);
    let secondary = all
        .iter()
        .find(|(_, c)| c.to_string().starts_with("100.64."))
        .cloned()
        .expect("a 100.64 subnet in the zone");
    let primary_block: Vec<_> = all
        .iter()
        .filter(|(_, c)| !c.to_string().starts_with("100.64."))
        .cloned()
        .collect();
    (secondary, primary_block[1].clone())
}

fn add_pods(sim: &mut Sim, node: usize, n: usize, tag: &str) -> Vec<Pod> {
    (0..n)
        .map(|k| {
            let name = format!("{tag}-{node}-{k}");
            sim.add_pod(node, &name)
                .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", sim.ipamd_log_tail(node, 40)))
        })
        .collect()
}

/// Where node `i`'s pod address lives: (ENI id, its subnet, its security groups).
fn placement(sim: &Sim, i: usize, ip: Ipv4Addr) -> (String, String, Vec<String>) {
    let eni = sim
        .eni_of(i, ip)
        .unwrap_or_else(|| panic!("{ip} is on no ENI of node {i}"));
    let (subnet, _zone, groups) = sim.eni_placement(&eni).expect("ENI in the world");
    (eni, subnet, groups)
}

/// Sum of one metric family in node `i`'s `/metrics` (every label set).
fn metric(sim: &Sim, i: usize, family: &str) -> f64 {
    sim.http_get(i, METRICS, "/metrics")
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(family))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

fn api(sim: &Sim) -> &kubesim::KubeSim {
    &sim.kube().expect("kube on").api
}

fn eni_config_name(sim: &Sim, i: usize) -> Option<String> {
    sim.introspect(i, "/v1/eni-configs")
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
}

#[test]
fn pods_land_in_their_zones_eniconfig_subnet_and_follow_relabels() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&config(KubeOptions::default())).expect("two-zone VPC with kube");
    let pods_sg = sg(&sim, "pods");
    let zones = [sim.node_zone(0), sim.node_zone(1)];
    assert_ne!(zones[0], zones[1]);
    let mut cn_subnet = Vec::new();
    for zone in &zones {
        let ((id, cidr), _) = zone_subnets(&sim, zone);
        sim.apply_eniconfig(zone, &id, std::slice::from_ref(&pods_sg))
            .unwrap();
        cn_subnet.push((id, cidr));
    }
    for (i, zone) in zones.iter().enumerate() {
        sim.start_ipamd(i, &cn_env("2"), READY)
            .unwrap_or_else(|e| panic!("ipamd {i}: {e}"));
        assert_eq!(eni_config_name(&sim, i).as_deref(), Some(zone.as_str()));
        // custom networking waits for the API server: start-up is labelled as upstream's is
        let text = sim.http_get(i, METRICS, "/metrics").unwrap_or_default();
        assert!(
            text.contains(
                "awscni_ipamd_startup_duration_seconds_count{failure_reason=\"\",success=\"true\",with_api_server=\"true\"} 1"
            ),
            "node {i}: start-up not recorded with the API server"
        );
    }

    // 6 pods per node: from the zone's ENIConfig subnet, on a secondary ENI with its groups
    let pods: Vec<Vec<Pod>> = (0..2).map(|i| add_pods(&mut sim, i, 6, "cn")).collect();
    for i in 0..2 {
        let primary = primary_eni(&sim, i);
        for p in &pods[i] {
            assert!(
                cn_subnet[i].1.contains(&p.ip),
                "{} {} not in {}",
                p.name,
                p.ip,
                cn_subnet[i].1
            );
            let (eni, subnet, groups) = placement(&sim, i, p.ip);
            assert_ne!(eni, primary, "{} is on the primary ENI", p.name);
            assert_eq!(subnet, cn_subnet[i].0, "{}", p.name);
            assert_eq!(groups, vec![pods_sg.clone()], "{}", p.name);
        }
        // the primary ENI holds no pod address (ipamd's own view)
        let held = sim.assigned(i).unwrap();
        assert!(
            held.values().all(|(eni, _)| *eni != primary),
            "node {i}: {held:?}"
        );
    }
    // across nodes (and zones), and to the internet through SNAT to the node's primary IP
    eventually(Duration::from_secs(10), || {
        ping(&pods[0][0].netns, pods[1][0].ip)
    })
    .expect("pod -> pod across zones");
    ping(&pods[1][1].netns, pods[0][1].ip).expect("pod -> pod, other way");
    for node_pods in &pods {
        ping(&node_pods[2].netns, INTERNET_HOST).expect("pod -> internet via SNAT");
    }
    sim.check_addresses().expect("addresses consistent");

    // relabel node 0 to another ENIConfig (the external label wins over the zone label): the
    // ENI created for the next pods is in that ENIConfig's subnet, with its groups
    let (_, (alt_subnet, alt_cidr)) = zone_subnets(&sim, &zones[0]);
    let default_sg = sg(&sim, "default");
    sim.apply_eniconfig("alt", &alt_subnet, std::slice::from_ref(&default_sg))
        .unwrap();
    sim.label_node(0, "vpc.amazonaws.com/externalEniConfig", Some("alt"))
        .unwrap();
    eventually(Duration::from_secs(20), || {
        match eni_config_name(&sim, 0).as_deref() {
            Some("alt") => Ok(()),
            other => Err(format!("/v1/eni-configs says {other:?}")),
        }
    })
    .expect("ipamd sees the relabel");
    let before: BTreeSet<String> = pods[0].iter().map(|p| placement(&sim, 0, p.ip).0).collect();
    let more = add_pods(&mut sim, 0, 8, "alt");
    let on_new: Vec<&Pod> = more
        .iter()
        .filter(|p| !before.contains(&placement(&sim, 0, p.ip).0))
        .collect();
    assert!(!on_new.is_empty(), "no new ENI was needed");
    for p in on_new {
        let (_, subnet, groups) = placement(&sim, 0, p.ip);
        assert_eq!(subnet, alt_subnet, "{} {}", p.name, p.ip);
        assert!(alt_cidr.contains(&p.ip));
        assert_eq!(groups, vec![default_sg.clone()]);
    }

    // delete node 1's ENIConfig: an Event and a metric; existing pods keep working, and once
    // its ENI is full no ENI is created anywhere else
    let errors_before = metric(&sim, 1, "awscni_eniconfig_error_count");
    sim.kube_delete(
        "crd.k8s.amazonaws.com/v1alpha1",
        "ENIConfig",
        None,
        &zones[1],
    )
    .unwrap();
    let enis_before = sim.ec2_enis(1).len();
    // pods up to the first ENI's capacity still come from it; beyond, ipamd cannot grow
    let extra: Vec<Pod> = (0..4)
        .filter_map(|k| sim.add_pod(1, &format!("nocfg-{k}")).ok())
        .collect();
    eventually(Duration::from_secs(30), || {
        let now = metric(&sim, 1, "awscni_eniconfig_error_count");
        if now > errors_before {
            Ok(())
        } else {
            Err(format!("awscni_eniconfig_error_count still {now}"))
        }
    })
    .expect("metric");
    let events = sim.kube_events(None).unwrap();
    let pod_name = sim.kube().unwrap().pod_name(1).to_owned();
    assert!(
        events.iter().any(|e| e["reason"] == "ENIConfigNotUsable"
            && (e["regarding"]["name"] == pod_name.as_str()
                || e["involvedObject"]["name"] == pod_name.as_str())),
        "no ENIConfigNotUsable event on {pod_name}: {events:#?}"
    );
    assert_eq!(
        sim.ec2_enis(1).len(),
        enis_before,
        "an ENI was created without an ENIConfig"
    );
    for p in &extra {
        assert!(cn_subnet[1].1.contains(&p.ip), "{} {}", p.name, p.ip);
    }
    ping(&pods[1][3].netns, pods[0][3].ip).expect("existing pods keep working");
    sim.introspect(1, "/v1/enis").expect("ipamd still serves");
    sim.check_addresses().expect("addresses consistent");
    // the aws-node identity needed nothing beyond the chart's ClusterRole
    let denied: Vec<_> = sim
        .kube()
        .unwrap()
        .api
        .audit()
        .into_iter()
        .filter(|a| a.code == 403)
        .collect();
    assert!(denied.is_empty(), "{denied:?}");
}

/// ENIConfig `name` for `subnet` with `annotations` (create or replace).
fn apply_annotated_eniconfig(sim: &Sim, name: &str, subnet: &str, annotations: &[(&str, &str)]) {
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| (format!("networking.k8s.aws/{k}"), json!(v)))
        .collect();
    api(sim)
        .cluster()
        .apply_object(json!({
            "apiVersion": "crd.k8s.amazonaws.com/v1alpha1", "kind": "ENIConfig",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"subnet": subnet},
        }))
        .unwrap();
}

/// The warm targets ipamd on node 0 has in force and where they came from.
fn warm_targets(sim: &Sim) -> serde_json::Value {
    sim.introspect(0, "/v1/address-capacity")
        .map(|c| c["warmTargets"].clone())
        .unwrap_or_default()
}

fn wait_targets(sim: &Sim, what: &str, ok: impl Fn(&serde_json::Value) -> bool) {
    eventually(Duration::from_secs(60), || {
        let t = warm_targets(sim);
        ok(&t).then_some(()).ok_or_else(|| format!("{t}"))
    })
    .unwrap_or_else(|e| panic!("{what}: {e}"));
}

#[test]
fn the_eniconfigs_warm_targets_apply_under_the_nodes_and_follow_live() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&config(KubeOptions::default())).expect("two-zone VPC with kube");
    let zone = sim.node_zone(0);
    let ((subnet, _), _) = zone_subnets(&sim, &zone);
    apply_annotated_eniconfig(
        &sim,
        &zone,
        &subnet,
        &[("warm-ip-target", "4"), ("minimum-ip-target", "5")],
    );
    sim.start_ipamd(0, &cn_env("1"), READY)
        .expect("ipamd serves");
    // the ENIConfig's values over the environment's WARM_IP_TARGET=1, and the pool holds them
    wait_targets(&sim, "the ENIConfig's values", |t| {
        t["WARM_IP_TARGET"] == 4 && t["MINIMUM_IP_TARGET"] == 5
    });
    let t = warm_targets(&sim);
    assert_eq!(t["eniConfig"]["name"], json!(zone), "{t}");
    assert_eq!(t["eniConfig"]["refused"], json!(null), "{t}");
    eventually(Duration::from_secs(60), || {
        let c = sim.introspect(0, "/v1/address-capacity")?;
        (c["free"].as_u64() >= Some(4))
            .then_some(())
            .ok_or_else(|| format!("{c}"))
    })
    .expect("the pool grows to the ENIConfig's warm target");

    // the node's own annotation wins over its ENIConfig's, field by field
    sim.annotate_node(0, "networking.k8s.aws/warm-ip-target", Some("2"))
        .unwrap();
    wait_targets(&sim, "the node's over its ENIConfig's", |t| {
        t["WARM_IP_TARGET"] == 2 && t["MINIMUM_IP_TARGET"] == 5
    });

    // the ENIConfig changed live: a bad value refuses its level alone
    apply_annotated_eniconfig(
        &sim,
        &zone,
        &subnet,
        &[("warm-ip-target", "4"), ("minimum-ip-target", "lots")],
    );
    wait_targets(&sim, "the ENIConfig's level refused", |t| {
        t["eniConfig"]["refused"].is_string()
            && t["WARM_IP_TARGET"] == 2
            && t["MINIMUM_IP_TARGET"] == 0
    });
    assert_eq!(warm_targets(&sim)["refused"], json!(null));
    assert!(
        sim.ipamd_log_tail(0, 300).contains(&format!(
            "ENIConfig {zone}'s warm-target annotations are refused"
        )),
        "the refusal is logged"
    );

    // fixed, and the node's annotation removed: the ENIConfig's alone again
    apply_annotated_eniconfig(&sim, &zone, &subnet, &[("minimum-ip-target", "3")]);
    sim.annotate_node(0, "networking.k8s.aws/warm-ip-target", None)
        .unwrap();
    wait_targets(&sim, "the ENIConfig's alone", |t| {
        t["WARM_IP_TARGET"] == 1
            && t["MINIMUM_IP_TARGET"] == 3
            && t["eniConfig"]["refused"].is_null()
    });
    // without annotations on the ENIConfig: the environment's
    apply_annotated_eniconfig(&sim, &zone, &subnet, &[]);
    wait_targets(&sim, "the environment's", |t| {
        t["MINIMUM_IP_TARGET"] == 0 && t["eniConfig"].is_null()
    });
}

#[test]
fn api_server_away_at_start_for_two_minutes_and_dropping_watches() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&config(KubeOptions::default())).expect("two-zone VPC with kube");
    let zone1 = sim.node_zone(1);
    let ((subnet1, cidr1), _) = zone_subnets(&sim, &zone1);
    sim.apply_eniconfig(&zone1, &subnet1, &[]).unwrap();

    // away at start: node 0 (no custom networking) serves after its 30 s try; node 1 (custom
    // networking) waits for the API server and converges once it returns
    api(&sim).outage(Duration::from_secs(45), Outage::Refuse);
    let t0 = Instant::now();
    sim.start_ipamd(
        0,
        &[("IPAMD_POOL_TICK_SECONDS", "1")],
        Duration::from_secs(40),
    )
    .unwrap_or_else(|e| panic!("node 0 without custom networking: {e}"));
    let waited = t0.elapsed();
    assert!(waited <= Duration::from_secs(40), "{waited:?}");
    let early = sim
        .add_pod(0, "early")
        .expect("node 0 serves without the API");
    let not_yet = sim.start_ipamd(1, &cn_env("2"), Duration::from_secs(3));
    assert!(
        not_yet.is_err(),
        "node 1 served before the API server came back"
    );
    sim.wait_ipamd(1, READY)
        .unwrap_or_else(|e| panic!("node 1 after the API returned: {e}"));
    assert!(t0.elapsed() >= Duration::from_secs(40));
    let first = add_pods(&mut sim, 1, 3, "first");
    for p in &first {
        assert!(cidr1.contains(&p.ip), "{} {}", p.name, p.ip);
    }

    // away for two minutes (503s) with pods running: nothing crash-loops, ADDs keep working
    // from the pool, no address changes
    let held: Vec<_> = (0..2).map(|i| sim.assigned(i).unwrap()).collect();
    let pids: Vec<_> = (0..2).map(|i| sim.nodes[i].ipamd_pid()).collect();
    api(&sim).outage(Duration::from_secs(120), Outage::Unavailable503);
    let during = sim.add_pod(1, "during").expect("ADD while the API is away");
    assert!(cidr1.contains(&during.ip));
    std::thread::sleep(Duration::from_secs(120));
    for i in 0..2 {
        assert_eq!(
            sim.nodes[i].ipamd_pid(),
            pids[i],
            "node {i}'s ipamd restarted"
        );
        let now = sim.assigned(i).unwrap();
        for (ip, owner) in &held[i] {
            assert_eq!(now.get(ip), Some(owner), "node {i}: {ip} changed");
        }
    }
    ping(&first[0].netns, early.ip).expect("pods keep working");

    // dropped watches: a relabel after the drop still reaches ipamd
    api(&sim).drop_watches();
    sim.apply_eniconfig("after-drop", &subnet1, &[]).unwrap();
    sim.label_node(1, "vpc.amazonaws.com/externalEniConfig", Some("after-drop"))
        .unwrap();
    eventually(Duration::from_secs(60), || {
        match eni_config_name(&sim, 1).as_deref() {
            Some("after-drop") => Ok(()),
            other => Err(format!("/v1/eni-configs says {other:?}")),
        }
    })
    .expect("ipamd re-watched after the drop");
    sim.check_addresses().expect("addresses consistent");
}

#[test]
fn the_chart_without_list_on_eniconfigs_does_not_converge() {
    if !can_run_kernel_tests() {
        return;
    }
    let rendered = kubesim::chart::render_chart(&serde_json::json!({})).expect("helm render");
    let full = "resources: [\"eniconfigs\"]\n    verbs: [\"list\", \"watch\", \"get\"]";
    assert!(rendered.contains(full), "the chart's eniconfigs rule moved");
    let cut = rendered.replace(
        full,
        "resources: [\"eniconfigs\"]\n    verbs: [\"watch\", \"get\"]",
    );
    let mut sim = Sim::start(&config(KubeOptions {
        rendered: Some(cut),
        ..KubeOptions::default()
    }))
    .expect("two-zone VPC with kube");
    let zone0 = sim.node_zone(0);
    let ((subnet0, _), _) = zone_subnets(&sim, &zone0);
    sim.apply_eniconfig(&zone0, &subnet0, &[]).unwrap();
    // ipamd starts (its Node watch is granted), but never learns the ENIConfig (its list is
    // refused): no ENI is created and the pod gets no address
    sim.start_ipamd(0, &cn_env("2"), READY)
        .unwrap_or_else(|e| panic!("ipamd: {e}"));
    let add = sim.add_pod(0, "starved");
    assert!(
        add.is_err(),
        "a pod got an address although ENIConfigs cannot be listed"
    );
    let denied = sim
        .kube()
        .unwrap()
        .api
        .audit()
        .into_iter()
        .any(|a| a.code == 403 && a.resource.contains("eniconfigs"));
    assert!(denied, "the simulator never refused the ENIConfig watch");
}

/// Whether node `i`'s ipamd reports SERVING on its gRPC health service (what aws-node's
/// readiness probe and the plugin's STATUS ask).
fn serving(sim: &Sim, i: usize) -> bool {
    let socket = sim.nodes[i].socket();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(async {
            match aws_cni::ipam::Ipamd::connect(&socket).await {
                Ok(ipamd) => ipamd.serving().await.unwrap_or(false),
                Err(_) => false,
            }
        })
}

/// Issue 39, upstream `nodeInit` ("Failed to attach any ENIs for custom networking": the start
/// fails, aws-node never becomes ready): with no ENIConfig for the node's zone no ENI can be
/// placed and the primary ENI serves no pod, so ipamd's health says NOT_SERVING (aws-node
/// unready, nothing scheduled there) until the ENIConfig appears and an ENI with addresses is
/// attached. Before, ipamd was ready with no pod capacity.
#[test]
fn ipamd_is_unready_until_its_eniconfig_yields_an_eni() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&config(KubeOptions::default())).expect("two-zone VPC with kube");
    let pods_sg = sg(&sim, "pods");
    let zone = sim.node_zone(0);
    sim.start_ipamd(0, &cn_env("2"), READY)
        .unwrap_or_else(|e| panic!("ipamd: {e}"));
    // A few pool passes: no ENIConfig, no ENI, not serving.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        assert!(
            !serving(&sim, 0),
            "ready without an ENI for pods:\n{}",
            sim.ipamd_log_tail(0, 30)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let ((id, _), _) = zone_subnets(&sim, &zone);
    sim.apply_eniconfig(&zone, &id, std::slice::from_ref(&pods_sg))
        .unwrap();
    eventually(Duration::from_secs(60), || {
        if serving(&sim, 0) {
            Ok(())
        } else {
            Err("not serving yet".to_owned())
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    let pod = sim.add_pod(0, "after-eniconfig").expect("ADD once ready");
    sim.del_pod(&pod).expect("DEL");
    sim.shutdown();
}
