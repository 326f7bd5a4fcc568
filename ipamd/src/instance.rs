//! One ipamd per node: an exclusive `flock(2)` on `<checkpoint>.lock`, taken before ipamd reads
//! the checkpoint or touches the host, and held until the process exits (the kernel drops it
//! even on SIGKILL). A DaemonSet `maxSurge` update starts the new aws-node pod while the old one
//! still runs; the old one may still finish a pool step and answer waiting ADDs after its socket
//! stopped accepting. Waiting for the lock instead of the socket means the new instance reads
//! the checkpoint only once the old one has fully exited, so every assignment the old one made
//! is in what it reads, and two instances started together never both prune, reclaim or run the
//! pool. Must not: read or write the checkpoint itself.

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

/// The held lock; dropping it (or exiting) releases it.
#[derive(Debug)]
pub struct NodeLock {
    _file: File,
    path: PathBuf,
}

impl NodeLock {
    /// The lock file of checkpoint `checkpoint` (`/var/run/aws-node/ipam.json.lock`).
    #[must_use]
    pub fn path_for(checkpoint: &Path) -> PathBuf {
        let mut name = checkpoint.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Takes the lock now, or `None` while another instance holds it.
    pub fn try_acquire(checkpoint: &Path) -> Result<Option<Self>, LockError> {
        let path = Self::path_for(checkpoint);
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
            Ok(()) => Ok(Some(Self { _file: file, path })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(err(e)),
        }
    }

    /// Waits (polling every `poll`) until the lock is this process's; `None` if `shutdown`
    /// came first. Logs once when it has to wait.
    pub async fn acquire(
        checkpoint: &Path,
        shutdown: &CancellationToken,
        poll: Duration,
    ) -> Result<Option<Self>, LockError> {
        let mut logged = false;
        loop {
            if let Some(lock) = Self::try_acquire(checkpoint)? {
                if logged {
                    tracing::info!(lock = %lock.path.display(), "the other ipamd exited; starting");
                }
                return Ok(Some(lock));
            }
            if !logged {
                tracing::warn!(
                    lock = %Self::path_for(checkpoint).display(),
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

    /// The lock file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 28 finding 3: the second instance of a maxSurge update gets the node only when the
    /// first one's lock is gone (its process exited), not when its socket stops accepting.
    #[tokio::test]
    async fn a_second_instance_waits_until_the_first_one_has_exited() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = dir.path().join("aws-node/ipam.json");
        let first = NodeLock::try_acquire(&checkpoint).unwrap().expect("free");
        assert_eq!(first.path(), dir.path().join("aws-node/ipam.json.lock"));
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
}
