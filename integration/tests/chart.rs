//! The Helm chart, linted and rendered by real Helm (helm-python-sdk bundles Helm's Go SDK) and
//! every rendered object validated against the Kubernetes schemas (kubernetes-validate).
//! `integration/test.sh` installs both from PyPI.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::process::Command;

#[test]
fn chart_lints_renders_and_validates() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("chart/check_chart.py");
    let out = Command::new("python3")
        .arg(&script)
        .output()
        .expect("python3 must be installed (integration/test.sh installs prerequisites)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "chart check failed (run integration/test.sh to install helm-python-sdk and kubernetes-validate)\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("defaults: rendered"), "{stdout}");
}
