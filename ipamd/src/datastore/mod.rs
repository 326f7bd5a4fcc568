//! The datastore: which ENIs and CIDRs this node holds and which pod (IPAM key) holds which
//! address. PURE and synchronous: every method that depends on time takes `now`. Must not: do
//! I/O, call EC2/netlink/kube, read the clock, be async. Persistence is the caller's job via
//! [`checkpoint`] (the datastore only converts to and from checkpoint entries).
//!
//! Invariants (checked by the property tests):
//! - an address is held by at most one key, and a key holds at most one address;
//! - an assignment is never dropped except by `unassign`/`drop_pending` for that key.

pub mod checkpoint;
mod views;

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

pub use checkpoint::{CheckpointData, CheckpointEntry};
pub use views::{AddressView, CidrView, EniView, Usage};

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
        /// introspection as upstream shows a released address's `AssignedTime`.
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
    fn new(net: Ipv4Net, is_prefix: bool) -> Self {
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

    fn assigned(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s, Slot::Assigned { .. }))
            .count()
    }

    fn cooling(&self, now: SystemTime, cooldown: Duration) -> usize {
        self.slots
            .values()
            .filter(|s| is_cooling(s, now, cooldown))
            .count()
    }
}

trait HostsAll {
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

fn is_cooling(slot: &Slot, now: SystemTime, cooldown: Duration) -> bool {
    match slot {
        Slot::Free {
            unassigned_at: Some(t),
            ..
        } => now.duration_since(*t).map_or(true, |d| d < cooldown),
        _ => false,
    }
}

/// An ENI as the datastore knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eni {
    /// `eni-...`.
    pub id: String,
    /// EC2 device index (0 = primary ENI).
    pub device_number: u32,
    /// Network card index.
    pub network_card: u32,
    /// Route table (from `dataplane::conventions`).
    pub route_table: u32,
    /// The instance's primary ENI.
    pub is_primary: bool,
    /// Trunk ENI (SGP).
    pub is_trunk: bool,
    /// EFA ENI.
    pub is_efa: bool,
    /// No new pods are placed on it (subnet tag `kubernetes.io/role/cni=0`).
    pub is_excluded: bool,
    /// Subnet id (`subnet-...`), empty if unknown.
    pub subnet_id: String,
    /// Subnet CIDR.
    pub subnet: Ipv4Net,
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

/// What to register for a new ENI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniSpec {
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
/// checkpoint, and attached as soon as a CIDR containing it is added (fix of upstream #3876).
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

/// Per-ENI statistics for the pool policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniStats {
    /// ENI id.
    pub id: String,
    /// Device number.
    pub device_number: u32,
    /// Primary ENI.
    pub is_primary: bool,
    /// Trunk/EFA/excluded: never used for pods, never freed by the pool.
    pub is_special: bool,
    /// Number of CIDRs (/32s or /28s): what counts against the per-ENI limit.
    pub cidr_count: u32,
    /// Addresses.
    pub total: u32,
    /// Assigned.
    pub assigned: u32,
    /// Cooling.
    pub cooling: u32,
    /// Old enough to be freed (min lifetime elapsed).
    pub past_min_lifetime: bool,
    /// CIDRs with no assigned and no cooling address (releasable).
    pub free_cidrs: Vec<Ipv4Net>,
}

/// Pool statistics: what the policy decides on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Addresses on usable ENIs.
    pub total: u32,
    /// Assigned (incl. pending verification).
    pub assigned: u32,
    /// Free but cooling.
    pub cooling: u32,
    /// Prefixes held.
    pub prefixes: u32,
    /// Prefixes with nothing assigned or cooling.
    pub free_prefixes: u32,
    /// Restored entries not yet on a known ENI.
    pub pending: u32,
    /// Assigned addresses in quarantined CIDRs/ENIs (EC2 no longer lists them): in
    /// `assigned`, not in `total`.
    pub quarantined: u32,
    /// Per ENI, by device number.
    pub enis: Vec<EniStats>,
}

impl PoolStats {
    /// Assignable now: total − assigned − cooling (upstream counts cooling as free: #2896).
    #[must_use]
    pub fn available(&self) -> u32 {
        self.total
            .saturating_sub(self.assigned_on_enis())
            .saturating_sub(self.cooling)
    }

    fn assigned_on_enis(&self) -> u32 {
        self.assigned
            .saturating_sub(self.pending)
            .saturating_sub(self.quarantined)
    }
}

/// The datastore.
#[derive(Debug, Clone)]
pub struct DataStore {
    enis: BTreeMap<String, Eni>,
    /// key → (eni id, cidr, address) for O(log n) idempotency and DEL.
    by_key: HashMap<IpamKey, (String, Ipv4Net, Ipv4Addr)>,
    pending: BTreeMap<IpamKey, PendingEntry>,
    /// Addresses not to hand out for a moment (their stale pod rules are being deleted).
    fenced: std::collections::BTreeSet<Ipv4Addr>,
    /// Pending entries EC2's Describe confirmed are on none of this node's ENIs.
    absent: std::collections::BTreeSet<IpamKey>,
    cooldown: Duration,
    min_eni_lifetime: Duration,
}

/// Upstream's minimum ENI lifetime before it may be freed.
pub const MIN_ENI_LIFETIME: Duration = Duration::from_secs(60);

impl DataStore {
    /// An empty datastore with `IP_COOLDOWN_PERIOD`.
    #[must_use]
    pub fn new(cooldown: Duration) -> Self {
        Self {
            enis: BTreeMap::new(),
            by_key: HashMap::new(),
            pending: BTreeMap::new(),
            fenced: std::collections::BTreeSet::new(),
            absent: std::collections::BTreeSet::new(),
            cooldown,
            min_eni_lifetime: MIN_ENI_LIFETIME,
        }
    }

    /// The configured cooldown.
    #[must_use]
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// Registers an ENI.
    pub fn add_eni(&mut self, spec: EniSpec, now: SystemTime) -> Result<(), DatastoreError> {
        if self.enis.contains_key(&spec.id) {
            return Err(DatastoreError::DuplicateEni(spec.id));
        }
        let route_table =
            dataplane::conventions::route_table_for(spec.device_number, spec.network_card);
        self.enis.insert(
            spec.id.clone(),
            Eni {
                id: spec.id,
                device_number: spec.device_number,
                network_card: spec.network_card,
                route_table,
                is_primary: spec.is_primary,
                is_trunk: spec.is_trunk,
                is_efa: spec.is_efa,
                is_excluded: spec.is_excluded,
                subnet_id: spec.subnet_id,
                subnet: spec.subnet,
                created_at: now,
                cidrs: BTreeMap::new(),
                gone: false,
                host_ready: true,
            },
        );
        Ok(())
    }

    /// Adds a /32 (`is_prefix = false`) or a /28 prefix to an ENI, and attaches any pending
    /// restored entries inside it.
    pub fn add_cidr(
        &mut self,
        eni_id: &str,
        net: Ipv4Net,
        is_prefix: bool,
    ) -> Result<(), DatastoreError> {
        let net = net.trunc();
        if let Some(c) = self
            .enis
            .get_mut(eni_id)
            .and_then(|e| e.cidrs.get_mut(&net))
            .filter(|c| c.gone && c.is_prefix == is_prefix)
        {
            // EC2 gave this ENI the quarantined CIDR again: it is ours again.
            c.gone = false;
            return Ok(());
        }
        let moved_from = self.enis.iter().find_map(|(id, e)| {
            e.cidrs
                .get(&net)
                .filter(|c| c.gone && c.is_prefix == is_prefix && id != eni_id)
                .map(|_| id.clone())
        });
        if let Some(from) = moved_from
            && self.enis.contains_key(eni_id)
        {
            // EC2 put a quarantined CIDR on another of our ENIs (e.g. a new ENI got the gone
            // ENI's addresses): it moves there with its pods' assignments, assignable again.
            let mut cidr = self
                .enis
                .get_mut(&from)
                .and_then(|e| e.cidrs.remove(&net))
                .ok_or(DatastoreError::UnknownCidr(net))?;
            cidr.gone = false;
            for slot in cidr.slots.values() {
                if let Slot::Assigned { key, .. } = slot
                    && let Some(entry) = self.by_key.get_mut(key)
                {
                    entry.0 = eni_id.to_owned();
                }
            }
            if let Some(e) = self.enis.get_mut(eni_id) {
                e.cidrs.insert(net, cidr);
            }
            if self
                .enis
                .get(&from)
                .is_some_and(|e| e.gone && e.cidrs.is_empty())
            {
                self.enis.remove(&from);
            }
            return Ok(());
        }
        if self.enis.values().any(|e| {
            e.cidrs
                .keys()
                .any(|c| c.contains(&net.network()) || net.contains(&c.network()))
        }) {
            return Err(DatastoreError::DuplicateCidr(net));
        }
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        let mut cidr = Cidr::new(net, is_prefix);
        let adopt: Vec<IpamKey> = self
            .pending
            .values()
            .filter(|p| net.contains(&p.ip))
            .map(|p| p.key.clone())
            .collect();
        for key in adopt {
            if let Some(p) = self.pending.remove(&key) {
                cidr.slots.insert(
                    p.ip,
                    Slot::Assigned {
                        key: p.key.clone(),
                        metadata: p.metadata,
                        assigned_at: p.assigned_at,
                        unassigned_at: None,
                    },
                );
                self.by_key.insert(p.key, (eni.id.clone(), net, p.ip));
            }
        }
        eni.cidrs.insert(net, cidr);
        Ok(())
    }

    /// Free addresses still in their cooldown at `now`, with their release time.
    #[must_use]
    pub fn cooling_entries(&self, now: SystemTime) -> Vec<(Ipv4Addr, SystemTime)> {
        self.enis
            .values()
            .flat_map(|e| e.cidrs.values())
            .flat_map(|c| c.slots.iter())
            .filter_map(|(ip, slot)| match slot {
                Slot::Free {
                    unassigned_at: Some(t),
                    ..
                } if is_cooling(slot, now, self.cooldown) => Some((*ip, *t)),
                _ => None,
            })
            .collect()
    }

    /// Puts recorded cooldowns back on free addresses (after a restart), so a just-released
    /// address is not handed out again before its cooldown ends.
    pub fn restore_cooling(&mut self, cooling: &[(Ipv4Addr, SystemTime)]) {
        for (ip, t) in cooling {
            for eni in self.enis.values_mut() {
                for cidr in eni.cidrs.values_mut() {
                    if let Some(Slot::Free { unassigned_at, .. }) = cidr.slots.get_mut(ip) {
                        *unassigned_at = Some(*t);
                    }
                }
            }
        }
    }

    /// A repeated ADD of `key` (kubelet retrying): its assignment counts as fresh again, so
    /// `reclaim` does not take it while the retried wiring is in flight.
    pub fn refresh_assigned_at(&mut self, key: &IpamKey, now: SystemTime) {
        if let Some((eni_id, net, ip)) = self.by_key.get(key)
            && let Some(Slot::Assigned { assigned_at, .. }) = self
                .enis
                .get_mut(eni_id)
                .and_then(|e| e.cidrs.get_mut(net))
                .and_then(|c| c.slots.get_mut(ip))
        {
            *assigned_at = now;
        }
    }

    /// Of `ips`, fences (no `assign` hands them out until [`Self::unfence`]) and returns those
    /// no key holds.
    pub fn fence_unheld(&mut self, ips: &[Ipv4Addr]) -> Vec<Ipv4Addr> {
        let unheld: Vec<Ipv4Addr> = ips
            .iter()
            .copied()
            .filter(|ip| self.holder_of(*ip).is_none())
            .collect();
        self.fenced.extend(unheld.iter().copied());
        unheld
    }

    /// Lifts a fence.
    pub fn unfence(&mut self, ips: &[Ipv4Addr]) {
        for ip in ips {
            self.fenced.remove(ip);
        }
    }

    /// Marks an ENI's host networking as set up (or not): addresses of a not-ready ENI are
    /// never assigned and not counted as available.
    pub fn set_host_ready(&mut self, eni_id: &str, ready: bool) -> Result<(), DatastoreError> {
        self.enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?
            .host_ready = ready;
        Ok(())
    }

    /// Removes a CIDR with nothing assigned. Cooling addresses block it unless `force_cooling`.
    pub fn remove_cidr(&mut self, eni_id: &str, net: Ipv4Net) -> Result<(), DatastoreError> {
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        let cidr = eni
            .cidrs
            .get(&net)
            .ok_or(DatastoreError::UnknownCidr(net))?;
        if cidr.assigned() > 0 {
            return Err(DatastoreError::InUse(net.to_string()));
        }
        eni.cidrs.remove(&net);
        Ok(())
    }

    /// Removes an ENI with nothing assigned.
    pub fn remove_eni(&mut self, eni_id: &str) -> Result<Eni, DatastoreError> {
        let eni = self
            .enis
            .get(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        if eni.cidrs.values().any(|c| c.assigned() > 0) {
            return Err(DatastoreError::InUse(eni_id.to_owned()));
        }
        self.enis
            .remove(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))
    }

    /// Assigns an address to `key`. Idempotent: a key that holds one gets the same one back.
    /// Picks, on the lowest-device usable ENI with room, the fullest prefix (so empty ones stay
    /// releasable), then the address free the longest (never-used first).
    pub fn assign(
        &mut self,
        key: &IpamKey,
        metadata: PodMetadata,
        now: SystemTime,
    ) -> Result<Assignment, DatastoreError> {
        if let Some(a) = self.lookup(key) {
            return Ok(a);
        }
        if let Some(p) = self.pending.get(key) {
            return Err(DatastoreError::PendingVerification(p.ip));
        }
        let cooldown = self.cooldown;
        let mut best: Option<(u32, usize, Option<SystemTime>, String, Ipv4Net, Ipv4Addr)> = None;
        for eni in self
            .enis
            .values()
            .filter(|e| !(e.is_trunk || e.is_efa || e.is_excluded || e.gone || !e.host_ready))
        {
            for cidr in eni.cidrs.values().filter(|c| !c.gone) {
                let fullness = usize::MAX - cidr.assigned();
                for (addr, slot) in &cidr.slots {
                    let Slot::Free { unassigned_at, .. } = slot else {
                        continue;
                    };
                    if is_cooling(slot, now, cooldown) || self.fenced.contains(addr) {
                        continue;
                    }
                    let cand = (
                        eni.device_number,
                        fullness,
                        *unassigned_at,
                        eni.id.clone(),
                        cidr.net,
                        *addr,
                    );
                    let better = match &best {
                        None => true,
                        Some(b) => (cand.0, cand.1, cand.2, cand.5) < (b.0, b.1, b.2, b.5),
                    };
                    if better {
                        best = Some(cand);
                    }
                }
            }
        }
        let (_, _, _, eni_id, net, ip) = best.ok_or(DatastoreError::NoAvailableAddress)?;
        let eni = self
            .enis
            .get_mut(&eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.clone()))?;
        let slot = eni
            .cidrs
            .get_mut(&net)
            .and_then(|c| c.slots.get_mut(&ip))
            .ok_or(DatastoreError::UnknownCidr(net))?;
        let prev = match slot {
            Slot::Free { unassigned_at, .. } => *unassigned_at,
            Slot::Assigned { .. } => None,
        };
        *slot = Slot::Assigned {
            key: key.clone(),
            metadata,
            assigned_at: now,
            unassigned_at: prev,
        };
        self.by_key.insert(key.clone(), (eni_id, net, ip));
        self.lookup(key).ok_or(DatastoreError::NoAvailableAddress)
    }

    /// The address `key` holds on a known ENI.
    #[must_use]
    pub fn lookup(&self, key: &IpamKey) -> Option<Assignment> {
        let (eni_id, _, ip) = self.by_key.get(key)?;
        let eni = self.enis.get(eni_id)?;
        Some(Assignment {
            ip: *ip,
            eni_id: eni.id.clone(),
            device_number: eni.device_number,
            route_table: eni.route_table,
        })
    }

    /// Releases `key`'s address; it enters cooldown. Returns what it held. A pending entry is
    /// dropped (returned with no ENI).
    pub fn unassign(
        &mut self,
        key: &IpamKey,
        now: SystemTime,
    ) -> Result<Assignment, DatastoreError> {
        if let Some(p) = self.pending.remove(key) {
            return Ok(Assignment {
                ip: p.ip,
                eni_id: String::new(),
                device_number: 0,
                route_table: 0,
            });
        }
        let a = self
            .lookup(key)
            .ok_or_else(|| DatastoreError::UnknownPod(key.clone()))?;
        let (eni_id, net, ip) = self
            .by_key
            .remove(key)
            .ok_or_else(|| DatastoreError::UnknownPod(key.clone()))?;
        if let Some(slot) = self
            .enis
            .get_mut(&eni_id)
            .and_then(|e| e.cidrs.get_mut(&net))
            .and_then(|c| c.slots.get_mut(&ip))
        {
            let last_assigned_at = match slot {
                Slot::Assigned { assigned_at, .. } => Some(*assigned_at),
                Slot::Free {
                    last_assigned_at, ..
                } => *last_assigned_at,
            };
            *slot = Slot::Free {
                unassigned_at: Some(now),
                last_assigned_at,
            };
        }
        self.drop_empty_gone(&eni_id, net);
        Ok(a)
    }

    /// Removes a quarantined CIDR once nothing in it is assigned, and a quarantined ENI once
    /// nothing on it is.
    fn drop_empty_gone(&mut self, eni_id: &str, net: Ipv4Net) {
        let Some(eni) = self.enis.get_mut(eni_id) else {
            return;
        };
        if (eni.gone || eni.cidrs.get(&net).is_some_and(|c| c.gone))
            && eni.cidrs.get(&net).is_some_and(|c| c.assigned() == 0)
        {
            eni.cidrs.remove(&net);
        }
        if eni.gone && eni.cidrs.values().all(|c| c.assigned() == 0) {
            self.enis.remove(eni_id);
        }
    }

    /// Quarantines a CIDR EC2 no longer lists: removed now if nothing in it is assigned,
    /// otherwise kept for its pods but never handed out again and not counted in the pool.
    pub fn quarantine_cidr(&mut self, eni_id: &str, net: Ipv4Net) -> Result<(), DatastoreError> {
        let cidr = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?
            .cidrs
            .get_mut(&net)
            .ok_or(DatastoreError::UnknownCidr(net))?;
        cidr.gone = true;
        self.drop_empty_gone(eni_id, net);
        Ok(())
    }

    /// Quarantines an ENI EC2 no longer lists (all its CIDRs too); removed at once when empty.
    pub fn quarantine_eni(&mut self, eni_id: &str) -> Result<(), DatastoreError> {
        let eni = self
            .enis
            .get_mut(eni_id)
            .ok_or_else(|| DatastoreError::UnknownEni(eni_id.to_owned()))?;
        eni.gone = true;
        let nets: Vec<Ipv4Net> = eni.cidrs.keys().copied().collect();
        for c in eni.cidrs.values_mut() {
            c.gone = true;
        }
        for net in nets {
            self.drop_empty_gone(eni_id, net);
        }
        if self.enis.get(eni_id).is_some_and(|e| e.cidrs.is_empty()) {
            self.enis.remove(eni_id);
        }
        Ok(())
    }

    /// Lifts the quarantine of every ENI/CIDR EC2 lists again (`listed`: ENI id → CIDRs).
    pub fn unquarantine_listed(&mut self, listed: &BTreeMap<String, Vec<Ipv4Net>>) {
        for (id, nets) in listed {
            if let Some(eni) = self.enis.get_mut(id) {
                eni.gone = false;
                for net in nets {
                    if let Some(c) = eni.cidrs.get_mut(net) {
                        c.gone = false;
                    }
                }
            }
        }
    }

    /// Puts back an assignment exactly as it was (rollback of a failed `unassign`).
    pub fn reassign_exact(
        &mut self,
        key: &IpamKey,
        ip: Ipv4Addr,
        metadata: PodMetadata,
        assigned_at: SystemTime,
    ) {
        for eni in self.enis.values_mut() {
            for cidr in eni.cidrs.values_mut() {
                if let Some(slot) = cidr.slots.get_mut(&ip) {
                    *slot = Slot::Assigned {
                        key: key.clone(),
                        metadata,
                        assigned_at,
                        unassigned_at: None,
                    };
                    self.by_key
                        .insert(key.clone(), (eni.id.clone(), cidr.net, ip));
                    return;
                }
            }
        }
        self.pending.insert(
            key.clone(),
            PendingEntry {
                key: key.clone(),
                ip,
                metadata,
                assigned_at,
            },
        );
    }

    /// Undoes a fresh `assign` (rollback of a failed checkpoint write): the address goes back
    /// to free WITHOUT cooldown, as if never handed out.
    pub fn undo_assign(&mut self, key: &IpamKey) {
        if let Some((eni_id, net, ip)) = self.by_key.remove(key)
            && let Some(slot) = self
                .enis
                .get_mut(&eni_id)
                .and_then(|e| e.cidrs.get_mut(&net))
                .and_then(|c| c.slots.get_mut(&ip))
        {
            let prev = match slot {
                Slot::Assigned { unassigned_at, .. } | Slot::Free { unassigned_at, .. } => {
                    *unassigned_at
                }
            };
            *slot = Slot::Free {
                unassigned_at: prev,
                last_assigned_at: None,
            };
        }
    }

    /// Metadata and assignment time of `key` (for exact rollback).
    #[must_use]
    pub fn assignment_details(&self, key: &IpamKey) -> Option<(PodMetadata, SystemTime)> {
        if let Some(p) = self.pending.get(key) {
            return Some((p.metadata.clone(), p.assigned_at));
        }
        let (eni_id, net, ip) = self.by_key.get(key)?;
        match self.enis.get(eni_id)?.cidrs.get(net)?.slots.get(ip)? {
            Slot::Assigned {
                metadata,
                assigned_at,
                ..
            } => Some((metadata.clone(), *assigned_at)),
            Slot::Free { .. } => None,
        }
    }

    /// Every ENI, by id.
    #[must_use]
    pub fn enis(&self) -> &BTreeMap<String, Eni> {
        &self.enis
    }

    /// Restored entries still waiting for their address to appear on a known ENI.
    #[must_use]
    pub fn pending(&self) -> Vec<PendingEntry> {
        self.pending.values().cloned().collect()
    }

    /// Marks the pending entries whose address EC2 lists on none of this node's ENIs
    /// (`listed` says whether it lists an address): they stop asking for confirmation.
    pub fn mark_pending_absent(&mut self, listed: impl Fn(Ipv4Addr) -> bool) {
        let pending = &self.pending;
        self.absent.retain(|k| pending.contains_key(k));
        for p in self.pending.values() {
            if !listed(p.ip) {
                self.absent.insert(p.key.clone());
            }
        }
    }

    /// Pending entries not yet confirmed absent by EC2: their address may be on one of our
    /// ENIs that the datastore has not caught up with.
    #[must_use]
    pub fn unconfirmed_pending(&self) -> usize {
        self.pending
            .keys()
            .filter(|k| !self.absent.contains(*k))
            .count()
    }

    /// Drops a pending entry after the caller confirmed (e.g. with EC2) the address is gone.
    pub fn drop_pending(&mut self, key: &IpamKey) -> Option<PendingEntry> {
        self.pending.remove(key)
    }

    /// Number of keys holding an address (incl. pending).
    #[must_use]
    pub fn assigned_count(&self) -> usize {
        self.by_key.len() + self.pending.len()
    }

    /// Every assignment as checkpoint entries (incl. pending), sorted by key.
    #[must_use]
    pub fn checkpoint_data(&self) -> CheckpointData {
        let mut allocations: Vec<CheckpointEntry> = Vec::with_capacity(self.assigned_count());
        for eni in self.enis.values() {
            for cidr in eni.cidrs.values() {
                for (ip, slot) in &cidr.slots {
                    if let Slot::Assigned {
                        key,
                        metadata,
                        assigned_at,
                        ..
                    } = slot
                    {
                        allocations.push(CheckpointEntry::new(
                            key.clone(),
                            *ip,
                            metadata.clone(),
                            *assigned_at,
                        ));
                    }
                }
            }
        }
        for p in self.pending.values() {
            allocations.push(CheckpointEntry::new(
                p.key.clone(),
                p.ip,
                p.metadata.clone(),
                p.assigned_at,
            ));
        }
        allocations.sort_by(|a, b| a.key.cmp(&b.key));
        CheckpointData::new(allocations)
    }

    /// Restores assignments from a checkpoint (call after ENIs and CIDRs are registered).
    /// Entries whose address is on no known CIDR are kept as pending (never dropped). An entry
    /// whose address or key is already taken is skipped and returned (a corrupt duplicate).
    pub fn restore(&mut self, data: &CheckpointData) -> Vec<CheckpointEntry> {
        let mut rejected = Vec::new();
        for entry in &data.allocations {
            let Some(ip) = entry.ipv4() else {
                rejected.push(entry.clone());
                continue;
            };
            if self.by_key.contains_key(&entry.key)
                || self.pending.contains_key(&entry.key)
                || self.holder_of(ip).is_some()
            {
                rejected.push(entry.clone());
                continue;
            }
            let when = entry.allocated_at();
            let pending = PendingEntry {
                key: entry.key.clone(),
                ip,
                metadata: entry.metadata.clone(),
                assigned_at: when,
            };
            let mut placed = false;
            for eni in self.enis.values_mut() {
                for cidr in eni.cidrs.values_mut() {
                    if let Some(slot) = cidr.slots.get_mut(&ip) {
                        *slot = Slot::Assigned {
                            key: entry.key.clone(),
                            metadata: entry.metadata.clone(),
                            assigned_at: when,
                            unassigned_at: None,
                        };
                        self.by_key
                            .insert(entry.key.clone(), (eni.id.clone(), cidr.net, ip));
                        placed = true;
                    }
                }
            }
            if !placed {
                self.pending.insert(entry.key.clone(), pending);
            }
        }
        rejected
    }

    /// True when `ip` lies in a CIDR of a registered ENI (an address ipamd could hand out).
    #[must_use]
    pub fn holds_cidr_of(&self, ip: Ipv4Addr) -> bool {
        self.enis
            .values()
            .any(|e| e.cidrs.keys().any(|c| c.contains(&ip)))
    }

    /// The key holding `ip`, if any (incl. pending).
    #[must_use]
    pub fn holder_of(&self, ip: Ipv4Addr) -> Option<IpamKey> {
        for eni in self.enis.values() {
            for cidr in eni.cidrs.values() {
                if let Some(Slot::Assigned { key, .. }) = cidr.slots.get(&ip) {
                    return Some(key.clone());
                }
            }
        }
        self.pending
            .values()
            .find(|p| p.ip == ip)
            .map(|p| p.key.clone())
    }

    /// Pool statistics at `now`.
    #[must_use]
    pub fn stats(&self, now: SystemTime) -> PoolStats {
        let mut s = PoolStats {
            pending: u32_of(self.pending.len()),
            assigned: u32_of(self.pending.len()),
            ..PoolStats::default()
        };
        let mut enis: Vec<&Eni> = self.enis.values().collect();
        enis.sort_by_key(|e| (e.network_card, e.device_number));
        for eni in enis {
            let special =
                eni.is_trunk || eni.is_efa || eni.is_excluded || eni.gone || !eni.host_ready;
            let mut es = EniStats {
                id: eni.id.clone(),
                device_number: eni.device_number,
                is_primary: eni.is_primary,
                is_special: special,
                cidr_count: u32_of(eni.cidrs.values().filter(|c| !c.gone).count()),
                total: 0,
                assigned: 0,
                cooling: 0,
                past_min_lifetime: now
                    .duration_since(eni.created_at)
                    .is_ok_and(|d| d >= self.min_eni_lifetime),
                free_cidrs: Vec::new(),
            };
            for cidr in eni.cidrs.values() {
                let (a, c) = (
                    u32_of(cidr.assigned()),
                    u32_of(cidr.cooling(now, self.cooldown)),
                );
                if cidr.gone || eni.gone {
                    // Held for its pods only: not in the pool, never released through EC2.
                    es.assigned += a;
                    s.quarantined += a;
                    continue;
                }
                es.total += u32_of(cidr.slots.len());
                es.assigned += a;
                es.cooling += c;
                if a == 0 && c == 0 {
                    es.free_cidrs.push(cidr.net);
                }
                if cidr.is_prefix {
                    s.prefixes += 1;
                    if a == 0 && c == 0 {
                        s.free_prefixes += 1;
                    }
                }
            }
            s.assigned += es.assigned;
            if !special {
                s.total += es.total;
                s.cooling += es.cooling;
            } else if !eni.host_ready && !eni.gone {
                // Not assignable until its host setup is done (neither filled nor freed by the
                // policy meanwhile): its assigned addresses are outside the pool.
                s.quarantined += es.assigned;
            }
            if !eni.gone {
                // A quarantined ENI is no longer attached in EC2: it takes no device slot.
                s.enis.push(es);
            }
        }
        s
    }
}

fn u32_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn spec(id: &str, dev: u32) -> EniSpec {
        EniSpec {
            id: id.into(),
            device_number: dev,
            network_card: 0,
            is_primary: dev == 0,
            is_trunk: false,
            is_efa: false,
            is_excluded: false,
            subnet_id: "subnet-1".into(),
            subnet: "198.18.0.0/24".parse().unwrap(),
        }
    }

    fn ds_with(ips: &[&str]) -> DataStore {
        let mut ds = DataStore::new(Duration::from_secs(30));
        ds.add_eni(spec("eni-0", 0), t(0)).unwrap();
        for ip in ips {
            ds.add_cidr("eni-0", format!("{ip}/32").parse().unwrap(), false)
                .unwrap();
        }
        ds
    }

    fn key(c: &str) -> IpamKey {
        IpamKey::new("aws-cni", c, "eth0")
    }

    #[test]
    fn assign_is_idempotent_per_key() {
        let mut ds = ds_with(&["198.18.0.10", "198.18.0.11"]);
        let a = ds.assign(&key("a"), PodMetadata::default(), t(1)).unwrap();
        let again = ds.assign(&key("a"), PodMetadata::default(), t(2)).unwrap();
        assert_eq!(a, again);
        let b = ds.assign(&key("b"), PodMetadata::default(), t(2)).unwrap();
        assert_ne!(a.ip, b.ip);
        assert_eq!(
            ds.assign(&key("c"), PodMetadata::default(), t(3)),
            Err(DatastoreError::NoAvailableAddress)
        );
        assert_eq!(a.route_table, dataplane::conventions::MAIN_TABLE);
    }

    #[test]
    fn cooling_addresses_are_not_available_and_not_reused() {
        let mut ds = ds_with(&["198.18.0.10"]);
        ds.assign(&key("a"), PodMetadata::default(), t(0)).unwrap();
        ds.unassign(&key("a"), t(10)).unwrap();
        let s = ds.stats(t(20));
        assert_eq!((s.total, s.cooling, s.available()), (1, 1, 0));
        assert_eq!(
            ds.assign(&key("b"), PodMetadata::default(), t(20)),
            Err(DatastoreError::NoAvailableAddress)
        );
        assert_eq!(ds.stats(t(40)).available(), 1);
        assert!(ds.assign(&key("b"), PodMetadata::default(), t(40)).is_ok());
    }

    #[test]
    fn reuse_prefers_longest_free() {
        let mut ds = DataStore::new(Duration::ZERO);
        ds.add_eni(spec("eni-0", 0), t(0)).unwrap();
        for ip in ["198.18.0.10", "198.18.0.11", "198.18.0.12"] {
            ds.add_cidr("eni-0", format!("{ip}/32").parse().unwrap(), false)
                .unwrap();
        }
        for c in ["a", "b", "c"] {
            ds.assign(&key(c), PodMetadata::default(), t(0)).unwrap();
        }
        ds.unassign(&key("b"), t(5)).unwrap(); // .11 freed at 5
        ds.unassign(&key("a"), t(7)).unwrap(); // .10 freed at 7
        let d = ds.assign(&key("d"), PodMetadata::default(), t(9)).unwrap();
        assert_eq!(d.ip, "198.18.0.11".parse::<Ipv4Addr>().unwrap());
    }

    #[test]
    fn prefixes_pack_into_the_fullest() {
        let mut ds = DataStore::new(Duration::ZERO);
        ds.add_eni(spec("eni-0", 0), t(0)).unwrap();
        ds.add_cidr("eni-0", "198.18.0.16/28".parse().unwrap(), true)
            .unwrap();
        ds.add_cidr("eni-0", "198.18.0.32/28".parse().unwrap(), true)
            .unwrap();
        let a = ds.assign(&key("a"), PodMetadata::default(), t(0)).unwrap();
        for i in 0..5 {
            let b = ds
                .assign(&key(&format!("x{i}")), PodMetadata::default(), t(0))
                .unwrap();
            assert!(
                "198.18.0.16/28".parse::<Ipv4Net>().unwrap().contains(&b.ip)
                    == "198.18.0.16/28".parse::<Ipv4Net>().unwrap().contains(&a.ip)
            );
        }
        let s = ds.stats(t(0));
        assert_eq!((s.total, s.prefixes, s.free_prefixes), (32, 2, 1));
    }

    #[test]
    fn in_use_cidrs_and_enis_cannot_be_removed() {
        let mut ds = ds_with(&["198.18.0.10"]);
        ds.add_eni(spec("eni-1", 1), t(0)).unwrap();
        ds.add_cidr("eni-1", "198.18.0.20/32".parse().unwrap(), false)
            .unwrap();
        ds.assign(&key("a"), PodMetadata::default(), t(0)).unwrap();
        assert!(matches!(
            ds.remove_cidr("eni-0", "198.18.0.10/32".parse().unwrap()),
            Err(DatastoreError::InUse(_))
        ));
        assert!(ds.remove_eni("eni-1").is_ok());
        assert!(matches!(
            ds.add_cidr("eni-0", "198.18.0.10/32".parse().unwrap(), false),
            Err(DatastoreError::DuplicateCidr(_))
        ));
    }

    #[test]
    fn restore_keeps_unknown_addresses_pending_and_adopts_them_later() {
        let mut ds = ds_with(&["198.18.0.10"]);
        ds.assign(&key("a"), PodMetadata::default(), t(0)).unwrap();
        let mut data = ds.checkpoint_data();
        data.allocations.push(CheckpointEntry::new(
            key("b"),
            "198.18.0.99".parse().unwrap(),
            PodMetadata::default(),
            t(1),
        ));
        let mut fresh = ds_with(&["198.18.0.10"]);
        assert!(fresh.restore(&data).is_empty());
        assert_eq!(fresh.pending().len(), 1);
        assert_eq!(
            fresh.checkpoint_data().allocations.len(),
            2,
            "pending entries are written back"
        );
        assert_eq!(
            fresh.assign(&key("b"), PodMetadata::default(), t(2)),
            Err(DatastoreError::PendingVerification(
                "198.18.0.99".parse().unwrap()
            ))
        );
        fresh
            .add_cidr("eni-0", "198.18.0.99/32".parse().unwrap(), false)
            .unwrap();
        assert!(fresh.pending().is_empty());
        assert_eq!(
            fresh.lookup(&key("b")).unwrap().ip,
            "198.18.0.99".parse::<Ipv4Addr>().unwrap()
        );
        assert_eq!(
            fresh.lookup(&key("a")).unwrap().ip,
            "198.18.0.10".parse::<Ipv4Addr>().unwrap()
        );
    }

    #[test]
    fn restore_rejects_duplicates() {
        let ds = ds_with(&["198.18.0.10"]);
        let data = CheckpointData::new(vec![
            CheckpointEntry::new(
                key("a"),
                "198.18.0.10".parse().unwrap(),
                PodMetadata::default(),
                t(0),
            ),
            CheckpointEntry::new(
                key("b"),
                "198.18.0.10".parse().unwrap(),
                PodMetadata::default(),
                t(0),
            ),
        ]);
        let mut fresh = ds.clone();
        assert_eq!(fresh.restore(&data).len(), 1);
        assert_eq!(fresh.assigned_count(), 1);
    }

    #[test]
    fn stats_and_min_lifetime() {
        let mut ds = ds_with(&["198.18.0.10", "198.18.0.11"]);
        ds.add_eni(spec("eni-1", 1), t(100)).unwrap();
        ds.add_cidr("eni-1", "198.18.0.20/32".parse().unwrap(), false)
            .unwrap();
        ds.assign(&key("a"), PodMetadata::default(), t(100))
            .unwrap();
        let s = ds.stats(t(130));
        assert_eq!((s.total, s.assigned, s.available()), (3, 1, 2));
        assert!(!s.enis[1].past_min_lifetime);
        assert!(ds.stats(t(160)).enis[1].past_min_lifetime);
        assert_eq!(s.enis[1].free_cidrs.len(), 1);
    }
}
