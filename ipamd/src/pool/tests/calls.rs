//! Scenarios of the EC2 budget a node spends at rest (issue 12: idle fleet): no mutating call,
//! no Describe while IMDS agrees, none at all in IMDS-only mode.

use super::*;

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
    let enis = crate::node_init::discover(&p, true)
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

/// Issue 39: IMDS-only mode on an instance type the built-in table does not know still asks
/// EC2 for its limits (`DescribeInstanceTypes`, as upstream's `initWithEC2Metadata` does in
/// every mode): a new instance family must not stop the node. Before: an error at start.
#[tokio::test(start_paused = true)]
async fn imds_only_mode_asks_ec2_for_the_limits_of_an_unknown_type() {
    let m5 = crate::aws::limits::lookup("m5.large").expect("m5.large");
    let cloud = FakeCloud::new("sim9.newfamily", m5, "198.18.0.0/24");
    let settings = ProviderSettings {
        imds_only: true,
        ..ProviderSettings::upstream("demo".into(), Tags::new())
    };
    let p = Ec2Provider::new(Arc::new(cloud.clone()), Arc::new(cloud.clone()), settings);
    let l = crate::pool::ec2_port::EniProvider::instance_limits(&p)
        .await
        .expect("limits of a type the table does not know");
    assert_eq!((l.max_enis, l.ipv4_per_eni), (m5.max_enis, m5.ipv4_per_eni));
    assert_eq!(cloud.calls("DescribeInstanceTypes"), 1);
}

/// Issue 39, upstream `nodeInit` → `TagENI`: with provisioning on, every managed ENI but the
/// trunk is tagged, the primary too, and a tag whose value changed since (`CLUSTER_NAME`,
/// `ADDITIONAL_ENI_TAGS`) is corrected; the creation time is never rewritten. With
/// `DISABLE_NETWORK_RESOURCE_PROVISIONING` no ENI is tagged. Before: the primary never, values
/// never corrected, and tags written with provisioning off.
#[tokio::test(start_paused = true)]
async fn node_init_tags_every_managed_eni_and_corrects_changed_values() {
    let cloud = FakeCloud::m5_large();
    let old: Tags = [
        (
            "cluster.k8s.amazonaws.com/name".to_owned(),
            "old-name".to_owned(),
        ),
        (
            "node.k8s.amazonaws.com/createdAt".to_owned(),
            "2020-01-01T00:00:00Z".to_owned(),
        ),
    ]
    .into_iter()
    .collect();
    let secondary = cloud.add_foreign_eni(old, 2, Some(1));
    let trunk = cloud.add_trunk_eni(2);
    let p = provider(&cloud, "demo");
    crate::node_init::discover(&p, false)
        .await
        .expect("node init");
    assert_eq!(
        cloud.calls("CreateTags"),
        0,
        "provisioning off: no tag written"
    );

    let p = provider(&cloud, "demo");
    crate::node_init::discover(&p, true)
        .await
        .expect("node init");
    let tags = |id: &str| cloud.eni(id).expect("eni").tags;
    assert_eq!(
        tags(PRIMARY_ENI).get("node.k8s.amazonaws.com/instance_id"),
        Some(&cloud.instance_id()),
        "the primary is tagged"
    );
    let s = tags(&secondary);
    assert_eq!(
        s.get("cluster.k8s.amazonaws.com/name").map(String::as_str),
        Some("demo"),
        "a changed value is corrected"
    );
    assert_eq!(
        s.get("node.k8s.amazonaws.com/createdAt")
            .map(String::as_str),
        Some("2020-01-01T00:00:00Z"),
        "the creation time stays"
    );
    assert!(tags(&trunk).is_empty(), "the trunk is the controller's");
    let calls = cloud.calls("CreateTags");
    let p = provider(&cloud, "demo");
    crate::node_init::discover(&p, true)
        .await
        .expect("node init");
    assert_eq!(cloud.calls("CreateTags"), calls, "tagged ENIs cost no call");
}
