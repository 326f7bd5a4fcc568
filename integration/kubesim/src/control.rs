//! The simulator's control API under `/_kubesim/` (knobs, outages, audit log, tokens): what a
//! test changes about the simulated API server from outside. Owns no state; calls `Cluster`.

use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use http::Method;
use serde_json::{Value, json};

use crate::api::{Ctx, ok, parse_json, read_body};
use crate::cluster::{Knobs, Outage};
use crate::error::ApiError;

pub(crate) async fn control(ctx: &Ctx, path: &str, req: Request) -> Result<Response, ApiError> {
    let method = req.method().clone();
    let body = read_body(req.into_body()).await?;
    let body = if body.is_empty() {
        json!({})
    } else {
        parse_json(&body)?
    };
    let s = |k: &str| {
        body.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| ApiError::bad_request(format!("{k} is required")))
    };
    match (method, path) {
        (Method::GET, "knobs") => Ok(ok(
            &serde_json::to_value(ctx.cluster.knobs()).unwrap_or_default()
        )),
        (Method::PUT, "knobs") => {
            let mut cur = serde_json::to_value(ctx.cluster.knobs()).unwrap_or_default();
            crate::patch::merge_patch(&mut cur, &body);
            let k: Knobs =
                serde_json::from_value(cur).map_err(|e| ApiError::bad_request(e.to_string()))?;
            ctx.cluster.set_knobs(k.clone());
            Ok(ok(&serde_json::to_value(k).unwrap_or_default()))
        }
        (Method::GET, "audit") => Ok(ok(
            &serde_json::to_value(ctx.cluster.audit()).unwrap_or_default()
        )),
        (Method::POST, "compact") => {
            ctx.cluster.compact();
            Ok(ok(&json!({"compacted": true})))
        }
        (Method::POST, "drop-watches") => {
            ctx.cluster.drop_watches();
            Ok(ok(&json!({"dropped": true})))
        }
        (Method::POST, "outage") => {
            let secs = body
                .get("seconds")
                .and_then(Value::as_f64)
                .ok_or_else(|| ApiError::bad_request("seconds is required"))?;
            let mode: Outage = serde_json::from_value(
                body.get("mode").cloned().unwrap_or(json!("unavailable503")),
            )
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
            ctx.cluster
                .set_outage(Duration::from_secs_f64(secs.max(0.0)), mode);
            Ok(ok(&json!({"seconds": secs, "mode": mode})))
        }
        (Method::POST, "tokens") => {
            let token = ctx
                .cluster
                .issue_service_account_token(&s("namespace")?, &s("name")?)?;
            Ok(ok(&json!({"token": token})))
        }
        (Method::POST, "pod-routes") => {
            let port = body
                .get("port")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok())
                .ok_or_else(|| ApiError::bad_request("port is required"))?;
            let addr = s("address")?
                .parse()
                .map_err(|_| ApiError::bad_request("address must be ip:port"))?;
            ctx.cluster
                .route_pod_port(&s("namespace")?, &s("pod")?, port, addr);
            Ok(ok(&json!({"routed": true})))
        }
        (Method::POST, "apply") => {
            let text = s("yaml")?;
            let objs = ctx.cluster.apply_yaml(&text)?;
            Ok(ok(&json!({"applied": objs.len()})))
        }
        _ => Err(ApiError::new(
            404,
            "NotFound",
            format!("no control endpoint {path}"),
        )),
    }
}
