//! The shape of a simulated VPC at creation (`WorldConfig`). Plain data parsed/defaulted once;
//! it must not hold run-time state.

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How the simulated VPC looks when the world is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorldConfig {
    /// Region reported by IMDS and used in ARNs (the SDK client must use the same one).
    pub region: String,
    /// The single availability zone every subnet lives in.
    pub availability_zone: String,
    /// The VPC's IPv4 CIDR (default 198.18.0.0/16, a benchmarking range).
    pub vpc_cidr: Ipv4Net,
    /// The VPC's IPv6 CIDR (default 2001:db8:1200::/56, documentation range).
    pub vpc_ipv6_cidr: Option<Ipv6Net>,
    /// Subnets, in order; the first is the default for `RunInstances` without a subnet.
    pub subnets: Vec<SubnetConfig>,
    /// Security groups that exist in the VPC; the first is the default group.
    pub security_groups: Vec<SecurityGroupConfig>,
    /// Account id reported as owner.
    pub account_id: String,
    /// How secondary IPv4 addresses are picked: `None` (default) = the lowest free address
    /// (deterministic, easy to assert on); `Some(seed)` = uniformly at random among the free
    /// addresses, as EC2 does, reproducible per seed. Random picks fragment a subnet the way
    /// real ones fragment, so /28 prefix requests start failing with `InsufficientCidrBlocks`.
    #[serde(default)]
    pub random_addresses: Option<u64>,
}

/// One subnet of the VPC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubnetConfig {
    /// Subnet IPv4 CIDR; must lie inside the VPC CIDR.
    pub cidr: Ipv4Net,
    /// Optional /64 inside the VPC's IPv6 CIDR.
    #[serde(default)]
    pub ipv6_cidr: Option<Ipv6Net>,
    /// Tags (e.g. `kubernetes.io/role/cni` for subnet discovery).
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

/// One security group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecurityGroupConfig {
    /// Group name.
    pub name: String,
    /// Group description.
    pub description: String,
}

impl Default for WorldConfig {
    fn default() -> Self {
        let net = |s: &str| s.parse::<Ipv4Net>().expect("static cidr");
        let net6 = |s: &str| s.parse::<Ipv6Net>().expect("static cidr");
        Self {
            region: "us-west-2".into(),
            availability_zone: "us-west-2a".into(),
            vpc_cidr: net("198.18.0.0/16"),
            vpc_ipv6_cidr: Some(net6("2001:db8:1200::/56")),
            subnets: vec![
                SubnetConfig {
                    cidr: net("198.18.0.0/20"),
                    ipv6_cidr: Some(net6("2001:db8:1200::/64")),
                    tags: BTreeMap::new(),
                },
                SubnetConfig {
                    cidr: net("198.18.16.0/20"),
                    ipv6_cidr: Some(net6("2001:db8:1200:1::/64")),
                    tags: BTreeMap::new(),
                },
            ],
            security_groups: vec![
                SecurityGroupConfig {
                    name: "default".into(),
                    description: "default VPC security group".into(),
                },
                SecurityGroupConfig {
                    name: "pods".into(),
                    description: "pod security group".into(),
                },
            ],
            account_id: "123456789012".into(),
            random_addresses: None,
        }
    }
}
