//! The helper's one Config, parsed once from the environment variables existing manifests set
//! (chart `values.yaml` `env:`). Owns no I/O.

use std::time::Duration;

/// Where USE_PROMETHEUS serves the aggregate.
pub const PROMETHEUS_PORT: u16 = 61681;
/// The cluster id when none is given or found.
pub const DEFAULT_CLUSTER_ID: &str = "k8s-cluster";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub use_cloudwatch: bool,
    pub use_prometheus: bool,
    /// `AWS_CLUSTER_ID`; `None` (unset or empty): looked up from the instance's EC2 tags
    /// (`cluster_id`).
    pub cluster_id: Option<String>,
    pub log_level: String,
    pub interval: Duration,
    pub region: Option<String>,
    /// Test seam: a CloudWatch endpoint (moto). Unset in production.
    pub cloudwatch_endpoint: Option<String>,
    /// Stop after this many rounds (tests); `None` runs forever.
    pub rounds: Option<u64>,
    pub prometheus_bind: String,
    /// Ours, `ENABLE_SUBNET_INVENTORY` (default true): the cluster's subnet inventory
    /// (`inventory`), which needs `ec2:DescribeNetworkInterfaces`, `ec2:DescribeSubnets` and
    /// `ec2:GetSubnetCidrReservations`.
    pub inventory: bool,
    /// Ours, `SUBNET_INVENTORY_INTERVAL` seconds (default 300): how often the inventory's EC2
    /// calls run (the metrics rounds keep `METRIC_UPDATE_INTERVAL`).
    pub inventory_interval: Duration,
    /// Ours, `SUBNET_FORECAST_WINDOW` seconds (default 3600): the samples a consumption rate
    /// is fitted over.
    pub forecast_window: Duration,
    /// Test seam: an EC2 endpoint (vpcsim, moto). Unset in production.
    pub ec2_endpoint: Option<String>,
    /// Ours, `SUBNET_INVENTORY_CONFIGMAP` (`<name>` in `POD_NAMESPACE`, else kube-system; or
    /// `<namespace>/<name>`; unset or empty: off): the ConfigMap each inventory round is written
    /// into for ipamd (`IPAMD_SUBNET_INVENTORY_CONFIGMAP`), as (namespace, name).
    pub inventory_config_map: Option<(String, String)>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("METRIC_UPDATE_INTERVAL ({0}) format invalid. Integer required. Expecting seconds")]
    Interval(String),
    #[error("CNI_METRICS_HELPER_ROUNDS ({0}) must be a positive integer")]
    Rounds(String),
    #[error("{0} ({1}) must be a positive integer number of seconds")]
    Seconds(&'static str, String),
    #[error(
        "SUBNET_INVENTORY_CONFIGMAP ({0}) must be a ConfigMap name or <namespace>/<name> (lowercase alphanumerics, '-', '.')"
    )]
    ConfigMap(String),
}

/// The namespace a bare `SUBNET_INVENTORY_CONFIGMAP` name lives in without `POD_NAMESPACE`.
pub const DEFAULT_NAMESPACE: &str = "kube-system";

/// `SUBNET_INVENTORY_CONFIGMAP`'s value as (namespace, name); a bare name is in the pod's
/// namespace (or [`DEFAULT_NAMESPACE`]).
fn config_map(value: &str, pod_namespace: Option<&str>) -> Option<(String, String)> {
    ipam_core::pool::subnet_inventory::ConfigMapRef::parse(
        value,
        Some(pod_namespace.unwrap_or(DEFAULT_NAMESPACE)),
    )
    .map(|r| (r.namespace, r.name))
}

fn seconds(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: u64,
) -> Result<Duration, ConfigError> {
    match get(name) {
        None => Ok(Duration::from_secs(default)),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(Duration::from_secs(n)),
            _ => Err(ConfigError::Seconds(name, v)),
        },
    }
}

/// `yes`/`true` and `no`/`false` (any case); anything else keeps the default.
fn flag(value: Option<&str>, default: bool) -> bool {
    match value.map(str::to_ascii_lowercase).as_deref() {
        Some("yes" | "true") => true,
        Some("no" | "false") => false,
        _ => default,
    }
}

impl Config {
    /// `get` is the environment (injected so tests need not touch the process's).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let interval = match get("METRIC_UPDATE_INTERVAL") {
            None => 30,
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map_err(|_| ConfigError::Interval(v.clone()))?,
        };
        let rounds = match get("CNI_METRICS_HELPER_ROUNDS") {
            None => None,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => Some(n),
                _ => return Err(ConfigError::Rounds(v)),
            },
        };
        let inventory_interval = seconds(&get, "SUBNET_INVENTORY_INTERVAL", 300)?;
        let forecast_window = seconds(&get, "SUBNET_FORECAST_WINDOW", 3600)?;
        let inventory_config_map = match get("SUBNET_INVENTORY_CONFIGMAP").filter(|v| !v.is_empty())
        {
            None => None,
            Some(v) => Some(
                config_map(
                    &v,
                    get("POD_NAMESPACE").as_deref().filter(|n| !n.is_empty()),
                )
                .ok_or(ConfigError::ConfigMap(v))?,
            ),
        };
        Ok(Config {
            use_cloudwatch: flag(get("USE_CLOUDWATCH").as_deref(), true),
            use_prometheus: flag(get("USE_PROMETHEUS").as_deref(), false),
            cluster_id: get("AWS_CLUSTER_ID").filter(|s| !s.is_empty()),
            log_level: get("AWS_VPC_K8S_CNI_LOGLEVEL").unwrap_or_else(|| "INFO".into()),
            interval: Duration::from_secs(interval),
            region: get("AWS_REGION").filter(|s| !s.is_empty()),
            cloudwatch_endpoint: get("CNI_METRICS_HELPER_CLOUDWATCH_ENDPOINT"),
            rounds,
            prometheus_bind: get("CNI_METRICS_HELPER_PROMETHEUS_BIND")
                .unwrap_or_else(|| format!("0.0.0.0:{PROMETHEUS_PORT}")),
            inventory: flag(get("ENABLE_SUBNET_INVENTORY").as_deref(), true),
            inventory_interval,
            forecast_window,
            ec2_endpoint: get("CNI_METRICS_HELPER_EC2_ENDPOINT"),
            inventory_config_map,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn upstream_defaults_and_flags() {
        let c = Config::from_env(env(&[])).unwrap();
        assert!(c.use_cloudwatch && !c.use_prometheus);
        assert_eq!(c.cluster_id, None);
        assert_eq!(c.interval, Duration::from_secs(30));
        let c = Config::from_env(env(&[
            ("USE_CLOUDWATCH", "No"),
            ("USE_PROMETHEUS", "YES"),
            ("AWS_CLUSTER_ID", "prod"),
            ("METRIC_UPDATE_INTERVAL", "5"),
        ]))
        .unwrap();
        assert!(!c.use_cloudwatch && c.use_prometheus);
        assert_eq!(c.cluster_id.as_deref(), Some("prod"));
        assert_eq!(c.interval, Duration::from_secs(5));
        // neither yes/no nor true/false: upstream keeps the default
        assert!(
            Config::from_env(env(&[("USE_CLOUDWATCH", "1")]))
                .unwrap()
                .use_cloudwatch
        );
    }

    #[test]
    fn inventory_settings() {
        let c = Config::from_env(env(&[])).unwrap();
        assert!(c.inventory);
        assert_eq!(c.inventory_interval, Duration::from_secs(300));
        assert_eq!(c.forecast_window, Duration::from_secs(3600));
        let c = Config::from_env(env(&[
            ("ENABLE_SUBNET_INVENTORY", "false"),
            ("SUBNET_INVENTORY_INTERVAL", "60"),
        ]))
        .unwrap();
        assert!(!c.inventory);
        assert_eq!(c.inventory_interval, Duration::from_secs(60));
        assert_eq!(
            Config::from_env(env(&[("SUBNET_FORECAST_WINDOW", "0")])),
            Err(ConfigError::Seconds("SUBNET_FORECAST_WINDOW", "0".into()))
        );
    }

    #[test]
    fn the_inventory_configmap_is_opt_in_and_namespaced() {
        assert_eq!(
            Config::from_env(env(&[])).unwrap().inventory_config_map,
            None
        );
        let cm =
            |pairs: &[(&str, &str)]| Config::from_env(env(pairs)).map(|c| c.inventory_config_map);
        assert_eq!(
            cm(&[
                ("SUBNET_INVENTORY_CONFIGMAP", "inv"),
                ("POD_NAMESPACE", "monitoring")
            ]),
            Ok(Some(("monitoring".into(), "inv".into())))
        );
        assert_eq!(
            cm(&[("SUBNET_INVENTORY_CONFIGMAP", "inv")]),
            Ok(Some(("kube-system".into(), "inv".into())))
        );
        assert_eq!(
            cm(&[("SUBNET_INVENTORY_CONFIGMAP", "ns/cni.inv")]),
            Ok(Some(("ns".into(), "cni.inv".into())))
        );
        assert_eq!(cm(&[("SUBNET_INVENTORY_CONFIGMAP", "")]), Ok(None));
        for bad in ["Inv", "ns/", "a/b/c", "-x"] {
            assert_eq!(
                cm(&[("SUBNET_INVENTORY_CONFIGMAP", bad)]),
                Err(ConfigError::ConfigMap(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn bad_interval_is_an_error() {
        assert_eq!(
            Config::from_env(env(&[("METRIC_UPDATE_INTERVAL", "30s")])),
            Err(ConfigError::Interval("30s".into()))
        );
    }
}
