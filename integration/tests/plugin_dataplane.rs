//! The `dataplane` netlink operations against the real kernel, in a throwaway namespace: what
//! is added reads back equal, duplicates are `is_exists`, deleting twice is `is_not_found`.
//! (ipamd reuses these operations for ENI tables and rules.)

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use dataplane::{Address, Family, MacAddr, Neighbour, NetNs, Route, Rule, Scope, VethSpec};
use integration::{TestNode, can_run_kernel_tests};

#[test]
fn netlink_ops_round_trip_in_a_namespace() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut node = TestNode::new("dp");
    let pod = node.add_pod_netns("p");
    let node_ns = NetNs::open(node.netns_path()).unwrap();
    let pod_ns = NetNs::open(&pod.path).unwrap();
    assert!(!node_ns.same_as(&pod_ns));
    assert!(node_ns.same_as(&NetNs::open(node.netns_path()).unwrap()));
    assert!(
        NetNs::open("/var/run/netns/cnit-does-not-exist")
            .unwrap_err()
            .is_not_found()
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let nl = node_ns.connect().await.unwrap();
        let pod_nl = pod_ns.connect().await.unwrap();
        let mac = MacAddr::random_local();
        nl.add_veth(&VethSpec {
            name: "dp0",
            mtu: 1400,
            peer_name: "dp1",
            peer_mac: Some(mac),
            peer_netns: Some(&pod_ns),
        })
        .await
        .unwrap();
        // The peer was created directly in the pod namespace.
        assert!(nl.link_by_name("dp1").await.unwrap().is_none());
        let peer = pod_nl.require_link("dp1").await.unwrap();
        assert_eq!(peer.mac, Some(mac));
        assert_eq!(peer.mtu, 1400);
        assert_eq!(peer.kind.as_deref(), Some("veth"));
        assert!(!peer.up);

        let link = nl.require_link("dp0").await.unwrap();
        let mac2: MacAddr = "02:11:22:33:44:55".parse().unwrap();
        nl.set_link_mac(link.index, mac2).await.unwrap();
        nl.set_link_mtu(link.index, 1300).await.unwrap();
        nl.set_link_up(link.index).await.unwrap();
        let link = nl.require_link("dp0").await.unwrap();
        assert_eq!((link.mac, link.mtu, link.up), (Some(mac2), 1300, true));
        assert!(nl.links().await.unwrap().iter().any(|l| l.name == "lo"));

        let addr = Address {
            ifindex: link.index,
            prefix: "198.18.5.1/24".parse().unwrap(),
        };
        nl.add_address(&addr, false).await.unwrap();
        assert!(nl.add_address(&addr, false).await.unwrap_err().is_exists());
        assert!(
            nl.addresses(Some(link.index))
                .await
                .unwrap()
                .contains(&addr)
        );

        let route = Route {
            dst: "203.0.113.0/24".parse().unwrap(),
            gateway: Some("198.18.5.2".parse().unwrap()),
            oif: Some(link.index),
            table: 100,
            scope: Scope::Universe,
        };
        let onlink = Route {
            dst: "198.18.5.2/32".parse().unwrap(),
            gateway: None,
            oif: Some(link.index),
            table: 100,
            scope: Scope::Link,
        };
        nl.add_route(&onlink).await.unwrap();
        nl.add_route(&route).await.unwrap();
        assert!(nl.add_route(&route).await.unwrap_err().is_exists());
        nl.replace_route(&route).await.unwrap();
        let routes = nl.routes(Family::V4).await.unwrap();
        assert!(routes.contains(&route), "{routes:?}");
        assert!(routes.contains(&onlink), "{routes:?}");

        let rule = Rule {
            src: Some("198.18.5.0/24".parse().unwrap()),
            iif: Some("dp0".into()),
            fwmark: Some((0x80, 0x80)),
            ..Rule::lookup(Family::V4, 1234, 100)
        };
        nl.add_rule(&rule).await.unwrap();
        assert!(nl.add_rule(&rule).await.unwrap_err().is_exists());
        assert!(nl.rules(Family::V4).await.unwrap().contains(&rule));
        let big_table = Rule {
            dst: Some("203.0.113.7/32".parse().unwrap()),
            ..Rule::lookup(Family::V4, 1235, 10_102)
        };
        nl.add_rule(&big_table).await.unwrap();
        assert!(nl.rules(Family::V4).await.unwrap().contains(&big_table));

        let neigh = Neighbour {
            ifindex: link.index,
            ip: "198.18.5.2".parse().unwrap(),
            mac: Some(mac),
            permanent: true,
        };
        nl.replace_neighbour(&neigh).await.unwrap();
        nl.replace_neighbour(&neigh).await.unwrap();
        assert!(
            nl.neighbours(Some(link.index))
                .await
                .unwrap()
                .contains(&neigh)
        );

        node_ns
            .write_sysctls(&[("net/ipv4/conf/dp0/rp_filter".into(), "2".into())])
            .unwrap();
        assert_eq!(
            node_ns.read_sysctl("net/ipv4/conf/dp0/rp_filter").unwrap(),
            "2"
        );
        assert!(
            node_ns
                .write_sysctls(&[("net/ipv4/conf/nope0/rp_filter".into(), "1".into())])
                .unwrap_err()
                .is_not_found()
        );

        nl.delete_rule(&rule).await.unwrap();
        assert!(nl.delete_rule(&rule).await.unwrap_err().is_not_found());
        nl.delete_rule(&big_table).await.unwrap();
        nl.delete_route(&route).await.unwrap();
        assert!(nl.delete_route(&route).await.unwrap_err().is_not_found());
        nl.delete_address(&addr).await.unwrap();
        assert!(nl.delete_address(&addr).await.unwrap_err().is_not_found());
        assert!(nl.delete_link_by_name("dp0").await.unwrap());
        assert!(!nl.delete_link_by_name("dp0").await.unwrap());
        assert!(pod_nl.link_by_name("dp1").await.unwrap().is_none());
        assert!(
            !nl.rules(Family::V4)
                .await
                .unwrap()
                .iter()
                .any(|r| r.priority == 1234 || r.priority == 1235)
        );
    });
}

/// The kernel runs one dump at a time per netlink socket and answers an overlapping one EBUSY
/// (or overflows the socket, ENOBUFS): ipamd's concurrent DELs each list the node's rules over
/// one connection, and the fleet's every DEL but one failed so. Dumps of every kind, all at
/// once on one connection, must all succeed.
#[test]
fn concurrent_dumps_on_one_connection_all_succeed() {
    if !can_run_kernel_tests() {
        return;
    }
    let node = TestNode::new("dump");
    let ns = NetNs::open(node.netns_path()).unwrap();
    for i in 0..64u8 {
        node.ip(&[
            "rule",
            "add",
            "from",
            &format!("198.18.7.{i}/32"),
            "lookup",
            "3",
            "pref",
            "1536",
        ]);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let nl = std::sync::Arc::new(ns.connect().await.unwrap());
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..48 {
            let nl = nl.clone();
            tasks.spawn(async move {
                let n = match i % 4 {
                    0 => nl.rules(Family::V4).await.map(|r| r.len()),
                    1 => nl.routes(Family::V4).await.map(|r| r.len()),
                    2 => nl.links().await.map(|l| l.len()),
                    _ => nl.addresses(None).await.map(|a| a.len()),
                };
                (i, n)
            });
        }
        let mut answered = 0;
        while let Some(done) = tasks.join_next().await {
            let (i, n) = done.unwrap();
            let n = n.unwrap_or_else(|e| panic!("dump {i}: {e}"));
            if i % 4 == 0 {
                assert!(n >= 64, "dump {i}: the 64 rules read back whole, not {n}");
            }
            answered += 1;
        }
        assert_eq!(answered, 48);
    });
}
