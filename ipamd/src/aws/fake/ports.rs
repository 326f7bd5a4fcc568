//! [`FakeCloud`] behind the `Ec2` and `Imds` ports: each call enters the world (counted,
//! possibly failed on request) and applies EC2's rules. Must not: hold state of its own.

use super::*;

impl Ec2 for FakeCloud {
    async fn describe_enis(&self, query: EniQuery) -> Result<Vec<Ec2Eni>, Ec2Error> {
        let mut w = self.w();
        w.enter("DescribeNetworkInterfaces")?;
        let enis = w.described_enis();
        match query {
            EniQuery::Ids(ids) => ids
                .iter()
                .map(|id| {
                    enis.get(id)
                        .cloned()
                        .ok_or_else(|| Ec2Error::NotFound(id.clone()))
                })
                .collect(),
            EniQuery::AttachedTo(instance) => Ok(enis
                .values()
                .filter(|e| {
                    e.attachment
                        .as_ref()
                        .is_some_and(|a| a.instance_id == instance)
                })
                .cloned()
                .collect()),
            EniQuery::Leaked {
                vpc_id,
                cluster_name,
            } => Ok(w
                .enis
                .values()
                .filter(|e| e.status == EniStatus::Available && e.vpc_id == vpc_id)
                .filter(|e| e.tags.contains_key(TAG_INSTANCE_ID))
                .filter(|e| {
                    cluster_name
                        .as_ref()
                        .is_none_or(|c| e.tags.get(TAG_CLUSTER_NAME) == Some(c))
                })
                .cloned()
                .collect()),
        }
    }

    async fn instance_type_limits(
        &self,
        instance_type: &str,
    ) -> Result<InstanceTypeLimits, Ec2Error> {
        let mut w = self.w();
        w.enter("DescribeInstanceTypes")?;
        if instance_type == w.identity.instance_type {
            Ok(w.limits)
        } else {
            Err(Ec2Error::NotFound(instance_type.to_owned()))
        }
    }

    async fn subnet_zone(&self, subnet_id: &str) -> Result<Option<String>, Ec2Error> {
        let mut w = self.w();
        w.enter("DescribeSubnets")?;
        if subnet_id == w.subnet_id {
            return Ok(Some(w.subnet_az.clone()));
        }
        Ok(w.other_subnets.get(subnet_id).map(|(_, az)| az.clone()))
    }

    async fn describe_subnets(
        &self,
        vpc_id: &str,
        availability_zone: &str,
    ) -> Result<Vec<SubnetInfo>, Ec2Error> {
        let mut w = self.w();
        w.enter("DescribeSubnets")?;
        if vpc_id != w.vpc_id {
            return Ok(Vec::new());
        }
        let mut zones: Vec<(String, String)> = vec![(w.subnet_id.clone(), w.subnet_az.clone())];
        zones.extend(
            w.other_subnets
                .iter()
                .map(|(id, (_, az))| (id.clone(), az.clone())),
        );
        let mut out = Vec::new();
        for (id, az) in zones.into_iter().filter(|(_, az)| az == availability_zone) {
            let free = w.on_subnet(&id, |w| w.free_ips().len()).unwrap_or(0);
            out.push(SubnetInfo {
                tags: w.subnet_tags.get(&id).cloned().unwrap_or_default(),
                subnet_id: id,
                availability_zone: az,
                available_ips: u32::try_from(free).unwrap_or(u32::MAX),
            });
        }
        Ok(out)
    }

    async fn create_eni(&self, req: CreateEni) -> Result<Ec2Eni, Ec2Error> {
        let mut w = self.w();
        w.enter("CreateNetworkInterface")?;
        if req.addresses.count() > w.limits.secondary_ips_per_eni() {
            return Err(Ec2Error::AddressLimit);
        }
        let subnet_id = req.subnet_id.clone();
        let (primary_ip, got) = w
            .on_subnet(&subnet_id, |w| {
                let primary_ip = w.alloc_ip()?;
                match w.alloc(req.addresses) {
                    Ok(g) => Ok((primary_ip, g)),
                    Err(e) => {
                        w.subnet.used.remove(&primary_ip);
                        Err(e)
                    }
                }
            })
            .ok_or_else(|| Ec2Error::NotFound(subnet_id.clone()))??;
        let (secondary_ips, prefixes) = split_cidrs(&got);
        let id = w.new_id("eni");
        let eni = Ec2Eni {
            eni_id: id.clone(),
            mac: mac_of(w.next_id),
            subnet_id: req.subnet_id,
            vpc_id: w.vpc_id.clone(),
            description: req.description,
            interface_type: "interface".into(),
            status: EniStatus::Available,
            primary_ip,
            secondary_ips,
            prefixes,
            ipv6_prefixes: vec![],
            ipv6_addresses: vec![],
            // EC2 puts the VPC's default security group on an ENI created without groups.
            security_groups: if req.security_groups.is_empty() {
                vec![FAKE_VPC_DEFAULT_SG.to_owned()]
            } else {
                req.security_groups
            },
            tags: req.tags,
            attachment: None,
            conntrack: req.conntrack,
        };
        w.enis.insert(id, eni.clone());
        Ok(eni)
    }

    async fn attach_eni(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        network_card: u32,
    ) -> Result<String, Ec2Error> {
        let mut w = self.w();
        w.enter("AttachNetworkInterface")?;
        if instance_id != w.identity.instance_id {
            return Err(Ec2Error::NotFound(instance_id.to_owned()));
        }
        if network_card >= w.limits.network_cards {
            return Err(Ec2Error::Api {
                code: "InvalidParameterValue".into(),
                message: format!("network card index {network_card} is out of range"),
            });
        }
        // device indexes and the ENI limit count per network card, as EC2's
        let attached: Vec<u32> = w
            .attached()
            .filter_map(|e| e.attachment.as_ref())
            .filter(|a| a.network_card == network_card)
            .map(|a| a.device_index)
            .collect();
        if attached.len() >= w.limits.max_enis as usize {
            return Err(Ec2Error::AttachmentLimit);
        }
        if attached.contains(&device_index) {
            return Err(Ec2Error::Api {
                code: "InvalidParameterValue".into(),
                message: "device index in use".into(),
            });
        }
        let me = w.identity.instance_id.clone();
        let e = w.eni_mut(eni_id)?;
        if e.status != EniStatus::Available {
            return Err(Ec2Error::Api {
                code: "InvalidNetworkInterface.InUse".into(),
                message: eni_id.into(),
            });
        }
        let attachment_id = format!("attach-{eni_id}");
        e.attachment = Some(Attachment {
            attachment_id: attachment_id.clone(),
            instance_id: me,
            device_index,
            network_card,
            delete_on_termination: false,
        });
        e.status = EniStatus::InUse;
        Ok(attachment_id)
    }

    async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
    ) -> Result<(), Ec2Error> {
        let mut w = self.w();
        w.enter("ModifyNetworkInterfaceAttribute")?;
        let e = w.eni_mut(eni_id)?;
        match e.attachment.as_mut() {
            Some(a) if a.attachment_id == attachment_id => {
                a.delete_on_termination = true;
                Ok(())
            }
            _ => Err(Ec2Error::NotFound(attachment_id.to_owned())),
        }
    }

    async fn set_security_groups(&self, eni_id: &str, groups: &[String]) -> Result<(), Ec2Error> {
        let mut w = self.w();
        w.enter("ModifyNetworkInterfaceAttribute")?;
        w.eni_mut(eni_id)?.security_groups = groups.to_vec();
        Ok(())
    }

    async fn assign(&self, eni_id: &str, req: AddressRequest) -> Result<Vec<Ipv4Net>, Ec2Error> {
        let mut w = self.w();
        w.enter("AssignPrivateIpAddresses")?;
        let limit = w.limits.secondary_ips_per_eni() as usize;
        let e = w.eni_mut(eni_id)?;
        let used = e.secondary_ips.len() + e.prefixes.len();
        let mixed = match req {
            AddressRequest::Ips(_) => !e.prefixes.is_empty(),
            AddressRequest::Prefixes(_) => !e.secondary_ips.is_empty(),
        };
        if used + req.count() as usize > limit {
            return Err(Ec2Error::AddressLimit);
        }
        let _ = mixed; // EC2 allows both kinds on one ENI; the slots are shared
        let subnet_id = e.subnet_id.clone();
        let got = w
            .on_subnet(&subnet_id, |w| w.alloc(req))
            .ok_or_else(|| Ec2Error::NotFound(subnet_id.clone()))??;
        let e = w.eni_mut(eni_id)?;
        let (ips, prefixes) = split_cidrs(&got);
        e.secondary_ips.extend(ips);
        e.prefixes.extend(prefixes);
        Ok(got)
    }

    async fn assign_ipv6_prefixes(
        &self,
        eni_id: &str,
        count: u32,
    ) -> Result<Vec<Ipv6Net>, Ec2Error> {
        let mut w = self.w();
        w.enter("AssignIpv6Addresses")?;
        let limit = w.limits.secondary_ips_per_eni() as usize;
        let taken: BTreeSet<Ipv6Net> = w
            .enis
            .values()
            .flat_map(|e| e.ipv6_prefixes.iter().copied())
            .collect();
        let e = w.eni_mut(eni_id)?;
        if e.ipv6_prefixes.len() + count as usize > limit {
            return Err(Ec2Error::AddressLimit);
        }
        let got: Vec<Ipv6Net> = (1..=u16::MAX)
            .map(fake_ipv6_prefix)
            .filter(|p| !taken.contains(p))
            .take(count as usize)
            .collect();
        e.ipv6_prefixes.extend(got.iter().copied());
        Ok(got)
    }

    async fn unassign(&self, eni_id: &str, cidrs: &[Ipv4Net]) -> Result<(), Ec2Error> {
        let mut w = self.w();
        w.enter("UnassignPrivateIpAddresses")?;
        let e = w.eni_mut(eni_id)?;
        for c in cidrs {
            let present =
                e.secondary_ips.iter().any(|ip| Ipv4Net::from(*ip) == *c) || e.prefixes.contains(c);
            if !present {
                return Err(Ec2Error::Api {
                    code: "InvalidParameterValue".into(),
                    message: format!("{c} not assigned"),
                });
            }
        }
        e.secondary_ips
            .retain(|ip| !cidrs.contains(&Ipv4Net::from(*ip)));
        e.prefixes.retain(|p| !cidrs.contains(p));
        let subnet_id = e.subnet_id.clone();
        w.on_subnet(&subnet_id, |w| {
            for c in cidrs {
                release_cidr(&mut w.subnet, *c);
            }
        });
        w.leave("UnassignPrivateIpAddresses")
    }

    async fn detach_eni(&self, attachment_id: &str) -> Result<(), Ec2Error> {
        let mut w = self.w();
        w.enter("DetachNetworkInterface")?;
        let e = w
            .enis
            .values_mut()
            .find(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| a.attachment_id == attachment_id)
            })
            .ok_or_else(|| Ec2Error::NotFound(attachment_id.to_owned()))?;
        if e.attachment.as_ref().is_some_and(|a| a.device_index == 0) {
            return Err(Ec2Error::Api {
                code: "OperationNotPermitted".into(),
                message: "primary eni".into(),
            });
        }
        e.attachment = None;
        e.status = EniStatus::Available;
        w.leave("DetachNetworkInterface")
    }

    async fn delete_eni(&self, eni_id: &str) -> Result<(), Ec2Error> {
        let mut w = self.w();
        w.enter("DeleteNetworkInterface")?;
        let e = w
            .enis
            .get(eni_id)
            .ok_or_else(|| Ec2Error::NotFound(eni_id.to_owned()))?;
        if e.status != EniStatus::Available {
            return Err(Ec2Error::Api {
                code: "InvalidNetworkInterface.InUse".into(),
                message: eni_id.into(),
            });
        }
        let e = w.enis.remove(eni_id).expect("present");
        w.on_subnet(&e.subnet_id, |w| {
            w.subnet.used.remove(&e.primary_ip);
            for c in e.pod_cidrs() {
                release_cidr(&mut w.subnet, c);
            }
        });
        Ok(())
    }

    async fn create_tags(&self, eni_id: &str, tags: &Tags) -> Result<(), Ec2Error> {
        let mut w = self.w();
        w.enter("CreateTags")?;
        let e = w.eni_mut(eni_id)?;
        e.tags
            .extend(tags.iter().map(|(k, v)| (k.clone(), v.clone())));
        Ok(())
    }
}

impl Imds for FakeCloud {
    async fn identity(&self) -> Result<InstanceIdentity, ImdsError> {
        Ok(self.w().identity.clone())
    }

    async fn enis(&self) -> Result<Vec<ImdsEni>, ImdsError> {
        let mut w = self.w();
        if let Some((view, left)) = w.imds_stale.as_mut()
            && *left > 0
        {
            *left -= 1;
            return Ok(view.clone());
        }
        w.imds_stale = None;
        Ok(w.live_imds())
    }
}
