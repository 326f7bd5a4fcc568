//! `World`: the shared simulated EC2 world behind one `std::sync::Mutex` (never held across an
//! `.await`): state, knobs, token buckets, the history IMDS lags behind, and the change
//! notification the fabric waits on. Owns time-dependent views (attach delay, IMDS lag, the
//! releases `DescribeNetworkInterfaces` still shows); it must not speak HTTP or touch the kernel.

use crate::clock::{Clock, SystemClock};
use crate::config::WorldConfig;
use crate::knobs::{ActionClass, Knobs, TokenBuckets};
use crate::state::{self, Eni, Now, State, StateError};
use crate::view::{
    BranchView, EniView, FabricView, InstanceView, SecurityGroupView, SgRuleView, SubnetView,
};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use tokio::sync::watch;

/// How far back the IMDS history reaches; larger `imds_lag_ms` values are clamped to it.
pub const MAX_HISTORY: Duration = Duration::from_secs(15 * 60);

/// Requests of one EC2 action that reached the throttle (control API `GET /calls`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApiCount {
    /// Let through (answered by the action, which may still refuse them).
    pub accepted: u64,
    /// Answered `RequestLimitExceeded`.
    pub throttled: u64,
}

/// The simulated world shared by the EC2 API, IMDS, the control API and the fabric.
#[derive(Debug)]
pub struct World {
    config: WorldConfig,
    clock: Arc<dyn Clock>,
    epoch_instant: Instant,
    epoch_wall: OffsetDateTime,
    inner: Mutex<Inner>,
    changes: watch::Sender<u64>,
}

#[derive(Debug)]
struct Inner {
    state: State,
    knobs: Knobs,
    buckets: TokenBuckets,
    /// Per action: requests let through / refused by the throttle.
    api_counts: std::collections::BTreeMap<String, ApiCount>,
    /// `(when, state after a change)`, oldest first; the first entry is the initial state.
    history: VecDeque<(Instant, Arc<State>)>,
    /// `(when, the ENI just before a release of it)`, oldest first, kept while
    /// `release_lag_ms` makes `DescribeNetworkInterfaces` still show what the release removed.
    released: VecDeque<(Instant, Eni)>,
    generation: u64,
}

impl World {
    /// A world on the system clock.
    pub fn new(config: WorldConfig) -> Arc<Self> {
        Self::with_clock(config, Arc::new(SystemClock))
    }

    /// A world on `clock` (e.g. a `ManualClock` in tests).
    pub fn with_clock(config: WorldConfig, clock: Arc<dyn Clock>) -> Arc<Self> {
        let state = State::new(&config);
        let epoch_instant = clock.now();
        let (changes, _) = watch::channel(0);
        let history = VecDeque::from([(epoch_instant, Arc::new(state.clone()))]);
        Arc::new(Self {
            config,
            clock,
            epoch_instant,
            epoch_wall: OffsetDateTime::now_utc(),
            inner: Mutex::new(Inner {
                state,
                knobs: Knobs::default(),
                buckets: TokenBuckets::default(),
                api_counts: std::collections::BTreeMap::new(),
                history,
                released: VecDeque::new(),
                generation: 0,
            }),
            changes,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The configuration the world was created from.
    pub fn config(&self) -> &WorldConfig {
        &self.config
    }

    /// The current instant of the world's clock.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// `now` as monotonic instant plus the wall time it stands for.
    pub fn stamp(&self, now: Instant) -> Now {
        let since = now.saturating_duration_since(self.epoch_instant);
        Now {
            instant: now,
            wall: self.epoch_wall + since,
        }
    }

    /// Run a state operation; on success the change is recorded (IMDS history, notification).
    pub fn mutate<R>(
        &self,
        f: impl FnOnce(&mut State, Now) -> Result<R, StateError>,
    ) -> Result<R, StateError> {
        let now = self.now();
        let stamp = self.stamp(now);
        let mut inner = self.lock();
        let out = f(&mut inner.state, stamp)?;
        self.commit(inner, now);
        Ok(out)
    }

    /// [`World::mutate`] for a release of ENI `eni_id` (`UnassignPrivateIpAddresses`,
    /// `UnassignIpv6Addresses`, `DetachNetworkInterface`): the change applies at once, but
    /// while `release_lag_ms` runs [`World::read_described`] still shows what it removed.
    pub fn release<R>(
        &self,
        eni_id: impl FnOnce(&State) -> Option<String>,
        f: impl FnOnce(&mut State, Now) -> Result<R, StateError>,
    ) -> Result<R, StateError> {
        let now = self.now();
        let stamp = self.stamp(now);
        let mut inner = self.lock();
        let before = eni_id(&inner.state).and_then(|id| inner.state.enis.get(&id).cloned());
        let out = f(&mut inner.state, stamp)?;
        let lag = Duration::from_millis(inner.knobs.release_lag_ms).min(MAX_HISTORY);
        if let Some(eni) = before.filter(|_| !lag.is_zero()) {
            inner.released.push_back((now, eni));
        }
        expire(&mut inner.released, now, lag);
        self.commit(inner, now);
        Ok(out)
    }

    /// Records a change made under `inner` at `now` (IMDS history, notification).
    fn commit(&self, mut inner: MutexGuard<'_, Inner>, now: Instant) {
        let snapshot = Arc::new(inner.state.clone());
        let window = Duration::from_millis(inner.knobs.imds_lag_ms).min(MAX_HISTORY);
        inner.history.push_back((now, snapshot));
        prune(&mut inner.history, now, window);
        inner.generation += 1;
        let generation = inner.generation;
        drop(inner);
        self.changes.send_replace(generation);
    }

    /// Runs `f` on the state and the ENIs as `DescribeNetworkInterfaces` shows them at `now`:
    /// every ENI of the state, where a release less than `release_lag_ms` ago still shows
    /// what it removed (addresses, prefixes, the attachment; a deleted ENI as it was), keyed
    /// by id. Every other action sees the state itself.
    pub fn read_described<R>(
        &self,
        now: Instant,
        f: impl FnOnce(&State, &BTreeMap<String, Eni>) -> R,
    ) -> R {
        let mut inner = self.lock();
        let lag = Duration::from_millis(inner.knobs.release_lag_ms).min(MAX_HISTORY);
        expire(&mut inner.released, now, lag);
        if inner.released.is_empty() {
            return f(&inner.state, &inner.state.enis);
        }
        let mut shown = inner.state.enis.clone();
        for (_, before) in &inner.released {
            match shown.get_mut(&before.id) {
                Some(e) => still_shows(e, before),
                None => {
                    shown.insert(before.id.clone(), before.clone());
                }
            }
        }
        f(&inner.state, &shown)
    }

    /// Read the current state.
    pub fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock().state)
    }

    /// A copy of the current state.
    pub fn state(&self) -> State {
        self.lock().state.clone()
    }

    /// Current knobs.
    pub fn knobs(&self) -> Knobs {
        self.lock().knobs.clone()
    }

    /// Replace the knobs. Token levels are kept (cut to the new bucket sizes, never
    /// refilled by the change), so a brown-out does not hand out a fresh burst.
    pub fn set_knobs(&self, knobs: Knobs) {
        let now = self.now();
        let mut inner = self.lock();
        let old = std::mem::replace(&mut inner.knobs, knobs);
        let Inner { knobs, buckets, .. } = &mut *inner;
        buckets.retune(&old.throttle, &knobs.throttle, now);
        inner.generation += 1;
        let generation = inner.generation;
        drop(inner);
        self.changes.send_replace(generation);
    }

    /// Take a throttle token for a request of `action` in `class` now and count it; false
    /// means answer `RequestLimitExceeded`.
    pub fn take_token(&self, action: &str, class: ActionClass) -> bool {
        let now = self.now();
        let mut inner = self.lock();
        let Inner {
            knobs,
            buckets,
            api_counts,
            ..
        } = &mut *inner;
        let ok = buckets.take(&knobs.throttle, action, class, now);
        let count = api_counts.entry(action.to_owned()).or_default();
        if ok {
            count.accepted += 1;
        } else {
            count.throttled += 1;
        }
        ok
    }

    /// Per EC2 action: requests the throttle let through and requests it refused with
    /// `RequestLimitExceeded`, since the world was created.
    pub fn api_counts(&self) -> std::collections::BTreeMap<String, ApiCount> {
        self.lock().api_counts.clone()
    }

    /// A receiver whose value changes on every state or knob change (the fabric reconciles on
    /// it; it must also re-check once `attach_delay_ms` has passed after an attach).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Convenience for tests and the control API: launch `count` instances of `instance_type`
    /// in the default subnet.
    pub fn run_instances(
        &self,
        instance_type: &str,
        count: u32,
    ) -> Result<Vec<String>, StateError> {
        self.launch(instance_type, count, 0)
    }

    /// `count` instances of `instance_type` in the default subnet, each primary ENI with one
    /// IPv6 address (an IPv6 EKS node as launched; ipamd then adds the /80).
    pub fn run_ipv6_instances(
        &self,
        instance_type: &str,
        count: u32,
    ) -> Result<Vec<String>, StateError> {
        self.launch(instance_type, count, 1)
    }

    fn launch(
        &self,
        instance_type: &str,
        count: u32,
        ipv6_count: u32,
    ) -> Result<Vec<String>, StateError> {
        self.mutate(|s, now| {
            s.run_instances(
                state::RunInstances {
                    instance_type: instance_type.into(),
                    count,
                    ipv6_count,
                    ..state::RunInstances::default()
                },
                now,
            )
        })
    }

    /// What the fabric must show at `now`: current EC2 state with the attach delay applied.
    pub fn fabric_view(&self, now: Instant) -> FabricView {
        let inner = self.lock();
        let delay = Duration::from_millis(inner.knobs.attach_delay_ms);
        FabricView {
            eni_groups_enforced: inner.knobs.enforce_eni_security_groups,
            ..view_of(&self.config, &inner.state, now, delay)
        }
    }

    /// What IMDS on `instance_id` shows at `now`: the state as of `now - imds_lag`, attach
    /// delay applied at that time, but never older than the instance's launch (an instance's
    /// IMDS cannot predate it). (`imds_partial_prefixes` is applied by the IMDS renderer.)
    pub fn imds_view(&self, instance_id: &str, now: Instant) -> FabricView {
        let inner = self.lock();
        let lag = Duration::from_millis(inner.knobs.imds_lag_ms).min(MAX_HISTORY);
        let delay = Duration::from_millis(inner.knobs.attach_delay_ms);
        let mut at = now.checked_sub(lag).unwrap_or(self.epoch_instant);
        let lagged = inner
            .history
            .iter()
            .rev()
            .find(|(t, s)| *t <= at && s.instances.contains_key(instance_id));
        let entry = lagged.or_else(|| {
            let first = inner
                .history
                .iter()
                .find(|(_, s)| s.instances.contains_key(instance_id));
            if let Some((t, _)) = first {
                at = *t;
            }
            first
        });
        let state = entry.map(|(_, s)| Arc::clone(s));
        drop(inner);
        match state {
            Some(s) => view_of(&self.config, &s, at, delay),
            None => self.fabric_view(now),
        }
    }
}

/// Drop history older than the IMDS lag window, keeping the newest entry before the cut-off
/// (so memory stays bounded by the configured lag, not by the run's length). Raising the lag
/// later can only reach back as far as the history kept since.
fn prune(history: &mut VecDeque<(Instant, Arc<State>)>, now: Instant, window: Duration) {
    let Some(cut) = now.checked_sub(window) else {
        return;
    };
    while history.len() > 1 && history[1].0 <= cut {
        history.pop_front();
    }
}

/// Forget releases `lag` or longer ago (all of them with no lag).
fn expire(released: &mut VecDeque<(Instant, Eni)>, now: Instant, lag: Duration) {
    while released
        .front()
        .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= lag)
    {
        released.pop_front();
    }
}

/// `eni` as a lagging Describe shows it: with what a release took from `before` still on it.
fn still_shows(eni: &mut Eni, before: &Eni) {
    fn keep<T: PartialEq + Copy>(now: &mut Vec<T>, before: &[T]) {
        for x in before {
            if !now.contains(x) {
                now.push(*x);
            }
        }
    }
    keep(&mut eni.private_ips, &before.private_ips);
    keep(&mut eni.ipv4_prefixes, &before.ipv4_prefixes);
    keep(&mut eni.ipv6_addresses, &before.ipv6_addresses);
    keep(&mut eni.ipv6_prefixes, &before.ipv6_prefixes);
    if eni.attachment.is_none() {
        eni.attachment.clone_from(&before.attachment);
    }
}

fn view_of(config: &WorldConfig, state: &State, now: Instant, delay: Duration) -> FabricView {
    let subnets = state
        .subnets
        .values()
        .map(|s| SubnetView {
            subnet_id: s.id.clone(),
            cidr: s.cidr,
            gateway: std::net::Ipv4Addr::from(u32::from(s.cidr.network()) + 1),
            ipv6_cidr: s.ipv6_cidr,
            availability_zone: s.availability_zone.clone(),
        })
        .collect();
    let instances = state
        .instances
        .values()
        .map(|inst| {
            let running = inst.state == state::InstanceState::Running;
            let enis = if running {
                state
                    .enis_of(&inst.id)
                    .into_iter()
                    .filter(|e| {
                        e.attachment.as_ref().is_some_and(|a| {
                            (a.device_index == 0 && a.network_card_index == 0)
                                || a.attached_at
                                    .is_none_or(|t| now.saturating_duration_since(t) >= delay)
                        })
                    })
                    .map(|e| {
                        let subnet = &state.subnets[&e.subnet_id];
                        EniView {
                            eni_id: e.id.clone(),
                            device_index: e.attachment.as_ref().map_or(0, |a| a.device_index),
                            network_card_index: e
                                .attachment
                                .as_ref()
                                .map_or(0, |a| a.network_card_index),
                            mac: e.mac.clone(),
                            primary_ip: e.primary_ip(),
                            secondary_ips: e.private_ips[1..].to_vec(),
                            ipv4_prefixes: e.ipv4_prefixes.clone(),
                            ipv6_addresses: e.ipv6_addresses.clone(),
                            ipv6_prefixes: e.ipv6_prefixes.clone(),
                            subnet_id: e.subnet_id.clone(),
                            subnet_cidr: subnet.cidr,
                            subnet_ipv6_cidr: subnet.ipv6_cidr,
                            security_groups: e.groups.clone(),
                            source_dest_check: e.source_dest_check,
                            interface_type: e.interface_type.clone(),
                            branches: branch_views(state, &e.id),
                        }
                    })
                    .collect()
            } else {
                Vec::new()
            };
            InstanceView {
                instance_id: inst.id.clone(),
                instance_type: inst.instance_type.clone(),
                availability_zone: inst.availability_zone.clone(),
                running,
                enis,
            }
        })
        .collect();
    FabricView {
        eni_groups_enforced: false,
        vpc_id: state.vpc.id.clone(),
        vpc_cidr: state.vpc.cidr,
        vpc_cidrs: state.vpc.cidr_blocks(),
        vpc_ipv6_cidr: state.vpc.ipv6_cidr,
        region: config.region.clone(),
        availability_zone: config.availability_zone.clone(),
        subnets,
        instances,
        security_groups: state
            .security_groups
            .values()
            .map(|g| SecurityGroupView {
                group_id: g.id.clone(),
                ingress: g.ingress.iter().map(rule_view).collect(),
                egress: g.egress.iter().map(rule_view).collect(),
            })
            .collect(),
    }
}

fn rule_view(r: &state::SgRule) -> SgRuleView {
    SgRuleView {
        protocol: r.protocol.clone(),
        from_port: r.from_port,
        to_port: r.to_port,
        cidrs: r.cidrs.clone(),
        groups: r.groups.clone(),
    }
}

/// The branches of trunk `trunk_eni`, in VLAN id order (empty for any other ENI).
fn branch_views(state: &State, trunk_eni: &str) -> Vec<BranchView> {
    state
        .branches_of(trunk_eni)
        .into_iter()
        .filter_map(|a| {
            let b = state.enis.get(&a.branch_eni)?;
            let subnet = state.subnets.get(&b.subnet_id)?;
            Some(BranchView {
                eni_id: b.id.clone(),
                vlan_id: a.vlan_id,
                mac: b.mac.clone(),
                primary_ip: b.primary_ip(),
                ipv6_addresses: b.ipv6_addresses.clone(),
                subnet_id: b.subnet_id.clone(),
                subnet_cidr: subnet.cidr,
                subnet_ipv6_cidr: subnet.ipv6_cidr,
                security_groups: b.groups.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::state::CreateEni;

    #[test]
    fn history_is_bounded_by_the_lag_window() {
        let clock = Arc::new(ManualClock::new());
        let world = World::with_clock(WorldConfig::default(), clock.clone());
        let inst = world.run_instances("m5.large", 1).unwrap().remove(0);
        let eni = world.read(|s| s.instances[&inst].primary_eni.clone());
        for _ in 0..50 {
            clock.advance(Duration::from_millis(10));
            world
                .mutate(|s, _| {
                    s.create_tags(
                        std::slice::from_ref(&eni),
                        &[("k".into(), "v".into())].into(),
                    )
                })
                .unwrap();
        }
        assert_eq!(
            world.lock().history.len(),
            1,
            "no lag: only the current state is kept"
        );
        world.set_knobs(Knobs {
            imds_lag_ms: 100,
            ..Knobs::default()
        });
        for _ in 0..50 {
            clock.advance(Duration::from_millis(10));
            world
                .mutate(|s, _| {
                    s.create_tags(
                        std::slice::from_ref(&eni),
                        &[("k".into(), "v".into())].into(),
                    )
                })
                .unwrap();
        }
        assert!(
            world.lock().history.len() <= 12,
            "{}",
            world.lock().history.len()
        );
    }

    #[test]
    fn attach_delay_and_imds_lag() {
        let clock = Arc::new(ManualClock::new());
        let world = World::with_clock(WorldConfig::default(), clock.clone());
        world.set_knobs(Knobs {
            attach_delay_ms: 1000,
            imds_lag_ms: 5000,
            ..Knobs::default()
        });
        let inst = world.run_instances("m5.large", 1).unwrap().remove(0);
        clock.advance(Duration::from_secs(10));
        let subnet = world.read(|s| s.default_subnet().unwrap().id.clone());
        let eni = world
            .mutate(|s, _| {
                s.create_eni(CreateEni {
                    subnet_id: subnet.clone(),
                    ..CreateEni::default()
                })
            })
            .unwrap();
        world
            .mutate(|s, now| s.attach_eni(&eni, &inst, 1, now))
            .unwrap();
        let count = |v: FabricView| v.instance(&inst).unwrap().enis.len();
        assert_eq!(
            count(world.fabric_view(world.now())),
            1,
            "attach not visible before the delay"
        );
        clock.advance(Duration::from_millis(1000));
        assert_eq!(count(world.fabric_view(world.now())), 2);
        assert_eq!(count(world.imds_view(&inst, world.now())), 1, "imds lags");
        clock.advance(Duration::from_secs(5));
        assert_eq!(count(world.imds_view(&inst, world.now())), 2);
    }
}
