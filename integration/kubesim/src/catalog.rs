//! The resource catalog: which groups/versions/resources the server serves (the built-in ones
//! and those registered from CustomResourceDefinition objects), and the discovery documents
//! built from it. Owns no objects and no HTTP.

use std::collections::BTreeMap;

use serde_json::{Value, json};

const ALL: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// One served resource in one group (all its served versions).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    pub group: String,
    /// Served versions, preferred (storage) first.
    pub versions: Vec<String>,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub short_names: Vec<String>,
    pub namespaced: bool,
    pub verbs: Vec<String>,
    /// Subresources served (`status`, `proxy`, `token`).
    pub subresources: Vec<String>,
    /// Where objects live: `(group, plural)`; events.k8s.io events share core events' storage.
    pub storage: StorageKey,
    /// `openAPIV3Schema` per version (CRDs only).
    pub schemas: BTreeMap<String, Value>,
    /// True for CRD-defined types (items carry kind/apiVersion in lists, merge patch only).
    pub custom: bool,
}

/// Storage identity of a resource: `(group, plural)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StorageKey {
    pub group: String,
    pub plural: String,
}

impl StorageKey {
    pub fn new(group: &str, plural: &str) -> Self {
        Self {
            group: group.into(),
            plural: plural.into(),
        }
    }
}

impl ResourceType {
    fn builtin(
        (group, version): (&str, &str),
        plural: &str,
        kind: &str,
        namespaced: bool,
        short: &[&str],
        subs: &[&str],
        verbs: &[&str],
    ) -> Self {
        Self {
            group: group.into(),
            versions: vec![version.into()],
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            short_names: short.iter().map(|s| s.to_string()).collect(),
            namespaced,
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            subresources: subs.iter().map(|s| s.to_string()).collect(),
            storage: StorageKey::new(group, plural),
            schemas: BTreeMap::new(),
            custom: false,
        }
    }

    pub fn preferred_version(&self) -> &str {
        &self.versions[0]
    }

    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// Builds a type from a CustomResourceDefinition object, or says why it cannot.
    pub fn from_crd(crd: &Value) -> Result<Self, String> {
        let spec = crd.get("spec").ok_or("spec is required")?;
        let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        let group = s(spec.get("group")).ok_or("spec.group is required")?;
        let names = spec.get("names").ok_or("spec.names is required")?;
        let plural = s(names.get("plural")).ok_or("spec.names.plural is required")?;
        let kind = s(names.get("kind")).ok_or("spec.names.kind is required")?;
        let singular = s(names.get("singular")).unwrap_or_else(|| kind.to_lowercase());
        let short_names = names
            .get("shortNames")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let namespaced = match spec.get("scope").and_then(Value::as_str) {
            Some("Namespaced") => true,
            Some("Cluster") => false,
            _ => return Err("spec.scope must be Namespaced or Cluster".into()),
        };
        let expected = format!("{plural}.{group}");
        if crd.pointer("/metadata/name").and_then(Value::as_str) != Some(expected.as_str()) {
            return Err(format!(
                "metadata.name must be spec.names.plural+\".\"+spec.group ({expected})"
            ));
        }
        let mut versions = Vec::new();
        let mut schemas = BTreeMap::new();
        let mut status = false;
        for v in spec
            .get("versions")
            .and_then(Value::as_array)
            .ok_or("spec.versions is required")?
        {
            let name = s(v.get("name")).ok_or("spec.versions[].name is required")?;
            if v.get("served").and_then(Value::as_bool) != Some(true) {
                continue;
            }
            if let Some(schema) = v.pointer("/schema/openAPIV3Schema") {
                schemas.insert(name.clone(), schema.clone());
            }
            if v.pointer("/subresources/status").is_some() {
                status = true;
            }
            if v.get("storage").and_then(Value::as_bool) == Some(true) {
                versions.insert(0, name);
            } else {
                versions.push(name);
            }
        }
        if versions.is_empty() {
            return Err("spec.versions must have at least one served version".into());
        }
        Ok(Self {
            storage: StorageKey::new(&group, &plural),
            group,
            versions,
            plural,
            singular,
            kind,
            short_names,
            namespaced,
            verbs: ALL.iter().map(|s| s.to_string()).collect(),
            subresources: if status {
                vec!["status".into()]
            } else {
                vec![]
            },
            schemas,
            custom: true,
        })
    }
}

/// The built-in types: what ipamd, cni-metrics-helper and `kubectl apply` of the chart touch.
pub fn builtins() -> Vec<ResourceType> {
    let mut events_k8s = ResourceType::builtin(
        ("events.k8s.io", "v1"),
        "events",
        "Event",
        true,
        &["ev"],
        &[],
        ALL,
    );
    events_k8s.storage = StorageKey::new("", "events");
    vec![
        ResourceType::builtin(
            ("", "v1"),
            "namespaces",
            "Namespace",
            false,
            &["ns"],
            &["status"],
            &[
                "create", "delete", "get", "list", "patch", "update", "watch",
            ],
        ),
        ResourceType::builtin(
            ("", "v1"),
            "nodes",
            "Node",
            false,
            &["no"],
            &["status"],
            ALL,
        ),
        ResourceType::builtin(
            ("", "v1"),
            "pods",
            "Pod",
            true,
            &["po"],
            &["status", "proxy"],
            ALL,
        ),
        ResourceType::builtin(("", "v1"), "events", "Event", true, &["ev"], &[], ALL),
        ResourceType::builtin(
            ("", "v1"),
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            &["token"],
            ALL,
        ),
        ResourceType::builtin(
            ("", "v1"),
            "configmaps",
            "ConfigMap",
            true,
            &["cm"],
            &[],
            ALL,
        ),
        ResourceType::builtin(("", "v1"), "secrets", "Secret", true, &[], &[], ALL),
        ResourceType::builtin(
            ("", "v1"),
            "services",
            "Service",
            true,
            &["svc"],
            &["status"],
            &[
                "create", "delete", "get", "list", "patch", "update", "watch",
            ],
        ),
        events_k8s,
        ResourceType::builtin(
            ("apps", "v1"),
            "daemonsets",
            "DaemonSet",
            true,
            &["ds"],
            &["status"],
            ALL,
        ),
        ResourceType::builtin(
            ("apps", "v1"),
            "deployments",
            "Deployment",
            true,
            &["deploy"],
            &["status"],
            ALL,
        ),
        ResourceType::builtin(
            ("rbac.authorization.k8s.io", "v1"),
            "clusterroles",
            "ClusterRole",
            false,
            &[],
            &[],
            ALL,
        ),
        ResourceType::builtin(
            ("rbac.authorization.k8s.io", "v1"),
            "clusterrolebindings",
            "ClusterRoleBinding",
            false,
            &[],
            &[],
            ALL,
        ),
        ResourceType::builtin(
            ("rbac.authorization.k8s.io", "v1"),
            "roles",
            "Role",
            true,
            &[],
            &[],
            ALL,
        ),
        ResourceType::builtin(
            ("rbac.authorization.k8s.io", "v1"),
            "rolebindings",
            "RoleBinding",
            true,
            &[],
            &[],
            ALL,
        ),
        ResourceType::builtin(
            ("apiextensions.k8s.io", "v1"),
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            &["status"],
            ALL,
        ),
        ResourceType::builtin(
            ("authorization.k8s.io", "v1"),
            "selfsubjectaccessreviews",
            "SelfSubjectAccessReview",
            false,
            &[],
            &[],
            &["create"],
        ),
        ResourceType::builtin(
            ("coordination.k8s.io", "v1"),
            "leases",
            "Lease",
            true,
            &[],
            &[],
            ALL,
        ),
    ]
}

/// Built-in plus CRD-registered types.
#[derive(Debug, Clone)]
pub struct Catalog {
    types: Vec<ResourceType>,
}

impl Default for Catalog {
    fn default() -> Self {
        Self { types: builtins() }
    }
}

impl Catalog {
    /// The type served at `group/version` under `plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types.iter().find(|t| {
            t.group == group && t.plural == plural && t.versions.iter().any(|v| v == version)
        })
    }

    /// Finds by apiVersion + kind (for loading manifests).
    pub fn find_kind(&self, api_version: &str, kind: &str) -> Option<(&ResourceType, String)> {
        let (group, version) = split_api_version(api_version);
        self.types
            .iter()
            .find(|t| t.group == group && t.kind == kind && t.versions.iter().any(|v| v == version))
            .map(|t| (t, version.to_string()))
    }

    /// Registers (or replaces) a CRD-defined type; refuses to shadow a built-in.
    pub fn register(&mut self, t: ResourceType) -> Result<(), String> {
        if let Some(existing) = self
            .types
            .iter_mut()
            .find(|x| x.group == t.group && x.plural == t.plural)
        {
            if !existing.custom {
                return Err(format!("{}.{} is a built-in resource", t.plural, t.group));
            }
            *existing = t;
        } else {
            self.types.push(t);
        }
        Ok(())
    }

    pub fn unregister(&mut self, group: &str, plural: &str) {
        self.types
            .retain(|t| !(t.custom && t.group == group && t.plural == plural));
    }

    /// `/api`: APIVersions.
    pub fn core_versions(&self, server_address: &str) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        })
    }

    fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in self.types.iter().filter(|t| !t.group.is_empty()) {
            let e = groups.entry(t.group.clone()).or_default();
            for v in &t.versions {
                if !e.contains(v) {
                    e.push(v.clone());
                }
            }
        }
        groups
    }

    fn group_json(name: &str, versions: &[String]) -> Value {
        let vs: Vec<Value> = versions
            .iter()
            .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
            .collect();
        json!({
            "name": name,
            "versions": vs,
            "preferredVersion": {"groupVersion": format!("{name}/{}", versions[0]), "version": versions[0]},
        })
    }

    /// `/apis`: APIGroupList.
    pub fn group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .iter()
            .map(|(n, v)| Self::group_json(n, v))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `/apis/<group>`: APIGroup.
    pub fn group(&self, group: &str) -> Option<Value> {
        let groups = self.groups();
        let versions = groups.get(group)?;
        let mut v = Self::group_json(group, versions);
        v["kind"] = json!("APIGroup");
        v["apiVersion"] = json!("v1");
        Some(v)
    }

    /// `/api/v1`, `/apis/<group>/<version>`: APIResourceList.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let mut resources = Vec::new();
        for t in self
            .types
            .iter()
            .filter(|t| t.group == group && t.versions.iter().any(|v| v == version))
        {
            let mut r = json!({
                "name": t.plural,
                "singularName": t.singular,
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": t.verbs,
            });
            if !t.short_names.is_empty() {
                r["shortNames"] = json!(t.short_names);
            }
            resources.push(r);
            for sub in &t.subresources {
                let (kind, verbs): (&str, &[&str]) = match sub.as_str() {
                    "proxy" => (
                        "PodProxyOptions",
                        &["create", "delete", "get", "patch", "update"],
                    ),
                    "token" => ("TokenRequest", &["create"]),
                    _ => (t.kind.as_str(), &["get", "patch", "update"]),
                };
                let kind = if sub == "proxy" && t.plural == "nodes" {
                    "NodeProxyOptions"
                } else {
                    kind
                };
                resources.push(json!({
                    "name": format!("{}/{sub}", t.plural),
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": kind,
                    "verbs": verbs,
                }));
            }
        }
        if resources.is_empty() {
            return None;
        }
        let gv = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
        )
    }

    /// Every type (for tests and the control API).
    pub fn types(&self) -> &[ResourceType] {
        &self.types
    }
}

/// `crd.k8s.amazonaws.com/v1alpha1` → (`crd.k8s.amazonaws.com`, `v1alpha1`); `v1` → (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_registers_cluster_scoped_eniconfig() {
        let crd = json!({
            "metadata": {"name": "eniconfigs.crd.k8s.amazonaws.com"},
            "spec": {"group": "crd.k8s.amazonaws.com", "scope": "Cluster",
                     "names": {"plural": "eniconfigs", "kind": "ENIConfig"},
                     "versions": [{"name": "v1alpha1", "served": true, "storage": true}]}
        });
        let t = ResourceType::from_crd(&crd).unwrap();
        assert!(!t.namespaced);
        assert_eq!(t.singular, "eniconfig");
        let mut c = Catalog::default();
        c.register(t).unwrap();
        assert!(
            c.find("crd.k8s.amazonaws.com", "v1alpha1", "eniconfigs")
                .is_some()
        );
        let list = c
            .resource_list("crd.k8s.amazonaws.com", "v1alpha1")
            .unwrap();
        assert_eq!(list["resources"][0]["kind"], "ENIConfig");
        assert!(
            c.group_list()["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "crd.k8s.amazonaws.com")
        );
    }

    #[test]
    fn crd_name_must_match() {
        let crd = json!({"metadata": {"name": "x"}, "spec": {"group": "g.io", "scope": "Cluster",
            "names": {"plural": "ps", "kind": "P"}, "versions": [{"name": "v1", "served": true, "storage": true}]}});
        assert!(ResourceType::from_crd(&crd).is_err());
    }
}
