//! Typed errors of the AWS ports. EC2 error codes are translated here, once, at the boundary;
//! callers branch on the variant, never on text.

/// A failed EC2 call, classified by what the pool manager must do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ec2Error {
    /// The ENI, attachment or address does not exist (any `*.NotFound`).
    #[error("not found: {0}")]
    NotFound(String),
    /// `InsufficientCidrBlocks`: no aligned free /28 in the subnet (fragmented).
    #[error("subnet has no free /28 block")]
    InsufficientCidrBlocks,
    /// `InsufficientFreeAddressesInSubnet`: the subnet is full.
    #[error("subnet has no free addresses")]
    SubnetFull,
    /// `PrivateIpAddressLimitExceeded`: the ENI holds its maximum of addresses.
    #[error("eni address limit reached")]
    AddressLimit,
    /// `AttachmentLimitExceeded` (or no free device index): the instance ENI limit.
    #[error("instance eni limit reached")]
    AttachmentLimit,
    /// `UnauthorizedOperation` / `AccessDenied`: IAM is missing a permission.
    #[error("not authorized: {0}")]
    Unauthorized(String),
    /// `RequestLimitExceeded`: the last answer of the call. It says nothing about the
    /// requests before it: a client that retried transparently (the SDK retries timeouts,
    /// resets and 5xx) may have had an earlier request applied and its answer lost.
    #[error("throttled by ec2")]
    Throttled,
    /// EC2 refused every request of the call before acting on any (the error inside is the
    /// last answer: `Throttled` or `Unauthorized`). Only a call sent as ONE request per try,
    /// re-sent only after a refusal, can know it ([`crate::aws::ec2::Ec2::unassign`]); a
    /// bare `Throttled` or `Unauthorized` makes no such claim.
    #[error("{0} (ec2 refused every request before acting)")]
    NotApplied(Box<Ec2Error>),
    /// Connection, timeout or other transport failure.
    #[error("transport: {0}")]
    Transport(String),
    /// Any other service error.
    #[error("{code}: {message}")]
    Api { code: String, message: String },
    /// The response lacked a field the call cannot do without.
    #[error("malformed response: {0}")]
    Malformed(&'static str),
}

impl Ec2Error {
    /// Classify an EC2 error code (`Code` of the Query API error document).
    pub fn from_code(code: &str, message: &str) -> Self {
        match code {
            "InsufficientCidrBlocks" => Self::InsufficientCidrBlocks,
            "InsufficientFreeAddressesInSubnet" | "InsufficientAddressCapacity" => Self::SubnetFull,
            "PrivateIpAddressLimitExceeded" => Self::AddressLimit,
            "AttachmentLimitExceeded" => Self::AttachmentLimit,
            "UnauthorizedOperation" | "AccessDenied" | "AuthFailure" => {
                Self::Unauthorized(code.to_owned())
            }
            "RequestLimitExceeded" | "Throttling" | "ThrottlingException" => Self::Throttled,
            c if c.ends_with(".NotFound") => Self::NotFound(message.to_owned()),
            _ => Self::Api {
                code: code.to_owned(),
                message: message.to_owned(),
            },
        }
    }

    /// The label value used by `awscni_aws_api_error_count{error}`.
    pub fn metric_code(&self) -> &str {
        match self {
            Self::NotFound(_) => "NotFound",
            Self::InsufficientCidrBlocks => "InsufficientCidrBlocks",
            Self::SubnetFull => "InsufficientFreeAddressesInSubnet",
            Self::AddressLimit => "PrivateIpAddressLimitExceeded",
            Self::AttachmentLimit => "AttachmentLimitExceeded",
            Self::Unauthorized(_) => "UnauthorizedOperation",
            Self::Throttled => "RequestLimitExceeded",
            Self::NotApplied(last) => last.metric_code(),
            Self::Transport(_) => "Transport",
            Self::Api { code, .. } => code,
            Self::Malformed(_) => "Malformed",
        }
    }

    /// Errors that mean "the subnet cannot give us more", which start the 120 s back-off.
    pub fn is_insufficient_addresses(&self) -> bool {
        matches!(self, Self::InsufficientCidrBlocks | Self::SubnetFull)
    }
}

/// A failed IMDS read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImdsError {
    /// The path answered 404 (e.g. an ENI without prefixes has no `ipv4-prefix`).
    #[error("imds path not found: {0}")]
    NotFound(String),
    /// Token, transport or server failure.
    #[error("imds unavailable: {0}")]
    Unavailable(String),
    /// A value did not parse.
    #[error("imds {path}: malformed value {value:?}")]
    Malformed { path: String, value: String },
}
