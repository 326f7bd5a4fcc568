//! Conntrack-safe handouts without listing the conntrack table on every ADD: before an answer
//! names an address, no conntrack entry of the node may name it (a previous owner's NAT
//! binding would steer its flow to the new pod). One task owns the subscription to the
//! table's new entries, the [`Ledger`] of addresses no entry names, and the table walks (one
//! walk lists the whole table: ~10 ms on a 262,144-bucket table whatever it holds). A handout
//! whose addresses the ledger proves clean is answered at once; the others wait for the next
//! walk, which serves every handout waiting then; free addresses the ledger cannot prove clean
//! (the pool's new ones, those a DelNetwork released while an entry may name them) are walked
//! in the background (at most once per [`BACKGROUND_EVERY`]), so that their handout finds them
//! clean.
//! Must not: decide which addresses are free or whose they are; walk for an address no
//! handout or release named (a walk deletes entries: never a live pod's).
//!
//! Without events (subscription refused, `net.netfilter.nf_conntrack_events=0`) every handout
//! walks, as before the ledger; coalescing still applies. docs/host-networking.md,
//! "Conntrack-safe address reuse".

mod ledger;

use std::collections::HashSet;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dataplane::conntrack::{Forgotten, NewEntries, Seen};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::host::{HostError, HostNetwork};
use crate::task::Task;
pub use ledger::Ledger;

/// The fewest time between two background walks (released addresses only; a handout's walk
/// never waits for it).
pub const BACKGROUND_EVERY: Duration = Duration::from_secs(1);
/// How long after subscribing a walk starts to prove addresses clean: a packet whose entry was
/// made before the subscription (and so is never announced) is confirmed or gone by then.
const SETTLE: Duration = Duration::from_millis(100);
/// Handouts and releases queued for the task.
const QUEUE: usize = 1024;

/// The node's free addresses now (the index's; IPv4 of every card), for the background walks.
pub type FreeAddresses = Arc<dyn Fn() -> Vec<IpAddr> + Send + Sync>;

/// How a handout's addresses were made safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handout {
    /// The ledger proved that no entry names them: no walk.
    Clean,
    /// A walk deleted the entries naming them (`deleted` of the walk, whose addresses may be
    /// several handouts').
    Walked(Forgotten),
}

/// Why a handout's addresses could not be made safe: the handout must be refused.
#[derive(Debug, thiserror::Error)]
pub enum FlowsError {
    /// The walk failed (ctnetlink unreachable, a delete refused); shared by every handout the
    /// walk served.
    #[error("list or clear the conntrack table")]
    Walk(#[source] Arc<HostError>),
    /// The flows task has stopped (the daemon is stopping).
    #[error("the conntrack task has stopped")]
    Stopped,
}

/// What the task did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowStats {
    /// Table walks (handouts' and background).
    pub walks: u64,
    /// Handouts answered from the ledger, without a walk.
    pub clean_handouts: u64,
    /// Handouts that waited for a walk.
    pub walked_handouts: u64,
}

#[derive(Debug, Default)]
struct Counters {
    walks: AtomicU64,
    clean_handouts: AtomicU64,
    walked_handouts: AtomicU64,
}

enum Ask {
    Handout {
        addresses: Vec<IpAddr>,
        reply: oneshot::Sender<Result<Handout, FlowsError>>,
    },
    Released(Vec<IpAddr>),
}

/// The handle the pod verbs use (cheap to clone).
#[derive(Debug, Clone)]
pub struct Flows {
    asks: mpsc::Sender<Ask>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Ask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Handout { addresses, .. } => f.debug_tuple("Handout").field(addresses).finish(),
            Self::Released(a) => f.debug_tuple("Released").field(a).finish(),
        }
    }
}

impl Flows {
    /// Returns once no conntrack entry of the node names `addresses` (which a handout is about
    /// to name in its answer): at once when the ledger proves it, else after a walk.
    pub async fn before_handout(&self, addresses: Vec<IpAddr>) -> Result<Handout, FlowsError> {
        if addresses.is_empty() {
            return Ok(Handout::Clean);
        }
        let (reply, answer) = oneshot::channel();
        self.asks
            .send(Ask::Handout { addresses, reply })
            .await
            .map_err(|_| FlowsError::Stopped)?;
        answer.await.map_err(|_| FlowsError::Stopped)?
    }

    /// `addresses` were released: walked in the background if an entry may name them. Never
    /// waits (a full queue skips the background walk: the handout walks then).
    pub fn released(&self, addresses: Vec<IpAddr>) {
        if !addresses.is_empty() {
            let _ = self.asks.try_send(Ask::Released(addresses));
        }
    }

    /// What the task did so far.
    #[must_use]
    pub fn stats(&self) -> FlowStats {
        FlowStats {
            walks: self.counters.walks.load(Ordering::Relaxed),
            clean_handouts: self.counters.clean_handouts.load(Ordering::Relaxed),
            walked_handouts: self.counters.walked_handouts.load(Ordering::Relaxed),
        }
    }
}

/// The flows task over `host`'s namespace, and its handle; it ends with `stop`. `free` lists the
/// free addresses the background walks may clean (never one a pod holds).
#[must_use]
pub fn start(
    host: Arc<HostNetwork>,
    free: FreeAddresses,
    stop: &CancellationToken,
) -> (Flows, Task) {
    let (asks, rx) = mpsc::channel(QUEUE);
    let counters = Arc::new(Counters::default());
    let worker = Worker {
        host,
        ledger: Ledger::new(),
        events: None,
        subscribed_at: None,
        waiting: Vec::new(),
        background: HashSet::new(),
        last_background: None,
        free,
        counters: counters.clone(),
    };
    let stop = stop.clone();
    (
        Flows { asks, counters },
        Task::new("conntrack", worker.run(rx, stop)),
    )
}

struct Waiting {
    addresses: Vec<IpAddr>,
    reply: oneshot::Sender<Result<Handout, FlowsError>>,
}

/// A walk in progress: the handouts it serves, what it asked about, its result.
type WalkFuture = Pin<Box<dyn Future<Output = Result<Forgotten, HostError>> + Send>>;

struct InProgress {
    work: WalkFuture,
    served: Vec<Waiting>,
    background: Vec<IpAddr>,
    proves: bool,
}

struct Worker {
    host: Arc<HostNetwork>,
    ledger: Ledger,
    events: Option<NewEntries>,
    subscribed_at: Option<Instant>,
    /// Handouts waiting for the next walk.
    waiting: Vec<Waiting>,
    /// Released addresses an entry may name, for the next background walk.
    background: HashSet<IpAddr>,
    last_background: Option<Instant>,
    /// The free addresses, swept into `background` when not clean.
    free: FreeAddresses,
    counters: Arc<Counters>,
}

enum Woke {
    Stop,
    Walked(Result<Forgotten, HostError>),
    Ask(Option<Ask>),
    Events(Result<(), dataplane::conntrack::ConntrackError>),
    BackgroundDue,
    Sweep,
}

impl Worker {
    async fn run(
        mut self,
        mut asks: mpsc::Receiver<Ask>,
        stop: CancellationToken,
    ) -> anyhow::Result<()> {
        self.subscribe().await;
        let mut walk: Option<InProgress> = None;
        let mut sweep =
            tokio::time::interval_at((Instant::now() + SETTLE).into(), BACKGROUND_EVERY);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if walk.is_none() {
                walk = self.next_walk().await;
            }
            let due = self.background_due();
            let woke = {
                let ledger = &mut self.ledger;
                let events = self.events.as_ref();
                tokio::select! {
                    biased;
                    () = stop.cancelled() => Woke::Stop,
                    r = async { walk.as_mut().map(|w| &mut w.work).expect("guarded").await }, if walk.is_some() => Woke::Walked(r),
                    a = asks.recv() => Woke::Ask(a),
                    r = async {
                        events
                            .expect("guarded")
                            .wait(|seen| note(ledger, seen))
                            .await
                    }, if events.is_some() => Woke::Events(r),
                    () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now).into()), if walk.is_none() && due.is_some() => Woke::BackgroundDue,
                    _ = sweep.tick(), if events.is_some() => Woke::Sweep,
                }
            };
            match woke {
                Woke::Stop | Woke::Ask(None) => {
                    for w in self.waiting.drain(..) {
                        let _ = w.reply.send(Err(FlowsError::Stopped));
                    }
                    return Ok(());
                }
                Woke::Walked(result) => {
                    let done = walk.take().expect("a walk ended");
                    self.walk_ended(done, result);
                }
                Woke::Ask(Some(ask)) => self.ask(ask).await,
                Woke::Events(Ok(())) | Woke::BackgroundDue => {}
                Woke::Sweep => self.sweep(),
                Woke::Events(Err(e)) => {
                    tracing::warn!(error = %e, "conntrack events unreadable: every handout lists the conntrack table from now on");
                    self.events = None;
                    self.ledger.unwatched();
                }
            }
        }
    }

    /// Opens the subscription (a refusal leaves the ledger unwatched: every handout walks).
    async fn subscribe(&mut self) {
        if !self.host.conntrack_events_sent().await {
            tracing::info!(
                "conntrack events are off or unreadable in this namespace (net.netfilter.nf_conntrack_events): every handout lists the conntrack table"
            );
            return;
        }
        match self.host.watch_new_entries() {
            Ok(events) => {
                self.events = Some(events);
                self.subscribed_at = Some(Instant::now());
                self.ledger.watching();
            }
            Err(e) => {
                tracing::warn!(error = %e, "no subscription to new conntrack entries: every handout lists the conntrack table");
            }
        }
    }

    /// Reads every event queued now: an entry confirmed before this call is in the ledger
    /// after it. The kernel's switch is read too (events turned off: nothing is clean).
    async fn sync(&mut self) {
        let Some(events) = &self.events else {
            return;
        };
        let ledger = &mut self.ledger;
        if let Err(e) = events.drain(|seen| note(ledger, seen)) {
            tracing::warn!(error = %e, "conntrack events unreadable: every handout lists the conntrack table from now on");
            self.events = None;
            self.ledger.unwatched();
            return;
        }
        let sent = self.host.conntrack_events_sent().await;
        if !sent && self.ledger.is_watching() {
            tracing::warn!(
                "net.netfilter.nf_conntrack_events turned off: every handout lists the conntrack table"
            );
            self.ledger.unwatched();
        } else if sent && !self.ledger.is_watching() {
            // Events missed meanwhile: unwatched() forgot every address; walks prove again.
            self.ledger.watching();
        }
    }

    async fn ask(&mut self, ask: Ask) {
        match ask {
            Ask::Handout { addresses, reply } => {
                // Handed out now: never in a background walk (its next owner's entries).
                for a in &addresses {
                    self.background.remove(a);
                }
                self.sync().await;
                if self.ledger.all_clean(&addresses) {
                    self.counters.clean_handouts.fetch_add(1, Ordering::Relaxed);
                    let _ = reply.send(Ok(Handout::Clean));
                } else {
                    self.waiting.push(Waiting { addresses, reply });
                }
            }
            Ask::Released(addresses) => {
                // An entry made before the release (the pod's own flows) counts.
                self.sync().await;
                self.background
                    .extend(addresses.into_iter().filter(|a| !self.ledger.is_clean(a)));
            }
        }
    }

    /// Free addresses the ledger cannot prove clean go to the next background walk (a handout
    /// of one meanwhile takes it out again).
    fn sweep(&mut self) {
        if !self.ledger.is_watching() {
            return;
        }
        let free = (self.free)();
        self.background
            .extend(free.into_iter().filter(|a| !self.ledger.is_clean(a)));
    }

    fn background_due(&self) -> Option<Instant> {
        if self.background.is_empty() {
            return None;
        }
        Some(
            self.last_background
                .map_or_else(Instant::now, |at| at + BACKGROUND_EVERY),
        )
    }

    /// The next walk: every waiting handout the ledger cannot answer (with the background
    /// addresses), or the background addresses once due; None when nothing is to walk.
    async fn next_walk(&mut self) -> Option<InProgress> {
        if self.waiting.is_empty() && self.background_due().is_none_or(|d| d > Instant::now()) {
            return None;
        }
        self.sync().await;
        let (clean, waiting): (Vec<_>, Vec<_>) = self
            .waiting
            .drain(..)
            .partition(|w| self.ledger.all_clean(&w.addresses));
        for w in clean {
            self.counters.clean_handouts.fetch_add(1, Ordering::Relaxed);
            let _ = w.reply.send(Ok(Handout::Clean));
        }
        let background_due = self.background_due().is_some_and(|d| d <= Instant::now());
        if waiting.is_empty() && !background_due {
            return None;
        }
        let background: Vec<IpAddr> = self.background.drain().collect();
        if !background.is_empty() {
            self.last_background = Some(Instant::now());
        }
        let mut asked: Vec<IpAddr> = waiting
            .iter()
            .flat_map(|w| w.addresses.iter().copied())
            .chain(background.iter().copied())
            .collect();
        asked.sort_unstable();
        asked.dedup();
        let proves = self.subscribed_at.is_some_and(|at| at.elapsed() >= SETTLE);
        self.ledger.walk_begins(asked.iter().copied());
        self.counters.walks.fetch_add(1, Ordering::Relaxed);
        let host = self.host.clone();
        Some(InProgress {
            work: Box::pin(async move { host.forget_conntrack(asked).await }),
            served: waiting,
            background,
            proves,
        })
    }

    fn walk_ended(&mut self, done: InProgress, result: Result<Forgotten, HostError>) {
        match result {
            Ok(forgotten) => {
                self.ledger.walk_ends(done.proves);
                if forgotten.deleted > 0 {
                    tracing::info!(
                        deleted = forgotten.deleted,
                        handouts = done.served.len(),
                        released = done.background.len(),
                        "conntrack entries naming released or handed-out addresses deleted"
                    );
                }
                for w in done.served {
                    self.counters
                        .walked_handouts
                        .fetch_add(1, Ordering::Relaxed);
                    let _ = w.reply.send(Ok(Handout::Walked(forgotten)));
                }
            }
            Err(e) => {
                self.ledger.walk_ends(false);
                tracing::warn!(error = %e, "conntrack walk failed");
                // Tried again by the next background walk (unless handed out meanwhile).
                self.background.extend(done.background);
                let shared = Arc::new(e);
                for w in done.served {
                    let _ = w.reply.send(Err(FlowsError::Walk(shared.clone())));
                }
            }
        }
    }
}

fn note(ledger: &mut Ledger, seen: Seen) {
    match seen {
        Seen::Named(addresses) => ledger.named(&addresses),
        Seen::Lost => {
            tracing::debug!(
                "conntrack events lost (receive buffer overflow): every address is walked again"
            );
            ledger.lost();
        }
    }
}
