//! vpcsim: a simulated VPC on one machine, the world ipamd is tested in without an AWS account.
//!
//! This crate owns the simulated EC2 world and its HTTP faces; the network fabric (namespaces,
//! veths, VPC router, IGW) and the `vpcsim` CLI live in `fabric`/`cli` and only consume the
//! contract below.
//!
//! # Contract (for the fabric, the CLI and ipamd's tests)
//! - [`World`] (`Arc<World>`): the shared state behind one `std::sync::Mutex` that is never held
//!   across `.await`. Create with [`World::new`]`(`[`WorldConfig`]`)` or
//!   [`World::with_clock`] (inject a [`clock::ManualClock`] to test delays without sleeping).
//!   Defaults: region `us-west-2`, AZ `us-west-2a`, VPC `198.18.0.0/16` (+ `2001:db8:1200::/56`),
//!   subnets `198.18.0.0/20` and `198.18.16.0/20`, two security groups.
//! - [`ec2::router`]`(world) -> axum::Router`: the EC2 Query API at `POST /` (form-encoded
//!   `Action=...&Version=2016-11-15`), AWS XML answers and errors, knobs applied.
//! - [`imds::router`]`(world, instance_id) -> axum::Router`: IMDSv2 for one instance
//!   (`PUT /latest/api/token`, `GET /latest/meta-data/...`), lag and partial-prefix knobs applied.
//! - [`control::router`]`(world) -> axum::Router`: JSON control API (`GET/PUT /knobs`,
//!   `GET /state`, `GET /view`, `POST /instances`, `DELETE /instances/{id}`).
//! - [`World::fabric_view`]`(now) -> `[`FabricView`]: plain data the fabric reconciles the kernel
//!   to (subnets with gateway = network + 1; per instance the ENIs visible now, attach delay
//!   applied). [`World::subscribe`] signals every change.
//! - [`Knobs`]: throttling, latency, 5xx, dropped connections, attach delay, IMDS lag, partial
//!   IMDS prefix lists; [`World::set_knobs`] or `PUT /knobs`.
//! - [`serve`]: serve a router on a listener until a shutdown future resolves;
//!   [`LocalServer::start`]`(router)`: serve it on `127.0.0.1:<free port>` until dropped
//!   (`.url()` is the endpoint to hand to an SDK client).

pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod ec2;
pub mod fabric;
pub mod imds;
pub mod knobs;
pub mod kube;
pub mod limits;
pub mod netns_exec;
pub mod state;
pub mod view;
pub mod world;

pub use config::{ConfigError, Layout, SecurityGroupConfig, SubnetConfig, WorldConfig};
pub use knobs::Knobs;
pub use view::{
    BranchView, EniView, FabricView, InstanceView, SecurityGroupView, SgRuleView, SubnetView,
};
pub use world::World;

/// A router served on `127.0.0.1:<free port>` in the background; stops when dropped.
#[derive(Debug)]
pub struct LocalServer {
    addr: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl LocalServer {
    /// Bind `127.0.0.1:0` and serve `router` on the current tokio runtime.
    pub async fn start(router: axum::Router) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, router, async move {
            let _ = rx.await;
        }));
        Ok(Self { addr, _stop: stop })
    }

    /// The bound address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`: what `AWS_ENDPOINT_URL_EC2` /
    /// `AWS_EC2_METADATA_SERVICE_ENDPOINT` or an SDK `endpoint_url` should be set to.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Serve `router` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
