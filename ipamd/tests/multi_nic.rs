//! Multi-NIC pods over the real gRPC socket (issue 26 item 2): with `ENABLE_MULTI_NIC` and a
//! second network card, a pod annotated `k8s.amazonaws.com/nicConfig: multi-nic-attachment`
//! gets one address per card (upstream `pkg/ipamd/rpc_handler.go` AddNetwork with
//! `RequiresMultiNICAttachment`: `ipsRequired = len(DataStores)`, one `IPAllocationMetadata`
//! per datastore in card order), all or none; DelNetwork frees each; every card's checkpoint
//! (`ipam-nic-N.json`, upstream `datastore.InitializeDataStores`) restores it.

#![allow(clippy::tests_outside_test_module)]

use crate::common;

use std::time::Duration;

use common::*;
use ipamd::aws::memory::MemoryProvider;
use ipamd::datastore::checkpoint::{Checkpoint, MemoryCheckpoint};
use ipamd::pool::ec2_port::AttachedEni;
use ipamd_proto::{ErrorReason, IpamdError};

/// An ENI of network card 1 at device 0 (EC2 counts device indexes per card), with two
/// secondary addresses.
fn card1_eni() -> AttachedEni {
    AttachedEni {
        id: "eni-card1".into(),
        device_number: 0,
        network_card: 1,
        mac: "02:00:00:00:01:01".into(),
        subnet_id: "subnet-card1".into(),
        subnet: "198.19.0.0/24".parse().unwrap(),
        primary_ip: "198.19.0.10".parse().unwrap(),
        secondary_ips: vec![
            "198.19.0.11".parse().unwrap(),
            "198.19.0.12".parse().unwrap(),
        ],
        ..AttachedEni::unflagged()
    }
}

fn add_multi(container: &str) -> ipamd_proto::rpc::AddNetworkRequest {
    let mut r = add_req(container);
    r.requires_multi_nic_attachment = true;
    r
}

fn allocations(c: &MemoryCheckpoint) -> Vec<(String, String, u32)> {
    c.snapshot()
        .map(|d| {
            d.allocations
                .iter()
                .map(|e| {
                    (
                        e.key.container_id.clone(),
                        e.ipv4.clone(),
                        e.metadata.interfaces_count,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_multi_nic_pod_gets_one_address_per_card_all_or_none_and_every_card_restores() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 2, 6));
    let card0 = MemoryCheckpoint::new();
    let card1 = MemoryCheckpoint::new();
    // No pool changes (card 1's ENI is not in the in-memory EC2, so its pool must not act on
    // it): card 0's addresses are given by hand.
    let fixed = ipamd::ipam::IpamSettings {
        provisioning: false,
        ..settings(targets(2, 2, 5), Duration::from_secs(2))
    };
    let (ipam, _) = start_pools(
        provider.clone(),
        fixed,
        vec![(0, Box::new(card0.clone())), (1, Box::new(card1.clone()))],
        &[card1_eni()],
        vec![],
        TestClock::new(),
    )
    .await;
    let eni = ipam
        .index
        .read(|ds| ds.enis().keys().next().cloned())
        .unwrap();
    let by_hand: Vec<ipnet::Ipv4Net> = (100..105)
        .map(|i| format!("198.18.0.{i}/32").parse().unwrap())
        .collect();
    assert!(ipam.index.add_assigned(&eni, &by_hand).is_empty());
    let reply = ipamd::rpc::ReplySettings {
        multi_nic: true,
        ..reply_settings()
    };
    let token = serve_with(
        provider.clone(),
        ipam.clone(),
        &socket,
        Duration::from_millis(50),
        reply,
    );
    let mut c = client(socket.clone()).await;

    // one entry per card, card 0 first; card 1's ENI (device 0) routes through table
    // 10000 + 100 × 1 + 0 (upstream networkutils.CalculateRouteTableId)
    let r = c.add_network(add_multi("a")).await.unwrap().into_inner();
    assert!(r.success);
    assert_eq!(r.ip_allocation_metadata.len(), 2);
    let (first, second) = (&r.ip_allocation_metadata[0], &r.ip_allocation_metadata[1]);
    assert!(first.i_pv4_addr.starts_with("198.18.0."), "{first:?}");
    assert_eq!(second.i_pv4_addr, "198.19.0.11");
    assert_eq!((second.device_number, second.route_table_id), (0, 10100));
    // a repeated ADD answers the same addresses
    let again = c.add_network(add_multi("a")).await.unwrap().into_inner();
    assert_eq!(again.ip_allocation_metadata, r.ip_allocation_metadata);
    // both checkpoints hold the pod, with upstream's interfacesCount (one per card)
    assert_eq!(allocations(&card1), [("a".into(), "198.19.0.11".into(), 2)]);
    assert!(
        allocations(&card0)
            .iter()
            .any(|(k, ip, n)| k == "a" && *ip == first.i_pv4_addr && *n == 2)
    );
    // a pod without the annotation takes nothing from card 1
    let single = c.add_network(add_req("single")).await.unwrap().into_inner();
    assert_eq!(single.ip_allocation_metadata.len(), 1);
    assert_eq!(allocations(&card1).len(), 1);

    let b = c.add_network(add_multi("b")).await.unwrap().into_inner();
    assert_eq!(b.ip_allocation_metadata[1].i_pv4_addr, "198.19.0.12");

    // card 1 has nothing left: the pod is refused naming the card, and keeps no address on
    // card 0 either (all or none)
    let r = c.add_network(add_multi("c")).await.unwrap();
    assert!(!r.get_ref().success);
    assert!(r.get_ref().ip_allocation_metadata.is_empty());
    let bytes = r
        .metadata()
        .get_bin(ipamd_proto::ERROR_METADATA_KEY)
        .unwrap()
        .to_bytes()
        .unwrap();
    let e = IpamdError::from_details(&bytes).unwrap();
    assert_eq!(e.reason(), ErrorReason::NoAvailableAddress);
    assert!(e.message.contains("network card 1"), "{}", e.message);
    assert!(!allocations(&card0).iter().any(|(k, ..)| k == "c"));
    assert!(!allocations(&card1).iter().any(|(k, ..)| k == "c"));

    // DEL frees both cards' addresses, and answers both
    let d = c.del_network(del_req("a")).await.unwrap().into_inner();
    assert!(d.success);
    let released: Vec<&str> = d
        .ip_allocation_metadata
        .iter()
        .map(|m| m.i_pv4_addr.as_str())
        .collect();
    assert_eq!(released, [first.i_pv4_addr.as_str(), "198.19.0.11"]);
    assert!(!allocations(&card0).iter().any(|(k, ..)| k == "a"));
    assert_eq!(allocations(&card1), [("b".into(), "198.19.0.12".into(), 2)]);
    // a second DEL: unknown pod, as upstream
    assert!(c.del_network(del_req("a")).await.is_err());
    token.cancel();

    // restart: every card's checkpoint restores its pods, none double-assigned
    let (ipam2, outcomes) = start_pools(
        provider.clone(),
        settings(targets(2, 2, 5), Duration::from_secs(2)),
        vec![(0, Box::new(card0.clone())), (1, Box::new(card1.clone()))],
        &[card1_eni()],
        vec![],
        TestClock::new(),
    )
    .await;
    assert!(
        matches!(
            outcomes[1],
            (
                1,
                ipamd::ipam::RestoreOutcome::Restored {
                    placed: 1,
                    pending: 0,
                    ..
                }
            )
        ),
        "{outcomes:?}"
    );
    let held = ipam2.index.allocations(ipamd::ipam::Scope::V4OfCard(1));
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].ipv4, "198.19.0.12");
    // the restored pod's DEL frees both its addresses, every card's, at once
    let released = ipam2
        .del_pod(
            &ipamd::datastore::IpamKey::new("aws-cni", "b", "eth0"),
            "",
            "",
            "PodDeleted",
        )
        .unwrap();
    assert_eq!(released.cards.len(), 1);
    assert!(released.v4.is_some());
    assert!(card1.load().unwrap().unwrap().allocations.is_empty());
}

/// A serving card with no ENI yet (the card pool loop has not attached one): the annotated
/// pod is refused with an error naming the card, and keeps no card-0 address.
#[tokio::test]
async fn a_card_without_an_eni_refuses_the_pod_naming_the_card() {
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 2, 6));
    let card0 = MemoryCheckpoint::new();
    let (ipam, _) = start_pools(
        provider.clone(),
        settings(targets(2, 2, 5), Duration::from_secs(2)),
        vec![
            (0, Box::new(card0.clone())),
            (1, Box::new(MemoryCheckpoint::new())),
        ],
        &[],
        vec![],
        TestClock::new(),
    )
    .await;
    // card 0 has addresses (the manager is not running: give it some by hand)
    let eni = ipam
        .index
        .read(|ds| ds.enis().keys().next().cloned())
        .unwrap();
    ipam.index
        .add_assigned(&eni, &["198.18.0.100/32".parse().unwrap()]);
    let key = ipamd::datastore::IpamKey::new("aws-cni", "multi", "eth0");
    let e = ipam
        .add_multi_nic_pod(
            ipamd::config::AddressFamily::V4,
            &key,
            ipamd::datastore::PodMetadata::default(),
        )
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("network card 1") && text.contains("no ENI yet"),
        "{text}"
    );
    assert!(
        ipam.index.read(|ds| ds.lookup(&key)).is_none(),
        "card 0's address given back"
    );
    assert!(!allocations(&card0).iter().any(|(k, ..)| k == "multi"));
}

/// A second ENI of network card 1 (device 1), one secondary address.
fn card1_second_eni() -> AttachedEni {
    AttachedEni {
        id: "eni-card1b".into(),
        device_number: 1,
        network_card: 1,
        mac: "02:00:00:00:01:02".into(),
        subnet_id: "subnet-card1".into(),
        subnet: "198.19.0.0/24".parse().unwrap(),
        primary_ip: "198.19.0.20".parse().unwrap(),
        secondary_ips: vec!["198.19.0.21".parse().unwrap()],
        ..AttachedEni::unflagged()
    }
}

/// Card 1's pool with two ENIs, the second one spare; with `pending`, card 1's checkpoint
/// holds a pod whose address is on none of its ENIs (a Describe that lagged at start). The
/// manager steps card 1's pool for five minutes of its clock; returns card 1's ENIs then.
async fn card1_enis_after_five_minutes(pending: bool) -> usize {
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 4, 6));
    let card1 = MemoryCheckpoint::new();
    if pending {
        let mut c = card1.clone();
        c.store(&ipamd::datastore::CheckpointData::new(vec![
            ipamd::datastore::CheckpointEntry::new(
                ipamd::datastore::IpamKey::new("aws-cni", "lagged", "eth0"),
                "198.19.0.99".parse().unwrap(),
                ipamd::datastore::PodMetadata::default(),
                std::time::SystemTime::now(),
            ),
        ]))
        .unwrap();
    }
    let clock = TestClock::new();
    let (ipam, _) = start_pools(
        provider.clone(),
        settings(targets(2, 4, 5), Duration::from_secs(2)),
        vec![
            (0, Box::new(MemoryCheckpoint::new())),
            (1, Box::new(card1.clone())),
        ],
        &[card1_eni(), card1_second_eni()],
        vec![],
        clock.clone(),
    )
    .await;
    assert_eq!(ipam.index.unconfirmed_pending(), usize::from(pending));
    let mut manager = ipamd::pool::manager::Manager::new(provider);
    for _ in 0..30 {
        for _ in 0..4 {
            manager.step_card(&ipam, 1).await;
        }
        clock.advance(Duration::from_secs(10));
    }
    ipam.index.read_card(1, |ds| ds.enis().len()).unwrap()
}

/// Issue 38 H4: card 1's pool frees no ENI while a restored card-1 entry is unconfirmed (its
/// address may be on that very ENI in EC2), as card 0's never did; without the entry the same
/// pool frees its spare ENI (the test can fail).
#[tokio::test]
async fn a_card_frees_no_eni_while_a_restored_entry_of_it_is_unconfirmed() {
    assert_eq!(
        card1_enis_after_five_minutes(false).await,
        1,
        "the spare ENI is freed"
    );
    assert_eq!(
        card1_enis_after_five_minutes(true).await,
        2,
        "no ENI freed while a restored entry is unconfirmed"
    );
}

/// Issue 38 suspicion: two concurrent AddNetwork calls of one multi-NIC sandbox (kubelet's
/// retry racing the first) take one address per card for it, once: the same answer to both,
/// and each card's pool holds the key once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_adds_of_one_multi_nic_sandbox_take_each_card_once() {
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 2, 6));
    let fixed = ipamd::ipam::IpamSettings {
        provisioning: false,
        ..settings(targets(2, 2, 5), Duration::from_secs(2))
    };
    let (ipam, _) = start_pools(
        provider,
        fixed,
        vec![
            (0, Box::new(MemoryCheckpoint::new())),
            (1, Box::new(MemoryCheckpoint::new())),
        ],
        &[card1_eni()],
        vec![],
        TestClock::new(),
    )
    .await;
    let eni = ipam
        .index
        .read(|ds| ds.enis().keys().next().cloned())
        .unwrap();
    ipam.index.add_assigned(
        &eni,
        &[
            "198.18.0.100/32".parse().unwrap(),
            "198.18.0.101/32".parse().unwrap(),
        ],
    );
    let key = ipamd::datastore::IpamKey::new("aws-cni", "racing", "eth0");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let ipam = ipam.clone();
            let key = key.clone();
            tokio::spawn(async move {
                ipam.add_multi_nic_pod(
                    ipamd::config::AddressFamily::V4,
                    &key,
                    ipamd::datastore::PodMetadata::default(),
                )
                .await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap().unwrap());
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
    for card in [0, 1] {
        let n = ipam
            .index
            .allocations(ipamd::ipam::Scope::V4OfCard(card))
            .iter()
            .filter(|e| e.key == key)
            .count();
        assert_eq!(n, 1, "card {card} holds the sandbox once");
    }
}

/// upstream `AddNetwork` (v1.23.1 `rpc_handler.go`): a pod that needs one address (no
/// multi-NIC annotation) looks through the datastores in card order when one has none
/// (`ErrNoAvailableIPInDataStore` → `continue`). Card 0 with one free address, card 1 with
/// two: the second pod gets card 1's address with card 1's ENI facts (table 10100), a
/// repeated ADD the same one, card 1's checkpoint keeps it across a restart, and its DEL frees
/// it there.
#[tokio::test]
async fn a_pod_without_the_annotation_falls_back_to_another_card_when_card_0_has_none() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 2, 6));
    let card0 = MemoryCheckpoint::new();
    let card1 = MemoryCheckpoint::new();
    let fixed = ipamd::ipam::IpamSettings {
        provisioning: false,
        ..settings(targets(2, 2, 5), Duration::from_secs(1))
    };
    let (ipam, _) = start_pools(
        provider.clone(),
        fixed.clone(),
        vec![(0, Box::new(card0.clone())), (1, Box::new(card1.clone()))],
        &[card1_eni()],
        vec![],
        TestClock::new(),
    )
    .await;
    let eni = ipam
        .index
        .read(|ds| ds.enis().keys().next().cloned())
        .unwrap();
    assert!(
        ipam.index
            .add_assigned(&eni, &["198.18.0.100/32".parse().unwrap()])
            .is_empty()
    );
    let token = serve_with(
        provider.clone(),
        ipam.clone(),
        &socket,
        Duration::from_millis(50),
        ipamd::rpc::ReplySettings {
            multi_nic: true,
            ..reply_settings()
        },
    );
    let mut c = client(socket.clone()).await;
    let first = c.add_network(add_req("p0")).await.unwrap().into_inner();
    assert_eq!(first.ip_allocation_metadata[0].i_pv4_addr, "198.18.0.100");
    assert!(allocations(&card1).is_empty(), "card 0 first");

    let r = c.add_network(add_req("p1")).await.unwrap().into_inner();
    assert!(r.success, "{r:?}");
    assert_eq!(r.ip_allocation_metadata.len(), 1, "one interface: {r:?}");
    let m = &r.ip_allocation_metadata[0];
    assert_eq!(m.i_pv4_addr, "198.19.0.11");
    assert_eq!((m.device_number, m.route_table_id), (0, 10100));
    assert_eq!(
        allocations(&card1),
        [("p1".into(), "198.19.0.11".into(), 1)]
    );
    assert!(!allocations(&card0).iter().any(|(k, ..)| k == "p1"));
    // a repeated ADD answers the same address, takes nothing more
    let again = c.add_network(add_req("p1")).await.unwrap().into_inner();
    assert_eq!(again.ip_allocation_metadata, r.ip_allocation_metadata);
    assert_eq!(allocations(&card1).len(), 1);
    // once card 0 has an address again, new pods get it (card order)
    assert!(
        ipam.index
            .add_assigned(&eni, &["198.18.0.101/32".parse().unwrap()])
            .is_empty()
    );
    let p2 = c.add_network(add_req("p2")).await.unwrap().into_inner();
    assert_eq!(p2.ip_allocation_metadata[0].i_pv4_addr, "198.18.0.101");
    token.cancel();

    // restart: card 1's checkpoint restores the pod there, nothing doubled
    let (ipam2, _) = start_pools(
        provider.clone(),
        fixed,
        vec![(0, Box::new(card0.clone())), (1, Box::new(card1.clone()))],
        &[card1_eni()],
        vec![],
        TestClock::new(),
    )
    .await;
    let key = ipamd::datastore::IpamKey::new("aws-cni", "p1", "eth0");
    let held = ipam2.index.allocations(ipamd::ipam::Scope::V4OfCard(1));
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].ipv4, "198.19.0.11");
    // its DEL frees it on card 1 (the answer names it)
    let released = ipam2.del_pod(&key, "", "", "PodDeleted").unwrap();
    assert!(released.v4.is_none());
    assert_eq!(released.cards.len(), 1);
    assert_eq!(released.cards[0].1.ip.to_string(), "198.19.0.11");
    assert!(card1.load().unwrap().unwrap().allocations.is_empty());
}
