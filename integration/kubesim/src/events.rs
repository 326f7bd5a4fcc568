//! events.k8s.io/v1 ↔ core/v1 Event: validation of an events.k8s.io/v1 object on create/update
//! (the fields kube-apiserver requires) and the conversions between the two versions the
//! store keeps one of. Pure functions; owns no state.

use serde_json::{Value, json};

use crate::cluster::meta_str;
use crate::error::{ApiError, FieldCause};

/// events.k8s.io/v1 validation on create/update (the fields kube-apiserver requires).
pub(crate) fn validate_events_v1(ev: &Value) -> Result<(), ApiError> {
    let name = meta_str(ev, "name").unwrap_or("");
    let mut causes = Vec::new();
    let req = |f: &str| {
        ev.get(f)
            .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
    };
    for f in [
        "eventTime",
        "reportingController",
        "reportingInstance",
        "action",
        "reason",
    ] {
        if req(f) {
            causes.push(FieldCause {
                reason: "FieldValueRequired",
                field: f.into(),
                message: "Required value".into(),
            });
        }
    }
    match ev.get("type").and_then(Value::as_str) {
        Some("Normal" | "Warning") => {}
        other => causes.push(FieldCause {
            reason: "FieldValueInvalid",
            field: "type".into(),
            message: format!(
                "Invalid value: {:?}: has invalid value: {}",
                other.unwrap_or(""),
                other.unwrap_or("")
            ),
        }),
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("events.k8s.io", "Event", name, &causes))
    }
}

const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];
const EVENT_SAME: &[&str] = &[
    "metadata",
    "eventTime",
    "series",
    "reportingInstance",
    "action",
    "reason",
    "related",
    "type",
];

pub(crate) fn events_v1_to_core(ev: &Value) -> Value {
    let mut out = json!({"apiVersion": "v1", "kind": "Event"});
    for f in EVENT_SAME {
        if let Some(v) = ev.get(*f) {
            out[*f] = v.clone();
        }
    }
    for (new, old) in EVENT_FIELDS {
        if let Some(v) = ev.get(*new) {
            out[*old] = v.clone();
        }
    }
    out
}

pub(crate) fn core_to_events_v1(ev: &Value) -> Value {
    let mut out = json!({});
    for f in EVENT_SAME {
        if let Some(v) = ev.get(*f) {
            out[*f] = v.clone();
        }
    }
    for (new, old) in EVENT_FIELDS {
        if let Some(v) = ev.get(*old) {
            out[*new] = v.clone();
        }
    }
    out
}
