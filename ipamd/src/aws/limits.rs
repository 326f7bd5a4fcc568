//! Instance networking limits: a static table of common instance types (network card 0's limits,
//! and the number of network cards of the multi-card types; where the numbers come from:
//! docs/compatibility.md) and the shape the `DescribeInstanceTypes` fallback fills for types the
//! table lacks. Pure data; no I/O.

/// Networking limits of one instance type, as the table or `DescribeInstanceTypes` give them
/// (hypervisor facts included). The pool sees the derived `pool::ec2_port::InstanceLimits`
/// (prefix delegation decided), built from this by the EC2 provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceTypeLimits {
    /// Maximum ENIs attached at once (the default card's; the same limit applies to every card).
    pub max_enis: u32,
    /// IPv4 addresses per ENI, the ENI's primary address included.
    pub ipv4_per_eni: u32,
    /// Nitro hypervisor (prefix delegation is supported on Nitro and bare metal).
    pub nitro: bool,
    pub bare_metal: bool,
    /// Network cards (1 for most types).
    #[serde(default = "one_card")]
    pub network_cards: u32,
}

fn one_card() -> u32 {
    1
}

impl InstanceTypeLimits {
    /// Secondary /32 slots per ENI (the primary address is not for pods).
    pub fn secondary_ips_per_eni(&self) -> u32 {
        self.ipv4_per_eni.saturating_sub(1)
    }

    /// /28 prefixes per ENI: one per secondary slot.
    pub fn prefixes_per_eni(&self) -> u32 {
        self.secondary_ips_per_eni()
    }

    /// Whether `/28` prefix delegation works on this type.
    pub fn supports_prefix_delegation(&self) -> bool {
        self.nitro || self.bare_metal
    }

    /// The eni-max-pods formula: ENIs × (IPv4 per ENI − 1) + 2.
    pub fn max_pods(&self) -> u32 {
        self.max_enis * self.secondary_ips_per_eni() + 2
    }
}

const N: bool = true; // nitro
const X: bool = false; // xen / unknown

/// (type, ENIs, IPv4 per ENI, nitro, bare metal)
const TABLE: &[(&str, u32, u32, bool, bool)] = &[
    ("a1.medium", 2, 4, N, false),
    ("a1.large", 3, 10, N, false),
    ("a1.xlarge", 4, 15, N, false),
    ("a1.2xlarge", 4, 15, N, false),
    ("a1.4xlarge", 8, 30, N, false),
    ("a1.metal", 8, 30, X, true),
    ("c4.large", 3, 10, X, false),
    ("c4.xlarge", 4, 15, X, false),
    ("c4.2xlarge", 4, 15, X, false),
    ("c4.4xlarge", 8, 30, X, false),
    ("c4.8xlarge", 8, 30, X, false),
    ("c5.large", 3, 10, N, false),
    ("c5.xlarge", 4, 15, N, false),
    ("c5.2xlarge", 4, 15, N, false),
    ("c5.4xlarge", 8, 30, N, false),
    ("c5.9xlarge", 8, 30, N, false),
    ("c5.12xlarge", 8, 30, N, false),
    ("c5.18xlarge", 15, 50, N, false),
    ("c5.24xlarge", 15, 50, N, false),
    ("c5.metal", 15, 50, X, true),
    ("c5a.large", 3, 10, N, false),
    ("c5a.xlarge", 4, 15, N, false),
    ("c5a.2xlarge", 4, 15, N, false),
    ("c5a.4xlarge", 8, 30, N, false),
    ("c5a.8xlarge", 8, 30, N, false),
    ("c5a.12xlarge", 8, 30, N, false),
    ("c5a.16xlarge", 15, 50, N, false),
    ("c5a.24xlarge", 15, 50, N, false),
    ("c5d.large", 3, 10, N, false),
    ("c5d.xlarge", 4, 15, N, false),
    ("c5d.2xlarge", 4, 15, N, false),
    ("c5d.4xlarge", 8, 30, N, false),
    ("c5d.9xlarge", 8, 30, N, false),
    ("c5d.12xlarge", 8, 30, N, false),
    ("c5d.18xlarge", 15, 50, N, false),
    ("c5d.24xlarge", 15, 50, N, false),
    ("m4.large", 2, 10, X, false),
    ("m4.xlarge", 4, 15, X, false),
    ("m4.2xlarge", 4, 15, X, false),
    ("m4.4xlarge", 8, 30, X, false),
    ("m4.10xlarge", 8, 30, X, false),
    ("m4.16xlarge", 8, 30, X, false),
    ("m5.large", 3, 10, N, false),
    ("m5.xlarge", 4, 15, N, false),
    ("m5.2xlarge", 4, 15, N, false),
    ("m5.4xlarge", 8, 30, N, false),
    ("m5.8xlarge", 8, 30, N, false),
    ("m5.12xlarge", 8, 30, N, false),
    ("m5.16xlarge", 15, 50, N, false),
    ("m5.24xlarge", 15, 50, N, false),
    ("m5.metal", 15, 50, X, true),
    ("m5a.large", 3, 10, N, false),
    ("m5a.xlarge", 4, 15, N, false),
    ("m5a.2xlarge", 4, 15, N, false),
    ("m5a.4xlarge", 8, 30, N, false),
    ("m5a.8xlarge", 8, 30, N, false),
    ("m5a.12xlarge", 8, 30, N, false),
    ("m5a.16xlarge", 15, 50, N, false),
    ("m5a.24xlarge", 15, 50, N, false),
    ("m5d.large", 3, 10, N, false),
    ("m5d.xlarge", 4, 15, N, false),
    ("m5d.2xlarge", 4, 15, N, false),
    ("m5d.4xlarge", 8, 30, N, false),
    ("m5d.8xlarge", 8, 30, N, false),
    ("m5d.12xlarge", 8, 30, N, false),
    ("m5d.16xlarge", 15, 50, N, false),
    ("m5d.24xlarge", 15, 50, N, false),
    ("m5d.metal", 15, 50, X, true),
    ("m5n.large", 3, 10, N, false),
    ("m5n.xlarge", 4, 15, N, false),
    ("m5n.2xlarge", 4, 15, N, false),
    ("m5n.4xlarge", 8, 30, N, false),
    ("m5n.8xlarge", 8, 30, N, false),
    ("m5n.12xlarge", 8, 30, N, false),
    ("m5n.16xlarge", 15, 50, N, false),
    ("m5n.24xlarge", 15, 50, N, false),
    ("m6a.large", 3, 10, N, false),
    ("m6a.xlarge", 4, 15, N, false),
    ("m6a.2xlarge", 4, 15, N, false),
    ("m6a.4xlarge", 8, 30, N, false),
    ("m6a.8xlarge", 8, 30, N, false),
    ("m6a.12xlarge", 8, 30, N, false),
    ("m6a.16xlarge", 15, 50, N, false),
    ("m6a.24xlarge", 15, 50, N, false),
    ("m6a.32xlarge", 15, 50, N, false),
    ("m6a.48xlarge", 15, 50, N, false),
    ("m6a.metal", 15, 50, X, true),
    ("m6g.medium", 2, 4, N, false),
    ("m6g.large", 3, 10, N, false),
    ("m6g.xlarge", 4, 15, N, false),
    ("m6g.2xlarge", 4, 15, N, false),
    ("m6g.4xlarge", 8, 30, N, false),
    ("m6g.8xlarge", 8, 30, N, false),
    ("m6g.12xlarge", 8, 30, N, false),
    ("m6g.16xlarge", 15, 50, N, false),
    ("m6g.metal", 15, 50, X, true),
    ("m6in.large", 3, 10, N, false),
    ("m6in.xlarge", 4, 15, N, false),
    ("m6in.2xlarge", 4, 15, N, false),
    ("m6in.4xlarge", 8, 30, N, false),
    ("m6in.8xlarge", 8, 30, N, false),
    ("m6in.12xlarge", 8, 30, N, false),
    ("m6in.16xlarge", 15, 50, N, false),
    ("m6in.24xlarge", 15, 50, N, false),
    ("m6in.32xlarge", 8, 50, N, false),
    ("m7a.medium", 2, 4, N, false),
    ("m7a.large", 3, 10, N, false),
    ("m7a.xlarge", 4, 15, N, false),
    ("m7a.2xlarge", 4, 15, N, false),
    ("m7a.4xlarge", 8, 30, N, false),
    ("m7a.8xlarge", 8, 30, N, false),
    ("m7a.12xlarge", 8, 30, N, false),
    ("m7a.16xlarge", 15, 50, N, false),
    ("m7a.24xlarge", 15, 50, N, false),
    ("m7a.32xlarge", 15, 50, N, false),
    ("m7a.48xlarge", 15, 50, N, false),
    ("m7g.medium", 2, 4, N, false),
    ("m7g.large", 3, 10, N, false),
    ("m7g.xlarge", 4, 15, N, false),
    ("m7g.2xlarge", 4, 15, N, false),
    ("m7g.4xlarge", 8, 30, N, false),
    ("m7g.8xlarge", 8, 30, N, false),
    ("m7g.12xlarge", 8, 30, N, false),
    ("m7g.16xlarge", 15, 50, N, false),
    ("m7g.metal", 15, 50, X, true),
    ("r8i.large", 3, 20, N, false),
    ("r8i.xlarge", 4, 30, N, false),
    ("r8i.2xlarge", 4, 30, N, false),
    ("r8i.4xlarge", 8, 50, N, false),
    ("r8i.8xlarge", 10, 50, N, false),
    ("r8i.12xlarge", 12, 50, N, false),
    ("r8i.16xlarge", 16, 64, N, false),
    ("r8i.24xlarge", 16, 64, N, false),
    ("r8i.32xlarge", 24, 64, N, false),
    ("r8i.48xlarge", 24, 64, N, false),
    ("r8i.96xlarge", 24, 64, N, false),
    ("t1.micro", 2, 2, X, false),
    ("t2.nano", 2, 2, X, false),
    ("t2.micro", 2, 2, X, false),
    ("t2.small", 3, 4, X, false),
    ("t2.medium", 3, 6, X, false),
    ("t2.large", 3, 12, X, false),
    ("t2.xlarge", 3, 15, X, false),
    ("t2.2xlarge", 3, 15, X, false),
    ("t3.nano", 2, 2, N, false),
    ("t3.micro", 2, 2, N, false),
    ("t3.small", 3, 4, N, false),
    ("t3.medium", 3, 6, N, false),
    ("t3.large", 3, 12, N, false),
    ("t3.xlarge", 4, 15, N, false),
    ("t3.2xlarge", 4, 15, N, false),
    ("t3a.nano", 2, 2, N, false),
    ("t3a.micro", 2, 2, N, false),
    ("t3a.small", 2, 4, N, false),
    ("t3a.medium", 3, 6, N, false),
    ("t3a.large", 3, 12, N, false),
    ("t3a.xlarge", 4, 15, N, false),
    ("t3a.2xlarge", 4, 15, N, false),
    ("t4g.nano", 2, 2, N, false),
    ("t4g.micro", 2, 2, N, false),
    ("t4g.small", 3, 4, N, false),
    ("t4g.medium", 3, 6, N, false),
    ("t4g.large", 3, 12, N, false),
    ("t4g.xlarge", 4, 15, N, false),
    ("t4g.2xlarge", 4, 15, N, false),
    ("trn1.2xlarge", 4, 15, N, false),
    ("trn1.32xlarge", 5, 50, N, false),
    ("c6in.32xlarge", 8, 50, N, false),
    ("m6idn.32xlarge", 8, 50, N, false),
    ("p5.48xlarge", 2, 50, N, false),
];

/// Types with more than one network card: (type, network cards) (each card takes the type's
/// `max_enis` ENIs).
const MULTI_CARD: &[(&str, u32)] = &[
    ("c6in.32xlarge", 2),
    ("m6idn.32xlarge", 2),
    ("p5.48xlarge", 32),
    ("trn1.32xlarge", 8),
];

/// Limits of `instance_type` from the static table, or `None` (then ask
/// `DescribeInstanceTypes`).
pub fn lookup(instance_type: &str) -> Option<InstanceTypeLimits> {
    TABLE.iter().find(|(name, ..)| *name == instance_type).map(
        |&(name, max_enis, ipv4_per_eni, nitro, bare_metal)| InstanceTypeLimits {
            max_enis,
            ipv4_per_eni,
            nitro,
            bare_metal,
            network_cards: MULTI_CARD
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(1, |(_, cards)| *cards),
        },
    )
}

/// Branch ENIs per trunk of the table's trunking-compatible types (security groups for pods), from
/// the VPC Resource Controller's `pkg/aws/vpc/limits.go` (`IsTrunkingCompatible`,
/// `BranchInterface`). A type of [`TABLE`] absent here is not trunking compatible.
const TRUNKING: &[(&str, u32)] = &[
    ("a1.medium", 10),
    ("a1.large", 9),
    ("a1.xlarge", 18),
    ("a1.2xlarge", 38),
    ("a1.4xlarge", 54),
    ("a1.metal", 54),
    ("c5.large", 9),
    ("c5.xlarge", 18),
    ("c5.2xlarge", 38),
    ("c5.4xlarge", 54),
    ("c5.9xlarge", 54),
    ("c5.12xlarge", 54),
    ("c5.18xlarge", 107),
    ("c5.24xlarge", 107),
    ("c5.metal", 107),
    ("c5a.large", 9),
    ("c5a.xlarge", 18),
    ("c5a.2xlarge", 38),
    ("c5a.4xlarge", 54),
    ("c5a.8xlarge", 54),
    ("c5a.12xlarge", 54),
    ("c5a.16xlarge", 107),
    ("c5a.24xlarge", 107),
    ("c5d.large", 9),
    ("c5d.xlarge", 18),
    ("c5d.2xlarge", 38),
    ("c5d.4xlarge", 54),
    ("c5d.9xlarge", 54),
    ("c5d.12xlarge", 54),
    ("c5d.18xlarge", 107),
    ("c5d.24xlarge", 107),
    ("m5.large", 9),
    ("m5.xlarge", 18),
    ("m5.2xlarge", 38),
    ("m5.4xlarge", 54),
    ("m5.8xlarge", 54),
    ("m5.12xlarge", 54),
    ("m5.16xlarge", 107),
    ("m5.24xlarge", 107),
    ("m5.metal", 120),
    ("m5a.large", 9),
    ("m5a.xlarge", 18),
    ("m5a.2xlarge", 38),
    ("m5a.4xlarge", 54),
    ("m5a.8xlarge", 54),
    ("m5a.12xlarge", 54),
    ("m5a.16xlarge", 107),
    ("m5a.24xlarge", 107),
    ("m5d.large", 9),
    ("m5d.xlarge", 18),
    ("m5d.2xlarge", 38),
    ("m5d.4xlarge", 54),
    ("m5d.8xlarge", 54),
    ("m5d.12xlarge", 54),
    ("m5d.16xlarge", 107),
    ("m5d.24xlarge", 107),
    ("m5d.metal", 107),
    ("m5n.large", 9),
    ("m5n.xlarge", 18),
    ("m5n.2xlarge", 38),
    ("m5n.4xlarge", 54),
    ("m5n.8xlarge", 54),
    ("m5n.12xlarge", 54),
    ("m5n.16xlarge", 107),
    ("m5n.24xlarge", 107),
    ("m6a.large", 9),
    ("m6a.xlarge", 18),
    ("m6a.2xlarge", 38),
    ("m6a.4xlarge", 54),
    ("m6a.8xlarge", 84),
    ("m6a.12xlarge", 114),
    ("m6a.16xlarge", 107),
    ("m6a.24xlarge", 107),
    ("m6a.32xlarge", 107),
    ("m6a.48xlarge", 107),
    ("m6a.metal", 107),
    ("m6g.medium", 4),
    ("m6g.large", 9),
    ("m6g.xlarge", 18),
    ("m6g.2xlarge", 38),
    ("m6g.4xlarge", 54),
    ("m6g.8xlarge", 54),
    ("m6g.12xlarge", 54),
    ("m6g.16xlarge", 107),
    ("m6g.metal", 107),
    ("m6in.large", 9),
    ("m6in.xlarge", 18),
    ("m6in.2xlarge", 38),
    ("m6in.4xlarge", 54),
    ("m6in.8xlarge", 84),
    ("m6in.12xlarge", 114),
    ("m6in.16xlarge", 107),
    ("m6in.24xlarge", 107),
    ("m6in.32xlarge", 106),
    ("m7a.medium", 4),
    ("m7a.large", 9),
    ("m7a.xlarge", 18),
    ("m7a.2xlarge", 38),
    ("m7a.4xlarge", 54),
    ("m7a.8xlarge", 84),
    ("m7a.12xlarge", 114),
    ("m7a.16xlarge", 107),
    ("m7a.24xlarge", 107),
    ("m7a.32xlarge", 107),
    ("m7a.48xlarge", 107),
    ("m7g.medium", 4),
    ("m7g.large", 9),
    ("m7g.xlarge", 18),
    ("m7g.2xlarge", 38),
    ("m7g.4xlarge", 54),
    ("m7g.8xlarge", 54),
    ("m7g.12xlarge", 54),
    ("m7g.16xlarge", 107),
    ("m7g.metal", 107),
    ("r8i.large", 9),
    ("r8i.xlarge", 18),
    ("r8i.2xlarge", 38),
    ("r8i.4xlarge", 54),
    ("r8i.8xlarge", 82),
    ("r8i.12xlarge", 110),
    ("r8i.16xlarge", 106),
    ("r8i.24xlarge", 106),
    ("r8i.32xlarge", 98),
    ("r8i.48xlarge", 98),
    ("r8i.96xlarge", 98),
    ("trn1.2xlarge", 17),
    ("trn1.32xlarge", 82),
];

/// True for a trunking type, and for a type the table does not know (the controller decides for
/// those).
#[must_use]
pub fn is_trunking_compatible(instance_type: &str) -> bool {
    lookup(instance_type).is_none() || branch_interfaces(instance_type).is_some()
}

/// Branch ENIs a trunk on `instance_type` may carry, when the table knows the type as
/// trunking compatible.
#[must_use]
pub fn branch_interfaces(instance_type: &str) -> Option<u32> {
    TRUNKING
        .iter()
        .find(|(name, _)| *name == instance_type)
        .map(|&(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_pods_matches_upstream_eni_max_pods() {
        // misc/eni-max-pods.txt values quoted in the reference (§4)
        for (ty, pods) in [
            ("t3.micro", 4),
            ("t3.small", 11),
            ("t3.medium", 17),
            ("t3.large", 35),
            ("m5.large", 29),
            ("m5.xlarge", 58),
            ("m5.4xlarge", 234),
            ("c5.4xlarge", 234),
            ("m4.4xlarge", 234),
            ("m5.24xlarge", 737),
            ("m5.metal", 737),
            ("trn1.32xlarge", 247),
        ] {
            assert_eq!(lookup(ty).map(|l| l.max_pods()), Some(pods), "{ty}");
        }
    }

    #[test]
    fn prefix_delegation_capacity_of_m5_large() {
        let l = lookup("m5.large").unwrap();
        assert_eq!(l.max_enis * l.prefixes_per_eni() * 16, 432);
        assert!(l.supports_prefix_delegation());
        assert!(!lookup("m4.large").unwrap().supports_prefix_delegation());
    }

    /// Upstream `vpc_ip_resource_limit.go`: `ENILimit`, `IPv4Limit` and the number of
    /// `NetworkCards` of the multi-card types.
    #[test]
    fn multi_card_types_as_upstreams_table() {
        for (ty, enis, ips, cards) in [
            ("c6in.32xlarge", 8, 50, 2),
            ("m6idn.32xlarge", 8, 50, 2),
            ("trn1.32xlarge", 5, 50, 8),
            ("p5.48xlarge", 2, 50, 32),
            ("m5.large", 3, 10, 1),
        ] {
            let l = lookup(ty).unwrap();
            assert_eq!(
                (l.max_enis, l.ipv4_per_eni, l.network_cards),
                (enis, ips, cards),
                "{ty}"
            );
        }
    }

    #[test]
    fn table_has_no_duplicates() {
        let mut names: Vec<_> = TABLE.iter().map(|t| t.0).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
    }

    #[test]
    fn trunking_limits_of_known_types() {
        assert_eq!(branch_interfaces("m5.large"), Some(9));
        assert_eq!(branch_interfaces("m5.metal"), Some(120));
        assert!(is_trunking_compatible("c5.xlarge"));
        assert!(!is_trunking_compatible("t3.medium"));
        assert!(!is_trunking_compatible("m4.large"));
        // Upstream: a type it does not know is taken as compatible.
        assert!(is_trunking_compatible("x99.unknown"));
        for (t, _) in TRUNKING {
            assert!(lookup(t).is_some(), "{t}");
        }
    }
}
