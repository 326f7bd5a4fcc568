//! Cross-check against moto's EC2 server: the same basic ENI flow runs through aws-sdk-ec2
//! against `moto_server` and against the simulator, the raw XML answers are reduced to their
//! element paths ("shape"), and for every call both implement the simulator's shape must
//! contain moto's (moto is shaped after AWS's XML) and error codes must agree. moto is a
//! protocol reference only; its behaviour gaps are listed in docs/vpcsim.md.
//!
//! `moto_server` must be on PATH (integration/test.sh installs it). If it is missing, the test
//! fails with a message saying so: a silently skipped cross-check would prove nothing.
// Integration tests are their own crate; the workspace lint targets unit tests in src/.
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::interceptors::AfterDeserializationInterceptorContextRef;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_ec2::error::{BoxError, ProvideErrorMetadata};
use aws_sdk_ec2::types::{
    AttributeValue, Filter, InstanceType, IpPermission, IpRange, NetworkInterfaceAttachmentChanges,
    ResourceType, Tag, TagSpecification, UserIdGroupPair,
};
use quick_xml::Reader;
use quick_xml::events::Event;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use vpcsim::{World, WorldConfig};

/// moto_server child process, killed (by PID, via the handle) when dropped, also on panic.
struct Moto {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_moto() -> Moto {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "moto_server could not be started ({e}); the EC2 cross-check needs it on PATH: \
                 run integration/test.sh or `python3 -m pip install 'moto[server,ec2]>=5.1,<6'`"
            )
        });
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut moto = Moto { child, addr };
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(addr).is_err() {
        if let Ok(Some(status)) = moto.child.try_wait() {
            panic!("moto_server exited before listening: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "moto_server did not listen on {addr} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    moto
}

/// Records the raw body of every deserialized response.
#[derive(Debug, Default, Clone)]
struct Recorder(Arc<Mutex<Vec<Vec<u8>>>>);

impl Intercept for Recorder {
    fn name(&self) -> &'static str {
        "ShapeRecorder"
    }
    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _rc: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let body = context
            .response()
            .body()
            .bytes()
            .unwrap_or_default()
            .to_vec();
        self.0.lock().unwrap().push(body);
        Ok(())
    }
}

impl Recorder {
    fn last_shape(&self) -> BTreeSet<String> {
        shape(
            self.0
                .lock()
                .unwrap()
                .last()
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
    }
}

/// Element paths of an XML document: `Root/child/item/leaf`.
fn shape(xml: &[u8]) -> BTreeSet<String> {
    let mut reader = Reader::from_reader(xml);
    let mut stack: Vec<String> = Vec::new();
    let mut out = BTreeSet::new();
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) => {
                stack.push(e.local_name().into_inner().to_owned());
                out.insert(stack.join("/"));
            }
            Ok(Event::Empty(e)) => {
                stack.push(e.local_name().into_inner().to_owned());
                out.insert(stack.join("/"));
                stack.pop();
            }
            Ok(Event::End(_)) => {
                stack.pop();
            }
            Ok(Event::Eof) | Err(_) => break,
            Ok(_) => {}
        }
        buf.clear();
    }
    out
}

fn client(addr: SocketAddr, recorder: Recorder) -> Client {
    let conf = common::ec2_config(addr, "AKIDCROSSCHECK")
        .retry_config(RetryConfig::disabled())
        .interceptor(recorder)
        .build();
    Client::from_conf(conf)
}

/// What one step of the flow produced.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    /// Element paths of the successful answer.
    Shape(BTreeSet<String>),
    /// EC2 error code.
    Error(String),
}

type Steps = BTreeMap<&'static str, Outcome>;

/// The basic ENI flow; returns each step's outcome.
async fn flow(ec2: &Client, rec: &Recorder) -> Steps {
    let mut steps = Steps::new();
    macro_rules! step {
        ($name:literal, $call:expr) => {{
            let r = $call.await;
            let outcome = match &r {
                Ok(_) => Outcome::Shape(rec.last_shape()),
                Err(e) => Outcome::Error(e.code().unwrap_or("<no code>").to_owned()),
            };
            steps.insert($name, outcome);
            r.ok()
        }};
    }
    let subnets = step!("DescribeSubnets", ec2.describe_subnets().send()).expect("DescribeSubnets");
    let subnet = subnets.subnets()[0].subnet_id().unwrap().to_owned();
    let groups = step!(
        "DescribeSecurityGroups",
        ec2.describe_security_groups().send()
    )
    .expect("DescribeSecurityGroups");
    let sg = groups.security_groups()[0].group_id().unwrap().to_owned();
    step!(
        "DescribeInstanceTypes",
        ec2.describe_instance_types()
            .instance_types(InstanceType::M5Large)
            .send()
    );
    let run = step!(
        "RunInstances",
        ec2.run_instances()
            .image_id("ami-12c6146b")
            .instance_type(InstanceType::M5Large)
            .subnet_id(&subnet)
            .min_count(1)
            .max_count(1)
            .send()
    )
    .expect("RunInstances");
    let inst = run.instances()[0].instance_id().unwrap().to_owned();
    step!(
        "DescribeInstances",
        ec2.describe_instances().instance_ids(&inst).send()
    );
    let created = step!(
        "CreateNetworkInterface",
        ec2.create_network_interface()
            .subnet_id(&subnet)
            .description("aws-K8S-crosscheck")
            .groups(&sg)
            .secondary_private_ip_address_count(2)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::NetworkInterface)
                    .tags(
                        Tag::builder()
                            .key("node.k8s.amazonaws.com/instance_id")
                            .value(&inst)
                            .build()
                    )
                    .build()
            )
            .send()
    )
    .expect("CreateNetworkInterface");
    let eni = created
        .network_interface()
        .unwrap()
        .network_interface_id()
        .unwrap()
        .to_owned();
    let attached = step!(
        "AttachNetworkInterface",
        ec2.attach_network_interface()
            .network_interface_id(&eni)
            .instance_id(&inst)
            .device_index(1)
            .send()
    )
    .expect("AttachNetworkInterface");
    let att = attached.attachment_id().unwrap().to_owned();
    step!(
        "ModifyNetworkInterfaceAttribute",
        ec2.modify_network_interface_attribute()
            .network_interface_id(&eni)
            .attachment(
                NetworkInterfaceAttachmentChanges::builder()
                    .attachment_id(&att)
                    .delete_on_termination(true)
                    .build()
            )
            .send()
    );
    step!(
        "ModifyNetworkInterfaceAttribute(description)",
        ec2.modify_network_interface_attribute()
            .network_interface_id(&eni)
            .description(
                AttributeValue::builder()
                    .value("aws-K8S-crosscheck-2")
                    .build()
            )
            .send()
    );
    let assigned = step!(
        "AssignPrivateIpAddresses",
        ec2.assign_private_ip_addresses()
            .network_interface_id(&eni)
            .secondary_private_ip_address_count(2)
            .send()
    );
    step!(
        "DescribeNetworkInterfaces",
        ec2.describe_network_interfaces()
            .network_interface_ids(&eni)
            .send()
    );
    step!(
        "DescribeNetworkInterfaces(filter attachment.instance-id)",
        ec2.describe_network_interfaces()
            .filters(
                Filter::builder()
                    .name("attachment.instance-id")
                    .values(&inst)
                    .build()
            )
            .send()
    );
    if let Some(a) = assigned
        .as_ref()
        .and_then(|a| a.assigned_private_ip_addresses().first())
    {
        step!(
            "UnassignPrivateIpAddresses",
            ec2.unassign_private_ip_addresses()
                .network_interface_id(&eni)
                .private_ip_addresses(a.private_ip_address().unwrap())
                .send()
        );
    }
    step!(
        "CreateTags",
        ec2.create_tags()
            .resources(&eni)
            .tags(
                Tag::builder()
                    .key("cluster.k8s.amazonaws.com/name")
                    .value("c1")
                    .build()
            )
            .send()
    );
    step!(
        "DeleteTags",
        ec2.delete_tags()
            .resources(&eni)
            .tags(Tag::builder().key("cluster.k8s.amazonaws.com/name").build())
            .send()
    );
    step!(
        "DescribeNetworkInterfaces(unknown id)",
        ec2.describe_network_interfaces()
            .network_interface_ids("eni-0123456789abcdef0")
            .send()
    );
    step!(
        "CreateNetworkInterface(dry run)",
        ec2.create_network_interface()
            .subnet_id(&subnet)
            .dry_run(true)
            .send()
    );
    step!(
        "DetachNetworkInterface",
        ec2.detach_network_interface().attachment_id(&att).send()
    );
    step!(
        "DeleteNetworkInterface",
        ec2.delete_network_interface()
            .network_interface_id(&eni)
            .send()
    );
    security_group_flow(ec2, rec, &mut steps).await;
    step!(
        "TerminateInstances",
        ec2.terminate_instances().instance_ids(&inst).send()
    );
    steps
}

/// Security groups for pods' groups: create one, allow in by CIDR and by group, allow out,
/// describe it with its rules, refuse a duplicate rule, revoke.
async fn security_group_flow(ec2: &Client, rec: &Recorder, steps: &mut Steps) {
    macro_rules! step {
        ($name:literal, $call:expr) => {{
            let r = $call.await;
            let outcome = match &r {
                Ok(_) => Outcome::Shape(rec.last_shape()),
                Err(e) => Outcome::Error(e.code().unwrap_or("<no code>").to_owned()),
            };
            steps.insert($name, outcome);
            r.ok()
        }};
    }
    let vpcs = ec2.describe_vpcs().send().await.expect("DescribeVpcs");
    let vpc = vpcs.vpcs()[0].vpc_id().unwrap().to_owned();
    let sg = step!(
        "CreateSecurityGroup",
        ec2.create_security_group()
            .group_name("pod-sg-crosscheck")
            .description("pods allowed to reach the database")
            .vpc_id(&vpc)
            .send()
    );
    let sg = sg
        .unwrap_or_else(|| {
            panic!(
                "CreateSecurityGroup: {:?}",
                steps.get("CreateSecurityGroup")
            )
        })
        .group_id()
        .unwrap()
        .to_owned();
    let tcp = |port: i32| {
        IpPermission::builder()
            .ip_protocol("tcp")
            .from_port(port)
            .to_port(port)
    };
    let by_cidr = tcp(5432)
        .ip_ranges(IpRange::builder().cidr_ip("198.18.0.0/16").build())
        .build();
    step!(
        "AuthorizeSecurityGroupIngress",
        ec2.authorize_security_group_ingress()
            .group_id(&sg)
            .ip_permissions(by_cidr.clone())
            .send()
    );
    step!(
        "AuthorizeSecurityGroupIngress(group)",
        ec2.authorize_security_group_ingress()
            .group_id(&sg)
            .ip_permissions(
                tcp(8080)
                    .user_id_group_pairs(UserIdGroupPair::builder().group_id(&sg).build())
                    .build()
            )
            .send()
    );
    step!(
        "AuthorizeSecurityGroupEgress",
        ec2.authorize_security_group_egress()
            .group_id(&sg)
            .ip_permissions(
                tcp(443)
                    .ip_ranges(IpRange::builder().cidr_ip("203.0.113.0/24").build())
                    .build()
            )
            .send()
    );
    step!(
        "DescribeSecurityGroups(rules)",
        ec2.describe_security_groups().group_ids(&sg).send()
    );
    step!(
        "AuthorizeSecurityGroupIngress(duplicate)",
        ec2.authorize_security_group_ingress()
            .group_id(&sg)
            .ip_permissions(by_cidr.clone())
            .send()
    );
    step!(
        "RevokeSecurityGroupIngress",
        ec2.revoke_security_group_ingress()
            .group_id(&sg)
            .ip_permissions(by_cidr)
            .send()
    );
    step!(
        "CreateSecurityGroup(duplicate)",
        ec2.create_security_group()
            .group_name("pod-sg-crosscheck")
            .description("again")
            .vpc_id(&vpc)
            .send()
    );
}

/// Elements moto sends that the simulator deliberately leaves out (any path through one of
/// these is excused): storage, public addressing, hardware facts ipamd never reads. Listed in
/// docs/vpcsim.md.
const SIM_OMITS: &[&str] = &[
    // instances: storage, public IPs, platform details
    "blockDeviceMapping",
    "stateReason",
    "ipAddress",
    "sriovNetSupport",
    "platform",
    "hibernationOptions",
    // no public IPs / elastic IPs in the simulated VPC
    "association",
    // only set on requester-managed ENIs in EC2
    "requesterId",
    // instance-type hardware facts beyond networking limits
    "ebsInfo",
    "memoryInfo",
    "processorInfo",
    "placementGroupInfo",
    "nitroTpmInfo",
    "nitroTpmSupport",
    "nitroEnclavesSupport",
    "supportedBootModes",
    "supportedRootDeviceTypes",
    "supportedUsageClasses",
    "supportedVirtualizationTypes",
    "defaultCores",
    "defaultThreadsPerCore",
    "validCores",
    "validThreadsPerCore",
    "autoRecoverySupported",
    "burstablePerformanceSupported",
    "dedicatedHostsSupported",
    "freeTierEligible",
    "hibernationSupported",
    "instanceStorageSupported",
    "phcSupport",
    "rebootMigrationSupport",
    "connectionTrackingConfiguration",
    "enaSrdSupported",
    "encryptionInTransitSupported",
    "flexibleEnaQueuesSupport",
    "networkPerformance",
    "secondaryNetworkSupported",
    "baselineBandwidthInGbps",
    "peakBandwidthInGbps",
    "defaultEnaQueueCountPerInterface",
];

fn excused(path: &str) -> bool {
    path.split('/').any(|seg| SIM_OMITS.contains(&seg))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_answers_are_shaped_like_motos() {
    let moto = start_moto();
    let moto_rec = Recorder::default();
    let moto_steps = flow(&client(moto.addr, moto_rec.clone()), &moto_rec).await;

    let world = World::new(WorldConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    tokio::spawn(vpcsim::serve(
        listener,
        vpcsim::ec2::router(world),
        async move {
            let _ = rx.await;
        },
    ));
    let sim_rec = Recorder::default();
    let sim_steps = flow(&client(addr, sim_rec.clone()), &sim_rec).await;
    let _ = stop.send(());
    drop(moto);

    let (compared, problems) = compare(&moto_steps, &sim_steps);
    assert!(
        compared >= 15,
        "only {compared} steps compared: {moto_steps:?}"
    );
    assert!(
        problems.is_empty(),
        "shape differences:\n{}",
        problems.join("\n")
    );
}

/// Compare two runs of a flow: the simulator's shape must contain moto's (less `SIM_OMITS`),
/// error codes must agree. Returns the number of compared steps and the problems.
fn compare(moto_steps: &Steps, sim_steps: &Steps) -> (usize, Vec<String>) {
    let mut problems = Vec::new();
    let mut compared = 0;
    for (step, moto_out) in moto_steps {
        let Some(sim_out) = sim_steps.get(step) else {
            problems.push(format!("{step}: not run against the simulator"));
            continue;
        };
        match (moto_out, sim_out) {
            (Outcome::Shape(m), Outcome::Shape(s)) => {
                compared += 1;
                let missing: Vec<&String> = m.difference(s).filter(|p| !excused(p)).collect();
                if !missing.is_empty() {
                    problems.push(format!("{step}: simulator lacks {missing:?}"));
                }
                let extra: Vec<&String> = s.difference(m).collect();
                if !extra.is_empty() {
                    eprintln!("{step}: simulator-only fields (moto omits): {extra:?}");
                }
            }
            (Outcome::Error(m), Outcome::Error(s)) => {
                compared += 1;
                if m != s {
                    problems.push(format!("{step}: error code moto {m} vs simulator {s}"));
                }
            }
            (m, s) => problems.push(format!("{step}: moto {m:?} vs simulator {s:?}")),
        }
    }
    (compared, problems)
}

/// The IPv6 ENI flow (the calls ipamd makes in IPv6 mode that moto implements: no /80
/// prefixes there) on an IPv6 subnet of VPC `vpc`.
async fn flow6(ec2: &Client, rec: &Recorder, vpc: &str, subnet: &str) -> Steps {
    let mut steps = Steps::new();
    macro_rules! step {
        ($name:literal, $call:expr) => {{
            let r = $call.await;
            let outcome = match &r {
                Ok(_) => Outcome::Shape(rec.last_shape()),
                Err(e) => Outcome::Error(e.code().unwrap_or("<no code>").to_owned()),
            };
            steps.insert($name, outcome);
            r.ok()
        }};
    }
    step!("DescribeVpcs", ec2.describe_vpcs().vpc_ids(vpc).send());
    step!(
        "DescribeVpcs(unknown id)",
        ec2.describe_vpcs().vpc_ids("vpc-0123456789abcdef0").send()
    );
    step!(
        "DescribeSubnets(ipv6)",
        ec2.describe_subnets().subnet_ids(subnet).send()
    );
    let created = step!(
        "CreateNetworkInterface(Ipv6AddressCount)",
        ec2.create_network_interface()
            .subnet_id(subnet)
            .description("aws-K8S-crosscheck-v6")
            .ipv6_address_count(1)
            .send()
    )
    .expect("CreateNetworkInterface with IPv6");
    let eni = created
        .network_interface()
        .and_then(|n| n.network_interface_id())
        .unwrap()
        .to_owned();
    let assigned = step!(
        "AssignIpv6Addresses(count)",
        ec2.assign_ipv6_addresses()
            .network_interface_id(&eni)
            .ipv6_address_count(1)
            .send()
    )
    .expect("AssignIpv6Addresses");
    step!(
        "DescribeNetworkInterfaces(ipv6)",
        ec2.describe_network_interfaces()
            .network_interface_ids(&eni)
            .send()
    );
    let one = assigned.assigned_ipv6_addresses().last().unwrap().clone();
    step!(
        "UnassignIpv6Addresses",
        ec2.unassign_ipv6_addresses()
            .network_interface_id(&eni)
            .ipv6_addresses(&one)
            .send()
    );
    step!(
        "AssignIpv6Addresses(unknown eni)",
        ec2.assign_ipv6_addresses()
            .network_interface_id("eni-0123456789abcdef0")
            .ipv6_address_count(1)
            .send()
    );
    step!(
        "DeleteNetworkInterface(ipv6)",
        ec2.delete_network_interface()
            .network_interface_id(&eni)
            .send()
    );
    steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_ipv6_answers_are_shaped_like_motos() {
    let moto = start_moto();
    let moto_rec = Recorder::default();
    let moto_ec2 = client(moto.addr, moto_rec.clone());
    // moto's default VPC has no IPv6: make an Amazon-provided /56 VPC and a /64 subnet first
    let vpc = moto_ec2
        .create_vpc()
        .cidr_block("10.42.0.0/16")
        .amazon_provided_ipv6_cidr_block(true)
        .send()
        .await
        .unwrap();
    let vpc = vpc.vpc().unwrap();
    let vpc_id = vpc.vpc_id().unwrap().to_owned();
    let v56: ipnet::Ipv6Net = vpc.ipv6_cidr_block_association_set()[0]
        .ipv6_cidr_block()
        .unwrap()
        .parse()
        .unwrap();
    let v64 = v56.subnets(64).unwrap().next().unwrap();
    let subnet = moto_ec2
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block("10.42.0.0/24")
        .ipv6_cidr_block(v64.to_string())
        .send()
        .await
        .unwrap();
    let subnet_id = subnet.subnet().unwrap().subnet_id().unwrap().to_owned();
    let moto_steps = flow6(&moto_ec2, &moto_rec, &vpc_id, &subnet_id).await;

    let world = World::new(WorldConfig::default());
    let (vpc_id, subnet_id) =
        world.read(|s| (s.vpc.id.clone(), s.default_subnet().unwrap().id.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = oneshot::channel::<()>();
    tokio::spawn(vpcsim::serve(
        listener,
        vpcsim::ec2::router(world),
        async move {
            let _ = rx.await;
        },
    ));
    let sim_rec = Recorder::default();
    let sim_steps = flow6(
        &client(addr, sim_rec.clone()),
        &sim_rec,
        &vpc_id,
        &subnet_id,
    )
    .await;
    let _ = stop.send(());
    drop(moto);

    let (compared, problems) = compare(&moto_steps, &sim_steps);
    assert!(
        compared >= 8,
        "only {compared} steps compared: {moto_steps:?}"
    );
    assert!(
        problems.is_empty(),
        "shape differences:\n{}",
        problems.join("\n")
    );
}
