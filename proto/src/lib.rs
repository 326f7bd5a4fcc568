//! The ipamd gRPC wire contract: generated `rpc` types plus the protocol constants both sides
//! agree on. Owns nothing else: no business logic, no dependency on the plugin or the daemon.

#![allow(missing_docs, missing_debug_implementations)]

/// Generated from `rpc.proto` (package `rpc`, wire-compatible with every plugin and daemon of the
/// protocol).
#[allow(clippy::all, clippy::pedantic, non_snake_case, rust_2018_idioms)]
pub mod rpc {
    tonic::include_proto!("rpc");
}

pub use rpc::{ErrorReason, IpamdError};

/// Default path of ipamd's gRPC unix socket.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/aws-node/ipamd.sock";

/// Where the network-policy agent serves `rpc.NPBackend`.
pub const DEFAULT_NPA_SOCKET_PATH: &str = "/var/run/aws-node/npa.sock";

/// Service name registered with `grpc.health.v1` (what the chart's probe asks for).
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

/// The build version sent as `ClientVersion` and checked by ipamd. Plugin and daemon must come from
/// the same build. Read from the binary's version stamp (equal to [`BUILD_VERSION`] unless the
/// binary was re-stamped).
#[must_use]
pub fn build_version() -> &'static str {
    // black_box: the stamp must be read from the binary at run time, never constant-folded.
    let stamp: &'static [u8; STAMP_LEN] = std::hint::black_box(&VERSION_STAMP);
    let text = &stamp[VERSION_STAMP_MARKER.len()..];
    let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
    std::str::from_utf8(&text[..end]).unwrap_or("invalid-version-stamp")
}

/// Binary response metadata of a failed AddNetwork (`Success=false`): the encoded [`IpamdError`].
/// Clients that do not know it ignore it.
pub const ERROR_METADATA_KEY: &str = "ipamd-error-bin";

/// The text plugins that read no reason look for in a failed DelNetwork's message. Our status
/// message starts with it; our clients use the reason.
pub const UNKNOWN_POD_MESSAGE: &str = "datastore: unknown pod";

/// `DelNetworkRequest.Reason` values plugins send.
pub mod del_reason {
    /// Normal pod deletion.
    pub const POD_DELETED: &str = "PodDeleted";
    /// ADD failed after the address was assigned; the plugin gives it back.
    pub const SETUP_NS_FAILED: &str = "SetupNSFailed";
}

/// Why an ADD failed, as operators read it: the short code of each [`ErrorReason`], printed by the
/// plugin in the CNI error message, used as the `reason` label of `awscni_add_failures_total` and
/// as the reason of the Warning Event on the pod. A closed set: [`ADD_FAILURE_CODES`] lists every
/// value.
#[must_use]
pub fn add_failure_code(reason: ErrorReason) -> &'static str {
    match reason {
        ErrorReason::Unspecified | ErrorReason::Internal => "Internal",
        ErrorReason::VersionMismatch => "VersionMismatch",
        ErrorReason::InvalidRequest => "InvalidRequest",
        ErrorReason::NoAvailableAddress => "NoAvailableAddress",
        ErrorReason::InstanceLimitReached => "EniLimit",
        ErrorReason::SubnetExhausted => "SubnetFull",
        ErrorReason::UnknownPod => "UnknownPod",
        ErrorReason::CheckpointFailed => "CheckpointFailed",
        ErrorReason::NotReady => "IpamdNotReady",
        ErrorReason::PermissionDenied => "PermissionDenied",
        ErrorReason::Unsupported => "Unsupported",
        ErrorReason::MaxPods => "MaxPods",
        ErrorReason::NoFreePrefix => "NoFreePrefix",
        ErrorReason::Ec2Throttled => "Ec2Throttled",
        ErrorReason::Ec2Unauthorized => "Ec2Unauthorized",
        ErrorReason::Ec2Unavailable => "Ec2Unavailable",
        ErrorReason::PoolWarming => "PoolWarming",
        ErrorReason::CoolingDown => "CoolingDown",
        ErrorReason::CustomNetworkingConfig => "CustomNetworkingConfig",
        ErrorReason::NodeUnschedulable => "NodeUnschedulable",
        ErrorReason::IpamdUnavailable => "IpamdUnavailable",
        ErrorReason::PolicyAgentUnavailable => "PolicyAgentUnavailable",
    }
}

/// Every code [`add_failure_code`] returns (the label values of `awscni_add_failures_total`).
pub const ADD_FAILURE_CODES: &[&str] = &[
    "SubnetFull",
    "NoFreePrefix",
    "EniLimit",
    "MaxPods",
    "NodeUnschedulable",
    "CoolingDown",
    "PoolWarming",
    "NoAvailableAddress",
    "Ec2Throttled",
    "Ec2Unauthorized",
    "Ec2Unavailable",
    "CustomNetworkingConfig",
    "IpamdUnavailable",
    "IpamdNotReady",
    "VersionMismatch",
    "PolicyAgentUnavailable",
    "CheckpointFailed",
    "InvalidRequest",
    "PermissionDenied",
    "Unsupported",
    "UnknownPod",
    "Internal",
];

/// The reason whose code is `code` (the inverse of [`add_failure_code`]; `Internal` for an
/// unknown code).
#[must_use]
pub fn reason_of_code(code: &str) -> ErrorReason {
    (0..=i32::MAX)
        .map_while(|n| ErrorReason::try_from(n).ok())
        .find(|r| add_failure_code(*r) == code && *r != ErrorReason::Unspecified)
        .unwrap_or(ErrorReason::Internal)
}

/// The failure spool: ADD failures the plugin saw without ipamd hearing of them (ipamd
/// unreachable, network-policy agent down), appended by the plugin, read and emptied by ipamd,
/// which counts them in `awscni_add_failures_total` and puts the Event on the pod
/// (docs/operations.md, "Where each reason is counted"). Its path is the ipamd socket's with
/// this suffix, so each ipamd (one per node, or per simulated node) reads its own plugins'.
pub mod failure_spool {
    use std::path::{Path, PathBuf};

    /// Suffix added to the socket path.
    pub const SUFFIX: &str = ".add-failures";
    /// Above this size the plugin appends nothing more (ipamd away for long: the counts stop,
    /// the CNI error messages still say why).
    pub const MAX_BYTES: u64 = 256 * 1024;

    /// The spool next to `socket`.
    #[must_use]
    pub fn path(socket: &Path) -> PathBuf {
        let mut p = socket.as_os_str().to_owned();
        p.push(SUFFIX);
        PathBuf::from(p)
    }

    /// One failure: when (Unix seconds), its code, the pod, what the plugin said.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Record {
        /// Unix seconds.
        pub at: u64,
        /// An [`super::add_failure_code`] value.
        pub code: String,
        /// Pod namespace.
        pub namespace: String,
        /// Pod name.
        pub name: String,
        /// The message the plugin printed (without its prefix).
        pub message: String,
    }

    fn clean(s: &str) -> String {
        s.replace(['\t', '\n', '\r'], " ")
    }

    impl Record {
        /// One line: tab-separated fields, newline-terminated (one `write` with `O_APPEND`:
        /// concurrent plugins never interleave a line).
        #[must_use]
        pub fn to_line(&self) -> String {
            format!(
                "{}\t{}\t{}\t{}\t{}\n",
                self.at,
                clean(&self.code),
                clean(&self.namespace),
                clean(&self.name),
                clean(&self.message)
            )
        }

        /// Parses one line; `None` for a torn or foreign one.
        #[must_use]
        pub fn parse(line: &str) -> Option<Self> {
            let mut f = line.trim_end_matches('\n').splitn(5, '\t');
            Some(Self {
                at: f.next()?.parse().ok()?,
                code: f.next()?.to_owned(),
                namespace: f.next()?.to_owned(),
                name: f.next()?.to_owned(),
                message: f.next()?.to_owned(),
            })
        }
    }
}

/// The set-up timings of one successful ADD, as the plugin measured them: sent as one unix
/// datagram to the socket beside ipamd's (this suffix), fire and forget (never waited for,
/// dropped when ipamd is not listening or its queue is full), and observed by ipamd in
/// `awscni_pod_network_setup_seconds{phase}` (docs/operations.md, "Where pod set-up time goes").
/// The plugin's phases live only in the plugin process; this is how they reach Prometheus.
pub mod setup_timings {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    /// Suffix added to the socket path.
    pub const SUFFIX: &str = ".setup-timings";
    /// The datagram's first word: a receiver ignores any other (a future format).
    pub const VERSION: &str = "v1";
    /// Larger datagrams are not ours.
    pub const MAX_BYTES: usize = 256;

    /// The datagram socket next to `socket`.
    #[must_use]
    pub fn path(socket: &Path) -> PathBuf {
        let mut p = socket.as_os_str().to_owned();
        p.push(SUFFIX);
        PathBuf::from(p)
    }

    /// One ADD's phases as the plugin saw them.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Report {
        /// From the plugin's start to its result (the CNI's whole share of sandbox set-up, less
        /// the process start before `main`).
        pub plugin_total: Duration,
        /// The AddNetwork call as the plugin waited for it (ipamd's address wait inside).
        pub ipamd_call: Duration,
        /// The kernel work in the pod's and the host's namespaces.
        pub host_wiring: Duration,
        /// The network-policy agent's call; `None` when the pod needed none.
        pub policy_agent: Option<Duration>,
    }

    impl Report {
        /// The datagram: `v1 <plugin_total_us> <ipamd_call_us> <host_wiring_us> <policy_us|->`.
        #[must_use]
        pub fn to_datagram(&self) -> String {
            let us = |d: Duration| d.as_micros().to_string();
            format!(
                "{VERSION} {} {} {} {}",
                us(self.plugin_total),
                us(self.ipamd_call),
                us(self.host_wiring),
                self.policy_agent.map_or_else(|| "-".to_owned(), us)
            )
        }

        /// Parses one datagram; `None` for a foreign, truncated or later-format one.
        #[must_use]
        pub fn parse(datagram: &[u8]) -> Option<Self> {
            if datagram.len() > MAX_BYTES {
                return None;
            }
            let text = std::str::from_utf8(datagram).ok()?;
            let mut f = text.split(' ');
            if f.next()? != VERSION {
                return None;
            }
            let mut us =
                || -> Option<Duration> { Some(Duration::from_micros(f.next()?.parse().ok()?)) };
            let plugin_total = us()?;
            let ipamd_call = us()?;
            let host_wiring = us()?;
            let policy_agent = match f.next()? {
                "-" => None,
                v => Some(Duration::from_micros(v.parse().ok()?)),
            };
            if f.next().is_some() {
                return None;
            }
            Some(Self {
                plugin_total,
                ipamd_call,
                host_wiring,
                policy_agent,
            })
        }
    }
}

impl IpamdError {
    /// Encodes this error for `tonic::Status::with_details`.
    pub fn to_details(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(self)
    }

    /// Decodes the details of a failed call; `None` when the peer sent none (an ipamd that does not
    /// know them).
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
    fn every_reason_has_a_listed_code_and_back() {
        let mut n = 0;
        while let Ok(r) = ErrorReason::try_from(n) {
            let code = add_failure_code(r);
            assert!(ADD_FAILURE_CODES.contains(&code), "{r:?} -> {code}");
            if r != ErrorReason::Unspecified {
                assert_eq!(reason_of_code(code), r);
            }
            n += 1;
        }
        assert_eq!(n, 23, "a reason was added: list its code");
        assert_eq!(ADD_FAILURE_CODES.len(), 22);
    }

    #[test]
    fn spool_lines_round_trip_and_stay_one_line() {
        let r = failure_spool::Record {
            at: 17,
            code: "IpamdUnavailable".into(),
            namespace: "default".into(),
            name: "web-0".into(),
            message: "ipamd at /s\tnot\nreachable".into(),
        };
        let line = r.to_line();
        assert_eq!(line.matches('\n').count(), 1);
        let back = failure_spool::Record::parse(&line).unwrap();
        assert_eq!(back.message, "ipamd at /s not reachable");
        assert_eq!(back.code, r.code);
        assert_eq!(failure_spool::Record::parse("torn"), None);
        assert_eq!(
            failure_spool::path(std::path::Path::new("/run/a/ipamd.sock")),
            std::path::Path::new("/run/a/ipamd.sock.add-failures")
        );
    }

    #[test]
    fn setup_timings_round_trip_and_refuse_foreign_datagrams() {
        use std::time::Duration;
        let r = setup_timings::Report {
            plugin_total: Duration::from_micros(2_345),
            ipamd_call: Duration::from_micros(400),
            host_wiring: Duration::from_micros(1_010),
            policy_agent: None,
        };
        let d = r.to_datagram();
        assert_eq!(d, "v1 2345 400 1010 -");
        assert_eq!(setup_timings::Report::parse(d.as_bytes()), Some(r));
        let with = setup_timings::Report {
            policy_agent: Some(Duration::from_micros(7)),
            ..r
        };
        assert_eq!(
            setup_timings::Report::parse(with.to_datagram().as_bytes()),
            Some(with)
        );
        for foreign in ["v2 1 2 3 -", "v1 1 2 3", "v1 1 2 3 - 9", "v1 x 2 3 -", ""] {
            assert_eq!(
                setup_timings::Report::parse(foreign.as_bytes()),
                None,
                "{foreign}"
            );
        }
        assert_eq!(
            setup_timings::path(std::path::Path::new("/run/a/ipamd.sock")),
            std::path::Path::new("/run/a/ipamd.sock.setup-timings")
        );
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
