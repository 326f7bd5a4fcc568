//! Cross-check with real clients we did not write: Debian's `kubectl` (kubernetes-client 1.20,
//! unpacked by integration/test.sh beside the image's own kubectl) and the Python `kubernetes`
//! client (tests/python_client_check.py), against a simulator loaded with the chart's CRD and
//! the chart's RBAC as rendered by real Helm. Each asserts on the server's state too, not only
//! on the client's output.
#![allow(clippy::tests_outside_test_module)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use kubesim::{Config, Knobs, KubeSim};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::common;
use common::{eniconfig_crd, render_chart, repo_root};

/// Debian's kubectl: `$KUBESIM_KUBECTL`, else where integration/test.sh unpacks
/// kubernetes-client (its /usr/bin/kubectl clashes with the image's Google-built one).
fn kubectl_bin() -> PathBuf {
    let p = std::env::var_os("KUBESIM_KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/lib/kubernetes-client/usr/bin/kubectl"));
    assert!(
        p.exists(),
        "{} missing: run integration/test.sh (installs Debian's kubernetes-client)",
        p.display()
    );
    p
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = tokio::process::Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .await
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }

    async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }

    async fn fails(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(!ok, "kubectl {args:?} should fail:\n{out}");
        err
    }
}

async fn start(knobs: Knobs) -> (KubeSim, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(dir.path());
    cfg.knobs = knobs;
    let sim = KubeSim::start(cfg).await.unwrap();
    sim.apply_file(&eniconfig_crd()).unwrap();
    sim.apply_yaml(&render_chart(&json!({}))).unwrap();
    (sim, dir)
}

fn manifest(subnet: &str, cm_value: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Node
metadata:
  name: n1
  labels: {{topology.kubernetes.io/zone: us-west-2a}}
---
apiVersion: crd.k8s.amazonaws.com/v1alpha1
kind: ENIConfig
metadata:
  name: us-west-2a
spec:
  subnet: {subnet}
  securityGroups: [sg-1]
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: cni-test-config
  namespace: kube-system
data:
  warm-ip-target: "{cm_value}"
"#
    )
}

fn server_get(
    sim: &KubeSim,
    group: &str,
    version: &str,
    plural: &str,
    ns: Option<&str>,
    name: &str,
) -> Option<Value> {
    let c = sim.cluster();
    let rt = c.resource(group, version, plural).ok()?;
    c.get(
        &kubesim::cluster::Target {
            rt: &rt,
            version,
            namespace: ns,
        },
        name,
    )
    .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_cross_check() {
    let (sim, dir) = start(Knobs::default()).await;
    let k = Kubectl {
        bin: kubectl_bin(),
        kubeconfig: sim.admin().kubeconfig.clone(),
    };
    assert!(k.ok(&["version"]).await.contains("v1.30.0-kubesim"));
    let res = k.ok(&["api-resources"]).await;
    assert!(
        res.lines().any(|l| l.starts_with("eniconfigs")
            && l.contains("crd.k8s.amazonaws.com/v1alpha1")
            && l.contains("false")
            && l.contains("ENIConfig")),
        "{res}"
    );
    assert!(
        res.lines()
            .any(|l| l.starts_with("pods ") && l.contains("true")),
        "{res}"
    );

    // apply (client-side: GET, then create / PATCH with last-applied). kubectl's client-side
    // validation needs /openapi/v2, which the simulator does not serve.
    let m = dir.path().join("m.yaml");
    std::fs::write(&m, manifest("subnet-0a", "1")).unwrap();
    let out = k
        .ok(&["apply", "--validate=false", "-f", m.to_str().unwrap()])
        .await;
    assert_eq!(out.matches("created").count(), 3, "{out}");
    std::fs::write(&m, manifest("subnet-0b", "2")).unwrap();
    let out = k
        .ok(&["apply", "--validate=false", "-f", m.to_str().unwrap()])
        .await;
    assert!(
        out.contains("eniconfig.crd.k8s.amazonaws.com/us-west-2a configured")
            && out.contains("configmap/cni-test-config configured")
            && out.contains("node/n1 unchanged"),
        "{out}"
    );
    let eni = server_get(
        &sim,
        "crd.k8s.amazonaws.com",
        "v1alpha1",
        "eniconfigs",
        None,
        "us-west-2a",
    )
    .unwrap();
    assert_eq!(eni["spec"]["subnet"], "subnet-0b");
    assert!(
        eni["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .unwrap()
            .contains("subnet-0b")
    );
    let cm = server_get(
        &sim,
        "",
        "v1",
        "configmaps",
        Some("kube-system"),
        "cni-test-config",
    )
    .unwrap();
    assert_eq!(cm["data"]["warm-ip-target"], "2");
    let out = k
        .ok(&[
            "apply",
            "--server-side",
            "--validate=false",
            "-f",
            m.to_str().unwrap(),
        ])
        .await;
    assert_eq!(out.matches("serverside-applied").count(), 3, "{out}");

    // label / annotate / selectors.
    k.ok(&[
        "label",
        "node",
        "n1",
        "topology.kubernetes.io/zone=us-west-2b",
        "--overwrite",
    ])
    .await;
    k.ok(&[
        "annotate",
        "node",
        "n1",
        "k8s.amazonaws.com/eniConfig=custom",
    ])
    .await;
    let node = server_get(&sim, "", "v1", "nodes", None, "n1").unwrap();
    assert_eq!(
        node["metadata"]["labels"]["topology.kubernetes.io/zone"],
        "us-west-2b"
    );
    assert_eq!(
        node["metadata"]["annotations"]["k8s.amazonaws.com/eniConfig"],
        "custom"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "nodes",
            "-l",
            "topology.kubernetes.io/zone=us-west-2b",
            "-o",
            "name"
        ])
        .await
        .trim(),
        "node/n1"
    );
    assert_eq!(
        k.ok(&[
            "get",
            "nodes",
            "-l",
            "topology.kubernetes.io/zone=us-west-2a",
            "-o",
            "name"
        ])
        .await
        .trim(),
        ""
    );
    sim.add_pod(
        "kube-system",
        "aws-node-a",
        "n1",
        "198.18.0.10",
        json!({"k8s-app": "aws-node"}),
    )
    .unwrap();
    sim.add_pod("default", "web", "n2", "198.18.0.11", json!({}))
        .unwrap();
    let pods = k
        .ok(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=n1",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .await;
    assert_eq!(pods, "aws-node-a");
    let table = k.ok(&["get", "pods", "-n", "kube-system"]).await;
    assert!(
        table.starts_with("NAME") && table.contains("aws-node-a"),
        "{table}"
    );
    let json_out: Value = serde_json::from_str(
        &k.ok(&["get", "eniconfig", "us-west-2a", "-o", "json"])
            .await,
    )
    .unwrap();
    assert_eq!(json_out["spec"]["securityGroups"], json!(["sg-1"]));

    // watch: kubectl's own watch decoder prints the events.
    let mut watcher = tokio::process::Command::new(&k.bin)
        .arg("--kubeconfig")
        .arg(&k.kubeconfig)
        .args([
            "get",
            "eniconfigs",
            "--watch-only",
            "--output-watch-events",
            "-o",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let e2 = dir.path().join("e2.yaml");
    std::fs::write(&e2, "apiVersion: crd.k8s.amazonaws.com/v1alpha1\nkind: ENIConfig\nmetadata: {name: us-west-2c}\nspec: {subnet: subnet-0c}\n").unwrap();
    k.ok(&["create", "--validate=false", "-f", e2.to_str().unwrap()])
        .await;
    k.ok(&[
        "patch",
        "eniconfig",
        "us-west-2c",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"securityGroups":["sg-2"]}}"#,
    ])
    .await;
    k.ok(&["delete", "eniconfig", "us-west-2c"]).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    watcher.start_kill().unwrap();
    let mut out = String::new();
    watcher
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    let events: Vec<(String, String)> = serde_json::Deserializer::from_str(&out)
        .into_iter::<Value>()
        .map(|v| v.unwrap())
        .map(|v| {
            (
                v["type"].as_str().unwrap().to_string(),
                v["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    let c = "us-west-2c".to_string();
    assert_eq!(
        events,
        vec![
            ("ADDED".into(), c.clone()),
            ("MODIFIED".into(), c.clone()),
            ("DELETED".into(), c)
        ],
        "{out}"
    );

    // Server-side validation of the chart's CRD schema, as kubectl reports it.
    std::fs::write(&e2, "apiVersion: crd.k8s.amazonaws.com/v1alpha1\nkind: ENIConfig\nmetadata: {name: bad}\nspec: {securityGroups: [sg-1]}\n").unwrap();
    let err = k
        .fails(&["create", "--validate=false", "-f", e2.to_str().unwrap()])
        .await;
    // kubectl rebuilds this line from the Status details (kind, name, causes).
    assert!(
        err.contains("The ENIConfig \"bad\" is invalid: spec.subnet: Required value"),
        "{err}"
    );
    assert!(
        k.fails(&["get", "eniconfig", "nope"])
            .await
            .contains("NotFound")
    );

    // RBAC: the aws-node ServiceAccount under the chart's ClusterRole.
    let sa = sim.service_account("kube-system", "aws-node").unwrap();
    let node_k = Kubectl {
        bin: k.bin.clone(),
        kubeconfig: sa.kubeconfig.clone(),
    };
    assert_eq!(
        node_k.ok(&["get", "nodes", "-o", "name"]).await.trim(),
        "node/n1"
    );
    assert_eq!(
        node_k.ok(&["get", "eniconfigs", "-o", "name"]).await.trim(),
        "eniconfig.crd.k8s.amazonaws.com/us-west-2a"
    );
    let err = node_k
        .fails(&["create", "configmap", "x", "-n", "kube-system"])
        .await;
    assert!(err.contains("Error from server (Forbidden): configmaps is forbidden: User \"system:serviceaccount:kube-system:aws-node\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"kube-system\""), "{err}");
    let err = node_k.fails(&["label", "node", "n1", "x=y"]).await;
    assert!(
        err.contains("Forbidden") && err.contains("cannot patch resource \"nodes\""),
        "{err}"
    );
    assert!(
        node_k
            .fails(&["delete", "eniconfig", "us-west-2a"])
            .await
            .contains("Forbidden")
    );
    assert_eq!(
        node_k
            .ok(&["auth", "can-i", "watch", "eniconfigs.crd.k8s.amazonaws.com"])
            .await
            .trim(),
        "yes"
    );
    let (allowed, out, _) = node_k.run(&["auth", "can-i", "delete", "nodes"]).await;
    assert!(!allowed && out.trim() == "no", "{out}");
    assert_eq!(
        node_k
            .ok(&["auth", "can-i", "create", "events", "-n", "default"])
            .await
            .trim(),
        "yes"
    );

    // delete -f removes all three.
    let out = k.ok(&["delete", "-f", m.to_str().unwrap()]).await;
    assert_eq!(out.matches("deleted").count(), 3, "{out}");
    assert!(
        server_get(
            &sim,
            "crd.k8s.amazonaws.com",
            "v1alpha1",
            "eniconfigs",
            None,
            "us-west-2a"
        )
        .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_cross_check() {
    let (sim, _dir) = start(Knobs {
        history_capacity: 5,
        ..Knobs::default()
    })
    .await;
    let sa = sim.service_account("kube-system", "aws-node").unwrap();
    let script = repo_root().join("integration/kubesim/tests/python_client_check.py");
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(&sim.admin().kubeconfig)
        .arg(&sa.kubeconfig)
        .output()
        .await
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "python client cross-check failed (integration/test.sh installs PyPI kubernetes)\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // The server saw the objects the script left behind.
    assert!(server_get(&sim, "", "v1", "configmaps", Some("kube-system"), "applied").is_some());
    assert!(server_get(&sim, "", "v1", "nodes", None, "py-node").is_none());
}
