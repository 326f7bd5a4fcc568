//! The Helm chart, linted and rendered by real Helm (helm-python-sdk bundles Helm's Go SDK) and
//! every rendered object validated against the Kubernetes schemas (kubernetes-validate); the
//! aws-node start-up script run for real on each rendering, and the renderings compared with
//! what upstream's chart renders for the same values (tables in chart/upstream_fidelity.py).
//! `integration/test.sh` installs the Python packages from PyPI.
#![allow(clippy::tests_outside_test_module)]

use std::path::Path;
use std::process::Command;

fn run_script(name: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("chart")
        .join(name);
    let out = Command::new("python3")
        .arg(&script)
        .env(
            "AWS_CNI_CONFLIST_BIN",
            integration::built_binary("aws-cni-conflist"),
        )
        .output()
        .expect("python3 must be installed (integration/test.sh installs prerequisites)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} failed (run integration/test.sh to install helm-python-sdk and kubernetes-validate)\n{stdout}\n{stderr}"
    );
    stdout
}

#[test]
fn chart_lints_renders_and_validates() {
    let stdout = run_script("check_chart.py");
    assert!(stdout.contains("defaults: rendered"), "{stdout}");
    assert!(
        stdout.contains("extra-env-value-from: rendered"),
        "{stdout}"
    );
    // the init script honours HOST_CNI_BIN_PATH and reads DISABLE_TCP_EARLY_DEMUX as Go's
    // strconv.ParseBool (check_chart.py `run_init_script`, as root)
    assert!(
        stdout.contains("init script: HOST_CNI_BIN_PATH honoured")
            || stdout.contains("SKIP init-script run"),
        "{stdout}"
    );
}

#[test]
fn chart_renders_what_upstream_renders() {
    let stdout = run_script("upstream_fidelity.py");
    assert!(stdout.contains("every-upstream-key: matches"), "{stdout}");
}

#[test]
fn metrics_helper_chart_lints_renders_and_validates() {
    let stdout = run_script("check_metrics_helper_chart.py");
    for set in [
        "defaults",
        "prometheus",
        "prometheus-podmonitor",
        "existing-sa-upstream-image",
        "override-everything",
    ] {
        assert!(stdout.contains(&format!("{set}: rendered")), "{stdout}");
    }
}
