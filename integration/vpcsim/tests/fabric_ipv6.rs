//! The fabric's IPv6 against the real kernel: two nodes whose primary ENIs hold an IPv6
//! address and a /80 prefix exchange ping6 through the VPC router (per-/128 and per-/80
//! delivery, the IPv6 source/destination check), reach the IPv6 internet host through the
//! egress-only internet gateway, and the internet host cannot open anything inward. Needs root;
//! every namespace goes with the `Fabric` drop guard.
#![allow(clippy::tests_outside_test_module)]

use std::io::{Read, Write};
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::Ipv6Net;
use vpcsim::fabric::names::{INTERNET_ECHO_PORT, INTERNET_HOST_ADDR6};
use vpcsim::fabric::{Fabric, FabricConfig, exec, netns};
use vpcsim::state::AssignIpv6;
use vpcsim::{World, WorldConfig};

struct Vpc6 {
    world: Arc<World>,
    fabric: Fabric,
    nodes: Vec<String>,
}

impl Vpc6 {
    /// Two m5.large nodes; each primary ENI gets one IPv6 address and one /80 prefix (what an
    /// IPv6 EKS node's primary ENI carries once ipamd ran).
    fn up() -> Self {
        assert!(
            nix::unistd::Uid::effective().is_root(),
            "fabric tests need root (network namespaces)"
        );
        let world = World::new(WorldConfig::default());
        let nodes = world.run_instances("m5.large", 2).unwrap();
        for id in &nodes {
            let eni = world.read(|s| s.instances[id].primary_eni.clone());
            world
                .mutate(|s, _| {
                    s.assign_ipv6(
                        &eni,
                        AssignIpv6 {
                            count: 1,
                            ..AssignIpv6::default()
                        },
                    )
                })
                .unwrap();
            world
                .mutate(|s, _| {
                    s.assign_ipv6(
                        &eni,
                        AssignIpv6 {
                            prefix_count: 1,
                            ..AssignIpv6::default()
                        },
                    )
                })
                .unwrap();
        }
        let rt = tokio::runtime::Handle::current();
        let w = world.clone();
        let fabric =
            tokio::task::block_in_place(|| Fabric::start_world(w, rt, &FabricConfig::default()))
                .unwrap();
        Self {
            world,
            fabric,
            nodes,
        }
    }

    fn ns(&self, node: usize) -> String {
        self.fabric.names().node_ns(&self.nodes[node])
    }

    /// `(primary IPv6, /80 prefix)` of node `node`'s primary ENI.
    fn v6(&self, node: usize) -> (Ipv6Addr, Ipv6Net) {
        let view = self.world.fabric_view(self.world.now());
        let eni = view.instance(&self.nodes[node]).unwrap().primary().unwrap();
        (eni.ipv6_addresses[0], eni.ipv6_prefixes[0])
    }

    fn sh(&self, ns: &str, program: &str, args: &[&str]) -> Result<String, exec::ExecError> {
        tokio::task::block_in_place(|| exec::in_netns(ns, program, args))
    }

    fn ip(&self, node: usize, words: &str) {
        let args: Vec<&str> = words.split_whitespace().collect();
        self.sh(&self.ns(node), "ip", &args).unwrap();
    }

    fn ping_once_from(&self, ns: &str, src: Option<Ipv6Addr>, dst: Ipv6Addr) -> bool {
        let (src, dst) = (src.map(|s| s.to_string()), dst.to_string());
        let mut args = vec!["ping", "-6", "-c", "1", "-W", "1"];
        if let Some(s) = &src {
            args.extend(["-I", s.as_str()]);
        }
        args.push(&dst);
        self.sh(ns, "busybox", &args).is_ok()
    }

    /// Up to 3 pings (the first may be lost to neighbour discovery).
    fn ping(&self, node: usize, src: Option<Ipv6Addr>, dst: Ipv6Addr) -> bool {
        (0..3).any(|_| self.ping_once_from(&self.ns(node), src, dst))
    }
}

/// Counts ICMPv6 packets from `src` arriving in namespace `ns` (an ip6tables INPUT rule
/// without target): proves where a lost packet was lost.
struct Arrivals {
    ns: String,
    tag: String,
}

impl Arrivals {
    fn install(ns: &str, src: Ipv6Addr) -> Self {
        let (src, tag) = (format!("{src}/128"), format!("vpcsim-probe-{src}"));
        let args = [
            "-A",
            "INPUT",
            "-s",
            &src,
            "-p",
            "ipv6-icmp",
            "-m",
            "comment",
            "--comment",
            &tag,
        ];
        tokio::task::block_in_place(|| exec::in_netns(ns, "ip6tables", &args)).unwrap();
        Self {
            ns: ns.to_owned(),
            tag,
        }
    }

    fn count(&self) -> u64 {
        let out = tokio::task::block_in_place(|| {
            exec::in_netns(&self.ns, "ip6tables", &["-L", "INPUT", "-n", "-v", "-x"])
        })
        .unwrap();
        let line = out.lines().find(|l| l.contains(&self.tag)).unwrap();
        line.split_whitespace().next().unwrap().parse().unwrap()
    }
}

/// TCP connect from namespace `ns` to `dst`, send and read back `hello`.
fn echo_from(ns: &str, dst: SocketAddr, timeout: Duration) -> std::io::Result<Vec<u8>> {
    tokio::task::block_in_place(|| {
        netns::in_netns(ns, move || {
            let mut s = TcpStream::connect_timeout(&dst, timeout)?;
            s.set_read_timeout(Some(timeout))?;
            s.write_all(b"hello")?;
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf)?;
            Ok(buf.to_vec())
        })
    })
    .map_err(|e| std::io::Error::other(e.to_string()))
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_exchange_ping6_reach_the_v6_internet_and_nothing_comes_in_unasked() {
    let vpc = Vpc6::up();
    let ((a, prefix_a), (b, prefix_b)) = (vpc.v6(0), vpc.v6(1));
    assert_eq!(prefix_a.prefix_len(), 80);

    // eth0 carries the primary ENI's IPv6 as DHCPv6 would put it there, with the router's
    // link-local gateway as default route
    let addrs = vpc
        .sh(&vpc.ns(0), "ip", &["-6", "addr", "show", "dev", "eth0"])
        .unwrap();
    assert!(addrs.contains(&format!("{a}/128")), "{addrs}");
    let routes = vpc.sh(&vpc.ns(0), "ip", &["-6", "route"]).unwrap();
    assert!(routes.contains("default via fe80::1 dev eth0"), "{routes}");

    // node <-> node between ENI-assigned /128s
    assert!(vpc.ping(0, None, b), "node 0 -> node 1 over IPv6");
    assert!(vpc.ping(1, None, a), "node 1 -> node 0 over IPv6");

    // a "pod" address of node 1's /80 is delivered to node 1's ENI
    let pod_b = Ipv6Addr::from(u128::from(prefix_b.network()) + 5);
    vpc.ip(1, &format!("-6 addr add {pod_b}/128 dev lo"));
    assert!(vpc.ping(0, None, pod_b), "/80 prefix address not delivered");
    // an address of the /80 nobody configured gets no answer (delivered, unanswered)
    let idle = Ipv6Addr::from(u128::from(prefix_b.network()) + 9);
    assert!(!vpc.ping_once_from(&vpc.ns(0), None, idle));
    // an unassigned address of the VPC's /56 is unreachable
    let nobody: Ipv6Addr = "2001:db8:1200:ff::1".parse().unwrap();
    assert!(!vpc.ping_once_from(&vpc.ns(0), None, nobody));

    // the internet's IPv6 host through the egress-only gateway: from the node's /128 and from a
    // pod address of the /80 (every IPv6 address of the VPC may go out; no NAT)
    assert!(vpc.ping(0, None, INTERNET_HOST_ADDR6));
    let pod_a = Ipv6Addr::from(u128::from(prefix_a.network()) + 7);
    vpc.ip(0, &format!("-6 addr add {pod_a}/128 dev lo"));
    assert!(vpc.ping(0, Some(pod_a), INTERNET_HOST_ADDR6));
    assert!(vpc.ping(0, Some(pod_a), pod_b), "pod -> pod across nodes");
    let echo = SocketAddr::V6(SocketAddrV6::new(
        INTERNET_HOST_ADDR6,
        INTERNET_ECHO_PORT,
        0,
        0,
    ));
    assert_eq!(
        echo_from(&vpc.ns(0), echo, Duration::from_secs(5)).unwrap(),
        b"hello"
    );

    // source/destination check: node 0 sending from node 1's /80 is dropped at the router; the
    // internet namespace counts what arrives (a lost reply alone would prove nothing: the
    // reply would go to node 1 anyway)
    let inet = vpc.fabric.names().internet_ns();
    let spoof = Ipv6Addr::from(u128::from(prefix_b.network()) + 11);
    vpc.ip(0, &format!("-6 addr add {spoof}/128 dev lo"));
    let spoofed = Arrivals::install(&inet, spoof);
    let owned = Arrivals::install(&inet, pod_a);
    assert!(!vpc.ping_once_from(&vpc.ns(0), Some(spoof), INTERNET_HOST_ADDR6));
    assert_eq!(
        spoofed.count(),
        0,
        "a foreign /80 source passed the src/dst check"
    );
    assert!(vpc.ping(0, Some(pod_a), INTERNET_HOST_ADDR6));
    assert!(owned.count() > 0, "the probe counts what arrives");

    // egress-only: the internet host cannot start anything inward, neither ping nor TCP, to a
    // service node 1 can reach
    assert!(!vpc.ping_once_from(&inet, Some(INTERNET_HOST_ADDR6), a));
    let svc = SocketAddr::V6(SocketAddrV6::new(a, 8080, 0, 0));
    let listener = tokio::task::block_in_place(|| netns::listen_in(&vpc.ns(0), svc)).unwrap();
    let server = std::thread::spawn(move || {
        listener.set_nonblocking(false).unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            let Ok((mut c, _)) = listener.accept() else {
                break;
            };
            let mut buf = [0u8; 5];
            if c.read_exact(&mut buf).is_ok() {
                let _ = c.write_all(&buf);
            }
            if &buf == b"stop!" {
                break;
            }
        }
    });
    assert_eq!(
        echo_from(&vpc.ns(1), svc, Duration::from_secs(5)).unwrap(),
        b"hello",
        "the service is reachable inside the VPC"
    );
    assert!(
        echo_from(&inet, svc, Duration::from_secs(2)).is_err(),
        "an inbound connection from the internet passed the egress-only gateway"
    );
    // stop the server thread
    let _ = tokio::task::block_in_place(|| {
        netns::in_netns(&vpc.ns(1), move || {
            let mut s = TcpStream::connect_timeout(&svc, Duration::from_secs(5))?;
            s.write_all(b"stop!")
        })
    });
    server.join().unwrap();

    // converged: a second reconcile changes nothing (the v6 firewall and routes read back as
    // planned)
    let n = tokio::task::block_in_place(|| vpc.fabric.converge()).unwrap();
    assert_eq!(n, 0, "fabric did not converge");
}

#[tokio::test(flavor = "multi_thread")]
async fn unassigning_the_prefix_removes_its_route_and_a_late_address_reaches_eth0() {
    let vpc = Vpc6::up();
    let (_, prefix_b) = vpc.v6(1);
    let pod_b = Ipv6Addr::from(u128::from(prefix_b.network()) + 5);
    vpc.ip(1, &format!("-6 addr add {pod_b}/128 dev lo"));
    assert!(vpc.ping(0, None, pod_b));
    let eni = vpc
        .world
        .read(|s| s.instances[&vpc.nodes[1]].primary_eni.clone());
    vpc.world
        .mutate(|s, _| s.unassign_ipv6(&eni, &[], &[prefix_b]))
        .unwrap();
    tokio::task::block_in_place(|| vpc.fabric.converge()).unwrap();
    assert!(!vpc.ping_once_from(&vpc.ns(0), None, pod_b));
    let routes = vpc
        .sh(&vpc.fabric.names().router_ns(), "ip", &["-6", "route"])
        .unwrap();
    assert!(!routes.contains(&prefix_b.to_string()), "{routes}");
    // a node launched without IPv6 gets it on eth0 when the address is assigned later
    let id = vpc.world.run_instances("m5.large", 1).unwrap().remove(0);
    let eni = vpc.world.read(|s| s.instances[&id].primary_eni.clone());
    tokio::task::block_in_place(|| vpc.fabric.converge()).unwrap();
    let (added, _) = vpc
        .world
        .mutate(|s, _| {
            s.assign_ipv6(
                &eni,
                AssignIpv6 {
                    count: 1,
                    ..AssignIpv6::default()
                },
            )
        })
        .unwrap();
    tokio::task::block_in_place(|| vpc.fabric.converge()).unwrap();
    let ns = vpc.fabric.names().node_ns(&id);
    let addrs = vpc
        .sh(&ns, "ip", &["-6", "addr", "show", "dev", "eth0"])
        .unwrap();
    assert!(addrs.contains(&format!("{}/128", added[0])), "{addrs}");
    assert!(
        vpc.ping_once_from(&ns, None, INTERNET_HOST_ADDR6) || {
            (0..2).any(|_| vpc.ping_once_from(&ns, None, INTERNET_HOST_ADDR6))
        }
    );
}

/// EC2's router also answers `fe80:ec2::1` on every ENI link: a "pod" address of a secondary
/// ENI's /80, routed as ipamd routes a dual-stack pod there (rule from the pod to the ENI's
/// table 2, `default via fe80:ec2::1 dev eth1` in it), reaches the IPv6 internet host and a
/// /80 address of the other node, and the answers come back by the secondary ENI.
#[tokio::test(flavor = "multi_thread")]
async fn secondary_eni_routes_ipv6_via_the_ec2_gateway_address() {
    let vpc = Vpc6::up();
    let (_, prefix_b) = vpc.v6(1);
    let subnet = vpc.world.fabric_view(vpc.world.now()).subnets[0]
        .subnet_id
        .clone();
    let node0 = vpc.nodes[0].clone();
    let eni = vpc
        .world
        .mutate(|s, _| {
            s.create_eni(vpcsim::state::CreateEni {
                subnet_id: subnet.clone(),
                ipv6_prefix_count: 1,
                ..Default::default()
            })
        })
        .unwrap();
    vpc.world
        .mutate(|s, now| s.attach_eni(&eni, &node0, 1, now))
        .unwrap();
    let prefix = {
        let view = vpc.world.fabric_view(vpc.world.now());
        let inst = view.instance(&node0).unwrap();
        inst.enis
            .iter()
            .find(|e| e.eni_id == eni)
            .unwrap()
            .ipv6_prefixes[0]
    };
    let ns = vpc.ns(0);
    let deadline = Instant::now() + Duration::from_secs(15);
    while vpc.sh(&ns, "ip", &["link", "show", "dev", "eth1"]).is_err() {
        assert!(Instant::now() < deadline, "eth1 never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pod = Ipv6Addr::from(u128::from(prefix.network()) + 5);
    vpc.ip(0, "link set eth1 up");
    vpc.ip(0, &format!("-6 addr add {pod}/128 dev lo"));
    vpc.ip(0, "-6 route replace fe80:ec2::1/128 dev eth1 table 2");
    vpc.ip(
        0,
        "-6 route replace default via fe80:ec2::1 dev eth1 table 2",
    );
    vpc.ip(0, &format!("-6 rule add from {pod} lookup 2 pref 1536"));
    let pod_b = Ipv6Addr::from(u128::from(prefix_b.network()) + 6);
    vpc.ip(1, &format!("-6 addr add {pod_b}/128 dev lo"));

    // eth1 may still be completing its link-local DAD: retry for a while
    let deadline = Instant::now() + Duration::from_secs(10);
    while !vpc.ping(0, Some(pod), INTERNET_HOST_ADDR6) {
        assert!(
            Instant::now() < deadline,
            "secondary ENI pod address cannot reach the IPv6 internet via fe80:ec2::1"
        );
    }
    assert!(vpc.ping(0, Some(pod), pod_b), "pod on eth1 -> node 1's /80");
    let neigh = vpc
        .sh(&ns, "ip", &["-6", "neigh", "show", "dev", "eth1"])
        .unwrap();
    assert!(neigh.contains("fe80:ec2::1 lladdr"), "{neigh}");
}
