//! Conntrack-safe address reuse (issue 38, upstream amazon-vpc-cni-k8s #3634), on the real
//! kernel in namespaces this test creates and deletes: a long-lived flow reaches pod A through
//! a service DNAT (as kube-proxy makes it), the service rule goes, A is deleted with the real
//! plugin's DEL, and A's address is given to pod B. No packet of A's flow may reach B; another
//! pod's flow keeps its entry. Without the flush the kept conntrack entry still translates the
//! flow to the address, now B's.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::Duration;

use dataplane::NetNs;
use integration::{CniCall, PodNs, TestNode, can_run_kernel_tests};

/// The service's virtual address (kube-proxy's ClusterIP) and port.
const VIP: &str = "172.20.0.10";
/// A second service, DNAT'd to the pod that stays.
const VIP_OTHER: &str = "172.20.0.11";
const PORT: u16 = 5300;
/// The client's network, behind the node (another node's pod, or a load balancer).
const CLIENT_IP: &str = "192.0.2.2";
const CLIENT_GW: &str = "192.0.2.1";

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ip_in(ns: &str, args: &[&str]) {
    run(Command::new("ip").arg("-n").arg(ns).args(args));
}

fn iptables(node: &TestNode, args: &[&str]) {
    run(node.command("iptables").args(args));
}

fn dnat(op: &str, vip: &str, to: &str) -> Vec<String> {
    [
        "-t",
        "nat",
        op,
        "KUBE-SERVICES",
        "-d",
        vip,
        "-p",
        "udp",
        "--dport",
        "5300",
        "-j",
        "DNAT",
        "--to-destination",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([format!("{to}:{PORT}")])
    .collect()
}

/// A UDP socket bound to `port` inside namespace `ns` (it stays that namespace's).
fn udp_in(ns: &PodNs, port: u16) -> UdpSocket {
    let s = NetNs::open(&ns.path)
        .unwrap()
        .run(|| UdpSocket::bind(("0.0.0.0", port)))
        .unwrap()
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn recv(s: &UdpSocket) -> Option<String> {
    let mut buf = [0u8; 64];
    s.recv(&mut buf)
        .ok()
        .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn add(node: &TestNode, conf: &str, id: &str, pod: &PodNs) -> String {
    let res = node
        .cni(&CniCall::new(
            "ADD",
            id,
            Some(pod.path.clone()),
            conf.to_owned(),
        ))
        .ok()
        .json();
    res["ips"][0]["address"]
        .as_str()
        .unwrap()
        .trim_end_matches("/32")
        .to_owned()
}

/// The client, behind the node on its own link (another node's pod, or a load balancer).
fn client_behind(node: &mut TestNode) -> PodNs {
    let client = node.add_pod_netns("client");
    node.ip(&[
        "link",
        "add",
        "ctc0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &client.name,
    ]);
    node.ip(&["addr", "add", &format!("{CLIENT_GW}/24"), "dev", "ctc0"]);
    node.ip(&["link", "set", "ctc0", "up"]);
    ip_in(
        &client.name,
        &["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "eth0"],
    );
    ip_in(&client.name, &["link", "set", "eth0", "up"]);
    ip_in(&client.name, &["route", "add", "default", "via", CLIENT_GW]);
    client
}

/// kube-proxy's layout: PREROUTING jumps to KUBE-SERVICES, which holds the services, and its
/// masquerade rule. That rule also keeps conntrack registered in the node's namespace when the
/// last service rule goes (as a real node's many NAT rules do): without a rule that uses
/// conntrack the kernel stops tracking, and no stale entry translates anything.
fn kube_proxy_base(node: &TestNode) {
    iptables(
        node,
        &[
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-m",
            "mark",
            "--mark",
            "0x4000/0x4000",
            "-j",
            "MASQUERADE",
        ],
    );
    iptables(node, &["-t", "nat", "-N", "KUBE-SERVICES"]);
    iptables(
        node,
        &["-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"],
    );
}

fn service(node: &TestNode, op: &str, vip: &str, to: &str) {
    iptables(
        node,
        &dnat(op, vip, to)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
}

/// Datagrams of `flow` to `vip`, then a marker on a new flow straight to `b`: both take the same
/// path into B, so had any datagram of the old flow reached B, it came before the marker. What
/// B received, up to the marker.
fn old_flow_then_marker(
    client: &PodNs,
    flow: &UdpSocket,
    vip: SocketAddr,
    b: &str,
    at_b: &UdpSocket,
) -> Vec<String> {
    for i in 0..5 {
        flow.send_to(format!("a-flow-after-{i}").as_bytes(), vip)
            .unwrap();
    }
    let marker = udp_in(client, 40_002);
    marker
        .send_to(
            b"marker",
            format!("{b}:{PORT}").parse::<SocketAddr>().unwrap(),
        )
        .unwrap();
    let mut got = Vec::new();
    while let Some(m) = recv(at_b) {
        let done = m == "marker";
        got.push(m);
        if done {
            break;
        }
    }
    got
}

/// The flush at handout (ipamd, `rpc::Backend::forget_flows`): a DEL that runs after the pod's
/// namespace, its veth and host route are gone (a runtime that removed the sandbox first, or a
/// DEL retried after a failed one) proves no address before ipamd answers and flushes nothing;
/// the real ipamd (in-memory EC2, one address, `IP_COOLDOWN_PERIOD=0`) deletes the entries
/// naming the address when it hands it to the next pod. Without that flush, A's flow reaches B.
#[test]
fn ipamd_forgets_a_previous_owners_flows_when_it_hands_the_address_out() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("cth");
    node.start_ipamd("max_enis=1,ipv4_per_eni=2", &[("IP_COOLDOWN_PERIOD", "0")]);
    let conf = node.aws_cni_conf();
    let client = client_behind(&mut node);
    kube_proxy_base(&node);
    let pod_a = node.add_pod_netns("a");
    let a = add(&node, &conf, "sandbox-a", &pod_a);
    service(&node, "-A", VIP, &a);
    let flow = udp_in(&client, 40_000);
    let at_a = udp_in(&pod_a, PORT);
    let vip: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    flow.send_to(b"a-flow-before", vip).unwrap();
    assert_eq!(recv(&at_a).as_deref(), Some("a-flow-before"));
    // the endpoint goes from the service; the sandbox's namespace goes before its DEL
    service(&node, "-D", VIP, &a);
    drop(at_a);
    node.delete_pod_netns(&pod_a);
    node.cni(&CniCall::new("DEL", "sandbox-a", None, conf.clone()))
        .ok();
    // Nothing proved A's address the sandbox's before the release, so the plugin left its rules
    // to ipamd, which pruned them (fenced) before it answered (issue 38: with
    // IP_COOLDOWN_PERIOD=0 a DEL's delete by selector after the release could take the next
    // owner's rules).
    let rules = node.ip(&["rule", "show"]);
    assert!(
        !rules.contains(&format!("to {a} ")) && !rules.contains(&format!("from {a} ")),
        "A's rules left after its DEL: {rules}"
    );
    // B is given A's address (the pool's only one)
    let pod_b = node.add_pod_netns("b");
    let b = add(&node, &conf, "sandbox-b", &pod_b);
    assert_eq!(b, a, "the pool's one address is handed out again");
    let at_b = udp_in(&pod_b, PORT);
    assert_eq!(
        old_flow_then_marker(&client, &flow, vip, &b, &at_b),
        vec!["marker".to_owned()],
        "B received a datagram of A's flow (stale conntrack entry of its address)"
    );
}

#[test]
fn a_flow_of_a_deleted_pod_never_reaches_the_next_owner_of_its_address() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("ct");
    let ipamd = node.start_test_ipamd();
    let conf = node.aws_cni_conf();
    let _ = ipamd;

    let client = client_behind(&mut node);

    // Pod A and a pod that stays (C), each behind a service DNAT.
    let pod_a = node.add_pod_netns("a");
    let pod_c = node.add_pod_netns("c");
    let a = add(&node, &conf, "sandbox-a", &pod_a);
    let c = add(&node, &conf, "sandbox-c", &pod_c);
    kube_proxy_base(&node);
    iptables(
        &node,
        &dnat("-A", VIP, &a)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    iptables(
        &node,
        &dnat("-A", VIP_OTHER, &c)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );

    // The long-lived flows: one client socket each, fixed source port, so every datagram is
    // the same conntrack tuple.
    let flow = udp_in(&client, 40_000);
    let flow_other = udp_in(&client, 40_001);
    let at_a = udp_in(&pod_a, PORT);
    let at_c = udp_in(&pod_c, PORT);
    let vip: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    let vip_other: SocketAddr = format!("{VIP_OTHER}:{PORT}").parse().unwrap();
    flow.send_to(b"a-flow-before", vip).unwrap();
    flow_other.send_to(b"c-flow-before", vip_other).unwrap();
    assert_eq!(
        recv(&at_a).as_deref(),
        Some("a-flow-before"),
        "the flow reaches A"
    );
    assert_eq!(
        recv(&at_c).as_deref(),
        Some("c-flow-before"),
        "the flow reaches C"
    );

    // A goes: kube-proxy drops both services' rules (the endpoint is gone; C's too, so only
    // conntrack can carry C's flow afterwards), then the runtime's DEL, then its netns.
    iptables(
        &node,
        &dnat("-D", VIP, &a)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    iptables(
        &node,
        &dnat("-D", VIP_OTHER, &c)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    drop(at_a);
    node.cni(&CniCall::new(
        "DEL",
        "sandbox-a",
        Some(pod_a.path.clone()),
        conf.clone(),
    ))
    .ok();
    node.delete_pod_netns(&pod_a);

    // B is given A's address.
    let pod_b = node.add_pod_netns("b");
    let b = add(&node, &conf, "sandbox-b", &pod_b);
    assert_eq!(b, a, "test-ipamd hands the released address out again");
    let at_b = udp_in(&pod_b, PORT);

    // A's flow goes on; then a marker straight to B's address on a new flow.
    assert_eq!(
        old_flow_then_marker(&client, &flow, vip, &b, &at_b),
        vec!["marker".to_owned()],
        "B received a datagram of A's flow (stale conntrack entry of its address)"
    );

    // The other pod's entry was not touched: its flow still reaches C without any rule.
    flow_other.send_to(b"c-flow-after", vip_other).unwrap();
    assert_eq!(recv(&at_c).as_deref(), Some("c-flow-after"));
}
