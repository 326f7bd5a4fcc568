//! Shared test fixtures: a movable clock, an in-process ipamd on a real unix socket, and a
//! gRPC client over that socket.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hyper_util::rt::TokioIo;
use ipamd::aws::memory::MemoryProvider;
use ipamd::config::MemoryProviderSpec;
use ipamd::datastore::checkpoint::Checkpoint;
use ipamd::ipam::{Clock, HostPodRoutes, Ipam, IpamSettings, RestoreOutcome};
use ipamd::metrics::Metrics;
use ipamd::pool::policy::Targets;
use ipamd_proto::rpc::cni_backend_client::CniBackendClient;
use ipamd_proto::rpc::{AddNetworkRequest, DelNetworkRequest};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

/// A clock tests move by hand.
#[derive(Debug)]
pub struct TestClock(pub Mutex<SystemTime>);

impl TestClock {
    pub fn new() -> Arc<Self> {
        Arc::new(Self(Mutex::new(
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        )))
    }
    pub fn advance(&self, d: Duration) {
        *self.0.lock().unwrap() += d;
    }
}

impl Clock for TestClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

pub fn targets(warm_ip: u32, max_enis: u32, cidrs_per_eni: u32) -> Targets {
    Targets {
        warm_eni: 1,
        warm_ip,
        minimum_ip: 0,
        warm_prefix: 0,
        prefix_delegation: false,
        max_enis,
        cidrs_per_eni,
        max_pods: None,
    }
}

pub fn settings(targets: Targets, wait: Duration) -> IpamSettings {
    IpamSettings {
        targets,
        add_wait_timeout: wait,
        busy_pool_wait: ipamd::ipam::BUSY_POOL_WAIT,
        veth_prefix: "eni".into(),
        provisioning: true,
    }
}

pub fn spec(subnet: &str, max_enis: u32, ipv4_per_eni: u32) -> MemoryProviderSpec {
    MemoryProviderSpec {
        subnet: subnet.parse().unwrap(),
        max_enis,
        ipv4_per_eni,
        ..MemoryProviderSpec::default()
    }
}

pub async fn start(
    provider: MemoryProvider,
    settings: IpamSettings,
    checkpoint: Box<dyn Checkpoint>,
    host_routes: HostPodRoutes,
    clock: Arc<dyn Clock>,
) -> (Arc<Ipam>, RestoreOutcome) {
    start_with_cooldown(
        provider,
        settings,
        Duration::from_secs(30),
        checkpoint,
        host_routes,
        clock,
    )
    .await
}

/// [`start`] with one pool per card in `pools` (card 0 first), the provider's ENIs and
/// `extra_enis` (ENIs of other network cards the in-memory provider does not describe);
/// returns each card's outcome.
pub async fn start_pools(
    provider: MemoryProvider,
    settings: IpamSettings,
    pools: Vec<(u32, Box<dyn Checkpoint>)>,
    extra_enis: &[ipamd::pool::ec2_port::AttachedEni],
    host_routes: HostPodRoutes,
    clock: Arc<dyn Clock>,
) -> (Arc<Ipam>, Vec<(u32, RestoreOutcome)>) {
    let mut described = ipamd::pool::ec2_port::NodeDescription::describe(&provider)
        .await
        .unwrap();
    described.enis.extend(extra_enis.iter().cloned());
    let (ipam, outcomes) = Ipam::start_pools(
        described,
        settings,
        Duration::from_secs(30),
        pools,
        move || Ok(host_routes),
        clock,
        Arc::new(Metrics::new()),
    )
    .unwrap();
    (Arc::new(ipam), outcomes)
}

/// [`start`] with an `IP_COOLDOWN_PERIOD` of the test's choosing.
pub async fn start_with_cooldown(
    provider: MemoryProvider,
    settings: IpamSettings,
    cooldown: Duration,
    checkpoint: Box<dyn Checkpoint>,
    host_routes: HostPodRoutes,
    clock: Arc<dyn Clock>,
) -> (Arc<Ipam>, RestoreOutcome) {
    let described = ipamd::pool::ec2_port::NodeDescription::describe(&provider)
        .await
        .unwrap();
    let (ipam, outcome) = Ipam::start(
        described,
        settings,
        cooldown,
        checkpoint,
        move || Ok(host_routes),
        clock,
        Arc::new(Metrics::new()),
    )
    .unwrap();
    (Arc::new(ipam), outcome)
}

/// Serves `ipam` (a manager on `provider` + gRPC) on `socket` until the token is cancelled.
pub fn serve(
    provider: MemoryProvider,
    ipam: Arc<Ipam>,
    socket: &Path,
    tick: Duration,
) -> CancellationToken {
    serve_with(provider, ipam, socket, tick, reply_settings())
}

/// The reply settings [`serve`] uses.
pub fn reply_settings() -> ipamd::rpc::ReplySettings {
    ipamd::rpc::ReplySettings {
        vpc_v4_cidrs: vec!["198.18.0.0/16".into()],
        use_external_snat: false,
        network_policy_mode: "standard".into(),
        multi_nic: false,
        node_ipv4: "198.18.0.10".into(),
        instance_id: "i-0test".into(),
        region: "us-west-2".into(),
        pod_annotations: None,
        ..Default::default()
    }
}

/// [`serve`] with the given reply settings (address family, VPC CIDRs).
pub fn serve_with(
    provider: MemoryProvider,
    ipam: Arc<Ipam>,
    socket: &Path,
    tick: Duration,
    reply: ipamd::rpc::ReplySettings,
) -> CancellationToken {
    let token = CancellationToken::new();
    let listener = ipamd::rpc::bind_socket(socket).unwrap();
    tokio::spawn(ipamd::pool::manager::Manager::new(provider).run(
        ipam.clone(),
        tick,
        token.clone(),
    ));
    tokio::spawn(ipamd::rpc::serve(
        listener,
        ipam.clone(),
        reply,
        None,
        std::sync::Arc::new(ipamd::failures::AddFailures::new(ipam.metrics.clone())),
        ipamd::rpc::ReadyGate::Serving,
        token.clone(),
    ));
    token
}

pub async fn channel(socket: PathBuf) -> Channel {
    try_channel(socket).await.unwrap()
}

/// Connects to ipamd's socket; the error is the caller's when the daemon may be gone
/// (the SIGKILL test kills it at any instant, also before the first connect).
pub async fn try_channel(socket: PathBuf) -> Result<Channel, tonic::transport::Error> {
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
}

pub async fn client(socket: PathBuf) -> CniBackendClient<Channel> {
    CniBackendClient::new(channel(socket).await)
}

pub fn add_req(container: &str) -> AddNetworkRequest {
    AddNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        k8s_pod_name: format!("pod-{container}"),
        k8s_pod_namespace: "default".into(),
        container_id: container.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        netns: "/var/run/netns/x".into(),
        ..Default::default()
    }
}

pub fn del_req(container: &str) -> DelNetworkRequest {
    DelNetworkRequest {
        client_version: ipamd_proto::BUILD_VERSION.into(),
        k8s_pod_name: format!("pod-{container}"),
        k8s_pod_namespace: "default".into(),
        container_id: container.into(),
        if_name: "eth0".into(),
        network_name: "aws-cni".into(),
        reason: ipamd_proto::del_reason::POD_DELETED.into(),
        ..Default::default()
    }
}
