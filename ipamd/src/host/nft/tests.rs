//! Unit tests of the pure nftables connmark plan: the desired table from config, parsing of
//! `nft -j` output (nft 1.0.6's shapes), and the plan. Each cites the upstream function in
//! `pkg/networkutils/nftables_connmark.go` (v1.23.1) it matches.

use super::*;
use crate::host::snat::{DEFAULT_CONNMARK, RandomizeSnat};

fn cfg() -> SnatConfig {
    SnatConfig {
        external_snat: false,
        vpc_cidrs: vec![
            "10.10.0.0/16".parse().unwrap(),
            "10.11.0.0/16".parse().unwrap(),
        ],
        // Not truncated, and a duplicate of a VPC CIDR: upstream's `net.ParseCIDR` masks it
        // and its map de-duplicates.
        exclude_cidrs: vec![
            "192.168.7.1/24".parse().unwrap(),
            "10.10.0.0/16".parse().unwrap(),
        ],
        randomization: RandomizeSnat::Prng,
        node_port_support: true,
        connmark: DEFAULT_CONNMARK,
        veth_prefix: "eni".into(),
        primary_ip: Ipv4Addr::new(10, 10, 0, 10),
        primary_interface: "eth0".into(),
    }
}

fn net(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

#[test]
fn desired_table_is_upstreams_setup_of_vpc_and_excluded_cidrs() {
    // upstream UpdateHostSNATRules: Setup(append(vpcCIDRs, excludeSNATCIDRs...)).
    let t = desired_table(&cfg()).unwrap();
    assert_eq!(
        t.exempt,
        vec![
            net("10.10.0.0/16"),
            net("10.11.0.0/16"),
            net("192.168.7.0/24")
        ]
    );
    assert_eq!((t.mark, t.veth_prefix.as_str()), (0x80, "eni"));
    // upstream UpdateHostSNATRules: Cleanup() (delete the table) under external SNAT.
    let external = SnatConfig {
        external_snat: true,
        ..cfg()
    };
    assert_eq!(desired_table(&external), None);
}

#[test]
fn rendered_table_is_upstreams_layout() {
    // upstream Setup's doc comment and ensureBaseChain/ensureBaseChainRules/
    // ensureConnmarkChainRules: names, family, hook, priority -90, policy, rule shapes; the
    // CIDR match as a 4-byte load + mask + compare (insertCIDRReturnRule).
    let t = ConnmarkTable {
        mark: 0x4000,
        ..desired_table(&cfg()).unwrap()
    };
    let want = "\
table ip aws-cni {
\tchain nat-prerouting {
\t\ttype nat hook prerouting priority -90; policy accept;
\t\tfib daddr type local return
\t\tiifname \"eni*\" counter jump snat-mark
\t\tcounter meta mark set ct mark & 0x00004000
\t}
\tchain snat-mark {
\t\tcounter ip daddr & 255.255.255.0 == 192.168.7.0 return
\t\tcounter ip daddr & 255.255.0.0 == 10.11.0.0 return
\t\tcounter ip daddr & 255.255.0.0 == 10.10.0.0 return
\t\tcounter ct mark set ct mark | 0x00004000
\t}
}
";
    assert_eq!(t.render(), want);
    assert_eq!(
        script(&NftOp::Replace(t)),
        format!("add table ip aws-cni\ndelete table ip aws-cni\n{want}")
    );
    assert_eq!(script(&NftOp::Delete), "delete table ip aws-cni\n");
}

/// `nft -j list table ip aws-cni` (nft 1.0.6) of upstream's table, with traffic counted and
/// the returns in another order than ours (upstream inserts them from a Go map).
fn upstream_listing(prio: i64, extra_rule: &str) -> String {
    format!(
        r#"{{"nftables": [{{"metainfo": {{"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}}},
{{"table": {{"family": "ip", "name": "aws-cni", "handle": 7}}}},
{{"chain": {{"family": "ip", "table": "aws-cni", "name": "nat-prerouting", "handle": 1, "type": "nat", "hook": "prerouting", "prio": {prio}, "policy": "accept"}}}},
{{"chain": {{"family": "ip", "table": "aws-cni", "name": "snat-mark", "handle": 2}}}},
{{"rule": {{"family": "ip", "table": "aws-cni", "chain": "nat-prerouting", "handle": 3, "expr": [{{"match": {{"op": "==", "left": {{"fib": {{"result": "type", "flags": ["daddr"]}}}}, "right": "local"}}}}, {{"return": null}}]}}}},
{{"rule": {{"family": "ip", "table": "aws-cni", "chain": "nat-prerouting", "handle": 4, "expr": [{{"match": {{"op": "==", "left": {{"meta": {{"key": "iifname"}}}}, "right": "eni*"}}}}, {{"counter": {{"packets": 12, "bytes": 720}}}}, {{"jump": {{"target": "snat-mark"}}}}]}}}},
{{"rule": {{"family": "ip", "table": "aws-cni", "chain": "nat-prerouting", "handle": 5, "expr": [{{"counter": {{"packets": 40, "bytes": 2400}}}}, {{"mangle": {{"key": {{"meta": {{"key": "mark"}}}}, "value": {{"&": [{{"ct": {{"key": "mark"}}}}, 128]}}}}}}]}}}},
{{"rule": {{"family": "ip", "table": "aws-cni", "chain": "snat-mark", "handle": 6, "expr": [{{"counter": {{"packets": 3, "bytes": 180}}}}, {{"match": {{"op": "==", "left": {{"payload": {{"protocol": "ip", "field": "daddr"}}}}, "right": {{"prefix": {{"addr": "10.11.0.0", "len": 16}}}}}}}}, {{"return": null}}]}}}},
{{"rule": {{"family": "ip", "table": "aws-cni", "chain": "snat-mark", "handle": 7, "expr": [{{"counter": {{"packets": 0, "bytes": 0}}}}, {{"match": {{"op": "==", "left": {{"payload": {{"protocol": "ip", "field": "daddr"}}}}, "right": {{"prefix": {{"addr": "10.10.0.0", "len": 16}}}}}}}}, {{"return": null}}]}}}},
{{"rule": {{"family": "ip", "table": "aws-cni", "chain": "snat-mark", "handle": 8, "expr": [{{"counter": {{"packets": 0, "bytes": 0}}}}, {{"match": {{"op": "==", "left": {{"payload": {{"protocol": "ip", "field": "daddr"}}}}, "right": {{"prefix": {{"addr": "192.168.7.0", "len": 24}}}}}}}}, {{"return": null}}]}}}},
{extra_rule}
{{"rule": {{"family": "ip", "table": "aws-cni", "chain": "snat-mark", "handle": 9, "expr": [{{"counter": {{"packets": 9, "bytes": 540}}}}, {{"mangle": {{"key": {{"ct": {{"key": "mark"}}}}, "value": {{"|": [{{"ct": {{"key": "mark"}}}}, 128]}}}}}}]}}}}
]}}"#
    )
}

#[test]
fn upstreams_table_is_recognised_rule_by_rule_and_needs_no_change() {
    let observed = parse_table(&upstream_listing(-90, "")).unwrap();
    let names: Vec<&str> = observed.chains.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [BASE_CHAIN, MARK_CHAIN]);
    let base = &observed.chains[0].1;
    assert_eq!(base.base, Some(BaseChainSpec::upstream()));
    assert_eq!(
        base.rules,
        vec![
            NftRule::FibLocalReturn,
            NftRule::JumpFromVeths {
                prefix: "eni".into()
            },
            NftRule::RestoreMark { mark: 0x80 },
        ]
    );
    let mark = &observed.chains[1].1;
    assert_eq!(mark.base, None);
    assert_eq!(
        mark.rules,
        vec![
            NftRule::ReturnTo(net("10.11.0.0/16")),
            NftRule::ReturnTo(net("10.10.0.0/16")),
            NftRule::ReturnTo(net("192.168.7.0/24")),
            NftRule::SetMark { mark: 0x80 },
        ]
    );
    // The order of the returns is not ours, counters are not zero: still nothing to do
    // (upstream ensureConnmarkChainRules reconciles the CIDRs as a set).
    let desired = desired_table(&cfg()).unwrap();
    assert_eq!(plan(Some(&observed), Some(&desired)), None);
}

#[test]
fn host_and_single_address_cidrs_parse_as_upstream_writes_them() {
    // nft lists a /32 as a bare address and a /0 as 0.0.0.0/0.
    let rule = |right: &str| {
        format!(
            r#"{{"nftables": [{{"chain": {{"family": "ip", "table": "aws-cni", "name": "snat-mark", "handle": 2}}}},
{{"rule": {{"chain": "snat-mark", "expr": [{{"counter": {{"packets": 0, "bytes": 0}}}}, {{"match": {{"op": "==", "left": {{"payload": {{"protocol": "ip", "field": "daddr"}}}}, "right": {right}}}}}, {{"return": null}}]}}}}]}}"#
        )
    };
    let got = |right: &str| parse_table(&rule(right)).unwrap().chains[0].1.rules.clone();
    assert_eq!(
        got(r#""1.2.3.4""#),
        vec![NftRule::ReturnTo(net("1.2.3.4/32"))]
    );
    assert_eq!(
        got(r#"{"prefix": {"addr": "0.0.0.0", "len": 0}}"#),
        vec![NftRule::ReturnTo(net("0.0.0.0/0"))]
    );
    assert_eq!(
        NftRule::ReturnTo(net("1.2.3.4/32")).statement().unwrap(),
        "counter ip daddr & 255.255.255.255 == 1.2.3.4 return"
    );
}

#[test]
fn near_misses_are_not_taken_for_ours() {
    // upstream isJumpRule/isRestoreRule/extractCIDRFromRule/isSetMarkRule require the counter
    // and the exact register pipeline; a rule without the counter, a jump elsewhere or a saddr
    // match is someone else's and is replaced.
    for exprs in [
        r#"[{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "eni*"}}, {"jump": {"target": "snat-mark"}}]"#,
        r#"[{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "eni*"}}, {"counter": null}, {"jump": {"target": "other"}}]"#,
        r#"[{"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": "eni*"}}, {"counter": null}, {"jump": {"target": "snat-mark"}}]"#,
        r#"[{"counter": null}, {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "1.2.3.4"}}, {"return": null}]"#,
        r#"[{"mangle": {"key": {"ct": {"key": "mark"}}, "value": {"|": [{"ct": {"key": "mark"}}, 128]}}}]"#,
        r#"[{"counter": null}, {"mangle": {"key": {"ct": {"key": "mark"}}, "value": {"&": [{"ct": {"key": "mark"}}, 128]}}}]"#,
        r#"[{"match": {"op": "==", "left": {"fib": {"result": "type", "flags": ["saddr"]}}, "right": "local"}}, {"return": null}]"#,
    ] {
        let v: Vec<Value> = serde_json::from_str(exprs).unwrap();
        assert!(
            matches!(classify(&v), NftRule::Other(_)),
            "{exprs} taken for {:?}",
            classify(&v)
        );
    }
}

#[test]
fn plan_replaces_any_difference_and_deletes_when_unwanted() {
    let desired = desired_table(&cfg()).unwrap();
    let upstream = parse_table(&upstream_listing(-90, "")).unwrap();
    let replace = Some(NftOp::Replace(desired.clone()));
    // Absent: created.
    assert_eq!(plan(None, Some(&desired)), replace);
    // Nothing wanted, nothing there.
    assert_eq!(plan(None, None), None);
    // External SNAT or a legacy node: deleted (upstream Cleanup / cleanupNFTStaleRules).
    assert_eq!(plan(Some(&upstream), None), Some(NftOp::Delete));
    // Base chain at kube-proxy's dstnat priority (-100): re-created (isBaseChainConfigUpToDate).
    let wrong_prio = parse_table(&upstream_listing(-100, "")).unwrap();
    assert_eq!(plan(Some(&wrong_prio), Some(&desired)), replace);
    // A stray rule in the mark chain (ensureConnmarkChainRules deletes unknown rules).
    let stray = r#"{"rule": {"family": "ip", "table": "aws-cni", "chain": "snat-mark", "handle": 10, "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"accept": null}]}},"#;
    let with_stray = parse_table(&upstream_listing(-90, stray)).unwrap();
    assert_eq!(plan(Some(&with_stray), Some(&desired)), replace);
    // A duplicate return.
    let dup = r#"{"rule": {"family": "ip", "table": "aws-cni", "chain": "snat-mark", "handle": 11, "expr": [{"counter": {"packets": 0, "bytes": 0}}, {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "daddr"}}, "right": {"prefix": {"addr": "10.10.0.0", "len": 16}}}}, {"return": null}]}},"#;
    let with_dup = parse_table(&upstream_listing(-90, dup)).unwrap();
    assert_eq!(plan(Some(&with_dup), Some(&desired)), replace);
    // VPC CIDRs changed at run time (upstream updateCIDRsRulesOnChange → UpdateHostSNATRules).
    let grown = SnatConfig {
        vpc_cidrs: vec![
            net("10.10.0.0/16"),
            net("10.11.0.0/16"),
            net("100.64.0.0/16"),
        ],
        ..cfg()
    };
    let grown = desired_table(&grown).unwrap();
    assert_eq!(
        plan(Some(&upstream), Some(&grown)),
        Some(NftOp::Replace(grown.clone()))
    );
    // Another mark or veth prefix (AWS_VPC_K8S_CNI_CONNMARK, AWS_VPC_K8S_CNI_VETHPREFIX).
    for changed in [
        ConnmarkTable {
            mark: 0x40,
            ..desired.clone()
        },
        ConnmarkTable {
            veth_prefix: "cali".into(),
            ..desired.clone()
        },
    ] {
        assert_eq!(
            plan(Some(&upstream), Some(&changed)),
            Some(NftOp::Replace(changed.clone()))
        );
    }
    // An extra chain in our table.
    let mut extra = upstream.clone();
    extra.chains.push(("old".into(), ObservedChain::default()));
    assert_eq!(plan(Some(&extra), Some(&desired)), replace);
}

#[test]
fn table_listing_is_found_by_family_and_name() {
    let tables =
        |t: &str| format!(r#"{{"nftables": [{{"metainfo": {{"version": "1.0.6"}}}}, {t}]}}"#);
    assert!(
        lists_table(&tables(
            r#"{"table": {"family": "ip", "name": "aws-cni", "handle": 3}}"#
        ))
        .unwrap()
    );
    assert!(
        !lists_table(&tables(
            r#"{"table": {"family": "ip6", "name": "aws-cni", "handle": 3}}"#
        ))
        .unwrap()
    );
    assert!(
        !lists_table(&tables(
            r#"{"table": {"family": "ip", "name": "nat", "handle": 1}}"#
        ))
        .unwrap()
    );
    assert!(lists_table("not json").is_err());
}

#[test]
fn connmark_backend_follows_the_iptables_backend() {
    // upstream NewConnmark: mode.IsNFTables() → nftables, else iptables; the gauge labels.
    assert_eq!(
        ConnmarkBackend::for_iptables(Backend::Nft),
        ConnmarkBackend::Nftables
    );
    assert_eq!(
        ConnmarkBackend::for_iptables(Backend::Legacy),
        ConnmarkBackend::Iptables
    );
    assert_eq!(ConnmarkBackend::Nftables.label(), "nftables");
    assert_eq!(ConnmarkBackend::Iptables.label(), "iptables");
}
