//! Issue 18 item 3: an AddNetwork that waits for an address and is cancelled (client killed,
//! stream reset, gRPC deadline) must stop counting as waiting. A leaked count makes the policy
//! keep growing for a pod that is gone and skips reconciliation for the life of the process.
#![allow(clippy::tests_outside_test_module)]
use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{TestClock, settings, spec, targets};
use ipamd::aws::memory::MemoryProvider;
use ipamd::datastore::checkpoint::MemoryCheckpoint;
use ipamd::datastore::{IpamKey, PodMetadata};
use ipamd::ipam::Ipam;

/// One ENI with one address, taken: every further AddNetwork waits (no manager runs).
async fn full_node() -> Arc<Ipam> {
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 1, 2));
    let (ipam, _) = common::start(
        provider.clone(),
        settings(targets(1, 1, 1), Duration::from_secs(60)),
        Box::new(MemoryCheckpoint::new()),
        vec![],
        TestClock::new(),
    )
    .await;
    let mut m = ipamd::pool::manager::Manager::new(provider.clone());
    m.settle(&ipam).await;
    ipam.add(
        &IpamKey::new("aws-cni", "holder", "eth0"),
        PodMetadata::default(),
    )
    .await
    .expect("the one address");
    ipam
}

#[tokio::test(start_paused = true)]
async fn a_dropped_add_network_stops_counting_as_waiting() {
    let ipam = full_node().await;
    let gone = IpamKey::new("aws-cni", "gone", "eth0");
    let fut = ipam.add(&gone, PodMetadata::default());
    // The caller gives up (its future is dropped) while the add waits.
    let r = tokio::time::timeout(Duration::from_secs(1), fut).await;
    assert!(r.is_err(), "the add was still waiting");
    assert_eq!(
        ipam.signal.waiting_pods(),
        0,
        "a cancelled add leaked its waiting count"
    );
}

#[tokio::test]
async fn an_add_network_past_its_grpc_deadline_stops_counting_as_waiting() {
    let ipam = full_node().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    let listener = ipamd::rpc::bind_socket(&socket).unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    let reply = ipamd::rpc::ReplySettings {
        vpc_v4_cidrs: vec!["198.18.0.0/16".into()],
        use_external_snat: false,
        ..Default::default()
    };
    tokio::spawn(ipamd::rpc::serve(
        listener,
        ipam.clone(),
        reply,
        None,
        std::sync::Arc::new(ipamd::failures::AddFailures::new(ipam.metrics.clone())),
        ipamd::rpc::ReadyGate::Serving,
        token.clone(),
    ));
    let mut client = common::client(socket).await;
    let mut req = tonic::Request::new(common::add_req("deadline"));
    req.set_timeout(Duration::from_millis(300));
    let status = client
        .add_network(req)
        .await
        .expect_err("no address: deadline");
    assert!(
        matches!(
            status.code(),
            tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
        ),
        "{status:?}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while ipam.signal.waiting_pods() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the add past its gRPC deadline still counts as waiting"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    token.cancel();
}
