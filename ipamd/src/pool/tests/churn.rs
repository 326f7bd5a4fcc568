//! Scenarios of pod churn against the pool: the spare ENI's hold (issue 12), and no ENI freed
//! while a dual-stack pod's /128 may live on it (issue 28).

use super::*;

/// Churn at `WARM_ENI_TARGET=1` (issue 12): 9 pods on a node of 9-address ENIs, one replaced
/// every 40 s. Each deleted address cools down for 30 s, so the pool needs a third ENI for its
/// warm target; for the 10 s after the cooldown that ENI is spare again. Without the hold the pool freed
/// it and created it again within a minute, over and over; with it the ENI stays while pods
/// come and go, and goes once the churn stops (upstream's steady state, later).
#[tokio::test(start_paused = true)]
async fn churn_does_not_free_and_recreate_the_warm_eni_but_a_quiet_node_still_frees_it() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    let mut alive: std::collections::VecDeque<u32> = (1..=9).collect();
    for &i in &alive {
        n.add(i).await.unwrap();
    }
    n.pass().await;
    let step = Duration::from_secs(10);
    let mut next = 10;
    let mut last_delete = n.clock.now();
    for k in 0..60 {
        // ten minutes; every 40 s the oldest pod is replaced
        if k % 4 == 0 {
            let old = alive.pop_front().unwrap();
            n.ipam.del(&key(old), "", "", "PodDeleted").unwrap();
            last_delete = n.clock.now();
            n.add(next).await.unwrap();
            alive.push_back(next);
            next += 1;
        }
        n.clock.advance(step);
        tokio::time::advance(step).await;
        n.pass().await;
    }
    let created = n.cloud.calls("CreateNetworkInterface");
    assert!(
        created <= 2,
        "{created} ENIs created for 9 pods under churn: the spare one was re-created"
    );
    assert_eq!(
        n.cloud.calls("DetachNetworkInterface"),
        0,
        "an ENI was freed while pods kept coming and going"
    );
    let enis = n.ipam.index.store().enis().len();
    // the churn stops: the spare ENI goes after the last address cooled down (30 s) and the
    // hold, not before
    let mut freed_after = None;
    for _ in 1..=30 {
        n.clock.advance(step);
        tokio::time::advance(step).await;
        n.pass().await;
        if freed_after.is_none() && n.cloud.calls("DetachNetworkInterface") > 0 {
            freed_after = n.clock.now().duration_since(last_delete).ok();
        }
    }
    let freed_after = freed_after.expect("a quiet node frees its spare ENI");
    assert!(
        freed_after >= Duration::from_secs(30) + crate::pool::policy::ENI_EXCESS_HOLD,
        "freed {freed_after:?} after the last pod was deleted"
    );
    assert_eq!(n.ipam.index.store().enis().len(), enis - 1);
    assert_eq!(n.cloud.calls("DetachNetworkInterface"), 1);
}

/// Issue 28 finding 2 (c): the pool policy and FreeEni looked only at the IPv4 index. A
/// dual-stack pod whose IPv4 was released (before the fix, by `reclaim` after its `/32` route
/// was deleted; also a DEL that finds only one half) left an ENI with no IPv4 assigned but a
/// live /128 of its /80: the ENI was freed, and with it the pod's IPv6. The ENI stays while
/// any pod holds a /128 of its /80, and goes once the last one is released.
#[tokio::test(start_paused = true)]
async fn an_eni_whose_ipv4s_are_gone_is_not_freed_while_pods_hold_ipv6s_of_its_80() {
    let mut t = targets(false);
    t.warm_eni = 0;
    let mut n = node(FakeCloud::m5_large(), t).await;
    for i in 1..=10 {
        n.add(i).await.unwrap();
    }
    // 9 pods fill the primary ENI; the tenth is on a second ENI, with its /80's first /128.
    let a = n
        .ipam
        .index
        .store()
        .lookup(&key(10))
        .expect("pod 10 holds an IPv4");
    assert_ne!(a.eni_id, PRIMARY_ENI);
    // As the dual-stack pool loop does: the ENI's /80 asked of EC2 and handed to the index.
    let net = n.manager.provider().ipv6_prefix(&a.eni_id).await.unwrap();
    n.ipam.register_ipv6_prefix(&a.eni_id, net).unwrap();
    let v6 = n
        .ipam
        .add_dual_stack_v6(&key(10), PodMetadata::default(), &a.eni_id)
        .expect("the ENI's /80");
    assert_eq!(v6.eni_id, a.eni_id);
    // Pod 1 goes (the primary ENI has room), pod 10's IPv4 half goes, its IPv6 stays.
    n.ipam.del(&key(1), "", "", "PodDeleted").unwrap();
    n.ipam.del(&key(10), "", "", "PodDeleted").unwrap();
    assert!(n.ipam.index.read_v6(|v6| v6.lookup(&key(10))).is_some());
    // Well past the address cooldown, the ENI's minimum lifetime, the spare ENI's hold and
    // the shrink interval.
    let step = Duration::from_secs(10);
    for _ in 0..40 {
        n.clock.advance(step);
        tokio::time::advance(step).await;
        n.pass().await;
    }
    assert_eq!(
        n.cloud.calls("DetachNetworkInterface"),
        0,
        "the ENI holding a live pod's /128 was freed"
    );
    assert!(n.ipam.index.store().enis().contains_key(&a.eni_id));
    // The IPv6 half released too: now the ENI is spare and goes after the hold.
    n.ipam.del_v6(&key(10), "", "").unwrap();
    for _ in 0..40 {
        n.clock.advance(step);
        tokio::time::advance(step).await;
        n.pass().await;
    }
    assert_eq!(n.cloud.calls("DetachNetworkInterface"), 1);
    assert!(!n.ipam.index.store().enis().contains_key(&a.eni_id));
}

/// The restart case of the same guard: a restored IPv6 record whose /80 is not registered yet
/// (a dual-stack ENI's /80 is registered when it serves its next pod) and whose pod holds no
/// IPv4 may be on any ENI: none is freed while it is held.
#[tokio::test(start_paused = true)]
async fn no_eni_is_freed_while_a_restored_ipv6_is_on_no_known_eni() {
    use crate::datastore::checkpoint::Checkpoint as _;
    let orphan =
        std::net::Ipv6Addr::from(u128::from(crate::aws::fake::fake_ipv6_prefix(9).network()) + 5);
    let mut c = MemoryCheckpoint::new();
    c.store(&crate::datastore::CheckpointData::new(vec![
        crate::datastore::CheckpointEntry::new_v6(
            key(77),
            orphan,
            PodMetadata::default(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_799_999_000),
        ),
    ]))
    .unwrap();
    let mut t = targets(false);
    t.warm_eni = 0;
    let mut n = node_from(FakeCloud::m5_large(), t, c).await;
    assert_eq!(
        n.ipam.index.read_v6(|v6| v6.lookup(&key(77))).map(|a| a.ip),
        Some(orphan)
    );
    for i in 1..=10 {
        n.add(i).await.unwrap();
    }
    n.ipam.del(&key(1), "", "", "PodDeleted").unwrap();
    n.ipam.del(&key(10), "", "", "PodDeleted").unwrap();
    let step = Duration::from_secs(10);
    for _ in 0..40 {
        n.clock.advance(step);
        tokio::time::advance(step).await;
        n.pass().await;
    }
    assert_eq!(
        n.cloud.calls("DetachNetworkInterface"),
        0,
        "an ENI was freed while a pod's /128 may be on it"
    );
    // Its pod goes: the spare ENI goes after the hold.
    n.ipam.del_v6(&key(77), "", "").unwrap();
    for _ in 0..40 {
        n.clock.advance(step);
        tokio::time::advance(step).await;
        n.pass().await;
    }
    assert_eq!(n.cloud.calls("DetachNetworkInterface"), 1);
}
