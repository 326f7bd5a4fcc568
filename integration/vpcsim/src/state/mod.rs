//! The simulated EC2 state: VPC, subnets, security groups, instances, ENIs and their
//! addresses, and the operations on them with EC2's rules (limits, reserved addresses, aligned
//! prefixes, protected primary ENI/IP). Pure and synchronous: no HTTP, no clock reads (callers
//! pass `Now`), no knobs.

mod addressing;
mod error;
pub mod filter;
mod ops;
mod sgp;

pub use error::StateError;
pub use ops::{
    AssignIpv4, AssignIpv6, CreateEni, CreateSubnet, Direction, ModifyEni, RunInstances,
    TerminatedInstance,
};
pub use sgp::{SgRule, TrunkAssociation};

use crate::config::WorldConfig;
use crate::limits;
use ipnet::{Ipv4Net, Ipv6Net};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Instant;
use time::OffsetDateTime;

/// A point in simulated time: the monotonic instant (for delays) and the wall time it stands
/// for (for timestamps EC2 reports).
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Monotonic instant.
    pub instant: Instant,
    /// Wall-clock time reported in responses.
    pub wall: OffsetDateTime,
}

/// The VPC.
#[derive(Debug, Clone, Serialize)]
pub struct Vpc {
    /// `vpc-...`
    pub id: String,
    /// Primary IPv4 CIDR.
    pub cidr: Ipv4Net,
    /// Secondary IPv4 CIDR blocks.
    pub secondary_cidrs: Vec<Ipv4Net>,
    /// IPv6 CIDR.
    pub ipv6_cidr: Option<Ipv6Net>,
}

impl Vpc {
    /// Every IPv4 CIDR block, primary first.
    pub fn cidr_blocks(&self) -> Vec<Ipv4Net> {
        let mut v = vec![self.cidr];
        v.extend(self.secondary_cidrs.iter().copied());
        v
    }
}

/// A subnet.
#[derive(Debug, Clone, Serialize)]
pub struct Subnet {
    /// `subnet-...`
    pub id: String,
    /// IPv4 CIDR.
    pub cidr: Ipv4Net,
    /// IPv6 CIDR.
    pub ipv6_cidr: Option<Ipv6Net>,
    /// Availability zone.
    pub availability_zone: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// IPv4 CIDR reservations (`CreateSubnetCidrReservation`).
    pub reservations: Vec<CidrReservation>,
}

/// One subnet CIDR reservation. `prefix`: EC2 delegates prefixes from it (first) and never
/// picks a secondary address in it; `explicit`: only addresses asked for by name.
#[derive(Debug, Clone, Serialize)]
pub struct CidrReservation {
    /// `scr-...`
    pub id: String,
    /// The reserved block, inside the subnet.
    pub cidr: Ipv4Net,
    /// `prefix` or `explicit`.
    pub kind: ReservationKind,
    /// Description.
    pub description: String,
}

/// `ReservationType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReservationKind {
    /// Prefix delegation only.
    Prefix,
    /// Explicit assignment only.
    Explicit,
}

impl ReservationKind {
    /// EC2's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationKind::Prefix => "prefix",
            ReservationKind::Explicit => "explicit",
        }
    }
}

/// A security group.
#[derive(Debug, Clone, Serialize)]
pub struct SecurityGroup {
    /// `sg-...`
    pub id: String,
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// The VPC it belongs to (this VPC's id, or another one's).
    pub vpc_id: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Ingress rules (`AuthorizeSecurityGroupIngress`).
    pub ingress: Vec<SgRule>,
    /// Egress rules (EC2's default: everything out).
    pub egress: Vec<SgRule>,
}

/// Instance lifecycle states the simulator models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Running (code 16).
    Running,
    /// Terminated (code 48).
    Terminated,
}

impl InstanceState {
    /// EC2's state code.
    pub fn code(self) -> u32 {
        match self {
            Self::Running => 16,
            Self::Terminated => 48,
        }
    }
    /// EC2's state name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Terminated => "terminated",
        }
    }
}

/// An instance.
#[derive(Debug, Clone, Serialize)]
pub struct Instance {
    /// `i-...`
    pub id: String,
    /// Instance type.
    pub instance_type: String,
    /// Subnet of the primary ENI.
    pub subnet_id: String,
    /// Availability zone (its subnet's).
    pub availability_zone: String,
    /// Lifecycle state.
    pub state: InstanceState,
    /// Launch time.
    #[serde(with = "time::serde::rfc3339")]
    pub launch_time: OffsetDateTime,
    /// The primary ENI (device index 0).
    pub primary_eni: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

/// An ENI attachment.
#[derive(Debug, Clone, Serialize)]
pub struct Attachment {
    /// `eni-attach-...`
    pub id: String,
    /// Instance it is attached to.
    pub instance_id: String,
    /// Device index (counted per network card, as EC2 does: each card has its own 0..).
    pub device_index: u32,
    /// Network card index (`NetworkCardIndex` of AttachNetworkInterface; 0 by default).
    pub network_card_index: u32,
    /// Delete the ENI when the instance terminates.
    pub delete_on_termination: bool,
    /// Wall time of the attach.
    #[serde(with = "time::serde::rfc3339")]
    pub attach_time: OffsetDateTime,
    /// Monotonic time of the attach (drives the attach-visibility delay).
    #[serde(skip)]
    pub attached_at: Option<Instant>,
}

/// An ENI's connection-tracking timeouts in seconds (`ConnectionTrackingSpecification` on
/// CreateNetworkInterface / ModifyNetworkInterfaceAttribute, `connectionTrackingConfiguration`
/// in Describe). EC2's documented ranges: TCP established 60–432000, UDP stream 60–180, UDP
/// 30–60; a field never set is not described.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ConnTracking {
    /// `TcpEstablishedTimeout`.
    pub tcp_established_timeout: Option<u32>,
    /// `UdpStreamTimeout`.
    pub udp_stream_timeout: Option<u32>,
    /// `UdpTimeout`.
    pub udp_timeout: Option<u32>,
}

impl ConnTracking {
    /// EC2's ranges (`InvalidParameterValue` outside them; the code is *unverified*).
    pub fn validate(&self) -> Result<(), StateError> {
        for (name, v, lo, hi) in [
            (
                "TcpEstablishedTimeout",
                self.tcp_established_timeout,
                60,
                432_000,
            ),
            ("UdpStreamTimeout", self.udp_stream_timeout, 60, 180),
            ("UdpTimeout", self.udp_timeout, 30, 60),
        ] {
            if let Some(v) = v
                && !(lo..=hi).contains(&v)
            {
                return Err(StateError::InvalidParameterValue(format!(
                    "{name} must be between {lo} and {hi} seconds"
                )));
            }
        }
        Ok(())
    }

    /// Later settings override earlier ones field by field (a Modify changes what it names).
    #[must_use]
    pub fn merged(self, newer: Self) -> Self {
        Self {
            tcp_established_timeout: newer
                .tcp_established_timeout
                .or(self.tcp_established_timeout),
            udp_stream_timeout: newer.udp_stream_timeout.or(self.udp_stream_timeout),
            udp_timeout: newer.udp_timeout.or(self.udp_timeout),
        }
    }
}

/// An elastic network interface.
#[derive(Debug, Clone, Serialize)]
pub struct Eni {
    /// `eni-...`
    pub id: String,
    /// Subnet.
    pub subnet_id: String,
    /// Description.
    pub description: String,
    /// MAC address.
    pub mac: String,
    /// Security group ids.
    pub groups: Vec<String>,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Private IPv4 addresses; `[0]` is the primary.
    pub private_ips: Vec<Ipv4Addr>,
    /// Delegated /28 prefixes.
    pub ipv4_prefixes: Vec<Ipv4Net>,
    /// IPv6 addresses.
    pub ipv6_addresses: Vec<Ipv6Addr>,
    /// Delegated /80 prefixes.
    pub ipv6_prefixes: Vec<Ipv6Net>,
    /// Source/destination check.
    pub source_dest_check: bool,
    /// Attachment, if attached.
    pub attachment: Option<Attachment>,
    /// Connection tracking, when set.
    pub conntrack: Option<ConnTracking>,
    /// Monotonic creation time when known (drives the `describe_lag_ms` knob).
    #[serde(skip)]
    pub created_at: Option<Instant>,
    /// `InterfaceType` as created: `interface` or `trunk` (a branch is an `interface`
    /// associated with a trunk: [`State::described_type`]).
    pub interface_type: String,
}

impl Eni {
    /// `in-use` when attached, else `available`.
    pub fn status(&self) -> &'static str {
        if self.attachment.is_some() {
            "in-use"
        } else {
            "available"
        }
    }
    /// The primary private IPv4 address.
    pub fn primary_ip(&self) -> Ipv4Addr {
        self.private_ips[0]
    }
    /// IPv4 slots used: addresses plus prefixes (EC2 counts each /28 as one slot).
    pub fn ipv4_slots(&self) -> usize {
        self.private_ips.len() + self.ipv4_prefixes.len()
    }
    /// IPv6 slots used.
    pub fn ipv6_slots(&self) -> usize {
        self.ipv6_addresses.len() + self.ipv6_prefixes.len()
    }
}

/// The whole simulated EC2 world state.
#[derive(Debug, Clone, Serialize)]
pub struct State {
    /// Account id used as owner.
    pub account_id: String,
    /// Region.
    pub region: String,
    /// The default availability zone (of subnets configured without one).
    pub availability_zone: String,
    /// The VPC.
    pub vpc: Vpc,
    /// Subnets by id.
    pub subnets: BTreeMap<String, Subnet>,
    /// Security groups by id.
    pub security_groups: BTreeMap<String, SecurityGroup>,
    /// Instances by id.
    pub instances: BTreeMap<String, Instance>,
    /// ENIs by id.
    pub enis: BTreeMap<String, Eni>,
    /// Branch-to-trunk associations (`AssociateTrunkInterface`) by association id.
    pub trunk_associations: BTreeMap<String, TrunkAssociation>,
    #[serde(skip)]
    next_id: u64,
    /// Random source for address picks when `WorldConfig::random_addresses` is set.
    #[serde(skip)]
    rng: Option<addressing::Rng>,
}

impl State {
    /// A fresh world from `config`.
    pub fn new(config: &WorldConfig) -> Self {
        let mut state = Self {
            account_id: config.account_id.clone(),
            region: config.region.clone(),
            availability_zone: config.availability_zone.clone(),
            vpc: Vpc {
                id: String::new(),
                cidr: config.vpc_cidr,
                secondary_cidrs: config.secondary_cidrs.clone(),
                ipv6_cidr: config.vpc_ipv6_cidr,
            },
            subnets: BTreeMap::new(),
            security_groups: BTreeMap::new(),
            instances: BTreeMap::new(),
            enis: BTreeMap::new(),
            trunk_associations: BTreeMap::new(),
            next_id: 0,
            rng: config.random_addresses.map(addressing::Rng::new),
        };
        state.vpc.id = state.mint("vpc");
        for sn in &config.subnets {
            let id = state.mint("subnet");
            state.subnets.insert(
                id.clone(),
                Subnet {
                    id,
                    cidr: sn.cidr.trunc(),
                    ipv6_cidr: sn.ipv6_cidr.map(|c| c.trunc()),
                    availability_zone: config.subnet_az(sn).to_owned(),
                    tags: sn.tags.clone(),
                    reservations: Vec::new(),
                },
            );
        }
        let other_vpc = config
            .security_groups
            .iter()
            .any(|g| g.other_vpc)
            .then(|| state.mint("vpc"));
        for sg in &config.security_groups {
            let id = state.mint("sg");
            let vpc_id = match (&other_vpc, sg.other_vpc) {
                (Some(other), true) => other.clone(),
                _ => state.vpc.id.clone(),
            };
            // EC2's default group lets its own members in; every group lets everything out.
            let ingress = if sg.name == "default" {
                vec![SgRule::from_group("-1", None, None, &id)]
            } else {
                Vec::new()
            };
            state.security_groups.insert(
                id.clone(),
                SecurityGroup {
                    id,
                    name: sg.name.clone(),
                    description: sg.description.clone(),
                    vpc_id,
                    tags: BTreeMap::new(),
                    ingress,
                    egress: SgRule::default_egress(),
                },
            );
        }
        state
    }

    /// A new id `<prefix>-<17 hex digits>`; ids sort in creation order.
    fn mint(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-0{:016x}", self.next_id)
    }

    /// A new locally administered MAC.
    fn mint_mac(&mut self) -> String {
        self.next_id += 1;
        let n = self.next_id;
        format!(
            "02:5e:{:02x}:{:02x}:{:02x}:{:02x}",
            (n >> 24) & 0xff,
            (n >> 16) & 0xff,
            (n >> 8) & 0xff,
            n & 0xff
        )
    }

    /// The default subnet (first configured).
    pub fn default_subnet(&self) -> Option<&Subnet> {
        self.subnets.values().next()
    }

    /// The default security group (first configured).
    pub fn default_group(&self) -> Option<&SecurityGroup> {
        self.security_groups.values().next()
    }

    /// ENI by id.
    pub fn eni(&self, id: &str) -> Result<&Eni, StateError> {
        self.enis
            .get(id)
            .ok_or_else(|| StateError::EniNotFound(id.to_owned()))
    }

    /// The zone of subnet `subnet_id` (the default zone for an unknown one).
    pub fn subnet_az(&self, subnet_id: &str) -> &str {
        self.subnets
            .get(subnet_id)
            .map_or(self.availability_zone.as_str(), |s| {
                s.availability_zone.as_str()
            })
    }

    /// Instance by id.
    pub fn instance(&self, id: &str) -> Result<&Instance, StateError> {
        self.instances
            .get(id)
            .ok_or_else(|| StateError::InstanceNotFound(id.to_owned()))
    }

    /// Record when `eni_id` was created (for eventual-consistency simulation).
    pub fn stamp_created(&mut self, eni_id: &str, now: Now) {
        if let Some(e) = self.enis.get_mut(eni_id) {
            e.created_at = Some(now.instant);
        }
    }

    /// ENIs attached to `instance_id`, by device index.
    pub fn enis_of(&self, instance_id: &str) -> Vec<&Eni> {
        let mut out: Vec<&Eni> = self
            .enis
            .values()
            .filter(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == instance_id)
            })
            .collect();
        out.sort_by_key(|e| {
            e.attachment
                .as_ref()
                .map(|a| (a.network_card_index, a.device_index))
        });
        out
    }

    /// Free IPv4 addresses in a subnet (EC2's `AvailableIpAddressCount`).
    pub fn available_ip_count(&self, subnet_id: &str) -> u64 {
        let Some(subnet) = self.subnets.get(subnet_id) else {
            return 0;
        };
        let used = self.used_ipv4(subnet_id).len() as u64;
        addressing::usable_count(subnet.cidr).saturating_sub(used)
    }

    /// Networking limits of an instance's type.
    pub fn limits_of(&self, instance: &Instance) -> &'static limits::InstanceLimits {
        limits::lookup(&instance.instance_type).unwrap_or(&limits::INSTANCE_TYPES[0])
    }
}
