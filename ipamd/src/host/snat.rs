//! The desired SNAT and connmark iptables rules of a node, as a pure function of [`SnatConfig`].
//! Why exact chains, comments and specs: they are what existing nodes carry, so a node taken over
//! (or rolled back) converges without churn. Must not: read installed state, run programs or parse
//! environment variables (that is `config`'s).

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::iptables::{IptablesRule, Table};
use super::nft::ConnmarkBackend;

/// The SNAT chain every non-VPC packet of a pod passes through.
pub const SNAT_CHAIN: &str = "AWS-SNAT-CHAIN-0";
/// The chain that marks connections pods open to non-VPC destinations.
pub const CONNMARK_CHAIN: &str = "AWS-CONNMARK-CHAIN-0";
/// `AWS_VPC_K8S_CNI_RANDOMIZESNAT` and the connmark default: the config's own (parsed once there).
pub use crate::config::{DEFAULT_CONNMARK, RandomizeSnat};

/// The filter FORWARD rule (inserted at position 1 when missing) that rejects new connections
/// forwarded to the egress-cni range, so no pod reaches another pod's egress interface:
/// `169.254.172.0/22` (IPv4, IPv6 mode) or `fd00::ac:00/118` (IPv6, `ENABLE_V6_EGRESS`). The rule
/// spec after `FORWARD`.
#[must_use]
pub fn node_local_block_spec(v6: bool) -> Vec<String> {
    let (cidr, version) = if v6 {
        ("fd00::ac:00/118", "v6")
    } else {
        ("169.254.172.0/22", "v4")
    };
    [
        "-d",
        cidr,
        "-m",
        "conntrack",
        "--ctstate",
        "NEW",
        "-m",
        "comment",
        "--comment",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([
        format!("Block Node Local Pod access via IP{version}"),
        "-j".to_owned(),
        "REJECT".to_owned(),
    ])
    .collect()
}

/// Everything the SNAT/connmark rules depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnatConfig {
    /// `AWS_VPC_K8S_CNI_EXTERNALSNAT`: no SNAT chain and no nat connmark rules.
    pub external_snat: bool,
    /// The VPC's IPv4 CIDRs (traffic to them is not SNATed).
    pub vpc_cidrs: Vec<Ipv4Net>,
    /// `AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS`.
    pub exclude_cidrs: Vec<Ipv4Net>,
    /// `AWS_VPC_K8S_CNI_RANDOMIZESNAT`.
    pub randomization: RandomizeSnat,
    /// `AWS_VPC_CNI_NODE_PORT_SUPPORT`: mangle connmark rules on the primary interface.
    pub node_port_support: bool,
    /// `AWS_VPC_K8S_CNI_CONNMARK` (mark and mask).
    pub connmark: u32,
    /// `AWS_VPC_K8S_CNI_VETHPREFIX` (host veths are `<prefix>+`).
    pub veth_prefix: String,
    /// The primary ENI's primary IPv4: the SNAT source.
    pub primary_ip: Ipv4Addr,
    /// The primary ENI's interface name on the node (found by MAC).
    pub primary_interface: String,
}

/// The rules a node must have, in chain order (pure). `random_fully` says whether the host's
/// iptables supports `--random-fully`.
///
/// Specs are written in iptables-save's canonical form (so they compare with installed rules as
/// text); the comments are the ones existing nodes carry, so a node taken over converges without
/// churn.
#[must_use]
pub fn desired_rules(cfg: &SnatConfig, random_fully: bool) -> Vec<IptablesRule> {
    desired_iptables_rules(cfg, random_fully, ConnmarkBackend::Iptables)
}

/// The iptables rules a node must have when the pod connmark lives in `connmark`: with
/// [`ConnmarkBackend::Nftables`] the nat PREROUTING connmark rules and `AWS-CONNMARK-CHAIN-0` are
/// not desired (the table `ip aws-cni` replaces them); the SNAT chain and the mangle rules are the
/// same on both (they stay in iptables).
#[must_use]
pub fn desired_iptables_rules(
    cfg: &SnatConfig,
    random_fully: bool,
    connmark: ConnmarkBackend,
) -> Vec<IptablesRule> {
    let mut rules = Vec::new();
    let mark = cfg.connmark;
    let veths = format!("{}+", cfg.veth_prefix);

    if !cfg.external_snat {
        // Each CIDR is inserted at position 1, so the chain lists them in reverse.
        let returns = cidr_returns(cfg);

        rules.push(IptablesRule::new(
            Table::Nat,
            "POSTROUTING",
            format!(r#"-m comment --comment "AWS SNAT CHAIN" -j {SNAT_CHAIN}"#),
        ));
        for (cidr, excluded) in &returns {
            let comment = if *excluded {
                "AWS SNAT CHAIN EXCLUSION"
            } else {
                "AWS SNAT CHAIN"
            };
            rules.push(IptablesRule::new(
                Table::Nat,
                SNAT_CHAIN,
                format!(
                    r#"{}-m comment --comment "{comment}" -j RETURN"#,
                    dst(*cidr)
                ),
            ));
        }
        let random = match cfg.randomization {
            RandomizeSnat::Prng if random_fully => " --random-fully",
            RandomizeSnat::Prng | RandomizeSnat::HashRandom => " --random",
            RandomizeSnat::None => "",
        };
        rules.push(IptablesRule::new(
            Table::Nat,
            SNAT_CHAIN,
            format!(
                r#"! -o vlan+ -m comment --comment "AWS, SNAT" -m addrtype ! --dst-type LOCAL -j SNAT --to-source {}{random}"#,
                cfg.primary_ip
            ),
        ));
    }
    if !cfg.external_snat && connmark == ConnmarkBackend::Iptables {
        let returns = cidr_returns(cfg);
        // Connections pods open to non-VPC destinations are marked, so their replies (which
        // arrive on the primary ENI after un-SNAT) route back through main.
        rules.push(IptablesRule::new(
            Table::Nat,
            "PREROUTING",
            format!(
                r#"-i {veths} -m comment --comment "AWS, outbound connections" -j {CONNMARK_CHAIN}"#
            ),
        ));
        rules.push(IptablesRule::new(
            Table::Nat,
            "PREROUTING",
            format!(
                r#"-m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --nfmask {mark:#x} --ctmask {mark:#x}"#
            ),
        ));
        // Every return rule is commented "AWS CONNMARK CHAIN", VPC and excluded CIDRs alike;
        // another comment would make each implementation delete the other's rules as stale during a
        // takeover or a rollback.
        for (cidr, _) in &returns {
            rules.push(IptablesRule::new(
                Table::Nat,
                CONNMARK_CHAIN,
                format!(
                    r#"{}-m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#,
                    dst(*cidr)
                ),
            ));
        }
        rules.push(IptablesRule::new(
            Table::Nat,
            CONNMARK_CHAIN,
            format!(r#"-m comment --comment "AWS, CONNMARK" -j CONNMARK --set-xmark {mark:#x}/{mark:#x}"#),
        ));
    }

    // The three mangle rules and their conditions: the primary-ENI mark and the vlan+ restore exist
    // with NodePort support; the veth restore also whenever pods' connections are SNATed, since
    // their replies carry the mark too.
    let restore = |iface: &str| {
        IptablesRule::new(
            Table::Mangle,
            "PREROUTING",
            format!(
                r#"-i {iface} -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask {mark:#x} --ctmask {mark:#x}"#
            ),
        )
    };
    if cfg.node_port_support {
        rules.push(IptablesRule::new(
            Table::Mangle,
            "PREROUTING",
            format!(
                r#"-i {} -m comment --comment "AWS, primary ENI" -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK --set-xmark {mark:#x}/{mark:#x}"#,
                cfg.primary_interface
            ),
        ));
    }
    if cfg.node_port_support || !cfg.external_snat {
        rules.push(restore(&veths));
    }
    if cfg.node_port_support {
        rules.push(restore("vlan+"));
    }
    rules
}

/// The destination match of a return rule as `iptables-save` prints it: none for `0.0.0.0/0`
/// (iptables drops a match-all `-d`, so a rule written with one would differ from what the host
/// shows and be rebuilt on every converge).
fn dst(cidr: Ipv4Net) -> String {
    if cidr.prefix_len() == 0 {
        String::new()
    } else {
        format!("-d {cidr} ")
    }
}

/// VPC then excluded CIDRs, de-duplicated, in the on-node (reversed) order.
fn cidr_returns(cfg: &SnatConfig) -> Vec<(Ipv4Net, bool)> {
    let mut out: Vec<(Ipv4Net, bool)> = Vec::new();
    let all = cfg
        .vpc_cidrs
        .iter()
        .map(|c| (c.trunc(), false))
        .chain(cfg.exclude_cidrs.iter().map(|c| (c.trunc(), true)));
    for item in all {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SnatConfig {
        SnatConfig {
            external_snat: false,
            vpc_cidrs: vec![
                "10.10.0.0/16".parse().unwrap(),
                "10.11.0.0/16".parse().unwrap(),
            ],
            exclude_cidrs: vec![
                "10.12.0.0/16".parse().unwrap(),
                "10.13.0.0/16".parse().unwrap(),
            ],
            randomization: RandomizeSnat::None,
            node_port_support: true,
            connmark: DEFAULT_CONNMARK,
            veth_prefix: "eni".into(),
            primary_ip: Ipv4Addr::new(10, 10, 10, 20),
            primary_interface: "eth0".into(),
        }
    }

    fn lines(rules: &[IptablesRule]) -> Vec<String> {
        rules.iter().map(ToString::to_string).collect()
    }

    /// Issue 39: `AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS=0.0.0.0/0`. iptables-save prints the
    /// return rule without `-d 0.0.0.0/0`; the desired rule is written the same way, so a
    /// converge over what the host shows changes nothing (before: the chain was reset on every
    /// converge).
    #[test]
    fn a_match_all_exclusion_converges_once() {
        let mut c = cfg();
        c.exclude_cidrs = vec!["0.0.0.0/0".parse().unwrap()];
        let desired = desired_rules(&c, true);
        let excl = desired
            .iter()
            .find(|r| r.spec.contains("EXCLUSION"))
            .expect("the exclusion's return rule");
        assert!(!excl.spec.contains("-d "), "{}", excl.spec);
        // What iptables-save shows once the rules are in: its `-A <chain> <spec>` lines, with
        // the match-all destination dropped as iptables prints it.
        let shown =
            |r: &IptablesRule| format!("-A {} {}\n", r.chain, r.spec.replace("-d 0.0.0.0/0 ", ""));
        let mut save = String::from("*nat\n");
        for chain in ["PREROUTING", "POSTROUTING"] {
            save.push_str(&format!(":{chain} ACCEPT [0:0]\n"));
        }
        for chain in [SNAT_CHAIN, CONNMARK_CHAIN] {
            save.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for r in desired.iter().filter(|r| r.table == Table::Nat) {
            save.push_str(&shown(r));
        }
        save.push_str("COMMIT\n*mangle\n:PREROUTING ACCEPT [0:0]\n");
        for r in desired.iter().filter(|r| r.table == Table::Mangle) {
            save.push_str(&shown(r));
        }
        save.push_str("COMMIT\n");
        let ops =
            super::super::iptables::diff(&super::super::iptables::Ruleset::parse(&save), &desired);
        assert!(ops.is_empty(), "{ops:?}");
    }

    #[test]
    fn full_layout_matches_upstream() {
        let got = lines(&desired_rules(&cfg(), true));
        let want = [
            r#"-t nat -A POSTROUTING -m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0"#,
            r#"-t nat -A AWS-SNAT-CHAIN-0 -d 10.13.0.0/16 -m comment --comment "AWS SNAT CHAIN EXCLUSION" -j RETURN"#,
            r#"-t nat -A AWS-SNAT-CHAIN-0 -d 10.12.0.0/16 -m comment --comment "AWS SNAT CHAIN EXCLUSION" -j RETURN"#,
            r#"-t nat -A AWS-SNAT-CHAIN-0 -d 10.11.0.0/16 -m comment --comment "AWS SNAT CHAIN" -j RETURN"#,
            r#"-t nat -A AWS-SNAT-CHAIN-0 -d 10.10.0.0/16 -m comment --comment "AWS SNAT CHAIN" -j RETURN"#,
            r#"-t nat -A AWS-SNAT-CHAIN-0 ! -o vlan+ -m comment --comment "AWS, SNAT" -m addrtype ! --dst-type LOCAL -j SNAT --to-source 10.10.10.20"#,
            r#"-t nat -A PREROUTING -i eni+ -m comment --comment "AWS, outbound connections" -j AWS-CONNMARK-CHAIN-0"#,
            r#"-t nat -A PREROUTING -m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
            r#"-t nat -A AWS-CONNMARK-CHAIN-0 -d 10.13.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#,
            r#"-t nat -A AWS-CONNMARK-CHAIN-0 -d 10.12.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#,
            r#"-t nat -A AWS-CONNMARK-CHAIN-0 -d 10.11.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#,
            r#"-t nat -A AWS-CONNMARK-CHAIN-0 -d 10.10.0.0/16 -m comment --comment "AWS CONNMARK CHAIN" -j RETURN"#,
            r#"-t nat -A AWS-CONNMARK-CHAIN-0 -m comment --comment "AWS, CONNMARK" -j CONNMARK --set-xmark 0x80/0x80"#,
            r#"-t mangle -A PREROUTING -i eth0 -m comment --comment "AWS, primary ENI" -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK --set-xmark 0x80/0x80"#,
            r#"-t mangle -A PREROUTING -i eni+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
            r#"-t mangle -A PREROUTING -i vlan+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"#,
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn nftables_connmark_leaves_snat_and_mangle_rules_to_iptables() {
        // upstream v1.23 network.go: buildIptablesSNATRules and the mangle rules are the same
        // on both backends; only the nat connmark (iptables_connmark.go buildRules) moves to
        // the table `ip aws-cni` (nftables_connmark.go Setup).
        let all = lines(&desired_rules(&cfg(), true));
        let nft = lines(&desired_iptables_rules(
            &cfg(),
            true,
            ConnmarkBackend::Nftables,
        ));
        let moved: Vec<&String> = all.iter().filter(|l| !nft.contains(l)).collect();
        assert_eq!(moved.len(), 7, "{moved:#?}");
        assert!(moved.iter().all(|l| l.starts_with("-t nat -A PREROUTING")
            || l.starts_with("-t nat -A AWS-CONNMARK-CHAIN-0")));
        assert!(nft.iter().all(|l| !l.contains("CONNMARK-CHAIN")));
        assert_eq!(nft.iter().filter(|l| l.starts_with("-t mangle")).count(), 3);
        assert_eq!(nft.len(), all.len() - 7);
    }

    #[test]
    fn randomization_flags() {
        let snat = |r, fully| {
            let c = SnatConfig {
                randomization: r,
                ..cfg()
            };
            desired_rules(&c, fully)
                .into_iter()
                .find(|r| r.spec.contains("-j SNAT"))
                .unwrap()
                .spec
        };
        assert!(snat(RandomizeSnat::Prng, true).ends_with("10.10.10.20 --random-fully"));
        assert!(snat(RandomizeSnat::Prng, false).ends_with("10.10.10.20 --random"));
        assert!(snat(RandomizeSnat::HashRandom, true).ends_with("10.10.10.20 --random"));
        assert!(snat(RandomizeSnat::None, true).ends_with("10.10.10.20"));
    }

    #[test]
    fn external_snat_keeps_only_nodeport_rules() {
        let c = SnatConfig {
            external_snat: true,
            ..cfg()
        };
        let rules = desired_rules(&c, true);
        assert_eq!(rules.len(), 3);
        assert!(rules.iter().all(|r| r.table == Table::Mangle));
        let c = SnatConfig {
            node_port_support: false,
            ..c
        };
        assert!(desired_rules(&c, true).is_empty());
    }

    #[test]
    fn no_nodeport_keeps_only_the_veth_restore_and_custom_mark_and_prefix_apply() {
        let c = SnatConfig {
            node_port_support: false,
            connmark: 0x4000,
            veth_prefix: "veth".into(),
            exclude_cidrs: vec![],
            ..cfg()
        };
        let got = lines(&desired_rules(&c, true));
        let mangle: Vec<_> = got.iter().filter(|l| l.starts_with("-t mangle")).collect();
        assert_eq!(
            mangle,
            [
                r#"-t mangle -A PREROUTING -i veth+ -m comment --comment "AWS, primary ENI" -j CONNMARK --restore-mark --nfmask 0x4000 --ctmask 0x4000"#
            ]
        );
        assert!(got.iter().any(|l| l.contains("-i veth+ -m comment")));
        assert!(got.iter().any(|l| l.ends_with("--set-xmark 0x4000/0x4000")));
        assert_eq!(got.iter().filter(|l| l.contains("-j RETURN")).count(), 4);
    }

    #[test]
    fn duplicate_cidrs_collapse() {
        let c = SnatConfig {
            vpc_cidrs: vec![
                "10.10.0.0/16".parse().unwrap(),
                "10.10.0.0/16".parse().unwrap(),
            ],
            exclude_cidrs: vec![],
            ..cfg()
        };
        let returns = desired_rules(&c, true)
            .into_iter()
            .filter(|r| r.chain == SNAT_CHAIN && r.spec.contains("RETURN"))
            .count();
        assert_eq!(returns, 1);
    }

    /// Which mangle PREROUTING rules exist for (NodePort support, external SNAT). Source:
    /// upstream v1.23.1 pkg/networkutils/network.go, the three "connmark ... primary ENI"
    /// rules and their `shouldExist` conditions.
    #[test]
    fn mangle_rules_exist_in_upstreams_conditions() {
        for (node_port, external, want) in [
            (
                true,
                false,
                ["eth0 set", "eni+ restore", "vlan+ restore"].as_slice(),
            ),
            (
                true,
                true,
                ["eth0 set", "eni+ restore", "vlan+ restore"].as_slice(),
            ),
            (false, false, ["eni+ restore"].as_slice()),
            (false, true, [].as_slice()),
        ] {
            let c = SnatConfig {
                node_port_support: node_port,
                external_snat: external,
                ..cfg()
            };
            let got: Vec<String> = desired_rules(&c, true)
                .iter()
                .filter(|r| r.table == Table::Mangle)
                .map(|r| {
                    let iface = r.spec.split_whitespace().nth(1).unwrap_or_default();
                    let what = if r.spec.contains("--restore-mark") {
                        "restore"
                    } else {
                        "set"
                    };
                    format!("{iface} {what}")
                })
                .collect();
            assert_eq!(got, want, "node_port={node_port} external_snat={external}");
        }
    }
}
