//! `test-ipamd`: a small stand-in for ipamd serving `rpc.CNIBackend` and `grpc.health.v1` on a
//! unix socket, from a fixed pool on two simulated ENIs. Test-only: no AWS, no kernel changes.
//!
//! Pools: primary ENI (device 0, table main) 198.18.0.10-29; secondary ENI (device 1, table 2)
//! 198.18.1.10-29; IPv6 (device 0) fd00:198:18::10-29. A request whose pod name or container
//! id contains `secondary` is served from the secondary ENI, `ipv6` from the IPv6 pool, and
//! `branch` gets a branch-ENI (VLAN 7) reply; `dualstack` gets a primary-ENI IPv4 and an IPv6
//! in one allocation (both `IPv4Addr` and `IPv6Addr` set), as a dual-stack ipamd answers. Allocations are idempotent per
//! (network, container id, ifname) and released by DelNetwork. With `--state`, the current
//! allocations are written as JSON after every change.
//!
//! Branch ENIs (security groups for pods): with `--branch-dir D`, a pod whose
//! `D/<namespace>_<name>.json` exists is a branch-ENI pod: that file is its
//! `vpc.amazonaws.com/pod-eni` annotation (upstream's `PodENIData` list) plus the trunk's
//! `parentIfIndex`, read at every call as upstream's ipamd reads the annotation, so a test can
//! change it between ADD and DEL. AddNetwork answers with the VLAN id, branch MAC, subnet
//! gateway (the subnet's first address) and trunk link index, DelNetwork with the VLAN id and
//! address; nothing is allocated from the pools for such a pod.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Parser;
use ipamd_proto::rpc::cni_backend_server::{CniBackend, CniBackendServer};
use ipamd_proto::rpc::{
    AddNetworkReply, AddNetworkRequest, DelNetworkReply, DelNetworkRequest, IpAllocationMetadata,
};
use ipamd_proto::{ErrorReason, IpamdError};
use tonic::{Request, Response, Status};

#[derive(Parser, Debug)]
struct Args {
    /// Unix socket to serve on (replaced if it exists).
    #[arg(long)]
    socket: PathBuf,
    /// Where to write the allocation table after each change.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Serve the IPv6 pool to requests without a hint (an IPv6 cluster's ipamd; runtimes such
    /// as podman pass random container ids).
    #[arg(long)]
    ipv6: bool,
    /// `NetworkPolicyMode` put in Add/Del replies, as ipamd does with
    /// `NETWORK_POLICY_ENFORCING_MODE` (default: none, so the plugin never calls the agent).
    #[arg(long, default_value = "")]
    network_policy_mode: String,
    /// On DelNetwork, once the address is released and before answering, install the rule the
    /// address's next owner would (`from <ip> lookup <table>` at 1536) in this netns: the next
    /// pod of an `IP_COOLDOWN_PERIOD=0` node wired while the releasing DEL is still running.
    #[arg(long)]
    next_owner_rule_on_del: Option<u32>,
    /// Directory of branch-ENI pods' annotations (see the module docs).
    #[arg(long)]
    branch_dir: Option<PathBuf>,
    /// While this file exists, DelNetwork answers `Success=false` and releases nothing (as
    /// upstream's ipamd refuses a delete it cannot process).
    #[arg(long)]
    refuse_del_while: Option<PathBuf>,
}

/// One entry of the `vpc.amazonaws.com/pod-eni` annotation (upstream `PodENIData`).
#[derive(Debug, Clone, serde::Deserialize)]
struct PodEniData {
    #[serde(rename = "ifAddress")]
    if_address: String,
    #[serde(rename = "privateIp", default)]
    private_ip: String,
    #[serde(rename = "ipv6Addr", default)]
    ipv6_addr: String,
    #[serde(rename = "vlanID")]
    vlan_id: i32,
    #[serde(rename = "subnetCidr", default)]
    subnet_cidr: String,
    #[serde(rename = "subnetV6Cidr", default)]
    subnet_v6_cidr: String,
}

/// A branch pod's file: the annotation and the trunk ENI's link index in the node.
#[derive(Debug, Clone, serde::Deserialize)]
struct BranchFile {
    annotation: Vec<PodEniData>,
    #[serde(rename = "parentIfIndex")]
    parent_if_index: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Primary,
    Secondary,
    V6,
}

impl Pool {
    fn addresses(self) -> Vec<IpAddr> {
        (10..30_u8)
            .map(|i| match self {
                Self::Primary => IpAddr::from([198, 18, 0, i]),
                Self::Secondary => IpAddr::from([198, 18, 1, i]),
                Self::V6 => IpAddr::from([0xfd00, 0x198, 0x18, 0, 0, 0, 0, u16::from(i)]),
            })
            .collect()
    }

    fn device_and_table(self) -> (i32, i32) {
        match self {
            Self::Primary | Self::V6 => (0, 254),
            Self::Secondary => (1, 2),
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
struct Allocation {
    ip: IpAddr,
    /// Dual-stack: the IPv6 next to `ip`.
    ip6: Option<IpAddr>,
    device_number: i32,
    route_table_id: i32,
    pod: String,
}

type Key = (String, String, String);

#[derive(Debug, Default)]
struct State {
    allocations: BTreeMap<Key, Allocation>,
}

#[derive(Debug, Clone)]
struct Service {
    state: Arc<Mutex<State>>,
    state_file: Option<PathBuf>,
    ipv6: bool,
    network_policy_mode: String,
    next_owner_rule_on_del: Option<u32>,
    branch_dir: Option<PathBuf>,
    refuse_del_while: Option<PathBuf>,
}

fn refuse(code: tonic::Code, reason: ErrorReason, msg: &str) -> Status {
    let details = IpamdError {
        reason: reason as i32,
        message: msg.to_owned(),
    }
    .to_details();
    Status::with_details(code, msg, details.into())
}

impl Service {
    /// The branch-ENI file of pod `namespace/name`, if it is a branch pod.
    fn branch(&self, namespace: &str, name: &str) -> Result<Option<BranchFile>, Status> {
        let Some(dir) = &self.branch_dir else {
            return Ok(None);
        };
        match std::fs::read(dir.join(format!("{namespace}_{name}.json"))) {
            Ok(raw) => serde_json::from_slice(&raw)
                .map(Some)
                .map_err(|e| Status::internal(format!("branch annotation: {e}"))),
            Err(_) => Ok(None),
        }
    }

    /// Upstream's AddNetwork answer for a branch pod: the first entry's address (IPv6 in an
    /// IPv6 cluster), VLAN id, MAC, and the subnet's gateway (IPv4: its first address; IPv6:
    /// `fe80:ec2::1`, the VPC router, as ipamd answers).
    fn branch_reply(&self, b: &BranchFile) -> Result<AddNetworkReply, Status> {
        let first = b
            .annotation
            .first()
            .ok_or_else(|| Status::internal("empty branch annotation"))?;
        let (v4, v6, gw) = if self.ipv6 {
            let _: ipnet::IpNet = first
                .subnet_v6_cidr
                .parse()
                .map_err(|_| Status::internal("subnetV6Cidr"))?;
            (
                String::new(),
                first.ipv6_addr.clone(),
                "fe80:ec2::1".to_owned(),
            )
        } else {
            let net: ipnet::Ipv4Net = first
                .subnet_cidr
                .parse()
                .map_err(|_| Status::internal("subnetCidr"))?;
            let gw = std::net::Ipv4Addr::from(u32::from(net.network()) + 1);
            (first.private_ip.clone(), String::new(), gw.to_string())
        };
        Ok(AddNetworkReply {
            success: true,
            ip_allocation_metadata: vec![IpAllocationMetadata {
                i_pv4_addr: v4,
                i_pv6_addr: v6,
                device_number: -1,
                route_table_id: 0,
            }],
            vp_cv4_cid_rs: vec!["198.18.0.0/16".to_owned()],
            pod_vlan_id: first.vlan_id,
            pod_enimac: first.if_address.clone(),
            pod_eni_subnet_gw: gw,
            parent_if_index: b.parent_if_index,
            network_policy_mode: self.network_policy_mode.clone(),
            ..Default::default()
        })
    }

    fn persist(&self, state: &State) {
        if let Some(path) = &self.state_file {
            let list: Vec<_> = state
                .allocations
                .iter()
                .map(|((net, cid, ifname), a)| {
                    serde_json::json!({
                        "network": net, "containerID": cid, "ifname": ifname,
                        "ip": a.ip, "ip6": a.ip6, "deviceNumber": a.device_number,
                        "routeTableId": a.route_table_id, "pod": a.pod,
                    })
                })
                .collect();
            let tmp = path.with_extension("tmp");
            if std::fs::write(&tmp, serde_json::to_vec(&list).unwrap_or_default()).is_ok() {
                let _ = std::fs::rename(&tmp, path);
            }
        }
    }

    fn metadata(a: &Allocation) -> IpAllocationMetadata {
        let (v4, mut v6) = match a.ip {
            IpAddr::V4(ip) => (ip.to_string(), String::new()),
            IpAddr::V6(ip) => (String::new(), ip.to_string()),
        };
        if let Some(ip6) = a.ip6 {
            v6 = ip6.to_string();
        }
        IpAllocationMetadata {
            i_pv4_addr: v4,
            i_pv6_addr: v6,
            device_number: a.device_number,
            route_table_id: a.route_table_id,
        }
    }
}

#[tonic::async_trait]
impl CniBackend for Service {
    async fn add_network(
        &self,
        request: Request<AddNetworkRequest>,
    ) -> Result<Response<AddNetworkReply>, Status> {
        let req = request.into_inner();
        if req.client_version != ipamd_proto::BUILD_VERSION {
            return Err(refuse(
                tonic::Code::FailedPrecondition,
                ErrorReason::VersionMismatch,
                "client version mismatch",
            ));
        }
        if req.container_id.is_empty() || req.if_name.is_empty() {
            return Err(refuse(
                tonic::Code::InvalidArgument,
                ErrorReason::InvalidRequest,
                "container id and ifname are required",
            ));
        }
        if let Some(b) = self.branch(&req.k8s_pod_namespace, &req.k8s_pod_name)? {
            return self.branch_reply(&b).map(Response::new);
        }
        let hint = format!("{} {}", req.k8s_pod_name, req.container_id);
        let pool = if hint.contains("secondary") {
            Pool::Secondary
        } else if hint.contains("ipv6") || (self.ipv6 && !hint.contains("dualstack")) {
            Pool::V6
        } else {
            Pool::Primary
        };
        let key = (req.network_name, req.container_id, req.if_name);
        let alloc = {
            let mut state = self
                .state
                .lock()
                .map_err(|_| Status::internal("poisoned"))?;
            if let Some(a) = state.allocations.get(&key) {
                a.clone()
            } else {
                let used: Vec<IpAddr> = state
                    .allocations
                    .values()
                    .flat_map(|a| std::iter::once(a.ip).chain(a.ip6))
                    .collect();
                let free = |pool: Pool| pool.addresses().into_iter().find(|ip| !used.contains(ip));
                let exhausted = || {
                    refuse(
                        tonic::Code::ResourceExhausted,
                        ErrorReason::NoAvailableAddress,
                        "no available address",
                    )
                };
                let ip = free(pool).ok_or_else(exhausted)?;
                let ip6 = if hint.contains("dualstack") {
                    Some(free(Pool::V6).ok_or_else(exhausted)?)
                } else {
                    None
                };
                let (device_number, route_table_id) = pool.device_and_table();
                let a = Allocation {
                    ip,
                    ip6,
                    device_number,
                    route_table_id,
                    pod: format!("{}/{}", req.k8s_pod_namespace, req.k8s_pod_name),
                };
                state.allocations.insert(key, a.clone());
                self.persist(&state);
                a
            }
        };
        Ok(Response::new(AddNetworkReply {
            success: true,
            ip_allocation_metadata: vec![Self::metadata(&alloc)],
            use_external_snat: false,
            vp_cv4_cid_rs: vec!["198.18.0.0/16".to_owned()],
            vp_cv6_cid_rs: vec!["fd00:198:18::/48".to_owned()],
            pod_vlan_id: if hint.contains("branch") { 7 } else { 0 },
            network_policy_mode: self.network_policy_mode.clone(),
            ..Default::default()
        }))
    }

    async fn del_network(
        &self,
        request: Request<DelNetworkRequest>,
    ) -> Result<Response<DelNetworkReply>, Status> {
        let req = request.into_inner();
        if req.client_version != ipamd_proto::BUILD_VERSION {
            return Err(refuse(
                tonic::Code::FailedPrecondition,
                ErrorReason::VersionMismatch,
                "client version mismatch",
            ));
        }
        if self.refuse_del_while.as_ref().is_some_and(|f| f.exists()) {
            return Ok(Response::new(DelNetworkReply {
                success: false,
                ..DelNetworkReply::default()
            }));
        }
        if let Some(b) = self.branch(&req.k8s_pod_namespace, &req.k8s_pod_name)? {
            // Upstream: the annotation's VLAN id and IPv4 address, nothing released.
            let first = b
                .annotation
                .first()
                .ok_or_else(|| Status::internal("empty branch annotation"))?;
            return Ok(Response::new(DelNetworkReply {
                success: true,
                pod_vlan_id: first.vlan_id,
                ip_allocation_metadata: vec![IpAllocationMetadata {
                    i_pv4_addr: first.private_ip.clone(),
                    i_pv6_addr: String::new(),
                    device_number: 0,
                    route_table_id: 0,
                }],
                network_policy_mode: self.network_policy_mode.clone(),
            }));
        }
        let key = (req.network_name, req.container_id, req.if_name);
        let removed = {
            let mut state = self
                .state
                .lock()
                .map_err(|_| Status::internal("poisoned"))?;
            let removed = state.allocations.remove(&key);
            if removed.is_some() {
                self.persist(&state);
            }
            removed
        };
        if let (Some(a), Some(table)) = (&removed, self.next_owner_rule_on_del) {
            let ip = a.ip;
            let prefix = if ip.is_ipv4() { 32 } else { 128 };
            let status = std::process::Command::new("ip")
                .args(["rule", "add", "from", &format!("{ip}/{prefix}"), "lookup"])
                .arg(table.to_string())
                .args(["priority", "1536"])
                .status();
            if !status.is_ok_and(|s| s.success()) {
                return Err(Status::internal("install the next owner's rule"));
            }
        }
        match removed {
            Some(a) => Ok(Response::new(DelNetworkReply {
                success: true,
                ip_allocation_metadata: vec![Self::metadata(&a)],
                network_policy_mode: self.network_policy_mode.clone(),
                ..Default::default()
            })),
            // upstream's answer to ErrUnknownPod: code Unknown and its text.
            None => Err(refuse(
                tonic::Code::Unknown,
                ErrorReason::UnknownPod,
                ipamd_proto::UNKNOWN_POD_MESSAGE,
            )),
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let _ = std::fs::remove_file(&args.socket);
        if let Some(dir) = args.socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let listener = tokio::net::UnixListener::bind(&args.socket)?;
        let service = Service {
            state: Arc::default(),
            state_file: args.state,
            ipv6: args.ipv6,
            network_policy_mode: args.network_policy_mode,
            next_owner_rule_on_del: args.next_owner_rule_on_del,
            branch_dir: args.branch_dir,
            refuse_del_while: args.refuse_del_while,
        };
        service.persist(&State::default());
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status(
                ipamd_proto::HEALTH_SERVICE_NAME,
                tonic_health::ServingStatus::Serving,
            )
            .await;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(CniBackendServer::new(service))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async move {
                    term.recv().await;
                },
            )
            .await?;
        Ok(())
    })
}
