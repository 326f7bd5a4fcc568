//! The fleet report: pure figures from what a fleet run recorded (time series of pods with an
//! address and of EC2 calls/throttles, per-action call counts) — the lower bound of mutating
//! calls, the time the account's buckets allow, the text report and the SVG plot. Must not do
//! I/O or know processes; the driver (`fleet/mod.rs`) records, this module only computes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use vpcsim::knobs::Throttle;
use vpcsim::world::ApiCount;

/// One sample of the run, taken about every second.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Seconds since the scenario started.
    pub t: f64,
    /// Pods that have their address.
    pub pods_ready: usize,
    /// Cumulative EC2 requests let through by the throttle, all actions.
    pub accepted: u64,
    /// Cumulative mutating EC2 requests let through.
    pub mutating: u64,
    /// Cumulative requests answered `RequestLimitExceeded`.
    pub throttled: u64,
}

/// True for EC2 actions that change state (everything but `Describe*`).
#[must_use]
pub fn is_mutating(action: &str) -> bool {
    !action.starts_with("Describe")
}

/// Per-action difference `after - before`.
#[must_use]
pub fn delta(
    before: &BTreeMap<String, ApiCount>,
    after: &BTreeMap<String, ApiCount>,
) -> BTreeMap<String, ApiCount> {
    after
        .iter()
        .filter_map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or_default();
            let d = ApiCount {
                accepted: a.accepted.saturating_sub(b.accepted),
                throttled: a.throttled.saturating_sub(b.throttled),
            };
            (d != ApiCount::default()).then(|| (k.clone(), d))
        })
        .collect()
}

/// Totals of a per-action map: (accepted, of which mutating, throttled).
#[must_use]
pub fn totals(counts: &BTreeMap<String, ApiCount>) -> (u64, u64, u64) {
    counts.iter().fold((0, 0, 0), |(a, m, t), (k, c)| {
        (
            a + c.accepted,
            m + if is_mutating(k) { c.accepted } else { 0 },
            t + c.throttled,
        )
    })
}

/// Shape of a node for the lower bound: ENIs it may have and IPv4 addresses per ENI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeShape {
    /// Maximum ENIs.
    pub max_enis: u32,
    /// IPv4 addresses per ENI (primary included).
    pub ipv4_per_eni: u32,
}

/// The fewest mutating EC2 calls per action that give one node `pods` pod addresses
/// (secondary IPs, no prefix delegation): one `AssignPrivateIpAddresses` fills the primary
/// ENI, every further ENI is one `CreateNetworkInterface` (with its addresses in the same
/// call) + `AttachNetworkInterface` + `ModifyNetworkInterfaceAttribute` (delete on
/// termination). `None` when the pods do not fit the node.
#[must_use]
pub fn min_calls_per_node(shape: NodeShape, pods: u32) -> Option<BTreeMap<&'static str, u32>> {
    let per_eni = shape.ipv4_per_eni.saturating_sub(1).max(1);
    let enis = pods.div_ceil(per_eni).max(1);
    if enis > shape.max_enis {
        return None;
    }
    let mut m = BTreeMap::new();
    if pods > 0 {
        m.insert("AssignPrivateIpAddresses", 1);
    }
    if enis > 1 {
        for a in [
            "CreateNetworkInterface",
            "AttachNetworkInterface",
            "ModifyNetworkInterfaceAttribute",
        ] {
            m.insert(a, enis - 1);
        }
    }
    Some(m)
}

/// Seconds the account's per-action buckets need at least to grant `calls` requests of each
/// action made at once from full buckets: per action `max(0, calls - capacity) / refill`, the
/// slowest action decides (actions have separate buckets and run in parallel).
#[must_use]
pub fn bucket_seconds(throttle: &Throttle, calls: &BTreeMap<&'static str, u32>) -> f64 {
    let bucket = throttle.bucket(vpcsim::knobs::ActionClass::Mutate);
    calls
        .values()
        .map(|&n| {
            let over = f64::from(n) - f64::from(bucket.capacity);
            if over <= 0.0 {
                0.0
            } else if bucket.refill_per_sec > 0.0 {
                over / bucket.refill_per_sec
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

/// As [`bucket_seconds`], with the account's buckets cut to `scale` from `from` to `to` s
/// (a brown-out): levels above the cut size are cut to it, refill is scaled meanwhile. Each
/// action's bucket is simulated in 10 ms steps; the slowest action decides.
#[must_use]
pub fn bucket_seconds_with_brownout(
    throttle: &Throttle,
    calls: &BTreeMap<&'static str, u32>,
    brownout: Option<(f64, f64, f64)>,
) -> f64 {
    let full = throttle.bucket(vpcsim::knobs::ActionClass::Mutate);
    let cut = brownout.map(|(_, _, scale)| {
        let mut t = throttle.clone();
        t.scale = scale;
        t.bucket(vpcsim::knobs::ActionClass::Mutate)
    });
    let dt = 0.01;
    // a cut in force at t = 0 applies to the first calls too (the bucket starts cut)
    let start = match (brownout, cut) {
        (Some((from, to, _)), Some(c)) if from <= 0.0 && to > 0.0 => c,
        _ => full,
    };
    calls
        .values()
        .map(|&n| {
            let mut level = f64::from(start.capacity);
            let mut left = f64::from(n);
            let mut t = 0.0;
            while t < 3600.0 {
                let take = left.min(level.floor());
                (left, level) = (left - take, level - take);
                if left <= 0.0 {
                    return t;
                }
                t += dt;
                let b = match (brownout, cut) {
                    (Some((from, to, _)), Some(c)) if t >= from && t < to => c,
                    _ => full,
                };
                level = (level + b.refill_per_sec * dt).min(f64::from(b.capacity));
            }
            f64::INFINITY
        })
        .fold(0.0, f64::max)
}

/// `key` (`VmRSS:`, `RssAnon:`) in KiB from the text of a `/proc/<pid>/status`, if its `Name`
/// is `name` (a pid reused by another program, or a wrapper, is not counted).
#[must_use]
pub fn parse_status_kib(status: &str, name: &str, key: &str) -> Option<u64> {
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(str::trim)
    };
    if field("Name:")? != name {
        return None;
    }
    field(key)?.strip_suffix("kB")?.trim().parse().ok()
}

/// The count of major page faults (`majflt`, the 12th field: pages the process waited to read
/// from a file, its binary's code among them) from the text of a `/proc/<pid>/stat`, if its
/// command is `name`. The command may hold spaces and brackets: the fields follow its last `)`.
#[must_use]
pub fn parse_stat_major_faults(stat: &str, name: &str) -> Option<u64> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    if stat.get(open + 1..close)? != name {
        return None;
    }
    // after the command: state (field 3) ... majflt (field 12)
    stat.get(close + 1..)?
        .split_ascii_whitespace()
        .nth(9)?
        .parse()
        .ok()
}

/// One report line of the fleet's ipamd major page faults: what reading code on demand costs
/// (docs/performance.md, "Pages touched, not windows").
#[must_use]
pub fn major_faults_line(faults: &[Option<u64>]) -> String {
    let mut v: Vec<u64> = faults.iter().flatten().copied().collect();
    v.sort_unstable();
    format!(
        "- ipamd major page faults since its start (pages waited for from a file, its binary's \
         code among them; the fleet's ipamds share one binary, so the first to touch a page reads \
         it): max {}, median {}, sum {} over {} processes",
        v.last().copied().unwrap_or(0),
        v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0),
        v.iter().sum::<u64>(),
        v.len()
    )
}

/// The memory target of issue 12: each ipamd's RSS ≤ 16 MiB.
pub const RSS_TARGET_KIB: u64 = 16 * 1024;

/// RSS figures of the fleet's ipamds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RssSummary {
    /// Processes measured.
    pub measured: usize,
    /// Processes not measured (gone, or not ipamd).
    pub missing: usize,
    /// Largest RSS, KiB.
    pub max_kib: u64,
    /// Median RSS (the lower middle of an even count), KiB.
    pub median_kib: u64,
    /// Sum over the fleet, KiB.
    pub sum_kib: u64,
    /// Processes above [`RSS_TARGET_KIB`].
    pub over_target: usize,
}

/// Max, median and sum of the measured RSS values, and how many exceed the target.
#[must_use]
pub fn rss_summary(rss_kib: &[Option<u64>]) -> RssSummary {
    let mut v: Vec<u64> = rss_kib.iter().flatten().copied().collect();
    v.sort_unstable();
    RssSummary {
        measured: v.len(),
        missing: rss_kib.len() - v.len(),
        max_kib: v.last().copied().unwrap_or(0),
        median_kib: v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0),
        sum_kib: v.iter().sum(),
        over_target: v.iter().filter(|&&k| k > RSS_TARGET_KIB).count(),
    }
}

/// One report line for [`rss_summary`] of `VmRSS` (`s`) and of `RssAnon` (`anon`).
#[must_use]
pub fn rss_line(when: &str, s: &RssSummary, anon: &RssSummary) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    format!(
        "- ipamd RSS {when} ({} processes measured{}): max {:.1} MiB, median {:.1} MiB, sum {:.1} \
         MiB; {} above 16 MiB (target: each ≤ 16 MiB: {}); anonymous memory (`RssAnon`, without the mapped binary): max {:.1} MiB, median \
         {:.1} MiB",
        s.measured,
        if s.missing > 0 {
            format!(", {} not measured", s.missing)
        } else {
            String::new()
        },
        mib(s.max_kib),
        mib(s.median_kib),
        mib(s.sum_kib),
        s.over_target,
        if s.measured > 0 && s.over_target == 0 && s.missing == 0 {
            "met"
        } else {
            "NOT met"
        },
        mib(anon.max_kib),
        mib(anon.median_kib),
    )
}

/// One report line listing every node's ipamd: `VmRSS` and, in brackets, `RssFile` (the mapped
/// binary) in MiB, in node order (`-` for a node not measured). The max and median of
/// [`rss_line`] say how far the fleet is from the target; this says which node to look at.
#[must_use]
pub fn rss_nodes_line(rss_kib: &[Option<u64>], file_kib: &[Option<u64>]) -> String {
    let mib = |k: u64| k as f64 / 1024.0;
    let nodes: Vec<String> = rss_kib
        .iter()
        .enumerate()
        .map(|(i, r)| match (r, file_kib.get(i).copied().flatten()) {
            (Some(r), Some(f)) => format!("{i}: {:.1} ({:.1})", mib(*r), mib(f)),
            (Some(r), None) => format!("{i}: {:.1}", mib(*r)),
            (None, _) => format!("{i}: -"),
        })
        .collect();
    format!(
        "- per node, ipamd RSS (file-backed) MiB: {}",
        nodes.join(", ")
    )
}

/// Scale `per_node` to `nodes` nodes.
#[must_use]
pub fn fleet_calls(
    per_node: &BTreeMap<&'static str, u32>,
    nodes: u32,
) -> BTreeMap<&'static str, u32> {
    per_node.iter().map(|(k, v)| (*k, v * nodes)).collect()
}

/// The calls table of a scenario: one line per action.
#[must_use]
pub fn calls_table(counts: &BTreeMap<String, ApiCount>) -> String {
    let mut out = String::from("| action | accepted | throttled |\n|---|---:|---:|\n");
    for (k, c) in counts {
        let _ = writeln!(out, "| {k} | {} | {} |", c.accepted, c.throttled);
    }
    let (a, m, t) = totals(counts);
    let _ = writeln!(out, "| **total** (mutating {m}) | {a} | {t} |");
    out
}

/// Seconds until `pods_ready` first reached `target` (None if never).
#[must_use]
pub fn time_to(samples: &[Sample], target: usize) -> Option<f64> {
    samples.iter().find(|s| s.pods_ready >= target).map(|s| s.t)
}

/// The `p`-th percentile (0..=100, nearest rank) of `sorted` (ascending); None when empty.
#[must_use]
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    // nearest rank: the smallest k with k / n >= p / 100, found without float-to-int casts
    let n = sorted.len();
    let rank = (1..=n)
        .find(|k| *k as f64 / n as f64 >= p / 100.0)
        .unwrap_or(n);
    Some(sorted[rank - 1])
}

/// Stretches of at least `min_secs` in which pods were still waiting (`pods_ready` below
/// `pods_total`) yet nothing happened: no EC2 request let through and no pod given an address.
/// The idle time the issue-30 storm report looks for (`(from, to)` in seconds).
#[must_use]
pub fn stalls(samples: &[Sample], pods_total: usize, min_secs: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    let mut start: Option<&Sample> = None;
    for w in samples.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let quiet =
            a.pods_ready < pods_total && b.pods_ready == a.pods_ready && b.accepted == a.accepted;
        match (quiet, start) {
            (true, None) => start = Some(a),
            (false, Some(s)) => {
                if a.t - s.t >= min_secs {
                    out.push((s.t, a.t));
                }
                start = None;
            }
            _ => {}
        }
    }
    if let (Some(s), Some(last)) = (start, samples.last())
        && last.t - s.t >= min_secs
    {
        out.push((s.t, last.t));
    }
    out
}

/// An SVG of the cumulative distribution of the pods' time to an address (`times`, seconds,
/// any order), with a dashed vertical line at `bound` (e.g. the EC2 bucket-bound time).
#[must_use]
pub fn cdf_svg(title: &str, times: &[f64], bound: Option<(f64, &str)>) -> String {
    const W: f64 = 860.0;
    const H: f64 = 360.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 40.0;
    const PANEL: f64 = 260.0;
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let t_max = sorted
        .last()
        .copied()
        .into_iter()
        .chain(bound.map(|b| b.0))
        .fold(1.0, f64::max);
    let x = |t: f64| LEFT + (W - LEFT - RIGHT) * t / t_max;
    let y = |f: f64| TOP + PANEL - PANEL * f;
    let n = sorted.len().max(1) as f64;
    let mut points = vec![(0.0, 0.0)];
    for (i, t) in sorted.iter().enumerate() {
        points.push((*t, i as f64 / n));
        points.push((*t, (i + 1) as f64 / n));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        xml_escape(title)
    );
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{PANEL}" fill="none" stroke="black"/>"#,
        W - LEFT - RIGHT
    );
    for k in 0..=4 {
        let f = f64::from(k) / 4.0;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{:.0}%</text>"#,
            LEFT - 4.0,
            y(f) + 4.0,
            f * 100.0
        );
    }
    for k in 0..=10 {
        let t = t_max * f64::from(k) / 10.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{t:.1}s</text>"#,
            x(t),
            TOP + PANEL + 16.0
        );
    }
    let _ = writeln!(
        s,
        r##"<polyline points="{}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>"##,
        polyline(&points, x, y)
    );
    let mut legend = vec![("#1f77b4", "pods with an address (fraction)".to_owned())];
    for (p, color) in [(50.0, "#2ca02c"), (99.0, "#d62728")] {
        if let Some(v) = percentile(&sorted, p) {
            let _ = writeln!(
                s,
                r#"<line x1="{:.1}" y1="{TOP}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="1"/>"#,
                x(v),
                x(v),
                TOP + PANEL
            );
            legend.push((color, format!("p{p:.0} {v:.1} s")));
        }
    }
    if let Some((b, label)) = bound {
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{TOP}" x2="{:.1}" y2="{:.1}" stroke="#7f7f7f" stroke-dasharray="6 4"/>"##,
            x(b),
            x(b),
            TOP + PANEL
        );
        legend.push(("#7f7f7f", format!("{label} {b:.1} s")));
    }
    for (i, (color, label)) in legend.iter().enumerate() {
        let lx = LEFT + 200.0 * i as f64;
        let ly = TOP + PANEL + 40.0;
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="3" fill="{color}"/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 4.0,
            lx + 16.0,
            xml_escape(label)
        );
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// Per-second rates of a cumulative counter between consecutive samples.
fn rates(samples: &[Sample], f: impl Fn(&Sample) -> u64) -> Vec<(f64, f64)> {
    samples
        .windows(2)
        .map(|w| {
            let dt = (w[1].t - w[0].t).max(1e-3);
            let dv = f(&w[1]).saturating_sub(f(&w[0])) as f64;
            (w[1].t, dv / dt)
        })
        .collect()
}

fn polyline(points: &[(f64, f64)], x: impl Fn(f64) -> f64, y: impl Fn(f64) -> f64) -> String {
    points
        .iter()
        .map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// An SVG with two panels sharing the time axis: pods with an address (top) and EC2
/// calls/throttles per second (bottom), plus an optional shaded interval (e.g. a brown-out).
#[must_use]
pub fn svg(
    title: &str,
    samples: &[Sample],
    pods_total: usize,
    shade: Option<(f64, f64)>,
) -> String {
    const W: f64 = 860.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const PANEL: f64 = 200.0;
    let t_max = samples.last().map_or(1.0, |s| s.t).max(1.0);
    let x = |t: f64| LEFT + (W - LEFT - RIGHT) * t / t_max;
    let calls = rates(samples, |s| s.accepted);
    let mutating = rates(samples, |s| s.mutating);
    let throttles = rates(samples, |s| s.throttled);
    let r_max = calls
        .iter()
        .chain(&throttles)
        .map(|p| p.1)
        .fold(1.0, f64::max)
        .ceil();
    let p_max = (pods_total.max(1)) as f64;
    let top0 = 40.0;
    let bot0 = top0 + PANEL + 50.0;
    let y_pods = |v: f64| top0 + PANEL - PANEL * v / p_max;
    let y_rate = |v: f64| bot0 + PANEL - PANEL * v / r_max;
    let h = bot0 + PANEL + 50.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        xml_escape(title)
    );
    if let Some((a, b)) = shade {
        for y0 in [top0, bot0] {
            let _ = writeln!(
                s,
                r##"<rect x="{:.1}" y="{y0}" width="{:.1}" height="{PANEL}" fill="#f4d6a0" opacity="0.6"/>"##,
                x(a),
                (x(b) - x(a)).max(1.0)
            );
        }
    }
    for (y0, label, max) in [
        (top0, "pods with an address", p_max),
        (bot0, "EC2 requests / s", r_max),
    ] {
        let _ = writeln!(
            s,
            r#"<rect x="{LEFT}" y="{y0}" width="{:.1}" height="{PANEL}" fill="none" stroke="black"/>"#,
            W - LEFT - RIGHT
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{max}</text><text x="{}" y="{}" text-anchor="end">0</text>"#,
            LEFT - 4.0,
            y0 + 10.0,
            LEFT - 4.0,
            y0 + PANEL
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" transform="rotate(-90 {} {})" text-anchor="middle">{label}</text>"#,
            LEFT - 40.0,
            y0 + PANEL / 2.0,
            LEFT - 40.0,
            y0 + PANEL / 2.0
        );
    }
    let ticks = 10;
    for k in 0..=ticks {
        let t = t_max * f64::from(k) / f64::from(ticks);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{t:.0}s</text>"#,
            x(t),
            bot0 + PANEL + 16.0
        );
    }
    let pods: Vec<(f64, f64)> = samples.iter().map(|s| (s.t, s.pods_ready as f64)).collect();
    let series = [
        (
            polyline(&pods, x, y_pods),
            "#1f77b4",
            "pods with an address",
        ),
        (polyline(&calls, x, y_rate), "#2ca02c", "all requests / s"),
        (polyline(&mutating, x, y_rate), "#9467bd", "mutating / s"),
        (
            polyline(&throttles, x, y_rate),
            "#d62728",
            "RequestLimitExceeded / s",
        ),
    ];
    for (i, (points, color, label)) in series.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.5"/>"#
        );
        let lx = LEFT + 190.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="12" height="4" fill="{color}"/><text x="{}" y="{}">{label}</text>"#,
            h - 18.0,
            lx + 16.0,
            h - 13.0
        );
    }
    s.push_str("</svg>\n");
    s
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// An SVG of several series over one time axis (e.g. idle addresses per policy), a dashed
/// vertical line at `mark` (e.g. where the measured window starts).
#[must_use]
pub fn lines_svg(title: &str, series: &[(&str, &[(f64, f64)])], mark: f64) -> String {
    const W: f64 = 860.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 40.0;
    const PANEL: f64 = 260.0;
    const COLORS: [&str; 5] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];
    let all = series.iter().flat_map(|s| s.1.iter());
    let t_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
    let v_max = all.map(|p| p.1).fold(1.0, f64::max).ceil();
    let x = |t: f64| LEFT + (W - LEFT - RIGHT) * t / t_max;
    let y = |v: f64| TOP + PANEL - PANEL * v / v_max;
    let h = TOP + PANEL + 60.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        xml_escape(title)
    );
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{PANEL}" fill="none" stroke="black"/>"#,
        W - LEFT - RIGHT
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="end">{v_max}</text><text x="{}" y="{}" text-anchor="end">0</text>"#,
        LEFT - 4.0,
        TOP + 10.0,
        LEFT - 4.0,
        TOP + PANEL
    );
    let _ = writeln!(
        s,
        r#"<line x1="{:.1}" y1="{TOP}" x2="{:.1}" y2="{}" stroke="gray" stroke-dasharray="4 3"/>"#,
        x(mark),
        x(mark),
        TOP + PANEL
    );
    for k in 0..=10 {
        let t = t_max * f64::from(k) / 10.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{t:.0}s</text>"#,
            x(t),
            TOP + PANEL + 16.0
        );
    }
    for (i, (label, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5"/>"#,
            polyline(points, x, y)
        );
        let lx = LEFT + 150.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="{}" width="12" height="4" fill="{color}"/><text x="{}" y="{}">{}</text>"#,
            h - 18.0,
            lx + 16.0,
            h - 13.0,
            xml_escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_bound_fills_the_primary_then_adds_enis() {
        let t3_large = NodeShape {
            max_enis: 3,
            ipv4_per_eni: 12,
        };
        let m = min_calls_per_node(t3_large, 30).unwrap();
        assert_eq!(m["AssignPrivateIpAddresses"], 1);
        assert_eq!(m["CreateNetworkInterface"], 2);
        assert_eq!(m.values().sum::<u32>(), 7);
        assert_eq!(
            min_calls_per_node(t3_large, 11)
                .unwrap()
                .values()
                .sum::<u32>(),
            1
        );
        assert!(min_calls_per_node(t3_large, 34).is_none());
    }

    #[test]
    fn a_brownout_delays_the_calls_beyond_the_burst() {
        let throttle = Throttle::default(); // mutating 200, 5/s per action
        let calls = BTreeMap::from([("CreateNetworkInterface", 300)]);
        // no brown-out: as bucket_seconds
        let plain = bucket_seconds_with_brownout(&throttle, &calls, None);
        assert!((plain - 20.0).abs() < 0.05, "{plain}");
        // buckets at 10 % (20, 0.5/s) from 1 s to 61 s: 200 at once, 5 in the first second,
        // 30 during the cut, then 65 at 5/s after it = 74 s
        let cut = bucket_seconds_with_brownout(&throttle, &calls, Some((1.0, 61.0, 0.1)));
        assert!((cut - 74.0).abs() < 0.1, "{cut}");
        // cut from the first call: 20 at once, 30 during the cut, then 250 at 5/s = 110 s
        let first = bucket_seconds_with_brownout(&throttle, &calls, Some((0.0, 60.0, 0.1)));
        assert!((first - 110.0).abs() < 0.1, "{first}");
    }

    #[test]
    fn bucket_time_counts_only_calls_beyond_the_burst() {
        let throttle = Throttle::default(); // mutating 200, 5/s per action
        let calls = BTreeMap::from([
            ("CreateNetworkInterface", 300),
            ("AssignPrivateIpAddresses", 100),
        ]);
        assert!((bucket_seconds(&throttle, &calls) - 20.0).abs() < 1e-9);
        let small = BTreeMap::from([("CreateNetworkInterface", 150)]);
        assert!(bucket_seconds(&throttle, &small).abs() < 1e-9);
    }

    #[test]
    fn rss_is_read_from_ipamd_status_only() {
        let status = "Name:\tipamd\nUmask:\t0022\nVmPeak:\t  90000 kB\nVmRSS:\t   14321 kB\n";
        assert_eq!(parse_status_kib(status, "ipamd", "VmRSS:"), Some(14321));
        let other = status.replace("ipamd", "ip");
        assert_eq!(parse_status_kib(&other, "ipamd", "VmRSS:"), None);
        assert_eq!(parse_status_kib(status, "ipamd", "RssAnon:"), None);
        let anon = "Name:\tipamd\nRssAnon:\t 9000 kB\n";
        assert_eq!(parse_status_kib(anon, "ipamd", "RssAnon:"), Some(9000));
    }

    #[test]
    fn major_faults_are_the_twelfth_field_of_the_named_process() {
        let stat = "4242 (ipamd) S 1 4242 4242 0 -1 4194560 1510 0 37 0 12 5 0 0 20 0 4 0";
        assert_eq!(parse_stat_major_faults(stat, "ipamd"), Some(37));
        assert_eq!(parse_stat_major_faults(stat, "demo"), None);
        let odd = "7 (a) b)) R 1 7 7 0 -1 0 3 0 9 0";
        assert_eq!(parse_stat_major_faults(odd, "a) b)"), Some(9));
        assert_eq!(parse_stat_major_faults("7 (ipamd) S 1", "ipamd"), None);
        let line = major_faults_line(&[Some(30), None, Some(10), Some(20)]);
        assert!(
            line.contains("max 30, median 20, sum 60 over 3 processes"),
            "{line}"
        );
    }

    #[test]
    fn rss_nodes_line_lists_every_node_in_order() {
        let line = rss_nodes_line(
            &[Some(8 * 1024), None, Some(9 * 1024 + 512)],
            &[Some(5 * 1024), None, None],
        );
        assert_eq!(
            line,
            "- per node, ipamd RSS (file-backed) MiB: 0: 8.0 (5.0), 1: -, 2: 9.5"
        );
    }

    #[test]
    fn rss_summary_counts_max_median_sum_and_the_target() {
        let s = rss_summary(&[Some(10_000), None, Some(20_000), Some(12_000)]);
        assert_eq!(
            s,
            RssSummary {
                measured: 3,
                missing: 1,
                max_kib: 20_000,
                median_kib: 12_000,
                sum_kib: 42_000,
                over_target: 1,
            }
        );
        assert!(rss_line("x", &s, &s).contains("NOT met"));
        let ok = rss_summary(&[Some(10_000), Some(16 * 1024)]);
        assert_eq!((ok.median_kib, ok.over_target), (10_000, 0));
        let line = rss_line("x", &ok, &ok);
        assert!(
            line.contains("16 MiB: met)") && !line.contains("NOT"),
            "{line}"
        );
    }

    #[test]
    fn deltas_and_totals_separate_mutating_and_throttled() {
        let before = BTreeMap::from([(
            "CreateTags".to_owned(),
            ApiCount {
                accepted: 1,
                throttled: 0,
            },
        )]);
        let after = BTreeMap::from([
            (
                "CreateTags".to_owned(),
                ApiCount {
                    accepted: 4,
                    throttled: 2,
                },
            ),
            (
                "DescribeNetworkInterfaces".to_owned(),
                ApiCount {
                    accepted: 5,
                    throttled: 1,
                },
            ),
        ]);
        let d = delta(&before, &after);
        assert_eq!(totals(&d), (8, 3, 3));
    }

    #[test]
    fn svg_is_one_document_with_every_series() {
        let samples: Vec<Sample> = (0u32..5)
            .map(|i| Sample {
                t: f64::from(i),
                pods_ready: (i * 10) as usize,
                accepted: u64::from(i) * 7,
                mutating: u64::from(i) * 3,
                throttled: u64::from(i),
            })
            .collect();
        let s = svg("storm <N=2>", &samples, 40, Some((1.0, 2.0)));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 4);
        assert!(s.contains("storm &lt;N=2&gt;"));
        // the pods line ends at the top of its panel (40 of 40 pods)
        assert!(s.contains("860.0,40.0") || s.contains("840.0,40.0"), "{s}");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn stalls_are_waiting_without_calls_or_progress() {
        let at = |t: f64, ready: usize, accepted: u64| Sample {
            t,
            pods_ready: ready,
            accepted,
            mutating: 0,
            throttled: 0,
        };
        // 0-1 s busy; 1-7 s nothing (a stall of 6 s); 7-8 s calls; 8-10 s calls stop but
        // pods still arrive (not a stall); 10-12 s quiet with everyone ready (not a stall).
        let samples = vec![
            at(0.0, 0, 0),
            at(1.0, 5, 10),
            at(4.0, 5, 10),
            at(7.0, 5, 10),
            at(8.0, 5, 12),
            at(9.0, 8, 12),
            at(10.0, 10, 12),
            at(12.0, 10, 12),
        ];
        assert_eq!(stalls(&samples, 10, 5.0), [(1.0, 7.0)]);
        assert!(stalls(&samples, 10, 6.5).is_empty());
        // a stall running to the end is reported too
        let tail = vec![at(0.0, 0, 0), at(3.0, 0, 0), at(9.0, 0, 0)];
        assert_eq!(stalls(&tail, 1, 5.0), [(0.0, 9.0)]);
    }

    #[test]
    fn cdf_svg_has_the_curve_percentiles_and_bound() {
        let s = cdf_svg(
            "time to address <100>",
            &[3.0, 1.0, 2.0, 4.0],
            Some((5.0, "EC2 bound")),
        );
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 1);
        assert!(
            s.contains("p50 2.0 s") && s.contains("p99 4.0 s") && s.contains("EC2 bound 5.0 s")
        );
        assert!(s.contains("time to address &lt;100&gt;"));
    }
}
