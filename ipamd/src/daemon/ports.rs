//! The ports the daemon runs on, picked from `Config`: the EC2 provider with host networking
//! (node init first, and the tasks of the ports themselves), or the test-only in-memory provider
//! without. Must not: decide pool policy, restore the index.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::pool::ec2_port::EniProvider as _;
use crate::task::Task;
use crate::{k8s, metrics, node_init};

/// The ports the daemon runs on, as the daemon picked them.
#[derive(Debug)]
pub struct Ports<P, H> {
    /// The EC2 port.
    pub provider: P,
    /// Custom networking's inputs: the pool manager places new ENIs by the node's ENIConfig.
    pub custom_network: Option<k8s::CustomNetwork>,
    /// The host port for ENIs.
    pub host: H,
    /// ENIs whose host set-up failed at node init: their addresses are held back until the
    /// pool loop's retry succeeds.
    pub not_ready: Vec<String>,
    /// ENIs the node's OS already routes by a table of its own, found at their host set-up:
    /// their assignments answer that table.
    pub os_tables: Vec<(String, u32)>,
    /// Long-running work of the ports (the leaked-ENI clean-up, the VPC CIDR follower),
    /// supervised with the daemon's own tasks.
    pub tasks: Vec<Task>,
    /// `VPCv4CIDRs` as the VPC CIDR follower keeps them (EC2 nodes in IPv4 mode).
    pub vpc_v4_follow: Option<tokio::sync::watch::Receiver<Vec<String>>>,
    /// The instance type takes a trunk ENI (security groups for pods keep a slot for it).
    pub trunking_compatible: bool,
}

/// The ports of an EC2 node.
pub type Ec2Ports = Ports<
    crate::aws::provider::Ec2Provider<crate::aws::sdk::SdkEc2, crate::aws::sdk::SdkImds>,
    Arc<node_init::HostEnis>,
>;

/// An EC2 node's ports: node init (IMDS, the primary ENI's host networking, the node's ENIs),
/// the leaked-ENI clean-up, the security-group and VPC CIDR followers.
pub async fn ec2(
    config: &Config,
    cluster: Option<&k8s::Cluster>,
    metrics: &Arc<metrics::Metrics>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Ec2Ports> {
    let node = node_init::init_ec2(config, cluster, metrics).await?;
    let mut tasks: Vec<Task> = Vec::new();
    // No leaked-ENI clean-up in IPv6 mode.
    if !config.aws.disable_leaked_eni_cleanup
        && !config.aws.disable_network_resource_provisioning
        && !config.family.is_v6_only()
    {
        let loop_ = node_init::leaked_eni_loop(
            node.provider.clone(),
            config.aws.leaked_eni_period,
            shutdown.child_token(),
        );
        tasks.push(Task::until_stopped("leaked-ENI clean-up", async move {
            loop_.await;
            Ok(())
        }));
    }
    if let Some(follower) = node.group_follower {
        let run = follower.run(
            node.provider.clone(),
            config.aws.security_group_check,
            shutdown.child_token(),
        );
        tasks.push(Task::until_stopped("security-group follower", async move {
            run.await;
            Ok(())
        }));
    }
    let mut vpc_v4_follow = None;
    if let Some(follower) = node.cidr_follower {
        // The VPC's blocks followed while ipamd runs (node_init::CidrFollower).
        let initial = node
            .provider
            .node_network()
            .await
            .map(|n| follower.reply_cidrs(&n.vpc_v4_cidrs))
            .unwrap_or_default();
        let (tx, rx) = tokio::sync::watch::channel(initial);
        vpc_v4_follow = Some(rx);
        let run = follower.run(
            node.provider.clone(),
            config.pool.vpc_cidr_check,
            tx,
            shutdown.child_token(),
        );
        tasks.push(Task::until_stopped("VPC CIDR follower", async move {
            run.await;
            Ok(())
        }));
    }
    Ok(Ports {
        provider: node.provider,
        custom_network: node.custom_network,
        host: node.host,
        not_ready: node.not_ready,
        os_tables: node.os_tables,
        tasks,
        vpc_v4_follow,
        trunking_compatible: node.trunking_compatible,
    })
}

/// The test-only in-memory provider's ports (no host networking, no tasks).
#[cfg(feature = "memory-provider")]
pub fn memory(
    config: &Config,
    spec: crate::config::MemoryProviderSpec,
) -> anyhow::Result<Ports<crate::aws::memory::MemoryProvider, crate::pool::host_port::NoHost>> {
    tracing::warn!("using the in-memory ENI provider: TEST/DEMO ONLY, addresses are invented");
    anyhow::ensure!(
        !config.kube.custom_network_cfg,
        "the in-memory ENI provider has no ENIConfig subnets: custom networking needs the EC2 provider"
    );
    Ok(Ports {
        provider: crate::aws::memory::MemoryProvider::from_spec(spec),
        custom_network: None,
        host: crate::pool::host_port::NoHost,
        not_ready: Vec::new(),
        os_tables: Vec::new(),
        tasks: Vec::new(),
        vpc_v4_follow: None,
        trunking_compatible: false,
    })
}
