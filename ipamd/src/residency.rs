//! Code residency: once start-up is over, and then every few minutes, ipamd unmaps the pages of
//! its code and read-only file data (the binary's, and shared libraries' in a dynamic build)
//! that it mapped, so what stays resident is what the steady state runs again. The pages go
//! back to the page cache, clean and shared; the next call of a function maps its page again
//! (a minor fault). Owns that one system call and the rule of which mappings it may touch:
//! file-backed, never writable, without a single private (copied) page. Must not touch the
//! heap, stacks, writable data or anything ipamd mapped on purpose (docs/performance.md,
//! "Code residency").

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ipam::Ipam;

/// How often the steady state gives back what ran since (an EC2 burst's SDK code, a re-sync's
/// parsing). A release costs the next calls a minor fault per 64 KiB window they touch: tens of
/// microseconds in all.
pub const EVERY: Duration = Duration::from_secs(300);
/// How often start-up's end is looked for (the first address ipamd can hand out).
const POLL: Duration = Duration::from_millis(250);

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
    let mut out = Vec::new();
    let mut current: Option<(Mapping, bool)> = None; // (mapping, eligible so far)
    let finish = |m: Option<(Mapping, bool)>, out: &mut Vec<Mapping>| {
        if let Some((m, true)) = m {
            if m.rss_kib > 0 {
                out.push(m);
            }
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
#[allow(unsafe_code)]
fn dont_need(range: &Range<usize>) -> std::io::Result<()> {
    let Some(start) = std::ptr::NonNull::new(range.start as *mut std::ffi::c_void) else {
        return Ok(());
    };
    // SAFETY: the range is one whole mapping of this process as /proc/self/smaps listed it a
    // moment ago: file-backed, readable and not writable, with no anonymous (private copy)
    // page. Dropping such pages loses nothing — every page reads back from the file, unchanged,
    // on its next access — and no Rust object lives in them (they are code and read-only data
    // the loader mapped). Should the mapping have been replaced meanwhile (ipamd maps no files
    // itself), the advice applies to whatever is there and loses at most such clean pages; an
    // address no longer mapped is refused with ENOMEM, which ends the release.
    unsafe {
        nix::sys::mman::madvise(
            start,
            range.end - range.start,
            nix::sys::mman::MmapAdvise::MADV_DONTNEED,
        )
    }
    .map_err(std::io::Error::from)
}

/// Releases once start-up is over (ipamd can hand out an address), then every [`EVERY`], until
/// shutdown. A failed release is said once and ends the releases (ipamd runs on, with its pages).
pub async fn run(ipam: Arc<Ipam>, shutdown: CancellationToken) {
    while !ipam.index.capacity().can_assign {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(POLL) => {}
        }
    }
    let mut first = true;
    loop {
        match release() {
            Ok(r) if first => tracing::info!(
                mappings = r.mappings,
                kib = r.kib,
                "start-up over: its code pages given back to the page cache"
            ),
            Ok(r) => tracing::debug!(
                mappings = r.mappings,
                kib = r.kib,
                "code pages given back to the page cache"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cannot give code pages back (madvise); ipamd keeps them mapped");
                return shutdown.cancelled().await;
            }
        }
        first = false;
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(EVERY) => {}
        }
    }
}

/// [`run`] as a task of the daemon.
pub fn task(ipam: &Arc<Ipam>, token: &CancellationToken) -> crate::task::Task {
    let run = run(ipam.clone(), token.clone());
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
