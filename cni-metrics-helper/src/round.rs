//! One collection round (upstream `metrics.Handler`): list the aws-node pods, scrape each
//! through the pod proxy, parse, aggregate, publish. Failures of one pod (gone, 503, garbage)
//! only drop that pod from the round. Owns the order of steps, not their mechanics.

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
            // it may take time for a deleted pod to leave the list: skip it (as upstream)
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
        *latest.lock().unwrap() = datums.clone();
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
