//! Crash safety of the real binary: start `ipamd` (in-memory provider whose "EC2" state lives in
//! a file, like real EC2 outliving the daemon), run ADD/DEL traffic, SIGKILL it at a random
//! moment, restart, and check that no acknowledged assignment was lost or moved and that no
//! address is held twice. Repeated many times.

// Integration tests live at the top level of their own crate.
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{add_req, client, del_req, try_channel};
use ipamd_proto::rpc::cni_backend_client::CniBackendClient;
use ipamd_proto::{ErrorReason, IpamdError};
use rand::{Rng, SeedableRng};

const ROUNDS: usize = 30;
const KEYS: u32 = 24;

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(dir: &Path) -> Daemon {
    // In a network namespace of its own (`unshare --net` execs ipamd in place, same pid): at
    // start and in its reclaim loop ipamd reads the host's pod routes and rules and removes
    // stale pod rules, which must never happen in the machine's namespace.
    let child = Command::new("/usr/bin/unshare")
        .arg("--net")
        .arg(env!("CARGO_BIN_EXE_ipamd"))
        .env_clear()
        .env("ENABLE_IPv4", "true")
        .env("IPAMD_ENI_PROVIDER", "memory")
        .env(
            "IPAMD_MEMORY_PROVIDER",
            format!(
                "subnet=198.18.0.0/24,max_enis=3,ipv4_per_eni=10,state={}",
                dir.join("ec2.json").display()
            ),
        )
        .env("AWS_VPC_K8S_CNI_BACKING_STORE", dir.join("ipam.json"))
        .env("IPAMD_SOCKET_PATH", dir.join("ipamd.sock"))
        .env("AWS_VPC_K8S_CNI_LOG_FILE", dir.join("ipamd.log"))
        .env("DISABLE_INTROSPECTION", "true")
        .env("DISABLE_METRICS", "true")
        .env("WARM_IP_TARGET", "3")
        .env("IP_COOLDOWN_PERIOD", "1")
        .env("IPAMD_POOL_TICK_SECONDS", "1")
        .env("IPAMD_ADD_WAIT_TIMEOUT", "5")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ipamd");
    Daemon(child)
}

async fn wait_ready(socket: &Path, d: &mut Daemon) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(Some(status)) = d.0.try_wait() {
            panic!("ipamd exited during startup: {status}");
        }
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "ipamd did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug, Default)]
struct Model {
    held: BTreeMap<u32, String>,
    /// Keys with an operation in flight when the daemon died: outcome unknown.
    uncertain: BTreeMap<u32, bool>,
}

fn reason(s: &tonic::Status) -> Option<ErrorReason> {
    IpamdError::from_details(s.details()).map(|e| e.reason())
}

/// Resolves uncertain keys, then checks every acknowledged key still holds its address.
async fn verify(socket: PathBuf, model: &mut Model) {
    let mut c = client(socket).await;
    for (k, was_add) in std::mem::take(&mut model.uncertain) {
        if was_add {
            let r = c
                .add_network(add_req(&format!("k{k}")))
                .await
                .unwrap()
                .into_inner();
            if r.success {
                model
                    .held
                    .insert(k, r.ip_allocation_metadata[0].i_pv4_addr.clone());
            } else {
                // Refused (Success=false), as the traffic loop accepts: the pool is exhausted,
                // e.g. addresses of an unassign the crash made ambiguous stay out of the
                // datastore for the release cooldown (never handed out twice). A key ipamd
                // still held would have been answered with its address, so it holds nothing.
                model.held.remove(&k);
            }
        } else {
            match c.del_network(del_req(&format!("k{k}"))).await {
                Ok(_) => {}
                Err(s) => assert_eq!(reason(&s), Some(ErrorReason::UnknownPod), "{s:?}"),
            }
            model.held.remove(&k);
        }
    }
    let mut seen = BTreeSet::new();
    for (k, ip) in &model.held {
        let r = c
            .add_network(add_req(&format!("k{k}")))
            .await
            .unwrap_or_else(|s| panic!("k{k} lost: {s:?}"))
            .into_inner();
        assert!(r.success, "k{k} lost: refused");
        assert_eq!(
            &r.ip_allocation_metadata[0].i_pv4_addr, ip,
            "k{k} moved after a crash"
        );
        assert!(seen.insert(ip.clone()), "{ip} held by two keys");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_between_operations_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ipamd.sock");
    // SIGKILL_TEST_SEED reproduces a failed run (the seed is printed)
    let seed: u64 = std::env::var("SIGKILL_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("sigkill test seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut model = Model::default();
    for round in 0..ROUNDS {
        let mut d = spawn(dir.path());
        wait_ready(&socket, &mut d).await;
        verify(socket.clone(), &mut model).await;

        let shared = Arc::new(Mutex::new(std::mem::take(&mut model)));
        let ops: Vec<(u32, bool)> = (0..rng.random_range(1..12))
            .map(|_| (rng.random_range(0..KEYS), rng.random_bool(0.6)))
            .collect();
        let traffic = {
            let shared = shared.clone();
            let socket = socket.clone();
            tokio::spawn(async move {
                // Killed before the first connect: no operation was sent.
                let Ok(channel) = try_channel(socket).await else {
                    return;
                };
                let mut c = CniBackendClient::new(channel);
                for (k, add) in ops {
                    shared.lock().unwrap().uncertain.insert(k, add);
                    let name = format!("k{k}");
                    if add {
                        match c.add_network(add_req(&name)).await {
                            // Refused (Success=false, as upstream answers), e.g. the pool was
                            // momentarily empty: the key holds nothing.
                            Ok(r) if !r.get_ref().success => {
                                let mut m = shared.lock().unwrap();
                                assert!(!m.held.contains_key(&k));
                                m.uncertain.remove(&k);
                            }
                            Ok(r) => {
                                let ip =
                                    r.into_inner().ip_allocation_metadata[0].i_pv4_addr.clone();
                                let mut m = shared.lock().unwrap();
                                if let Some(prev) = m.held.insert(k, ip.clone()) {
                                    assert_eq!(prev, ip, "repeated ADD moved k{k}");
                                }
                                m.uncertain.remove(&k);
                            }
                            // Pool momentarily empty: the key holds nothing.
                            Err(s) if reason(&s) == Some(ErrorReason::NoAvailableAddress) => {
                                let mut m = shared.lock().unwrap();
                                assert!(!m.held.contains_key(&k));
                                m.uncertain.remove(&k);
                            }
                            Err(_) => return,
                        }
                    } else {
                        match c.del_network(del_req(&name)).await {
                            Ok(_) => {
                                let mut m = shared.lock().unwrap();
                                assert!(
                                    m.held.remove(&k).is_some(),
                                    "DEL of k{k} succeeded but it held nothing"
                                );
                                m.uncertain.remove(&k);
                            }
                            Err(s) if reason(&s) == Some(ErrorReason::UnknownPod) => {
                                let mut m = shared.lock().unwrap();
                                assert!(
                                    !m.held.contains_key(&k),
                                    "k{k} unknown to ipamd but acknowledged"
                                );
                                m.uncertain.remove(&k);
                            }
                            Err(_) => return,
                        }
                    }
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..60))).await;
        // SIGKILL (std's Child::kill), by our own child's pid.
        d.0.kill().unwrap();
        d.0.wait().unwrap();
        match traffic.await {
            Ok(()) => {}
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
        model = Arc::try_unwrap(shared)
            .map(|m| m.into_inner().unwrap())
            .unwrap_or_else(|a| std::mem::take(&mut *a.lock().unwrap()));
        eprintln!(
            "round {round}: {} held, {} uncertain",
            model.held.len(),
            model.uncertain.len()
        );
    }
    let mut d = spawn(dir.path());
    wait_ready(&socket, &mut d).await;
    verify(socket.clone(), &mut model).await;
    // The checkpoint on disk is upstream's format and lists exactly the held keys.
    let data: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("ipam.json")).unwrap()).unwrap();
    assert_eq!(data["version"], "vpc-cni-ipam/1");
    assert_eq!(
        data["allocations"].as_array().unwrap().len(),
        model.held.len()
    );
    assert!(!model.held.is_empty(), "the test never assigned anything");

    // SIGTERM: graceful exit, socket removed, checkpoint untouched.
    let before = std::fs::read(dir.path().join("ipam.json")).unwrap();
    let status = Command::new("kill")
        .args(["-TERM", &d.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(s) = d.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "ipamd ignored SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(exit.success(), "{exit}");
    assert!(!socket.exists(), "socket left behind");
    assert_eq!(std::fs::read(dir.path().join("ipam.json")).unwrap(), before);
}
