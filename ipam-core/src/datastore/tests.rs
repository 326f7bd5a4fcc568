//! Tests of the datastore's invariants and transitions.

use super::*;

pub(crate) fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
}

fn spec(id: &str, dev: u32) -> EniIdentity {
    EniIdentity {
        id: id.into(),
        device_number: dev,
        network_card: 0,
        is_primary: dev == 0,
        is_trunk: false,
        is_efa: false,
        is_excluded: false,
        subnet_id: "subnet-1".into(),
        subnet: "198.18.0.0/24".parse().unwrap(),
        mac: format!("02:00:00:00:00:{dev:02x}"),
        primary_ip: std::net::Ipv4Addr::new(198, 18, 0, 200),
    }
}

fn ds_with(ips: &[&str]) -> DataStore {
    let mut ds = DataStore::new(Duration::from_secs(30));
    ds.add_eni(spec("eni-0", 0), t(0)).unwrap();
    for ip in ips {
        ds.add_cidr("eni-0", format!("{ip}/32").parse().unwrap(), false)
            .unwrap();
    }
    ds
}

fn key(c: &str) -> IpamKey {
    IpamKey::new("aws-cni", c, "eth0")
}

#[test]
fn assign_is_idempotent_per_key() {
    let mut ds = ds_with(&["198.18.0.10", "198.18.0.11"]);
    let a = ds.assign(&key("a"), PodMetadata::default(), t(1)).unwrap();
    let again = ds.assign(&key("a"), PodMetadata::default(), t(2)).unwrap();
    assert_eq!(a, again);
    let b = ds.assign(&key("b"), PodMetadata::default(), t(2)).unwrap();
    assert_ne!(a.ip, b.ip);
    assert_eq!(
        ds.assign(&key("c"), PodMetadata::default(), t(3)),
        Err(DatastoreError::NoAvailableAddress)
    );
    assert_eq!(a.route_table, dataplane::conventions::MAIN_TABLE);
}

#[test]
fn cooling_addresses_are_not_available_and_not_reused() {
    let mut ds = ds_with(&["198.18.0.10"]);
    ds.assign(&key("a"), PodMetadata::default(), t(0)).unwrap();
    ds.unassign(&key("a"), t(10)).unwrap();
    let s = ds.stats(t(20));
    assert_eq!((s.total, s.cooling, s.available()), (1, 1, 0));
    assert_eq!(
        ds.assign(&key("b"), PodMetadata::default(), t(20)),
        Err(DatastoreError::NoAvailableAddress)
    );
    assert_eq!(ds.stats(t(40)).available(), 1);
    assert!(ds.assign(&key("b"), PodMetadata::default(), t(40)).is_ok());
}

#[test]
fn reuse_prefers_longest_free() {
    let mut ds = DataStore::new(Duration::ZERO);
    ds.add_eni(spec("eni-0", 0), t(0)).unwrap();
    for ip in ["198.18.0.10", "198.18.0.11", "198.18.0.12"] {
        ds.add_cidr("eni-0", format!("{ip}/32").parse().unwrap(), false)
            .unwrap();
    }
    for c in ["a", "b", "c"] {
        ds.assign(&key(c), PodMetadata::default(), t(0)).unwrap();
    }
    ds.unassign(&key("b"), t(5)).unwrap(); // .11 freed at 5
    ds.unassign(&key("a"), t(7)).unwrap(); // .10 freed at 7
    let d = ds.assign(&key("d"), PodMetadata::default(), t(9)).unwrap();
    assert_eq!(d.ip, "198.18.0.11".parse::<Ipv4Addr>().unwrap());
}

#[test]
fn prefixes_pack_into_the_fullest() {
    let mut ds = DataStore::new(Duration::ZERO);
    ds.add_eni(spec("eni-0", 0), t(0)).unwrap();
    ds.add_cidr("eni-0", "198.18.0.16/28".parse().unwrap(), true)
        .unwrap();
    ds.add_cidr("eni-0", "198.18.0.32/28".parse().unwrap(), true)
        .unwrap();
    let a = ds.assign(&key("a"), PodMetadata::default(), t(0)).unwrap();
    for i in 0..5 {
        let b = ds
            .assign(&key(&format!("x{i}")), PodMetadata::default(), t(0))
            .unwrap();
        assert!(
            "198.18.0.16/28".parse::<Ipv4Net>().unwrap().contains(&b.ip)
                == "198.18.0.16/28".parse::<Ipv4Net>().unwrap().contains(&a.ip)
        );
    }
    let s = ds.stats(t(0));
    assert_eq!((s.total, s.prefixes, s.free_prefixes), (32, 2, 1));
}

#[test]
fn in_use_cidrs_and_enis_cannot_be_removed() {
    let mut ds = ds_with(&["198.18.0.10"]);
    ds.add_eni(spec("eni-1", 1), t(0)).unwrap();
    ds.add_cidr("eni-1", "198.18.0.20/32".parse().unwrap(), false)
        .unwrap();
    ds.assign(&key("a"), PodMetadata::default(), t(0)).unwrap();
    assert!(matches!(
        ds.remove_cidr("eni-0", "198.18.0.10/32".parse().unwrap()),
        Err(DatastoreError::InUse(_))
    ));
    assert!(ds.remove_eni("eni-1").is_ok());
    assert!(matches!(
        ds.add_cidr("eni-0", "198.18.0.10/32".parse().unwrap(), false),
        Err(DatastoreError::DuplicateCidr(_))
    ));
}

#[test]
fn restore_keeps_unknown_addresses_pending_and_adopts_them_later() {
    let mut ds = ds_with(&["198.18.0.10"]);
    ds.assign(&key("a"), PodMetadata::default(), t(0)).unwrap();
    let mut data = ds.checkpoint_data();
    data.allocations.push(CheckpointEntry::new(
        key("b"),
        "198.18.0.99".parse().unwrap(),
        PodMetadata::default(),
        t(1),
    ));
    let mut fresh = ds_with(&["198.18.0.10"]);
    assert!(fresh.restore(&data).is_empty());
    assert_eq!(fresh.pending().len(), 1);
    assert_eq!(
        fresh.checkpoint_data().allocations.len(),
        2,
        "pending entries are written back"
    );
    assert_eq!(
        fresh.assign(&key("b"), PodMetadata::default(), t(2)),
        Err(DatastoreError::PendingVerification(
            "198.18.0.99".parse().unwrap()
        ))
    );
    fresh
        .add_cidr("eni-0", "198.18.0.99/32".parse().unwrap(), false)
        .unwrap();
    assert!(fresh.pending().is_empty());
    assert_eq!(
        fresh.lookup(&key("b")).unwrap().ip,
        "198.18.0.99".parse::<Ipv4Addr>().unwrap()
    );
    assert_eq!(
        fresh.lookup(&key("a")).unwrap().ip,
        "198.18.0.10".parse::<Ipv4Addr>().unwrap()
    );
}

#[test]
fn restore_rejects_duplicates() {
    let ds = ds_with(&["198.18.0.10"]);
    let data = CheckpointData::new(vec![
        CheckpointEntry::new(
            key("a"),
            "198.18.0.10".parse().unwrap(),
            PodMetadata::default(),
            t(0),
        ),
        CheckpointEntry::new(
            key("b"),
            "198.18.0.10".parse().unwrap(),
            PodMetadata::default(),
            t(0),
        ),
    ]);
    let mut fresh = ds.clone();
    assert_eq!(fresh.restore(&data).len(), 1);
    assert_eq!(fresh.assigned_count(), 1);
}

#[test]
fn stats_and_min_lifetime() {
    let mut ds = ds_with(&["198.18.0.10", "198.18.0.11"]);
    ds.add_eni(spec("eni-1", 1), t(100)).unwrap();
    ds.add_cidr("eni-1", "198.18.0.20/32".parse().unwrap(), false)
        .unwrap();
    ds.assign(&key("a"), PodMetadata::default(), t(100))
        .unwrap();
    let s = ds.stats(t(130));
    assert_eq!((s.total, s.assigned, s.available()), (3, 1, 2));
    assert!(!s.enis[1].past_min_lifetime);
    assert!(ds.stats(t(160)).enis[1].past_min_lifetime);
    assert_eq!(s.enis[1].free_cidrs.len(), 1);
}
