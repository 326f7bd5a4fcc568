//! DEL: read the host state and remove what provably belongs to this sandbox before ipamd
//! releases anything, then release the address in ipamd (best effort) and remove what only its
//! answer proves (`plan::plan_teardown`; docs/plugin.md, "What DEL may touch"), then have the
//! network-policy agent forget the pod when ipamd's mode says so. Idempotent: a retry, or a DEL of a sandbox whose pod was re-created under the same
//! name, leaves other sandboxes' veths, routes, rules and network policy alone.

use ipamd_proto::del_reason::POD_DELETED;

use super::del_request;
use super::policy::{self, Skip};
use crate::apply::{Datapath, reply_addresses};
use crate::ipam::Ipamd;
use crate::plan::{
    IpamdRelease, TeardownPlan, host_veth_at, plan_teardown, prev_extra_interfaces,
    teardown_veth_names_with,
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
    /// ipamd unreachable: unknown, so no agent call (upstream's plugin makes none either).
    Unknown,
}

pub(super) async fn run(env: &CniEnv, conf: &NetConf) -> Result<(), SpecError> {
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
    let more = more_interfaces(conf, env, extra);

    // Phase 1, before ipamd releases anything: while ipamd still holds this sandbox's addresses
    // nobody else can be given them, so what is provably this sandbox's without ipamd's answer
    // (its veth, the addresses routed through it, their rules) goes now. Once released, an
    // address may be the next pod's at once (`IP_COOLDOWN_PERIOD=0`), and its rules are
    // matched by selector: removing them then could remove the new owner's.
    let view = datapath
        .observe_teardown(&names, pod_if, &more)
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "read host network state", &e))?;
    let early = plan_teardown(conf, env, &IpamdRelease::NotAskedYet, &view);
    log_plan(&early, "before release", false);
    let mut errors = datapath.teardown(&early, pod_if).await;

    let (release, mode) = match Ipamd::connect(&conf.ipamd_socket).await {
        Ok(ipamd) => match ipamd.del(del_request(env, conf, POD_DELETED)).await {
            Ok(reply) => (
                IpamdRelease::Released(reply_addresses(&reply.ip_allocation_metadata)),
                PolicyMode::Replied(reply.network_policy_mode),
            ),
            Err(e) if e.is_unknown_pod() => (IpamdRelease::UnknownPod, PolicyMode::Ask(ipamd)),
            Err(e) => {
                tracing::warn!(error = %chain(&e), "ipamd DelNetwork failed; tearing down what is provably this sandbox's");
                (IpamdRelease::Unavailable, PolicyMode::Unknown)
            }
        },
        Err(e) => {
            tracing::warn!(error = %chain(&e), "ipamd unreachable; tearing down what is provably this sandbox's");
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
    if !errors.is_empty() {
        let details = errors
            .iter()
            .map(|e| chain(e))
            .collect::<Vec<_>>()
            .join("; ");
        tracing::error!(%details, "teardown incomplete");
        return Err(SpecError {
            code: ErrorCode::SetupFailed,
            msg: "teardown pod network".to_owned(),
            details,
        });
    }
    let mode = match mode {
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
    };
    let another = !early.foreign_veths.is_empty() || !late.foreign_veths.is_empty();
    let skip = another.then_some(Skip::AnotherSandboxIsWired);
    policy::forget(conf, env, &mode, skip).await
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

/// A multi-NIC pod's interfaces `1..=extra`: (host veth, interface in the pod) each.
fn more_interfaces(conf: &NetConf, env: &CniEnv, extra: u32) -> Vec<(String, String)> {
    (1..=extra)
        .map(|i| {
            (
                host_veth_at(conf, env, i),
                dataplane::conventions::pod_interface_name(&env.ifname, i),
            )
        })
        .collect()
}
