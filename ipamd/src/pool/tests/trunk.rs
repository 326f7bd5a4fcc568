//! Security groups for pods in the pool (upstream `hasRoomForEni`'s `trunkEni`,
//! `nodeIPPoolReconcile`'s `needsTrunkEni`): the slot kept for the trunk, the trunk adopted as
//! one, never assigned from and never freed.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_slot_is_kept_for_the_trunk_and_the_trunk_is_never_used_or_freed() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    n.ipam.node_state.reserve_trunk_slot(true);
    assert!(n.ipam.needs_trunk());
    // m5.large: 3 ENIs; one kept for the trunk, so 2 x 9 pods.
    for i in 0..18 {
        n.add(i).await.unwrap_or_else(|e| panic!("pod {i}: {e}"));
    }
    let err = n.add(99).await.expect_err("the third slot is the trunk's");
    assert!(matches!(err, IpamError::InstanceLimit(_)), "{err:?}");
    let attached = |n: &Node| {
        n.cloud
            .all_enis()
            .iter()
            .filter(|e| e.attachment.is_some())
            .count()
    };
    assert_eq!(attached(&n), 2);

    // The controller attaches the trunk; the reconciler's next round adopts it as a trunk.
    let trunk = n.cloud.add_trunk_eni(2);
    n.pass().await;
    assert_eq!(
        n.ipam
            .index
            .read(crate::datastore::DataStore::trunk_eni)
            .map(|(id, _)| id),
        Some(trunk.clone())
    );
    assert!(!n.ipam.needs_trunk());
    // Full node (3 of 3 attached, the trunk holding none): still no address for a new pod.
    let err = n.add(99).await.expect_err("the trunk holds no pod address");
    assert!(matches!(err, IpamError::InstanceLimit(_)), "{err:?}");
    assert!(
        n.ipam
            .index
            .store()
            .enis()
            .get(&trunk)
            .is_some_and(|e| e.cidrs.is_empty() && e.spec.is_trunk)
    );
    // Every pod goes: the pool shrinks, the trunk stays attached and known.
    for i in 0..18 {
        n.ipam.del(&key(i), "", "", "PodDeleted").unwrap();
    }
    for _ in 0..10 {
        n.clock.advance(Duration::from_secs(120));
        tokio::time::advance(Duration::from_secs(120)).await;
        n.pass().await;
    }
    assert_eq!(
        attached(&n),
        2,
        "the pool freed its spare ENI, not the trunk"
    );
    assert!(n.cloud.eni(&trunk).is_some_and(|e| e.attachment.is_some()));
    assert_eq!(
        n.ipam
            .index
            .read(crate::datastore::DataStore::trunk_eni)
            .map(|(id, _)| id),
        Some(trunk)
    );
}
