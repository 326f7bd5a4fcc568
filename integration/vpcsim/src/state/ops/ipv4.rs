//! IPv4 addressing of ENIs: `AssignPrivateIpAddresses` / `UnassignPrivateIpAddresses` and the
//! pure plan (addresses, /28 prefixes, reassignment) behind them and `CreateNetworkInterface`.
//! Must not know HTTP, knobs or IPv6.

use super::super::addressing::{self, IPV4_PREFIX_LEN};
use super::super::{Eni, ReservationKind, State, StateError};
use super::AssignIpv4;
use super::family::{Family, Plan, Wanted, explicit_and_picked};
use crate::limits::InstanceLimits;
use ipnet::Ipv4Net;
use std::net::Ipv4Addr;

/// IPv4 as Assign/Unassign see it, in EC2's wording.
pub(super) struct V4;

impl Family for V4 {
    type Addr = Ipv4Addr;
    type Net = Ipv4Net;
    type Assign = AssignIpv4;
    const BOTH: &'static str = "addresses and ipv4 prefixes cannot be assigned together";
    const NEITHER: &'static str =
        "SecondaryPrivateIpAddressCount, PrivateIpAddress or Ipv4PrefixCount";
    const UNASSIGN_NEITHER: &'static str = "PrivateIpAddress or Ipv4Prefix";

    fn wanted(req: &AssignIpv4) -> Wanted {
        Wanted::of(req.count, &req.addresses, req.prefix_count, &req.prefixes)
    }
    fn per_eni(limits: &InstanceLimits) -> u32 {
        limits.ipv4_per_eni
    }
    fn held(eni: &mut Eni) -> (&mut Vec<Ipv4Addr>, &mut Vec<Ipv4Net>) {
        (&mut eni.private_ips, &mut eni.ipv4_prefixes)
    }
    fn plan(
        state: &State,
        eni_id: &str,
        eni: &Eni,
        req: &AssignIpv4,
        limit: usize,
    ) -> Result<Plan<V4>, StateError> {
        state.plan_ipv4(&eni.subnet_id, Some(eni_id), req, eni.ipv4_slots(), limit)
    }
    fn address_not_held(ip: &Ipv4Addr, eni_id: &str) -> String {
        format!("some of the specified addresses are not assigned to interface {eni_id}: {ip}")
    }
    fn prefix_not_held(p: &Ipv4Net, eni_id: &str) -> String {
        format!("some of the specified prefixes are not assigned to interface {eni_id}: {p}")
    }
    /// The primary address cannot be removed.
    fn check_unassign(eni: &Eni, addresses: &[Ipv4Addr]) -> Result<(), StateError> {
        if addresses.contains(&eni.primary_ip()) {
            return Err(StateError::InvalidParameterValue(format!(
                "the primary private ip address {} cannot be unassigned",
                eni.primary_ip()
            )));
        }
        Ok(())
    }
}

impl State {
    /// Picks the new IPv4 addresses and prefixes for `eni` (or a new ENI in `subnet_id`) without
    /// changing anything; also returns `(other ENI, address)` pairs moved by reassignment.
    pub(super) fn plan_ipv4(
        &self,
        subnet_id: &str,
        owner: Option<&str>,
        req: &AssignIpv4,
        current_slots: usize,
        limit: usize,
    ) -> Result<Plan<V4>, StateError> {
        let subnet = self
            .subnets
            .get(subnet_id)
            .ok_or_else(|| StateError::SubnetNotFound(subnet_id.to_owned()))?;
        let cidr = subnet.cidr;
        V4::wanted(req).check_fits(current_slots, limit)?;
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
        // EC2 picks no address inside a CIDR reservation (either kind) and no prefix inside an
        // explicit one; it delegates prefixes from prefix reservations first
        let reserved = |kind: Option<ReservationKind>| -> std::collections::BTreeSet<u32> {
            subnet
                .reservations
                .iter()
                .filter(|r| kind.is_none_or(|k| r.kind == k))
                .flat_map(|r| u32::from(r.cidr.network())..=u32::from(r.cidr.broadcast()))
                .collect()
        };
        let not_for_addresses = reserved(None);
        let not_for_prefixes = reserved(Some(ReservationKind::Explicit));
        let addresses = explicit_and_picked(
            &req.addresses,
            req.count,
            |n| {
                let mut taken = used.clone();
                taken.extend(&not_for_addresses);
                let picked = match &self.rng {
                    Some(rng) => addressing::alloc_ipv4_random(cidr, &taken, n, rng),
                    None => addressing::alloc_ipv4(cidr, &taken, n),
                }?;
                used.extend(picked.iter().map(|ip| u32::from(*ip)));
                Some(picked)
            },
            || StateError::InsufficientFreeAddresses(subnet_id.to_owned()),
        )?;
        let prefixes = explicit_and_picked(
            &req.prefixes,
            req.prefix_count,
            |n| {
                let mut taken = used.clone();
                taken.extend(&not_for_prefixes);
                addressing::alloc_ipv4_prefixes_preferring(
                    cidr,
                    &taken,
                    n,
                    subnet
                        .reservations
                        .iter()
                        .filter(|r| r.kind == ReservationKind::Prefix)
                        .map(|r| r.cidr),
                )
            },
            || StateError::InsufficientCidrBlocks,
        )?;
        Ok((addresses, prefixes, moved))
    }

    /// `AssignPrivateIpAddresses`: returns the newly assigned addresses and prefixes only.
    pub fn assign_ipv4(
        &mut self,
        eni_id: &str,
        req: AssignIpv4,
    ) -> Result<(Vec<Ipv4Addr>, Vec<Ipv4Net>), StateError> {
        self.assign::<V4>(eni_id, req)
    }

    /// `UnassignPrivateIpAddresses`: every listed address/prefix must be on the ENI; the
    /// primary address cannot be removed.
    pub fn unassign_ipv4(
        &mut self,
        eni_id: &str,
        addresses: &[Ipv4Addr],
        prefixes: &[Ipv4Net],
    ) -> Result<(), StateError> {
        self.unassign::<V4>(eni_id, addresses, prefixes)
    }
}
