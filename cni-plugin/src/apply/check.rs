//! CHECK's comparison of the live wiring with a previous result ([`Datapath::check`]): each
//! interface's links, addresses, pod routes and gateway neighbour, the host routes and rules,
//! and a branch-ENI pod's VLAN link and mode layout. Must not: change anything (it only
//! reads), or decide what drift means for the verb (`command::check` does).

use std::net::IpAddr;

use dataplane::conventions::{
    FROM_POD_RULE_PRIORITY, MAIN_TABLE, POD_GATEWAY_V4, POD_GATEWAY_V6, TO_POD_RULE_PRIORITY,
    VLAN_RULE_PRIORITY, branch_route_table, branch_vlan_link_name,
};
use dataplane::{Family, Link, MacAddr, NetNs, Netlink, Scope};
use ipnet::IpNet;

use super::{ApplyError, Datapath};
use crate::spec::CniResult;
use crate::spec::netconf::SgEnforcingMode;

impl Datapath {
    /// Compares the live wiring with `prev`; returns the differences found. Every address of
    /// the result is checked on the interface it names (a multi-NIC pod's `mNicIf<i>` and its
    /// host veth, listed just before it), the first interface's on `ifname`. A branch-ENI pod
    /// (prevResult's marker carries its VLAN id) is checked against `mode`'s layout: its VLAN
    /// link up, and strict mode's `iif` rules and VLAN-table host route, or standard mode's
    /// 512/1536 rules and main-table host route.
    pub async fn check(
        &self,
        prev: &CniResult,
        pod: &NetNs,
        ifname: &str,
        mode: SgEnforcingMode,
    ) -> Result<Vec<String>, ApplyError> {
        let mut drift = Vec::new();
        if !prev.interfaces.iter().any(|i| i.sandbox.is_none()) {
            return Ok(vec!["prevResult names no host interface".to_owned()]);
        }
        if prev.ips.is_empty() {
            return Ok(vec!["prevResult has no ip".to_owned()]);
        }
        let vlan = crate::plan::marker_vlan(prev).filter(|v| *v != 0);
        if let Some(v) = vlan {
            let name = branch_vlan_link_name(v);
            match self.host_nl.link_by_name(&name).await? {
                None => drift.push(format!("vlan link {name} missing")),
                Some(l) if !l.up => drift.push(format!("{name} is down")),
                Some(_) => {}
            }
        }
        let branch = vlan.map(|v| BranchCheck {
            vlan_link: branch_vlan_link_name(v),
            table: branch_route_table(v),
            strict: mode == SgEnforcingMode::Strict,
        });
        let device: u32 = prev
            .interfaces
            .iter()
            .find(|i| i.name.starts_with("dummy"))
            .and_then(|i| i.sandbox.as_deref())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let pod_nl = pod.connect().await?;
        // The interfaces the addresses name (the first one when an address names none).
        let first_container = prev
            .interfaces
            .iter()
            .position(|i| i.sandbox.is_some() && i.name == ifname)
            .unwrap_or(1);
        let mut containers: Vec<usize> = prev
            .ips
            .iter()
            .map(|ip| ip.interface.unwrap_or(first_container))
            .collect();
        containers.sort_unstable();
        containers.dedup();
        for container in containers {
            let first = container == first_container;
            let Some(c) = prev.interfaces.get(container) else {
                drift.push(format!("prevResult names no interface {container}"));
                continue;
            };
            let name = if first { ifname } else { c.name.as_str() };
            let host_if = container
                .checked_sub(1)
                .and_then(|h| prev.interfaces.get(h))
                .filter(|h| h.sandbox.is_none())
                .or_else(|| prev.interfaces.iter().find(|i| i.sandbox.is_none()));
            let ips: Vec<&crate::spec::IpConfig> = prev
                .ips
                .iter()
                .filter(|ip| ip.interface.unwrap_or(first_container) == container)
                .collect();
            // The first interface's from-rule exists only off the primary ENI; a further
            // interface's always (its ENI is on another network card).
            // A branch pod's (standard mode) goes to its VLAN table.
            let from_rule = !first || device > 0 || branch.is_some();
            self.check_interface(
                &pod_nl,
                host_if,
                c,
                name,
                &ips,
                from_rule,
                branch.as_ref(),
                &mut drift,
            )
            .await?;
        }
        Ok(drift)
    }

    /// [`Self::check`] for one pod interface and its addresses.
    #[allow(clippy::too_many_arguments)]
    async fn check_interface(
        &self,
        pod_nl: &Netlink,
        host_if: Option<&crate::spec::Interface>,
        container: &crate::spec::Interface,
        ifname: &str,
        ips: &[&crate::spec::IpConfig],
        from_rule: bool,
        branch: Option<&BranchCheck>,
        drift: &mut Vec<String>,
    ) -> Result<(), ApplyError> {
        let host_link = match host_if {
            None => None,
            Some(h) => match self.host_nl.link_by_name(&h.name).await? {
                None => {
                    drift.push(format!("host veth {} missing", h.name));
                    None
                }
                Some(l) => {
                    check_link(&l, &h.mac, drift);
                    Some(l)
                }
            },
        };
        let Some(pod_link) = pod_nl.link_by_name(ifname).await? else {
            drift.push(format!("container interface {ifname} missing"));
            return Ok(());
        };
        if container.sandbox.is_some() {
            check_link(&pod_link, &container.mac, drift);
        }
        let addrs = pod_nl.addresses(Some(pod_link.index)).await?;
        let neigh = pod_nl.neighbours(Some(pod_link.index)).await?;
        // Every address of the interface (a dual-stack pod has one per family).
        for ip in ips {
            let addr = IpNet::from(ip.address.addr());
            let family = Family::of(addr.addr());
            // A branch pod's result names the branch subnet's gateway; the pod routes through
            // the link-local one as every pod.
            let gateway = if branch.is_some() {
                Some(match family {
                    Family::V4 => IpAddr::V4(POD_GATEWAY_V4),
                    Family::V6 => IpAddr::V6(POD_GATEWAY_V6),
                })
            } else {
                ip.gateway
            };
            let host_table = branch.filter(|b| b.strict).map_or(MAIN_TABLE, |b| b.table);
            // IPv6 routes carry no scope (the kernel reports every one as global).
            let link_scope = |scope: Scope| scope == Scope::Link || family == Family::V6;
            if let Some(l) = &host_link {
                let routes = self.host_nl.routes(family).await?;
                if !routes.iter().any(|r| {
                    r.table == host_table
                        && r.dst == addr
                        && r.oif == Some(l.index)
                        && link_scope(r.scope)
                }) {
                    drift.push(format!(
                        "host route {addr} dev {} table {host_table} missing",
                        l.name
                    ));
                }
            }
            let rules = self.host_nl.rules(family).await?;
            if let Some(b) = branch.filter(|b| b.strict) {
                let host_name = host_if.map(|h| h.name.clone()).unwrap_or_default();
                for iif in [b.vlan_link.clone(), host_name] {
                    if !rules.iter().any(|r| {
                        r.priority == VLAN_RULE_PRIORITY
                            && r.iif.as_deref() == Some(iif.as_str())
                            && r.table == b.table
                    }) {
                        drift.push(format!("rule iif {iif} lookup {} missing", b.table));
                    }
                }
            } else {
                if !rules.iter().any(|r| {
                    r.priority == TO_POD_RULE_PRIORITY
                        && r.dst == Some(addr)
                        && r.table == MAIN_TABLE
                }) {
                    drift.push(format!("rule to {addr} lookup main missing"));
                }
                if from_rule
                    && !rules.iter().any(|r| {
                        r.priority == FROM_POD_RULE_PRIORITY
                            && r.src == Some(addr)
                            && branch.is_none_or(|b| r.table == b.table)
                    })
                {
                    drift.push(format!("rule from {addr} missing"));
                }
            }
            if !addrs.iter().any(|a| a.prefix == addr) {
                drift.push(format!("address {addr} missing on {ifname}"));
            }
            if let Some(gw) = gateway {
                // A further interface's routes are in its own pod table (any table here).
                let routes = pod_nl.routes(family).await?;
                let gw_net = IpNet::from(gw);
                if !routes.iter().any(|r| {
                    r.dst == gw_net && link_scope(r.scope) && r.oif == Some(pod_link.index)
                }) {
                    drift.push(format!("pod route {gw} scope link missing"));
                }
                if !routes
                    .iter()
                    .any(|r| r.dst.prefix_len() == 0 && r.gateway == Some(gw))
                {
                    drift.push(format!("pod default route via {gw} missing"));
                }
                let host_mac = host_link.as_ref().and_then(|l| l.mac);
                if !neigh
                    .iter()
                    .any(|n| n.ip == gw && n.permanent && (host_mac.is_none() || n.mac == host_mac))
                {
                    drift.push(format!("permanent neighbour {gw} missing in pod"));
                }
            }
        }
        Ok(())
    }
}

/// What CHECK verifies of a branch-ENI pod beyond a regular pod's interface.
#[derive(Debug, Clone)]
struct BranchCheck {
    /// `vlan.eth.<id>`, named by strict mode's `iif` rule.
    vlan_link: String,
    /// The VLAN's route table.
    table: u32,
    /// Strict mode's layout (else standard's).
    strict: bool,
}

fn check_link(link: &Link, want_mac: &str, drift: &mut Vec<String>) {
    if !link.up {
        drift.push(format!("{} is down", link.name));
    }
    if let Ok(want) = want_mac.parse::<MacAddr>()
        && link.mac != Some(want)
    {
        drift.push(format!("{} mac changed", link.name));
    }
}
