//! Test infrastructure shared by the end-to-end suites: throwaway node/pod/VPC network
//! namespaces ([`TestNode`]), the `test-ipamd` process ([`TestIpamd`]), direct plugin
//! invocations ([`CniCall`]), a real CNI client ([`Podman`]), the simulated-VPC harness
//! ([`sim`]), the network-policy agent stand-in ([`npa`]: `npa-standin` started in a node
//! namespace, steered through control files) and the process-and-namespace [`supervisor`] they
//! all share; the project's images ([`images`]) and a kubelet-shaped node ([`kubelet`]:
//! containerd via the CRI running the chart's DaemonSet). Everything it creates carries a per-run prefix and is removed on drop (also on
//! panic); leftovers of crashed runs are removed by the next run. Must not: touch the root
//! network namespace or processes it did not start.

pub mod binaries;
pub mod cni;
pub mod fleet;
pub mod images;
pub mod kubelet;
pub mod moto;
pub mod node;
pub mod npa;
pub mod podman;
pub mod sim;
pub mod supervisor;
pub mod upstream_node;
pub mod version_stamp;
pub mod vm;
pub mod vpc_rc;

pub use binaries::built_binary;
pub use cni::{CniCall, CniOutput};
pub use node::{PREFIX, PodNs, TestIpamd, TestNode};
pub use podman::Podman;

/// Whether the kernel tests can run here (root). Tests print a skip line and return when not.
#[must_use]
pub fn can_run_kernel_tests() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        eprintln!("SKIP: kernel tests need root (they create network namespaces)");
    }
    root
}

/// A gRPC channel over the unix socket at `socket` (a file: reachable from any network
/// namespace), for the harness's clients of ipamd (`fleet::connect`) and of a node's containerd
/// (`kubelet::NodeRuntime`).
pub async fn unix_channel(socket: std::path::PathBuf) -> Result<tonic::transport::Channel, String> {
    tonic::transport::Endpoint::try_from("http://[::]:50051")
        .map_err(|e| e.to_string())?
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .map_err(|e| format!("connect: {e}"))
}
