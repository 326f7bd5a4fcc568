//! Per-instance-type networking limits (ENIs per instance, IPv4/IPv6 addresses per ENI),
//! numbers as published by EC2 and recorded in upstream's `pkg/vpc/vpc_ip_resource_limit.go`.
//! Owns the table only; it must not enforce anything itself.

use serde::Serialize;

/// Networking limits of one instance type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InstanceLimits {
    /// Instance type name, e.g. `m5.large`.
    pub instance_type: &'static str,
    /// Maximum ENIs attached at once on each network card (upstream's `ENILimit`, the default
    /// card's `MaximumNetworkInterfaces`; every card of the multi-card types here has the same).
    pub max_enis: u32,
    /// Network cards (upstream's `NetworkCards`, indexes `0..network_cards`); 1 for most types.
    pub network_cards: u32,
    /// IPv4 addresses per ENI, primary included; each /28 prefix takes one of these slots.
    pub ipv4_per_eni: u32,
    /// IPv6 addresses per ENI; each /80 prefix takes one slot.
    pub ipv6_per_eni: u32,
    /// `nitro`, `xen`, or `None` for bare metal (EC2 reports no hypervisor there).
    pub hypervisor: Option<&'static str>,
    /// Bare-metal instance.
    pub bare_metal: bool,
    /// vCPUs (informational, for `DescribeInstanceTypes`).
    pub vcpus: u32,
}

impl InstanceLimits {
    /// Whether the type supports prefix delegation (Nitro or bare metal).
    pub fn supports_prefixes(&self) -> bool {
        self.bare_metal || self.hypervisor == Some("nitro")
    }
}

const fn nitro(
    instance_type: &'static str,
    max_enis: u32,
    ipv4: u32,
    vcpus: u32,
) -> InstanceLimits {
    InstanceLimits {
        instance_type,
        max_enis,
        ipv4_per_eni: ipv4,
        ipv6_per_eni: ipv4,
        hypervisor: Some("nitro"),
        bare_metal: false,
        network_cards: 1,
        vcpus,
    }
}

/// A Nitro type with several network cards, each taking `max_enis` ENIs (upstream
/// `vpc_ip_resource_limit.go`: `NetworkCards`, one entry per card).
const fn multi_card(
    instance_type: &'static str,
    max_enis: u32,
    ipv4: u32,
    network_cards: u32,
    vcpus: u32,
) -> InstanceLimits {
    InstanceLimits {
        network_cards,
        ..nitro(instance_type, max_enis, ipv4, vcpus)
    }
}

const fn metal(
    instance_type: &'static str,
    max_enis: u32,
    ipv4: u32,
    vcpus: u32,
) -> InstanceLimits {
    InstanceLimits {
        instance_type,
        max_enis,
        ipv4_per_eni: ipv4,
        ipv6_per_eni: ipv4,
        hypervisor: None,
        bare_metal: true,
        network_cards: 1,
        vcpus,
    }
}

/// The instance types the simulator knows, sorted by name.
pub const INSTANCE_TYPES: &[InstanceLimits] = &[
    nitro("c5.large", 3, 10, 2),
    nitro("c5.xlarge", 4, 15, 4),
    nitro("c5n.18xlarge", 15, 50, 72),
    multi_card("c6in.32xlarge", 8, 50, 2, 128),
    InstanceLimits {
        instance_type: "m4.large",
        max_enis: 2,
        ipv4_per_eni: 10,
        ipv6_per_eni: 10,
        hypervisor: Some("xen"),
        bare_metal: false,
        network_cards: 1,
        vcpus: 2,
    },
    nitro("m5.24xlarge", 15, 50, 96),
    nitro("m5.2xlarge", 4, 15, 8),
    nitro("m5.4xlarge", 8, 30, 16),
    nitro("m5.large", 3, 10, 2),
    metal("m5.metal", 15, 50, 96),
    nitro("m5.xlarge", 4, 15, 4),
    nitro("m6i.large", 3, 10, 2),
    multi_card("m6idn.32xlarge", 8, 50, 2, 128),
    multi_card("p5.48xlarge", 2, 50, 32, 192),
    nitro("t3.large", 3, 12, 2),
    nitro("t3.medium", 3, 6, 2),
    nitro("t3.micro", 2, 2, 2),
    nitro("t3.small", 3, 4, 2),
    multi_card("trn1.32xlarge", 5, 50, 8, 128),
];

/// Limits for `instance_type`, if the simulator knows it.
pub fn lookup(instance_type: &str) -> Option<&'static InstanceLimits> {
    INSTANCE_TYPES
        .iter()
        .find(|l| l.instance_type == instance_type)
}

/// Branch ENIs per trunk of the trunking-capable types (security groups for pods), as the VPC
/// Resource Controller's `pkg/aws/vpc/limits.go` records them (`IsTrunkingCompatible`,
/// `BranchInterface`); a type absent here cannot take a trunk ENI.
pub const BRANCH_INTERFACES: &[(&str, u32)] = &[
    ("c5.large", 9),
    ("c5.xlarge", 18),
    ("c5n.18xlarge", 107),
    ("m5.24xlarge", 107),
    ("m5.2xlarge", 38),
    ("m5.4xlarge", 54),
    ("m5.large", 9),
    ("m5.metal", 120),
    ("m5.xlarge", 18),
    ("m6i.large", 9),
];

/// Branch ENIs a trunk on `instance_type` may carry; None when the type is not trunking
/// compatible (or unknown).
pub fn branch_interfaces(instance_type: &str) -> Option<u32> {
    BRANCH_INTERFACES
        .iter()
        .find(|(t, _)| *t == instance_type)
        .map(|(_, n)| *n)
}

/// The largest IPv4-per-ENI limit of any type: what an unattached ENI may hold.
pub fn max_ipv4_per_eni() -> u32 {
    INSTANCE_TYPES
        .iter()
        .map(|l| l.ipv4_per_eni)
        .max()
        .unwrap_or(50)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_table_numbers() {
        let expect = [
            ("t3.medium", 3, 6),
            ("m5.large", 3, 10),
            ("m5.xlarge", 4, 15),
            ("m5.4xlarge", 8, 30),
            ("c5n.18xlarge", 15, 50),
            ("m5.metal", 15, 50),
        ];
        for (name, enis, ips) in expect {
            let l = lookup(name).unwrap();
            assert_eq!((l.max_enis, l.ipv4_per_eni), (enis, ips), "{name}");
        }
        assert!(lookup("m5.metal").unwrap().supports_prefixes());
        assert!(!lookup("m4.large").unwrap().supports_prefixes());
        assert!(lookup("x9.huge").is_none());
    }

    /// Upstream `pkg/vpc/vpc_ip_resource_limit.go`: `NetworkCards` of the multi-card types
    /// (count, `MaximumNetworkInterfaces` of each card = `ENILimit`).
    #[test]
    fn multi_card_types_as_upstreams_table() {
        for (name, cards, enis) in [
            ("c6in.32xlarge", 2, 8),
            ("m6idn.32xlarge", 2, 8),
            ("trn1.32xlarge", 8, 5),
            ("p5.48xlarge", 32, 2),
            ("m5.large", 1, 3),
        ] {
            let l = lookup(name).unwrap();
            assert_eq!((l.network_cards, l.max_enis), (cards, enis), "{name}");
        }
        let mut names: Vec<_> = INSTANCE_TYPES.iter().map(|l| l.instance_type).collect();
        let sorted = names.clone();
        names.sort_unstable();
        assert_eq!(names, sorted, "INSTANCE_TYPES stays sorted by name");
    }

    #[test]
    fn max_pods_formula_matches_upstream() {
        // eni-max-pods.txt: enis * (ips - 1) + 2
        let pods = |n: &str| {
            let l = lookup(n).unwrap();
            l.max_enis * (l.ipv4_per_eni - 1) + 2
        };
        assert_eq!(pods("m5.large"), 29);
        assert_eq!(pods("t3.medium"), 17);
        assert_eq!(pods("m5.4xlarge"), 234);
        assert_eq!(pods("m5.metal"), 737);
    }

    #[test]
    fn branch_limits_name_known_types_only() {
        for (t, n) in BRANCH_INTERFACES {
            assert!(lookup(t).is_some(), "{t} not in the table");
            assert!(*n > 0);
        }
        assert_eq!(branch_interfaces("m5.large"), Some(9));
        assert_eq!(branch_interfaces("t3.medium"), None);
        assert_eq!(branch_interfaces("m4.large"), None);
    }
}
