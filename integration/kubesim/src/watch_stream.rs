//! Watch streams as kube-apiserver serves them: replay from a resourceVersion (waiting up to 3 s
//! for one not reached yet), label/field selectors applied per change as the cacher does,
//! bookmarks, timeouts, 410 as an ERROR event, Table rows for kubectl. Reads the store's change
//! feed; owns no state.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use http::header;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::api::{Ctx, q, truthy};
use crate::catalog::ResourceType;
use crate::cluster::{Cluster, Knobs, ListOptions};
use crate::error::ApiError;
use crate::store::{Change, ChangeKind};
use crate::table::to_table;

/// kube-apiserver waits up to 3 s for a resourceVersion it has not reached yet, then answers
/// 504 "Too large resource version" (after a restart that lost state, for instance).
pub async fn wait_for_resource_version(
    cluster: &Cluster,
    query: &[(String, String)],
) -> Result<(), ApiError> {
    let Some(asked) = q(query, "resourceVersion").and_then(|r| r.parse::<u64>().ok()) else {
        return Ok(());
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let current = cluster.lock().store.rv();
        if asked <= current {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::too_large_resource_version(asked, current));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a change means to one watch (after its selectors), as kube-apiserver's cacher decides.
fn event_for(
    change: &Change,
    opts: &ListOptions,
    ns: Option<&str>,
) -> Option<(&'static str, Value)> {
    if ns.is_some_and(|n| n != change.namespace) {
        return None;
    }
    let m = |o: &Value| opts.labels.matches(o) && opts.fields.matches(o);
    match change.kind {
        ChangeKind::Added => m(&change.object).then(|| ("ADDED", change.object.clone())),
        ChangeKind::Deleted => m(&change.object).then(|| ("DELETED", change.object.clone())),
        ChangeKind::Modified => {
            let was = change.old.as_ref().is_some_and(m);
            match (was, m(&change.object)) {
                (true, true) => Some(("MODIFIED", change.object.clone())),
                (false, true) => Some(("ADDED", change.object.clone())),
                (true, false) => Some(("DELETED", change.object.clone())),
                (false, false) => None,
            }
        }
    }
}

struct WatchStream {
    cluster: Arc<Cluster>,
    rt: ResourceType,
    version: String,
    ns: Option<String>,
    opts: ListOptions,
    queue: VecDeque<Value>,
    rx: broadcast::Receiver<Arc<Change>>,
    generation: tokio::sync::watch::Receiver<u64>,
    last_rv: u64,
    deadline: tokio::time::Instant,
    bookmarks: Option<Duration>,
    next_bookmark: tokio::time::Instant,
    table: bool,
    include: String,
    done: bool,
}

impl WatchStream {
    fn line(&self, kind: &str, obj: &Value) -> Value {
        let o = Cluster::present(&self.rt, &self.version, obj);
        let o = if self.table && kind != "BOOKMARK" && kind != "ERROR" {
            let rv = o
                .pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(json!(""));
            to_table(&self.rt, std::slice::from_ref(&o), rv, &self.include)
        } else {
            o
        };
        json!({"type": kind, "object": o})
    }

    fn bookmark(&self) -> Value {
        let rv = self.cluster.lock().store.rv().max(self.last_rv);
        json!({"type": "BOOKMARK", "object": {"kind": self.rt.kind, "apiVersion": self.rt.api_version(&self.version), "metadata": {"resourceVersion": rv.to_string()}}})
    }

    async fn next_line(&mut self) -> Option<Value> {
        loop {
            if let Some(v) = self.queue.pop_front() {
                return Some(v);
            }
            if self.done {
                return None;
            }
            let bookmark_at = self.next_bookmark;
            tokio::select! {
                r = self.rx.recv() => match r {
                    Ok(c) => {
                        if c.storage != self.rt.storage || c.rv <= self.last_rv {
                            continue;
                        }
                        self.last_rv = c.rv;
                        if let Some((k, o)) = event_for(&c, &self.opts, self.ns.as_deref()) {
                            return Some(self.line(k, &o));
                        }
                    }
                    // A watcher that falls behind is closed, as kube-apiserver closes slow ones.
                    Err(_) => return None,
                },
                _ = self.generation.changed() => return None,
                _ = tokio::time::sleep_until(self.deadline) => return None,
                _ = tokio::time::sleep_until(bookmark_at), if self.bookmarks.is_some() => {
                    self.next_bookmark = tokio::time::Instant::now() + self.bookmarks.unwrap_or_default();
                    return Some(self.bookmark());
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn serve_watch(
    ctx: &Ctx,
    rt: ResourceType,
    version: String,
    ns: Option<String>,
    opts: ListOptions,
    query: &[(String, String)],
    too_large: Option<ApiError>,
    table: bool,
    include: String,
) -> Result<Response, ApiError> {
    let knobs: Knobs = ctx.cluster.knobs();
    let timeout = q(query, "timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .unwrap_or(knobs.default_watch_timeout_s);
    let bookmarks = truthy(q(query, "allowWatchBookmarks"))
        .then(|| Duration::from_millis(knobs.bookmark_interval_ms.max(1)));
    let rv_param = q(query, "resourceVersion").filter(|r| !r.is_empty() && *r != "0");
    let start_rv = match rv_param {
        Some(r) => Some(
            r.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {r}")))?,
        ),
        None => None,
    };
    let mut queue = VecDeque::new();
    let (rx, last_rv, expired) = {
        let s = ctx.cluster.lock();
        let rx = s.store.subscribe();
        match start_rv {
            None => {
                // No resourceVersion (or "0"): the current state as ADDED events, then changes.
                for o in s.store.list(&rt.storage, ns.as_deref()) {
                    if opts.labels.matches(o) && opts.fields.matches(o) {
                        queue.push_back(("ADDED", o.clone()));
                    }
                }
                (rx, s.store.rv(), None)
            }
            Some(rv) => match s.store.since(rv) {
                Ok(changes) => {
                    let last = changes.last().map_or(rv.max(s.store.rv()), |c| c.rv);
                    for c in changes.iter().filter(|c| c.storage == rt.storage) {
                        if let Some((k, o)) = event_for(c, &opts, ns.as_deref()) {
                            queue.push_back((k, o));
                        }
                    }
                    (rx, last.max(s.store.rv()), None)
                }
                Err(e) => (rx, s.store.rv(), Some(e)),
            },
        }
    };
    let mut st = WatchStream {
        cluster: ctx.cluster.clone(),
        rt,
        version,
        ns,
        opts,
        queue: VecDeque::new(),
        rx,
        generation: ctx.cluster.watch_generation.subscribe(),
        last_rv,
        deadline: tokio::time::Instant::now() + Duration::from_secs(timeout),
        bookmarks,
        next_bookmark: tokio::time::Instant::now() + bookmarks.unwrap_or_default(),
        table,
        include,
        done: false,
    };
    st.generation.mark_unchanged();
    if let Some(e) = too_large {
        st.queue
            .push_back(json!({"type": "ERROR", "object": e.status()}));
        st.done = true;
    } else if let Some(e) = expired {
        // As kube-apiserver's watch cache: 200, then one ERROR event carrying a 410 Status.
        let status = ApiError::expired(format!(
            "too old resource version: {} ({})",
            e.asked, e.oldest
        ))
        .status();
        st.queue
            .push_back(json!({"type": "ERROR", "object": status}));
        st.done = true;
    } else {
        let lines: Vec<Value> = queue.into_iter().map(|(k, o)| st.line(k, &o)).collect();
        st.queue.extend(lines);
    }
    let stream = futures::stream::unfold(st, |mut st| async move {
        let line = st.next_line().await?;
        let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
        bytes.push(b'\n');
        Some((Ok::<Bytes, Infallible>(Bytes::from(bytes)), st))
    });
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache, private"),
    );
    Ok(r)
}
