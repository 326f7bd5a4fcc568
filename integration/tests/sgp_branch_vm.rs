//! Security groups for pods, the plugin's branch-ENI datapath (issue 27 item 2) on a kernel
//! with 802.1Q: runs in the test VM (`integration::vm`, Debian's cloud kernel). A node netns
//! has a veth `trunk` (the trunk ENI's link) whose peer sits in a `fabric` netns with one VLAN
//! sub-interface per branch ENI (the branch subnet's gateway on it, a permanent neighbour for
//! the branch address with the branch MAC: what the VPC does for a branch ENI). `test-ipamd`
//! answers from the pod's `vpc.amazonaws.com/pod-eni` annotation file; libcni's `cnitool`
//! runs ADD / CHECK / DEL as runtimes do. Per enforcing mode: the exact rule and route layout,
//! the VLAN link (id, parent, branch MAC), the pod's traffic leaving tagged with its VLAN and
//! its address and the replies coming back, DEL without netns leaving things alone (as
//! upstream), DEL after the annotation changed tearing down by prevResult's VLAN id, DEL
//! twice, and no VLAN link, rule or route left.

use integration::{CniCall, PodNs, TestNode};

use crate::sgp_common;
use crate::sgp_common::{Branch, conflist, prepare, write_annotation};

const MODULES: &[&str] = &["8021q", "veth"];
const TRUNK: &str = "trunk";
/// The node's primary ENI address (on `eth0`, to the fabric).
const NODE_IP: &str = "198.18.0.5";

fn lines(out: &str) -> Vec<String> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty())
        .collect()
}

fn netns_sh(ns: &str, script: &str) -> std::process::Output {
    integration::supervisor::netns_exec(ns, "sh")
        .args(["-c", script])
        .output()
        .expect("sh in the namespace")
}

fn must_ns(ns: &str, script: &str) -> String {
    let out = netns_sh(ns, script);
    assert!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The fabric's side of one branch ENI: `tport.<vlan>` with the gateway, the branch address's
/// neighbour = the branch MAC.
fn fabric_branch(fabric: &PodNs, b: &Branch) {
    let prefix = b.subnet.split('/').nth(1).expect("prefix");
    must_ns(
        &fabric.name,
        &format!(
            "ip link add link tport name tport.{v} type vlan id {v} && \
             ip addr add {gw}/{prefix} dev tport.{v} && ip link set tport.{v} up && \
             ip neigh replace {ip} lladdr {mac} dev tport.{v} nud permanent",
            v = b.vlan,
            gw = b.gateway,
            ip = b.ip,
            mac = b.mac
        ),
    );
}

/// Rules at 10, 512 and 1536 (both families), and routes of `table`.
fn layout(node: &TestNode, table: u32) -> (Vec<String>, Vec<String>) {
    let mut rules = Vec::new();
    for fam in ["-4", "-6"] {
        rules.extend(
            lines(&node.ip(&[fam, "rule", "show"]))
                .into_iter()
                .filter(|l| {
                    l.starts_with("10:") || l.starts_with("512:") || l.starts_with("1536:")
                }),
        );
    }
    let routes = lines(&node.ip(&["route", "show", "table", &table.to_string()]));
    (rules, routes)
}

/// `count` pings from `pod_ns` to `b`'s gateway succeed, and the fabric counted at least that
/// many requests arriving tagged on `tport.<vlan>` from `b`'s address.
fn pings_through_vlan(fabric: &PodNs, pod_ns: &str, b: &Branch, count: u32, what: &str) {
    must_ns(
        &fabric.name,
        &format!(
            "iptables -w -A INPUT -i tport.{} -s {} -p icmp -j ACCEPT",
            b.vlan, b.ip
        ),
    );
    let ping = netns_sh(
        pod_ns,
        &format!("busybox ping -c {count} -W 2 -i 0.2 {}", b.gateway),
    );
    assert!(
        ping.status.success(),
        "{what} -> gateway through vlan {}: {}{}",
        b.vlan,
        String::from_utf8_lossy(&ping.stdout),
        String::from_utf8_lossy(&ping.stderr)
    );
    let counted = must_ns(&fabric.name, "iptables -w -L INPUT -v -n -x");
    let from_pod: u64 = counted
        .lines()
        .find(|l| l.contains("ACCEPT") && l.contains(b.ip))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        from_pod >= u64::from(count),
        "{what}: requests from {} on tport.{}: {counted}",
        b.ip,
        b.vlan
    );
}

fn rx_packets(fabric: &PodNs, link: &str) -> u64 {
    let out = must_ns(&fabric.name, &format!("ip -s -j link show {link}"));
    let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j");
    v[0]["stats64"]["rx"]["packets"].as_u64().unwrap_or(0)
}

fn branch_pod(mode: &str, pod: &str, b: &Branch) {
    let mut node = TestNode::new(&format!("sgp{}", &mode[..3]));
    let fabric = node.add_pod_netns("fabric");
    node.ip(&[
        "link",
        "add",
        TRUNK,
        "type",
        "veth",
        "peer",
        "name",
        "tport",
        "netns",
        &fabric.name,
    ]);
    node.ip(&["link", "set", TRUNK, "up"]);
    must_ns(&fabric.name, "ip link set tport up");
    fabric_branch(&fabric, b);
    // The node's primary ENI (`eth0`, 198.18.0.5) on the same fabric, which routes between
    // them as the VPC does: a standard-mode pod's replies to the node leave through the
    // branch ENI and come back to the node through the VPC.
    node.ip(&[
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        "nport",
        "netns",
        &fabric.name,
    ]);
    node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"]);
    node.ip(&["link", "set", "eth0", "up"]);
    must_ns(
        &fabric.name,
        "ip addr add 198.18.0.1/24 dev nport && ip link set nport up && \
         sysctl -qw net.ipv4.ip_forward=1",
    );
    let trunk_index: u32 = node
        .ip(&["-o", "link", "show", TRUNK])
        .split(':')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .expect("trunk ifindex");
    let branch_dir = node.dir().join("branches");
    std::fs::create_dir_all(&branch_dir).expect("branch dir");
    write_annotation(&branch_dir, pod, b, trunk_index);
    let ipamd = node.start_test_ipamd_with(&["--branch-dir", &branch_dir.display().to_string()]);
    let netconf = conflist(node.dir(), &ipamd.socket, mode);
    let pod_ns = node.add_pod_netns("pod");
    let netns = pod_ns.path.display().to_string();

    // ADD through libcni.
    let result: serde_json::Value =
        serde_json::from_str(&cnitool(&node, &netconf, "add", pod, &netns)).expect("result");
    let table = u32::from(b.vlan) + 100;
    let vlan_link = format!("vlan.eth.{}", b.vlan);
    let host_veth = result["interfaces"][0]["name"]
        .as_str()
        .expect("host veth")
        .to_owned();
    let expect_prefix = if mode == "strict" { "vlan" } else { "eni" };
    assert!(host_veth.starts_with(expect_prefix), "{result}");
    assert_eq!(
        result["ips"][0]["address"],
        format!("{}/32", b.ip),
        "{result}"
    );
    assert_eq!(result["ips"][0]["gateway"], b.gateway, "{result}");
    let marker = &result["interfaces"][2];
    assert!(
        marker["name"].as_str().unwrap_or("").starts_with("dummy"),
        "{result}"
    );
    assert_eq!(
        marker["mac"],
        b.vlan.to_string(),
        "the marker carries the VLAN id: {result}"
    );

    // The VLAN link: 802.1Q, the right id, on the trunk, with the branch MAC.
    let v: serde_json::Value =
        serde_json::from_str(&node.ip(&["-d", "-j", "link", "show", &vlan_link])).expect("ip -j");
    assert_eq!(v[0]["linkinfo"]["info_kind"], "vlan", "{v}");
    assert_eq!(v[0]["linkinfo"]["info_data"]["id"], b.vlan, "{v}");
    assert_eq!(v[0]["link"], TRUNK, "{v}");
    assert_eq!(v[0]["address"], b.mac, "{v}");

    // The mode's layout, exactly.
    let (rules, routes) = layout(&node, table);
    let main_route = lines(&node.ip(&["route", "show", b.ip]));
    if mode == "strict" {
        assert_eq!(
            rules,
            [
                format!("10: from all iif {vlan_link} lookup {table}"),
                format!("10: from all iif {host_veth} lookup {table}"),
            ],
            "strict rules"
        );
        assert_eq!(
            routes,
            [
                format!("default via {} dev {vlan_link}", b.gateway),
                format!("{} dev {vlan_link} scope link", b.gateway),
                format!("{} dev {host_veth} scope link", b.ip),
            ],
            "strict table {table}"
        );
        assert!(
            main_route.is_empty(),
            "strict: no main route {main_route:?}"
        );
    } else {
        assert_eq!(
            rules,
            [
                format!("512: from all to {} lookup main", b.ip),
                format!("1536: from {} lookup {table}", b.ip),
            ],
            "standard rules"
        );
        assert_eq!(
            routes,
            [
                format!("default via {} dev {vlan_link}", b.gateway),
                format!("{} dev {vlan_link} scope link", b.gateway),
            ],
            "standard table {table}"
        );
        assert_eq!(main_route, [format!("{} dev {host_veth} scope link", b.ip)]);
    }

    // Traffic: the pod reaches the branch subnet's gateway in the fabric; the requests arrive
    // on the VLAN's sub-interface (tagged with the pod's VLAN) from the pod's address, and the
    // replies come back through the VLAN link.
    let before = rx_packets(&fabric, &format!("tport.{}", b.vlan));
    let untagged_before = rx_packets(&fabric, "tport");
    pings_through_vlan(&fabric, &pod_ns.name, b, 3, "pod");
    assert!(rx_packets(&fabric, &format!("tport.{}", b.vlan)) >= before + 3);
    // The parent counts tagged frames too; nothing beyond them arrives untagged: the IPv4
    // traffic did not leave through the trunk without a tag.
    let untagged = netns_sh(&fabric.name, "ip -4 neigh show dev tport");
    assert!(
        String::from_utf8_lossy(&untagged.stdout).trim().is_empty(),
        "no IPv4 neighbour learned on the untagged port"
    );
    let _ = untagged_before;

    // Node -> pod (kubelet probes): standard mode routes the request through the host veth
    // from main (rule 512), and the pod's reply, addressed to a node-local address, is
    // delivered by the local table (priority 0, before 1536): direct both ways, the branch
    // ENI not crossed. Strict mode has no such route (upstream: the request leaves the node
    // and comes back through the branch ENI, its security group applying).
    let route_get = node
        .command("ip")
        .args(["-4", "route", "get", b.ip, "from", NODE_IP])
        .output()
        .expect("ip");
    let got = String::from_utf8_lossy(&route_get.stdout).into_owned();
    if mode == "strict" {
        assert!(
            !got.contains(&host_veth),
            "strict: node->pod not via the veth: {got}"
        );
    } else {
        assert!(got.contains(&format!("dev {host_veth}")), "standard: {got}");
        must_ns(
            &fabric.name,
            &format!("iptables -w -A FORWARD -s {} -d {NODE_IP} -j ACCEPT", b.ip),
        );
        let probe = node
            .command("busybox")
            .args(["ping", "-c", "2", "-W", "2", "-I", NODE_IP, b.ip])
            .output()
            .expect("ping");
        assert!(
            probe.status.success(),
            "standard: node -> pod: {}{}",
            String::from_utf8_lossy(&probe.stdout),
            String::from_utf8_lossy(&probe.stderr)
        );
        let forwarded = must_ns(&fabric.name, "iptables -w -L FORWARD -v -n -x");
        let through_vpc: u64 = forwarded
            .lines()
            .find(|l| l.contains("ACCEPT") && l.contains(NODE_IP))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("the FORWARD counter");
        assert_eq!(
            through_vpc, 0,
            "standard: replies to the node stay on the node: {forwarded}"
        );
    }

    // CHECK through libcni (the cached result as prevResult).
    cnitool(&node, &netconf, "check", pod, &netns);
    // Drift: the VLAN link down is reported.
    node.ip(&["link", "set", &vlan_link, "down"]);
    let conf_one = serde_json::json!({
        "cniVersion": "1.0.0", "name": "aws-cni", "type": "aws-cni", "mtu": "9001",
        "vethPrefix": "eni", "podSGEnforcingMode": mode, "ipamdSocket": ipamd.socket,
        "pluginLogFile": node.dir().join("plugin.log"), "pluginLogLevel": "Debug",
        "prevResult": result,
    })
    .to_string();
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}");
    let mut check = CniCall::new(
        "CHECK",
        &format!("sandbox-{pod}"),
        Some(pod_ns.path.clone()),
        conf_one.clone(),
    );
    check.args = args.clone();
    let out = node.cni(&check);
    assert_ne!(out.code, 0, "CHECK with the VLAN link down");
    assert!(
        out.stdout.contains(&format!("{vlan_link} is down")),
        "{}",
        out.stdout
    );
    node.ip(&["link", "set", &vlan_link, "up"]);

    // DEL without netns: nothing is touched (upstream: the VLAN id may be another pod's).
    let mut del = CniCall::new("DEL", &format!("sandbox-{pod}"), None, conf_one);
    del.args = args;
    let out = node.cni(&del);
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert!(node.ip(&["link", "show", &vlan_link]).contains(&vlan_link));

    // The annotation changes (another VLAN) before the runtime's DEL: teardown follows
    // prevResult's VLAN id.
    let other = Branch {
        vlan: b.vlan + 20,
        ..*b
    };
    write_annotation(&branch_dir, pod, &other, trunk_index);
    cnitool(&node, &netconf, "del", pod, &netns);
    cnitool(&node, &netconf, "del", pod, &netns);

    let (rules, routes) = layout(&node, table);
    assert_eq!(rules, Vec::<String>::new(), "rules left");
    assert_eq!(routes, Vec::<String>::new(), "table {table} left");
    let links = lines(&node.ip(&["-o", "link", "show"]));
    assert!(
        !links
            .iter()
            .any(|l| l.contains("vlan.eth.") || l.contains(&host_veth)),
        "links left: {links:?}"
    );
    assert!(lines(&node.ip(&["route", "show", b.ip])).is_empty());
}

/// `cnitool` in the test node.
fn cnitool(
    node: &TestNode,
    netconf: &std::path::Path,
    action: &str,
    pod: &str,
    netns: &str,
) -> String {
    sgp_common::cnitool(
        |bin| node.command(bin),
        node.dir(),
        netconf,
        action,
        pod,
        netns,
    )
}

/// An IPv6 cluster's branch pod (ipamd answers the branch's IPv6 address and the VPC router
/// `fe80:ec2::1` as `PodENISubnetGW`): the pod's /128 through `vlan.eth.N`, table `N+100`
/// routing via `fe80:ec2::1` on the VLAN link, and the pod pinging the branch subnet's router
/// address in the fabric and back, per mode. Strict mode's node set-up is ipamd's
/// (`lookup local` moved to 20); without upstream's ICMPv6 gateway rule the router's neighbour
/// advertisements arriving on the VLAN link are looked up in the VLAN table and the pod's
/// traffic never leaves (checked), with it the ping passes.
fn ipv6_branch_pod(mode: &str) {
    const VLAN: u16 = 7;
    const MAC: &str = "02:aa:00:00:00:07";
    const POD_IP: &str = "2001:db8:8::5";
    const FABRIC_IP: &str = "2001:db8:8::1";
    let pod = format!("v6-{mode}");
    let mut node = TestNode::new(&format!("sg6{}", &mode[..3]));
    let fabric = node.add_pod_netns("fabric");
    node.sysctl("net/ipv6/conf/all/disable_ipv6", "0");
    node.ip(&[
        "link",
        "add",
        TRUNK,
        "type",
        "veth",
        "peer",
        "name",
        "tport",
        "netns",
        &fabric.name,
    ]);
    node.ip(&["link", "set", TRUNK, "up"]);
    must_ns(
        &fabric.name,
        &format!(
            "sysctl -qw net.ipv6.conf.all.disable_ipv6=0 && ip link set tport up && \
             ip link add link tport name tport.{VLAN} type vlan id {VLAN} && \
             ip link set tport.{VLAN} up && \
             ip addr add fe80:ec2::1/64 dev tport.{VLAN} nodad && \
             ip addr add {FABRIC_IP}/64 dev tport.{VLAN} nodad && \
             ip neigh replace {POD_IP} lladdr {MAC} dev tport.{VLAN} nud permanent"
        ),
    );
    let trunk_index: u32 = node
        .ip(&["-o", "link", "show", TRUNK])
        .split(':')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .expect("trunk ifindex");
    let branch_dir = node.dir().join("branches");
    std::fs::create_dir_all(&branch_dir).expect("branch dir");
    let body = serde_json::json!({
        "annotation": [{
            "eniId": format!("eni-branch{VLAN}"), "ifAddress": MAC, "privateIp": "",
            "ipv6Addr": POD_IP, "vlanID": VLAN, "subnetCidr": "198.18.8.0/24",
            "subnetV6Cidr": "2001:db8:8::/64",
        }],
        "parentIfIndex": trunk_index,
    });
    std::fs::write(
        branch_dir.join(format!("default_{pod}.json")),
        body.to_string(),
    )
    .expect("annotation");
    let ipamd =
        node.start_test_ipamd_with(&["--ipv6", "--branch-dir", &branch_dir.display().to_string()]);
    let netconf = conflist(node.dir(), &ipamd.socket, mode);
    let pod_ns = node.add_pod_netns("pod");
    let netns = pod_ns.path.display().to_string();
    if mode == "strict" {
        // ipamd's strict node set-up (host::node::plan_local_rule), without the gateway rule.
        node.ip(&["-6", "rule", "add", "pref", "20", "lookup", "local"]);
        node.ip(&["-6", "rule", "del", "pref", "0", "lookup", "local"]);
    }

    let result: serde_json::Value =
        serde_json::from_str(&cnitool(&node, &netconf, "add", &pod, &netns)).expect("result");
    assert_eq!(
        result["ips"][0]["address"],
        format!("{POD_IP}/128"),
        "{result}"
    );
    assert_eq!(result["ips"][0]["gateway"], "fe80:ec2::1", "{result}");
    let host_veth = result["interfaces"][0]["name"]
        .as_str()
        .expect("host veth")
        .to_owned();
    let vlan_link = format!("vlan.eth.{VLAN}");
    let table = (u32::from(VLAN) + 100).to_string();
    let v: serde_json::Value =
        serde_json::from_str(&node.ip(&["-d", "-j", "link", "show", &vlan_link])).expect("ip -j");
    assert_eq!(v[0]["linkinfo"]["info_data"]["id"], VLAN, "{v}");
    assert_eq!(v[0]["address"], MAC, "{v}");
    let rules = lines(&node.ip(&["-6", "rule", "show"]));
    let routes = lines(&node.ip(&["-6", "route", "show", "table", &table]));
    assert!(
        routes
            .iter()
            .any(|r| r.starts_with("default via fe80:ec2::1 dev vlan.eth.7"))
            && routes
                .iter()
                .any(|r| r.starts_with("fe80:ec2::1 dev vlan.eth.7")),
        "{mode}: table {table}: {routes:?}"
    );
    if mode == "strict" {
        for iif in [&vlan_link, &host_veth] {
            assert!(
                rules.contains(&format!("10: from all iif {iif} lookup {table}")),
                "{rules:?}"
            );
        }
        assert!(
            routes
                .iter()
                .any(|r| r.starts_with(&format!("{POD_IP} dev {host_veth}"))),
            "{routes:?}"
        );
    } else {
        assert!(
            rules.contains(&format!("512: from all to {POD_IP} lookup main"))
                && rules.contains(&format!("1536: from {POD_IP} lookup {table}")),
            "{rules:?}"
        );
    }
    let ping = |count: &str| {
        netns_sh(
            &pod_ns.name,
            &format!("busybox ping -6 -c {count} -W 3 -i 0.3 {FABRIC_IP}"),
        )
    };
    if mode == "strict" {
        let without = ping("2");
        assert!(
            !without.status.success(),
            "strict IPv6 without the gateway rule: the router's answers go to the VLAN table"
        );
        // upstream's createIPv6GatewayRule (ipamd: host::node::ipv6_gateway_rule)
        node.ip(&[
            "-6",
            "rule",
            "add",
            "pref",
            "0",
            "from",
            "fe80:ec2::1",
            "ipproto",
            "ipv6-icmp",
            "lookup",
            "local",
        ]);
        let _ = node
            .command("ip")
            .args(["-6", "neigh", "flush", "dev", &vlan_link])
            .output();
    }
    let out = ping("3");
    assert!(
        out.status.success(),
        "{mode}: pod -> {FABRIC_IP} through vlan {VLAN}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    cnitool(&node, &netconf, "check", &pod, &netns);
    cnitool(&node, &netconf, "del", &pod, &netns);
    assert!(
        !node.ip(&["-o", "link", "show"]).contains("vlan.eth."),
        "{mode}: VLAN link left"
    );
    let left = lines(&node.ip(&["-6", "rule", "show"]));
    assert!(
        !left
            .iter()
            .any(|l| l.contains(POD_IP) || l.contains(&host_veth) || l.contains(&vlan_link)),
        "{mode}: {left:?}"
    );
}

/// One sandbox of pod `default/<pod>` through the plugin directly (as kubelet's runtime calls
/// it): `command` in sandbox `cid` with netns `netns`, the one-plugin netconf of `mode` with
/// `prev` as prevResult. Returns the result (ADD) or panics with the plugin's output.
fn sandbox_call(
    node: &TestNode,
    socket: &std::path::Path,
    mode: &str,
    (command, cid, netns): (&str, &str, &PodNs),
    pod: &str,
    prev: Option<&serde_json::Value>,
) -> serde_json::Value {
    let mut conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "aws-cni", "type": "aws-cni", "mtu": "9001",
        "vethPrefix": "eni", "podSGEnforcingMode": mode, "ipamdSocket": socket,
        "pluginLogFile": node.dir().join("plugin.log"), "pluginLogLevel": "Debug",
    });
    if let Some(prev) = prev {
        conf["prevResult"] = prev.clone();
    }
    let mut call = CniCall::new(command, cid, Some(netns.path.clone()), conf.to_string());
    call.args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}");
    let out = node.cni(&call);
    assert_eq!(
        out.code,
        0,
        "{command} {cid}: {}{}\n{}",
        out.stdout,
        out.stderr,
        std::fs::read_to_string(node.dir().join("plugin.log")).unwrap_or_default()
    );
    if command == "ADD" {
        serde_json::from_str(&out.stdout).expect("result")
    } else {
        serde_json::Value::Null
    }
}

/// Issue 38, H5 and H6: a StatefulSet pod `web` is deleted and re-created under its name
/// before its old sandbox's DEL reaches the plugin. The new sandbox is wired on the same veth
/// name (derived from the pod's namespace and name); in `same_vlan` the controller reused the
/// VLAN id for the new branch ENI (another MAC and address), otherwise it gave the old address
/// to the new branch on another VLAN. The late DEL of the old sandbox (its netns still there,
/// its prevResult naming its VLAN and address) must leave every object of the new sandbox
/// alone: VLAN link, rules at 10 or 512/1536, routes; and the new pod still reaches its
/// branch subnet through its own VLAN (its egress never through the node's eth0, outside its
/// security groups). The old code took the rules naming the veth name (H5) and prevResult's
/// address (H6) for its own and deleted them.
fn late_del_of_an_old_sandbox(mode: &str, same_vlan: bool) {
    let mut node = TestNode::new(&format!("late{}{}", &mode[..3], u8::from(same_vlan)));
    let fabric = node.add_pod_netns("fabric");
    node.ip(&[
        "link",
        "add",
        TRUNK,
        "type",
        "veth",
        "peer",
        "name",
        "tport",
        "netns",
        &fabric.name,
    ]);
    node.ip(&["link", "set", TRUNK, "up"]);
    must_ns(&fabric.name, "ip link set tport up");
    let trunk_index: u32 = node
        .ip(&["-o", "link", "show", TRUNK])
        .split(':')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .expect("trunk ifindex");
    let old = Branch {
        vlan: 5,
        ip: "198.18.8.10",
        subnet: "198.18.8.0/24",
        gateway: "198.18.8.1",
        mac: "02:aa:00:00:00:05",
    };
    let new = if same_vlan {
        Branch {
            ip: "198.18.8.11",
            mac: "02:aa:00:00:01:05",
            ..old
        }
    } else {
        Branch {
            vlan: 7,
            mac: "02:aa:00:00:00:07",
            ..old
        }
    };
    let branch_dir = node.dir().join("branches");
    std::fs::create_dir_all(&branch_dir).expect("branch dir");
    write_annotation(&branch_dir, "web", &old, trunk_index);
    let ipamd = node.start_test_ipamd_with(&["--branch-dir", &branch_dir.display().to_string()]);
    let old_ns = node.add_pod_netns("old");
    let new_ns = node.add_pod_netns("new");

    let old_result = sandbox_call(
        &node,
        &ipamd.socket,
        mode,
        ("ADD", "sandbox-old", &old_ns),
        "web",
        None,
    );
    // Re-created: the controller's new branch ENI, the fabric's side of it.
    write_annotation(&branch_dir, "web", &new, trunk_index);
    if same_vlan {
        must_ns(
            &fabric.name,
            &format!(
                "ip link add link tport name tport.5 type vlan id 5 && \
                 ip addr add 198.18.8.1/24 dev tport.5 && ip link set tport.5 up && \
                 ip neigh replace {} lladdr {} dev tport.5 nud permanent",
                new.ip, new.mac
            ),
        );
    } else {
        fabric_branch(&fabric, &new);
    }
    let new_result = sandbox_call(
        &node,
        &ipamd.socket,
        mode,
        ("ADD", "sandbox-new", &new_ns),
        "web",
        None,
    );
    let veth = new_result["interfaces"][0]["name"]
        .as_str()
        .expect("veth")
        .to_owned();
    assert_eq!(
        old_result["interfaces"][0]["name"],
        veth.as_str(),
        "same veth name"
    );
    let table = u32::from(new.vlan) + 100;
    let vlan_link = format!("vlan.eth.{}", new.vlan);
    let before = layout(&node, table);
    // The VLAN link's identity: the same link (index), MAC and id, whatever its operstate.
    let vlan_identity = |node: &TestNode| {
        let v: serde_json::Value =
            serde_json::from_str(&node.ip(&["-d", "-j", "link", "show", &vlan_link]))
                .expect("ip -j");
        (
            v[0]["ifindex"].clone(),
            v[0]["address"].clone(),
            v[0]["linkinfo"]["info_data"]["id"].clone(),
        )
    };
    let link_before = vlan_identity(&node);
    assert_eq!(link_before.1, new.mac, "{link_before:?}");

    // The old sandbox's DEL, late: its netns is still there (its interface went with its host
    // veth when the new sandbox took the name).
    sandbox_call(
        &node,
        &ipamd.socket,
        mode,
        ("DEL", "sandbox-old", &old_ns),
        "web",
        Some(&old_result),
    );
    assert_eq!(
        vlan_identity(&node),
        link_before,
        "{mode}: the new sandbox's {vlan_link} is kept"
    );
    assert_eq!(
        layout(&node, table),
        before,
        "{mode}: the new sandbox's rules and table {table} are kept"
    );
    let (rules, _) = &before;
    if mode == "strict" {
        assert!(
            rules.contains(&format!("10: from all iif {veth} lookup {table}")),
            "{rules:?}"
        );
    } else {
        assert!(
            rules.contains(&format!("1536: from {} lookup {table}", new.ip)),
            "{rules:?}"
        );
    }
    // The new pod still leaves through its own VLAN: its requests arrive tagged on
    // tport.<vlan>, from its address.
    pings_through_vlan(&fabric, &new_ns.name, &new, 2, &format!("{mode}: new pod"));

    // The new sandbox's own DEL takes everything of it.
    sandbox_call(
        &node,
        &ipamd.socket,
        mode,
        ("DEL", "sandbox-new", &new_ns),
        "web",
        Some(&new_result),
    );
    let (rules, routes) = layout(&node, table);
    let left: Vec<&String> = rules
        .iter()
        .filter(|r| r.contains(new.ip) || r.contains(&format!("lookup {table}")))
        .collect();
    assert!(
        left.is_empty() && routes.is_empty(),
        "{mode}: {left:?} {routes:?}"
    );
    assert!(!node.ip(&["-o", "link", "show"]).contains(&vlan_link));
}

#[cfg(test)]
mod vm {
    use super::*;

    /// Every test of `inside`, in one VM (`integration::vm::in_one_vm`).
    #[test]
    fn branch_pods_in_one_vm() {
        integration::vm::in_one_vm(
            "sgp_branch_vm::vm::inside::",
            MODULES,
            std::time::Duration::from_secs(1800),
            prepare,
        );
    }

    mod inside {
        use super::super::*;

        #[test]
        #[ignore = "runs in the test VM: sgp_branch_vm::vm::branch_pods_in_one_vm"]
        fn strict_mode_branch_pod_through_its_vlan() {
            integration::vm::assert_inside();
            branch_pod(
                "strict",
                "sg-strict",
                &Branch {
                    vlan: 5,
                    ip: "198.18.8.10",
                    subnet: "198.18.8.0/24",
                    gateway: "198.18.8.1",
                    mac: "02:aa:00:00:00:05",
                },
            );
        }

        #[test]
        #[ignore = "runs in the test VM: sgp_branch_vm::vm::branch_pods_in_one_vm"]
        fn standard_mode_branch_pod_through_its_vlan() {
            integration::vm::assert_inside();
            branch_pod(
                "standard",
                "sg-standard",
                &Branch {
                    vlan: 6,
                    ip: "198.18.9.10",
                    subnet: "198.18.9.0/24",
                    gateway: "198.18.9.1",
                    mac: "02:aa:00:00:00:06",
                },
            );
        }

        /// H5: same VLAN id reused, strict mode (rules by `iif`).
        #[test]
        #[ignore = "runs in the test VM: sgp_branch_vm::vm::branch_pods_in_one_vm"]
        fn late_del_of_an_old_strict_sandbox_keeps_the_recreated_pods_vlan() {
            integration::vm::assert_inside();
            late_del_of_an_old_sandbox("strict", true);
        }

        /// H5 in standard mode: same VLAN id reused (`from` rule to the reused table).
        #[test]
        #[ignore = "runs in the test VM: sgp_branch_vm::vm::branch_pods_in_one_vm"]
        fn late_del_of_an_old_standard_sandbox_keeps_the_recreated_pods_vlan() {
            integration::vm::assert_inside();
            late_del_of_an_old_sandbox("standard", true);
        }

        /// H6: the old address given to the re-created pod on another VLAN, standard mode (its
        /// 512/1536 rules name the address prevResult names).
        #[test]
        #[ignore = "runs in the test VM: sgp_branch_vm::vm::branch_pods_in_one_vm"]
        fn late_del_of_an_old_sandbox_keeps_the_rules_of_its_address_now_anothers() {
            integration::vm::assert_inside();
            late_del_of_an_old_sandbox("standard", false);
        }

        #[test]
        #[ignore = "runs in the test VM: sgp_branch_vm::vm::branch_pods_in_one_vm"]
        fn strict_mode_ipv6_branch_pod() {
            integration::vm::assert_inside();
            ipv6_branch_pod("strict");
        }

        #[test]
        #[ignore = "runs in the test VM: sgp_branch_vm::vm::branch_pods_in_one_vm"]
        fn standard_mode_ipv6_branch_pod() {
            integration::vm::assert_inside();
            ipv6_branch_pod("standard");
        }
    }
}
