//! The plugin's network configuration (stdin JSON): the fields of the `aws-cni` conflist entry plus
//! our `ipamdSocket` and `npaSocket`, the CNI versions we speak (every released spec version, with
//! the rules for which verb each allows), and `prevResult`. Parsed and validated once; unknown
//! fields are ignored as the spec requires. Must not: read files or the environment (stdin's bytes
//! come in from `main`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use dataplane::conventions::{
    DEFAULT_MTU, DEFAULT_VETH_PREFIX, MAX_MTU, MIN_MTU_V4, VethPrefixError, validate_veth_prefix,
};
use serde::Deserialize;

use super::result::PrevResult;

/// A CNI spec version this plugin speaks: all of them (containernetworking/cni v1.3.0's
/// `version.All`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    /// 0.1.0 (also what a configuration without `cniVersion` means).
    V0_1_0,
    /// 0.2.0 (results carry `ip4`/`ip6`).
    V0_2_0,
    /// 0.3.0 (results carry `interfaces` and `ips` with `version`).
    V0_3_0,
    /// 0.3.1.
    V0_3_1,
    /// 0.4.0 (the default conflist's version; adds CHECK).
    V0_4_0,
    /// 1.0.0 (`ips` lose `version`).
    V1_0_0,
    /// 1.1.0 (adds STATUS, GC).
    V1_1_0,
}

/// Every version we accept, oldest first (the VERSION answer; the library's `version.All`).
pub const SUPPORTED_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The shape family of a result in a given version (the library's `types/020`, `040`, `100`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultShape {
    /// 0.1.0, 0.2.0: `ip4`, `ip6`, `dns`.
    V02,
    /// 0.3.0 - 0.4.0: `interfaces`, `ips` (with `version`), `routes`, `dns`.
    V04,
    /// 1.0.0, 1.1.0: as 0.4 without `ips[].version`; empty `dns` omitted.
    V1,
}

impl CniVersion {
    /// The newest version.
    pub const LATEST: Self = Self::V1_1_0;

    /// Parses a version string; `None` if unsupported. The empty string is 0.1.0, as the CNI
    /// library decodes a configuration without `cniVersion`.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "0.1.0" => Some(Self::V0_1_0),
            "0.2.0" => Some(Self::V0_2_0),
            "0.3.0" => Some(Self::V0_3_0),
            "0.3.1" => Some(Self::V0_3_1),
            "0.4.0" => Some(Self::V0_4_0),
            "1.0.0" => Some(Self::V1_0_0),
            "1.1.0" => Some(Self::V1_1_0),
            _ => None,
        }
    }

    /// The version string.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V0_1_0 => "0.1.0",
            Self::V0_2_0 => "0.2.0",
            Self::V0_3_0 => "0.3.0",
            Self::V0_3_1 => "0.3.1",
            Self::V0_4_0 => "0.4.0",
            Self::V1_0_0 => "1.0.0",
            Self::V1_1_0 => "1.1.0",
        }
    }

    /// The result shape of this version.
    #[must_use]
    pub fn result_shape(self) -> ResultShape {
        match self {
            Self::V0_1_0 | Self::V0_2_0 => ResultShape::V02,
            Self::V0_3_0 | Self::V0_3_1 | Self::V0_4_0 => ResultShape::V04,
            Self::V1_0_0 | Self::V1_1_0 => ResultShape::V1,
        }
    }

    /// Whether a configuration of this version allows `command`, by the library's rules
    /// (skel): CHECK from 0.4.0, STATUS and GC from 1.1.0, the rest always.
    #[must_use]
    pub fn allows(self, command: super::Command) -> bool {
        match command {
            super::Command::Check => self >= Self::V0_4_0,
            super::Command::Status | super::Command::Gc => self >= Self::V1_1_0,
            super::Command::Add | super::Command::Del | super::Command::Version => true,
        }
    }
}

/// Security-groups-for-pods enforcing mode (`podSGEnforcingMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SgEnforcingMode {
    /// `strict` (the default).
    #[default]
    Strict,
    /// `standard`.
    Standard,
}

/// Plugin log level (`pluginLogLevel`, spelt `Debug`/`Info`/`Warn`/`Error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogLevel {
    /// Debug.
    Debug,
    /// Info.
    Info,
    /// Warn.
    #[default]
    Warn,
    /// Error.
    Error,
}

/// Why the configuration is refused.
#[derive(Debug, thiserror::Error)]
pub enum NetConfError {
    /// Not JSON, or a field has the wrong JSON type (CNI code 6).
    #[error("decode network config")]
    Decode(#[source] serde_json::Error),
    /// `cniVersion` is not one we speak (CNI code 1).
    #[error(
        "cniVersion {0:?} is not supported (supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)"
    )]
    UnsupportedVersion(String),
    /// `name` is missing or empty.
    #[error("name is required")]
    MissingName,
    /// `mtu` is not a number in range.
    #[error("mtu {0:?} must be a number in {MIN_MTU_V4}..={MAX_MTU}")]
    Mtu(String),
    /// `vethPrefix` is invalid.
    #[error(transparent)]
    VethPrefix(#[from] VethPrefixError),
    /// `podSGEnforcingMode` is not `strict` or `standard`.
    #[error("podSGEnforcingMode {0:?} must be strict or standard")]
    SgMode(String),
    /// `pluginLogLevel` is not a known level.
    #[error("pluginLogLevel {0:?} must be one of Debug, Info, Warn, Error")]
    LogLevel(String),
    /// `prevResult` does not have the shape of a CNI result.
    #[error("prevResult is malformed")]
    PrevResult(#[source] serde_json::Error),
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// Requested version; answers use it.
    pub cni_version: CniVersion,
    /// Network name (part of ipamd's allocation key).
    pub name: String,
    /// Host veth name prefix.
    pub veth_prefix: String,
    /// Pod MTU.
    pub mtu: u32,
    /// Where JSON log lines go (`pluginLogFile`; empty or absent: stderr).
    pub plugin_log_file: LogSink,
    /// Log level.
    pub plugin_log_level: LogLevel,
    /// SGP enforcing mode.
    pub pod_sg_enforcing_mode: SgEnforcingMode,
    /// ipamd's gRPC unix socket.
    pub ipamd_socket: PathBuf,
    /// The network-policy agent's gRPC unix socket (ours; default
    /// [`ipamd_proto::DEFAULT_NPA_SOCKET_PATH`]).
    pub npa_socket: PathBuf,
    /// Pod annotations from the `io.kubernetes.cri.pod-annotations` capability.
    pub pod_annotations: BTreeMap<String, String>,
    /// The previous result (DEL, CHECK), if any.
    pub prev_result: Option<PrevResult>,
    /// `cni.dev/valid-attachments` (GC), if given.
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// Where the plugin's log lines go: the process's stderr for an empty value or `stderr`, stdout for
/// `stdout` (any case), and a rotated file otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogSink {
    /// A JSON-lines file, rotated.
    File(PathBuf),
    /// The plugin's stderr.
    Stderr,
    /// The plugin's stdout, before the result: a runtime then cannot parse an ADD result (ipamd's
    /// configuration refuses `AWS_VPC_K8S_PLUGIN_LOG_FILE=stdout` for that reason).
    Stdout,
}

impl LogSink {
    /// The sink a `pluginLogFile` value names: stderr for an empty value.
    #[must_use]
    pub fn parse(setting: &str) -> Self {
        if setting.is_empty() || setting.eq_ignore_ascii_case("stderr") {
            Self::Stderr
        } else if setting.eq_ignore_ascii_case("stdout") {
            Self::Stdout
        } else {
            Self::File(PathBuf::from(setting))
        }
    }
}

/// One entry of `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Attachment {
    /// Container id.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    cni_version: Option<String>,
    name: Option<String>,
    veth_prefix: Option<String>,
    mtu: Option<MtuWire>,
    plugin_log_file: Option<String>,
    plugin_log_level: Option<String>,
    #[serde(rename = "podSGEnforcingMode")]
    pod_sg_enforcing_mode: Option<String>,
    ipamd_socket: Option<String>,
    npa_socket: Option<String>,
    runtime_config: Option<RuntimeConfig>,
    prev_result: Option<serde_json::Value>,
    #[serde(rename = "cni.dev/valid-attachments")]
    valid_attachments: Option<Vec<Attachment>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum MtuWire {
    Number(serde_json::Number),
    Text(String),
}

#[derive(Deserialize)]
struct RuntimeConfig {
    #[serde(rename = "io.kubernetes.cri.pod-annotations")]
    pod_annotations: Option<BTreeMap<String, String>>,
}

/// Only the version, for answering errors in the caller's version even when the rest of the
/// configuration is broken.
#[must_use]
pub fn sniff_version(stdin: &[u8]) -> Option<CniVersion> {
    #[derive(Deserialize)]
    struct V {
        #[serde(rename = "cniVersion", default)]
        v: String,
    }
    serde_json::from_slice::<V>(stdin)
        .ok()
        .and_then(|v| CniVersion::parse(&v.v))
}

impl NetConf {
    /// Parses and validates stdin.
    pub fn parse(stdin: &[u8]) -> Result<Self, NetConfError> {
        let wire: Wire = serde_json::from_slice(stdin).map_err(NetConfError::Decode)?;
        let version = wire.cni_version.unwrap_or_default();
        let cni_version =
            CniVersion::parse(&version).ok_or(NetConfError::UnsupportedVersion(version))?;
        let name = wire
            .name
            .filter(|n| !n.is_empty())
            .ok_or(NetConfError::MissingName)?;
        let veth_prefix = wire
            .veth_prefix
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| DEFAULT_VETH_PREFIX.to_owned());
        validate_veth_prefix(&veth_prefix)?;
        let mtu = match wire.mtu {
            None => DEFAULT_MTU,
            Some(MtuWire::Text(t)) if t.trim().is_empty() => DEFAULT_MTU,
            Some(MtuWire::Text(t)) => t.trim().parse().map_err(|_| NetConfError::Mtu(t))?,
            Some(MtuWire::Number(n)) => n
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| NetConfError::Mtu(n.to_string()))?,
        };
        if !(MIN_MTU_V4..=MAX_MTU).contains(&mtu) {
            return Err(NetConfError::Mtu(mtu.to_string()));
        }
        let plugin_log_level = match wire.plugin_log_level.as_deref() {
            None | Some("") => LogLevel::default(),
            Some(l) => match l.to_ascii_lowercase().as_str() {
                "debug" | "trace" => LogLevel::Debug,
                "info" => LogLevel::Info,
                "warn" | "warning" => LogLevel::Warn,
                "error" => LogLevel::Error,
                _ => return Err(NetConfError::LogLevel(l.to_owned())),
            },
        };
        let pod_sg_enforcing_mode = match wire.pod_sg_enforcing_mode.as_deref() {
            None | Some("") | Some("strict") => SgEnforcingMode::Strict,
            Some("standard") => SgEnforcingMode::Standard,
            Some(other) => return Err(NetConfError::SgMode(other.to_owned())),
        };
        let prev_result = match wire.prev_result {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => {
                Some(PrevResult::from_versioned(v, cni_version).map_err(NetConfError::PrevResult)?)
            }
        };
        Ok(Self {
            cni_version,
            name,
            veth_prefix,
            mtu,
            plugin_log_file: LogSink::parse(wire.plugin_log_file.as_deref().unwrap_or("")),
            plugin_log_level,
            pod_sg_enforcing_mode,
            ipamd_socket: wire.ipamd_socket.filter(|s| !s.is_empty()).map_or_else(
                || PathBuf::from(ipamd_proto::DEFAULT_SOCKET_PATH),
                PathBuf::from,
            ),
            npa_socket: wire.npa_socket.filter(|s| !s.is_empty()).map_or_else(
                || PathBuf::from(ipamd_proto::DEFAULT_NPA_SOCKET_PATH),
                PathBuf::from,
            ),
            pod_annotations: wire
                .runtime_config
                .and_then(|r| r.pod_annotations)
                .unwrap_or_default(),
            prev_result,
            valid_attachments: wire.valid_attachments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_conflist_entry_parses() {
        let conf = NetConf::parse(
            br#"{"cniVersion":"0.4.0","name":"aws-cni","type":"aws-cni","vethPrefix":"eni",
                "mtu":"9001","podSGEnforcingMode":"strict","pluginLogFile":"/var/log/aws-routed-eni/plugin.log",
                "pluginLogLevel":"DEBUG","capabilities":{"io.kubernetes.cri.pod-annotations":true},
                "runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"a":"b"}}}"#,
        )
        .unwrap();
        assert_eq!(conf.cni_version, CniVersion::V0_4_0);
        assert_eq!(conf.mtu, 9001);
        assert_eq!(conf.plugin_log_level, LogLevel::Debug);
        assert_eq!(conf.pod_annotations.get("a").map(String::as_str), Some("b"));
        assert_eq!(
            conf.ipamd_socket,
            PathBuf::from(ipamd_proto::DEFAULT_SOCKET_PATH)
        );
        // upstream's npaSocketPath
        assert_eq!(conf.npa_socket, PathBuf::from("/var/run/aws-node/npa.sock"));
    }

    /// Every version of the CNI library's `version.All` (containernetworking/cni v1.3.0,
    /// pkg/version/version.go; upstream's plugins pass it to skel.PluginMain in
    /// cmd/routed-eni-cni-plugin/cni.go and cmd/egress-cni-plugin/main.go) is accepted, a
    /// missing cniVersion is 0.1.0 (pkg/types/create/create.go DecodeVersion), and the verbs
    /// each allows follow pkg/skel/skel.go (CHECK >= 0.4.0, STATUS/GC >= 1.1.0).
    #[test]
    fn versions_accepted_and_verbs_allowed_as_the_library() {
        use super::super::Command::{Add, Check, Del, Gc, Status};
        // (cniVersion, parsed, CHECK, STATUS/GC)
        let table = [
            (None, Some(CniVersion::V0_1_0), false, false),
            (Some("0.1.0"), Some(CniVersion::V0_1_0), false, false),
            (Some("0.2.0"), Some(CniVersion::V0_2_0), false, false),
            (Some("0.3.0"), Some(CniVersion::V0_3_0), false, false),
            (Some("0.3.1"), Some(CniVersion::V0_3_1), false, false),
            (Some("0.4.0"), Some(CniVersion::V0_4_0), true, false),
            (Some("1.0.0"), Some(CniVersion::V1_0_0), true, false),
            (Some("1.1.0"), Some(CniVersion::V1_1_0), true, true),
            (Some("1.2.0"), None, false, false),
            (Some("0.5.0"), None, false, false),
            (Some("v1.0.0"), None, false, false),
        ];
        for (version, want, check, status_gc) in table {
            let stdin = match version {
                Some(v) => format!(r#"{{"cniVersion":"{v}","name":"aws-cni"}}"#),
                None => r#"{"name":"aws-cni"}"#.to_owned(),
            };
            let got = NetConf::parse(stdin.as_bytes());
            match want {
                None => assert!(
                    matches!(got, Err(NetConfError::UnsupportedVersion(_))),
                    "{version:?}"
                ),
                Some(want) => {
                    let conf = got.unwrap();
                    assert_eq!(conf.cni_version, want);
                    assert_eq!(sniff_version(stdin.as_bytes()), Some(want));
                    assert!(want.allows(Add) && want.allows(Del));
                    assert_eq!(want.allows(Check), check, "{version:?}");
                    assert_eq!(want.allows(Status), status_gc, "{version:?}");
                    assert_eq!(want.allows(Gc), status_gc, "{version:?}");
                    assert!(SUPPORTED_VERSIONS.contains(&want.as_str()));
                }
            }
        }
        assert_eq!(
            SUPPORTED_VERSIONS,
            [
                "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"
            ]
        );
    }

    #[test]
    fn v02_prev_result_parses() {
        let conf = NetConf::parse(
            br#"{"cniVersion":"0.2.0","name":"n","prevResult":{"cniVersion":"0.2.0",
                "ip4":{"ip":"198.18.0.5/32","gateway":"169.254.1.1"},"dns":{}}}"#,
        )
        .unwrap();
        let prev = conf.prev_result.unwrap();
        assert_eq!(prev.ips[0].address.to_string(), "198.18.0.5/32");
        assert!(prev.interfaces.is_empty());
    }

    #[test]
    fn defaults_and_numeric_mtu() {
        let conf = NetConf::parse(
            br#"{"cniVersion":"1.1.0","name":"n","mtu":1500,"ipamdSocket":"/tmp/s","npaSocket":"/tmp/n"}"#,
        )
        .unwrap();
        assert_eq!(conf.mtu, 1500);
        assert_eq!(conf.veth_prefix, "eni");
        assert_eq!(conf.ipamd_socket, PathBuf::from("/tmp/s"));
        assert_eq!(conf.npa_socket, PathBuf::from("/tmp/n"));
        assert_eq!(conf.pod_sg_enforcing_mode, SgEnforcingMode::Strict);
    }

    #[test]
    fn refusals() {
        let bad = |s: &str| NetConf::parse(s.as_bytes()).unwrap_err();
        assert!(matches!(bad("{"), NetConfError::Decode(_)));
        assert!(matches!(
            bad(r#"{"cniVersion":"0.5.0","name":"n"}"#),
            NetConfError::UnsupportedVersion(_)
        ));
        assert!(matches!(
            bad(r#"{"cniVersion":"1.1","name":"n"}"#),
            NetConfError::UnsupportedVersion(_)
        ));
        assert!(matches!(
            bad(r#"{"cniVersion":"1.0.0"}"#),
            NetConfError::MissingName
        ));
        assert!(matches!(
            bad(r#"{"cniVersion":"1.0.0","name":"n","mtu":"big"}"#),
            NetConfError::Mtu(_)
        ));
        assert!(matches!(
            bad(r#"{"cniVersion":"1.0.0","name":"n","mtu":100}"#),
            NetConfError::Mtu(_)
        ));
        assert!(matches!(
            bad(r#"{"cniVersion":"1.0.0","name":"n","vethPrefix":"eth"}"#),
            NetConfError::VethPrefix(_)
        ));
        assert!(matches!(
            bad(r#"{"cniVersion":"1.0.0","name":"n","podSGEnforcingMode":"x"}"#),
            NetConfError::SgMode(_)
        ));
        assert!(matches!(
            bad(r#"{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":"x"}}"#),
            NetConfError::PrevResult(_)
        ));
    }
}
