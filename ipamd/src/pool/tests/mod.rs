//! Scenario tests of the pool manager + reconciler driving the EC2 provider against the
//! stateful fake cloud (limits, fragmentation, IMDS lag and omissions enforced there). One test
//! per pain point of the reference (§2: 1, 3, 5, 6, 7, 8, 10). Test-only. This file holds the
//! fixtures and the growth/reconcile scenarios; `failures.rs` the EC2 and host failures,
//! `churn.rs` the spare ENI's hold under pod churn, `restore.rs` restore and custom networking,
//! `calls.rs` the EC2 calls a node at rest makes (none). (Subnet discovery, exclusion and
//! connection tracking at the provider alone: `aws::provider::tests`.) Must not: be compiled
//! outside `cfg(test)`; `crate::aws` must not reach back into these fixtures.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;

use crate::aws::Ec2Eni;
use crate::aws::ec2::{AddressRequest, Ec2, EniQuery};
use crate::aws::error::Ec2Error;
use crate::aws::fake::{FakeCloud, PRIMARY_ENI};
use crate::aws::provider::{Ec2Provider, ProviderSettings};
use crate::aws::{
    ENI_DESCRIPTION_PREFIX, TAG_CLUSTER_NAME, TAG_CREATED_AT, TAG_ENI_OWNER, TAG_INSTANCE_ID,
    TAG_NO_MANAGE, Tags,
};
use crate::datastore::checkpoint::MemoryCheckpoint;
use crate::datastore::{IpamKey, PodMetadata};
use crate::ipam::{Clock, Ipam, IpamError, IpamSettings};
use crate::metrics::Metrics;
use crate::pool::ec2_port::NodeDescription;
use crate::pool::ec2_port::{AttachedEni, EniProvider};
use crate::pool::host_port::{EniHost, EniHostError};
use crate::pool::manager::Manager;
use crate::pool::policy::Targets;
use crate::pool::reconciler::{Outcome, Reconciler};

type Provider = Ec2Provider<FakeCloud, FakeCloud>;

#[derive(Debug)]
struct ManualClock(Mutex<SystemTime>);

impl ManualClock {
    fn advance(&self, d: Duration) {
        *self.0.lock().unwrap() += d;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

/// Host networking that only records what it was asked to do.
#[derive(Debug, Default)]
struct RecordingHost {
    torn_down: Mutex<Vec<AttachedEni>>,
}

impl EniHost for RecordingHost {
    async fn setup(&self, _eni: &AttachedEni) -> Result<Option<u32>, EniHostError> {
        Ok(None)
    }
    async fn teardown(&self, eni: &AttachedEni) -> Result<(), EniHostError> {
        self.torn_down.lock().unwrap().push(eni.clone());
        Ok(())
    }
}

struct Node {
    host: RecordingHost,
    cloud: FakeCloud,
    ipam: Arc<Ipam>,
    clock: Arc<ManualClock>,
    manager: Manager<Provider>,
    reconciler: Reconciler,
}

fn targets(pd: bool) -> Targets {
    Targets {
        warm_eni: 1,
        warm_ip: 0,
        minimum_ip: 0,
        warm_prefix: u32::from(pd),
        prefix_delegation: pd,
        max_enis: 3,
        cidrs_per_eni: 9,
        max_pods: None,
    }
}

fn provider(cloud: &FakeCloud, cluster: &str) -> Provider {
    Provider::over_fake(cloud, cluster)
}

async fn node(cloud: FakeCloud, t: Targets) -> Node {
    node_from(cloud, t, MemoryCheckpoint::new()).await
}

/// A node restarted from `checkpoint`.
async fn node_from(cloud: FakeCloud, t: Targets, checkpoint: MemoryCheckpoint) -> Node {
    let p = provider(&cloud, "demo");
    node_with(cloud, p, t, checkpoint, true).await
}

/// `warm_ip=2`, one pod and a reconcile baseline, then (IMDS lagging `imds_lag_reads` reads
/// behind EC2 from here on) a burst of four pods deleted again: excess free addresses, and
/// past the pod-IP cooldown and shrink pacing, so the next settle shrinks.
async fn node_about_to_shrink(imds_lag_reads: u32) -> Node {
    node_about_to_shrink_on(imds_lag_reads, MemoryCheckpoint::new()).await
}

/// [`node_about_to_shrink`] writing to `checkpoint`.
async fn node_about_to_shrink_on(imds_lag_reads: u32, checkpoint: MemoryCheckpoint) -> Node {
    let mut t = targets(false);
    t.warm_eni = 0;
    t.warm_ip = 2;
    let mut n = node_from(FakeCloud::m5_large(), t, checkpoint).await;
    n.add(1).await.unwrap();
    n.pass().await;
    n.clock.advance(Duration::from_secs(120));
    n.pass().await;
    n.cloud.set_imds_lag(imds_lag_reads);
    for i in 2..6 {
        n.add(i).await.unwrap();
    }
    for i in 2..6 {
        n.ipam.del(&key(i), "", "", "PodDeleted").unwrap();
    }
    n.clock.advance(Duration::from_secs(31));
    n
}

/// A node on `provider`, with ENI/IP provisioning on or off.
async fn node_with(
    cloud: FakeCloud,
    provider: Provider,
    t: Targets,
    checkpoint: MemoryCheckpoint,
    provisioning: bool,
) -> Node {
    let clock = Arc::new(ManualClock(Mutex::new(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    )));
    let settings = IpamSettings {
        targets: t,
        add_wait_timeout: Duration::from_secs(20),
        busy_pool_wait: crate::ipam::BUSY_POOL_WAIT,
        veth_prefix: "eni".into(),
        provisioning,
    };
    let described = NodeDescription::describe(&provider)
        .await
        .expect("the node is described");
    let (ipam, _) = Ipam::start(
        described,
        settings,
        Duration::from_secs(30),
        Box::new(checkpoint),
        || Ok(vec![]),
        clock.clone(),
        Arc::new(Metrics::new()),
    )
    .expect("ipam starts");
    let ipam = Arc::new(ipam);
    // As `pool::run::run` at start: the releases recorded before a restart, first.
    let mut reconciler = Reconciler::new();
    reconciler.restore(&ipam);
    Node {
        host: RecordingHost::default(),
        cloud,
        ipam,
        clock,
        manager: Manager::new(provider),
        reconciler,
    }
}

fn key(i: u32) -> IpamKey {
    IpamKey::new("aws-cni", &format!("c{i}"), "eth0")
}

impl Node {
    /// One pool pass + reconcile round, as the daemon's loop does (the manager's releases
    /// handed over).
    async fn pass(&mut self) -> Outcome {
        self.manager.settle(&self.ipam).await;
        self.reconciler.take_over(self.manager.hand_over());
        self.reconciler
            .tick(&self.ipam, self.manager.provider(), &self.host)
            .await
    }

    /// AddNetwork with the pool loop running concurrently (demand-driven, as in the daemon).
    async fn add(&mut self, i: u32) -> Result<Ipv4Addr, IpamError> {
        let ipam = self.ipam.clone();
        let add = tokio::spawn(async move { ipam.add(&key(i), PodMetadata::default()).await });
        loop {
            if add.is_finished() {
                return add.await.expect("join").map(|a| a.ip);
            }
            tokio::select! {
                () = self.ipam.signal.demanded() => { self.manager.settle(&self.ipam).await; }
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
    }

    fn pool_cidrs(&self) -> Vec<Ipv4Net> {
        let core = self.ipam.index.store();
        core.enis()
            .values()
            .flat_map(|e| e.cidrs.keys().copied())
            .collect()
    }
}

/// The datastore gauges follow what the pool loop attached, not only what pods took: a pass that
/// fills the warm pool, with no pod ADD or DEL, shows in `awscni_total_ip_addresses`.
#[tokio::test(start_paused = true)]
async fn a_pool_pass_alone_updates_the_address_gauges() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    let gauge = |n: &Node| {
        n.ipam
            .metrics
            .total_ip_addresses
            .get([])
            .map_or(0.0, |s| s.value)
    };
    let before = gauge(&n);
    n.pass().await;
    let total = n.ipam.index.pool_stats(0).expect("card 0").total;
    assert!(total > 0, "the pass filled the warm pool");
    assert_eq!(gauge(&n), f64::from(total), "was {before}");
}

/// The adaptive pool's low-water mark: an ADD that leaves fewer available addresses than the
/// mark wakes the pool loop at once; without a mark (the static policy) a served ADD wakes
/// nothing and the pool waits for its tick.
#[tokio::test(start_paused = true)]
async fn an_add_under_the_low_water_mark_wakes_the_pool_loop() {
    let mut t = targets(false);
    t.warm_eni = 0;
    t.warm_ip = 3;
    let mut n = node(FakeCloud::m5_large(), t).await;
    n.pass().await;
    let available = n.ipam.index.pool_stats(0).expect("card 0").available();
    assert_eq!(available, 3, "the warm pool is full");
    let woken = |ipam: Arc<Ipam>| async move {
        tokio::time::timeout(Duration::from_millis(1), ipam.signal.demanded())
            .await
            .is_ok()
    };
    // static: served from the warm pool, no wake-up
    n.ipam
        .add(&key(1), PodMetadata::default())
        .await
        .expect("address");
    assert!(!woken(n.ipam.clone()).await, "no mark, no wake-up");
    // a mark of 1: the next ADD leaves 1 available, at the mark: nothing
    n.ipam.signal.set_low_water(1);
    n.ipam
        .add(&key(2), PodMetadata::default())
        .await
        .expect("address");
    assert!(!woken(n.ipam.clone()).await, "at the mark: no wake-up");
    // the next leaves 0, under it: the loop is woken
    n.ipam
        .add(&key(3), PodMetadata::default())
        .await
        .expect("address");
    assert_eq!(n.ipam.index.pool_stats(0).expect("card 0").available(), 0);
    assert!(
        woken(n.ipam.clone()).await,
        "under the mark: the loop is woken"
    );
}

#[tokio::test(start_paused = true)]
async fn empty_pool_add_triggers_immediate_allocation_and_fills_the_primary_eni_first() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    let ip = n.add(1).await.expect("pod gets an address");
    assert_eq!(
        n.cloud.calls("AssignPrivateIpAddresses"),
        1,
        "one call fills the primary eni"
    );
    assert_eq!(n.cloud.calls("CreateNetworkInterface"), 0);
    assert!(
        n.cloud
            .eni(PRIMARY_ENI)
            .unwrap()
            .secondary_ips
            .contains(&ip)
    );
}

#[tokio::test(start_paused = true)]
async fn new_eni_is_created_with_addresses_tags_and_delete_on_termination() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    for i in 0..12 {
        n.add(i).await.expect("address");
    }
    n.pass().await;
    let ours: Vec<_> = n
        .cloud
        .all_enis()
        .into_iter()
        .filter(|e| e.eni_id != PRIMARY_ENI)
        .collect();
    assert!(!ours.is_empty(), "a second eni was created");
    let e = &ours[0];
    assert_eq!(
        e.description,
        format!("{ENI_DESCRIPTION_PREFIX}{}", n.cloud.instance_id())
    );
    assert_eq!(e.tags.get(TAG_INSTANCE_ID), Some(&n.cloud.instance_id()));
    assert!(e.tags.contains_key(TAG_CREATED_AT));
    assert_eq!(
        e.tags.get(TAG_CLUSTER_NAME).map(String::as_str),
        Some("demo")
    );
    assert_eq!(
        e.tags.get(TAG_ENI_OWNER).map(String::as_str),
        Some("amazon-vpc-cni")
    );
    assert_eq!(e.tags.get("team").map(String::as_str), Some("net"));
    assert!(
        !e.tags.contains_key("x.k8s.amazonaws.com/evil"),
        "reserved keys of ADDITIONAL_ENI_TAGS are dropped"
    );
    let att = e.attachment.as_ref().expect("attached");
    assert!(att.delete_on_termination);
    assert_eq!(att.device_index, 1, "first free device index");
    assert_eq!(
        e.secondary_ips.len(),
        9,
        "created with its addresses in the same call"
    );
    assert_eq!(
        n.cloud.calls("AssignPrivateIpAddresses"),
        1,
        "no separate assign for the new eni"
    );
}

#[tokio::test(start_paused = true)]
async fn instance_limit_fails_fast_with_a_message_saying_so() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    for i in 0..27 {
        n.add(i).await.unwrap_or_else(|e| panic!("pod {i}: {e}"));
    }
    let started = tokio::time::Instant::now();
    let err = n.add(99).await.expect_err("28th pod exceeds 3 enis x 9");
    assert!(matches!(err, IpamError::InstanceLimit(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "failed at the limit, not at the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn subnet_full_fails_with_subnet_exhausted_then_backs_off_without_calling_ec2() {
    let cloud = FakeCloud::m5_large();
    cloud.fill_subnet(0);
    let mut n = node(cloud, targets(false)).await;
    let err = n.add(1).await.expect_err("no address anywhere");
    assert!(matches!(err, IpamError::SubnetExhausted(_)), "{err:?}");
    let calls = n.cloud.calls("AssignPrivateIpAddresses");
    let err = n.add(2).await.expect_err("still full");
    assert!(matches!(err, IpamError::SubnetExhausted(_)), "{err:?}");
    assert_eq!(
        n.cloud.calls("AssignPrivateIpAddresses"),
        calls,
        "120 s back-off: no ec2 call"
    );
}

#[tokio::test(start_paused = true)]
async fn fragmented_subnet_falls_back_from_prefixes_to_single_addresses() {
    let cloud = FakeCloud::m5_large();
    cloud.fragment_subnet();
    let mut n = node(cloud, targets(true)).await;
    let ip = n.add(1).await.expect("a /32 instead of a /28");
    let cidrs = n.pool_cidrs();
    assert!(cidrs.iter().all(|c| c.prefix_len() == 32), "{cidrs:?}");
    assert!(cidrs.contains(&Ipv4Net::from(ip)));
    assert_eq!(n.cloud.eni(PRIMARY_ENI).unwrap().prefixes.len(), 0);
    let core = n.ipam.index.store();
    assert!(
        core.enis()
            .values()
            .flat_map(|e| e.cidrs.values())
            .all(|c| !c.is_prefix),
        "fallback /32s are plain secondary addresses in the datastore"
    );
}

#[tokio::test(start_paused = true)]
async fn prefix_delegation_assigns_a_prefix_when_the_subnet_allows() {
    let mut n = node(FakeCloud::m5_large(), targets(true)).await;
    let ip = n.add(1).await.expect("address from a /28");
    let prefixes = n.cloud.eni(PRIMARY_ENI).unwrap().prefixes;
    assert_eq!(prefixes.len(), 1);
    assert!(prefixes[0].contains(&ip));
}

#[tokio::test(start_paused = true)]
async fn imds_omitting_a_prefix_held_by_a_pod_never_releases_it() {
    // upstream #3824: an in-use /28 released after IMDS returned an incomplete list
    let mut n = node(FakeCloud::m5_large(), targets(true)).await;
    let ip = n.add(1).await.unwrap();
    let prefix = n.cloud.eni(PRIMARY_ENI).unwrap().prefixes[0];
    n.cloud.hide_from_imds(prefix, true);
    n.clock.advance(Duration::from_secs(120));
    let describes = n.cloud.calls("DescribeNetworkInterfaces");
    let out = n.pass().await;
    assert!(
        matches!(out, Outcome::Applied(ref p) if p.is_empty()),
        "{out:?}"
    );
    assert_eq!(
        n.cloud.calls("DescribeNetworkInterfaces"),
        describes + 1,
        "confirmed with ec2 once"
    );
    assert!(n.pool_cidrs().contains(&prefix));
    assert_eq!(n.ipam.index.store().lookup(&key(1)).map(|a| a.ip), Some(ip));
    // the same difference is not re-confirmed within 5 minutes
    n.clock.advance(Duration::from_secs(61));
    assert!(matches!(n.pass().await, Outcome::Unconfirmed(_)));
    assert_eq!(n.cloud.calls("DescribeNetworkInterfaces"), describes + 1);
}

#[tokio::test(start_paused = true)]
async fn address_gone_from_ec2_is_dropped_only_when_no_pod_holds_it() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    let held = n.add(1).await.unwrap();
    n.pass().await;
    let free: Ipv4Addr = n
        .cloud
        .eni(PRIMARY_ENI)
        .unwrap()
        .secondary_ips
        .into_iter()
        .find(|ip| *ip != held)
        .unwrap();
    n.cloud.remove_address(PRIMARY_ENI, Ipv4Net::from(held));
    n.cloud.remove_address(PRIMARY_ENI, Ipv4Net::from(free));
    n.clock.advance(Duration::from_secs(120));
    let out = n.pass().await;
    let Outcome::Applied(plan) = out else {
        panic!("{out:?}")
    };
    assert_eq!(
        plan.remove_cidrs,
        vec![(PRIMARY_ENI.to_owned(), Ipv4Net::from(free))]
    );
    assert_eq!(
        plan.kept_in_use,
        vec![(PRIMARY_ENI.to_owned(), Ipv4Net::from(held))]
    );
    assert_eq!(
        n.ipam.index.store().lookup(&key(1)).map(|a| a.ip),
        Some(held),
        "#3019: never force-released"
    );
}

#[tokio::test(start_paused = true)]
async fn eni_deleted_behind_our_back_is_dropped_and_its_host_state_removed() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    n.add(1).await.unwrap();
    n.pass().await; // warm ENI created; the reconciler's first round describes it
    let warm = n
        .cloud
        .all_enis()
        .into_iter()
        .find(|e| e.eni_id != PRIMARY_ENI)
        .expect("a warm eni");
    let device = warm.attachment.as_ref().unwrap().device_index;
    assert!(n.host.torn_down.lock().unwrap().is_empty());
    n.cloud.remove_eni(&warm.eni_id);
    n.clock.advance(Duration::from_secs(120));
    let out = n.pass().await;
    let Outcome::Applied(plan) = out else {
        panic!("{out:?}")
    };
    assert_eq!(plan.remove_enis, vec![warm.eni_id.clone()]);
    assert!(!n.ipam.index.store().enis().contains_key(&warm.eni_id));
    let torn: Vec<_> = n
        .host
        .torn_down
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.id.clone(), e.device_number, e.primary_ip))
        .collect();
    assert_eq!(
        torn,
        vec![(warm.eni_id.clone(), device, warm.primary_ip)],
        "route table and rules of the gone eni are removed at once"
    );
    assert!(
        n.ipam.index.store().lookup(&key(1)).is_some(),
        "the pod on the primary eni is untouched"
    );
    // Counted as upstream's reconcile loop counts a swept ENI.
    let text = n
        .ipam
        .metrics
        .render(crate::config::MetricsNaming::Upstream);
    assert!(
        text.contains("awscni_reconcile_count{fn=\"eniReconcileDel\"} 1"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn freshly_released_addresses_are_not_readded_from_stale_imds() {
    // upstream #3887: an address unassigned in EC2 re-added from stale IMDS
    let mut n = node_about_to_shrink(100).await;
    let before = n.pool_cidrs().len();
    n.manager.settle(&n.ipam).await;
    let after = n.pool_cidrs();
    assert!(
        after.len() < before,
        "pool shrank ({before} -> {})",
        after.len()
    );
    n.clock.advance(Duration::from_secs(61));
    n.reconciler.eager = true;
    n.pass().await;
    let ec2_now = n.cloud.eni(PRIMARY_ENI).unwrap().pod_cidrs();
    for c in n.pool_cidrs() {
        assert!(ec2_now.contains(&c), "{c} is in the pool but not in ec2");
    }
}

#[tokio::test(start_paused = true)]
async fn no_manage_eni_holds_a_slot_but_no_pod_addresses() {
    let cloud = FakeCloud::m5_large();
    let foreign = cloud.add_foreign_eni(
        [(TAG_NO_MANAGE.to_owned(), "true".to_owned())].into(),
        3,
        Some(1),
    );
    let mut n = node(cloud, targets(false)).await;
    for i in 0..18 {
        n.add(i).await.unwrap_or_else(|e| panic!("pod {i}: {e}"));
    }
    let err = n.add(99).await.expect_err("only 2 usable enis");
    assert!(matches!(err, IpamError::InstanceLimit(_)), "{err:?}");
    let core = n.ipam.index.store();
    assert!(
        core.enis()
            .get(&foreign)
            .is_some_and(|e| e.cidrs.is_empty() && e.spec.is_excluded)
    );
    assert_eq!(
        n.cloud.eni(&foreign).unwrap().secondary_ips.len(),
        3,
        "left alone"
    );
}

/// upstream ipamd.go `setUnmanagedENIs`: with `MANAGE_UNTAGGED_ENI=false` an ENI that ipamd
/// did not create (no instance-id tag) is unmanaged unless a `no_manage` tag says otherwise;
/// with the default (true) it serves pods.
#[tokio::test(start_paused = true)]
async fn untagged_enis_are_unmanaged_only_when_manage_untagged_is_off() {
    for manage_untagged in [true, false] {
        let cloud = FakeCloud::m5_large();
        let untagged = cloud.add_foreign_eni(Tags::new(), 3, Some(1));
        let tagged_managed = cloud.add_foreign_eni(
            [(TAG_NO_MANAGE.to_owned(), "false".to_owned())].into(),
            2,
            Some(2),
        );
        let settings = ProviderSettings {
            manage_untagged,
            ..ProviderSettings::upstream("demo".into(), Tags::new())
        };
        let p = Ec2Provider::new(Arc::new(cloud.clone()), Arc::new(cloud.clone()), settings);
        p.identity().await.unwrap();
        let enis = p.prime().await.unwrap();
        let get = |id: &str| enis.iter().find(|e| e.id == id).unwrap().clone();
        assert_eq!(get(&untagged).is_excluded, !manage_untagged);
        assert_eq!(
            get(&untagged).secondary_ips.len(),
            if manage_untagged { 3 } else { 0 }
        );
        assert!(
            !get(&tagged_managed).is_excluded,
            "no_manage=false is managed"
        );
        assert!(
            !get(PRIMARY_ENI).is_excluded,
            "the primary is always managed"
        );
        let imds = p.imds_view().await.unwrap();
        let hint = imds.iter().find(|e| e.id == untagged).unwrap();
        assert_eq!(hint.is_excluded, !manage_untagged, "imds hint agrees");
    }
}

#[tokio::test(start_paused = true)]
async fn no_eni_or_ip_change_once_shutting_down() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    n.ipam.begin_shutdown();
    let calls = n.cloud.mutating_calls();
    n.pass().await;
    assert!(n.ipam.add(&key(1), PodMetadata::default()).await.is_err());
    n.pass().await;
    assert_eq!(n.cloud.mutating_calls(), calls);
}

/// Issue 28 finding 3: an instance told to stop (the old pod of a maxSurge update) hands out no
/// new address, even with free ones in its pool: the pod's retry goes to the new instance,
/// which has not read an assignment made after it took over. A retried ADD of a pod it already
/// assigned still gets its address.
#[tokio::test(start_paused = true)]
async fn no_new_assignment_once_shutting_down_even_from_a_warm_pool() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    n.pass().await;
    let first = n.ipam.add(&key(1), PodMetadata::default()).await.unwrap();
    let now = n.ipam.now();
    assert!(
        n.ipam.index.read(|ds| ds.stats(now)).available() > 0,
        "the pool has free addresses"
    );
    n.ipam.begin_shutdown();
    let e = n
        .ipam
        .add(&key(2), PodMetadata::default())
        .await
        .unwrap_err();
    assert!(matches!(e, IpamError::NotReady(_)), "{e}");
    assert!(n.ipam.index.read(|ds| ds.lookup(&key(2))).is_none());
    let again = n.ipam.add(&key(1), PodMetadata::default()).await.unwrap();
    assert_eq!(again.ip, first.ip);
}

mod calls;
mod churn;
mod failures;
mod release_lag;
mod restore;
mod trunk;
