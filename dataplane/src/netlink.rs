//! Typed route-netlink operations on one namespace (links, veths, addresses, routes, rules,
//! neighbours) built on `rtnetlink`. Converts between kernel messages and the value types of
//! [`crate::model`]. Must not: decide which objects a pod or ENI needs (planners do), enter
//! namespaces (see [`crate::netns`]), or retry.

use std::net::IpAddr;
use std::os::fd::AsRawFd;

use futures::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use rtnetlink::packet_core::NetlinkMessage;
use rtnetlink::packet_route::{
    AddressFamily, IpProtocol, RouteNetlinkMessage,
    address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage},
    link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType},
    rule::{RuleAction, RuleAttribute, RuleMessage},
};
use rtnetlink::{
    Handle, IpVersion, LinkMessageBuilder, LinkUnspec, LinkVeth, LinkVlan, RouteMessageBuilder,
};

use crate::model::{Address, Family, Link, MacAddr, Neighbour, Route, Rule, Scope};
use crate::netns::{NetNs, NetNsError};

/// `ENOENT`: no such object.
const ENOENT: i32 = 2;
/// `ESRCH`: no such process / rule.
const ESRCH: i32 = 3;
/// `ENODEV`: no such device.
const ENODEV: i32 = 19;
/// `EADDRNOTAVAIL`: address not on the link.
const EADDRNOTAVAIL: i32 = 99;
/// `EEXIST`.
const EEXIST: i32 = 17;

/// A failed netlink operation.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The namespace could not be entered to open the socket.
    #[error(transparent)]
    NetNs(NetNsError),
    /// The netlink socket could not be opened.
    #[error("open netlink socket")]
    Socket(#[source] std::io::Error),
    /// The kernel refused a request; `op` says which (e.g. `add route 10.0.0.1/32 table 254`).
    /// The kernel's reason is part of the message (most logs print only the top error), not a
    /// `source()`, so a printed chain does not say it twice; [`NetlinkError::errno`] reads it.
    #[error("{op}: {reason}")]
    Request {
        /// What was attempted.
        op: String,
        /// Kernel or protocol error.
        reason: rtnetlink::Error,
    },
    /// A link looked up by name does not exist.
    #[error("link {0} not found")]
    LinkNotFound(String),
}

impl NetlinkError {
    /// The kernel errno, when the kernel refused the request.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Request {
                reason: rtnetlink::Error::NetlinkError(msg),
                ..
            } => msg.code.map(|c| c.get().abs()),
            _ => None,
        }
    }

    /// The object does not exist (ENOENT, ESRCH, ENODEV, EADDRNOTAVAIL, or a lookup miss).
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::LinkNotFound(_))
            || matches!(self.errno(), Some(ENOENT | ESRCH | ENODEV | EADDRNOTAVAIL))
    }

    /// The object already exists (EEXIST).
    #[must_use]
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(EEXIST)
    }
}

type Result<T> = std::result::Result<T, NetlinkError>;

/// What `rtnetlink::new_connection` returns.
pub(crate) type Connection = (
    rtnetlink::proto::Connection<RouteNetlinkMessage>,
    Handle,
    futures::channel::mpsc::UnboundedReceiver<(
        NetlinkMessage<RouteNetlinkMessage>,
        rtnetlink::sys::SocketAddr,
    )>,
);

fn req(op: impl FnOnce() -> String) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    move |reason| NetlinkError::Request { op: op(), reason }
}

/// What to create with [`Netlink::add_veth`].
#[derive(Debug)]
pub struct VethSpec<'a> {
    /// Name of the end created in this connection's namespace.
    pub name: &'a str,
    /// MTU of both ends.
    pub mtu: u32,
    /// Name of the peer end.
    pub peer_name: &'a str,
    /// MAC of the peer end.
    pub peer_mac: Option<MacAddr>,
    /// Namespace the peer is created in directly (`IFLA_NET_NS_FD`); `None` keeps it here.
    pub peer_netns: Option<&'a NetNs>,
}

/// A route-netlink connection bound to one namespace.
#[derive(Debug)]
pub struct Netlink {
    handle: Handle,
    /// The socket's one dump at a time: the kernel answers a dump that overlaps another on the
    /// same socket EBUSY (and overlapping replies can overflow its buffer, ENOBUFS), so a
    /// connection shared by concurrent tasks (ipamd's DELs each list the node's rules) runs
    /// its dumps one after the other. It guards the socket, not data: held only while one dump
    /// is sent and read, with nothing else locked or awaited.
    dump_turn: tokio::sync::Semaphore,
}

impl Netlink {
    /// Wraps a fresh `rtnetlink` connection; spawns its driver on the current runtime.
    pub(crate) fn from_connection((conn, handle, _): Connection) -> Self {
        tokio::spawn(conn);
        Self {
            handle,
            dump_turn: tokio::sync::Semaphore::new(1),
        }
    }

    /// Runs one dump request, made by `request` (sending it is part of making it, so it is made
    /// only once this connection's turn has come), and collects its replies.
    async fn dump<M, S>(&self, op: &'static str, request: impl FnOnce() -> S) -> Result<Vec<M>>
    where
        S: futures::Stream<Item = std::result::Result<M, rtnetlink::Error>>,
    {
        // never closed: the semaphore lives as long as `self`
        let _turn = self.dump_turn.acquire().await;
        request().try_collect().await.map_err(req(|| op.to_owned()))
    }

    // ---------------------------------------------------------------- links

    /// All links.
    pub async fn links(&self) -> Result<Vec<Link>> {
        let msgs: Vec<LinkMessage> = self
            .dump("list links", || self.handle.link().get().execute())
            .await?;
        Ok(msgs.iter().map(link_from_message).collect())
    }

    /// The link named `name`, or `None`.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>> {
        Ok(self
            .link_message(name)
            .await?
            .map(|m| link_from_message(&m)))
    }

    /// The link named `name` and its `IFLA_LINK`: for a veth end, the ifindex of its peer (in
    /// the peer's namespace). `None` when there is no such link.
    pub async fn link_with_peer(&self, name: &str) -> Result<Option<(Link, Option<u32>)>> {
        Ok(self.link_message(name).await?.map(|m| {
            let peer = m.attributes.iter().find_map(|a| match a {
                LinkAttribute::Link(i) => Some(*i),
                _ => None,
            });
            (link_from_message(&m), peer)
        }))
    }

    async fn link_message(&self, name: &str) -> Result<Option<LinkMessage>> {
        let mut stream = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match stream.next().await {
            None => Ok(None),
            Some(Ok(m)) => Ok(Some(m)),
            Some(Err(e)) => {
                let err = NetlinkError::Request {
                    op: format!("get link {name}"),
                    reason: e,
                };
                if err.is_not_found() {
                    Ok(None)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// The link named `name`, or [`NetlinkError::LinkNotFound`].
    pub async fn require_link(&self, name: &str) -> Result<Link> {
        self.link_by_name(name)
            .await?
            .ok_or_else(|| NetlinkError::LinkNotFound(name.to_owned()))
    }

    /// Creates a veth pair; the peer may be placed directly into another namespace.
    pub async fn add_veth(&self, spec: &VethSpec<'_>) -> Result<()> {
        let mut peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name(spec.peer_name.to_owned())
            .mtu(spec.mtu);
        if let Some(mac) = spec.peer_mac {
            peer = peer.address(mac.0.to_vec());
        }
        if let Some(ns) = spec.peer_netns {
            peer = peer.setns_by_fd(ns.file().as_raw_fd());
        }
        let msg = LinkVeth::new(spec.name, spec.peer_name)
            .mtu(spec.mtu)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer.build())))
            .build();
        self.handle.link().add(msg).execute().await.map_err(req(|| {
            format!("add veth {} peer {}", spec.name, spec.peer_name)
        }))
    }

    /// Creates the 802.1Q link `name` with `vlan_id` on the link `parent_index`, with `mac`
    /// (a branch ENI's link on the trunk ENI's).
    pub async fn add_vlan(
        &self,
        name: &str,
        parent_index: u32,
        vlan_id: u16,
        mac: MacAddr,
    ) -> Result<()> {
        let msg = LinkVlan::new(name, parent_index, vlan_id)
            .address(mac.0.to_vec())
            .build();
        self.handle.link().add(msg).execute().await.map_err(req(|| {
            format!("add vlan {name} id {vlan_id} on link {parent_index}")
        }))
    }

    /// Sets a link administratively up.
    pub async fn set_link_up(&self, index: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).up().build();
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(req(|| format!("set link {index} up")))
    }

    /// Renames a link (it must be down).
    pub async fn set_link_name(&self, index: u32, name: &str) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .name(name.to_owned())
            .build();
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(req(|| format!("rename link {index} to {name}")))
    }

    /// Sets a link's MTU.
    pub async fn set_link_mtu(&self, index: u32, mtu: u32) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index).mtu(mtu).build();
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(req(|| format!("set link {index} mtu {mtu}")))
    }

    /// Sets a link's MAC address.
    pub async fn set_link_mac(&self, index: u32, mac: MacAddr) -> Result<()> {
        let msg = LinkUnspec::new_with_index(index)
            .address(mac.0.to_vec())
            .build();
        self.handle
            .link()
            .set(msg)
            .execute()
            .await
            .map_err(req(|| format!("set link {index} address {mac}")))
    }

    /// Deletes a link (for a veth, both ends go).
    pub async fn delete_link(&self, index: u32) -> Result<()> {
        self.handle
            .link()
            .del(index)
            .execute()
            .await
            .map_err(req(|| format!("delete link {index}")))
    }

    /// Deletes the link named `name`; `Ok(false)` when it did not exist.
    pub async fn delete_link_by_name(&self, name: &str) -> Result<bool> {
        let Some(link) = self.link_by_name(name).await? else {
            return Ok(false);
        };
        match self.delete_link(link.index).await {
            Ok(()) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    // ------------------------------------------------------------ addresses

    /// Adds an address. `nodad` skips IPv6 duplicate address detection (the address is
    /// usable at once; ipamd guarantees uniqueness).
    pub async fn add_address(&self, addr: &Address, nodad: bool) -> Result<()> {
        let mut request =
            self.handle
                .address()
                .add(addr.ifindex, addr.prefix.addr(), addr.prefix.prefix_len());
        if nodad {
            request
                .message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        request.execute().await.map_err(req(|| {
            format!("add address {} dev {}", addr.prefix, addr.ifindex)
        }))
    }

    /// Deletes an address.
    pub async fn delete_address(&self, addr: &Address) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = family_of(addr.prefix.addr());
        msg.header.prefix_len = addr.prefix.prefix_len();
        msg.header.index = addr.ifindex;
        msg.attributes
            .push(AddressAttribute::Local(addr.prefix.addr()));
        msg.attributes
            .push(AddressAttribute::Address(addr.prefix.addr()));
        self.handle
            .address()
            .del(msg)
            .execute()
            .await
            .map_err(req(|| {
                format!("delete address {} dev {}", addr.prefix, addr.ifindex)
            }))
    }

    /// Addresses, optionally only those of one link.
    pub async fn addresses(&self, ifindex: Option<u32>) -> Result<Vec<Address>> {
        let msgs: Vec<AddressMessage> = self
            .dump("list addresses", || {
                let mut request = self.handle.address().get();
                if let Some(i) = ifindex {
                    request = request.set_link_index_filter(i);
                }
                request.execute()
            })
            .await?;
        Ok(msgs.iter().filter_map(address_from_message).collect())
    }

    /// IPv6 addresses of link `ifindex` still in duplicate address detection (`tentative`) or
    /// that failed it (`dadfailed`), link-local ones included.
    pub async fn unsettled_ipv6_addresses(&self, ifindex: u32) -> Result<Vec<IpNet>> {
        let msgs: Vec<AddressMessage> = self
            .dump("list addresses", || {
                self.handle
                    .address()
                    .get()
                    .set_link_index_filter(ifindex)
                    .execute()
            })
            .await?;
        Ok(msgs
            .iter()
            .filter(|m| m.header.family == AddressFamily::Inet6 && dad_unsettled(m))
            .filter_map(address_from_message)
            .map(|a| a.prefix)
            .collect())
    }

    /// Waits until link `ifindex` has no IPv6 address in or failed by duplicate address detection,
    /// polling every `interval` for at most `timeout`. Returns the addresses still unsettled at the
    /// deadline (empty: settled).
    pub async fn wait_ipv6_settled(
        &self,
        ifindex: u32,
        timeout: std::time::Duration,
        interval: std::time::Duration,
    ) -> Result<Vec<IpNet>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let unsettled = self.unsettled_ipv6_addresses(ifindex).await?;
            if unsettled.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(unsettled);
            }
            tokio::time::sleep(interval).await;
        }
    }

    // --------------------------------------------------------------- routes

    /// Adds a route; fails with EEXIST if an identical one exists.
    pub async fn add_route(&self, route: &Route) -> Result<()> {
        let msg = route_message(route)?;
        self.handle
            .route()
            .add(msg)
            .execute()
            .await
            .map_err(req(|| format!("add route {}", describe_route(route))))
    }

    /// Adds or replaces a route.
    pub async fn replace_route(&self, route: &Route) -> Result<()> {
        let msg = route_message(route)?;
        self.handle
            .route()
            .add(msg)
            .replace()
            .execute()
            .await
            .map_err(req(|| format!("replace route {}", describe_route(route))))
    }

    /// Deletes a route.
    pub async fn delete_route(&self, route: &Route) -> Result<()> {
        let mut msg = route_message(route)?;
        // RT_SCOPE_NOWHERE matches any scope on delete (as `ip route del` sends); protocol and
        // type left unspecified match any too.
        msg.header.scope = RouteScope::NoWhere;
        msg.header.protocol = RouteProtocol::Unspec;
        msg.header.kind = RouteType::Unspec;
        self.handle
            .route()
            .del(msg)
            .execute()
            .await
            .map_err(req(|| format!("delete route {}", describe_route(route))))
    }

    /// Unicast routes of `family` in every table (filter on [`Route::table`]).
    pub async fn routes(&self, family: Family) -> Result<Vec<Route>> {
        let msg = match family {
            Family::V4 => RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            Family::V6 => RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        };
        let msgs: Vec<RouteMessage> = self
            .dump("list routes", || self.handle.route().get(msg).execute())
            .await?;
        Ok(msgs.iter().filter_map(route_from_message).collect())
    }

    // ---------------------------------------------------------------- rules

    /// Adds a rule; fails with EEXIST if an identical one exists.
    pub async fn add_rule(&self, rule: &Rule) -> Result<()> {
        let mut request = self.handle.rule().add();
        *request.message_mut() = rule_message(rule);
        request
            .execute()
            .await
            .map_err(req(|| format!("add rule {}", describe_rule(rule))))
    }

    /// Deletes one rule matching `rule` exactly.
    pub async fn delete_rule(&self, rule: &Rule) -> Result<()> {
        self.handle
            .rule()
            .del(rule_message(rule))
            .execute()
            .await
            .map_err(req(|| format!("delete rule {}", describe_rule(rule))))
    }

    /// Rules of `family` whose action is a table lookup.
    pub async fn rules(&self, family: Family) -> Result<Vec<Rule>> {
        let version = match family {
            Family::V4 => IpVersion::V4,
            Family::V6 => IpVersion::V6,
        };
        let msgs: Vec<RuleMessage> = self
            .dump("list rules", || self.handle.rule().get(version).execute())
            .await?;
        Ok(msgs.iter().filter_map(rule_from_message).collect())
    }

    // ----------------------------------------------------------- neighbours

    /// Adds or replaces a neighbour entry.
    pub async fn replace_neighbour(&self, neigh: &Neighbour) -> Result<()> {
        let mut request =
            self.handle
                .neighbours()
                .add(neigh.ifindex, neigh.ip)
                .state(if neigh.permanent {
                    NeighbourState::Permanent
                } else {
                    NeighbourState::Reachable
                });
        if let Some(mac) = neigh.mac {
            request = request.link_layer_address(&mac.0);
        }
        request.replace().execute().await.map_err(req(|| {
            format!("add neighbour {} dev {}", neigh.ip, neigh.ifindex)
        }))
    }

    /// Neighbour entries, optionally only those on one link.
    pub async fn neighbours(&self, ifindex: Option<u32>) -> Result<Vec<Neighbour>> {
        let msgs: Vec<NeighbourMessage> = self
            .dump("list neighbours", || {
                self.handle.neighbours().get().execute()
            })
            .await?;
        Ok(msgs
            .iter()
            .filter_map(neighbour_from_message)
            .filter(|n| ifindex.is_none_or(|i| n.ifindex == i))
            .collect())
    }
}

// ------------------------------------------------------------ conversions

fn family_of(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn link_from_message(m: &LinkMessage) -> Link {
    let mut link = Link {
        index: m.header.index,
        name: String::new(),
        mac: None,
        mtu: 0,
        up: m.header.flags.contains(LinkFlags::Up),
        kind: None,
    };
    for attr in &m.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name.clone_from(n),
            LinkAttribute::Address(a) => link.mac = MacAddr::from_bytes(a),
            LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    if let LinkInfo::Kind(kind) = info {
                        link.kind = Some(kind_name(kind));
                    }
                }
            }
            _ => {}
        }
    }
    link
}

fn kind_name(kind: &InfoKind) -> String {
    match kind {
        InfoKind::Veth => "veth".to_owned(),
        InfoKind::Bridge => "bridge".to_owned(),
        InfoKind::Other(s) => s.clone(),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// Tentative or DAD-failed, in the header's 8 flag bits or the 32-bit `IFA_FLAGS` attribute.
fn dad_unsettled(m: &AddressMessage) -> bool {
    let header = m
        .header
        .flags
        .intersects(AddressHeaderFlags::Tentative | AddressHeaderFlags::Dadfailed);
    header
        || m.attributes.iter().any(|a| {
            matches!(a, AddressAttribute::Flags(f)
                if f.intersects(AddressFlags::Tentative | AddressFlags::Dadfailed))
        })
}

fn address_from_message(m: &AddressMessage) -> Option<Address> {
    let ip = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let ip = ip.or_else(|| {
        m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        })
    })?;
    Some(Address {
        ifindex: m.header.index,
        prefix: IpNet::new(ip, m.header.prefix_len).ok()?,
    })
}

fn route_message(route: &Route) -> Result<RouteMessage> {
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(route.dst.network(), route.dst.prefix_len())
        .map_err(|e| invalid_route(route, &e))?
        .table_id(route.table)
        // `proto boot`, what `ip route add` and Go's netlink library use.
        .protocol(RouteProtocol::Boot)
        .scope(match route.scope {
            Scope::Universe => RouteScope::Universe,
            Scope::Link => RouteScope::Link,
            Scope::Host => RouteScope::Host,
        });
    if let Some(oif) = route.oif {
        b = b.output_interface(oif);
    }
    if let Some(gw) = route.gateway {
        b = b.gateway(gw).map_err(|e| invalid_route(route, &e))?;
    }
    Ok(b.build())
}

fn invalid_route(route: &Route, e: &dyn std::fmt::Display) -> NetlinkError {
    NetlinkError::Request {
        op: format!("build route {}: {e}", describe_route(route)),
        reason: rtnetlink::Error::RequestFailed,
    }
}

fn route_address(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn route_from_message(m: &RouteMessage) -> Option<Route> {
    if m.header.kind != RouteType::Unicast {
        return None;
    }
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut table = u32::from(m.header.table);
    for attr in &m.attributes {
        match attr {
            RouteAttribute::Destination(a) => dst = route_address(a),
            RouteAttribute::Gateway(a) => gateway = route_address(a),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    let dst = dst.unwrap_or(match m.header.address_family {
        AddressFamily::Inet6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    });
    let scope = match m.header.scope {
        RouteScope::Link => Scope::Link,
        RouteScope::Host => Scope::Host,
        _ => Scope::Universe,
    };
    Some(Route {
        dst: IpNet::new(dst, m.header.destination_prefix_length).ok()?,
        gateway,
        oif,
        table,
        scope,
    })
}

fn rule_message(rule: &Rule) -> RuleMessage {
    let mut m = RuleMessage::default();
    m.header.family = match rule.family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    };
    m.header.action = RuleAction::ToTable;
    // The header's table is u8; ids above 255 travel only in FRA_TABLE.
    m.header.table = u8::try_from(rule.table).unwrap_or(0);
    m.attributes.push(RuleAttribute::Priority(rule.priority));
    m.attributes.push(RuleAttribute::Table(rule.table));
    if let Some(src) = rule.src {
        m.header.src_len = src.prefix_len();
        m.attributes.push(RuleAttribute::Source(src.network()));
    }
    if let Some(dst) = rule.dst {
        m.header.dst_len = dst.prefix_len();
        m.attributes.push(RuleAttribute::Destination(dst.network()));
    }
    if let Some(iif) = &rule.iif {
        m.attributes.push(RuleAttribute::Iifname(iif.clone()));
    }
    if let Some((mark, mask)) = rule.fwmark {
        m.attributes.push(RuleAttribute::FwMark(mark));
        m.attributes.push(RuleAttribute::FwMask(mask));
    }
    if let Some(proto) = rule.ip_proto {
        m.attributes
            .push(RuleAttribute::IpProtocol(IpProtocol::from(proto)));
    }
    m
}

fn rule_from_message(m: &RuleMessage) -> Option<Rule> {
    if m.header.action != RuleAction::ToTable {
        return None;
    }
    let family = match m.header.family {
        AddressFamily::Inet => Family::V4,
        AddressFamily::Inet6 => Family::V6,
        _ => return None,
    };
    let mut rule = Rule::lookup(family, 0, u32::from(m.header.table));
    let mut mark = None;
    let mut mask = u32::MAX;
    for attr in &m.attributes {
        match attr {
            RuleAttribute::Priority(p) => rule.priority = *p,
            RuleAttribute::Table(t) => rule.table = *t,
            RuleAttribute::Source(ip) => rule.src = IpNet::new(*ip, m.header.src_len).ok(),
            RuleAttribute::Destination(ip) => rule.dst = IpNet::new(*ip, m.header.dst_len).ok(),
            RuleAttribute::Iifname(n) => rule.iif = Some(n.clone()),
            RuleAttribute::FwMark(v) => mark = Some(*v),
            RuleAttribute::FwMask(v) => mask = *v,
            RuleAttribute::IpProtocol(p) => rule.ip_proto = Some(u8::from(*p)),
            _ => {}
        }
    }
    rule.fwmark = mark.map(|v| (v, mask));
    Some(rule)
}

fn neighbour_from_message(m: &NeighbourMessage) -> Option<Neighbour> {
    let mut ip = None;
    let mut mac = None;
    for attr in &m.attributes {
        match attr {
            NeighbourAttribute::Destination(NeighbourAddress::Inet(v4)) => {
                ip = Some(IpAddr::V4(*v4));
            }
            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v6)) => {
                ip = Some(IpAddr::V6(*v6));
            }
            NeighbourAttribute::LinkLayerAddress(a) => mac = MacAddr::from_bytes(a),
            _ => {}
        }
    }
    Some(Neighbour {
        ifindex: m.header.ifindex,
        ip: ip?,
        mac,
        permanent: m.header.state == NeighbourState::Permanent,
    })
}

/// `ip route`-like text for errors and logs.
#[must_use]
pub fn describe_route(r: &Route) -> String {
    let mut s = r.dst.to_string();
    if let Some(gw) = r.gateway {
        s.push_str(&format!(" via {gw}"));
    }
    if let Some(oif) = r.oif {
        s.push_str(&format!(" dev {oif}"));
    }
    if r.scope == Scope::Link {
        s.push_str(" scope link");
    }
    s.push_str(&format!(" table {}", r.table));
    s
}

/// `ip rule`-like text for errors and logs.
#[must_use]
pub fn describe_rule(r: &Rule) -> String {
    let mut s = format!("pref {}", r.priority);
    if let Some(src) = r.src {
        s.push_str(&format!(" from {src}"));
    }
    if let Some(dst) = r.dst {
        s.push_str(&format!(" to {dst}"));
    }
    if let Some(iif) = &r.iif {
        s.push_str(&format!(" iif {iif}"));
    }
    if let Some((mark, mask)) = r.fwmark {
        s.push_str(&format!(" fwmark {mark:#x}/{mask:#x}"));
    }
    if let Some(proto) = r.ip_proto {
        s.push_str(&format!(" ipproto {proto}"));
    }
    s.push_str(&format!(" lookup {}", r.table));
    s
}
