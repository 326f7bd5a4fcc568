//! Address capacity: PURE. How many more pod addresses this node can still obtain (free now,
//! cooling down, and what EC2 may still give within the instance's ENI/IP limits, max-pods and
//! the subnets' free space, from ipamd's listing or cni-metrics-helper's recount:
//! `subnet_inventory`), and when the node counts as exhausted (with hysteresis). Must not:
//! read the clock, the environment, EC2 or Kubernetes; decide pool actions (that is `policy`).
//!
//! Why: the scheduler and Karpenter see CPU and memory, never addresses; ipamd publishes this
//! figure (a Node condition, a metric, `ipamd status`, optionally a `NoSchedule` taint) so no pod
//! is sent where no address can be had.

use std::time::{Duration, SystemTime};

use crate::datastore::PoolStats;

use super::policy::{PREFIX_SIZE, Targets};

/// What ipamd knows of the subnets new addresses would come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SubnetRoom {
    /// The pool's last attempt to grow was refused for want of addresses in the subnet
    /// (EC2 `InsufficientFreeAddressesInSubnet`, or no aligned /28 left under prefix
    /// delegation): nothing more comes from EC2 until an attempt succeeds.
    pub dry: bool,
    /// Free addresses of those subnets as ipamd last learnt them (EC2 `AvailableIpAddressCount`
    /// of the last `DescribeSubnets`, or cni-metrics-helper's recount: see `counted`); None: not
    /// known. A listed 0 without `dry` counts as not known: the pool got addresses since that
    /// listing.
    pub free: Option<u32>,
    /// `free` is cni-metrics-helper's recount, fresher than ipamd's own listing
    /// (`subnet_inventory::subnet_room`): a 0 from it is 0.
    pub counted: bool,
    /// cni-metrics-helper's forecast: the earliest time one of those subnets runs out (of `/28`
    /// blocks under prefix delegation) at its fitted consumption rate; None: not forecast
    /// (no inventory, stale, or nothing shrinking). Published, never part of the figure (the
    /// figure is what can be had now).
    pub exhaustion_at: Option<SystemTime>,
}

impl SubnetRoom {
    /// Addresses the subnets can still give, as far as known: 0 while `dry`; the free
    /// addresses otherwise, where a 0 of ipamd's own listing counts as not known (the pool got
    /// addresses since that listing, or it would be `dry`) and a 0 of cni-metrics-helper's
    /// recount (`counted`) is 0. None: not known, not bounded by it.
    #[must_use]
    pub fn known_free(&self) -> Option<u32> {
        if self.dry {
            Some(0)
        } else {
            self.free.filter(|f| *f > 0 || self.counted)
        }
    }
}

/// Which limit bounds what more EC2 may give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityBound {
    /// The instance type's ENI and per-ENI address limits (with `MAX_ENI`).
    InstanceLimit,
    /// The node's max-pods.
    MaxPods,
    /// The subnets' free addresses (or the subnet ran dry).
    Subnet,
    /// Nothing may be attached now: the node is cordoned with ENIs unmanaged there, provisioning
    /// is disabled, or ipamd is shutting down.
    NoAttachment,
}

impl CapacityBound {
    /// Short name (metrics label, introspection, the condition's message).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InstanceLimit => "instance_limit",
            Self::MaxPods => "max_pods",
            Self::Subnet => "subnet",
            Self::NoAttachment => "no_attachment",
        }
    }
}

/// What this node can still obtain for new pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressCapacity {
    /// Free addresses, assignable now.
    pub free: u32,
    /// Addresses cooling down after their release (free again within `IP_COOLDOWN_PERIOD`).
    pub cooling: u32,
    /// More addresses EC2 may still give this node.
    pub from_ec2: u32,
    /// The figure: addresses new pods can still be given, `free + cooling + from_ec2` capped at
    /// the pods max-pods still admits.
    pub obtainable: u32,
    /// What bounds the figure.
    pub bound: CapacityBound,
}

/// The address capacity of one pool (card 0's: regular pods' addresses come from it).
///
/// * EC2 room: every unfilled CIDR slot of the node's usable ENIs plus every ENI slot not yet
///   attached (`Targets::max_enis`, which already holds `MAX_ENI` and the trunk's slot), in
///   addresses (a /28 slot is 16);
/// * the pool never holds more than max-pods addresses, and no more pods than max-pods run;
/// * the subnet: nothing while `dry`, at most its last-listed free addresses otherwise (under
///   prefix delegation only whole /28s count);
/// * nothing from EC2 when `attach_allowed` is false.
#[must_use]
pub fn address_capacity(
    stats: &PoolStats,
    t: &Targets,
    subnet: SubnetRoom,
    attach_allowed: bool,
) -> AddressCapacity {
    let unit = if t.prefix_delegation { PREFIX_SIZE } else { 1 };
    let free = stats.available();
    let cooling = stats.cooling;
    let slots_on_enis: u32 = stats
        .enis
        .iter()
        .filter(|e| !e.is_special && !e.is_excluded)
        .map(|e| t.cidrs_per_eni.saturating_sub(e.cidr_count))
        .sum();
    let attached = u32::try_from(stats.enis.len()).unwrap_or(u32::MAX);
    let new_eni_slots = t
        .max_enis
        .saturating_sub(attached)
        .saturating_mul(t.cidrs_per_eni);
    let instance_room = slots_on_enis
        .saturating_add(new_eni_slots)
        .saturating_mul(unit);
    let mut from_ec2 = instance_room;
    let mut bound = CapacityBound::InstanceLimit;
    if let Some(max) = t.max_pods {
        let room = max.saturating_sub(stats.total);
        if room < from_ec2 {
            from_ec2 = room;
            bound = CapacityBound::MaxPods;
        }
    }
    // (the listing is refreshed only when an ENI is created: see `SubnetRoom::known_free`)
    let subnet_room = subnet.known_free().map(|f| f / unit * unit);
    if let Some(room) = subnet_room
        && room < from_ec2
    {
        from_ec2 = room;
        bound = CapacityBound::Subnet;
    }
    if !attach_allowed {
        from_ec2 = 0;
        bound = CapacityBound::NoAttachment;
    }
    let mut obtainable = free.saturating_add(cooling).saturating_add(from_ec2);
    if let Some(max) = t.max_pods {
        let pods_room = max.saturating_sub(stats.assigned);
        if pods_room < obtainable {
            obtainable = pods_room;
            bound = CapacityBound::MaxPods;
        }
    }
    AddressCapacity {
        free,
        cooling,
        from_ec2,
        obtainable,
        bound,
    }
}

/// How long the node must be able to obtain an address without interruption before it stops
/// counting as exhausted (the condition turns True again, the taint goes): one freed address
/// taken again at once must not flap the taint and the scheduler's view.
pub const RECOVERY_HOLD: Duration = Duration::from_secs(15);

/// Whether the node counts as exhausted, and since when the figure says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Exhaustion {
    /// No further address can be obtained (condition False, taint on when enabled).
    pub exhausted: bool,
    /// While exhausted: since when the figure has been above zero without interruption.
    pub recovering_since: Option<SystemTime>,
}

/// The next [`Exhaustion`] after looking at `obtainable` at `now`: exhausted at once when it is
/// 0; back only once it has stayed above 0 for [`RECOVERY_HOLD`].
#[must_use]
pub fn next_exhaustion(prev: Exhaustion, obtainable: u32, now: SystemTime) -> Exhaustion {
    if obtainable == 0 {
        return Exhaustion {
            exhausted: true,
            recovering_since: None,
        };
    }
    if !prev.exhausted {
        return Exhaustion::default();
    }
    let since = prev.recovering_since.unwrap_or(now);
    if now.duration_since(since).unwrap_or(Duration::ZERO) >= RECOVERY_HOLD {
        Exhaustion::default()
    } else {
        Exhaustion {
            exhausted: true,
            recovering_since: Some(since),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::EniStats;

    fn eni(id: &str, cidrs: u32, special: bool) -> EniStats {
        EniStats {
            id: id.into(),
            device_number: 0,
            is_primary: id == "eni-0",
            is_special: special,
            is_excluded: false,
            cidr_count: cidrs,
            total: cidrs,
            assigned: 0,
            cooling: 0,
            past_min_lifetime: true,
            free_cidrs: Vec::new(),
            ipv6_assigned: 0,
            subnet_dry: false,
        }
    }

    fn stats(total: u32, assigned: u32, cooling: u32, enis: Vec<EniStats>) -> PoolStats {
        PoolStats {
            total,
            assigned,
            cooling,
            enis,
            ..PoolStats::default()
        }
    }

    /// m5.large: 3 ENIs of 10 addresses (9 secondary slots each).
    fn m5_large(max_pods: Option<u32>) -> Targets {
        Targets {
            warm_eni: 1,
            warm_ip: 0,
            minimum_ip: 0,
            warm_prefix: 0,
            prefix_delegation: false,
            max_enis: 3,
            cidrs_per_eni: 9,
            max_pods,
        }
    }

    #[test]
    fn free_cooling_and_what_the_instance_still_allows() {
        // one ENI with 5 addresses, 3 of them assigned, 1 cooling: 1 free, 4 slots left on it
        // and 2 ENIs of 9 to attach
        let s = stats(5, 3, 1, vec![eni("eni-0", 5, false)]);
        let c = address_capacity(&s, &m5_large(None), SubnetRoom::default(), true);
        assert_eq!((c.free, c.cooling, c.from_ec2), (1, 1, 4 + 18));
        assert_eq!(c.obtainable, 24);
        assert_eq!(c.bound, CapacityBound::InstanceLimit);
    }

    #[test]
    fn max_pods_bounds_the_pool_and_the_pods() {
        let s = stats(5, 3, 1, vec![eni("eni-0", 5, false)]);
        // the pool stops at 10 addresses: 5 more from EC2
        let c = address_capacity(&s, &m5_large(Some(10)), SubnetRoom::default(), true);
        assert_eq!(
            (c.from_ec2, c.obtainable, c.bound),
            (5, 7, CapacityBound::MaxPods)
        );
        // 3 pods run of max 4: one more pod, whatever the addresses
        let c = address_capacity(&s, &m5_large(Some(4)), SubnetRoom::default(), true);
        assert_eq!((c.obtainable, c.bound), (1, CapacityBound::MaxPods));
    }

    #[test]
    fn a_dry_or_small_subnet_leaves_only_what_the_node_holds() {
        let s = stats(9, 7, 1, vec![eni("eni-0", 9, false)]);
        let dry = SubnetRoom {
            dry: true,
            free: Some(200),
            ..SubnetRoom::default()
        };
        let c = address_capacity(&s, &m5_large(None), dry, true);
        assert_eq!(
            (c.from_ec2, c.obtainable, c.bound),
            (0, 2, CapacityBound::Subnet)
        );
        let small = SubnetRoom {
            free: Some(3),
            ..SubnetRoom::default()
        };
        let c = address_capacity(&s, &m5_large(None), small, true);
        assert_eq!((c.from_ec2, c.obtainable), (3, 5));
        // a listed 0 the pool was not refused on since is stale: the instance's limits
        let stale = SubnetRoom {
            free: Some(0),
            ..SubnetRoom::default()
        };
        let c = address_capacity(&s, &m5_large(None), stale, true);
        assert_eq!((c.from_ec2, c.bound), (18, CapacityBound::InstanceLimit));
        // cni-metrics-helper's fresh recount of 0 is 0: only what the node holds
        let counted = SubnetRoom {
            free: Some(0),
            counted: true,
            ..SubnetRoom::default()
        };
        let c = address_capacity(&s, &m5_large(None), counted, true);
        assert_eq!(
            (c.from_ec2, c.obtainable, c.bound),
            (0, 2, CapacityBound::Subnet)
        );
        // unknown subnet: the instance's limits
        let c = address_capacity(&s, &m5_large(None), SubnetRoom::default(), true);
        assert_eq!((c.from_ec2, c.bound), (18, CapacityBound::InstanceLimit));
    }

    #[test]
    fn every_address_taken_and_nothing_more_to_get_is_zero() {
        // 3 full ENIs (the third a trunk: never for pods), all assigned
        let s = stats(
            18,
            18,
            0,
            vec![
                eni("eni-0", 9, false),
                eni("eni-1", 9, false),
                eni("trunk", 0, true),
            ],
        );
        let c = address_capacity(&s, &m5_large(None), SubnetRoom::default(), true);
        assert_eq!((c.obtainable, c.bound), (0, CapacityBound::InstanceLimit));
        // cordoned: nothing attached, only what is held counts
        let s = stats(9, 8, 0, vec![eni("eni-0", 9, false)]);
        let c = address_capacity(&s, &m5_large(None), SubnetRoom::default(), false);
        assert_eq!(
            (c.from_ec2, c.obtainable, c.bound),
            (0, 1, CapacityBound::NoAttachment)
        );
    }

    #[test]
    fn prefix_delegation_counts_whole_prefixes() {
        let mut t = m5_large(None);
        t.prefix_delegation = true;
        t.warm_prefix = 1;
        let s = stats(16, 16, 0, vec![eni("eni-0", 1, false)]);
        let c = address_capacity(&s, &t, SubnetRoom::default(), true);
        // 8 more /28s on eni-0, 2 ENIs of 9
        assert_eq!(c.from_ec2, (8 + 18) * 16);
        let c = address_capacity(
            &s,
            &t,
            SubnetRoom {
                free: Some(40),
                ..SubnetRoom::default()
            },
            true,
        );
        assert_eq!(c.from_ec2, 32, "40 free addresses hold at most two /28s");
    }

    #[test]
    fn exhaustion_comes_at_once_and_goes_after_the_hold() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let e = next_exhaustion(Exhaustion::default(), 3, t0);
        assert!(!e.exhausted);
        let e = next_exhaustion(e, 0, at(1));
        assert!(e.exhausted);
        let e = next_exhaustion(e, 1, at(2));
        assert!(e.exhausted, "recovering, not recovered");
        // taken again before the hold: the hold starts over
        let e = next_exhaustion(e, 0, at(10));
        let e = next_exhaustion(e, 2, at(11));
        let e = next_exhaustion(e, 2, at(11 + RECOVERY_HOLD.as_secs() - 1));
        assert!(e.exhausted);
        let e = next_exhaustion(e, 2, at(11 + RECOVERY_HOLD.as_secs()));
        assert_eq!(e, Exhaustion::default());
    }
}
