//! The IPv6 intents of the IPAM service: register an ENI's /80, give a pod a /128 (IPv6 mode:
//! from the primary ENI's prefix; dual-stack: from the ENI of the pod's IPv4, delegating a /80
//! to it first when it has none), release it on DEL; each change checkpointed before it is
//! answered, rolled back when the write fails. Must not: hold the lock across `.await`, know
//! gRPC types.

use super::{Ipam, IpamError};
use crate::datastore::{IpamKey, PodMetadata, V6Assignment, V6Error, V6Prefix};
use crate::pool::provider::EniProvider;

pub(super) fn v6_error(e: V6Error) -> IpamError {
    match e {
        V6Error::NoPrefix(_) => IpamError::NotReady("no IPv6 prefix on this node yet"),
        V6Error::Exhausted => IpamError::NoAvailableAddress(std::time::Duration::ZERO),
        V6Error::UnknownPod(k) => IpamError::UnknownPod(k),
    }
}

impl<P: EniProvider> Ipam<P> {
    /// Registers an ENI's /80 (IPv6 mode: the primary ENI's, at node init).
    pub fn add_ipv6_prefix(&self, prefix: V6Prefix) {
        self.core().v6.add_prefix(prefix);
        self.refresh_gauges();
    }

    /// IPv6 mode's node init (upstream `setupENI` → `assignIPv6Prefix` for the primary ENI):
    /// the primary ENI's /80, delegated by EC2 now if it has none, registered for pods.
    pub async fn init_ipv6_mode(&self) -> Result<V6Prefix, IpamError> {
        let primary = self.read(|ds| {
            ds.eni_views()
                .into_iter()
                .find(|e| e.spec.is_primary)
                .map(|e| (e.spec.id, e.spec.device_number, e.route_table))
        });
        let Some((eni_id, device_number, route_table)) = primary else {
            return Err(IpamError::Internal("no primary ENI".into()));
        };
        let net = self
            .provider
            .ipv6_prefix(&eni_id)
            .await
            .map_err(|e| IpamError::Internal(format!("IPv6 prefix of {eni_id}: {e}")))?;
        let prefix = V6Prefix {
            eni_id,
            net,
            device_number,
            route_table,
        };
        self.add_ipv6_prefix(prefix.clone());
        Ok(prefix)
    }

    /// The registered /80 prefixes.
    #[must_use]
    pub fn ipv6_prefixes(&self) -> Vec<V6Prefix> {
        self.core().v6.prefixes().to_vec()
    }

    /// Every pod's IPv6 address, sorted by key.
    #[must_use]
    pub fn ipv6_assignments(&self) -> Vec<(IpamKey, PodMetadata, V6Assignment)> {
        self.core().v6.assignments()
    }

    /// The IPv6 address `key` holds.
    #[must_use]
    pub fn ipv6_of(&self, key: &IpamKey) -> Option<V6Assignment> {
        self.core().v6.lookup(key)
    }

    fn try_assign_v6(
        &self,
        key: &IpamKey,
        metadata: PodMetadata,
        eni_id: Option<&str>,
    ) -> Result<V6Assignment, IpamError> {
        let now = self.now();
        let mut core = self.core();
        if let Some(a) = core.v6.lookup(key) {
            return Ok(a);
        }
        // As `try_assign`: no new assignment once shutting down (also a dual-stack pod's IPv6).
        if self.is_shutting_down() {
            return Err(IpamError::NotReady("shutting down"));
        }
        let before = core.v6.clone();
        let a = core
            .v6
            .assign(key, metadata, eni_id, now)
            .map_err(v6_error)?;
        if let Err(e) = core.persist() {
            core.v6 = before;
            tracing::error!(error = %e, %key, "checkpoint write failed; IPv6 assignment rolled back");
            return Err(IpamError::CheckpointFailed(e.to_string()));
        }
        Ok(a)
    }

    /// AddNetwork in IPv6 mode: a /128 of a registered prefix (the same one on a repeated
    /// call). No warm pool: nothing to wait for.
    pub fn add_v6(&self, key: &IpamKey, metadata: PodMetadata) -> Result<V6Assignment, IpamError> {
        self.metrics.add_ip_req_count.inc();
        if self.is_shutting_down() {
            return Err(IpamError::NotReady("shutting down"));
        }
        let r = super::blocking(|| self.try_assign_v6(key, metadata, None));
        match &r {
            Ok(_) => self.refresh_gauges(),
            Err(e) => {
                if matches!(e, IpamError::NoAvailableAddress(_)) {
                    self.metrics.no_available_ip_addresses.inc();
                }
                self.metrics.ipamd_error("AddNetwork");
            }
        }
        r
    }

    /// The IPv6 half of a dual-stack AddNetwork: a /128 of `eni_id`'s /80 (the ENI of the
    /// pod's IPv4), asking EC2 for the prefix (delegating one if the ENI has none) the first
    /// time this ENI is used.
    /// Test builds only: the daemon takes both halves at once ([`Self::add_pod`]).
    #[cfg(any(test, feature = "fake"))]
    pub async fn add_dual_stack_v6(
        &self,
        key: &IpamKey,
        metadata: PodMetadata,
        eni_id: &str,
        device_number: u32,
        route_table: u32,
    ) -> Result<V6Assignment, IpamError> {
        let known = self.core().v6.prefix_of(eni_id).is_some();
        if !known && self.ipv6_of(key).is_none() {
            self.register_prefix_of(eni_id, device_number, route_table)
                .await?;
        }
        let r = super::blocking(|| self.try_assign_v6(key, metadata, Some(eni_id)));
        if r.is_ok() {
            self.refresh_gauges();
        } else {
            self.metrics.ipamd_error("AddNetwork");
        }
        r
    }

    /// The /80 of the ENI a dual-stack pod's IPv4 is on, asked of EC2 (which delegates one if
    /// the ENI has none) and registered, so its /128s can be handed out.
    pub(super) async fn register_dual_stack_prefix(
        &self,
        a: &crate::datastore::Assignment,
    ) -> Result<(), IpamError> {
        self.register_prefix_of(&a.eni_id, a.device_number, a.route_table)
            .await
    }

    async fn register_prefix_of(
        &self,
        eni_id: &str,
        device_number: u32,
        route_table: u32,
    ) -> Result<(), IpamError> {
        let net = self.provider.ipv6_prefix(eni_id).await.map_err(|e| {
            self.metrics.ipamd_error("AddNetwork");
            IpamError::Internal(format!("IPv6 prefix of {eni_id}: {e}"))
        })?;
        tracing::info!(eni = eni_id, prefix = %net, "IPv6 prefix registered for dual-stack pods");
        self.add_ipv6_prefix(V6Prefix {
            eni_id: eni_id.to_owned(),
            net,
            device_number,
            route_table,
        });
        Ok(())
    }

    /// DelNetwork's IPv6 release: `key`'s /128 (or that of another key only this sandbox can
    /// hold: see [`Self::del_candidates`]) goes into cooldown, checkpointed; a failed write puts
    /// it back. An entry recovered from host state that only the pod name matches is left to
    /// `reclaim`, as for IPv4.
    /// Test builds only: the daemon releases every family of a pod at once
    /// ([`Self::del_pod`]).
    #[cfg(any(test, feature = "fake"))]
    pub fn del_v6(
        &self,
        key: &IpamKey,
        pod_namespace: &str,
        pod_name: &str,
    ) -> Result<V6Assignment, IpamError> {
        let now = self.now();
        let mut core = self.core();
        let Some(found) = self
            .del_candidates(key)
            .into_iter()
            .find(|k| core.v6.lookup(k).is_some())
        else {
            let by_pod_name = self.recovered_by_pod_name(pod_namespace, pod_name);
            let recovered = by_pod_name.filter(|k| core.v6.lookup(k).is_some());
            drop(core);
            self.ask_reclaim(key, recovered);
            return Err(IpamError::UnknownPod(key.clone()));
        };
        let a = Self::release_v6(&mut core, &found, now)?;
        drop(core);
        self.refresh_gauges();
        Ok(a)
    }

    fn release_v6(
        core: &mut super::Core,
        key: &IpamKey,
        now: std::time::SystemTime,
    ) -> Result<V6Assignment, IpamError> {
        let before = core.v6.clone();
        let a = core.v6.unassign(key, now).map_err(v6_error)?;
        if let Err(e) = core.persist() {
            core.v6 = before;
            tracing::error!(error = %e, %key, "checkpoint write failed; IPv6 release rolled back");
            return Err(IpamError::CheckpointFailed(e.to_string()));
        }
        super::release::record_cooling(core, now);
        Ok(a)
    }

    /// Every held IPv6 address as a checkpoint entry (for `reclaim`).
    #[must_use]
    pub fn v6_allocations(&self) -> Vec<crate::datastore::CheckpointEntry> {
        self.core().v6.checkpoint_entries()
    }

    /// Releases `key`'s /128 for [`crate::reclaim`] (its pod is gone and its DEL never came),
    /// only if `key` still holds `ip` and was not given it again since `seen_assigned_at`.
    /// Returns whether it released. The address cools down as after a DEL.
    pub fn reclaim_v6(
        &self,
        key: &IpamKey,
        ip: std::net::Ipv6Addr,
        seen_assigned_at: std::time::SystemTime,
    ) -> Result<bool, IpamError> {
        let now = self.now();
        let mut core = self.core();
        let holds = core.v6.lookup(key).is_some_and(|a| a.ip == ip);
        if !holds
            || core
                .v6
                .assigned_at(key)
                .is_some_and(|at| at > seen_assigned_at)
        {
            return Ok(false);
        }
        Self::release_v6(&mut core, key, now)?;
        drop(core);
        self.refresh_gauges();
        Ok(true)
    }
}
