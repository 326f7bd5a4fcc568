//! Shared by kubesim's test files: repository paths and the chart rendered by real Helm.
#![allow(dead_code, clippy::tests_outside_test_module)]

use std::path::{Path, PathBuf};

use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The chart's ENIConfig CRD.
pub fn eniconfig_crd() -> PathBuf {
    repo_root().join("charts/aws-vpc-cni/crds/customresourcedefinition.yaml")
}

/// charts/aws-vpc-cni rendered by real Helm (helm-python-sdk, as integration/chart/check_chart.py
/// does) into namespace kube-system, as one multi-document YAML.
pub fn render_chart(values: &Value) -> String {
    let script = r#"
import json, sys
import helm_python as helm
chart = helm.Chart.load(sys.argv[1])
out = chart.render(json.loads(sys.argv[2]), name="aws-vpc-cni", namespace="kube-system", is_install=True)
print("\n---\n".join(t for p, t in sorted(out.items()) if p.endswith(".yaml")))
"#;
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            script,
            repo_root().join("charts/aws-vpc-cni").to_str().unwrap(),
            &values.to_string(),
        ])
        .output()
        .expect("python3 (integration/test.sh installs helm-python-sdk)");
    assert!(
        out.status.success(),
        "helm render failed (run integration/test.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
