//! The SNAT section: source NAT for traffic leaving the VPC, its port randomisation, the
//! connmark that brings replies back, node-port support and the CIDRs exempt from SNAT
//! (`AWS_VPC_K8S_CNI_EXTERNALSNAT`, `..._EXCLUDE_SNAT_CIDRS`, `..._RANDOMIZESNAT`,
//! `..._CONNMARK`, `AWS_VPC_CNI_NODE_PORT_SUPPORT`, `AWS_EXTERNAL_SERVICE_CIDRS`). Must not:
//! build rules (that is `host::snat`'s), do I/O.

use ipnet::Ipv4Net;

use super::env::{Env, parse_go_int_base0, v4_cidrs};

/// The default connmark (`AWS_VPC_K8S_CNI_CONNMARK`).
pub const DEFAULT_CONNMARK: u32 = 0x80;

/// `AWS_VPC_K8S_CNI_RANDOMIZESNAT`: port randomisation of the SNAT rule. The one enum for it
/// (`host::snat` uses it). The integer values (sequential 0, hash random 1, prng 2) are what
/// `/v1/networkutils-env-settings` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RandomizeSnat {
    /// `none`: no flag.
    None = 0,
    /// `hashrandom`: `--random`.
    HashRandom = 1,
    /// `prng` (default): `--random-fully`, or `--random` when iptables is older than 1.6.2.
    #[default]
    Prng = 2,
}

/// How pod traffic is SNATed and marked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnatSection {
    /// `AWS_VPC_K8S_CNI_EXTERNALSNAT` (false).
    pub external_snat: bool,
    /// `AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS` (IPv4 entries; IPv6 entries skipped).
    pub exclude_snat_cidrs: Vec<Ipv4Net>,
    /// `AWS_VPC_K8S_CNI_RANDOMIZESNAT` (prng).
    pub randomize_snat: RandomizeSnat,
    /// `AWS_VPC_CNI_NODE_PORT_SUPPORT` (true).
    pub node_port_support: bool,
    /// `AWS_VPC_K8S_CNI_CONNMARK` (0x80).
    pub connmark: u32,
    /// `AWS_EXTERNAL_SERVICE_CIDRS`.
    pub external_service_cidrs: Vec<Ipv4Net>,
}

impl SnatSection {
    /// Reads the section. Nothing here is refused: every bad value has a fallback.
    pub(super) fn parse(e: &mut Env<'_>) -> Self {
        // An unknown value logs and uses prng.
        let randomize_snat = match e.get("AWS_VPC_K8S_CNI_RANDOMIZESNAT") {
            None | Some("prng") => RandomizeSnat::Prng,
            Some("hashrandom") => RandomizeSnat::HashRandom,
            Some("none") => RandomizeSnat::None,
            Some(v) => {
                let v = v.to_owned();
                e.fallback("AWS_VPC_K8S_CNI_RANDOMIZESNAT", &v, "prng (--random-fully)");
                RandomizeSnat::Prng
            }
        };
        // ParseInt(s, 0, 64); unparsable, <= 0 or > u32 gives 0x80. A mark of 0 would turn rule
        // 1024 into `fwmark 0/0 lookup main`, which matches all traffic.
        let connmark = match e.get("AWS_VPC_K8S_CNI_CONNMARK") {
            None => DEFAULT_CONNMARK,
            Some(v) => match parse_go_int_base0(v).and_then(|m| u32::try_from(m).ok()) {
                Some(m) if m > 0 => m,
                _ => {
                    let v = v.to_owned();
                    e.fallback("AWS_VPC_K8S_CNI_CONNMARK", &v, "the default mark 0x80");
                    DEFAULT_CONNMARK
                }
            },
        };
        Self {
            external_snat: e.bool("AWS_VPC_K8S_CNI_EXTERNALSNAT", false),
            exclude_snat_cidrs: v4_cidrs(e, "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS"),
            randomize_snat,
            node_port_support: e.bool("AWS_VPC_CNI_NODE_PORT_SUPPORT", true),
            connmark,
            external_service_cidrs: v4_cidrs(e, "AWS_EXTERNAL_SERVICE_CIDRS"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::env::{test_env, with_warnings};
    use super::*;

    #[test]
    fn defaults_are_upstreams() {
        let s = test_env(&[], SnatSection::parse);
        assert!(!s.external_snat && s.node_port_support);
        assert_eq!(s.randomize_snat, RandomizeSnat::Prng);
        assert_eq!(s.connmark, 0x80);
        assert!(s.exclude_snat_cidrs.is_empty() && s.external_service_cidrs.is_empty());
    }

    /// `/v1/networkutils-env-settings` shows the SNAT mode as upstream's `snatType` integer
    /// (network.go: sequentialSNAT, randomHashSNAT, randomPRNGSNAT).
    #[test]
    fn randomization_values_and_integers() {
        for (val, want, int) in [
            ("none", RandomizeSnat::None, 0),
            ("hashrandom", RandomizeSnat::HashRandom, 1),
            ("prng", RandomizeSnat::Prng, 2),
        ] {
            let s = test_env(
                &[("AWS_VPC_K8S_CNI_RANDOMIZESNAT", val)],
                SnatSection::parse,
            );
            assert_eq!((s.randomize_snat, s.randomize_snat as i32), (want, int));
        }
        let (s, w) = with_warnings(
            &[("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "Prng")],
            SnatSection::parse,
        );
        assert_eq!(s.randomize_snat, RandomizeSnat::Prng);
        assert_eq!(w.len(), 1, "upstream compares case-sensitively: {w:?}");
    }

    #[test]
    fn cidr_lists_keep_ipv4_and_clear_host_bits() {
        let (s, w) = with_warnings(
            &[
                (
                    "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS",
                    "10.0.0.1/8, fd00::/8,192.168.0.0/16",
                ),
                ("AWS_EXTERNAL_SERVICE_CIDRS", "203.0.113.0/24,nope"),
            ],
            SnatSection::parse,
        );
        assert_eq!(
            s.exclude_snat_cidrs,
            vec![
                "10.0.0.0/8".parse::<Ipv4Net>().unwrap(),
                "192.168.0.0/16".parse().unwrap()
            ]
        );
        assert_eq!(s.external_service_cidrs.len(), 1);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].var, "AWS_EXTERNAL_SERVICE_CIDRS");
    }
}
