//! The Node followed while ipamd runs: max-pods from its capacity, the `/v1/eni-configs` name,
//! whether the pool may manage ENIs on it (the cordon), and the node's own warm targets (its
//! `networking.k8s.aws/*-target` annotations, refused loudly when invalid). Must not: call EC2,
//! touch the pools but through the node state.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use std::collections::BTreeMap;

use ipam_core::pool::policy::Targets;
use ipam_core::pool::warm_override::WarmOverrides;

use crate::config::Config;
use crate::ipam::{EniConfigWarm, Ipam, NodeWarm};
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
    // custom networking only: without it no ENIConfig applies to the node (nor is watched)
    let mut eni_configs = config
        .kube
        .custom_network_cfg
        .then(|| cluster.eni_configs());
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
                let name = k8s::eni_config_name(&f, &keys);
                let configs = eni_configs.as_mut().map(|c| c.borrow_and_update().clone());
                let warm_of_config = configs
                    .as_ref()
                    .and_then(|c| c.get(&name))
                    .map(|spec| (name.as_str(), &spec.warm_annotations));
                follow_warm_targets(&ipam, &cluster, &f, warm_of_config);
                let max = k8s::effective_max_pods(override_, f.capacity_pods, Some(table));
                ipam.node_state.set_max_pods(max);
                eni_config_name.send_replace(Some(name));
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
            let configs_changed = async {
                match eni_configs.as_mut() {
                    Some(c) => c.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                r = node.changed() => if r.is_err() { return Ok(()) },
                ok = configs_changed => if !ok {
                    // the ENIConfig watch ended (shutdown): follow the Node alone
                    eni_configs = None;
                },
            }
        }
    })
}

/// The node's warm targets from its own annotations over its ENIConfig's (`eni_config`: the
/// ENIConfig's name and warm annotations, custom networking only) over `env`. PURE. Each level
/// is read on its own and refused as a whole (a refused level counts for nothing, the others
/// stay); a combination the pool could not run with is refused as a whole (the environment's
/// targets are in force), said on the node's level when it gives anything, else on the
/// ENIConfig's.
#[must_use]
pub fn layered_warm(
    node: &BTreeMap<String, String>,
    eni_config: Option<(&str, &BTreeMap<String, String>)>,
    env: &Targets,
) -> NodeWarm {
    let given = |a: &BTreeMap<String, String>| -> Vec<(String, String)> {
        k8s::WARM_ANNOTATIONS
            .iter()
            .filter_map(|(k, _)| a.get(*k).map(|v| ((*k).to_owned(), v.clone())))
            .collect()
    };
    let level = |a: &BTreeMap<String, String>| match k8s::warm_overrides(a) {
        Ok((o, _)) => (o, None),
        Err(e) => (WarmOverrides::default(), Some(e.to_string())),
    };
    let (node_o, node_refused) = level(node);
    let mut warm = NodeWarm {
        in_force: WarmOverrides::default(),
        annotations: given(node),
        refused: node_refused,
        eni_config: None,
    };
    let mut lower = WarmOverrides::default();
    if let Some((name, a)) = eni_config
        && !a.is_empty()
    {
        let (o, refused) = level(a);
        lower = o;
        warm.eni_config = Some(EniConfigWarm {
            name: name.to_owned(),
            annotations: given(a),
            refused,
        });
    }
    match node_o.over(lower).checked(env) {
        Ok(o) => warm.in_force = o,
        Err(e) => {
            let why = format!("{e} (the node's and its ENIConfig's values together)");
            match &mut warm.eni_config {
                Some(c) if warm.annotations.is_empty() => c.refused = Some(why),
                _ => warm.refused = Some(why),
            }
        }
    }
    warm
}

/// Lays the node's (and its ENIConfig's) warm-target annotations over the environment's
/// targets (the pool loop is woken to pick them up), or refuses them loudly: an error line, a
/// Warning Event on the aws-node pod, and `ipamd status` / `/v1/address-capacity` say what is
/// in force instead.
fn follow_warm_targets(
    ipam: &Ipam,
    cluster: &k8s::Cluster,
    facts: &k8s::NodeFacts,
    eni_config: Option<(&str, &BTreeMap<String, String>)>,
) {
    let next = layered_warm(&facts.annotations, eni_config, &ipam.settings.targets);
    if next == ipam.node_state.warm() {
        return;
    }
    let refusals = [
        next.refused
            .as_ref()
            .map(|why| ("the node's".to_owned(), why)),
        next.eni_config.as_ref().and_then(|c| {
            c.refused
                .as_ref()
                .map(|why| (format!("ENIConfig {}'s", c.name), why))
        }),
    ];
    for (whose, why) in refusals.into_iter().flatten() {
        tracing::error!(annotations = ?next.annotations, eni_config = ?next.eni_config, refused = %why, "{whose} warm-target annotations are refused");
        cluster.queue_event(
            k8s::PodEvent {
                warning: true,
                reason: k8s::REASON_WARM_TARGETS_REFUSED.into(),
                action: "FollowNode".into(),
                message: format!("{whose} warm-target annotations are refused ({why})"),
            },
            "warm targets refused event",
        );
    }
    if next.in_force.is_empty() {
        tracing::info!("no warm-target annotation in force: the environment's targets apply");
    } else {
        let t = next.in_force.apply(&ipam.settings.targets);
        tracing::info!(
            annotations = ?next.annotations,
            eni_config = ?next.eni_config.as_ref().map(|c| &c.name),
            warm_ip_target = t.warm_ip,
            minimum_ip_target = t.minimum_ip,
            warm_eni_target = t.warm_eni,
            warm_prefix_target = t.warm_prefix,
            "warm-target annotations are in force (the node's over its ENIConfig's over the environment's)"
        );
    }
    ipam.node_state.set_warm(next);
    // the pool loop looks at the new targets now, not at its next tick
    ipam.signal.demand();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pd: bool) -> Targets {
        Targets {
            warm_eni: 1,
            warm_ip: 0,
            minimum_ip: 0,
            warm_prefix: u32::from(pd),
            prefix_delegation: pd,
            max_enis: 3,
            cidrs_per_eni: 9,
            max_pods: Some(29),
        }
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("networking.k8s.aws/{k}"), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_node_wins_over_its_eniconfig_which_wins_over_the_environment() {
        let node = annotations(&[("warm-ip-target", "2")]);
        let config = annotations(&[("warm-ip-target", "8"), ("minimum-ip-target", "12")]);
        let w = layered_warm(&node, Some(("us-west-2a", &config)), &env(false));
        let t = w.in_force.apply(&env(false));
        assert_eq!((t.warm_ip, t.minimum_ip, t.warm_eni), (2, 12, 1));
        assert_eq!(w.refused, None);
        let c = w.eni_config.unwrap();
        assert_eq!((c.name.as_str(), c.refused), ("us-west-2a", None));
        assert_eq!(c.annotations.len(), 2);
        // no ENIConfig (custom networking off), or one without warm annotations: the node's
        let w = layered_warm(&node, None, &env(false));
        assert_eq!(w.in_force.apply(&env(false)).minimum_ip, 0);
        assert_eq!(w.eni_config, None);
        let w = layered_warm(&node, Some(("x", &BTreeMap::new())), &env(false));
        assert_eq!(w.eni_config, None);
        // the ENIConfig alone
        let w = layered_warm(&BTreeMap::new(), Some(("x", &config)), &env(false));
        assert_eq!(w.in_force.apply(&env(false)).warm_ip, 8);
        assert!(w.annotations.is_empty());
    }

    #[test]
    fn a_refused_level_counts_for_nothing_and_the_others_stay() {
        let node = annotations(&[("warm-ip-target", "lots")]);
        let config = annotations(&[("minimum-ip-target", "12")]);
        let w = layered_warm(&node, Some(("x", &config)), &env(false));
        assert!(w.refused.as_deref().unwrap().contains("lots"), "{w:?}");
        let t = w.in_force.apply(&env(false));
        assert_eq!((t.warm_ip, t.minimum_ip), (0, 12), "the ENIConfig's stays");
        // a refused ENIConfig: the node's stay
        let node = annotations(&[("warm-ip-target", "3")]);
        let config = annotations(&[("minimum-ip-target", "-1")]);
        let w = layered_warm(&node, Some(("x", &config)), &env(false));
        assert_eq!(w.refused, None);
        assert!(w.eni_config.unwrap().refused.is_some());
        assert_eq!(w.in_force.apply(&env(false)).warm_ip, 3);
    }

    #[test]
    fn a_combination_the_pool_cannot_run_with_is_refused_as_a_whole() {
        // with prefix delegation: the ENIConfig sets WARM_PREFIX_TARGET=0 and nothing else
        let config = annotations(&[("warm-prefix-target", "0")]);
        let w = layered_warm(&BTreeMap::new(), Some(("x", &config)), &env(true));
        assert!(w.in_force.is_empty());
        assert!(
            w.eni_config.unwrap().refused.unwrap().contains("together"),
            "said on the ENIConfig's level when the node gives nothing"
        );
        // the node gives something: said on the node's level
        let node = annotations(&[("warm-ip-target", "0")]);
        let w = layered_warm(&node, Some(("x", &config)), &env(true));
        assert!(w.in_force.is_empty());
        assert!(w.refused.unwrap().contains("together"));
    }
}
