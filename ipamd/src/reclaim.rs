//! Reclaiming the addresses of pods that are gone although ipamd never saw their DelNetwork
//! (the plugin's DEL succeeds from prevResult while ipamd is down or restarting: upstream pain
//! points 8 and 19). Owns the pure decision (held assignments + host wiring + time → keys to
//! release) and the loop that reads the host and applies it through [`Ipam`]. Must not: change
//! the kernel (it only reads `dataplane::host_state`), release an address whose pod shows any
//! sign of life.
//!
//! A pod is alive while the host has a `/32` (IPv4) or `/128` (IPv6) route to its address (any
//! device) or a link with
//! one of the host veth names the plugin could have given it. Only an assignment that has shown
//! neither for a whole grace period, and is itself older than that period (so an ADD whose
//! wiring is still in flight is never touched), is released, into the usual cooldown.
//!
//! Pod rules (512 `to <ip>`, 1536 `from <ip>`) are the one kernel state it changes: those of an
//! address it releases, and stale ones no pod holds (a teardown that failed; at the same
//! priority they would shadow the next pod given that address). The address is fenced in the
//! datastore (never handed out) while its rules are deleted, so a new pod's rules are never
//! touched.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use dataplane::conventions::{host_veth_name, host_veth_name_for_container};
use tokio_util::sync::CancellationToken;

use crate::datastore::{CheckpointEntry, IpamKey, RECOVERED_NETWORK_NAME};
use crate::host::HostNetwork;
use crate::ipam::Ipam;
use crate::pool::provider::EniProvider;

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
    /// Whether link `name` can be this address's pod: it exists and does not route only other
    /// addresses. A pod-name veth is shared by every sandbox of the pod (a StatefulSet pod
    /// re-created before its old sandbox was deleted): once it routes the new sandbox's
    /// address, it no longer vouches for the old one's. A veth with no route at all (an ADD
    /// still wiring, a route removed by someone) vouches for every candidate.
    fn vouches(&self, name: &str, ip: IpAddr) -> bool {
        self.links.contains(name)
            && self
                .routes_by_link
                .get(name)
                .is_none_or(|r| r.is_empty() || r.contains(&ip))
    }
}

impl Wiring {
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

/// The host veth names the plugin could have given this assignment's pod.
fn veth_names(e: &CheckpointEntry, veth_prefix: &str) -> Vec<String> {
    let k = &e.key;
    let mut names = vec![host_veth_name_for_container(
        veth_prefix,
        &k.container_id,
        &k.if_name,
    )];
    if k.network_name == RECOVERED_NETWORK_NAME {
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

/// How often `reclaim` looks while a DelNetwork waits for a recovered entry's wiring to go.
pub const DEL_SEEN_PERIOD: Duration = Duration::from_secs(1);

/// Remembers since when each assignment has looked unwired (by key and address: a dual-stack
/// pod holds one of each family under one key).
#[derive(Debug)]
pub struct Reclaimer {
    grace: Duration,
    veth_prefix: String,
    suspects: BTreeMap<(IpamKey, IpAddr), SystemTime>,
}

impl Reclaimer {
    /// Releases after `grace` without wiring; pods' veths start with `veth_prefix`.
    #[must_use]
    pub fn new(grace: Duration, veth_prefix: &str) -> Self {
        Self {
            grace,
            veth_prefix: veth_prefix.to_owned(),
            suspects: BTreeMap::new(),
        }
    }

    /// The assignments (either family) to release now, given everything held and the host's
    /// wiring.
    pub fn decide(
        &mut self,
        held: &[CheckpointEntry],
        wiring: &Wiring,
        now: SystemTime,
    ) -> Vec<(IpamKey, IpAddr)> {
        self.decide_with(held, wiring, &BTreeSet::new(), now)
    }

    /// As [`Self::decide`]; entries in `del_seen` (a DelNetwork asked for them) are released
    /// as soon as they look unwired, without the grace period.
    pub fn decide_with(
        &mut self,
        held: &[CheckpointEntry],
        wiring: &Wiring,
        del_seen: &BTreeSet<IpamKey>,
        now: SystemTime,
    ) -> Vec<(IpamKey, IpAddr)> {
        let old_enough = |t: SystemTime| now.duration_since(t).is_ok_and(|d| d >= self.grace);
        let mut unwired = BTreeMap::new();
        for e in held {
            let Some(ip) = e.ip() else { continue };
            let alive = wiring.routed.contains(&ip)
                || veth_names(e, &self.veth_prefix)
                    .iter()
                    .any(|n| wiring.vouches(n, ip));
            if !alive {
                unwired.insert((e.key.clone(), ip), e.allocated_at());
            }
        }
        // Forget keys that are wired again or no longer held.
        self.suspects.retain(|k, _| unwired.contains_key(k));
        let mut release = Vec::new();
        for ((key, ip), assigned_at) in unwired {
            let since = *self.suspects.entry((key.clone(), ip)).or_insert(now);
            if del_seen.contains(&key) || (old_enough(since) && old_enough(assigned_at)) {
                release.push((key, ip));
            }
        }
        release
    }
}

/// Deletes the pod rules of every address the host's rules name that no pod holds (fenced in
/// the datastore meanwhile). Returns the addresses whose rules were stale.
pub async fn prune_stale_pod_rules<P: EniProvider>(
    ipam: &Ipam<P>,
    host: &HostNetwork,
) -> Result<Vec<Ipv4Addr>, String> {
    let named = host
        .pod_rule_addresses_v4()
        .await
        .map_err(|e| e.to_string())?;
    let stale = ipam.fence_unheld(&named);
    let result = if stale.is_empty() {
        Ok(())
    } else {
        host.delete_pod_rules(&stale)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    };
    ipam.unfence(&stale);
    result.map(|()| stale)
}

/// Every `period`: read the host, decide, release (the released pods' rules removed), and
/// prune stale pod rules when `host` is given. Runs until `shutdown`.
pub async fn run<P: EniProvider>(
    ipam: Arc<Ipam<P>>,
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
            () = ipam.reclaim_wanted() => {}
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
        let round = async {
            let now = ipam.now();
            let mut held = ipam.allocations();
            held.extend(ipam.v6_allocations());
            let del_seen = ipam.del_seen();
            for (key, ip) in reclaimer.decide_with(&held, &wiring, &del_seen, now) {
                let seen_at = held
                    .iter()
                    .find(|e| e.key == key && e.ip() == Some(ip))
                    .map_or(now, CheckpointEntry::allocated_at);
                let ip = match ip {
                    IpAddr::V4(ip) => ip,
                    IpAddr::V6(ip) => {
                        // An IPv6 pod rule names the /128's own ENI table, as the next pod
                        // given it would: nothing to remove (see docs/ipv6.md).
                        match ipam.reclaim_v6(&key, ip, seen_at) {
                            Ok(true) => tracing::warn!(
                                %key, %ip,
                                "released: the pod has had no host veth and no host route for the grace period (its DEL never reached ipamd)"
                            ),
                            Ok(false) => {}
                            Err(e) => tracing::warn!(%key, %ip, error = %e, "reclaim failed"),
                        }
                        continue;
                    }
                };
                match ipam.reclaim(&key, ip, seen_at) {
                    Ok(true) => {
                        tracing::warn!(
                            %key, %ip,
                            "released: the pod has had no host veth and no host route for the grace period (its DEL never reached ipamd)"
                        );
                        if let Some(h) = &host
                            && let Err(e) = h.delete_pod_rules(&[ip]).await
                        {
                            tracing::warn!(%ip, error = %e, "reclaim: rules of the gone pod not removed");
                        }
                        ipam.unfence(&[ip]);
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(%key, %ip, error = %e, "reclaim failed"),
                }
            }
            if let Some(h) = &host {
                match prune_stale_pod_rules(&ipam, h).await {
                    Ok(s) if !s.is_empty() => {
                        tracing::warn!(addresses = ?s, "stale pod rules (no pod holds the address) removed");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "stale pod rules not pruned"),
                }
            }
        };
        tracing::Instrument::instrument(round, tracing::debug_span!("reclaim_round")).await;
    }
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

    #[test]
    fn both_families_of_a_dual_stack_pod_live_and_go_together() {
        // One key holds an IPv4 and an IPv6 entry. The IPv6 /128 route alone keeps the IPv6
        // entry alive; once the host shows neither, both are released.
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
        assert!(r.decide(&held, &v6_routed, at(100)).is_empty());
        assert_eq!(
            r.decide(&held, &v6_routed, at(160)),
            vec![(key.clone(), IpAddr::V4("198.18.0.70".parse().unwrap()))],
            "the IPv4 half has been unwired for the grace; the IPv6 half is routed"
        );
        assert!(r.decide(&held, &Wiring::default(), at(170)).len() == 1);
        assert_eq!(
            r.decide(&held, &Wiring::default(), at(230)).len(),
            2,
            "the IPv6 half after its own grace"
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
