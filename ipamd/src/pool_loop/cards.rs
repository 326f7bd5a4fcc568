//! The pools of the network cards other than 0 (`ENABLE_MULTI_NIC`): every pass, each serving
//! card's pool is decided by the same pure policy as card 0's, with upstream's targets for a
//! card other than 0 (`datastoreTargetState`: `WARM_IP_TARGET=1`, `MINIMUM_IP_TARGET=1`,
//! whatever the node's settings; [`card_targets`]), and executed against the EC2 port (new
//! ENIs attached with the card's `NetworkCardIndex`), the host port (the ENI's route table
//! `10000 + 100 × card + device`) and the card's index in [`Ipam`]. Must not: decide, touch the
//! datastore directly, hold a lock across `.await`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::host::EniHost;
use crate::ipam::Ipam;
use crate::pool::policy::{self, Decision, Moment, Targets};
use crate::pool::provider::{EniProvider, NewEni};

/// Upstream `DefaultWarmIPTarget` and `DefaultMinimumIPTarget`: what a card other than 0
/// keeps (`datastoreTargetState`, `tryFreeENI`).
pub const CARD_WARM_IP_TARGET: u32 = 1;
/// See [`CARD_WARM_IP_TARGET`].
pub const CARD_MINIMUM_IP_TARGET: u32 = 1;

/// The targets of a card other than 0: the node's limits and mode, with upstream's fixed IP
/// targets for such a card (its WARM_ENI/WARM_PREFIX targets do not apply).
#[must_use]
pub fn card_targets(node: &Targets) -> Targets {
    Targets {
        warm_eni: 0,
        warm_ip: CARD_WARM_IP_TARGET,
        minimum_ip: CARD_MINIMUM_IP_TARGET,
        warm_prefix: 0,
        ..node.clone()
    }
}

/// Per card: the pacing the policy needs across passes.
#[derive(Debug, Clone, Default)]
struct CardState {
    last_shrink: Option<SystemTime>,
    excess_since: Option<SystemTime>,
}

/// The pools of the cards other than 0.
#[derive(Debug, Default)]
pub struct CardPools {
    state: BTreeMap<u32, CardState>,
}

/// Most decisions executed per card in one pass.
const MAX_STEPS_PER_CARD: usize = 8;

impl CardPools {
    /// Settles every serving card's pool (none without `ENABLE_MULTI_NIC`).
    pub async fn settle<P: EniProvider, H: EniHost>(
        &mut self,
        ipam: &Ipam,
        provider: &P,
        host: &H,
    ) {
        for card in ipam.serving_cards() {
            if ipam.is_shutting_down() {
                return;
            }
            for eni in ipam.card_enis_awaiting_host(card) {
                match host.setup(&eni).await {
                    Ok(()) => ipam.card_mark_host_ready(card, &eni.id),
                    Err(e) => {
                        tracing::warn!(card, eni = %eni.id, error = %e, "host networking of the network card's eni failed; retried next pass");
                    }
                }
            }
            for _ in 0..MAX_STEPS_PER_CARD {
                if !self.step(ipam, provider, host, card).await {
                    break;
                }
            }
        }
    }

    /// One decision for `card`, executed; false when there is nothing (more) to do now.
    async fn step<P: EniProvider, H: EniHost>(
        &mut self,
        ipam: &Ipam,
        provider: &P,
        host: &H,
        card: u32,
    ) -> bool {
        let Some(stats) = ipam.card_pool_stats(card) else {
            return false;
        };
        let t = card_targets(&ipam.targets());
        let now = ipam.now();
        let st = self.state.entry(card).or_default();
        st.excess_since = policy::track_excess(st.excess_since, &stats, &t, now, 0);
        let decision = policy::decide(
            &stats,
            &t,
            Moment {
                now,
                last_shrink: st.last_shrink,
                waiting_pods: 0,
                changes_allowed: ipam.settings.provisioning && !ipam.is_shutting_down(),
                eni_attachment_allowed: !ipam.node_unschedulable(),
                excess_since: st.excess_since,
            },
        );
        if decision.is_shrink() {
            st.last_shrink = Some(now);
        }
        let _busy = ipam.pool_action();
        match decision {
            Decision::Nothing | Decision::Blocked(_) => false,
            Decision::AssignIps { eni_id, count } => {
                match provider.assign_ips(&eni_id, count).await {
                    Ok(ips) => {
                        let cidrs: Vec<ipnet::Ipv4Net> =
                            ips.into_iter().map(ipnet::Ipv4Net::from).collect();
                        ipam.card_add_cidrs(card, &eni_id, &cidrs);
                        true
                    }
                    Err(e) => {
                        tracing::warn!(card, eni = %eni_id, error = %e, "addresses for the network card not assigned");
                        false
                    }
                }
            }
            Decision::AssignPrefixes { eni_id, count } => {
                match provider.assign_prefixes(&eni_id, count).await {
                    Ok(prefixes) => {
                        ipam.card_add_cidrs(card, &eni_id, &prefixes);
                        true
                    }
                    Err(e) => {
                        tracing::warn!(card, eni = %eni_id, error = %e, "prefixes for the network card not assigned");
                        false
                    }
                }
            }
            Decision::AllocateEni { count } => {
                let req = if t.prefix_delegation {
                    NewEni {
                        secondary_ips: 0,
                        prefixes: count,
                    }
                } else {
                    NewEni {
                        secondary_ips: count,
                        prefixes: 0,
                    }
                };
                match provider.create_eni_on_card(req, card).await {
                    Ok(eni) => {
                        let ready = match host.setup(&eni).await {
                            Ok(()) => true,
                            Err(e) => {
                                tracing::warn!(card, eni = %eni.id, error = %e, "host networking of the network card's new eni failed; retried next pass");
                                false
                            }
                        };
                        tracing::info!(card, eni = %eni.id, device = eni.device_number, "eni attached on the network card");
                        if let Err(e) = ipam.card_adopt_eni(card, &eni, ready) {
                            tracing::error!(card, eni = %eni.id, error = %e, "new eni of the network card not registered");
                        }
                        true
                    }
                    Err(e) => {
                        tracing::warn!(card, error = %e, "eni for the network card not attached");
                        false
                    }
                }
            }
            Decision::ReleaseIps { eni_id, ips } => {
                let cidrs: Vec<ipnet::Ipv4Net> =
                    ips.iter().copied().map(ipnet::Ipv4Net::from).collect();
                let taken = ipam.card_take_cidrs(card, &eni_id, &cidrs);
                let ips: Vec<std::net::Ipv4Addr> = taken.iter().map(ipnet::Ipv4Net::addr).collect();
                if !ips.is_empty()
                    && let Err(e) = provider.unassign_ips(&eni_id, &ips).await
                {
                    tracing::warn!(card, eni = %eni_id, error = %e, "addresses of the network card not released in EC2 (out of the pool until the next start)");
                }
                false
            }
            Decision::ReleasePrefixes { eni_id, prefixes } => {
                let taken = ipam.card_take_cidrs(card, &eni_id, &prefixes);
                if !taken.is_empty()
                    && let Err(e) = provider.unassign_prefixes(&eni_id, &taken).await
                {
                    tracing::warn!(card, eni = %eni_id, error = %e, "prefixes of the network card not released in EC2 (out of the pool until the next start)");
                }
                false
            }
            Decision::FreeEni { eni_id } => {
                let Ok(eni) = ipam.card_take_eni(card, &eni_id) else {
                    return false;
                };
                match provider.free_eni(&eni_id).await {
                    Ok(()) => {
                        if let Err(e) = host.teardown(&eni).await {
                            tracing::warn!(card, eni = %eni_id, error = %e, "host networking of the freed eni not removed");
                        }
                        tracing::info!(card, eni = %eni_id, "spare eni of the network card freed");
                    }
                    Err(e) => {
                        tracing::warn!(card, eni = %eni_id, error = %e, "eni of the network card not freed (out of the pool until the next start)");
                    }
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream `datastoreTargetState`: for `networkCard > DefaultNetworkCardIndex`,
    /// `warmIPTarget = DefaultWarmIPTarget` (1) and `minimumIPTarget = DefaultMinimumIPTarget`
    /// (1), whatever WARM_ENI_TARGET/WARM_IP_TARGET/WARM_PREFIX_TARGET the node has; limits and
    /// mode stay the node's.
    #[test]
    fn a_card_other_than_0_keeps_one_warm_address_whatever_the_node_targets() {
        let node = Targets {
            warm_eni: 1,
            warm_ip: 5,
            minimum_ip: 10,
            warm_prefix: 2,
            prefix_delegation: true,
            max_enis: 8,
            cidrs_per_eni: 49,
            max_pods: Some(110),
        };
        let t = card_targets(&node);
        assert_eq!(
            (t.warm_eni, t.warm_ip, t.minimum_ip, t.warm_prefix),
            (0, 1, 1, 0)
        );
        assert_eq!(
            (t.max_enis, t.cidrs_per_eni, t.max_pods),
            (8, 49, Some(110))
        );
        assert!(t.prefix_delegation);
    }
}
