//! What Assign/Unassign do alike for IPv4 and IPv6 (`Family`, one generic body each): the
//! request's shape, the per-ENI slot limit, moving the planned addresses onto the ENI and the
//! Unassign checks. Each family keeps its own plan and EC2's exact wording (`ipv4.rs`,
//! `ipv6.rs`). Must not know HTTP or knobs.

use super::super::{Eni, State, StateError};
use crate::limits::{self, InstanceLimits};
use std::fmt::Display;

/// Planned Assign: new addresses, new prefixes, and `(other ENI, address)` pairs taken over from
/// other ENIs (reassignment; always empty for IPv6).
pub(super) type Plan<F> = (
    Vec<<F as Family>::Addr>,
    Vec<<F as Family>::Net>,
    Vec<(String, <F as Family>::Addr)>,
);

/// What an Assign added: the new addresses and the new prefixes.
pub(super) type Assigned<F> = (Vec<<F as Family>::Addr>, Vec<<F as Family>::Net>);

/// One address family of an ENI as the Assign/Unassign actions see it.
pub(super) trait Family {
    /// An address.
    type Addr: Copy + PartialEq + Display;
    /// A delegated prefix.
    type Net: Copy + PartialEq + Display;
    /// The Assign action's input.
    type Assign;
    /// `InvalidParameterCombination` text when Assign asks for addresses and prefixes.
    const BOTH: &'static str;
    /// `MissingParameter` text when Assign asks for neither.
    const NEITHER: &'static str;
    /// `MissingParameter` text when Unassign lists nothing.
    const UNASSIGN_NEITHER: &'static str;

    /// Addresses and prefixes the Assign input asks for (explicit and counted).
    fn wanted(req: &Self::Assign) -> Wanted;
    /// Slots an ENI of an instance with these limits may hold.
    fn per_eni(limits: &InstanceLimits) -> u32;
    /// The ENI's addresses and prefixes of this family.
    fn held(eni: &mut Eni) -> (&mut Vec<Self::Addr>, &mut Vec<Self::Net>);
    /// Picks what Assign adds to `eni` (already holding `eni`'s slots) without changing anything.
    fn plan(
        state: &State,
        eni_id: &str,
        eni: &Eni,
        req: &Self::Assign,
        limit: usize,
    ) -> Result<Plan<Self>, StateError>;
    /// EC2's refusal of an Unassign listing an address the ENI does not hold.
    fn address_not_held(ip: &Self::Addr, eni_id: &str) -> String;
    /// EC2's refusal of an Unassign listing a prefix the ENI does not hold.
    fn prefix_not_held(p: &Self::Net, eni_id: &str) -> String;
    /// A family's own refusal of an Unassign, checked before the held checks.
    fn check_unassign(_eni: &Eni, _addresses: &[Self::Addr]) -> Result<(), StateError> {
        Ok(())
    }
}

/// How many addresses and prefixes an Assign asks for (explicit ones plus counts).
#[derive(Debug, Clone, Copy)]
pub(super) struct Wanted {
    pub(super) ips: usize,
    pub(super) prefixes: usize,
}

impl Wanted {
    pub(super) fn of<A, N>(count: u32, addresses: &[A], prefix_count: u32, prefixes: &[N]) -> Self {
        Wanted {
            ips: addresses.len() + count as usize,
            prefixes: prefixes.len() + prefix_count as usize,
        }
    }

    /// Refuses when `current` slots plus these exceed `limit` (each prefix takes one slot).
    pub(super) fn check_fits(self, current: usize, limit: usize) -> Result<(), StateError> {
        if current + self.ips + self.prefixes > limit {
            return Err(StateError::PrivateIpAddressLimitExceeded);
        }
        Ok(())
    }
}

/// `explicit` plus `count` more from `alloc`, or `short()` when it cannot find them all.
pub(super) fn explicit_and_picked<T: Clone>(
    explicit: &[T],
    count: u32,
    alloc: impl FnOnce(usize) -> Option<Vec<T>>,
    short: impl FnOnce() -> StateError,
) -> Result<Vec<T>, StateError> {
    let mut all = explicit.to_vec();
    if count > 0 {
        all.extend(alloc(count as usize).ok_or_else(short)?);
    }
    Ok(all)
}

impl State {
    /// An ENI's slot limit in family `F`: its instance type's when attached, else the largest
    /// IPv4 limit any type has.
    pub(super) fn slot_limit<F: Family>(&self, eni: &Eni) -> usize {
        match eni
            .attachment
            .as_ref()
            .and_then(|a| self.instances.get(&a.instance_id))
        {
            Some(inst) => F::per_eni(self.limits_of(inst)) as usize,
            None => limits::max_ipv4_per_eni() as usize,
        }
    }

    /// Assign in family `F`: addresses or prefixes, never both, never neither, prefixes only on
    /// an instance type that supports them (Nitro); returns the new addresses and prefixes only.
    pub(super) fn assign<F: Family>(
        &mut self,
        eni_id: &str,
        req: F::Assign,
    ) -> Result<Assigned<F>, StateError> {
        let eni = self.eni_mut(eni_id)?.clone();
        let wanted = F::wanted(&req);
        if wanted.ips > 0 && wanted.prefixes > 0 {
            return Err(StateError::InvalidParameterCombination(F::BOTH.into()));
        }
        if wanted.ips == 0 && wanted.prefixes == 0 {
            return Err(StateError::MissingParameter(F::NEITHER.into()));
        }
        if wanted.prefixes > 0
            && let Some(inst) = eni
                .attachment
                .as_ref()
                .and_then(|a| self.instances.get(&a.instance_id))
        {
            let lim = self.limits_of(inst);
            if !lim.supports_prefixes() {
                return Err(StateError::InvalidParameterValue(format!(
                    "instance type {} does not support prefix delegation",
                    lim.instance_type
                )));
            }
        }
        let limit = self.slot_limit::<F>(&eni);
        let (addresses, prefixes, moved) = F::plan(self, eni_id, &eni, &req, limit)?;
        for (other, ip) in moved {
            if let Some(o) = self.enis.get_mut(&other) {
                F::held(o).0.retain(|x| *x != ip);
            }
        }
        let (held_ips, held_prefixes) = F::held(self.eni_mut(eni_id)?);
        held_ips.extend(addresses.iter().copied());
        held_prefixes.extend(prefixes.iter().copied());
        Ok((addresses, prefixes))
    }

    /// Unassign in family `F`: every listed address/prefix must be on the ENI, or EC2 refuses
    /// the whole call and nothing changes.
    pub(super) fn unassign<F: Family>(
        &mut self,
        eni_id: &str,
        addresses: &[F::Addr],
        prefixes: &[F::Net],
    ) -> Result<(), StateError> {
        let eni = self.eni_mut(eni_id)?;
        if addresses.is_empty() && prefixes.is_empty() {
            return Err(StateError::MissingParameter(F::UNASSIGN_NEITHER.into()));
        }
        F::check_unassign(eni, addresses)?;
        let (held_ips, held_prefixes) = F::held(eni);
        all_held(held_ips, addresses, |ip| F::address_not_held(ip, eni_id))?;
        all_held(held_prefixes, prefixes, |p| F::prefix_not_held(p, eni_id))?;
        held_ips.retain(|ip| !addresses.contains(ip));
        held_prefixes.retain(|p| !prefixes.contains(p));
        Ok(())
    }
}

fn all_held<T: PartialEq>(
    held: &[T],
    asked: &[T],
    refusal: impl Fn(&T) -> String,
) -> Result<(), StateError> {
    match asked.iter().find(|x| !held.contains(x)) {
        Some(x) => Err(StateError::InvalidParameterValue(refusal(x))),
        None => Ok(()),
    }
}
