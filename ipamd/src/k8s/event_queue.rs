//! The bounded queue between the code that reports an Event without waiting for the API
//! server (node init's rp_filter warning, `MissingIAMPermissions` from the EC2 client's hook,
//! custom networking's `ENIConfigNotUsable`) and the cluster's one event poster (a task of
//! [`super::ClusterTasks`]). Owns the queue and its count of dropped Events. Must not: block
//! the caller (a full queue drops the Event, counted and logged), post anything itself, or
//! decide which Events exist or whether one is a duplicate (the cluster decides before
//! queueing).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::PodEvent;

/// How many Events may wait for the poster. Duplicates never wait (the cluster's dedup runs
/// before the queue), so this holds a long API-server outage's distinct Events.
pub const EVENT_QUEUE_CAPACITY: usize = 64;

/// An Event waiting for the poster.
#[derive(Debug)]
pub struct QueuedEvent {
    /// The Event.
    pub event: PodEvent,
    /// What the log calls it when it cannot be posted (e.g. "rp_filter event").
    pub what: &'static str,
}

/// The sending side: cheap to clone, never waits.
#[derive(Debug, Clone)]
pub struct EventQueue {
    tx: mpsc::Sender<QueuedEvent>,
    dropped: Arc<AtomicU64>,
}

/// Why an Event was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotQueued {
    /// [`EVENT_QUEUE_CAPACITY`] Events already wait for the poster.
    #[error("the event queue is full")]
    Full,
    /// The poster has stopped (ipamd is stopping) or was never started.
    #[error("the event poster has stopped")]
    Closed,
}

impl EventQueue {
    /// A queue of `capacity` and its receiving end (the poster's).
    #[must_use]
    pub fn new(capacity: usize) -> (Self, mpsc::Receiver<QueuedEvent>) {
        let (tx, rx) = mpsc::channel(capacity);
        (
            Self {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
            },
            rx,
        )
    }

    /// Hands `event` to the poster without waiting. When it cannot, the Event is dropped:
    /// counted ([`Self::dropped`]) and logged as a warning naming `what`; the Event is given
    /// back with the reason.
    pub fn offer(&self, event: PodEvent, what: &'static str) -> Result<(), (NotQueued, PodEvent)> {
        let (why, back) = match self.tx.try_send(QueuedEvent { event, what }) {
            Ok(()) => return Ok(()),
            Err(mpsc::error::TrySendError::Full(q)) => (NotQueued::Full, q.event),
            Err(mpsc::error::TrySendError::Closed(q)) => (NotQueued::Closed, q.event),
        };
        let dropped = self
            .dropped
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        tracing::warn!(reason = %back.reason, dropped, "{what} not posted: {why}");
        Err((why, back))
    }

    /// Events dropped so far (queue full or poster stopped).
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: usize) -> PodEvent {
        PodEvent {
            warning: true,
            reason: super::super::REASON_MISSING_IAM.into(),
            action: format!("ec2:Api{n}"),
            message: "m".into(),
        }
    }

    /// A full queue drops at once (never waits) and counts; what was queued reaches the
    /// receiver in order; a stopped poster is a drop too.
    #[test]
    fn a_full_queue_drops_counts_and_never_waits() {
        let (queue, mut rx) = EventQueue::new(2);
        assert!(queue.offer(event(0), "e").is_ok());
        assert!(queue.offer(event(1), "e").is_ok());
        let (why, back) = queue.offer(event(2), "e").unwrap_err();
        assert_eq!((why, back), (NotQueued::Full, event(2)));
        assert_eq!(queue.dropped(), 1);
        assert_eq!(rx.try_recv().unwrap().event, event(0));
        assert_eq!(rx.try_recv().unwrap().event, event(1));
        drop(rx);
        assert_eq!(queue.offer(event(3), "e").unwrap_err().0, NotQueued::Closed);
        assert_eq!(queue.dropped(), 2);
    }
}
