//! ipamd configuration: every environment variable existing aws-node manifests set (their names,
//! defaults and fallbacks), plus our own knobs, parsed ONCE into a typed, validated [`Config`].
//! Nothing else in the crate reads the environment. Must not: do I/O, touch the network, log.
//!
//! [`Config`] is one section per concern, each with its own parser and tests: [`pool`] (warm
//! targets, prefix delegation, pool timings), [`snat`], [`http`] (introspection and metrics),
//! [`aws`] (EC2/IMDS), [`kube`] (Kubernetes, custom networking, pod security groups), [`logging`],
//! [`node`] (host set-up and state). This file holds what crosses sections: the address family
//! rules and the error/warning types. Parsing takes an injected map (`Config::from_env_map`) so
//! tests never touch process env; single values are read with Go's parsing rules (`env`), which
//! existing manifests were written for. A setting this ipamd does not implement is refused when
//! running without it would misplace pods, and otherwise accepted with an `Unimplemented` warning;
//! never silently (docs/compatibility.md lists them).

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
    ConfigMapRef, DEFAULT_ENI_CONFIG_KEY, DEFAULT_POD_NAMESPACE, EniConfigKeys, KubeSection,
    KubeSettings, KubeSource, PodSgMode, SERVICE_ACCOUNT_DIR,
};
pub use logging::{DEFAULT_LOG_FILE, LogLevel, LogSection, LogTarget};
pub use node::{DEFAULT_BACKING_STORE, NetworkPolicyMode, NodeSection};
pub use pool::{PoolSection, WarmPoolPolicy};
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

/// A value ipamd did not take as given, or a setting it does not implement: logged loudly at start
/// and exported as `awscni_config_warning{variable,kind}`. These values are tolerated (logged, then
/// the fallback): refusing them would crash-loop nodes that run today.
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
    /// Not a valid value: the documented fallback is used.
    Fallback,
    /// A feature this ipamd does not implement: the setting has no effect.
    Unimplemented,
    /// Another setting replaces this one (e.g. `WARM_IP_TARGET` under
    /// `WARM_POOL_POLICY=adaptive`): it has no effect.
    Superseded,
}

impl WarningKind {
    /// The metric label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fallback => "fallback",
            Self::Unimplemented => "unimplemented",
            Self::Superseded => "superseded",
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
            WarningKind::Unimplemented | WarningKind::Superseded => {
                write!(f, "{}={:?}: {}", self.var, self.value, self.effect)
            }
        }
    }
}

/// The whole ipamd configuration, one section per concern. Field docs in each section name the
/// variable and its default (docs/compatibility.md says where one differs).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The pods' address family (`ENABLE_IPv4`, `ENABLE_IPv6`, our `ENABLE_DUAL_STACK_PODS`).
    pub family: AddressFamily,
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
    /// What parsing had to say: values replaced by their fallback, settings without effect. The
    /// composition root logs them and exports them as a metric.
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
    /// A bad value that has a fallback (booleans, warm targets, `MAX_ENI`, SNAT randomisation,
    /// connmark, CIDR lists, the pod SG mode while pod ENIs are off) gets it and a
    /// [`ConfigWarning`]; a value that must stop the start (veth prefix, MTU, cooldown, PD without
    /// targets, an unknown network policy mode) is refused. Features this ipamd does not implement
    /// are refused when running without them would be unsafe (pods in the wrong subnet or without
    /// their security groups), and warned about otherwise.
    pub fn from_env_map(map: &HashMap<String, String>) -> Result<Self, ConfigError> {
        let mut e = Env {
            map,
            warnings: Vec::new(),
        };
        let pool = PoolSection::parse(&mut e)?;
        let kube = KubeSection::parse(&mut e)?;
        let family = family(&mut e, &pool, &kube)?;
        pool.check_targets(&e)?;
        let snat = SnatSection::parse(&mut e);
        let node = NodeSection::parse(&mut e, family.has_v6())?;
        let log = LogSection::parse(&mut e);
        let http = HttpSection::parse(&mut e)?;
        let aws = AwsSection::parse(&mut e)?;
        Ok(Self {
            family,
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

/// The refusal's log line for an IPv6 node without PD or with custom networking.
macro_rules! v6_rule {
    () => {
        "\"IPv6 is supported only in Prefix Delegation mode. Custom Networking is not supported in IPv6 mode. Please set the env variables accordingly.\""
    };
}

/// The address family of pods (`ENABLE_IPv4`/`ENABLE_IPv6`, and our `ENABLE_DUAL_STACK_PODS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressFamily {
    /// `ENABLE_IPv4=true` (the default): IPv4 pods from the warm pool.
    V4,
    /// `ENABLE_IPv6=true`, `ENABLE_IPv4=false` (IPv6 mode): a /128 per pod from the primary ENI's
    /// /80 prefix, no warm pool, no SNAT.
    V6,
    /// Ours: IPv4 mode where every pod also gets a /128 from its ENI's /80
    /// (`ENABLE_DUAL_STACK_PODS=true` with `ENABLE_IPv4=true`, `ENABLE_IPv6=false`).
    DualStack,
}

impl AddressFamily {
    /// Pods get an IPv4 address (IPv4 and dual-stack modes).
    #[must_use]
    pub fn has_v4(self) -> bool {
        matches!(self, Self::V4 | Self::DualStack)
    }

    /// Pods get an IPv6 address (IPv6 and dual-stack modes).
    #[must_use]
    pub fn has_v6(self) -> bool {
        matches!(self, Self::V6 | Self::DualStack)
    }

    /// IPv6 mode (no warm pool, no SNAT).
    #[must_use]
    pub fn is_v6_only(self) -> bool {
        self == Self::V6
    }
}

/// Our opt-in for dual-stack pods.
pub const ENABLE_DUAL_STACK_PODS: &str = "ENABLE_DUAL_STACK_PODS";

/// `ENABLE_IPv4`/`ENABLE_IPv6`: exactly one family (the log line existing tooling knows quoted in
/// the refusal); IPv6 needs prefix delegation and no custom networking. Our
/// `ENABLE_DUAL_STACK_PODS=true` turns IPv4 mode into dual-stack pods; it is refused in IPv6 mode
/// and with custom networking (an ENIConfig subnet may have no IPv6 CIDR).
fn family(
    e: &mut Env<'_>,
    pool: &PoolSection,
    kube: &KubeSection,
) -> Result<AddressFamily, ConfigError> {
    let enable_ipv4 = e.bool("ENABLE_IPv4", false);
    let enable_ipv6 = e.bool("ENABLE_IPv6", false);
    let dual = e.bool(ENABLE_DUAL_STACK_PODS, false);
    if enable_ipv4 && enable_ipv6 {
        return Err(err(
            "ENABLE_IPv6",
            "true",
            "false while ENABLE_IPv4=true (\"IPv4 and IPv6 are both enabled. VPC CNI currently does not support dual stack mode\"; dual-stack pods: ENABLE_IPv4=true with ENABLE_DUAL_STACK_PODS=true)",
        ));
    }
    if !enable_ipv4 && !enable_ipv6 {
        return Err(err(
            "ENABLE_IPv4",
            e.get("ENABLE_IPv4").unwrap_or(""),
            "true or ENABLE_IPv6=true (\"IPv4 and IPv6 are both disabled. One of them have to be enabled\")",
        ));
    }
    if enable_ipv6 && !pool.enable_prefix_delegation {
        return Err(err(
            "ENABLE_PREFIX_DELEGATION",
            e.get("ENABLE_PREFIX_DELEGATION").unwrap_or(""),
            concat!("true when ENABLE_IPv6=true (", v6_rule!(), ")"),
        ));
    }
    if enable_ipv6 && kube.custom_network_cfg {
        return Err(err(
            "AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG",
            "true",
            concat!("false when ENABLE_IPv6=true (", v6_rule!(), ")"),
        ));
    }
    if dual && enable_ipv6 {
        return Err(err(
            ENABLE_DUAL_STACK_PODS,
            "true",
            "false when ENABLE_IPv6=true (dual-stack pods are an IPv4-mode option: ENABLE_IPv4=true)",
        ));
    }
    if dual && kube.custom_network_cfg {
        return Err(err(
            ENABLE_DUAL_STACK_PODS,
            "true",
            "false with custom networking (AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG=true)",
        ));
    }
    Ok(if enable_ipv6 {
        AddressFamily::V6
    } else if dual {
        AddressFamily::DualStack
    } else {
        AddressFamily::V4
    })
}

#[cfg(test)]
mod tests;
