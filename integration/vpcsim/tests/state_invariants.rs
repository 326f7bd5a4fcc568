//! Property test of the state model: any sequence of EC2 operations (valid or not) keeps EC2's
//! invariants — addresses unique per subnet, never one of AWS's reserved five, prefixes aligned
//! /28s of the subnet, per-type ENI and slot limits, unique device indexes, the primary ENI and
//! primary address in place, and refused operations leave the state unchanged; with lowest-free
//! and with random (seeded) address picks. IPv6 likewise: addresses unique, inside the subnet's
//! /64 and never inside a delegated /80, /80s aligned and disjoint, IPv6 slots within the type's
//! limit.
#![allow(clippy::tests_outside_test_module)]

use ipnet::{Ipv4Net, Ipv6Net};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Instant;
use time::OffsetDateTime;
use vpcsim::state::{AssignIpv4, AssignIpv6, CreateEni, Now, RunInstances, State};
use vpcsim::{SubnetConfig, WorldConfig};

#[derive(Debug, Clone)]
enum Op {
    Create {
        secondary: u32,
        prefixes: u32,
    },
    Attach {
        eni: usize,
        inst: usize,
        index: u32,
    },
    Detach {
        eni: usize,
    },
    Delete {
        eni: usize,
    },
    Assign {
        eni: usize,
        count: u32,
    },
    AssignPrefix {
        eni: usize,
        count: u32,
    },
    AssignExplicit {
        eni: usize,
        last_octet: u8,
        reassign: bool,
    },
    Unassign {
        eni: usize,
        nth: usize,
    },
    UnassignPrefix {
        eni: usize,
        nth: usize,
    },
    Terminate {
        inst: usize,
    },
    AssignV6 {
        eni: usize,
        count: u32,
    },
    AssignV6Prefix {
        eni: usize,
        count: u32,
    },
    AssignV6Explicit {
        eni: usize,
        low: u16,
    },
    UnassignV6 {
        eni: usize,
        nth: usize,
    },
    UnassignV6Prefix {
        eni: usize,
        nth: usize,
    },
}

const SUBNET6: &str = "2001:db8:1200::/64";

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..6, 0u32..3).prop_map(|(secondary, prefixes)| Op::Create {
            secondary: if prefixes > 0 { 0 } else { secondary },
            prefixes
        }),
        (0usize..12, 0usize..3, 0u32..5).prop_map(|(eni, inst, index)| Op::Attach {
            eni,
            inst,
            index
        }),
        (0usize..12).prop_map(|eni| Op::Detach { eni }),
        (0usize..12).prop_map(|eni| Op::Delete { eni }),
        (0usize..12, 1u32..8).prop_map(|(eni, count)| Op::Assign { eni, count }),
        (0usize..12, 1u32..3).prop_map(|(eni, count)| Op::AssignPrefix { eni, count }),
        (0usize..12, any::<u8>(), any::<bool>()).prop_map(|(eni, last_octet, reassign)| {
            Op::AssignExplicit {
                eni,
                last_octet,
                reassign,
            }
        }),
        (0usize..12, 0usize..4).prop_map(|(eni, nth)| Op::Unassign { eni, nth }),
        (0usize..12, 0usize..2).prop_map(|(eni, nth)| Op::UnassignPrefix { eni, nth }),
        (0usize..3).prop_map(|inst| Op::Terminate { inst }),
        (0usize..12, 1u32..5).prop_map(|(eni, count)| Op::AssignV6 { eni, count }),
        (0usize..12, 1u32..3).prop_map(|(eni, count)| Op::AssignV6Prefix { eni, count }),
        (0usize..12, 0u16..16).prop_map(|(eni, low)| Op::AssignV6Explicit { eni, low }),
        (0usize..12, 0usize..4).prop_map(|(eni, nth)| Op::UnassignV6 { eni, nth }),
        (0usize..12, 0usize..2).prop_map(|(eni, nth)| Op::UnassignV6Prefix { eni, nth }),
    ]
}

fn now() -> Now {
    Now {
        instant: Instant::now(),
        wall: OffsetDateTime::UNIX_EPOCH,
    }
}

fn check6(s: &State) {
    let subnet: Ipv6Net = SUBNET6.parse().unwrap();
    let mut addrs = BTreeSet::new();
    let mut prefixes: Vec<Ipv6Net> = Vec::new();
    for e in s.enis.values() {
        for ip in &e.ipv6_addresses {
            assert!(subnet.contains(ip), "{ip} outside the /64");
            assert!(addrs.insert(*ip), "{ip} assigned twice");
        }
        for p in &e.ipv6_prefixes {
            assert_eq!(p.prefix_len(), 80);
            assert_eq!(p.network(), p.addr(), "unaligned {p}");
            assert!(subnet.contains(p));
            assert!(
                !prefixes.iter().any(|q| q.contains(p) || p.contains(q)),
                "/80 {p} delegated twice"
            );
            prefixes.push(*p);
        }
        if let Some(a) = &e.attachment {
            let lim = s.limits_of(&s.instances[&a.instance_id]);
            assert!(
                e.ipv6_slots() <= lim.ipv6_per_eni as usize,
                "IPv6 slot limit exceeded on {}",
                e.id
            );
        }
    }
    for ip in &addrs {
        assert!(
            !prefixes.iter().any(|p| p.contains(ip)),
            "{ip} lies inside a delegated /80"
        );
    }
}

fn check(s: &State, subnet: Ipv4Net) {
    check6(s);
    let mut seen = BTreeSet::new();
    for e in s.enis.values() {
        for ip in &e.private_ips {
            assert!(subnet.contains(ip), "{ip} outside the subnet");
            let o = ip.octets()[3];
            assert!(o >= 4 && o != 255, "reserved address {ip} handed out");
            assert!(seen.insert(u32::from(*ip)), "{ip} assigned twice");
        }
        for p in &e.ipv4_prefixes {
            assert_eq!(p.prefix_len(), 28);
            assert_eq!(p.network(), p.addr(), "unaligned {p}");
            assert!(subnet.contains(p));
            for a in u32::from(p.network())..=u32::from(p.broadcast()) {
                assert!(seen.insert(a), "prefix {p} overlaps {}", Ipv4Addr::from(a));
            }
        }
        assert!(
            !e.private_ips.is_empty(),
            "ENI {} lost its primary address",
            e.id
        );
        if let Some(a) = &e.attachment {
            let inst = &s.instances[&a.instance_id];
            let lim = s.limits_of(inst);
            assert!(
                e.ipv4_slots() <= lim.ipv4_per_eni as usize,
                "slot limit exceeded on {}",
                e.id
            );
        } else {
            assert!(e.ipv4_slots() <= 50);
        }
    }
    for inst in s.instances.values() {
        let enis = s.enis_of(&inst.id);
        let mut idx = BTreeSet::new();
        for e in &enis {
            assert!(
                idx.insert(e.attachment.as_ref().unwrap().device_index),
                "duplicate device index on {}",
                inst.id
            );
        }
        if inst.state == vpcsim::state::InstanceState::Running {
            assert!(enis.len() <= s.limits_of(inst).max_enis as usize);
            assert_eq!(
                enis.first().map(|e| e.id.as_str()),
                Some(inst.primary_eni.as_str()),
                "primary ENI gone"
            );
        } else {
            assert!(enis.is_empty());
        }
    }
    let used = seen.len() as u64;
    let usable = (1u64 << (32 - u32::from(subnet.prefix_len()))) - 5;
    let sid = s.default_subnet().unwrap().id.clone();
    assert_eq!(s.available_ip_count(&sid), usable - used);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn ec2_invariants_hold(ops in proptest::collection::vec(op(), 1..60), seed in proptest::option::of(any::<u64>())) {
        let subnet: Ipv4Net = "198.18.0.0/26".parse().unwrap(); // 64 addresses, 4 /28s
        let config = WorldConfig {
            subnets: vec![SubnetConfig { cidr: subnet, availability_zone: None, ipv6_cidr: Some(SUBNET6.parse().unwrap()), tags: Default::default() }],
            random_addresses: seed,
            ..WorldConfig::default()
        };
        let mut s = State::new(&config);
        let sid = s.default_subnet().unwrap().id.clone();
        let insts = s
            .run_instances(RunInstances { instance_type: "t3.medium".into(), count: 2, ..RunInstances::default() }, now())
            .unwrap();
        let mut insts = insts;
        insts.extend(s.run_instances(RunInstances { instance_type: "m5.large".into(), count: 1, ..RunInstances::default() }, now()).unwrap());
        check(&s, subnet);
        for op in ops {
            let enis: Vec<String> = s.enis.keys().cloned().collect();
            let pick = |i: usize| enis.get(i % enis.len().max(1)).cloned().unwrap_or_default();
            let before = format!("{:?}", (&s.enis, &s.instances));
            let result = match op.clone() {
                Op::Create { secondary, prefixes } => s
                    .create_eni(CreateEni { subnet_id: sid.clone(), secondary_count: secondary, ipv4_prefix_count: prefixes, ..CreateEni::default() })
                    .map(|_| ()),
                Op::Attach { eni, inst, index } => s.attach_eni(&pick(eni), &insts[inst], index, now()).map(|_| ()),
                Op::Detach { eni } => match s.enis.get(&pick(eni)).and_then(|e| e.attachment.clone()) {
                    Some(a) => s.detach_eni(&a.id),
                    None => continue,
                },
                Op::Delete { eni } => s.delete_eni(&pick(eni)),
                Op::Assign { eni, count } => s.assign_ipv4(&pick(eni), AssignIpv4 { count, ..AssignIpv4::default() }).map(|_| ()),
                Op::AssignPrefix { eni, count } => s.assign_ipv4(&pick(eni), AssignIpv4 { prefix_count: count, ..AssignIpv4::default() }).map(|_| ()),
                Op::AssignExplicit { eni, last_octet, reassign } => s
                    .assign_ipv4(&pick(eni), AssignIpv4 { addresses: vec![Ipv4Addr::new(198, 18, 0, last_octet)], allow_reassignment: reassign, ..AssignIpv4::default() })
                    .map(|_| ()),
                Op::Unassign { eni, nth } => {
                    let id = pick(eni);
                    let Some(ip) = s.enis.get(&id).and_then(|e| e.private_ips.get(nth).copied()) else { continue };
                    s.unassign_ipv4(&id, &[ip], &[])
                }
                Op::UnassignPrefix { eni, nth } => {
                    let id = pick(eni);
                    let Some(p) = s.enis.get(&id).and_then(|e| e.ipv4_prefixes.get(nth).copied()) else { continue };
                    s.unassign_ipv4(&id, &[], &[p])
                }
                Op::Terminate { inst } => s.terminate_instances(std::slice::from_ref(&insts[inst])).map(|_| ()),
                Op::AssignV6 { eni, count } => s.assign_ipv6(&pick(eni), AssignIpv6 { count, ..AssignIpv6::default() }).map(|_| ()),
                Op::AssignV6Prefix { eni, count } => s.assign_ipv6(&pick(eni), AssignIpv6 { prefix_count: count, ..AssignIpv6::default() }).map(|_| ()),
                Op::AssignV6Explicit { eni, low } => {
                    // low addresses of the /64: some free, some taken, some inside the first /80
                    let ip = Ipv6Addr::new(0x2001, 0xdb8, 0x1200, 0, 0, 0, 0, low);
                    s.assign_ipv6(&pick(eni), AssignIpv6 { addresses: vec![ip], ..AssignIpv6::default() }).map(|_| ())
                }
                Op::UnassignV6 { eni, nth } => {
                    let id = pick(eni);
                    let Some(ip) = s.enis.get(&id).and_then(|e| e.ipv6_addresses.get(nth).copied()) else { continue };
                    s.unassign_ipv6(&id, &[ip], &[])
                }
                Op::UnassignV6Prefix { eni, nth } => {
                    let id = pick(eni);
                    let Some(p) = s.enis.get(&id).and_then(|e| e.ipv6_prefixes.get(nth).copied()) else { continue };
                    s.unassign_ipv6(&id, &[], &[p])
                }
            };
            if result.is_err() {
                prop_assert_eq!(&before, &format!("{:?}", (&s.enis, &s.instances)), "refused {:?} changed the state", op);
            }
            check(&s, subnet);
        }
    }
}
