//! Security groups for pods (`ENABLE_POD_ENI=true`), ipamd's half: the `vpc.amazonaws.com/pod-eni`
//! annotation the VPC Resource Controller writes on a branch pod (parsed as Go's `encoding/json`
//! reads it: the controller writes it for that reader), the AddNetwork/DelNetwork answers for a
//! branch pod (VLAN id, branch MAC, address, subnet gateway, the trunk's link index), and the
//! `CNINode` features that ask the controller for a trunk ENI (`SecurityGroupsForPods`) and tell it
//! the node's ENIConfig (`CustomNetworking`). The trunk itself is an ENI of the datastore flagged
//! `is_trunk`: never assigned from, never freed (datastore, pool). Branch pods hold no datastore
//! entry: every answer comes from the pod's annotation, so a restart or a lost checkpoint changes
//! nothing. Must not: assign or release datastore addresses, create or delete ENIs (the controller
//! does), touch the kernel but to read the trunk's link index.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::ipam::Ipam;
use crate::k8s::{self, Cluster, PodFacts};
use crate::metrics::Metrics;

/// The VPC router's IPv6 address on every subnet.
pub const IPV6_GATEWAY: Ipv6Addr = Ipv6Addr::new(0xfe80, 0x0ec2, 0, 0, 0, 0, 0, 1);

/// One entry of the annotation (the controller's `ENIDetails`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodEniData {
    /// `eniId`.
    pub eni_id: String,
    /// `ifAddress`: the branch ENI's MAC.
    pub if_address: String,
    /// `privateIp`.
    pub private_ip: String,
    /// `ipv6Addr`.
    pub ipv6_addr: String,
    /// `vlanID` (the controller writes `vlanId`; Go matches keys case-insensitively).
    pub vlan_id: i64,
    /// `subnetCidr`.
    pub subnet_cidr: String,
    /// `subnetV6Cidr`.
    pub subnet_v6_cidr: String,
}

/// Why the annotation is not a `[]PodENIData`, in Go's terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// Not JSON.
    #[error("invalid json: {0}")]
    Syntax(String),
    /// JSON of the wrong shape (what Go's `UnmarshalTypeError` reports).
    #[error("cannot unmarshal {found} into {into}")]
    Type {
        /// The JSON kind found.
        found: &'static str,
        /// Where.
        into: String,
    },
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Go's field lookup: the exact key, else the first key equal ignoring case.
fn field<'a>(obj: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn string_field(
    obj: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<String, AnnotationError> {
    match field(obj, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(AnnotationError::Type {
            found: kind(v),
            into: format!("PodENIData.{name} of type string"),
        }),
    }
}

/// Parses the annotation as Go's `json.Unmarshal` reads it: an array (null is an empty one) of
/// objects (null entries are zero values), keys matched case-insensitively, unknown keys ignored, a
/// field of the wrong type an error.
pub fn parse_annotation(text: &str) -> Result<Vec<PodEniData>, AnnotationError> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| AnnotationError::Syntax(e.to_string()))?;
    let items = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        other => {
            return Err(AnnotationError::Type {
                found: kind(&other),
                into: "[]PodENIData".into(),
            });
        }
    };
    items
        .iter()
        .map(|item| {
            let obj = match item {
                Value::Null => return Ok(PodEniData::default()),
                Value::Object(o) => o,
                other => {
                    return Err(AnnotationError::Type {
                        found: kind(other),
                        into: "PodENIData".into(),
                    });
                }
            };
            let vlan_id = match field(obj, "vlanID") {
                None | Some(Value::Null) => 0,
                Some(Value::Number(n)) => n.as_i64().ok_or_else(|| AnnotationError::Type {
                    found: "number",
                    into: "PodENIData.vlanID of type int".into(),
                })?,
                Some(v) => {
                    return Err(AnnotationError::Type {
                        found: kind(v),
                        into: "PodENIData.vlanID of type int".into(),
                    });
                }
            };
            Ok(PodEniData {
                eni_id: string_field(obj, "eniId")?,
                if_address: string_field(obj, "ifAddress")?,
                private_ip: string_field(obj, "privateIp")?,
                ipv6_addr: string_field(obj, "ipv6Addr")?,
                vlan_id,
                subnet_cidr: string_field(obj, "subnetCidr")?,
                subnet_v6_cidr: string_field(obj, "subnetV6Cidr")?,
            })
        })
        .collect()
}

/// Why a branch pod gets no answer (each is answered `Success=false`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BranchError {
    /// The pod could not be read from the API server.
    #[error("failed to get pod {pod}: {reason}")]
    Pod {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        reason: String,
    },
    /// The pod requests `vpc.amazonaws.com/pod-eni` but no trunk ENI is attached yet.
    #[error("no trunk ENI found, cannot add a pod ENI")]
    NoTrunk,
    /// The trunk's link is not visible in the host netns.
    #[error("no link for trunk ENI {eni} (mac {mac}): {reason}")]
    TrunkLink {
        /// Trunk ENI id.
        eni: String,
        /// Its MAC.
        mac: String,
        /// Why.
        reason: String,
    },
    /// The controller has not annotated the pod (yet).
    #[error(
        "pod {0} has no vpc.amazonaws.com/pod-eni annotation (the VPC Resource Controller writes it)"
    )]
    NoAnnotation(String),
    /// The annotation is not a `[]PodENIData`.
    #[error("failed to unmarshal PodENIData JSON {annotation:?}: {error}")]
    Malformed {
        /// The annotation.
        annotation: String,
        /// Go's complaint.
        error: AnnotationError,
    },
    /// The annotation is an empty list.
    #[error("parsed PodENIData is empty")]
    Empty,
    /// The first entry lacks the address of the pods' family, the MAC or the VLAN id.
    #[error("failed to parse pod-ENI annotation {0:?}: address, ifAddress and vlanID are required")]
    Incomplete(String),
    /// The subnet CIDR of the pods' family does not parse.
    #[error("failed to parse subnet CIDR {0:?}")]
    BadSubnet(String),
    /// DelNetwork: the pod of that name is another pod (its UID differs).
    #[error("pod UID mismatch: got {got}, expected {expected}")]
    UidMismatch {
        /// The request's `K8S_POD_UID`.
        got: String,
        /// The API server's.
        expected: String,
    },
}

/// What AddNetwork answers a branch pod (the reply fields the plugin reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchAddress {
    /// `IPv4Addr` (empty in IPv6 mode).
    pub ipv4: String,
    /// `IPv6Addr` (IPv6 mode only).
    pub ipv6: String,
    /// `PodENIMAC`.
    pub mac: String,
    /// `PodVlanId`.
    pub vlan_id: i32,
    /// `PodENISubnetGW`: the subnet's `.1` (IPv4) or `fe80:ec2::1` (IPv6).
    pub gateway: String,
    /// The branch ENI (logs, introspection).
    pub eni_id: String,
}

/// AddNetwork's reading of a branch pod's annotation: the first entry; in IPv6 mode its `ipv6Addr`,
/// else its `privateIp`; MAC and VLAN required; the gateway from the subnet.
pub fn branch_address(annotation: &str, ipv6_mode: bool) -> Result<BranchAddress, BranchError> {
    let data = parse_annotation(annotation).map_err(|error| BranchError::Malformed {
        annotation: annotation.to_owned(),
        error,
    })?;
    let first = data.first().ok_or(BranchError::Empty)?;
    let (ipv4, ipv6) = if ipv6_mode {
        (String::new(), first.ipv6_addr.clone())
    } else {
        (first.private_ip.clone(), String::new())
    };
    if (ipv4.is_empty() && ipv6.is_empty()) || first.if_address.is_empty() || first.vlan_id == 0 {
        return Err(BranchError::Incomplete(annotation.to_owned()));
    }
    let vlan_id =
        i32::try_from(first.vlan_id).map_err(|_| BranchError::Incomplete(annotation.to_owned()))?;
    let subnet_text = if ipv6_mode {
        &first.subnet_v6_cidr
    } else {
        &first.subnet_cidr
    };
    let subnet: IpNet = subnet_text
        .parse()
        .map_err(|_| BranchError::BadSubnet(subnet_text.clone()))?;
    let gateway = match subnet {
        IpNet::V4(n) if !ipv6_mode => {
            IpAddr::V4(Ipv4Addr::from(u32::from(n.network()).wrapping_add(1)))
        }
        IpNet::V6(_) if ipv6_mode => IpAddr::V6(IPV6_GATEWAY),
        _ => return Err(BranchError::BadSubnet(subnet_text.clone())),
    };
    Ok(BranchAddress {
        ipv4,
        ipv6,
        mac: first.if_address.clone(),
        vlan_id,
        gateway: gateway.to_string(),
        eni_id: first.eni_id.clone(),
    })
}

/// What DelNetwork answers for a pod the datastore does not know but whose annotation names a
/// branch ENI: `PodVlanId` and the `privateIp` as `IPv4Addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchRelease {
    /// `PodVlanId`.
    pub vlan_id: i32,
    /// `IPv4Addr`: the `privateIp` (IPv4 mode).
    pub ipv4: String,
    /// `IPv6Addr`: the `ipv6Addr` (IPv6 mode).
    pub ipv6: String,
}

impl BranchRelease {
    /// The answer for an annotation's first entry: its VLAN and the address of the node's
    /// mode, as AddNetwork answered it ([`branch_address`]): `ipv6Addr` in IPv6 mode, never
    /// the `privateIp` beside it.
    #[must_use]
    pub fn of(first: &PodEniData, ipv6_mode: bool) -> Self {
        let (ipv4, ipv6) = if ipv6_mode {
            (String::new(), first.ipv6_addr.clone())
        } else {
            (first.private_ip.clone(), String::new())
        };
        Self {
            vlan_id: i32::try_from(first.vlan_id).unwrap_or_default(),
            ipv4,
            ipv6,
        }
    }
}

/// Finds a link's index by MAC in ipamd's netns (the trunk's, for `ParentIfIndex`).
pub trait LinkIndex: Send + Sync + std::fmt::Debug {
    /// The index of the link with `mac`.
    fn link_index<'a>(&'a self, mac: &'a str) -> SeamFuture<'a, Result<u32, SeamError>>;
}

/// The host netns, read through `host::HostNetwork`.
impl LinkIndex for crate::host::HostNetwork {
    fn link_index<'a>(&'a self, mac: &'a str) -> SeamFuture<'a, Result<u32, SeamError>> {
        Box::pin(async move {
            let mac: dataplane::MacAddr = mac
                .parse()
                .map_err(|_| SeamError::from(format!("bad mac {mac:?}")))?;
            self.link_index_by_mac(mac)
                .await
                .map_err(SeamError::from)?
                .ok_or_else(|| SeamError::from("no such link"))
        })
    }
}

pub use crate::host::SeamError;

/// A boxed future of this module's seams (dyn-compatible async).
pub type SeamFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Annotated pods of a node: `(namespace, name, annotation value)`.
pub type AnnotatedPods = Vec<(String, String, String)>;

/// The pods of the cluster as branch pods need them: one pod by name, the annotated pods of
/// this node. `Cluster` (the API server) in the daemon; the whole-daemon simulation's
/// controller stand-in in its tests.
pub trait PodDirectory: Send + Sync + std::fmt::Debug {
    /// The pod `namespace/name`; None when it does not exist.
    fn pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> SeamFuture<'a, Result<Option<PodFacts>, SeamError>>;

    /// The pods on this node that carry `annotation`: `(namespace, name, value)`.
    fn annotated_pods_on_node<'a>(
        &'a self,
        annotation: &'a str,
    ) -> SeamFuture<'a, Result<AnnotatedPods, SeamError>>;
}

impl PodDirectory for Cluster {
    fn pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> SeamFuture<'a, Result<Option<PodFacts>, SeamError>> {
        Box::pin(async move {
            Cluster::pod(self, namespace, name)
                .await
                .map_err(SeamError::from)
        })
    }

    fn annotated_pods_on_node<'a>(
        &'a self,
        annotation: &'a str,
    ) -> SeamFuture<'a, Result<AnnotatedPods, SeamError>> {
        Box::pin(async move {
            Cluster::annotated_pods_on_node(self, annotation)
                .await
                .map_err(SeamError::from)
        })
    }
}

/// Branch pods' AddNetwork/DelNetwork: the pod through the cluster, the trunk from the
/// datastore, its link from the host.
#[derive(Debug, Clone)]
pub struct BranchPods {
    pods: Arc<dyn PodDirectory>,
    ipam: Arc<Ipam>,
    links: Option<Arc<dyn LinkIndex>>,
    ipv6_mode: bool,
}

/// A branch pod's AddNetwork answer: the address and the trunk's link index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BranchAnswer {
    /// From the annotation.
    pub address: BranchAddress,
    /// `ParentIfIndex`: the trunk ENI's link.
    pub parent_if_index: u32,
}

impl BranchPods {
    /// Over `cluster` and `ipam`; `links` finds the trunk's link (None: no host netns, e.g.
    /// the in-memory provider, where no trunk can exist).
    pub fn new(
        pods: Arc<dyn PodDirectory>,
        ipam: Arc<Ipam>,
        links: Option<Arc<dyn LinkIndex>>,
        ipv6_mode: bool,
    ) -> Self {
        Self {
            pods,
            ipam,
            links,
            ipv6_mode,
        }
    }

    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodFacts>, BranchError> {
        self.pods
            .pod(namespace, name)
            .await
            .map_err(|reason| BranchError::Pod {
                pod: format!("{namespace}/{name}"),
                reason: reason.to_string(),
            })
    }

    /// AddNetwork with pod ENIs on: the pod is read (a failure fails the ADD); a pod that does not
    /// request `vpc.amazonaws.com/pod-eni` is no branch pod (`Ok(None)`: the datastore serves it);
    /// a branch pod gets its answer from the trunk and its annotation. `uid` (the runtime's
    /// `K8S_POD_UID`, empty from a plugin that sends none): a pod of that name with another UID is
    /// a pod re-created since this sandbox was made, and its object must not decide this sandbox's
    /// wiring (a VLAN it owns now): refused.
    pub async fn add(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<BranchAnswer>, BranchError> {
        let pod = self
            .pod(namespace, name)
            .await?
            .ok_or_else(|| BranchError::Pod {
                pod: format!("{namespace}/{name}"),
                reason: "not found".into(),
            })?;
        if !uid.is_empty() && pod.uid != uid {
            return Err(BranchError::UidMismatch {
                got: uid.to_owned(),
                expected: pod.uid,
            });
        }
        if !pod.requests_pod_eni {
            return Ok(None);
        }
        let (eni, mac) = self
            .ipam
            .index
            .read(crate::datastore::DataStore::trunk_eni)
            .ok_or(BranchError::NoTrunk)?;
        let link_error = |reason: SeamError| BranchError::TrunkLink {
            eni: eni.clone(),
            mac: mac.clone(),
            reason: reason.to_string(),
        };
        let links = self
            .links
            .as_ref()
            .ok_or_else(|| link_error("no host network namespace".into()))?;
        let parent_if_index = links.link_index(&mac).await.map_err(link_error)?;
        let annotation = pod
            .annotations
            .get(k8s::POD_ENI_ANNOTATION)
            .ok_or_else(|| BranchError::NoAnnotation(format!("{namespace}/{name}")))?;
        let address = branch_address(annotation, self.ipv6_mode)?;
        Ok(Some(BranchAnswer {
            address,
            parent_if_index,
        }))
    }

    /// DelNetwork for a pod the datastore does not know: a pod gone from the API server is released
    /// (`Ok(Some)` with VLAN 0: nothing to tear down by VLAN); another pod of that name is an
    /// error; an annotated pod's VLAN and address are answered; a pod without the annotation is
    /// `Ok(None)` (the unknown-pod answer stands).
    pub async fn release(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<BranchRelease>, BranchError> {
        let Some(pod) = self.pod(namespace, name).await? else {
            return Ok(Some(BranchRelease {
                vlan_id: 0,
                ipv4: String::new(),
                ipv6: String::new(),
            }));
        };
        if pod.uid != uid {
            return Err(BranchError::UidMismatch {
                got: uid.to_owned(),
                expected: pod.uid,
            });
        }
        let Some(annotation) = pod.annotations.get(k8s::POD_ENI_ANNOTATION) else {
            return Ok(None);
        };
        let data = parse_annotation(annotation).map_err(|error| BranchError::Malformed {
            annotation: annotation.clone(),
            error,
        })?;
        let first = data.first().ok_or(BranchError::Empty)?;
        Ok(Some(BranchRelease::of(first, self.ipv6_mode)))
    }
}

impl BranchPods {
    /// `/v1/branch-pods`: the trunk ENI and the pods on this node the controller annotated with a
    /// branch ENI, as the API server lists them now (ipamd itself keeps no state for branch pods).
    pub async fn view(&self) -> Result<serde_json::Value, SeamError> {
        let pods = self
            .pods
            .annotated_pods_on_node(k8s::POD_ENI_ANNOTATION)
            .await?;
        let rows: Vec<serde_json::Value> = pods
            .into_iter()
            .map(|(namespace, name, text)| {
                let first = parse_annotation(&text)
                    .ok()
                    .and_then(|d| d.into_iter().next())
                    .unwrap_or_default();
                serde_json::json!({
                    "Namespace": namespace,
                    "Name": name,
                    "ENIID": first.eni_id,
                    "VlanID": first.vlan_id,
                    "MAC": first.if_address,
                    "IPv4": first.private_ip,
                    "IPv6": first.ipv6_addr,
                })
            })
            .collect();
        let trunk = self
            .ipam
            .index
            .read(crate::datastore::DataStore::trunk_eni)
            .map(|(id, _)| id)
            .unwrap_or_default();
        Ok(serde_json::json!({"TrunkENI": trunk, "BranchPods": rows}))
    }
}

/// How often the trunk loop looks while the node has no trunk.
pub const TRUNK_CHECK_PERIOD: Duration = Duration::from_secs(5);

/// Whether the node can take a trunk: IPv4 needs a free ENI slot on network card 0 (attached ENIs
/// `<` max ENIs − unmanaged); IPv6 always.
#[must_use]
pub fn room_for_trunk(ipv6_mode: bool, attached: u32, max_enis: u32) -> bool {
    ipv6_mode || attached < max_enis
}

/// While the node has no trunk and there is room for one, the `SecurityGroupsForPods` feature goes
/// on the node's `CNINode` (the controller then attaches a trunk); a failure counts
/// `awscni_pod_eni_error_count{fn="tryEnableSecurityGroupsForPods"}` and is retried. Once a trunk
/// is in the datastore the loop only watches for it to go.
pub async fn advertise_trunk_feature(
    cluster: Cluster,
    ipam: Arc<Ipam>,
    metrics: Arc<Metrics>,
    ipv6_mode: bool,
    max_enis: u32,
    shutdown: CancellationToken,
) {
    let mut logged_no_room = false;
    loop {
        if ipam
            .index
            .read(crate::datastore::DataStore::trunk_eni)
            .is_none()
        {
            let attached = ipam.index.read(|ds| {
                u32::try_from(ds.enis().values().filter(|e| !e.gone).count()).unwrap_or(u32::MAX)
            });
            if room_for_trunk(ipv6_mode, attached, max_enis) {
                logged_no_room = false;
                match cluster
                    .add_cninode_feature(k8s::FEATURE_SECURITY_GROUPS_FOR_PODS, "")
                    .await
                {
                    Ok(patched) => {
                        if patched {
                            tracing::info!(
                                "Successfully added feature SecurityGroupsForPods to CNINode"
                            );
                        }
                    }
                    Err(e) => {
                        metrics
                            .pod_eni_error_count
                            .inc(["tryEnableSecurityGroupsForPods"]);
                        tracing::error!(error = %e, "Failed to add SGP feature to CNINode resource");
                    }
                }
            } else if !logged_no_room {
                tracing::error!(
                    attached,
                    max_enis,
                    "No slot available for a trunk ENI to be attached."
                );
                logged_no_room = true;
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(TRUNK_CHECK_PERIOD) => {}
        }
    }
}

/// Security groups for pods (`ENABLE_POD_ENI`): the pool keeps a slot for the trunk on a
/// trunking-capable type; with custom networking the node's ENIConfig goes on its `CNINode`
/// (`CustomNetworking`: a failure counts `awscni_pod_eni_error_count{fn="nodeInit"}` and ends the
/// start); the `SecurityGroupsForPods` feature loop becomes a task; branch pods are answered from
/// their annotation with the trunk's link from the host netns.
#[allow(clippy::too_many_arguments)]
pub async fn start(
    config: &crate::config::Config,
    mode: crate::config::PodSgMode,
    cluster: &k8s::Cluster,
    ipam: &Arc<Ipam>,
    metrics: &Arc<Metrics>,
    host: Option<Arc<crate::host::HostNetwork>>,
    trunking_compatible: bool,
    max_enis: u32,
    inner: &CancellationToken,
    tasks: &mut Vec<crate::task::Task>,
) -> anyhow::Result<BranchPods> {
    tracing::info!(
        mode = mode.as_str(),
        trunking_compatible,
        "security groups for pods (ENABLE_POD_ENI): branch pods answered from their vpc.amazonaws.com/pod-eni annotation"
    );
    ipam.node_state.reserve_trunk_slot(trunking_compatible);
    if config.kube.custom_network_cfg {
        let name = cluster
            .node()
            .borrow()
            .as_ref()
            .map(|f| k8s::eni_config_name(f, &config.kube.eni_config_keys));
        match name {
            Some(name) if name != k8s::DEFAULT_ENI_CONFIG_NAME => {
                if let Err(e) = cluster
                    .add_cninode_feature(k8s::FEATURE_CUSTOM_NETWORKING, &name)
                    .await
                {
                    metrics.pod_eni_error_count.inc(["nodeInit"]);
                    return Err(anyhow::anyhow!(e)
                        .context("Failed to add feature custom networking into CNINode"));
                }
                tracing::info!(eni_config = %name, "Enabled feature CustomNetworking in CNINode if not existing");
            }
            _ => tracing::error!("No ENIConfig could be found for this node"),
        }
    }
    let ipv6 = config.family.is_v6_only();
    let loop_ = advertise_trunk_feature(
        cluster.clone(),
        ipam.clone(),
        metrics.clone(),
        ipv6,
        max_enis,
        inner.clone(),
    );
    tasks.push(crate::task::Task::new(
        "CNINode SecurityGroupsForPods",
        async move {
            loop_.await;
            Ok(())
        },
    ));
    let links = host.map(|h| h as Arc<dyn LinkIndex>);
    Ok(BranchPods::new(
        Arc::new(cluster.clone()),
        ipam.clone(),
        links,
        ipv6,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The controller's format (`ENIDetails`: `vlanId`, `associationID`), read as upstream's
    /// `PodENIData` (`vlanID`) through Go's case-insensitive keys.
    const CONTROLLER: &str = r#"[{"eniId":"eni-0123","ifAddress":"02:5e:00:00:00:2a","privateIp":"198.18.0.77","ipv6Addr":"","vlanId":3,"subnetCidr":"198.18.0.0/20","subnetV6Cidr":"2001:db8:1200::/64","associationID":"trunk-assoc-1"}]"#;

    #[test]
    fn the_controllers_annotation_gives_the_branch_answer() {
        let a = branch_address(CONTROLLER, false).unwrap();
        assert_eq!(
            a,
            BranchAddress {
                ipv4: "198.18.0.77".into(),
                ipv6: String::new(),
                mac: "02:5e:00:00:00:2a".into(),
                vlan_id: 3,
                gateway: "198.18.0.1".into(),
                eni_id: "eni-0123".into(),
            }
        );
    }

    /// The DelNetwork answer of a branch pod names the address of the node's mode, as the
    /// AddNetwork answer did: in IPv6 mode the `ipv6Addr`, never the IPv4 `privateIp` the
    /// controller also writes (issue 38: it carried the IPv4 in IPv6 mode).
    #[test]
    fn branch_del_reply_names_the_address_of_the_nodes_mode() {
        let text = CONTROLLER.replace(r#""ipv6Addr":"""#, r#""ipv6Addr":"2001:db8:1200::77""#);
        let data = parse_annotation(&text).unwrap();
        let v6 = BranchRelease::of(&data[0], true);
        assert_eq!(
            (v6.vlan_id, v6.ipv4.as_str(), v6.ipv6.as_str()),
            (3, "", "2001:db8:1200::77")
        );
        let v4 = BranchRelease::of(&data[0], false);
        assert_eq!(
            (v4.vlan_id, v4.ipv4.as_str(), v4.ipv6.as_str()),
            (3, "198.18.0.77", "")
        );
    }

    #[test]
    fn ipv6_mode_takes_the_ipv6_address_and_the_router_gateway() {
        let text = CONTROLLER.replace(r#""ipv6Addr":"""#, r#""ipv6Addr":"2001:db8:1200::77""#);
        let a = branch_address(&text, true).unwrap();
        assert_eq!(
            (a.ipv4.as_str(), a.ipv6.as_str(), a.gateway.as_str()),
            ("", "2001:db8:1200::77", "fe80:ec2::1")
        );
        // Without an IPv6 address the entry is incomplete in IPv6 mode.
        assert!(matches!(
            branch_address(CONTROLLER, true),
            Err(BranchError::Incomplete(_))
        ));
    }

    #[test]
    fn malformed_and_incomplete_annotations_are_refused_as_upstream() {
        assert!(matches!(
            branch_address("{not json", false),
            Err(BranchError::Malformed { .. })
        ));
        // An object where a list is expected, a string VLAN id.
        assert!(matches!(
            branch_address(r#"{"eniId":"eni-1"}"#, false),
            Err(BranchError::Malformed { .. })
        ));
        assert!(matches!(
            branch_address(r#"[{"vlanId":"3"}]"#, false),
            Err(BranchError::Malformed { .. })
        ));
        assert_eq!(branch_address("[]", false), Err(BranchError::Empty));
        assert_eq!(branch_address("null", false), Err(BranchError::Empty));
        for missing in [
            r#"[{"ifAddress":"02:00:00:00:00:01","vlanId":3,"subnetCidr":"10.0.0.0/24"}]"#,
            r#"[{"privateIp":"10.0.0.5","vlanId":3,"subnetCidr":"10.0.0.0/24"}]"#,
            r#"[{"privateIp":"10.0.0.5","ifAddress":"02:00:00:00:00:01","subnetCidr":"10.0.0.0/24"}]"#,
        ] {
            assert!(
                matches!(
                    branch_address(missing, false),
                    Err(BranchError::Incomplete(_))
                ),
                "{missing}"
            );
        }
        assert_eq!(
            branch_address(
                r#"[{"privateIp":"10.0.0.5","ifAddress":"02:00:00:00:00:01","vlanId":3,"subnetCidr":"nope"}]"#,
                false
            ),
            Err(BranchError::BadSubnet("nope".into()))
        );
    }

    #[test]
    fn go_key_matching_and_zero_values() {
        let d = parse_annotation(
            r#"[{"VLANID":7,"IFADDRESS":"m","unknown":{"x":1}},null,{"vlanID":8,"vlanId":9}]"#,
        )
        .unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!((d[0].vlan_id, d[0].if_address.as_str()), (7, "m"));
        assert_eq!(d[1], PodEniData::default());
        // The exact key wins over a case-insensitive one.
        assert_eq!(d[2].vlan_id, 8);
        assert!(parse_annotation(r#"[{"vlanId":1.5}]"#).is_err());
    }

    #[test]
    fn a_trunk_needs_a_free_slot_in_ipv4_mode_only() {
        assert!(room_for_trunk(false, 2, 3));
        assert!(!room_for_trunk(false, 3, 3));
        assert!(room_for_trunk(true, 3, 3));
    }
}
