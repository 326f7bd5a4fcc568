//! One function per EC2 action: parameters -> state operation -> XML in the element names
//! aws-sdk-ec2's deserializers read. Must not apply knobs (the caller did) or hold the world
//! lock beyond one `mutate`/`read` call.

use super::error::ApiError;
use super::params::Params;
use super::xml::Xml;
use crate::limits::{self, InstanceLimits};
use crate::state::{self, Eni, Instance, State, StateError};
use crate::world::World;
use ipnet::{Ipv4Net, Ipv6Net};
use std::net::{Ipv4Addr, Ipv6Addr};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

type Answer = Result<Vec<u8>, ApiError>;

pub(super) fn dispatch(world: &World, action: &str, p: &Params, rid: &str) -> Answer {
    match action {
        "DescribeInstances" => describe_instances(world, p, rid),
        "DescribeInstanceTypes" => describe_instance_types(p, rid),
        "DescribeNetworkInterfaces" => describe_network_interfaces(world, p, rid),
        "DescribeSubnets" => describe_subnets(world, p, rid),
        "CreateSubnet" => create_subnet(world, p, rid),
        "CreateSubnetCidrReservation" => create_subnet_cidr_reservation(world, p, rid),
        "GetSubnetCidrReservations" => get_subnet_cidr_reservations(world, p, rid),
        "DeleteSubnetCidrReservation" => delete_subnet_cidr_reservation(world, p, rid),
        "DescribeSecurityGroups" => describe_security_groups(world, p, rid),
        "DescribeTags" => describe_tags(world, p, rid),
        "CreateNetworkInterface" => create_network_interface(world, p, rid),
        "AttachNetworkInterface" => attach_network_interface(world, p, rid),
        "DetachNetworkInterface" => {
            let id = p.required("AttachmentId")?.to_owned();
            let eni = |s: &State| {
                s.enis
                    .values()
                    .find(|e| e.attachment.as_ref().is_some_and(|a| a.id == id))
                    .map(|e| e.id.clone())
            };
            world.release(eni, |s, _| s.detach_eni(&id))?;
            Ok(ok_return("DetachNetworkInterfaceResponse", rid))
        }
        "DeleteNetworkInterface" => {
            let id = p.required("NetworkInterfaceId")?.to_owned();
            world.mutate(|s, _| s.delete_eni(&id))?;
            Ok(ok_return("DeleteNetworkInterfaceResponse", rid))
        }
        "ModifyNetworkInterfaceAttribute" => modify_network_interface_attribute(world, p, rid),
        "AssignPrivateIpAddresses" => assign_private_ip_addresses(world, p, rid),
        "UnassignPrivateIpAddresses" => {
            let id = p.required("NetworkInterfaceId")?.to_owned();
            let addrs: Vec<Ipv4Addr> = p.parsed_list("PrivateIpAddress")?;
            let prefixes: Vec<Ipv4Net> = p.parsed_list("Ipv4Prefix")?;
            world.release(
                |_| Some(id.clone()),
                |s, _| s.unassign_ipv4(&id, &addrs, &prefixes),
            )?;
            Ok(ok_return("UnassignPrivateIpAddressesResponse", rid))
        }
        "AssignIpv6Addresses" => assign_ipv6_addresses(world, p, rid),
        "UnassignIpv6Addresses" => unassign_ipv6_addresses(world, p, rid),
        "CreateTags" => {
            let resources = p.list("ResourceId");
            if resources.is_empty() {
                return Err(StateError::MissingParameter("ResourceId".into()).into());
            }
            let tags = p.tags("Tag");
            world.mutate(|s, _| s.create_tags(&resources, &tags))?;
            Ok(ok_return("CreateTagsResponse", rid))
        }
        "DeleteTags" => {
            let resources = p.list("ResourceId");
            if resources.is_empty() {
                return Err(StateError::MissingParameter("ResourceId".into()).into());
            }
            let tags: Vec<(String, Option<String>)> = p
                .structs("Tag")
                .into_iter()
                .filter_map(|t| Some((t.get("Key")?.to_owned(), t.get("Value").map(str::to_owned))))
                .collect();
            world.mutate(|s, _| s.delete_tags(&resources, &tags))?;
            Ok(ok_return("DeleteTagsResponse", rid))
        }
        "DescribeVpcs" => describe_vpcs(world, p, rid),
        "CreateSecurityGroup" => create_security_group(world, p, rid),
        "AuthorizeSecurityGroupIngress" => {
            change_rules(world, p, rid, state::Direction::Ingress, true)
        }
        "AuthorizeSecurityGroupEgress" => {
            change_rules(world, p, rid, state::Direction::Egress, true)
        }
        "RevokeSecurityGroupIngress" => {
            change_rules(world, p, rid, state::Direction::Ingress, false)
        }
        "RevokeSecurityGroupEgress" => change_rules(world, p, rid, state::Direction::Egress, false),
        "AssociateTrunkInterface" => associate_trunk_interface(world, p, rid),
        "DescribeTrunkInterfaceAssociations" => {
            describe_trunk_interface_associations(world, p, rid)
        }
        "DisassociateTrunkInterface" => {
            let id = p.required("AssociationId")?.to_owned();
            world.mutate(|s, _| s.disassociate_trunk(&id))?;
            let root = "DisassociateTrunkInterfaceResponse";
            let mut x = Xml::response(root, rid);
            x.text("return", "true");
            x.opt("clientToken", p.get("ClientToken"));
            Ok(x.finish(root))
        }
        "RunInstances" => run_instances(world, p, rid),
        "TerminateInstances" => terminate_instances(world, p, rid),
        other => Err(ApiError::InvalidAction(other.to_owned())),
    }
}

fn ok_return(root: &str, rid: &str) -> Vec<u8> {
    let mut x = Xml::response(root, rid);
    x.text("return", "true");
    x.finish(root)
}

fn ts(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

fn u32_param(p: &Params, key: &str) -> Result<u32, StateError> {
    Ok(p.parse::<u32>(key)?.unwrap_or(0))
}

/// `MaxResults`/`NextToken` over `items`: returns the page and the next token.
fn paginate<T>(
    items: Vec<T>,
    p: &Params,
    min: usize,
    max: usize,
) -> Result<(Vec<T>, Option<String>), StateError> {
    let start = match p.get("NextToken") {
        None | Some("") => 0,
        Some(t) => t
            .strip_prefix("vpcsim-page-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n <= items.len())
            .ok_or_else(|| {
                StateError::InvalidParameterValue(format!("invalid next token ({t})"))
            })?,
    };
    let Some(limit) = p.parse::<usize>("MaxResults")? else {
        return Ok((items.into_iter().skip(start).collect(), None));
    };
    if !(min..=max).contains(&limit) {
        return Err(StateError::InvalidParameterValue(format!(
            "value ({limit}) for parameter maxResults is invalid; expected {min}..{max}"
        )));
    }
    let total = items.len();
    let page: Vec<T> = items.into_iter().skip(start).take(limit).collect();
    let next = (start + limit < total).then(|| format!("vpcsim-page-{}", start + limit));
    Ok((page, next))
}

fn tag_set(x: &mut Xml, tags: &std::collections::BTreeMap<String, String>) {
    x.list("tagSet", tags, |x, (k, v)| {
        x.text("key", k);
        x.text("value", v);
    });
}

fn group_set(x: &mut Xml, s: &State, groups: &[String]) {
    x.list("groupSet", groups, |x, g| {
        x.text("groupId", g);
        x.opt(
            "groupName",
            s.security_groups.get(g).map(|sg| sg.name.as_str()),
        );
    });
}

/// EC2's zone id for a zone name of the simulated region: `usw2-az<n>` for `us-west-2<letter>`
/// (the letter → number mapping is per account on EC2; here it is fixed: a → 1, b → 2, ...).
fn az_id(az: &str) -> String {
    let n = az
        .bytes()
        .last()
        .filter(u8::is_ascii_lowercase)
        .map_or(1, |b| u32::from(b - b'a') + 1);
    let short: String = az
        .split('-')
        .take(2)
        .enumerate()
        .map(|(i, p)| {
            if i == 0 {
                p.to_owned()
            } else {
                p.chars().take(1).collect()
            }
        })
        .collect();
    let digit: String = az.chars().filter(char::is_ascii_digit).collect();
    format!("{short}{digit}-az{n}")
}

fn private_dns(ip: Ipv4Addr, region: &str) -> String {
    format!(
        "ip-{}.{region}.compute.internal",
        ip.to_string().replace('.', "-")
    )
}

/// The ENI body shared by `networkInterfaceSet` items and `networkInterface`.
fn eni_body(x: &mut Xml, s: &State, e: &Eni) {
    x.text("networkInterfaceId", &e.id);
    x.text("subnetId", &e.subnet_id);
    x.text("vpcId", &s.vpc.id);
    x.text("availabilityZone", s.subnet_az(&e.subnet_id));
    x.text("description", &e.description);
    x.text("ownerId", &s.account_id);
    x.text("requesterManaged", "false");
    x.text("status", e.status());
    x.text("macAddress", &e.mac);
    x.text("privateIpAddress", e.primary_ip());
    x.text("privateDnsName", private_dns(e.primary_ip(), &s.region));
    x.text("sourceDestCheck", e.source_dest_check);
    x.text("interfaceType", s.described_type(e));
    if let Some(c) = &e.conntrack {
        x.nest("connectionTrackingConfiguration", |x| {
            x.opt("tcpEstablishedTimeout", c.tcp_established_timeout);
            x.opt("udpStreamTimeout", c.udp_stream_timeout);
            x.opt("udpTimeout", c.udp_timeout);
        });
    }
    group_set(x, s, &e.groups);
    if let Some(a) = &e.attachment {
        x.nest("attachment", |x| {
            x.text("attachmentId", &a.id);
            x.text("instanceId", &a.instance_id);
            x.text("instanceOwnerId", &s.account_id);
            x.text("deviceIndex", a.device_index);
            x.text("networkCardIndex", a.network_card_index);
            x.text("status", "attached");
            x.text("attachTime", ts(a.attach_time));
            x.text("deleteOnTermination", a.delete_on_termination);
        });
    }
    tag_set(x, &e.tags);
    x.list(
        "privateIpAddressesSet",
        e.private_ips.iter().enumerate(),
        |x, (i, ip)| {
            x.text("privateIpAddress", ip);
            x.text("privateDnsName", private_dns(*ip, &s.region));
            x.text("primary", i == 0);
        },
    );
    x.list("ipv6AddressesSet", &e.ipv6_addresses, |x, ip| {
        x.text("ipv6Address", ip);
        x.text("isPrimaryIpv6", false);
    });
    x.list("ipv4PrefixSet", &e.ipv4_prefixes, |x, p| {
        x.text("ipv4Prefix", p)
    });
    x.list("ipv6PrefixSet", &e.ipv6_prefixes, |x, p| {
        x.text("ipv6Prefix", p)
    });
}

fn describe_network_interfaces(world: &World, p: &Params, rid: &str) -> Answer {
    let ids = p.list("NetworkInterfaceId");
    if !ids.is_empty() && p.get("MaxResults").is_some() {
        return Err(StateError::InvalidParameterCombination(
            "the parameter NetworkInterfaceIds cannot be used with the parameter MaxResults".into(),
        )
        .into());
    }
    let filters = p.filters();
    let root = "DescribeNetworkInterfacesResponse";
    let lag = std::time::Duration::from_millis(world.knobs().describe_lag_ms);
    let now = world.now();
    // eventual consistency knob: ENIs younger than `lag` are not visible yet
    let visible = |e: &Eni| {
        e.created_at
            .is_none_or(|t| now.saturating_duration_since(t) >= lag)
    };
    // and knob `release_lag_ms`: what a release just removed is still shown
    world.read_described(now, |s, enis| {
        for id in &ids {
            if !id.starts_with("eni-") {
                return Err(StateError::EniIdMalformed(id.clone()).into());
            }
            if !enis.get(id).is_some_and(visible) {
                return Err(StateError::EniNotFound(id.clone()).into());
            }
        }
        let mut matched = Vec::new();
        for e in enis.values().filter(|e| visible(e)) {
            if (ids.is_empty() || ids.contains(&e.id)) && s.eni_matches(e, &filters)? {
                matched.push(e);
            }
        }
        let (page, next) = paginate(matched, p, 5, 1000)?;
        let mut x = Xml::response(root, rid);
        x.list("networkInterfaceSet", page, |x, e| eni_body(x, s, e));
        x.opt("nextToken", next);
        Ok(x.finish(root))
    })
}

fn create_network_interface(world: &World, p: &Params, rid: &str) -> Answer {
    let mut secondary_ips: Vec<Ipv4Addr> = Vec::new();
    let mut primary_ip: Option<Ipv4Addr> = p.parse("PrivateIpAddress")?;
    for spec in p.structs("PrivateIpAddresses") {
        let ip: Ipv4Addr = spec.parse("PrivateIpAddress")?.ok_or_else(|| {
            StateError::MissingParameter("PrivateIpAddresses.N.PrivateIpAddress".into())
        })?;
        if spec.flag("Primary")? && primary_ip.is_none() {
            primary_ip = Some(ip);
        } else if Some(ip) != primary_ip {
            secondary_ips.push(ip);
        }
    }
    let ipv4_prefixes: Vec<Ipv4Net> = p
        .structs("Ipv4Prefix")
        .iter()
        .map(|s| s.parse::<Ipv4Net>("Ipv4Prefix"))
        .filter_map(Result::transpose)
        .collect::<Result<_, _>>()?;
    let req = state::CreateEni {
        subnet_id: p.required("SubnetId")?.to_owned(),
        description: p.get("Description").unwrap_or_default().to_owned(),
        groups: p.list("SecurityGroupId"),
        primary_ip,
        secondary_ips,
        secondary_count: u32_param(p, "SecondaryPrivateIpAddressCount")?,
        ipv4_prefix_count: u32_param(p, "Ipv4PrefixCount")?,
        ipv4_prefixes,
        ipv6_count: u32_param(p, "Ipv6AddressCount")?,
        ipv6_prefix_count: u32_param(p, "Ipv6PrefixCount")?,
        tags: p.tag_specs("network-interface")?,
        conntrack: conntrack_param(p)?,
        interface_type: p.get("InterfaceType").unwrap_or_default().to_owned(),
    };
    let id = world.mutate(|s, now| {
        let id = s.create_eni(req)?;
        s.stamp_created(&id, now);
        Ok(id)
    })?;
    let root = "CreateNetworkInterfaceResponse";
    world.read(|s| {
        let e = s.eni(&id)?;
        let mut x = Xml::response(root, rid);
        x.nest("networkInterface", |x| eni_body(x, s, e));
        x.opt("clientToken", p.get("ClientToken"));
        Ok(x.finish(root))
    })
}

fn attach_network_interface(world: &World, p: &Params, rid: &str) -> Answer {
    let eni = p.required("NetworkInterfaceId")?.to_owned();
    let inst = p.required("InstanceId")?.to_owned();
    let idx: u32 = p
        .parse("DeviceIndex")?
        .ok_or_else(|| StateError::MissingParameter("DeviceIndex".into()))?;
    let card = p.parse::<u32>("NetworkCardIndex")?.unwrap_or(0);
    let attachment = world.mutate(|s, now| s.attach_eni_on_card(&eni, &inst, idx, card, now))?;
    let root = "AttachNetworkInterfaceResponse";
    let mut x = Xml::response(root, rid);
    x.text("attachmentId", attachment);
    x.text("networkCardIndex", card);
    Ok(x.finish(root))
}

/// `ConnectionTrackingSpecification.{TcpEstablishedTimeout,UdpStreamTimeout,UdpTimeout}`
/// (None when no field is given).
fn conntrack_param(p: &Params) -> Result<Option<state::ConnTracking>, ApiError> {
    const P: &str = "ConnectionTrackingSpecification";
    let c = state::ConnTracking {
        tcp_established_timeout: p.parse(&format!("{P}.TcpEstablishedTimeout"))?,
        udp_stream_timeout: p.parse(&format!("{P}.UdpStreamTimeout"))?,
        udp_timeout: p.parse(&format!("{P}.UdpTimeout"))?,
    };
    Ok((c != state::ConnTracking::default()).then_some(c))
}

fn modify_network_interface_attribute(world: &World, p: &Params, rid: &str) -> Answer {
    let id = p.required("NetworkInterfaceId")?.to_owned();
    let delete_on_termination = match p.get("Attachment.AttachmentId") {
        Some(a) => {
            let flag: bool = p.parse("Attachment.DeleteOnTermination")?.ok_or_else(|| {
                StateError::MissingParameter("Attachment.DeleteOnTermination".into())
            })?;
            Some((a.to_owned(), flag))
        }
        None => None,
    };
    let groups = p.list("SecurityGroupId");
    let req = state::ModifyEni {
        delete_on_termination,
        groups: (!groups.is_empty()).then_some(groups),
        description: p.get("Description.Value").map(str::to_owned),
        source_dest_check: p.parse("SourceDestCheck.Value")?,
        conntrack: conntrack_param(p)?,
    };
    world.mutate(|s, _| s.modify_eni(&id, req))?;
    Ok(ok_return("ModifyNetworkInterfaceAttributeResponse", rid))
}

fn assign_private_ip_addresses(world: &World, p: &Params, rid: &str) -> Answer {
    let id = p.required("NetworkInterfaceId")?.to_owned();
    let req = state::AssignIpv4 {
        count: u32_param(p, "SecondaryPrivateIpAddressCount")?,
        addresses: p.parsed_list("PrivateIpAddress")?,
        prefix_count: u32_param(p, "Ipv4PrefixCount")?,
        prefixes: p.parsed_list("Ipv4Prefix")?,
        allow_reassignment: p.flag("AllowReassignment")?,
    };
    let (addrs, prefixes) = world.mutate(|s, _| s.assign_ipv4(&id, req))?;
    let root = "AssignPrivateIpAddressesResponse";
    let mut x = Xml::response(root, rid);
    x.text("networkInterfaceId", &id);
    x.list("assignedPrivateIpAddressesSet", addrs, |x, ip| {
        x.text("privateIpAddress", ip)
    });
    x.list("assignedIpv4PrefixSet", prefixes, |x, pf| {
        x.text("ipv4Prefix", pf)
    });
    Ok(x.finish(root))
}

fn assign_ipv6_addresses(world: &World, p: &Params, rid: &str) -> Answer {
    let id = p.required("NetworkInterfaceId")?.to_owned();
    let req = state::AssignIpv6 {
        count: u32_param(p, "Ipv6AddressCount")?,
        addresses: p.parsed_list("Ipv6Addresses")?,
        prefix_count: u32_param(p, "Ipv6PrefixCount")?,
        prefixes: p.parsed_list("Ipv6Prefix")?,
    };
    let (addrs, prefixes) = world.mutate(|s, _| s.assign_ipv6(&id, req))?;
    let root = "AssignIpv6AddressesResponse";
    let mut x = Xml::response(root, rid);
    x.text("networkInterfaceId", &id);
    x.values("assignedIpv6Addresses", addrs);
    x.values("assignedIpv6PrefixSet", prefixes);
    Ok(x.finish(root))
}

fn unassign_ipv6_addresses(world: &World, p: &Params, rid: &str) -> Answer {
    let id = p.required("NetworkInterfaceId")?.to_owned();
    let addrs: Vec<Ipv6Addr> = p.parsed_list("Ipv6Addresses")?;
    let prefixes: Vec<Ipv6Net> = p.parsed_list("Ipv6Prefix")?;
    world.release(
        |_| Some(id.clone()),
        |s, _| s.unassign_ipv6(&id, &addrs, &prefixes),
    )?;
    let root = "UnassignIpv6AddressesResponse";
    let mut x = Xml::response(root, rid);
    x.text("networkInterfaceId", &id);
    x.values("unassignedIpv6Addresses", addrs);
    x.values("unassignedIpv6PrefixSet", prefixes);
    Ok(x.finish(root))
}

/// A subnet as DescribeSubnets and CreateSubnet answer it.
fn subnet_body(x: &mut Xml, s: &State, sn: &state::Subnet) {
    x.text("subnetId", &sn.id);
    x.text(
        "subnetArn",
        format!("arn:aws:ec2:{}:{}:subnet/{}", s.region, s.account_id, sn.id),
    );
    x.text("state", "available");
    x.text("ownerId", &s.account_id);
    x.text("vpcId", &s.vpc.id);
    x.text("cidrBlock", sn.cidr);
    x.text("availableIpAddressCount", s.available_ip_count(&sn.id));
    x.text("availabilityZone", &sn.availability_zone);
    x.text("availabilityZoneId", az_id(&sn.availability_zone));
    x.text("defaultForAz", false);
    x.text("mapPublicIpOnLaunch", false);
    x.text("assignIpv6AddressOnCreation", false);
    x.text("ipv6Native", false);
    x.nest("privateDnsNameOptionsOnLaunch", |x| {
        x.text("hostnameType", "ip-name");
        x.text("enableResourceNameDnsARecord", false);
        x.text("enableResourceNameDnsAAAARecord", false);
    });
    x.list("ipv6CidrBlockAssociationSet", sn.ipv6_cidr, |x, c| {
        x.text("ipv6CidrBlock", c);
        x.text(
            "associationId",
            format!("subnet-cidr-assoc-{}", &sn.id[7..]),
        );
        x.nest("ipv6CidrBlockState", |x| x.text("state", "associated"));
    });
    tag_set(x, &sn.tags);
}

fn describe_subnets(world: &World, p: &Params, rid: &str) -> Answer {
    let ids = p.list("SubnetId");
    let filters = p.filters();
    let root = "DescribeSubnetsResponse";
    world.read(|s| {
        for id in &ids {
            if !s.subnets.contains_key(id) {
                return Err(StateError::SubnetNotFound(id.clone()).into());
            }
        }
        let mut matched = Vec::new();
        for sn in s.subnets.values() {
            if (ids.is_empty() || ids.contains(&sn.id)) && s.subnet_matches(sn, &filters)? {
                matched.push(sn);
            }
        }
        let (page, next) = paginate(matched, p, 5, 1000)?;
        let mut x = Xml::response(root, rid);
        x.list("subnetSet", page, |x, sn| subnet_body(x, s, sn));
        x.opt("nextToken", next);
        Ok(x.finish(root))
    })
}

/// `CreateSubnet`: `VpcId`, `CidrBlock`, `AvailabilityZone`, `TagSpecification` (subnet);
/// answers the subnet as DescribeSubnets shows it.
fn create_subnet(world: &World, p: &Params, rid: &str) -> Answer {
    let req = state::CreateSubnet {
        vpc_id: p.get("VpcId").unwrap_or_default().to_owned(),
        cidr: p.parse("CidrBlock")?,
        availability_zone: p.get("AvailabilityZone").map(str::to_owned),
        tags: p.tag_specs("subnet")?,
    };
    let id = world.mutate(|s, _| s.create_subnet(req))?;
    let root = "CreateSubnetResponse";
    world.read(|s| {
        let sn = s
            .subnets
            .get(&id)
            .ok_or_else(|| StateError::SubnetNotFound(id.clone()))?;
        let mut x = Xml::response(root, rid);
        x.nest("subnet", |x| subnet_body(x, s, sn));
        Ok(x.finish(root))
    })
}

fn reservation_body(x: &mut Xml, s: &State, subnet_id: &str, r: &state::CidrReservation) {
    x.text("subnetCidrReservationId", &r.id);
    x.text("subnetId", subnet_id);
    x.text("cidr", r.cidr);
    x.text("reservationType", r.kind.as_str());
    x.text("ownerId", &s.account_id);
    if !r.description.is_empty() {
        x.text("description", &r.description);
    }
}

/// `CreateSubnetCidrReservation` (IPv4 only: `Cidr` must be an IPv4 block of the subnet).
fn create_subnet_cidr_reservation(world: &World, p: &Params, rid: &str) -> Answer {
    let subnet_id = p.required("SubnetId")?.to_owned();
    let cidr: ipnet::Ipv4Net = p
        .parse("Cidr")?
        .ok_or_else(|| StateError::MissingParameter("Cidr".into()))?;
    let kind = match p.required("ReservationType")? {
        "prefix" => state::ReservationKind::Prefix,
        "explicit" => state::ReservationKind::Explicit,
        other => {
            return Err(StateError::InvalidParameterValue(format!(
                "ReservationType {other} is not one of prefix, explicit"
            ))
            .into());
        }
    };
    let description = p.get("Description").unwrap_or_default().to_owned();
    let id = world
        .mutate(|s, _| s.create_subnet_cidr_reservation(&subnet_id, cidr, kind, description))?;
    let root = "CreateSubnetCidrReservationResponse";
    world.read(|s| {
        let sn = s
            .subnets
            .get(&subnet_id)
            .ok_or_else(|| StateError::SubnetNotFound(subnet_id.clone()))?;
        let r = sn
            .reservations
            .iter()
            .find(|r| r.id == id)
            .ok_or_else(|| StateError::InvalidParameterValue(id.clone()))?;
        let mut x = Xml::response(root, rid);
        x.nest("subnetCidrReservation", |x| {
            reservation_body(x, s, &sn.id, r)
        });
        Ok(x.finish(root))
    })
}

/// `GetSubnetCidrReservations`: the subnet's IPv4 reservations (filter `reservationType`
/// honoured; no IPv6 reservations are modelled).
fn get_subnet_cidr_reservations(world: &World, p: &Params, rid: &str) -> Answer {
    let subnet_id = p.required("SubnetId")?.to_owned();
    let kinds: Vec<String> = p
        .filters()
        .into_iter()
        .filter(|f| f.name == "reservationType")
        .flat_map(|f| f.values)
        .collect();
    let root = "GetSubnetCidrReservationsResponse";
    world.read(|s| {
        let sn = s
            .subnets
            .get(&subnet_id)
            .ok_or_else(|| StateError::SubnetNotFound(subnet_id.clone()))?;
        let mut x = Xml::response(root, rid);
        x.list(
            "subnetIpv4CidrReservationSet",
            sn.reservations
                .iter()
                .filter(|r| kinds.is_empty() || kinds.iter().any(|k| k == r.kind.as_str())),
            |x, r| reservation_body(x, s, &sn.id, r),
        );
        x.list(
            "subnetIpv6CidrReservationSet",
            std::iter::empty::<()>(),
            |_, ()| {},
        );
        Ok(x.finish(root))
    })
}

/// `DeleteSubnetCidrReservation`.
fn delete_subnet_cidr_reservation(world: &World, p: &Params, rid: &str) -> Answer {
    let id = p.required("SubnetCidrReservationId")?.to_owned();
    let (subnet_id, r) = world.mutate(|s, _| s.delete_subnet_cidr_reservation(&id))?;
    let root = "DeleteSubnetCidrReservationResponse";
    world.read(|s| {
        let mut x = Xml::response(root, rid);
        x.nest("deletedSubnetCidrReservation", |x| {
            reservation_body(x, s, &subnet_id, &r);
        });
        Ok(x.finish(root))
    })
}

/// `DescribeVpcs`: the one VPC (with `VpcId.N`; filters are not modelled), its IPv4 blocks and
/// its Amazon-provided-style IPv6 /56.
fn describe_vpcs(world: &World, p: &Params, rid: &str) -> Answer {
    let ids = p.list("VpcId");
    let root = "DescribeVpcsResponse";
    world.read(|s| {
        if let Some(id) = ids.iter().find(|id| **id != s.vpc.id) {
            return Err(StateError::VpcNotFound(id.clone()).into());
        }
        let vpc = &s.vpc;
        let suffix = vpc.id.trim_start_matches("vpc-");
        let mut x = Xml::response(root, rid);
        x.list("vpcSet", [vpc], |x, vpc| {
            x.text("vpcId", &vpc.id);
            x.text("ownerId", &s.account_id);
            x.text("state", "available");
            x.text("cidrBlock", vpc.cidr);
            x.text("dhcpOptionsId", "default");
            x.text("instanceTenancy", "default");
            x.text("isDefault", false);
            x.list(
                "cidrBlockAssociationSet",
                vpc.cidr_blocks().into_iter().enumerate(),
                |x, (i, c)| {
                    x.text("cidrBlock", c);
                    x.text("associationId", format!("vpc-cidr-assoc-{suffix}{i}"));
                    x.nest("cidrBlockState", |x| x.text("state", "associated"));
                },
            );
            x.list("ipv6CidrBlockAssociationSet", vpc.ipv6_cidr, |x, c| {
                x.text("ipv6CidrBlock", c);
                x.text("associationId", format!("vpc-cidr-assoc-{suffix}6"));
                x.nest("ipv6CidrBlockState", |x| x.text("state", "associated"));
                x.text("networkBorderGroup", &s.region);
                x.text("ipv6Pool", "Amazon");
            });
            // VPC tags are not modelled
            tag_set(x, &std::collections::BTreeMap::new());
        });
        Ok(x.finish(root))
    })
}

fn describe_tags(world: &World, p: &Params, rid: &str) -> Answer {
    let filters = p.filters();
    let root = "DescribeTagsResponse";
    world.read(|s| {
        let rows = s.describe_tags(&filters)?;
        let (page, next) = paginate(rows, p, 5, 1000)?;
        let mut x = Xml::response(root, rid);
        x.list("tagSet", page, |x, t| {
            x.text("resourceId", &t.resource_id);
            x.text("resourceType", t.resource_type);
            x.text("key", &t.key);
            x.text("value", &t.value);
        });
        x.opt("nextToken", next);
        Ok(x.finish(root))
    })
}

fn describe_security_groups(world: &World, p: &Params, rid: &str) -> Answer {
    let ids = p.list("GroupId");
    let filters = p.filters();
    let root = "DescribeSecurityGroupsResponse";
    world.read(|s| {
        for id in &ids {
            if !s.security_groups.contains_key(id) {
                return Err(StateError::GroupNotFound(id.clone()).into());
            }
        }
        let mut matched = Vec::new();
        for g in s.security_groups.values() {
            if (ids.is_empty() || ids.contains(&g.id)) && s.group_matches(g, &filters)? {
                matched.push(g);
            }
        }
        let (page, next) = paginate(matched, p, 5, 1000)?;
        let mut x = Xml::response(root, rid);
        x.list("securityGroupInfo", page, |x, g| {
            x.text("ownerId", &s.account_id);
            x.text("groupId", &g.id);
            x.text("groupName", &g.name);
            x.text("groupDescription", &g.description);
            x.text("vpcId", &g.vpc_id);
            x.text(
                "securityGroupArn",
                format!(
                    "arn:aws:ec2:{}:{}:security-group/{}",
                    s.region, s.account_id, g.id
                ),
            );
            x.list("ipPermissions", &g.ingress, |x, r| permission(x, s, r));
            x.list("ipPermissionsEgress", &g.egress, |x, r| permission(x, s, r));
            tag_set(x, &g.tags);
        });
        x.opt("nextToken", next);
        Ok(x.finish(root))
    })
}

/// One `IpPermission` item.
fn permission(x: &mut Xml, s: &State, r: &state::SgRule) {
    x.text("ipProtocol", &r.protocol);
    x.opt("fromPort", r.from_port);
    x.opt("toPort", r.to_port);
    x.list("groups", &r.groups, |x, g| {
        x.text("groupId", g);
        x.text("userId", &s.account_id);
    });
    x.list(
        "ipRanges",
        r.cidrs.iter().filter(|c| c.addr().is_ipv4()),
        |x, c| {
            x.text("cidrIp", c);
        },
    );
    x.list(
        "ipv6Ranges",
        r.cidrs.iter().filter(|c| c.addr().is_ipv6()),
        |x, c| {
            x.text("cidrIpv6", c);
        },
    );
    x.list("prefixListIds", std::iter::empty::<()>(), |_, ()| {});
}

/// `IpPermissions.N.*` as rules.
fn permissions_param(p: &Params) -> Result<Vec<state::SgRule>, StateError> {
    let mut out = Vec::new();
    for perm in p.structs("IpPermissions") {
        let mut cidrs: Vec<ipnet::IpNet> = Vec::new();
        for r in perm.structs("IpRanges") {
            if let Some(c) = r.parse::<ipnet::Ipv4Net>("CidrIp")? {
                cidrs.push(c.into());
            }
        }
        for r in perm.structs("Ipv6Ranges") {
            if let Some(c) = r.parse::<ipnet::Ipv6Net>("CidrIpv6")? {
                cidrs.push(c.into());
            }
        }
        let groups = perm
            .structs("Groups")
            .iter()
            .filter_map(|g| g.get("GroupId").map(str::to_owned))
            .collect();
        out.push(state::SgRule {
            protocol: perm.required("IpProtocol")?.to_owned(),
            from_port: perm.parse("FromPort")?,
            to_port: perm.parse("ToPort")?,
            cidrs,
            groups,
        });
    }
    Ok(out)
}

fn create_security_group(world: &World, p: &Params, rid: &str) -> Answer {
    let name = p.required("GroupName")?.to_owned();
    let description = p.required("GroupDescription")?.to_owned();
    let vpc = p.get("VpcId").unwrap_or_default().to_owned();
    let tags = p.tag_specs("security-group")?;
    let id = world.mutate(|s, _| s.create_security_group(&name, &description, &vpc, tags))?;
    let root = "CreateSecurityGroupResponse";
    world.read(|s| {
        let mut x = Xml::response(root, rid);
        x.text("return", "true");
        x.text("groupId", &id);
        x.text(
            "securityGroupArn",
            format!(
                "arn:aws:ec2:{}:{}:security-group/{id}",
                s.region, s.account_id
            ),
        );
        Ok(x.finish(root))
    })
}

fn change_rules(
    world: &World,
    p: &Params,
    rid: &str,
    direction: state::Direction,
    authorize: bool,
) -> Answer {
    let group = p.required("GroupId")?.to_owned();
    let rules = permissions_param(p)?;
    let root = match (direction, authorize) {
        (state::Direction::Ingress, true) => "AuthorizeSecurityGroupIngressResponse",
        (state::Direction::Egress, true) => "AuthorizeSecurityGroupEgressResponse",
        (state::Direction::Ingress, false) => "RevokeSecurityGroupIngressResponse",
        (state::Direction::Egress, false) => "RevokeSecurityGroupEgressResponse",
    };
    if !authorize {
        world.mutate(|s, _| s.revoke_security_group(&group, direction, rules))?;
        return Ok(ok_return(root, rid));
    }
    let added = world.mutate(|s, _| s.authorize_security_group(&group, direction, rules))?;
    let account = world.read(|s| s.account_id.clone());
    let mut x = Xml::response(root, rid);
    x.text("return", "true");
    x.list("securityGroupRuleSet", &added, |x, (id, r)| {
        x.text("securityGroupRuleId", id);
        x.text("groupId", &group);
        x.text("groupOwnerId", &account);
        x.text("isEgress", direction == state::Direction::Egress);
        x.text("ipProtocol", &r.protocol);
        x.text("fromPort", r.from_port.unwrap_or(-1));
        x.text("toPort", r.to_port.unwrap_or(-1));
        for c in &r.cidrs {
            x.text(
                if c.addr().is_ipv4() {
                    "cidrIpv4"
                } else {
                    "cidrIpv6"
                },
                c,
            );
        }
        for g in &r.groups {
            x.nest("referencedGroupInfo", |x| {
                x.text("groupId", g);
                x.text("userId", &account);
            });
        }
        x.list("tagSet", std::iter::empty::<()>(), |_, ()| {});
    });
    Ok(x.finish(root))
}

/// One `TrunkInterfaceAssociation`.
fn association_body(x: &mut Xml, a: &state::TrunkAssociation) {
    x.text("associationId", &a.id);
    x.text("branchInterfaceId", &a.branch_eni);
    x.text("trunkInterfaceId", &a.trunk_eni);
    x.text("interfaceProtocol", "VLAN");
    x.text("vlanId", a.vlan_id);
}

fn associate_trunk_interface(world: &World, p: &Params, rid: &str) -> Answer {
    let branch = p.required("BranchInterfaceId")?.to_owned();
    let trunk = p.required("TrunkInterfaceId")?.to_owned();
    if p.get("GreKey").is_some() {
        return Err(StateError::InvalidParameterValue(
            "GreKey: only the VLAN protocol is simulated".into(),
        )
        .into());
    }
    let vlan: u16 = p
        .parse("VlanId")?
        .ok_or_else(|| StateError::MissingParameter("VlanId".into()))?;
    let id = world.mutate(|s, _| s.associate_trunk(&branch, &trunk, vlan))?;
    let root = "AssociateTrunkInterfaceResponse";
    world.read(|s| {
        let a = &s.trunk_associations[&id];
        let mut x = Xml::response(root, rid);
        x.nest("interfaceAssociation", |x| association_body(x, a));
        x.opt("clientToken", p.get("ClientToken"));
        Ok(x.finish(root))
    })
}

fn describe_trunk_interface_associations(world: &World, p: &Params, rid: &str) -> Answer {
    let ids = p.list("AssociationId");
    let filters = p.filters();
    for f in &filters {
        if !matches!(
            f.name.as_str(),
            "trunk-interface-association.branch-interface-id"
                | "trunk-interface-association.trunk-interface-id"
        ) {
            return Err(StateError::InvalidParameterValue(format!(
                "the filter '{}' is invalid",
                f.name
            ))
            .into());
        }
    }
    let root = "DescribeTrunkInterfaceAssociationsResponse";
    world.read(|s| {
        for id in &ids {
            if !s.trunk_associations.contains_key(id) {
                return Err(StateError::AssociationNotFound(id.clone()).into());
            }
        }
        let matched: Vec<&state::TrunkAssociation> = s
            .trunk_associations
            .values()
            .filter(|a| ids.is_empty() || ids.contains(&a.id))
            .filter(|a| {
                filters.iter().all(|f| {
                    let v = if f.name.ends_with("branch-interface-id") {
                        &a.branch_eni
                    } else {
                        &a.trunk_eni
                    };
                    f.values.iter().any(|w| w == v)
                })
            })
            .collect();
        let (page, next) = paginate(matched, p, 5, 255)?;
        let mut x = Xml::response(root, rid);
        x.list("interfaceAssociationSet", page, |x, a| {
            association_body(x, a)
        });
        x.opt("nextToken", next);
        Ok(x.finish(root))
    })
}

fn describe_instance_types(p: &Params, rid: &str) -> Answer {
    let names = p.list("InstanceType");
    for n in &names {
        if limits::lookup(n).is_none() {
            return Err(StateError::InstanceTypeNotFound(n.clone()).into());
        }
    }
    if !p.filters().is_empty() {
        return Err(StateError::InvalidParameterValue(
            "filters are not supported by the simulator for DescribeInstanceTypes".into(),
        )
        .into());
    }
    let matched: Vec<&InstanceLimits> = limits::INSTANCE_TYPES
        .iter()
        .filter(|l| names.is_empty() || names.iter().any(|n| n == l.instance_type))
        .collect();
    let (page, next) = paginate(matched, p, 5, 100)?;
    let root = "DescribeInstanceTypesResponse";
    let mut x = Xml::response(root, rid);
    x.list("instanceTypeSet", page, |x, l| {
        x.text("instanceType", l.instance_type);
        x.text("currentGeneration", true);
        x.text("bareMetal", l.bare_metal);
        x.opt("hypervisor", l.hypervisor);
        x.nest("vCpuInfo", |x| x.text("defaultVCpus", l.vcpus));
        x.nest("networkInfo", |x| {
            x.text("maximumNetworkInterfaces", l.max_enis);
            x.text("maximumNetworkCards", l.network_cards);
            x.text("defaultNetworkCardIndex", 0);
            x.list("networkCards", 0..l.network_cards, |x, card| {
                x.text("networkCardIndex", card);
                x.text("maximumNetworkInterfaces", l.max_enis);
            });
            x.text("ipv4AddressesPerInterface", l.ipv4_per_eni);
            x.text("ipv6AddressesPerInterface", l.ipv6_per_eni);
            x.text("ipv6Supported", true);
            x.text("enaSupport", "required");
            x.text("efaSupported", false);
        });
    });
    x.opt("nextToken", next);
    Ok(x.finish(root))
}

fn instance_body(x: &mut Xml, s: &State, inst: &Instance) {
    let enis = s.enis_of(&inst.id);
    let primary_ip = enis
        .iter()
        .find(|e| e.id == inst.primary_eni)
        .map(|e| e.primary_ip());
    x.text("instanceId", &inst.id);
    x.text("imageId", "ami-00000000000000001");
    x.nest("instanceState", |x| {
        x.text("code", inst.state.code());
        x.text("name", inst.state.name());
    });
    x.opt(
        "privateDnsName",
        primary_ip.map(|ip| private_dns(ip, &s.region)),
    );
    x.text("instanceType", &inst.instance_type);
    x.text("launchTime", ts(inst.launch_time));
    x.nest("placement", |x| {
        x.text("availabilityZone", &inst.availability_zone);
        x.text("groupName", "");
        x.text("tenancy", "default");
    });
    if inst.state == state::InstanceState::Running {
        x.text("subnetId", &inst.subnet_id);
        x.text("vpcId", &s.vpc.id);
    }
    x.opt("privateIpAddress", primary_ip);
    x.text("amiLaunchIndex", 0);
    x.text("dnsName", "");
    x.text("reason", "");
    x.text("clientToken", "");
    x.list("productCodes", std::iter::empty::<()>(), |_, ()| {});
    x.nest("monitoring", |x| x.text("state", "disabled"));
    x.text("ebsOptimized", false);
    x.text("rootDeviceType", "ebs");
    x.text("rootDeviceName", "/dev/xvda");
    x.text("virtualizationType", "hvm");
    // IMDSv2 required, hop limit 2 (what EKS node groups use, so pods behind a hop reach IMDS)
    x.nest("metadataOptions", |x| {
        x.text("state", "applied");
        x.text("httpTokens", "required");
        x.text("httpPutResponseHopLimit", 2);
        x.text("httpEndpoint", "enabled");
        x.text("httpProtocolIpv6", "disabled");
        x.text("instanceMetadataTags", "disabled");
    });
    x.text("sourceDestCheck", true);
    x.text("hypervisor", "xen");
    x.text("architecture", "x86_64");
    let primary_groups = enis
        .iter()
        .find(|e| e.id == inst.primary_eni)
        .map(|e| e.groups.clone())
        .unwrap_or_default();
    group_set(x, s, &primary_groups);
    tag_set(x, &inst.tags);
    x.list("networkInterfaceSet", enis, |x, e| {
        x.text("networkInterfaceId", &e.id);
        x.text("subnetId", &e.subnet_id);
        x.text("vpcId", &s.vpc.id);
        x.text("description", &e.description);
        x.text("ownerId", &s.account_id);
        x.text("status", e.status());
        x.text("macAddress", &e.mac);
        x.text("privateIpAddress", e.primary_ip());
        x.text("privateDnsName", private_dns(e.primary_ip(), &s.region));
        x.text("sourceDestCheck", e.source_dest_check);
        x.text("interfaceType", s.described_type(e));
        group_set(x, s, &e.groups);
        if let Some(a) = &e.attachment {
            x.nest("attachment", |x| {
                x.text("attachmentId", &a.id);
                x.text("deviceIndex", a.device_index);
                x.text("networkCardIndex", a.network_card_index);
                x.text("status", "attached");
                x.text("attachTime", ts(a.attach_time));
                x.text("deleteOnTermination", a.delete_on_termination);
            });
        }
        x.list(
            "privateIpAddressesSet",
            e.private_ips.iter().enumerate(),
            |x, (i, ip)| {
                x.text("privateIpAddress", ip);
                x.text("privateDnsName", private_dns(*ip, &s.region));
                x.text("primary", i == 0);
            },
        );
        x.list("ipv6AddressesSet", &e.ipv6_addresses, |x, ip| {
            x.text("ipv6Address", ip)
        });
        x.list("ipv4PrefixSet", &e.ipv4_prefixes, |x, pf| {
            x.text("ipv4Prefix", pf)
        });
        x.list("ipv6PrefixSet", &e.ipv6_prefixes, |x, pf| {
            x.text("ipv6Prefix", pf)
        });
    });
}

fn reservation(x: &mut Xml, s: &State, insts: &[&Instance]) {
    x.text(
        "reservationId",
        format!("r-{}", insts.first().map_or("0", |i| &i.id[2..])),
    );
    x.text("ownerId", &s.account_id);
    x.list("groupSet", std::iter::empty::<()>(), |_, ()| {});
    x.list("instancesSet", insts, |x, i| instance_body(x, s, i));
}

fn describe_instances(world: &World, p: &Params, rid: &str) -> Answer {
    let ids = p.list("InstanceId");
    let filters = p.filters();
    let root = "DescribeInstancesResponse";
    world.read(|s| {
        for id in &ids {
            s.instance(id)?;
        }
        let mut matched = Vec::new();
        for i in s.instances.values() {
            if (ids.is_empty() || ids.contains(&i.id)) && s.instance_matches(i, &filters)? {
                matched.push(i);
            }
        }
        let (page, next) = paginate(matched, p, 5, 1000)?;
        let mut x = Xml::response(root, rid);
        // one reservation per instance
        x.list("reservationSet", page, |x, i| reservation(x, s, &[i]));
        x.opt("nextToken", next);
        Ok(x.finish(root))
    })
}

fn run_instances(world: &World, p: &Params, rid: &str) -> Answer {
    let min: u32 = p
        .parse("MinCount")?
        .ok_or_else(|| StateError::MissingParameter("MinCount".into()))?;
    let max: u32 = p
        .parse("MaxCount")?
        .ok_or_else(|| StateError::MissingParameter("MaxCount".into()))?;
    if min > max || min == 0 {
        return Err(StateError::InvalidParameterValue(
            "MinCount must be between 1 and MaxCount".into(),
        )
        .into());
    }
    let req = state::RunInstances {
        instance_type: p.get("InstanceType").unwrap_or("m5.large").to_owned(),
        subnet_id: p.get("SubnetId").map(str::to_owned),
        count: max,
        groups: p.list("SecurityGroupId"),
        tags: p.tag_specs("instance")?,
        ipv6_count: u32_param(p, "Ipv6AddressCount")?,
    };
    let ids = world.mutate(|s, now| s.run_instances(req, now))?;
    let root = "RunInstancesResponse";
    world.read(|s| {
        let insts: Vec<&Instance> = ids.iter().filter_map(|id| s.instances.get(id)).collect();
        let mut x = Xml::response(root, rid);
        reservation(&mut x, s, &insts);
        Ok(x.finish(root))
    })
}

fn terminate_instances(world: &World, p: &Params, rid: &str) -> Answer {
    let ids = p.list("InstanceId");
    if ids.is_empty() {
        return Err(StateError::MissingParameter("InstanceId".into()).into());
    }
    let changes = world.mutate(|s, _| s.terminate_instances(&ids))?;
    let root = "TerminateInstancesResponse";
    let mut x = Xml::response(root, rid);
    x.list("instancesSet", changes, |x, c| {
        x.text("instanceId", &c.instance_id);
        x.nest("currentState", |x| {
            x.text("code", c.current.code());
            x.text("name", c.current.name());
        });
        x.nest("previousState", |x| {
            x.text("code", c.previous.code());
            x.text("name", c.previous.name());
        });
    });
    Ok(x.finish(root))
}
