//! cni-metrics-helper's subnet inventory as the cluster shares it: PURE. The JSON document the
//! helper writes into one ConfigMap after every inventory round (its wire format, one
//! definition for writer and reader), and the choice ipamd makes between that figure and its
//! own `DescribeSubnets` listing for the address capacity ([`subnet_room`]). Must not: read the
//! clock, the environment, EC2 or Kubernetes.
//!
//! Why: ipamd lists its subnets only when it creates an ENI, so its free-address figure can be
//! hours old; the helper recounts every subnet of the cluster every `SUBNET_INVENTORY_INTERVAL`
//! (default 5 min) and fits a consumption rate. Sharing it makes a subnet running dry visible to
//! every node before its pool is refused, and publishes when it will run out.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::capacity::SubnetRoom;
use super::policy::PREFIX_SIZE;

/// Where the inventory's ConfigMap is (both sides name it in their settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapRef {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl ConfigMapRef {
    /// `<namespace>/<name>`, or a bare `<name>` in `default_namespace` when one is given (None:
    /// the namespace is required). Both as Kubernetes names them: a namespace is a DNS label
    /// (lowercase alphanumerics and `-`, at most 63), a name a DNS subdomain (`.` too, at most
    /// 253). None when the value is not such a reference.
    #[must_use]
    pub fn parse(value: &str, default_namespace: Option<&str>) -> Option<Self> {
        let (namespace, name) = match (value.split_once('/'), default_namespace) {
            (Some((ns, name)), _) => (ns, name),
            (None, Some(ns)) => (ns, value),
            (None, None) => return None,
        };
        let valid = |s: &str, dots: bool, max: usize| {
            !s.is_empty()
                && s.len() <= max
                && s.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
                })
                && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
        };
        (valid(namespace, false, 63) && valid(name, true, 253)).then(|| Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl std::fmt::Display for ConfigMapRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The ConfigMap's one data key.
pub const DATA_KEY: &str = "inventory.json";
/// The document's `version`.
pub const VERSION: u32 = 1;
/// An inventory older than this many of its own intervals is ignored (said in status).
pub const STALE_INTERVALS: u32 = 3;

/// The document (`data["inventory.json"]`). Times are RFC 3339 (UTC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InventoryDocument {
    /// [`VERSION`].
    pub version: u32,
    /// When the helper counted (the end of its EC2 reads).
    #[serde(with = "rfc3339")]
    pub observed_at: SystemTime,
    /// `SUBNET_INVENTORY_INTERVAL`: the next document is due this many seconds later.
    pub interval_seconds: u64,
    /// One entry per subnet of the cluster's inventory.
    pub subnets: Vec<SubnetEntry>,
}

/// One subnet's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubnetEntry {
    /// `subnet-…`.
    pub subnet_id: String,
    /// Free addresses (no ENI address or prefix, no reservation, not AWS's five).
    pub free_addresses: u32,
    /// Free aligned `/28` blocks (what prefix delegation can still get).
    pub free_prefix_blocks: u32,
    /// Addresses consumed per second (least squares over the helper's window); absent with
    /// too few samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_consumption_per_second: Option<f64>,
    /// When the free addresses reach zero at that rate; absent while not shrinking.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub address_exhaustion_at: Option<SystemTime>,
    /// `/28` blocks consumed per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_block_consumption_per_second: Option<f64>,
    /// When the free `/28` blocks reach zero at that rate.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "rfc3339_opt")]
    pub prefix_block_exhaustion_at: Option<SystemTime>,
}

/// Why a document is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InventoryError {
    /// The ConfigMap has no [`DATA_KEY`].
    #[error("no data key {DATA_KEY}")]
    NoDataKey,
    /// Not the document (JSON syntax, a field missing or unknown, a bad time).
    #[error("{DATA_KEY} is not a subnet inventory: {0}")]
    Malformed(String),
    /// A version this reader does not know.
    #[error("{DATA_KEY} has version {0}, this ipamd reads version {VERSION}")]
    Version(u32),
}

impl InventoryDocument {
    /// The document's JSON (the helper's write).
    #[must_use]
    pub fn render(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The document from the ConfigMap's data value.
    pub fn parse(text: &str) -> Result<Self, InventoryError> {
        let doc: Self =
            serde_json::from_str(text).map_err(|e| InventoryError::Malformed(e.to_string()))?;
        if doc.version != VERSION {
            return Err(InventoryError::Version(doc.version));
        }
        Ok(doc)
    }

    /// How old it is at `now` (0 when observed in the future: clocks differ a little).
    #[must_use]
    pub fn age(&self, now: SystemTime) -> Duration {
        now.duration_since(self.observed_at).unwrap_or_default()
    }

    /// Older than [`STALE_INTERVALS`] intervals at `now`.
    #[must_use]
    pub fn stale(&self, now: SystemTime) -> bool {
        self.age(now)
            > Duration::from_secs(self.interval_seconds.max(1)).saturating_mul(STALE_INTERVALS)
    }
}

/// What ipamd's own listing says of the subnets of card 0's ENIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OwnListing {
    /// The pool's last attempt was refused for want of addresses (see [`SubnetRoom::dry`]).
    pub dry: bool,
    /// Sum of `AvailableIpAddressCount` over those subnets when every one was listed.
    pub free: Option<u32>,
    /// When the oldest of those listings was made (None: not known).
    pub listed_at: Option<SystemTime>,
}

/// What became of the helper's inventory in this choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InventoryUse {
    /// No inventory configured or read yet.
    None,
    /// Its free figure is the subnets' room.
    Used,
    /// Read but not used; why (for status and the log).
    Ignored(String),
}

/// The subnets' room for [`super::capacity::address_capacity`] from ipamd's own listing and,
/// when given, the helper's inventory, and what became of the inventory:
///
/// * `dry` (a refusal) always wins: nothing more until an attempt succeeds;
/// * the inventory's figure replaces the listing's when it is not stale ([`STALE_INTERVALS`]),
///   names every one of `subnets`, and was observed no earlier than the listing; its free
///   figure is the sum of the subnets' free addresses, or under prefix delegation of their
///   free `/28` blocks × 16 (what `InsufficientCidrBlocks` is about). A 0 from it counts
///   ([`SubnetRoom::counted`]): it is a recount, not a listing older than the pool's last
///   success;
/// * the forecast (the earliest exhaustion time over `subnets`, of `/28` blocks under prefix
///   delegation) is kept whenever the inventory is not stale and names every subnet, even
///   while the listing is the fresher figure.
#[must_use]
pub fn subnet_room(
    own: OwnListing,
    inventory: Option<&InventoryDocument>,
    subnets: &BTreeSet<String>,
    prefix_delegation: bool,
    now: SystemTime,
) -> (SubnetRoom, InventoryUse) {
    let listing = SubnetRoom {
        dry: own.dry,
        free: own.free,
        ..SubnetRoom::default()
    };
    let Some(doc) = inventory else {
        return (listing, InventoryUse::None);
    };
    if doc.stale(now) {
        return (
            listing,
            InventoryUse::Ignored(format!(
                "stale: observed {}s ago, more than {STALE_INTERVALS} intervals of {}s",
                doc.age(now).as_secs(),
                doc.interval_seconds
            )),
        );
    }
    if subnets.is_empty() {
        return (
            listing,
            InventoryUse::Ignored("no subnet of card 0's ENIs known yet".into()),
        );
    }
    let mut free: u32 = 0;
    let mut exhaustion_at: Option<SystemTime> = None;
    for id in subnets {
        let Some(e) = doc.subnets.iter().find(|e| &e.subnet_id == id) else {
            return (
                listing,
                InventoryUse::Ignored(format!("{id} is not in the inventory")),
            );
        };
        let (room, at) = if prefix_delegation {
            (
                e.free_prefix_blocks.saturating_mul(PREFIX_SIZE),
                e.prefix_block_exhaustion_at,
            )
        } else {
            (e.free_addresses, e.address_exhaustion_at)
        };
        free = free.saturating_add(room);
        exhaustion_at = match (exhaustion_at, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let forecast = SubnetRoom {
        exhaustion_at,
        ..listing
    };
    if let Some(listed) = own.listed_at
        && listed > doc.observed_at
    {
        return (
            forecast,
            InventoryUse::Ignored(format!(
                "ipamd's own DescribeSubnets is {}s newer",
                listed
                    .duration_since(doc.observed_at)
                    .unwrap_or_default()
                    .as_secs()
            )),
        );
    }
    (
        SubnetRoom {
            free: Some(free),
            counted: true,
            ..forecast
        },
        InventoryUse::Used,
    )
}

mod rfc3339 {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};
    use time::format_description::well_known::Rfc3339;

    pub(super) fn format(t: SystemTime) -> String {
        time::OffsetDateTime::from(t)
            .replace_nanosecond(0)
            .unwrap_or_else(|_| time::OffsetDateTime::from(t))
            .format(&Rfc3339)
            .unwrap_or_default()
    }

    pub(super) fn parse(s: &str) -> Result<SystemTime, String> {
        time::OffsetDateTime::parse(s, &Rfc3339)
            .map(SystemTime::from)
            .map_err(|e| format!("{s:?} is not an RFC 3339 time: {e}"))
    }

    #[allow(clippy::trivially_copy_pass_by_ref)]
    pub(super) fn serialize<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(*t))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
        parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

mod rfc3339_opt {
    use std::time::SystemTime;

    use serde::{Deserialize, Deserializer, Serializer};

    #[allow(clippy::ref_option)]
    pub(super) fn serialize<S: Serializer>(
        t: &Option<SystemTime>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&super::rfc3339::format(*t)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<SystemTime>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| super::rfc3339::parse(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// `t` as RFC 3339 (UTC, whole seconds), as the document writes times.
#[must_use]
pub fn rfc3339(t: SystemTime) -> String {
    rfc3339::format(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s)
    }

    fn entry(id: &str, free: u32, blocks: u32, out_at: Option<u64>) -> SubnetEntry {
        SubnetEntry {
            subnet_id: id.into(),
            free_addresses: free,
            free_prefix_blocks: blocks,
            address_consumption_per_second: out_at.map(|_| 0.5),
            address_exhaustion_at: out_at.map(at),
            prefix_block_consumption_per_second: None,
            prefix_block_exhaustion_at: out_at.map(|s| at(s / 2)),
        }
    }

    fn doc(observed: u64, subnets: Vec<SubnetEntry>) -> InventoryDocument {
        InventoryDocument {
            version: VERSION,
            observed_at: at(observed),
            interval_seconds: 300,
            subnets,
        }
    }

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_document_round_trips_and_bad_ones_are_refused() {
        let d = doc(
            0,
            vec![
                entry("subnet-a", 7, 0, Some(3600)),
                entry("subnet-b", 3, 1, None),
            ],
        );
        let text = d.render();
        assert!(
            text.contains("\"observedAt\": \"2023-11-14T22:13:20Z\""),
            "{text}"
        );
        assert!(
            text.contains("\"addressExhaustionAt\": \"2023-11-14T23:13:20Z\""),
            "{text}"
        );
        assert_eq!(InventoryDocument::parse(&text), Ok(d));
        assert!(matches!(
            InventoryDocument::parse("{\"version\": 1"),
            Err(InventoryError::Malformed(_))
        ));
        assert!(matches!(
            InventoryDocument::parse(
                "{\"version\":1,\"observedAt\":\"yesterday\",\"intervalSeconds\":300,\"subnets\":[]}"
            ),
            Err(InventoryError::Malformed(e)) if e.contains("RFC 3339")
        ));
        assert!(matches!(
            InventoryDocument::parse(
                "{\"version\":1,\"observedAt\":\"2023-11-14T22:13:20Z\",\"intervalSeconds\":300,\"subnets\":[{\"subnetId\":\"s\",\"freeAddresses\":-1,\"freePrefixBlocks\":0}]}"
            ),
            Err(InventoryError::Malformed(_))
        ));
        assert_eq!(
            InventoryDocument::parse(
                "{\"version\":2,\"observedAt\":\"2023-11-14T22:13:20Z\",\"intervalSeconds\":300,\"subnets\":[]}"
            ),
            Err(InventoryError::Version(2))
        );
    }

    #[test]
    fn a_fresh_recount_replaces_an_older_listing_zero_included() {
        let own = OwnListing {
            dry: false,
            free: Some(4000),
            listed_at: Some(at(0)),
        };
        let d = doc(
            60,
            vec![
                entry("subnet-a", 0, 0, Some(500)),
                entry("subnet-b", 2, 0, None),
            ],
        );
        let (room, used) = subnet_room(
            own,
            Some(&d),
            &set(&["subnet-a", "subnet-b"]),
            false,
            at(100),
        );
        assert_eq!(used, InventoryUse::Used);
        assert_eq!(room.free, Some(2));
        assert!(room.counted);
        assert_eq!(room.exhaustion_at, Some(at(500)));
        let (room, _) = subnet_room(own, Some(&d), &set(&["subnet-a"]), false, at(100));
        assert_eq!(
            (room.free, room.counted),
            (Some(0), true),
            "a counted 0 is 0"
        );
    }

    #[test]
    fn prefix_delegation_counts_free_blocks_and_their_forecast() {
        let d = doc(60, vec![entry("subnet-a", 40, 1, Some(1000))]);
        let (room, used) = subnet_room(
            OwnListing::default(),
            Some(&d),
            &set(&["subnet-a"]),
            true,
            at(61),
        );
        assert_eq!(used, InventoryUse::Used);
        assert_eq!(room.free, Some(16), "40 scattered addresses but one /28");
        assert_eq!(room.exhaustion_at, Some(at(500)));
    }

    #[test]
    fn stale_incomplete_or_older_inventories_leave_the_listing() {
        let own = OwnListing {
            dry: false,
            free: Some(4000),
            listed_at: Some(at(200)),
        };
        let listing = SubnetRoom {
            free: Some(4000),
            ..SubnetRoom::default()
        };
        let d = doc(100, vec![entry("subnet-a", 5, 0, Some(900))]);
        // older than the listing: the listing's figure, the forecast still published
        let (room, used) = subnet_room(own, Some(&d), &set(&["subnet-a"]), false, at(250));
        assert!(
            matches!(used, InventoryUse::Ignored(ref w) if w.contains("100s newer")),
            "{used:?}"
        );
        assert_eq!(
            room,
            SubnetRoom {
                exhaustion_at: Some(at(900)),
                ..listing
            }
        );
        // stale: three intervals (900 s) and a second
        let own = OwnListing {
            listed_at: None,
            ..own
        };
        let (room, used) = subnet_room(own, Some(&d), &set(&["subnet-a"]), false, at(1001));
        assert!(
            matches!(used, InventoryUse::Ignored(ref w) if w.starts_with("stale")),
            "{used:?}"
        );
        assert_eq!(room, listing);
        let (_, used) = subnet_room(own, Some(&d), &set(&["subnet-a"]), false, at(1000));
        assert_eq!(used, InventoryUse::Used);
        // a subnet the helper does not count
        let (room, used) = subnet_room(
            own,
            Some(&d),
            &set(&["subnet-a", "subnet-z"]),
            false,
            at(200),
        );
        assert_eq!(
            used,
            InventoryUse::Ignored("subnet-z is not in the inventory".into())
        );
        assert_eq!(room, listing);
        // none
        assert_eq!(
            subnet_room(own, None, &set(&["subnet-a"]), false, at(200)),
            (listing, InventoryUse::None)
        );
    }

    #[test]
    fn a_refusal_wins_over_any_figure() {
        let own = OwnListing {
            dry: true,
            free: None,
            listed_at: None,
        };
        let d = doc(0, vec![entry("subnet-a", 300, 10, None)]);
        let (room, used) = subnet_room(own, Some(&d), &set(&["subnet-a"]), false, at(1));
        assert_eq!(used, InventoryUse::Used);
        assert!(room.dry && room.free == Some(300));
        // address_capacity gives 0 from EC2 while dry, whatever `free` says (capacity tests)
    }
}
