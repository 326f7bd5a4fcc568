//! The datastore's value types: the IPAM key, pod metadata, ENIs, CIDRs and their address
//! slots, assignments, pending entries and refusals. Owns only data shapes; must not hold the
//! index (that is `DataStore`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// The IPAM primary key (CNI spec: network name, container id, interface name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct IpamKey {
    /// `networkName`.
    #[serde(rename = "networkName")]
    pub network_name: String,
    /// `containerID`.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// `ifName`.
    #[serde(rename = "ifName")]
    pub if_name: String,
}

impl IpamKey {
    /// Builds a key.
    #[must_use]
    pub fn new(network_name: &str, container_id: &str, if_name: &str) -> Self {
        Self {
            network_name: network_name.to_owned(),
            container_id: container_id.to_owned(),
            if_name: if_name.to_owned(),
        }
    }
}

impl std::fmt::Display for IpamKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.network_name, self.container_id, self.if_name
        )
    }
}

/// Network name used for assignments rebuilt from host state after a corrupt checkpoint; the
/// container id is the host veth name. DelNetwork falls back to this key (see `rpc`).
pub const RECOVERED_NETWORK_NAME: &str = "_recovered-from-host";
/// Interface name of recovered assignments.
pub const RECOVERED_IF_NAME: &str = "unknown";

/// Pod metadata stored with an assignment (checkpoint `metadata`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PodMetadata {
    /// `k8sPodNamespace`.
    #[serde(
        rename = "k8sPodNamespace",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub namespace: String,
    /// `k8sPodName`.
    #[serde(
        rename = "k8sPodName",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    /// `interfacesCount` (multi-NIC).
    #[serde(rename = "interfacesCount", default, skip_serializing_if = "is_zero")]
    pub interfaces_count: u32,
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One address slot inside a CIDR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// Never handed out, or free with its cooldown start.
    Free {
        /// When it was last released (None: never used).
        unassigned_at: Option<SystemTime>,
        /// When it was last assigned (None: never used, or unknown after a restart); shown by
        /// introspection as a released address's `AssignedTime`.
        last_assigned_at: Option<SystemTime>,
    },
    /// Held by a pod.
    Assigned {
        /// Who holds it.
        key: IpamKey,
        /// Pod metadata.
        metadata: PodMetadata,
        /// When it was assigned.
        assigned_at: SystemTime,
        /// When it was previously released (kept for introspection).
        unassigned_at: Option<SystemTime>,
    },
}

/// A /32 secondary address or a /28 prefix on an ENI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cidr {
    /// The CIDR.
    pub net: Ipv4Net,
    /// True for a delegated prefix (/28).
    pub is_prefix: bool,
    /// Every address of the CIDR.
    pub slots: BTreeMap<Ipv4Addr, Slot>,
    /// EC2 no longer lists it but pods hold addresses in it: quarantined (no new assignments,
    /// not in the pool's totals, removed with its last pod).
    pub gone: bool,
}

impl Cidr {
    pub(super) fn new(net: Ipv4Net, is_prefix: bool) -> Self {
        let slots = net
            .hosts_all()
            .map(|a| {
                (
                    a,
                    Slot::Free {
                        unassigned_at: None,
                        last_assigned_at: None,
                    },
                )
            })
            .collect();
        Self {
            net,
            is_prefix,
            slots,
            gone: false,
        }
    }

    pub(super) fn assigned(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s, Slot::Assigned { .. }))
            .count()
    }

    pub(super) fn cooling(&self, now: SystemTime, cooldown: Duration) -> usize {
        self.slots
            .values()
            .filter(|s| is_cooling(s, now, cooldown))
            .count()
    }
}

pub(super) trait HostsAll {
    fn hosts_all(&self) -> Box<dyn Iterator<Item = Ipv4Addr>>;
}

impl HostsAll for Ipv4Net {
    /// Every address of the network, including network/broadcast (a /28 prefix's 16 addresses
    /// are all usable by pods).
    fn hosts_all(&self) -> Box<dyn Iterator<Item = Ipv4Addr>> {
        let start = u32::from(self.network());
        let end = u32::from(self.broadcast());
        Box::new((start..=end).map(Ipv4Addr::from))
    }
}

pub(super) fn is_cooling(slot: &Slot, now: SystemTime, cooldown: Duration) -> bool {
    match slot {
        Slot::Free {
            unassigned_at: Some(t),
            ..
        } => now.duration_since(*t).map_or(true, |d| d < cooldown),
        _ => false,
    }
}

/// An ENI as the datastore knows it: its identity, its route table, its CIDRs with their
/// address slots and its lifecycle flags (the record; `pool::ec2_port::AttachedEni` is what
/// EC2 says is attached, [`EniIdentity`] what registers it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eni {
    /// Its identity, as registered ([`DataStore::add_eni`](super::DataStore::add_eni)).
    pub spec: EniIdentity,
    /// Route table (from `dataplane::conventions`).
    pub route_table: u32,
    /// When ipamd first saw it (the 60 s minimum lifetime starts here).
    pub created_at: SystemTime,
    /// CIDRs by network.
    pub cidrs: BTreeMap<Ipv4Net, Cidr>,
    /// EC2 no longer lists it but pods hold addresses on it: quarantined like a gone CIDR
    /// (never used for new pods, never freed through EC2, dropped with its last pod).
    pub gone: bool,
    /// Its host networking (link, route table, rules) is set up: only then are its addresses
    /// handed out (a pod on it would egress with the wrong table). The pool loop retries.
    pub host_ready: bool,
}

/// An ENI's identity: what registers a new ENI, kept as its datastore record's `spec` (an
/// `AttachedEni` without its addresses; not `host::EniSpec`, the host layer's link view). The
/// node's one description of an ENI: what its host set-up and teardown need comes from here
/// (the pool loop keeps no copy of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniIdentity {
    /// `eni-...`.
    pub id: String,
    /// Device index.
    pub device_number: u32,
    /// Network card.
    pub network_card: u32,
    /// Primary ENI.
    pub is_primary: bool,
    /// Trunk.
    pub is_trunk: bool,
    /// EFA.
    pub is_efa: bool,
    /// Excluded from pod placement.
    pub is_excluded: bool,
    /// Subnet id.
    pub subnet_id: String,
    /// Subnet CIDR.
    pub subnet: Ipv4Net,
    /// MAC address (its host link is found by it).
    pub mac: String,
    /// The ENI's own primary private IP (never given to pods; its host rules name it).
    pub primary_ip: Ipv4Addr,
}

/// Where an assigned address lives; what the plugin needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// The address.
    pub ip: Ipv4Addr,
    /// The ENI.
    pub eni_id: String,
    /// ENI device number.
    pub device_number: u32,
    /// ENI route table.
    pub route_table: u32,
}

/// Datastore refusals.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatastoreError {
    /// No free, non-cooling address on any usable ENI.
    #[error("no available address")]
    NoAvailableAddress,
    /// The key holds no address.
    #[error("unknown pod {0}")]
    UnknownPod(IpamKey),
    /// The key's address is restored but not yet on a known ENI.
    #[error("address {0} of pod is pending verification")]
    PendingVerification(Ipv4Addr),
    /// An ENI with this id exists.
    #[error("duplicate eni {0}")]
    DuplicateEni(String),
    /// No ENI with this id.
    #[error("unknown eni {0}")]
    UnknownEni(String),
    /// The CIDR overlaps one already in the store.
    #[error("cidr {0} already in datastore")]
    DuplicateCidr(Ipv4Net),
    /// The CIDR is not on that ENI.
    #[error("unknown cidr {0}")]
    UnknownCidr(Ipv4Net),
    /// Addresses of the CIDR/ENI are assigned or cooling.
    #[error("{0} is in use")]
    InUse(String),
}

/// A restored assignment whose address is not (yet) on a known ENI. Kept, written back to the
/// checkpoint, and attached as soon as a CIDR containing it is added (never dropped: its pod still
/// runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingEntry {
    /// Who.
    pub key: IpamKey,
    /// The address.
    pub ip: Ipv4Addr,
    /// Metadata.
    pub metadata: PodMetadata,
    /// When assigned.
    pub assigned_at: SystemTime,
}
