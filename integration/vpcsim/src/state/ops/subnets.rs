//! `CreateSubnet`: a subnet added to the VPC at run time (tests and the control API create
//! tagged subnets for subnet discovery), and its CIDR reservations
//! (`Create`/`DeleteSubnetCidrReservation`). Must not know HTTP or knobs.

use super::super::{CidrReservation, ReservationKind};
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
                reservations: Vec::new(),
            },
        );
        Ok(id)
    }
}

impl State {
    /// `CreateSubnetCidrReservation`: `cidr` must lie inside the subnet and overlap no other
    /// reservation; returns the reservation id.
    pub fn create_subnet_cidr_reservation(
        &mut self,
        subnet_id: &str,
        cidr: Ipv4Net,
        kind: ReservationKind,
        description: String,
    ) -> Result<String, StateError> {
        let subnet = self
            .subnets
            .get(subnet_id)
            .ok_or_else(|| StateError::SubnetNotFound(subnet_id.to_owned()))?;
        if cidr != cidr.trunc() || !subnet.cidr.contains(&cidr) {
            return Err(StateError::InvalidParameterValue(format!(
                "the CIDR {cidr} is not within the subnet {subnet_id} ({})",
                subnet.cidr
            )));
        }
        if subnet
            .reservations
            .iter()
            .any(|r| r.cidr.contains(&cidr) || cidr.contains(&r.cidr))
        {
            return Err(StateError::InvalidParameterValue(format!(
                "the CIDR {cidr} overlaps an existing reservation of {subnet_id}"
            )));
        }
        let id = self.mint("scr");
        if let Some(subnet) = self.subnets.get_mut(subnet_id) {
            subnet.reservations.push(CidrReservation {
                id: id.clone(),
                cidr,
                kind,
                description,
            });
        }
        Ok(id)
    }

    /// `DeleteSubnetCidrReservation`: returns the removed reservation and its subnet.
    pub fn delete_subnet_cidr_reservation(
        &mut self,
        id: &str,
    ) -> Result<(String, CidrReservation), StateError> {
        for subnet in self.subnets.values_mut() {
            if let Some(i) = subnet.reservations.iter().position(|r| r.id == id) {
                return Ok((subnet.id.clone(), subnet.reservations.remove(i)));
            }
        }
        Err(StateError::InvalidParameterValue(format!(
            "the subnet CIDR reservation {id} does not exist"
        )))
    }
}
