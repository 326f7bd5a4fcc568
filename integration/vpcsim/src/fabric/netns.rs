//! Entering the simulator's namespaces from a process that must stay in the root netns:
//! sockets are created on a short-lived std::thread that `setns`es first (never on a tokio
//! worker), and run registration (pid files) that lets a new run remove a crashed run's
//! namespaces without touching a live run's. Must not enter any namespace outside `vsim*`.

use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;

use super::exec;
use super::names::{NETNS_DIR, RUN_DIR, RunNames, run_id_of_ns};

/// Entering a namespace or making a socket there failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Opening `/run/netns/<ns>`.
    #[error("open netns {ns}: {source}")]
    Open {
        /// namespace
        ns: String,
        /// cause
        source: std::io::Error,
    },
    /// `setns` itself.
    #[error("setns {ns}: {source}")]
    Enter {
        /// namespace
        ns: String,
        /// cause
        source: nix::Error,
    },
    /// The socket call inside the namespace.
    #[error("socket in {ns}: {source}")]
    Socket {
        /// namespace
        ns: String,
        /// cause
        source: std::io::Error,
    },
    /// The helper thread panicked.
    #[error("netns thread for {ns} panicked")]
    Thread {
        /// namespace
        ns: String,
    },
    /// Writing or reading the run's pid file.
    #[error("pid file {path}: {source}")]
    PidFile {
        /// path
        path: PathBuf,
        /// cause
        source: std::io::Error,
    },
}

/// Run `f` on a fresh thread that has entered network namespace `ns`; the thread ends with it,
/// so the caller's thread never changes namespace. Sockets `f` creates stay bound to `ns`.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, NetnsError> {
    let path = Path::new(NETNS_DIR).join(ns);
    let name = ns.to_owned();
    let handle = std::thread::Builder::new()
        .name("vpcsim-netns".into())
        .spawn(move || -> Result<T, NetnsError> {
            let file = File::open(&path).map_err(|source| NetnsError::Open {
                ns: name.clone(),
                source,
            })?;
            nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| {
                NetnsError::Enter {
                    ns: name.clone(),
                    source,
                }
            })?;
            f().map_err(|source| NetnsError::Socket { ns: name, source })
        })
        .map_err(|source| NetnsError::Socket {
            ns: ns.to_owned(),
            source,
        })?;
    handle
        .join()
        .map_err(|_| NetnsError::Thread { ns: ns.to_owned() })?
}

/// A non-blocking TCP listener bound to `addr` inside `ns`, ready for
/// `tokio::net::TcpListener::from_std`.
pub fn listen_in(ns: &str, addr: SocketAddr) -> Result<TcpListener, NetnsError> {
    in_netns(ns, move || {
        let l = TcpListener::bind(addr)?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
}

/// Process start time (field 22 of `/proc/<pid>/stat`), to tell a live pid from a reused one.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the command name (field 2) may contain spaces; fields after ')' are plain
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19).map(str::to_owned)
}

/// Record this process as the owner of run `names` (before creating any namespace).
pub fn register_run(names: &RunNames) -> Result<(), NetnsError> {
    let path = names.pid_file();
    let pid = std::process::id();
    let content = format!("{pid} {}\n", start_time(pid).unwrap_or_default());
    // write + rename: a concurrent `remove_stale_runs` must never read a half-written file
    let tmp = Path::new(RUN_DIR).join(format!(".{}.tmp", names.run_id()));
    std::fs::create_dir_all(RUN_DIR)
        .and_then(|()| std::fs::write(&tmp, content))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|source| NetnsError::PidFile { path, source })
}

/// Forget run `names` (after its namespaces are gone).
pub fn unregister_run(names: &RunNames) {
    let _ = std::fs::remove_file(names.pid_file());
}

/// Is the process that registered run `run_id` still alive?
pub fn run_is_live(run_id: &str) -> bool {
    let path = RunNames::new(run_id).pid_file();
    let Ok(content) = std::fs::read_to_string(path) else {
        return false;
    };
    let mut parts = content.split_whitespace();
    let (Some(pid), start) = (
        parts.next().and_then(|p| p.parse::<u32>().ok()),
        parts.next(),
    ) else {
        return false;
    };
    match (start_time(pid), start) {
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Delete the namespaces (and pid files) of simulator runs whose process is gone. Returns the
/// namespaces removed.
pub fn remove_stale_runs() -> Vec<String> {
    let mut removed = Vec::new();
    let mut dead_runs = std::collections::BTreeSet::new();
    for ns in super::observe::list_netns() {
        let Some(run) = run_id_of_ns(&ns) else {
            continue;
        };
        if run_is_live(run) {
            continue;
        }
        dead_runs.insert(run.to_owned());
        if exec::netns_del(&ns).is_ok() {
            removed.push(ns);
        }
    }
    // pid files whose process is gone, with or without namespaces left
    if let Ok(rd) = std::fs::read_dir(RUN_DIR) {
        for e in rd.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(run) = name.strip_suffix(".pid")
                && !run_is_live(run)
            {
                dead_runs.insert(run.to_owned());
            }
        }
    }
    for run in dead_runs {
        unregister_run(&RunNames::new(run));
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_start_time_is_readable() {
        assert!(start_time(std::process::id()).is_some());
        assert!(!run_is_live("nosuchrun"));
    }
}
