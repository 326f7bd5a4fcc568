//! Start-up readiness as the rest of the cluster can see it: the start-up phases ipamd reaches
//! (`awscni_startup_phase_seconds`: first ENI with addresses, first address it could hand out)
//! and, with `REMOVE_STARTUP_TAINT`, the removal of the node's start-up taint once an ADD could
//! be answered, so the scheduler sends no pod to a node that would fail it. Owns that rule and
//! its task; must not change the datastore or decide pool actions.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ipam::Ipam;
use crate::k8s::{Cluster, NodeFacts};
use crate::metrics::Metrics;

/// How often readiness is looked at while something is still to be reached.
pub const POLL: Duration = Duration::from_millis(250);
/// Back-off after a failed taint removal (403 without the chart's `patch` on nodes, API down).
pub const RETRY: Duration = Duration::from_secs(5);

pub use crate::ipam::Capacity;

/// What to do about the start-up taint. Pure.
#[must_use]
pub fn remove_taint(key: Option<&str>, facts: Option<&NodeFacts>, capacity: Capacity) -> bool {
    match (key, facts) {
        (Some(key), Some(f)) => capacity.can_assign && f.taint_keys.iter().any(|k| k == key),
        _ => false,
    }
}

/// Follows readiness until shutdown (never returns before it: a finished task ends the
/// daemon): records the phases once, and while `cluster` and `key`
/// are given removes the taint each time the Node carries it and ipamd can hand out an
/// address (a bootstrap that adds it again after a reboot, with ipamd restarted, is handled
/// the same way). Never re-adds it.
pub async fn run(
    ipam: Arc<Ipam>,
    metrics: Arc<Metrics>,
    taint: Option<(Cluster, String)>,
    shutdown: CancellationToken,
) {
    let mut node = taint.as_ref().map(|(c, _)| c.node());
    let mut phases_done = false;
    loop {
        let capacity = ipam.index.capacity();
        if !phases_done {
            if capacity.has_addresses {
                metrics.startup_phase("first_eni");
            }
            if capacity.can_assign {
                metrics.startup_phase("first_address");
                phases_done = true;
            }
        }
        // what to wait for next: a short poll, a back-off, or a change of the Node
        let mut sleep = (!phases_done).then_some(POLL);
        match (&taint, &node) {
            (Some((cluster, key)), Some(node)) => {
                let facts = node.borrow().clone();
                let tainted = facts
                    .as_ref()
                    .is_some_and(|f| f.taint_keys.iter().any(|k| k == key));
                if remove_taint(Some(key), facts.as_ref(), capacity) {
                    match cluster.remove_node_taint(key).await {
                        Ok(true) => {
                            metrics.startup_phase("startup_taint_removed");
                            tracing::info!(taint = %key, "ipamd can hand out addresses: start-up taint removed from the node");
                        }
                        Ok(false) => {}
                        Err(e) => {
                            tracing::error!(taint = %key, error = %e, "cannot remove the start-up taint from the node (the chart grants patch on nodes with startupTaint.enabled); pods stay off this node");
                            sleep = Some(RETRY);
                        }
                    }
                } else if tainted {
                    // tainted, nothing to hand out yet: look again soon
                    sleep = Some(POLL);
                }
            }
            // nothing more to follow; a task that ends stops the daemon: wait for shutdown
            _ if phases_done => return shutdown.cancelled().await,
            _ => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = async {
                match sleep {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            } => {}
            r = async {
                match node.as_mut() {
                    Some(n) => n.changed().await,
                    None => std::future::pending().await,
                }
            } => if r.is_err() { node = None; },
        }
    }
}

/// [`run`] as a task of the daemon: the start-up phases, and `REMOVE_STARTUP_TAINT` (started
/// once the socket is bound).
pub fn task(
    ipam: &Arc<Ipam>,
    metrics: &Arc<crate::metrics::Metrics>,
    taint: Option<(crate::k8s::Cluster, String)>,
    token: &tokio_util::sync::CancellationToken,
) -> crate::task::Task {
    let run = run(ipam.clone(), metrics.clone(), taint, token.clone());
    crate::task::Task::new("readiness", async move {
        run.await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(keys: &[&str]) -> NodeFacts {
        NodeFacts {
            taint_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            ..NodeFacts::default()
        }
    }

    #[test]
    fn the_taint_goes_only_once_an_address_can_be_handed_out() {
        let key = "example.com/agent-not-ready";
        let ready = Capacity {
            has_addresses: true,
            can_assign: true,
        };
        let not_yet = Capacity {
            has_addresses: true,
            can_assign: false,
        };
        assert!(remove_taint(Some(key), Some(&facts(&[key])), ready));
        assert!(!remove_taint(Some(key), Some(&facts(&[key])), not_yet));
        assert!(!remove_taint(Some(key), Some(&facts(&["other"])), ready));
        assert!(!remove_taint(Some(key), None, ready), "Node not read yet");
        assert!(
            !remove_taint(None, Some(&facts(&[key])), ready),
            "not configured"
        );
    }
}
