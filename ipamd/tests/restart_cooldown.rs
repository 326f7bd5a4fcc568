//! Issue 18 item 8: a retried AddNetwork refreshes its assignment's time (so `reclaim` does not
//! take an address whose retried wiring is in flight), and cooldowns survive a restart (a
//! just-released address is not the first one handed out after ipamd restarts: upstream
//! #3887 across a restart). The `vpc-cni-ipam/1` file stays upstream's: cooldowns live in a
//! side file.
#![allow(clippy::tests_outside_test_module)]
use crate::common;

use std::time::Duration;

use common::{TestClock, settings, spec, targets};
use ipamd::aws::memory::MemoryProvider;
use ipamd::datastore::checkpoint::{Checkpoint, FileCheckpoint, MemoryCheckpoint};
use ipamd::datastore::{IpamKey, PodMetadata};
use ipamd::pool::manager::Manager;

fn key(c: &str) -> IpamKey {
    IpamKey::new("aws-cni", c, "eth0")
}

#[tokio::test]
async fn a_retried_add_refreshes_its_assignment_time_and_cancels_a_reclaim_decided_before() {
    let clock = TestClock::new();
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 1, 5));
    let (ipam, _) = common::start(
        provider.clone(),
        settings(targets(2, 1, 4), Duration::from_secs(5)),
        Box::new(MemoryCheckpoint::new()),
        vec![],
        clock.clone(),
    )
    .await;
    Manager::new(provider.clone()).settle(&ipam).await;
    let first = ipam.add(&key("a"), PodMetadata::default()).await.unwrap();
    let seen = ipam
        .index
        .read(|ds| ds.assignment_details(&key("a")))
        .unwrap()
        .1;
    clock.advance(Duration::from_secs(600));
    let again = ipam.add(&key("a"), PodMetadata::default()).await.unwrap();
    assert_eq!(first, again, "idempotent");
    assert_eq!(
        ipam.index
            .read(|ds| ds.assignment_details(&key("a")))
            .unwrap()
            .1,
        ipam.now(),
        "the retried ADD counts as fresh"
    );
    assert!(
        !ipam.reclaim(&key("a"), first.ip, seen).unwrap(),
        "a release decided on the old assignment time must not take it"
    );
    assert!(ipam.index.read(|ds| ds.lookup(&key("a"))).is_some());
}

async fn released_then_restarted(checkpoint: impl Fn() -> Box<dyn Checkpoint>) {
    let clock = TestClock::new();
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 1, 5));
    let (ipam, _) = common::start_with_cooldown(
        provider.clone(),
        settings(targets(2, 1, 4), Duration::from_millis(10)),
        Duration::from_secs(30),
        checkpoint(),
        vec![],
        clock.clone(),
    )
    .await;
    Manager::new(provider.clone()).settle(&ipam).await;
    let a = ipam.add(&key("a"), PodMetadata::default()).await.unwrap();
    ipam.del(&key("a"), "default", "a", "PodDeleted").unwrap();
    drop(ipam);
    clock.advance(Duration::from_secs(5));
    let (ipam, _) = common::start_with_cooldown(
        provider.clone(),
        settings(targets(2, 1, 4), Duration::from_millis(10)),
        Duration::from_secs(30),
        checkpoint(),
        vec![],
        clock.clone(),
    )
    .await;
    let mut m = Manager::new(provider.clone());
    for i in 0..3 {
        m.settle(&ipam).await;
        let b = ipam
            .add(&key(&format!("b{i}")), PodMetadata::default())
            .await
            .unwrap();
        assert_ne!(
            b.ip, a.ip,
            "the address released 5 s before the restart was handed out"
        );
    }
    assert!(ipam.index.read(|ds| ds.stats(ipam.now())).cooling >= 1);
    clock.advance(Duration::from_secs(30));
    assert_eq!(
        ipam.index.read(|ds| ds.stats(ipam.now())).cooling,
        0,
        "free again after its cooldown"
    );
}

#[tokio::test]
async fn a_cooldown_survives_a_restart_in_memory() {
    let shared = MemoryCheckpoint::new();
    released_then_restarted(|| Box::new(shared.clone())).await;
}

#[tokio::test]
async fn a_cooldown_survives_a_restart_through_the_side_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ipam.json");
    released_then_restarted(|| Box::new(FileCheckpoint::new(&path))).await;
    let file = FileCheckpoint::new(&path);
    assert!(file.cooling_path().exists());
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["allocations", "version"],
        "ipam.json stays upstream's format"
    );
}
