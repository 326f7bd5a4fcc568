//! kubesim's integration tests, one module per file of `integration/kubesim/tests/`, linked into one test
//! binary (docs/testing.md, "One test binary per package"): as separate binaries each linked the
//! dependency graph again. The runner (`integration/run-tests.py`) still runs each module as its
//! own job and process (`kubesim/<module>`). Must not: hold tests of its own; a new suite is a new
//! file here and a `mod` line below.

/// Fixtures shared by the suites below.
mod common;

mod api_semantics;
mod cli;
mod real_clients;
