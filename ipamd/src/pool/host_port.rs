//! The host port of the pool loop: setting up and tearing down an ENI's host networking (link,
//! route table, rules), the step the manager and the reconciler run after EC2 attached or
//! before they drop an ENI. Owns the port and its typed error; must not know netlink (the
//! implementation over `host::HostNetwork` is `node_init::HostEnis`).

use std::future::Future;
use std::sync::Arc;

use crate::pool::ec2_port::AttachedEni;

/// Why an ENI's host networking could not be set up or removed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EniHostError {
    /// The ENI's MAC address does not parse.
    #[error("bad mac {0:?}")]
    BadMac(String),
    /// The ENI's link never appeared in the host namespace.
    #[error("link of {0} never appeared")]
    NoLink(String),
    /// The kernel refused a change (netlink, iptables).
    #[error("host networking: {0}")]
    Kernel(String),
    /// A kernel setting the ENI needs is wrong and ipamd may not change it (its container's
    /// sysctl tree is read-only); `cause` names what grants it (the privileged init
    /// container). The ENI stays not host-ready and the set-up is retried.
    #[error("host networking of {eni}: {cause}")]
    KernelSetting {
        /// The ENI.
        eni: String,
        /// Which setting, and who sets it.
        cause: crate::host::EniPlanError,
    },
}

/// Host networking of ENIs.
pub trait EniHost: Send + Sync + 'static {
    /// Sets up the ENI's link, table and rules (idempotent). `Some(table)`: the node's OS already
    /// routes the ENI by `table` (a card > 0 ENI on AMIs that configure every interface), which the
    /// ENI's routes and its pods' rules then use ([`crate::ipam::Index::set_eni_table`]); `None`:
    /// ipamd's own table.
    fn setup(
        &self,
        eni: &AttachedEni,
    ) -> impl Future<Output = Result<Option<u32>, EniHostError>> + Send;
    /// Removes a freed ENI's table and rules.
    fn teardown(&self, eni: &AttachedEni) -> impl Future<Output = Result<(), EniHostError>> + Send;
    /// How many link announcements the host has seen (0: it has none): a set-up that failed
    /// for want of a link is worth retrying once this moved.
    fn link_generation(&self) -> u64 {
        0
    }
    /// Resolves at the host's next link announcement (never, without announcements).
    fn links_changed(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// No host networking (unit tests, the in-memory provider).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHost;

impl EniHost for NoHost {
    async fn setup(&self, _eni: &AttachedEni) -> Result<Option<u32>, EniHostError> {
        Ok(None)
    }
    async fn teardown(&self, _eni: &AttachedEni) -> Result<(), EniHostError> {
        Ok(())
    }
}

impl<H: EniHost> EniHost for Arc<H> {
    async fn setup(&self, eni: &AttachedEni) -> Result<Option<u32>, EniHostError> {
        (**self).setup(eni).await
    }
    async fn teardown(&self, eni: &AttachedEni) -> Result<(), EniHostError> {
        (**self).teardown(eni).await
    }
    fn link_generation(&self) -> u64 {
        (**self).link_generation()
    }
    async fn links_changed(&self) {
        (**self).links_changed().await;
    }
}
