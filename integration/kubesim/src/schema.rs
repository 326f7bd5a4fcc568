//! Validation of custom resources against a CRD version's `openAPIV3Schema`, and pruning of
//! unknown fields, as kube-apiserver does for structural schemas: `type`, `required`,
//! `properties`, `items`, `additionalProperties`, `enum`, `nullable`, min/max (length, items,
//! value), `x-kubernetes-preserve-unknown-fields`, `x-kubernetes-int-or-string`. Pure.
//! Not covered: `pattern`, `format`, CEL `x-kubernetes-validations`, defaults.

use serde_json::{Map, Value};

use crate::error::FieldCause;

/// Validates `obj` (a whole custom resource) against `schema`; returns every field error.
/// `metadata`, `apiVersion` and `kind` are the server's business and skipped, as upstream does.
pub fn validate(schema: &Value, obj: &Value) -> Vec<FieldCause> {
    let mut causes = Vec::new();
    if let (Some(props), Value::Object(o)) = (schema.get("properties"), obj) {
        for (k, v) in o {
            if matches!(k.as_str(), "metadata" | "apiVersion" | "kind") {
                continue;
            }
            if let Some(s) = props.get(k) {
                check(s, v, k, &mut causes);
            }
        }
        required(schema, o, "", &mut causes);
    }
    causes
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

fn required(schema: &Value, o: &Map<String, Value>, path: &str, causes: &mut Vec<FieldCause>) {
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(r) = r.as_str()
            && !o.contains_key(r)
        {
            causes.push(FieldCause {
                reason: "FieldValueRequired",
                field: join(path, r),
                message: "Required value".into(),
            });
        }
    }
}

fn check(schema: &Value, v: &Value, path: &str, causes: &mut Vec<FieldCause>) {
    if v.is_null() {
        if schema.get("nullable").and_then(Value::as_bool) != Some(true) {
            // kube-apiserver drops nulls for non-nullable fields during pruning/defaulting;
            // a null where a type is required is a type error.
            if let Some(t) = schema.get("type").and_then(Value::as_str) {
                causes.push(type_error(path, t, v));
            }
        }
        return;
    }
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true);
    if int_or_string {
        if !matches!(type_name(v), "integer" | "string") {
            causes.push(FieldCause { reason: "FieldValueTypeInvalid", field: path.into(), message: format!("Invalid value: \"{}\": {path} in body must be of type integer-or-string: \"{}\"", type_name(v), type_name(v)) });
        }
        return;
    }
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let actual = type_name(v);
        let ok = actual == t || (t == "number" && actual == "integer");
        if !ok {
            causes.push(type_error(path, t, v));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
        causes.push(FieldCause {
            reason: "FieldValueNotSupported",
            field: path.into(),
            message: format!(
                "Unsupported value: {v}: supported values: {}",
                list.join(", ")
            ),
        });
    }
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    match v {
        Value::String(s) => {
            let n = s.chars().count() as f64;
            if num("minLength").is_some_and(|m| n < m) {
                causes.push(invalid(
                    path,
                    v,
                    &format!(
                        "{path} in body should be at least {} chars long",
                        num("minLength").unwrap_or(0.0)
                    ),
                ));
            }
            if num("maxLength").is_some_and(|m| n > m) {
                causes.push(FieldCause {
                    reason: "FieldValueTooLong",
                    field: path.into(),
                    message: format!(
                        "Too long: may not be longer than {}",
                        num("maxLength").unwrap_or(0.0)
                    ),
                });
            }
        }
        Value::Number(x) => {
            let x = x.as_f64().unwrap_or(0.0);
            if num("minimum").is_some_and(|m| x < m) {
                causes.push(invalid(
                    path,
                    v,
                    &format!(
                        "{path} in body should be greater than or equal to {}",
                        num("minimum").unwrap_or(0.0)
                    ),
                ));
            }
            if num("maximum").is_some_and(|m| x > m) {
                causes.push(invalid(
                    path,
                    v,
                    &format!(
                        "{path} in body should be less than or equal to {}",
                        num("maximum").unwrap_or(0.0)
                    ),
                ));
            }
        }
        Value::Array(items) => {
            let n = items.len() as f64;
            if num("minItems").is_some_and(|m| n < m) {
                causes.push(invalid(
                    path,
                    v,
                    &format!(
                        "{path} in body should have at least {} items",
                        num("minItems").unwrap_or(0.0)
                    ),
                ));
            }
            if num("maxItems").is_some_and(|m| n > m) {
                causes.push(FieldCause {
                    reason: "FieldValueTooMany",
                    field: path.into(),
                    message: format!(
                        "Too many: {}: must have at most {} items",
                        items.len(),
                        num("maxItems").unwrap_or(0.0)
                    ),
                });
            }
            if let Some(is) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(is, item, &format!("{path}[{i}]"), causes);
                }
            }
        }
        Value::Object(o) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, child) in o {
                if let Some(s) = props.and_then(|p| p.get(k)) {
                    check(s, child, &join(path, k), causes);
                } else if let Some(a) = additional {
                    check(a, child, &join(path, k), causes);
                }
            }
            required(schema, o, path, causes);
        }
        _ => {}
    }
}

fn type_error(path: &str, want: &str, v: &Value) -> FieldCause {
    FieldCause {
        reason: "FieldValueTypeInvalid",
        field: path.into(),
        message: format!(
            "Invalid value: \"{}\": {path} in body must be of type {want}: \"{}\"",
            type_name(v),
            type_name(v)
        ),
    }
}

fn invalid(path: &str, v: &Value, detail: &str) -> FieldCause {
    FieldCause {
        reason: "FieldValueInvalid",
        field: path.into(),
        message: format!("Invalid value: {v}: {detail}"),
    }
}

/// Drops fields the schema does not know (unless `x-kubernetes-preserve-unknown-fields`),
/// as kube-apiserver prunes structural CRDs. `metadata`, `apiVersion`, `kind` are kept.
pub fn prune(schema: &Value, obj: &mut Value) {
    if let Value::Object(o) = obj {
        for (k, v) in o.iter_mut() {
            if matches!(k.as_str(), "metadata" | "apiVersion" | "kind") {
                continue;
            }
            if let Some(s) = schema.get("properties").and_then(|p| p.get(k)) {
                prune_value(s, v);
            }
        }
        if !preserves(schema) {
            let props = schema.get("properties").and_then(Value::as_object);
            o.retain(|k, _| {
                matches!(k.as_str(), "metadata" | "apiVersion" | "kind")
                    || props.is_some_and(|p| p.contains_key(k))
            });
        }
    }
}

fn preserves(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

fn prune_value(schema: &Value, v: &mut Value) {
    match v {
        Value::Object(o) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema
                .get("additionalProperties")
                .filter(|a| a.is_object() || a.as_bool() == Some(true));
            if !preserves(schema) && additional.is_none() {
                o.retain(|k, _| props.is_some_and(|p| p.contains_key(k)));
            }
            for (k, child) in o.iter_mut() {
                if let Some(s) = props.and_then(|p| p.get(k)) {
                    prune_value(s, child);
                } else if let Some(a) = additional.filter(|a| a.is_object()) {
                    prune_value(a, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items") {
                for i in items {
                    prune_value(is, i);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eniconfig_schema() -> Value {
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {
            "spec": {"type": "object", "required": ["subnet"], "properties": {
                "subnet": {"type": "string"},
                "securityGroups": {"type": "array", "items": {"type": "string"}}}}}})
    }

    #[test]
    fn eniconfig_rules() {
        let s = eniconfig_schema();
        assert!(
            validate(
                &s,
                &json!({"spec": {"subnet": "subnet-1", "securityGroups": ["sg-1"]}})
            )
            .is_empty()
        );
        let c = validate(&s, &json!({"spec": {"securityGroups": ["sg-1"]}}));
        assert_eq!(
            c,
            vec![FieldCause {
                reason: "FieldValueRequired",
                field: "spec.subnet".into(),
                message: "Required value".into()
            }]
        );
        let c = validate(&s, &json!({"spec": {"subnet": 5, "securityGroups": [1]}}));
        assert_eq!(c.len(), 2);
        let subnet = c.iter().find(|x| x.field == "spec.subnet").unwrap();
        assert_eq!(
            subnet.message,
            "Invalid value: \"integer\": spec.subnet in body must be of type string: \"integer\""
        );
        assert!(c.iter().any(|x| x.field == "spec.securityGroups[0]" && x.reason == "FieldValueTypeInvalid"));
    }

    #[test]
    fn prune_keeps_preserved_root_and_drops_unknown_in_spec() {
        let s = eniconfig_schema();
        let mut o =
            json!({"metadata": {"name": "a"}, "extra": 1, "spec": {"subnet": "s", "bogus": true}});
        prune(&s, &mut o);
        assert_eq!(
            o,
            json!({"metadata": {"name": "a"}, "extra": 1, "spec": {"subnet": "s"}})
        );
    }
}
