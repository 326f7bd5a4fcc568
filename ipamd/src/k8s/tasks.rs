//! The Kubernetes client's own long-running work, as [`super::Cluster::connect`] makes it: the
//! Node watch, the ENIConfig watch and the event poster, named and not started
//! ([`ClusterTasks`]), and their supervision: the composition root runs them beside the rest of
//! the daemon ([`ClusterTasks::beside`]) from before the API-server wait until the daemon has
//! stopped. Must not: spawn anything it does not own and await, decide anything, or end the
//! daemon on an API-server outage (the watches retry with back-off; only a task that ends on
//! its own, or panics, is a failure).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// One task's work: runs until its token is cancelled.
type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A task of the Kubernetes client stopped while ipamd still ran.
#[derive(Debug, thiserror::Error)]
pub enum TaskFailed {
    /// It returned before it was told to stop (a watch stream that ended).
    #[error("kubernetes task {name} ended while ipamd ran")]
    Ended {
        /// The task.
        name: &'static str,
    },
    /// It panicked.
    #[error("kubernetes task {name} panicked")]
    Panicked {
        /// The task.
        name: &'static str,
        /// What the runtime said.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// The Kubernetes client's long-running work, made by [`super::Cluster::connect`] and not
/// started: each one ends once the token given to `connect` is cancelled, or once
/// [`Self::beside`] has seen the daemon stop. Dropped unstarted, nothing runs (the Node and
/// ENIConfig channels then stay at their initial values, queued Events are dropped).
pub struct ClusterTasks {
    tasks: Vec<(&'static str, Work)>,
    stop: CancellationToken,
}

impl std::fmt::Debug for ClusterTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTasks")
            .field("tasks", &self.names())
            .finish_non_exhaustive()
    }
}

impl Default for ClusterTasks {
    /// No tasks (no Kubernetes API configured).
    fn default() -> Self {
        Self::new(CancellationToken::new())
    }
}

impl ClusterTasks {
    /// No tasks yet; those pushed end when `stop` is cancelled.
    pub(super) fn new(stop: CancellationToken) -> Self {
        Self {
            tasks: Vec::new(),
            stop,
        }
    }

    /// The token every task watches.
    pub(super) fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Adds a named task (it must end once [`Self::stop_token`] is cancelled).
    pub(super) fn push(
        &mut self,
        name: &'static str,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        self.tasks.push((name, Box::pin(work)));
    }

    /// The tasks' names, in start order.
    #[must_use]
    pub fn names(&self) -> Vec<&'static str> {
        self.tasks.iter().map(|(name, _)| *name).collect()
    }

    /// Runs every task in one [`JoinSet`] owned here until they have all ended: normally once
    /// the token given to `connect` is cancelled. The first to end on its own (or panic) is a
    /// failure: the others are stopped and awaited, and it is returned. Dropping the future
    /// aborts the tasks (the set is owned, never detached).
    pub async fn run(self) -> Result<(), TaskFailed> {
        let Self { tasks, stop } = self;
        let mut set = JoinSet::new();
        let mut names = HashMap::new();
        for (name, work) in tasks {
            let handle = set.spawn(async move {
                work.await;
                name
            });
            names.insert(handle.id(), name);
        }
        let mut first = Ok(());
        while let Some(joined) = set.join_next_with_id().await {
            let failed = match joined {
                Ok(_) if stop.is_cancelled() => None,
                Ok((_, name)) => Some(TaskFailed::Ended { name }),
                Err(source) => Some(TaskFailed::Panicked {
                    name: names.get(&source.id()).copied().unwrap_or("?"),
                    source,
                }),
            };
            if let Some(failed) = failed {
                stop.cancel();
                if first.is_ok() {
                    first = Err(failed);
                }
            }
        }
        first
    }

    /// Runs `daemon` with these tasks beside it, both driven here, none detached: the tasks
    /// start first (the daemon's API-server wait and its Node wait read what the watches
    /// deliver) and run in a [`JoinSet`] this future owns ([`Self::run`]). When the daemon
    /// returns, for whatever reason, the tasks are stopped and awaited before this returns.
    /// A task that fails first ends the daemon as a failed task of its own set does: `shutdown`
    /// is cancelled (the daemon stops gracefully: no new ENI/IP changes, its tasks awaited, its
    /// socket removed) and the task's failure is returned.
    ///
    /// Why beside, not in the daemon's own set: the daemon's set starts only once the socket is
    /// bound, long after the watches must run; this keeps `Daemon::serve` unchanged and still
    /// gives every task one owner that awaits it.
    pub async fn beside<T>(
        self,
        shutdown: &CancellationToken,
        daemon: impl Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        let stop = self.stop.clone();
        let (tasks, result) = tokio::join!(
            async {
                let r = self.run().await;
                if let Err(e) = &r {
                    tracing::error!(error = %e, "stopping ipamd");
                    shutdown.cancel();
                }
                r
            },
            async {
                let r = daemon.await;
                stop.cancel();
                r
            },
        );
        tasks?;
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn until(stop: CancellationToken) {
        stop.cancelled().await;
    }

    /// The tasks run while the daemon runs and are stopped and awaited when it returns, with
    /// its result, whether it succeeded or failed; the caller's token is left alone.
    #[tokio::test]
    async fn the_tasks_run_beside_the_daemon_and_are_awaited_when_it_returns() {
        for fails in [false, true] {
            let shutdown = CancellationToken::new();
            let mut tasks = ClusterTasks::new(shutdown.child_token());
            let (started_tx, started_rx) = tokio::sync::oneshot::channel();
            let (ended_tx, mut ended_rx) = tokio::sync::oneshot::channel::<()>();
            let stop = tasks.stop_token();
            tasks.push("watch", async move {
                let _ = started_tx.send(());
                stop.cancelled().await;
                let _ = ended_tx.send(());
            });
            let result = tasks
                .beside(&shutdown, async {
                    started_rx
                        .await
                        .expect("the task started before the daemon ran");
                    if fails {
                        anyhow::bail!("daemon failed")
                    }
                    Ok(7)
                })
                .await;
            assert_eq!(
                result.map_err(|e| e.to_string()),
                if fails {
                    Err("daemon failed".to_owned())
                } else {
                    Ok(7)
                }
            );
            assert!(ended_rx.try_recv().is_ok(), "the task was awaited");
            assert!(!shutdown.is_cancelled());
        }
    }

    /// A task that ends on its own stops the daemon gracefully (its token is cancelled, the
    /// daemon's own result is awaited) and is the error returned; the other tasks are stopped.
    #[tokio::test]
    async fn a_task_that_ends_on_its_own_stops_the_daemon() {
        let shutdown = CancellationToken::new();
        let mut tasks = ClusterTasks::new(shutdown.child_token());
        let stop = tasks.stop_token();
        tasks.push("Node watch", until(stop));
        tasks.push("event poster", async {});
        let daemon_saw = shutdown.clone();
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            tasks.beside(&shutdown, async move {
                daemon_saw.cancelled().await;
                Ok(())
            }),
        )
        .await
        .expect("the daemon was stopped");
        assert_eq!(
            result.map_err(|e| e.to_string()),
            Err("kubernetes task event poster ended while ipamd ran".to_owned())
        );
    }

    /// Shutdown ends the tasks without a failure; no tasks (no Kubernetes API) is just the
    /// daemon.
    #[tokio::test]
    async fn shutdown_is_no_failure_and_no_tasks_is_just_the_daemon() {
        let shutdown = CancellationToken::new();
        let mut tasks = ClusterTasks::new(shutdown.child_token());
        let stop = tasks.stop_token();
        tasks.push("Node watch", until(stop));
        assert_eq!(tasks.names(), ["Node watch"]);
        shutdown.cancel();
        tasks.run().await.expect("stopped, not failed");

        let shutdown = CancellationToken::new();
        let r = ClusterTasks::default()
            .beside(&shutdown, async { Ok("served") })
            .await;
        assert_eq!(r.unwrap(), "served");
        assert!(!shutdown.is_cancelled());
    }
}
