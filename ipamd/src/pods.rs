//! The pod verbs in the domain: one entry point for AddNetwork and one for DelNetwork decide
//! the pod's kind (a branch-ENI pod of security groups for pods, a multi-card pod, a regular
//! pod), get or release its addresses (the index, or the branch ENI of its annotation), clear
//! the node's conntrack entries of an address before it is handed out, prune the released
//! addresses' rules, and keep the `vpc.amazonaws.com/pod-ips` annotation; they answer a
//! [`PodAnswer`] / [`Released`] or a typed [`PodError`]. Must not: know gRPC or proto types,
//! record failures (the rpc edge maps every answer and records every failure, in one place).

use crate::config::AddressFamily;
use crate::datastore::{IpamKey, PodMetadata};
use crate::flows::{Flows, Handout};
use crate::host::HostNetwork;
use crate::ipam::{Ipam, IpamError, PodAddresses};
use crate::k8s::Cluster;
use crate::sgp::{BranchAnswer, BranchError, BranchPods, BranchRelease};

/// Who a CNI call is for.
#[derive(Debug, Clone)]
pub struct PodRequest<'a> {
    /// The IPAM key (network, container id, interface).
    pub key: &'a IpamKey,
    /// `K8S_POD_NAMESPACE`.
    pub namespace: &'a str,
    /// `K8S_POD_NAME`.
    pub name: &'a str,
    /// `K8S_POD_UID` (may be empty).
    pub uid: &'a str,
    /// The pod is annotated `k8s.amazonaws.com/nicConfig: multi-nic-attachment`.
    pub multi_nic: bool,
}

/// What an AddNetwork got, by the pod's kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodAnswer {
    /// A regular pod: its IPv4, its IPv6, or both (dual-stack), from the index.
    Regular(PodAddresses),
    /// A multi-card pod: its card-0 IPv4 and one IPv4 of every other serving card.
    MultiCard(PodAddresses),
    /// A branch-ENI pod: the branch ENI of its annotation and the trunk's link.
    Branch(BranchAnswer),
}

impl PodAnswer {
    /// The address the pod annotation and the logs name: the IPv4 when there is one.
    #[must_use]
    pub fn pod_ip(&self) -> Option<String> {
        match self {
            Self::Regular(p) | Self::MultiCard(p) => {
                p.v4.as_ref()
                    .map(|a| a.ip.to_string())
                    .or_else(|| p.v6.as_ref().map(|a| a.ip.to_string()))
            }
            Self::Branch(b) if b.address.ipv4.is_empty() => Some(b.address.ipv6.clone()),
            Self::Branch(b) => Some(b.address.ipv4.clone()),
        }
    }
}

/// An AddNetwork answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Added {
    /// The pod's addresses.
    pub answer: PodAnswer,
    /// The pod annotation was written (or none is kept); false: the ADD answers
    /// `Success=false` and the addresses stay assigned until the runtime's DEL.
    pub annotated: bool,
}

/// What a DelNetwork released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// Addresses of the index (every family and card the pod held).
    Addresses(PodAddresses),
    /// A branch-ENI pod: its VLAN and address, for the plugin's teardown.
    Branch(BranchRelease),
}

/// Why a pod verb failed.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// The index or the pod flow refused.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// A branch pod's DEL could not be answered (its pod or annotation unreadable, another pod
    /// of that name now).
    #[error(transparent)]
    Branch(BranchError),
}

/// The pod verbs over the node's state (borrowed by the rpc edge for one call).
#[derive(Debug, Clone, Copy)]
pub struct Pods<'a> {
    /// The node's addresses.
    pub ipam: &'a Ipam,
    /// The pods' address family.
    pub family: AddressFamily,
    /// `ENABLE_MULTI_NIC`.
    pub multi_nic: bool,
    /// `ENABLE_POD_ENI`: branch pods answered from their annotation.
    pub branch: Option<&'a BranchPods>,
    /// The node namespace's host networking (pod rules); None in tests without host
    /// networking.
    pub host: Option<&'a HostNetwork>,
    /// The conntrack safety of handouts (its task owns the table walks); None in tests
    /// without host networking.
    pub flows: Option<&'a Flows>,
    /// `ANNOTATE_POD_IP`: the cluster to annotate pods through.
    pub annotations: Option<&'a Cluster>,
}

impl Pods<'_> {
    /// AddNetwork: a branch pod's ENI (with `ENABLE_POD_ENI`), else a multi-card pod's addresses
    /// (refused without `ENABLE_MULTI_NIC`), else a regular pod's; an address's old conntrack
    /// entries cleared before it is handed out; then the pod annotation.
    pub async fn add(&self, pod: &PodRequest<'_>) -> Result<Added, PodError> {
        let answer = self.answer(pod).await?;
        let annotated = match (self.annotations, answer.pod_ip()) {
            (Some(cluster), Some(ip)) => {
                match cluster.annotate_pod_ip(pod.namespace, pod.name, &ip).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::error!(key = %pod.key, error = %e, "Failed to add the pod annotation");
                        false
                    }
                }
            }
            _ => true,
        };
        Ok(Added { answer, annotated })
    }

    async fn answer(&self, pod: &PodRequest<'_>) -> Result<PodAnswer, PodError> {
        let key = pod.key;
        if let Some(branch) = self.branch
            && let Some(answer) = add_branch_pod(branch, pod).await?
        {
            return Ok(PodAnswer::Branch(answer));
        }
        if pod.multi_nic && !self.multi_nic {
            let e = multi_nic_refusal();
            tracing::error!(%key, pod = %pod.name, ns = %pod.namespace, error = %e, "AddNetwork refused: the pod asks for one interface per network card");
            return Err(e.into());
        }
        let meta = PodMetadata {
            namespace: pod.namespace.to_owned(),
            name: pod.name.to_owned(),
            interfaces_count: 1,
        };
        if pod.multi_nic {
            let addresses = match self.ipam.add_multi_nic_pod(self.family, key, meta).await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(%key, error = %e, "AddNetwork of a multi-NIC pod failed; no address taken");
                    return Err(e.into());
                }
            };
            self.forget_flows(&addresses).await?;
            tracing::info!(%key, ip = ?addresses.v4.as_ref().map(|a| a.ip), cards = ?addresses.cards.iter().map(|(c, a)| (c, a.ip)).collect::<Vec<_>>(), "AddNetwork assigned one address per network card");
            if addresses.v4.is_none() {
                return Err(IpamError::Internal("no address assigned".to_owned()).into());
            }
            return Ok(PodAnswer::MultiCard(addresses));
        }
        let began = std::time::Instant::now();
        let addresses = match self.ipam.add_pod(self.family, key, meta).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(%key, error = %e, "AddNetwork failed");
                return Err(e.into());
            }
        };
        let assigned = std::time::Instant::now();
        if let Err(e) = self.forget_flows(&addresses).await {
            tracing::error!(%key, error = %e, "AddNetwork refused");
            return Err(e.into());
        }
        // assign: the index (a wait for the pool included) and the checkpoint write; conntrack:
        // the handout's check (docs/performance.md's per-phase breakdown reads both).
        tracing::info!(%key, ip = ?addresses.v4.as_ref().map(|a| a.ip), ipv6 = ?addresses.v6.as_ref().map(|v| v.ip), eni = ?addresses.v4.as_ref().map(|a| &a.eni_id), assign_us = assigned.duration_since(began).as_micros(), conntrack_us = assigned.elapsed().as_micros(), "AddNetwork assigned");
        if addresses.v4.is_none() && addresses.v6.is_none() {
            return Err(IpamError::Internal("no address assigned".to_owned()).into());
        }
        Ok(PodAnswer::Regular(addresses))
    }

    /// DelNetwork: every address the sandbox holds, on every card and family (their rules
    /// pruned); a pod the index does not know may be a branch pod (`ENABLE_POD_ENI`); then the
    /// pod annotation is cleared (false: it could not be, the DEL answers `Success=false`).
    pub async fn del(
        &self,
        pod: &PodRequest<'_>,
        reason: &str,
    ) -> Result<(Released, bool), PodError> {
        let key = pod.key;
        let released =
            crate::ipam::blocking(|| self.ipam.del_pod(key, pod.namespace, pod.name, reason));
        let addresses = match released {
            Ok(a) => a,
            // a branch pod (security groups for pods) holds no address of the pool
            Err(IpamError::UnknownPod(unknown)) if self.branch.is_some() => {
                let branch = self.branch.expect("checked");
                return match branch.release(pod.namespace, pod.name, pod.uid).await {
                    Ok(Some(r)) => {
                        tracing::info!(key = %unknown, vlan = r.vlan_id, ip = %r.ipv4, ipv6 = %r.ipv6, "DelNetwork: branch pod released");
                        Ok((Released::Branch(r), true))
                    }
                    Ok(None) => Err(IpamError::UnknownPod(unknown).into()),
                    Err(e) => {
                        tracing::warn!(key = %unknown, error = %e, "Send DelNetworkReply: branch pod not released");
                        Err(PodError::Branch(e))
                    }
                };
            }
            Err(e) => return Err(e.into()),
        };
        self.prune_released_rules(&addresses).await;
        if let Some(flows) = self.flows {
            flows.released(addresses_of(&addresses));
        }
        tracing::info!(%key, ip = ?addresses.v4.as_ref().map(|a| a.ip), ipv6 = ?addresses.v6.as_ref().map(|v| v.ip), cards = ?addresses.cards.iter().map(|(c, a)| (c, a.ip)).collect::<Vec<_>>(), %reason, "DelNetwork released");
        let ip = addresses
            .v4
            .as_ref()
            .map(|a| a.ip.to_string())
            .or_else(|| addresses.v6.as_ref().map(|a| a.ip.to_string()))
            .or_else(|| addresses.cards.first().map(|(_, a)| a.ip.to_string()))
            .ok_or_else(|| IpamError::Internal("nothing released".to_owned()))?;
        let mut cleared = true;
        if let Some(cluster) = self.annotations
            && let Err(e) = cluster.clear_pod_ip(pod.namespace, pod.name, &ip).await
        {
            tracing::error!(%key, error = %e, "Failed to delete the pod annotation");
            cleared = false;
        }
        Ok((Released::Addresses(addresses), cleared))
    }

    /// After a release: the pod rules (512/1536) of the released IPv4 addresses that no pod
    /// holds (fenced meanwhile, so the next owner's rules, made after a handout with
    /// `IP_COOLDOWN_PERIOD=0`, are never touched); the plugin's DEL leaves them to ipamd when only
    /// ipamd's answer proved them its sandbox's (docs/plugin.md). Best effort: what fails here
    /// is pruned by `reclaim`.
    async fn prune_released_rules(&self, pod: &PodAddresses) {
        let Some(host) = self.host else {
            return;
        };
        let ips: Vec<std::net::Ipv4Addr> = pod
            .v4
            .iter()
            .map(|a| a.ip)
            .chain(pod.cards.iter().map(|(_, a)| a.ip))
            .collect();
        match crate::reclaim::prune_pod_rules_of(self.ipam, host, Some(&ips)).await {
            Ok(pruned) if !pruned.is_empty() => {
                tracing::info!(addresses = ?pruned, "rules of the released addresses removed");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(addresses = ?ips, error = %e, "rules of the released addresses not removed (reclaim prunes them)");
            }
        }
    }

    /// Makes sure no conntrack entry of the node (NAT bindings included) names any of `pod`'s
    /// addresses before the answer hands them out: entries a previous owner's flows left
    /// (created after its DEL's flush by traffic still steered to it, or never flushed: a DEL
    /// retried after its veth was gone) must not steer packets to the new pod. The flows task
    /// answers at once when its ledger proves the addresses clean, else after a walk that
    /// deletes such entries. A failure refuses the ADD (the plugin's undo releases the address).
    async fn forget_flows(&self, pod: &PodAddresses) -> Result<(), IpamError> {
        let Some(flows) = self.flows else {
            return Ok(());
        };
        let ips = addresses_of(pod);
        match flows.before_handout(ips.clone()).await {
            Ok(Handout::Walked(f)) if f.deleted > 0 => {
                tracing::info!(addresses = ?ips, deleted = f.deleted, "conntrack entries of a previous owner deleted before the address was handed out");
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) => Err(IpamError::Internal(format!(
                "conntrack state of {ips:?} not cleared before handing them out: {e}"
            ))),
        }
    }
}

/// Every address of `pod`: IPv4, IPv6, each card's.
fn addresses_of(pod: &PodAddresses) -> Vec<std::net::IpAddr> {
    pod.v4
        .iter()
        .map(|a| std::net::IpAddr::V4(a.ip))
        .chain(pod.v6.iter().map(|a| std::net::IpAddr::V6(a.ip)))
        .chain(pod.cards.iter().map(|(_, a)| std::net::IpAddr::V4(a.ip)))
        .collect()
}

/// AddNetwork of a pod with `ENABLE_POD_ENI`: `Ok(None)` for a pod that is no branch pod (the
/// index serves it); for a branch pod the branch ENI of its annotation and the trunk's link; a
/// failure as the typed error the edge answers `Success=false` with.
async fn add_branch_pod(
    branch: &BranchPods,
    pod: &PodRequest<'_>,
) -> Result<Option<BranchAnswer>, IpamError> {
    let key = pod.key;
    let answer = match branch.add(pod.namespace, pod.name, pod.uid).await {
        Ok(Some(a)) => a,
        Ok(None) => return Ok(None),
        Err(e) => {
            tracing::warn!(%key, error = %e, "Send AddNetworkReply: branch pod not answered");
            return Err(match e {
                BranchError::NoTrunk => IpamError::NotReady(
                    "no trunk ENI found, cannot add a pod ENI (the VPC Resource Controller attaches it)",
                ),
                BranchError::NoAnnotation(_) => IpamError::NotReady(
                    "the pod has no vpc.amazonaws.com/pod-eni annotation yet (the VPC Resource Controller writes it)",
                ),
                // EC2 attached the trunk, the host has not shown its link yet: kubelet's retry
                // succeeds once it has.
                BranchError::TrunkLink { .. } => IpamError::NotReady(
                    "the trunk ENI's link is not on the host yet (it appears shortly after EC2 attaches the trunk)",
                ),
                // Another pod of that name (re-created since): this sandbox is stale.
                BranchError::UidMismatch { .. } => IpamError::StaleSandbox(e.to_string()),
                other => IpamError::Internal(other.to_string()),
            });
        }
    };
    if pod.multi_nic {
        tracing::info!(%key, "SGP pod doesn't support multiple NIC attachments for pod, falling back to default one interface per pod");
    }
    let a = &answer.address;
    tracing::info!(%key, eni = %a.eni_id, vlan = a.vlan_id, ip = %a.ipv4, ipv6 = %a.ipv6, trunk_link = answer.parent_if_index, "AddNetwork: branch ENI");
    Ok(Some(answer))
}

/// Why a pod annotated `k8s.amazonaws.com/nicConfig: multi-nic-attachment` (the plugin's
/// `RequiresMultiNICAttachment`) is refused without `ENABLE_MULTI_NIC` (`Success=false`,
/// docs/compatibility.md). With it, the pod gets one address per serving network card
/// ([`Ipam::add_multi_nic_pod`]).
fn multi_nic_refusal() -> IpamError {
    IpamError::Unsupported(
        "enable multi-nic feature on CNI for creating multi-nic-attachment pods (ENABLE_MULTI_NIC=true; the pod is annotated k8s.amazonaws.com/nicConfig: multi-nic-attachment)".to_owned()
    )
}
