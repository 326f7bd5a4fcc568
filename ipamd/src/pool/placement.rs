//! Custom networking's placement of a new ENI: the node's ENIConfig (read from the Kubernetes
//! watch, `k8s::CustomNetwork`), its subnet checked to be in the instance's zone as EC2 reports it
//! through the port. A refusal is reported (the composition root's reporter: log line, metric,
//! event) and is [`ProviderError::Misconfigured`]: nothing is created, the next round asks again.
//! Decided here, before the create call; the EC2 adapter only executes the [`EniPlacement`]. Must
//! not: call EC2 but through the [`EniProvider`] port, create anything, know an adapter.

use crate::k8s::{CustomNetwork, PlacementRefusal};
use crate::pool::ec2_port::{EniPlacement, EniProvider, ProviderError, Unplaceable};

/// Where the next ENI goes under custom networking `custom`: the node's ENIConfig (step one,
/// on the current watch values), then (the instance's zone and the subnet's, through
/// `provider`: one DescribeSubnets per subnet, remembered) the zone check.
pub async fn custom_placement<P: EniProvider>(
    custom: &CustomNetwork,
    provider: &P,
) -> Result<EniPlacement, ProviderError> {
    let refuse = |r: PlacementRefusal| {
        (custom.report)(&r);
        ProviderError::Misconfigured(Unplaceable::EniConfig {
            kind: r.kind(),
            reason: r.to_string(),
        })
    };
    let (name, spec) = custom.choose().map_err(refuse)?;
    let node_az = provider.availability_zone().await?;
    let zone = provider.subnet_zone(&spec.subnet).await?;
    crate::k8s::placement(&name, &spec, zone.as_deref(), &node_az).map_err(refuse)
}
