//! ENI lifecycle: create, attach, detach, delete, modify attributes. Must not know HTTP or knobs.

use super::super::{Attachment, Eni, InstanceState, Now, State, StateError};
use super::{AssignIpv4, AssignIpv6, CreateEni, ModifyEni, check_eni_id};
use crate::limits;
use std::collections::BTreeMap;

impl State {
    /// `CreateNetworkInterface`: a new, unattached ENI with its addresses.
    pub fn create_eni(&mut self, req: CreateEni) -> Result<String, StateError> {
        if req.subnet_id.is_empty() {
            return Err(StateError::MissingParameter("SubnetId".into()));
        }
        if !self.subnets.contains_key(&req.subnet_id) {
            return Err(StateError::SubnetNotFound(req.subnet_id.clone()));
        }
        let groups = if req.groups.is_empty() {
            self.default_group()
                .map(|g| vec![g.id.clone()])
                .unwrap_or_default()
        } else {
            req.groups.clone()
        };
        self.check_groups(&groups, &req.subnet_id)?;
        if let Some(c) = &req.conntrack {
            c.validate()?;
        }
        let interface_type = match req.interface_type.as_str() {
            "" | "interface" => "interface",
            "trunk" => "trunk",
            other => {
                return Err(StateError::InvalidParameterValue(format!(
                    "value ({other}) for parameter InterfaceType is invalid; expected trunk, efa or interface (efa is not simulated)"
                )));
            }
        };
        if (req.ipv4_prefix_count > 0 || !req.ipv4_prefixes.is_empty())
            && (req.secondary_count > 0 || !req.secondary_ips.is_empty())
        {
            return Err(StateError::InvalidParameterCombination(
                "secondary private ip addresses and ipv4 prefixes cannot be combined".into(),
            ));
        }
        // The primary address comes first, then the secondaries and prefixes.
        let primary_req = AssignIpv4 {
            count: u32::from(req.primary_ip.is_none()),
            addresses: req.primary_ip.into_iter().collect(),
            ..AssignIpv4::default()
        };
        let (primary, _, _) = self.plan_ipv4(&req.subnet_id, None, &primary_req, 0, usize::MAX)?;
        let mut probe = self.clone();
        let placeholder = Eni {
            id: "eni-pending".into(),
            subnet_id: req.subnet_id.clone(),
            description: String::new(),
            mac: String::new(),
            groups: Vec::new(),
            tags: BTreeMap::new(),
            private_ips: primary.clone(),
            ipv4_prefixes: Vec::new(),
            ipv6_addresses: Vec::new(),
            ipv6_prefixes: Vec::new(),
            source_dest_check: true,
            attachment: None,
            conntrack: None,
            created_at: None,
            interface_type: String::new(),
        };
        probe.enis.insert(placeholder.id.clone(), placeholder);
        let limit = limits::max_ipv4_per_eni() as usize;
        let secondary_req = AssignIpv4 {
            count: req.secondary_count,
            addresses: req.secondary_ips.clone(),
            prefix_count: req.ipv4_prefix_count,
            prefixes: req.ipv4_prefixes.clone(),
            allow_reassignment: false,
        };
        let (secondaries, prefixes, _) = probe.plan_ipv4(
            &req.subnet_id,
            Some("eni-pending"),
            &secondary_req,
            1,
            limit,
        )?;
        let v6_req = AssignIpv6 {
            count: req.ipv6_count,
            prefix_count: req.ipv6_prefix_count,
            ..AssignIpv6::default()
        };
        let (v6, v6_prefixes) = if req.ipv6_count + req.ipv6_prefix_count > 0 {
            self.plan_ipv6(&req.subnet_id, &v6_req, 0, limit)?
        } else {
            (Vec::new(), Vec::new())
        };
        let id = self.mint("eni");
        let mac = self.mint_mac();
        let mut private_ips = primary;
        private_ips.extend(secondaries);
        self.enis.insert(
            id.clone(),
            Eni {
                id: id.clone(),
                subnet_id: req.subnet_id,
                description: req.description,
                mac,
                groups,
                tags: req.tags,
                private_ips,
                ipv4_prefixes: prefixes,
                ipv6_addresses: v6,
                ipv6_prefixes: v6_prefixes,
                source_dest_check: true,
                attachment: None,
                conntrack: req.conntrack,
                created_at: None,
                interface_type: interface_type.to_owned(),
            },
        );
        Ok(id)
    }

    /// `AttachNetworkInterface` on network card 0: returns the attachment id.
    pub fn attach_eni(
        &mut self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        now: Now,
    ) -> Result<String, StateError> {
        self.attach_eni_on_card(eni_id, instance_id, device_index, 0, now)
    }

    /// `AttachNetworkInterface` with `NetworkCardIndex`: the card must exist on the instance
    /// type, the device index is free on that card (EC2 counts device indexes per card) and
    /// the card has room for one more ENI (each card's `MaximumNetworkInterfaces`).
    pub fn attach_eni_on_card(
        &mut self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        network_card: u32,
        now: Now,
    ) -> Result<String, StateError> {
        check_eni_id(eni_id)?;
        let eni = self.eni(eni_id)?;
        let inst = self.instance(instance_id)?;
        if inst.state != InstanceState::Running {
            return Err(StateError::IncorrectInstanceState(instance_id.to_owned()));
        }
        if eni.attachment.is_some() {
            return Err(StateError::EniInUse(eni_id.to_owned()));
        }
        self.check_trunk_attach(eni_id, instance_id)?;
        let eni_az = self.subnet_az(&eni.subnet_id);
        if eni_az != inst.availability_zone {
            return Err(StateError::AvailabilityZoneMismatch {
                eni_az: eni_az.to_owned(),
                instance_az: inst.availability_zone.clone(),
            });
        }
        let lim = self.limits_of(inst);
        if network_card >= lim.network_cards {
            return Err(StateError::InvalidParameterValue(format!(
                "network card index {network_card} is out of range for instance type {} ({} network cards)",
                lim.instance_type, lim.network_cards
            )));
        }
        let attached: Vec<&Eni> = self
            .enis_of(instance_id)
            .into_iter()
            .filter(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.network_card_index == network_card)
            })
            .collect();
        if attached.iter().any(|e| {
            e.attachment
                .as_ref()
                .is_some_and(|a| a.device_index == device_index)
        }) {
            return Err(StateError::InvalidParameterValue(format!(
                "instance '{instance_id}' already has an interface attached at device index '{device_index}' of network card '{network_card}'"
            )));
        }
        let count = u32::try_from(attached.len()).unwrap_or(u32::MAX) + 1;
        if count > lim.max_enis {
            return Err(StateError::AttachmentLimitExceeded {
                count,
                instance_type: inst.instance_type.clone(),
            });
        }
        if eni.ipv4_slots() > lim.ipv4_per_eni as usize
            || eni.ipv6_slots() > lim.ipv6_per_eni as usize
        {
            return Err(StateError::PrivateIpAddressLimitExceeded);
        }
        if (!eni.ipv4_prefixes.is_empty() || !eni.ipv6_prefixes.is_empty())
            && !lim.supports_prefixes()
        {
            return Err(StateError::InvalidParameterValue(format!(
                "instance type {} does not support prefix delegation",
                lim.instance_type
            )));
        }
        let attachment_id = self.mint("eni-attach");
        let eni = self.eni_mut(eni_id)?;
        eni.attachment = Some(Attachment {
            id: attachment_id.clone(),
            instance_id: instance_id.to_owned(),
            device_index,
            network_card_index: network_card,
            delete_on_termination: false,
            attach_time: now.wall,
            attached_at: Some(now.instant),
        });
        Ok(attachment_id)
    }

    pub(super) fn eni_by_attachment(&self, attachment_id: &str) -> Result<&Eni, StateError> {
        self.enis
            .values()
            .find(|e| e.attachment.as_ref().is_some_and(|a| a.id == attachment_id))
            .ok_or_else(|| StateError::AttachmentNotFound(attachment_id.to_owned()))
    }

    /// `DetachNetworkInterface`. The primary ENI (device index 0 of network card 0) cannot be
    /// detached.
    pub fn detach_eni(&mut self, attachment_id: &str) -> Result<(), StateError> {
        let eni = self.eni_by_attachment(attachment_id)?;
        if eni
            .attachment
            .as_ref()
            .is_some_and(|a| a.device_index == 0 && a.network_card_index == 0)
        {
            return Err(StateError::OperationNotPermitted(format!(
                "the network interface at device index 0 cannot be detached ({})",
                eni.id
            )));
        }
        let id = eni.id.clone();
        self.eni_mut(&id)?.attachment = None;
        Ok(())
    }

    /// `DeleteNetworkInterface`: only unattached ENIs.
    pub fn delete_eni(&mut self, eni_id: &str) -> Result<(), StateError> {
        let eni = self.eni_mut(eni_id)?;
        if eni.attachment.is_some() {
            return Err(StateError::EniInUse(eni_id.to_owned()));
        }
        self.enis.remove(eni_id);
        // A deleted branch (or trunk) leaves its associations (EC2 removes them with it).
        self.prune_associations();
        Ok(())
    }

    /// `ModifyNetworkInterfaceAttribute`.
    pub fn modify_eni(&mut self, eni_id: &str, req: ModifyEni) -> Result<(), StateError> {
        let set = usize::from(req.delete_on_termination.is_some())
            + usize::from(req.groups.is_some())
            + usize::from(req.description.is_some())
            + usize::from(req.source_dest_check.is_some())
            + usize::from(req.conntrack.is_some());
        if set == 0 {
            return Err(StateError::MissingParameter(
                "an attribute to modify".into(),
            ));
        }
        if set > 1 {
            return Err(StateError::InvalidParameterCombination(
                "only one attribute can be modified at a time".into(),
            ));
        }
        if let Some(groups) = &req.groups {
            let subnet = self.eni(eni_id)?.subnet_id.clone();
            self.check_groups(groups, &subnet)?;
        }
        if let Some(c) = &req.conntrack {
            c.validate()?;
        }
        let eni = self.eni_mut(eni_id)?;
        if let Some((attachment_id, flag)) = req.delete_on_termination {
            match eni.attachment.as_mut() {
                Some(a) if a.id == attachment_id => a.delete_on_termination = flag,
                _ => return Err(StateError::AttachmentNotFound(attachment_id)),
            }
        }
        if let Some(groups) = req.groups {
            eni.groups = groups;
        }
        if let Some(d) = req.description {
            eni.description = d;
        }
        if let Some(c) = req.source_dest_check {
            eni.source_dest_check = c;
        }
        if let Some(c) = req.conntrack {
            eni.conntrack = Some(eni.conntrack.unwrap_or_default().merged(c));
        }
        Ok(())
    }
}
