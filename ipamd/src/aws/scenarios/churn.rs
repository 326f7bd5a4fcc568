//! Scenarios of pod churn against the pool: the spare ENI's hold (issue 12).

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
    let enis = n.ipam.store().enis().len();
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
    assert_eq!(n.ipam.store().enis().len(), enis - 1);
    assert_eq!(n.cloud.calls("DetachNetworkInterface"), 1);
}
