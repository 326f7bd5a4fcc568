//! The pod proxy subresource (`/api/v1/namespaces/{ns}/pods/{name}[:{port}]/proxy/{path}`):
//! where a request goes (the pod's `status.podIP`, or an address a test routed for that pod
//! and port) and forwarding it over HTTP/1.1, as kube-apiserver does for cni-metrics-helper's
//! scrapes. Errors as kube-apiserver words them (503 when the pod cannot be reached).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use serde_json::Value;

use crate::cluster::Cluster;
use crate::error::ApiError;

/// `name`, `name:port`, `scheme:name:port` → (name, port).
pub fn split_name_port(segment: &str) -> (Option<String>, Option<String>) {
    let parts: Vec<&str> = segment.split(':').collect();
    match parts.as_slice() {
        [n] => (Some((*n).to_string()), None),
        [n, p] => (
            Some((*n).to_string()),
            Some((*p).to_string()).filter(|p| !p.is_empty()),
        ),
        [_scheme, n, p] => (
            Some((*n).to_string()),
            Some((*p).to_string()).filter(|p| !p.is_empty()),
        ),
        _ => (Some(segment.to_string()), None),
    }
}

/// Where to connect: the routed address for (pod, port), else podIP:port. Without a port the
/// first declared container port is used, as kube-apiserver does (else 80).
pub fn resolve(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    pod: &Value,
    port: Option<String>,
) -> Result<SocketAddr, ApiError> {
    let port: u16 = match port {
        Some(p) => match p.parse() {
            Ok(n) => n,
            Err(_) => {
                // A named port: look it up in the containers.
                named_port(pod, &p)
                    .ok_or_else(|| ApiError::bad_request(format!("pod has no port named {p:?}")))?
            }
        },
        None => first_container_port(pod).unwrap_or(80),
    };
    if let Some(a) = cluster
        .lock()
        .pod_routes
        .get(&(ns.to_string(), name.to_string(), port))
    {
        return Ok(*a);
    }
    let ip: IpAddr = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            ApiError::bad_request(format!("address not allowed: pod {ns}/{name} has no IP"))
        })?;
    // kube-apiserver refuses to proxy to loopback, link-local and unspecified addresses.
    let refused = match ip {
        IpAddr::V4(a) => {
            a.is_loopback() || a.is_link_local() || a.is_unspecified() || a.is_multicast()
        }
        IpAddr::V6(a) => {
            a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (a.segments()[0] & 0xffc0) == 0xfe80
        }
    };
    if refused {
        return Err(ApiError::bad_request("address not allowed"));
    }
    Ok(SocketAddr::new(ip, port))
}

fn ports(pod: &Value) -> impl Iterator<Item = &Value> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|c| {
            c.get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
}

fn first_container_port(pod: &Value) -> Option<u16> {
    ports(pod)
        .find_map(|p| p.get("containerPort").and_then(Value::as_u64))
        .and_then(|p| u16::try_from(p).ok())
}

fn named_port(pod: &Value, name: &str) -> Option<u16> {
    ports(pod)
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
        .and_then(|p| p.get("containerPort").and_then(Value::as_u64))
        .and_then(|p| u16::try_from(p).ok())
}

/// Forwards the request (method, path, query, body; no Authorization) and streams the answer.
pub async fn forward(to: SocketAddr, rest: &str, req: Request) -> Result<Response, ApiError> {
    let unreachable = |e: &dyn std::fmt::Display| {
        ApiError::unavailable(format!("error trying to reach service: {e}"))
    };
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let uri = format!("/{rest}{query}");
    let (parts, body) = req.into_parts();
    let stream = tokio::time::timeout(Duration::from_secs(10), tokio::net::TcpStream::connect(to))
        .await
        .map_err(|_| unreachable(&format!("dial tcp {to}: i/o timeout")))?
        .map_err(|e| unreachable(&format!("dial tcp {to}: {e}")))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(&e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut out = http::Request::builder().method(parts.method).uri(uri);
    for (k, v) in &parts.headers {
        if matches!(
            k.as_str(),
            "authorization"
                | "host"
                | "connection"
                | "keep-alive"
                | "proxy-connection"
                | "transfer-encoding"
                | "upgrade"
                | "te"
                | "trailer"
        ) {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(http::header::HOST, to.to_string());
    let out = out
        .body(body)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let resp = tokio::time::timeout(Duration::from_secs(60), sender.send_request(out))
        .await
        .map_err(|_| unreachable(&"timeout awaiting response headers"))?
        .map_err(|e| unreachable(&e))?;
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(parts, Body::new(body)))
}
