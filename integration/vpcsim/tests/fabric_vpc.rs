//! The network fabric against the real kernel: a VPC with two nodes in throwaway namespaces,
//! reached from inside a node the way ipamd reaches it (curl to IMDS and the EC2 endpoint,
//! ping / TCP through the VPC router and the IGW). Needs root. Every test removes its
//! namespaces on success and on failure (the `Fabric` drop guard).
#![allow(clippy::tests_outside_test_module)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vpcsim::clock::ManualClock;
use vpcsim::fabric::names::{INTERNET_ECHO_PORT, INTERNET_HOST_ADDR, RunNames};
use vpcsim::fabric::{Fabric, FabricConfig, exec, netns};
use vpcsim::{World, WorldConfig};

/// Serialises fabric starts (each removes crashed runs' namespaces) with the one test that
/// fakes a crashed run, so no start removes the fake while it is being created.
static STARTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Vpc {
    world: Arc<World>,
    clock: Arc<ManualClock>,
    fabric: Fabric,
    nodes: Vec<String>,
}

impl Vpc {
    /// A VPC with `n` m5.large nodes on a manual clock.
    fn up(n: u32) -> Self {
        let _starting = STARTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Self::up_holding_starts(n)
    }

    /// `up` for a caller that already holds `STARTS`.
    fn up_holding_starts(n: u32) -> Self {
        let clock = Arc::new(ManualClock::new());
        let world = World::with_clock(WorldConfig::default(), clock.clone());
        let nodes = world.run_instances("m5.large", n).unwrap();
        Self::start(world, clock, nodes, FabricConfig::default())
    }

    /// A VPC laid out as `cfg`, one m5.large node per subnet id in `node_subnets`.
    fn up_in(cfg: WorldConfig, node_subnets: &[&str], fabric: FabricConfig) -> Self {
        let _starting = STARTS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let clock = Arc::new(ManualClock::new());
        let world = World::with_clock(cfg, clock.clone());
        let nodes = node_subnets
            .iter()
            .map(|cidr| {
                let subnet = subnet_by_cidr(&world, cidr);
                world
                    .mutate(|s, now| {
                        s.run_instances(
                            vpcsim::state::RunInstances {
                                instance_type: "m5.large".into(),
                                subnet_id: Some(subnet.clone()),
                                count: 1,
                                ..Default::default()
                            },
                            now,
                        )
                    })
                    .unwrap()
                    .remove(0)
            })
            .collect();
        Self::start(world, clock, nodes, fabric)
    }

    fn start(
        world: Arc<World>,
        clock: Arc<ManualClock>,
        nodes: Vec<String>,
        config: FabricConfig,
    ) -> Self {
        assert!(
            nix::unistd::Uid::effective().is_root(),
            "fabric tests need root (network namespaces)"
        );
        let rt = tokio::runtime::Handle::current();
        let fabric =
            tokio::task::block_in_place(|| Fabric::start_world(world.clone(), rt, &config))
                .unwrap();
        Self {
            world,
            clock,
            fabric,
            nodes,
        }
    }

    fn names(&self) -> &RunNames {
        self.fabric.names()
    }

    fn ns(&self, node: usize) -> String {
        self.names().node_ns(&self.nodes[node])
    }

    fn view(&self) -> vpcsim::FabricView {
        self.world.fabric_view(self.world.now())
    }

    fn primary_ip(&self, node: usize) -> Ipv4Addr {
        self.view()
            .instance(&self.nodes[node])
            .unwrap()
            .primary()
            .unwrap()
            .primary_ip
    }

    fn converge(&self) {
        tokio::task::block_in_place(|| self.fabric.converge()).unwrap();
    }

    /// Run `program args` inside node `node`.
    fn sh(&self, node: usize, program: &str, args: &[&str]) -> Result<String, exec::ExecError> {
        tokio::task::block_in_place(|| exec::in_netns(&self.ns(node), program, args))
    }

    /// Ping from node `node` (optionally from `src`): true once a ping is answered within 10 s.
    /// A busy machine may lose the first ones: a link just set up drops packets until the
    /// kernel's link watcher (run at most once a second) activates its queue, and ARP
    /// retransmits only once a second, so a fixed count of pings is not enough.
    fn ping(&self, node: usize, src: Option<Ipv4Addr>, dst: Ipv4Addr) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.ping_once(node, src, dst) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// One ping, one second to answer: for asserting that something is dropped.
    fn ping_once(&self, node: usize, src: Option<Ipv4Addr>, dst: Ipv4Addr) -> bool {
        let (src, dst) = (src.map(|s| s.to_string()), dst.to_string());
        let mut args = vec!["ping", "-c", "1", "-W", "1"];
        if let Some(s) = &src {
            args.extend(["-I", s.as_str()]);
        }
        args.push(&dst);
        self.sh(node, "busybox", &args).is_ok()
    }

    /// An EC2 Query API call from inside node `node`, through the in-node EC2 endpoint.
    fn ec2(&self, node: usize, params: &[(&str, &str)]) -> String {
        let mut args = vec![
            "-sS".to_owned(),
            "-m".into(),
            "10".into(),
            "--fail-with-body".into(),
        ];
        for (k, v) in [("Version", "2016-11-15")].iter().chain(params) {
            args.push("--data-urlencode".into());
            args.push(format!("{k}={v}"));
        }
        args.push("http://169.254.169.200/".into());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.sh(node, "curl", &args).unwrap()
    }

    /// IMDSv2 GET of `path` (under /latest/meta-data/) from inside node `node`.
    fn imds(&self, node: usize, path: &str) -> String {
        let token = self
            .sh(
                node,
                "curl",
                &[
                    "-sS",
                    "-m",
                    "5",
                    "--fail",
                    "-X",
                    "PUT",
                    "-H",
                    "x-aws-ec2-metadata-token-ttl-seconds: 60",
                    "http://169.254.169.254/latest/api/token",
                ],
            )
            .unwrap();
        let url = format!("http://169.254.169.254/latest/meta-data/{path}");
        let header = format!("x-aws-ec2-metadata-token: {token}");
        self.sh(
            node,
            "curl",
            &["-sS", "-m", "5", "--fail", "-H", &header, &url],
        )
        .unwrap()
    }

    /// The `ethN` links of node `node` as `(name, mac, up, has IPv4 address)`.
    fn links(&self, node: usize) -> Vec<(String, String, bool, bool)> {
        let out = self.sh(node, "ip", &["-j", "addr", "show"]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .filter(|l| l["ifname"].as_str().unwrap_or_default().starts_with("eth"))
            .map(|l| {
                let flags = l["flags"].as_array().cloned().unwrap_or_default();
                let has_v4 = l["addr_info"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x["family"] == "inet"));
                (
                    l["ifname"].as_str().unwrap().to_owned(),
                    l["address"].as_str().unwrap().to_owned(),
                    flags.iter().any(|f| f == "UP"),
                    has_v4,
                )
            })
            .collect()
    }

    /// Wait (polling, up to 15 s) until `cond` holds; the reconcile loop must get there alone.
    fn wait_for(&self, what: &str, cond: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !cond(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn subnet_id(&self) -> String {
        self.view().subnets[0].subnet_id.clone()
    }
}

/// First `<tag>value</tag>` in an XML body.
fn xml(body: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = body
        .find(&open)
        .unwrap_or_else(|| panic!("no <{tag}> in {body}"))
        + open.len();
    let end = body[start..].find('<').unwrap() + start;
    body[start..end].to_owned()
}

/// Create an ENI with `secondaries` secondary IPs and attach it to node `node` at `index`.
/// Returns (eni id, mac, attachment id).
fn attach_eni(vpc: &Vpc, node: usize, index: u32, secondaries: u32) -> (String, String, String) {
    let count = secondaries.to_string();
    attach_eni_with(
        vpc,
        node,
        index,
        &[("SecondaryPrivateIpAddressCount", &count)],
    )
}

/// Create an ENI with extra CreateNetworkInterface parameters and attach it.
fn attach_eni_with(
    vpc: &Vpc,
    node: usize,
    index: u32,
    extra: &[(&str, &str)],
) -> (String, String, String) {
    let subnet = vpc.subnet_id();
    let mut params = vec![
        ("Action", "CreateNetworkInterface"),
        ("SubnetId", subnet.as_str()),
    ];
    params.extend_from_slice(extra);
    let created = vpc.ec2(node, &params);
    let eni = xml(&created, "networkInterfaceId");
    let mac = xml(&created, "macAddress");
    let idx = index.to_string();
    let attached = vpc.ec2(
        node,
        &[
            ("Action", "AttachNetworkInterface"),
            ("NetworkInterfaceId", &eni),
            ("InstanceId", &vpc.nodes[node]),
            ("DeviceIndex", &idx),
        ],
    );
    (eni, mac, xml(&attached, "attachmentId"))
}

#[tokio::test(flavor = "multi_thread")]
async fn imds_answers_inside_every_node_with_its_own_eni() {
    let vpc = Vpc::up(2);
    for node in 0..2 {
        let view = vpc.view();
        let eni = view
            .instance(&vpc.nodes[node])
            .unwrap()
            .primary()
            .unwrap()
            .clone();
        assert_eq!(vpc.imds(node, "instance-id"), vpc.nodes[node]);
        assert_eq!(vpc.imds(node, "mac"), eni.mac);
        assert_eq!(vpc.imds(node, "local-ipv4"), eni.primary_ip.to_string());
        let base = format!("network/interfaces/macs/{}/", eni.mac);
        assert_eq!(vpc.imds(node, &format!("{base}interface-id")), eni.eni_id);
        assert_eq!(vpc.imds(node, &format!("{base}device-number")), "0");
        // eth0 carries the MAC EC2 reports, is up and configured like DHCP would
        let links = vpc.links(node);
        assert_eq!(
            links,
            vec![("eth0".to_owned(), eni.mac.clone(), true, true)]
        );
        let routes = vpc.sh(node, "ip", &["route", "show", "default"]).unwrap();
        assert!(
            routes.contains(&format!("via {}", view.subnets[0].gateway)),
            "{routes}"
        );
    }
    // the node forwards like an EKS AMI host
    let fwd = vpc.sh(0, "sysctl", &["-n", "net.ipv4.ip_forward"]).unwrap();
    assert_eq!(fwd.trim(), "1");
    // IMDSv2 only: no token, no metadata
    let tokenless = vpc.sh(
        0,
        "curl",
        &[
            "-sS",
            "-m",
            "5",
            "--fail",
            "http://169.254.169.254/latest/meta-data/instance-id",
        ],
    );
    assert!(tokenless.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn attached_eni_appears_after_the_delay_and_vanishes_on_detach() {
    let vpc = Vpc::up(1);
    let mut knobs = vpc.world.knobs();
    knobs.attach_delay_ms = 5_000;
    vpc.world.set_knobs(knobs);

    let (eni, mac, attachment) = attach_eni(&vpc, 0, 1, 0);
    vpc.converge();
    assert_eq!(
        vpc.links(0).len(),
        1,
        "eth1 visible before the attach delay passed"
    );
    assert!(!vpc.imds(0, "network/interfaces/macs/").contains(&mac));

    vpc.clock.advance(Duration::from_millis(5_000));
    vpc.wait_for("eth1", |v| v.links(0).iter().any(|l| l.0 == "eth1"));
    let eth1 = vpc.links(0).into_iter().find(|l| l.0 == "eth1").unwrap();
    // the reported MAC, down and unconfigured (ipamd's job), as on EC2
    assert_eq!(eth1, ("eth1".to_owned(), mac.clone(), false, false));
    assert!(vpc.imds(0, "network/interfaces/macs/").contains(&mac));
    assert_eq!(
        vpc.imds(0, &format!("network/interfaces/macs/{mac}/interface-id")),
        eni
    );

    vpc.ec2(
        0,
        &[
            ("Action", "DetachNetworkInterface"),
            ("AttachmentId", &attachment),
        ],
    );
    vpc.wait_for("eth1 gone", |v| !v.links(0).iter().any(|l| l.0 == "eth1"));
    assert_eq!(vpc.links(0).len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn primaries_reach_each_other_the_gateway_and_the_internet() {
    let vpc = Vpc::up(2);
    let (a, b) = (vpc.primary_ip(0), vpc.primary_ip(1));
    let gw = vpc.view().subnets[0].gateway;
    assert!(vpc.ping(0, None, b));
    assert!(vpc.ping(1, None, a));
    assert!(vpc.ping(0, None, gw));
    assert!(vpc.ping(1, None, INTERNET_HOST_ADDR));
    // TCP through the IGW to the internet host's echo service
    let dst = SocketAddr::V4(SocketAddrV4::new(INTERNET_HOST_ADDR, INTERNET_ECHO_PORT));
    let echoed = tokio::task::block_in_place(|| {
        netns::in_netns(&vpc.ns(0), move || {
            let mut s = TcpStream::connect_timeout(&dst, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(b"hello vpc")?;
            let mut buf = [0u8; 9];
            s.read_exact(&mut buf)?;
            Ok(buf.to_vec())
        })
    })
    .unwrap();
    assert_eq!(echoed, b"hello vpc");
    // an unassigned VPC address is unreachable
    assert!(!vpc.ping_once(0, None, Ipv4Addr::new(198, 18, 15, 200)));
}

/// Counts ICMP packets from `src` arriving in namespace `ns` (an iptables INPUT rule without
/// target): proves where a lost packet was lost.
struct Arrivals {
    ns: String,
}

impl Arrivals {
    fn install(ns: &str, src: Ipv4Addr) -> Self {
        let src = format!("{src}/32");
        let args = [
            "-A",
            "INPUT",
            "-s",
            &src,
            "-p",
            "icmp",
            "-m",
            "comment",
            "--comment",
            "vpcsim-probe",
        ];
        tokio::task::block_in_place(|| exec::in_netns(ns, "iptables", &args)).unwrap();
        Self { ns: ns.to_owned() }
    }

    fn count(&self) -> u64 {
        let out = tokio::task::block_in_place(|| {
            exec::in_netns(&self.ns, "iptables", &["-L", "INPUT", "-n", "-v", "-x"])
        })
        .unwrap();
        let line = out.lines().find(|l| l.contains("vpcsim-probe")).unwrap();
        line.split_whitespace().next().unwrap().parse().unwrap()
    }
}

impl Vpc {
    /// `ip <words>` inside node `node`.
    fn ip(&self, node: usize, words: &str) {
        let args: Vec<&str> = words.split_whitespace().collect();
        self.sh(node, "ip", &args).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn source_dest_check_drops_a_source_the_sending_eni_does_not_own() {
    let vpc = Vpc::up(2);
    let peer = vpc.primary_ip(1);
    let gw = vpc.view().subnets[0].gateway;
    let (eni, _mac, _) = attach_eni(&vpc, 0, 1, 1);
    vpc.wait_for("eth1", |v| v.links(0).iter().any(|l| l.0 == "eth1"));
    let view = vpc.view();
    let node = view.instance(&vpc.nodes[0]).unwrap();
    let eni_b = node.enis.iter().find(|e| e.eni_id == eni).unwrap().clone();
    let secondary = eni_b.secondary_ips[0];
    vpc.converge();

    // node 0: eth1 (ENI B) up with its primary IP and a table 2 out of it, as ipamd sets it
    // up; B's secondary IP on lo, standing in for a pod address
    vpc.ip(0, &format!("addr add {secondary}/32 dev lo"));
    vpc.ip(0, "link set eth1 up");
    vpc.ip(0, &format!("addr add {}/32 dev eth1", eni_b.primary_ip));
    vpc.ip(0, &format!("route add {gw} dev eth1 scope link table 2"));
    vpc.ip(0, &format!("route add default via {gw} dev eth1 table 2"));
    let arrivals = Arrivals::install(&vpc.ns(1), secondary);

    // without the `from <secondary> lookup 2` rule the packet leaves through eth0 (ENI A),
    // which does not own the source: the VPC drops it before it reaches the peer
    assert!(
        !vpc.ping_once(0, Some(secondary), peer),
        "foreign source passed the src/dst check"
    );
    assert_eq!(arrivals.count(), 0, "foreign source reached the peer");

    // the same packet, routed out of the ENI that owns the source, passes both ways
    vpc.ip(
        0,
        &format!("rule add from {secondary} lookup 2 priority 1536"),
    );
    assert!(
        vpc.ping(0, Some(secondary), peer),
        "correctly routed source was dropped"
    );
    assert!(arrivals.count() >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn igw_drops_unnatted_secondary_sources_and_passes_primaries() {
    let vpc = Vpc::up(2);
    let (primary, peer) = (vpc.primary_ip(0), vpc.primary_ip(1));
    let primary_eni = |v: &Vpc| {
        v.view()
            .instance(&v.nodes[0])
            .unwrap()
            .primary()
            .unwrap()
            .clone()
    };
    let eni0 = primary_eni(&vpc).eni_id;
    vpc.ec2(
        0,
        &[
            ("Action", "AssignPrivateIpAddresses"),
            ("NetworkInterfaceId", &eni0),
            ("SecondaryPrivateIpAddressCount", "1"),
        ],
    );
    let secondary = primary_eni(&vpc).secondary_ips[0];
    vpc.converge();
    vpc.ip(0, &format!("addr add {secondary}/32 dev lo"));
    let arrivals = Arrivals::install(&vpc.names().internet_ns(), secondary);

    assert!(vpc.ping(0, Some(primary), INTERNET_HOST_ADDR));
    // inside the VPC the secondary IP is fine (it is eth0's ENI's own address)...
    assert!(vpc.ping(0, Some(secondary), peer));
    // ...but the IGW forwards only primary addresses: without SNAT it never reaches the internet
    assert!(
        !vpc.ping_once(0, Some(secondary), INTERNET_HOST_ADDR),
        "un-NATed secondary passed the IGW"
    );
    assert_eq!(
        arrivals.count(),
        0,
        "un-NATed secondary reached the internet"
    );
    // with SNAT to the primary (what ipamd's AWS-SNAT-CHAIN does) it passes
    let snat = format!(
        "-t nat -A POSTROUTING -s {secondary}/32 ! -d 198.18.0.0/16 -j SNAT --to-source {primary}"
    );
    let args: Vec<&str> = snat.split_whitespace().collect();
    vpc.sh(0, "iptables", &args).unwrap();
    assert!(vpc.ping(0, Some(secondary), INTERNET_HOST_ADDR));
}

#[tokio::test(flavor = "multi_thread")]
async fn teardown_removes_every_namespace_and_the_pid_file() {
    let vpc = Vpc::up(2);
    let names = vpc.names().clone();
    let prefix = names.prefix();
    let ours = || {
        vpcsim::fabric::observe::list_netns()
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .count()
    };
    assert_eq!(ours(), 4, "router, internet and two nodes");
    assert!(names.pid_file().exists());
    let Vpc { fabric, .. } = vpc;
    let errors = tokio::task::block_in_place(|| fabric.shutdown());
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(ours(), 0);
    assert!(!names.pid_file().exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_runs_namespaces_are_removed_at_start_and_a_live_runs_are_not() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "fabric tests need root (network namespaces)"
    );
    let starting = STARTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // a run whose process is gone: pid file with a pid that cannot exist
    let dead = RunNames::new(vpcsim::fabric::names::fresh_run_id());
    std::fs::create_dir_all(vpcsim::fabric::names::RUN_DIR).unwrap();
    std::fs::write(dead.pid_file(), "4194305 1\n").unwrap();
    exec::netns_add(&dead.router_ns()).unwrap();
    // a run without any pid file (crashed before writing it is impossible, but a deleted one)
    let orphan = RunNames::new(vpcsim::fabric::names::fresh_run_id());
    exec::netns_add(&orphan.router_ns()).unwrap();

    let vpc = Vpc::up_holding_starts(1);
    drop(starting);
    let present = vpcsim::fabric::observe::list_netns();
    let leftovers: Vec<_> = [dead.router_ns(), orphan.router_ns()]
        .into_iter()
        .filter(|n| present.contains(n))
        .collect();
    // clean up before asserting so a failure leaves nothing behind
    for ns in &leftovers {
        let _ = exec::netns_del(ns);
    }
    let _ = std::fs::remove_file(dead.pid_file());
    assert!(
        leftovers.is_empty(),
        "stale namespaces survived: {leftovers:?}"
    );
    assert!(!dead.pid_file().exists());
    // our own (live) run survives a second start's cleanup
    assert!(
        vpcsim::fabric::netns::remove_stale_runs()
            .iter()
            .all(|n| !n.starts_with(&vpc.names().prefix()))
    );
    assert!(present.contains(&vpc.names().router_ns()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delegated_prefix_is_delivered_to_the_eni_that_owns_it() {
    let vpc = Vpc::up(2);
    let gw = vpc.view().subnets[0].gateway;
    let (eni, _mac, _) = attach_eni_with(&vpc, 0, 1, &[("Ipv4PrefixCount", "1")]);
    vpc.wait_for("eth1", |v| v.links(0).iter().any(|l| l.0 == "eth1"));
    let view = vpc.view();
    let node = view.instance(&vpc.nodes[0]).unwrap();
    let eni_b = node.enis.iter().find(|e| e.eni_id == eni).unwrap().clone();
    let prefix = eni_b.ipv4_prefixes[0];
    assert_eq!(prefix.prefix_len(), 28);
    vpc.converge();
    // a "pod" address inside the /28, egress policy-routed out of eth1 as ipamd does it
    let pod = prefix.hosts().nth(4).unwrap();
    vpc.ip(0, &format!("addr add {pod}/32 dev lo"));
    vpc.ip(0, "link set eth1 up");
    vpc.ip(0, &format!("addr add {}/32 dev eth1", eni_b.primary_ip));
    vpc.ip(0, &format!("route add {gw} dev eth1 scope link table 2"));
    vpc.ip(0, &format!("route add default via {gw} dev eth1 table 2"));
    vpc.ip(0, &format!("rule add from {pod} lookup 2 priority 1536"));
    // the other node reaches the prefix address: the router delivers the /28 to ENI B
    assert!(vpc.ping(1, None, pod), "prefix address not delivered");
    // an address of the same /28 nobody configured gets no answer (delivered, unanswered)
    let idle = prefix.hosts().nth(9).unwrap();
    assert!(!vpc.ping_once(1, None, idle));
}

#[tokio::test(flavor = "multi_thread")]
async fn terminating_an_instance_removes_its_node_and_only_its_node() {
    let vpc = Vpc::up(2);
    let (gone, kept) = (vpc.ns(0), vpc.ns(1));
    vpc.ec2(
        1,
        &[
            ("Action", "TerminateInstances"),
            ("InstanceId.1", &vpc.nodes[0]),
        ],
    );
    vpc.wait_for("node namespace removed", |_| {
        !vpcsim::fabric::observe::list_netns().contains(&gone)
    });
    assert!(vpcsim::fabric::observe::list_netns().contains(&kept));
    assert_eq!(vpc.imds(1, "instance-id"), vpc.nodes[1]);
    assert!(vpc.ping(1, None, INTERNET_HOST_ADDR));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_loop_repairs_drift_in_the_router() {
    let vpc = Vpc::up(2);
    let router = vpc.names().router_ns();
    let b = vpc.primary_ip(1);
    let route_to_b = || {
        let out = exec::ip(&router, &["route", "show", &format!("{b}/32")]).unwrap();
        !out.trim().is_empty()
    };
    let drops = || {
        let out = exec::in_netns(&router, "iptables-save", &["-t", "mangle"]).unwrap();
        out.contains("-j DROP")
    };
    tokio::task::block_in_place(|| {
        assert!(route_to_b() && drops());
        exec::ip(&router, &["route", "del", &format!("{b}/32")]).unwrap();
        exec::in_netns(&router, "iptables", &["-t", "mangle", "-F"]).unwrap();
    });
    // no world change: the periodic resync (2 s) re-reads the kernel and puts both back
    vpc.wait_for("route back", |_| route_to_b());
    vpc.wait_for("src/dst check back", |_| drops());
    assert!(vpc.ping(0, None, b));
}

fn subnet_by_cidr(world: &World, cidr: &str) -> String {
    world.read(|s| {
        s.subnets
            .values()
            .find(|sn| sn.cidr.to_string() == cidr)
            .unwrap()
            .id
            .clone()
    })
}

/// A two-zone VPC with a secondary 100.64.0.0/16 block; node 0 in zone a, node 1 in zone b.
fn two_zone_vpc(fabric: FabricConfig) -> Vpc {
    let cfg = WorldConfig::with_layout(&vpcsim::Layout {
        azs: 2,
        subnets_per_az: 1,
        secondary_cidr: Some("100.64.0.0/16".parse().unwrap()),
    });
    Vpc::up_in(cfg, &["198.18.0.0/20", "198.18.16.0/20"], fabric)
}

#[tokio::test(flavor = "multi_thread")]
async fn secondary_block_subnets_route_across_zones_and_the_internet_routes_back() {
    let vpc = two_zone_vpc(FabricConfig::default());
    // one ENI per node in its zone's secondary-block subnet (as custom networking attaches)
    let mut custom = Vec::new();
    for (node, cidr) in [(0, "100.64.0.0/20"), (1, "100.64.16.0/20")] {
        let subnet = subnet_by_cidr(&vpc.world, cidr);
        let eni = vpc
            .world
            .mutate(|s, _| {
                s.create_eni(vpcsim::state::CreateEni {
                    subnet_id: subnet.clone(),
                    ..Default::default()
                })
            })
            .unwrap();
        vpc.world
            .mutate(|s, now| s.attach_eni(&eni, &vpc.nodes[node], 1, now))
            .unwrap();
        let ip = vpc.world.read(|s| s.enis[&eni].primary_ip());
        custom.push(ip);
    }
    vpc.converge();
    vpc.wait_for("eth1 on both nodes", |v| {
        v.links(0).len() == 2 && v.links(1).len() == 2
    });
    // configure eth1 as ipamd would (address, route to the peer via the subnet gateway)
    for (node, me, peer, gw) in [
        (0, custom[0], custom[1], "100.64.0.1"),
        (1, custom[1], custom[0], "100.64.16.1"),
    ] {
        vpc.ip(node, &format!("addr add {me}/20 dev eth1"));
        vpc.ip(node, "link set eth1 up");
        vpc.ip(
            node,
            &format!("route add {peer}/32 via {gw} dev eth1 src {me}"),
        );
    }
    assert!(
        vpc.ping(0, Some(custom[0]), custom[1]),
        "100.64 across zones"
    );
    assert!(vpc.ping(1, Some(custom[1]), custom[0]));
    // the router's gateways answer in the secondary block, and unassigned addresses there are
    // unreachable
    assert!(vpc.ping(0, Some(custom[0]), "100.64.0.1".parse().unwrap()));
    assert!(!vpc.ping_once(0, Some(custom[0]), "100.64.16.200".parse().unwrap()));
    // the internet namespace routes every VPC block back through the IGW link
    let routes = tokio::task::block_in_place(|| {
        exec::in_netns(&vpc.names().internet_ns(), "ip", &["route", "show"])
    })
    .unwrap();
    assert!(routes.contains("100.64.0.0/16 via 203.0.113.1"), "{routes}");
    assert!(routes.contains("198.18.0.0/15 via 203.0.113.1"), "{routes}");
    // primaries of both zones reach each other and the internet
    assert!(vpc.ping(0, None, vpc.primary_ip(1)));
    assert!(vpc.ping(1, None, INTERNET_HOST_ADDR));
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_relay_forwards_bytes_from_every_node_to_the_upstream() {
    // the upstream: a TCP echo on loopback in the test's own namespace
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = upstream.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = upstream.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let vpc = two_zone_vpc(FabricConfig {
        kube_upstream: Some(addr),
        ..FabricConfig::default()
    });
    let relay = SocketAddr::V4(SocketAddrV4::new(
        vpcsim::fabric::names::KUBE_API_ADDR,
        vpcsim::fabric::names::KUBE_API_PORT,
    ));
    for node in 0..2 {
        vpc.wait_for("relay listening", |v| {
            let ns = v.ns(node);
            tokio::task::block_in_place(|| {
                netns::in_netns(&ns, move || {
                    TcpStream::connect_timeout(&relay, Duration::from_secs(1)).map(drop)
                })
            })
            .is_ok()
        });
        let echoed = tokio::task::block_in_place(|| {
            netns::in_netns(&vpc.ns(node), move || {
                let mut s = TcpStream::connect_timeout(&relay, Duration::from_secs(5))?;
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                s.write_all(b"kube api")?;
                let mut buf = [0u8; 8];
                s.read_exact(&mut buf)?;
                Ok(buf.to_vec())
            })
        })
        .unwrap();
        assert_eq!(echoed, b"kube api", "node {node}");
    }
}
