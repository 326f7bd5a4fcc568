//! Security groups for pods, the simulated VPC's half (issue 27 item 3): the vpcsim fabric built
//! from a hand-made `FabricView` with a trunk ENI carrying two branch ENIs in different
//! security groups, on a kernel with 802.1Q (the test VM, `integration::vm`). From the node's
//! trunk link (`eth1` in the node namespace) each branch is a VLAN sub-interface with the
//! branch's MAC and address, moved into its own "pod" namespace; a second instance is a host in
//! the VPC. Checked: the router's branch ports (VLAN id on the trunk's port), tagged traffic
//! reaching the router and the replies coming back only for flows the groups allow (ingress by
//! group membership and by CIDR, egress by group, stateful replies with no ingress rule),
//! denied flows dropped by the branch's chain in the router, and a removed branch taking its
//! VLAN port and chains with it.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use integration::TestNode;

use crate::sgp_common::{Branch, cnitool, conflist, write_annotation};
use vpcsim::fabric::names::{branch_port, eni_port};
use vpcsim::fabric::{Fabric, FabricConfig, FabricWorld};
use vpcsim::view::{
    BranchView, EniView, FabricView, InstanceView, SecurityGroupView, SgRuleView, SubnetView,
};

const MODULES: &[&str] = &["8021q", "veth"];
const WEB: Branch = Branch {
    vlan: 5,
    ip: WEB_IP,
    subnet: "198.18.16.0/20",
    gateway: "198.18.16.1",
    mac: "02:bb:00:00:00:05",
};
const CLIENT: Branch = Branch {
    vlan: 6,
    ip: CLIENT_IP,
    subnet: "198.18.16.0/20",
    gateway: "198.18.16.1",
    mac: "02:bb:00:00:00:06",
};
const NODE: &str = "i-0000000000000node";
const HOST: &str = "i-0000000000000host";
const HOST_IP: &str = "198.18.0.20";
const NODE_IP: &str = "198.18.0.10";
const WEB_IP: &str = "198.18.16.5";
const CLIENT_IP: &str = "198.18.16.6";
const TRUNK_ENI: &str = "eni-0000000000a101";
const WEB_ENI: &str = "eni-00000000000b05";
const CLIENT_ENI: &str = "eni-00000000000b06";

/// A world that is only a view the test edits.
struct HandMade(Mutex<FabricView>);

impl FabricWorld for HandMade {
    fn fabric_view(&self) -> FabricView {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
    fn imds_router(&self, _instance_id: &str) -> axum::Router {
        axum::Router::new()
    }
    fn ec2_router(&self) -> axum::Router {
        axum::Router::new()
    }
}

fn eni(id: &str, index: u32, ip: &str, mac: &str, groups: &[&str]) -> EniView {
    EniView {
        eni_id: id.into(),
        device_index: index,
        network_card_index: 0,
        mac: mac.into(),
        primary_ip: ip.parse().expect("ip"),
        secondary_ips: Vec::new(),
        ipv4_prefixes: Vec::new(),
        ipv6_addresses: Vec::new(),
        ipv6_prefixes: Vec::new(),
        subnet_id: "subnet-nodes".into(),
        subnet_cidr: "198.18.0.0/20".parse().expect("cidr"),
        subnet_ipv6_cidr: None,
        security_groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        source_dest_check: true,
        interface_type: "interface".into(),
        branches: Vec::new(),
    }
}

fn branch(id: &str, vlan: u16, ip: &str, group: &str) -> BranchView {
    BranchView {
        eni_id: id.into(),
        vlan_id: vlan,
        mac: format!("02:bb:00:00:00:{vlan:02x}"),
        primary_ip: ip.parse().expect("ip"),
        ipv6_addresses: Vec::new(),
        subnet_id: "subnet-pods".into(),
        subnet_cidr: "198.18.16.0/20".parse().expect("cidr"),
        subnet_ipv6_cidr: None,
        security_groups: vec![group.to_owned()],
    }
}

fn rule(protocol: &str, ports: Option<(i32, i32)>, cidrs: &[&str], groups: &[&str]) -> SgRuleView {
    SgRuleView {
        protocol: protocol.into(),
        from_port: ports.map(|p| p.0),
        to_port: ports.map(|p| p.1),
        cidrs: cidrs.iter().map(|c| c.parse().expect("cidr")).collect(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
    }
}

/// The node (primary ENI in `sg-node`, trunk ENI `eth1` with branch 5 in `sg-web` and branch
/// 6 in `sg-client`) and a host (`sg-host`). `sg-web`: HTTP in from `sg-client`, ping in from
/// `sg-host`, anything out to the VPC. `sg-client`: nothing in, HTTP out to `sg-web` only.
fn view() -> FabricView {
    let mut trunk = eni(
        TRUNK_ENI,
        1,
        "198.18.0.11",
        "02:00:00:00:a1:01",
        &["sg-node"],
    );
    trunk.interface_type = "trunk".into();
    trunk.branches = vec![
        branch(WEB_ENI, 5, WEB_IP, "sg-web"),
        branch(CLIENT_ENI, 6, CLIENT_IP, "sg-client"),
    ];
    let subnet = |id: &str, cidr: &str, gw: [u8; 4]| SubnetView {
        subnet_id: id.into(),
        cidr: cidr.parse().expect("cidr"),
        gateway: Ipv4Addr::from(gw),
        ipv6_cidr: None,
        availability_zone: "us-west-2a".into(),
    };
    let instance = |id: &str, enis: Vec<EniView>| InstanceView {
        instance_id: id.into(),
        instance_type: "m5.large".into(),
        availability_zone: "us-west-2a".into(),
        running: true,
        enis,
    };
    FabricView {
        eni_groups_enforced: false,
        vpc_id: "vpc-sgp".into(),
        vpc_cidr: "198.18.0.0/16".parse().expect("cidr"),
        vpc_cidrs: vec!["198.18.0.0/16".parse().expect("cidr")],
        vpc_ipv6_cidr: None,
        region: "us-west-2".into(),
        availability_zone: "us-west-2a".into(),
        subnets: vec![
            subnet("subnet-nodes", "198.18.0.0/20", [198, 18, 0, 1]),
            subnet("subnet-pods", "198.18.16.0/20", [198, 18, 16, 1]),
        ],
        instances: vec![
            instance(
                NODE,
                vec![
                    eni(
                        "eni-0000000000a100",
                        0,
                        NODE_IP,
                        "02:00:00:00:a1:00",
                        &["sg-node"],
                    ),
                    trunk,
                ],
            ),
            instance(
                HOST,
                vec![eni(
                    "eni-0000000000a200",
                    0,
                    HOST_IP,
                    "02:00:00:00:a2:00",
                    &["sg-host"],
                )],
            ),
        ],
        security_groups: vec![
            SecurityGroupView {
                group_id: "sg-web".into(),
                ingress: vec![
                    rule("tcp", Some((80, 80)), &[], &["sg-client"]),
                    rule("icmp", Some((-1, -1)), &[], &["sg-host"]),
                ],
                egress: vec![rule("-1", None, &["198.18.0.0/16"], &[])],
            },
            SecurityGroupView {
                group_id: "sg-client".into(),
                ingress: Vec::new(),
                egress: vec![rule("tcp", Some((80, 80)), &[], &["sg-web"])],
            },
        ],
    }
}

fn in_ns(ns: &str, script: &str) -> Output {
    integration::supervisor::netns_exec(ns, "sh")
        .args(["-c", script])
        .output()
        .expect("sh in the namespace")
}

fn must(ns: &str, script: &str) -> String {
    let out = in_ns(ns, script);
    assert!(
        out.status.success(),
        "{ns}: {script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ping(ns: &str, dst: &str) -> bool {
    in_ns(ns, &format!("busybox ping -c 2 -W 2 -i 0.3 {dst}"))
        .status
        .success()
}

/// Packet counters of the router's rules, `chain -> [(packets, rule text)]`.
fn counters(router: &str) -> BTreeMap<String, Vec<(u64, String)>> {
    let mut out: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    let save = must(router, "iptables-save -c -t filter");
    for line in save.lines() {
        // [packets:bytes] -A chain ...
        let Some(rest) = line.strip_prefix('[') else {
            continue;
        };
        let Some((count, rule)) = rest.split_once("] ") else {
            continue;
        };
        let packets = count
            .split(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let chain = rule
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        out.entry(chain)
            .or_default()
            .push((packets, rule.to_owned()));
    }
    out
}

fn drops(router: &str, chain: &str) -> u64 {
    counters(router)
        .get(chain)
        .and_then(|rules| rules.iter().find(|(_, r)| r.ends_with("-j DROP")))
        .map_or(0, |(n, _)| *n)
}

/// A branch pod as the plugin would make it: a VLAN on the trunk link with the branch's MAC,
/// moved into the pod's namespace, the branch's address, default via the subnet's gateway.
fn branch_pod(node_ns: &str, pod_ns: &str, vlan: u16, ip: &str) {
    must(
        node_ns,
        &format!(
            "ip link set eth1 up && \
             ip link add link eth1 name b{vlan} address 02:bb:00:00:00:{vlan:02x} type vlan id {vlan} && \
             ip link set b{vlan} netns {pod_ns}"
        ),
    );
    must(
        pod_ns,
        &format!(
            "ip link set lo up && ip addr add {ip}/20 dev b{vlan} && ip link set b{vlan} up && \
             ip route add default via 198.18.16.1 dev b{vlan}"
        ),
    );
}

fn trunk_and_branches() {
    let world = Arc::new(HandMade(Mutex::new(view())));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let fabric = Fabric::start(world.clone(), rt.handle().clone(), &FabricConfig::default())
        .expect("fabric");
    let names = fabric.names().clone();
    let router = names.router_ns();
    let node_ns = names.node_ns(NODE);
    let host_ns = names.node_ns(HOST);

    // The router's side of the trunk: one VLAN per branch on the trunk's port.
    let links: serde_json::Value =
        serde_json::from_str(&must(&router, "ip -d -j link show")).expect("ip -j");
    let vlans: BTreeMap<String, (String, u64)> = links
        .as_array()
        .expect("links")
        .iter()
        .filter(|l| l["linkinfo"]["info_kind"] == "vlan")
        .map(|l| {
            (
                l["ifname"].as_str().unwrap_or_default().to_owned(),
                (
                    l["link"].as_str().unwrap_or_default().to_owned(),
                    l["linkinfo"]["info_data"]["id"].as_u64().unwrap_or(0),
                ),
            )
        })
        .collect();
    let trunk_port = eni_port(TRUNK_ENI);
    let (web_port, client_port) = (branch_port(WEB_ENI), branch_port(CLIENT_ENI));
    let (in_web, in_client) = (format!("in-{web_port}"), format!("in-{client_port}"));
    let out_client = format!("out-{client_port}");
    assert_eq!(
        vlans,
        BTreeMap::from([
            (web_port.clone(), (trunk_port.clone(), 5)),
            (client_port.clone(), (trunk_port.clone(), 6)),
        ]),
        "{links}"
    );

    let mut pods = TestNode::new("sgpf");
    let web = pods.add_pod_netns("web");
    let client = pods.add_pod_netns("client");
    branch_pod(&node_ns, &web.name, 5, WEB_IP);
    branch_pod(&node_ns, &client.name, 6, CLIENT_IP);

    // Ingress by group membership: the host (sg-host) pings the web branch; the replies
    // come back through VLAN 5.
    assert!(
        ping(&host_ns, WEB_IP),
        "host -> web (sg-web lets sg-host ping)"
    );
    let c = counters(&router);
    let web_rules = &c[&in_web];
    assert!(
        web_rules
            .iter()
            .any(|(n, r)| *n >= 1 && r.contains(&format!("-s {HOST_IP}/32 -p icmp"))),
        "{web_rules:?}"
    );
    // ... and the node's primary (sg-node) may not.
    let before = drops(&router, &in_web);
    assert!(!ping(&node_ns, WEB_IP), "node -> web: sg-node not allowed");
    assert!(drops(&router, &in_web) >= before + 2);

    // Default deny: sg-client has no ingress rule.
    let before = drops(&router, &in_client);
    assert!(
        !ping(&host_ns, CLIENT_IP),
        "host -> client: no ingress rule"
    );
    assert!(drops(&router, &in_client) >= before + 2);

    // Egress by CIDR: web pings the host; stateful replies.
    assert!(ping(&web.name, HOST_IP), "web -> host (egress to the VPC)");

    // Branch to branch: client -> web HTTP passes client's egress (to sg-web) and web's
    // ingress (from sg-client); the replies reach the client, which has no ingress rule:
    // conntrack. Another port is refused by the client's egress.
    let mut server = Command::new("ip")
        .args([
            "netns",
            "exec",
            &web.name,
            "busybox",
            "nc",
            "-ll",
            "-p",
            "80",
            "-e",
            "echo",
            "hello-from-web",
        ])
        .spawn()
        .expect("nc server");
    let answer = (0..20)
        .map(|_| {
            std::thread::sleep(std::time::Duration::from_millis(200));
            in_ns(
                &client.name,
                &format!("busybox nc -w 3 {WEB_IP} 80 </dev/null"),
            )
        })
        .find(|o| o.status.success());
    let answer = answer.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let before = drops(&router, &out_client);
    let other_port = in_ns(
        &client.name,
        &format!("busybox nc -w 2 {WEB_IP} 81 </dev/null"),
    );
    let egress_drops = drops(&router, &out_client) - before;
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(answer.as_deref().map(str::trim), Some("hello-from-web"));
    assert!(!other_port.status.success(), "client -> web:81 refused");
    assert!(
        egress_drops >= 1,
        "the SYN to :81 dropped by the client's egress"
    );

    // Egress by group: sg-client may not ping the host.
    let before = drops(&router, &out_client);
    assert!(
        !ping(&client.name, HOST_IP),
        "client -> host: egress HTTP to sg-web only"
    );
    assert!(drops(&router, &out_client) >= before + 2);

    // Nothing of the branches leaked untagged: the router learnt no neighbour for a branch
    // address on the trunk's own port.
    let untagged = must(&router, &format!("ip -4 neigh show dev {trunk_port}"));
    assert!(
        !untagged.contains(WEB_IP) && !untagged.contains(CLIENT_IP),
        "{untagged}"
    );

    // The client's branch goes (the controller deleted it): its VLAN port, route and chains
    // go with it; the web branch keeps working.
    {
        let mut v = world
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        v.instances[0].enis[1].branches.retain(|b| b.vlan_id != 6);
    }
    fabric.converge().expect("converge");
    let links = must(&router, "ip -o link show");
    assert!(!links.contains(&client_port), "{links}");
    assert!(links.contains(&web_port), "{links}");
    assert!(!counters(&router).contains_key(&in_client));
    assert!(
        must(&router, &format!("ip route show {CLIENT_IP}"))
            .trim()
            .is_empty()
    );
    assert!(
        ping(&host_ns, WEB_IP),
        "host -> web after the other branch left"
    );
    assert_eq!(fabric.converge().expect("converge"), 0, "converged");

    drop(pods);
    let errors = fabric.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}

/// `nc` to `ip:port` from namespace `ns` answered by a server started there before.
fn http(ns: &str, ip: &str, port: u16) -> Option<String> {
    let out = in_ns(ns, &format!("busybox nc -w 3 {ip} {port} </dev/null"));
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The plugin's branch datapath on the fabric's node: the trunk ENI's link (`eth1`, up, as
/// ipamd leaves it), `test-ipamd` answering from the pods' annotations, `cnitool` ADD of the web
/// (VLAN 5, `sg-web`) and client (VLAN 6, `sg-client`) pods in `mode`, then what their groups
/// allow and deny end to end, per mode where upstream differs, and DEL leaving no VLAN.
fn plugin_pods_on_the_fabric(mode: &str) {
    let world = Arc::new(HandMade(Mutex::new(view())));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let fabric =
        Fabric::start(world, rt.handle().clone(), &FabricConfig::default()).expect("fabric");
    let names = fabric.names().clone();
    let router = names.router_ns();
    let node_ns = names.node_ns(NODE);
    let host_ns = names.node_ns(HOST);
    let (in_web, in_client) = (
        format!("in-{}", branch_port(WEB_ENI)),
        format!("in-{}", branch_port(CLIENT_ENI)),
    );
    let out_client = format!("out-{}", branch_port(CLIENT_ENI));

    must(&node_ns, "ip link set eth1 up");
    let trunk_index: u32 = must(&node_ns, "cat /sys/class/net/eth1/ifindex")
        .trim()
        .parse()
        .expect("ifindex");
    let mut holder = TestNode::new("sgpe");
    let branch_dir = holder.dir().join("branches");
    std::fs::create_dir_all(&branch_dir).expect("branch dir");
    write_annotation(&branch_dir, "web", &WEB, trunk_index);
    write_annotation(&branch_dir, "client", &CLIENT, trunk_index);
    let ipamd = holder.start_test_ipamd_with(&["--branch-dir", &branch_dir.display().to_string()]);
    let netconf = conflist(holder.dir(), &ipamd.socket, mode);
    let web = holder.add_pod_netns("web");
    let client = holder.add_pod_netns("client");
    let dir = holder.dir().to_path_buf();
    let in_node = |bin: &std::path::Path| integration::supervisor::netns_exec(&node_ns, bin);
    let (web_path, client_path) = (
        web.path.display().to_string(),
        client.path.display().to_string(),
    );
    cnitool(in_node, &dir, &netconf, "add", "web", &web_path);
    cnitool(in_node, &dir, &netconf, "add", "client", &client_path);

    // web: ping in from sg-host, anything out to the VPC; the replies come back through VLAN 5.
    assert!(ping(&host_ns, WEB_IP), "{mode}: host -> web pod");
    assert!(ping(&web.name, HOST_IP), "{mode}: web pod -> host");
    // client: nothing in, HTTP to sg-web only out; both dropped in the router.
    let (i, o) = (drops(&router, &in_client), drops(&router, &out_client));
    assert!(
        !ping(&host_ns, CLIENT_IP),
        "{mode}: host -> client pod refused"
    );
    assert!(
        !ping(&client.name, HOST_IP),
        "{mode}: client pod -> host refused"
    );
    assert!(
        drops(&router, &in_client) >= i + 2,
        "{mode}: ingress drop counted"
    );
    assert!(
        drops(&router, &out_client) >= o + 2,
        "{mode}: egress drop counted"
    );

    // client -> web on one node: strict sends it through both branch ENIs (client's egress
    // allows :80 only); standard delivers it on the node (rule 512 to main), security groups
    // not applying (upstream's documented pod-to-pod behaviour in standard mode).
    let mut servers: Vec<std::process::Child> = [80u16, 81]
        .iter()
        .map(|port| {
            integration::supervisor::netns_exec(&web.name, "busybox")
                .args(["nc", "-ll", "-p"])
                .arg(port.to_string())
                .args(["-e", "echo", "hello-from-web"])
                .spawn()
                .expect("nc server")
        })
        .collect();
    let on_80 = (0..20).find_map(|_| {
        std::thread::sleep(std::time::Duration::from_millis(200));
        http(&client.name, WEB_IP, 80)
    });
    let on_81 = http(&client.name, WEB_IP, 81);
    // node -> pod (kubelet probes): strict routes it out of the node and back in through the
    // web branch, whose group does not admit sg-node; standard delivers it through the veth.
    let w = drops(&router, &in_web);
    let probe = ping(&node_ns, WEB_IP);
    let probe_drops = drops(&router, &in_web) - w;
    for s in &mut servers {
        let _ = s.kill();
        let _ = s.wait();
    }
    assert_eq!(
        on_80.as_deref(),
        Some("hello-from-web"),
        "{mode}: client -> web:80"
    );
    if mode == "strict" {
        assert_eq!(
            on_81, None,
            "strict: client -> web:81 refused by the client's egress"
        );
        assert!(
            !probe,
            "strict: node -> web pod goes through sg-web, which refuses sg-node"
        );
        assert!(
            probe_drops >= 2,
            "strict: the probe dropped at the web branch"
        );
    } else {
        assert_eq!(
            on_81.as_deref(),
            Some("hello-from-web"),
            "standard: pod to pod on the node bypasses the groups"
        );
        assert!(probe, "standard: node -> web pod through the veth");
        assert_eq!(probe_drops, 0);
    }

    cnitool(in_node, &dir, &netconf, "del", "web", &web_path);
    cnitool(in_node, &dir, &netconf, "del", "client", &client_path);
    let left = must(&node_ns, "ip -o link show; ip rule show");
    assert!(
        !left.contains("vlan.eth."),
        "{mode}: VLAN links left: {left}"
    );
    assert!(!ping(&host_ns, WEB_IP), "{mode}: the web pod is gone");
    drop(holder);
    let errors = fabric.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}

#[cfg(test)]
mod vm {
    /// Every test of `inside`, in one VM (`integration::vm::in_one_vm`).
    #[test]
    fn fabric_pods_in_one_vm() {
        integration::vm::in_one_vm(
            "sgp_fabric_vm::vm::inside::",
            super::MODULES,
            std::time::Duration::from_secs(1800),
            crate::sgp_common::prepare,
        );
    }

    mod inside {
        #[test]
        #[ignore = "runs in the test VM: sgp_fabric_vm::vm::fabric_pods_in_one_vm"]
        fn trunk_branches_enforce_their_security_groups() {
            integration::vm::assert_inside();
            super::super::trunk_and_branches();
        }

        #[test]
        #[ignore = "runs in the test VM: sgp_fabric_vm::vm::fabric_pods_in_one_vm"]
        fn strict_mode_pods_on_the_fabric() {
            integration::vm::assert_inside();
            super::super::plugin_pods_on_the_fabric("strict");
        }

        #[test]
        #[ignore = "runs in the test VM: sgp_fabric_vm::vm::fabric_pods_in_one_vm"]
        fn standard_mode_pods_on_the_fabric() {
            integration::vm::assert_inside();
            super::super::plugin_pods_on_the_fabric("standard");
        }
    }
}
