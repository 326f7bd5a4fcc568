//! Node init and composition for real EC2 (or the simulated VPC): build the IMDS and EC2
//! clients, discover the instance and its ENIs (IMDS plus ONE DescribeNetworkInterfaces),
//! resolve instance limits, set up node and ENI host networking, tag ENIs that miss ipamd's
//! tags, start the hourly leaked-ENI clean-up, then hand over to the daemon's composition
//! (checkpoint restore, gRPC, pool loop with reconciliation). Also the host-networking
//! decorator that sets up every ENI the pool manager creates. Must not: decide pool policy,
//! parse env (everything comes from `Config`).

use std::collections::BTreeMap;
use std::str::FromStr as _;
use std::sync::{Arc, Mutex};
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
use crate::host::{EniPlanError, HostError, HostNetwork, NodeSpec};
use crate::pool::provider::{
    AttachedEni, EniProvider, InstanceLimits, NewEni, NodeNetwork, ProviderError,
};
use crate::pool::reconcile::{EniHost, Hint};

/// Leaked-ENI clean-up period (upstream: hourly).
pub const LEAKED_ENI_PERIOD: Duration = Duration::from_secs(3600);
/// Upper bound of the random delay before the first clean-up (upstream 0–300 s).
pub const LEAKED_ENI_START_JITTER: Duration = Duration::from_secs(300);

/// ENI host networking over [`HostNetwork`] with the configured MTU. Retries while the new
/// ENI's link has not appeared yet.
#[derive(Debug)]
pub struct HostEnis {
    host: Arc<HostNetwork>,
    mtu: u32,
}

impl HostEnis {
    /// ENIs of `host` get `mtu`.
    pub fn new(host: Arc<HostNetwork>, mtu: u32) -> Self {
        Self { host, mtu }
    }
}

fn host_spec(eni: &AttachedEni) -> Result<crate::host::EniSpec, String> {
    Ok(crate::host::EniSpec {
        mac: MacAddr::from_str(&eni.mac).map_err(|_| format!("bad mac {:?}", eni.mac))?,
        device_number: eni.device_number,
        network_card: eni.network_card,
        primary_ip: eni.primary_ip,
        subnet: eni.subnet,
    })
}

impl EniHost for HostEnis {
    async fn setup(&self, eni: &AttachedEni) -> Result<(), String> {
        if eni.is_primary || eni.is_trunk || eni.is_efa || eni.is_excluded {
            return Ok(());
        }
        let spec = host_spec(eni)?;
        let mut delay = Duration::from_millis(200);
        for attempt in 0..10 {
            match self.host.setup_eni(&spec, self.mtu).await {
                Ok(_) => return Ok(()),
                Err(HostError::Eni(EniPlanError::NoLink(_))) if attempt < 9 => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(3));
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!("link of {} never appeared", eni.id))
    }

    async fn teardown(&self, eni: &AttachedEni) -> Result<(), String> {
        if eni.is_primary {
            return Ok(());
        }
        self.host
            .teardown_eni(&host_spec(eni)?)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// A provider whose new ENIs get host networking before the pool uses them, and whose freed
/// ENIs lose it. Everything else is delegated.
#[derive(Debug)]
pub struct HostedProvider<P, H> {
    inner: P,
    host: Arc<H>,
    known: Mutex<BTreeMap<String, AttachedEni>>,
    /// ENIs whose host set-up failed: registered as not host-ready (the pool loop retries).
    not_ready: Mutex<std::collections::BTreeSet<String>>,
}

impl<P, H> HostedProvider<P, H> {
    /// Wrap `inner`; new ENIs are set up on `host`.
    pub fn new(inner: P, host: Arc<H>) -> Self {
        Self {
            inner,
            host,
            known: Mutex::new(BTreeMap::new()),
            not_ready: Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// ENIs whose host set-up already failed (node init): registered as not host-ready.
    #[must_use]
    pub fn with_not_ready(self, ids: impl IntoIterator<Item = String>) -> Self {
        self.not_ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(ids);
        self
    }

    fn set_ready(&self, id: &str, ready: bool) {
        let mut n = self
            .not_ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ready {
            n.remove(id);
        } else {
            n.insert(id.to_owned());
        }
    }

    fn remember(&self, enis: &[AttachedEni]) {
        let mut k = self
            .known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for e in enis {
            k.insert(e.id.clone(), e.clone());
        }
    }

    fn forget(&self, id: &str) -> Option<AttachedEni> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(id)
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &P {
        &self.inner
    }
}

impl<P: EniProvider, H: EniHost + Send + Sync + 'static> EniProvider for HostedProvider<P, H> {
    async fn instance_limits(&self) -> Result<InstanceLimits, ProviderError> {
        self.inner.instance_limits().await
    }
    async fn node_network(&self) -> Result<NodeNetwork, ProviderError> {
        self.inner.node_network().await
    }
    async fn list_enis(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        let enis = self.inner.list_enis().await?;
        self.remember(&enis);
        Ok(enis)
    }
    async fn assign_ips(
        &self,
        eni_id: &str,
        count: u32,
    ) -> Result<Vec<std::net::Ipv4Addr>, ProviderError> {
        self.inner.assign_ips(eni_id, count).await
    }
    async fn assign_prefixes(
        &self,
        eni_id: &str,
        count: u32,
    ) -> Result<Vec<ipnet::Ipv4Net>, ProviderError> {
        self.inner.assign_prefixes(eni_id, count).await
    }
    async fn create_eni(&self, req: NewEni) -> Result<AttachedEni, ProviderError> {
        let eni = self.inner.create_eni(req).await?;
        match self.host.setup(&eni).await {
            Ok(()) => self.set_ready(&eni.id, true),
            Err(e) => {
                // The ENI exists in EC2 and is attached: failing here would make the manager
                // create another one. It is registered as not host-ready (none of its
                // addresses handed out) and the pool loop retries the set-up until it is done.
                tracing::warn!(eni = %eni.id, error = %e, "host setup of new eni failed; its addresses are held back and the setup retried");
                self.set_ready(&eni.id, false);
            }
        }
        self.remember(std::slice::from_ref(&eni));
        Ok(eni)
    }
    async fn unassign_ips(
        &self,
        eni_id: &str,
        ips: &[std::net::Ipv4Addr],
    ) -> Result<(), ProviderError> {
        self.inner.unassign_ips(eni_id, ips).await
    }
    async fn unassign_prefixes(
        &self,
        eni_id: &str,
        prefixes: &[ipnet::Ipv4Net],
    ) -> Result<(), ProviderError> {
        self.inner.unassign_prefixes(eni_id, prefixes).await
    }
    fn host_ready(&self, eni_id: &str) -> bool {
        !self
            .not_ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(eni_id)
    }
    async fn free_eni(&self, eni_id: &str) -> Result<(), ProviderError> {
        self.inner.free_eni(eni_id).await?;
        if let Some(eni) = self.forget(eni_id)
            && let Err(e) = self.host.teardown(&eni).await
        {
            tracing::warn!(eni = eni_id, error = %e, "host teardown of freed eni failed");
        }
        Ok(())
    }
}

impl<P: Hint, H: EniHost + 'static> Hint for HostedProvider<P, H> {
    async fn hinted_enis(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        self.inner.hinted_enis().await
    }
}

impl<H: EniHost> EniHost for Arc<H> {
    async fn setup(&self, eni: &AttachedEni) -> Result<(), String> {
        (**self).setup(eni).await
    }
    async fn teardown(&self, eni: &AttachedEni) -> Result<(), String> {
        (**self).teardown(eni).await
    }
}

/// The AWS settings the config gives: `AWS_EC2_ENDPOINT` (upstream's knob) and `HTTP_TIMEOUT`;
/// everything else (`AWS_ENDPOINT_URL_EC2`, `AWS_EC2_METADATA_SERVICE_ENDPOINT`, `AWS_REGION`,
/// credentials) is read by the AWS SDK's own environment loader.
pub fn aws_settings(config: &Config) -> AwsSettings {
    AwsSettings {
        ec2_endpoint: (!config.ec2_endpoint.is_empty()).then(|| config.ec2_endpoint.clone()),
        http_timeout: Some(config.http_timeout),
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
        mtu: config.eni_mtu,
        vpc_cidrs: node.vpc_v4_cidrs.clone(),
        exclude_snat_cidrs: config.exclude_snat_cidrs.clone(),
        external_snat: config.external_snat,
        randomize_snat: config.randomize_snat,
        node_port_support: config.node_port_support,
        connmark: config.connmark,
        veth_prefix: config.veth_prefix.clone(),
        external_service_cidrs: config.external_service_cidrs.clone(),
    })
}

/// EC2 side of node init: the instance's ENIs (IMDS + ONE Describe), limits, tags on managed
/// ENIs that miss them. Returns the ENIs.
pub async fn discover<E: Ec2 + 'static, I: Imds + 'static>(
    provider: &Ec2Provider<E, I>,
) -> Result<Vec<AttachedEni>, ProviderError> {
    let identity = provider.identity().await?;
    let limits = provider.aws_limits().await?;
    let enis = provider.prime().await?;
    let tagged = provider.tag_untagged(&enis).await?;
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

/// Leaked-ENI clean-up every `period` (upstream: hourly) after a random start delay (0–300 s
/// for an hour, proportionally less for a shorter test period); stops at `shutdown`.
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

/// `ipamd` with the EC2 provider: node init, then the daemon.
pub async fn run_ec2(
    config: Config,
    cluster: Option<crate::k8s::Cluster>,
    started: std::time::Instant,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let settings = aws_settings(&config);
    let http = sdk::http_client();
    let imds = SdkImds::new(&settings, http.clone()).context("imds client")?;
    let identity = imds.identity().await.context("imds identity")?;
    let metrics = Arc::new(crate::http::metrics::Metrics::new());
    let ec2 = SdkEc2::new(
        &settings,
        http,
        Some(identity.region.clone()),
        Arc::new(TokenBucket::default()),
        AwsMetrics::new(metrics.clone()),
    )
    .await;
    let ec2 = match &cluster {
        Some(c) => ec2.with_unauthorized_hook(missing_iam_events(c.clone())),
        None => ec2,
    };
    let provider = Ec2Provider::new(
        Arc::new(ec2),
        Arc::new(imds),
        ProviderSettings {
            manage_untagged: config.manage_untagged_eni,
            imds_only: config.enable_imds_only_mode,
            ..ProviderSettings::upstream(
                config.cluster_name.clone(),
                config.additional_eni_tags.clone(),
            )
        },
    )
    .with_metrics(AwsMetrics::new(metrics.clone()));
    let provider = match (&cluster, config.custom_network_cfg) {
        (Some(c), true) => provider.with_custom_network(crate::k8s::CustomNetwork {
            node: c.node(),
            eni_configs: c.eni_configs(),
            keys: config.eni_config_keys.clone(),
            report: eni_config_refusals(c.clone(), metrics.clone()),
        }),
        _ => provider,
    };
    let enis = discover(&provider).await.context("discover enis")?;
    let node = provider.node_network().await.context("primary eni")?;

    let host = Arc::new(
        HostNetwork::for_current_netns(crate::host::BackendChoice::Auto)
            .await
            .context("host netlink")?,
    );
    let applied = host
        .setup_node(&node_spec(&config, &identity.primary_mac, &node)?)
        .await
        .context("node host networking")?;
    // The node set-up is where the connmark rules are reconciled (iptables CONNMARK; native
    // nftables connmark is not implemented). A failed set-up ends ipamd before metrics serve.
    metrics.connmark_reconciled("iptables", true);
    tracing::info!(
        changes = applied.routing.len() + applied.iptables.len(),
        "node host networking converged"
    );
    let host_enis = Arc::new(HostEnis::new(host, config.eni_mtu));
    let mut not_ready = Vec::new();
    for eni in &enis {
        if let Err(e) = host_enis.setup(eni).await {
            tracing::warn!(eni = %eni.id, error = %e, "eni host networking failed; its addresses are held back and the pool loop retries");
            not_ready.push(eni.id.clone());
        }
    }

    if !config.disable_leaked_eni_cleanup && !config.disable_network_resource_provisioning {
        tokio::spawn(leaked_eni_loop(
            provider.clone(),
            config.leaked_eni_period,
            shutdown.child_token(),
        ));
    }
    let hosted = HostedProvider::new(provider, host_enis.clone()).with_not_ready(not_ready);
    crate::run_composed(
        config, hosted, metrics, host_enis, cluster, started, shutdown,
    )
    .await
}

/// upstream's `checkAPIErrorAndBroadcastEvent`: a `MissingIAMPermissions` Warning on the
/// aws-node pod for every EC2 call refused for lack of permission (deduplicated by the
/// cluster).
pub fn missing_iam_events(cluster: crate::k8s::Cluster) -> crate::aws::sdk::UnauthorizedHook {
    crate::aws::sdk::UnauthorizedHook(Arc::new(move |api: &'static str| {
        let cluster = cluster.clone();
        let action = format!("ec2:{api}");
        let message = format!(
            "Unauthorized operation: failed to call {action} due to missing permissions. Please refer https://github.com/aws/amazon-vpc-cni-k8s/blob/master/docs/iam-policy.md to attach relevant policy to IAM role"
        );
        tokio::spawn(async move {
            let ev = crate::k8s::PodEvent {
                warning: true,
                reason: crate::k8s::REASON_MISSING_IAM.into(),
                action,
                message,
            };
            if let Err(e) = cluster.post_event(ev).await {
                tracing::warn!(error = %e, "MissingIAMPermissions event not posted");
            }
        });
    }))
}

/// Custom networking could not place an ENI: an ERROR line, `awscni_eniconfig_error_count`
/// and a Warning event on the aws-node pod (deduplicated); nothing is created.
pub fn eni_config_refusals(
    cluster: crate::k8s::Cluster,
    metrics: Arc<crate::http::metrics::Metrics>,
) -> crate::k8s::RefusalReporter {
    Arc::new(move |r: &crate::k8s::PlacementRefusal| {
        tracing::error!(reason = r.kind(), "custom networking: no ENI created: {r}");
        metrics.eniconfig_error(r.kind());
        let cluster = cluster.clone();
        let ev = crate::k8s::PodEvent {
            warning: true,
            reason: crate::k8s::REASON_ENI_CONFIG.into(),
            action: "ec2:CreateNetworkInterface".into(),
            message: format!("custom networking: no ENI created: {r}"),
        };
        tokio::spawn(async move {
            if let Err(e) = cluster.post_event(ev).await {
                tracing::warn!(error = %e, "ENIConfig event not posted");
            }
        });
    })
}
