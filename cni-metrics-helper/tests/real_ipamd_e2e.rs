//! cni-metrics-helper against real ipamds (root only): two simulated nodes (vpcsim) each run
//! the real `ipamd` with pods wired by `aws-cni`, the API simulator (kubesim) with the
//! cni-metrics-helper chart's RBAC lists their `aws-node` pods and proxies each pod's `:61678`
//! into its node's network namespace, and moto's server is CloudWatch. Two rounds (more pods
//! between them); what CloudWatch holds afterwards must be what the nodes' own `/metrics`
//! said, combined as upstream's table says (gauges summed per round, counters as deltas).
//! Needs `moto_server` and helm-python-sdk (integration/test.sh installs both).
#![allow(clippy::tests_outside_test_module)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use cni_metrics_helper::aggregate::CounterMemory;
use cni_metrics_helper::cloudwatch::{CloudWatch, CloudWatchSettings, NAMESPACE};
use cni_metrics_helper::kube_pods::AwsNodePods;
use cni_metrics_helper::round::run_round;
use integration::can_run_kernel_tests;
use integration::moto::{MotoServer, metric_values};
use integration::sim::{METRICS, Sim, SimConfig, in_netns};
use serde_json::json;

const READY: Duration = Duration::from_secs(60);
const CLUSTER: &str = "e2e-real-ipamds";

fn start_moto() -> MotoServer {
    MotoServer::start().unwrap_or_else(|e| panic!("{e}"))
}

fn rendered_chart(dir: &Path) -> String {
    kubesim::chart::render_metrics_helper_chart(dir).unwrap_or_else(|e| panic!("{e}"))
}

/// A loopback listener in the root namespace whose connections are piped to `target` inside
/// network namespace `ns` (the socket is opened on a thread in `ns`, then used from here): the
/// API simulator's pod proxy reaches ipamd's metrics port in the node's namespace this way.
async fn relay_into(ns: String, target: SocketAddr) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let ns = ns.clone();
            tokio::spawn(async move {
                let inner = tokio::task::spawn_blocking(move || {
                    in_netns(&ns, move || {
                        std::net::TcpStream::connect_timeout(&target, Duration::from_secs(2))
                    })
                })
                .await;
                let Ok(Ok(inner)) = inner else { return };
                if inner.set_nonblocking(true).is_err() {
                    return;
                }
                let Ok(mut inner) = tokio::net::TcpStream::from_std(inner) else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut conn, &mut inner).await;
            });
        }
    });
    addr
}

/// `name{labels} value` lines of one exposition, summed per family name (label sets added).
fn families(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let name = series.split('{').next().unwrap();
        let v: f64 = value.parse().unwrap();
        *out.entry(name.to_owned()).or_default() += v;
    }
    out
}

/// Both nodes' `/metrics`, once two reads 1.5 s apart agree on every family the test compares
/// (the pool manager has settled).
fn settled_metrics(sim: &Sim) -> Vec<BTreeMap<String, f64>> {
    const WATCHED: [&str; 4] = [
        "awscni_total_ip_addresses",
        "awscni_assigned_ip_addresses",
        "awscni_eni_allocated",
        "awscni_add_ip_req_count",
    ];
    let read = || -> Vec<BTreeMap<String, f64>> {
        (0..sim.nodes.len())
            .map(|i| {
                let all = families(&sim.http_get(i, METRICS, "/metrics").unwrap());
                WATCHED
                    .iter()
                    .map(|k| ((*k).to_owned(), all.get(*k).copied().unwrap_or(0.0)))
                    .chain(
                        all.get("awscni_eni_max")
                            .map(|v| ("awscni_eni_max".to_owned(), *v)),
                    )
                    .collect()
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = read();
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        let now = read();
        if now == last {
            return now;
        }
        assert!(Instant::now() < deadline, "metrics never settled: {now:?}");
        last = now;
    }
}

fn sum(nodes: &[BTreeMap<String, f64>], family: &str) -> f64 {
    nodes.iter().map(|n| n[family]).sum()
}

async fn read_back(cw: &aws_sdk_cloudwatch::Client, name: &str, stat: &str) -> Option<Vec<f64>> {
    let values = metric_values(cw, NAMESPACE, CLUSTER, name, stat)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (!values.is_empty()).then_some(values)
}

#[test]
fn real_ipamds_under_load_are_published_as_their_metrics_say() {
    if !can_run_kernel_tests() {
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // two nodes, real ipamds, pods wired by aws-cni (node 1 needs a second ENI)
    let mut sim = Sim::start(&SimConfig::default()).expect("simulated VPC");
    for i in 0..2 {
        sim.start_ipamd(i, &[("IPAMD_POOL_TICK_SECONDS", "1")], READY)
            .unwrap_or_else(|e| panic!("ipamd {i}: {e}"));
    }
    let add = |sim: &mut Sim, node: usize, n: usize, tag: &str| {
        for k in 0..n {
            let name = format!("{tag}-{node}-{k}");
            sim.add_pod(node, &name)
                .unwrap_or_else(|e| panic!("ADD {name}: {e}\n{}", sim.ipamd_log_tail(node, 30)));
        }
    };
    add(&mut sim, 0, 4, "a");
    add(&mut sim, 1, 12, "a");

    // the cluster: chart RBAC for the helper, one aws-node pod per node, proxied into its netns
    let dir = tempfile::tempdir().unwrap();
    let kube = rt
        .block_on(kubesim::KubeSim::start(kubesim::Config::new(dir.path())))
        .unwrap();
    kube.apply_yaml(&rendered_chart(dir.path())).unwrap();
    let sa = kube
        .service_account("kube-system", "cni-metrics-helper")
        .unwrap();
    let metrics_addr: SocketAddr = METRICS.parse().unwrap();
    for node in &sim.nodes {
        let name = format!("node{}", node.index);
        let pod = format!("aws-node-{}", node.index);
        let ip = node.primary_ip.to_string();
        kube.add_node(&name, &ip, json!({})).unwrap();
        kube.add_pod(
            "kube-system",
            &pod,
            &name,
            &ip,
            json!({"k8s-app": "aws-node"}),
        )
        .unwrap();
        let relay = rt.block_on(relay_into(node.netns.clone(), metrics_addr));
        kube.route_pod_port("kube-system", &pod, 61678, relay);
    }
    let moto = start_moto();
    let settings = CloudWatchSettings {
        region: Some("us-west-2".into()),
        endpoint: Some(moto.url.clone()),
        cluster_id: CLUSTER.into(),
        max_attempts: 4,
        initial_backoff: Duration::from_millis(50),
        static_credentials: Some(("testing".into(), "testing".into())),
    };
    let helper = rt
        .block_on(AwsNodePods::connect(Some(&sa.kubeconfig)))
        .unwrap();
    let cw = rt.block_on(CloudWatch::new(settings));
    let mut memory = CounterMemory::default();

    // round 1, then more load on node 0, then round 2
    let seen1 = settled_metrics(&sim);
    let r1 = rt.block_on(run_round(&helper, Some(&cw), None, &mut memory));
    assert_eq!((r1.pods, r1.scraped, r1.published), (2, 2, true), "{r1:?}");
    assert_eq!(settled_metrics(&sim), seen1, "metrics moved during round 1");
    add(&mut sim, 0, 9, "b");
    let seen2 = settled_metrics(&sim);
    let r2 = rt.block_on(run_round(&helper, Some(&cw), None, &mut memory));
    assert!(r2.published, "{r2:?}");
    assert_eq!(settled_metrics(&sim), seen2, "metrics moved during round 2");
    assert!(
        sum(&seen2, "awscni_total_ip_addresses") > sum(&seen1, "awscni_total_ip_addresses"),
        "node 0's pool did not grow: {seen1:?} {seen2:?}"
    );

    // read back from CloudWatch (moto): one datum per round
    let reader = rt.block_on(moto.cloudwatch_reader(cni_metrics_helper::cloudwatch::http_client()));
    let minmax = |name: &str| {
        rt.block_on(async {
            let lo = read_back(&reader, name, "Minimum").await;
            let hi = read_back(&reader, name, "Maximum").await;
            (
                lo.map(|v| v.into_iter().fold(f64::MAX, f64::min)),
                hi.map(|v| v.into_iter().fold(f64::MIN, f64::max)),
            )
        })
    };
    for (family, cw_name) in [
        ("awscni_total_ip_addresses", "totalIPAddresses"),
        ("awscni_assigned_ip_addresses", "assignIPAddresses"),
        ("awscni_eni_allocated", "eniAllocated"),
        ("awscni_eni_max", "eniMaxAvailable"),
    ] {
        let (a, b) = (sum(&seen1, family), sum(&seen2, family));
        assert_eq!(
            minmax(cw_name),
            (Some(a.min(b)), Some(a.max(b))),
            "{cw_name}: nodes said {a} then {b}"
        );
    }
    // counters: the first round publishes what the nodes had counted, the second the deltas
    let adds = rt
        .block_on(read_back(&reader, "addReqCount", "Sum"))
        .map(|v| v.into_iter().sum::<f64>());
    assert_eq!(adds, Some(sum(&seen2, "awscni_add_ip_req_count")));
    assert_eq!(
        sum(&seen2, "awscni_add_ip_req_count") - sum(&seen1, "awscni_add_ip_req_count"),
        9.0
    );
    // the helper needed nothing beyond the chart's RBAC
    let audit = kube.audit();
    assert!(audit.iter().all(|e| e.code != 403), "{audit:?}");
    drop(kube);
    drop(sim);
    rt.shutdown_timeout(Duration::from_secs(5));
}
