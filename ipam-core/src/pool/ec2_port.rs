//! The EC2-shaped port the pool manager acts through ([`EniProvider`]): list attached ENIs,
//! assign/unassign /32s and /28 prefixes, create+attach and free ENIs. Domain-shaped, async,
//! returning what EC2 returns. Must not: know about the datastore, pods or the policy.
//!
//! Implementations: the EC2/IMDS one (`aws::provider::Ec2Provider`), and for tests and demos
//! `aws::memory::MemoryProvider` (that provider over `aws::fake::FakeCloud`).

use std::future::Future;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};

/// Back-off after EC2 answered that a subnet has no free address (`InsufficientCidrBlocks` /
/// `InsufficientFreeAddressesInSubnet`): the provider asks that subnet nothing meanwhile, the pool
/// manager passes its ENIs over.
pub const INSUFFICIENT_ADDRESS_BACKOFF: Duration = Duration::from_secs(120);

/// An ENI attached to this instance, as the pool sees it: what the provider port answers (the
/// EC2 adapter builds it from EC2's and IMDS's raw views, `aws::Ec2Eni` / `aws::ImdsEni`, and
/// decides the flags), with its addresses. The datastore keeps its identity without addresses
/// (`datastore::EniIdentity`), the host layer its own link view (`host::EniSpec`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttachedEni {
    /// `eni-...`.
    pub id: String,
    /// Attachment device index (0 = primary).
    pub device_number: u32,
    /// Network card index.
    pub network_card: u32,
    /// The instance's primary ENI.
    pub is_primary: bool,
    /// Trunk ENI (SGP).
    pub is_trunk: bool,
    /// EFA ENI.
    pub is_efa: bool,
    /// Excluded from pod placement: a `no_manage` ENI, the primary ENI under custom
    /// networking, or an ENI in an excluded subnet (`subnet_excluded`).
    pub is_excluded: bool,
    /// In a subnet tagged `kubernetes.io/role/cni=0` (subnet discovery): also `is_excluded`, but
    /// unlike a `no_manage` ENI its addresses are listed (its pods keep them) and its host
    /// networking is set up.
    #[serde(default)]
    pub subnet_excluded: bool,
    /// MAC address.
    pub mac: String,
    /// Subnet id.
    pub subnet_id: String,
    /// Subnet CIDR.
    pub subnet: Ipv4Net,
    /// The ENI's own primary private IP (never given to pods).
    pub primary_ip: Ipv4Addr,
    /// Secondary private IPs.
    pub secondary_ips: Vec<Ipv4Addr>,
    /// Delegated /28 prefixes.
    pub prefixes: Vec<Ipv4Net>,
}

impl AttachedEni {
    /// An ENI with every flag false and no addresses: the base the EC2 provider fills from what
    /// EC2/IMDS list (`..AttachedEni::unflagged()`), before it decides the flags.
    pub fn unflagged() -> Self {
        Self {
            id: String::new(),
            device_number: 0,
            network_card: 0,
            is_primary: false,
            is_trunk: false,
            is_efa: false,
            is_excluded: false,
            subnet_excluded: false,
            mac: String::new(),
            subnet_id: String::new(),
            subnet: Ipv4Net::default(),
            primary_ip: Ipv4Addr::UNSPECIFIED,
            secondary_ips: Vec::new(),
            prefixes: Vec::new(),
        }
    }
}

impl From<&crate::datastore::EniIdentity> for AttachedEni {
    /// The datastore's description of an ENI (the node's one description), without its
    /// addresses: what the ENI's host set-up and teardown need.
    fn from(s: &crate::datastore::EniIdentity) -> Self {
        Self {
            id: s.id.clone(),
            device_number: s.device_number,
            network_card: s.network_card,
            is_primary: s.is_primary,
            is_trunk: s.is_trunk,
            is_efa: s.is_efa,
            is_excluded: s.is_excluded,
            mac: s.mac.clone(),
            subnet_id: s.subnet_id.clone(),
            subnet: s.subnet,
            primary_ip: s.primary_ip,
            ..Self::unflagged()
        }
    }
}

/// What the instance may hold, as the pool policy needs it: the provider's answer, derived from
/// its instance-type table (the EC2 adapter's `aws::limits::InstanceTypeLimits`, whose
/// hypervisor facts become [`Self::prefix_delegation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceLimits {
    /// ENIs per network card (the same on every card).
    pub max_enis: u32,
    /// IPv4 addresses per ENI, including its primary.
    pub ipv4_per_eni: u32,
    /// Network cards of the instance type (1 for most).
    pub network_cards: u32,
    /// EC2 delegates /28 prefixes to its ENIs (Nitro and bare metal).
    pub prefix_delegation: bool,
}

/// Node-level network facts the plugin needs in every reply.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeNetwork {
    /// VPC IPv4 CIDRs.
    pub vpc_v4_cidrs: Vec<Ipv4Net>,
    /// The instance's primary IPv4 (SNAT source).
    pub primary_ip: Option<Ipv4Addr>,
    /// VPC IPv6 CIDRs (IMDS `vpc-ipv6-cidr-blocks`; empty without IPv6).
    pub vpc_v6_cidrs: Vec<Ipv6Net>,
    /// The primary ENI's first IPv6 (IMDS `ipv6s`), served as `NodeIPv6` in IPv6 mode.
    pub primary_ipv6: Option<Ipv6Addr>,
    /// The EC2 instance id ("" when the provider has none), served to the network-policy agent.
    pub instance_id: String,
    /// The AWS region ("" when the provider has none), served to the network-policy agent.
    pub region: String,
    /// The instance type ("" when the provider has none), for what ipamd logs about it.
    pub instance_type: String,
}

/// The node as EC2/IMDS describe it at one moment: what the IPAM service starts from
/// (`Ipam::start`), read by its caller through the port.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeDescription {
    /// Every ENI attached to the instance, with its addresses.
    pub enis: Vec<AttachedEni>,
    /// VPC CIDRs, primary addresses, instance id and region.
    pub network: NodeNetwork,
}

impl NodeDescription {
    /// Lists the ENIs and reads the node's network facts through `provider`.
    pub async fn describe<P: EniProvider>(provider: &P) -> Result<Self, ProviderError> {
        Ok(Self {
            enis: provider.list_enis().await?,
            network: provider.node_network().await?,
        })
    }
}

/// Typed provider failures. The pool manager branches on these, never on text: every variant
/// carries the facts it was built from where it arose (the EC2 adapter, `aws::provider`, or the
/// manager), and its `Display` is the one log/CNI-error wording.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// ENI or per-ENI address limit of the instance reached.
    #[error("instance limit reached: {0}")]
    InstanceLimit(InstanceLimit),
    /// The subnet has no free address.
    #[error("subnet {0} exhausted")]
    SubnetExhausted(SubnetShortage),
    /// The subnet has no free aligned /28 (EC2 `InsufficientCidrBlocks`: fragmented).
    #[error("subnet {0}: no free /28 block")]
    NoFreePrefix(PrefixShortage),
    /// Request rate exceeded; retry later.
    #[error("throttled")]
    Throttled,
    /// The ENI/address does not exist.
    #[error("{resource} not found")]
    NotFound {
        /// What EC2 did not find: the id asked for, or EC2's message naming it.
        resource: String,
    },
    /// Refused because the thing is in use (e.g. primary ENI, primary IP).
    #[error("{0} is in use")]
    InUse(Busy),
    /// Missing IAM permission: the action refused.
    #[error("unauthorized: {action}")]
    Unauthorized {
        /// The action EC2 refused (`ec2:<API>`), or EC2's error code when the API is unknown.
        action: String,
    },
    /// The node's configuration forbids the call (custom networking without a usable
    /// ENIConfig, no subnet that subnet discovery allows): retried on later rounds, never a crash.
    #[error("not placeable: {0}")]
    Misconfigured(Unplaceable),
    /// Anything else (transport, unexpected answer, the manager's own bookkeeping).
    #[error("{0}")]
    Other(Failure),
    /// EC2 refused every request of the call before acting on any (the error inside is the
    /// last answer, `Throttled` or `Unauthorized`): the call certainly had no effect. Only a
    /// call sent as one request per try can say so (the unassign: `aws::ec2::Ec2::unassign`).
    #[error("{0} (every request refused before ec2 acted)")]
    NotApplied(Box<ProviderError>),
}

/// Which limit of the instance refused ([`ProviderError::InstanceLimit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InstanceLimit {
    /// EC2 `AttachmentLimitExceeded` (or no free device index): every ENI slot is taken.
    #[error("instance eni limit reached")]
    EniAttachments,
    /// EC2 `PrivateIpAddressLimitExceeded`: the ENI holds its maximum of addresses.
    #[error("eni address limit reached")]
    AddressesPerEni,
    /// An ENI was asked on a network card the instance type does not have.
    #[error("network card {card} does not exist on this instance type ({cards} network cards)")]
    NoSuchCard {
        /// The card asked for.
        card: u32,
        /// Network cards of the instance type.
        cards: u32,
    },
}

/// A subnet (or, for a new ENI, every subnet tried) out of addresses
/// ([`ProviderError::SubnetExhausted`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetShortage {
    /// The subnets that ran out (one for an assign; the candidates of a new ENI).
    pub subnets: Vec<String>,
    /// True when EC2 was not asked: the subnet ran out less than the provider's back-off ago.
    pub backing_off: bool,
}

impl std::fmt::Display for SubnetShortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: no free addresses", self.subnets.join(","))?;
        if self.backing_off {
            f.write_str(" (EC2 ran out of them; asked again after a 120 s back-off)")?;
        }
        Ok(())
    }
}

/// A subnet with free addresses but no free aligned /28 ([`ProviderError::NoFreePrefix`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{subnet}: no free aligned /28 block")]
pub struct PrefixShortage {
    /// The fragmented subnet.
    pub subnet: String,
}

/// What is in use ([`ProviderError::InUse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    /// EC2 answered a `*.InUse` error code.
    #[error("{message}")]
    Ec2 {
        /// The code (`InvalidNetworkInterface.InUse`, ...).
        code: String,
        /// EC2's message.
        message: String,
    },
    /// The instance's primary ENI, which is never freed.
    #[error("{eni_id} is the primary eni")]
    PrimaryEni {
        /// Its id.
        eni_id: String,
    },
    /// The datastore refused to give the ENI up (pods on it, unknown).
    #[error("{eni_id}: {refusal}")]
    Datastore {
        /// The ENI.
        eni_id: String,
        /// The datastore's refusal.
        refusal: crate::datastore::DatastoreError,
    },
}

/// Why no new ENI can be placed ([`ProviderError::Misconfigured`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unplaceable {
    /// Custom networking: the node's ENIConfig gives no usable subnet (`pool::placement`, which
    /// reported it: log, metric, event).
    #[error("{reason}")]
    EniConfig {
        /// The refusal's metric label (`node_unknown`, `missing_eniconfig`, `wrong_zone`,
        /// `unknown_subnet`).
        kind: &'static str,
        /// The refusal as the Kubernetes layer words it.
        reason: String,
    },
    /// Subnet discovery on, and no subnet of the zone is tagged for the CNI (the primary one
    /// is excluded or of another cluster).
    #[error(
        "no valid subnets available for eni creation: every subnet is untagged or tagged \
         kubernetes.io/role/cni=0"
    )]
    NoValidSubnet,
    /// The primary subnet is tagged `kubernetes.io/role/cni=0` and is the only choice
    /// (discovery off, or DescribeSubnets failed once).
    #[error(
        "primary subnet {subnet} is tagged kubernetes.io/role/cni=0{}: no valid subnet for eni creation",
        if *discovery { "" } else { " and subnet discovery is disabled" }
    )]
    PrimarySubnetExcluded {
        /// The primary ENI's subnet.
        subnet: String,
        /// `ENABLE_SUBNET_DISCOVERY`.
        discovery: bool,
    },
    /// Discovery on, DescribeSubnets failed, and the check of the primary subnet (a second
    /// DescribeSubnets) failed too: no ENI is created.
    #[error("could not check whether the primary subnet is excluded; no eni created")]
    SubnetExclusionUnknown,
}

/// Any other failure ([`ProviderError::Other`]), by where it arose.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// EC2 could not be reached (connection, timeout).
    #[error("transport: {detail}")]
    Ec2Transport {
        /// The transport's own words.
        detail: String,
    },
    /// EC2 answered an error code the pool has no variant for.
    #[error("{code}: {message}")]
    Ec2Api {
        /// EC2's error code.
        code: String,
        /// EC2's message.
        message: String,
    },
    /// EC2's answer lacked a field the call cannot do without.
    #[error("malformed response: {field}")]
    Ec2Malformed {
        /// The missing field.
        field: &'static str,
    },
    /// IMDS could not be read.
    #[error("{detail}")]
    Imds {
        /// The IMDS client's own words.
        detail: String,
    },
    /// IMDS lists no primary ENI (device 0 of card 0).
    #[error("imds lists no primary eni")]
    NoPrimaryEni,
    /// The VPC id is unknown (no attached ENI names it).
    #[error("vpc id unknown")]
    VpcUnknown,
    /// The ENI is not attached (to free it).
    #[error("{eni_id} is not attached")]
    NotAttached {
        /// The ENI.
        eni_id: String,
    },
    /// `AssignIpv6Addresses` answered without a prefix.
    #[error("AssignIpv6Addresses gave {eni_id} no prefix")]
    NoIpv6PrefixGiven {
        /// The ENI.
        eni_id: String,
    },
    /// This provider attaches ENIs on network card 0 only.
    #[error("network card {card}: this provider attaches ENIs on network card 0 only")]
    CardUnsupported {
        /// The card asked for.
        card: u32,
    },
    /// This provider has no IPv6.
    #[error("{eni_id}: this provider has no IPv6")]
    NoIpv6 {
        /// The ENI asked for a /80.
        eni_id: String,
    },
    /// The manager could not record a release durably, so EC2 was not asked.
    #[error("release of {eni_id} not asked of EC2: {reason}")]
    ReleaseNotRecorded {
        /// The ENI of the release.
        eni_id: String,
        /// Why the record failed.
        reason: String,
    },
    /// The manager could not register a new ENI in the datastore.
    #[error("register {eni_id}: {refusal}")]
    NotRegistered {
        /// The new ENI.
        eni_id: String,
        /// The datastore's refusal.
        refusal: crate::datastore::DatastoreError,
    },
}

impl ProviderError {
    /// The call certainly had no effect: EC2 refused every request of it before acting
    /// ([`Self::NotApplied`]). A bare `Throttled` or `Unauthorized` is the LAST answer only:
    /// an earlier request (a transparent retry's first attempt, whose answer was lost) may
    /// have been applied.
    #[must_use]
    pub fn certainly_not_applied(&self) -> bool {
        matches!(self, Self::NotApplied(_))
    }

    /// Limits that retrying will not fix soon: AddNetwork fails at once on these.
    #[must_use]
    pub fn is_hard_limit(&self) -> bool {
        matches!(
            self,
            Self::InstanceLimit(_) | Self::SubnetExhausted(_) | Self::NoFreePrefix(_)
        )
    }
}

/// Request for a new ENI.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NewEni {
    /// Secondary /32s to create it with.
    pub secondary_ips: u32,
    /// /28 prefixes to create it with.
    pub prefixes: u32,
    /// Where the pool decided it goes (custom networking, `pool::placement`); None: where the
    /// provider's own rules put it (subnet discovery or the primary ENI's subnet, with the
    /// primary ENI's security groups).
    pub placement: Option<EniPlacement>,
}

/// Where the pool decided a new ENI goes (`pool::placement`: custom networking's ENIConfig, its
/// subnet checked to be in the instance's zone). The provider creates the ENI in `subnet_id` with
/// `security_groups`, or with the primary ENI's groups when the ENIConfig lists none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniPlacement {
    /// The ENIConfig it came from (for the provider's log lines).
    pub eni_config: String,
    /// The subnet to create the ENI in.
    pub subnet_id: String,
    /// Its security groups (empty: the primary ENI's).
    pub security_groups: Vec<String>,
}

/// The EC2-side port of the pool manager. Implementations are cheap to share (`Arc` inside).
pub trait EniProvider: Send + Sync + 'static {
    /// Instance ENI/IP limits.
    fn instance_limits(&self)
    -> impl Future<Output = Result<InstanceLimits, ProviderError>> + Send;
    /// VPC CIDRs and primary IP.
    fn node_network(&self) -> impl Future<Output = Result<NodeNetwork, ProviderError>> + Send;
    /// Every ENI attached to the instance, with its addresses (EC2 is the source of truth).
    fn list_enis(&self) -> impl Future<Output = Result<Vec<AttachedEni>, ProviderError>> + Send;
    /// Assigns `count` new secondary IPs to `eni_id`; returns exactly the new ones.
    fn assign_ips(
        &self,
        eni_id: &str,
        count: u32,
    ) -> impl Future<Output = Result<Vec<Ipv4Addr>, ProviderError>> + Send;
    /// Assigns `count` new /28 prefixes to `eni_id`; returns exactly the new ones.
    fn assign_prefixes(
        &self,
        eni_id: &str,
        count: u32,
    ) -> impl Future<Output = Result<Vec<Ipv4Net>, ProviderError>> + Send;
    /// The instance's availability zone (custom networking's placement checks an ENIConfig
    /// subnet against it). Providers without zones answer "".
    fn availability_zone(&self) -> impl Future<Output = Result<String, ProviderError>> + Send {
        async { Ok(String::new()) }
    }
    /// The availability zone of `subnet_id` (None: EC2 does not know the subnet). Providers
    /// without zones know no subnet.
    fn subnet_zone(
        &self,
        subnet_id: &str,
    ) -> impl Future<Output = Result<Option<String>, ProviderError>> + Send {
        let _ = subnet_id;
        async { Ok(None) }
    }
    /// Creates an ENI with addresses and attaches it at the next free device index.
    fn create_eni(
        &self,
        req: NewEni,
    ) -> impl Future<Output = Result<AttachedEni, ProviderError>> + Send;
    /// Creates an ENI with addresses and attaches it on network card `card`, at that card's first
    /// free device index (counted per card). Providers without network cards refuse every card but
    /// 0.
    fn create_eni_on_card(
        &self,
        req: NewEni,
        card: u32,
    ) -> impl Future<Output = Result<AttachedEni, ProviderError>> + Send {
        async move {
            if card == 0 {
                self.create_eni(req).await
            } else {
                Err(ProviderError::Other(Failure::CardUnsupported { card }))
            }
        }
    }
    /// Unassigns secondary IPs.
    fn unassign_ips(
        &self,
        eni_id: &str,
        ips: &[Ipv4Addr],
    ) -> impl Future<Output = Result<(), ProviderError>> + Send;
    /// Unassigns prefixes.
    fn unassign_prefixes(
        &self,
        eni_id: &str,
        prefixes: &[Ipv4Net],
    ) -> impl Future<Output = Result<(), ProviderError>> + Send;
    /// Detaches and deletes an ENI.
    fn free_eni(&self, eni_id: &str) -> impl Future<Output = Result<(), ProviderError>> + Send;
    /// The subnet that answered `InsufficientCidrBlocks` recently, while /32 addresses are
    /// asked instead of /28s (prefix delegation in a fragmented subnet); None otherwise.
    fn prefix_shortage(&self) -> Option<String> {
        None
    }
    /// The ENI's IPv6 /80 prefix (IPv6 and dual-stack modes): the first one EC2 lists on it,
    /// or, when it has none, one delegated now (`AssignIpv6Addresses`, `Ipv6PrefixCount=1`).
    /// Providers without IPv6 refuse.
    fn ipv6_prefix(
        &self,
        eni_id: &str,
    ) -> impl Future<Output = Result<Ipv6Net, ProviderError>> + Send {
        let failure = Failure::NoIpv6 {
            eni_id: eni_id.to_owned(),
        };
        async move { Err(ProviderError::Other(failure)) }
    }
}
