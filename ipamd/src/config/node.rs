//! The node section: what ipamd sets up on its own host and where it keeps state — ENI MTU,
//! host veth prefix, checkpoint, CNI socket, the network policy mode handed to the plugin
//! (`AWS_VPC_ENI_MTU`, `AWS_VPC_K8S_CNI_VETHPREFIX`, `AWS_VPC_K8S_CNI_BACKING_STORE`,
//! `NETWORK_POLICY_ENFORCING_MODE`, ours `IPAMD_SOCKET_PATH`). Must not: touch the host.

use std::path::PathBuf;

use super::ConfigError;
use super::env::{Env, err};

/// Upstream's default checkpoint path.
pub const DEFAULT_BACKING_STORE: &str = "/var/run/aws-node/ipam.json";

/// `NETWORK_POLICY_ENFORCING_MODE`: validated case-insensitively, as upstream
/// (`IsValidNetworkPolicyEnforcingMode`), and passed to the plugin exactly as given (upstream
/// replies with the raw value).
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
    /// forwarding to `fd00::ac:00/118` (upstream's `setupRuleToBlockNodeLocalAccess`).
    pub enable_v6_egress: bool,
}

impl NodeSection {
    /// Reads the section; refuses what upstream's entrypoint or ipamd refuses (MTU, veth
    /// prefix, network policy mode).
    pub(super) fn parse(e: &mut Env<'_>) -> Result<Self, ConfigError> {
        use dataplane::conventions as dp;
        // upstream's entrypoint (validateMTU) refuses a bad MTU.
        let eni_mtu = match e.strict_int("AWS_VPC_ENI_MTU")? {
            None => dp::DEFAULT_MTU,
            Some(n) => u32::try_from(n)
                .ok()
                .filter(|m| (dp::MIN_MTU_V4..=dp::MAX_MTU).contains(m))
                .ok_or_else(|| {
                    err(
                        "AWS_VPC_ENI_MTU",
                        &n.to_string(),
                        "576-9001 (IPv4) or 1280-9001 (IPv6)",
                    )
                })?,
        };
        // upstream's entrypoint refuses a prefix over 4 characters or a reserved one.
        let veth_prefix = e.string("AWS_VPC_K8S_CNI_VETHPREFIX", dp::DEFAULT_VETH_PREFIX);
        dp::validate_veth_prefix(&veth_prefix).map_err(|_| {
            err(
                "AWS_VPC_K8S_CNI_VETHPREFIX",
                &veth_prefix,
                "1-4 characters of [A-Za-z0-9_-], not eth, vlan or lo",
            )
        })?;
        // upstream getNetworkPolicyMode: case-insensitive check, an invalid mode fails ipamd's
        // start; the value itself is passed on unchanged.
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::env::test_env;
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<NodeSection, ConfigError> {
        test_env(pairs, NodeSection::parse)
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
