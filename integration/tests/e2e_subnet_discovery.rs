//! Subnet discovery, exclusion and connection tracking end to end (root only): the real
//! `ipamd` on a simulated node (vpcsim's EC2 API, IMDS and fabric), one zone with four
//! subnets: the node's primary subnet A (untagged), B and C tagged `kubernetes.io/role/cni=1`,
//! D tagged `kubernetes.io/role/cni=0` with the most free addresses of all. Free addresses are
//! shaped by other tenants' (unattached) ENIs.
//!
//! Upstream v1.23.1, `pkg/awsutils/awsutils.go`:
//! - `createENI` + `GetVpcSubnets`: DescribeSubnets (vpc-id, availability-zone), sorted by
//!   `AvailableIpAddressCount`, most first; `isSubnetValidForENICreation`: the primary subnet
//!   unless tagged `=0`, other subnets only when tagged; security groups: the primary ENI's.
//!   Each new ENI asks again, so a subnet that filled up moves the next ENI to the next subnet.
//!   (A `CreateNetworkInterface` failing in one subnet moving on to the next is covered by
//!   `ipamd::aws::provider::tests::a_full_subnet_moves_the_new_eni_to_the_next`: with
//!   vpcsim's exact counts a subnet described as the freest cannot refuse first.)
//! - `createENIInput` / `setConnectionTrackingSettings`: the primary ENI's
//!   `ConnectionTrackingConfiguration` is sent with every new ENI.
//!
//! `pkg/ipamd/ipamd.go` `excludedENIBasedOnSubnetTags` / `checkAndHandleAllENIExclusion`: an
//! ENI whose subnet is tagged `=0` is excluded from pod addresses and its free addresses are
//! released; pods keep theirs.
#![allow(clippy::tests_outside_test_module)]

use std::time::Duration;

use integration::can_run_kernel_tests;
use integration::sim::{METRICS, Sim, SimConfig, eventually};
use vpcsim::state::{ConnTracking, CreateEni, ModifyEni};

const READY: Duration = Duration::from_secs(90);
const ROLE: &str = "kubernetes.io/role/cni";

/// Other tenants take addresses in `subnet` until `leave` are free (unattached ENIs).
fn leave_free(sim: &Sim, subnet: &str, leave: u64) {
    sim.world
        .mutate(|s, _| {
            loop {
                let free = s.available_ip_count(subnet);
                if free <= leave {
                    return Ok(());
                }
                let take = (free - leave).min(40);
                s.create_eni(CreateEni {
                    subnet_id: subnet.to_owned(),
                    description: "other tenant".into(),
                    secondary_count: u32::try_from(take - 1).unwrap_or(0),
                    ..CreateEni::default()
                })?;
            }
        })
        .unwrap();
}

fn tag(sim: &Sim, subnet: &str, value: &str) {
    sim.world
        .mutate(|s, _| {
            s.create_tags(
                &[subnet.to_owned()],
                &std::collections::BTreeMap::from([(ROLE.to_owned(), value.to_owned())]),
            )
        })
        .unwrap();
}

/// Node 0's attached ENIs by device index: (device, ENI id, subnet, groups, conntrack,
/// addresses).
type Attached = (
    u32,
    String,
    String,
    Vec<String>,
    Option<ConnTracking>,
    usize,
);

fn attached(sim: &Sim) -> Vec<Attached> {
    let id = sim.nodes[0].instance_id.clone();
    sim.world.read(|s| {
        let mut v: Vec<Attached> = s
            .enis
            .values()
            .filter_map(|e| {
                let a = e.attachment.as_ref().filter(|a| a.instance_id == id)?;
                Some((
                    a.device_index,
                    e.id.clone(),
                    e.subnet_id.clone(),
                    e.groups.clone(),
                    e.conntrack,
                    e.private_ips.len() + e.ipv4_prefixes.len(),
                ))
            })
            .collect();
        v.sort_by_key(|e| e.0);
        v
    })
}

fn metric(sim: &Sim, line_prefix: &str) -> Option<f64> {
    sim.http_get(0, METRICS, "/metrics")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit_once(' ')?.1.parse().ok())
}

#[test]
fn new_enis_follow_subnet_tags_and_free_addresses_and_copy_connection_tracking() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        layout: vpcsim::Layout {
            azs: 1,
            subnets_per_az: 4,
            secondary_cidr: None,
        },
        ..SimConfig::default()
    })
    .expect("one node, four subnets");
    let node_subnet = sim
        .world
        .read(|s| s.instances[&sim.nodes[0].instance_id].subnet_id.clone());
    let others: Vec<String> = sim
        .subnets_in_zone(&sim.node_zone(0))
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| *id != node_subnet)
        .collect();
    let (a, b, c, d) = (
        node_subnet,
        others[0].clone(),
        others[1].clone(),
        others[2].clone(),
    );
    tag(&sim, &b, "1");
    tag(&sim, &c, "1");
    tag(&sim, &d, "0");
    // A: 12 free (9 go to the primary ENI), B: 22, C: 15, D: untouched (4091, the most).
    leave_free(&sim, &a, 12);
    leave_free(&sim, &b, 22);
    leave_free(&sim, &c, 15);
    let conntrack = ConnTracking {
        tcp_established_timeout: Some(350),
        udp_stream_timeout: Some(120),
        udp_timeout: None,
    };
    let primary = attached(&sim)[0].1.clone();
    sim.world
        .mutate(|s, _| {
            s.modify_eni(
                &primary,
                ModifyEni {
                    conntrack: Some(conntrack),
                    ..ModifyEni::default()
                },
            )
        })
        .unwrap();

    // MINIMUM_IP_TARGET=27 on an m5.large: the primary ENI's 9 and two new ENIs of 9.
    let env = [
        ("IPAMD_POOL_TICK_SECONDS", "1"),
        ("WARM_IP_TARGET", "1"),
        ("MINIMUM_IP_TARGET", "27"),
    ];
    sim.start_ipamd(0, &env, READY)
        .unwrap_or_else(|e| panic!("ipamd: {e}"));
    eventually(Duration::from_secs(60), || {
        let n = attached(&sim).len();
        if n == 3 {
            Ok(())
        } else {
            Err(format!("{n} ENIs"))
        }
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", sim.ipamd_log_tail(0, 40)));
    let enis = attached(&sim);
    let primary_groups = enis[0].3.clone();
    // The first new ENI: B (22 free) — not D (tagged =0, 4091 free), not A (3 left).
    assert_eq!(
        enis[1].2, b,
        "first new ENI in the freest tagged subnet: {enis:?}"
    );
    // The second: B is down to 12 now, C has 15: the next subnet.
    assert_eq!(
        enis[2].2, c,
        "second new ENI moved to the next subnet: {enis:?}"
    );
    for e in &enis[1..] {
        assert_eq!(e.3, primary_groups, "primary ENI's security groups: {e:?}");
        assert_eq!(
            e.4,
            Some(conntrack),
            "primary ENI's connection tracking: {e:?}"
        );
    }
    assert!(
        sim.world.read(|s| s
            .enis
            .values()
            .all(|e| e.subnet_id != d || e.attachment.is_none())),
        "nothing of ours in the excluded subnet"
    );
    // Introspection shows each ENI's subnet; the metric each subnet's free addresses as the
    // last DescribeSubnets saw them (before the second ENI: C had 15, D 4091).
    let v1 = eventually(Duration::from_secs(30), || {
        let v = sim.introspect(0, "/v1/enis")?;
        let n = v["0"]["ENIs"].as_object().map_or(0, serde_json::Map::len);
        if n == 3 {
            Ok(v)
        } else {
            Err(format!("{n} ENIs in the datastore"))
        }
    })
    .expect("/v1/enis lists the three ENIs");
    for (_, id, subnet, ..) in &enis {
        assert_eq!(v1["0"]["ENIs"][id]["SubnetID"], subnet.as_str(), "{v1}");
    }
    let free = |s: &str| {
        metric(
            &sim,
            &format!("awscni_subnet_available_ip_addresses{{subnet=\"{s}\"}}"),
        )
    };
    assert_eq!(free(&d), Some(4091.0));
    assert_eq!(free(&c), Some(15.0));
    let pod = sim
        .add_pod(0, "p0")
        .unwrap_or_else(|e| panic!("ADD: {e}\n{}", sim.ipamd_log_tail(0, 40)));

    // An operator tags C =0: after a restart its ENI is excluded and gives its free addresses
    // back; the pod keeps its address.
    tag(&sim, &c, "0");
    sim.restart_ipamd(0, false, READY)
        .unwrap_or_else(|e| panic!("restart: {e}"));
    let c_eni = enis[2].1.clone();
    eventually(Duration::from_secs(30), || {
        let now = attached(&sim);
        let held = now.iter().find(|e| e.1 == c_eni).map(|e| e.5);
        if held == Some(1) {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .unwrap_or_else(|e| {
        panic!(
            "C's ENI kept its free addresses: {e}\n{}",
            sim.ipamd_log_tail(0, 40)
        )
    });
    let v1 = sim.introspect(0, "/v1/enis").expect("/v1/enis");
    assert_eq!(v1["0"]["ENIs"][&c_eni]["IsExcludedForPodIPs"], true, "{v1}");
    assert!(
        sim.assigned(0).unwrap().contains_key(&pod.ip),
        "pod keeps its address"
    );
}

/// Upstream `tryAssignIPs` (v1.23.1) after a failed assign asks the same ENI for one address,
/// then, with subnet discovery, goes on to the next ENI, and `increaseDatastorePool` then
/// creates an ENI in the freest tagged subnet — all in the same pass. A primary subnet with 3
/// free addresses beside a tagged subnet with room: the primary ENI takes the 3, then pods get
/// addresses from a new ENI in the tagged subnet within seconds, not `SUBNET_EXHAUSTED` for
/// the 120 s back-off.
#[test]
fn a_primary_subnet_running_dry_spills_into_a_tagged_subnet_in_the_same_pass() {
    if !can_run_kernel_tests() {
        return;
    }
    let mut sim = Sim::start(&SimConfig {
        nodes: 1,
        layout: vpcsim::Layout {
            azs: 1,
            subnets_per_az: 2,
            secondary_cidr: None,
        },
        ..SimConfig::default()
    })
    .expect("one node, two subnets");
    let a = sim
        .world
        .read(|s| s.instances[&sim.nodes[0].instance_id].subnet_id.clone());
    let b = sim
        .subnets_in_zone(&sim.node_zone(0))
        .into_iter()
        .map(|(id, _)| id)
        .find(|id| *id != a)
        .expect("a second subnet");
    tag(&sim, &b, "1");
    leave_free(&sim, &a, 3);
    sim.start_ipamd(0, &[("IPAMD_POOL_TICK_SECONDS", "1")], READY)
        .unwrap_or_else(|e| panic!("ipamd: {e}"));
    let mut pods = Vec::new();
    for k in 0..6 {
        let name = format!("spill-{k}");
        pods.push(
            sim.add_pod(0, &name)
                .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", sim.ipamd_log_tail(0, 40))),
        );
    }
    let enis = attached(&sim);
    assert_eq!(enis[0].2, a, "{enis:?}");
    assert_eq!(
        enis[0].5,
        1 + 3,
        "the primary ENI took the primary subnet's last 3 addresses one by one: {enis:?}"
    );
    assert!(
        enis.iter().any(|e| e.0 > 0 && e.2 == b),
        "a new ENI in the tagged subnet: {enis:?}"
    );
    let on_b = pods
        .iter()
        .filter(|p| {
            sim.eni_of(0, p.ip)
                .is_some_and(|e| enis.iter().any(|x| x.1 == e && x.2 == b))
        })
        .count();
    assert!(on_b >= 3, "pods beyond A's 3 addresses come from B: {on_b}");
    assert_eq!(sim.world.read(|s| s.available_ip_count(&a)), 0);
}
