//! PURE: what `egress-cni` programs for one pod given its configuration and the address host-local
//! handed out: the family, interface names, the pod's and the host's addresses and routes, the SNAT
//! chain name, comment and rules. Why: names, chains and comments are the ones existing egress pods
//! carry, so a DEL after a CNI change still finds them. Must not: touch the kernel, run programs,
//! read the environment.

use std::net::IpAddr;

use dataplane::conventions::MAIN_TABLE;
use dataplane::{Route, Scope};
use ipnet::IpNet;
use sha2::{Digest, Sha512};

/// The pod's IPv4 egress interface in an IPv6 cluster.
pub const V4_EGRESS_IFNAME: &str = "v4if0";
/// The pod's IPv6 egress interface in an IPv4 cluster.
pub const V6_EGRESS_IFNAME: &str = "v6if0";

/// containernetworking/plugins `utils.MustFormatChainNameWithPrefix`: at most 28 characters.
const MAX_CHAIN_LENGTH: usize = 28;

/// Which egress the node IP selects (a node IP that is not IPv4 means IPv6 egress).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressKind {
    /// IPv4 egress for IPv6 pods (IPv6 cluster), SNAT to the node's primary IPv4.
    V4,
    /// IPv6 egress for IPv4 pods (IPv4 cluster with `ENABLE_V6_EGRESS`), SNAT to the node
    /// IPv6.
    V6,
}

/// Why no egress can be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressPlanError {
    /// IPv6 egress (or an empty `nodeIP`) without a global unicast node IPv6.
    #[error(
        "global unicast IPv6 not found in host primary interface which is mandatory to support IPv6 egress"
    )]
    NoGlobalNodeIpv6,
    /// host-local's answer has no address, several, or one of the wrong family.
    #[error(
        "IPAM plugin is expected to return 1 IP address of the egress family, but returned {0}"
    )]
    IpamAddresses(String),
}

impl EgressKind {
    /// The choice from `nodeIP` (empty: IPv6, then refused).
    pub fn for_node_ip(node_ip: Option<IpAddr>) -> Result<Self, EgressPlanError> {
        match node_ip {
            Some(IpAddr::V4(_)) => Ok(Self::V4),
            Some(IpAddr::V6(ip)) if is_global_unicast_v6(ip) => Ok(Self::V6),
            _ => Err(EgressPlanError::NoGlobalNodeIpv6),
        }
    }

    /// The pod's egress interface.
    #[must_use]
    pub fn ifname(self) -> &'static str {
        match self {
            Self::V4 => V4_EGRESS_IFNAME,
            Self::V6 => V6_EGRESS_IFNAME,
        }
    }

    /// Multicast range the chain lets through un-NATed.
    #[must_use]
    pub fn multicast(self) -> &'static str {
        match self {
            Self::V4 => "224.0.0.0/4",
            Self::V6 => "ff00::/8",
        }
    }

    /// `iptables` or `ip6tables`.
    #[must_use]
    pub fn iptables(self) -> &'static str {
        match self {
            Self::V4 => "iptables",
            Self::V6 => "ip6tables",
        }
    }

    fn chain_prefix(self) -> &'static str {
        match self {
            Self::V4 => "E4-",
            Self::V6 => "E6-",
        }
    }

    fn matches(self, ip: IpAddr) -> bool {
        matches!(
            (self, ip),
            (Self::V4, IpAddr::V4(_)) | (Self::V6, IpAddr::V6(_))
        )
    }
}

/// Go's `net.IP.IsGlobalUnicast` for IPv6: not unspecified, loopback, multicast or link-local.
fn is_global_unicast_v6(ip: std::net::Ipv6Addr) -> bool {
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (ip.segments()[0] & 0xffc0) == 0xfe80)
}

/// `CNI-E4-<hash>` / `CNI-E6-<hash>`: sha512 of network name + container id, hex, cut at 28.
#[must_use]
pub fn chain_name(network: &str, container_id: &str, kind: EgressKind) -> String {
    let digest = Sha512::digest(format!("{network}{container_id}").as_bytes());
    let mut name = format!(
        "CNI-{}{}",
        kind.chain_prefix(),
        hex::encode(digest.as_slice())
    );
    name.truncate(MAX_CHAIN_LENGTH);
    name
}

/// `utils.FormatComment`: `name: "<network>" id: "<container id>"` (Go `%q`).
#[must_use]
pub fn snat_comment(network: &str, container_id: &str) -> String {
    format!("name: {network:?} id: {container_id:?}")
}

/// The SNAT port randomization flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnatRandom {
    /// `--random-fully`.
    Fully,
    /// `--random`.
    Hash,
    /// No flag.
    Off,
}

impl SnatRandom {
    /// The SNAT rule's flag: `none` → no flag; `hashrandom`, or an iptables without
    /// `--random-fully` (before 1.6.2) → `--random`; anything else (`prng`) → `--random-fully`.
    #[must_use]
    pub fn choose(randomize: &str, has_random_fully: bool) -> Self {
        match randomize {
            "none" => Self::Off,
            "hashrandom" => Self::Hash,
            _ if !has_random_fully => Self::Hash,
            _ => Self::Fully,
        }
    }
}

/// One `-t nat` rule: the chain it is appended to and the rest of its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatRule {
    /// Chain.
    pub chain: String,
    /// Arguments after the chain name.
    pub args: Vec<String>,
}

/// The SNAT rules, in order: multicast ACCEPT and SNAT in the pod's chain, then the POSTROUTING
/// jump for the pod's egress address.
#[must_use]
pub fn snat_rules(
    kind: EgressKind,
    node_ip: IpAddr,
    src: IpAddr,
    chain: &str,
    comment: &str,
    random: SnatRandom,
) -> Vec<NatRule> {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    let mut snat = s(&["-j", "SNAT", "--to-source", &node_ip.to_string()]);
    snat.extend(s(&["-m", "comment", "--comment", comment]));
    match random {
        SnatRandom::Fully => snat.push("--random-fully".to_owned()),
        SnatRandom::Hash => snat.push("--random".to_owned()),
        SnatRandom::Off => {}
    }
    vec![
        NatRule {
            chain: chain.to_owned(),
            args: s(&[
                "-d",
                kind.multicast(),
                "-j",
                "ACCEPT",
                "-m",
                "comment",
                "--comment",
                comment,
            ]),
        },
        NatRule {
            chain: chain.to_owned(),
            args: snat,
        },
        postrouting_jump(src, chain, comment),
    ]
}

/// The POSTROUTING jump of the pod's egress address `src` into its chain: added by ADD
/// ([`snat_rules`]), deleted by DEL.
#[must_use]
pub fn postrouting_jump(src: IpAddr, chain: &str, comment: &str) -> NatRule {
    let args = [
        "-s",
        &src.to_string(),
        "-j",
        chain,
        "-m",
        "comment",
        "--comment",
        comment,
    ];
    NatRule {
        chain: "POSTROUTING".to_owned(),
        args: args.iter().map(|x| (*x).to_owned()).collect(),
    }
}

/// The address host-local gave the pod's egress interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EgressLease {
    /// Address with the range's prefix (`169.254.172.x/22`, `fd00::ac:x/118`).
    pub address: IpNet,
    /// The range's gateway (its first address), `169.254.172.1` / `fd00::ac:1`.
    pub gateway: IpAddr,
}

impl EgressLease {
    /// Checks host-local's answer (exactly one address), and its family.
    pub fn from_ipam(
        kind: EgressKind,
        ips: &[(IpNet, Option<IpAddr>)],
    ) -> Result<Self, EgressPlanError> {
        match ips {
            [(address, gateway)] if kind.matches(address.addr()) => Ok(Self {
                address: *address,
                gateway: gateway.unwrap_or_else(|| first_host(address)),
            }),
            other => Err(EgressPlanError::IpamAddresses(
                other
                    .iter()
                    .map(|(a, _)| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
        }
    }
}

/// host-local's default gateway: the network address + 1.
fn first_host(net: &IpNet) -> IpAddr {
    match net.network() {
        IpAddr::V4(a) => IpAddr::V4((u32::from(a).wrapping_add(1)).into()),
        IpAddr::V6(a) => IpAddr::V6((u128::from(a).wrapping_add(1)).into()),
    }
}

/// Everything ADD programs for one pod's egress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressPlan {
    /// Family.
    pub kind: EgressKind,
    /// Pod-side interface (`v4if0` / `v6if0`).
    pub container_ifname: String,
    /// Host-side veth (random: `veth` + 8 hex).
    pub host_veth: String,
    /// MTU of both ends.
    pub mtu: u32,
    /// The lease.
    pub lease: EgressLease,
    /// The pod's primary interface (`CNI_IFNAME`), whose IPv6 the V6 egress disables.
    pub pod_ifname: String,
    /// SNAT chain.
    pub chain: String,
    /// SNAT rules' comment.
    pub comment: String,
    /// SNAT rules in order.
    pub nat_rules: Vec<NatRule>,
    /// Sysctls written in the pod netns before the veth is created.
    pub pod_sysctls: Vec<(String, String)>,
    /// Sysctls written in the host netns (IP forwarding, V4 only).
    pub host_sysctls: Vec<(String, String)>,
}

/// The inputs of [`plan_add`].
#[derive(Debug, Clone)]
pub struct EgressInput<'a> {
    /// Network name (netconf `name`).
    pub network: &'a str,
    /// `CNI_CONTAINERID`.
    pub container_id: &'a str,
    /// `CNI_IFNAME`.
    pub pod_ifname: &'a str,
    /// Node IP (netconf `nodeIP`).
    pub node_ip: IpAddr,
    /// MTU.
    pub mtu: u32,
    /// netconf `randomizeSNAT`.
    pub randomize: &'a str,
    /// Whether the installed iptables knows `--random-fully`.
    pub has_random_fully: bool,
    /// Host veth name (drawn by the caller).
    pub host_veth: String,
}

/// Plans ADD from the configuration and host-local's lease.
#[must_use]
pub fn plan_add(kind: EgressKind, input: &EgressInput<'_>, lease: EgressLease) -> EgressPlan {
    let chain = chain_name(input.network, input.container_id, kind);
    let comment = snat_comment(input.network, input.container_id);
    let nat_rules = snat_rules(
        kind,
        input.node_ip,
        lease.address.addr(),
        &chain,
        &comment,
        SnatRandom::choose(input.randomize, input.has_random_fully),
    );
    let (pod_sysctls, host_sysctls) = match kind {
        EgressKind::V4 => (
            Vec::new(),
            vec![("net/ipv4/ip_forward".to_owned(), "1".to_owned())],
        ),
        EgressKind::V6 => (
            vec![(
                format!("net/ipv6/conf/{}/disable_ipv6", input.pod_ifname),
                "1".to_owned(),
            )],
            Vec::new(),
        ),
    };
    EgressPlan {
        kind,
        container_ifname: kind.ifname().to_owned(),
        host_veth: input.host_veth.clone(),
        mtu: input.mtu,
        lease,
        pod_ifname: input.pod_ifname.to_owned(),
        chain,
        comment,
        nat_rules,
        pod_sysctls,
        host_sysctls,
    }
}

impl EgressPlan {
    /// The pod's own address as a host route destination (/32 or /128).
    #[must_use]
    pub fn pod_host_prefix(&self) -> IpNet {
        IpNet::from(self.lease.address.addr())
    }

    /// Pod routes on the egress interface (`ifindex`). V4: the subnet route the address brings is
    /// replaced by `<gw>/32 scope link` and `<subnet> via <gw>`, plus host-local's
    /// `0.0.0.0/0 via <gw>`. V6: `::/0 via <host veth link-local>` (`host_ll`), replacing
    /// host-local's route to the range's gateway.
    #[must_use]
    pub fn pod_routes(&self, ifindex: u32, host_ll: Option<IpAddr>) -> Vec<Route> {
        let r = |dst: IpNet, gateway: Option<IpAddr>, scope: Scope| Route {
            dst,
            gateway,
            oif: Some(ifindex),
            table: MAIN_TABLE,
            scope,
        };
        let gw = self.lease.gateway;
        match self.kind {
            EgressKind::V4 => vec![
                r(IpNet::from(gw), None, Scope::Link),
                r(self.lease.address.trunc(), Some(gw), Scope::Universe),
                r(
                    IpNet::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0).unwrap_or_default(),
                    Some(gw),
                    Scope::Universe,
                ),
            ],
            EgressKind::V6 => host_ll
                .map(|ll| {
                    r(
                        IpNet::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 0)
                            .unwrap_or_default(),
                        Some(ll),
                        Scope::Universe,
                    )
                })
                .into_iter()
                .collect(),
        }
    }

    /// The subnet route the kernel adds with the pod's V4 address (deleted).
    #[must_use]
    pub fn pod_subnet_route(&self, ifindex: u32) -> Option<Route> {
        (self.kind == EgressKind::V4).then(|| Route {
            dst: self.lease.address.trunc(),
            gateway: None,
            oif: Some(ifindex),
            table: MAIN_TABLE,
            scope: Scope::Link,
        })
    }

    /// Host veth address: the range gateway as `/32 scope link` (V4 only).
    #[must_use]
    pub fn host_address(&self) -> Option<IpNet> {
        (self.kind == EgressKind::V4).then(|| IpNet::from(self.lease.gateway))
    }

    /// Host route to the pod's egress address through the host veth (V4: scope link, V6: scope
    /// host).
    #[must_use]
    pub fn host_route(&self, veth_index: u32) -> Route {
        Route {
            dst: self.pod_host_prefix(),
            gateway: None,
            oif: Some(veth_index),
            table: MAIN_TABLE,
            scope: match self.kind {
                EgressKind::V4 => Scope::Link,
                EgressKind::V6 => Scope::Host,
            },
        }
    }
}

/// DEL picks the SNAT source among the egress interface's addresses: V4 link-local IPv4, V6 global
/// unicast IPv6.
#[must_use]
pub fn snat_sources(kind: EgressKind, addresses: &[IpNet]) -> Vec<IpAddr> {
    addresses
        .iter()
        .map(IpNet::addr)
        .filter(|a| match (kind, a) {
            (EgressKind::V4, IpAddr::V4(v4)) => v4.is_link_local(),
            (EgressKind::V6, IpAddr::V6(v6)) => is_global_unicast_v6(*v6),
            _ => false,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_as_containernetworking_utils() {
        // sha512("aws-cni" + "c1") in hex, cut to 28 with the prefix.
        let digest = hex::encode(Sha512::digest(b"aws-cnic1").as_slice());
        let v4 = chain_name("aws-cni", "c1", EgressKind::V4);
        assert_eq!(v4, format!("CNI-E4-{}", &digest[..21]));
        assert_eq!(v4.len(), 28);
        assert!(chain_name("aws-cni", "c1", EgressKind::V6).starts_with("CNI-E6-"));
        assert_ne!(v4, chain_name("aws-cni", "c2", EgressKind::V4));
        assert_eq!(snat_comment("aws-cni", "c1"), r#"name: "aws-cni" id: "c1""#);
    }

    #[test]
    fn kind_from_node_ip_as_upstream() {
        assert_eq!(
            EgressKind::for_node_ip(Some("198.18.0.10".parse().unwrap())),
            Ok(EgressKind::V4)
        );
        assert_eq!(
            EgressKind::for_node_ip(Some("2001:db8::10".parse().unwrap())),
            Ok(EgressKind::V6)
        );
        for bad in [
            None,
            Some("fe80::1".parse().unwrap()),
            Some("::".parse().unwrap()),
        ] {
            assert_eq!(
                EgressKind::for_node_ip(bad),
                Err(EgressPlanError::NoGlobalNodeIpv6)
            );
        }
    }

    #[test]
    fn snat_rules_and_randomize_flag() {
        assert_eq!(SnatRandom::choose("prng", true), SnatRandom::Fully);
        assert_eq!(SnatRandom::choose("prng", false), SnatRandom::Hash);
        assert_eq!(SnatRandom::choose("hashrandom", true), SnatRandom::Hash);
        assert_eq!(SnatRandom::choose("none", false), SnatRandom::Off);
        let rules = snat_rules(
            EgressKind::V4,
            "198.18.0.10".parse().unwrap(),
            "169.254.172.2".parse().unwrap(),
            "CNI-E4-x",
            "c",
            SnatRandom::Fully,
        );
        let text: Vec<String> = rules
            .iter()
            .map(|r| format!("{} {}", r.chain, r.args.join(" ")))
            .collect();
        assert_eq!(
            text,
            [
                "CNI-E4-x -d 224.0.0.0/4 -j ACCEPT -m comment --comment c",
                "CNI-E4-x -j SNAT --to-source 198.18.0.10 -m comment --comment c --random-fully",
                "POSTROUTING -s 169.254.172.2 -j CNI-E4-x -m comment --comment c",
            ]
        );
        let v6 = snat_rules(
            EgressKind::V6,
            "2001:db8::10".parse().unwrap(),
            "fd00::ac:2".parse().unwrap(),
            "CNI-E6-x",
            "c",
            SnatRandom::Off,
        );
        assert_eq!(v6[0].args[1], "ff00::/8");
        assert_eq!(v6[1].args.last().unwrap(), "c");
    }

    fn input(node_ip: &str) -> EgressInput<'static> {
        EgressInput {
            network: "aws-cni",
            container_id: "c1",
            pod_ifname: "eth0",
            node_ip: node_ip.parse().unwrap(),
            mtu: 9001,
            randomize: "prng",
            has_random_fully: true,
            host_veth: "veth0123abcd".to_owned(),
        }
    }

    #[test]
    fn v4_plan_routes_and_host_side() {
        let lease = EgressLease::from_ipam(
            EgressKind::V4,
            &[("169.254.172.5/22".parse().unwrap(), None)],
        )
        .unwrap();
        assert_eq!(lease.gateway, "169.254.172.1".parse::<IpAddr>().unwrap());
        let plan = plan_add(EgressKind::V4, &input("198.18.0.10"), lease);
        assert_eq!(plan.container_ifname, "v4if0");
        let routes = plan.pod_routes(3, None);
        let dsts: Vec<String> = routes
            .iter()
            .map(|r| format!("{} {:?}", r.dst, r.gateway))
            .collect();
        assert_eq!(
            dsts,
            [
                "169.254.172.1/32 None",
                "169.254.172.0/22 Some(169.254.172.1)",
                "0.0.0.0/0 Some(169.254.172.1)"
            ]
        );
        assert_eq!(
            plan.pod_subnet_route(3).unwrap().dst.to_string(),
            "169.254.172.0/22"
        );
        assert_eq!(plan.host_address().unwrap().to_string(), "169.254.172.1/32");
        assert_eq!(plan.host_route(9).dst.to_string(), "169.254.172.5/32");
        assert_eq!(plan.host_sysctls[0].0, "net/ipv4/ip_forward");
        assert!(plan.pod_sysctls.is_empty());
        assert_eq!(plan.nat_rules.len(), 3);
    }

    #[test]
    fn v6_plan_disables_pod_ipv6_on_eth0_and_routes_via_host_link_local() {
        let lease = EgressLease::from_ipam(
            EgressKind::V6,
            &[(
                "fd00::ac:5/118".parse().unwrap(),
                Some("fd00::ac:1".parse().unwrap()),
            )],
        )
        .unwrap();
        let plan = plan_add(EgressKind::V6, &input("2001:db8::10"), lease);
        assert_eq!(plan.container_ifname, "v6if0");
        assert_eq!(
            plan.pod_sysctls,
            [("net/ipv6/conf/eth0/disable_ipv6".to_owned(), "1".to_owned())]
        );
        assert!(plan.host_address().is_none());
        assert!(plan.pod_subnet_route(3).is_none());
        let ll: IpAddr = "fe80::99".parse().unwrap();
        let routes = plan.pod_routes(3, Some(ll));
        assert_eq!(routes.len(), 1);
        assert_eq!(routes[0].dst.to_string(), "::/0");
        assert_eq!(routes[0].gateway, Some(ll));
        assert_eq!(plan.host_route(9).dst.to_string(), "fd00::ac:5/128");
        assert_eq!(plan.host_route(9).scope, Scope::Host);
    }

    #[test]
    fn ipam_answers_refused_and_del_sources() {
        assert!(EgressLease::from_ipam(EgressKind::V4, &[]).is_err());
        assert!(
            EgressLease::from_ipam(EgressKind::V4, &[("fd00::ac:5/118".parse().unwrap(), None)])
                .is_err()
        );
        let two = [
            ("169.254.172.5/22".parse().unwrap(), None),
            ("169.254.172.6/22".parse().unwrap(), None),
        ];
        assert!(EgressLease::from_ipam(EgressKind::V4, &two).is_err());
        let addrs: Vec<IpNet> = ["169.254.172.5/22", "fe80::1/64", "fd00::ac:5/118"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(
            snat_sources(EgressKind::V4, &addrs),
            ["169.254.172.5".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            snat_sources(EgressKind::V6, &addrs),
            ["fd00::ac:5".parse::<IpAddr>().unwrap()]
        );
    }
}
