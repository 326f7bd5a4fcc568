//! Publishing datums with CloudWatch `PutMetricData`: the pure batch plan (CloudWatch's per-request
//! limits) and the thin SDK adapter (namespace `Kubernetes`, one `CLUSTER_ID` dimension, unit
//! `Count`). Owns nothing else.

use std::time::Duration;

use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StandardUnit};

use crate::aggregate::Datum;

/// The CloudWatch namespace.
pub const NAMESPACE: &str = "Kubernetes";
/// The one dimension's name.
pub const CLUSTER_ID_DIMENSION: &str = "CLUSTER_ID";
/// CloudWatch: at most 1000 datums per PutMetricData request.
pub const MAX_DATUMS_PER_REQUEST: usize = 1000;
/// CloudWatch: 1 MB per request body; plan with a margin for the envelope.
pub const MAX_REQUEST_BYTES: usize = 1_000_000 - 16 * 1024;

/// Conservative size of one datum in a query-protocol body (name, value, unit, dimension).
pub fn datum_cost(d: &Datum, cluster_id: &str) -> usize {
    200 + d.cloudwatch.len() + cluster_id.len() + CLUSTER_ID_DIMENSION.len()
}

/// Splits `datums` into index ranges, each within both per-request limits, in order.
pub fn plan_batches(datums: &[Datum], cluster_id: &str) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, d) in datums.iter().enumerate() {
        let cost = datum_cost(d, cluster_id);
        if i > start && (i - start == MAX_DATUMS_PER_REQUEST || bytes + cost > MAX_REQUEST_BYTES) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += cost;
    }
    if start < datums.len() {
        out.push(start..datums.len());
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("PutMetricData failed for {failed} of {batches} batches; last error: {last}")]
    Put {
        failed: usize,
        batches: usize,
        last: String,
    },
}

/// How to reach CloudWatch (region and endpoint from the Config; credentials from the SDK's
/// default chain unless given, as tests against moto do).
#[derive(Debug, Clone, Default)]
pub struct CloudWatchSettings {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub cluster_id: String,
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub static_credentials: Option<(String, String)>,
}

/// The project's one AWS HTTP client: hyper + rustls on ring (as ipamd's EC2 client).
pub fn http_client() -> aws_sdk_cloudwatch::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// The SDK client with the namespace and dimension.
#[derive(Debug, Clone)]
pub struct CloudWatch {
    client: aws_sdk_cloudwatch::Client,
    cluster_id: String,
}

impl CloudWatch {
    /// Standard retry mode (exponential back-off with jitter, retrying `Throttling` and
    /// 5xx) with `max_attempts` attempts in all.
    pub async fn new(settings: CloudWatchSettings) -> Self {
        let CloudWatchSettings {
            region,
            endpoint,
            cluster_id,
            max_attempts,
            initial_backoff,
            static_credentials,
        } = settings;
        use aws_sdk_cloudwatch::config::retry::RetryConfig;
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .http_client(http_client())
            .retry_config(
                RetryConfig::standard()
                    .with_max_attempts(max_attempts)
                    .with_initial_backoff(initial_backoff),
            );
        if let Some(region) = region {
            loader = loader.region(aws_config::Region::new(region));
        }
        if let Some((key, secret)) = static_credentials {
            loader = loader.credentials_provider(aws_sdk_cloudwatch::config::Credentials::new(
                key, secret, None, None, "static",
            ));
        }
        if let Some(endpoint) = endpoint {
            loader = loader.endpoint_url(endpoint);
        }
        let sdk = loader.load().await;
        CloudWatch {
            client: aws_sdk_cloudwatch::Client::new(&sdk),
            cluster_id,
        }
    }

    /// One PutMetricData per planned batch; a failed batch does not stop the others.
    pub async fn publish(&self, datums: &[Datum]) -> Result<usize, PublishError> {
        let plan = plan_batches(datums, &self.cluster_id);
        let dimension = Dimension::builder()
            .name(CLUSTER_ID_DIMENSION)
            .value(&self.cluster_id)
            .build();
        let (mut failed, mut last) = (0, String::new());
        for range in &plan {
            let data = datums[range.clone()]
                .iter()
                .map(|d| {
                    MetricDatum::builder()
                        .metric_name(d.cloudwatch)
                        .unit(StandardUnit::Count)
                        .value(d.value)
                        .dimensions(dimension.clone())
                        .build()
                })
                .collect::<Vec<_>>();
            let sent = self
                .client
                .put_metric_data()
                .namespace(NAMESPACE)
                .set_metric_data(Some(data))
                .send()
                .await;
            if let Err(e) = sent {
                failed += 1;
                last = aws_sdk_cloudwatch::error::DisplayErrorContext(&e).to_string();
                tracing::warn!("Unable to publish CloudWatch metrics: {last}");
            }
        }
        if failed > 0 {
            return Err(PublishError::Put {
                failed,
                batches: plan.len(),
                last,
            });
        }
        Ok(plan.len())
    }
}

/// Ours: the subnet inventory's CloudWatch metrics, per subnet (dimensions `CLUSTER_ID` and
/// `SubnetId`): name, unit, value (`None`: not published).
type SubnetMetric = (
    &'static str,
    StandardUnit,
    fn(&crate::inventory::SubnetReport) -> Option<f64>,
);

/// The inventory's CloudWatch names.
pub const SUBNET_METRICS: [SubnetMetric; 4] = [
    ("subnetFreeIPAddresses", StandardUnit::Count, |s| {
        Some(f64::from(s.figures.free_addresses))
    }),
    ("subnetFreePrefixBlocks", StandardUnit::Count, |s| {
        Some(f64::from(s.figures.free_prefix_blocks))
    }),
    ("subnetIPExhaustionSeconds", StandardUnit::Seconds, |s| {
        s.addresses.and_then(|f| f.exhaustion_secs)
    }),
    (
        "subnetPrefixExhaustionSeconds",
        StandardUnit::Seconds,
        |s| s.prefix_blocks.and_then(|f| f.exhaustion_secs),
    ),
];

impl CloudWatch {
    /// The inventory, in batches of at most 1000 datums.
    pub async fn publish_subnets(
        &self,
        subnets: &[crate::inventory::SubnetReport],
    ) -> Result<usize, PublishError> {
        let cluster = Dimension::builder()
            .name(CLUSTER_ID_DIMENSION)
            .value(&self.cluster_id)
            .build();
        let data: Vec<MetricDatum> = subnets
            .iter()
            .flat_map(|s| {
                let cluster = cluster.clone();
                SUBNET_METRICS
                    .iter()
                    .filter_map(move |(name, unit, value)| {
                        Some(
                            MetricDatum::builder()
                                .metric_name(*name)
                                .unit(unit.clone())
                                .value(value(s)?)
                                .dimensions(cluster.clone())
                                .dimensions(
                                    Dimension::builder()
                                        .name("SubnetId")
                                        .value(&s.subnet_id)
                                        .build(),
                                )
                                .build(),
                        )
                    })
            })
            .collect();
        let batches = data.chunks(1000).count();
        let (mut failed, mut last) = (0, String::new());
        for chunk in data.chunks(1000) {
            if let Err(e) = self
                .client
                .put_metric_data()
                .namespace(NAMESPACE)
                .set_metric_data(Some(chunk.to_vec()))
                .send()
                .await
            {
                failed += 1;
                last = aws_sdk_cloudwatch::error::DisplayErrorContext(&e).to_string();
            }
        }
        if failed > 0 {
            return Err(PublishError::Put {
                failed,
                batches,
                last,
            });
        }
        Ok(batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datums(n: usize) -> Vec<Datum> {
        (0..n)
            .map(|i| Datum {
                cloudwatch: "assignIPAddresses",
                prometheus: "x",
                value: i as f64,
                gauge: true,
            })
            .collect()
    }

    #[test]
    fn batches_respect_count_and_cover_everything_in_order() {
        for (n, want) in [(0, 0), (1, 1), (20, 1), (1000, 1), (1001, 2), (2500, 3)] {
            let plan = plan_batches(&datums(n), "c");
            assert_eq!(plan.len(), want, "{n} datums");
            assert!(plan.iter().all(|r| r.len() <= MAX_DATUMS_PER_REQUEST));
            let covered: Vec<usize> = plan.into_iter().flatten().collect();
            assert_eq!(covered, (0..n).collect::<Vec<_>>());
        }
    }

    #[test]
    fn batches_respect_size() {
        let long = "c".repeat(5000);
        let plan = plan_batches(&datums(1000), &long);
        assert!(plan.len() > 1);
        for r in plan {
            let bytes: usize = datums(1000)[r].iter().map(|d| datum_cost(d, &long)).sum();
            assert!(bytes <= MAX_REQUEST_BYTES);
        }
    }
}
