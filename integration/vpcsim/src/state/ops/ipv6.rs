//! IPv6 addressing of ENIs: `AssignIpv6Addresses` / `UnassignIpv6Addresses` and the pure plan
//! (addresses, /80 prefixes, per-ENI IPv6 limit, subnets without an IPv6 CIDR) behind them and
//! `CreateNetworkInterface`. Must not know HTTP, knobs or IPv4.

use super::super::addressing::{self, IPV6_PREFIX_LEN};
use super::super::{Eni, State, StateError};
use super::{AssignIpv6, AssignShape};
use crate::limits;
use ipnet::Ipv6Net;
use std::net::Ipv6Addr;

impl State {
    pub(super) fn ipv6_limit(&self, eni: &Eni) -> usize {
        match eni
            .attachment
            .as_ref()
            .and_then(|a| self.instances.get(&a.instance_id))
        {
            Some(inst) => self.limits_of(inst).ipv6_per_eni as usize,
            None => limits::max_ipv4_per_eni() as usize,
        }
    }

    pub(super) fn plan_ipv6(
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

    /// `AssignIpv6Addresses`: returns the new addresses and prefixes.
    pub fn assign_ipv6(
        &mut self,
        eni_id: &str,
        req: AssignIpv6,
    ) -> Result<(Vec<Ipv6Addr>, Vec<Ipv6Net>), StateError> {
        let eni = self.eni_mut(eni_id)?.clone();
        self.check_assign_shape(
            &eni,
            AssignShape {
                wants_ips: req.count > 0 || !req.addresses.is_empty(),
                wants_prefixes: req.prefix_count > 0 || !req.prefixes.is_empty(),
                both: "ipv6 addresses and prefixes cannot be assigned together",
                neither: "Ipv6AddressCount, Ipv6Addresses or Ipv6PrefixCount",
            },
        )?;
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
}
