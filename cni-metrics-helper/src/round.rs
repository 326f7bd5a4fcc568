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
