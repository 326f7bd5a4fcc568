//! The pool loop: executes the pool's pure decisions (`crate::pool`) against the EC2 port and
//! records their results in [`Ipam`] through its intents: the [`manager::Manager`] grows and
//! shrinks every card's pool (card 0's and, with `ENABLE_MULTI_NIC`, each serving card's, by
//! the same code), the [`reconciler::Reconciler`] brings every pool in line with EC2.
//! Must not: decide (the policy and the reconcile plan do), touch the datastore directly, hold a
//! lock across `.await`.

pub use super::{host_port, manager, reconciler};

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ipam::Ipam;
use crate::pool::ec2_port::EniProvider;
use crate::pool::reconcile_plan::ImdsView;
use host_port::EniHost;
use manager::Manager;
use reconciler::{Outcome, Reconciler};

/// The pool loop for a provider with a hint: first the reconciler restores the releases
/// recorded before a restart (taking out of the pool what a lagging Describe at start put back);
/// then every tick, or at once when an AddNetwork waits, the manager settles the pool (EC2,
/// then host, then `Ipam`) and hands what it did to the reconciler (its releases as values,
/// when it last changed EC2), then the reconciler retries the host set-up of ENIs not
/// host-ready and takes its (self-paced) round. Running all in one task means a reconcile never
/// interleaves with a half-done pool action, and no other task touches host networking of ENIs.
pub async fn run<P: EniProvider + ImdsView, H: EniHost>(
    mut manager: Manager<P, H>,
    mut reconciler: Reconciler,
    ipam: Arc<Ipam>,
    tick: Duration,
    shutdown: CancellationToken,
) {
    reconciler.restore(&ipam);
    let mut interval = ticker(tick);
    while woken(&mut interval, &ipam, manager.host(), &shutdown).await {
        pass(&mut manager, &mut reconciler, &ipam).await;
    }
}

/// One pass of the loop: the manager settles the pool and hands what it did to the
/// reconciler, which retries host set-ups and, when no AddNetwork waits (or a round is due at
/// once: after a start, after EC2 refused an assign the datastore thought had room), takes its
/// round (returned; None when it was not asked). The simulation test drives this very function.
pub async fn pass<P: EniProvider + ImdsView, H: EniHost>(
    manager: &mut Manager<P, H>,
    reconciler: &mut Reconciler,
    ipam: &Ipam,
) -> Option<Outcome> {
    manager.settle(ipam).await;
    reconciler.take_over(manager.hand_over());
    reconciler.ensure_host(ipam, manager.host()).await;
    if ipam.signal.waiting_pods() > 0 && !reconciler.eager {
        return None;
    }
    let span = tracing::debug_span!("reconcile_round");
    let outcome = tracing::Instrument::instrument(
        reconciler.tick(ipam, manager.provider(), manager.host()),
        span,
    )
    .await;
    if let Outcome::Failed(e) = &outcome {
        tracing::warn!(error = %e, "reconcile failed");
    }
    Some(outcome)
}

/// IPv6 mode's node init: the primary ENI's /80, asked of EC2 (which delegates one now if it has
/// none) and handed to the index, where it serves every pod. There is no pool loop in IPv6 mode;
/// this is its one EC2 call.
pub async fn init_ipv6_mode<P: EniProvider>(
    ipam: &Ipam,
    provider: &P,
) -> Result<crate::datastore::V6Prefix, crate::ipam::IpamError> {
    use crate::ipam::IpamError;
    let eni = ipam
        .index
        .read(|ds| {
            ds.eni_views()
                .into_iter()
                .find(|e| e.spec.is_primary)
                .map(|e| e.spec.id)
        })
        .ok_or_else(|| IpamError::Internal("no primary ENI".into()))?;
    let net = provider
        .ipv6_prefix(&eni)
        .await
        .map_err(|e| IpamError::Internal(format!("IPv6 prefix of {eni}: {e}")))?;
    ipam.register_ipv6_prefix(&eni, net)
}

/// IPv6 mode with security groups for pods: there is no pool loop, so every `tick` EC2 is asked for
/// the node's ENIs until the VPC Resource Controller's trunk is there; it is set up on the host (a
/// trunk's set-up: no primary-IP rule) and registered as the node's trunk; then it waits for
/// `shutdown` (a daemon task that ends would end the daemon).
pub async fn await_trunk<P: EniProvider, H: EniHost>(
    ipam: Arc<Ipam>,
    provider: P,
    host: H,
    tick: Duration,
    shutdown: CancellationToken,
) {
    let mut interval = ticker(tick);
    while ipam
        .index
        .read(crate::datastore::DataStore::trunk_eni)
        .is_none()
    {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = interval.tick() => {}
        }
        let enis = match provider.list_enis().await {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(error = %e, "failed to describe attached ENIs");
                continue;
            }
        };
        let Some(trunk) = enis.into_iter().find(|e| e.is_trunk) else {
            continue;
        };
        if let Err(e) = host.setup(&trunk).await {
            tracing::debug!(eni = %trunk.id, error = %e, "failed to set up the trunk ENI");
            continue;
        }
        match ipam.index.adopt_eni(&trunk, true) {
            Ok(()) => tracing::info!(eni = %trunk.id, "ENI set up (trunk)"),
            Err(e) => tracing::warn!(eni = %trunk.id, error = %e, "trunk ENI not registered"),
        }
    }
    shutdown.cancelled().await;
}

/// The loop's clock: a tick every `tick`, a late tick delays the next rather than bursting.
pub(super) fn ticker(tick: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

/// Waits for the next tick or for an AddNetwork that waits on the pool; false once ipamd
/// shuts down.
pub(super) async fn woken<H: EniHost>(
    interval: &mut tokio::time::Interval,
    ipam: &Ipam,
    host: &H,
    shutdown: &CancellationToken,
) -> bool {
    // a link announcement wakes the loop only while an ENI waits for its host set-up (pods'
    // veths announce links all the time)
    let awaiting_host = !ipam.index.enis_awaiting_host().is_empty();
    tokio::select! {
        () = shutdown.cancelled() => return false,
        _ = interval.tick() => {}
        () = ipam.signal.demanded() => {}
        () = host.links_changed(), if awaiting_host => {}
    }
    !ipam.is_shutting_down()
}

/// The pool loop as a task of the daemon (None in IPv6 mode without security groups for pods: no
/// pool manager there). In IPv6 mode with them the trunk is still awaited and set up.
pub fn task<P, H>(
    config: &crate::config::Config,
    ipam: &Arc<Ipam>,
    provider: P,
    host: H,
    custom_network: Option<crate::k8s::CustomNetwork>,
    inner: &tokio_util::sync::CancellationToken,
) -> Option<crate::task::Task>
where
    P: EniProvider + crate::pool::reconcile_plan::ImdsView + 'static,
    H: EniHost + 'static,
{
    use crate::task::Task;
    let (token, tick) = (inner.clone(), config.pool.pool_tick);
    if config.family.is_v6_only() {
        // No extra ENIs, no IPv4 addresses in IPv6 mode: only the trunk, with security groups
        // for pods.
        config.kube.pod_eni?;
        let ipam = ipam.clone();
        return Some(Task::new("trunk ENI (IPv6 mode)", async move {
            await_trunk(ipam, provider, host, tick, token).await;
            Ok(())
        }));
    }
    let ipam = ipam.clone();
    let dual_stack = config.family == crate::config::AddressFamily::DualStack;
    let adaptive = (config.pool.warm_pool_policy == crate::config::pool::WarmPoolPolicy::Adaptive)
        .then(|| super::adaptive::AdaptivePool::new(super::adaptive::WOKEN_REACTION));
    // Before the socket serves: addresses released before a restart that EC2 may still
    // describe (and the start-up Describe registered again) are withdrawn now, so no ADD
    // answered once the socket serves can get one (the pool loop's own restore is then a
    // no-op).
    let mut reconciler = reconciler::Reconciler::new();
    reconciler.restore(&ipam);
    Some(Task::new("pool loop", async move {
        run(
            manager::Manager::with_host(provider, host)
                .with_custom_network(custom_network)
                .with_every_ipv6_prefix(dual_stack)
                .with_adaptive(adaptive),
            reconciler,
            ipam,
            tick,
            token,
        )
        .await;
        Ok(())
    }))
}
