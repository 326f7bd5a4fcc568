//! One pod interface's plan ([`InterfacePlan`]): its veth pair, its addresses (one per
//! family), and the pod routes, gateway neighbours, host routes, rules and sysctls that wire
//! them; plus the builders every kind of pod shares (a regular address's host rules, the IPv6
//! sysctls). Must not: know which kind of pod it wires, name its links (`veth_name.rs`), or
//! touch the kernel.

use std::net::IpAddr;

use dataplane::conventions::{
    FROM_POD_RULE_PRIORITY, MAIN_TABLE, POD_GATEWAY_V4, POD_GATEWAY_V6, TO_POD_RULE_PRIORITY,
};
use dataplane::{Family, MacAddr, Neighbour, Route, Rule, Scope};
use ipnet::IpNet;

/// One address of the pod with what routes it (a dual-stack pod has one per family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodAddress {
    /// Pod address (/32 or /128).
    pub address: IpNet,
    /// Link-local gateway of its family.
    pub gateway: IpAddr,
    /// Route table of its ENI.
    pub route_table: u32,
}

/// Everything ADD programs for one pod interface (a veth pair).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfacePlan {
    /// Host-side veth name.
    pub host_veth: String,
    /// Container-side interface name (`CNI_IFNAME`, or a multi-card pod's `mNicIf<i>`).
    pub container_ifname: String,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// The interface's first address (/32 or /128; a dual-stack pod's IPv4).
    pub address: IpNet,
    /// Link-local gateway the pod routes through.
    pub gateway: IpAddr,
    /// ENI device number the address belongs to.
    pub device_number: u32,
    /// Route table of that ENI (`main` for the primary ENI).
    pub route_table: u32,
    /// Sysctls for the host veth, written in the host netns before it goes up.
    pub host_sysctls: Vec<(String, String)>,
    /// Sysctls written in the pod netns.
    pub pod_sysctls: Vec<(String, String)>,
    /// Rules added in the host netns.
    pub host_rules: Vec<Rule>,
    /// A dual-stack pod's IPv6 address, on the same interface as [`Self::address`].
    pub dual_stack_ipv6: Option<PodAddress>,
    /// Table of the host routes to the pod's addresses (`main`, or a strict-mode branch pod's
    /// VLAN table).
    pub host_route_table: u32,
    /// Table of the pod's own routes in its netns: `main` for its first interface; a multi-card
    /// pod's interface `index` > 0 uses table `index`.
    pub pod_table: u32,
    /// Rules added in the pod netns: `from <address> lookup <index>` at priority 1 for a multi-card
    /// pod's interface `index` > 0.
    pub pod_rules: Vec<Rule>,
    /// Another pod interface whose host veth has the same name ([`super::veth_name_shared_with`]:
    /// pod `x`'s interface 1 and pod `x.1`'s first). A link found under [`Self::host_veth`] may
    /// then be that pod's: ADD refuses instead of deleting it.
    pub host_veth_shared_with: Option<String>,
}

/// The part of an interface's wiring that does not depend on its addresses: the veth pair, its
/// MTU and the host end's sysctls. ADD creates it while ipamd is still answering, and uses it
/// only when the address plan asks for exactly this link ([`InterfacePlan::link`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkPlan {
    /// Host-side veth name.
    pub host_veth: String,
    /// Container-side interface name.
    pub container_ifname: String,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// Sysctls for the host veth, written in the host netns before it goes up.
    pub host_sysctls: Vec<(String, String)>,
    /// See [`InterfacePlan::host_veth_shared_with`].
    pub host_veth_shared_with: Option<String>,
}

impl InterfacePlan {
    /// This interface's address-independent part.
    #[must_use]
    pub fn link(&self) -> LinkPlan {
        LinkPlan {
            host_veth: self.host_veth.clone(),
            container_ifname: self.container_ifname.clone(),
            mtu: self.mtu,
            host_sysctls: self.host_sysctls.clone(),
            host_veth_shared_with: self.host_veth_shared_with.clone(),
        }
    }

    /// Every address of the interface: the first one, then the dual-stack IPv6.
    #[must_use]
    pub fn addresses(&self) -> Vec<PodAddress> {
        let mut out = vec![PodAddress {
            address: self.address,
            gateway: self.gateway,
            route_table: self.route_table,
        }];
        out.extend(self.dual_stack_ipv6);
        out
    }

    /// Pod routes per family: `<gw> dev <if> scope link` and `default via <gw> dev <if>`.
    #[must_use]
    pub fn pod_routes(&self, ifindex: u32) -> Vec<Route> {
        self.addresses()
            .iter()
            .flat_map(|a| {
                [
                    Route {
                        dst: IpNet::from(a.gateway),
                        gateway: None,
                        oif: Some(ifindex),
                        table: self.pod_table,
                        scope: Scope::Link,
                    },
                    Route {
                        dst: any_of(a.gateway),
                        gateway: Some(a.gateway),
                        oif: Some(ifindex),
                        table: self.pod_table,
                        scope: Scope::Universe,
                    },
                ]
            })
            .collect()
    }

    /// The permanent neighbours mapping each gateway to the host veth's MAC, in the pod.
    #[must_use]
    pub fn gateway_neighbours(&self, ifindex: u32, host_mac: MacAddr) -> Vec<Neighbour> {
        self.addresses()
            .iter()
            .map(|a| Neighbour {
                ifindex,
                ip: a.gateway,
                mac: Some(host_mac),
                permanent: true,
            })
            .collect()
    }

    /// Host routes `<podIP> dev <hostveth> scope link` in main (a strict-mode branch pod: in
    /// its VLAN table), one per address.
    #[must_use]
    pub fn host_routes(&self, veth_index: u32) -> Vec<Route> {
        self.addresses()
            .iter()
            .map(|a| Route {
                dst: a.address,
                gateway: None,
                oif: Some(veth_index),
                table: self.host_route_table,
                scope: Scope::Link,
            })
            .collect()
    }

    /// Rules keyed on this pod's address that the plan does not want: `from <ip>` at 1536 to
    /// another table (any, for a primary-ENI pod). ipamd has just given the address to this
    /// sandbox, so they are leftovers of an earlier owner whose teardown did not finish (its
    /// DEL could not prove them its own, or it never ran); older at the same priority, they
    /// would send this pod's egress out of the wrong ENI.
    #[must_use]
    pub fn stale_rules(&self, existing: &[Rule]) -> Vec<Rule> {
        existing
            .iter()
            .filter(|r| {
                r.priority == FROM_POD_RULE_PRIORITY
                    && r.src
                        .is_some_and(|src| self.addresses().iter().any(|a| a.address == src))
                    && !self.host_rules.iter().any(|p| {
                        p.priority == FROM_POD_RULE_PRIORITY && p.src == r.src && p.table == r.table
                    })
            })
            .cloned()
            .collect()
    }
}

/// A regular (not branch-ENI) address's host rules: `to <ip> lookup main` at 512, and off the
/// primary ENI `from <ip> lookup <its ENI's table>` at 1536: one `from` rule whatever external SNAT
/// and the VPC CIDRs say (pods wired by older plugins may have one per VPC CIDR; teardown removes
/// all).
pub(super) fn address_rules(a: &PodAddress) -> Vec<Rule> {
    let family = Family::of(a.address.addr());
    let mut rules = vec![Rule {
        dst: Some(a.address),
        ..Rule::lookup(family, TO_POD_RULE_PRIORITY, MAIN_TABLE)
    }];
    if a.route_table != MAIN_TABLE {
        rules.push(Rule {
            src: Some(a.address),
            ..Rule::lookup(family, FROM_POD_RULE_PRIORITY, a.route_table)
        });
    }
    rules
}

/// The link-local gateway every pod's first interface routes through, of `ip`'s family.
pub(super) fn pod_gateway_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(POD_GATEWAY_V4),
        IpAddr::V6(_) => IpAddr::V6(POD_GATEWAY_V6),
    }
}

/// `accept_ra=0`, `accept_redirects=1`, `forwarding=0` for a host-side link (host veths and VLAN
/// links, before they go up).
pub(super) fn host_link_v6_sysctls(link: &str) -> Vec<(String, String)> {
    [
        ("accept_ra", "0"),
        ("accept_redirects", "1"),
        ("forwarding", "0"),
    ]
    .iter()
    .map(|(k, v)| (format!("net/ipv6/conf/{link}/{k}"), (*v).to_owned()))
    .collect()
}

/// IPv6 on in the pod (its interface and `lo`) when it has an IPv6 address.
pub(super) fn pod_v6_sysctls(ipv6: bool, ifname: &str) -> Vec<(String, String)> {
    if ipv6 {
        vec![
            (
                format!("net/ipv6/conf/{ifname}/disable_ipv6"),
                "0".to_owned(),
            ),
            ("net/ipv6/conf/lo/disable_ipv6".to_owned(), "0".to_owned()),
        ]
    } else {
        Vec::new()
    }
}

/// The default route's destination of `gateway`'s family.
pub(super) fn any_of(gateway: IpAddr) -> IpNet {
    match gateway {
        IpAddr::V4(_) => IpNet::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0),
        IpAddr::V6(_) => IpNet::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 0),
    }
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{mk_conf, mk_env, mk_reply, plan_reply};
    use super::*;

    #[test]
    fn stale_from_rules_of_the_address_are_the_other_tables() {
        let rule = |src: &str, table: u32| Rule {
            src: Some(src.parse().unwrap()),
            ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, table)
        };
        let existing = [
            rule("198.18.1.10/32", 3),
            rule("198.18.1.10/32", 2),
            rule("198.18.1.11/32", 3),
            Rule {
                dst: Some("198.18.1.10/32".parse().unwrap()),
                ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
            },
        ];
        // Secondary-ENI pod (table 2): only the other table's rule for its address is stale.
        let plan = plan_reply(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        assert_eq!(
            plan.interface.stale_rules(&existing),
            vec![rule("198.18.1.10/32", 3)]
        );
        // Primary-ENI pod: every `from` rule of its address is stale.
        let plan = plan_reply(
            &mk_reply("198.18.1.10", "", 0, 0),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        assert_eq!(
            plan.interface.stale_rules(&existing),
            vec![rule("198.18.1.10/32", 3), rule("198.18.1.10/32", 2)]
        );
    }
}
