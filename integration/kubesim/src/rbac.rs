//! RBAC authorization as kube-apiserver's RBAC authorizer decides it: a request is allowed
//! when some ClusterRoleBinding (anywhere) or RoleBinding (in the request's namespace) binds the
//! user, one of its groups or its service account to a role with a matching rule. Also the
//! bootstrap policy every cluster has (discovery for authenticated users, health for everyone).
//! Pure: roles and bindings come in as JSON objects.

use serde_json::Value;

/// Who is asking (the authenticator's answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    pub fn service_account(ns: &str, name: &str) -> Self {
        Self {
            name: format!("system:serviceaccount:{ns}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
        }
    }

    pub fn anonymous() -> Self {
        Self {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }
}

/// What is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attributes {
    Resource {
        verb: String,
        group: String,
        resource: String,
        subresource: Option<String>,
        namespace: Option<String>,
        name: Option<String>,
    },
    NonResource {
        verb: String,
        path: String,
    },
}

/// The RBAC objects in force.
#[derive(Debug, Default, Clone)]
pub struct Policy<'a> {
    pub cluster_roles: Vec<&'a Value>,
    pub cluster_role_bindings: Vec<&'a Value>,
    pub roles: Vec<&'a Value>,
    pub role_bindings: Vec<&'a Value>,
}

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn name_of(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn ns_of(v: &Value) -> &str {
    v.pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn subject_matches(subject: &Value, user: &UserInfo, binding_ns: &str) -> bool {
    let kind = subject.get("kind").and_then(Value::as_str).unwrap_or("");
    let name = subject.get("name").and_then(Value::as_str).unwrap_or("");
    match kind {
        "User" => user.name == name,
        "Group" => user.groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let ns = subject
                .get("namespace")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .unwrap_or(binding_ns);
            user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn verb_matches(rule: &Value, verb: &str) -> bool {
    strs(rule.get("verbs"))
        .iter()
        .any(|v| *v == "*" || *v == verb)
}

fn resource_rule_matches(rule: &Value, attrs: &Attributes) -> bool {
    let Attributes::Resource {
        verb,
        group,
        resource,
        subresource,
        name,
        ..
    } = attrs
    else {
        return false;
    };
    if !verb_matches(rule, verb) {
        return false;
    }
    if !strs(rule.get("apiGroups"))
        .iter()
        .any(|g| *g == "*" || *g == group)
    {
        return false;
    }
    let combined = match subresource {
        Some(s) => format!("{resource}/{s}"),
        None => resource.clone(),
    };
    let res_ok = strs(rule.get("resources")).iter().any(|r| {
        *r == "*"
            || *r == combined
            || (subresource.is_none() && *r == resource)
            || subresource
                .as_ref()
                .is_some_and(|s| *r == format!("*/{s}") || *r == format!("{resource}/*"))
    });
    if !res_ok {
        return false;
    }
    let names = strs(rule.get("resourceNames"));
    names.is_empty() || name.as_ref().is_some_and(|n| names.contains(&n.as_str()))
}

fn non_resource_rule_matches(rule: &Value, attrs: &Attributes) -> bool {
    let Attributes::NonResource { verb, path } = attrs else {
        return false;
    };
    verb_matches(rule, verb)
        && strs(rule.get("nonResourceURLs")).iter().any(|u| {
            *u == "*"
                || *u == path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| path.starts_with(prefix))
        })
}

fn rules_allow(role: &Value, attrs: &Attributes) -> bool {
    role.get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| match attrs {
            Attributes::Resource { .. } => resource_rule_matches(r, attrs),
            Attributes::NonResource { .. } => non_resource_rule_matches(r, attrs),
        })
}

/// The bootstrap policy (`system:discovery`, `system:public-info-viewer`, `system:basic-user`
/// subset): discovery paths for authenticated users, health and version for everyone.
fn bootstrap_allows(user: &UserInfo, attrs: &Attributes) -> bool {
    if user.groups.iter().any(|g| g == "system:masters") {
        return true;
    }
    let authenticated = user.groups.iter().any(|g| g == "system:authenticated");
    let (verb, path) = match attrs {
        Attributes::NonResource { verb, path } => (verb, path),
        // system:basic-user: anyone authenticated may ask what they may do.
        Attributes::Resource {
            verb,
            group,
            resource,
            ..
        } => {
            return authenticated
                && verb == "create"
                && group == "authorization.k8s.io"
                && resource == "selfsubjectaccessreviews";
        }
    };
    if verb != "get" {
        return false;
    }
    let public = ["/healthz", "/livez", "/readyz", "/version", "/version/"];
    if public.contains(&path.as_str()) {
        return true;
    }
    authenticated
        && (path == "/api"
            || path.starts_with("/api/")
            || path == "/apis"
            || path.starts_with("/apis/")
            || path.starts_with("/openapi"))
}

/// The RBAC decision.
pub fn allows(policy: &Policy<'_>, user: &UserInfo, attrs: &Attributes) -> bool {
    if bootstrap_allows(user, attrs) {
        return true;
    }
    let cluster_role = |name: &str| {
        policy
            .cluster_roles
            .iter()
            .copied()
            .find(|r| name_of(r) == name)
    };
    for b in &policy.cluster_role_bindings {
        if strs_subjects(b).any(|s| subject_matches(s, user, ""))
            && b.pointer("/roleRef/kind").and_then(Value::as_str) == Some("ClusterRole")
            && let Some(role) = b
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .and_then(cluster_role)
            && rules_allow(role, attrs)
        {
            return true;
        }
    }
    let ns = match attrs {
        Attributes::Resource {
            namespace: Some(ns),
            ..
        } => ns.as_str(),
        _ => return false,
    };
    for b in policy.role_bindings.iter().filter(|b| ns_of(b) == ns) {
        if !strs_subjects(b).any(|s| subject_matches(s, user, ns)) {
            continue;
        }
        let role_name = b
            .pointer("/roleRef/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let role = match b.pointer("/roleRef/kind").and_then(Value::as_str) {
            Some("ClusterRole") => cluster_role(role_name),
            Some("Role") => policy
                .roles
                .iter()
                .copied()
                .find(|r| ns_of(r) == ns && name_of(r) == role_name),
            _ => None,
        };
        if role.is_some_and(|r| rules_allow(r, attrs)) {
            return true;
        }
    }
    false
}

fn strs_subjects(b: &Value) -> impl Iterator<Item = &Value> {
    b.get("subjects")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn res(
        verb: &str,
        group: &str,
        resource: &str,
        sub: Option<&str>,
        ns: Option<&str>,
    ) -> Attributes {
        Attributes::Resource {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.map(str::to_string),
            namespace: ns.map(str::to_string),
            name: Some("x".into()),
        }
    }

    #[test]
    fn cluster_role_binding_grants_exactly_its_rules() {
        let role = json!({"metadata": {"name": "aws-node"}, "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods", "pods/proxy"], "verbs": ["get"]}]});
        let binding = json!({"metadata": {"name": "aws-node"}, "roleRef": {"kind": "ClusterRole", "name": "aws-node"},
            "subjects": [{"kind": "ServiceAccount", "name": "aws-node", "namespace": "kube-system"}]});
        let p = Policy {
            cluster_roles: vec![&role],
            cluster_role_bindings: vec![&binding],
            ..Default::default()
        };
        let sa = UserInfo::service_account("kube-system", "aws-node");
        let other = UserInfo::service_account("default", "aws-node");
        assert!(allows(&p, &sa, &res("list", "", "nodes", None, None)));
        assert!(!allows(&p, &sa, &res("delete", "", "nodes", None, None)));
        assert!(!allows(&p, &other, &res("list", "", "nodes", None, None)));
        assert!(allows(
            &p,
            &sa,
            &res("create", "events.k8s.io", "events", None, Some("default"))
        ));
        assert!(
            !allows(&p, &sa, &res("get", "", "nodes", Some("status"), None)),
            "subresources need their own rule"
        );
        assert!(allows(
            &p,
            &sa,
            &res("get", "", "pods", Some("proxy"), Some("kube-system"))
        ));
        assert!(allows(
            &p,
            &sa,
            &Attributes::NonResource {
                verb: "get".into(),
                path: "/apis".into()
            }
        ));
        assert!(!allows(
            &p,
            &UserInfo::anonymous(),
            &Attributes::NonResource {
                verb: "get".into(),
                path: "/apis".into()
            }
        ));
    }

    #[test]
    fn role_binding_is_namespaced() {
        let role = json!({"metadata": {"name": "r", "namespace": "a"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"], "resourceNames": ["x"]}]});
        let binding = json!({"metadata": {"name": "b", "namespace": "a"}, "roleRef": {"kind": "Role", "name": "r"},
            "subjects": [{"kind": "User", "name": "alice"}]});
        let p = Policy {
            roles: vec![&role],
            role_bindings: vec![&binding],
            ..Default::default()
        };
        let alice = UserInfo {
            name: "alice".into(),
            groups: vec![],
        };
        assert!(allows(
            &p,
            &alice,
            &res("update", "", "configmaps", None, Some("a"))
        ));
        assert!(!allows(
            &p,
            &alice,
            &res("update", "", "configmaps", None, Some("b"))
        ));
        let mut other_name = res("update", "", "configmaps", None, Some("a"));
        if let Attributes::Resource { name, .. } = &mut other_name {
            *name = Some("y".into());
        }
        assert!(!allows(&p, &alice, &other_name));
    }
}
