//! Kernel tests of `aws-cni` invoked directly (as a runtime would) inside throwaway node/pod
//! namespaces, against `test-ipamd`: the datapath layout, pod-to-pod and ENI-table traffic,
//! CHECK drift, DEL idempotence and its fallbacks, and ADD failure handling.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::process::Command;

use integration::node::{SECONDARY_TABLE, VPC_SERVICE_IP};
use integration::{CniCall, PodNs, TestIpamd, TestNode, can_run_kernel_tests};

fn conf(ipamd: &TestIpamd, node: &TestNode, version: &str, mtu: &str) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"aws-cni","type":"aws-cni","mtu":"{mtu}",
            "vethPrefix":"eni","ipamdSocket":"{}","pluginLogFile":"{}","pluginLogLevel":"Debug"}}"#,
        ipamd.socket.display(),
        node.dir().join("plugin.log").display()
    )
}

fn with_prev(conf: &str, result: &serde_json::Value) -> String {
    let mut v: serde_json::Value = serde_json::from_str(conf).unwrap();
    v["prevResult"] = result.clone();
    v.to_string()
}

fn in_pod(pod: &PodNs, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", &pod.name])
        .args(args)
        .output()
        .unwrap()
}

fn pod_ip(pod: &PodNs, args: &[&str]) -> String {
    let mut full = vec!["-n", pod.name.as_str()];
    full.extend_from_slice(args);
    let out = Command::new("ip").args(&full).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn ping(pod: &PodNs, dst: &str) -> bool {
    in_pod(pod, &["busybox", "ping", "-c", "1", "-W", "2", dst])
        .status
        .success()
}

fn add(node: &TestNode, id: &str, pod: &PodNs, conf: &str) -> serde_json::Value {
    node.cni(&CniCall::new(
        "ADD",
        id,
        Some(pod.path.clone()),
        conf.to_owned(),
    ))
    .ok()
    .json()
}

#[test]
fn plugin_wires_primary_and_secondary_eni_pods_and_cleans_up() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("wire");
    node.attach_vpc();
    let ipamd = node.start_test_ipamd();
    let pod_a = node.add_pod_netns("a");
    let pod_b = node.add_pod_netns("b");
    let conf = conf(&ipamd, &node, "1.0.0", "9001");

    let mut call_a = CniCall::new("ADD", "pod-a", Some(pod_a.path.clone()), conf.clone());
    call_a.args = "IgnoreUnknown=1;K8S_POD_NAME=nginx;K8S_POD_NAMESPACE=default".into();
    let res_a = node.cni(&call_a).ok().json();
    let res_b = add(&node, "secondary-b", &pod_b, &conf);

    // Result shape.
    assert_eq!(res_a["cniVersion"], "1.0.0");
    assert_eq!(res_a["interfaces"][0]["name"], "enic440f455693");
    assert_eq!(res_a["interfaces"][1]["name"], "eth0");
    assert_eq!(
        res_a["interfaces"][1]["sandbox"],
        pod_a.path.display().to_string()
    );
    assert_eq!(res_a["interfaces"][2]["sandbox"], "0");
    assert_eq!(res_b["interfaces"][2]["sandbox"], "1");
    let ip_a = res_a["ips"][0]["address"].as_str().unwrap().to_owned();
    let ip_b = res_b["ips"][0]["address"].as_str().unwrap().to_owned();
    assert_eq!(ip_a, "198.18.0.10/32");
    assert_eq!(ip_b, "198.18.1.10/32");
    let a = ip_a.trim_end_matches("/32");
    let b = ip_b.trim_end_matches("/32");
    let veth_a = res_a["interfaces"][0]["name"].as_str().unwrap().to_owned();
    let veth_b = res_b["interfaces"][0]["name"].as_str().unwrap().to_owned();
    let mac_b = res_b["interfaces"][0]["mac"].as_str().unwrap().to_owned();

    // Pod side.
    assert!(pod_ip(&pod_b, &["-4", "addr", "show", "eth0"]).contains(&format!("inet {b}/32")));
    assert!(pod_ip(&pod_b, &["link", "show", "eth0"]).contains("mtu 9001"));
    let routes = pod_ip(&pod_b, &["route", "show"]);
    assert!(
        routes.contains("default via 169.254.1.1 dev eth0"),
        "{routes}"
    );
    assert!(routes.contains("169.254.1.1 dev eth0"), "{routes}");
    assert!(routes.contains("scope link"), "{routes}");
    let neigh = pod_ip(&pod_b, &["neigh", "show"]);
    assert!(
        neigh.contains(&format!("169.254.1.1 dev eth0 lladdr {mac_b} PERMANENT")),
        "{neigh}"
    );

    // Host side.
    let link = node.ip(&["link", "show", &veth_b]);
    assert!(
        link.contains("mtu 9001") && link.contains("state UP"),
        "{link}"
    );
    let first_octet = u8::from_str_radix(&mac_b[..2], 16).unwrap();
    assert_eq!(
        first_octet & 0x03,
        0x02,
        "host veth mac must be local unicast"
    );
    assert_ne!(mac_b, res_a["interfaces"][0]["mac"].as_str().unwrap());
    for (key, want) in [
        ("accept_ra", "0"),
        ("accept_redirects", "1"),
        ("forwarding", "0"),
    ] {
        let out = node
            .command("cat")
            .arg(format!("/proc/sys/net/ipv6/conf/{veth_b}/{key}"))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want, "{key}");
    }
    let main = node.ip_lines(&["route", "show", "table", "main"]);
    assert!(
        main.contains(&format!("{a} dev {veth_a} scope link")),
        "{main:?}"
    );
    assert!(
        main.contains(&format!("{b} dev {veth_b} scope link")),
        "{main:?}"
    );
    let rules = node.ip_lines(&["rule", "show"]);
    assert!(
        rules.contains(&format!("512: from all to {a} lookup main")),
        "{rules:?}"
    );
    assert!(
        rules.contains(&format!("512: from all to {b} lookup main")),
        "{rules:?}"
    );
    assert!(
        rules.contains(&format!("1536: from {b} lookup {SECONDARY_TABLE}")),
        "{rules:?}"
    );
    assert!(
        !rules
            .iter()
            .any(|r| r.starts_with("1536:") && r.contains(a)),
        "primary-ENI pod must not get a from-rule: {rules:?}"
    );
    // Traffic from the secondary-ENI pod is looked up in table 2 and leaves through eth1.
    let get = node.ip(&["route", "get", VPC_SERVICE_IP, "from", b, "iif", &veth_b]);
    assert!(get.contains("dev eth1") && get.contains("table 2"), "{get}");
    let get = node.ip(&["route", "get", VPC_SERVICE_IP, "from", a, "iif", &veth_a]);
    assert!(
        get.contains("dev eth0") && !get.contains("table 2"),
        "{get}"
    );

    // Traffic: pod to pod both ways, and each pod to the VPC (strict rp_filter there proves
    // the secondary pod's packets left through the secondary ENI).
    assert!(ping(&pod_a, b), "pod a -> pod b");
    assert!(ping(&pod_b, a), "pod b -> pod a");
    assert!(
        ping(&pod_b, VPC_SERVICE_IP),
        "secondary pod -> vpc via eth1"
    );
    assert!(ping(&pod_a, VPC_SERVICE_IP), "primary pod -> vpc via eth0");

    // CHECK passes, then reports drift once a rule disappears.
    let check_a = CniCall {
        command: "CHECK".into(),
        stdin: with_prev(&conf, &res_a),
        ..call_a.clone()
    };
    node.cni(&check_a).ok();
    let check_b = CniCall::new(
        "CHECK",
        "secondary-b",
        Some(pod_b.path.clone()),
        with_prev(&conf, &res_b),
    );
    node.cni(&check_b).ok();
    node.ip(&["rule", "del", "pref", "1536", "from", b]);
    let drift = node.cni(&check_b);
    assert_ne!(drift.code, 0);
    assert_eq!(drift.json()["code"], 102);
    assert!(drift.stdout.contains("rule from"), "{}", drift.stdout);

    // DEL both, twice each: nothing left, addresses released.
    for _ in 0..2 {
        node.cni(&CniCall {
            command: "DEL".into(),
            stdin: with_prev(&conf, &res_a),
            ..call_a.clone()
        })
        .ok();
        node.cni(&CniCall::new(
            "DEL",
            "secondary-b",
            Some(pod_b.path.clone()),
            with_prev(&conf, &res_b),
        ))
        .ok();
    }
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    assert!(pod_ip(&pod_a, &["-o", "link", "show"]).contains("lo:"));
    assert!(!pod_ip(&pod_a, &["-o", "link", "show"]).contains("eth0"));
    assert_eq!(ipamd.allocations(), Vec::<serde_json::Value>::new());
    // The logs went to the file, as JSON lines.
    let log = std::fs::read_to_string(node.dir().join("plugin.log")).unwrap();
    assert!(
        log.lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok())
    );
    assert!(log.contains("pod wired"));
    // In upstream's zap shape, so log pipelines that parse upstream's plugin.log parse ours.
    let wired = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["msg"] == "pod wired")
        .expect("a 'pod wired' line");
    assert_eq!(wired["level"], "info", "{wired}");
    assert!(
        wired["ts"].is_string() && wired["caller"].is_string(),
        "{wired}"
    );
}

#[test]
fn del_tears_down_from_prev_result_when_ipamd_is_gone_and_netns_deleted() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("noipamd");
    let ipamd = node.start_test_ipamd();
    let pod = node.add_pod_netns("p");
    let conf = conf(&ipamd, &node, "0.4.0", "1500");
    let res = add(&node, "secondary-x", &pod, &conf);
    assert_eq!(res["cniVersion"], "0.4.0");
    assert_eq!(res["ips"][0]["version"], "4");
    assert!(node.ip(&["link", "show"]).contains("mtu 1500"));
    let left = node.pod_leftovers();
    assert!(
        left.iter()
            .any(|l| l.contains("1536: from 198.18.1.10 lookup 2")),
        "{left:?}"
    );

    node.kill(ipamd.pid);
    node.delete_pod_netns(&pod);
    // containerd passes an empty CNI_NETNS once the sandbox is gone.
    let del = CniCall::new("DEL", "secondary-x", None, with_prev(&conf, &res));
    node.cni(&del).ok();
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    node.cni(&del).ok();

    // ADD with ipamd down: try again later. STATUS: plugin not available.
    let pod2 = node.add_pod_netns("q");
    let out = node.cni(&CniCall::new(
        "ADD",
        "c2",
        Some(pod2.path.clone()),
        conf.clone(),
    ));
    assert_eq!(out.json()["code"], 11, "{}", out.stdout);
    // STATUS needs a 1.1.0 configuration (the library's skel refuses older ones with code 1).
    let status = node.cni(&CniCall::new("STATUS", "", None, conf.clone()));
    assert_eq!(status.json()["code"], 1, "{}", status.stdout);
    let conf11 = conf.replace(r#""cniVersion":"0.4.0""#, r#""cniVersion":"1.1.0""#);
    assert_ne!(conf11, conf);
    let status = node.cni(&CniCall::new("STATUS", "", None, conf11));
    assert_eq!(status.json()["code"], 50, "{}", status.stdout);
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
}

/// Issue 39, upstream `cni.go` `del`: ipamd answering DelNetwork `Success=false` fails the DEL
/// ("del cmd: failed to process delete request") after what is provably the sandbox's is
/// torn down; ipamd still holds the address, and the retried DEL releases it. Before, the
/// plugin ignored `Success` and answered success, leaving the address held for good.
#[test]
fn del_fails_when_ipamd_refuses_it_and_the_retry_releases() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("refdel");
    let refuse = node.dir().join("refuse-del");
    let ipamd = node.start_test_ipamd_with(&["--refuse-del-while", refuse.to_str().unwrap()]);
    let pod = node.add_pod_netns("p");
    let conf = conf(&ipamd, &node, "1.0.0", "9001");
    let res = add(&node, "refused-del", &pod, &conf);
    let ip = res["ips"][0]["address"].as_str().unwrap().to_owned();
    std::fs::write(&refuse, b"").unwrap();
    let del = CniCall::new(
        "DEL",
        "refused-del",
        Some(pod.path.clone()),
        with_prev(&conf, &res),
    );
    let out = node.cni(&del);
    let err = out.json();
    assert!(
        err["msg"]
            .as_str()
            .is_some_and(|m| m.contains("failed to process delete request")),
        "{}",
        out.stdout
    );
    assert_eq!(ipamd.allocations().len(), 1, "ipamd still holds {ip}");
    std::fs::remove_file(&refuse).unwrap();
    node.cni(&del).ok();
    assert!(ipamd.allocations().is_empty(), "the retry released {ip}");
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
}

#[test]
fn status_and_gc_succeed_with_ipamd_up() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("status");
    let ipamd = node.start_test_ipamd();
    let conf = conf(&ipamd, &node, "1.1.0", "9001");
    let out = node
        .cni(&CniCall::new("STATUS", "", None, conf.clone()))
        .ok();
    assert!(out.stdout.is_empty());
    node.cni(&CniCall::new("GC", "", None, conf)).ok();
}

/// The veth pair is created while ipamd is asked (docs/plugin.md, "The ADD sequence"): when no
/// address comes (ipamd unreachable, or its refusal), the pair is deleted before the error.
#[test]
fn an_add_without_an_address_leaves_no_link_behind() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("noaddr");
    let ipamd = node.start_test_ipamd();
    let pod = node.add_pod_netns("p");
    let gone = conf(&ipamd, &node, "1.1.0", "9001").replace(
        &ipamd.socket.display().to_string(),
        &node.dir().join("no-ipamd.sock").display().to_string(),
    );
    // Unreachable ipamd and a refusal end in the same branch of the ADD (no address).
    let out = node.cni(&CniCall::new("ADD", "c1", Some(pod.path.clone()), gone));
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(
        out.stdout.contains("failed to connect to backend server"),
        "{}",
        out.stdout
    );
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    assert_eq!(
        pod_ip(&pod, &["-o", "link", "show"])
            .matches("eth0")
            .count(),
        0,
        "the pod's end went with the pair"
    );
    assert_eq!(ipamd.allocations(), Vec::<serde_json::Value>::new());
}

#[test]
fn failed_add_undoes_and_releases_the_address() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("fail");
    let ipamd = node.start_test_ipamd();
    let pod = node.add_pod_netns("p");
    // An eth0 already in the pod makes veth creation fail after the address was assigned.
    Command::new("ip")
        .args([
            "-n", &pod.name, "link", "add", "eth0", "type", "veth", "peer", "name", "x0",
        ])
        .status()
        .unwrap();
    let conf = conf(&ipamd, &node, "1.1.0", "9001");
    let out = node.cni(&CniCall::new(
        "ADD",
        "c1",
        Some(pod.path.clone()),
        conf.clone(),
    ));
    assert_ne!(out.code, 0);
    let err = out.json();
    assert_eq!(err["code"], 100, "{err}");
    assert!(
        err["details"].as_str().unwrap().contains("add veth"),
        "{err}"
    );
    assert_eq!(ipamd.allocations(), Vec::<serde_json::Value>::new());
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    // The pod's own interface is untouched.
    assert!(pod_ip(&pod, &["link", "show", "x0"]).contains("x0@eth0"));

    // A branch-ENI allocation cannot be wired: refused and released.
    let pod2 = node.add_pod_netns("q");
    let out = node.cni(&CniCall::new(
        "ADD",
        "branch-1",
        Some(pod2.path.clone()),
        conf,
    ));
    assert_eq!(out.json()["code"], 103, "{}", out.stdout);
    assert_eq!(ipamd.allocations(), Vec::<serde_json::Value>::new());
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
}

#[test]
fn ipv6_pod_gets_128_and_fe80_gateway() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("v6");
    let ipamd = node.start_test_ipamd();
    let pod_a = node.add_pod_netns("a");
    let pod_b = node.add_pod_netns("b");
    let conf = conf(&ipamd, &node, "1.1.0", "9001");
    let res_a = add(&node, "ipv6-a", &pod_a, &conf);
    // As upstream, ADD returns only once the pod's IPv6 addresses (the /128 and the link-local
    // one) passed duplicate address detection: nothing tentative is left.
    let tentative = pod_ip(
        &pod_a,
        &["-6", "-o", "addr", "show", "dev", "eth0", "tentative"],
    );
    assert_eq!(tentative.trim(), "", "tentative after ADD");
    let all = pod_ip(&pod_a, &["-6", "-o", "addr", "show", "dev", "eth0"]);
    assert!(all.contains("inet6 fe80::"), "{all}");
    let res_b = add(&node, "ipv6-b", &pod_b, &conf);
    let a = res_a["ips"][0]["address"].as_str().unwrap().to_owned();
    let b = res_b["ips"][0]["address"].as_str().unwrap().to_owned();
    assert!(a.ends_with("/128"), "{a}");
    assert_eq!(res_a["ips"][0]["gateway"], "fe80::1");
    let addrs = pod_ip(&pod_a, &["-6", "addr", "show", "eth0"]);
    assert!(addrs.contains(&format!("inet6 {a}")), "{addrs}");
    let routes = pod_ip(&pod_a, &["-6", "route", "show"]);
    assert!(routes.contains("default via fe80::1 dev eth0"), "{routes}");
    let neigh = pod_ip(&pod_a, &["-6", "neigh", "show"]);
    assert!(
        neigh.contains("fe80::1 dev eth0 lladdr") && neigh.contains("PERMANENT"),
        "{neigh}"
    );
    let a_ip = a.trim_end_matches("/128");
    let b_ip = b.trim_end_matches("/128");
    assert!(
        node.ip_lines(&["-6", "rule", "show"])
            .contains(&format!("512: from all to {a_ip} lookup main"))
    );
    // The host veths' link-local addresses finish DAD about a second after ADD; until then
    // the node cannot send neighbour solicitations towards the pods (kernel behaviour).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !in_pod(
        &pod_a,
        &["busybox", "ping", "-6", "-c", "1", "-W", "1", b_ip],
    )
    .status
    .success()
    {
        assert!(std::time::Instant::now() < deadline, "v6 pod a -> pod b");
    }
    node.cni(&CniCall::new(
        "CHECK",
        "ipv6-a",
        Some(pod_a.path.clone()),
        with_prev(&conf, &res_a),
    ))
    .ok();
    for (id, pod, res) in [("ipv6-a", &pod_a, &res_a), ("ipv6-b", &pod_b, &res_b)] {
        node.cni(&CniCall::new(
            "DEL",
            id,
            Some(pod.path.clone()),
            with_prev(&conf, res),
        ))
        .ok();
    }
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
}

/// Dual-stack (beyond upstream): ipamd answers an IPv4 and an IPv6 in one allocation; both go
/// on the pod's eth0 with both gateways, routes, neighbours, host routes and rules; pods reach
/// each other over both families; CHECK passes; DEL (twice) removes both.
#[test]
fn dual_stack_pod_gets_both_families_on_eth0() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("ds");
    let ipamd = node.start_test_ipamd();
    let pod_a = node.add_pod_netns("a");
    let pod_b = node.add_pod_netns("b");
    let conf = conf(&ipamd, &node, "1.1.0", "9001");
    let res_a = add(&node, "dualstack-a", &pod_a, &conf);
    let res_b = add(&node, "dualstack-b", &pod_b, &conf);
    let ips = |res: &serde_json::Value| -> (String, String) {
        let ips = res["ips"].as_array().unwrap();
        assert_eq!(ips.len(), 2, "{res}");
        let v4 = ips[0]["address"].as_str().unwrap();
        let v6 = ips[1]["address"].as_str().unwrap();
        assert!(v4.ends_with("/32") && v6.ends_with("/128"), "{res}");
        assert_eq!(ips[0]["gateway"], "169.254.1.1");
        assert_eq!(ips[1]["gateway"], "fe80::1");
        (
            v4.trim_end_matches("/32").to_owned(),
            v6.trim_end_matches("/128").to_owned(),
        )
    };
    let (a4, a6) = ips(&res_a);
    let (b4, b6) = ips(&res_b);
    assert_eq!(res_a["routes"].as_array().unwrap().len(), 2);
    let addrs = pod_ip(&pod_a, &["addr", "show", "eth0"]);
    assert!(addrs.contains(&format!("inet {a4}/32")), "{addrs}");
    assert!(addrs.contains(&format!("inet6 {a6}/128")), "{addrs}");
    for (fam, gw) in [("-4", "169.254.1.1"), ("-6", "fe80::1")] {
        let routes = pod_ip(&pod_a, &[fam, "route", "show"]);
        assert!(
            routes.contains(&format!("default via {gw} dev eth0")),
            "{routes}"
        );
        let neigh = pod_ip(&pod_a, &[fam, "neigh", "show"]);
        assert!(neigh.contains(gw) && neigh.contains("PERMANENT"), "{neigh}");
    }
    for (fam, ip) in [("-4", &a4), ("-6", &a6)] {
        assert!(
            node.ip_lines(&[fam, "rule", "show"])
                .contains(&format!("512: from all to {ip} lookup main")),
            "{fam} rule for {ip}"
        );
        assert!(
            node.ip_lines(&[fam, "route", "show"])
                .iter()
                .any(|l| l.starts_with(&format!("{ip} dev eni"))),
            "{fam} host route for {ip}"
        );
    }
    assert!(ping(&pod_a, &b4), "v4 pod a -> pod b");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !in_pod(
        &pod_a,
        &["busybox", "ping", "-6", "-c", "1", "-W", "1", &b6],
    )
    .status
    .success()
    {
        assert!(std::time::Instant::now() < deadline, "v6 pod a -> pod b");
    }
    node.cni(&CniCall::new(
        "CHECK",
        "dualstack-a",
        Some(pod_a.path.clone()),
        with_prev(&conf, &res_a),
    ))
    .ok();
    // Drift in the IPv6 half is found.
    let _ = Command::new("ip")
        .args([
            "-n",
            &pod_a.name,
            "-6",
            "addr",
            "del",
            &format!("{a6}/128"),
            "dev",
            "eth0",
        ])
        .status();
    let out = node.cni(&CniCall::new(
        "CHECK",
        "dualstack-a",
        Some(pod_a.path.clone()),
        with_prev(&conf, &res_a),
    ));
    assert_ne!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains(&a6), "{}", out.stdout);
    for (id, pod, res) in [
        ("dualstack-a", &pod_a, &res_a),
        ("dualstack-b", &pod_b, &res_b),
    ] {
        for _ in 0..2 {
            node.cni(&CniCall::new(
                "DEL",
                id,
                Some(pod.path.clone()),
                with_prev(&conf, res),
            ))
            .ok();
        }
    }
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    assert_eq!(ipamd.allocations(), Vec::<serde_json::Value>::new());
}
