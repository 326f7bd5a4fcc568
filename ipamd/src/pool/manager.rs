//! The pool manager loop: every tick, or at once when an AddNetwork is waiting, asks the policy for
//! one decision at a time for every card's pool in turn (card 0, then the serving cards of
//! `ENABLE_MULTI_NIC`, each with its targets, [`Targets::of_card`]; one code path for all) and
//! executes it: against the EC2 port ([`EniProvider`]), then the host port ([`EniHost`]: a new
//! ENI's host networking is set up before its addresses count as assignable, a freed ENI's is
//! removed), then records the result in [`Ipam`]. An ENI whose host set-up failed is registered as
//! not host-ready (none of its addresses handed out) and the set-up is retried on the loop's ticks
//! (`Reconciler::ensure_host`). Shrinks take addresses out of the datastore BEFORE the EC2 call (so
//! no pod can be given an address being released) and never put them back: a failed call may still
//! have been applied by EC2, so only the reconciler, from EC2's Describe, adds them again; the one
//! exception is an error that proves EC2 refused every request of the call before acting
//! ([`ProviderError::certainly_not_applied`]; a bare `Throttled` does not). Every release is
//! recorded durably in its pool's release log before EC2 is asked (a release that cannot be
//! recorded is not asked: its addresses go back at once); the reconciler reads that log, and gets
//! the additions and the time of the last change asked of EC2 as values ([`Manager::hand_over`];
//! reconcile rules 4, 6, 7). Must not: hold the datastore lock across `.await`, act once shutdown
//! began.

use std::time::SystemTime;

use std::collections::BTreeMap;

use super::adaptive::AdaptivePool;
use super::host_port::{EniHost, NoHost};
use crate::ipam::{Ipam, IpamError};
use crate::k8s::CustomNetwork;
use crate::pool::ec2_port::{Busy, EniProvider, Failure, NewEni, ProviderError};
use crate::pool::placement;
use crate::pool::policy::{self, Conditions, Decision, Targets};
use crate::pool::reconcile_plan::{Addition, Release};

/// Most decisions executed for one pool in one burst before yielding to the tick.
const MAX_STEPS_PER_TICK: usize = 32;

/// What the policy needs of one pool across passes.
#[derive(Debug, Clone, Default)]
struct Pacing {
    last_shrink: Option<SystemTime>,
    /// Since when the pool has had a spare ENI ([`policy::track_excess`]).
    excess_since: Option<SystemTime>,
    /// ENIs whose subnet gave no address at their last ask, until when they are passed over
    /// ([`crate::datastore::EniStats::subnet_dry`]).
    dry_until: BTreeMap<String, SystemTime>,
}

/// How long an ENI whose subnet ran dry is passed over (the provider's back-off for the subnet).
pub const DRY_SUBNET_HOLD: std::time::Duration =
    crate::pool::ec2_port::INSUFFICIENT_ADDRESS_BACKOFF;

/// The loop's own state, its EC2 port and its host port.
#[derive(Debug)]
pub struct Manager<P, H = NoHost> {
    /// Per card's pool.
    pacing: BTreeMap<u32, Pacing>,
    provider: P,
    host: H,
    /// Dual-stack node: every ENI's /80 is asked of EC2 as soon as the ENI is known.
    every_ipv6_prefix: bool,
    /// Additions made since the last [`Manager::hand_over`].
    added: Vec<Addition>,
    /// When EC2 last refused an assign for a limit the datastore does not show, since the
    /// last [`Manager::hand_over`].
    refused_at: Option<SystemTime>,
    /// When EC2 was last asked to change anything (assign, create, unassign, free).
    mutated_at: Option<SystemTime>,
    /// Custom networking (`AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG`): every new ENI goes where the
    /// node's ENIConfig says ([`placement::custom_placement`]).
    custom_network: Option<CustomNetwork>,
    /// `WARM_POOL_POLICY=adaptive`: card 0's warm target follows the ADD rate over the
    /// measured refill time (other cards keep theirs).
    adaptive: Option<AdaptivePool>,
}

/// What the manager did to EC2, handed to the reconciler after every pass
/// ([`Manager::hand_over`]; `Reconciler::take_over`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ec2Changes {
    /// The CIDRs EC2 assigned and the ENIs it attached since the last hand-over, in order.
    pub additions: Vec<Addition>,
    /// When EC2 refused to assign addresses to an ENI the datastore believes has room (its
    /// view of the ENI is stale: addresses assigned by an instance killed before it recorded
    /// them, or seen by a lagging Describe at start): EC2 should be asked at once.
    pub refused_at: Option<SystemTime>,
    /// When EC2 was last asked to change anything.
    pub mutated_at: Option<SystemTime>,
}

/// Outcome of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Something changed; ask again.
    Changed(Decision),
    /// Policy satisfied (or blocked): stop until the next tick/demand.
    Settled(Decision),
    /// The provider failed.
    Failed(Decision, ProviderError),
}

impl<P: EniProvider> Manager<P, NoHost> {
    /// A manager without host networking (unit tests, the in-memory provider).
    #[must_use]
    pub fn new(provider: P) -> Self {
        Self::with_host(provider, NoHost)
    }
}

impl<P: EniProvider, H: EniHost> Manager<P, H> {
    /// A manager acting through `provider`, whose new ENIs get their host networking set up
    /// on `host` (and a freed ENI's removed, from the datastore's description of it).
    pub fn with_host(provider: P, host: H) -> Self {
        Self {
            pacing: BTreeMap::new(),
            provider,
            host,
            every_ipv6_prefix: false,
            added: Vec::new(),
            refused_at: None,
            mutated_at: None,
            custom_network: None,
            adaptive: None,
        }
    }

    /// With `Some`, card 0's pool is sized by the adaptive policy.
    #[must_use]
    pub fn with_adaptive(mut self, adaptive: Option<AdaptivePool>) -> Self {
        self.adaptive = adaptive;
        self
    }

    /// The adaptive policy's state (None under the static policy).
    pub fn adaptive(&self) -> Option<&AdaptivePool> {
        self.adaptive.as_ref()
    }

    /// With custom networking (`Some`), new ENIs are placed by the node's ENIConfig.
    #[must_use]
    pub fn with_custom_network(mut self, custom: Option<CustomNetwork>) -> Self {
        self.custom_network = custom;
        self
    }

    /// On a dual-stack node (`yes`), every ENI's /80 is asked of EC2 as soon as the ENI is
    /// known, so a pod rarely waits for it; otherwise only the /80s an AddNetwork waits for.
    #[must_use]
    pub fn with_every_ipv6_prefix(mut self, yes: bool) -> Self {
        self.every_ipv6_prefix = yes;
        self
    }

    /// The host port.
    pub fn host(&self) -> &H {
        &self.host
    }

    /// The EC2 port.
    pub fn provider(&self) -> &P {
        &self.provider
    }

    /// What the manager did to EC2 since the last call: its additions (the reconciler must not
    /// remove them on a view that does not list them yet) and when it last asked EC2 for a
    /// change (an absence seen soon after is not trusted). Its releases are in the pools'
    /// release logs ([`crate::ipam::Index::recorded_releases`]). Call after every pass.
    pub fn hand_over(&mut self) -> Ec2Changes {
        Ec2Changes {
            additions: std::mem::take(&mut self.added),
            refused_at: self.refused_at.take(),
            mutated_at: self.mutated_at,
        }
    }

    /// Runs until `shutdown`, without a reconciler (tests; the daemon runs
    /// [`super::run::run`]). Test builds only.
    #[cfg(any(test, feature = "fake"))]
    pub async fn run(
        mut self,
        ipam: std::sync::Arc<Ipam>,
        tick: std::time::Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut interval = super::run::ticker(tick);
        while super::run::woken(&mut interval, &ipam, &super::host_port::NoHost, &shutdown).await {
            self.settle(&ipam).await;
            self.hand_over();
        }
    }

    /// A release of `card`'s pool, as it is made: recorded durably in the pool's release log.
    /// Call before EC2 is asked to apply it; on an error EC2 must not be asked (the caller
    /// puts the addresses back).
    fn release(ipam: &Ipam, card: u32, release: &Release) -> Result<(), ProviderError> {
        if release.cidrs.is_empty() && !release.whole_eni {
            return Ok(());
        }
        ipam.index.record_release(card, release).map_err(|e| {
            ProviderError::NotApplied(Box::new(ProviderError::Other(
                Failure::ReleaseNotRecorded {
                    eni_id: release.eni_id.clone(),
                    reason: e.to_string(),
                },
            )))
        })
    }

    /// Asks EC2 for the /80s wanted ([`Ipam::ipv6_prefixes_wanted`]) and hands each outcome to
    /// the index: registered, or refused (the AddNetwork calls that wait for it fail).
    pub async fn fetch_ipv6_prefixes(&mut self, ipam: &Ipam) {
        for eni_id in ipam.ipv6_prefixes_wanted(self.every_ipv6_prefix) {
            if ipam.is_shutting_down() {
                return;
            }
            let _busy = ipam.signal.pool_action();
            match self.provider.ipv6_prefix(&eni_id).await {
                Ok(net) => match ipam.register_ipv6_prefix(&eni_id, net) {
                    Ok(p) => {
                        tracing::info!(eni = %eni_id, prefix = %p.net, "IPv6 prefix registered for dual-stack pods");
                    }
                    Err(e) => ipam.signal.prefix_refused(&eni_id, &e.to_string()),
                },
                Err(e) => {
                    tracing::warn!(eni = %eni_id, error = %e, "IPv6 prefix of the ENI not obtained");
                    ipam.metrics.ipamd_error("assignIPv6Prefix");
                    ipam.signal.prefix_refused(&eni_id, &e.to_string());
                }
            }
        }
    }

    /// After a failed unassign that EC2 certainly did not apply (every request of it refused before
    /// EC2 acted: [`ProviderError::NotApplied`]), the CIDRs are this node's as before: back into
    /// the pool at once, their release withdrawn from the release log (adding them supersedes it),
    /// instead of kept out for the reconcile cooldown as an ambiguous failure is. Any other error,
    /// `Throttled` and `Unauthorized` included, may be the last answer of a call whose first
    /// request EC2 applied (its answer lost, the retry refused), and EC2 may already have given the
    /// addresses to another node: they stay out, recorded as released, and the reconciler re-adds
    /// what EC2's Describe still lists once the cooldown is over. A Describe asked now is no proof
    /// either way: it may lag behind the unassign (reconcile rule 4).
    fn put_back_if_not_applied(
        ipam: &Ipam,
        eni_id: &str,
        taken: &[ipnet::Ipv4Net],
        error: Option<&ProviderError>,
    ) {
        if taken.is_empty() || !error.is_some_and(ProviderError::certainly_not_applied) {
            return;
        }
        // Back into the pool; adding them supersedes their release in the log.
        for (c, e) in ipam.index.add_assigned(eni_id, taken) {
            tracing::warn!(cidr = %c, error = %e, "address of a refused unassign not put back");
        }
        tracing::info!(eni = eni_id, cidrs = ?taken, "unassign refused by EC2 at every request before it acted: addresses back in the pool");
    }

    /// The instance limit reached while a fragmented subnet gives /32s in place of /28s is
    /// named as what to fix: the subnet has no free /28 (`NoFreePrefix`), not the instance.
    fn named_limit(&self, limit: IpamError) -> IpamError {
        match (limit, self.provider.prefix_shortage()) {
            (IpamError::InstanceLimit(limit), Some(subnet)) => {
                IpamError::NoFreePrefix(crate::ipam::PrefixCause::FellBackToAddresses {
                    subnet: subnet.to_string(),
                    limit,
                })
            }
            (other, _) => other,
        }
    }

    /// Executes decisions for every card's pool until its policy is satisfied, blocked, or a
    /// call fails; first the /80s dual-stack pods need. What card 0's pool reports (a limit, a
    /// failure) is what waiting AddNetwork calls are told; another card's is logged (a
    /// multi-NIC pod waiting on it is told which card had no address).
    pub async fn settle(&mut self, ipam: &Ipam) {
        self.fetch_ipv6_prefixes(ipam).await;
        for card in ipam.index.cards() {
            if ipam.is_shutting_down() {
                return;
            }
            self.settle_card(ipam, card).await;
        }
    }

    async fn settle_card(&mut self, ipam: &Ipam, card: u32) {
        let first = card == 0;
        for _ in 0..MAX_STEPS_PER_TICK {
            let span = tracing::debug_span!("pool_step", card, decision = tracing::field::Empty);
            match tracing::Instrument::instrument(self.step_card(ipam, card), span).await {
                Step::Changed(d) => {
                    tracing::debug!(card, decision = ?d, "pool changed");
                    ipam.publish(None);
                }
                Step::Settled(Decision::Blocked(b)) => {
                    if first {
                        if ipam.signal.waiting_pods() > 0 {
                            tracing::warn!(reason = ?b, "pool cannot grow");
                        }
                        ipam.publish(Some(self.named_limit(ipam.blocked_error(b))));
                    } else {
                        tracing::debug!(card, reason = ?b, "pool of the network card cannot grow");
                    }
                    return;
                }
                Step::Settled(_) => {
                    // Nothing to change, but a waiter may find an address now (one came out
                    // of its cooldown, or a DEL freed one after the waiter looked).
                    ipam.offer_to_waiters();
                    return;
                }
                Step::Failed(d, e) if dry_eni(&d, &e).is_some() => {
                    // the same pass goes on: the next ENI with room, else a new ENI in the freest
                    // subnet
                    tracing::warn!(card, decision = ?d, error = %e, "the eni's subnet ran out of addresses; the pool grows elsewhere");
                    ipam.metrics.ipamd_error(fn_name(&d));
                }
                Step::Failed(d, e) => {
                    tracing::warn!(card, decision = ?d, error = %e, "pool action failed");
                    if matches!(
                        (&d, &e),
                        (
                            Decision::AssignIps { .. } | Decision::AssignPrefixes { .. },
                            ProviderError::InstanceLimit(_)
                        )
                    ) {
                        self.refused_at = Some(ipam.now());
                    }
                    ipam.metrics.ipamd_error(fn_name(&d));
                    if first {
                        match IpamError::from_pool_failure(&e) {
                            (limit, true) => ipam.publish(Some(self.named_limit(limit))),
                            (failure, false) => ipam.publish_failure(failure),
                        }
                    }
                    return;
                }
            }
        }
    }

    /// One decision for card 0's pool, executed (tests).
    pub async fn step(&mut self, ipam: &Ipam) -> Step {
        self.step_card(ipam, 0).await
    }

    /// One decision for `card`'s pool, executed.
    pub async fn step_card(&mut self, ipam: &Ipam, card: u32) -> Step {
        let now = ipam.now();
        let mut targets: Targets = ipam.targets().of_card(card);
        let Some(mut stats) = ipam.index.pool_stats(card) else {
            return Step::Settled(Decision::Nothing);
        };
        if card == 0
            && let Some(adaptive) = &mut self.adaptive
        {
            targets = adaptive.targets(
                &targets,
                &stats,
                now,
                ipam.metrics.add_ip_req_count.get(),
                ipam.node_state.subnet_free(),
            );
            ipam.signal.set_low_water(targets.warm_ip);
            adaptive.publish(&ipam.metrics);
        }
        let pacing = self.pacing.entry(card).or_default();
        pacing.dry_until.retain(|_, until| now < *until);
        for e in &mut stats.enis {
            e.subnet_dry = pacing.dry_until.contains_key(&e.id);
        }
        let decision = {
            // A multi-NIC pod waits on every card: the waiting count speaks for each.
            let waiting_pods = ipam.signal.waiting_pods();
            pacing.excess_since =
                policy::track_excess(pacing.excess_since, &stats, &targets, now, waiting_pods);
            let moment = Conditions {
                now,
                last_shrink: pacing.last_shrink,
                waiting_pods,
                changes_allowed: ipam.settings.provisioning && !ipam.is_shutting_down(),
                eni_attachment_allowed: !ipam.node_state.node_unschedulable(),
                excess_since: pacing.excess_since,
            };
            policy::decide(&stats, &targets, moment)
        };
        tracing::Span::current().record("decision", tracing::field::debug(&decision));
        let _in_progress = ipam.metrics.action_in_progress(fn_name(&decision));
        let _busy = ipam.signal.pool_action();
        let result = match &decision {
            Decision::Nothing | Decision::Blocked(_) => return Step::Settled(decision),
            Decision::AssignIps { eni_id, count } => {
                self.mutated_at = Some(now);
                match self.provider.assign_ips(eni_id, *count).await {
                    Ok(ips) => {
                        let cidrs: Vec<_> = ips.into_iter().map(ipnet::Ipv4Net::from).collect();
                        for (ip, e) in ipam.index.add_assigned(eni_id, &cidrs) {
                            tracing::warn!(%ip, error = %e, "assigned address not added");
                        }
                        self.added.push(addition_of(eni_id, cidrs, false, now));
                        if card == 0
                            && let Some(a) = &mut self.adaptive
                        {
                            a.grown(&decision, now, ipam.now());
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Decision::AssignPrefixes { eni_id, count } => {
                self.mutated_at = Some(now);
                match self.provider.assign_prefixes(eni_id, *count).await {
                    Ok(prefixes) => {
                        for (p, e) in ipam.index.add_assigned(eni_id, &prefixes) {
                            tracing::warn!(prefix = %p, error = %e, "assigned prefix not added");
                        }
                        self.added.push(addition_of(eni_id, prefixes, false, now));
                        if card == 0
                            && let Some(a) = &mut self.adaptive
                        {
                            a.grown(&decision, now, ipam.now());
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Decision::AllocateEni { count } => {
                self.mutated_at = Some(now);
                let placement = match &self.custom_network {
                    Some(custom) => placement::custom_placement(custom, &self.provider)
                        .await
                        .map(Some),
                    None => Ok(None),
                };
                let req = |placement| {
                    if targets.prefix_delegation {
                        NewEni {
                            secondary_ips: 0,
                            prefixes: *count,
                            placement,
                        }
                    } else {
                        NewEni {
                            secondary_ips: *count,
                            prefixes: 0,
                            placement,
                        }
                    }
                };
                let created = match placement {
                    Ok(placement) => self.provider.create_eni_on_card(req(placement), card).await,
                    Err(e) => Err(e),
                };
                match created {
                    Ok(eni) => {
                        // The ENI exists in EC2 and is attached: a failed host set-up must not
                        // fail the step (the manager would create another ENI). It is
                        // registered as not host-ready and the set-up is retried.
                        let (ready, os_table) = match self.host.setup(&eni).await {
                            Ok(table) => (true, table),
                            Err(e) => {
                                tracing::warn!(card, eni = %eni.id, error = %e, "host setup of new eni failed; its addresses are held back and the setup retried");
                                (false, None)
                            }
                        };
                        let cidrs = eni
                            .secondary_ips
                            .iter()
                            .map(|ip| ipnet::Ipv4Net::from(*ip))
                            .chain(eni.prefixes.iter().copied())
                            .collect();
                        self.added.push(addition_of(&eni.id, cidrs, true, now));
                        if card != 0 {
                            tracing::info!(card, eni = %eni.id, device = eni.device_number, "eni attached on the network card");
                        }
                        // registered not host-ready, its table recorded, then ready: no ADD can
                        // be answered the conventional table of an ENI the OS routes by its own
                        ipam.index
                            .adopt_eni(&eni, false)
                            .map_err(|refusal| {
                                ProviderError::Other(Failure::NotRegistered {
                                    eni_id: eni.id.clone(),
                                    refusal,
                                })
                            })
                            .map(|()| {
                                ipam.index.set_eni_table(&eni.id, os_table);
                                if ready {
                                    ipam.index.mark_host_ready(&eni.id);
                                    if card == 0
                                        && let Some(a) = &mut self.adaptive
                                    {
                                        a.grown(&decision, now, ipam.now());
                                    }
                                }
                            })
                    }
                    Err(e) => Err(e),
                }
            }
            Decision::ReleaseIps { eni_id, ips } => {
                let cidrs: Vec<_> = ips.iter().map(|ip| ipnet::Ipv4Net::from(*ip)).collect();
                let taken = ipam.index.take_cidrs(eni_id, &cidrs);
                self.mutated_at = Some(now);
                let r = match Self::release(ipam, card, &release_of(eni_id, &taken, false, now)) {
                    Err(e) => Err(e),
                    Ok(()) => {
                        let ips: Vec<_> = taken.iter().map(|c| c.addr()).collect();
                        // On an error EC2 may still have applied the call: nothing is put
                        // back; the reconciler re-adds what EC2's Describe still lists (after
                        // the release cooldown). Unless EC2 refused every request of it
                        // before acting.
                        self.provider.unassign_ips(eni_id, &ips).await
                    }
                };
                self.pacing.entry(card).or_default().last_shrink = Some(now);
                Self::put_back_if_not_applied(ipam, eni_id, &taken, r.as_ref().err());
                r
            }
            Decision::ReleasePrefixes { eni_id, prefixes } => {
                let taken = ipam.index.take_cidrs(eni_id, prefixes);
                self.mutated_at = Some(now);
                let r = match Self::release(ipam, card, &release_of(eni_id, &taken, false, now)) {
                    Err(e) => Err(e),
                    Ok(()) => self.provider.unassign_prefixes(eni_id, &taken).await,
                };
                self.pacing.entry(card).or_default().last_shrink = Some(now);
                Self::put_back_if_not_applied(ipam, eni_id, &taken, r.as_ref().err());
                r
            }
            Decision::FreeEni { .. } if ipam.index.unconfirmed_pending() > 0 => {
                // A restored entry (of any card) whose address is on no known CIDR may be on
                // this very ENI in EC2 (a Describe that lagged at start): no ENI is freed
                // until the reconciler has placed it or EC2 confirmed it is not on this node.
                tracing::debug!(card, decision = ?decision, "eni kept: restored entries not yet confirmed with ec2");
                return Step::Settled(Decision::Nothing);
            }
            Decision::FreeEni { eni_id } => {
                // The datastore's description, read before the ENI leaves it: what the host
                // teardown needs.
                let description = ipam.index.eni_description(eni_id);
                match ipam.index.take_eni(eni_id) {
                    Err(refusal) => Err(ProviderError::InUse(Busy::Datastore {
                        eni_id: eni_id.clone(),
                        refusal,
                    })),
                    Ok(cidrs) => {
                        self.mutated_at = Some(now);
                        match Self::release(ipam, card, &release_of(eni_id, &cidrs, true, now)) {
                            Err(e) => {
                                // Not recorded, not asked: the ENI is the pool's again.
                                if let Some(eni) = &description {
                                    let mut eni = eni.clone();
                                    eni.secondary_ips = cidrs
                                        .iter()
                                        .filter(|c| c.prefix_len() == 32)
                                        .map(ipnet::Ipv4Net::addr)
                                        .collect();
                                    eni.prefixes = cidrs
                                        .iter()
                                        .filter(|c| c.prefix_len() < 32)
                                        .copied()
                                        .collect();
                                    if let Err(a) = ipam.index.adopt_eni(&eni, true) {
                                        tracing::error!(eni = %eni_id, error = %a, "eni whose release was not recorded not put back");
                                    }
                                }
                                Err(e)
                            }
                            Ok(()) => {
                                // As for addresses: a failed detach may have been applied. The
                                // ENI stays out; if EC2 still shows it attached, the reconciler
                                // adopts it again (with host setup) after the release cooldown.
                                let r = self.provider.free_eni(eni_id).await;
                                self.pacing.entry(card).or_default().last_shrink = Some(now);
                                if r.is_ok()
                                    && let Some(eni) = &description
                                    && let Err(e) = self.host.teardown(eni).await
                                {
                                    tracing::warn!(card, eni = %eni_id, error = %e, "host teardown of freed eni failed");
                                }
                                r
                            }
                        }
                    }
                }
            }
        };
        match result {
            Ok(()) => Step::Changed(decision),
            Err(e) => {
                if let Some(eni_id) = dry_eni(&decision, &e) {
                    // passed over until the back-off ends: the next step grows elsewhere
                    self.pacing
                        .entry(card)
                        .or_default()
                        .dry_until
                        .insert(eni_id.to_owned(), now + DRY_SUBNET_HOLD);
                }
                Step::Failed(decision, e)
            }
        }
    }
}

/// The ENI an assign failed on because its subnet ran out of addresses (after the provider's ask
/// for a single one): the pass goes on to the next ENI.
fn dry_eni<'a>(decision: &'a Decision, e: &ProviderError) -> Option<&'a str> {
    match (decision, e) {
        (
            Decision::AssignIps { eni_id, .. } | Decision::AssignPrefixes { eni_id, .. },
            ProviderError::SubnetExhausted(_),
        ) => Some(eni_id),
        (d, ProviderError::NotApplied(last)) => dry_eni(d, last),
        _ => None,
    }
}

fn addition_of(
    eni_id: &str,
    cidrs: Vec<ipnet::Ipv4Net>,
    whole_eni: bool,
    at: SystemTime,
) -> Addition {
    Addition {
        eni_id: eni_id.to_owned(),
        cidrs,
        whole_eni,
        at,
    }
}

fn release_of(eni_id: &str, cidrs: &[ipnet::Ipv4Net], whole_eni: bool, at: SystemTime) -> Release {
    Release {
        eni_id: eni_id.to_owned(),
        cidrs: cidrs.to_vec(),
        whole_eni,
        at,
    }
}

/// The `fn` label of `awscni_ipamd_error_count` for the action (the pool functions' names
/// dashboards know).
fn fn_name(d: &Decision) -> &'static str {
    match d {
        Decision::Nothing | Decision::Blocked(_) => "nodeIPPoolReconcile",
        Decision::AssignIps { .. }
        | Decision::AssignPrefixes { .. }
        | Decision::AllocateEni { .. } => "increaseDatastorePool",
        Decision::ReleaseIps { .. }
        | Decision::ReleasePrefixes { .. }
        | Decision::FreeEni { .. } => "decreaseDatastorePool",
    }
}
