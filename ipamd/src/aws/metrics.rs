//! Per-API EC2 metrics, recorded into ipamd's metrics registry (`crate::metrics`, whose default
//! names carry no `_total`): `awscni_aws_api_latency_ms{api,error,status}`,
//! `awscni_aws_api_error_count{api,error}`, `awscni_ec2api_req_count{fn}`,
//! `awscni_ec2api_error_count{fn}`, and the ENI clean-up failures,
//! `awscni_aws_utils_error_count{fn,error}`; and ours,
//! `awscni_subnet_available_ip_addresses{subnet}` (subnet discovery's last DescribeSubnets) and
//! the pool growth calls' `ec2_call` phase of `awscni_pod_network_setup_seconds`. Owns only the
//! recording.

use std::sync::Arc;
use std::time::Duration;

use super::error::Ec2Error;
use crate::metrics::Metrics;

/// The calls that add addresses to the pool, observed as the `ec2_call` phase of
/// `awscni_pod_network_setup_seconds`: what a pod waits for when the warm pool ran dry.
pub const POOL_GROWTH_APIS: [&str; 4] = [
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "AssignPrivateIpAddresses",
    "AssignIpv6Addresses",
];

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
        if POOL_GROWTH_APIS.contains(&api) {
            m.setup_phase(crate::metrics::SetupPhase::Ec2Call, latency);
        }
        m.ec2api_req_count.inc([api]);
        m.ec2_calls_finished
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        m.ec2_call_done.notify_one();
        if let Err(e) = outcome {
            m.ec2api_error_count.inc([api]);
            m.aws_api_error_count.inc([api, e.metric_code()]);
        }
    }

    /// `awscni_aws_utils_error_count{fn,error}` +1: an ENI clean-up failure (`AllocENIDeleteErr`,
    /// `FreeENIDeleteErr`, `cleanUpLeakedENIDeleteErr`). The `error` label is the EC2 error code,
    /// never the whole error text (unbounded label values).
    pub fn utils_error(&self, func: &'static str, e: &Ec2Error) {
        let Some(m) = &self.registry else { return };
        m.aws_utils_error_count.inc([e.metric_code(), func]);
    }

    /// `awscni_subnet_available_ip_addresses{subnet}`: the subnet's `AvailableIpAddressCount`
    /// as the last `DescribeSubnets` of subnet discovery listed it.
    pub fn subnet_available(&self, subnet_id: &str, available: u32) {
        let Some(m) = &self.registry else { return };
        m.subnet_available_ip_addresses
            .set([subnet_id], f64::from(available));
        m.subnet_listed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(subnet_id.to_owned(), std::time::SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn every_finished_call_is_counted_for_the_residency_watch() {
        let registry = Arc::new(Metrics::new());
        let m = AwsMetrics::new(registry.clone());
        m.observe(
            "DescribeNetworkInterfaces",
            Duration::from_millis(3),
            200,
            Ok(()),
        );
        m.observe(
            "AssignPrivateIpAddresses",
            Duration::from_millis(5),
            503,
            Err(&Ec2Error::Throttled),
        );
        // answered or failed, each call moves the count the watch reads
        assert_eq!(registry.ec2_calls_finished.load(Ordering::Relaxed), 2);
        // and wakes the watch: a permit is waiting for it (one, however many calls finished)
        use futures::FutureExt as _;
        assert!(registry.ec2_call_done.notified().now_or_never().is_some());
        assert!(registry.ec2_call_done.notified().now_or_never().is_none());
        let count = |api| registry.ec2api_req_count.get([api]).map(|s| s.value);
        assert_eq!(count("DescribeNetworkInterfaces"), Some(1.0));
    }
}
