//! Address capacity as the cluster sees it: every second the figure of
//! `ipam_core::pool::capacity` from the pool's statistics, targets, node flags and what the
//! subnets said, published as `awscni_address_capacity`, `/v1/address-capacity` (and so
//! `ipamd status`), and, when enabled, the Node condition `networking.k8s.aws/AddressCapacity`
//! (written only when its status changes) and the `NoSchedule` taint
//! `networking.k8s.aws/address-capacity-exhausted` (with the hysteresis of
//! `next_exhaustion`). Owns that task and its view; must not change the pools or decide pool
//! actions.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipam_core::pool::capacity::{
    AddressCapacity, Exhaustion, SubnetRoom, address_capacity, next_exhaustion,
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

/// The subnets' room as ipamd knows it: dry when the pool's last report is a subnet
/// exhaustion; free = the sum of `awscni_subnet_available_ip_addresses` over the subnets of
/// card 0's ENIs when every one of them was listed (subnet discovery's last `DescribeSubnets`;
/// refreshed when an ENI is created), None otherwise.
pub(crate) fn subnet_room(ipam: &Ipam, metrics: &Metrics) -> SubnetRoom {
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
    SubnetRoom { dry, free }
}

/// The figure now (card 0's pool; None before the pool exists).
#[must_use]
pub fn observe(ipam: &Ipam, metrics: &Metrics) -> Option<(AddressCapacity, SubnetRoom)> {
    let stats = ipam.index.pool_stats(0)?;
    let subnet = subnet_room(ipam, metrics);
    let attach = ipam.settings.provisioning
        && !ipam.is_shutting_down()
        && !ipam.node_state.node_unschedulable();
    Some((
        address_capacity(&stats, &ipam.targets(), subnet, attach),
        subnet,
    ))
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
    shutdown: CancellationToken,
) {
    let mut exhaustion = Exhaustion::default();
    let mut condition = WriteState::default();
    let mut taint = WriteState::default();
    let mut condition_retry: Option<Instant> = None;
    let mut taint_retry: Option<Instant> = None;
    let node = publication.cluster.as_ref().map(Cluster::node);
    loop {
        if let Some((cap, subnet)) = observe(&ipam, &metrics) {
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
                let c = k8s::capacity_condition(exhaustion.exhausted, &cap);
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
    let run = run(
        ipam.clone(),
        metrics.clone(),
        board.clone(),
        publication,
        token.clone(),
    );
    crate::task::Task::new("address capacity", async move {
        run.await;
        Ok(())
    })
}
