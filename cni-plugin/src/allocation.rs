//! ipamd's AddNetwork reply decoded, once, into the domain's [`Allocation`]: which kind of pod
//! ipamd answered for (a regular pod with its IPv4, IPv6 or both; a multi-card pod with one
//! IPv4 per network card; a security-groups-for-pods branch-ENI pod) with its addresses, ENI
//! tables and VLAN facts parsed. The only module that reads `AddNetworkReply`'s allocation
//! fields (`command::add` still logs the reply and passes on its policy mode). Must not: know
//! the netconf or the CNI environment, name links or tables of the pod, touch the kernel
//! (that is [`crate::plan`]'s and [`crate::apply`]'s), or decide CNI error codes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dataplane::conventions::route_table_for_device;
use dataplane::{Family, MacAddr};
use ipamd_proto::rpc::{AddNetworkReply, IpAllocationMetadata};

/// What ipamd allocated for one ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocation {
    /// A regular pod: one interface (`CNI_IFNAME`) with an IPv4, an IPv6, or both (a dual-stack
    /// reply carries them in one `IPAllocationMetadata` entry or in two).
    Pod {
        /// The pod's addresses, one per family.
        families: Families,
    },
    /// A multi-card pod (annotation `k8s.amazonaws.com/nicConfig: multi-nic-attachment`): one IPv4
    /// per network card, one interface each (one veth pair per `IPAllocationMetadata`). IPv4 only.
    MultiCard {
        /// The first entry's address, wired on `CNI_IFNAME` (card 0's in ipamd's order).
        first: EniAddress<Ipv4Addr>,
        /// The other cards' addresses, in ipamd's order: interface 1, 2, ... (`mNicIf<i>`).
        /// Never empty (a reply with one IPv4 is [`Allocation::Pod`]).
        other_cards: Vec<EniAddress<Ipv4Addr>>,
    },
    /// A branch-ENI pod (security groups for pods): `PodVlanId` was not 0.
    Branch(BranchEni),
}

/// A regular pod's addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Families {
    /// IPv4 only.
    V4(EniAddress<Ipv4Addr>),
    /// IPv6 only.
    V6(EniAddress<Ipv6Addr>),
    /// Both, on the same interface.
    DualStack {
        /// The IPv4 (the interface's first address).
        v4: EniAddress<Ipv4Addr>,
        /// The IPv6.
        v6: EniAddress<Ipv6Addr>,
    },
}

impl Families {
    /// The first address of the interface: the IPv4 when there is one.
    #[must_use]
    pub fn first(&self) -> EniAddress {
        match *self {
            Self::V4(a) | Self::DualStack { v4: a, .. } => a.widen(),
            Self::V6(a) => a.widen(),
        }
    }

    /// A dual-stack pod's IPv6 (its second address).
    #[must_use]
    pub fn dual_stack_ipv6(&self) -> Option<EniAddress> {
        match *self {
            Self::DualStack { v6, .. } => Some(v6.widen()),
            Self::V4(_) | Self::V6(_) => None,
        }
    }

    /// Whether the pod has an IPv6 address.
    #[must_use]
    pub fn has_ipv6(&self) -> bool {
        !matches!(self, Self::V4(_))
    }
}

/// An address on an ENI, with what the host routes the pod's traffic by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EniAddress<A = IpAddr> {
    /// The address.
    pub ip: A,
    /// The ENI's device number (0 when ipamd sent a negative one).
    pub device_number: u32,
    /// The ENI's route table: `RouteTableId`, or when ipamd sent 0 or 1 ("not set"; an old ipamd
    /// sends only the device number) the device number's table.
    pub route_table: u32,
}

impl<A: Into<IpAddr>> EniAddress<A> {
    /// The same address as an [`IpAddr`].
    #[must_use]
    pub fn widen(self) -> EniAddress {
        EniAddress {
            ip: self.ip.into(),
            device_number: self.device_number,
            route_table: self.route_table,
        }
    }
}

/// A branch-ENI pod's allocation (the pod-eni fields of the reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchEni {
    /// `PodVlanId`, 1..=4094.
    pub vlan_id: u16,
    /// `ParentIfIndex`: the trunk ENI's link index (> 0).
    pub parent_index: u32,
    /// `PodENIMAC`: the branch ENI's MAC.
    pub mac: MacAddr,
    /// `PodENISubnetGW`: the branch ENI subnet's gateway (of the address's family).
    pub subnet_gateway: IpAddr,
    /// The pod's one address (IPv4, or IPv6 in an IPv6 cluster).
    pub address: IpAddr,
}

/// Why ipamd's reply is no allocation the plugin can wire. The texts are the plugin's CNI
/// error messages (`command::add` maps [`Self::NotAssigned`] to code 101, the rest to 103).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// `Success` was false.
    #[error("ipamd did not assign an address")]
    NotAssigned,
    /// No allocation, or one without an address.
    #[error("ipamd reply carries no address")]
    NoAddress,
    /// An address that does not parse (as its field's family).
    #[error("ipamd reply has invalid address {0:?}")]
    BadAddress(String),
    /// A branch-ENI reply that cannot be wired.
    #[error("branch eni reply (vlan {vlan}): {fault}")]
    BadBranchReply {
        /// `PodVlanId` as sent.
        vlan: i32,
        /// What is wrong with it.
        fault: BranchFault,
    },
    /// Several interfaces (one IPv4 per network card) beside an IPv6, or several IPv6
    /// entries: multi-card pods are wired for IPv4 only, never as one interface in silence.
    #[error(
        "multi-NIC pods (one interface per network card) are wired for IPv4 only; ipamd answered {0} IPv6 address(es) beside several interfaces"
    )]
    MultiCardNotV4(usize),
}

/// What is wrong with a branch-ENI reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BranchFault {
    /// `PodVlanId` outside 1..=4094.
    #[error("vlan id outside 1..=4094")]
    VlanOutOfRange,
    /// `ParentIfIndex` not positive.
    #[error("no trunk link index")]
    NoTrunkIndex,
    /// `PodENIMAC` that does not parse.
    #[error("branch mac {0:?}")]
    BadMac(String),
    /// `PodENISubnetGW` that does not parse.
    #[error("subnet gateway {0:?}")]
    BadSubnetGateway(String),
    /// More than one address (a branch pod has one).
    #[error("more than one address")]
    MoreThanOneAddress,
    /// The subnet gateway is not of the address's family.
    #[error("subnet gateway of the other family")]
    GatewayOfOtherFamily,
}

impl Allocation {
    /// Decodes ipamd's reply. The checks run in the plugin's historical order, so a reply
    /// with several faults is refused for the same one as ever: `Success`, then (a branch
    /// reply) the VLAN fields before the address, else each entry's IPv4 then IPv6 (only the
    /// first IPv6 is parsed; later ones are counted), then the multi-card shape.
    pub fn decode(reply: &AddNetworkReply) -> Result<Self, AllocationError> {
        if !reply.success {
            return Err(AllocationError::NotAssigned);
        }
        if reply.pod_vlan_id != 0 {
            return decode_branch(reply).map(Self::Branch);
        }
        if reply.ip_allocation_metadata.is_empty() {
            return Err(AllocationError::NoAddress);
        }
        let mut v4: Option<EniAddress<Ipv4Addr>> = None;
        let mut v6: Option<EniAddress<Ipv6Addr>> = None;
        let mut other_cards = Vec::new();
        let mut v6_count = 0;
        for entry in &reply.ip_allocation_metadata {
            if !entry.i_pv4_addr.is_empty() {
                let ip: Ipv4Addr = parse(&entry.i_pv4_addr)?;
                let address = eni_address(ip, entry);
                if v4.is_none() {
                    v4 = Some(address);
                } else {
                    other_cards.push(address);
                }
            }
            if !entry.i_pv6_addr.is_empty() {
                v6_count += 1;
                if v6.is_none() {
                    v6 = Some(eni_address(parse(&entry.i_pv6_addr)?, entry));
                }
            }
        }
        if (!other_cards.is_empty() && v6_count > 0) || v6_count > 1 {
            return Err(AllocationError::MultiCardNotV4(v6_count));
        }
        let families = match (v4, v6) {
            (None, None) => return Err(AllocationError::NoAddress),
            (Some(first), None) if !other_cards.is_empty() => {
                return Ok(Self::MultiCard { first, other_cards });
            }
            (Some(v4), None) => Families::V4(v4),
            (None, Some(v6)) => Families::V6(v6),
            (Some(v4), Some(v6)) => Families::DualStack { v4, v6 },
        };
        Ok(Self::Pod { families })
    }
}

fn parse<A: std::str::FromStr>(text: &str) -> Result<A, AllocationError> {
    text.parse()
        .map_err(|_| AllocationError::BadAddress(text.to_owned()))
}

fn eni_address<A>(ip: A, entry: &IpAllocationMetadata) -> EniAddress<A> {
    let device_number = u32::try_from(entry.device_number).unwrap_or(0);
    // Table ids 0 and 1 mean "not set" (main); an old ipamd may send only the device number.
    let route_table = match u32::try_from(entry.route_table_id) {
        Ok(t) if t > 1 => t,
        _ => route_table_for_device(device_number),
    };
    EniAddress {
        ip,
        device_number,
        route_table,
    }
}

/// The branch-ENI half of [`Allocation::decode`]: one address, IPv4 or IPv6, of the subnet
/// gateway's family.
fn decode_branch(reply: &AddNetworkReply) -> Result<BranchEni, AllocationError> {
    let vlan = reply.pod_vlan_id;
    let bad = |fault| AllocationError::BadBranchReply { vlan, fault };
    let vlan_id = u16::try_from(vlan)
        .ok()
        .filter(|v| (1..=4094).contains(v))
        .ok_or_else(|| bad(BranchFault::VlanOutOfRange))?;
    let parent_index = u32::try_from(reply.parent_if_index)
        .ok()
        .filter(|i| *i > 0)
        .ok_or_else(|| bad(BranchFault::NoTrunkIndex))?;
    let mac: MacAddr = reply
        .pod_enimac
        .parse()
        .map_err(|_| bad(BranchFault::BadMac(reply.pod_enimac.clone())))?;
    let subnet_gateway: IpAddr = reply.pod_eni_subnet_gw.parse().map_err(|_| {
        bad(BranchFault::BadSubnetGateway(
            reply.pod_eni_subnet_gw.clone(),
        ))
    })?;
    let entry = reply
        .ip_allocation_metadata
        .first()
        .ok_or(AllocationError::NoAddress)?;
    let text = if entry.i_pv4_addr.is_empty() {
        &entry.i_pv6_addr
    } else {
        &entry.i_pv4_addr
    };
    if text.is_empty() {
        return Err(AllocationError::NoAddress);
    }
    if reply.ip_allocation_metadata.len() > 1
        || (!entry.i_pv4_addr.is_empty() && !entry.i_pv6_addr.is_empty())
    {
        return Err(bad(BranchFault::MoreThanOneAddress));
    }
    let address: IpAddr = parse(text)?;
    if Family::of(address) != Family::of(subnet_gateway) {
        return Err(bad(BranchFault::GatewayOfOtherFamily));
    }
    Ok(BranchEni {
        vlan_id,
        parent_index,
        mac,
        subnet_gateway,
        address,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(v4: &str, v6: &str, device: i32, table: i32) -> IpAllocationMetadata {
        IpAllocationMetadata {
            i_pv4_addr: v4.into(),
            i_pv6_addr: v6.into(),
            device_number: device,
            route_table_id: table,
        }
    }

    fn reply(entries: Vec<IpAllocationMetadata>) -> AddNetworkReply {
        AddNetworkReply {
            success: true,
            ip_allocation_metadata: entries,
            ..Default::default()
        }
    }

    fn branch_reply(vlan: i32, entries: Vec<IpAllocationMetadata>) -> AddNetworkReply {
        AddNetworkReply {
            pod_vlan_id: vlan,
            pod_enimac: "02:aa:00:00:00:05".into(),
            pod_eni_subnet_gw: "198.18.8.1".into(),
            parent_if_index: 3,
            ..reply(entries)
        }
    }

    fn v4(ip: &str, device_number: u32, route_table: u32) -> EniAddress<Ipv4Addr> {
        EniAddress {
            ip: ip.parse().unwrap(),
            device_number,
            route_table,
        }
    }

    fn v6(ip: &str, device_number: u32, route_table: u32) -> EniAddress<Ipv6Addr> {
        EniAddress {
            ip: ip.parse().unwrap(),
            device_number,
            route_table,
        }
    }

    /// A regular pod's reply: IPv4 (its ENI's table, or the device number's when ipamd sent
    /// 0 or 1), IPv6, or dual-stack in one entry or two (the IPv4 first either way).
    #[test]
    fn a_regular_pod_decodes_by_family() {
        let decode = |r: &AddNetworkReply| Allocation::decode(r).unwrap();
        assert_eq!(
            decode(&reply(vec![entry("198.18.1.10", "", 1, 2)])),
            Allocation::Pod {
                families: Families::V4(v4("198.18.1.10", 1, 2))
            }
        );
        // Table 0 or 1: the device number's (`route_table_for_device`); a negative device: 0.
        assert_eq!(
            decode(&reply(vec![entry("198.18.1.10", "", 2, 1)])),
            Allocation::Pod {
                families: Families::V4(v4("198.18.1.10", 2, 3))
            }
        );
        assert_eq!(
            decode(&reply(vec![entry("198.18.1.10", "", -1, 0)])),
            Allocation::Pod {
                families: Families::V4(v4("198.18.1.10", 0, route_table_for_device(0)))
            }
        );
        assert_eq!(
            decode(&reply(vec![entry("", "2001:db8::5", 0, 0)])),
            Allocation::Pod {
                families: Families::V6(v6("2001:db8::5", 0, route_table_for_device(0)))
            }
        );
        let dual = Allocation::Pod {
            families: Families::DualStack {
                v4: v4("198.18.1.10", 1, 2),
                v6: v6("fd00::10", 1, 2),
            },
        };
        assert_eq!(
            decode(&reply(vec![entry("198.18.1.10", "fd00::10", 1, 2)])),
            dual
        );
        // In two entries, IPv6 first: the IPv4 is still the interface's first address.
        let two = decode(&reply(vec![
            entry("", "fd00::10", 1, 2),
            entry("198.18.1.10", "", 1, 2),
        ]));
        assert_eq!(two, dual);
        let Allocation::Pod { families } = two else {
            unreachable!()
        };
        assert_eq!(families.first().ip.to_string(), "198.18.1.10");
        assert_eq!(
            families.dual_stack_ipv6().map(|a| a.ip.to_string()),
            Some("fd00::10".to_owned())
        );
        assert!(families.has_ipv6());
    }

    /// Several IPv4 entries: a multi-card pod, in ipamd's order.
    #[test]
    fn a_multi_card_pod_decodes_one_address_per_card() {
        let got = Allocation::decode(&reply(vec![
            entry("198.18.0.10", "", 0, 254),
            entry("198.19.0.11", "", 0, 10100),
            entry("198.20.0.12", "", 1, 10201),
        ]))
        .unwrap();
        assert_eq!(
            got,
            Allocation::MultiCard {
                first: v4("198.18.0.10", 0, 254),
                other_cards: vec![v4("198.19.0.11", 0, 10100), v4("198.20.0.12", 1, 10201)],
            }
        );
    }

    /// `PodVlanId` != 0: a branch-ENI pod, whatever its entry's device and table say.
    #[test]
    fn a_branch_pod_decodes_its_vlan_facts() {
        let got = Allocation::decode(&branch_reply(5, vec![entry("198.18.8.10", "", -1, 0)]));
        assert_eq!(
            got,
            Ok(Allocation::Branch(BranchEni {
                vlan_id: 5,
                parent_index: 3,
                mac: MacAddr([2, 0xaa, 0, 0, 0, 5]),
                subnet_gateway: "198.18.8.1".parse().unwrap(),
                address: "198.18.8.10".parse().unwrap(),
            }))
        );
    }

    /// Every refusal, in the order the checks run (a reply with two faults names the first).
    #[test]
    fn malformed_replies_are_refused_for_their_first_fault() {
        use AllocationError::{BadAddress, BadBranchReply, MultiCardNotV4, NoAddress, NotAssigned};
        let decode = |r: AddNetworkReply| Allocation::decode(&r);
        let mut failed = branch_reply(4095, vec![]);
        failed.success = false;
        assert_eq!(decode(failed), Err(NotAssigned));
        assert_eq!(decode(reply(vec![])), Err(NoAddress));
        assert_eq!(decode(reply(vec![entry("", "", 0, 0)])), Err(NoAddress));
        assert_eq!(
            decode(reply(vec![entry("300.1.1.1", "x", 0, 0)])),
            Err(BadAddress("300.1.1.1".into()))
        );
        // The IPv6 field holds an IPv4: not an IPv6 address.
        assert_eq!(
            decode(reply(vec![entry("", "198.18.0.1", 0, 0)])),
            Err(BadAddress("198.18.0.1".into()))
        );
        assert_eq!(
            decode(reply(vec![
                entry("198.18.0.10", "2001:db8::1", 0, 254),
                entry("198.19.0.11", "", 0, 10100)
            ])),
            Err(MultiCardNotV4(1))
        );
        // A second IPv6 is counted, not parsed.
        assert_eq!(
            decode(reply(vec![
                entry("", "2001:db8::1", 0, 254),
                entry("", "nope", 0, 10100)
            ])),
            Err(MultiCardNotV4(2))
        );
        let branch = |vlan: i32, fault| Err(BadBranchReply { vlan, fault });
        let good = || vec![entry("198.18.8.10", "", 0, 0)];
        assert_eq!(
            decode(branch_reply(4095, good())),
            branch(4095, BranchFault::VlanOutOfRange)
        );
        assert_eq!(
            decode(branch_reply(-1, good())),
            branch(-1, BranchFault::VlanOutOfRange)
        );
        let mut r = branch_reply(5, good());
        r.parent_if_index = 0;
        r.pod_enimac = "nope".into();
        assert_eq!(decode(r), branch(5, BranchFault::NoTrunkIndex));
        let mut r = branch_reply(5, good());
        r.pod_enimac = "nope".into();
        r.pod_eni_subnet_gw = "gw".into();
        assert_eq!(decode(r), branch(5, BranchFault::BadMac("nope".into())));
        let mut r = branch_reply(5, good());
        r.pod_eni_subnet_gw = "gw".into();
        assert_eq!(
            decode(r),
            branch(5, BranchFault::BadSubnetGateway("gw".into()))
        );
        assert_eq!(decode(branch_reply(5, vec![])), Err(NoAddress));
        assert_eq!(
            decode(branch_reply(5, vec![entry("", "", 0, 0)])),
            Err(NoAddress)
        );
        assert_eq!(
            decode(branch_reply(
                5,
                vec![entry("bad", "", 0, 0), entry("198.18.8.11", "", 0, 0)]
            )),
            branch(5, BranchFault::MoreThanOneAddress)
        );
        assert_eq!(
            decode(branch_reply(
                5,
                vec![entry("198.18.8.10", "2001:db8::8", 0, 0)]
            )),
            branch(5, BranchFault::MoreThanOneAddress)
        );
        assert_eq!(
            decode(branch_reply(5, vec![entry("198.18.8.300", "", 0, 0)])),
            Err(BadAddress("198.18.8.300".into()))
        );
        assert_eq!(
            decode(branch_reply(5, vec![entry("", "2001:db8::8", 0, 0)])),
            branch(5, BranchFault::GatewayOfOtherFamily)
        );
    }

    /// The refusals' texts are the CNI error messages the plugin has always answered.
    #[test]
    fn refusal_texts_are_the_plugins_messages() {
        let text = |e: AllocationError| e.to_string();
        assert_eq!(
            text(AllocationError::BadBranchReply {
                vlan: 5,
                fault: BranchFault::BadMac("nope".into())
            }),
            "branch eni reply (vlan 5): branch mac \"nope\""
        );
        assert_eq!(
            text(AllocationError::BadBranchReply {
                vlan: 70000,
                fault: BranchFault::VlanOutOfRange
            }),
            "branch eni reply (vlan 70000): vlan id outside 1..=4094"
        );
        assert_eq!(
            text(AllocationError::BadAddress("x".into())),
            "ipamd reply has invalid address \"x\""
        );
        assert_eq!(
            text(AllocationError::MultiCardNotV4(2)),
            "multi-NIC pods (one interface per network card) are wired for IPv4 only; ipamd answered 2 IPv6 address(es) beside several interfaces"
        );
    }
}
