//! Network-namespace handles: open a netns by path, run a closure inside it on a dedicated
//! thread, open a netlink connection bound to it, and write its `/proc/sys/net` sysctls.
//! Must not: call `setns` on the caller's thread (runtime threads stay where they are).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

use crate::netlink::{Netlink, NetlinkError};

/// Why a namespace could not be opened or entered.
#[derive(Debug, thiserror::Error)]
pub enum NetNsError {
    /// The namespace file could not be opened (missing netns, wrong path).
    #[error("open netns {path}")]
    Open {
        /// Path that was opened.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// `setns(CLONE_NEWNET)` failed.
    #[error("enter netns {path}")]
    Enter {
        /// Namespace path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: nix::Error,
    },
    /// The helper thread panicked.
    #[error("netns worker thread for {0} panicked")]
    Worker(PathBuf),
}

impl NetNsError {
    /// Whether the namespace does not exist (any more).
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Why a sysctl read or write failed.
#[derive(Debug, thiserror::Error)]
pub enum SysctlError {
    /// Entering the namespace failed.
    #[error(transparent)]
    NetNs(#[from] NetNsError),
    /// Reading the file failed.
    #[error("read sysctl {key}")]
    Read {
        /// Key relative to `/proc/sys`.
        key: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Writing the file failed.
    #[error("write sysctl {key}={value}")]
    Write {
        /// Key relative to `/proc/sys`, e.g. `net/ipv6/conf/eth0/accept_ra`.
        key: String,
        /// Value written.
        value: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

impl SysctlError {
    /// Whether the key does not exist (e.g. IPv6 disabled in the kernel).
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Self::Write { source, .. } | Self::Read { source, .. }
                if source.kind() == std::io::ErrorKind::NotFound
        )
    }
}

/// An open handle on a network namespace. Holding it keeps the namespace alive.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

impl NetNs {
    /// Opens the namespace at `path` (`/var/run/netns/<name>`, `/proc/<pid>/ns/net`, ...).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, NetNsError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| NetNsError::Open {
            path: path.clone(),
            source,
        })?;
        Ok(Self { file, path })
    }

    /// The namespace of the calling thread.
    pub fn current() -> Result<Self, NetNsError> {
        Self::open("/proc/thread-self/ns/net")
    }

    /// The namespace named `name` under `/var/run/netns` (`ip netns add`).
    pub fn named(name: &str) -> Result<Self, NetNsError> {
        Self::open(Path::new("/var/run/netns").join(name))
    }

    /// Path this handle was opened from.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open namespace file (for `IFLA_NET_NS_FD`).
    #[must_use]
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether both handles refer to the same namespace (same inode on nsfs).
    #[must_use]
    pub fn same_as(&self, other: &Self) -> bool {
        match (self.file.metadata(), other.file.metadata()) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }

    /// Whether this is the calling thread's namespace.
    #[must_use]
    pub fn is_current(&self) -> bool {
        Self::current().is_ok_and(|cur| self.same_as(&cur))
    }

    /// Runs `f` inside this namespace: directly when it is the calling thread's own (no thread,
    /// which keeps the short-lived plugin small), otherwise on a fresh thread that has entered
    /// it. The calling thread never changes namespace; sockets and `/proc/sys/net` files
    /// opened inside `f` stay bound to this namespace.
    pub fn run<T, F>(&self, f: F) -> Result<T, NetNsError>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        if self.is_current() {
            return Ok(f());
        }
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    setns(&self.file, CloneFlags::CLONE_NEWNET).map_err(|source| {
                        NetNsError::Enter {
                            path: self.path.clone(),
                            source,
                        }
                    })?;
                    Ok(f())
                })
                .join()
                .map_err(|_| NetNsError::Worker(self.path.clone()))?
        })
    }

    /// Opens a route-netlink connection bound to this namespace. Must be called from within a
    /// tokio runtime (the socket registers with its reactor; the connection task is spawned on
    /// it).
    pub async fn connect(&self) -> Result<Netlink, NetlinkError> {
        let runtime = tokio::runtime::Handle::current();
        let conn = self
            .run(|| {
                let _entered = runtime.enter();
                rtnetlink::new_connection()
            })
            .map_err(NetlinkError::NetNs)?
            .map_err(NetlinkError::Socket)?;
        Ok(Netlink::from_connection(conn))
    }

    /// Writes sysctls (keys relative to `/proc/sys`, e.g. `net/ipv6/conf/eth0/accept_ra`)
    /// inside this namespace, in order, stopping at the first failure.
    pub fn write_sysctls(&self, entries: &[(String, String)]) -> Result<(), SysctlError> {
        self.run(|| {
            for (key, value) in entries {
                write_sysctl_here(key, value)?;
            }
            Ok(())
        })?
    }

    /// Reads a sysctl inside this namespace.
    pub fn read_sysctl(&self, key: &str) -> Result<String, SysctlError> {
        self.run(|| {
            std::fs::read_to_string(Path::new("/proc/sys").join(key))
                .map(|s| s.trim().to_owned())
                .map_err(|source| SysctlError::Read {
                    key: key.to_owned(),
                    source,
                })
        })?
    }
}

fn write_sysctl_here(key: &str, value: &str) -> Result<(), SysctlError> {
    let err = |source| SysctlError::Write {
        key: key.to_owned(),
        value: value.to_owned(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(Path::new("/proc/sys").join(key))
        .map_err(err)?;
    file.write_all(value.as_bytes()).map_err(err)
}
