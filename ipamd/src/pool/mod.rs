//! The warm pool's executor: the pool manager, the reconciler and their loop, the host port for
//! ENIs, custom networking's placement of new ENIs. The pure decisions and the EC2-shaped port
//! they execute live in the `ipam-core` crate (re-exported here as `policy`, `reconcile_plan`,
//! `ec2_port`; the EC2 adapter, `aws`, implements the port). Executed by
//! `crate::pool::run`. Must not: know gRPC/HTTP or an adapter, do I/O (but through the
//! provider port). `tests` drives the manager and reconciler against the fake EC2.

pub use ipam_core::pool::{ec2_port, policy, reconcile_plan};

pub mod adaptive;
pub mod host_port;
pub mod manager;
pub mod placement;
pub mod reconciler;
pub mod run;
#[cfg(test)]
mod tests;

use crate::config::Config;

/// Pool targets from config and instance limits.
#[must_use]
pub fn targets(config: &Config, limits: ec2_port::InstanceLimits) -> policy::Targets {
    let max_enis = config
        .pool
        .max_eni
        .map_or(limits.max_enis, |m| m.min(limits.max_enis));
    policy::Targets {
        warm_eni: config.pool.warm_eni_target,
        warm_ip: config.pool.warm_ip_target,
        minimum_ip: config.pool.minimum_ip_target,
        warm_prefix: config.pool.warm_prefix_target,
        prefix_delegation: config.pool.enable_prefix_delegation,
        max_enis,
        cidrs_per_eni: limits.ipv4_per_eni.saturating_sub(1),
        max_pods: config.pool.max_pods,
    }
}

/// The network cards other than 0 that serve pods: with `ENABLE_MULTI_NIC` in an IPv4
/// cluster, every card of the instance type but those holding only EFA ENIs (upstream
/// `markUnmanagedNetworkCards`); none otherwise (upstream marks every card but 0 unmanaged).
#[must_use]
pub fn serving_cards(
    config: &Config,
    limits: ec2_port::InstanceLimits,
    enis: &[ec2_port::AttachedEni],
) -> Vec<u32> {
    if !config.aws.enable_multi_nic || config.family != crate::config::AddressFamily::V4 {
        return Vec::new();
    }
    (1..limits.network_cards)
        .filter(|card| {
            let on: Vec<_> = enis.iter().filter(|e| e.network_card == *card).collect();
            let efa_only = on.iter().any(|e| e.is_efa) && on.iter().all(|e| e.is_efa || e.is_excluded);
            if efa_only {
                tracing::info!(card, "network card holds only EFA ENIs: not used for pods (upstream markUnmanagedNetworkCards)");
            }
            !efa_only
        })
        .collect()
}
