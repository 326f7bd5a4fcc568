//! Trunk and branch ENIs: `AssociateTrunkInterface`, `DisassociateTrunkInterface`, and the
//! rules around them (a trunk only on a trunking-capable instance type, one trunk per
//! instance, VLAN ids unique per trunk, the per-type branch limit). Must not know HTTP or knobs.

use super::super::{State, StateError, TrunkAssociation};
use crate::limits;

/// EC2's VLAN id range.
pub const VLAN_IDS: std::ops::RangeInclusive<u16> = 1..=4094;

impl State {
    /// `AssociateTrunkInterface` with the VLAN protocol: `branch_eni` (an unattached,
    /// unassociated `interface`) joins `trunk_eni` (an attached `trunk`) on `vlan_id`.
    /// Returns the association id.
    pub fn associate_trunk(
        &mut self,
        branch_eni: &str,
        trunk_eni: &str,
        vlan_id: u16,
    ) -> Result<String, StateError> {
        let trunk = self.eni(trunk_eni)?;
        let branch = self.eni(branch_eni)?;
        if trunk.interface_type != "trunk" {
            return Err(StateError::InvalidParameterValue(format!(
                "network interface {trunk_eni} is not a trunk interface"
            )));
        }
        if branch.interface_type != "interface" {
            return Err(StateError::InvalidParameterValue(format!(
                "network interface {branch_eni} cannot be a branch interface"
            )));
        }
        if branch.attachment.is_some() || self.association_of(branch_eni).is_some() {
            return Err(StateError::EniInUse(branch_eni.to_owned()));
        }
        if !VLAN_IDS.contains(&vlan_id) {
            return Err(StateError::InvalidParameterValue(format!(
                "value ({vlan_id}) for parameter VlanId is invalid; expected 1..4094"
            )));
        }
        let Some(attachment) = &trunk.attachment else {
            return Err(StateError::InvalidParameterValue(format!(
                "trunk interface {trunk_eni} is not attached to an instance"
            )));
        };
        let inst = self.instance(&attachment.instance_id)?;
        let branch_az = self.subnet_az(&branch.subnet_id);
        if branch_az != inst.availability_zone {
            return Err(StateError::AvailabilityZoneMismatch {
                eni_az: branch_az.to_owned(),
                instance_az: inst.availability_zone.clone(),
            });
        }
        let on_trunk: Vec<&TrunkAssociation> = self
            .trunk_associations
            .values()
            .filter(|a| a.trunk_eni == trunk_eni)
            .collect();
        if on_trunk.iter().any(|a| a.vlan_id == vlan_id) {
            return Err(StateError::InvalidParameterValue(format!(
                "VLAN id {vlan_id} is already in use on trunk interface {trunk_eni}"
            )));
        }
        let max = limits::branch_interfaces(&inst.instance_type).unwrap_or(0);
        let count = u32::try_from(on_trunk.len()).unwrap_or(u32::MAX) + 1;
        if count > max {
            return Err(StateError::AttachmentLimitExceeded {
                count,
                instance_type: inst.instance_type.clone(),
            });
        }
        let id = self.mint("trunk-assoc");
        self.trunk_associations.insert(
            id.clone(),
            TrunkAssociation {
                id: id.clone(),
                trunk_eni: trunk_eni.to_owned(),
                branch_eni: branch_eni.to_owned(),
                vlan_id,
            },
        );
        Ok(id)
    }

    /// `DisassociateTrunkInterface`.
    pub fn disassociate_trunk(&mut self, association_id: &str) -> Result<(), StateError> {
        self.trunk_associations
            .remove(association_id)
            .map(drop)
            .ok_or_else(|| StateError::AssociationNotFound(association_id.to_owned()))
    }

    /// The association of `branch_eni`, if it is a branch.
    #[must_use]
    pub fn association_of(&self, branch_eni: &str) -> Option<&TrunkAssociation> {
        self.trunk_associations
            .values()
            .find(|a| a.branch_eni == branch_eni)
    }

    /// The branches of `trunk_eni`, in VLAN id order.
    #[must_use]
    pub fn branches_of(&self, trunk_eni: &str) -> Vec<&TrunkAssociation> {
        let mut out: Vec<&TrunkAssociation> = self
            .trunk_associations
            .values()
            .filter(|a| a.trunk_eni == trunk_eni)
            .collect();
        out.sort_by_key(|a| a.vlan_id);
        out
    }

    /// What `DescribeNetworkInterfaces` says of `InterfaceType`: `branch` for an ENI associated
    /// with a trunk, else the type it was created with.
    #[must_use]
    pub fn described_type<'a>(&self, eni: &'a super::super::Eni) -> &'a str {
        if self.association_of(&eni.id).is_some() {
            "branch"
        } else {
            &eni.interface_type
        }
    }

    /// Drops the associations naming ENIs that no longer exist (a deleted branch or trunk,
    /// a trunk deleted with its instance).
    pub(super) fn prune_associations(&mut self) {
        let enis = &self.enis;
        self.trunk_associations
            .retain(|_, a| enis.contains_key(&a.trunk_eni) && enis.contains_key(&a.branch_eni));
    }

    /// Attaching a trunk: only to a trunking-capable type, one trunk per instance; a branch
    /// is never attached.
    pub(super) fn check_trunk_attach(
        &self,
        eni_id: &str,
        instance_id: &str,
    ) -> Result<(), StateError> {
        let eni = self.eni(eni_id)?;
        if self.association_of(eni_id).is_some() {
            return Err(StateError::EniInUse(eni_id.to_owned()));
        }
        if eni.interface_type != "trunk" {
            return Ok(());
        }
        let inst = self.instance(instance_id)?;
        if limits::branch_interfaces(&inst.instance_type).is_none() {
            return Err(StateError::InvalidParameterValue(format!(
                "instance type {} does not support trunk interfaces",
                inst.instance_type
            )));
        }
        if self
            .enis_of(instance_id)
            .iter()
            .any(|e| e.interface_type == "trunk")
        {
            return Err(StateError::InvalidParameterValue(format!(
                "instance {instance_id} already has a trunk interface"
            )));
        }
        Ok(())
    }
}
