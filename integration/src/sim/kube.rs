//! The Kubernetes side of a [`Sim`]: kubesim in-process on loopback (its certificate also
//! valid for the fabric's relay address 169.254.169.201), the chart's CRDs and rendered RBAC,
//! the aws-node ServiceAccount, a Node (as an EKS kubelet registers it) and an aws-node Pod per
//! instance, per-node kubeconfigs pointing at the relay, and helpers to change and read
//! objects. Must not reach beyond loopback and the run's namespaces.

use std::path::Path;

use kubesim::KubeSim;
use serde_json::{Value, json};
use vpcsim::kube::RegisteredNode;

use super::{Sim, SimError};

/// What the Kubernetes API of a run holds at start.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// Helm values the chart is rendered with (its RBAC, ServiceAccount, ... are applied).
    pub chart_values: Value,
    /// Apply this YAML instead of rendering the chart (e.g. the rendering with a verb removed
    /// from the ClusterRole); the CRDs are applied either way.
    pub rendered: Option<String>,
}

impl Default for KubeOptions {
    fn default() -> Self {
        Self {
            chart_values: json!({}),
            rendered: None,
        }
    }
}

/// The running Kubernetes API of a run and the identities it issued.
#[derive(Debug)]
pub struct SimKube {
    /// The simulator (admin access through its methods).
    pub api: KubeSim,
    /// The aws-node ServiceAccount's token.
    pub aws_node_token: String,
    /// Per node: its Node name, aws-node Pod and kubeconfig.
    nodes: Vec<RegisteredNode>,
}

/// Namespace of aws-node.
pub use vpcsim::kube::KUBE_SYSTEM;

/// Start kubesim with `dir` for its files, apply CRDs and the chart, create the aws-node token.
pub(super) async fn start_kube(dir: &Path, opts: &KubeOptions) -> Result<SimKube, SimError> {
    let launch = |e: vpcsim::kube::KubeError| SimError::Launch(e.to_string());
    let api = vpcsim::kube::start(dir).await.map_err(launch)?;
    let rendered = match &opts.rendered {
        Some(y) => y.clone(),
        None => kubesim::chart::render_chart(&opts.chart_values)
            .map_err(|e| SimError::Launch(e.to_string()))?,
    };
    api.apply_yaml(&rendered)
        .map_err(|e| SimError::Launch(format!("kubesim chart: {e}")))?;
    let sa = api
        .service_account(KUBE_SYSTEM, "aws-node")
        .map_err(|e| SimError::Launch(format!("aws-node token: {e}")))?;
    Ok(SimKube {
        api,
        aws_node_token: sa.token,
        nodes: Vec::new(),
    })
}

impl SimKube {
    /// Node name of node `i`.
    #[must_use]
    pub fn node_name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The aws-node Pod of node `i`.
    #[must_use]
    pub fn pod_name(&self, i: usize) -> &str {
        &self.nodes[i].pod
    }

    /// Node `i`'s kubeconfig (aws-node's token, server `https://169.254.169.201:443`).
    #[must_use]
    pub fn kubeconfig(&self, i: usize) -> &Path {
        &self.nodes[i].kubeconfig
    }

    /// What ipamd in node `i` needs to find the API and itself.
    #[must_use]
    pub fn node_env(&self, i: usize) -> Vec<(String, String)> {
        vpcsim::kube::node_env(&self.nodes[i])
    }
}

impl Sim {
    /// The run's Kubernetes API, when started with `SimConfig::kube`.
    #[must_use]
    pub fn kube(&self) -> Option<&SimKube> {
        self.kube.as_ref()
    }

    fn kube_or_err(&self) -> Result<&SimKube, String> {
        self.kube
            .as_ref()
            .ok_or_else(|| "the run has no Kubernetes API (SimConfig::kube)".to_owned())
    }

    /// Register a Node and an aws-node Pod per instance and write the per-node kubeconfigs.
    pub(super) fn register_nodes(&mut self) -> Result<(), SimError> {
        let region = self.world.config().region.clone();
        let view = self.world.fabric_view(self.world.now());
        let Some(kube) = self.kube.as_ref() else {
            return Ok(());
        };
        let mut entries = Vec::new();
        for n in &self.nodes {
            let inst = view
                .instance(&n.instance_id)
                .ok_or_else(|| SimError::Launch(format!("{} not in the world", n.instance_id)))?;
            let node = vpcsim::kube::register_node(
                &kube.api,
                inst,
                &region,
                &kube.aws_node_token,
                &n.dir.join("kubeconfig"),
            )
            .map_err(|e| SimError::Launch(e.to_string()))?;
            entries.push(node);
        }
        if let Some(k) = self.kube.as_mut() {
            k.nodes = entries;
        }
        Ok(())
    }

    /// Create or replace an ENIConfig `name` (custom networking: the subnet and security
    /// groups of pods' ENIs).
    pub fn apply_eniconfig(
        &self,
        name: &str,
        subnet_id: &str,
        security_groups: &[String],
    ) -> Result<Value, String> {
        let mut spec = json!({"subnet": subnet_id});
        if !security_groups.is_empty() {
            spec["securityGroups"] = json!(security_groups);
        }
        self.kube_or_err()?
            .api
            .cluster()
            .apply_object(json!({
                "apiVersion": "crd.k8s.amazonaws.com/v1alpha1", "kind": "ENIConfig",
                "metadata": {"name": name}, "spec": spec,
            }))
            .map_err(|e| e.to_string())
    }

    /// Create or replace every object of a YAML document stream (as admin).
    pub fn kube_apply(&self, yaml: &str) -> Result<Vec<Value>, String> {
        self.kube_or_err()?
            .api
            .apply_yaml(yaml)
            .map_err(|e| e.to_string())
    }

    /// Set (`Some`) or remove (`None`) label `key` on node `i`'s Node.
    pub fn label_node(&self, i: usize, key: &str, value: Option<&str>) -> Result<Value, String> {
        self.node_meta(i, "labels", key, value)
    }

    /// Set (`Some`) or remove (`None`) annotation `key` on node `i`'s Node.
    pub fn annotate_node(&self, i: usize, key: &str, value: Option<&str>) -> Result<Value, String> {
        self.node_meta(i, "annotations", key, value)
    }

    /// Set or remove one entry of node `i`'s `metadata.<field>` (labels, annotations).
    fn node_meta(
        &self,
        i: usize,
        field: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<Value, String> {
        let k = self.kube_or_err()?;
        let mut node = k
            .api
            .get_object("v1", "Node", None, k.node_name(i))
            .map_err(|e| e.to_string())?;
        if let Some(meta) = node["metadata"].as_object_mut() {
            // apply_object creates-or-updates; a create must not carry a resourceVersion
            meta.remove("resourceVersion");
        }
        let labels = &mut node["metadata"][field];
        if !labels.is_object() {
            *labels = json!({});
        }
        if let Some(map) = labels.as_object_mut() {
            match value {
                Some(v) => {
                    map.insert(key.to_owned(), json!(v));
                }
                None => {
                    map.remove(key);
                }
            }
        }
        k.api
            .cluster()
            .apply_object(node)
            .map_err(|e| e.to_string())
    }

    /// Delete an object (as admin).
    pub fn kube_delete(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<(), String> {
        self.kube_or_err()?
            .api
            .delete_object(api_version, kind, ns, name)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Every Event in `ns` (all namespaces when `None`).
    pub fn kube_events(&self, ns: Option<&str>) -> Result<Vec<Value>, String> {
        self.kube_or_err()?
            .api
            .list_objects("v1", "Event", ns)
            .map_err(|e| e.to_string())
    }

    /// An ENI's subnet, that subnet's zone and the ENI's security groups, from the world.
    #[must_use]
    pub fn eni_placement(&self, eni_id: &str) -> Option<(String, String, Vec<String>)> {
        self.world.read(|s| {
            s.enis.get(eni_id).map(|e| {
                (
                    e.subnet_id.clone(),
                    s.subnet_az(&e.subnet_id).to_owned(),
                    e.groups.clone(),
                )
            })
        })
    }

    /// Subnets of zone `zone`: `(id, cidr)`, those in the VPC's primary block first.
    #[must_use]
    pub fn subnets_in_zone(&self, zone: &str) -> Vec<(String, ipnet::Ipv4Net)> {
        self.world.read(|s| {
            let mut v: Vec<(bool, String, ipnet::Ipv4Net)> = s
                .subnets
                .values()
                .filter(|sn| sn.availability_zone == zone)
                .map(|sn| (!s.vpc.cidr.contains(&sn.cidr), sn.id.clone(), sn.cidr))
                .collect();
            v.sort();
            v.into_iter().map(|(_, id, c)| (id, c)).collect()
        })
    }

    /// The zone of node `i`.
    #[must_use]
    pub fn node_zone(&self, i: usize) -> String {
        self.world.read(|s| {
            s.instances
                .get(&self.nodes[i].instance_id)
                .map(|inst| inst.availability_zone.clone())
                .unwrap_or_default()
        })
    }
}
