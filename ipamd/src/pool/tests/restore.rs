//! Scenarios of restore (pending entries confirmed with EC2) and custom networking.

use super::*;

#[tokio::test(start_paused = true)]
async fn node_init_survives_a_create_tags_permission_error() {
    // Issue 18 item 8: an untagged managed ENI and an IAM policy without ec2:CreateTags made
    // node init fail, so ipamd crash-looped. Tagging is best effort.
    let cloud = FakeCloud::m5_large();
    cloud.add_foreign_eni(Tags::new(), 2, Some(1));
    cloud.fail_next(
        "CreateTags",
        crate::aws::error::Ec2Error::Unauthorized("ec2:CreateTags".into()),
    );
    let p = provider(&cloud, "demo");
    let enis = crate::node_init::discover(&p, true)
        .await
        .expect("node init goes on without the tags");
    assert_eq!(enis.len(), 2);
    // the primary's (refused) and the secondary's
    assert_eq!(cloud.calls("CreateTags"), 2);
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
    assert_eq!(n.ipam.index.store().pending().len(), 1);
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
        n.ipam.index.store().pending().len(),
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
        n.ipam.index.store().pending().len(),
        1,
        "restored from a lagging Describe"
    );
    n.clock.advance(Duration::from_secs(120));
    n.manager.settle(&n.ipam).await;
    assert!(
        n.cloud.eni(&eni2).is_some_and(|e| e.attachment.is_some()),
        "the eni holding the pod's address was freed"
    );
    n.reconciler
        .tick(&n.ipam, n.manager.provider(), &n.host)
        .await;
    let a = n
        .ipam
        .index
        .store()
        .lookup(&key(77))
        .expect("placed once EC2 answers");
    assert_eq!((a.ip, a.eni_id), (x, eni2));
}

/// A provisioning node with custom networking `custom`, restarted from `checkpoint`.
async fn custom_node(
    cloud: &FakeCloud,
    custom: crate::k8s::CustomNetwork,
    checkpoint: MemoryCheckpoint,
) -> Node {
    let p = provider(cloud, "demo").with_custom_networking(true);
    let mut n = node_with(cloud.clone(), p, targets(false), checkpoint, true).await;
    // the pool places new ENIs by the ENIConfig (`pool::placement`), the provider executes
    n.manager = Manager::new(n.manager.provider().clone()).with_custom_network(Some(custom));
    n
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
                    warm_annotations: std::collections::BTreeMap::new(),
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
    let mut n = custom_node(&cloud, custom, MemoryCheckpoint::new()).await;
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

/// Issue 39: an ENIConfig without `securityGroups` (the CRD requires only `subnet`) gives new
/// ENIs the primary ENI's groups, as upstream `createENIUsingCustomCfg` does, never an empty
/// list (EC2 would put the VPC's default security group on every pod of the ENI).
#[tokio::test(start_paused = true)]
async fn custom_networking_without_eniconfig_groups_uses_the_primary_enis_groups() {
    let cloud = FakeCloud::m5_large();
    cloud.add_subnet("subnet-pods-a", "100.64.0.0/24", "us-west-2a");
    let primary_groups = cloud.eni(PRIMARY_ENI).unwrap().security_groups;
    assert!(!primary_groups.is_empty());
    let (cn, custom) = CustomNet::new("us-west-2a");
    cn.set_config("us-west-2a", "subnet-pods-a", &[]);
    let mut n = custom_node(&cloud, custom, MemoryCheckpoint::new()).await;
    n.add(1).await.expect("pod gets an address");
    let created: Vec<Ec2Eni> = cloud
        .all_enis()
        .into_iter()
        .filter(|e| e.eni_id != PRIMARY_ENI && e.subnet_id == "subnet-pods-a")
        .collect();
    assert!(!created.is_empty());
    let mut want = primary_groups.clone();
    want.sort();
    for e in &created {
        assert_eq!(e.security_groups, want, "{}", e.eni_id);
    }
}

/// Custom networking switched on over a checkpoint whose pods sit on the primary ENI (an
/// operator turns it on and ipamd restarts on a running node): the pods keep their addresses,
/// the primary's free addresses go to no new pod, new pods come from the ENIConfig subnet, and
/// an old pod's DEL releases its address. (Upstream drops such entries at restore: the
/// primary ENI's addresses are not in its datastore under custom networking.)
#[tokio::test(start_paused = true)]
async fn custom_networking_switched_on_keeps_the_pods_on_the_primary_eni() {
    let cloud = FakeCloud::m5_large();
    cloud.add_subnet("subnet-pods-a", "100.64.0.0/24", "us-west-2a");
    let checkpoint = MemoryCheckpoint::new();
    let mut before = node_from(cloud.clone(), targets(false), checkpoint.clone()).await;
    let mut old = Vec::new();
    for i in 0..3 {
        old.push(before.add(i).await.expect("pod before the switch"));
    }
    let primary = cloud.eni(PRIMARY_ENI).unwrap().secondary_ips;
    assert!(
        old.iter().all(|ip| primary.contains(ip)),
        "the first pods fill the primary eni: {old:?} vs {primary:?}"
    );
    drop(before);

    let (cn, custom) = CustomNet::new("us-west-2a");
    cn.set_config("us-west-2a", "subnet-pods-a", &["sg-pods"]);
    let mut n = custom_node(&cloud, custom, checkpoint).await;
    for (i, ip) in (0..).zip(&old) {
        let a = n
            .ipam
            .index
            .store()
            .lookup(&key(i))
            .map(|a| (a.ip, a.eni_id));
        assert_eq!(a, Some((*ip, PRIMARY_ENI.to_owned())), "pod {i} kept");
    }
    let pods: Net = "100.64.0.0/24".parse().unwrap();
    for i in 10..22 {
        let ip = n.add(i).await.expect("new pod after the switch");
        assert!(
            pods.contains(&ip),
            "pod {i} got {ip}, not from the ENIConfig subnet"
        );
        assert!(!primary.contains(&ip), "pod {i} got a primary eni address");
    }
    let released = n
        .ipam
        .del(&key(0), "", "", "PodDeleted")
        .expect("old pod's DEL");
    assert_eq!(released.ip, old[0]);
    assert!(n.ipam.index.store().lookup(&key(0)).is_none());
    n.pass().await;
    for (i, ip) in (1..).zip(&old[1..]) {
        assert_eq!(
            n.ipam.index.store().lookup(&key(i)).map(|a| a.ip),
            Some(*ip)
        );
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
    let mut n = custom_node(&cloud, custom, MemoryCheckpoint::new()).await;
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
