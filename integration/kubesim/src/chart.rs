//! The repository's Helm charts rendered by real Helm (helm-python-sdk): charts/aws-vpc-cni (as
//! integration/chart/check_chart.py renders it) and the cni-metrics-helper chart (through
//! integration/chart/check_metrics_helper_chart.py `--emit`), for tests that apply their CRDs
//! and RBAC to the simulator. Owns only the rendering calls; must not apply anything itself.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The repository root (this crate lives in integration/kubesim).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The chart directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/aws-vpc-cni")
}

/// The chart's ENIConfig CRD.
pub fn eniconfig_crd() -> PathBuf {
    chart_dir().join("crds/customresourcedefinition.yaml")
}

/// Rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// python3 could not be run.
    #[error("running python3 (integration/test.sh installs helm-python-sdk): {0}")]
    Spawn(std::io::Error),
    /// Helm refused (or helm-python-sdk is missing).
    #[error("helm render failed (run integration/test.sh to install helm-python-sdk): {0}")]
    Render(String),
    /// The output was not UTF-8.
    #[error("helm output is not UTF-8")]
    Utf8,
}

/// charts/aws-vpc-cni rendered with `values` into namespace kube-system (release
/// `aws-vpc-cni`), as one multi-document YAML (templates only; the CRD is in
/// [`eniconfig_crd`]).
pub fn render_chart(values: &Value) -> Result<String, ChartError> {
    render(&chart_dir(), "aws-vpc-cni", values)
}

/// The chart at `dir` rendered with `values` into namespace kube-system as release `release`
/// by real Helm (helm-python-sdk), as one multi-document YAML (templates only).
fn render(dir: &Path, release: &str, values: &Value) -> Result<String, ChartError> {
    let script = r#"
import json, sys
import helm_python as helm
chart = helm.Chart.load(sys.argv[1])
out = chart.render(json.loads(sys.argv[2]), name=sys.argv[3], namespace="kube-system", is_install=True)
print("\n---\n".join(t for p, t in sorted(out.items()) if p.endswith(".yaml")))
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(dir)
        .arg(values.to_string())
        .arg(release)
        .output()
        .map_err(ChartError::Spawn)?;
    if !out.status.success() {
        return Err(ChartError::Render(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| ChartError::Utf8)
}

/// The cni-metrics-helper chart with its default values, as
/// `integration/chart/check_metrics_helper_chart.py --emit <dir>/metrics-helper-chart.yaml`
/// renders it (after linting and validating every value set); the rendered YAML. `dir` is a
/// scratch directory for the file.
pub fn render_metrics_helper_chart(dir: &Path) -> Result<String, ChartError> {
    let out_path = dir.join("metrics-helper-chart.yaml");
    let out = std::process::Command::new("python3")
        .arg(repo_root().join("integration/chart/check_metrics_helper_chart.py"))
        .arg("--emit")
        .arg(&out_path)
        .output()
        .map_err(ChartError::Spawn)?;
    if !out.status.success() {
        return Err(ChartError::Render(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    std::fs::read_to_string(&out_path)
        .map_err(|e| ChartError::Render(format!("{}: {e}", out_path.display())))
}

/// charts/cni-metrics-helper rendered with `values` into namespace kube-system (release
/// `cni-metrics-helper`), as one multi-document YAML (no linting: see
/// [`render_metrics_helper_chart`] for the checked default rendering).
pub fn render_metrics_helper_chart_with(values: &Value) -> Result<String, ChartError> {
    render(
        &repo_root().join("charts/cni-metrics-helper"),
        "cni-metrics-helper",
        values,
    )
}

/// The rendered documents of `kind` (e.g. `ClusterRole`), parsed.
pub fn documents_of_kind(rendered: &str, kind: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(rendered)
        .filter_map(|d| serde::Deserialize::deserialize(d).ok())
        .filter(|v: &Value| v.get("kind").and_then(Value::as_str) == Some(kind))
        .collect()
}
