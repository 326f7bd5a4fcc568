//! Routing-side vocabulary of host networking: a snapshot of what the node's kernel has
//! ([`Observed`]), the changes planners ask for ([`HostOp`]), and applying them over a
//! [`dataplane::Netlink`] connection. Must not: decide which changes are needed (the planners in
//! [`super::eni`] and [`super::node`] do) or touch iptables.

use std::fmt;

use dataplane::netlink::{describe_route, describe_rule};
use dataplane::{Address, Family, Link, MacAddr, Netlink, NetlinkError, Route, Rule};

/// The node kernel's links, addresses, unicast routes of both families (all tables) and policy rules (both
/// families), read once before planning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Links.
    pub links: Vec<Link>,
    /// Addresses of all links.
    pub addresses: Vec<Address>,
    /// Unicast routes of every table, IPv4 then IPv6.
    pub routes: Vec<Route>,
    /// Lookup rules, IPv4 and IPv6.
    pub rules: Vec<Rule>,
}

impl Observed {
    /// The link with hardware address `mac`.
    #[must_use]
    pub fn link_by_mac(&self, mac: MacAddr) -> Option<&Link> {
        self.links.iter().find(|l| l.mac == Some(mac))
    }

    /// Reads the snapshot through `netlink`.
    pub async fn read(netlink: &Netlink) -> Result<Self, NetlinkError> {
        let mut rules = netlink.rules(Family::V4).await?;
        rules.extend(netlink.rules(Family::V6).await?);
        let mut routes = netlink.routes(Family::V4).await?;
        routes.extend(netlink.routes(Family::V6).await?);
        Ok(Self {
            links: netlink.links().await?,
            addresses: netlink.addresses(None).await?,
            routes,
            rules,
        })
    }
}

/// One routing change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostOp {
    /// Set a link's MTU.
    SetMtu {
        /// Link index.
        ifindex: u32,
        /// New MTU.
        mtu: u32,
    },
    /// Bring a link up.
    SetUp {
        /// Link index.
        ifindex: u32,
    },
    /// Add an address.
    AddAddress(Address),
    /// Add or replace a route.
    ReplaceRoute(Route),
    /// Delete a route (absent is fine).
    DeleteRoute(Route),
    /// Add a rule (present is fine).
    AddRule(Rule),
    /// Delete a rule (absent is fine).
    DeleteRule(Rule),
}

impl fmt::Display for HostOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SetMtu { ifindex, mtu } => write!(f, "link {ifindex} mtu {mtu}"),
            Self::SetUp { ifindex } => write!(f, "link {ifindex} up"),
            Self::AddAddress(a) => write!(f, "add address {} dev {}", a.prefix, a.ifindex),
            Self::ReplaceRoute(r) => write!(f, "replace route {}", describe_route(r)),
            Self::DeleteRoute(r) => write!(f, "delete route {}", describe_route(r)),
            Self::AddRule(r) => write!(f, "add rule {}", describe_rule(r)),
            Self::DeleteRule(r) => write!(f, "delete rule {}", describe_rule(r)),
        }
    }
}

/// Applies `ops` in order. Deleting something already gone and adding something already there
/// are not errors (another actor, or a half-finished earlier run, got there first).
pub async fn apply(netlink: &Netlink, ops: &[HostOp]) -> Result<(), NetlinkError> {
    for op in ops {
        let result = match op {
            HostOp::SetMtu { ifindex, mtu } => netlink.set_link_mtu(*ifindex, *mtu).await,
            HostOp::SetUp { ifindex } => netlink.set_link_up(*ifindex).await,
            HostOp::AddAddress(a) => netlink.add_address(a, false).await,
            HostOp::ReplaceRoute(r) => netlink.replace_route(r).await,
            HostOp::DeleteRoute(r) => netlink.delete_route(r).await,
            HostOp::AddRule(r) => netlink.add_rule(r).await,
            HostOp::DeleteRule(r) => netlink.delete_rule(r).await,
        };
        match result {
            Err(e) if e.is_not_found() && is_delete(op) => {}
            Err(e) if e.is_exists() && !is_delete(op) => {}
            other => other?,
        }
    }
    Ok(())
}

fn is_delete(op: &HostOp) -> bool {
    matches!(op, HostOp::DeleteRoute(_) | HostOp::DeleteRule(_))
}
