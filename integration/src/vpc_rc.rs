//! The VPC Resource Controller stand-in: what AWS's amazon-vpc-resource-controller-k8s does for
//! security groups for pods, against the Kubernetes API simulator and the simulated VPC, so the
//! whole flow runs end to end. Owns: the pure plan ([`plan`]: which `CNINode`s, trunks and
//! branches to create or delete from one [`Snapshot`]), the security-group matching of
//! `SecurityGroupPolicy` objects ([`groups_for`]), the `vpc.amazonaws.com/pod-eni` annotation
//! in the controller's JSON ([`EniDetails`]), the RBAC its ServiceAccount needs
//! ([`RBAC_YAML`], upstream's `config/rbac/role.yaml` rules), and [`Controller`], which reads a
//! snapshot through the Kubernetes API and EC2 and applies the plan.
//! Must not: touch any network namespace, or ENIs it did not create (only `trunk-eni`s it
//! attaches and `branch-eni`s on them).
//!
//! As the real controller: a `CNINode` per Node; a trunk ENI (`InterfaceType=trunk`,
//! description `trunk-eni`, the instance's subnet and groups, or its `CustomNetworking`
//! ENIConfig's) created and attached at the highest free device index once the node's
//! `CNINode` has the `SecurityGroupsForPods` feature; per pod requesting
//! `vpc.amazonaws.com/pod-eni` a branch ENI (description `branch-eni`, tags
//! `vpcresources.k8s.aws/vlan-id` and `vpcresources.k8s.aws/trunk-eni-id`) with the groups of
//! every matching `SecurityGroupPolicy` (the instance's when none), associated with the trunk
//! on the lowest free VLAN (1..=120), and the annotation written; a branch no live pod's
//! annotation names is deleted. Differences: it reconciles by listing every `period` instead
//! of watching, deletes a branch at once (no cool-down queue), and does not advertise the
//! `vpc.amazonaws.com/pod-eni` extended resource on the Node (the tests' pods request it as the
//! controller's webhook would have them do).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aws_sdk_ec2::types::{
    Filter, NetworkInterfaceCreationType, ResourceType, Tag, TagSpecification,
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The pod annotation the controller writes.
pub const POD_ENI_ANNOTATION: &str = "vpc.amazonaws.com/pod-eni";
/// The extended resource a branch pod requests.
pub const POD_ENI_RESOURCE: &str = "vpc.amazonaws.com/pod-eni";
/// Tag: a branch's VLAN id.
pub const VLAN_TAG: &str = "vpcresources.k8s.aws/vlan-id";
/// Tag: a branch's trunk.
pub const TRUNK_TAG: &str = "vpcresources.k8s.aws/trunk-eni-id";
/// Description of the trunk ENIs the controller creates.
pub const TRUNK_DESCRIPTION: &str = "trunk-eni";
/// Description of the branch ENIs the controller creates.
pub const BRANCH_DESCRIPTION: &str = "branch-eni";
/// VLAN ids the controller hands out (upstream `MaxAllocatableVlanIds` 121, 0 reserved).
pub const VLAN_IDS: std::ops::RangeInclusive<u16> = 1..=120;
/// The ServiceAccount the stand-in runs as.
pub const SERVICE_ACCOUNT: (&str, &str) = ("kube-system", "vpc-resource-controller");

/// The controller's RBAC (the rules of upstream's `config/rbac/role.yaml`), bound to
/// [`SERVICE_ACCOUNT`].
pub const RBAC_YAML: &str = r"
apiVersion: v1
kind: ServiceAccount
metadata: {name: vpc-resource-controller, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: vpc-resource-controller-role}
rules:
  - {apiGroups: [''], resources: [events], verbs: [create, patch, update]}
  - {apiGroups: [''], resources: [nodes, serviceaccounts], verbs: [get, list, watch]}
  - {apiGroups: [''], resources: [nodes/status], verbs: [get, patch]}
  - {apiGroups: [''], resources: [pods], verbs: [get, list, patch, watch]}
  - {apiGroups: [crd.k8s.amazonaws.com], resources: [eniconfigs], verbs: [get, list, watch]}
  - {apiGroups: [vpcresources.k8s.aws], resources: [cninodes], verbs: [create, delete, get, list, patch, update, watch]}
  - {apiGroups: [vpcresources.k8s.aws], resources: [securitygrouppolicies], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: vpc-resource-controller-rolebinding}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: vpc-resource-controller-role}
subjects:
  - {kind: ServiceAccount, name: vpc-resource-controller, namespace: kube-system}
";

/// One entry of the annotation, in the controller's JSON (`ENIDetails`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct EniDetails {
    /// Branch ENI id.
    #[serde(rename = "eniId")]
    pub eni_id: String,
    /// Its MAC.
    #[serde(rename = "ifAddress")]
    pub if_address: String,
    /// Its IPv4 address.
    #[serde(rename = "privateIp")]
    pub private_ip: String,
    /// Its IPv6 address ("" without).
    #[serde(rename = "ipv6Addr")]
    pub ipv6_addr: String,
    /// VLAN id on the trunk.
    #[serde(rename = "vlanId")]
    pub vlan_id: u16,
    /// The subnet's IPv4 CIDR.
    #[serde(rename = "subnetCidr")]
    pub subnet_cidr: String,
    /// The subnet's IPv6 CIDR ("" without).
    #[serde(rename = "subnetV6Cidr")]
    pub subnet_v6_cidr: String,
    /// The trunk association.
    #[serde(rename = "associationID")]
    pub association_id: String,
}

/// A `metav1.LabelSelector` (`matchLabels`, `matchExpressions`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// `matchLabels`.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// `matchExpressions`.
    #[serde(default)]
    pub match_expressions: Vec<Requirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct Requirement {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`.
    pub operator: String,
    /// Values (In/NotIn).
    #[serde(default)]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Kubernetes' semantics: every `matchLabels` pair and every requirement holds (an empty
    /// selector matches everything).
    #[must_use]
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let v = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => v.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => v.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    _ => false,
                }
            })
    }
}

/// A `SecurityGroupPolicy` (`vpcresources.k8s.aws/v1beta1`) as the controller reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    /// Namespace (a policy applies to its namespace's pods).
    pub namespace: String,
    /// `spec.podSelector` (None: not by pod labels).
    pub pod_selector: Option<LabelSelector>,
    /// `spec.serviceAccountSelector` (None: not by service account).
    pub service_account_selector: Option<LabelSelector>,
    /// `spec.securityGroups.groupIds`.
    pub groups: Vec<String>,
}

/// A pod as the plan needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its Node.
    pub node: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Its ServiceAccount's labels.
    pub service_account_labels: BTreeMap<String, String>,
    /// Requests `vpc.amazonaws.com/pod-eni` (first container's limits).
    pub requests_pod_eni: bool,
    /// The branch ENIs its annotation names (empty: not annotated).
    pub annotated: Vec<EniDetails>,
    /// Running or pending (not Succeeded/Failed, not being deleted).
    pub live: bool,
}

/// The groups a branch pod's ENI gets: those of every policy of its namespace whose given
/// selectors all match (a policy with neither selector matches nothing), deduplicated in
/// order; empty when none matches (the caller then uses the instance's groups).
#[must_use]
pub fn groups_for(pod: &PodInfo, policies: &[Policy]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in policies.iter().filter(|p| p.namespace == pod.namespace) {
        if p.pod_selector.is_none() && p.service_account_selector.is_none() {
            continue;
        }
        let by_pod = p
            .pod_selector
            .as_ref()
            .is_none_or(|s| s.matches(&pod.labels));
        let by_sa = p
            .service_account_selector
            .as_ref()
            .is_none_or(|s| s.matches(&pod.service_account_labels));
        if by_pod && by_sa {
            for g in &p.groups {
                if !out.contains(g) {
                    out.push(g.clone());
                }
            }
        }
    }
    out
}

/// A node as the plan needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// EC2 instance id (from `spec.providerID`).
    pub instance_id: String,
    /// Its `CNINode` exists.
    pub has_cninode: bool,
    /// `CNINode` features (name → value).
    pub features: BTreeMap<String, String>,
    /// The trunk ENI attached to the instance, if any.
    pub trunk: Option<String>,
    /// Branch ENIs on the trunk: id → VLAN id.
    pub branches: BTreeMap<String, u16>,
}

/// What the controller sees in one pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Nodes.
    pub nodes: Vec<NodeInfo>,
    /// Pods.
    pub pods: Vec<PodInfo>,
    /// Security group policies.
    pub policies: Vec<Policy>,
}

/// One step of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create the node's `CNINode`.
    CreateCniNode {
        /// Node name.
        node: String,
    },
    /// Create and attach a trunk ENI (`ENIConfig` name when custom networking).
    CreateTrunk {
        /// Node name.
        node: String,
        /// Instance id.
        instance_id: String,
        /// The `CustomNetworking` feature's ENIConfig, if any.
        eni_config: Option<String>,
    },
    /// Create a branch ENI for a pod, associate it, annotate the pod.
    CreateBranch {
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// Its node's instance.
        instance_id: String,
        /// The trunk.
        trunk: String,
        /// VLAN id.
        vlan_id: u16,
        /// Groups (empty: the instance's).
        groups: Vec<String>,
    },
    /// Delete a branch ENI no live pod names.
    DeleteBranch {
        /// Branch ENI id.
        eni_id: String,
    },
}

/// The pure plan of one pass.
#[must_use]
pub fn plan(s: &Snapshot) -> Vec<Action> {
    let mut out = Vec::new();
    let named: BTreeSet<&str> = s
        .pods
        .iter()
        .filter(|p| p.live)
        .flat_map(|p| p.annotated.iter().map(|d| d.eni_id.as_str()))
        .collect();
    for n in &s.nodes {
        if !n.has_cninode {
            out.push(Action::CreateCniNode {
                node: n.name.clone(),
            });
            continue;
        }
        let Some(trunk) = &n.trunk else {
            if n.features.contains_key("SecurityGroupsForPods") {
                out.push(Action::CreateTrunk {
                    node: n.name.clone(),
                    instance_id: n.instance_id.clone(),
                    eni_config: n.features.get("CustomNetworking").cloned(),
                });
            }
            continue;
        };
        for eni in n.branches.keys() {
            if !named.contains(eni.as_str()) {
                out.push(Action::DeleteBranch {
                    eni_id: eni.clone(),
                });
            }
        }
        let mut used: BTreeSet<u16> = n
            .branches
            .iter()
            .filter(|(eni, _)| named.contains(eni.as_str()))
            .map(|(_, v)| *v)
            .collect();
        for p in s
            .pods
            .iter()
            .filter(|p| p.node == n.name && p.live && p.requests_pod_eni && p.annotated.is_empty())
        {
            let Some(vlan_id) = VLAN_IDS.clone().find(|v| !used.contains(v)) else {
                break;
            };
            used.insert(vlan_id);
            out.push(Action::CreateBranch {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                instance_id: n.instance_id.clone(),
                trunk: trunk.clone(),
                vlan_id,
                groups: groups_for(p, &s.policies),
            });
        }
    }
    out
}

/// A failure of one call.
#[derive(Debug, thiserror::Error)]
pub enum RcError {
    /// Kubernetes API.
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// Kubeconfig.
    #[error("kubeconfig: {0}")]
    Config(#[from] kube::config::KubeconfigError),
    /// EC2.
    #[error("ec2 {call}: {message}")]
    Ec2 {
        /// The call.
        call: &'static str,
        /// EC2's code and message.
        message: String,
    },
    /// Something EC2 or the API server should have had.
    #[error("{0}")]
    Missing(String),
}

fn ec2_err<E: aws_sdk_ec2::error::ProvideErrorMetadata + std::fmt::Debug>(
    call: &'static str,
) -> impl FnOnce(E) -> RcError {
    move |e| RcError::Ec2 {
        call,
        message: format!(
            "{}: {}",
            e.code().unwrap_or("<no code>"),
            e.message().unwrap_or_default()
        ),
    }
}

fn cninode_resource() -> ApiResource {
    ApiResource {
        group: "vpcresources.k8s.aws".into(),
        version: "v1alpha1".into(),
        api_version: "vpcresources.k8s.aws/v1alpha1".into(),
        kind: "CNINode".into(),
        plural: "cninodes".into(),
    }
}

fn sgp_resource() -> ApiResource {
    ApiResource {
        group: "vpcresources.k8s.aws".into(),
        version: "v1beta1".into(),
        api_version: "vpcresources.k8s.aws/v1beta1".into(),
        kind: "SecurityGroupPolicy".into(),
        plural: "securitygrouppolicies".into(),
    }
}

fn eniconfig_resource() -> ApiResource {
    ApiResource {
        group: "crd.k8s.amazonaws.com".into(),
        version: "v1alpha1".into(),
        api_version: "crd.k8s.amazonaws.com/v1alpha1".into(),
        kind: "ENIConfig".into(),
        plural: "eniconfigs".into(),
    }
}

/// The stand-in: a Kubernetes client (its own ServiceAccount) and an EC2 client.
#[derive(Clone)]
pub struct Controller {
    kube: kube::Client,
    ec2: aws_sdk_ec2::Client,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").finish_non_exhaustive()
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Actions applied.
    pub applied: Vec<Action>,
    /// Actions that failed, with why.
    pub failed: Vec<(Action, String)>,
}

impl Controller {
    /// A controller with the kubeconfig at `kubeconfig` and EC2 at `ec2_endpoint`.
    pub async fn connect(
        kubeconfig: &std::path::Path,
        ec2_endpoint: &str,
        region: &str,
    ) -> Result<Self, RcError> {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        let kube = kube::Client::try_from(config)?;
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let conf = aws_sdk_ec2::Config::builder()
            .behavior_version(aws_sdk_ec2::config::BehaviorVersion::latest())
            .region(aws_sdk_ec2::config::Region::new(region.to_owned()))
            .credentials_provider(aws_sdk_ec2::config::Credentials::new(
                "AKIDVPCRC",
                "secret",
                None,
                None,
                "static",
            ))
            .endpoint_url(ec2_endpoint)
            .http_client(http)
            .build();
        Ok(Self {
            kube,
            ec2: aws_sdk_ec2::Client::from_conf(conf),
        })
    }

    /// Reads what the plan needs.
    pub async fn snapshot(&self) -> Result<Snapshot, RcError> {
        let nodes = Api::<Node>::all(self.kube.clone())
            .list(&ListParams::default())
            .await?;
        let cninodes = Api::<DynamicObject>::all_with(self.kube.clone(), &cninode_resource())
            .list(&ListParams::default())
            .await?;
        let mut out = Snapshot::default();
        for n in &nodes.items {
            let name = n.metadata.name.clone().unwrap_or_default();
            let instance_id = n
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .and_then(|p| p.rsplit('/').next())
                .unwrap_or_default()
                .to_owned();
            let cni = cninodes
                .items
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name.as_str()));
            let features = cni
                .and_then(|c| c.data.pointer("/spec/features"))
                .and_then(Value::as_array)
                .map(|fs| {
                    fs.iter()
                        .filter_map(|f| {
                            Some((
                                f["name"].as_str()?.to_owned(),
                                f["value"].as_str().unwrap_or_default().to_owned(),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let trunk = self.trunk_of(&instance_id).await?;
            let branches = match &trunk {
                Some(t) => self.branches_of(t).await?,
                None => BTreeMap::new(),
            };
            out.nodes.push(NodeInfo {
                name,
                instance_id,
                has_cninode: cni.is_some(),
                features,
                trunk,
                branches,
            });
        }
        let sa_labels = self.service_account_labels().await?;
        let pods = Api::<Pod>::all(self.kube.clone())
            .list(&ListParams::default())
            .await?;
        for p in &pods.items {
            let namespace = p.metadata.namespace.clone().unwrap_or_default();
            let spec = p.spec.clone().unwrap_or_default();
            let requests_pod_eni = spec
                .containers
                .first()
                .and_then(|c| c.resources.as_ref())
                .and_then(|r| r.limits.as_ref())
                .is_some_and(|l| l.keys().any(|k| k.starts_with(POD_ENI_RESOURCE)));
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or_default();
            let sa = spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into());
            out.pods.push(PodInfo {
                labels: p.metadata.labels.clone().unwrap_or_default(),
                service_account_labels: sa_labels
                    .get(&(namespace.clone(), sa))
                    .cloned()
                    .unwrap_or_default(),
                namespace,
                name: p.metadata.name.clone().unwrap_or_default(),
                node: spec.node_name.clone().unwrap_or_default(),
                requests_pod_eni,
                annotated: p
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(POD_ENI_ANNOTATION))
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or_default(),
                live: p.metadata.deletion_timestamp.is_none()
                    && !matches!(phase, "Succeeded" | "Failed"),
            });
        }
        let policies = Api::<DynamicObject>::all_with(self.kube.clone(), &sgp_resource())
            .list(&ListParams::default())
            .await?;
        for p in &policies.items {
            let spec = &p.data["spec"];
            let selector = |key: &str| {
                spec.get(key)
                    .filter(|v| !v.is_null())
                    .and_then(|v| serde_json::from_value::<LabelSelector>(v.clone()).ok())
            };
            out.policies.push(Policy {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                pod_selector: selector("podSelector"),
                service_account_selector: selector("serviceAccountSelector"),
                groups: spec
                    .pointer("/securityGroups/groupIds")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|g| g.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
        Ok(out)
    }

    async fn service_account_labels(
        &self,
    ) -> Result<BTreeMap<(String, String), BTreeMap<String, String>>, RcError> {
        let sas = Api::<k8s_openapi::api::core::v1::ServiceAccount>::all(self.kube.clone())
            .list(&ListParams::default())
            .await?;
        Ok(sas
            .items
            .iter()
            .map(|s| {
                (
                    (
                        s.metadata.namespace.clone().unwrap_or_default(),
                        s.metadata.name.clone().unwrap_or_default(),
                    ),
                    s.metadata.labels.clone().unwrap_or_default(),
                )
            })
            .collect())
    }

    async fn trunk_of(&self, instance_id: &str) -> Result<Option<String>, RcError> {
        if instance_id.is_empty() {
            return Ok(None);
        }
        let out = self
            .ec2
            .describe_network_interfaces()
            .filters(
                Filter::builder()
                    .name("attachment.instance-id")
                    .values(instance_id)
                    .build(),
            )
            .send()
            .await
            .map_err(ec2_err("DescribeNetworkInterfaces"))?;
        Ok(out
            .network_interfaces()
            .iter()
            .find(|e| e.interface_type().map(|t| t.as_str()) == Some("trunk"))
            .and_then(|e| e.network_interface_id().map(str::to_owned)))
    }

    async fn branches_of(&self, trunk: &str) -> Result<BTreeMap<String, u16>, RcError> {
        let out = self
            .ec2
            .describe_trunk_interface_associations()
            .filters(
                Filter::builder()
                    .name("trunk-interface-association.trunk-interface-id")
                    .values(trunk)
                    .build(),
            )
            .send()
            .await
            .map_err(ec2_err("DescribeTrunkInterfaceAssociations"))?;
        Ok(out
            .interface_associations()
            .iter()
            .filter_map(|a| {
                Some((
                    a.branch_interface_id()?.to_owned(),
                    u16::try_from(a.vlan_id()?).ok()?,
                ))
            })
            .collect())
    }

    /// The instance's subnet, security groups and the device indexes in use, and its type's
    /// ENI limit.
    async fn instance(
        &self,
        instance_id: &str,
    ) -> Result<(String, Vec<String>, Vec<i32>, i32), RcError> {
        let out = self
            .ec2
            .describe_instances()
            .instance_ids(instance_id)
            .send()
            .await
            .map_err(ec2_err("DescribeInstances"))?;
        let inst = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .next()
            .ok_or_else(|| RcError::Missing(format!("instance {instance_id}")))?;
        let subnet = inst.subnet_id().unwrap_or_default().to_owned();
        let primary = inst
            .network_interfaces()
            .iter()
            .find(|e| e.attachment().and_then(|a| a.device_index()) == Some(0));
        let groups = primary
            .map(|e| {
                e.groups()
                    .iter()
                    .filter_map(|g| g.group_id().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let used = inst
            .network_interfaces()
            .iter()
            .filter_map(|e| e.attachment().and_then(|a| a.device_index()))
            .collect();
        let ty = inst
            .instance_type()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default();
        let types = self
            .ec2
            .describe_instance_types()
            .instance_types(ty.as_str().into())
            .send()
            .await
            .map_err(ec2_err("DescribeInstanceTypes"))?;
        let max = types
            .instance_types()
            .first()
            .and_then(|t| t.network_info())
            .and_then(|n| n.maximum_network_interfaces())
            .unwrap_or(0);
        Ok((subnet, groups, used, max))
    }

    async fn subnet_cidrs(&self, subnet: &str) -> Result<(String, String), RcError> {
        let out = self
            .ec2
            .describe_subnets()
            .subnet_ids(subnet)
            .send()
            .await
            .map_err(ec2_err("DescribeSubnets"))?;
        let s = out
            .subnets()
            .first()
            .ok_or_else(|| RcError::Missing(format!("subnet {subnet}")))?;
        let v6 = s
            .ipv6_cidr_block_association_set()
            .first()
            .and_then(|a| a.ipv6_cidr_block())
            .unwrap_or_default();
        Ok((s.cidr_block().unwrap_or_default().to_owned(), v6.to_owned()))
    }

    /// The subnet and groups of a trunk (and its branches): the `CustomNetworking` ENIConfig's
    /// when the node has one, else the instance's.
    async fn placement(
        &self,
        instance_id: &str,
        eni_config: Option<&str>,
    ) -> Result<(String, Vec<String>), RcError> {
        let (subnet, groups, _, _) = self.instance(instance_id).await?;
        let Some(name) = eni_config else {
            return Ok((subnet, groups));
        };
        let cfg = Api::<DynamicObject>::all_with(self.kube.clone(), &eniconfig_resource())
            .get(name)
            .await?;
        let spec = &cfg.data["spec"];
        let groups_cfg: Vec<String> = spec["securityGroups"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|g| g.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        Ok((
            spec["subnet"].as_str().unwrap_or(&subnet).to_owned(),
            if groups_cfg.is_empty() {
                groups
            } else {
                groups_cfg
            },
        ))
    }

    async fn apply(&self, a: &Action, snapshot: &Snapshot) -> Result<(), RcError> {
        match a {
            Action::CreateCniNode { node } => {
                let obj: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "vpcresources.k8s.aws/v1alpha1",
                    "kind": "CNINode",
                    "metadata": {"name": node},
                    "spec": {},
                }))
                .map_err(|e| RcError::Missing(e.to_string()))?;
                Api::<DynamicObject>::all_with(self.kube.clone(), &cninode_resource())
                    .create(&PostParams::default(), &obj)
                    .await?;
            }
            Action::CreateTrunk {
                instance_id,
                eni_config,
                ..
            } => {
                let (subnet, groups) = self.placement(instance_id, eni_config.as_deref()).await?;
                let (_, _, used, max) = self.instance(instance_id).await?;
                let index = (1..max).rev().find(|i| !used.contains(i)).ok_or_else(|| {
                    RcError::Missing(format!("no free device index on {instance_id}"))
                })?;
                let created = self
                    .ec2
                    .create_network_interface()
                    .subnet_id(&subnet)
                    .set_groups(Some(groups))
                    .description(TRUNK_DESCRIPTION)
                    .interface_type(NetworkInterfaceCreationType::Trunk)
                    .send()
                    .await
                    .map_err(ec2_err("CreateNetworkInterface"))?;
                let id = created
                    .network_interface()
                    .and_then(|e| e.network_interface_id())
                    .ok_or_else(|| RcError::Missing("trunk id".into()))?
                    .to_owned();
                let attached = self
                    .ec2
                    .attach_network_interface()
                    .network_interface_id(&id)
                    .instance_id(instance_id)
                    .device_index(index)
                    .send()
                    .await;
                if let Err(e) = attached {
                    let _ = self
                        .ec2
                        .delete_network_interface()
                        .network_interface_id(&id)
                        .send()
                        .await;
                    return Err(ec2_err("AttachNetworkInterface")(e));
                }
            }
            Action::CreateBranch {
                namespace,
                name,
                instance_id,
                trunk,
                vlan_id,
                groups,
            } => {
                let node = snapshot
                    .nodes
                    .iter()
                    .find(|n| n.instance_id == *instance_id);
                let eni_config = node.and_then(|n| n.features.get("CustomNetworking").cloned());
                let (subnet, instance_groups) =
                    self.placement(instance_id, eni_config.as_deref()).await?;
                let groups = if groups.is_empty() {
                    instance_groups
                } else {
                    groups.clone()
                };
                let (subnet_cidr, subnet_v6_cidr) = self.subnet_cidrs(&subnet).await?;
                let tags = TagSpecification::builder()
                    .resource_type(ResourceType::NetworkInterface)
                    .tags(
                        Tag::builder()
                            .key(VLAN_TAG)
                            .value(vlan_id.to_string())
                            .build(),
                    )
                    .tags(Tag::builder().key(TRUNK_TAG).value(trunk).build())
                    .build();
                // EC2 gives a branch an IPv6 address in a subnet that assigns one on
                // creation; the simulated subnets have no such flag: ask for one when the
                // subnet has an IPv6 CIDR.
                let ipv6_count = i32::from(!subnet_v6_cidr.is_empty());
                let created = self
                    .ec2
                    .create_network_interface()
                    .subnet_id(&subnet)
                    .set_groups(Some(groups))
                    .description(BRANCH_DESCRIPTION)
                    .tag_specifications(tags)
                    .ipv6_address_count(ipv6_count)
                    .send()
                    .await
                    .map_err(ec2_err("CreateNetworkInterface"))?;
                let eni = created
                    .network_interface()
                    .ok_or_else(|| RcError::Missing("branch".into()))?;
                let eni_id = eni.network_interface_id().unwrap_or_default().to_owned();
                let mut details = EniDetails {
                    eni_id: eni_id.clone(),
                    if_address: eni.mac_address().unwrap_or_default().to_owned(),
                    private_ip: eni.private_ip_address().unwrap_or_default().to_owned(),
                    ipv6_addr: eni
                        .ipv6_addresses()
                        .first()
                        .and_then(|a| a.ipv6_address())
                        .unwrap_or_default()
                        .to_owned(),
                    vlan_id: *vlan_id,
                    subnet_cidr,
                    subnet_v6_cidr,
                    association_id: String::new(),
                };
                let assoc = self
                    .ec2
                    .associate_trunk_interface()
                    .branch_interface_id(&eni_id)
                    .trunk_interface_id(trunk)
                    .vlan_id(i32::from(*vlan_id))
                    .send()
                    .await;
                let assoc = match assoc {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = self
                            .ec2
                            .delete_network_interface()
                            .network_interface_id(&eni_id)
                            .send()
                            .await;
                        return Err(ec2_err("AssociateTrunkInterface")(e));
                    }
                };
                details.association_id = assoc
                    .interface_association()
                    .and_then(|a| a.association_id())
                    .unwrap_or_default()
                    .to_owned();
                let text = serde_json::to_string(&[details])
                    .map_err(|e| RcError::Missing(e.to_string()))?;
                let patch = json!({"metadata": {"annotations": {POD_ENI_ANNOTATION: text}}});
                Api::<Pod>::namespaced(self.kube.clone(), namespace)
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            Action::DeleteBranch { eni_id } => {
                self.ec2
                    .delete_network_interface()
                    .network_interface_id(eni_id)
                    .send()
                    .await
                    .map_err(ec2_err("DeleteNetworkInterface"))?;
            }
        }
        Ok(())
    }

    /// One pass: snapshot, plan, apply each action (a failure is reported and retried at the
    /// next pass).
    pub async fn reconcile_once(&self) -> Result<Pass, RcError> {
        let snapshot = self.snapshot().await?;
        let mut pass = Pass::default();
        for a in plan(&snapshot) {
            match self.apply(&a, &snapshot).await {
                Ok(()) => {
                    tracing::info!(action = ?a, "applied");
                    pass.applied.push(a);
                }
                Err(e) => {
                    tracing::warn!(action = ?a, error = %e, "failed; retried next pass");
                    pass.failed.push((a, e.to_string()));
                }
            }
        }
        Ok(pass)
    }

    /// Passes every `period` until `stop` resolves.
    pub async fn run(self, period: Duration, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            if let Err(e) = self.reconcile_once().await {
                tracing::warn!(error = %e, "pass failed");
            }
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(period) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn pod(name: &str, app: &str, requests: bool) -> PodInfo {
        PodInfo {
            namespace: "db".into(),
            name: name.into(),
            node: "n1".into(),
            labels: labels(&[("app", app)]),
            requests_pod_eni: requests,
            live: true,
            ..PodInfo::default()
        }
    }

    fn policy(selector: LabelSelector, groups: &[&str]) -> Policy {
        Policy {
            namespace: "db".into(),
            pod_selector: Some(selector),
            service_account_selector: None,
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    #[test]
    fn policies_match_by_labels_and_expressions_in_their_namespace() {
        let by_label = policy(
            LabelSelector {
                match_labels: labels(&[("app", "client")]),
                ..LabelSelector::default()
            },
            &["sg-a"],
        );
        let by_expr = policy(
            LabelSelector {
                match_expressions: vec![Requirement {
                    key: "app".into(),
                    operator: "In".into(),
                    values: vec!["client".into(), "other".into()],
                }],
                ..LabelSelector::default()
            },
            &["sg-b", "sg-a"],
        );
        let elsewhere = Policy {
            namespace: "web".into(),
            ..policy(LabelSelector::default(), &["sg-c"])
        };
        let policies = [by_label, by_expr, elsewhere];
        assert_eq!(
            groups_for(&pod("p", "client", true), &policies),
            ["sg-a", "sg-b"]
        );
        assert!(groups_for(&pod("p", "server", true), &policies).is_empty());
    }

    #[test]
    fn plan_creates_cninode_trunk_branches_and_deletes_orphans() {
        let mut node = NodeInfo {
            name: "n1".into(),
            instance_id: "i-1".into(),
            ..NodeInfo::default()
        };
        let mut s = Snapshot {
            nodes: vec![node.clone()],
            pods: vec![pod("a", "client", true), pod("b", "client", false)],
            policies: Vec::new(),
        };
        assert_eq!(plan(&s), [Action::CreateCniNode { node: "n1".into() }]);
        node.has_cninode = true;
        s.nodes = vec![node.clone()];
        assert!(plan(&s).is_empty(), "no trunk before the feature");
        node.features
            .insert("SecurityGroupsForPods".into(), String::new());
        s.nodes = vec![node.clone()];
        assert_eq!(
            plan(&s),
            [Action::CreateTrunk {
                node: "n1".into(),
                instance_id: "i-1".into(),
                eni_config: None
            }]
        );
        node.trunk = Some("eni-t".into());
        // VLAN 1 is held by a live pod's branch, eni-gone by nobody.
        node.branches = [("eni-1".to_owned(), 1), ("eni-gone".to_owned(), 2)].into();
        s.nodes = vec![node];
        s.pods.push(PodInfo {
            annotated: vec![EniDetails {
                eni_id: "eni-1".into(),
                vlan_id: 1,
                ..EniDetails::default()
            }],
            ..pod("c", "client", true)
        });
        let actions = plan(&s);
        assert_eq!(
            actions,
            [
                Action::DeleteBranch {
                    eni_id: "eni-gone".into()
                },
                Action::CreateBranch {
                    namespace: "db".into(),
                    name: "a".into(),
                    instance_id: "i-1".into(),
                    trunk: "eni-t".into(),
                    vlan_id: 2,
                    groups: Vec::new(),
                }
            ]
        );
    }

    #[test]
    fn the_annotation_is_the_controllers_json() {
        let d = EniDetails {
            eni_id: "eni-1".into(),
            if_address: "02:00:00:00:00:01".into(),
            private_ip: "198.18.0.9".into(),
            vlan_id: 4,
            subnet_cidr: "198.18.0.0/20".into(),
            association_id: "trunk-assoc-1".into(),
            ..EniDetails::default()
        };
        let v: Value = serde_json::to_value([d]).unwrap();
        let keys: BTreeSet<&str> = v[0]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "associationID",
                "eniId",
                "ifAddress",
                "ipv6Addr",
                "privateIp",
                "subnetCidr",
                "subnetV6Cidr",
                "vlanId"
            ]
            .into()
        );
    }
}
