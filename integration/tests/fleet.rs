//! The small fleet storm (issue 12) in the test suite: 10 nodes, each a real ipamd in its own
//! vpcsim node namespace against one simulated account, 30 pods per node through AddNetwork at
//! once, one real aws-cni pod per node, then everything deleted. Asserts the invariants, not
//! timings: no ADD given up, none failing while the account throttles, unique addresses owned
//! by the pod's node in EC2, no leaked ENI.
#![allow(clippy::tests_outside_test_module)]

use std::time::Duration;

use integration::fleet::FleetConfig;
use integration::fleet::run::{Scenarios, run};

#[test]
fn a_ten_node_storm_gives_every_pod_a_unique_address_and_leaks_nothing() {
    if !integration::can_run_kernel_tests() {
        return;
    }
    let sc = Scenarios {
        fleet: FleetConfig {
            nodes: 10,
            ..FleetConfig::default()
        },
        storm_pods: 30,
        cni_pods: 1,
        churn: Duration::ZERO,
        idle: Duration::ZERO,
        out_dir: None,
        ..Scenarios::default()
    };
    let out = run(&sc).expect("fleet up");
    println!("{}", out.markdown);
    assert_eq!(out.gave_up, 0, "pods without an address:\n{}", out.markdown);
    assert_eq!(
        out.failed_while_throttled, 0,
        "ADDs failed while throttled:\n{}",
        out.markdown
    );
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    // RSS is reported for every ipamd (a figure, not a limit: debug build, shared machine)
    for (when, rss) in [
        ("storm", out.rss_storm.0),
        ("end", out.rss_end.0),
        ("storm (anonymous)", out.rss_storm.1),
    ] {
        assert_eq!(
            (rss.measured, rss.missing),
            (10, 0),
            "RSS at the {when} of every ipamd: {rss:?}"
        );
        assert!(
            rss.max_kib >= rss.median_kib && rss.median_kib > 0,
            "{rss:?}"
        );
    }
    assert!(out.markdown.contains("ipamd RSS at the end of the run"));
    // Every pod's time to an address is in the report (percentiles), and the stalls line is
    // there (its content is a timing, reported, not asserted).
    assert!(
        out.markdown.contains("time to an address per pod")
            && out.markdown.contains(" p99 ")
            && out
                .markdown
                .contains("no EC2 request and no address handed out"),
        "{}",
        out.markdown
    );
}
