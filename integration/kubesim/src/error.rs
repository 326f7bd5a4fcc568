//! `ApiError`: every refusal the simulated API server gives, and its one translation into a
//! Kubernetes `Status` object (code, reason, message, details) as kube-apiserver writes them.
//! Owns no HTTP plumbing beyond building the response.

use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A Kubernetes API error (`metav1.Status` with `status: Failure`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// `pods "x" not found` (404, NotFound).
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(details(group, resource, name))
    }

    /// `pods "x" already exists` (409, AlreadyExists).
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(details(group, resource, name))
    }

    /// Optimistic-concurrency failure (409, Conflict).
    pub fn conflict(group: &str, resource: &str, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(group, resource)
            ),
        )
        .with_details(details(group, resource, name))
    }

    /// 422 Invalid with field causes, e.g. `ENIConfig.crd.k8s.amazonaws.com "a" is invalid: spec.subnet: Required value`.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[FieldCause]) -> Self {
        let qkind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let causes_json: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        Self::new(
            422,
            "Invalid",
            format!("{qkind} \"{name}\" is invalid: {joined}"),
        )
        .with_details(json!({"name": name, "group": group, "kind": kind, "causes": causes_json}))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 with kube-apiserver's wording for resource requests.
    pub fn forbidden(
        user: &str,
        verb: &str,
        group: &str,
        resource: &str,
        sub: Option<&str>,
        ns: Option<&str>,
        name: Option<&str>,
    ) -> Self {
        let res = match sub {
            Some(s) => format!("{resource}/{s}"),
            None => resource.to_string(),
        };
        let head = match name {
            Some(n) => format!("{} \"{n}\" is forbidden", qualified(group, resource)),
            None => format!("{} is forbidden", qualified(group, resource)),
        };
        let scope = match ns {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        Self::new(
            403,
            "Forbidden",
            format!("{head}: User \"{user}\" cannot {verb} resource \"{res}\" in API group \"{group}\" {scope}"),
        )
        .with_details(json!({"name": name.unwrap_or(""), "group": group, "kind": resource}))
    }

    /// 403 for a non-resource URL.
    pub fn forbidden_path(user: &str, verb: &str, path: &str) -> Self {
        Self::new(
            403,
            "Forbidden",
            format!("forbidden: User \"{user}\" cannot {verb} path \"{path}\""),
        )
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {ct}"
            ),
        )
    }

    /// 410 Expired: a watch or continue from a resourceVersion the history no longer holds.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 504 Timeout with cause ResourceVersionTooLarge: a resourceVersion the server has not
    /// reached (client-go relists on it).
    pub fn too_large_resource_version(asked: u64, current: u64) -> Self {
        Self::new(504, "Timeout", format!("Too large resource version: {asked}, current: {current}")).with_details(
            json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = http::StatusCode::from_u16(self.code)
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.status()).unwrap_or_default();
        let mut resp = (status, body).into_response();
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// One field error of a 422.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldCause {
    /// `FieldValueRequired`, `FieldValueTypeInvalid`, `FieldValueInvalid`, `FieldValueNotSupported`.
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

fn details(group: &str, resource: &str, name: &str) -> Value {
    json!({"name": name, "group": group, "kind": resource})
}
