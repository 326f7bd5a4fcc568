//! The EC2-backed [`EniProvider`]: ENI lifecycle on a real (or simulated) EC2 through the `Ec2`
//! and `Imds` ports. Owns the AWS-specific rules: ENI description and tags, first free device
//! index, DeleteOnTermination after attach, waiting for IMDS to show a new ENI, detach-then-
//! delete, `no_manage` ENIs, the 120 s back-off after the subnet ran out, the /32 fallback
//! when the subnet is too fragmented for a /28, subnet discovery and exclusion (executing
//! `aws::subnets`' choices), the primary ENI's connection tracking copied to new ENIs, and the
//! leaked-ENI clean-up. Must not touch the datastore or the kernel; EC2 answers are
//! authoritative, IMDS answers are hints.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::ec2::{AddressRequest, ConntrackSpec, CreateEni, Ec2, EniQuery, SubnetInfo};
use super::error::Ec2Error;
use super::imds::Imds;
use super::metrics::AwsMetrics;
use super::{
    ENI_DESCRIPTION_PREFIX, ENI_OWNER_VALUE, Ec2Eni, EniStatus, ImdsEni, InstanceIdentity,
    RESERVED_TAG_MARKER, TAG_CLUSTER_NAME, TAG_CREATED_AT, TAG_ENI_OWNER, TAG_INSTANCE_ID, Tags,
    limits,
};
use crate::pool::ec2_port::{
    AttachedEni, Busy, EniPlacement, EniProvider, Failure, InstanceLimit, InstanceLimits, NewEni,
    NodeNetwork, PrefixShortage, ProviderError, SubnetShortage,
};
use crate::pool::reconcile_plan::ImdsView;

pub use crate::pool::ec2_port::INSUFFICIENT_ADDRESS_BACKOFF;
/// Leaked ENIs younger than this (by their createdAt tag) are left alone.
pub const LEAKED_ENI_GRACE: Duration = Duration::from_secs(300);
/// Highest device index ipamd attaches at.
pub const MAX_DEVICE_INDEX: u32 = 100;

/// Knobs of the provider, from the daemon's config.
#[derive(Debug, Clone, Default)]
pub struct ProviderSettings {
    /// `CLUSTER_NAME` (empty: no cluster tags, leaked-ENI clean-up not scoped).
    pub cluster_name: String,
    /// `ADDITIONAL_ENI_TAGS` (keys containing `k8s.amazonaws.com` are ignored).
    pub additional_tags: Tags,
    /// Attempts to see a new ENI in IMDS (100 ms doubling, 15 % jitter, capped at 5 s).
    pub imds_wait_attempts: u32,
    /// Attempts to delete a just-detached ENI (500 ms doubling, capped at 5 s).
    pub delete_attempts: u32,
    /// `MANAGE_UNTAGGED_ENI` (default true): false leaves ENIs that ipamd did not create (no
    /// instance-id tag, no `no_manage` tag) out of the pool.
    pub manage_untagged: bool,
    /// `ENABLE_IMDS_ONLY_MODE`: no EC2 call at all. The attached ENIs are what IMDS lists (no tags,
    /// so no trunk/EFA/`no_manage` knowledge), no ENI is tagged, instance limits come from the
    /// built-in table only. The caller also turns provisioning and the leaked-ENI clean-up off.
    pub imds_only: bool,
    /// `ENABLE_SUBNET_DISCOVERY` (default true): new ENIs go to the zone's subnets tagged
    /// `kubernetes.io/role/cni` (most free addresses first), ENIs in subnets tagged
    /// `kubernetes.io/role/cni=0` hold no new pod address. Off: the primary ENI's subnet only
    /// (still refused when it is tagged `=0`).
    pub subnet_discovery: bool,
}

impl ProviderSettings {
    /// The production numbers: 12 IMDS attempts, 12 delete attempts.
    pub fn upstream(cluster_name: String, additional_tags: Tags) -> Self {
        Self {
            cluster_name,
            additional_tags,
            imds_wait_attempts: 12,
            delete_attempts: 12,
            manage_untagged: true,
            imds_only: false,
            subnet_discovery: true,
        }
    }
}

#[derive(Debug, Default)]
struct Cache {
    identity: Option<InstanceIdentity>,
    limits: Option<super::InstanceTypeLimits>,
    /// Primary ENI as IMDS shows it (subnet, SGs, VPC CIDRs).
    primary: Option<ImdsEni>,
    vpc_id: Option<String>,
    subnets: BTreeMap<String, Ipv4Net>,
    /// Last EC2 view of our attached ENIs (device indexes, attachment ids, slot use).
    known: BTreeMap<String, Ec2Eni>,
    /// Per subnet: until when EC2 is not asked for its addresses (it ran out, also of a single
    /// one). Per subnet, not per node: the pool grows elsewhere meanwhile.
    dry_until: BTreeMap<String, Instant>,
    /// Until when /28 requests go straight to /32s (subnet too fragmented for a /28).
    fragmented_until: Option<Instant>,
    /// The subnet that answered `InsufficientCidrBlocks` last.
    fragmented_subnet: String,
    /// The node-init listing, handed to the next `list_enis` so init costs ONE Describe.
    primed: Option<Vec<AttachedEni>>,
    /// Availability zones of ENIConfig subnets (DescribeSubnets once per subnet).
    subnet_zones: BTreeMap<String, Option<String>>,
    /// Per ENI id: in an excluded subnet? Decided once per ENI, when it is first listed.
    subnet_excluded: BTreeMap<String, bool>,
    /// The primary ENI's `ConnectionTrackingConfiguration`, copied to new ENIs (refreshed by every
    /// Describe of the attached ENIs).
    conntrack: Option<ConntrackSpec>,
    /// ENIs EC2 refused the node's current security groups for: asked again when the groups
    /// change (as upstream), not at every check (a missing permission would cost an EC2 call per
    /// node every period).
    groups_refused: BTreeSet<String>,
}

/// The EC2 provider. Clones share one cache.
#[derive(Debug)]
pub struct Ec2Provider<E, I> {
    ec2: Arc<E>,
    imds: Arc<I>,
    settings: ProviderSettings,
    cache: Arc<Mutex<Cache>>,
    metrics: AwsMetrics,
    /// Custom networking (`AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG`): the primary ENI holds no pod
    /// address (new ENIs go where the pool's placement says: [`NewEni::placement`]).
    custom_networking: bool,
}

impl<E, I> Clone for Ec2Provider<E, I> {
    fn clone(&self) -> Self {
        Self {
            ec2: self.ec2.clone(),
            imds: self.imds.clone(),
            settings: self.settings.clone(),
            metrics: self.metrics.clone(),
            cache: self.cache.clone(),
            custom_networking: self.custom_networking,
        }
    }
}

/// The one translation of EC2 errors into the pool's provider errors (`subnet`: the subnet the
/// call asked addresses of, "" when none).
pub fn provider_error(e: Ec2Error, subnet: &str) -> ProviderError {
    provider_error_in(e, &[subnet.to_owned()])
}

/// [`provider_error`] of a call that tried the subnets `subnets` in turn (a new ENI).
pub fn provider_error_in(e: Ec2Error, subnets: &[String]) -> ProviderError {
    match e {
        Ec2Error::AttachmentLimit => ProviderError::InstanceLimit(InstanceLimit::EniAttachments),
        Ec2Error::AddressLimit => ProviderError::InstanceLimit(InstanceLimit::AddressesPerEni),
        Ec2Error::SubnetFull => ProviderError::SubnetExhausted(SubnetShortage {
            subnets: subnets.to_vec(),
            backing_off: false,
        }),
        Ec2Error::InsufficientCidrBlocks => ProviderError::NoFreePrefix(PrefixShortage {
            subnet: subnets.join(","),
        }),
        Ec2Error::Throttled => ProviderError::Throttled,
        Ec2Error::NotApplied(last) => {
            ProviderError::NotApplied(Box::new(provider_error_in(*last, subnets)))
        }
        Ec2Error::NotFound(resource) => ProviderError::NotFound { resource },
        Ec2Error::Unauthorized(action) => ProviderError::Unauthorized { action },
        Ec2Error::Api { code, message } if code.ends_with(".InUse") => {
            ProviderError::InUse(Busy::Ec2 { code, message })
        }
        Ec2Error::Api { code, message } => ProviderError::Other(Failure::Ec2Api { code, message }),
        Ec2Error::Transport(detail) => ProviderError::Other(Failure::Ec2Transport { detail }),
        Ec2Error::Malformed(field) => ProviderError::Other(Failure::Ec2Malformed { field }),
    }
}

/// An IMDS failure as the pool sees it.
fn imds_failure(e: &super::error::ImdsError) -> ProviderError {
    ProviderError::Other(Failure::Imds {
        detail: e.to_string(),
    })
}

fn jittered(base: Duration) -> Duration {
    let f: f64 = rand::random::<f64>() * 0.15;
    base.mul_f64(1.0 + f)
}

fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .ok()
        .map(SystemTime::from)
}

impl<E: Ec2 + 'static, I: Imds + 'static> Ec2Provider<E, I> {
    pub fn new(ec2: Arc<E>, imds: Arc<I>, settings: ProviderSettings) -> Self {
        Self {
            ec2,
            imds,
            settings,
            cache: Arc::new(Mutex::new(Cache::default())),
            metrics: AwsMetrics::default(),
            custom_networking: false,
        }
    }

    /// Custom networking on (`on`): the primary ENI is excluded from pod addresses. Where new
    /// ENIs go is the pool's decision (`pool::placement`), handed over on [`NewEni::placement`].
    #[must_use]
    pub fn with_custom_networking(self, on: bool) -> Self {
        Self {
            custom_networking: on,
            ..self
        }
    }

    /// Excludes the primary ENI from pods under custom networking.
    fn primary_excluded(&self, is_primary: bool) -> bool {
        is_primary && self.custom_networking
    }

    /// Where the next ENI goes: the subnets to try in order, and its security groups. The pool's
    /// placement when it made one (custom networking: the node's ENIConfig subnet, with the primary
    /// ENI's groups when the ENIConfig lists none); else the subnets discovery allows (or the
    /// primary ENI's, see [`Self::discovered_subnets`]) with the primary ENI's groups (sorted).
    /// Creates nothing.
    async fn eni_placement(
        &self,
        placed: Option<&EniPlacement>,
    ) -> Result<(Vec<String>, Vec<String>), ProviderError> {
        let Some(p) = placed else {
            let p = self.primary().await?;
            let subnets = self.discovered_subnets(&p.subnet_id).await?;
            let mut groups = p.security_groups;
            groups.sort();
            groups.dedup();
            return Ok((subnets, groups));
        };
        // An ENIConfig without `securityGroups` (the CRD requires only `subnet`): the primary ENI's
        // groups, never the empty list (EC2 would apply the VPC's default security group to every
        // pod on the ENI).
        let groups = if p.security_groups.is_empty() {
            let mut primary = self.primary().await?.security_groups;
            primary.sort();
            primary.dedup();
            tracing::warn!(eniconfig = %p.eni_config, security_groups = ?primary, "No custom networking security group found, will use the node's primary ENI's SG");
            primary
        } else {
            p.security_groups.clone()
        };
        tracing::info!(eniconfig = %p.eni_config, subnet = %p.subnet_id, security_groups = ?groups, "ipamd: using custom network config");
        Ok((vec![p.subnet_id.clone()], groups))
    }

    /// The availability zone of `subnet_id` (None: EC2 does not know it), one DescribeSubnets
    /// per subnet, remembered once known.
    pub(super) async fn zone_of_subnet(
        &self,
        subnet_id: &str,
    ) -> Result<Option<String>, ProviderError> {
        let cached = self.cache().subnet_zones.get(subnet_id).cloned();
        if let Some(z) = cached {
            return Ok(z);
        }
        let z = self
            .ec2
            .subnet_zone(subnet_id)
            .await
            .map_err(|e| provider_error(e, subnet_id))?;
        if let Some(z) = &z {
            self.cache()
                .subnet_zones
                .insert(subnet_id.to_owned(), Some(z.clone()));
        }
        Ok(z)
    }

    /// A new ENI's subnets without custom networking: with discovery, the subnets
    /// [`subnets::discovered`] orders (one DescribeSubnets; when it fails, a second one checks that
    /// the primary subnet is not excluded); without, the primary subnet unless tagged
    /// `kubernetes.io/role/cni=0` (one DescribeSubnets, its failure is only logged).
    async fn discovered_subnets(&self, primary_subnet: &str) -> Result<Vec<String>, ProviderError> {
        let cluster = self.settings.cluster_name.as_str();
        let refuse = ProviderError::Misconfigured;
        let discovery = self.settings.subnet_discovery;
        if discovery {
            match self.vpc_subnets().await {
                Ok(listed) => {
                    return subnets::discovered(&listed, primary_subnet, cluster).map_err(refuse);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "ec2:DescribeSubnets failed; defaulting to the primary eni's subnet for the new eni");
                }
            }
        }
        let check = match self.vpc_subnets().await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, subnet = primary_subnet, "could not check whether the primary subnet is excluded");
                None
            }
        };
        subnets::primary_only(discovery, check.as_deref(), primary_subnet, cluster).map_err(refuse)
    }

    /// The subnets of this VPC in this instance's zone (one DescribeSubnets), remembered and
    /// recorded as `awscni_subnet_available_ip_addresses{subnet}`.
    async fn vpc_subnets(&self) -> Result<Vec<SubnetInfo>, ProviderError> {
        let vpc_id = self.vpc_id().await?;
        self.vpc_subnets_in(&vpc_id).await
    }

    /// [`Self::vpc_subnets`] of a known VPC (no ENI listing behind it).
    async fn vpc_subnets_in(&self, vpc_id: &str) -> Result<Vec<SubnetInfo>, ProviderError> {
        let zone = self.identity().await?.availability_zone;
        let listed = self
            .ec2
            .describe_subnets(vpc_id, &zone)
            .await
            .map_err(|e| provider_error(e, ""))?;
        for s in &listed {
            self.metrics.subnet_available(&s.subnet_id, s.available_ips);
        }
        Ok(listed)
    }

    /// Decides, once per ENI, whether its subnet is excluded: one DescribeSubnets when `enis` holds
    /// an ENI not decided yet. Not with discovery off (subnet tags are then not read), nor in
    /// IMDS-only mode (no EC2 call at all; config warns).
    async fn decide_exclusion(&self, enis: &[Ec2Eni]) -> Result<(), ProviderError> {
        if !self.settings.subnet_discovery || self.settings.imds_only {
            return Ok(());
        }
        let new: Vec<&Ec2Eni> = {
            let c = self.cache();
            enis.iter()
                .filter(|e| e.attachment.is_some() && !c.subnet_excluded.contains_key(&e.eni_id))
                .collect()
        };
        if new.is_empty() {
            return Ok(());
        }
        let Some(vpc_id) = new
            .iter()
            .map(|e| e.vpc_id.as_str())
            .find(|v| !v.is_empty())
        else {
            return Ok(());
        };
        let listed = self.vpc_subnets_in(vpc_id).await?;
        let cluster = self.settings.cluster_name.as_str();
        let mut c = self.cache();
        for e in new {
            let excluded = subnets::is_excluded(&listed, &e.subnet_id, cluster);
            if excluded {
                tracing::info!(eni = %e.eni_id, subnet = %e.subnet_id, "eni is in a subnet tagged kubernetes.io/role/cni=0: excluded from pod ip allocation");
            }
            c.subnet_excluded.insert(e.eni_id.clone(), excluded);
        }
        Ok(())
    }

    /// The primary ENI's connection tracking, as the last Describe of the attached ENIs listed it.
    fn remember_conntrack(&self, enis: &[Ec2Eni]) {
        if let Some(p) = enis.iter().find(|e| {
            e.attachment
                .as_ref()
                .is_some_and(|a| a.device_index == 0 && a.network_card == 0)
        }) {
            self.cache().conntrack = p.conntrack.and_then(ConntrackSpec::if_set);
        }
    }

    /// Records the ENI clean-up failures (`awscni_aws_utils_error_count{fn,error}`) into `metrics`.
    #[must_use]
    pub fn with_metrics(self, metrics: AwsMetrics) -> Self {
        Self { metrics, ..self }
    }

    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The EC2 port (for callers that need a raw call, e.g. tests).
    pub fn ec2(&self) -> &E {
        &self.ec2
    }

    /// Instance identity from IMDS (cached).
    pub async fn identity(&self) -> Result<InstanceIdentity, ProviderError> {
        if let Some(id) = self.cache().identity.clone() {
            return Ok(id);
        }
        let id = self.imds.identity().await.map_err(|e| imds_failure(&e))?;
        self.cache().identity = Some(id.clone());
        Ok(id)
    }

    /// IMDS's ENIs (a hint); refreshes the subnet and primary-ENI cache.
    async fn imds_enis(&self) -> Result<Vec<ImdsEni>, ProviderError> {
        let enis = self.imds.enis().await.map_err(|e| imds_failure(&e))?;
        let mut c = self.cache();
        for e in &enis {
            c.subnets.insert(e.subnet_id.clone(), e.subnet_cidr);
            if e.device_number == 0 && e.network_card == 0 {
                c.primary = Some(e.clone());
            }
        }
        Ok(enis)
    }

    async fn primary(&self) -> Result<ImdsEni, ProviderError> {
        if let Some(p) = self.cache().primary.clone() {
            return Ok(p);
        }
        self.imds_enis().await?;
        self.cache()
            .primary
            .clone()
            .ok_or(ProviderError::Other(Failure::NoPrimaryEni))
    }

    /// The ENIs IMDS lists, shaped like [`EniProvider::list_enis`]: the cheap hint the
    /// reconciler compares with the datastore before asking EC2.
    pub async fn imds_view(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        let enis = self.imds_enis().await?;
        let (known, instance) = {
            let c = self.cache();
            (
                c.known.clone(),
                c.identity.as_ref().map(|i| i.instance_id.clone()),
            )
        };
        Ok(enis
            .into_iter()
            .map(|e| {
                let ec2 = known.get(&e.eni_id);
                let is_primary = e.device_number == 0 && e.network_card == 0;
                let no_manage = !is_primary
                    && ec2.is_some_and(|k| {
                        k.is_unmanaged(instance.as_deref(), self.settings.manage_untagged)
                    });
                let kind = ec2.map_or("", |k| k.interface_type.as_str());
                self.pool_view(
                    AttachedEni {
                        id: e.eni_id.clone(),
                        device_number: e.device_number,
                        network_card: e.network_card,
                        mac: e.mac.clone(),
                        subnet_id: e.subnet_id.clone(),
                        subnet: e.subnet_cidr,
                        primary_ip: e.primary_ip,
                        secondary_ips: e.secondary_ips.clone(),
                        prefixes: e.prefixes.clone(),
                        ..AttachedEni::unflagged()
                    },
                    kind,
                    no_manage,
                )
            })
            .collect())
    }

    fn to_attached(&self, e: &Ec2Eni, imds: Option<&ImdsEni>) -> AttachedEni {
        let c = self.cache();
        let subnet = imds
            .map(|i| i.subnet_cidr)
            .or_else(|| c.subnets.get(&e.subnet_id).copied())
            .or_else(|| c.primary.as_ref().map(|p| p.subnet_cidr))
            .unwrap_or_else(|| Ipv4Net::from(e.primary_ip));
        let a = e.attachment.as_ref();
        let device_number = a.map_or(0, |a| a.device_index);
        let network_card = a.map_or(0, |a| a.network_card);
        let no_manage = !(device_number == 0 && network_card == 0)
            && e.is_unmanaged(
                c.identity.as_ref().map(|i| i.instance_id.as_str()),
                self.settings.manage_untagged,
            );
        drop(c);
        self.pool_view(
            AttachedEni {
                id: e.eni_id.clone(),
                device_number,
                network_card,
                mac: e.mac.clone(),
                subnet_id: e.subnet_id.clone(),
                subnet,
                primary_ip: e.primary_ip,
                secondary_ips: e.secondary_ips.clone(),
                prefixes: e.prefixes.clone(),
                ..AttachedEni::unflagged()
            },
            &e.interface_type,
            no_manage,
        )
    }

    /// The ENI as the pool sees it, from what EC2/IMDS list: primary, trunk and EFA from its
    /// attachment and interface type; excluded when `no_manage` (it holds a device slot but no
    /// pod addresses, which are dropped here), when it is the primary ENI under custom
    /// networking, or when its subnet is excluded (its addresses stay listed: pods hold them).
    /// Must be called without the cache lock held.
    fn pool_view(
        &self,
        mut eni: AttachedEni,
        interface_type: &str,
        no_manage: bool,
    ) -> AttachedEni {
        eni.is_primary = eni.device_number == 0 && eni.network_card == 0;
        eni.is_trunk = interface_type == "trunk";
        eni.is_efa = interface_type.starts_with("efa");
        eni.subnet_excluded = !no_manage
            && self
                .cache()
                .subnet_excluded
                .get(&eni.id)
                .copied()
                .unwrap_or(false);
        eni.is_excluded = no_manage || self.primary_excluded(eni.is_primary) || eni.subnet_excluded;
        if no_manage {
            eni.secondary_ips.clear();
            eni.prefixes.clear();
        }
        eni
    }

    /// Whether `subnet` ran out of addresses less than [`INSUFFICIENT_ADDRESS_BACKOFF`] ago.
    fn subnet_dry(&self, subnet: &str) -> bool {
        self.cache()
            .dry_until
            .get(subnet)
            .is_some_and(|t| Instant::now() < *t)
    }

    /// `subnet` answered that it has no free address: it is not asked again for
    /// [`INSUFFICIENT_ADDRESS_BACKOFF`].
    fn mark_dry(&self, subnet: &str) {
        tracing::error!(%subnet, "Unable to attach IPs/Prefixes for the ENI, subnet doesn't seem to have enough IPs/Prefixes. Consider using new subnet or carve a reserved range using create-subnet-cidr-reservation");
        self.cache().dry_until.insert(
            subnet.to_owned(),
            Instant::now() + INSUFFICIENT_ADDRESS_BACKOFF,
        );
    }

    fn mark_fragmented(&self, subnet: &str) {
        let mut c = self.cache();
        c.fragmented_until = Some(Instant::now() + INSUFFICIENT_ADDRESS_BACKOFF);
        c.fragmented_subnet = subnet.to_owned();
    }

    /// See [`EniProvider::prefix_shortage`].
    pub(crate) fn fragmented_subnet(&self) -> Option<String> {
        self.fragmented()
            .then(|| self.cache().fragmented_subnet.clone())
    }

    fn fragmented(&self) -> bool {
        self.cache()
            .fragmented_until
            .is_some_and(|t| Instant::now() < t)
    }

    fn subnet_of(&self, eni_id: &str) -> String {
        self.cache()
            .known
            .get(eni_id)
            .map(|e| e.subnet_id.clone())
            .unwrap_or_default()
    }

    /// Slots (secondary IPs + prefixes) still free on an ENI, from the last EC2 view.
    fn free_slots(&self, eni_id: &str) -> Option<u32> {
        let c = self.cache();
        let limits = c.limits?;
        let e = c.known.get(eni_id)?;
        let used = u32::try_from(e.secondary_ips.len() + e.prefixes.len()).unwrap_or(u32::MAX);
        Some(limits.secondary_ips_per_eni().saturating_sub(used))
    }

    fn remember_assigned(&self, eni_id: &str, got: &[Ipv4Net]) {
        let mut c = self.cache();
        if let Some(e) = c.known.get_mut(eni_id) {
            for n in got {
                if n.prefix_len() == 32 {
                    e.secondary_ips.push(n.addr());
                } else {
                    e.prefixes.push(*n);
                }
            }
        }
    }

    fn remember_unassigned(&self, eni_id: &str, gone: &[Ipv4Net]) {
        let mut c = self.cache();
        if let Some(e) = c.known.get_mut(eni_id) {
            e.secondary_ips
                .retain(|ip| !gone.contains(&Ipv4Net::from(*ip)));
            e.prefixes.retain(|p| !gone.contains(p));
        }
    }
}

mod eni_provider;
mod groups;
mod lifecycle;
use super::subnets;
pub use groups::{GroupCheck, enis_to_update, manages_groups_of};
pub use lifecycle::ATTACH_THROTTLED_RETRIES;
#[cfg(test)]
mod tests;

#[cfg(test)]
impl Ec2Provider<super::fake::FakeCloud, super::fake::FakeCloud> {
    /// The scenario tests' provider over `cloud` (here and in `pool::tests`): cluster
    /// `cluster`, two additional tags (one reserved, to be dropped), 3 IMDS and 3 delete
    /// attempts, manage-untagged and subnet discovery on.
    pub(crate) fn over_fake(cloud: &super::fake::FakeCloud, cluster: &str) -> Self {
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
            subnet_discovery: true,
        };
        Self::new(Arc::new(cloud.clone()), Arc::new(cloud.clone()), settings)
    }
}
