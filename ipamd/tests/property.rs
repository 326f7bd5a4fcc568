//! Property test: random interleavings of ADD, DEL, pool growth and shrink (with provider
//! failures), time passing and daemon restarts from the checkpoint never give one address to
//! two keys and never lose an acknowledged allocation.

// Integration tests live at the top level of their own crate.
#![allow(clippy::tests_outside_test_module)]

use crate::common;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ipamd::aws::memory::MemoryProvider;
use ipamd::datastore::IpamKey;
use ipamd::datastore::checkpoint::MemoryCheckpoint;
use ipamd::ipam::{Ipam, IpamError};
use ipamd::pool::ec2_port::{
    AttachedEni, EniProvider, InstanceLimits, NewEni, NodeNetwork, ProviderError,
};
use ipamd::pool::manager::Manager;
use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Clone)]
enum Op {
    Add(u8),
    Del(u8),
    Settle,
    FailingSettle,
    Advance(u16),
    Restart,
    /// Restart while the provider's ENI list misses the secondary ENIs (stale IMDS, #3824).
    RestartStale,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..14).prop_map(Op::Add),
        3 => (0u8..14).prop_map(Op::Del),
        3 => Just(Op::Settle),
        1 => Just(Op::FailingSettle),
        2 => (1u16..90).prop_map(Op::Advance),
        1 => Just(Op::Restart),
        1 => Just(Op::RestartStale),
    ]
}

fn key(k: u8) -> IpamKey {
    IpamKey::new("aws-cni", &format!("container-{k}"), "eth0")
}

/// The in-memory provider, optionally hiding every secondary ENI from `list_enis`.
#[derive(Debug, Clone)]
struct Hiding {
    inner: MemoryProvider,
    hide: Arc<AtomicBool>,
}

impl EniProvider for Hiding {
    async fn instance_limits(&self) -> Result<InstanceLimits, ProviderError> {
        self.inner.instance_limits().await
    }
    async fn node_network(&self) -> Result<NodeNetwork, ProviderError> {
        self.inner.node_network().await
    }
    async fn list_enis(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        let mut v = self.inner.list_enis().await?;
        if self.hide.load(Ordering::SeqCst) {
            v.retain(|e| e.is_primary);
        }
        Ok(v)
    }
    async fn assign_ips(&self, eni_id: &str, count: u32) -> Result<Vec<Ipv4Addr>, ProviderError> {
        self.inner.assign_ips(eni_id, count).await
    }
    async fn assign_prefixes(
        &self,
        eni_id: &str,
        count: u32,
    ) -> Result<Vec<ipnet::Ipv4Net>, ProviderError> {
        self.inner.assign_prefixes(eni_id, count).await
    }
    async fn create_eni(&self, req: NewEni) -> Result<AttachedEni, ProviderError> {
        self.inner.create_eni(req).await
    }
    async fn unassign_ips(&self, eni_id: &str, ips: &[Ipv4Addr]) -> Result<(), ProviderError> {
        self.inner.unassign_ips(eni_id, ips).await
    }
    async fn unassign_prefixes(
        &self,
        eni_id: &str,
        prefixes: &[ipnet::Ipv4Net],
    ) -> Result<(), ProviderError> {
        self.inner.unassign_prefixes(eni_id, prefixes).await
    }
    async fn free_eni(&self, eni_id: &str) -> Result<(), ProviderError> {
        self.inner.free_eni(eni_id).await
    }
}

fn check(
    ipam: &Ipam,
    cp: &MemoryCheckpoint,
    model: &BTreeMap<u8, Ipv4Addr>,
) -> Result<(), TestCaseError> {
    let ds = ipam.index.read(Clone::clone);
    prop_assert_eq!(
        ds.assigned_count(),
        model.len(),
        "datastore holds exactly the acknowledged keys"
    );
    for (k, ip) in model {
        let held = ds
            .lookup(&key(*k))
            .map(|a| a.ip)
            .or_else(|| ds.pending().iter().find(|p| p.key == key(*k)).map(|p| p.ip));
        prop_assert_eq!(held, Some(*ip), "key {} lost or moved", k);
        prop_assert_eq!(
            ds.holder_of(*ip),
            Some(key(*k)),
            "address {} held by another key",
            ip
        );
    }
    let stored: BTreeMap<IpamKey, String> = cp
        .snapshot()
        .map(|d| d.allocations.into_iter().map(|e| (e.key, e.ipv4)).collect())
        .unwrap_or_default();
    let expected: BTreeMap<IpamKey, String> = model
        .iter()
        .map(|(k, ip)| (key(*k), ip.to_string()))
        .collect();
    prop_assert_eq!(stored, expected, "checkpoint matches acknowledged state");
    Ok(())
}

async fn boot(provider: &Hiding, cp: &MemoryCheckpoint, clock: Arc<TestClock>) -> Arc<Ipam> {
    let described = ipamd::pool::ec2_port::NodeDescription::describe(provider)
        .await
        .unwrap();
    let (ipam, _) = Ipam::start(
        described,
        settings(targets(2, 3, 4), Duration::ZERO),
        Duration::from_secs(30),
        Box::new(cp.clone()),
        || Ok(vec![]),
        clock,
        Arc::new(ipamd::metrics::Metrics::new()),
    )
    .unwrap();
    Arc::new(ipam)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn no_duplicates_no_losses(ops in proptest::collection::vec(op(), 1..80)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async move {
            let provider = Hiding { inner: MemoryProvider::from_spec(spec("198.18.0.0/24", 3, 5)), hide: Arc::new(AtomicBool::new(false)) };
            let cp = MemoryCheckpoint::new();
            let clock = TestClock::new();
            let mut ipam = boot(&provider, &cp, clock.clone()).await;
            let mut manager = Manager::new(provider.clone());
            let mut model: BTreeMap<u8, Ipv4Addr> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Add(k) => match ipam.add(&key(k), Default::default()).await {
                        Ok(a) => {
                            if let Some(prev) = model.get(&k) {
                                prop_assert_eq!(*prev, a.ip, "repeated ADD returned another address");
                            }
                            model.insert(k, a.ip);
                        }
                        Err(e) if e.is_shortage() => {
                            prop_assert!(!model.contains_key(&k), "known key refused");
                        }
                        Err(IpamError::NotReady(_)) => prop_assert!(model.contains_key(&k)),
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    },
                    Op::Del(k) => match ipam.del(&key(k), "", "", "PodDeleted") {
                        Ok(a) => {
                            let prev = model.remove(&k);
                            prop_assert_eq!(prev, Some(a.ip));
                        }
                        Err(IpamError::UnknownPod(_)) => prop_assert!(!model.contains_key(&k)),
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    },
                    Op::Settle => manager.settle(&ipam).await,
                    Op::FailingSettle => {
                        provider.inner.fail_next(ipamd::aws::Ec2Error::Throttled);
                        manager.settle(&ipam).await;
                    }
                    Op::Advance(s) => clock.advance(Duration::from_secs(u64::from(s))),
                    Op::Restart => {
                        ipam = boot(&provider, &cp, clock.clone()).await;
                        manager = Manager::new(provider.clone());
                    }
                    Op::RestartStale => {
                        provider.hide.store(true, Ordering::SeqCst);
                        ipam = boot(&provider, &cp, clock.clone()).await;
                        provider.hide.store(false, Ordering::SeqCst);
                        manager = Manager::new(provider.clone());
                    }
                }
                check(&ipam, &cp, &model)?;
                // The fake EC2 never holds an address twice either.
                let enis = provider.inner.list_enis().await.unwrap();
                let mut all: Vec<Ipv4Addr> = enis.iter().flat_map(|e| e.secondary_ips.iter().copied().chain(std::iter::once(e.primary_ip))).collect();
                let n = all.len();
                all.sort();
                all.dedup();
                prop_assert_eq!(all.len(), n);
                // Every assigned address is on an ENI the provider has.
                for ip in model.values() {
                    prop_assert!(enis.iter().any(|e| e.secondary_ips.contains(ip)), "assigned {} released to EC2", ip);
                }
            }
            Ok(())
        })?;
    }
}
