//! The Kubernetes API at ipamd's start: the client connected (its watches made, not started), and
//! the wait for the API server, by the features in use. Must not: start tasks, touch the pools.

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::k8s;

/// The Kubernetes client, and its tasks (made, not started: the caller runs them beside the
/// daemon, [`k8s::ClusterTasks::beside`]; they end once `shutdown` is cancelled). None and no
/// tasks when no API is configured.
pub async fn start_kubernetes(
    config: &Config,
    shutdown: &CancellationToken,
) -> anyhow::Result<(Option<k8s::Cluster>, k8s::ClusterTasks)> {
    let Some(settings) = config.kube.api.clone() else {
        return Ok((None, k8s::ClusterTasks::default()));
    };
    let (cluster, tasks) =
        k8s::Cluster::connect(settings, config.kube.custom_network_cfg, shutdown)
            .await
            .context("kubernetes client")?;
    Ok((Some(cluster), tasks))
}

/// The Kubernetes API at start-up (the client's tasks running): with custom networking,
/// `ANNOTATE_POD_IP` (or SGP) ipamd waits until the API server answers (retrying, never exiting);
/// otherwise it tries for 30 s and starts without it, the Node and ENIConfig watches connecting in
/// the background. Returns whether the API server answered before ipamd went on.
pub async fn wait_for_kubernetes(
    config: &Config,
    cluster: &k8s::Cluster,
    shutdown: &CancellationToken,
) -> anyhow::Result<bool> {
    let dependence = if config.kube.custom_network_cfg
        || config.kube.annotate_pod_ip
        || config.kube.pod_eni.is_some()
    {
        tracing::info!(
            "SGP, custom networking or pod annotation feature is in use, waiting for API server connectivity to start IPAMD"
        );
        k8s::cluster::ApiDependence::Required
    } else {
        tracing::info!("Waiting to connect API server for up to 30s...");
        k8s::cluster::ApiDependence::Optional
    };
    let reached = cluster.wait_reachable(dependence, shutdown).await;
    if reached {
        // With the API server: the Node is read (max pods; also the first ENI's placement from its
        // labels and whether it is cordoned); a Node that cannot be read fails the start ("Failed
        // to get node"), so a wrong MY_NODE_NAME is never served in silence.
        let mut node = cluster.node();
        let found = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            node.wait_for(Option::is_some),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        if !found && !shutdown.is_cancelled() {
            anyhow::bail!(
                "Failed to get node {:?}: the API server answers but has no such Node after 10 s \
                 (MY_NODE_NAME must be the node's name: the DaemonSet sets it from spec.nodeName)",
                cluster.node_name()
            );
        }
    }
    Ok(reached)
}
