//! `FabricView`: a plain-data snapshot of what the network fabric (and IMDS) must show at one
//! instant: the VPC, its subnets, and per instance the ENIs visible on it now (attach delay
//! applied). Owns only these value types; it must not reach back into the world.

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use std::net::{Ipv4Addr, Ipv6Addr};

/// What the fabric must reconcile the kernel to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricView {
    /// VPC id.
    pub vpc_id: String,
    /// VPC primary IPv4 CIDR.
    pub vpc_cidr: Ipv4Net,
    /// Every IPv4 CIDR block of the VPC, primary first (IMDS `vpc-ipv4-cidr-blocks`).
    #[serde(default)]
    pub vpc_cidrs: Vec<Ipv4Net>,
    /// VPC IPv6 CIDR, if any.
    pub vpc_ipv6_cidr: Option<Ipv6Net>,
    /// Region (IMDS `placement/region`).
    pub region: String,
    /// The world's default availability zone (each instance carries its own).
    pub availability_zone: String,
    /// Every subnet.
    pub subnets: Vec<SubnetView>,
    /// Every instance, running or terminated.
    pub instances: Vec<InstanceView>,
    /// Every security group with its rules (what the fabric enforces for branch ENIs, and for
    /// every ENI when `eni_groups_enforced`).
    #[serde(default)]
    pub security_groups: Vec<SecurityGroupView>,
    /// The router filters every ENI by its groups (`Knobs::enforce_eni_security_groups`).
    #[serde(default)]
    pub eni_groups_enforced: bool,
}

/// One subnet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubnetView {
    /// Subnet id.
    pub subnet_id: String,
    /// IPv4 CIDR.
    pub cidr: Ipv4Net,
    /// The VPC router's address in the subnet: network address + 1 (AWS convention).
    pub gateway: Ipv4Addr,
    /// IPv6 CIDR, if any.
    pub ipv6_cidr: Option<Ipv6Net>,
    /// Availability zone.
    #[serde(default)]
    pub availability_zone: String,
}

/// One instance and what is attached to it right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceView {
    /// Instance id (`i-...`).
    pub instance_id: String,
    /// Instance type (`m5.large`).
    pub instance_type: String,
    /// Availability zone (its subnet's; IMDS `placement/availability-zone`).
    #[serde(default)]
    pub availability_zone: String,
    /// False once terminated (then `enis` is empty).
    pub running: bool,
    /// ENIs visible on the instance, sorted by device index; index 0 is the primary (eth0).
    pub enis: Vec<EniView>,
}

impl InstanceView {
    /// The primary ENI (device index 0 of network card 0), if visible.
    pub fn primary(&self) -> Option<&EniView> {
        self.enis
            .iter()
            .find(|e| e.device_index == 0 && e.network_card_index == 0)
    }

    /// The primary ENI's first IPv6 address (what the fabric puts on `eth0`), if any.
    pub fn primary_ipv6(&self) -> Option<std::net::Ipv6Addr> {
        self.primary()
            .and_then(|e| e.ipv6_addresses.first().copied())
    }
}

/// One ENI as the instance sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EniView {
    /// ENI id (`eni-...`).
    pub eni_id: String,
    /// Device index (0 = eth0).
    pub device_index: u32,
    /// Network card index (always 0 here).
    pub network_card_index: u32,
    /// MAC address, lower-case `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// Primary private IPv4 address.
    pub primary_ip: Ipv4Addr,
    /// Secondary private IPv4 addresses, in assignment order.
    pub secondary_ips: Vec<Ipv4Addr>,
    /// Delegated IPv4 /28 prefixes.
    pub ipv4_prefixes: Vec<Ipv4Net>,
    /// IPv6 addresses.
    pub ipv6_addresses: Vec<Ipv6Addr>,
    /// Delegated IPv6 /80 prefixes.
    pub ipv6_prefixes: Vec<Ipv6Net>,
    /// Subnet id.
    pub subnet_id: String,
    /// Subnet IPv4 CIDR.
    pub subnet_cidr: Ipv4Net,
    /// Subnet IPv6 CIDR, if any.
    pub subnet_ipv6_cidr: Option<Ipv6Net>,
    /// Security group ids.
    pub security_groups: Vec<String>,
    /// Source/destination check on (EC2 default); `ModifyNetworkInterfaceAttribute
    /// SourceDestCheck.Value=false` turns it off for this ENI.
    pub source_dest_check: bool,
    /// EC2 `InterfaceType`: `interface` (default) or `trunk`.
    #[serde(default = "default_interface_type")]
    pub interface_type: String,
    /// For a trunk ENI: the branch ENIs associated with it (`AssociateTrunkInterface`), in
    /// VLAN id order. Empty for every other ENI.
    #[serde(default)]
    pub branches: Vec<BranchView>,
}

fn default_interface_type() -> String {
    "interface".to_string()
}

/// One branch ENI associated with a trunk ENI: its traffic crosses the trunk's link tagged
/// with `vlan_id`, and the fabric applies `security_groups` to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchView {
    /// Branch ENI id (`eni-...`).
    pub eni_id: String,
    /// 802.1Q VLAN id (1..=4094) on the trunk.
    pub vlan_id: u16,
    /// MAC address, lower-case.
    pub mac: String,
    /// Primary private IPv4 address.
    pub primary_ip: Ipv4Addr,
    /// IPv6 addresses.
    #[serde(default)]
    pub ipv6_addresses: Vec<Ipv6Addr>,
    /// Subnet id.
    pub subnet_id: String,
    /// Subnet IPv4 CIDR.
    pub subnet_cidr: Ipv4Net,
    /// Subnet IPv6 CIDR, if any.
    #[serde(default)]
    pub subnet_ipv6_cidr: Option<Ipv6Net>,
    /// Security group ids (what the fabric enforces for this branch).
    pub security_groups: Vec<String>,
}

/// One security group and its rules. EC2 semantics: stateful; a packet is allowed in (out)
/// if any ingress (egress) rule of any of the ENI's groups matches; replies of allowed flows
/// are allowed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityGroupView {
    /// Group id (`sg-...`).
    pub group_id: String,
    /// Ingress rules.
    pub ingress: Vec<SgRuleView>,
    /// Egress rules.
    pub egress: Vec<SgRuleView>,
}

/// One security-group rule (`IpPermission`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SgRuleView {
    /// `-1` (all), `tcp`, `udp`, `icmp`, `icmpv6`.
    pub protocol: String,
    /// First port (TCP/UDP), or ICMP type; `None` for all.
    pub from_port: Option<i32>,
    /// Last port (TCP/UDP), or ICMP code; `None` for all.
    pub to_port: Option<i32>,
    /// Peer CIDRs (IPv4 and IPv6).
    pub cidrs: Vec<ipnet::IpNet>,
    /// Peer security groups: any ENI (or branch) carrying one of these groups.
    pub groups: Vec<String>,
}

impl EniView {
    /// The MAC as six bytes.
    pub fn mac_bytes(&self) -> [u8; 6] {
        let mut out = [0u8; 6];
        for (slot, part) in out.iter_mut().zip(self.mac.split(':')) {
            *slot = u8::from_str_radix(part, 16).unwrap_or(0);
        }
        out
    }

    /// True if `ip` is an IPv4 address of this ENI (primary, secondary or inside a prefix):
    /// the source/destination check.
    pub fn owns_ipv4(&self, ip: Ipv4Addr) -> bool {
        self.primary_ip == ip
            || self.secondary_ips.contains(&ip)
            || self.ipv4_prefixes.iter().any(|p| p.contains(&ip))
    }
}

impl FabricView {
    /// The instance with `instance_id`.
    pub fn instance(&self, instance_id: &str) -> Option<&InstanceView> {
        self.instances.iter().find(|i| i.instance_id == instance_id)
    }
}
