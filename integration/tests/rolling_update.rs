//! Issue 14 item 3: a DaemonSet rolling update between two of our builds that report different
//! versions (the built binaries and copies re-stamped with another version,
//! `integration::version_stamp`). While the plugin and ipamd disagree, ADD fails with an
//! explicit version error and wires nothing; kubelet-style retries succeed once both match, in
//! both directions (update and rollback); existing pods' traffic never stops. Root only.

#![allow(clippy::tests_outside_test_module)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use integration::sim::{INTERNET_HOST, Sim, SimConfig, exec_in};
use integration::sim::{PingStream, PluginTarget, Sandbox, run_plugin};
use integration::upstream_node::{IpamdBuild, built};
use integration::version_stamp::restamp;

struct Added {
    name: String,
    netns: String,
    container_id: String,
    ip: Ipv4Addr,
}

fn host_veths(node_netns: &str) -> usize {
    let out = exec_in(node_netns, &["ip", "-o", "link", "show", "type", "veth"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(": eni"))
        .count()
}

fn pod_has_eth0(ns: &str) -> bool {
    exec_in(ns, &["ip", "link", "show", "eth0"])
        .status
        .success()
}

/// kubelet: create the sandbox, ADD; on failure tear the sandbox down and try again later.
/// Every failed attempt must leave nothing wired. Returns the pod and the failures seen.
fn add_like_kubelet(
    target: &PluginTarget,
    plugin: &Path,
    name: &str,
    k: usize,
    wired_before: usize,
    deadline: Instant,
) -> (Option<Added>, Vec<String>) {
    let netns = format!("{}r{k}", target.pod_prefix);
    let cid = format!("{:064x}", 0xfeed_0000_u64 + k as u64);
    let mut failures = Vec::new();
    loop {
        let _ = std::process::Command::new("ip")
            .args(["netns", "add", &netns])
            .status();
        let sandbox = Sandbox {
            pod_name: name,
            container_id: &cid,
            netns: &netns,
        };
        match run_plugin(plugin, target, "ADD", sandbox, None) {
            Ok(result) => {
                let ip = result["ips"][0]["address"]
                    .as_str()
                    .and_then(|a| a.split('/').next())
                    .and_then(|a| a.parse().ok())
                    .expect("address in result");
                return (
                    Some(Added {
                        name: name.to_owned(),
                        netns,
                        container_id: cid,
                        ip,
                    }),
                    failures,
                );
            }
            Err((code, out)) => {
                assert!(!pod_has_eth0(&netns), "{name}: failed ADD left eth0: {out}");
                assert_eq!(
                    host_veths(&target.node_netns),
                    wired_before,
                    "{name}: failed ADD left a host veth: {out}"
                );
                failures.push(format!("exit {code}: {out}"));
                FAILED_ATTEMPTS.fetch_add(1, Ordering::SeqCst);
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", &netns])
                    .status();
                if Instant::now() > deadline {
                    return (None, failures);
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        }
    }
}

/// Failed ADD attempts so far (the update steps wait for one in each mismatched phase, so the
/// test does not depend on how fast this machine runs the plugin).
static FAILED_ATTEMPTS: AtomicUsize = AtomicUsize::new(0);

/// Waits (up to 90 s) until an ADD attempt failed after `before` failures had been counted.
fn wait_for_a_failed_attempt(before: usize) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while FAILED_ATTEMPTS.load(Ordering::SeqCst) <= before {
        assert!(
            Instant::now() < deadline,
            "no ADD attempt failed while plugin and ipamd versions differed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn plugin_and_ipamd_of_different_builds_fail_explicitly_and_retries_succeed() {
    if !integration::can_run_kernel_tests() {
        return;
    }
    let sim = Sim::start(&SimConfig {
        nodes: 1,
        ..SimConfig::default()
    })
    .expect("sim");
    let (ipamd_n, plugin_n) = (built("ipamd").unwrap(), built("aws-cni").unwrap());
    let next = format!("{}-next", ipamd_proto::BUILD_VERSION);
    let bin = sim.dir().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let ipamd_next = bin.join("ipamd-next");
    restamp(&ipamd_n, &ipamd_next, &next).expect("restamp ipamd");
    // the host's CNI bin dir: the init container replaces the plugin by rename
    let installed = bin.join("aws-cni");
    restamp(&plugin_n, &installed, ipamd_proto::BUILD_VERSION).unwrap();

    let target = PluginTarget::of(&sim, 0);
    let mut ipamd = IpamdBuild::start(&sim, 0, &ipamd_n, &[], Duration::from_secs(60)).unwrap();
    let mut existing = Vec::new();
    for k in 0..3 {
        let (pod, failures) = add_like_kubelet(
            &target,
            &installed,
            &format!("before-{k}"),
            k,
            k,
            Instant::now() + Duration::from_secs(20),
        );
        existing.push(pod.unwrap_or_else(|| panic!("{failures:?}")));
    }
    let streams: Vec<PingStream> = existing
        .iter()
        .map(|p| PingStream::start(&p.netns, INTERNET_HOST).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));

    let done = AtomicBool::new(false);
    let (added, failures) = std::thread::scope(|s| {
        let kubelet = s.spawn(|| {
            let mut added = Vec::new();
            let mut failures = Vec::new();
            let mut k = 10;
            // a new pod every 1.5 s for the whole update (at most 12: m5.large holds 27)
            while (!done.load(Ordering::SeqCst) || added.len() < 4) && added.len() < 12 {
                let (pod, f) = add_like_kubelet(
                    &target,
                    &installed,
                    &format!("during-{k}"),
                    k,
                    existing.len() + added.len(),
                    Instant::now() + Duration::from_secs(60),
                );
                failures.extend(f);
                added.push(pod);
                k += 1;
                std::thread::sleep(Duration::from_millis(1500));
            }
            (added, failures)
        });
        let step = || std::thread::sleep(Duration::from_secs(3));
        step();
        // Update: the new pod's init container installs plugin N+1 while ipamd N still serves.
        let before = FAILED_ATTEMPTS.load(Ordering::SeqCst);
        restamp(&plugin_n, &installed, &next).unwrap();
        step();
        wait_for_a_failed_attempt(before);
        // the old aws-node container stops, the new one starts
        ipamd.stop();
        ipamd = IpamdBuild::start(&sim, 0, &ipamd_next, &[], Duration::from_secs(60)).unwrap();
        step();
        // Rollback: plugin N comes back first, then ipamd N.
        let before = FAILED_ATTEMPTS.load(Ordering::SeqCst);
        restamp(&plugin_n, &installed, ipamd_proto::BUILD_VERSION).unwrap();
        step();
        wait_for_a_failed_attempt(before);
        ipamd.stop();
        ipamd = IpamdBuild::start(&sim, 0, &ipamd_n, &[], Duration::from_secs(60)).unwrap();
        step();
        done.store(true, Ordering::SeqCst);
        kubelet.join().unwrap()
    });
    for s in streams {
        let what = s.what().to_owned();
        let c = s.stop().unwrap();
        eprintln!("{what}: sent {} lost {}", c.sent, c.lost());
        assert!(c.sent > 100);
        assert!(c.lost() <= 1, "{what}: lost {} of {}", c.lost(), c.sent);
    }
    eprintln!("failed attempts: {}", failures.len());
    for f in &failures {
        eprintln!("  {}", f.lines().next().unwrap_or(""));
    }
    let added: Vec<Added> = added
        .into_iter()
        .map(|p| p.expect("every ADD issued during the update eventually succeeds"))
        .collect();
    // a mismatched pair refuses with an explicit version error, in both directions
    let n = ipamd_proto::BUILD_VERSION;
    for (client, daemon) in [(next.as_str(), n), (n, next.as_str())] {
        let want =
            format!(r#"client version \"{client}\" does not match ipamd version \"{daemon}\""#);
        assert!(
            failures.iter().any(|f| f.contains(&want)),
            "no failure saying {want}: {failures:?}"
        );
    }
    // every pod holds its own address, as ipamd says
    let held = sim.assigned(0).unwrap();
    let mut want: Vec<(Ipv4Addr, String)> = existing
        .iter()
        .chain(&added)
        .map(|p| (p.ip, p.name.clone()))
        .collect();
    want.sort();
    let mut got: Vec<(Ipv4Addr, String)> = held.into_iter().map(|(ip, (_, n))| (ip, n)).collect();
    got.sort();
    assert_eq!(got, want);
    for p in existing.iter().chain(&added) {
        integration::sim::ping(&p.netns, INTERNET_HOST).unwrap();
        let sandbox = Sandbox {
            pod_name: &p.name,
            container_id: &p.container_id,
            netns: &p.netns,
        };
        run_plugin(&installed, &target, "DEL", sandbox, None)
            .unwrap_or_else(|e| panic!("DEL {}: {e:?}", p.name));
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &p.netns])
            .status();
    }
    assert_eq!(host_veths(&target.node_netns), 0);
    drop(ipamd);
    let errors = sim.shutdown();
    assert!(errors.is_empty(), "{errors:?}");
}
