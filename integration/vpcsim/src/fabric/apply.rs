//! Applying a plan and building/removing a run's fixed topology (router and internet
//! namespaces, IGW link). The thin layer between `plan::Op` and the kernel; must not decide
//! anything a plan did not say, and must not touch any namespace outside the run.

use super::exec::{self, ExecError};
use super::model::RouteTarget;
use super::names::{
    EC2_ENDPOINT_ADDR, ENI_MTU, IGW_INTERNET_ADDR, IGW_INTERNET_DEV, IGW_PREFIX_LEN,
    IGW_ROUTER_ADDR, IGW_ROUTER_DEV, IGW6_INTERNET_ADDR, IGW6_PREFIX_LEN, IGW6_ROUTER_ADDR,
    IMDS_ADDR, INTERNET_HOST_ADDR, INTERNET_HOST_ADDR6, IPV6_GATEWAY, KUBE_API_ADDR, RunNames,
    SIM_PRIVATE_RANGE,
};
use super::plan::Op;

/// Create the router and internet namespaces and the IGW link between them; the internet
/// namespace routes the simulated private range and every VPC CIDR block (`vpc_blocks`, e.g. a
/// secondary 100.64.0.0/16) back through the IGW link. With `vpc_ipv6` the IGW link also
/// carries IPv6 (the egress-only gateway; its rules come with the reconciled firewall) and the
/// internet namespace gets its IPv6 host and a route to the VPC's /56.
pub fn build_base(
    names: &RunNames,
    vpc_blocks: &[ipnet::Ipv4Net],
    vpc_ipv6: Option<ipnet::Ipv6Net>,
) -> Result<(), ExecError> {
    let router = names.router_ns();
    let inet = names.internet_ns();
    exec::netns_add(&router)?;
    exec::netns_add(&inet)?;
    exec::ip(&router, &["link", "set", "lo", "up"])?;
    exec::ip(&inet, &["link", "set", "lo", "up"])?;
    // new namespaces start from kernel defaults; state them anyway
    exec::sysctl(
        &router,
        &[
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
            "net.ipv4.conf.all.proxy_arp=1",
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.default.send_redirects=0",
            // IPv6: forward, no DAD on the router's own addresses (its fe80::1 on every port is
            // not a duplicate: each port is its own link), no redirects
            "net.ipv6.conf.all.forwarding=1",
            "net.ipv6.conf.default.accept_dad=0",
            "net.ipv6.conf.all.accept_dad=0",
        ],
    )?;
    exec::sysctl(
        &inet,
        &[
            "net.ipv6.conf.default.accept_dad=0",
            "net.ipv6.conf.all.accept_dad=0",
        ],
    )?;
    exec::ip(
        &router,
        &[
            "link",
            "add",
            IGW_ROUTER_DEV,
            "type",
            "veth",
            "peer",
            "name",
            IGW_INTERNET_DEV,
            "netns",
            &inet,
        ],
    )?;
    let r_addr = format!("{IGW_ROUTER_ADDR}/{IGW_PREFIX_LEN}");
    let i_addr = format!("{IGW_INTERNET_ADDR}/{IGW_PREFIX_LEN}");
    exec::ip(&router, &["addr", "add", &r_addr, "dev", IGW_ROUTER_DEV])?;
    exec::ip(&router, &["link", "set", IGW_ROUTER_DEV, "up"])?;
    exec::ip(&inet, &["addr", "add", &i_addr, "dev", IGW_INTERNET_DEV])?;
    exec::ip(
        &inet,
        &[
            "addr",
            "add",
            &format!("{INTERNET_HOST_ADDR}/32"),
            "dev",
            "lo",
        ],
    )?;
    exec::ip(&inet, &["link", "set", IGW_INTERNET_DEV, "up"])?;
    exec::ip(
        &router,
        &[
            "route",
            "add",
            "default",
            "via",
            &IGW_INTERNET_ADDR.to_string(),
            "dev",
            IGW_ROUTER_DEV,
        ],
    )?;
    exec::ip(
        &inet,
        &[
            "route",
            "add",
            SIM_PRIVATE_RANGE,
            "via",
            &IGW_ROUTER_ADDR.to_string(),
        ],
    )?;
    let private: ipnet::Ipv4Net = SIM_PRIVATE_RANGE
        .parse()
        .unwrap_or_else(|_| unreachable!("static CIDR"));
    if let Some(v6) = vpc_ipv6 {
        let r6 = format!("{IGW6_ROUTER_ADDR}/{IGW6_PREFIX_LEN}");
        let i6 = format!("{IGW6_INTERNET_ADDR}/{IGW6_PREFIX_LEN}");
        exec::ip(
            &router,
            &["-6", "addr", "add", &r6, "dev", IGW_ROUTER_DEV, "nodad"],
        )?;
        exec::ip(
            &inet,
            &["-6", "addr", "add", &i6, "dev", IGW_INTERNET_DEV, "nodad"],
        )?;
        exec::ip(
            &inet,
            &[
                "-6",
                "addr",
                "add",
                &format!("{INTERNET_HOST_ADDR6}/128"),
                "dev",
                "lo",
                "nodad",
            ],
        )?;
        exec::ip(
            &router,
            &[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &IGW6_INTERNET_ADDR.to_string(),
                "dev",
                IGW_ROUTER_DEV,
            ],
        )?;
        exec::ip(
            &inet,
            &[
                "-6",
                "route",
                "add",
                &v6.to_string(),
                "via",
                &IGW6_ROUTER_ADDR.to_string(),
            ],
        )?;
    }
    for block in vpc_blocks.iter().filter(|b| !private.contains(*b)) {
        exec::ip(
            &inet,
            &[
                "route",
                "add",
                &block.to_string(),
                "via",
                &IGW_ROUTER_ADDR.to_string(),
            ],
        )?;
    }
    Ok(())
}

/// Apply `ops` in order; stops at the first failure.
pub fn apply(names: &RunNames, ops: &[Op]) -> Result<(), ExecError> {
    let router = names.router_ns();
    for op in ops {
        tracing::debug!(?op, "fabric op");
        apply_one(names, &router, op)?;
    }
    Ok(())
}

fn tolerate_missing(r: Result<String, ExecError>) -> Result<(), ExecError> {
    match r {
        Err(e) if !e.is_missing() => Err(e),
        _ => Ok(()),
    }
}

fn apply_one(names: &RunNames, router: &str, op: &Op) -> Result<(), ExecError> {
    match op {
        Op::DeleteNode { instance_id } => exec::netns_del(&names.node_ns(instance_id)),
        Op::DeletePort { port } => tolerate_missing(exec::ip(router, &["link", "del", port])),
        Op::DeleteBranchPort { port } => tolerate_missing(exec::ip(router, &["link", "del", port])),
        Op::CreateBranchPort {
            trunk_port,
            port,
            vlan_id,
            eni_id,
        } => {
            exec::ip(
                router,
                &[
                    "link",
                    "add",
                    "link",
                    trunk_port,
                    "name",
                    port,
                    "type",
                    "vlan",
                    "id",
                    &vlan_id.to_string(),
                ],
            )?;
            exec::sysctl(router, &[&format!("net.ipv4.neigh.{port}.proxy_delay=0")])?;
            exec::ip(router, &["link", "set", port, "alias", eni_id, "up"]).map(drop)
        }
        Op::DeleteNodeLink { instance_id, name } => tolerate_missing(exec::ip(
            &names.node_ns(instance_id),
            &["link", "del", name],
        )),
        Op::CreateNode { instance_id } => create_node(&names.node_ns(instance_id)),
        Op::CreateEni {
            instance_id,
            eni_id,
            port,
            dev,
            mac,
            primary,
        } => {
            let node = names.node_ns(instance_id);
            let mtu = ENI_MTU.to_string();
            // the node end is born with the ENI's MAC and MTU: nobody in the node ever sees
            // an `ethN` with another MAC
            exec::ip(
                router,
                &[
                    "link", "add", port, "mtu", &mtu, "type", "veth", "peer", "name", dev,
                    "address", mac, "mtu", &mtu, "netns", &node,
                ],
            )?;
            // answer proxy ARP at once (default: up to 0.8 s random delay; there is no
            // `neigh.default` outside the initial netns, so per port)
            exec::sysctl(router, &[&format!("net.ipv4.neigh.{port}.proxy_delay=0")])?;
            exec::ip(router, &["link", "set", port, "alias", eni_id, "up"])?;
            // the VPC router's IPv6 gateway on the ENI's link
            exec::ip(
                router,
                &[
                    "-6",
                    "addr",
                    "add",
                    &format!("{IPV6_GATEWAY}/64"),
                    "dev",
                    port,
                    "nodad",
                ],
            )?;
            // and EC2's `fe80:ec2::1` (a /128: no second link-local prefix route per port)
            exec::ip(
                router,
                &[
                    "-6",
                    "addr",
                    "add",
                    &format!("{}/128", dataplane::conventions::ENI_GATEWAY_V6),
                    "dev",
                    port,
                    "nodad",
                ],
            )?;
            exec::ip(&node, &["link", "set", dev, "alias", eni_id])?;
            if let Some((addr, gateway)) = primary {
                // what the instance's DHCP client does for the primary ENI
                exec::ip(&node, &["link", "set", dev, "up"])?;
                exec::ip(&node, &["addr", "add", &addr.to_string(), "dev", dev])?;
                exec::ip(
                    &node,
                    &[
                        "route",
                        "add",
                        "default",
                        "via",
                        &gateway.to_string(),
                        "dev",
                        dev,
                    ],
                )?;
            }
            Ok(())
        }
        Op::SetNodeIpv6 {
            instance_id,
            dev,
            add,
            remove,
        } => {
            let node = names.node_ns(instance_id);
            for a in remove {
                tolerate_missing(exec::ip(
                    &node,
                    &["-6", "addr", "del", &format!("{a}/128"), "dev", dev],
                ))?;
            }
            if let Some(a) = add {
                // what the instance's DHCPv6 client does (a /128; the router is on-link via
                // its link-local address, as the VPC router advertises itself)
                exec::ip(&node, &["link", "set", dev, "up"])?;
                exec::ip(
                    &node,
                    &[
                        "-6",
                        "addr",
                        "replace",
                        &format!("{a}/128"),
                        "dev",
                        dev,
                        "nodad",
                    ],
                )?;
                exec::ip(
                    &node,
                    &[
                        "-6",
                        "route",
                        "replace",
                        "default",
                        "via",
                        &IPV6_GATEWAY.to_string(),
                        "dev",
                        dev,
                    ],
                )?;
            }
            Ok(())
        }
        Op::DeleteRoute { dst } => {
            tolerate_missing(exec::ip(router, &["route", "del", &dst.to_string()]))
        }
        Op::DeleteNeighbour { neighbour } => tolerate_missing(exec::ip(
            router,
            &[
                "neigh",
                "del",
                &neighbour.ip.to_string(),
                "dev",
                &neighbour.dev,
            ],
        )),
        Op::DeleteGateway { ip } => tolerate_missing(exec::ip(
            router,
            &["addr", "del", &format!("{ip}/32"), "dev", "lo"],
        )),
        Op::AddGateway { ip } => {
            exec::ip(router, &["addr", "add", &format!("{ip}/32"), "dev", "lo"]).map(drop)
        }
        Op::ReplaceNeighbour { neighbour } => exec::ip(
            router,
            &[
                "neigh",
                "replace",
                &neighbour.ip.to_string(),
                "lladdr",
                &neighbour.mac,
                "dev",
                &neighbour.dev,
                "nud",
                "permanent",
            ],
        )
        .map(drop),
        Op::ReplaceRoute { dst, target } => {
            let dst = dst.to_string();
            let r = match target {
                RouteTarget::Port { dev } => exec::ip(
                    router,
                    &["route", "replace", &dst, "dev", dev, "scope", "link"],
                ),
                RouteTarget::Via { via, dev } => exec::ip(
                    router,
                    &[
                        "route",
                        "replace",
                        &dst,
                        "via",
                        &via.to_string(),
                        "dev",
                        dev,
                        "onlink",
                    ],
                ),
                RouteTarget::Unreachable => {
                    exec::ip(router, &["route", "replace", "unreachable", &dst])
                }
            };
            r.map(drop)
        }
        // Counters of rules that stay are carried over (a reload would zero them).
        Op::LoadFirewall { rules } => {
            let saved = exec::iptables_save_counters(router).unwrap_or_default();
            exec::iptables_restore_counters(router, &super::plan::carry_counters(&saved, rules))
        }
        Op::LoadFirewall6 { rules } => {
            let saved = exec::ip6tables_save_counters(router).unwrap_or_default();
            exec::ip6tables_restore_counters(router, &super::plan::carry_counters(&saved, rules))
        }
    }
}

fn create_node(ns: &str) -> Result<(), ExecError> {
    exec::netns_add(ns)?;
    // an EKS AMI host forwards (pods behind it); everything else is left at kernel defaults
    // for ipamd to set (SNAT, rules); rp_filter is the init container's, ipamd only reads it
    exec::sysctl(ns, &["net.ipv4.ip_forward=1"])?;
    exec::ip(ns, &["link", "set", "lo", "up"])?;
    for a in [IMDS_ADDR, EC2_ENDPOINT_ADDR, KUBE_API_ADDR] {
        exec::ip(ns, &["addr", "add", &format!("{a}/32"), "dev", "lo"])?;
    }
    Ok(())
}

/// Delete every namespace of the run (nodes first, router and internet last). Best effort:
/// returns the errors of the deletes that failed, after trying them all.
pub fn teardown(names: &RunNames) -> Vec<ExecError> {
    let prefix = names.prefix();
    let mut errors = Vec::new();
    let mut all: Vec<String> = super::observe::list_netns()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    // node namespaces (instance ids start with "i-") before the router
    all.sort_by_key(|n| (names.instance_of_ns(n).is_none(), n.clone()));
    for ns in all {
        if let Err(e) = exec::netns_del(&ns) {
            errors.push(e);
        }
    }
    errors
}
