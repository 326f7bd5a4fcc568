//! Read-only per-ENI views of the datastore for the adapters (introspection, metrics, the
//! reconciler): what they used to compute by walking slots themselves. Owns only projections;
//! must not change the datastore.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::SystemTime;

use ipnet::Ipv4Net;

use super::{DataStore, EniIdentity, PodMetadata, Slot};

/// Per ENI, per CIDR: how many of its addresses pods hold (quarantined CIDRs/ENIs included).
pub type Usage = BTreeMap<String, BTreeMap<Ipv4Net, u32>>;

/// One address that was ever handed out (a never-used free address has no view).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressView {
    /// The address.
    pub ip: Ipv4Addr,
    /// The holder's network name ("" when free).
    pub network_name: String,
    /// The holder's metadata (None when free).
    pub metadata: Option<PodMetadata>,
    /// When it was (last) assigned.
    pub assigned_at: Option<SystemTime>,
    /// When it was last released.
    pub unassigned_at: Option<SystemTime>,
}

/// One CIDR of an ENI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrView {
    /// The CIDR.
    pub net: Ipv4Net,
    /// Delegated prefix.
    pub is_prefix: bool,
    /// Addresses ever handed out, by address.
    pub addresses: Vec<AddressView>,
}

/// One ENI as introspection shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniView {
    /// Its identity, as registered.
    pub spec: EniIdentity,
    /// Route table.
    pub route_table: u32,
    /// Host networking set up.
    pub host_ready: bool,
    /// Quarantined (EC2 no longer lists it).
    pub gone: bool,
    /// CIDRs, by network.
    pub cidrs: Vec<CidrView>,
}

impl DataStore {
    /// Per ENI and CIDR, the number of addresses pods hold.
    #[must_use]
    pub fn usage(&self) -> Usage {
        self.enis
            .iter()
            .map(|(id, e)| {
                let cidrs = e
                    .cidrs
                    .iter()
                    .map(|(net, c)| (*net, u32::try_from(c.assigned()).unwrap_or(u32::MAX)))
                    .collect();
                (id.clone(), cidrs)
            })
            .collect()
    }

    /// Ids of the ENIs whose host networking is not set up yet (quarantined ones excluded).
    #[must_use]
    pub fn enis_awaiting_host(&self) -> Vec<String> {
        self.enis
            .values()
            .filter(|e| !e.host_ready && !e.gone)
            .map(|e| e.spec.id.clone())
            .collect()
    }

    /// Every ENI with its CIDRs and the addresses ever handed out, by ENI id.
    #[must_use]
    pub fn eni_views(&self) -> Vec<EniView> {
        self.enis
            .values()
            .map(|eni| EniView {
                spec: eni.spec.clone(),
                route_table: eni.route_table,
                host_ready: eni.host_ready,
                gone: eni.gone,
                cidrs: eni
                    .cidrs
                    .values()
                    .map(|c| CidrView {
                        net: c.net,
                        is_prefix: c.is_prefix,
                        addresses: c
                            .slots
                            .iter()
                            .filter_map(|(ip, slot)| address_view(*ip, slot))
                            .collect(),
                    })
                    .collect(),
            })
            .collect()
    }
}

fn address_view(ip: Ipv4Addr, slot: &Slot) -> Option<AddressView> {
    match slot {
        Slot::Free {
            unassigned_at: None,
            ..
        } => None,
        // A released address keeps its last AssignedTime.
        Slot::Free {
            unassigned_at,
            last_assigned_at,
        } => Some(AddressView {
            ip,
            network_name: String::new(),
            metadata: None,
            assigned_at: *last_assigned_at,
            unassigned_at: *unassigned_at,
        }),
        Slot::Assigned {
            key,
            metadata,
            assigned_at,
            unassigned_at,
        } => Some(AddressView {
            ip,
            network_name: key.network_name.clone(),
            metadata: Some(metadata.clone()),
            assigned_at: Some(*assigned_at),
            unassigned_at: *unassigned_at,
        }),
    }
}
