//! Link announcements of one namespace: a route-netlink socket subscribed to the kernel's link
//! multicast group (`RTNLGRP_LINK`), turned into a generation counter that moves whenever a link
//! is added, changed or removed there. Lets a waiter for a link (an ENI's, once EC2 attached it)
//! act the moment the kernel announces it instead of polling. Owns the socket and its reader
//! task; must not interpret links (read them with [`crate::Netlink::links`]).

use futures::StreamExt as _;
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::{AsyncSocket as _, SocketAddr};
use tokio::sync::watch;

use crate::netlink::NetlinkError;
use crate::netns::NetNs;

/// The subscription; dropping it closes the socket.
#[derive(Debug)]
pub struct LinkEvents {
    rx: watch::Receiver<u64>,
    tasks: [tokio::task::JoinHandle<()>; 2],
}

impl LinkEvents {
    /// A receiver of the generation: `changed()` resolves at the next link announcement.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.rx.clone()
    }

    /// Announcements seen so far.
    #[must_use]
    pub fn generation(&self) -> u64 {
        *self.rx.borrow()
    }
}

impl Drop for LinkEvents {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl NetNs {
    /// Subscribes to this namespace's link announcements. Must be called from within a tokio
    /// runtime (the socket registers with its reactor; the reader tasks are spawned on it).
    pub async fn link_events(&self) -> Result<LinkEvents, NetlinkError> {
        let runtime = tokio::runtime::Handle::current();
        let (mut conn, _handle, mut messages) = self
            .run(|| {
                let _entered = runtime.enter();
                rtnetlink::new_connection()
            })
            .map_err(NetlinkError::NetNs)?
            .map_err(NetlinkError::Socket)?;
        conn.socket_mut()
            .socket_mut()
            .bind(&SocketAddr::new(0, rtnetlink::constants::RTMGRP_LINK))
            .map_err(NetlinkError::Socket)?;
        let (tx, rx) = watch::channel(0u64);
        let driver = tokio::spawn(conn);
        let reader = tokio::spawn(async move {
            while let Some((msg, _)) = messages.next().await {
                if matches!(
                    msg.payload,
                    NetlinkPayload::InnerMessage(
                        RouteNetlinkMessage::NewLink(_) | RouteNetlinkMessage::DelLink(_)
                    )
                ) {
                    tx.send_modify(|g| *g += 1);
                }
            }
        });
        Ok(LinkEvents {
            rx,
            tasks: [driver, reader],
        })
    }
}
