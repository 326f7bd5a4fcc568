//! The ipamd client: AddNetwork/DelNetwork and the gRPC health check over ipamd's unix socket,
//! with connect and call deadlines. Translates transport failures and typed `IpamdError`
//! details into [`IpamError`]. Must not: decide what a failure means for the CNI verb.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ipamd_proto::rpc::cni_backend_client::CniBackendClient;
use ipamd_proto::rpc::{AddNetworkReply, AddNetworkRequest, DelNetworkReply, DelNetworkRequest};
use ipamd_proto::{ErrorReason, IpamdError};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Deadline for connecting to the socket.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline for AddNetwork (ipamd may wait for addresses to arrive).
pub const ADD_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for DelNetwork and health checks.
pub const DEL_TIMEOUT: Duration = Duration::from_secs(5);

/// A failed ipamd call.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// The socket could not be reached.
    #[error("connect to ipamd at {path}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: tonic::transport::Error,
    },
    /// ipamd (or the transport) answered with a non-OK status.
    #[error("ipamd {rpc}: {}", status.message())]
    Status {
        /// RPC name.
        rpc: &'static str,
        /// gRPC status.
        status: tonic::Status,
        /// Typed reason, when ipamd sent one.
        reason: Option<ErrorReason>,
    },
}

impl IpamError {
    fn from_status(rpc: &'static str, status: tonic::Status) -> Self {
        let reason = IpamdError::from_details(status.details()).map(|e| e.reason());
        Self::Status {
            rpc,
            status,
            reason,
        }
    }

    /// Worth retrying later (unreachable, not ready, deadline, resources exhausted).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { .. } => true,
            Self::Status { status, reason, .. } => {
                matches!(
                    reason,
                    Some(
                        ErrorReason::NotReady
                            | ErrorReason::CheckpointFailed
                            | ErrorReason::NoAvailableAddress
                    )
                ) || (reason.is_none()
                    && matches!(
                        status.code(),
                        tonic::Code::Unavailable
                            | tonic::Code::DeadlineExceeded
                            | tonic::Code::ResourceExhausted
                    ))
            }
        }
    }

    /// ipamd does not know the pod (DEL treats this as success).
    #[must_use]
    pub fn is_unknown_pod(&self) -> bool {
        matches!(
            self,
            Self::Status {
                reason: Some(ErrorReason::UnknownPod),
                ..
            }
        ) || matches!(self, Self::Status { status, reason: None, .. } if status.code() == tonic::Code::NotFound)
    }
}

/// A connection to ipamd.
#[derive(Debug)]
pub struct Ipamd {
    channel: Channel,
    path: PathBuf,
}

impl Ipamd {
    /// Connects to ipamd's unix socket.
    pub async fn connect(path: &Path) -> Result<Self, IpamError> {
        let err = |source| IpamError::Connect {
            path: path.to_path_buf(),
            source,
        };
        let endpoint = Endpoint::from_shared(format!("unix://{}", path.display()))
            .map_err(err)?
            .connect_timeout(CONNECT_TIMEOUT);
        let channel = endpoint.connect().await.map_err(err)?;
        Ok(Self {
            channel,
            path: path.to_path_buf(),
        })
    }

    /// Socket path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// AddNetwork.
    pub async fn add(&self, req: AddNetworkRequest) -> Result<AddNetworkReply, IpamError> {
        let mut request = tonic::Request::new(req);
        request.set_timeout(ADD_TIMEOUT);
        CniBackendClient::new(self.channel.clone())
            .add_network(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| IpamError::from_status("AddNetwork", s))
    }

    /// DelNetwork.
    pub async fn del(&self, req: DelNetworkRequest) -> Result<DelNetworkReply, IpamError> {
        let mut request = tonic::Request::new(req);
        request.set_timeout(DEL_TIMEOUT);
        CniBackendClient::new(self.channel.clone())
            .del_network(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| IpamError::from_status("DelNetwork", s))
    }

    /// Whether ipamd reports SERVING for its health service name.
    pub async fn serving(&self) -> Result<bool, IpamError> {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: ipamd_proto::HEALTH_SERVICE_NAME.to_owned(),
        });
        request.set_timeout(DEL_TIMEOUT);
        let reply = HealthClient::new(self.channel.clone())
            .check(request)
            .await
            .map_err(|s| IpamError::from_status("Health.Check", s))?;
        Ok(reply.into_inner().status() == ServingStatus::Serving)
    }
}
