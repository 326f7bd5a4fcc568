//! End to end (root only): a two-zone simulated VPC with a secondary 100.64.0.0/16 block and the
//! Kubernetes API on (kubesim with the chart's CRDs and RBAC, a Node and an aws-node Pod per
//! instance). From inside each node namespace the API answers through the fabric's relay at
//! 169.254.169.201:443 with the aws-node token and the per-node kubeconfig's CA; the Node
//! carries its zone label; ipamd gets KUBECONFIG / MY_NODE_NAME / MY_POD_NAME; pods on the
//! default (non-custom-networking) path reach each other across zones and the internet.
#![allow(clippy::tests_outside_test_module)]

use std::net::SocketAddr;
use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{
    EchoServer, INTERNET_HOST, KubeOptions, Sim, SimConfig, eventually, exec_in, ping, tcp_echo,
};

const READY: Duration = Duration::from_secs(60);

fn two_zone_config() -> SimConfig {
    SimConfig {
        layout: vpcsim::Layout {
            azs: 2,
            subnets_per_az: 1,
            secondary_cidr: Some("100.64.0.0/16".parse().unwrap()),
        },
        kube: Some(KubeOptions::default()),
        ..SimConfig::default()
    }
}

/// `curl` the API from inside node `i` as aws-node, through the relay; the body.
fn api_get(sim: &Sim, i: usize, path: &str) -> Result<String, String> {
    let kube = sim.kube().unwrap();
    let auth = format!("Authorization: Bearer {}", kube.aws_node_token);
    let ca = kube.api.ca_path();
    let url = format!("https://169.254.169.201{path}");
    let out = exec_in(
        &sim.nodes[i].netns,
        &[
            "curl",
            "-sS",
            "-m",
            "10",
            "--fail-with-body",
            "--cacert",
            ca.to_str().unwrap(),
            "-H",
            &auth,
            &url,
        ],
    );
    let body = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(body)
    } else {
        Err(format!(
            "{body}{}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[test]
fn kube_api_through_the_relay_and_default_pods_across_zones() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&two_zone_config()).expect("simulated VPC with kube");
    let kube = sim.kube().expect("kube on");
    assert_eq!(sim.node_zone(0), "us-west-2a");
    assert_eq!(sim.node_zone(1), "us-west-2b");

    for i in 0..2 {
        // the node's name is its IMDS local-hostname, and the API knows it with its zone
        let name = kube.node_name(i).to_owned();
        assert!(
            name.starts_with("ip-198-18-") && name.ends_with(".us-west-2.compute.internal"),
            "{name}"
        );
        let node: serde_json::Value =
            serde_json::from_str(&api_get(&sim, i, &format!("/api/v1/nodes/{name}")).unwrap())
                .unwrap();
        assert_eq!(
            node["metadata"]["labels"]["topology.kubernetes.io/zone"],
            sim.node_zone(i).as_str()
        );
        assert_eq!(node["status"]["capacity"]["pods"], "29");
        // RBAC is the chart's: aws-node may read nodes but not delete them / read secrets
        let secrets = api_get(&sim, i, "/api/v1/namespaces/kube-system/secrets");
        assert!(
            secrets.as_ref().is_err_and(|e| e.contains("Forbidden")),
            "{secrets:?}"
        );
        // ipamd's environment points at this node's kubeconfig and names
        let env = sim.ipamd_env(i, &[]);
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(get("MY_NODE_NAME"), name);
        assert_eq!(get("MY_POD_NAMESPACE"), "kube-system");
        assert!(get("MY_POD_NAME").starts_with("aws-node-"));
        let kc = std::fs::read_to_string(get("KUBECONFIG")).unwrap();
        assert!(kc.contains("server: https://169.254.169.201:443"), "{kc}");
        let pod = sim
            .kube()
            .unwrap()
            .api
            .get_object("v1", "Pod", Some("kube-system"), &get("MY_POD_NAME"))
            .unwrap();
        assert_eq!(pod["spec"]["nodeName"], name.as_str());
    }

    // custom-networking objects can be applied and nodes relabelled; ENIConfig validation is
    // the chart CRD's
    let subnet_b = sim.subnets_in_zone("us-west-2b");
    assert_eq!(subnet_b.len(), 2);
    assert!(subnet_b[1].1.to_string().starts_with("100.64."));
    sim.apply_eniconfig("us-west-2b", &subnet_b[1].0, &[])
        .unwrap();
    sim.label_node(1, "k8s.amazonaws.com/eniConfig", Some("us-west-2b"))
        .unwrap();
    let relabelled = api_get(
        &sim,
        1,
        &format!("/api/v1/nodes/{}", sim.kube().unwrap().node_name(1)),
    )
    .unwrap();
    assert!(relabelled.contains("k8s.amazonaws.com/eniConfig"));
    sim.kube_delete(
        "crd.k8s.amazonaws.com/v1alpha1",
        "ENIConfig",
        None,
        "us-west-2b",
    )
    .unwrap();
    sim.kube_events(Some("kube-system")).unwrap();

    // the default path still works across zones
    for i in 0..2 {
        sim.start_ipamd(i, &[("IPAMD_POOL_TICK_SECONDS", "1")], READY)
            .unwrap_or_else(|e| panic!("ipamd {i}: {e}\n{}", sim.ipamd_log_tail(i, 40)));
    }
    let a = sim
        .add_pod(0, "zone-a")
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    let b = sim
        .add_pod(1, "zone-b")
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(1, 40)));
    let _servers: Vec<EchoServer> = [&a, &b]
        .iter()
        .map(|p| EchoServer::start(&p.netns, 8080).expect("echo server"))
        .collect();
    if let Err(e) = eventually(Duration::from_secs(10), || ping(&a.netns, b.ip)) {
        let dump = |ns: &str, args: &[&str]| {
            String::from_utf8_lossy(&exec_in(ns, args).stdout).into_owned()
        };
        for n in &sim.nodes {
            eprintln!("== {} {}", n.netns, n.primary_ip);
            eprintln!("{}", dump(&n.netns, &["ip", "rule"]));
            eprintln!(
                "{}",
                dump(&n.netns, &["ip", "route", "show", "table", "all"])
            );
            eprintln!("{}", dump(&n.netns, &["ip", "addr"]));
            eprintln!("{}", dump(&n.netns, &["iptables-save", "-t", "nat"]));
        }
        eprintln!("a={} b={}", a.ip, b.ip);
        eprintln!("{}", sim.ipamd_log_tail(0, 60));
        panic!("a -> b across zones: {e}");
    }
    ping(&b.netns, a.ip).expect("b -> a across zones");
    tcp_echo(&a.netns, SocketAddr::from((b.ip, 8080))).expect("tcp a -> b");
    ping(&b.netns, INTERNET_HOST).expect("b -> internet");
    sim.check_addresses().expect("addresses consistent");
}
