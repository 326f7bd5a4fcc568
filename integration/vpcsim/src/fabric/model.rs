//! The fabric's own model: what the kernel should look like (`Desired`, derived from the EC2
//! world's `FabricView`) and what it looks like (`Observed`). Plain data; must not touch the
//! kernel or the world.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::view::SecurityGroupView;

/// The fabric as the EC2 world says it should be right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// VPC CIDR blocks (unreachable in the router unless an ENI owns the address).
    pub vpc_cidrs: BTreeSet<Ipv4Net>,
    /// The VPC's IPv6 CIDR (unreachable in the router unless an ENI owns the address; the
    /// egress-only gateway passes its sources out).
    pub vpc_ipv6_cidr: Option<Ipv6Net>,
    /// Subnet gateways (`subnet base + 1`), answered by the router.
    pub gateways: BTreeSet<Ipv4Addr>,
    /// Nodes by instance id.
    pub nodes: BTreeMap<String, DesiredNode>,
    /// Security groups by id (enforced by the router for branch ENIs, and for every ENI when
    /// `eni_groups_enforced`).
    pub security_groups: BTreeMap<String, SecurityGroupView>,
    /// The router filters every ENI port by its ENI's groups, not only branch ports.
    pub eni_groups_enforced: bool,
}

/// One instance, i.e. one node namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredNode {
    /// EC2 instance id.
    pub instance_id: String,
    /// ENIs visible on the instance right now, by device index.
    pub enis: BTreeMap<u32, DesiredEni>,
}

impl DesiredNode {
    /// The primary private IP (of the device-index-0 ENI), the only source the IGW forwards.
    pub fn primary_ip(&self) -> Option<Ipv4Addr> {
        self.enis.get(&0).map(|e| e.primary_ip)
    }

    /// The primary ENI's first IPv6 address: what the instance's DHCPv6 client puts on `eth0`.
    pub fn primary_ipv6(&self) -> Option<Ipv6Addr> {
        self.enis
            .get(&0)
            .and_then(|e| e.ipv6_addresses.first().copied())
    }
}

/// One attached ENI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredEni {
    /// `eni-...`
    pub eni_id: String,
    /// Device index (0 = primary ENI, `eth0`).
    pub device_index: u32,
    /// MAC as EC2 reports it (`02:xx:..`).
    pub mac: String,
    /// The ENI's primary private IP.
    pub primary_ip: Ipv4Addr,
    /// Secondary private IPs.
    pub secondary_ips: BTreeSet<Ipv4Addr>,
    /// Delegated /28 prefixes.
    pub prefixes: BTreeSet<Ipv4Net>,
    /// The subnet's CIDR.
    pub subnet_cidr: Ipv4Net,
    /// The subnet's gateway.
    pub gateway: Ipv4Addr,
    /// IPv6 addresses, in assignment order (the first is the ENI's primary IPv6).
    pub ipv6_addresses: Vec<Ipv6Addr>,
    /// Delegated /80 prefixes.
    pub ipv6_prefixes: BTreeSet<Ipv6Net>,
    /// Security group ids (a rule naming one of them as its peer matches this ENI's
    /// addresses; the ENI's own traffic is filtered by them when `eni_groups_enforced`).
    pub security_groups: BTreeSet<String>,
    /// For a trunk ENI (`InterfaceType=trunk`): its branch ENIs, by VLAN id. Empty otherwise.
    pub branches: BTreeMap<u16, DesiredBranch>,
}

/// A branch ENI on a trunk: its traffic crosses the trunk's link tagged with `vlan_id`; the
/// router reaches it through a VLAN sub-interface of the trunk's port and applies its
/// security groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredBranch {
    /// `eni-...`
    pub eni_id: String,
    /// 802.1Q VLAN id.
    pub vlan_id: u16,
    /// MAC (lowercase): the permanent neighbour of the branch address.
    pub mac: String,
    /// The branch's private IPv4 address.
    pub primary_ip: Ipv4Addr,
    /// Security group ids (default deny when empty).
    pub security_groups: BTreeSet<String>,
}

impl DesiredEni {
    /// Every source this ENI may send from (and every destination the router delivers to it).
    pub fn owned(&self) -> Vec<Ipv4Net> {
        let mut v = vec![host(self.primary_ip)];
        v.extend(self.secondary_ips.iter().copied().map(host));
        v.extend(self.prefixes.iter().copied());
        v
    }

    /// Every IPv6 source this ENI may send from (and destination the router delivers to it).
    pub fn owned6(&self) -> Vec<Ipv6Net> {
        let mut v: Vec<Ipv6Net> = self.ipv6_addresses.iter().copied().map(host6).collect();
        v.extend(self.ipv6_prefixes.iter().copied());
        v
    }

    /// True if the ENI has any IPv6 address or prefix (then the router routes IPv6 to it).
    pub fn has_ipv6(&self) -> bool {
        !self.ipv6_addresses.is_empty() || !self.ipv6_prefixes.is_empty()
    }

    /// The node end's EUI-64 link-local address (derived from the ENI's MAC as the kernel
    /// derives it): the router's IPv6 next hop for everything the ENI owns.
    pub fn link_local(&self) -> Ipv6Addr {
        eui64_link_local(&self.mac)
    }
}

/// `fe80::` + the modified EUI-64 of `mac` (`aa:bb:cc:dd:ee:ff`).
pub fn eui64_link_local(mac: &str) -> Ipv6Addr {
    let mut b = [0u8; 6];
    for (slot, part) in b.iter_mut().zip(mac.split(':')) {
        *slot = u8::from_str_radix(part, 16).unwrap_or(0);
    }
    let seg = |hi: u8, lo: u8| (u16::from(hi) << 8) | u16::from(lo);
    Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        seg(b[0] ^ 0x02, b[1]),
        seg(b[2], 0xff),
        seg(0xfe, b[3]),
        seg(b[4], b[5]),
    )
}

/// `ip/128`.
pub fn host6(ip: Ipv6Addr) -> Ipv6Net {
    Ipv6Net::new(ip, 128).unwrap_or_else(|_| unreachable!("128 is a valid prefix length"))
}

/// `ip/32`.
pub fn host(ip: Ipv4Addr) -> Ipv4Net {
    Ipv4Net::new(ip, 32).unwrap_or_else(|_| unreachable!("32 is a valid prefix length"))
}

/// How the router reaches a destination.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum RouteTarget {
    /// Directly on an ENI port (the ENI's primary IP).
    Port {
        /// router-side port
        dev: String,
    },
    /// Via the ENI's primary IP on its port (secondary IPs and prefixes), `onlink`.
    Via {
        /// next hop (the ENI's primary IP, or for IPv6 the node end's link-local address; a
        /// permanent neighbour on the port)
        via: IpAddr,
        /// router-side port
        dev: String,
    },
    /// Unassigned VPC addresses.
    Unreachable,
}

/// A link in a node namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLink {
    /// Interface name (`ethN`).
    pub name: String,
    /// MAC address, lowercase.
    pub mac: String,
    /// `ifalias` (the ENI id, set by the fabric).
    pub alias: Option<String>,
}

/// A permanent neighbour in the router.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Neighbour {
    /// port
    pub dev: String,
    /// address
    pub ip: IpAddr,
    /// MAC, lowercase
    pub mac: String,
}

/// The kernel state the fabric manages, as read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Node namespaces of this run, by instance id.
    pub node_namespaces: BTreeSet<String>,
    /// Router-side ENI ports: name -> alias (ENI id).
    pub ports: BTreeMap<String, Option<String>>,
    /// Links in each node namespace (ENI links only: names `ethN`), by instance id.
    pub node_links: BTreeMap<String, Vec<NodeLink>>,
    /// Router routes the fabric manages (on ENI ports, and unreachable ones).
    pub routes: BTreeMap<IpNet, RouteTarget>,
    /// Permanent neighbours on ENI ports.
    pub neighbours: BTreeSet<Neighbour>,
    /// /32 addresses on the router's `lo` (gateways), without 127.0.0.1.
    pub gateways: BTreeSet<Ipv4Addr>,
    /// `-A` lines of the router's iptables (`mangle` then `filter`).
    pub firewall: Vec<String>,
    /// `-A` lines of the router's ip6tables (`mangle` then `filter`).
    pub firewall6: Vec<String>,
    /// Global IPv6 addresses on each node's `eth0`, by instance id.
    pub node_ipv6: BTreeMap<String, BTreeSet<Ipv6Addr>>,
    /// Router-side branch ports (VLAN sub-interfaces of trunk ports), by name.
    pub branch_ports: BTreeMap<String, BranchPort>,
}

/// A VLAN sub-interface in the router, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchPort {
    /// The trunk's port it sits on.
    pub parent: String,
    /// 802.1Q id.
    pub vlan_id: u16,
    /// `ifalias` (the branch ENI id, set by the fabric).
    pub alias: Option<String>,
}

impl Desired {
    /// What the kernel must show for the world snapshot `view`: every running instance is a
    /// node, every ENI visible on it a link.
    pub fn from_view(view: &crate::view::FabricView) -> Self {
        let gateway_of = |subnet_id: &str, cidr: Ipv4Net| {
            view.subnets
                .iter()
                .find(|s| s.subnet_id == subnet_id)
                .map_or_else(
                    || Ipv4Addr::from(u32::from(cidr.network()).wrapping_add(1)),
                    |s| s.gateway,
                )
        };
        let nodes = view
            .instances
            .iter()
            .filter(|i| i.running)
            .map(|i| {
                let enis = i
                    .enis
                    .iter()
                    .map(|e| {
                        // One node link per ENI: an ENI of network card N > 0 is `eth<100N +
                        // device index>` (device indexes restart at 0 on every card).
                        let slot = e.device_index + 100 * e.network_card_index;
                        let eni = DesiredEni {
                            eni_id: e.eni_id.clone(),
                            device_index: slot,
                            mac: e.mac.to_ascii_lowercase(),
                            primary_ip: e.primary_ip,
                            secondary_ips: e.secondary_ips.iter().copied().collect(),
                            prefixes: e.ipv4_prefixes.iter().copied().collect(),
                            subnet_cidr: e.subnet_cidr,
                            gateway: gateway_of(&e.subnet_id, e.subnet_cidr),
                            ipv6_addresses: e.ipv6_addresses.clone(),
                            ipv6_prefixes: e.ipv6_prefixes.iter().copied().collect(),
                            security_groups: e.security_groups.iter().cloned().collect(),
                            branches: if e.interface_type == "trunk" {
                                e.branches
                                    .iter()
                                    .map(|b| {
                                        let branch = DesiredBranch {
                                            eni_id: b.eni_id.clone(),
                                            vlan_id: b.vlan_id,
                                            mac: b.mac.to_ascii_lowercase(),
                                            primary_ip: b.primary_ip,
                                            security_groups: b
                                                .security_groups
                                                .iter()
                                                .cloned()
                                                .collect(),
                                        };
                                        (b.vlan_id, branch)
                                    })
                                    .collect()
                            } else {
                                BTreeMap::new()
                            },
                        };
                        (slot, eni)
                    })
                    .collect();
                (
                    i.instance_id.clone(),
                    DesiredNode {
                        instance_id: i.instance_id.clone(),
                        enis,
                    },
                )
            })
            .collect();
        Self {
            vpc_cidrs: std::iter::once(view.vpc_cidr)
                .chain(view.vpc_cidrs.iter().copied())
                .collect(),
            vpc_ipv6_cidr: view.vpc_ipv6_cidr,
            gateways: view.subnets.iter().map(|s| s.gateway).collect(),
            nodes,
            security_groups: view
                .security_groups
                .iter()
                .map(|g| (g.group_id.clone(), g.clone()))
                .collect(),
            eni_groups_enforced: view.eni_groups_enforced,
        }
    }
}
