//! Reconciliation of the datastore with the cloud, EC2 being the source of truth (upstream
//! `nodeIPPoolReconcile`, with its force-release bugs designed out: #3824, #3887, #3019).
//!
//! Rules:
//! 1. IMDS is a hint. Every round compares IMDS's ENIs/CIDRs with the datastore; when they
//!    agree nothing else happens (no EC2 call at steady state).
//! 2. On a difference, ONE `DescribeNetworkInterfaces` decides. The same unexplained
//!    difference (e.g. IMDS persistently omitting a prefix) is re-confirmed at most every
//!    `CONFIRM_INTERVAL`.
//! 3. A CIDR or ENI EC2 no longer has is removed only when no pod holds an address in it; one
//!    holding pods is kept (and logged) until those pods are deleted. Nothing is ever
//!    force-released.
//! 4. CIDRs and ENIs the pool manager released in the last `FREED_COOLDOWN` are never
//!    re-added from a (stale) view.
//! 5. No round within `RECONCILE_INTERVAL` of the previous one or of a pool change.
//!
//! This module holds the pure part: the views, the difference and the plan ([`plan`]), and the
//! cheap-hint port ([`Hint`]). The reconciler (`crate::pool_loop::reconciler`) gathers the
//! inputs and has `Ipam` apply the plan. Must not: do I/O, know `Ipam`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use ipnet::Ipv4Net;

use super::provider::{AttachedEni, ProviderError};
use crate::datastore::Usage;

/// What the datastore holds: ENI → (CIDR → held by a pod).
pub type StoreView = BTreeMap<String, BTreeMap<Ipv4Net, bool>>;

/// The datastore's ENIs and CIDRs (from its [`Usage`]), with "a pod holds an address in it".
#[must_use]
pub fn store_view(usage: &Usage) -> StoreView {
    usage
        .iter()
        .map(|(id, cidrs)| {
            (
                id.clone(),
                cidrs.iter().map(|(n, a)| (*n, *a > 0)).collect(),
            )
        })
        .collect()
}

/// What `enis` list: ENI → CIDRs (secondary /32s and prefixes).
#[must_use]
pub fn cloud_view(enis: &[AttachedEni]) -> BTreeMap<String, BTreeSet<Ipv4Net>> {
    enis.iter()
        .map(|e| {
            let cidrs = e
                .secondary_ips
                .iter()
                .map(|ip| Ipv4Net::from(*ip))
                .chain(e.prefixes.iter().copied())
                .collect();
            (e.id.clone(), cidrs)
        })
        .collect()
}

/// A canonical description of how a view differs from the datastore (empty: in sync).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Difference {
    /// ENIs seen but not in the store.
    pub missing_enis: BTreeSet<String>,
    /// ENIs in the store but not seen.
    pub extra_enis: BTreeSet<String>,
    /// CIDRs seen on a known ENI but not in the store.
    pub missing_cidrs: BTreeSet<(String, Ipv4Net)>,
    /// CIDRs in the store but not seen.
    pub extra_cidrs: BTreeSet<(String, Ipv4Net)>,
}

impl Difference {
    /// In sync.
    pub fn is_empty(&self) -> bool {
        self.missing_enis.is_empty()
            && self.extra_enis.is_empty()
            && self.missing_cidrs.is_empty()
            && self.extra_cidrs.is_empty()
    }
}

/// How `seen` (IMDS or EC2) differs from the store, ignoring what is cooling down after release.
/// `missing_*`: in `seen`, not in the store. `extra_*`: in the store, not in `seen`.
pub fn difference(
    store: &StoreView,
    seen: &[AttachedEni],
    freed: &BTreeSet<Ipv4Net>,
    freed_enis: &BTreeSet<String>,
) -> Difference {
    let seen = cloud_view(seen);
    let mut d = Difference::default();
    for (id, cidrs) in &seen {
        match store.get(id) {
            None if !freed_enis.contains(id) => {
                d.missing_enis.insert(id.clone());
            }
            None => {}
            Some(have) => {
                for c in cidrs
                    .iter()
                    .filter(|c| !have.contains_key(*c) && !freed.contains(*c))
                {
                    d.missing_cidrs.insert((id.clone(), *c));
                }
                for c in have.keys().filter(|c| !cidrs.contains(*c)) {
                    d.extra_cidrs.insert((id.clone(), *c));
                }
            }
        }
    }
    for id in store.keys().filter(|id| !seen.contains_key(*id)) {
        d.extra_enis.insert(id.clone());
    }
    d
}

/// What a confirmed (EC2) difference leads to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// ENIs attached in EC2 the store lacks (registered with their CIDRs, host set up).
    pub add_enis: Vec<AttachedEni>,
    /// CIDRs EC2 has on a known ENI that the store lacks.
    pub add_cidrs: Vec<(String, Ipv4Net)>,
    /// CIDRs gone from EC2 and held by no pod.
    pub remove_cidrs: Vec<(String, Ipv4Net)>,
    /// ENIs gone from EC2 whose CIDRs are held by no pod.
    pub remove_enis: Vec<String>,
    /// Gone from EC2 but held by pods: kept until the pods are deleted (never force-released),
    /// quarantined meanwhile (no new assignments, not in the pool's totals).
    pub kept_in_use: Vec<(String, Ipv4Net)>,
    /// ENIs gone from EC2 with pods on them: kept and quarantined as a whole.
    pub kept_enis: Vec<String>,
}

impl Plan {
    /// Nothing to change.
    pub fn is_empty(&self) -> bool {
        self.add_enis.is_empty()
            && self.add_cidrs.is_empty()
            && self.remove_cidrs.is_empty()
            && self.remove_enis.is_empty()
    }
}

/// PURE: the changes that make the store match EC2's `truth`, under rules 3 and 4.
pub fn plan(
    store: &StoreView,
    truth: &[AttachedEni],
    freed: &BTreeSet<Ipv4Net>,
    freed_enis: &BTreeSet<String>,
) -> Plan {
    let d = difference(store, truth, freed, freed_enis);
    let mut p = Plan::default();
    for e in truth.iter().filter(|e| d.missing_enis.contains(&e.id)) {
        let mut e = e.clone();
        e.secondary_ips
            .retain(|ip| !freed.contains(&Ipv4Net::from(*ip)));
        e.prefixes.retain(|c| !freed.contains(c));
        p.add_enis.push(e);
    }
    p.add_cidrs = d.missing_cidrs.into_iter().collect();
    for (eni, cidr) in d.extra_cidrs {
        let held = store
            .get(&eni)
            .and_then(|c| c.get(&cidr))
            .copied()
            .unwrap_or(false);
        if held {
            p.kept_in_use.push((eni, cidr))
        } else {
            p.remove_cidrs.push((eni, cidr))
        }
    }
    for eni in d.extra_enis {
        let held: Vec<Ipv4Net> = store
            .get(&eni)
            .map(|c| c.iter().filter(|(_, h)| **h).map(|(n, _)| *n).collect())
            .unwrap_or_default();
        if held.is_empty() {
            p.remove_enis.push(eni);
        } else {
            p.kept_in_use
                .extend(held.into_iter().map(|n| (eni.clone(), n)));
            p.kept_enis.push(eni);
        }
    }
    p
}

/// Where the cheap hint comes from. The EC2 provider answers from IMDS; any other provider
/// answers with its (cheap) source of truth.
pub trait Hint: Send + Sync {
    /// The ENIs and addresses as the cheap source sees them.
    fn hinted_enis(&self) -> impl Future<Output = Result<Vec<AttachedEni>, ProviderError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn eni(id: &str, dev: u32, ips: &[&str], prefixes: &[&str]) -> AttachedEni {
        AttachedEni {
            id: id.into(),
            device_number: dev,
            network_card: 0,
            is_primary: dev == 0,
            is_trunk: false,
            is_efa: false,
            is_excluded: false,
            mac: format!("02:00:00:00:00:0{dev}"),
            subnet_id: "subnet-1".into(),
            subnet: "198.18.0.0/24".parse().unwrap(),
            primary_ip: Ipv4Addr::new(198, 18, 0, 10 + u8::try_from(dev).unwrap()),
            secondary_ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            prefixes: prefixes.iter().map(|s| s.parse().unwrap()).collect(),
        }
    }

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn store(entries: &[(&str, &[(&str, bool)])]) -> StoreView {
        entries
            .iter()
            .map(|(id, c)| {
                (
                    (*id).to_owned(),
                    c.iter().map(|(n, h)| (net(n), *h)).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn table_of_reconcile_rules() {
        let none = BTreeSet::new();
        let no_enis = BTreeSet::new();
        struct Case {
            name: &'static str,
            store: StoreView,
            truth: Vec<AttachedEni>,
            freed: BTreeSet<Ipv4Net>,
            want: Plan,
        }
        let cases = vec![
            Case {
                name: "in sync: nothing",
                store: store(&[("eni-0", &[("198.18.0.20/32", true)])]),
                truth: vec![eni("eni-0", 0, &["198.18.0.20"], &[])],
                freed: none.clone(),
                want: Plan::default(),
            },
            Case {
                name: "#3824: prefix gone from ec2 but held by a pod is kept, not force-released",
                store: store(&[(
                    "eni-0",
                    &[("198.18.0.32/28", true), ("198.18.0.48/28", false)],
                )]),
                truth: vec![eni("eni-0", 0, &[], &[])],
                freed: none.clone(),
                want: Plan {
                    remove_cidrs: vec![("eni-0".into(), net("198.18.0.48/28"))],
                    kept_in_use: vec![("eni-0".into(), net("198.18.0.32/28"))],
                    ..Plan::default()
                },
            },
            Case {
                name: "#3887: a cidr ipamd just released is not re-added from a stale view",
                store: store(&[("eni-0", &[])]),
                truth: vec![eni("eni-0", 0, &["198.18.0.21"], &[])],
                freed: [net("198.18.0.21/32")].into(),
                want: Plan::default(),
            },
            Case {
                name: "an address ec2 has and the store lacks is added",
                store: store(&[("eni-0", &[])]),
                truth: vec![eni("eni-0", 0, &["198.18.0.22"], &[])],
                freed: none.clone(),
                want: Plan {
                    add_cidrs: vec![("eni-0".into(), net("198.18.0.22/32"))],
                    ..Plan::default()
                },
            },
            Case {
                name: "#66: an eni attached mid-grow before a restart is adopted",
                store: store(&[("eni-0", &[])]),
                truth: vec![
                    eni("eni-0", 0, &[], &[]),
                    eni("eni-1", 1, &["198.18.0.30"], &[]),
                ],
                freed: none.clone(),
                want: Plan {
                    add_enis: vec![eni("eni-1", 1, &["198.18.0.30"], &[])],
                    ..Plan::default()
                },
            },
            Case {
                name: "#1967: an eni gone from ec2 with pods on it is kept",
                store: store(&[("eni-0", &[]), ("eni-1", &[("198.18.0.30/32", true)])]),
                truth: vec![eni("eni-0", 0, &[], &[])],
                freed: none.clone(),
                want: Plan {
                    kept_in_use: vec![("eni-1".into(), net("198.18.0.30/32"))],
                    kept_enis: vec!["eni-1".into()],
                    ..Plan::default()
                },
            },
            Case {
                name: "an empty eni gone from ec2 is dropped",
                store: store(&[("eni-0", &[]), ("eni-1", &[("198.18.0.30/32", false)])]),
                truth: vec![eni("eni-0", 0, &[], &[])],
                freed: none.clone(),
                want: Plan {
                    remove_enis: vec!["eni-1".into()],
                    ..Plan::default()
                },
            },
        ];
        for c in cases {
            assert_eq!(
                plan(&c.store, &c.truth, &c.freed, &no_enis),
                c.want,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn difference_ignores_cooling_cidrs_and_sees_missing_ones() {
        let s = store(&[("eni-0", &[("198.18.0.20/32", false)])]);
        let hint = vec![eni("eni-0", 0, &["198.18.0.20", "198.18.0.21"], &[])];
        assert!(
            difference(&s, &hint, &[net("198.18.0.21/32")].into(), &BTreeSet::new()).is_empty()
        );
        assert!(!difference(&s, &hint, &BTreeSet::new(), &BTreeSet::new()).is_empty());
    }
}
