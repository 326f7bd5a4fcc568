//! ADD: ask ipamd for an address while the pod's veth pair is created, plan, wire, have the
//! network-policy agent enforce the pod's policy, report the phases' timings to ipamd; on a
//! refusal delete the pair, on a wiring or policy failure undo and give the address back
//! (`SetupNSFailed`).
//! Owns the ADD sequence and its failures' CNI errors, and is where ipamd's reply is decoded
//! (once, into an [`Allocation`]). Must not: plan (`plan`) or program the kernel itself
//! (`apply`).

use std::time::{Duration, Instant};

use ipamd_proto::del_reason::SETUP_NS_FAILED;
use ipamd_proto::rpc::AddNetworkReply;
use ipamd_proto::setup_timings;

use super::{add_request, del_request, ipam_error, policy};
use crate::allocation::{Allocation, AllocationError};
use crate::apply::Datapath;
use crate::ipam::{Ipamd, IpamdCallError};
use crate::plan::{PlanError, PodNetworkPlan, plan_add};
use crate::spec::error::chain;
use crate::spec::{CniEnv, ErrorCode, NetConf, SpecError};

pub(super) async fn run(env: &CniEnv, conf: &NetConf) -> Result<String, SpecError> {
    let mut phases = Phases::begin();
    let netns_path = env
        .netns
        .as_ref()
        .ok_or_else(|| SpecError::msg(ErrorCode::InvalidEnvironment, "CNI_NETNS is required"))?;
    let pod = dataplane::NetNs::open(netns_path)
        .map_err(|e| SpecError::new(ErrorCode::UnknownContainer, "open pod netns", &e))?;
    let datapath = Datapath::open_current()
        .await
        .map_err(|e| SpecError::new(ErrorCode::SetupFailed, "open host netlink", &e))?;
    phases.mark(Phase::Start);

    // The address and the veth pair at once: the pair does not depend on the address (every
    // kind of pod's first interface is `CNI_IFNAME` on the pod's veth, plan::first_link), so
    // the kernel creates it while ipamd assigns. A refusal deletes it again.
    let link = crate::plan::first_link(conf, env);
    let call = async {
        let at = Instant::now();
        let ipamd = Ipamd::connect(&conf.ipamd_socket).await?;
        let reply = ipamd.add(add_request(env, conf)).await?;
        Ok::<_, IpamdCallError>((ipamd, reply, at.elapsed()))
    };
    let prepare = async {
        let at = Instant::now();
        (datapath.prepare(&link, &pod).await, at.elapsed())
    };
    let (called, (prepared, link_took)) = tokio::join!(call, prepare);
    phases.mark(Phase::AddressAndLink);
    let (ipamd, reply, ipamd_took) = match called {
        Ok(called) => called,
        Err(e) => {
            if let Ok(prepared) = prepared {
                discard(&datapath, prepared).await;
            }
            return Err(add_error(env, conf, &e));
        }
    };
    tracing::info!(ips = ?reply.ip_allocation_metadata, "ipamd assigned");

    let plan = match plan(&reply, conf, env) {
        Ok(plan) => plan,
        Err(e) => {
            if let Ok(prepared) = prepared {
                discard(&datapath, prepared).await;
            }
            let release = release(&ipamd, env, conf).await;
            let mut err = plan_error(&e);
            if let Some(r) = release {
                err.details.push_str(&format!("; release: {r}"));
            }
            return Err(err);
        }
    };
    tracing::debug!(?plan, "planned");
    phases.mark(Phase::Plan);

    let wired = match prepared {
        Ok(prepared) => datapath.setup_prepared(prepared, &plan, &pod).await,
        Err(setup) => Err(setup),
    };
    let applied = match wired {
        Ok(applied) => applied,
        Err(setup) => return Err(setup_failed(setup, &ipamd, env, conf).await),
    };
    phases.mark(Phase::Wiring);
    let first = &plan.interface;
    tracing::info!(veth = %first.host_veth, address = %first.address, table = first.route_table, more = ?plan.other_cards.iter().map(|m| (&m.container_ifname, m.address, m.route_table)).collect::<Vec<_>>(), "pod wired");

    // Network policy before the result: the agent filters the pod before the runtime starts it.
    // Refused: the wiring is taken back and the address released, so an unenforced pod is never
    // left reachable (docs/plugin.md, "Network policy at pod start"). The interface count is the
    // reply's entries (a dual-stack reply in two entries counts 2).
    let interfaces = reply.ip_allocation_metadata.len();
    if let Err(e) = policy::enforce(conf, env, &reply.network_policy_mode, interfaces).await {
        let mut err = policy::enforce_error(&e);
        crate::failure::spool(
            conf,
            env,
            ipamd_proto::ErrorReason::PolicyAgentUnavailable,
            &e.to_string(),
        );
        let cleanup = datapath.unwire(&applied).await;
        for c in &cleanup {
            err.details.push_str(&format!("; cleanup: {}", chain(c)));
        }
        if cleanup.is_empty() {
            if let Some(r) = release(&ipamd, env, conf).await {
                err.details.push_str(&format!("; release: {r}"));
            }
        } else {
            // Something of the wiring is left: the address stays assigned (and routed) until
            // the runtime's DEL, which removes what is provably this sandbox's and releases it.
            tracing::error!(
                ?cleanup,
                "wiring not fully taken back; the address stays assigned until DEL"
            );
            err.details
                .push_str("; address kept until DEL (the wiring was not fully taken back)");
        }
        return Err(err);
    }
    phases.mark(Phase::Policy);
    phases.log(ipamd_took, link_took);
    crate::setup_timings::send(
        &conf.ipamd_socket,
        &setup_timings::Report {
            plugin_total: crate::started().elapsed(),
            ipamd_call: ipamd_took,
            host_wiring: link_took + phases.took(Phase::Wiring),
            policy_agent: (!reply.network_policy_mode.is_empty())
                .then(|| phases.took(Phase::Policy)),
        },
    );
    Ok(plan
        .result_with(&applied.macs(), &netns_path.display().to_string())
        .to_json(conf.cni_version))
}

/// Takes back a link created for a pod ipamd did not give an address (or gave one that cannot
/// be wired); what cannot be deleted is logged (DEL removes it later, by name).
async fn discard(datapath: &Datapath, prepared: crate::apply::PreparedLink) {
    for e in datapath.discard(prepared).await {
        tracing::error!(error = %chain(&e), "veth created ahead of the address not deleted");
    }
}

/// The CNI error of a failed wiring (undone as far as it could be), the address given back.
async fn setup_failed(
    setup: crate::apply::SetupError,
    ipamd: &Ipamd,
    env: &CniEnv,
    conf: &NetConf,
) -> SpecError {
    tracing::error!(error = %chain(&setup), cleanup = ?setup.cleanup, "setup failed, undone");
    let release = release(ipamd, env, conf).await;
    let mut details = chain(&setup);
    for c in &setup.cleanup {
        details.push_str(&format!("; cleanup: {}", chain(c)));
    }
    if let Some(r) = release {
        details.push_str(&format!("; release: {r}"));
    }
    SpecError {
        code: ErrorCode::SetupFailed,
        msg: format!("setup pod network: {}", setup.cause),
        details,
    }
}

/// The phases of one ADD, in order: from `run`'s start (configuration parsed, logging and the
/// runtime started, the pod's namespace and the host's netlink opened); ipamd's answer and, at
/// the same time, the pod's veth pair ([`Datapath::prepare`]); decoding and planning; the rest
/// of the kernel work in the pod's and the host's namespaces (addresses, routes, rules, ARP);
/// the network-policy agent's call. Logged once at debug level (`ADD phases`, microseconds, with
/// the two overlapped parts apart) for integration/bench/plugin-bench.sh's breakdown, and sent
/// to ipamd for `awscni_pod_network_setup_seconds` ([`crate::setup_timings`]).
#[derive(Debug, Clone, Copy)]
enum Phase {
    Start,
    AddressAndLink,
    Plan,
    Wiring,
    Policy,
}

struct Phases {
    at: Instant,
    took: [Duration; 5],
}

impl Phases {
    fn begin() -> Self {
        Self {
            at: crate::started(),
            took: [Duration::ZERO; 5],
        }
    }

    fn mark(&mut self, phase: Phase) {
        let now = Instant::now();
        self.took[phase as usize] = now.duration_since(self.at);
        self.at = now;
    }

    fn took(&self, phase: Phase) -> Duration {
        self.took[phase as usize]
    }

    fn log(&self, ipamd: Duration, link: Duration) {
        let [start, both, plan, wiring, policy] = self.took.map(|d| d.as_micros());
        tracing::debug!(
            start_us = start,
            address_and_link_us = both,
            ipamd_us = ipamd.as_micros(),
            link_us = link.as_micros(),
            plan_us = plan,
            wiring_us = wiring,
            policy_us = policy,
            total_us = crate::started().elapsed().as_micros(),
            "ADD phases"
        );
    }
}

/// The one place ipamd's reply is decoded: into an [`Allocation`], which is then planned.
fn plan(
    reply: &AddNetworkReply,
    conf: &NetConf,
    env: &CniEnv,
) -> Result<PodNetworkPlan, PlanError> {
    let allocation = Allocation::decode(reply).map_err(|e| PlanError::of_reply(e, conf.mtu))?;
    plan_add(&allocation, conf, env)
}

/// The CNI error of a reply that cannot be wired (without the release's outcome): 101 when
/// ipamd did not assign, 103 for the rest; the message is the error's text.
fn plan_error(e: &PlanError) -> SpecError {
    let code = match e {
        PlanError::Allocation(AllocationError::NotAssigned) => ErrorCode::IpamdRefused,
        _ => ErrorCode::UnsupportedAllocation,
    };
    SpecError::new(code, e.to_string(), e)
}

/// The CNI error of a failed connection to ipamd or AddNetwork: the reason code and what to
/// do in the message ([`crate::failure::add_message`]); a failure ipamd did not see (it is
/// unreachable) goes to its spool.
fn add_error(env: &CniEnv, conf: &NetConf, e: &crate::ipam::IpamdCallError) -> SpecError {
    let (msg, unseen) = crate::failure::add_message(conf, e);
    if let Some((reason, what)) = unseen {
        crate::failure::spool(conf, env, reason, &what);
    }
    let mut err = ipam_error(&msg, e);
    if matches!(e, crate::ipam::IpamdCallError::Refused { .. }) {
        // the message already says everything the refusal carried
        err.details.clear();
    }
    err
}

/// Gives the address back; returns the failure text, if any.
async fn release(ipamd: &Ipamd, env: &CniEnv, conf: &NetConf) -> Option<String> {
    match ipamd.del(del_request(env, conf, SETUP_NS_FAILED)).await {
        Ok(_) => None,
        Err(e) if e.is_unknown_pod() => None,
        Err(e) => {
            tracing::error!(error = %chain(&e), "release after failed setup");
            Some(chain(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use ipamd_proto::rpc::IpAllocationMetadata;

    use super::*;

    fn entry(v4: &str, v6: &str) -> IpAllocationMetadata {
        IpAllocationMetadata {
            i_pv4_addr: v4.into(),
            i_pv6_addr: v6.into(),
            device_number: 0,
            route_table_id: 0,
        }
    }

    /// The CNI error ADD answers for a reply that does not decode, as `run` makes it (the
    /// release's outcome aside), for pod `default/nginx` under MTU `mtu`.
    fn answer(reply: &AddNetworkReply, mtu: u32) -> String {
        let conf = NetConf::parse(
            format!(r#"{{"cniVersion":"1.0.0","name":"aws-cni","mtu":"{mtu}"}}"#).as_bytes(),
        )
        .unwrap();
        let vars: HashMap<String, String> = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/var/run/netns/p"),
            ("CNI_ARGS", "K8S_POD_NAME=nginx;K8S_POD_NAMESPACE=default"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let env = CniEnv::from_vars(&vars).unwrap();
        let e = plan(reply, &conf, &env).map(|_| ()).expect_err("malformed");
        plan_error(&e).to_json(conf.cni_version.as_str())
    }

    /// A malformed reply is the same CNI error as before the reply was decoded into an
    /// `Allocation` (the JSON the plugin has always written: 101 when ipamd did not assign,
    /// 103 otherwise, the message repeated as details).
    #[test]
    fn a_malformed_reply_is_the_same_cni_error() {
        let reply = |entries: Vec<IpAllocationMetadata>| AddNetworkReply {
            success: true,
            ip_allocation_metadata: entries,
            ..Default::default()
        };
        let mut refused = reply(vec![entry("198.18.0.1", "")]);
        refused.success = false;
        assert_eq!(
            answer(&refused, 9001),
            r#"{"cniVersion":"1.0.0","code":101,"msg":"ipamd did not assign an address","details":"ipamd did not assign an address"}"#
        );
        assert_eq!(
            answer(&reply(vec![]), 9001),
            r#"{"cniVersion":"1.0.0","code":103,"msg":"ipamd reply carries no address","details":"ipamd reply carries no address"}"#
        );
        assert_eq!(
            answer(&reply(vec![entry("300.1.1.1", "")]), 9001),
            r#"{"cniVersion":"1.0.0","code":103,"msg":"ipamd reply has invalid address \"300.1.1.1\"","details":"ipamd reply has invalid address \"300.1.1.1\""}"#
        );
        let multi_v6 = reply(vec![
            entry("198.18.0.10", "2001:db8::1"),
            entry("198.19.0.11", ""),
        ]);
        assert_eq!(
            answer(&multi_v6, 9001),
            r#"{"cniVersion":"1.0.0","code":103,"msg":"multi-NIC pods (one interface per network card) are wired for IPv4 only; ipamd answered 1 IPv6 address(es) beside several interfaces","details":"multi-NIC pods (one interface per network card) are wired for IPv4 only; ipamd answered 1 IPv6 address(es) beside several interfaces"}"#
        );
        assert_eq!(
            answer(&multi_v6, 1200),
            r#"{"cniVersion":"1.0.0","code":103,"msg":"mtu 1200 is below the IPv6 minimum 1280","details":"mtu 1200 is below the IPv6 minimum 1280"}"#
        );
        let branch = AddNetworkReply {
            pod_vlan_id: 5,
            pod_enimac: "nope".into(),
            pod_eni_subnet_gw: "198.18.8.1".into(),
            parent_if_index: 3,
            ..reply(vec![entry("198.18.8.10", "")])
        };
        assert_eq!(
            answer(&branch, 9001),
            r#"{"cniVersion":"1.0.0","code":103,"msg":"branch eni reply (vlan 5): branch mac \"nope\"","details":"branch eni reply (vlan 5): branch mac \"nope\""}"#
        );
    }
}
