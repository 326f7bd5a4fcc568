//! EC2 and IMDS with eventual consistency, between ipamd's real `Ec2Provider` and the in-memory
//! `FakeCloud` (whose state is the ground truth: what EC2 really assigned). Each call is an
//! await point before and after it reaches EC2 (so a crash can fall between an applied
//! mutation and ipamd's record of it), and draws its fate from the tape:
//! - a read (`DescribeNetworkInterfaces`, IMDS) may be answered from any view of the last few
//!   seconds (EC2's reads are eventually consistent and not monotonic; IMDS lags);
//! - an `UnassignPrivateIpAddresses` or `DetachNetworkInterface` may be accepted and applied
//!   by EC2 only seconds later (until then EC2 still lists the address or the attachment);
//! - any call may be throttled or fail before reaching EC2, and a mutating call may be applied
//!   and still answer with a transport error (ambiguous), or be applied, its answer lost and
//!   the client's retry of it throttled (it answers a bare `Throttled`, as a client with
//!   transparent retries would, even for the unassign the SDK port sends without them: the
//!   pool must not take it for "not applied", issue 38). A throttled unassign that EC2 did
//!   not apply answers `NotApplied(Throttled)`, as the SDK port does.
//!
//! Must not: hold state EC2 would not have, decide for ipamd.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::FutureExt as _;
use ipamd::aws::fake::FakeCloud;
use ipamd::aws::{
    AddressRequest, CreateEni, Ec2, Ec2Eni, Ec2Error, EniQuery, Imds, ImdsEni, ImdsError,
    InstanceIdentity, InstanceTypeLimits, Tags,
};
use ipamd::ipam::Clock as _;
use ipnet::{Ipv4Net, Ipv6Net};

use super::exec::yield_now;
use super::rng::Rng;
use super::trace::{SimClock, Trace};

/// How unreliable EC2 and IMDS are in a run (per mille per call, seconds).
#[derive(Debug, Clone, Default)]
pub struct Knobs {
    /// A read served from an older view.
    pub lag_per_mille: u64,
    /// How old a Describe view can be.
    pub describe_lag_max: u64,
    /// How old an IMDS view can be.
    pub imds_lag_max: u64,
    /// An Unassign/Detach applied late.
    pub late_per_mille: u64,
    /// How late, at most.
    pub late_max: u64,
    /// `RequestLimitExceeded` (not applied).
    pub throttle_per_mille: u64,
    /// Applied, then a transport error.
    pub ambiguous_per_mille: u64,
    /// Applied, its answer lost, the client's retry throttled: answers `Throttled`.
    pub applied_throttle_per_mille: u64,
    /// A transport error before EC2 saw it.
    pub fail_per_mille: u64,
}

#[derive(Debug, Clone)]
struct View {
    at: SystemTime,
    enis: BTreeMap<String, Ec2Eni>,
    imds: Vec<ImdsEni>,
    /// What changed to make this view.
    what: String,
}

#[derive(Debug, Clone)]
enum LateOp {
    Unassign { eni: String, cidrs: Vec<Ipv4Net> },
    Detach { attachment: String },
}

#[derive(Debug)]
struct State {
    views: Vec<View>,
    late: Vec<(SystemTime, LateOp)>,
    /// A mutation was applied and its caller has not resumed yet.
    just_applied: bool,
    /// Mutations asked for and not applied yet (their caller waits at the first await).
    asked: u32,
    /// Address assignments EC2 refused with `AddressLimit` since the last one it granted.
    refused_in_a_row: u32,
}

/// What EC2 does with one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Apply,
    Throttle,
    FailBefore,
    Ambiguous,
    /// Applied, the answer lost, the retry throttled.
    AppliedThrottled,
    Late(u64),
}

/// The eventually consistent EC2 + IMDS of one node.
#[derive(Debug)]
pub struct SimCloud {
    pub fake: FakeCloud,
    rng: Rng,
    clock: Arc<SimClock>,
    trace: Trace,
    pub knobs: Knobs,
    st: Mutex<State>,
}

impl SimCloud {
    pub fn new(
        fake: FakeCloud,
        rng: Rng,
        clock: Arc<SimClock>,
        trace: Trace,
        knobs: Knobs,
    ) -> Self {
        let c = Self {
            fake,
            rng,
            clock,
            trace,
            knobs,
            st: Mutex::new(State {
                views: Vec::new(),
                late: Vec::new(),
                just_applied: false,
                asked: 0,
                refused_in_a_row: 0,
            }),
        };
        c.record("start");
        c
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.st
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records EC2's state after a change (for lagging reads).
    pub fn record(&self, what: &str) {
        let enis: BTreeMap<String, Ec2Eni> = self
            .fake
            .all_enis()
            .into_iter()
            .map(|e| (e.eni_id.clone(), e))
            .collect();
        let imds = Imds::enis(&self.fake)
            .now_or_never()
            .expect("the fake answers at once")
            .unwrap_or_default();
        let now = self.clock.now();
        let keep = Duration::from_secs(self.knobs.describe_lag_max.max(self.knobs.imds_lag_max));
        let mut st = self.st();
        st.views.push(View {
            at: now,
            enis,
            imds,
            what: what.to_owned(),
        });
        // Keep the views of the lag window and the last one before it.
        let window_start = now.checked_sub(keep).unwrap_or(now);
        let first_in = st.views.iter().position(|v| v.at >= window_start);
        if let Some(i) = first_in
            && i > 1
        {
            st.views.drain(..i - 1);
        }
    }

    /// A view a read may see: the live one, or (a lagging read) any of the last `max` seconds.
    /// Returns the view and how many changes it is behind.
    fn read_view(&self, max: u64) -> (View, usize) {
        let lag = self.rng.chance(self.knobs.lag_per_mille);
        let st = self.st();
        let live = st.views.last().cloned().expect("a view");
        if !lag || max == 0 {
            return (live, 0);
        }
        let now = self.clock.now();
        let window_start = now.checked_sub(Duration::from_secs(max)).unwrap_or(now);
        // The views a read may see: every one of the window, and the one in force at its start.
        let from = st
            .views
            .iter()
            .position(|v| v.at >= window_start)
            .map_or(st.views.len() - 1, |i| i.saturating_sub(1));
        let n = st.views.len() - from;
        drop(st);
        let pick = self.rng.index(n);
        let st = self.st();
        let idx = st.views.len() - 1 - pick.min(n - 1);
        let behind = st.views.len() - 1 - idx;
        (st.views[idx].clone(), behind)
    }

    fn fate(&self, api: &str, can_be_late: bool) -> Fate {
        let k = &self.knobs;
        if self.rng.chance(k.throttle_per_mille) {
            return Fate::Throttle;
        }
        if self.rng.chance(k.fail_per_mille) {
            return Fate::FailBefore;
        }
        let mutating = ipamd::aws::fake::MUTATING_APIS.contains(&api);
        if mutating && self.rng.chance(k.ambiguous_per_mille) {
            return Fate::Ambiguous;
        }
        // No draw while the knob is 0: the runs of every other configuration are unchanged.
        if mutating && self.rng.chance(k.applied_throttle_per_mille) {
            return Fate::AppliedThrottled;
        }
        if can_be_late && self.rng.chance(k.late_per_mille) {
            return Fate::Late(self.rng.range(1, k.late_max.max(1)));
        }
        Fate::Apply
    }

    /// True while a mutation is on its way to EC2 or EC2 applied one whose caller has not
    /// resumed yet: the moments a crash or a second instance hurts most.
    pub fn mid_mutation(&self) -> bool {
        let st = self.st();
        st.just_applied || st.asked > 0
    }

    /// Address assignments EC2 refused with `AddressLimit` since it last granted one (a pool
    /// that keeps asking for what EC2 cannot give: the opt-in liveness check).
    pub fn refused_in_a_row(&self) -> u32 {
        self.st().refused_in_a_row
    }

    /// The process that asked is gone.
    pub fn forget_callers(&self) {
        let mut st = self.st();
        st.just_applied = false;
        st.asked = 0;
    }

    /// The await point before a mutation reaches EC2.
    async fn ask(&self) {
        self.st().asked += 1;
        yield_now().await;
        let mut st = self.st();
        st.asked = st.asked.saturating_sub(1);
    }

    /// Applies the late mutations that are due (EC2 catching up).
    pub fn apply_due(&self) {
        let now = self.clock.now();
        let due: Vec<LateOp> = {
            let mut st = self.st();
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut st.late)
                .into_iter()
                .partition(|(t, _)| *t <= now);
            st.late = later;
            due.into_iter().map(|(_, op)| op).collect()
        };
        for op in due {
            let (what, r) = match &op {
                LateOp::Unassign { eni, cidrs } => (
                    format!("Unassign {eni} {}", cidrs_str(cidrs)),
                    self.fake
                        .unassign(eni, cidrs)
                        .now_or_never()
                        .expect("at once"),
                ),
                LateOp::Detach { attachment } => (
                    format!("Detach {attachment}"),
                    self.fake
                        .detach_eni(attachment)
                        .now_or_never()
                        .expect("at once"),
                ),
            };
            let outcome = r.map_or_else(|e| format!("refused: {e}"), |()| "applied".to_owned());
            self.trace.log(format!("EC2 late {what}: {outcome}"));
            self.record(&format!("late {what}"));
        }
    }

    /// The await point after an applied mutation, where a crash loses ipamd's record of it.
    async fn applied(&self, what: String) {
        self.record(&what);
        self.st().just_applied = true;
        yield_now().await;
        self.st().just_applied = false;
    }

    fn log(&self, what: &str, fate: Fate) {
        let f = match fate {
            Fate::Apply => "applied".to_owned(),
            Fate::Throttle => "THROTTLED (not applied)".to_owned(),
            Fate::FailBefore => "FAILED before EC2 saw it".to_owned(),
            Fate::Ambiguous => "applied, but answered with a transport error".to_owned(),
            Fate::AppliedThrottled => {
                "applied, answer lost, retry THROTTLED (answered throttled)".to_owned()
            }
            Fate::Late(s) => format!("accepted, applied LATE in {s}s"),
        };
        self.trace
            .log(format!("{}: EC2 {what}: {f}", self.trace.actor()));
    }

    /// Runs a mutating call through its fate: `apply` reaches the fake.
    async fn mutate<R>(
        &self,
        api: &'static str,
        what: String,
        fate: Fate,
        apply: impl FnOnce() -> Result<R, Ec2Error>,
    ) -> Result<R, Ec2Error> {
        match fate {
            Fate::Throttle => {
                self.log(&what, fate);
                // The SDK port sends an unassign as one request per try and says when EC2
                // refused them all (`Ec2::unassign`'s contract).
                if api == "UnassignPrivateIpAddresses" {
                    return Err(Ec2Error::NotApplied(Box::new(Ec2Error::Throttled)));
                }
                return Err(Ec2Error::Throttled);
            }
            Fate::FailBefore => {
                self.log(&what, fate);
                return Err(Ec2Error::Transport(format!("{api}: connection reset")));
            }
            Fate::Late(_) => unreachable!("handled by the caller"),
            Fate::Apply | Fate::Ambiguous | Fate::AppliedThrottled => {}
        }
        let r = apply();
        match &r {
            Ok(_) => self.log(&what, fate),
            Err(e) => self
                .trace
                .log(format!("{}: EC2 {what}: refused: {e}", self.trace.actor())),
        }
        self.applied(what).await;
        if fate == Fate::Ambiguous && r.is_ok() {
            return Err(Ec2Error::Transport(format!("{api}: timeout (applied)")));
        }
        if fate == Fate::AppliedThrottled && r.is_ok() {
            return Err(Ec2Error::Throttled);
        }
        r
    }
}

pub fn cidrs_str(c: &[Ipv4Net]) -> String {
    let v: Vec<String> = c
        .iter()
        .map(|n| {
            if n.prefix_len() == 32 {
                n.addr().to_string()
            } else {
                n.to_string()
            }
        })
        .collect();
    format!("[{}]", v.join(" "))
}

fn filter(enis: &BTreeMap<String, Ec2Eni>, query: &EniQuery) -> Result<Vec<Ec2Eni>, Ec2Error> {
    match query {
        EniQuery::Ids(ids) => ids
            .iter()
            .map(|id| {
                enis.get(id)
                    .cloned()
                    .ok_or_else(|| Ec2Error::NotFound(id.clone()))
            })
            .collect(),
        EniQuery::AttachedTo(instance) => Ok(enis
            .values()
            .filter(|e| {
                e.attachment
                    .as_ref()
                    .is_some_and(|a| &a.instance_id == instance)
            })
            .cloned()
            .collect()),
        EniQuery::Leaked { .. } => Ok(Vec::new()),
    }
}

fn now<T>(f: impl std::future::Future<Output = T>) -> T {
    f.now_or_never().expect("the fake answers at once")
}

impl Ec2 for SimCloud {
    async fn describe_enis(&self, query: EniQuery) -> Result<Vec<Ec2Eni>, Ec2Error> {
        yield_now().await;
        if self.rng.chance(self.knobs.throttle_per_mille) {
            self.trace
                .log(format!("{}: EC2 Describe: THROTTLED", self.trace.actor()));
            return Err(Ec2Error::Throttled);
        }
        // Counted by the fake (its own answer is the live view).
        let _ = now(self.fake.describe_enis(EniQuery::Ids(Vec::new())));
        let (view, behind) = self.read_view(self.knobs.describe_lag_max);
        if behind > 0 {
            self.trace.log(format!(
                "{}: EC2 Describe answered from a view {behind} change(s) old (before: {})",
                self.trace.actor(),
                self.st()
                    .views
                    .iter()
                    .rev()
                    .take(behind)
                    .map(|v| v.what.clone())
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        let r = filter(&view.enis, &query);
        yield_now().await;
        r
    }

    async fn instance_type_limits(
        &self,
        instance_type: &str,
    ) -> Result<InstanceTypeLimits, Ec2Error> {
        self.fake.instance_type_limits(instance_type).await
    }

    async fn subnet_zone(&self, subnet_id: &str) -> Result<Option<String>, Ec2Error> {
        self.fake.subnet_zone(subnet_id).await
    }

    async fn describe_subnets(
        &self,
        vpc_id: &str,
        availability_zone: &str,
    ) -> Result<Vec<ipamd::aws::SubnetInfo>, Ec2Error> {
        self.fake.describe_subnets(vpc_id, availability_zone).await
    }

    async fn create_eni(&self, req: CreateEni) -> Result<Ec2Eni, Ec2Error> {
        self.ask().await;
        let fate = self.fate("CreateNetworkInterface", false);
        let what = format!("CreateNetworkInterface {:?}", req.addresses);
        self.mutate("CreateNetworkInterface", what, fate, || {
            now(self.fake.create_eni(req))
        })
        .await
    }

    async fn attach_eni(
        &self,
        eni_id: &str,
        instance_id: &str,
        device_index: u32,
        network_card: u32,
    ) -> Result<String, Ec2Error> {
        self.ask().await;
        let fate = self.fate("AttachNetworkInterface", false);
        let what = format!("Attach {eni_id} at {device_index}");
        self.mutate("AttachNetworkInterface", what, fate, || {
            now(self
                .fake
                .attach_eni(eni_id, instance_id, device_index, network_card))
        })
        .await
    }

    async fn set_delete_on_termination(
        &self,
        eni_id: &str,
        attachment_id: &str,
    ) -> Result<(), Ec2Error> {
        self.ask().await;
        let fate = self.fate("ModifyNetworkInterfaceAttribute", false);
        let what = format!("ModifyNetworkInterfaceAttribute {eni_id}");
        self.mutate("ModifyNetworkInterfaceAttribute", what, fate, || {
            now(self.fake.set_delete_on_termination(eni_id, attachment_id))
        })
        .await
    }

    async fn set_security_groups(&self, eni_id: &str, groups: &[String]) -> Result<(), Ec2Error> {
        // no draw: the simulation never follows the node's groups (seeds stay as found)
        now(self.fake.set_security_groups(eni_id, groups))
    }

    async fn assign(&self, eni_id: &str, req: AddressRequest) -> Result<Vec<Ipv4Net>, Ec2Error> {
        self.ask().await;
        let fate = self.fate("AssignPrivateIpAddresses", false);
        let what = format!("Assign {eni_id} {req:?}");
        let r = self
            .mutate("AssignPrivateIpAddresses", what, fate, || {
                now(self.fake.assign(eni_id, req))
            })
            .await;
        match &r {
            Err(Ec2Error::AddressLimit) => self.st().refused_in_a_row += 1,
            Ok(_) => self.st().refused_in_a_row = 0,
            Err(_) => {}
        }
        if let Ok(got) = &r {
            self.trace.log(format!(
                "{}: EC2 assigned {} to {eni_id}",
                self.trace.actor(),
                cidrs_str(got)
            ));
        }
        r
    }

    async fn assign_ipv6_prefixes(
        &self,
        eni_id: &str,
        count: u32,
    ) -> Result<Vec<Ipv6Net>, Ec2Error> {
        self.ask().await;
        let fate = self.fate("AssignIpv6Addresses", false);
        let what = format!("AssignIpv6Addresses {eni_id} x{count}");
        self.mutate("AssignIpv6Addresses", what, fate, || {
            now(self.fake.assign_ipv6_prefixes(eni_id, count))
        })
        .await
    }

    async fn unassign(&self, eni_id: &str, cidrs: &[Ipv4Net]) -> Result<(), Ec2Error> {
        self.ask().await;
        let fate = self.fate("UnassignPrivateIpAddresses", true);
        let what = format!("Unassign {eni_id} {}", cidrs_str(cidrs));
        if let Fate::Late(s) = fate {
            self.log(&what, fate);
            let due = self.clock.now() + Duration::from_secs(s);
            self.st().late.push((
                due,
                LateOp::Unassign {
                    eni: eni_id.to_owned(),
                    cidrs: cidrs.to_vec(),
                },
            ));
            yield_now().await;
            return Ok(());
        }
        self.mutate("UnassignPrivateIpAddresses", what, fate, || {
            now(self.fake.unassign(eni_id, cidrs))
        })
        .await
    }

    async fn detach_eni(&self, attachment_id: &str) -> Result<(), Ec2Error> {
        self.ask().await;
        let fate = self.fate("DetachNetworkInterface", true);
        let what = format!("Detach {attachment_id}");
        if let Fate::Late(s) = fate {
            self.log(&what, fate);
            let due = self.clock.now() + Duration::from_secs(s);
            self.st().late.push((
                due,
                LateOp::Detach {
                    attachment: attachment_id.to_owned(),
                },
            ));
            yield_now().await;
            return Ok(());
        }
        self.mutate("DetachNetworkInterface", what, fate, || {
            now(self.fake.detach_eni(attachment_id))
        })
        .await
    }

    async fn delete_eni(&self, eni_id: &str) -> Result<(), Ec2Error> {
        self.ask().await;
        let fate = self.fate("DeleteNetworkInterface", false);
        let what = format!("Delete {eni_id}");
        self.mutate("DeleteNetworkInterface", what, fate, || {
            now(self.fake.delete_eni(eni_id))
        })
        .await
    }

    async fn create_tags(&self, eni_id: &str, tags: &Tags) -> Result<(), Ec2Error> {
        self.fake.create_tags(eni_id, tags).await
    }
}

impl Imds for SimCloud {
    async fn identity(&self) -> Result<InstanceIdentity, ImdsError> {
        self.fake.identity().await
    }

    async fn enis(&self) -> Result<Vec<ImdsEni>, ImdsError> {
        yield_now().await;
        let (view, behind) = self.read_view(self.knobs.imds_lag_max);
        if behind > 0 {
            self.trace.log(format!(
                "{}: IMDS answered from a view {behind} change(s) old",
                self.trace.actor()
            ));
        }
        Ok(view.imds)
    }
}
