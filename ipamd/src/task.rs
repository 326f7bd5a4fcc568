//! A long-running task of the daemon: made by the feature that owns the work, started by the
//! daemon in its one supervised set. Must not: start anything itself, know any feature.

/// A long-running task of the daemon, not started yet: `Daemon::serve` runs every one in one
/// supervised set (the first to fail ends the daemon; all are awaited at shutdown), none
/// detached.
pub struct Task {
    name: &'static str,
    work: std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>,
    /// Dropped when the daemon stops (work that does not watch the daemon's own token).
    drop_on_stop: bool,
}

impl Task {
    /// A named task that ends by itself once the daemon's token (given to it) is cancelled.
    pub fn new(
        name: &'static str,
        work: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> Self {
        Self {
            name,
            work: Box::pin(work),
            drop_on_stop: false,
        }
    }

    /// A named task made before the daemon's token existed (the ports' own): dropped when the
    /// daemon stops, for any reason.
    pub fn until_stopped(
        name: &'static str,
        work: impl std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    ) -> Self {
        Self {
            drop_on_stop: true,
            ..Self::new(name, work)
        }
    }

    /// The task's work alone, for a caller that runs it itself (a test of one feature; the
    /// daemon runs every task in its supervised set).
    #[must_use]
    pub fn into_work(
        self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>> {
        self.work
    }

    /// The task's name, its work and whether it is dropped when the daemon stops.
    #[allow(clippy::type_complexity)]
    pub(crate) fn into_parts(
        self,
    ) -> (
        &'static str,
        std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>> + Send>>,
        bool,
    ) {
        (self.name, self.work, self.drop_on_stop)
    }
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
