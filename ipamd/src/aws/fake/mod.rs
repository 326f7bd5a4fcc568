//! A stateful in-memory EC2 + IMDS for one instance, implementing both ports. It enforces what
//! the pool manager must cope with: the instance ENI limit, addresses per ENI, subnet
//! exhaustion, /28 fragmentation (`InsufficientCidrBlocks`), a free device index per
//! attachment, detach-before-delete, IMDS lag (a stale view for N reads after a change) and
//! addresses IMDS persistently omits. It counts calls per API for budget tests. Its world can
//! live in a JSON file, saved after every mutating call, so "EC2" outlives a killed ipamd (the
//! test-only `IPAMD_ENI_PROVIDER=memory`, `aws::memory`). Test-only (`cfg(test)` or feature
//! `fake`, which `memory-provider` implies); it must never be wired into a release daemon.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::ops::{Deref, DerefMut};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use super::ec2::{AddressRequest, CreateEni, Ec2, EniQuery, SubnetInfo, split_cidrs};
use super::error::{Ec2Error, ImdsError};
use super::imds::Imds;
use super::limits::InstanceTypeLimits;
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
    "AssignIpv6Addresses",
    "DetachNetworkInterface",
    "DeleteNetworkInterface",
    "CreateTags",
];

#[derive(Debug, Serialize, Deserialize)]
struct Subnet {
    cidr: Ipv4Net,
    used: BTreeSet<Ipv4Addr>,
}

/// EC2's state (persisted) and the test's injections and counters (not persisted: a restarted
/// ipamd meets the same EC2, not the previous test step's planted failures).
#[derive(Debug, Serialize, Deserialize)]
struct World {
    identity: InstanceIdentity,
    limits: InstanceTypeLimits,
    vpc_id: String,
    vpc_cidr: Ipv4Net,
    security_group: String,
    subnet_id: String,
    subnet: Subnet,
    /// Zone of the primary subnet.
    subnet_az: String,
    /// Further subnets of the VPC (custom networking): id → (subnet, zone).
    other_subnets: BTreeMap<String, (Subnet, String)>,
    /// Subnet tags (e.g. `kubernetes.io/role/cni`), by subnet id.
    #[serde(default)]
    subnet_tags: BTreeMap<String, Tags>,
    enis: BTreeMap<String, Ec2Eni>,
    next_id: u32,
    #[serde(skip)]
    imds_lag_reads: u32,
    #[serde(skip)]
    imds_stale: Option<(Vec<ImdsEni>, u32)>,
    #[serde(skip)]
    imds_hidden: BTreeSet<Ipv4Net>,
    #[serde(skip)]
    fail_next: VecDeque<(&'static str, Ec2Error)>,
    /// Fails the next call of any mutating API (whichever comes first).
    #[serde(skip)]
    fail_next_mutation: Option<Ec2Error>,
    #[serde(skip)]
    fail_after_apply: VecDeque<(&'static str, Ec2Error)>,
    #[serde(skip)]
    describe_lag: u32,
    #[serde(skip)]
    describe_stale: Option<(BTreeMap<String, Ec2Eni>, u32)>,
    #[serde(skip)]
    calls: BTreeMap<&'static str, u64>,
    /// Where the world is saved (None: memory only).
    #[serde(skip)]
    state_file: Option<PathBuf>,
    /// A mutating call ran since the last save.
    #[serde(skip)]
    dirty: bool,
}

/// The world, locked; saved to its state file (if any) when a mutating call (or a test-side
/// change) ran under it.
struct WorldGuard<'a>(MutexGuard<'a, World>);

impl Deref for WorldGuard<'_> {
    type Target = World;
    fn deref(&self) -> &World {
        &self.0
    }
}

impl DerefMut for WorldGuard<'_> {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.0
    }
}

impl Drop for WorldGuard<'_> {
    fn drop(&mut self) {
        if std::mem::take(&mut self.0.dirty)
            && let Err(e) = self.0.save()
        {
            // A test fake: a lost save shows as "EC2 forgot" after a restart, never silently.
            tracing::error!(error = %e, "fake cloud: saving the world failed");
        }
    }
}

/// The fake VPC's IPv6 CIDR (documentation range; the fake has no packets).
pub const FAKE_VPC_IPV6: &str = "2001:db8:0:100::/56";
/// The primary ENI's own IPv6 address (`ipv6s`).
pub const FAKE_PRIMARY_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0x101, 0, 0, 0, 0x10);

/// The fake VPC's default security group (what EC2 applies to an ENI created without groups).
pub const FAKE_VPC_DEFAULT_SG: &str = "sg-vpc-default";

/// The `n`th /80 of the fake subnet `2001:db8:0:101::/64`.
pub fn fake_ipv6_prefix(n: u16) -> Ipv6Net {
    Ipv6Net::new(Ipv6Addr::new(0x2001, 0xdb8, 0, 0x101, n, 0, 0, 0), 80).expect("/80")
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
    pub fn new(instance_type: &str, limits: InstanceTypeLimits, subnet_cidr: &str) -> Self {
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
            subnet_tags: BTreeMap::new(),
            enis: BTreeMap::new(),
            next_id: 1,
            imds_lag_reads: 0,
            imds_stale: None,
            imds_hidden: BTreeSet::new(),
            fail_next: VecDeque::new(),
            fail_next_mutation: None,
            fail_after_apply: VecDeque::new(),
            describe_lag: 0,
            describe_stale: None,
            calls: BTreeMap::new(),
            state_file: None,
            dirty: false,
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
                ipv6_prefixes: vec![],
                ipv6_addresses: vec![FAKE_PRIMARY_IPV6],
                security_groups: vec![w.security_group.clone()],
                tags: Tags::new(),
                attachment: Some(Attachment {
                    attachment_id: "attach-primary".into(),
                    instance_id: w.identity.instance_id.clone(),
                    device_index: 0,
                    network_card: 0,
                    delete_on_termination: true,
                }),
                conntrack: None,
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

    /// The VPC's CIDR (default: the primary subnet's /(n-2) supernet).
    #[must_use]
    pub fn with_vpc_cidr(self, cidr: Ipv4Net) -> Self {
        self.w().vpc_cidr = cidr;
        self
    }

    /// Keeps the world in `path` (JSON, written atomically after every mutating call). If the
    /// file exists its world replaces this one (EC2 outlived the process); otherwise this
    /// world is written there now.
    ///
    /// # Panics
    /// If the file exists but is not a saved world, or cannot be written.
    #[must_use]
    pub fn persisted_in(self, path: PathBuf) -> Self {
        {
            let mut w = self.w();
            if let Ok(bytes) = std::fs::read(&path) {
                *w = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                    panic!("fake cloud: {} is not a saved world: {e}", path.display())
                });
            }
            w.state_file = Some(path);
            w.save().expect("fake cloud: write the state file");
        }
        self
    }

    fn w(&self) -> WorldGuard<'_> {
        WorldGuard(
            self.world
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
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

    /// The next call of any mutating API ([`MUTATING_APIS`]) fails with `err` (after the
    /// per-API failures queued for it by [`FakeCloud::fail_next`]).
    pub fn fail_next_mutation(&self, err: Ec2Error) {
        self.w().fail_next_mutation = Some(err);
    }

    /// The next call of `api` takes effect in EC2 but reports `err` (a timeout after EC2
    /// applied the request: the caller cannot tell). Unassign and detach honour it.
    pub fn fail_after_apply(&self, api: &'static str, err: Ec2Error) {
        self.w().fail_after_apply.push_back((api, err));
    }

    /// The next call of `api` takes effect in EC2, its answer is lost (a timeout, a reset
    /// connection), and the client's retry of it is answered `RequestLimitExceeded`: the port
    /// reports [`Ec2Error::Throttled`] for a call EC2 applied. That is what a client with
    /// transparent retries (the SDK's standard mode retries timeouts, resets and 5xx) sends
    /// back, so a bare `Throttled` never proves EC2 did nothing. Unassign and detach honour it.
    pub fn applied_then_throttled(&self, api: &'static str) {
        self.fail_after_apply(api, Ec2Error::Throttled);
    }

    /// `DescribeNetworkInterfaces` keeps answering with the ENIs as they were before a
    /// change for `reads` calls (EC2's eventual consistency).
    pub fn set_describe_lag(&self, reads: u32) {
        self.w().describe_lag = reads;
    }

    /// Another subnet of the VPC (for custom networking), in zone `az`.
    pub fn add_subnet(&self, subnet_id: &str, cidr: &str, az: &str) {
        let cidr: Ipv4Net = cidr.parse().expect("subnet cidr");
        let mut w = self.w();
        w.dirty = true;
        w.other_subnets.insert(
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

    /// Sets tag `key=value` on subnet `subnet_id` (the primary one or one of [`Self::add_subnet`]).
    pub fn tag_subnet(&self, subnet_id: &str, key: &str, value: &str) {
        let mut w = self.w();
        w.dirty = true;
        w.subnet_tags
            .entry(subnet_id.to_owned())
            .or_default()
            .insert(key.to_owned(), value.to_owned());
    }

    /// The primary ENI's `ConnectionTrackingConfiguration` (as an operator sets it with
    /// `ModifyNetworkInterfaceAttribute`).
    pub fn set_primary_conntrack(&self, spec: Option<crate::aws::ConntrackSpec>) {
        let mut w = self.w();
        w.dirty = true;
        let primary = w.identity.instance_id.clone();
        for e in w.enis.values_mut() {
            if e.attachment
                .as_ref()
                .is_some_and(|a| a.instance_id == primary && a.device_index == 0)
            {
                e.conntrack = spec;
            }
        }
    }

    /// Occupy one address in every /28 of the subnet (other tenants): /32s stay available,
    /// no /28 prefix can be carved any more.
    pub fn fragment_subnet(&self) {
        let mut w = self.w();
        w.dirty = true;
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
        w.dirty = true;
        let free = w.free_ips();
        let take = free.len().saturating_sub(leave as usize);
        for ip in free.into_iter().take(take) {
            w.subnet.used.insert(ip);
        }
    }

    /// EC2-side change behind ipamd's back: drop an address from an ENI.
    pub fn remove_address(&self, eni_id: &str, cidr: Ipv4Net) {
        let mut w = self.w();
        w.dirty = true;
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
        w.dirty = true;
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
        w.dirty = true;
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
            ipv6_prefixes: vec![],
            ipv6_addresses: vec![],
            security_groups: vec![w.security_group.clone()],
            tags,
            attachment,
            conntrack: None,
        };
        w.enis.insert(id.clone(), eni);
        id
    }

    /// The VPC Resource Controller's move (security groups for pods): a trunk ENI
    /// (`InterfaceType` trunk, no secondary address) attached at device index `attach_at`.
    pub fn add_trunk_eni(&self, attach_at: u32) -> String {
        let id = self.add_foreign_eni(Tags::new(), 0, Some(attach_at));
        if let Some(e) = self.w().enis.get_mut(&id) {
            e.interface_type = "trunk".into();
        }
        id
    }

    /// The VPC Resource Controller's branch ENI for a pod (security groups for pods): an ENI
    /// of the subnet with `InterfaceType` branch and the controller's tags, attached to no
    /// instance (EC2 associates it with the trunk). None when the subnet is full.
    pub fn add_branch_eni(&self, trunk: &str) -> Option<String> {
        if self.subnet_free() == 0 {
            return None;
        }
        let tags: Tags = [
            (
                "eks:eni:owner".to_owned(),
                "eks-vpc-resource-controller".to_owned(),
            ),
            (
                "vpcresources.k8s.aws/trunk-eni-id".to_owned(),
                trunk.to_owned(),
            ),
        ]
        .into_iter()
        .collect();
        let id = self.add_foreign_eni(tags, 0, None);
        if let Some(e) = self.w().enis.get_mut(&id) {
            e.interface_type = "branch".into();
        }
        Some(id)
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

mod ports;
#[cfg(test)]
mod tests;
mod world;
