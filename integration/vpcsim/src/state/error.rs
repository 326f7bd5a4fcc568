//! Typed failures of state operations, one variant per EC2 error the simulator reproduces.
//! The EC2 layer translates them to codes/HTTP statuses once; nothing here knows HTTP.

/// Why a state operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Unknown ENI id.
    #[error("the networkInterface ID '{0}' does not exist")]
    EniNotFound(String),
    /// ENI id not of the form `eni-...`.
    #[error("invalid id: \"{0}\"")]
    EniIdMalformed(String),
    /// Unknown instance id.
    #[error("the instance ID '{0}' does not exist")]
    InstanceNotFound(String),
    /// Unknown VPC id.
    #[error("the vpc ID '{0}' does not exist")]
    VpcNotFound(String),
    /// Unknown subnet id.
    #[error("the subnet ID '{0}' does not exist")]
    SubnetNotFound(String),
    /// Unknown security group id.
    #[error("the security group '{0}' does not exist")]
    GroupNotFound(String),
    /// A security group of another VPC than the subnet's.
    #[error("security group {group} and subnet {subnet} belong to different networks")]
    GroupOtherVpc {
        /// Group id.
        group: String,
        /// Subnet id.
        subnet: String,
    },
    /// Attaching an ENI to an instance in another availability zone.
    #[error(
        "you may not attach a network interface to an instance if they are not in the same availability zone ({eni_az} vs {instance_az})"
    )]
    AvailabilityZoneMismatch {
        /// The ENI's zone.
        eni_az: String,
        /// The instance's zone.
        instance_az: String,
    },
    /// Unknown attachment id.
    #[error("the attachment ID '{0}' does not exist")]
    AttachmentNotFound(String),
    /// Unknown instance type.
    #[error("the instance type '{0}' does not exist")]
    InstanceTypeNotFound(String),
    /// ENI attached (delete) or already attached (attach).
    #[error("the network interface '{0}' is currently in use")]
    EniInUse(String),
    /// Instance already has its maximum number of ENIs.
    #[error("interface count {count} exceeds the limit for {instance_type}")]
    AttachmentLimitExceeded {
        /// Count after the attach.
        count: u32,
        /// Instance type.
        instance_type: String,
    },
    /// Too many IPv4 (or IPv6) addresses/prefixes on one ENI.
    #[error("number of private addresses will exceed limit")]
    PrivateIpAddressLimitExceeded,
    /// Not enough free /32s in the subnet.
    #[error("insufficient free addresses in subnet '{0}' to satisfy the request")]
    InsufficientFreeAddresses(String),
    /// No free aligned /28 (or /80) block in the subnet.
    #[error("there are not enough free cidr blocks in the specified subnet to satisfy the request")]
    InsufficientCidrBlocks,
    /// A specific address is owned by another ENI.
    #[error("address {0} is in use")]
    AddressInUse(String),
    /// Instance not running.
    #[error("the instance '{0}' is not in a state from which it can be modified")]
    IncorrectInstanceState(String),
    /// An operation EC2 forbids (detaching the primary ENI).
    #[error("{0}")]
    OperationNotPermitted(String),
    /// A parameter value is out of range or wrong.
    #[error("{0}")]
    InvalidParameterValue(String),
    /// Parameters that must not be combined.
    #[error("{0}")]
    InvalidParameterCombination(String),
    /// A required parameter is absent.
    #[error("the request must contain the parameter {0}")]
    MissingParameter(String),
    /// `CreateSubnet` with a CIDR outside the VPC's blocks or not /16–/28.
    #[error("the CIDR '{0}' is invalid")]
    SubnetRange(String),
    /// `CreateSecurityGroup` with a name the VPC already has.
    #[error("the security group '{0}' already exists")]
    GroupDuplicate(String),
    /// `Authorize*` of a rule the group already has.
    #[error("the specified rule \"{0}\" already exists")]
    PermissionDuplicate(String),
    /// `Revoke*` of a rule the group does not have.
    #[error("the specified rule \"{0}\" does not exist in this security group")]
    PermissionNotFound(String),
    /// Unknown trunk association id.
    #[error("the association ID '{0}' does not exist")]
    AssociationNotFound(String),
    /// `CreateSubnet` with a CIDR overlapping a subnet.
    #[error("the CIDR '{0}' conflicts with another subnet")]
    SubnetConflict(String),
}
