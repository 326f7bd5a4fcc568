//! The fabric's own model: what the kernel should look like (`Desired`, derived from the EC2
//! world's `FabricView`) and what it looks like (`Observed`). Plain data; must not touch the
//! kernel or the world.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// The fabric as the EC2 world says it should be right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// VPC CIDR blocks (unreachable in the router unless an ENI owns the address).
    pub vpc_cidrs: BTreeSet<Ipv4Net>,
    /// Subnet gateways (`subnet base + 1`), answered by the router.
    pub gateways: BTreeSet<Ipv4Addr>,
    /// Nodes by instance id.
    pub nodes: BTreeMap<String, DesiredNode>,
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
}

impl DesiredEni {
    /// Every source this ENI may send from (and every destination the router delivers to it).
    pub fn owned(&self) -> Vec<Ipv4Net> {
        let mut v = vec![host(self.primary_ip)];
        v.extend(self.secondary_ips.iter().copied().map(host));
        v.extend(self.prefixes.iter().copied());
        v
    }
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
        /// next hop (the ENI's primary IP, a permanent neighbour on the port)
        via: Ipv4Addr,
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
    pub ip: Ipv4Addr,
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
    pub routes: BTreeMap<Ipv4Net, RouteTarget>,
    /// Permanent neighbours on ENI ports.
    pub neighbours: BTreeSet<Neighbour>,
    /// /32 addresses on the router's `lo` (gateways), without 127.0.0.1.
    pub gateways: BTreeSet<Ipv4Addr>,
    /// `-A` lines of the router's iptables (`mangle` then `filter`).
    pub firewall: Vec<String>,
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
                        let eni = DesiredEni {
                            eni_id: e.eni_id.clone(),
                            device_index: e.device_index,
                            mac: e.mac.to_ascii_lowercase(),
                            primary_ip: e.primary_ip,
                            secondary_ips: e.secondary_ips.iter().copied().collect(),
                            prefixes: e.ipv4_prefixes.iter().copied().collect(),
                            subnet_cidr: e.subnet_cidr,
                            gateway: gateway_of(&e.subnet_id, e.subnet_cidr),
                        };
                        (e.device_index, eni)
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
            gateways: view.subnets.iter().map(|s| s.gateway).collect(),
            nodes,
        }
    }
}
