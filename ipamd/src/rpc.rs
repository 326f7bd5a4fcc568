//! The gRPC edge: `rpc.CNIBackend` and `rpc.ConfigServerBackend` on a unix socket (mode 0660, root
//! peers only), `grpc.health.v1`, the version lock, and the one translation of [`IpamError`] into
//! the answer shapes every plugin of the protocol reads, carrying a typed [`IpamdError`]:
//! - a failed AddNetwork is an OK status with `Success=false`; the typed error rides in the binary
//!   response metadata [`ERROR_METADATA_KEY`];
//! - a DelNetwork of an unknown pod is code `Unknown` with a message starting
//!   `datastore: unknown pod` (the text plugins recognise it by), with the typed error in the
//!   status details, as every other refused call.
//!
//! Must not: hold locks across `.await`, decide pool policy, touch the kernel.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use ipamd_proto::rpc::cni_backend_server::{CniBackend, CniBackendServer};
use ipamd_proto::rpc::config_server_backend_server::{
    ConfigServerBackend, ConfigServerBackendServer,
};
use ipamd_proto::rpc::{
    AddNetworkReply, AddNetworkRequest, DelNetworkReply, DelNetworkRequest, IpAllocationMetadata,
    NetworkPolicyAgentConfigReply,
};
use ipamd_proto::{ERROR_METADATA_KEY, ErrorReason, IpamdError, UNKNOWN_POD_MESSAGE};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Code, Request, Response, Status};

use crate::config::AddressFamily;
use crate::datastore::{Assignment, IpamKey, V6Assignment};
use crate::ipam::{Ipam, IpamError, PodAddresses};
use crate::pods::{Added, PodAnswer, PodError, PodRequest, Pods, Released};
use crate::sgp::BranchError;

/// Reply settings that do not depend on the pod.
#[derive(Debug, Clone)]
pub struct ReplySettings {
    /// `VPCv4CIDRs`: VPC CIDRs plus the exclude-SNAT CIDRs.
    pub vpc_v4_cidrs: Vec<String>,
    /// The same list, followed while ipamd runs (VPC CIDR blocks associated or removed: the
    /// EC2 node's CIDR follower); when set it wins over `vpc_v4_cidrs`.
    pub vpc_v4_follow: Option<tokio::sync::watch::Receiver<Vec<String>>>,
    /// `UseExternalSNAT`.
    pub use_external_snat: bool,
    /// `NetworkPolicyMode` ("" when unset).
    pub network_policy_mode: String,
    /// `MultiNICEnabled` of the network-policy agent's config.
    pub multi_nic: bool,
    /// `NodeIPv4`: the primary ENI's primary address ("" when unknown, and in IPv6 mode:
    /// [`agent_node_ipv4`]).
    pub node_ipv4: String,
    /// `InstanceID`.
    pub instance_id: String,
    /// `Region`.
    pub region: String,
    /// The pods' address family: which addresses AddNetwork hands out.
    pub family: crate::config::AddressFamily,
    /// `VPCv6CIDRs` (IPv6 mode and dual-stack pods): the VPC's IPv6 CIDRs.
    pub vpc_v6_cidrs: Vec<String>,
    /// `NodeIPv6` of the network-policy agent's config (IPv6 mode; "" otherwise).
    pub node_ipv6: String,
    /// `ANNOTATE_POD_IP=true`: the cluster to annotate pods through (`vpc.amazonaws.com/pod-ips`);
    /// None: no annotations.
    pub pod_annotations: Option<crate::k8s::Cluster>,
    /// `ENABLE_POD_ENI=true`: branch pods answered from their annotation (`sgp`).
    pub pod_eni: Option<crate::sgp::BranchPods>,
}

/// `NodeIPv4` of the network-policy agent's config: the node's IPv4, except in IPv6 mode, where
/// only `NodeIPv6` is filled (one family per mode).
#[must_use]
pub fn agent_node_ipv4(family: AddressFamily, primary_ip: Option<std::net::Ipv4Addr>) -> String {
    match primary_ip {
        Some(ip) if !family.is_v6_only() => ip.to_string(),
        _ => String::new(),
    }
}

/// Builds a failed-call status with a typed reason.
#[must_use]
pub fn status(reason: ErrorReason, message: impl Into<String>) -> Status {
    let message = message.into();
    let code = match reason {
        ErrorReason::VersionMismatch
        | ErrorReason::Unsupported
        | ErrorReason::CustomNetworkingConfig => Code::FailedPrecondition,
        ErrorReason::InvalidRequest => Code::InvalidArgument,
        ErrorReason::NoAvailableAddress
        | ErrorReason::InstanceLimitReached
        | ErrorReason::SubnetExhausted
        | ErrorReason::MaxPods
        | ErrorReason::NoFreePrefix
        | ErrorReason::CoolingDown
        | ErrorReason::NodeUnschedulable => Code::ResourceExhausted,
        // An unknown pod is a plain error: code `Unknown`.
        ErrorReason::UnknownPod => Code::Unknown,
        ErrorReason::CheckpointFailed
        | ErrorReason::NotReady
        | ErrorReason::Ec2Throttled
        | ErrorReason::Ec2Unavailable
        | ErrorReason::PoolWarming
        | ErrorReason::IpamdUnavailable
        | ErrorReason::PolicyAgentUnavailable => Code::Unavailable,
        ErrorReason::PermissionDenied | ErrorReason::Ec2Unauthorized => Code::PermissionDenied,
        ErrorReason::Internal | ErrorReason::Unspecified => Code::Internal,
    };
    let details = IpamdError {
        reason: reason as i32,
        message: message.clone(),
    }
    .to_details();
    Status::with_details(code, message, details.into())
}

fn reason_of(e: &IpamError) -> ErrorReason {
    match e {
        IpamError::NoAvailableAddress(_) | IpamError::CardUnavailable { .. } => {
            ErrorReason::NoAvailableAddress
        }
        IpamError::PoolWarming { .. } => ErrorReason::PoolWarming,
        IpamError::InstanceLimit(_) => ErrorReason::InstanceLimitReached,
        IpamError::MaxPods { .. } => ErrorReason::MaxPods,
        IpamError::NodeUnschedulable => ErrorReason::NodeUnschedulable,
        IpamError::CoolingDown { .. } => ErrorReason::CoolingDown,
        IpamError::SubnetExhausted(_) => ErrorReason::SubnetExhausted,
        IpamError::NoFreePrefix(_) => ErrorReason::NoFreePrefix,
        IpamError::Ec2Throttled => ErrorReason::Ec2Throttled,
        IpamError::Ec2Unauthorized { .. } => ErrorReason::Ec2Unauthorized,
        IpamError::Ec2Unavailable(_) => ErrorReason::Ec2Unavailable,
        IpamError::CustomNetworkingConfig(_) => ErrorReason::CustomNetworkingConfig,
        IpamError::UnknownPod(_) => ErrorReason::UnknownPod,
        IpamError::CheckpointFailed(_) => ErrorReason::CheckpointFailed,
        IpamError::NotReady(_) => ErrorReason::NotReady,
        IpamError::Internal(_) => ErrorReason::Internal,
        IpamError::Unsupported(_) => ErrorReason::Unsupported,
        IpamError::StaleSandbox(_) => ErrorReason::InvalidRequest,
    }
}

/// The typed reason of a pod verb's failure.
fn pod_reason_of(e: &PodError) -> ErrorReason {
    match e {
        PodError::Ipam(e) => reason_of(e),
        PodError::Branch(BranchError::Pod { .. }) => ErrorReason::NotReady,
        PodError::Branch(BranchError::UidMismatch { .. }) => ErrorReason::InvalidRequest,
        PodError::Branch(_) => ErrorReason::Internal,
    }
}

/// A pod verb's failure as a gRPC status (DelNetwork).
fn status_of(e: &PodError) -> Status {
    match e {
        PodError::Ipam(e) => e.clone().into(),
        PodError::Branch(_) => status(pod_reason_of(e), e.to_string()),
    }
}

/// What the operator should do about a refused ADD, by reason: the words the wire message, the
/// failure list of `ipamd status` and the pod's Event end with. docs/operations.md's reason
/// table shows the same words in its "what to do" column (a test compares them).
pub const GUIDANCE: &[(ErrorReason, &str)] = &[
    (
        ErrorReason::InstanceLimitReached,
        "use a larger instance type or prefix delegation (ENABLE_PREFIX_DELEGATION), or lower the pods scheduled here",
    ),
    (
        ErrorReason::MaxPods,
        "the node's max-pods (kubelet --max-pods, IPAMD_MAX_PODS) bounds the pool",
    ),
    (
        ErrorReason::NodeUnschedulable,
        "uncordon it or schedule the pod elsewhere",
    ),
    (
        ErrorReason::CoolingDown,
        "kubelet's retry after that succeeds",
    ),
    (
        ErrorReason::SubnetExhausted,
        "free addresses in the subnet, or give pods another subnet (custom networking ENIConfig, or subnet discovery with a kubernetes.io/role/cni tagged subnet)",
    ),
    (
        ErrorReason::NoFreePrefix,
        "the subnet is fragmented: reserve /28s with a subnet CIDR reservation (ec2 create-subnet-cidr-reservation --reservation-type prefix) or give pods another subnet",
    ),
    (
        ErrorReason::Ec2Throttled,
        "the account's EC2 API rate is exhausted: find the caller (CloudTrail) or lower WARM_* churn",
    ),
    (
        ErrorReason::Ec2Unauthorized,
        "add it to the node role's (or IRSA role's) IAM policy (AmazonEKS_CNI_Policy)",
    ),
    (
        ErrorReason::Ec2Unavailable,
        "check the node's route to the EC2 endpoint (AWS_EC2_ENDPOINT, VPC endpoints, proxy)",
    ),
    (
        ErrorReason::CustomNetworkingConfig,
        "fix the node's ENIConfig (name from the node's label/annotation, subnet in the node's zone)",
    ),
];

/// The guidance of `reason`, if it has one ([`GUIDANCE`]).
#[must_use]
pub fn guidance(reason: ErrorReason) -> Option<&'static str> {
    GUIDANCE.iter().find(|(r, _)| *r == reason).map(|(_, g)| *g)
}

/// A failure in the operator's words: what happened, then what to do about it.
fn operator_message(reason: ErrorReason, what: &dyn std::fmt::Display) -> String {
    match guidance(reason) {
        Some(g) => format!("{what}; {g}"),
        None => what.to_string(),
    }
}

impl From<IpamError> for Status {
    fn from(e: IpamError) -> Self {
        let reason = reason_of(&e);
        let message = match reason {
            // Plugins that read no reason recognise an unknown pod by this text; ours by the
            // reason.
            ErrorReason::UnknownPod => format!("{UNKNOWN_POD_MESSAGE}: {e}"),
            _ => operator_message(reason, &e),
        };
        status(reason, message)
    }
}

/// The reply's entries of a pod's addresses on the network cards other than 0, after card 0's (one
/// `IPAllocationMetadata` per card, card index ascending).
fn entries_of_cards(cards: &crate::ipam::CardAssignments) -> Vec<IpAllocationMetadata> {
    cards.iter().map(|(_, a)| metadata(a)).collect()
}

/// A failed AddNetwork: OK, `Success=false`, nothing else; the typed error in the response metadata
/// for our plugin.
fn add_failure(e: &PodError) -> Response<AddNetworkReply> {
    let mut response = Response::new(AddNetworkReply {
        success: false,
        ..Default::default()
    });
    let reason = pod_reason_of(e);
    let details = IpamdError {
        reason: reason as i32,
        message: operator_message(reason, e),
    }
    .to_details();
    response.metadata_mut().insert_bin(
        ERROR_METADATA_KEY,
        tonic::metadata::MetadataValue::from_bytes(&details),
    );
    response
}

/// Only root may use the socket (the file mode already limits it to root and the group).
pub fn authorize(peer_uid: Option<u32>) -> Result<(), Status> {
    match peer_uid {
        Some(0) => Ok(()),
        // No credentials: not a unix socket peer (in-process tests over other transports).
        None => Ok(()),
        Some(uid) => Err(status(
            ErrorReason::PermissionDenied,
            format!("uid {uid} may not call ipamd"),
        )),
    }
}

fn check_version(v: &str) -> Result<(), Status> {
    if v == ipamd_proto::build_version() {
        Ok(())
    } else {
        Err(status(
            ErrorReason::VersionMismatch,
            format!(
                "client version {v:?} does not match ipamd version {:?}",
                ipamd_proto::build_version()
            ),
        ))
    }
}

fn peer_uid<T>(req: &Request<T>) -> Option<u32> {
    req.extensions()
        .get::<UdsConnectInfo>()
        .and_then(|i| i.peer_cred)
        .map(|c| c.uid())
}

impl ReplySettings {
    /// The reply settings of a started node: the VPC CIDRs (followed when `vpc_v4_follow`),
    /// SNAT, the network-policy agent's config, the pods' family; no branch pods yet.
    #[must_use]
    pub fn new(
        config: &crate::config::Config,
        ipam: &Ipam,
        cluster: Option<crate::k8s::Cluster>,
        vpc_v4_follow: Option<tokio::sync::watch::Receiver<Vec<String>>>,
    ) -> Self {
        let vpc = crate::node_init::reply_v4_cidrs(
            &ipam.node.vpc_v4_cidrs,
            &config.snat.exclude_snat_cidrs,
            config.snat.external_snat,
        );
        Self {
            vpc_v4_cidrs: vpc,
            vpc_v4_follow,
            use_external_snat: config.snat.external_snat,
            network_policy_mode: config
                .node
                .network_policy_mode
                .as_ref()
                .map(|m| m.as_str().to_owned())
                .unwrap_or_default(),
            multi_nic: config.aws.enable_multi_nic,
            node_ipv4: agent_node_ipv4(config.family, ipam.node.primary_ip),
            instance_id: ipam.node.instance_id.clone(),
            region: ipam.node.region.clone(),
            family: config.family,
            vpc_v6_cidrs: ipam
                .node
                .vpc_v6_cidrs
                .iter()
                .map(ToString::to_string)
                .collect(),
            node_ipv6: if config.family.is_v6_only() {
                ipam.node
                    .primary_ipv6
                    .map(|ip| ip.to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            },
            pod_annotations: cluster.filter(|_| config.kube.annotate_pod_ip),
            pod_eni: None,
        }
    }

    /// `VPCv4CIDRs` now: the followed list when there is one.
    #[must_use]
    pub fn vpc_v4(&self) -> Vec<String> {
        self.vpc_v4_follow
            .as_ref()
            .map_or_else(|| self.vpc_v4_cidrs.clone(), |r| r.borrow().clone())
    }
}

impl Default for ReplySettings {
    fn default() -> Self {
        Self {
            vpc_v4_cidrs: Vec::new(),
            vpc_v4_follow: None,
            use_external_snat: false,
            network_policy_mode: String::new(),
            multi_nic: false,
            node_ipv4: String::new(),
            instance_id: String::new(),
            region: String::new(),
            family: crate::config::AddressFamily::V4,
            vpc_v6_cidrs: Vec::new(),
            node_ipv6: String::new(),
            pod_annotations: None,
            pod_eni: None,
        }
    }
}

fn metadata(a: &Assignment) -> IpAllocationMetadata {
    IpAllocationMetadata {
        i_pv4_addr: a.ip.to_string(),
        i_pv6_addr: String::new(),
        device_number: i32::try_from(a.device_number).unwrap_or(i32::MAX),
        route_table_id: i32::try_from(a.route_table).unwrap_or(i32::MAX),
    }
}

/// An IPv6 allocation: `IPv6Addr` is the bare address (no prefix length), `IPv4Addr` empty.
fn metadata_v6(a: &V6Assignment) -> IpAllocationMetadata {
    IpAllocationMetadata {
        i_pv4_addr: String::new(),
        i_pv6_addr: a.ip.to_string(),
        device_number: i32::try_from(a.device_number).unwrap_or(i32::MAX),
        route_table_id: i32::try_from(a.route_table).unwrap_or(i32::MAX),
    }
}

/// A dual-stack allocation: one entry carrying both addresses (the IPv4's ENI facts), as
/// the plugin's dual-stack half reads it.
fn metadata_dual(a: &Assignment, v6: Option<&V6Assignment>) -> IpAllocationMetadata {
    IpAllocationMetadata {
        i_pv6_addr: v6.map(|v| v.ip.to_string()).unwrap_or_default(),
        ..metadata(a)
    }
}

/// The reply's one allocation entry for a pod's addresses (an IPv4 with the dual-stack IPv6
/// beside it, or IPv6 mode's /128 alone) and the address annotated on the pod.
fn allocation(pod: &PodAddresses) -> Option<(IpAllocationMetadata, String)> {
    match (&pod.v4, &pod.v6) {
        (Some(a), v6) => Some((metadata_dual(a, v6.as_ref()), a.ip.to_string())),
        (None, Some(v6)) => Some((metadata_v6(v6), v6.ip.to_string())),
        (None, None) => None,
    }
}

/// The node namespace's host networking as the pod verbs use it.
#[derive(Debug, Clone)]
pub struct NodeHost {
    /// Pod rules of released addresses are pruned through it.
    pub network: Arc<crate::host::HostNetwork>,
    /// The conntrack safety of handouts.
    pub flows: crate::flows::Flows,
}

/// The CNIBackend service.
#[derive(Debug)]
pub struct Backend {
    ipam: Arc<Ipam>,
    reply: ReplySettings,
    /// Failed ADDs with their reasons (counted, listed, turned into Events on the pods):
    /// recorded here, at the edge, for every path.
    failures: Arc<crate::failures::AddFailures>,
    /// The node namespace's host networking, for the conntrack flush at handout (None: tests
    /// and the in-memory provider, which run in the machine's own namespace).
    host: Option<Arc<crate::host::HostNetwork>>,
    /// The conntrack safety of handouts (None: no host networking).
    flows: Option<crate::flows::Flows>,
}

impl Backend {
    /// A backend over `ipam` that records failed ADDs in `failures` (shared with introspection
    /// and the Event reporter).
    pub fn new(
        ipam: Arc<Ipam>,
        reply: ReplySettings,
        failures: Arc<crate::failures::AddFailures>,
    ) -> Self {
        Self {
            failures,
            ipam,
            reply,
            host: None,
            flows: None,
        }
    }

    /// The released addresses' rules are pruned through `host`; before an answer names an
    /// address, `flows` makes sure no conntrack entry of the node names it (conntrack-safe
    /// reuse; docs/host-networking.md).
    #[must_use]
    pub fn with_host(mut self, host: Option<NodeHost>) -> Self {
        (self.host, self.flows) = host.map(|h| (h.network, h.flows)).unzip();
        self
    }

    /// A failed AddNetwork (`add_failure`), recorded with its reason first: counted in
    /// `awscni_add_failures_total`, listed for `ipamd status`, an Event on the pod.
    fn refuse(&self, req: &AddNetworkRequest, e: &PodError) -> Response<AddNetworkReply> {
        let reason = pod_reason_of(e);
        self.record_failure(req, reason, operator_message(reason, e));
        add_failure(e)
    }

    fn record_failure(&self, req: &AddNetworkRequest, reason: ErrorReason, message: String) {
        self.failures.record(crate::failures::PodFailure {
            code: ipamd_proto::add_failure_code(reason).to_owned(),
            namespace: req.k8s_pod_namespace.clone(),
            name: req.k8s_pod_name.clone(),
            message,
            at: self.ipam.now(),
        });
    }

    /// The pod verbs over this backend's node state, for one call.
    fn pods(&self) -> Pods<'_> {
        Pods {
            ipam: &self.ipam,
            family: self.reply.family,
            multi_nic: self.reply.multi_nic,
            branch: self.reply.pod_eni.as_ref(),
            host: self.host.as_deref(),
            flows: self.flows.as_ref(),
            annotations: self.reply.pod_annotations.as_ref(),
        }
    }

    /// The wire reply of an answered AddNetwork: the allocation entries and the VPC CIDRs of
    /// the pod's families, the branch fields of a branch pod.
    fn add_reply(&self, added: Added) -> AddNetworkReply {
        let cidrs = |on: bool, c: Vec<String>| if on { c } else { Vec::new() };
        let mut reply = AddNetworkReply {
            success: added.annotated,
            use_external_snat: self.reply.use_external_snat,
            network_policy_mode: self.reply.network_policy_mode.clone(),
            ..Default::default()
        };
        let (v4, v6) = match added.answer {
            PodAnswer::Regular(pod) => {
                reply
                    .ip_allocation_metadata
                    .extend(allocation(&pod).map(|(e, _)| e));
                (pod.v4.is_some(), pod.v6.is_some())
            }
            PodAnswer::MultiCard(pod) => {
                reply
                    .ip_allocation_metadata
                    .extend(allocation(&pod).map(|(e, _)| e));
                reply
                    .ip_allocation_metadata
                    .extend(entries_of_cards(&pod.cards));
                (true, false)
            }
            PodAnswer::Branch(branch) => {
                let a = &branch.address;
                // device number -1, route table 0: what plugins expect of a branch pod
                reply.ip_allocation_metadata.push(IpAllocationMetadata {
                    i_pv4_addr: a.ipv4.clone(),
                    i_pv6_addr: a.ipv6.clone(),
                    device_number: -1,
                    route_table_id: 0,
                });
                reply.pod_vlan_id = a.vlan_id;
                reply.pod_enimac.clone_from(&a.mac);
                reply.pod_eni_subnet_gw.clone_from(&a.gateway);
                reply.parent_if_index = i32::try_from(branch.parent_if_index).unwrap_or(i32::MAX);
                let ip = if a.ipv4.is_empty() { &a.ipv6 } else { &a.ipv4 };
                (!ip.contains(':'), ip.contains(':'))
            }
        };
        reply.vp_cv4_cid_rs = cidrs(v4, self.reply.vpc_v4());
        reply.vp_cv6_cid_rs = cidrs(v6, self.reply.vpc_v6_cidrs.clone());
        reply
    }
}

#[tonic::async_trait]
impl CniBackend for Backend {
    async fn add_network(
        &self,
        request: Request<AddNetworkRequest>,
    ) -> Result<Response<AddNetworkReply>, Status> {
        authorize(peer_uid(&request))?;
        let req = request.into_inner();
        check_version(&req.client_version).inspect_err(|s| {
            self.record_failure(&req, ErrorReason::VersionMismatch, s.message().to_owned());
        })?;
        let key = request_key(&req.network_name, &req.container_id, &req.if_name)?;
        let span = tracing::info_span!("AddNetwork", %key, pod = %req.k8s_pod_name, ns = %req.k8s_pod_namespace);
        let pod = PodRequest {
            key: &key,
            namespace: &req.k8s_pod_namespace,
            name: &req.k8s_pod_name,
            uid: &req.k8s_pod_uid,
            multi_nic: req.requires_multi_nic_attachment,
        };
        // The span covers the whole wait (an empty pool may wait for the pool manager).
        match tracing::Instrument::instrument(self.pods().add(&pod), span).await {
            Ok(added) => Ok(Response::new(self.add_reply(added))),
            Err(e) => Ok(self.refuse(&req, &e)),
        }
    }

    async fn del_network(
        &self,
        request: Request<DelNetworkRequest>,
    ) -> Result<Response<DelNetworkReply>, Status> {
        authorize(peer_uid(&request))?;
        let req = request.into_inner();
        check_version(&req.client_version)?;
        let key = request_key(&req.network_name, &req.container_id, &req.if_name)?;
        let span = tracing::info_span!("DelNetwork", %key, pod = %req.k8s_pod_name, ns = %req.k8s_pod_namespace);
        let pod = PodRequest {
            key: &key,
            namespace: &req.k8s_pod_namespace,
            name: &req.k8s_pod_name,
            uid: &req.k8s_pod_uid,
            multi_nic: false,
        };
        let (released, success) =
            tracing::Instrument::instrument(self.pods().del(&pod, &req.reason), span)
                .await
                .map_err(|e| status_of(&e))?;
        let (ip_allocation_metadata, pod_vlan_id) = match released {
            Released::Addresses(pod) => {
                let mut entries: Vec<_> = allocation(&pod).map(|(e, _)| e).into_iter().collect();
                entries.extend(entries_of_cards(&pod.cards));
                (entries, 0)
            }
            Released::Branch(r) if r.vlan_id == 0 => (Vec::new(), 0),
            Released::Branch(r) => (
                vec![IpAllocationMetadata {
                    i_pv4_addr: r.ipv4,
                    i_pv6_addr: r.ipv6,
                    ..IpAllocationMetadata::default()
                }],
                r.vlan_id,
            ),
        };
        Ok(Response::new(DelNetworkReply {
            success,
            ip_allocation_metadata,
            pod_vlan_id,
            network_policy_mode: self.reply.network_policy_mode.clone(),
        }))
    }
}

#[tonic::async_trait]
impl ConfigServerBackend for Backend {
    /// What the network-policy agent asks ipamd for at start.
    async fn get_network_policy_configs(
        &self,
        request: Request<()>,
    ) -> Result<Response<NetworkPolicyAgentConfigReply>, Status> {
        authorize(peer_uid(&request))?;
        Ok(Response::new(NetworkPolicyAgentConfigReply {
            network_policy_mode: self.reply.network_policy_mode.clone(),
            multi_nic_enabled: self.reply.multi_nic,
            node_i_pv4: self.reply.node_ipv4.clone(),
            node_i_pv6: self.reply.node_ipv6.clone(),
            instance_id: self.reply.instance_id.clone(),
            region: self.reply.region.clone(),
        }))
    }
}

/// The IPAM key of a request; all three parts are required.
fn request_key(network_name: &str, container_id: &str, if_name: &str) -> Result<IpamKey, Status> {
    if container_id.is_empty() || if_name.is_empty() || network_name.is_empty() {
        return Err(status(
            ErrorReason::InvalidRequest,
            "ContainerID, IfName and NetworkName are required",
        ));
    }
    Ok(IpamKey::new(network_name, container_id, if_name))
}

/// Errors binding the socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Could not prepare, bind or chmod.
    #[error("{op} {path}")]
    Io {
        /// What.
        op: &'static str,
        /// Where.
        path: std::path::PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Another process (an ipamd still running, e.g. the old pod of a `maxSurge` update)
    /// accepts connections on the socket: it is not removed.
    #[error("another process serves {0}")]
    InUse(std::path::PathBuf),
}

/// True when something accepts connections on the unix socket at `path`.
#[must_use]
pub fn socket_is_live(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}

/// Identity (device, inode) of the file at `path`, to remove on shutdown only the socket this
/// process bound.
#[must_use]
pub fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Binds the unix socket: creates the directory, removes a stale socket (one nobody accepts
/// connections on; a live one is [`SocketError::InUse`]), chmods 0660.
pub fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener, SocketError> {
    let io = |op| {
        move |source| SocketError::Io {
            op,
            path: path.to_owned(),
            source,
        }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("create directory of"))?;
    }
    if socket_is_live(path) {
        return Err(SocketError::InUse(path.to_owned()));
    }
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(path = %path.display(), "removed stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove stale")(e)),
    }
    let l = tokio::net::UnixListener::bind(path).map_err(io("bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(io("chmod"))?;
    Ok(l)
}

/// When the gRPC health service (aws-node's readiness probe, the plugin's STATUS) says
/// SERVING.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyGate {
    /// As soon as the socket serves.
    Serving,
    /// Only while an ENI with pod addresses is in the pool: custom networking, where the primary
    /// ENI serves no pod and a node whose ENIConfig yields no ENI can run none (it stays unready
    /// until an ENI is attached, rather than failing the start).
    OnceAnEniHasAddresses,
}

/// How often [`ReadyGate::OnceAnEniHasAddresses`] looks at the pool.
const READY_GATE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

impl ReadyGate {
    /// Whether the health service says SERVING now.
    fn ready(self, ipam: &Ipam) -> bool {
        match self {
            Self::Serving => true,
            Self::OnceAnEniHasAddresses => ipam.index.capacity().has_addresses,
        }
    }
}

/// Sets both health statuses (ours and the default service) to `ready` when it differs from
/// `last`, saying why; returns it.
async fn set_health(
    reporter: &tonic_health::server::HealthReporter,
    ready: bool,
    last: Option<bool>,
) -> Option<bool> {
    if last == Some(ready) {
        return last;
    }
    let status = if ready {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    reporter
        .set_service_status(ipamd_proto::HEALTH_SERVICE_NAME, status)
        .await;
    reporter.set_service_status("", status).await;
    match (ready, last) {
        (false, _) => tracing::error!(
            "Failed to attach any ENIs for custom networking: not ready (health NOT_SERVING) until an ENI of the node's ENIConfig has addresses"
        ),
        (true, Some(false)) => {
            tracing::info!("an ENI with pod addresses is attached: ready (health SERVING)");
        }
        (true, _) => {}
    }
    Some(ready)
}

/// Keeps the health statuses as `gate` says until `shutdown` (`last`: what they are now).
async fn follow_ready_gate(
    reporter: tonic_health::server::HealthReporter,
    ipam: Arc<Ipam>,
    gate: ReadyGate,
    mut last: Option<bool>,
    shutdown: CancellationToken,
) {
    if gate == ReadyGate::Serving {
        return;
    }
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(READY_GATE_POLL) => {}
        }
        last = set_health(&reporter, gate.ready(&ipam), last).await;
    }
}

/// Serves CNIBackend + health on `listener` until `shutdown`; health follows `gate`.
pub async fn serve(
    listener: tokio::net::UnixListener,
    ipam: Arc<Ipam>,
    reply: ReplySettings,
    host: Option<NodeHost>,
    failures: Arc<crate::failures::AddFailures>,
    gate: ReadyGate,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    // The first statuses are set before the socket serves.
    let last = set_health(&health_reporter, gate.ready(&ipam), None).await;
    let gate_loop = follow_ready_gate(health_reporter, ipam.clone(), gate, last, shutdown.clone());
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(CniBackendServer::new(
            Backend::new(ipam.clone(), reply.clone(), failures.clone()).with_host(host),
        ))
        .add_service(ConfigServerBackendServer::new(Backend::new(
            ipam, reply, failures,
        )))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(listener),
            shutdown.cancelled_owned(),
        );
    let (served, ()) = tokio::join!(server, gate_loop);
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runbook_table_says_what_ipamd_says() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"),
        )
        .expect("docs/operations.md");
        for (reason, words) in GUIDANCE {
            let code = ipamd_proto::add_failure_code(*reason);
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{code}` |")))
                .unwrap_or_else(|| panic!("no row for {code} in docs/operations.md"));
            assert!(
                row.trim_end().ends_with(&format!("| {words} |")),
                "{code}: the runbook says {row:?}, ipamd says {words:?}"
            );
        }
    }

    #[test]
    fn a_refusal_reads_what_happened_then_what_to_do() {
        let e = IpamError::MaxPods { max_pods: 110 };
        let s: Status = e.into();
        assert_eq!(
            s.message(),
            "max pods reached: the pool holds the node's max-pods (110) addresses; the node's max-pods (kubelet --max-pods, IPAMD_MAX_PODS) bounds the pool"
        );
        let e = IpamError::CoolingDown {
            count: 2,
            first_free_in: std::time::Duration::from_millis(300),
            cooldown: std::time::Duration::from_secs(30),
            at_instance_limit: true,
        };
        assert_eq!(
            operator_message(reason_of(&e), &e),
            "instance limit reached: every ENI is full and no more ENIs can be attached; 2 free address(es) are cooling down after their release (IP_COOLDOWN_PERIOD=30s): the first is free again in 1s; kubelet's retry after that succeeds"
        );
    }

    /// upstream pkg/ipamd/rpc_handler.go GetNetworkPolicyConfigs: `NodeIPv6` when
    /// `enableIPv6`, else `NodeIPv4`, never both (dual-stack pods are an IPv4 cluster's).
    #[test]
    fn the_policy_agent_gets_one_node_address_family() {
        let ip = Some(std::net::Ipv4Addr::new(198, 18, 0, 10));
        assert_eq!(agent_node_ipv4(AddressFamily::V4, ip), "198.18.0.10");
        assert_eq!(agent_node_ipv4(AddressFamily::DualStack, ip), "198.18.0.10");
        assert_eq!(agent_node_ipv4(AddressFamily::V6, ip), "");
        assert_eq!(agent_node_ipv4(AddressFamily::V4, None), "");
    }

    #[test]
    fn statuses_carry_typed_reasons() {
        let s: Status = IpamError::InstanceLimit(crate::ipam::LimitCause::EnisFull).into();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(
            IpamdError::from_details(s.details()).unwrap().reason(),
            ErrorReason::InstanceLimitReached
        );
        let s = check_version("0.0.0-other").unwrap_err();
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(
            IpamdError::from_details(s.details()).unwrap().reason(),
            ErrorReason::VersionMismatch
        );
        assert!(check_version(ipamd_proto::BUILD_VERSION).is_ok());
    }

    #[test]
    fn only_root_peers() {
        assert!(authorize(Some(0)).is_ok());
        let s = authorize(Some(1000)).unwrap_err();
        assert_eq!(s.code(), Code::PermissionDenied);
        assert_eq!(
            IpamdError::from_details(s.details()).unwrap().reason(),
            ErrorReason::PermissionDenied
        );
    }
}
