//! The `process_*` metric families that client_golang's process collector serves beside the
//! `awscni_*` ones (CPU, memory, file descriptors, start time; people alert on them), read from
//! `/proc/self` at scrape time. Parsing is pure; [`render`] is the only reader. Must not: record
//! anything between scrapes, touch ipamd's own metrics.

use std::fmt::Write as _;

/// `USER_HZ`: the unit of `/proc/<pid>/stat` CPU times (fixed at 100 on Linux, as the
/// Prometheus procfs library assumes).
const USER_HZ: f64 = 100.0;
/// Page size of the `rss` field (4 KiB on the architectures EKS nodes run).
const PAGE_SIZE: f64 = 4096.0;

/// What `/proc/self/stat` says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// utime + stime, in seconds.
    pub cpu_seconds: f64,
    /// `vsize`, bytes.
    pub virtual_bytes: f64,
    /// `rss` × page size, bytes.
    pub resident_bytes: f64,
    /// `starttime`, seconds after boot.
    pub start_after_boot: f64,
}

/// Parses `/proc/<pid>/stat` (the command name may contain spaces and parentheses: fields are
/// counted after the last `)`).
#[must_use]
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of proc(5), so field N is f[N - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<f64>().ok();
    Some(Stat {
        cpu_seconds: (num(14)? + num(15)?) / USER_HZ,
        start_after_boot: num(22)? / USER_HZ,
        virtual_bytes: num(23)?,
        resident_bytes: num(24)? * PAGE_SIZE,
    })
}

/// `btime` (boot time, Unix seconds) from `/proc/stat`.
#[must_use]
pub fn parse_boot_time(text: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of a row of `/proc/<pid>/limits` (`unlimited` as client_golang reports it:
/// the largest u64).
#[must_use]
pub fn parse_soft_limit(text: &str, row: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with(row))?;
    let soft = line[row.len()..].split_whitespace().next()?;
    if soft == "unlimited" {
        #[allow(clippy::cast_precision_loss)]
        return Some(u64::MAX as f64);
    }
    soft.parse().ok()
}

/// Appends the process families, as client_golang names and documents them. Whatever
/// `/proc` does not give is left out rather than reported as 0.
pub fn render(out: &mut String) {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| parse_stat(&t));
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|t| parse_boot_time(&t));
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    #[allow(clippy::cast_precision_loss)]
    let open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as f64);
    let families = [
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            stat.map(|s| s.cpu_seconds),
        ),
        (
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            parse_soft_limit(&limits, "Max open files"),
        ),
        (
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            open_fds,
        ),
        (
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            stat.map(|s| s.resident_bytes),
        ),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            stat.zip(boot).map(|(s, b)| b + s.start_after_boot),
        ),
        (
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            stat.map(|s| s.virtual_bytes),
        ),
        (
            "process_virtual_memory_max_bytes",
            "gauge",
            "Maximum amount of virtual memory available in bytes.",
            parse_soft_limit(&limits, "Max address space"),
        ),
    ];
    for (name, kind, help, value) in families {
        if let Some(v) = value {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces_and_parens() {
        let text = "4242 (ipamd (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 \
                    4 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 \
                    1 0 0 0 0 0";
        let s = parse_stat(text).unwrap();
        assert!((s.cpu_seconds - 3.0).abs() < 1e-9);
        assert!((s.start_after_boot - 123.45).abs() < 1e-9);
        assert!((s.virtual_bytes - 104_857_600.0).abs() < 1e-3);
        assert!((s.resident_bytes - 2560.0 * 4096.0).abs() < 1e-3);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn limits_and_boot_time() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1048576              1048576              files\n\
                      Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(
            parse_soft_limit(limits, "Max open files"),
            Some(1_048_576.0)
        );
        #[allow(clippy::cast_precision_loss)]
        let unlimited = u64::MAX as f64;
        assert_eq!(
            parse_soft_limit(limits, "Max address space"),
            Some(unlimited)
        );
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\n"),
            Some(1.7e9)
        );
    }

    /// This very process: every family present, plausible, and in the text format.
    #[test]
    fn renders_this_process() {
        let mut out = String::new();
        render(&mut out);
        for name in [
            "process_cpu_seconds_total",
            "process_max_fds",
            "process_open_fds",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "process_virtual_memory_bytes",
            "process_virtual_memory_max_bytes",
        ] {
            assert!(
                out.contains(&format!("# TYPE {name} ")),
                "{name} missing:\n{out}"
            );
        }
        let rss: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(rss > 1e5, "{rss}");
    }
}
