//! ipamd configuration: every environment variable upstream's ipamd reads (reference §1.1), plus
//! our own knobs, parsed ONCE into a typed, validated [`Config`] with upstream's defaults.
//! Nothing else in the crate reads the environment. Must not: do I/O, touch the network, log.
//!
//! Parsing takes an injected map (`Config::from_env_map`) so tests never touch process env.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net};

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

/// `AWS_VPC_K8S_CNI_RANDOMIZESNAT`. The integer values are upstream's enum order (they appear in
/// `/v1/networkutils-env-settings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandomizeSnat {
    /// `--random` (`hashrandom`).
    HashRandom = 0,
    /// `--random-fully` (`prng`, default).
    Prng = 1,
    /// No flag (`none`).
    None = 2,
}

/// `NETWORK_POLICY_ENFORCING_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkPolicyMode {
    /// `none`.
    None,
    /// `strict`.
    Strict,
    /// `standard`.
    Standard,
}

impl NetworkPolicyMode {
    /// The wire string put in Add/Del replies.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Strict => "strict",
            Self::Standard => "standard",
        }
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
    /// host:port.
    Tcp(SocketAddr),
    /// A unix socket path.
    Unix(PathBuf),
}

/// Which EC2 stand-in serves the pool (ours: `IPAMD_ENI_PROVIDER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderKind {
    /// Real EC2 + IMDS (the default).
    Ec2,
    /// TEST/DEMO ONLY: a stateful in-memory EC2 stand-in (see [`MemoryProviderSpec`]).
    Memory(MemoryProviderSpec),
}

/// TEST/DEMO ONLY in-memory provider description, from `IPAMD_MEMORY_PROVIDER`
/// (`key=value` pairs separated by commas; all optional):
/// `subnet=198.18.0.0/24,vpc=198.18.0.0/16,max_enis=3,ipv4_per_eni=10,state=/path/file.json`.
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
    /// `ENI_CONFIG_ANNOTATION_DEF`.
    pub eni_config_annotation_def: String,
    /// `ENI_CONFIG_LABEL_DEF`.
    pub eni_config_label_def: String,
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
    /// Ours: `IPAMD_MAX_PODS` (default none): kubelet max-pods cap on the pool.
    pub max_pods: Option<u32>,
    /// Ours: `IPAMD_ENI_PROVIDER` (`ec2` default, `memory` = TEST/DEMO ONLY).
    pub provider: ProviderKind,
}

/// Upstream's default checkpoint path.
pub const DEFAULT_BACKING_STORE: &str = "/var/run/aws-node/ipam.json";
/// Upstream's default ipamd log file.
pub const DEFAULT_LOG_FILE: &str = "/host/var/log/aws-routed-eni/ipamd.log";
/// Default ENIConfig annotation/label key.
pub const DEFAULT_ENI_CONFIG_KEY: &str = "k8s.amazonaws.com/eniConfig";

struct Env<'a>(&'a HashMap<String, String>);

impl Env<'_> {
    /// A set, non-empty (after trim) value.
    fn get(&self, var: &str) -> Option<&str> {
        self.0.get(var).map(|v| v.trim()).filter(|v| !v.is_empty())
    }

    fn bool(&self, var: &'static str, default: bool) -> Result<bool, ConfigError> {
        match self.get(var) {
            None => Ok(default),
            // strconv.ParseBool's accepted spellings.
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(v) => Err(err(var, v, "true or false")),
        }
    }

    fn int(&self, var: &'static str) -> Result<Option<i64>, ConfigError> {
        self.get(var)
            .map(|v| v.parse::<i64>().map_err(|_| err(var, v, "an integer")))
            .transpose()
    }

    fn string(&self, var: &str, default: &str) -> String {
        self.get(var).unwrap_or(default).to_owned()
    }
}

fn err(var: &'static str, value: &str, expected: &'static str) -> ConfigError {
    ConfigError {
        var,
        value: value.to_owned(),
        expected,
    }
}

fn non_negative(var: &'static str, v: Option<i64>) -> Result<u32, ConfigError> {
    match v {
        None => Ok(0),
        Some(n) => u32::try_from(n).map_err(|_| err(var, &n.to_string(), "an integer >= 0")),
    }
}

fn v4_cidrs(var: &'static str, raw: Option<&str>) -> Result<Vec<Ipv4Net>, ConfigError> {
    let mut out = Vec::new();
    for part in raw
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match part.parse::<IpNet>() {
            Ok(IpNet::V4(n)) => out.push(n),
            // Upstream skips IPv6 entries in these lists.
            Ok(IpNet::V6(_)) => {}
            Err(_) => return Err(err(var, part, "comma-separated CIDRs, e.g. 10.0.0.0/8")),
        }
    }
    Ok(out)
}

impl Config {
    /// Reads the real process environment. Only `main` calls this.
    #[must_use]
    pub fn process_env() -> HashMap<String, String> {
        std::env::vars().collect()
    }

    /// Parses and validates. The only way to build a `Config` from the environment.
    #[allow(clippy::too_many_lines)]
    pub fn from_env_map(map: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let e = Env(map);

        // WARM_ENI_TARGET: upstream falls back to 1 when negative (and on parse errors, which
        // we refuse instead: a typo should not silently give the default).
        let warm_eni_target = match e.int("WARM_ENI_TARGET")? {
            None => 1,
            Some(n) if n < 0 => 1,
            Some(n) => u32::try_from(n)
                .map_err(|_| err("WARM_ENI_TARGET", &n.to_string(), "an integer"))?,
        };
        let warm_ip_target = non_negative("WARM_IP_TARGET", e.int("WARM_IP_TARGET")?)?;
        let minimum_ip_target = non_negative("MINIMUM_IP_TARGET", e.int("MINIMUM_IP_TARGET")?)?;
        let warm_prefix_target = non_negative("WARM_PREFIX_TARGET", e.int("WARM_PREFIX_TARGET")?)?;
        let max_eni = match e.int("MAX_ENI")? {
            None | Some(-1) => None,
            Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            Some(n) => {
                return Err(err(
                    "MAX_ENI",
                    &n.to_string(),
                    "-1 (instance limit) or an integer >= 1",
                ));
            }
        };
        let enable_prefix_delegation = e.bool("ENABLE_PREFIX_DELEGATION", false)?;
        let enable_ipv4 = e.bool("ENABLE_IPv4", false)?;
        let enable_ipv6 = e.bool("ENABLE_IPv6", false)?;
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
        let custom_network_cfg = e.bool("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", false)?;
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

        let randomize_snat = match e.get("AWS_VPC_K8S_CNI_RANDOMIZESNAT").unwrap_or("prng") {
            "prng" => RandomizeSnat::Prng,
            "hashrandom" => RandomizeSnat::HashRandom,
            "none" => RandomizeSnat::None,
            v => {
                return Err(err(
                    "AWS_VPC_K8S_CNI_RANDOMIZESNAT",
                    v,
                    "prng, hashrandom or none",
                ));
            }
        };
        let connmark = match e.get("AWS_VPC_K8S_CNI_CONNMARK") {
            None => 0x80,
            Some(v) => {
                let parsed = v
                    .strip_prefix("0x")
                    .or_else(|| v.strip_prefix("0X"))
                    .map_or_else(|| v.parse::<u32>(), |h| u32::from_str_radix(h, 16));
                parsed.map_err(|_| {
                    err(
                        "AWS_VPC_K8S_CNI_CONNMARK",
                        v,
                        "a 32-bit mark, decimal or 0x-hex",
                    )
                })?
            }
        };
        let eni_mtu = match e.int("AWS_VPC_ENI_MTU")? {
            None => dataplane::conventions::DEFAULT_MTU,
            Some(n) => {
                let min = if enable_ipv6 {
                    dataplane::conventions::MIN_MTU_V6
                } else {
                    dataplane::conventions::MIN_MTU_V4
                };
                u32::try_from(n)
                    .ok()
                    .filter(|m| (min..=dataplane::conventions::MAX_MTU).contains(m))
                    .ok_or_else(|| {
                        err(
                            "AWS_VPC_ENI_MTU",
                            &n.to_string(),
                            "576-9001 (IPv4) or 1280-9001 (IPv6)",
                        )
                    })?
            }
        };
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
                return Err(err(
                    "AWS_VPC_K8S_CNI_LOGLEVEL",
                    v,
                    "DEBUG, INFO, WARN, ERROR or FATAL",
                ));
            }
        };
        let log_file = match e.get("AWS_VPC_K8S_CNI_LOG_FILE") {
            None => LogTarget::File(PathBuf::from(DEFAULT_LOG_FILE)),
            Some(v) if v.eq_ignore_ascii_case("stdout") => LogTarget::Stdout,
            Some(v) if v.eq_ignore_ascii_case("stderr") => LogTarget::Stderr,
            Some(v) => LogTarget::File(PathBuf::from(v)),
        };
        let introspection_bind = match e.get("INTROSPECTION_BIND_ADDRESS") {
            None => BindAddress::Tcp(SocketAddr::from(([127, 0, 0, 1], 61679))),
            Some(v) => match v.strip_prefix("unix:") {
                Some(path) if !path.is_empty() => BindAddress::Unix(PathBuf::from(path)),
                _ => BindAddress::Tcp(v.parse().map_err(|_| {
                    err("INTROSPECTION_BIND_ADDRESS", v, "host:port or unix:<path>")
                })?),
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
            Some(v) => {
                let tags: BTreeMap<String, String> = serde_json::from_str(v)
                    .map_err(|_| err("ADDITIONAL_ENI_TAGS", v, "a JSON object of string values"))?;
                tags.into_iter()
                    .filter(|(k, _)| !k.contains("k8s.amazonaws.com"))
                    .collect()
            }
        };
        let pod_sg_enforcing_mode = match e
            .get("POD_SECURITY_GROUP_ENFORCING_MODE")
            .unwrap_or("strict")
        {
            "strict" => PodSgEnforcingMode::Strict,
            "standard" => PodSgEnforcingMode::Standard,
            v => {
                return Err(err(
                    "POD_SECURITY_GROUP_ENFORCING_MODE",
                    v,
                    "strict or standard",
                ));
            }
        };
        let enable_imds_only_mode = e.bool("ENABLE_IMDS_ONLY_MODE", false)?;
        let disable_network_resource_provisioning =
            e.bool("DISABLE_NETWORK_RESOURCE_PROVISIONING", false)? || enable_imds_only_mode;
        let disable_leaked_eni_cleanup = e.bool("DISABLE_LEAKED_ENI_CLEANUP", false)?
            || enable_ipv6
            || disable_network_resource_provisioning;
        let ip_cooldown_period = match e.int("IP_COOLDOWN_PERIOD")? {
            None => Duration::from_secs(30),
            Some(n) => Duration::from_secs(
                u64::try_from(n)
                    .map_err(|_| err("IP_COOLDOWN_PERIOD", &n.to_string(), "seconds >= 0"))?,
            ),
        };
        let network_policy_mode = match e.get("NETWORK_POLICY_ENFORCING_MODE") {
            None => None,
            Some("none") => Some(NetworkPolicyMode::None),
            Some("strict") => Some(NetworkPolicyMode::Strict),
            Some("standard") => Some(NetworkPolicyMode::Standard),
            Some(v) => {
                return Err(err(
                    "NETWORK_POLICY_ENFORCING_MODE",
                    v,
                    "none, strict or standard",
                ));
            }
        };
        let http_timeout = match e.int("HTTP_TIMEOUT")? {
            // Upstream enforces a 10 s minimum.
            None => Duration::from_secs(10),
            Some(n) => Duration::from_secs(u64::try_from(n.max(10)).unwrap_or(10)),
        };
        let add_wait_timeout = match e.int("IPAMD_ADD_WAIT_TIMEOUT")? {
            None => Duration::from_secs(10),
            Some(n) => Duration::from_secs(
                u64::try_from(n)
                    .map_err(|_| err("IPAMD_ADD_WAIT_TIMEOUT", &n.to_string(), "seconds >= 0"))?,
            ),
        };
        let reclaim_unwired_after = match e.int("IPAMD_RECLAIM_UNWIRED_SECONDS")? {
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
        let pool_tick = match e.int("IPAMD_POOL_TICK_SECONDS")? {
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
        let max_pods = match e.int("IPAMD_MAX_PODS")? {
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
            "memory" => ProviderKind::Memory(parse_memory_spec(e.get("IPAMD_MEMORY_PROVIDER"))?),
            v => {
                return Err(err(
                    "IPAMD_ENI_PROVIDER",
                    v,
                    "ec2 or memory (memory is for tests/demos only)",
                ));
            }
        };

        Ok(Self {
            warm_eni_target,
            warm_ip_target,
            minimum_ip_target,
            warm_prefix_target,
            max_eni,
            enable_prefix_delegation,
            enable_ipv4,
            enable_ipv6,
            custom_network_cfg,
            eni_config_annotation_def: e
                .string("ENI_CONFIG_ANNOTATION_DEF", DEFAULT_ENI_CONFIG_KEY),
            eni_config_label_def: e.string("ENI_CONFIG_LABEL_DEF", DEFAULT_ENI_CONFIG_KEY),
            external_snat: e.bool("AWS_VPC_K8S_CNI_EXTERNALSNAT", false)?,
            exclude_snat_cidrs: v4_cidrs(
                "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS",
                e.get("AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS"),
            )?,
            randomize_snat,
            node_port_support: e.bool("AWS_VPC_CNI_NODE_PORT_SUPPORT", true)?,
            connmark,
            external_service_cidrs: v4_cidrs(
                "AWS_EXTERNAL_SERVICE_CIDRS",
                e.get("AWS_EXTERNAL_SERVICE_CIDRS"),
            )?,
            eni_mtu,
            veth_prefix,
            log_level,
            log_file,
            introspection_bind,
            disable_introspection: e.bool("DISABLE_INTROSPECTION", false)?,
            disable_metrics: e.bool("DISABLE_METRICS", false)?,
            metrics_bind,
            metrics_naming,
            additional_eni_tags,
            cluster_name: e.string("CLUSTER_NAME", ""),
            cluster_endpoint: e.string("CLUSTER_ENDPOINT", ""),
            enable_pod_eni: e.bool("ENABLE_POD_ENI", false)?,
            pod_sg_enforcing_mode,
            enable_subnet_discovery: e.bool("ENABLE_SUBNET_DISCOVERY", true)?,
            disable_network_resource_provisioning,
            enable_imds_only_mode,
            disable_leaked_eni_cleanup,
            annotate_pod_ip: e.bool("ANNOTATE_POD_IP", false)?,
            ip_cooldown_period,
            network_policy_mode,
            enable_multi_nic: e.bool("ENABLE_MULTI_NIC", false)?,
            manage_enis_non_schedulable: e.bool("AWS_MANAGE_ENIS_NON_SCHEDULABLE", false)?,
            manage_untagged_eni: e.bool("MANAGE_UNTAGGED_ENI", true)?,
            backing_store: PathBuf::from(
                e.string("AWS_VPC_K8S_CNI_BACKING_STORE", DEFAULT_BACKING_STORE),
            ),
            ec2_endpoint: e.string("AWS_EC2_ENDPOINT", ""),
            http_timeout,
            vpc_cni_version: e.string("VPC_CNI_VERSION", ""),
            node_name: e.string("MY_NODE_NAME", ""),
            pod_name: e.string("MY_POD_NAME", ""),
            socket_path: PathBuf::from(
                e.string("IPAMD_SOCKET_PATH", ipamd_proto::DEFAULT_SOCKET_PATH),
            ),
            add_wait_timeout,
            reclaim_unwired_after,
            pool_tick,
            max_pods,
            provider,
        })
    }

    /// True when a WARM_IP_TARGET or MINIMUM_IP_TARGET is set (they override the ENI/prefix
    /// targets, as upstream).
    #[must_use]
    pub fn uses_ip_targets(&self) -> bool {
        self.warm_ip_target > 0 || self.minimum_ip_target > 0
    }
}

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
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        m.entry("ENABLE_IPv4".into())
            .or_insert_with(|| "true".into());
        m
    }

    #[test]
    fn defaults_are_upstreams() {
        let c = Config::from_env_map(&env(&[])).unwrap();
        assert_eq!(c.warm_eni_target, 1);
        assert_eq!(c.warm_ip_target, 0);
        assert_eq!(c.max_eni, None);
        assert_eq!(c.ip_cooldown_period, Duration::from_secs(30));
        assert_eq!(c.connmark, 0x80);
        assert_eq!(c.eni_mtu, 9001);
        assert_eq!(c.veth_prefix, "eni");
        assert_eq!(c.randomize_snat, RandomizeSnat::Prng);
        assert_eq!(
            c.backing_store,
            PathBuf::from("/var/run/aws-node/ipam.json")
        );
        assert_eq!(c.socket_path, PathBuf::from("/var/run/aws-node/ipamd.sock"));
        assert_eq!(
            c.introspection_bind,
            BindAddress::Tcp("127.0.0.1:61679".parse().unwrap())
        );
        assert!(c.node_port_support && c.enable_subnet_discovery && c.manage_untagged_eni);
        assert_eq!(c.network_policy_mode, None);
        assert_eq!(c.provider, ProviderKind::Ec2);
        assert_eq!(c.metrics_naming, MetricsNaming::Upstream);
        assert_eq!(c.reclaim_unwired_after, Some(Duration::from_secs(300)));
    }

    #[test]
    fn negative_warm_eni_target_falls_back_to_one() {
        let c = Config::from_env_map(&env(&[("WARM_ENI_TARGET", "-3")])).unwrap();
        assert_eq!(c.warm_eni_target, 1);
    }

    #[test]
    fn invalid_values_name_the_variable() {
        for (var, val) in [
            ("WARM_IP_TARGET", "lots"),
            ("WARM_IP_TARGET", "-1"),
            ("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "sometimes"),
            ("AWS_VPC_ENI_MTU", "100"),
            ("AWS_VPC_K8S_CNI_VETHPREFIX", "eth"),
            ("NETWORK_POLICY_ENFORCING_MODE", "lax"),
            ("AWS_VPC_K8S_CNI_EXTERNALSNAT", "yes"),
            ("MAX_ENI", "0"),
            ("INTROSPECTION_BIND_ADDRESS", "nowhere"),
            ("ADDITIONAL_ENI_TAGS", "[1]"),
            ("IPAMD_ENI_PROVIDER", "gcp"),
            ("METRICS_NAMING", "openmetrics"),
            ("IPAMD_RECLAIM_UNWIRED_SECONDS", "-1"),
        ] {
            let e = Config::from_env_map(&env(&[(var, val)])).unwrap_err();
            assert_eq!(e.var, var, "{e}");
            assert!(e.to_string().contains(var) && e.to_string().contains("expected"));
        }
    }

    #[test]
    fn family_rules() {
        let both = Config::from_env_map(&env(&[("ENABLE_IPv6", "true")])).unwrap_err();
        assert_eq!(both.var, "ENABLE_IPv6");
        let none = Config::from_env_map(&env(&[("ENABLE_IPv4", "false")])).unwrap_err();
        assert_eq!(none.var, "ENABLE_IPv4");
        let v6 = Config::from_env_map(&env(&[
            ("ENABLE_IPv4", "false"),
            ("ENABLE_IPv6", "true"),
            ("ENABLE_PREFIX_DELEGATION", "true"),
            ("WARM_PREFIX_TARGET", "1"),
        ]))
        .unwrap_err();
        assert_eq!(v6.var, "ENABLE_IPv6");
        assert!(v6.to_string().contains("not implemented"));
        let pd_zero =
            Config::from_env_map(&env(&[("ENABLE_PREFIX_DELEGATION", "true")])).unwrap_err();
        assert_eq!(pd_zero.var, "WARM_PREFIX_TARGET");
    }

    #[test]
    fn lists_tags_and_forms() {
        let c = Config::from_env_map(&env(&[
            (
                "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS",
                "10.0.0.0/8, fd00::/8,192.168.0.0/16",
            ),
            (
                "ADDITIONAL_ENI_TAGS",
                r#"{"team":"a","k8s.amazonaws.com/x":"y"}"#,
            ),
            ("INTROSPECTION_BIND_ADDRESS", "unix:/run/x.sock"),
            ("AWS_VPC_K8S_CNI_CONNMARK", "0x100"),
            ("AWS_VPC_K8S_CNI_LOG_FILE", "stdout"),
            ("ENABLE_IMDS_ONLY_MODE", "true"),
            ("IPAMD_ENI_PROVIDER", "memory"),
            (
                "IPAMD_MEMORY_PROVIDER",
                "subnet=198.18.4.0/24,max_enis=2,ipv4_per_eni=4",
            ),
        ]))
        .unwrap();
        assert_eq!(c.exclude_snat_cidrs.len(), 2);
        assert_eq!(c.additional_eni_tags.len(), 1);
        assert_eq!(
            c.introspection_bind,
            BindAddress::Unix("/run/x.sock".into())
        );
        assert_eq!(c.connmark, 0x100);
        assert_eq!(c.log_file, LogTarget::Stdout);
        assert!(c.disable_network_resource_provisioning && c.disable_leaked_eni_cleanup);
        let ProviderKind::Memory(spec) = c.provider else {
            panic!("memory provider")
        };
        assert_eq!((spec.max_enis, spec.ipv4_per_eni), (2, 4));
    }
}
