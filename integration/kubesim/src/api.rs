//! The HTTP face of the simulator: request → (latency/outage knobs) → authentication (bearer
//! tokens) → request info (kube-apiserver's path grammar) → RBAC → the operation on `Cluster`;
//! discovery documents, Table output for kubectl, watch streams (replay from a resourceVersion,
//! selectors, bookmarks, timeouts, 410 as an ERROR event) and the control API under
//! `/_kubesim/`. Owns no state; decides no storage rules. Table output lives in `table.rs`,
//! watch streams in `watch_stream.rs`, the control API in `control.rs`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, header};
use serde_json::{Value, json};

use crate::catalog::ResourceType;
use crate::cluster::{AuditEntry, Cluster, ListOptions, Outage, PatchType, Target};
use crate::control::control;
use crate::error::ApiError;
use crate::proxy;
use crate::rbac::{Attributes, UserInfo};
use crate::selector::{FieldSelector, LabelSelector};
use crate::table::{to_table, wants_table};
use crate::watch_stream::{serve_watch, wait_for_resource_version};

/// What the handlers share.
#[derive(Debug)]
pub struct Ctx {
    pub cluster: Arc<Cluster>,
    pub admin_token: String,
    /// host:port clients reach (for `/api`'s serverAddressByClientCIDRs).
    pub server_address: String,
}

/// The API server's router (all paths go through one handler that parses them as
/// kube-apiserver does).
pub fn router(ctx: Arc<Ctx>) -> Router {
    Router::new().fallback(handle).with_state(ctx)
}

const MAX_BODY: usize = 16 << 20;

pub(crate) fn json_response(code: StatusCode, v: &Value) -> Response {
    let mut r = (code, serde_json::to_vec(v).unwrap_or_default()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

pub(crate) fn ok(v: &Value) -> Response {
    json_response(StatusCode::OK, v)
}

/// Query string → (key, value) pairs, percent-decoded.
pub fn parse_query(q: Option<&str>) -> Vec<(String, String)> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(x) => {
                    out.push(x);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn q<'a>(query: &'a [(String, String)], key: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

pub(crate) fn truthy(v: Option<&str>) -> bool {
    matches!(v, Some("true" | "1"))
}

/// Where a resource request points (kube-apiserver's RequestInfo).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// What follows `/proxy/` for the proxy subresource.
    pub rest: String,
    /// The legacy `/watch/` prefix.
    pub legacy_watch: bool,
}

/// Parses `/api/v1/...` and `/apis/<g>/<v>/...`; `None` for non-resource paths.
pub fn parse_resource_path(path: &str) -> Option<ResourcePath> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => (String::new(), v.to_string(), rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (g.to_string(), v.to_string(), rest),
        _ => return None,
    };
    let (legacy_watch, rest) = match rest {
        ["watch", r @ ..] if !r.is_empty() => (true, r),
        r => (false, r),
    };
    if rest.iter().any(|s| s.is_empty()) && !rest.contains(&"proxy") {
        return None;
    }
    let mk =
        |plural: &str, ns: Option<&str>, name: Option<&str>, sub: Option<&str>, tail: &[&str]| {
            ResourcePath {
                group: group.clone(),
                version: version.clone(),
                plural: plural.to_string(),
                namespace: ns.map(str::to_string),
                name: name.map(str::to_string),
                subresource: sub.map(str::to_string),
                rest: tail.join("/"),
                legacy_watch,
            }
        };
    Some(match rest {
        ["namespaces"] => mk("namespaces", None, None, None, &[]),
        ["namespaces", ns] => mk("namespaces", None, Some(ns), None, &[]),
        ["namespaces", ns, sub @ ("status" | "finalize")] => {
            mk("namespaces", None, Some(ns), Some(sub), &[])
        }
        ["namespaces", ns, plural] => mk(plural, Some(ns), None, None, &[]),
        ["namespaces", ns, plural, name] => mk(plural, Some(ns), Some(name), None, &[]),
        ["namespaces", ns, plural, name, sub, tail @ ..] => {
            mk(plural, Some(ns), Some(name), Some(sub), tail)
        }
        [plural] => mk(plural, None, None, None, &[]),
        [plural, name] => mk(plural, None, Some(name), None, &[]),
        [plural, name, sub, tail @ ..] => mk(plural, None, Some(name), Some(sub), tail),
        _ => return None,
    })
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, tok) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(tok.trim())
}

async fn handle(State(ctx): State<Arc<Ctx>>, req: Request) -> Response {
    let latency = ctx.cluster.knobs().latency_ms;
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    if let Some((_, Outage::Unavailable503)) = ctx.cluster.outage() {
        return ApiError::unavailable("the server is currently unable to handle the request")
            .into_response();
    }
    match serve(&ctx, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn authenticate(ctx: &Ctx, headers: &HeaderMap) -> Result<UserInfo, ApiError> {
    match bearer(headers) {
        None => Ok(UserInfo::anonymous()),
        Some(t) if t == ctx.admin_token => Ok(admin_user()),
        Some(t) => ctx.cluster.user_for(t).ok_or_else(ApiError::unauthorized),
    }
}

/// The admin identity (`system:masters` bypasses RBAC, as on a real cluster).
pub fn admin_user() -> UserInfo {
    UserInfo {
        name: "kubesim-admin".into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
    }
}

pub(crate) async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))
}

pub(crate) fn parse_json(b: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(b).map_err(|e| {
        ApiError::bad_request(format!("the body of the request is not valid JSON: {e}"))
    })
}

async fn serve(ctx: &Arc<Ctx>, req: Request) -> Result<Response, ApiError> {
    let path = req.uri().path().to_string();
    let query = parse_query(req.uri().query());
    let user = authenticate(ctx, req.headers())?;
    if let Some(ctl) = path.strip_prefix("/_kubesim/") {
        if user.name != admin_user().name {
            return Err(ApiError::forbidden_path(&user.name, "use", &path));
        }
        let ctl = ctl.to_string();
        return control(ctx, &ctl, req).await;
    }
    let Some(rp) = parse_resource_path(&path) else {
        let verb = method_verb(req.method());
        if !ctx.cluster.authorize(
            &user,
            &Attributes::NonResource {
                verb: verb.into(),
                path: path.clone(),
            },
        ) {
            return Err(ApiError::forbidden_path(&user.name, verb, &path));
        }
        return non_resource(ctx, &path);
    };
    let rt = ctx.cluster.resource(&rp.group, &rp.version, &rp.plural)?;
    if rt.namespaced != rp.namespace.is_some()
        && !(rt.namespaced && rp.namespace.is_none() && rp.name.is_none())
    {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    if let Some(sub) = &rp.subresource
        && !rt.subresources.contains(sub)
    {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    let watch = rp.legacy_watch || truthy(q(&query, "watch"));
    let verb = match (
        req.method().clone(),
        rp.name.is_some(),
        rp.subresource.as_deref(),
    ) {
        (m, _, Some("proxy")) => method_verb(&m),
        (Method::GET, false, _) if watch => "watch",
        (Method::GET, true, _) if watch => "watch",
        (Method::GET, false, _) => "list",
        (Method::GET, true, _) => "get",
        (Method::POST, _, _) => "create",
        (Method::PUT, true, _) => "update",
        (Method::PATCH, true, _) => "patch",
        (Method::DELETE, true, _) => "delete",
        (Method::DELETE, false, _) => "deletecollection",
        (m, _, _) => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource: {m}"
            )));
        }
    };
    // Strip the `:port` (and scheme) from a proxied pod name.
    let (name, proxy_port) = match (&rp.name, rp.subresource.as_deref()) {
        (Some(n), Some("proxy")) => proxy::split_name_port(n),
        (n, _) => (n.clone(), None),
    };
    // As the API server's RequestInfo: a list or watch whose field selector requires
    // `metadata.name` is authorized for that name (RBAC `resourceNames` then admit it).
    let authorized_name = match (&name, verb) {
        (None, "list" | "watch") => q(&query, "fieldSelector").and_then(selected_name),
        _ => name.clone(),
    };
    let attrs = Attributes::Resource {
        verb: verb.into(),
        group: rp.group.clone(),
        resource: rp.plural.clone(),
        subresource: rp.subresource.clone(),
        namespace: rp.namespace.clone(),
        name: authorized_name,
    };
    if !ctx.cluster.authorize(&user, &attrs) {
        ctx.cluster.record(AuditEntry::new(&user.name, &attrs, 403));
        return Err(ApiError::forbidden(
            &user.name,
            verb,
            &rp.group,
            &rp.plural,
            rp.subresource.as_deref(),
            rp.namespace.as_deref(),
            name.as_deref(),
        ));
    }
    let t = Target {
        rt: &rt,
        version: &rp.version,
        namespace: rp.namespace.as_deref(),
    };
    let table = wants_table(req.headers());
    let include = q(&query, "includeObject").unwrap_or("Metadata").to_string();
    let status_sub = rp.subresource.as_deref() == Some("status");
    let user_name = user.name.clone();
    let result = async {
    match (verb, rp.subresource.as_deref()) {
        (_, Some("proxy")) => {
            let name = name.unwrap_or_default();
            let pod = ctx.cluster.get(&t, &name)?;
            let ns = rp.namespace.clone().unwrap_or_default();
            let target = proxy::resolve(&ctx.cluster, &ns, &name, &pod, proxy_port)?;
            proxy::forward(target, &rp.rest, req).await
        }
        ("create", Some("token")) => {
            let name = name.unwrap_or_default();
            ctx.cluster.get(&t, &name)?;
            let ns = rp.namespace.clone().unwrap_or_default();
            let token = ctx.cluster.issue_service_account_token(&ns, &name)?;
            let body = read_body(req.into_body()).await?;
            let spec = if body.is_empty() {
                json!({})
            } else {
                parse_json(&body)?.get("spec").cloned().unwrap_or(json!({}))
            };
            let exp = time::OffsetDateTime::from(SystemTime::now() + Duration::from_secs(3600));
            Ok(json_response(
                StatusCode::CREATED,
                &json!({
                    "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": spec,
                    "status": {"token": token, "expirationTimestamp": format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", exp.year(), u8::from(exp.month()), exp.day(), exp.hour(), exp.minute(), exp.second())},
                }),
            ))
        }
        ("create", _) if rt.plural == "selfsubjectaccessreviews" => {
            let body = parse_json(&read_body(req.into_body()).await?)?;
            let spec = body.get("spec").cloned().unwrap_or(json!({}));
            let allowed = match (
                spec.get("resourceAttributes"),
                spec.get("nonResourceAttributes"),
            ) {
                (Some(r), _) => {
                    let s = |k: &str| {
                        r.get(k)
                            .and_then(Value::as_str)
                            .filter(|v| !v.is_empty())
                            .map(str::to_string)
                    };
                    ctx.cluster.authorize(
                        &user,
                        &Attributes::Resource {
                            verb: s("verb").unwrap_or_default(),
                            group: s("group").unwrap_or_default(),
                            resource: s("resource").unwrap_or_default(),
                            subresource: s("subresource"),
                            namespace: s("namespace"),
                            name: s("name"),
                        },
                    )
                }
                (None, Some(n)) => {
                    let s = |k: &str| n.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    ctx.cluster.authorize(
                        &user,
                        &Attributes::NonResource {
                            verb: s("verb"),
                            path: s("path"),
                        },
                    )
                }
                (None, None) => {
                    return Err(ApiError::bad_request(
                        "spec.resourceAttributes or spec.nonResourceAttributes is required",
                    ));
                }
            };
            Ok(json_response(
                StatusCode::CREATED,
                &json!({
                    "kind": "SelfSubjectAccessReview", "apiVersion": rt.api_version(&rp.version),
                    "metadata": {"creationTimestamp": null}, "spec": spec, "status": {"allowed": allowed},
                }),
            ))
        }
        ("get", _) => {
            let o = ctx.cluster.get(&t, name.as_deref().unwrap_or(""))?;
            if table {
                let rv = o
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or(json!(""));
                return Ok(ok(&to_table(&rt, std::slice::from_ref(&o), rv, &include)));
            }
            Ok(ok(&o))
        }
        ("list", _) => {
            let opts = list_options(&rt, &query)?;
            wait_for_resource_version(&ctx.cluster, &query).await?;
            let list = ctx.cluster.list(&t, &opts)?;
            if table {
                let items: Vec<Value> = list["items"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|i| Cluster::present(&rt, &rp.version, &i))
                    .collect();
                let mut tbl = to_table(
                    &rt,
                    &items,
                    list["metadata"]["resourceVersion"].clone(),
                    &include,
                );
                if let Some(c) = list["metadata"].get("continue") {
                    tbl["metadata"]["continue"] = c.clone();
                }
                return Ok(ok(&tbl));
            }
            Ok(ok(&list))
        }
        ("watch", _) => {
            let mut opts = list_options(&rt, &query)?;
            let too_large = wait_for_resource_version(&ctx.cluster, &query).await.err();
            if let Some(n) = &name {
                opts.fields =
                    FieldSelector::parse(&format!("metadata.name={n}"), &rt.group, &rt.plural)?;
            }
            serve_watch(
                ctx,
                rt.clone(),
                rp.version.clone(),
                rp.namespace.clone(),
                opts,
                &query,
                too_large,
                table,
                include,
            )
        }
        ("create", _) => {
            let body = parse_json(&read_body(req.into_body()).await?)?;
            Ok(json_response(
                StatusCode::CREATED,
                &ctx.cluster.create(&t, body)?,
            ))
        }
        ("update", _) => {
            let body = parse_json(&read_body(req.into_body()).await?)?;
            Ok(ok(&ctx.cluster.update(
                &t,
                name.as_deref().unwrap_or(""),
                body,
                status_sub,
            )?))
        }
        ("patch", _) => {
            let ct = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let kind = PatchType::from_content_type(&ct)
                .ok_or_else(|| ApiError::unsupported_media_type(&ct))?;
            let raw = read_body(req.into_body()).await?;
            let body = if kind == PatchType::Apply {
                let text = std::str::from_utf8(&raw)
                    .map_err(|_| ApiError::bad_request("apply body is not UTF-8"))?;
                crate::cluster::parse_yaml_documents(text)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| ApiError::bad_request("empty apply body"))?
            } else {
                parse_json(&raw)?
            };
            let name = name.unwrap_or_default();
            let existed = ctx.cluster.get(&t, &name).is_ok();
            let out = ctx.cluster.patch(
                &t,
                &name,
                kind,
                &body,
                status_sub,
                q(&query, "fieldManager"),
            )?;
            let code = if existed {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            Ok(json_response(code, &out))
        }
        ("delete", _) => {
            let raw = read_body(req.into_body()).await?;
            let opts = if raw.is_empty() {
                None
            } else {
                Some(parse_json(&raw)?)
            };
            let pre = opts.as_ref().and_then(|o| o.get("preconditions"));
            Ok(ok(&ctx.cluster.delete(
                &t,
                name.as_deref().unwrap_or(""),
                pre,
            )?))
        }
        ("deletecollection", _) => {
            let opts = list_options(&rt, &query)?;
            Ok(ok(&ctx.cluster.delete_collection(&t, &opts)?))
        }
        _ => Err(ApiError::method_not_allowed("unsupported")),
    }
    }
    .await;
    let code = match &result {
        Ok(r) => r.status().as_u16(),
        Err(e) => e.code,
    };
    ctx.cluster
        .record(AuditEntry::new(&user_name, &attrs, code));
    result
}

/// The name a field selector requires exactly (`metadata.name=x` or `==x`, alone or among
/// other terms), as `fields.Selector.RequiresExactMatch("metadata.name")`.
fn selected_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let (k, v) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .filter(|(k, _)| !k.ends_with('!'))?;
        (k.trim() == "metadata.name" && !v.is_empty()).then(|| v.trim().to_owned())
    })
}

fn method_verb(m: &Method) -> &'static str {
    match *m {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "unknown",
    }
}

fn list_options(rt: &ResourceType, query: &[(String, String)]) -> Result<ListOptions, ApiError> {
    Ok(ListOptions {
        labels: LabelSelector::parse(q(query, "labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(
            q(query, "fieldSelector").unwrap_or(""),
            &rt.group,
            &rt.plural,
        )?,
        limit: q(query, "limit").and_then(|l| l.parse().ok()),
        continue_token: q(query, "continue")
            .filter(|c| !c.is_empty())
            .map(str::to_string),
    })
}

fn non_resource(ctx: &Ctx, path: &str) -> Result<Response, ApiError> {
    let catalog = ctx.cluster.catalog();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let nf = || {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let v = match segs.as_slice() {
        ["api"] => catalog.core_versions(&ctx.server_address),
        ["api", v] => catalog.resource_list("", v).ok_or_else(nf)?,
        ["apis"] => catalog.group_list(),
        ["apis", g] => catalog.group(g).ok_or_else(nf)?,
        ["apis", g, v] => catalog.resource_list(g, v).ok_or_else(nf)?,
        ["version"] => json!({
            "major": "1", "minor": "30", "gitVersion": "v1.30.0-kubesim", "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean", "buildDate": "2024-04-17T00:00:00Z", "goVersion": "go1.22.2", "compiler": "gc", "platform": "linux/amd64",
        }),
        ["healthz" | "livez" | "readyz"] => {
            let mut r = (StatusCode::OK, "ok").into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            return Ok(r);
        }
        _ => return Err(nf()),
    };
    Ok(ok(&v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_grammar() {
        let p = parse_resource_path(
            "/api/v1/namespaces/kube-system/pods/aws-node-1:61678/proxy/metrics",
        )
        .unwrap();
        assert_eq!(
            (
                p.plural.as_str(),
                p.namespace.as_deref(),
                p.name.as_deref(),
                p.subresource.as_deref(),
                p.rest.as_str()
            ),
            (
                "pods",
                Some("kube-system"),
                Some("aws-node-1:61678"),
                Some("proxy"),
                "metrics"
            )
        );
        let p = parse_resource_path("/api/v1/namespaces/default").unwrap();
        assert_eq!(
            (p.plural.as_str(), p.name.as_deref(), p.namespace),
            ("namespaces", Some("default"), None)
        );
        let p = parse_resource_path("/apis/crd.k8s.amazonaws.com/v1alpha1/eniconfigs/a").unwrap();
        assert_eq!(
            (p.group.as_str(), p.plural.as_str(), p.name.as_deref()),
            ("crd.k8s.amazonaws.com", "eniconfigs", Some("a"))
        );
        let p = parse_resource_path("/api/v1/watch/namespaces/default/pods").unwrap();
        assert!(p.legacy_watch);
        assert_eq!(p.namespace.as_deref(), Some("default"));
        assert!(parse_resource_path("/api/v1").is_none());
        assert!(parse_resource_path("/apis/apps/v1").is_none());
    }

    #[test]
    fn a_name_field_selector_names_a_list_or_watch() {
        assert_eq!(selected_name("metadata.name=inv"), Some("inv".into()));
        assert_eq!(selected_name("a=b,metadata.name==inv"), Some("inv".into()));
        assert_eq!(selected_name("metadata.name!=inv"), None);
        assert_eq!(selected_name("metadata.namespace=x"), None);
    }

    #[test]
    fn query_decoding() {
        let v = parse_query(Some("labelSelector=a%3Db%2Cc+in+%28x%29&watch=1"));
        assert_eq!(v[0], ("labelSelector".into(), "a=b,c in (x)".into()));
        assert_eq!(v[1], ("watch".into(), "1".into()));
    }
}
