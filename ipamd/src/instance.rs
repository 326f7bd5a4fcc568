//! One ipamd per node: exclusive `flock(2)`s on the node lock (`/var/run/aws-node/ipamd.lock`, next
//! to the socket every plugin dials) and on the checkpoint's `<checkpoint>.lock`, taken before
//! ipamd reads the checkpoint or touches the host, and held until the process exits (the kernel
//! drops it even on SIGKILL). A DaemonSet `maxSurge` update starts the new aws-node pod while the
//! old one still runs; the old one may still finish a pool step and answer waiting ADDs after its
//! socket stopped accepting. Waiting for the lock instead of the socket means the new instance
//! reads the checkpoint only once the old one has fully exited, so every assignment the old one
//! made is in what it reads, and two instances started together never both prune, reclaim or run
//! the pool. The socket's lock is the one that holds across a rolling update that changes
//! `AWS_VPC_K8S_CNI_BACKING_STORE` (the two instances' checkpoint locks then differ); the
//! checkpoint's lock is kept too, so an older ipamd that takes only that one is still waited for.
//! Both are taken in that order, all or none. Must not: read or write the checkpoint itself.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often a waiting instance tries the lock again.
pub const LOCK_POLL: Duration = Duration::from_millis(200);

/// The lock could not be taken for a reason other than another holder.
#[derive(Debug, thiserror::Error)]
#[error("node lock {}", path.display())]
pub struct LockError {
    /// The lock file.
    pub path: PathBuf,
    /// Cause.
    #[source]
    pub source: std::io::Error,
}

/// The held locks; dropping them (or exiting) releases them.
#[derive(Debug)]
pub struct NodeLock {
    _files: Vec<File>,
    path: PathBuf,
}

/// The lock files of a node: the socket's, then the checkpoint's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockPaths {
    /// Next to the socket: `<socket dir>/<socket stem>.lock` (`/var/run/aws-node/ipamd.lock`).
    /// The socket path is the node's one rendezvous (the plugin dials it; production never
    /// changes it: `IPAMD_SOCKET_PATH` is ours, for simulated nodes sharing one filesystem).
    pub node: PathBuf,
    /// `<checkpoint>.lock` (`/var/run/aws-node/ipam.json.lock`): what older versions of this ipamd
    /// took alone.
    pub checkpoint: PathBuf,
}

impl LockPaths {
    /// The lock files of a node whose ipamd serves `socket` and checkpoints to `checkpoint`.
    #[must_use]
    pub fn new(socket: &Path, checkpoint: &Path) -> Self {
        let mut name = checkpoint.as_os_str().to_owned();
        name.push(".lock");
        Self {
            node: socket.with_extension("lock"),
            checkpoint: PathBuf::from(name),
        }
    }
}

impl NodeLock {
    /// Takes both locks now (socket's first), or `None` while another instance holds either
    /// (then neither is kept).
    pub fn try_acquire(paths: &LockPaths) -> Result<Option<Self>, LockError> {
        let mut files = Vec::new();
        for path in [&paths.node, &paths.checkpoint] {
            match Self::try_one(path)? {
                Some(f) => files.push(f),
                None => return Ok(None),
            }
        }
        Ok(Some(Self {
            _files: files,
            path: paths.node.clone(),
        }))
    }

    fn try_one(path: &Path) -> Result<Option<File>, LockError> {
        let path = path.to_path_buf();
        let err = |source| LockError {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(err)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(file)),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(err(e)),
        }
    }

    /// Waits (polling every `poll`) until the lock is this process's; `None` if `shutdown`
    /// came first. Logs once when it has to wait.
    pub async fn acquire(
        paths: &LockPaths,
        shutdown: &CancellationToken,
        poll: Duration,
    ) -> Result<Option<Self>, LockError> {
        let mut logged = false;
        loop {
            if let Some(lock) = Self::try_acquire(paths)? {
                if logged {
                    tracing::info!(lock = %lock.path.display(), "the other ipamd exited; starting");
                }
                return Ok(Some(lock));
            }
            if !logged {
                tracing::warn!(
                    lock = %paths.node.display(),
                    checkpoint_lock = %paths.checkpoint.display(),
                    "another ipamd holds this node's checkpoint; waiting for it to exit"
                );
                logged = true;
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                () = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// The node's lock file (the socket's).
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Waits while another ipamd serves `socket` (the old pod during a DaemonSet `maxSurge`
/// update): two instances must not manage one node, nor remove each other's socket. Returns
/// false if `shutdown` came first.
pub async fn wait_for_socket(socket: &std::path::Path, shutdown: &CancellationToken) -> bool {
    let mut logged = false;
    while crate::rpc::socket_is_live(socket) {
        if !logged {
            tracing::warn!(socket = %socket.display(), "another ipamd serves this socket; waiting for it to stop");
            logged = true;
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
        }
    }
    if logged {
        tracing::info!(socket = %socket.display(), "the other ipamd stopped; starting");
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 28 finding 3: the second instance of a maxSurge update gets the node only when the
    /// first one's lock is gone (its process exited), not when its socket stops accepting.
    #[tokio::test]
    async fn a_second_instance_waits_until_the_first_one_has_exited() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = LockPaths::new(
            &dir.path().join("aws-node/ipamd.sock"),
            &dir.path().join("aws-node/ipam.json"),
        );
        let first = NodeLock::try_acquire(&checkpoint).unwrap().expect("free");
        assert_eq!(first.path(), dir.path().join("aws-node/ipamd.lock"));
        assert!(NodeLock::try_acquire(&checkpoint).unwrap().is_none());

        let shutdown = CancellationToken::new();
        let waiting = {
            let checkpoint = checkpoint.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                NodeLock::acquire(&checkpoint, &shutdown, Duration::from_millis(10)).await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiting.is_finished(),
            "must wait while the first instance lives"
        );
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(2), waiting)
            .await
            .expect("acquired after the first one exited")
            .unwrap()
            .unwrap();
        assert!(second.is_some());

        // A waiting instance that is told to stop gives up without the lock.
        let stop = CancellationToken::new();
        stop.cancel();
        let none = NodeLock::acquire(&checkpoint, &stop, Duration::from_millis(10))
            .await
            .unwrap();
        assert!(none.is_none());
    }

    /// Issue 38: a rolling update that changes `AWS_VPC_K8S_CNI_BACKING_STORE` still keeps
    /// the two instances apart (the socket's lock is the same), and an instance of a version
    /// that took only the checkpoint's lock is still waited for.
    #[test]
    fn a_changed_checkpoint_path_still_excludes_and_the_old_lock_is_still_honoured() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ipamd.sock");
        let old = LockPaths::new(&socket, &dir.path().join("ipam.json"));
        let new = LockPaths::new(&socket, &dir.path().join("elsewhere/ipam.json"));
        assert_ne!(old.checkpoint, new.checkpoint);
        assert_eq!(old.node, new.node);
        assert_eq!(
            LockPaths::new(
                Path::new("/var/run/aws-node/ipamd.sock"),
                Path::new("/var/run/aws-node/ipam.json")
            ),
            LockPaths {
                node: PathBuf::from("/var/run/aws-node/ipamd.lock"),
                checkpoint: PathBuf::from("/var/run/aws-node/ipam.json.lock"),
            }
        );
        let first = NodeLock::try_acquire(&old).unwrap().expect("free");
        assert!(
            NodeLock::try_acquire(&new).unwrap().is_none(),
            "another checkpoint path, the same node"
        );
        drop(first);

        // An older ipamd holds only the checkpoint's lock: the new one waits, and holds
        // nothing meanwhile (the socket's lock was given back).
        let older = NodeLock::try_one(&old.checkpoint).unwrap().expect("free");
        assert!(NodeLock::try_acquire(&old).unwrap().is_none());
        assert!(NodeLock::try_one(&old.node).unwrap().is_some());
        drop(older);
        assert!(NodeLock::try_acquire(&old).unwrap().is_some());
    }
}
