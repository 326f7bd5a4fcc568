//! The HTTP section: the introspection and metrics endpoints and how metric names are spelled
//! (`INTROSPECTION_BIND_ADDRESS`, `DISABLE_INTROSPECTION`, `DISABLE_METRICS`, ours
//! `METRICS_BIND_ADDRESS`, `METRICS_NAMING`). Must not: bind anything (that is `http`'s).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::ConfigError;
use super::env::{Env, err};

/// The default introspection address.
pub const DEFAULT_INTROSPECTION_BIND: &str = "127.0.0.1:61679";

/// Introspection bind address (`INTROSPECTION_BIND_ADDRESS`): TCP or `unix:<path>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindAddress {
    /// `host:port`, resolved when binding (`localhost:61679` works, as with Go's `net.Listen`;
    /// `:61679` means every interface). A bind that fails is retried with back-off.
    Tcp(String),
    /// A unix socket path.
    Unix(PathBuf),
}

/// How `/metrics` spells metric names (ours: `METRICS_NAMING`).
///
/// The default names (`awscni_add_ip_req_count` as a counter, `awscni_aws_api_latency_ms`) are what
/// the cni-metrics-helper and existing dashboards query, but they break three Prometheus naming
/// rules that `promtool check metrics` enforces. Operators choose; see `docs/ipamd.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsNaming {
    /// `upstream` (default): the names, types and units existing dashboards query.
    #[default]
    Upstream,
    /// `prometheus`: the same series under conventional names (`_total` counters, latency in
    /// `_seconds`); `promtool check metrics` reports nothing.
    Prometheus,
}

/// The introspection and metrics endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSection {
    /// `INTROSPECTION_BIND_ADDRESS` (127.0.0.1:61679).
    pub introspection_bind: BindAddress,
    /// `DISABLE_INTROSPECTION` (false).
    pub disable_introspection: bool,
    /// `DISABLE_METRICS` (false).
    pub disable_metrics: bool,
    /// Ours: `METRICS_BIND_ADDRESS` (default `:61678`; simulated nodes need their own).
    pub metrics_bind: SocketAddr,
    /// Ours: `METRICS_NAMING` (`upstream`, or `prometheus` for lint-clean names).
    pub metrics_naming: MetricsNaming,
}

impl HttpSection {
    /// Reads the section; refuses a metrics address or naming it cannot use.
    pub(super) fn parse(e: &mut Env<'_>) -> Result<Self, ConfigError> {
        // Any host:port is accepted here and resolved at bind time (a failed bind is retried with
        // back-off).
        let introspection_bind = match e.get("INTROSPECTION_BIND_ADDRESS") {
            None => BindAddress::Tcp(DEFAULT_INTROSPECTION_BIND.to_owned()),
            Some(v) => match v.strip_prefix("unix:") {
                Some(path) if !path.is_empty() => BindAddress::Unix(PathBuf::from(path)),
                _ => BindAddress::Tcp(v.to_owned()),
            },
        };
        let metrics_bind = match e.get("METRICS_BIND_ADDRESS") {
            None => SocketAddr::from(([0, 0, 0, 0], 61678)),
            Some(v) => v
                .parse()
                .map_err(|_| err("METRICS_BIND_ADDRESS", v, "host:port"))?,
        };
        let metrics_naming = match e.get("METRICS_NAMING").unwrap_or("upstream") {
            "upstream" => MetricsNaming::Upstream,
            "prometheus" => MetricsNaming::Prometheus,
            v => return Err(err("METRICS_NAMING", v, "upstream or prometheus")),
        };
        Ok(Self {
            introspection_bind,
            disable_introspection: e.bool("DISABLE_INTROSPECTION", false),
            disable_metrics: e.bool("DISABLE_METRICS", false),
            metrics_bind,
            metrics_naming,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::env::test_env;
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<HttpSection, ConfigError> {
        test_env(pairs, HttpSection::parse)
    }

    #[test]
    fn defaults() {
        let h = parse(&[]).unwrap();
        assert_eq!(
            h.introspection_bind,
            BindAddress::Tcp("127.0.0.1:61679".into())
        );
        assert_eq!(h.metrics_bind, "0.0.0.0:61678".parse().unwrap());
        assert_eq!(h.metrics_naming, MetricsNaming::Upstream);
        assert!(!h.disable_introspection && !h.disable_metrics);
    }

    #[test]
    fn introspection_bind_takes_names_and_go_forms() {
        for (val, want) in [
            (
                "localhost:61679",
                BindAddress::Tcp("localhost:61679".into()),
            ),
            (":61679", BindAddress::Tcp(":61679".into())),
            ("unix:/run/x.sock", BindAddress::Unix("/run/x.sock".into())),
        ] {
            let h = parse(&[("INTROSPECTION_BIND_ADDRESS", val)]).unwrap();
            assert_eq!(h.introspection_bind, want);
        }
    }

    #[test]
    fn metrics_knobs() {
        let h = parse(&[
            ("METRICS_BIND_ADDRESS", "127.0.0.1:9000"),
            ("METRICS_NAMING", "prometheus"),
            ("DISABLE_METRICS", "true"),
        ])
        .unwrap();
        assert_eq!(h.metrics_bind, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(h.metrics_naming, MetricsNaming::Prometheus);
        assert!(h.disable_metrics);
        for (var, val) in [
            ("METRICS_BIND_ADDRESS", "localhost"),
            ("METRICS_NAMING", "openmetrics"),
        ] {
            assert_eq!(parse(&[(var, val)]).unwrap_err().var, var);
        }
    }
}
