//! The state of security groups for pods: security-group rules (`IpPermission`s) and the
//! associations of branch ENIs with trunk ENIs (`AssociateTrunkInterface`). Value types only;
//! the operations are in `ops::trunk` and `ops::groups`. Must not know HTTP or knobs.

use ipnet::IpNet;
use serde::Serialize;

/// One security-group rule as EC2 stores an `IpPermission`: a protocol, a port (or ICMP
/// type/code) range, and the peers it names (CIDRs and groups).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SgRule {
    /// `-1` (all), `tcp`, `udp`, `icmp`, `icmpv6` (numbers 6, 17, 1, 58 are stored by name).
    pub protocol: String,
    /// First port (TCP/UDP) or ICMP type; `None`: all.
    pub from_port: Option<i32>,
    /// Last port (TCP/UDP) or ICMP code; `None`: all.
    pub to_port: Option<i32>,
    /// Peer CIDRs (`IpRanges` and `Ipv6Ranges`).
    pub cidrs: Vec<IpNet>,
    /// Peer security groups (`UserIdGroupPairs`).
    pub groups: Vec<String>,
}

impl SgRule {
    /// A rule naming one peer group.
    #[must_use]
    pub fn from_group(protocol: &str, from: Option<i32>, to: Option<i32>, group: &str) -> Self {
        Self {
            protocol: protocol.to_owned(),
            from_port: from,
            to_port: to,
            cidrs: Vec::new(),
            groups: vec![group.to_owned()],
        }
    }

    /// EC2's egress rule of every new group: all protocols to `0.0.0.0/0` (and `::/0`, which
    /// EC2 adds only in a VPC with IPv6; this VPC is always dual-stack capable).
    #[must_use]
    pub fn default_egress() -> Vec<Self> {
        vec![Self {
            protocol: "-1".to_owned(),
            from_port: None,
            to_port: None,
            cidrs: vec![
                "0.0.0.0/0".parse().expect("static cidr"),
                "::/0".parse().expect("static cidr"),
            ],
            groups: Vec::new(),
        }]
    }
}

/// A branch ENI associated with a trunk ENI on one VLAN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrunkAssociation {
    /// `trunk-assoc-...`
    pub id: String,
    /// The trunk ENI.
    pub trunk_eni: String,
    /// The branch ENI.
    pub branch_eni: String,
    /// 802.1Q VLAN id on the trunk.
    pub vlan_id: u16,
}
