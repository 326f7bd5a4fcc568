//! A stateful in-memory EC2 + IMDS for one instance, implementing both ports. It enforces what
//! the pool manager must cope with: the instance ENI limit, addresses per ENI, subnet
//! exhaustion, /28 fragmentation (`InsufficientCidrBlocks`), a free device index per
//! attachment, detach-before-delete, IMDS lag (a stale view for N reads after a change) and
//! addresses IMDS persistently omits. It counts calls per API for budget tests. Test-only
//! (`cfg(test)` or feature `fake`); it must never be wired into the daemon.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};

use ipnet::Ipv4Net;

use super::ec2::{AddressRequest, CreateEni, Ec2, EniQuery, split_cidrs};
use super::error::{Ec2Error, ImdsError};
use super::imds::Imds;
use super::limits::InstanceLimits;
use super::{
    Attachment, Ec2Eni, EniStatus, ImdsEni, InstanceIdentity, TAG_CLUSTER_NAME, TAG_INSTANCE_ID,
    Tags,
};

/// APIs that change EC2 state (for the "no mutating call at steady state" budget).
pub const MUTATING_APIS: &[&str] = &[
    "CreateNetworkInterface",
    "AttachNetworkInterface",
    "ModifyNetworkInterfaceAttribute",
    "AssignPrivateIpAddresses",
    "UnassignPrivateIpAddresses",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
    "CreateTags",
];

#[derive(Debug)]
struct Subnet {
    cidr: Ipv4Net,
    used: BTreeSet<Ipv4Addr>,
}

#[derive(Debug)]
struct World {
    identity: InstanceIdentity,
    limits: InstanceLimits,
    vpc_id: String,
    vpc_cidr: Ipv4Net,
    security_group: String,
    subnet_id: String,
    subnet: Subnet,
    /// Zone of the primary subnet.
    subnet_az: String,
    /// Further subnets of the VPC (custom networking): id → (subnet, zone).
    other_subnets: BTreeMap<String, (Subnet, String)>,
    enis: BTreeMap<String, Ec2Eni>,
    next_id: u32,
    imds_lag_reads: u32,
    imds_stale: Option<(Vec<ImdsEni>, u32)>,
    imds_hidden: BTreeSet<Ipv4Net>,
    fail_next: VecDeque<(&'static str, Ec2Error)>,
    fail_after_apply: VecDeque<(&'static str, Ec2Error)>,
    describe_lag: u32,
    describe_stale: Option<(BTreeMap<String, Ec2Eni>, u32)>,
    calls: BTreeMap<&'static str, u64>,
}

/// The fake cloud. Clones share one world.
#[derive(Debug, Clone)]
pub struct FakeCloud {
    world: Arc<Mutex<World>>,
}

/// The primary ENI's id in every fake world.
pub const PRIMARY_ENI: &str = "eni-primary";

impl FakeCloud {
    /// One instance of `instance_type` (limits given) with its primary ENI in `subnet_cidr`.
    pub fn new(instance_type: &str, limits: InstanceLimits, subnet_cidr: &str) -> Self {
        let cidr: Ipv4Net = subnet_cidr.parse().expect("subnet cidr");
        let mut w = World {
            identity: InstanceIdentity {
                instance_id: "i-0fake".into(),
                instance_type: instance_type.into(),
                region: "us-west-2".into(),
                availability_zone: "us-west-2a".into(),
                primary_mac: "02:00:00:00:00:00".into(),
            },
            limits,
            vpc_id: "vpc-fake".into(),
            vpc_cidr: cidr.supernet().and_then(|s| s.supernet()).unwrap_or(cidr),
            security_group: "sg-fake".into(),
            subnet_id: "subnet-fake".into(),
            subnet: Subnet {
                cidr,
                used: BTreeSet::new(),
            },
            subnet_az: "us-west-2a".into(),
            other_subnets: BTreeMap::new(),
            enis: BTreeMap::new(),
            next_id: 1,
            imds_lag_reads: 0,
            imds_stale: None,
            imds_hidden: BTreeSet::new(),
            fail_next: VecDeque::new(),
            fail_after_apply: VecDeque::new(),
            describe_lag: 0,
            describe_stale: None,
            calls: BTreeMap::new(),
        };
        let primary_ip = w
            .alloc_ip()
            .expect("subnet has room for the primary address");
        w.enis.insert(
            PRIMARY_ENI.into(),
            Ec2Eni {
                eni_id: PRIMARY_ENI.into(),
                mac: "02:00:00:00:00:00".into(),
                subnet_id: w.subnet_id.clone(),
                vpc_id: w.vpc_id.clone(),
                description: String::new(),
                interface_type: "interface".into(),
                status: EniStatus::InUse,
                primary_ip,
                secondary_ips: vec![],
                prefixes: vec![],
                security_groups: vec![w.security_group.clone()],
                tags: Tags::new(),
                attachment: Some(Attachment {
                    attachment_id: "attach-primary".into(),
                    instance_id: w.identity.instance_id.clone(),
                    device_index: 0,
                    network_card: 0,
                    delete_on_termination: true,
                }),
            },
        );
        Self {
            world: Arc::new(Mutex::new(w)),
        }
    }

    /// An m5.large (3 ENIs × 10 IPv4) in 198.18.0.0/24.
    pub fn m5_large() -> Self {
        Self::new(
            "m5.large",
            super::limits::lookup("m5.large").expect("m5.large in table"),
            "198.18.0.0/24",
        )
    }

    fn w(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// IMDS keeps showing the state before a change for `reads` reads of `enis()`.
    pub fn set_imds_lag(&self, reads: u32) {
        self.w().imds_lag_reads = reads;
    }

    /// IMDS stops (or resumes) listing this address/prefix although EC2 still has it.
    pub fn hide_from_imds(&self, cidr: Ipv4Net, hidden: bool) {
        let mut w = self.w();
        if hidden {
            w.imds_hidden.insert(cidr);
        } else {
            w.imds_hidden.remove(&cidr);
        }
    }

    /// The next call of `api` fails with `err` (queued, in order).
    pub fn fail_next(&self, api: &'static str, err: Ec2Error) {
        self.w().fail_next.push_back((api, err));
    }

    /// The next call of `api` takes effect in EC2 but reports `err` (a timeout after EC2
    /// applied the request: the caller cannot tell). Unassign and detach honour it.
    pub fn fail_after_apply(&self, api: &'static str, err: Ec2Error) {
        self.w().fail_after_apply.push_back((api, err));
    }

    /// `DescribeNetworkInterfaces` keeps answering with the ENIs as they were before a
    /// change for `reads` calls (EC2's eventual consistency).
    pub fn set_describe_lag(&self, reads: u32) {
        self.w().describe_lag = reads;
    }

    /// Another subnet of the VPC (for custom networking), in zone `az`.
    pub fn add_subnet(&self, subnet_id: &str, cidr: &str, az: &str) {
        let cidr: Ipv4Net = cidr.parse().expect("subnet cidr");
        self.w().other_subnets.insert(
            subnet_id.to_owned(),
            (
                Subnet {
                    cidr,
                    used: BTreeSet::new(),
                },
                az.to_owned(),
            ),
        );
    }

    /// Occupy one address in every /28 of the subnet (other tenants): /32s stay available,
    /// no /28 prefix can be carved any more.
    pub fn fragment_subnet(&self) {
        let mut w = self.w();
        let cidr = w.subnet.cidr;
        let base = u32::from(cidr.network());
        let size = 1u32 << (32 - cidr.prefix_len());
        let mut off = 0;
        while off < size {
            let ip = Ipv4Addr::from(base + off + 7);
            w.subnet.used.insert(ip);
            off += 16;
        }
    }

    /// Occupy every free subnet address but `leave`.
    pub fn fill_subnet(&self, leave: u32) {
        let mut w = self.w();
        let free = w.free_ips();
        let take = free.len().saturating_sub(leave as usize);
        for ip in free.into_iter().take(take) {
            w.subnet.used.insert(ip);
        }
    }

    /// EC2-side change behind ipamd's back: drop an address from an ENI.
    pub fn remove_address(&self, eni_id: &str, cidr: Ipv4Net) {
        let mut w = self.w();
        let w = &mut *w;
        if let Some(e) = w.enis.get_mut(eni_id) {
            e.secondary_ips.retain(|ip| Ipv4Net::from(*ip) != cidr);
            e.prefixes.retain(|p| *p != cidr);
        }
        release_cidr(&mut w.subnet, cidr);
    }

    /// EC2-side change behind ipamd's back: an ENI detached and deleted by someone else (an
    /// operator, another controller). Its addresses go back to the subnet.
    pub fn remove_eni(&self, eni_id: &str) {
        let mut w = self.w();
        let w = &mut *w;
        if let Some(e) = w.enis.remove(eni_id) {
            for c in e
                .secondary_ips
                .iter()
                .map(|ip| Ipv4Net::from(*ip))
                .chain(e.prefixes.iter().copied())
                .chain([Ipv4Net::from(e.primary_ip)])
            {
                release_cidr(&mut w.subnet, c);
            }
        }
    }

    /// Put an ENI that ipamd did not create into the world (e.g. `no_manage`, or a leaked one).
    /// `attach_at` attaches it to the instance at that device index.
    pub fn add_foreign_eni(&self, tags: Tags, secondary: u32, attach_at: Option<u32>) -> String {
        let mut w = self.w();
        let id = w.new_id("eni");
        let primary_ip = w.alloc_ip().expect("room");
        let secondary_ips = (0..secondary)
            .map(|_| w.alloc_ip().expect("room"))
            .collect();
        let attachment = attach_at.map(|d| Attachment {
            attachment_id: format!("attach-{id}"),
            instance_id: w.identity.instance_id.clone(),
            device_index: d,
            network_card: 0,
            delete_on_termination: false,
        });
        let eni = Ec2Eni {
            eni_id: id.clone(),
            mac: mac_of(w.next_id),
            subnet_id: w.subnet_id.clone(),
            vpc_id: w.vpc_id.clone(),
            description: String::new(),
            interface_type: "interface".into(),
            status: if attachment.is_some() {
                EniStatus::InUse
            } else {
                EniStatus::Available
            },
            primary_ip,
            secondary_ips,
            prefixes: vec![],
            security_groups: vec![w.security_group.clone()],
            tags,
            attachment,
        };
        w.enis.insert(id.clone(), eni);
        id
    }

    /// Number of calls made to `api`.
    pub fn calls(&self, api: &str) -> u64 {
        self.w()
            .calls
            .iter()
            .filter(|(k, _)| **k == api)
            .map(|(_, v)| *v)
            .sum()
    }

    /// Calls per API so far.
    pub fn call_counts(&self) -> BTreeMap<&'static str, u64> {
        self.w().calls.clone()
    }

    /// Mutating calls so far.
    pub fn mutating_calls(&self) -> u64 {
        self.w()
            .calls
            .iter()
            .filter(|(k, _)| MUTATING_APIS.contains(k))
            .map(|(_, v)| *v)
            .sum()
    }

    /// One ENI as EC2 has it.
    pub fn eni(&self, id: &str) -> Option<Ec2Eni> {
        self.w().enis.get(id).cloned()
    }

    /// All ENIs in the world.
    pub fn all_enis(&self) -> Vec<Ec2Eni> {
        self.w().enis.values().cloned().collect()
    }

    /// Free addresses left in the subnet.
    pub fn subnet_free(&self) -> usize {
        self.w().free_ips().len()
    }

    pub fn vpc_id(&self) -> String {
        self.w().vpc_id.clone()
    }

    pub fn instance_id(&self) -> String {
        self.w().identity.instance_id.clone()
    }
}

fn mac_of(n: u32) -> String {
    let b = n.to_be_bytes();
    format!("02:00:00:{:02x}:{:02x}:{:02x}", b[1], b[2], b[3])
}

fn release_cidr(subnet: &mut Subnet, cidr: Ipv4Net) {
    for ip in cidr.hosts().chain([cidr.network(), cidr.broadcast()]) {
        subnet.used.remove(&ip);
    }
}

impl World {
    fn new_id(&mut self, kind: &str) -> String {
        self.next_id += 1;
        format!("{kind}-{:08x}", self.next_id)
    }

    fn reserved(&self, ip: Ipv4Addr) -> bool {
        // AWS reserves the first four addresses and the last one of every subnet
        let c = self.subnet.cidr;
        let off = u32::from(ip) - u32::from(c.network());
        off < 4 || ip == c.broadcast()
    }

    fn free_ips(&self) -> Vec<Ipv4Addr> {
        let c = self.subnet.cidr;
        let base = u32::from(c.network());
        let size = 1u32 << (32 - c.prefix_len());
        (0..size)
            .map(|o| Ipv4Addr::from(base + o))
            .filter(|ip| !self.reserved(*ip) && !self.subnet.used.contains(ip))
            .collect()
    }

    fn alloc_ip(&mut self) -> Result<Ipv4Addr, Ec2Error> {
        let ip = *self.free_ips().first().ok_or(Ec2Error::SubnetFull)?;
        self.subnet.used.insert(ip);
        Ok(ip)
    }

    fn alloc_prefix(&mut self) -> Result<Ipv4Net, Ec2Error> {
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

    fn alloc(&mut self, req: AddressRequest) -> Result<Vec<Ipv4Net>, Ec2Error> {
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
    fn on_subnet<R>(&mut self, subnet_id: &str, f: impl FnOnce(&mut Self) -> R) -> Option<R> {
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

    fn subnet_cidr_of(&self, subnet_id: &str) -> Ipv4Net {
        self.other_subnets
            .get(subnet_id)
            .map_or(self.subnet.cidr, |(s, _)| s.cidr)
    }

    fn attached(&self) -> impl Iterator<Item = &Ec2Eni> {
        let me = self.identity.instance_id.clone();
        self.enis
            .values()
            .filter(move |e| e.attachment.as_ref().is_some_and(|a| a.instance_id == me))
    }

    fn live_imds(&self) -> Vec<ImdsEni> {
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
                }
            })
            .collect();
        v.sort_by_key(|e| e.device_number);
        v
    }

    /// Record a call; fail it if a failure was queued for it.
    fn enter(&mut self, api: &'static str) -> Result<(), Ec2Error> {
        *self.calls.entry(api).or_default() += 1;
        if let Some(pos) = self.fail_next.iter().position(|(a, _)| *a == api) {
            let (_, e) = self.fail_next.remove(pos).expect("present");
            return Err(e);
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
    fn leave(&mut self, api: &'static str) -> Result<(), Ec2Error> {
        if let Some(pos) = self.fail_after_apply.iter().position(|(a, _)| *a == api) {
            let (_, e) = self.fail_after_apply.remove(pos).expect("present");
            return Err(e);
        }
        Ok(())
    }

    /// The ENIs Describe answers with (stale while a describe lag runs).
    fn described_enis(&mut self) -> BTreeMap<String, Ec2Eni> {
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

    fn eni_mut(&mut self, id: &str) -> Result<&mut Ec2Eni, Ec2Error> {
        self.enis
            .get_mut(id)
            .ok_or_else(|| Ec2Error::NotFound(id.to_owned()))
    }
}

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

    async fn instance_type_limits(&self, instance_type: &str) -> Result<InstanceLimits, Ec2Error> {
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
            security_groups: req.security_groups,
            tags: req.tags,
            attachment: None,
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
        let attached: Vec<u32> = w
            .attached()
            .filter_map(|e| e.attachment.as_ref().map(|a| a.device_index))
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

#[cfg(test)]
mod tests {
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
}
