//! Per-node warm targets: PURE. The node's own `WARM_IP_TARGET`, `MINIMUM_IP_TARGET`,
//! `WARM_ENI_TARGET` and `WARM_PREFIX_TARGET` (ipamd reads them from the Node's annotations,
//! and below them its ENIConfig's) laid over the environment's targets, field by field, and the
//! rule that refuses a set the pool could not run with. Must not: know where the values come
//! from (Kubernetes), read the environment.

use super::policy::Targets;

/// The node's overrides; None: the environment's value applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WarmOverrides {
    /// `WARM_IP_TARGET`.
    pub warm_ip: Option<u32>,
    /// `MINIMUM_IP_TARGET`.
    pub minimum_ip: Option<u32>,
    /// `WARM_ENI_TARGET`.
    pub warm_eni: Option<u32>,
    /// `WARM_PREFIX_TARGET`.
    pub warm_prefix: Option<u32>,
}

/// Why a node's overrides are refused as a whole (the environment's targets stay in force).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverrideRefusal {
    /// A value is not a whole number in `0..=`[`MAX_OVERRIDE`].
    #[error("{key}={value:?} is not a whole number from 0 to {MAX_OVERRIDE}")]
    NotACount {
        /// Where it was read (the annotation key).
        key: String,
        /// The value read.
        value: String,
    },
    /// With prefix delegation every target would be 0: the pool could hold nothing.
    #[error(
        "with prefix delegation WARM_PREFIX_TARGET, WARM_IP_TARGET and MINIMUM_IP_TARGET would all be 0 (the same rule refuses such an environment)"
    )]
    NothingWarmWithPrefixes,
}

/// The largest value accepted (the biggest instance types hold a few thousand addresses).
pub const MAX_OVERRIDE: u32 = 65_535;

impl WarmOverrides {
    /// True when nothing is overridden.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `value` read for `key` as a count, refused otherwise (never parsed and ignored).
    pub fn count(key: &str, value: &str) -> Result<u32, OverrideRefusal> {
        value
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|n| *n <= MAX_OVERRIDE)
            .ok_or_else(|| OverrideRefusal::NotACount {
                key: key.to_owned(),
                value: value.to_owned(),
            })
    }

    /// These overrides over `lower` field by field: a value given here wins, a field not given
    /// here keeps `lower`'s (the node over its ENIConfig).
    #[must_use]
    pub fn over(self, lower: Self) -> Self {
        Self {
            warm_ip: self.warm_ip.or(lower.warm_ip),
            minimum_ip: self.minimum_ip.or(lower.minimum_ip),
            warm_eni: self.warm_eni.or(lower.warm_eni),
            warm_prefix: self.warm_prefix.or(lower.warm_prefix),
        }
    }

    /// `env` with these overrides laid over it.
    #[must_use]
    pub fn apply(&self, env: &Targets) -> Targets {
        Targets {
            warm_ip: self.warm_ip.unwrap_or(env.warm_ip),
            minimum_ip: self.minimum_ip.unwrap_or(env.minimum_ip),
            warm_eni: self.warm_eni.unwrap_or(env.warm_eni),
            warm_prefix: self.warm_prefix.unwrap_or(env.warm_prefix),
            ..env.clone()
        }
    }

    /// These overrides if the pool can run with them over `env`.
    pub fn checked(self, env: &Targets) -> Result<Self, OverrideRefusal> {
        let t = self.apply(env);
        if t.prefix_delegation && t.warm_prefix == 0 && t.warm_ip == 0 && t.minimum_ip == 0 {
            return Err(OverrideRefusal::NothingWarmWithPrefixes);
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pd: bool) -> Targets {
        Targets {
            warm_eni: 1,
            warm_ip: 0,
            minimum_ip: 0,
            warm_prefix: u32::from(pd),
            prefix_delegation: pd,
            max_enis: 3,
            cidrs_per_eni: 9,
            max_pods: Some(29),
        }
    }

    #[test]
    fn the_node_wins_field_by_field() {
        let o = WarmOverrides {
            warm_ip: Some(5),
            minimum_ip: Some(10),
            ..WarmOverrides::default()
        };
        let t = o.apply(&env(false));
        assert_eq!((t.warm_ip, t.minimum_ip, t.warm_eni), (5, 10, 1));
        assert_eq!((t.max_enis, t.max_pods), (3, Some(29)), "limits untouched");
        assert_eq!(WarmOverrides::default().apply(&env(false)), env(false));
        // 0 is a value (WARM_ENI_TARGET=0 on this node), not "unset"
        let o = WarmOverrides {
            warm_eni: Some(0),
            ..WarmOverrides::default()
        };
        assert_eq!(o.apply(&env(false)).warm_eni, 0);
    }

    #[test]
    fn the_node_over_its_eniconfig_over_the_environment() {
        let node = WarmOverrides {
            warm_ip: Some(2),
            warm_eni: Some(0),
            ..WarmOverrides::default()
        };
        let eni_config = WarmOverrides {
            warm_ip: Some(8),
            minimum_ip: Some(12),
            ..WarmOverrides::default()
        };
        let both = node.over(eni_config);
        assert_eq!(
            both,
            WarmOverrides {
                warm_ip: Some(2),
                minimum_ip: Some(12),
                warm_eni: Some(0),
                warm_prefix: None,
            }
        );
        let t = both.apply(&env(false));
        assert_eq!(
            (t.warm_ip, t.minimum_ip, t.warm_eni, t.warm_prefix),
            (2, 12, 0, 0)
        );
        assert_eq!(WarmOverrides::default().over(eni_config), eni_config);
        assert_eq!(node.over(WarmOverrides::default()), node);
    }

    #[test]
    fn bad_values_and_unrunnable_sets_are_refused() {
        for v in ["-1", "two", "", "1.5", "70000"] {
            assert!(WarmOverrides::count("k", v).is_err(), "{v:?}");
        }
        assert_eq!(WarmOverrides::count("k", " 7 "), Ok(7));
        let none_warm = WarmOverrides {
            warm_prefix: Some(0),
            ..WarmOverrides::default()
        };
        assert_eq!(
            none_warm.checked(&env(true)),
            Err(OverrideRefusal::NothingWarmWithPrefixes)
        );
        assert!(none_warm.checked(&env(false)).is_ok());
    }
}
