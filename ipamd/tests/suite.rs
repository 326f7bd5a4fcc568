//! ipamd's integration tests, one module per file of `ipamd/tests/`, linked into one test
//! binary (docs/testing.md, "One build"): as separate binaries each linked the dependency graph
//! again. The runner (`integration/run-tests.py`) still runs each module as its own job and
//! process (`ipamd/<module>`). Must not: hold tests of its own; a new suite is a new file here
//! and a `mod` line below.

/// Shared fixtures (a movable clock, an in-process ipamd on a real socket, a gRPC client).
mod common;

mod add_cancel;
mod add_wait;
mod checkpoint_compat;
mod dual_stack;
mod kube_cluster;
mod module_layering;
mod multi_nic;
mod no_detached_spawn;
mod property;
mod release_features;
mod restart_cooldown;
mod rpc_socket;
mod sigkill;
// (`simulation/` holds its submodules, so the file is named explicitly.)
#[path = "simulation.rs"]
mod simulation;
mod socket_handover;
mod v6_restart_safety;
