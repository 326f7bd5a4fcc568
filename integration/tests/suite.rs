//! The integration package's test suites, one module per file of `integration/tests/`, linked
//! into one test binary (docs/testing.md, "One build"): each of them used to be its own binary,
//! and every one linked the whole dependency graph again (~3.5 s of lld each, 54 times). The
//! runner (`integration/run-tests.py`) still runs each module as its own job and process
//! (`integration/<module>`), so a module's tests share a process only with each other, as before.
//! Must not: hold tests of its own; a new suite is a new file here and a `mod` line below.

/// Shared by the security-groups-for-pods VM suites (`sgp_branch_vm`, `sgp_fabric_vm`).
mod sgp_common;

mod aws_moto;
mod aws_vpcsim;
mod chart;
mod checkpoint_loss;
mod churn_replay;
mod code_layout;
mod conntrack_ledger;
mod conntrack_reuse;
mod e2e_add_failures;
mod e2e_address_capacity;
mod e2e_custom_networking;
mod e2e_dual_stack_eni;
mod e2e_faults;
mod e2e_ipv6;
mod e2e_ipv6_ipamd;
mod e2e_kube_fabric;
mod e2e_multi_nic;
mod e2e_multi_nic_restart;
mod e2e_non_nitro;
mod e2e_security_groups;
mod e2e_sgp_control;
mod e2e_startup_taint;
mod e2e_subnet_discovery;
mod e2e_unschedulable;
mod e2e_vpc;
mod e2e_vpc_cidrs;
mod ec2_parity;
mod fleet;
mod host_network;
mod image;
mod ipamd_plugin_e2e;
mod kubelet_node;
mod migration;
mod network_policy;
mod nft_connmark;
mod npa_standin;
mod observability;
mod plugin_dataplane;
mod plugin_del_ownership;
mod plugin_egress;
mod plugin_kernel;
mod plugin_podman;
mod plugin_undo;
mod reclaim_dual_stack;
mod restart_mid_shrink;
mod rolling_update;
mod sgp_branch_vm;
mod sgp_fabric_vm;
mod sgp_ipamd_vm;
mod silent_difference_audit;
mod stale_pod_rules;
mod static_plugins;
mod static_resolver;
mod support_collector;
mod test_targets;
