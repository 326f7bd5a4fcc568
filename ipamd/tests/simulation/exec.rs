//! A one-thread executor the harness steers: every future is polled only when the harness
//! says so, with a waker that just raises the task's flag (tokio's timers, `Notify` and watch
//! channels raise it as they would wake a task). Which runnable task runs next is a seeded
//! choice, so interleavings at every await point (each EC2 call of the fakes yields twice) are
//! part of the search. Dropping a task is the SIGKILL of whatever it was doing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// One future under the harness's control.
pub struct Task<T> {
    pub id: u64,
    /// Scheduling priority (a priority-based run polls the highest runnable task).
    pub prio: u64,
    /// The ipamd instance it belongs to (dropped with it on a crash).
    pub owner: u32,
    pub label: String,
    fut: Pin<Box<dyn Future<Output = T>>>,
    flag: Arc<Flag>,
    waker: Waker,
}

/// The harness's tasks.
pub struct Executor<T> {
    tasks: Vec<Task<T>>,
    next_id: u64,
}

impl<T> Default for Executor<T> {
    fn default() -> Self {
        Self {
            tasks: Vec::new(),
            next_id: 0,
        }
    }
}

impl<T> Executor<T> {
    /// Adds a task, runnable at once.
    pub fn spawn(
        &mut self,
        owner: u32,
        prio: u64,
        label: String,
        fut: impl Future<Output = T> + 'static,
    ) -> u64 {
        self.next_id += 1;
        let flag = Arc::new(Flag(AtomicBool::new(true)));
        let waker = Waker::from(flag.clone());
        self.tasks.push(Task {
            id: self.next_id,
            prio,
            owner,
            label,
            fut: Box::pin(fut),
            flag,
            waker,
        });
        self.next_id
    }

    /// Ids of the tasks whose waker was called since their last poll.
    pub fn runnable(&self) -> Vec<u64> {
        self.tasks
            .iter()
            .filter(|t| t.flag.0.load(Ordering::SeqCst))
            .map(|t| t.id)
            .collect()
    }

    /// The runnable task of highest priority (PCT-style scheduling: one task runs ahead of
    /// the others until a priority change point).
    pub fn highest_runnable(&self) -> Option<u64> {
        self.tasks
            .iter()
            .filter(|t| t.flag.0.load(Ordering::SeqCst))
            .max_by_key(|t| (t.prio, std::cmp::Reverse(t.id)))
            .map(|t| t.id)
    }

    /// A priority change point: task `id` gets priority `prio`.
    pub fn reprioritize(&mut self, id: u64, prio: u64) {
        if let Some(t) = self.tasks.iter_mut().find(|t| t.id == id) {
            t.prio = prio;
        }
    }

    /// Polls task `id` once; its output (and owner, label) when it finished.
    pub fn poll(&mut self, id: u64) -> Option<(u32, String, T)> {
        let i = self.tasks.iter().position(|t| t.id == id)?;
        let t = &mut self.tasks[i];
        t.flag.0.store(false, Ordering::SeqCst);
        let mut cx = Context::from_waker(&t.waker);
        match t.fut.as_mut().poll(&mut cx) {
            Poll::Pending => None,
            Poll::Ready(out) => {
                let t = self.tasks.remove(i);
                Some((t.owner, t.label, out))
            }
        }
    }

    /// Drops every task of `owner` (a SIGKILL): their futures never run again.
    pub fn kill_owner(&mut self, owner: u32) -> Vec<(u64, String)> {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.tasks)
            .into_iter()
            .partition(|t| t.owner == owner);
        self.tasks = kept;
        gone.into_iter().map(|t| (t.id, t.label)).collect()
    }

    pub fn label(&self, id: u64) -> Option<&str> {
        self.tasks
            .iter()
            .find(|t| t.id == id)
            .map(|t| t.label.as_str())
    }

    /// Tasks of `owner` still alive.
    pub fn count_owner(&self, owner: u32) -> usize {
        self.tasks.iter().filter(|t| t.owner == owner).count()
    }
}

/// Returns `Pending` once (waking itself), then `Ready`: an await point the harness can
/// interleave other work at.
pub struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

pub fn yield_now() -> YieldNow {
    YieldNow(false)
}
