//! The harness's process-and-namespace supervisor, shared by the node fixture ([`crate::node`]),
//! the simulated-VPC harness ([`crate::sim`]), the upstream-node fixture and the fleet: commands
//! aimed into a network namespace, processes started there (own process group, killed by PID
//! on drop, registered with their start time so a crashed run's processes can be killed by the
//! next run), namespaces deleted on drop, and the removal of crashed runs' leftovers
//! (namespaces and directories named after a dead pid, run directories with a pid list).
//! Must not: touch the root network namespace, or signal a process it cannot prove it started
//! (a PID is only signalled while its recorded start time still matches).

use std::ffi::OsStr;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Where `ip netns` keeps its namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";

/// `/var/run/netns/<name>`.
#[must_use]
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// `program` inside namespace `ns` as `ip netns exec <ns> <program>` runs it, without the `ip`
/// process (`vpcsim::netns_exec`): the namespace's own `/sys` is mounted, so the program sees
/// the namespace's links under `/sys/class/net`, as on a node. A missing namespace fails the
/// spawn.
#[must_use]
pub fn netns_exec(ns: &str, program: impl AsRef<OsStr>) -> Command {
    vpcsim::netns_exec::command_in(ns, program)
}

/// `nsenter --net=<path> -- <program>`: the network namespace only, mounts untouched (cgroups
/// stay visible, which container runtimes need).
#[must_use]
pub fn nsenter_net(ns: &str, program: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net={}", netns_path(ns).display()))
        .arg("--")
        .arg(program);
    c
}

/// Creates namespace `name` with `lo` up.
pub fn add_netns(name: &str) -> Result<(), String> {
    for args in [
        vec!["netns", "add", name],
        vec!["-n", name, "link", "set", "lo", "up"],
    ] {
        let out = Command::new("ip")
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
        if !out.status.success() {
            return Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    Ok(())
}

/// Deletes namespace `name` (quietly; a missing namespace is fine).
pub fn delete_netns(name: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Namespaces deleted on drop, newest first (also during a panic's unwinding).
#[derive(Debug, Default)]
pub struct OwnedNetns {
    names: Vec<String>,
}

impl OwnedNetns {
    /// Takes ownership of an existing namespace.
    pub fn adopt(&mut self, name: impl Into<String>) {
        self.names.push(name.into());
    }

    /// Creates namespace `name` (`lo` up) and owns it.
    pub fn create(&mut self, name: &str) -> Result<(), String> {
        add_netns(name)?;
        self.adopt(name);
        Ok(())
    }

    /// Deletes one owned namespace now.
    pub fn delete(&mut self, name: &str) {
        delete_netns(name);
        self.names.retain(|n| n != name);
    }

    /// Deletes every owned namespace now.
    pub fn delete_all(&mut self) {
        for name in self.names.drain(..).rev() {
            delete_netns(&name);
        }
    }
}

impl Drop for OwnedNetns {
    fn drop(&mut self) {
        self.delete_all();
    }
}

/// The kernel's start time of `pid` (field 22 of `/proc/<pid>/stat`, clock ticks since boot):
/// with the pid it names one process, not whichever reuses the number later.
#[must_use]
pub fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// A run's list of the processes it started, one `pid start-time` line each, so a later run can
/// kill them if this one crashed.
#[derive(Debug, Clone)]
pub struct PidList {
    path: PathBuf,
}

impl PidList {
    /// The list at `path` (created on first record).
    #[must_use]
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Appends `pid` with its start time.
    pub fn record(&self, pid: u32) {
        let line = format!("{pid} {}\n", start_time(pid).unwrap_or_default());
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }

    /// SIGKILLs every listed process that still runs with the recorded start time.
    pub fn kill_survivors(&self) {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return;
        };
        for line in text.lines() {
            let mut it = line.split_whitespace();
            if let (Some(pid), Some(start)) =
                (it.next().and_then(|p| p.parse::<u32>().ok()), it.next())
                && start_time(pid).as_deref() == Some(start)
            {
                signal(pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// How a [`Supervised`] process is stopped (on [`Supervised::stop`] and on drop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL at once (a crash).
    Kill,
    /// SIGTERM, then SIGKILL after the grace period (a graceful shutdown).
    Term(Duration),
}

/// A process the harness started; stopped by PID (per its [`Stop`]) on drop.
#[derive(Debug)]
pub struct Supervised {
    child: Option<Child>,
    on_drop: Stop,
}

impl Supervised {
    /// Spawns `cmd` (stdin closed). With `own_group`, in its own process group, so a terminal's
    /// Ctrl-C reaches only the driver, which then stops it. With `pids`, recorded there.
    pub fn spawn(
        mut cmd: Command,
        own_group: bool,
        pids: Option<&PidList>,
        on_drop: Stop,
    ) -> std::io::Result<Self> {
        cmd.stdin(Stdio::null());
        if own_group {
            cmd.process_group(0);
        }
        let child = cmd.spawn()?;
        if let Some(p) = pids {
            p.record(child.id());
        }
        Ok(Self {
            child: Some(child),
            on_drop,
        })
    }

    /// Its PID (0 once stopped).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Its exit status, if it has exited (reaped).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Sends SIGTERM without waiting (see [`stop_all`]).
    pub fn terminate(&self) {
        if let Some(c) = &self.child {
            signal(c.id(), nix::sys::signal::Signal::SIGTERM);
        }
    }

    /// Stops it now as `how` says and reaps it.
    pub fn stop(&mut self, how: Stop) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Stop::Term(grace) = how {
            signal(child.id(), nix::sys::signal::Signal::SIGTERM);
            wait_until(&mut child, Instant::now() + grace);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn wait_until(child: &mut Child, deadline: Instant) {
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop(self.on_drop);
    }
}

/// Stops many processes in parallel: SIGTERM to all, then each reaped within one shared `grace`
/// (SIGKILL for stragglers).
pub fn stop_all<'a>(procs: impl IntoIterator<Item = &'a mut Supervised>, grace: Duration) {
    let mut procs: Vec<&mut Supervised> = procs.into_iter().collect();
    for p in &procs {
        p.terminate();
    }
    let deadline = Instant::now() + grace;
    for p in &mut procs {
        if let Some(child) = p.child.as_mut() {
            wait_until(child, deadline);
        }
        p.stop(Stop::Kill);
    }
}

/// Whether `name` is `<prefix><pid>-...` with a pid that no longer runs (a crashed run's).
#[must_use]
pub fn owned_by_dead_pid(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.split('-').next())
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes namespaces `<prefix><dead pid>-...` of crashed runs, killing the processes still
/// inside them first (nothing else can have started a process in a namespace with our prefix).
pub fn remove_stale_netns(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !owned_by_dead_pid(&name, prefix) {
            continue;
        }
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &name]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse() {
                    signal(pid, nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
        delete_netns(&name);
    }
}

/// Removes directories `<root>/<prefix><dead pid>-...` of crashed runs, calling `before` on each
/// first (e.g. to let a container runtime remove what it left there).
pub fn remove_stale_dirs(root: &Path, prefix: &str, before: impl Fn(&Path)) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if owned_by_dead_pid(&name, prefix) {
            before(&e.path());
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Removes run directories under `root` whose run is over (`is_live` says no): SIGKILLs the
/// processes their `pids` list ([`PidList`]) names that still run, then deletes the directory.
pub fn remove_stale_runs(root: &Path, is_live: impl Fn(&str) -> bool) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let run = e.file_name().to_string_lossy().into_owned();
        if is_live(&run) {
            continue;
        }
        PidList::at(e.path().join("pids")).kill_survivors();
        let _ = std::fs::remove_dir_all(e.path());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_of_dead_pids_with_the_prefix_are_stale() {
        let me = std::process::id();
        assert!(!owned_by_dead_pid(&format!("cnit-{me}-0-node"), "cnit-"));
        assert!(owned_by_dead_pid("cnit-4294967294-0-node", "cnit-"));
        assert!(!owned_by_dead_pid("hnt-4294967294-x", "cnit-"));
        assert!(!owned_by_dead_pid("cnit-notapid-0", "cnit-"));
    }

    #[test]
    fn a_pid_list_kills_only_processes_whose_start_time_matches() {
        let dir = tempfile::tempdir().unwrap();
        let list = PidList::at(dir.path().join("pids"));
        let mut a = Supervised::spawn(
            {
                let mut c = Command::new("sleep");
                c.arg("30");
                c
            },
            true,
            Some(&list),
            Stop::Kill,
        )
        .unwrap();
        let mut b = Command::new("sleep").arg("30").spawn().unwrap();
        // b recorded with a wrong start time: a reused pid must be left alone
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("pids"))
            .unwrap()
            .write_all(format!("{} 1\n", b.id()).as_bytes())
            .unwrap();
        list.kill_survivors();
        let deadline = Instant::now() + Duration::from_secs(5);
        while a.exited().is_none() {
            assert!(Instant::now() < deadline, "recorded process survived");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(b.try_wait().unwrap().is_none(), "unrecorded process killed");
        let _ = b.kill();
        let _ = b.wait();
    }

    #[test]
    fn a_supervised_process_is_gone_after_drop() {
        let p = Supervised::spawn(
            {
                let mut c = Command::new("sleep");
                c.arg("30");
                c
            },
            true,
            None,
            Stop::Term(Duration::from_secs(5)),
        )
        .unwrap();
        let pid = p.pid();
        assert!(start_time(pid).is_some());
        drop(p);
        assert!(start_time(pid).is_none(), "pid {pid} still exists");
    }
}
