//! The `kubesim` binary: starts with manifests and service accounts from flags, prints its
//! URL/CA/kubeconfigs as one JSON line, serves real clients (Debian's kubectl) with the
//! chart's CRD and the CNINode CRD loaded, and exits 0 on SIGTERM.
#![allow(clippy::tests_outside_test_module)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;
use common::eniconfig_crd;

fn kubectl_bin() -> std::path::PathBuf {
    let p = std::env::var_os("KUBESIM_KUBECTL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/usr/local/lib/kubernetes-client/usr/bin/kubectl".into());
    assert!(
        p.exists(),
        "{} missing: run integration/test.sh",
        p.display()
    );
    p
}

/// Kills the simulator (by its own PID) if the test fails before the SIGTERM step.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn binary_serves_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_kubesim"))
        .arg("--dir")
        .arg(dir.path())
        .arg("--apply")
        .arg(eniconfig_crd())
        .args([
            "--cninode-crd",
            "--service-account",
            "kube-system/aws-node",
            "--history",
            "50",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut child = Reap(child);
    let child_out = child.0.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(child_out).read_line(&mut line).unwrap();
    let info: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert!(
        info["url"]
            .as_str()
            .unwrap()
            .starts_with("https://127.0.0.1:")
    );
    let admin = info["admin_kubeconfig"].as_str().unwrap().to_string();
    let sa = info["service_accounts"]["kube-system/aws-node"]["kubeconfig"]
        .as_str()
        .unwrap()
        .to_string();
    let kubectl = |kc: &str, args: &[&str]| {
        let o = Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(kc)
            .args(args)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
        )
    };
    let (ok, out) = kubectl(
        &admin,
        &["api-resources", "--api-group=vpcresources.k8s.aws"],
    );
    assert!(
        ok && out.contains("cninodes") && out.contains("CNINode"),
        "{out}"
    );
    let (ok, out) = kubectl(&admin, &["get", "crd", "-o", "name"]);
    assert!(
        ok && out.contains("eniconfigs.crd.k8s.amazonaws.com"),
        "{out}"
    );
    // No RBAC was loaded: the ServiceAccount authenticates but may do nothing.
    let (ok, out) = kubectl(&sa, &["get", "nodes"]);
    assert!(
        !ok && out.contains("Forbidden")
            && out.contains("system:serviceaccount:kube-system:aws-node"),
        "{out}"
    );

    let pid = child.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "kubesim did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}
