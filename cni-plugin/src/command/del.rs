//! DEL: read the host state and remove what provably belongs to this sandbox before ipamd releases
//! anything, then release the address in ipamd (best effort) and remove what only its answer proves
//! (`plan::plan_teardown`; docs/plugin.md, "What DEL may touch"), then have the network-policy
//! agent forget the pod when ipamd's mode says so. Idempotent: a retry, or a DEL of a sandbox whose
//! pod was re-created under the same name, leaves other sandboxes' veths, routes, rules and network
//! policy alone.

use ipamd_proto::del_reason::POD_DELETED;

use super::del_request;
use super::policy::{self, Skip};
use crate::apply::{Datapath, reply_addresses};
use crate::ipam::Ipamd;
use crate::plan::{
    BranchProof, IpamdRelease, TeardownPlan, host_veth_at, marker_vlan, plan_branch_teardown,
    plan_teardown, prev_extra_interfaces, teardown_veth_names, teardown_veth_names_with,
};
use crate::spec::error::chain;
use crate::spec::{CniEnv, ErrorCode, NetConf, SpecError};

/// Where DEL learns ipamd's `NetworkPolicyMode`.
enum PolicyMode {
    /// From the `DelNetwork` reply.
    Replied(String),
    /// `DelNetwork` answered "unknown pod" (a retried DEL, or an ADD that failed): asked with
    /// `GetNetworkPolicyConfigs`, so a DEL that failed at the agent still reaches it on retry.
    Ask(Ipamd),
    /// ipamd unreachable: unknown, so no agent call.
    Unknown,
}

pub(super) async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), SpecError> {
    // A branch-ENI pod is torn down by the VLAN id its prevResult recorded, without ipamd: the pod
    // annotation ipamd would read may have changed.
    if let Some(vlan) = conf
        .prev_result
        .as_ref()
        .and_then(marker_vlan)
        .filter(|v| *v != 0)
    {
        return del_branch(env, conf, vlan).await;
    }
    // The netns may already be gone (containerd calls DEL with an empty CNI_NETNS).
    let pod = env
        .netns
        .as_ref()
        .and_then(|p| dataplane::NetNs::open(p).ok());
    let pod_if = pod.as_ref().map(|ns| (ns, env.ifname.as_str()));
    let datapath = Datapath::open_current()
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "open host netlink", &e))?;
    // A multi-NIC pod's further interfaces: as many as prevResult lists or the pod netns
    // still holds (`mNicIf<i>`), and after ipamd answered, as many as it released.
    let in_netns = match &pod {
        Some(ns) => datapath
            .multi_nic_interfaces(ns)
            .await
            .unwrap_or_default()
            .into_iter()
            .max()
            .unwrap_or(0),
        None => 0,
    };
    let extra = in_netns.max(prev_extra_interfaces(conf));
    let names = teardown_veth_names_with(conf, env, extra);
    let other_cards = other_card_interfaces(conf, env, extra);

    // Phase 1, before ipamd releases anything: while ipamd still holds this sandbox's addresses
    // nobody else can be given them, so what is provably this sandbox's without ipamd's answer
    // (its veth, the addresses routed through it, their rules) goes now. Once released, an
    // address may be the next pod's at once (`IP_COOLDOWN_PERIOD=0`), and its rules are
    // matched by selector: removing them then could remove the new owner's.
    let view = datapath
        .observe_teardown(&names, pod_if, &other_cards)
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "read host network state", &e))?;
    let early = plan_teardown(conf, env, &IpamdRelease::NotAskedYet, &view);
    log_plan(&early, "before release", false);
    // Should ipamd answer that this is a branch-ENI pod (no prevResult marker), what proves
    // its VLAN objects this sandbox's is read now, while its veth still exists.
    let branch_proof = match &env.netns {
        Some(_) => {
            let (_, routes) = datapath.observe_branch().await.map_err(|e| {
                SpecError::new(ErrorCode::SetupFailed, "read host network state", &e)
            })?;
            BranchProof::of(&early.host_veths, &routes)
        }
        None => BranchProof::default(),
    };
    let mut errors = datapath.teardown(&early, pod_if).await;
    forget_conntrack(&early)?;

    let mut branch_vlan = None;
    // ipamd answered `Success=false`: the DEL fails once the provable teardown is done; ipamd still
    // holds the addresses, so the retry finds them.
    let mut refusal = None;
    // ipamd could not be reached (no connection, or no answer): the DEL answers success whatever
    // its prevResult teardown did (kubelet may never retry a DEL; ipamd reclaims the address once
    // it is back).
    let mut unreachable = false;
    let (release, mode) = match Ipamd::connect(&conf.ipamd_socket).await {
        Ok(ipamd) => match ipamd.del(del_request(env, conf, POD_DELETED)).await {
            Ok(reply) => {
                // No prevResult marker, but ipamd says branch ENI (from the pod annotation).
                branch_vlan = u16::try_from(reply.pod_vlan_id).ok().filter(|v| *v != 0);
                (
                    IpamdRelease::Released(reply_addresses(&reply.ip_allocation_metadata)),
                    PolicyMode::Replied(reply.network_policy_mode),
                )
            }
            Err(e) if e.is_unknown_pod() => (IpamdRelease::UnknownPod, PolicyMode::Ask(ipamd)),
            Err(e) if e.is_refusal() => {
                tracing::error!(error = %chain(&e), "ipamd refused DelNetwork (Success == false); tearing down what is provably this sandbox's, then failing the DEL");
                refusal = Some(e);
                (IpamdRelease::Unavailable, PolicyMode::Unknown)
            }
            Err(e) => {
                tracing::warn!(error = %chain(&e), "ipamd DelNetwork failed; tearing down what is provably this sandbox's");
                unreachable = e.is_unreachable();
                (IpamdRelease::Unavailable, PolicyMode::Unknown)
            }
        },
        Err(e) => {
            tracing::warn!(error = %chain(&e), "ipamd unreachable; tearing down what is provably this sandbox's");
            unreachable = true;
            (IpamdRelease::Unavailable, PolicyMode::Unknown)
        }
    };

    // Phase 2: what only ipamd's answer proves (an address it released for this sandbox whose
    // route had already gone with its veth), read again from the host; the addresses phase 1
    // handled are not touched twice.
    // (IPv4s only: a dual-stack pod's IPv6 is on its one interface.)
    let released = match &release {
        IpamdRelease::Released(a) => {
            u32::try_from(a.iter().filter(|a| a.is_ipv4()).count()).unwrap_or(0)
        }
        _ => 0,
    };
    let names = teardown_veth_names_with(conf, env, extra.max(released.saturating_sub(1)));
    let view = datapath
        .observe_teardown(&names, None, &[])
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "read host network state", &e))?;
    let mut late = plan_teardown(conf, env, &release, &view);
    late.addresses.retain(|a| !early.addresses.contains(a));
    late.kept.retain(|(a, _)| !early.addresses.contains(a));
    log_plan(&late, "after release", true);
    errors.extend(datapath.teardown(&late, None).await);
    if let (Some(vlan), Some(_)) = (branch_vlan, &env.netns) {
        // ipamd's address is the pod annotation's, not proof that this sandbox was wired
        // with it (H6): only what the proof read in phase 1 goes.
        errors.extend(teardown_branch_objects(&datapath, vlan, &branch_proof).await?);
    }
    if let Some(e) = refusal {
        if !errors.is_empty() {
            // logged; the refusal is what the runtime is told
            let _ = teardown_error(&errors, "teardown pod network");
        }
        return Err(SpecError::new(
            ErrorCode::IpamdRefused,
            "del cmd: failed to process delete request",
            &e,
        ));
    }
    if !errors.is_empty() {
        let e = teardown_error(&errors, "teardown pod network");
        if unreachable {
            tracing::error!(error = %e.details, "teardown incomplete while ipamd is unreachable; DEL answers success as upstream's (ipamd reclaims the address once it is back)");
        } else {
            return Err(e);
        }
    }
    let mode = mode.resolve().await;
    let another = !early.foreign_veths.is_empty() || !late.foreign_veths.is_empty();
    let skip = another.then_some(Skip::AnotherSandboxIsWired);
    policy::forget(conf, env, &mode, skip).await
}

impl PolicyMode {
    /// ipamd's `NetworkPolicyMode`; empty (no agent call) when it cannot be learnt.
    async fn resolve(self) -> String {
        match self {
            PolicyMode::Replied(mode) => mode,
            PolicyMode::Ask(ipamd) => match ipamd.network_policy_mode().await {
                Ok(mode) => mode,
                Err(e) => {
                    tracing::warn!(error = %chain(&e), "network policy mode unknown (ipamd did not answer); no network policy agent call");
                    String::new()
                }
            },
            PolicyMode::Unknown => {
                tracing::warn!(
                    "network policy mode unknown (ipamd unreachable); no network policy agent call"
                );
                String::new()
            }
        }
    }

    /// The mode as DEL without `DelNetwork` learns it: asked with `GetNetworkPolicyConfigs`.
    async fn ask(socket: &std::path::Path) -> Self {
        match Ipamd::connect(socket).await {
            Ok(ipamd) => PolicyMode::Ask(ipamd),
            Err(e) => {
                tracing::warn!(error = %chain(&e), "ipamd unreachable");
                PolicyMode::Unknown
            }
        }
    }
}

/// Forgets the host's conntrack entries (NAT bindings included) of the addresses phase 1 proved
/// this sandbox's, while ipamd still holds them: once released an address may be the next pod's at
/// once (`IP_COOLDOWN_PERIOD=0`), and an entry of this pod's flows would steer their packets to it.
/// The veth is gone by now, so the pod adds no entry of its own afterwards. A failure fails the DEL
/// before ipamd is asked: the addresses stay this sandbox's until a retried DEL (ipamd flushes
/// again before it hands an address out: docs/host-networking.md, "Conntrack-safe address reuse").
fn forget_conntrack(early: &TeardownPlan) -> Result<(), SpecError> {
    let ours: Vec<std::net::IpAddr> = early.addresses.iter().map(ipnet::IpNet::addr).collect();
    match dataplane::conntrack::forget_addresses(&ours) {
        Ok(f) if f.deleted > 0 => {
            tracing::info!(addresses = ?ours, deleted = f.deleted, "conntrack entries of the pod's addresses deleted");
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(e) => {
            tracing::error!(addresses = ?ours, error = %chain(&e), "conntrack entries of the pod's addresses not deleted; addresses kept (ipamd not asked)");
            Err(SpecError::new(
                ErrorCode::SetupFailed,
                "forget the conntrack state of the pod's addresses",
                &e,
            ))
        }
    }
}

/// The CNI error of an incomplete teardown.
fn teardown_error(errors: &[crate::apply::ApplyError], msg: &str) -> SpecError {
    let details = errors
        .iter()
        .map(|e| chain(e))
        .collect::<Vec<_>>()
        .join("; ");
    tracing::error!(%details, "teardown incomplete");
    SpecError {
        code: ErrorCode::SetupFailed,
        msg: msg.to_owned(),
        details,
    }
}

/// Logs a phase's plan; what it keeps only for the last phase (the first one leaves to the
/// second what only ipamd's answer can prove).
fn log_plan(plan: &TeardownPlan, phase: &str, log_kept: bool) {
    tracing::debug!(phase, ?plan, "teardown");
    for link in &plan.foreign_veths {
        tracing::info!(phase, veth = %link.name, "host veth belongs to another sandbox; kept");
    }
    for (address, reason) in plan.kept.iter().filter(|_| log_kept) {
        tracing::warn!(phase, %address, ?reason, "address not provably this sandbox's; its rules and route kept");
    }
}

/// DEL of a branch-ENI pod from its prevResult: ipamd holds nothing for it (the VPC Resource
/// Controller owns the branch ENI), so it is not asked to release. Without `CNI_NETNS` nothing is
/// touched: the VLAN id may already be another pod's. With it, what proves this sandbox's objects
/// is its host veth (paired with its interface, or the name and MAC prevResult recorded; a name
/// alone proves nothing: a pod re-created under its name has the same one): the VLAN link, its
/// table's rules and the addresses routed through that veth go first (`plan_branch_teardown`), the
/// veth last, so a retried DEL still has its proof. Then the network-policy agent forgets the pod,
/// as for any pod, unless another sandbox is wired under its name (mode asked from ipamd).
async fn del_branch(env: &CniEnv, conf: &NetConf, vlan: u16) -> Result<(), SpecError> {
    let pod = env
        .netns
        .as_ref()
        .and_then(|p| dataplane::NetNs::open(p).ok());
    let pod_if = pod.as_ref().map(|ns| (ns, env.ifname.as_str()));
    let datapath = Datapath::open_current()
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "open host netlink", &e))?;
    let names = teardown_veth_names(conf, env);
    let view = datapath
        .observe_teardown(&names, pod_if, &[])
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "read host network state", &e))?;
    let plan = plan_teardown(conf, env, &IpamdRelease::NotAskedYet, &view);
    log_plan(&plan, "branch eni", true);
    if env.netns.is_none() {
        tracing::info!(
            vlan,
            "branch eni pod without netns; teardown ignored (as upstream)"
        );
    } else {
        let proof = BranchProof::of(
            &plan.host_veths,
            &datapath
                .observe_branch()
                .await
                .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "read host network state", &e))?
                .1,
        );
        let errors = teardown_branch_objects(&datapath, vlan, &proof).await?;
        if !errors.is_empty() {
            // The veth stays: it is what proves the rest this sandbox's to the retry.
            return Err(teardown_error(&errors, "teardown branch eni pod network"));
        }
        let errors = datapath.teardown(&plan, pod_if).await;
        if !errors.is_empty() {
            return Err(teardown_error(&errors, "teardown branch eni pod network"));
        }
    }
    let mode = PolicyMode::ask(&conf.ipamd_socket).await.resolve().await;
    let skip = (!plan.foreign_veths.is_empty()).then_some(Skip::AnotherSandboxIsWired);
    policy::forget(conf, env, &mode, skip).await
}

/// The VLAN link, its table's rules and the proven addresses' rules and routes of VLAN `vlan`
/// (`plan::plan_branch_teardown`); returns the failures.
async fn teardown_branch_objects(
    datapath: &Datapath,
    vlan: u16,
    proof: &BranchProof,
) -> Result<Vec<crate::apply::ApplyError>, SpecError> {
    let (rules, routes) = datapath
        .observe_branch()
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "read host network state", &e))?;
    let plan = plan_branch_teardown(vlan, proof, &rules, &routes);
    tracing::debug!(?plan, ?proof, vlan, "branch teardown");
    if let Some(why) = &plan.kept {
        tracing::warn!(vlan, %why, "vlan link kept");
    }
    Ok(datapath.teardown_branch(&plan).await)
}

/// A multi-card pod's interfaces `1..=extra`: (host veth, interface in the pod) each.
fn other_card_interfaces(conf: &NetConf, env: &CniEnv, extra: u32) -> Vec<(String, String)> {
    (1..=extra)
        .map(|i| {
            (
                host_veth_at(conf, env, i),
                dataplane::conventions::pod_interface_name(&env.ifname, i),
            )
        })
        .collect()
}
