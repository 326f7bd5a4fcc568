//! The Kubernetes section: how ipamd reaches the API server and what it does there — custom
//! networking (ENIConfig), pod IP annotations, security groups for pods (branch ENIs from the pod
//! annotation, the `CNINode` features), unschedulable nodes (warned) (`MY_NODE_NAME`, `KUBECONFIG`,
//! `KUBERNETES_SERVICE_*`, `CLUSTER_ENDPOINT`, `MY_POD_*`, `AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG`,
//! `ENI_CONFIG_*_DEF`, `ANNOTATE_POD_IP`, `ENABLE_POD_ENI`, `POD_SECURITY_GROUP_ENFORCING_MODE`,
//! `AWS_MANAGE_ENIS_NON_SCHEDULABLE`, ours `REMOVE_STARTUP_TAINT`, `IPAMD_ADDRESS_CAPACITY_*`,
//! `IPAMD_SUBNET_INVENTORY_CONFIGMAP`). Must not: connect (that is
//! `k8s`'s), read the service account files.

use std::path::PathBuf;

use super::env::{Env, err};
use super::{ConfigError, WarningKind};

/// Default ENIConfig annotation/label key.
pub const DEFAULT_ENI_CONFIG_KEY: &str = "k8s.amazonaws.com/eniConfig";
/// Where the service account's token and CA are mounted in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The default for `MY_POD_NAMESPACE`.
pub const DEFAULT_POD_NAMESPACE: &str = "kube-system";

/// How ENIConfig names are found on the node (`ENI_CONFIG_ANNOTATION_DEF`, `ENI_CONFIG_LABEL_DEF`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniConfigKeys {
    /// Annotation key.
    pub annotation: String,
    /// Label key.
    pub label: String,
}

/// How ipamd reaches the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeSource {
    /// `KUBECONFIG` (its current context; tests and off-cluster runs).
    Kubeconfig(PathBuf),
    /// In a pod: `KUBERNETES_SERVICE_HOST`/`PORT` and the mounted service account.
    InCluster {
        /// `KUBERNETES_SERVICE_HOST`.
        host: String,
        /// `KUBERNETES_SERVICE_PORT` (443).
        port: u16,
        /// [`SERVICE_ACCOUNT_DIR`].
        account_dir: PathBuf,
    },
}

/// The API client part of the Kubernetes section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSettings {
    /// Client configuration source.
    pub source: KubeSource,
    /// `CLUSTER_ENDPOINT`: replaces the server URL.
    pub cluster_endpoint: Option<String>,
    /// `MY_NODE_NAME`.
    pub node_name: String,
    /// `MY_POD_NAME` (events go on this pod; empty: no events).
    pub pod_name: String,
    /// `MY_POD_NAMESPACE` (kube-system).
    pub pod_namespace: String,
    /// `VPC_CNI_VERSION` as given ("" when unset): the client's User-Agent is the program's name,
    /// `-`, and this.
    pub vpc_cni_version: String,
}

/// Everything ipamd does with the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSection {
    /// The API client, when configured; None: ipamd runs without it.
    pub api: Option<KubeSettings>,
    /// `AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG` (false; refused without [`Self::api`]).
    pub custom_network_cfg: bool,
    /// `ENI_CONFIG_ANNOTATION_DEF` and `ENI_CONFIG_LABEL_DEF` (empty = the default key).
    pub eni_config_keys: EniConfigKeys,
    /// `ANNOTATE_POD_IP` (false; warned about without [`Self::api`]).
    pub annotate_pod_ip: bool,
    /// `AWS_MANAGE_ENIS_NON_SCHEDULABLE` (false: on a node tainted
    /// `node.kubernetes.io/unschedulable` the pool attaches and frees no ENI; warned when set
    /// without the Kubernetes API, which the taint is read from).
    pub manage_enis_non_schedulable: bool,
    /// Ours, `REMOVE_STARTUP_TAINT` (unset or empty: off): the key of a start-up taint
    /// (e.g. Karpenter's `startupTaints`, or one node bootstrap adds) that ipamd removes from
    /// its Node once it can hand out an address (`readiness`). Refused without the API or
    /// when not a valid taint key.
    pub startup_taint: Option<String>,
    /// Ours, `IPAMD_ADDRESS_CAPACITY_CONDITION` (false): publish the Node condition
    /// `networking.k8s.aws/AddressCapacity` (RBAC `patch` on `nodes/status`). Warned about and
    /// off without the Kubernetes API.
    pub address_capacity_condition: bool,
    /// Ours, `IPAMD_ADDRESS_CAPACITY_TAINT` (false): taint the Node
    /// `networking.k8s.aws/address-capacity-exhausted:NoSchedule` while it can obtain no further
    /// address (RBAC `patch` on `nodes`). Warned about and off without the Kubernetes API.
    pub address_capacity_taint: bool,
    /// Ours, `IPAMD_SUBNET_INVENTORY_CONFIGMAP` (`<namespace>/<name>`; unset or empty: off):
    /// the ConfigMap cni-metrics-helper writes its subnet inventory into
    /// (`SUBNET_INVENTORY_CONFIGMAP`); the address capacity uses its recount and forecast
    /// (RBAC `get`/`list`/`watch` on that ConfigMap). Warned about and off without the
    /// Kubernetes API.
    pub subnet_inventory: Option<ConfigMapRef>,
    /// `ENABLE_POD_ENI=true` (security groups for pods): the mode, else None. Needs
    /// [`Self::api`] (the pod annotation and the `CNINode` live there).
    pub pod_eni: Option<PodSgMode>,
}

/// A ConfigMap by namespace and name (cni-metrics-helper's inventory: one parser for both sides).
pub use ipam_core::pool::subnet_inventory::ConfigMapRef;

/// True if `key` is a valid taint key: an optional DNS-subdomain prefix and `/`, then a name
/// of at most 63 characters, alphanumeric at both ends, `-`, `_`, `.` inside (Kubernetes'
/// qualified name).
#[must_use]
pub fn valid_taint_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    name_ok && prefix_ok
}

/// `POD_SECURITY_GROUP_ENFORCING_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSgMode {
    /// `strict` (default): every branch pod's packet crosses its branch ENI.
    Strict,
    /// `standard`: IP-based rules; pod-to-pod on the node and kubelet probes stay local.
    Standard,
}

impl PodSgMode {
    /// The value as the conflist and the environment spell it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Strict => "strict",
            Self::Standard => "standard",
        }
    }
}

impl KubeSection {
    /// Reads the section. Refuses security groups for pods (`ENABLE_POD_ENI=true`: pods would
    /// get node addresses without their groups) and custom networking without the API (pods
    /// would land in the primary ENI's subnet); warns about settings that have no effect.
    pub(super) fn parse(e: &mut Env<'_>) -> Result<Self, ConfigError> {
        let api = api_settings(e)?;
        let custom_network_cfg = e.bool("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", false);
        if custom_network_cfg && api.is_none() {
            // Without the Node and its ENIConfig new ENIs would land in the primary ENI's
            // subnet with its security groups: pods in the wrong subnet. Refuse.
            return Err(err(
                "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG",
                "true",
                "false, or MY_NODE_NAME with the Kubernetes API (KUBECONFIG, in-cluster \
                 KUBERNETES_SERVICE_HOST/PORT or CLUSTER_ENDPOINT): custom networking reads \
                 the Node and its ENIConfig",
            ));
        }
        // A mode other than strict/standard is refused, only while ENABLE_POD_ENI is on; without
        // pod ENIs the mode has no effect (a bad value is warned here, the default kept).
        let mode = match e.get("POD_SECURITY_GROUP_ENFORCING_MODE") {
            None | Some("strict") => Ok(PodSgMode::Strict),
            Some("standard") => Ok(PodSgMode::Standard),
            Some(v) => Err(v.to_owned()),
        };
        let pod_eni = if e.bool("ENABLE_POD_ENI", false) {
            if api.is_none() {
                // Branch pods are recognised by their pod's annotation: without the API every
                // one would get a node address without its security groups.
                return Err(err(
                    "ENABLE_POD_ENI",
                    "true",
                    "false, or MY_NODE_NAME with the Kubernetes API (KUBECONFIG, in-cluster \
                     KUBERNETES_SERVICE_HOST/PORT or CLUSTER_ENDPOINT): branch pods are read \
                     from the pod's vpc.amazonaws.com/pod-eni annotation",
                ));
            }
            match mode {
                Ok(m) => Some(m),
                Err(v) => {
                    return Err(err(
                        "POD_SECURITY_GROUP_ENFORCING_MODE",
                        &v,
                        "strict or standard (with ENABLE_POD_ENI=true)",
                    ));
                }
            }
        } else {
            if let Err(v) = mode {
                e.fallback("POD_SECURITY_GROUP_ENFORCING_MODE", &v, "strict");
            }
            None
        };
        let manage_enis_non_schedulable = e.bool("AWS_MANAGE_ENIS_NON_SCHEDULABLE", false);
        // Implemented from the Node's taints (`lib.rs` follow_node); without the Kubernetes API the
        // taint cannot be read and ENIs are managed as on a schedulable node (the answer when the
        // Node cannot be read).
        if api.is_none()
            && let Some(v) = e.get("AWS_MANAGE_ENIS_NON_SCHEDULABLE").map(str::to_owned)
        {
            e.warn(
                "AWS_MANAGE_ENIS_NON_SCHEDULABLE",
                &v,
                WarningKind::Unimplemented,
                "needs MY_NODE_NAME and the Kubernetes API to read the node's taints: without \
                 them ENIs are managed whether or not the node is schedulable"
                    .into(),
            );
        }
        let annotate_pod_ip = e.bool("ANNOTATE_POD_IP", false);
        if annotate_pod_ip && api.is_none() {
            e.warn(
                "ANNOTATE_POD_IP",
                "true",
                WarningKind::Unimplemented,
                "no Kubernetes API configured (MY_NODE_NAME with KUBECONFIG or in-cluster \
                 KUBERNETES_SERVICE_HOST/PORT): pods get no vpc.amazonaws.com/pod-ips annotation"
                    .into(),
            );
        }
        let startup_taint = match e.get("REMOVE_STARTUP_TAINT").filter(|v| !v.is_empty()) {
            None => None,
            Some(key) if !valid_taint_key(key) => {
                return Err(err(
                    "REMOVE_STARTUP_TAINT",
                    key,
                    "a taint key (e.g. example.com/agent-not-ready), or empty",
                ));
            }
            Some(key) if api.is_none() => {
                return Err(err(
                    "REMOVE_STARTUP_TAINT",
                    key,
                    "empty, or MY_NODE_NAME with the Kubernetes API: the taint is removed from \
                     the Node through it (without it pods would never be scheduled here)",
                ));
            }
            Some(key) => Some(key.to_owned()),
        };
        let mut capacity_knob = |var: &'static str, what: &str| {
            let on = e.bool(var, false);
            if on && api.is_none() {
                e.warn(
                    var,
                    "true",
                    WarningKind::Unimplemented,
                    format!(
                        "no Kubernetes API configured (MY_NODE_NAME with KUBECONFIG or in-cluster \
                         KUBERNETES_SERVICE_HOST/PORT): no {what} is published on the Node"
                    ),
                );
            }
            on && api.is_some()
        };
        let address_capacity_condition = capacity_knob(
            "IPAMD_ADDRESS_CAPACITY_CONDITION",
            "address-capacity condition",
        );
        let address_capacity_taint =
            capacity_knob("IPAMD_ADDRESS_CAPACITY_TAINT", "address-capacity taint");
        let subnet_inventory = match e
            .get("IPAMD_SUBNET_INVENTORY_CONFIGMAP")
            .filter(|v| !v.is_empty())
        {
            None => None,
            Some(v) => match ConfigMapRef::parse(v, None) {
                None => {
                    return Err(err(
                        "IPAMD_SUBNET_INVENTORY_CONFIGMAP",
                        v,
                        "<namespace>/<name> of cni-metrics-helper's inventory ConfigMap, or empty",
                    ));
                }
                Some(_) if api.is_none() => {
                    let v = v.to_owned();
                    e.warn(
                        "IPAMD_SUBNET_INVENTORY_CONFIGMAP",
                        &v,
                        WarningKind::Unimplemented,
                        "no Kubernetes API configured (MY_NODE_NAME with KUBECONFIG or in-cluster \
                         KUBERNETES_SERVICE_HOST/PORT): cni-metrics-helper's subnet inventory is \
                         not read"
                            .into(),
                    );
                    None
                }
                Some(r) => Some(r),
            },
        };
        Ok(Self {
            api,
            custom_network_cfg,
            eni_config_keys: EniConfigKeys {
                annotation: e.string("ENI_CONFIG_ANNOTATION_DEF", DEFAULT_ENI_CONFIG_KEY),
                label: e.string("ENI_CONFIG_LABEL_DEF", DEFAULT_ENI_CONFIG_KEY),
            },
            annotate_pod_ip,
            manage_enis_non_schedulable,
            startup_taint,
            address_capacity_condition,
            address_capacity_taint,
            subnet_inventory,
            pod_eni,
        })
    }
}

/// The API client: present when `MY_NODE_NAME` is set and a client configuration is available
/// (`KUBECONFIG`, else `KUBERNETES_SERVICE_HOST`, else `CLUSTER_ENDPOINT` with the mounted
/// service account).
fn api_settings(e: &Env<'_>) -> Result<Option<KubeSettings>, ConfigError> {
    let Some(node_name) = e.get("MY_NODE_NAME") else {
        return Ok(None);
    };
    let cluster_endpoint = e.get("CLUSTER_ENDPOINT").map(str::to_owned);
    let source = if let Some(path) = e.get("KUBECONFIG") {
        KubeSource::Kubeconfig(PathBuf::from(path))
    } else if let Some(host) = e.get("KUBERNETES_SERVICE_HOST") {
        let port = match e.get("KUBERNETES_SERVICE_PORT") {
            None => 443,
            Some(p) => p
                .parse()
                .map_err(|_| err("KUBERNETES_SERVICE_PORT", p, "a TCP port"))?,
        };
        KubeSource::InCluster {
            host: host.to_owned(),
            port,
            account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        }
    } else if cluster_endpoint.is_some() {
        KubeSource::InCluster {
            host: "kubernetes.default.svc".into(),
            port: 443,
            account_dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        }
    } else {
        return Ok(None);
    };
    Ok(Some(KubeSettings {
        source,
        cluster_endpoint,
        node_name: node_name.to_owned(),
        pod_name: e.string("MY_POD_NAME", ""),
        pod_namespace: e.string("MY_POD_NAMESPACE", DEFAULT_POD_NAMESPACE),
        // utils.GetEnv: the value as set, even blank.
        vpc_cni_version: e.map.get("VPC_CNI_VERSION").cloned().unwrap_or_default(),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::env::with_warnings;
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> (Result<KubeSection, ConfigError>, Vec<String>) {
        let (r, w) = with_warnings(pairs, KubeSection::parse);
        (r, w.into_iter().map(|w| w.var.to_owned()).collect())
    }

    #[test]
    fn address_capacity_publication_is_off_by_default_and_needs_the_api() {
        let api = [("MY_NODE_NAME", "n1"), ("KUBECONFIG", "/k")];
        let k = parse(&api).0.unwrap();
        assert!(!k.address_capacity_condition && !k.address_capacity_taint);
        let on = [
            ("IPAMD_ADDRESS_CAPACITY_CONDITION", "true"),
            ("IPAMD_ADDRESS_CAPACITY_TAINT", "true"),
        ];
        let k = parse(&[api.as_slice(), on.as_slice()].concat()).0.unwrap();
        assert!(k.address_capacity_condition && k.address_capacity_taint);
        // without the API: warned about, off
        let (k, warned) = parse(&on);
        let k = k.unwrap();
        assert!(!k.address_capacity_condition && !k.address_capacity_taint);
        assert_eq!(
            warned,
            [
                "IPAMD_ADDRESS_CAPACITY_CONDITION",
                "IPAMD_ADDRESS_CAPACITY_TAINT"
            ]
        );
    }

    #[test]
    fn the_subnet_inventory_configmap_needs_the_api_and_a_namespaced_name() {
        let api = [("MY_NODE_NAME", "n1"), ("KUBECONFIG", "/k")];
        assert_eq!(parse(&api).0.unwrap().subnet_inventory, None);
        let with = |v: &'static str| {
            let mut pairs = api.to_vec();
            pairs.push(("IPAMD_SUBNET_INVENTORY_CONFIGMAP", v));
            parse(&pairs).0
        };
        assert_eq!(
            with("kube-system/cni-subnet-inventory")
                .unwrap()
                .subnet_inventory,
            Some(ConfigMapRef {
                namespace: "kube-system".into(),
                name: "cni-subnet-inventory".into()
            })
        );
        assert_eq!(with("").unwrap().subnet_inventory, None);
        for bad in [
            "cni-subnet-inventory",
            "kube-system/",
            "/x",
            "Kube/x",
            "a/b/c",
            "a.b/c",
        ] {
            assert!(with(bad).is_err(), "{bad}");
        }
        let (k, warned) = parse(&[("IPAMD_SUBNET_INVENTORY_CONFIGMAP", "kube-system/x")]);
        assert_eq!(k.unwrap().subnet_inventory, None);
        assert_eq!(warned, ["IPAMD_SUBNET_INVENTORY_CONFIGMAP"]);
    }

    #[test]
    fn startup_taint_needs_the_api_and_a_valid_key() {
        let api = [("MY_NODE_NAME", "n1"), ("KUBECONFIG", "/k")];
        assert_eq!(parse(&api).0.unwrap().startup_taint, None);
        let with = |v: &'static str| {
            let mut pairs = api.to_vec();
            pairs.push(("REMOVE_STARTUP_TAINT", v));
            parse(&pairs).0
        };
        assert_eq!(
            with("example.com/agent-not-ready")
                .unwrap()
                .startup_taint
                .as_deref(),
            Some("example.com/agent-not-ready")
        );
        assert_eq!(with("").unwrap().startup_taint, None);
        for bad in ["-bad", "Example.com/x", "a/b/c", "x/", "/x", "a b"] {
            assert_eq!(with(bad).unwrap_err().var, "REMOVE_STARTUP_TAINT", "{bad}");
        }
        let (r, _) = parse(&[("REMOVE_STARTUP_TAINT", "example.com/agent-not-ready")]);
        assert_eq!(r.unwrap_err().var, "REMOVE_STARTUP_TAINT");
        assert!(valid_taint_key("node.cilium.io/agent-not-ready"));
        assert!(valid_taint_key("agent-not-ready"));
    }

    #[test]
    fn api_needs_a_node_name_and_a_source() {
        assert_eq!(parse(&[("KUBECONFIG", "/k")]).0.unwrap().api, None);
        assert_eq!(parse(&[("MY_NODE_NAME", "n1")]).0.unwrap().api, None);
        let k = parse(&[
            ("MY_NODE_NAME", "n1"),
            ("CLUSTER_ENDPOINT", "https://a:6443"),
        ])
        .0
        .unwrap()
        .api
        .unwrap();
        assert!(
            matches!(k.source, KubeSource::InCluster { ref host, port: 443, .. } if host == "kubernetes.default.svc")
        );
        let (r, _) = parse(&[
            ("MY_NODE_NAME", "n1"),
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "https"),
        ]);
        assert_eq!(r.unwrap_err().var, "KUBERNETES_SERVICE_PORT");
    }

    /// Refused where running without the feature would misplace pods; warned otherwise.
    #[test]
    fn unimplemented_features_are_refused_or_warned() {
        let (r, _) = parse(&[("ENABLE_POD_ENI", "true")]);
        let e = r.unwrap_err();
        assert_eq!(e.var, "ENABLE_POD_ENI");
        assert!(e.to_string().contains("Kubernetes API"), "{e}");
        let (r, _) = parse(&[("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true")]);
        assert_eq!(r.unwrap_err().var, "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG");
        // Read from the Node's taints: warned only when there is no Kubernetes API to read them.
        let (r, w) = parse(&[("AWS_MANAGE_ENIS_NON_SCHEDULABLE", "false")]);
        assert!(!r.unwrap().manage_enis_non_schedulable);
        assert_eq!(w, ["AWS_MANAGE_ENIS_NON_SCHEDULABLE"]);
        let (r, w) = parse(&[
            ("AWS_MANAGE_ENIS_NON_SCHEDULABLE", "true"),
            ("MY_NODE_NAME", "n1"),
            ("KUBECONFIG", "/k"),
        ]);
        assert!(r.unwrap().manage_enis_non_schedulable);
        assert!(w.is_empty(), "{w:?}");
        let (r, w) = parse(&[("ANNOTATE_POD_IP", "true")]);
        assert!(r.unwrap().annotate_pod_ip);
        assert_eq!(w, ["ANNOTATE_POD_IP"]);
        let (r, w) = parse(&[
            ("ANNOTATE_POD_IP", "true"),
            ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "true"),
            ("MY_NODE_NAME", "n1"),
            ("KUBECONFIG", "/k"),
        ]);
        let k = r.unwrap();
        assert!(
            k.annotate_pod_ip && k.custom_network_cfg && w.is_empty(),
            "{w:?}"
        );
    }

    /// `ENABLE_POD_ENI=true` with the API: the mode kept (strict by default); a bad mode
    /// refused as upstream's entrypoint refuses it.
    #[test]
    fn pod_eni_with_the_api_keeps_the_mode() {
        let api = [("MY_NODE_NAME", "n1"), ("KUBECONFIG", "/k")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v: Vec<(&str, &str)> = api.to_vec();
            v.push(("ENABLE_POD_ENI", "true"));
            v.extend_from_slice(extra);
            parse(&v)
        };
        assert_eq!(with(&[]).0.unwrap().pod_eni, Some(PodSgMode::Strict));
        let (r, w) = with(&[("POD_SECURITY_GROUP_ENFORCING_MODE", "standard")]);
        assert_eq!(r.unwrap().pod_eni, Some(PodSgMode::Standard));
        assert!(w.is_empty(), "{w:?}");
        let (r, _) = with(&[("POD_SECURITY_GROUP_ENFORCING_MODE", "lenient")]);
        assert_eq!(r.unwrap_err().var, "POD_SECURITY_GROUP_ENFORCING_MODE");
        assert_eq!(parse(&api).0.unwrap().pod_eni, None);
    }

    /// Pod SG mode: no effect while pod ENIs are off (as upstream); a bad value still says so.
    #[test]
    fn pod_sg_mode_is_checked_not_kept() {
        for ok in ["strict", "standard"] {
            let (r, w) = parse(&[("POD_SECURITY_GROUP_ENFORCING_MODE", ok)]);
            assert!(r.is_ok() && w.is_empty(), "{ok}: {w:?}");
        }
        let (r, w) = parse(&[("POD_SECURITY_GROUP_ENFORCING_MODE", "lenient")]);
        assert!(r.is_ok());
        assert_eq!(w, ["POD_SECURITY_GROUP_ENFORCING_MODE"]);
    }
}
