//! The simulator's EC2 API, IMDS and control API driven by real clients: aws-sdk-ec2 (endpoint
//! override, static credentials, retries off unless a test says otherwise) and
//! `aws_config::imds::Client`, against servers bound on 127.0.0.1:0. Every action and every
//! EC2 error the simulator reproduces is exercised here.
// Integration tests are their own crate; the workspace lint targets unit tests in src/.
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    Filter, InstanceStateName, InstanceType, NetworkInterfaceAttachmentChanges,
    NetworkInterfaceStatus, ResourceType, Tag, TagSpecification,
};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vpcsim::clock::ManualClock;
use vpcsim::knobs::{Bucket, Throttle};
use vpcsim::{Knobs, SubnetConfig, World, WorldConfig};

type Server = vpcsim::LocalServer;

async fn serve(router: axum::Router) -> Server {
    vpcsim::LocalServer::start(router).await.unwrap()
}

fn ec2_client(addr: SocketAddr, retry: RetryConfig, timeout: Option<Duration>) -> Client {
    let mut timeouts = TimeoutConfig::builder();
    if let Some(t) = timeout {
        timeouts = timeouts.operation_timeout(t);
    }
    let conf = common::ec2_config(addr, "AKIDVPCSIM")
        .retry_config(retry)
        .timeout_config(timeouts.build())
        .build();
    Client::from_conf(conf)
}

struct Sim {
    world: Arc<World>,
    ec2: Client,
    server: Server,
}

async fn sim_with(config: WorldConfig) -> Sim {
    let world = World::new(config);
    let server = serve(vpcsim::ec2::router(world.clone())).await;
    let ec2 = ec2_client(server.addr(), RetryConfig::disabled(), None);
    Sim { world, ec2, server }
}

async fn sim() -> Sim {
    sim_with(WorldConfig::default()).await
}

impl Sim {
    async fn run(&self, t: &str) -> String {
        let out = self
            .ec2
            .run_instances()
            .instance_type(InstanceType::from(t))
            .min_count(1)
            .max_count(1)
            .send()
            .await
            .unwrap();
        out.instances()[0].instance_id().unwrap().to_owned()
    }
    fn subnet(&self) -> String {
        self.world.read(|s| s.default_subnet().unwrap().id.clone())
    }
    fn groups(&self) -> Vec<String> {
        self.world
            .read(|s| s.security_groups.keys().cloned().collect())
    }
    fn primary_eni(&self, inst: &str) -> String {
        self.world.read(|s| s.instances[inst].primary_eni.clone())
    }
    async fn create_eni(&self, secondary: i32) -> String {
        let out = self
            .ec2
            .create_network_interface()
            .subnet_id(self.subnet())
            .secondary_private_ip_address_count(secondary)
            .send()
            .await
            .unwrap();
        out.network_interface()
            .unwrap()
            .network_interface_id()
            .unwrap()
            .to_owned()
    }
    async fn attach(&self, eni: &str, inst: &str, idx: i32) -> Result<String, String> {
        self.ec2
            .attach_network_interface()
            .network_interface_id(eni)
            .instance_id(inst)
            .device_index(idx)
            .send()
            .await
            .map(|o| o.attachment_id().unwrap().to_owned())
            .map_err(|e| e.code().unwrap_or("<no code>").to_owned())
    }
}

/// The EC2 error code of a failed SDK call.
fn code<E: ProvideErrorMetadata, R>(
    r: Result<R, aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>>,
) -> String {
    match r {
        Ok(_) => "<success>".into(),
        Err(e) => e.code().unwrap_or("<no code>").to_owned(),
    }
}

/// HTTP status of a failed SDK call.
fn status<E, R>(
    r: &Result<R, aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>>,
) -> Option<u16> {
    r.as_ref()
        .err()
        .and_then(|e| e.raw_response())
        .map(|r| r.status().as_u16())
}

fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

#[tokio::test]
async fn run_describe_terminate_instances() {
    let sim = sim().await;
    let out = sim
        .ec2
        .run_instances()
        .instance_type(InstanceType::M5Large)
        .min_count(2)
        .max_count(2)
        .send()
        .await
        .unwrap();
    assert_eq!(out.instances().len(), 2);
    let id = out.instances()[0].instance_id().unwrap().to_owned();
    let d = sim
        .ec2
        .describe_instances()
        .instance_ids(&id)
        .send()
        .await
        .unwrap();
    let inst = &d.reservations()[0].instances()[0];
    assert_eq!(inst.instance_type(), Some(&InstanceType::M5Large));
    assert_eq!(
        inst.state().and_then(|s| s.name()),
        Some(&InstanceStateName::Running)
    );
    assert_eq!(
        inst.placement().and_then(|p| p.availability_zone()),
        Some("us-west-2a")
    );
    let nis = inst.network_interfaces();
    assert_eq!(nis.len(), 1);
    assert_eq!(nis[0].attachment().and_then(|a| a.device_index()), Some(0));
    assert_eq!(
        nis[0].attachment().and_then(|a| a.delete_on_termination()),
        Some(true)
    );
    assert_eq!(inst.private_ip_address(), nis[0].private_ip_address());
    let ip: Ipv4Addr = inst.private_ip_address().unwrap().parse().unwrap();
    assert!(
        "198.18.0.0/20"
            .parse::<ipnet::Ipv4Net>()
            .unwrap()
            .contains(&ip)
    );
    assert_ne!(ip.octets()[3], 1, "reserved address handed out");

    let all = sim
        .ec2
        .describe_instances()
        .filters(filter("instance-state-name", "running"))
        .send()
        .await
        .unwrap();
    assert_eq!(all.reservations().len(), 2);

    let t = sim
        .ec2
        .terminate_instances()
        .instance_ids(&id)
        .send()
        .await
        .unwrap();
    assert_eq!(
        t.terminating_instances()[0]
            .current_state()
            .and_then(|s| s.name()),
        Some(&InstanceStateName::Terminated)
    );
    assert_eq!(
        t.terminating_instances()[0]
            .previous_state()
            .and_then(|s| s.name()),
        Some(&InstanceStateName::Running)
    );
    let eni_left = sim.world.read(|s| s.enis.len());
    assert_eq!(
        eni_left, 1,
        "primary ENI of the terminated instance is deleted"
    );

    assert_eq!(
        code(
            sim.ec2
                .describe_instances()
                .instance_ids("i-0000000000000dead")
                .send()
                .await
        ),
        "InvalidInstanceID.NotFound"
    );
    assert_eq!(
        code(
            sim.ec2
                .run_instances()
                .instance_type(InstanceType::from("x9.huge"))
                .min_count(1)
                .max_count(1)
                .send()
                .await
        ),
        "InvalidParameterValue"
    );
}

#[tokio::test]
async fn describe_instance_types_reports_real_limits() {
    let sim = sim().await;
    let want = [
        ("t3.medium", 3, 6, false),
        ("m5.large", 3, 10, false),
        ("m5.xlarge", 4, 15, false),
        ("m5.4xlarge", 8, 30, false),
        ("c5n.18xlarge", 15, 50, false),
        ("m5.metal", 15, 50, true),
    ];
    let mut req = sim.ec2.describe_instance_types();
    for (t, ..) in want {
        req = req.instance_types(InstanceType::from(t));
    }
    let out = req.send().await.unwrap();
    assert_eq!(out.instance_types().len(), want.len());
    for (t, enis, ips, metal) in want {
        let info = out
            .instance_types()
            .iter()
            .find(|i| i.instance_type().map(|x| x.as_str()) == Some(t))
            .unwrap();
        let net = info.network_info().unwrap();
        assert_eq!(net.maximum_network_interfaces(), Some(enis), "{t}");
        assert_eq!(net.ipv4_addresses_per_interface(), Some(ips), "{t}");
        assert_eq!(
            net.network_cards()[0].maximum_network_interfaces(),
            Some(enis)
        );
        assert_eq!(net.default_network_card_index(), Some(0));
        assert_eq!(info.bare_metal(), Some(metal), "{t}");
        assert_eq!(info.hypervisor().is_none(), metal, "{t}");
    }
    let unknown = sim
        .ec2
        .describe_instance_types()
        .instance_types(InstanceType::from("x9.huge"))
        .send()
        .await;
    assert_eq!(code(unknown), "InvalidInstanceType");
    // the SDK paginator walks every page
    let all: Vec<_> = sim
        .ec2
        .describe_instance_types()
        .max_results(5)
        .into_paginator()
        .items()
        .send()
        .collect::<Vec<_>>()
        .await;
    assert_eq!(all.len(), vpcsim::limits::INSTANCE_TYPES.len());
}

#[tokio::test]
async fn describe_subnets_and_security_groups() {
    let sim = sim().await;
    sim.run("m5.large").await;
    let out = sim.ec2.describe_subnets().send().await.unwrap();
    assert_eq!(out.subnets().len(), 2);
    let first = &out.subnets()[0];
    assert_eq!(first.cidr_block(), Some("198.18.0.0/20"));
    // 4096 addresses, 5 reserved, 1 used by the instance
    assert_eq!(first.available_ip_address_count(), Some(4096 - 5 - 1));
    assert_eq!(
        first.ipv6_cidr_block_association_set()[0].ipv6_cidr_block(),
        Some("2001:db8:1200::/64")
    );
    let vpc = first.vpc_id().unwrap().to_owned();
    let id = first.subnet_id().unwrap().to_owned();

    sim.ec2
        .create_tags()
        .resources(&id)
        .tags(
            Tag::builder()
                .key("kubernetes.io/role/cni")
                .value("1")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let tagged = sim
        .ec2
        .describe_subnets()
        .filters(filter("vpc-id", &vpc))
        .filters(filter("tag-key", "kubernetes.io/role/cni"))
        .send()
        .await
        .unwrap();
    assert_eq!(tagged.subnets().len(), 1);
    assert_eq!(
        tagged.subnets()[0].tags()[0].key(),
        Some("kubernetes.io/role/cni")
    );
    assert_eq!(
        code(
            sim.ec2
                .describe_subnets()
                .subnet_ids("subnet-0000000000000dead")
                .send()
                .await
        ),
        "InvalidSubnetID.NotFound"
    );

    let groups = sim.groups();
    let sg = sim
        .ec2
        .describe_security_groups()
        .group_ids(&groups[1])
        .send()
        .await
        .unwrap();
    assert_eq!(sg.security_groups().len(), 1);
    assert_eq!(sg.security_groups()[0].group_name(), Some("pods"));
    assert_eq!(sg.security_groups()[0].vpc_id(), Some(vpc.as_str()));
    assert_eq!(
        code(
            sim.ec2
                .describe_security_groups()
                .group_ids("sg-0000000000000dead")
                .send()
                .await
        ),
        "InvalidGroup.NotFound"
    );
}

#[tokio::test]
async fn eni_lifecycle_create_attach_modify_detach_delete() {
    let sim = sim().await;
    let inst = sim.run("m5.large").await;
    let groups = sim.groups();
    let out = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .description("aws-K8S-test")
        .groups(&groups[1])
        .secondary_private_ip_address_count(3)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::NetworkInterface)
                .tags(
                    Tag::builder()
                        .key("node.k8s.amazonaws.com/instance_id")
                        .value(&inst)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    let ni = out.network_interface().unwrap();
    let eni = ni.network_interface_id().unwrap().to_owned();
    assert_eq!(ni.private_ip_addresses().len(), 4);
    assert_eq!(
        ni.private_ip_addresses()
            .iter()
            .filter(|a| a.primary() == Some(true))
            .count(),
        1
    );
    assert_eq!(ni.description(), Some("aws-K8S-test"));
    assert_eq!(ni.groups()[0].group_id(), Some(groups[1].as_str()));
    assert_eq!(ni.tag_set()[0].value(), Some(inst.as_str()));
    assert_eq!(ni.status(), Some(&NetworkInterfaceStatus::Available));
    assert!(ni.mac_address().unwrap().len() == 17);
    assert!(ni.attachment().is_none());

    let att = sim.attach(&eni, &inst, 1).await.unwrap();
    let d = sim
        .ec2
        .describe_network_interfaces()
        .filters(filter("attachment.instance-id", &inst))
        .send()
        .await
        .unwrap();
    assert_eq!(d.network_interfaces().len(), 2);
    let mine = d
        .network_interfaces()
        .iter()
        .find(|n| n.network_interface_id() == Some(eni.as_str()))
        .unwrap();
    assert_eq!(mine.status(), Some(&NetworkInterfaceStatus::InUse));
    assert_eq!(
        mine.attachment().and_then(|a| a.attachment_id()),
        Some(att.as_str())
    );
    assert_eq!(
        mine.attachment().and_then(|a| a.delete_on_termination()),
        Some(false)
    );

    sim.ec2
        .modify_network_interface_attribute()
        .network_interface_id(&eni)
        .attachment(
            NetworkInterfaceAttachmentChanges::builder()
                .attachment_id(&att)
                .delete_on_termination(true)
                .build(),
        )
        .send()
        .await
        .unwrap();
    sim.ec2
        .modify_network_interface_attribute()
        .network_interface_id(&eni)
        .groups(&groups[0])
        .groups(&groups[1])
        .send()
        .await
        .unwrap();
    let d = sim
        .ec2
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await
        .unwrap();
    let n = &d.network_interfaces()[0];
    assert_eq!(
        n.attachment().and_then(|a| a.delete_on_termination()),
        Some(true)
    );
    assert_eq!(n.groups().len(), 2);
    let bad_group = sim
        .ec2
        .modify_network_interface_attribute()
        .network_interface_id(&eni)
        .groups("sg-0000000000000dead")
        .send()
        .await;
    assert_eq!(code(bad_group), "InvalidGroup.NotFound");
    let bad_att = sim
        .ec2
        .modify_network_interface_attribute()
        .network_interface_id(&eni)
        .attachment(
            NetworkInterfaceAttachmentChanges::builder()
                .attachment_id("eni-attach-0000000000000dead")
                .delete_on_termination(true)
                .build(),
        )
        .send()
        .await;
    assert_eq!(code(bad_att), "InvalidAttachmentID.NotFound");

    // attached: cannot delete, cannot attach twice
    assert_eq!(
        code(
            sim.ec2
                .delete_network_interface()
                .network_interface_id(&eni)
                .send()
                .await
        ),
        "InvalidNetworkInterface.InUse"
    );
    assert_eq!(
        sim.attach(&eni, &inst, 2).await.unwrap_err(),
        "InvalidNetworkInterface.InUse"
    );
    sim.ec2
        .detach_network_interface()
        .attachment_id(&att)
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(
            sim.ec2
                .detach_network_interface()
                .attachment_id(&att)
                .send()
                .await
        ),
        "InvalidAttachmentID.NotFound"
    );
    sim.ec2
        .delete_network_interface()
        .network_interface_id(&eni)
        .send()
        .await
        .unwrap();
    let gone = sim
        .ec2
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await;
    assert_eq!(status(&gone), Some(400));
    assert_eq!(code(gone), "InvalidNetworkInterfaceID.NotFound");
    assert_eq!(
        code(
            sim.ec2
                .delete_network_interface()
                .network_interface_id("bogus")
                .send()
                .await
        ),
        "InvalidNetworkInterfaceID.Malformed"
    );
    let malformed = sim
        .ec2
        .describe_network_interfaces()
        .network_interface_ids("bogus")
        .send()
        .await;
    assert_eq!(code(malformed), "InvalidNetworkInterfaceID.Malformed");
}

#[tokio::test]
async fn primary_eni_and_primary_ip_are_protected() {
    let sim = sim().await;
    let inst = sim.run("m5.large").await;
    let primary = sim.primary_eni(&inst);
    let d = sim
        .ec2
        .describe_network_interfaces()
        .network_interface_ids(&primary)
        .send()
        .await
        .unwrap();
    let n = &d.network_interfaces()[0];
    let att = n.attachment().unwrap().attachment_id().unwrap().to_owned();
    let ip = n.private_ip_address().unwrap().to_owned();
    assert_eq!(
        code(
            sim.ec2
                .detach_network_interface()
                .attachment_id(&att)
                .send()
                .await
        ),
        "OperationNotPermitted"
    );
    assert_eq!(
        code(
            sim.ec2
                .delete_network_interface()
                .network_interface_id(&primary)
                .send()
                .await
        ),
        "InvalidNetworkInterface.InUse"
    );
    let unassign = sim
        .ec2
        .unassign_private_ip_addresses()
        .network_interface_id(&primary)
        .private_ip_addresses(&ip)
        .send()
        .await;
    assert_eq!(code(unassign), "InvalidParameterValue");
    let unknown = sim
        .ec2
        .unassign_private_ip_addresses()
        .network_interface_id(&primary)
        .private_ip_addresses("198.18.9.9")
        .send()
        .await;
    assert_eq!(code(unknown), "InvalidParameterValue");
    assert_eq!(sim.world.read(|s| s.enis[&primary].private_ips.len()), 1);
}

#[tokio::test]
async fn attachment_limit_and_unique_device_index() {
    let sim = sim().await;
    let inst = sim.run("t3.medium").await;
    let e1 = sim.create_eni(0).await;
    let e2 = sim.create_eni(0).await;
    let e3 = sim.create_eni(0).await;
    assert_eq!(
        sim.attach(&e1, &inst, 0).await.unwrap_err(),
        "InvalidParameterValue",
        "device index 0 is taken by eth0"
    );
    sim.attach(&e1, &inst, 1).await.unwrap();
    assert_eq!(
        sim.attach(&e2, &inst, 1).await.unwrap_err(),
        "InvalidParameterValue",
        "duplicate device index"
    );
    sim.attach(&e2, &inst, 2).await.unwrap();
    let over = sim
        .ec2
        .attach_network_interface()
        .network_interface_id(&e3)
        .instance_id(&inst)
        .device_index(3)
        .send()
        .await;
    assert_eq!(status(&over), Some(400));
    assert_eq!(code(over), "AttachmentLimitExceeded");
    assert_eq!(
        sim.attach(&e3, "i-0000000000000dead", 1).await.unwrap_err(),
        "InvalidInstanceID.NotFound"
    );
}

#[tokio::test]
async fn ip_limit_per_eni_and_assign_returns_only_new_addresses() {
    let sim = sim().await;
    let inst = sim.run("m5.large").await;
    let primary = sim.primary_eni(&inst);
    let a = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&primary)
        .secondary_private_ip_address_count(4)
        .send()
        .await
        .unwrap();
    assert_eq!(a.assigned_private_ip_addresses().len(), 4);
    let b = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&primary)
        .secondary_private_ip_address_count(5)
        .send()
        .await
        .unwrap();
    assert_eq!(
        b.assigned_private_ip_addresses().len(),
        5,
        "only the new addresses are returned"
    );
    let mut all: Vec<&str> = a
        .assigned_private_ip_addresses()
        .iter()
        .chain(b.assigned_private_ip_addresses())
        .map(|x| x.private_ip_address().unwrap())
        .collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 9, "no duplicates");
    let over = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&primary)
        .secondary_private_ip_address_count(1)
        .send()
        .await;
    assert_eq!(code(over), "PrivateIpAddressLimitExceeded");
    // prefixes use the same slots
    let over = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&primary)
        .ipv4_prefix_count(1)
        .send()
        .await;
    assert_eq!(code(over), "PrivateIpAddressLimitExceeded");

    // a new ENI on this type: 10 slots, primary included
    let eni = sim.create_eni(0).await;
    sim.attach(&eni, &inst, 1).await.unwrap();
    let over = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .secondary_private_ip_address_count(10)
        .send()
        .await;
    assert_eq!(code(over), "PrivateIpAddressLimitExceeded");
    // an unattached ENI holding more than the type allows cannot be attached
    let big = sim.create_eni(20).await;
    assert_eq!(
        sim.attach(&big, &inst, 2).await.unwrap_err(),
        "PrivateIpAddressLimitExceeded"
    );
}

#[tokio::test]
async fn prefix_delegation_aligned_blocks() {
    let sim = sim().await;
    let inst = sim.run("m5.large").await;
    let out = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .ipv4_prefix_count(2)
        .send()
        .await
        .unwrap();
    let ni = out.network_interface().unwrap();
    let eni = ni.network_interface_id().unwrap().to_owned();
    assert_eq!(ni.ipv4_prefixes().len(), 2);
    for p in ni.ipv4_prefixes() {
        let net: ipnet::Ipv4Net = p.ipv4_prefix().unwrap().parse().unwrap();
        assert_eq!(net.prefix_len(), 28);
        assert_eq!(net.network(), net.addr(), "aligned");
    }
    sim.attach(&eni, &inst, 1).await.unwrap();
    let a = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(3)
        .send()
        .await
        .unwrap();
    assert_eq!(a.assigned_ipv4_prefixes().len(), 3);
    assert!(a.assigned_private_ip_addresses().is_empty());
    let mixed = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefix_count(1)
        .secondary_private_ip_address_count(1)
        .send()
        .await;
    assert_eq!(code(mixed), "InvalidParameterCombination");
    let first = a.assigned_ipv4_prefixes()[0]
        .ipv4_prefix()
        .unwrap()
        .to_owned();
    sim.ec2
        .unassign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefixes(&first)
        .send()
        .await
        .unwrap();
    let again = sim
        .ec2
        .unassign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefixes(&first)
        .send()
        .await;
    assert_eq!(code(again), "InvalidParameterValue");
    let d = sim
        .ec2
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await
        .unwrap();
    assert_eq!(d.network_interfaces()[0].ipv4_prefixes().len(), 4);
    // no prefix delegation on a Xen type
    let xen = sim.run("m4.large").await;
    let xen_primary = sim.primary_eni(&xen);
    let refused = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&xen_primary)
        .ipv4_prefix_count(1)
        .send()
        .await;
    assert_eq!(code(refused), "InvalidParameterValue");
}

fn small_subnet_world(cidr: &str) -> WorldConfig {
    WorldConfig {
        subnets: vec![SubnetConfig {
            cidr: cidr.parse().unwrap(),
            availability_zone: None,
            ipv6_cidr: None,
            tags: Default::default(),
        }],
        ..WorldConfig::default()
    }
}

#[tokio::test]
async fn fragmented_subnet_refuses_prefixes_while_addresses_fit() {
    let sim = sim_with(small_subnet_world("198.18.0.0/24")).await;
    let inst = sim.run("m5.4xlarge").await; // primary takes .4
    let primary = sim.primary_eni(&inst);
    // one address inside every other /28 (blocks 1..=15)
    let mut req = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&primary);
    for block in 1..16u8 {
        req = req.private_ip_addresses(Ipv4Addr::new(198, 18, 0, block * 16 + 5).to_string());
    }
    req.send().await.unwrap();
    let p = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&primary)
        .ipv4_prefix_count(1)
        .send()
        .await;
    assert_eq!(code(p), "InsufficientCidrBlocks");
    let eni = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .ipv4_prefix_count(1)
        .send()
        .await;
    assert_eq!(code(eni), "InsufficientCidrBlocks");
    let a = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&primary)
        .secondary_private_ip_address_count(5)
        .send()
        .await
        .unwrap();
    assert_eq!(a.assigned_private_ip_addresses().len(), 5, "/32s still fit");
}

#[tokio::test]
async fn subnet_exhaustion_and_explicit_addresses() {
    let sim = sim_with(small_subnet_world("198.18.0.0/28")).await;
    // 16 addresses - 5 reserved = 11 usable
    let inst = sim.run("m5.4xlarge").await;
    let primary = sim.primary_eni(&inst);
    let over = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&primary)
        .secondary_private_ip_address_count(11)
        .send()
        .await;
    assert_eq!(code(over), "InsufficientFreeAddressesInSubnet");
    sim.ec2
        .assign_private_ip_addresses()
        .network_interface_id(&primary)
        .secondary_private_ip_address_count(8)
        .send()
        .await
        .unwrap();
    let other = sim.create_eni(1).await; // takes the last two
    let none = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .send()
        .await;
    assert_eq!(code(none), "InsufficientFreeAddressesInSubnet");
    let s = sim.ec2.describe_subnets().send().await.unwrap();
    assert_eq!(s.subnets()[0].available_ip_address_count(), Some(0));

    // explicit addresses: reserved, outside the subnet, owned by another ENI
    for bad in ["198.18.0.1", "198.18.0.15", "198.18.1.9"] {
        let r = sim
            .ec2
            .assign_private_ip_addresses()
            .network_interface_id(&other)
            .private_ip_addresses(bad)
            .send()
            .await;
        assert_eq!(code(r), "InvalidParameterValue", "{bad}");
    }
    let taken = sim
        .world
        .read(|s| s.enis[&primary].private_ips[1].to_string());
    let r = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&other)
        .private_ip_addresses(&taken)
        .send()
        .await;
    assert_eq!(code(r), "InvalidIPAddress.InUse");
    sim.ec2
        .assign_private_ip_addresses()
        .network_interface_id(&other)
        .private_ip_addresses(&taken)
        .allow_reassignment(true)
        .send()
        .await
        .unwrap();
    let owners = sim.world.read(|s| {
        s.enis
            .values()
            .filter(|e| e.private_ips.iter().any(|ip| ip.to_string() == taken))
            .count()
    });
    assert_eq!(owners, 1, "reassigned, not duplicated");
    sim.ec2
        .unassign_private_ip_addresses()
        .network_interface_id(&other)
        .private_ip_addresses(&taken)
        .send()
        .await
        .unwrap();
    assert_eq!(
        sim.ec2.describe_subnets().send().await.unwrap().subnets()[0].available_ip_address_count(),
        Some(1)
    );
}

#[tokio::test]
async fn ipv6_addresses_and_prefixes() {
    let sim = sim().await;
    let inst = sim.run("m5.large").await;
    let eni = sim.primary_eni(&inst);
    let a = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_address_count(2)
        .send()
        .await
        .unwrap();
    assert_eq!(a.assigned_ipv6_addresses().len(), 2);
    let p = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_prefix_count(1)
        .send()
        .await
        .unwrap();
    let prefix = p.assigned_ipv6_prefixes()[0].clone();
    let net: ipnet::Ipv6Net = prefix.parse().unwrap();
    assert_eq!(net.prefix_len(), 80);
    assert!(
        "2001:db8:1200::/64"
            .parse::<ipnet::Ipv6Net>()
            .unwrap()
            .contains(&net)
    );
    let d = sim
        .ec2
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await
        .unwrap();
    assert_eq!(d.network_interfaces()[0].ipv6_addresses().len(), 2);
    assert_eq!(
        d.network_interfaces()[0].ipv6_prefixes()[0].ipv6_prefix(),
        Some(prefix.as_str())
    );
    let u = sim
        .ec2
        .unassign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_addresses(&a.assigned_ipv6_addresses()[0])
        .ipv6_prefixes(&prefix)
        .send()
        .await
        .unwrap();
    assert_eq!(
        u.unassigned_ipv6_addresses(),
        &a.assigned_ipv6_addresses()[..1]
    );
    assert_eq!(u.unassigned_ipv6_prefixes(), std::slice::from_ref(&prefix));
    let again = sim
        .ec2
        .unassign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_prefixes(&prefix)
        .send()
        .await;
    assert_eq!(code(again), "InvalidParameterValue");
    let over = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_address_count(10)
        .send()
        .await;
    assert_eq!(code(over), "PrivateIpAddressLimitExceeded");
}

#[tokio::test]
async fn tags_and_filters() {
    let sim = sim().await;
    let inst = sim.run("m5.large").await;
    let a = sim.create_eni(0).await;
    let b = sim.create_eni(0).await;
    sim.attach(&a, &inst, 1).await.unwrap();
    sim.ec2
        .create_tags()
        .resources(&a)
        .resources(&b)
        .tags(
            Tag::builder()
                .key("node.k8s.amazonaws.com/instance_id")
                .value(&inst)
                .build(),
        )
        .tags(
            Tag::builder()
                .key("cluster.k8s.amazonaws.com/name")
                .value("c1")
                .build(),
        )
        .send()
        .await
        .unwrap();
    sim.ec2
        .delete_tags()
        .resources(&b)
        .tags(Tag::builder().key("cluster.k8s.amazonaws.com/name").build())
        .send()
        .await
        .unwrap();
    // a value that does not match leaves the tag alone
    sim.ec2
        .delete_tags()
        .resources(&a)
        .tags(
            Tag::builder()
                .key("cluster.k8s.amazonaws.com/name")
                .value("other")
                .build(),
        )
        .send()
        .await
        .unwrap();
    sim.ec2
        .modify_network_interface_attribute()
        .network_interface_id(&b)
        .description(
            aws_sdk_ec2::types::AttributeValue::builder()
                .value("aws-K8S-i-123")
                .build(),
        )
        .send()
        .await
        .unwrap();

    let ids = |d: aws_sdk_ec2::operation::describe_network_interfaces::DescribeNetworkInterfacesOutput| {
        let mut v: Vec<String> = d.network_interfaces().iter().map(|n| n.network_interface_id().unwrap().to_owned()).collect();
        v.sort();
        v
    };
    let q = |f: Vec<Filter>| {
        let mut r = sim.ec2.describe_network_interfaces();
        for x in f {
            r = r.filters(x);
        }
        r.send()
    };
    let vpc = sim.world.read(|s| s.vpc.id.clone());
    assert_eq!(
        ids(q(vec![filter("tag:cluster.k8s.amazonaws.com/name", "c1")])
            .await
            .unwrap()),
        vec![a.clone()]
    );
    assert_eq!(
        ids(q(vec![filter(
            "tag-key",
            "node.k8s.amazonaws.com/instance_id"
        )])
        .await
        .unwrap()),
        vec![a.clone(), b.clone()]
    );
    assert_eq!(
        ids(
            q(vec![filter("status", "available"), filter("vpc-id", &vpc)])
                .await
                .unwrap()
        ),
        vec![b.clone()]
    );
    assert_eq!(
        ids(q(vec![filter("description", "aws-K8S-*")]).await.unwrap()),
        vec![b.clone()]
    );
    assert_eq!(
        ids(q(vec![filter("network-interface-id", &a)]).await.unwrap()),
        vec![a.clone()]
    );
    assert_eq!(
        ids(q(vec![
            filter("subnet-id", &sim.subnet()),
            filter("attachment.instance-id", &inst)
        ])
        .await
        .unwrap())
        .len(),
        2
    );
    assert!(
        ids(q(vec![filter("vpc-id", "vpc-0000000000000dead")])
            .await
            .unwrap())
        .is_empty()
    );
    assert_eq!(
        code(q(vec![filter("no-such-filter", "x")]).await),
        "InvalidParameterValue"
    );
    assert_eq!(
        code(
            sim.ec2
                .create_tags()
                .resources("eni-0000000000000dead")
                .tags(Tag::builder().key("k").value("v").build())
                .send()
                .await
        ),
        "InvalidNetworkInterfaceID.NotFound"
    );
}

#[tokio::test]
async fn describe_network_interfaces_pagination() {
    let sim = sim().await;
    for _ in 0..12 {
        sim.create_eni(0).await;
    }
    let p1 = sim
        .ec2
        .describe_network_interfaces()
        .max_results(5)
        .send()
        .await
        .unwrap();
    assert_eq!(p1.network_interfaces().len(), 5);
    let t1 = p1.next_token().unwrap().to_owned();
    let p2 = sim
        .ec2
        .describe_network_interfaces()
        .max_results(5)
        .next_token(&t1)
        .send()
        .await
        .unwrap();
    assert_eq!(p2.network_interfaces().len(), 5);
    let t2 = p2.next_token().unwrap().to_owned();
    let p3 = sim
        .ec2
        .describe_network_interfaces()
        .max_results(5)
        .next_token(&t2)
        .send()
        .await
        .unwrap();
    assert_eq!(p3.network_interfaces().len(), 2);
    assert!(p3.next_token().is_none());
    let all: Vec<_> = sim
        .ec2
        .describe_network_interfaces()
        .max_results(5)
        .into_paginator()
        .items()
        .send()
        .collect::<Vec<_>>()
        .await;
    assert_eq!(all.len(), 12);
    assert_eq!(
        code(
            sim.ec2
                .describe_network_interfaces()
                .max_results(3)
                .send()
                .await
        ),
        "InvalidParameterValue"
    );
    let eni = p1.network_interfaces()[0].network_interface_id().unwrap();
    let combo = sim
        .ec2
        .describe_network_interfaces()
        .max_results(5)
        .network_interface_ids(eni)
        .send()
        .await;
    assert_eq!(code(combo), "InvalidParameterCombination");
    assert_eq!(
        code(
            sim.ec2
                .describe_network_interfaces()
                .max_results(5)
                .next_token("garbage")
                .send()
                .await
        ),
        "InvalidParameterValue"
    );
}

#[tokio::test]
async fn dry_run_answers_dry_run_operation_and_changes_nothing() {
    let sim = sim().await;
    let inst = sim.run("m5.large").await;
    let eni = sim.primary_eni(&inst);
    let before = sim.world.read(|s| {
        (
            s.enis.len(),
            s.instances.len(),
            s.enis[&eni].private_ips.len(),
        )
    });
    let subnet = sim.subnet();
    let results = vec![
        status_code(sim.ec2.describe_instances().dry_run(true).send().await),
        status_code(
            sim.ec2
                .describe_network_interfaces()
                .dry_run(true)
                .send()
                .await,
        ),
        status_code(sim.ec2.describe_subnets().dry_run(true).send().await),
        status_code(
            sim.ec2
                .describe_security_groups()
                .dry_run(true)
                .send()
                .await,
        ),
        status_code(sim.ec2.describe_instance_types().dry_run(true).send().await),
        status_code(
            sim.ec2
                .create_network_interface()
                .subnet_id(&subnet)
                .dry_run(true)
                .send()
                .await,
        ),
        status_code(
            sim.ec2
                .assign_private_ip_addresses()
                .network_interface_id(&eni)
                .secondary_private_ip_address_count(1)
                .send()
                .await,
        ),
        status_code(
            sim.ec2
                .run_instances()
                .instance_type(InstanceType::M5Large)
                .min_count(1)
                .max_count(1)
                .dry_run(true)
                .send()
                .await,
        ),
        status_code(
            sim.ec2
                .terminate_instances()
                .instance_ids(&inst)
                .dry_run(true)
                .send()
                .await,
        ),
        status_code(
            sim.ec2
                .create_tags()
                .resources(&eni)
                .tags(Tag::builder().key("k").value("v").build())
                .dry_run(true)
                .send()
                .await,
        ),
        status_code(
            sim.ec2
                .delete_network_interface()
                .network_interface_id(&eni)
                .dry_run(true)
                .send()
                .await,
        ),
        status_code(
            sim.ec2
                .attach_network_interface()
                .network_interface_id(&eni)
                .instance_id(&inst)
                .device_index(1)
                .dry_run(true)
                .send()
                .await,
        ),
        status_code(
            sim.ec2
                .detach_network_interface()
                .attachment_id("eni-attach-x")
                .dry_run(true)
                .send()
                .await,
        ),
        status_code(
            sim.ec2
                .modify_network_interface_attribute()
                .network_interface_id(&eni)
                .dry_run(true)
                .send()
                .await,
        ),
    ];
    // AssignPrivateIpAddresses has no DryRun parameter in EC2's API: it really assigned one
    let expected_assign = ("<success>".to_owned(), None);
    for (i, r) in results.iter().enumerate() {
        if i == 6 {
            assert_eq!(r, &expected_assign);
        } else {
            assert_eq!(r, &("DryRunOperation".to_owned(), Some(412)), "call #{i}");
        }
    }
    let after = sim.world.read(|s| {
        (
            s.enis.len(),
            s.instances.len(),
            s.enis[&eni].private_ips.len(),
        )
    });
    assert_eq!(after, (before.0, before.1, before.2 + 1));
}

fn status_code<E: ProvideErrorMetadata, R>(
    r: Result<R, aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>>,
) -> (String, Option<u16>) {
    let s = status(&r);
    (code(r), s)
}

#[tokio::test]
async fn throttling_token_bucket_answers_request_limit_exceeded() {
    let sim = sim().await;
    let throttle = Throttle {
        enabled: true,
        describe: Bucket {
            capacity: 2,
            refill_per_sec: 0.0,
        },
        ..Throttle::default()
    };
    sim.world.set_knobs(Knobs {
        throttle,
        ..Knobs::default()
    });
    sim.ec2.describe_subnets().send().await.unwrap();
    sim.ec2.describe_subnets().send().await.unwrap();
    let r = sim.ec2.describe_subnets().send().await;
    assert_eq!(status(&r), Some(503));
    assert_eq!(code(r), "RequestLimitExceeded");
    // mutating calls have their own bucket
    sim.ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .send()
        .await
        .unwrap();
    // the SDK's standard retry treats it as throttling and retries, still failing here
    let retrying = ec2_client(
        sim.server.addr(),
        RetryConfig::standard()
            .with_max_attempts(2)
            .with_initial_backoff(Duration::from_millis(1)),
        None,
    );
    assert_eq!(
        code(retrying.describe_subnets().send().await),
        "RequestLimitExceeded"
    );
}

/// Knob `denied_actions`: a missing IAM permission. The denied action answers
/// `UnauthorizedOperation` (403) and does nothing; other actions are unaffected.
#[tokio::test]
async fn denied_actions_answer_unauthorized_operation_and_change_nothing() {
    let sim = sim().await;
    sim.world.set_knobs(Knobs {
        denied_actions: vec!["CreateNetworkInterface".into()],
        ..Knobs::default()
    });
    let before = sim.world.read(|s| s.enis.len());
    let r = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .send()
        .await;
    assert_eq!(status(&r), Some(403));
    assert_eq!(code(r), "UnauthorizedOperation");
    assert_eq!(sim.world.read(|s| s.enis.len()), before);
    sim.ec2.describe_subnets().send().await.unwrap();
    sim.world.set_knobs(Knobs::default());
    sim.ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .send()
        .await
        .unwrap();
}

#[tokio::test]
async fn throttling_is_per_account_per_action_and_counted_on_the_control_api() {
    let sim = sim().await;
    sim.world.set_knobs(Knobs {
        throttle: Throttle {
            mutate: Bucket {
                capacity: 2,
                refill_per_sec: 0.0,
            },
            unfiltered: Bucket {
                capacity: 1,
                refill_per_sec: 0.0,
            },
            ..Throttle::default()
        },
        ..Knobs::default()
    });
    let eni = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .send()
        .await
        .unwrap()
        .network_interface()
        .unwrap()
        .network_interface_id()
        .unwrap()
        .to_owned();
    // two clients (two nodes) of one account share the action's bucket
    let other = ec2_client(sim.server.addr(), RetryConfig::disabled(), None);
    let tag = |c: &aws_sdk_ec2::Client| {
        c.create_tags()
            .resources(&eni)
            .tags(
                aws_sdk_ec2::types::Tag::builder()
                    .key("k")
                    .value("v")
                    .build(),
            )
            .send()
    };
    tag(&sim.ec2).await.unwrap();
    tag(&other).await.unwrap();
    let r = tag(&other).await;
    assert_eq!(status(&r), Some(503));
    assert_eq!(code(r), "RequestLimitExceeded");
    // another mutating action has its own bucket of the same size (one token left)
    sim.ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .send()
        .await
        .unwrap();
    // an unfiltered, unpaginated DescribeNetworkInterfaces uses the smaller bucket; a
    // filtered one does not
    sim.ec2.describe_network_interfaces().send().await.unwrap();
    assert_eq!(
        code(sim.ec2.describe_network_interfaces().send().await),
        "RequestLimitExceeded"
    );
    sim.ec2
        .describe_network_interfaces()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("subnet-id")
                .values(sim.subnet())
                .build(),
        )
        .send()
        .await
        .unwrap();
    let control = serve(vpcsim::control::router(sim.world.clone())).await;
    let (st, body) = raw_http(control.addr(), "GET", "/calls", &[], "").await;
    assert_eq!(st, 200, "{body}");
    let calls: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(calls["CreateTags"]["accepted"], 2, "{body}");
    assert_eq!(calls["CreateTags"]["throttled"], 1, "{body}");
    assert_eq!(calls["CreateNetworkInterface"]["accepted"], 2, "{body}");
    assert_eq!(calls["DescribeNetworkInterfaces"]["accepted"], 2, "{body}");
    assert!(
        calls["DescribeNetworkInterfaces"]["throttled"].as_u64() >= Some(1),
        "{body}"
    );
}

#[tokio::test]
async fn injected_5xx_dropped_connections_and_latency() {
    let sim = sim().await;
    sim.world.set_knobs(Knobs {
        error_5xx_rate: 1.0,
        ..Knobs::default()
    });
    let r = sim.ec2.describe_subnets().send().await;
    assert_eq!(status(&r), Some(500));
    assert_eq!(code(r), "InternalError");

    sim.world.set_knobs(Knobs {
        drop_connection_rate: 1.0,
        ..Knobs::default()
    });
    let r = sim.ec2.describe_subnets().send().await;
    let err = r.unwrap_err();
    assert!(
        err.as_service_error().is_none(),
        "a dropped connection is not a service error: {err:?}"
    );
    assert!(
        err.raw_response()
            .is_none_or(|r| r.status().as_u16() == 200),
        "{err:?}"
    );

    sim.world.set_knobs(Knobs {
        latency_ms: 3_000,
        ..Knobs::default()
    });
    let impatient = ec2_client(
        sim.server.addr(),
        RetryConfig::disabled(),
        Some(Duration::from_millis(300)),
    );
    let r = impatient.describe_subnets().send().await;
    assert!(
        matches!(r, Err(aws_sdk_ec2::error::SdkError::TimeoutError(_))),
        "{r:?}"
    );

    sim.world.set_knobs(Knobs::default());
    sim.ec2.describe_subnets().send().await.unwrap();
}

/// One raw HTTP/1.1 exchange (for what the SDK clients cannot send).
async fn raw_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn unknown_action_is_invalid_action() {
    let sim = sim().await;
    let (status, body) = raw_http(
        sim.server.addr(),
        "POST",
        "/",
        &[("content-type", "application/x-www-form-urlencoded")],
        "Action=DescribeVpcEndpoints&Version=2016-11-15",
    )
    .await;
    assert_eq!(status, 400);
    assert!(body.contains("<Code>InvalidAction</Code>"), "{body}");
}

fn imds_client(addr: SocketAddr) -> aws_config::imds::Client {
    let provider = aws_config::provider_config::ProviderConfig::without_region()
        .with_http_client(common::http_client());
    aws_config::imds::Client::builder()
        .configure(&provider)
        .endpoint(format!("http://{addr}"))
        .unwrap()
        .max_attempts(1)
        .build()
}

#[tokio::test]
async fn imds_through_aws_config_client_with_attach_delay_and_lag() {
    let clock = Arc::new(ManualClock::new());
    let world = World::with_clock(WorldConfig::default(), clock.clone());
    let ec2_server = serve(vpcsim::ec2::router(world.clone())).await;
    let ec2 = ec2_client(ec2_server.addr(), RetryConfig::disabled(), None);
    let out = ec2
        .run_instances()
        .instance_type(InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .unwrap();
    let inst = out.instances()[0].instance_id().unwrap().to_owned();
    let primary_ip = out.instances()[0].private_ip_address().unwrap().to_owned();
    let imds_server = serve(vpcsim::imds::router(world.clone(), inst.clone())).await;
    let imds = imds_client(imds_server.addr());
    let get = |p: &'static str| {
        let imds = imds.clone();
        async move { imds.get(p).await.map(|s| s.as_ref().to_owned()) }
    };
    assert_eq!(get("/latest/meta-data/instance-id").await.unwrap(), inst);
    assert_eq!(
        get("/latest/meta-data/instance-type").await.unwrap(),
        "m5.large"
    );
    assert_eq!(
        get("/latest/meta-data/local-ipv4").await.unwrap(),
        primary_ip
    );
    assert_eq!(
        get("/latest/meta-data/placement/availability-zone")
            .await
            .unwrap(),
        "us-west-2a"
    );
    let mac = get("/latest/meta-data/mac").await.unwrap();
    let key = |k: &str| format!("/latest/meta-data/network/interfaces/macs/{mac}/{k}");
    let imds_get = |p: String| {
        let imds = imds.clone();
        async move { imds.get(&p).await.map(|s| s.as_ref().to_owned()) }
    };
    assert_eq!(imds_get(key("device-number")).await.unwrap(), "0");
    assert_eq!(imds_get(key("network-card")).await.unwrap(), "0");
    assert_eq!(imds_get(key("local-ipv4s")).await.unwrap(), primary_ip);
    assert_eq!(
        imds_get(key("subnet-ipv4-cidr-block")).await.unwrap(),
        "198.18.0.0/20"
    );
    assert_eq!(
        imds_get(key("vpc-ipv4-cidr-blocks")).await.unwrap(),
        "198.18.0.0/16"
    );
    assert!(imds_get(key("vpc-id")).await.unwrap().starts_with("vpc-"));
    assert!(
        imds_get(key("subnet-id"))
            .await
            .unwrap()
            .starts_with("subnet-")
    );
    assert!(
        imds_get(key("security-group-ids"))
            .await
            .unwrap()
            .starts_with("sg-")
    );
    assert!(
        imds_get(key("ipv4-prefix")).await.is_err(),
        "404 without prefixes"
    );

    // attach with a 2 s visibility delay and a 5 s IMDS lag
    world.set_knobs(Knobs {
        attach_delay_ms: 2_000,
        imds_lag_ms: 5_000,
        ..Knobs::default()
    });
    let subnet = world.read(|s| s.default_subnet().unwrap().id.clone());
    let created = ec2
        .create_network_interface()
        .subnet_id(&subnet)
        .ipv4_prefix_count(3)
        .send()
        .await
        .unwrap();
    let ni = created.network_interface().unwrap();
    let new_mac = ni.mac_address().unwrap().to_owned();
    let eni = ni.network_interface_id().unwrap().to_owned();
    ec2.attach_network_interface()
        .network_interface_id(&eni)
        .instance_id(&inst)
        .device_index(1)
        .send()
        .await
        .unwrap();
    let macs = || imds_get("/latest/meta-data/network/interfaces/macs/".to_owned());
    assert_eq!(macs().await.unwrap().lines().count(), 1);
    assert_eq!(
        world
            .fabric_view(world.now())
            .instance(&inst)
            .unwrap()
            .enis
            .len(),
        1
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        world
            .fabric_view(world.now())
            .instance(&inst)
            .unwrap()
            .enis
            .len(),
        2,
        "visible to the fabric after the delay"
    );
    assert_eq!(macs().await.unwrap().lines().count(), 1, "IMDS still lags");
    clock.advance(Duration::from_secs(5));
    let listed = macs().await.unwrap();
    assert!(
        listed.lines().any(|l| l == format!("{new_mac}/")),
        "{listed}"
    );
    let nkey = |k: &str| format!("/latest/meta-data/network/interfaces/macs/{new_mac}/{k}");
    assert_eq!(imds_get(nkey("interface-id")).await.unwrap(), eni);
    assert_eq!(imds_get(nkey("device-number")).await.unwrap(), "1");
    assert_eq!(
        imds_get(nkey("ipv4-prefix")).await.unwrap().lines().count(),
        3
    );
    // upstream #3824: IMDS answers a partial prefix list
    world.set_knobs(Knobs {
        imds_partial_prefixes: Some(1),
        ..Knobs::default()
    });
    assert_eq!(
        imds_get(nkey("ipv4-prefix")).await.unwrap().lines().count(),
        1
    );
}

#[tokio::test]
async fn imds_requires_a_token_and_a_ttl() {
    let world = World::new(WorldConfig::default());
    let inst = world.run_instances("m5.large", 1).unwrap().remove(0);
    let server = serve(vpcsim::imds::router(world.clone(), inst.clone())).await;
    let (st, _) = raw_http(
        server.addr(),
        "GET",
        "/latest/meta-data/instance-id",
        &[],
        "",
    )
    .await;
    assert_eq!(st, 401, "IMDSv1 refused");
    let (st, _) = raw_http(server.addr(), "PUT", "/latest/api/token", &[], "").await;
    assert_eq!(st, 400, "ttl header required");
    let (st, _) = raw_http(
        server.addr(),
        "PUT",
        "/latest/api/token",
        &[("x-aws-ec2-metadata-token-ttl-seconds", "99999")],
        "",
    )
    .await;
    assert_eq!(st, 400, "ttl above 6 h");
    let (st, token) = raw_http(
        server.addr(),
        "PUT",
        "/latest/api/token",
        &[("x-aws-ec2-metadata-token-ttl-seconds", "60")],
        "",
    )
    .await;
    assert_eq!(st, 200);
    let (st, body) = raw_http(
        server.addr(),
        "GET",
        "/latest/meta-data/instance-id",
        &[("x-aws-ec2-metadata-token", &token)],
        "",
    )
    .await;
    assert_eq!((st, body), (200, inst.clone()));
    let (st, _) = raw_http(
        server.addr(),
        "GET",
        "/latest/meta-data/instance-id",
        &[("x-aws-ec2-metadata-token", "forged")],
        "",
    )
    .await;
    assert_eq!(st, 401);
    world
        .mutate(|s, _| s.terminate_instances(std::slice::from_ref(&inst)))
        .unwrap();
    let (st, _) = raw_http(
        server.addr(),
        "GET",
        "/latest/meta-data/instance-id",
        &[("x-aws-ec2-metadata-token", &token)],
        "",
    )
    .await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn control_api_knobs_instances_state() {
    let world = World::new(WorldConfig::default());
    let server = serve(vpcsim::control::router(world.clone())).await;
    let json = [("content-type", "application/json")];
    let (st, body) = raw_http(
        server.addr(),
        "PUT",
        "/knobs",
        &json,
        r#"{"attach_delay_ms": 750, "throttle": {"enabled": false}}"#,
    )
    .await;
    assert_eq!(st, 200, "{body}");
    let k = world.knobs();
    assert_eq!(k.attach_delay_ms, 750);
    assert!(!k.throttle.enabled);
    assert_eq!(k.throttle.describe.capacity, 100, "unmentioned fields kept");
    let (st, _) = raw_http(
        server.addr(),
        "PUT",
        "/knobs",
        &json,
        r#"{"latency_ms": "slow"}"#,
    )
    .await;
    assert_eq!(st, 400);
    let (st, body) = raw_http(
        server.addr(),
        "POST",
        "/instances",
        &json,
        r#"{"instance_type": "t3.medium", "count": 2}"#,
    )
    .await;
    assert_eq!(st, 201, "{body}");
    let launched: vpcsim::control::LaunchResponse = serde_json::from_str(&body).unwrap();
    assert_eq!(launched.instance_ids.len(), 2);
    let (st, body) = raw_http(
        server.addr(),
        "POST",
        "/instances",
        &json,
        r#"{"instance_type": "x9.huge"}"#,
    )
    .await;
    assert_eq!(st, 400);
    assert!(body.contains("InvalidParameterValue"), "{body}");
    let (st, body) = raw_http(server.addr(), "GET", "/view", &[], "").await;
    assert_eq!(st, 200);
    let view: vpcsim::FabricView = serde_json::from_str(&body).unwrap();
    assert_eq!(view.instances.len(), 2);
    assert_eq!(view.subnets[0].gateway, Ipv4Addr::new(198, 18, 0, 1));
    let (st, _) = raw_http(
        server.addr(),
        "DELETE",
        &format!("/instances/{}", launched.instance_ids[0]),
        &[],
        "",
    )
    .await;
    assert_eq!(st, 204);
    let (st, body) = raw_http(server.addr(), "GET", "/state", &[], "").await;
    assert_eq!(st, 200);
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        state["instances"][&launched.instance_ids[0]]["state"],
        "terminated"
    );
}

#[tokio::test]
async fn explicit_addresses_prefixes_and_source_dest_check() {
    use aws_sdk_ec2::types::{Ipv4PrefixSpecificationRequest, PrivateIpAddressSpecification};
    let sim = sim_with(small_subnet_world("198.18.0.0/24")).await;
    let inst = sim.run("m5.large").await; // primary 198.18.0.4
    let out = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .private_ip_addresses(
            PrivateIpAddressSpecification::builder()
                .private_ip_address("198.18.0.10")
                .primary(true)
                .build(),
        )
        .private_ip_addresses(
            PrivateIpAddressSpecification::builder()
                .private_ip_address("198.18.0.11")
                .primary(false)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let ni = out.network_interface().unwrap();
    assert_eq!(ni.private_ip_address(), Some("198.18.0.10"));
    let ips: Vec<&str> = ni
        .private_ip_addresses()
        .iter()
        .map(|a| a.private_ip_address().unwrap())
        .collect();
    assert_eq!(ips, ["198.18.0.10", "198.18.0.11"]);
    let eni = ni.network_interface_id().unwrap().to_owned();
    let taken = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .private_ip_address("198.18.0.10")
        .send()
        .await;
    assert_eq!(code(taken), "InvalidIPAddress.InUse");

    let with_prefix = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .ipv4_prefixes(
            Ipv4PrefixSpecificationRequest::builder()
                .ipv4_prefix("198.18.0.64/28")
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        with_prefix.network_interface().unwrap().ipv4_prefixes()[0].ipv4_prefix(),
        Some("198.18.0.64/28")
    );
    sim.attach(&eni, &inst, 1).await.unwrap();
    let p = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .ipv4_prefixes("198.18.0.96/28")
        .send()
        .await
        .unwrap();
    assert_eq!(
        p.assigned_ipv4_prefixes()[0].ipv4_prefix(),
        Some("198.18.0.96/28")
    );
    for bad in [
        "198.18.0.64/28",
        "198.18.0.100/28",
        "198.18.0.0/28",
        "198.18.1.0/28",
        "198.18.0.128/27",
    ] {
        let r = sim
            .ec2
            .assign_private_ip_addresses()
            .network_interface_id(&eni)
            .ipv4_prefixes(bad)
            .send()
            .await;
        assert_eq!(code(r), "InvalidParameterValue", "{bad}");
    }
    // an address inside someone's prefix belongs to that prefix
    let r = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&eni)
        .private_ip_addresses("198.18.0.70")
        .send()
        .await;
    assert_eq!(code(r), "InvalidIPAddress.InUse");

    let view = sim.world.fabric_view(sim.world.now());
    let e = view
        .instance(&inst)
        .unwrap()
        .enis
        .iter()
        .find(|e| e.eni_id == eni)
        .unwrap()
        .clone();
    assert!(e.source_dest_check);
    assert!(e.owns_ipv4("198.18.0.100".parse().unwrap()));
    sim.ec2
        .modify_network_interface_attribute()
        .network_interface_id(&eni)
        .source_dest_check(
            aws_sdk_ec2::types::AttributeBooleanValue::builder()
                .value(false)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let view = sim.world.fabric_view(sim.world.now());
    assert!(
        !view
            .instance(&inst)
            .unwrap()
            .enis
            .iter()
            .find(|e| e.eni_id == eni)
            .unwrap()
            .source_dest_check
    );
    let two = sim
        .ec2
        .modify_network_interface_attribute()
        .network_interface_id(&eni)
        .source_dest_check(
            aws_sdk_ec2::types::AttributeBooleanValue::builder()
                .value(true)
                .build(),
        )
        .groups(&sim.groups()[0])
        .send()
        .await;
    assert_eq!(code(two), "InvalidParameterCombination");
}

#[tokio::test]
async fn describe_lag_simulates_eventual_consistency() {
    let clock = Arc::new(ManualClock::new());
    let world = World::with_clock(WorldConfig::default(), clock.clone());
    let server = serve(vpcsim::ec2::router(world.clone())).await;
    let ec2 = ec2_client(server.addr(), RetryConfig::disabled(), None);
    world.set_knobs(Knobs {
        describe_lag_ms: 1_000,
        ..Knobs::default()
    });
    let inst = world.run_instances("m5.large", 1).unwrap().remove(0);
    let subnet = world.read(|s| s.default_subnet().unwrap().id.clone());
    let out = ec2
        .create_network_interface()
        .subnet_id(&subnet)
        .send()
        .await
        .unwrap();
    let eni = out
        .network_interface()
        .unwrap()
        .network_interface_id()
        .unwrap()
        .to_owned();
    let by_id = ec2
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await;
    assert_eq!(code(by_id), "InvalidNetworkInterfaceID.NotFound");
    let all = ec2.describe_network_interfaces().send().await.unwrap();
    assert_eq!(
        all.network_interfaces().len(),
        1,
        "only the instance's primary ENI is visible yet"
    );
    // other actions see it at once
    ec2.attach_network_interface()
        .network_interface_id(&eni)
        .instance_id(&inst)
        .device_index(1)
        .send()
        .await
        .unwrap();
    clock.advance(Duration::from_millis(1_000));
    let by_id = ec2
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await
        .unwrap();
    assert_eq!(
        by_id.network_interfaces()[0]
            .attachment()
            .and_then(|a| a.device_index()),
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_get_the_same_address() {
    let sim = sim().await;
    let mut enis = Vec::new();
    for _ in 0..3 {
        let inst = sim.run("m5.4xlarge").await;
        enis.push(sim.primary_eni(&inst));
    }
    let mut tasks = Vec::new();
    for i in 0..42 {
        let ec2 = sim.ec2.clone();
        let eni = enis[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            let out = ec2
                .assign_private_ip_addresses()
                .network_interface_id(eni)
                .secondary_private_ip_address_count(2)
                .send()
                .await
                .unwrap();
            out.assigned_private_ip_addresses()
                .iter()
                .map(|a| a.private_ip_address().unwrap().to_owned())
                .collect::<Vec<_>>()
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert_eq!(all.len(), 84);
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 84, "an address was handed out twice");
    // m5.4xlarge: 30 slots per ENI = primary + 28 assigned above + 1 more
    let over = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&enis[0])
        .secondary_private_ip_address_count(1)
        .send()
        .await;
    assert_eq!(code(over), "<success>");
    let over = sim
        .ec2
        .assign_private_ip_addresses()
        .network_interface_id(&enis[0])
        .secondary_private_ip_address_count(1)
        .send()
        .await;
    assert_eq!(code(over), "PrivateIpAddressLimitExceeded");
}

#[tokio::test]
async fn attach_to_a_terminated_instance_is_refused() {
    let sim = sim().await;
    let inst = sim.run("m5.large").await;
    let eni = sim.create_eni(0).await;
    sim.ec2
        .terminate_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    assert_eq!(
        sim.attach(&eni, &inst, 1).await.unwrap_err(),
        "IncorrectInstanceState"
    );
    let d = sim
        .ec2
        .describe_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    let i = &d.reservations()[0].instances()[0];
    assert!(i.network_interfaces().is_empty());
    assert_eq!(i.state().and_then(|s| s.code()), Some(48));
}

/// Two zones, a secondary 100.64.0.0/16 block, and a security group of another VPC.
fn two_zone_world() -> WorldConfig {
    let mut cfg = WorldConfig::with_layout(&vpcsim::Layout {
        azs: 2,
        subnets_per_az: 1,
        secondary_cidr: Some("100.64.0.0/16".parse().unwrap()),
    });
    cfg.security_groups.push(vpcsim::SecurityGroupConfig {
        name: "elsewhere".into(),
        description: "a group of another VPC".into(),
        other_vpc: true,
    });
    cfg
}

#[tokio::test]
async fn zones_secondary_cidr_blocks_and_security_groups_on_enis() {
    let sim = sim_with(two_zone_world()).await;
    let subnet = |cidr: &str| {
        sim.world.read(|s| {
            s.subnets
                .values()
                .find(|sn| sn.cidr.to_string() == cidr)
                .unwrap()
                .id
                .clone()
        })
    };
    let (a_primary, b_primary) = (subnet("198.18.0.0/20"), subnet("198.18.16.0/20"));
    let (a_custom, b_custom) = (subnet("100.64.0.0/20"), subnet("100.64.16.0/20"));
    let group = |name: &str| {
        sim.world.read(|s| {
            s.security_groups
                .values()
                .find(|g| g.name == name)
                .unwrap()
                .id
                .clone()
        })
    };
    let (pods_sg, foreign_sg) = (group("pods"), group("elsewhere"));

    // DescribeSubnets: every subnet carries its zone; the zone filter works
    let out = sim
        .ec2
        .describe_subnets()
        .filters(filter("availability-zone", "us-west-2b"))
        .send()
        .await
        .unwrap();
    let mut got: Vec<(String, String, String)> = out
        .subnets()
        .iter()
        .map(|s| {
            (
                s.cidr_block().unwrap().to_owned(),
                s.availability_zone().unwrap().to_owned(),
                s.availability_zone_id().unwrap().to_owned(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (
                "100.64.16.0/20".into(),
                "us-west-2b".into(),
                "usw2-az2".into()
            ),
            (
                "198.18.16.0/20".into(),
                "us-west-2b".into(),
                "usw2-az2".into()
            ),
        ]
    );

    // an instance lives in its subnet's zone
    let out = sim
        .ec2
        .run_instances()
        .instance_type(InstanceType::M5Large)
        .subnet_id(&b_primary)
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .unwrap();
    let inst = &out.instances()[0];
    assert_eq!(
        inst.placement().and_then(|p| p.availability_zone()),
        Some("us-west-2b")
    );
    let inst = inst.instance_id().unwrap().to_owned();

    // an ENI in the secondary block with the ENIConfig's groups
    let eni = sim
        .ec2
        .create_network_interface()
        .subnet_id(&b_custom)
        .groups(&pods_sg)
        .secondary_private_ip_address_count(2)
        .send()
        .await
        .unwrap();
    let eni = eni.network_interface().unwrap();
    assert!(eni.private_ip_address().unwrap().starts_with("100.64.16."));
    assert_eq!(eni.availability_zone(), Some("us-west-2b"));
    let ids: Vec<&str> = eni.groups().iter().filter_map(|g| g.group_id()).collect();
    assert_eq!(ids, [pods_sg.as_str()]);
    let eni_id = eni.network_interface_id().unwrap().to_owned();
    sim.attach(&eni_id, &inst, 1).await.unwrap();
    let described = sim
        .ec2
        .describe_network_interfaces()
        .filters(filter("availability-zone", "us-west-2b"))
        .filters(filter("group-id", &pods_sg))
        .send()
        .await
        .unwrap();
    let found: Vec<&str> = described
        .network_interfaces()
        .iter()
        .filter_map(|e| e.network_interface_id())
        .collect();
    assert_eq!(found, [eni_id.as_str()]);
    let none = sim
        .ec2
        .describe_network_interfaces()
        .filters(filter("availability-zone", "us-west-2a"))
        .send()
        .await
        .unwrap();
    assert!(none.network_interfaces().is_empty());

    // refusals, each leaving the state as it was
    let before = serde_json::to_string(&sim.world.state()).unwrap();
    let unknown_subnet = sim
        .ec2
        .create_network_interface()
        .subnet_id("subnet-0ffffffffffffffff")
        .send()
        .await;
    assert_eq!(code(unknown_subnet), "InvalidSubnetID.NotFound");
    let unknown_group = sim
        .ec2
        .create_network_interface()
        .subnet_id(&b_custom)
        .groups("sg-0ffffffffffffffff")
        .send()
        .await;
    assert_eq!(code(unknown_group), "InvalidGroup.NotFound");
    let other_vpc = sim
        .ec2
        .create_network_interface()
        .subnet_id(&b_custom)
        .groups(&foreign_sg)
        .send()
        .await;
    assert_eq!(code(other_vpc), "InvalidParameter");
    assert_eq!(serde_json::to_string(&sim.world.state()).unwrap(), before);
    let other_zone = sim
        .ec2
        .create_network_interface()
        .subnet_id(&a_custom)
        .send()
        .await
        .unwrap();
    let other_zone = other_zone
        .network_interface()
        .unwrap()
        .network_interface_id()
        .unwrap()
        .to_owned();
    let before = serde_json::to_string(&sim.world.state()).unwrap();
    assert_eq!(
        sim.attach(&other_zone, &inst, 2).await,
        Err("InvalidParameterCombination".to_owned())
    );
    assert_eq!(serde_json::to_string(&sim.world.state()).unwrap(), before);
    let _ = a_primary;
}

#[tokio::test]
async fn imds_reports_the_instance_zone_all_cidr_blocks_and_eni_groups() {
    let world = World::new(two_zone_world());
    let (b_primary, b_custom, pods_sg) = world.read(|s| {
        let sn = |c: &str| {
            s.subnets
                .values()
                .find(|sn| sn.cidr.to_string() == c)
                .unwrap()
                .id
                .clone()
        };
        let g = s
            .security_groups
            .values()
            .find(|g| g.name == "pods")
            .unwrap()
            .id
            .clone();
        (sn("198.18.16.0/20"), sn("100.64.16.0/20"), g)
    });
    let inst = world
        .mutate(|s, now| {
            s.run_instances(
                vpcsim::state::RunInstances {
                    instance_type: "m5.large".into(),
                    subnet_id: Some(b_primary.clone()),
                    count: 1,
                    ..Default::default()
                },
                now,
            )
        })
        .unwrap()
        .remove(0);
    let eni = world
        .mutate(|s, _| {
            s.create_eni(vpcsim::state::CreateEni {
                subnet_id: b_custom.clone(),
                groups: vec![pods_sg.clone()],
                ..Default::default()
            })
        })
        .unwrap();
    world
        .mutate(|s, now| s.attach_eni(&eni, &inst, 1, now))
        .unwrap();
    let mac = world.read(|s| s.enis[&eni].mac.clone());
    let server = serve(vpcsim::imds::router(world.clone(), inst.clone())).await;
    let imds = imds_client(server.addr());
    let get = |p: String| {
        let imds = imds.clone();
        async move { imds.get(p).await.map(|s| s.as_ref().to_owned()).unwrap() }
    };
    assert_eq!(
        get("/latest/meta-data/placement/availability-zone".into()).await,
        "us-west-2b"
    );
    let key = |k: &str| format!("/latest/meta-data/network/interfaces/macs/{mac}/{k}");
    assert_eq!(
        get(key("vpc-ipv4-cidr-blocks")).await,
        "198.18.0.0/16\n100.64.0.0/16"
    );
    assert_eq!(get(key("vpc-ipv4-cidr-block")).await, "198.18.0.0/16");
    assert_eq!(get(key("subnet-ipv4-cidr-block")).await, "100.64.16.0/20");
    assert_eq!(get(key("security-group-ids")).await, pods_sg);
}

// ---- IPv6 ----

#[tokio::test]
async fn ipv6_describe_vpcs_and_subnets_show_the_56_and_the_64s() {
    let sim = sim().await;
    let vpcs = sim.ec2.describe_vpcs().send().await.unwrap();
    let vpc = &vpcs.vpcs()[0];
    assert_eq!(vpc.cidr_block(), Some("198.18.0.0/16"));
    let v6 = vpc.ipv6_cidr_block_association_set()[0].clone();
    assert_eq!(v6.ipv6_cidr_block(), Some("2001:db8:1200::/56"));
    assert_eq!(
        v6.ipv6_cidr_block_state()
            .unwrap()
            .state()
            .unwrap()
            .as_str(),
        "associated"
    );
    let vpc_id = vpc.vpc_id().unwrap().to_owned();
    let again = sim
        .ec2
        .describe_vpcs()
        .vpc_ids(&vpc_id)
        .send()
        .await
        .unwrap();
    assert_eq!(again.vpcs().len(), 1);
    let missing = sim.ec2.describe_vpcs().vpc_ids("vpc-0nope").send().await;
    assert_eq!(code(missing), "InvalidVpcID.NotFound");
    let subnets = sim.ec2.describe_subnets().send().await.unwrap();
    let blocks: Vec<&str> = subnets
        .subnets()
        .iter()
        .map(|s| {
            s.ipv6_cidr_block_association_set()[0]
                .ipv6_cidr_block()
                .unwrap()
        })
        .collect();
    assert_eq!(blocks, ["2001:db8:1200::/64", "2001:db8:1200:1::/64"]);
}

#[tokio::test]
async fn ipv6_on_launch_and_on_create_and_the_per_eni_limit() {
    let sim = sim().await;
    // RunInstances Ipv6AddressCount: the primary ENI carries it, DescribeInstances shows it
    let out = sim
        .ec2
        .run_instances()
        .instance_type(InstanceType::T3Medium)
        .min_count(1)
        .max_count(1)
        .ipv6_address_count(1)
        .send()
        .await
        .unwrap();
    let inst = out.instances()[0].instance_id().unwrap().to_owned();
    let eni = sim.primary_eni(&inst);
    let d = sim
        .ec2
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await
        .unwrap();
    let v6 = d.network_interfaces()[0].ipv6_addresses()[0]
        .ipv6_address()
        .unwrap()
        .to_owned();
    assert!(v6.starts_with("2001:db8:1200::"), "{v6}");
    let di = sim
        .ec2
        .describe_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    let ni = &di.reservations()[0].instances()[0].network_interfaces()[0];
    assert_eq!(ni.ipv6_addresses()[0].ipv6_address(), Some(v6.as_str()));

    // CreateNetworkInterface with Ipv6AddressCount and Ipv6PrefixCount
    let created = sim
        .ec2
        .create_network_interface()
        .subnet_id(sim.subnet())
        .ipv6_address_count(2)
        .ipv6_prefix_count(1)
        .send()
        .await
        .unwrap();
    let ni = created.network_interface().unwrap();
    assert_eq!(ni.ipv6_addresses().len(), 2);
    let prefix: ipnet::Ipv6Net = ni.ipv6_prefixes()[0]
        .ipv6_prefix()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(prefix.prefix_len(), 80);
    assert!(
        !ni.ipv6_addresses().iter().any(|a| prefix.contains(
            &a.ipv6_address()
                .unwrap()
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
        )),
        "addresses never fall inside a delegated /80"
    );

    // t3.medium: 6 IPv6 slots per ENI (addresses and /80 prefixes together); 1 used
    let five = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_address_count(4)
        .send()
        .await
        .unwrap();
    assert_eq!(five.assigned_ipv6_addresses().len(), 4);
    let p = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_prefix_count(1)
        .send()
        .await
        .unwrap();
    assert_eq!(p.assigned_ipv6_prefixes().len(), 1);
    let over = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&eni)
        .ipv6_prefix_count(1)
        .send()
        .await;
    assert_eq!(code(over), "PrivateIpAddressLimitExceeded");
    // explicit addresses: outside the subnet, and one already taken
    let other = sim.create_eni(0).await;
    let outside = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&other)
        .ipv6_addresses("2001:db8:9999::5")
        .send()
        .await;
    assert_eq!(code(outside), "InvalidParameterValue");
    let taken = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&other)
        .ipv6_addresses(&v6)
        .send()
        .await;
    assert_eq!(code(taken), "InvalidIPAddress.InUse");
    // addresses and prefixes in one call
    let both = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&other)
        .ipv6_address_count(1)
        .ipv6_prefix_count(1)
        .send()
        .await;
    assert_eq!(code(both), "InvalidParameterCombination");
    // nothing asked
    let none = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(&other)
        .send()
        .await;
    assert_eq!(code(none), "MissingParameter");
    // unassigning an address the ENI does not hold
    let foreign = sim
        .ec2
        .unassign_ipv6_addresses()
        .network_interface_id(&other)
        .ipv6_addresses(&v6)
        .send()
        .await;
    assert_eq!(code(foreign), "InvalidParameterValue");
}

#[tokio::test]
async fn ipv6_refused_in_a_subnet_without_an_ipv6_cidr_and_prefixes_on_xen() {
    let mut cfg = WorldConfig::default();
    cfg.subnets[1].ipv6_cidr = None;
    let sim = sim_with(cfg).await;
    let v4_only = sim.world.read(|s| {
        s.subnets
            .values()
            .find(|sn| sn.ipv6_cidr.is_none())
            .unwrap()
            .id
            .clone()
    });
    let create = sim
        .ec2
        .create_network_interface()
        .subnet_id(&v4_only)
        .ipv6_address_count(1)
        .send()
        .await;
    assert_eq!(code(create), "InvalidParameterValue");
    let launch = sim
        .ec2
        .run_instances()
        .instance_type(InstanceType::M5Large)
        .subnet_id(&v4_only)
        .min_count(1)
        .max_count(1)
        .ipv6_address_count(1)
        .send()
        .await;
    assert_eq!(code(launch), "InvalidParameterValue");
    assert!(
        sim.world.read(|s| s.instances.is_empty()),
        "a refused launch leaves nothing behind"
    );
    // /80 prefixes need a Nitro instance, like /28s
    let xen = sim.run("m4.large").await;
    let refused = sim
        .ec2
        .assign_ipv6_addresses()
        .network_interface_id(sim.primary_eni(&xen))
        .ipv6_prefix_count(1)
        .send()
        .await;
    assert_eq!(code(refused), "InvalidParameterValue");
}

#[tokio::test]
async fn imds_ipv6_keys_lag_like_ipv4() {
    let clock = Arc::new(ManualClock::new());
    let world = World::with_clock(WorldConfig::default(), clock.clone());
    let inst = world.run_ipv6_instances("m5.large", 1).unwrap().remove(0);
    let eni = world.read(|s| s.instances[&inst].primary_eni.clone());
    let (v6, mac) = world.read(|s| {
        let e = &s.enis[&eni];
        (e.ipv6_addresses[0], e.mac.clone())
    });
    let imds_server = serve(vpcsim::imds::router(world.clone(), inst.clone())).await;
    let imds = imds_client(imds_server.addr());
    let get = |p: String| {
        let imds = imds.clone();
        async move { imds.get(&p).await.map(|s| s.as_ref().to_owned()) }
    };
    let key = |k: &str| format!("/latest/meta-data/network/interfaces/macs/{mac}/{k}");
    assert_eq!(
        get("/latest/meta-data/ipv6".into()).await.unwrap(),
        v6.to_string()
    );
    assert_eq!(get(key("ipv6s")).await.unwrap(), v6.to_string());
    assert_eq!(
        get(key("subnet-ipv6-cidr-blocks")).await.unwrap(),
        "2001:db8:1200::/64"
    );
    assert_eq!(
        get(key("vpc-ipv6-cidr-blocks")).await.unwrap(),
        "2001:db8:1200::/56"
    );
    assert!(get(key("ipv6-prefix")).await.is_err(), "404 without a /80");

    // with a 5 s IMDS lag, a new /80 shows only once the lag has passed
    world.set_knobs(Knobs {
        imds_lag_ms: 5_000,
        ..Knobs::default()
    });
    clock.advance(Duration::from_secs(10));
    let (_, prefixes) = world
        .mutate(|s, _| {
            s.assign_ipv6(
                &eni,
                vpcsim::state::AssignIpv6 {
                    prefix_count: 1,
                    ..Default::default()
                },
            )
        })
        .unwrap();
    assert!(get(key("ipv6-prefix")).await.is_err(), "stale for 5 s");
    clock.advance(Duration::from_secs(6));
    assert_eq!(
        get(key("ipv6-prefix")).await.unwrap(),
        prefixes[0].to_string()
    );
}

/// Network cards through the SDK (issue 26 item 2), as upstream's awsutils uses them:
/// `DescribeInstanceTypes` lists one `NetworkCards` entry per card with its
/// `MaximumNetworkInterfaces` (upstream `vpc_ip_resource_limit.go`: `c6in.32xlarge` 2 × 8);
/// `AttachNetworkInterface` with `NetworkCardIndex` (upstream `attachENI`) attaches at a
/// device index counted per card and answers the card; `DescribeNetworkInterfaces` and
/// `DescribeInstances` report it in the attachment; a card the type lacks is refused.
#[tokio::test]
async fn network_cards_through_the_sdk() {
    let sim = sim().await;
    let types = sim
        .ec2
        .describe_instance_types()
        .instance_types(InstanceType::from("c6in.32xlarge"))
        .send()
        .await
        .unwrap();
    let net = types.instance_types()[0].network_info().unwrap();
    assert_eq!(net.maximum_network_cards(), Some(2));
    let cards: Vec<(Option<i32>, Option<i32>)> = net
        .network_cards()
        .iter()
        .map(|c| (c.network_card_index(), c.maximum_network_interfaces()))
        .collect();
    assert_eq!(cards, [(Some(0), Some(8)), (Some(1), Some(8))]);

    let inst = sim.run("c6in.32xlarge").await;
    let eni = sim.create_eni(1).await;
    let out = sim
        .ec2
        .attach_network_interface()
        .network_interface_id(&eni)
        .instance_id(&inst)
        .device_index(0)
        .network_card_index(1)
        .send()
        .await
        .unwrap();
    assert_eq!(out.network_card_index(), Some(1));
    let described = sim
        .ec2
        .describe_network_interfaces()
        .network_interface_ids(&eni)
        .send()
        .await
        .unwrap();
    let a = described.network_interfaces()[0].attachment().unwrap();
    assert_eq!(
        (a.network_card_index(), a.device_index()),
        (Some(1), Some(0))
    );
    let instances = sim
        .ec2
        .describe_instances()
        .instance_ids(&inst)
        .send()
        .await
        .unwrap();
    let on_card1: Vec<_> = instances.reservations()[0].instances()[0]
        .network_interfaces()
        .iter()
        .filter_map(|n| n.attachment())
        .filter(|a| a.network_card_index() == Some(1))
        .collect();
    assert_eq!(on_card1.len(), 1);
    // card 2 does not exist on the type
    let other = sim.create_eni(0).await;
    let r = sim
        .ec2
        .attach_network_interface()
        .network_interface_id(&other)
        .instance_id(&inst)
        .device_index(1)
        .network_card_index(2)
        .send()
        .await;
    assert_eq!(code(r), "InvalidParameterValue");
}
