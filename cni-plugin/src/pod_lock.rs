//! One pod's ADD and DEL, one at a time on the node: a lock per pod identity (namespace and
//! name, or the container id without one), held for the whole verb, so that a DEL's decision
//! ("no other sandbox is wired under this pod's names") and its `DeletePodNp` cannot straddle
//! a same-name pod's ADD (wiring and `EnforceNpToPod`), e.g. while the DEL redials the
//! network-policy agent. Owns the lock's name and its acquisition; must not: keep
//! anything on disk (the lock is an abstract unix socket of the host netns: nothing to clean
//! up, released by the kernel when the process exits, whatever the exit).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::time::{Duration, Instant};

use crate::spec::CniEnv;

/// How long a verb waits for another verb of the same pod before it gives up
/// (`TryAgainLater`: the runtime retries).
pub const LOCK_WAIT: Duration = Duration::from_secs(60);
/// Pause between two attempts.
const RETRY: Duration = Duration::from_millis(20);

/// Why the pod's lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum PodLockError {
    /// Another verb of the same pod held it for all of the wait.
    #[error("another CNI call for {pod} still runs after {waited:?}")]
    Busy {
        /// The pod identity.
        pod: String,
        /// How long this call waited.
        waited: Duration,
    },
    /// The abstract socket could not be bound for another reason.
    #[error("pod lock for {pod}")]
    Bind {
        /// The pod identity.
        pod: String,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; released when dropped.
#[derive(Debug)]
pub struct PodLock {
    _socket: UnixListener,
}

/// The pod identity the lock is named after: `<namespace>/<name>` for kubelet's pods, the
/// container id otherwise.
#[must_use]
pub fn pod_key(env: &CniEnv) -> String {
    if env.k8s.has_pod() {
        format!("{}/{}", env.k8s.pod_namespace, env.k8s.pod_name)
    } else {
        format!("container {}", env.container_id)
    }
}

/// The abstract socket name of `key`'s lock (hashed: an abstract name has at most 107 bytes,
/// a pod's namespace and name up to 316; two pods sharing a hash only wait for each other).
#[must_use]
pub fn lock_name(key: &str) -> String {
    dataplane::conventions::host_veth_name("aws-cni-pod-lock-", "", key)
}

/// Takes `key`'s lock, waiting up to `wait` for another holder.
pub async fn acquire(key: &str, wait: Duration) -> Result<PodLock, PodLockError> {
    let name = lock_name(key);
    let started = Instant::now();
    loop {
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|source| {
            PodLockError::Bind {
                pod: key.to_owned(),
                source,
            }
        })?;
        match UnixListener::bind_addr(&addr) {
            Ok(socket) => return Ok(PodLock { _socket: socket }),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if started.elapsed() >= wait {
                    return Err(PodLockError::Busy {
                        pod: key.to_owned(),
                        waited: started.elapsed(),
                    });
                }
                tokio::time::sleep(RETRY).await;
            }
            Err(source) => {
                return Err(PodLockError::Bind {
                    pod: key.to_owned(),
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lock of one pod is held by one verb at a time: a second taker waits until the first
    /// drops it, and gives up (`Busy`) when that takes longer than its wait; another pod's lock
    /// is independent.
    #[test]
    fn a_second_verb_of_the_same_pod_waits_until_the_first_is_done() {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
            .block_on(second_waits());
    }

    async fn second_waits() {
        let key = format!("test-ns/pod-{}", std::process::id());
        let first = acquire(&key, Duration::ZERO).await.expect("first");
        assert!(matches!(
            acquire(&key, Duration::from_millis(100)).await,
            Err(PodLockError::Busy { .. })
        ));
        let other = acquire(&format!("{key}-other"), Duration::ZERO)
            .await
            .expect("another pod's lock");
        let waiter = tokio::spawn({
            let key = key.clone();
            async move {
                let t = Instant::now();
                let lock = acquire(&key, Duration::from_secs(5)).await.expect("second");
                (t.elapsed(), lock)
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(first);
        let (waited, _second) = waiter.await.expect("join");
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
        drop(other);
    }

    #[test]
    fn lock_names_fit_the_abstract_namespace() {
        let long = format!("{}/{}", "n".repeat(63), "p".repeat(253));
        assert!(lock_name(&long).len() < 107);
        assert_ne!(lock_name("default/web-0"), lock_name("default/web-1"));
    }
}
