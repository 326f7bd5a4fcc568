//! EC2 API errors on the wire: the one place that maps typed failures to EC2's error codes and
//! HTTP statuses and renders `<Response><Errors><Error>...`. Must not decide *whether* to fail.

use super::xml::Xml;
use crate::state::StateError;
use axum::http::StatusCode;

/// Everything the EC2 endpoint can answer instead of a result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The state refused the operation.
    #[error(transparent)]
    State(#[from] StateError),
    /// `DryRun=true` on a request that would have succeeded.
    #[error("request would have succeeded, but dryrun flag is set")]
    DryRun,
    /// Throttled by the token bucket.
    #[error("request limit exceeded")]
    Throttled,
    /// Injected server fault.
    #[error("an internal error has occurred")]
    Internal,
    /// The action is denied by the caller's IAM policy (knob `denied_actions`).
    #[error(
        "You are not authorized to perform this operation. User is not authorized to perform: ec2:{0}"
    )]
    Unauthorized(String),
    /// An action the simulator does not implement.
    #[error("the action {0} is not valid for this web service")]
    InvalidAction(String),
}

impl ApiError {
    /// EC2's error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::DryRun => "DryRunOperation",
            Self::Throttled => "RequestLimitExceeded",
            Self::Internal => "InternalError",
            Self::InvalidAction(_) => "InvalidAction",
            Self::Unauthorized(_) => "UnauthorizedOperation",
            Self::State(e) => match e {
                StateError::EniNotFound(_) => "InvalidNetworkInterfaceID.NotFound",
                StateError::EniIdMalformed(_) => "InvalidNetworkInterfaceID.Malformed",
                StateError::InstanceNotFound(_) => "InvalidInstanceID.NotFound",
                StateError::SubnetNotFound(_) => "InvalidSubnetID.NotFound",
                StateError::VpcNotFound(_) => "InvalidVpcID.NotFound",
                StateError::GroupNotFound(_) => "InvalidGroup.NotFound",
                StateError::GroupOtherVpc { .. } => "InvalidParameter",
                StateError::AvailabilityZoneMismatch { .. } => "InvalidParameterCombination",
                StateError::AttachmentNotFound(_) => "InvalidAttachmentID.NotFound",
                StateError::InstanceTypeNotFound(_) => "InvalidInstanceType",
                StateError::EniInUse(_) => "InvalidNetworkInterface.InUse",
                StateError::AttachmentLimitExceeded { .. } => "AttachmentLimitExceeded",
                StateError::PrivateIpAddressLimitExceeded => "PrivateIpAddressLimitExceeded",
                StateError::InsufficientFreeAddresses(_) => "InsufficientFreeAddressesInSubnet",
                StateError::InsufficientCidrBlocks => "InsufficientCidrBlocks",
                StateError::AddressInUse(_) => "InvalidIPAddress.InUse",
                StateError::IncorrectInstanceState(_) => "IncorrectInstanceState",
                StateError::OperationNotPermitted(_) => "OperationNotPermitted",
                StateError::InvalidParameterValue(_) => "InvalidParameterValue",
                StateError::InvalidParameterCombination(_) => "InvalidParameterCombination",
                StateError::MissingParameter(_) => "MissingParameter",
                StateError::SubnetRange(_) => "InvalidSubnet.Range",
                StateError::SubnetConflict(_) => "InvalidSubnet.Conflict",
                StateError::GroupDuplicate(_) => "InvalidGroup.Duplicate",
                StateError::PermissionDuplicate(_) => "InvalidPermission.Duplicate",
                StateError::PermissionNotFound(_) => "InvalidPermission.NotFound",
                StateError::AssociationNotFound(_) => "InvalidAssociationID.NotFound",
            },
        }
    }

    /// EC2's HTTP status for the error.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::DryRun => StatusCode::PRECONDITION_FAILED,
            Self::Throttled => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Unauthorized(_) => StatusCode::FORBIDDEN,
            Self::InvalidAction(_) | Self::State(_) => StatusCode::BAD_REQUEST,
        }
    }

    /// The XML body.
    pub fn body(&self, request_id: &str) -> Vec<u8> {
        let mut x = Xml::bare();
        x.open("Response");
        x.nest("Errors", |x| {
            x.nest("Error", |x| {
                x.text("Code", self.code());
                x.text("Message", self.to_string());
            });
        });
        x.text("RequestID", request_id);
        x.close("Response");
        x.into_bytes()
    }
}
