//! IMDSv2 for one instance: `PUT /latest/api/token` (TTL header required and echoed, as
//! `aws_config::imds::Client` expects), `GET /latest/meta-data/...` with the token. Content
//! comes from `World::imds_view` (lag applied) and the partial-prefix knob. Owns token
//! bookkeeping and path rendering; must not mutate the world.

use crate::view::{EniView, FabricView};
use crate::world::World;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Header carrying the requested/granted token lifetime.
pub const TTL_HEADER: &str = "x-aws-ec2-metadata-token-ttl-seconds";
/// Header carrying the token on reads.
pub const TOKEN_HEADER: &str = "x-aws-ec2-metadata-token";
/// Longest token lifetime IMDS grants (6 hours).
pub const MAX_TTL_SECS: u64 = 21_600;

#[derive(Debug)]
struct Imds {
    world: Arc<World>,
    instance_id: String,
    tokens: Mutex<HashMap<String, Instant>>,
}

/// IMDSv2 for `instance_id` (mount at `/`; the fabric serves it on 169.254.169.254:80).
pub fn router(world: Arc<World>, instance_id: impl Into<String>) -> Router {
    let imds = Arc::new(Imds {
        world,
        instance_id: instance_id.into(),
        tokens: Mutex::new(HashMap::new()),
    });
    Router::new()
        .route("/latest/api/token", put(token))
        .route("/latest/meta-data", get(root))
        .route("/latest/meta-data/", get(root))
        .route("/latest/meta-data/{*path}", get(meta))
        .with_state(imds)
}

async fn token(State(imds): State<Arc<Imds>>, headers: HeaderMap) -> Response {
    let ttl = headers
        .get(TTL_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let Some(ttl) = ttl.filter(|t| (1..=MAX_TTL_SECS).contains(t)) else {
        return (StatusCode::BAD_REQUEST, "missing or invalid ttl header").into_response();
    };
    let now = imds.world.now();
    let token = format!("vpcsim-{:032x}", rand::random::<u128>());
    {
        let mut tokens = imds
            .tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tokens.retain(|_, exp| *exp > now);
        tokens.insert(token.clone(), now + Duration::from_secs(ttl));
    }
    let mut resp = token.into_response();
    if let Ok(v) = HeaderValue::from_str(&ttl.to_string()) {
        resp.headers_mut().insert(TTL_HEADER, v);
    }
    resp
}

fn authorized(imds: &Imds, headers: &HeaderMap) -> bool {
    let Some(tok) = headers.get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let now = imds.world.now();
    let tokens = imds
        .tokens
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    tokens.get(tok).is_some_and(|exp| *exp > now)
}

async fn root(State(imds): State<Arc<Imds>>, headers: HeaderMap) -> Response {
    serve(&imds, &headers, "")
}

async fn meta(
    State(imds): State<Arc<Imds>>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    serve(&imds, &headers, &path)
}

fn serve(imds: &Imds, headers: &HeaderMap, path: &str) -> Response {
    if !authorized(imds, headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let now = imds.world.now();
    let view = imds.world.imds_view(&imds.instance_id, now);
    let partial = imds.world.knobs().imds_partial_prefixes;
    match render(&view, &imds.instance_id, path, partial) {
        Some(body) => body.into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

fn lines<T: ToString>(items: impl IntoIterator<Item = T>) -> Option<String> {
    let v: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    (!v.is_empty()).then(|| v.join("\n"))
}

/// The body IMDS answers for `path` (below `/latest/meta-data/`), `None` = 404.
/// `partial_prefixes` caps the `ipv4-prefix` list (upstream #3824).
pub fn render(
    view: &FabricView,
    instance_id: &str,
    path: &str,
    partial_prefixes: Option<usize>,
) -> Option<String> {
    let inst = view.instance(instance_id).filter(|i| i.running)?;
    let path = path.trim_end_matches('/');
    let primary = inst.primary();
    match path {
        "" => {
            let mut keys = vec![
                "instance-id",
                "instance-type",
                "local-hostname",
                "local-ipv4",
                "mac",
                "network/",
                "placement/",
                "security-groups",
            ];
            if inst.primary_ipv6().is_some() {
                keys.push("ipv6");
            }
            keys.sort_unstable();
            Some(keys.join("\n"))
        }
        "instance-id" => Some(inst.instance_id.clone()),
        "instance-type" => Some(inst.instance_type.clone()),
        "local-ipv4" => primary.map(|e| e.primary_ip.to_string()),
        // the primary ENI's first IPv6 (upstream's `GetLocalIPv6`); 404 without one
        "ipv6" => inst.primary_ipv6().map(|ip| ip.to_string()),
        "local-hostname" | "hostname" => primary.map(|e| hostname(e, &view.region)),
        "mac" => primary.map(|e| e.mac.clone()),
        "placement" => Some("availability-zone\nregion".into()),
        "placement/availability-zone" => Some(inst.availability_zone.clone()),
        "placement/region" => Some(view.region.clone()),
        "security-groups" => primary.and_then(|e| lines(&e.security_groups)),
        "network" => Some("interfaces/".into()),
        "network/interfaces" => Some("macs/".into()),
        "network/interfaces/macs" => lines(inst.enis.iter().map(|e| format!("{}/", e.mac))),
        _ => {
            let rest = path.strip_prefix("network/interfaces/macs/")?;
            let (mac, key) = rest.split_once('/').unwrap_or((rest, ""));
            let eni = inst.enis.iter().find(|e| e.mac == mac)?;
            eni_key(view, eni, key, partial_prefixes)
        }
    }
}

fn hostname(e: &EniView, region: &str) -> String {
    format!(
        "ip-{}.{region}.compute.internal",
        e.primary_ip.to_string().replace('.', "-")
    )
}

fn eni_key(
    view: &FabricView,
    e: &EniView,
    key: &str,
    partial_prefixes: Option<usize>,
) -> Option<String> {
    match key {
        "" => {
            let mut keys = vec![
                "device-number",
                "interface-id",
                "local-hostname",
                "local-ipv4s",
                "mac",
                "network-card",
                "owner-id",
                "security-group-ids",
                "subnet-id",
                "subnet-ipv4-cidr-block",
                "vpc-id",
                "vpc-ipv4-cidr-block",
                "vpc-ipv4-cidr-blocks",
            ];
            if !e.ipv4_prefixes.is_empty() {
                keys.push("ipv4-prefix");
            }
            if !e.ipv6_addresses.is_empty() {
                keys.push("ipv6s");
            }
            if !e.ipv6_prefixes.is_empty() {
                keys.push("ipv6-prefix");
            }
            if e.subnet_ipv6_cidr.is_some() {
                keys.push("subnet-ipv6-cidr-blocks");
                keys.push("vpc-ipv6-cidr-blocks");
            }
            keys.sort_unstable();
            Some(keys.join("\n"))
        }
        "device-number" => Some(e.device_index.to_string()),
        "network-card" => Some(e.network_card_index.to_string()),
        "interface-id" => Some(e.eni_id.clone()),
        "mac" => Some(e.mac.clone()),
        "local-hostname" => Some(hostname(e, &view.region)),
        "owner-id" => Some("123456789012".into()),
        "local-ipv4s" => {
            lines(std::iter::once(e.primary_ip).chain(e.secondary_ips.iter().copied()))
        }
        "ipv4-prefix" => {
            let n = partial_prefixes.unwrap_or(usize::MAX);
            lines(e.ipv4_prefixes.iter().take(n))
        }
        "ipv6s" => lines(&e.ipv6_addresses),
        "ipv6-prefix" => lines(&e.ipv6_prefixes),
        "subnet-id" => Some(e.subnet_id.clone()),
        "subnet-ipv4-cidr-block" => Some(e.subnet_cidr.to_string()),
        "subnet-ipv6-cidr-blocks" => e.subnet_ipv6_cidr.map(|c| c.to_string()),
        "vpc-id" => Some(view.vpc_id.clone()),
        "vpc-ipv4-cidr-block" => Some(view.vpc_cidr.to_string()),
        "vpc-ipv4-cidr-blocks" => {
            if view.vpc_cidrs.is_empty() {
                Some(view.vpc_cidr.to_string())
            } else {
                lines(&view.vpc_cidrs)
            }
        }
        "vpc-ipv6-cidr-blocks" => view.vpc_ipv6_cidr.map(|c| c.to_string()),
        "security-group-ids" => lines(&e.security_groups),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorldConfig;
    use crate::state::AssignIpv4;

    #[test]
    fn renders_eni_metadata_and_partial_prefixes() {
        let world = World::new(WorldConfig::default());
        let inst = world.run_instances("m5.large", 1).unwrap().remove(0);
        let eni = world.read(|s| s.instances[&inst].primary_eni.clone());
        world
            .mutate(|s, _| {
                s.assign_ipv4(
                    &eni,
                    AssignIpv4 {
                        prefix_count: 3,
                        ..AssignIpv4::default()
                    },
                )
            })
            .unwrap();
        let view = world.imds_view(&inst, world.now());
        let mac = render(&view, &inst, "mac", None).unwrap();
        let base = format!("network/interfaces/macs/{mac}/");
        assert_eq!(
            render(&view, &inst, &format!("{base}interface-id"), None).unwrap(),
            eni
        );
        assert_eq!(
            render(&view, &inst, &format!("{base}device-number"), None).unwrap(),
            "0"
        );
        assert_eq!(
            render(&view, &inst, &format!("{base}ipv4-prefix"), None)
                .unwrap()
                .lines()
                .count(),
            3
        );
        assert_eq!(
            render(&view, &inst, &format!("{base}ipv4-prefix"), Some(1))
                .unwrap()
                .lines()
                .count(),
            1
        );
        assert!(render(&view, &inst, &format!("{base}ipv6s"), None).is_none());
        assert_eq!(
            render(&view, &inst, "network/interfaces/macs/", None).unwrap(),
            format!("{mac}/")
        );
        assert!(render(&view, "i-nope", "mac", None).is_none());
    }
}
