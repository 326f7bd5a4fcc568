//! TEST/DEMO ONLY (`IPAMD_ENI_PROVIDER=memory`): the real [`Ec2Provider`] over one
//! [`FakeCloud`] (a type alias, not a wrapper: every port method is the EC2 provider's own) (EC2 + IMDS) shaped by a [`MemoryProviderSpec`] — subnet, VPC CIDR, instance
//! limits, and optionally a state file that keeps "EC2" across ipamd restarts (the SIGKILL
//! tests need that). So the in-memory path runs the same ENI lifecycle, error translation and
//! back-offs as a real node; EC2's rules live in `aws::fake` only. Must not be used on a real
//! node (it invents addresses) nor hold EC2 rules of its own.

use std::sync::Arc;

use crate::aws::fake::FakeCloud;
use crate::aws::provider::{Ec2Provider, ProviderSettings};
use crate::aws::{Ec2Error, Tags};
use crate::config::MemoryProviderSpec;

/// The instance type of the fake instance: not in the built-in limits table, so the provider
/// asks the fake's `DescribeInstanceTypes`, which answers with the spec's limits.
pub const INSTANCE_TYPE: &str = "memory.fake";

/// The in-memory provider: the EC2 provider over the fake cloud (EC2 and IMDS both). Clones
/// share the fake cloud and the provider's cache.
pub type MemoryProvider = Ec2Provider<FakeCloud, FakeCloud>;

impl Ec2Provider<FakeCloud, FakeCloud> {
    /// A node with only its primary ENI (primary IP = first usable subnet address), or the
    /// world saved in `spec.state_file` if that exists.
    ///
    /// # Panics
    /// If the spec's subnet has no usable address, or its state file is not a saved world.
    #[must_use]
    pub fn from_spec(spec: MemoryProviderSpec) -> Self {
        let limits = crate::aws::InstanceTypeLimits {
            max_enis: spec.max_enis,
            ipv4_per_eni: spec.ipv4_per_eni,
            // prefix delegation works, as on Nitro
            nitro: true,
            bare_metal: false,
            network_cards: 1,
        };
        let mut cloud = FakeCloud::new(INSTANCE_TYPE, limits, &spec.subnet.to_string())
            .with_vpc_cidr(spec.vpc_cidr);
        if let Some(path) = spec.state_file {
            cloud = cloud.persisted_in(path);
        }
        Self::new(
            Arc::new(cloud.clone()),
            Arc::new(cloud),
            ProviderSettings::upstream(String::new(), Tags::new()),
        )
    }

    /// Makes the next mutating EC2 call fail with `err`.
    pub fn fail_next(&self, err: Ec2Error) {
        self.ec2().fail_next_mutation(err);
    }

    /// The fake cloud behind the provider.
    #[must_use]
    pub fn cloud(&self) -> &FakeCloud {
        self.ec2()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use std::net::Ipv4Addr;

    use super::*;
    use crate::aws::provider::INSUFFICIENT_ADDRESS_BACKOFF;
    use crate::pool::ec2_port::{EniProvider, NewEni, ProviderError};

    fn provider(max_enis: u32, per_eni: u32, subnet: &str) -> MemoryProvider {
        MemoryProvider::from_spec(MemoryProviderSpec {
            subnet: subnet.parse().unwrap(),
            max_enis,
            ipv4_per_eni: per_eni,
            ..MemoryProviderSpec::default()
        })
    }

    #[tokio::test]
    async fn shaped_by_the_spec() {
        let p = MemoryProvider::from_spec(MemoryProviderSpec {
            subnet: "198.18.4.0/24".parse().unwrap(),
            vpc_cidr: "198.18.0.0/16".parse().unwrap(),
            max_enis: 4,
            ipv4_per_eni: 15,
            state_file: None,
        });
        let l = p.instance_limits().await.unwrap();
        assert_eq!((l.max_enis, l.ipv4_per_eni), (4, 15));
        let n = p.node_network().await.unwrap();
        assert_eq!(n.vpc_v4_cidrs, vec!["198.18.0.0/16".parse().unwrap()]);
        assert_eq!(n.primary_ip, Some(Ipv4Addr::new(198, 18, 4, 4)));
        let enis = p.list_enis().await.unwrap();
        assert_eq!(enis.len(), 1);
        assert!(enis[0].is_primary && !enis[0].is_excluded);
        assert_eq!(enis[0].subnet.to_string(), "198.18.4.0/24");
    }

    #[tokio::test]
    async fn enforces_instance_limits() {
        let p = provider(2, 3, "198.18.0.0/24");
        let primary = p.list_enis().await.unwrap()[0].id.clone();
        assert_eq!(p.assign_ips(&primary, 2).await.unwrap().len(), 2);
        assert!(matches!(
            p.assign_ips(&primary, 1).await,
            Err(ProviderError::InstanceLimit(_))
        ));
        let e = p
            .create_eni(NewEni {
                secondary_ips: 2,
                prefixes: 0,
                placement: None,
            })
            .await
            .unwrap();
        assert_eq!((e.device_number, e.secondary_ips.len()), (1, 2));
        assert!(matches!(
            p.create_eni(NewEni::default()).await,
            Err(ProviderError::InstanceLimit(_))
        ));
        // the refused ENI was not left behind
        assert_eq!(p.cloud().all_enis().len(), 2);
        assert!(matches!(
            p.free_eni(&primary).await,
            Err(ProviderError::InUse(_))
        ));
        p.free_eni(&e.id).await.unwrap();
        assert_eq!(p.list_enis().await.unwrap().len(), 1);
        assert_eq!(p.cloud().all_enis().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn subnet_exhaustion_backs_off_then_reuses_addresses() {
        // /28: 16 addresses, 4 reserved + broadcast, primary takes 1 -> 10 left.
        let p = provider(5, 50, "198.18.0.0/28");
        let primary = p.list_enis().await.unwrap()[0].id.clone();
        let ips = p.assign_ips(&primary, 10).await.unwrap();
        let unique: BTreeSet<_> = ips.iter().collect();
        assert_eq!(unique.len(), 10);
        assert!(matches!(
            p.assign_ips(&primary, 1).await,
            Err(ProviderError::SubnetExhausted(_))
        ));
        p.unassign_ips(&primary, &ips[..1]).await.unwrap();
        // EC2 is not asked again during the back-off (upstream's 120 s)
        assert!(matches!(
            p.assign_ips(&primary, 1).await,
            Err(ProviderError::SubnetExhausted(_))
        ));
        tokio::time::advance(INSUFFICIENT_ADDRESS_BACKOFF + Duration::from_secs(1)).await;
        assert_eq!(p.assign_ips(&primary, 1).await.unwrap(), ips[..1].to_vec());
    }

    #[tokio::test]
    async fn prefixes_are_aligned_and_disjoint() {
        let p = provider(3, 4, "198.18.0.0/24");
        let primary = p.list_enis().await.unwrap()[0].id.clone();
        let ps = p.assign_prefixes(&primary, 3).await.unwrap();
        assert_eq!(ps[0].to_string(), "198.18.0.16/28");
        assert_eq!(ps[1].to_string(), "198.18.0.32/28");
    }

    #[tokio::test]
    async fn fail_next_fails_one_mutating_call() {
        let p = provider(3, 10, "198.18.0.0/24");
        let primary = p.list_enis().await.unwrap()[0].id.clone();
        p.fail_next(Ec2Error::Throttled);
        assert!(p.list_enis().await.is_ok(), "reads are not failed");
        assert_eq!(
            p.assign_ips(&primary, 1).await,
            Err(ProviderError::Throttled)
        );
        assert_eq!(p.assign_ips(&primary, 1).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn state_file_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        let spec = MemoryProviderSpec {
            state_file: Some(dir.path().join("ec2.json")),
            ..MemoryProviderSpec::default()
        };
        let p = MemoryProvider::from_spec(spec.clone());
        let primary = p.list_enis().await.unwrap()[0].id.clone();
        let ips = p.assign_ips(&primary, 3).await.unwrap();
        let eni = p.create_eni(NewEni::default()).await.unwrap();
        let again = MemoryProvider::from_spec(spec);
        let enis = again.list_enis().await.unwrap();
        assert_eq!(enis[0].secondary_ips, ips);
        assert_eq!(
            (enis[1].id.as_str(), enis[1].device_number),
            (eni.id.as_str(), 1)
        );
        // ids keep counting from where the old process left them
        let next = again.create_eni(NewEni::default()).await.unwrap();
        assert_ne!(next.id, eni.id);
    }
}
