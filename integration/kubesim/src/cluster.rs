//! `Cluster`: the simulated API server's state (store, catalog, tokens, pod routes, knobs)
//! behind one `std::sync::Mutex` (never held across `.await`), and the object operations with
//! kube-apiserver's rules: create/update/patch/delete/get/list, optimistic concurrency,
//! status subresources, CRD registration and schema validation, events.k8s.io ↔ core Event
//! conversion (`events.rs`), namespace checks. Knows nothing about HTTP framing. Over 600 lines
//! because `impl Cluster` is one job: every operation takes the one lock and keeps the store's
//! invariants (resourceVersions, uids, generation, finalizers) together; splitting the impl across
//! files would scatter those rules.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::catalog::{Catalog, ResourceType, StorageKey};
use crate::error::{ApiError, FieldCause};
use crate::events::{core_to_events_v1, events_v1_to_core, validate_events_v1};
use crate::patch;
use crate::rbac::{self, Attributes, Policy, UserInfo};
use crate::schema;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{ChangeKind, Store};

/// Behaviour knobs (JSON on the control API; every field optional in a PUT).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Knobs {
    /// Sleep before answering every API request.
    pub latency_ms: u64,
    /// Changes the history keeps for watches; older resourceVersions get 410 Expired.
    pub history_capacity: usize,
    /// How often an open watch with `allowWatchBookmarks=true` gets a BOOKMARK.
    pub bookmark_interval_ms: u64,
    /// A watch without `timeoutSeconds` ends after this long (kube-apiserver: 30–60 min).
    pub default_watch_timeout_s: u64,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            latency_ms: 0,
            history_capacity: 1000,
            bookmark_interval_ms: 60_000,
            default_watch_timeout_s: 1800,
        }
    }
}

/// How the server is unavailable while the outage knob is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outage {
    /// Every request gets 503 ServiceUnavailable.
    Unavailable503,
    /// The listener is closed (connection refused) and open connections are cut.
    Refuse,
}

/// One resource request as the audit log keeps it (what was asked, by whom, the answer's code).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub code: u16,
}

impl AuditEntry {
    pub fn new(user: &str, attrs: &Attributes, code: u16) -> Self {
        match attrs {
            Attributes::Resource {
                verb,
                group,
                resource,
                subresource,
                namespace,
                name,
            } => Self {
                user: user.into(),
                verb: verb.clone(),
                group: group.clone(),
                resource: resource.clone(),
                subresource: subresource.clone(),
                namespace: namespace.clone(),
                name: name.clone(),
                code,
            },
            Attributes::NonResource { verb, path } => Self {
                user: user.into(),
                verb: verb.clone(),
                group: String::new(),
                resource: path.clone(),
                subresource: None,
                namespace: None,
                name: None,
                code,
            },
        }
    }
}

/// Entries the audit log keeps (oldest dropped first).
const AUDIT_CAPACITY: usize = 20_000;

/// The patch formats kube-apiserver accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        Some(match base {
            "application/json-patch+json" => Self::Json,
            "application/merge-patch+json" => Self::Merge,
            "application/strategic-merge-patch+json" => Self::Strategic,
            "application/apply-patch+yaml" | "application/apply-patch+json" => Self::Apply,
            _ => return None,
        })
    }
}

/// List options as parsed from the query.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// The state the lock guards.
#[derive(Debug)]
pub struct State {
    pub store: Store,
    pub catalog: Catalog,
    pub tokens: HashMap<String, UserInfo>,
    /// `(namespace, pod, port)` → where the pod proxy really connects (tests' pod servers).
    pub pod_routes: HashMap<(String, String, u16), SocketAddr>,
    pub knobs: Knobs,
    pub outage: Option<(Instant, Outage)>,
    pub audit: std::collections::VecDeque<AuditEntry>,
}

/// The simulated API server's state and operations.
#[derive(Debug)]
pub struct Cluster {
    state: Mutex<State>,
    /// Bumped to end every open watch stream.
    pub(crate) watch_generation: tokio::sync::watch::Sender<u64>,
    /// Bumped to cut every open connection (outage `Refuse`).
    pub(crate) conn_generation: tokio::sync::watch::Sender<u64>,
}

const NAME_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn now_rfc3339() -> String {
    let t = time::OffsetDateTime::from(SystemTime::now());
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn new_uid() -> String {
    let b: [u8; 16] = rand::rng().random();
    let h = hex::encode(b);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn set_meta(obj: &mut Value, field: &str, v: Value) {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"][field] = v;
}

/// The object without server-maintained metadata, for "did anything change" checks.
fn comparable(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    o
}

fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

/// Which object a request addresses.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    pub rt: &'a ResourceType,
    pub version: &'a str,
    pub namespace: Option<&'a str>,
}

impl Cluster {
    pub fn new(knobs: Knobs) -> Arc<Self> {
        let mut store = Store::new(knobs.history_capacity);
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "uid": new_uid(), "creationTimestamp": now_rfc3339(),
                              "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            });
            store.commit(
                &StorageKey::new("", "namespaces"),
                "",
                ns,
                ChangeKind::Added,
                obj,
            );
        }
        Arc::new(Self {
            state: Mutex::new(State {
                store,
                catalog: Catalog::default(),
                tokens: HashMap::new(),
                pod_routes: HashMap::new(),
                knobs,
                outage: None,
                audit: std::collections::VecDeque::new(),
            }),
            watch_generation: tokio::sync::watch::channel(0).0,
            conn_generation: tokio::sync::watch::channel(0).0,
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---- knobs -----------------------------------------------------------------------------

    pub fn knobs(&self) -> Knobs {
        self.lock().knobs.clone()
    }

    pub fn set_knobs(&self, k: Knobs) {
        let mut s = self.lock();
        s.store.set_history_capacity(k.history_capacity);
        s.knobs = k;
    }

    /// Ends every open watch stream now (clients see the stream close and re-watch).
    pub fn drop_watches(&self) {
        self.watch_generation.send_modify(|g| *g += 1);
    }

    /// Forgets the change history: the next watch from any earlier resourceVersion gets 410.
    pub fn compact(&self) {
        self.lock().store.compact();
    }

    /// Makes the server unavailable for `d`.
    pub fn set_outage(&self, d: Duration, mode: Outage) {
        self.lock().outage = Some((Instant::now() + d, mode));
        self.drop_watches();
        if mode == Outage::Refuse {
            self.conn_generation.send_modify(|g| *g += 1);
        }
    }

    /// The outage in force now, if any.
    pub fn outage(&self) -> Option<(Instant, Outage)> {
        let mut s = self.lock();
        match s.outage {
            Some((until, _)) if Instant::now() >= until => {
                s.outage = None;
                None
            }
            o => o,
        }
    }

    // ---- audit ------------------------------------------------------------------------------

    /// Appends to the audit log (every resource request after authentication).
    pub fn record(&self, e: AuditEntry) {
        let mut s = self.lock();
        if s.audit.len() >= AUDIT_CAPACITY {
            s.audit.pop_front();
        }
        s.audit.push_back(e);
    }

    /// The audit log, oldest first: lets a test check which verbs a component really used
    /// (e.g. against the chart's ClusterRole) and that it watches instead of polling.
    pub fn audit(&self) -> Vec<AuditEntry> {
        self.lock().audit.iter().cloned().collect()
    }

    // ---- authentication / authorization -----------------------------------------------------

    pub fn add_token(&self, token: &str, user: UserInfo) {
        self.lock().tokens.insert(token.to_string(), user);
    }

    pub fn user_for(&self, token: &str) -> Option<UserInfo> {
        self.lock().tokens.get(token).cloned()
    }

    /// Issues a bearer token for a ServiceAccount (creating the ServiceAccount if missing).
    pub fn issue_service_account_token(&self, ns: &str, name: &str) -> Result<String, ApiError> {
        let key = StorageKey::new("", "serviceaccounts");
        let exists = self.lock().store.get(&key, ns, name).is_some();
        if !exists {
            let rt = self.resource("", "v1", "serviceaccounts")?;
            self.create(
                &Target {
                    rt: &rt,
                    version: "v1",
                    namespace: Some(ns),
                },
                json!({"metadata": {"name": name}}),
            )?;
        }
        let b: [u8; 24] = rand::rng().random();
        let token = format!("kubesim-sa.{}", hex::encode(b));
        self.add_token(&token, UserInfo::service_account(ns, name));
        Ok(token)
    }

    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> bool {
        let s = self.lock();
        let rbac_key = |p: &str| StorageKey::new("rbac.authorization.k8s.io", p);
        let policy = Policy {
            cluster_roles: s.store.list(&rbac_key("clusterroles"), None).collect(),
            cluster_role_bindings: s
                .store
                .list(&rbac_key("clusterrolebindings"), None)
                .collect(),
            roles: s.store.list(&rbac_key("roles"), None).collect(),
            role_bindings: s.store.list(&rbac_key("rolebindings"), None).collect(),
        };
        rbac::allows(&policy, user, attrs)
    }

    // ---- pod proxy routes ---------------------------------------------------------------------

    pub fn route_pod_port(&self, ns: &str, pod: &str, port: u16, to: SocketAddr) {
        self.lock()
            .pod_routes
            .insert((ns.into(), pod.into(), port), to);
    }

    // ---- catalog ------------------------------------------------------------------------------

    /// A copy of the type served at group/version/plural (404 otherwise).
    pub fn resource(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<ResourceType, ApiError> {
        self.lock()
            .catalog
            .find(group, version, plural)
            .cloned()
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )
            })
    }

    pub fn catalog(&self) -> Catalog {
        self.lock().catalog.clone()
    }

    // ---- representation -------------------------------------------------------------------------

    /// The stored object as served in `version` (apiVersion/kind; events.k8s.io conversion).
    pub fn present(rt: &ResourceType, version: &str, stored: &Value) -> Value {
        let mut o = if rt.group == "events.k8s.io" {
            core_to_events_v1(stored)
        } else {
            stored.clone()
        };
        o["apiVersion"] = json!(rt.api_version(version));
        o["kind"] = json!(rt.kind);
        o
    }

    // ---- operations ---------------------------------------------------------------------------

    pub fn get(&self, t: &Target<'_>, name: &str) -> Result<Value, ApiError> {
        let s = self.lock();
        let ns = t.namespace.unwrap_or("");
        s.store
            .get(&t.rt.storage, ns, name)
            .map(|o| Self::present(t.rt, t.version, o))
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))
    }

    /// A list object with the current resourceVersion; `limit`/`continue` paginate in key order.
    pub fn list(&self, t: &Target<'_>, opts: &ListOptions) -> Result<Value, ApiError> {
        let s = self.lock();
        let mut after: Option<(String, String)> = None;
        if let Some(tok) = &opts.continue_token {
            let (rv, ns, name) = decode_continue(tok)?;
            if rv < s.store.oldest_watchable() {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            after = Some((ns, name));
        }
        let mut items = Vec::new();
        let mut more = 0usize;
        let mut last: Option<(String, String)> = None;
        for o in s.store.list(&t.rt.storage, t.namespace) {
            let id = (
                meta_str(o, "namespace").unwrap_or("").to_string(),
                meta_str(o, "name").unwrap_or("").to_string(),
            );
            if after.as_ref().is_some_and(|a| &id <= a) {
                continue;
            }
            if !opts.labels.matches(o) || !opts.fields.matches(o) {
                continue;
            }
            if opts.limit.is_some_and(|l| l > 0 && items.len() >= l) {
                more += 1;
                continue;
            }
            let mut item = Self::present(t.rt, t.version, o);
            if !t.rt.custom
                && let Some(m) = item.as_object_mut()
            {
                m.remove("apiVersion");
                m.remove("kind");
            }
            items.push(item);
            last = Some(id);
        }
        let rv = s.store.rv();
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if more > 0
            && let Some((ns, name)) = last
        {
            meta["continue"] = json!(encode_continue(rv, &ns, &name));
            meta["remainingItemCount"] = json!(more);
        }
        Ok(json!({
            "apiVersion": t.rt.api_version(t.version),
            "kind": format!("{}List", t.rt.kind),
            "metadata": meta,
            "items": items,
        }))
    }

    fn check_type(t: &Target<'_>, body: &mut Value) -> Result<(), ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        let want_av = t.rt.api_version(t.version);
        match (
            body.get("apiVersion").and_then(Value::as_str),
            body.get("kind").and_then(Value::as_str),
        ) {
            (Some(av), Some(k)) if av != want_av || k != t.rt.kind => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({want_av})"
                )));
            }
            _ => {}
        }
        body["apiVersion"] = json!(want_av);
        body["kind"] = json!(t.rt.kind);
        if t.rt.group == "events.k8s.io" {
            validate_events_v1(body)?;
            *body = events_v1_to_core(body);
        }
        Ok(())
    }

    fn check_namespace(s: &State, t: &Target<'_>, body: &mut Value) -> Result<String, ApiError> {
        if !t.rt.namespaced {
            if let Some(m) = body.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("namespace");
            }
            return Ok(String::new());
        }
        let ns = t
            .namespace
            .ok_or_else(|| ApiError::bad_request("the request must name a namespace"))?;
        match meta_str(body, "namespace") {
            Some(b) if !b.is_empty() && b != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => set_meta(body, "namespace", json!(ns)),
        }
        if s.store
            .get(&StorageKey::new("", "namespaces"), "", ns)
            .is_none()
        {
            return Err(ApiError::not_found("", "namespaces", ns));
        }
        Ok(ns.to_string())
    }

    /// Type-specific validation and CRD schema checks on the (core-form) object.
    fn validate(s: &State, t: &Target<'_>, obj: &mut Value, name: &str) -> Result<(), ApiError> {
        if t.rt.custom
            && let Some(sch) = t.rt.schemas.get(t.version)
        {
            schema::prune(sch, obj);
            let causes = schema::validate(sch, obj);
            if !causes.is_empty() {
                return Err(ApiError::invalid(&t.rt.group, &t.rt.kind, name, &causes));
            }
        }
        if t.rt.storage == StorageKey::new("apiextensions.k8s.io", "customresourcedefinitions") {
            let rt = ResourceType::from_crd(obj).map_err(|m| {
                ApiError::invalid(
                    "apiextensions.k8s.io",
                    "CustomResourceDefinition",
                    name,
                    &[FieldCause {
                        reason: "FieldValueInvalid",
                        field: "spec".into(),
                        message: m,
                    }],
                )
            })?;
            if s.catalog
                .types()
                .iter()
                .any(|x| !x.custom && x.group == rt.group && x.plural == rt.plural)
            {
                return Err(ApiError::invalid(
                    "apiextensions.k8s.io",
                    "CustomResourceDefinition",
                    name,
                    &[FieldCause {
                        reason: "FieldValueInvalid",
                        field: "spec.group".into(),
                        message: "is a built-in API group".into(),
                    }],
                ));
            }
        }
        Ok(())
    }

    /// After a CRD is written: (re)register its type and mark it Established.
    fn crd_written(s: &mut State, obj: &mut Value) {
        if let Ok(rt) = ResourceType::from_crd(obj) {
            let kind = rt.kind.clone();
            let plural = rt.plural.clone();
            if s.catalog.register(rt).is_ok() {
                obj["status"] = json!({
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now_rfc3339()},
                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now_rfc3339()},
                    ],
                    "acceptedNames": {"plural": plural, "kind": kind},
                    "storedVersions": [obj.pointer("/spec/versions/0/name").cloned().unwrap_or(json!("v1"))],
                });
            }
        }
    }

    fn is_crd(t: &Target<'_>) -> bool {
        t.rt.storage == StorageKey::new("apiextensions.k8s.io", "customresourcedefinitions")
    }

    /// POST.
    pub fn create(&self, t: &Target<'_>, mut body: Value) -> Result<Value, ApiError> {
        Self::check_type(t, &mut body)?;
        let mut s = self.lock();
        let ns = Self::check_namespace(&s, t, &mut body)?;
        if meta_str(&body, "resourceVersion").is_some_and(|r| !r.is_empty()) {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let name = match (
            meta_str(&body, "name").filter(|n| !n.is_empty()),
            meta_str(&body, "generateName"),
        ) {
            (Some(n), _) => n.to_string(),
            (None, Some(prefix)) => {
                let mut r = rand::rng();
                let suffix: String = (0..5)
                    .map(|_| NAME_CHARS[r.random_range(0..NAME_CHARS.len())] as char)
                    .collect();
                format!("{prefix}{suffix}")
            }
            (None, None) => {
                return Err(ApiError::invalid(
                    &t.rt.group,
                    &t.rt.kind,
                    "",
                    &[FieldCause {
                        reason: "FieldValueRequired",
                        field: "metadata.name".into(),
                        message: "Required value: name or generateName is required".into(),
                    }],
                ));
            }
        };
        set_meta(&mut body, "name", json!(name));
        if s.store.get(&t.rt.storage, &ns, &name).is_some() {
            return Err(ApiError::already_exists(&t.rt.group, &t.rt.plural, &name));
        }
        Self::validate(&s, t, &mut body, &name)?;
        set_meta(&mut body, "uid", json!(new_uid()));
        set_meta(&mut body, "creationTimestamp", json!(now_rfc3339()));
        if body.get("spec").is_some() && (t.rt.custom || t.rt.group == "apps") {
            set_meta(&mut body, "generation", json!(1));
        }
        match (t.rt.group.as_str(), t.rt.plural.as_str()) {
            ("", "pods") => body["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"}),
            ("", "namespaces") => {
                body["spec"] = json!({"finalizers": ["kubernetes"]});
                body["status"] = json!({"phase": "Active"});
                body["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            }
            _ => {}
        }
        if t.rt.custom
            && t.rt.subresources.iter().any(|x| x == "status")
            && let Some(m) = body.as_object_mut()
        {
            m.remove("status");
        }
        if Self::is_crd(t) {
            Self::crd_written(&mut s, &mut body);
        }
        let stored = s
            .store
            .commit(&t.rt.storage, &ns, &name, ChangeKind::Added, body);
        Ok(Self::present(t.rt, t.version, &stored))
    }

    /// PUT (main resource or `status` subresource). `create_on_missing` serves apply.
    pub fn update(
        &self,
        t: &Target<'_>,
        name: &str,
        mut body: Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        Self::check_type(t, &mut body)?;
        let mut s = self.lock();
        Self::update_locked(&mut s, t, name, body, status)
    }

    /// The update itself, under the lock (patch reads, patches and writes in one critical
    /// section, so it never loses a race, as kube-apiserver's GuaranteedUpdate retries).
    fn update_locked(
        s: &mut State,
        t: &Target<'_>,
        name: &str,
        mut body: Value,
        status: bool,
    ) -> Result<Value, ApiError> {
        let ns = Self::check_namespace(s, t, &mut body)?;
        match meta_str(&body, "name") {
            Some(n) if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            _ => set_meta(&mut body, "name", json!(name)),
        }
        let old = s
            .store
            .get(&t.rt.storage, &ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))?;
        if let Some(rv) = meta_str(&body, "resourceVersion").filter(|r| !r.is_empty())
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(&t.rt.group, &t.rt.plural, name));
        }
        let has_status_sub = t.rt.subresources.iter().any(|x| x == "status");
        let mut new = if status {
            let mut n = old.clone();
            n["status"] = body.get("status").cloned().unwrap_or(Value::Null);
            n
        } else {
            if has_status_sub {
                match old.get("status") {
                    Some(st) => body["status"] = st.clone(),
                    None => {
                        if let Some(m) = body.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            body
        };
        for f in ["uid", "creationTimestamp"] {
            if let Some(v) = old.pointer(&format!("/metadata/{f}")) {
                set_meta(&mut new, f, v.clone());
            }
        }
        if let Some(g) = old.pointer("/metadata/generation").and_then(Value::as_i64) {
            let bump = spec_part(&old) != spec_part(&new);
            set_meta(&mut new, "generation", json!(if bump { g + 1 } else { g }));
        }
        Self::validate(s, t, &mut new, name)?;
        if Self::is_crd(t) {
            Self::crd_written(s, &mut new);
        }
        if comparable(&new) == comparable(&old) {
            return Ok(Self::present(t.rt, t.version, &old));
        }
        let stored = s
            .store
            .commit(&t.rt.storage, &ns, name, ChangeKind::Modified, new);
        Ok(Self::present(t.rt, t.version, &stored))
    }

    /// PATCH in any of the four formats (apply creates a missing object).
    pub fn patch(
        &self,
        t: &Target<'_>,
        name: &str,
        kind: PatchType,
        body: &Value,
        status: bool,
        field_manager: Option<&str>,
    ) -> Result<Value, ApiError> {
        let ns = t.namespace.unwrap_or("");
        if kind == PatchType::Apply && field_manager.is_none_or(str::is_empty) {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "PatchOptions",
                "",
                &[FieldCause {
                    reason: "FieldValueRequired",
                    field: "fieldManager".into(),
                    message: "Required value: is required for apply patch".into(),
                }],
            ));
        }
        if kind == PatchType::Strategic && t.rt.custom {
            return Err(ApiError::unsupported_media_type(
                "application/strategic-merge-patch+json",
            ));
        }
        let mut s = self.lock();
        let current = s
            .store
            .get(&t.rt.storage, if t.rt.namespaced { ns } else { "" }, name)
            .cloned();
        let Some(current) = current else {
            drop(s);
            if kind == PatchType::Apply {
                let mut obj = body.clone();
                set_meta(&mut obj, "name", json!(name));
                return self.create(t, obj);
            }
            return Err(ApiError::not_found(&t.rt.group, &t.rt.plural, name));
        };
        let mut doc = Self::present(t.rt, t.version, &current);
        match kind {
            PatchType::Merge | PatchType::Apply => patch::merge_patch(&mut doc, body),
            PatchType::Strategic => patch::strategic_merge_patch(&mut doc, body)?,
            PatchType::Json => patch::json_patch(&mut doc, body)?,
        }
        // The result carries the current resourceVersion unless the patch set one (then it is a
        // precondition, checked by the update).
        Self::check_type(t, &mut doc)?;
        Self::update_locked(&mut s, t, name, doc, status)
    }

    /// DELETE one object. Pods answer with the deleted object, the others with a Success Status.
    pub fn delete(
        &self,
        t: &Target<'_>,
        name: &str,
        preconditions: Option<&Value>,
    ) -> Result<Value, ApiError> {
        let mut s = self.lock();
        let ns = if t.rt.namespaced {
            t.namespace.unwrap_or("")
        } else {
            ""
        };
        let old = s
            .store
            .get(&t.rt.storage, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, name))?;
        if let Some(p) = preconditions {
            let rv = p.get("resourceVersion").and_then(Value::as_str);
            let uid = p.get("uid").and_then(Value::as_str);
            if rv.is_some_and(|r| Some(r) != meta_str(&old, "resourceVersion"))
                || uid.is_some_and(|u| Some(u) != meta_str(&old, "uid"))
            {
                return Err(ApiError::conflict(&t.rt.group, &t.rt.plural, name));
            }
        }
        let deleted = Self::delete_locked(&mut s, &t.rt.storage, ns, name, old);
        if (t.rt.group.as_str(), t.rt.plural.as_str()) == ("", "pods") {
            return Ok(Self::present(t.rt, t.version, &deleted));
        }
        Ok(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "group": t.rt.group, "kind": t.rt.plural, "uid": meta_str(&deleted, "uid")},
        }))
    }

    fn delete_locked(s: &mut State, key: &StorageKey, ns: &str, name: &str, old: Value) -> Value {
        // Cascades: a namespace takes its objects, a CRD its custom resources and its type.
        if *key == StorageKey::new("", "namespaces") {
            let keys: Vec<StorageKey> = s
                .catalog
                .types()
                .iter()
                .filter(|t| t.namespaced)
                .map(|t| t.storage.clone())
                .collect();
            for k in keys {
                let victims: Vec<(String, Value)> = s
                    .store
                    .list(&k, Some(name))
                    .map(|o| (meta_str(o, "name").unwrap_or("").to_string(), o.clone()))
                    .collect();
                for (n, o) in victims {
                    s.store.commit(&k, name, &n, ChangeKind::Deleted, o);
                }
            }
        }
        if key.group == "apiextensions.k8s.io"
            && let Ok(rt) = ResourceType::from_crd(&old)
        {
            let victims: Vec<(String, String, Value)> = s
                .store
                .list(&rt.storage, None)
                .map(|o| {
                    (
                        meta_str(o, "namespace").unwrap_or("").to_string(),
                        meta_str(o, "name").unwrap_or("").to_string(),
                        o.clone(),
                    )
                })
                .collect();
            for (n, nm, o) in victims {
                s.store.commit(&rt.storage, &n, &nm, ChangeKind::Deleted, o);
            }
            s.catalog.unregister(&rt.group, &rt.plural);
        }
        s.store.commit(key, ns, name, ChangeKind::Deleted, old)
    }

    /// DELETE on a collection: every object matching the selectors; answers the list of them.
    pub fn delete_collection(&self, t: &Target<'_>, opts: &ListOptions) -> Result<Value, ApiError> {
        let list = self.list(
            t,
            &ListOptions {
                labels: opts.labels.clone(),
                fields: opts.fields.clone(),
                ..Default::default()
            },
        )?;
        let mut s = self.lock();
        let mut items = Vec::new();
        for item in list["items"].as_array().into_iter().flatten() {
            let ns = meta_str(item, "namespace").unwrap_or("").to_string();
            let name = meta_str(item, "name").unwrap_or("").to_string();
            if let Some(old) = s.store.get(&t.rt.storage, &ns, &name).cloned() {
                items.push(Self::delete_locked(&mut s, &t.rt.storage, &ns, &name, old));
            }
        }
        Ok(
            json!({"apiVersion": t.rt.api_version(t.version), "kind": format!("{}List", t.rt.kind),
                   "metadata": {"resourceVersion": s.store.rv().to_string()}, "items": items}),
        )
    }

    /// Creates or replaces every object of a multi-document YAML (as `kubectl apply` would,
    /// but as admin and without the last-applied annotation). Unknown kinds are an error.
    pub fn apply_yaml(&self, text: &str) -> Result<Vec<Value>, ApiError> {
        let mut out = Vec::new();
        for doc in parse_yaml_documents(text)? {
            out.push(self.apply_object(doc)?);
        }
        Ok(out)
    }

    /// Creates `obj`, or updates it in place if it exists.
    pub fn apply_object(&self, obj: Value) -> Result<Value, ApiError> {
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let (rt, version) = self
            .lock()
            .catalog
            .find_kind(&av, &kind)
            .map(|(t, v)| (t.clone(), v))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "no matches for kind \"{kind}\" in version \"{av}\""
                ))
            })?;
        let ns = if rt.namespaced {
            Some(meta_str(&obj, "namespace").unwrap_or("default").to_string())
        } else {
            None
        };
        let name = meta_str(&obj, "name").unwrap_or("").to_string();
        let t = Target {
            rt: &rt,
            version: &version,
            namespace: ns.as_deref(),
        };
        match self.create(&t, obj.clone()) {
            Err(e) if e.reason == "AlreadyExists" => {
                let mut o = obj;
                if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                let r = self.update(&t, &name, o.clone(), false)?;
                if o.get("status").is_some() && rt.subresources.iter().any(|s| s == "status") {
                    return self.update(&t, &name, o, true);
                }
                Ok(r)
            }
            Ok(created) => {
                // Status given in a manifest (nodes, pods): written through the status subresource.
                if obj.get("status").is_some()
                    && rt.subresources.iter().any(|s| s == "status")
                    && created.get("status") != obj.get("status")
                {
                    let mut o = obj;
                    set_meta(&mut o, "resourceVersion", json!(""));
                    return self.update(&t, &name, o, true);
                }
                Ok(created)
            }
            Err(e) => Err(e),
        }
    }
}

/// Parses multi-document YAML (or JSON) into objects, skipping empty documents.
pub fn parse_yaml_documents(text: &str) -> Result<Vec<Value>, ApiError> {
    use serde::Deserialize as _;
    let mut out = Vec::new();
    for de in serde_yaml::Deserializer::from_str(text) {
        let v = Value::deserialize(de)
            .map_err(|e| ApiError::bad_request(format!("invalid YAML: {e}")))?;
        if v.is_object() {
            out.push(v);
        }
    }
    Ok(out)
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let raw = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}\u{0}")});
    base64::engine::general_purpose::STANDARD.encode(raw.to_string())
}

fn decode_continue(tok: &str) -> Result<(u64, String, String), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(tok)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v
        .get("start")
        .and_then(Value::as_str)
        .ok_or_else(bad)?
        .trim_end_matches('\u{0}');
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    Ok((rv, ns.to_string(), name.to_string()))
}
