//! Shared by kubesim's test files: repository paths and the chart rendered by real Helm (both
//! from the library's `kubesim::chart`).
#![allow(dead_code, clippy::tests_outside_test_module)]

use serde_json::Value;

#[allow(unused_imports)]
pub use kubesim::chart::{eniconfig_crd, repo_root};

/// charts/aws-vpc-cni rendered by real Helm; panics with the reason when it cannot be.
pub fn render_chart(values: &Value) -> String {
    kubesim::chart::render_chart(values).unwrap_or_else(|e| panic!("{e}"))
}
