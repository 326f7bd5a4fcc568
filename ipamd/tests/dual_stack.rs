//! Dual-stack pods (ours, `ENABLE_DUAL_STACK_PODS`) and IPv6 mode through the real gRPC socket
//! of an in-process ipamd over the in-memory provider (`aws::fake`'s EC2 with IPv6 prefixes):
//! one allocation carrying both addresses, the /80 of the pod's ENI delegated once, two
//! checkpoint records per pod (one per family, upstream-readable), both kept across a restart
//! and both released on DEL. The same on vpcsim's EC2 with the real process:
//! `integration/tests/e2e_ipv6_ipamd.rs` (IPv6 mode).
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use common::*;
use ipamd::aws::ec2::{Ec2, EniQuery};
use ipamd::aws::memory::MemoryProvider;
use ipamd::config::AddressFamily;
use ipamd::datastore::checkpoint::FileCheckpoint;

fn dual_reply() -> ipamd::rpc::ReplySettings {
    ipamd::rpc::ReplySettings {
        family: AddressFamily::DualStack,
        vpc_v6_cidrs: vec!["2001:db8:0:100::/56".into()],
        ..reply_settings()
    }
}

/// The pod's (IPv4, IPv6) from an ADD reply, with its device and table.
async fn add_both(socket: &std::path::Path, id: &str) -> (Ipv4Addr, Ipv6Addr, i32, i32) {
    let mut c = client(socket.to_owned()).await;
    let r = c.add_network(add_req(id)).await.unwrap().into_inner();
    assert!(r.success, "{r:?}");
    let [m] = r.ip_allocation_metadata.as_slice() else {
        panic!("one allocation with both families: {r:?}");
    };
    assert_eq!(r.vp_cv6_cid_rs, vec!["2001:db8:0:100::/56".to_owned()]);
    assert_eq!(r.vp_cv4_cid_rs, vec!["198.18.0.0/16".to_owned()]);
    (
        m.i_pv4_addr.parse().expect("IPv4Addr"),
        m.i_pv6_addr.parse().expect("IPv6Addr, no prefix length"),
        m.device_number,
        m.route_table_id,
    )
}

fn records(path: &std::path::Path) -> Vec<(String, String, String)> {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out: Vec<_> = v["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let s = |k: &str| a[k].as_str().unwrap_or_default().to_owned();
            (s("containerID"), s("ipv4"), s("ipv6"))
        })
        .collect();
    out.sort();
    out
}

/// The /80 prefixes EC2 (the fake) lists on `eni_id`.
async fn eni_prefixes(p: &MemoryProvider, eni_id: &str) -> Vec<ipnet::Ipv6Net> {
    p.cloud()
        .describe_enis(EniQuery::Ids(vec![eni_id.to_owned()]))
        .await
        .unwrap()
        .remove(0)
        .ipv6_prefixes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_pods_get_both_families_keep_them_and_release_them() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    let path = dir.path().join("ipam.json");
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 3, 10));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(3, 3, 9), Duration::from_secs(10)),
        Box::new(FileCheckpoint::new(&path)),
        Vec::new(),
        TestClock::new(),
    )
    .await;
    let token = serve_with(
        provider.clone(),
        ipam.clone(),
        &socket,
        Duration::from_millis(50),
        dual_reply(),
    );

    let (a4, a6, dev, table) = add_both(&socket, "a").await;
    let (b4, b6, _, _) = add_both(&socket, "b").await;
    assert_ne!((a4, a6), (b4, b6));
    // both IPv6 addresses are /128s of the /80 EC2 delegated to the pods' ENI, asked for once
    assert_eq!(provider.cloud().calls("AssignIpv6Addresses"), 1);
    let prefixes = ipam.index.read_v6(|v6| v6.prefixes().to_vec());
    let [p] = prefixes.as_slice() else {
        panic!("{prefixes:?}")
    };
    assert!(
        p.net.contains(&a6) && p.net.contains(&b6),
        "{p:?} {a6} {b6}"
    );
    assert_eq!(
        (p.device_number, p.route_table),
        (u32::try_from(dev).unwrap(), u32::try_from(table).unwrap())
    );
    let snapshot = ipam.index.eni_snapshot();
    let eni = snapshot
        .enis
        .iter()
        .find(|e| e.spec.id == p.eni_id)
        .unwrap();
    assert_eq!(eni.spec.device_number, p.device_number);
    assert_eq!(
        eni_prefixes(&provider, &p.eni_id).await,
        vec![p.net],
        "EC2 lists the /80 on the pods' ENI"
    );
    // one record per family per pod
    let mut expected: Vec<(String, String, String)> = vec![
        ("a".into(), a4.to_string(), String::new()),
        ("a".into(), String::new(), a6.to_string()),
        ("b".into(), b4.to_string(), String::new()),
        ("b".into(), String::new(), b6.to_string()),
    ];
    expected.sort();
    assert_eq!(records(&path), expected);

    // restart from the checkpoint: both halves kept, the prefix found again, not re-delegated
    token.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(ipam);
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(3, 3, 9), Duration::from_secs(10)),
        Box::new(FileCheckpoint::new(&path)),
        Vec::new(),
        TestClock::new(),
    )
    .await;
    let token = serve_with(
        provider.clone(),
        ipam.clone(),
        &socket,
        Duration::from_millis(50),
        dual_reply(),
    );
    assert_eq!(add_both(&socket, "a").await.0, a4);
    assert_eq!(add_both(&socket, "a").await.1, a6);
    let (c4, c6, _, _) = add_both(&socket, "c").await;
    assert!(c6 != a6 && c6 != b6 && c4 != a4 && c4 != b4);
    assert_eq!(provider.cloud().calls("AssignIpv6Addresses"), 1);

    // DEL releases both, once
    let mut cl = client(socket.clone()).await;
    let r = cl.del_network(del_req("a")).await.unwrap().into_inner();
    let m = &r.ip_allocation_metadata[0];
    assert_eq!(
        (m.i_pv4_addr.as_str(), m.i_pv6_addr.as_str()),
        (a4.to_string().as_str(), a6.to_string().as_str())
    );
    let again = cl.del_network(del_req("a")).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::Unknown);
    assert!(records(&path).iter().all(|(id, _, _)| id != "a"));
    assert_eq!(records(&path).len(), 4, "b and c, two records each");
    token.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_mode_over_the_socket_with_the_memory_provider() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    let path = dir.path().join("ipam.json");
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 3, 10));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(0, 3, 9), Duration::from_secs(1)),
        Box::new(FileCheckpoint::new(&path)),
        Vec::new(),
        TestClock::new(),
    )
    .await;
    let prefix = ipamd::pool::run::init_ipv6_mode(&ipam, &provider)
        .await
        .unwrap();
    assert_eq!(prefix.route_table, 254);
    let reply = ipamd::rpc::ReplySettings {
        family: AddressFamily::V6,
        vpc_v6_cidrs: vec!["2001:db8:0:100::/56".into()],
        ..reply_settings()
    };
    // no pool manager in IPv6 mode: only the gRPC server
    let token = tokio_util::sync::CancellationToken::new();
    let listener = ipamd::rpc::bind_socket(&socket).unwrap();
    tokio::spawn(ipamd::rpc::serve(
        listener,
        ipam.clone(),
        reply,
        None,
        std::sync::Arc::new(ipamd::failures::AddFailures::new(ipam.metrics.clone())),
        ipamd::rpc::ReadyGate::Serving,
        token.clone(),
    ));
    let mut c = client(socket.clone()).await;
    let r = c.add_network(add_req("p")).await.unwrap().into_inner();
    assert!(r.success);
    let m = &r.ip_allocation_metadata[0];
    assert!(m.i_pv4_addr.is_empty());
    let ip: Ipv6Addr = m.i_pv6_addr.parse().unwrap();
    assert!(prefix.net.contains(&ip));
    assert!(r.vp_cv4_cid_rs.is_empty());
    let r = c.del_network(del_req("p")).await.unwrap().into_inner();
    assert_eq!(r.ip_allocation_metadata[0].i_pv6_addr, ip.to_string());
    token.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_checkpoint_never_hands_out_a_live_pods_ipv6() {
    // The invariant above all in IPv6 mode: ipamd restarts without its checkpoint while pods
    // run. Their /128s are recovered from the host's IPv6 routes (and pod rules), never handed
    // to a new pod, and released once their pod is gone.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.json");
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 3, 10));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(0, 3, 9), Duration::from_secs(1)),
        Box::new(FileCheckpoint::new(&path)),
        Vec::new(),
        TestClock::new(),
    )
    .await;
    let prefix = ipamd::pool::run::init_ipv6_mode(&ipam, &provider)
        .await
        .unwrap();
    let meta = |name: &str| ipamd::datastore::PodMetadata {
        namespace: "default".into(),
        name: name.into(),
        interfaces_count: 1,
    };
    let key = |c: &str| ipamd::datastore::IpamKey::new("aws-cni", c, "eth0");
    let live = ipam.add_v6(&key("live"), meta("pod-live")).unwrap().ip;
    let ruled = ipam.add_v6(&key("ruled"), meta("pod-ruled")).unwrap().ip;
    drop(ipam);
    std::fs::remove_file(&path).unwrap();

    // The host: the live pod's /128 routed to its veth (named after the pod, as aws-cni names
    // it), the other pod's address named by a pod rule only.
    let veth = dataplane::conventions::host_veth_name("eni", "default", "pod-live");
    let (ipam, outcome) = start(
        provider.clone(),
        settings(targets(0, 3, 9), Duration::from_secs(1)),
        Box::new(FileCheckpoint::new(&path)),
        vec![(live.into(), veth.clone()), (ruled.into(), String::new())],
        TestClock::new(),
    )
    .await;
    assert_eq!(
        outcome,
        ipamd::ipam::RestoreOutcome::MissingRecoveredFromHost { recovered: 2 }
    );
    assert_eq!(
        ipamd::pool::run::init_ipv6_mode(&ipam, &provider)
            .await
            .unwrap(),
        prefix
    );
    let held: Vec<Ipv6Addr> = ipam
        .index
        .read_v6(ipamd::datastore::V6Store::assignments)
        .iter()
        .map(|(_, _, a)| a.ip)
        .collect();
    assert!(held.contains(&live) && held.contains(&ruled), "{held:?}");
    // Recovered entries are checkpointed (upstream-readable `ipv6` records).
    let recs = records(&path);
    assert!(
        recs.contains(&(veth.clone(), String::new(), live.to_string())),
        "{recs:?}"
    );
    // New pods never get a live pod's address.
    for i in 0..4 {
        let ip = ipam
            .add_v6(&key(&format!("new-{i}")), meta("n"))
            .unwrap()
            .ip;
        assert!(ip != live && ip != ruled, "{ip} handed out twice");
    }

    // The live pod's DEL matches its recovered entry by pod name only: reclaim releases it as
    // soon as its veth and route are gone, and not before.
    let err = ipam
        .del_v6(&key("live"), "default", "pod-live")
        .unwrap_err();
    assert!(
        matches!(err, ipamd::ipam::IpamError::UnknownPod(_)),
        "{err:?}"
    );
    let seen = ipam.del_seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let mut reclaimer = ipamd::reclaim::Reclaimer::new(Duration::from_secs(300), "eni");
    let mut held = ipam.index.allocations(ipamd::ipam::Scope::V4);
    held.extend(ipam.index.allocations(ipamd::ipam::Scope::V6));
    let still_wired = ipamd::reclaim::Wiring {
        routed: [live.into()].into(),
        links: [veth.clone()].into(),
        routes_by_link: [(veth.clone(), [live.into()].into())].into(),
    };
    assert!(
        reclaimer
            .decide_with(&held, &still_wired, &seen, ipam.now())
            .iter()
            .all(|(_, ip)| *ip != std::net::IpAddr::V6(live)),
        "released while its veth still routes it"
    );
    let gone = reclaimer.decide_with(&held, &ipamd::reclaim::Wiring::default(), &seen, ipam.now());
    let [(k, std::net::IpAddr::V6(ip))] = gone.as_slice() else {
        panic!("the live pod's entry only: {gone:?}")
    };
    assert_eq!(*ip, live);
    assert!(ipam.reclaim(k, *ip, ipam.now()).unwrap());
    assert!(
        ipam.index
            .read_v6(ipamd::datastore::V6Store::assignments)
            .iter()
            .all(|(_, _, a)| a.ip != live)
    );
    assert!(
        !records(&path)
            .iter()
            .any(|(_, _, v6)| *v6 == live.to_string())
    );
}

/// Issue 28's shape: a dual-stack pod's two addresses are decided together by `Ipam::add_pod`
/// / `del_pod`, under one lock with one checkpoint write: both or neither, also when the write
/// fails (the pod never holds an IPv4 without its IPv6, nor keeps one after a failed DEL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_pod_gets_and_gives_back_both_families_in_one_write_or_neither() {
    use ipamd::datastore::PodMetadata;
    use ipamd::datastore::checkpoint::MemoryCheckpoint;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    let checkpoint = MemoryCheckpoint::new();
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 3, 10));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(3, 3, 9), Duration::from_secs(10)),
        Box::new(checkpoint.clone()),
        Vec::new(),
        TestClock::new(),
    )
    .await;
    let token = serve_with(
        provider.clone(),
        ipam.clone(),
        &socket,
        Duration::from_millis(50),
        dual_reply(),
    );
    let dual = AddressFamily::DualStack;
    let key = |id: &str| ipamd::datastore::IpamKey::new("aws-cni", id, "eth0");
    // the first pod brings the ENI's /80 in
    let a = ipam
        .add_pod(dual, &key("a"), PodMetadata::default())
        .await
        .unwrap();
    assert!(a.v4.is_some() && a.v6.is_some(), "{a:?}");

    let before = checkpoint.writes();
    let b = ipam
        .add_pod(dual, &key("b"), PodMetadata::default())
        .await
        .unwrap();
    assert!(b.v4.is_some() && b.v6.is_some(), "{b:?}");
    assert_eq!(
        checkpoint.writes(),
        before + 1,
        "one write for both families"
    );

    checkpoint.fail_writes(true);
    let e = ipam
        .add_pod(dual, &key("c"), PodMetadata::default())
        .await
        .unwrap_err();
    assert!(
        matches!(e, ipamd::ipam::IpamError::CheckpointFailed(_)),
        "{e}"
    );
    assert!(
        ipam.index.read(|ds| ds.lookup(&key("c"))).is_none(),
        "no IPv4 without its IPv6"
    );
    assert!(ipam.index.read_v6(|v6| v6.lookup(&key("c"))).is_none());
    let e = ipam.del_pod(&key("b"), "", "", "PodDeleted").unwrap_err();
    assert!(
        matches!(e, ipamd::ipam::IpamError::CheckpointFailed(_)),
        "{e}"
    );
    assert_eq!(
        ipam.index.read(|ds| ds.lookup(&key("b"))),
        b.v4,
        "a failed DEL keeps both"
    );
    assert_eq!(ipam.index.read_v6(|v6| v6.lookup(&key("b"))), b.v6);

    checkpoint.fail_writes(false);
    let before = checkpoint.writes();
    let released = ipam.del_pod(&key("b"), "", "", "PodDeleted").unwrap();
    assert_eq!(released.v4.map(|a| a.ip), b.v4.map(|a| a.ip));
    assert_eq!(released.v6.map(|a| a.ip), b.v6.map(|a| a.ip));
    assert_eq!(
        checkpoint.writes(),
        before + 1,
        "one write for both families"
    );
    assert!(
        ipam.index.read(|ds| ds.lookup(&key("b"))).is_none()
            && ipam.index.read_v6(|v6| v6.lookup(&key("b"))).is_none()
    );
    token.cancel();
}

/// The index makes no EC2 call (issue 28's shape): a dual-stack ADD on an ENI whose /80 is not
/// registered asks the pool loop for it and waits. EC2 refusing the /80 fails that ADD with
/// EC2's reason and leaves the pod holding neither family; the refused ENI is not asked again
/// on the loop's later passes (no call per tick), only when the next ADD needs it, which then
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_80_fails_the_waiting_dual_stack_add_with_ec2s_reason_and_no_address_held() {
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 3, 10));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(0, 3, 9), Duration::from_secs(5)),
        Box::new(ipamd::datastore::checkpoint::MemoryCheckpoint::new()),
        Vec::new(),
        TestClock::new(),
    )
    .await;
    let mut manager = ipamd::pool::manager::Manager::new(provider.clone());
    manager.settle(&ipam).await;
    let key = |c: &str| ipamd::datastore::IpamKey::new("aws-cni", c, "eth0");
    let meta = ipamd::datastore::PodMetadata::default;
    provider.cloud().fail_next(
        "AssignIpv6Addresses",
        ipamd::aws::Ec2Error::Unauthorized("ec2:AssignIpv6Addresses".into()),
    );
    let add = {
        let ipam = ipam.clone();
        tokio::spawn(async move {
            ipam.add_pod(AddressFamily::DualStack, &key("a"), meta())
                .await
        })
    };
    // The ADD waits for the /80; the loop's pass asks EC2 and hands the refusal in.
    while ipam.ipv6_prefixes_wanted(false).is_empty() {
        tokio::task::yield_now().await;
    }
    manager.settle(&ipam).await;
    let err = add.await.unwrap().expect_err("EC2 refused the /80");
    assert!(
        matches!(&err, ipamd::ipam::IpamError::Internal(m) if m.contains("IPv6 prefix of eni-") && m.contains("ec2:AssignIpv6Addresses")),
        "{err:?}"
    );
    assert!(
        ipam.index.read(|ds| ds.lookup(&key("a"))).is_none(),
        "no IPv4 kept alone"
    );
    assert!(ipam.index.read_v6(|v6| v6.lookup(&key("a"))).is_none());
    let asked = provider.cloud().calls("AssignIpv6Addresses");
    manager.settle(&ipam).await;
    manager.settle(&ipam).await;
    assert_eq!(
        provider.cloud().calls("AssignIpv6Addresses"),
        asked,
        "a refused /80 is not asked again on every pass"
    );
    // The next ADD asks again, and this time EC2 delegates one.
    let add = {
        let ipam = ipam.clone();
        tokio::spawn(async move {
            ipam.add_pod(AddressFamily::DualStack, &key("b"), meta())
                .await
        })
    };
    while ipam.ipv6_prefixes_wanted(false).is_empty() && !add.is_finished() {
        tokio::task::yield_now().await;
    }
    manager.settle(&ipam).await;
    let got = add
        .await
        .unwrap()
        .expect("the /80 delegated on the second ask");
    let (v4, v6) = (got.v4.unwrap(), got.v6.unwrap());
    assert_eq!(v4.eni_id, v6.eni_id, "both families from one ENI");
}

/// A dual-stack node's pool loop registers every ENI's /80 as soon as it knows the ENI (also
/// the ENIs found at start), so pods do not wait for it and a restored pod's /128 is on a
/// registered prefix before any ADD.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_pool_loop_registers_every_enis_80_before_a_pod_needs_it() {
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 3, 4));
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(6, 3, 3), Duration::from_secs(5)),
        Box::new(ipamd::datastore::checkpoint::MemoryCheckpoint::new()),
        Vec::new(),
        TestClock::new(),
    )
    .await;
    let mut manager =
        ipamd::pool::manager::Manager::new(provider.clone()).with_every_ipv6_prefix(true);
    manager.settle(&ipam).await;
    manager.settle(&ipam).await;
    let enis: Vec<String> = ipam.index.read(|ds| ds.enis().keys().cloned().collect());
    assert!(
        enis.len() >= 2,
        "the warm target needs a second ENI: {enis:?}"
    );
    let mut registered: Vec<String> = ipam
        .index
        .read_v6(|v6| v6.prefixes().to_vec())
        .into_iter()
        .map(|p| p.eni_id)
        .collect();
    registered.sort();
    assert_eq!(registered, enis, "every ENI's /80 registered by the loop");
    assert!(ipam.ipv6_prefixes_wanted(true).is_empty());
    for e in &enis {
        assert_eq!(
            eni_prefixes(&provider, e).await.len(),
            1,
            "{e}: one /80 in EC2"
        );
    }
}
