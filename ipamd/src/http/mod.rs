//! HTTP side of ipamd: read-only introspection (`/`, `/v1/*`, the JSON shapes existing tools parse,
//! container ids and interface names blanked, encoded from `Ipam`'s snapshots) and the Prometheus
//! endpoint (serves `crate::metrics`' exposition, then the `process_*` families). Must not: change
//! the datastore, call the provider, record metrics.

pub mod process;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Json};
use axum::routing::get;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::{BindAddress, Config};
use crate::ipam::{EniSnapshot, Ipam};

/// The introspection endpoints.
pub const INTROSPECTION_PATHS: &[&str] = &[
    "/v1/enis",
    "/v1/eni-configs",
    "/v1/networkutils-env-settings",
    "/v1/ipamd-env-settings",
];

/// Configuration views served by introspection (computed once from [`Config`]).
#[derive(Debug, Clone)]
pub struct DebugSettings {
    /// `/v1/networkutils-env-settings`.
    pub networkutils: Value,
    /// `/v1/ipamd-env-settings`.
    pub ipamd: Value,
    /// `/v1/eni-configs`: the node's ENIConfig name (`default` when the node names none) once the
    /// Node was read; None (no Kubernetes API, or the Node not read yet) answers 404.
    pub eni_config: tokio::sync::watch::Receiver<Option<String>>,
    /// `/v1/branch-pods` (ours): security groups for pods' trunk and branch pods; None
    /// (`ENABLE_POD_ENI` off) answers 404.
    pub branch_pods: Option<crate::sgp::BranchPods>,
    /// `/v1/address-capacity` (ours): the address-capacity task's last pass.
    pub capacity: crate::capacity::Board,
}

impl DebugSettings {
    /// The key names and value types existing tools parse.
    #[must_use]
    pub fn from_config(c: &Config) -> Self {
        // An empty list is JSON `null`, not `[]`.
        let cidrs = |v: &[ipnet::Ipv4Net]| {
            if v.is_empty() {
                Value::Null
            } else {
                json!(v.iter().map(ToString::to_string).collect::<Vec<_>>())
            }
        };
        Self {
            networkutils: json!({
                "AWS_VPC_K8S_CNI_CONNMARK": c.snat.connmark,
                "AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS": cidrs(&c.snat.exclude_snat_cidrs),
                "AWS_VPC_K8S_CNI_EXTERNALSNAT": c.snat.external_snat,
                "AWS_EXTERNAL_SERVICE_CIDRS": cidrs(&c.snat.external_service_cidrs),
                "AWS_VPC_ENI_MTU": c.node.eni_mtu,
                "AWS_VPC_K8S_CNI_VETHPREFIX": c.node.veth_prefix,
                "AWS_VPC_CNI_NODE_PORT_SUPPORT": c.snat.node_port_support,
                "AWS_VPC_K8S_CNI_RANDOMIZESNAT": c.snat.randomize_snat as i32,
            }),
            ipamd: json!({
                "WARM_IP_TARGET": c.pool.warm_ip_target,
                "WARM_ENI_TARGET": c.pool.warm_eni_target,
                "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG": c.kube.custom_network_cfg,
                "AWS_MANAGE_ENIS_NON_SCHEDULABLE": c.kube.manage_enis_non_schedulable,
                "ENABLE_SUBNET_DISCOVERY": c.aws.enable_subnet_discovery,
            }),
            eni_config: tokio::sync::watch::channel(None).1,
            branch_pods: None,
            capacity: crate::capacity::Board::default(),
        }
    }
}

fn go_time(t: Option<SystemTime>) -> String {
    const ZERO: &str = "0001-01-01T00:00:00Z";
    let Some(t) = t else { return ZERO.into() };
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| ZERO.into())
}

fn mask_base64(prefix_len: u8) -> String {
    // Go marshals net.IPMask ([]byte) as base64.
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix_len))
        .unwrap_or(0)
        .to_be_bytes();
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let n = u32::from_be_bytes([0, mask[0], mask[1], mask[2]]);
    let mut s = String::new();
    for i in 0..4 {
        s.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
    }
    let tail = u32::from(mask[3]) << 16;
    s.push(char::from(ALPHABET[((tail >> 18) & 63) as usize]));
    s.push(char::from(ALPHABET[((tail >> 12) & 63) as usize]));
    s.push_str("==");
    s
}

/// A 16-byte Go `net.IPMask` as Go marshals it (standard base64).
fn mask_base64_v6(prefix_len: u8) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mask = u128::MAX
        .checked_shl(128 - u32::from(prefix_len))
        .unwrap_or(0)
        .to_be_bytes();
    let mut s = String::new();
    for chunk in mask.chunks(3) {
        let b = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let n = (b(0) << 16) | (b(1) << 8) | b(2);
        for i in 0..4 {
            if i <= chunk.len() {
                s.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// `/v1/enis`: network card index → `ENIInfos{TotalIPs, AssignedIPs, ENIs}`.
#[must_use]
pub fn enis_view(snapshot: &EniSnapshot) -> Value {
    let stats = &snapshot.stats;
    let mut cards: BTreeMap<String, Value> = BTreeMap::new();
    let mut enis_by_card: BTreeMap<u32, serde_json::Map<String, Value>> = BTreeMap::new();
    for eni in &snapshot.enis {
        let mut cidrs = serde_json::Map::new();
        for c in &eni.cidrs {
            let mut addrs = serde_json::Map::new();
            for a in &c.addresses {
                let meta = a.metadata.as_ref().map_or_else(
                    || json!({}),
                    |m| serde_json::to_value(m).unwrap_or_default(),
                );
                // containerID and ifName blanked: a reader must not be able to forge a DelNetwork.
                addrs.insert(
                    a.ip.to_string(),
                    json!({
                        "Address": a.ip.to_string(),
                        "IPAMKey": {"networkName": a.network_name, "containerID": "", "ifName": ""},
                        "IPAMMetadata": meta,
                        "AssignedTime": go_time(a.assigned_at),
                        "UnassignedTime": go_time(a.unassigned_at),
                    }),
                );
            }
            cidrs.insert(
                c.net.to_string(),
                json!({
                    "Cidr": {"IP": c.net.network().to_string(), "Mask": mask_base64(c.net.prefix_len())},
                    "IPAddresses": addrs,
                    "IsPrefix": c.is_prefix,
                    // Always empty: the one field of a CIDR entry that is never filled in.
                    "AddressFamily": "",
                }),
            );
        }
        let mut v6_cidrs = serde_json::Map::new();
        for p in snapshot
            .ipv6_prefixes
            .iter()
            .filter(|p| p.eni_id == eni.spec.id)
        {
            let mut addrs = serde_json::Map::new();
            for (key, meta, a) in snapshot
                .ipv6
                .iter()
                .filter(|(_, _, a)| p.net.contains(&a.ip))
            {
                addrs.insert(
                    a.ip.to_string(),
                    json!({
                        "Address": a.ip.to_string(),
                        "IPAMKey": {"networkName": key.network_name, "containerID": "", "ifName": ""},
                        "IPAMMetadata": serde_json::to_value(meta).unwrap_or_default(),
                        "AssignedTime": go_time(None),
                        "UnassignedTime": go_time(None),
                    }),
                );
            }
            v6_cidrs.insert(
                p.net.to_string(),
                json!({
                    "Cidr": {"IP": p.net.network().to_string(), "Mask": mask_base64_v6(p.net.prefix_len())},
                    "IPAddresses": addrs,
                    "IsPrefix": true,
                    "AddressFamily": "",
                }),
            );
        }
        enis_by_card
            .entry(eni.spec.network_card)
            .or_default()
            .insert(
                eni.spec.id.clone(),
                json!({
                    "ID": eni.spec.id,
                    "IsPrimary": eni.spec.is_primary,
                    "IsTrunk": eni.spec.is_trunk,
                    "IsEFA": eni.spec.is_efa,
                    "DeviceNumber": eni.spec.device_number,
                    "AvailableIPv4Cidrs": cidrs,
                    "IPv6Cidrs": v6_cidrs,
                    "IsExcludedForPodIPs": eni.spec.is_excluded,
                    "RouteTableID": eni.route_table,
                    "SubnetID": eni.spec.subnet_id,
                }),
            );
    }
    if enis_by_card.is_empty() {
        enis_by_card.insert(0, serde_json::Map::new());
    }
    for (card, enis) in enis_by_card {
        cards.insert(
            card.to_string(),
            json!({"TotalIPs": stats.total, "AssignedIPs": stats.assigned, "ENIs": enis}),
        );
    }
    json!(cards)
}

#[derive(Clone)]
struct AppState {
    ipam: Arc<Ipam>,
    debug: DebugSettings,
    failures: Arc<crate::failures::AddFailures>,
}

/// The introspection router.
///
/// Every path that is not an endpoint answers the list of endpoints (so `curl :61679/` and typos
/// show what there is).
pub fn introspection_router(
    ipam: Arc<Ipam>,
    debug: DebugSettings,
    failures: Arc<crate::failures::AddFailures>,
) -> Router {
    let commands = || async { Json(json!({"AvailableCommands": INTROSPECTION_PATHS})) };
    Router::new()
        .route("/", get(commands))
        .fallback(commands)
        .route(
            "/v1/enis",
            get(|State(s): State<AppState>| async move {
                Json(enis_view(&s.ipam.index.eni_snapshot()))
            }),
        )
        .route(
            "/v1/eni-configs",
            get(|State(s): State<AppState>| async move {
                let name = s.debug.eni_config.borrow().clone();
                match name {
                    Some(name) => Json(json!(name)).into_response(),
                    None => (axum::http::StatusCode::NOT_FOUND, "Not Found\n").into_response(),
                }
            }),
        )
        .route(
            "/v1/branch-pods",
            get(|State(s): State<AppState>| async move {
                match &s.debug.branch_pods {
                    None => (axum::http::StatusCode::NOT_FOUND, "ENABLE_POD_ENI is off\n")
                        .into_response(),
                    Some(b) => match b.view().await {
                        Ok(v) => Json(v).into_response(),
                        Err(e) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, e.to_string())
                            .into_response(),
                    },
                }
            }),
        )
        .route(
            "/v1/networkutils-env-settings",
            get(|State(s): State<AppState>| async move { Json(s.debug.networkutils.clone()) }),
        )
        .route(
            "/v1/ipamd-env-settings",
            get(|State(s): State<AppState>| async move { Json(s.debug.ipamd.clone()) }),
        )
        // Ours: the node's address capacity and warm targets, for `ipamd status`.
        .route(
            "/v1/address-capacity",
            get(|State(s): State<AppState>| async move { Json(s.debug.capacity.view(&s.ipam)) }),
        )
        // Ours: failed ADDs by reason, for `ipamd status`.
        .route(
            "/v1/add-failures",
            get(|State(s): State<AppState>| async move { Json(s.failures.view()) }),
        )
        .with_state(AppState {
            ipam,
            debug,
            failures,
        })
}

/// The metrics router (`/metrics`).
pub fn metrics_router(
    m: Arc<crate::metrics::Metrics>,
    naming: crate::config::MetricsNaming,
) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let m = m.clone();
            async move {
                let mut text = m.render(naming);
                process::render(&mut text);
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    text,
                )
                    .into_response()
            }
        }),
    )
}

/// Serves `router` on `bind` until `shutdown`. A bind that fails (address in use, a name that does
/// not resolve yet, a missing directory) is retried with back-off from 1 s to 1 min, instead of
/// ending ipamd.
pub async fn serve(
    router: Router,
    bind: BindAddress,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let mut delay = std::time::Duration::from_secs(1);
    loop {
        let bound = match &bind {
            BindAddress::Tcp(addr) => tokio::net::TcpListener::bind(tcp_bind_target(addr))
                .await
                .map(Listener::Tcp),
            BindAddress::Unix(path) => {
                let _ = std::fs::remove_file(path);
                tokio::net::UnixListener::bind(path).map(Listener::Unix)
            }
        };
        match bound {
            Ok(Listener::Tcp(l)) => {
                return axum::serve(l, router)
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await;
            }
            Ok(Listener::Unix(l)) => {
                return axum::serve(l, router)
                    .with_graceful_shutdown(shutdown.cancelled_owned())
                    .await;
            }
            Err(e) => {
                tracing::warn!(bind = ?bind, error = %e, retry_in = ?delay, "http listener bind failed; retrying");
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(std::time::Duration::from_secs(60));
    }
}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

/// Go's `net.Listen` reads `:port` as every interface; tokio wants a host.
fn tcp_bind_target(addr: &str) -> String {
    match addr.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => addr.to_owned(),
    }
}

/// The introspection and metrics servers as tasks of the daemon (each unless disabled).
pub fn servers(
    config: &crate::config::Config,
    ipam: &Arc<Ipam>,
    metrics: &Arc<crate::metrics::Metrics>,
    debug: DebugSettings,
    failures: Arc<crate::failures::AddFailures>,
    token: &CancellationToken,
) -> Vec<crate::task::Task> {
    use anyhow::Context as _;
    let mut tasks = Vec::new();
    if !config.http.disable_introspection {
        let router = introspection_router(ipam.clone(), debug, failures);
        let bind = config.http.introspection_bind.clone();
        let token = token.clone();
        tasks.push(crate::task::Task::new("introspection server", async move {
            serve(router, bind, token)
                .await
                .context("introspection server")
        }));
    }
    if !config.http.disable_metrics {
        let router = metrics_router(metrics.clone(), config.http.metrics_naming);
        let bind = BindAddress::Tcp(config.http.metrics_bind.to_string());
        let token = token.clone();
        tasks.push(crate::task::Task::new("metrics server", async move {
            serve(router, bind, token).await.context("metrics server")
        }));
    }
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_masks_as_go_marshals_them() {
        // base64 of ff*10 00*6 (a /80) and of 16 x ff (a /128), as encoding/json writes []byte
        assert_eq!(mask_base64_v6(80), "/////////////wAAAAAAAA==");
        assert_eq!(mask_base64_v6(128), "/////////////////////w==");
    }

    #[test]
    fn go_listen_forms() {
        assert_eq!(tcp_bind_target(":61679"), "0.0.0.0:61679");
        assert_eq!(tcp_bind_target("localhost:61679"), "localhost:61679");
    }

    #[tokio::test]
    async fn a_busy_port_is_retried_until_it_frees() {
        let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = busy.local_addr().unwrap();
        let token = CancellationToken::new();
        let server = tokio::spawn(serve(
            Router::new().route("/", axum::routing::get(|| async { "ok" })),
            BindAddress::Tcp(addr.to_string()),
            token.clone(),
        ));
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(
            !server.is_finished(),
            "a failed bind must not end the server task"
        );
        drop(busy);
        // The first retry comes after 1 s.
        let mut served = false;
        for _ in 0..30 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
                s.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                served = out.ends_with("ok");
                break;
            }
        }
        assert!(served, "server never came up after the port was freed");
        token.cancel();
        server.await.unwrap().unwrap();
    }

    #[test]
    fn go_ipmask_base64() {
        assert_eq!(mask_base64(32), "/////w==");
        assert_eq!(mask_base64(28), "////8A==");
    }
}
