//! An AddNetwork that found the pool empty must take an address as soon as one is assignable,
//! whoever made it so: a DelNetwork, or time (cooldown expiry) noticed by the pool manager. Runs
//! on a paused tokio clock: a waiter nobody wakes runs into its deadline at once and the test
//! fails; nothing here depends on how fast the machine is.
#![allow(clippy::tests_outside_test_module)]
use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{TestClock, settings, spec, targets};
use ipamd::aws::memory::MemoryProvider;
use ipamd::datastore::checkpoint::MemoryCheckpoint;
use ipamd::datastore::{IpamKey, PodMetadata};
use ipamd::ipam::{Ipam, IpamSettings};
use ipamd::pool::manager::Manager;

const WAIT: Duration = Duration::from_secs(60);

async fn ipam(
    settings: IpamSettings,
    cooldown: Duration,
    clock: Arc<TestClock>,
) -> (Arc<Ipam>, MemoryProvider) {
    let provider = MemoryProvider::from_spec(spec("198.18.0.0/24", 1, 3));
    let (ipam, _) = common::start_with_cooldown(
        provider.clone(),
        settings,
        cooldown,
        Box::new(MemoryCheckpoint::new()),
        vec![],
        clock,
    )
    .await;
    (ipam, provider)
}

fn key(c: &str) -> IpamKey {
    IpamKey::new("aws-cni", c, "eth0")
}

fn meta(c: &str) -> PodMetadata {
    PodMetadata {
        namespace: "default".into(),
        name: format!("pod-{c}"),
        interfaces_count: 0,
    }
}

/// Spawns an AddNetwork for `c` and lets it run until it waits.
async fn waiting_add(
    ipam: &Arc<Ipam>,
    c: &'static str,
) -> tokio::task::JoinHandle<Result<std::net::Ipv4Addr, String>> {
    let i = ipam.clone();
    let task = tokio::spawn(async move {
        i.add(&key(c), meta(c))
            .await
            .map(|a| a.ip)
            .map_err(|e| e.to_string())
    });
    for _ in 0..100 {
        if ipam.signal.waiting_pods() == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(ipam.signal.waiting_pods(), 1, "the add for {c} is waiting");
    task
}

#[tokio::test(start_paused = true)]
async fn a_waiting_add_takes_the_address_a_del_frees() {
    // One ENI, one secondary address, no cooldown, no manager running after the first fill:
    // only the DEL can give "b" an address.
    let (ipam, provider) = ipam(
        settings(targets(1, 1, 1), WAIT),
        Duration::ZERO,
        TestClock::new(),
    )
    .await;
    Manager::new(provider.clone()).settle(&ipam).await;
    let a = ipam.add(&key("a"), meta("a")).await.unwrap().ip;
    let b = waiting_add(&ipam, "b").await;
    ipam.del(&key("a"), "default", "pod-a", "PodDeleted")
        .unwrap();
    assert_eq!(b.await.unwrap(), Ok(a), "b gets a's address, not a timeout");
}

#[tokio::test(start_paused = true)]
async fn a_waiting_add_is_woken_when_the_manager_finds_an_address_free() {
    // Provisioning disabled (the pool can neither grow nor report a limit) and the only
    // address is cooling: "b" waits; once the cooldown has passed, the manager's next round
    // must hand the address to the waiter instead of leaving it to its deadline.
    let clock = TestClock::new();
    let mut s = settings(targets(1, 1, 1), WAIT);
    s.provisioning = false;
    let (ipam, provider) = ipam(s, Duration::from_secs(30), clock.clone()).await;
    let eni = ipam.index.read(|ds| ds.stats(ipam.now())).enis[0]
        .id
        .clone();
    assert!(
        ipam.index
            .add_assigned(&eni, &["198.18.0.50/32".parse().unwrap()])
            .is_empty()
    );
    let a = ipam.add(&key("a"), meta("a")).await.unwrap().ip;
    ipam.del(&key("a"), "default", "pod-a", "PodDeleted")
        .unwrap();
    let b = waiting_add(&ipam, "b").await;
    // Still cooling: the manager finds nothing to do and nothing to hand out.
    Manager::new(provider.clone()).settle(&ipam).await;
    tokio::task::yield_now().await;
    assert!(!b.is_finished(), "nothing is assignable yet");
    clock.advance(Duration::from_secs(31));
    Manager::new(provider.clone()).settle(&ipam).await;
    assert_eq!(
        b.await.unwrap(),
        Ok(a),
        "b gets the cooled address, not a timeout"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_with_nothing_assignable_still_times_out() {
    // The negative control: with nothing ever freed, the waiter fails at its deadline with the
    // typed error (and the manager's rounds do not spin it).
    let mut s = settings(targets(1, 1, 1), WAIT);
    s.provisioning = false;
    let (ipam, provider) = ipam(s, Duration::from_secs(30), TestClock::new()).await;
    let b = waiting_add(&ipam, "b").await;
    Manager::new(provider.clone()).settle(&ipam).await;
    let err = b.await.unwrap().unwrap_err();
    // nothing under way, no cause known (NoAvailableAddress), and it says where to look
    assert!(
        err.starts_with("no free address after waiting 60s and no pool growth under way")
            && err.contains("DISABLE_NETWORK_RESOURCE_PROVISIONING"),
        "{err}"
    );
    assert_eq!(ipam.signal.waiting_pods(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_outlasts_its_timeout_while_an_attached_eni_waits_for_its_host_setup() {
    // The node's only ENI is attached in EC2 but its link has not appeared yet (host set-up
    // pending, its addresses held back) and no pool action runs: "b" must keep waiting past
    // its 10 s timeout (the fleet's brown-out: ADDs failed while a new ENI's link was on its
    // way) and take the address once the set-up succeeded.
    let mut s = settings(targets(1, 1, 1), Duration::from_secs(10));
    s.provisioning = false;
    let (ipam, provider) = ipam(s, Duration::ZERO, TestClock::new()).await;
    Manager::new(provider.clone()).settle(&ipam).await;
    let eni = ipam.index.read(|ds| ds.stats(ipam.now())).enis[0]
        .id
        .clone();
    assert!(
        ipam.index
            .add_assigned(&eni, &["198.18.0.50/32".parse().unwrap()])
            .is_empty()
    );
    ipam.index.hold_back_host(std::slice::from_ref(&eni));
    assert!(ipam.pool_in_flight(), "the host set-up counts as in flight");
    let b = waiting_add(&ipam, "b").await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!b.is_finished(), "b still waits 30 s in (timeout 10 s)");
    assert!(ipam.index.mark_host_ready(&eni));
    ipam.signal.publish(None);
    b.await
        .unwrap()
        .expect("b gets an address of the readied ENI, not a timeout");
    assert!(!ipam.pool_in_flight());
}

#[tokio::test(start_paused = true)]
async fn a_host_setup_that_never_succeeds_fails_the_waiter_at_the_busy_cap() {
    // The negative control: the link never appears; the waiter fails with the typed error
    // after BUSY_POOL_WAIT, not before its timeout's multiple and not never.
    let mut s = settings(targets(1, 1, 1), Duration::from_secs(10));
    s.provisioning = false;
    let (ipam, provider) = ipam(s, Duration::ZERO, TestClock::new()).await;
    Manager::new(provider.clone()).settle(&ipam).await;
    let eni = ipam.index.read(|ds| ds.stats(ipam.now())).enis[0]
        .id
        .clone();
    ipam.index.hold_back_host(std::slice::from_ref(&eni));
    let t0 = tokio::time::Instant::now();
    let b = waiting_add(&ipam, "b").await;
    let err = b.await.unwrap().unwrap_err();
    // PoolWarming: what it waited for, and how long
    assert!(
        err.starts_with("waited 100s for an ENI being attached"),
        "{err}"
    );
    let waited = t0.elapsed();
    assert!(
        waited >= ipamd::ipam::BUSY_POOL_WAIT && waited < ipamd::ipam::BUSY_POOL_WAIT * 2,
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_limit_reported_while_an_eni_waits_for_its_host_setup_does_not_fail_the_waiter() {
    // The node is at its ENI limit and the last ENI's link has not appeared yet: the policy
    // counts its held-back addresses as taken and reports the instance limit, but they are on
    // their way; the waiter must not fail with the limit (the fleet's brown-out: 96 ADDs did).
    let mut s = settings(targets(1, 1, 1), Duration::from_secs(10));
    s.provisioning = false;
    let (ipam, provider) = ipam(s, Duration::ZERO, TestClock::new()).await;
    Manager::new(provider.clone()).settle(&ipam).await;
    let eni = ipam.index.read(|ds| ds.stats(ipam.now())).enis[0]
        .id
        .clone();
    assert!(
        ipam.index
            .add_assigned(&eni, &["198.18.0.50/32".parse().unwrap()])
            .is_empty()
    );
    ipam.index.hold_back_host(std::slice::from_ref(&eni));
    let b = waiting_add(&ipam, "b").await;
    ipam.signal
        .publish(Some(ipamd::ipam::IpamError::InstanceLimit(
            ipamd::ipam::LimitCause::EnisFull,
        )));
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        !b.is_finished(),
        "the limit does not fail b while the ENI's host set-up is pending"
    );
    assert!(ipam.index.mark_host_ready(&eni));
    ipam.signal.publish(None);
    b.await
        .unwrap()
        .expect("b gets an address of the readied ENI");
}

/// Issue 29 item 5: the node is at its ENI limit and its only free address is cooling down
/// after a release. A waiter whose deadline comes after the cooldown waits for it (the limit
/// ends by itself) and gets the address; one whose deadline comes first is told so, with
/// when the first address is free again, instead of only "every ENI is full" (which sent
/// operators to the wrong fix).
#[tokio::test(start_paused = true)]
async fn a_limit_made_of_cooling_addresses_is_waited_out_or_named_as_such() {
    for wait in [Duration::from_secs(60), Duration::from_secs(10)] {
        let clock = TestClock::new();
        let (ipam, provider) = ipam(
            settings(targets(1, 1, 1), wait),
            Duration::from_secs(30),
            clock.clone(),
        )
        .await;
        let mut manager = Manager::new(provider.clone());
        manager.settle(&ipam).await;
        let a = ipam.add(&key("a"), meta("a")).await.unwrap().ip;
        ipam.del(&key("a"), "default", "pod-a", "PodDeleted")
            .unwrap();
        let b = waiting_add(&ipam, "b").await;
        // The policy is blocked by the ENI limit; the address frees in 30 s.
        manager.settle(&ipam).await;
        tokio::task::yield_now().await;
        if wait > Duration::from_secs(30) {
            assert!(!b.is_finished(), "b waits for the cooldown, not fails");
            clock.advance(Duration::from_secs(31));
            manager.settle(&ipam).await;
            assert_eq!(b.await.unwrap(), Ok(a), "b gets the cooled address");
        } else {
            let err = b.await.unwrap().unwrap_err();
            assert!(
                err.contains("every ENI is full")
                    && err.contains("cooling down after their release")
                    && err.contains("IP_COOLDOWN_PERIOD=30s")
                    && err.contains("free again in 30s"),
                "{err}"
            );
        }
    }
}

/// Issue 29: a waiter whose wait ends with nothing is told why, as precisely as known: the
/// pool's last failure that is no hard limit (here EC2 refusing for a missing IAM permission,
/// naming the action), else what was still under way (`PoolWarming`, how long it waited), else
/// that nothing was (`NoAvailableAddress`).
#[tokio::test(start_paused = true)]
async fn a_wait_that_ends_with_nothing_names_why() {
    use ipamd::ipam::IpamError;
    use ipamd::pool::ec2_port::{PrefixShortage, ProviderError, SubnetShortage};
    let wait = Duration::from_secs(10);
    let (ipam, _provider) = ipam(
        settings(targets(1, 1, 1), wait),
        Duration::ZERO,
        TestClock::new(),
    )
    .await;
    // The pool's last action failed for lack of a permission: the waiter keeps waiting (a
    // policy may be fixed meanwhile), then is given that reason.
    let (failure, hard) = IpamError::from_pool_failure(&ProviderError::Unauthorized {
        action: "ec2:AssignPrivateIpAddresses".into(),
    });
    assert!(!hard);
    let b = waiting_add(&ipam, "b").await;
    ipam.signal.publish_failure(failure);
    let err = b.await.unwrap().unwrap_err();
    // what happened here; what to do is added at the rpc edge (rpc::GUIDANCE)
    assert!(
        err.contains("EC2 denied ec2:AssignPrivateIpAddresses"),
        "{err}"
    );
    assert!(
        ipamd::rpc::guidance(ipamd_proto::ErrorReason::Ec2Unauthorized)
            .is_some_and(|g| g.contains("IAM policy"))
    );
    // A pool change clears it: nothing in flight, nothing known.
    ipam.signal.publish(None);
    let err = ipam.add(&key("c"), meta("c")).await.unwrap_err();
    assert!(matches!(err, IpamError::NoAvailableAddress(_)), "{err:?}");
    // A pool action in flight that never ends: the waiter outlasts its timeout for it, up to
    // BUSY_POOL_WAIT, and is told it waited for the pool to grow.
    let busy = ipam.signal.pool_action();
    let started = tokio::time::Instant::now();
    let err = ipam.add(&key("d"), meta("d")).await.unwrap_err();
    drop(busy);
    assert!(
        matches!(err, IpamError::PoolWarming { waited, .. } if waited >= Duration::from_secs(99)),
        "{err:?}"
    );
    assert!(started.elapsed() >= ipamd::ipam::BUSY_POOL_WAIT);
    // Limits decided by EC2 fail at once and keep their own reason.
    for (e, code) in [
        (
            ProviderError::NoFreePrefix(PrefixShortage {
                subnet: "subnet-1".into(),
            }),
            "no free /28 prefix",
        ),
        (
            ProviderError::SubnetExhausted(SubnetShortage {
                subnets: vec!["subnet-1".into()],
                backing_off: false,
            }),
            "subnet exhausted",
        ),
    ] {
        let (limit, hard) = IpamError::from_pool_failure(&e);
        assert!(hard);
        assert!(limit.to_string().starts_with(code), "{limit}");
    }
}
