//! The network-policy agent stand-in's contract and harness handle: the control files the
//! `npa-standin` binary reads and writes in its state directory (`fault`, `policies/`,
//! `calls.jsonl`) with their serde types ([`Fault`], [`Policy`], [`Event`], [`Call`]), the
//! names of its per-pod iptables chains, and [`NpaStandin`], which starts the binary inside a
//! node namespace, steers it through those files and stops it by PID on drop.
//! Must not: touch any network namespace itself (the binary owns the datapath, inside the
//! namespace it was started in), or signal a process it did not start.
//!
//! The stand-in behaves as aws-network-policy-agent does towards the plugin: `rpc.NPBackend`
//! (`EnforceNpToPod`, `DeletePodNp`) on a unix socket, with the pod's filtering in place before
//! `EnforceNpToPod` answers. Its datapath is iptables instead of eBPF: per pod, chain
//! [`to_pod_chain`] (jumped from `FORWARD` and `OUTPUT` with `-o <veth>`) and
//! [`from_pod_chain`] (from `FORWARD` and `INPUT` with `-i <veth>`), in the filter table of
//! both families; allowed traffic `RETURN`s, the rest is dropped.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::supervisor::{self, PidList, Stop, Supervised};

/// The fault file in the state directory (see [`Fault`]).
pub const FAULT_FILE: &str = "fault";
/// The directory of per-pod policies in the state directory (see [`Policy::file_name`]).
pub const POLICIES_DIR: &str = "policies";
/// The event journal in the state directory, one JSON [`Event`] per line.
pub const CALLS_FILE: &str = "calls.jsonl";
/// The stand-in's stderr (its tracing log) in the state directory, when the harness starts it.
pub const LOG_FILE: &str = "npa-standin.log";
/// The socket's file name in the state directory, unless [`NpaOptions::socket`] says otherwise.
pub const SOCKET_FILE: &str = "npa.sock";
/// The host-veth prefix upstream's plugin uses by default (`AWS_VPC_K8S_CNI_VETHPREFIX`).
pub const DEFAULT_VETH_PREFIX: &str = "eni";
/// Longest chain name iptables accepts.
pub const MAX_CHAIN_LEN: usize = 28;
/// How often the stand-in polls the fault file.
pub const FAULT_POLL: Duration = Duration::from_millis(20);

/// How long [`NpaStandin::start`] and [`NpaStandin::set_fault`] wait for the socket to appear
/// or go.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A failure of the harness handle or a malformed control file.
#[derive(Debug, thiserror::Error)]
pub enum NpaError {
    /// The `npa-standin` binary is not next to the running test.
    #[error("{} not built; run `cargo test --workspace --no-run` first", path.display())]
    NotBuilt {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A control file or the state directory could not be read or written.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The process could not be started.
    #[error("spawn npa-standin in {netns}")]
    Spawn {
        /// The namespace it was aimed into.
        netns: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The process exited before (or while) it was waited for; `log` is its stderr.
    #[error("npa-standin exited ({status}): {log}")]
    Exited {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The tail of its log.
        log: String,
    },
    /// The socket did not appear (or, for [`Fault::Refuse`], go) in time.
    #[error("socket {} not {state} after {waited:?}", socket.display())]
    Timeout {
        /// The socket.
        socket: PathBuf,
        /// `listening` or `gone`.
        state: &'static str,
        /// How long it was waited for.
        waited: Duration,
    },
    /// The fault file holds something other than the [`Fault`] forms.
    #[error("bad fault {0:?} (expected empty, `refuse`, `fail` or `slow <ms>`)")]
    BadFault(String),
    /// A policy or journal line is not valid JSON of its type.
    #[error("parse {}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// The `fault` file: how the stand-in misbehaves, re-read at every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Absent or empty: normal service.
    #[default]
    None,
    /// `refuse`: nobody listens (listener dropped, socket file removed) until the file changes.
    Refuse,
    /// `fail`: every call answers `Success=false` (recorded, nothing installed).
    Fail,
    /// `slow <ms>`: sleep that long before doing the work and answering.
    Slow(Duration),
}

impl FromStr for Fault {
    type Err = NpaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let mut words = text.split_whitespace();
        let fault = match (words.next(), words.next()) {
            (None, _) => Self::None,
            (Some("refuse"), None) => Self::Refuse,
            (Some("fail"), None) => Self::Fail,
            (Some("slow"), Some(ms)) => ms
                .parse()
                .map(|ms| Self::Slow(Duration::from_millis(ms)))
                .map_err(|_| NpaError::BadFault(text.to_owned()))?,
            _ => return Err(NpaError::BadFault(text.to_owned())),
        };
        if words.next().is_some() {
            return Err(NpaError::BadFault(text.to_owned()));
        }
        Ok(fault)
    }
}

impl std::fmt::Display for Fault {
    /// The file's content for this fault.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => Ok(()),
            Self::Refuse => f.write_str("refuse"),
            Self::Fail => f.write_str("fail"),
            Self::Slow(d) => write!(f, "slow {}", d.as_millis()),
        }
    }
}

/// One allowed peer of a [`Policy`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRule {
    /// The peer's addresses (`198.18.0.10/32`, `fd00::/64`).
    pub cidr: IpNet,
    /// TCP destination port (of the pod for ingress, of the peer for egress); absent = any
    /// protocol, any port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

impl PolicyRule {
    /// Any traffic with `cidr`.
    #[must_use]
    pub fn any(cidr: IpNet) -> Self {
        Self { cidr, port: None }
    }

    /// TCP to `port` with `cidr`.
    #[must_use]
    pub fn tcp(cidr: IpNet, port: u16) -> Self {
        Self {
            cidr,
            port: Some(port),
        }
    }

    /// Whether the peer is IPv6 (the rule goes to `ip6tables`).
    #[must_use]
    pub fn is_ipv6(&self) -> bool {
        matches!(self.cidr.addr(), IpAddr::V6(_))
    }
}

/// `policies/<namespace>_<name>.json`: what the agent "knows" for a pod. A pod with a policy
/// (or default-deny, which is the empty policy) is isolated in both directions: only the
/// listed peers pass, their replies pass statelessly.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Peers allowed to reach the pod.
    #[serde(default)]
    pub ingress: Vec<PolicyRule>,
    /// Peers the pod may reach.
    #[serde(default)]
    pub egress: Vec<PolicyRule>,
}

impl Policy {
    /// Nothing allowed in either direction (strict mode's default for a pod without a policy).
    #[must_use]
    pub fn default_deny() -> Self {
        Self::default()
    }

    /// The policy file's name for pod `name` in `namespace`.
    #[must_use]
    pub fn file_name(namespace: &str, name: &str) -> String {
        format!("{namespace}_{name}.json")
    }

    /// Reads pod `name`'s policy from `state_dir` (`None` when there is none).
    pub fn load(state_dir: &Path, namespace: &str, name: &str) -> Result<Option<Self>, NpaError> {
        let path = state_dir
            .join(POLICIES_DIR)
            .join(Self::file_name(namespace, name));
        match std::fs::read(&path) {
            Ok(raw) => serde_json::from_slice(&raw)
                .map(Some)
                .map_err(|source| NpaError::Json { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(NpaError::Io {
                what: "read policy",
                path,
                source,
            }),
        }
    }
}

/// The RPC a [`Call`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rpc {
    /// `NPBackend.EnforceNpToPod`.
    EnforceNpToPod,
    /// `NPBackend.DeletePodNp`.
    DeletePodNp,
}

/// What a call did to the datapath.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// The pod's policy file was installed.
    Policy,
    /// Strict mode without a policy: everything dropped.
    DefaultDeny,
    /// The pod's chains and jumps were removed (DeletePodNp; standard mode without a policy).
    Removed,
    /// Nothing touched (mode `none` or unknown, or a `fail` fault).
    Untouched,
}

/// One `EnforceNpToPod` / `DeletePodNp` call, recorded after the datapath change and before
/// the reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// Which RPC.
    pub rpc: Rpc,
    /// `K8S_POD_NAME`.
    pub pod: String,
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `NETWORK_POLICY_MODE` as sent (EnforceNpToPod only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// `InterfaceCount` (EnforceNpToPod only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface_count: Option<i32>,
    /// The pod's host veth name, as the plugin names it.
    pub veth: String,
    /// The `Success` answered.
    pub success: bool,
    /// What was done to the datapath.
    #[serde(default = "untouched")]
    pub action: Action,
    /// Why `success` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it was recorded (unix milliseconds).
    pub at_ms: u64,
}

fn untouched() -> Action {
    Action::Untouched
}

/// One line of `calls.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// A connection was accepted on the socket.
    Connect,
    /// An RPC was answered.
    Call(Call),
}

/// Reads `calls.jsonl` (empty when absent; a torn last line is skipped).
#[must_use]
pub fn read_events(path: &Path) -> Vec<Event> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The chain for traffic to the pod (`-o <veth>`), jumped from `FORWARD` and `OUTPUT`.
#[must_use]
pub fn to_pod_chain(veth: &str) -> String {
    format!("NPA-I-{veth}")
}

/// The chain for traffic from the pod (`-i <veth>`), jumped from `FORWARD` and `INPUT`.
#[must_use]
pub fn from_pod_chain(veth: &str) -> String {
    format!("NPA-E-{veth}")
}

/// Options of [`NpaStandin::start_with`].
#[derive(Debug, Clone)]
pub struct NpaOptions {
    /// The socket to serve (default `<dir>/npa.sock`).
    pub socket: Option<PathBuf>,
    /// The host-veth prefix the node's plugin uses.
    pub veth_prefix: String,
    /// Where to record the process for a later run's clean-up.
    pub pids: Option<PidList>,
}

impl Default for NpaOptions {
    fn default() -> Self {
        Self {
            socket: None,
            veth_prefix: DEFAULT_VETH_PREFIX.to_owned(),
            pids: None,
        }
    }
}

/// A running `npa-standin` inside a node namespace; stopped (SIGTERM, then SIGKILL) by PID on
/// drop.
#[derive(Debug)]
pub struct NpaStandin {
    dir: PathBuf,
    socket: PathBuf,
    veth_prefix: String,
    /// Behind a lock so the `&self` methods can notice an exit (`Supervised::exited` reaps).
    process: Mutex<Supervised>,
}

impl NpaStandin {
    /// Starts the stand-in inside `netns` with state directory `dir` (created) and socket
    /// `<dir>/npa.sock`, and waits until it listens.
    pub fn start(netns: &str, dir: &Path) -> Result<Self, NpaError> {
        Self::start_with(netns, dir, &NpaOptions::default())
    }

    /// [`NpaStandin::start`] with options.
    pub fn start_with(netns: &str, dir: &Path, options: &NpaOptions) -> Result<Self, NpaError> {
        let bin = crate::binaries::find_built("npa-standin")
            .map_err(|path| NpaError::NotBuilt { path })?;
        let io = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| NpaError::Io { what, path, source }
        };
        std::fs::create_dir_all(dir.join(POLICIES_DIR)).map_err(io("create", dir))?;
        let socket = options
            .socket
            .clone()
            .unwrap_or_else(|| dir.join(SOCKET_FILE));
        let log_path = dir.join(LOG_FILE);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io("open", &log_path))?;
        let log_err = log.try_clone().map_err(io("open", &log_path))?;
        let mut cmd = supervisor::netns_exec(netns, bin);
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir)
            .arg("--veth-prefix")
            .arg(&options.veth_prefix)
            .stdout(log)
            .stderr(log_err);
        let process = Supervised::spawn(
            cmd,
            true,
            options.pids.as_ref(),
            Stop::Term(Duration::from_secs(3)),
        )
        .map_err(|source| NpaError::Spawn {
            netns: netns.to_owned(),
            source,
        })?;
        let me = Self {
            dir: dir.to_path_buf(),
            socket,
            veth_prefix: options.veth_prefix.clone(),
            process: Mutex::new(process),
        };
        me.wait_socket(true)?;
        Ok(me)
    }

    /// The socket it serves (the socket file appears only once it accepts).
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    /// Its state directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its PID (that of `ip netns exec`, which execs the binary).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.process().pid()
    }

    fn process(&self) -> std::sync::MutexGuard<'_, Supervised> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The host veth name it derives for a pod.
    #[must_use]
    pub fn veth_for(&self, namespace: &str, name: &str) -> String {
        dataplane::conventions::host_veth_name(&self.veth_prefix, namespace, name)
    }

    /// Writes the fault file (atomically). For [`Fault::Refuse`] waits until the socket file
    /// is gone, for the others until it is back.
    pub fn set_fault(&self, fault: Fault) -> Result<(), NpaError> {
        write_atomically(&self.dir.join(FAULT_FILE), fault.to_string().as_bytes())?;
        self.wait_socket(fault != Fault::Refuse)
    }

    /// Writes pod `name`'s policy (atomically); the next `EnforceNpToPod` installs it.
    pub fn set_policy(&self, namespace: &str, name: &str, policy: &Policy) -> Result<(), NpaError> {
        let path = self
            .dir
            .join(POLICIES_DIR)
            .join(Policy::file_name(namespace, name));
        let raw = serde_json::to_vec(policy).map_err(|source| NpaError::Json {
            path: path.clone(),
            source,
        })?;
        write_atomically(&path, &raw)
    }

    /// Removes pod `name`'s policy (a missing one is fine).
    pub fn remove_policy(&self, namespace: &str, name: &str) -> Result<(), NpaError> {
        let path = self
            .dir
            .join(POLICIES_DIR)
            .join(Policy::file_name(namespace, name));
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(NpaError::Io {
                what: "remove",
                path,
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// Every recorded event, in order.
    #[must_use]
    pub fn events(&self) -> Vec<Event> {
        read_events(&self.dir.join(CALLS_FILE))
    }

    /// Every recorded call, in order.
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::Call(c) => Some(c),
                Event::Connect => None,
            })
            .collect()
    }

    /// How many connections it accepted.
    #[must_use]
    pub fn connects(&self) -> usize {
        self.events()
            .iter()
            .filter(|e| matches!(e, Event::Connect))
            .count()
    }

    /// How many `EnforceNpToPod` calls it answered for pod `name` in `namespace`.
    #[must_use]
    pub fn enforce_calls_for(&self, namespace: &str, name: &str) -> usize {
        self.count_calls(Rpc::EnforceNpToPod, namespace, name)
    }

    /// How many `DeletePodNp` calls it answered for pod `name` in `namespace`.
    #[must_use]
    pub fn delete_calls_for(&self, namespace: &str, name: &str) -> usize {
        self.count_calls(Rpc::DeletePodNp, namespace, name)
    }

    fn count_calls(&self, rpc: Rpc, namespace: &str, name: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.rpc == rpc && c.namespace == namespace && c.pod == name)
            .count()
    }

    /// Waits until the socket file exists (`listening`) or not; fails early when the process
    /// has exited.
    fn wait_socket(&self, listening: bool) -> Result<(), NpaError> {
        let start = Instant::now();
        loop {
            if self.socket.exists() == listening {
                return Ok(());
            }
            if let Some(status) = self.process().exited() {
                return Err(NpaError::Exited {
                    status,
                    log: log_tail(&self.dir.join(LOG_FILE)),
                });
            }
            if start.elapsed() > READY_TIMEOUT {
                return Err(NpaError::Timeout {
                    socket: self.socket.clone(),
                    state: if listening { "listening" } else { "gone" },
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Writes `path` through a temporary file and a rename, so a reader never sees half of it.
fn write_atomically(path: &Path, content: &[u8]) -> Result<(), NpaError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, content)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| NpaError::Io {
            what: "write",
            path: path.to_path_buf(),
            source,
        })
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Whether `iptables-save` (run inside `netns`) lists a chain of the stand-in for `veth`: a
/// check for tests that the pod's rules are (or are no longer) installed.
#[must_use]
pub fn chains_installed(netns: &str, veth: &str) -> bool {
    let mut found = false;
    for save in ["iptables-save", "ip6tables-save"] {
        let out = supervisor::netns_exec(netns, save)
            .args(["-t", "filter"])
            .stdin(Stdio::null())
            .output();
        if let Ok(out) = out {
            let text = String::from_utf8_lossy(&out.stdout);
            found |= text.lines().any(|l| {
                l.starts_with(&format!(":{} ", to_pod_chain(veth)))
                    || l.starts_with(&format!(":{} ", from_pod_chain(veth)))
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_round_trip_through_their_file_form() {
        for fault in [
            Fault::None,
            Fault::Refuse,
            Fault::Fail,
            Fault::Slow(Duration::from_millis(300)),
        ] {
            assert_eq!(fault.to_string().parse::<Fault>().unwrap(), fault);
        }
        assert_eq!("\n".parse::<Fault>().unwrap(), Fault::None);
        assert_eq!(" refuse\n".parse::<Fault>().unwrap(), Fault::Refuse);
        assert!("slow".parse::<Fault>().is_err());
        assert!("slow x".parse::<Fault>().is_err());
        assert!("fail now".parse::<Fault>().is_err());
        assert!("explode".parse::<Fault>().is_err());
    }

    #[test]
    fn a_policy_file_reads_with_optional_ports_and_directions() {
        let p: Policy = serde_json::from_str(
            r#"{"ingress":[{"cidr":"198.18.0.10/32","port":8080}],"egress":[{"cidr":"fd00::/64"}]}"#,
        )
        .unwrap();
        assert_eq!(
            p.ingress,
            vec![PolicyRule::tcp("198.18.0.10/32".parse().unwrap(), 8080)]
        );
        assert!(p.egress[0].is_ipv6() && p.egress[0].port.is_none());
        let empty: Policy = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, Policy::default_deny());
    }

    #[test]
    fn journal_lines_carry_their_event_tag() {
        let call = Call {
            rpc: Rpc::DeletePodNp,
            pod: "web-0".into(),
            namespace: "default".into(),
            mode: None,
            interface_count: None,
            veth: "eni0123456789a".into(),
            success: true,
            action: Action::Removed,
            error: None,
            at_ms: 1,
        };
        let line = serde_json::to_string(&Event::Call(call.clone())).unwrap();
        assert!(
            line.starts_with(r#"{"event":"call","rpc":"DeletePodNp""#),
            "{line}"
        );
        assert!(line.contains(r#""action":"removed""#), "{line}");
        assert_eq!(
            serde_json::from_str::<Event>(&line).unwrap(),
            Event::Call(call)
        );
        assert_eq!(
            serde_json::to_string(&Event::Connect).unwrap(),
            r#"{"event":"connect"}"#
        );
    }

    #[test]
    fn chain_names_fit_iptables_for_the_longest_interface_name() {
        let veth = "x".repeat(15);
        assert!(to_pod_chain(&veth).len() <= MAX_CHAIN_LEN);
        assert!(from_pod_chain(&veth).len() <= MAX_CHAIN_LEN);
    }
}
