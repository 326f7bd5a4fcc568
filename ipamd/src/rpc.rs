//! The gRPC edge: upstream's `rpc.CNIBackend` and `rpc.ConfigServerBackend` on a unix socket
//! (mode 0660, root peers only), `grpc.health.v1`, the version lock, and the one translation of
//! [`IpamError`] into upstream's answer shapes carrying a typed [`IpamdError`]:
//! - a failed AddNetwork is an OK status with `Success=false`, as upstream answers it; the
//!   typed error rides in the binary response metadata [`ERROR_METADATA_KEY`];
//! - a DelNetwork of an unknown pod is the status upstream's handler produces (code `Unknown`,
//!   message `datastore: unknown pod`, which upstream's plugin looks for), with the typed error
//!   in the status details, as every other refused call.
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
use crate::datastore::{Assignment, IpamKey, PodMetadata, V6Assignment};
use crate::ipam::{Ipam, IpamError, PodAddresses};

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
    /// `ANNOTATE_POD_IP=true`: the cluster to annotate pods through (upstream's
    /// `vpc.amazonaws.com/pod-ips`); None: no annotations.
    pub pod_annotations: Option<crate::k8s::Cluster>,
    /// `ENABLE_POD_ENI=true`: branch pods answered from their annotation (`sgp`).
    pub pod_eni: Option<crate::sgp::BranchPods>,
}

/// `NodeIPv4` of the network-policy agent's config: the node's IPv4, except in IPv6 mode,
/// where upstream's `GetNetworkPolicyConfigs` fills only `NodeIPv6` (one family per mode).
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
        // What upstream's handler returns for `datastore.ErrUnknownPod` (a plain error).
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
        IpamError::MaxPods(_) => ErrorReason::MaxPods,
        IpamError::NodeUnschedulable(_) => ErrorReason::NodeUnschedulable,
        IpamError::CoolingDown(_) => ErrorReason::CoolingDown,
        IpamError::SubnetExhausted(_) => ErrorReason::SubnetExhausted,
        IpamError::NoFreePrefix(_) => ErrorReason::NoFreePrefix,
        IpamError::Ec2Throttled(_) => ErrorReason::Ec2Throttled,
        IpamError::Ec2Unauthorized(_) => ErrorReason::Ec2Unauthorized,
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

impl From<IpamError> for Status {
    fn from(e: IpamError) -> Self {
        let reason = reason_of(&e);
        let message = match reason {
            // Upstream's plugin recognises an unknown pod by this text; ours by the reason.
            ErrorReason::UnknownPod => format!("{UNKNOWN_POD_MESSAGE}: {e}"),
            _ => e.to_string(),
        };
        status(reason, message)
    }
}

/// Why a pod annotated `k8s.amazonaws.com/nicConfig: multi-nic-attachment` (the plugin's
/// `RequiresMultiNICAttachment`) is refused without `ENABLE_MULTI_NIC`, as upstream
/// (`rpc_handler.go`: "enable multi-nic feature on CNI for creating multi-nic-attachment
/// pods", `Success=false`). With it, the pod gets one address per serving network card
/// ([`Ipam::add_multi_nic_pod`]).
fn multi_nic_refusal() -> IpamError {
    IpamError::Unsupported(
        "enable multi-nic feature on CNI for creating multi-nic-attachment pods (ENABLE_MULTI_NIC=true; the pod is annotated k8s.amazonaws.com/nicConfig: multi-nic-attachment)".to_owned()
    )
}

/// The reply's entries of a pod's addresses on the network cards other than 0, after card 0's
/// (upstream's order: one `IPAllocationMetadata` per datastore, card index ascending).
fn entries_of_cards(cards: &crate::ipam::CardAssignments) -> Vec<IpAllocationMetadata> {
    cards.iter().map(|(_, a)| metadata(a)).collect()
}

/// A failed AddNetwork as upstream answers it: OK, `Success=false`, nothing else; the typed
/// error in the response metadata for our plugin.
fn add_failure(e: &IpamError) -> Response<AddNetworkReply> {
    let mut response = Response::new(AddNetworkReply {
        success: false,
        ..Default::default()
    });
    let details = IpamdError {
        reason: reason_of(e) as i32,
        message: e.to_string(),
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

/// An IPv6 allocation as upstream answers it: `IPv6Addr` is the bare address (no prefix
/// length), `IPv4Addr` empty.
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
}

impl Backend {
    /// New backend.
    pub fn new(ipam: Arc<Ipam>, reply: ReplySettings) -> Self {
        Self {
            failures: Arc::new(crate::failures::AddFailures::new(ipam.metrics.clone())),
            ipam,
            reply,
            host: None,
        }
    }

    /// Records failed ADDs in `failures` (shared with introspection and the Event reporter).
    #[must_use]
    pub fn with_failures(mut self, failures: Arc<crate::failures::AddFailures>) -> Self {
        self.failures = failures;
        self
    }

    /// Before an answer names an address, the node's conntrack entries naming it are deleted
    /// through `host` (conntrack-safe reuse, upstream #3634; docs/host-networking.md).
    #[must_use]
    pub fn with_host(mut self, host: Option<Arc<crate::host::HostNetwork>>) -> Self {
        self.host = host;
        self
    }

    /// After a release: the pod rules (512/1536) of the released IPv4 addresses that no pod
    /// holds (fenced meanwhile, so the next owner's rules, made after a handout with
    /// `IP_COOLDOWN_PERIOD=0`, are never touched); the plugin's DEL leaves them to ipamd when only
    /// ipamd's answer proved them its sandbox's (docs/plugin.md). Best effort: what fails here
    /// is pruned by `reclaim`.
    async fn prune_released_rules(&self, pod: &crate::ipam::PodAddresses) {
        let Some(host) = &self.host else {
            return;
        };
        let ips: Vec<std::net::Ipv4Addr> = pod
            .v4
            .iter()
            .map(|a| a.ip)
            .chain(pod.cards.iter().map(|(_, a)| a.ip))
            .collect();
        match crate::reclaim::prune_pod_rules_of(&self.ipam, host.as_ref(), Some(&ips)).await {
            Ok(pruned) if !pruned.is_empty() => {
                tracing::info!(addresses = ?pruned, "rules of the released addresses removed");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(addresses = ?ips, error = %e, "rules of the released addresses not removed (reclaim prunes them)");
            }
        }
    }

    /// Deletes the node's conntrack entries (NAT bindings included) naming any of `pod`'s
    /// addresses before the answer hands them out: entries a previous owner's flows left
    /// (created after its DEL's flush by traffic still steered to it, or never flushed: a DEL
    /// retried after its veth was gone) must not steer packets to the new pod. A failure
    /// refuses the ADD (the plugin's undo releases the address).
    async fn forget_flows(&self, pod: &crate::ipam::PodAddresses) -> Result<(), IpamError> {
        let Some(host) = &self.host else {
            return Ok(());
        };
        let ips: Vec<std::net::IpAddr> = pod
            .v4
            .iter()
            .map(|a| std::net::IpAddr::V4(a.ip))
            .chain(pod.v6.iter().map(|a| std::net::IpAddr::V6(a.ip)))
            .chain(pod.cards.iter().map(|(_, a)| std::net::IpAddr::V4(a.ip)))
            .collect();
        match host.forget_conntrack(ips.clone()).await {
            Ok(f) => {
                if f.deleted > 0 {
                    tracing::info!(addresses = ?ips, deleted = f.deleted, "conntrack entries of a previous owner deleted before the address was handed out");
                }
                Ok(())
            }
            Err(e) => Err(IpamError::Internal(format!(
                "conntrack state of {ips:?} not cleared before handing them out: {e}"
            ))),
        }
    }

    /// A failed AddNetwork (`add_failure`), recorded with its reason first: counted in
    /// `awscni_add_failures_total`, listed for `ipamd status`, an Event on the pod.
    fn refuse(&self, req: &AddNetworkRequest, e: &IpamError) -> Response<AddNetworkReply> {
        self.record_failure(req, reason_of(e), e.to_string());
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

    /// `ANNOTATE_POD_IP`: annotates the pod with `ip`; false when that failed (upstream
    /// then answers `Success=false`).
    async fn annotate(&self, namespace: &str, name: &str, ip: &str, key: &IpamKey) -> bool {
        if let Some(cluster) = &self.reply.pod_annotations
            && let Err(e) = cluster.annotate_pod_ip(namespace, name, ip).await
        {
            tracing::error!(%key, error = %e, "Failed to add the pod annotation");
            return false;
        }
        true
    }
}

impl Backend {
    /// The reply to an ADD that got its address(es): the pod annotation first (as upstream, a
    /// failed annotation fails the ADD with `Success=false`; the address stays assigned until
    /// the runtime's DEL), then the allocation and the VPC CIDRs of the pod's families
    /// (`(IPv4, IPv6)`).
    async fn assigned(
        &self,
        req: &AddNetworkRequest,
        key: &IpamKey,
        pod_ip: &str,
        allocation: IpAllocationMetadata,
        (v4, v6): (bool, bool),
    ) -> Response<AddNetworkReply> {
        let success = self
            .annotate(&req.k8s_pod_namespace, &req.k8s_pod_name, pod_ip, key)
            .await;
        let cidrs = |on: bool, c: &Vec<String>| if on { c.clone() } else { Vec::new() };
        Response::new(AddNetworkReply {
            success,
            ip_allocation_metadata: vec![allocation],
            use_external_snat: self.reply.use_external_snat,
            vp_cv4_cid_rs: cidrs(v4, &self.reply.vpc_v4()),
            vp_cv6_cid_rs: cidrs(v6, &self.reply.vpc_v6_cidrs),
            network_policy_mode: self.reply.network_policy_mode.clone(),
            ..Default::default()
        })
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
        if let Some(branch) = &self.reply.pod_eni {
            match crate::sgp::add_answer(branch, &req, &key).await {
                Ok(Some((allocation, ip, extra))) => {
                    let mut reply = self
                        .assigned(
                            &req,
                            &key,
                            &ip,
                            allocation,
                            (!ip.contains(':'), ip.contains(':')),
                        )
                        .await;
                    extra.fill(reply.get_mut());
                    return Ok(reply);
                }
                Ok(None) => {}
                Err(e) => return Ok(add_failure(&e)),
            }
        }
        if req.requires_multi_nic_attachment && !self.reply.multi_nic {
            let e = multi_nic_refusal();
            tracing::error!(%key, pod = %req.k8s_pod_name, ns = %req.k8s_pod_namespace, error = %e, "AddNetwork refused: the pod asks for one interface per network card");
            return Ok(self.refuse(&req, &e));
        }
        let meta = PodMetadata {
            namespace: req.k8s_pod_namespace.clone(),
            name: req.k8s_pod_name.clone(),
            interfaces_count: 1,
        };
        if req.requires_multi_nic_attachment {
            let r = tracing::Instrument::instrument(
                self.ipam.add_multi_nic_pod(self.reply.family, &key, meta),
                span,
            )
            .await;
            return Ok(match r {
                Ok(pod) => {
                    if let Err(e) = self.forget_flows(&pod).await {
                        tracing::error!(%key, error = %e, "AddNetwork refused");
                        return Ok(self.refuse(&req, &e));
                    }
                    let cards = pod.cards.clone();
                    tracing::info!(%key, ip = ?pod.v4.as_ref().map(|a| a.ip), cards = ?cards.iter().map(|(c, a)| (c, a.ip)).collect::<Vec<_>>(), "AddNetwork assigned one address per network card");
                    match allocation(&pod) {
                        Some((first, ip)) => {
                            let mut r = self.assigned(&req, &key, &ip, first, (true, false)).await;
                            r.get_mut()
                                .ip_allocation_metadata
                                .extend(entries_of_cards(&cards));
                            r
                        }
                        None => add_failure(&IpamError::Internal("no address assigned".to_owned())),
                    }
                }
                Err(e) => {
                    tracing::warn!(%key, error = %e, "AddNetwork of a multi-NIC pod failed; no address taken");
                    self.refuse(&req, &e)
                }
            });
        }
        // The span covers the whole wait (an empty pool may wait for the pool manager).
        let r =
            tracing::Instrument::instrument(self.ipam.add_pod(self.reply.family, &key, meta), span)
                .await;
        let pod = match r {
            Ok(pod) => pod,
            Err(e) => {
                tracing::warn!(%key, error = %e, "AddNetwork failed");
                return Ok(self.refuse(&req, &e));
            }
        };
        if let Err(e) = self.forget_flows(&pod).await {
            tracing::error!(%key, error = %e, "AddNetwork refused");
            return Ok(self.refuse(&req, &e));
        }
        tracing::info!(%key, ip = ?pod.v4.as_ref().map(|a| a.ip), ipv6 = ?pod.v6.as_ref().map(|v| v.ip), eni = ?pod.v4.as_ref().map(|a| &a.eni_id), "AddNetwork assigned");
        let Some((allocation, ip)) = allocation(&pod) else {
            return Ok(self.refuse(&req, &IpamError::Internal("no address assigned".to_owned())));
        };
        let families = (pod.v4.is_some(), pod.v6.is_some());
        Ok(self.assigned(&req, &key, &ip, allocation, families).await)
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
        let pod = crate::ipam::blocking(|| {
            span.in_scope(|| {
                self.ipam
                    .del_pod(&key, &req.k8s_pod_namespace, &req.k8s_pod_name, &req.reason)
            })
        });
        let pod = match pod {
            // a branch pod (security groups for pods) holds no address of the pool
            Err(IpamError::UnknownPod(unknown)) if self.reply.pod_eni.is_some() => {
                let branch = self.reply.pod_eni.as_ref().expect("checked");
                return crate::sgp::del_answer(
                    branch,
                    &req,
                    unknown,
                    &self.reply.network_policy_mode,
                )
                .await;
            }
            other => other?,
        };
        let cards = pod.cards.clone();
        self.prune_released_rules(&pod).await;
        tracing::info!(%key, ip = ?pod.v4.as_ref().map(|a| a.ip), ipv6 = ?pod.v6.as_ref().map(|v| v.ip), cards = ?cards.iter().map(|(c, a)| (c, a.ip)).collect::<Vec<_>>(), reason = %req.reason, "DelNetwork released");
        let (entries, ip) = match allocation(&pod) {
            Some((entry, ip)) => {
                let mut entries = vec![entry];
                entries.extend(entries_of_cards(&cards));
                (entries, ip)
            }
            None if !cards.is_empty() => (entries_of_cards(&cards), cards[0].1.ip.to_string()),
            None => return Err(IpamError::Internal("nothing released".to_owned()).into()),
        };
        let mut success = true;
        if let Some(cluster) = &self.reply.pod_annotations
            && let Err(e) = cluster
                .clear_pod_ip(&req.k8s_pod_namespace, &req.k8s_pod_name, &ip)
                .await
        {
            tracing::error!(%key, error = %e, "Failed to delete the pod annotation");
            success = false;
        }
        Ok(Response::new(DelNetworkReply {
            success,
            ip_allocation_metadata: entries,
            network_policy_mode: self.reply.network_policy_mode.clone(),
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl ConfigServerBackend for Backend {
    /// What the network-policy agent asks ipamd for at start (upstream `GetNetworkPolicyConfigs`).
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
    /// Only while an ENI with pod addresses is in the pool: custom networking, where the
    /// primary ENI serves no pod and a node whose ENIConfig yields no ENI can run none
    /// (upstream's `nodeInit` fails then: "Failed to attach any ENIs for custom networking",
    /// so aws-node never becomes ready; here it stays unready until an ENI is attached).
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
    host: Option<Arc<crate::host::HostNetwork>>,
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
            Backend::new(ipam.clone(), reply.clone())
                .with_host(host)
                .with_failures(failures.clone()),
        ))
        .add_service(ConfigServerBackendServer::new(
            Backend::new(ipam, reply).with_failures(failures),
        ))
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
        let s: Status = IpamError::InstanceLimit("x".into()).into();
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
