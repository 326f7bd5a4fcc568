//! Per-API EC2 metrics under upstream's names, recorded into ipamd's metrics registry
//! (`http::metrics`, which keeps upstream's exact names without `_total`):
//! `awscni_aws_api_latency_ms{api,error,status}`, `awscni_aws_api_error_count{api,error}`,
//! `awscni_ec2api_req_count{fn}`, `awscni_ec2api_error_count{fn}`, and the clean-up failures
//! upstream's awsutils counts, `awscni_aws_utils_error_count{fn,error}`. Owns only the recording.

use std::sync::Arc;
use std::time::Duration;

use super::error::Ec2Error;
use crate::http::metrics::Metrics;

/// Where EC2 call outcomes are recorded. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct AwsMetrics {
    registry: Option<Arc<Metrics>>,
}

impl AwsMetrics {
    /// Record into `registry`.
    pub fn new(registry: Arc<Metrics>) -> Self {
        Self {
            registry: Some(registry),
        }
    }

    /// Record one finished EC2 call (after the SDK's own retries). `status` is the HTTP status
    /// (0 when no response arrived).
    pub fn observe(
        &self,
        api: &'static str,
        latency: Duration,
        status: u16,
        outcome: Result<(), &Ec2Error>,
    ) {
        let Some(m) = &self.registry else { return };
        let ms = latency.as_secs_f64() * 1000.0;
        m.aws_api_latency(api, outcome.is_err(), &status.to_string(), ms);
        m.add("awscni_ec2api_req_count", vec![("fn", api.to_owned())], 1.0);
        if let Err(e) = outcome {
            m.add(
                "awscni_ec2api_error_count",
                vec![("fn", api.to_owned())],
                1.0,
            );
            m.add(
                "awscni_aws_api_error_count",
                vec![
                    ("api", api.to_owned()),
                    ("error", e.metric_code().to_owned()),
                ],
                1.0,
            );
        }
    }

    /// `awscni_aws_utils_error_count{fn,error}` +1: a failure upstream's awsutils wrapper counts
    /// (`AllocENIDeleteErr`, `FreeENIDeleteErr`, `cleanUpLeakedENIDeleteErr`). The `error`
    /// label is the EC2 error code (upstream puts the whole error text there, which is
    /// unbounded).
    pub fn utils_error(&self, func: &'static str, e: &Ec2Error) {
        let Some(m) = &self.registry else { return };
        m.add(
            "awscni_aws_utils_error_count",
            vec![
                ("error", e.metric_code().to_owned()),
                ("fn", func.to_owned()),
            ],
            1.0,
        );
    }
}
