//! The node section: what ipamd sets up on its own host and where it keeps state — ENI MTU, host
//! veth prefix, checkpoint, CNI socket, the network policy mode handed to the plugin
//! (`AWS_VPC_ENI_MTU`, `AWS_VPC_K8S_CNI_VETHPREFIX`, `AWS_VPC_K8S_CNI_BACKING_STORE`,
//! `NETWORK_POLICY_ENFORCING_MODE`, ours `IPAMD_SOCKET_PATH`, `IPAMD_RELEASE_CODE_PAGES`, `IPAMD_READ_CODE_ON_DEMAND`), and the checks the aws-node start-up
//! makes on the plugin's settings before ipamd serves (`POD_MTU`, `AWS_VPC_K8S_PLUGIN_LOG_FILE`).
//! Must not: touch the host.

use std::path::PathBuf;

use super::ConfigError;
use super::env::{Env, err};

/// The default checkpoint path (where existing nodes keep it).
pub const DEFAULT_BACKING_STORE: &str = "/var/run/aws-node/ipam.json";

/// `NETWORK_POLICY_ENFORCING_MODE`: validated case-insensitively and passed to the plugin exactly
/// as given (the raw value is what replies carry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicyMode(String);

impl NetworkPolicyMode {
    /// The wire string put in Add/Del replies (the value as configured).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The node's own set-up and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSection {
    /// `AWS_VPC_ENI_MTU` (9001).
    pub eni_mtu: u32,
    /// `AWS_VPC_K8S_CNI_VETHPREFIX` (eni).
    pub veth_prefix: String,
    /// `AWS_VPC_K8S_CNI_BACKING_STORE` ([`DEFAULT_BACKING_STORE`]).
    pub backing_store: PathBuf,
    /// Ours: `IPAMD_SOCKET_PATH` (default [`ipamd_proto::DEFAULT_SOCKET_PATH`]).
    pub socket_path: PathBuf,
    /// `NETWORK_POLICY_ENFORCING_MODE` (unset = no NP calls).
    pub network_policy_mode: Option<NetworkPolicyMode>,
    /// `ENABLE_V6_EGRESS` (false): egress-cni gives IPv4 pods IPv6 egress; ipamd then blocks
    /// forwarding to `fd00::ac:00/118`.
    pub enable_v6_egress: bool,
    /// Ours: `IPAMD_RELEASE_CODE_PAGES` (true): once start-up is over and after every burst that
    /// mapped more code, unmap the code pages that ran (the `residency` module); false keeps
    /// them mapped.
    pub release_code_pages: bool,
    /// Ours: `IPAMD_READ_CODE_ON_DEMAND` (true; only with `IPAMD_RELEASE_CODE_PAGES`): after
    /// start-up's release, code pages are read one by one as they are touched and the binary's
    /// unmapped pages leave the page cache, so only touched pages become resident
    /// (`residency::read_on_demand`); false keeps readahead and the cached file as they are.
    pub read_code_on_demand: bool,
}

impl NodeSection {
    /// Reads the section; refuses what must stop the start (MTU, veth prefix, network policy mode,
    /// the plugin log on stdout). `v6`: pods get IPv6 addresses (`ENABLE_IPv6`, or dual-stack
    /// pods), so both MTUs must be at least IPv6's minimum.
    pub(super) fn parse(e: &mut Env<'_>, v6: bool) -> Result<Self, ConfigError> {
        use dataplane::conventions as dp;
        // The plugin log on stdout is refused: the plugin's stdout carries its CNI result (exactly
        // "stdout").
        if e.map.get("AWS_VPC_K8S_PLUGIN_LOG_FILE").map(String::as_str) == Some("stdout") {
            return Err(err(
                "AWS_VPC_K8S_PLUGIN_LOG_FILE",
                "stdout",
                "a file path or stderr (\"AWS_VPC_K8S_PLUGIN_LOG_FILE cannot be set to stdout\": the plugin's stdout carries its CNI result)",
            ));
        }
        // A bad MTU is refused, for the ENIs and the pods.
        let eni_mtu = entrypoint_mtu(e, Mtu::Eni, v6)?.unwrap_or(dp::DEFAULT_MTU);
        entrypoint_mtu(e, Mtu::Pod, v6)?;
        // A prefix over 4 characters or a reserved one is refused.
        let veth_prefix = e.string("AWS_VPC_K8S_CNI_VETHPREFIX", dp::DEFAULT_VETH_PREFIX);
        dp::validate_veth_prefix(&veth_prefix).map_err(|_| {
            err(
                "AWS_VPC_K8S_CNI_VETHPREFIX",
                &veth_prefix,
                "1-4 characters of [A-Za-z0-9_-], not eth, vlan or lo",
            )
        })?;
        // Case-insensitive check, an invalid mode fails ipamd's start; the value itself is passed
        // on unchanged.
        let network_policy_mode = match e.get("NETWORK_POLICY_ENFORCING_MODE") {
            None => None,
            Some(v)
                if ["none", "strict", "standard"]
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(v)) =>
            {
                Some(NetworkPolicyMode(v.to_owned()))
            }
            Some(v) => {
                return Err(err(
                    "NETWORK_POLICY_ENFORCING_MODE",
                    v,
                    "none, strict or standard",
                ));
            }
        };
        Ok(Self {
            eni_mtu,
            veth_prefix,
            backing_store: PathBuf::from(
                e.string("AWS_VPC_K8S_CNI_BACKING_STORE", DEFAULT_BACKING_STORE),
            ),
            socket_path: PathBuf::from(
                e.string("IPAMD_SOCKET_PATH", ipamd_proto::DEFAULT_SOCKET_PATH),
            ),
            network_policy_mode,
            enable_v6_egress: e.bool("ENABLE_V6_EGRESS", false),
            release_code_pages: e.bool("IPAMD_RELEASE_CODE_PAGES", true),
            read_code_on_demand: e.bool("IPAMD_READ_CODE_ON_DEMAND", true),
        })
    }
}

/// The two MTUs checked at start.
#[derive(Clone, Copy)]
enum Mtu {
    /// `AWS_VPC_ENI_MTU`.
    Eni,
    /// `POD_MTU` (the conflist's `mtu`; `aws-cni-conflist` writes it, ipamd only checks it).
    Pod,
}

/// A set value (even "") must be an integer as Go's `strconv.Atoi` reads it, 576..=9001, or
/// 1280..=9001 when pods get IPv6. The refusal quotes the log line operators know.
fn entrypoint_mtu(e: &Env<'_>, which: Mtu, v6: bool) -> Result<Option<u32>, ConfigError> {
    use dataplane::conventions as dp;
    let (var, not_int, v4_range, v6_range) = match which {
        Mtu::Eni => (
            "AWS_VPC_ENI_MTU",
            "an integer (\"AWS_VPC_ENI_MTU MUST be a valid integer\")",
            "576-9001 (\"AWS_VPC_ENI_MTU cannot be less than 576 or greater than 9001 in IPv4\")",
            "1280-9001 (\"AWS_VPC_ENI_MTU cannot be less than 1280 or greater than 9001 in IPv6\")",
        ),
        Mtu::Pod => (
            "POD_MTU",
            "an integer (\"POD_MTU MUST be a valid integer\")",
            "576-9001 (\"POD_MTU cannot be less than 576 or greater than 9001 in IPv4\")",
            "1280-9001 (\"POD_MTU cannot be less than 1280 or greater than 9001 in IPv6\")",
        ),
    };
    let Some(raw) = e.map.get(var) else {
        return Ok(None);
    };
    // Go's Atoi: optional sign, decimal digits, nothing else (no blanks, no "_").
    let n: i64 = raw.parse().map_err(|_| err(var, raw, not_int))?;
    let (min, expected) = if v6 {
        (dp::MIN_MTU_V6, v6_range)
    } else {
        (dp::MIN_MTU_V4, v4_range)
    };
    u32::try_from(n)
        .ok()
        .filter(|m| (min..=dp::MAX_MTU).contains(m))
        .map(Some)
        .ok_or_else(|| err(var, raw, expected))
}

#[cfg(test)]
mod tests {
    use super::super::env::test_env;
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<NodeSection, ConfigError> {
        test_env(pairs, |e| NodeSection::parse(e, false))
    }

    #[test]
    fn defaults_are_upstreams() {
        let n = parse(&[]).unwrap();
        assert_eq!((n.eni_mtu, n.veth_prefix.as_str()), (9001, "eni"));
        assert_eq!(n.backing_store, PathBuf::from(DEFAULT_BACKING_STORE));
        assert_eq!(n.socket_path, PathBuf::from("/var/run/aws-node/ipamd.sock"));
        assert_eq!(n.network_policy_mode, None);
    }

    #[test]
    fn network_policy_mode_is_case_insensitive_and_passed_as_given() {
        let n = parse(&[("NETWORK_POLICY_ENFORCING_MODE", "Strict")]).unwrap();
        assert_eq!(n.network_policy_mode.unwrap().as_str(), "Strict");
    }

    #[test]
    fn refusals_name_the_variable() {
        for (var, val) in [
            ("AWS_VPC_ENI_MTU", "100"),
            ("AWS_VPC_ENI_MTU", "9002"),
            ("AWS_VPC_K8S_CNI_VETHPREFIX", "lo"),
            ("NETWORK_POLICY_ENFORCING_MODE", "lax"),
        ] {
            assert_eq!(parse(&[(var, val)]).unwrap_err().var, var, "{var}={val}");
        }
        assert_eq!(parse(&[("AWS_VPC_ENI_MTU", "1500")]).unwrap().eni_mtu, 1500);
    }
}
