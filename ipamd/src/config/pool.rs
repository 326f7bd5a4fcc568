//! The pool section: the warm-pool policy (`WARM_POOL_POLICY`), warm targets, prefix delegation, ENI and pod caps, the address cooldown
//! and the pool manager's own timings (`WARM_*`, `MINIMUM_IP_TARGET`, `MAX_ENI`,
//! `ENABLE_PREFIX_DELEGATION`, `IP_COOLDOWN_PERIOD`, `IPAMD_*` pool knobs). Must not: read
//! another section's variables, do I/O.

use std::time::Duration;

use super::env::{Env, NotAnInteger, err};
use super::{ConfigError, WarningKind};

/// `WARM_POOL_POLICY`: how the warm pool is sized (docs/pool-policy.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WarmPoolPolicy {
    /// `static` (default): upstream's `WARM_ENI_TARGET` / `WARM_IP_TARGET` /
    /// `MINIMUM_IP_TARGET` / `WARM_PREFIX_TARGET`, unchanged.
    #[default]
    Static,
    /// `adaptive`: the warm IP target follows the node's ADD rate over the measured refill time
    /// (`ipam_core::pool::policy::adaptive`); it replaces `WARM_ENI_TARGET`, `WARM_IP_TARGET`
    /// and `WARM_PREFIX_TARGET` (ignored, with a warning); `MINIMUM_IP_TARGET` stays a floor.
    Adaptive,
}

/// How the warm pool is sized and paced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSection {
    /// Ours: `WARM_POOL_POLICY` (`static` | `adaptive`; default `static`; anything else is
    /// refused).
    pub warm_pool_policy: WarmPoolPolicy,
    /// `WARM_ENI_TARGET` (1; negative falls back to 1).
    pub warm_eni_target: u32,
    /// `WARM_IP_TARGET` (unset = 0).
    pub warm_ip_target: u32,
    /// `MINIMUM_IP_TARGET` (unset = 0).
    pub minimum_ip_target: u32,
    /// `WARM_PREFIX_TARGET` (0).
    pub warm_prefix_target: u32,
    /// `MAX_ENI` (None = instance limit; -1 in the environment).
    pub max_eni: Option<u32>,
    /// `ENABLE_PREFIX_DELEGATION` (false).
    pub enable_prefix_delegation: bool,
    /// `IP_COOLDOWN_PERIOD` (30 s).
    pub ip_cooldown_period: Duration,
    /// Ours: `IPAMD_MAX_PODS` (default none): kubelet max-pods cap on the pool.
    pub max_pods: Option<u32>,
    /// Ours: `IPAMD_ADD_WAIT_TIMEOUT` seconds (default 10): how long an AddNetwork that finds
    /// no free address waits for the pool manager's immediate allocation.
    pub add_wait_timeout: Duration,
    /// Ours: `IPAMD_BUSY_POOL_WAIT_SECONDS` (default and maximum 100, `ipam::BUSY_POOL_WAIT`):
    /// how long an AddNetwork keeps waiting while a pool action is in flight. Only shortened
    /// by tests (a throttled EC2 then fails the pod sooner); above 100 the plugin's AddNetwork
    /// deadline (110 s) would end the call first, so larger values are refused.
    pub busy_pool_wait: Duration,
    /// Ours: `IPAMD_RECLAIM_UNWIRED_SECONDS` (default 300, 0 = off): an assignment whose pod has
    /// had no host veth and no host route this long is released (its DEL never reached ipamd).
    pub reclaim_unwired_after: Option<Duration>,
    /// Ours: `IPAMD_POOL_TICK_SECONDS` (default 5).
    pub pool_tick: Duration,
    /// Ours: `IPAMD_VPC_CIDR_CHECK_SECONDS` (default 30): how often the VPC's IPv4 CIDRs are read
    /// again from IMDS.
    pub vpc_cidr_check: Duration,
}

impl PoolSection {
    /// Reads the section. Refuses a negative or non-integer cooldown and our own knobs' bad values;
    /// see also [`Self::check_targets`].
    pub(super) fn parse(e: &mut Env<'_>) -> Result<Self, ConfigError> {
        let warm_pool_policy = match e.get("WARM_POOL_POLICY").map(str::to_ascii_lowercase) {
            None => WarmPoolPolicy::Static,
            Some(v) if v == "static" => WarmPoolPolicy::Static,
            Some(v) if v == "adaptive" => WarmPoolPolicy::Adaptive,
            Some(v) => return Err(err("WARM_POOL_POLICY", &v, "static or adaptive")),
        };
        if warm_pool_policy == WarmPoolPolicy::Adaptive {
            for var in ["WARM_ENI_TARGET", "WARM_IP_TARGET", "WARM_PREFIX_TARGET"] {
                if let Some(v) = e.get(var).map(str::to_owned) {
                    e.warn(
                        var,
                        &v,
                        WarningKind::Superseded,
                        "ignored: WARM_POOL_POLICY=adaptive sizes the warm pool (MINIMUM_IP_TARGET stays a floor)".into(),
                    );
                }
            }
        }
        let warm_eni_target = e.count("WARM_ENI_TARGET", 1);
        let warm_ip_target = e.count("WARM_IP_TARGET", 0);
        let minimum_ip_target = e.count("MINIMUM_IP_TARGET", 0);
        let warm_prefix_target = e.count("WARM_PREFIX_TARGET", 0);
        // A value that is not an integer >= 1 is ignored (instance limit); -1 is the documented
        // "unset".
        let max_eni = match e.int("MAX_ENI") {
            None | Some(Ok(-1)) => None,
            Some(Ok(n)) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            Some(Ok(n)) => {
                e.fallback("MAX_ENI", &n.to_string(), "the instance's ENI limit");
                None
            }
            Some(Err(NotAnInteger { value })) => {
                e.fallback("MAX_ENI", &value, "the instance's ENI limit");
                None
            }
        };
        let enable_prefix_delegation = e.bool("ENABLE_PREFIX_DELEGATION", false);
        // A cooldown that is not an integer >= 0 is refused.
        let ip_cooldown_period =
            Duration::from_secs(seconds(e, "IP_COOLDOWN_PERIOD", "seconds >= 0")?.unwrap_or(30));
        let add_wait_timeout = Duration::from_secs(
            seconds(e, "IPAMD_ADD_WAIT_TIMEOUT", "seconds >= 0")?.unwrap_or(10),
        );
        let busy_pool_wait = match seconds(e, "IPAMD_BUSY_POOL_WAIT_SECONDS", "seconds 1..=100")? {
            // `ipam::BUSY_POOL_WAIT` (config must not import ipam: module_layering.rs)
            None => Duration::from_secs(100),
            Some(n @ 1..=100) => Duration::from_secs(n),
            Some(n) => {
                return Err(err(
                    "IPAMD_BUSY_POOL_WAIT_SECONDS",
                    &n.to_string(),
                    "seconds 1..=100",
                ));
            }
        };
        let reclaim_unwired_after =
            match seconds(e, "IPAMD_RECLAIM_UNWIRED_SECONDS", "seconds >= 0 (0 = off)")? {
                None => Some(Duration::from_secs(300)),
                Some(0) => None,
                Some(n) => Some(Duration::from_secs(n)),
            };
        let pool_tick = period(e, "IPAMD_POOL_TICK_SECONDS", 5)?;
        let vpc_cidr_check = period(e, "IPAMD_VPC_CIDR_CHECK_SECONDS", 30)?;
        let max_pods = match e.strict_int("IPAMD_MAX_PODS")? {
            None => None,
            Some(n) => Some(
                u32::try_from(n)
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| err("IPAMD_MAX_PODS", &n.to_string(), "an integer >= 1"))?,
            ),
        };
        Ok(Self {
            warm_pool_policy,
            warm_eni_target,
            warm_ip_target,
            minimum_ip_target,
            warm_prefix_target,
            max_eni,
            enable_prefix_delegation,
            ip_cooldown_period,
            max_pods,
            add_wait_timeout,
            busy_pool_wait,
            reclaim_unwired_after,
            pool_tick,
            vpc_cidr_check,
        })
    }

    /// Prefix delegation with every target at 0 is refused (unless the adaptive policy sizes
    /// the pool). Separate from [`Self::parse`] because
    /// the address family rules are checked first (their refusal is the one reported).
    pub(super) fn check_targets(&self, e: &Env<'_>) -> Result<(), ConfigError> {
        if self.enable_prefix_delegation
            && self.warm_pool_policy == WarmPoolPolicy::Static
            && self.warm_prefix_target == 0
            && self.warm_ip_target == 0
            && self.minimum_ip_target == 0
        {
            return Err(err(
                "WARM_PREFIX_TARGET",
                e.get("WARM_PREFIX_TARGET").unwrap_or("0"),
                "> 0 (or WARM_IP_TARGET/MINIMUM_IP_TARGET > 0) with prefix delegation",
            ));
        }
        Ok(())
    }

    /// True when a WARM_IP_TARGET or MINIMUM_IP_TARGET is set (they override the ENI/prefix
    /// targets).
    #[must_use]
    pub fn uses_ip_targets(&self) -> bool {
        self.warm_ip_target > 0 || self.minimum_ip_target > 0
    }
}

/// A whole number of seconds >= 0, refused otherwise.
fn seconds(
    e: &Env<'_>,
    var: &'static str,
    expected: &'static str,
) -> Result<Option<u64>, ConfigError> {
    e.strict_int(var)?
        .map(|n| u64::try_from(n).map_err(|_| err(var, &n.to_string(), expected)))
        .transpose()
}

/// A loop period of ours: whole seconds >= 1, `default` when unset.
fn period(e: &Env<'_>, var: &'static str, default: u64) -> Result<Duration, ConfigError> {
    match seconds(e, var, "seconds >= 1")? {
        None => Ok(Duration::from_secs(default)),
        Some(0) => Err(err(var, "0", "seconds >= 1")),
        Some(n) => Ok(Duration::from_secs(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::env::test_env;
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<PoolSection, ConfigError> {
        test_env(pairs, |e| {
            let p = PoolSection::parse(e)?;
            p.check_targets(e)?;
            Ok(p)
        })
    }

    #[test]
    fn defaults_and_timings() {
        let p = parse(&[]).unwrap();
        assert_eq!(
            (p.warm_eni_target, p.warm_ip_target, p.minimum_ip_target),
            (1, 0, 0)
        );
        assert_eq!(p.max_eni, None);
        assert_eq!(p.ip_cooldown_period, Duration::from_secs(30));
        assert_eq!(p.add_wait_timeout, Duration::from_secs(10));
        assert_eq!(p.busy_pool_wait, Duration::from_secs(100));
        assert_eq!(p.reclaim_unwired_after, Some(Duration::from_secs(300)));
        assert_eq!(p.pool_tick, Duration::from_secs(5));
        assert!(!p.uses_ip_targets());
        let p = parse(&[
            ("IPAMD_RECLAIM_UNWIRED_SECONDS", "0"),
            ("IP_COOLDOWN_PERIOD", "0"),
            ("MINIMUM_IP_TARGET", "3"),
            ("MAX_ENI", "2"),
            ("IPAMD_MAX_PODS", "17"),
            ("IPAMD_BUSY_POOL_WAIT_SECONDS", "25"),
        ])
        .unwrap();
        assert_eq!(p.busy_pool_wait, Duration::from_secs(25));
        assert_eq!(p.reclaim_unwired_after, None);
        assert_eq!(p.ip_cooldown_period, Duration::ZERO);
        assert!(p.uses_ip_targets());
        assert_eq!((p.max_eni, p.max_pods), (Some(2), Some(17)));
    }

    #[test]
    fn prefix_delegation_needs_a_target() {
        let e = parse(&[("ENABLE_PREFIX_DELEGATION", "true")]).unwrap_err();
        assert_eq!(e.var, "WARM_PREFIX_TARGET");
        for target in ["WARM_PREFIX_TARGET", "WARM_IP_TARGET", "MINIMUM_IP_TARGET"] {
            let p = parse(&[("ENABLE_PREFIX_DELEGATION", "true"), (target, "1")]).unwrap();
            assert!(p.enable_prefix_delegation, "{target}");
        }
    }

    #[test]
    fn the_adaptive_policy_replaces_the_warm_targets_and_refuses_unknown_policies() {
        assert_eq!(parse(&[]).unwrap().warm_pool_policy, WarmPoolPolicy::Static);
        let p = parse(&[("WARM_POOL_POLICY", "Adaptive")]).unwrap();
        assert_eq!(p.warm_pool_policy, WarmPoolPolicy::Adaptive);
        assert_eq!(
            parse(&[("WARM_POOL_POLICY", "learning")]).unwrap_err().var,
            "WARM_POOL_POLICY"
        );
        // prefix delegation needs no WARM_PREFIX_TARGET under the adaptive policy
        let p = parse(&[
            ("WARM_POOL_POLICY", "adaptive"),
            ("ENABLE_PREFIX_DELEGATION", "true"),
        ])
        .unwrap();
        assert!(p.enable_prefix_delegation);
        // the WARM_* targets set too are ignored, loudly; MINIMUM_IP_TARGET is not
        let (p, warnings) = super::super::env::with_warnings(
            &[
                ("WARM_POOL_POLICY", "adaptive"),
                ("WARM_IP_TARGET", "5"),
                ("WARM_ENI_TARGET", "1"),
                ("MINIMUM_IP_TARGET", "10"),
            ],
            PoolSection::parse,
        );
        assert_eq!(p.unwrap().minimum_ip_target, 10);
        let vars: Vec<_> = warnings
            .iter()
            .filter(|w| w.kind == WarningKind::Superseded)
            .map(|w| w.var)
            .collect();
        assert_eq!(vars, ["WARM_ENI_TARGET", "WARM_IP_TARGET"]);
    }

    #[test]
    fn own_knobs_refuse_bad_values() {
        for (var, val) in [
            ("IPAMD_ADD_WAIT_TIMEOUT", "-2"),
            ("IPAMD_POOL_TICK_SECONDS", "0"),
            ("IPAMD_BUSY_POOL_WAIT_SECONDS", "0"),
            ("IPAMD_BUSY_POOL_WAIT_SECONDS", "101"),
            ("IPAMD_MAX_PODS", "0"),
            ("IPAMD_MAX_PODS", "many"),
        ] {
            assert_eq!(parse(&[(var, val)]).unwrap_err().var, var, "{var}={val}");
        }
    }
}
