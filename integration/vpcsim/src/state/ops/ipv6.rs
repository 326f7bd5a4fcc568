//! IPv6 addressing of ENIs: `AssignIpv6Addresses` / `UnassignIpv6Addresses` and the pure plan
//! (addresses, /80 prefixes, per-ENI IPv6 limit, subnets without an IPv6 CIDR) behind them and
//! `CreateNetworkInterface`. Must not know HTTP, knobs or IPv4.

use super::super::addressing::{self, IPV6_PREFIX_LEN};
use super::super::{Eni, State, StateError};
use super::AssignIpv6;
use super::family::{Family, Plan, Wanted, explicit_and_picked};
use crate::limits::InstanceLimits;
use ipnet::Ipv6Net;
use std::net::Ipv6Addr;

/// IPv6 as Assign/Unassign see it, in EC2's wording.
pub(super) struct V6;

impl Family for V6 {
    type Addr = Ipv6Addr;
    type Net = Ipv6Net;
    type Assign = AssignIpv6;
    const BOTH: &'static str = "ipv6 addresses and prefixes cannot be assigned together";
    const NEITHER: &'static str = "Ipv6AddressCount, Ipv6Addresses or Ipv6PrefixCount";
    const UNASSIGN_NEITHER: &'static str = "Ipv6Addresses or Ipv6Prefix";

    fn wanted(req: &AssignIpv6) -> Wanted {
        Wanted::of(req.count, &req.addresses, req.prefix_count, &req.prefixes)
    }
    fn per_eni(limits: &InstanceLimits) -> u32 {
        limits.ipv6_per_eni
    }
    fn held(eni: &mut Eni) -> (&mut Vec<Ipv6Addr>, &mut Vec<Ipv6Net>) {
        (&mut eni.ipv6_addresses, &mut eni.ipv6_prefixes)
    }
    fn plan(
        state: &State,
        _eni_id: &str,
        eni: &Eni,
        req: &AssignIpv6,
        limit: usize,
    ) -> Result<Plan<V6>, StateError> {
        let (addresses, prefixes) =
            state.plan_ipv6(&eni.subnet_id, req, eni.ipv6_slots(), limit)?;
        Ok((addresses, prefixes, Vec::new()))
    }
    fn address_not_held(ip: &Ipv6Addr, eni_id: &str) -> String {
        format!("address {ip} is not assigned to interface {eni_id}")
    }
    fn prefix_not_held(p: &Ipv6Net, eni_id: &str) -> String {
        format!("prefix {p} is not assigned to interface {eni_id}")
    }
}

impl State {
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
        V6::wanted(req).check_fits(current, limit)?;
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
        let addresses = explicit_and_picked(
            &req.addresses,
            req.count,
            |n| {
                let picked = addressing::alloc_ipv6(cidr, &used, n)?;
                used.extend(picked.iter().map(|ip| u128::from(*ip)));
                Some(picked)
            },
            || StateError::InsufficientFreeAddresses(subnet_id.to_owned()),
        )?;
        let prefixes = explicit_and_picked(
            &req.prefixes,
            req.prefix_count,
            |n| addressing::alloc_ipv6_prefixes(cidr, &used, n),
            || StateError::InsufficientCidrBlocks,
        )?;
        Ok((addresses, prefixes))
    }

    /// `AssignIpv6Addresses`: returns the new addresses and prefixes.
    pub fn assign_ipv6(
        &mut self,
        eni_id: &str,
        req: AssignIpv6,
    ) -> Result<(Vec<Ipv6Addr>, Vec<Ipv6Net>), StateError> {
        self.assign::<V6>(eni_id, req)
    }

    /// `UnassignIpv6Addresses`: every listed address/prefix must be on the ENI.
    pub fn unassign_ipv6(
        &mut self,
        eni_id: &str,
        addresses: &[Ipv6Addr],
        prefixes: &[Ipv6Net],
    ) -> Result<(), StateError> {
        self.unassign::<V6>(eni_id, addresses, prefixes)
    }
}
