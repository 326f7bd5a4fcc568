//! The Prometheus text format 0.0.4 of the registry ([`super::Metrics`]), under one of two
//! spellings ([`MetricsNaming`]). Hand-written: it owns only the encoding; must not record.
//!
//! Series are recorded under the default names; the spelling is applied only when rendering:
//! - `upstream` (default): the names as they are, so the cni-metrics-helper (which reads
//!   `awscni_add_ip_req_count` as a counter) and existing dashboards keep working. Those names trip
//!   three promtool *lint* rules (counter without `_total`, `_count` suffix on a counter, the `ms`
//!   unit); the output parses cleanly.
//! - `prometheus`: counters end in `_total` (a trailing `_count` is replaced), the latency
//!   summary is `awscni_aws_api_latency_seconds` in seconds; `promtool check metrics` is clean.
//!
//! Why not `prometheus-client`: it always appends `_total` to counters (OpenMetrics), so it cannot
//! produce the default spelling.

use std::fmt::Write as _;

use super::Metrics;
use super::family::Kind;
use crate::config::MetricsNaming;

/// The exposition text of every family with at least one series, names spelled as `naming`
/// says.
#[must_use]
pub fn render(metrics: &Metrics, naming: MetricsNaming) -> String {
    let mut out = String::with_capacity(4096);
    for family in metrics.families() {
        let fam = family.snapshot();
        if fam.series.is_empty() {
            continue;
        }
        let kind = fam.kind.keyword();
        let Exposed {
            name,
            help,
            divisor,
        } = exposed(fam.name, fam.help, fam.kind, naming);
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, sample) in &fam.series {
            let l = render_labels(labels);
            let v = sample.value / divisor;
            let count = sample.count;
            match fam.kind {
                Kind::Summary => {
                    let _ = writeln!(out, "{name}_sum{l} {v}\n{name}_count{l} {count}");
                }
                Kind::Histogram => {
                    for (bound, n) in fam.bounds.iter().zip(sample.buckets) {
                        let mut with_le = labels.clone();
                        with_le.push(("le", bound.to_string()));
                        let _ = writeln!(out, "{name}_bucket{} {n}", render_labels(&with_le));
                    }
                    let mut inf = labels.clone();
                    inf.push(("le", "+Inf".to_owned()));
                    let _ = writeln!(
                        out,
                        "{name}_bucket{} {count}\n{name}_sum{l} {v}\n{name}_count{l} {count}",
                        render_labels(&inf)
                    );
                }
                Kind::Counter | Kind::Gauge => {
                    let _ = writeln!(out, "{name}{l} {v}");
                }
            }
        }
    }
    out
}

/// A family as it appears on the wire.
struct Exposed {
    name: String,
    help: &'static str,
    /// Divisor from the recorded unit to the exposed one.
    divisor: f64,
}

/// The default name, or its conventional spelling (`_total` counters, base units).
fn exposed(name: &'static str, help: &'static str, kind: Kind, naming: MetricsNaming) -> Exposed {
    let same = Exposed {
        name: name.to_owned(),
        help,
        divisor: 1.0,
    };
    match (naming, kind) {
        (MetricsNaming::Upstream, _)
        | (MetricsNaming::Prometheus, Kind::Gauge | Kind::Histogram) => same,
        (MetricsNaming::Prometheus, Kind::Counter) if name.ends_with("_total") => same,
        (MetricsNaming::Prometheus, Kind::Counter) => Exposed {
            name: format!("{}_total", name.strip_suffix("_count").unwrap_or(name)),
            ..same
        },
        (MetricsNaming::Prometheus, Kind::Summary) => match name.strip_suffix("_ms") {
            Some(stem) => Exposed {
                name: format!("{stem}_seconds"),
                help: "AWS API call latency in seconds",
                divisor: 1000.0,
            },
            None => same,
        },
    }
}

/// `{k="v",...}` with names sorted as client_golang sorts them; a histogram's `le` goes last.
fn render_labels(labels: &[(&'static str, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut sorted: Vec<&(&'static str, String)> = labels.iter().collect();
    sorted.sort_by_key(|(k, _)| (*k == "le", *k));
    let inner: Vec<String> = sorted
        .into_iter()
        .map(|(k, v)| {
            format!(
                "{k}=\"{}\"",
                v.replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n")
            )
        })
        .collect();
    format!("{{{}}}", inner.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::DataStore;
    use std::collections::BTreeMap;
    use std::time::SystemTime;

    /// Lint findings inherent in upstream's metric names (the `upstream` spelling).
    const UPSTREAM_LINT: &[&str] = &[
        "should have \"_total\" suffix",
        "should not have \"_count\" suffix",
        "abbreviated units",
    ];

    #[test]
    fn del_reason_label_values_are_a_fixed_set() {
        let m = Metrics::new();
        for i in 0..100 {
            m.del_ip_req(&format!("random-{i}"));
        }
        m.del_ip_req("");
        m.del_ip_req("PodDeleted");
        m.del_ip_req("SetupNSFailed");
        let text = m.render(MetricsNaming::Upstream);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("awscni_del_ip_req_count{"))
            .collect();
        assert_eq!(
            lines,
            [
                "awscni_del_ip_req_count{reason=\"PodDeleted\"} 1",
                "awscni_del_ip_req_count{reason=\"SetupNSFailed\"} 1",
                "awscni_del_ip_req_count{reason=\"other\"} 101",
            ],
            "{text}"
        );
    }

    /// ipamd never force-removes an address a pod holds (it quarantines it): upstream's
    /// families are served for dashboards, at 0.
    #[test]
    fn force_removed_families_are_served_at_zero() {
        let text = Metrics::new().render(MetricsNaming::Upstream);
        for family in ["awscni_force_removed_enis", "awscni_force_removed_ips"] {
            assert!(
                text.lines().any(|l| l == format!("{family} 0")),
                "{family}: {text}"
            );
        }
    }

    #[test]
    fn connmark_backend_gauge_reports_the_hosts_backend() {
        // upstream NewConnmark: ConnmarkBackend.WithLabelValues(backend).Set(1), backend
        // "nftables" on an nf_tables node; UpdateHostSNATRules counts each reconcile, IPv6 mode
        // none.
        let lines = |m: &Metrics| -> Vec<String> {
            m.render(MetricsNaming::Upstream)
                .lines()
                .filter(|l| l.starts_with("awscni_connmark_"))
                .map(str::to_owned)
                .collect()
        };
        let m = Metrics::new();
        m.connmark_reconciled("nftables", true);
        assert_eq!(
            lines(&m),
            [
                "awscni_connmark_backend{backend=\"iptables\"} 0",
                "awscni_connmark_backend{backend=\"nftables\"} 1",
                "awscni_connmark_reconcile_total{result=\"error\"} 0",
                "awscni_connmark_reconcile_total{result=\"success\"} 1",
            ]
        );
        let v6 = Metrics::new();
        v6.connmark_backend_in_use("iptables");
        assert_eq!(
            lines(&v6),
            [
                "awscni_connmark_backend{backend=\"iptables\"} 1",
                "awscni_connmark_backend{backend=\"nftables\"} 0",
                "awscni_connmark_reconcile_total{result=\"error\"} 0",
                "awscni_connmark_reconcile_total{result=\"success\"} 0",
            ]
        );
    }

    /// Every family populated, so the whole name set is rendered.
    fn populated() -> Metrics {
        let m = Metrics::new();
        m.add_ip_req_count.inc();
        m.no_available_ip_addresses.inc();
        m.del_ip_req("PodDeleted");
        m.ipamd_error("AddNetwork");
        m.aws_api_latency("AssignPrivateIpAddresses", false, "200", 12.0);
        m.set_limits(3, 27);
        m.ipamd_startup(None, false, 0.3);
        m.node_initialization(true, 0.2);
        m.connmark_reconciled("iptables", true);
        m.unrecovered_checkpoint_entries.add(2);
        m.config_warning("WARM_IP_TARGET", "fallback");
        m.eniconfig_error("missing_eniconfig");
        m.subnet_available_ip_addresses.set(["subnet-0abc"], 123.0);
        m.address_capacity.set([], 17.0);
        m.address_capacity_exhausted.set([], 0.0);
        m.adaptive_warm_ip_target.set([], 4.0);
        m.adaptive_add_rate.set([], 0.5);
        m.adaptive_refill_seconds.set(["assign"], 0.4);
        m.begin_startup(std::time::Instant::now());
        m.startup_phase("imds");
        m.reconciled(super::super::Reconciled::EniAdd);
        m.pod_eni_error_count.inc(["x"]);
        m.aws_api_error_count.inc(["x", "y"]);
        m.aws_utils_error_count.inc(["y", "x"]);
        m.ec2api_req_count.inc(["x"]);
        m.ec2api_error_count.inc(["x"]);
        m.add_failure("SubnetFull");
        m.add_network_duration(true, 0.02);
        m.checkpoint_write_failures.inc();
        m.rp_filter(true);
        {
            let _g = m.action_in_progress("increaseDatastorePool");
        }
        let mut ds = DataStore::new(std::time::Duration::ZERO);
        let now = SystemTime::UNIX_EPOCH;
        ds.add_eni(
            crate::datastore::EniIdentity {
                id: "eni-1".into(),
                device_number: 0,
                network_card: 0,
                is_primary: true,
                is_trunk: false,
                is_efa: false,
                is_excluded: false,
                subnet_id: String::new(),
                subnet: "198.18.0.0/24".parse().unwrap(),
                mac: String::new(),
                primary_ip: std::net::Ipv4Addr::UNSPECIFIED,
            },
            now,
        )
        .unwrap();
        ds.add_cidr("eni-1", "198.18.0.9/32".parse().unwrap(), false)
            .unwrap();
        ds.assign(
            &crate::datastore::IpamKey::new("n", "c", "eth0"),
            crate::datastore::PodMetadata::default(),
            now,
        )
        .unwrap();
        m.observe_datastore(&ds.stats(now), &ds.usage());
        m
    }

    /// `# TYPE` lines: family name → type.
    fn families(text: &str) -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| {
                let (n, t) = l.split_once(' ').unwrap();
                (n.to_owned(), t.to_owned())
            })
            .collect()
    }

    #[test]
    fn upstream_spelling_keeps_upstreams_names_and_parses() {
        let m = populated();
        let text = m.render(MetricsNaming::Upstream);
        for line in [
            "awscni_add_ip_req_count 1",
            "awscni_assigned_ip_per_eni{eni=\"eni-1\"} 1",
            "awscni_del_ip_req_count{reason=\"PodDeleted\"} 1",
            "awscni_aws_api_latency_ms_sum{api=\"AssignPrivateIpAddresses\",error=\"false\",status=\"200\"} 12",
            "awscni_build_info{",
            "awscni_unrecovered_checkpoint_entries 2",
            "awscni_connmark_backend{backend=\"iptables\"} 1",
            "awscni_connmark_backend{backend=\"nftables\"} 0",
            "awscni_connmark_reconcile_total{result=\"error\"} 0",
            "awscni_connmark_reconcile_total{result=\"success\"} 1",
            "awscni_config_warning{kind=\"fallback\",variable=\"WARM_IP_TARGET\"} 1",
            "awscni_subnet_available_ip_addresses{subnet=\"subnet-0abc\"} 123",
            "awscni_address_capacity 17",
            "awscni_address_capacity_exhausted 0",
            "awscni_adaptive_warm_ip_target 4",
            "awscni_adaptive_refill_seconds{growth=\"assign\"} 0.4",
            "awscni_startup_phase_seconds{phase=\"imds\"} ",
            "awscni_add_failures_total{reason=\"SubnetFull\"} 1",
            "awscni_add_failures_total{reason=\"EniLimit\"} 0",
            "awscni_checkpoint_write_failures_total 1",
            "awscni_rp_filter_strict 1",
            "awscni_add_network_duration_seconds_count{result=\"success\"} 1",
            "# TYPE awscni_ipamd_startup_duration_seconds histogram",
            "awscni_ipamd_startup_duration_seconds_bucket{failure_reason=\"\",success=\"true\",with_api_server=\"false\",le=\"0.25\"} 0",
            "awscni_ipamd_startup_duration_seconds_bucket{failure_reason=\"\",success=\"true\",with_api_server=\"false\",le=\"0.5\"} 1",
            "awscni_ipamd_startup_duration_seconds_bucket{failure_reason=\"\",success=\"true\",with_api_server=\"false\",le=\"+Inf\"} 1",
            "awscni_ipamd_startup_duration_seconds_count{failure_reason=\"\",success=\"true\",with_api_server=\"false\"} 1",
            "awscni_ipamd_node_initialization_duration_seconds_bucket{success=\"true\",le=\"0.25\"} 1",
            "awscni_ipamd_node_initialization_duration_seconds_sum{success=\"true\"} 0.2",
            // every set-up phase exposed before its first observation, over 1 ms to 100 s
            "awscni_pod_network_setup_seconds_bucket{phase=\"ec2_call\",le=\"0.001\"} 0",
            "awscni_pod_network_setup_seconds_bucket{phase=\"plugin_total\",le=\"100\"} 0",
            "awscni_pod_network_setup_seconds_count{phase=\"policy_agent\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }

        let fams = families(&text);
        let expected: Vec<&str> = m.families().iter().map(|f| f.name()).collect();
        assert_eq!(expected.len(), 42, "every family declared");
        assert_eq!(
            fams.keys()
                .map(String::as_str)
                .collect::<std::collections::BTreeSet<_>>(),
            expected.into_iter().collect(),
            "every upstream family is rendered under its own name"
        );
        assert_eq!(fams["awscni_add_ip_req_count"], "counter");
        assert_eq!(fams["awscni_ipamd_startup_duration_seconds"], "histogram");
        assert_eq!(fams["awscni_connmark_reconcile_total"], "counter");
        assert_eq!(fams["awscni_aws_api_latency_ms"], "summary");
        let (code, report) = crate::metrics::promtool::check(&text);
        // Exit 1 = parse error; 3 = lint findings only.
        assert_eq!(code, Some(3), "{report}\n{text}");
        for line in report.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                UPSTREAM_LINT.iter().any(|a| line.contains(a)),
                "unexpected promtool finding: {line}\n{text}"
            );
        }
    }

    #[test]
    fn prometheus_spelling_is_promtool_clean() {
        let m = populated();
        let text = m.render(MetricsNaming::Prometheus);
        let (code, report) = crate::metrics::promtool::check(&text);
        assert_eq!(code, Some(0), "promtool findings:\n{report}\n{text}");
        assert!(report.trim().is_empty(), "{report}");
        for line in [
            "# TYPE awscni_add_ip_req_total counter",
            "awscni_add_ip_req_total 1",
            "awscni_no_available_ip_addresses_total 1",
            "awscni_del_ip_req_total{reason=\"PodDeleted\"} 1",
            "awscni_ipamd_error_total{fn=\"AddNetwork\"} 1",
            "# TYPE awscni_aws_api_latency_seconds summary",
            "awscni_aws_api_latency_seconds_sum{api=\"AssignPrivateIpAddresses\",error=\"false\",status=\"200\"} 0.012",
            "awscni_aws_api_latency_seconds_count{api=\"AssignPrivateIpAddresses\",error=\"false\",status=\"200\"} 1",
            "awscni_assigned_ip_addresses 1",
            "awscni_unrecovered_checkpoint_entries_total 2",
            "awscni_connmark_reconcile_total{result=\"success\"} 1",
            "# TYPE awscni_ipamd_node_initialization_duration_seconds histogram",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        // Same families, one to one, same types: only the spelling differs.
        let upstream = families(&m.render(MetricsNaming::Upstream));
        let conventional = families(&text);
        assert_eq!(upstream.len(), conventional.len());
        let mut types_u: Vec<_> = upstream.values().collect();
        let mut types_c: Vec<_> = conventional.values().collect();
        types_u.sort();
        types_c.sort();
        assert_eq!(types_u, types_c);
    }
}
