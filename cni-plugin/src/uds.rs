//! Dials a gRPC server on a unix socket (ipamd, the network-policy agent) through our own
//! connector instead of tonic's `unix://` endpoint. The wire is the same (HTTP/2 over the socket,
//! authority `tonic`, which tonic's unix endpoint sends too), but `Endpoint::connect` also links
//! tonic's TCP connector and hyper-util's `getaddrinfo` resolver into the binary. `aws-cni` and
//! `egress-cni` are linked statically against glibc (docs/image.md), where a name lookup would
//! go through NSS modules of the node's glibc; with only this connector no lookup function is
//! linked at all, which `ipamd/tests/release_features.rs` checks. Must not: resolve names, dial
//! TCP.

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// The URI requests carry: tonic's own stand-in for a unix endpoint (`http://tonic`). Nothing
/// is resolved from it; the connector below ignores it.
const AUTHORITY_URI: &str = "http://tonic";

/// Connects to the gRPC server listening on `path`; the socket connect is abandoned after
/// `connect_timeout`.
pub async fn connect(
    path: &Path,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::from_static(AUTHORITY_URI)
        .connect_timeout(connect_timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await
}
