//! The EC2 Query API over HTTP: `POST /` with a form body (`Action=...`), answered with EC2's
//! XML and error format. Applies the knobs (latency, dropped connections, 5xx, throttling) in
//! front of every action, then `DryRun`, then the action, then may lose a successful answer
//! (`lost_answer_rate`). Owns the HTTP edge only; rules live in `state`.

mod actions;
pub mod error;
pub mod params;
#[cfg(test)]
mod tests;
pub mod xml;

use crate::knobs::ActionClass;
use crate::world::World;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Form, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use error::ApiError;
use params::Params;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The actions the simulator implements, with their throttling class.
pub const ACTIONS: &[(&str, ActionClass)] = &[
    ("DescribeInstances", ActionClass::Describe),
    ("DescribeInstanceTypes", ActionClass::Describe),
    ("DescribeNetworkInterfaces", ActionClass::Describe),
    ("DescribeSubnets", ActionClass::Describe),
    ("DescribeVpcs", ActionClass::Describe),
    ("DescribeSecurityGroups", ActionClass::Describe),
    ("DescribeTags", ActionClass::Describe),
    ("GetSubnetCidrReservations", ActionClass::Describe),
    ("CreateNetworkInterface", ActionClass::Mutate),
    ("AttachNetworkInterface", ActionClass::Mutate),
    ("DetachNetworkInterface", ActionClass::Mutate),
    ("DeleteNetworkInterface", ActionClass::Mutate),
    ("ModifyNetworkInterfaceAttribute", ActionClass::Mutate),
    ("AssignPrivateIpAddresses", ActionClass::Mutate),
    ("UnassignPrivateIpAddresses", ActionClass::Mutate),
    ("AssignIpv6Addresses", ActionClass::Mutate),
    ("UnassignIpv6Addresses", ActionClass::Mutate),
    ("CreateTags", ActionClass::Mutate),
    // Security groups for pods (the VPC Resource Controller's calls, and test set-up).
    ("DescribeTrunkInterfaceAssociations", ActionClass::Describe),
    ("AssociateTrunkInterface", ActionClass::Mutate),
    ("DisassociateTrunkInterface", ActionClass::Mutate),
    ("CreateSecurityGroup", ActionClass::Mutate),
    ("AuthorizeSecurityGroupIngress", ActionClass::Mutate),
    ("AuthorizeSecurityGroupEgress", ActionClass::Mutate),
    ("RevokeSecurityGroupIngress", ActionClass::Mutate),
    ("RevokeSecurityGroupEgress", ActionClass::Mutate),
    ("DeleteTags", ActionClass::Mutate),
    ("CreateSubnet", ActionClass::Mutate),
    ("CreateSubnetCidrReservation", ActionClass::Mutate),
    ("DeleteSubnetCidrReservation", ActionClass::Mutate),
    ("RunInstances", ActionClass::Instances),
    ("TerminateInstances", ActionClass::Instances),
];

/// The EC2 endpoint for `world` (mount at `/`).
pub fn router(world: Arc<World>) -> Router {
    Router::new().route("/", post(handle)).with_state(world)
}

static REQUEST_SEQ: AtomicU64 = AtomicU64::new(1);

fn request_id() -> String {
    let n = REQUEST_SEQ.fetch_add(1, Ordering::Relaxed);
    format!("00000000-0000-4000-8000-{n:012x}")
}

async fn handle(
    State(world): State<Arc<World>>,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Response {
    let params = Params::from_pairs(pairs);
    let rid = request_id();
    let action = params.get("Action").unwrap_or_default().to_owned();
    let knobs = world.knobs();
    if knobs.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(knobs.latency_ms)).await;
    }
    if knobs.drop_connection_rate > 0.0 && rand::random::<f64>() < knobs.drop_connection_rate {
        tracing::debug!(%action, "dropping connection (knob)");
        return dropped_connection();
    }
    let result = if knobs.denied_actions.contains(&action) {
        Err(ApiError::Unauthorized(action.clone()))
    } else {
        answer(&world, &action, &params, &rid, knobs.error_5xx_rate)
    };
    match result {
        Ok(_) if knobs.lost_answer_rate > 0.0 && rand::random::<f64>() < knobs.lost_answer_rate => {
            tracing::debug!(%action, "applied; dropping the answer's connection (knob)");
            dropped_connection()
        }
        Ok(body) => xml_response(StatusCode::OK, &rid, body),
        Err(e) => {
            tracing::debug!(%action, code = e.code(), "ec2 error");
            xml_response(e.status(), &rid, e.body(&rid))
        }
    }
}

fn answer(
    world: &World,
    action: &str,
    params: &Params,
    rid: &str,
    error_5xx_rate: f64,
) -> Result<Vec<u8>, ApiError> {
    let class = ACTIONS
        .iter()
        .find(|(name, _)| *name == action)
        .map(|(_, c)| *c)
        .ok_or_else(|| ApiError::InvalidAction(action.to_owned()))?;
    if error_5xx_rate > 0.0 && rand::random::<f64>() < error_5xx_rate {
        return Err(ApiError::Internal);
    }
    let class = refine_class(action, class, params);
    if !world.take_token(action, class) {
        return Err(ApiError::Throttled);
    }
    if params.flag("DryRun")? {
        return Err(ApiError::DryRun);
    }
    actions::dispatch(world, action, params, rid)
}

/// Describe actions EC2 puts in the "unfiltered and unpaginated" category when asked without
/// filters, ids or `MaxResults`.
const UNFILTERABLE: &[(&str, &str)] = &[
    ("DescribeInstances", "InstanceId"),
    ("DescribeNetworkInterfaces", "NetworkInterfaceId"),
    ("DescribeSecurityGroups", "GroupId"),
];

/// The throttling category of this request: a listed `Describe*` without filters, ids or
/// pagination is "unfiltered and unpaginated", with its smaller bucket.
fn refine_class(action: &str, class: ActionClass, params: &Params) -> ActionClass {
    let Some((_, id_param)) = UNFILTERABLE.iter().find(|(a, _)| *a == action) else {
        return class;
    };
    let narrowed = !params.filters().is_empty()
        || !params.list(id_param).is_empty()
        || params.get("MaxResults").is_some()
        || params.get("NextToken").is_some();
    if narrowed {
        class
    } else {
        ActionClass::Unfiltered
    }
}

fn xml_response(status: StatusCode, rid: &str, body: Vec<u8>) -> Response {
    let mut resp = (status, body).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/xml;charset=UTF-8"),
    );
    if let Ok(v) = HeaderValue::from_str(rid) {
        headers.insert("x-amzn-requestid", v);
    }
    resp
}

/// A response whose body fails after the headers: hyper aborts the connection, and the client
/// sees a connection dropped mid-answer (what a reset EC2 connection looks like to the SDK).
fn dropped_connection() -> Response {
    let stream = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("connection dropped by knob"))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/xml;charset=UTF-8"),
    );
    resp
}
