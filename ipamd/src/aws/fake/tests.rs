//! Tests of the fake itself: the EC2 rules it enforces. Must not: test ipamd through it (that
//! is `pool::tests`').

use super::*;

#[tokio::test]
async fn enforces_eni_and_address_limits() {
    let cloud = FakeCloud::m5_large();
    let me = cloud.instance_id();
    let mut enis = vec![];
    for dev in 1..=3 {
        let e = cloud
            .create_eni(CreateEni {
                subnet_id: "subnet-fake".into(),
                security_groups: vec![],
                description: "x".into(),
                tags: Tags::new(),
                addresses: AddressRequest::Ips(9),
                conntrack: None,
            })
            .await
            .unwrap();
        enis.push((e.eni_id, dev));
    }
    assert!(cloud.attach_eni(&enis[0].0, &me, 1, 0).await.is_ok());
    assert!(cloud.attach_eni(&enis[1].0, &me, 2, 0).await.is_ok());
    assert_eq!(
        cloud.attach_eni(&enis[2].0, &me, 3, 0).await,
        Err(Ec2Error::AttachmentLimit)
    );
    assert_eq!(
        cloud.assign(&enis[0].0, AddressRequest::Ips(1)).await,
        Err(Ec2Error::AddressLimit)
    );
    assert_eq!(
        cloud
            .delete_eni(&enis[0].0)
            .await
            .map_err(|e| e.metric_code().to_owned()),
        Err("InvalidNetworkInterface.InUse".into())
    );
}

#[tokio::test]
async fn fragmented_subnet_refuses_prefixes_but_not_ips() {
    let cloud = FakeCloud::m5_large();
    cloud.fragment_subnet();
    assert_eq!(
        cloud.assign(PRIMARY_ENI, AddressRequest::Prefixes(1)).await,
        Err(Ec2Error::InsufficientCidrBlocks)
    );
    assert_eq!(
        cloud
            .assign(PRIMARY_ENI, AddressRequest::Ips(2))
            .await
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn imds_lags_behind_changes() {
    let cloud = FakeCloud::m5_large();
    cloud.set_imds_lag(2);
    let got = cloud
        .assign(PRIMARY_ENI, AddressRequest::Ips(1))
        .await
        .unwrap();
    for _ in 0..2 {
        assert!(
            Imds::enis(&cloud).await.unwrap()[0]
                .secondary_ips
                .is_empty()
        );
    }
    assert_eq!(Imds::enis(&cloud).await.unwrap()[0].pod_cidrs(), got);
}

#[tokio::test]
async fn persisted_world_outlives_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ec2.json");
    let cloud = FakeCloud::m5_large().persisted_in(path.clone());
    let got = cloud
        .assign(PRIMARY_ENI, AddressRequest::Ips(2))
        .await
        .unwrap();
    cloud.fail_next("AssignPrivateIpAddresses", Ec2Error::Throttled);
    let again = FakeCloud::m5_large().persisted_in(path);
    assert_eq!(again.eni(PRIMARY_ENI).unwrap().pod_cidrs(), got);
    // injections and counters belong to the test step, not to EC2
    assert_eq!(again.calls("AssignPrivateIpAddresses"), 0);
    assert!(
        again
            .assign(PRIMARY_ENI, AddressRequest::Ips(1))
            .await
            .is_ok()
    );
    assert_eq!(again.subnet_free(), cloud.subnet_free() - 1);
}
