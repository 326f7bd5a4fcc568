//! Table output (`application/json;as=Table;g=meta.k8s.io;v=v1`, what `kubectl get` asks for):
//! whether a request wants it, and the Table of some objects. Owns no state.

use std::time::SystemTime;

use http::{HeaderMap, header};
use serde_json::{Value, json};

use crate::catalog::ResourceType;

pub fn wants_table(h: &HeaderMap) -> bool {
    h.get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|a| {
            a.split(',')
                .next()
                .is_some_and(|first| first.contains("as=Table"))
        })
}

fn age(created: Option<&str>) -> String {
    let Some(c) = created.and_then(|c| {
        time::OffsetDateTime::parse(c, &time::format_description::well_known::Rfc3339).ok()
    }) else {
        return "<unknown>".into();
    };
    let secs = (time::OffsetDateTime::from(SystemTime::now()) - c)
        .whole_seconds()
        .max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// A `meta.k8s.io/v1` Table (what `kubectl get` asks for): Name and Age columns, plus the
/// object as `includeObject` says (Metadata by default).
pub fn to_table(rt: &ResourceType, items: &[Value], rv: Value, include: &str) -> Value {
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let name = o.pointer("/metadata/name").cloned().unwrap_or(json!(""));
            let mut row = json!({"cells": [name, age(o.pointer("/metadata/creationTimestamp").and_then(Value::as_str))]});
            match include {
                "None" => {}
                "Object" => row["object"] = o.clone(),
                _ => row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}),
            }
            row
        })
        .collect();
    let _ = rt;
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0},
        ],
        "rows": rows,
    })
}
