//! `ipamd status`: what an operator reads in seconds instead of raw `/v1/enis` JSON. Fetches the
//! node's own introspection (`/v1/enis`), metrics (`/metrics`) and checkpoint file, then renders
//! one table: ENIs with device, subnet, CIDR kind, assigned / free / cooling addresses, the warm
//! targets against what is held, EC2 errors so far, whether the checkpoint agrees with the
//! datastore, the last failed ADDs with their reasons and counts (`/v1/add-failures`), and the
//! node's subnets with their free addresses as subnet discovery last saw them, the address
//! capacity with its Node condition and taint and the node's own warm targets
//! (`/v1/address-capacity`). Rendering is pure
//! ([`render`]); [`fetch`] is the only I/O. Must not: change anything on the node, call ipamd's
//! gRPC socket.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use serde_json::Value;

use crate::config::{BindAddress, Config, WarmPoolPolicy};
use crate::datastore::checkpoint::{CHECKPOINT_VERSION, CheckpointData};

/// Why an endpoint of the local ipamd could not be read (shown in the table as said here).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The TCP connection was refused or failed.
    #[error("connect {addr}: {source}")]
    Connect {
        /// `host:port` dialled.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed (handshake, request, body).
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The request could not be built.
    #[error(transparent)]
    Request(#[from] hyper::http::Error),
    /// The endpoint answered with an error status.
    #[error("GET {path}: {status}")]
    Status {
        /// Path requested.
        path: String,
        /// What it answered.
        status: hyper::StatusCode,
    },
    /// No answer within 5 s.
    #[error("GET {addr}{path}: timed out")]
    Timeout {
        /// `host:port` dialled.
        addr: String,
        /// Path requested.
        path: String,
    },
    /// The body is not UTF-8.
    #[error(transparent)]
    Utf8(#[from] std::string::FromUtf8Error),
    /// The body is not the JSON expected.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// `/v1/enis`: `INTROSPECTION_BIND_ADDRESS` is a unix socket, which this client does not
    /// dial.
    #[error("INTROSPECTION_BIND_ADDRESS is a unix socket; not supported here")]
    IntrospectionUnsupported,
    /// `/v1/add-failures`: the same, said shorter on the failed-ADDs line.
    #[error("INTROSPECTION_BIND_ADDRESS is a unix socket")]
    IntrospectionUnixSocket,
    /// `/metrics`: the metrics server is off.
    #[error("DISABLE_METRICS=true")]
    MetricsDisabled,
}

/// Everything the table is made of.
#[derive(Debug)]
pub struct Snapshot {
    /// `/v1/enis`, or why it could not be read.
    pub enis: Result<Value, FetchError>,
    /// `/metrics` text, or why it could not be read.
    pub metrics: Result<String, FetchError>,
    /// `/v1/add-failures`, or why it could not be read.
    pub failures: Result<Value, FetchError>,
    /// The checkpoint file as read.
    pub checkpoint: CheckpointHealth,
    /// `/v1/branch-pods` (security groups for pods), None when ipamd serves none
    /// (`ENABLE_POD_ENI` off) or it could not be read.
    pub branch_pods: Option<Value>,
    /// `/v1/address-capacity` (ours), None when it could not be read.
    pub capacity: Option<Value>,
    /// When the snapshot was taken.
    pub now: SystemTime,
}

/// What the checkpoint file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointHealth {
    /// Readable, the shared `vpc-cni-ipam/1` version: this many allocations.
    Ok {
        /// Path read.
        path: PathBuf,
        /// Entries.
        entries: usize,
    },
    /// Missing, unreadable or of another version.
    Bad {
        /// Path read.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

#[derive(Debug, Default)]
struct EniRow {
    id: String,
    device: i64,
    primary: bool,
    excluded: bool,
    trunk: bool,
    subnet: String,
    slash32: usize,
    prefixes: usize,
    assigned: usize,
    cooling: usize,
    free: usize,
}

fn parse_go_time(v: &Value) -> Option<SystemTime> {
    let t =
        time::OffsetDateTime::parse(v.as_str()?, &time::format_description::well_known::Rfc3339)
            .ok()?;
    if t.year() <= 1 {
        return None;
    }
    Some(t.into())
}

fn eni_rows(enis: &Value, now: SystemTime, cooldown: Duration) -> Vec<EniRow> {
    let mut rows = Vec::new();
    for card in enis.as_object().into_iter().flat_map(|m| m.values()) {
        for eni in card["ENIs"]
            .as_object()
            .into_iter()
            .flat_map(|m| m.values())
        {
            let mut row = EniRow {
                id: eni["ID"].as_str().unwrap_or_default().to_owned(),
                device: eni["DeviceNumber"].as_i64().unwrap_or_default(),
                primary: eni["IsPrimary"].as_bool().unwrap_or_default(),
                trunk: eni["IsTrunk"].as_bool().unwrap_or_default(),
                excluded: eni["IsExcludedForPodIPs"].as_bool().unwrap_or_default()
                    || eni["IsTrunk"].as_bool().unwrap_or_default()
                    || eni["IsEFA"].as_bool().unwrap_or_default(),
                subnet: eni["SubnetID"].as_str().unwrap_or_default().to_owned(),
                ..EniRow::default()
            };
            for cidr in eni["AvailableIPv4Cidrs"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values())
            {
                let size = if cidr["IsPrefix"].as_bool().unwrap_or_default() {
                    row.prefixes += 1;
                    16
                } else {
                    row.slash32 += 1;
                    1
                };
                let mut listed = 0;
                for addr in cidr["IPAddresses"]
                    .as_object()
                    .into_iter()
                    .flat_map(|m| m.values())
                {
                    listed += 1;
                    let assigned = addr["IPAMKey"]["networkName"]
                        .as_str()
                        .is_some_and(|n| !n.is_empty());
                    if assigned {
                        row.assigned += 1;
                    } else if parse_go_time(&addr["UnassignedTime"])
                        .and_then(|t| now.duration_since(t).ok())
                        .is_some_and(|age| age < cooldown)
                    {
                        row.cooling += 1;
                    } else {
                        row.free += 1;
                    }
                }
                // Addresses never handed out are not listed: free.
                row.free += size - listed.min(size);
            }
            rows.push(row);
        }
    }
    rows.sort_by_key(|r| r.device);
    rows
}

/// Parses `awscni_aws_api_error_count{api="...",error="..."} N` and
/// `awscni_ec2api_error_count{fn="..."} N` lines: (API, error) → count.
fn ec2_errors(metrics: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix("awscni_aws_api_error_count{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let n: f64 = value.trim().parse().unwrap_or(0.0);
        if n > 0.0 {
            *out.entry(format!("{} {}", label("api"), label("error")))
                .or_insert(0.0) += n;
        }
    }
    out
}

/// The value of the unlabelled series `name`, if the text has it.
fn plain(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// The `targets:` line under `WARM_POOL_POLICY=adaptive`: the warm IP target of the pool
/// loop's last pass and what it came from (`awscni_adaptive_*`), the floor kept.
fn adaptive_targets(metrics: &str, t: &Config) -> String {
    let floor = format!("MINIMUM_IP_TARGET={}", t.pool.minimum_ip_target);
    let Some(warm) = plain(metrics, "awscni_adaptive_warm_ip_target") else {
        return format!("WARM_POOL_POLICY=adaptive, no target computed yet; {floor}");
    };
    let rate = plain(metrics, "awscni_adaptive_add_rate").unwrap_or(0.0);
    let refill = series(metrics, "awscni_adaptive_refill_seconds", "growth");
    let ms = |g: &str| {
        refill
            .get(g)
            .map_or_else(|| "?".to_owned(), |s| format!("{:.0} ms", s * 1000.0))
    };
    format!(
        "WARM_POOL_POLICY=adaptive, warm IP target {warm} ({rate:.2} ADDs/s; refill: assign {}, new ENI {}); {floor}",
        ms("assign"),
        ms("new_eni")
    )
}

/// `name{label="value"} N` lines of one family: value of `label` → N.
fn series(metrics: &str, family: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let open = format!("{family}{{");
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(&open) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Some(v) = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{label}=\"")))
        else {
            continue;
        };
        out.insert(
            v.trim_end_matches('"').to_owned(),
            value.trim().parse().unwrap_or(0.0),
        );
    }
    out
}

/// The node's subnets: those of its ENIs and those subnet discovery described, with the free
/// addresses last seen; /28 blocks are not known on the node (EC2 does not report them: the
/// cluster-wide inventory of cni-metrics-helper counts them), but a recent refusal is.
fn render_subnets(out: &mut String, s: &Snapshot, eni_subnets: &[String]) {
    let text = s.metrics.as_deref().unwrap_or_default();
    let free = series(text, "awscni_subnet_available_ip_addresses", "subnet");
    let mut subnets: std::collections::BTreeSet<String> = free.keys().cloned().collect();
    subnets.extend(eni_subnets.iter().filter(|s| !s.is_empty()).cloned());
    if subnets.is_empty() {
        return;
    }
    let refused_28 = ec2_errors(text)
        .iter()
        .filter(|(k, _)| k.ends_with(" InsufficientCidrBlocks"))
        .map(|(_, n)| *n)
        .sum::<f64>();
    let _ = writeln!(
        out,
        "\nsubnets (free addresses as subnet discovery's DescribeSubnets last saw them):"
    );
    for subnet in &subnets {
        let addresses = free
            .get(subnet)
            .map_or_else(|| "not known".to_owned(), |n| format!("{n}"));
        let _ = writeln!(
            out,
            "  {subnet:<24} free addresses: {addresses:<10} free /28 blocks: not known on the node"
        );
    }
    if refused_28 > 0.0 {
        let _ = writeln!(
            out,
            "  EC2 refused a /28 (InsufficientCidrBlocks) x{refused_28} since start: a subnet is fragmented"
        );
    }
}

/// The last failed ADDs (`/v1/add-failures`).
fn render_failures(out: &mut String, s: &Snapshot) {
    let v = match &s.failures {
        Err(e) => {
            let _ = writeln!(out, "\nfailed ADDs: not known ({e})");
            return;
        }
        Ok(v) => v,
    };
    let totals: Vec<String> = v["totals"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, n)| format!("{k} x{}", n.as_u64().unwrap_or_default()))
        .collect();
    if totals.is_empty() {
        let _ = writeln!(out, "\nfailed ADDs: none since start");
        return;
    }
    let _ = writeln!(out, "\nfailed ADDs since start: {}", totals.join(", "));
    let now = s
        .now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    for e in v["recent"].as_array().into_iter().flatten().take(10) {
        let last = e["last"].as_u64().unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<24} {}/{} x{}, last {}s ago: {}",
            e["reason"].as_str().unwrap_or_default(),
            e["namespace"].as_str().unwrap_or_default(),
            e["pod"].as_str().unwrap_or_default(),
            e["count"].as_u64().unwrap_or_default(),
            now.saturating_sub(last),
            e["message"].as_str().unwrap_or_default()
        );
    }
}

/// The table.
#[must_use]
pub fn render(s: &Snapshot, t: &Config) -> String {
    let mut out = String::new();
    let mut eni_subnets = Vec::new();
    match &s.enis {
        Err(e) => {
            let _ = writeln!(out, "ipamd introspection unreachable: {e}");
        }
        Ok(enis) => {
            let rows = eni_rows(enis, s.now, t.pool.ip_cooldown_period);
            eni_subnets = rows.iter().map(|r| r.subnet.clone()).collect();
            let _ = writeln!(
                out,
                "{:<32} {:>3}  {:<24} {:>11}  {:>8} {:>5} {:>7}",
                "ENI", "DEV", "SUBNET", "CIDRS", "ASSIGNED", "FREE", "COOLING"
            );
            let (mut assigned, mut free, mut cooling) = (0, 0, 0);
            for r in &rows {
                let kind = if r.trunk {
                    "trunk".to_owned()
                } else if r.excluded {
                    "excluded".to_owned()
                } else {
                    match (r.slash32, r.prefixes) {
                        (0, 0) => "-".to_owned(),
                        (n, 0) => format!("{n} /32"),
                        (0, p) => format!("{p} /28"),
                        (n, p) => format!("{n} /32 {p} /28"),
                    }
                };
                let name = if r.primary {
                    format!("{} (primary)", r.id)
                } else {
                    r.id.clone()
                };
                let free_here = if r.excluded { 0 } else { r.free };
                let _ = writeln!(
                    out,
                    "{name:<32} {:>3}  {:<24} {kind:>11}  {:>8} {:>5} {:>7}",
                    r.device, r.subnet, r.assigned, free_here, r.cooling
                );
                assigned += r.assigned;
                free += free_here;
                cooling += r.cooling;
            }
            let _ = writeln!(
                out,
                "\npool: {assigned} assigned, {free} free, {cooling} cooling (released < {}s ago)",
                t.pool.ip_cooldown_period.as_secs()
            );
            let targets = if t.pool.warm_pool_policy == WarmPoolPolicy::Adaptive {
                adaptive_targets(s.metrics.as_deref().unwrap_or_default(), t)
            } else if t.pool.enable_prefix_delegation {
                format!(
                    "prefix delegation, WARM_PREFIX_TARGET={} WARM_IP_TARGET={} MINIMUM_IP_TARGET={}",
                    t.pool.warm_prefix_target, t.pool.warm_ip_target, t.pool.minimum_ip_target
                )
            } else if t.pool.uses_ip_targets() {
                format!(
                    "WARM_IP_TARGET={} MINIMUM_IP_TARGET={} (WARM_ENI_TARGET ignored)",
                    t.pool.warm_ip_target, t.pool.minimum_ip_target
                )
            } else {
                format!("WARM_ENI_TARGET={}", t.pool.warm_eni_target)
            };
            let _ = writeln!(out, "targets: {targets}; held free: {free}");
            match &s.checkpoint {
                CheckpointHealth::Ok { path, entries } if *entries == assigned => {
                    let _ = writeln!(
                        out,
                        "checkpoint: ok, {entries} entries = {assigned} assigned ({})",
                        path.display()
                    );
                }
                CheckpointHealth::Ok { path, entries } => {
                    let _ = writeln!(
                        out,
                        "checkpoint: {entries} entries but {assigned} assigned ({}; a call in \
                         flight, or entries pending verification)",
                        path.display()
                    );
                }
                CheckpointHealth::Bad { path, why } => {
                    let _ = writeln!(out, "checkpoint: PROBLEM at {}: {why}", path.display());
                }
            }
        }
    }
    if let Some(b) = &s.branch_pods {
        render_branch_pods(&mut out, b);
    }
    match &s.metrics {
        Err(e) => {
            let _ = writeln!(out, "EC2 errors: metrics unreachable ({e})");
        }
        Ok(text) => {
            let errors = ec2_errors(text);
            if errors.is_empty() {
                let _ = writeln!(out, "EC2 errors: none since start");
            } else {
                let list: Vec<String> = errors.iter().map(|(k, n)| format!("{k} x{n}")).collect();
                let _ = writeln!(out, "EC2 errors since start: {}", list.join(", "));
            }
        }
    }
    if let Some(c) = &s.capacity {
        render_capacity(&mut out, c);
    }
    render_failures(&mut out, s);
    render_subnets(&mut out, s, &eni_subnets);
    out
}

/// The address capacity, its publication on the Node, and the node's own warm targets
/// (`/v1/address-capacity`).
fn render_capacity(out: &mut String, c: &Value) {
    let n = |k: &str| {
        c[k].as_u64()
            .map_or_else(|| "?".to_owned(), |v| v.to_string())
    };
    let _ = writeln!(
        out,
        "address capacity: {} obtainable for new pods ({} free, {} cooling, {} more from EC2; bound: {}){}",
        n("obtainable"),
        n("free"),
        n("cooling"),
        n("fromEc2"),
        c["bound"].as_str().unwrap_or("?"),
        if c["exhausted"].as_bool() == Some(true) {
            "; EXHAUSTED"
        } else {
            ""
        }
    );
    for (what, name, var) in [
        ("condition", "type", "IPAMD_ADDRESS_CAPACITY_CONDITION"),
        ("taint", "key", "IPAMD_ADDRESS_CAPACITY_TAINT"),
    ] {
        let state = &c[what]["state"];
        let said = if state["enabled"].as_bool() != Some(true) {
            format!("not published ({var} off)")
        } else if let Some(e) = state["error"].as_str() {
            format!("REFUSED by the API server: {e}")
        } else {
            state["published"]
                .as_str()
                .map_or_else(|| "not written yet".to_owned(), str::to_owned)
        };
        let _ = writeln!(
            out,
            "  {what} {}: {said}",
            c[what][name].as_str().unwrap_or("?")
        );
    }
    render_subnet_inventory(out, c);
    let w = &c["warmTargets"];
    let listed = |v: &Value| {
        v.as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?")))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    let node = listed(&w["annotations"]);
    let config = &w["eniConfig"];
    let config_name = config["name"].as_str().unwrap_or("?");
    let config_given = !config.is_null();
    if let Some(why) = w["refused"].as_str() {
        let _ = writeln!(
            out,
            "warm targets: the node's annotations are REFUSED ({node}): {why}"
        );
    }
    if let Some(why) = config["refused"].as_str() {
        let _ = writeln!(
            out,
            "warm targets: ENIConfig {config_name}'s annotations are REFUSED ({}): {why}",
            listed(&config["annotations"])
        );
    }
    let mut from = Vec::new();
    if w["refused"].is_null() && !node.is_empty() {
        from.push(format!("the node's annotations ({node})"));
    }
    if config_given && config["refused"].is_null() {
        from.push(format!(
            "ENIConfig {config_name}'s annotations ({})",
            listed(&config["annotations"])
        ));
    }
    if w["fromNode"].as_bool() == Some(true) && !from.is_empty() {
        let _ = writeln!(
            out,
            "warm targets: from {}: WARM_IP_TARGET={} MINIMUM_IP_TARGET={} WARM_ENI_TARGET={} WARM_PREFIX_TARGET={}",
            from.join(" over "),
            w["WARM_IP_TARGET"],
            w["MINIMUM_IP_TARGET"],
            w["WARM_ENI_TARGET"],
            w["WARM_PREFIX_TARGET"]
        );
    } else if !w["refused"].is_null() || !config["refused"].is_null() {
        let _ = writeln!(out, "warm targets: the environment's targets are in force");
    }
}

/// cni-metrics-helper's subnet inventory as the capacity used it, and its forecast.
fn render_subnet_inventory(out: &mut String, c: &Value) {
    let inv = &c["subnetInventory"];
    let Some(cm) = inv["configMap"].as_str() else {
        return;
    };
    let state = inv["state"].as_str().unwrap_or("?");
    let said = match (state, inv["reason"].as_str()) {
        ("used", _) => format!(
            "USED (observed {}): subnets' free space {}",
            inv["observedAt"].as_str().unwrap_or("?"),
            c["subnetFree"]
        ),
        ("pending", _) => "not read yet".to_owned(),
        (s, Some(why)) => format!("{} ({why}): ipamd's own figure", s.to_ascii_uppercase()),
        (s, None) => s.to_ascii_uppercase(),
    };
    let _ = writeln!(out, "  subnet inventory {cm}: {said}");
    if let Some(at) = c["subnetExhaustionForecast"].as_str() {
        let _ = writeln!(
            out,
            "  subnets forecast to run out at {at} (cni-metrics-helper)"
        );
    }
}

/// Security groups for pods: the trunk and one line per branch pod.
fn render_branch_pods(out: &mut String, b: &Value) {
    let trunk = b["TrunkENI"].as_str().unwrap_or_default();
    let pods = b["BranchPods"].as_array().cloned().unwrap_or_default();
    let trunk = if trunk.is_empty() {
        "none attached yet"
    } else {
        trunk
    };
    let _ = writeln!(out, "trunk ENI: {trunk}; branch pods: {}", pods.len());
    for p in &pods {
        let ip = p["IPv4"]
            .as_str()
            .filter(|s| !s.is_empty())
            .or_else(|| p["IPv6"].as_str())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {}/{} {} vlan {} {ip}",
            p["Namespace"].as_str().unwrap_or_default(),
            p["Name"].as_str().unwrap_or_default(),
            p["ENIID"].as_str().unwrap_or_default(),
            p["VlanID"].as_i64().unwrap_or_default(),
        );
    }
}

/// Reads the checkpoint file.
#[must_use]
pub fn checkpoint_health(path: &Path) -> CheckpointHealth {
    let bad = |why: String| CheckpointHealth::Bad {
        path: path.to_owned(),
        why,
    };
    match std::fs::read(path) {
        Err(e) => bad(e.to_string()),
        Ok(bytes) => match serde_json::from_slice::<CheckpointData>(&bytes) {
            Err(e) => bad(format!("not a checkpoint: {e}")),
            Ok(d) if d.version != CHECKPOINT_VERSION => bad(format!(
                "version {:?}, expected {CHECKPOINT_VERSION:?}",
                d.version
            )),
            Ok(d) => CheckpointHealth::Ok {
                path: path.to_owned(),
                entries: d.allocations.len(),
            },
        },
    }
}

/// `GET http://<addr><path>` (5 s). The connection is driven here, beside the exchange (no
/// task of its own), and closed on return.
async fn http_get(addr: &str, path: &str) -> Result<String, FetchError> {
    let work = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|source| FetchError::Connect {
                addr: addr.to_owned(),
                source,
            })?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        let exchange = async move {
            let request = hyper::Request::get(path)
                .header(hyper::header::HOST, addr)
                .body(Empty::<Bytes>::new())?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            if !status.is_success() {
                return Err(FetchError::Status {
                    path: path.to_owned(),
                    status,
                });
            }
            Ok(String::from_utf8(body.to_vec())?)
        };
        tokio::pin!(exchange, conn);
        let mut conn_ended = false;
        loop {
            tokio::select! {
                r = &mut exchange => break r,
                // The connection ended first (closed or failed): the exchange still reads
                // what arrived, or fails on its own.
                _ = &mut conn, if !conn_ended => conn_ended = true,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .map_err(|_| FetchError::Timeout {
            addr: addr.to_owned(),
            path: path.to_owned(),
        })?
}

/// Where `ipamd status` looks: the addresses and paths of the ipamd that `config` configures.
#[must_use]
pub fn endpoints(config: &Config) -> (Option<String>, String, PathBuf) {
    let introspection = match &config.http.introspection_bind {
        BindAddress::Tcp(a) => Some(match a.strip_prefix(':') {
            Some(port) => format!("127.0.0.1:{port}"),
            None => a.clone(),
        }),
        BindAddress::Unix(_) => None,
    };
    let metrics = if config.http.metrics_bind.ip().is_unspecified() {
        format!("127.0.0.1:{}", config.http.metrics_bind.port())
    } else {
        config.http.metrics_bind.to_string()
    };
    (introspection, metrics, config.node.backing_store.clone())
}

fn introspection_addr(config: &Config) -> Option<String> {
    endpoints(config).0
}

/// Everything [`render`] needs, read from the local ipamd.
pub async fn fetch(config: &Config) -> Snapshot {
    let (introspection, metrics, checkpoint) = endpoints(config);
    let enis = match introspection.clone() {
        Some(addr) => http_get(&addr, "/v1/enis")
            .await
            .and_then(|b| Ok(serde_json::from_str(&b)?)),
        None => Err(FetchError::IntrospectionUnsupported),
    };
    let failures = match introspection_addr(config) {
        Some(addr) => http_get(&addr, "/v1/add-failures")
            .await
            .and_then(|b| Ok(serde_json::from_str(&b)?)),
        None => Err(FetchError::IntrospectionUnixSocket),
    };
    Snapshot {
        enis,
        failures,
        metrics: if config.http.disable_metrics {
            Err(FetchError::MetricsDisabled)
        } else {
            http_get(&metrics, "/metrics").await
        },
        checkpoint: checkpoint_health(&checkpoint),
        capacity: match introspection_addr(config) {
            Some(addr) => http_get(&addr, "/v1/address-capacity")
                .await
                .ok()
                .and_then(|b| serde_json::from_str(&b).ok()),
            None => None,
        },
        now: SystemTime::now(),
        branch_pods: match (config.kube.pod_eni, introspection) {
            (Some(_), Some(addr)) => http_get(&addr, "/v1/branch-pods")
                .await
                .ok()
                .and_then(|b| serde_json::from_str(&b).ok()),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn go(secs: u64) -> String {
        time::OffsetDateTime::from(at(secs))
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    }

    fn snapshot(checkpoint_entries: usize) -> Snapshot {
        let zero = "0001-01-01T00:00:00Z";
        let enis = json!({"0": {"TotalIPs": 20, "AssignedIPs": 2, "ENIs": {
            "eni-a": {"ID": "eni-a", "IsPrimary": true, "IsTrunk": false, "IsEFA": false,
                "DeviceNumber": 0, "IsExcludedForPodIPs": false, "SubnetID": "subnet-1",
                "AvailableIPv4Cidrs": {
                    "198.18.0.5/32": {"IsPrefix": false, "IPAddresses": {"198.18.0.5": {
                        "IPAMKey": {"networkName": "aws-cni"}, "AssignedTime": go(1000),
                        "UnassignedTime": zero}}},
                    "198.18.0.6/32": {"IsPrefix": false, "IPAddresses": {"198.18.0.6": {
                        "IPAMKey": {"networkName": ""}, "AssignedTime": zero,
                        "UnassignedTime": go(1990)}}},
                    "198.18.0.7/32": {"IsPrefix": false, "IPAddresses": {"198.18.0.7": {
                        "IPAMKey": {"networkName": ""}, "AssignedTime": zero,
                        "UnassignedTime": go(100)}}},
                    "198.18.0.8/32": {"IsPrefix": false, "IPAddresses": {}}}},
            "eni-b": {"ID": "eni-b", "IsPrimary": false, "IsTrunk": false, "IsEFA": false,
                "DeviceNumber": 1, "IsExcludedForPodIPs": false, "SubnetID": "subnet-1",
                "AvailableIPv4Cidrs": {
                    "198.18.1.16/28": {"IsPrefix": true, "IPAddresses": {"198.18.1.17": {
                        "IPAMKey": {"networkName": "aws-cni"}, "AssignedTime": go(1500),
                        "UnassignedTime": zero}}}}}}}});
        Snapshot {
            enis: Ok(enis),
            metrics: Ok("# TYPE awscni_aws_api_error_count counter\n\
                awscni_aws_api_error_count{api=\"AssignPrivateIpAddresses\",error=\"InsufficientFreeAddressesInSubnet\"} 3\n\
                awscni_aws_api_error_count{api=\"DescribeNetworkInterfaces\",error=\"RequestLimitExceeded\"} 0\n"
                .into()),
            checkpoint: CheckpointHealth::Ok {
                path: "/var/run/aws-node/ipam.json".into(),
                entries: checkpoint_entries,
            },
            failures: Ok(json!({"totals": {}, "recent": []})),
            now: at(2000),
            branch_pods: None,
            capacity: None,
        }
    }

    fn refused(addr: &str) -> FetchError {
        FetchError::Connect {
            addr: addr.to_owned(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        }
    }

    /// The messages the table shows are the ones `ipamd status` always printed.
    #[test]
    fn fetch_errors_read_as_before() {
        assert_eq!(
            refused("127.0.0.1:61679").to_string(),
            "connect 127.0.0.1:61679: connection refused"
        );
        let timeout = FetchError::Timeout {
            addr: "127.0.0.1:61679".into(),
            path: "/v1/enis".into(),
        };
        assert_eq!(
            timeout.to_string(),
            "GET 127.0.0.1:61679/v1/enis: timed out"
        );
        let status = FetchError::Status {
            path: "/v1/enis".into(),
            status: hyper::StatusCode::NOT_FOUND,
        };
        assert_eq!(status.to_string(), "GET /v1/enis: 404 Not Found");
        assert_eq!(
            FetchError::IntrospectionUnsupported.to_string(),
            "INTROSPECTION_BIND_ADDRESS is a unix socket; not supported here"
        );
        assert_eq!(
            FetchError::IntrospectionUnixSocket.to_string(),
            "INTROSPECTION_BIND_ADDRESS is a unix socket"
        );
        assert_eq!(
            FetchError::MetricsDisabled.to_string(),
            "DISABLE_METRICS=true"
        );
        let json = serde_json::from_str::<Value>("{").unwrap_err();
        assert_eq!(
            FetchError::from(json).to_string(),
            serde_json::from_str::<Value>("{").unwrap_err().to_string()
        );
    }

    /// A real exchange with a local server: the body read, an error status said, a closed
    /// port refused; the connection is driven by the call itself (no task left behind).
    #[tokio::test]
    async fn http_get_reads_a_local_endpoint() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = async {
            for (status, body) in [("200 OK", "{\"ok\":1}"), ("503 Service Unavailable", "")] {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                let mut buf = [0_u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = conn.read(&mut buf).await.unwrap();
                    assert_ne!(n, 0);
                    request.extend_from_slice(&buf[..n]);
                }
                let reply = format!(
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                conn.write_all(reply.as_bytes()).await.unwrap();
            }
        };
        let client = async {
            let ok = http_get(&addr, "/v1/enis").await.unwrap();
            let bad = http_get(&addr, "/v1/enis").await.unwrap_err();
            (ok, bad)
        };
        let ((ok, bad), ()) = tokio::join!(client, server);
        assert_eq!(ok, "{\"ok\":1}");
        assert_eq!(bad.to_string(), "GET /v1/enis: 503 Service Unavailable");
        drop(listener);
        let refused = http_get(&addr, "/metrics").await.unwrap_err();
        assert!(matches!(refused, FetchError::Connect { .. }), "{refused}");
    }

    fn targets() -> Config {
        Config::from_env_map(&[("ENABLE_IPv4".to_owned(), "true".to_owned())].into()).unwrap()
    }

    #[test]
    fn table_counts_assigned_free_and_cooling_per_eni() {
        let out = render(&snapshot(2), &targets());
        let line = |id: &str| {
            out.lines()
                .find(|l| l.starts_with(id))
                .unwrap_or_else(|| panic!("{id} row missing:\n{out}"))
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        // eni-a: 4 /32s; .5 assigned, .6 released 10 s ago (cooling), .7 long ago and .8 never
        // handed out (free).
        assert_eq!(
            line("eni-a"),
            [
                "eni-a",
                "(primary)",
                "0",
                "subnet-1",
                "4",
                "/32",
                "1",
                "2",
                "1"
            ]
        );
        // eni-b: one /28, one address assigned, 15 free.
        assert_eq!(
            line("eni-b"),
            ["eni-b", "1", "subnet-1", "1", "/28", "1", "15", "0"]
        );
        assert!(
            out.contains("pool: 2 assigned, 17 free, 1 cooling"),
            "{out}"
        );
        assert!(
            out.contains("targets: WARM_ENI_TARGET=1; held free: 17"),
            "{out}"
        );
        assert!(
            out.contains("checkpoint: ok, 2 entries = 2 assigned"),
            "{out}"
        );
        assert!(
            out.contains("AssignPrivateIpAddresses InsufficientFreeAddressesInSubnet x3"),
            "{out}"
        );
        assert!(
            !out.contains("RequestLimitExceeded"),
            "zero counts are not errors:\n{out}"
        );
    }

    /// Under the adaptive policy the targets line says the target the pool loop computed, not
    /// the environment's WARM_* values it replaces.
    #[test]
    fn the_adaptive_target_is_said_in_place_of_the_warm_targets() {
        let adaptive = Config::from_env_map(
            &[
                ("ENABLE_IPv4".to_owned(), "true".to_owned()),
                ("WARM_POOL_POLICY".to_owned(), "adaptive".to_owned()),
                ("MINIMUM_IP_TARGET".to_owned(), "3".to_owned()),
            ]
            .into(),
        )
        .unwrap();
        let mut s = snapshot(2);
        let out = render(&s, &adaptive);
        assert!(
            out.contains("targets: WARM_POOL_POLICY=adaptive, no target computed yet; MINIMUM_IP_TARGET=3; held free: 17"),
            "{out}"
        );
        s.metrics = Ok("awscni_adaptive_warm_ip_target 7\n\
            awscni_adaptive_add_rate 0.25\n\
            awscni_adaptive_refill_seconds{growth=\"assign\"} 0.4\n\
            awscni_adaptive_refill_seconds{growth=\"new_eni\"} 6.5\n"
            .into());
        let out = render(&s, &adaptive);
        assert!(
            out.contains("targets: WARM_POOL_POLICY=adaptive, warm IP target 7 (0.25 ADDs/s; refill: assign 400 ms, new ENI 6500 ms); MINIMUM_IP_TARGET=3; held free: 17"),
            "{out}"
        );
        assert!(!out.contains("WARM_ENI_TARGET"), "{out}");
    }

    /// Security groups for pods: the trunk's row says so, the branch pods are listed.
    #[test]
    fn trunk_and_branch_pods_are_shown() {
        let mut s = snapshot(2);
        if let Ok(enis) = &mut s.enis {
            enis["0"]["ENIs"]["eni-t"] = json!({"ID": "eni-t", "IsPrimary": false,
                "IsTrunk": true, "IsEFA": false, "DeviceNumber": 2,
                "IsExcludedForPodIPs": false, "SubnetID": "subnet-1",
                "AvailableIPv4Cidrs": {}});
        }
        s.branch_pods = Some(json!({"TrunkENI": "eni-t", "BranchPods": [
            {"Namespace": "db", "Name": "client", "ENIID": "eni-b1", "VlanID": 1,
             "MAC": "02:00:00:00:00:01", "IPv4": "198.18.0.77", "IPv6": ""}]}));
        let out = render(&s, &targets());
        let trunk = out.lines().find(|l| l.starts_with("eni-t")).unwrap();
        assert!(trunk.contains("trunk"), "{out}");
        assert!(out.contains("trunk ENI: eni-t; branch pods: 1"), "{out}");
        assert!(out.contains("db/client eni-b1 vlan 1 198.18.0.77"), "{out}");
        // The trunk holds no pod address: the pool totals are unchanged.
        assert!(out.contains("pool: 2 assigned, 17 free"), "{out}");
    }

    #[test]
    fn disagreements_and_outages_are_said_plainly() {
        let out = render(&snapshot(5), &targets());
        assert!(
            out.contains("checkpoint: 5 entries but 2 assigned"),
            "{out}"
        );
        let mut s = snapshot(2);
        s.checkpoint = CheckpointHealth::Bad {
            path: "/x".into(),
            why: "No such file".into(),
        };
        s.metrics = Err(refused("127.0.0.1:61678"));
        let out = render(&s, &targets());
        assert!(
            out.contains("checkpoint: PROBLEM at /x: No such file"),
            "{out}"
        );
        assert!(out.contains("EC2 errors: metrics unreachable"), "{out}");
        s.enis = Err(refused("127.0.0.1:61679"));
        assert!(render(&s, &targets()).starts_with("ipamd introspection unreachable"));
    }

    #[test]
    fn last_failures_and_subnets_are_listed() {
        let mut s = snapshot(2);
        s.failures = Ok(
            json!({"totals": {"SubnetFull": 3, "MaxPods": 1}, "recent": [
            {"reason": "SubnetFull", "namespace": "default", "pod": "web-0", "count": 3,
             "first": 1900, "last": 1990, "message": "subnet exhausted: subnet-1: no free addresses"}]}),
        );
        s.metrics = Ok("awscni_subnet_available_ip_addresses{subnet=\"subnet-1\"} 0\n\
            awscni_subnet_available_ip_addresses{subnet=\"subnet-2\"} 250\n\
            awscni_aws_api_error_count{api=\"AssignPrivateIpAddresses\",error=\"InsufficientCidrBlocks\"} 2\n".into());
        let out = render(&s, &targets());
        assert!(
            out.contains("failed ADDs since start: MaxPods x1, SubnetFull x3"),
            "{out}"
        );
        assert!(
            out.contains("SubnetFull")
                && out.contains("default/web-0 x3, last 10s ago: subnet exhausted"),
            "{out}"
        );
        assert!(out.contains("subnet-1"), "{out}");
        let line = |id: &str| {
            out.lines()
                .find(|l| l.trim_start().starts_with(id))
                .unwrap_or_default()
                .to_owned()
        };
        assert!(line("subnet-2").contains("free addresses: 250"), "{out}");
        assert!(line("subnet-1").contains("free addresses: 0 "), "{out}");
        assert!(
            line("subnet-1").contains("free /28 blocks: not known"),
            "{out}"
        );
        assert!(out.contains("InsufficientCidrBlocks) x2"), "{out}");
        s.failures = Ok(json!({"totals": {}, "recent": []}));
        assert!(render(&s, &targets()).contains("failed ADDs: none since start"));
        s.failures = Err(refused("127.0.0.1:61679"));
        assert!(
            render(&s, &targets())
                .contains("failed ADDs: not known (connect 127.0.0.1:61679: connection refused)")
        );
    }

    #[test]
    fn address_capacity_and_refusals_are_said() {
        let mut s = snapshot(2);
        s.capacity = Some(json!({
            "obtainable": 0, "free": 0, "cooling": 0, "fromEc2": 0, "bound": "subnet",
            "exhausted": true,
            "condition": {"type": "networking.k8s.aws/AddressCapacity",
                "state": {"enabled": true, "published": "False", "error": null}},
            "taint": {"key": "networking.k8s.aws/address-capacity-exhausted",
                "state": {"enabled": true, "published": null, "error": "403 Forbidden"}},
            "warmTargets": {"WARM_IP_TARGET": 0, "MINIMUM_IP_TARGET": 0, "WARM_ENI_TARGET": 1,
                "WARM_PREFIX_TARGET": 0, "fromNode": false,
                "annotations": {"networking.k8s.aws/warm-ip-target": "x"},
                "refused": "networking.k8s.aws/warm-ip-target=\"x\" is not a whole number"},
        }));
        let out = render(&s, &targets());
        assert!(out.contains("address capacity: 0 obtainable for new pods (0 free, 0 cooling, 0 more from EC2; bound: subnet); EXHAUSTED"), "{out}");
        assert!(
            out.contains("  condition networking.k8s.aws/AddressCapacity: False"),
            "{out}"
        );
        assert!(out.contains("  taint networking.k8s.aws/address-capacity-exhausted: REFUSED by the API server: 403 Forbidden"), "{out}");
        assert!(out.contains("warm targets: the node's annotations are REFUSED (networking.k8s.aws/warm-ip-target=x)"), "{out}");
        assert!(
            out.contains("warm targets: the environment's targets are in force"),
            "{out}"
        );
        // the ENIConfig's level under the node's
        s.capacity.as_mut().unwrap()["warmTargets"] = json!({"WARM_IP_TARGET": 2,
            "MINIMUM_IP_TARGET": 12, "WARM_ENI_TARGET": 0, "WARM_PREFIX_TARGET": 0,
            "fromNode": true,
            "annotations": {"networking.k8s.aws/warm-ip-target": "2"},
            "refused": null,
            "eniConfig": {"name": "us-west-2a",
                "annotations": {"networking.k8s.aws/minimum-ip-target": "12"}, "refused": null}});
        let out = render(&s, &targets());
        assert!(out.contains("warm targets: from the node's annotations (networking.k8s.aws/warm-ip-target=2) over ENIConfig us-west-2a's annotations (networking.k8s.aws/minimum-ip-target=12): WARM_IP_TARGET=2 MINIMUM_IP_TARGET=12 WARM_ENI_TARGET=0"), "{out}");
        assert!(!out.contains("REFUSED ("), "{out}");
        s.capacity.as_mut().unwrap()["warmTargets"]["eniConfig"]["refused"] =
            json!("x is not a whole number");
        s.capacity.as_mut().unwrap()["warmTargets"]["MINIMUM_IP_TARGET"] = json!(0);
        let out = render(&s, &targets());
        assert!(out.contains("warm targets: ENIConfig us-west-2a's annotations are REFUSED (networking.k8s.aws/minimum-ip-target=12): x is not a whole number"), "{out}");
        assert!(out.contains("warm targets: from the node's annotations (networking.k8s.aws/warm-ip-target=2): WARM_IP_TARGET=2 MINIMUM_IP_TARGET=0"), "{out}");
        assert!(
            !out.contains("the environment's targets are in force"),
            "{out}"
        );
        assert!(
            !out.contains("subnet inventory"),
            "not configured: not said"
        );
    }

    #[test]
    fn the_subnet_inventory_and_its_forecast_are_said() {
        let mut s = snapshot(2);
        let capacity = |inventory: Value, forecast: Value| {
            json!({
                "obtainable": 3, "free": 3, "cooling": 0, "fromEc2": 0, "bound": "subnet",
                "exhausted": false, "subnetFree": 0, "subnetExhaustionForecast": forecast,
                "condition": {"type": "c", "state": {"enabled": false}},
                "taint": {"key": "t", "state": {"enabled": false}},
                "subnetInventory": inventory,
                "warmTargets": {},
            })
        };
        s.capacity = Some(capacity(
            json!({"configMap": "kube-system/inv", "state": "used", "reason": null,
                "observedAt": "2030-01-01T00:00:00Z"}),
            json!("2030-01-01T06:00:00Z"),
        ));
        let out = render(&s, &targets());
        assert!(out.contains("  subnet inventory kube-system/inv: USED (observed 2030-01-01T00:00:00Z): subnets' free space 0"), "{out}");
        assert!(
            out.contains(
                "  subnets forecast to run out at 2030-01-01T06:00:00Z (cni-metrics-helper)"
            ),
            "{out}"
        );
        s.capacity = Some(capacity(
            json!({"configMap": "kube-system/inv", "state": "malformed",
                "reason": "inventory.json is not a subnet inventory: EOF"}),
            Value::Null,
        ));
        let out = render(&s, &targets());
        assert!(out.contains("  subnet inventory kube-system/inv: MALFORMED (inventory.json is not a subnet inventory: EOF): ipamd's own figure"), "{out}");
        assert!(!out.contains("forecast"), "{out}");
    }

    #[test]
    fn checkpoint_file_health() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ipam.json");
        assert!(matches!(
            checkpoint_health(&p),
            CheckpointHealth::Bad { .. }
        ));
        std::fs::write(&p, r#"{"version":"vpc-cni-ipam/1","allocations":[]}"#).unwrap();
        assert_eq!(
            checkpoint_health(&p),
            CheckpointHealth::Ok {
                path: p.clone(),
                entries: 0
            }
        );
        std::fs::write(&p, r#"{"version":"vpc-cni-ipam/9","allocations":[]}"#).unwrap();
        assert!(matches!(
            checkpoint_health(&p),
            CheckpointHealth::Bad { .. }
        ));
    }
}
