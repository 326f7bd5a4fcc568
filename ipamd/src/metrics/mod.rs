//! ipamd's metrics registry: every `awscni_*` family with the name, help, type and labels that
//! existing dashboards and the cni-metrics-helper query, each a typed handle ([`family`]), so a
//! series can only be recorded under a declared family with its declared labels. The text encoder
//! ([`exposition`]) renders it; the HTTP adapter only serves that text. Must not: decide anything,
//! do I/O, know the datastore's internals (gauges are set from its snapshots).

pub mod exposition;
pub mod family;
#[cfg(any(test, feature = "fake"))]
pub mod promtool;

use crate::config::MetricsNaming;
use crate::datastore::{PoolStats, Usage};
pub use family::{Collect, Counter, CounterVec, GaugeVec, HistogramVec, Kind, SummaryVec};

/// The `fn` values of `awscni_reconcile_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconciled {
    /// An ENI attached in EC2 was added (`eniReconcileAdd`).
    EniAdd,
    /// An ENI gone from EC2 was dropped (`eniReconcileDel`).
    EniDel,
    /// A CIDR EC2 lists was added (`eniDataStorePoolReconcileAdd`).
    CidrAdd,
    /// A CIDR gone from EC2 was dropped (`eniIPPoolReconcileDel`).
    CidrDel,
}

impl Reconciled {
    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EniAdd => "eniReconcileAdd",
            Self::EniDel => "eniReconcileDel",
            Self::CidrAdd => "eniDataStorePoolReconcileAdd",
            Self::CidrDel => "eniIPPoolReconcileDel",
        }
    }
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
    /// `awscni_unrecovered_checkpoint_entries`: restored entries whose address was on no known ENI
    /// (kept pending verification, not dropped).
    pub unrecovered_checkpoint_entries: Counter,
    /// `awscni_ipamd_error_count{fn}`.
    pub ipamd_error_count: CounterVec<1>,
    /// `awscni_ipamd_action_inprogress{fn}`.
    pub ipamd_action_inprogress: GaugeVec<1>,
    /// `awscni_reconcile_count{fn}`.
    pub reconcile_count: CounterVec<1>,
    /// `awscni_del_ip_req_count{reason}`.
    pub del_ip_req_count: CounterVec<1>,
    /// `awscni_pod_eni_error_count{fn}`.
    pub pod_eni_error_count: CounterVec<1>,
    /// `awscni_aws_api_latency_ms{api,error,status}`.
    pub aws_api_latency_ms: SummaryVec<3>,
    /// `awscni_aws_api_error_count{api,error}`.
    pub aws_api_error_count: CounterVec<2>,
    /// `awscni_aws_utils_error_count{error,fn}`.
    pub aws_utils_error_count: CounterVec<2>,
    /// `awscni_ec2api_req_count{fn}`.
    pub ec2api_req_count: CounterVec<1>,
    /// `awscni_ec2api_error_count{fn}`.
    pub ec2api_error_count: CounterVec<1>,
    /// EC2 calls finished (answered or failed), all actions together. Not exported (the
    /// `awscni_ec2api_req_count` series say the same per action): the code residency's watch
    /// reads it, one load, to see an EC2 burst end (the residency module).
    pub ec2_calls_finished: std::sync::atomic::AtomicU64,
    /// Signalled with each of those calls: wakes the code residency's watch at once, so it
    /// looks closely while a burst lasts and gives the burst's code back soon after it ends.
    pub ec2_call_done: tokio::sync::Notify,
    /// `awscni_eni_max`.
    pub eni_max: GaugeVec<0>,
    /// `awscni_ip_max`.
    pub ip_max: GaugeVec<0>,
    /// `awscni_eni_allocated`.
    pub eni_allocated: GaugeVec<0>,
    /// `awscni_total_ip_addresses`.
    pub total_ip_addresses: GaugeVec<0>,
    /// `awscni_assigned_ip_addresses`.
    pub assigned_ip_addresses: GaugeVec<0>,
    /// `awscni_total_ipv4_prefixes`.
    pub total_ipv4_prefixes: GaugeVec<0>,
    /// `awscni_assigned_ip_per_cidr{cidr}`.
    pub assigned_ip_per_cidr: GaugeVec<1>,
    /// `awscni_assigned_ip_per_eni{eni}`.
    pub assigned_ip_per_eni: GaugeVec<1>,
    /// Ours: `awscni_subnet_available_ip_addresses{subnet}` (subnet discovery).
    pub subnet_available_ip_addresses: GaugeVec<1>,
    /// When each subnet of [`Self::subnet_available_ip_addresses`] was last listed (not
    /// exported): the address capacity weighs it against cni-metrics-helper's recount.
    pub subnet_listed_at:
        std::sync::Mutex<std::collections::BTreeMap<String, std::time::SystemTime>>,
    /// Ours: `awscni_address_capacity`: addresses this node can still obtain for new pods
    /// (`ipam_core::pool::capacity`).
    pub address_capacity: GaugeVec<0>,
    /// Ours: `awscni_address_capacity_exhausted`: 1 while the node counts as exhausted (the
    /// condition False, the taint on when enabled), else 0.
    pub address_capacity_exhausted: GaugeVec<0>,
    /// Ours: `awscni_adaptive_warm_ip_target`: the warm IP target `WARM_POOL_POLICY=adaptive`
    /// computed at the pool loop's last pass (absent under the static policy).
    pub adaptive_warm_ip_target: GaugeVec<0>,
    /// Ours: `awscni_adaptive_add_rate`: the ADDs per second that target was computed from.
    pub adaptive_add_rate: GaugeVec<0>,
    /// Ours: `awscni_adaptive_refill_seconds{growth}`: the refill times it was computed from
    /// (`assign`, `new_eni`: measured, or the prior until measured).
    pub adaptive_refill_seconds: GaugeVec<1>,
    /// `awscni_ipamd_startup_duration_seconds{success,with_api_server,failure_reason}`.
    pub ipamd_startup_duration_seconds: HistogramVec<3>,
    /// `awscni_ipamd_node_initialization_duration_seconds{success}`.
    pub ipamd_node_initialization_duration_seconds: HistogramVec<1>,
    /// Ours: `awscni_startup_phase_seconds{phase}`, see [`Self::startup_phase`].
    pub startup_phase_seconds: GaugeVec<1>,
    /// When start-up began (set once by [`Self::begin_startup`]).
    startup_began: std::sync::OnceLock<std::time::Instant>,
    /// `awscni_connmark_backend{backend}`.
    pub connmark_backend: GaugeVec<1>,
    /// `awscni_connmark_reconcile_total{result}`.
    pub connmark_reconcile_total: CounterVec<1>,
    /// `awscni_config_warning{kind,variable}` (ours).
    pub config_warning: GaugeVec<2>,
    /// `awscni_eniconfig_error_count{reason}` (ours).
    pub eniconfig_error_count: CounterVec<1>,
    /// `awscni_build_info{version,goversion}`.
    pub build_info: GaugeVec<2>,
    /// Ours: `awscni_add_failures_total{reason}`, one per failed ADD by reason code
    /// (`ipamd_proto::ADD_FAILURE_CODES`, docs/operations.md).
    pub add_failures_total: CounterVec<1>,
    /// Ours: `awscni_add_network_duration_seconds{result}`, how long AddNetwork took in ipamd
    /// (its wait for the pool included).
    pub add_network_duration_seconds: HistogramVec<1>,
    /// Ours: `awscni_checkpoint_write_failures_total`, failed writes of the checkpoint (each
    /// change rolled back).
    pub checkpoint_write_failures: Counter,
    /// Ours: `awscni_rp_filter_strict`, 1 when ipamd found strict reverse-path filtering on
    /// the primary interface at start (the init container sets loose), else 0.
    pub rp_filter_strict: GaugeVec<0>,
    /// Ours: `awscni_pod_network_setup_seconds{phase}`, where a pod's network set-up time goes
    /// ([`SetupPhase`]), over [`family::SETUP_BUCKETS`] (1 ms to 100 s).
    pub pod_network_setup_seconds: HistogramVec<1>,
}

/// A phase of pod network set-up, the `phase` label of `awscni_pod_network_setup_seconds`. Each
/// is measured where it runs: the plugin's phases in the plugin (sent to ipamd after a
/// successful ADD, `ipamd_proto::setup_timings`), ipamd's here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupPhase {
    /// The plugin's ADD, from its start to its result (successful ADDs).
    PluginTotal,
    /// The AddNetwork call as the plugin waited for it (connection included).
    IpamdCall,
    /// ipamd's AddNetwork, its wait for an address from the pool included (successful ones).
    AddressWait,
    /// One EC2 call that adds addresses to the pool (ENI creation and attachment, secondary
    /// IPs or prefixes): what a pod waits for when the warm pool ran dry.
    Ec2Call,
    /// The plugin's kernel work in the pod's and the host's namespaces.
    HostWiring,
    /// The plugin's call to the network-policy agent (pods with a policy mode only).
    PolicyAgent,
}

impl SetupPhase {
    /// Every phase, in the order of a pod's set-up.
    pub const ALL: [Self; 6] = [
        Self::PluginTotal,
        Self::IpamdCall,
        Self::AddressWait,
        Self::Ec2Call,
        Self::HostWiring,
        Self::PolicyAgent,
    ];

    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PluginTotal => "plugin_total",
            Self::IpamdCall => "ipamd_call",
            Self::AddressWait => "address_wait",
            Self::Ec2Call => "ec2_call",
            Self::HostWiring => "host_wiring",
            Self::PolicyAgent => "policy_agent",
        }
    }
}

/// Decrements an in-progress gauge when dropped.
#[derive(Debug)]
pub struct InProgress<'a> {
    metrics: &'a Metrics,
    name: &'static str,
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.metrics.ipamd_action_inprogress.add([self.name], -1.0);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All families declared; `awscni_build_info` set.
    #[must_use]
    pub fn new() -> Self {
        let m = Self {
            add_ip_req_count: Counter::new(
                "awscni_add_ip_req_count",
                "The number of CNI AddNetwork calls",
            ),
            no_available_ip_addresses: Counter::new(
                "awscni_no_available_ip_addresses",
                "The number of pod IP assignments that fail due to no available IP addresses",
            ),
            force_removed_enis: Counter::new(
                "awscni_force_removed_enis",
                "The number of ENIs force removed while they had assigned pods",
            ),
            force_removed_ips: Counter::new(
                "awscni_force_removed_ips",
                "The number of IPs force removed while they had assigned pods",
            ),
            unrecovered_checkpoint_entries: Counter::new(
                "awscni_unrecovered_checkpoint_entries",
                "The number of checkpointed pod allocations that could not be matched to the ENI pool during ipam state recovery",
            ),
            ipamd_error_count: CounterVec::new(
                "awscni_ipamd_error_count",
                "The number of errors encountered in ipamd",
                ["fn"],
            ),
            ipamd_action_inprogress: GaugeVec::new(
                "awscni_ipamd_action_inprogress",
                "The number of ipamd actions in progress",
                ["fn"],
            ),
            reconcile_count: CounterVec::new(
                "awscni_reconcile_count",
                "The number of times ipamd reconciles on ENIs and IP/Prefix addresses",
                ["fn"],
            ),
            del_ip_req_count: CounterVec::new(
                "awscni_del_ip_req_count",
                "The number of CNI IP release requests",
                ["reason"],
            ),
            pod_eni_error_count: CounterVec::new(
                "awscni_pod_eni_error_count",
                "The number of errors encountered for pod ENIs",
                ["fn"],
            ),
            aws_api_latency_ms: SummaryVec::new(
                "awscni_aws_api_latency_ms",
                "AWS API call latency in ms",
                ["api", "error", "status"],
            ),
            aws_api_error_count: CounterVec::new(
                "awscni_aws_api_error_count",
                "The number of times AWS API returns an error",
                ["api", "error"],
            ),
            aws_utils_error_count: CounterVec::new(
                "awscni_aws_utils_error_count",
                "The number of errors not handled in awsutils library",
                ["error", "fn"],
            ),
            ec2api_req_count: CounterVec::new(
                "awscni_ec2api_req_count",
                "The number of requests made to EC2 APIs by CNI",
                ["fn"],
            ),
            ec2_calls_finished: std::sync::atomic::AtomicU64::new(0),
            ec2_call_done: tokio::sync::Notify::new(),
            ec2api_error_count: CounterVec::new(
                "awscni_ec2api_error_count",
                "The number of failed EC2 APIs requests",
                ["fn"],
            ),
            eni_max: GaugeVec::new(
                "awscni_eni_max",
                "The maximum number of ENIs that can be attached to the instance, accounting for unmanaged ENIs",
                [],
            ),
            ip_max: GaugeVec::new(
                "awscni_ip_max",
                "The maximum number of IP addresses that can be allocated to the instance",
                [],
            ),
            eni_allocated: GaugeVec::new(
                "awscni_eni_allocated",
                "The number of ENIs allocated",
                [],
            ),
            total_ip_addresses: GaugeVec::new(
                "awscni_total_ip_addresses",
                "The total number of IP addresses",
                [],
            ),
            assigned_ip_addresses: GaugeVec::new(
                "awscni_assigned_ip_addresses",
                "The number of IP addresses assigned to pods",
                [],
            ),
            total_ipv4_prefixes: GaugeVec::new(
                "awscni_total_ipv4_prefixes",
                "The total number of IPv4 prefixes",
                [],
            ),
            assigned_ip_per_cidr: GaugeVec::new(
                "awscni_assigned_ip_per_cidr",
                "The total number of IP addresses assigned per cidr",
                ["cidr"],
            ),
            address_capacity: GaugeVec::new(
                "awscni_address_capacity",
                "Ours: the addresses this node can still obtain for new pods (free, cooling down, and what EC2 may still give within the instance limits, max-pods and the subnets' free space)",
                [],
            ),
            address_capacity_exhausted: GaugeVec::new(
                "awscni_address_capacity_exhausted",
                "Ours: 1 while the node can obtain no further address (its networking.k8s.aws/AddressCapacity condition is False), else 0",
                [],
            ),
            adaptive_warm_ip_target: GaugeVec::new(
                "awscni_adaptive_warm_ip_target",
                "Ours: the warm IP target WARM_POOL_POLICY=adaptive computed at the pool loop's last pass (card 0)",
                [],
            ),
            adaptive_add_rate: GaugeVec::new(
                "awscni_adaptive_add_rate",
                "Ours: the pod ADDs per second the adaptive warm IP target was computed from",
                [],
            ),
            adaptive_refill_seconds: GaugeVec::new(
                "awscni_adaptive_refill_seconds",
                "Ours: how long a refill takes (growth=assign: more addresses on an ENI; growth=new_eni: a new ENI), measured, or the prior until measured, as the adaptive warm IP target uses it",
                ["growth"],
            ),
            subnet_available_ip_addresses: GaugeVec::new(
                "awscni_subnet_available_ip_addresses",
                "Ours: the free IPv4 addresses of a subnet of the node's VPC and zone (EC2 AvailableIpAddressCount) as the last DescribeSubnets of subnet discovery listed them",
                ["subnet"],
            ),
            assigned_ip_per_eni: GaugeVec::new(
                "awscni_assigned_ip_per_eni",
                "The number of allocated ips partitioned by eni",
                ["eni"],
            ),
            ipamd_startup_duration_seconds: HistogramVec::new(
                "awscni_ipamd_startup_duration_seconds",
                "The duration of IPAMD startup from process start to ready to serve CNI requests",
                ["success", "with_api_server", "failure_reason"],
            ),
            ipamd_node_initialization_duration_seconds: HistogramVec::new(
                "awscni_ipamd_node_initialization_duration_seconds",
                "The duration of node initialization during IPAMD startup",
                ["success"],
            ),
            startup_phase_seconds: GaugeVec::new(
                "awscni_startup_phase_seconds",
                "Ours: seconds from ipamd's start to the end of each start-up phase (imds, ec2_describe, first_eni, first_address, startup_taint_removed)",
                ["phase"],
            ),
            startup_began: std::sync::OnceLock::new(),
            subnet_listed_at: std::sync::Mutex::default(),
            connmark_backend: GaugeVec::new(
                "awscni_connmark_backend",
                "The connmark backend in use; the active backend's series is set to 1",
                ["backend"],
            ),
            connmark_reconcile_total: CounterVec::new(
                "awscni_connmark_reconcile_total",
                "The number of connmark Setup/Cleanup reconciliations by result",
                ["result"],
            ),
            config_warning: GaugeVec::new(
                "awscni_config_warning",
                "Ours: 1 per environment variable whose value was replaced by upstream's fallback (kind=fallback) or has no effect here (kind=unimplemented)",
                ["kind", "variable"],
            ),
            eniconfig_error_count: CounterVec::new(
                "awscni_eniconfig_error_count",
                "Ours: the number of times custom networking created no ENI because the node's ENIConfig was missing or unusable, by reason",
                ["reason"],
            ),
            build_info: GaugeVec::new(
                "awscni_build_info",
                "A metric with a constant '1' value labeled by version, revision, and goversion from which amazon-vpc-cni-k8s was built.",
                ["version", "goversion"],
            ),
            add_failures_total: CounterVec::new(
                "awscni_add_failures_total",
                "Ours: the number of pod ADDs that failed, by reason code (plugin-side reasons counted when ipamd hears of them)",
                ["reason"],
            ),
            add_network_duration_seconds: HistogramVec::new(
                "awscni_add_network_duration_seconds",
                "Ours: how long ipamd took to answer AddNetwork, waiting for the pool included, by result",
                ["result"],
            ),
            checkpoint_write_failures: Counter::new(
                "awscni_checkpoint_write_failures_total",
                "Ours: the number of failed writes of the IPAM checkpoint (the change was rolled back)",
            ),
            pod_network_setup_seconds: HistogramVec::with_buckets(
                "awscni_pod_network_setup_seconds",
                "Ours: pod network set-up time by phase (plugin_total, ipamd_call, host_wiring and policy_agent measured by the plugin; address_wait and ec2_call by ipamd)",
                ["phase"],
                &family::SETUP_BUCKETS,
            ),
            rp_filter_strict: GaugeVec::new(
                "awscni_rp_filter_strict",
                "Ours: 1 when reverse-path filtering on the primary interface was strict (rp_filter 1) at start, which drops replies to pods on secondary ENIs; the privileged init container aws-vpc-cni-init sets it to 2",
                [],
            ),
        };
        // Every reason at zero, so increase() sees the first failure of each.
        for code in ipamd_proto::ADD_FAILURE_CODES {
            m.add_failures_total.add([code], 0);
        }
        // Both results are registered at zero, so rate() works from the first scrape.
        for result in ["success", "error"] {
            m.connmark_reconcile_total.add([result], 0);
        }
        // Every phase registered empty, so dashboards and the alert find them from the start.
        for phase in SetupPhase::ALL {
            m.pod_network_setup_seconds.register([phase.as_str()]);
        }
        m.build_info
            .set([ipamd_proto::build_version(), "rust"], 1.0);
        m
    }

    /// Every family: the always-exposed label-less counters first, then the others by name
    /// (the order of the exposition).
    #[must_use]
    pub fn families(&self) -> Vec<&dyn Collect> {
        let plain: [&dyn Collect; 5] = [
            &self.add_ip_req_count,
            &self.no_available_ip_addresses,
            &self.force_removed_enis,
            &self.force_removed_ips,
            &self.unrecovered_checkpoint_entries,
        ];
        let mut labeled: Vec<&dyn Collect> = vec![
            &self.ipamd_error_count,
            &self.ipamd_action_inprogress,
            &self.reconcile_count,
            &self.del_ip_req_count,
            &self.pod_eni_error_count,
            &self.aws_api_latency_ms,
            &self.aws_api_error_count,
            &self.aws_utils_error_count,
            &self.ec2api_req_count,
            &self.ec2api_error_count,
            &self.eni_max,
            &self.ip_max,
            &self.eni_allocated,
            &self.total_ip_addresses,
            &self.assigned_ip_addresses,
            &self.total_ipv4_prefixes,
            &self.assigned_ip_per_cidr,
            &self.assigned_ip_per_eni,
            &self.subnet_available_ip_addresses,
            &self.address_capacity,
            &self.address_capacity_exhausted,
            &self.adaptive_warm_ip_target,
            &self.adaptive_add_rate,
            &self.adaptive_refill_seconds,
            &self.ipamd_startup_duration_seconds,
            &self.ipamd_node_initialization_duration_seconds,
            &self.startup_phase_seconds,
            &self.connmark_backend,
            &self.connmark_reconcile_total,
            &self.config_warning,
            &self.eniconfig_error_count,
            &self.build_info,
            &self.add_failures_total,
            &self.add_network_duration_seconds,
            &self.checkpoint_write_failures,
            &self.rp_filter_strict,
            &self.pod_network_setup_seconds,
        ];
        labeled.sort_by_key(|f| f.name());
        plain.into_iter().chain(labeled).collect()
    }

    /// The exposition text, names spelled as `naming` says.
    #[must_use]
    pub fn render(&self, naming: MetricsNaming) -> String {
        exposition::render(self, naming)
    }

    /// `awscni_config_warning{variable,kind} 1`: a setting ipamd did not take as given (see
    /// `config::ConfigWarning`). Bounded: one series per known variable.
    pub fn config_warning(&self, variable: &'static str, kind: &'static str) {
        self.config_warning.set([kind, variable], 1.0);
    }

    /// `awscni_rp_filter_strict`: 1 when the primary interface filters strictly, else 0.
    pub fn rp_filter(&self, strict: bool) {
        self.rp_filter_strict
            .set([], if strict { 1.0 } else { 0.0 });
    }

    /// `awscni_eniconfig_error_count{reason}` +1: custom networking refused to create an ENI.
    pub fn eniconfig_error(&self, reason: &'static str) {
        self.eniconfig_error_count.inc([reason]);
    }

    /// `awscni_ipamd_startup_duration_seconds{success,with_api_server,failure_reason}`: process
    /// start to serving CNI requests; `with_api_server`: the API server answered during start-up.
    pub fn ipamd_startup(&self, failure_reason: Option<&str>, with_api_server: bool, seconds: f64) {
        let success = failure_reason.is_none().to_string();
        self.ipamd_startup_duration_seconds.observe(
            [
                &success,
                &with_api_server.to_string(),
                failure_reason.unwrap_or_default(),
            ],
            seconds,
        );
    }

    /// `awscni_ipamd_node_initialization_duration_seconds{success}`.
    pub fn node_initialization(&self, success: bool, seconds: f64) {
        self.ipamd_node_initialization_duration_seconds
            .observe([&success.to_string()], seconds);
    }

    /// `awscni_connmark_backend{backend}` = 1 for `backend` (`iptables` or `nftables`, the host's
    /// choice: `host::ConnmarkBackend::label`), the other 0; no reconcile counted (the gauge is set
    /// when the backend is picked, also in IPv6 mode).
    pub fn connmark_backend_in_use(&self, backend: &str) {
        for b in ["iptables", "nftables"] {
            self.connmark_backend
                .set([b], if b == backend { 1.0 } else { 0.0 });
        }
    }

    /// `awscni_connmark_backend{backend}` = 1 for the backend in use (others 0), and
    /// `awscni_connmark_reconcile_total{result}` +1 for one set-up of the connmark rules.
    pub fn connmark_reconciled(&self, backend: &str, ok: bool) {
        self.connmark_backend_in_use(backend);
        self.connmark_reconcile_total
            .inc([if ok { "success" } else { "error" }]);
    }

    /// `awscni_reconcile_count{fn}` +1: one ENI or CIDR reconciled into or out of the
    /// datastore.
    pub fn reconciled(&self, what: Reconciled) {
        self.reconcile_count.inc([what.as_str()]);
    }

    /// `awscni_add_failures_total{reason}` +1 (`code`: an `ipamd_proto::add_failure_code`).
    pub fn add_failure(&self, code: &str) {
        self.add_failures_total.inc([code]);
    }

    /// `awscni_pod_network_setup_seconds{phase}`: one observation.
    pub fn setup_phase(&self, phase: SetupPhase, took: std::time::Duration) {
        self.pod_network_setup_seconds
            .observe([phase.as_str()], took.as_secs_f64());
    }

    /// `awscni_add_network_duration_seconds{result}`.
    pub fn add_network_duration(&self, success: bool, seconds: f64) {
        self.add_network_duration_seconds
            .observe([if success { "success" } else { "failure" }], seconds);
    }

    /// `awscni_ipamd_error_count{fn}` +1.
    pub fn ipamd_error(&self, func: &str) {
        self.ipamd_error_count.inc([func]);
    }

    /// `awscni_del_ip_req_count{reason}` +1. The reason comes from the client: only the reasons
    /// plugins send (`PodDeleted`, `SetupNSFailed`) are kept as label values, anything else (empty,
    /// or arbitrary text from a foreign client) is counted as `other`, so the label's cardinality
    /// stays bounded.
    pub fn del_ip_req(&self, reason: &str) {
        let reason = match reason {
            ipamd_proto::del_reason::POD_DELETED | ipamd_proto::del_reason::SETUP_NS_FAILED => {
                reason
            }
            _ => "other",
        };
        self.del_ip_req_count.inc([reason]);
    }

    /// `awscni_aws_api_latency_ms{api,error,status}` (for the EC2 layer).
    pub fn aws_api_latency(&self, api: &str, error: bool, status: &str, ms: f64) {
        self.aws_api_latency_ms
            .observe([api, &error.to_string(), status], ms);
    }

    /// Marks an action in progress until the guard drops.
    pub fn action_in_progress(&self, func: &'static str) -> InProgress<'_> {
        self.ipamd_action_inprogress.add([func], 1.0);
        InProgress {
            metrics: self,
            name: func,
        }
    }

    /// Start-up began at `at` (the phases count from here); later calls change nothing.
    pub fn begin_startup(&self, at: std::time::Instant) {
        let _ = self.startup_began.set(at);
    }

    /// `awscni_startup_phase_seconds{phase}`: the time from [`Self::begin_startup`] to now, set
    /// the first time `phase` ends (later calls keep the first figure). Phases: `imds` (the
    /// instance identity read), `ec2_describe` (the node's ENIs described), `first_eni` (the
    /// first ENI with addresses ready for pods), `first_address` (the first moment an ADD
    /// could be answered), `startup_taint_removed` (`REMOVE_STARTUP_TAINT`).
    pub fn startup_phase(&self, phase: &'static str) {
        let Some(began) = self.startup_began.get() else {
            return;
        };
        if self.startup_phase_seconds.get([phase]).is_none() {
            self.startup_phase_seconds
                .set([phase], began.elapsed().as_secs_f64());
        }
    }

    /// Instance limits gauges.
    pub fn set_limits(&self, max_enis: u32, max_ips: u32) {
        self.eni_max.set([], f64::from(max_enis));
        self.ip_max.set([], f64::from(max_ips));
    }

    /// Datastore gauges, from a snapshot of the pool's statistics and usage.
    pub fn observe_datastore(&self, stats: &PoolStats, usage: &Usage) {
        self.observe_datastores(stats, usage, &[]);
    }

    /// [`Self::observe_datastore`] plus the IPv6 index (IPv6 mode, dual-stack pods): each
    /// `(eni, /80, pods holding one of its /128s)` adds to the assigned counts, per ENI and per
    /// CIDR, the IPv6 prefix counted as one CIDR (`awscni_assigned_ip_addresses`,
    /// `awscni_assigned_ip_per_cidr{cidr="<prefix>/80"}`).
    pub fn observe_datastores(
        &self,
        stats: &PoolStats,
        usage: &Usage,
        v6: &[(String, ipnet::Ipv6Net, u32)],
    ) {
        #[allow(clippy::cast_precision_loss)]
        self.eni_allocated.set([], stats.enis.len() as f64);
        self.total_ip_addresses.set([], f64::from(stats.total));
        let v6_assigned: u32 = v6.iter().map(|(_, _, n)| n).sum();
        self.assigned_ip_addresses
            .set([], f64::from(stats.assigned + v6_assigned));
        self.total_ipv4_prefixes.set([], f64::from(stats.prefixes));
        let mut per_eni: std::collections::BTreeMap<String, u32> = usage
            .iter()
            .map(|(eni, cidrs)| (eni.clone(), cidrs.values().sum::<u32>()))
            .collect();
        for (eni, _, n) in v6 {
            *per_eni.entry(eni.clone()).or_default() += n;
        }
        self.assigned_ip_per_eni
            .replace(per_eni.into_iter().map(|(eni, n)| ([eni], f64::from(n))));
        self.assigned_ip_per_cidr.replace(
            usage
                .values()
                .flatten()
                .filter(|(_, n)| **n > 0)
                .map(|(cidr, n)| ([cidr.to_string()], f64::from(*n)))
                .chain(
                    v6.iter()
                        .filter(|(_, _, n)| *n > 0)
                        .map(|(_, net, n)| ([net.to_string()], f64::from(*n))),
                ),
        );
    }
}
