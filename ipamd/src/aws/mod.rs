//! The AWS boundary of ipamd: EC2 and IMDS as two domain-shaped ports (`Ec2`, `Imds`), their
//! SDK implementations, the instance limits table, the node's EC2 token bucket and the AWS API
//! metrics. This is the ONLY module that imports aws-sdk/aws-config types; everything it hands
//! out is a plain value type below. It must not touch the datastore, the kernel or the config
//! environment.

#![allow(missing_docs)]

pub mod ec2;
pub mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod imds;
pub mod limits;
#[cfg(feature = "memory-provider")]
pub mod memory;
pub mod metrics;
pub mod provider;
pub mod sdk;
pub mod subnets;
pub mod throttle;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

pub use ec2::{AddressRequest, ConntrackSpec, CreateEni, Ec2, EniQuery, SubnetInfo};
pub use error::{Ec2Error, ImdsError};
pub use imds::Imds;
pub use limits::InstanceTypeLimits;

/// Description prefix of every ENI ipamd creates (`aws-K8S-<instance-id>`), the one existing ENIs
/// carry, so either CNI's leaked-ENI clean-up recognises the other's ENIs.
pub const ENI_DESCRIPTION_PREFIX: &str = "aws-K8S-";
/// Tag naming the instance an ENI was created for.
pub const TAG_INSTANCE_ID: &str = "node.k8s.amazonaws.com/instance_id";
/// Tag with the RFC 3339 creation time, used by the leaked-ENI grace period.
pub const TAG_CREATED_AT: &str = "node.k8s.amazonaws.com/createdAt";
/// Tag marking an ENI that ipamd must leave alone (`true`).
pub const TAG_NO_MANAGE: &str = "node.k8s.amazonaws.com/no_manage";
/// Cluster ownership tag, set when `CLUSTER_NAME` is configured.
pub const TAG_CLUSTER_NAME: &str = "cluster.k8s.amazonaws.com/name";
/// Owner tag set together with the cluster tag.
pub const TAG_ENI_OWNER: &str = "eks:eni:owner";
/// Value of [`TAG_ENI_OWNER`].
pub const ENI_OWNER_VALUE: &str = "amazon-vpc-cni";
/// Substring that disqualifies a key of `ADDITIONAL_ENI_TAGS` (reserved for ipamd).
pub const RESERVED_TAG_MARKER: &str = "k8s.amazonaws.com";

/// Tags as EC2 stores them (key → value), ordered for stable requests and tests.
pub type Tags = BTreeMap<String, String>;

/// Who the node is, from IMDS.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceIdentity {
    pub instance_id: String,
    pub instance_type: String,
    pub region: String,
    pub availability_zone: String,
    /// MAC of the primary ENI (device 0).
    pub primary_mac: String,
}

/// One ENI as IMDS lists it under `network/interfaces/macs/<mac>/`. A hint: it may lag EC2.
/// The adapter's raw IMDS view; the pool never sees it (it gets `pool::ec2_port::AttachedEni`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImdsEni {
    pub mac: String,
    pub eni_id: String,
    pub device_number: u32,
    pub network_card: u32,
    pub subnet_id: String,
    pub subnet_cidr: Ipv4Net,
    pub vpc_cidrs: Vec<Ipv4Net>,
    pub security_groups: Vec<String>,
    /// First entry of `local-ipv4s`.
    pub primary_ip: Ipv4Addr,
    /// The other entries of `local-ipv4s`.
    pub secondary_ips: Vec<Ipv4Addr>,
    /// `ipv4-prefix` entries (/28s).
    pub prefixes: Vec<Ipv4Net>,
    /// `ipv6s` (empty on an IPv4-only ENI).
    pub ipv6s: Vec<Ipv6Addr>,
    /// `vpc-ipv6-cidr-blocks` (empty in a VPC without IPv6).
    pub vpc_ipv6_cidrs: Vec<Ipv6Net>,
}

/// The attachment of an ENI to an instance, as EC2 reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attachment {
    pub attachment_id: String,
    pub instance_id: String,
    pub device_index: u32,
    pub network_card: u32,
    pub delete_on_termination: bool,
}

/// `Status` of an ENI in EC2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EniStatus {
    Available,
    Attaching,
    InUse,
    Detaching,
    Other,
}

/// One ENI as EC2 describes it: the source of truth, any ENI of the VPC (attached or not, ours
/// or not). The adapter's raw EC2 view; the pool gets `pool::ec2_port::AttachedEni` from it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ec2Eni {
    pub eni_id: String,
    pub mac: String,
    pub subnet_id: String,
    pub vpc_id: String,
    pub description: String,
    pub interface_type: String,
    pub status: EniStatus,
    pub primary_ip: Ipv4Addr,
    pub secondary_ips: Vec<Ipv4Addr>,
    pub prefixes: Vec<Ipv4Net>,
    /// `Ipv6Prefixes` (/80s delegated to the ENI).
    #[serde(default)]
    pub ipv6_prefixes: Vec<Ipv6Net>,
    /// `Ipv6Addresses` (individual /128s).
    #[serde(default)]
    pub ipv6_addresses: Vec<Ipv6Addr>,
    pub security_groups: Vec<String>,
    pub tags: Tags,
    pub attachment: Option<Attachment>,
    /// `ConnectionTrackingConfiguration` (None when EC2 lists none).
    #[serde(default)]
    pub conntrack: Option<ConntrackSpec>,
}

impl Ec2Eni {
    /// Every address block EC2 holds for pods on this ENI: secondary IPs as /32 and prefixes.
    pub fn pod_cidrs(&self) -> Vec<Ipv4Net> {
        self.secondary_ips
            .iter()
            .map(|ip| Ipv4Net::from(*ip))
            .chain(self.prefixes.iter().copied())
            .collect()
    }

    /// True when the ENI carries `node.k8s.amazonaws.com/no_manage=true`.
    pub fn is_no_manage(&self) -> bool {
        self.tags.get(TAG_NO_MANAGE).is_some_and(|v| v == "true")
    }

    /// Whether ipamd leaves this ENI's addresses alone: a `no_manage` tag decides when present
    /// (`true` = unmanaged); else an ENI tagged with this instance's id was created by ipamd and is
    /// managed; else it is managed only in manage-untagged mode (`MANAGE_UNTAGGED_ENI`, default
    /// true). The caller keeps the primary ENI managed.
    pub fn is_unmanaged(&self, instance_id: Option<&str>, manage_untagged: bool) -> bool {
        if let Some(v) = self.tags.get(TAG_NO_MANAGE) {
            return v == "true";
        }
        if instance_id.is_some_and(|id| self.tags.get(TAG_INSTANCE_ID).is_some_and(|t| t == id)) {
            return false;
        }
        !manage_untagged
    }

    /// True for trunk and EFA interfaces, which ipamd never uses for pods.
    pub fn is_special(&self) -> bool {
        matches!(
            self.interface_type.as_str(),
            "trunk" | "efa" | "efa-only" | "branch"
        )
    }
}

impl ImdsEni {
    /// Secondary IPs as /32 plus prefixes, the same shape as [`Ec2Eni::pod_cidrs`].
    pub fn pod_cidrs(&self) -> Vec<Ipv4Net> {
        self.secondary_ips
            .iter()
            .map(|ip| Ipv4Net::from(*ip))
            .chain(self.prefixes.iter().copied())
            .collect()
    }
}
