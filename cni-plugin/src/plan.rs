//! PURE: turns ipamd's reply, the netconf and the CNI environment into the pod's network plan
//! (names, addresses, routes, rules, sysctls) and the teardown plan. Must not: touch the
//! kernel, the network, the clock or the environment.

use std::net::IpAddr;

use dataplane::conventions::{
    FROM_POD_RULE_PRIORITY, MAIN_TABLE, MIN_MTU_V6, POD_FROM_INTERFACE_RULE_PRIORITY,
    POD_GATEWAY_V4, POD_GATEWAY_V6, STRICT_BRANCH_VETH_PREFIX, TO_POD_RULE_PRIORITY,
    VLAN_RULE_PRIORITY, branch_route_table, branch_vlan_link_name, host_veth_name,
    host_veth_name_at, host_veth_name_for_container, pod_gateway_v4, pod_interface_name,
    route_table_for_device,
};
use dataplane::{Family, MacAddr, Neighbour, Route, Rule, Scope};
use ipamd_proto::rpc::AddNetworkReply;
use ipnet::IpNet;

use crate::spec::netconf::SgEnforcingMode;
use crate::spec::{CniEnv, CniResult, Interface, IpConfig, NetConf, RouteEntry};

/// Why ipamd's answer cannot be wired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// `Success` was false.
    #[error("ipamd did not assign an address")]
    NotAssigned,
    /// No allocation, or one without an address.
    #[error("ipamd reply carries no address")]
    NoAddress,
    /// An address that does not parse.
    #[error("ipamd reply has invalid address {0:?}")]
    BadAddress(String),
    /// A branch-ENI (security groups for pods) reply that cannot be wired: VLAN id out of
    /// range, no trunk link index, a branch MAC or subnet gateway that does not parse, or more
    /// than one address (upstream wires one).
    #[error("branch eni reply (vlan {vlan}): {what}")]
    BadBranchReply {
        /// `PodVlanId` as sent.
        vlan: i32,
        /// What is wrong with it.
        what: String,
    },
    /// The MTU is too small for IPv6.
    #[error("mtu {0} is below the IPv6 minimum {MIN_MTU_V6}")]
    MtuTooSmallForV6(u32),
    /// A reply with one address per network card (multi-NIC pod) that is not IPv4 only.
    #[error(
        "multi-NIC pods (one interface per network card) are wired for IPv4 only; ipamd answered {0} IPv6 address(es) beside several interfaces"
    )]
    MultiNicNotV4(usize),
}

/// One address of the pod with what routes it (a dual-stack pod has one per family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodAddress {
    /// Pod address (/32 or /128).
    pub address: IpNet,
    /// Link-local gateway of its family.
    pub gateway: IpAddr,
    /// Route table of its ENI.
    pub route_table: u32,
}

/// Everything ADD programs for one pod interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNetworkPlan {
    /// Host-side veth name.
    pub host_veth: String,
    /// Container-side interface name (`CNI_IFNAME`).
    pub container_ifname: String,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// Pod address (/32 or /128).
    pub address: IpNet,
    /// Link-local gateway the pod routes through.
    pub gateway: IpAddr,
    /// ENI device number the address belongs to.
    pub device_number: u32,
    /// Route table of that ENI (`main` for the primary ENI).
    pub route_table: u32,
    /// Sysctls for the host veth, written in the host netns before it goes up.
    pub host_sysctls: Vec<(String, String)>,
    /// Sysctls written in the pod netns.
    pub pod_sysctls: Vec<(String, String)>,
    /// Rules added in the host netns.
    pub host_rules: Vec<Rule>,
    /// Dual-stack: the pod's address of the other family, on the same interface.
    pub extra: Vec<PodAddress>,
    /// Table of the host routes to the pod's addresses (`main`, or a strict-mode branch pod's
    /// VLAN table).
    pub host_route_table: u32,
    /// A branch-ENI pod's VLAN link (security groups for pods).
    pub branch: Option<BranchPlan>,
    /// Table of the pod's own routes in its netns: `main` for its first interface; a multi-NIC
    /// pod's interface `index` > 0 uses table `index` (upstream `createVethPairContext.run`).
    pub pod_table: u32,
    /// Rules added in the pod netns: `from <address> lookup <index>` at priority 1 for a
    /// multi-NIC pod's interface `index` > 0 (upstream `FromInterfaceRulePriority`).
    pub pod_rules: Vec<Rule>,
    /// A multi-NIC pod's further interfaces, one per network card after card 0, in ipamd's
    /// order (upstream: one veth pair per `IPAllocationMetadata`); a branch-ENI pod has none.
    pub more: Vec<PodNetworkPlan>,
    /// How the result's marker interface spells the VLAN id in its `mac`.
    pub marker: MarkerSpelling,
    /// Another pod interface whose host veth has the same name ([`veth_name_shared_with`]:
    /// pod `x`'s interface 1 and pod `x.1`'s first, as upstream names them). A link found
    /// under [`Self::host_veth`] may then be that pod's: ADD refuses instead of deleting it.
    pub host_veth_shared_with: Option<String>,
}

/// How the result's marker interface (`dummy<hash>`) writes the VLAN id in its `mac`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerSpelling {
    /// Upstream's bare decimal (`"0"`, `"7"`), for kubelet's pods (`K8S_POD_NAME` and
    /// `K8S_POD_NAMESPACE` given): upstream's plugin reads it with `Atoi` on DEL and fails the
    /// DEL of any pod whose marker does not parse, so a node rolled back to upstream needs it.
    Decimal,
    /// MAC-shaped (`00:00:00:00:0f:a0` for 4000), for runtimes without a pod identity
    /// (podman, ctr): podman parses every interface's `mac` and refuses a bare number; upstream
    /// never finds these markers anyway (it looks the marker up by pod name).
    MacShaped,
}

impl MarkerSpelling {
    /// Decimal with a kubelet pod identity, MAC-shaped without.
    #[must_use]
    pub fn for_env(env: &CniEnv) -> Self {
        if env.k8s.has_pod() {
            Self::Decimal
        } else {
            Self::MacShaped
        }
    }

    /// The marker's `mac` for `vlan_id` (0 for a pod that is not a branch-ENI pod).
    #[must_use]
    pub fn mac(self, vlan_id: u16) -> String {
        match self {
            Self::Decimal => vlan_id.to_string(),
            Self::MacShaped => vlan_marker_mac(vlan_id).to_string(),
        }
    }
}

/// The branch-ENI half of a pod's plan (upstream `SetupBranchENIPodNetwork`): the VLAN link on
/// the trunk ENI's link and its route table; the mode's rules are in
/// [`PodNetworkPlan::host_rules`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchPlan {
    /// VLAN id of the branch ENI.
    pub vlan_id: u16,
    /// `vlan.eth.<id>`.
    pub vlan_link: String,
    /// The trunk ENI's link index (`ParentIfIndex`).
    pub parent_index: u32,
    /// The branch ENI's MAC, given to the VLAN link.
    pub mac: MacAddr,
    /// The branch ENI subnet's gateway.
    pub subnet_gateway: IpAddr,
    /// `<vlan id> + 100`.
    pub table: u32,
    /// The enforcing mode the rules follow.
    pub mode: SgEnforcingMode,
}

impl BranchPlan {
    /// Routes of the VLAN table: `<gw> dev vlan.eth.<id> scope link` and `default via <gw>`.
    #[must_use]
    pub fn routes(&self, vlan_index: u32) -> Vec<Route> {
        [
            Route {
                dst: IpNet::from(self.subnet_gateway),
                gateway: None,
                oif: Some(vlan_index),
                table: self.table,
                scope: Scope::Link,
            },
            Route {
                dst: any_of(self.subnet_gateway),
                gateway: Some(self.subnet_gateway),
                oif: Some(vlan_index),
                table: self.table,
                scope: Scope::Universe,
            },
        ]
        .to_vec()
    }

    /// Upstream's IPv6 sysctls of the VLAN link (as for a host veth).
    #[must_use]
    pub fn sysctls(&self) -> Vec<(String, String)> {
        host_link_v6_sysctls(&self.vlan_link)
    }

    /// The `iif <host veth>` rules at priority 10 an earlier sandbox of the same pod may have
    /// left (upstream removes them all before adding its own).
    #[must_use]
    pub fn is_old_veth_rule(rule: &Rule, host_veth: &str) -> bool {
        rule.priority == VLAN_RULE_PRIORITY && rule.iif.as_deref() == Some(host_veth)
    }

    /// A rule ADD removes before it takes the VLAN over: an earlier sandbox's `iif <host
    /// veth>` rule at 10 ([`Self::is_old_veth_rule`]), and every rule to this VLAN's table at
    /// 10 or 1536. The controller gives a VLAN id to one live branch ENI of the trunk at a
    /// time and ipamd answered it for this pod: whatever else routes into the table was left
    /// by a sandbox that held the id before (a DEL that could not prove it its own, or never
    /// came). Kept, a leftover `from <old address> lookup <table>` would also make this
    /// sandbox's own DEL take the table for another sandbox's and keep the VLAN link.
    #[must_use]
    pub fn is_stale_rule(&self, rule: &Rule, host_veth: &str) -> bool {
        Self::is_old_veth_rule(rule, host_veth)
            || (rule.table == self.table
                && (rule.priority == VLAN_RULE_PRIORITY || rule.priority == FROM_POD_RULE_PRIORITY))
    }
}

/// `accept_ra=0`, `accept_redirects=1`, `forwarding=0` for a host-side link (upstream applies
/// them to host veths and VLAN links before they go up).
fn host_link_v6_sysctls(link: &str) -> Vec<(String, String)> {
    [
        ("accept_ra", "0"),
        ("accept_redirects", "1"),
        ("forwarding", "0"),
    ]
    .iter()
    .map(|(k, v)| (format!("net/ipv6/conf/{link}/{k}"), (*v).to_owned()))
    .collect()
}

/// The marker interface's `mac` for a VLAN id: MAC-shaped (`00:00:00:00:0f:a0` for 4000)
/// because runtimes that parse MACs (podman) refuse upstream's bare number.
#[must_use]
pub fn vlan_marker_mac(vlan_id: u16) -> MacAddr {
    let [hi, lo] = vlan_id.to_be_bytes();
    MacAddr([0, 0, 0, 0, hi, lo])
}

/// The VLAN id a result's marker interface (`dummy...`) records: ours MAC-shaped, upstream's a
/// bare decimal number. `None` without a marker or when it does not parse; `Some(0)` for a
/// pod that is not a branch-ENI pod.
#[must_use]
pub fn marker_vlan(result: &CniResult) -> Option<u16> {
    let marker = result
        .interfaces
        .iter()
        .find(|i| i.name.starts_with("dummy"))?;
    if let Ok(n) = marker.mac.parse::<u16>() {
        return Some(n);
    }
    let mac = marker.mac.parse::<MacAddr>().ok()?;
    match mac.0 {
        [0, 0, 0, 0, hi, lo] => Some(u16::from_be_bytes([hi, lo])),
        _ => None,
    }
}

fn any_of(gateway: IpAddr) -> IpNet {
    match gateway {
        IpAddr::V4(_) => IpNet::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0),
        IpAddr::V6(_) => IpNet::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), 0),
    }
    .unwrap_or_default()
}

impl PodNetworkPlan {
    /// Every address of the pod: the primary one, then the dual-stack one.
    #[must_use]
    pub fn addresses(&self) -> Vec<PodAddress> {
        let mut out = vec![PodAddress {
            address: self.address,
            gateway: self.gateway,
            route_table: self.route_table,
        }];
        out.extend(self.extra.iter().copied());
        out
    }

    /// Pod routes per family: `<gw> dev <if> scope link` and `default via <gw> dev <if>`.
    #[must_use]
    pub fn pod_routes(&self, ifindex: u32) -> Vec<Route> {
        self.addresses()
            .iter()
            .flat_map(|a| {
                [
                    Route {
                        dst: IpNet::from(a.gateway),
                        gateway: None,
                        oif: Some(ifindex),
                        table: self.pod_table,
                        scope: Scope::Link,
                    },
                    Route {
                        dst: any_of(a.gateway),
                        gateway: Some(a.gateway),
                        oif: Some(ifindex),
                        table: self.pod_table,
                        scope: Scope::Universe,
                    },
                ]
            })
            .collect()
    }

    /// The permanent neighbours mapping each gateway to the host veth's MAC, in the pod.
    #[must_use]
    pub fn gateway_neighbours(&self, ifindex: u32, host_mac: MacAddr) -> Vec<Neighbour> {
        self.addresses()
            .iter()
            .map(|a| Neighbour {
                ifindex,
                ip: a.gateway,
                mac: Some(host_mac),
                permanent: true,
            })
            .collect()
    }

    /// Host routes `<podIP> dev <hostveth> scope link` in main (a strict-mode branch pod: in
    /// its VLAN table), one per address.
    #[must_use]
    pub fn host_routes(&self, veth_index: u32) -> Vec<Route> {
        self.addresses()
            .iter()
            .map(|a| Route {
                dst: a.address,
                gateway: None,
                oif: Some(veth_index),
                table: self.host_route_table,
                scope: Scope::Link,
            })
            .collect()
    }

    /// Rules keyed on this pod's address that the plan does not want: `from <ip>` at 1536 to
    /// another table (any, for a primary-ENI pod). ipamd has just given the address to this
    /// sandbox, so they are leftovers of an earlier owner whose teardown did not finish (its
    /// DEL could not prove them its own, or it never ran); older at the same priority, they
    /// would send this pod's egress out of the wrong ENI.
    #[must_use]
    pub fn stale_rules(&self, existing: &[Rule]) -> Vec<Rule> {
        existing
            .iter()
            .filter(|r| {
                r.priority == FROM_POD_RULE_PRIORITY
                    && r.src
                        .is_some_and(|src| self.addresses().iter().any(|a| a.address == src))
                    && !self.host_rules.iter().any(|p| {
                        p.priority == FROM_POD_RULE_PRIORITY && p.src == r.src && p.table == r.table
                    })
            })
            .cloned()
            .collect()
    }

    /// The CNI result: host veth, container interface, and the VLAN marker interface whose
    /// `sandbox` is the ENI device number, as upstream, and whose `mac` carries the VLAN id
    /// (0 but for a branch-ENI pod, whose marker has no `sandbox`) spelled as
    /// [`MarkerSpelling`] says.
    #[must_use]
    pub fn result(&self, host_mac: MacAddr, container_mac: MacAddr, netns: &str) -> CniResult {
        self.result_with(&[(host_mac, container_mac)], netns)
    }

    /// Every interface of the pod: this one, then a multi-NIC pod's further ones.
    pub fn interfaces(&self) -> impl Iterator<Item = &PodNetworkPlan> {
        std::iter::once(self).chain(self.more.iter())
    }

    /// The CNI result of a pod with one or more interfaces (`macs`: host and container MAC of
    /// each, in [`Self::interfaces`] order), upstream's layout: host veth and container
    /// interface of each in turn, then the marker; each address on its container interface
    /// (`interface` 1, 3, 5, ...). Only the first interface's routes are the pod's defaults
    /// (the others route through their own tables).
    #[must_use]
    pub fn result_with(&self, macs: &[(MacAddr, MacAddr)], netns: &str) -> CniResult {
        // A branch-ENI pod (never multi-NIC) has a marker carrying its VLAN id and no device
        // number, and its address the branch subnet's gateway (upstream's result).
        let (marker_mac, marker_sandbox) = match &self.branch {
            Some(b) => (self.marker.mac(b.vlan_id), None),
            None => (self.marker.mac(0), Some(self.device_number.to_string())),
        };
        let mut interfaces = Vec::new();
        let mut ips = Vec::new();
        for (i, (plan, (host_mac, container_mac))) in self.interfaces().zip(macs).enumerate() {
            interfaces.push(Interface {
                name: plan.host_veth.clone(),
                mac: host_mac.to_string(),
                sandbox: None,
            });
            interfaces.push(Interface {
                name: plan.container_ifname.clone(),
                mac: container_mac.to_string(),
                sandbox: Some(netns.to_owned()),
            });
            ips.extend(plan.addresses().iter().map(|a| IpConfig {
                address: a.address,
                gateway: Some(plan.branch.as_ref().map_or(a.gateway, |b| b.subnet_gateway)),
                interface: Some(2 * i + 1),
            }));
        }
        interfaces.push(Interface {
            name: vlan_marker_name(&self.host_veth),
            mac: marker_mac,
            sandbox: marker_sandbox,
        });
        CniResult {
            interfaces,
            ips,
            routes: self
                .addresses()
                .iter()
                .map(|a| RouteEntry {
                    dst: any_of(a.gateway),
                    gw: Some(a.gateway),
                })
                .collect(),
        }
    }
}

/// Name of the marker interface in results (`dummy` + the host veth's hash part).
#[must_use]
pub fn vlan_marker_name(host_veth: &str) -> String {
    let hash = host_veth
        .get(host_veth.len().saturating_sub(11)..)
        .unwrap_or(host_veth);
    format!("dummy{hash}")
}

/// The host veth name for this invocation: from the K8S pod identity when present,
/// otherwise from the container id and interface name.
#[must_use]
pub fn host_veth_for(conf: &NetConf, env: &CniEnv) -> String {
    if env.k8s.has_pod() {
        host_veth_name(&conf.veth_prefix, &env.k8s.pod_namespace, &env.k8s.pod_name)
    } else {
        host_veth_name_for_container(&conf.veth_prefix, &env.container_id, &env.ifname)
    }
}

/// Plans ADD from ipamd's reply.
pub fn plan_add(
    reply: &AddNetworkReply,
    conf: &NetConf,
    env: &CniEnv,
) -> Result<PodNetworkPlan, PlanError> {
    if !reply.success {
        return Err(PlanError::NotAssigned);
    }
    if reply.pod_vlan_id != 0 {
        return plan_branch(reply, conf, env);
    }
    // A multi-NIC reply carries one IPv4 allocation per network card: one interface each (see
    // docs/plugin.md). A dual-stack reply carries an IPv4 and an IPv6 (in one allocation or
    // two): both go on the same interface, the IPv4 first.
    if reply.ip_allocation_metadata.is_empty() {
        return Err(PlanError::NoAddress);
    }
    let mut v4: Option<(IpAddr, &ipamd_proto::rpc::IpAllocationMetadata)> = None;
    let mut v6: Option<(IpAddr, &ipamd_proto::rpc::IpAllocationMetadata)> = None;
    // A multi-NIC pod's further IPv4s: one more interface each (upstream: one veth pair per
    // `IPAllocationMetadata`).
    let mut more_v4: Vec<(std::net::Ipv4Addr, &ipamd_proto::rpc::IpAllocationMetadata)> =
        Vec::new();
    let mut v6_count = 0;
    for alloc in &reply.ip_allocation_metadata {
        if !alloc.i_pv4_addr.is_empty() {
            let ip: std::net::Ipv4Addr = alloc
                .i_pv4_addr
                .parse()
                .map_err(|_| PlanError::BadAddress(alloc.i_pv4_addr.clone()))?;
            if v4.is_none() {
                v4 = Some((IpAddr::V4(ip), alloc));
            } else {
                more_v4.push((ip, alloc));
            }
        }
        if !alloc.i_pv6_addr.is_empty() {
            v6_count += 1;
        }
        if v6.is_none() && !alloc.i_pv6_addr.is_empty() {
            let ip: std::net::Ipv6Addr = alloc
                .i_pv6_addr
                .parse()
                .map_err(|_| PlanError::BadAddress(alloc.i_pv6_addr.clone()))?;
            v6 = Some((IpAddr::V6(ip), alloc));
        }
    }
    if v6.is_some() && conf.mtu < MIN_MTU_V6 {
        return Err(PlanError::MtuTooSmallForV6(conf.mtu));
    }
    // Several interfaces must be IPv4 only; several IPv6 entries (a multi-NIC pod in IPv6
    // mode) are refused too, never wired as one interface in silence.
    if (!more_v4.is_empty() && v6_count > 0) || v6_count > 1 {
        return Err(PlanError::MultiNicNotV4(v6_count));
    }
    let gateway_of = |ip: IpAddr| match ip {
        IpAddr::V4(_) => IpAddr::V4(POD_GATEWAY_V4),
        IpAddr::V6(_) => IpAddr::V6(POD_GATEWAY_V6),
    };
    // Upstream treats table ids 0 and 1 as "not set" (main); an old ipamd may send only the
    // device number.
    let table_of = |alloc: &ipamd_proto::rpc::IpAllocationMetadata| {
        let device = u32::try_from(alloc.device_number).unwrap_or(0);
        match u32::try_from(alloc.route_table_id) {
            Ok(t) if t > 1 => t,
            _ => route_table_for_device(device),
        }
    };
    let mut found = v4.into_iter().chain(v6).map(|(ip, alloc)| {
        (
            PodAddress {
                address: IpNet::from(ip),
                gateway: gateway_of(ip),
                route_table: table_of(alloc),
            },
            u32::try_from(alloc.device_number).unwrap_or(0),
        )
    });
    let (primary, device_number) = found.next().ok_or(PlanError::NoAddress)?;
    let extra: Vec<PodAddress> = found.map(|(a, _)| a).collect();
    let PodAddress {
        address,
        gateway,
        route_table,
    } = primary;
    let ip = address.addr();
    let host_veth = host_veth_for(conf, env);
    let mut host_rules = Vec::new();
    for a in std::iter::once(&primary).chain(&extra) {
        let family = Family::of(a.address.addr());
        host_rules.push(Rule {
            dst: Some(a.address),
            ..Rule::lookup(family, TO_POD_RULE_PRIORITY, MAIN_TABLE)
        });
        if a.route_table != MAIN_TABLE {
            // Current upstream adds one `from <podIP>` rule whatever UseExternalSNAT and the
            // VPC CIDRs say (older versions added one per VPC CIDR; teardown removes all).
            host_rules.push(Rule {
                src: Some(a.address),
                ..Rule::lookup(family, FROM_POD_RULE_PRIORITY, a.route_table)
            });
        }
    }
    let host_sysctls = host_link_v6_sysctls(&host_veth);
    let pod_sysctls = pod_v6_sysctls(ip.is_ipv6() || !extra.is_empty(), &env.ifname);
    let more = more_v4
        .iter()
        .zip(1u32..)
        .map(|((ip, alloc), index)| more_interface(conf, env, index, *ip, alloc))
        .collect();
    Ok(PodNetworkPlan {
        host_veth,
        container_ifname: env.ifname.clone(),
        mtu: conf.mtu,
        address,
        gateway,
        device_number,
        route_table,
        host_sysctls,
        pod_sysctls,
        host_rules,
        extra,
        host_route_table: MAIN_TABLE,
        branch: None,
        pod_table: MAIN_TABLE,
        pod_rules: Vec::new(),
        more,
        marker: MarkerSpelling::for_env(env),
        host_veth_shared_with: veth_name_shared_with(env, 0),
    })
}

/// The other pod interface whose host veth name is the same as this pod's interface
/// `index`'s, if one can exist: the name hashes `<namespace>.<pod>` for a first interface and
/// `<namespace>.<pod>.<index>` for a multi-NIC pod's further one (upstream
/// `GeneratePodHostVethName`), so pod `x`'s interface 1 and pod `x.1`'s interface 0 share a
/// name (and, without a pod identity, interface `eth0.1` and `eth0`'s interface 1 of one
/// container).
#[must_use]
pub fn veth_name_shared_with(env: &CniEnv, index: u32) -> Option<String> {
    let (what, key) = if env.k8s.has_pod() {
        (
            format!("pod {}/", env.k8s.pod_namespace),
            env.k8s.pod_name.as_str(),
        )
    } else {
        (
            format!("container {} interface ", env.container_id),
            env.ifname.as_str(),
        )
    };
    if index > 0 {
        return Some(format!("{what}{key}.{index}'s first interface"));
    }
    let (base, suffix) = key.rsplit_once('.')?;
    let n: u32 = suffix.parse().ok()?;
    // Only the decimal spelling `host_veth_at` writes (`x.01` is no interface of `x`).
    (!base.is_empty() && (1..=MAX_EXTRA_INTERFACES).contains(&n) && n.to_string() == suffix)
        .then(|| format!("{what}{base}'s interface {n}"))
}

/// The host veth of a multi-NIC pod's interface `index` (0: [`host_veth_for`]).
#[must_use]
pub fn host_veth_at(conf: &NetConf, env: &CniEnv, index: u32) -> String {
    if index == 0 {
        host_veth_for(conf, env)
    } else if env.k8s.has_pod() {
        host_veth_name_at(
            &conf.veth_prefix,
            &env.k8s.pod_namespace,
            &env.k8s.pod_name,
            index,
        )
    } else {
        host_veth_name_for_container(
            &conf.veth_prefix,
            &env.container_id,
            &format!("{}.{index}", env.ifname),
        )
    }
}

/// A multi-NIC pod's interface `index` > 0 (upstream `createVethPairContext.run` with
/// `index > 0`): `mNicIf<index>` in the pod with the address, gateway
/// `169.254.1.<index + 1>`, its routes in pod table `index` and `from <address> lookup
/// <index>` at priority 1; on the host, `to <address> lookup main` and `from <address>
/// lookup <its ENI's table>` (`10000 + 100 × card + device`).
fn more_interface(
    conf: &NetConf,
    env: &CniEnv,
    index: u32,
    ip: std::net::Ipv4Addr,
    alloc: &ipamd_proto::rpc::IpAllocationMetadata,
) -> PodNetworkPlan {
    let device_number = u32::try_from(alloc.device_number).unwrap_or(0);
    let route_table = match u32::try_from(alloc.route_table_id) {
        Ok(t) if t > 1 => t,
        _ => route_table_for_device(device_number),
    };
    let address = IpNet::from(IpAddr::V4(ip));
    let host_veth = host_veth_at(conf, env, index);
    let mut host_rules = vec![Rule {
        dst: Some(address),
        ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
    }];
    if route_table != MAIN_TABLE {
        host_rules.push(Rule {
            src: Some(address),
            ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, route_table)
        });
    }
    let host_sysctls = host_link_v6_sysctls(&host_veth);
    PodNetworkPlan {
        host_veth,
        container_ifname: pod_interface_name(&env.ifname, index),
        mtu: conf.mtu,
        address,
        gateway: IpAddr::V4(pod_gateway_v4(index)),
        device_number,
        route_table,
        host_sysctls,
        pod_sysctls: Vec::new(),
        host_rules,
        extra: Vec::new(),
        host_route_table: MAIN_TABLE,
        branch: None,
        pod_table: index,
        pod_rules: vec![Rule {
            src: Some(address),
            ..Rule::lookup(Family::V4, POD_FROM_INTERFACE_RULE_PRIORITY, index)
        }],
        more: Vec::new(),
        marker: MarkerSpelling::for_env(env),
        host_veth_shared_with: veth_name_shared_with(env, index),
    }
}

/// IPv6 on in the pod (its interface and `lo`) when it has an IPv6 address.
fn pod_v6_sysctls(ipv6: bool, ifname: &str) -> Vec<(String, String)> {
    if ipv6 {
        vec![
            (
                format!("net/ipv6/conf/{ifname}/disable_ipv6"),
                "0".to_owned(),
            ),
            ("net/ipv6/conf/lo/disable_ipv6".to_owned(), "0".to_owned()),
        ]
    } else {
        Vec::new()
    }
}

/// The host veth name of a branch-ENI pod: `vlan<hash>` in strict mode, the configured prefix
/// in standard mode (upstream `sgpp.BuildHostVethNamePrefix`).
#[must_use]
pub fn branch_host_veth(conf: &NetConf, env: &CniEnv) -> String {
    let prefix = match conf.pod_sg_enforcing_mode {
        SgEnforcingMode::Strict => STRICT_BRANCH_VETH_PREFIX,
        SgEnforcingMode::Standard => conf.veth_prefix.as_str(),
    };
    if env.k8s.has_pod() {
        host_veth_name(prefix, &env.k8s.pod_namespace, &env.k8s.pod_name)
    } else {
        host_veth_name_for_container(prefix, &env.container_id, &env.ifname)
    }
}

/// The host veth name a strict-mode branch-ENI pod of this identity has (`vlan<hash>`).
fn strict_branch_veth(env: &CniEnv) -> String {
    if env.k8s.has_pod() {
        host_veth_name(
            STRICT_BRANCH_VETH_PREFIX,
            &env.k8s.pod_namespace,
            &env.k8s.pod_name,
        )
    } else {
        host_veth_name_for_container(STRICT_BRANCH_VETH_PREFIX, &env.container_id, &env.ifname)
    }
}

/// Plans a branch-ENI pod (upstream `SetupBranchENIPodNetwork`): one address (IPv4, or IPv6
/// in an IPv6 cluster) on a veth, the VLAN link `vlan.eth.<id>` on the trunk's link with the
/// branch MAC and table `<id>+100`, and the enforcing mode's rules: strict, `iif vlan.eth.<id>`
/// and `iif <host veth>` at 10 to that table with the host route in it (everything the pod
/// sends or receives crosses the branch ENI); standard, the regular pod's `to <ip> lookup
/// main` at 512 and `from <ip> lookup <table>` at 1536 with the host route in main.
fn plan_branch(
    reply: &AddNetworkReply,
    conf: &NetConf,
    env: &CniEnv,
) -> Result<PodNetworkPlan, PlanError> {
    let vlan = reply.pod_vlan_id;
    let bad = |what: &str| PlanError::BadBranchReply {
        vlan,
        what: what.to_owned(),
    };
    let vlan_id = u16::try_from(vlan)
        .ok()
        .filter(|v| (1..=4094).contains(v))
        .ok_or_else(|| bad("vlan id outside 1..=4094"))?;
    let parent_index = u32::try_from(reply.parent_if_index)
        .ok()
        .filter(|i| *i > 0)
        .ok_or_else(|| bad("no trunk link index"))?;
    let mac: MacAddr = reply
        .pod_enimac
        .parse()
        .map_err(|_| bad(&format!("branch mac {:?}", reply.pod_enimac)))?;
    let subnet_gateway: IpAddr = reply
        .pod_eni_subnet_gw
        .parse()
        .map_err(|_| bad(&format!("subnet gateway {:?}", reply.pod_eni_subnet_gw)))?;
    let alloc = reply
        .ip_allocation_metadata
        .first()
        .ok_or(PlanError::NoAddress)?;
    let text = if alloc.i_pv4_addr.is_empty() {
        &alloc.i_pv6_addr
    } else {
        &alloc.i_pv4_addr
    };
    if text.is_empty() {
        return Err(PlanError::NoAddress);
    }
    if reply.ip_allocation_metadata.len() > 1
        || (!alloc.i_pv4_addr.is_empty() && !alloc.i_pv6_addr.is_empty())
    {
        return Err(bad("more than one address"));
    }
    let ip: IpAddr = text
        .parse()
        .map_err(|_| PlanError::BadAddress(text.clone()))?;
    if Family::of(ip) != Family::of(subnet_gateway) {
        return Err(bad("subnet gateway of the other family"));
    }
    if ip.is_ipv6() && conf.mtu < MIN_MTU_V6 {
        return Err(PlanError::MtuTooSmallForV6(conf.mtu));
    }
    let table = branch_route_table(vlan_id);
    let vlan_link = branch_vlan_link_name(vlan_id);
    let host_veth = branch_host_veth(conf, env);
    let address = IpNet::from(ip);
    let family = Family::of(ip);
    let mode = conf.pod_sg_enforcing_mode;
    let (host_rules, host_route_table) = match mode {
        SgEnforcingMode::Strict => (
            vec![
                Rule {
                    iif: Some(vlan_link.clone()),
                    ..Rule::lookup(family, VLAN_RULE_PRIORITY, table)
                },
                Rule {
                    iif: Some(host_veth.clone()),
                    ..Rule::lookup(family, VLAN_RULE_PRIORITY, table)
                },
            ],
            table,
        ),
        // The `from` rule to the VLAN table first: it is what marks the address a branch
        // pod's to ipamd's stale-rule prune, which must never see this pod's `to` rule alone
        // (docs/security-groups-for-pods.md, "Stale-rule prune").
        SgEnforcingMode::Standard => (
            vec![
                Rule {
                    src: Some(address),
                    ..Rule::lookup(family, FROM_POD_RULE_PRIORITY, table)
                },
                Rule {
                    dst: Some(address),
                    ..Rule::lookup(family, TO_POD_RULE_PRIORITY, MAIN_TABLE)
                },
            ],
            MAIN_TABLE,
        ),
    };
    let gateway = match ip {
        IpAddr::V4(_) => IpAddr::V4(POD_GATEWAY_V4),
        IpAddr::V6(_) => IpAddr::V6(POD_GATEWAY_V6),
    };
    Ok(PodNetworkPlan {
        host_sysctls: host_link_v6_sysctls(&host_veth),
        pod_sysctls: pod_v6_sysctls(ip.is_ipv6(), &env.ifname),
        host_veth,
        container_ifname: env.ifname.clone(),
        mtu: conf.mtu,
        address,
        gateway,
        device_number: 0,
        route_table: table,
        host_rules,
        extra: Vec::new(),
        host_route_table,
        branch: Some(BranchPlan {
            vlan_id,
            vlan_link,
            parent_index,
            mac,
            subnet_gateway,
            table,
            mode,
        }),
        pod_table: MAIN_TABLE,
        pod_rules: Vec::new(),
        more: Vec::new(),
        marker: MarkerSpelling::for_env(env),
        host_veth_shared_with: veth_name_shared_with(env, 0),
    })
}

/// What a branch-ENI pod's DEL removes besides its veth (upstream
/// `TeardownBranchENIPodNetwork`, by the VLAN id prevResult recorded): the VLAN link, the
/// rules at 10 to its table (both modes' layouts, as upstream, since the mode may have changed
/// since ADD), the pod address's 512/1536 rules and its route in the VLAN table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BranchTeardown {
    /// The VLAN link to delete, unless the table is provably another sandbox's.
    pub vlan_link: Option<String>,
    /// Rules to delete.
    pub rules: Vec<Rule>,
    /// Routes to delete (the pod address in the VLAN table).
    pub routes: Vec<Route>,
    /// Why the VLAN link and its table were kept, if they were.
    pub kept: Option<String>,
}

/// What proves a branch-ENI pod's host objects are this sandbox's, read while its host veth
/// still exists: the host veths [`plan_teardown`] proved its own (paired with the sandbox's
/// interface, or carrying the name and MAC prevResult recorded) and the addresses the host
/// routes through them, in any table (main in standard mode, the VLAN table in strict mode).
/// A name proves nothing: every sandbox of a pod computes the same veth name, and the VPC
/// Resource Controller reuses VLAN ids and addresses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BranchProof {
    /// This sandbox's host veths (name, index), present when the proof was read.
    pub veths: Vec<(String, u32)>,
    /// Host-prefix route destinations through those veths.
    pub addresses: Vec<IpNet>,
}

impl BranchProof {
    /// The proof from the veths [`plan_teardown`] proved this sandbox's and the host's routes
    /// (every table).
    #[must_use]
    pub fn of(own_veths: &[HostLink], routes: &[Route]) -> Self {
        let veths: Vec<(String, u32)> = own_veths
            .iter()
            .map(|l| (l.name.clone(), l.index))
            .collect();
        let mut addresses = Vec::new();
        for r in routes {
            if r.dst.prefix_len() == r.dst.max_prefix_len()
                && r.oif.is_some_and(|i| veths.iter().any(|(_, v)| *v == i))
                && !addresses.contains(&r.dst)
            {
                addresses.push(r.dst);
            }
        }
        Self { veths, addresses }
    }

    /// Whether nothing proves any object this sandbox's (its veth is gone or another
    /// sandbox's).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.veths.is_empty()
    }

    fn names_veth(&self, name: &str) -> bool {
        self.veths.iter().any(|(n, _)| n == name)
    }
}

/// Plans a branch-ENI pod's teardown from the host's rules and routes. The VLAN id comes from
/// prevResult (or ipamd's answer without one), and VLAN ids, veth names and addresses are
/// reused for other sandboxes (a StatefulSet pod re-created under its name gets the same veth
/// name, and often the same VLAN id): only what `proof` shows is this sandbox's goes.
/// - Nothing proven (the sandbox's veth is gone, or the one under its name is another
///   sandbox's): nothing is touched; the VLAN link and rules are whoever's wired them last.
/// - A rule or route of the VLAN table naming something else (an `iif` that is neither the
///   VLAN link nor a proven veth, a `from` address not proven, a route through another link):
///   another sandbox owns the VLAN now, and only the rules naming the proven veths and
///   addresses go.
/// - Otherwise the VLAN link, every rule at 10 to its table, the proven addresses' 512/1536
///   rules and their routes in the VLAN table go.
#[must_use]
pub fn plan_branch_teardown(
    vlan_id: u16,
    proof: &BranchProof,
    rules: &[Rule],
    routes: &[Route],
) -> BranchTeardown {
    let table = branch_route_table(vlan_id);
    let vlan_link = branch_vlan_link_name(vlan_id);
    let mut plan = BranchTeardown::default();
    if proof.is_empty() {
        plan.kept = Some(format!(
            "no host veth proven this sandbox's: {vlan_link}, table {table} and their rules may be another sandbox's"
        ));
        return plan;
    }
    let addresses = &proof.addresses;
    // The VLAN table's own routes: the default route via the subnet gateway and the gateway's
    // link route.
    let gateways: Vec<IpAddr> = routes
        .iter()
        .filter(|r| r.table == table)
        .filter_map(|r| r.gateway)
        .collect();
    let foreign_rule = rules.iter().find(|r| {
        r.table == table
            && ((r.priority == VLAN_RULE_PRIORITY
                && r.iif
                    .as_ref()
                    .is_some_and(|i| *i != vlan_link && !proof.names_veth(i)))
                || (r.priority == FROM_POD_RULE_PRIORITY
                    && r.src.is_some_and(|s| !addresses.contains(&s))))
    });
    let foreign_route = routes.iter().find(|r| {
        r.table == table
            && r.dst.prefix_len() == r.dst.max_prefix_len()
            && r.gateway.is_none()
            && !addresses.contains(&r.dst)
            && !gateways.contains(&r.dst.addr())
            && r.oif
                .is_some_and(|i| !proof.veths.iter().any(|(_, v)| *v == i))
    });
    let ours = |r: &Rule| {
        (r.priority == VLAN_RULE_PRIORITY
            && r.table == table
            && r.iif.as_ref().is_some_and(|i| proof.names_veth(i)))
            || (r.priority == TO_POD_RULE_PRIORITY
                && r.src.is_none()
                && r.dst.is_some_and(|d| addresses.contains(&d)))
            || (r.priority == FROM_POD_RULE_PRIORITY
                && r.src.is_some_and(|s| addresses.contains(&s)))
    };
    if let Some(r) = foreign_rule {
        plan.kept = Some(format!(
            "table {table} is another sandbox's ({})",
            dataplane::netlink::describe_rule(r)
        ));
        plan.rules = rules.iter().filter(|r| ours(r)).cloned().collect();
    } else if let Some(r) = foreign_route {
        plan.kept = Some(format!(
            "table {table} routes {} through another link (index {:?})",
            r.dst, r.oif
        ));
        plan.rules = rules.iter().filter(|r| ours(r)).cloned().collect();
    } else {
        plan.vlan_link = Some(vlan_link);
        plan.rules = rules
            .iter()
            .filter(|r| (r.priority == VLAN_RULE_PRIORITY && r.table == table) || ours(r))
            .cloned()
            .collect();
    }
    plan.routes = routes
        .iter()
        .filter(|r| r.table == table && addresses.contains(&r.dst))
        .copied()
        .collect();
    plan
}

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
    /// A multi-NIC pod's further interfaces that still exist in `CNI_NETNS`, by the name of
    /// the host veth they pair with (`mNicIf<i>` ↔ [`host_veth_at`] `i`).
    pub more_pod_ends: Vec<(String, PodEnd)>,
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
    /// `from <ip>` at 1536, including the per-VPC-CIDR rules of old upstream versions).
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

/// The most interfaces a multi-NIC pod may have beyond its first: one per network card after
/// card 0 (upstream's table: 32 cards on `p5.48xlarge`).
pub const MAX_EXTRA_INTERFACES: u32 = 31;

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

/// A multi-NIC pod's interfaces beyond the first, as prevResult lists them (host veths after
/// the first; upstream counts `(len(interfaces) - 1) / 2`).
#[must_use]
pub fn prev_extra_interfaces(conf: &NetConf) -> u32 {
    u32::try_from(prev_host_interfaces(conf).count().saturating_sub(1)).unwrap_or(0)
}

/// Every host interface prevResult lists (one per pod interface): those without a `sandbox`,
/// but the marker (a branch-ENI pod's has none, as upstream's).
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
/// - a host veth only when it is provably this sandbox's ([`is_own_veth`]); another sandbox
///   of the same pod computes the same name;
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
            .more_pod_ends
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
    use super::*;
    use crate::spec::netconf::NetConf;
    use ipamd_proto::rpc::IpAllocationMetadata;
    use std::collections::HashMap;

    pub(crate) fn mk_env(k8s: bool) -> CniEnv {
        let mut v: HashMap<String, String> = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/var/run/netns/p"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        if k8s {
            v.insert(
                "CNI_ARGS".into(),
                "K8S_POD_NAME=nginx;K8S_POD_NAMESPACE=default".into(),
            );
        }
        CniEnv::from_vars(&v).unwrap()
    }

    fn mk_conf() -> NetConf {
        NetConf::parse(br#"{"cniVersion":"1.0.0","name":"aws-cni","mtu":"9001"}"#).unwrap()
    }

    fn mk_reply(v4: &str, v6: &str, device: i32, table: i32) -> AddNetworkReply {
        AddNetworkReply {
            success: true,
            ip_allocation_metadata: vec![IpAllocationMetadata {
                i_pv4_addr: v4.into(),
                i_pv6_addr: v6.into(),
                device_number: device,
                route_table_id: table,
            }],
            vp_cv4_cid_rs: vec!["198.18.0.0/16".into()],
            ..Default::default()
        }
    }

    /// A multi-NIC reply (upstream `rpc_handler.go`: one `IPAllocationMetadata` per network
    /// card) → one interface per entry, as upstream's `cni.go` `add` and
    /// `driver.createVethPairContext.run` wire them: interface `i` > 0 is `mNicIf<i>`
    /// (`GenerateContainerVethName`), its host veth `GeneratePodHostVethName(prefix, ns,
    /// name, i)` = sha1 of `<ns>.<name>.<i>`, gateway `169.254.1.<i+1>`
    /// (`CalculatePodIPv4GatewayIP`), routes in pod table `i` with `from <ip> lookup i` at
    /// priority 1 (`FromInterfaceRulePriority`); on the host `to <ip>` at 512 and
    /// `from <ip> lookup <RouteTableId>` at 1536.
    #[test]
    fn multi_nic_reply_wires_one_interface_per_card() {
        let mut reply = mk_reply("198.18.0.10", "", 0, 254);
        for (ip, table) in [("198.19.0.11", 10100), ("198.20.0.12", 10201)] {
            reply.ip_allocation_metadata.push(IpAllocationMetadata {
                i_pv4_addr: ip.into(),
                i_pv6_addr: String::new(),
                device_number: table % 100,
                route_table_id: table,
            });
        }
        let plan = plan_add(&reply, &mk_conf(), &mk_env(true)).unwrap();
        assert_eq!(plan.host_veth, "enic440f455693");
        assert_eq!(plan.pod_table, MAIN_TABLE);
        assert!(plan.pod_rules.is_empty());
        assert_eq!(plan.more.len(), 2);
        let one = &plan.more[0];
        assert_eq!(one.host_veth, "enie48ae9c2f34");
        assert_eq!(one.container_ifname, "mNicIf1");
        assert_eq!(one.gateway.to_string(), "169.254.1.2");
        assert_eq!(one.pod_table, 1);
        assert_eq!(
            one.pod_rules,
            [Rule {
                src: Some("198.19.0.11/32".parse().unwrap()),
                ..Rule::lookup(Family::V4, 1, 1)
            }]
        );
        assert_eq!(
            one.host_rules,
            [
                Rule {
                    dst: Some("198.19.0.11/32".parse().unwrap()),
                    ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
                },
                Rule {
                    src: Some("198.19.0.11/32".parse().unwrap()),
                    ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, 10100)
                }
            ]
        );
        assert!(one.pod_routes(7).iter().all(|r| r.table == 1));
        let two = &plan.more[1];
        assert_eq!(
            (two.host_veth.as_str(), two.container_ifname.as_str()),
            ("eni1266d167117", "mNicIf2")
        );
        assert_eq!(
            (two.gateway.to_string(), two.route_table),
            ("169.254.1.3".to_owned(), 10201)
        );
        // the result lists every interface pair, then the marker; each address on its
        // container interface (upstream: `containerInterfaceIndex = len(podInterfaces) - 1`)
        let mac = |b: u8| MacAddr([2, 0, 0, 0, 0, b]);
        let r = plan.result_with(
            &[(mac(1), mac(2)), (mac(3), mac(4)), (mac(5), mac(6))],
            "/ns",
        );
        let names: Vec<&str> = r.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "enic440f455693",
                "eth0",
                "enie48ae9c2f34",
                "mNicIf1",
                "eni1266d167117",
                "mNicIf2",
                "dummyc440f455693"
            ]
        );
        let on: Vec<(String, Option<usize>)> = r
            .ips
            .iter()
            .map(|i| (i.address.to_string(), i.interface))
            .collect();
        assert_eq!(
            on,
            [
                ("198.18.0.10/32".to_owned(), Some(1)),
                ("198.19.0.11/32".to_owned(), Some(3)),
                ("198.20.0.12/32".to_owned(), Some(5))
            ]
        );
        assert_eq!(
            r.routes.len(),
            1,
            "only the first interface routes by default"
        );
    }

    /// Several interfaces are IPv4 only: a multi-NIC reply with an IPv6 (or several IPv6
    /// entries) is refused, never wired as one interface in silence.
    /// Issue 38: pod `x`'s interface 1 and pod `x.1`'s first interface have the same host veth
    /// name (upstream's hash of `<ns>.<pod>.<index>`). Each plan names the other, so ADD
    /// refuses a link found under the name instead of deleting it; a pod whose name cannot
    /// collide keeps upstream's clean-up of an earlier sandbox's leftover.
    #[test]
    fn multi_nic_veth_names_shared_with_another_pod_are_named() {
        let pod = |name: &str| {
            let mut env = mk_env(true);
            env.k8s.pod_name = name.into();
            env
        };
        let mut reply = mk_reply("198.18.0.10", "", 0, 254);
        reply.ip_allocation_metadata.push(IpAllocationMetadata {
            i_pv4_addr: "198.19.0.11".into(),
            i_pv6_addr: String::new(),
            device_number: 0,
            route_table_id: 10100,
        });
        let x = plan_add(&reply, &mk_conf(), &pod("x")).unwrap();
        let x1 = plan_add(
            &mk_reply("198.18.0.12", "", 0, 254),
            &mk_conf(),
            &pod("x.1"),
        )
        .unwrap();
        assert_eq!(x.more[0].host_veth, x1.host_veth, "the names collide");
        assert_eq!(x.host_veth_shared_with, None);
        assert_eq!(
            x.more[0].host_veth_shared_with.as_deref(),
            Some("pod default/x.1's first interface")
        );
        assert_eq!(
            x1.host_veth_shared_with.as_deref(),
            Some("pod default/x's interface 1")
        );
        for name in ["web-0", "x.0", "x.01", ".1", "x.32", "x.y"] {
            assert_eq!(veth_name_shared_with(&pod(name), 0), None, "{name}");
        }
        let container = mk_env(false);
        assert!(veth_name_shared_with(&container, 1).is_some());
    }

    #[test]
    fn multi_nic_reply_with_ipv6_is_refused() {
        let mut reply = mk_reply("198.18.0.10", "2001:db8::1", 0, 254);
        reply.ip_allocation_metadata.push(IpAllocationMetadata {
            i_pv4_addr: "198.19.0.11".into(),
            route_table_id: 10100,
            ..Default::default()
        });
        assert_eq!(
            plan_add(&reply, &mk_conf(), &mk_env(true)),
            Err(PlanError::MultiNicNotV4(1))
        );
        let mut v6 = mk_reply("", "2001:db8::1", 0, 254);
        v6.ip_allocation_metadata.push(IpAllocationMetadata {
            i_pv6_addr: "2001:db8:1::1".into(),
            route_table_id: 10100,
            ..Default::default()
        });
        assert_eq!(
            plan_add(&v6, &mk_conf(), &mk_env(true)),
            Err(PlanError::MultiNicNotV4(2))
        );
    }

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
            more_pod_ends: vec![(
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

    #[test]
    fn primary_eni_pod_gets_only_the_to_rule() {
        let plan = plan_add(
            &mk_reply("198.18.0.10", "", 0, 254),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        assert_eq!(plan.host_veth, "enic440f455693");
        assert_eq!(plan.address.to_string(), "198.18.0.10/32");
        assert_eq!(plan.gateway, IpAddr::V4(POD_GATEWAY_V4));
        assert_eq!(plan.route_table, MAIN_TABLE);
        assert_eq!(plan.host_rules.len(), 1);
        assert_eq!(plan.host_rules[0].priority, TO_POD_RULE_PRIORITY);
        assert_eq!(plan.host_rules[0].dst, Some(plan.address));
        assert!(plan.pod_sysctls.is_empty());
        assert_eq!(
            plan.host_sysctls[0].0,
            "net/ipv6/conf/enic440f455693/accept_ra"
        );
    }

    #[test]
    fn secondary_eni_pod_gets_from_rule_to_its_table() {
        let plan = plan_add(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        assert_eq!(plan.route_table, 2);
        let from = &plan.host_rules[1];
        assert_eq!(from.priority, FROM_POD_RULE_PRIORITY);
        assert_eq!(from.src, Some(plan.address));
        assert_eq!(from.dst, None);
        assert_eq!(from.table, 2);
        // Table id absent: derived from the device number.
        let plan = plan_add(
            &mk_reply("198.18.1.10", "", 2, 0),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        assert_eq!(plan.route_table, 3);
    }

    #[test]
    fn ipv6_pod() {
        let plan = plan_add(
            &mk_reply("", "2001:db8::5", 0, 0),
            &mk_conf(),
            &mk_env(false),
        )
        .unwrap();
        assert_eq!(plan.address.to_string(), "2001:db8::5/128");
        assert_eq!(plan.gateway, IpAddr::V6(POD_GATEWAY_V6));
        assert_eq!(plan.pod_sysctls.len(), 2);
        assert_eq!(plan.host_rules[0].family, Family::V6);
        // No K8S args: name from the container id.
        assert_eq!(
            plan.host_veth,
            host_veth_name_for_container("eni", "c1", "eth0")
        );
    }

    /// Dual-stack: an IPv4 and an IPv6 in one allocation, or in two: both on eth0 (IPv4
    /// first), both gateways, both host routes and rules, both in the result.
    #[test]
    fn dual_stack_reply_wires_both_families_on_one_interface() {
        let one = mk_reply("198.18.1.10", "fd00:198:18::10", 1, 2);
        let mut two = mk_reply("198.18.1.10", "", 1, 2);
        two.ip_allocation_metadata.push(IpAllocationMetadata {
            i_pv4_addr: String::new(),
            i_pv6_addr: "fd00:198:18::10".into(),
            device_number: 0,
            route_table_id: 0,
        });
        for (reply, v6_table) in [(one, 2), (two, MAIN_TABLE)] {
            let plan = plan_add(&reply, &mk_conf(), &mk_env(true)).unwrap();
            let addrs = plan.addresses();
            assert_eq!(addrs.len(), 2);
            assert_eq!(addrs[0].address.to_string(), "198.18.1.10/32");
            assert_eq!(addrs[1].address.to_string(), "fd00:198:18::10/128");
            assert_eq!(addrs[1].gateway, IpAddr::V6(POD_GATEWAY_V6));
            assert_eq!(addrs[1].route_table, v6_table);
            assert_eq!(plan.pod_routes(3).len(), 4);
            assert_eq!(
                plan.gateway_neighbours(3, MacAddr([2, 0, 0, 0, 0, 1]))
                    .len(),
                2
            );
            assert_eq!(
                plan.host_routes(9)
                    .iter()
                    .map(|r| r.dst.to_string())
                    .collect::<Vec<_>>(),
                ["198.18.1.10/32", "fd00:198:18::10/128"]
            );
            // IPv6 enabled in the pod although the primary address is IPv4.
            assert_eq!(plan.pod_sysctls.len(), 2);
            let to_rules = plan
                .host_rules
                .iter()
                .filter(|r| r.priority == TO_POD_RULE_PRIORITY)
                .count();
            assert_eq!(to_rules, 2);
            let from_v6 = plan
                .host_rules
                .iter()
                .any(|r| r.priority == FROM_POD_RULE_PRIORITY && r.family == Family::V6);
            assert_eq!(from_v6, v6_table != MAIN_TABLE);
            let r = plan.result(
                MacAddr([2, 0, 0, 0, 0, 1]),
                MacAddr([2, 0, 0, 0, 0, 2]),
                "/ns",
            );
            assert_eq!(r.ips.len(), 2);
            assert_eq!(r.routes.len(), 2);
            assert_eq!(r.routes[1].dst.to_string(), "::/0");
            assert!(r.ips.iter().all(|i| i.interface == Some(1)));
        }
        // Too small an MTU for the IPv6 half.
        let mut conf = mk_conf();
        conf.mtu = 1200;
        assert_eq!(
            plan_add(
                &mk_reply("198.18.1.10", "fd00:198:18::10", 0, 0),
                &conf,
                &mk_env(true)
            ),
            Err(PlanError::MtuTooSmallForV6(1200))
        );
    }

    #[test]
    fn stale_from_rules_of_the_address_are_the_other_tables() {
        let rule = |src: &str, table: u32| Rule {
            src: Some(src.parse().unwrap()),
            ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, table)
        };
        let existing = [
            rule("198.18.1.10/32", 3),
            rule("198.18.1.10/32", 2),
            rule("198.18.1.11/32", 3),
            Rule {
                dst: Some("198.18.1.10/32".parse().unwrap()),
                ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
            },
        ];
        // Secondary-ENI pod (table 2): only the other table's rule for its address is stale.
        let plan = plan_add(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        assert_eq!(plan.stale_rules(&existing), vec![rule("198.18.1.10/32", 3)]);
        // Primary-ENI pod: every `from` rule of its address is stale.
        let plan = plan_add(
            &mk_reply("198.18.1.10", "", 0, 0),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        assert_eq!(
            plan.stale_rules(&existing),
            vec![rule("198.18.1.10/32", 3), rule("198.18.1.10/32", 2)]
        );
    }

    #[test]
    fn refusals() {
        let conf = mk_conf();
        let env = mk_env(true);
        let mut r = mk_reply("198.18.0.1", "", 0, 0);
        r.success = false;
        assert_eq!(plan_add(&r, &conf, &env), Err(PlanError::NotAssigned));
        let mut r = mk_reply("198.18.0.1", "", 0, 0);
        r.pod_vlan_id = 7;
        assert!(matches!(
            plan_add(&r, &conf, &env),
            Err(PlanError::BadBranchReply { vlan: 7, .. })
        ));
        assert_eq!(
            plan_add(&mk_reply("", "", 0, 0), &conf, &env),
            Err(PlanError::NoAddress)
        );
        assert!(matches!(
            plan_add(&mk_reply("300.1.1.1", "", 0, 0), &conf, &env),
            Err(PlanError::BadAddress(_))
        ));
    }

    fn branch_reply(vlan: i32) -> AddNetworkReply {
        AddNetworkReply {
            success: true,
            ip_allocation_metadata: vec![IpAllocationMetadata {
                i_pv4_addr: "198.18.8.10".into(),
                i_pv6_addr: String::new(),
                device_number: -1,
                route_table_id: 0,
            }],
            pod_vlan_id: vlan,
            pod_enimac: "02:aa:00:00:00:05".into(),
            pod_eni_subnet_gw: "198.18.8.1".into(),
            parent_if_index: 3,
            ..Default::default()
        }
    }

    /// upstream driver.go `SetupBranchENIPodNetwork`: strict = `iif vlan.eth.<id>` and
    /// `iif <vlan veth>` at 10 to table <id>+100 with the host route there; standard = the
    /// `eni` veth, 512/1536 rules and the host route in main. The result's marker carries the
    /// VLAN id, its address the subnet gateway.
    #[test]
    fn branch_pod_plans_per_enforcing_mode() {
        let strict = plan_add(&branch_reply(5), &mk_conf(), &mk_env(true)).unwrap();
        let b = strict.branch.clone().unwrap();
        assert_eq!((b.vlan_id, b.table, b.parent_index), (5, 105, 3));
        assert_eq!(b.vlan_link, "vlan.eth.5");
        assert!(strict.host_veth.starts_with("vlan"), "{}", strict.host_veth);
        assert_eq!(strict.host_route_table, 105);
        let iifs: Vec<_> = strict
            .host_rules
            .iter()
            .map(|r| (r.priority, r.iif.clone().unwrap_or_default(), r.table))
            .collect();
        assert_eq!(
            iifs,
            [
                (10, "vlan.eth.5".to_owned(), 105),
                (10, strict.host_veth.clone(), 105)
            ]
        );
        assert_eq!(b.routes(7)[1].gateway, Some("198.18.8.1".parse().unwrap()));
        let r = strict.result(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            "/ns",
        );
        assert_eq!(
            r.interfaces[2].mac, "5",
            "upstream's spelling for kubelet's pods"
        );
        assert_eq!(r.interfaces[2].sandbox, None);
        assert_eq!(r.ips[0].gateway, Some("198.18.8.1".parse().unwrap()));
        assert_eq!(marker_vlan(&r), Some(5));

        let mut conf = mk_conf();
        conf.pod_sg_enforcing_mode = SgEnforcingMode::Standard;
        let standard = plan_add(&branch_reply(5), &conf, &mk_env(true)).unwrap();
        assert!(standard.host_veth.starts_with("eni"));
        assert_eq!(standard.host_route_table, MAIN_TABLE);
        let rules: Vec<_> = standard
            .host_rules
            .iter()
            .map(|r| (r.priority, r.table, r.src.is_some(), r.dst.is_some()))
            .collect();
        // The `from` rule to the VLAN table first: ipamd's stale-rule prune takes a `to` rule
        // without it for a regular pod's leftover (H7, issue 38).
        assert_eq!(
            rules,
            [(1536, 105, true, false), (512, MAIN_TABLE, false, true)]
        );

        // Refused: no trunk index, a bad MAC, VLAN 0 never reaches here, 4095 is out of range.
        let mut bad = branch_reply(5);
        bad.parent_if_index = 0;
        assert!(matches!(
            plan_add(&bad, &conf, &mk_env(true)),
            Err(PlanError::BadBranchReply { .. })
        ));
        let mut bad = branch_reply(5);
        bad.pod_enimac = "nope".into();
        assert!(matches!(
            plan_add(&bad, &conf, &mk_env(true)),
            Err(PlanError::BadBranchReply { .. })
        ));
        assert!(matches!(
            plan_add(&branch_reply(4095), &conf, &mk_env(true)),
            Err(PlanError::BadBranchReply { .. })
        ));
    }

    /// Upstream writes the VLAN id as a bare number, we MAC-shaped: DEL reads both.
    #[test]
    fn marker_vlan_reads_both_spellings() {
        let with = |mac: &str| CniResult {
            interfaces: vec![Interface {
                name: "dummyabc".into(),
                mac: mac.into(),
                sandbox: None,
            }],
            ips: Vec::new(),
            routes: Vec::new(),
        };
        assert_eq!(marker_vlan(&with("7")), Some(7));
        assert_eq!(marker_vlan(&with("0")), Some(0));
        assert_eq!(marker_vlan(&with("00:00:00:00:0f:a0")), Some(4000));
        assert_eq!(marker_vlan(&with("02:00:00:00:00:01")), None);
    }

    /// A strict-mode branch pod's host as the plugin wired it: `vlan.eth.5` (index 20) with
    /// table 105's gateway and default routes, the pod's `/32` in table 105 through its veth
    /// `veth` (index `veth_index`), and `iif` rules at 10 for the VLAN link and `veth`.
    fn strict_branch_host(veth: &str, veth_index: u32, pod: &str) -> (Vec<Rule>, Vec<Route>) {
        let iif = |name: &str| Rule {
            iif: Some(name.into()),
            ..Rule::lookup(Family::V4, VLAN_RULE_PRIORITY, 105)
        };
        let gw: IpAddr = "198.18.8.1".parse().unwrap();
        let routes = vec![
            Route {
                dst: IpNet::from(gw),
                gateway: None,
                oif: Some(20),
                table: 105,
                scope: Scope::Link,
            },
            Route {
                dst: "0.0.0.0/0".parse().unwrap(),
                gateway: Some(gw),
                oif: Some(20),
                table: 105,
                scope: Scope::Universe,
            },
            Route {
                dst: pod.parse().unwrap(),
                gateway: None,
                oif: Some(veth_index),
                table: 105,
                scope: Scope::Link,
            },
        ];
        (vec![iif("vlan.eth.5"), iif(veth)], routes)
    }

    fn link(name: &str, index: u32) -> HostLink {
        HostLink {
            index,
            name: name.into(),
            mac: Some(MacAddr([2, 0, 0, 0, 0, 9])),
            peer_index: Some(2),
        }
    }

    /// This sandbox's veth is proven (paired with its interface): the VLAN link, every rule at
    /// 10 to table 105 and the pod's route there go. A rule naming another veth, or a route
    /// in table 105 through another link, is another sandbox's VLAN: only this sandbox's own
    /// rules and route go, the link stays.
    #[test]
    fn branch_teardown_keeps_a_vlan_another_sandbox_owns() {
        let (rules, routes) = strict_branch_host("vlanaaa", 9, "198.18.8.10/32");
        let proof = BranchProof::of(&[link("vlanaaa", 9)], &routes);
        assert_eq!(
            proof.addresses,
            vec!["198.18.8.10/32".parse::<IpNet>().unwrap()]
        );
        let plan = plan_branch_teardown(5, &proof, &rules, &routes);
        assert_eq!(plan.vlan_link.as_deref(), Some("vlan.eth.5"));
        assert_eq!(plan.rules, rules);
        assert_eq!(plan.routes, vec![routes[2]]);
        assert_eq!(plan.kept, None);

        // A rule naming another veth: that sandbox has VLAN 5 now.
        let mut other = rules.clone();
        other.push(Rule {
            iif: Some("vlanbbb".into()),
            ..Rule::lookup(Family::V4, VLAN_RULE_PRIORITY, 105)
        });
        let plan = plan_branch_teardown(5, &proof, &other, &routes);
        assert_eq!(plan.vlan_link, None);
        assert_eq!(plan.rules, vec![rules[1].clone()]);
        assert_eq!(plan.routes, vec![routes[2]]);
        assert!(plan.kept.is_some());

        // A route in table 105 through another link (an ADD between its route and its rule).
        let mut other = routes.clone();
        other.push(Route {
            dst: "198.18.8.77/32".parse().unwrap(),
            oif: Some(33),
            ..routes[2]
        });
        let plan = plan_branch_teardown(5, &proof, &rules, &other);
        assert_eq!(plan.vlan_link, None);
        assert_eq!(plan.rules, vec![rules[1].clone()]);
        assert!(plan.kept.is_some());
    }

    /// A branch pod's ADD takes its VLAN's table over: every rule into table 105 at 10 or
    /// 1536 (an earlier holder of VLAN 5 whose DEL could not prove them its own) and its own
    /// name's `iif` rule into any table go; other tables' rules and the 512 rules stay.
    #[test]
    fn branch_add_takes_the_vlan_table_over_from_stale_rules() {
        let mut conf = mk_conf();
        conf.pod_sg_enforcing_mode = SgEnforcingMode::Standard;
        let plan = plan_add(&branch_reply(5), &conf, &mk_env(true)).unwrap();
        let b = plan.branch.clone().unwrap();
        let rule = |prio: u32, table: u32, iif: Option<&str>, src: Option<&str>| Rule {
            iif: iif.map(Into::into),
            src: src.map(|s| s.parse().unwrap()),
            ..Rule::lookup(Family::V4, prio, table)
        };
        let stale = [
            rule(VLAN_RULE_PRIORITY, 105, Some("vlan.eth.5"), None),
            rule(VLAN_RULE_PRIORITY, 105, Some("vlanold"), None),
            rule(VLAN_RULE_PRIORITY, 106, Some(&plan.host_veth), None),
            rule(FROM_POD_RULE_PRIORITY, 105, None, Some("198.18.8.9/32")),
        ];
        let kept = [
            rule(VLAN_RULE_PRIORITY, 106, Some("vlan.eth.6"), None),
            rule(FROM_POD_RULE_PRIORITY, 106, None, Some("198.18.8.9/32")),
            rule(TO_POD_RULE_PRIORITY, MAIN_TABLE, None, None),
        ];
        for r in &stale {
            assert!(b.is_stale_rule(r, &plan.host_veth), "{r:?}");
        }
        for r in &kept {
            assert!(!b.is_stale_rule(r, &plan.host_veth), "{r:?}");
        }
    }

    /// H5 (issue 38): a StatefulSet pod re-created under its name is wired on the same veth
    /// name and, when the controller reuses the VLAN id, the same `vlan.eth.5` and table 105.
    /// The old sandbox's late DEL finds that veth under its name, but neither paired with its
    /// interface (gone) nor with the MAC its prevResult recorded: nothing proves anything
    /// this sandbox's, so the new pod's VLAN link, rules and route all stay (and its network
    /// policy: the veth is another sandbox's). The old code decided by the name and deleted
    /// them: the new pod's egress then left through the node's eth0, outside its groups.
    #[test]
    fn late_del_of_an_old_sandbox_keeps_the_vlan_of_the_pod_recreated_under_its_name() {
        let env = mk_env(true);
        let new_pod = plan_add(&branch_reply(5), &mk_conf(), &env).unwrap();
        let old_sandbox = new_pod.result_with(
            &[(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]))],
            "/var/run/netns/old",
        );
        let mut conf = mk_conf();
        conf.prev_result = Some(old_sandbox);
        // The new sandbox's veth: same name, another MAC, paired with an interface elsewhere.
        let (rules, routes) = strict_branch_host(&new_pod.host_veth, 9, "198.18.8.10/32");
        let view = TeardownView {
            host_links: vec![link(&new_pod.host_veth, 9)],
            pod_end: None,
            more_pod_ends: Vec::new(),
            host_routes: Vec::new(),
        };
        let plan = plan_teardown(&conf, &env, &IpamdRelease::NotAskedYet, &view);
        assert!(plan.host_veths.is_empty(), "{plan:?}");
        assert_eq!(plan.foreign_veths.len(), 1);
        assert!(plan.addresses.is_empty());
        let proof = BranchProof::of(&plan.host_veths, &routes);
        let branch = plan_branch_teardown(5, &proof, &rules, &routes);
        assert_eq!(branch.vlan_link, None, "{branch:?}");
        assert!(branch.rules.is_empty(), "{branch:?}");
        assert!(branch.routes.is_empty(), "{branch:?}");
        assert!(branch.kept.is_some());

        // The same DEL while its own veth is still there (paired with its interface): all of
        // VLAN 5 is its own.
        let view = TeardownView {
            host_links: vec![link(&new_pod.host_veth, 9)],
            pod_end: Some(PodEnd {
                index: 2,
                peer_index: Some(9),
            }),
            more_pod_ends: Vec::new(),
            host_routes: Vec::new(),
        };
        let plan = plan_teardown(&conf, &env, &IpamdRelease::NotAskedYet, &view);
        let proof = BranchProof::of(&plan.host_veths, &routes);
        let branch = plan_branch_teardown(5, &proof, &rules, &routes);
        assert_eq!(branch.vlan_link.as_deref(), Some("vlan.eth.5"));
        assert_eq!(branch.rules.len(), 2);
    }

    /// H6 (issue 38): prevResult's address is no proof. A standard-mode branch pod's old
    /// sandbox (VLAN 5, 198.18.8.10) is torn down while another pod holds 198.18.8.10 now
    /// (routed through its veth, index 12, with its 512/1536 rules to its VLAN 6): those rules
    /// stay. Only the address routed through this sandbox's own veth (198.18.8.11) goes.
    #[test]
    fn branch_del_removes_only_the_rules_of_addresses_routed_through_its_own_veth() {
        let mut conf = mk_conf();
        conf.pod_sg_enforcing_mode = SgEnforcingMode::Standard;
        let env = mk_env(true);
        let old = plan_add(&branch_reply(5), &conf, &env).unwrap();
        let own_mac = MacAddr([2, 0, 0, 0, 0, 1]);
        let mut prev = old.result_with(&[(own_mac, MacAddr([2, 0, 0, 0, 0, 2]))], "/ns");
        // prevResult names .10; this sandbox's veth routes .11 (say a resync re-wired it).
        assert_eq!(prev.ips[0].address.addr().to_string(), "198.18.8.10");
        conf.prev_result = Some(prev.clone());
        let rules_of = |ip: &str, table: u32| {
            let a: IpNet = format!("{ip}/32").parse().unwrap();
            vec![
                Rule {
                    dst: Some(a),
                    ..Rule::lookup(Family::V4, TO_POD_RULE_PRIORITY, MAIN_TABLE)
                },
                Rule {
                    src: Some(a),
                    ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, table)
                },
            ]
        };
        let main_route = |ip: &str, oif: u32| Route {
            dst: format!("{ip}/32").parse().unwrap(),
            gateway: None,
            oif: Some(oif),
            table: MAIN_TABLE,
            scope: Scope::Link,
        };
        let mut rules = rules_of("198.18.8.10", 106);
        rules.extend(rules_of("198.18.8.11", 105));
        let routes = vec![main_route("198.18.8.10", 12), main_route("198.18.8.11", 9)];
        let mut own = link(&old.host_veth, 9);
        own.mac = Some(own_mac);
        let view = TeardownView {
            host_links: vec![own],
            pod_end: None,
            more_pod_ends: Vec::new(),
            host_routes: routes.clone(),
        };
        let plan = plan_teardown(&conf, &env, &IpamdRelease::NotAskedYet, &view);
        assert_eq!(
            plan.host_veths.len(),
            1,
            "proven by prevResult's name and MAC"
        );
        let proof = BranchProof::of(&plan.host_veths, &routes);
        assert_eq!(
            proof.addresses,
            vec!["198.18.8.11/32".parse::<IpNet>().unwrap()]
        );
        let branch = plan_branch_teardown(5, &proof, &rules, &routes);
        assert_eq!(branch.rules, rules_of("198.18.8.11", 105));
        assert_eq!(branch.vlan_link.as_deref(), Some("vlan.eth.5"));
        assert!(
            !plan.addresses.contains(&"198.18.8.10/32".parse().unwrap()),
            "{plan:?}"
        );
        // Nothing proven (the veth is another sandbox's): no rule at all goes.
        prev.interfaces[0].mac = "02:00:00:00:00:99".into();
        conf.prev_result = Some(prev);
        let plan = plan_teardown(&conf, &env, &IpamdRelease::NotAskedYet, &view);
        let proof = BranchProof::of(&plan.host_veths, &routes);
        let branch = plan_branch_teardown(5, &proof, &rules, &routes);
        assert!(
            branch.rules.is_empty() && branch.vlan_link.is_none(),
            "{branch:?}"
        );
    }

    #[test]
    fn result_has_marker_interface() {
        let plan = plan_add(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(true),
        )
        .unwrap();
        let r = plan.result(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            "/ns",
        );
        assert_eq!(r.interfaces.len(), 3);
        assert_eq!(r.interfaces[2].name, "dummyc440f455693");
        // upstream's Atoi-able spelling for kubelet's pods (a node rolled back to upstream
        // deletes them), MAC-shaped without a pod identity (podman parses MACs)
        assert_eq!(r.interfaces[2].mac, "0");
        assert_eq!(r.interfaces[2].sandbox.as_deref(), Some("1"));
        assert_eq!(r.ips[0].interface, Some(1));
        assert_eq!(marker_vlan(&r), Some(0));
        let podman = plan_add(
            &mk_reply("198.18.1.10", "", 1, 2),
            &mk_conf(),
            &mk_env(false),
        )
        .unwrap()
        .result(
            MacAddr([2, 0, 0, 0, 0, 1]),
            MacAddr([2, 0, 0, 0, 0, 2]),
            "/ns",
        );
        assert_eq!(podman.interfaces[2].mac, "00:00:00:00:00:00");
        assert_eq!(marker_vlan(&podman), Some(0));
        assert_eq!(
            (
                MarkerSpelling::Decimal.mac(4000),
                MarkerSpelling::MacShaped.mac(4000)
            ),
            ("4000".to_owned(), "00:00:00:00:0f:a0".to_owned())
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
                more_pod_ends: Vec::new(),
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
        let old = plan_add(&mk_reply("198.18.1.10", "", 1, 2), &mk_conf(), &env).unwrap();
        let mut conf = mk_conf();
        conf.prev_result = Some(old.result_with(
            &[(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]))],
            "/var/run/netns/old",
        ));
        let new_pod = plan_add(&branch_reply(5), &mk_conf(), &env).unwrap();
        assert!(new_pod.host_veth.starts_with("vlan"));
        let view = TeardownView {
            host_links: vec![HostLink {
                index: 9,
                name: new_pod.host_veth.clone(),
                mac: Some(MacAddr([2, 0, 0, 0, 0, 9])),
                peer_index: Some(2),
            }],
            ..TeardownView::default()
        };
        assert!(teardown_veth_names(&conf, &env).contains(&new_pod.host_veth));
        let plan = plan_teardown(&conf, &env, &IpamdRelease::UnknownPod, &view);
        assert!(plan.host_veths.is_empty());
        assert_eq!(plan.foreign_veths, view.host_links);
    }

    /// A branch-ENI pod beside multi-NIC support: it has one interface (no `more`, pod table
    /// main, no pod rules); its result, read back as prevResult, counts no further interface
    /// (its marker has no `sandbox`, as upstream's, and is not a host veth), and DEL's names
    /// are its `vlan<hash>` veth and the configured one, nothing of `host_veth_at`.
    #[test]
    fn branch_pod_result_is_one_interface_for_multi_nic_teardown() {
        let env = mk_env(true);
        let plan = plan_add(&branch_reply(5), &mk_conf(), &env).unwrap();
        assert!(plan.more.is_empty());
        assert_eq!(plan.pod_table, MAIN_TABLE);
        assert!(plan.pod_rules.is_empty());
        let mac = |b: u8| MacAddr([2, 0, 0, 0, 0, b]);
        let result = plan.result_with(&[(mac(1), mac(2))], "/ns");
        assert_eq!(result.interfaces.len(), 3);
        assert_eq!(result.interfaces[2].mac, "5");
        assert_eq!(result.ips[0].interface, Some(1));
        assert_eq!(result.ips[0].gateway, Some("198.18.8.1".parse().unwrap()));
        let mut conf = mk_conf();
        conf.prev_result = Some(result);
        assert_eq!(prev_extra_interfaces(&conf), 0);
        assert_eq!(
            teardown_veth_names(&conf, &env),
            vec!["enic440f455693".to_owned(), plan.host_veth.clone()]
        );
        assert!(plan.host_veth.starts_with("vlan"));
    }
}
