//! Kernel tests of `egress-cni` chained after `aws-cni` (as the rendered conflist chains them)
//! inside throwaway node/pod namespaces against `test-ipamd`: an IPv6 pod reaches an IPv4 host
//! through `v4if0`, an IPv4 pod an IPv6 host through `v6if0`, both SNATed to the node IP (the
//! outside host has no route back to the egress ranges); CHECK passes; DEL, twice, leaves no
//! address, veth, chain or host-local lease.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::process::Command;

use integration::{
    CniCall, CniOutput, PodNs, TestIpamd, TestNode, built_binary, can_run_kernel_tests,
};

fn aws_conf(ipamd: &TestIpamd, node: &TestNode) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"aws-cni","type":"aws-cni","mtu":"9001",
            "vethPrefix":"eni","ipamdSocket":"{}","pluginLogFile":"{}","pluginLogLevel":"Debug"}}"#,
        ipamd.socket.display(),
        node.dir().join("plugin.log").display()
    )
}

/// The egress-cni entry of upstream's conflist, with the lease dir under the node's temp dir.
fn egress_conf(node: &TestNode, v4: bool, node_ip: &str) -> serde_json::Value {
    let (subnet, dst) = if v4 {
        ("169.254.172.0/22", "0.0.0.0/0")
    } else {
        ("fd00::ac:00/118", "::/0")
    };
    serde_json::json!({"cniVersion": "1.0.0", "name": "aws-cni", "type": "egress-cni",
        "mtu": "9001", "enabled": "true", "randomizeSNAT": "prng", "nodeIP": node_ip,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                 "routes": [{"dst": dst}], "dataDir": lease_dir(node).display().to_string()},
        "pluginLogFile": node.dir().join("egress.log").display().to_string(),
        "pluginLogLevel": "DEBUG"})
}

fn lease_dir(node: &TestNode) -> std::path::PathBuf {
    node.dir().join("egress-ipam")
}

fn with_prev(conf: &serde_json::Value, prev: &serde_json::Value) -> String {
    let mut c = conf.clone();
    c["prevResult"] = prev.clone();
    c.to_string()
}

fn egress(node: &TestNode, command: &str, id: &str, pod: &PodNs, stdin: String) -> CniOutput {
    integration::cni::run_plugin(
        node,
        &built_binary("egress-cni"),
        &CniCall::new(command, id, Some(pod.path.clone()), stdin),
    )
}

fn in_ns(ns: &str, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap()
}

fn retry(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// An outside host: a netns joined to the node by a veth, the node end `ext0` holding the
/// node IP. The outside host only knows its connected prefix, so a reply reaches the pod only
/// if the pod's packets were SNATed to the node IP.
fn outside_host(node: &mut TestNode, node_cidr: &str, host_cidr: &str) -> PodNs {
    let ext = node.add_pod_netns("ext");
    node.ip(&[
        "link", "add", "ext0", "type", "veth", "peer", "name", "x0", "netns", &ext.name,
    ]);
    let nodad: &[&str] = if node_cidr.contains(':') {
        &["nodad"]
    } else {
        &[]
    };
    node.ip(&[&["addr", "add", node_cidr, "dev", "ext0"][..], nodad].concat());
    node.ip(&["link", "set", "ext0", "up"]);
    let out = Command::new("ip")
        .args(["-n", &ext.name, "addr", "add", host_cidr, "dev", "x0"])
        .args(nodad)
        .status()
        .unwrap();
    assert!(out.success());
    assert!(
        Command::new("ip")
            .args(["-n", &ext.name, "link", "set", "x0", "up"])
            .status()
            .unwrap()
            .success()
    );
    ext
}

fn nat_rules(node: &TestNode, v4: bool) -> String {
    let out = node
        .command(if v4 { "iptables" } else { "ip6tables" })
        .args(["-w", "-t", "nat", "-S"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn leases(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir.join("aws-cni")) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("last_reserved_ip") && n != "lock")
        .collect()
}

fn leftovers(node: &TestNode) -> Vec<String> {
    node.pod_leftovers()
        .into_iter()
        .filter(|l| !l.contains(": ext0@"))
        .collect()
}

fn run_egress_case(v4: bool) {
    let mut node = TestNode::new(if v4 { "eg4" } else { "eg6" });
    let ipamd = node.start_test_ipamd();
    let (node_cidr, host_cidr, host_ip, node_ip) = if v4 {
        (
            "203.0.113.1/24",
            "203.0.113.2/24",
            "203.0.113.2",
            "203.0.113.1",
        )
    } else {
        (
            "2001:db8:e::1/64",
            "2001:db8:e::2/64",
            "2001:db8:e::2",
            "2001:db8:e::1",
        )
    };
    let ext = outside_host(&mut node, node_cidr, host_cidr);
    if !v4 {
        // Upstream's init container sets this when ENABLE_V6_EGRESS (or ENABLE_IPv6) is on.
        node.sysctl("net/ipv6/conf/all/forwarding", "1");
    }
    let pod = node.add_pod_netns("p");
    // test-ipamd serves the IPv6 pool to container ids containing "ipv6".
    let id = if v4 { "ipv6-egress" } else { "egress-v4pod" };
    let aws = aws_conf(&ipamd, &node);
    let aws_res = node
        .cni(&CniCall::new(
            "ADD",
            id,
            Some(pod.path.clone()),
            aws.clone(),
        ))
        .ok()
        .json();
    let conf = egress_conf(&node, v4, node_ip);
    // A leftover egress interface in the pod (an earlier attempt that created it and failed
    // later): replaced, not refused "already exists" as upstream's egress plugin does.
    let leftover = if v4 { "v4if0" } else { "v6if0" };
    let made = in_ns(
        &pod.name,
        &[
            "ip",
            "link",
            "add",
            leftover,
            "type",
            "veth",
            "peer",
            "name",
            "leftover0",
        ],
    );
    assert!(made.status.success(), "{made:?}");
    let res = egress(&node, "ADD", id, &pod, with_prev(&conf, &aws_res))
        .ok()
        .json();
    assert!(
        !in_ns(&pod.name, &["ip", "link", "show", "leftover0"])
            .status
            .success(),
        "the leftover pair is gone"
    );
    // prevResult handed on, plus the host veth and the pod's egress interface.
    let ifs = res["interfaces"].as_array().unwrap();
    let eif = if v4 { "v4if0" } else { "v6if0" };
    assert_eq!(
        ifs.len(),
        aws_res["interfaces"].as_array().unwrap().len() + 2,
        "{res}"
    );
    assert!(
        ifs[ifs.len() - 2]["name"]
            .as_str()
            .unwrap()
            .starts_with("veth"),
        "{res}"
    );
    assert_eq!(ifs[ifs.len() - 1]["name"], eif);
    assert_eq!(
        ifs[ifs.len() - 1]["sandbox"],
        pod.path.display().to_string()
    );
    assert_eq!(res["ips"], aws_res["ips"]);

    let fam = if v4 { "-4" } else { "-6" };
    let addr = String::from_utf8_lossy(
        &Command::new("ip")
            .args([
                "-n", &pod.name, fam, "-o", "addr", "show", "dev", eif, "scope", "global",
            ])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    let want_prefix = if v4 {
        "inet 169.254.17"
    } else {
        "inet6 fd00::ac:"
    };
    assert!(addr.contains(want_prefix), "{addr}");
    if !v4 {
        let d = String::from_utf8_lossy(
            &in_ns(
                &pod.name,
                &["cat", "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"],
            )
            .stdout,
        )
        .trim()
        .to_owned();
        assert_eq!(d, "1", "IPv6 egress disables IPv6 on the pod's eth0");
    }
    let rules = nat_rules(&node, v4);
    let chain_prefix = if v4 { "-N CNI-E4-" } else { "-N CNI-E6-" };
    assert!(rules.contains(chain_prefix), "{rules}");
    assert!(rules.contains(&format!("--to-source {node_ip}")), "{rules}");
    assert!(rules.contains("--random-fully"), "{rules}");
    assert!(
        rules.contains(r#"--comment "name: \"aws-cni\" id: \""#),
        "{rules}"
    );
    assert_eq!(leases(&lease_dir(&node)).len(), 1);

    // The outside host answers only the node IP: success means SNAT worked.
    let ping: Vec<&str> = if v4 {
        vec!["busybox", "ping", "-c", "1", "-W", "1", host_ip]
    } else {
        vec!["busybox", "ping", "-6", "-c", "1", "-W", "1", host_ip]
    };
    retry("pod reaches the outside host through egress", || {
        in_ns(&pod.name, &ping).status.success()
    });
    let _ = &ext;

    // CHECK with the chain's result, then the chain's DEL order: egress-cni, aws-cni; twice.
    egress(&node, "CHECK", id, &pod, with_prev(&conf, &res)).ok();
    for _ in 0..2 {
        egress(&node, "DEL", id, &pod, with_prev(&conf, &res)).ok();
        node.cni(&CniCall::new("DEL", id, Some(pod.path.clone()), {
            let mut c: serde_json::Value = serde_json::from_str(&aws).unwrap();
            c["prevResult"] = aws_res.clone();
            c.to_string()
        }))
        .ok();
    }
    let rules = nat_rules(&node, v4);
    assert!(!rules.contains("CNI-E"), "{rules}");
    assert_eq!(leases(&lease_dir(&node)), Vec::<String>::new());
    assert_eq!(leftovers(&node), Vec::<String>::new());
    let links = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["-n", &pod.name, "-o", "link"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(!links.contains(eif), "{links}");
    // A CHECK now reports drift.
    let out = egress(&node, "CHECK", id, &pod, with_prev(&conf, &res));
    assert_ne!(out.code, 0, "{out:?}");
}

#[test]
fn ipv6_pod_reaches_ipv4_host_through_v4_egress_snat_to_node_ip() {
    if !can_run_kernel_tests() {
        return;
    }
    run_egress_case(true);
}

#[test]
fn ipv4_pod_reaches_ipv6_host_through_v6_egress_snat_to_node_ip() {
    if !can_run_kernel_tests() {
        return;
    }
    run_egress_case(false);
}
