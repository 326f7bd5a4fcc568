//! The acceptance path through the real AWS SDK: `AttachNetworkInterface` via
//! aws-sdk-ec2 makes `ethN` with the MAC EC2 reported appear in the node namespace only after
//! the attach delay, IMDS (curl inside the node) lists it, and `DetachNetworkInterface` removes
//! it. Needs root; the `Fabric` drop guard removes the namespaces on success and failure.
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_ec2::Client;
use vpcsim::clock::ManualClock;
use vpcsim::fabric::{Fabric, FabricConfig, exec};
use vpcsim::{World, WorldConfig};

fn ec2_client(addr: std::net::SocketAddr) -> Client {
    Client::from_conf(common::ec2_config(addr, "AKIDVPCSIM").build())
}

/// `(name, mac, up)` of the `ethN` links in `ns`.
fn eth_links(ns: &str) -> Vec<(String, String, bool)> {
    let out = exec::in_netns(ns, "ip", &["-j", "link", "show"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter(|l| l["ifname"].as_str().unwrap_or_default().starts_with("eth"))
        .map(|l| {
            let up = l["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "UP"));
            (
                l["ifname"].as_str().unwrap().to_owned(),
                l["address"].as_str().unwrap().to_owned(),
                up,
            )
        })
        .collect()
}

fn imds_macs(ns: &str) -> String {
    let token = exec::in_netns(
        ns,
        "curl",
        &[
            "-sS",
            "-m",
            "5",
            "--fail",
            "-X",
            "PUT",
            "-H",
            "x-aws-ec2-metadata-token-ttl-seconds: 60",
            "http://169.254.169.254/latest/api/token",
        ],
    )
    .unwrap();
    let header = format!("x-aws-ec2-metadata-token: {token}");
    exec::in_netns(
        ns,
        "curl",
        &[
            "-sS",
            "-m",
            "5",
            "--fail",
            "-H",
            &header,
            "http://169.254.169.254/latest/meta-data/network/interfaces/macs/",
        ],
    )
    .unwrap()
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sdk_attach_shows_eth1_with_the_reported_mac_after_the_delay() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "fabric tests need root (network namespaces)"
    );
    let clock = Arc::new(ManualClock::new());
    let world = World::with_clock(WorldConfig::default(), clock.clone());
    let instance = world.run_instances("m5.large", 1).unwrap().remove(0);
    let mut knobs = world.knobs();
    knobs.attach_delay_ms = 3_000;
    world.set_knobs(knobs);
    let rt = tokio::runtime::Handle::current();
    let fw = world.clone();
    let fabric =
        tokio::task::block_in_place(|| Fabric::start_world(fw, rt, &FabricConfig::default()))
            .unwrap();
    let ns = fabric.names().node_ns(&instance);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(vpcsim::serve(
        listener,
        vpcsim::ec2::router(world.clone()),
        std::future::pending(),
    ));
    let ec2 = ec2_client(addr);

    let subnet = world.fabric_view(world.now()).subnets[0].subnet_id.clone();
    let created = ec2
        .create_network_interface()
        .subnet_id(subnet)
        .send()
        .await
        .unwrap();
    let eni = created.network_interface().unwrap();
    let (eni_id, mac) = (
        eni.network_interface_id().unwrap().to_owned(),
        eni.mac_address().unwrap().to_owned(),
    );
    let attached = ec2
        .attach_network_interface()
        .network_interface_id(&eni_id)
        .instance_id(&instance)
        .device_index(1)
        .send()
        .await
        .unwrap();
    let attachment = attached.attachment_id().unwrap().to_owned();

    // before the delay: EC2 says attached, the instance does not see it yet
    tokio::task::block_in_place(|| fabric.converge()).unwrap();
    let links = tokio::task::block_in_place(|| eth_links(&ns));
    assert_eq!(links.len(), 1, "{links:?}");
    assert!(!tokio::task::block_in_place(|| imds_macs(&ns)).contains(&mac));

    clock.advance(Duration::from_millis(3_000));
    tokio::task::block_in_place(|| {
        wait_for("eth1", || eth_links(&ns).iter().any(|l| l.0 == "eth1"));
        assert!(eth_links(&ns).contains(&("eth1".to_owned(), mac.clone(), false)));
        assert!(imds_macs(&ns).contains(&mac));
    });

    ec2.detach_network_interface()
        .attachment_id(attachment)
        .send()
        .await
        .unwrap();
    tokio::task::block_in_place(|| {
        wait_for("eth1 gone", || {
            !eth_links(&ns).iter().any(|l| l.0 == "eth1")
        })
    });
    server.abort();
    let errors = tokio::task::block_in_place(|| fabric.shutdown());
    assert!(errors.is_empty(), "{errors:?}");
}
