//! The Node followed while ipamd runs: max-pods from its capacity, the `/v1/eni-configs` name,
//! whether the pool may manage ENIs on it (the cordon), and the node's own warm targets (its
//! `networking.k8s.aws/*-target` annotations, refused loudly when invalid). Must not: call EC2,
//! touch the pools but through the node state.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::ipam::{Ipam, NodeWarm};
use crate::k8s;
use crate::task::Task;

/// What the composition does with the cluster once the pool exists: max-pods from the Node
/// (fallbacks: the instance's eni-max-pods value, then 110; `IPAMD_MAX_PODS` overrides), the
/// `/v1/eni-configs` name, and whether the pool may attach and free ENIs (not on a node tainted
/// `node.kubernetes.io/unschedulable` unless `AWS_MANAGE_ENIS_NON_SCHEDULABLE=true`).
pub fn follow_node(
    cluster: &k8s::Cluster,
    config: &Config,
    limits: ipam_core::pool::ec2_port::InstanceLimits,
    ipam: &Arc<Ipam>,
    eni_config_name: tokio::sync::watch::Sender<Option<String>>,
    shutdown: CancellationToken,
) -> Task {
    let table = limits
        .max_enis
        .saturating_mul(limits.ipv4_per_eni.saturating_sub(1))
        .saturating_add(2);
    let override_ = config.pool.max_pods;
    let keys = config.kube.eni_config_keys.clone();
    let manage_unschedulable = config.kube.manage_enis_non_schedulable;
    ipam.node_state
        .set_max_pods(k8s::effective_max_pods(override_, None, Some(table)));
    let mut node = cluster.node();
    // Before the pool loop's first pass: a cordoned node attaches nothing from the start.
    if let Some(f) = node.borrow().as_ref() {
        ipam.node_state
            .set_node_unschedulable(f.unschedulable && !manage_unschedulable);
    }
    let ipam = ipam.clone();
    let cluster = cluster.clone();
    Task::new("node follower", async move {
        loop {
            let facts = node.borrow_and_update().clone();
            if let Some(f) = facts {
                follow_warm_targets(&ipam, &cluster, &f);
                let max = k8s::effective_max_pods(override_, f.capacity_pods, Some(table));
                ipam.node_state.set_max_pods(max);
                eni_config_name.send_replace(Some(k8s::eni_config_name(&f, &keys)));
                let frozen = f.unschedulable && !manage_unschedulable;
                if frozen != ipam.node_state.node_unschedulable() {
                    if frozen {
                        tracing::info!(
                            "node is unschedulable (taint node.kubernetes.io/unschedulable): no addresses or ENIs are attached and no ENI is freed while it drains (AWS_MANAGE_ENIS_NON_SCHEDULABLE=false)"
                        );
                    } else {
                        tracing::info!("node is schedulable: the pool manages ENIs again");
                    }
                    ipam.node_state.set_node_unschedulable(frozen);
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                r = node.changed() => if r.is_err() { return Ok(()) },
            }
        }
    })
}

/// Lays the node's warm-target annotations over the environment's targets (the pool loop is
/// woken to pick them up), or refuses them loudly: an error line, a Warning Event on the
/// aws-node pod, and `ipamd status` / `/v1/address-capacity` say the environment's are in force.
fn follow_warm_targets(ipam: &Ipam, cluster: &k8s::Cluster, facts: &k8s::NodeFacts) {
    let next = match k8s::warm_overrides(&facts.annotations)
        .and_then(|(o, given)| Ok((o.checked(&ipam.settings.targets)?, given)))
    {
        Ok((in_force, annotations)) => NodeWarm {
            in_force,
            annotations,
            refused: None,
        },
        Err(e) => NodeWarm {
            annotations: k8s::WARM_ANNOTATIONS
                .iter()
                .filter_map(|(k, _)| {
                    facts
                        .annotations
                        .get(*k)
                        .map(|v| ((*k).to_owned(), v.clone()))
                })
                .collect(),
            in_force: ipam_core::pool::warm_override::WarmOverrides::default(),
            refused: Some(e.to_string()),
        },
    };
    if next == ipam.node_state.warm() {
        return;
    }
    match &next.refused {
        Some(why) => {
            tracing::error!(annotations = ?next.annotations, refused = %why, "the node's warm-target annotations are refused: the environment's targets are in force");
            cluster.queue_event(
                k8s::PodEvent {
                    warning: true,
                    reason: k8s::REASON_WARM_TARGETS_REFUSED.into(),
                    action: "FollowNode".into(),
                    message: format!(
                        "the node's warm-target annotations are refused ({why}); the environment's targets are in force"
                    ),
                },
                "warm targets refused event",
            );
        }
        None if next.in_force.is_empty() => {
            tracing::info!(
                "no warm-target annotation on the node: the environment's targets are in force"
            );
        }
        None => {
            let t = next.in_force.apply(&ipam.settings.targets);
            tracing::info!(
                annotations = ?next.annotations,
                warm_ip_target = t.warm_ip,
                minimum_ip_target = t.minimum_ip,
                warm_eni_target = t.warm_eni,
                warm_prefix_target = t.warm_prefix,
                "the node's warm-target annotations are in force"
            );
        }
    }
    ipam.node_state.set_warm(next);
    // the pool loop looks at the new targets now, not at its next tick
    ipam.signal.demand();
}
