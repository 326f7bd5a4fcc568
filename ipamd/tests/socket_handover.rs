//! Issue 18 item 8: during a DaemonSet `maxSurge` update the new ipamd starts while the old one
//! still serves. The new one must not unlink the old one's socket (nor manage the node beside
//! it, nor read the checkpoint before the old one has exited: issue 28 finding 3): it waits for
//! the node lock the old one holds until it exits, and the old one, stopping, removes only the
//! socket it bound itself.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The real binary, in a network namespace of its own (`unshare --net` execs it in place).
fn spawn(dir: &Path, log: &str) -> Daemon {
    let child = Command::new("/usr/bin/unshare")
        .arg("--net")
        .arg(env!("CARGO_BIN_EXE_ipamd"))
        .env_clear()
        .env("ENABLE_IPv4", "true")
        .env("IPAMD_ENI_PROVIDER", "memory")
        .env(
            "IPAMD_MEMORY_PROVIDER",
            format!(
                "subnet=198.18.0.0/24,max_enis=2,ipv4_per_eni=4,state={}",
                dir.join("ec2.json").display()
            ),
        )
        .env("AWS_VPC_K8S_CNI_BACKING_STORE", dir.join("ipam.json"))
        .env("IPAMD_SOCKET_PATH", dir.join("ipamd.sock"))
        .env("AWS_VPC_K8S_CNI_LOG_FILE", dir.join(log))
        .env("DISABLE_INTROSPECTION", "true")
        .env("DISABLE_METRICS", "true")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ipamd");
    Daemon(child)
}

fn inode(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::symlink_metadata(p).ok().map(|m| m.ino())
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_second_ipamd_waits_for_the_first_and_never_unlinks_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ipamd.sock");
    let mut old = spawn(dir.path(), "old.log");
    wait_for("the first ipamd serves", || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let first = inode(&sock);
    let mut new = spawn(dir.path(), "new.log");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        new.0.try_wait().unwrap().is_none(),
        "the new ipamd waits, it does not exit"
    );
    assert_eq!(
        inode(&sock),
        first,
        "the new ipamd replaced the live ipamd's socket"
    );
    // It waits for the node lock (held by the old one until it exits, issue 28 finding 3),
    // before it reads the checkpoint or looks at the socket.
    let log = std::fs::read_to_string(dir.path().join("new.log")).unwrap_or_default();
    assert!(
        log.contains("another ipamd holds this node's checkpoint; waiting for it to exit"),
        "{log}"
    );
    assert!(
        !log.contains("checkpoint restored"),
        "the new ipamd read the checkpoint while the old one still ran: {log}"
    );
    // The old one stops (SIGTERM): it removes its own socket; the new one then starts.
    let status = Command::new("kill")
        .args(["-TERM", &old.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    old.0.wait().unwrap();
    wait_for("the new ipamd took over", || {
        inode(&sock).is_some_and(|i| Some(i) != first)
            && std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let second = inode(&sock);
    let status = Command::new("kill")
        .args(["-TERM", &new.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    new.0.wait().unwrap();
    assert_eq!(
        inode(&sock),
        None,
        "a stopping ipamd removes the socket it bound"
    );
    let _ = second;
}

#[tokio::test]
async fn bind_socket_refuses_a_socket_something_serves_and_replaces_a_stale_one() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ipamd.sock");
    let live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    assert!(matches!(
        ipamd::rpc::bind_socket(&sock),
        Err(ipamd::rpc::SocketError::InUse(_))
    ));
    assert!(
        std::os::unix::net::UnixStream::connect(&sock).is_ok(),
        "still the live one"
    );
    drop(live); // the file stays, nobody listens: stale
    // The other test here forks ipamds: a child between fork and exec holds a copy of every
    // descriptor (close-on-exec closes it only at exec), so the socket may listen a moment
    // longer than `live` lives in this process.
    wait_for("the listener closed in every process", || {
        std::os::unix::net::UnixStream::connect(&sock).is_err()
    });
    let rebound = ipamd::rpc::bind_socket(&sock);
    assert!(rebound.is_ok(), "{rebound:?}");
}
