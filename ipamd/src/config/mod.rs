//! ipamd configuration: every environment variable upstream's ipamd reads (reference §1.1), plus
//! our own knobs, parsed ONCE into a typed, validated [`Config`] with upstream's defaults.
//! Nothing else in the crate reads the environment. Must not: do I/O, touch the network, log.
//!
//! Parsing takes an injected map (`Config::from_env_map`) so tests never touch process env.
//! Single values are read the way upstream's Go code reads them in `env`; the tables in `tests`
//! pin upstream's defaults, fallbacks and refusals. This file stays one pass over all variables
//! (~800 lines) because the cross-variable rules (family, PD targets, unimplemented features)
//! need them together; splitting it into per-concern sections is the `Config` redesign's job.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::Ipv4Net;

mod env;

use env::{Env, err, parse_go_int_base0, v4_cidrs};

/// A value that could not be accepted. Names the variable and the accepted values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {var}={value:?}: expected {expected}")]
pub struct ConfigError {
    /// The environment variable.
    pub var: &'static str,
    /// The value as given.
    pub value: String,
    /// What would have been accepted.
    pub expected: &'static str,
}

/// `AWS_VPC_K8S_CNI_RANDOMIZESNAT`: port randomisation of the SNAT rule. The one enum for it
/// (`host::snat` re-exports it). The integer values are upstream's `snatType` order
/// (network.go: sequential, hash random, prng), which `/v1/networkutils-env-settings` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RandomizeSnat {
    /// `none`: no flag.
    None = 0,
    /// `hashrandom`: `--random`.
    HashRandom = 1,
    /// `prng` (default): `--random-fully`, or `--random` when iptables is older than 1.6.2.
    #[default]
    Prng = 2,
}

/// A value ipamd did not take as given, or a setting it does not implement: logged loudly at
/// start and exported as `awscni_config_warning{variable,kind}`. Upstream tolerates these values
/// (it logs and falls back); refusing them would crash-loop a node where upstream runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// The environment variable.
    pub var: &'static str,
    /// The value as given.
    pub value: String,
    /// What happens instead.
    pub effect: String,
    /// Why.
    pub kind: WarningKind,
}

/// Why a [`ConfigWarning`] was raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarningKind {
    /// Not a valid value: upstream's fallback is used.
    Fallback,
    /// A feature this ipamd does not implement: the setting has no effect.
    Unimplemented,
}

impl WarningKind {
    /// The metric label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fallback => "fallback",
            Self::Unimplemented => "unimplemented",
        }
    }
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            WarningKind::Fallback => {
                write!(
                    f,
                    "{}={:?} is not valid; {}",
                    self.var, self.value, self.effect
                )
            }
            WarningKind::Unimplemented => {
                write!(f, "{}={:?}: {}", self.var, self.value, self.effect)
            }
        }
    }
}

/// `NETWORK_POLICY_ENFORCING_MODE`: validated case-insensitively, as upstream
/// (`IsValidNetworkPolicyEnforcingMode`), and passed to the plugin exactly as given (upstream
/// replies with the raw value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicyMode(String);

impl NetworkPolicyMode {
    /// The wire string put in Add/Del replies (the value as configured).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `POD_SECURITY_GROUP_ENFORCING_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSgEnforcingMode {
    /// `strict` (default).
    Strict,
    /// `standard`.
    Standard,
}

/// How `/metrics` spells metric names (ours: `METRICS_NAMING`).
///
/// Upstream's names (`awscni_add_ip_req_count` as a counter, `awscni_aws_api_latency_ms`) are
/// what the cni-metrics-helper and existing dashboards query, but they break three Prometheus
/// naming rules that `promtool check metrics` enforces. Operators choose; see `docs/ipamd.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsNaming {
    /// `upstream` (default): exactly upstream's names, types and units.
    #[default]
    Upstream,
    /// `prometheus`: the same series under conventional names (`_total` counters, latency in
    /// `_seconds`); `promtool check metrics` reports nothing.
    Prometheus,
}

/// Where a log goes (`AWS_VPC_K8S_CNI_LOG_FILE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    /// `stdout`.
    Stdout,
    /// `stderr`.
    Stderr,
    /// A file path.
    File(PathBuf),
}

/// Log level (`AWS_VPC_K8S_CNI_LOGLEVEL`), upstream names, case-insensitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// `DEBUG`.
    Debug,
    /// `INFO`.
    Info,
    /// `WARN`.
    Warn,
    /// `ERROR`.
    Error,
    /// `FATAL` (logged as error).
    Fatal,
}

/// Introspection bind address (`INTROSPECTION_BIND_ADDRESS`): TCP or `unix:<path>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindAddress {
    /// `host:port`, resolved when binding (`localhost:61679` works, as with Go's `net.Listen`;
    /// `:61679` means every interface). A bind that fails is retried with back-off.
    Tcp(String),
    /// A unix socket path.
    Unix(PathBuf),
}

/// Which EC2 stand-in serves the pool (ours: `IPAMD_ENI_PROVIDER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderKind {
    /// Real EC2 + IMDS (the default).
    Ec2,
    /// TEST/DEMO ONLY: a stateful in-memory EC2 stand-in (see [`MemoryProviderSpec`]); exists
    /// only in builds with the test-only feature `memory-provider`.
    #[cfg(feature = "memory-provider")]
    Memory(MemoryProviderSpec),
}

/// TEST/DEMO ONLY in-memory provider description, from `IPAMD_MEMORY_PROVIDER`
/// (`key=value` pairs separated by commas; all optional):
/// `subnet=198.18.0.0/24,vpc=198.18.0.0/16,max_enis=3,ipv4_per_eni=10,state=/path/file.json`.
#[cfg(feature = "memory-provider")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryProviderSpec {
    /// Subnet every ENI lives in.
    pub subnet: Ipv4Net,
    /// VPC CIDR returned to the plugin.
    pub vpc_cidr: Ipv4Net,
    /// Instance ENI limit.
    pub max_enis: u32,
    /// Instance IPv4 addresses per ENI (including the ENI's primary).
    pub ipv4_per_eni: u32,
    /// Optional file where the fake "EC2" keeps its state across ipamd restarts.
    pub state_file: Option<PathBuf>,
}

#[cfg(feature = "memory-provider")]
impl Default for MemoryProviderSpec {
    fn default() -> Self {
        Self {
            subnet: "198.18.0.0/24".parse().unwrap_or_default(),
            vpc_cidr: "198.18.0.0/16".parse().unwrap_or_default(),
            max_enis: 3,
            ipv4_per_eni: 10,
            state_file: None,
        }
    }
}

/// The whole ipamd configuration. Field docs name the variable; defaults are upstream's code
/// defaults unless stated.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::struct_excessive_bools)]
pub struct Config {
    /// `WARM_ENI_TARGET` (1; negative falls back to 1).
    pub warm_eni_target: u32,
    /// `WARM_IP_TARGET` (unset = 0).
    pub warm_ip_target: u32,
    /// `MINIMUM_IP_TARGET` (unset = 0).
    pub minimum_ip_target: u32,
    /// `WARM_PREFIX_TARGET` (0).
    pub warm_prefix_target: u32,
    /// `MAX_ENI` (None = instance limit; upstream -1).
    pub max_eni: Option<u32>,
    /// `ENABLE_PREFIX_DELEGATION` (false).
    pub enable_prefix_delegation: bool,
    /// `ENABLE_IPv4` (false in code; true in the manifest).
    pub enable_ipv4: bool,
    /// `ENABLE_IPv6` (false).
    pub enable_ipv6: bool,
    /// `AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG` (false).
    pub custom_network_cfg: bool,
    /// `ENI_CONFIG_ANNOTATION_DEF` and `ENI_CONFIG_LABEL_DEF` (empty = the default key).
    pub eni_config_keys: crate::k8s::EniConfigKeys,
    /// `AWS_VPC_K8S_CNI_EXTERNALSNAT` (false).
    pub external_snat: bool,
    /// `AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS` (IPv4 entries; IPv6 entries skipped as upstream).
    pub exclude_snat_cidrs: Vec<Ipv4Net>,
    /// `AWS_VPC_K8S_CNI_RANDOMIZESNAT` (prng).
    pub randomize_snat: RandomizeSnat,
    /// `AWS_VPC_CNI_NODE_PORT_SUPPORT` (true).
    pub node_port_support: bool,
    /// `AWS_VPC_K8S_CNI_CONNMARK` (0x80).
    pub connmark: u32,
    /// `AWS_EXTERNAL_SERVICE_CIDRS`.
    pub external_service_cidrs: Vec<Ipv4Net>,
    /// `AWS_VPC_ENI_MTU` (9001).
    pub eni_mtu: u32,
    /// `AWS_VPC_K8S_CNI_VETHPREFIX` (eni).
    pub veth_prefix: String,
    /// `AWS_VPC_K8S_CNI_LOGLEVEL` (DEBUG).
    pub log_level: LogLevel,
    /// `AWS_VPC_K8S_CNI_LOG_FILE`.
    pub log_file: LogTarget,
    /// `INTROSPECTION_BIND_ADDRESS` (127.0.0.1:61679).
    pub introspection_bind: BindAddress,
    /// `DISABLE_INTROSPECTION` (false).
    pub disable_introspection: bool,
    /// `DISABLE_METRICS` (false).
    pub disable_metrics: bool,
    /// Ours: `METRICS_BIND_ADDRESS` (upstream hard-codes `:61678`; simulated nodes need their own).
    pub metrics_bind: SocketAddr,
    /// Ours: `METRICS_NAMING` (`upstream`, or `prometheus` for lint-clean names).
    pub metrics_naming: MetricsNaming,
    /// `ADDITIONAL_ENI_TAGS` (JSON map; keys containing `k8s.amazonaws.com` dropped).
    pub additional_eni_tags: BTreeMap<String, String>,
    /// `CLUSTER_NAME`.
    pub cluster_name: String,
    /// `CLUSTER_ENDPOINT`.
    pub cluster_endpoint: String,
    /// `ENABLE_POD_ENI` (false).
    pub enable_pod_eni: bool,
    /// `POD_SECURITY_GROUP_ENFORCING_MODE` (strict).
    pub pod_sg_enforcing_mode: PodSgEnforcingMode,
    /// `ENABLE_SUBNET_DISCOVERY` (true).
    pub enable_subnet_discovery: bool,
    /// `DISABLE_NETWORK_RESOURCE_PROVISIONING` (false; forced true by IMDS-only mode).
    pub disable_network_resource_provisioning: bool,
    /// `ENABLE_IMDS_ONLY_MODE` (false).
    pub enable_imds_only_mode: bool,
    /// `DISABLE_LEAKED_ENI_CLEANUP` (false; forced true in IPv6/no-provisioning/IMDS-only).
    pub disable_leaked_eni_cleanup: bool,
    /// `ANNOTATE_POD_IP` (false).
    pub annotate_pod_ip: bool,
    /// `IP_COOLDOWN_PERIOD` (30 s).
    pub ip_cooldown_period: Duration,
    /// `NETWORK_POLICY_ENFORCING_MODE` (unset = no NP calls).
    pub network_policy_mode: Option<NetworkPolicyMode>,
    /// `ENABLE_MULTI_NIC` (false).
    pub enable_multi_nic: bool,
    /// `AWS_MANAGE_ENIS_NON_SCHEDULABLE` (false).
    pub manage_enis_non_schedulable: bool,
    /// `MANAGE_UNTAGGED_ENI` (true).
    pub manage_untagged_eni: bool,
    /// `AWS_VPC_K8S_CNI_BACKING_STORE` (/var/run/aws-node/ipam.json).
    pub backing_store: PathBuf,
    /// `AWS_EC2_ENDPOINT`.
    pub ec2_endpoint: String,
    /// `HTTP_TIMEOUT` (10 s, minimum 10 s).
    pub http_timeout: Duration,
    /// `VPC_CNI_VERSION`.
    pub vpc_cni_version: String,
    /// `MY_NODE_NAME`.
    pub node_name: String,
    /// `MY_POD_NAME`.
    pub pod_name: String,
    /// The Kubernetes API, when configured (see [`KubeSettings`]); None: ipamd runs without it.
    pub kube: Option<KubeSettings>,
    /// Ours: `IPAMD_SOCKET_PATH` (default [`ipamd_proto::DEFAULT_SOCKET_PATH`]).
    pub socket_path: PathBuf,
    /// Ours: `IPAMD_ADD_WAIT_TIMEOUT` seconds (default 10): how long an AddNetwork that finds
    /// no free address waits for the pool manager's immediate allocation.
    pub add_wait_timeout: Duration,
    /// Ours: `IPAMD_RECLAIM_UNWIRED_SECONDS` (default 300, 0 = off): an assignment whose pod has
    /// had no host veth and no host route this long is released (its DEL never reached ipamd).
    pub reclaim_unwired_after: Option<Duration>,
    /// Ours: `IPAMD_POOL_TICK_SECONDS` (default 5, upstream's loop period).
    pub pool_tick: Duration,
    /// Ours, TEST ONLY: `IPAMD_LEAKED_ENI_PERIOD_SECONDS` (default 3600, upstream's hourly
    /// leaked-ENI clean-up; at least 60): compresses time in fleet idle measurements.
    pub leaked_eni_period: Duration,
    /// Ours: `IPAMD_MAX_PODS` (default none): kubelet max-pods cap on the pool.
    pub max_pods: Option<u32>,
    /// Ours: `IPAMD_ENI_PROVIDER` (`ec2` default, `memory` = TEST/DEMO ONLY).
    pub provider: ProviderKind,
    /// What parsing had to say: values replaced by upstream's fallback, settings without
    /// effect. The composition root logs them and exports them as a metric.
    pub warnings: Vec<ConfigWarning>,
}

/// Upstream's default checkpoint path.
pub const DEFAULT_BACKING_STORE: &str = "/var/run/aws-node/ipam.json";
/// Upstream's default ipamd log file.
pub const DEFAULT_LOG_FILE: &str = "/host/var/log/aws-routed-eni/ipamd.log";
/// Upstream's default introspection address.
pub const DEFAULT_INTROSPECTION_BIND: &str = "127.0.0.1:61679";
/// Upstream's default connmark (`AWS_VPC_K8S_CNI_CONNMARK`).
pub const DEFAULT_CONNMARK: u32 = 0x80;
/// Default ENIConfig annotation/label key.
pub const DEFAULT_ENI_CONFIG_KEY: &str = "k8s.amazonaws.com/eniConfig";

/// Where the service account's token and CA are mounted in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// upstream's `utils.AwsNodeNamespace`, the default for `MY_POD_NAMESPACE`.
pub const DEFAULT_POD_NAMESPACE: &str = "kube-system";

/// How ipamd reaches the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeSource {
    /// `KUBECONFIG` (its current context; tests and off-cluster runs).
    Kubeconfig(PathBuf),
    /// In a pod: `KUBERNETES_SERVICE_HOST`/`PORT` and the mounted service account.
    InCluster {
        /// `KUBERNETES_SERVICE_HOST`.
        host: String,
        /// `KUBERNETES_SERVICE_PORT` (443).
        port: u16,
        /// [`SERVICE_ACCOUNT_DIR`].
        account_dir: PathBuf,
    },
}

/// The Kubernetes section of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSettings {
    /// Client configuration source.
    pub source: KubeSource,
    /// `CLUSTER_ENDPOINT`: replaces the server URL (upstream's `GetRestConfig`).
    pub cluster_endpoint: Option<String>,
    /// `MY_NODE_NAME`.
    pub node_name: String,
    /// `MY_POD_NAME` (events go on this pod; empty: no events).
    pub pod_name: String,
    /// `MY_POD_NAMESPACE` (kube-system).
    pub pod_namespace: String,
}

/// The Kubernetes section: present when `MY_NODE_NAME` is set and a client configuration is
/// available (`KUBECONFIG`, else `KUBERNETES_SERVICE_HOST`, else `CLUSTER_ENDPOINT` with the
/// mounted service account).
fn kube_settings(e: &Env<'_>) -> Result<Option<KubeSettings>, ConfigError> {
    let Some(node_name) = e.get("MY_NODE_NAME") else {
        return Ok(None);
    };
    let cluster_endpoint = e.get("CLUSTER_ENDPOINT").map(str::to_owned);
    let source = if let Some(path) = e.get("KUBECONFIG") {
        KubeSource::Kubeconfig(PathBuf::from(path))
    } else if let Some(host) = e.get("KUBERNETES_SERVICE_HOST") {
        let port = match e.get("KUBERNETES_SERVICE_PORT") {
            None => 443,
            Some(p) => p
                .parse()
                .map_err(|_| err("KUBERNETES_SERVICE_PORT", p, "a TCP port"))?,
        };
        KubeSource::InCluster {
            host: host.to_owned(),
            port,
            account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        }
    } else if cluster_endpoint.is_some() {
        KubeSource::InCluster {
            host: "kubernetes.default.svc".into(),
            port: 443,
            account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        }
    } else {
        return Ok(None);
    };
    Ok(Some(KubeSettings {
        source,
        cluster_endpoint,
        node_name: node_name.to_owned(),
        pod_name: e.string("MY_POD_NAME", ""),
        pod_namespace: e.string("MY_POD_NAMESPACE", DEFAULT_POD_NAMESPACE),
    }))
}

impl Config {
    /// Reads the real process environment. Only `main` calls this.
    #[must_use]
    pub fn process_env() -> HashMap<String, String> {
        std::env::vars().collect()
    }

    /// Parses and validates. The only way to build a `Config` from the environment.
    ///
    /// Where upstream falls back on a bad value (booleans, warm targets, `MAX_ENI`, SNAT
    /// randomisation, connmark, CIDR lists, the pod SG mode while pod ENIs are off) the same
    /// fallback is used and a [`ConfigWarning`] returned; where upstream's entrypoint or ipamd
    /// refuses to start (veth prefix, MTU, cooldown, PD without targets, an unknown network
    /// policy mode) the value is refused. Features this ipamd does not implement are refused
    /// when running without them would be unsafe (pods in the wrong subnet or without their
    /// security groups), and warned about otherwise.
    #[allow(clippy::too_many_lines)]
    pub fn from_env_map(map: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut e = Env {
            map,
            warnings: Vec::new(),
        };

        let warm_eni_target = e.count("WARM_ENI_TARGET", 1);
        let warm_ip_target = e.count("WARM_IP_TARGET", 0);
        let minimum_ip_target = e.count("MINIMUM_IP_TARGET", 0);
        let warm_prefix_target = e.count("WARM_PREFIX_TARGET", 0);
        // upstream getMaxENI: a value that is not an integer >= 1 is ignored (instance limit);
        // -1 is its documented "unset".
        let max_eni = match e.int("MAX_ENI") {
            None | Some(Ok(-1)) => None,
            Some(Ok(n)) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            Some(Ok(n)) => {
                e.fallback("MAX_ENI", &n.to_string(), "the instance's ENI limit");
                None
            }
            Some(Err(v)) => {
                e.fallback("MAX_ENI", &v, "the instance's ENI limit");
                None
            }
        };
        let enable_prefix_delegation = e.bool("ENABLE_PREFIX_DELEGATION", false);
        let enable_ipv4 = e.bool("ENABLE_IPv4", false);
        let enable_ipv6 = e.bool("ENABLE_IPv6", false);
        if enable_ipv4 && enable_ipv6 {
            return Err(err(
                "ENABLE_IPv6",
                "true",
                "false while ENABLE_IPv4=true (dual stack is not supported)",
            ));
        }
        if !enable_ipv4 && !enable_ipv6 {
            return Err(err(
                "ENABLE_IPv4",
                e.get("ENABLE_IPv4").unwrap_or(""),
                "true (or ENABLE_IPv6=true)",
            ));
        }
        let custom_network_cfg = e.bool("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", false);
        if enable_ipv6 && !enable_prefix_delegation {
            return Err(err(
                "ENABLE_PREFIX_DELEGATION",
                e.get("ENABLE_PREFIX_DELEGATION").unwrap_or(""),
                "true when ENABLE_IPv6=true",
            ));
        }
        if enable_ipv6 && custom_network_cfg {
            return Err(err(
                "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG",
                "true",
                "false when ENABLE_IPv6=true",
            ));
        }
        if enable_ipv6 {
            // Upstream's IPv6 mode (/80 prefixes, no warm pool) is not implemented yet: refuse
            // rather than run the IPv4 datastore on an IPv6 node.
            return Err(err(
                "ENABLE_IPv6",
                "true",
                "false (IPv6 mode is not implemented yet)",
            ));
        }
        let kube = kube_settings(&e)?;
        if custom_network_cfg && kube.is_none() {
            // Without the Node and its ENIConfig new ENIs would land in the primary ENI's
            // subnet with its security groups: pods in the wrong subnet. Refuse.
            return Err(err(
                "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG",
                "true",
                "false, or MY_NODE_NAME with the Kubernetes API (KUBECONFIG, in-cluster \
                 KUBERNETES_SERVICE_HOST/PORT or CLUSTER_ENDPOINT): custom networking reads \
                 the Node and its ENIConfig",
            ));
        }
        // upstream's entrypoint refuses PD with every target at 0.
        if enable_prefix_delegation
            && warm_prefix_target == 0
            && warm_ip_target == 0
            && minimum_ip_target == 0
        {
            return Err(err(
                "WARM_PREFIX_TARGET",
                e.get("WARM_PREFIX_TARGET").unwrap_or("0"),
                "> 0 (or WARM_IP_TARGET/MINIMUM_IP_TARGET > 0) with prefix delegation",
            ));
        }

        // upstream typeOfSNAT: an unknown value logs and uses prng.
        let randomize_snat = match e.get("AWS_VPC_K8S_CNI_RANDOMIZESNAT") {
            None | Some("prng") => RandomizeSnat::Prng,
            Some("hashrandom") => RandomizeSnat::HashRandom,
            Some("none") => RandomizeSnat::None,
            Some(v) => {
                let v = v.to_owned();
                e.fallback("AWS_VPC_K8S_CNI_RANDOMIZESNAT", &v, "prng (--random-fully)");
                RandomizeSnat::Prng
            }
        };
        // upstream getConnmark: ParseInt(s, 0, 64); unparsable, <= 0 or > u32 gives 0x80. A mark
        // of 0 would turn rule 1024 into `fwmark 0/0 lookup main`, which matches all traffic.
        let connmark = match e.get("AWS_VPC_K8S_CNI_CONNMARK") {
            None => DEFAULT_CONNMARK,
            Some(v) => match parse_go_int_base0(v).and_then(|m| u32::try_from(m).ok()) {
                Some(m) if m > 0 => m,
                _ => {
                    let v = v.to_owned();
                    e.fallback("AWS_VPC_K8S_CNI_CONNMARK", &v, "the default mark 0x80");
                    DEFAULT_CONNMARK
                }
            },
        };
        // upstream's entrypoint (validateMTU) refuses a bad MTU.
        let eni_mtu = match e.strict_int("AWS_VPC_ENI_MTU")? {
            None => dataplane::conventions::DEFAULT_MTU,
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|m| {
                    (dataplane::conventions::MIN_MTU_V4..=dataplane::conventions::MAX_MTU)
                        .contains(m)
                })
                .ok_or_else(|| {
                    err(
                        "AWS_VPC_ENI_MTU",
                        &n.to_string(),
                        "576-9001 (IPv4) or 1280-9001 (IPv6)",
                    )
                })?,
        };
        // upstream's entrypoint refuses a prefix over 4 characters or a reserved one.
        let veth_prefix = e.string(
            "AWS_VPC_K8S_CNI_VETHPREFIX",
            dataplane::conventions::DEFAULT_VETH_PREFIX,
        );
        dataplane::conventions::validate_veth_prefix(&veth_prefix).map_err(|_| {
            err(
                "AWS_VPC_K8S_CNI_VETHPREFIX",
                &veth_prefix,
                "1-4 characters of [A-Za-z0-9_-], not eth, vlan or lo",
            )
        })?;

        // upstream (logrus level parsing in its logger): an unknown level falls back to DEBUG.
        let log_level = match e
            .get("AWS_VPC_K8S_CNI_LOGLEVEL")
            .map(str::to_ascii_uppercase)
            .as_deref()
        {
            None | Some("DEBUG") => LogLevel::Debug,
            Some("INFO") => LogLevel::Info,
            Some("WARN" | "WARNING") => LogLevel::Warn,
            Some("ERROR") => LogLevel::Error,
            Some("FATAL") => LogLevel::Fatal,
            Some(v) => {
                let v = v.to_owned();
                e.fallback("AWS_VPC_K8S_CNI_LOGLEVEL", &v, "DEBUG");
                LogLevel::Debug
            }
        };
        let log_file = match e.get("AWS_VPC_K8S_CNI_LOG_FILE") {
            None => LogTarget::File(PathBuf::from(DEFAULT_LOG_FILE)),
            Some(v) if v.eq_ignore_ascii_case("stdout") => LogTarget::Stdout,
            Some(v) if v.eq_ignore_ascii_case("stderr") => LogTarget::Stderr,
            Some(v) => LogTarget::File(PathBuf::from(v)),
        };
        // upstream hands the value to net.Listen, retrying a failed listen with back-off: any
        // host:port is accepted here and resolved at bind time.
        let introspection_bind = match e.get("INTROSPECTION_BIND_ADDRESS") {
            None => BindAddress::Tcp(DEFAULT_INTROSPECTION_BIND.to_owned()),
            Some(v) => match v.strip_prefix("unix:") {
                Some(path) if !path.is_empty() => BindAddress::Unix(PathBuf::from(path)),
                _ => BindAddress::Tcp(v.to_owned()),
            },
        };
        let metrics_bind = match e.get("METRICS_BIND_ADDRESS") {
            None => SocketAddr::from(([0, 0, 0, 0], 61678)),
            Some(v) => v
                .parse()
                .map_err(|_| err("METRICS_BIND_ADDRESS", v, "host:port"))?,
        };
        let metrics_naming = match e.get("METRICS_NAMING").unwrap_or("upstream") {
            "upstream" => MetricsNaming::Upstream,
            "prometheus" => MetricsNaming::Prometheus,
            v => return Err(err("METRICS_NAMING", v, "upstream or prometheus")),
        };
        let additional_eni_tags = match e.get("ADDITIONAL_ENI_TAGS") {
            None => BTreeMap::new(),
            Some(v) => match serde_json::from_str::<BTreeMap<String, String>>(v) {
                Ok(tags) => tags
                    .into_iter()
                    .filter(|(k, _)| !k.contains("k8s.amazonaws.com"))
                    .collect(),
                Err(_) => {
                    // upstream logs the unmarshal error and tags nothing extra.
                    let v = v.to_owned();
                    e.fallback("ADDITIONAL_ENI_TAGS", &v, "no additional tags");
                    BTreeMap::new()
                }
            },
        };
        let enable_pod_eni = e.bool("ENABLE_POD_ENI", false);
        if enable_pod_eni {
            // Pods with SecurityGroupPolicies would get node addresses without their groups.
            return Err(err(
                "ENABLE_POD_ENI",
                "true",
                "false (security groups for pods / branch ENIs are not implemented yet)",
            ));
        }
        // upstream sgpp.LoadEnforcingModeFromEnv: anything else is the default (strict); only
        // its entrypoint refuses a bad value, and only while ENABLE_POD_ENI is on.
        let pod_sg_enforcing_mode = match e.get("POD_SECURITY_GROUP_ENFORCING_MODE") {
            None | Some("strict") => PodSgEnforcingMode::Strict,
            Some("standard") => PodSgEnforcingMode::Standard,
            Some(v) => {
                let v = v.to_owned();
                e.fallback("POD_SECURITY_GROUP_ENFORCING_MODE", &v, "strict");
                PodSgEnforcingMode::Strict
            }
        };
        let enable_imds_only_mode = e.bool("ENABLE_IMDS_ONLY_MODE", false);
        // upstream disableENIProvisioning: IMDS-only mode implies no provisioning (and so no
        // leaked-ENI clean-up): no EC2 call at all.
        let disable_network_resource_provisioning =
            e.bool("DISABLE_NETWORK_RESOURCE_PROVISIONING", false) || enable_imds_only_mode;
        let disable_leaked_eni_cleanup = e.bool("DISABLE_LEAKED_ENI_CLEANUP", false)
            || enable_ipv6
            || disable_network_resource_provisioning;
        // upstream's entrypoint refuses a cooldown that is not an integer >= 0.
        let ip_cooldown_period = match e.strict_int("IP_COOLDOWN_PERIOD")? {
            None => Duration::from_secs(30),
            Some(n) => Duration::from_secs(
                u64::try_from(n)
                    .map_err(|_| err("IP_COOLDOWN_PERIOD", &n.to_string(), "seconds >= 0"))?,
            ),
        };
        // upstream getNetworkPolicyMode: case-insensitive check, an invalid mode fails ipamd's
        // start; the value itself is passed on unchanged.
        let network_policy_mode = match e.get("NETWORK_POLICY_ENFORCING_MODE") {
            None => None,
            Some(v)
                if ["none", "strict", "standard"]
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(v)) =>
            {
                Some(NetworkPolicyMode(v.to_owned()))
            }
            Some(v) => {
                return Err(err(
                    "NETWORK_POLICY_ENFORCING_MODE",
                    v,
                    "none, strict or standard",
                ));
            }
        };
        // upstream awssession: not an integer, or under 10 s, gives 10 s.
        let http_timeout = match e.int("HTTP_TIMEOUT") {
            None => Duration::from_secs(10),
            Some(Ok(n)) => Duration::from_secs(u64::try_from(n.max(10)).unwrap_or(10)),
            Some(Err(v)) => {
                e.fallback("HTTP_TIMEOUT", &v, "10 s");
                Duration::from_secs(10)
            }
        };
        let add_wait_timeout = match e.strict_int("IPAMD_ADD_WAIT_TIMEOUT")? {
            None => Duration::from_secs(10),
            Some(n) => Duration::from_secs(
                u64::try_from(n)
                    .map_err(|_| err("IPAMD_ADD_WAIT_TIMEOUT", &n.to_string(), "seconds >= 0"))?,
            ),
        };
        let reclaim_unwired_after = match e.strict_int("IPAMD_RECLAIM_UNWIRED_SECONDS")? {
            None => Some(Duration::from_secs(300)),
            Some(0) => None,
            Some(n) => Some(Duration::from_secs(u64::try_from(n).map_err(|_| {
                err(
                    "IPAMD_RECLAIM_UNWIRED_SECONDS",
                    &n.to_string(),
                    "seconds >= 0 (0 = off)",
                )
            })?)),
        };
        let pool_tick = match e.strict_int("IPAMD_POOL_TICK_SECONDS")? {
            None => Duration::from_secs(5),
            Some(n) if n >= 1 => Duration::from_secs(u64::try_from(n).unwrap_or(5)),
            Some(n) => {
                return Err(err(
                    "IPAMD_POOL_TICK_SECONDS",
                    &n.to_string(),
                    "seconds >= 1",
                ));
            }
        };
        let leaked_eni_period = match e.strict_int("IPAMD_LEAKED_ENI_PERIOD_SECONDS")? {
            None => Duration::from_secs(3600),
            Some(n) if n >= 60 => Duration::from_secs(u64::try_from(n).unwrap_or(3600)),
            Some(n) => {
                return Err(err(
                    "IPAMD_LEAKED_ENI_PERIOD_SECONDS",
                    &n.to_string(),
                    "seconds >= 60",
                ));
            }
        };
        let max_pods = match e.strict_int("IPAMD_MAX_PODS")? {
            None => None,
            Some(n) => Some(
                u32::try_from(n)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| err("IPAMD_MAX_PODS", &n.to_string(), "an integer >= 1"))?,
            ),
        };
        let provider = match e.get("IPAMD_ENI_PROVIDER").unwrap_or("ec2") {
            "ec2" => ProviderKind::Ec2,
            #[cfg(feature = "memory-provider")]
            "memory" => ProviderKind::Memory(parse_memory_spec(e.get("IPAMD_MEMORY_PROVIDER"))?),
            #[cfg(not(feature = "memory-provider"))]
            "memory" => {
                return Err(err(
                    "IPAMD_ENI_PROVIDER",
                    "memory",
                    "ec2 (the in-memory test provider is not part of this build: it exists \
                     only in test builds with the cargo feature `memory-provider`)",
                ));
            }
            v => {
                return Err(err(
                    "IPAMD_ENI_PROVIDER",
                    v,
                    "ec2 or memory (memory is for tests/demos only)",
                ));
            }
        };

        // Settings that need what this ipamd does not have yet (the Kubernetes API, multi-NIC,
        // subnet discovery): accepted, with a loud warning, where running without them leaves
        // pods correct.
        let enable_multi_nic = e.bool("ENABLE_MULTI_NIC", false);
        if enable_multi_nic {
            e.warn(
                "ENABLE_MULTI_NIC",
                "true",
                WarningKind::Unimplemented,
                "multi-NIC is not implemented: only network card 0's ENIs serve pods".into(),
            );
        }
        let enable_subnet_discovery = e.bool("ENABLE_SUBNET_DISCOVERY", true);
        if enable_subnet_discovery && e.get("ENABLE_SUBNET_DISCOVERY").is_some() {
            e.warn(
                "ENABLE_SUBNET_DISCOVERY",
                "true",
                WarningKind::Unimplemented,
                "subnet discovery is not implemented: new ENIs use the primary ENI's subnet \
                 and security groups (upstream's behaviour when no subnet is tagged \
                 kubernetes.io/role/cni)"
                    .into(),
            );
        }
        let manage_enis_non_schedulable = e.bool("AWS_MANAGE_ENIS_NON_SCHEDULABLE", false);
        if let Some(v) = e.get("AWS_MANAGE_ENIS_NON_SCHEDULABLE").map(str::to_owned) {
            e.warn(
                "AWS_MANAGE_ENIS_NON_SCHEDULABLE",
                &v,
                WarningKind::Unimplemented,
                "ipamd does not read its Node object yet: ENIs are managed whether or not the \
                 node is schedulable"
                    .into(),
            );
        }
        let annotate_pod_ip = e.bool("ANNOTATE_POD_IP", false);
        if annotate_pod_ip && kube.is_none() {
            e.warn(
                "ANNOTATE_POD_IP",
                "true",
                WarningKind::Unimplemented,
                "no Kubernetes API configured (MY_NODE_NAME with KUBECONFIG or in-cluster \
                 KUBERNETES_SERVICE_HOST/PORT): pods get no vpc.amazonaws.com/pod-ips annotation"
                    .into(),
            );
        }

        let config = Self {
            warm_eni_target,
            warm_ip_target,
            minimum_ip_target,
            warm_prefix_target,
            max_eni,
            enable_prefix_delegation,
            enable_ipv4,
            enable_ipv6,
            custom_network_cfg,
            eni_config_keys: crate::k8s::EniConfigKeys {
                annotation: e.string("ENI_CONFIG_ANNOTATION_DEF", DEFAULT_ENI_CONFIG_KEY),
                label: e.string("ENI_CONFIG_LABEL_DEF", DEFAULT_ENI_CONFIG_KEY),
            },
            external_snat: e.bool("AWS_VPC_K8S_CNI_EXTERNALSNAT", false),
            exclude_snat_cidrs: v4_cidrs(&mut e, "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS"),
            randomize_snat,
            node_port_support: e.bool("AWS_VPC_CNI_NODE_PORT_SUPPORT", true),
            connmark,
            external_service_cidrs: v4_cidrs(&mut e, "AWS_EXTERNAL_SERVICE_CIDRS"),
            eni_mtu,
            veth_prefix,
            log_level,
            log_file,
            introspection_bind,
            disable_introspection: e.bool("DISABLE_INTROSPECTION", false),
            disable_metrics: e.bool("DISABLE_METRICS", false),
            metrics_bind,
            metrics_naming,
            additional_eni_tags,
            cluster_name: e.string("CLUSTER_NAME", ""),
            cluster_endpoint: e.string("CLUSTER_ENDPOINT", ""),
            enable_pod_eni,
            pod_sg_enforcing_mode,
            enable_subnet_discovery,
            disable_network_resource_provisioning,
            enable_imds_only_mode,
            disable_leaked_eni_cleanup,
            annotate_pod_ip,
            ip_cooldown_period,
            network_policy_mode,
            enable_multi_nic,
            manage_enis_non_schedulable,
            manage_untagged_eni: e.bool("MANAGE_UNTAGGED_ENI", true),
            backing_store: PathBuf::from(
                e.string("AWS_VPC_K8S_CNI_BACKING_STORE", DEFAULT_BACKING_STORE),
            ),
            ec2_endpoint: e.string("AWS_EC2_ENDPOINT", ""),
            http_timeout,
            vpc_cni_version: e.string("VPC_CNI_VERSION", ""),
            node_name: e.string("MY_NODE_NAME", ""),
            pod_name: e.string("MY_POD_NAME", ""),
            kube,
            socket_path: PathBuf::from(
                e.string("IPAMD_SOCKET_PATH", ipamd_proto::DEFAULT_SOCKET_PATH),
            ),
            add_wait_timeout,
            reclaim_unwired_after,
            pool_tick,
            leaked_eni_period,
            max_pods,
            provider,
            warnings: Vec::new(),
        };
        Ok(Self {
            warnings: e.warnings,
            ..config
        })
    }

    /// True when a WARM_IP_TARGET or MINIMUM_IP_TARGET is set (they override the ENI/prefix
    /// targets, as upstream).
    #[must_use]
    pub fn uses_ip_targets(&self) -> bool {
        self.warm_ip_target > 0 || self.minimum_ip_target > 0
    }
}

#[cfg(feature = "memory-provider")]
fn parse_memory_spec(raw: Option<&str>) -> Result<MemoryProviderSpec, ConfigError> {
    const VAR: &str = "IPAMD_MEMORY_PROVIDER";
    const EXPECTED: &str =
        "comma-separated subnet=<cidr>,vpc=<cidr>,max_enis=<n>,ipv4_per_eni=<n>,state=<path>";
    let mut spec = MemoryProviderSpec::default();
    for part in raw
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| err(VAR, part, EXPECTED))?;
        match k {
            "subnet" => spec.subnet = v.parse().map_err(|_| err(VAR, part, EXPECTED))?,
            "vpc" => spec.vpc_cidr = v.parse().map_err(|_| err(VAR, part, EXPECTED))?,
            "max_enis" => {
                spec.max_enis = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| err(VAR, part, EXPECTED))?
            }
            "ipv4_per_eni" => {
                spec.ipv4_per_eni = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 2)
                    .ok_or_else(|| err(VAR, part, EXPECTED))?
            }
            "state" => spec.state_file = Some(PathBuf::from(v)),
            _ => return Err(err(VAR, part, EXPECTED)),
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests;
