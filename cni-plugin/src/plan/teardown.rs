//! DEL's plan for a sandbox's veths, addresses, rules and routes ([`plan_teardown`]): only
//! what provably belongs to this sandbox (docs/plugin.md, "What DEL may touch"), from ipamd's
//! answer ([`IpamdRelease`]), prevResult and the host state DEL read ([`TeardownView`]). Must
//! not: read the host itself (`apply` observes it), or plan a branch-ENI pod's VLAN objects
//! (`branch_teardown.rs`).

use std::net::IpAddr;

use dataplane::conventions::{FROM_POD_RULE_PRIORITY, MAIN_TABLE, TO_POD_RULE_PRIORITY};
use dataplane::{Family, MacAddr, Route, Rule};
use ipnet::IpNet;

use super::veth_name::strict_branch_veth;
use super::{MAX_EXTRA_INTERFACES, branch_host_veth, host_veth_at, host_veth_for, marker_vlan};
use crate::spec::{CniEnv, Interface, NetConf};

/// What ipamd answered to this sandbox's `DelNetwork`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpamdRelease {
    /// ipamd released these addresses of this sandbox just now: until this answer they were
    /// the sandbox's, so their rules are its own.
    Released(Vec<IpAddr>),
    /// ipamd does not know the sandbox: an earlier DEL released its addresses (this is a
    /// retry), or it never got one. Those addresses may already be another pod's.
    UnknownPod,
    /// ipamd unreachable or failing: it may still hold the sandbox's addresses, or (a retried
    /// DEL) may have released and reassigned them.
    Unavailable,
    /// DEL has not asked ipamd yet (its first phase): whatever ipamd holds for the sandbox is
    /// still held, so only what the host proves counts; `prevResult`'s addresses are not proof
    /// (an earlier DEL may have released them).
    NotAskedYet,
}

/// A host link found under one of the names this sandbox's host veth may have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLink {
    /// Interface index in the host netns.
    pub index: u32,
    /// Name.
    pub name: String,
    /// MAC address.
    pub mac: Option<MacAddr>,
    /// `IFLA_LINK`: for a veth, the peer's ifindex.
    pub peer_index: Option<u32>,
}

/// The sandbox's own interface (`CNI_IFNAME` in `CNI_NETNS`), when it still exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodEnd {
    /// Interface index in the pod netns.
    pub index: u32,
    /// `IFLA_LINK`: for a veth, the ifindex of its host end.
    pub peer_index: Option<u32>,
}

/// The host state DEL reads before it decides anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeardownView {
    /// Host links named like one of [`teardown_veth_names`] (the others do not exist).
    pub host_links: Vec<HostLink>,
    /// The sandbox's interface, when `CNI_NETNS` opens and holds `CNI_IFNAME`.
    pub pod_end: Option<PodEnd>,
    /// A multi-card pod's interfaces on its other cards that still exist in `CNI_NETNS`, by
    /// the name of the host veth they pair with (`mNicIf<i>` ↔ [`super::host_veth_at`] `i`).
    pub other_card_pod_ends: Vec<(String, PodEnd)>,
    /// Host routes in the main table (both families).
    pub host_routes: Vec<Route>,
}

/// Why DEL left an address's rules and route alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptReason {
    /// The host routes it through a link that is not this sandbox's: another pod has it now.
    RoutedElsewhere,
    /// Nothing proves it is still this sandbox's now (prevResult names it and ipamd does not, or
    /// ipamd has just released it, and it is not routed through this sandbox's veth). ipamd
    /// prunes the rules left behind, fenced (at DelNetwork for what it released).
    NotProvablyOurs,
}

/// What DEL removes: only objects that provably belong to this sandbox (docs/plugin.md,
/// "What DEL may touch").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TeardownPlan {
    /// Host veths proven to be this sandbox's, deleted by index.
    pub host_veths: Vec<HostLink>,
    /// Host veths found under this sandbox's names that belong to another sandbox (kept).
    pub foreign_veths: Vec<HostLink>,
    /// Pod addresses whose host rules (512 `to`, 1536 `from`) go.
    pub addresses: Vec<IpNet>,
    /// Host routes to delete (to those addresses, through this sandbox's veths).
    pub routes: Vec<Route>,
    /// Addresses left alone, and why.
    pub kept: Vec<(IpNet, KeptReason)>,
}

impl TeardownPlan {
    /// Whether `rule` was installed for one of the pod addresses (`to <ip>` at 512, or any
    /// `from <ip>` at 1536, including the per-VPC-CIDR rules older plugins installed).
    #[must_use]
    pub fn owns_rule(&self, rule: &Rule) -> bool {
        self.addresses.iter().any(|a| {
            (rule.priority == TO_POD_RULE_PRIORITY && rule.dst == Some(*a) && rule.src.is_none())
                || (rule.priority == FROM_POD_RULE_PRIORITY && rule.src == Some(*a))
        })
    }

    /// Families of the addresses whose rules go.
    #[must_use]
    pub fn families(&self) -> Vec<Family> {
        let mut out = Vec::new();
        for a in &self.addresses {
            let f = Family::of(a.addr());
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }
}

/// Names this sandbox's host veth may have: the one computed from this invocation, and the one
/// prevResult names (the conflist's prefix may have changed since ADD); for a multi-NIC pod,
/// those of its further interfaces too (as many as prevResult lists).
#[must_use]
pub fn teardown_veth_names(conf: &NetConf, env: &CniEnv) -> Vec<String> {
    teardown_veth_names_with(conf, env, prev_extra_interfaces(conf))
}

/// [`teardown_veth_names`] with the host veths of a multi-NIC pod's interfaces `1..=extra`.
#[must_use]
pub fn teardown_veth_names_with(conf: &NetConf, env: &CniEnv, extra: u32) -> Vec<String> {
    let mut names = vec![host_veth_for(conf, env)];
    for index in 1..=extra.max(prev_extra_interfaces(conf)) {
        names.push(host_veth_at(conf, env, index));
    }
    // A branch-ENI pod's veth (`vlan<hash>` in strict mode) when prevResult's marker says so.
    let branch = branch_host_veth(conf, env);
    if conf.prev_result.as_ref().and_then(marker_vlan).unwrap_or(0) != 0 && !names.contains(&branch)
    {
        names.push(branch);
    }
    // And always the strict-mode name: a pod re-created under this name as a strict-mode
    // branch pod is wired on it, and a DEL of an older sandbox must see it (another sandbox
    // is wired: its network policy is left alone). Found, it is never deleted unless proven
    // this sandbox's.
    let strict = strict_branch_veth(env);
    if !names.contains(&strict) {
        names.push(strict);
    }
    for host in prev_host_interfaces(conf) {
        if !names.contains(&host.name) {
            names.push(host.name.clone());
        }
    }
    names
}

/// A multi-NIC pod's interfaces beyond the first, as prevResult lists them (host veths after the
/// first: `(len(interfaces) - 1) / 2`).
#[must_use]
pub fn prev_extra_interfaces(conf: &NetConf) -> u32 {
    u32::try_from(prev_host_interfaces(conf).count().saturating_sub(1)).unwrap_or(0)
}

/// Every host interface prevResult lists (one per pod interface): those without a `sandbox`, but
/// the marker (a branch-ENI pod's has none).
fn prev_host_interfaces(conf: &NetConf) -> impl Iterator<Item = &Interface> {
    conf.prev_result
        .iter()
        .flat_map(|p| p.interfaces.iter())
        .filter(|i| i.sandbox.is_none() && !i.name.is_empty() && !i.name.starts_with("dummy"))
}

/// Whether `link` is this sandbox's host veth: it is paired with the sandbox's own interface
/// (each end's `IFLA_LINK` is the other's index), or it has the name and the MAC that
/// prevResult recorded (ADD draws a random MAC unique among host links).
fn is_own_veth<'a>(
    link: &HostLink,
    pod_end: Option<PodEnd>,
    mut prev_hosts: impl Iterator<Item = &'a Interface>,
) -> bool {
    let paired = pod_end
        .is_some_and(|p| p.peer_index == Some(link.index) && link.peer_index == Some(p.index));
    let recorded = prev_hosts.any(|h| {
        h.name == link.name
            && h.mac
                .parse::<MacAddr>()
                .is_ok_and(|mac| link.mac == Some(mac))
    });
    paired || recorded
}

/// Plans DEL from ipamd's answer and the host state, touching only what belongs to this
/// sandbox:
/// - a host veth only when it is provably this sandbox's (`is_own_veth`); another sandbox of the
///   same pod computes the same name;
/// - rules and routes of an address only when no link but this sandbox's veths routes it, and
///   this sandbox's veth routes it, or (ipamd unavailable) prevResult names it and nothing
///   routes it at all. An address ipamd released without such proof is left to ipamd, which
///   prunes its rules fenced (a released address may be the next pod's already).
#[must_use]
pub fn plan_teardown(
    conf: &NetConf,
    env: &CniEnv,
    ipamd: &IpamdRelease,
    view: &TeardownView,
) -> TeardownPlan {
    let names = teardown_veth_names_with(conf, env, MAX_EXTRA_INTERFACES);
    let mut plan = TeardownPlan::default();
    for link in view.host_links.iter().filter(|l| names.contains(&l.name)) {
        // A multi-NIC pod's further veth pairs with its own `mNicIf<i>`; the first with
        // `CNI_IFNAME`.
        let pod_end = view
            .other_card_pod_ends
            .iter()
            .find(|(host, _)| *host == link.name)
            .map_or(view.pod_end, |(_, end)| Some(*end));
        if is_own_veth(link, pod_end, prev_host_interfaces(conf)) {
            plan.host_veths.push(link.clone());
        } else {
            plan.foreign_veths.push(link.clone());
        }
    }
    let own: Vec<u32> = plan.host_veths.iter().map(|l| l.index).collect();
    let host_routes_to = |a: IpNet| {
        view.host_routes
            .iter()
            .filter(move |r| r.table == MAIN_TABLE && r.dst == a)
    };
    let routed_elsewhere =
        |a: IpNet| host_routes_to(a).any(|r| r.oif.is_none_or(|i| !own.contains(&i)));

    let mut candidates: Vec<(IpNet, bool)> = Vec::new();
    let mut push = |a: IpNet, proven: bool| match candidates.iter_mut().find(|(c, _)| *c == a) {
        Some(entry) => entry.1 |= proven,
        None => candidates.push((a, proven)),
    };
    // What ipamd released for this sandbox was its own, but once released it may be the next
    // pod's (`IP_COOLDOWN_PERIOD=0`), wired between this read and a delete by selector: its
    // rules are ipamd's to prune, fenced (DelNetwork does it before it answers), unless the
    // host routes it through this sandbox's veth (below).
    if let IpamdRelease::Released(addresses) = ipamd {
        for a in addresses {
            push(IpNet::from(*a), false);
        }
    }
    // So is whatever the host routes through this sandbox's veth (only its ADD routes there).
    for r in &view.host_routes {
        if r.table == MAIN_TABLE
            && r.dst.prefix_len() == r.dst.max_prefix_len()
            && r.oif.is_some_and(|i| own.contains(&i))
        {
            push(r.dst, true);
        }
    }
    // prevResult's addresses: ours only when ipamd cannot have given them away since it never
    // answered, and no other pod is wired with them.
    if let Some(prev) = &conf.prev_result {
        for ip in &prev.ips {
            let a = IpNet::from(ip.address.addr());
            let unrouted = host_routes_to(a).next().is_none();
            push(a, *ipamd == IpamdRelease::Unavailable && unrouted);
        }
    }
    for (a, proven) in candidates {
        if routed_elsewhere(a) {
            plan.kept.push((a, KeptReason::RoutedElsewhere));
        } else if proven {
            plan.addresses.push(a);
            plan.routes.extend(host_routes_to(a).copied());
        } else {
            plan.kept.push((a, KeptReason::NotProvablyOurs));
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use dataplane::Scope;

    use super::super::fixtures::{branch_reply, mk_conf, mk_env, mk_reply, plan_reply};
    use super::*;

    /// DEL of a multi-NIC pod: each further host veth is the sandbox's when it pairs with its
    /// own `mNicIf<i>`; one that pairs with nothing of the sandbox is another's (kept).
    #[test]
    fn teardown_pairs_each_further_veth_with_its_own_interface() {
        let conf = mk_conf();
        let env = mk_env(true);
        let link = |index, name: &str, peer| HostLink {
            index,
            name: name.into(),
            mac: None,
            peer_index: Some(peer),
        };
        let view = TeardownView {
            host_links: vec![
                link(10, "enic440f455693", 2),
                link(11, "enie48ae9c2f34", 3),
                link(12, "eni1266d167117", 99),
            ],
            pod_end: Some(PodEnd {
                index: 2,
                peer_index: Some(10),
            }),
            other_card_pod_ends: vec![(
                "enie48ae9c2f34".into(),
                PodEnd {
                    index: 3,
                    peer_index: Some(11),
                },
            )],
            host_routes: Vec::new(),
        };
        let plan = plan_teardown(&conf, &env, &IpamdRelease::NotAskedYet, &view);
        let own: Vec<u32> = plan.host_veths.iter().map(|l| l.index).collect();
        let foreign: Vec<u32> = plan.foreign_veths.iter().map(|l| l.index).collect();
        assert_eq!((own, foreign), (vec![10, 11], vec![12]));
        assert_eq!(
            teardown_veth_names_with(&conf, &env, 2),
            [
                "enic440f455693",
                "enie48ae9c2f34",
                "eni1266d167117",
                "vlanc440f455693"
            ]
        );
    }

    /// One DEL situation: ipamd's answer, prevResult (address, host veth MAC), host state;
    /// and what must go: veth indexes, addresses (rules), routes (dst, oif), kept addresses.
    struct Case {
        name: &'static str,
        release: IpamdRelease,
        prev: Option<(&'static str, &'static str)>,
        links: Vec<HostLink>,
        pod_end: Option<PodEnd>,
        routes: Vec<(&'static str, u32)>,
        veths: Vec<u32>,
        addresses: Vec<&'static str>,
        deleted_routes: Vec<(&'static str, u32)>,
        kept: Vec<(&'static str, KeptReason)>,
    }

    #[test]
    fn teardown_touches_only_what_belongs_to_the_sandbox() {
        const OWN_MAC: &str = "02:00:00:00:00:07";
        const X: &str = "198.18.1.10/32";
        const Y: &str = "198.18.1.11/32";
        let veth = |index: u32, mac: &str, peer: u32| HostLink {
            index,
            name: "enic440f455693".to_owned(),
            mac: Some(mac.parse().unwrap()),
            peer_index: Some(peer),
        };
        // This sandbox's pair: host end 7 <-> pod end 2. Another sandbox of the same pod name
        // (same computed veth name): host end 9 <-> its own pod end 2.
        let own = || veth(7, OWN_MAC, 2);
        let other = || veth(9, "02:00:00:00:00:09", 2);
        let pod = Some(PodEnd {
            index: 2,
            peer_index: Some(7),
        });
        let released = |a: &str| IpamdRelease::Released(vec![a.parse::<IpNet>().unwrap().addr()]);
        use IpamdRelease::{Unavailable, UnknownPod};
        use KeptReason::{NotProvablyOurs, RoutedElsewhere};
        let cases = vec![
            Case {
                name: "released, own veth paired with the pod end",
                release: released(X),
                prev: Some((X, OWN_MAC)),
                links: vec![own()],
                pod_end: pod,
                routes: vec![(X, 7)],
                veths: vec![7],
                addresses: vec![X],
                deleted_routes: vec![(X, 7)],
                kept: vec![],
            },
            Case {
                name: "re-created pod: same veth name, other sandbox's pair and address",
                release: released(X),
                prev: Some((X, OWN_MAC)),
                links: vec![other()],
                pod_end: None,
                routes: vec![(Y, 9)],
                veths: vec![],
                addresses: vec![],
                deleted_routes: vec![],
                kept: vec![(X, NotProvablyOurs)],
            },
            Case {
                // issue 38: with IP_COOLDOWN_PERIOD=0 the next pod may be wiring X right now
                // (its route not yet there): a delete by selector would take its rules
                name: "released, routed nowhere: its rules are ipamd's to prune, fenced",
                release: released(X),
                prev: None,
                links: vec![],
                pod_end: None,
                routes: vec![],
                veths: vec![],
                addresses: vec![],
                deleted_routes: vec![],
                kept: vec![(X, NotProvablyOurs)],
            },
            Case {
                name: "re-created pod, retry without prevResult: nothing of the other's",
                release: UnknownPod,
                prev: None,
                links: vec![other()],
                pod_end: None,
                routes: vec![(Y, 9)],
                veths: vec![],
                addresses: vec![],
                deleted_routes: vec![],
                kept: vec![],
            },
            Case {
                name: "unknown pod, prevResult's address now routed to another pod",
                release: UnknownPod,
                prev: Some((X, OWN_MAC)),
                links: vec![own()],
                pod_end: pod,
                routes: vec![(X, 9)],
                veths: vec![7],
                addresses: vec![],
                deleted_routes: vec![],
                kept: vec![(X, RoutedElsewhere)],
            },
            Case {
                name: "unknown pod, prevResult's address routed nowhere",
                release: UnknownPod,
                prev: Some((X, OWN_MAC)),
                links: vec![],
                pod_end: None,
                routes: vec![],
                veths: vec![],
                addresses: vec![],
                deleted_routes: vec![],
                kept: vec![(X, NotProvablyOurs)],
            },
            Case {
                name: "unknown pod, address still routed through own veth",
                release: UnknownPod,
                prev: None,
                links: vec![own()],
                pod_end: pod,
                routes: vec![(X, 7), (Y, 9)],
                veths: vec![7],
                addresses: vec![X],
                deleted_routes: vec![(X, 7)],
                kept: vec![],
            },
            Case {
                name: "ipamd down, netns gone: prevResult's unrouted address",
                release: Unavailable,
                prev: Some((X, OWN_MAC)),
                links: vec![],
                pod_end: None,
                routes: vec![],
                veths: vec![],
                addresses: vec![X],
                deleted_routes: vec![],
                kept: vec![],
            },
            Case {
                name: "ipamd down, prevResult's address routed to another pod",
                release: Unavailable,
                prev: Some((X, OWN_MAC)),
                links: vec![own()],
                pod_end: pod,
                routes: vec![(X, 9)],
                veths: vec![7],
                addresses: vec![],
                deleted_routes: vec![],
                kept: vec![(X, RoutedElsewhere)],
            },
            Case {
                name: "ipamd down, no prevResult: addresses routed through own veth",
                release: Unavailable,
                prev: None,
                links: vec![own()],
                pod_end: pod,
                routes: vec![(X, 7), (Y, 9)],
                veths: vec![7],
                addresses: vec![X],
                deleted_routes: vec![(X, 7)],
                kept: vec![],
            },
            Case {
                name: "ipamd down, no prevResult, other sandbox's veth: nothing",
                release: Unavailable,
                prev: None,
                links: vec![other()],
                pod_end: None,
                routes: vec![(Y, 9)],
                veths: vec![],
                addresses: vec![],
                deleted_routes: vec![],
                kept: vec![],
            },
            Case {
                name: "no pod end: prevResult's name and MAC identify the veth",
                release: released(X),
                prev: Some((X, OWN_MAC)),
                links: vec![own()],
                pod_end: None,
                routes: vec![(X, 7)],
                veths: vec![7],
                addresses: vec![X],
                deleted_routes: vec![(X, 7)],
                kept: vec![],
            },
            Case {
                name: "pairing must hold both ways",
                release: UnknownPod,
                prev: None,
                links: vec![veth(7, OWN_MAC, 5)],
                pod_end: pod,
                routes: vec![(X, 7)],
                veths: vec![],
                addresses: vec![],
                deleted_routes: vec![],
                kept: vec![],
            },
            Case {
                name: "released, but another link routes it: a live pod's rules stay",
                release: released(X),
                prev: None,
                links: vec![own()],
                pod_end: pod,
                routes: vec![(X, 9)],
                veths: vec![7],
                addresses: vec![],
                deleted_routes: vec![],
                kept: vec![(X, RoutedElsewhere)],
            },
        ];
        let env = mk_env(true);
        for c in cases {
            let conf = match c.prev {
                None => mk_conf(),
                Some((ip, mac)) => NetConf::parse(
                    format!(
                        r#"{{"cniVersion":"1.0.0","name":"aws-cni","prevResult":{{"cniVersion":"1.0.0",
                        "interfaces":[{{"name":"enic440f455693","mac":"{mac}"}},{{"name":"eth0","sandbox":"/x"}}],
                        "ips":[{{"address":"{ip}","interface":1}}]}}}}"#
                    )
                    .as_bytes(),
                )
                .unwrap(),
            };
            let route = |(dst, oif): (&str, u32)| Route {
                dst: dst.parse().unwrap(),
                gateway: None,
                oif: Some(oif),
                table: MAIN_TABLE,
                scope: Scope::Link,
            };
            let view = TeardownView {
                host_links: c.links,
                pod_end: c.pod_end,
                other_card_pod_ends: Vec::new(),
                host_routes: c.routes.into_iter().map(route).collect(),
            };
            let plan = plan_teardown(&conf, &env, &c.release, &view);
            let name = c.name;
            assert_eq!(
                plan.host_veths.iter().map(|l| l.index).collect::<Vec<_>>(),
                c.veths,
                "{name}: veths"
            );
            assert_eq!(
                plan.addresses,
                c.addresses
                    .iter()
                    .map(|a| a.parse::<IpNet>().unwrap())
                    .collect::<Vec<_>>(),
                "{name}: addresses"
            );
            assert_eq!(
                plan.routes,
                c.deleted_routes.into_iter().map(route).collect::<Vec<_>>(),
                "{name}: routes"
            );
            assert_eq!(
                plan.kept,
                c.kept
                    .iter()
                    .map(|(a, r)| (a.parse::<IpNet>().unwrap(), *r))
                    .collect::<Vec<_>>(),
                "{name}: kept"
            );
        }
    }

    #[test]
    fn teardown_rules_owned_by_the_addresses() {
        let plan = TeardownPlan {
            addresses: vec!["198.18.1.10/32".parse().unwrap()],
            ..TeardownPlan::default()
        };
        let addr: IpNet = "198.18.1.10/32".parse().unwrap();
        // Old upstream versions' per-VPC-CIDR `from` rules count too.
        assert!(plan.owns_rule(&Rule {
            src: Some(addr),
            dst: Some("198.18.0.0/16".parse().unwrap()),
            ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, 2)
        }));
        assert!(plan.owns_rule(&Rule {
            dst: Some(addr),
            ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
        }));
        assert!(!plan.owns_rule(&Rule {
            dst: Some("198.18.1.11/32".parse().unwrap()),
            ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
        }));
        assert_eq!(plan.families(), vec![Family::V4]);
    }

    #[test]
    fn teardown_veth_names_add_prev_results_name() {
        let conf = NetConf::parse(
            br#"{"cniVersion":"1.0.0","name":"n","prevResult":{"cniVersion":"1.0.0",
            "interfaces":[{"name":"enizzz","mac":"02:00:00:00:00:01"},{"name":"eth0","sandbox":"/x"}],
            "ips":[{"address":"198.18.1.10/32","interface":1}]}}"#,
        )
        .unwrap();
        assert_eq!(
            teardown_veth_names(&conf, &mk_env(true)),
            vec![
                "enic440f455693".to_owned(),
                "vlanc440f455693".to_owned(),
                "enizzz".to_owned()
            ]
        );
        assert_eq!(
            teardown_veth_names(&mk_conf(), &mk_env(true)),
            vec!["enic440f455693".to_owned(), "vlanc440f455693".to_owned()]
        );
    }

    /// Suspicion of issue 38: the pod was re-created under its name as a strict-mode branch
    /// pod (`vlan<hash>` veth) before the old, regular sandbox's DEL came. That DEL looks at
    /// the `vlan<hash>` name too and finds a veth that is not its own: another sandbox is
    /// wired, so DEL leaves the network-policy agent's state for the name alone (the old
    /// code never looked at that name and had the agent forget the new pod's policy).
    #[test]
    fn regular_del_sees_a_strict_branch_pod_recreated_under_its_name() {
        let env = mk_env(true);
        let old = plan_reply(&mk_reply("198.18.1.10", "", 1, 2), &mk_conf(), &env).unwrap();
        let mut conf = mk_conf();
        conf.prev_result = Some(old.result_with(
            &[(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]))],
            "/var/run/netns/old",
        ));
        let new_pod = plan_reply(&branch_reply(5), &mk_conf(), &env).unwrap();
        assert!(new_pod.interface.host_veth.starts_with("vlan"));
        let view = TeardownView {
            host_links: vec![HostLink {
                index: 9,
                name: new_pod.interface.host_veth.clone(),
                mac: Some(MacAddr([2, 0, 0, 0, 0, 9])),
                peer_index: Some(2),
            }],
            ..TeardownView::default()
        };
        assert!(teardown_veth_names(&conf, &env).contains(&new_pod.interface.host_veth));
        let plan = plan_teardown(&conf, &env, &IpamdRelease::UnknownPod, &view);
        assert!(plan.host_veths.is_empty());
        assert_eq!(plan.foreign_veths, view.host_links);
    }
}
