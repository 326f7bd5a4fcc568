//! Parity of ipamd's two EC2 models: the in-crate fake (`ipamd::aws::fake::FakeCloud`, behind
//! the pool scenario tests) and the simulated VPC (`vpcsim`, through the SDK client and its real
//! EC2 Query API server, behind the e2e suites). One scenario through the `Ec2` port against
//! both (create an ENI, attach it, assign addresses and a /28, unassign, the instance's ENI and
//! address limits refused, detach, delete): every answer must be alike, the same errors and the
//! same resulting ENI shape. Owns only this cross-check; must not test either model's own
//! rules beyond what both promise.
#![allow(clippy::tests_outside_test_module)]

use std::sync::Arc;
use std::time::Duration;

use ipamd::aws::ec2::{AddressRequest, CreateEni, Ec2, EniQuery};
use ipamd::aws::fake::FakeCloud;
use ipamd::aws::metrics::AwsMetrics;
use ipamd::aws::sdk::{self, AwsSettings, SdkEc2};
use ipamd::aws::throttle::TokenBucket;
use ipamd::aws::{Ec2Eni, Ec2Error, EniStatus, Tags};
use ipnet::Ipv4Net;

/// What both models must agree on about an ENI: everything but the ids and addresses each
/// world picks (those are checked to be well-formed instead).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shape {
    status: EniStatus,
    description: String,
    tags: Tags,
    secondary_ips: usize,
    prefixes: Vec<u8>,
    /// (device index, network card, delete on termination)
    attachment: Option<(u32, u32, bool)>,
}

fn shape(e: &Ec2Eni) -> Shape {
    Shape {
        status: e.status,
        description: e.description.clone(),
        tags: e.tags.clone(),
        secondary_ips: e.secondary_ips.len(),
        prefixes: e.prefixes.iter().map(Ipv4Net::prefix_len).collect(),
        attachment: e
            .attachment
            .as_ref()
            .map(|a| (a.device_index, a.network_card, a.delete_on_termination)),
    }
}

/// An error as the pool would branch on it (the variant and its metric code, not the text).
fn kind(e: &Ec2Error) -> String {
    format!("{:?}/{}", std::mem::discriminant(e), e.metric_code())
}

/// Every answer of the scenario, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Eni(Shape),
    Count(usize),
    Unit,
    Refused(String),
}

fn answer<T>(r: &Result<T, Ec2Error>, ok: impl FnOnce(&T) -> Answer) -> Answer {
    match r {
        Ok(v) => ok(v),
        Err(e) => Answer::Refused(kind(e)),
    }
}

async fn described<E: Ec2>(ec2: &E, id: String) -> Result<Vec<Ec2Eni>, Ec2Error> {
    ec2.describe_enis(EniQuery::Ids(vec![id])).await
}

/// The scenario on one model. `instance`: the instance both worlds run (an m5.large: 3 ENIs,
/// 10 IPv4 addresses each).
async fn scenario<E: Ec2>(ec2: &E, instance: &str) -> Vec<(&'static str, Answer)> {
    let mut out = Vec::new();
    let attached = ec2
        .describe_enis(EniQuery::AttachedTo(instance.to_owned()))
        .await
        .expect("describe the instance's enis");
    assert_eq!(attached.len(), 1, "one primary eni at launch");
    let primary = attached[0].clone();
    out.push(("primary", Answer::Eni(shape(&primary))));
    let subnet = primary.subnet_id.clone();
    let new = |addresses| CreateEni {
        subnet_id: subnet.clone(),
        security_groups: primary.security_groups.clone(),
        description: "aws-K8S-parity".into(),
        tags: [("team".to_owned(), "parity".to_owned())].into(),
        addresses,
        conntrack: None,
    };

    // create with two secondary addresses, attach at device 1
    let created = ec2.create_eni(new(AddressRequest::Ips(2))).await;
    out.push(("create", answer(&created, |e| Answer::Eni(shape(e)))));
    let eni = created.expect("create").eni_id;
    let attach = ec2.attach_eni(&eni, instance, 1, 0).await;
    out.push(("attach", answer(&attach, |_| Answer::Unit)));
    let attachment = attach.expect("attach");
    let dot = ec2.set_delete_on_termination(&eni, &attachment).await;
    out.push(("delete-on-termination", answer(&dot, |_| Answer::Unit)));

    // three more /32s and one /28
    let ips = ec2.assign(&eni, AddressRequest::Ips(3)).await;
    out.push(("assign ips", answer(&ips, |v| Answer::Count(v.len()))));
    let ips = ips.expect("assign ips");
    let prefix = ec2.assign(&eni, AddressRequest::Prefixes(1)).await;
    out.push(("assign prefix", answer(&prefix, |v| Answer::Count(v.len()))));
    let prefix = prefix.expect("assign prefix");
    let now = described(ec2, eni.clone())
        .await
        .expect("describe")
        .remove(0);
    out.push(("after assign", Answer::Eni(shape(&now))));
    // every /28 aligned
    for p in &now.prefixes {
        assert_eq!(p.network(), p.addr(), "{p} is aligned");
    }
    assert!(ips.iter().all(|c| c.prefix_len() == 32));
    assert!(prefix.iter().all(|c| c.prefix_len() == 28));

    // the ENI's address limit: 10 addresses, the primary and 6 taken (5 /32s + one /28)
    let over = ec2.assign(&eni, AddressRequest::Ips(4)).await;
    out.push((
        "assign over the eni limit",
        answer(&over, |v| Answer::Count(v.len())),
    ));

    // unassign one /32 and the /28
    let gone: Vec<Ipv4Net> = ips[..1].iter().chain(prefix.iter()).copied().collect();
    let un = ec2.unassign(&eni, &gone).await;
    out.push(("unassign", answer(&un, |()| Answer::Unit)));
    let now = described(ec2, eni.clone())
        .await
        .expect("describe")
        .remove(0);
    out.push(("after unassign", Answer::Eni(shape(&now))));
    assert!(!now.secondary_ips.contains(&ips[0].addr()));

    // the instance's ENI limit: a third ENI attaches, a fourth is refused
    let third = ec2
        .create_eni(new(AddressRequest::Ips(0)))
        .await
        .expect("third eni")
        .eni_id;
    let a3 = ec2.attach_eni(&third, instance, 2, 0).await;
    out.push(("attach third", answer(&a3, |_| Answer::Unit)));
    let fourth = ec2
        .create_eni(new(AddressRequest::Ips(0)))
        .await
        .expect("fourth eni")
        .eni_id;
    let a4 = ec2.attach_eni(&fourth, instance, 3, 0).await;
    out.push((
        "attach over the instance limit",
        answer(&a4, |_| Answer::Unit),
    ));
    let d4 = ec2.delete_eni(&fourth).await;
    out.push(("delete the unattached", answer(&d4, |()| Answer::Unit)));

    // deleting an attached ENI is refused; detach, then delete
    let early = ec2.delete_eni(&eni).await;
    out.push((
        "delete while attached",
        Answer::Refused(match &early {
            Ok(()) => "deleted".into(),
            Err(e) => e.metric_code().to_owned(),
        }),
    ));
    let detach = ec2.detach_eni(&attachment).await;
    out.push(("detach", answer(&detach, |()| Answer::Unit)));
    let mut deleted = ec2.delete_eni(&eni).await;
    for _ in 0..50 {
        // a model may keep the ENI `detaching` for a moment
        if deleted.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        deleted = ec2.delete_eni(&eni).await;
    }
    out.push(("delete", answer(&deleted, |()| Answer::Unit)));
    let missing = described(ec2, eni).await;
    out.push((
        "describe the deleted",
        answer(&missing, |v| Answer::Count(v.len())),
    ));
    out
}

async fn vpcsim_ec2() -> (SdkEc2, String, tokio::sync::oneshot::Sender<()>) {
    let world = vpcsim::World::new(vpcsim::WorldConfig::default());
    let instance = world.run_instances("m5.large", 1).unwrap().remove(0);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(vpcsim::serve(
        listener,
        vpcsim::ec2::router(world),
        async move {
            let _ = rx.await;
        },
    ));
    let settings = AwsSettings {
        ec2_endpoint: Some(url),
        imds_endpoint: None,
        region: Some("us-west-2".into()),
        http_timeout: Some(Duration::from_secs(5)),
        max_attempts: Some(3),
        static_credentials: Some(("AKIDEXAMPLE".into(), "secret".into())),
        version: Some("v1.23.1-test".into()),
    };
    let ec2 = SdkEc2::new(
        &settings,
        sdk::http_client(),
        None,
        Arc::new(TokenBucket::default()),
        AwsMetrics::default(),
    )
    .await;
    (ec2, instance, stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_and_vpcsim_answer_one_eni_lifecycle_alike() {
    let fake = FakeCloud::m5_large();
    let on_fake = scenario(&fake, &fake.instance_id()).await;
    let (sim, instance, _stop) = vpcsim_ec2().await;
    let on_vpcsim = scenario(&sim, &instance).await;
    assert_eq!(on_fake.len(), on_vpcsim.len());
    for ((step, f), (_, v)) in on_fake.iter().zip(&on_vpcsim) {
        assert_eq!(f, v, "step {step:?}: the fake answered {f:?}, vpcsim {v:?}");
    }
    // and the answers are the ones the pool relies on
    let get = |step: &str| on_fake.iter().find(|(s, _)| *s == step).unwrap().1.clone();
    assert_eq!(
        get("assign over the eni limit"),
        Answer::Refused(kind(&Ec2Error::AddressLimit))
    );
    assert_eq!(
        get("attach over the instance limit"),
        Answer::Refused(kind(&Ec2Error::AttachmentLimit))
    );
    assert!(matches!(get("describe the deleted"), Answer::Refused(_)));
}
