//! The simulator's JSON control API (used by the `vpcsim` CLI and tests): knobs, state dump,
//! fabric view, launching/terminating instances. Owns only this HTTP surface; EC2 rules stay
//! in `state`.

use crate::knobs::Knobs;
use crate::state::{self, StateError};
use crate::world::World;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// `POST /instances` body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchRequest {
    /// Instance type, e.g. `m5.large`.
    pub instance_type: String,
    /// How many (default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// Subnet id (default: first subnet).
    #[serde(default)]
    pub subnet_id: Option<String>,
    /// IPv6 addresses for each primary ENI (`Ipv6AddressCount`, default 0).
    #[serde(default)]
    pub ipv6_address_count: u32,
}

fn one() -> u32 {
    1
}

/// `POST /subnets` body: a subnet added to the VPC (e.g. tagged `kubernetes.io/role/cni` for
/// subnet discovery).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubnetRequest {
    /// IPv4 CIDR (/16–/28, inside a VPC block, overlapping no subnet).
    pub cidr: ipnet::Ipv4Net,
    /// Zone (default: the world's).
    #[serde(default)]
    pub availability_zone: Option<String>,
    /// Tags.
    #[serde(default)]
    pub tags: std::collections::BTreeMap<String, String>,
}

/// `POST /subnets` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubnetResponse {
    /// The new subnet's id.
    pub subnet_id: String,
}

/// `POST /instances` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchResponse {
    /// The new instance ids.
    pub instance_ids: Vec<String>,
}

/// Error body of the control API.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ControlError {
    /// EC2-style error code.
    pub code: String,
    /// Message.
    pub message: String,
}

/// The control API for `world`:
/// `GET /knobs`, `PUT /knobs` (JSON object merged into the current knobs), `GET /state`,
/// `GET /view`, `GET /calls` (per EC2 action `{"accepted", "throttled"}`), `POST /instances`,
/// `DELETE /instances/{id}`, `POST /subnets`.
pub fn router(world: Arc<World>) -> Router {
    Router::new()
        .route("/knobs", get(get_knobs).put(put_knobs))
        .route("/calls", get(get_calls))
        .route("/state", get(get_state))
        .route("/view", get(get_view))
        .route("/instances", post(launch))
        .route("/instances/{id}", delete(terminate))
        .route("/subnets", post(create_subnet))
        .with_state(world)
}

fn error(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(ControlError {
            code: code.to_owned(),
            message,
        }),
    )
        .into_response()
}

fn state_error(e: &StateError) -> Response {
    let code = crate::ec2::error::ApiError::State(e.clone()).code();
    error(StatusCode::BAD_REQUEST, code, e.to_string())
}

async fn get_knobs(State(world): State<Arc<World>>) -> Json<Knobs> {
    Json(world.knobs())
}

/// Overlay `patch` onto `base` (objects merged key by key, everything else replaced).
fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

async fn put_knobs(
    State(world): State<Arc<World>>,
    Json(patch): Json<serde_json::Value>,
) -> Response {
    let mut current = match serde_json::to_value(world.knobs()) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                e.to_string(),
            );
        }
    };
    merge(&mut current, patch);
    match serde_json::from_value::<Knobs>(current) {
        Ok(knobs) => {
            world.set_knobs(knobs.clone());
            Json(knobs).into_response()
        }
        Err(e) => error(
            StatusCode::BAD_REQUEST,
            "InvalidParameterValue",
            format!("knobs: {e}"),
        ),
    }
}

async fn get_calls(
    State(world): State<Arc<World>>,
) -> Json<std::collections::BTreeMap<String, crate::world::ApiCount>> {
    Json(world.api_counts())
}

async fn get_state(State(world): State<Arc<World>>) -> Json<state::State> {
    Json(world.state())
}

async fn get_view(State(world): State<Arc<World>>) -> Json<crate::view::FabricView> {
    Json(world.fabric_view(world.now()))
}

async fn launch(State(world): State<Arc<World>>, Json(req): Json<LaunchRequest>) -> Response {
    let run = state::RunInstances {
        instance_type: req.instance_type,
        subnet_id: req.subnet_id,
        count: req.count,
        ipv6_count: req.ipv6_address_count,
        ..state::RunInstances::default()
    };
    match world.mutate(|s, now| s.run_instances(run, now)) {
        Ok(instance_ids) => {
            (StatusCode::CREATED, Json(LaunchResponse { instance_ids })).into_response()
        }
        Err(e) => state_error(&e),
    }
}

async fn create_subnet(
    State(world): State<Arc<World>>,
    Json(req): Json<SubnetRequest>,
) -> Response {
    let result = world.mutate(|s, _| {
        s.create_subnet(state::CreateSubnet {
            vpc_id: s.vpc.id.clone(),
            cidr: Some(req.cidr),
            availability_zone: req.availability_zone,
            tags: req.tags,
        })
    });
    match result {
        Ok(subnet_id) => (StatusCode::CREATED, Json(SubnetResponse { subnet_id })).into_response(),
        Err(e) => state_error(&e),
    }
}

async fn terminate(State(world): State<Arc<World>>, Path(id): Path<String>) -> Response {
    match world.mutate(|s, _| s.terminate_instances(std::slice::from_ref(&id))) {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => state_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::merge;
    use serde_json::json;

    #[test]
    fn merge_keeps_unmentioned_knobs() {
        let mut base =
            json!({"latency_ms": 5, "throttle": {"enabled": true, "describe": {"capacity": 100}}});
        merge(&mut base, json!({"throttle": {"enabled": false}}));
        assert_eq!(
            base,
            json!({"latency_ms": 5, "throttle": {"enabled": false, "describe": {"capacity": 100}}})
        );
    }
}
