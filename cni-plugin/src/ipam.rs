//! The ipamd client: AddNetwork/DelNetwork, the network-policy mode
//! (`ConfigServerBackend.GetNetworkPolicyConfigs`) and the gRPC health check over ipamd's unix
//! socket, with connect and call deadlines. Translates transport failures, `Success=false` replies
//! and typed `IpamdError`s (status details, or the `ipamd-error-bin` metadata of a refused
//! AddNetwork) into [`IpamdCallError`]. Must not: decide what a failure means for the CNI verb.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ipamd_proto::rpc::cni_backend_client::CniBackendClient;
use ipamd_proto::rpc::config_server_backend_client::ConfigServerBackendClient;
use ipamd_proto::rpc::{AddNetworkReply, AddNetworkRequest, DelNetworkReply, DelNetworkRequest};
use ipamd_proto::{ERROR_METADATA_KEY, ErrorReason, IpamdError, UNKNOWN_POD_MESSAGE};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Deadline for connecting to the socket.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline for AddNetwork: ipamd may wait for addresses to arrive, up to 100 s while its pool
/// action is in flight (e.g. backing off a throttled account); this is just above that and below
/// kubelet's 2-minute runtime request timeout.
pub const ADD_TIMEOUT: Duration = Duration::from_secs(110);
/// Deadline for DelNetwork and health checks.
pub const DEL_TIMEOUT: Duration = Duration::from_secs(5);

/// A failed ipamd call.
#[derive(Debug, thiserror::Error)]
pub enum IpamdCallError {
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
    /// ipamd answered `Success=false` (how an ipamd refuses an AddNetwork).
    #[error("ipamd {rpc} refused: {message}")]
    Refused {
        /// RPC name.
        rpc: &'static str,
        /// Typed reason, when ipamd sent one (an older ipamd sends none).
        reason: Option<ErrorReason>,
        /// ipamd's message, or a generic one.
        message: String,
    },
}

impl IpamdCallError {
    fn from_status(rpc: &'static str, status: tonic::Status) -> Self {
        let reason = IpamdError::from_details(status.details()).map(|e| e.reason());
        Self::Status {
            rpc,
            status,
            reason,
        }
    }

    /// A `Success=false` reply, with the typed error our ipamd puts in the response metadata
    /// (`generic`: the message when it has none).
    fn refused(rpc: &'static str, metadata: &tonic::metadata::MetadataMap, generic: &str) -> Self {
        let error = metadata
            .get_bin(ERROR_METADATA_KEY)
            .and_then(|v| v.to_bytes().ok())
            .and_then(|b| IpamdError::from_details(&b));
        Self::Refused {
            rpc,
            reason: error.as_ref().map(IpamdError::reason),
            message: error.map_or_else(|| generic.to_owned(), |e| e.message),
        }
    }

    /// Worth retrying later (unreachable, not ready, deadline, resources exhausted).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { .. } => true,
            Self::Refused { reason, .. } => reason.is_some_and(transient_reason),
            Self::Status { status, reason, .. } => {
                reason.is_some_and(transient_reason)
                    || (reason.is_none()
                        && matches!(
                            status.code(),
                            tonic::Code::Unavailable
                                | tonic::Code::DeadlineExceeded
                                | tonic::Code::ResourceExhausted
                        ))
            }
        }
    }

    /// ipamd answered `Success=false`.
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Refused { .. })
    }

    /// The typed reason ipamd gave, if any.
    #[must_use]
    pub fn reason(&self) -> Option<ErrorReason> {
        match self {
            Self::Connect { .. } => None,
            Self::Status { reason, .. } | Self::Refused { reason, .. } => *reason,
        }
    }

    /// ipamd could not be reached: no connection, or the transport failed without an answer
    /// from ipamd (no typed reason).
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Connect { .. } => true,
            Self::Status {
                status,
                reason: None,
                ..
            } => status.code() == tonic::Code::Unavailable,
            _ => false,
        }
    }

    /// ipamd does not know the pod (DEL treats this as success). Our ipamd says so with the typed
    /// reason; an ipamd without typed reasons only with the text
    /// [`ipamd_proto::UNKNOWN_POD_MESSAGE`], which is the protocol's wire contract, so that text is
    /// the one thing matched here, and only when no typed reason came.
    #[must_use]
    pub fn is_unknown_pod(&self) -> bool {
        match self {
            Self::Status {
                reason: Some(r), ..
            } => *r == ErrorReason::UnknownPod,
            Self::Status {
                status,
                reason: None,
                ..
            } => status.message().contains(UNKNOWN_POD_MESSAGE),
            Self::Connect { .. } | Self::Refused { .. } => false,
        }
    }
}

/// Reasons that a later retry may well not meet (the pool still growing, EC2 throttled or
/// away, addresses cooling down, ipamd busy): CNI code 11.
fn transient_reason(r: ErrorReason) -> bool {
    matches!(
        r,
        ErrorReason::NotReady
            | ErrorReason::CheckpointFailed
            | ErrorReason::NoAvailableAddress
            | ErrorReason::PoolWarming
            | ErrorReason::CoolingDown
            | ErrorReason::Ec2Throttled
            | ErrorReason::Ec2Unavailable
    )
}

/// A connection to ipamd.
#[derive(Debug)]
pub struct Ipamd {
    channel: Channel,
    path: PathBuf,
}

impl Ipamd {
    /// Connects to ipamd's unix socket.
    pub async fn connect(path: &Path) -> Result<Self, IpamdCallError> {
        let err = |source| IpamdCallError::Connect {
            path: path.to_path_buf(),
            source,
        };
        let channel = crate::uds::connect(path, CONNECT_TIMEOUT)
            .await
            .map_err(err)?;
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
    pub async fn add(&self, req: AddNetworkRequest) -> Result<AddNetworkReply, IpamdCallError> {
        let mut request = tonic::Request::new(req);
        request.set_timeout(ADD_TIMEOUT);
        let response = CniBackendClient::new(self.channel.clone())
            .add_network(request)
            .await
            .map_err(|s| IpamdCallError::from_status("AddNetwork", s))?;
        if !response.get_ref().success {
            return Err(IpamdCallError::refused(
                "AddNetwork",
                response.metadata(),
                "failed to assign an IP address to container",
            ));
        }
        Ok(response.into_inner())
    }

    /// DelNetwork; a `Success=false` reply is [`IpamdCallError::Refused`] (the DEL fails on it:
    /// "failed to process delete request").
    pub async fn del(&self, req: DelNetworkRequest) -> Result<DelNetworkReply, IpamdCallError> {
        let mut request = tonic::Request::new(req);
        request.set_timeout(DEL_TIMEOUT);
        let response = CniBackendClient::new(self.channel.clone())
            .del_network(request)
            .await
            .map_err(|s| IpamdCallError::from_status("DelNetwork", s))?;
        if !response.get_ref().success {
            return Err(IpamdCallError::refused(
                "DelNetwork",
                response.metadata(),
                "failed to process delete request",
            ));
        }
        Ok(response.into_inner())
    }

    /// The `NetworkPolicyMode` ipamd hands out ("" = no network-policy agent calls), from the call
    /// the agent itself makes at start (`GetNetworkPolicyConfigs`, served on the same socket). DEL
    /// asks it when `DelNetwork` carried no reply (unknown pod).
    pub async fn network_policy_mode(&self) -> Result<String, IpamdCallError> {
        let mut request = tonic::Request::new(());
        request.set_timeout(DEL_TIMEOUT);
        ConfigServerBackendClient::new(self.channel.clone())
            .get_network_policy_configs(request)
            .await
            .map(|r| r.into_inner().network_policy_mode)
            .map_err(|s| IpamdCallError::from_status("GetNetworkPolicyConfigs", s))
    }

    /// Whether ipamd reports SERVING for its health service name.
    pub async fn serving(&self) -> Result<bool, IpamdCallError> {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: ipamd_proto::HEALTH_SERVICE_NAME.to_owned(),
        });
        request.set_timeout(DEL_TIMEOUT);
        let reply = HealthClient::new(self.channel.clone())
            .check(request)
            .await
            .map_err(|s| IpamdCallError::from_status("Health.Check", s))?;
        Ok(reply.into_inner().status() == ServingStatus::Serving)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_error(status: tonic::Status) -> IpamdCallError {
        IpamdCallError::from_status("DelNetwork", status)
    }

    /// Our ipamd's typed reason decides; upstream's ipamd (no details) is recognised by its
    /// `datastore.ErrUnknownPod` text, as upstream's plugin does.
    #[test]
    fn unknown_pod_from_either_ipamd() {
        let ours = tonic::Status::with_details(
            tonic::Code::Unknown,
            "datastore: unknown pod: x",
            IpamdError {
                reason: ErrorReason::UnknownPod as i32,
                message: String::new(),
            }
            .to_details()
            .into(),
        );
        assert!(status_error(ours).is_unknown_pod());
        let upstream = tonic::Status::new(tonic::Code::Unknown, "datastore: unknown pod");
        assert!(status_error(upstream).is_unknown_pod());
        let other = tonic::Status::new(tonic::Code::Unknown, "checkpoint write failed");
        assert!(!status_error(other).is_unknown_pod());
    }

    #[test]
    fn refused_add_carries_the_typed_reason_when_there_is_one() {
        let mut md = tonic::metadata::MetadataMap::new();
        md.insert_bin(
            ERROR_METADATA_KEY,
            tonic::metadata::MetadataValue::from_bytes(
                &IpamdError {
                    reason: ErrorReason::NoAvailableAddress as i32,
                    message: "no address".into(),
                }
                .to_details(),
            ),
        );
        let e = IpamdCallError::refused("AddNetwork", &md, "generic");
        assert!(e.is_transient());
        assert!(e.to_string().contains("no address"), "{e}");
        // upstream's ipamd: Success=false and nothing else.
        let e = IpamdCallError::refused(
            "AddNetwork",
            &tonic::metadata::MetadataMap::new(),
            "failed to assign an IP address to container",
        );
        assert!(!e.is_transient() && !e.is_unknown_pod());
        assert!(
            e.to_string().contains("failed to assign an IP address"),
            "{e}"
        );
    }
}
