//! Table-driven from upstream docs/eni-and-ip-target.md and docs/prefix-and-ip-target.md:
//! pods arrive one by one; after each, decisions are applied to a simulated node until the
//! policy says Nothing; then the node's shape is compared with the documented row.
use super::*;
use crate::datastore::{DataStore, EniIdentity, IpamKey, PodMetadata};

struct Sim {
    ds: DataStore,
    t: Targets,
    next_ip: u32,
    next_dev: u32,
    now: SystemTime,
    pods: u32,
}

impl Sim {
    fn new(t: Targets) -> Self {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut ds = DataStore::new(Duration::from_secs(30));
        ds.add_eni(spec("eni-0", 0), now).unwrap();
        let mut s = Self {
            ds,
            t,
            next_ip: u32::from(Ipv4Addr::new(198, 18, 0, 0)),
            next_dev: 1,
            now,
            pods: 0,
        };
        s.settle();
        s
    }

    fn cidr(&mut self) -> (Ipv4Net, bool) {
        if self.t.prefix_delegation {
            let n = Ipv4Net::new(Ipv4Addr::from(self.next_ip), 28).unwrap();
            self.next_ip += 16;
            (n, true)
        } else {
            let n = Ipv4Net::new(Ipv4Addr::from(self.next_ip), 32).unwrap();
            self.next_ip += 1;
            (n, false)
        }
    }

    /// Applies a grow decision to the datastore as EC2 would; false for Nothing or Blocked
    /// (settled). A shrink panics: these simulations only grow.
    fn grow(&mut self, d: Decision) -> bool {
        match d {
            Decision::Nothing | Decision::Blocked(_) => return false,
            Decision::AssignIps { eni_id, count } | Decision::AssignPrefixes { eni_id, count } => {
                for _ in 0..count {
                    let (n, p) = self.cidr();
                    self.ds.add_cidr(&eni_id, n, p).unwrap();
                }
            }
            Decision::AllocateEni { count } => {
                let id = format!("eni-{}", self.next_dev);
                self.ds.add_eni(spec(&id, self.next_dev), self.now).unwrap();
                self.next_dev += 1;
                for _ in 0..count {
                    let (n, p) = self.cidr();
                    self.ds.add_cidr(&id, n, p).unwrap();
                }
            }
            other => panic!("unexpected shrink while growing: {other:?}"),
        }
        true
    }

    fn settle(&mut self) {
        for _ in 0..100 {
            let stats = self.ds.stats(self.now);
            let d = decide(
                &stats,
                &self.t,
                Conditions {
                    now: self.now,
                    last_shrink: None,
                    waiting_pods: 0,
                    changes_allowed: true,
                    eni_attachment_allowed: true,
                    excess_since: None,
                },
            );
            if !self.grow(d) {
                return;
            }
        }
        panic!("policy did not settle");
    }

    fn add_pods(&mut self, n: u32) {
        for _ in 0..n {
            self.pods += 1;
            let k = IpamKey::new("aws-cni", &format!("c{}", self.pods), "eth0");
            self.ds
                .assign(&k, PodMetadata::default(), self.now)
                .unwrap();
            self.settle();
        }
    }

    /// (ENIs, total addresses or prefixes, unused addresses)
    fn shape(&self) -> (usize, u32, u32) {
        let s = self.ds.stats(self.now);
        let units = if self.t.prefix_delegation {
            s.prefixes
        } else {
            s.total
        };
        (s.enis.len(), units, s.available())
    }
}

fn spec(id: &str, dev: u32) -> EniIdentity {
    EniIdentity {
        id: id.into(),
        device_number: dev,
        network_card: 0,
        is_primary: dev == 0,
        is_trunk: false,
        is_efa: false,
        is_excluded: false,
        subnet_id: String::new(),
        subnet: "198.18.0.0/16".parse().unwrap(),
        mac: format!("02:00:00:00:00:{dev:02x}"),
        primary_ip: std::net::Ipv4Addr::new(198, 18, 0, 200),
    }
}

fn targets(
    warm_eni: u32,
    warm_ip: u32,
    min_ip: u32,
    warm_prefix: u32,
    pd: bool,
    max_enis: u32,
    per_eni: u32,
) -> Targets {
    Targets {
        warm_eni,
        warm_ip,
        minimum_ip: min_ip,
        warm_prefix,
        prefix_delegation: pd,
        max_enis,
        cidrs_per_eni: per_eni,
        max_pods: None,
    }
}

#[test]
fn eni_and_ip_target_doc_table() {
    // (instance, WARM_ENI, WARM_IP, MIN_IP, pods, ENIs, secondary IPs, unused)
    let t3_small = (3, 3);
    let p3dn = (15, 49);
    let rows = [
        (t3_small, 1, 0, 0, 0, 1, 3, 3),
        (t3_small, 1, 0, 0, 5, 3, 9, 4),
        (t3_small, 1, 0, 0, 9, 3, 9, 0),
        (t3_small, 0, 1, 1, 0, 1, 1, 1),
        (t3_small, 0, 1, 1, 5, 2, 6, 1),
        (t3_small, 0, 1, 1, 9, 3, 9, 0),
        (t3_small, 0, 2, 5, 0, 2, 5, 5),
        (t3_small, 0, 2, 5, 5, 3, 7, 2),
        (t3_small, 0, 2, 5, 9, 3, 9, 0),
        (p3dn, 1, 0, 0, 0, 1, 49, 49),
        (p3dn, 1, 0, 0, 3, 2, 98, 95),
        (p3dn, 1, 0, 0, 95, 3, 147, 52),
        (p3dn, 0, 5, 10, 0, 1, 10, 10),
        (p3dn, 0, 5, 10, 7, 1, 12, 5),
        (p3dn, 0, 5, 10, 15, 1, 20, 5),
        (p3dn, 0, 5, 10, 45, 2, 50, 5),
    ];
    for ((max_enis, per_eni), warm_eni, warm_ip, min_ip, pods, enis, ips, unused) in rows {
        let mut sim = Sim::new(targets(
            warm_eni, warm_ip, min_ip, 0, false, max_enis, per_eni,
        ));
        sim.add_pods(pods);
        assert_eq!(
            sim.shape(),
            (enis, ips, unused),
            "row eni={warm_eni} ip={warm_ip} min={min_ip} pods={pods}"
        );
    }
}

#[test]
fn prefix_and_ip_target_doc_table() {
    // t3.small: 3 ENIs x 3 prefix slots. (WARM_PREFIX, WARM_IP, MIN_IP, pods, ENIs, prefixes, unused IPs)
    let rows = [
        (1, 0, 0, 0, 1, 1, 16),
        (1, 0, 0, 5, 1, 2, 27),
        (1, 0, 0, 16, 1, 2, 16),
        (1, 0, 0, 17, 1, 3, 31),
        (1, 0, 0, 58, 2, 5, 22),
        (0, 1, 1, 0, 1, 1, 16),
        (0, 1, 1, 5, 1, 1, 11),
        (0, 1, 1, 17, 1, 2, 15),
        (0, 1, 1, 58, 2, 4, 6),
        (0, 7, 20, 5, 1, 2, 27),
        (0, 7, 20, 17, 1, 2, 15),
        (0, 7, 20, 58, 2, 5, 22),
    ];
    for (warm_prefix, warm_ip, min_ip, pods, enis, prefixes, unused) in rows {
        let mut sim = Sim::new(targets(0, warm_ip, min_ip, warm_prefix, true, 3, 3));
        sim.add_pods(pods);
        assert_eq!(
            sim.shape(),
            (enis, prefixes, unused),
            "row prefix={warm_prefix} ip={warm_ip} min={min_ip} pods={pods}"
        );
    }
}

fn moment(now: SystemTime) -> Conditions {
    Conditions {
        now,
        last_shrink: None,
        waiting_pods: 0,
        changes_allowed: true,
        eni_attachment_allowed: true,
        excess_since: None,
    }
}

#[test]
fn pd_releases_free_secondary_ips_only_above_the_warm_target() {
    // WARM_PREFIX_TARGET=1 after PD was switched on: (free /32s, free /28s) -> /32s released.
    let t = targets(0, 0, 0, 1, true, 3, 3);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    for (ips, prefix, released) in [
        (5, true, 5),   // a free /28 is the warm pool: every leftover /32 goes
        (20, false, 4), // no /28 yet: keep 16 addresses' worth of /32s
        (16, false, 0), // the fragmentation fallback's /32s ARE the warm pool: no churn
    ] {
        let mut ds = DataStore::new(Duration::from_secs(30));
        ds.add_eni(spec("eni-0", 0), now).unwrap();
        ds.add_eni(spec("eni-1", 1), now).unwrap();
        for i in 0..ips {
            ds.add_cidr(
                "eni-0",
                format!("198.18.1.{}/32", i + 10).parse().unwrap(),
                false,
            )
            .unwrap();
        }
        if prefix {
            // On the other ENI, so the /32s' ENI must be found by what it holds.
            ds.add_cidr("eni-1", "198.18.2.16/28".parse().unwrap(), true)
                .unwrap();
        }
        let d = decide(&ds.stats(now), &t, moment(now));
        let got = match &d {
            Decision::ReleaseIps { eni_id, ips } => {
                assert_eq!(eni_id, "eni-0");
                ips.len()
            }
            Decision::Nothing => 0,
            other => panic!("{other:?}"),
        };
        assert_eq!(got, released, "ips={ips} prefix={prefix}: {d:?}");
    }
    // With WARM_IP_TARGET=2 instead: only the excess over the IP target goes.
    let t = targets(0, 2, 0, 0, true, 3, 3);
    let mut ds = DataStore::new(Duration::from_secs(30));
    ds.add_eni(spec("eni-0", 0), now).unwrap();
    for i in 0..5 {
        ds.add_cidr(
            "eni-0",
            format!("198.18.1.{}/32", i + 10).parse().unwrap(),
            false,
        )
        .unwrap();
    }
    match decide(&ds.stats(now), &t, moment(now)) {
        Decision::ReleaseIps { ips, .. } => assert_eq!(ips.len(), 3),
        other => panic!("{other:?}"),
    }
}

#[test]
fn cooling_addresses_make_the_pool_grow() {
    // #2896: 1 free IP that is cooling must not count as the warm IP.
    let t = targets(0, 1, 0, 0, false, 3, 3);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let mut ds = DataStore::new(Duration::from_secs(30));
    ds.add_eni(spec("eni-0", 0), now).unwrap();
    ds.add_cidr("eni-0", "198.18.0.5/32".parse().unwrap(), false)
        .unwrap();
    let k = IpamKey::new("n", "c", "eth0");
    ds.assign(&k, PodMetadata::default(), now).unwrap();
    ds.unassign(&k, now).unwrap();
    let d = decide(&ds.stats(now + Duration::from_secs(1)), &t, moment(now));
    assert_eq!(
        d,
        Decision::AssignIps {
            eni_id: "eni-0".into(),
            count: 1
        }
    );
}

#[test]
fn shrink_is_paced_and_releases_only_excess() {
    let t = targets(0, 2, 0, 0, false, 3, 10);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let mut ds = DataStore::new(Duration::ZERO);
    ds.add_eni(spec("eni-0", 0), now).unwrap();
    for i in 10..16 {
        ds.add_cidr("eni-0", format!("198.18.0.{i}/32").parse().unwrap(), false)
            .unwrap();
    }
    let stats = ds.stats(now);
    let d = decide(&stats, &t, moment(now));
    let Decision::ReleaseIps { ips, .. } = &d else {
        panic!("{d:?}")
    };
    assert_eq!(ips.len(), 4);
    let recent = Conditions {
        last_shrink: Some(now - Duration::from_secs(10)),
        ..moment(now)
    };
    assert_eq!(decide(&stats, &t, recent), Decision::Nothing);
    let shutting = Conditions {
        changes_allowed: false,
        ..moment(now)
    };
    assert_eq!(decide(&stats, &t, shutting), Decision::Nothing);
}

#[test]
fn empty_old_eni_is_freed_young_one_is_not() {
    let t = targets(1, 0, 0, 0, false, 3, 2);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let mut ds = DataStore::new(Duration::ZERO);
    ds.add_eni(spec("eni-0", 0), t0).unwrap();
    ds.add_cidr("eni-0", "198.18.0.10/32".parse().unwrap(), false)
        .unwrap();
    ds.add_cidr("eni-0", "198.18.0.11/32".parse().unwrap(), false)
        .unwrap();
    for (dev, base) in [(1, 20), (2, 30)] {
        ds.add_eni(spec(&format!("eni-{dev}"), dev), t0).unwrap();
        ds.add_cidr(
            &format!("eni-{dev}"),
            format!("198.18.0.{base}/32").parse().unwrap(),
            false,
        )
        .unwrap();
        ds.add_cidr(
            &format!("eni-{dev}"),
            format!("198.18.0.{}/32", base + 1).parse().unwrap(),
            false,
        )
        .unwrap();
    }
    // 6 free, target 1 ENI (2 IPs): two ENIs are surplus, but none is 60 s old yet.
    assert_eq!(
        decide(
            &ds.stats(t0 + Duration::from_secs(30)),
            &t,
            moment(t0 + Duration::from_secs(30))
        ),
        Decision::Nothing
    );
    let later = t0 + Duration::from_secs(61);
    let spare_long_ago = Conditions {
        excess_since: Some(later - ENI_EXCESS_HOLD),
        ..moment(later)
    };
    assert_eq!(
        decide(&ds.stats(later), &t, spare_long_ago),
        Decision::FreeEni {
            eni_id: "eni-2".into()
        }
    );
}

/// A node with WARM_ENI_TARGET=1 (2 addresses per ENI): eni-0 full with pods, eni-1 and
/// eni-2 (both old) free: one of them is spare.
fn node_with_a_spare_eni(t0: SystemTime) -> DataStore {
    let mut ds = DataStore::new(Duration::from_secs(30));
    for dev in 0..3 {
        ds.add_eni(spec(&format!("eni-{dev}"), dev), t0).unwrap();
        for k in 0..2 {
            ds.add_cidr(
                &format!("eni-{dev}"),
                format!("198.18.0.{}/32", 10 * (dev + 1) + k)
                    .parse()
                    .unwrap(),
                false,
            )
            .unwrap();
        }
    }
    for i in 0..2 {
        ds.assign(
            &IpamKey::new("n", &format!("p{i}"), "eth0"),
            PodMetadata::default(),
            t0,
        )
        .unwrap();
    }
    ds
}

#[test]
fn a_spare_eni_is_freed_only_after_the_pool_has_been_in_excess_for_the_hold() {
    let t = targets(1, 0, 0, 0, false, 3, 2);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let ds = node_with_a_spare_eni(t0);
    let at = t0 + Duration::from_secs(120);
    let stats = ds.stats(at);
    // the tracker starts the clock when it first sees the spare ENI and keeps it
    let since = track_excess(None, &stats, &t, at, 0);
    assert_eq!(since, Some(at));
    assert_eq!(
        track_excess(since, &stats, &t, at + Duration::from_secs(5), 0),
        since
    );
    // a waiting pod is not excess
    assert_eq!(track_excess(since, &stats, &t, at, 1), None);
    let with = |since: Option<SystemTime>, now: SystemTime| Conditions {
        excess_since: since,
        ..moment(now)
    };
    // past every other pacing (ENI lifetime, shrink interval) but not the hold: nothing
    // (WARM_ENI_TARGET never releases single addresses)
    assert_eq!(decide(&stats, &t, with(since, at)), Decision::Nothing);
    let almost = at + ENI_EXCESS_HOLD - Duration::from_secs(1);
    assert_eq!(
        decide(&ds.stats(almost), &t, with(since, almost)),
        Decision::Nothing
    );
    assert_eq!(
        decide(&ds.stats(almost), &t, with(None, almost)),
        Decision::Nothing
    );
    let held = at + ENI_EXCESS_HOLD;
    assert_eq!(
        decide(&ds.stats(held), &t, with(since, held)),
        Decision::FreeEni {
            eni_id: "eni-2".into()
        }
    );
}

#[test]
fn an_eni_a_pods_ipv6_lives_on_is_never_freed() {
    // Issue 28 finding 2 (c): an ENI with no IPv4 assigned may still hold dual-stack pods'
    // /128s of its /80 (`ipv6_assigned`, filled by Index::pool_stats from the IPv6 index):
    // freeing it would take their IPv6s. A /128 on no known ENI (`ipv6_unplaced`) may be on
    // any: no ENI is freed.
    let t = targets(1, 0, 0, 0, false, 3, 2);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let ds = node_with_a_spare_eni(t0);
    let at = t0 + Duration::from_secs(300);
    let held = Conditions {
        excess_since: Some(at - ENI_EXCESS_HOLD),
        ..moment(at)
    };
    let free = |id: &str| Decision::FreeEni { eni_id: id.into() };
    let pin = |stats: &mut PoolStats, id: &str| {
        stats
            .enis
            .iter_mut()
            .find(|e| e.id == id)
            .unwrap()
            .ipv6_assigned = 1;
    };
    let mut stats = ds.stats(at);
    assert_eq!(decide(&stats, &t, held), free("eni-2"));
    pin(&mut stats, "eni-2");
    assert_eq!(
        decide(&stats, &t, held),
        free("eni-1"),
        "the other spare one"
    );
    pin(&mut stats, "eni-1");
    assert_eq!(decide(&stats, &t, held), Decision::Nothing);
    assert_eq!(track_excess(None, &stats, &t, at, 0), None, "no spare ENI");
    let mut stats = ds.stats(at);
    stats.ipv6_unplaced = 1;
    assert_eq!(decide(&stats, &t, held), Decision::Nothing);
}

#[test]
fn a_churning_pool_restarts_the_hold_at_every_dip_below_the_target() {
    // Pods replaced one by one: each deleted address cools down for 30 s, during which
    // the spare ENI is needed for the warm target; the hold never runs out, so the ENI
    // is neither freed nor (after a free) created again.
    let t = targets(1, 0, 0, 0, false, 3, 2);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let mut ds = node_with_a_spare_eni(t0);
    let mut since = None;
    let mut now = t0 + Duration::from_secs(60);
    let mut pod = 2;
    let mut dips = 0;
    for step in 0..120 {
        // every 50 s one pod is replaced on this node
        if step % 10 == 0 {
            let old = IpamKey::new("n", &format!("p{}", pod - 2), "eth0");
            ds.unassign(&old, now).unwrap();
            ds.assign(
                &IpamKey::new("n", &format!("p{pod}"), "eth0"),
                PodMetadata::default(),
                now,
            )
            .unwrap();
            pod += 1;
        }
        let stats = ds.stats(now);
        since = track_excess(since, &stats, &t, now, 0);
        if since.is_none() {
            dips += 1;
        }
        let d = decide(
            &stats,
            &t,
            Conditions {
                excess_since: since,
                ..moment(now)
            },
        );
        assert!(!matches!(d, Decision::FreeEni { .. }), "step {step}: {d:?}");
        now += Duration::from_secs(5);
    }
    assert!(
        dips > 0,
        "the churn never dipped below the target: the test proves nothing"
    );
    // the churn stops: the hold after the last dip (and not before) the spare ENI goes
    let quiet = now + Duration::from_secs(30);
    since = track_excess(since, &ds.stats(quiet), &t, quiet, 0);
    let since_t = since.expect("a quiet pool is in excess");
    let at = |now: SystemTime| {
        decide(
            &ds.stats(now),
            &t,
            Conditions {
                excess_since: since,
                ..moment(now)
            },
        )
    };
    assert_eq!(
        at(since_t + ENI_EXCESS_HOLD - Duration::from_secs(1)),
        Decision::Nothing
    );
    assert!(matches!(
        at(since_t + ENI_EXCESS_HOLD),
        Decision::FreeEni { .. }
    ));
}

#[test]
fn limits_block_growth() {
    let mut t = targets(0, 5, 0, 0, false, 1, 2);
    let now = SystemTime::UNIX_EPOCH;
    let mut ds = DataStore::new(Duration::ZERO);
    ds.add_eni(spec("eni-0", 0), now).unwrap();
    ds.add_cidr("eni-0", "198.18.0.10/32".parse().unwrap(), false)
        .unwrap();
    ds.add_cidr("eni-0", "198.18.0.11/32".parse().unwrap(), false)
        .unwrap();
    assert_eq!(
        decide(&ds.stats(now), &t, moment(now)),
        Decision::Blocked(Blocked::InstanceLimit)
    );
    t.max_pods = Some(2);
    assert_eq!(
        decide(&ds.stats(now), &t, moment(now)),
        Decision::Blocked(Blocked::MaxPods)
    );
}

#[test]
fn waiting_pods_force_growth_even_when_targets_are_met() {
    let t = targets(0, 0, 1, 0, false, 3, 3);
    let now = SystemTime::UNIX_EPOCH;
    let mut ds = DataStore::new(Duration::ZERO);
    ds.add_eni(spec("eni-0", 0), now).unwrap();
    ds.add_cidr("eni-0", "198.18.0.10/32".parse().unwrap(), false)
        .unwrap();
    let k = IpamKey::new("n", "c", "eth0");
    ds.assign(&k, PodMetadata::default(), now).unwrap();
    assert_eq!(decide(&ds.stats(now), &t, moment(now)), Decision::Nothing);
    let waiting = Conditions {
        waiting_pods: 2,
        ..moment(now)
    };
    assert_eq!(
        decide(&ds.stats(now), &t, waiting),
        Decision::AssignIps {
            eni_id: "eni-0".into(),
            count: 2
        }
    );
}

/// upstream ipamd.go `checkAndHandleAllENIExclusion` → `cleanupExcludedENI`, datastore
/// `deallocateEmptyCIDR`: the free CIDRs of an ENI in a subnet tagged
/// `kubernetes.io/role/cni=0` are released whatever the warm targets say; the pool then grows
/// on the usable ENIs, never on the excluded one.
#[test]
fn free_cidrs_of_an_excluded_eni_are_released_and_never_refilled() {
    let mut sim = Sim::new(targets(1, 0, 0, 0, false, 3, 3));
    let excluded = EniIdentity {
        is_excluded: true,
        ..spec("eni-x", 2)
    };
    sim.ds.add_eni(excluded, sim.now).unwrap();
    let ips: Vec<Ipv4Net> = (0..3).map(|_| sim.cidr().0).collect();
    for n in &ips {
        sim.ds.add_cidr("eni-x", *n, false).unwrap();
    }
    let stats = sim.ds.stats(sim.now);
    let moment = Conditions {
        now: sim.now,
        last_shrink: None,
        waiting_pods: 0,
        changes_allowed: true,
        eni_attachment_allowed: true,
        excess_since: None,
    };
    assert_eq!(
        decide(&stats, &sim.t, moment),
        Decision::ReleaseIps {
            eni_id: "eni-x".into(),
            ips: ips.iter().map(Ipv4Net::addr).collect(),
        }
    );
    for n in &ips {
        sim.ds.remove_cidr("eni-x", *n).unwrap();
    }
    let stats = sim.ds.stats(sim.now);
    let d = decide(&stats, &sim.t, moment);
    assert!(
        !matches!(&d, Decision::AssignIps { eni_id, .. } if eni_id == "eni-x"),
        "{d:?}"
    );
}

/// `AWS_MANAGE_ENIS_NON_SCHEDULABLE=false` (upstream's default) on a node tainted
/// `node.kubernetes.io/unschedulable`: upstream `isENIAttachmentAllowed` refuses new addresses
/// and ENIs (increaseDatastorePool) and `tryFreeENI` frees none, so a draining node causes no
/// churn; `tryUnassignCidrsFromAll` is not gated, so excess free addresses are still released,
/// and pods still get what is attached.
#[test]
fn an_unschedulable_node_attaches_and_frees_no_eni_but_releases_excess_addresses() {
    let frozen = |m: Conditions| Conditions {
        eni_attachment_allowed: false,
        ..m
    };
    // Short of addresses: growth is blocked with the reason, not attempted.
    let t = targets(0, 4, 0, 0, false, 3, 10);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let mut ds = DataStore::new(Duration::ZERO);
    ds.add_eni(spec("eni-0", 0), now).unwrap();
    ds.add_cidr("eni-0", "198.18.0.10/32".parse().unwrap(), false)
        .unwrap();
    let stats = ds.stats(now);
    assert!(matches!(
        decide(&stats, &t, moment(now)),
        Decision::AssignIps { .. }
    ));
    assert_eq!(
        decide(&stats, &t, frozen(moment(now))),
        Decision::Blocked(Blocked::NodeUnschedulable)
    );
    // A spare ENI long past its hold: freed when schedulable, kept when not.
    let t = targets(1, 0, 0, 0, false, 3, 2);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    let ds = node_with_a_spare_eni(t0);
    let later = t0 + Duration::from_secs(3600);
    let spare = Conditions {
        excess_since: Some(later - ENI_EXCESS_HOLD),
        ..moment(later)
    };
    assert!(matches!(
        decide(&ds.stats(later), &t, spare),
        Decision::FreeEni { .. }
    ));
    assert!(!matches!(
        decide(&ds.stats(later), &t, frozen(spare)),
        Decision::FreeEni { .. }
    ));
    // Excess free addresses above the warm target are still released.
    let t = targets(0, 2, 0, 0, false, 3, 10);
    let mut ds = DataStore::new(Duration::ZERO);
    ds.add_eni(spec("eni-0", 0), now).unwrap();
    for i in 10..16 {
        ds.add_cidr("eni-0", format!("198.18.0.{i}/32").parse().unwrap(), false)
            .unwrap();
    }
    assert!(matches!(
        decide(&ds.stats(now), &t, frozen(moment(now))),
        Decision::ReleaseIps { .. }
    ));
}

/// Upstream `datastoreTargetState`: for `networkCard > DefaultNetworkCardIndex`,
/// `warmIPTarget = DefaultWarmIPTarget` (1) and `minimumIPTarget = DefaultMinimumIPTarget` (1),
/// whatever WARM_ENI_TARGET/WARM_IP_TARGET/WARM_PREFIX_TARGET the node has; limits and mode stay
/// the node's; card 0 keeps the node's targets.
#[test]
fn a_card_other_than_0_keeps_one_warm_address_whatever_the_node_targets() {
    let node = Targets {
        warm_eni: 1,
        warm_ip: 5,
        minimum_ip: 10,
        warm_prefix: 2,
        prefix_delegation: true,
        max_enis: 8,
        cidrs_per_eni: 49,
        max_pods: Some(110),
    };
    assert_eq!(node.of_card(0), node);
    let t = node.of_card(1);
    assert_eq!(
        (t.warm_eni, t.warm_ip, t.minimum_ip, t.warm_prefix),
        (0, 1, 1, 0)
    );
    assert_eq!(
        (t.max_enis, t.cidrs_per_eni, t.max_pods),
        (8, 49, Some(110))
    );
    assert!(t.prefix_delegation);
}

/// Issue 39, upstream `isConfigValid`: prefix delegation asked on a type without it falls
/// back to secondary IPs in IPv4 and refuses IPv6 mode; otherwise the setting stands.
#[test]
fn prefix_delegation_needs_a_type_that_takes_prefixes() {
    let rows: &[(bool, bool, bool, Result<bool, ()>)] = &[
        // (requested, ipv6 mode, supported) → on
        (true, false, true, Ok(true)),
        (true, false, false, Ok(false)),
        (true, true, false, Err(())),
        (true, true, true, Ok(true)),
        (false, false, false, Ok(false)),
        (false, false, true, Ok(false)),
    ];
    for (requested, v6, supported, want) in rows {
        let got = prefix_delegation_on(*requested, *v6, *supported, "m4.large");
        assert_eq!(
            got.clone().map_err(|_| ()),
            *want,
            "{requested} {v6} {supported}"
        );
        if let Err(e) = got {
            assert!(e.to_string().contains("non-nitro instance m4.large"), "{e}");
        }
    }
}

/// upstream `tryAssignIPs` with subnet discovery: an ENI whose subnet ran dry is passed over
/// (`continue`), the next ENI with room is asked, else a new ENI is created; with no ENI slot
/// left the pool is blocked for the subnets, not for the instance limit.
#[test]
fn an_eni_whose_subnet_ran_dry_is_passed_over() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let t = targets(0, 3, 0, 0, false, 2, 9);
    let mut ds = DataStore::new(Duration::from_secs(30));
    ds.add_eni(spec("eni-0", 0), now).unwrap();
    ds.add_eni(spec("eni-1", 1), now).unwrap();
    let dry = |ids: &[&str]| {
        let mut s = ds.stats(now);
        for e in &mut s.enis {
            e.subnet_dry = ids.contains(&e.id.as_str());
        }
        s
    };
    let d = |s: &PoolStats| decide(s, &t, moment(now));
    assert_eq!(
        d(&dry(&[])),
        Decision::AssignIps {
            eni_id: "eni-0".into(),
            count: 3
        }
    );
    assert_eq!(
        d(&dry(&["eni-0"])),
        Decision::AssignIps {
            eni_id: "eni-1".into(),
            count: 3
        }
    );
    // both dry, no ENI slot left (max 2)
    assert_eq!(
        d(&dry(&["eni-0", "eni-1"])),
        Decision::Blocked(Blocked::SubnetsDry)
    );
    // one ENI, dry, room for another: a new ENI (the provider picks a subnet with room)
    let mut one = DataStore::new(Duration::from_secs(30));
    one.add_eni(spec("eni-0", 0), now).unwrap();
    let mut s = one.stats(now);
    s.enis[0].subnet_dry = true;
    assert_eq!(d(&s), Decision::AllocateEni { count: 3 });
}

mod adaptive;
