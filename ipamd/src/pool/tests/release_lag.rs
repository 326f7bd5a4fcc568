//! Issue 28 finding 1: releases made while EC2's views lag behind. The manager hands every
//! release to the reconciler as it is made and records it beside the checkpoint before EC2 is
//! asked, so neither the first pass after a start nor a restart lets a lagging Describe (or
//! IMDS) put a released address back into the pool; and an absence seen right after a start
//! does not lift the FreeEni guard of a restored entry.

use super::*;

/// `WARM_IP_TARGET=warm_ip` (no warm ENI).
fn ip_targets(warm_ip: u32) -> Targets {
    let mut t = targets(false);
    t.warm_eni = 0;
    t.warm_ip = warm_ip;
    t
}

impl Node {
    /// CIDRs the datastore holds that EC2 does not list on that ENI of this instance: any of
    /// them could be handed to a pod while EC2 gives it to another node.
    fn unlisted(&self) -> Vec<(String, Ipv4Net)> {
        let ec2: std::collections::BTreeMap<String, Vec<Ipv4Net>> = self
            .cloud
            .all_enis()
            .into_iter()
            .filter(|e| e.attachment.is_some())
            .map(|e| (e.eni_id.clone(), e.pod_cidrs()))
            .collect();
        let store = self.ipam.index.store();
        store
            .enis()
            .iter()
            .flat_map(|(id, e)| e.cidrs.keys().map(move |c| (id.clone(), *c)))
            .filter(|(id, c)| !ec2.get(id).is_some_and(|cs| cs.contains(c)))
            .collect()
    }
}

/// A checkpoint holding one pod (key 77) at `ip`.
fn checkpoint_with_pod(ip: Ipv4Addr) -> MemoryCheckpoint {
    use crate::datastore::checkpoint::Checkpoint as _;
    let mut c = MemoryCheckpoint::new();
    c.store(&crate::datastore::CheckpointData::new(vec![
        crate::datastore::CheckpointEntry::new(
            key(77),
            ip,
            PodMetadata::default(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_799_999_000),
        ),
    ]))
    .unwrap();
    c
}

/// A node with one pod and `WARM_IP_TARGET=8` (9 addresses on its primary ENI), in EC2 and in
/// `checkpoint`; then EC2's Describe and IMDS start to lag: from EC2's next change on they
/// answer with the state before it for a while (eventual consistency).
async fn large_pool_then_lagging_views(cloud: &FakeCloud, checkpoint: &MemoryCheckpoint) {
    let mut n = node_from(cloud.clone(), ip_targets(8), checkpoint.clone()).await;
    n.add(1).await.unwrap();
    n.pass().await;
    assert_eq!(n.pool_cidrs().len(), 9, "one pod and eight warm addresses");
    cloud.set_imds_lag(10);
    cloud.set_describe_lag(10);
}

#[tokio::test(start_paused = true)]
async fn a_release_on_the_first_pass_after_a_start_is_not_re_added_by_a_lagging_describe() {
    // A rollout lowers WARM_IP_TARGET: the restarted ipamd's first pass releases seven
    // addresses, and its eager first reconcile round, milliseconds later, sees them in IMDS and
    // in EC2's Describe still. Before, the reconciler learnt of releases only by comparing
    // with its previous view (none at start) and re-added them as free.
    let cloud = FakeCloud::m5_large();
    let checkpoint = MemoryCheckpoint::new();
    large_pool_then_lagging_views(&cloud, &checkpoint).await;
    let mut n = node_from(cloud.clone(), ip_targets(1), checkpoint).await;
    n.pass().await;
    assert_eq!(
        n.cloud.eni(PRIMARY_ENI).unwrap().secondary_ips.len(),
        2,
        "the first pass released seven in EC2"
    );
    assert_eq!(n.unlisted(), vec![], "released addresses re-added as free");
    for _ in 0..30 {
        n.clock.advance(Duration::from_secs(5));
        n.pass().await;
        assert_eq!(n.unlisted(), vec![], "re-added at a later round");
    }
}

#[tokio::test(start_paused = true)]
async fn recently_freed_cidrs_survive_a_restart() {
    // The same release, and ipamd restarts before any reconcile round (killed mid-rollout).
    // The freed list lived only in memory: the next instance took the addresses EC2's lagging
    // Describe still listed as its own.
    let cloud = FakeCloud::m5_large();
    let checkpoint = MemoryCheckpoint::new();
    large_pool_then_lagging_views(&cloud, &checkpoint).await;
    let mut n = node_from(cloud.clone(), ip_targets(1), checkpoint.clone()).await;
    n.manager.settle(&n.ipam).await;
    assert_eq!(
        n.cloud.eni(PRIMARY_ENI).unwrap().secondary_ips.len(),
        2,
        "released seven in EC2"
    );
    drop(n);
    let mut n = node_from(cloud.clone(), ip_targets(1), checkpoint).await;
    n.pass().await;
    assert_eq!(
        n.unlisted(),
        vec![],
        "released addresses taken back after a restart"
    );
    for _ in 0..30 {
        n.clock.advance(Duration::from_secs(5));
        n.pass().await;
        assert_eq!(n.unlisted(), vec![], "re-added at a later round");
    }
}

#[tokio::test(start_paused = true)]
async fn an_absent_seen_right_after_start_does_not_confirm_a_pending_entry() {
    // A pod's address on the second ENI, assigned just before the restart: EC2's Describe
    // lags behind it at start (the entry is restored pending) and still at the eager first
    // round. Taking that round's "not listed" as EC2's word lifted the FreeEni guard, and the
    // ENI, empty in the datastore, was freed with the pod's address.
    let cloud = FakeCloud::m5_large();
    let eni2 = cloud.add_foreign_eni(Tags::new(), 0, Some(1));
    cloud.set_describe_lag(2);
    let x = cloud.assign(&eni2, AddressRequest::Ips(1)).await.unwrap()[0].addr();
    let mut t = targets(false);
    t.warm_eni = 0;
    let mut n = node_from(cloud, t, checkpoint_with_pod(x)).await;
    assert_eq!(n.ipam.index.store().pending().len(), 1, "restored pending");
    n.pass().await;
    assert_eq!(
        n.ipam.index.unconfirmed_pending(),
        1,
        "an absence seen right after start is not EC2's word"
    );
    n.clock
        .advance(crate::pool::policy::ENI_EXCESS_HOLD + Duration::from_secs(1));
    n.manager.settle(&n.ipam).await;
    assert!(
        n.cloud.eni(&eni2).is_some_and(|e| e.attachment.is_some()),
        "the eni holding the pod's address was freed"
    );
    n.pass().await;
    let a = n
        .ipam
        .index
        .store()
        .lookup(&key(77))
        .expect("placed once EC2's Describe has caught up");
    assert_eq!((a.ip, a.eni_id), (x, eni2));
}
