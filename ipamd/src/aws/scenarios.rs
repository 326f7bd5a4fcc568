//! Scenario tests of the pool manager + reconciler driving the EC2 provider against the
//! stateful fake cloud (limits, fragmentation, IMDS lag and omissions enforced there). One test
//! per pain point of the reference (§2: 1, 3, 5, 6, 7, 8, 10). Test-only.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;

use super::Ec2Eni;
use super::ec2::{AddressRequest, Ec2, EniQuery};
use super::error::Ec2Error;
use super::fake::{FakeCloud, PRIMARY_ENI};
use super::provider::{Ec2Provider, ProviderSettings};
use super::{
    ENI_DESCRIPTION_PREFIX, TAG_CLUSTER_NAME, TAG_CREATED_AT, TAG_ENI_OWNER, TAG_INSTANCE_ID,
    TAG_NO_MANAGE, Tags,
};
use crate::datastore::checkpoint::MemoryCheckpoint;
use crate::datastore::{IpamKey, PodMetadata};
use crate::http::metrics::Metrics;
use crate::ipam::{Clock, Ipam, IpamError, IpamSettings};
use crate::pool::manager::Manager;
use crate::pool::policy::Targets;
use crate::pool::provider::{AttachedEni, EniProvider};
use crate::pool::reconcile::{EniHost, Outcome, Reconciler};

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
    async fn setup(&self, _eni: &AttachedEni) -> Result<(), String> {
        Ok(())
    }
    async fn teardown(&self, eni: &AttachedEni) -> Result<(), String> {
        self.torn_down.lock().unwrap().push(eni.clone());
        Ok(())
    }
}

struct Node {
    host: RecordingHost,
    cloud: FakeCloud,
    ipam: Arc<Ipam<Provider>>,
    clock: Arc<ManualClock>,
    manager: Manager,
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
    let settings = ProviderSettings {
        cluster_name: cluster.into(),
        additional_tags: [
            ("team".to_owned(), "net".to_owned()),
            ("x.k8s.amazonaws.com/evil".to_owned(), "1".to_owned()),
        ]
        .into(),
        imds_wait_attempts: 3,
        delete_attempts: 3,
        manage_untagged: true,
        imds_only: false,
    };
    Ec2Provider::new(Arc::new(cloud.clone()), Arc::new(cloud.clone()), settings)
}

async fn node(cloud: FakeCloud, t: Targets) -> Node {
    node_from(cloud, t, MemoryCheckpoint::new()).await
}

/// A node restarted from `checkpoint`.
async fn node_from(cloud: FakeCloud, t: Targets, checkpoint: MemoryCheckpoint) -> Node {
    let p = provider(&cloud, "demo");
    node_with(cloud, p, t, checkpoint, true).await
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
        veth_prefix: "eni".into(),
        provisioning,
    };
    let (ipam, _) = Ipam::start(
        provider,
        settings,
        Duration::from_secs(30),
        Box::new(checkpoint),
        || Ok(vec![]),
        clock.clone(),
        Arc::new(Metrics::new()),
    )
    .await
    .expect("ipam starts");
    Node {
        host: RecordingHost::default(),
        cloud,
        ipam: Arc::new(ipam),
        clock,
        manager: Manager::new(),
        reconciler: Reconciler::new(),
    }
}

fn key(i: u32) -> IpamKey {
    IpamKey::new("aws-cni", &format!("c{i}"), "eth0")
}

impl Node {
    /// One pool pass + reconcile round, as the daemon's loop does.
    async fn pass(&mut self) -> Outcome {
        self.manager.settle(&self.ipam).await;
        self.reconciler.tick(&self.ipam, &self.host).await
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
                () = self.ipam.demanded() => { self.manager.settle(&self.ipam).await; }
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
    }

    fn pool_cidrs(&self) -> Vec<Ipv4Net> {
        let core = self.ipam.core();
        core.ds
            .enis()
            .values()
            .flat_map(|e| e.cidrs.keys().copied())
            .collect()
    }
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
    let core = n.ipam.core();
    assert!(
        core.ds
            .enis()
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
    assert_eq!(n.ipam.core().ds.lookup(&key(1)).map(|a| a.ip), Some(ip));
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
        n.ipam.core().ds.lookup(&key(1)).map(|a| a.ip),
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
    assert!(!n.ipam.core().ds.enis().contains_key(&warm.eni_id));
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
        n.ipam.core().ds.lookup(&key(1)).is_some(),
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
    let mut t = targets(false);
    t.warm_eni = 0;
    t.warm_ip = 2;
    let mut n = node(FakeCloud::m5_large(), t).await;
    n.add(1).await.unwrap();
    n.pass().await;
    n.clock.advance(Duration::from_secs(120));
    n.pass().await; // reconcile baseline
    n.cloud.set_imds_lag(100);
    // a burst then a delete leaves excess free addresses for the shrink
    for i in 2..6 {
        n.add(i).await.unwrap();
    }
    for i in 2..6 {
        n.ipam.del(&key(i), "", "", "PodDeleted").unwrap();
    }
    n.clock.advance(Duration::from_secs(31)); // past the pod-IP cooldown and shrink pacing
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
async fn idle_node_makes_no_mutating_call_and_no_describe_when_imds_agrees() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    for i in 0..3 {
        n.add(i).await.unwrap();
    }
    n.pass().await;
    n.clock.advance(Duration::from_secs(120));
    n.pass().await;
    let (mutating, describes) = (
        n.cloud.mutating_calls(),
        n.cloud.calls("DescribeNetworkInterfaces"),
    );
    for _ in 0..720 {
        // one idle hour at the 5 s pool tick
        n.clock.advance(Duration::from_secs(5));
        n.pass().await;
    }
    assert_eq!(
        n.cloud.mutating_calls(),
        mutating,
        "steady state: no mutating call"
    );
    assert_eq!(
        n.cloud.calls("DescribeNetworkInterfaces"),
        describes,
        "imds agrees: no describe"
    );
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
    let core = n.ipam.core();
    assert!(
        core.ds
            .enis()
            .get(&foreign)
            .is_some_and(|e| e.cidrs.is_empty() && e.is_excluded)
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

/// upstream awsutils.go `DescribeAllENIs` with `ENABLE_IMDS_ONLY_MODE`: the ENIs are what IMDS
/// lists and EC2 is never called, through node init, pods and reconcile rounds.
#[tokio::test(start_paused = true)]
async fn imds_only_mode_makes_no_ec2_call() {
    let cloud = FakeCloud::m5_large();
    let secondary = cloud.add_foreign_eni(Tags::new(), 3, Some(1));
    let settings = ProviderSettings {
        imds_only: true,
        ..ProviderSettings::upstream("demo".into(), Tags::new())
    };
    let p = Ec2Provider::new(Arc::new(cloud.clone()), Arc::new(cloud.clone()), settings);
    let enis = crate::node_init::discover(&p)
        .await
        .expect("node init from IMDS");
    assert!(
        enis.iter()
            .any(|e| e.id == secondary && e.secondary_ips.len() == 3)
    );
    let mut n = node_with(
        cloud.clone(),
        p,
        targets(false),
        MemoryCheckpoint::new(),
        false,
    )
    .await;
    for i in 0..3 {
        n.add(i).await.unwrap_or_else(|e| panic!("pod {i}: {e}"));
    }
    for _ in 0..3 {
        n.pass().await;
        n.clock.advance(Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(60)).await;
    }
    assert_eq!(
        cloud.call_counts(),
        std::collections::BTreeMap::new(),
        "no EC2 call in IMDS-only mode"
    );
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

#[tokio::test]
async fn leaked_enis_are_deleted_after_the_grace_period_only() {
    let cloud = FakeCloud::m5_large();
    let p = provider(&cloud, "demo");
    let now = SystemTime::now();
    let mk = |age: Option<u64>| {
        let mut tags: Tags = [
            (TAG_INSTANCE_ID.to_owned(), "i-gone".to_owned()),
            (TAG_CLUSTER_NAME.to_owned(), "demo".to_owned()),
        ]
        .into();
        if let Some(a) = age {
            let t = time::OffsetDateTime::from(now - Duration::from_secs(a));
            tags.insert(
                TAG_CREATED_AT.into(),
                t.format(&time::format_description::well_known::Rfc3339)
                    .unwrap(),
            );
        }
        cloud.add_foreign_eni(tags, 0, None)
    };
    let (old, young, untagged) = (mk(Some(600)), mk(Some(60)), mk(None));
    let other_cluster = cloud.add_foreign_eni(
        [
            (TAG_INSTANCE_ID.to_owned(), "i-x".to_owned()),
            (TAG_CLUSTER_NAME.to_owned(), "other".to_owned()),
        ]
        .into(),
        0,
        None,
    );
    let deleted = p.cleanup_leaked(now).await.unwrap();
    // foreign ENIs lack the aws-K8S- description: nothing is deleted, untagged ones are not stamped
    assert!(deleted.is_empty());
    // ENIs ipamd created (description aws-K8S-...) are the ones cleaned up
    let created = cloud
        .create_eni(super::ec2::CreateEni {
            subnet_id: "subnet-fake".into(),
            security_groups: vec![],
            description: format!("{ENI_DESCRIPTION_PREFIX}i-gone"),
            tags: {
                let mut t = p.new_eni_tags("i-gone", now - Duration::from_secs(600));
                t.insert(TAG_CLUSTER_NAME.into(), "demo".into());
                t
            },
            addresses: AddressRequest::Ips(0),
        })
        .await
        .unwrap();
    let fresh = cloud
        .create_eni(super::ec2::CreateEni {
            subnet_id: "subnet-fake".into(),
            security_groups: vec![],
            description: format!("{ENI_DESCRIPTION_PREFIX}i-gone"),
            tags: p.new_eni_tags("i-gone", now - Duration::from_secs(60)),
            addresses: AddressRequest::Ips(0),
        })
        .await
        .unwrap();
    let deleted = p.cleanup_leaked(now).await.unwrap();
    assert_eq!(deleted, vec![created.eni_id.clone()]);
    assert!(
        cloud.eni(&fresh.eni_id).is_some(),
        "inside the 5-minute grace"
    );
    assert!(cloud.eni(&other_cluster).is_some(), "another cluster's eni");
    assert!(
        cloud.eni(&old).is_some() && cloud.eni(&young).is_some() && cloud.eni(&untagged).is_some()
    );
    let attached = cloud
        .describe_enis(EniQuery::AttachedTo(cloud.instance_id()))
        .await
        .unwrap();
    assert_eq!(attached.len(), 1, "the node's own enis are untouched");
}

#[tokio::test(start_paused = true)]
async fn freeing_an_eni_detaches_then_deletes_it() {
    let cloud = FakeCloud::m5_large();
    let p = provider(&cloud, "");
    p.list_enis().await.unwrap();
    let eni = p
        .create_eni(crate::pool::provider::NewEni {
            secondary_ips: 2,
            prefixes: 0,
        })
        .await
        .unwrap();
    assert_eq!(eni.device_number, 1);
    p.free_eni(&eni.id).await.unwrap();
    assert!(cloud.eni(&eni.id).is_none());
    assert_eq!(cloud.calls("DetachNetworkInterface"), 1);
    assert!(
        p.free_eni(PRIMARY_ENI).await.is_err(),
        "the primary eni is never freed"
    );
}

/// upstream awsutils.go `awsUtilsErrInc("FreeENIDeleteErr", ..)`: a detached ENI that cannot
/// be deleted is counted in `awscni_aws_utils_error_count`.
#[tokio::test(start_paused = true)]
async fn an_undeletable_freed_eni_is_counted_as_upstream_counts_it() {
    let cloud = FakeCloud::m5_large();
    let metrics = Arc::new(Metrics::new());
    let p = provider(&cloud, "").with_metrics(super::metrics::AwsMetrics::new(metrics.clone()));
    p.list_enis().await.unwrap();
    let eni = p
        .create_eni(crate::pool::provider::NewEni {
            secondary_ips: 1,
            prefixes: 0,
        })
        .await
        .unwrap();
    for _ in 0..3 {
        cloud.fail_next("DeleteNetworkInterface", Ec2Error::Throttled);
    }
    p.free_eni(&eni.id).await.unwrap();
    let text = metrics.render(crate::config::MetricsNaming::Upstream);
    assert!(
        text.contains(
            "awscni_aws_utils_error_count{error=\"RequestLimitExceeded\",fn=\"FreeENIDeleteErr\"} 1"
        ),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn unknown_instance_type_falls_back_to_describe_instance_types() {
    let l = super::limits::lookup("m5.large").unwrap();
    let cloud = FakeCloud::new("zz9.huge", l, "198.18.0.0/24");
    let p = provider(&cloud, "");
    let got = p.instance_limits().await.unwrap();
    assert_eq!((got.max_enis, got.ipv4_per_eni), (3, 10));
    assert_eq!(cloud.calls("DescribeInstanceTypes"), 1);
    p.instance_limits().await.unwrap();
    assert_eq!(cloud.calls("DescribeInstanceTypes"), 1, "cached");
}

impl Node {
    /// EC2 lists `ip` on an ENI attached to this instance.
    fn ec2_lists(&self, ip: Ipv4Addr) -> bool {
        self.cloud
            .all_enis()
            .iter()
            .filter(|e| e.attachment.is_some())
            .flat_map(Ec2Eni::pod_cidrs)
            .any(|c| c.contains(&ip))
    }

    /// Every CIDR the datastore could hand out is on an ENI EC2 lists as attached to this
    /// instance, and EC2 lists the CIDR on it.
    fn assert_pool_within_ec2(&self, what: &str) {
        let ec2: std::collections::BTreeMap<String, Vec<Ipv4Net>> = self
            .cloud
            .all_enis()
            .into_iter()
            .filter(|e| e.attachment.is_some())
            .map(|e| (e.eni_id.clone(), e.pod_cidrs()))
            .collect();
        let core = self.ipam.core();
        for (id, eni) in core.ds.enis() {
            for c in eni.cidrs.keys() {
                assert!(
                    ec2.get(id).is_some_and(|cs| cs.contains(c)),
                    "{what}: {c} on {id} is assignable but ec2 does not list it there"
                );
            }
        }
    }
}

/// `warm_ip=2`, one pod, then a burst of four deleted: the next settle shrinks.
async fn node_about_to_shrink() -> Node {
    let mut t = targets(false);
    t.warm_eni = 0;
    t.warm_ip = 2;
    let mut n = node(FakeCloud::m5_large(), t).await;
    n.add(1).await.unwrap();
    n.pass().await;
    n.clock.advance(Duration::from_secs(120));
    n.pass().await;
    for i in 2..6 {
        n.add(i).await.unwrap();
    }
    for i in 2..6 {
        n.ipam.del(&key(i), "", "", "PodDeleted").unwrap();
    }
    n.clock.advance(Duration::from_secs(31));
    n
}

#[tokio::test(start_paused = true)]
async fn an_unassign_ec2_applied_but_reported_as_failed_puts_no_address_back() {
    // Issue 18 item 6: the manager put the addresses back after any unassign error, though
    // EC2 may have applied the call (a timeout after the request arrived). Only EC2's
    // Describe may add addresses back.
    let mut n = node_about_to_shrink().await;
    let before = n.pool_cidrs().len();
    n.cloud.fail_after_apply(
        "UnassignPrivateIpAddresses",
        super::error::Ec2Error::Transport("timeout".into()),
    );
    n.manager.settle(&n.ipam).await;
    assert!(
        n.pool_cidrs().len() < before,
        "addresses EC2 may have released were put back into the pool"
    );
    n.assert_pool_within_ec2("after an ambiguous unassign");
    for i in 10..14 {
        n.add(i).await.unwrap();
    }
    n.assert_pool_within_ec2("after new pods");
}

#[tokio::test(start_paused = true)]
async fn an_unassign_that_failed_without_effect_comes_back_only_through_describe() {
    // The same failure before EC2 applied anything: the addresses are still EC2's on this
    // node; the reconciler adds them back from Describe once the release cooldown is over.
    let mut n = node_about_to_shrink().await;
    n.cloud.fail_next(
        "UnassignPrivateIpAddresses",
        super::error::Ec2Error::Transport("timeout".into()),
    );
    let before = n.pool_cidrs();
    n.pass().await; // the release fails; the reconciler notes it as released (cooling down)
    let dropped: Vec<_> = before
        .iter()
        .filter(|c| !n.pool_cidrs().contains(c))
        .copied()
        .collect();
    assert!(
        !dropped.is_empty(),
        "taken out before the call, not put back"
    );
    n.assert_pool_within_ec2("after a failed unassign");
    n.clock
        .advance(crate::pool::reconcile::FREED_COOLDOWN + Duration::from_secs(1));
    n.reconciler.eager = true;
    n.pass().await;
    let back = n.pool_cidrs();
    for c in &dropped {
        assert!(
            back.contains(c),
            "{c} is still EC2's: re-added from Describe"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_detach_ec2_applied_but_reported_as_failed_puts_no_eni_back() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    for i in 0..12 {
        n.add(i).await.unwrap();
    }
    n.pass().await;
    for i in 0..12 {
        n.ipam.del(&key(i), "", "", "PodDeleted").unwrap();
    }
    n.clock.advance(Duration::from_secs(120));
    // the spare ENIs are freed once the pool has been in excess for the hold
    n.manager.settle(&n.ipam).await;
    n.clock.advance(crate::pool::policy::ENI_EXCESS_HOLD);
    let enis_before = n.ipam.core().ds.enis().len();
    n.cloud.fail_after_apply(
        "DetachNetworkInterface",
        super::error::Ec2Error::Transport("timeout".into()),
    );
    n.manager.settle(&n.ipam).await;
    assert!(
        n.ipam.core().ds.enis().len() < enis_before,
        "an eni EC2 may have detached was put back into the pool"
    );
    n.assert_pool_within_ec2("after an ambiguous detach");
}

#[tokio::test(start_paused = true)]
async fn a_released_cidr_is_not_readded_from_a_lagging_describe_at_the_next_round() {
    // Issue 18 item 8 (reconcile rule 4): the round after a release comes at least
    // RECONCILE_INTERVAL later; a release cooldown no longer than that never applied.
    let mut n = node_about_to_shrink().await;
    n.cloud.set_imds_lag(100);
    n.cloud.set_describe_lag(100);
    let before = n.pool_cidrs();
    n.manager.settle(&n.ipam).await;
    let released: Vec<_> = before
        .iter()
        .filter(|c| !n.pool_cidrs().contains(c))
        .copied()
        .collect();
    assert!(!released.is_empty());
    // The first round the pacing allows after the release.
    for _ in 0..14 {
        n.clock.advance(Duration::from_secs(5));
        n.pass().await;
    }
    let now = n.pool_cidrs();
    for c in &released {
        assert!(!now.contains(c), "{c} re-added from a stale view");
    }
}

#[tokio::test(start_paused = true)]
async fn a_prefix_ec2_no_longer_lists_hands_out_none_of_its_free_addresses() {
    // Issue 18 item 2: a /28 kept because a pod holds one of its addresses must not give its
    // 15 free addresses to new pods (EC2 may give the prefix to another node), must not count
    // as available, and must go once its last pod leaves.
    let mut n = node(FakeCloud::m5_large(), targets(true)).await;
    let held = n.add(1).await.unwrap();
    let prefix = n.cloud.eni(PRIMARY_ENI).unwrap().prefixes[0];
    n.pass().await;
    n.cloud.remove_address(PRIMARY_ENI, prefix);
    n.clock.advance(Duration::from_secs(120));
    n.pass().await;
    assert_eq!(n.ipam.core().ds.lookup(&key(1)).map(|a| a.ip), Some(held));
    let listed: u32 = n
        .cloud
        .all_enis()
        .iter()
        .filter(|e| e.attachment.is_some())
        .flat_map(|e| e.prefixes.clone())
        .map(|p| 1u32 << (32 - p.prefix_len()))
        .sum();
    {
        let now = n.clock.now();
        let core = n.ipam.core();
        let stats = core.ds.stats(now);
        assert_eq!(
            (stats.total, stats.available()),
            (listed, listed),
            "the kept prefix is not in the pool"
        );
        let mut ds = core.ds.clone();
        for i in 100..100 + listed {
            let a = ds.assign(&key(i), PodMetadata::default(), now).unwrap();
            assert!(
                !prefix.contains(&a.ip),
                "{} handed out from the prefix EC2 took back",
                a.ip
            );
        }
        assert_eq!(
            ds.assign(&key(999), PodMetadata::default(), now),
            Err(crate::datastore::DatastoreError::NoAvailableAddress),
            "no new pod gets an address of the prefix EC2 took back"
        );
        drop(core);
    }
    n.ipam.del(&key(1), "", "", "PodDeleted").unwrap();
    assert!(
        !n.pool_cidrs().contains(&prefix),
        "the kept prefix goes with its last pod"
    );
    for i in 2..20 {
        let ip = n.add(i).await.unwrap();
        assert!(
            n.ec2_lists(ip),
            "pod {i} got {ip}, which EC2 does not list here"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn an_eni_ec2_no_longer_lists_hands_out_none_of_its_free_addresses() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    for i in 0..12 {
        n.add(i).await.unwrap();
    }
    n.pass().await;
    let second = n
        .ipam
        .core()
        .ds
        .enis()
        .values()
        .find(|e| e.device_number == 1)
        .map(|e| e.id.clone())
        .unwrap();
    let on_second: Vec<u32> = (0..12)
        .filter(|i| n.ipam.core().ds.lookup(&key(*i)).unwrap().eni_id == second)
        .collect();
    assert!(!on_second.is_empty());
    n.cloud.remove_eni(&second);
    n.clock.advance(Duration::from_secs(120));
    n.pass().await;
    assert!(
        n.ipam.core().ds.enis().contains_key(&second),
        "kept: pods on it"
    );
    for i in 20..30 {
        let ip = n.add(i).await.unwrap();
        assert!(
            n.ec2_lists(ip),
            "pod {i} got {ip} from an eni EC2 no longer has"
        );
    }
    for i in on_second {
        n.ipam.del(&key(i), "", "", "PodDeleted").unwrap();
    }
    assert!(
        !n.ipam.core().ds.enis().contains_key(&second),
        "the kept eni goes with its last pod"
    );
}

/// Host networking whose ENI set-up fails while `failing` is set.
#[derive(Debug, Default)]
struct FlakyHost {
    failing: std::sync::atomic::AtomicBool,
    setups: Mutex<Vec<String>>,
}

impl EniHost for FlakyHost {
    async fn setup(&self, eni: &AttachedEni) -> Result<(), String> {
        self.setups.lock().unwrap().push(eni.id.clone());
        if !eni.is_primary && self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("netlink: operation not permitted".into());
        }
        Ok(())
    }
    async fn teardown(&self, _eni: &AttachedEni) -> Result<(), String> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn an_eni_whose_host_setup_failed_hands_out_no_address_until_the_retry_succeeds() {
    // Issue 18 item 4: the decorator gave up after 2 minutes while the ENI's addresses stayed
    // assignable (pods on it egress with no route table). Now they are held back and the pool
    // loop retries the set-up until it is done.
    use crate::node_init::HostedProvider;
    let cloud = FakeCloud::m5_large();
    let host = Arc::new(FlakyHost::default());
    host.failing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let clock = Arc::new(ManualClock(Mutex::new(
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
    )));
    let settings = IpamSettings {
        targets: targets(false),
        add_wait_timeout: Duration::from_secs(5),
        veth_prefix: "eni".into(),
        provisioning: true,
    };
    let (ipam, _) = Ipam::start(
        HostedProvider::new(provider(&cloud, "demo"), host.clone()),
        settings,
        Duration::from_secs(30),
        Box::new(MemoryCheckpoint::new()),
        || Ok(vec![]),
        clock.clone(),
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap();
    let ipam = Arc::new(ipam);
    let mut manager = Manager::new();
    let mut reconciler = Reconciler::new();
    // Fill the primary ENI; the warm-ENI target makes the manager create a second one, whose
    // host set-up fails.
    manager.settle(&ipam).await;
    for i in 0..9 {
        ipam.add(&key(i), PodMetadata::default()).await.unwrap();
    }
    manager.settle(&ipam).await;
    let second = {
        let core = ipam.core();
        let e = core
            .ds
            .enis()
            .values()
            .find(|e| e.device_number == 1)
            .expect("a second eni")
            .clone();
        assert!(!e.host_ready);
        e.id
    };
    {
        let now = clock.now();
        let mut core = ipam.core();
        let r = core.ds.assign(&key(50), PodMetadata::default(), now);
        assert!(
            !matches!(&r, Ok(a) if a.eni_id == second),
            "an address of an eni without host networking was handed out: {r:?}"
        );
        core.ds.undo_assign(&key(50));
    }
    reconciler.ensure_host(&ipam, &*host).await;
    assert!(!ipam.core().ds.enis()[&second].host_ready, "still failing");
    host.failing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    clock.advance(crate::pool::reconcile::HOST_RETRY_INTERVAL);
    reconciler.ensure_host(&ipam, &*host).await;
    assert!(
        ipam.core().ds.enis()[&second].host_ready,
        "retried until done"
    );
    let a = ipam.add(&key(51), PodMetadata::default()).await.unwrap();
    assert_eq!(a.eni_id, second);
}

#[tokio::test(start_paused = true)]
async fn node_init_survives_a_create_tags_permission_error() {
    // Issue 18 item 8: an untagged managed ENI and an IAM policy without ec2:CreateTags made
    // node init fail, so ipamd crash-looped. Tagging is best effort.
    let cloud = FakeCloud::m5_large();
    cloud.add_foreign_eni(Tags::new(), 2, Some(1));
    cloud.fail_next(
        "CreateTags",
        super::error::Ec2Error::Unauthorized("ec2:CreateTags".into()),
    );
    let p = provider(&cloud, "demo");
    let enis = crate::node_init::discover(&p)
        .await
        .expect("node init goes on without the tags");
    assert_eq!(enis.len(), 2);
    assert_eq!(cloud.calls("CreateTags"), 1);
}

fn checkpoint_with(ip: Ipv4Addr) -> MemoryCheckpoint {
    use crate::datastore::checkpoint::Checkpoint as _;
    let mut c = MemoryCheckpoint::new();
    c.store(&crate::datastore::CheckpointData::new(vec![
        crate::datastore::CheckpointEntry::new(
            key(77),
            ip,
            PodMetadata::default(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_799_999_000),
        ),
    ]))
    .unwrap();
    c
}

#[tokio::test(start_paused = true)]
async fn pending_entries_stop_asking_ec2_once_it_confirmed_they_are_not_on_the_node() {
    // Issue 18 item 8: a restored entry whose address is on none of the node's ENIs made every
    // reconcile round ask EC2 again (a Describe every 5 min, forever).
    let cloud = FakeCloud::m5_large();
    let mut n = node_from(
        cloud,
        targets(false),
        checkpoint_with("203.0.113.77".parse().unwrap()),
    )
    .await;
    assert_eq!(n.ipam.core().ds.pending().len(), 1);
    n.add(1).await.unwrap();
    n.pass().await;
    n.clock.advance(Duration::from_secs(120));
    n.pass().await;
    let describes = n.cloud.calls("DescribeNetworkInterfaces");
    for _ in 0..720 {
        n.clock.advance(Duration::from_secs(5));
        n.pass().await;
    }
    assert_eq!(
        n.cloud.calls("DescribeNetworkInterfaces"),
        describes,
        "EC2 said once that the address is not here"
    );
    assert_eq!(
        n.ipam.core().ds.pending().len(),
        1,
        "still held for its pod"
    );
}

#[tokio::test(start_paused = true)]
async fn no_eni_is_freed_while_a_restored_entry_may_be_on_it() {
    // Issue 18 item 8: FreeEni ignored pending entries. EC2's Describe lagged at start, so a
    // pod's address on the second ENI was restored as pending and the ENI looked empty: freeing
    // it would have taken the pod's address away.
    let cloud = FakeCloud::m5_large();
    let eni2 = cloud.add_foreign_eni(Tags::new(), 0, Some(1));
    cloud.set_describe_lag(1);
    let x = cloud.assign(&eni2, AddressRequest::Ips(1)).await.unwrap()[0].addr();
    let mut t = targets(false);
    t.warm_eni = 0;
    let mut n = node_from(cloud, t, checkpoint_with(x)).await;
    assert_eq!(
        n.ipam.core().ds.pending().len(),
        1,
        "restored from a lagging Describe"
    );
    n.clock.advance(Duration::from_secs(120));
    n.manager.settle(&n.ipam).await;
    assert!(
        n.cloud.eni(&eni2).is_some_and(|e| e.attachment.is_some()),
        "the eni holding the pod's address was freed"
    );
    n.reconciler.tick(&n.ipam, &n.host).await;
    let a = n
        .ipam
        .core()
        .ds
        .lookup(&key(77))
        .expect("placed once EC2 answers");
    assert_eq!((a.ip, a.eni_id), (x, eni2));
}

/// Custom networking's inputs as the Kubernetes layer hands them over (watch channels), plus a
/// record of every refusal reported.
struct CustomNet {
    node: tokio::sync::watch::Sender<Option<crate::k8s::NodeFacts>>,
    configs: tokio::sync::watch::Sender<Arc<crate::k8s::EniConfigs>>,
    refusals: Arc<Mutex<Vec<&'static str>>>,
}

impl CustomNet {
    fn new(zone_label: &str) -> (Self, crate::k8s::CustomNetwork) {
        let facts = crate::k8s::NodeFacts {
            labels: [(
                "topology.kubernetes.io/zone".to_owned(),
                zone_label.to_owned(),
            )]
            .into(),
            ..Default::default()
        };
        let (node, node_rx) = tokio::sync::watch::channel(Some(facts));
        let (configs, configs_rx) = tokio::sync::watch::channel(Arc::new(Default::default()));
        let refusals = Arc::new(Mutex::new(Vec::new()));
        let r = refusals.clone();
        let cn = crate::k8s::CustomNetwork {
            node: node_rx,
            eni_configs: configs_rx,
            keys: crate::k8s::EniConfigKeys {
                annotation: "k8s.amazonaws.com/eniConfig".into(),
                label: "topology.kubernetes.io/zone".into(),
            },
            report: Arc::new(move |x: &crate::k8s::PlacementRefusal| {
                r.lock().unwrap().push(x.kind());
            }),
        };
        (
            Self {
                node,
                configs,
                refusals,
            },
            cn,
        )
    }

    fn set_config(&self, name: &str, subnet: &str, sgs: &[&str]) {
        self.configs.send_modify(|c| {
            Arc::make_mut(c).insert(
                name.into(),
                crate::k8s::EniConfigSpec {
                    subnet: subnet.into(),
                    security_groups: sgs.iter().map(|s| (*s).to_owned()).collect(),
                },
            );
        });
    }

    fn relabel(&self, zone_label: &str) {
        self.node.send_modify(|f| {
            f.as_mut()
                .unwrap()
                .labels
                .insert("topology.kubernetes.io/zone".into(), zone_label.into());
        });
    }
}

/// upstream §1.12: with custom networking every new ENI is created in the node's ENIConfig
/// subnet with its security groups, and the primary ENI never holds a pod address. An
/// ENIConfig whose subnet is in another zone creates nothing; a relabel applies to the ENIs
/// created afterwards.
#[tokio::test(start_paused = true)]
async fn custom_networking_creates_enis_in_the_eniconfig_subnet_and_skips_the_primary() {
    let cloud = FakeCloud::m5_large();
    cloud.add_subnet("subnet-pods-a", "100.64.0.0/24", "us-west-2a");
    cloud.add_subnet("subnet-pods-b", "100.64.2.0/24", "us-west-2b");
    let (cn, custom) = CustomNet::new("us-west-2b");
    cn.set_config("us-west-2a", "subnet-pods-a", &["sg-pods-1", "sg-pods-2"]);
    cn.set_config("us-west-2b", "subnet-pods-b", &["sg-b"]);
    let p = provider(&cloud, "demo").with_custom_network(custom);
    let mut n = node_with(
        cloud.clone(),
        p,
        targets(false),
        MemoryCheckpoint::new(),
        true,
    )
    .await;
    for _ in 0..3 {
        n.pass().await;
        n.clock.advance(Duration::from_secs(5));
    }
    assert_eq!(
        cloud.calls("CreateNetworkInterface"),
        0,
        "no eni in the wrong zone"
    );
    assert_eq!(
        cloud.calls("AssignPrivateIpAddresses"),
        0,
        "the primary eni is never filled"
    );
    assert!(cn.refusals.lock().unwrap().contains(&"wrong_zone"));

    cn.relabel("us-west-2a");
    let pods: Net = "100.64.0.0/24".parse().unwrap();
    for i in 0..12 {
        let ip = n.add(i).await.expect("pod gets an address");
        assert!(
            pods.contains(&ip),
            "pod {i} got {ip}, not from the ENIConfig subnet"
        );
    }
    n.pass().await;
    assert!(
        cloud.eni(PRIMARY_ENI).unwrap().secondary_ips.is_empty(),
        "nothing was assigned to the primary eni"
    );
    let created: Vec<Ec2Eni> = cloud
        .describe_enis(EniQuery::AttachedTo(cloud.instance_id()))
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.eni_id != PRIMARY_ENI)
        .collect();
    assert!(created.len() >= 2, "{created:?}");
    for e in &created {
        assert_eq!(e.subnet_id, "subnet-pods-a");
        assert_eq!(e.security_groups, vec!["sg-pods-1", "sg-pods-2"]);
    }
}

type Net = Ipv4Net;

/// A node whose ENIConfig does not exist: no ENI is created (never one in the primary's
/// subnet), the refusal is reported, and ipamd keeps running; once the ENIConfig appears the
/// next round creates the ENI there.
#[tokio::test(start_paused = true)]
async fn custom_networking_without_an_eniconfig_creates_no_eni() {
    let cloud = FakeCloud::m5_large();
    let (cn, custom) = CustomNet::new("us-west-2a");
    let p = provider(&cloud, "demo").with_custom_network(custom);
    let mut n = node_with(
        cloud.clone(),
        p,
        targets(false),
        MemoryCheckpoint::new(),
        true,
    )
    .await;
    for _ in 0..3 {
        n.pass().await;
        n.clock.advance(Duration::from_secs(5));
    }
    assert_eq!(cloud.calls("CreateNetworkInterface"), 0);
    assert_eq!(
        cloud.calls("AssignPrivateIpAddresses"),
        0,
        "the primary eni is never filled"
    );
    assert!(cn.refusals.lock().unwrap().contains(&"missing_eniconfig"));
    cloud.add_subnet("subnet-pods-a", "100.64.0.0/24", "us-west-2a");
    cn.set_config("us-west-2a", "subnet-pods-a", &["sg-1"]);
    n.pass().await;
    assert!(cloud.calls("CreateNetworkInterface") >= 1);
    let ip = n.add(1).await.expect("address once the ENIConfig exists");
    assert!("100.64.0.0/24".parse::<Net>().unwrap().contains(&ip));
}

/// Churn at `WARM_ENI_TARGET=1` (issue 12): 9 pods on a node of 9-address ENIs, one replaced
/// every 40 s. Each deleted address cools down for 30 s, so the pool needs a third ENI for its
/// warm target; for the 10 s after the cooldown that ENI is spare again. Without the hold the pool freed
/// it and created it again within a minute, over and over; with it the ENI stays while pods
/// come and go, and goes once the churn stops (upstream's steady state, later).
#[tokio::test(start_paused = true)]
async fn churn_does_not_free_and_recreate_the_warm_eni_but_a_quiet_node_still_frees_it() {
    let mut n = node(FakeCloud::m5_large(), targets(false)).await;
    let mut alive: std::collections::VecDeque<u32> = (1..=9).collect();
    for &i in &alive {
        n.add(i).await.unwrap();
    }
    n.pass().await;
    let step = Duration::from_secs(10);
    let mut next = 10;
    let mut last_delete = n.clock.now();
    for k in 0..60 {
        // ten minutes; every 40 s the oldest pod is replaced
        if k % 4 == 0 {
            let old = alive.pop_front().unwrap();
            n.ipam.del(&key(old), "", "", "PodDeleted").unwrap();
            last_delete = n.clock.now();
            n.add(next).await.unwrap();
            alive.push_back(next);
            next += 1;
        }
        n.clock.advance(step);
        tokio::time::advance(step).await;
        n.pass().await;
    }
    let created = n.cloud.calls("CreateNetworkInterface");
    assert!(
        created <= 2,
        "{created} ENIs created for 9 pods under churn: the spare one was re-created"
    );
    assert_eq!(
        n.cloud.calls("DetachNetworkInterface"),
        0,
        "an ENI was freed while pods kept coming and going"
    );
    let enis = n.ipam.core().ds.enis().len();
    // the churn stops: the spare ENI goes after the last address cooled down (30 s) and the
    // hold, not before
    let mut freed_after = None;
    for _ in 1..=30 {
        n.clock.advance(step);
        tokio::time::advance(step).await;
        n.pass().await;
        if freed_after.is_none() && n.cloud.calls("DetachNetworkInterface") > 0 {
            freed_after = n.clock.now().duration_since(last_delete).ok();
        }
    }
    let freed_after = freed_after.expect("a quiet node frees its spare ENI");
    assert!(
        freed_after >= Duration::from_secs(30) + crate::pool::policy::ENI_EXCESS_HOLD,
        "freed {freed_after:?} after the last pod was deleted"
    );
    assert_eq!(n.ipam.core().ds.enis().len(), enis - 1);
    assert_eq!(n.cloud.calls("DetachNetworkInterface"), 1);
}
