//! `CreateSubnet`: a subnet added to the VPC at run time (tests and the control API create
//! tagged subnets for subnet discovery). Must not know HTTP or knobs.

use super::super::{State, StateError, Subnet};
use ipnet::Ipv4Net;
use std::collections::BTreeMap;

/// `CreateSubnet` input.
#[derive(Debug, Clone, Default)]
pub struct CreateSubnet {
    /// `VpcId` (required; the one VPC).
    pub vpc_id: String,
    /// `CidrBlock` (/16 to /28, inside a VPC block, overlapping no subnet).
    pub cidr: Option<Ipv4Net>,
    /// `AvailabilityZone` (default: the world's zone).
    pub availability_zone: Option<String>,
    /// Tags from `TagSpecification` with resource type `subnet`.
    pub tags: BTreeMap<String, String>,
}

impl State {
    /// `CreateSubnet`: validates everything, then adds the subnet; returns its id.
    pub fn create_subnet(&mut self, req: CreateSubnet) -> Result<String, StateError> {
        if req.vpc_id.is_empty() {
            return Err(StateError::MissingParameter("VpcId".into()));
        }
        if req.vpc_id != self.vpc.id {
            return Err(StateError::VpcNotFound(req.vpc_id));
        }
        let cidr = req
            .cidr
            .ok_or_else(|| StateError::MissingParameter("CidrBlock".into()))?;
        if cidr != cidr.trunc()
            || !(16..=28).contains(&cidr.prefix_len())
            || !self.vpc.cidr_blocks().iter().any(|b| b.contains(&cidr))
        {
            return Err(StateError::SubnetRange(cidr.to_string()));
        }
        if self
            .subnets
            .values()
            .any(|s| s.cidr.contains(&cidr) || cidr.contains(&s.cidr))
        {
            return Err(StateError::SubnetConflict(cidr.to_string()));
        }
        let id = self.mint("subnet");
        let availability_zone = req
            .availability_zone
            .unwrap_or_else(|| self.availability_zone.clone());
        self.subnets.insert(
            id.clone(),
            Subnet {
                id: id.clone(),
                cidr,
                ipv6_cidr: None,
                availability_zone,
                tags: req.tags,
            },
        );
        Ok(id)
    }
}
