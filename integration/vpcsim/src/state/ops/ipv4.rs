//! IPv4 addressing of ENIs: `AssignPrivateIpAddresses` / `UnassignPrivateIpAddresses` and the
//! pure plan (addresses, /28 prefixes, reassignment) behind them and `CreateNetworkInterface`.
//! Must not know HTTP, knobs or IPv6.

use super::super::addressing::{self, IPV4_PREFIX_LEN};
use super::super::{Eni, State, StateError};
use super::{AssignIpv4, AssignShape, Ipv4Plan};
use crate::limits;
use ipnet::Ipv4Net;
use std::net::Ipv4Addr;

impl State {
    /// IPv4 slot limit for an ENI: its instance type's when attached, else the largest any type has.
    pub(super) fn ipv4_limit(&self, eni: &Eni) -> usize {
        match eni
            .attachment
            .as_ref()
            .and_then(|a| self.instances.get(&a.instance_id))
        {
            Some(inst) => self.limits_of(inst).ipv4_per_eni as usize,
            None => limits::max_ipv4_per_eni() as usize,
        }
    }

    /// Picks the new IPv4 addresses and prefixes for `eni` (or a new ENI in `subnet_id`) without
    /// changing anything; also returns `(other ENI, address)` pairs moved by reassignment.
    pub(super) fn plan_ipv4(
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

    /// `AssignPrivateIpAddresses`: returns the newly assigned addresses and prefixes only.
    pub fn assign_ipv4(
        &mut self,
        eni_id: &str,
        req: AssignIpv4,
    ) -> Result<(Vec<Ipv4Addr>, Vec<Ipv4Net>), StateError> {
        let eni = self.eni_mut(eni_id)?.clone();
        self.check_assign_shape(
            &eni,
            AssignShape {
                wants_ips: req.count > 0 || !req.addresses.is_empty(),
                wants_prefixes: req.prefix_count > 0 || !req.prefixes.is_empty(),
                both: "addresses and ipv4 prefixes cannot be assigned together",
                neither: "SecondaryPrivateIpAddressCount, PrivateIpAddress or Ipv4PrefixCount",
            },
        )?;
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
}
