//! cni-metrics-helper's integration tests, one module per file of `cni-metrics-helper/tests/`, linked into one test
//! binary (docs/testing.md, "One test binary per package"): as separate binaries each linked the
//! dependency graph again. The runner (`integration/run-tests.py`) still runs each module as its
//! own job and process (`cni-metrics-helper/<module>`). Must not: hold tests of its own; a new suite is a new
//! file here and a `mod` line below.

mod inventory_configmap_e2e;
mod inventory_e2e;
mod metrics_helper_e2e;
mod real_ipamd_e2e;
