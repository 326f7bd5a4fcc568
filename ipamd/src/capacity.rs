//! Address capacity as the cluster sees it: every second the figure of
//! `ipam_core::pool::capacity` from the pool's statistics, targets, node flags and what the
//! subnets said, published as `awscni_address_capacity`, `/v1/address-capacity` (and so
//! `ipamd status`), and, when enabled, the Node condition `networking.k8s.aws/AddressCapacity`
//! (written only when its status changes) and the `NoSchedule` taint
//! `networking.k8s.aws/address-capacity-exhausted` (with the hysteresis of
//! `next_exhaustion`). With `IPAMD_SUBNET_INVENTORY_CONFIGMAP` it follows cni-metrics-helper's
//! subnet inventory ConfigMap and lets `ipam_core::pool::subnet_inventory::subnet_room` weigh its
//! recount against ipamd's own listing and publish its forecast. Owns that task and its view;
//! must not change the pools or decide pool actions.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipam_core::pool::capacity::{
    AddressCapacity, Exhaustion, SubnetRoom, address_capacity, next_exhaustion,
};
use ipam_core::pool::subnet_inventory::{
    self, DATA_KEY, InventoryDocument, InventoryUse, OwnListing, rfc3339,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::ipam::{Ipam, IpamError};
use crate::k8s::{self, Cluster};
use crate::metrics::Metrics;

/// How often the figure is computed.
pub const TICK: Duration = Duration::from_secs(1);
/// Back-off after a refused write (403 without the chart's RBAC, API server away).
pub const RETRY: Duration = Duration::from_secs(5);

/// What Kubernetes publication is enabled (`IPAMD_ADDRESS_CAPACITY_CONDITION`,
/// `IPAMD_ADDRESS_CAPACITY_TAINT`), with the client when there is one.
#[derive(Debug, Clone)]
pub struct Publication {
    /// The API client (None: nothing is published on the Node).
    pub cluster: Option<Cluster>,
    /// Publish the condition.
    pub condition: bool,
    /// Taint the node while exhausted.
    pub taint: bool,
    /// cni-metrics-helper's inventory ConfigMap to follow (`IPAMD_SUBNET_INVENTORY_CONFIGMAP`).
    pub inventory: Option<crate::config::ConfigMapRef>,
}

/// What became of cni-metrics-helper's inventory, as introspection and the log say it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct InventoryState {
    /// `<namespace>/<name>` followed; None: not configured.
    config_map: Option<String>,
    /// `used`, `ignored`, `pending`, `missing`, `malformed`, `refused`.
    state: &'static str,
    /// Why (ignored, missing, malformed, refused).
    reason: Option<String>,
    /// The document's `observedAt`.
    observed_at: Option<String>,
}

/// The followed ConfigMap read into a document, or why not (`state`, `reason`).
fn read_inventory(read: &k8s::ConfigMapRead) -> Result<InventoryDocument, (&'static str, String)> {
    match read {
        k8s::ConfigMapRead::Pending => Err(("pending", "not read yet".into())),
        k8s::ConfigMapRead::Missing => Err((
            "missing",
            "the ConfigMap does not exist (is cni-metrics-helper running with SUBNET_INVENTORY_CONFIGMAP?)".into(),
        )),
        k8s::ConfigMapRead::Failed(e) => Err((
            "refused",
            format!("{e} (the aws-vpc-cni chart grants get/list/watch on it with subnetInventory.configMap)"),
        )),
        k8s::ConfigMapRead::Found(data) => match data.get(DATA_KEY) {
            None => Err((
                "malformed",
                subnet_inventory::InventoryError::NoDataKey.to_string(),
            )),
            Some(text) => InventoryDocument::parse(text).map_err(|e| ("malformed", e.to_string())),
        },
    }
}

/// One write's last outcome, as introspection shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct WriteState {
    /// The state last written (condition: True; taint: on).
    written: Option<bool>,
    /// Why the last write failed, while it does.
    error: Option<String>,
}

/// The last figure and what was published, for `/v1/address-capacity`.
#[derive(Debug, Clone, Default)]
struct View {
    capacity: Option<AddressCapacity>,
    subnet: SubnetRoom,
    inventory: InventoryState,
    exhausted: bool,
    condition_enabled: bool,
    condition: WriteState,
    taint_enabled: bool,
    taint: WriteState,
}

/// The shared view of the task's last pass (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct Board(Arc<Mutex<View>>);

impl Board {
    fn with<R>(&self, f: impl FnOnce(&mut View) -> R) -> R {
        f(&mut self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// `/v1/address-capacity` (ours): the figure, what was published, and the node's warm
    /// targets (in force, or refused).
    #[must_use]
    pub fn view(&self, ipam: &Ipam) -> Value {
        let v = self.with(|v| v.clone());
        let warm = ipam.node_state.warm();
        let t = ipam.targets();
        let write = |enabled: bool, w: &WriteState, on: &str, off: &str| {
            json!({
                "enabled": enabled,
                "published": w.written.map(|b| if b { on } else { off }),
                "error": w.error,
            })
        };
        json!({
            "obtainable": v.capacity.map(|c| c.obtainable),
            "free": v.capacity.map(|c| c.free),
            "cooling": v.capacity.map(|c| c.cooling),
            "fromEc2": v.capacity.map(|c| c.from_ec2),
            "bound": v.capacity.map(|c| c.bound.as_str()),
            "subnetDry": v.subnet.dry,
            "subnetFree": v.subnet.free,
            "subnetExhaustionForecast": v.subnet.exhaustion_at.map(rfc3339),
            "subnetInventory": {
                "configMap": v.inventory.config_map,
                "state": v.inventory.config_map.as_ref().map(|_| v.inventory.state),
                "reason": v.inventory.reason,
                "observedAt": v.inventory.observed_at,
            },
            "exhausted": v.exhausted,
            "condition": {
                "type": k8s::ADDRESS_CAPACITY_CONDITION,
                "state": write(v.condition_enabled, &v.condition, "True", "False"),
            },
            "taint": {
                "key": k8s::ADDRESS_CAPACITY_TAINT,
                "state": write(v.taint_enabled, &v.taint, "on", "off"),
            },
            "warmTargets": {
                "WARM_IP_TARGET": t.warm_ip,
                "MINIMUM_IP_TARGET": t.minimum_ip,
                "WARM_ENI_TARGET": t.warm_eni,
                "WARM_PREFIX_TARGET": t.warm_prefix,
                "fromNode": warm.refused.is_none() && !warm.in_force.is_empty(),
                "annotations": warm.annotations.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                "refused": warm.refused,
                "eniConfig": warm.eni_config.as_ref().map(|c| json!({
                    "name": c.name,
                    "annotations": c.annotations.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                    "refused": c.refused,
                })),
            },
        })
    }
}

/// What ipamd's own listing says of the subnets of card 0's ENIs, and those subnets: dry when
/// the pool's last report is a subnet exhaustion; free = the sum of
/// `awscni_subnet_available_ip_addresses` over them when every one of them was listed (subnet
/// discovery's last `DescribeSubnets`; refreshed when an ENI is created), None otherwise; listed
/// at = the oldest of those listings.
fn own_listing(ipam: &Ipam, metrics: &Metrics) -> (OwnListing, std::collections::BTreeSet<String>) {
    let report = ipam.signal.last_report();
    let dry = [report.blocked, report.last_failure]
        .iter()
        .flatten()
        .any(|e| matches!(e, IpamError::SubnetExhausted(_)));
    let subnets: std::collections::BTreeSet<String> = ipam.index.read(|ds| {
        ds.eni_views()
            .into_iter()
            .filter(|e| !e.spec.is_trunk && !e.spec.is_efa && !e.spec.is_excluded)
            .map(|e| e.spec.subnet_id)
            .collect()
    });
    let free = subnets
        .iter()
        .map(|s| {
            metrics
                .subnet_available_ip_addresses
                .get([s.as_str()])
                .map(|v| v.value)
        })
        .sum::<Option<f64>>()
        .filter(|_| !subnets.is_empty())
        .map(|f| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = f.max(0.0).min(f64::from(u32::MAX)) as u32;
            n
        });
    let listed_at = {
        let at = metrics
            .subnet_listed_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        subnets
            .iter()
            .map(|s| at.get(s).copied())
            .collect::<Option<Vec<_>>>()
            .and_then(|v| v.into_iter().min())
    };
    (
        OwnListing {
            dry,
            free,
            listed_at,
        },
        subnets,
    )
}

/// The figure now (card 0's pool; None before the pool exists), with the subnets' room it was
/// computed with and what became of cni-metrics-helper's inventory (`inventory`: the document
/// followed, None without one).
#[must_use]
pub fn observe(
    ipam: &Ipam,
    metrics: &Metrics,
    inventory: Option<&InventoryDocument>,
) -> Option<(AddressCapacity, SubnetRoom, InventoryUse)> {
    let stats = ipam.index.pool_stats(0)?;
    let (own, subnets) = own_listing(ipam, metrics);
    let t = ipam.targets();
    let (subnet, used) =
        subnet_inventory::subnet_room(own, inventory, &subnets, t.prefix_delegation, ipam.now());
    let attach = ipam.settings.provisioning
        && !ipam.is_shutting_down()
        && !ipam.node_state.node_unschedulable();
    Some((address_capacity(&stats, &t, subnet, attach), subnet, used))
}

/// Follows the inventory ConfigMap: what became of it this pass (`doc`: the document read, or
/// why not; `used`: what the choice made of it), logged once per change.
fn inventory_state(
    config_map: &str,
    doc: &Result<InventoryDocument, (&'static str, String)>,
    used: Option<&InventoryUse>,
) -> InventoryState {
    let (state, reason) = match (doc, used) {
        (Err((state, why)), _) => (*state, Some(why.clone())),
        (Ok(_), Some(InventoryUse::Ignored(why))) => ("ignored", Some(why.clone())),
        (Ok(_), _) => ("used", None),
    };
    InventoryState {
        config_map: Some(config_map.to_owned()),
        state,
        reason,
        observed_at: doc.as_ref().ok().map(|d| rfc3339(d.observed_at)),
    }
}

/// Logs `now` when it differs from `before` in what it says (never every pass).
fn say_inventory(before: &InventoryState, now: &InventoryState) {
    if (before.state, &before.reason) == (now.state, &now.reason) {
        return;
    }
    let cm = now.config_map.as_deref().unwrap_or_default();
    let reason = now.reason.as_deref().unwrap_or_default();
    match now.state {
        "used" => {
            tracing::info!(config_map = cm, observed_at = ?now.observed_at, "cni-metrics-helper's subnet inventory is the subnets' free space in the address capacity")
        }
        "pending" => {}
        "ignored" if !reason.starts_with("stale") => tracing::info!(
            config_map = cm,
            reason,
            "cni-metrics-helper's subnet inventory not used: ipamd's own figure"
        ),
        "ignored" | "missing" => tracing::warn!(
            config_map = cm,
            state = now.state,
            reason,
            "cni-metrics-helper's subnet inventory not used: ipamd's own figure"
        ),
        _ => tracing::error!(
            config_map = cm,
            state = now.state,
            reason,
            "cni-metrics-helper's subnet inventory cannot be used: ipamd's own figure"
        ),
    }
}

/// Whether the condition must be written again because the Node shows it otherwise than it
/// was written (`seen`: the Node watch's status of it, `Some(None)` when the Node has none;
/// None before the watch has the Node) for [`RETRY`] on end: the watch lags behind a write, so a
/// difference counts only once it lasts. Forgets what was written when so (the next write
/// puts it back). The condition is ipamd's own, as kubelet's are kubelet's.
fn reassert(
    state: &mut WriteState,
    differs_since: &mut Option<Instant>,
    seen: Option<Option<String>>,
    now: Instant,
) -> bool {
    let (Some(written), Some(seen)) = (state.written, seen) else {
        *differs_since = None;
        return false;
    };
    let want = if written { "True" } else { "False" };
    if seen.as_deref() == Some(want) {
        *differs_since = None;
        return false;
    }
    let since = *differs_since.get_or_insert(now);
    if now.duration_since(since) < RETRY {
        return false;
    }
    *differs_since = None;
    state.written = None;
    true
}

/// Logs `e` as the refusal of `what` unless the same refusal was logged last.
fn refused(state: &mut WriteState, what: &str, rbac: &str, e: &k8s::KubeError) {
    let text = e.to_string();
    if state.error.as_deref() != Some(text.as_str()) {
        tracing::error!(error = %text, "cannot write the {what} on the Node ({rbac}); ipamd keeps serving pods, the Node does not show it");
    }
    state.error = Some(text);
}

/// The task's loop until `shutdown`.
async fn run(
    ipam: Arc<Ipam>,
    metrics: Arc<Metrics>,
    board: Board,
    publication: Publication,
    inventory: Option<(String, tokio::sync::watch::Receiver<k8s::ConfigMapRead>)>,
    shutdown: CancellationToken,
) {
    let mut exhaustion = Exhaustion::default();
    let mut condition = WriteState::default();
    let mut taint = WriteState::default();
    let mut condition_retry: Option<Instant> = None;
    let mut condition_differs_since: Option<Instant> = None;
    let mut taint_retry: Option<Instant> = None;
    let node = publication.cluster.as_ref().map(Cluster::node);
    let mut inventory_rx = inventory;
    let mut inventory_doc: Option<Result<InventoryDocument, (&'static str, String)>> = None;
    let mut inventory_said = InventoryState::default();
    loop {
        if let Some((_, rx)) = &mut inventory_rx
            && (inventory_doc.is_none() || rx.has_changed().unwrap_or(false))
        {
            inventory_doc = Some(read_inventory(&rx.borrow_and_update()));
        }
        let doc = inventory_doc.as_ref().and_then(|d| d.as_ref().ok());
        if let Some((cap, subnet, used)) = observe(&ipam, &metrics, doc) {
            // the adaptive warm pool is bounded by the same room (`Demand::subnet_free`)
            ipam.node_state.set_subnet_free(subnet.known_free());
            let inventory_now = match (&inventory_rx, &inventory_doc) {
                (Some((cm, _)), Some(d)) => inventory_state(cm, d, Some(&used)),
                _ => InventoryState::default(),
            };
            say_inventory(&inventory_said, &inventory_now);
            inventory_said = inventory_now.clone();
            let was = exhaustion.exhausted;
            exhaustion = next_exhaustion(exhaustion, cap.obtainable, ipam.now());
            if exhaustion.exhausted != was {
                if exhaustion.exhausted {
                    tracing::warn!(
                        free = cap.free,
                        cooling = cap.cooling,
                        bound = cap.bound.as_str(),
                        "this node can obtain no further address for new pods"
                    );
                } else {
                    tracing::info!(
                        obtainable = cap.obtainable,
                        "this node can obtain addresses for new pods again"
                    );
                }
            }
            metrics.address_capacity.set([], f64::from(cap.obtainable));
            metrics
                .address_capacity_exhausted
                .set([], if exhaustion.exhausted { 1.0 } else { 0.0 });
            let now = Instant::now();
            if let (Some(cluster), true) = (&publication.cluster, publication.condition) {
                let seen = node
                    .as_ref()
                    .and_then(|n| n.borrow().as_ref().map(|f| f.capacity_condition.clone()));
                if reassert(&mut condition, &mut condition_differs_since, seen, now) {
                    tracing::warn!(
                        condition = k8s::ADDRESS_CAPACITY_CONDITION,
                        "the Node's address-capacity condition was changed or removed by someone else; writing it again"
                    );
                }
                let c = k8s::capacity_condition(exhaustion.exhausted, &cap, subnet.exhaustion_at);
                if condition.written != Some(c.available)
                    && condition_retry.is_none_or(|t| now >= t)
                {
                    match cluster
                        .set_node_condition(
                            k8s::ADDRESS_CAPACITY_CONDITION,
                            c.available,
                            c.reason,
                            &c.message,
                        )
                        .await
                    {
                        Ok(()) => {
                            tracing::info!(condition = k8s::ADDRESS_CAPACITY_CONDITION, status = c.available, reason = c.reason, message = %c.message, "node condition written");
                            condition = WriteState {
                                written: Some(c.available),
                                error: None,
                            };
                            condition_retry = None;
                        }
                        Err(e) => {
                            refused(
                                &mut condition,
                                "address-capacity condition",
                                "the chart grants patch on nodes/status with addressCapacity.condition=true",
                                &e,
                            );
                            condition_retry = Some(now + RETRY);
                        }
                    }
                }
            }
            if let (Some(cluster), true, Some(node)) =
                (&publication.cluster, publication.taint, &node)
            {
                let tainted = node.borrow().as_ref().map(|f| {
                    f.taint_keys
                        .iter()
                        .any(|k| k == k8s::ADDRESS_CAPACITY_TAINT)
                });
                let want = exhaustion.exhausted;
                if tainted.is_some_and(|t| t != want) && taint_retry.is_none_or(|t| now >= t) {
                    let r = if want {
                        cluster
                            .add_node_taint(k8s::ADDRESS_CAPACITY_TAINT, "NoSchedule")
                            .await
                    } else {
                        cluster.remove_node_taint(k8s::ADDRESS_CAPACITY_TAINT).await
                    };
                    match r {
                        Ok(_) => {
                            tracing::info!(
                                taint = k8s::ADDRESS_CAPACITY_TAINT,
                                on = want,
                                "address-capacity taint {}",
                                if want {
                                    "added: no new pod is scheduled here until addresses can be had"
                                } else {
                                    "removed"
                                }
                            );
                            taint = WriteState {
                                written: Some(want),
                                error: None,
                            };
                            taint_retry = None;
                        }
                        Err(e) => {
                            refused(
                                &mut taint,
                                "address-capacity taint",
                                "the chart grants patch on nodes with addressCapacity.taint=true",
                                &e,
                            );
                            taint_retry = Some(now + RETRY);
                        }
                    }
                } else if let Some(t) = tainted
                    && taint.error.is_none()
                {
                    taint.written = Some(t);
                }
            }
            board.with(|v| {
                v.capacity = Some(cap);
                v.subnet = subnet;
                v.inventory = inventory_now;
                v.exhausted = exhaustion.exhausted;
                v.condition = condition.clone();
                v.taint = taint.clone();
            });
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(TICK) => {}
        }
    }
}

/// [`run`] as a task of the daemon.
pub fn task(
    ipam: &Arc<Ipam>,
    metrics: &Arc<Metrics>,
    board: &Board,
    publication: Publication,
    token: &CancellationToken,
) -> crate::task::Task {
    board.with(|v| {
        v.condition_enabled = publication.cluster.is_some() && publication.condition;
        v.taint_enabled = publication.cluster.is_some() && publication.taint;
    });
    // cni-metrics-helper's inventory: followed beside the loop, read by it every pass
    let (inventory, follow) = match (&publication.cluster, &publication.inventory) {
        (Some(cluster), Some(cm)) => {
            let (tx, rx) = tokio::sync::watch::channel(k8s::ConfigMapRead::Pending);
            let cluster = cluster.clone();
            let cm = cm.clone();
            let token = token.clone();
            (
                Some((cm.to_string(), rx)),
                Some(async move {
                    cluster
                        .follow_config_map(&cm.namespace, &cm.name, tx, token)
                        .await;
                }),
            )
        }
        _ => (None, None),
    };
    let run = run(
        ipam.clone(),
        metrics.clone(),
        board.clone(),
        publication,
        inventory,
        token.clone(),
    );
    crate::task::Task::new("address capacity", async move {
        match follow {
            Some(follow) => {
                tokio::join!(run, follow);
            }
            None => run.await,
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_changed_by_someone_else_is_written_again_once_the_difference_lasts() {
        let t0 = Instant::now();
        let mut state = WriteState {
            written: Some(true),
            error: None,
        };
        let mut since = None;
        let said = |s: &str| Some(Some(s.to_owned()));
        // as written: nothing to do
        assert!(!reassert(&mut state, &mut since, said("True"), t0));
        // changed: the watch may lag behind the write, so not at once
        assert!(!reassert(&mut state, &mut since, said("False"), t0));
        assert!(!reassert(
            &mut state,
            &mut since,
            said("False"),
            t0 + RETRY / 2
        ));
        assert_eq!(state.written, Some(true));
        // back before RETRY: forgotten
        assert!(!reassert(
            &mut state,
            &mut since,
            said("True"),
            t0 + RETRY / 2
        ));
        assert!(!reassert(&mut state, &mut since, said("False"), t0 + RETRY));
        assert!(!reassert(
            &mut state,
            &mut since,
            said("False"),
            t0 + RETRY + RETRY / 2
        ));
        // lasting RETRY: written again
        assert!(reassert(
            &mut state,
            &mut since,
            said("False"),
            t0 + RETRY * 2
        ));
        assert_eq!(state.written, None);
        // removed from the Node: the same
        state.written = Some(false);
        assert!(!reassert(&mut state, &mut since, Some(None), t0));
        assert!(reassert(&mut state, &mut since, Some(None), t0 + RETRY));
        // no Node seen yet, or nothing written: nothing to do
        state.written = Some(true);
        assert!(!reassert(&mut state, &mut since, None, t0));
        state.written = None;
        assert!(!reassert(
            &mut state,
            &mut since,
            said("False"),
            t0 + RETRY * 9
        ));
    }
}
