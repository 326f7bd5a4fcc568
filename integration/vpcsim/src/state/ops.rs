//! Mutating operations on `State`, each validating everything before changing anything, so a
//! refused request leaves the state untouched. Must not know HTTP or knobs.

use super::addressing::{self, IPV4_PREFIX_LEN, IPV6_PREFIX_LEN};
use super::{Attachment, Eni, Instance, InstanceState, Now, State, StateError};
use crate::limits;
use ipnet::{Ipv4Net, Ipv6Net};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

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

/// New addresses, new prefixes, and addresses taken over from other ENIs.
type Ipv4Plan = (Vec<Ipv4Addr>, Vec<Ipv4Net>, Vec<(String, Ipv4Addr)>);

fn check_eni_id(id: &str) -> Result<(), StateError> {
    if id.starts_with("eni-") && id.len() > 4 {
        Ok(())
    } else {
        Err(StateError::EniIdMalformed(id.to_owned()))
    }
}

impl State {
    fn eni_mut(&mut self, id: &str) -> Result<&mut Eni, StateError> {
        check_eni_id(id)?;
        self.enis
            .get_mut(id)
            .ok_or_else(|| StateError::EniNotFound(id.to_owned()))
    }

    /// Every group exists and belongs to the VPC of `subnet_id` (a group of another VPC is
    /// refused as EC2 refuses it: "belong to different networks").
    fn check_groups(&self, groups: &[String], subnet_id: &str) -> Result<(), StateError> {
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

    /// IPv4 slot limit for an ENI: its instance type's when attached, else the largest any type has.
    fn ipv4_limit(&self, eni: &Eni) -> usize {
        match eni
            .attachment
            .as_ref()
            .and_then(|a| self.instances.get(&a.instance_id))
        {
            Some(inst) => self.limits_of(inst).ipv4_per_eni as usize,
            None => limits::max_ipv4_per_eni() as usize,
        }
    }

    fn ipv6_limit(&self, eni: &Eni) -> usize {
        match eni
            .attachment
            .as_ref()
            .and_then(|a| self.instances.get(&a.instance_id))
        {
            Some(inst) => self.limits_of(inst).ipv6_per_eni as usize,
            None => limits::max_ipv4_per_eni() as usize,
        }
    }

    /// Picks the new IPv4 addresses and prefixes for `eni` (or a new ENI in `subnet_id`) without
    /// changing anything; also returns `(other ENI, address)` pairs moved by reassignment.
    fn plan_ipv4(
        &self,
        subnet_id: &str,
        owner: Option<&str>,
        req: &AssignIpv4,
        current_slots: usize,
        limit: usize,
    ) -> Result<Ipv4Plan, StateError> {
        let subnet = self
            .subnets
            .get(subnet_id)
            .ok_or_else(|| StateError::SubnetNotFound(subnet_id.to_owned()))?;
        let cidr = subnet.cidr;
        let new_slots = req.addresses.len()
            + req.count as usize
            + req.prefixes.len()
            + req.prefix_count as usize;
        if current_slots + new_slots > limit {
            return Err(StateError::PrivateIpAddressLimitExceeded);
        }
        let mut used = self.used_ipv4(subnet_id);
        let mut moved = Vec::new();
        for ip in &req.addresses {
            self.check_in_subnet(cidr, *ip)?;
            match self.ipv4_owner(*ip) {
                Some(other) if Some(other) == owner => {
                    return Err(StateError::InvalidParameterValue(format!(
                        "address {ip} is already assigned to {other}"
                    )));
                }
                Some(other) => {
                    let other_eni = &self.enis[other];
                    if !req.allow_reassignment
                        || other_eni.primary_ip() == *ip
                        || other_eni.ipv4_prefixes.iter().any(|p| p.contains(ip))
                    {
                        return Err(StateError::AddressInUse(ip.to_string()));
                    }
                    moved.push((other.to_owned(), *ip));
                }
                None => {}
            }
            if !used.insert(u32::from(*ip)) && !moved.iter().any(|(_, m)| m == ip) {
                return Err(StateError::InvalidParameterValue(format!(
                    "address {ip} is listed twice"
                )));
            }
        }
        for p in &req.prefixes {
            if p.prefix_len() != IPV4_PREFIX_LEN || !cidr.contains(p) || p.network() != p.addr() {
                return Err(StateError::InvalidParameterValue(format!(
                    "prefix {p} is not a /28 of the subnet"
                )));
            }
            if !addressing::block_free(cidr, *p, &used) {
                return Err(StateError::InvalidParameterValue(format!(
                    "prefix {p} overlaps assigned addresses"
                )));
            }
            used.extend(u32::from(p.network())..=u32::from(p.broadcast()));
        }
        let mut addresses = req.addresses.clone();
        if req.count > 0 {
            let picked = match &self.rng {
                Some(rng) => addressing::alloc_ipv4_random(cidr, &used, req.count as usize, rng),
                None => addressing::alloc_ipv4(cidr, &used, req.count as usize),
            }
            .ok_or_else(|| StateError::InsufficientFreeAddresses(subnet_id.to_owned()))?;
            used.extend(picked.iter().map(|ip| u32::from(*ip)));
            addresses.extend(picked);
        }
        let mut prefixes = req.prefixes.clone();
        if req.prefix_count > 0 {
            let picked = addressing::alloc_ipv4_prefixes(cidr, &used, req.prefix_count as usize)
                .ok_or(StateError::InsufficientCidrBlocks)?;
            prefixes.extend(picked);
        }
        Ok((addresses, prefixes, moved))
    }

    fn plan_ipv6(
        &self,
        subnet_id: &str,
        req: &AssignIpv6,
        current: usize,
        limit: usize,
    ) -> Result<(Vec<Ipv6Addr>, Vec<Ipv6Net>), StateError> {
        let subnet = self
            .subnets
            .get(subnet_id)
            .ok_or_else(|| StateError::SubnetNotFound(subnet_id.to_owned()))?;
        let Some(cidr) = subnet.ipv6_cidr else {
            return Err(StateError::InvalidParameterValue(format!(
                "subnet {subnet_id} has no ipv6 cidr block"
            )));
        };
        let new = req.addresses.len()
            + req.count as usize
            + req.prefixes.len()
            + req.prefix_count as usize;
        if current + new > limit {
            return Err(StateError::PrivateIpAddressLimitExceeded);
        }
        let mut used = self.used_ipv6(subnet_id);
        let owned_by_prefix = |ip: &Ipv6Addr| {
            self.enis
                .values()
                .any(|e| e.ipv6_prefixes.iter().any(|p| p.contains(ip)))
        };
        for ip in &req.addresses {
            if !cidr.contains(ip) {
                return Err(StateError::InvalidParameterValue(format!(
                    "address {ip} does not fall within the subnet's address range"
                )));
            }
            if !used.insert(u128::from(*ip)) || owned_by_prefix(ip) {
                return Err(StateError::AddressInUse(ip.to_string()));
            }
        }
        for p in &req.prefixes {
            if p.prefix_len() != IPV6_PREFIX_LEN || !cidr.contains(p) || p.network() != p.addr() {
                return Err(StateError::InvalidParameterValue(format!(
                    "prefix {p} is not a /80 of the subnet"
                )));
            }
            let (lo, hi) = (u128::from(p.network()), u128::from(p.broadcast()));
            if used.range(lo..=hi).next().is_some() {
                return Err(StateError::InvalidParameterValue(format!(
                    "prefix {p} overlaps assigned addresses"
                )));
            }
            used.insert(lo);
            used.insert(hi);
        }
        let mut addresses = req.addresses.clone();
        if req.count > 0 {
            let picked = addressing::alloc_ipv6(cidr, &used, req.count as usize)
                .ok_or_else(|| StateError::InsufficientFreeAddresses(subnet_id.to_owned()))?;
            used.extend(picked.iter().map(|ip| u128::from(*ip)));
            addresses.extend(picked);
        }
        let mut prefixes = req.prefixes.clone();
        if req.prefix_count > 0 {
            prefixes.extend(
                addressing::alloc_ipv6_prefixes(cidr, &used, req.prefix_count as usize)
                    .ok_or(StateError::InsufficientCidrBlocks)?,
            );
        }
        Ok((addresses, prefixes))
    }

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
            created_at: None,
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
                created_at: None,
            },
        );
        Ok(id)
    }

    /// `AttachNetworkInterface`: returns the attachment id.
    pub fn attach_eni(
        &mut self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
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
        let eni_az = self.subnet_az(&eni.subnet_id);
        if eni_az != inst.availability_zone {
            return Err(StateError::AvailabilityZoneMismatch {
                eni_az: eni_az.to_owned(),
                instance_az: inst.availability_zone.clone(),
            });
        }
        let lim = self.limits_of(inst);
        let attached = self.enis_of(instance_id);
        if attached.iter().any(|e| {
            e.attachment
                .as_ref()
                .is_some_and(|a| a.device_index == device_index)
        }) {
            return Err(StateError::InvalidParameterValue(format!(
                "instance '{instance_id}' already has an interface attached at device index '{device_index}'"
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
            delete_on_termination: false,
            attach_time: now.wall,
            attached_at: Some(now.instant),
        });
        Ok(attachment_id)
    }

    fn eni_by_attachment(&self, attachment_id: &str) -> Result<&Eni, StateError> {
        self.enis
            .values()
            .find(|e| e.attachment.as_ref().is_some_and(|a| a.id == attachment_id))
            .ok_or_else(|| StateError::AttachmentNotFound(attachment_id.to_owned()))
    }

    /// `DetachNetworkInterface`. The primary ENI (device index 0) cannot be detached.
    pub fn detach_eni(&mut self, attachment_id: &str) -> Result<(), StateError> {
        let eni = self.eni_by_attachment(attachment_id)?;
        if eni.attachment.as_ref().is_some_and(|a| a.device_index == 0) {
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
        Ok(())
    }

    /// `ModifyNetworkInterfaceAttribute`.
    pub fn modify_eni(&mut self, eni_id: &str, req: ModifyEni) -> Result<(), StateError> {
        let set = usize::from(req.delete_on_termination.is_some())
            + usize::from(req.groups.is_some())
            + usize::from(req.description.is_some())
            + usize::from(req.source_dest_check.is_some());
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
        Ok(())
    }

    /// `AssignPrivateIpAddresses`: returns the newly assigned addresses and prefixes only.
    pub fn assign_ipv4(
        &mut self,
        eni_id: &str,
        req: AssignIpv4,
    ) -> Result<(Vec<Ipv4Addr>, Vec<Ipv4Net>), StateError> {
        let eni = self.eni_mut(eni_id)?.clone();
        let wants_ips = req.count > 0 || !req.addresses.is_empty();
        let wants_prefixes = req.prefix_count > 0 || !req.prefixes.is_empty();
        if wants_ips && wants_prefixes {
            return Err(StateError::InvalidParameterCombination(
                "addresses and ipv4 prefixes cannot be assigned together".into(),
            ));
        }
        if !wants_ips && !wants_prefixes {
            return Err(StateError::MissingParameter(
                "SecondaryPrivateIpAddressCount, PrivateIpAddress or Ipv4PrefixCount".into(),
            ));
        }
        if wants_prefixes
            && let Some(inst) = eni
                .attachment
                .as_ref()
                .and_then(|a| self.instances.get(&a.instance_id))
        {
            {
                let lim = self.limits_of(inst);
                if !lim.supports_prefixes() {
                    return Err(StateError::InvalidParameterValue(format!(
                        "instance type {} does not support prefix delegation",
                        lim.instance_type
                    )));
                }
            }
        }
        let limit = self.ipv4_limit(&eni);
        let (addresses, prefixes, moved) =
            self.plan_ipv4(&eni.subnet_id, Some(eni_id), &req, eni.ipv4_slots(), limit)?;
        for (other, ip) in moved {
            if let Some(o) = self.enis.get_mut(&other) {
                o.private_ips.retain(|x| *x != ip);
            }
        }
        let eni = self.eni_mut(eni_id)?;
        eni.private_ips.extend(addresses.iter().copied());
        eni.ipv4_prefixes.extend(prefixes.iter().copied());
        Ok((addresses, prefixes))
    }

    /// `UnassignPrivateIpAddresses`: every listed address/prefix must be on the ENI; the
    /// primary address cannot be removed.
    pub fn unassign_ipv4(
        &mut self,
        eni_id: &str,
        addresses: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> Result<(), StateError> {
        let eni = self.eni_mut(eni_id)?;
        if addresses.is_empty() && prefixes.is_empty() {
            return Err(StateError::MissingParameter(
                "PrivateIpAddress or Ipv4Prefix".into(),
            ));
        }
        if addresses.contains(&eni.primary_ip()) {
            return Err(StateError::InvalidParameterValue(format!(
                "the primary private ip address {} cannot be unassigned",
                eni.primary_ip()
            )));
        }
        if let Some(ip) = addresses.iter().find(|ip| !eni.private_ips.contains(ip)) {
            return Err(StateError::InvalidParameterValue(format!(
                "some of the specified addresses are not assigned to interface {eni_id}: {ip}"
            )));
        }
        if let Some(p) = prefixes.iter().find(|p| !eni.ipv4_prefixes.contains(p)) {
            return Err(StateError::InvalidParameterValue(format!(
                "some of the specified prefixes are not assigned to interface {eni_id}: {p}"
            )));
        }
        eni.private_ips.retain(|ip| !addresses.contains(ip));
        eni.ipv4_prefixes.retain(|p| !prefixes.contains(p));
        Ok(())
    }

    /// `AssignIpv6Addresses`: returns the new addresses and prefixes.
    pub fn assign_ipv6(
        &mut self,
        eni_id: &str,
        req: AssignIpv6,
    ) -> Result<(Vec<Ipv6Addr>, Vec<Ipv6Net>), StateError> {
        let eni = self.eni_mut(eni_id)?.clone();
        let wants_ips = req.count > 0 || !req.addresses.is_empty();
        let wants_prefixes = req.prefix_count > 0 || !req.prefixes.is_empty();
        if wants_ips && wants_prefixes {
            return Err(StateError::InvalidParameterCombination(
                "ipv6 addresses and prefixes cannot be assigned together".into(),
            ));
        }
        if !wants_ips && !wants_prefixes {
            return Err(StateError::MissingParameter(
                "Ipv6AddressCount, Ipv6Addresses or Ipv6PrefixCount".into(),
            ));
        }
        let limit = self.ipv6_limit(&eni);
        let (a, p) = self.plan_ipv6(&eni.subnet_id, &req, eni.ipv6_slots(), limit)?;
        let eni = self.eni_mut(eni_id)?;
        eni.ipv6_addresses.extend(a.iter().copied());
        eni.ipv6_prefixes.extend(p.iter().copied());
        Ok((a, p))
    }

    /// `UnassignIpv6Addresses`: returns what was removed.
    pub fn unassign_ipv6(
        &mut self,
        eni_id: &str,
        addresses: &[Ipv6Addr],
        prefixes: &[Ipv6Net],
    ) -> Result<(), StateError> {
        let eni = self.eni_mut(eni_id)?;
        if addresses.is_empty() && prefixes.is_empty() {
            return Err(StateError::MissingParameter(
                "Ipv6Addresses or Ipv6Prefix".into(),
            ));
        }
        if let Some(ip) = addresses.iter().find(|ip| !eni.ipv6_addresses.contains(ip)) {
            return Err(StateError::InvalidParameterValue(format!(
                "address {ip} is not assigned to interface {eni_id}"
            )));
        }
        if let Some(p) = prefixes.iter().find(|p| !eni.ipv6_prefixes.contains(p)) {
            return Err(StateError::InvalidParameterValue(format!(
                "prefix {p} is not assigned to interface {eni_id}"
            )));
        }
        eni.ipv6_addresses.retain(|ip| !addresses.contains(ip));
        eni.ipv6_prefixes.retain(|p| !prefixes.contains(p));
        Ok(())
    }

    fn tags_mut(&mut self, resource: &str) -> Result<&mut BTreeMap<String, String>, StateError> {
        let not_found = || {
            StateError::InvalidParameterValue(format!(
                "the resource id '{resource}' does not exist"
            ))
        };
        if resource.starts_with("eni-") {
            return Ok(&mut self.eni_mut(resource)?.tags);
        }
        if resource.starts_with("i-") {
            return self
                .instances
                .get_mut(resource)
                .map(|i| &mut i.tags)
                .ok_or_else(|| StateError::InstanceNotFound(resource.to_owned()));
        }
        if resource.starts_with("subnet-") {
            return self
                .subnets
                .get_mut(resource)
                .map(|s| &mut s.tags)
                .ok_or_else(|| StateError::SubnetNotFound(resource.to_owned()));
        }
        if resource.starts_with("sg-") {
            return self
                .security_groups
                .get_mut(resource)
                .map(|s| &mut s.tags)
                .ok_or_else(|| StateError::GroupNotFound(resource.to_owned()));
        }
        Err(not_found())
    }

    /// `CreateTags`: all resources must exist; then tags are set on each.
    pub fn create_tags(
        &mut self,
        resources: &[String],
        tags: &BTreeMap<String, String>,
    ) -> Result<(), StateError> {
        for r in resources {
            self.tags_mut(r)?;
        }
        for r in resources {
            self.tags_mut(r)?
                .extend(tags.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        Ok(())
    }

    /// `DeleteTags`: a tag with a value is removed only if the value matches.
    pub fn delete_tags(
        &mut self,
        resources: &[String],
        tags: &[(String, Option<String>)],
    ) -> Result<(), StateError> {
        for r in resources {
            self.tags_mut(r)?;
        }
        for r in resources {
            let map = self.tags_mut(r)?;
            for (k, v) in tags {
                if v.as_ref().is_none_or(|v| map.get(k) == Some(v)) {
                    map.remove(k);
                }
            }
        }
        Ok(())
    }

    /// `RunInstances`: instances with a primary ENI at device index 0 (deleted on termination).
    pub fn run_instances(
        &mut self,
        req: RunInstances,
        now: Now,
    ) -> Result<Vec<String>, StateError> {
        if limits::lookup(&req.instance_type).is_none() {
            return Err(StateError::InvalidParameterValue(format!(
                "invalid value '{}' for InstanceType",
                req.instance_type
            )));
        }
        if req.count == 0 {
            return Err(StateError::InvalidParameterValue(
                "MinCount and MaxCount must be at least 1".into(),
            ));
        }
        let subnet_id = match req.subnet_id {
            Some(s) => s,
            None => self
                .default_subnet()
                .map(|s| s.id.clone())
                .ok_or_else(|| StateError::MissingParameter("SubnetId".into()))?,
        };
        // Validate on a copy, so a failure midway leaves no half-launched instances.
        let mut next = self.clone();
        let mut ids = Vec::new();
        for _ in 0..req.count {
            let eni_id = next.create_eni(CreateEni {
                subnet_id: subnet_id.clone(),
                groups: req.groups.clone(),
                ..CreateEni::default()
            })?;
            let id = next.mint("i");
            next.instances.insert(
                id.clone(),
                Instance {
                    id: id.clone(),
                    instance_type: req.instance_type.clone(),
                    subnet_id: subnet_id.clone(),
                    availability_zone: next.subnet_az(&subnet_id).to_owned(),
                    state: InstanceState::Running,
                    launch_time: now.wall,
                    primary_eni: eni_id.clone(),
                    tags: req.tags.clone(),
                },
            );
            next.attach_eni(&eni_id, &id, 0, now)?;
            if let Some(a) = next
                .enis
                .get_mut(&eni_id)
                .and_then(|e| e.attachment.as_mut())
            {
                a.delete_on_termination = true;
            }
            ids.push(id);
        }
        *self = next;
        Ok(ids)
    }

    /// `TerminateInstances`: ENIs are detached; those with DeleteOnTermination are deleted.
    pub fn terminate_instances(
        &mut self,
        ids: &[String],
    ) -> Result<Vec<TerminatedInstance>, StateError> {
        for id in ids {
            self.instance(id)?;
        }
        let mut out = Vec::new();
        for id in ids {
            let previous = self.instances[id].state;
            let attached: Vec<(String, bool)> = self
                .enis_of(id)
                .iter()
                .map(|e| {
                    (
                        e.id.clone(),
                        e.attachment
                            .as_ref()
                            .is_some_and(|a| a.delete_on_termination),
                    )
                })
                .collect();
            for (eni_id, delete) in attached {
                if delete {
                    self.enis.remove(&eni_id);
                } else if let Some(e) = self.enis.get_mut(&eni_id) {
                    e.attachment = None;
                }
            }
            if let Some(inst) = self.instances.get_mut(id) {
                inst.state = InstanceState::Terminated;
            }
            out.push(TerminatedInstance {
                instance_id: id.clone(),
                previous,
                current: InstanceState::Terminated,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorldConfig;
    use std::time::Instant;
    use time::OffsetDateTime;

    fn now() -> Now {
        Now {
            instant: Instant::now(),
            wall: OffsetDateTime::UNIX_EPOCH,
        }
    }

    fn world(instance_type: &str) -> (State, String, String) {
        let mut s = State::new(&WorldConfig::default());
        let ids = s
            .run_instances(
                RunInstances {
                    instance_type: instance_type.into(),
                    count: 1,
                    ..RunInstances::default()
                },
                now(),
            )
            .unwrap();
        let subnet = s.default_subnet().unwrap().id.clone();
        (s, ids[0].clone(), subnet)
    }

    #[test]
    fn eni_limit_per_instance_type() {
        let (mut s, inst, subnet) = world("t3.medium");
        for idx in 1..3 {
            let eni = s
                .create_eni(CreateEni {
                    subnet_id: subnet.clone(),
                    ..CreateEni::default()
                })
                .unwrap();
            s.attach_eni(&eni, &inst, idx, now()).unwrap();
        }
        let eni = s
            .create_eni(CreateEni {
                subnet_id: subnet.clone(),
                ..CreateEni::default()
            })
            .unwrap();
        let err = s.attach_eni(&eni, &inst, 3, now()).unwrap_err();
        assert!(
            matches!(err, StateError::AttachmentLimitExceeded { count: 4, .. }),
            "{err:?}"
        );
    }

    #[test]
    fn ip_limit_counts_primary_and_prefixes() {
        let (mut s, inst, _) = world("m5.large");
        let primary = s.instances[&inst].primary_eni.clone();
        s.assign_ipv4(
            &primary,
            AssignIpv4 {
                count: 9,
                ..AssignIpv4::default()
            },
        )
        .unwrap();
        let err = s
            .assign_ipv4(
                &primary,
                AssignIpv4 {
                    count: 1,
                    ..AssignIpv4::default()
                },
            )
            .unwrap_err();
        assert_eq!(err, StateError::PrivateIpAddressLimitExceeded);
        // unchanged after the refusal
        assert_eq!(s.enis[&primary].private_ips.len(), 10);
    }

    #[test]
    fn duplicate_device_index_refused_and_primary_protected() {
        let (mut s, inst, subnet) = world("m5.large");
        let eni = s
            .create_eni(CreateEni {
                subnet_id: subnet.clone(),
                ..CreateEni::default()
            })
            .unwrap();
        assert!(matches!(
            s.attach_eni(&eni, &inst, 0, now()),
            Err(StateError::InvalidParameterValue(_))
        ));
        let primary = s.instances[&inst].primary_eni.clone();
        let attach = s.enis[&primary].attachment.clone().unwrap().id;
        assert!(matches!(
            s.detach_eni(&attach),
            Err(StateError::OperationNotPermitted(_))
        ));
        assert!(matches!(
            s.delete_eni(&primary),
            Err(StateError::EniInUse(_))
        ));
        let ip = s.enis[&primary].primary_ip();
        assert!(matches!(
            s.unassign_ipv4(&primary, &[ip], &[]),
            Err(StateError::InvalidParameterValue(_))
        ));
    }

    #[test]
    fn addresses_unique_across_enis_and_reassignment() {
        let (mut s, _inst, subnet) = world("m5.large");
        let a = s
            .create_eni(CreateEni {
                subnet_id: subnet.clone(),
                secondary_count: 3,
                ..CreateEni::default()
            })
            .unwrap();
        let b = s
            .create_eni(CreateEni {
                subnet_id: subnet.clone(),
                secondary_count: 3,
                ..CreateEni::default()
            })
            .unwrap();
        let mut all: Vec<Ipv4Addr> = s
            .enis
            .values()
            .flat_map(|e| e.private_ips.clone())
            .collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
        let taken = s.enis[&a].private_ips[1];
        let req = AssignIpv4 {
            addresses: vec![taken],
            ..AssignIpv4::default()
        };
        assert!(matches!(
            s.assign_ipv4(&b, req.clone()),
            Err(StateError::AddressInUse(_))
        ));
        s.assign_ipv4(
            &b,
            AssignIpv4 {
                allow_reassignment: true,
                ..req
            },
        )
        .unwrap();
        assert!(!s.enis[&a].private_ips.contains(&taken));
        assert!(s.enis[&b].private_ips.contains(&taken));
    }

    #[test]
    fn terminate_deletes_primary_and_frees_others() {
        let (mut s, inst, subnet) = world("m5.large");
        let eni = s
            .create_eni(CreateEni {
                subnet_id: subnet.clone(),
                ..CreateEni::default()
            })
            .unwrap();
        s.attach_eni(&eni, &inst, 1, now()).unwrap();
        let primary = s.instances[&inst].primary_eni.clone();
        s.terminate_instances(std::slice::from_ref(&inst)).unwrap();
        assert!(!s.enis.contains_key(&primary));
        assert_eq!(s.enis[&eni].status(), "available");
    }
}
