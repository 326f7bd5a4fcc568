//! Unit tests of the state operations (limits, protection of primaries, reassignment).

use super::*;
use crate::config::WorldConfig;
use std::time::Instant;
use time::OffsetDateTime;

fn now() -> Now {
    Now {
        instant: Instant::now(),
        wall: OffsetDateTime::UNIX_EPOCH,
    }
}

fn world(instance_type: &str) -> (State, String, String) {
    let mut s = State::new(&WorldConfig::default());
    let ids = s
        .run_instances(
            RunInstances {
                instance_type: instance_type.into(),
                count: 1,
                ..RunInstances::default()
            },
            now(),
        )
        .unwrap();
    let subnet = s.default_subnet().unwrap().id.clone();
    (s, ids[0].clone(), subnet)
}

#[test]
fn eni_limit_per_instance_type() {
    let (mut s, inst, subnet) = world("t3.medium");
    for idx in 1..3 {
        let eni = s
            .create_eni(CreateEni {
                subnet_id: subnet.clone(),
                ..CreateEni::default()
            })
            .unwrap();
        s.attach_eni(&eni, &inst, idx, now()).unwrap();
    }
    let eni = s
        .create_eni(CreateEni {
            subnet_id: subnet.clone(),
            ..CreateEni::default()
        })
        .unwrap();
    let err = s.attach_eni(&eni, &inst, 3, now()).unwrap_err();
    assert!(
        matches!(err, StateError::AttachmentLimitExceeded { count: 4, .. }),
        "{err:?}"
    );
}

/// EC2's `AttachNetworkInterface` with `NetworkCardIndex` (as upstream `awsutils.attachENI`
/// sends it, device numbers from `awsGetFreeDeviceNumber` counted per card): the card must
/// exist on the type (`vpc_ip_resource_limit.go` `NetworkCards`), device indexes restart on
/// every card, and each card takes its own `MaximumNetworkInterfaces`.
#[test]
fn network_cards_are_validated_and_counted_per_card() {
    let (mut s, inst, subnet) = world("c6in.32xlarge");
    let mut new_eni = || {
        s.create_eni(CreateEni {
            subnet_id: subnet.clone(),
            ..CreateEni::default()
        })
        .unwrap()
    };
    let enis: Vec<String> = (0..10).map(|_| new_eni()).collect();
    // card 2 does not exist on a two-card type
    assert!(matches!(
        s.attach_eni_on_card(&enis[0], &inst, 0, 2, now()),
        Err(StateError::InvalidParameterValue(m)) if m.contains("network card index 2")
    ));
    // device index 0 is free on card 1 (the primary holds card 0's)
    s.attach_eni_on_card(&enis[0], &inst, 0, 1, now()).unwrap();
    let a = s.enis[&enis[0]].attachment.clone().unwrap();
    assert_eq!((a.network_card_index, a.device_index), (1, 0));
    assert!(matches!(
        s.attach_eni_on_card(&enis[1], &inst, 0, 1, now()),
        Err(StateError::InvalidParameterValue(_))
    ));
    // the card-1 ENI at device 0 is not the primary: it may be detached
    s.detach_eni(&a.id).unwrap();
    s.attach_eni_on_card(&enis[0], &inst, 0, 1, now()).unwrap();
    // card 1 takes 8 ENIs of its own, whatever card 0 holds
    for d in 1..8 {
        s.attach_eni_on_card(&enis[d as usize], &inst, d, 1, now())
            .unwrap();
    }
    assert!(matches!(
        s.attach_eni_on_card(&enis[8], &inst, 8, 1, now()),
        Err(StateError::AttachmentLimitExceeded { count: 9, .. })
    ));
    s.attach_eni_on_card(&enis[8], &inst, 1, 0, now()).unwrap();
    // a single-card type refuses card 1
    let (mut s, inst, subnet) = world("m5.large");
    let eni = s
        .create_eni(CreateEni {
            subnet_id: subnet,
            ..CreateEni::default()
        })
        .unwrap();
    assert!(matches!(
        s.attach_eni_on_card(&eni, &inst, 1, 1, now()),
        Err(StateError::InvalidParameterValue(_))
    ));
}

#[test]
fn ip_limit_counts_primary_and_prefixes() {
    let (mut s, inst, _) = world("m5.large");
    let primary = s.instances[&inst].primary_eni.clone();
    s.assign_ipv4(
        &primary,
        AssignIpv4 {
            count: 9,
            ..AssignIpv4::default()
        },
    )
    .unwrap();
    let err = s
        .assign_ipv4(
            &primary,
            AssignIpv4 {
                count: 1,
                ..AssignIpv4::default()
            },
        )
        .unwrap_err();
    assert_eq!(err, StateError::PrivateIpAddressLimitExceeded);
    // unchanged after the refusal
    assert_eq!(s.enis[&primary].private_ips.len(), 10);
}

#[test]
fn duplicate_device_index_refused_and_primary_protected() {
    let (mut s, inst, subnet) = world("m5.large");
    let eni = s
        .create_eni(CreateEni {
            subnet_id: subnet.clone(),
            ..CreateEni::default()
        })
        .unwrap();
    assert!(matches!(
        s.attach_eni(&eni, &inst, 0, now()),
        Err(StateError::InvalidParameterValue(_))
    ));
    let primary = s.instances[&inst].primary_eni.clone();
    let attach = s.enis[&primary].attachment.clone().unwrap().id;
    assert!(matches!(
        s.detach_eni(&attach),
        Err(StateError::OperationNotPermitted(_))
    ));
    assert!(matches!(
        s.delete_eni(&primary),
        Err(StateError::EniInUse(_))
    ));
    let ip = s.enis[&primary].primary_ip();
    assert!(matches!(
        s.unassign_ipv4(&primary, &[ip], &[]),
        Err(StateError::InvalidParameterValue(_))
    ));
}

#[test]
fn addresses_unique_across_enis_and_reassignment() {
    let (mut s, _inst, subnet) = world("m5.large");
    let a = s
        .create_eni(CreateEni {
            subnet_id: subnet.clone(),
            secondary_count: 3,
            ..CreateEni::default()
        })
        .unwrap();
    let b = s
        .create_eni(CreateEni {
            subnet_id: subnet.clone(),
            secondary_count: 3,
            ..CreateEni::default()
        })
        .unwrap();
    let mut all: Vec<Ipv4Addr> = s
        .enis
        .values()
        .flat_map(|e| e.private_ips.clone())
        .collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n);
    let taken = s.enis[&a].private_ips[1];
    let req = AssignIpv4 {
        addresses: vec![taken],
        ..AssignIpv4::default()
    };
    assert!(matches!(
        s.assign_ipv4(&b, req.clone()),
        Err(StateError::AddressInUse(_))
    ));
    s.assign_ipv4(
        &b,
        AssignIpv4 {
            allow_reassignment: true,
            ..req
        },
    )
    .unwrap();
    assert!(!s.enis[&a].private_ips.contains(&taken));
    assert!(s.enis[&b].private_ips.contains(&taken));
}

#[test]
fn terminate_deletes_primary_and_frees_others() {
    let (mut s, inst, subnet) = world("m5.large");
    let eni = s
        .create_eni(CreateEni {
            subnet_id: subnet.clone(),
            ..CreateEni::default()
        })
        .unwrap();
    s.attach_eni(&eni, &inst, 1, now()).unwrap();
    let primary = s.instances[&inst].primary_eni.clone();
    s.terminate_instances(std::slice::from_ref(&inst)).unwrap();
    assert!(!s.enis.contains_key(&primary));
    assert_eq!(s.enis[&eni].status(), "available");
}

#[test]
fn cidr_reservations_steer_what_ec2_picks() {
    use crate::state::ReservationKind;
    let (mut s, inst, subnet) = world("m5.large");
    let primary = s.instances[&inst].primary_eni.clone();
    let cidr = s.subnets[&subnet].cidr;
    let base = u32::from(cidr.network());
    let block = |i: u32| Ipv4Net::new(Ipv4Addr::from(base + i * 16), 28).unwrap();
    // the first free block of the subnet for addresses, the next one for prefixes
    let used_before = s.used_ipv4(&subnet);
    let explicit = (1..)
        .map(block)
        .find(|b| crate::state::addressing::block_free(cidr, *b, &used_before))
        .unwrap();
    let prefix_home = block(200);
    s.create_subnet_cidr_reservation(&subnet, explicit, ReservationKind::Explicit, String::new())
        .unwrap();
    s.create_subnet_cidr_reservation(&subnet, prefix_home, ReservationKind::Prefix, "pd".into())
        .unwrap();
    // overlapping or outside: refused, nothing added
    assert!(
        s.create_subnet_cidr_reservation(&subnet, explicit, ReservationKind::Prefix, String::new())
            .is_err()
    );
    assert!(
        s.create_subnet_cidr_reservation(
            &subnet,
            "10.0.0.0/28".parse().unwrap(),
            ReservationKind::Prefix,
            String::new()
        )
        .is_err()
    );
    assert_eq!(s.subnets[&subnet].reservations.len(), 2);
    let (ips, _) = s
        .assign_ipv4(
            &primary,
            AssignIpv4 {
                count: 5,
                ..AssignIpv4::default()
            },
        )
        .unwrap();
    let (_, prefixes) = s
        .assign_ipv4(
            &primary,
            AssignIpv4 {
                prefix_count: 1,
                ..AssignIpv4::default()
            },
        )
        .unwrap();
    assert!(
        ips.iter()
            .all(|ip| !explicit.contains(ip) && !prefix_home.contains(ip))
    );
    assert_eq!(
        prefixes,
        vec![prefix_home],
        "prefixes come from the prefix reservation first"
    );
    // an address of the explicit reservation asked for by name is fine
    let named = Ipv4Addr::from(u32::from(explicit.network()) + 3);
    s.assign_ipv4(
        &primary,
        AssignIpv4 {
            addresses: vec![named],
            ..AssignIpv4::default()
        },
    )
    .unwrap();
    let id = s.subnets[&subnet].reservations[0].id.clone();
    s.delete_subnet_cidr_reservation(&id).unwrap();
    assert_eq!(s.subnets[&subnet].reservations.len(), 1);
}
