//! The fake's EC2 world: ids, subnets and their free addresses, ENIs, attachments and the
//! IMDS view derived from them, and the bookkeeping every call goes through (counts, injected
//! failures). Must not: know the `Ec2`/`Imds` port signatures (that is `ports`').

use super::*;

impl World {
    pub(super) fn new_id(&mut self, kind: &str) -> String {
        self.next_id += 1;
        format!("{kind}-{:08x}", self.next_id)
    }

    pub(super) fn reserved(&self, ip: Ipv4Addr) -> bool {
        // AWS reserves the first four addresses and the last one of every subnet
        let c = self.subnet.cidr;
        let off = u32::from(ip) - u32::from(c.network());
        off < 4 || ip == c.broadcast()
    }

    pub(super) fn free_ips(&self) -> Vec<Ipv4Addr> {
        let c = self.subnet.cidr;
        let base = u32::from(c.network());
        let size = 1u32 << (32 - c.prefix_len());
        (0..size)
            .map(|o| Ipv4Addr::from(base + o))
            .filter(|ip| !self.reserved(*ip) && !self.subnet.used.contains(ip))
            .collect()
    }

    pub(super) fn alloc_ip(&mut self) -> Result<Ipv4Addr, Ec2Error> {
        let ip = *self.free_ips().first().ok_or(Ec2Error::SubnetFull)?;
        self.subnet.used.insert(ip);
        Ok(ip)
    }

    pub(super) fn alloc_prefix(&mut self) -> Result<Ipv4Net, Ec2Error> {
        let c = self.subnet.cidr;
        let base = u32::from(c.network());
        let size = 1u32 << (32 - c.prefix_len());
        let mut off = 0;
        while off + 16 <= size {
            let block: Vec<Ipv4Addr> = (off..off + 16).map(|o| Ipv4Addr::from(base + o)).collect();
            if block
                .iter()
                .all(|ip| !self.reserved(*ip) && !self.subnet.used.contains(ip))
            {
                self.subnet.used.extend(block);
                return Ipv4Net::new(Ipv4Addr::from(base + off), 28)
                    .map_err(|_| Ec2Error::Malformed("prefix"));
            }
            off += 16;
        }
        if self.free_ips().is_empty() {
            Err(Ec2Error::SubnetFull)
        } else {
            Err(Ec2Error::InsufficientCidrBlocks)
        }
    }

    pub(super) fn alloc(&mut self, req: AddressRequest) -> Result<Vec<Ipv4Net>, Ec2Error> {
        let mut got = Vec::new();
        for _ in 0..req.count() {
            let r = match req {
                AddressRequest::Ips(_) => self.alloc_ip().map(Ipv4Net::from),
                AddressRequest::Prefixes(_) => self.alloc_prefix(),
            };
            match r {
                Ok(c) => got.push(c),
                Err(e) => {
                    // EC2 is all-or-nothing per call
                    for c in got {
                        release_cidr(&mut self.subnet, c);
                    }
                    return Err(e);
                }
            }
        }
        Ok(got)
    }

    /// Runs `f` with `subnet_id` as the world's current subnet (the primary one or another).
    pub(super) fn on_subnet<R>(
        &mut self,
        subnet_id: &str,
        f: impl FnOnce(&mut Self) -> R,
    ) -> Option<R> {
        if subnet_id == self.subnet_id {
            return Some(f(self));
        }
        let (mut other, az) = self.other_subnets.remove(subnet_id)?;
        std::mem::swap(&mut self.subnet, &mut other);
        let r = f(self);
        std::mem::swap(&mut self.subnet, &mut other);
        self.other_subnets.insert(subnet_id.to_owned(), (other, az));
        Some(r)
    }

    pub(super) fn subnet_cidr_of(&self, subnet_id: &str) -> Ipv4Net {
        self.other_subnets
            .get(subnet_id)
            .map_or(self.subnet.cidr, |(s, _)| s.cidr)
    }

    pub(super) fn attached(&self) -> impl Iterator<Item = &Ec2Eni> {
        let me = self.identity.instance_id.clone();
        self.enis
            .values()
            .filter(move |e| e.attachment.as_ref().is_some_and(|a| a.instance_id == me))
    }

    pub(super) fn live_imds(&self) -> Vec<ImdsEni> {
        let mut v: Vec<ImdsEni> = self
            .attached()
            .map(|e| {
                let a = e.attachment.as_ref().expect("attached");
                ImdsEni {
                    mac: e.mac.clone(),
                    eni_id: e.eni_id.clone(),
                    device_number: a.device_index,
                    network_card: a.network_card,
                    subnet_id: e.subnet_id.clone(),
                    subnet_cidr: self.subnet_cidr_of(&e.subnet_id),
                    vpc_cidrs: vec![self.vpc_cidr],
                    security_groups: e.security_groups.clone(),
                    primary_ip: e.primary_ip,
                    secondary_ips: e
                        .secondary_ips
                        .iter()
                        .copied()
                        .filter(|ip| !self.imds_hidden.contains(&Ipv4Net::from(*ip)))
                        .collect(),
                    prefixes: e
                        .prefixes
                        .iter()
                        .copied()
                        .filter(|p| !self.imds_hidden.contains(p))
                        .collect(),
                    ipv6s: e.ipv6_addresses.clone(),
                    vpc_ipv6_cidrs: if e.ipv6_addresses.is_empty() {
                        Vec::new()
                    } else {
                        vec![FAKE_VPC_IPV6.parse().expect("cidr")]
                    },
                }
            })
            .collect();
        v.sort_by_key(|e| e.device_number);
        v
    }

    /// Record a call; fail it if a failure was queued for it.
    pub(super) fn enter(&mut self, api: &'static str) -> Result<(), Ec2Error> {
        *self.calls.entry(api).or_default() += 1;
        if let Some(pos) = self.fail_next.iter().position(|(a, _)| *a == api) {
            let (_, e) = self.fail_next.remove(pos).expect("present");
            return Err(e);
        }
        if MUTATING_APIS.contains(&api) {
            self.dirty = true;
            if let Some(e) = self.fail_next_mutation.take() {
                return Err(e);
            }
        }
        if MUTATING_APIS.contains(&api) && self.imds_lag_reads > 0 && self.imds_stale.is_none() {
            self.imds_stale = Some((self.live_imds(), self.imds_lag_reads));
        }
        if MUTATING_APIS.contains(&api) && self.describe_lag > 0 && self.describe_stale.is_none() {
            self.describe_stale = Some((self.enis.clone(), self.describe_lag));
        }
        Ok(())
    }

    /// After a call took effect: report a queued ambiguous failure for it.
    pub(super) fn leave(&mut self, api: &'static str) -> Result<(), Ec2Error> {
        if let Some(pos) = self.fail_after_apply.iter().position(|(a, _)| *a == api) {
            let (_, e) = self.fail_after_apply.remove(pos).expect("present");
            return Err(e);
        }
        Ok(())
    }

    /// The ENIs Describe answers with (stale while a describe lag runs).
    pub(super) fn described_enis(&mut self) -> BTreeMap<String, Ec2Eni> {
        match self.describe_stale.take() {
            Some((enis, left)) => {
                if left > 1 {
                    self.describe_stale = Some((enis.clone(), left - 1));
                }
                enis
            }
            None => self.enis.clone(),
        }
    }

    /// Writes the world to its state file, if it has one (temporary file, then rename).
    pub(super) fn save(&self) -> std::io::Result<()> {
        let Some(path) = &self.state_file else {
            return Ok(());
        };
        let bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }

    pub(super) fn eni_mut(&mut self, id: &str) -> Result<&mut Ec2Eni, Ec2Error> {
        self.enis
            .get_mut(id)
            .ok_or_else(|| Ec2Error::NotFound(id.to_owned()))
    }
}
