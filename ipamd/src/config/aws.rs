//! The AWS section: which EC2 serves the pool and how ipamd talks to it — endpoint, timeout,
//! tags, what it may provision and clean up, IMDS-only mode, multi-NIC (warned), subnet
//! discovery, the user-agent version (`AWS_EC2_ENDPOINT`, `HTTP_TIMEOUT`, `CLUSTER_NAME`,
//! `ADDITIONAL_ENI_TAGS`, `DISABLE_NETWORK_RESOURCE_PROVISIONING`, `ENABLE_IMDS_ONLY_MODE`,
//! `DISABLE_LEAKED_ENI_CLEANUP`, `MANAGE_UNTAGGED_ENI`, `ENABLE_MULTI_NIC`,
//! `ENABLE_SUBNET_DISCOVERY`, `VPC_CNI_VERSION`, ours `IPAMD_ENI_PROVIDER`). Must not: build
//! clients (that is `aws`'s), call EC2 or IMDS.

use std::collections::BTreeMap;
#[cfg(feature = "memory-provider")]
use std::path::PathBuf;
use std::time::Duration;

#[cfg(feature = "memory-provider")]
use ipnet::Ipv4Net;

use super::env::{Env, NotAnInteger, err};
use super::{ConfigError, WarningKind};

/// Which EC2 serves the pool (ours: `IPAMD_ENI_PROVIDER`).
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

/// EC2 and IMDS.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct AwsSection {
    /// Ours: `IPAMD_ENI_PROVIDER` (`ec2` default, `memory` = TEST/DEMO ONLY).
    pub provider: ProviderKind,
    /// `AWS_EC2_ENDPOINT` (None: the SDK's default resolution).
    pub ec2_endpoint: Option<String>,
    /// The SDK's `AWS_EC2_METADATA_SERVICE_ENDPOINT` (None: `http://169.254.169.254`, or the
    /// IPv6 address under `AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE=IPv6`). Read here so the IMDS
    /// client knows whether it needs TLS at all.
    pub imds_endpoint: Option<String>,
    /// `HTTP_TIMEOUT` (10 s, minimum 10 s).
    pub http_timeout: Duration,
    /// `CLUSTER_NAME` (tags new ENIs `cluster.k8s.amazonaws.com/name`).
    pub cluster_name: String,
    /// `ADDITIONAL_ENI_TAGS` (JSON map; keys containing `k8s.amazonaws.com` dropped).
    pub additional_eni_tags: BTreeMap<String, String>,
    /// `ENABLE_SUBNET_DISCOVERY` (true): new ENIs in the zone's subnets tagged
    /// `kubernetes.io/role/cni`, ENIs in subnets tagged `=0` excluded (`aws::subnets`).
    pub enable_subnet_discovery: bool,
    /// `DISABLE_NETWORK_RESOURCE_PROVISIONING` (false; forced true by IMDS-only mode).
    pub disable_network_resource_provisioning: bool,
    /// `ENABLE_IMDS_ONLY_MODE` (false).
    pub enable_imds_only_mode: bool,
    /// `DISABLE_LEAKED_ENI_CLEANUP` (false; forced true without provisioning; in IPv6 mode `lib.rs`
    /// does not start the clean-up when `Config::family` is IPv6).
    pub disable_leaked_eni_cleanup: bool,
    /// Ours, TEST ONLY: `IPAMD_LEAKED_ENI_PERIOD_SECONDS` (default 3600, the hourly leaked-ENI
    /// clean-up; at least 60): compresses time in fleet idle measurements.
    pub leaked_eni_period: Duration,
    /// Ours: `IPAMD_SECURITY_GROUP_CHECK_SECONDS` (default 30, at least 1): how often the primary
    /// ENI's security groups are read again.
    pub security_group_check: Duration,
    /// `MANAGE_UNTAGGED_ENI` (true).
    pub manage_untagged_eni: bool,
    /// `ENABLE_MULTI_NIC` (false): every network card of the instance type serves pods
    /// (`ipam-nic-N.json` per card; multi-NIC pods get one address per card).
    pub enable_multi_nic: bool,
    /// `VPC_CNI_VERSION`: goes into the EC2 User-Agent (`app/amazon-vpc-cni-k8s-<version>`); None
    /// when unset or not a valid user-agent token.
    pub vpc_cni_version: Option<String>,
}

impl AwsSection {
    /// Reads the section; refuses an unknown provider, warns about multi-NIC (not implemented;
    /// running without it leaves pods correct) and about subnet exclusion in IMDS-only mode.
    pub(super) fn parse(e: &mut Env<'_>) -> Result<Self, ConfigError> {
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
        // Not an integer, or under 10 s, gives 10 s.
        let http_timeout = match e.int("HTTP_TIMEOUT") {
            None => Duration::from_secs(10),
            Some(Ok(n)) => Duration::from_secs(u64::try_from(n.max(10)).unwrap_or(10)),
            Some(Err(NotAnInteger { value })) => {
                e.fallback("HTTP_TIMEOUT", &value, "10 s");
                Duration::from_secs(10)
            }
        };
        let additional_eni_tags = match e.get("ADDITIONAL_ENI_TAGS") {
            None => BTreeMap::new(),
            Some(v) => match serde_json::from_str::<BTreeMap<String, String>>(v) {
                Ok(tags) => tags
                    .into_iter()
                    .filter(|(k, _)| !k.contains("k8s.amazonaws.com"))
                    .collect(),
                Err(_) => {
                    // Logged; no extra tag.
                    let v = v.to_owned();
                    e.fallback("ADDITIONAL_ENI_TAGS", &v, "no additional tags");
                    BTreeMap::new()
                }
            },
        };
        let enable_imds_only_mode = e.bool("ENABLE_IMDS_ONLY_MODE", false);
        // IMDS-only mode implies no provisioning (and so no leaked-ENI clean-up): no EC2 call at
        // all.
        let disable_network_resource_provisioning =
            e.bool("DISABLE_NETWORK_RESOURCE_PROVISIONING", false) || enable_imds_only_mode;
        let disable_leaked_eni_cleanup =
            e.bool("DISABLE_LEAKED_ENI_CLEANUP", false) || disable_network_resource_provisioning;
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
        let security_group_check = match e.strict_int("IPAMD_SECURITY_GROUP_CHECK_SECONDS")? {
            None => Duration::from_secs(30),
            Some(n) if n >= 1 => Duration::from_secs(u64::try_from(n).unwrap_or(30)),
            Some(n) => {
                return Err(err(
                    "IPAMD_SECURITY_GROUP_CHECK_SECONDS",
                    &n.to_string(),
                    "seconds >= 1",
                ));
            }
        };
        // Per-card pools and multi-NIC pods (docs/ipamd.md#network-cards).
        let enable_multi_nic = e.bool("ENABLE_MULTI_NIC", false);
        let enable_subnet_discovery = e.bool("ENABLE_SUBNET_DISCOVERY", true);
        if enable_subnet_discovery && enable_imds_only_mode {
            // IMDS-only mode makes no EC2 call at all, so subnet tags are never read.
            e.warn(
                "ENABLE_SUBNET_DISCOVERY",
                "true",
                WarningKind::Unimplemented,
                "with ENABLE_IMDS_ONLY_MODE no EC2 call is made: ENIs in subnets tagged \
                 kubernetes.io/role/cni=0 are not excluded (upstream asks DescribeSubnets)"
                    .into(),
            );
        }
        let vpc_cni_version = match e.get("VPC_CNI_VERSION") {
            None => None,
            Some(v) if is_user_agent_token(v) => Some(v.to_owned()),
            Some(v) => {
                let v = v.to_owned();
                e.fallback("VPC_CNI_VERSION", &v, "no version in the EC2 User-Agent");
                None
            }
        };
        Ok(Self {
            provider,
            ec2_endpoint: e.get("AWS_EC2_ENDPOINT").map(str::to_owned),
            imds_endpoint: e
                .get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
                .map(str::to_owned),
            http_timeout,
            cluster_name: e.string("CLUSTER_NAME", ""),
            additional_eni_tags,
            enable_subnet_discovery,
            disable_network_resource_provisioning,
            enable_imds_only_mode,
            disable_leaked_eni_cleanup,
            leaked_eni_period,
            security_group_check,
            manage_untagged_eni: e.bool("MANAGE_UNTAGGED_ENI", true),
            enable_multi_nic,
            vpc_cni_version,
        })
    }
}

/// An RFC 9110 token (what a User-Agent product version may hold).
fn is_user_agent_token(v: &str) -> bool {
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c))
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
                    .ok_or_else(|| err(VAR, part, EXPECTED))?;
            }
            "ipv4_per_eni" => {
                spec.ipv4_per_eni = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= 2)
                    .ok_or_else(|| err(VAR, part, EXPECTED))?;
            }
            "state" => spec.state_file = Some(PathBuf::from(v)),
            _ => return Err(err(VAR, part, EXPECTED)),
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::super::env::with_warnings;
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> (Result<AwsSection, ConfigError>, Vec<String>) {
        let (r, w) = with_warnings(pairs, AwsSection::parse);
        (r, w.into_iter().map(|w| w.var.to_owned()).collect())
    }

    #[test]
    fn defaults_are_upstreams() {
        let (a, w) = parse(&[]);
        let a = a.unwrap();
        assert!(w.is_empty());
        assert_eq!(a.provider, ProviderKind::Ec2);
        assert_eq!(a.ec2_endpoint, None);
        assert_eq!(a.imds_endpoint, None);
        assert_eq!(a.http_timeout, Duration::from_secs(10));
        assert!(a.manage_untagged_eni && a.enable_subnet_discovery);
        assert!(!a.disable_network_resource_provisioning && !a.disable_leaked_eni_cleanup);
        assert_eq!(a.vpc_cni_version, None);
    }

    /// upstream ipamd.go `disableENIProvisioning`/`disableLeakedENICleanup`.
    #[test]
    fn provisioning_switches() {
        let a = parse(&[("ENABLE_IMDS_ONLY_MODE", "true")]).0.unwrap();
        assert!(a.enable_imds_only_mode);
        assert!(a.disable_network_resource_provisioning && a.disable_leaked_eni_cleanup);
        let a = parse(&[("DISABLE_NETWORK_RESOURCE_PROVISIONING", "true")])
            .0
            .unwrap();
        assert!(a.disable_leaked_eni_cleanup && !a.enable_imds_only_mode);
        let a = parse(&[("DISABLE_LEAKED_ENI_CLEANUP", "true")]).0.unwrap();
        assert!(a.disable_leaked_eni_cleanup && !a.disable_network_resource_provisioning);
    }

    #[test]
    fn tags_timeout_endpoint_version() {
        let (a, w) = parse(&[
            (
                "ADDITIONAL_ENI_TAGS",
                r#"{"team":"a","k8s.amazonaws.com/x":"y"}"#,
            ),
            ("HTTP_TIMEOUT", "3"),
            ("AWS_EC2_ENDPOINT", "http://127.0.0.1:1"),
            ("VPC_CNI_VERSION", "v1.23.1-eksbuild.1"),
            ("CLUSTER_NAME", "c1"),
        ]);
        let a = a.unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(a.additional_eni_tags.keys().collect::<Vec<_>>(), ["team"]);
        assert_eq!(a.http_timeout, Duration::from_secs(10), "minimum 10 s");
        assert_eq!(a.ec2_endpoint.as_deref(), Some("http://127.0.0.1:1"));
        assert_eq!(a.vpc_cni_version.as_deref(), Some("v1.23.1-eksbuild.1"));
        assert_eq!(a.cluster_name, "c1");
        let (a, w) = parse(&[("VPC_CNI_VERSION", "v1 (dev)")]);
        assert_eq!(a.unwrap().vpc_cni_version, None);
        assert_eq!(w, ["VPC_CNI_VERSION"]);
    }

    /// `ENABLE_MULTI_NIC` is implemented (per-card pools, multi-NIC pods): parsed, not warned.
    #[test]
    fn multi_nic_is_parsed_and_not_warned() {
        for (val, on) in [("true", true), ("false", false)] {
            let (r, w) = parse(&[("ENABLE_MULTI_NIC", val)]);
            assert_eq!(r.unwrap().enable_multi_nic, on);
            assert!(w.is_empty(), "{w:?}");
        }
        let (r, _) = parse(&[("IPAMD_ENI_PROVIDER", "gcp")]);
        assert_eq!(r.unwrap_err().var, "IPAMD_ENI_PROVIDER");
    }

    /// Subnet discovery is implemented (`aws::subnets`): no warning either way, except that
    /// IMDS-only mode cannot read subnet tags.
    #[test]
    fn subnet_discovery_is_parsed_and_not_warned() {
        for (val, on) in [("true", true), ("false", false)] {
            let (a, w) = parse(&[("ENABLE_SUBNET_DISCOVERY", val)]);
            assert_eq!(a.unwrap().enable_subnet_discovery, on);
            assert!(w.is_empty(), "{val}: {w:?}");
        }
        let (_, w) = parse(&[("ENABLE_IMDS_ONLY_MODE", "true")]);
        assert_eq!(w, ["ENABLE_SUBNET_DISCOVERY"]);
        let (_, w) = parse(&[
            ("ENABLE_IMDS_ONLY_MODE", "true"),
            ("ENABLE_SUBNET_DISCOVERY", "false"),
        ]);
        assert!(w.is_empty());
    }

    #[test]
    #[cfg(feature = "memory-provider")]
    fn memory_provider_spec() {
        let a = parse(&[
            ("IPAMD_ENI_PROVIDER", "memory"),
            (
                "IPAMD_MEMORY_PROVIDER",
                "subnet=198.18.4.0/24,max_enis=2,ipv4_per_eni=4",
            ),
        ])
        .0
        .unwrap();
        let ProviderKind::Memory(spec) = a.provider else {
            panic!("memory provider")
        };
        assert_eq!((spec.max_enis, spec.ipv4_per_eni), (2, 4));
        let (r, _) = parse(&[
            ("IPAMD_ENI_PROVIDER", "memory"),
            ("IPAMD_MEMORY_PROVIDER", "max_enis=0"),
        ]);
        assert_eq!(r.unwrap_err().var, "IPAMD_MEMORY_PROVIDER");
    }
}
