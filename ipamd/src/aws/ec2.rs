//! The `Ec2` port: the EC2 operations ipamd needs, domain-shaped (an ENI with addresses, not a
//! request builder). EC2 is the source of truth for what an ENI holds.

use std::future::Future;
use std::net::Ipv4Addr;

use ipnet::{Ipv4Net, Ipv6Net};

use super::error::Ec2Error;
use super::limits::InstanceTypeLimits;
use super::{Ec2Eni, Tags};

/// Which ENIs to describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EniQuery {
    /// These ids (an unknown id fails the call with `NotFound`).
    Ids(Vec<String>),
    /// All ENIs attached to this instance (`attachment.instance-id`): one call at node init.
    AttachedTo(String),
    /// Leaked-ENI candidates: `available` ENIs of this VPC with the instance-id tag key and, when
    /// set, this cluster's tag.
    Leaked {
        vpc_id: String,
        cluster_name: Option<String>,
    },
}

/// How many addresses to ask for: secondary /32s or /28 prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressRequest {
    Ips(u32),
    Prefixes(u32),
}

impl AddressRequest {
    pub fn count(self) -> u32 {
        match self {
            Self::Ips(n) | Self::Prefixes(n) => n,
        }
    }
}

/// A `CreateNetworkInterface` request: the ENI is born with its addresses and tags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateEni {
    pub subnet_id: String,
    pub security_groups: Vec<String>,
    pub description: String,
    pub tags: Tags,
    /// Addresses created with the ENI; `Ips(0)` creates it with its primary address only.
    pub addresses: AddressRequest,
    /// `ConnectionTrackingSpecification`: the primary ENI's settings, copied (None: not sent).
    pub conntrack: Option<ConntrackSpec>,
}

/// An ENI's connection-tracking timeouts (seconds), as EC2's `ConnectionTrackingConfiguration`
/// describes them and `ConnectionTrackingSpecification` requests them. A field EC2 does not
/// list is None.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ConntrackSpec {
    pub tcp_established_timeout: Option<i32>,
    pub udp_stream_timeout: Option<i32>,
    pub udp_timeout: Option<i32>,
}

impl ConntrackSpec {
    /// A configuration with no field set is no configuration (nothing is copied to new ENIs).
    #[must_use]
    pub fn if_set(self) -> Option<Self> {
        (self.tcp_established_timeout.is_some()
            || self.udp_stream_timeout.is_some()
            || self.udp_timeout.is_some())
        .then_some(self)
    }
}

/// One subnet as `DescribeSubnets` lists it: what subnet discovery decides on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SubnetInfo {
    pub subnet_id: String,
    pub availability_zone: String,
    /// `AvailableIpAddressCount` at the time of the Describe.
    pub available_ips: u32,
    pub tags: Tags,
}

/// EC2, as ipamd uses it. Every implementation must be safe to share across tasks.
pub trait Ec2: Send + Sync {
    fn describe_enis(
        &self,
        query: EniQuery,
    ) -> impl Future<Output = Result<Vec<Ec2Eni>, Ec2Error>> + Send;

    /// `DescribeInstanceTypes` for one type (fallback for the static limits table).
    fn instance_type_limits(
        &self,
        instance_type: &str,
    ) -> impl Future<Output = Result<InstanceTypeLimits, Ec2Error>> + Send;

    fn create_eni(&self, req: CreateEni) -> impl Future<Output = Result<Ec2Eni, Ec2Error>> + Send;

    /// `DescribeSubnets` for one subnet: its availability zone (None: EC2 does not know it).
    fn subnet_zone(
        &self,
        subnet_id: &str,
    ) -> impl Future<Output = Result<Option<String>, Ec2Error>> + Send;

    /// `DescribeSubnets` filtered by `vpc-id` and `availability-zone`, every page.
    fn describe_subnets(
        &self,
        vpc_id: &str,
        availability_zone: &str,
    ) -> impl Future<Output = Result<Vec<SubnetInfo>, Ec2Error>> + Send;

    /// Attach; returns the attachment id.
    fn attach_eni(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        network_card: u32,
    ) -> impl Future<Output = Result<String, Ec2Error>> + Send;

    /// `ModifyNetworkInterfaceAttribute` → `Attachment.DeleteOnTermination=true`.
    fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
    ) -> impl Future<Output = Result<(), Ec2Error>> + Send;

    /// `ModifyNetworkInterfaceAttribute` → `Groups`: replaces the ENI's security groups.
    fn set_security_groups(
        &self,
        eni_id: &str,
        groups: &[String],
    ) -> impl Future<Output = Result<(), Ec2Error>> + Send;

    /// Assign more addresses; returns only the addresses this call added (/32 or /28).
    fn assign(
        &self,
        eni_id: &str,
        req: AddressRequest,
    ) -> impl Future<Output = Result<Vec<Ipv4Net>, Ec2Error>> + Send;

    /// `AssignIpv6Addresses` with `Ipv6PrefixCount`: delegates `count` /80 prefixes to the
    /// ENI; returns only the prefixes this call added.
    fn assign_ipv6_prefixes(
        &self,
        eni_id: &str,
        count: u32,
    ) -> impl Future<Output = Result<Vec<Ipv6Net>, Ec2Error>> + Send;

    /// Unassign secondary IPs (/32 entries) and prefixes (other entries). An error says
    /// [`Ec2Error::NotApplied`] only when EC2 refused every request it was sent for `cidrs`
    /// before acting on any (each try one request, no transparent retry, re-sent only after a
    /// refusal): then none of `cidrs` was released. Any other error may follow a request EC2
    /// applied (its answer lost) and proves nothing either way.
    fn unassign(
        &self,
        eni_id: &str,
        cidrs: &[Ipv4Net],
    ) -> impl Future<Output = Result<(), Ec2Error>> + Send;

    fn detach_eni(&self, attachment_id: &str) -> impl Future<Output = Result<(), Ec2Error>> + Send;

    fn delete_eni(&self, eni_id: &str) -> impl Future<Output = Result<(), Ec2Error>> + Send;

    fn create_tags(
        &self,
        eni_id: &str,
        tags: &Tags,
    ) -> impl Future<Output = Result<(), Ec2Error>> + Send;
}

/// Split a CIDR list into secondary IPs (/32) and prefixes (anything else).
pub fn split_cidrs(cidrs: &[Ipv4Net]) -> (Vec<Ipv4Addr>, Vec<Ipv4Net>) {
    let ips = cidrs
        .iter()
        .filter(|c| c.prefix_len() == 32)
        .map(Ipv4Net::addr)
        .collect();
    let prefixes = cidrs
        .iter()
        .filter(|c| c.prefix_len() != 32)
        .copied()
        .collect();
    (ips, prefixes)
}
