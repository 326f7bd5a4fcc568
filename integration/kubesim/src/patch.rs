//! Patch formats: JSON merge patch (RFC 7386), strategic merge patch (the subset kubectl and
//! client libraries send: maps merge, `null` deletes, lists of objects with a known merge key
//! merge by that key, `$patch`/`$setElementOrder`/`$retainKeys`/`$deleteFromPrimitiveList`
//! directives), and JSON patch (RFC 6902). Pure functions on `serde_json::Value`.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// RFC 7386.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The merge key of well-known lists (Kubernetes' `patchMergeKey` tags); other lists are replaced.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "volumeMounts"
        | "imagePullSecrets" => "name",
        "ports" => "containerPort",
        "conditions" => "type",
        "ownerReferences" => "uid",
        "addresses" => "type",
        "volumeDevices" => "devicePath",
        "tolerations" | "finalizers" => return None,
        _ => return None,
    })
}

/// Strategic merge patch for built-in types.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    strategic(target, patch, "")
}

fn strategic(target: &mut Value, patch: &Value, _field: &str) -> Result<(), ApiError> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut clean = p.clone();
        clean.remove("$patch");
        *target = Value::Object(clean);
        return Ok(());
    }
    if p.get("$patch").and_then(Value::as_str) == Some("delete") {
        *target = Value::Null;
        return Ok(());
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k == "$patch" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Value::Array(del)) = (t.get_mut(field), v) {
                cur.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v, merge_key(k)) {
            (Some(Value::Array(cur)), Value::Array(items), Some(key)) => {
                for item in items {
                    let id = item.get(key).cloned();
                    let directive = item.get("$patch").and_then(Value::as_str);
                    let pos = id
                        .as_ref()
                        .and_then(|id| cur.iter().position(|c| c.get(key) == Some(id)));
                    match (pos, directive) {
                        (Some(i), Some("delete")) => {
                            cur.remove(i);
                        }
                        (None, Some("delete")) => {}
                        (Some(i), _) => strategic(&mut cur[i], item, k)?,
                        (None, _) => cur.push(item.clone()),
                    }
                }
            }
            (Some(existing), _, _) if v.is_object() => strategic(existing, v, k)?,
            _ => {
                let mut fresh = Value::Null;
                strategic(&mut fresh, v, k)?;
                if v.is_object() {
                    // strip directives from a new subtree
                    t.insert(k.clone(), fresh);
                } else {
                    t.insert(k.clone(), v.clone());
                }
            }
        }
    }
    Ok(())
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn parent_and_key<'a>(doc: &'a mut Value, path: &str) -> Result<(&'a mut Value, String), ApiError> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or_else(|| ApiError::bad_request(format!("invalid JSON patch path {path:?}")))?;
    let p = doc
        .pointer_mut(parent)
        .ok_or_else(|| ApiError::new(422, "Invalid", format!("the server rejected our request due to an error in our request: doc is missing path: {path:?}")))?;
    Ok((p, unescape(last)))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, key) = parent_and_key(doc, path)?;
    match parent {
        Value::Object(m) => {
            m.insert(key, value);
        }
        Value::Array(a) => {
            if key == "-" {
                a.push(value);
            } else {
                let i: usize = key
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid array index {key:?}")))?;
                if i > a.len() {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!("add operation index out of bounds: {path}"),
                    ));
                }
                a.insert(i, value);
            }
        }
        _ => {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!("doc is missing path: {path:?}"),
            ));
        }
    }
    Ok(())
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, ApiError> {
    let missing = || {
        ApiError::new(
            422,
            "Invalid",
            format!(
                "the server rejected our request due to an error in our request: doc is missing path: {path:?}: missing value"
            ),
        )
    };
    let (parent, key) = parent_and_key(doc, path)?;
    match parent {
        Value::Object(m) => m.remove(&key).ok_or_else(missing),
        Value::Array(a) => {
            let i: usize = key.parse().map_err(|_| missing())?;
            if i < a.len() {
                Ok(a.remove(i))
            } else {
                Err(missing())
            }
        }
        _ => Err(missing()),
    }
}

/// RFC 6902; the whole patch applies or nothing does (the caller works on a copy).
pub fn json_patch(doc: &mut Value, ops: &Value) -> Result<(), ApiError> {
    let ops = ops
        .as_array()
        .ok_or_else(|| ApiError::bad_request("json patch must be an array of operations"))?;
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("");
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| ApiError::bad_request(format!("{kind} operation requires a value")))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| ApiError::bad_request(format!("{kind} operation requires from")))
        };
        match kind {
            "add" => add(doc, &path, value()?)?,
            "remove" => {
                remove(doc, &path)?;
            }
            "replace" => {
                remove(doc, &path)?;
                add(doc, &path, value()?)?;
            }
            "move" => {
                let v = remove(doc, &from()?)?;
                add(doc, &path, v)?;
            }
            "copy" => {
                let v = doc
                    .pointer(&from()?)
                    .cloned()
                    .ok_or_else(|| ApiError::new(422, "Invalid", "copy from a missing path"))?;
                add(doc, &path, v)?;
            }
            "test" => {
                if doc.pointer(&path) != Some(&value()?) {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "the server rejected our request due to an error in our request: testing value {path} failed"
                        ),
                    ));
                }
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unexpected JSON patch operation {other:?}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_with_null() {
        let mut o = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        merge_patch(
            &mut o,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
        );
        assert_eq!(o, json!({"metadata": {"labels": {"b": "2", "c": "3"}}}));
    }

    #[test]
    fn strategic_merges_containers_by_name() {
        let mut o = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        strategic_merge_patch(&mut o, &json!({"$setElementOrder/containers": [], "spec": {"containers": [{"name": "b", "image": "z"}]}})).unwrap();
        assert_eq!(o["spec"]["containers"][1]["image"], "z");
        assert_eq!(o["spec"]["containers"][0]["image"], "x");
        strategic_merge_patch(
            &mut o,
            &json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(o["spec"]["containers"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn json_patch_ops() {
        let mut o = json!({"metadata": {"labels": {"a/b": "1"}}, "list": [1, 2]});
        json_patch(
            &mut o,
            &json!([
                {"op": "add", "path": "/metadata/labels/c", "value": "3"},
                {"op": "remove", "path": "/metadata/labels/a~1b"},
                {"op": "add", "path": "/list/-", "value": 3},
                {"op": "replace", "path": "/list/0", "value": 0},
                {"op": "test", "path": "/list/2", "value": 3},
            ]),
        )
        .unwrap();
        assert_eq!(
            o,
            json!({"metadata": {"labels": {"c": "3"}}, "list": [0, 2, 3]})
        );
        assert_eq!(
            json_patch(&mut o, &json!([{"op": "remove", "path": "/nope"}]))
                .unwrap_err()
                .code,
            422
        );
    }
}
