//! `npa-standin`: a stand-in for aws-network-policy-agent, for the kernel tests. Serves
//! `rpc.NPBackend` on a unix socket inside the node namespace it was started in and, like the
//! real agent, has the pod's filtering in place before `EnforceNpToPod` answers. Owns the
//! iptables chains named by `integration::npa` in that namespace's filter table (both
//! families) and nothing else; steered by the control files in `--state-dir` (see
//! `integration::npa`). Test-only. Must not: touch any rule or chain but its own, or run
//! outside a throwaway namespace.
//!
//! Datapath per pod (host veth `V`, chains `NPA-I-V` to the pod, `NPA-E-V` from it):
//! `FORWARD -o V` and `OUTPUT -o V` jump to `NPA-I-V`, `FORWARD -i V` and `INPUT -i V` to
//! `NPA-E-V`; each chain `RETURN`s what the policy allows (replies statelessly, by the mirrored
//! TCP port) and ends in `DROP`. IPv6 chains also let neighbour discovery through. Jumps match
//! by interface name, so they hold for a veth re-created under the same name.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use clap::Parser;
use integration::npa::{
    Action, CALLS_FILE, Call, DEFAULT_VETH_PREFIX, Event, FAULT_FILE, FAULT_POLL, Fault,
    MAX_CHAIN_LEN, Policy, PolicyRule, Rpc, from_pod_chain, to_pod_chain,
};
use ipamd_proto::rpc::np_backend_server::{NpBackend, NpBackendServer};
use ipamd_proto::rpc::{DeleteNpReply, DeleteNpRequest, EnforceNpReply, EnforceNpRequest};
use tokio::signal::unix::{SignalKind, signal};
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

#[derive(Parser, Debug)]
#[command(about = "A network-policy agent stand-in serving rpc.NPBackend (tests only)")]
struct Args {
    /// Unix socket to serve (replaced if it exists).
    #[arg(long)]
    socket: PathBuf,
    /// Directory of the control files (`fault`, `policies/`) and the journal (`calls.jsonl`).
    #[arg(long)]
    state_dir: PathBuf,
    /// Host-veth prefix of the node's plugin (`AWS_VPC_K8S_CNI_VETHPREFIX`).
    #[arg(long, default_value = DEFAULT_VETH_PREFIX)]
    veth_prefix: String,
}

#[derive(Debug, thiserror::Error)]
enum StandinError {
    #[error("create {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("listen on {}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("start the runtime")]
    Runtime(#[source] std::io::Error),
    #[error("serve rpc.NPBackend")]
    Serve(#[source] tonic::transport::Error),
}

#[derive(Debug, thiserror::Error)]
enum DatapathError {
    #[error("run {program}")]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed: {stderr}")]
    Failed {
        program: &'static str,
        stderr: String,
    },
    #[error("chain name for {veth} longer than {MAX_CHAIN_LEN}")]
    ChainTooLong { veth: String },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %chain(&e), "npa-standin failed");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), StandinError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StandinError::Runtime)?
        .block_on(serve(args))
}

/// The error and its sources, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Why a listening round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundEnd {
    Refuse,
    Terminate,
}

/// Listening rounds: bind, serve until the fault file says `refuse` (or SIGTERM), stay away
/// while it does, bind again.
async fn serve(args: Args) -> Result<(), StandinError> {
    std::fs::create_dir_all(&args.state_dir).map_err(|source| StandinError::CreateDir {
        path: args.state_dir.clone(),
        source,
    })?;
    let agent = Arc::new(Agent {
        state_dir: args.state_dir.clone(),
        veth_prefix: args.veth_prefix.clone(),
        journal: Arc::new(Journal::new(args.state_dir.join(CALLS_FILE))),
        datapath: Arc::default(),
    });
    let mut term = signal(SignalKind::terminate()).map_err(StandinError::Runtime)?;
    loop {
        while read_fault(&args.state_dir) == Fault::Refuse {
            tokio::select! {
                () = tokio::time::sleep(FAULT_POLL) => {}
                _ = term.recv() => return Ok(()),
            }
        }
        let listener = bind(&args.socket)?;
        info!(socket = %args.socket.display(), "listening");
        let journal = agent.journal.clone();
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener).map(move |conn| {
            if conn.is_ok() {
                journal.record(&Event::Connect);
            }
            conn
        });
        let mut end = RoundEnd::Terminate;
        let shutdown = async {
            end = tokio::select! {
                () = refused(&args.state_dir) => RoundEnd::Refuse,
                _ = term.recv() => RoundEnd::Terminate,
            };
            // Unreachable by path at once; the listener itself goes when the server drops it.
            let _ = std::fs::remove_file(&args.socket);
        };
        tonic::transport::Server::builder()
            .add_service(NpBackendServer::from_arc(agent.clone()))
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(StandinError::Serve)?;
        match end {
            RoundEnd::Refuse => info!("refusing: not listening until the fault file changes"),
            RoundEnd::Terminate => {
                info!("terminated");
                return Ok(());
            }
        }
    }
}

/// Resolves once the fault file says `refuse`.
async fn refused(state_dir: &Path) {
    while read_fault(state_dir) != Fault::Refuse {
        tokio::time::sleep(FAULT_POLL).await;
    }
}

/// Binds at a staging path and renames it into place, so the socket file appears only once
/// it accepts (the harness waits for the file, not with a connection of its own).
fn bind(socket: &Path) -> Result<tokio::net::UnixListener, StandinError> {
    let err = |source| StandinError::Bind {
        path: socket.to_path_buf(),
        source,
    };
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let mut staging = socket.as_os_str().to_owned();
    staging.push(".binding");
    let staging = PathBuf::from(staging);
    let _ = std::fs::remove_file(&staging);
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(&staging).map_err(err)?;
    std::fs::rename(&staging, socket).map_err(err)?;
    Ok(listener)
}

fn read_fault(state_dir: &Path) -> Fault {
    let path = state_dir.join(FAULT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.parse().unwrap_or_else(|e| {
            warn!(error = %e, "ignoring the fault file");
            Fault::None
        }),
        Err(_) => Fault::None,
    }
}

/// `calls.jsonl`, appended one line per event.
#[derive(Debug)]
struct Journal {
    path: PathBuf,
    lock: Mutex<()>,
}

impl Journal {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            lock: Mutex::new(()),
        }
    }

    fn record(&self, event: &Event) {
        let Ok(mut line) = serde_json::to_string(event) else {
            return;
        };
        line.push('\n');
        let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            warn!(path = %self.path.display(), error = %e, "journal write failed");
        }
    }
}

/// One call as the service sees it.
#[derive(Debug)]
struct PodCall {
    rpc: Rpc,
    pod: String,
    namespace: String,
    mode: Option<String>,
    interface_count: Option<i32>,
}

/// What a call does to the datapath.
#[derive(Debug)]
enum Plan {
    Install(Policy, Action),
    Remove,
    Nothing,
}

#[derive(Debug)]
struct Agent {
    state_dir: PathBuf,
    veth_prefix: String,
    journal: Arc<Journal>,
    /// One datapath change at a time (each reads the ruleset, then restores into it).
    datapath: Arc<Mutex<()>>,
}

impl Agent {
    /// Applies the fault, does the work, records the call, returns `Success`.
    async fn answer(&self, call: PodCall) -> bool {
        let fault = read_fault(&self.state_dir);
        if let Fault::Slow(delay) = fault {
            tokio::time::sleep(delay).await;
        }
        let veth =
            dataplane::conventions::host_veth_name(&self.veth_prefix, &call.namespace, &call.pod);
        let outcome = if fault == Fault::Fail {
            Err("fault file says fail".to_owned())
        } else {
            self.apply(&call, &veth).await
        };
        let (success, action, error) = match outcome {
            Ok(action) => (true, action, None),
            Err(e) => (false, Action::Untouched, Some(e)),
        };
        info!(
            rpc = ?call.rpc,
            pod = %call.pod,
            namespace = %call.namespace,
            mode = call.mode.as_deref().unwrap_or(""),
            %veth,
            success,
            ?action,
            error = error.as_deref().unwrap_or(""),
            "answered"
        );
        self.journal.record(&Event::Call(Call {
            rpc: call.rpc,
            pod: call.pod,
            namespace: call.namespace,
            mode: call.mode,
            interface_count: call.interface_count,
            veth,
            success,
            action,
            error,
            at_ms: now_ms(),
        }));
        success
    }

    async fn apply(&self, call: &PodCall, veth: &str) -> Result<Action, String> {
        let plan = self.plan(call).map_err(|e| chain(&e))?;
        let veth = veth.to_owned();
        let lock = self.datapath.clone();
        tokio::task::spawn_blocking(move || {
            let _guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
            match plan {
                Plan::Install(policy, action) => install(&veth, &policy).map(|()| action),
                Plan::Remove => remove(&veth).map(|()| Action::Removed),
                Plan::Nothing => Ok(Action::Untouched),
            }
        })
        .await
        .map_err(|e| format!("datapath worker: {e}"))?
        .map_err(|e| chain(&e))
    }

    fn plan(&self, call: &PodCall) -> Result<Plan, integration::npa::NpaError> {
        if call.rpc == Rpc::DeletePodNp {
            return Ok(Plan::Remove);
        }
        let mode = call
            .mode
            .as_deref()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let policy = || Policy::load(&self.state_dir, &call.namespace, &call.pod);
        Ok(match mode.as_str() {
            "strict" => match policy()? {
                Some(p) => Plan::Install(p, Action::Policy),
                None => Plan::Install(Policy::default_deny(), Action::DefaultDeny),
            },
            // Re-enforcing replaces the pod's rules: without a policy, none remain.
            "standard" => match policy()? {
                Some(p) => Plan::Install(p, Action::Policy),
                None => Plan::Remove,
            },
            _ => Plan::Nothing,
        })
    }
}

#[tonic::async_trait]
impl NpBackend for Agent {
    async fn enforce_np_to_pod(
        &self,
        request: Request<EnforceNpRequest>,
    ) -> Result<Response<EnforceNpReply>, Status> {
        let req = request.into_inner();
        let success = self
            .answer(PodCall {
                rpc: Rpc::EnforceNpToPod,
                pod: req.k8s_pod_name,
                namespace: req.k8s_pod_namespace,
                mode: Some(req.network_policy_mode),
                interface_count: Some(req.interface_count),
            })
            .await;
        Ok(Response::new(EnforceNpReply { success }))
    }

    async fn delete_pod_np(
        &self,
        request: Request<DeleteNpRequest>,
    ) -> Result<Response<DeleteNpReply>, Status> {
        let req = request.into_inner();
        let success = self
            .answer(PodCall {
                rpc: Rpc::DeletePodNp,
                pod: req.k8s_pod_name,
                namespace: req.k8s_pod_namespace,
                mode: None,
                interface_count: None,
            })
            .await;
        Ok(Response::new(DeleteNpReply { success }))
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

// ---- datapath: iptables in this process's namespace ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    const BOTH: [Self; 2] = [Self::V4, Self::V6];

    fn save(self) -> &'static str {
        match self {
            Self::V4 => "iptables-save",
            Self::V6 => "ip6tables-save",
        }
    }

    fn restore(self) -> &'static str {
        match self {
            Self::V4 => "iptables-restore",
            Self::V6 => "ip6tables-restore",
        }
    }

    fn has(self, rule: &PolicyRule) -> bool {
        rule.is_ipv6() == (self == Self::V6)
    }
}

/// ICMPv6 neighbour discovery (router solicitation/advertisement, neighbour
/// solicitation/advertisement): without it an isolated pod could not even resolve an allowed
/// peer.
const NEIGHBOUR_DISCOVERY: [u8; 4] = [133, 134, 135, 136];

/// The jumps into the pod's chains: (built-in chain, interface flag, target).
fn jumps(veth: &str) -> [(&'static str, &'static str, String); 4] {
    [
        ("FORWARD", "-o", to_pod_chain(veth)),
        ("OUTPUT", "-o", to_pod_chain(veth)),
        ("FORWARD", "-i", from_pod_chain(veth)),
        ("INPUT", "-i", from_pod_chain(veth)),
    ]
}

/// The `iptables-restore --noflush` input that makes `policy` the pod's rules in `family`,
/// given the table's current `iptables-save` output: declaring the chains flushes them, so
/// re-enforcing replaces them in one transaction; jumps are inserted first in their built-in
/// chain unless present.
fn enforce_script(veth: &str, policy: &Policy, family: Family, current: &str) -> String {
    let to = to_pod_chain(veth);
    let from = from_pod_chain(veth);
    let mut lines = vec![
        "*filter".to_owned(),
        format!(":{to} - [0:0]"),
        format!(":{from} - [0:0]"),
    ];
    if family == Family::V6 {
        for t in NEIGHBOUR_DISCOVERY {
            for chain in [&to, &from] {
                lines.push(format!(
                    "-A {chain} -p ipv6-icmp --icmpv6-type {t} -j RETURN"
                ));
            }
        }
    }
    let tcp = |flag: &str, port: Option<u16>| {
        port.map_or_else(String::new, |p| format!(" -p tcp {flag} {p}"))
    };
    for rule in policy.ingress.iter().filter(|r| family.has(r)) {
        let cidr = rule.cidr.trunc();
        lines.push(format!(
            "-A {to} -s {cidr}{} -j RETURN",
            tcp("--dport", rule.port)
        ));
        lines.push(format!(
            "-A {from} -d {cidr}{} -j RETURN",
            tcp("--sport", rule.port)
        ));
    }
    for rule in policy.egress.iter().filter(|r| family.has(r)) {
        let cidr = rule.cidr.trunc();
        lines.push(format!(
            "-A {from} -d {cidr}{} -j RETURN",
            tcp("--dport", rule.port)
        ));
        lines.push(format!(
            "-A {to} -s {cidr}{} -j RETURN",
            tcp("--sport", rule.port)
        ));
    }
    lines.push(format!("-A {to} -j DROP"));
    lines.push(format!("-A {from} -j DROP"));
    for (builtin, flag, target) in jumps(veth) {
        let saved = format!("-A {builtin} {flag} {veth} -j {target}");
        if !current.lines().any(|l| l.trim_end() == saved) {
            lines.push(format!("-I {builtin} 1 {flag} {veth} -j {target}"));
        }
    }
    lines.push("COMMIT".to_owned());
    lines.join("\n") + "\n"
}

/// The `iptables-restore --noflush` input that removes the pod's jumps and chains, or `None`
/// when the table has none of them.
fn remove_script(veth: &str, current: &str) -> Option<String> {
    let targets = [to_pod_chain(veth), from_pod_chain(veth)];
    let mut lines = Vec::new();
    for line in current.lines().map(str::trim_end) {
        let Some(rule) = line.strip_prefix("-A ") else {
            continue;
        };
        let builtin = ["INPUT ", "FORWARD ", "OUTPUT "]
            .iter()
            .any(|b| rule.starts_with(b));
        if builtin && targets.iter().any(|t| rule.ends_with(&format!(" -j {t}"))) {
            lines.push(format!("-D {rule}"));
        }
    }
    for t in &targets {
        if current.lines().any(|l| l.starts_with(&format!(":{t} "))) {
            lines.push(format!("-F {t}"));
            lines.push(format!("-X {t}"));
        }
    }
    if lines.is_empty() {
        return None;
    }
    Some(format!("*filter\n{}\nCOMMIT\n", lines.join("\n")))
}

fn check_chain_names(veth: &str) -> Result<(), DatapathError> {
    if to_pod_chain(veth).len() > MAX_CHAIN_LEN || from_pod_chain(veth).len() > MAX_CHAIN_LEN {
        return Err(DatapathError::ChainTooLong {
            veth: veth.to_owned(),
        });
    }
    Ok(())
}

/// Makes `policy` the pod's rules in both families (IPv6 isolated too; an IPv4-only policy
/// leaves the pod's IPv6 default-denied).
fn install(veth: &str, policy: &Policy) -> Result<(), DatapathError> {
    check_chain_names(veth)?;
    for family in Family::BOTH {
        let current = save(family)?;
        restore(family, &enforce_script(veth, policy, family, &current))?;
    }
    Ok(())
}

/// Removes the pod's jumps and chains in both families (nothing to remove is fine).
fn remove(veth: &str) -> Result<(), DatapathError> {
    for family in Family::BOTH {
        let current = save(family)?;
        if let Some(script) = remove_script(veth, &current) {
            restore(family, &script)?;
        }
    }
    Ok(())
}

fn save(family: Family) -> Result<String, DatapathError> {
    run_tool(family.save(), &["-t", "filter"], None)
}

fn restore(family: Family, script: &str) -> Result<(), DatapathError> {
    run_tool(family.restore(), &["-w", "--noflush"], Some(script)).map(drop)
}

fn run_tool(
    program: &'static str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, DatapathError> {
    let spawn = |source| DatapathError::Spawn { program, source };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes()).map_err(spawn)?;
    }
    let out = child.wait_with_output().map_err(spawn)?;
    if !out.status.success() {
        return Err(DatapathError::Failed {
            program,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VETH: &str = "eni0123456789a";

    fn policy(json: &str) -> Policy {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn default_deny_drops_both_directions_and_jumps_from_all_three_chains() {
        let script = enforce_script(VETH, &Policy::default_deny(), Family::V4, "");
        assert_eq!(
            script,
            "*filter\n\
             :NPA-I-eni0123456789a - [0:0]\n\
             :NPA-E-eni0123456789a - [0:0]\n\
             -A NPA-I-eni0123456789a -j DROP\n\
             -A NPA-E-eni0123456789a -j DROP\n\
             -I FORWARD 1 -o eni0123456789a -j NPA-I-eni0123456789a\n\
             -I OUTPUT 1 -o eni0123456789a -j NPA-I-eni0123456789a\n\
             -I FORWARD 1 -i eni0123456789a -j NPA-E-eni0123456789a\n\
             -I INPUT 1 -i eni0123456789a -j NPA-E-eni0123456789a\n\
             COMMIT\n"
        );
    }

    #[test]
    fn rules_allow_the_peer_and_its_replies_by_mirrored_port_per_family() {
        let p = policy(
            r#"{"ingress":[{"cidr":"198.18.0.10/32","port":8080},{"cidr":"fd00::/64"}],
                "egress":[{"cidr":"10.1.2.3/16","port":53}]}"#,
        );
        let v4 = enforce_script(VETH, &p, Family::V4, "");
        for rule in [
            "-A NPA-I-eni0123456789a -s 198.18.0.10/32 -p tcp --dport 8080 -j RETURN",
            "-A NPA-E-eni0123456789a -d 198.18.0.10/32 -p tcp --sport 8080 -j RETURN",
            "-A NPA-E-eni0123456789a -d 10.1.0.0/16 -p tcp --dport 53 -j RETURN",
            "-A NPA-I-eni0123456789a -s 10.1.0.0/16 -p tcp --sport 53 -j RETURN",
        ] {
            assert!(v4.contains(rule), "{rule} missing in\n{v4}");
        }
        assert!(!v4.contains("fd00") && !v4.contains("icmpv6"), "{v4}");
        let v6 = enforce_script(VETH, &p, Family::V6, "");
        assert!(v6.contains("-A NPA-I-eni0123456789a -s fd00::/64 -j RETURN"));
        assert!(v6.contains("-A NPA-E-eni0123456789a -d fd00::/64 -j RETURN"));
        assert!(v6.contains("--icmpv6-type 135 -j RETURN"));
        assert!(!v6.contains("198.18"), "{v6}");
        // allowed entries come before the final drops
        let drop = v4.find("-j DROP").unwrap();
        assert!(v4.rfind("-j RETURN").unwrap() < drop);
    }

    #[test]
    fn present_jumps_are_not_inserted_again() {
        let current = "*filter\n:INPUT ACCEPT [0:0]\n:NPA-I-eni0123456789a - [0:0]\n\
                       -A FORWARD -o eni0123456789a -j NPA-I-eni0123456789a\n\
                       -A INPUT -i eni0123456789a -j NPA-E-eni0123456789a\nCOMMIT\n";
        let script = enforce_script(VETH, &Policy::default_deny(), Family::V4, current);
        assert!(!script.contains("-I FORWARD 1 -o"), "{script}");
        assert!(!script.contains("-I INPUT 1"), "{script}");
        assert!(script.contains("-I OUTPUT 1 -o"), "{script}");
        assert!(script.contains("-I FORWARD 1 -i"), "{script}");
    }

    #[test]
    fn removal_deletes_only_this_pods_jumps_then_its_chains() {
        let current = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
                       :NPA-I-eni0123456789a - [0:0]\n:NPA-E-eni0123456789a - [0:0]\n\
                       :NPA-I-eniffffffffffff - [0:0]\n\
                       -A INPUT -i eni0123456789a -j NPA-E-eni0123456789a\n\
                       -A FORWARD -o eniffffffffffff -j NPA-I-eniffffffffffff\n\
                       -A FORWARD -o eni0123456789a -j NPA-I-eni0123456789a\n\
                       -A NPA-I-eni0123456789a -j DROP\nCOMMIT\n";
        assert_eq!(
            remove_script(VETH, current).unwrap(),
            "*filter\n\
             -D INPUT -i eni0123456789a -j NPA-E-eni0123456789a\n\
             -D FORWARD -o eni0123456789a -j NPA-I-eni0123456789a\n\
             -F NPA-I-eni0123456789a\n\
             -X NPA-I-eni0123456789a\n\
             -F NPA-E-eni0123456789a\n\
             -X NPA-E-eni0123456789a\n\
             COMMIT\n"
        );
        assert_eq!(remove_script(VETH, "*filter\nCOMMIT\n"), None);
    }

    #[test]
    fn an_over_long_veth_name_is_refused() {
        assert!(check_chain_names(VETH).is_ok());
        assert!(check_chain_names(&"v".repeat(30)).is_err());
    }
}
