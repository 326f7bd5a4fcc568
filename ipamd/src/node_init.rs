//! Node init for real EC2 (or the simulated VPC), as helpers the composition root (`lib.rs`)
//! calls: build the IMDS and EC2 clients, discover the instance and its ENIs (IMDS plus ONE
//! DescribeNetworkInterfaces), resolve instance limits, set up node and ENI host networking,
//! tag ENIs that miss ipamd's tags; the hourly leaked-ENI clean-up loop; `HostEnis`, the host
//! port of the pool loop over `host::HostNetwork`. Must not: wire the daemon (spawn its loops,
//! serve), decide pool policy, parse env (everything comes from `Config`).

use std::str::FromStr as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use dataplane::MacAddr;
use tokio_util::sync::CancellationToken;

use crate::aws::ec2::Ec2;
use crate::aws::imds::Imds;
use crate::aws::metrics::AwsMetrics;
use crate::aws::provider::{Ec2Provider, ProviderSettings};
use crate::aws::sdk::{self, AwsSettings, SdkEc2, SdkImds};
use crate::aws::throttle::TokenBucket;
use crate::config::Config;
use crate::host::{EniPlanError, HostError, HostNetwork, NodeSpec, RpFilter};
use crate::pool::ec2_port::{AttachedEni, EniProvider, NodeNetwork, ProviderError};
use crate::pool::host_port::{EniHost, EniHostError};

/// Leaked-ENI clean-up period: hourly.
pub const LEAKED_ENI_PERIOD: Duration = Duration::from_secs(3600);
/// Upper bound of the random delay before the first clean-up (0–300 s).
pub const LEAKED_ENI_START_JITTER: Duration = Duration::from_secs(300);

/// How long a set-up waits for a new ENI's link before it reports [`EniHostError::NoLink`]
/// (the ENI is then registered not host-ready; the pool loop retries at the next link
/// announcement).
pub const LINK_WAIT: Duration = Duration::from_secs(20);
/// While waiting on link announcements, the host is also looked at this often (a missed
/// announcement, e.g. a full socket buffer, costs at most this).
pub const LINK_RECHECK: Duration = Duration::from_secs(2);

/// ENI host networking over [`HostNetwork`] with the configured MTU. Waits for a new ENI's
/// link on the kernel's link announcements ([`dataplane::LinkEvents`]); polls with back-off
/// only when they are not available.
#[derive(Debug)]
pub struct HostEnis {
    host: Arc<HostNetwork>,
    mtu: u32,
    ipv6_routes: bool,
    links: Option<dataplane::LinkEvents>,
    link_wait: Duration,
}

impl HostEnis {
    /// ENIs of `host` get `mtu`; with `ipv6_routes` (pods get IPv6: dual-stack or IPv6 mode)
    /// their tables also route IPv6 via the VPC router.
    pub fn new(host: Arc<HostNetwork>, mtu: u32, ipv6_routes: bool) -> Self {
        Self {
            host,
            mtu,
            ipv6_routes,
            links: None,
            link_wait: LINK_WAIT,
        }
    }

    /// Waits for links on `links` (this namespace's announcements) instead of polling.
    #[must_use]
    pub fn with_link_events(self, links: dataplane::LinkEvents) -> Self {
        Self {
            links: Some(links),
            ..self
        }
    }

    /// Gives up on a missing link after `wait` (tests; [`LINK_WAIT`] by default).
    #[must_use]
    pub fn with_link_wait(self, wait: Duration) -> Self {
        Self {
            link_wait: wait,
            ..self
        }
    }

    fn spec(&self, eni: &AttachedEni) -> Result<crate::host::EniSpec, EniHostError> {
        Ok(crate::host::EniSpec {
            ipv6_routes: self.ipv6_routes,
            ..host_spec(eni)?
        })
    }
}

fn host_spec(eni: &AttachedEni) -> Result<crate::host::EniSpec, EniHostError> {
    Ok(crate::host::EniSpec {
        mac: MacAddr::from_str(&eni.mac).map_err(|_| EniHostError::BadMac(eni.mac.clone()))?,
        device_number: eni.device_number,
        network_card: eni.network_card,
        primary_ip: eni.primary_ip,
        subnet: eni.subnet,
        ipv6_routes: false,
    })
}

impl EniHost for HostEnis {
    async fn setup(&self, eni: &AttachedEni) -> Result<Option<u32>, EniHostError> {
        // An ENI in an excluded subnet keeps its host networking: its pods keep their addresses (it
        // was set up before its subnet was excluded).
        if eni.is_primary || eni.is_efa || (eni.is_excluded && !eni.subnet_excluded) {
            return Ok(None);
        }
        let spec = self.spec(eni)?;
        let deadline = tokio::time::Instant::now() + self.link_wait;
        let mut links = self.links.as_ref().map(dataplane::LinkEvents::subscribe);
        let mut delay = Duration::from_millis(200);
        loop {
            // announcements from here on wake the wait below (none is missed between the
            // look at the host and the wait)
            if let Some(rx) = links.as_mut() {
                rx.borrow_and_update();
            }
            // A trunk (security groups for pods): routes, no primary-IP rule.
            let done = if eni.is_trunk {
                self.host.setup_trunk_eni(&spec, self.mtu).await
            } else {
                self.host.setup_eni(&spec, self.mtu).await
            };
            match done {
                Ok(applied) => {
                    if let Some(table) = applied.os_table {
                        tracing::info!(eni = %eni.id, table, "the node's OS routes this eni by its own table: its routes and pods' rules use it, no second rule is added (upstream getRouteTableNumberForENI)");
                    }
                    return Ok(applied.os_table);
                }
                Err(HostError::Eni(EniPlanError::NoLink(_))) => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        return Err(EniHostError::NoLink(eni.id.clone()));
                    }
                    match links.as_mut() {
                        Some(rx) => {
                            let _ =
                                tokio::time::timeout(left.min(LINK_RECHECK), rx.changed()).await;
                        }
                        None => {
                            tokio::time::sleep(delay.min(left)).await;
                            delay = (delay * 2).min(Duration::from_secs(3));
                        }
                    }
                }
                Err(HostError::Eni(cause @ EniPlanError::Ipv6Disabled { .. })) => {
                    return Err(EniHostError::KernelSetting {
                        eni: eni.id.clone(),
                        cause,
                    });
                }
                Err(e) => return Err(EniHostError::Kernel(e.to_string())),
            }
        }
    }

    fn link_generation(&self) -> u64 {
        self.links
            .as_ref()
            .map_or(0, dataplane::LinkEvents::generation)
    }

    async fn links_changed(&self) {
        match &self.links {
            Some(l) => {
                let mut rx = l.subscribe();
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }

    async fn teardown(&self, eni: &AttachedEni) -> Result<(), EniHostError> {
        if eni.is_primary {
            return Ok(());
        }
        self.host
            .teardown_eni(&self.spec(eni)?)
            .await
            .map(drop)
            .map_err(|e| EniHostError::Kernel(e.to_string()))
    }
}

/// The AWS settings the config gives: `AWS_EC2_ENDPOINT`, `AWS_EC2_METADATA_SERVICE_ENDPOINT`
/// (the SDK's, also read by it; here so IMDS knows whether it needs TLS), `HTTP_TIMEOUT` and
/// `VPC_CNI_VERSION` (User-Agent); everything else (`AWS_ENDPOINT_URL_EC2`,
/// `AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE`, `AWS_REGION`, credentials) is read by the AWS SDK's
/// own environment loader.
pub fn aws_settings(config: &Config) -> AwsSettings {
    AwsSettings {
        ec2_endpoint: config.aws.ec2_endpoint.clone(),
        imds_endpoint: config.aws.imds_endpoint.clone(),
        version: config.aws.vpc_cni_version.clone(),
        http_timeout: Some(config.aws.http_timeout),
        ..AwsSettings::default()
    }
}

/// Node-wide host networking inputs from config and the primary ENI.
pub fn node_spec(
    config: &Config,
    primary_mac: &str,
    node: &NodeNetwork,
) -> anyhow::Result<NodeSpec> {
    Ok(NodeSpec {
        primary_mac: MacAddr::from_str(primary_mac)
            .map_err(|_| anyhow::anyhow!("bad primary mac {primary_mac:?}"))?,
        primary_ip: node.primary_ip.context("primary ip unknown")?,
        mtu: config.node.eni_mtu,
        vpc_cidrs: node.vpc_v4_cidrs.clone(),
        exclude_snat_cidrs: config.snat.exclude_snat_cidrs.clone(),
        external_snat: config.snat.external_snat,
        randomize_snat: config.snat.randomize_snat,
        node_port_support: config.snat.node_port_support,
        connmark: config.snat.connmark,
        veth_prefix: config.node.veth_prefix.clone(),
        external_service_cidrs: config.snat.external_service_cidrs.clone(),
        ipv6: config.family.is_v6_only(),
        block_v6_egress_range: !config.family.is_v6_only() && config.node.enable_v6_egress,
    })
}

/// EC2 side of node init: the instance's ENIs (IMDS + ONE Describe), limits, and (with
/// `provisioning`) ipamd's tags on managed ENIs that lack them or carry other values. Returns
/// the ENIs.
pub async fn discover<E: Ec2 + 'static, I: Imds + 'static>(
    provider: &Ec2Provider<E, I>,
    provisioning: bool,
) -> Result<Vec<AttachedEni>, ProviderError> {
    let identity = provider.identity().await?;
    let limits = provider.aws_limits().await?;
    let enis = provider.prime().await?;
    let tagged = provider.tag_managed(&enis, provisioning).await?;
    tracing::info!(
        instance = %identity.instance_id,
        instance_type = %identity.instance_type,
        max_enis = limits.max_enis,
        ipv4_per_eni = limits.ipv4_per_eni,
        enis = enis.len(),
        tagged,
        "node discovered"
    );
    Ok(enis)
}

/// Leaked-ENI clean-up every `period` (hourly) after a random start delay (0–300 s for an hour,
/// proportionally less for a shorter test period); stops at `shutdown`.
pub async fn leaked_eni_loop<E: Ec2 + 'static, I: Imds + 'static>(
    provider: Ec2Provider<E, I>,
    period: Duration,
    shutdown: CancellationToken,
) {
    let jitter = LEAKED_ENI_START_JITTER
        .mul_f64((period.as_secs_f64() / LEAKED_ENI_PERIOD.as_secs_f64()).min(1.0));
    let first = jitter.mul_f64(rand::random::<f64>());
    let mut wait = first;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        match provider.cleanup_leaked(SystemTime::now()).await {
            Ok(deleted) if !deleted.is_empty() => tracing::info!(?deleted, "leaked enis deleted"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "leaked-eni clean-up failed"),
        }
        wait = period;
    }
}

/// With provisioning on, at node init and then every `period`: the primary ENI's security groups
/// followed onto every ENI ipamd manages ([`Ec2Provider::check_security_groups`]). `applied` is
/// what the last check saw.
#[derive(Debug)]
pub struct GroupFollower {
    applied: std::collections::BTreeSet<String>,
    multi_nic: bool,
    /// Off under custom networking (changes are logged only).
    apply: bool,
}

impl GroupFollower {
    /// The first check (at node init; an IMDS failure is fatal there).
    pub async fn start<E: Ec2 + 'static, I: Imds + 'static>(
        provider: &Ec2Provider<E, I>,
        multi_nic: bool,
        apply: bool,
    ) -> Result<Self, ProviderError> {
        let mut follower = Self {
            applied: std::collections::BTreeSet::new(),
            multi_nic,
            apply,
        };
        follower.check(provider).await?;
        Ok(follower)
    }

    async fn check<E: Ec2 + 'static, I: Imds + 'static>(
        &mut self,
        provider: &Ec2Provider<E, I>,
    ) -> Result<(), ProviderError> {
        let check = provider
            .check_security_groups(&mut self.applied, self.multi_nic, self.apply)
            .await?;
        if !check.updated.is_empty() || !check.failed.is_empty() {
            tracing::info!(security_groups = ?self.applied, updated = ?check.updated, failed = ?check.failed, "node security groups applied to its enis");
        }
        Ok(())
    }

    /// Checks every `period` until `shutdown`; a failed read is retried at the next period.
    pub async fn run<E: Ec2 + 'static, I: Imds + 'static>(
        mut self,
        provider: Ec2Provider<E, I>,
        period: Duration,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            if let Err(e) = self.check(&provider).await {
                tracing::warn!(error = %e, "node security groups not read again; enis unchanged");
            }
        }
    }
}

/// What EC2 node init hands the composition root.
#[derive(Debug)]
pub struct Ec2Node {
    /// The EC2 provider (with custom networking when configured).
    pub provider: Ec2Provider<SdkEc2, SdkImds>,
    /// Custom networking's inputs, for the pool manager's placement of new ENIs.
    pub custom_network: Option<crate::k8s::CustomNetwork>,
    /// ENI host networking.
    pub host: Arc<HostEnis>,
    /// ENIs whose host set-up failed: their addresses are held back until the pool loop's
    /// retry succeeds.
    pub not_ready: Vec<String>,
    /// ENIs the node's OS already routes by a table of its own (their routes and pods' rules
    /// use it; `EniHost::setup`).
    pub os_tables: Vec<(String, u32)>,
    /// What the VPC CIDR follower re-applies when the VPC's CIDR blocks change (IPv4 nodes).
    pub cidr_follower: Option<CidrFollower>,
    /// The instance type takes a trunk ENI.
    pub trunking_compatible: bool,
    /// Follows the node's security groups onto its ENIs (provisioning on).
    pub group_follower: Option<GroupFollower>,
}

/// `VPCv4CIDRs` of AddNetwork replies: the VPC's IPv4 blocks, then
/// `AWS_VPC_K8S_CNI_EXCLUDE_SNAT_CIDRS` unless SNAT is external (`AWS_VPC_K8S_CNI_EXTERNALSNAT`:
/// the exclusions then mean nothing to the plugin).
#[must_use]
pub fn reply_v4_cidrs(
    vpc: &[ipnet::Ipv4Net],
    exclude_snat: &[ipnet::Ipv4Net],
    external_snat: bool,
) -> Vec<String> {
    let exclude = if external_snat { &[][..] } else { exclude_snat };
    vpc.iter().chain(exclude).map(ToString::to_string).collect()
}

/// Every 30 s after node init the VPC's IPv4 CIDR blocks are read again from IMDS; when they
/// changed (a block associated with or removed from the VPC while pods run), the node's host
/// networking is converged again with the new list (SNAT chain exemptions and the connmark's VPC
/// returns, either backend) and AddNetwork replies carry the new `VPCv4CIDRs`. Without it, pods
/// would keep being SNATed towards a new block. Must not: change anything else of the node.
#[derive(Debug)]
pub struct CidrFollower {
    host: Arc<HostNetwork>,
    spec: NodeSpec,
}

impl CidrFollower {
    /// `VPCv4CIDRs` for `vpc` ([`reply_v4_cidrs`]).
    #[must_use]
    pub fn reply_cidrs(&self, vpc: &[ipnet::Ipv4Net]) -> Vec<String> {
        reply_v4_cidrs(vpc, &self.spec.exclude_snat_cidrs, self.spec.external_snat)
    }

    /// Runs every `period` until `shutdown`, publishing the reply list on `reply`.
    pub async fn run(
        mut self,
        provider: Ec2Provider<SdkEc2, SdkImds>,
        period: Duration,
        reply: tokio::sync::watch::Sender<Vec<String>>,
        shutdown: CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            let cidrs = match provider.current_vpc_cidrs().await {
                Ok(c) if !c.is_empty() => c,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "VPC CIDRs not read again; rules unchanged");
                    continue;
                }
            };
            if let Some(next) = self.apply(cidrs).await {
                reply.send_replace(next);
            }
        }
    }

    /// Converges the node with `cidrs` when they differ from the last applied; the reply list
    /// when they did. A failed convergence is retried at the next check.
    async fn apply(&mut self, cidrs: Vec<ipnet::Ipv4Net>) -> Option<Vec<String>> {
        if cidrs == self.spec.vpc_cidrs {
            return None;
        }
        let mut spec = self.spec.clone();
        spec.vpc_cidrs = cidrs;
        match self.host.setup_node(&spec).await {
            Ok(applied) => {
                tracing::info!(
                    from = ?self.spec.vpc_cidrs, to = ?spec.vpc_cidrs,
                    changes = applied.routing.len() + applied.iptables.len() + applied.nftables.len(),
                    "VPC CIDRs changed: SNAT and connmark rules updated"
                );
                let reply = self.reply_cidrs(&spec.vpc_cidrs);
                self.spec = spec;
                Some(reply)
            }
            Err(e) => {
                tracing::warn!(error = %e, to = ?spec.vpc_cidrs, "VPC CIDRs changed but the node's rules were not updated; retrying");
                None
            }
        }
    }
}

/// EC2 node init: clients, discovery, node host networking, then every ENI's host networking
/// (a failure is reported in `not_ready`, never fatal).
pub async fn init_ec2(
    config: &Config,
    cluster: Option<&crate::k8s::Cluster>,
    metrics: &Arc<crate::metrics::Metrics>,
) -> anyhow::Result<Ec2Node> {
    let settings = aws_settings(config);
    let http = sdk::http_client();
    let imds = SdkImds::new(&settings, http.clone()).context("imds client")?;
    let identity = imds.identity().await.context("imds identity")?;
    metrics.startup_phase("imds");
    let ec2 = SdkEc2::new(
        &settings,
        http,
        Some(identity.region.clone()),
        Arc::new(TokenBucket::default()),
        AwsMetrics::new(metrics.clone()),
    )
    .await;
    let ec2 = match cluster {
        Some(c) => ec2.with_unauthorized_hook(missing_iam_events(c.clone())),
        None => ec2,
    };
    let provider = Ec2Provider::new(
        Arc::new(ec2),
        Arc::new(imds),
        ProviderSettings {
            manage_untagged: config.aws.manage_untagged_eni,
            imds_only: config.aws.enable_imds_only_mode,
            subnet_discovery: config.aws.enable_subnet_discovery,
            ..ProviderSettings::upstream(
                config.aws.cluster_name.clone(),
                config.aws.additional_eni_tags.clone(),
            )
        },
    )
    .with_metrics(AwsMetrics::new(metrics.clone()));
    let custom_network = match (cluster, config.kube.custom_network_cfg) {
        (Some(c), true) => Some(crate::k8s::CustomNetwork {
            node: c.node(),
            eni_configs: c.eni_configs(),
            keys: config.kube.eni_config_keys.clone(),
            report: eni_config_refusals(c.clone(), metrics.clone()),
        }),
        _ => None,
    };
    let provider = provider.with_custom_networking(custom_network.is_some());
    let enis = discover(&provider, !config.aws.disable_network_resource_provisioning)
        .await
        .context("discover enis")?;
    if config.family.is_v6_only()
        && let Some(p) = enis.iter().find(|e| e.is_primary && e.subnet_excluded)
    {
        // A new ENI for the node's /80 when the primary ENI's subnet is excluded is not
        // implemented: refuse rather than hand out addresses from an excluded subnet.
        anyhow::bail!(
            "the primary eni {} is in subnet {} tagged kubernetes.io/role/cni=0: IPv6 mode with \
             an excluded primary eni is not supported (set ENABLE_SUBNET_DISCOVERY=false or \
             untag the subnet)",
            p.id,
            p.subnet_id
        );
    }
    // The security-group follower's first check: after the ENIs are known, before any is attached
    let group_follower = if config.aws.disable_network_resource_provisioning {
        None
    } else {
        Some(
            GroupFollower::start(
                &provider,
                config.aws.enable_multi_nic,
                !config.kube.custom_network_cfg,
            )
            .await
            .context("the primary eni's security groups")?,
        )
    };
    let node = provider.node_network().await.context("primary eni")?;

    let host = Arc::new(
        HostNetwork::for_current_netns(crate::host::BackendChoice::Auto)
            .await
            .context("host netlink")?,
    );
    let spec = node_spec(config, &identity.primary_mac, &node)?;
    let applied = host
        .setup_node(&spec)
        .await
        .context("node host networking")?;
    if config.kube.pod_eni == Some(crate::config::PodSgMode::Strict) {
        let family = if config.family.is_v6_only() {
            dataplane::Family::V6
        } else {
            dataplane::Family::V4
        };
        let moved = host
            .move_local_rule(family)
            .await
            .context("security groups for pods (strict): move the local rule")?;
        if !moved.routing.is_empty() {
            tracing::info!(
                "POD_SECURITY_GROUP_ENFORCING_MODE=strict: lookup local moved from priority 0 to 20"
            );
        }
    }
    let cidr_follower = (!config.family.is_v6_only()).then(|| CidrFollower {
        host: Arc::clone(&host),
        spec,
    });
    // The node set-up is where the pod connmark is reconciled: the nftables table `ip aws-cni` on a
    // node whose iptables is nf_tables, iptables `AWS-CONNMARK-CHAIN-0` on a legacy one
    // (docs/host-networking.md). A failed set-up ends ipamd before metrics serve. IPv6 mode
    // programs none but still reports the backend.
    if let Some(backend) = applied.connmark_backend {
        if config.family.is_v6_only() {
            metrics.connmark_backend_in_use(backend.label());
        } else {
            metrics.connmark_reconciled(backend.label(), true);
        }
    }
    tracing::info!(
        changes = applied.routing.len() + applied.iptables.len() + applied.nftables.len(),
        connmark = ?applied.connmark_backend.map(crate::host::ConnmarkBackend::label),
        rp_filter = applied.rp_filter.map(RpFilter::label),
        "node host networking converged"
    );
    report_rp_filter(applied.rp_filter, &identity.primary_mac, metrics, cluster);
    let host = HostEnis::new(host, config.node.eni_mtu, config.family.has_v6());
    // ENI links are waited for on the kernel's announcements (no polling give-up)
    let host = match dataplane::NetNs::current() {
        Ok(ns) => match ns.link_events().await {
            Ok(links) => host.with_link_events(links),
            Err(e) => {
                tracing::warn!(error = %e, "no link announcements: new ENI links are polled for");
                host
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "no link announcements: new ENI links are polled for");
            host
        }
    };
    let host = Arc::new(host);
    let mut not_ready = Vec::new();
    let mut os_tables = Vec::new();
    for eni in &enis {
        if eni.network_card != 0 && !config.aws.enable_multi_nic {
            // Without ENABLE_MULTI_NIC every card but 0 is unmanaged (its ENIs get no host
            // networking from ipamd).
            continue;
        }
        match host.setup(eni).await {
            Ok(Some(table)) => os_tables.push((eni.id.clone(), table)),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(eni = %eni.id, error = %e, "eni host networking failed; its addresses are held back and the pool loop retries");
                not_ready.push(eni.id.clone());
            }
        }
    }
    Ok(Ec2Node {
        provider,
        custom_network,
        host,
        not_ready,
        os_tables,
        cidr_follower,
        trunking_compatible: crate::aws::limits::is_trunking_compatible(&identity.instance_type),
        group_follower,
    })
}

/// Judges the primary interface's reverse-path filtering found at start. Strict (1) drops replies
/// to pods on secondary ENIs whose connections were SNATed to the primary IP: an ERROR line,
/// `awscni_rp_filter_strict 1` and a `StrictReversePathFilter` Warning on the aws-node pod. Not
/// fatal: pods on the primary ENI work on such a node, while a crash-looping ipamd would stop every
/// pod's network set-up; ipamd may not fix it itself (read-only sysctl tree), the init container
/// does. The event is queued for the cluster's event poster (node init does not wait for the API
/// server).
pub fn report_rp_filter(
    found: Option<RpFilter>,
    primary_mac: &str,
    metrics: &crate::metrics::Metrics,
    cluster: Option<&crate::k8s::Cluster>,
) {
    metrics.rp_filter(found == Some(RpFilter::Strict));
    if found != Some(RpFilter::Strict) {
        return;
    }
    let message = format!(
        "reverse-path filtering on the primary interface (mac {primary_mac}) is strict \
         (rp_filter 1 in net.ipv4.conf.all or the interface's own): replies to pods on \
         secondary ENIs will be dropped. The \
         privileged init container aws-vpc-cni-init sets it to 2 (loose), as upstream's does; \
         ipamd does not change kernel settings (its container has NET_ADMIN and NET_RAW and a \
         read-only sysctl tree). Check that the init container ran, or set \
         net.ipv4.conf.<primary>.rp_filter=2 on the node"
    );
    tracing::error!("{message}");
    if let Some(cluster) = cluster {
        let ev = crate::k8s::PodEvent {
            warning: true,
            reason: crate::k8s::REASON_RP_FILTER.into(),
            action: "NodeInit".into(),
            message,
        };
        cluster.queue_event(ev, "rp_filter event");
    }
}

/// A `MissingIAMPermissions` Warning on the aws-node pod for every EC2 call refused for lack of
/// permission (deduplicated by the cluster, queued for its event poster: the EC2 call never waits
/// for it).
pub fn missing_iam_events(cluster: crate::k8s::Cluster) -> crate::aws::sdk::UnauthorizedHook {
    crate::aws::sdk::UnauthorizedHook(Arc::new(move |api: &'static str| {
        let action = format!("ec2:{api}");
        let message = format!(
            "Unauthorized operation: failed to call {action} due to missing permissions. Please refer https://github.com/aws/amazon-vpc-cni-k8s/blob/master/docs/iam-policy.md to attach relevant policy to IAM role"
        );
        let ev = crate::k8s::PodEvent {
            warning: true,
            reason: crate::k8s::REASON_MISSING_IAM.into(),
            action,
            message,
        };
        cluster.queue_event(ev, "MissingIAMPermissions event");
    }))
}

/// Custom networking could not place an ENI: an ERROR line, `awscni_eniconfig_error_count`
/// and a Warning event on the aws-node pod (deduplicated, queued for the cluster's event
/// poster); nothing is created.
pub fn eni_config_refusals(
    cluster: crate::k8s::Cluster,
    metrics: Arc<crate::metrics::Metrics>,
) -> crate::k8s::RefusalReporter {
    Arc::new(move |r: &crate::k8s::PlacementRefusal| {
        tracing::error!(reason = r.kind(), "custom networking: no ENI created: {r}");
        metrics.eniconfig_error(r.kind());
        let ev = crate::k8s::PodEvent {
            warning: true,
            reason: crate::k8s::REASON_ENI_CONFIG.into(),
            action: "ec2:CreateNetworkInterface".into(),
            message: format!("custom networking: no ENI created: {r}"),
        };
        cluster.queue_event(ev, "ENIConfig event");
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39, upstream `rpc_handler.go` AddNetwork: the exclusions follow the VPC's blocks
    /// in `VPCv4CIDRs` only while ipamd SNATs; with external SNAT the list is the VPC's alone.
    #[test]
    fn reply_cidrs_carry_the_snat_exclusions_only_without_external_snat() {
        let n = |s: &str| s.parse::<ipnet::Ipv4Net>().unwrap();
        let vpc = [n("198.18.0.0/16")];
        let exclude = [n("10.0.0.0/8")];
        assert_eq!(
            reply_v4_cidrs(&vpc, &exclude, false),
            vec!["198.18.0.0/16", "10.0.0.0/8"]
        );
        assert_eq!(reply_v4_cidrs(&vpc, &exclude, true), vec!["198.18.0.0/16"]);
    }

    /// Strict filtering is reported (gauge 1; the ERROR line and the event need no test
    /// cluster to be decided), loose and off are not, and an unreadable value leaves 0.
    #[test]
    fn strict_rp_filter_is_reported_not_fatal() {
        let metrics = crate::metrics::Metrics::new();
        let gauge = |m: &crate::metrics::Metrics| m.rp_filter_strict.get([]).map(|s| s.value);
        report_rp_filter(Some(RpFilter::Strict), "02:00:00:00:00:01", &metrics, None);
        assert_eq!(gauge(&metrics), Some(1.0));
        for fine in [Some(RpFilter::Loose), Some(RpFilter::Off), None] {
            report_rp_filter(fine, "02:00:00:00:00:01", &metrics, None);
            assert_eq!(gauge(&metrics), Some(0.0), "{fine:?}");
        }
    }
}
