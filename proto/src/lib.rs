//! The ipamd gRPC wire contract: generated `rpc` types plus the protocol constants both sides
//! agree on. Owns nothing else: no business logic, no dependency on the plugin or the daemon.

#![allow(missing_docs, missing_debug_implementations)]

/// Generated from `rpc.proto` (package `rpc`, wire-compatible with upstream).
#[allow(clippy::all, clippy::pedantic, non_snake_case, rust_2018_idioms)]
pub mod rpc {
    tonic::include_proto!("rpc");
}

pub use rpc::{ErrorReason, IpamdError};

/// Default path of ipamd's gRPC unix socket (upstream v1.23+).
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/aws-node/ipamd.sock";

/// Where the network-policy agent serves `rpc.NPBackend` (upstream's plugin hard-codes it,
/// `npaSocketPath` in `cmd/routed-eni-cni-plugin/cni.go`).
pub const DEFAULT_NPA_SOCKET_PATH: &str = "/var/run/aws-node/npa.sock";

/// Service name registered with `grpc.health.v1` (as upstream's `grpc-health-probe` asks).
pub const HEALTH_SERVICE_NAME: &str = "grpc.health.v1.aws-node";

/// The version this crate was compiled with (`CARGO_PKG_VERSION`). What travels on the wire and
/// is checked is [`build_version`], which reads the binary's version stamp.
pub const BUILD_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Bytes that open the version stamp in every binary that calls [`build_version`]. The version
/// follows, NUL-padded to [`VERSION_STAMP_CAPACITY`] bytes. Release tooling and the
/// rolling-update test (`integration::version_stamp`) re-stamp a copy of a built binary by
/// rewriting those bytes, so "two builds reporting different versions" need one compilation.
pub const VERSION_STAMP_MARKER: &[u8; 32] = b"aws-vpc-cni-rs/build-version-v1:";

/// Room for the version text after the marker.
pub const VERSION_STAMP_CAPACITY: usize = 48;

const STAMP_LEN: usize = VERSION_STAMP_MARKER.len() + VERSION_STAMP_CAPACITY;

const fn version_stamp(version: &str) -> [u8; STAMP_LEN] {
    let v = version.as_bytes();
    assert!(
        v.len() < VERSION_STAMP_CAPACITY,
        "version too long for the stamp"
    );
    let mut out = [0u8; STAMP_LEN];
    let mut i = 0;
    while i < VERSION_STAMP_MARKER.len() {
        out[i] = VERSION_STAMP_MARKER[i];
        i += 1;
    }
    let mut j = 0;
    while j < v.len() {
        out[VERSION_STAMP_MARKER.len() + j] = v[j];
        j += 1;
    }
    out
}

static VERSION_STAMP: [u8; STAMP_LEN] = version_stamp(BUILD_VERSION);

/// The build version sent as `ClientVersion` and checked by ipamd. Plugin and daemon must come
/// from the same build, as upstream requires. Read from the binary's version stamp (equal to
/// [`BUILD_VERSION`] unless the binary was re-stamped).
#[must_use]
pub fn build_version() -> &'static str {
    // black_box: the stamp must be read from the binary at run time, never constant-folded.
    let stamp: &'static [u8; STAMP_LEN] = std::hint::black_box(&VERSION_STAMP);
    let text = &stamp[VERSION_STAMP_MARKER.len()..];
    let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
    std::str::from_utf8(&text[..end]).unwrap_or("invalid-version-stamp")
}

/// Binary response metadata of a failed AddNetwork (`Success=false`, as upstream answers): the
/// encoded [`IpamdError`]. Upstream clients ignore it.
pub const ERROR_METADATA_KEY: &str = "ipamd-error-bin";

/// The text of upstream's `datastore.ErrUnknownPod`, which upstream's plugin looks for in a
/// failed DelNetwork's message. Our status message starts with it; our clients use the reason.
pub const UNKNOWN_POD_MESSAGE: &str = "datastore: unknown pod";

/// `DelNetworkRequest.Reason` values upstream uses.
pub mod del_reason {
    /// Normal pod deletion.
    pub const POD_DELETED: &str = "PodDeleted";
    /// ADD failed after the address was assigned; the plugin gives it back.
    pub const SETUP_NS_FAILED: &str = "SetupNSFailed";
}

impl IpamdError {
    /// Encodes this error for `tonic::Status::with_details`.
    pub fn to_details(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(self)
    }

    /// Decodes the details of a failed call; `None` when the peer sent none (e.g. upstream ipamd).
    pub fn from_details(details: &[u8]) -> Option<Self> {
        if details.is_empty() {
            return None;
        }
        <Self as prost::Message>::decode(details).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn the_unstamped_build_reports_its_crate_version() {
        assert_eq!(build_version(), BUILD_VERSION);
        assert!(VERSION_STAMP.starts_with(VERSION_STAMP_MARKER));
    }

    #[test]
    fn error_details_round_trip() {
        let e = IpamdError {
            reason: ErrorReason::UnknownPod as i32,
            message: "x".into(),
        };
        let back = IpamdError::from_details(&e.to_details()).unwrap();
        assert_eq!(back.reason(), ErrorReason::UnknownPod);
        assert_eq!(IpamdError::from_details(&[]), None);
    }

    /// Field numbers are the wire contract: encode with known tags and compare raw bytes.
    #[test]
    fn add_request_field_numbers_match_upstream() {
        let req = rpc::AddNetworkRequest {
            k8s_pod_name: "p".into(),            // tag 1
            container_id: "c".into(),            // tag 7
            client_version: "v".into(),          // tag 8
            requires_multi_nic_attachment: true, // tag 9
            ..Default::default()
        };
        let bytes = req.encode_to_vec();
        // (tag << 3 | wiretype): 1/LEN=0x0a, 7/LEN=0x3a, 8/LEN=0x42, 9/VARINT=0x48
        for key in [0x0a_u8, 0x3a, 0x42, 0x48] {
            assert!(
                bytes.contains(&key),
                "missing key byte {key:#x} in {bytes:?}"
            );
        }
        let reply = rpc::AddNetworkReply {
            network_policy_mode: "strict".into(), // tag 13 -> 0x6a
            vp_cv6_cid_rs: vec!["::/0".into()],   // tag 12 -> 0x62
            ..Default::default()
        };
        let bytes = reply.encode_to_vec();
        assert_eq!(bytes[0], 0x62);
        assert!(bytes.contains(&0x6a));
    }
}
