//! Knob `release_lag_ms` through the Query API's actions: a release applies at once for every
//! other action, while `DescribeNetworkInterfaces` keeps showing what it removed.

use super::actions::dispatch;
use super::params::Params;
use crate::clock::ManualClock;
use crate::config::WorldConfig;
use crate::knobs::Knobs;
use crate::state::{AssignIpv4, AssignIpv6, CreateEni};
use crate::world::World;
use std::sync::Arc;
use std::time::Duration;

fn call(world: &World, action: &str, args: &[(&str, &str)]) -> String {
    let pairs = args
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .chain([("Action".to_owned(), action.to_owned())]);
    let body = dispatch(world, action, &Params::from_pairs(pairs), "rid")
        .unwrap_or_else(|e| panic!("{action}: {e:?}"));
    String::from_utf8(body).expect("utf-8")
}

/// What `DescribeNetworkInterfaces` answers for the ENIs attached to `instance`.
fn described_on(world: &World, instance: &str) -> String {
    call(
        world,
        "DescribeNetworkInterfaces",
        &[
            ("Filter.1.Name", "attachment.instance-id"),
            ("Filter.1.Value.1", instance),
        ],
    )
}

#[test]
fn a_release_shows_in_describe_only_after_the_release_lag() {
    let clock = Arc::new(ManualClock::new());
    let world = World::with_clock(WorldConfig::default(), clock.clone());
    world.set_knobs(Knobs {
        release_lag_ms: 2_000,
        ..Knobs::default()
    });
    let ids = world.run_ipv6_instances("m5.large", 2).unwrap();
    let (a, b) = (&ids[0], &ids[1]);
    let primary = |i: &str| world.read(|s| s.instances[i].primary_eni.clone());
    let (eni_a, eni_b) = (primary(a), primary(b));
    let (ips, _) = world
        .mutate(|s, _| {
            s.assign_ipv4(
                &eni_a,
                AssignIpv4 {
                    count: 1,
                    ..AssignIpv4::default()
                },
            )
        })
        .unwrap();
    let (_, v6) = world
        .mutate(|s, _| {
            s.assign_ipv6(
                &eni_a,
                AssignIpv6 {
                    prefix_count: 1,
                    ..AssignIpv6::default()
                },
            )
        })
        .unwrap();
    let (ip, v6) = (ips[0].to_string(), v6[0].to_string());
    let tag = |ip: &str| format!("<privateIpAddress>{ip}</privateIpAddress>");
    let v6_tag = format!("<ipv6Prefix>{v6}</ipv6Prefix>");

    call(
        &world,
        "UnassignPrivateIpAddresses",
        &[("NetworkInterfaceId", &eni_a), ("PrivateIpAddress.1", &ip)],
    );
    call(
        &world,
        "UnassignIpv6Addresses",
        &[("NetworkInterfaceId", &eni_a), ("Ipv6Prefix.1", &v6)],
    );
    // Applied at once for every other action: the address is free and B gets it.
    assert!(world.read(|s| !s.enis[&eni_a].private_ips.contains(&ips[0])));
    let (again, _) = world
        .mutate(|s, _| {
            s.assign_ipv4(
                &eni_b,
                AssignIpv4 {
                    addresses: vec![ips[0]],
                    ..AssignIpv4::default()
                },
            )
        })
        .unwrap();
    assert_eq!(again, ips);
    // Describe still shows both on A (and the address on B too: a stale read).
    let on_a = described_on(&world, a);
    assert!(on_a.contains(&tag(&ip)), "{on_a}");
    assert!(on_a.contains(&v6_tag), "{on_a}");
    assert!(described_on(&world, b).contains(&tag(&ip)));

    // Detach (and delete) an ENI of A: still described as attached to A.
    let subnet = world.read(|s| s.default_subnet().unwrap().id.clone());
    let eni = world
        .mutate(|s, _| {
            s.create_eni(CreateEni {
                subnet_id: subnet.clone(),
                ..CreateEni::default()
            })
        })
        .unwrap();
    let attachment = world
        .mutate(|s, now| s.attach_eni(&eni, a, 1, now))
        .unwrap();
    clock.advance(Duration::from_millis(1_500));
    call(
        &world,
        "DetachNetworkInterface",
        &[("AttachmentId", &attachment)],
    );
    call(
        &world,
        "DeleteNetworkInterface",
        &[("NetworkInterfaceId", &eni)],
    );
    let by_id = call(
        &world,
        "DescribeNetworkInterfaces",
        &[("NetworkInterfaceId.1", &eni)],
    );
    assert!(by_id.contains(&attachment), "{by_id}");
    let on_a = described_on(&world, a);
    assert!(on_a.contains(&format!("<networkInterfaceId>{eni}</networkInterfaceId>")));
    assert!(
        on_a.contains(&tag(&ip)),
        "the unassign is 1.5 s old: {on_a}"
    );

    // 2 s after the unassign: gone from A, still on B; the detach is 0.5 s old.
    clock.advance(Duration::from_millis(500));
    let on_a = described_on(&world, a);
    assert!(!on_a.contains(&tag(&ip)), "{on_a}");
    assert!(!on_a.contains(&v6_tag), "{on_a}");
    assert!(on_a.contains(&eni), "{on_a}");
    assert!(described_on(&world, b).contains(&tag(&ip)));
    clock.advance(Duration::from_millis(1_500));
    assert!(!described_on(&world, a).contains(&eni));
    let err = dispatch(
        &world,
        "DescribeNetworkInterfaces",
        &Params::from_pairs([("NetworkInterfaceId.1".to_owned(), eni.clone())]),
        "rid",
    );
    assert!(err.is_err(), "deleted and past the lag: NotFound");
}

#[test]
fn without_the_knob_describe_shows_a_release_at_once() {
    let world = World::with_clock(WorldConfig::default(), Arc::new(ManualClock::new()));
    let ids = world.run_instances("m5.large", 1).unwrap();
    let eni = world.read(|s| s.instances[&ids[0]].primary_eni.clone());
    let (ips, _) = world
        .mutate(|s, _| {
            s.assign_ipv4(
                &eni,
                AssignIpv4 {
                    count: 1,
                    ..AssignIpv4::default()
                },
            )
        })
        .unwrap();
    let ip = ips[0].to_string();
    call(
        &world,
        "UnassignPrivateIpAddresses",
        &[("NetworkInterfaceId", &eni), ("PrivateIpAddress.1", &ip)],
    );
    assert!(!described_on(&world, &ids[0]).contains(&ip));
}
