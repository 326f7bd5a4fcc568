//! Prometheus metrics with upstream's `awscni_*` series, labels and types (reference §1.6),
//! rendered in the Prometheus text format 0.0.4 under one of two spellings
//! ([`MetricsNaming`]). Must not: decide anything, do I/O.
//!
//! Series are recorded under upstream's names; the spelling is applied only when rendering:
//! - `upstream` (default): upstream's exact names, so the cni-metrics-helper (which reads
//!   `awscni_add_ip_req_count` as a counter) and existing dashboards keep working. Those names
//!   trip three promtool *lint* rules (counter without `_total`, `_count` suffix on a counter,
//!   the `ms` unit); the output parses cleanly.
//! - `prometheus`: counters end in `_total` (a trailing `_count` is replaced), the latency
//!   summary is `awscni_aws_api_latency_seconds` in seconds; `promtool check metrics` is clean.
//!
//! Why not `prometheus-client`: it always appends `_total` to counters (OpenMetrics), so it
//! cannot produce upstream's spelling.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use crate::config::MetricsNaming;
use crate::datastore::DataStore;

/// A label-less counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// +1.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// +n.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

type Labels = Vec<(&'static str, String)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Summary,
    Histogram,
}

/// Prometheus' default histogram buckets (client_golang `DefBuckets`), which upstream's
/// startup histograms use.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Debug)]
struct Family {
    help: &'static str,
    kind: Kind,
    /// labels → value (summary and histogram: (sum, count)).
    series: BTreeMap<Vec<(&'static str, String)>, (f64, u64)>,
    /// Histogram only: labels → cumulative count per [`DEFAULT_BUCKETS`] bound.
    buckets: BTreeMap<Vec<(&'static str, String)>, [u64; DEFAULT_BUCKETS.len()]>,
}

/// Every ipamd metric.
#[derive(Debug)]
pub struct Metrics {
    /// `awscni_add_ip_req_count`.
    pub add_ip_req_count: Counter,
    /// `awscni_no_available_ip_addresses`.
    pub no_available_ip_addresses: Counter,
    /// `awscni_force_removed_enis`.
    pub force_removed_enis: Counter,
    /// `awscni_force_removed_ips`.
    pub force_removed_ips: Counter,
    /// `awscni_unrecovered_checkpoint_entries`: restored entries whose address was on no known
    /// ENI (kept pending verification here; upstream dropped them).
    pub unrecovered_checkpoint_entries: Counter,
    families: Mutex<BTreeMap<&'static str, Family>>,
}

const LABELED: &[(&str, &str, Kind)] = &[
    (
        "awscni_ipamd_error_count",
        "The number of errors encountered in ipamd",
        Kind::Counter,
    ),
    (
        "awscni_ipamd_action_inprogress",
        "The number of ipamd actions in progress",
        Kind::Gauge,
    ),
    (
        "awscni_reconcile_count",
        "The number of times ipamd reconciles on ENIs and IP/Prefix addresses",
        Kind::Counter,
    ),
    (
        "awscni_del_ip_req_count",
        "The number of CNI IP release requests",
        Kind::Counter,
    ),
    (
        "awscni_pod_eni_error_count",
        "The number of errors encountered for pod ENIs",
        Kind::Counter,
    ),
    (
        "awscni_aws_api_latency_ms",
        "AWS API call latency in ms",
        Kind::Summary,
    ),
    (
        "awscni_aws_api_error_count",
        "The number of times AWS API returns an error",
        Kind::Counter,
    ),
    (
        "awscni_aws_utils_error_count",
        "The number of errors not handled in awsutils library",
        Kind::Counter,
    ),
    (
        "awscni_ec2api_req_count",
        "The number of requests made to EC2 APIs by CNI",
        Kind::Counter,
    ),
    (
        "awscni_ec2api_error_count",
        "The number of failed EC2 APIs requests",
        Kind::Counter,
    ),
    (
        "awscni_eni_max",
        "The maximum number of ENIs that can be attached to the instance, accounting for unmanaged ENIs",
        Kind::Gauge,
    ),
    (
        "awscni_ip_max",
        "The maximum number of IP addresses that can be allocated to the instance",
        Kind::Gauge,
    ),
    (
        "awscni_eni_allocated",
        "The number of ENIs allocated",
        Kind::Gauge,
    ),
    (
        "awscni_total_ip_addresses",
        "The total number of IP addresses",
        Kind::Gauge,
    ),
    (
        "awscni_assigned_ip_addresses",
        "The number of IP addresses assigned to pods",
        Kind::Gauge,
    ),
    (
        "awscni_total_ipv4_prefixes",
        "The total number of IPv4 prefixes",
        Kind::Gauge,
    ),
    (
        "awscni_assigned_ip_per_cidr",
        "The total number of IP addresses assigned per cidr",
        Kind::Gauge,
    ),
    (
        "awscni_assigned_ip_per_eni",
        "The number of allocated ips partitioned by eni",
        Kind::Gauge,
    ),
    (
        "awscni_ipamd_startup_duration_seconds",
        "The duration of IPAMD startup from process start to ready to serve CNI requests",
        Kind::Histogram,
    ),
    (
        "awscni_ipamd_node_initialization_duration_seconds",
        "The duration of node initialization during IPAMD startup",
        Kind::Histogram,
    ),
    (
        "awscni_connmark_backend",
        "The connmark backend in use; the active backend's series is set to 1",
        Kind::Gauge,
    ),
    (
        "awscni_connmark_reconcile_total",
        "The number of connmark Setup/Cleanup reconciliations by result",
        Kind::Counter,
    ),
    (
        "awscni_config_warning",
        "Ours: 1 per environment variable whose value was replaced by upstream's fallback (kind=fallback) or has no effect here (kind=unimplemented)",
        Kind::Gauge,
    ),
    (
        "awscni_eniconfig_error_count",
        "Ours: the number of times custom networking created no ENI because the node's ENIConfig was missing or unusable, by reason",
        Kind::Counter,
    ),
    (
        "awscni_build_info",
        "A metric with a constant '1' value labeled by version, revision, and goversion from which amazon-vpc-cni-k8s was built.",
        Kind::Gauge,
    ),
];

/// Decrements an in-progress gauge when dropped.
#[derive(Debug)]
pub struct InProgress<'a> {
    metrics: &'a Metrics,
    name: &'static str,
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.metrics.add(
            "awscni_ipamd_action_inprogress",
            vec![("fn", self.name.to_owned())],
            -1.0,
        );
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All families registered; `awscni_build_info` set.
    #[must_use]
    pub fn new() -> Self {
        let families = LABELED
            .iter()
            .map(|(name, help, kind)| {
                (
                    *name,
                    Family {
                        help,
                        kind: *kind,
                        series: BTreeMap::new(),
                        buckets: BTreeMap::new(),
                    },
                )
            })
            .collect();
        let m = Self {
            add_ip_req_count: Counter::default(),
            no_available_ip_addresses: Counter::default(),
            force_removed_enis: Counter::default(),
            force_removed_ips: Counter::default(),
            unrecovered_checkpoint_entries: Counter::default(),
            families: Mutex::new(families),
        };
        // Upstream registers both results at zero, so rate() works from the first scrape.
        for result in ["success", "error"] {
            m.add(
                "awscni_connmark_reconcile_total",
                vec![("result", result.to_owned())],
                0.0,
            );
        }
        m.set(
            "awscni_build_info",
            vec![
                ("version", ipamd_proto::build_version().to_owned()),
                ("goversion", "rust".to_owned()),
            ],
            1.0,
        );
        m
    }

    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<&'static str, Family>) -> R) -> R {
        let mut g = self
            .families
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut g)
    }

    /// Sets a gauge series.
    pub fn set(&self, name: &'static str, labels: Labels, v: f64) {
        self.with(|f| {
            if let Some(fam) = f.get_mut(name) {
                fam.series.insert(labels, (v, 0));
            }
        });
    }

    /// Adds to a counter/gauge series.
    pub fn add(&self, name: &'static str, labels: Labels, v: f64) {
        self.with(|f| {
            if let Some(fam) = f.get_mut(name) {
                fam.series.entry(labels).or_insert((0.0, 0)).0 += v;
            }
        });
    }

    /// `awscni_config_warning{variable,kind} 1`: a setting ipamd did not take as given (see
    /// `config::ConfigWarning`). Bounded: one series per known variable.
    pub fn config_warning(&self, variable: &'static str, kind: &'static str) {
        self.set(
            "awscni_config_warning",
            vec![("kind", kind.to_owned()), ("variable", variable.to_owned())],
            1.0,
        );
    }

    /// `awscni_eniconfig_error_count{reason}` +1: custom networking refused to create an ENI.
    pub fn eniconfig_error(&self, reason: &'static str) {
        self.add(
            "awscni_eniconfig_error_count",
            vec![("reason", reason.to_owned())],
            1.0,
        );
    }

    /// Records a summary observation (sum and count).
    pub fn observe(&self, name: &'static str, labels: Labels, v: f64) {
        self.with(|f| {
            if let Some(fam) = f.get_mut(name) {
                let e = fam.series.entry(labels).or_insert((0.0, 0));
                e.0 += v;
                e.1 += 1;
            }
        });
    }

    /// Records a histogram observation in [`DEFAULT_BUCKETS`].
    fn observe_histogram(&self, name: &'static str, labels: Labels, v: f64) {
        self.with(|f| {
            if let Some(fam) = f.get_mut(name) {
                let e = fam.series.entry(labels.clone()).or_insert((0.0, 0));
                e.0 += v;
                e.1 += 1;
                let b = fam.buckets.entry(labels).or_default();
                for (count, bound) in b.iter_mut().zip(DEFAULT_BUCKETS) {
                    if v <= bound {
                        *count += 1;
                    }
                }
            }
        });
    }

    /// `awscni_ipamd_startup_duration_seconds{success,with_api_server,failure_reason}`: process
    /// start to serving CNI requests. ipamd never waits for the API server here.
    pub fn ipamd_startup(&self, failure_reason: Option<&str>, seconds: f64) {
        self.observe_histogram(
            "awscni_ipamd_startup_duration_seconds",
            vec![
                ("success", failure_reason.is_none().to_string()),
                ("with_api_server", "false".to_owned()),
                (
                    "failure_reason",
                    failure_reason.unwrap_or_default().to_owned(),
                ),
            ],
            seconds,
        );
    }

    /// `awscni_ipamd_node_initialization_duration_seconds{success}`.
    pub fn node_initialization(&self, success: bool, seconds: f64) {
        self.observe_histogram(
            "awscni_ipamd_node_initialization_duration_seconds",
            vec![("success", success.to_string())],
            seconds,
        );
    }

    /// `awscni_connmark_backend{backend}` = 1 for the backend in use (others 0), and
    /// `awscni_connmark_reconcile_total{result}` +1 for one set-up of the connmark rules.
    pub fn connmark_reconciled(&self, backend: &str, ok: bool) {
        for b in ["iptables", "nftables"] {
            self.set(
                "awscni_connmark_backend",
                vec![("backend", b.to_owned())],
                if b == backend { 1.0 } else { 0.0 },
            );
        }
        self.add(
            "awscni_connmark_reconcile_total",
            vec![("result", if ok { "success" } else { "error" }.to_owned())],
            1.0,
        );
    }

    /// `awscni_ipamd_error_count{fn}` +1.
    /// `awscni_reconcile_count{fn}` +1: one ENI or CIDR reconciled into or out of the
    /// datastore, with upstream's `fn` values (`eniReconcileAdd`, `eniReconcileDel`,
    /// `eniIPPoolReconcileDel`, `eniDataStorePoolReconcileAdd`).
    pub fn reconciled(&self, func: &'static str) {
        self.add("awscni_reconcile_count", vec![("fn", func.to_owned())], 1.0);
    }

    /// `awscni_ipamd_error_count{fn}` +1.
    pub fn ipamd_error(&self, func: &str) {
        self.add(
            "awscni_ipamd_error_count",
            vec![("fn", func.to_owned())],
            1.0,
        );
    }

    /// `awscni_del_ip_req_count{reason}` +1. The reason comes from the client: only the
    /// reasons upstream's plugin sends are kept as label values, anything else (empty, or
    /// arbitrary text from a foreign client) is counted as `other`, so the label's cardinality
    /// stays bounded.
    pub fn del_ip_req(&self, reason: &str) {
        let reason = match reason {
            ipamd_proto::del_reason::POD_DELETED | ipamd_proto::del_reason::SETUP_NS_FAILED => {
                reason
            }
            _ => "other",
        };
        self.add(
            "awscni_del_ip_req_count",
            vec![("reason", reason.to_owned())],
            1.0,
        );
    }

    /// `awscni_aws_api_latency_ms{api,error,status}` (for the EC2 layer, issue 5).
    pub fn aws_api_latency(&self, api: &str, error: bool, status: &str, ms: f64) {
        self.observe(
            "awscni_aws_api_latency_ms",
            vec![
                ("api", api.to_owned()),
                ("error", error.to_string()),
                ("status", status.to_owned()),
            ],
            ms,
        );
    }

    /// Marks an action in progress until the guard drops.
    pub fn action_in_progress(&self, func: &'static str) -> InProgress<'_> {
        self.add(
            "awscni_ipamd_action_inprogress",
            vec![("fn", func.to_owned())],
            1.0,
        );
        InProgress {
            metrics: self,
            name: func,
        }
    }

    /// Instance limits gauges.
    pub fn set_limits(&self, max_enis: u32, max_ips: u32) {
        self.set("awscni_eni_max", vec![], f64::from(max_enis));
        self.set("awscni_ip_max", vec![], f64::from(max_ips));
    }

    /// Datastore gauges.
    pub fn observe_datastore(&self, ds: &DataStore, now: SystemTime) {
        let stats = ds.stats(now);
        self.set("awscni_eni_allocated", vec![], stats.enis.len() as f64);
        self.set("awscni_total_ip_addresses", vec![], f64::from(stats.total));
        self.set(
            "awscni_assigned_ip_addresses",
            vec![],
            f64::from(stats.assigned),
        );
        self.set(
            "awscni_total_ipv4_prefixes",
            vec![],
            f64::from(stats.prefixes),
        );
        let mut per_eni = BTreeMap::new();
        let mut per_cidr = BTreeMap::new();
        for eni in ds.enis().values() {
            let mut n = 0u32;
            for c in eni.cidrs.values() {
                let a = u32::try_from(
                    c.slots
                        .values()
                        .filter(|s| matches!(s, crate::datastore::Slot::Assigned { .. }))
                        .count(),
                )
                .unwrap_or(0);
                n += a;
                if a > 0 {
                    per_cidr.insert(c.net.to_string(), a);
                }
            }
            per_eni.insert(eni.id.clone(), n);
        }
        self.with(|f| {
            if let Some(fam) = f.get_mut("awscni_assigned_ip_per_eni") {
                fam.series = per_eni
                    .into_iter()
                    .map(|(k, v)| (vec![("eni", k)], (f64::from(v), 0)))
                    .collect();
            }
            if let Some(fam) = f.get_mut("awscni_assigned_ip_per_cidr") {
                fam.series = per_cidr
                    .into_iter()
                    .map(|(k, v)| (vec![("cidr", k)], (f64::from(v), 0)))
                    .collect();
            }
        });
    }

    /// The exposition text, names spelled as `naming` says.
    #[must_use]
    pub fn render(&self, naming: MetricsNaming) -> String {
        let mut out = String::with_capacity(4096);
        let plain = [
            (
                "awscni_add_ip_req_count",
                "The number of CNI AddNetwork calls",
                &self.add_ip_req_count,
            ),
            (
                "awscni_no_available_ip_addresses",
                "The number of pod IP assignments that fail due to no available IP addresses",
                &self.no_available_ip_addresses,
            ),
            (
                "awscni_force_removed_enis",
                "The number of ENIs force removed while they had assigned pods",
                &self.force_removed_enis,
            ),
            (
                "awscni_force_removed_ips",
                "The number of IPs force removed while they had assigned pods",
                &self.force_removed_ips,
            ),
            (
                "awscni_unrecovered_checkpoint_entries",
                "The number of checkpointed pod allocations that could not be matched to the ENI pool during ipam state recovery",
                &self.unrecovered_checkpoint_entries,
            ),
        ];
        for (name, help, c) in plain {
            let Exposed { name, help, .. } = exposed(name, help, Kind::Counter, naming);
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                c.get()
            );
        }
        self.with(|families| {
            for (name, fam) in families.iter() {
                if fam.series.is_empty() {
                    continue;
                }
                let kind = match fam.kind {
                    Kind::Counter => "counter",
                    Kind::Gauge => "gauge",
                    Kind::Summary => "summary",
                    Kind::Histogram => "histogram",
                };
                let Exposed {
                    name,
                    help,
                    divisor,
                } = exposed(name, fam.help, fam.kind, naming);
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
                for (labels, (v, count)) in &fam.series {
                    let l = render_labels(labels);
                    let v = v / divisor;
                    match fam.kind {
                        Kind::Summary => {
                            let _ = writeln!(out, "{name}_sum{l} {v}\n{name}_count{l} {count}");
                        }
                        Kind::Histogram => {
                            let cumulative = fam.buckets.get(labels).copied().unwrap_or_default();
                            for (bound, n) in DEFAULT_BUCKETS.iter().zip(cumulative) {
                                let mut with_le = labels.clone();
                                with_le.push(("le", bound.to_string()));
                                let _ =
                                    writeln!(out, "{name}_bucket{} {n}", render_labels(&with_le));
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
        });
        out
    }
}

/// A family as it appears on the wire.
struct Exposed {
    name: String,
    help: &'static str,
    /// Divisor from the recorded unit to the exposed one.
    divisor: f64,
}

/// Upstream's name, or its conventional spelling (`_total` counters, base units).
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
    use std::io::Write;
    use std::process::{Command, Stdio};

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

    /// Every family populated, so the whole name set is rendered.
    fn populated() -> Metrics {
        let m = Metrics::new();
        m.add_ip_req_count.inc();
        m.no_available_ip_addresses.inc();
        m.del_ip_req("PodDeleted");
        m.ipamd_error("AddNetwork");
        m.aws_api_latency("AssignPrivateIpAddresses", false, "200", 12.0);
        m.set_limits(3, 27);
        m.ipamd_startup(None, 0.3);
        m.node_initialization(true, 0.2);
        m.connmark_reconciled("iptables", true);
        m.unrecovered_checkpoint_entries.add(2);
        m.config_warning("WARM_IP_TARGET", "fallback");
        m.eniconfig_error("missing_eniconfig");
        for (name, labels) in [
            (
                "awscni_reconcile_count",
                vec![("fn", "eniReconcileAdd".to_owned())],
            ),
            ("awscni_pod_eni_error_count", vec![("fn", "x".to_owned())]),
            (
                "awscni_aws_api_error_count",
                vec![("api", "x".to_owned()), ("error", "y".to_owned())],
            ),
            (
                "awscni_aws_utils_error_count",
                vec![("fn", "x".to_owned()), ("error", "y".to_owned())],
            ),
            ("awscni_ec2api_req_count", vec![("fn", "x".to_owned())]),
            ("awscni_ec2api_error_count", vec![("fn", "x".to_owned())]),
        ] {
            m.add(name, labels, 1.0);
        }
        {
            let _g = m.action_in_progress("increaseDatastorePool");
        }
        let mut ds = DataStore::new(std::time::Duration::ZERO);
        let now = SystemTime::UNIX_EPOCH;
        ds.add_eni(
            crate::datastore::EniSpec {
                id: "eni-1".into(),
                device_number: 0,
                network_card: 0,
                is_primary: true,
                is_trunk: false,
                is_efa: false,
                is_excluded: false,
                subnet_id: String::new(),
                subnet: "198.18.0.0/24".parse().unwrap(),
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
        m.observe_datastore(&ds, now);
        m
    }

    /// `promtool check metrics` on `text`: (exit code, report).
    fn promtool(text: &str) -> (Option<i32>, String) {
        let mut child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("promtool is installed (integration/test.sh)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), report)
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
        let text = populated().render(MetricsNaming::Upstream);
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
            "# TYPE awscni_ipamd_startup_duration_seconds histogram",
            "awscni_ipamd_startup_duration_seconds_bucket{failure_reason=\"\",success=\"true\",with_api_server=\"false\",le=\"0.25\"} 0",
            "awscni_ipamd_startup_duration_seconds_bucket{failure_reason=\"\",success=\"true\",with_api_server=\"false\",le=\"0.5\"} 1",
            "awscni_ipamd_startup_duration_seconds_bucket{failure_reason=\"\",success=\"true\",with_api_server=\"false\",le=\"+Inf\"} 1",
            "awscni_ipamd_startup_duration_seconds_count{failure_reason=\"\",success=\"true\",with_api_server=\"false\"} 1",
            "awscni_ipamd_node_initialization_duration_seconds_bucket{success=\"true\",le=\"0.25\"} 1",
            "awscni_ipamd_node_initialization_duration_seconds_sum{success=\"true\"} 0.2",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }

        let fams = families(&text);
        let expected: Vec<&str> = LABELED
            .iter()
            .map(|(n, ..)| *n)
            .chain([
                "awscni_add_ip_req_count",
                "awscni_no_available_ip_addresses",
                "awscni_force_removed_enis",
                "awscni_force_removed_ips",
                "awscni_unrecovered_checkpoint_entries",
            ])
            .collect();
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
        let (code, report) = promtool(&text);
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
        let (code, report) = promtool(&text);
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
