//! Mutating operations on `State`, each validating everything before changing anything, so a
//! refused request leaves the state untouched; one file per job (ENIs, IPv4, IPv6, tags,
//! instances), the request types here. Must not know HTTP or knobs.

mod eni;
mod family;
mod groups;
mod instances;
mod ipv4;
mod ipv6;
mod subnets;
mod tags;
#[cfg(test)]
mod tests;
mod trunk;

#[cfg(test)]
use super::Now;
use super::{Eni, InstanceState, State, StateError};
pub use groups::Direction;
use ipnet::{Ipv4Net, Ipv6Net};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
pub use subnets::CreateSubnet;

/// `CreateNetworkInterface` input.
#[derive(Debug, Clone, Default)]
pub struct CreateEni {
    /// Subnet (required).
    pub subnet_id: String,
    /// Description.
    pub description: String,
    /// Security groups (default: the VPC's default group).
    pub groups: Vec<String>,
    /// Explicit primary address.
    pub primary_ip: Option<Ipv4Addr>,
    /// Explicit secondary addresses.
    pub secondary_ips: Vec<Ipv4Addr>,
    /// Number of secondary addresses to pick.
    pub secondary_count: u32,
    /// Number of /28 prefixes to pick.
    pub ipv4_prefix_count: u32,
    /// Explicit /28 prefixes.
    pub ipv4_prefixes: Vec<Ipv4Net>,
    /// Number of IPv6 addresses to pick.
    pub ipv6_count: u32,
    /// Number of /80 prefixes to pick.
    pub ipv6_prefix_count: u32,
    /// Tags from `TagSpecification` with resource type `network-interface`.
    pub tags: BTreeMap<String, String>,
    /// `ConnectionTrackingSpecification`.
    pub conntrack: Option<super::ConnTracking>,
    /// `InterfaceType`: empty or `interface`, or `trunk`.
    pub interface_type: String,
}

/// `AssignPrivateIpAddresses` input.
#[derive(Debug, Clone, Default)]
pub struct AssignIpv4 {
    /// Number of addresses to pick.
    pub count: u32,
    /// Explicit addresses.
    pub addresses: Vec<Ipv4Addr>,
    /// Number of /28 prefixes to pick.
    pub prefix_count: u32,
    /// Explicit prefixes.
    pub prefixes: Vec<Ipv4Net>,
    /// Take explicit addresses from other ENIs.
    pub allow_reassignment: bool,
}

/// `AssignIpv6Addresses` input.
#[derive(Debug, Clone, Default)]
pub struct AssignIpv6 {
    /// Number of addresses to pick.
    pub count: u32,
    /// Explicit addresses.
    pub addresses: Vec<Ipv6Addr>,
    /// Number of /80 prefixes to pick.
    pub prefix_count: u32,
    /// Explicit prefixes.
    pub prefixes: Vec<Ipv6Net>,
}

/// `ModifyNetworkInterfaceAttribute` input (EC2 accepts exactly one attribute per call).
#[derive(Debug, Clone, Default)]
pub struct ModifyEni {
    /// `(attachment id, delete on termination)`.
    pub delete_on_termination: Option<(String, bool)>,
    /// Replace the security groups.
    pub groups: Option<Vec<String>>,
    /// New description.
    pub description: Option<String>,
    /// New source/dest check.
    pub source_dest_check: Option<bool>,
    /// `ConnectionTrackingSpecification` (the fields it names change).
    pub conntrack: Option<super::ConnTracking>,
}

/// `RunInstances` input.
#[derive(Debug, Clone, Default)]
pub struct RunInstances {
    /// Instance type (must be in the limits table).
    pub instance_type: String,
    /// Subnet (default: the first one).
    pub subnet_id: Option<String>,
    /// How many.
    pub count: u32,
    /// Security groups of the primary ENI.
    pub groups: Vec<String>,
    /// Instance tags.
    pub tags: BTreeMap<String, String>,
    /// IPv6 addresses for the primary ENI (`Ipv6AddressCount`; the subnet needs an IPv6 CIDR).
    pub ipv6_count: u32,
}

/// One entry of a `TerminateInstances` answer.
#[derive(Debug, Clone)]
pub struct TerminatedInstance {
    /// Instance id.
    pub instance_id: String,
    /// State before.
    pub previous: InstanceState,
    /// State after.
    pub current: InstanceState,
}

fn check_eni_id(id: &str) -> Result<(), StateError> {
    if id.starts_with("eni-") && id.len() > 4 {
        Ok(())
    } else {
        Err(StateError::EniIdMalformed(id.to_owned()))
    }
}

impl State {
    pub(super) fn eni_mut(&mut self, id: &str) -> Result<&mut Eni, StateError> {
        check_eni_id(id)?;
        self.enis
            .get_mut(id)
            .ok_or_else(|| StateError::EniNotFound(id.to_owned()))
    }

    /// Every group exists and belongs to the VPC of `subnet_id` (a group of another VPC is
    /// refused as EC2 refuses it: "belong to different networks").
    pub(super) fn check_groups(
        &self,
        groups: &[String],
        subnet_id: &str,
    ) -> Result<(), StateError> {
        for g in groups {
            let Some(group) = self.security_groups.get(g) else {
                return Err(StateError::GroupNotFound(g.clone()));
            };
            if group.vpc_id != self.vpc.id {
                return Err(StateError::GroupOtherVpc {
                    group: g.clone(),
                    subnet: subnet_id.to_owned(),
                });
            }
        }
        Ok(())
    }
}
