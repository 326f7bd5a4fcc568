//! The subnet inventory end to end: the simulated VPC's EC2 API (vpcsim) with two nodes, a
//! subnet tagged for subnet discovery, an ENIConfig subnet, foreign ENIs holding addresses and
//! prefixes, CIDR reservations of both kinds and a fragmented subnet; the API simulator
//! (kubesim) with the aws-node pods, the ENIConfig CRD and the chart's RBAC (rendered by real
//! Helm) for the helper's ServiceAccount; moto's server as CloudWatch. The figures must equal
//! a brute-force count of vpcsim's state, address by address, and the forecast must follow a
//! consumption driven through the EC2 API (the rounds' clock is the test's).
//! Needs `moto_server` and helm-python-sdk (integration/test.sh installs both).
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use aws_sdk_ec2::types::{ResourceType, SubnetCidrReservationType, Tag, TagSpecification};
use cni_metrics_helper::cloudwatch::{CloudWatch, CloudWatchSettings, NAMESPACE};
use cni_metrics_helper::inventory::ec2::Ec2Inventory;
use cni_metrics_helper::inventory::{Inventory, Source, SubnetReport};
use cni_metrics_helper::kube_pods::AwsNodePods;
use cni_metrics_helper::round::run_inventory;
use cni_metrics_helper::serve::{Published, render};
use integration::moto::MotoServer;
use ipnet::Ipv4Net;
use serde_json::json;

const ENICONFIG_CRD: &str = r"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: eniconfigs.crd.k8s.amazonaws.com
spec:
  group: crd.k8s.amazonaws.com
  scope: Cluster
  names: {plural: eniconfigs, singular: eniconfig, kind: ENIConfig, listKind: ENIConfigList}
  versions:
    - name: v1alpha1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
";

struct Vpc {
    world: std::sync::Arc<vpcsim::World>,
    url: String,
    _server: vpcsim::LocalServer,
    instances: Vec<String>,
}

fn sdk_conf(url: &str) -> aws_sdk_ec2::Config {
    aws_sdk_ec2::Config::builder()
        .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
        .region(aws_sdk_ec2::config::Region::new("us-west-2"))
        .endpoint_url(url)
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "testing", "testing", None, None, "static",
        ))
        .http_client(cni_metrics_helper::cloudwatch::http_client())
        .build()
}

async fn vpc() -> Vpc {
    let world = vpcsim::World::new(vpcsim::WorldConfig::default());
    let instances = world.run_instances("m5.large", 2).unwrap();
    let server = vpcsim::LocalServer::start(vpcsim::ec2::router(world.clone()))
        .await
        .unwrap();
    Vpc {
        url: server.url(),
        world,
        _server: server,
        instances,
    }
}

/// Brute force over vpcsim's state: for every address of the subnet, is it free for an
/// automatic secondary address; for every aligned /28, could EC2 delegate it.
fn brute_force(world: &vpcsim::World, subnet_id: &str) -> (u32, u32) {
    world.read(|s| {
        let subnet = &s.subnets[subnet_id];
        let cidr = subnet.cidr;
        let held = |ip: Ipv4Addr| {
            s.enis.values().any(|e| {
                e.private_ips.contains(&ip) || e.ipv4_prefixes.iter().any(|p| p.contains(&ip))
            })
        };
        let reserved = |ip: Ipv4Addr, explicit_only: bool| {
            subnet.reservations.iter().any(|r| {
                r.cidr.contains(&ip)
                    && (!explicit_only || r.kind == vpcsim::state::ReservationKind::Explicit)
            })
        };
        let aws = |ip: Ipv4Addr| {
            let off = u32::from(ip) - u32::from(cidr.network());
            off < 4 || ip == cidr.broadcast()
        };
        let free = cidr
            .hosts()
            .chain([cidr.network(), cidr.broadcast()])
            .filter(|ip| !aws(*ip) && !held(*ip) && !reserved(*ip, false))
            .count();
        let blocks = cidr
            .subnets(28)
            .unwrap()
            .filter(|b: &Ipv4Net| {
                (u32::from(b.network())..=u32::from(b.broadcast()))
                    .map(Ipv4Addr::from)
                    .all(|ip| !aws(ip) && !held(ip) && !reserved(ip, true))
            })
            .count();
        (u32::try_from(free).unwrap(), u32::try_from(blocks).unwrap())
    })
}

fn subnet_of(world: &vpcsim::World, instance: &str) -> (String, Ipv4Addr, String) {
    world.read(|s| {
        let eni = &s.enis[&s.instances[instance].primary_eni];
        (
            eni.subnet_id.clone(),
            eni.primary_ip(),
            s.subnets[&eni.subnet_id].availability_zone.clone(),
        )
    })
}

async fn create_subnet(ec2: &aws_sdk_ec2::Client, cidr: &str, az: &str, tag: &str) -> String {
    let vpc = ec2.describe_vpcs().send().await.unwrap().vpcs()[0]
        .vpc_id()
        .unwrap()
        .to_owned();
    ec2.create_subnet()
        .vpc_id(vpc)
        .cidr_block(cidr)
        .availability_zone(az)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::Subnet)
                .tags(
                    Tag::builder()
                        .key("kubernetes.io/role/cni")
                        .value(tag)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap()
        .subnet()
        .unwrap()
        .subnet_id()
        .unwrap()
        .to_owned()
}

/// A foreign ENI (not a node's) holding `secondary` addresses, or explicit ones.
async fn foreign_eni(
    ec2: &aws_sdk_ec2::Client,
    subnet: &str,
    secondary: i32,
    prefixes: i32,
    explicit: &[Ipv4Addr],
) {
    let mut req = ec2.create_network_interface().subnet_id(subnet);
    if secondary > 0 {
        req = req.secondary_private_ip_address_count(secondary);
    }
    if prefixes > 0 {
        req = req.ipv4_prefix_count(prefixes);
    }
    for ip in explicit {
        req = req.private_ip_addresses(
            aws_sdk_ec2::types::PrivateIpAddressSpecification::builder()
                .private_ip_address(ip.to_string())
                .primary(explicit.first() == Some(ip))
                .build(),
        );
    }
    req.send().await.unwrap();
}

fn report<'a>(reports: &'a [SubnetReport], id: &str) -> &'a SubnetReport {
    reports
        .iter()
        .find(|r| r.subnet_id == id)
        .unwrap_or_else(|| panic!("{id} not in {reports:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_equals_a_brute_force_count_and_the_forecast_follows_consumption() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let v = vpc().await;
    let ec2 = aws_sdk_ec2::Client::from_conf(sdk_conf(&v.url));
    let (primary_subnet, ip_a, az) = subnet_of(&v.world, &v.instances[0]);
    let (_, ip_b, _) = subnet_of(&v.world, &v.instances[1]);

    // subnet discovery: one tagged subnet in the nodes' zone, one excluded (=0)
    let tagged = create_subnet(&ec2, "198.18.64.0/24", &az, "1").await;
    let excluded = create_subnet(&ec2, "198.18.65.0/24", &az, "0").await;
    // custom networking: an ENIConfig names a subnet no node's primary ENI is in
    let eniconfig_subnet = create_subnet(&ec2, "198.18.66.0/24", &az, "0").await;
    // fragment the tagged subnet: one address in every /28 (no whole block left)
    let fragmenting: Vec<Ipv4Addr> = (0..16u32)
        .map(|b| Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 64, 0)) + b * 16 + 7))
        .collect();
    foreign_eni(&ec2, &tagged, 0, 0, &fragmenting[..8]).await;
    foreign_eni(&ec2, &tagged, 0, 0, &fragmenting[8..]).await;
    // the primary subnet: foreign ENIs with addresses and prefixes, both reservation kinds
    foreign_eni(&ec2, &primary_subnet, 9, 0, &[]).await;
    foreign_eni(&ec2, &primary_subnet, 0, 3, &[]).await;
    for (cidr, kind) in [
        ("198.18.8.0/24", SubnetCidrReservationType::Explicit),
        ("198.18.9.0/24", SubnetCidrReservationType::Prefix),
    ] {
        ec2.create_subnet_cidr_reservation()
            .subnet_id(&primary_subnet)
            .cidr(cidr)
            .reservation_type(kind)
            .send()
            .await
            .unwrap();
    }

    // the cluster: two aws-node pods on the nodes' addresses, the ENIConfig, the chart's RBAC
    let dir = tempfile::tempdir().unwrap();
    let sim = kubesim::KubeSim::start(kubesim::Config::new(dir.path()))
        .await
        .unwrap();
    sim.apply_yaml(&kubesim::chart::render_metrics_helper_chart(dir.path()).unwrap())
        .unwrap();
    sim.apply_yaml(ENICONFIG_CRD).unwrap();
    sim.apply_yaml(&format!(
        "apiVersion: crd.k8s.amazonaws.com/v1alpha1\nkind: ENIConfig\nmetadata: {{name: {az}}}\nspec: {{subnet: {eniconfig_subnet}, securityGroups: []}}\n"
    ))
    .unwrap();
    for (node, pod, ip) in [
        ("node-a", "aws-node-a", ip_a),
        ("node-b", "aws-node-b", ip_b),
    ] {
        sim.add_node(node, &ip.to_string(), json!({})).unwrap();
        sim.add_pod(
            "kube-system",
            pod,
            node,
            &ip.to_string(),
            json!({"k8s-app": "aws-node"}),
        )
        .unwrap();
    }
    let sa = sim
        .service_account("kube-system", "cni-metrics-helper")
        .unwrap();
    let kube = AwsNodePods::connect(Some(&sa.kubeconfig)).await.unwrap();
    let moto = MotoServer::start().unwrap_or_else(|e| panic!("{e}"));
    let cw = CloudWatch::new(CloudWatchSettings {
        region: Some("us-west-2".into()),
        endpoint: Some(moto.url.clone()),
        cluster_id: "inventory-e2e".into(),
        max_attempts: 3,
        initial_backoff: std::time::Duration::from_millis(50),
        static_credentials: Some(("testing".into(), "testing".into())),
    })
    .await;
    let inv_ec2 = Ec2Inventory::from_conf(sdk_conf(&v.url));
    let mut inventory = Inventory::new(3600.0);
    let latest = std::sync::Arc::new(std::sync::Mutex::new(Published::default()));

    // round 0: the subnet set and the figures
    let r0 = run_inventory(
        &kube,
        &inv_ec2,
        &mut inventory,
        0.0,
        Some(&cw),
        Some(&latest),
    )
    .await;
    assert_eq!(r0.error, None, "{r0:?}");
    assert!(r0.published);
    let ids: Vec<&str> = r0.subnets.iter().map(|r| r.subnet_id.as_str()).collect();
    let mut want = vec![
        primary_subnet.as_str(),
        tagged.as_str(),
        eniconfig_subnet.as_str(),
    ];
    want.sort_unstable();
    let mut got = ids.clone();
    got.sort_unstable();
    assert_eq!(got, want, "excluded {excluded} must not be listed");
    assert!(
        report(&r0.subnets, &primary_subnet)
            .sources
            .contains(&Source::Primary)
    );
    assert!(
        report(&r0.subnets, &tagged)
            .sources
            .contains(&Source::Discovered)
    );
    assert!(
        report(&r0.subnets, &eniconfig_subnet)
            .sources
            .contains(&Source::EniConfig)
    );
    for r in &r0.subnets {
        let (free, blocks) = brute_force(&v.world, &r.subnet_id);
        assert_eq!(
            (r.figures.free_addresses, r.figures.free_prefix_blocks),
            (free, blocks),
            "{}",
            r.subnet_id
        );
    }
    assert_eq!(report(&r0.subnets, &tagged).figures.free_prefix_blocks, 0);
    assert!(report(&r0.subnets, &tagged).figures.free_addresses > 200);
    // bounded calls: 1 by node address, 1 tagged DescribeSubnets, 1 by id, 1 by subnet, 3
    // reservations
    assert_eq!(r0.calls, 7, "{r0:?}");

    // rounds 1..=6, 60 s apart on the helper's clock: 30 addresses and one /28 each
    let (per_round, secs) = (30u32, 60.0);
    for k in 1..=6u32 {
        foreign_eni(
            &ec2,
            &primary_subnet,
            i32::try_from(per_round - 1).unwrap(),
            0,
            &[],
        )
        .await;
        foreign_eni(&ec2, &eniconfig_subnet, 0, 1, &[]).await;
        let r = run_inventory(
            &kube,
            &inv_ec2,
            &mut inventory,
            f64::from(k) * secs,
            Some(&cw),
            Some(&latest),
        )
        .await;
        assert_eq!(r.error, None);
        for s in &r.subnets {
            assert_eq!(
                (s.figures.free_addresses, s.figures.free_prefix_blocks),
                brute_force(&v.world, &s.subnet_id)
            );
        }
    }
    let last = latest.lock().unwrap().clone();
    let p = report(&last.subnets, &primary_subnet);
    let rate = p.addresses.unwrap().consumption_per_sec;
    let driven = f64::from(per_round) / secs;
    assert!(
        (rate - driven).abs() <= driven * 0.1,
        "rate {rate} vs {driven}"
    );
    let eta = p.addresses.unwrap().exhaustion_secs.unwrap();
    let truth = f64::from(p.figures.free_addresses) / driven;
    assert!((eta - truth).abs() <= truth * 0.1, "eta {eta} vs {truth}");
    let c = report(&last.subnets, &eniconfig_subnet);
    let blocks_rate = c.prefix_blocks.unwrap().consumption_per_sec;
    assert!(
        (blocks_rate - 1.0 / secs).abs() <= 0.1 / secs,
        "{blocks_rate}"
    );
    // the tagged subnet is not consumed: no forecast
    assert_eq!(
        report(&last.subnets, &tagged)
            .addresses
            .unwrap()
            .exhaustion_secs,
        None
    );

    // Prometheus text: parses, carries the subnet labels
    let text = render(&last);
    let families = cni_metrics_helper::exposition::parse(&text).unwrap();
    assert!(!families.is_empty());
    assert!(text.contains(&format!(
        "awscni_subnet_free_prefix_blocks{{availability_zone=\"{az}\",cidr=\"198.18.64.0/24\",subnet=\"{tagged}\"}} 0"
    )));
    assert!(text.contains(&format!(
        "awscni_subnet_exhaustion_seconds{{availability_zone=\"{az}\""
    )));

    // CloudWatch (moto): per subnet, with the SubnetId dimension
    let reader = moto
        .cloudwatch_reader(cni_metrics_helper::cloudwatch::http_client())
        .await;
    let listed = reader
        .list_metrics()
        .namespace(NAMESPACE)
        .metric_name("subnetFreePrefixBlocks")
        .send()
        .await
        .unwrap();
    let by_subnet: BTreeMap<String, usize> = listed
        .metrics()
        .iter()
        .filter_map(|m| {
            m.dimensions()
                .iter()
                .find(|d| d.name() == Some("SubnetId"))
                .and_then(|d| d.value())
                .map(|v| (v.to_owned(), m.dimensions().len()))
        })
        .collect();
    assert_eq!(by_subnet.len(), 3, "{by_subnet:?}");
    assert!(
        by_subnet.values().all(|n| *n == 2),
        "CLUSTER_ID and SubnetId"
    );
    let eta_listed = reader
        .list_metrics()
        .namespace(NAMESPACE)
        .metric_name("subnetIPExhaustionSeconds")
        .send()
        .await
        .unwrap();
    assert!(!eta_listed.metrics().is_empty());
}

/// EC2 with one action denied, as IAM denies it (`UnauthorizedOperation`, HTTP 403): a
/// layer in front of vpcsim's EC2 API.
async fn deny_layer(
    denied: std::sync::Arc<std::sync::Mutex<Option<&'static str>>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let action = String::from_utf8_lossy(&bytes)
        .split('&')
        .find_map(|kv| kv.strip_prefix("Action=").map(str::to_owned));
    let deny = *denied.lock().unwrap();
    if deny.is_some() && action.as_deref() == deny {
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error><Code>UnauthorizedOperation</Code><Message>You are not authorized to perform this operation.</Message></Error></Errors><RequestID>deny</RequestID></Response>";
        return axum::response::Response::builder()
            .status(403)
            .body(axum::body::Body::from(body))
            .unwrap();
    }
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_iam_permission_is_named_and_keeps_the_last_inventory() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let world = vpcsim::World::new(vpcsim::WorldConfig::default());
    let instances = world.run_instances("m5.large", 1).unwrap();
    let denied = std::sync::Arc::new(std::sync::Mutex::new(None));
    let d = denied.clone();
    let router = vpcsim::ec2::router(world.clone()).layer(axum::middleware::from_fn(
        move |req: axum::extract::Request, next: axum::middleware::Next| {
            deny_layer(d.clone(), req, next)
        },
    ));
    let server = vpcsim::LocalServer::start(router).await.unwrap();
    let (_, ip_a, _) = subnet_of(&world, &instances[0]);
    let dir = tempfile::tempdir().unwrap();
    let sim = kubesim::KubeSim::start(kubesim::Config::new(dir.path()))
        .await
        .unwrap();
    sim.apply_yaml(&kubesim::chart::render_metrics_helper_chart(dir.path()).unwrap())
        .unwrap();
    sim.add_node("node-a", &ip_a.to_string(), json!({}))
        .unwrap();
    sim.add_pod(
        "kube-system",
        "aws-node-a",
        "node-a",
        &ip_a.to_string(),
        json!({"k8s-app": "aws-node"}),
    )
    .unwrap();
    let sa = sim
        .service_account("kube-system", "cni-metrics-helper")
        .unwrap();
    let kube = AwsNodePods::connect(Some(&sa.kubeconfig)).await.unwrap();
    let inv_ec2 = Ec2Inventory::from_conf(sdk_conf(&server.url()));
    let mut inventory = Inventory::new(3600.0);
    let latest = std::sync::Arc::new(std::sync::Mutex::new(Published::default()));
    // no ENIConfig CRD in this cluster: no ENIConfig subnets, no error
    let r = run_inventory(&kube, &inv_ec2, &mut inventory, 0.0, None, Some(&latest)).await;
    assert_eq!(r.error, None);
    assert_eq!(r.subnets.len(), 1);
    *denied.lock().unwrap() = Some("GetSubnetCidrReservations");
    let r = run_inventory(&kube, &inv_ec2, &mut inventory, 60.0, None, Some(&latest)).await;
    let err = r.error.expect("denied");
    assert!(err.starts_with("GetSubnetCidrReservations"), "{err}");
    assert!(err.contains("UnauthorizedOperation"), "{err}");
    assert_eq!(
        latest.lock().unwrap().subnets.len(),
        1,
        "last inventory kept"
    );
}
