//! ipamd's Kubernetes layer (`ipamd::k8s::Cluster`) against the in-process API server
//! simulator (kubesim) with the chart's RBAC rendered by real Helm: the Node and ENIConfig
//! watches (updates, relabel, delete/recreate, relist after compaction), events, pod
//! annotations, the API-server wait at start in both modes, and that the ClusterRole grants
//! exactly what ipamd uses (a removed verb fails).
#![allow(clippy::tests_outside_test_module)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ipamd::config::{KubeSettings, KubeSource};
use ipamd::k8s::cluster::{ApiDependence, ENIConfig, ENIConfigCrdSpec};
use ipamd::k8s::{Cluster, EniConfigs, NodeFacts, PodEvent};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const NODE: &str = "node-1";
const POD: &str = "aws-node-abcde";
const NS: &str = "kube-system";

/// ipamd's cluster client for `e`'s node, its tasks (watches, event poster) running until
/// `stop`.
async fn started(e: &Env, watch_eni_configs: bool, stop: &CancellationToken) -> Cluster {
    let (cluster, tasks) = Cluster::connect(e.settings.clone(), watch_eni_configs, stop)
        .await
        .unwrap();
    tokio::spawn(tasks.run());
    cluster
}

/// [`started`], and past the API-server wait.
async fn connected(e: &Env, watch_eni_configs: bool, stop: &CancellationToken) -> Cluster {
    let cluster = started(e, watch_eni_configs, stop).await;
    assert!(cluster.wait_reachable(ApiDependence::Required, stop).await);
    cluster
}

struct Env {
    _dir: tempfile::TempDir,
    sim: kubesim::KubeSim,
    settings: KubeSettings,
    admin: kube::Client,
}

/// kubesim with the ENIConfig CRD, the chart (its RBAC) rendered with `values` and edited by
/// `edit`, the aws-node service account, this node and the aws-node pod.
async fn env_with(values: Value, edit: impl Fn(String) -> String) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let sim = kubesim::KubeSim::start(kubesim::Config::new(dir.path()))
        .await
        .unwrap();
    sim.apply_file(&kubesim::chart::eniconfig_crd()).unwrap();
    let chart = kubesim::chart::render_chart(&values).unwrap_or_else(|e| panic!("{e}"));
    sim.apply_yaml(&edit(chart)).unwrap();
    let sa = sim.service_account(NS, "aws-node").unwrap();
    sim.add_node(
        NODE,
        "198.18.0.10",
        json!({"topology.kubernetes.io/zone": "us-west-2a"}),
    )
    .unwrap();
    sim.add_pod(NS, POD, NODE, "198.18.0.10", json!({"k8s-app": "aws-node"}))
        .unwrap();
    sim.add_pod("default", "web", NODE, "198.18.0.20", json!({"app": "web"}))
        .unwrap();
    let settings = KubeSettings {
        source: KubeSource::Kubeconfig(sa.kubeconfig.clone()),
        cluster_endpoint: None,
        node_name: NODE.into(),
        pod_name: POD.into(),
        pod_namespace: NS.into(),
        vpc_cni_version: String::new(),
    };
    let kc = kube::config::Kubeconfig::read_from(&sim.admin().kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let admin = kube::Client::try_from(cfg).unwrap();
    Env {
        _dir: dir,
        sim,
        settings,
        admin,
    }
}

async fn env() -> Env {
    env_with(json!({}), |s| s).await
}

async fn eventually<T: Clone>(
    rx: &mut watch::Receiver<T>,
    what: &str,
    f: impl Fn(&T) -> bool,
) -> T {
    tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|v| f(v)))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "timed out waiting for {what}: {:?}",
                std::any::type_name::<T>()
            )
        })
        .unwrap()
        .clone()
}

fn eniconfig(name: &str, subnet: &str, sgs: &[&str]) -> ENIConfig {
    ENIConfig::new(
        name,
        ENIConfigCrdSpec {
            subnet: subnet.into(),
            security_groups: sgs.iter().map(|s| (*s).to_owned()).collect(),
        },
    )
}

fn denied(sim: &kubesim::KubeSim) -> Vec<String> {
    sim.audit()
        .into_iter()
        .filter(|a| a.user == "system:serviceaccount:kube-system:aws-node" && a.code == 403)
        .map(|a| format!("{} {}/{}", a.verb, a.group, a.resource))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_and_eniconfig_watches_follow_the_cluster() {
    // the chart's `eniConfig.create` renders one ENIConfig per zone (upstream's template)
    let e = env_with(
        json!({"eniConfig": {"create": true, "region": "us-west-2",
               "subnets": {"us-west-2b": {"id": "subnet-b", "securityGroups": ["sg-b"]}}}}),
        |s| s,
    )
    .await;
    let stop = CancellationToken::new();
    let cluster = connected(&e, true, &stop).await;

    let mut node = cluster.node();
    let facts: Option<NodeFacts> = eventually(&mut node, "node facts", Option::is_some).await;
    let facts = facts.unwrap();
    assert_eq!(facts.capacity_pods, Some(110));
    assert_eq!(facts.labels["topology.kubernetes.io/zone"], "us-west-2a");

    let cfgs = Api::<ENIConfig>::all(e.admin.clone());
    cfgs.create(
        &PostParams::default(),
        &eniconfig("us-west-2a", "subnet-a", &["sg-1", "sg-2"]),
    )
    .await
    .unwrap();
    let mut configs = cluster.eni_configs();
    let from_chart: Arc<EniConfigs> = eventually(&mut configs, "the chart's eniconfig", |c| {
        c.contains_key("us-west-2b")
    })
    .await;
    assert_eq!(from_chart["us-west-2b"].subnet, "subnet-b");
    assert_eq!(from_chart["us-west-2b"].security_groups, vec!["sg-b"]);
    let got: Arc<EniConfigs> = eventually(&mut configs, "eniconfig us-west-2a", |c| {
        c.contains_key("us-west-2a")
    })
    .await;
    assert_eq!(got["us-west-2a"].subnet, "subnet-a");
    assert_eq!(got["us-west-2a"].security_groups, vec!["sg-1", "sg-2"]);

    // relabel and capacity change
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(e.admin.clone());
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "us-west-2b"},
                                 "annotations": {"k8s.amazonaws.com/eniConfig": "custom"}}}),
            ),
        )
        .await
        .unwrap();
    let f = eventually(&mut node, "relabel", |f| {
        f.as_ref()
            .is_some_and(|f| f.labels["topology.kubernetes.io/zone"] == "us-west-2b")
    })
    .await
    .unwrap();
    assert_eq!(f.annotations["k8s.amazonaws.com/eniConfig"], "custom");

    // delete and recreate
    cfgs.delete("us-west-2a", &DeleteParams::default())
        .await
        .unwrap();
    eventually(&mut configs, "eniconfig deleted", |c| {
        !c.contains_key("us-west-2a")
    })
    .await;
    cfgs.create(
        &PostParams::default(),
        &eniconfig("us-west-2a", "subnet-a3", &[]),
    )
    .await
    .unwrap();
    let got = eventually(&mut configs, "eniconfig recreated", |c| {
        c.get("us-west-2a").is_some_and(|s| s.subnet == "subnet-a3")
    })
    .await;
    assert!(got["us-west-2a"].security_groups.is_empty());

    // history compacted and watches dropped: the watcher relists (410) and sees changes made
    // while it was away, deletions included
    e.sim.compact();
    e.sim.drop_watches();
    cfgs.delete("us-west-2a", &DeleteParams::default())
        .await
        .unwrap();
    cfgs.create(
        &PostParams::default(),
        &eniconfig("us-west-2c", "subnet-c", &["sg-c"]),
    )
    .await
    .unwrap();
    eventually(&mut configs, "relist after compaction", |c| {
        !c.contains_key("us-west-2a") && c.contains_key("us-west-2c")
    })
    .await;
    e.sim.compact();
    e.sim.drop_watches();
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"vpc.amazonaws.com/externalEniConfig": "ext"}}}),
            ),
        )
        .await
        .unwrap();
    let f = eventually(&mut node, "node after compaction", |f| {
        f.as_ref()
            .is_some_and(|f| f.labels.contains_key("vpc.amazonaws.com/externalEniConfig"))
    })
    .await
    .unwrap();
    let keys = ipamd::k8s::EniConfigKeys {
        annotation: "k8s.amazonaws.com/eniConfig".into(),
        label: "topology.kubernetes.io/zone".into(),
    };
    assert_eq!(ipamd::k8s::eni_config_name(&f, &keys), "ext");

    // watches, not polling: every Node/ENIConfig request of aws-node is a list or a watch
    let audit = e.sim.audit();
    let mine: Vec<_> = audit
        .iter()
        .filter(|a| a.user == "system:serviceaccount:kube-system:aws-node")
        .filter(|a| a.resource == "nodes" || a.resource == "eniconfigs")
        .collect();
    assert!(mine.iter().any(|a| a.verb == "watch"), "{mine:?}");
    assert!(
        mine.iter().all(|a| a.verb == "watch" || a.verb == "list"),
        "{mine:?}"
    );
    assert!(denied(&e.sim).is_empty(), "{:?}", denied(&e.sim));
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_pod_annotations_with_the_charts_rbac() {
    let e = env_with(json!({"env": {"ANNOTATE_POD_IP": "true"}}), |s| s).await;
    let stop = CancellationToken::new();
    let cluster = connected(&e, false, &stop).await;
    let ev = PodEvent {
        warning: true,
        reason: ipamd::k8s::REASON_MISSING_IAM.into(),
        action: "ec2:CreateNetworkInterface".into(),
        message: "Unauthorized operation".into(),
    };
    assert!(cluster.post_event(ev.clone()).await.unwrap());
    assert!(
        !cluster.post_event(ev.clone()).await.unwrap(),
        "deduplicated"
    );
    assert!(
        !cluster.queue_event(ev, "test event"),
        "deduplicated when queued too"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(e.admin.clone(), NS);
    let listed = events.list(&Default::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    let got = &listed.items[0];
    assert_eq!(got.reason.as_deref(), Some("MissingIAMPermissions"));
    assert_eq!(got.type_.as_deref(), Some("Warning"));
    assert_eq!(
        got.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some(POD)
    );
    // Queued (node init, the EC2 client's hook, custom networking): the event poster posts it.
    let queued = PodEvent {
        warning: true,
        reason: ipamd::k8s::REASON_RP_FILTER.into(),
        action: "NodeInit".into(),
        message: "reverse-path filtering is strict".into(),
    };
    assert!(cluster.queue_event(queued, "rp_filter event"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let posted = loop {
        let listed = events.list(&Default::default()).await.unwrap();
        if let Some(ev) = listed
            .items
            .into_iter()
            .find(|ev| ev.reason.as_deref() == Some("StrictReversePathFilter"))
        {
            break ev;
        }
        assert!(
            Instant::now() < deadline,
            "the queued event was never posted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(posted.action.as_deref(), Some("NodeInit"));
    assert_eq!(posted.type_.as_deref(), Some("Warning"));
    assert_eq!(cluster.events_dropped(), 0);

    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(e.admin.clone(), "default");
    let annotation = |p: &k8s_openapi::api::core::v1::Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("vpc.amazonaws.com/pod-ips").cloned())
    };
    cluster
        .annotate_pod_ip("default", "web", "198.18.0.20")
        .await
        .unwrap();
    assert_eq!(
        annotation(&pods.get("web").await.unwrap()).as_deref(),
        Some("198.18.0.20")
    );
    // DEL of another address leaves it (upstream's mismatch error)
    assert!(
        cluster
            .clear_pod_ip("default", "web", "198.18.0.99")
            .await
            .is_err()
    );
    cluster
        .clear_pod_ip("default", "web", "198.18.0.20")
        .await
        .unwrap();
    assert_eq!(
        annotation(&pods.get("web").await.unwrap()).as_deref(),
        Some("")
    );
    // a pod already gone is fine on DEL
    cluster
        .clear_pod_ip("default", "gone", "198.18.0.21")
        .await
        .unwrap();
    assert!(denied(&e.sim).is_empty(), "{:?}", denied(&e.sim));
    stop.cancel();
}

/// The chart grants exactly what ipamd uses: without ANNOTATE_POD_IP the chart grants no
/// `patch` on pods, and a ClusterRole without `create` on events refuses the event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verb_missing_from_the_cluster_role_fails() {
    let e = env_with(json!({}), |s| {
        let edited = s.replace(
            "    resources: [\"events\"]\n    verbs: [\"create\", \"patch\", \"list\"]",
            "    resources: [\"events\"]\n    verbs: [\"patch\", \"list\"]",
        );
        assert_ne!(edited, s, "the chart's events rule moved: update this test");
        edited
    })
    .await;
    let stop = CancellationToken::new();
    let cluster = connected(&e, false, &stop).await;
    let ev = PodEvent {
        warning: true,
        reason: "X".into(),
        action: "a".into(),
        message: "m".into(),
    };
    assert!(cluster.post_event(ev).await.is_err());
    assert!(
        cluster
            .annotate_pod_ip("default", "web", "198.18.0.20")
            .await
            .is_err()
    );
    let d = denied(&e.sim);
    assert!(
        d.iter().any(|x| x == "create events.k8s.io/events"),
        "{d:?}"
    );
    assert!(d.iter().any(|x| x == "patch /pods"), "{d:?}");
    stop.cancel();
}

/// upstream cmd/aws-k8s-agent/main.go: with a feature that needs the API, ipamd waits for it
/// (here through a refused-connection outage, where upstream would exit); otherwise it gives up
/// after 30 s and the watches deliver the Node once the API server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_outage_at_start_in_both_modes() {
    let e = env().await;
    let stop = CancellationToken::new();
    e.sim
        .outage(Duration::from_secs(6), kubesim::Outage::Refuse);
    let cluster = started(&e, false, &stop).await;
    let t = Instant::now();
    assert!(cluster.wait_reachable(ApiDependence::Required, &stop).await);
    assert!(t.elapsed() >= Duration::from_secs(4), "{:?}", t.elapsed());

    e.sim
        .outage(Duration::from_secs(40), kubesim::Outage::Unavailable503);
    let cluster = started(&e, false, &stop).await;
    let t = Instant::now();
    assert!(!cluster.wait_reachable(ApiDependence::Optional, &stop).await);
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_secs(25) && waited < Duration::from_secs(40),
        "{waited:?}"
    );
    assert!(cluster.node().borrow().is_none());
    // background: the Node arrives once the outage is over, without a restart
    let mut node = cluster.node();
    tokio::time::timeout(Duration::from_secs(60), node.wait_for(Option::is_some))
        .await
        .expect("node facts after the outage")
        .unwrap();
    stop.cancel();
}

/// Security groups for pods with the chart's RBAC: the pod read (`get`) with its
/// `vpc.amazonaws.com/pod-eni` request and annotation; the `CNINode` features added once, a
/// `CustomNetworking` value replaced, nothing patched when present (upstream
/// `AddFeatureToCNINode`); a missing `CNINode` an error; the annotated pods of this node listed
/// (`/v1/branch-pods`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_eni_reads_and_cninode_features_with_the_charts_rbac() {
    let e = env().await;
    e.sim.apply_yaml(kubesim::CNINODE_CRD).unwrap();
    let stop = CancellationToken::new();
    let cluster = connected(&e, false, &stop).await;
    // No CNINode yet: the controller creates it; ipamd's add is an error.
    assert!(
        cluster
            .add_cninode_feature(ipamd::k8s::FEATURE_SECURITY_GROUPS_FOR_PODS, "")
            .await
            .is_err()
    );
    e.sim
        .cluster()
        .apply_object(
            json!({"apiVersion": "vpcresources.k8s.aws/v1alpha1", "kind": "CNINode",
            "metadata": {"name": NODE}, "spec": {"tags": {"owner": "controller"}}}),
        )
        .unwrap();
    let sgp = ipamd::k8s::FEATURE_SECURITY_GROUPS_FOR_PODS;
    let cn = ipamd::k8s::FEATURE_CUSTOM_NETWORKING;
    assert!(cluster.add_cninode_feature(sgp, "").await.unwrap());
    assert!(!cluster.add_cninode_feature(sgp, "").await.unwrap());
    assert!(cluster.add_cninode_feature(cn, "az-a").await.unwrap());
    assert!(cluster.add_cninode_feature(cn, "az-b").await.unwrap());
    let node = e
        .sim
        .get_object("vpcresources.k8s.aws/v1alpha1", "CNINode", None, NODE)
        .unwrap();
    assert_eq!(
        node["spec"]["features"],
        json!([{"name": sgp}, {"name": cn, "value": "az-b"}])
    );
    assert_eq!(node["spec"]["tags"]["owner"], "controller", "{node}");

    let annotation = r#"[{"eniId":"eni-1","ifAddress":"02:00:00:00:00:01","privateIp":"198.18.0.77","vlanId":2,"subnetCidr":"198.18.0.0/20"}]"#;
    e.sim
        .cluster()
        .apply_object(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "client", "namespace": "default",
                         "annotations": {ipamd::k8s::POD_ENI_ANNOTATION: annotation}},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "x",
                "resources": {"limits": {"vpc.amazonaws.com/pod-eni": "1"}}}]}}))
        .unwrap();
    let pod = cluster.pod("default", "client").await.unwrap().unwrap();
    assert!(pod.requests_pod_eni);
    assert!(!pod.uid.is_empty());
    assert_eq!(pod.annotations[ipamd::k8s::POD_ENI_ANNOTATION], annotation);
    let web = cluster.pod("default", "web").await.unwrap().unwrap();
    assert!(!web.requests_pod_eni);
    assert!(cluster.pod("default", "gone").await.unwrap().is_none());
    let listed = cluster
        .annotated_pods_on_node(ipamd::k8s::POD_ENI_ANNOTATION)
        .await
        .unwrap();
    assert_eq!(
        listed,
        [(
            "default".to_owned(),
            "client".to_owned(),
            annotation.to_owned()
        )]
    );
    assert!(denied(&e.sim).is_empty(), "{:?}", denied(&e.sim));
    stop.cancel();
}
