//! The adaptive policy's properties (proptest): the pool it asks for never exceeds max-pods
//! (secondary IPs; with prefixes, max-pods rounded up to a /28 as the static policy does), is
//! never below `MINIMUM_IP_TARGET` (where the limits allow it), and its warm target is monotone
//! in the ADD rate; plus the estimators' and the quantile's stated behaviour.
use proptest::prelude::*;

use super::super::adaptive::{
    self, ArrivalRate, Demand, FALL_TAU, Growth, RefillTimes, poisson_quantile, warm_for,
};
use super::*;

fn demand(rate: f64, assign_ms: u64, eni_ms: u64, subnet_free: Option<u32>) -> Demand {
    let mut refill = RefillTimes::default();
    refill.record(Growth::Assign, Duration::from_millis(assign_ms));
    refill.record(Growth::NewEni, Duration::from_millis(eni_ms));
    Demand {
        rate,
        reaction: Duration::from_secs(5),
        refill,
        subnet_free,
        peaks: adaptive::Peaks::default(),
    }
}

/// Applies grow decisions under the adaptive targets (recomputed before every decision) until
/// the policy says Nothing or Blocked; returns the targets of the last decision.
fn settle(sim: &mut Sim, base: &Targets, d: &Demand) -> Targets {
    for _ in 0..200 {
        let stats = sim.ds.stats(sim.now);
        let t = adaptive::targets(base, &stats, d);
        sim.t = t.clone();
        let decision = decide(
            &stats,
            &t,
            Conditions {
                now: sim.now,
                last_shrink: None,
                waiting_pods: 0,
                changes_allowed: true,
                eni_attachment_allowed: true,
                excess_since: None,
            },
        );
        if !sim.grow(decision) {
            return t;
        }
    }
    panic!("adaptive policy did not settle");
}

fn adaptive_sim(base: &Targets) -> Sim {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let mut ds = DataStore::new(Duration::from_secs(30));
    ds.add_eni(spec("eni-0", 0), now).unwrap();
    Sim {
        ds,
        t: base.clone(),
        next_ip: u32::from(Ipv4Addr::new(198, 18, 0, 0)),
        next_dev: 1,
        now,
        pods: 0,
    }
}

fn base(pd: bool, min_ip: u32, max_pods: Option<u32>, max_enis: u32, per_eni: u32) -> Targets {
    Targets {
        max_pods,
        ..targets(1, 0, min_ip, 1, pd, max_enis, per_eni)
    }
}

/// The case proptest found (a new ENI measured faster than an assign, prefix mode): a higher
/// rate that needs a new ENI must not ask for fewer addresses than a lower one that does not.
#[test]
fn a_new_eni_faster_than_an_assign_keeps_the_target_monotone() {
    let b = base(true, 0, None, 3, 13);
    let mut sim = adaptive_sim(&b);
    settle(&mut sim, &b, &demand(55.93, 3_406, 1_379, None));
    for _ in 0..6 {
        sim.pods += 1;
        let k = IpamKey::new("aws-cni", &format!("c{}", sim.pods), "eth0");
        sim.ds.assign(&k, PodMetadata::default(), sim.now).unwrap();
    }
    let stats = sim.ds.stats(sim.now);
    let low = adaptive::warm_target(&stats, &b, &demand(55.93, 3_406, 1_379, None));
    let high = adaptive::warm_target(&stats, &b, &demand(67.23, 3_406, 1_379, None));
    assert!(low <= high, "{low} > {high}");
}

/// A burst is remembered for BURST_MEMORY and counted within the windows it fits in; the
/// ADDs between two observations count as one arrival.
#[test]
fn bursts_are_counted_within_the_window_and_forgotten_after_the_memory() {
    use adaptive::{BURST_MEMORY, Bursts};
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut b = Bursts::default();
    b.observe(at(0), 100);
    b.observe(at(5), 101); // background
    b.observe(at(10), 107); // a CronJob's 6 pods between two passes
    b.observe(at(15), 108);
    assert_eq!(b.peak(Duration::from_secs(1)), 6);
    assert_eq!(b.peak(Duration::from_secs(6)), 7, "two spans within 6 s");
    assert_eq!(b.peak(Duration::from_secs(60)), 8);
    // samples within the resolution merge (the count only widens)
    b.observe(at(15) + Duration::from_millis(300), 109);
    assert_eq!(b.peak(Duration::from_secs(1)), 6);
    // past the memory, the burst is forgotten
    b.observe(at(10) + BURST_MEMORY + Duration::from_secs(2), 110);
    assert_eq!(
        b.peak(Duration::from_secs(60)),
        1,
        "the 6 are forgotten, the one since the last kept sample counts"
    );
    // a counter that went down starts over
    b.observe(at(10) + BURST_MEMORY + Duration::from_secs(7), 3);
    assert_eq!(b.peak(Duration::from_secs(60)), 0);
}

/// The target covers the largest burst seen within the window, whatever the rate says.
#[test]
fn the_warm_target_covers_the_largest_recent_burst() {
    let b = base(false, 0, None, 3, 10);
    let sim = adaptive_sim(&b);
    let stats = sim.ds.stats(sim.now);
    let mut d = demand(0.02, 500, 5_000, None);
    let quiet = adaptive::warm_target(&stats, &b, &d);
    d.peaks = adaptive::Peaks {
        assign: 6,
        new_eni: 7,
    };
    assert!(quiet < 6, "{quiet}");
    assert_eq!(adaptive::warm_target(&stats, &b, &d), 6);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_pool_never_exceeds_max_pods_nor_falls_below_the_minimum(
        pd in any::<bool>(),
        min_ip in 0u32..60,
        max_pods in proptest::option::of(1u32..120),
        max_enis in 1u32..5,
        per_eni in 1u32..15,
        rate in 0.0f64..50.0,
        assign_ms in 100u64..5_000,
        eni_ms in 500u64..20_000,
        subnet_free in proptest::option::of(0u32..200),
        pods in 0u32..80,
    ) {
        let b = base(pd, min_ip, max_pods, max_enis, per_eni);
        let d = demand(rate, assign_ms, eni_ms, subnet_free);
        let mut sim = adaptive_sim(&b);
        settle(&mut sim, &b, &d);
        let unit = if pd { PREFIX_SIZE } else { 1 };
        let capacity = max_enis * per_eni * unit;
        for _ in 0..pods {
            let stats = sim.ds.stats(sim.now);
            if stats.available() == 0 {
                break;
            }
            sim.pods += 1;
            let k = IpamKey::new("aws-cni", &format!("c{}", sim.pods), "eth0");
            sim.ds.assign(&k, PodMetadata::default(), sim.now).unwrap();
            let t = settle(&mut sim, &b, &d);
            let s = sim.ds.stats(sim.now);
            prop_assert_eq!(t.minimum_ip, min_ip, "MINIMUM_IP_TARGET is kept as given");
            prop_assert!(t.warm_ip >= 1);
            if let Some(max) = max_pods {
                // the static policy's growth cap: max-pods, in whole /28s with prefixes
                prop_assert!(s.total <= max.div_ceil(unit) * unit,
                    "total {} above max-pods {max}", s.total);
            }
            let floor = min_ip.min(max_pods.unwrap_or(u32::MAX)).min(capacity);
            prop_assert!(s.total >= floor, "total {} below the minimum {floor}", s.total);
        }
    }

    #[test]
    fn the_warm_target_is_monotone_in_the_rate(
        pd in any::<bool>(),
        min_ip in 0u32..40,
        max_pods in proptest::option::of(1u32..120),
        per_eni in 1u32..15,
        r1 in 0.0f64..100.0,
        r2 in 0.0f64..100.0,
        assign_ms in 100u64..5_000,
        eni_ms in 500u64..20_000,
        subnet_free in proptest::option::of(0u32..200),
        pods in 0u32..40,
    ) {
        let b = base(pd, min_ip, max_pods, 3, per_eni);
        let (lo, hi) = (r1.min(r2), r1.max(r2));
        // a pool of some shape: grown for the low rate, then pods placed
        let mut sim = adaptive_sim(&b);
        settle(&mut sim, &b, &demand(lo, assign_ms, eni_ms, subnet_free));
        for _ in 0..pods {
            if sim.ds.stats(sim.now).available() == 0 {
                break;
            }
            sim.pods += 1;
            let k = IpamKey::new("aws-cni", &format!("c{}", sim.pods), "eth0");
            sim.ds.assign(&k, PodMetadata::default(), sim.now).unwrap();
        }
        let stats = sim.ds.stats(sim.now);
        let low = adaptive::warm_target(&stats, &b, &demand(lo, assign_ms, eni_ms, subnet_free));
        let high = adaptive::warm_target(&stats, &b, &demand(hi, assign_ms, eni_ms, subnet_free));
        prop_assert!(low <= high, "rate {lo} → {low}, rate {hi} → {high}");
        if let Some(max) = max_pods {
            prop_assert!(high <= max.saturating_sub(stats.assigned).max(1));
        }
    }

    #[test]
    fn the_quantile_is_monotone_in_the_mean(a in 0.0f64..500.0, b in 0.0f64..500.0) {
        let (lo, hi) = (a.min(b), a.max(b));
        prop_assert!(poisson_quantile(lo, 0.999) <= poisson_quantile(hi, 0.999));
    }

    #[test]
    fn a_steady_rate_is_estimated_and_falls_no_faster_than_the_fall_time_constant(
        rate in 0.05f64..20.0,
    ) {
        let mut est = ArrivalRate::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        // observed every second for 10 minutes
        for s in 0..=600u32 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let adds = (rate * f64::from(s)) as u64;
            est.observe(t0 + Duration::from_secs(u64::from(s)), adds);
        }
        let at = t0 + Duration::from_secs(600);
        let r = est.per_second(at);
        prop_assert!((r - rate).abs() <= rate * 0.1 + 1.0 / 30.0, "{rate} estimated {r}");
        // then nothing for 5 minutes, observed every 5 s: it falls with FALL_TAU, no faster
        let mut t = at;
        for _ in 0..60 {
            t += Duration::from_secs(5);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            est.observe(t, (rate * 600.0) as u64);
        }
        let after = est.per_second(t);
        let floor = r * (-300.0 / FALL_TAU.as_secs_f64()).exp();
        prop_assert!(after >= floor * 0.999 && after <= r, "{r} → {after} (floor {floor})");
    }
}

#[test]
fn a_burst_raises_the_rate_at_once() {
    let mut est = ArrivalRate::default();
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
    est.observe(t0, 0);
    est.observe(t0 + Duration::from_secs(1), 30);
    // 30 ADDs in a second: 30 / RISE_TAU = 1 per second at once
    assert!((est.per_second(t0 + Duration::from_secs(1)) - 1.0).abs() < 0.05);
}

#[test]
fn quantile_values() {
    assert_eq!(poisson_quantile(0.0, 0.999), 0);
    // P(N ≤ 4 | 1) = 0.99634, P(N ≤ 5 | 1) = 0.99941
    assert_eq!(poisson_quantile(1.0, 0.999), 5);
    // P(N ≤ 1 | 0.1) = 0.99532, P(N ≤ 2 | 0.1) = 0.99985
    assert_eq!(poisson_quantile(0.1, 0.999), 2);
    // a large mean: about mean + 3.09 √mean
    let q = poisson_quantile(10_000.0, 0.999);
    assert!((10_300..=10_320).contains(&q), "{q}");
    assert_eq!(warm_for(0.0, Duration::from_secs(6)), 1);
}

#[test]
fn refill_estimate_rises_at_once_and_falls_slowly() {
    let mut r = RefillTimes::default();
    assert_eq!(r.of(Growth::Assign), adaptive::PRIOR_ASSIGN_REFILL);
    r.record(Growth::Assign, Duration::from_millis(400));
    assert_eq!(r.of(Growth::Assign), Duration::from_millis(400));
    r.record(Growth::Assign, Duration::from_millis(2_000));
    assert_eq!(r.of(Growth::Assign), Duration::from_millis(2_000));
    r.record(Growth::Assign, Duration::from_millis(400));
    assert_eq!(r.of(Growth::Assign), Duration::from_millis(1_600));
    assert_eq!(r.of(Growth::NewEni), adaptive::PRIOR_ENI_REFILL);
}

#[test]
fn the_new_eni_refill_time_counts_when_the_enis_have_no_room() {
    // secondary IPs, one ENI of 3 full: the next growth is a new ENI
    let b = base(false, 0, None, 3, 3);
    let mut sim = adaptive_sim(&b);
    for _ in 0..3 {
        let (n, p) = sim.cidr();
        sim.ds.add_cidr("eni-0", n, p).unwrap();
    }
    let stats = sim.ds.stats(sim.now);
    // 1 ADD/s, assign 1 s, new ENI 10 s: 6 s → 15, 15 s → more (both beyond the 3 there)
    let d = demand(1.0, 1_000, 10_000, None);
    assert_eq!(warm_for(1.0, Duration::from_secs(6)), 15);
    assert_eq!(
        adaptive::warm_target(&stats, &b, &d),
        warm_for(1.0, Duration::from_secs(15))
    );
    // max-pods and the subnet bound it
    let capped = Targets {
        max_pods: Some(5),
        ..b.clone()
    };
    assert_eq!(adaptive::warm_target(&stats, &capped, &d), 5);
    let d = demand(1.0, 1_000, 10_000, Some(2));
    assert_eq!(adaptive::warm_target(&stats, &b, &d), 5);
}
