//! What subnet discovery and connection tracking need from the simulated EC2, driven through
//! aws-sdk-ec2 (and the control API) against servers on 127.0.0.1:0: `CreateSubnet` with tags
//! and its refusals, `DescribeSubnets` filtered as upstream's `GetVpcSubnets` asks
//! (`vpc-id`, `availability-zone`) and by `tag:kubernetes.io/role/cni`, an exact
//! `AvailableIpAddressCount`, `POST /subnets`, and `ConnectionTrackingSpecification` on
//! CreateNetworkInterface / ModifyNetworkInterfaceAttribute shown as
//! `connectionTrackingConfiguration` by DescribeNetworkInterfaces.
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    ConnectionTrackingSpecificationRequest, Filter, ResourceType, Tag, TagSpecification,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vpcsim::{World, WorldConfig};

const ROLE: &str = "kubernetes.io/role/cni";

struct Sim {
    world: Arc<World>,
    ec2: Client,
    _server: vpcsim::LocalServer,
}

async fn sim() -> Sim {
    let world = World::new(WorldConfig::default());
    let server = vpcsim::LocalServer::start(vpcsim::ec2::router(world.clone()))
        .await
        .unwrap();
    let conf = common::ec2_config(server.addr(), "AKIDVPCSIM")
        .retry_config(RetryConfig::disabled())
        .build();
    Sim {
        world,
        ec2: Client::from_conf(conf),
        _server: server,
    }
}

fn filter(name: &str, value: &str) -> Filter {
    Filter::builder().name(name).values(value).build()
}

fn role_tag(v: &str) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(ResourceType::Subnet)
        .tags(Tag::builder().key(ROLE).value(v).build())
        .build()
}

fn code<T, E: ProvideErrorMetadata>(r: Result<T, aws_sdk_ec2::error::SdkError<E>>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e
            .as_service_error()
            .and_then(ProvideErrorMetadata::code)
            .unwrap_or("no code")
            .to_owned(),
    }
}

impl Sim {
    fn vpc(&self) -> String {
        self.world.read(|s| s.vpc.id.clone())
    }

    fn subnet_count(&self) -> usize {
        self.world.read(|s| s.subnets.len())
    }

    async fn create_subnet(&self, cidr: &str, zone: &str, role: Option<&str>) -> String {
        let mut req = self
            .ec2
            .create_subnet()
            .vpc_id(self.vpc())
            .cidr_block(cidr)
            .availability_zone(zone);
        if let Some(v) = role {
            req = req.tag_specifications(role_tag(v));
        }
        let out = req.send().await.unwrap();
        let sn = out.subnet().unwrap();
        assert_eq!(sn.cidr_block(), Some(cidr));
        assert_eq!(sn.availability_zone(), Some(zone));
        sn.subnet_id().unwrap().to_owned()
    }
}

/// upstream awsutils.go `GetVpcSubnets` asks `DescribeSubnets` with `vpc-id` and
/// `availability-zone` filters and sorts by `AvailableIpAddressCount`; the tag filter narrows
/// to the role. Counts are exact (a /24 has 251 usable addresses) and follow assignments.
#[tokio::test]
async fn create_subnet_with_tags_and_describe_them_as_discovery_does() {
    let sim = sim().await;
    let on = sim
        .create_subnet("198.18.100.0/24", "us-west-2a", Some("1"))
        .await;
    let off = sim
        .create_subnet("198.18.101.0/24", "us-west-2a", Some("0"))
        .await;
    let other_zone = sim
        .create_subnet("198.18.102.0/24", "us-west-2b", Some("1"))
        .await;

    let out = sim
        .ec2
        .describe_subnets()
        .filters(filter("vpc-id", &sim.vpc()))
        .filters(filter("availability-zone", "us-west-2a"))
        .send()
        .await
        .unwrap();
    let ids: Vec<&str> = out.subnets().iter().filter_map(|s| s.subnet_id()).collect();
    assert!(ids.contains(&on.as_str()) && ids.contains(&off.as_str()));
    assert!(!ids.contains(&other_zone.as_str()), "zone filter");
    let described = |id: &str| {
        out.subnets()
            .iter()
            .find(|s| s.subnet_id() == Some(id))
            .unwrap()
            .clone()
    };
    assert_eq!(described(&on).available_ip_address_count(), Some(251));
    let tag = |s: &aws_sdk_ec2::types::Subnet| {
        s.tags()
            .iter()
            .find(|t| t.key() == Some(ROLE))
            .and_then(|t| t.value().map(str::to_owned))
    };
    assert_eq!(tag(&described(&off)).as_deref(), Some("0"));

    let tagged = sim
        .ec2
        .describe_subnets()
        .filters(filter(&format!("tag:{ROLE}"), "1"))
        .send()
        .await
        .unwrap();
    let mut ids: Vec<String> = tagged
        .subnets()
        .iter()
        .filter_map(|s| s.subnet_id().map(str::to_owned))
        .collect();
    ids.sort();
    let mut want = vec![on.clone(), other_zone];
    want.sort();
    assert_eq!(ids, want, "tag filter");

    // Ten addresses taken by an ENI: the count follows.
    sim.ec2
        .create_network_interface()
        .subnet_id(&on)
        .secondary_private_ip_address_count(9)
        .send()
        .await
        .unwrap();
    let again = sim
        .ec2
        .describe_subnets()
        .subnet_ids(&on)
        .send()
        .await
        .unwrap();
    assert_eq!(again.subnets()[0].available_ip_address_count(), Some(241));

    // CreateTags re-tags a subnet (how an operator excludes one).
    sim.ec2
        .create_tags()
        .resources(&on)
        .tags(Tag::builder().key(ROLE).value("0").build())
        .send()
        .await
        .unwrap();
    let excluded = sim
        .ec2
        .describe_subnets()
        .filters(filter(&format!("tag:{ROLE}"), "0"))
        .send()
        .await
        .unwrap();
    assert_eq!(excluded.subnets().len(), 2);
}

/// EC2's `CreateSubnet` refusals (`InvalidSubnet.Conflict`, `InvalidSubnet.Range`,
/// `InvalidVpcID.NotFound`) leave the VPC unchanged.
#[tokio::test]
async fn create_subnet_refusals_change_nothing() {
    let sim = sim().await;
    let before = sim.subnet_count();
    let default_cidr = sim
        .world
        .read(|s| s.default_subnet().unwrap().cidr.to_string());
    let r = sim
        .ec2
        .create_subnet()
        .vpc_id(sim.vpc())
        .cidr_block(&default_cidr)
        .send()
        .await;
    assert_eq!(code(r), "InvalidSubnet.Conflict");
    for cidr in ["10.99.0.0/24", "198.18.200.0/29"] {
        let r = sim
            .ec2
            .create_subnet()
            .vpc_id(sim.vpc())
            .cidr_block(cidr)
            .send()
            .await;
        assert_eq!(code(r), "InvalidSubnet.Range", "{cidr}");
    }
    let r = sim
        .ec2
        .create_subnet()
        .vpc_id("vpc-00000000")
        .cidr_block("198.18.200.0/24")
        .send()
        .await;
    assert_eq!(code(r), "InvalidVpcID.NotFound");
    assert_eq!(sim.subnet_count(), before);
}

/// upstream awsutils.go `createENIInput` sends the primary ENI's connection tracking as
/// `ConnectionTrackingSpecification`; `DescribeAllENIs` reads it back from
/// `ConnectionTrackingConfiguration`. Modify changes only the fields it names; EC2's ranges
/// are enforced.
#[tokio::test]
async fn connection_tracking_on_create_modify_and_describe() {
    let sim = sim().await;
    let subnet = sim.world.read(|s| s.default_subnet().unwrap().id.clone());
    let spec = ConnectionTrackingSpecificationRequest::builder()
        .tcp_established_timeout(300)
        .udp_timeout(45)
        .build();
    let created = sim
        .ec2
        .create_network_interface()
        .subnet_id(&subnet)
        .connection_tracking_specification(spec)
        .send()
        .await
        .unwrap();
    let ni = created.network_interface().unwrap();
    let eni = ni.network_interface_id().unwrap().to_owned();
    let c = ni.connection_tracking_configuration().unwrap();
    assert_eq!(
        (
            c.tcp_established_timeout(),
            c.udp_stream_timeout(),
            c.udp_timeout()
        ),
        (Some(300), None, Some(45))
    );
    sim.ec2
        .modify_network_interface_attribute()
        .network_interface_id(&eni)
        .connection_tracking_specification(
            ConnectionTrackingSpecificationRequest::builder()
                .udp_stream_timeout(120)
                .build(),
        )
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
    let c = d.network_interfaces()[0]
        .connection_tracking_configuration()
        .unwrap();
    assert_eq!(
        (
            c.tcp_established_timeout(),
            c.udp_stream_timeout(),
            c.udp_timeout()
        ),
        (Some(300), Some(120), Some(45))
    );
    // Without a specification nothing is described.
    let plain = sim
        .ec2
        .create_network_interface()
        .subnet_id(&subnet)
        .send()
        .await
        .unwrap();
    assert!(
        plain
            .network_interface()
            .unwrap()
            .connection_tracking_configuration()
            .is_none()
    );
    let enis_before = sim.world.read(|s| s.enis.len());
    let r = sim
        .ec2
        .create_network_interface()
        .subnet_id(&subnet)
        .connection_tracking_specification(
            ConnectionTrackingSpecificationRequest::builder()
                .udp_timeout(5)
                .build(),
        )
        .send()
        .await;
    assert_eq!(code(r), "InvalidParameterValue");
    assert_eq!(sim.world.read(|s| s.enis.len()), enis_before);
}

async fn post_json(addr: SocketAddr, path: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
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

/// `POST /subnets` (tests and the CLI): a tagged subnet in a given zone; refusals answer 400
/// with EC2's code.
#[tokio::test]
async fn control_api_creates_tagged_subnets() {
    let sim = sim().await;
    let control = vpcsim::LocalServer::start(vpcsim::control::router(sim.world.clone()))
        .await
        .unwrap();
    let (st, body) = post_json(
        control.addr(),
        "/subnets",
        r#"{"cidr": "198.18.120.0/26", "availability_zone": "us-west-2a", "tags": {"kubernetes.io/role/cni": "1"}}"#,
    )
    .await;
    assert_eq!(st, 201, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["subnet_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let sn = sim.world.read(|s| s.subnets[&id].clone());
    assert_eq!(sn.tags.get(ROLE).map(String::as_str), Some("1"));
    assert_eq!(sim.world.read(|s| s.available_ip_count(&id)), 59);
    let (st, body) = post_json(control.addr(), "/subnets", r#"{"cidr": "198.18.120.0/26"}"#).await;
    assert_eq!(st, 400);
    assert!(body.contains("InvalidSubnet.Conflict"), "{body}");
}
