//! Counting the EC2 calls the nodes make: a middleware on the EC2 router the fabric serves
//! inside the nodes, and the per-action tally. Must not change any answer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use vpcsim::fabric::FabricWorld;
use vpcsim::{FabricView, World};

/// EC2 calls the simulator answered, by action: `(answered 2xx, answered with an error)`.
#[derive(Debug, Default)]
pub struct CallLog {
    calls: Mutex<BTreeMap<String, (u64, u64)>>,
    /// The `app/...` parts of the requests' User-Agents (`VPC_CNI_VERSION` shows there).
    apps: Mutex<std::collections::BTreeSet<String>>,
}

impl CallLog {
    /// A copy of the counts.
    #[must_use]
    pub fn snapshot(&self) -> BTreeMap<String, (u64, u64)> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Every `app/<name>` element the calls' User-Agents carried.
    #[must_use]
    pub fn user_agent_apps(&self) -> std::collections::BTreeSet<String> {
        self.apps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn record_user_agent(&self, ua: &str) {
        let mut apps = self
            .apps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for part in ua.split_whitespace().filter(|p| p.starts_with("app/")) {
            apps.insert(part.to_owned());
        }
    }

    fn record(&self, action: &str, ok: bool) {
        let mut c = self
            .calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let e = c.entry(action.to_owned()).or_default();
        if ok {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }
}

/// Calls per action between two snapshots (all answers, errors included).
#[must_use]
pub fn call_delta(
    before: &BTreeMap<String, (u64, u64)>,
    after: &BTreeMap<String, (u64, u64)>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, (ok, err))| {
            let (bok, berr) = before.get(k).copied().unwrap_or_default();
            let n = (ok + err).saturating_sub(bok + berr);
            (n > 0).then(|| (k.clone(), n))
        })
        .collect()
}

/// True for EC2 actions that change state (everything but `Describe*`).
#[must_use]
pub fn is_mutating(action: &str) -> bool {
    !action.starts_with("Describe")
}

/// The world as the fabric sees it, with every EC2 request counted by action.
pub(super) struct CountingWorld {
    pub(super) world: Arc<World>,
    pub(super) log: Arc<CallLog>,
}

async fn count_call(State(log): State<Arc<CallLog>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    for ua in ["user-agent", "x-amz-user-agent"] {
        if let Some(v) = parts.headers.get(ua).and_then(|v| v.to_str().ok()) {
            log.record_user_agent(v);
        }
    }
    let bytes = axum::body::to_bytes(body, 16 << 20)
        .await
        .unwrap_or_default();
    let action =
        form_value(&String::from_utf8_lossy(&bytes), "Action").unwrap_or_else(|| "?".to_owned());
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    log.record(&action, resp.status().is_success());
    resp
}

fn form_value(form: &str, key: &str) -> Option<String> {
    form.split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_owned())
}

impl FabricWorld for CountingWorld {
    fn fabric_view(&self) -> FabricView {
        World::fabric_view(&self.world, self.world.now())
    }
    fn imds_router(&self, instance_id: &str) -> axum::Router {
        vpcsim::imds::router(self.world.clone(), instance_id)
    }
    fn ec2_router(&self) -> axum::Router {
        vpcsim::ec2::router(self.world.clone()).layer(axum::middleware::from_fn_with_state(
            self.log.clone(),
            count_call,
        ))
    }
}
