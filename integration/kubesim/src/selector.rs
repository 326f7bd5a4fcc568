//! Label and field selectors: parsing (`a=b,c!=d,e in (x,y),!f`) and matching against a JSON
//! object, with the per-resource set of field labels kube-apiserver supports. Pure.

use serde_json::Value;

use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Req>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let bad = |p: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement: invalid label selector: {p:?}"
            ))
        };
        let mut reqs = Vec::new();
        for part in split_top(s)
            .into_iter()
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let req = if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(rest).ok_or_else(|| bad(part))?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set(rest).ok_or_else(|| bad(part))?)
            } else {
                Req::Exists(part.to_string())
            };
            let key = match &req {
                Req::Eq(k, _)
                | Req::Ne(k, _)
                | Req::In(k, _)
                | Req::NotIn(k, _)
                | Req::Exists(k)
                | Req::NotExists(k) => k,
            };
            let values_ok = match &req {
                Req::Eq(_, v) | Req::Ne(_, v) => valid_value(v),
                Req::In(_, vs) | Req::NotIn(_, vs) => vs.iter().all(|v| valid_value(v)),
                _ => true,
            };
            if !valid_key(key) || !values_ok {
                return Err(bad(part));
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::Ne(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

fn set(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
    )
}

/// A parsed field selector: `path=value` / `path!=value` terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// Field labels kube-apiserver accepts per resource (besides metadata.name/namespace).
fn supported_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "events") | ("events.k8s.io", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "namespaces") => &["status.phase"],
        ("", "secrets") => &["type"],
        _ => &[],
    }
}

impl FieldSelector {
    /// Parses and checks every field label against what the resource supports (400 otherwise,
    /// as kube-apiserver's `field label not supported`).
    pub fn parse(s: &str, group: &str, plural: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, neg, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, false, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid field selector: {part:?}"
                )));
            };
            let k = k.trim();
            if k != "metadata.name"
                && k != "metadata.namespace"
                && !supported_fields(group, plural).contains(&k)
            {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            terms.push((k.to_string(), neg, v.trim().to_string()));
        }
        Ok(Self(terms))
    }

    /// The value a `metadata.name=` term pins, if any (lets get-by-name watches filter early).
    pub fn name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, neg, _)| k == "metadata.name" && !neg)
            .map(|(_, _, v)| v.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, neg, v)| {
            let actual = field_value(obj, k);
            (actual == *v) != *neg
        })
    }
}

/// A field's value as the field-label conversion renders it ("" when absent; events' `source`
/// is `source.component`).
fn field_value(obj: &Value, path: &str) -> String {
    let path = if path == "source" {
        "source.component"
    } else {
        path
    };
    let ptr = format!("/{}", path.replace('.', "/"));
    match obj.pointer(&ptr) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ if path == "spec.unschedulable" || path == "spec.hostNetwork" => "false".into(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_forms() {
        let o = json!({"metadata": {"labels": {"k8s-app": "aws-node", "zone": "a"}}});
        for (s, want) in [
            ("k8s-app=aws-node", true),
            ("k8s-app==aws-node,zone=a", true),
            ("k8s-app!=aws-node", false),
            ("zone in (a, b)", true),
            ("zone notin (a)", false),
            ("missing notin (a)", true),
            ("zone", true),
            ("!zone", false),
            ("!missing", true),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(s).unwrap().matches(&o), want, "{s}");
        }
        assert!(LabelSelector::parse("a=(b").is_err());
    }

    #[test]
    fn field_selector_pods_and_unsupported() {
        let pod =
            json!({"metadata": {"name": "p", "namespace": "n"}, "spec": {"nodeName": "node-1"}});
        assert!(
            FieldSelector::parse("spec.nodeName=node-1", "", "pods")
                .unwrap()
                .matches(&pod)
        );
        assert!(
            !FieldSelector::parse("spec.nodeName!=node-1", "", "pods")
                .unwrap()
                .matches(&pod)
        );
        assert!(
            FieldSelector::parse("metadata.name=p,metadata.namespace=n", "", "pods")
                .unwrap()
                .matches(&pod)
        );
        let err = FieldSelector::parse("spec.nodeName=x", "", "configmaps").unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(err.message, "field label not supported: spec.nodeName");
    }
}
