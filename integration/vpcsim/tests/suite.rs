//! vpcsim's integration tests, one module per file of `integration/vpcsim/tests/`, linked into one test
//! binary (docs/testing.md, "One test binary per package"): as separate binaries each linked the
//! dependency graph again. The runner (`integration/run-tests.py`) still runs each module as its
//! own job and process (`vpcsim/<module>`). Must not: hold tests of its own; a new suite is a new
//! file here and a `mod` line below.

/// Fixtures shared by the suites below.
mod common;

mod ec2_api;
mod ec2_moto_crosscheck;
mod ec2_sgp;
mod fabric_cli;
mod fabric_ipv6;
mod fabric_sdk;
mod fabric_vpc;
mod state_invariants;
mod subnet_discovery_api;
