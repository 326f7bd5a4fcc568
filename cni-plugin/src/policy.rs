//! The network-policy agent client: `rpc.NPBackend` (`EnforceNpToPod`, `DeletePodNp`) over the
//! agent's unix socket, dialled blocking for up to 2 s, with a deadline per call. Translates every
//! failure into [`PolicyError`], which names the agent and its socket. Must not: decide when to
//! call (that is `command/`), touch the datapath.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipamd_proto::rpc::np_backend_client::NpBackendClient;
use ipamd_proto::rpc::{DeleteNpRequest, EnforceNpRequest};
use tonic::transport::Channel;

/// How long the plugin keeps dialling the agent (a connection refused is retried until then: an
/// agent container restarting beside ipamd is waited for, briefly).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline of one `EnforceNpToPod` / `DeletePodNp` call: a hung agent fails the verb (kubelet
/// retries) instead of holding the sandbox until kubelet's runtime timeout.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Pause between two dial attempts while [`CONNECT_TIMEOUT`] lasts.
const REDIAL_PAUSE: Duration = Duration::from_millis(50);

/// The RPC a [`PolicyError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    /// `NPBackend.EnforceNpToPod` (ADD).
    Enforce,
    /// `NPBackend.DeletePodNp` (DEL).
    Delete,
}

impl Rpc {
    /// The RPC's name on the wire.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enforce => "EnforceNpToPod",
            Self::Delete => "DeletePodNp",
        }
    }
}

impl std::fmt::Display for Rpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed call to the network-policy agent.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// No connection within [`CONNECT_TIMEOUT`] (socket absent, nobody listening).
    #[error("network policy agent unreachable at {} (dialled for {waited:?})", path.display())]
    Unreachable {
        /// The agent's socket.
        path: PathBuf,
        /// How long it was dialled.
        waited: Duration,
        /// The last dial error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The call failed on the wire (deadline, connection lost, an error status).
    #[error("network policy agent at {}: {rpc} failed: {}", path.display(), status.message())]
    Call {
        /// The agent's socket.
        path: PathBuf,
        /// Which call.
        rpc: Rpc,
        /// The status.
        status: tonic::Status,
    },
    /// The agent answered `Success=false`.
    #[error("network policy agent at {} answered {rpc} with Success=false", path.display())]
    Refused {
        /// The agent's socket.
        path: PathBuf,
        /// Which call.
        rpc: Rpc,
    },
}

impl PolicyError {
    /// Whether the agent could not be reached at all (as opposed to answering).
    #[must_use]
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }
}

/// The pod a call is about (`K8S_POD_NAME`, `K8S_POD_NAMESPACE`).
#[derive(Debug, Clone, Copy)]
pub struct PodRef<'a> {
    /// Pod name.
    pub name: &'a str,
    /// Pod namespace.
    pub namespace: &'a str,
}

/// A connection to the network-policy agent.
#[derive(Debug)]
pub struct PolicyAgent {
    channel: Channel,
    path: PathBuf,
}

impl PolicyAgent {
    /// Dials the agent's socket until it answers or `timeout` passes ([`CONNECT_TIMEOUT`] in
    /// production).
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, PolicyError> {
        let started = Instant::now();
        let unreachable = |source| PolicyError::Unreachable {
            path: path.to_path_buf(),
            waited: started.elapsed(),
            source,
        };
        loop {
            match crate::uds::connect(path, timeout).await {
                Ok(channel) => {
                    return Ok(Self {
                        channel,
                        path: path.to_path_buf(),
                    });
                }
                Err(e) if started.elapsed() + REDIAL_PAUSE >= timeout => {
                    return Err(unreachable(e));
                }
                Err(_) => tokio::time::sleep(REDIAL_PAUSE).await,
            }
        }
    }

    /// `EnforceNpToPod`: the agent attaches the pod's policy (or, in strict mode, default deny)
    /// before it answers.
    pub async fn enforce(
        &self,
        pod: PodRef<'_>,
        mode: &str,
        interface_count: i32,
        deadline: Duration,
    ) -> Result<(), PolicyError> {
        let mut request = tonic::Request::new(EnforceNpRequest {
            k8s_pod_name: pod.name.to_owned(),
            k8s_pod_namespace: pod.namespace.to_owned(),
            network_policy_mode: mode.to_owned(),
            interface_count,
        });
        request.set_timeout(deadline);
        let reply = NpBackendClient::new(self.channel.clone())
            .enforce_np_to_pod(request)
            .await
            .map_err(|status| self.call_failed(Rpc::Enforce, status))?;
        self.success(Rpc::Enforce, reply.get_ref().success)
    }

    /// `DeletePodNp`: the agent forgets the pod's policy state.
    pub async fn delete(&self, pod: PodRef<'_>, deadline: Duration) -> Result<(), PolicyError> {
        let mut request = tonic::Request::new(DeleteNpRequest {
            k8s_pod_name: pod.name.to_owned(),
            k8s_pod_namespace: pod.namespace.to_owned(),
        });
        request.set_timeout(deadline);
        let reply = NpBackendClient::new(self.channel.clone())
            .delete_pod_np(request)
            .await
            .map_err(|status| self.call_failed(Rpc::Delete, status))?;
        self.success(Rpc::Delete, reply.get_ref().success)
    }

    fn call_failed(&self, rpc: Rpc, status: tonic::Status) -> PolicyError {
        PolicyError::Call {
            path: self.path.clone(),
            rpc,
            status,
        }
    }

    fn success(&self, rpc: Rpc, success: bool) -> Result<(), PolicyError> {
        if success {
            Ok(())
        } else {
            Err(PolicyError::Refused {
                path: self.path.clone(),
                rpc,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipamd_proto::rpc::np_backend_server::{NpBackend, NpBackendServer};
    use ipamd_proto::rpc::{DeleteNpReply, EnforceNpReply};
    use std::sync::{Arc, Mutex};

    /// An in-process agent: records requests, answers `success` after `delay`.
    #[derive(Clone, Default)]
    struct Agent {
        seen: Arc<Mutex<Vec<EnforceNpRequest>>>,
        deletes: Arc<Mutex<Vec<DeleteNpRequest>>>,
        success: bool,
        delay: Duration,
    }

    #[tonic::async_trait]
    impl NpBackend for Agent {
        async fn enforce_np_to_pod(
            &self,
            request: tonic::Request<EnforceNpRequest>,
        ) -> Result<tonic::Response<EnforceNpReply>, tonic::Status> {
            tokio::time::sleep(self.delay).await;
            self.seen.lock().unwrap().push(request.into_inner());
            Ok(tonic::Response::new(EnforceNpReply {
                success: self.success,
            }))
        }
        async fn delete_pod_np(
            &self,
            request: tonic::Request<DeleteNpRequest>,
        ) -> Result<tonic::Response<DeleteNpReply>, tonic::Status> {
            self.deletes.lock().unwrap().push(request.into_inner());
            Ok(tonic::Response::new(DeleteNpReply {
                success: self.success,
            }))
        }
    }

    async fn serve(path: PathBuf, agent: Agent) {
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NpBackendServer::new(agent))
                .serve_with_incoming(incoming),
        );
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    const POD: PodRef<'static> = PodRef {
        name: "web-0",
        namespace: "shop",
    };

    /// The request carries upstream's fields as given; a `Success=false` answer and a slow
    /// answer past the deadline are errors naming the socket.
    #[test]
    fn enforce_sends_upstreams_fields_and_fails_on_refusal_or_deadline() {
        let dir = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let ok = Agent {
                success: true,
                ..Agent::default()
            };
            let path = dir.path().join("ok.sock");
            serve(path.clone(), ok.clone()).await;
            let agent = PolicyAgent::connect(&path, CONNECT_TIMEOUT).await.unwrap();
            agent.enforce(POD, "Strict", 2, CALL_TIMEOUT).await.unwrap();
            agent.delete(POD, CALL_TIMEOUT).await.unwrap();
            let seen = ok.seen.lock().unwrap().clone();
            assert_eq!(seen.len(), 1);
            assert_eq!(
                (
                    seen[0].k8s_pod_name.as_str(),
                    seen[0].k8s_pod_namespace.as_str(),
                    seen[0].network_policy_mode.as_str(),
                    seen[0].interface_count
                ),
                ("web-0", "shop", "Strict", 2)
            );
            assert_eq!(ok.deletes.lock().unwrap()[0].k8s_pod_name, "web-0");

            let refusing = dir.path().join("no.sock");
            serve(refusing.clone(), Agent::default()).await;
            let agent = PolicyAgent::connect(&refusing, CONNECT_TIMEOUT)
                .await
                .unwrap();
            let e = agent
                .enforce(POD, "standard", 1, CALL_TIMEOUT)
                .await
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    PolicyError::Refused {
                        rpc: Rpc::Enforce,
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("no.sock"), "{e}");

            let slow = dir.path().join("slow.sock");
            serve(
                slow.clone(),
                Agent {
                    success: true,
                    delay: Duration::from_millis(500),
                    ..Agent::default()
                },
            )
            .await;
            let agent = PolicyAgent::connect(&slow, CONNECT_TIMEOUT).await.unwrap();
            let e = agent
                .enforce(POD, "standard", 1, Duration::from_millis(100))
                .await
                .unwrap_err();
            assert!(matches!(e, PolicyError::Call { .. }), "{e}");
            assert!(!e.is_unreachable());
        });
    }

    /// Nobody listening: dialled for the whole timeout (upstream's blocking dial), then
    /// unreachable, naming the socket; an agent that starts listening while the plugin dials
    /// is reached.
    #[test]
    fn dial_waits_for_the_agent_then_gives_up() {
        let dir = tempfile::tempdir().unwrap();
        rt().block_on(async {
            let path = dir.path().join("npa.sock");
            let started = Instant::now();
            let e = PolicyAgent::connect(&path, Duration::from_millis(300))
                .await
                .unwrap_err();
            assert!(e.is_unreachable(), "{e}");
            assert!(started.elapsed() >= Duration::from_millis(250));
            assert!(e.to_string().contains("npa.sock"), "{e}");

            let late = path.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                serve(
                    late,
                    Agent {
                        success: true,
                        ..Agent::default()
                    },
                )
                .await;
            });
            let agent = PolicyAgent::connect(&path, CONNECT_TIMEOUT).await.unwrap();
            agent.enforce(POD, "strict", 1, CALL_TIMEOUT).await.unwrap();
        });
    }
}
