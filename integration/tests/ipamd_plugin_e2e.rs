//! End to end: the real `ipamd` (in-memory ENI provider, TEST/DEMO ONLY) serving inside a
//! throwaway node netns, and the real `aws-cni` wiring pods through it: distinct addresses
//! across two ENIs, pod-to-pod traffic, `/v1/enis` and `/metrics` (through promtool) from inside
//! the node, an ipamd restart that keeps every pod's address (host-route recovery included),
//! and DEL releasing everything.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use integration::{CniCall, PodNs, TestNode, built_binary, can_run_kernel_tests};

fn start_ipamd(node: &mut TestNode) -> u32 {
    start_ipamd_with(node, &[])
}

fn start_ipamd_with(node: &mut TestNode, extra_env: &[(&str, &str)]) -> u32 {
    node.start_ipamd("max_enis=2,ipv4_per_eni=4", extra_env)
}

/// Exit code of the DaemonSet's `grpc-health-probe` against the node's ipamd.
fn probe(node: &TestNode) -> i32 {
    let sock = node.dir().join("ipamd.sock");
    let out = node
        .command(built_binary("grpc-health-probe"))
        .arg(format!("-addr=unix://{}", sock.display()))
        .args(["-connect-timeout=2s", "-rpc-timeout=2s"])
        .output()
        .expect("run grpc-health-probe");
    out.status.code().expect("probe exited by signal")
}

fn conf(node: &TestNode) -> String {
    node.aws_cni_conf()
}

fn call(cmd: &str, i: usize, pod: &PodNs, conf: &str) -> CniCall {
    CniCall::for_pod(cmd, i, pod, conf)
}

fn curl(node: &TestNode, url: &str) -> String {
    let out = node
        .command("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "curl {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn allocations(dir: &Path) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("ipam.json")).unwrap()).unwrap();
    v["allocations"].as_array().unwrap().clone()
}

#[test]
fn ipamd_and_aws_cni_end_to_end() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("ipamd-e2e");
    let mut pid = start_ipamd(&mut node);
    assert_eq!(probe(&node), 0, "health probe against a serving ipamd");
    let conf = conf(&node);
    let pods: Vec<PodNs> = (0..4)
        .map(|i| node.add_pod_netns(&format!("p{i}")))
        .collect();
    let mut ips = Vec::new();
    let mut devices = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let res = node.cni(&call("ADD", i, pod, &conf)).ok().json();
        ips.push(
            res["ips"][0]["address"]
                .as_str()
                .unwrap()
                .trim_end_matches("/32")
                .to_owned(),
        );
        devices.push(res["interfaces"][2]["sandbox"].as_str().unwrap().to_owned());
    }
    let unique: std::collections::BTreeSet<_> = ips.iter().collect();
    assert_eq!(unique.len(), 4, "{ips:?}");
    // 3 secondary IPs per ENI: the fourth pod is on the secondary ENI (device 1).
    assert!(
        devices.contains(&"0".to_owned()) && devices.contains(&"1".to_owned()),
        "{devices:?}"
    );

    // Pod to pod, across ENIs, through the host routes the plugin installed.
    let ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            &pods[0].name,
            "busybox",
            "ping",
            "-c",
            "1",
            "-W",
            "2",
            &ips[3],
        ])
        .output()
        .unwrap();
    assert!(
        ping.status.success(),
        "ping {}: {}",
        ips[3],
        String::from_utf8_lossy(&ping.stdout)
    );

    // Introspection and metrics, from inside the node.
    let enis: serde_json::Value =
        serde_json::from_str(&curl(&node, "http://127.0.0.1:61679/v1/enis")).unwrap();
    assert_eq!(enis["0"]["AssignedIPs"], 4);
    assert_eq!(enis["0"]["ENIs"].as_object().unwrap().len(), 2);
    assert!(
        !enis.to_string().contains("container-0"),
        "container ids must be blanked"
    );
    // `ipamd status`, as an operator runs it in the aws-node container (same environment).
    let status = node
        .command(built_binary("ipamd"))
        .arg("status")
        .env("ENABLE_IPv4", "true")
        .env("WARM_IP_TARGET", "1")
        .env(
            "AWS_VPC_K8S_CNI_BACKING_STORE",
            node.dir().join("ipam.json"),
        )
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(table.contains("pool: 4 assigned"), "{table}");
    assert!(
        table.contains("checkpoint: ok, 4 entries = 4 assigned"),
        "{table}"
    );
    assert!(table.contains("WARM_IP_TARGET=1"), "{table}");
    assert_eq!(
        table.lines().filter(|l| l.starts_with("eni-")).count(),
        2,
        "one row per ENI:\n{table}"
    );
    let metrics = curl(&node, "http://127.0.0.1:61678/metrics");
    assert!(
        metrics.contains("awscni_assigned_ip_addresses 4")
            && metrics.contains("# TYPE awscni_ipamd_startup_duration_seconds histogram")
            && metrics.contains(
                "awscni_ipamd_node_initialization_duration_seconds_count{success=\"true\"} 1"
            ),
        "{metrics}"
    );
    // Where the four ADDs' time went: the plugin's phases reached ipamd over the datagram
    // socket beside its own (no policy agent here: no policy_agent observation), ipamd's
    // address wait observed where it ran; an ADD of this kind is well under 100 s.
    for (phase, count) in [
        ("plugin_total", 4),
        ("ipamd_call", 4),
        ("host_wiring", 4),
        ("address_wait", 4),
        ("policy_agent", 0),
    ] {
        for line in [
            format!("awscni_pod_network_setup_seconds_count{{phase=\"{phase}\"}} {count}"),
            format!(
                "awscni_pod_network_setup_seconds_bucket{{phase=\"{phase}\",le=\"100\"}} {count}"
            ),
        ] {
            assert!(metrics.contains(&line), "{line} missing in\n{metrics}");
        }
    }
    let (code, lint) = ipamd::metrics::promtool::check(&metrics);
    assert_ne!(code, Some(1), "promtool parse error: {lint}");
    for line in lint.lines().filter(|l| !l.trim().is_empty()) {
        // Only findings inherent in upstream's metric names (kept for compatibility).
        assert!(
            line.contains("_total\" suffix")
                || line.contains("_count\" suffix")
                || line.contains("abbreviated units"),
            "{line}"
        );
    }

    // Restart: every pod keeps its address (SIGKILL, then a corrupt checkpoint: host routes).
    node.kill(pid);
    assert_eq!(
        probe(&node),
        2,
        "health probe against a dead ipamd: connection failure"
    );
    // This incarnation spells metrics the Prometheus way: promtool finds nothing.
    pid = start_ipamd_with(&mut node, &[("METRICS_NAMING", "prometheus")]);
    assert_eq!(probe(&node), 0);
    assert_eq!(allocations(node.dir()).len(), 4);
    let metrics = curl(&node, "http://127.0.0.1:61678/metrics");
    assert!(
        metrics.contains("awscni_assigned_ip_addresses 4")
            && metrics.contains("# TYPE awscni_add_ip_req_total counter"),
        "{metrics}"
    );
    let (code, lint) = ipamd::metrics::promtool::check(&metrics);
    assert_eq!(code, Some(0), "promtool findings: {lint}\n{metrics}");
    node.kill(pid);
    std::fs::write(node.dir().join("ipam.json"), b"garbage").unwrap();
    pid = start_ipamd(&mut node);
    let recovered: std::collections::BTreeSet<String> = allocations(node.dir())
        .iter()
        .map(|a| a["ipv4"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        recovered,
        ips.iter().cloned().collect(),
        "host-route recovery lost an address"
    );

    // DEL everything through the plugin: addresses released, host side clean. Recovered pods
    // are matched by pod name only, so ipamd releases them once their veth and route are gone
    // (within a second or two of the DEL), never on the DEL alone.
    for (i, pod) in pods.iter().enumerate() {
        node.cni(&call("DEL", i, pod, &conf)).ok();
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while !allocations(node.dir()).is_empty() {
        assert!(Instant::now() < deadline, "{:?}", allocations(node.dir()));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    node.kill(pid);
}

#[test]
fn a_pod_deleted_while_ipamd_is_down_gets_its_address_reclaimed() {
    // The plugin's DEL succeeds (teardown from the pod's names) while ipamd is down, so ipamd
    // never hears of it. The restarted ipamd must notice the pod has no veth and no route left
    // and release its address, and only its address.
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("ipamd-reclaim");
    let reclaim = [("IPAMD_RECLAIM_UNWIRED_SECONDS", "1")];
    let mut pid = start_ipamd_with(&mut node, &reclaim);
    let conf = conf(&node);
    let pods: Vec<PodNs> = (0..3)
        .map(|i| node.add_pod_netns(&format!("r{i}")))
        .collect();
    let ips: Vec<String> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| {
            let res = node.cni(&call("ADD", i, pod, &conf)).ok().json();
            res["ips"][0]["address"]
                .as_str()
                .unwrap()
                .trim_end_matches("/32")
                .to_owned()
        })
        .collect();
    let held = |node: &TestNode| -> std::collections::BTreeSet<String> {
        allocations(node.dir())
            .iter()
            .map(|a| a["ipv4"].as_str().unwrap().to_owned())
            .collect()
    };
    // Wired pods survive rounds of the reclaimer.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(held(&node), ips.iter().cloned().collect());

    node.kill(pid);
    node.cni(&call("DEL", 1, &pods[1], &conf)).ok();
    assert!(
        held(&node).contains(&ips[1]),
        "ipamd was down: the checkpoint still holds the deleted pod's address"
    );
    pid = start_ipamd_with(&mut node, &reclaim);
    let deadline = Instant::now() + Duration::from_secs(20);
    while held(&node).contains(&ips[1]) {
        assert!(
            Instant::now() < deadline,
            "address of the deleted pod never reclaimed; log:\n{}",
            std::fs::read_to_string(node.dir().join("ipamd.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let expect: std::collections::BTreeSet<String> =
        [ips[0].clone(), ips[2].clone()].into_iter().collect();
    assert_eq!(
        held(&node),
        expect,
        "only the gone pod's address was released"
    );
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(held(&node), expect, "live pods keep their addresses");

    for i in [0, 2] {
        node.cni(&call("DEL", i, &pods[i], &conf)).ok();
    }
    assert!(held(&node).is_empty());
    assert_eq!(node.pod_leftovers(), Vec::<String>::new());
    node.kill(pid);
}
