//! One collection round: list the aws-node pods, scrape each through the pod proxy, parse,
//! aggregate, publish. Failures of one pod (gone, 503, garbage) only drop that pod from the round.
//! Owns the order of steps, not their mechanics.

use crate::aggregate::{CounterMemory, Datum, NodeScrape, aggregate};
use crate::cloudwatch::CloudWatch;
use crate::exposition::parse;
use crate::kube_pods::AwsNodePods;
use crate::serve::Latest;

/// What a round did, for logs and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundReport {
    pub pods: usize,
    pub scraped: usize,
    pub datums: Vec<Datum>,
    pub published: bool,
    pub publish_error: Option<String>,
}

pub async fn run_round(
    kube: &AwsNodePods,
    cloudwatch: Option<&CloudWatch>,
    latest: Option<&Latest>,
    memory: &mut CounterMemory,
) -> RoundReport {
    let pods = match kube.list().await {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("{e}");
            Vec::new()
        }
    };
    tracing::info!("Total aws-node pod count: {}", pods.len());
    let mut scrapes = Vec::new();
    for pod in &pods {
        match kube.scrape(pod).await {
            // it may take time for a deleted pod to leave the list: skip it
            Err(e) => tracing::warn!("grabMetricsFromTarget: Failed to grab CNI endpoint: {e}"),
            Ok(text) => match parse(&text) {
                Ok(families) => scrapes.push(NodeScrape {
                    pod: pod.clone(),
                    families,
                }),
                Err(e) => tracing::warn!("{pod}: unparsable /metrics: {e}"),
            },
        }
    }
    let (datums, next) = aggregate(&scrapes, memory);
    *memory = next;
    if let Some(latest) = latest {
        latest.lock().unwrap().datums = datums.clone();
    }
    let mut published = false;
    let mut publish_error = None;
    if let Some(cw) = cloudwatch {
        if datums.is_empty() {
            tracing::info!("Missing data for publishing CloudWatch metrics");
        } else {
            match cw.publish(&datums).await {
                Ok(batches) => {
                    published = true;
                    tracing::info!(
                        "Sent {} datums to CloudWatch in {batches} requests",
                        datums.len()
                    );
                }
                Err(e) => {
                    tracing::warn!("{e}");
                    publish_error = Some(e.to_string());
                }
            }
        }
    }
    RoundReport {
        pods: pods.len(),
        scraped: scrapes.len(),
        datums,
        published,
        publish_error,
    }
}

/// What an inventory round did, for logs and tests.
#[derive(Debug, Clone, Default)]
pub struct InventoryReport {
    pub subnets: Vec<crate::inventory::SubnetReport>,
    /// EC2 requests made.
    pub calls: u32,
    pub error: Option<String>,
    pub published: bool,
}

/// One inventory round: the nodes' addresses and the ENIConfigs from the API server, the
/// bounded EC2 reads, the figures, the forecasts (`at`: seconds on the helper's clock), then
/// publish. A failure leaves the last published inventory in place and is logged, naming the
/// missing IAM action when EC2 says unauthorized.
pub async fn run_inventory(
    kube: &AwsNodePods,
    ec2: &crate::inventory::ec2::Ec2Inventory,
    inventory: &mut crate::inventory::Inventory,
    at: f64,
    cloudwatch: Option<&CloudWatch>,
    latest: Option<&Latest>,
) -> InventoryReport {
    let mut report = InventoryReport::default();
    let hosts = match kube.list_with_hosts().await {
        Ok(p) => p.into_iter().filter_map(|(_, ip)| ip).collect::<Vec<_>>(),
        Err(e) => {
            tracing::warn!("subnet inventory: {e}");
            report.error = Some(e.to_string());
            return report;
        }
    };
    let eniconfigs = match kube.eniconfig_subnets().await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("subnet inventory: {e}; ENIConfig subnets left out this round");
            Vec::new()
        }
    };
    let collected = match ec2.collect(&hosts, &eniconfigs).await {
        Ok(c) => c,
        Err(e) => {
            if e.unauthorized() {
                tracing::warn!(
                    "subnet inventory: the helper's IAM role lacks ec2:{} ({e}); grant it or set ENABLE_SUBNET_INVENTORY=false",
                    e.action
                );
            } else {
                tracing::warn!("subnet inventory: {e}");
            }
            report.error = Some(e.to_string());
            return report;
        }
    };
    report.calls = collected.calls;
    let sources =
        crate::inventory::cluster_subnets(&collected.primary_enis, &eniconfigs, &collected.tagged);
    let figures =
        crate::inventory::occupancy(&collected.subnets, &collected.enis, &collected.reservations);
    report.subnets = inventory.record(at, &collected.subnets, &sources, &figures);
    tracing::info!(
        subnets = report.subnets.len(),
        ec2_calls = report.calls,
        "subnet inventory done"
    );
    if let Some(latest) = latest {
        latest.lock().unwrap().subnets = report.subnets.clone();
    }
    if let Some(cw) = cloudwatch {
        match cw.publish_subnets(&report.subnets).await {
            Ok(_) => report.published = true,
            Err(e) => tracing::warn!("{e}"),
        }
    }
    report
}

/// The inventory round's reports as the document ipamd reads
/// (`ipam_core::pool::subnet_inventory`): counted at `observed_at` (wall clock), the next due
/// `interval` later; each forecast's time to exhaustion made absolute from `observed_at`. Pure.
#[must_use]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn inventory_document(
    reports: &[crate::inventory::SubnetReport],
    observed_at: std::time::SystemTime,
    interval: std::time::Duration,
) -> ipam_core::pool::subnet_inventory::InventoryDocument {
    use ipam_core::pool::subnet_inventory::{InventoryDocument, SubnetEntry, VERSION};
    // whole seconds, as the document writes times (what ipamd reads equals what is built)
    let observed_at = std::time::UNIX_EPOCH
        + std::time::Duration::from_secs(
            observed_at
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs(),
        );
    let at = |f: Option<crate::inventory::Forecast>| {
        f.and_then(|f| f.exhaustion_secs)
            .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e12)
            .map(|s| observed_at + std::time::Duration::from_secs(s.round() as u64))
    };
    InventoryDocument {
        version: VERSION,
        observed_at,
        interval_seconds: interval.as_secs(),
        subnets: reports
            .iter()
            .map(|r| SubnetEntry {
                subnet_id: r.subnet_id.clone(),
                free_addresses: r.figures.free_addresses,
                free_prefix_blocks: r.figures.free_prefix_blocks,
                address_consumption_per_second: r.addresses.map(|f| f.consumption_per_sec),
                address_exhaustion_at: at(r.addresses),
                prefix_block_consumption_per_second: r.prefix_blocks.map(|f| f.consumption_per_sec),
                prefix_block_exhaustion_at: at(r.prefix_blocks),
            })
            .collect(),
    }
}

/// Writes `doc` into the ConfigMap `(namespace, name)` (`SUBNET_INVENTORY_CONFIGMAP`) for
/// ipamd; a failure is logged as an ERROR naming the chart's RBAC and returned (the ConfigMap
/// then ages: ipamd ignores it after three intervals).
pub async fn publish_inventory_config_map(
    kube: &AwsNodePods,
    (namespace, name): (&str, &str),
    doc: &ipam_core::pool::subnet_inventory::InventoryDocument,
) -> Result<(), crate::kube_pods::KubeError> {
    let r = kube
        .write_config_map(
            namespace,
            name,
            ipam_core::pool::subnet_inventory::DATA_KEY,
            &doc.render(),
        )
        .await;
    match &r {
        Ok(()) => tracing::info!(
            config_map = format!("{namespace}/{name}"),
            subnets = doc.subnets.len(),
            "subnet inventory written for ipamd"
        ),
        Err(e) => tracing::error!(
            "subnet inventory not written for ipamd: {e} (the chart grants create on configmaps and get/update on this one with subnetInventory.configMap)"
        ),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{Figures, Forecast, SubnetReport};
    use std::time::{Duration, SystemTime};

    #[test]
    fn the_document_carries_the_figures_and_absolute_forecasts() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let report = SubnetReport {
            subnet_id: "subnet-a".into(),
            cidr: "10.0.0.0/24".parse().unwrap(),
            availability_zone: "az1".into(),
            sources: std::collections::BTreeSet::new(),
            ec2_available: 250,
            figures: Figures {
                free_addresses: 120,
                free_prefix_blocks: 3,
            },
            addresses: Some(Forecast {
                consumption_per_sec: 0.5,
                exhaustion_secs: Some(240.0),
            }),
            prefix_blocks: Some(Forecast {
                consumption_per_sec: -0.1,
                exhaustion_secs: None,
            }),
        };
        let doc = inventory_document(&[report], t0, Duration::from_secs(300));
        assert_eq!(doc.interval_seconds, 300);
        let e = &doc.subnets[0];
        assert_eq!((e.free_addresses, e.free_prefix_blocks), (120, 3));
        assert_eq!(e.address_exhaustion_at, Some(t0 + Duration::from_secs(240)));
        assert_eq!(e.prefix_block_exhaustion_at, None);
        assert_eq!(e.prefix_block_consumption_per_second, Some(-0.1));
        // what ipamd reads back
        let back =
            ipam_core::pool::subnet_inventory::InventoryDocument::parse(&doc.render()).unwrap();
        assert_eq!(back, doc);
    }
}
