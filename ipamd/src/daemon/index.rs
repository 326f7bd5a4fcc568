//! The index opened at start: the instance's limits and the node's ENIs described, prefix
//! delegation's fallback, every serving card's pool restored from its checkpoint and the host's
//! evidence, IPv6 mode's /80, stale pod rules pruned before the socket serves. Must not: start
//! tasks, serve.

use std::sync::Arc;

use anyhow::Context as _;

use crate::config::{self, Config};
use crate::datastore;
use crate::datastore::checkpoint::FileCheckpoint;
use crate::ipam::{self, Ipam, IpamSettings, RestoreOutcome, SystemClock};
use crate::pool::ec2_port::{EniProvider, InstanceLimits};
use crate::{host, metrics, pool, reclaim};

use super::Startup;

/// What [`open`] made.
#[derive(Debug)]
pub struct Opened {
    /// The node's addresses, restored.
    pub ipam: Arc<Ipam>,
    /// The instance type's limits.
    pub limits: InstanceLimits,
    /// The node namespace's host networking, when netlink could be reached.
    pub host: Option<Arc<host::HostNetwork>>,
}

/// Opens the index on `provider` (see the module header); `config`'s prefix delegation is
/// turned off when the instance type has none (IPv4).
pub async fn open<P: EniProvider>(
    config: &mut Config,
    provider: &P,
    metrics: &Arc<metrics::Metrics>,
    startup: Startup,
    not_ready: &[String],
    os_tables: Vec<(String, u32)>,
) -> anyhow::Result<Opened> {
    for w in &config.warnings {
        tracing::warn!(variable = w.var, kind = w.kind.as_str(), "CONFIG: {w}");
        metrics.config_warning(w.var, w.kind.as_str());
    }
    let limits = provider
        .instance_limits()
        .await
        .context("instance limits")?;
    let described = pool::ec2_port::NodeDescription::describe(provider)
        .await
        .context("node init: describe the node's ENIs")?;
    metrics.startup_phase("ec2_describe");
    // Prefix delegation on a type without it: IPv4 falls back to secondary IPs, loudly; IPv6 mode
    // cannot start.
    let requested = config.pool.enable_prefix_delegation;
    config.pool.enable_prefix_delegation = pool::policy::prefix_delegation_on(
        requested,
        config.family.is_v6_only(),
        limits.prefix_delegation,
        &described.network.instance_type,
    )?;
    if requested && !config.pool.enable_prefix_delegation {
        tracing::warn!(
            "Prefix delegation is not supported on non-nitro instance {} hence falling back to default (secondary IP) mode",
            described.network.instance_type
        );
        metrics.config_warning(
            "ENABLE_PREFIX_DELEGATION",
            config::WarningKind::Fallback.as_str(),
        );
    }
    let targets = crate::pool::targets(config, limits);
    let per_eni = if targets.prefix_delegation {
        targets.cidrs_per_eni * pool::policy::PREFIX_SIZE
    } else {
        targets.cidrs_per_eni
    };
    metrics.set_limits(targets.max_enis, targets.max_enis * per_eni);
    let settings = IpamSettings {
        targets,
        add_wait_timeout: config.pool.add_wait_timeout,
        busy_pool_wait: config.pool.busy_pool_wait,
        veth_prefix: config.node.veth_prefix.clone(),
        provisioning: !config.aws.disable_network_resource_provisioning,
    };
    // One pool per serving card, card 0 first, each with its checkpoint file (`ipam.json`,
    // `ipam-nic-N.json`).
    let pools: Vec<(u32, Box<dyn datastore::checkpoint::Checkpoint>)> = std::iter::once(0)
        .chain(crate::pool::serving_cards(config, limits, &described.enis))
        .map(|card| {
            let path = ipam::pool_checkpoint_path(&config.node.backing_store, card);
            let c: Box<dyn datastore::checkpoint::Checkpoint> = Box::new(FileCheckpoint::new(path));
            (card, c)
        })
        .collect();
    let host_pods = host::pod_evidence()
        .await
        .map_err(|e| -> ipam::HostUnreadable { Box::new(e) });
    let (ipam, outcomes) = Ipam::start_pools(
        described,
        settings,
        config.pool.ip_cooldown_period,
        pools,
        move || host_pods,
        Arc::new(SystemClock),
        metrics.clone(),
    )
    .context("node init")?;
    ipam.index.hold_back_host(not_ready);
    for (eni, table) in os_tables {
        ipam.index.set_eni_table(&eni, Some(table));
    }
    // Startup failures end the process before the metrics server runs, so only successes are
    // ever observable: they are the only ones recorded.
    metrics.node_initialization(true, startup.started.elapsed().as_secs_f64());
    for (card, outcome) in &outcomes {
        let card = *card;
        if let RestoreOutcome::Restored { pending, .. } = outcome {
            metrics
                .unrecovered_checkpoint_entries
                .add(u64::try_from(*pending).unwrap_or(u64::MAX));
        }
        let path = ipam::pool_checkpoint_path(&config.node.backing_store, card);
        match outcome {
            RestoreOutcome::RecoveredFromHost { error, recovered } => {
                tracing::error!(card, %error, recovered, "CHECKPOINT UNREADABLE: assignments rebuilt from host routes; unreadable file replaced");
            }
            RestoreOutcome::MissingRecoveredFromHost { recovered } => {
                tracing::error!(card, recovered, path = %path.display(), "CHECKPOINT MISSING but pods are wired on this host: their addresses were rebuilt from host routes and rules");
            }
            RestoreOutcome::Restored { from_host, .. } if *from_host > 0 => {
                tracing::error!(card, outcome = ?outcome, "checkpoint lacked addresses pods use on this host: recovered from host routes and rules");
            }
            other => tracing::info!(card, outcome = ?other, "checkpoint restored"),
        }
    }
    let ipam = Arc::new(ipam);
    if config.family.is_v6_only() {
        // IPv6 mode: the primary ENI's /80, delegated by EC2 now if it has none, serves every pod;
        // no warm pool.
        let prefix = pool::run::init_ipv6_mode(&ipam, provider)
            .await
            .context("IPv6 prefix of the primary ENI")?;
        tracing::info!(eni = %prefix.eni_id, prefix = %prefix.net, "IPv6 mode: pods get /128s of the primary ENI's prefix");
    }
    // Pod rules no pod holds (a teardown that failed, a pod gone while ipamd was away) would
    // shadow the next pod given that address: removed before the socket serves, and then by
    // the reclaim loop.
    let pod_rules = match host::HostNetwork::for_current_netns(host::BackendChoice::Auto).await {
        Ok(h) => Some(Arc::new(h)),
        Err(e) => {
            tracing::warn!(error = %e, "host netlink unavailable: stale pod rules are not pruned");
            None
        }
    };
    if let Some(h) = &pod_rules {
        match reclaim::prune_stale_pod_rules(&ipam, h.as_ref()).await {
            Ok(s) if !s.is_empty() => {
                tracing::warn!(addresses = ?s, "stale pod rules (no pod holds the address) removed at start");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "stale pod rules not pruned at start"),
        }
    }
    Ok(Opened {
        ipam,
        limits,
        host: pod_rules,
    })
}

/// The index's free IPv4 addresses of every card, as the conntrack task's background walks read
/// them (`flows::FreeAddresses`).
pub fn free_addresses(ipam: &Arc<Ipam>) -> crate::flows::FreeAddresses {
    let ipam = ipam.clone();
    Arc::new(move || {
        let mut free = Vec::new();
        for card in ipam.index.cards() {
            ipam.index.read_card(card, |ds| {
                for eni in ds.enis().values() {
                    for cidr in eni.cidrs.values().filter(|c| !c.gone) {
                        free.extend(cidr.slots.iter().filter_map(|(a, slot)| {
                            matches!(slot, crate::datastore::Slot::Free { .. })
                                .then_some(std::net::IpAddr::V4(*a))
                        }));
                    }
                }
            });
        }
        free
    })
}
