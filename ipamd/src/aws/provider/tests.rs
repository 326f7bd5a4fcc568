//! Subnet discovery, exclusion and connection tracking at the EC2 provider, against the fake
//! cloud (upstream v1.23.1 `pkg/awsutils/awsutils.go` `createENI`, `GetVpcSubnets`,
//! `IsSubnetExcluded`, `setConnectionTrackingSettings`; `pkg/ipamd/ipamd.go`
//! `excludedENIBasedOnSubnetTags`). Through the `EniProvider` port only, no `Ipam`. Must not:
//! reach the pool executor (`pool::tests` drives the manager and reconciler).

use super::*;
use crate::aws::ConntrackSpec;
use crate::aws::fake::FakeCloud;
use crate::aws::subnets::TAG_ROLE_CNI;
use crate::metrics::Metrics;
use crate::pool::ec2_port::{NewEni, ProviderError, Unplaceable};

type Provider = Ec2Provider<FakeCloud, FakeCloud>;

fn provider(cloud: &FakeCloud, cluster: &str) -> Provider {
    Provider::over_fake(cloud, cluster)
}

/// The fake's primary subnet (198.18.0.0/24, 250 free) plus, in the node's zone: `subnet-big`
/// (/25, tagged), `subnet-small` (/27, tagged), `subnet-off` (/24, tagged `=0`),
/// `subnet-untagged` (/24); and `subnet-other-zone` (/24, tagged) in us-west-2b.
fn cloud_with_subnets() -> FakeCloud {
    let cloud = FakeCloud::m5_large().with_vpc_cidr("198.18.0.0/16".parse().unwrap());
    for (id, cidr, az, tag) in [
        ("subnet-big", "198.18.1.0/25", "us-west-2a", Some("1")),
        ("subnet-small", "198.18.2.0/27", "us-west-2a", Some("1")),
        ("subnet-off", "198.18.3.0/24", "us-west-2a", Some("0")),
        ("subnet-untagged", "198.18.4.0/24", "us-west-2a", None),
        (
            "subnet-other-zone",
            "198.18.5.0/24",
            "us-west-2b",
            Some("1"),
        ),
    ] {
        cloud.add_subnet(id, cidr, az);
        if let Some(v) = tag {
            cloud.tag_subnet(id, TAG_ROLE_CNI, v);
        }
    }
    cloud
}

async fn listed(p: &Provider) -> Vec<AttachedEni> {
    p.list_enis().await.expect("list enis")
}

fn new_eni() -> NewEni {
    NewEni {
        secondary_ips: 9,
        prefixes: 0,
        placement: None,
    }
}

/// `createENI` with discovery: the zone's valid subnets by `AvailableIpAddressCount`, most
/// first; the primary subnet (untagged, 250 free) beats the tagged /25 (123 free); a `=0`
/// subnet and an untagged secondary one are never used, nor a subnet of another zone. The new
/// ENI has the primary ENI's security groups and connection tracking.
#[tokio::test(start_paused = true)]
async fn new_enis_go_to_the_valid_subnet_with_most_free_addresses() {
    let cloud = cloud_with_subnets();
    let conntrack = ConntrackSpec {
        tcp_established_timeout: Some(300),
        udp_stream_timeout: Some(90),
        udp_timeout: None,
    };
    cloud.set_primary_conntrack(Some(conntrack));
    // The primary subnet has the most free addresses: it comes first.
    let metrics = Arc::new(Metrics::new());
    let p = provider(&cloud, "demo")
        .with_metrics(crate::aws::metrics::AwsMetrics::new(metrics.clone()));
    listed(&p).await;
    let first = p.create_eni(new_eni()).await.expect("first eni");
    assert_eq!(first.subnet_id, "subnet-fake");
    // Leave the primary subnet 40 free: the tagged /25 (123 free) leads now.
    cloud.fill_subnet(40);
    let second = p.create_eni(new_eni()).await.expect("second eni");
    assert_eq!(second.subnet_id, "subnet-big", "most free addresses first");
    let ec2 = cloud.eni(&second.id).expect("in ec2");
    assert_eq!(ec2.security_groups, ["sg-fake"], "primary eni's groups");
    assert_eq!(
        ec2.conntrack,
        Some(conntrack),
        "primary eni's conntrack copied"
    );
    assert!(!second.is_excluded && !second.subnet_excluded);
    for e in cloud.all_enis() {
        assert!(
            !["subnet-off", "subnet-untagged", "subnet-other-zone"].contains(&e.subnet_id.as_str()),
            "{} in {}",
            e.eni_id,
            e.subnet_id
        );
    }
    // Every DescribeSubnets recorded each subnet's free addresses.
    let free = |s: &str| {
        metrics
            .subnet_available_ip_addresses
            .get([s])
            .map(|x| x.value)
            .unwrap_or(-1.0)
    };
    assert_eq!(free("subnet-off"), 251.0);
    assert_eq!(free("subnet-big"), 123.0, "as seen before the second eni");
    assert_eq!(free("subnet-other-zone"), -1.0, "other zone: not described");
}

/// `createENI` tries the next subnet when `CreateNetworkInterface` fails in one (here the
/// subnet ran out between the Describe and the Create: `InsufficientFreeAddressesInSubnet`).
#[tokio::test(start_paused = true)]
async fn a_full_subnet_moves_the_new_eni_to_the_next() {
    let cloud = cloud_with_subnets();
    cloud.fill_subnet(0);
    let p = provider(&cloud, "demo");
    listed(&p).await;
    cloud.fail_next("CreateNetworkInterface", Ec2Error::SubnetFull);
    let eni = p
        .create_eni(new_eni())
        .await
        .expect("created in the next subnet");
    assert_eq!(
        eni.subnet_id, "subnet-small",
        "big failed: the next by free addresses"
    );
    assert_eq!(cloud.calls("CreateNetworkInterface"), 2);
}

/// `createENI` with discovery on and no valid subnet (primary tagged `=0`, no other tagged):
/// a clear error, no ENI created.
#[tokio::test(start_paused = true)]
async fn no_valid_subnet_is_a_clear_error() {
    let cloud = FakeCloud::m5_large();
    cloud.tag_subnet("subnet-fake", TAG_ROLE_CNI, "0");
    let p = provider(&cloud, "demo");
    listed(&p).await;
    let err = p.create_eni(new_eni()).await.unwrap_err();
    assert!(
        matches!(&err, ProviderError::Misconfigured(u @ Unplaceable::NoValidSubnet) if u.to_string().contains("kubernetes.io/role/cni=0")),
        "{err}"
    );
    assert_eq!(cloud.calls("CreateNetworkInterface"), 0);
}

/// `ENABLE_SUBNET_DISCOVERY=false`: the primary subnet only, even when a tagged one has more
/// free addresses; refused when the primary subnet is tagged `=0` (upstream's message names
/// the disabled discovery).
#[tokio::test(start_paused = true)]
async fn discovery_off_uses_the_primary_subnet_only() {
    let cloud = cloud_with_subnets();
    cloud.fill_subnet(20);
    let p = Ec2Provider::new(
        Arc::new(cloud.clone()),
        Arc::new(cloud.clone()),
        ProviderSettings {
            subnet_discovery: false,
            ..ProviderSettings::upstream("demo".into(), Tags::new())
        },
    );
    listed(&p).await;
    let eni = p.create_eni(new_eni()).await.expect("eni");
    assert_eq!(eni.subnet_id, "subnet-fake");
    cloud.tag_subnet("subnet-fake", TAG_ROLE_CNI, "0");
    let err = p.create_eni(new_eni()).await.unwrap_err();
    assert!(
        err.to_string().contains("subnet discovery is disabled"),
        "{err}"
    );
}

/// `excludedENIBasedOnSubnetTags`: ENIs in a subnet tagged `=0` (here the primary subnet) are
/// excluded from new pod addresses, but keep their addresses (pods hold them) unlike a
/// `no_manage` ENI; decided once per ENI (one DescribeSubnets for the listing, none after).
#[tokio::test(start_paused = true)]
async fn enis_in_an_excluded_subnet_are_excluded_but_keep_their_addresses() {
    let cloud = FakeCloud::m5_large();
    let mine: Tags = [(TAG_INSTANCE_ID.to_owned(), cloud.instance_id())].into();
    let secondary = cloud.add_foreign_eni(mine, 3, Some(1));
    cloud.tag_subnet("subnet-fake", TAG_ROLE_CNI, "0");
    let p = provider(&cloud, "demo");
    let enis = listed(&p).await;
    let eni = enis.iter().find(|e| e.id == secondary).expect("listed");
    assert!(eni.is_excluded && eni.subnet_excluded);
    assert_eq!(eni.secondary_ips.len(), 3, "addresses stay listed");
    let primary = enis.iter().find(|e| e.is_primary).expect("primary");
    assert!(primary.is_excluded && primary.subnet_excluded);
    assert_eq!(cloud.calls("DescribeSubnets"), 1);
    listed(&p).await;
    assert_eq!(cloud.calls("DescribeSubnets"), 1, "decided once per eni");
    // The IMDS hint agrees with EC2's listing.
    let hint = p.imds_view().await.expect("imds");
    assert!(hint.iter().all(|e| e.subnet_excluded));
}

/// Discovery off: subnet tags are not read for existing ENIs (upstream checks them only with
/// discovery on).
#[tokio::test(start_paused = true)]
async fn discovery_off_reads_no_subnet_tags_for_existing_enis() {
    let cloud = FakeCloud::m5_large();
    cloud.tag_subnet("subnet-fake", TAG_ROLE_CNI, "0");
    let p = Ec2Provider::new(
        Arc::new(cloud.clone()),
        Arc::new(cloud.clone()),
        ProviderSettings {
            subnet_discovery: false,
            ..ProviderSettings::upstream("demo".into(), Tags::new())
        },
    );
    assert!(listed(&p).await.iter().all(|e| !e.is_excluded));
    assert_eq!(cloud.calls("DescribeSubnets"), 0);
}

/// `setConnectionTrackingSettings`: without connection tracking on the primary ENI, new ENIs
/// are created without `ConnectionTrackingSpecification`.
#[tokio::test(start_paused = true)]
async fn no_primary_conntrack_sends_none() {
    let cloud = FakeCloud::m5_large();
    let p = provider(&cloud, "demo");
    listed(&p).await;
    let eni = p.create_eni(new_eni()).await.expect("eni");
    assert_eq!(cloud.eni(&eni.id).expect("in ec2").conntrack, None);
}

/// The security-group follower against a race: an ENI created with the groups read just before
/// the node's changed, listed by IMDS only after the check that applied the change (here: that
/// check already recorded the new set in `applied`), gets the new set at the next check, which
/// does not count as a change. A check after that calls EC2 no more, and the next ENI is created
/// with the new set.
#[tokio::test(start_paused = true)]
async fn an_eni_created_with_the_old_groups_gets_the_new_set_at_the_next_check() {
    use crate::aws::ec2::Ec2 as _;
    let cloud = FakeCloud::m5_large();
    let p = provider(&cloud, "demo");
    let primary = listed(&p)
        .await
        .into_iter()
        .find(|e| e.is_primary)
        .expect("primary eni")
        .id;
    let mut applied = BTreeSet::new();
    let first = p
        .check_security_groups(&mut applied, false, true)
        .await
        .expect("first check");
    assert_eq!(first.added, ["sg-fake"]);
    assert!(first.updated.is_empty(), "every eni carries sg-fake");

    let late = p.create_eni(new_eni()).await.expect("eni").id;
    cloud
        .set_security_groups(&primary, &["sg-new".to_owned()])
        .await
        .expect("the operator changes the node's groups");
    applied = BTreeSet::from(["sg-new".to_owned()]);
    let modify = cloud.calls("ModifyNetworkInterfaceAttribute");

    let second = p
        .check_security_groups(&mut applied, false, true)
        .await
        .expect("second check");
    assert!(
        second.added.is_empty() && second.removed.is_empty(),
        "{second:?}"
    );
    assert_eq!(second.updated, [late.as_str()]);
    assert_eq!(
        cloud.eni(&late).expect("late eni").security_groups,
        ["sg-new"]
    );
    assert_eq!(cloud.calls("ModifyNetworkInterfaceAttribute"), modify + 1);

    let third = p
        .check_security_groups(&mut applied, false, true)
        .await
        .expect("third check");
    assert_eq!(third, GroupCheck::default());
    assert_eq!(cloud.calls("ModifyNetworkInterfaceAttribute"), modify + 1);

    // a change seen by a check is what the next ENI gets
    cloud
        .set_security_groups(&primary, &["sg-newer".to_owned()])
        .await
        .expect("changed again");
    p.check_security_groups(&mut applied, false, true)
        .await
        .expect("fourth check");
    let next = p.create_eni(new_eni()).await.expect("eni").id;
    assert_eq!(
        cloud.eni(&next).expect("next eni").security_groups,
        ["sg-newer"]
    );
}

/// An ENI EC2 refused the node's groups for (here: a missing permission) is asked again when the
/// groups change, as upstream, not at every check: the follower's period would otherwise cost an
/// EC2 call per node for as long as the permission is missing.
#[tokio::test(start_paused = true)]
async fn a_refused_eni_is_asked_again_at_the_next_change_not_at_every_check() {
    use crate::aws::ec2::Ec2 as _;
    let cloud = FakeCloud::m5_large();
    let p = provider(&cloud, "demo");
    let primary = listed(&p)
        .await
        .into_iter()
        .find(|e| e.is_primary)
        .expect("primary eni")
        .id;
    let mut applied = BTreeSet::new();
    p.check_security_groups(&mut applied, false, true)
        .await
        .expect("first check");
    let other = p.create_eni(new_eni()).await.expect("eni").id;

    cloud
        .set_security_groups(&primary, &["sg-new".to_owned()])
        .await
        .expect("the operator changes the node's groups");
    cloud.fail_next(
        "ModifyNetworkInterfaceAttribute",
        crate::aws::Ec2Error::Unauthorized("ec2:ModifyNetworkInterfaceAttribute".into()),
    );
    let refused = p
        .check_security_groups(&mut applied, false, true)
        .await
        .expect("the change's check");
    assert_eq!(refused.failed, [other.as_str()]);
    let modify = cloud.calls("ModifyNetworkInterfaceAttribute");
    for _ in 0..3 {
        let quiet = p
            .check_security_groups(&mut applied, false, true)
            .await
            .expect("a check without a change");
        assert_eq!(quiet, GroupCheck::default());
    }
    assert_eq!(cloud.calls("ModifyNetworkInterfaceAttribute"), modify);

    cloud
        .set_security_groups(&primary, &["sg-newer".to_owned()])
        .await
        .expect("changed again");
    let next = p
        .check_security_groups(&mut applied, false, true)
        .await
        .expect("the next change's check");
    assert_eq!(next.updated, [other.as_str()]);
    assert_eq!(
        cloud.eni(&other).expect("eni").security_groups,
        ["sg-newer"]
    );
}
