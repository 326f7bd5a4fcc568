//! IPv6 pod addresses (IPv6 mode, and the IPv6 half of dual-stack pods): the /80 prefixes delegated
//! to this node's ENIs and which pod (IPAM key) holds which /128 of them, with the cooldown and the
//! `ipv6` checkpoint entries, and the entries recovered from host evidence that wait for their /80
//! to be registered. PURE and synchronous (`now` is passed in). Must not: do I/O, call EC2, touch
//! the IPv4 index ([`super::DataStore`]).
//!
//! The lowest address of the prefix not held and not cooling is handed out, but never the prefix's
//! first address (all-zero interface id), which may be the subnet-router anycast address of the /64
//! (docs/compatibility.md). There is no warm pool: one /80 holds more pods than any node runs.

use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::time::{Duration, SystemTime};

use ipnet::Ipv6Net;

use super::{CheckpointEntry, IpamKey, PodMetadata};

/// A /80 delegated to one of this node's ENIs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V6Prefix {
    /// The ENI holding it.
    pub eni_id: String,
    /// The prefix.
    pub net: Ipv6Net,
    /// The ENI's device number.
    pub device_number: u32,
    /// The ENI's route table (main, 254, for the primary ENI).
    pub route_table: u32,
}

/// A pod's IPv6 address with the ENI facts the plugin needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V6Assignment {
    /// The /128.
    pub ip: Ipv6Addr,
    /// The ENI whose prefix holds it ("" when no known prefix holds it: a restored entry).
    pub eni_id: String,
    /// Its device number (0 when unknown).
    pub device_number: u32,
    /// Its route table (main when unknown).
    pub route_table: u32,
}

/// Why an IPv6 operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum V6Error {
    /// No prefix is registered (for that ENI).
    #[error("no IPv6 prefix{}", .0.as_ref().map(|e| format!(" on {e}")).unwrap_or_default())]
    NoPrefix(Option<String>),
    /// Every address of the prefixes is held or cooling.
    #[error("no free IPv6 address")]
    Exhausted,
    /// The key holds no IPv6 address.
    #[error("unknown pod {0}")]
    UnknownPod(IpamKey),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    ip: Ipv6Addr,
    metadata: PodMetadata,
    assigned_at: SystemTime,
}

/// The IPv6 index.
#[derive(Debug, Clone)]
pub struct V6Store {
    prefixes: Vec<V6Prefix>,
    held: BTreeMap<IpamKey, Held>,
    /// Released addresses and when; skipped until the cooldown has passed.
    cooling: BTreeMap<Ipv6Addr, SystemTime>,
    cooldown: Duration,
    /// Entries recovered from host evidence whose address no registered prefix held yet (see
    /// [`Self::defer`]): adopted when a prefix holding them is registered.
    deferred: Vec<CheckpointEntry>,
}

/// How far into a prefix the search for a free address looks (well beyond any node's pods).
const SEARCH_LIMIT: u128 = 1 << 20;

impl V6Store {
    /// An empty index with `IP_COOLDOWN_PERIOD`.
    #[must_use]
    pub fn new(cooldown: Duration) -> Self {
        Self {
            prefixes: Vec::new(),
            held: BTreeMap::new(),
            cooling: BTreeMap::new(),
            cooldown,
            deferred: Vec::new(),
        }
    }

    /// Registers a prefix (idempotent: a known prefix is kept as it is), adopting the deferred
    /// entries it holds ([`Self::defer`]) before any address of it can be handed out.
    pub fn add_prefix(&mut self, prefix: V6Prefix) {
        let net = prefix.net.trunc();
        if self.prefixes.iter().any(|p| p.net == net) {
            return;
        }
        self.prefixes.push(V6Prefix { net, ..prefix });
        let (adopt, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|e| e.ipv6().is_some_and(|ip| net.contains(&ip)));
        self.deferred = keep;
        self.adopt(adopt);
    }

    /// Keeps entries recovered from host evidence whose address may or may not be one of this
    /// node's pods' (a /128 routed through a device without the veth prefix: a pod wired under
    /// another prefix, or the node's own address) until the node's address space is known: an
    /// entry a registered prefix holds is held at once, the others when a prefix holding them
    /// is registered (IPv6 node init, or a dual-stack pod's first ADD on that ENI), always
    /// before an address of that prefix is handed out. Until then they are neither held nor
    /// checkpointed: an address in no /80 of this node (its own /128s, an anycast route) is
    /// never handed out anyway.
    pub fn defer(&mut self, entries: Vec<CheckpointEntry>) {
        let (now, later): (Vec<_>, Vec<_>) = entries.into_iter().partition(|e| {
            e.ipv6()
                .is_some_and(|ip| self.prefixes.iter().any(|p| p.net.contains(&ip)))
        });
        self.deferred.extend(later);
        self.adopt(now);
    }

    /// Deferred entries not adopted yet.
    #[must_use]
    pub fn deferred(&self) -> &[CheckpointEntry] {
        &self.deferred
    }

    /// Holds deferred entries: skipped when their address is held already, re-keyed
    /// `<id>@<ip>` when their key is (the address must be held whatever the key).
    fn adopt(&mut self, entries: Vec<CheckpointEntry>) {
        for mut e in entries {
            let Some(ip) = e.ipv6() else { continue };
            if self.holds(ip) {
                continue;
            }
            if self.held.contains_key(&e.key) {
                e.key.container_id = format!("{}@{ip}", e.key.container_id);
            }
            self.restore(std::slice::from_ref(&e));
        }
    }

    /// The registered prefixes, in registration order.
    #[must_use]
    pub fn prefixes(&self) -> &[V6Prefix] {
        &self.prefixes
    }

    /// The prefix of `eni_id`, if registered.
    #[must_use]
    pub fn prefix_of(&self, eni_id: &str) -> Option<&V6Prefix> {
        self.prefixes.iter().find(|p| p.eni_id == eni_id)
    }

    fn assignment(&self, ip: Ipv6Addr) -> V6Assignment {
        match self.prefixes.iter().find(|p| p.net.contains(&ip)) {
            Some(p) => V6Assignment {
                ip,
                eni_id: p.eni_id.clone(),
                device_number: p.device_number,
                route_table: p.route_table,
            },
            None => V6Assignment {
                ip,
                eni_id: String::new(),
                device_number: 0,
                route_table: dataplane::conventions::MAIN_TABLE,
            },
        }
    }

    /// The address `key` holds.
    #[must_use]
    pub fn lookup(&self, key: &IpamKey) -> Option<V6Assignment> {
        self.held.get(key).map(|h| self.assignment(h.ip))
    }

    /// Every held address with its key, pod and ENI facts, sorted by key.
    #[must_use]
    pub fn assignments(&self) -> Vec<(IpamKey, PodMetadata, V6Assignment)> {
        self.held
            .iter()
            .map(|(k, h)| (k.clone(), h.metadata.clone(), self.assignment(h.ip)))
            .collect()
    }

    /// Whether some key holds `ip`.
    #[must_use]
    pub fn holds(&self, ip: Ipv6Addr) -> bool {
        self.held.values().any(|h| h.ip == ip)
    }

    /// When `key` was given its address.
    #[must_use]
    pub fn assigned_at(&self, key: &IpamKey) -> Option<SystemTime> {
        self.held.get(key).map(|h| h.assigned_at)
    }

    /// Number of held addresses.
    #[must_use]
    pub fn assigned_count(&self) -> usize {
        self.held.len()
    }

    /// Held addresses inside `net`.
    #[must_use]
    pub fn assigned_in(&self, net: &Ipv6Net) -> usize {
        self.held.values().filter(|h| net.contains(&h.ip)).count()
    }

    fn cooling_at(&self, ip: Ipv6Addr, now: SystemTime) -> bool {
        self.cooling
            .get(&ip)
            .is_some_and(|t| now.duration_since(*t).unwrap_or_default() < self.cooldown)
    }

    /// Gives `key` an address (the one it holds on a repeated call): from `eni_id`'s prefix
    /// when given (dual-stack: the ENI of the pod's IPv4), else from the first prefix that has
    /// room (IPv6 mode: the primary ENI's).
    pub fn assign(
        &mut self,
        key: &IpamKey,
        metadata: PodMetadata,
        eni_id: Option<&str>,
        now: SystemTime,
    ) -> Result<V6Assignment, V6Error> {
        if let Some(a) = self.lookup(key) {
            return Ok(a);
        }
        let candidates: Vec<Ipv6Net> = self
            .prefixes
            .iter()
            .filter(|p| eni_id.is_none_or(|e| p.eni_id == e))
            .map(|p| p.net)
            .collect();
        if candidates.is_empty() {
            return Err(V6Error::NoPrefix(eni_id.map(str::to_owned)));
        }
        let held: std::collections::BTreeSet<Ipv6Addr> = self.held.values().map(|h| h.ip).collect();
        for net in candidates {
            let base = u128::from(net.network());
            let size = 1u128 << (128 - u32::from(net.prefix_len()));
            let found = (1..size.min(SEARCH_LIMIT))
                .map(|off| Ipv6Addr::from(base + off))
                .find(|ip| !held.contains(ip) && !self.cooling_at(*ip, now));
            if let Some(ip) = found {
                self.cooling.remove(&ip);
                self.held.insert(
                    key.clone(),
                    Held {
                        ip,
                        metadata,
                        assigned_at: now,
                    },
                );
                return Ok(self.assignment(ip));
            }
        }
        Err(V6Error::Exhausted)
    }

    /// Releases `key`'s address into cooldown.
    pub fn unassign(&mut self, key: &IpamKey, now: SystemTime) -> Result<V6Assignment, V6Error> {
        let h = self
            .held
            .remove(key)
            .ok_or_else(|| V6Error::UnknownPod(key.clone()))?;
        // Forget cooldowns that have passed, so the map stays small.
        let cooldown = self.cooldown;
        self.cooling
            .retain(|_, t| now.duration_since(*t).unwrap_or_default() < cooldown);
        self.cooling.insert(h.ip, now);
        Ok(self.assignment(h.ip))
    }

    /// Released addresses still in their cooldown at `now` (and held by no key), with their
    /// release time: what the cooldown side file records.
    #[must_use]
    pub fn cooling_entries(&self, now: SystemTime) -> Vec<(Ipv6Addr, SystemTime)> {
        self.cooling
            .iter()
            .filter(|(ip, _)| self.cooling_at(**ip, now) && !self.holds(**ip))
            .map(|(ip, t)| (*ip, *t))
            .collect()
    }

    /// Puts recorded cooldowns back (after a restart), whether or not a registered prefix holds
    /// the address yet (the /80s are registered after start), so a just-released /128 is not
    /// the first one handed out again.
    pub fn restore_cooling(&mut self, cooling: &[(Ipv6Addr, SystemTime)]) {
        for (ip, t) in cooling {
            let slot = self.cooling.entry(*ip).or_insert(*t);
            *slot = (*slot).max(*t);
        }
    }

    /// The held addresses as checkpoint entries (`ipv6` set, `ipv4` empty).
    #[must_use]
    pub fn checkpoint_entries(&self) -> Vec<CheckpointEntry> {
        self.held
            .iter()
            .map(|(k, h)| {
                CheckpointEntry::new_v6(k.clone(), h.ip, h.metadata.clone(), h.assigned_at)
            })
            .collect()
    }

    /// Restores IPv6 entries of a checkpoint (entries without a valid `ipv6` are not ours and
    /// ignored). An entry whose key or address is already held is skipped and returned. Entries
    /// are kept whether or not a registered prefix holds them: never lose a pod's address.
    pub fn restore(&mut self, entries: &[CheckpointEntry]) -> Vec<CheckpointEntry> {
        let mut rejected = Vec::new();
        for e in entries {
            let Some(ip) = e.ipv6() else { continue };
            if self.held.contains_key(&e.key) || self.held.values().any(|h| h.ip == ip) {
                rejected.push(e.clone());
                continue;
            }
            self.held.insert(
                e.key.clone(),
                Held {
                    ip,
                    metadata: e.metadata.clone(),
                    assigned_at: e.allocated_at(),
                },
            );
        }
        rejected
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: &str) -> IpamKey {
        IpamKey::new("aws-cni", c, "eth0")
    }

    fn prefix(eni: &str, net: &str, dev: u32, table: u32) -> V6Prefix {
        V6Prefix {
            eni_id: eni.into(),
            net: net.parse().unwrap(),
            device_number: dev,
            route_table: table,
        }
    }

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    #[test]
    fn hands_out_128s_inside_the_80_idempotently() {
        let mut s = V6Store::new(Duration::from_secs(30));
        assert_eq!(
            s.assign(&key("a"), PodMetadata::default(), None, t(0)),
            Err(V6Error::NoPrefix(None))
        );
        s.add_prefix(prefix("eni-1", "2001:db8:0:1:5::/80", 0, 254));
        s.add_prefix(prefix("eni-1", "2001:db8:0:1:5::/80", 0, 254));
        assert_eq!(s.prefixes().len(), 1);
        let net: Ipv6Net = "2001:db8:0:1:5::/80".parse().unwrap();
        let a = s
            .assign(&key("a"), PodMetadata::default(), None, t(0))
            .unwrap();
        let b = s
            .assign(&key("b"), PodMetadata::default(), None, t(0))
            .unwrap();
        assert!(net.contains(&a.ip) && net.contains(&b.ip));
        assert_ne!(a.ip, b.ip);
        assert_ne!(a.ip, net.network(), "the all-zero interface id is skipped");
        assert_eq!(
            (a.eni_id.as_str(), a.device_number, a.route_table),
            ("eni-1", 0, 254)
        );
        // a retried ADD gets the same address
        assert_eq!(
            s.assign(&key("a"), PodMetadata::default(), None, t(1))
                .unwrap(),
            a
        );
        assert_eq!(s.assigned_count(), 2);
        assert_eq!(s.assigned_in(&net), 2);
    }

    #[test]
    fn release_cools_down_then_reuses() {
        let mut s = V6Store::new(Duration::from_secs(30));
        s.add_prefix(prefix("eni-1", "2001:db8::/80", 0, 254));
        let a = s
            .assign(&key("a"), PodMetadata::default(), None, t(0))
            .unwrap();
        assert_eq!(s.unassign(&key("a"), t(1)).unwrap().ip, a.ip);
        assert_eq!(
            s.unassign(&key("a"), t(1)),
            Err(V6Error::UnknownPod(key("a")))
        );
        let b = s
            .assign(&key("b"), PodMetadata::default(), None, t(2))
            .unwrap();
        assert_ne!(b.ip, a.ip, "a released address cools down");
        let c = s
            .assign(&key("c"), PodMetadata::default(), None, t(40))
            .unwrap();
        assert_eq!(c.ip, a.ip, "and is handed out again after the cooldown");
    }

    #[test]
    fn recorded_cooldowns_come_back_before_the_prefix_is_registered() {
        let mut s = V6Store::new(Duration::from_secs(30));
        s.add_prefix(prefix("eni-1", "2001:db8::/80", 0, 254));
        let a = s
            .assign(&key("a"), PodMetadata::default(), None, t(0))
            .unwrap();
        let b = s
            .assign(&key("b"), PodMetadata::default(), None, t(0))
            .unwrap();
        s.unassign(&key("a"), t(1)).unwrap();
        assert_eq!(s.cooling_entries(t(2)), vec![(a.ip, t(1))]);
        assert!(s.cooling_entries(t(40)).is_empty(), "past its cooldown");

        // A restart: cooldowns first, the /80 registered later (IPv6 node init).
        let mut r = V6Store::new(Duration::from_secs(30));
        r.restore_cooling(&s.cooling_entries(t(5)));
        r.restore(&s.checkpoint_entries());
        r.add_prefix(prefix("eni-1", "2001:db8::/80", 0, 254));
        let c = r
            .assign(&key("c"), PodMetadata::default(), None, t(6))
            .unwrap();
        assert!(c.ip != a.ip && c.ip != b.ip, "{c:?}");
        r.unassign(&key("c"), t(7)).unwrap();
        let d = r
            .assign(&key("d"), PodMetadata::default(), None, t(31))
            .unwrap();
        assert_eq!(d.ip, a.ip, "the lowest again once its cooldown has passed");
    }

    #[test]
    fn deferred_entries_are_held_once_a_prefix_holds_them_and_never_otherwise() {
        let mut s = V6Store::new(Duration::ZERO);
        s.add_prefix(prefix("eni-1", "2001:db8:0:0:1::/80", 0, 254));
        let rec = |id: &str, ip: &str| {
            CheckpointEntry::new_v6(
                IpamKey::new("_recovered-from-host", id, "unknown"),
                ip.parse().unwrap(),
                PodMetadata::default(),
                t(0),
            )
        };
        s.restore(&[rec("veth-a", "2001:db8:0:0:2::9")]);
        s.defer(vec![
            rec("veth-b", "2001:db8:0:0:1::1"), // a registered /80: held at once
            rec("veth-a", "2001:db8:0:0:2::1"), // its key is taken when adopted: re-keyed
            rec("eth0", "2001:db8:0:0:9::10"),  // in no /80 of this node: never held
        ]);
        assert_eq!(s.assigned_count(), 2);
        assert_eq!(s.deferred().len(), 2);
        assert!(
            s.checkpoint_entries()
                .iter()
                .all(|e| e.ipv6() != "2001:db8:0:0:2::1".parse().ok()),
            "not checkpointed before its /80 is known"
        );
        s.add_prefix(prefix("eni-2", "2001:db8:0:0:2::/80", 1, 2));
        let a = |s: &str| s.parse::<Ipv6Addr>().unwrap();
        let held: Vec<(String, Ipv6Addr)> = s
            .assignments()
            .into_iter()
            .map(|(k, _, a)| (k.container_id, a.ip))
            .collect();
        assert_eq!(
            held,
            vec![
                ("veth-a".into(), a("2001:db8:0:0:2::9")),
                (
                    format!("veth-a@{}", a("2001:db8:0:0:2::1")),
                    a("2001:db8:0:0:2::1")
                ),
                ("veth-b".into(), a("2001:db8:0:0:1::1")),
            ]
        );
        assert_eq!(s.deferred().len(), 1, "the node's own address stays out");
        let next = s
            .assign(&key("n"), PodMetadata::default(), Some("eni-2"), t(1))
            .unwrap();
        assert_eq!(next.ip, a("2001:db8:0:0:2::2"));
    }

    #[test]
    fn dual_stack_takes_the_enis_own_prefix() {
        let mut s = V6Store::new(Duration::ZERO);
        s.add_prefix(prefix("eni-1", "2001:db8:0:0:1::/80", 0, 254));
        s.add_prefix(prefix("eni-2", "2001:db8:0:0:2::/80", 1, 2));
        let a = s
            .assign(&key("a"), PodMetadata::default(), Some("eni-2"), t(0))
            .unwrap();
        assert_eq!(
            (a.eni_id.as_str(), a.device_number, a.route_table),
            ("eni-2", 1, 2)
        );
        assert!(s.prefixes()[1].net.contains(&a.ip));
        assert_eq!(
            s.assign(&key("b"), PodMetadata::default(), Some("eni-3"), t(0)),
            Err(V6Error::NoPrefix(Some("eni-3".into())))
        );
    }

    #[test]
    fn checkpoint_round_trip_keeps_every_address() {
        let mut s = V6Store::new(Duration::ZERO);
        s.add_prefix(prefix("eni-1", "2001:db8::/80", 0, 254));
        let meta = PodMetadata {
            namespace: "default".into(),
            name: "p".into(),
            interfaces_count: 1,
        };
        let a = s.assign(&key("a"), meta.clone(), None, t(0)).unwrap();
        let entries = s.checkpoint_entries();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].ipv6, a.ip.to_string());
        assert!(entries[0].ipv4.is_empty());
        let json = serde_json::to_string(&entries[0]).unwrap();
        assert!(json.contains("\"ipv6\":\"2001:db8::1\""), "{json}");
        assert!(!json.contains("ipv4"), "{json}");

        // restored before the prefix is known: kept, then placed once it is
        let mut r = V6Store::new(Duration::ZERO);
        let v4 = CheckpointEntry::new(
            key("v4"),
            "198.18.0.5".parse().unwrap(),
            PodMetadata::default(),
            t(0),
        );
        let mut all = entries.clone();
        all.push(v4);
        assert!(r.restore(&all).is_empty());
        assert_eq!(r.lookup(&key("a")).unwrap().eni_id, "");
        r.add_prefix(prefix("eni-1", "2001:db8::/80", 0, 254));
        assert_eq!(r.lookup(&key("a")).unwrap(), a);
        assert_eq!(r.assignments()[0].1, meta);
        assert_eq!(r.lookup(&key("v4")), None);
        // the restored address is not handed out again; a duplicate entry is rejected
        let b = r
            .assign(&key("b"), PodMetadata::default(), None, t(1))
            .unwrap();
        assert_ne!(b.ip, a.ip);
        assert_eq!(r.restore(&entries).len(), 1);
    }
}
