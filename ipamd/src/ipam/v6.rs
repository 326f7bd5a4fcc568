//! The IPv6 intents of the IPAM service: register an ENI's /80, give a pod a /128 (IPv6 mode:
//! from the primary ENI's prefix; dual-stack: from the ENI of the pod's IPv4, delegating a /80
//! to it first when it has none), release it on DEL; each change checkpointed before it is
//! answered, rolled back when the write fails. Must not: hold the lock across `.await`, know
//! gRPC types.

use super::{Ipam, IpamError};
use crate::datastore::{IpamKey, PodMetadata, V6Assignment, V6Error, V6Prefix};

pub(super) fn v6_error(e: V6Error) -> IpamError {
    match e {
        V6Error::NoPrefix(_) => IpamError::NotReady("no IPv6 prefix on this node yet"),
        V6Error::Exhausted => IpamError::NoAvailableAddress(std::time::Duration::ZERO),
        V6Error::UnknownPod(k) => IpamError::UnknownPod(k),
    }
}

impl Ipam {
    /// Registers `net` as `eni_id`'s /80 (IPv6 mode: the primary ENI's; dual-stack: any ENI's,
    /// by the pool loop), with the ENI's device number and route table from the datastore, and
    /// wakes AddNetwork calls that wait for it.
    pub fn register_ipv6_prefix(
        &self,
        eni_id: &str,
        net: ipnet::Ipv6Net,
    ) -> Result<V6Prefix, IpamError> {
        let eni = self.index.read(|ds| {
            ds.eni_views()
                .into_iter()
                .find(|e| e.spec.id == eni_id)
                .map(|e| (e.spec.device_number, e.route_table))
        });
        let Some((device_number, route_table)) = eni else {
            return Err(IpamError::Internal(format!(
                "IPv6 prefix {net} of {eni_id}: the ENI is not on this node"
            )));
        };
        let prefix = V6Prefix {
            eni_id: eni_id.to_owned(),
            net,
            device_number,
            route_table,
        };
        self.index.add_ipv6_prefix(prefix.clone());
        self.signal.prefix_registered(eni_id);
        Ok(prefix)
    }

    /// The ENIs whose /80 the pool loop should ask EC2 for now: those an AddNetwork waits for,
    /// and (`every_eni`, dual-stack nodes) every ENI without one whose last ask did not fail.
    #[must_use]
    pub fn ipv6_prefixes_wanted(&self, every_eni: bool) -> Vec<String> {
        let (wanted, failed) = self.signal.prefix_asks();
        if wanted.is_empty() && !every_eni {
            // The common pass: nothing asked, nothing to look up.
            return Vec::new();
        }
        let (known, all): (std::collections::BTreeSet<String>, Vec<String>) = {
            let core = self.index.core();
            let known = core.pools[0]
                .v6
                .prefixes()
                .iter()
                .map(|p| p.eni_id.clone())
                .collect();
            let all = if every_eni {
                core.pools[0].ds.enis().keys().cloned().collect()
            } else {
                Vec::new()
            };
            (known, all)
        };
        let mut out: Vec<String> = wanted;
        for id in all {
            if !failed.contains(&id) && !out.contains(&id) {
                out.push(id);
            }
        }
        out.retain(|id| !known.contains(id));
        out
    }

    fn try_assign_v6(
        &self,
        key: &IpamKey,
        metadata: PodMetadata,
        eni_id: Option<&str>,
    ) -> Result<V6Assignment, IpamError> {
        let now = self.now();
        let mut core = self.index.core();
        if let Some(a) = core.pools[0].v6.lookup(key) {
            return Ok(a);
        }
        // As `try_assign`: no new assignment once shutting down (also a dual-stack pod's IPv6).
        if self.is_shutting_down() {
            return Err(IpamError::NotReady("shutting down"));
        }
        let before = core.pools[0].v6.clone();
        let a = core.pools[0]
            .v6
            .assign(key, metadata, eni_id, now)
            .map_err(v6_error)?;
        if let Err(e) = core.persist() {
            core.pools[0].v6 = before;
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
            Ok(_) => {
                self.index.refresh_gauges();
            }
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
    /// pod's IPv4), which must be registered already.
    /// Test builds only: the daemon takes both halves at once ([`Self::add_pod`]).
    #[cfg(any(test, feature = "fake"))]
    #[cfg(any(test, feature = "fake"))]
    pub fn add_dual_stack_v6(
        &self,
        key: &IpamKey,
        metadata: PodMetadata,
        eni_id: &str,
    ) -> Result<V6Assignment, IpamError> {
        let r = super::blocking(|| self.try_assign_v6(key, metadata, Some(eni_id)));
        if r.is_ok() {
            self.index.refresh_gauges();
        } else {
            self.metrics.ipamd_error("AddNetwork");
        }
        r
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
        let mut core = self.index.core();
        let Some(found) = self
            .del_candidates(key)
            .into_iter()
            .find(|k| core.pools[0].v6.lookup(k).is_some())
        else {
            let by_pod_name = self.recovered_by_pod_name(pod_namespace, pod_name);
            let recovered = by_pod_name.filter(|k| core.pools[0].v6.lookup(k).is_some());
            drop(core);
            self.ask_reclaim(key, recovered);
            return Err(IpamError::UnknownPod(key.clone()));
        };
        let a = Self::release_v6(&mut core, &found, now)?;
        drop(core);
        self.index.refresh_gauges();
        Ok(a)
    }

    fn release_v6(
        core: &mut super::Core,
        key: &IpamKey,
        now: std::time::SystemTime,
    ) -> Result<V6Assignment, IpamError> {
        let before = core.pools[0].v6.clone();
        let a = core.pools[0].v6.unassign(key, now).map_err(v6_error)?;
        if let Err(e) = core.persist() {
            core.pools[0].v6 = before;
            tracing::error!(error = %e, %key, "checkpoint write failed; IPv6 release rolled back");
            return Err(IpamError::CheckpointFailed(e.to_string()));
        }
        core.pools[0].record_cooling(now);
        Ok(a)
    }

    /// Releases `key`'s /128 for the reclaim loop (`reclaim`) (its pod is gone and its DEL never came),
    /// only if `key` still holds `ip` and was not given it again since `seen_assigned_at`.
    /// Returns whether it released. The address cools down as after a DEL.
    pub(super) fn reclaim_v6(
        &self,
        key: &IpamKey,
        ip: std::net::Ipv6Addr,
        seen_assigned_at: std::time::SystemTime,
    ) -> Result<bool, IpamError> {
        let now = self.now();
        let mut core = self.index.core();
        let holds = core.pools[0].v6.lookup(key).is_some_and(|a| a.ip == ip);
        if !holds
            || core.pools[0]
                .v6
                .assigned_at(key)
                .is_some_and(|at| at > seen_assigned_at)
        {
            return Ok(false);
        }
        Self::release_v6(&mut core, key, now)?;
        drop(core);
        self.index.refresh_gauges();
        Ok(true)
    }
}
