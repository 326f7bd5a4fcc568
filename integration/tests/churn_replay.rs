//! The churn replay (issue 41) in the test suite, small: 3 nodes (real ipamds against the
//! simulated VPC, EC2 latency and attach delay on), one short steady trace, the default and the
//! adaptive policy, each on a fresh fleet. Asserts the invariants, not timings: no address held
//! by two live pods, every ADD answered, every DEL accepted, the counts adding up, and that the
//! report has a row per policy and the acceptance reading, and that the adaptive policy's target
//! reaches every node's /metrics.
#![allow(clippy::tests_outside_test_module)]

use integration::fleet::churn::TraceKind;
use integration::fleet::replay::{self, Policy, ReplayConfig};

#[test]
fn a_short_steady_trace_on_three_nodes_answers_every_add_once_per_policy() {
    if !integration::can_run_kernel_tests() {
        return;
    }
    let cfg = ReplayConfig {
        nodes: 3,
        length: 35.0,
        traces: vec![TraceKind::Steady],
        policies: vec![Policy::default_static(), Policy::adaptive()],
        ..ReplayConfig::default()
    };
    let rows = replay::replay_all(&cfg).expect("fleet up");
    let md = replay::markdown(&cfg, &rows);
    println!("{md}");
    assert_eq!(rows.len(), 2, "{md}");
    for r in &rows {
        assert!(r.violations.is_empty(), "{}: {:?}", r.policy, r.violations);
        assert_eq!(r.gave_up, 0, "{}: pods without an address\n{md}", r.policy);
        assert!(r.adds > 0 && r.pods >= r.adds, "{md}");
        assert_eq!(
            r.answered, r.adds,
            "{}: every measured ADD answered",
            r.policy
        );
        assert!(r.fast <= r.answered);
        assert!(r.p50 <= r.p99 && r.p99 <= r.max, "{md}");
        // the fleet holds addresses: 3 nodes' primaries at least
        assert!(r.peak_subnet >= 3, "{md}");
        // the adaptive policy publishes its target on every node; the static one none
        assert_eq!(r.adaptive_targets.len(), 3);
        if r.policy == "adaptive" {
            assert!(
                r.adaptive_targets
                    .iter()
                    .all(|t| t.is_some_and(|t| t >= 1.0)),
                "{:?}",
                r.adaptive_targets
            );
        } else {
            assert!(
                r.adaptive_targets.iter().all(Option::is_none),
                "{:?}",
                r.adaptive_targets
            );
        }
    }
    assert!(
        md.contains("| steady | adaptive |") && md.contains("idle ≤ 1/3 of default"),
        "{md}"
    );
}
