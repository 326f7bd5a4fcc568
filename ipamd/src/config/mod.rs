//! ipamd configuration: every environment variable upstream's ipamd reads (reference §1.1), plus
//! our own knobs, parsed ONCE into a typed, validated [`Config`] with upstream's defaults.
//! Nothing else in the crate reads the environment. Must not: do I/O, touch the network, log.
//!
//! [`Config`] is one section per concern, each with its own parser and tests: [`pool`]
//! (warm targets, prefix delegation, pool timings), [`snat`], [`http`] (introspection and
//! metrics), [`aws`] (EC2/IMDS), [`kube`] (Kubernetes, custom networking, pod security
//! groups), [`logging`], [`node`] (host set-up and state). This file holds what crosses
//! sections: the address family rules and the error/warning types. Parsing takes an injected
//! map (`Config::from_env_map`) so tests never touch process env; single values are read the
//! way upstream's Go code reads them (`env`). A setting this ipamd does not implement is
//! refused when running without it would misplace pods, and otherwise accepted with an
//! `Unimplemented` warning; never silently (docs/compatibility.md lists them).

use std::collections::HashMap;

pub mod aws;
mod env;
pub mod http;
pub mod kube;
pub mod logging;
pub mod node;
pub mod pool;
pub mod snat;

#[cfg(feature = "memory-provider")]
pub use aws::MemoryProviderSpec;
pub use aws::{AwsSection, ProviderKind};
pub use http::{BindAddress, DEFAULT_INTROSPECTION_BIND, HttpSection, MetricsNaming};
pub use kube::{
    DEFAULT_ENI_CONFIG_KEY, DEFAULT_POD_NAMESPACE, EniConfigKeys, KubeSection, KubeSettings,
    KubeSource, SERVICE_ACCOUNT_DIR,
};
pub use logging::{DEFAULT_LOG_FILE, LogLevel, LogSection, LogTarget};
pub use node::{DEFAULT_BACKING_STORE, NetworkPolicyMode, NodeSection};
pub use pool::PoolSection;
pub use snat::{DEFAULT_CONNMARK, RandomizeSnat, SnatSection};

use env::{Env, err};

/// A value that could not be accepted. Names the variable and the accepted values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {var}={value:?}: expected {expected}")]
pub struct ConfigError {
    /// The environment variable.
    pub var: &'static str,
    /// The value as given.
    pub value: String,
    /// What would have been accepted.
    pub expected: &'static str,
}

/// A value ipamd did not take as given, or a setting it does not implement: logged loudly at
/// start and exported as `awscni_config_warning{variable,kind}`. Upstream tolerates these values
/// (it logs and falls back); refusing them would crash-loop a node where upstream runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    /// The environment variable.
    pub var: &'static str,
    /// The value as given.
    pub value: String,
    /// What happens instead.
    pub effect: String,
    /// Why.
    pub kind: WarningKind,
}

/// Why a [`ConfigWarning`] was raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarningKind {
    /// Not a valid value: upstream's fallback is used.
    Fallback,
    /// A feature this ipamd does not implement: the setting has no effect.
    Unimplemented,
}

impl WarningKind {
    /// The metric label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fallback => "fallback",
            Self::Unimplemented => "unimplemented",
        }
    }
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            WarningKind::Fallback => {
                write!(
                    f,
                    "{}={:?} is not valid; {}",
                    self.var, self.value, self.effect
                )
            }
            WarningKind::Unimplemented => {
                write!(f, "{}={:?}: {}", self.var, self.value, self.effect)
            }
        }
    }
}

/// The whole ipamd configuration, one section per concern. Field docs in each section name
/// the variable; defaults are upstream's code defaults unless stated.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Warm targets, prefix delegation, caps and pool timings.
    pub pool: PoolSection,
    /// SNAT, connmark, node-port support.
    pub snat: SnatSection,
    /// Introspection and metrics endpoints.
    pub http: HttpSection,
    /// EC2/IMDS: provider, endpoint, tags, provisioning.
    pub aws: AwsSection,
    /// The Kubernetes API and what ipamd does with it.
    pub kube: KubeSection,
    /// ipamd's own log.
    pub log: LogSection,
    /// Host set-up and state: MTU, veth prefix, checkpoint, socket, network policy mode.
    pub node: NodeSection,
    /// What parsing had to say: values replaced by upstream's fallback, settings without
    /// effect. The composition root logs them and exports them as a metric.
    pub warnings: Vec<ConfigWarning>,
}

impl Config {
    /// Reads the real process environment. Only `main` calls this.
    #[must_use]
    pub fn process_env() -> HashMap<String, String> {
        std::env::vars().collect()
    }

    /// Parses and validates. The only way to build a `Config` from the environment.
    ///
    /// Where upstream falls back on a bad value (booleans, warm targets, `MAX_ENI`, SNAT
    /// randomisation, connmark, CIDR lists, the pod SG mode while pod ENIs are off) the same
    /// fallback is used and a [`ConfigWarning`] returned; where upstream's entrypoint or ipamd
    /// refuses to start (veth prefix, MTU, cooldown, PD without targets, an unknown network
    /// policy mode) the value is refused. Features this ipamd does not implement are refused
    /// when running without them would be unsafe (pods in the wrong subnet or without their
    /// security groups, an IPv6 node), and warned about otherwise.
    pub fn from_env_map(map: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut e = Env {
            map,
            warnings: Vec::new(),
        };
        let pool = PoolSection::parse(&mut e)?;
        let kube = KubeSection::parse(&mut e)?;
        family(&mut e, &pool, &kube)?;
        pool.check_targets(&e)?;
        let snat = SnatSection::parse(&mut e);
        let node = NodeSection::parse(&mut e)?;
        let log = LogSection::parse(&mut e);
        let http = HttpSection::parse(&mut e)?;
        let aws = AwsSection::parse(&mut e)?;
        Ok(Self {
            pool,
            snat,
            http,
            aws,
            kube,
            log,
            node,
            warnings: e.warnings,
        })
    }
}

/// `ENABLE_IPv4`/`ENABLE_IPv6`: exactly one family (upstream's entrypoint); IPv6 needs prefix
/// delegation and no custom networking (upstream), and is refused here because this ipamd does
/// not implement IPv6 mode yet. Nothing is kept: an accepted config is IPv4.
fn family(e: &mut Env<'_>, pool: &PoolSection, kube: &KubeSection) -> Result<(), ConfigError> {
    let enable_ipv4 = e.bool("ENABLE_IPv4", false);
    let enable_ipv6 = e.bool("ENABLE_IPv6", false);
    if enable_ipv4 && enable_ipv6 {
        return Err(err(
            "ENABLE_IPv6",
            "true",
            "false while ENABLE_IPv4=true (dual stack is not supported)",
        ));
    }
    if !enable_ipv4 && !enable_ipv6 {
        return Err(err(
            "ENABLE_IPv4",
            e.get("ENABLE_IPv4").unwrap_or(""),
            "true (or ENABLE_IPv6=true)",
        ));
    }
    if enable_ipv6 && !pool.enable_prefix_delegation {
        return Err(err(
            "ENABLE_PREFIX_DELEGATION",
            e.get("ENABLE_PREFIX_DELEGATION").unwrap_or(""),
            "true when ENABLE_IPv6=true",
        ));
    }
    if enable_ipv6 && kube.custom_network_cfg {
        return Err(err(
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG",
            "true",
            "false when ENABLE_IPv6=true",
        ));
    }
    if enable_ipv6 {
        // Upstream's IPv6 mode (/80 prefixes, no warm pool) is not implemented yet: refuse
        // rather than run the IPv4 datastore on an IPv6 node.
        return Err(err(
            "ENABLE_IPv6",
            "true",
            "false (IPv6 mode is not implemented yet)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
