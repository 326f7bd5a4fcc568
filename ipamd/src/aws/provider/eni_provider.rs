//! [`Ec2Provider`] as the pool's [`EniProvider`] and the reconciler's [`ImdsView`]: the port
//! methods, each a sequence of the lifecycle steps. Must not: touch the datastore or the kernel.

use super::*;

impl<E: Ec2 + 'static, I: Imds + 'static> Ec2Provider<E, I> {
    /// The VPC's IPv4 CIDRs as IMDS lists them now (`vpc-ipv4-cidr-blocks` of the primary ENI, one
    /// read), not from the cache: blocks associated with or removed from the VPC while ipamd runs.
    pub async fn current_vpc_cidrs(&self) -> Result<Vec<ipnet::Ipv4Net>, ProviderError> {
        let id = self.identity().await?;
        self.imds
            .vpc_ipv4_cidrs(&id.primary_mac)
            .await
            .map_err(|e| imds_failure(&e))
    }

    /// An ENI with `req`'s addresses, created in the placement's subnets and attached on network
    /// card `card`.
    async fn create_on_card(&self, req: NewEni, card: u32) -> Result<AttachedEni, ProviderError> {
        let mut placement = self.eni_placement(req.placement.as_ref()).await?;
        let candidates = placement.0.clone();
        let subnet = candidates.join(",");
        placement.0.retain(|s| !self.subnet_dry(s));
        if placement.0.is_empty() {
            return Err(ProviderError::SubnetExhausted(SubnetShortage {
                subnets: candidates,
                backing_off: true,
            }));
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
        match self
            .create_and_attach(addresses, placement.clone(), card)
            .await
        {
            Ok(e) => Ok(e),
            Err(Ec2Error::InsufficientCidrBlocks) => {
                tracing::warn!("subnet too fragmented for a /28; new eni gets /32 addresses");
                self.mark_fragmented(&subnet);
                let limits = self.aws_limits().await?;
                let n = req
                    .prefixes
                    .saturating_mul(16)
                    .min(limits.secondary_ips_per_eni());
                self.create_and_attach(AddressRequest::Ips(n), placement, card)
                    .await
                    .map_err(|e| provider_error_in(e, &candidates))
            }
            Err(e) => Err(provider_error_in(e, &candidates)),
        }
    }
}

impl<E: Ec2 + 'static, I: Imds + 'static> EniProvider for Ec2Provider<E, I> {
    async fn instance_limits(&self) -> Result<InstanceLimits, ProviderError> {
        let l = self.aws_limits().await?;
        Ok(InstanceLimits {
            max_enis: l.max_enis,
            ipv4_per_eni: l.ipv4_per_eni,
            network_cards: l.network_cards,
            prefix_delegation: l.supports_prefix_delegation(),
        })
    }

    async fn availability_zone(&self) -> Result<String, ProviderError> {
        Ok(self.identity().await?.availability_zone)
    }

    /// One DescribeSubnets per subnet, remembered.
    async fn subnet_zone(&self, subnet_id: &str) -> Result<Option<String>, ProviderError> {
        self.zone_of_subnet(subnet_id).await
    }

    async fn node_network(&self) -> Result<NodeNetwork, ProviderError> {
        let p = self.primary().await?;
        let id = self.identity().await?;
        Ok(NodeNetwork {
            vpc_v4_cidrs: p.vpc_cidrs.clone(),
            primary_ip: Some(p.primary_ip),
            vpc_v6_cidrs: p.vpc_ipv6_cidrs.clone(),
            primary_ipv6: p.ipv6s.first().copied(),
            instance_id: id.instance_id,
            region: id.region,
            instance_type: id.instance_type,
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
        self.remember_conntrack(&truth);
        self.decide_exclusion(&truth).await?;
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

    fn prefix_shortage(&self) -> Option<String> {
        self.fragmented_subnet()
    }

    async fn create_eni(&self, req: NewEni) -> Result<AttachedEni, ProviderError> {
        self.create_on_card(req, 0).await
    }

    async fn create_eni_on_card(
        &self,
        req: NewEni,
        card: u32,
    ) -> Result<AttachedEni, ProviderError> {
        let cards = self.aws_limits().await?.network_cards;
        if card >= cards {
            return Err(ProviderError::InstanceLimit(InstanceLimit::NoSuchCard {
                card,
                cards,
            }));
        }
        self.create_on_card(req, card).await
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

    /// Detach, then delete with back-off (EC2 refuses to delete while detaching). An ENI that still
    /// cannot be deleted is left to the leaked-ENI clean-up (it is tagged and available). One
    /// `DescribeNetworkInterfaces` of the ENI; `AssignIpv6Addresses` (one /80) only when EC2 lists
    /// no IPv6 prefix on it.
    async fn ipv6_prefix(&self, eni_id: &str) -> Result<ipnet::Ipv6Net, ProviderError> {
        let eni = self
            .ec2
            .describe_enis(EniQuery::Ids(vec![eni_id.to_owned()]))
            .await
            .map_err(|e| provider_error(e, ""))?
            .pop()
            .ok_or_else(|| ProviderError::NotFound {
                resource: eni_id.to_owned(),
            })?;
        if let Some(p) = eni.ipv6_prefixes.first() {
            return Ok(*p);
        }
        self.ec2
            .assign_ipv6_prefixes(eni_id, 1)
            .await
            .map_err(|e| provider_error(e, &eni.subnet_id))?
            .first()
            .copied()
            .ok_or_else(|| {
                ProviderError::Other(Failure::NoIpv6PrefixGiven {
                    eni_id: eni_id.to_owned(),
                })
            })
    }

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
                .ok_or_else(|| ProviderError::NotFound {
                    resource: eni_id.to_owned(),
                })?,
        };
        let Some(att) = eni.attachment.as_ref() else {
            return Err(ProviderError::Other(Failure::NotAttached {
                eni_id: eni_id.to_owned(),
            }));
        };
        if att.device_index == 0 {
            return Err(ProviderError::InUse(Busy::PrimaryEni {
                eni_id: eni_id.to_owned(),
            }));
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

impl<E: Ec2 + 'static, I: Imds + 'static> ImdsView for Ec2Provider<E, I> {
    /// IMDS only: no EC2 call.
    async fn hinted_enis(&self) -> Result<Vec<AttachedEni>, ProviderError> {
        self.imds_view().await
    }
}
