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
    /// The default availability zone: subnets without one live here (IMDS of an instance
    /// reports its subnet's zone).
    pub availability_zone: String,
    /// The VPC's primary IPv4 CIDR (default 198.18.0.0/16, a benchmarking range).
    pub vpc_cidr: Ipv4Net,
    /// Secondary IPv4 CIDR blocks of the VPC (e.g. 100.64.0.0/16 for custom networking);
    /// subnets may lie in any block.
    #[serde(default)]
    pub secondary_cidrs: Vec<Ipv4Net>,
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
    /// Subnet IPv4 CIDR; must lie inside one of the VPC's CIDR blocks.
    pub cidr: Ipv4Net,
    /// Availability zone (default: the world's `availability_zone`).
    #[serde(default)]
    pub availability_zone: Option<String>,
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
    /// The group belongs to another VPC (so that using it on an ENI of this VPC is refused as
    /// EC2 refuses it).
    #[serde(default)]
    pub other_vpc: bool,
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
            secondary_cidrs: Vec::new(),
            subnets: vec![
                SubnetConfig {
                    cidr: net("198.18.0.0/20"),
                    availability_zone: None,
                    ipv6_cidr: Some(net6("2001:db8:1200::/64")),
                    tags: BTreeMap::new(),
                },
                SubnetConfig {
                    cidr: net("198.18.16.0/20"),
                    availability_zone: None,
                    ipv6_cidr: Some(net6("2001:db8:1200:1::/64")),
                    tags: BTreeMap::new(),
                },
            ],
            security_groups: vec![
                SecurityGroupConfig {
                    name: "default".into(),
                    description: "default VPC security group".into(),
                    other_vpc: false,
                },
                SecurityGroupConfig {
                    name: "pods".into(),
                    description: "pod security group".into(),
                    other_vpc: false,
                },
            ],
            account_id: "123456789012".into(),
            random_addresses: None,
        }
    }
}

/// A `WorldConfig` that cannot describe a VPC.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A subnet lies in none of the VPC's CIDR blocks.
    #[error("subnet {0} is not inside any CIDR block of the VPC")]
    SubnetOutsideVpc(Ipv4Net),
    /// Two subnets overlap.
    #[error("subnets {0} and {1} overlap")]
    SubnetsOverlap(Ipv4Net, Ipv4Net),
    /// Two CIDR blocks of the VPC overlap.
    #[error("VPC CIDR blocks {0} and {1} overlap")]
    BlocksOverlap(Ipv4Net, Ipv4Net),
}

/// A multi-AZ world layout: `azs` zones (`<region>a`, `<region>b`, ...), `subnets_per_az`
/// subnets in the primary block per zone, and with `secondary_cidr` one subnet per zone in it
/// (the custom-networking subnets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Number of availability zones (1..=26).
    pub azs: u32,
    /// Primary-block subnets per zone.
    pub subnets_per_az: u32,
    /// A secondary VPC CIDR block (e.g. 100.64.0.0/16); one subnet per zone is cut from it.
    pub secondary_cidr: Option<Ipv4Net>,
}

impl Default for Layout {
    fn default() -> Self {
        Self {
            azs: 1,
            subnets_per_az: 2,
            secondary_cidr: None,
        }
    }
}

/// The name of zone `k` (0-based) of `region`: `us-west-2a`, `us-west-2b`, ...
pub fn az_name(region: &str, k: u32) -> String {
    let letter = char::from(b'a' + u8::try_from(k % 26).unwrap_or(0));
    format!("{region}{letter}")
}

/// `/20`s of `block`, in order (at most 16 from a /16).
fn twenties(block: Ipv4Net) -> impl Iterator<Item = Ipv4Net> {
    block
        .subnets(20.max(block.prefix_len()))
        .into_iter()
        .flatten()
}

impl WorldConfig {
    /// The default world reshaped to `layout`: primary-block subnets `198.18.<16 n>.0/20` (zone
    /// by zone, each with a /64), secondary-block subnets `/20` per zone. `Layout::default()`
    /// gives exactly `WorldConfig::default()`.
    #[must_use]
    pub fn with_layout(layout: &Layout) -> Self {
        let mut cfg = Self::default();
        let v6 = cfg.vpc_ipv6_cidr;
        let mut primary = twenties(cfg.vpc_cidr);
        let mut v6s = v6.and_then(|c| c.subnets(64).ok()).into_iter().flatten();
        let mut subnets = Vec::new();
        for k in 0..layout.azs.max(1) {
            for _ in 0..layout.subnets_per_az {
                if let Some(cidr) = primary.next() {
                    subnets.push(SubnetConfig {
                        cidr,
                        availability_zone: Some(az_name(&cfg.region, k)),
                        ipv6_cidr: v6s.next(),
                        tags: BTreeMap::new(),
                    });
                }
            }
        }
        if let Some(block) = layout.secondary_cidr {
            cfg.secondary_cidrs = vec![block];
            let mut secondary = twenties(block);
            for k in 0..layout.azs.max(1) {
                if let Some(cidr) = secondary.next() {
                    subnets.push(SubnetConfig {
                        cidr,
                        availability_zone: Some(az_name(&cfg.region, k)),
                        ipv6_cidr: None,
                        tags: BTreeMap::new(),
                    });
                }
            }
        }
        cfg.subnets = subnets;
        cfg
    }

    /// Every IPv4 CIDR block of the VPC, primary first.
    #[must_use]
    pub fn cidr_blocks(&self) -> Vec<Ipv4Net> {
        let mut v = vec![self.vpc_cidr];
        v.extend(self.secondary_cidrs.iter().copied());
        v
    }

    /// A subnet's zone (its own, else the world's default).
    #[must_use]
    pub fn subnet_az<'a>(&'a self, subnet: &'a SubnetConfig) -> &'a str {
        subnet
            .availability_zone
            .as_deref()
            .unwrap_or(&self.availability_zone)
    }

    /// Check that the configuration describes a VPC EC2 could have: blocks disjoint, every
    /// subnet inside one block, subnets disjoint.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let blocks = self.cidr_blocks();
        for (i, a) in blocks.iter().enumerate() {
            if let Some(b) = blocks[i + 1..]
                .iter()
                .find(|b| a.contains(*b) || b.contains(a))
            {
                return Err(ConfigError::BlocksOverlap(*a, *b));
            }
        }
        for (i, s) in self.subnets.iter().enumerate() {
            if !blocks.iter().any(|b| b.contains(&s.cidr)) {
                return Err(ConfigError::SubnetOutsideVpc(s.cidr));
            }
            if let Some(o) = self.subnets[i + 1..]
                .iter()
                .find(|o| o.cidr.contains(&s.cidr) || s.cidr.contains(&o.cidr))
            {
                return Err(ConfigError::SubnetsOverlap(s.cidr, o.cidr));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_is_the_default_world() {
        assert_eq!(
            WorldConfig::with_layout(&Layout::default()).subnets.len(),
            2
        );
        let d = WorldConfig::default();
        let l = WorldConfig::with_layout(&Layout::default());
        for (a, b) in d.subnets.iter().zip(&l.subnets) {
            assert_eq!((a.cidr, a.ipv6_cidr), (b.cidr, b.ipv6_cidr));
            assert_eq!(d.subnet_az(a), l.subnet_az(b));
        }
        d.validate().unwrap();
    }

    #[test]
    fn two_zone_layout_with_secondary_block() {
        let cfg = WorldConfig::with_layout(&Layout {
            azs: 2,
            subnets_per_az: 1,
            secondary_cidr: Some("100.64.0.0/16".parse().unwrap()),
        });
        cfg.validate().unwrap();
        let got: Vec<(String, &str)> = cfg
            .subnets
            .iter()
            .map(|s| (s.cidr.to_string(), cfg.subnet_az(s)))
            .collect();
        assert_eq!(
            got,
            [
                ("198.18.0.0/20".to_owned(), "us-west-2a"),
                ("198.18.16.0/20".to_owned(), "us-west-2b"),
                ("100.64.0.0/20".to_owned(), "us-west-2a"),
                ("100.64.16.0/20".to_owned(), "us-west-2b"),
            ]
        );
        assert_eq!(cfg.cidr_blocks().len(), 2);
    }

    #[test]
    fn subnet_outside_every_block_is_refused() {
        let mut cfg = WorldConfig::default();
        cfg.subnets[1].cidr = "100.64.0.0/20".parse().unwrap();
        assert!(matches!(
            cfg.validate(),
            Err(ConfigError::SubnetOutsideVpc(_))
        ));
        cfg.secondary_cidrs = vec!["100.64.0.0/16".parse().unwrap()];
        cfg.validate().unwrap();
        cfg.subnets[1].cidr = "198.18.8.0/24".parse().unwrap();
        assert!(matches!(
            cfg.validate(),
            Err(ConfigError::SubnetsOverlap(..))
        ));
    }
}
