//! Cluster-wide subnet inventory: which subnets the cluster draws pod addresses from (the
//! nodes' primary subnets, custom networking's ENIConfig subnets, subnets tagged for subnet
//! discovery), what is left in each (free addresses, free aligned `/28` blocks, see
//! [`count`]), how fast it goes and when it runs out (see [`forecast`]). One bounded set of
//! EC2 calls per inventory interval, made by [`ec2::Ec2Inventory`]; this module decides the
//! subnet set and keeps the histories. Must not talk to CloudWatch or serve HTTP.

pub mod count;
pub mod ec2;
pub mod forecast;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

pub use count::{Figures, Occupancy, ReservationKind};
pub use forecast::{Forecast, History};

/// The subnet-discovery tag: present with any value but `0` makes a subnet a candidate for new
/// ENIs.
pub const CNI_ROLE_TAG: &str = "kubernetes.io/role/cni";

/// Why a subnet is in the inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// A node's primary ENI is in it.
    Primary,
    /// An ENIConfig (custom networking) names it.
    EniConfig,
    /// Tagged `kubernetes.io/role/cni` (not `0`) in a node's VPC and zone.
    Discovered,
}

impl Source {
    /// The label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Primary => "primary",
            Source::EniConfig => "eniconfig",
            Source::Discovered => "discovered",
        }
    }
}

/// One subnet as `DescribeSubnets` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetRecord {
    pub id: String,
    pub vpc_id: String,
    pub availability_zone: String,
    pub cidr: Ipv4Net,
    /// EC2's `AvailableIpAddressCount`.
    pub available: u32,
    pub tags: BTreeMap<String, String>,
}

/// One ENI's IPv4 holdings as `DescribeNetworkInterfaces` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniRecord {
    pub subnet_id: String,
    pub vpc_id: String,
    pub availability_zone: String,
    pub addresses: Vec<Ipv4Addr>,
    pub prefixes: Vec<Ipv4Net>,
}

/// What one subnet looks like this round.
#[derive(Debug, Clone, PartialEq)]
pub struct SubnetReport {
    pub subnet_id: String,
    pub cidr: Ipv4Net,
    pub availability_zone: String,
    /// Every reason it is in the inventory.
    pub sources: BTreeSet<Source>,
    /// EC2's `AvailableIpAddressCount`.
    pub ec2_available: u32,
    pub figures: Figures,
    /// Free addresses: rate and time to exhaustion.
    pub addresses: Option<Forecast>,
    /// Free `/28` blocks: rate and time to exhaustion.
    pub prefix_blocks: Option<Forecast>,
}

/// True if a tagged subnet is one subnet discovery would use.
#[must_use]
pub fn discoverable(tags: &BTreeMap<String, String>) -> bool {
    tags.get(CNI_ROLE_TAG).is_some_and(|v| v != "0")
}

/// The inventory's subnet set: `(subnet id, why)`. Pure.
#[must_use]
pub fn cluster_subnets(
    primary_enis: &[EniRecord],
    eniconfig_subnets: &[String],
    tagged: &[SubnetRecord],
) -> BTreeMap<String, BTreeSet<Source>> {
    let zones: BTreeSet<(&str, &str)> = primary_enis
        .iter()
        .map(|e| (e.vpc_id.as_str(), e.availability_zone.as_str()))
        .collect();
    let mut out: BTreeMap<String, BTreeSet<Source>> = BTreeMap::new();
    for e in primary_enis {
        out.entry(e.subnet_id.clone())
            .or_default()
            .insert(Source::Primary);
    }
    for s in eniconfig_subnets {
        out.entry(s.clone()).or_default().insert(Source::EniConfig);
    }
    for s in tagged.iter().filter(|s| {
        discoverable(&s.tags) && zones.contains(&(s.vpc_id.as_str(), s.availability_zone.as_str()))
    }) {
        out.entry(s.id.clone())
            .or_default()
            .insert(Source::Discovered);
    }
    out
}

/// The figures of each subnet from every ENI in them and their reservations. Pure.
#[must_use]
pub fn occupancy(
    subnets: &[SubnetRecord],
    enis: &[EniRecord],
    reservations: &BTreeMap<String, Vec<(Ipv4Net, ReservationKind)>>,
) -> BTreeMap<String, Figures> {
    subnets
        .iter()
        .map(|s| {
            let mut occ = Occupancy {
                reservations: reservations.get(&s.id).cloned().unwrap_or_default(),
                ..Occupancy::default()
            };
            for e in enis.iter().filter(|e| e.subnet_id == s.id) {
                occ.addresses.extend(&e.addresses);
                occ.prefixes.extend(&e.prefixes);
            }
            (s.id.clone(), count::count(s.cidr, &occ))
        })
        .collect()
}

/// The histories across rounds: one pair per subnet (addresses, `/28` blocks).
#[derive(Debug, Clone)]
pub struct Inventory {
    window_secs: f64,
    histories: BTreeMap<String, (History, History)>,
}

impl Inventory {
    /// Forecasts over the last `window_secs` of samples.
    #[must_use]
    pub fn new(window_secs: f64) -> Self {
        Self {
            window_secs,
            histories: BTreeMap::new(),
        }
    }

    /// Records this round's figures (seen at `at` seconds) and returns the reports; subnets
    /// that left the set lose their history.
    pub fn record(
        &mut self,
        at: f64,
        subnets: &[SubnetRecord],
        sources: &BTreeMap<String, BTreeSet<Source>>,
        figures: &BTreeMap<String, Figures>,
    ) -> Vec<SubnetReport> {
        self.histories.retain(|id, _| figures.contains_key(id));
        let mut out = Vec::new();
        for s in subnets {
            let Some(f) = figures.get(&s.id) else {
                continue;
            };
            let (addresses, blocks) = self.histories.entry(s.id.clone()).or_insert_with(|| {
                (
                    History::new(self.window_secs),
                    History::new(self.window_secs),
                )
            });
            addresses.record(at, f64::from(f.free_addresses));
            blocks.record(at, f64::from(f.free_prefix_blocks));
            out.push(SubnetReport {
                subnet_id: s.id.clone(),
                cidr: s.cidr,
                availability_zone: s.availability_zone.clone(),
                sources: sources.get(&s.id).cloned().unwrap_or_default(),
                ec2_available: s.available,
                figures: *f,
                addresses: addresses.forecast(),
                prefix_blocks: blocks.forecast(),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eni(subnet: &str, az: &str) -> EniRecord {
        EniRecord {
            subnet_id: subnet.into(),
            vpc_id: "vpc-1".into(),
            availability_zone: az.into(),
            addresses: vec![],
            prefixes: vec![],
        }
    }

    fn subnet(id: &str, az: &str, tag: Option<&str>) -> SubnetRecord {
        SubnetRecord {
            id: id.into(),
            vpc_id: "vpc-1".into(),
            availability_zone: az.into(),
            cidr: "198.18.0.0/24".parse().unwrap(),
            available: 251,
            tags: tag
                .map(|v| (CNI_ROLE_TAG.to_owned(), v.to_owned()))
                .into_iter()
                .collect(),
        }
    }

    #[test]
    fn the_set_is_primaries_eniconfigs_and_tagged_subnets_in_the_nodes_zones() {
        let set = cluster_subnets(
            &[eni("subnet-a", "az1"), eni("subnet-a", "az1")],
            &["subnet-c".to_owned()],
            &[
                subnet("subnet-a", "az1", Some("1")),
                subnet("subnet-t", "az1", Some("")),
                subnet("subnet-x", "az1", Some("0")),
                subnet("subnet-z", "az9", Some("1")),
            ],
        );
        let ids: Vec<&str> = set.keys().map(String::as_str).collect();
        assert_eq!(ids, ["subnet-a", "subnet-c", "subnet-t"]);
        assert_eq!(
            set["subnet-a"],
            BTreeSet::from([Source::Primary, Source::Discovered])
        );
    }

    #[test]
    fn histories_follow_the_subnet_set() {
        let mut inv = Inventory::new(600.0);
        let s = [subnet("subnet-a", "az1", None)];
        let sources = BTreeMap::from([("subnet-a".to_owned(), BTreeSet::from([Source::Primary]))]);
        for i in 0..4u32 {
            let figures = BTreeMap::from([(
                "subnet-a".to_owned(),
                Figures {
                    free_addresses: 100 - 10 * i,
                    free_prefix_blocks: 5,
                },
            )]);
            let r = inv.record(f64::from(i) * 10.0, &s, &sources, &figures);
            assert_eq!(r.len(), 1);
            if i == 3 {
                let a = r[0].addresses.unwrap();
                assert!((a.consumption_per_sec - 1.0).abs() < 1e-9);
                assert!((a.exhaustion_secs.unwrap() - 70.0).abs() < 1e-6);
                assert_eq!(r[0].prefix_blocks.unwrap().exhaustion_secs, None);
            }
        }
        inv.record(40.0, &s, &sources, &BTreeMap::new());
        assert!(inv.histories.is_empty());
    }
}
