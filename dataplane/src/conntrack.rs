//! Conntrack state of pod addresses: forgetting every connection-tracking entry (and so every
//! NAT binding: kube-proxy's DNAT to a pod, the SNAT of a pod's egress, CONNMARK marks) whose
//! original or reply tuple names one of the given addresses, in the calling thread's network
//! namespace, through ctnetlink (`NETLINK_NETFILTER`, `IPCTNL_MSG_CT_GET` dump, then one
//! `IPCTNL_MSG_CT_DELETE` per entry by its original tuple, zone and id). Which entries go is
//! decided by a pure function ([`names_any`]); the socket layer only executes it.
//! Must not: decide whose addresses these are (callers pass addresses no pod holds, or that
//! the caller's own sandbox still holds), touch anything but the conntrack table.
//!
//! Why: an address handed to a new pod while an entry of its previous owner's flow still
//! exists receives that flow's packets (docs/host-networking.md, "Conntrack-safe address reuse").

use std::io;
use std::net::IpAddr;

use netlink_packet_netfilter::conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, Tuple};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use rtnetlink::packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, Nla,
};
use rtnetlink::sys::{
    AsyncSocket, AsyncSocketExt, Socket, SocketAddr, TokioSocket, protocols::NETLINK_NETFILTER,
};

/// `CTA_ID`: the entry's id; a delete naming it removes that very entry or nothing.
const CTA_ID: u16 = 12;
/// `CTA_ZONE`: the entry's zone; a delete without it looks in zone 0 only.
const CTA_ZONE: u16 = 18;
/// The file that exists in a network namespace whose conntrack is loaded.
const CONNTRACK_COUNT: &str = "/proc/sys/net/netfilter/nf_conntrack_count";

/// Why the entries of the addresses could not be forgotten: the caller must then not let the
/// addresses go to another pod (docs/host-networking.md).
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The ctnetlink socket could not be opened or bound.
    #[error("open a ctnetlink socket")]
    Socket(#[source] io::Error),
    /// Conntrack is loaded in this namespace but ctnetlink does not answer (module
    /// `nf_conntrack_netlink` missing and not loadable, or no `CAP_NET_ADMIN`).
    #[error("list conntrack entries")]
    Dump(#[source] io::Error),
    /// The kernel refused to delete an entry (other than "already gone").
    #[error("delete the conntrack entry {entry}")]
    Delete {
        /// The entry's original tuple.
        entry: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// The subscription to new entries failed to read.
    #[error("read conntrack events")]
    Events(#[source] io::Error),
    /// The kernel answered something this module cannot read.
    #[error("unreadable ctnetlink answer: {0}")]
    Decode(String),
}

/// What [`forget_addresses`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Forgotten {
    /// Entries deleted (an entry that vanished between the listing and its delete is not
    /// counted).
    pub deleted: usize,
    /// False when this namespace tracks no connection at all (conntrack not loaded): there
    /// was nothing to forget.
    pub tracking: bool,
}

/// One listed entry: its addresses (to decide) and what a delete must name (to execute).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Layer-3 family of the entry (the delete's `nfgen_family`).
    pub family: NetfilterProtoFamily,
    /// Source and destination of the original and the reply tuple.
    pub addresses: Vec<IpAddr>,
    /// The original tuple, as listed.
    orig: Vec<Tuple>,
    /// `CTA_ZONE` and `CTA_ID`, as listed.
    identity: Vec<DefaultNla>,
}

impl Entry {
    /// Reads a listed entry; `None` for an entry without an original tuple (none exists).
    fn from_listing(family: NetfilterProtoFamily, attrs: Vec<ConntrackAttribute>) -> Option<Self> {
        let mut orig = None;
        let mut addresses = Vec::new();
        let mut identity = Vec::new();
        for attr in attrs {
            match attr {
                ConntrackAttribute::CtaTupleOrig(t) => {
                    addresses.extend(tuple_addresses(&t));
                    orig = Some(t);
                }
                ConntrackAttribute::CtaTupleReply(t) => addresses.extend(tuple_addresses(&t)),
                ConntrackAttribute::Other(nla) if matches!(nla.kind(), CTA_ID | CTA_ZONE) => {
                    identity.push(nla);
                }
                _ => {}
            }
        }
        Some(Self {
            family,
            addresses,
            orig: orig?,
            identity,
        })
    }

    /// The original tuple, for logs and errors.
    fn describe(&self) -> String {
        format!("{:?}", self.orig)
    }
}

fn tuple_addresses(tuple: &[Tuple]) -> impl Iterator<Item = IpAddr> + '_ {
    tuple
        .iter()
        .filter_map(|t| match t {
            Tuple::Ip(ips) => Some(ips),
            _ => None,
        })
        .flatten()
        .filter_map(|ip| match ip {
            IPTuple::SourceAddress(a) | IPTuple::DestinationAddress(a) => Some(*a),
            _ => None,
        })
}

/// Whether `entry` can steer packets to or from one of `addresses`: its original or reply
/// tuple names one (the pod as destination: a DNAT to it, a connection to it; as source: its
/// own connections, SNAT'd or not).
#[must_use]
pub fn names_any(entry: &Entry, addresses: &[IpAddr]) -> bool {
    entry.addresses.iter().any(|a| addresses.contains(a))
}

/// Deletes every conntrack entry of the calling thread's network namespace that
/// [`names_any`] of `addresses`; run it in the node's namespace (`NetNs::run`). Blocking (a
/// few netlink round trips and one listing of the table). An empty `addresses` does nothing.
pub fn forget_addresses(addresses: &[IpAddr]) -> Result<Forgotten, ConntrackError> {
    if addresses.is_empty() {
        return Ok(Forgotten {
            deleted: 0,
            tracking: true,
        });
    }
    let mut ct = match Ctnetlink::open() {
        Ok(ct) => ct,
        Err(ConntrackError::Socket(_)) if !conntrack_loaded() => return Ok(Forgotten::default()),
        Err(e) => return Err(e),
    };
    let entries = match ct.list() {
        Ok(entries) => entries,
        // Without conntrack in this namespace no entry exists; ctnetlink then may not answer.
        Err(ConntrackError::Dump(_)) if !conntrack_loaded() => return Ok(Forgotten::default()),
        Err(e) => return Err(e),
    };
    let mut deleted = 0;
    for entry in entries.iter().filter(|e| names_any(e, addresses)) {
        if ct.delete(entry)? {
            deleted += 1;
        }
    }
    Ok(Forgotten {
        deleted,
        tracking: true,
    })
}

/// `NFNLGRP_CONNTRACK_NEW`: the netlink multicast group of new conntrack entries.
const GROUP_NEW: u32 = 1;
/// Receive buffer asked for the subscription (`SO_RCVBUF`: the kernel caps it at
/// `net.core.rmem_max`); an overflow is reported, never silent: [`Seen::Lost`].
const EVENTS_BUFFER: usize = 4 << 20;
/// The namespace's switch of conntrack events (`0`: none are sent, whoever listens).
pub const EVENTS_SYSCTL: &str = "net/netfilter/nf_conntrack_events";

/// What a read of the subscription saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A new entry, naming these addresses (source and destination of its original and reply
    /// tuple).
    Named(Vec<IpAddr>),
    /// The kernel dropped events (the receive buffer overflowed): any address may be named now.
    Lost,
}

/// A subscription to the new entries of the conntrack table of the namespace it was opened
/// in (the kernel announces an entry once it is confirmed, i.e. before a packet of its flow
/// leaves the node's netfilter hooks). [`NewEntries::wait`] waits for events;
/// [`NewEntries::drain`] reads what is queued without waiting.
pub struct NewEntries {
    socket: TokioSocket,
}

impl std::fmt::Debug for NewEntries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewEntries").finish_non_exhaustive()
    }
}

impl NewEntries {
    /// Subscribes in the calling thread's namespace (run it there: `NetNs::run`, with the
    /// runtime entered: the socket registers with its reactor).
    pub fn subscribe() -> Result<Self, ConntrackError> {
        let mut socket = TokioSocket::new(NETLINK_NETFILTER).map_err(ConntrackError::Socket)?;
        let s = socket.socket_mut();
        s.bind_auto().map_err(ConntrackError::Socket)?;
        s.add_membership(GROUP_NEW)
            .map_err(ConntrackError::Socket)?;
        // Best effort: with the default buffer an overflow is still reported.
        let _ = s.set_rx_buf_sz(EVENTS_BUFFER);
        Ok(Self { socket })
    }

    /// Waits for the next events, hands them to `seen`, then everything else queued
    /// ([`Self::drain`]). Cancel-safe: nothing is read until it can be handed over whole.
    pub async fn wait(&self, mut seen: impl FnMut(Seen)) -> Result<(), ConntrackError> {
        match self.socket.recv_from_full().await {
            Ok((datagram, _)) => parse_events(&datagram, &mut seen)?,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => seen(Seen::Lost),
            Err(e) => return Err(ConntrackError::Events(e)),
        }
        self.drain(seen)
    }

    /// Reads everything queued now, handing each event to `seen`; returns once the queue is
    /// empty. Every entry confirmed before the call is seen by it (the kernel queues the event
    /// before the entry's packet goes on).
    pub fn drain(&self, mut seen: impl FnMut(Seen)) -> Result<(), ConntrackError> {
        loop {
            match self.socket.socket_ref().recv_from_full() {
                Ok((datagram, _)) => parse_events(&datagram, &mut seen)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => seen(Seen::Lost),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ConntrackError::Events(e)),
            }
        }
    }
}

/// The new-entry events of one datagram.
fn parse_events(datagram: &[u8], seen: &mut impl FnMut(Seen)) -> Result<(), ConntrackError> {
    for msg in messages(datagram)? {
        if let NetlinkPayload::InnerMessage(m) = msg.payload
            && let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = m.inner
            && let Some(entry) = Entry::from_listing(m.header.family, attrs)
        {
            seen(Seen::Named(entry.addresses));
        }
    }
    Ok(())
}

/// The netlink messages of one datagram, in order.
fn messages(datagram: &[u8]) -> Result<Vec<NetlinkMessage<NetfilterMessage>>, ConntrackError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < datagram.len() {
        let msg = NetlinkMessage::<NetfilterMessage>::deserialize(&datagram[at..])
            .map_err(|e| ConntrackError::Decode(e.to_string()))?;
        let len = usize::try_from(msg.header.length).unwrap_or(0);
        if len == 0 {
            return Err(ConntrackError::Decode("zero-length message".to_owned()));
        }
        at += len.next_multiple_of(4);
        out.push(msg);
    }
    Ok(out)
}

/// Whether this namespace tracks connections (the conntrack module is loaded).
fn conntrack_loaded() -> bool {
    std::path::Path::new(CONNTRACK_COUNT).exists()
}

/// A ctnetlink socket of the calling thread's namespace.
struct Ctnetlink {
    socket: Socket,
    seq: u32,
}

impl Ctnetlink {
    fn open() -> Result<Self, ConntrackError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(ConntrackError::Socket)?;
        socket.bind_auto().map_err(ConntrackError::Socket)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(ConntrackError::Socket)?;
        Ok(Self { socket, seq: 0 })
    }

    fn send(
        &mut self,
        flags: u16,
        family: NetfilterProtoFamily,
        msg: ConntrackMessage,
    ) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(
            header,
            NetlinkPayload::from(NetfilterMessage::new(
                NetfilterHeader::new(family, 0, 0),
                msg,
            )),
        );
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        Ok(self.seq)
    }

    /// Reads the answers to request `seq` until its end (`Done`, or the ack/error of a
    /// non-dump request), handing each conntrack message to `each`.
    fn answers(
        &self,
        seq: u32,
        mut each: impl FnMut(NetfilterMessage),
    ) -> Result<Result<(), io::Error>, ConntrackError> {
        loop {
            let (datagram, _) = self.socket.recv_from_full().map_err(ConntrackError::Dump)?;
            for msg in messages(&datagram)? {
                if msg.header.sequence_number != seq {
                    continue;
                }
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(Ok(())),
                    NetlinkPayload::Error(e) if e.code.is_none() => return Ok(Ok(())),
                    NetlinkPayload::Error(e) => return Ok(Err(e.to_io())),
                    NetlinkPayload::InnerMessage(m) => each(m),
                    _ => {}
                }
            }
        }
    }

    /// Lists the table (every family).
    fn list(&mut self) -> Result<Vec<Entry>, ConntrackError> {
        let seq = self
            .send(
                NLM_F_REQUEST | NLM_F_DUMP,
                NetfilterProtoFamily::Unspec,
                ConntrackMessage::Get(Vec::new()),
            )
            .map_err(ConntrackError::Dump)?;
        let mut entries = Vec::new();
        self.answers(seq, |m| {
            if let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)) = m.inner {
                entries.extend(Entry::from_listing(m.header.family, attrs));
            }
        })?
        .map_err(ConntrackError::Dump)?;
        Ok(entries)
    }

    /// Deletes `entry`; false when it was already gone.
    fn delete(&mut self, entry: &Entry) -> Result<bool, ConntrackError> {
        let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(entry.orig.clone())];
        attrs.extend(
            entry
                .identity
                .iter()
                .cloned()
                .map(ConntrackAttribute::Other),
        );
        let failed = |source| ConntrackError::Delete {
            entry: entry.describe(),
            source,
        };
        let seq = self
            .send(
                NLM_F_REQUEST | NLM_F_ACK,
                entry.family,
                ConntrackMessage::Delete(attrs),
            )
            .map_err(failed)?;
        match self.answers(seq, |_| {})? {
            Ok(()) => Ok(true),
            // ENOENT: already gone (expired, or deleted by someone else)
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(failed(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_netfilter::conntrack::{ProtoTuple, Protocol};

    fn tuple(src: &str, dst: &str) -> Vec<Tuple> {
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(src.parse().unwrap()),
                IPTuple::DestinationAddress(dst.parse().unwrap()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(Protocol::Udp),
                ProtoTuple::SourcePort(40000),
                ProtoTuple::DestinationPort(53),
            ]),
        ]
    }

    fn entry(orig: (&str, &str), reply: (&str, &str)) -> Entry {
        Entry::from_listing(
            NetfilterProtoFamily::IPv4,
            vec![
                ConntrackAttribute::CtaTupleOrig(tuple(orig.0, orig.1)),
                ConntrackAttribute::CtaTupleReply(tuple(reply.0, reply.1)),
            ],
        )
        .unwrap()
    }

    #[test]
    fn an_entry_naming_the_address_in_any_tuple_is_forgotten_others_kept() {
        let pod: Vec<IpAddr> = vec!["10.0.0.7".parse().unwrap()];
        // kube-proxy's DNAT of a service to the pod: the pod only in the reply tuple.
        let dnat = entry(("10.0.1.2", "172.20.0.10"), ("10.0.0.7", "10.0.1.2"));
        // the pod's egress SNAT'd to the node: the pod only in the original tuple.
        let snat = entry(("10.0.0.7", "1.1.1.1"), ("1.1.1.1", "10.0.0.5"));
        // a direct connection to the pod.
        let direct = entry(("10.0.1.2", "10.0.0.7"), ("10.0.0.7", "10.0.1.2"));
        // another pod's flow.
        let other = entry(("10.0.0.8", "1.1.1.1"), ("1.1.1.1", "10.0.0.5"));
        assert!(names_any(&dnat, &pod));
        assert!(names_any(&snat, &pod));
        assert!(names_any(&direct, &pod));
        assert!(!names_any(&other, &pod));
        assert!(!names_any(&dnat, &[]));
    }

    #[test]
    fn a_delete_names_the_listed_original_tuple_zone_and_id() {
        let zone = DefaultNla::new(CTA_ZONE, vec![0, 5]);
        let id = DefaultNla::new(CTA_ID, vec![0, 0, 0, 9]);
        let e = Entry::from_listing(
            NetfilterProtoFamily::IPv6,
            vec![
                ConntrackAttribute::CtaTupleOrig(tuple("fd00::1", "fd00::2")),
                ConntrackAttribute::CtaTupleReply(tuple("fd00::2", "fd00::1")),
                ConntrackAttribute::CtaMark(7),
                ConntrackAttribute::Other(zone.clone()),
                ConntrackAttribute::Other(id.clone()),
            ],
        )
        .unwrap();
        assert_eq!(e.family, NetfilterProtoFamily::IPv6);
        assert_eq!(e.orig, tuple("fd00::1", "fd00::2"));
        assert_eq!(e.identity, vec![zone, id]);
        assert_eq!(e.addresses.len(), 4);
        // no original tuple: nothing a delete could name
        assert!(
            Entry::from_listing(
                NetfilterProtoFamily::IPv4,
                vec![ConntrackAttribute::CtaMark(1)]
            )
            .is_none()
        );
    }
}
