//! The inventory's EC2 adapter: the bounded set of calls one inventory round makes, through
//! the SDK (standard retries). Owns the request shapes and their decoding; decides nothing
//! about which subnets matter (see [`super::cluster_subnets`]).
//!
//! Per round, with N nodes, S subnets in the set and E ENIs in them:
//! `DescribeNetworkInterfaces` by the nodes' addresses (`ceil(N/200)` requests, pages of 1000),
//! `DescribeSubnets` of the nodes' VPCs tagged `kubernetes.io/role/cni` (one per VPC),
//! `DescribeSubnets` by id (`ceil(S/200)`), `DescribeNetworkInterfaces` by subnet
//! (`ceil(S/200)` requests, `ceil(E/1000)` pages), `GetSubnetCidrReservations` (S).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use aws_sdk_ec2::types::{Filter, SubnetCidrReservationType};
use ipnet::Ipv4Net;

use super::{EniRecord, ReservationKind, SubnetRecord};

/// EC2 accepts at most 200 values per filter.
pub const FILTER_VALUES: usize = 200;
/// `MaxResults` of every paged call.
pub const PAGE: i32 = 1000;

/// A failed inventory call.
#[derive(Debug, thiserror::Error)]
#[error("{action}: {message}")]
pub struct InventoryError {
    /// The EC2 action.
    pub action: &'static str,
    /// EC2's error code, if it answered with one.
    pub code: Option<String>,
    pub message: String,
}

impl InventoryError {
    fn of<E, R>(action: &'static str, e: &aws_sdk_ec2::error::SdkError<E, R>) -> Self
    where
        E: aws_sdk_ec2::error::ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        use aws_sdk_ec2::error::ProvideErrorMetadata as _;
        Self {
            action,
            code: e.code().map(str::to_owned),
            message: aws_sdk_ec2::error::DisplayErrorContext(e).to_string(),
        }
    }

    /// The helper's role lacks the action (`UnauthorizedOperation`): the IAM policy needs
    /// `ec2:<action>`.
    #[must_use]
    pub fn unauthorized(&self) -> bool {
        matches!(
            self.code.as_deref(),
            Some("UnauthorizedOperation" | "AccessDenied" | "AccessDeniedException")
        )
    }
}

/// Everything one round read.
#[derive(Debug, Clone, Default)]
pub struct Collected {
    pub primary_enis: Vec<EniRecord>,
    pub tagged: Vec<SubnetRecord>,
    pub subnets: Vec<SubnetRecord>,
    pub enis: Vec<EniRecord>,
    pub reservations: BTreeMap<String, Vec<(Ipv4Net, ReservationKind)>>,
    /// EC2 requests made (pages included).
    pub calls: u32,
}

/// The SDK client.
#[derive(Debug, Clone)]
pub struct Ec2Inventory {
    client: aws_sdk_ec2::Client,
}

fn filter(name: &str, values: &[String]) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.to_vec()))
        .build()
}

fn eni_record(e: &aws_sdk_ec2::types::NetworkInterface) -> EniRecord {
    EniRecord {
        subnet_id: e.subnet_id().unwrap_or_default().to_owned(),
        vpc_id: e.vpc_id().unwrap_or_default().to_owned(),
        availability_zone: e.availability_zone().unwrap_or_default().to_owned(),
        addresses: e
            .private_ip_addresses()
            .iter()
            .filter_map(|a| a.private_ip_address()?.parse().ok())
            .collect(),
        prefixes: e
            .ipv4_prefixes()
            .iter()
            .filter_map(|p| p.ipv4_prefix()?.parse().ok())
            .collect(),
    }
}

fn subnet_record(s: &aws_sdk_ec2::types::Subnet) -> Option<SubnetRecord> {
    Some(SubnetRecord {
        id: s.subnet_id()?.to_owned(),
        vpc_id: s.vpc_id().unwrap_or_default().to_owned(),
        availability_zone: s.availability_zone().unwrap_or_default().to_owned(),
        cidr: s.cidr_block()?.parse().ok()?,
        available: u32::try_from(s.available_ip_address_count().unwrap_or(0)).unwrap_or(0),
        tags: s
            .tags()
            .iter()
            .filter_map(|t| {
                Some((
                    t.key()?.to_owned(),
                    t.value().unwrap_or_default().to_owned(),
                ))
            })
            .collect(),
    })
}

impl Ec2Inventory {
    /// A client for `region` (IMDS's when `None`), at `endpoint` when given (tests).
    pub async fn new(region: Option<String>, endpoint: Option<String>) -> Self {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(crate::cloudwatch::http_client());
        if let Some(r) = region {
            loader = loader.region(aws_config::Region::new(r));
        }
        if let Some(e) = endpoint {
            loader = loader.endpoint_url(e);
        }
        Self {
            client: aws_sdk_ec2::Client::new(&loader.load().await),
        }
    }

    /// A client from an SDK configuration (tests with static credentials).
    #[must_use]
    pub fn from_conf(conf: aws_sdk_ec2::Config) -> Self {
        Self {
            client: aws_sdk_ec2::Client::from_conf(conf),
        }
    }

    /// Every ENI matching `name` in `values` (chunked, paged).
    async fn enis(
        &self,
        name: &str,
        values: &[String],
        calls: &mut u32,
    ) -> Result<Vec<EniRecord>, InventoryError> {
        let mut out = Vec::new();
        for chunk in values.chunks(FILTER_VALUES) {
            let mut token = None;
            loop {
                *calls += 1;
                let page = self
                    .client
                    .describe_network_interfaces()
                    .filters(filter(name, chunk))
                    .max_results(PAGE)
                    .set_next_token(token)
                    .send()
                    .await
                    .map_err(|e| InventoryError::of("DescribeNetworkInterfaces", &e))?;
                out.extend(page.network_interfaces().iter().map(eni_record));
                token = page
                    .next_token()
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned);
                if token.is_none() {
                    break;
                }
            }
        }
        Ok(out)
    }

    async fn subnets(
        &self,
        ids: &[String],
        filters: Vec<Filter>,
        calls: &mut u32,
    ) -> Result<Vec<SubnetRecord>, InventoryError> {
        let mut out = Vec::new();
        let chunks: Vec<Option<&[String]>> = if ids.is_empty() {
            vec![None]
        } else {
            ids.chunks(FILTER_VALUES).map(Some).collect()
        };
        for chunk in chunks {
            *calls += 1;
            let page = self
                .client
                .describe_subnets()
                .set_subnet_ids(chunk.map(<[String]>::to_vec))
                .set_filters(Some(filters.clone()).filter(|f| !f.is_empty()))
                .send()
                .await
                .map_err(|e| InventoryError::of("DescribeSubnets", &e))?;
            out.extend(page.subnets().iter().filter_map(subnet_record));
        }
        Ok(out)
    }

    /// One round: the nodes' primary ENIs (by `host_ips`), the tagged subnets of their VPCs,
    /// the set [`super::cluster_subnets`] decides (with `eniconfig_subnets`), every ENI in
    /// those subnets and their CIDR reservations.
    pub async fn collect(
        &self,
        host_ips: &[Ipv4Addr],
        eniconfig_subnets: &[String],
    ) -> Result<Collected, InventoryError> {
        let mut c = Collected::default();
        let ips: Vec<String> = host_ips.iter().map(ToString::to_string).collect();
        c.primary_enis = if ips.is_empty() {
            Vec::new()
        } else {
            self.enis("addresses.private-ip-address", &ips, &mut c.calls)
                .await?
        };
        let vpcs: BTreeSet<String> = c.primary_enis.iter().map(|e| e.vpc_id.clone()).collect();
        for vpc in vpcs {
            let tagged = self
                .subnets(
                    &[],
                    vec![
                        filter("vpc-id", &[vpc]),
                        filter("tag-key", &[super::CNI_ROLE_TAG.to_owned()]),
                    ],
                    &mut c.calls,
                )
                .await?;
            c.tagged.extend(tagged);
        }
        let set = super::cluster_subnets(&c.primary_enis, eniconfig_subnets, &c.tagged);
        let ids: Vec<String> = set.keys().cloned().collect();
        if ids.is_empty() {
            return Ok(c);
        }
        c.subnets = self.subnets(&ids, Vec::new(), &mut c.calls).await?;
        c.enis = self.enis("subnet-id", &ids, &mut c.calls).await?;
        for id in &ids {
            c.calls += 1;
            let out = self
                .client
                .get_subnet_cidr_reservations()
                .subnet_id(id)
                .send()
                .await
                .map_err(|e| InventoryError::of("GetSubnetCidrReservations", &e))?;
            let list = out
                .subnet_ipv4_cidr_reservations()
                .iter()
                .filter_map(|r| {
                    let cidr: Ipv4Net = r.cidr()?.parse().ok()?;
                    let kind = match r.reservation_type()? {
                        SubnetCidrReservationType::Prefix => ReservationKind::Prefix,
                        SubnetCidrReservationType::Explicit => ReservationKind::Explicit,
                        _ => return None,
                    };
                    Some((cidr, kind))
                })
                .collect();
            c.reservations.insert(id.clone(), list);
        }
        Ok(c)
    }
}
