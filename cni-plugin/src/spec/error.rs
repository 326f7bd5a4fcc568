//! The CNI error object (spec "Error" section): well-known codes, the plugin's own codes
//! (100+), and its JSON shape. Every failure of the plugin is translated into one of these
//! exactly once, at the command boundary. Must not: know the plugin's domain errors (the
//! commands translate them).

use serde::Serialize;

/// A CNI error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 1: the requested `cniVersion` is not supported.
    IncompatibleVersion,
    /// 2: a field of the network configuration is not supported.
    UnsupportedField,
    /// 3: the container (its netns) is unknown or does not exist.
    UnknownContainer,
    /// 4: a required `CNI_*` environment variable is missing or invalid.
    InvalidEnvironment,
    /// 5: I/O failure.
    Io,
    /// 6: stdin could not be decoded.
    Decode,
    /// 7: the network configuration is invalid.
    InvalidNetworkConfig,
    /// 11: transient failure (ipamd unreachable or not ready); the runtime should retry.
    TryAgainLater,
    /// 50: the plugin cannot serve requests (STATUS: ipamd down).
    PluginNotAvailable,
    /// 100: wiring the pod network failed (the address was given back).
    SetupFailed,
    /// 101: ipamd refused the request.
    IpamdRefused,
    /// 102: CHECK found the live wiring differs from prevResult.
    Drift,
    /// 103: ipamd answered with an allocation this plugin cannot wire.
    UnsupportedAllocation,
    /// 104: the network-policy agent answered that it could not enforce the pod's policy
    /// (ADD undid the wiring and released the address).
    PolicyNotEnforced,
}

impl ErrorCode {
    /// The numeric code.
    #[must_use]
    pub fn code(self) -> u32 {
        match self {
            Self::IncompatibleVersion => 1,
            Self::UnsupportedField => 2,
            Self::UnknownContainer => 3,
            Self::InvalidEnvironment => 4,
            Self::Io => 5,
            Self::Decode => 6,
            Self::InvalidNetworkConfig => 7,
            Self::TryAgainLater => 11,
            Self::PluginNotAvailable => 50,
            Self::SetupFailed => 100,
            Self::IpamdRefused => 101,
            Self::Drift => 102,
            Self::UnsupportedAllocation => 103,
            Self::PolicyNotEnforced => 104,
        }
    }
}

/// A CNI error ready to be written to stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// Code.
    pub code: ErrorCode,
    /// Short message.
    pub msg: String,
    /// Full cause chain.
    pub details: String,
}

impl SpecError {
    /// An error whose details are the `source` chain of `err`.
    pub fn new(code: ErrorCode, msg: impl Into<String>, err: &dyn std::error::Error) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: chain(err),
        }
    }

    /// An error with only a message.
    pub fn msg(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// The JSON object (`cniVersion`, `code`, `msg`, `details`).
    #[must_use]
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        serde_json::to_string(&Wire {
            cni_version,
            code: self.code.code(),
            msg: &self.msg,
            details: &self.details,
        })
        .unwrap_or_else(|_| format!("{{\"code\":{}}}", self.code.code()))
    }
}

/// `err: cause: cause...`
#[must_use]
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        // Some libraries already print their source in Display; do not repeat it.
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = e.source();
    }
    s
}
