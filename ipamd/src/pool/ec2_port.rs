//! The EC2-shaped port the pool manager acts through ([`EniProvider`]): list attached ENIs,
//! assign/unassign /32s and /28 prefixes, create+attach and free ENIs. Domain-shaped, async,
//! returning what EC2 returns. Must not: know about the datastore, pods or the policy.
//!
//! Implementations: the EC2/IMDS one (`aws::provider::Ec2Provider`), and for tests and demos
//! `aws::memory::MemoryProvider` (that provider over `aws::fake::FakeCloud`).

use std::future::Future;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// An ENI attached to this instance, as EC2/IMDS describe it.
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
    /// In a subnet tagged `kubernetes.io/role/cni=0` (subnet discovery, upstream
    /// `excludedENIBasedOnSubnetTags`): also `is_excluded`, but unlike a `no_manage` ENI its
    /// addresses are listed (its pods keep them) and its host networking is set up.
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

impl From<&crate::datastore::EniSpec> for AttachedEni {
    /// The datastore's description of an ENI (the node's one description), without its
    /// addresses: what the ENI's host set-up and teardown need.
    fn from(s: &crate::datastore::EniSpec) -> Self {
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

/// What the instance may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceLimits {
    /// ENIs per network card (upstream `ENILimit`, the same on every card).
    pub max_enis: u32,
    /// IPv4 addresses per ENI, including its primary.
    pub ipv4_per_eni: u32,
    /// Network cards of the instance type (1 for most).
    pub network_cards: u32,
    /// EC2 delegates /28 prefixes to its ENIs (Nitro and bare metal; upstream
    /// `IsPrefixDelegationSupported`).
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

/// Typed provider failures. The pool manager branches on these, never on text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// ENI or per-ENI address limit of the instance reached.
    #[error("instance limit reached: {0}")]
    InstanceLimit(String),
    /// The subnet has no free address.
    #[error("subnet {0} exhausted")]
    SubnetExhausted(String),
    /// The subnet has no free aligned /28 (EC2 `InsufficientCidrBlocks`: fragmented).
    #[error("subnet {0}: no free /28 block")]
    NoFreePrefix(String),
    /// Request rate exceeded; retry later.
    #[error("throttled")]
    Throttled,
    /// The ENI/address does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// Refused because the thing is in use (e.g. primary ENI, primary IP).
    #[error("{0} is in use")]
    InUse(String),
    /// Missing IAM permission: the action refused (`ec2:<API>`).
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The node's configuration forbids the call (custom networking without a usable
    /// ENIConfig): retried on later rounds, never a crash.
    #[error("not placeable: {0}")]
    Misconfigured(String),
    /// Anything else (transport, unexpected answer).
    #[error("{0}")]
    Other(String),
    /// EC2 refused every request of the call before acting on any (the error inside is the
    /// last answer, `Throttled` or `Unauthorized`): the call certainly had no effect. Only a
    /// call sent as one request per try can say so (the unassign: `aws::ec2::Ec2::unassign`).
    #[error("{0} (every request refused before ec2 acted)")]
    NotApplied(Box<ProviderError>),
}

impl ProviderError {
    /// The call certainly had no effect: EC2 refused every request of it before acting
    /// ([`Self::NotApplied`]). A bare `Throttled` or `Unauthorized` is the LAST answer only:
    /// an earlier request (a transparent retry's first attempt, whose answer was lost) may
    /// have been applied (issue 38).
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
    /// Creates an ENI with addresses and attaches it at the next free device index.
    fn create_eni(
        &self,
        req: NewEni,
    ) -> impl Future<Output = Result<AttachedEni, ProviderError>> + Send;
    /// Creates an ENI with addresses and attaches it on network card `card`, at that card's
    /// first free device index (upstream `AllocENI(..., networkCard)` → `attachENI` with
    /// `NetworkCardIndex`, `awsGetFreeDeviceNumber` counting per card). Providers without
    /// network cards refuse every card but 0.
    fn create_eni_on_card(
        &self,
        req: NewEni,
        card: u32,
    ) -> impl Future<Output = Result<AttachedEni, ProviderError>> + Send {
        async move {
            if card == 0 {
                self.create_eni(req).await
            } else {
                Err(ProviderError::Other(format!(
                    "network card {card}: this provider attaches ENIs on network card 0 only"
                )))
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
        let msg = format!("{eni_id}: this provider has no IPv6");
        async move { Err(ProviderError::Other(msg)) }
    }
}
