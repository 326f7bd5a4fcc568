//! The subnet inventory ConfigMap for ipamd (`SUBNET_INVENTORY_CONFIGMAP`, chart
//! `subnetInventory.configMap`), written against kubesim with exactly the chart's RBAC: created
//! when absent, replaced with the resourceVersion read (other keys kept), what ipamd parses back
//! equals what was written; another ConfigMap's name is refused; without the chart's rule the
//! write is refused (loud, nothing written).
#![allow(clippy::tests_outside_test_module)]

use std::time::{Duration, SystemTime};

use cni_metrics_helper::inventory::{Figures, Forecast, SubnetReport};
use cni_metrics_helper::kube_pods::AwsNodePods;
use cni_metrics_helper::round::{inventory_document, publish_inventory_config_map};
use ipam_core::pool::subnet_inventory::{DATA_KEY, InventoryDocument};
use serde_json::json;

const NAME: &str = "cni-subnet-inventory";

fn report(free: u32) -> SubnetReport {
    SubnetReport {
        subnet_id: "subnet-0a".into(),
        cidr: "198.18.0.0/24".parse().unwrap(),
        availability_zone: "az1".into(),
        sources: std::collections::BTreeSet::new(),
        ec2_available: 251,
        figures: Figures {
            free_addresses: free,
            free_prefix_blocks: free / 16,
        },
        addresses: Some(Forecast {
            consumption_per_sec: 0.25,
            exhaustion_secs: Some(f64::from(free) * 4.0),
        }),
        prefix_blocks: None,
    }
}

async fn cluster(values: serde_json::Value) -> (tempfile::TempDir, kubesim::KubeSim, AwsNodePods) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let sim = kubesim::KubeSim::start(kubesim::Config::new(dir.path()))
        .await
        .unwrap();
    let rendered =
        kubesim::chart::render_metrics_helper_chart_with(&values).unwrap_or_else(|e| panic!("{e}"));
    sim.apply_yaml(&rendered).unwrap();
    let sa = sim
        .service_account("kube-system", "cni-metrics-helper")
        .unwrap();
    let kube = AwsNodePods::connect(Some(&sa.kubeconfig)).await.unwrap();
    (dir, sim, kube)
}

fn stored(sim: &kubesim::KubeSim) -> Option<serde_json::Value> {
    sim.get_object("v1", "ConfigMap", Some("kube-system"), NAME)
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helper_writes_the_inventory_for_ipamd_with_the_charts_rbac() {
    let (_dir, sim, kube) = cluster(json!({"subnetInventory": {"configMap": NAME}})).await;
    let t0 = SystemTime::now();
    let first = inventory_document(&[report(120)], t0, Duration::from_secs(300));
    publish_inventory_config_map(&kube, ("kube-system", NAME), &first)
        .await
        .expect("created with the chart's RBAC");
    let cm = stored(&sim).expect("the ConfigMap exists");
    let text = cm["data"][DATA_KEY].as_str().expect("the data key");
    assert_eq!(
        InventoryDocument::parse(text),
        Ok(first.clone()),
        "ipamd reads what was written"
    );
    assert_eq!(
        cm["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "cni-metrics-helper"
    );

    // someone else's key (an operator's note) survives the next round's replace
    let mut edited = cm.clone();
    edited["data"]["note"] = json!("kept");
    edited["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    sim.apply_yaml(&serde_json::to_string(&edited).unwrap())
        .unwrap();
    let second = inventory_document(
        &[report(40)],
        t0 + Duration::from_secs(300),
        Duration::from_secs(300),
    );
    publish_inventory_config_map(&kube, ("kube-system", NAME), &second)
        .await
        .expect("replaced");
    let cm = stored(&sim).unwrap();
    assert_eq!(cm["data"]["note"], "kept");
    let back = InventoryDocument::parse(cm["data"][DATA_KEY].as_str().unwrap()).unwrap();
    assert_eq!(back, second);
    assert_eq!(back.subnets[0].free_addresses, 40);
    assert_eq!(
        back.subnets[0].address_exhaustion_at,
        Some(second.observed_at + Duration::from_secs(160))
    );
    let audit = sim.audit();
    assert!(audit.iter().all(|e| e.code != 403), "{audit:?}");
    assert!(
        audit
            .iter()
            .any(|e| e.verb == "update" && e.name.as_deref() == Some(NAME) && e.code == 200),
        "replaced through update: {audit:?}"
    );

    // the chart's rule names this ConfigMap only: another is not even read
    let other = kube
        .write_config_map("kube-system", "someone-elses", DATA_KEY, "{}")
        .await
        .expect_err("no get/update on another name");
    assert!(other.to_string().contains("forbidden"), "{other}");
    assert!(
        sim.get_object("v1", "ConfigMap", Some("kube-system"), "someone-elses")
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_charts_rule_the_write_is_refused() {
    let (_dir, sim, kube) = cluster(json!({})).await;
    let doc = inventory_document(&[report(10)], SystemTime::now(), Duration::from_secs(300));
    let e = publish_inventory_config_map(&kube, ("kube-system", NAME), &doc)
        .await
        .expect_err("no RBAC for configmaps by default");
    assert!(e.to_string().contains("forbidden"), "{e}");
    assert!(stored(&sim).is_none());
}
