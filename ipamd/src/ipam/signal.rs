//! The pool signal: the handshake between AddNetwork calls that found no address and the pool
//! loop (demand, the waiting count, pool actions in flight, the last pool report, the IPv6 /80
//! asks of dual-stack pods). Must not: touch the pools, decide, hold a lock across `.await`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::{Notify, watch};

use super::IpamError;

/// The last thing the pool manager reports to waiting AddNetwork calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolEvent {
    /// Bumped on every pool change or failed attempt.
    pub generation: u64,
    /// Set when growth is impossible right now (a hard limit).
    pub blocked: Option<IpamError>,
    /// The last pool action's failure that is no hard limit (EC2 throttled, IAM, custom
    /// networking, EC2 down): the reason a waiting pod is given when its wait ends with
    /// nothing. Cleared when the pool changes.
    pub last_failure: Option<IpamError>,
}

/// The wait/demand/publish handshake (see the module header).
#[derive(Debug)]
pub struct PoolSignal {
    demand: Notify,
    waiting: AtomicU32,
    /// The adaptive pool's warm target: an ADD that leaves fewer available addresses on card 0
    /// wakes the pool loop at once instead of at its next tick (0: off, the static policy).
    low_water: AtomicU32,
    /// Pool actions (EC2 allocations) in flight; AddNetwork waits past its timeout for them.
    pool_busy: AtomicU32,
    events: watch::Sender<PoolEvent>,
    /// The /80s dual-stack AddNetwork calls wait for: asked of EC2 by the pool loop, which
    /// hands the outcome in ([`Self::prefix_registered`], [`Self::prefix_refused`]).
    v6_asks: Mutex<PrefixAsks>,
}

/// ENIs whose /80 is wanted, and the last refusal per ENI.
#[derive(Debug, Default)]
struct PrefixAsks {
    wanted: BTreeSet<String>,
    failed: BTreeMap<String, String>,
}

impl Default for PoolSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl PoolSignal {
    /// No demand, nobody waiting, nothing reported.
    #[must_use]
    pub fn new() -> Self {
        let (events, _) = watch::channel(PoolEvent::default());
        Self {
            demand: Notify::new(),
            waiting: AtomicU32::new(0),
            low_water: AtomicU32::new(0),
            pool_busy: AtomicU32::new(0),
            events,
            v6_asks: Mutex::new(PrefixAsks::default()),
        }
    }

    fn asks(&self) -> MutexGuard<'_, PrefixAsks> {
        self.v6_asks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Pods waiting for an address.
    #[must_use]
    pub fn waiting_pods(&self) -> u32 {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Resolves when an AddNetwork asks for an allocation.
    pub async fn demanded(&self) {
        self.demand.notified().await;
    }

    /// Asks the pool loop for an allocation now.
    pub fn demand(&self) {
        self.demand.notify_one();
    }

    /// Sets the low-water mark ([`Self::refill_wanted`]); 0 turns it off.
    pub fn set_low_water(&self, available: u32) {
        self.low_water.store(available, Ordering::SeqCst);
    }

    /// Whether `available` addresses on card 0 are below the low-water mark (never when it is
    /// off): the pool loop should grow the pool now.
    #[must_use]
    pub fn refill_wanted(&self, available: u32) -> bool {
        available < self.low_water.load(Ordering::SeqCst)
    }

    /// Wakes every task waiting in [`Self::demanded`] (shutdown).
    pub(super) fn wake_all(&self) {
        self.demand.notify_waiters();
    }

    /// Counts the caller as waiting for as long as the guard lives: a cancelled call (client
    /// gone, gRPC deadline, stream reset) drops its future and with it the count.
    pub(super) fn waiting(&self) -> WaitingGuard<'_> {
        WaitingGuard::new(&self.waiting)
    }

    /// Marks a pool action (EC2 allocation) in flight until the guard is dropped; waiting
    /// AddNetwork calls outlast their timeout for it (up to [`super::BUSY_POOL_WAIT`]).
    pub fn pool_action(&self) -> PoolActionInFlight<'_> {
        self.pool_busy.fetch_add(1, Ordering::SeqCst);
        PoolActionInFlight(&self.pool_busy)
    }

    /// True while a pool action runs or a dual-stack pod waits for an ENI's /80.
    #[must_use]
    pub(super) fn busy(&self) -> bool {
        self.pool_busy.load(Ordering::SeqCst) > 0 || !self.asks().wanted.is_empty()
    }

    /// The pool's last report (what blocks growth now, the last failed action), for the
    /// address capacity.
    #[must_use]
    pub fn last_report(&self) -> PoolEvent {
        self.events.borrow().clone()
    }

    /// The pool reports, for an AddNetwork's wait.
    pub(super) fn subscribe(&self) -> watch::Receiver<PoolEvent> {
        self.events.subscribe()
    }

    /// Publishes a pool change (or a hard limit) to waiting AddNetwork calls.
    pub fn publish(&self, blocked: Option<IpamError>) {
        self.events.send_modify(|e| {
            e.generation += 1;
            e.blocked = blocked;
            e.last_failure = None;
        });
    }

    /// Publishes a failed pool action that is no hard limit: waiting calls keep waiting, and
    /// are given this reason if their wait ends with nothing.
    pub fn publish_failure(&self, failure: IpamError) {
        self.events.send_modify(|e| {
            e.generation += 1;
            e.blocked = None;
            e.last_failure = Some(failure);
        });
    }

    /// Wakes waiting AddNetwork calls and lifts the last limit report, so they retry: an
    /// address became assignable.
    pub(super) fn publish_assignable(&self) {
        self.events.send_modify(|e| {
            e.generation += 1;
            e.blocked = None;
        });
    }

    /// Wakes waiting AddNetwork calls without changing the last limit report (an ENI's /80
    /// registered or refused).
    fn publish_unblocked(&self) {
        self.events.send_modify(|e| e.generation += 1);
    }

    // ---- the IPv6 /80 asks of dual-stack pods --------------------------------------------

    /// A dual-stack AddNetwork needs `eni_id`'s /80: asks the pool loop for it (forgetting an
    /// earlier failure, so it is asked of EC2 again) and wakes the loop.
    pub(super) fn want_ipv6_prefix(&self, eni_id: &str) {
        {
            let mut asks = self.asks();
            asks.failed.remove(eni_id);
            asks.wanted.insert(eni_id.to_owned());
        }
        self.demand();
    }

    /// Why EC2 refused `eni_id`'s /80 since the last ask, if it did.
    pub(super) fn ipv6_prefix_failure(&self, eni_id: &str) -> Option<String> {
        self.asks().failed.get(eni_id).cloned()
    }

    /// `eni_id`'s /80 is registered: no longer asked, and waiting calls retry.
    pub(super) fn prefix_registered(&self, eni_id: &str) {
        {
            let mut asks = self.asks();
            asks.wanted.remove(eni_id);
            asks.failed.remove(eni_id);
        }
        self.publish_unblocked();
    }

    /// Records that EC2 refused `eni_id`'s /80 (`error`): AddNetwork calls that wait for it fail
    /// with it, and the pool loop asks again only when another AddNetwork needs it.
    pub fn prefix_refused(&self, eni_id: &str, error: &str) {
        {
            let mut asks = self.asks();
            asks.wanted.remove(eni_id);
            asks.failed.insert(
                eni_id.to_owned(),
                format!("IPv6 prefix of {eni_id}: {error}"),
            );
        }
        self.publish_unblocked();
    }

    /// The ENIs whose /80 an AddNetwork waits for, and those whose last ask EC2 refused.
    pub(super) fn prefix_asks(&self) -> (Vec<String>, BTreeSet<String>) {
        let asks = self.asks();
        (
            asks.wanted.iter().cloned().collect(),
            asks.failed.keys().cloned().collect(),
        )
    }
}

/// Counts a pool action in flight while it lives ([`PoolSignal::pool_action`]).
#[derive(Debug)]
pub struct PoolActionInFlight<'a>(&'a AtomicU32);

impl Drop for PoolActionInFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One AddNetwork counted in [`PoolSignal::waiting_pods`] for as long as it lives.
#[derive(Debug)]
pub(super) struct WaitingGuard<'a>(&'a AtomicU32);

impl<'a> WaitingGuard<'a> {
    fn new(count: &'a AtomicU32) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
