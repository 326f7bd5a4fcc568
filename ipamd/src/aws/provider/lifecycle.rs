//! ENI lifecycle steps of [`Ec2Provider`]: tags, creating and attaching ENIs (first free
//! device index, waiting for IMDS), the leaked-ENI clean-up, VPC id and limits, address
//! assignment with the /32 fallback. Must not: touch the datastore or the kernel.

use super::*;

/// How many more times the attach of a just-created ENI is tried when it failed throttled (each try
/// is a full node-level throttle budget, `aws::sdk::THROTTLE_RETRY_BUDGET`, 20 s) before the ENI is
/// deleted: at fleet scale in a brown-out a Delete and the Create that follows cost two more calls
/// against the same throttled account (measured: 14 ENIs created twice at N = 100 without these
/// retries).
pub const ATTACH_THROTTLED_RETRIES: u32 = 2;

impl<E: Ec2 + 'static, I: Imds + 'static> Ec2Provider<E, I> {
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

    /// Tags at node init (only with provisioning on): every managed ENI but the trunk — the primary
    /// too — gets the tags ipamd puts on the ENIs it creates that it lacks or carries with another
    /// value (a `CLUSTER_NAME` or `ADDITIONAL_ENI_TAGS` changed since), its creation time only when
    /// it has none. Returns how many ENIs were tagged; ENIs already tagged cost no call. A failed
    /// `CreateTags` is logged and skipped, never fatal: tags are for humans and the leaked-ENI
    /// clean-up, not worth a crash loop.
    pub async fn tag_managed(
        &self,
        enis: &[AttachedEni],
        provisioning: bool,
    ) -> Result<usize, ProviderError> {
        if self.settings.imds_only || !provisioning {
            return Ok(0);
        }
        let id = self.identity().await?;
        let want = self.new_eni_tags(&id.instance_id, SystemTime::now());
        let mut tagged = 0;
        for eni in enis
            .iter()
            .filter(|e| !e.is_excluded && !e.is_trunk && !e.is_efa)
        {
            let have = self
                .cache()
                .known
                .get(&eni.id)
                .map(|e| e.tags.clone())
                .unwrap_or_default();
            let missing: Tags = want
                .iter()
                .filter(|(k, v)| match have.get(*k) {
                    None => true,
                    Some(_) if k.as_str() == TAG_CREATED_AT => false,
                    Some(h) => h != *v,
                })
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

    pub(super) async fn wait_in_imds(&self, eni_id: &str) -> Option<ImdsEni> {
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

    /// The first device index no ENI of network card `card` uses (device indexes are counted per
    /// card, so a card other than 0 starts at 0; card 0's is the primary ENI's).
    pub(super) async fn first_free_device(&self, card: u32) -> u32 {
        let mut used: BTreeSet<u32> = self
            .cache()
            .known
            .values()
            .filter_map(|e| e.attachment.as_ref())
            .filter(|a| a.network_card == card)
            .map(|a| a.device_index)
            .collect();
        if let Ok(enis) = self.imds_enis().await {
            used.extend(
                enis.iter()
                    .filter(|e| e.network_card == card)
                    .map(|e| e.device_number),
            );
        }
        (u32::from(card == 0)..=MAX_DEVICE_INDEX)
            .find(|d| !used.contains(d))
            .unwrap_or(MAX_DEVICE_INDEX)
    }

    /// Tries the subnets in order and takes the first that creates the ENI (any error moves on to
    /// the next; the last error is the answer), with the primary ENI's connection tracking; then
    /// the ENI is attached.
    pub(super) async fn create_and_attach(
        &self,
        addresses: AddressRequest,
        (subnet_ids, security_groups): (Vec<String>, Vec<String>),
        card: u32,
    ) -> Result<AttachedEni, Ec2Error> {
        let id = self
            .identity()
            .await
            .map_err(|e| Ec2Error::Transport(e.to_string()))?;
        let conntrack = self.cache().conntrack;
        let mut created = Err(Ec2Error::Malformed("no subnet to create the eni in"));
        for subnet_id in subnet_ids {
            tracing::info!(subnet = %subnet_id, security_groups = ?security_groups, "creating eni");
            created = self
                .ec2
                .create_eni(CreateEni {
                    subnet_id: subnet_id.clone(),
                    security_groups: security_groups.clone(),
                    description: format!("{ENI_DESCRIPTION_PREFIX}{}", id.instance_id),
                    tags: self.new_eni_tags(&id.instance_id, SystemTime::now()),
                    addresses,
                    conntrack,
                })
                .await;
            match &created {
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(subnet = %subnet_id, error = %e, "CreateNetworkInterface failed in this subnet");
                    if matches!(e, Ec2Error::SubnetFull) {
                        self.mark_dry(&subnet_id);
                    }
                }
            }
        }
        let eni = created?;
        let mut device = self.first_free_device(card).await;
        let attach = match self
            .ec2
            .attach_eni(&eni.eni_id, &id.instance_id, device, card)
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
                device = self.first_free_device(card).await;
                self.ec2
                    .attach_eni(&eni.eni_id, &id.instance_id, device, card)
                    .await
            }
            other => other,
        };
        let mut attach = attach;
        for _ in 0..ATTACH_THROTTLED_RETRIES {
            if !matches!(attach, Err(Ec2Error::Throttled)) {
                break;
            }
            // The ENI exists: deleting it now would cost a Delete and, at the next pool
            // action, a Create again, all against the same throttled account.
            tracing::info!(eni = %eni.eni_id, "attach of the new eni still throttled; trying it again before giving it up");
            attach = self
                .ec2
                .attach_eni(&eni.eni_id, &id.instance_id, device, card)
                .await;
        }
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
        attached.attachment = Some(crate::aws::Attachment {
            attachment_id,
            instance_id: id.instance_id.clone(),
            device_index: device,
            network_card: card,
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

    pub(super) async fn vpc_id(&self) -> Result<String, ProviderError> {
        if let Some(v) = self.cache().vpc_id.clone() {
            return Ok(v);
        }
        self.list_enis().await?;
        self.cache()
            .vpc_id
            .clone()
            .ok_or(ProviderError::Other(Failure::VpcUnknown))
    }

    /// List the ENIs now and hand the same answer to the next [`EniProvider::list_enis`] (node
    /// init lists once for tagging and host setup, then the daemon's start lists again).
    pub async fn prime(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        let enis = self.list_enis().await?;
        self.cache().primed = Some(enis.clone());
        Ok(enis)
    }

    /// Limits of the instance in the AWS layer's richer shape (PD support).
    pub async fn aws_limits(&self) -> Result<crate::aws::InstanceTypeLimits, ProviderError> {
        if let Some(l) = self.cache().limits {
            return Ok(l);
        }
        let id = self.identity().await?;
        // A type the table does not know is asked of EC2, in IMDS-only mode too: a new instance
        // family must not stop the node.
        let l = match limits::lookup(&id.instance_type) {
            Some(l) => l,
            None => self
                .ec2
                .instance_type_limits(&id.instance_type)
                .await
                .map_err(|e| provider_error(e, ""))?,
        };
        self.cache().limits = Some(l);
        Ok(l)
    }

    pub(super) async fn assign(
        &self,
        eni_id: &str,
        req: AddressRequest,
    ) -> Result<Vec<Ipv4Net>, ProviderError> {
        let subnet = self.subnet_of(eni_id);
        if self.subnet_dry(&subnet) {
            return Err(ProviderError::SubnetExhausted(SubnetShortage {
                subnets: vec![subnet],
                backing_off: true,
            }));
        }
        let req = match req {
            AddressRequest::Prefixes(n) if self.fragmented() => {
                AddressRequest::Ips(self.fallback_ips(eni_id, n))
            }
            r => r,
        };
        let got = match self.assign_or_one(eni_id, req).await {
            Err(Ec2Error::InsufficientCidrBlocks) => {
                // No aligned /28 left, but single addresses may be: fall back to /32s.
                tracing::warn!(
                    eni = eni_id,
                    "subnet too fragmented for a /28; falling back to /32 addresses"
                );
                self.mark_fragmented(&subnet);
                let n = self.fallback_ips(eni_id, req.count());
                self.assign_or_one(eni_id, AddressRequest::Ips(n)).await
            }
            other => other,
        };
        match got {
            Ok(got) => {
                self.remember_assigned(eni_id, &got);
                Ok(got)
            }
            Err(e) => {
                if matches!(e, Ec2Error::SubnetFull) {
                    self.mark_dry(&subnet);
                }
                Err(provider_error(e, &subnet))
            }
        }
    }

    /// `req`, and when the subnet has not that many free addresses, one: a subnet with a few left
    /// still gives them.
    async fn assign_or_one(
        &self,
        eni_id: &str,
        req: AddressRequest,
    ) -> Result<Vec<Ipv4Net>, Ec2Error> {
        match self.ec2.assign(eni_id, req).await {
            Err(Ec2Error::SubnetFull) if req.count() > 1 => {
                tracing::warn!(
                    eni = eni_id,
                    asked = req.count(),
                    "failed to allocate all available IP addresses on the ENI: the subnet has fewer free; asking for one"
                );
                let one = match req {
                    AddressRequest::Ips(_) => AddressRequest::Ips(1),
                    AddressRequest::Prefixes(_) => AddressRequest::Prefixes(1),
                };
                self.ec2.assign(eni_id, one).await
            }
            other => other,
        }
    }

    /// /32s asked for instead of `prefixes` /28s: as many addresses as the prefixes would have
    /// given, capped by the ENI's free slots.
    pub(super) fn fallback_ips(&self, eni_id: &str, prefixes: u32) -> u32 {
        let want = prefixes.saturating_mul(16);
        self.free_slots(eni_id)
            .map_or(prefixes.max(1), |free| want.min(free).max(1))
    }
}
