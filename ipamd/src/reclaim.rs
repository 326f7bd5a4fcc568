//! Reclaiming the addresses of pods that are gone although ipamd never saw their DelNetwork (the
//! plugin's DEL succeeds from prevResult while ipamd is down or restarting). Owns the pure decision
//! (held assignments + host wiring + time → keys to release) and the loop that reads the host and
//! applies it through [`Ipam`]. Must not: change the kernel (it only reads
//! `dataplane::host_state`), release an address whose pod shows any sign of life.
//!
//! Evidence of life is per pod (IPAM key), never per address: a dual-stack pod's IPv4 and IPv6
//! entries share its key and are decided together. A pod is alive while the host has a `/32`
//! (IPv4) or `/128` (IPv6) route to any of its addresses (any device) or a link with one of the
//! host veth names the plugin could have given it, unless that veth routes only addresses other
//! pods hold (another sandbox of the same pod owns it now). One family's route gone (`ip route
//! del`, an agent flushing a table) therefore releases nothing while the veth lives. Only a pod
//! that has shown none of this for a whole grace period, and whose newest entry is itself older
//! than that period (so an ADD whose wiring is still in flight is never touched), is released,
//! both families in the same round, into the usual cooldown.
//!
//! Pod rules (512 `to <ip>`, 1536 `from <ip>`) are the one kernel state it changes: those of an
//! address it releases, and stale ones no pod holds (a teardown that failed; at the same
//! priority they would shadow the next pod given that address). The address is fenced in the
//! datastore (never handed out) while its rules are deleted, so a new pod's rules are never
//! touched.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use dataplane::conventions::{host_veth_name, host_veth_name_for_container};
use tokio_util::sync::CancellationToken;

use crate::datastore::{CheckpointEntry, IpamKey, RECOVERED_NETWORK_NAME};
use crate::host::HostNetwork;
use crate::host::SeamError;
use crate::ipam::Ipam;

/// What the host shows of pods right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wiring {
    /// Destinations of `/32` routes in the main table and of `/128` IPv6 routes, whatever the
    /// device.
    pub routed: BTreeSet<IpAddr>,
    /// Link names in the host netns.
    pub links: BTreeSet<String>,
    /// Host route destinations per device.
    pub routes_by_link: BTreeMap<String, BTreeSet<IpAddr>>,
}

impl Wiring {
    /// Whether link `name` can be the veth of the pod `key`: it exists and does not route only
    /// addresses other pods hold (`holder`: address → key). A pod-name veth is shared by every
    /// sandbox of the pod (a StatefulSet pod re-created before its old sandbox was deleted):
    /// once it routes the new sandbox's addresses, it no longer vouches for the old one. A veth
    /// that routes one of this pod's addresses (either family: the other family's route may be
    /// gone), an address no pod holds, or nothing at all (an ADD still wiring, routes removed
    /// by someone) vouches.
    fn vouches(&self, name: &str, key: &IpamKey, holder: &BTreeMap<IpAddr, &IpamKey>) -> bool {
        if name.len() == dataplane::conventions::VETH_HASH_LEN {
            return self.vouches_any_prefix(name, key, holder);
        }
        self.links.contains(name)
            && self.routes_by_link.get(name).is_none_or(|routes| {
                routes.is_empty()
                    || routes
                        .iter()
                        .any(|ip| holder.get(ip).is_none_or(|k| *k == key))
            })
    }
}

impl Wiring {
    /// Whether a link named `<prefix><hash>`, with any veth prefix (1 to 4 characters), vouches
    /// for the pod `key` ([`Self::vouches`]).
    fn vouches_any_prefix(
        &self,
        hash: &str,
        key: &IpamKey,
        holder: &BTreeMap<IpAddr, &IpamKey>,
    ) -> bool {
        self.links.iter().any(|link| {
            link.len() > hash.len()
                && link.len() - hash.len() <= dataplane::conventions::MAX_VETH_PREFIX_LEN
                && link.ends_with(hash)
                && self.vouches(link, key, holder)
        })
    }

    /// Reads the current netns (blocking procfs reads).
    pub fn read() -> std::io::Result<Self> {
        let routes = dataplane::host_state::pod_host_routes("")?;
        let mut routes_by_link: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
        for (ip, dev) in &routes {
            routes_by_link.entry(dev.clone()).or_default().insert(*ip);
        }
        Ok(Self {
            routed: routes.into_iter().map(|(ip, _)| ip).collect(),
            links: dataplane::host_state::link_names()?,
            routes_by_link,
        })
    }
}

/// The host veth names the plugin could have given this assignment's pod: with the configured
/// prefix, and the same names' hashed part alone ([`Wiring::vouches_any_prefix`]: a pod wired under
/// another prefix — a takeover, a changed `AWS_VPC_K8S_CNI_VETHPREFIX` — is still alive while its
/// veth is).
fn veth_names(e: &CheckpointEntry, veth_prefix: &str) -> Vec<String> {
    let mut names = veth_names_with(e, veth_prefix);
    names.extend(veth_names_with(e, "").into_iter().filter(|n| !n.is_empty()));
    names
}

fn veth_names_with(e: &CheckpointEntry, veth_prefix: &str) -> Vec<String> {
    let k = &e.key;
    let mut names = vec![host_veth_name_for_container(
        veth_prefix,
        &k.container_id,
        &k.if_name,
    )];
    // A multi-NIC pod's further interfaces (one per card): each has its own host veth, and
    // any of them alive keeps every address of the pod (its card-N address may be routed only
    // through its own veth, or through none).
    for index in 1..e.metadata.interfaces_count {
        names.push(host_veth_name_for_container(
            veth_prefix,
            &k.container_id,
            &format!("{}.{index}", k.if_name),
        ));
        if !e.metadata.name.is_empty() {
            names.push(dataplane::conventions::host_veth_name_at(
                veth_prefix,
                &e.metadata.namespace,
                &e.metadata.name,
                index,
            ));
        }
    }
    if k.network_name == RECOVERED_NETWORK_NAME && !veth_prefix.is_empty() {
        names.push(k.container_id.clone());
    }
    if !e.metadata.name.is_empty() {
        names.push(host_veth_name(
            veth_prefix,
            &e.metadata.namespace,
            &e.metadata.name,
        ));
    }
    names
}

/// One pod as `reclaim` judges it: every entry of one IPAM key (a dual-stack pod has two).
#[derive(Debug)]
struct Pod {
    ips: BTreeSet<IpAddr>,
    /// Every host veth name the plugin could have given it.
    veths: BTreeSet<String>,
    /// The newest assignment time of its entries (a retried ADD refreshes it).
    newest: SystemTime,
}

/// How often `reclaim` looks while a DelNetwork waits for a recovered entry's wiring to go.
pub const DEL_SEEN_PERIOD: Duration = Duration::from_secs(1);

/// Remembers since when each pod (IPAM key: a dual-stack pod holds one address of each family
/// under one key) has looked unwired.
#[derive(Debug)]
pub struct Reclaimer {
    grace: Duration,
    veth_prefix: String,
    suspects: BTreeMap<IpamKey, SystemTime>,
    /// Released IPv4s whose conntrack entries could not be deleted yet: they stay fenced (never
    /// handed out) and are tried again every round (docs/host-networking.md, "Conntrack-safe
    /// address reuse").
    unforgotten: BTreeSet<Ipv4Addr>,
}

impl Reclaimer {
    /// Releases after `grace` without wiring; pods' veths start with `veth_prefix`.
    #[must_use]
    pub fn new(grace: Duration, veth_prefix: &str) -> Self {
        Self {
            grace,
            veth_prefix: veth_prefix.to_owned(),
            suspects: BTreeMap::new(),
            unforgotten: BTreeSet::new(),
        }
    }

    /// The assignments (either family) to release now, given everything held and the host's
    /// wiring: every address of each pod to release, the pods in key order, a pod's IPv4
    /// before its IPv6.
    pub fn decide(
        &mut self,
        held: &[CheckpointEntry],
        wiring: &Wiring,
        now: SystemTime,
    ) -> Vec<(IpamKey, IpAddr)> {
        self.decide_with(held, wiring, &BTreeSet::new(), now)
    }

    /// As [`Self::decide`]; pods in `del_seen` (a DelNetwork asked for them) are released as
    /// soon as they look unwired, without the grace period.
    pub fn decide_with(
        &mut self,
        held: &[CheckpointEntry],
        wiring: &Wiring,
        del_seen: &BTreeSet<IpamKey>,
        now: SystemTime,
    ) -> Vec<(IpamKey, IpAddr)> {
        let old_enough = |t: SystemTime| now.duration_since(t).is_ok_and(|d| d >= self.grace);
        // Each pod with its addresses, the veth names it could have, its newest assignment.
        let mut pods: BTreeMap<&IpamKey, Pod> = BTreeMap::new();
        let mut holder: BTreeMap<IpAddr, &IpamKey> = BTreeMap::new();
        for e in held {
            let Some(ip) = e.ip() else { continue };
            let pod = pods.entry(&e.key).or_insert_with(|| Pod {
                ips: BTreeSet::new(),
                veths: BTreeSet::new(),
                newest: e.allocated_at(),
            });
            pod.ips.insert(ip);
            pod.veths.extend(veth_names(e, &self.veth_prefix));
            pod.newest = pod.newest.max(e.allocated_at());
            holder.insert(ip, &e.key);
        }
        let mut unwired = BTreeMap::new();
        for (key, pod) in pods {
            let alive = pod.ips.iter().any(|ip| wiring.routed.contains(ip))
                || pod.veths.iter().any(|n| wiring.vouches(n, key, &holder));
            if !alive {
                unwired.insert(key.clone(), pod);
            }
        }
        // Forget pods that are wired again or no longer held.
        self.suspects.retain(|k, _| unwired.contains_key(k));
        let mut release = Vec::new();
        for (key, pod) in unwired {
            let since = *self.suspects.entry(key.clone()).or_insert(now);
            if del_seen.contains(&key) || (old_enough(since) && old_enough(pod.newest)) {
                // IpAddr orders every IPv4 before every IPv6.
                release.extend(pod.ips.into_iter().map(|ip| (key.clone(), ip)));
            }
        }
        release
    }
}

/// The host's pod rules (priority 512/1536) as reclaim needs them: the kernel's
/// ([`HostNetwork`]) in the daemon; the simulation test has its own.
pub trait PodRules: Send + Sync {
    /// The IPv4 addresses pod rules name.
    fn pod_rule_addresses_v4(
        &self,
    ) -> impl Future<Output = Result<Vec<Ipv4Addr>, SeamError>> + Send;
    /// Deletes the pod rules of `ips`.
    fn delete_pod_rules(
        &self,
        ips: &[Ipv4Addr],
    ) -> impl Future<Output = Result<(), SeamError>> + Send;
    /// Deletes the host's conntrack entries (NAT bindings included) naming `ips`.
    fn forget_conntrack(
        &self,
        ips: &[IpAddr],
    ) -> impl Future<Output = Result<(), SeamError>> + Send;
}

impl PodRules for HostNetwork {
    async fn pod_rule_addresses_v4(&self) -> Result<Vec<Ipv4Addr>, SeamError> {
        HostNetwork::pod_rule_addresses_v4(self)
            .await
            .map_err(SeamError::from)
    }

    async fn delete_pod_rules(&self, ips: &[Ipv4Addr]) -> Result<(), SeamError> {
        HostNetwork::delete_pod_rules(self, ips)
            .await
            .map(drop)
            .map_err(SeamError::from)
    }

    async fn forget_conntrack(&self, ips: &[IpAddr]) -> Result<(), SeamError> {
        HostNetwork::forget_conntrack(self, ips.to_vec())
            .await
            .map(drop)
            .map_err(SeamError::from)
    }
}

/// Deletes the pod rules of every address the host's rules name that no pod holds (fenced in
/// the datastore meanwhile). Returns the addresses whose rules were stale.
pub async fn prune_stale_pod_rules<R: PodRules>(
    ipam: &Ipam,
    host: &R,
) -> Result<Vec<Ipv4Addr>, SeamError> {
    prune_pod_rules_of(ipam, host, None).await
}

/// [`prune_stale_pod_rules`] for the addresses in `only` (all the host's rules name when `None`):
/// DelNetwork prunes the rules of the addresses it just released, which the plugin's DEL leaves to
/// ipamd when nothing but ipamd's answer proved them its sandbox's (with `IP_COOLDOWN_PERIOD=0` the
/// next pod may hold such an address already, and a DEL deletes rules by selector: the fence
/// decides, under the datastore's lock).
pub async fn prune_pod_rules_of<R: PodRules>(
    ipam: &Ipam,
    host: &R,
    only: Option<&[Ipv4Addr]>,
) -> Result<Vec<Ipv4Addr>, SeamError> {
    let mut named = host.pod_rule_addresses_v4().await?;
    if let Some(only) = only {
        named.retain(|ip| only.contains(ip));
    }
    if named.is_empty() {
        return Ok(Vec::new());
    }
    let stale = ipam.fence_unheld(&named);
    let result = if stale.is_empty() {
        Ok(())
    } else {
        host.delete_pod_rules(&stale).await
    };
    ipam.unfence(&stale);
    result.map(|()| stale)
}

/// Every `period`: read the host, take a [`round`]. Runs until `shutdown`.
pub async fn run(
    ipam: Arc<Ipam>,
    mut reclaimer: Reclaimer,
    period: Duration,
    host: Option<Arc<HostNetwork>>,
    shutdown: CancellationToken,
) {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // While a DelNetwork waits for a recovered entry's wiring to go, look every second.
        let fast = if ipam.del_seen().is_empty() {
            Duration::MAX
        } else {
            DEL_SEEN_PERIOD
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = interval.tick() => {}
            () = ipam.reclaim_asks.wanted() => {}
            () = tokio::time::sleep(fast) => {}
        }
        if ipam.is_shutting_down() {
            return;
        }
        let wiring = match tokio::task::spawn_blocking(Wiring::read).await {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reclaim: host state unreadable; nothing released");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "reclaim: host read task failed");
                continue;
            }
        };
        let span = tracing::debug_span!("reclaim_round");
        tracing::Instrument::instrument(
            round(&ipam, &mut reclaimer, &wiring, host.as_deref()),
            span,
        )
        .await;
    }
}

/// One reclaim round on the host's `wiring`: decide, release (a released IPv4's pod rules
/// removed on `rules` while the address stays fenced), then prune stale pod rules. Returns
/// what it released. The simulation test drives this very function.
pub async fn round<R: PodRules>(
    ipam: &Ipam,
    reclaimer: &mut Reclaimer,
    wiring: &Wiring,
    rules: Option<&R>,
) -> Vec<(IpamKey, IpAddr)> {
    let now = ipam.now();
    let mut held = ipam.index.allocations(crate::ipam::Scope::V4);
    held.extend(ipam.index.allocations(crate::ipam::Scope::V6));
    let del_seen = ipam.del_seen();
    let mut released = Vec::new();
    if let Some(r) = rules {
        retry_forget(ipam, reclaimer, r).await;
    }
    // A pod's IPv4s (a multi-NIC pod has one per card) come before its IPv6 in the plan: when
    // one IPv4's release is refused (a retried ADD refreshed it since the
    // decision, a DEL took it, the checkpoint write failed), the pod's later addresses stay
    // too and the pod is decided again next round, so a pod never loses one family, or one
    // card, alone.
    let mut v4_kept: BTreeSet<IpamKey> = BTreeSet::new();
    for (key, ip) in reclaimer.decide_with(&held, wiring, &del_seen, now) {
        let seen_at = held
            .iter()
            .find(|e| e.key == key && e.ip() == Some(ip))
            .map_or(now, CheckpointEntry::allocated_at);
        if v4_kept.contains(&key) {
            continue;
        }
        let v4 = match ip {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(v6) => {
                // An IPv6 pod rule names the /128's own ENI table, as the next pod given it
                // would: nothing to remove (see docs/ipv6.md).
                match ipam.reclaim(&key, v6, seen_at) {
                    Ok(true) => {
                        tracing::warn!(%key, %ip, "{RELEASED}");
                        released.push((key, ip));
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(%key, %ip, error = %e, "reclaim failed"),
                }
                continue;
            }
        };
        match ipam.reclaim(&key, v4, seen_at) {
            Ok(true) => {
                tracing::warn!(%key, %ip, "{RELEASED}");
                if let Some(r) = rules
                    && let Err(e) = r.delete_pod_rules(&[v4]).await
                {
                    tracing::warn!(%ip, error = %e, "reclaim: rules of the gone pod not removed");
                }
                // Its DEL never came, so nobody deleted the gone pod's conntrack entries: they
                // go before the address can be handed out; until then it stays fenced.
                let forgotten = match rules {
                    Some(r) => r.forget_conntrack(&[ip]).await,
                    None => Ok(()),
                };
                match forgotten {
                    Ok(()) => ipam.unfence(&[v4]),
                    Err(e) => {
                        tracing::warn!(%ip, error = %e, "reclaim: conntrack entries of the gone pod not deleted; address held (tried again next round)");
                        reclaimer.unforgotten.insert(v4);
                    }
                }
                released.push((key, ip));
            }
            Ok(false) => {
                v4_kept.insert(key);
            }
            Err(e) => {
                tracing::warn!(%key, %ip, error = %e, "reclaim failed");
                v4_kept.insert(key);
            }
        }
    }
    if let Some(r) = rules {
        match prune_stale_pod_rules(ipam, r).await {
            Ok(s) if !s.is_empty() => {
                tracing::warn!(addresses = ?s, "stale pod rules (no pod holds the address) removed");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "stale pod rules not pruned"),
        }
    }
    released
}

/// Tries again to delete the conntrack entries of the released addresses still fenced for it;
/// lifts the fence of each one that succeeds.
async fn retry_forget<R: PodRules>(ipam: &Ipam, reclaimer: &mut Reclaimer, rules: &R) {
    let waiting: Vec<Ipv4Addr> = reclaimer.unforgotten.iter().copied().collect();
    for v4 in waiting {
        match rules.forget_conntrack(&[IpAddr::V4(v4)]).await {
            Ok(()) => {
                reclaimer.unforgotten.remove(&v4);
                ipam.unfence(&[v4]);
                tracing::info!(ip = %v4, "reclaim: conntrack entries of the gone pod deleted; address free");
            }
            Err(e) => {
                tracing::warn!(ip = %v4, error = %e, "reclaim: conntrack entries still not deleted; address held")
            }
        }
    }
}

/// The log line of a reclaimed address.
const RELEASED: &str = "released: the pod has had no host veth and no host route for the grace period (its DEL never reached ipamd)";

/// The reclaim loop as a task of the daemon, when `RECLAIM_UNWIRED_AFTER` sets its grace.
pub fn task(
    config: &crate::config::Config,
    ipam: &Arc<Ipam>,
    host: Option<Arc<crate::host::HostNetwork>>,
    token: &tokio_util::sync::CancellationToken,
) -> Option<crate::task::Task> {
    let grace = config.pool.reclaim_unwired_after?;
    let ipam = ipam.clone();
    let reclaimer = Reclaimer::new(grace, &config.node.veth_prefix);
    let period = (grace / 4).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(60),
    );
    let token = token.clone();
    Some(crate::task::Task::new("reclaim", async move {
        run(ipam, reclaimer, period, host, token).await;
        Ok(())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datastore::PodMetadata;

    const T0: u64 = 1_700_000_000;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(T0 + s)
    }

    fn entry(cid: &str, ip: &str, pod: Option<(&str, &str)>, assigned: u64) -> CheckpointEntry {
        let metadata = pod.map_or_else(PodMetadata::default, |(ns, name)| PodMetadata {
            namespace: ns.into(),
            name: name.into(),
            interfaces_count: 0,
        });
        CheckpointEntry::new(
            IpamKey::new("aws-cni", cid, "eth0"),
            ip.parse().unwrap(),
            metadata,
            at(assigned),
        )
    }

    fn ids(v: &[(IpamKey, IpAddr)]) -> Vec<&str> {
        v.iter().map(|(k, _)| k.container_id.as_str()).collect()
    }

    #[test]
    fn only_pods_without_any_wiring_for_the_whole_grace_are_released() {
        let grace = Duration::from_secs(60);
        let mut r = Reclaimer::new(grace, "eni");
        let held = vec![
            entry("routed", "198.18.0.10", Some(("ns", "a")), 0),
            entry("veth-by-pod", "198.18.0.11", Some(("ns", "b")), 0),
            entry("veth-by-cid", "198.18.0.12", None, 0),
            entry("gone", "198.18.0.13", Some(("ns", "d")), 0),
            entry("gone-young", "198.18.0.14", Some(("ns", "e")), 100),
        ];
        let wiring = Wiring {
            routed: ["198.18.0.10".parse().unwrap()].into(),
            links: [
                host_veth_name("eni", "ns", "b"),
                host_veth_name_for_container("eni", "veth-by-cid", "eth0"),
            ]
            .into(),
            ..Wiring::default()
        };
        // First sight of the unwired ones: suspects, nothing released yet.
        assert!(r.decide(&held, &wiring, at(100)).is_empty());
        // Not yet a whole grace period.
        assert!(r.decide(&held, &wiring, at(159)).is_empty());
        // "gone" has been unwired for 60 s; "gone-young" was assigned only 60 s ago (kept
        // until its assignment is also old enough, which it now is).
        assert_eq!(
            ids(&r.decide(&held, &wiring, at(160))),
            ["gone", "gone-young"]
        );
    }

    #[test]
    fn an_in_flight_add_is_never_released() {
        // Assigned just now, no wiring yet (the plugin is still wiring it).
        let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
        let held = vec![entry("new", "198.18.0.20", Some(("ns", "p")), 1000)];
        for s in [1000, 1030, 1059] {
            assert!(r.decide(&held, &Wiring::default(), at(s)).is_empty());
        }
    }

    #[test]
    fn wiring_seen_again_restarts_the_grace() {
        let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
        let held = vec![entry("flaky", "198.18.0.30", Some(("ns", "f")), 0)];
        let wired = Wiring {
            routed: ["198.18.0.30".parse().unwrap()].into(),
            ..Wiring::default()
        };
        assert!(r.decide(&held, &Wiring::default(), at(100)).is_empty());
        assert!(r.decide(&held, &wired, at(150)).is_empty());
        assert!(r.decide(&held, &Wiring::default(), at(170)).is_empty());
        assert!(r.decide(&held, &Wiring::default(), at(229)).is_empty());
        assert_eq!(
            ids(&r.decide(&held, &Wiring::default(), at(230))),
            ["flaky"]
        );
    }

    #[test]
    fn a_changed_veth_prefix_still_counts_the_route() {
        // The veth names no longer match (prefix changed between runs), but the pod's /32
        // route is there: alive.
        let mut r = Reclaimer::new(Duration::from_secs(1), "new");
        let held = vec![entry("p", "198.18.0.40", Some(("ns", "p")), 0)];
        let wiring = Wiring {
            routed: ["198.18.0.40".parse().unwrap()].into(),
            links: [host_veth_name("eni", "ns", "p")].into(),
            ..Wiring::default()
        };
        assert!(r.decide(&held, &wiring, at(100)).is_empty());
        assert!(r.decide(&held, &wiring, at(200)).is_empty());
    }

    /// Issue 38 H8: a pod wired under another veth prefix (a takeover, a changed
    /// `AWS_VPC_K8S_CNI_VETHPREFIX`) whose host route is gone is alive while its veth is:
    /// reclaim recognised only the configured prefix and released it.
    #[test]
    fn a_pod_under_another_veth_prefix_is_alive_by_its_veth_without_a_route() {
        let mut r = Reclaimer::new(Duration::from_secs(1), "new");
        let held = vec![
            entry("by-name", "198.18.0.41", Some(("ns", "p")), 0),
            entry("by-cid", "198.18.0.42", None, 0),
        ];
        let wiring = Wiring {
            links: [
                host_veth_name("eni", "ns", "p"),
                host_veth_name_for_container("abcd", "by-cid", "eth0"),
            ]
            .into(),
            ..Wiring::default()
        };
        assert!(r.decide(&held, &wiring, at(100)).is_empty());
        assert!(
            r.decide(&held, &wiring, at(200)).is_empty(),
            "alive by their veths"
        );
        // the veths gone: released after the grace
        assert!(r.decide(&held, &Wiring::default(), at(300)).is_empty());
        assert_eq!(
            ids(&r.decide(&held, &Wiring::default(), at(302))),
            ["by-cid", "by-name"]
        );
    }

    #[test]
    fn recovered_entries_are_alive_by_their_own_veth_name() {
        let mut r = Reclaimer::new(Duration::from_secs(1), "eni");
        let held = vec![CheckpointEntry::new(
            IpamKey::new(RECOVERED_NETWORK_NAME, "eni0123456789a", "unknown"),
            "198.18.0.50".parse().unwrap(),
            PodMetadata::default(),
            at(0),
        )];
        let wiring = Wiring {
            links: ["eni0123456789a".to_owned()].into(),
            ..Wiring::default()
        };
        assert!(r.decide(&held, &wiring, at(100)).is_empty());
        assert!(r.decide(&held, &wiring, at(200)).is_empty());
        assert!(r.decide(&held, &Wiring::default(), at(300)).is_empty());
        assert_eq!(r.decide(&held, &Wiring::default(), at(301)).len(), 1);
    }

    /// A dual-stack pod's two entries (one key, the pod's metadata on both, as ADD records
    /// them): IPv4 `v4`, IPv6 `v6`.
    fn dual(
        cid: &str,
        v4: &str,
        v6: &str,
        pod: (&str, &str),
        assigned: u64,
    ) -> [CheckpointEntry; 2] {
        let e4 = entry(cid, v4, Some(pod), assigned);
        let e6 = CheckpointEntry::new_v6(
            e4.key.clone(),
            v6.parse().unwrap(),
            e4.metadata.clone(),
            at(assigned),
        );
        [e4, e6]
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The host with `veth` (if any) routing `routes`, plus `/32`/`/128` routes `elsewhere`
    /// through a device that is no veth of the pod.
    fn host(veth: Option<&str>, routes: &[&str], elsewhere: &[&str]) -> Wiring {
        let mut w = Wiring::default();
        if let Some(v) = veth {
            w.links.insert(v.to_owned());
            let r: BTreeSet<IpAddr> = routes.iter().map(|a| ip(a)).collect();
            w.routed.extend(r.iter().copied());
            if !r.is_empty() {
                w.routes_by_link.insert(v.to_owned(), r);
            }
        }
        if !elsewhere.is_empty() {
            w.links.insert("eth9".to_owned());
            let r: BTreeSet<IpAddr> = elsewhere.iter().map(|a| ip(a)).collect();
            w.routed.extend(r.iter().copied());
            w.routes_by_link.insert("eth9".to_owned(), r);
        }
        w
    }

    #[test]
    fn a_dual_stack_pod_whose_ipv4_route_is_gone_keeps_both_addresses() {
        // Issue 28 finding 2: someone deleted the pod's /32 host route (`ip route del`, an
        // agent flushing the IPv4 main table); its veth lives and routes its /128. Before, the
        // veth no longer vouched for the IPv4 (it routed "another" address) and the IPv4 was
        // released and later handed to a second pod while the first still used it.
        let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
        let veth = host_veth_name("eni", "ns", "ds");
        let held = dual("ds", "198.18.0.70", "2001:db8::7", ("ns", "ds"), 0);
        let wiring = host(Some(&veth), &["2001:db8::7"], &[]);
        for s in [100, 160, 161, 1000, 100_000] {
            assert_eq!(
                r.decide(&held, &wiring, at(s)),
                vec![],
                "at {s}: a live pod's address released"
            );
        }
    }

    #[test]
    fn a_dual_stack_pod_whose_ipv6_route_is_gone_keeps_both_addresses() {
        // The symmetric case: the /128 host route deleted, the veth still routes the /32.
        let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
        let veth = host_veth_name("eni", "ns", "ds");
        let held = dual("ds", "198.18.0.70", "2001:db8::7", ("ns", "ds"), 0);
        let wiring = host(Some(&veth), &["198.18.0.70"], &[]);
        for s in [100, 160, 161, 1000, 100_000] {
            assert_eq!(
                r.decide(&held, &wiring, at(s)),
                vec![],
                "at {s}: a live pod's address released"
            );
        }
    }

    #[test]
    fn a_dual_stack_pod_is_decided_as_one_by_its_veth_and_either_route() {
        // The decision table for one dual-stack pod (IPv4 .70, IPv6 ::7, veth named after the
        // pod): what the host shows → what is released once the grace has passed. Another
        // pod ("other": .71, ::8) is held and wired through eth9.
        let veth = host_veth_name("eni", "ns", "ds");
        let (v4, v6) = ("198.18.0.70", "2001:db8::7");
        let both = vec![ip(v4), ip(v6)];
        let keep: Vec<IpAddr> = vec![];
        let other = ["198.18.0.71", "2001:db8::8"];
        let cases: Vec<(&str, Wiring, Vec<IpAddr>)> = vec![
            (
                "veth routes both",
                host(Some(&veth), &[v4, v6], &other),
                keep.clone(),
            ),
            (
                "veth routes the /32 only",
                host(Some(&veth), &[v4], &other),
                keep.clone(),
            ),
            (
                "veth routes the /128 only",
                host(Some(&veth), &[v6], &other),
                keep.clone(),
            ),
            (
                "veth routes nothing",
                host(Some(&veth), &[], &other),
                keep.clone(),
            ),
            (
                "veth routes an address no pod holds",
                host(Some(&veth), &["198.18.0.99"], &other),
                keep.clone(),
            ),
            (
                "no veth, the /128 routed elsewhere (veth prefix changed)",
                host(None, &[], &[v6, other[0], other[1]]),
                keep.clone(),
            ),
            (
                "no veth, the /32 routed elsewhere",
                host(None, &[], &[v4, other[0], other[1]]),
                keep.clone(),
            ),
            ("no veth, no route", host(None, &[], &other), both.clone()),
            (
                "the pod-name veth routes only another pod's addresses",
                host(Some(&veth), &other, &[]),
                both.clone(),
            ),
        ];
        for (case, wiring, want) in cases {
            let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
            let mut held = dual("ds", v4, v6, ("ns", "ds"), 0).to_vec();
            held.extend(dual("other", other[0], other[1], ("ns", "other"), 0));
            assert!(r.decide(&held, &wiring, at(100)).is_empty(), "{case}");
            let got: Vec<IpAddr> = r
                .decide(&held, &wiring, at(160))
                .into_iter()
                .map(|(k, ip)| {
                    assert_eq!(k.container_id, "ds", "{case}: {k} released");
                    ip
                })
                .collect();
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn both_families_of_a_dual_stack_pod_live_and_go_together() {
        // One key holds an IPv4 and an IPv6 entry (the IPv6 one without metadata: a record
        // written before the pod name was known). The /128 route alone keeps the whole pod
        // alive, however long; once the host shows neither route nor veth, both are released
        // in the same round after one grace.
        let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
        let key = IpamKey::new("aws-cni", "ds", "eth0");
        let v6: std::net::Ipv6Addr = "2001:db8::7".parse().unwrap();
        let held = vec![
            entry("ds", "198.18.0.70", Some(("ns", "ds")), 0),
            CheckpointEntry::new_v6(key.clone(), v6, PodMetadata::default(), at(0)),
        ];
        let v6_routed = Wiring {
            routed: [IpAddr::V6(v6)].into(),
            ..Wiring::default()
        };
        for s in [100, 160, 230, 1000] {
            assert!(
                r.decide(&held, &v6_routed, at(s)).is_empty(),
                "at {s}: the pod's /128 is routed, neither half may go"
            );
        }
        assert!(r.decide(&held, &Wiring::default(), at(1010)).is_empty());
        assert!(r.decide(&held, &Wiring::default(), at(1069)).is_empty());
        assert_eq!(
            r.decide(&held, &Wiring::default(), at(1070)),
            vec![(key.clone(), ip("198.18.0.70")), (key, IpAddr::V6(v6)),],
            "both halves, the IPv4 first"
        );
    }

    #[test]
    fn a_dual_stack_pod_goes_only_when_both_halves_are_old_enough() {
        // The IPv6 half was given later (or an ADD retried since): the pod is released as one
        // when the newest half is older than the grace, never the older half alone.
        let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
        let [e4, mut e6] = dual("ds", "198.18.0.70", "2001:db8::7", ("ns", "ds"), 0);
        e6 = CheckpointEntry::new_v6(e6.key.clone(), e6.ipv6().unwrap(), e6.metadata, at(100));
        let held = vec![e4, e6];
        assert!(r.decide(&held, &Wiring::default(), at(60)).is_empty());
        assert!(r.decide(&held, &Wiring::default(), at(120)).is_empty());
        assert!(r.decide(&held, &Wiring::default(), at(159)).is_empty());
        assert_eq!(r.decide(&held, &Wiring::default(), at(160)).len(), 2);
    }

    #[test]
    fn a_stale_dual_stack_sandbox_goes_while_the_current_one_keeps_both_halves() {
        // web-0 re-created (sandbox c2) before its old sandbox c1 was deleted, c1's DEL never
        // came; both are named after the pod, so they share the veth. c2's /32 route was
        // deleted: the veth routes c2's /128 only. c1 goes (both halves), c2 keeps both.
        let veth = host_veth_name("eni", "default", "web-0");
        let mut held = dual("c1", "198.18.0.60", "2001:db8::60", ("default", "web-0"), 0).to_vec();
        held.extend(dual(
            "c2",
            "198.18.0.61",
            "2001:db8::61",
            ("default", "web-0"),
            10,
        ));
        let wiring = host(Some(&veth), &["2001:db8::61"], &[]);
        let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
        assert!(r.decide(&held, &wiring, at(100)).is_empty());
        let gone = r.decide(&held, &wiring, at(160));
        assert_eq!(ids(&gone), ["c1", "c1"]);
        assert_eq!(gone[0].1, ip("198.18.0.60"));
        assert_eq!(gone[1].1, ip("2001:db8::60"));
        // (c1 is still listed here: this test does not apply the release.) c2 never goes.
        assert_eq!(ids(&r.decide(&held, &wiring, at(10_000))), ["c1", "c1"]);
    }

    #[test]
    fn a_del_seen_dual_stack_pod_goes_as_one_once_unwired() {
        // A DelNetwork matched the pod's recovered entries (both families, one recovered key)
        // by pod name: both go at once when the host shows neither route nor veth, and
        // neither while its veth routes one family only.
        let veth = host_veth_name("eni", "default", "web-1");
        let key = IpamKey::new(RECOVERED_NETWORK_NAME, &veth, "unknown");
        let held = vec![
            CheckpointEntry::new(
                key.clone(),
                "198.18.0.80".parse().unwrap(),
                PodMetadata::default(),
                at(0),
            ),
            CheckpointEntry::new_v6(
                key.clone(),
                "2001:db8::80".parse().unwrap(),
                PodMetadata::default(),
                at(0),
            ),
        ];
        let seen: BTreeSet<IpamKey> = [key.clone()].into();
        let mut r = Reclaimer::new(Duration::from_secs(300), "eni");
        let half = host(Some(&veth), &["2001:db8::80"], &[]);
        assert!(r.decide_with(&held, &half, &seen, at(10)).is_empty());
        assert_eq!(
            r.decide_with(&held, &Wiring::default(), &seen, at(11)),
            vec![(key.clone(), ip("198.18.0.80")), (key, ip("2001:db8::80"))]
        );
    }

    #[test]
    fn a_stale_sandbox_is_released_while_the_current_sandbox_of_the_same_pod_is_live() {
        // Issue 18 item 8: web-0 re-created on the node (sandbox c2) before its old sandbox c1
        // was deleted, and c1's DEL never reached ipamd. Both are named after the pod, so c2's
        // veth kept c1's address alive forever. c2's veth routes c2's address only: it no
        // longer vouches for c1.
        let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
        let veth = host_veth_name("eni", "default", "web-0");
        let held = vec![
            entry("c1", "198.18.0.60", Some(("default", "web-0")), 0),
            entry("c2", "198.18.0.61", Some(("default", "web-0")), 10),
        ];
        let c2: IpAddr = "198.18.0.61".parse().unwrap();
        let wiring = Wiring {
            routed: [c2].into(),
            links: [veth.clone()].into(),
            routes_by_link: [(veth.clone(), [c2].into())].into(),
        };
        assert!(r.decide(&held, &wiring, at(100)).is_empty());
        assert_eq!(ids(&r.decide(&held, &wiring, at(160))), ["c1"]);
        // While c2's veth routes nothing (its ADD still wiring), it vouches for both.
        let mut r = Reclaimer::new(Duration::from_secs(60), "eni");
        let unrouted = Wiring {
            links: [veth].into(),
            ..Wiring::default()
        };
        assert!(r.decide(&held, &unrouted, at(100)).is_empty());
        assert!(r.decide(&held, &unrouted, at(200)).is_empty());
    }
}
