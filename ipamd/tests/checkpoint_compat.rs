//! Checkpoint compatibility and recovery: an upstream-format `ipam.json` is restored with every
//! pod keeping its address (entries on unknown addresses kept pending, #3876); the file we write
//! uses upstream's field names; an unreadable file is recovered from host routes so no address
//! in use is handed out again.

// Integration tests live at the top level of their own crate.
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use common::*;
use ipamd::aws::memory::MemoryProvider;
use ipamd::datastore::checkpoint::FileCheckpoint;
use ipamd::datastore::{IpamKey, PodMetadata};
use ipamd::ipam::RestoreOutcome;
use ipamd::pool::ec2_port::EniProvider;

async fn provider_with_ips(n: u32) -> (MemoryProvider, Vec<Ipv4Addr>) {
    let p = MemoryProvider::from_spec(spec("198.18.0.0/24", 3, 20));
    let primary = p.list_enis().await.unwrap()[0].id.clone();
    let ips = p.assign_ips(&primary, n).await.unwrap();
    (p, ips)
}

#[tokio::test]
async fn upstream_file_is_restored_and_every_pod_keeps_its_address() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.json");
    let (provider, ips) = provider_with_ips(6).await;
    // Written exactly as upstream's writeBackingStoreUnsafe does (Go struct tags).
    let fixture = format!(
        r#"{{"version":"vpc-cni-ipam/1","allocations":[
{{"networkName":"aws-cni","containerID":"aaaa","ifName":"eth0","ipv4":"{}","allocationTimestamp":1700000000000000001,"metadata":{{"k8sPodNamespace":"default","k8sPodName":"web-1"}}}},
{{"networkName":"aws-cni","containerID":"bbbb","ifName":"eth0","ipv4":"{}","allocationTimestamp":1700000000000000002,"metadata":{{"k8sPodNamespace":"kube-system","k8sPodName":"dns"}}}},
{{"networkName":"aws-cni","containerID":"cccc","ifName":"eth0","ipv4":"198.18.0.200","allocationTimestamp":1700000000000000003,"metadata":{{"k8sPodNamespace":"default","k8sPodName":"on-a-prefix-imds-forgot"}}}}]}}"#,
        ips[0], ips[3]
    );
    std::fs::write(&path, fixture).unwrap();
    let (ipam, outcome) = start(
        provider.clone(),
        settings(targets(0, 3, 19), Duration::from_secs(1)),
        Box::new(FileCheckpoint::new(&path)),
        vec![],
        TestClock::new(),
    )
    .await;
    assert_eq!(
        outcome,
        RestoreOutcome::Restored {
            placed: 2,
            pending: 1,
            rejected: 0,
            from_host: 0
        }
    );
    let key = |c: &str| IpamKey::new("aws-cni", c, "eth0");
    assert_eq!(
        ipam.add(&key("aaaa"), PodMetadata::default())
            .await
            .unwrap()
            .ip,
        ips[0]
    );
    assert_eq!(
        ipam.add(&key("bbbb"), PodMetadata::default())
            .await
            .unwrap()
            .ip,
        ips[3]
    );
    // The pending entry is kept in the rewritten file, not erased.
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let stored: BTreeSet<String> = written["allocations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["ipv4"].as_str().unwrap().to_owned())
        .collect();
    assert!(stored.contains("198.18.0.200"));
    // New pods never get a restored address.
    for i in 0..4 {
        let a = ipam
            .add(&key(&format!("new{i}")), PodMetadata::default())
            .await
            .unwrap();
        assert!(a.ip != ips[0] && a.ip != ips[3]);
    }
    // What we wrote reads back with upstream's exact field names and nothing else.
    for e in written["allocations"].as_array().unwrap() {
        let keys: BTreeSet<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
        let allowed: BTreeSet<&str> = [
            "networkName",
            "containerID",
            "ifName",
            "ipv4",
            "allocationTimestamp",
            "metadata",
        ]
        .into();
        assert!(keys.is_subset(&allowed), "{keys:?}");
        assert!(e["allocationTimestamp"].is_i64());
    }
    assert_eq!(written["version"], "vpc-cni-ipam/1");
}

#[tokio::test]
async fn corrupt_file_is_recovered_from_host_routes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.json");
    let (provider, ips) = provider_with_ips(4).await;
    std::fs::write(
        &path,
        b"{\"version\":\"vpc-cni-ipam/1\",\"allocations\":[{\"networkName\":",
    )
    .unwrap();
    let veth = dataplane::conventions::host_veth_name("eni", "default", "web-1");
    let routes = vec![(ips[1].into(), veth.clone())];
    let (ipam, outcome) = start(
        provider.clone(),
        settings(targets(0, 3, 19), Duration::from_secs(1)),
        Box::new(FileCheckpoint::new(&path)),
        routes,
        TestClock::new(),
    )
    .await;
    assert!(
        matches!(
            outcome,
            RestoreOutcome::RecoveredFromHost { recovered: 1, .. }
        ),
        "{outcome:?}"
    );
    // The in-use address is never handed out again...
    for i in 0..3 {
        let a = ipam
            .add(
                &IpamKey::new("aws-cni", &format!("n{i}"), "eth0"),
                PodMetadata::default(),
            )
            .await
            .unwrap();
        assert_ne!(a.ip, ips[1]);
    }
    // ...until the pod is deleted: DelNetwork finds the recovered entry by the pod's veth
    // name but cannot tell which sandbox owns it, so it only asks reclaim to release it once
    // the veth and route are gone (issue 18 item 7).
    let err = ipam
        .del(
            &IpamKey::new("aws-cni", "the-real-container-id", "eth0"),
            "default",
            "web-1",
            "PodDeleted",
        )
        .unwrap_err();
    assert!(
        matches!(err, ipamd::ipam::IpamError::UnknownPod(_)),
        "{err:?}"
    );
    assert_eq!(ipam.del_seen().len(), 1);
    let held = ipam.index.allocations(ipamd::ipam::Scope::V4);
    let mut r = ipamd::reclaim::Reclaimer::new(Duration::from_secs(300), "eni");
    let gone = r.decide_with(
        &held,
        &ipamd::reclaim::Wiring::default(),
        &ipam.del_seen(),
        ipam.now(),
    );
    assert_eq!(gone.len(), 1, "released at once once unwired, no grace");
    let std::net::IpAddr::V4(gone_ip) = gone[0].1 else {
        panic!("an IPv4 entry")
    };
    assert!(ipam.reclaim(&gone[0].0, gone_ip, ipam.now()).unwrap());
    assert_eq!(gone_ip, ips[1]);
    // The unreadable file was kept aside and replaced by a readable one.
    assert!(dir.path().join("ipam.json.corrupt").exists());
    assert!(FileCheckpoint::new(&path).path().exists());
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(v["version"], "vpc-cni-ipam/1");
}

#[tokio::test]
async fn a_readable_checkpoint_never_hides_addresses_the_host_routes_to_pods() {
    // The file is readable but was written elsewhere (another node, an older path): it holds
    // one pod; the host routes two more to pods, one through a veth of another prefix (the
    // prefix changed). A /32 via eth0 to an address that is not ours is left alone.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.json");
    let (provider, ips) = provider_with_ips(6).await;
    std::fs::write(
        &path,
        format!(
            r#"{{"version":"vpc-cni-ipam/1","allocations":[
{{"networkName":"aws-cni","containerID":"aaaa","ifName":"eth0","ipv4":"{}","allocationTimestamp":1,"metadata":{{}}}}]}}"#,
            ips[0]
        ),
    )
    .unwrap();
    let routes = vec![
        (ips[0].into(), "eni0000000000a".to_owned()),
        (ips[1].into(), "eni1111111111b".to_owned()),
        (ips[2].into(), "cali22222222c".to_owned()),
        ("203.0.113.9".parse().unwrap(), "eth0".to_owned()),
    ];
    let (ipam, outcome) = start(
        provider.clone(),
        settings(targets(0, 3, 19), Duration::from_secs(1)),
        Box::new(FileCheckpoint::new(&path)),
        routes,
        TestClock::new(),
    )
    .await;
    assert_eq!(
        outcome,
        RestoreOutcome::Restored {
            placed: 1,
            pending: 0,
            rejected: 0,
            from_host: 2
        }
    );
    for i in 0..3 {
        let a = ipam
            .add(
                &IpamKey::new("aws-cni", &format!("n{i}"), "eth0"),
                PodMetadata::default(),
            )
            .await
            .unwrap();
        assert!(!ips[..3].contains(&a.ip), "{} is in use by a pod", a.ip);
    }
    assert!(
        ipam.index.read(|ds| ds.pending().is_empty()),
        "a foreign /32 via eth0 is not ours"
    );
}

#[tokio::test]
async fn a_missing_checkpoint_on_a_host_with_pods_is_no_fresh_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.json");
    let (provider, ips) = provider_with_ips(4).await;
    let (ipam, outcome) = start(
        provider.clone(),
        settings(targets(0, 3, 19), Duration::from_secs(1)),
        Box::new(FileCheckpoint::new(&path)),
        vec![
            (ips[0].into(), "eni0000000000a".to_owned()),
            (ips[3].into(), String::new()),
        ],
        TestClock::new(),
    )
    .await;
    assert_eq!(
        outcome,
        RestoreOutcome::MissingRecoveredFromHost { recovered: 2 },
        "a route and a rule-only address are both in use"
    );
    for i in 0..2 {
        let a = ipam
            .add(
                &IpamKey::new("aws-cni", &format!("n{i}"), "eth0"),
                PodMetadata::default(),
            )
            .await
            .unwrap();
        assert!(a.ip != ips[0] && a.ip != ips[3]);
    }
}

#[tokio::test]
async fn a_missing_checkpoint_on_a_host_without_pods_is_a_fresh_start() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, _) = provider_with_ips(4).await;
    let (_, outcome) = start(
        provider.clone(),
        settings(targets(0, 3, 19), Duration::from_secs(1)),
        Box::new(FileCheckpoint::new(dir.path().join("ipam.json"))),
        vec![("203.0.113.9".parse().unwrap(), "eth0".to_owned())],
        TestClock::new(),
    )
    .await;
    assert_eq!(outcome, RestoreOutcome::Fresh);
}

#[tokio::test]
async fn a_stale_sandbox_del_never_releases_the_recovered_address_of_the_current_sandbox() {
    // Issue 18 item 7: web-0's current sandbox C2 was recovered from host state (checkpoint
    // lost) under the veth named after the pod. The DEL of the old sandbox C1 of the same pod
    // must not release C2's address while C2's veth and route are there.
    let dir = tempfile::tempdir().unwrap();
    let (provider, ips) = provider_with_ips(3).await;
    let veth = dataplane::conventions::host_veth_name("eni", "default", "web-0");
    let (ipam, _) = start(
        provider.clone(),
        settings(targets(0, 3, 19), Duration::from_secs(1)),
        Box::new(FileCheckpoint::new(dir.path().join("ipam.json"))),
        vec![(ips[0].into(), veth.clone())],
        TestClock::new(),
    )
    .await;
    for _ in 0..2 {
        // kubelet retries the DEL
        let r = ipam.del(
            &IpamKey::new("aws-cni", "c1-old-sandbox", "eth0"),
            "default",
            "web-0",
            "PodDeleted",
        );
        assert!(r.is_err(), "{r:?}");
    }
    assert!(
        ipam.index.read(|ds| ds.holder_of(ips[0])).is_some(),
        "the current sandbox's address was released by the old sandbox's DEL"
    );
    // C2 is still wired: reclaim keeps it, however often it looks.
    let wired = ipamd::reclaim::Wiring {
        routed: [ips[0].into()].into(),
        links: [veth.clone()].into(),
        routes_by_link: [(veth, [ips[0].into()].into())].into(),
    };
    let mut r = ipamd::reclaim::Reclaimer::new(Duration::from_secs(300), "eni");
    let held = ipam.index.allocations(ipamd::ipam::Scope::V4);
    assert!(
        r.decide_with(&held, &wired, &ipam.del_seen(), ipam.now())
            .is_empty()
    );
}
