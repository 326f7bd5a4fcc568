//! The EC2-backed [`EniProvider`]: ENI lifecycle on a real (or simulated) EC2 through the `Ec2`
//! and `Imds` ports. Owns the AWS-specific rules: ENI description and tags, first free device
//! index, DeleteOnTermination after attach, waiting for IMDS to show a new ENI, detach-then-
//! delete, `no_manage` ENIs, the 120 s back-off after the subnet ran out, the /32 fallback
//! when the subnet is too fragmented for a /28, and the leaked-ENI clean-up. Must not touch the
//! datastore or the kernel; EC2 answers are authoritative, IMDS answers are hints.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use ipnet::Ipv4Net;
use tokio::time::Instant;

use super::ec2::{AddressRequest, CreateEni, Ec2, EniQuery};
use super::error::Ec2Error;
use super::imds::Imds;
use super::metrics::AwsMetrics;
use super::{
    ENI_DESCRIPTION_PREFIX, ENI_OWNER_VALUE, Ec2Eni, EniStatus, ImdsEni, InstanceIdentity,
    RESERVED_TAG_MARKER, TAG_CLUSTER_NAME, TAG_CREATED_AT, TAG_ENI_OWNER, TAG_INSTANCE_ID, Tags,
    limits,
};
use crate::k8s::{CustomNetwork, PlacementRefusal};
use crate::pool::provider::{
    AttachedEni, EniProvider, InstanceLimits, NewEni, NodeNetwork, ProviderError,
};
use crate::pool::reconcile::Hint;

/// Back-off after `InsufficientCidrBlocks` / `InsufficientFreeAddressesInSubnet` (upstream 120 s).
pub const INSUFFICIENT_ADDRESS_BACKOFF: Duration = Duration::from_secs(120);
/// Leaked ENIs younger than this (by their createdAt tag) are left alone (upstream 5 min).
pub const LEAKED_ENI_GRACE: Duration = Duration::from_secs(300);
/// Highest device index ipamd attaches at (upstream scans up to 100).
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
    /// `ENABLE_IMDS_ONLY_MODE`: no EC2 call at all. The attached ENIs are what IMDS lists (no
    /// tags, so no trunk/EFA/`no_manage` knowledge, as upstream's `DescribeAllENIs` in that
    /// mode), no ENI is tagged, instance limits come from the built-in table only. The caller
    /// also turns provisioning and the leaked-ENI clean-up off.
    pub imds_only: bool,
}

impl ProviderSettings {
    /// Upstream's numbers: 12 IMDS attempts, 12 delete attempts.
    pub fn upstream(cluster_name: String, additional_tags: Tags) -> Self {
        Self {
            cluster_name,
            additional_tags,
            imds_wait_attempts: 12,
            delete_attempts: 12,
            manage_untagged: true,
            imds_only: false,
        }
    }
}

#[derive(Debug, Default)]
struct Cache {
    identity: Option<InstanceIdentity>,
    limits: Option<super::InstanceLimits>,
    /// Primary ENI as IMDS shows it (subnet, SGs, VPC CIDRs).
    primary: Option<ImdsEni>,
    vpc_id: Option<String>,
    subnets: BTreeMap<String, Ipv4Net>,
    /// Last EC2 view of our attached ENIs (device indexes, attachment ids, slot use).
    known: BTreeMap<String, Ec2Eni>,
    /// Until when EC2 is not asked for more addresses (subnet ran out).
    backoff_until: Option<Instant>,
    /// Until when /28 requests go straight to /32s (subnet too fragmented for a /28).
    fragmented_until: Option<Instant>,
    /// The node-init listing, handed to the next `list_enis` so init costs ONE Describe.
    primed: Option<Vec<AttachedEni>>,
    /// Availability zones of ENIConfig subnets (DescribeSubnets once per subnet).
    subnet_zones: BTreeMap<String, Option<String>>,
}

/// The EC2 provider. Clones share one cache.
#[derive(Debug)]
pub struct Ec2Provider<E, I> {
    ec2: Arc<E>,
    imds: Arc<I>,
    settings: ProviderSettings,
    cache: Arc<Mutex<Cache>>,
    metrics: AwsMetrics,
    /// Custom networking (`AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG`): new ENIs go to the node's
    /// ENIConfig subnet with its security groups; the primary ENI holds no pod address.
    custom: Option<CustomNetwork>,
}

impl<E, I> Clone for Ec2Provider<E, I> {
    fn clone(&self) -> Self {
        Self {
            ec2: self.ec2.clone(),
            imds: self.imds.clone(),
            settings: self.settings.clone(),
            metrics: self.metrics.clone(),
            cache: self.cache.clone(),
            custom: self.custom.clone(),
        }
    }
}

/// The one translation of EC2 errors into the pool's provider errors.
pub fn provider_error(e: Ec2Error, subnet: &str) -> ProviderError {
    match e {
        Ec2Error::AttachmentLimit => {
            ProviderError::InstanceLimit("instance eni limit reached".into())
        }
        Ec2Error::AddressLimit => ProviderError::InstanceLimit("eni address limit reached".into()),
        Ec2Error::SubnetFull => {
            ProviderError::SubnetExhausted(format!("{subnet}: no free addresses"))
        }
        Ec2Error::InsufficientCidrBlocks => {
            ProviderError::SubnetExhausted(format!("{subnet}: no free /28 block"))
        }
        Ec2Error::Throttled => ProviderError::Throttled,
        Ec2Error::NotFound(what) => ProviderError::NotFound(what),
        Ec2Error::Unauthorized(what) => ProviderError::Unauthorized(what),
        Ec2Error::Api { code, message } if code.ends_with(".InUse") => {
            ProviderError::InUse(message)
        }
        other => ProviderError::Other(other.to_string()),
    }
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
            custom: None,
        }
    }

    /// Custom networking on: ENIs are created where `custom` says, the primary ENI is
    /// excluded from pod addresses.
    #[must_use]
    pub fn with_custom_network(self, custom: CustomNetwork) -> Self {
        Self {
            custom: Some(custom),
            ..self
        }
    }

    /// Excludes the primary ENI from pods under custom networking (upstream's
    /// `GetAllocatableENIs(skipPrimary)`).
    fn primary_excluded(&self, is_primary: bool) -> bool {
        is_primary && self.custom.is_some()
    }

    /// Where the next ENI goes: the primary ENI's subnet and groups, or under custom
    /// networking the node's ENIConfig, after checking (DescribeSubnets) that its subnet is in
    /// this instance's zone. A refusal is reported (log, metric, event) and creates nothing.
    async fn eni_placement(&self) -> Result<(String, Vec<String>), ProviderError> {
        let Some(custom) = &self.custom else {
            let p = self.primary().await?;
            return Ok((p.subnet_id, p.security_groups));
        };
        let refuse = |r: PlacementRefusal| {
            (custom.report)(&r);
            ProviderError::Misconfigured(r.to_string())
        };
        let (name, spec) = custom.choose().map_err(refuse)?;
        let node_az = self.identity().await?.availability_zone;
        let cached = self.cache().subnet_zones.get(&spec.subnet).cloned();
        let zone = match cached {
            Some(z) => z,
            None => {
                let z = self
                    .ec2
                    .subnet_zone(&spec.subnet)
                    .await
                    .map_err(|e| provider_error(e, &spec.subnet))?;
                if let Some(z) = &z {
                    self.cache()
                        .subnet_zones
                        .insert(spec.subnet.clone(), Some(z.clone()));
                }
                z
            }
        };
        let p = crate::k8s::placement(&name, &spec, zone.as_deref(), &node_az).map_err(refuse)?;
        tracing::info!(eniconfig = %p.eni_config, subnet = %p.subnet_id, security_groups = ?p.security_groups, "ipamd: using custom network config");
        Ok((p.subnet_id, p.security_groups))
    }

    /// Records the clean-up failures upstream's awsutils counts
    /// (`awscni_aws_utils_error_count{fn,error}`) into `metrics`.
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
        let id = self
            .imds
            .identity()
            .await
            .map_err(|e| ProviderError::Other(e.to_string()))?;
        self.cache().identity = Some(id.clone());
        Ok(id)
    }

    /// IMDS's ENIs (a hint); refreshes the subnet and primary-ENI cache.
    async fn imds_enis(&self) -> Result<Vec<ImdsEni>, ProviderError> {
        let enis = self
            .imds
            .enis()
            .await
            .map_err(|e| ProviderError::Other(e.to_string()))?;
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
            .ok_or_else(|| ProviderError::Other("imds lists no primary eni".into()))
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
                let skip = self.primary_excluded(is_primary);
                let kind = ec2.map(|k| k.interface_type.clone()).unwrap_or_default();
                AttachedEni {
                    id: e.eni_id.clone(),
                    device_number: e.device_number,
                    network_card: e.network_card,
                    is_primary: e.device_number == 0 && e.network_card == 0,
                    is_trunk: kind == "trunk",
                    is_efa: kind.starts_with("efa"),
                    is_excluded: no_manage || skip,
                    mac: e.mac.clone(),
                    subnet_id: e.subnet_id.clone(),
                    subnet: e.subnet_cidr,
                    primary_ip: e.primary_ip,
                    secondary_ips: if no_manage {
                        vec![]
                    } else {
                        e.secondary_ips.clone()
                    },
                    prefixes: if no_manage {
                        vec![]
                    } else {
                        e.prefixes.clone()
                    },
                }
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
        AttachedEni {
            id: e.eni_id.clone(),
            device_number,
            network_card,
            is_primary: device_number == 0 && network_card == 0,
            is_trunk: e.interface_type == "trunk",
            is_efa: e.interface_type.starts_with("efa"),
            // `no_manage` ENIs hold a device slot but no pod addresses; nor does the primary
            // ENI under custom networking
            is_excluded: no_manage
                || self.primary_excluded(device_number == 0 && network_card == 0),
            mac: e.mac.clone(),
            subnet_id: e.subnet_id.clone(),
            subnet,
            primary_ip: e.primary_ip,
            secondary_ips: if no_manage {
                vec![]
            } else {
                e.secondary_ips.clone()
            },
            prefixes: if no_manage {
                vec![]
            } else {
                e.prefixes.clone()
            },
        }
    }

    fn in_backoff(&self) -> bool {
        self.cache()
            .backoff_until
            .is_some_and(|t| Instant::now() < t)
    }

    fn start_backoff(&self) {
        self.cache().backoff_until = Some(Instant::now() + INSUFFICIENT_ADDRESS_BACKOFF);
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

    /// Tags every ENI ipamd creates.
    pub fn new_eni_tags(&self, instance_id: &str, now: SystemTime) -> Tags {
        let mut tags: Tags = self
            .settings
            .additional_tags
            .iter()
            .filter(|(k, _)| !k.contains(RESERVED_TAG_MARKER))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        tags.insert(TAG_INSTANCE_ID.into(), instance_id.into());
        tags.insert(TAG_CREATED_AT.into(), rfc3339(now));
        if !self.settings.cluster_name.is_empty() {
            tags.insert(TAG_CLUSTER_NAME.into(), self.settings.cluster_name.clone());
            tags.insert(TAG_ENI_OWNER.into(), ENI_OWNER_VALUE.into());
        }
        tags
    }

    /// Add the tags a managed, non-primary ENI is missing (node init). Returns how many ENIs
    /// were tagged; ENIs already tagged cost no call.
    /// A failed `CreateTags` is logged and skipped, never an error.
    pub async fn tag_untagged(&self, enis: &[AttachedEni]) -> Result<usize, ProviderError> {
        if self.settings.imds_only {
            return Ok(0);
        }
        let id = self.identity().await?;
        let want = self.new_eni_tags(&id.instance_id, SystemTime::now());
        let mut tagged = 0;
        for eni in enis
            .iter()
            .filter(|e| !e.is_primary && !e.is_excluded && !e.is_trunk && !e.is_efa)
        {
            let have = self
                .cache()
                .known
                .get(&eni.id)
                .map(|e| e.tags.clone())
                .unwrap_or_default();
            let missing: Tags = want
                .iter()
                .filter(|(k, _)| !have.contains_key(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if missing.is_empty() {
                continue;
            }
            if let Err(e) = self.ec2.create_tags(&eni.id, &missing).await {
                // Tags are for humans and the leaked-ENI clean-up; a missing permission (or
                // any other failure) must not stop the node from serving pods (it would crash
                // loop). The EC2 layer counts the error in awscni_aws_api_error_count.
                tracing::warn!(eni = %eni.id, error = %e, "could not tag eni; continuing without its tags");
                continue;
            }
            if let Some(k) = self.cache().known.get_mut(&eni.id) {
                k.tags.extend(missing);
            }
            tagged += 1;
        }
        Ok(tagged)
    }

    async fn wait_in_imds(&self, eni_id: &str) -> Option<ImdsEni> {
        let mut delay = Duration::from_millis(100);
        for _ in 0..self.settings.imds_wait_attempts.max(1) {
            if let Ok(enis) = self.imds_enis().await
                && let Some(e) = enis.into_iter().find(|e| e.eni_id == eni_id)
            {
                return Some(e);
            }
            tokio::time::sleep(jittered(delay)).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
        tracing::warn!(
            eni = eni_id,
            "new eni not yet in imds; continuing with ec2's view"
        );
        None
    }

    async fn first_free_device(&self) -> u32 {
        let mut used: BTreeSet<u32> = self
            .cache()
            .known
            .values()
            .filter_map(|e| e.attachment.as_ref().map(|a| a.device_index))
            .collect();
        if let Ok(enis) = self.imds_enis().await {
            used.extend(enis.iter().map(|e| e.device_number));
        }
        (1..=MAX_DEVICE_INDEX)
            .find(|d| !used.contains(d))
            .unwrap_or(MAX_DEVICE_INDEX)
    }

    async fn create_and_attach(
        &self,
        addresses: AddressRequest,
        (subnet_id, security_groups): (String, Vec<String>),
    ) -> Result<AttachedEni, Ec2Error> {
        let id = self
            .identity()
            .await
            .map_err(|e| Ec2Error::Transport(e.to_string()))?;
        let eni = self
            .ec2
            .create_eni(CreateEni {
                subnet_id,
                security_groups,
                description: format!("{ENI_DESCRIPTION_PREFIX}{}", id.instance_id),
                tags: self.new_eni_tags(&id.instance_id, SystemTime::now()),
                addresses,
            })
            .await?;
        let mut device = self.first_free_device().await;
        let attach = match self
            .ec2
            .attach_eni(&eni.eni_id, &id.instance_id, device, 0)
            .await
        {
            Err(Ec2Error::Api { .. }) => {
                // the device index was taken (IMDS lagging): refresh from EC2 and retry once
                if let Ok(now) = self
                    .ec2
                    .describe_enis(EniQuery::AttachedTo(id.instance_id.clone()))
                    .await
                {
                    let mut c = self.cache();
                    c.known = now.into_iter().map(|e| (e.eni_id.clone(), e)).collect();
                }
                device = self.first_free_device().await;
                self.ec2
                    .attach_eni(&eni.eni_id, &id.instance_id, device, 0)
                    .await
            }
            other => other,
        };
        let attachment_id = match attach {
            Ok(a) => a,
            Err(e) => {
                // never leave a created ENI behind
                if let Err(del) = self.ec2.delete_eni(&eni.eni_id).await {
                    self.metrics.utils_error("AllocENIDeleteErr", &del);
                    tracing::warn!(eni = %eni.eni_id, error = %del, "delete of unattached eni failed; leaked-eni clean-up will retry");
                }
                return Err(e);
            }
        };
        if let Err(e) = self
            .ec2
            .set_delete_on_termination(&eni.eni_id, &attachment_id)
            .await
        {
            tracing::warn!(eni = %eni.eni_id, error = %e, "setting DeleteOnTermination failed");
        }
        let mut attached = eni.clone();
        attached.status = EniStatus::InUse;
        attached.attachment = Some(super::Attachment {
            attachment_id,
            instance_id: id.instance_id.clone(),
            device_index: device,
            network_card: 0,
            delete_on_termination: true,
        });
        self.cache()
            .known
            .insert(attached.eni_id.clone(), attached.clone());
        let imds = self.wait_in_imds(&attached.eni_id).await;
        Ok(self.to_attached(&attached, imds.as_ref()))
    }

    /// Hourly job: delete `available` ENIs ipamd created (description `aws-K8S-`, instance tag,
    /// this cluster's tag) whose createdAt tag is older than the grace period; stamp untagged
    /// ones now. Returns the deleted ENI ids.
    pub async fn cleanup_leaked(&self, now: SystemTime) -> Result<Vec<String>, ProviderError> {
        let vpc_id = self.vpc_id().await?;
        let cluster_name =
            (!self.settings.cluster_name.is_empty()).then(|| self.settings.cluster_name.clone());
        let candidates = self
            .ec2
            .describe_enis(EniQuery::Leaked {
                vpc_id,
                cluster_name,
            })
            .await
            .map_err(|e| provider_error(e, ""))?;
        let mut deleted = Vec::new();
        for eni in candidates {
            if eni.status != EniStatus::Available
                || !eni.description.starts_with(ENI_DESCRIPTION_PREFIX)
            {
                continue;
            }
            match eni.tags.get(TAG_CREATED_AT).and_then(|v| parse_rfc3339(v)) {
                None => {
                    let stamp: Tags = [(TAG_CREATED_AT.to_owned(), rfc3339(now))].into();
                    let _ = self.ec2.create_tags(&eni.eni_id, &stamp).await;
                }
                Some(created)
                    if now
                        .duration_since(created)
                        .is_ok_and(|age| age >= LEAKED_ENI_GRACE) =>
                {
                    match self.ec2.delete_eni(&eni.eni_id).await {
                        Ok(()) | Err(Ec2Error::NotFound(_)) => deleted.push(eni.eni_id),
                        Err(e) => {
                            self.metrics.utils_error("cleanUpLeakedENIDeleteErr", &e);
                            tracing::warn!(eni = %eni.eni_id, error = %e, "leaked eni delete failed");
                        }
                    }
                }
                Some(_) => {}
            }
        }
        Ok(deleted)
    }

    async fn vpc_id(&self) -> Result<String, ProviderError> {
        if let Some(v) = self.cache().vpc_id.clone() {
            return Ok(v);
        }
        self.list_enis().await?;
        self.cache()
            .vpc_id
            .clone()
            .ok_or_else(|| ProviderError::Other("vpc id unknown".into()))
    }

    /// List the ENIs now and hand the same answer to the next [`EniProvider::list_enis`] (node
    /// init lists once for tagging and host setup, then the daemon's start lists again).
    pub async fn prime(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        let enis = self.list_enis().await?;
        self.cache().primed = Some(enis.clone());
        Ok(enis)
    }

    /// Limits of the instance in the AWS layer's richer shape (PD support).
    pub async fn aws_limits(&self) -> Result<super::InstanceLimits, ProviderError> {
        if let Some(l) = self.cache().limits {
            return Ok(l);
        }
        let id = self.identity().await?;
        let l = match limits::lookup(&id.instance_type) {
            Some(l) => l,
            None if self.settings.imds_only => {
                return Err(ProviderError::Other(format!(
                    "instance type {} is not in the built-in limits table, and \
                     ENABLE_IMDS_ONLY_MODE forbids asking EC2 (DescribeInstanceTypes)",
                    id.instance_type
                )));
            }
            None => self
                .ec2
                .instance_type_limits(&id.instance_type)
                .await
                .map_err(|e| provider_error(e, ""))?,
        };
        self.cache().limits = Some(l);
        Ok(l)
    }

    async fn assign(
        &self,
        eni_id: &str,
        req: AddressRequest,
    ) -> Result<Vec<Ipv4Net>, ProviderError> {
        let subnet = self.subnet_of(eni_id);
        if self.in_backoff() {
            return Err(ProviderError::SubnetExhausted(format!(
                "{subnet}: backing off after the subnet ran out"
            )));
        }
        let req = match req {
            AddressRequest::Prefixes(n) if self.fragmented() => {
                AddressRequest::Ips(self.fallback_ips(eni_id, n))
            }
            r => r,
        };
        match self.ec2.assign(eni_id, req).await {
            Ok(got) => {
                self.remember_assigned(eni_id, &got);
                Ok(got)
            }
            Err(Ec2Error::InsufficientCidrBlocks) => {
                // No aligned /28 left, but single addresses may be: fall back to /32s.
                tracing::warn!(
                    eni = eni_id,
                    "subnet too fragmented for a /28; falling back to /32 addresses"
                );
                self.cache().fragmented_until = Some(Instant::now() + INSUFFICIENT_ADDRESS_BACKOFF);
                let n = self.fallback_ips(eni_id, req.count());
                match self.ec2.assign(eni_id, AddressRequest::Ips(n)).await {
                    Ok(got) => {
                        self.remember_assigned(eni_id, &got);
                        Ok(got)
                    }
                    Err(e) => {
                        if e.is_insufficient_addresses() {
                            self.start_backoff();
                        }
                        Err(provider_error(e, &subnet))
                    }
                }
            }
            Err(e) => {
                if e.is_insufficient_addresses() {
                    self.start_backoff();
                }
                Err(provider_error(e, &subnet))
            }
        }
    }

    /// /32s asked for instead of `prefixes` /28s: as many addresses as the prefixes would have
    /// given, capped by the ENI's free slots.
    fn fallback_ips(&self, eni_id: &str, prefixes: u32) -> u32 {
        let want = prefixes.saturating_mul(16);
        self.free_slots(eni_id)
            .map_or(prefixes.max(1), |free| want.min(free).max(1))
    }
}

impl<E: Ec2 + 'static, I: Imds + 'static> EniProvider for Ec2Provider<E, I> {
    async fn instance_limits(&self) -> Result<InstanceLimits, ProviderError> {
        let l = self.aws_limits().await?;
        Ok(InstanceLimits {
            max_enis: l.max_enis,
            ipv4_per_eni: l.ipv4_per_eni,
        })
    }

    async fn node_network(&self) -> Result<NodeNetwork, ProviderError> {
        let p = self.primary().await?;
        let id = self.identity().await?;
        Ok(NodeNetwork {
            vpc_v4_cidrs: p.vpc_cidrs.clone(),
            primary_ip: Some(p.primary_ip),
            instance_id: id.instance_id,
            region: id.region,
        })
    }

    /// IMDS (subnet CIDRs) plus ONE `DescribeNetworkInterfaces` of the instance's ENIs.
    async fn list_enis(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        if let Some(primed) = self.cache().primed.take() {
            return Ok(primed);
        }
        if self.settings.imds_only {
            let mut out = self.imds_view().await?;
            out.sort_by_key(|e| (e.network_card, e.device_number));
            return Ok(out);
        }
        let id = self.identity().await?;
        let imds = self.imds_enis().await.unwrap_or_default();
        let truth = self
            .ec2
            .describe_enis(EniQuery::AttachedTo(id.instance_id.clone()))
            .await
            .map_err(|e| provider_error(e, ""))?;
        {
            let mut c = self.cache();
            if let Some(v) = truth.iter().find(|e| !e.vpc_id.is_empty()) {
                c.vpc_id = Some(v.vpc_id.clone());
            }
            c.known = truth
                .iter()
                .map(|e| (e.eni_id.clone(), e.clone()))
                .collect();
        }
        let mut out: Vec<AttachedEni> = truth
            .iter()
            .filter(|e| e.attachment.is_some())
            .map(|e| self.to_attached(e, imds.iter().find(|i| i.eni_id == e.eni_id)))
            .collect();
        out.sort_by_key(|e| (e.network_card, e.device_number));
        Ok(out)
    }

    async fn assign_ips(&self, eni_id: &str, count: u32) -> Result<Vec<Ipv4Addr>, ProviderError> {
        Ok(self
            .assign(eni_id, AddressRequest::Ips(count))
            .await?
            .iter()
            .map(Ipv4Net::addr)
            .collect())
    }

    /// /28 prefixes; when the subnet is too fragmented the result holds /32s instead.
    async fn assign_prefixes(
        &self,
        eni_id: &str,
        count: u32,
    ) -> Result<Vec<Ipv4Net>, ProviderError> {
        self.assign(eni_id, AddressRequest::Prefixes(count)).await
    }

    async fn create_eni(&self, req: NewEni) -> Result<AttachedEni, ProviderError> {
        let placement = self.eni_placement().await?;
        let subnet = placement.0.clone();
        if self.in_backoff() {
            return Err(ProviderError::SubnetExhausted(format!(
                "{subnet}: backing off after the subnet ran out"
            )));
        }
        let addresses = if req.prefixes > 0 {
            if self.fragmented() {
                AddressRequest::Ips(req.prefixes)
            } else {
                AddressRequest::Prefixes(req.prefixes)
            }
        } else {
            AddressRequest::Ips(req.secondary_ips)
        };
        match self.create_and_attach(addresses, placement.clone()).await {
            Ok(e) => Ok(e),
            Err(Ec2Error::InsufficientCidrBlocks) => {
                tracing::warn!("subnet too fragmented for a /28; new eni gets /32 addresses");
                self.cache().fragmented_until = Some(Instant::now() + INSUFFICIENT_ADDRESS_BACKOFF);
                let limits = self.aws_limits().await?;
                let n = req
                    .prefixes
                    .saturating_mul(16)
                    .min(limits.secondary_ips_per_eni());
                self.create_and_attach(AddressRequest::Ips(n), placement)
                    .await
                    .map_err(|e| {
                        if e.is_insufficient_addresses() {
                            self.start_backoff();
                        }
                        provider_error(e, &subnet)
                    })
            }
            Err(e) => {
                if e.is_insufficient_addresses() {
                    self.start_backoff();
                }
                Err(provider_error(e, &subnet))
            }
        }
    }

    async fn unassign_ips(&self, eni_id: &str, ips: &[Ipv4Addr]) -> Result<(), ProviderError> {
        let cidrs: Vec<Ipv4Net> = ips.iter().map(|ip| Ipv4Net::from(*ip)).collect();
        self.ec2
            .unassign(eni_id, &cidrs)
            .await
            .map_err(|e| provider_error(e, ""))?;
        self.remember_unassigned(eni_id, &cidrs);
        Ok(())
    }

    async fn unassign_prefixes(
        &self,
        eni_id: &str,
        prefixes: &[Ipv4Net],
    ) -> Result<(), ProviderError> {
        self.ec2
            .unassign(eni_id, prefixes)
            .await
            .map_err(|e| provider_error(e, ""))?;
        self.remember_unassigned(eni_id, prefixes);
        Ok(())
    }

    /// Detach, then delete with back-off (EC2 refuses to delete while detaching). An ENI that
    /// still cannot be deleted is left to the leaked-ENI clean-up (it is tagged and available).
    async fn free_eni(&self, eni_id: &str) -> Result<(), ProviderError> {
        let known = self.cache().known.get(eni_id).cloned();
        let eni = match known {
            Some(e) => e,
            None => self
                .ec2
                .describe_enis(EniQuery::Ids(vec![eni_id.to_owned()]))
                .await
                .map_err(|e| provider_error(e, ""))?
                .pop()
                .ok_or_else(|| ProviderError::NotFound(eni_id.to_owned()))?,
        };
        let Some(att) = eni.attachment.as_ref() else {
            return Err(ProviderError::Other(format!("{eni_id} is not attached")));
        };
        if att.device_index == 0 {
            return Err(ProviderError::InUse(format!("{eni_id} is the primary eni")));
        }
        match self.ec2.detach_eni(&att.attachment_id).await {
            Ok(()) | Err(Ec2Error::NotFound(_)) => {}
            Err(e) => return Err(provider_error(e, "")),
        }
        self.cache().known.remove(eni_id);
        let mut delay = Duration::from_millis(500);
        for attempt in 0..self.settings.delete_attempts.max(1) {
            match self.ec2.delete_eni(eni_id).await {
                Ok(()) | Err(Ec2Error::NotFound(_)) => return Ok(()),
                Err(e) if attempt + 1 == self.settings.delete_attempts.max(1) => {
                    self.metrics.utils_error("FreeENIDeleteErr", &e);
                    tracing::warn!(eni = eni_id, error = %e, "detached eni not deleted; leaked-eni clean-up will");
                    return Ok(());
                }
                Err(_) => {
                    tokio::time::sleep(jittered(delay)).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        Ok(())
    }
}

impl<E: Ec2 + 'static, I: Imds + 'static> Hint for Ec2Provider<E, I> {
    /// IMDS only: no EC2 call.
    async fn hinted_enis(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        self.imds_view().await
    }
}
