//! The simulator's API semantics through HTTPS (its own CA) and plain HTTP: discovery, CRUD
//! and Status errors, optimistic concurrency, patches, ENIConfig schema validation from the
//! chart's CRD, watch ordering/replay/selectors, 410 Expired, bookmarks, timeouts, pagination,
//! RBAC from the chart rendered by real Helm, the pod proxy, and the fault knobs.
#![allow(clippy::tests_outside_test_module)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use kubesim::{Config, Knobs, KubeSim, Outage};
use serde_json::{Value, json};

use crate::common;
use common::{eniconfig_crd, render_chart};

/// A minimal Kubernetes REST client (HTTP/1.1, optional TLS with the simulator's CA).
#[derive(Clone)]
struct Api {
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsConnector>,
    token: Option<String>,
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Io for T {}

impl Api {
    fn https(sim: &KubeSim, token: Option<&str>) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(
                sim.ca_der().to_vec(),
            ))
            .unwrap();
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        Self {
            addr: sim.addr(),
            tls: Some(tokio_rustls::TlsConnector::from(Arc::new(cfg))),
            token: token.map(str::to_string),
        }
    }

    fn http(sim: &KubeSim, token: Option<&str>) -> Self {
        let addr = sim
            .http_url()
            .unwrap()
            .trim_start_matches("http://")
            .parse()
            .unwrap();
        Self {
            addr,
            tls: None,
            token: token.map(str::to_string),
        }
    }

    fn with_token(&self, t: &str) -> Self {
        Self {
            token: Some(t.to_string()),
            ..self.clone()
        }
    }

    async fn raw(
        &self,
        method: &str,
        path: &str,
        ct: &str,
        body: Vec<u8>,
        accept: Option<&str>,
    ) -> Result<http::Response<Incoming>, String> {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| e.to_string())?;
        let io: Box<dyn Io> = match &self.tls {
            Some(c) => {
                let name = rustls::pki_types::ServerName::IpAddress(self.addr.ip().into());
                Box::new(c.connect(name, tcp).await.map_err(|e| e.to_string())?)
            }
            None => Box::new(tcp),
        };
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string());
        if !ct.is_empty() {
            req = req.header("content-type", ct);
        }
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        send.send_request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .map_err(|e| e.to_string())
    }

    async fn call(&self, method: &str, path: &str, ct: &str, body: Option<&Value>) -> (u16, Value) {
        let b = body
            .map(|b| serde_json::to_vec(b).unwrap())
            .unwrap_or_default();
        let r = self.raw(method, path, ct, b, None).await.unwrap();
        let code = r.status().as_u16();
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        (
            code,
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into())),
        )
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, "", None).await
    }
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.call("POST", path, "application/json", Some(body))
            .await
    }
    async fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        self.call("PUT", path, "application/json", Some(body)).await
    }
    async fn patch(&self, path: &str, ct: &str, body: &Value) -> (u16, Value) {
        self.call("PATCH", path, ct, Some(body)).await
    }
    async fn delete(&self, path: &str) -> (u16, Value) {
        self.call("DELETE", path, "", None).await
    }

    async fn watch(&self, path: &str) -> Watch {
        let r = self.raw("GET", path, "", vec![], None).await.unwrap();
        assert_eq!(r.status(), 200, "watch {path}");
        Watch {
            body: r.into_body(),
            buf: Vec::new(),
        }
    }
}

struct Watch {
    body: Incoming,
    buf: Vec<u8>,
}

impl Watch {
    /// The next event, or None when the stream ends or `within` passes.
    async fn next(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Ok(Some(Ok(f))) => {
                    if let Ok(d) = f.into_data() {
                        self.buf.extend_from_slice(&d);
                    }
                }
                _ => return None,
            }
        }
    }

    /// True when the server closes the stream within `within`.
    async fn ends_within(&mut self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Ok(None) | Ok(Some(Err(_))) => return true,
                Ok(Some(Ok(_))) => continue,
                Err(_) => return false,
            }
        }
    }
}

async fn start(knobs: Knobs) -> (KubeSim, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(dir.path());
    cfg.http_addr = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    cfg.knobs = knobs;
    (KubeSim::start(cfg).await.unwrap(), dir)
}

fn rv(v: &Value) -> u64 {
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn discovery_over_tls_with_the_generated_ca() {
    let (sim, dir) = start(Knobs::default()).await;
    let api = Api::https(&sim, Some(&sim.admin().token));
    let (c, v) = api.get("/api").await;
    assert_eq!((c, v["kind"].as_str()), (200, Some("APIVersions")));
    let (_, v) = api.get("/api/v1").await;
    let names: Vec<&str> = v["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for n in [
        "nodes",
        "pods",
        "pods/status",
        "pods/proxy",
        "events",
        "namespaces",
        "serviceaccounts",
        "serviceaccounts/token",
        "configmaps",
    ] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
    let (_, v) = api.get("/apis/events.k8s.io/v1").await;
    assert_eq!(v["resources"][0]["kind"], "Event");
    assert_eq!(api.get("/apis/crd.k8s.amazonaws.com/v1alpha1").await.0, 404);
    sim.apply_file(&eniconfig_crd()).unwrap();
    let (_, v) = api.get("/apis").await;
    assert!(
        v["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "crd.k8s.amazonaws.com")
    );
    let (c, v) = api.get("/apis/crd.k8s.amazonaws.com/v1alpha1").await;
    assert_eq!(c, 200);
    assert_eq!(
        v["resources"][0],
        json!({"name": "eniconfigs", "singularName": "eniconfig", "namespaced": false, "kind": "ENIConfig",
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]})
    );
    let (c, v) = api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/eniconfigs.crd.k8s.amazonaws.com").await;
    assert_eq!(c, 200);
    assert!(
        v["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Established" && c["status"] == "True")
    );
    // The kubeconfig and CA file exist and name the HTTPS URL.
    let kc = std::fs::read_to_string(&sim.admin().kubeconfig).unwrap();
    assert!(kc.contains(&format!("server: {}", sim.url())));
    assert!(
        std::fs::read_to_string(dir.path().join("ca.crt"))
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----")
    );
    // A client that does not trust the CA fails the handshake.
    let untrusting = {
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        Api {
            tls: Some(tokio_rustls::TlsConnector::from(Arc::new(cfg))),
            ..api.clone()
        }
    };
    assert!(
        untrusting
            .raw("GET", "/api", "", vec![], None)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn crud_status_errors_and_optimistic_concurrency() {
    let (sim, _d) = start(Knobs::default()).await;
    let api = Api::http(&sim, Some(&sim.admin().token));
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "amazon-vpc-cni"}, "data": {"a": "1"}});
    let (c, created) = api
        .post("/api/v1/namespaces/kube-system/configmaps", &cm)
        .await;
    assert_eq!(c, 201, "{created}");
    assert_eq!(created["metadata"]["namespace"], "kube-system");
    assert!(
        created["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| u.len() == 36)
    );
    let (c, st) = api
        .post("/api/v1/namespaces/kube-system/configmaps", &cm)
        .await;
    assert_eq!(
        (c, st["kind"].as_str(), st["reason"].as_str()),
        (409, Some("Status"), Some("AlreadyExists"))
    );
    assert_eq!(
        st["message"],
        "configmaps \"amazon-vpc-cni\" already exists"
    );
    let (c, st) = api
        .get("/api/v1/namespaces/kube-system/configmaps/nope")
        .await;
    assert_eq!(
        (c, st["reason"].as_str(), st["code"].as_u64()),
        (404, Some("NotFound"), Some(404))
    );
    assert_eq!(
        st["details"],
        json!({"name": "nope", "group": "", "kind": "configmaps"})
    );
    assert_eq!(
        api.post("/api/v1/namespaces/missing/configmaps", &cm)
            .await
            .0,
        404
    );

    // Update with the current rv succeeds and bumps it; with a stale rv → 409 Conflict.
    let mut upd = created.clone();
    upd["data"]["a"] = json!("2");
    let (c, updated) = api
        .put(
            "/api/v1/namespaces/kube-system/configmaps/amazon-vpc-cni",
            &upd,
        )
        .await;
    assert_eq!(c, 200);
    assert!(rv(&updated) > rv(&created));
    let (c, st) = api
        .put(
            "/api/v1/namespaces/kube-system/configmaps/amazon-vpc-cni",
            &upd,
        )
        .await;
    assert_eq!((c, st["reason"].as_str()), (409, Some("Conflict")));
    // No-op patch: no new resourceVersion.
    let (c, same) = api
        .patch(
            "/api/v1/namespaces/kube-system/configmaps/amazon-vpc-cni",
            "application/merge-patch+json",
            &json!({"data": {"a": "2"}}),
        )
        .await;
    assert_eq!((c, rv(&same)), (200, rv(&updated)));
    // The three patch formats.
    let p = "/api/v1/namespaces/kube-system/configmaps/amazon-vpc-cni";
    let (_, v) = api
        .patch(
            p,
            "application/strategic-merge-patch+json",
            &json!({"metadata": {"labels": {"x": "1"}}}),
        )
        .await;
    assert_eq!(v["metadata"]["labels"]["x"], "1");
    let (_, v) = api
        .patch(
            p,
            "application/json-patch+json",
            &json!([{"op": "add", "path": "/metadata/annotations", "value": {"y": "2"}}]),
        )
        .await;
    assert_eq!(v["metadata"]["annotations"]["y"], "2");
    let (c, _) = api
        .patch(
            p,
            "application/json-patch+json",
            &json!([{"op": "test", "path": "/data/a", "value": "9"}]),
        )
        .await;
    assert_eq!(c, 422);
    let (c, _) = api.patch(p, "text/plain", &json!({})).await;
    assert_eq!(c, 415);
    let (c, st) = api
        .patch(
            p,
            "application/merge-patch+json",
            &json!({"metadata": {"resourceVersion": "1"}, "data": {"a": "3"}}),
        )
        .await;
    assert_eq!(
        (c, st["reason"].as_str()),
        (409, Some("Conflict")),
        "a resourceVersion in a patch is a precondition"
    );
    // Delete answers a Success Status for configmaps, then 404.
    let (c, st) = api.delete(p).await;
    assert_eq!((c, st["status"].as_str()), (200, Some("Success")));
    assert_eq!(api.delete(p).await.0, 404);
    // Pods: status is reset on create (written by kubelet through /status), delete answers the pod.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}, "status": {"podIP": "198.18.0.9"}});
    let (_, v) = api.post("/api/v1/namespaces/default/pods", &pod).await;
    assert_eq!(
        v["status"],
        json!({"phase": "Pending", "qosClass": "BestEffort"})
    );
    let (c, v) = api
        .patch(
            "/api/v1/namespaces/default/pods/p/status",
            "application/merge-patch+json",
            &json!({"status": {"phase": "Running", "podIP": "198.18.0.9"}}),
        )
        .await;
    assert_eq!(
        (c, v["status"]["podIP"].as_str()),
        (200, Some("198.18.0.9"))
    );
    let (_, v) = api
        .patch(
            "/api/v1/namespaces/default/pods/p",
            "application/merge-patch+json",
            &json!({"status": {"podIP": "1.2.3.4"}}),
        )
        .await;
    assert_eq!(
        v["status"]["podIP"], "198.18.0.9",
        "the main resource ignores status"
    );
    let (c, v) = api.delete("/api/v1/namespaces/default/pods/p").await;
    assert_eq!((c, v["kind"].as_str()), (200, Some("Pod")));
}

#[tokio::test]
async fn eniconfig_schema_from_the_chart_crd_is_enforced() {
    let (sim, _d) = start(Knobs::default()).await;
    sim.apply_file(&eniconfig_crd()).unwrap();
    let api = Api::http(&sim, Some(&sim.admin().token));
    let base = "/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs";
    let (c, st) = api.post(base, &json!({"apiVersion": "crd.k8s.amazonaws.com/v1alpha1", "kind": "ENIConfig", "metadata": {"name": "us-west-2a"}, "spec": {"securityGroups": ["sg-1"]}})).await;
    assert_eq!((c, st["reason"].as_str()), (422, Some("Invalid")));
    assert_eq!(
        st["message"],
        "ENIConfig.crd.k8s.amazonaws.com \"us-west-2a\" is invalid: spec.subnet: Required value"
    );
    assert_eq!(
        st["details"]["causes"][0],
        json!({"reason": "FieldValueRequired", "message": "Required value", "field": "spec.subnet"})
    );
    let (c, st) = api.post(base, &json!({"apiVersion": "crd.k8s.amazonaws.com/v1alpha1", "kind": "ENIConfig", "metadata": {"name": "a"}, "spec": {"subnet": 7}})).await;
    assert_eq!(c, 422);
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("spec.subnet in body must be of type string: \"integer\""),
        "{st}"
    );
    let (c, st) = api.post(base, &json!({"apiVersion": "crd.k8s.amazonaws.com/v1alpha1", "kind": "ENIConfig", "metadata": {"name": "a"}, "spec": {"subnet": "subnet-1", "securityGroups": "sg-1"}})).await;
    assert_eq!(c, 422, "{st}");
    let (c, v) = api.post(base, &json!({"apiVersion": "crd.k8s.amazonaws.com/v1alpha1", "kind": "ENIConfig", "metadata": {"name": "a", "namespace": "ignored"}, "spec": {"subnet": "subnet-1", "securityGroups": ["sg-1"], "unknown": 1}})).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(
        v["spec"],
        json!({"subnet": "subnet-1", "securityGroups": ["sg-1"]}),
        "unknown fields under spec are pruned"
    );
    assert!(v["metadata"].get("namespace").is_none(), "cluster-scoped");
    assert_eq!(v["metadata"]["generation"], 1);
    let (c, _) = api
        .patch(
            &format!("{base}/a"),
            "application/strategic-merge-patch+json",
            &json!({"spec": {"subnet": "s"}}),
        )
        .await;
    assert_eq!(c, 415, "custom resources take no strategic merge patch");
    let (c, v) = api
        .patch(
            &format!("{base}/a"),
            "application/merge-patch+json",
            &json!({"spec": {"subnet": "subnet-2"}}),
        )
        .await;
    assert_eq!((c, v["metadata"]["generation"].as_i64()), (200, Some(2)));
    let (c, _) = api
        .patch(
            &format!("{base}/a"),
            "application/merge-patch+json",
            &json!({"spec": {"subnet": null}}),
        )
        .await;
    assert_eq!(c, 422, "a patch that removes a required field is refused");
    // Namespaced path for a cluster-scoped type → 404.
    assert_eq!(
        api.get("/apis/crd.k8s.amazonaws.com/v1alpha1/namespaces/default/eniconfigs")
            .await
            .0,
        404
    );
    // Deleting the CRD removes its objects and its API.
    api.delete(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/eniconfigs.crd.k8s.amazonaws.com",
    )
    .await;
    assert_eq!(api.get(base).await.0, 404);
}

#[tokio::test]
async fn watch_replays_in_order_and_follows_selectors() {
    let (sim, _d) = start(Knobs::default()).await;
    let api = Api::http(&sim, Some(&sim.admin().token));
    let (_, list) = api.get("/api/v1/nodes").await;
    let start = rv(&list);
    sim.add_node("n1", "198.18.0.10", json!({"zone": "a"}))
        .unwrap();
    sim.add_node("n2", "198.18.0.11", json!({"zone": "b"}))
        .unwrap();
    sim.cluster().apply_object(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a", "k": "v"}}})).unwrap();
    // Replay from the list's rv: every change after it, in order, with increasing rvs.
    let mut w = api
        .watch(&format!("/api/v1/nodes?watch=1&resourceVersion={start}"))
        .await;
    let mut seen = Vec::new();
    while let Some(ev) = w.next(Duration::from_millis(300)).await {
        seen.push((
            ev["type"].as_str().unwrap().to_string(),
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
            rv(&ev["object"]),
        ));
    }
    let kinds: Vec<(&str, &str)> = seen
        .iter()
        .map(|(k, n, _)| (k.as_str(), n.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![("ADDED", "n1"), ("ADDED", "n2"), ("MODIFIED", "n1")]
    );
    assert!(seen.windows(2).all(|p| p[0].2 < p[1].2), "{seen:?}");
    assert!(seen[0].2 > start);

    // A label-selected watch: relabelling out of the selector is DELETED, into it ADDED.
    let mut zw = api
        .watch(&format!(
            "/api/v1/nodes?watch=true&labelSelector=zone%3Da&resourceVersion={}",
            seen[2].2
        ))
        .await;
    api.patch(
        "/api/v1/nodes/n1",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"zone": "b"}}}),
    )
    .await;
    api.patch(
        "/api/v1/nodes/n2",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"zone": "a"}}}),
    )
    .await;
    api.patch(
        "/api/v1/nodes/n2",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"other": "x"}}}),
    )
    .await;
    let got: Vec<(String, String)> = {
        let mut v = Vec::new();
        while let Some(ev) = zw.next(Duration::from_millis(300)).await {
            v.push((
                ev["type"].as_str().unwrap().into(),
                ev["object"]["metadata"]["name"].as_str().unwrap().into(),
            ));
        }
        v
    };
    assert_eq!(
        got,
        vec![
            ("DELETED".into(), "n1".into()),
            ("ADDED".into(), "n2".into()),
            ("MODIFIED".into(), "n2".into())
        ]
    );

    // Without a resourceVersion: the current objects as ADDED, then live changes.
    let mut live = api
        .watch("/api/v1/nodes?watch=true&fieldSelector=metadata.name%3Dn1")
        .await;
    let first = live.next(Duration::from_secs(2)).await.unwrap();
    assert_eq!(
        (
            first["type"].as_str(),
            first["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("n1"))
    );
    api.delete("/api/v1/nodes/n2").await;
    api.delete("/api/v1/nodes/n1").await;
    let ev = live.next(Duration::from_secs(2)).await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("DELETED"), Some("n1")),
        "n2's deletion is filtered out"
    );
    assert_eq!(ev["object"]["kind"], "Node");
}

#[tokio::test]
async fn too_old_resource_version_is_410_expired_and_pages_continue() {
    let (sim, _d) = start(Knobs {
        history_capacity: 5,
        ..Knobs::default()
    })
    .await;
    let api = Api::http(&sim, Some(&sim.admin().token));
    let (_, list) = api.get("/api/v1/namespaces/default/configmaps").await;
    let start = rv(&list);
    for i in 0..10 {
        api.post(
            "/api/v1/namespaces/default/configmaps",
            &json!({"metadata": {"name": format!("c{i:02}")}}),
        )
        .await;
    }
    let mut w = api
        .watch(&format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={start}"
        ))
        .await;
    let ev = w.next(Duration::from_secs(2)).await.unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(
        (
            ev["object"]["code"].as_u64(),
            ev["object"]["reason"].as_str()
        ),
        (Some(410), Some("Expired"))
    );
    assert!(
        ev["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version")
    );
    assert!(w.ends_within(Duration::from_secs(2)).await);

    // Pagination: limit + continue walk the list in key order.
    let (_, p1) = api
        .get("/api/v1/namespaces/default/configmaps?limit=4")
        .await;
    assert_eq!(p1["items"].as_array().unwrap().len(), 4);
    assert_eq!(p1["metadata"]["remainingItemCount"], 6);
    let tok = p1["metadata"]["continue"].as_str().unwrap().to_string();
    let (_, p2) = api
        .get(&format!(
            "/api/v1/namespaces/default/configmaps?limit=100&continue={tok}"
        ))
        .await;
    assert_eq!(p2["items"][0]["metadata"]["name"], "c04");
    assert!(p2["metadata"].get("continue").is_none());

    // Compaction knob: a watch from the current rv (valid a moment ago) now gets 410 too, and
    // so does the old continue token.
    let now = rv(&p1);
    let mut ok = api
        .watch(&format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={now}"
        ))
        .await;
    api.post(
        "/api/v1/namespaces/default/configmaps",
        &json!({"metadata": {"name": "late"}}),
    )
    .await;
    assert_eq!(
        ok.next(Duration::from_secs(2)).await.unwrap()["type"],
        "ADDED"
    );
    sim.compact();
    let mut w = api
        .watch(&format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={now}"
        ))
        .await;
    assert_eq!(
        w.next(Duration::from_secs(2)).await.unwrap()["object"]["code"],
        410
    );
    let (c, st) = api
        .get(&format!(
            "/api/v1/namespaces/default/configmaps?limit=100&continue={tok}"
        ))
        .await;
    assert_eq!((c, st["reason"].as_str()), (410, Some("Expired")));

    // A resourceVersion the server never reached (a client from before a restart): after
    // kube-apiserver's 3 s wait, 504 with cause ResourceVersionTooLarge (list) or that Status
    // as an ERROR event (watch).
    let future = rv(&p1) + 1000;
    let (c, st) = api
        .get(&format!(
            "/api/v1/namespaces/default/configmaps?resourceVersion={future}"
        ))
        .await;
    assert_eq!((c, st["reason"].as_str()), (504, Some("Timeout")));
    assert_eq!(
        st["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    let mut w = api
        .watch(&format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={future}"
        ))
        .await;
    let ev = w.next(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        (ev["type"].as_str(), ev["object"]["code"].as_u64()),
        (Some("ERROR"), Some(504))
    );
}

#[tokio::test]
async fn bookmarks_and_timeouts() {
    let (sim, _d) = start(Knobs {
        bookmark_interval_ms: 100,
        ..Knobs::default()
    })
    .await;
    let api = Api::http(&sim, Some(&sim.admin().token));
    let (_, list) = api.get("/api/v1/pods").await;
    let mut w = api
        .watch(&format!(
            "/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion={}",
            rv(&list)
        ))
        .await;
    sim.add_node("n1", "198.18.0.10", json!({})).unwrap(); // bumps the cluster-wide rv, not a pod event
    let mut bookmark = None;
    for _ in 0..5 {
        let ev = w.next(Duration::from_secs(2)).await.unwrap();
        if ev["type"] == "BOOKMARK" {
            bookmark = Some(ev);
            break;
        }
    }
    let b = bookmark.expect("a BOOKMARK within the interval");
    assert_eq!(b["object"]["kind"], "Pod");
    assert!(
        rv(&b["object"]) > rv(&list),
        "bookmarks carry the current resourceVersion"
    );
    // No bookmarks unless asked; timeoutSeconds ends the stream.
    let started = Instant::now();
    let mut w = api.watch("/api/v1/pods?watch=1&timeoutSeconds=1").await;
    assert!(w.next(Duration::from_millis(400)).await.is_none());
    assert!(w.ends_within(Duration::from_secs(3)).await);
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn selectors_on_lists() {
    let (sim, _d) = start(Knobs::default()).await;
    let api = Api::http(&sim, Some(&sim.admin().token));
    sim.add_pod(
        "kube-system",
        "aws-node-a",
        "n1",
        "198.18.0.10",
        json!({"k8s-app": "aws-node"}),
    )
    .unwrap();
    sim.add_pod(
        "kube-system",
        "aws-node-b",
        "n2",
        "198.18.0.11",
        json!({"k8s-app": "aws-node"}),
    )
    .unwrap();
    sim.add_pod("default", "web", "n1", "198.18.0.12", json!({"app": "web"}))
        .unwrap();
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, v) = api
        .get("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1")
        .await;
    assert_eq!(names(&v), vec!["web", "aws-node-a"]);
    let (_, v) = api.get("/api/v1/namespaces/kube-system/pods?labelSelector=k8s-app%3Daws-node&fieldSelector=spec.nodeName%3Dn2").await;
    assert_eq!(names(&v), vec!["aws-node-b"]);
    assert!(
        v["items"][0].get("kind").is_none(),
        "built-in list items carry no kind, as kube-apiserver's"
    );
    let (_, v) = api
        .get("/api/v1/pods?labelSelector=k8s-app%20in%20(aws-node,x),!app")
        .await;
    assert_eq!(names(&v).len(), 2);
    let (_, v) = api
        .get(
            "/api/v1/pods?fieldSelector=status.phase%3DRunning,metadata.namespace%21%3Dkube-system",
        )
        .await;
    assert_eq!(names(&v), vec!["web"]);
    let (c, st) = api
        .get("/api/v1/configmaps?fieldSelector=spec.nodeName%3Dn1")
        .await;
    assert_eq!(
        (c, st["message"].as_str()),
        (400, Some("field label not supported: spec.nodeName"))
    );
}

#[tokio::test]
async fn rbac_from_the_rendered_chart_is_enforced() {
    let (sim, _d) = start(Knobs::default()).await;
    sim.apply_file(&eniconfig_crd()).unwrap();
    let applied = sim.apply_yaml(&render_chart(&json!({}))).unwrap();
    let kinds: Vec<&str> = applied.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert!(
        kinds.contains(&"ClusterRole")
            && kinds.contains(&"ClusterRoleBinding")
            && kinds.contains(&"DaemonSet"),
        "{kinds:?}"
    );
    let sa = sim.service_account("kube-system", "aws-node").unwrap();
    assert_eq!(sa.user, "system:serviceaccount:kube-system:aws-node");
    let admin = Api::https(&sim, Some(&sim.admin().token));
    let node = Api::https(&sim, Some(&sa.token));
    sim.add_node("n1", "198.18.0.10", json!({})).unwrap();
    // Granted by the chart.
    assert_eq!(node.get("/api/v1/nodes/n1").await.0, 200);
    assert_eq!(
        node.get("/api/v1/pods?fieldSelector=spec.nodeName%3Dn1")
            .await
            .0,
        200
    );
    assert_eq!(
        node.get("/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs")
            .await
            .0,
        200
    );
    let mut w = node
        .watch("/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs?watch=1")
        .await;
    admin.post("/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs", &json!({"apiVersion": "crd.k8s.amazonaws.com/v1alpha1", "kind": "ENIConfig", "metadata": {"name": "us-west-2a"}, "spec": {"subnet": "subnet-1"}})).await;
    assert_eq!(
        w.next(Duration::from_secs(2)).await.unwrap()["type"],
        "ADDED"
    );
    let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "n1.1", "namespace": "default"},
        "eventTime": "2024-01-01T00:00:00.000000Z", "reportingController": "aws-node", "reportingInstance": "n1", "action": "ENIConfig",
        "reason": "MissingENIConfig", "type": "Warning", "note": "ENIConfig us-west-2b not found", "regarding": {"kind": "Node", "name": "n1"}});
    let (c, v) = node
        .post("/apis/events.k8s.io/v1/namespaces/default/events", &ev)
        .await;
    assert_eq!(c, 201, "{v}");
    // The same event through core v1 (one storage, converted fields).
    let (_, core) = admin.get("/api/v1/namespaces/default/events/n1.1").await;
    assert_eq!(
        (
            core["message"].as_str(),
            core["involvedObject"]["name"].as_str(),
            core["reportingComponent"].as_str()
        ),
        (
            Some("ENIConfig us-west-2b not found"),
            Some("n1"),
            Some("aws-node")
        )
    );
    // Not granted: 403 with kube-apiserver's wording.
    let (c, st) = node
        .post(
            "/api/v1/namespaces/default/pods",
            &json!({"metadata": {"name": "x"}}),
        )
        .await;
    assert_eq!((c, st["reason"].as_str()), (403, Some("Forbidden")));
    assert_eq!(
        st["message"],
        "pods is forbidden: User \"system:serviceaccount:kube-system:aws-node\" cannot create resource \"pods\" in API group \"\" in the namespace \"default\""
    );
    let (c, st) = node.delete("/api/v1/nodes/n1").await;
    assert_eq!(c, 403);
    assert_eq!(
        st["message"],
        "nodes \"n1\" is forbidden: User \"system:serviceaccount:kube-system:aws-node\" cannot delete resource \"nodes\" in API group \"\" at the cluster scope"
    );
    assert_eq!(
        node.patch(
            "/api/v1/nodes/n1",
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"a": "b"}}})
        )
        .await
        .0,
        403
    );
    assert_eq!(
        node.patch(
            "/api/v1/namespaces/default/pods/x",
            "application/merge-patch+json",
            &json!({})
        )
        .await
        .0,
        403,
        "pods patch only with ANNOTATE_POD_IP"
    );
    assert_eq!(
        node.get("/api/v1/namespaces/kube-system/configmaps")
            .await
            .0,
        403
    );
    assert_eq!(
        node.post(
            "/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs",
            &json!({})
        )
        .await
        .0,
        403
    );
    assert_eq!(
        node.get("/api/v1/namespaces/kube-system/pods/x:61678/proxy/metrics")
            .await
            .0,
        403
    );
    assert_eq!(
        node.get("/api/v1/namespaces/default/events").await.0,
        200,
        "events: list granted"
    );
    assert_eq!(
        node.get("/api/v1/namespaces/default/events/n1.1").await.0,
        403,
        "events: get not granted"
    );
    // ANNOTATE_POD_IP=true renders pods patch into the role.
    sim.apply_yaml(&render_chart(&json!({"env": {"ANNOTATE_POD_IP": "true"}})))
        .unwrap();
    sim.add_pod("default", "x", "n1", "198.18.0.20", json!({}))
        .unwrap();
    let (c, v) = node
        .patch(
            "/api/v1/namespaces/default/pods/x",
            "application/strategic-merge-patch+json",
            &json!({"metadata": {"annotations": {"vpc.amazonaws.com/pod-ips": "198.18.0.20"}}}),
        )
        .await;
    assert_eq!(c, 200, "{v}");
    // Authentication: a bad token is 401; no token is system:anonymous (403).
    let (c, st) = node.with_token("bogus").get("/api/v1/nodes").await;
    assert_eq!((c, st["reason"].as_str()), (401, Some("Unauthorized")));
    let anon = Api {
        token: None,
        ..node.clone()
    };
    let (c, st) = anon.get("/api/v1/nodes").await;
    assert_eq!(c, 403);
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("User \"system:anonymous\"")
    );
    assert_eq!(anon.get("/api").await.0, 403);
    assert_eq!(anon.get("/version").await.0, 200);
    assert_eq!(
        node.get("/apis").await.0,
        200,
        "discovery for every authenticated user"
    );
    // The audit log records who asked what and the answer (a test can compare the verbs a
    // component used with its ClusterRole, or check it watches instead of polling).
    let audit = sim.audit();
    let mine = |verb: &str, resource: &str, code: u16| {
        audit.iter().any(|e| {
            e.user == sa.user && e.verb == verb && e.resource == resource && e.code == code
        })
    };
    assert!(mine("watch", "eniconfigs", 200));
    assert!(mine("create", "pods", 403));
    assert!(audit.iter().any(|e| e.user == sa.user
        && e.resource == "pods"
        && e.subresource.as_deref() == Some("proxy")
        && e.code == 403));
    assert!(audit.iter().any(|e| e.user == "kubesim-admin"
        && e.verb == "create"
        && e.resource == "eniconfigs"
        && e.code == 201));
    // The control API is admin-only.
    assert_eq!(node.post("/_kubesim/compact", &json!({})).await.0, 403);
}

#[tokio::test]
async fn pod_proxy_forwards_with_rbac() {
    let (sim, _d) = start(Knobs::default()).await;
    // A pod's metrics server on a loopback ephemeral port.
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let maddr = metrics.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|uri: http::Uri, headers: http::HeaderMap| async move {
            let auth = headers.contains_key("authorization");
            format!(
                "awscni_total_ip_addresses 7\n# query={} auth={auth}\n",
                uri.query().unwrap_or("")
            )
        }),
    );
    tokio::spawn(async move { axum::serve(metrics, app).await.unwrap() });
    sim.add_pod(
        "kube-system",
        "aws-node-a",
        "n1",
        "198.18.0.10",
        json!({"k8s-app": "aws-node"}),
    )
    .unwrap();
    sim.route_pod_port("kube-system", "aws-node-a", 61678, maddr);
    // cni-metrics-helper's chart grants pods and pods/proxy get/list/watch.
    sim.apply_yaml(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cni-metrics-helper}
rules:
  - apiGroups: [""]
    resources: ["pods", "pods/proxy"]
    verbs: ["get", "watch", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cni-metrics-helper}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cni-metrics-helper}
subjects: [{kind: ServiceAccount, name: cni-metrics-helper, namespace: kube-system}]
"#,
    )
    .unwrap();
    let helper = sim
        .service_account("kube-system", "cni-metrics-helper")
        .unwrap();
    let api = Api::https(&sim, Some(&helper.token));
    let (c, body) = api
        .get("/api/v1/namespaces/kube-system/pods/aws-node-a:61678/proxy/metrics?x=1")
        .await;
    assert_eq!(c, 200);
    let text = body.as_str().unwrap();
    assert!(text.starts_with("awscni_total_ip_addresses 7"), "{text}");
    assert!(
        text.contains("query=x=1 auth=false"),
        "query forwarded, credentials not: {text}"
    );
    // Unknown pod: 404; a pod port nothing listens on: 503.
    assert_eq!(
        api.get("/api/v1/namespaces/kube-system/pods/nope:61678/proxy/metrics")
            .await
            .0,
        404
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    sim.route_pod_port("kube-system", "aws-node-a", 1, closed);
    let (c, st) = api
        .get("/api/v1/namespaces/kube-system/pods/aws-node-a:1/proxy/metrics")
        .await;
    assert_eq!(
        (c, st["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    // Without pods/proxy: 403 (pods get alone is not enough).
    sim.apply_yaml("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: cni-metrics-helper}\nrules: [{apiGroups: [\"\"], resources: [pods], verbs: [get, list, watch]}]\n").unwrap();
    let (c, st) = api
        .get("/api/v1/namespaces/kube-system/pods/aws-node-a:61678/proxy/metrics")
        .await;
    assert_eq!(c, 403);
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("cannot get resource \"pods/proxy\""),
        "{st}"
    );
}

#[tokio::test]
async fn knobs_latency_outages_and_dropped_watches() {
    let (sim, _d) = start(Knobs::default()).await;
    let api = Api::https(&sim, Some(&sim.admin().token));
    // Dropped watches: the stream ends; a new watch works.
    let mut w = api.watch("/api/v1/nodes?watch=1").await;
    sim.drop_watches();
    assert!(w.ends_within(Duration::from_secs(2)).await);
    let mut w = api.watch("/api/v1/nodes?watch=1").await;
    sim.add_node("n1", "198.18.0.10", json!({})).unwrap();
    assert_eq!(
        w.next(Duration::from_secs(2)).await.unwrap()["type"],
        "ADDED"
    );
    // 503 outage, then back.
    sim.outage(Duration::from_millis(500), Outage::Unavailable503);
    assert!(
        w.ends_within(Duration::from_secs(2)).await,
        "an outage also ends watches"
    );
    let (c, st) = api.get("/api/v1/nodes").await;
    assert_eq!(
        (c, st["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(api.get("/api/v1/nodes").await.0, 200);
    // Connection refused, then back on the same port.
    sim.outage(Duration::from_millis(700), Outage::Refuse);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = api
        .raw("GET", "/api/v1/nodes", "", vec![], None)
        .await
        .unwrap_err();
    assert!(err.contains("refused"), "{err}");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(api.get("/api/v1/nodes").await.0, 200);
    // Latency: every answer waits at least the knob.
    sim.set_knobs(Knobs {
        latency_ms: 300,
        ..Knobs::default()
    });
    let t = Instant::now();
    assert_eq!(api.get("/api/v1/nodes").await.0, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));
    // The same knobs through the control API.
    let (c, k) = api
        .call(
            "PUT",
            "/_kubesim/knobs",
            "application/json",
            Some(&json!({"latency_ms": 0, "history_capacity": 2})),
        )
        .await;
    assert_eq!(
        (c, k["history_capacity"].as_u64(), k["latency_ms"].as_u64()),
        (200, Some(2), Some(0))
    );
    let (c, _) = api
        .post(
            "/_kubesim/outage",
            &json!({"seconds": 0.3, "mode": "unavailable503"}),
        )
        .await;
    assert_eq!(c, 200);
    assert_eq!(api.get("/api/v1/nodes").await.0, 503);
}

#[tokio::test]
async fn service_account_files_and_token_request() {
    let (sim, _d) = start(Knobs::default()).await;
    let sa = sim.service_account("kube-system", "aws-node").unwrap();
    let dir = sim.service_account_dir("kube-system", "aws-node");
    assert_eq!(
        std::fs::read_to_string(dir.join("token")).unwrap(),
        sa.token
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("namespace")).unwrap(),
        "kube-system"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("ca.crt")).unwrap(),
        sim.ca_pem()
    );
    let kc = std::fs::read_to_string(&sa.kubeconfig).unwrap();
    assert!(kc.contains(&format!("token: {}", sa.token)) && kc.contains("namespace: kube-system"));
    let env = sim.in_cluster_env();
    assert_eq!(
        env[0],
        (
            "KUBERNETES_SERVICE_HOST".to_string(),
            "127.0.0.1".to_string()
        )
    );
    assert_eq!(env[1].1, sim.addr().port().to_string());
    // TokenRequest (kubectl create token) as admin → a token that authenticates as the SA.
    let admin = Api::http(&sim, Some(&sim.admin().token));
    let (c, tr) = admin
        .post(
            "/api/v1/namespaces/kube-system/serviceaccounts/aws-node/token",
            &json!({"spec": {"audiences": ["x"]}}),
        )
        .await;
    assert_eq!(c, 201, "{tr}");
    let tok = tr["status"]["token"].as_str().unwrap();
    let (c, st) = admin.with_token(tok).get("/api/v1/nodes").await;
    assert_eq!(c, 403);
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("system:serviceaccount:kube-system:aws-node")
    );
    assert_eq!(
        admin
            .post(
                "/api/v1/namespaces/kube-system/serviceaccounts/missing/token",
                &json!({})
            )
            .await
            .0,
        404
    );
}
