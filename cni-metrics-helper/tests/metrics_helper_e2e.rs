//! cni-metrics-helper end to end: the API simulator (kubesim) with two `aws-node` pods whose
//! pod-proxy routes lead to two loopback servers serving ipamd-shaped `/metrics` text, the
//! chart's RBAC (rendered by real Helm) for the helper's ServiceAccount, and moto's server as
//! CloudWatch. What the nodes served is read back from moto with ListMetrics/GetMetricData and
//! compared with upstream's aggregation. Also: one pod's proxy answers 503, a pod deleted
//! between list and scrape, CloudWatch throttling (a small shim in front of moto).
//! Needs `moto_server` and helm-python-sdk (integration/test.sh installs both).
#![allow(clippy::tests_outside_test_module)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cni_metrics_helper::aggregate::CounterMemory;
use cni_metrics_helper::cloudwatch::{CloudWatch, CloudWatchSettings, NAMESPACE};
use cni_metrics_helper::kube_pods::AwsNodePods;
use cni_metrics_helper::round::run_round;
use integration::moto::{MotoServer, metric_values};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// --- moto -------------------------------------------------------------------------------

fn start_moto() -> MotoServer {
    MotoServer::start().unwrap_or_else(|e| panic!("{e}"))
}

// --- two nodes' ipamd /metrics ------------------------------------------------------------

/// ipamd-shaped exposition (names, types and labels as ipamd's metrics module serves them).
fn ipamd_text(total: u32, assigned: u32, eni_max: u32, p99: f64, add_reqs: u64) -> String {
    format!(
        "# HELP awscni_total_ip_addresses The total number of IP addresses\n\
# TYPE awscni_total_ip_addresses gauge\nawscni_total_ip_addresses {total}\n\
# HELP awscni_assigned_ip_addresses The number of IP addresses assigned to pods\n\
# TYPE awscni_assigned_ip_addresses gauge\nawscni_assigned_ip_addresses {assigned}\n\
# TYPE awscni_eni_max gauge\nawscni_eni_max {eni_max}\n\
# TYPE awscni_eni_allocated gauge\nawscni_eni_allocated 2\n\
# TYPE awscni_assigned_ip_per_cidr gauge\n\
awscni_assigned_ip_per_cidr{{cidr=\"198.18.0.20/32\"}} 1\nawscni_assigned_ip_per_cidr{{cidr=\"198.18.0.21/32\"}} 1\n\
# TYPE awscni_aws_api_latency_ms summary\n\
awscni_aws_api_latency_ms{{api=\"AssignPrivateIpAddresses\",error=\"false\",status=\"200\",quantile=\"0.5\"}} 9000\n\
awscni_aws_api_latency_ms{{api=\"AssignPrivateIpAddresses\",error=\"false\",status=\"200\",quantile=\"0.99\"}} {p99}\n\
awscni_aws_api_latency_ms_sum{{api=\"AssignPrivateIpAddresses\",error=\"false\",status=\"200\"}} 100000\n\
awscni_aws_api_latency_ms_count{{api=\"AssignPrivateIpAddresses\",error=\"false\",status=\"200\"}} 12\n\
# TYPE awscni_add_ip_req_count counter\nawscni_add_ip_req_count {add_reqs}\n\
# TYPE go_goroutines gauge\ngo_goroutines 31\n"
    )
}

#[derive(Clone, Default)]
struct Node {
    text: Arc<Mutex<String>>,
    hits: Arc<AtomicUsize>,
    /// On its first hit this server deletes that pod through the API (a node leaving
    /// between the helper's list and its scrape of the other pod).
    delete_on_hit: Arc<Mutex<Option<(kube::Client, String)>>>,
}

async fn serve_node(node: Node) -> SocketAddr {
    use axum::{Router, routing::get};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let node = node.clone();
            async move {
                node.hits.fetch_add(1, Ordering::SeqCst);
                let victim = node.delete_on_hit.lock().unwrap().take();
                if let Some((client, pod)) = victim {
                    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
                        kube::Api::namespaced(client, "kube-system");
                    pods.delete(&pod, &Default::default()).await.unwrap();
                }
                node.text.lock().unwrap().clone()
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

// --- the cluster --------------------------------------------------------------------------

struct World {
    _dir: tempfile::TempDir,
    sim: kubesim::KubeSim,
    helper_kubeconfig: PathBuf,
    moto: MotoServer,
    a: Node,
    b: Node,
}

fn rendered_chart(dir: &Path) -> String {
    kubesim::chart::render_metrics_helper_chart(dir).unwrap_or_else(|e| panic!("{e}"))
}

async fn world() -> World {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let sim = kubesim::KubeSim::start(kubesim::Config::new(dir.path()))
        .await
        .unwrap();
    sim.apply_yaml(&rendered_chart(dir.path())).unwrap();
    let sa = sim
        .service_account("kube-system", "cni-metrics-helper")
        .unwrap();
    let (a, b) = (Node::default(), Node::default());
    *a.text.lock().unwrap() = ipamd_text(14, 3, 3, 40.0, 10);
    *b.text.lock().unwrap() = ipamd_text(28, 5, 4, 75.0, 4);
    for (i, node) in [&a, &b].into_iter().enumerate() {
        let (name, pod, ip) = [
            ("node-a", "aws-node-aaaaa", "198.18.0.10"),
            ("node-b", "aws-node-bbbbb", "198.18.0.11"),
        ][i];
        sim.add_node(name, ip, json!({})).unwrap();
        sim.add_pod("kube-system", pod, name, ip, json!({"k8s-app": "aws-node"}))
            .unwrap();
        sim.route_pod_port("kube-system", pod, 61678, serve_node(node.clone()).await);
    }
    // not an aws-node: must not be scraped
    sim.add_pod(
        "kube-system",
        "coredns-1",
        "node-a",
        "198.18.0.12",
        json!({"k8s-app": "kube-dns"}),
    )
    .unwrap();
    World {
        helper_kubeconfig: sa.kubeconfig,
        _dir: dir,
        sim,
        moto: start_moto(),
        a,
        b,
    }
}

fn settings(endpoint: &str, cluster_id: &str) -> CloudWatchSettings {
    CloudWatchSettings {
        region: Some("us-west-2".into()),
        endpoint: Some(endpoint.into()),
        cluster_id: cluster_id.into(),
        max_attempts: 4,
        initial_backoff: Duration::from_millis(50),
        static_credentials: Some(("testing".into(), "testing".into())),
    }
}

async fn reader(moto: &MotoServer) -> aws_sdk_cloudwatch::Client {
    moto.cloudwatch_reader(cni_metrics_helper::cloudwatch::http_client())
        .await
}

/// One statistic of one metric of one cluster over every period, read back with GetMetricData:
/// the largest period's `Maximum`, the smallest period's `Minimum`, the sum of the periods'
/// `Sum`. (Two rounds can fall into two periods when a minute turns between them; summing each
/// period's `Minimum` then read 86 for 42.)
async fn read_back(
    cw: &aws_sdk_cloudwatch::Client,
    cluster: &str,
    name: &str,
    stat: &str,
) -> Option<f64> {
    let values = metric_values(cw, NAMESPACE, cluster, name, stat)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    if values.is_empty() {
        return None;
    }
    Some(match stat {
        "Maximum" => values.into_iter().fold(f64::MIN, f64::max),
        "Minimum" => values.into_iter().fold(f64::MAX, f64::min),
        "Sum" => values.into_iter().sum(),
        other => panic!("read_back: no rule to combine periods of {other}"),
    })
}

// --- tests --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_aggregated_as_upstream_and_read_back_from_moto() {
    let w = world().await;
    let kube = AwsNodePods::connect(Some(&w.helper_kubeconfig))
        .await
        .unwrap();
    let cw = CloudWatch::new(settings(&w.moto.url, "e2e-two-nodes")).await;
    let mut memory = CounterMemory::default();

    let r1 = run_round(&kube, Some(&cw), None, &mut memory).await;
    assert_eq!((r1.pods, r1.scraped, r1.published), (2, 2, true), "{r1:?}");
    // second round: node a served 15 more add requests, b's ipamd restarted (4 → 1)
    *w.a.text.lock().unwrap() = ipamd_text(16, 4, 3, 40.0, 25);
    *w.b.text.lock().unwrap() = ipamd_text(28, 5, 4, 75.0, 1);
    let r2 = run_round(&kube, Some(&cw), None, &mut memory).await;
    assert!(r2.published, "{r2:?}");

    let reader = reader(&w.moto).await;
    let names: Vec<String> = reader
        .list_metrics()
        .namespace(NAMESPACE)
        .send()
        .await
        .unwrap()
        .metrics()
        .iter()
        .filter(|m| {
            m.dimensions()
                .iter()
                .any(|d| d.value() == Some("e2e-two-nodes"))
        })
        .filter_map(|m| m.metric_name().map(str::to_string))
        .collect();
    for want in [
        "totalIPAddresses",
        "assignIPAddresses",
        "eniMaxAvailable",
        "eniAllocated",
        "totalAssignedIPv4sPerCidr",
        "awsAPILatency",
        "addReqCount",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("goroutines")), "{names:?}");
    // (metric, stat, expected): gauges summed over nodes per round (Maximum = the larger
    // round), p99 latency max over nodes, counters as per-node deltas summed over rounds.
    let cases = [
        ("totalIPAddresses", "Maximum", 44.0), // round 2: 16 + 28
        ("totalIPAddresses", "Minimum", 42.0), // round 1: 14 + 28
        ("assignIPAddresses", "Sum", 8.0 + 9.0),
        ("eniMaxAvailable", "Maximum", 7.0),
        ("eniAllocated", "Maximum", 4.0),
        ("totalAssignedIPv4sPerCidr", "Maximum", 4.0),
        ("awsAPILatency", "Maximum", 75.0),
        ("addReqCount", "Sum", 14.0 + 16.0), // round 1: 10 + 4; round 2: 15 + 1 (restart)
    ];
    for (name, stat, want) in cases {
        assert_eq!(
            read_back(&reader, "e2e-two-nodes", name, stat).await,
            Some(want),
            "{name} {stat}"
        );
    }
    // the helper used exactly the chart's RBAC: no 403 in the audit
    let audit = w.sim.audit();
    assert!(audit.iter().all(|e| e.code != 403), "{audit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_pod_proxy_still_publishes_the_other_node() {
    let w = world().await;
    // node b's metrics port now leads nowhere: the API server's pod proxy answers 503
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    w.sim
        .route_pod_port("kube-system", "aws-node-bbbbb", 61678, closed);
    let kube = AwsNodePods::connect(Some(&w.helper_kubeconfig))
        .await
        .unwrap();
    let cw = CloudWatch::new(settings(&w.moto.url, "e2e-503")).await;
    let r = run_round(&kube, Some(&cw), None, &mut CounterMemory::default()).await;
    assert_eq!((r.pods, r.scraped, r.published), (2, 1, true), "{r:?}");
    let reader = reader(&w.moto).await;
    assert_eq!(
        read_back(&reader, "e2e-503", "totalIPAddresses", "Sum").await,
        Some(14.0)
    );
    assert_eq!(
        read_back(&reader, "e2e-503", "awsAPILatency", "Maximum").await,
        Some(40.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_mid_round_is_skipped() {
    let w = world().await;
    let admin = {
        let file = kube::config::Kubeconfig::read_from(&w.sim.admin().kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(cfg).unwrap()
    };
    // pods are listed in name order: scraping a deletes b before the helper reaches it
    *w.a.delete_on_hit.lock().unwrap() = Some((admin, "aws-node-bbbbb".into()));
    let kube = AwsNodePods::connect(Some(&w.helper_kubeconfig))
        .await
        .unwrap();
    let cw = CloudWatch::new(settings(&w.moto.url, "e2e-gone")).await;
    let r = run_round(&kube, Some(&cw), None, &mut CounterMemory::default()).await;
    assert_eq!((r.pods, r.scraped, r.published), (2, 1, true), "{r:?}");
    assert_eq!(
        w.b.hits.load(Ordering::SeqCst),
        0,
        "b was scraped after its deletion"
    );
    let reader = reader(&w.moto).await;
    assert_eq!(
        read_back(&reader, "e2e-gone", "totalIPAddresses", "Sum").await,
        Some(14.0)
    );
    // next round: only a is listed
    let r = run_round(&kube, Some(&cw), None, &mut CounterMemory::default()).await;
    assert_eq!((r.pods, r.scraped), (1, 1));
}

/// A shim in front of moto: the first `throttle` requests get CloudWatch's throttling error
/// (HTTP 400, awsQuery XML `<Code>Throttling</Code>`, as CloudWatch answers); later
/// connections are piped to moto. The SDK's own classifier decides to retry.
async fn throttling_shim(moto: SocketAddr, throttle: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let throttled = Arc::new(AtomicUsize::new(0));
    let count = throttled.clone();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let count = count.clone();
            tokio::spawn(async move {
                if count.load(Ordering::SeqCst) >= throttle {
                    let mut upstream = tokio::net::TcpStream::connect(moto).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                    return;
                }
                // read the whole request (head + Content-Length body), then refuse it
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                count.fetch_add(1, Ordering::SeqCst);
                let body =
                    b"<ErrorResponse xmlns=\"http://monitoring.amazonaws.com/doc/2010-08-01/\">\
<Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error>\
<RequestId>e2e-throttle</RequestId></ErrorResponse>";
                let head = format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-type: text/xml\r\n\
content-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (addr, throttled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudwatch_throttling_is_retried_with_backoff() {
    let w = world().await;
    let moto_addr: SocketAddr = w.moto.url.trim_start_matches("http://").parse().unwrap();
    let (shim, throttled) = throttling_shim(moto_addr, 2).await;
    let kube = AwsNodePods::connect(Some(&w.helper_kubeconfig))
        .await
        .unwrap();
    let cw = CloudWatch::new(settings(&format!("http://{shim}"), "e2e-throttled")).await;
    let r = run_round(&kube, Some(&cw), None, &mut CounterMemory::default()).await;
    assert!(r.published, "{r:?}");
    assert_eq!(throttled.load(Ordering::SeqCst), 2);
    let reader = reader(&w.moto).await;
    assert_eq!(
        read_back(&reader, "e2e-throttled", "totalIPAddresses", "Sum").await,
        Some(42.0)
    );

    // throttled beyond the attempts: the round reports it, nothing is half-published
    let (shim, _) = throttling_shim(moto_addr, 100).await;
    let cw = CloudWatch::new(settings(&format!("http://{shim}"), "e2e-gave-up")).await;
    let r = run_round(&kube, Some(&cw), None, &mut CounterMemory::default()).await;
    assert!(!r.published, "{r:?}");
    assert_eq!(
        read_back(&reader, "e2e-gave-up", "totalIPAddresses", "Sum").await,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_a_round_from_its_environment() {
    let w = world().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_cni-metrics-helper"))
        .env_clear()
        .env("KUBECONFIG", &w.helper_kubeconfig)
        .env("AWS_REGION", "us-west-2")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CLUSTER_ID", "e2e-binary")
        .env("USE_CLOUDWATCH", "true")
        .env("METRIC_UPDATE_INTERVAL", "1")
        .env("CNI_METRICS_HELPER_ROUNDS", "1")
        .env("CNI_METRICS_HELPER_CLOUDWATCH_ENDPOINT", &w.moto.url)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // upstream's JSON line shape
    for line in stdout.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert!(
            v["level"].is_string() && v["ts"].is_string() && v["msg"].is_string(),
            "{line}"
        );
    }
    assert!(stdout.contains("Starting CNIMetricsHelper"), "{stdout}");
    let reader = reader(&w.moto).await;
    assert_eq!(
        read_back(&reader, "e2e-binary", "totalIPAddresses", "Sum").await,
        Some(42.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_aws_cluster_id_the_binary_uses_its_instances_cluster_tag() {
    let w = world().await;
    // the instance the helper runs on, as the simulated VPC's EC2 API and IMDS show it, tagged
    // as EKS tags a managed node group's instances (and with a `Name`, which must lose)
    let ec2_world = vpcsim::World::new(vpcsim::WorldConfig::default());
    let id = ec2_world.run_instances("m5.large", 1).unwrap().remove(0);
    let tags = [("Name", "node-1"), ("eks:cluster-name", "tagged-cluster")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    ec2_world
        .mutate(|s, _| s.create_tags(std::slice::from_ref(&id), &tags))
        .unwrap();
    let ec2 = vpcsim::LocalServer::start(vpcsim::ec2::router(ec2_world.clone()))
        .await
        .unwrap();
    let imds = vpcsim::LocalServer::start(vpcsim::imds::router(ec2_world.clone(), &id))
        .await
        .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_cni-metrics-helper"))
        .env_clear()
        .env("KUBECONFIG", &w.helper_kubeconfig)
        // no AWS_REGION, no AWS_CLUSTER_ID: both come from the instance, as upstream
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url())
        .env("AWS_ENDPOINT_URL_EC2", ec2.url())
        .env("USE_CLOUDWATCH", "true")
        .env("METRIC_UPDATE_INTERVAL", "1")
        .env("CNI_METRICS_HELPER_ROUNDS", "1")
        .env("CNI_METRICS_HELPER_CLOUDWATCH_ENDPOINT", &w.moto.url)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Using REGION=us-west-2 and CLUSTER_ID=tagged-cluster"),
        "{stdout}"
    );
    let reader = reader(&w.moto).await;
    assert_eq!(
        read_back(&reader, "tagged-cluster", "totalIPAddresses", "Sum").await,
        Some(42.0)
    );
}
