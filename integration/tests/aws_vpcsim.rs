//! The SDK implementations of ipamd's `Ec2`/`Imds` ports (aws-sdk-ec2 over rustls, aws-config
//! IMDSv2 over plain HTTP) against the simulated VPC's real HTTP servers on 127.0.0.1:0:
//! request encoding, XML decoding, error-code translation, filters, pagination, and the
//! EC2 provider's ENI lifecycle end to end at the API level. No namespaces needed.
#![allow(clippy::tests_outside_test_module)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ipamd::aws::ec2::{AddressRequest, CreateEni, Ec2, EniQuery};
use ipamd::aws::imds::Imds;
use ipamd::aws::metrics::AwsMetrics;
use ipamd::aws::provider::{Ec2Provider, ProviderSettings};
use ipamd::aws::sdk::{self, AwsSettings, SdkEc2, SdkImds};
use ipamd::aws::throttle::TokenBucket;
use ipamd::aws::{ENI_DESCRIPTION_PREFIX, TAG_CREATED_AT, TAG_INSTANCE_ID, Tags};
use ipamd::pool::ec2_port::{EniProvider, NewEni, ProviderError};
use ipamd::pool::reconcile_plan::ImdsView;

struct Sim {
    world: Arc<vpcsim::World>,
    instance: String,
    ec2_url: String,
    imds_url: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn serve(router: axum::Router) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(vpcsim::serve(listener, router, async move {
        let _ = rx.await;
    }));
    (url, tx)
}

async fn sim() -> Sim {
    sim_with(false).await
}

/// A simulated VPC with one m5.large; `ipv6`: launched with an IPv6 address (dual-stack node).
async fn sim_with(ipv6: bool) -> Sim {
    let world = vpcsim::World::new(vpcsim::WorldConfig::default());
    let instance = if ipv6 {
        world.run_ipv6_instances("m5.large", 1)
    } else {
        world.run_instances("m5.large", 1)
    }
    .unwrap()
    .remove(0);
    let (ec2_url, stop) = serve(vpcsim::ec2::router(world.clone())).await;
    let (imds_url, stop2) = serve(vpcsim::imds::router(world.clone(), instance.clone())).await;
    std::mem::forget(stop2); // lives as long as the test's runtime
    Sim {
        world,
        instance,
        ec2_url,
        imds_url,
        _stop: stop,
    }
}

async fn clients(s: &Sim, metrics: AwsMetrics) -> (SdkEc2, SdkImds) {
    let settings = AwsSettings {
        ec2_endpoint: Some(s.ec2_url.clone()),
        imds_endpoint: Some(s.imds_url.clone()),
        region: Some("us-west-2".into()),
        http_timeout: Some(Duration::from_secs(5)),
        max_attempts: Some(3),
        static_credentials: Some(("AKIDEXAMPLE".into(), "secret".into())),
        version: Some("v1.23.1-test".into()),
    };
    let http = sdk::http_client();
    let imds = SdkImds::new(&settings, http.clone()).unwrap();
    let ec2 = SdkEc2::new(
        &settings,
        http,
        None,
        Arc::new(TokenBucket::default()),
        metrics,
    )
    .await;
    (ec2, imds)
}

fn provider(ec2: SdkEc2, imds: SdkImds) -> Ec2Provider<SdkEc2, SdkImds> {
    Ec2Provider::new(
        Arc::new(ec2),
        Arc::new(imds),
        ProviderSettings::upstream("demo".into(), Tags::new()),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn imds_client_reads_identity_and_enis_from_the_simulator() {
    let s = sim().await;
    let (_, imds) = clients(&s, AwsMetrics::default()).await;
    let id = imds.identity().await.unwrap();
    assert_eq!(id.instance_id, s.instance);
    assert_eq!(id.instance_type, "m5.large");
    assert_eq!(id.region, "us-west-2");
    let enis = imds.enis().await.unwrap();
    assert_eq!(enis.len(), 1);
    assert_eq!(enis[0].device_number, 0);
    assert_eq!(enis[0].mac, id.primary_mac);
    assert!(enis[0].subnet_cidr.contains(&enis[0].primary_ip));
    assert!(!enis[0].vpc_cidrs.is_empty());
}

/// IPv6 mode's EC2/IMDS calls through the SDK: IMDS `ipv6s` and `vpc-ipv6-cidr-blocks`,
/// `AssignIpv6Addresses` with `Ipv6PrefixCount` (a /80 inside the subnet's /64),
/// `Ipv6Prefixes` in `DescribeNetworkInterfaces`, and the provider delegating only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_prefix_through_the_sdk_and_the_provider() {
    let s = sim_with(true).await;
    let (ec2, imds) = clients(&s, AwsMetrics::default()).await;
    let enis = imds.enis().await.unwrap();
    let (vpc6, subnet6, node6, primary) = s.world.read(|st| {
        let e = st
            .enis
            .values()
            .find(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.instance_id == s.instance)
            })
            .unwrap();
        (
            st.vpc.ipv6_cidr.unwrap(),
            st.subnets[&e.subnet_id].ipv6_cidr.unwrap(),
            e.ipv6_addresses.clone(),
            e.id.clone(),
        )
    });
    assert_eq!(enis[0].ipv6s, node6);
    assert_eq!(enis[0].vpc_ipv6_cidrs, vec![vpc6]);
    let described = ec2
        .describe_enis(EniQuery::Ids(vec![primary.clone()]))
        .await
        .unwrap();
    assert!(described[0].ipv6_prefixes.is_empty());
    assert_eq!(described[0].ipv6_addresses, node6);

    let p = provider(ec2.clone(), imds);
    let node = p.node_network().await.unwrap();
    assert_eq!(node.vpc_v6_cidrs, vec![vpc6]);
    assert_eq!(node.primary_ipv6, node6.first().copied());
    let prefix = p.ipv6_prefix(&primary).await.unwrap();
    assert_eq!(prefix.prefix_len(), 80);
    assert!(subnet6.contains(&prefix), "{prefix} in {subnet6}");
    // the second ask finds it on the ENI: no second delegation
    assert_eq!(p.ipv6_prefix(&primary).await.unwrap(), prefix);
    let described = ec2
        .describe_enis(EniQuery::Ids(vec![primary.clone()]))
        .await
        .unwrap();
    assert_eq!(described[0].ipv6_prefixes, vec![prefix]);
    let more = ec2.assign_ipv6_prefixes(&primary, 1).await.unwrap();
    assert_eq!(more.len(), 1);
    assert_ne!(more[0], prefix);
    assert!(matches!(
        ec2.assign_ipv6_prefixes("eni-00000000", 1).await,
        Err(ipamd::aws::Ec2Error::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eni_lifecycle_through_the_sdk_and_the_provider() {
    let s = sim().await;
    let registry = Arc::new(ipamd::metrics::Metrics::new());
    let (ec2, imds) = clients(&s, AwsMetrics::new(registry.clone())).await;
    let p = provider(ec2, imds);

    let limits = p.instance_limits().await.unwrap();
    assert_eq!((limits.max_enis, limits.ipv4_per_eni), (3, 10));
    let enis = p.list_enis().await.unwrap();
    assert_eq!(
        enis.len(),
        1,
        "one DescribeNetworkInterfaces finds the primary eni"
    );
    assert!(enis[0].is_primary);

    // create + attach with addresses in the same call
    let eni = p
        .create_eni(NewEni {
            secondary_ips: 3,
            prefixes: 0,
            placement: None,
        })
        .await
        .unwrap();
    assert_eq!(eni.device_number, 1);
    assert_eq!(eni.secondary_ips.len(), 3);
    let described = p
        .ec2()
        .describe_enis(EniQuery::Ids(vec![eni.id.clone()]))
        .await
        .unwrap()
        .remove(0);
    assert!(described.description.starts_with(ENI_DESCRIPTION_PREFIX));
    assert_eq!(described.tags.get(TAG_INSTANCE_ID), Some(&s.instance));
    assert!(described.tags.contains_key(TAG_CREATED_AT));
    assert!(
        described
            .attachment
            .as_ref()
            .is_some_and(|a| a.delete_on_termination && a.device_index == 1)
    );

    // more addresses, prefixes, release
    let ips = p.assign_ips(&eni.id, 2).await.unwrap();
    assert_eq!(ips.len(), 2, "only the new addresses are returned");
    let prefixes = p.assign_prefixes(&enis[0].id, 1).await.unwrap();
    assert_eq!(prefixes.len(), 1);
    assert_eq!(prefixes[0].prefix_len(), 28);
    p.unassign_ips(&eni.id, &ips).await.unwrap();
    p.unassign_prefixes(&enis[0].id, &prefixes).await.unwrap();

    // IMDS (the hint) shows the new eni
    let hint = p.hinted_enis().await.unwrap();
    assert!(hint.iter().any(|e| e.id == eni.id && e.device_number == 1));

    // instance limit surfaces as a typed error
    let second = p
        .create_eni(NewEni {
            secondary_ips: 1,
            prefixes: 0,
            placement: None,
        })
        .await
        .unwrap();
    let err = p
        .create_eni(NewEni {
            secondary_ips: 1,
            prefixes: 0,
            placement: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::InstanceLimit(_)), "{err:?}");

    // free: detach then delete
    p.free_eni(&second.id).await.unwrap();
    p.free_eni(&eni.id).await.unwrap();
    assert_eq!(p.list_enis().await.unwrap().len(), 1);
    let gone = p
        .ec2()
        .describe_enis(EniQuery::Ids(vec![eni.id.clone()]))
        .await
        .unwrap_err();
    assert!(
        matches!(gone, ipamd::aws::Ec2Error::NotFound(_)),
        "{gone:?}"
    );

    let text = registry.render(ipamd::config::MetricsNaming::Upstream);
    assert!(
        text.contains("awscni_ec2api_req_count{fn=\"CreateNetworkInterface\"}"),
        "{text}"
    );
    assert!(text.contains("awscni_aws_api_latency_ms"), "{text}");
    assert!(
        text.contains("awscni_ec2api_error_count{fn=\"AttachNetworkInterface\"}")
            || text.contains("awscni_aws_api_error_count"),
        "{text}"
    );
    drop(s.world);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_eni_cleanup_and_tagging_against_the_simulator() {
    let s = sim().await;
    let (ec2, imds) = clients(&s, AwsMetrics::default()).await;
    let p = provider(ec2, imds);
    p.list_enis().await.unwrap();
    let now = SystemTime::now();
    let create = |age: u64| CreateEni {
        subnet_id: String::new(),
        security_groups: vec![],
        description: format!("{ENI_DESCRIPTION_PREFIX}i-gone"),
        tags: p.new_eni_tags("i-gone", now - Duration::from_secs(age)),
        addresses: AddressRequest::Ips(0),
        conntrack: None,
    };
    let subnet = p.list_enis().await.unwrap()[0].subnet_id.clone();
    let mut old = create(600);
    old.subnet_id = subnet.clone();
    let mut young = create(60);
    young.subnet_id = subnet;
    let old = p.ec2().create_eni(old).await.unwrap();
    let young = p.ec2().create_eni(young).await.unwrap();
    let deleted = p.cleanup_leaked(now).await.unwrap();
    assert_eq!(deleted, vec![old.eni_id]);
    assert!(
        p.ec2()
            .describe_enis(EniQuery::Ids(vec![young.eni_id]))
            .await
            .is_ok()
    );
}

/// A throttled answer is retried by the node-wide back-off only, never also by the SDK's own
/// retries (which would send up to `max_attempts` requests into the account's empty bucket for
/// each of the node's tries): every request EC2 saw is one try ipamd counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_call_is_one_request_per_node_level_try() {
    let s = sim().await;
    let registry = Arc::new(ipamd::metrics::Metrics::new());
    let (ec2, _) = clients(&s, AwsMetrics::new(registry.clone())).await;
    let mut k = s.world.knobs();
    k.throttle.enabled = true;
    // the Describe bucket holds 2 requests and refills one every 2.5 s
    k.throttle.scale = 0.02;
    s.world.set_knobs(k);
    for _ in 0..4 {
        ec2.describe_enis(EniQuery::AttachedTo(s.instance.clone()))
            .await
            .expect("a throttled describe succeeds after the node's back-off");
    }
    let seen = s.world.api_counts();
    let sent = seen
        .iter()
        .filter(|(api, _)| api.starts_with("DescribeNetworkInterfaces"))
        .fold((0, 0), |(a, t), (_, c)| (a + c.accepted, t + c.throttled));
    assert!(sent.1 > 0, "nothing was throttled: {seen:?}");
    let text = registry.render(ipamd::config::MetricsNaming::Upstream);
    let tries: f64 = text
        .lines()
        .find(|l| l.starts_with("awscni_ec2api_req_count{fn=\"DescribeNetworkInterfaces\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no request count in\n{text}"));
    assert_eq!(
        f64::from(u32::try_from(sent.0 + sent.1).unwrap()),
        tries,
        "requests EC2 saw (accepted, throttled) = {sent:?}"
    );
}

/// Issue 38 (H1): EC2 applies an `UnassignPrivateIpAddresses`, its answer is lost (the
/// connection drops mid-answer), and the account's bucket is empty by then. A client that
/// retried the call on its own (the SDK's standard mode retries a lost answer) got
/// `RequestLimitExceeded` for the retry and reported the call as throttled, which the pool
/// manager took for "EC2 did nothing" and put the released address back into the pool while
/// EC2 could give it to another node. The unassign is sent as one request per try: the lost
/// answer is what the caller learns, an error that does not say "not applied".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unassign_whose_answer_was_lost_is_not_reported_as_refused() {
    let s = sim().await;
    let (ec2, imds) = clients(&s, AwsMetrics::default()).await;
    let p = provider(ec2, imds);
    let primary = p.list_enis().await.unwrap().remove(0).id;
    let ips = p.assign_ips(&primary, 2).await.unwrap();
    let mut k = s.world.knobs();
    k.lost_answer_rate = 1.0;
    k.throttle.enabled = true;
    // one more mutating request goes through, then none for the rest of the test
    k.throttle.mutate.capacity = 1;
    k.throttle.mutate.refill_per_sec = 0.001;
    s.world.set_knobs(k);
    let before = s
        .world
        .api_counts()
        .get("UnassignPrivateIpAddresses")
        .map_or(0, |c| c.accepted + c.throttled);
    let err = p
        .unassign_ips(&primary, &ips[..1])
        .await
        .expect_err("the answer was lost");
    s.world.set_knobs(vpcsim::Knobs::default());
    let listed = p
        .ec2()
        .describe_enis(EniQuery::Ids(vec![primary.clone()]))
        .await
        .unwrap()
        .remove(0)
        .secondary_ips;
    assert!(!listed.contains(&ips[0]), "EC2 applied the unassign");
    assert!(
        !err.certainly_not_applied(),
        "an unassign EC2 applied is reported as one it certainly did not apply: {err:?}"
    );
    let sent = s
        .world
        .api_counts()
        .get("UnassignPrivateIpAddresses")
        .map_or(0, |c| c.accepted + c.throttled)
        - before;
    assert_eq!(sent, 1, "one request for one try: no transparent retry");
}

/// The other side: an unassign EC2 refused before acting on it (here IAM denies it) is reported
/// as such, so the pool keeps the address instead of holding it out for the reconcile cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unassign_refused_before_ec2_acted_is_reported_as_not_applied() {
    let s = sim().await;
    let (ec2, imds) = clients(&s, AwsMetrics::default()).await;
    let p = provider(ec2, imds);
    let primary = p.list_enis().await.unwrap().remove(0).id;
    let ips = p.assign_ips(&primary, 1).await.unwrap();
    let mut k = s.world.knobs();
    k.denied_actions = vec!["UnassignPrivateIpAddresses".into()];
    s.world.set_knobs(k);
    let err = p.unassign_ips(&primary, &ips).await.expect_err("denied");
    assert!(err.certainly_not_applied(), "{err:?}");
    assert!(matches!(err, ProviderError::NotApplied(_)), "{err:?}");
}

/// `HTTP_TIMEOUT` (upstream: the EC2 client's per-request timeout, seconds, at least 10) bounds
/// each EC2 attempt: the variable reaches the SDK settings (`node_init::aws_settings`), and an
/// EC2 slower than the timeout fails the call while a longer timeout lets it answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_timeout_bounds_each_ec2_attempt() {
    let env = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let config = ipamd::config::Config::from_env_map(&env(&[
        ("ENABLE_IPv4", "true"),
        ("HTTP_TIMEOUT", "30"),
    ]))
    .unwrap();
    assert_eq!(
        ipamd::node_init::aws_settings(&config).http_timeout,
        Some(Duration::from_secs(30))
    );
    let default = ipamd::config::Config::from_env_map(&env(&[("ENABLE_IPv4", "true")])).unwrap();
    assert_eq!(
        ipamd::node_init::aws_settings(&default).http_timeout,
        Some(Duration::from_secs(10))
    );

    let s = sim().await;
    let mut knobs = s.world.knobs();
    knobs.latency_ms = 1500;
    s.world.set_knobs(knobs);
    let ec2_with = async |timeout: u64| {
        let settings = AwsSettings {
            ec2_endpoint: Some(s.ec2_url.clone()),
            region: Some("us-west-2".into()),
            http_timeout: Some(Duration::from_secs(timeout)),
            max_attempts: Some(1),
            static_credentials: Some(("AKIDEXAMPLE".into(), "secret".into())),
            ..AwsSettings::default()
        };
        SdkEc2::new(
            &settings,
            sdk::http_client(),
            None,
            Arc::new(TokenBucket::default()),
            AwsMetrics::default(),
        )
        .await
    };
    let short = ec2_with(1).await;
    let long = ec2_with(3).await;
    let query = || EniQuery::AttachedTo(s.instance.clone());
    assert!(
        short.describe_enis(query()).await.is_err(),
        "a 1.5 s EC2 answer exceeds a 1 s HTTP_TIMEOUT"
    );
    assert_eq!(
        long.describe_enis(query()).await.unwrap().len(),
        1,
        "a 3 s HTTP_TIMEOUT waits for it"
    );
}
