//! Branch ENIs on trunk ENIs (security groups for pods) in the router: one 802.1Q
//! sub-interface of the trunk's port per branch (the branch's identity: its address routed
//! there, a permanent neighbour = the branch MAC) and the source check for it (its security
//! groups: [`super::groups`]). Pure: derives what the kernel must hold from
//! `Desired`; must not touch the kernel. Nothing here exists while no trunk has branches, so a
//! kernel without 802.1Q runs every other part of the fabric unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::model::{Desired, DesiredBranch, Neighbour, RouteTarget, host};
use super::names::{BRANCH_PORT_PREFIX, branch_port, eni_port};

/// A branch port the router must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedBranchPort {
    /// The trunk ENI's router port (the VLAN's parent).
    pub trunk_port: String,
    /// The branch.
    pub branch: DesiredBranch,
}

/// Every branch of every trunk, by router-side port name.
pub fn branch_ports(desired: &Desired) -> BTreeMap<String, WantedBranchPort> {
    desired
        .nodes
        .values()
        .flat_map(|n| n.enis.values())
        .flat_map(|trunk| {
            trunk.branches.values().map(|b| {
                (
                    branch_port(&b.eni_id),
                    WantedBranchPort {
                        trunk_port: eni_port(&trunk.eni_id),
                        branch: b.clone(),
                    },
                )
            })
        })
        .collect()
}

/// Each branch's address, on its port (the VPC delivers to the branch, tagged with its VLAN).
pub fn routes(desired: &Desired) -> BTreeMap<IpNet, RouteTarget> {
    branch_ports(desired)
        .into_iter()
        .map(|(dev, w)| (host(w.branch.primary_ip).into(), RouteTarget::Port { dev }))
        .collect()
}

/// Each branch's address -> its MAC on its port (no ARP for the branch, as for ENIs).
pub fn neighbours(desired: &Desired) -> BTreeSet<Neighbour> {
    branch_ports(desired)
        .into_iter()
        .map(|(dev, w)| Neighbour {
            dev,
            ip: IpAddr::V4(w.branch.primary_ip),
            mac: w.branch.mac,
        })
        .collect()
}

/// The source check for branch ports (`mangle PREROUTING`, after the ENI ports' lines): a
/// packet from a branch port must come from the branch's address. Empty without branches.
pub fn mangle_lines(desired: &Desired) -> Vec<String> {
    let ports = branch_ports(desired);
    if ports.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<String> = ports
        .iter()
        .map(|(port, w)| {
            format!(
                "-A PREROUTING -s {} -i {port} -j ACCEPT",
                host(w.branch.primary_ip)
            )
        })
        .collect();
    out.push(format!("-A PREROUTING -i {BRANCH_PORT_PREFIX}+ -j DROP"));
    out
}
