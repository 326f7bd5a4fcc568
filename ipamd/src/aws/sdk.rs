//! The SDK implementations of the `Ec2` and `Imds` ports: aws-sdk-ec2 over an HTTPS client
//! (rustls + ring) and aws-config's IMDSv2 client over plain HTTP (TLS only for an `https://`
//! IMDS endpoint: building a TLS connector parses every root certificate of the node, inside
//! the 5 s attempt of IMDS's first token request), the node's token bucket in front of every
//! EC2 call, the SDK's jittered standard retries behind it (except for throttling, which the
//! node-wide back-off alone retries, and for the unassign, sent as one request per try so that a
//! refusal proves EC2 did nothing), and the per-API metrics. Endpoints: explicit [`AwsSettings`]
//! values win; otherwise the SDK's own environment loader applies
//! (`AWS_ENDPOINT_URL_EC2`/`AWS_ENDPOINT_URL`, `AWS_EC2_METADATA_SERVICE_ENDPOINT`, `AWS_REGION`,
//! the default credential chain). Nothing outside this file sees SDK types.
//!
//! Over 600 lines on purpose: it is the one file that may import the SDK (~1.3 M generated
//! lines), so every SDK call and its translation into domain types and `Ec2Error` stays here;
//! splitting it would spread SDK types across files.

use std::future::Future;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_config::imds::client::error::ImdsError as SdkImdsError;
use aws_config::provider_config::ProviderConfig;
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::config::retry::RetryConfig;
use aws_sdk_ec2::config::timeout::TimeoutConfig;
use aws_sdk_ec2::config::{Region, SharedHttpClient};
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types as t;
use ipnet::{Ipv4Net, Ipv6Net};
use tokio::time::Instant;

use super::ec2::{
    AddressRequest, ConntrackSpec, CreateEni, Ec2, EniQuery, SubnetInfo, split_cidrs,
};
use super::error::{Ec2Error, ImdsError};
use super::imds::{self, Imds};
use super::limits::InstanceTypeLimits;
use super::metrics::AwsMetrics;
use super::throttle::TokenBucket;
use super::{Attachment, Ec2Eni, EniStatus, ImdsEni, InstanceIdentity, TAG_INSTANCE_ID, Tags};

/// How to reach AWS. `None` fields fall back to the SDK's environment loader.
#[derive(Debug, Clone, Default)]
pub struct AwsSettings {
    /// EC2 endpoint URL (else `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL` / the region default).
    pub ec2_endpoint: Option<String>,
    /// IMDS endpoint URL (else `AWS_EC2_METADATA_SERVICE_ENDPOINT` / 169.254.169.254).
    pub imds_endpoint: Option<String>,
    /// Region (else `AWS_REGION`, else IMDS `placement/region`).
    pub region: Option<String>,
    /// Per-attempt HTTP timeout (`HTTP_TIMEOUT`, default 10 s).
    pub http_timeout: Option<Duration>,
    /// SDK attempts per EC2 call, jittered exponential back-off between them (default 5).
    pub max_attempts: Option<u32>,
    /// Static credentials (tests and simulators); else the SDK default chain.
    pub static_credentials: Option<(String, String)>,
    /// `VPC_CNI_VERSION`: EC2 calls carry `app/amazon-vpc-cni-k8s-<version>` in their User-Agent.
    pub version: Option<String>,
}

/// The HTTPS client (rustls with ring) for EC2, and for IMDS when its endpoint is `https://`.
pub fn http_client() -> SharedHttpClient {
    use aws_smithy_http_client::tls;
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// IMDSv2 through `aws_config::imds::Client`.
#[derive(Debug, Clone)]
pub struct SdkImds {
    client: aws_config::imds::Client,
}

/// Whether IMDS at `endpoint` (None: the SDK's default, `http://169.254.169.254` or its IPv6
/// twin) needs TLS. IMDS is plain HTTP on the link-local address; only an operator's explicit
/// `https://` endpoint gets the TLS client.
fn imds_needs_tls(endpoint: Option<&str>) -> bool {
    endpoint.is_some_and(|e| {
        e.trim()
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
    })
}

impl SdkImds {
    /// `tls` serves an `https://` endpoint only; IMDS over plain HTTP gets its own client
    /// without a TLS stack. Building a TLS connector loads and parses the node's root
    /// certificates within IMDS's first token attempt (5 s): ~1.4 s in this project's TCG test
    /// VM, over 5 s when its host is loaded, and ipamd then exited at init.
    pub fn new(settings: &AwsSettings, tls: SharedHttpClient) -> Result<Self, ImdsError> {
        let http = if imds_needs_tls(settings.imds_endpoint.as_deref()) {
            tls
        } else {
            // the crate's TLS-free build: public but `#[doc(hidden)]`, so a bump of
            // aws-smithy-http-client that drops it fails here, at compile time
            aws_smithy_http_client::Builder::new().build_http()
        };
        let provider = ProviderConfig::default().with_http_client(http);
        let mut builder = aws_config::imds::Client::builder()
            .configure(&provider)
            .max_attempts(4)
            .connect_timeout(Duration::from_secs(2))
            .read_timeout(Duration::from_secs(5))
            .operation_timeout(Duration::from_secs(15))
            .operation_attempt_timeout(Duration::from_secs(5));
        if let Some(ep) = &settings.imds_endpoint {
            builder = builder
                .endpoint(ep)
                .map_err(|e| ImdsError::Unavailable(format!("endpoint {ep}: {e}")))?;
        }
        Ok(Self {
            client: builder.build(),
        })
    }

    async fn get(&self, path: &str) -> Result<String, ImdsError> {
        let full = format!("/latest/meta-data/{path}");
        match self.client.get(full).await {
            Ok(v) => Ok(v.as_ref().to_owned()),
            Err(SdkImdsError::ErrorResponse(r)) if r.response().status().as_u16() == 404 => {
                Err(ImdsError::NotFound(path.to_owned()))
            }
            // the whole cause chain (refused, timed out, reset), not only the SDK's top line
            Err(e) => Err(ImdsError::Unavailable(format!(
                "{path}: {}",
                aws_sdk_ec2::error::DisplayErrorContext(&e)
            ))),
        }
    }

    /// A path that may legitimately be absent (404 → empty).
    async fn get_optional(&self, path: &str) -> Result<String, ImdsError> {
        match self.get(path).await {
            Err(ImdsError::NotFound(_)) => Ok(String::new()),
            other => other,
        }
    }

    async fn eni(&self, mac: &str) -> Result<ImdsEni, ImdsError> {
        let base = format!("network/interfaces/macs/{mac}");
        let p = |leaf: &str| format!("{base}/{leaf}");
        let eni_id = self.get(&p("interface-id")).await?.trim().to_owned();
        let device_number =
            imds::parse_u32(&p("device-number"), &self.get(&p("device-number")).await?)?;
        let card = self.get_optional(&p("network-card")).await?;
        let network_card = if card.trim().is_empty() {
            0
        } else {
            imds::parse_u32(&p("network-card"), &card)?
        };
        let subnet_id = self.get(&p("subnet-id")).await?.trim().to_owned();
        let subnet_path = p("subnet-ipv4-cidr-block");
        let subnet_cidr = *imds::parse_cidrs(&subnet_path, &self.get(&subnet_path).await?)?
            .first()
            .ok_or(ImdsError::Malformed {
                path: subnet_path.clone(),
                value: String::new(),
            })?;
        let vpc_path = p("vpc-ipv4-cidr-blocks");
        let vpc_cidrs = imds::parse_cidrs(&vpc_path, &self.get_optional(&vpc_path).await?)?;
        let security_groups =
            imds::parse_listing(&self.get_optional(&p("security-group-ids")).await?);
        let ips_path = p("local-ipv4s");
        let local_ipv4s = imds::parse_ips(&ips_path, &self.get(&ips_path).await?)?;
        let prefix_path = p("ipv4-prefix");
        let prefixes = imds::parse_cidrs(&prefix_path, &self.get_optional(&prefix_path).await?)?;
        let v6_path = p("ipv6s");
        let ipv6s = imds::parse_ipv6s(&v6_path, &self.get_optional(&v6_path).await?)?;
        let vpc6_path = p("vpc-ipv6-cidr-blocks");
        let vpc_ipv6_cidrs = if ipv6s.is_empty() {
            Vec::new()
        } else {
            imds::parse_ipv6_cidrs(&vpc6_path, &self.get_optional(&vpc6_path).await?)?
        };
        let mut eni = imds::assemble_eni(
            mac,
            eni_id,
            device_number,
            network_card,
            subnet_id,
            subnet_cidr,
            vpc_cidrs,
            security_groups,
            local_ipv4s,
            prefixes,
        )?;
        eni.ipv6s = ipv6s;
        eni.vpc_ipv6_cidrs = vpc_ipv6_cidrs;
        Ok(eni)
    }
}

impl Imds for SdkImds {
    async fn identity(&self) -> Result<InstanceIdentity, ImdsError> {
        let instance_id = self.get("instance-id").await?.trim().to_owned();
        let instance_type = self.get("instance-type").await?.trim().to_owned();
        let availability_zone = self
            .get("placement/availability-zone")
            .await?
            .trim()
            .to_owned();
        let region = match self.get("placement/region").await {
            Ok(r) => r.trim().to_owned(),
            Err(ImdsError::NotFound(_)) => imds::region_of_az(&availability_zone),
            Err(e) => return Err(e),
        };
        let primary_mac = self.get("mac").await?.trim().to_owned();
        Ok(InstanceIdentity {
            instance_id,
            instance_type,
            region,
            availability_zone,
            primary_mac,
        })
    }

    async fn enis(&self) -> Result<Vec<ImdsEni>, ImdsError> {
        let macs = imds::parse_listing(&self.get("network/interfaces/macs/").await?);
        let mut out = Vec::with_capacity(macs.len());
        for mac in macs {
            match self.eni(&mac).await {
                Ok(e) => out.push(e),
                // an ENI detached between the listing and its reads: IMDS is a hint, skip it
                Err(ImdsError::NotFound(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        out.sort_by_key(|e| (e.network_card, e.device_number));
        Ok(out)
    }
    async fn vpc_ipv4_cidrs(&self, primary_mac: &str) -> Result<Vec<Ipv4Net>, ImdsError> {
        let path = format!("network/interfaces/macs/{primary_mac}/vpc-ipv4-cidr-blocks");
        imds::parse_cidrs(&path, &self.get_optional(&path).await?)
    }
    async fn security_groups(&self, primary_mac: &str) -> Result<Vec<String>, ImdsError> {
        let path = format!("network/interfaces/macs/{primary_mac}/security-group-ids");
        Ok(imds::parse_listing(&self.get(&path).await?))
    }
}

/// aws-sdk-ec2 behind the node's token bucket, with per-API metrics.
#[derive(Debug, Clone)]
pub struct SdkEc2 {
    client: aws_sdk_ec2::Client,
    bucket: Arc<TokenBucket>,
    metrics: AwsMetrics,
    unauthorized: Option<UnauthorizedHook>,
}

/// Told the API name of every call EC2 answered `UnauthorizedOperation` (a `MissingIAMPermissions`
/// event on the aws-node pod).
#[derive(Clone)]
pub struct UnauthorizedHook(pub Arc<dyn Fn(&'static str) + Send + Sync>);

impl std::fmt::Debug for UnauthorizedHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UnauthorizedHook")
    }
}

impl SdkEc2 {
    /// Build the EC2 client. `region` is the fallback when neither settings nor env give one.
    pub async fn new(
        settings: &AwsSettings,
        http: SharedHttpClient,
        region: Option<String>,
        bucket: Arc<TokenBucket>,
        metrics: AwsMetrics,
    ) -> Self {
        let retry = RetryConfig::standard()
            .with_max_attempts(settings.max_attempts.unwrap_or(5))
            .with_initial_backoff(Duration::from_millis(200))
            .with_max_backoff(Duration::from_secs(20));
        let timeout = TimeoutConfig::builder()
            .operation_attempt_timeout(settings.http_timeout.unwrap_or(Duration::from_secs(10)))
            .connect_timeout(Duration::from_secs(3))
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(retry)
            .timeout_config(timeout);
        if let Some(r) = settings.region.clone() {
            loader = loader.region(Region::new(r));
        }
        if let Some(ep) = &settings.ec2_endpoint {
            loader = loader.endpoint_url(ep);
        }
        if let Some(app) = settings
            .version
            .as_ref()
            .and_then(|v| aws_config::AppName::new(format!("amazon-vpc-cni-k8s-{v}")).ok())
        {
            loader = loader.app_name(app);
        }
        if let Some((id, secret)) = &settings.static_credentials {
            loader = loader.credentials_provider(aws_sdk_ec2::config::Credentials::new(
                id.clone(),
                secret.clone(),
                None,
                None,
                "ipamd-static",
            ));
        }
        let sdk = loader.load().await;
        let mut conf =
            aws_sdk_ec2::config::Builder::from(&sdk).retry_classifier(ThrottlingIsNodeWide);
        if sdk.region().is_none() {
            conf = conf.region(region.map(Region::new));
        }
        Self {
            client: aws_sdk_ec2::Client::from_conf(conf.build()),
            bucket,
            metrics,
            unauthorized: None,
        }
    }

    /// Calls `hook` with the API name whenever EC2 answers `UnauthorizedOperation`.
    #[must_use]
    pub fn with_unauthorized_hook(self, hook: UnauthorizedHook) -> Self {
        Self {
            unauthorized: Some(hook),
            ..self
        }
    }

    /// Token, call, metrics, error translation: the one path every EC2 request takes.
    /// `RequestLimitExceeded` (after the SDK's own jittered retries) pauses the whole node
    /// ([`TokenBucket::throttled`]) and the call is made again after that pause, until
    /// [`THROTTLE_RETRY_BUDGET`] has been spent: a pool action outlasts a short throttle
    /// instead of failing and being restarted from scratch at the next tick.
    async fn call<T, E, F, Fut>(&self, api: &'static str, send: F) -> Result<T, Ec2Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        self.tries(api, Sending::SdkRetries, |_| send()).await
    }

    /// [`Self::call`] for a call whose error must tell whether EC2 may have acted: each try
    /// is ONE request (`send` must apply the configuration it is given: the SDK's retries
    /// off), and the node-wide loop sends again only after a refusal. So when the last answer
    /// is a refusal (`RequestLimitExceeded`, `UnauthorizedOperation`), every request was
    /// refused before EC2 acted: [`Ec2Error::NotApplied`]. A lost answer (timeout, reset,
    /// 5xx) is returned at once, as the ambiguous error it is, and never retried: a retry
    /// answered `RequestLimitExceeded` would hide that the first request may have been
    /// applied.
    async fn call_once_per_try<T, E, F, Fut>(
        &self,
        api: &'static str,
        send: F,
    ) -> Result<T, Ec2Error>
    where
        F: Fn(aws_sdk_ec2::config::Builder) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        self.tries(api, Sending::OneRequestPerTry, send).await
    }

    async fn tries<T, E, F, Fut>(
        &self,
        api: &'static str,
        sending: Sending,
        send: F,
    ) -> Result<T, Ec2Error>
    where
        F: Fn(aws_sdk_ec2::config::Builder) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let first = Instant::now();
        loop {
            self.bucket.acquire().await;
            let start = Instant::now();
            let res = send(sending.config()).await;
            let latency = start.elapsed();
            match res {
                Ok(v) => {
                    self.bucket.succeeded();
                    self.metrics.observe(api, latency, 200, Ok(()));
                    return Ok(v);
                }
                Err(e) => {
                    let status = e.raw_response().map_or(0, |r| r.status().as_u16());
                    let err = match translate(&e) {
                        // name the action refused (the code says only "unauthorized")
                        Ec2Error::Unauthorized(_) => Ec2Error::Unauthorized(format!("ec2:{api}")),
                        other => other,
                    };
                    self.metrics.observe(api, latency, status, Err(&err));
                    if let (Ec2Error::Unauthorized(_), Some(hook)) = (&err, &self.unauthorized) {
                        (hook.0)(api);
                    }
                    if err == Ec2Error::Throttled {
                        let pause = self.bucket.throttled(rand::random::<f64>());
                        if first.elapsed() + pause < THROTTLE_RETRY_BUDGET {
                            tracing::info!(
                                api,
                                ?pause,
                                "ec2 throttled; node backs off and retries"
                            );
                            continue;
                        }
                    }
                    tracing::warn!(api, status, error = %err, "ec2 call failed");
                    // Every earlier try was a single request answered `RequestLimitExceeded`
                    // (only that answer loops), so a refusal now is the fate of them all.
                    let refused = matches!(err, Ec2Error::Throttled | Ec2Error::Unauthorized(_));
                    if sending == Sending::OneRequestPerTry && refused {
                        return Err(Ec2Error::NotApplied(Box::new(err)));
                    }
                    return Err(err);
                }
            }
        }
    }
}

/// How the requests of one try are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sending {
    /// The client's standard retries of transient errors within a try.
    SdkRetries,
    /// One request per try: the SDK's retries off for this call.
    OneRequestPerTry,
}

impl Sending {
    /// The per-call configuration that makes a try what `self` says.
    fn config(self) -> aws_sdk_ec2::config::Builder {
        let b = aws_sdk_ec2::config::Builder::new();
        match self {
            Self::SdkRetries => b,
            Self::OneRequestPerTry => b.retry_config(RetryConfig::disabled()),
        }
    }
}

/// Forbids the SDK's own retries of a throttled answer (`RequestLimitExceeded` and the other
/// codes the SDK classifies as throttling): the SDK would retry it up to 4 more times within a
/// few seconds, each a request against the account's empty bucket, for every node at once.
/// [`SdkEc2::call`] retries it instead, after the node-wide back-off. Transient errors keep the
/// SDK's retries.
#[derive(Debug, Clone, Copy)]
struct ThrottlingIsNodeWide;

impl aws_sdk_ec2::config::retry::ClassifyRetry for ThrottlingIsNodeWide {
    fn classify_retry(
        &self,
        _ctx: &aws_sdk_ec2::config::interceptors::InterceptorContext,
    ) -> aws_sdk_ec2::config::retry::RetryAction {
        aws_sdk_ec2::config::retry::RetryAction::NoActionIndicated
    }

    fn classify_retry_v2(
        &self,
        _ctx: &aws_sdk_ec2::config::interceptors::InterceptorContext,
        previous: &aws_sdk_ec2::config::retry::RetryAction,
    ) -> aws_sdk_ec2::config::retry::RetryAction {
        use aws_smithy_runtime_api::client::retries::classifiers::{RetryAction, RetryReason};
        let kind = |a: &RetryAction| match a {
            RetryAction::RetryIndicated(RetryReason::RetryableError { kind, .. }) => Some(*kind),
            _ => None,
        };
        if kind(previous).is_some() && kind(previous) == kind(&RetryAction::throttling_error()) {
            RetryAction::RetryForbidden
        } else {
            RetryAction::NoActionIndicated
        }
    }

    fn name(&self) -> &'static str {
        "throttling is retried by the node-wide back-off"
    }

    fn priority(
        &self,
    ) -> aws_smithy_runtime_api::client::retries::classifiers::RetryClassifierPriority {
        // after every SDK classifier (the error-code one marks RequestLimitExceeded)
        use aws_smithy_runtime_api::client::retries::classifiers::RetryClassifierPriority;
        RetryClassifierPriority::run_after(RetryClassifierPriority::transient_error_classifier())
    }
}

/// How long one EC2 call keeps retrying `RequestLimitExceeded` (node-wide back-off between
/// tries) before it fails: well below the 100 s an AddNetwork waits while a pool action is in
/// flight (`ipam::BUSY_POOL_WAIT`), so a pod waiting for this allocation still gets its answer
/// in time (the attach of a new ENI gets up to three such budgets:
/// `aws::provider::ATTACH_THROTTLED_RETRIES`).
pub const THROTTLE_RETRY_BUDGET: Duration = Duration::from_secs(20);

fn translate<E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static>(
    e: &SdkError<E, HttpResponse>,
) -> Ec2Error {
    match e {
        SdkError::ServiceError(se) => {
            let err = se.err();
            Ec2Error::from_code(err.code().unwrap_or("Unknown"), err.message().unwrap_or(""))
        }
        SdkError::TimeoutError(_) => Ec2Error::Transport("timeout".into()),
        SdkError::DispatchFailure(d) => {
            Ec2Error::Transport(format!("{:?}", d.as_connector_error()))
        }
        other => Ec2Error::Transport(aws_sdk_ec2::error::DisplayErrorContext(other).to_string()),
    }
}

fn parse_ip(s: Option<&str>) -> Option<Ipv4Addr> {
    s.and_then(|v| v.parse().ok())
}

fn to_eni(ni: &t::NetworkInterface) -> Result<Ec2Eni, Ec2Error> {
    let primary_ip =
        parse_ip(ni.private_ip_address()).ok_or(Ec2Error::Malformed("PrivateIpAddress"))?;
    let secondary_ips = ni
        .private_ip_addresses()
        .iter()
        .filter(|a| a.primary() != Some(true))
        .filter_map(|a| parse_ip(a.private_ip_address()))
        .filter(|ip| *ip != primary_ip)
        .collect();
    let prefixes = ni
        .ipv4_prefixes()
        .iter()
        .filter_map(|p| p.ipv4_prefix()?.parse().ok())
        .collect();
    let ipv6_prefixes = ni
        .ipv6_prefixes()
        .iter()
        .filter_map(|p| p.ipv6_prefix()?.parse().ok())
        .collect();
    let ipv6_addresses = ni
        .ipv6_addresses()
        .iter()
        .filter_map(|a| a.ipv6_address()?.parse().ok())
        .collect();
    let status = match ni.status() {
        Some(t::NetworkInterfaceStatus::Available) => EniStatus::Available,
        Some(t::NetworkInterfaceStatus::Attaching) => EniStatus::Attaching,
        Some(t::NetworkInterfaceStatus::InUse) => EniStatus::InUse,
        Some(t::NetworkInterfaceStatus::Detaching) => EniStatus::Detaching,
        _ => EniStatus::Other,
    };
    let attachment = ni.attachment().and_then(|a| {
        Some(Attachment {
            attachment_id: a.attachment_id()?.to_owned(),
            instance_id: a.instance_id().unwrap_or_default().to_owned(),
            device_index: u32::try_from(a.device_index()?).ok()?,
            network_card: a
                .network_card_index()
                .and_then(|c| u32::try_from(c).ok())
                .unwrap_or(0),
            delete_on_termination: a.delete_on_termination().unwrap_or(false),
        })
    });
    Ok(Ec2Eni {
        eni_id: ni
            .network_interface_id()
            .ok_or(Ec2Error::Malformed("NetworkInterfaceId"))?
            .to_owned(),
        mac: ni.mac_address().unwrap_or_default().to_owned(),
        subnet_id: ni.subnet_id().unwrap_or_default().to_owned(),
        vpc_id: ni.vpc_id().unwrap_or_default().to_owned(),
        description: ni.description().unwrap_or_default().to_owned(),
        interface_type: ni
            .interface_type()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        status,
        primary_ip,
        secondary_ips,
        prefixes,
        ipv6_prefixes,
        ipv6_addresses,
        security_groups: ni
            .groups()
            .iter()
            .filter_map(|g| g.group_id().map(str::to_owned))
            .collect(),
        tags: ni
            .tag_set()
            .iter()
            .filter_map(|t| {
                Some((
                    t.key()?.to_owned(),
                    t.value().unwrap_or_default().to_owned(),
                ))
            })
            .collect(),
        attachment,
        conntrack: ni.connection_tracking_configuration().and_then(|c| {
            ConntrackSpec {
                tcp_established_timeout: c.tcp_established_timeout(),
                udp_stream_timeout: c.udp_stream_timeout(),
                udp_timeout: c.udp_timeout(),
            }
            .if_set()
        }),
    })
}

fn filter(name: &str, value: impl Into<String>) -> t::Filter {
    t::Filter::builder().name(name).values(value).build()
}

fn sdk_tags(tags: &Tags) -> Vec<t::Tag> {
    tags.iter()
        .map(|(k, v)| t::Tag::builder().key(k).value(v).build())
        .collect()
}

fn count_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl Ec2 for SdkEc2 {
    async fn describe_enis(&self, query: EniQuery) -> Result<Vec<Ec2Eni>, Ec2Error> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = self.client.describe_network_interfaces();
            match &query {
                EniQuery::Ids(ids) => {
                    if ids.is_empty() {
                        return Ok(out);
                    }
                    req = req.set_network_interface_ids(Some(ids.clone()));
                }
                EniQuery::AttachedTo(instance) => {
                    req = req
                        .filters(filter("attachment.instance-id", instance))
                        .max_results(1000);
                }
                EniQuery::Leaked {
                    vpc_id,
                    cluster_name,
                } => {
                    req = req
                        .filters(filter("status", "available"))
                        .filters(filter("vpc-id", vpc_id))
                        .filters(filter("tag-key", TAG_INSTANCE_ID))
                        .max_results(1000);
                    if let Some(c) = cluster_name {
                        req = req.filters(filter(&format!("tag:{}", super::TAG_CLUSTER_NAME), c));
                    }
                }
            }
            let resp = self
                .call("DescribeNetworkInterfaces", || {
                    req.clone().set_next_token(token.clone()).send()
                })
                .await?;
            for ni in resp.network_interfaces() {
                out.push(to_eni(ni)?);
            }
            match resp.next_token() {
                Some(t) if !t.is_empty() && !matches!(query, EniQuery::Ids(_)) => {
                    token = Some(t.to_owned())
                }
                _ => return Ok(out),
            }
        }
    }

    async fn instance_type_limits(
        &self,
        instance_type: &str,
    ) -> Result<InstanceTypeLimits, Ec2Error> {
        let resp = self
            .call("DescribeInstanceTypes", || {
                self.client
                    .describe_instance_types()
                    .instance_types(t::InstanceType::from(instance_type))
                    .send()
            })
            .await?;
        let info = resp
            .instance_types()
            .first()
            .ok_or_else(|| Ec2Error::NotFound(instance_type.to_owned()))?;
        let net = info
            .network_info()
            .ok_or(Ec2Error::Malformed("NetworkInfo"))?;
        let max_enis = net
            .maximum_network_interfaces()
            .and_then(|v| u32::try_from(v).ok());
        let per_eni = net
            .ipv4_addresses_per_interface()
            .and_then(|v| u32::try_from(v).ok());
        Ok(InstanceTypeLimits {
            max_enis: max_enis.ok_or(Ec2Error::Malformed("MaximumNetworkInterfaces"))?,
            ipv4_per_eni: per_eni.ok_or(Ec2Error::Malformed("Ipv4AddressesPerInterface"))?,
            nitro: matches!(info.hypervisor(), Some(t::InstanceTypeHypervisor::Nitro)),
            bare_metal: info.bare_metal().unwrap_or(false),
            network_cards: u32::try_from(net.network_cards().len()).unwrap_or(1).max(1),
        })
    }

    async fn subnet_zone(&self, subnet_id: &str) -> Result<Option<String>, Ec2Error> {
        let call = self.client.describe_subnets().subnet_ids(subnet_id);
        match self.call("DescribeSubnets", || call.clone().send()).await {
            Ok(resp) => Ok(resp
                .subnets()
                .iter()
                .find(|s| s.subnet_id() == Some(subnet_id))
                .and_then(|s| s.availability_zone().map(str::to_owned))),
            Err(Ec2Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn describe_subnets(
        &self,
        vpc_id: &str,
        availability_zone: &str,
    ) -> Result<Vec<SubnetInfo>, Ec2Error> {
        let req = self
            .client
            .describe_subnets()
            .filters(filter("vpc-id", vpc_id))
            .filters(filter("availability-zone", availability_zone));
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let resp = self
                .call("DescribeSubnets", || {
                    req.clone().set_next_token(token.clone()).send()
                })
                .await?;
            for sn in resp.subnets() {
                out.push(SubnetInfo {
                    subnet_id: sn
                        .subnet_id()
                        .ok_or(Ec2Error::Malformed("SubnetId"))?
                        .to_owned(),
                    availability_zone: sn.availability_zone().unwrap_or_default().to_owned(),
                    available_ips: sn
                        .available_ip_address_count()
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(0),
                    tags: sn
                        .tags()
                        .iter()
                        .filter_map(|t| {
                            Some((
                                t.key()?.to_owned(),
                                t.value().unwrap_or_default().to_owned(),
                            ))
                        })
                        .collect(),
                });
            }
            match resp.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_owned()),
                _ => return Ok(out),
            }
        }
    }

    async fn create_eni(&self, req: CreateEni) -> Result<Ec2Eni, Ec2Error> {
        let mut call = self
            .client
            .create_network_interface()
            .subnet_id(&req.subnet_id)
            .set_groups(Some(req.security_groups.clone()))
            .description(&req.description)
            .tag_specifications(
                t::TagSpecification::builder()
                    .resource_type(t::ResourceType::NetworkInterface)
                    .set_tags(Some(sdk_tags(&req.tags)))
                    .build(),
            );
        if let Some(c) = req.conntrack {
            call = call.connection_tracking_specification(
                t::ConnectionTrackingSpecificationRequest::builder()
                    .set_tcp_established_timeout(c.tcp_established_timeout)
                    .set_udp_stream_timeout(c.udp_stream_timeout)
                    .set_udp_timeout(c.udp_timeout)
                    .build(),
            );
        }
        call = match req.addresses {
            AddressRequest::Ips(0) => call,
            AddressRequest::Ips(n) => call.secondary_private_ip_address_count(count_i32(n)),
            AddressRequest::Prefixes(n) => call.ipv4_prefix_count(count_i32(n)),
        };
        let resp = self
            .call("CreateNetworkInterface", || call.clone().send())
            .await?;
        to_eni(
            resp.network_interface()
                .ok_or(Ec2Error::Malformed("NetworkInterface"))?,
        )
    }

    async fn attach_eni(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        network_card: u32,
    ) -> Result<String, Ec2Error> {
        let mut call = self
            .client
            .attach_network_interface()
            .network_interface_id(eni_id)
            .instance_id(instance_id)
            .device_index(count_i32(device_index));
        if network_card > 0 {
            call = call.network_card_index(count_i32(network_card));
        }
        let resp = self
            .call("AttachNetworkInterface", || call.clone().send())
            .await?;
        resp.attachment_id()
            .map(str::to_owned)
            .ok_or(Ec2Error::Malformed("AttachmentId"))
    }

    async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
    ) -> Result<(), Ec2Error> {
        let change = t::NetworkInterfaceAttachmentChanges::builder()
            .attachment_id(attachment_id)
            .delete_on_termination(true)
            .build();
        self.call("ModifyNetworkInterfaceAttribute", || {
            self.client
                .modify_network_interface_attribute()
                .network_interface_id(eni_id)
                .attachment(change.clone())
                .send()
        })
        .await
        .map(drop)
    }

    async fn set_security_groups(&self, eni_id: &str, groups: &[String]) -> Result<(), Ec2Error> {
        self.call("ModifyNetworkInterfaceAttribute", || {
            self.client
                .modify_network_interface_attribute()
                .network_interface_id(eni_id)
                .set_groups(Some(groups.to_vec()))
                .send()
        })
        .await
        .map(drop)
    }

    async fn assign(&self, eni_id: &str, req: AddressRequest) -> Result<Vec<Ipv4Net>, Ec2Error> {
        let call = self
            .client
            .assign_private_ip_addresses()
            .network_interface_id(eni_id);
        let call = match req {
            AddressRequest::Ips(n) => call.secondary_private_ip_address_count(count_i32(n)),
            AddressRequest::Prefixes(n) => call.ipv4_prefix_count(count_i32(n)),
        };
        let resp = self
            .call("AssignPrivateIpAddresses", || call.clone().send())
            .await?;
        let ips = resp
            .assigned_private_ip_addresses()
            .iter()
            .filter_map(|a| parse_ip(a.private_ip_address()))
            .map(Ipv4Net::from);
        let prefixes = resp
            .assigned_ipv4_prefixes()
            .iter()
            .filter_map(|p| p.ipv4_prefix()?.parse().ok());
        Ok(ips.chain(prefixes).collect())
    }

    async fn assign_ipv6_prefixes(
        &self,
        eni_id: &str,
        count: u32,
    ) -> Result<Vec<Ipv6Net>, Ec2Error> {
        let call = self
            .client
            .assign_ipv6_addresses()
            .network_interface_id(eni_id)
            .ipv6_prefix_count(count_i32(count));
        let resp = self
            .call("AssignIpv6Addresses", || call.clone().send())
            .await?;
        Ok(resp
            .assigned_ipv6_prefixes()
            .iter()
            .filter_map(|p| p.parse().ok())
            .collect())
    }

    /// One request per try (see `SdkEc2::call_once_per_try` and the port's contract): an
    /// `UnassignPrivateIpAddresses` EC2 applied and whose answer was lost must not come back as
    /// `RequestLimitExceeded` from a retry. /32s and prefixes go in two calls; when the first was
    /// applied, a refusal of the second is no longer "nothing applied".
    async fn unassign(&self, eni_id: &str, cidrs: &[Ipv4Net]) -> Result<(), Ec2Error> {
        let (ips, prefixes) = split_cidrs(cidrs);
        let mut applied = false;
        if !ips.is_empty() {
            let call = self
                .client
                .unassign_private_ip_addresses()
                .network_interface_id(eni_id)
                .set_private_ip_addresses(Some(ips.iter().map(ToString::to_string).collect()));
            self.call_once_per_try("UnassignPrivateIpAddresses", |once| {
                call.clone().customize().config_override(once).send()
            })
            .await?;
            applied = true;
        }
        if !prefixes.is_empty() {
            let call = self
                .client
                .unassign_private_ip_addresses()
                .network_interface_id(eni_id)
                .set_ipv4_prefixes(Some(prefixes.iter().map(ToString::to_string).collect()));
            let r = self
                .call_once_per_try("UnassignPrivateIpAddresses", |once| {
                    call.clone().customize().config_override(once).send()
                })
                .await;
            return match r {
                Err(Ec2Error::NotApplied(last)) if applied => Err(*last),
                other => other.map(drop),
            };
        }
        Ok(())
    }

    async fn detach_eni(&self, attachment_id: &str) -> Result<(), Ec2Error> {
        self.call("DetachNetworkInterface", || {
            self.client
                .detach_network_interface()
                .attachment_id(attachment_id)
                .force(false)
                .send()
        })
        .await
        .map(drop)
    }

    async fn delete_eni(&self, eni_id: &str) -> Result<(), Ec2Error> {
        self.call("DeleteNetworkInterface", || {
            self.client
                .delete_network_interface()
                .network_interface_id(eni_id)
                .send()
        })
        .await
        .map(drop)
    }

    async fn create_tags(&self, eni_id: &str, tags: &Tags) -> Result<(), Ec2Error> {
        if tags.is_empty() {
            return Ok(());
        }
        self.call("CreateTags", || {
            self.client
                .create_tags()
                .resources(eni_id)
                .set_tags(Some(sdk_tags(tags)))
                .send()
        })
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use aws_sdk_ec2::operation::unassign_private_ip_addresses::UnassignPrivateIpAddressesError as UnassignError;

    use super::*;

    type Answer = Result<(), SdkError<UnassignError, HttpResponse>>;

    #[test]
    fn imds_gets_tls_only_for_an_explicit_https_endpoint() {
        assert!(!imds_needs_tls(None), "the default endpoint is plain HTTP");
        assert!(!imds_needs_tls(Some("http://169.254.169.254")));
        assert!(!imds_needs_tls(Some("http://[fd00:ec2::254]:80")));
        assert!(imds_needs_tls(Some("https://imds.example:8443")));
        assert!(imds_needs_tls(Some(" HTTPS://imds.example")));
        assert!(!imds_needs_tls(Some("https")), "too short to be a URL");
    }

    fn ec2() -> SdkEc2 {
        let conf = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-west-2"))
            .build();
        SdkEc2 {
            client: aws_sdk_ec2::Client::from_conf(conf),
            bucket: Arc::new(TokenBucket::default()),
            metrics: AwsMetrics::default(),
            unauthorized: None,
        }
    }

    /// What EC2 answers one request.
    #[derive(Debug, Clone, Copy)]
    enum Fate {
        Applied,
        /// `RequestLimitExceeded`, before acting.
        Throttled,
        /// `UnauthorizedOperation`, before acting.
        Denied,
        /// No answer (a timeout): EC2 may have applied it.
        Lost,
    }

    /// EC2's answer to one request whose fate is `fate`, as the SDK hands it over.
    fn answer(fate: Fate) -> std::future::Ready<Answer> {
        let refused = |code: &str, status: u16| {
            let status =
                aws_smithy_runtime_api::http::StatusCode::try_from(status).expect("a status");
            let err = UnassignError::generic(
                aws_sdk_ec2::error::ErrorMetadata::builder()
                    .code(code)
                    .build(),
            );
            SdkError::service_error(err, HttpResponse::new(status, "".into()))
        };
        std::future::ready(match fate {
            Fate::Applied => Ok(()),
            Fate::Throttled => Err(refused("RequestLimitExceeded", 503)),
            Fate::Denied => Err(refused("UnauthorizedOperation", 403)),
            Fate::Lost => Err(SdkError::timeout_error("attempt timeout")),
        })
    }

    /// Runs one call whose requests meet `fates` in order (the last one repeats); returns its
    /// outcome and how many requests were sent.
    async fn call(sending: Sending, fates: &[Fate]) -> (Result<(), Ec2Error>, usize) {
        let sent = Mutex::new(0usize);
        let r = ec2()
            .tries("UnassignPrivateIpAddresses", sending, |_| {
                let mut n = sent.lock().unwrap();
                let fate = fates[(*n).min(fates.len() - 1)];
                *n += 1;
                answer(fate)
            })
            .await;
        (r, sent.into_inner().unwrap())
    }

    /// Issue 38: one request per try, re-sent only after a refusal, so a refusal as the last
    /// answer is the fate of every request (`NotApplied`); a lost answer ends the call at once
    /// as the ambiguous error it is, also after refusals; with the SDK's retries inside a try
    /// a refusal proves nothing (bare `Throttled`).
    #[tokio::test(start_paused = true)]
    async fn only_a_call_whose_every_request_was_refused_reports_not_applied() {
        use Fate::{Applied, Denied, Lost, Throttled};
        let once = Sending::OneRequestPerTry;
        let (r, sent) = call(once, &[Throttled]).await;
        assert_eq!(r, Err(Ec2Error::NotApplied(Box::new(Ec2Error::Throttled))));
        assert!(
            sent > 1,
            "re-sent after each throttled answer until the budget"
        );
        let (r, sent) = call(once, &[Throttled, Denied]).await;
        assert!(
            matches!(&r, Err(Ec2Error::NotApplied(last)) if matches!(**last, Ec2Error::Unauthorized(_))),
            "{r:?}"
        );
        assert_eq!(sent, 2);
        let (r, sent) = call(once, &[Lost]).await;
        assert!(matches!(r, Err(Ec2Error::Transport(_))), "{r:?}");
        assert_eq!(sent, 1, "a lost answer is not retried");
        let (r, sent) = call(once, &[Throttled, Lost]).await;
        assert!(matches!(r, Err(Ec2Error::Transport(_))), "{r:?}");
        assert_eq!(sent, 2);
        let (r, sent) = call(once, &[Throttled, Applied]).await;
        assert_eq!((r, sent), (Ok(()), 2));
        let (r, _) = call(Sending::SdkRetries, &[Throttled]).await;
        assert_eq!(
            r,
            Err(Ec2Error::Throttled),
            "inside a try the SDK may have retried a lost answer"
        );
    }

    #[test]
    fn one_request_per_try_turns_the_sdk_retries_off() {
        let once = Sending::OneRequestPerTry.config().build();
        assert_eq!(once.retry_config().map(RetryConfig::max_attempts), Some(1));
        let retried = Sending::SdkRetries.config().build();
        assert!(
            retried.retry_config().is_none(),
            "the client's own retry configuration stays"
        );
    }
}
