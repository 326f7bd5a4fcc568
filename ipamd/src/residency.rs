//! Code residency: once start-up is over, and then whenever a burst of work (an EC2 call
//! sequence, a re-sync) has mapped more code and is over, ipamd unmaps the pages of its code and
//! read-only file data (the binary's, and shared libraries' in a dynamic build) that it mapped,
//! so what stays resident is what the steady state runs again. The pages go back to the page
//! cache, clean and shared; the next call of a function maps its page again (a minor fault).
//! Owns that one system call, the rule of which mappings it may touch (file-backed, never
//! writable, without a single private (copied) page) and the rule of when ([`Watch`]); and,
//! from start-up's end, reading those mappings on demand ([`read_on_demand`], [`drop_cached`]):
//! a page is resident because ipamd touched it, not because its 64 KiB window was cached. Must not
//! touch the heap, stacks, writable data or anything ipamd mapped on purpose
//! (docs/performance.md, "Code residency").

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ipam::Ipam;
use crate::metrics::Metrics;

/// How often the watch looks when no EC2 burst is open: at the count of finished EC2 calls (one
/// atomic load) and at the resident file-backed size (`RssFile` of `/proc/self/status`, one short
/// read). A finished EC2 call wakes it at once (`Metrics::ec2_call_done`).
pub const LOOK: Duration = Duration::from_secs(1);
/// How often it looks while an EC2 burst is open (calls finished since the last burst was dealt
/// with): the burst's end is seen within this of [`EC2_QUIET`].
pub const QUICK_LOOK: Duration = Duration::from_millis(100);
/// An EC2 burst (a growing or shrinking pool's calls, a reconcile's Describe) is over when no EC2
/// call has finished for this long: the SDK path it mapped is given back then, if it grew the
/// working set by [`GROWTH_KIB`], instead of staying mapped until the periodic rule sees it
/// settle. Calls of one pool action follow each other within milliseconds; an ENI attachment's
/// wait is the longest gap inside a burst (1–2 s in the simulated VPC's fleet), and a release
/// inside it costs only the refaults of the calls after it. (1 s, looked at every second, until
/// round 12: a node's SDK code stayed mapped for 1–2 s after every burst, ~1.5 MiB above its
/// steady state; docs/performance.md.)
pub const EC2_QUIET: Duration = Duration::from_millis(300);
/// How often the periodic rule compares the resident file-backed size with the last one: work
/// other than EC2 (a gRPC burst's concurrency paths, a re-sync's parsing) is given back once its
/// growth settles over this period.
pub const CHECK: Duration = Duration::from_secs(10);
/// Growth of the resident file-backed size since the last release that is worth giving back
/// (a burst's SDK code, a re-sync's parsing: several hundred KiB each).
pub const GROWTH_KIB: u64 = 512;
/// A change below this between two periodic checks counts as settled: the burst that mapped the
/// code is over (the steady state's own refaults after a release are a few windows).
pub const SETTLED_KIB: u64 = 64;
/// A working set that grew and keeps growing is given back this often all the same. A release
/// costs the next calls a minor fault per 64 KiB window they touch: tens of microseconds in all.
pub const EVERY: Duration = Duration::from_secs(300);
/// How often start-up's end is looked for (the first address ipamd can hand out).
const POLL: Duration = Duration::from_millis(250);

/// When to release after start-up: a pure decision over what the watch reads every [`LOOK`]:
/// the resident file-backed size and the count of EC2 calls finished. Releases when the size
/// grew by [`GROWTH_KIB`] since the last release and either an EC2 burst since then is over (no
/// call finished for [`EC2_QUIET`]), or the size stopped growing (changed by less than
/// [`SETTLED_KIB`] over one [`CHECK`]), or grew and [`EVERY`] has passed since the last release.
/// ADD/DEL alone never trigger the EC2 rule: their code is the steady state's, and releasing it
/// after every pause would make the next pod's ADD pay the refaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watch {
    /// Resident file-backed KiB read right after the last release.
    after_release_kib: u64,
    /// Resident file-backed KiB at the previous periodic check.
    last_kib: u64,
    /// Time since the last release.
    since_release: Duration,
    /// Time since the previous periodic check.
    since_check: Duration,
    /// EC2 calls finished when a burst was last dealt with (released, or too small to).
    ec2_seen: u64,
    /// EC2 calls finished at the previous look.
    ec2_last: u64,
    /// How long that count has not moved.
    ec2_quiet: Duration,
}

impl Watch {
    /// The watch right after a release that left `kib` resident, `ec2_calls` EC2 calls finished.
    #[must_use]
    pub fn released(kib: u64, ec2_calls: u64) -> Self {
        Self {
            after_release_kib: kib,
            last_kib: kib,
            since_release: Duration::ZERO,
            since_check: Duration::ZERO,
            ec2_seen: ec2_calls,
            ec2_last: ec2_calls,
            ec2_quiet: Duration::ZERO,
        }
    }

    /// How long until the next look: [`QUICK_LOOK`] while an EC2 burst is open (calls finished
    /// since a burst was last dealt with), else [`LOOK`] (or sooner, when a call finishes).
    #[must_use]
    pub fn next_look(&self) -> Duration {
        if self.ec2_last == self.ec2_seen {
            LOOK
        } else {
            QUICK_LOOK
        }
    }

    /// One look, `elapsed` after the previous one, reading `kib` resident and `ec2_calls`
    /// finished: whether to release now.
    pub fn check(&mut self, kib: u64, ec2_calls: u64, elapsed: Duration) -> bool {
        self.since_release += elapsed;
        let grown = kib >= self.after_release_kib + GROWTH_KIB;
        if ec2_calls == self.ec2_last {
            self.ec2_quiet += elapsed;
        } else {
            self.ec2_last = ec2_calls;
            self.ec2_quiet = Duration::ZERO;
        }
        if ec2_calls != self.ec2_seen && self.ec2_quiet >= EC2_QUIET {
            // a burst is over; a small one's code waits for the periodic rule, with the next
            self.ec2_seen = ec2_calls;
            if grown {
                return true;
            }
        }
        self.since_check += elapsed;
        if self.since_check < CHECK {
            return false;
        }
        self.since_check = Duration::ZERO;
        let settled = kib.abs_diff(self.last_kib) < SETTLED_KIB;
        self.last_kib = kib;
        grown && (settled || self.since_release >= EVERY)
    }
}

/// The `RssFile` line of a `/proc/<pid>/status` text, in KiB. Pure.
#[must_use]
pub fn rss_file_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssFile:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

fn own_rss_file_kib() -> std::io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    rss_file_kib(&status).ok_or_else(|| std::io::Error::other("no RssFile in /proc/self/status"))
}

/// One mapping of `/proc/self/smaps` this module may give back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Its addresses.
    pub range: Range<usize>,
    /// Its file.
    pub path: String,
    /// Resident now, in KiB.
    pub rss_kib: u64,
}

/// The mappings of a `/proc/<pid>/smaps` text whose pages may be given back: backed by a file
/// (an absolute path, not `[heap]`, `[stack]`, `[vdso]` or an anonymous region), not writable
/// (so never written since it was mapped as it is now), without any anonymous page (a private
/// copy made before it was write-protected, such as relocated data: unmapping it would lose the
/// copy), and resident at all. Unparsable blocks are skipped. Pure.
#[must_use]
pub fn releasable(smaps: &str) -> Vec<Mapping> {
    eligible(smaps)
        .into_iter()
        .filter(|m| m.rss_kib > 0)
        .collect()
}

/// The ranges of the mappings of a `/proc/<pid>/smaps` text whose kind [`releasable`] accepts,
/// resident or not (right after a release none is). Pure.
#[must_use]
pub fn mappings(smaps: &str) -> Vec<Range<usize>> {
    eligible(smaps).into_iter().map(|m| m.range).collect()
}

/// [`releasable`] without the residency condition.
fn eligible(smaps: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    let mut current: Option<(Mapping, bool)> = None; // (mapping, eligible so far)
    let finish = |m: Option<(Mapping, bool)>, out: &mut Vec<Mapping>| {
        if let Some((m, true)) = m {
            out.push(m);
        }
    };
    for line in smaps.lines() {
        if let Some(header) = header(line) {
            finish(current.take(), &mut out);
            current = Some(header);
            continue;
        }
        let Some((mapping, eligible)) = current.as_mut() else {
            continue;
        };
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let kib = value
            .trim()
            .strip_suffix("kB")
            .and_then(|v| v.trim().parse::<u64>().ok());
        match (key, kib) {
            ("Rss", Some(v)) => mapping.rss_kib = v,
            ("Anonymous", Some(v)) if v > 0 => *eligible = false,
            ("Anonymous", None) => *eligible = false,
            _ => {}
        }
    }
    finish(current.take(), &mut out);
    out
}

/// A mapping's header line (`start-end perms offset dev inode [path]`) with whether its kind
/// allows giving it back; `None` for any other line.
fn header(line: &str) -> Option<(Mapping, bool)> {
    let mut fields = line.split_ascii_whitespace();
    let range = fields.next()?;
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?;
    if perms.len() != 4 || start >= end {
        return None;
    }
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let inode: u64 = fields.next()?.parse().ok()?;
    let path = fields.collect::<Vec<_>>().join(" ");
    let eligible = inode != 0
        && path.starts_with('/')
        && !path.ends_with(" (deleted)")
        && perms.as_bytes()[0] == b'r'
        && perms.as_bytes()[1] != b'w';
    Some((
        Mapping {
            range: start..end,
            path,
            rss_kib: 0,
        },
        eligible,
    ))
}

/// What one release did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// Mappings given back.
    pub mappings: usize,
    /// Their resident KiB just before.
    pub kib: u64,
}

/// Gives back this process's releasable mappings ([`releasable`] over `/proc/self/smaps`).
///
/// Never inlined: `scripts/code-order.sh` cuts its profiles where this is first entered, the end
/// of start-up.
///
/// # Errors
/// Reading `/proc/self/smaps`, or the kernel refusing the advice (the first refusal ends the
/// release; what was given back before stays given back).
#[inline(never)]
pub fn release() -> std::io::Result<Released> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut done = Released::default();
    for m in releasable(&smaps) {
        dont_need(&m.range)?;
        done.mappings += 1;
        done.kib += m.rss_kib;
    }
    Ok(done)
}

/// `madvise(MADV_DONTNEED)` over one mapping [`releasable`] chose.
fn dont_need(range: &Range<usize>) -> std::io::Result<()> {
    advise(range, nix::sys::mman::MmapAdvise::MADV_DONTNEED)
}

/// `madvise` over one mapping [`releasable`] chose, with `MADV_DONTNEED` (its pages unmapped) or
/// `MADV_RANDOM` (its page faults read no neighbours: an access-pattern hint).
#[allow(unsafe_code)]
fn advise(range: &Range<usize>, advice: nix::sys::mman::MmapAdvise) -> std::io::Result<()> {
    let Some(start) = std::ptr::NonNull::new(range.start as *mut std::ffi::c_void) else {
        return Ok(());
    };
    // SAFETY: the range is one whole mapping of this process as /proc/self/smaps listed it a
    // moment ago: file-backed, readable and not writable, with no anonymous (private copy)
    // page. Dropping such pages (MADV_DONTNEED) loses nothing — every page reads back from the
    // file, unchanged, on its next access — and no Rust object lives in them (they are code and
    // read-only data the loader mapped); MADV_RANDOM changes no content at all, only how a fault
    // reads the file. Should the mapping have been replaced meanwhile (ipamd maps no files
    // itself), the advice applies to whatever is there and loses at most such clean pages; an
    // address no longer mapped is refused with ENOMEM, which ends the release.
    unsafe { nix::sys::mman::madvise(start, range.end - range.start, advice) }
        .map_err(std::io::Error::from)
}

/// Once, right before start-up's release: from then on a fault on a page of code or read-only
/// data that the page cache lacks reads that page alone, no readahead around it
/// (`MADV_RANDOM` on every mapping [`releasable`] accepts, resident or not; [`mappings`]). Marked
/// before the release, so that no fault between the release and the mark reads ahead (with a
/// disk's `read_ahead_kb` of 8 MiB one such fault read 6 MiB of code back into the cache). With
/// [`drop_cached`] after the release, a page is resident only if ipamd touched it since, not its
/// whole 64 KiB fault-around window (docs/performance.md, "Pages touched, not windows").
/// Returns the mappings marked (logged with start-up's end).
///
/// # Errors
/// Reading `/proc/self/smaps`, or the advice refused (the first refusal ends it; what was
/// marked stays marked: the mark changes only how a fault reads the file).
pub fn read_on_demand() -> std::io::Result<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut marked = 0;
    for range in mappings(&smaps) {
        advise(&range, nix::sys::mman::MmapAdvise::MADV_RANDOM)?;
        marked += 1;
    }
    Ok(marked)
}

/// Drops the executable's pages that no process maps from the page cache
/// (`POSIX_FADV_DONTNEED` on `/proc/self/exe`), right after a release. The kernel's fault-around
/// maps only pages the page cache holds: with the image pull's copy of the file cached whole,
/// every fault mapped its 16-page window; after the drop the cache holds what ipamd touches, and
/// a fault maps that. Pages still mapped (by ipamd itself, or another process running the
/// binary), dirty (a pull's copy not yet written back) or under I/O stay cached, hence
/// [`DROP_AGAIN`]. Shared libraries of a dynamic build are left alone: other processes read them.
///
/// # Errors
/// `/proc/self/exe` not readable, or the advice refused.
pub fn drop_cached() -> std::io::Result<()> {
    let exe = std::fs::File::open("/proc/self/exe")?;
    nix::fcntl::posix_fadvise(
        &exe,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .map_err(std::io::Error::from)
}

/// How long after start-up's end the executable's page cache is dropped once more (with a
/// release before it): pages an image pull wrote and the kernel had not written back yet cannot
/// leave the page cache at start-up's end; the kernel writes them within ~35 s (its defaults:
/// `dirty_expire_centisecs` 30 s, `dirty_writeback_centisecs` 5 s).
pub const DROP_AGAIN: Duration = Duration::from_secs(60);

/// Releases once start-up is over (ipamd can hand out an address) — when `on_demand`, with its
/// mappings read on demand before ([`read_on_demand`]) and the binary's page cache dropped after
/// ([`drop_cached`]), the release and the drop once more [`DROP_AGAIN`] later —, then whenever [`Watch`] says so,
/// until shutdown. A failed release is said once and ends the releases (ipamd runs on, with
/// its pages).
pub async fn run(
    ipam: Arc<Ipam>,
    metrics: Arc<Metrics>,
    on_demand: bool,
    shutdown: CancellationToken,
) {
    let ec2_done = &metrics.ec2_call_done;
    let ec2_calls = || metrics.ec2_calls_finished.load(Ordering::Relaxed);
    while !ipam.index.capacity().can_assign {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(POLL) => {}
        }
    }
    let marked = match on_demand.then(read_on_demand).transpose() {
        Ok(marked) => marked,
        Err(e) => {
            // the releases go on; pages are resident by fault-around window, as before
            tracing::warn!(error = %e, "cannot read code pages on demand (madvise); they stay resident by fault-around window");
            None
        }
    };
    let mut on_demand = marked.is_some();
    let mut again = on_demand.then(|| tokio::time::Instant::now() + DROP_AGAIN);
    let mut wake = Wake::Release;
    let mut first = true;
    loop {
        let watch = match release() {
            Ok(r) => {
                let dropped = (first || wake == Wake::DropAgain)
                    && on_demand
                    && match drop_cached() {
                        Ok(()) => true,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot drop the binary's pages from the page cache (fadvise); they stay resident by fault-around window");
                            on_demand = false;
                            again = None;
                            false
                        }
                    };
                // an unreadable status reads as 0, here and in every check: one that stays
                // unreadable never asks for another release (it is not the advice refused)
                let left = own_rss_file_kib().unwrap_or(0);
                if first {
                    tracing::info!(
                        mappings = r.mappings,
                        kib = r.kib,
                        left_kib = left,
                        "start-up over: its code pages given back to the page cache"
                    );
                    if dropped {
                        tracing::info!(
                            mappings = marked.unwrap_or(0),
                            "code pages read on demand from now on: the page cache keeps what ipamd touches"
                        );
                    }
                } else {
                    tracing::debug!(
                        mappings = r.mappings,
                        kib = r.kib,
                        left_kib = left,
                        dropped,
                        "code pages given back to the page cache"
                    );
                }
                Watch::released(left, ec2_calls())
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot give code pages back (madvise); ipamd keeps them mapped");
                return shutdown.cancelled().await;
            }
        };
        first = false;
        wake = wait_for_growth(watch, &ec2_calls, ec2_done, again, &shutdown).await;
        match wake {
            Wake::Shutdown => return,
            Wake::DropAgain => again = None,
            Wake::Release => {}
        }
    }
}

/// Why [`wait_for_growth`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// [`Watch`] says release.
    Release,
    /// [`DROP_AGAIN`] is up: release, and drop the page cache again.
    DropAgain,
    /// Shutdown.
    Shutdown,
}

/// Looks when [`Watch::next_look`] says, or at once when an EC2 call finishes outside a burst,
/// until [`Watch`] says release, `again` (the time to drop the page cache once more) comes, or
/// shutdown. An unreadable status reads as 0, as right after the release: no growth.
async fn wait_for_growth(
    mut watch: Watch,
    ec2_calls: &impl Fn() -> u64,
    ec2_done: &tokio::sync::Notify,
    again: Option<tokio::time::Instant>,
    shutdown: &CancellationToken,
) -> Wake {
    let mut last = tokio::time::Instant::now();
    loop {
        let step = watch.next_look();
        tokio::select! {
            () = shutdown.cancelled() => return Wake::Shutdown,
            () = tokio::time::sleep_until(again.unwrap_or(last)), if again.is_some() => {
                return Wake::DropAgain;
            }
            () = tokio::time::sleep(step) => {}
            () = ec2_done.notified(), if step == LOOK => {}
        }
        let now = tokio::time::Instant::now();
        let kib = own_rss_file_kib().unwrap_or(0);
        if watch.check(kib, ec2_calls(), now - last) {
            return Wake::Release;
        }
        last = now;
    }
}

/// [`run`] as a task of the daemon.
pub fn task(
    ipam: &Arc<Ipam>,
    metrics: &Arc<Metrics>,
    on_demand: bool,
    token: &CancellationToken,
) -> crate::task::Task {
    let run = run(ipam.clone(), metrics.clone(), on_demand, token.clone());
    crate::task::Task::new("residency", async move {
        run.await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
00400000-00401000 r--p 00000000 fe:01 123 /usr/bin/ipamd
Size:                  4 kB
Rss:                   4 kB
Anonymous:             0 kB
00401000-00e00000 r-xp 00001000 fe:01 123 /usr/bin/ipamd
Size:              10236 kB
Rss:                6400 kB
Anonymous:             0 kB
00e00000-00f00000 r--p 00a00000 fe:01 123 /usr/bin/ipamd
Size:               1024 kB
Rss:                1800 kB
Anonymous:             0 kB
00f00000-00f10000 r--p 00b00000 fe:01 123 /usr/bin/ipamd
Size:                 64 kB
Rss:                  64 kB
Anonymous:             8 kB
00f10000-00f20000 rw-p 00b10000 fe:01 123 /usr/bin/ipamd
Size:                 64 kB
Rss:                  64 kB
Anonymous:            64 kB
01000000-02000000 rw-p 00000000 00:00 0 [heap]
Rss:                2000 kB
Anonymous:          2000 kB
7f0000000000-7f0000100000 r-xp 00000000 fe:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1400 kB
Anonymous:             0 kB
7f0000200000-7f0000300000 r-xp 00000000 fe:01 78 /old/lib.so (deleted)
Rss:                  12 kB
Anonymous:             0 kB
7f0000400000-7f0000500000 r--p 00000000 fe:01 79 /cold/file
Rss:                   0 kB
Anonymous:             0 kB
7ffc00000000-7ffc00002000 r-xp 00000000 00:00 0 [vdso]
Rss:                   8 kB
Anonymous:             0 kB
";

    #[test]
    fn only_clean_read_only_file_mappings_that_are_resident_are_given_back() {
        let got: Vec<_> = releasable(SMAPS).into_iter().map(|m| m.range).collect();
        assert_eq!(
            got,
            vec![
                0x40_0000..0x40_1000,
                0x40_1000..0xe0_0000,
                0xe0_0000..0xf0_0000,
                0x7f00_0000_0000..0x7f00_0010_0000,
            ]
        );
        let text = &releasable(SMAPS)[1];
        assert_eq!((text.path.as_str(), text.rss_kib), ("/usr/bin/ipamd", 6400));
    }

    #[test]
    fn reading_on_demand_covers_the_same_kinds_resident_or_not() {
        assert_eq!(
            mappings(SMAPS),
            vec![
                0x40_0000..0x40_1000,
                0x40_1000..0xe0_0000,
                0xe0_0000..0xf0_0000,
                0x7f00_0000_0000..0x7f00_0010_0000,
                // nothing resident: no release needed, but its faults read on demand too
                0x7f00_0040_0000..0x7f00_0050_0000,
            ]
        );
    }

    /// The second drop comes [`DROP_AGAIN`] after start-up's end even when nothing grows; without
    /// it pending, only growth or shutdown ends the wait.
    #[tokio::test(start_paused = true)]
    async fn the_page_cache_is_dropped_again_a_minute_after_start_up() {
        let done = tokio::sync::Notify::new();
        let shutdown = CancellationToken::new();
        // a size no look can grow past: only the timer may end the wait
        let idle = Watch::released(u64::MAX / 2, 0);
        let start = tokio::time::Instant::now();
        let again = Some(start + DROP_AGAIN);
        let wake = tokio::time::timeout(
            DROP_AGAIN * 2,
            wait_for_growth(idle, &|| 0, &done, again, &shutdown),
        )
        .await
        .expect("the drop's time came");
        assert_eq!(wake, Wake::DropAgain);
        assert_eq!(start.elapsed(), DROP_AGAIN);

        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(DROP_AGAIN * 3).await;
            stop.cancel();
        });
        let start = tokio::time::Instant::now();
        let wake = wait_for_growth(idle, &|| 0, &done, None, &shutdown).await;
        assert_eq!(wake, Wake::Shutdown);
        assert_eq!(start.elapsed(), DROP_AGAIN * 3);
    }

    /// One periodic check's worth of looks without EC2 calls, the size read at each look.
    fn checked(w: &mut Watch, kib: u64) -> bool {
        let looks = (CHECK.as_millis() / LOOK.as_millis()) as usize;
        (0..looks).any(|_| w.check(kib, 0, LOOK))
    }

    #[test]
    fn a_burst_is_given_back_once_it_is_over() {
        let mut w = Watch::released(3000, 0);
        // the steady state's refaults after the release: no release
        assert!(!checked(&mut w, 3040));
        assert!(!checked(&mut w, 3100));
        // a burst (a gRPC one: no EC2 call) maps code: growing, not settled
        assert!(!checked(&mut w, 3900));
        assert!(!checked(&mut w, 4600));
        // over: settled and grown by more than GROWTH_KIB
        assert!(checked(&mut w, 4620));
    }

    #[test]
    fn small_growth_is_left_alone_and_endless_growth_released_every_few_minutes() {
        let mut w = Watch::released(3000, 0);
        for _ in 0..100 {
            assert!(!checked(&mut w, 3000 + GROWTH_KIB - 1));
        }
        let mut w = Watch::released(3000, 0);
        let mut kib = 3000;
        let mut checks = 0;
        loop {
            kib += SETTLED_KIB; // never settled
            checks += 1;
            if checked(&mut w, kib) {
                break;
            }
        }
        assert_eq!(CHECK * checks, EVERY);
    }

    #[test]
    fn an_ec2_burst_is_given_back_once_no_call_finished_for_a_while() {
        let mut w = Watch::released(3000, 7);
        // a pool action: calls finish at every look, the SDK path maps in
        assert!(!w.check(3400, 8, LOOK));
        assert!(!w.check(3900, 10, LOOK));
        assert!(!w.check(4300, 11, LOOK));
        // quiet for less than EC2_QUIET: not yet (looks closer together than LOOK)
        let half = EC2_QUIET / 2;
        assert!(!w.check(4300, 11, half));
        // quiet long enough and grown: now, long before the periodic rule would
        assert!(w.check(4300, 11, half));
    }

    #[test]
    fn a_small_ec2_burst_waits_for_the_next_and_never_fires_twice() {
        let mut w = Watch::released(3000, 0);
        // a reconcile's one Describe maps a little: over, but not worth a release
        assert!(!w.check(3200, 1, LOOK));
        assert!(!w.check(3200, 1, LOOK));
        assert!(!w.check(3200, 1, LOOK));
        // the next burst brings the growth over the line: released when it is over
        assert!(!w.check(3700, 3, LOOK));
        assert!(w.check(3700, 3, LOOK));
    }

    #[test]
    fn the_watch_looks_closely_while_an_ec2_burst_is_open() {
        let mut w = Watch::released(3000, 5);
        assert_eq!(w.next_look(), LOOK);
        // a call finished (the notification woke the watch): the burst is open
        assert!(!w.check(3300, 6, Duration::from_millis(20)));
        assert_eq!(w.next_look(), QUICK_LOOK);
        let mut looks = 0;
        while !w.check(3700, 6, QUICK_LOOK) {
            looks += 1;
            assert!(looks < 10, "the burst's end is never seen");
        }
        // given back EC2_QUIET after the last call, seen within one quick look of it
        assert_eq!(QUICK_LOOK * (looks + 1), EC2_QUIET);
        // a burst too small for a release is closed all the same: back to the slow look
        let mut w = Watch::released(3000, 5);
        assert!(!w.check(3100, 6, Duration::from_millis(20)));
        for _ in 0..3 {
            assert!(!w.check(3100, 6, QUICK_LOOK));
        }
        assert_eq!(w.next_look(), LOOK);
    }

    #[test]
    fn adds_and_dels_alone_never_trigger_the_ec2_rule() {
        let mut w = Watch::released(3000, 0);
        // the ADD path maps 600 KiB and stays; no EC2 call finishes: nothing for a whole CHECK
        // (the EC2 rule would have fired after EC2_QUIET)
        assert!(!checked(&mut w, 3600));
        // only the periodic rule releases it, once it has settled over the next CHECK
        assert!(checked(&mut w, 3600));
    }

    #[test]
    fn rss_file_is_read_from_the_status_text() {
        let status = "Name:\tipamd\nVmRSS:\t    7000 kB\nRssAnon:\t    2300 kB\nRssFile:\t    4700 kB\nRssShmem:\t       0 kB\n";
        assert_eq!(rss_file_kib(status), Some(4700));
        assert_eq!(rss_file_kib("VmRSS: 1 kB\n"), None);
        assert!(own_rss_file_kib().unwrap() > 0);
    }

    #[test]
    fn a_block_without_its_anonymous_count_is_not_given_back() {
        let smaps = "00400000-00401000 r-xp 00000000 fe:01 123 /usr/bin/ipamd\nRss: 4 kB\nAnonymous: x kB\n";
        assert!(releasable(smaps).is_empty());
        assert!(releasable("garbage\n\n").is_empty());
    }

    #[test]
    fn this_process_gives_back_its_code_and_runs_on() {
        let before = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let chosen = releasable(&before);
        assert!(
            chosen
                .iter()
                .any(|m| m.path.contains("residency") || m.path.contains("ipamd")),
            "the test binary's own code is releasable: {chosen:?}"
        );
        let r = release().unwrap();
        assert!(r.mappings >= 1 && r.kib > 0, "{r:?}");
        // gone from the resident set: what is mapped again right after is only what reading
        // smaps ran (a few windows), far below what was resident before
        let after: u64 = releasable(&std::fs::read_to_string("/proc/self/smaps").unwrap())
            .iter()
            .map(|m| m.rss_kib)
            .sum();
        assert!(
            after * 2 < r.kib,
            "{after} KiB resident again of {} KiB",
            r.kib
        );
        // the code given back runs again (faulted back in): this very test goes on
        let again = release().unwrap();
        assert!(again.mappings >= 1, "{again:?}");
    }
}
