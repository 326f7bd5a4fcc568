//! The aggregation table and the pure step "one round of scrapes in → datums out". Owns which
//! awscni_* families are published, under which CloudWatch name, and how the nodes' values combine.
//! Touches no network, clock or CloudWatch types. Why this table: existing CloudWatch dashboards
//! and alarms read these names (where it comes from: docs/compatibility.md).

use std::collections::BTreeMap;

use crate::exposition::Family;
use prometheus_text::Kind;

/// How the nodes' values of one family combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// `metricsAdd`: the sum over every node (and every label set).
    Sum,
    /// `metricsMax`: the largest value of any node.
    Max,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub prometheus: &'static str,
    pub cloudwatch: &'static str,
    pub combine: Combine,
}

const fn rule(prometheus: &'static str, cloudwatch: &'static str, combine: Combine) -> Rule {
    Rule {
        prometheus,
        cloudwatch,
        combine,
    }
}

/// `InterestingCNIMetrics` (cni_metrics.go): 20 families, every one `matchAny`.
pub const TABLE: &[Rule] = &[
    rule(
        "awscni_assigned_ip_addresses",
        "assignIPAddresses",
        Combine::Sum,
    ),
    rule(
        "awscni_total_ip_addresses",
        "totalIPAddresses",
        Combine::Sum,
    ),
    rule(
        "awscni_total_ipv4_prefixes",
        "totalIPv4Prefixes",
        Combine::Sum,
    ),
    rule(
        "awscni_assigned_ip_per_cidr",
        "totalAssignedIPv4sPerCidr",
        Combine::Sum,
    ),
    rule("awscni_eni_allocated", "eniAllocated", Combine::Sum),
    rule("awscni_eni_max", "eniMaxAvailable", Combine::Sum),
    rule("awscni_ip_max", "maxIPAddresses", Combine::Sum),
    rule("awscni_aws_api_latency_ms", "awsAPILatency", Combine::Max),
    rule("awscni_aws_api_error_count", "awsAPIErr", Combine::Sum),
    rule("awscni_aws_utils_error_count", "awsUtilErr", Combine::Sum),
    rule("awscni_ipamd_error_count", "ipamdErr", Combine::Sum),
    rule("awscni_force_removed_enis", "forceRemoveENI", Combine::Sum),
    rule("awscni_force_removed_ips", "forceRemoveIPs", Combine::Sum),
    rule(
        "awscni_ipamd_action_inprogress",
        "ipamdActionInProgress",
        Combine::Sum,
    ),
    rule("awscni_reconcile_count", "reconcileCount", Combine::Sum),
    rule("awscni_add_ip_req_count", "addReqCount", Combine::Sum),
    rule("awscni_del_ip_req_count", "delReqCount", Combine::Sum),
    rule("awscni_pod_eni_error_count", "podENIErr", Combine::Sum),
    rule("awscni_ec2api_req_count", "ec2ApiReqCount", Combine::Sum),
    rule("awscni_ec2api_error_count", "ec2ApiErrCount", Combine::Sum),
];

/// What one aws-node pod served this round (already parsed).
#[derive(Debug, Clone)]
pub struct NodeScrape {
    pub pod: String,
    pub families: BTreeMap<String, Family>,
}

/// One aggregated value to publish (CloudWatch unit is always `Count`).
#[derive(Debug, Clone, PartialEq)]
pub struct Datum {
    pub cloudwatch: &'static str,
    pub prometheus: &'static str,
    pub value: f64,
    /// Every node served the family as a gauge (only gauges go to USE_PROMETHEUS).
    pub gauge: bool,
}

/// Counter totals last seen, per (family, pod): the memory that turns counters into deltas.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CounterMemory {
    last: BTreeMap<(&'static str, String), f64>,
}

/// One node's value of a family: the sum of its samples (`matchAny` + `metricsAdd` within a
/// node), or, for a summary, the p99 quantile (`processPercentile`) combined by the rule.
fn node_value(family: &Family, combine: Combine) -> Option<f64> {
    let values = family.samples.iter().filter_map(|s| match family.kind {
        Some(Kind::Summary) => (s.suffix.is_empty()
            && s.labels.get("quantile").map(String::as_str) == Some("0.99"))
        .then_some(s.value),
        Some(Kind::Histogram) => None,
        _ => s.suffix.is_empty().then_some(s.value),
    });
    let values: Vec<f64> = values.filter(|v| v.is_finite()).collect();
    if values.is_empty() && family.kind == Some(Kind::Summary) {
        // a summary without a 0.99 quantile publishes 0
        return Some(0.0);
    }
    match combine {
        Combine::Sum => Some(values.iter().sum()),
        Combine::Max => values.into_iter().reduce(f64::max),
    }
    .or(Some(0.0))
}

/// One round: every family of `TABLE` that at least one node served becomes one datum. Gauges and
/// summaries: combined across nodes. Counters: each node's increase since its previous scrape (a
/// node seen for the first time, or whose counter went down because ipamd restarted, contributes
/// its whole current value, `cur - 0`), then combined. Nodes that failed to scrape are simply
/// absent.
pub fn aggregate(scrapes: &[NodeScrape], memory: &CounterMemory) -> (Vec<Datum>, CounterMemory) {
    let mut next = CounterMemory::default();
    let mut datums = Vec::new();
    for rule in TABLE {
        let mut combined: Option<f64> = None;
        let mut gauge = true;
        for scrape in scrapes {
            let Some(family) = scrape.families.get(rule.prometheus) else {
                continue;
            };
            let Some(mut value) = node_value(family, rule.combine) else {
                continue;
            };
            gauge &= family.kind == Some(Kind::Gauge);
            if family.kind == Some(Kind::Counter) {
                let key = (rule.prometheus, scrape.pod.clone());
                let last = memory.last.get(&key).copied();
                next.last.insert(key, value);
                if let Some(last) = last
                    && value >= last
                {
                    value -= last;
                }
            }
            combined = Some(match (combined, rule.combine) {
                (None, _) => value,
                (Some(acc), Combine::Sum) => acc + value,
                (Some(acc), Combine::Max) => acc.max(value),
            });
        }
        if let Some(value) = combined {
            datums.push(Datum {
                cloudwatch: rule.cloudwatch,
                prometheus: rule.prometheus,
                value,
                gauge,
            });
        }
    }
    (datums, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::parse;

    fn node(pod: &str, text: &str) -> NodeScrape {
        NodeScrape {
            pod: pod.into(),
            families: parse(text).unwrap(),
        }
    }

    fn value(datums: &[Datum], cw: &str) -> Option<f64> {
        datums.iter().find(|d| d.cloudwatch == cw).map(|d| d.value)
    }

    const A: &str = "# TYPE awscni_total_ip_addresses gauge\nawscni_total_ip_addresses 14\n\
# TYPE awscni_assigned_ip_addresses gauge\nawscni_assigned_ip_addresses 3\n\
# TYPE awscni_eni_max gauge\nawscni_eni_max 3\n\
# TYPE awscni_assigned_ip_per_cidr gauge\n\
awscni_assigned_ip_per_cidr{cidr=\"10.0.0.5/32\"} 1\nawscni_assigned_ip_per_cidr{cidr=\"10.0.0.6/32\"} 1\n\
# TYPE awscni_aws_api_latency_ms summary\n\
awscni_aws_api_latency_ms{api=\"CreateNetworkInterface\",quantile=\"0.5\"} 900\n\
awscni_aws_api_latency_ms{api=\"CreateNetworkInterface\",quantile=\"0.99\"} 40\n\
awscni_aws_api_latency_ms{api=\"AttachNetworkInterface\",quantile=\"0.99\"} 75\n\
awscni_aws_api_latency_ms_sum{api=\"AttachNetworkInterface\"} 5000\n\
# TYPE awscni_add_ip_req_count counter\nawscni_add_ip_req_count 10\n\
# TYPE awscni_ipamd_action_inprogress gauge\n\
awscni_ipamd_action_inprogress{fn=\"nodeIPPoolReconcile\"} 1\n\
awscni_ipamd_action_inprogress{fn=\"increaseIPPool\"} 1\n\
# TYPE go_goroutines gauge\ngo_goroutines 99\n";
    const B: &str = "# TYPE awscni_total_ip_addresses gauge\nawscni_total_ip_addresses 28\n\
# TYPE awscni_assigned_ip_addresses gauge\nawscni_assigned_ip_addresses 5\n\
# TYPE awscni_eni_max gauge\nawscni_eni_max 4\n\
# TYPE awscni_aws_api_latency_ms summary\n\
awscni_aws_api_latency_ms{api=\"AssignPrivateIpAddresses\",quantile=\"0.99\"} 60\n\
# TYPE awscni_add_ip_req_count counter\nawscni_add_ip_req_count 4\n";

    /// Table test: one row per upstream rule kind (cni_metrics.go / metrics.go).
    #[test]
    fn first_round_table() {
        let (d, _) = aggregate(
            &[node("aws-node-a", A), node("aws-node-b", B)],
            &CounterMemory::default(),
        );
        let cases: &[(&str, Option<f64>, &str)] = &[
            ("totalIPAddresses", Some(42.0), "metricsAdd across nodes"),
            ("assignIPAddresses", Some(8.0), "metricsAdd across nodes"),
            ("eniMaxAvailable", Some(7.0), "metricsAdd across nodes"),
            (
                "totalAssignedIPv4sPerCidr",
                Some(2.0),
                "matchAny: every label set adds",
            ),
            (
                "ipamdActionInProgress",
                Some(2.0),
                "matchAny: every label set adds",
            ),
            (
                "awsAPILatency",
                Some(75.0),
                "metricsMax over p99 only (processPercentile)",
            ),
            (
                "addReqCount",
                Some(14.0),
                "counter, first sighting: whole value",
            ),
            ("eniAllocated", None, "served by no node: not published"),
        ];
        for (cw, want, why) in cases {
            assert_eq!(value(&d, cw), *want, "{cw}: {why}");
        }
        assert!(
            d.iter().all(|x| x.prometheus != "go_goroutines"),
            "only TABLE families"
        );
    }

    #[test]
    fn counters_are_per_node_deltas_and_survive_restarts() {
        let (_, mem) = aggregate(&[node("a", A), node("b", B)], &CounterMemory::default());
        let a2 = A.replace("awscni_add_ip_req_count 10", "awscni_add_ip_req_count 25");
        // b's ipamd restarted: 4 → 1 counts as 1 new request
        let b2 = B.replace("awscni_add_ip_req_count 4", "awscni_add_ip_req_count 1");
        let (d, mem) = aggregate(&[node("a", &a2), node("b", &b2)], &mem);
        assert_eq!(value(&d, "addReqCount"), Some(16.0));
        // gauges are not deltas
        assert_eq!(value(&d, "totalIPAddresses"), Some(42.0));
        // a node that failed this round contributes nothing, the other still publishes
        let (d, _) = aggregate(&[node("a", &a2)], &mem);
        assert_eq!(value(&d, "addReqCount"), Some(0.0));
        assert_eq!(value(&d, "totalIPAddresses"), Some(14.0));
    }

    #[test]
    fn table_matches_upstream_size_and_names_are_unique() {
        assert_eq!(TABLE.len(), 20);
        let mut names: Vec<_> = TABLE.iter().map(|r| r.cloudwatch).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 20);
    }
}
