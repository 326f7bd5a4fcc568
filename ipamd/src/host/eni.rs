//! Planning of one secondary ENI's host networking: link up with the MTU, its primary address, the
//! per-ENI route table with the gateway routes, rule 32765 from the ENI's primary IP, no main-table
//! subnet route; and the teardown when the ENI is freed; with [`EniSpec::ipv6_routes`], also the
//! table's IPv6 default route via the VPC router's link-local `fe80:ec2::1`. Pure: input is an
//! [`Observed`] snapshot, output a list of [`HostOp`]s. Must not: perform I/O, or touch pod rules
//! other than those of a freed ENI's table.

use std::net::{IpAddr, Ipv4Addr};

use dataplane::conventions::{
    ENI_PRIMARY_IP_RULE_PRIORITY, FROM_POD_RULE_PRIORITY, MAIN_TABLE, TO_POD_RULE_PRIORITY,
    route_table_for,
};
use dataplane::{Address, Family, MacAddr, Route, Rule, Scope};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::ops::{HostOp, Observed};

/// A secondary ENI as the host must see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniSpec {
    /// Hardware address (how the link is found).
    pub mac: MacAddr,
    /// EC2 device number (1.. for secondary ENIs).
    pub device_number: u32,
    /// EC2 network card index.
    pub network_card: u32,
    /// The ENI's primary private IPv4.
    pub primary_ip: Ipv4Addr,
    /// The ENI's subnet.
    pub subnet: Ipv4Net,
    /// Also route IPv6 in the ENI's table: `fe80:ec2::1/128 dev ethX` and
    /// `::/0 via fe80:ec2::1 dev ethX` (dual-stack pods, whose IPv6 comes from this ENI's /80
    /// and whose rule 1536 looks up this table; IPv6 mode).
    pub ipv6_routes: bool,
}

impl EniSpec {
    /// Route table of this ENI ([`route_table_for`]).
    #[must_use]
    pub fn table(&self) -> u32 {
        route_table_for(self.device_number, self.network_card)
    }

    /// The VPC router: subnet base + 1.
    #[must_use]
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet.network()).wrapping_add(1))
    }

    /// Whether this is the primary ENI (device 0 on card 0), which uses `main` and is never
    /// set up here.
    #[must_use]
    pub fn is_primary(&self) -> bool {
        self.table() == MAIN_TABLE
    }

    fn primary_rule(&self) -> Rule {
        Rule {
            src: Some(host_net(IpAddr::V4(self.primary_ip))),
            ..Rule::lookup(Family::V4, ENI_PRIMARY_IP_RULE_PRIORITY, self.table())
        }
    }
}

/// Why an ENI cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EniPlanError {
    /// No link carries the ENI's MAC (not attached yet, or already gone). Retry later.
    #[error("no link with mac {0}")]
    NoLink(MacAddr),
    /// The primary ENI uses the main table and is configured by node setup.
    #[error("eni {0} is the primary eni")]
    Primary(MacAddr),
    /// The ENI's table must route IPv6 but IPv6 is off on its link, and enabling it is a
    /// write to the sysctl tree, which the aws-node container may not do: the privileged init
    /// container sets it (retry once the node is fixed).
    #[error(
        "eni {mac}: IPv6 is disabled on {link} (net.ipv6.conf.{link}.disable_ipv6={value}) and \
         ipamd does not change kernel settings: writing them needs a privileged container, the \
         aws-node container has only NET_ADMIN and NET_RAW and a read-only sysctl tree. The \
         privileged init container aws-vpc-cni-init enables IPv6 on all and new links \
         (net.ipv6.conf.all and default.disable_ipv6=0) when ENABLE_IPv6 or \
         ENABLE_DUAL_STACK_PODS is true in its environment (chart: init.env); run it so, or \
         set net.ipv6.conf.{link}.disable_ipv6=0 on the node"
    )]
    Ipv6Disabled {
        /// The ENI's MAC.
        mac: MacAddr,
        /// Its link's name.
        link: String,
        /// The value read.
        value: String,
    },
}

/// `ip/32` or `ip/128`.
#[must_use]
pub fn host_net(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

/// The route table the node's OS already routes a card > 0 ENI's primary address by (AMIs such as
/// AL2023's configure every interface with a `from <its address> lookup <table>` rule): a rule of
/// another priority than ipamd's own (32765; nor a pod's, 512/1536) from the ENI's primary IP; of
/// several, the first the kernel consults. `None` on card 0 (only cards above 0 are looked at) or
/// when the OS has none: then the table is ipamd's ([`EniSpec::table`]).
#[must_use]
pub fn os_table(eni: &EniSpec, observed: &Observed) -> Option<u32> {
    if eni.network_card == 0 {
        return None;
    }
    let src = Some(host_net(IpAddr::V4(eni.primary_ip)));
    observed
        .rules
        .iter()
        .filter(|r| {
            r.family == Family::V4
                && r.src == src
                && r.dst.is_none()
                && ![
                    ENI_PRIMARY_IP_RULE_PRIORITY,
                    TO_POD_RULE_PRIORITY,
                    FROM_POD_RULE_PRIORITY,
                ]
                .contains(&r.priority)
                && r.table != MAIN_TABLE
        })
        .min_by_key(|r| r.priority)
        .map(|r| r.table)
}

/// The changes that bring the ENI's host networking to the desired state; empty when it
/// already is.
pub fn plan(eni: &EniSpec, mtu: u32, observed: &Observed) -> Result<Vec<HostOp>, EniPlanError> {
    if eni.is_primary() {
        return Err(EniPlanError::Primary(eni.mac));
    }
    let link = observed
        .link_by_mac(eni.mac)
        .ok_or(EniPlanError::NoLink(eni.mac))?;
    let ifindex = link.index;
    let os = os_table(eni, observed);
    let table = os.unwrap_or_else(|| eni.table());
    let subnet = eni.subnet.trunc();
    let mut ops = Vec::new();

    if link.mtu != mtu {
        ops.push(HostOp::SetMtu { ifindex, mtu });
    }
    if !link.up {
        ops.push(HostOp::SetUp { ifindex });
    }

    let address = Address {
        ifindex,
        prefix: IpNet::V4(Ipv4Net::new(eni.primary_ip, subnet.prefix_len()).unwrap_or(subnet)),
    };
    let adding_address = !observed.addresses.contains(&address);
    if adding_address {
        ops.push(HostOp::AddAddress(address));
    }

    let gw = eni.gateway();
    let mut wanted = vec![
        Route {
            dst: host_net(IpAddr::V4(gw)),
            gateway: None,
            oif: Some(ifindex),
            table,
            scope: Scope::Link,
        },
        Route {
            dst: IpNet::V4(Ipv4Net::default()),
            gateway: Some(IpAddr::V4(gw)),
            oif: Some(ifindex),
            table,
            scope: Scope::Universe,
        },
    ];
    if eni.ipv6_routes {
        wanted.extend(ipv6_routes(ifindex, table));
    }
    let in_table: Vec<&Route> = observed
        .routes
        .iter()
        .filter(|r| r.table == table)
        .collect();
    // Stale routes first (a replaced destination is not stale: replace overwrites it). The OS's
    // table keeps the OS's other routes (only the two gateway routes are replaced).
    for stale in in_table
        .iter()
        .filter(|_| os.is_none())
        .filter(|r| !wanted.iter().any(|w| w.dst == r.dst))
    {
        ops.push(HostOp::DeleteRoute(**stale));
    }
    for want in &wanted {
        if !in_table.contains(&want) {
            ops.push(HostOp::ReplaceRoute(*want));
        }
    }

    // The kernel adds `<subnet> dev ethX` to main when the address is added; the ENI's
    // traffic must use its own table instead.
    let subnet_route = Route {
        dst: IpNet::V4(subnet),
        gateway: None,
        oif: Some(ifindex),
        table: MAIN_TABLE,
        scope: Scope::Link,
    };
    let has_subnet_route = observed
        .routes
        .iter()
        .any(|r| r.table == MAIN_TABLE && r.dst == subnet_route.dst && r.oif == Some(ifindex));
    if has_subnet_route || adding_address {
        ops.push(HostOp::DeleteRoute(subnet_route));
    }

    if os.is_some() {
        // The OS routes the ENI's own address already: no second rule; one of ours from before
        // goes.
        let src = Some(host_net(IpAddr::V4(eni.primary_ip)));
        for r in observed.rules.iter().filter(|r| {
            r.family == Family::V4 && r.priority == ENI_PRIMARY_IP_RULE_PRIORITY && r.src == src
        }) {
            ops.push(HostOp::DeleteRule(r.clone()));
        }
        return Ok(ops);
    }
    let rule = eni.primary_rule();
    let mut have_rule = false;
    for r in observed.rules.iter().filter(|r| {
        r.family == Family::V4
            && r.priority == ENI_PRIMARY_IP_RULE_PRIORITY
            && (r.src == rule.src || r.table == table)
    }) {
        if *r == rule && !have_rule {
            have_rule = true;
        } else {
            // Wrong table, another IP on this table, or a duplicate.
            ops.push(HostOp::DeleteRule(r.clone()));
        }
    }
    if !have_rule {
        ops.push(HostOp::AddRule(rule));
    }
    Ok(ops)
}

/// [`plan`] for a trunk ENI: the same link, address and table, but no rule 32765 for its primary
/// IP, and no rule touched.
pub fn plan_trunk(
    eni: &EniSpec,
    mtu: u32,
    observed: &Observed,
) -> Result<Vec<HostOp>, EniPlanError> {
    Ok(plan(eni, mtu, observed)?
        .into_iter()
        .filter(|op| !matches!(op, HostOp::AddRule(_) | HostOp::DeleteRule(_)))
        .collect())
}

/// The setting to read before routing IPv6 through the ENI's link (the kernel refuses IPv6
/// routes on a link with IPv6 disabled): `(link name, key)` of its `disable_ipv6`, relative to
/// the sysctl tree; `None` when the table routes no IPv6 or the link is not there (planning
/// reports that). ipamd never writes it ([`check_ipv6`]).
#[must_use]
pub fn ipv6_setting(eni: &EniSpec, observed: &Observed) -> Option<(String, String)> {
    if !eni.ipv6_routes {
        return None;
    }
    let link = observed.link_by_mac(eni.mac)?;
    Some((
        link.name.clone(),
        format!("net/ipv6/conf/{}/disable_ipv6", link.name),
    ))
}

/// Whether the ENI's link, whose `disable_ipv6` reads `disable_ipv6`, can carry its IPv6
/// routes: only `0` can. A link attached after the init container ran inherits
/// `net.ipv6.conf.default.disable_ipv6`, which the init container sets to 0 with IPv6 on.
pub fn check_ipv6(eni: &EniSpec, link: &str, disable_ipv6: &str) -> Result<(), EniPlanError> {
    if disable_ipv6.trim() == "0" {
        return Ok(());
    }
    Err(EniPlanError::Ipv6Disabled {
        mac: eni.mac,
        link: link.to_owned(),
        value: disable_ipv6.trim().to_owned(),
    })
}

/// The IPv6 routes of an ENI's table: the gateway on-link, then the default route through it. Scope
/// universe: IPv6 routes have no scope (the kernel reports universe whatever was asked, so asking
/// for it keeps the plan idempotent).
fn ipv6_routes(ifindex: u32, table: u32) -> [Route; 2] {
    let gw = dataplane::conventions::ENI_GATEWAY_V6;
    [
        Route {
            dst: IpNet::V6(Ipv6Net::from(gw)),
            gateway: None,
            oif: Some(ifindex),
            table,
            scope: Scope::Universe,
        },
        Route {
            dst: IpNet::V6(Ipv6Net::default()),
            gateway: Some(IpAddr::V6(gw)),
            oif: Some(ifindex),
            table,
            scope: Scope::Universe,
        },
    ]
}

/// The changes that remove a freed ENI's host state: every rule that looks up its table (pod
/// rules 1536 and rule 32765), rule 32765 from its primary IP, and every route of its table.
/// The link itself is left alone (EC2 detaches it).
#[must_use]
pub fn plan_teardown(eni: &EniSpec, observed: &Observed) -> Vec<HostOp> {
    if eni.is_primary() {
        return Vec::new();
    }
    let src = Some(host_net(IpAddr::V4(eni.primary_ip)));
    if let Some(table) = os_table(eni, observed) {
        // The OS's table and its rule are the OS's: only the pods' rules into it and a rule
        // of ours go.
        return observed
            .rules
            .iter()
            .filter(|r| {
                (r.table == table && r.priority == FROM_POD_RULE_PRIORITY)
                    || (r.priority == ENI_PRIMARY_IP_RULE_PRIORITY && r.src == src)
            })
            .cloned()
            .map(HostOp::DeleteRule)
            .collect();
    }
    let table = eni.table();
    let mut ops: Vec<HostOp> = observed
        .rules
        .iter()
        .filter(|r| {
            r.table == table || (r.priority == ENI_PRIMARY_IP_RULE_PRIORITY && r.src == src)
        })
        .cloned()
        .map(HostOp::DeleteRule)
        .collect();
    ops.extend(
        observed
            .routes
            .iter()
            .filter(|r| r.table == table)
            .copied()
            .map(HostOp::DeleteRoute),
    );
    ops
}

#[cfg(test)]
mod tests {
    use dataplane::Link;

    use super::*;

    const MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0x11]);

    fn eni() -> EniSpec {
        EniSpec {
            mac: MAC,
            device_number: 1,
            network_card: 0,
            primary_ip: Ipv4Addr::new(198, 18, 1, 10),
            subnet: "198.18.1.0/24".parse().unwrap(),
            ipv6_routes: false,
        }
    }

    fn bare() -> Observed {
        Observed {
            links: vec![Link {
                index: 7,
                name: "eth1".into(),
                mac: Some(MAC),
                mtu: 1500,
                up: false,
                kind: Some("veth".into()),
            }],
            ..Observed::default()
        }
    }

    /// What the kernel would look like after applying `ops` (a stateful fake of the few
    /// objects this planner touches).
    fn after(mut o: Observed, ops: &[HostOp]) -> Observed {
        for op in ops {
            match op {
                HostOp::SetMtu { ifindex, mtu } => {
                    o.links
                        .iter_mut()
                        .filter(|l| l.index == *ifindex)
                        .for_each(|l| l.mtu = *mtu);
                }
                HostOp::SetUp { ifindex } => {
                    o.links
                        .iter_mut()
                        .filter(|l| l.index == *ifindex)
                        .for_each(|l| l.up = true);
                }
                HostOp::AddAddress(a) => {
                    o.addresses.push(*a);
                    o.routes.push(Route {
                        dst: a.prefix.trunc(),
                        gateway: None,
                        oif: Some(a.ifindex),
                        table: MAIN_TABLE,
                        scope: Scope::Link,
                    });
                }
                HostOp::ReplaceRoute(r) => {
                    o.routes.retain(|x| !(x.table == r.table && x.dst == r.dst));
                    o.routes.push(*r);
                }
                HostOp::DeleteRoute(r) => o
                    .routes
                    .retain(|x| !(x.table == r.table && x.dst == r.dst && x.oif == r.oif)),
                HostOp::AddRule(r) => o.rules.push(r.clone()),
                HostOp::DeleteRule(r) => {
                    if let Some(i) = o.rules.iter().position(|x| x == r) {
                        o.rules.remove(i);
                    }
                }
            }
        }
        o
    }

    /// upstream `getRouteTableNumberForENI`: on a card above 0, an AMI that configured the
    /// interface (`from <its address> lookup <table>` at its own priority) keeps its table: the
    /// ENI's routes go there, no second rule from its address is added (one of ours from before
    /// goes), the OS's other routes and its rule stay, also at teardown; on card 0 nothing
    /// changes.
    #[test]
    fn a_card_above_0_reuses_the_table_the_os_routes_the_eni_by() {
        let card1 = EniSpec {
            network_card: 1,
            device_number: 0,
            ..eni()
        };
        let src = Some(host_net(IpAddr::V4(card1.primary_ip)));
        let os_rule = Rule {
            src,
            ..Rule::lookup(Family::V4, 10_001, 10_001)
        };
        let os_route = Route {
            dst: "198.18.1.0/24".parse().unwrap(),
            gateway: None,
            oif: Some(7),
            table: 10_001,
            scope: Scope::Link,
        };
        let ours_before = Rule {
            src,
            ..Rule::lookup(Family::V4, ENI_PRIMARY_IP_RULE_PRIORITY, card1.table())
        };
        let mut o = bare();
        o.rules = vec![os_rule.clone(), ours_before.clone()];
        o.routes = vec![os_route];
        assert_eq!(os_table(&card1, &o), Some(10_001));
        let ops = plan(&card1, 9001, &o).unwrap();
        let done = after(o.clone(), &ops);
        assert!(done.rules.contains(&os_rule), "{ops:?}");
        assert!(
            !done.rules.contains(&ours_before),
            "no second rule: {ops:?}"
        );
        assert!(
            !done
                .rules
                .iter()
                .any(|r| r.priority == ENI_PRIMARY_IP_RULE_PRIORITY),
            "{ops:?}"
        );
        assert!(
            done.routes.contains(&os_route),
            "the OS's routes stay: {ops:?}"
        );
        assert!(
            done.routes
                .iter()
                .any(|r| r.table == 10_001 && r.dst == IpNet::V4(Ipv4Net::default())),
            "the default route goes into the OS's table: {ops:?}"
        );
        assert!(!done.routes.iter().any(|r| r.table == card1.table()));
        assert_eq!(plan(&card1, 9001, &done).unwrap(), vec![], "converged");
        // teardown: the pods' rules into the table go, the OS's rule and routes stay
        let pod_rule = Rule {
            src: Some("198.18.1.20/32".parse().unwrap()),
            ..Rule::lookup(Family::V4, FROM_POD_RULE_PRIORITY, 10_001)
        };
        let mut live = done;
        live.rules.push(pod_rule.clone());
        let down = plan_teardown(&card1, &live);
        assert_eq!(down, vec![HostOp::DeleteRule(pod_rule)]);
        // card 0: the formula, whatever rule the OS has
        let mut o0 = bare();
        o0.rules = vec![Rule {
            src: Some(host_net(IpAddr::V4(eni().primary_ip))),
            ..Rule::lookup(Family::V4, 10_002, 10_002)
        }];
        assert_eq!(os_table(&eni(), &o0), None);
    }

    /// A trunk: link, address and table as any ENI, no rule for its primary IP.
    #[test]
    fn trunk_eni_gets_routes_but_no_primary_ip_rule() {
        let ops = plan_trunk(&eni(), 9001, &bare()).unwrap();
        assert!(
            !ops.iter()
                .any(|o| matches!(o, HostOp::AddRule(_) | HostOp::DeleteRule(_))),
            "{ops:?}"
        );
        assert!(ops.iter().any(|o| matches!(o, HostOp::AddAddress(_))));
        let routes = ops
            .iter()
            .filter(|o| matches!(o, HostOp::ReplaceRoute(r) if r.table == eni().table()))
            .count();
        assert_eq!(routes, 2, "{ops:?}");
        let o = after(bare(), &ops);
        assert!(plan_trunk(&eni(), 9001, &o).unwrap().is_empty());
    }

    #[test]
    fn fresh_eni_gets_the_full_layout_and_second_plan_is_empty() {
        let ops = plan(&eni(), 9001, &bare()).unwrap();
        let text: Vec<String> = ops.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            vec![
                "link 7 mtu 9001",
                "link 7 up",
                "add address 198.18.1.10/24 dev 7",
                "replace route 198.18.1.1/32 dev 7 scope link table 2",
                "replace route 0.0.0.0/0 via 198.18.1.1 dev 7 table 2",
                "delete route 198.18.1.0/24 dev 7 scope link table 254",
                "add rule pref 32765 from 198.18.1.10/32 lookup 2",
            ]
        );
        let state = after(bare(), &ops);
        assert_eq!(plan(&eni(), 9001, &state).unwrap(), vec![]);
    }

    #[test]
    fn dual_stack_eni_table_gets_the_ipv6_gateway_routes_and_loses_them_when_off() {
        let v6 = EniSpec {
            ipv6_routes: true,
            ..eni()
        };
        let ops = plan(&v6, 9001, &bare()).unwrap();
        let text: Vec<String> = ops.iter().map(ToString::to_string).collect();
        assert!(
            text.contains(&"replace route fe80:ec2::1/128 dev 7 table 2".to_owned()),
            "{text:?}"
        );
        assert!(
            text.contains(&"replace route ::/0 via fe80:ec2::1 dev 7 table 2".to_owned()),
            "{text:?}"
        );
        // The IPv4 layout is unchanged.
        let v4_only: Vec<HostOp> = plan(&eni(), 9001, &bare()).unwrap();
        assert!(v4_only.iter().all(|op| ops.contains(op)));
        assert_eq!(ops.len(), v4_only.len() + 2);
        let state = after(bare(), &ops);
        assert_eq!(plan(&v6, 9001, &state).unwrap(), vec![]);
        let v6_in_table = |o: &Observed| {
            o.routes
                .iter()
                .filter(|r| r.table == 2 && r.family() == Family::V6)
                .count()
        };
        assert_eq!(v6_in_table(&state), 2);

        // Dual-stack turned off: the IPv6 routes are stale.
        let off = plan(&eni(), 9001, &state).unwrap();
        assert_eq!(off.len(), 2, "{off:?}");
        assert!(off.iter().all(|op| matches!(op, HostOp::DeleteRoute(_))));
        let state_off = after(state.clone(), &off);
        assert_eq!(v6_in_table(&state_off), 0);
        assert_eq!(plan(&eni(), 9001, &state_off).unwrap(), vec![]);

        // IPv6 on the link is read, never written: only 0 lets the set-up go on.
        assert_eq!(
            ipv6_setting(&v6, &bare()),
            Some(("eth1".into(), "net/ipv6/conf/eth1/disable_ipv6".into()))
        );
        assert_eq!(ipv6_setting(&eni(), &bare()), None);
        assert_eq!(check_ipv6(&v6, "eth1", "0\n"), Ok(()));

        // Teardown removes them with the rest of the table.
        let left = after(state.clone(), &plan_teardown(&v6, &state));
        assert!(left.routes.iter().all(|r| r.table != 2));
    }

    /// A link whose IPv6 is off refuses the ENI's set-up with a typed error naming what grants
    /// the missing write (the privileged init container, its settings), not a crash.
    #[test]
    fn ipv6_off_on_the_link_is_refused_naming_the_init_container() {
        let v6 = EniSpec {
            ipv6_routes: true,
            ..eni()
        };
        let err = check_ipv6(&v6, "eth1", "1").unwrap_err();
        assert_eq!(
            err,
            EniPlanError::Ipv6Disabled {
                mac: v6.mac,
                link: "eth1".into(),
                value: "1".into(),
            }
        );
        let text = err.to_string();
        for needed in [
            "net.ipv6.conf.eth1.disable_ipv6=1",
            "privileged",
            "aws-vpc-cni-init",
            "ENABLE_DUAL_STACK_PODS",
            "init.env",
        ] {
            assert!(text.contains(needed), "{needed:?} missing from: {text}");
        }
    }

    #[test]
    fn stale_routes_and_rules_of_an_older_layout_converge() {
        let mut o = after(bare(), &plan(&eni(), 9001, &bare()).unwrap());
        // A stray route in the ENI table, a wrong-table rule for our IP, a duplicate, and the
        // main-table subnet route back.
        let stray = Route {
            dst: "10.99.0.0/16".parse().unwrap(),
            gateway: None,
            oif: Some(7),
            table: 2,
            scope: Scope::Link,
        };
        o.routes.push(stray);
        let wrong = Rule {
            src: Some("198.18.1.10/32".parse().unwrap()),
            ..Rule::lookup(Family::V4, ENI_PRIMARY_IP_RULE_PRIORITY, 5)
        };
        o.rules.push(wrong.clone());
        o.rules.push(eni().primary_rule());
        o.routes.push(Route {
            dst: "198.18.1.0/24".parse().unwrap(),
            gateway: None,
            oif: Some(7),
            table: MAIN_TABLE,
            scope: Scope::Link,
        });
        let ops = plan(&eni(), 9001, &o).unwrap();
        assert!(ops.contains(&HostOp::DeleteRoute(stray)));
        assert!(ops.contains(&HostOp::DeleteRule(wrong)));
        assert!(ops.contains(&HostOp::DeleteRule(eni().primary_rule())));
        assert!(!ops.iter().any(|op| matches!(op, HostOp::AddRule(_))));
        assert_eq!(plan(&eni(), 9001, &after(o, &ops)).unwrap(), vec![]);
    }

    #[test]
    fn table_follows_device_and_card() {
        let e = EniSpec {
            device_number: 2,
            network_card: 1,
            ..eni()
        };
        assert_eq!(e.table(), 10_102);
        assert_eq!(e.gateway(), Ipv4Addr::new(198, 18, 1, 1));
        let primary = EniSpec {
            device_number: 0,
            ..eni()
        };
        assert_eq!(
            plan(&primary, 9001, &bare()),
            Err(EniPlanError::Primary(MAC))
        );
        assert!(plan_teardown(&primary, &bare()).is_empty());
    }

    #[test]
    fn missing_link_is_a_retryable_error() {
        let o = Observed::default();
        assert_eq!(plan(&eni(), 9001, &o), Err(EniPlanError::NoLink(MAC)));
    }

    #[test]
    fn teardown_removes_table_and_rules_only() {
        let mut o = after(bare(), &plan(&eni(), 9001, &bare()).unwrap());
        let pod_rule = Rule {
            src: Some("198.18.1.50/32".parse().unwrap()),
            ..Rule::lookup(Family::V4, 1536, 2)
        };
        let other = Rule {
            src: Some("198.18.2.50/32".parse().unwrap()),
            ..Rule::lookup(Family::V4, 1536, 3)
        };
        o.rules.push(pod_rule);
        o.rules.push(other.clone());
        let ops = plan_teardown(&eni(), &o);
        let left = after(o, &ops);
        assert!(left.routes.iter().all(|r| r.table != 2));
        assert_eq!(left.rules, vec![other]);
        assert!(plan_teardown(&eni(), &left).is_empty());
        // The address and link stay.
        assert_eq!(left.addresses.len(), 1);
    }
}
