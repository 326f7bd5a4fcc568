//! The simulated node and its scheduler: ipamd processes (started, crashed, rolled), the
//! kubelet and plugin driving ADD/DEL over the real gRPC backend, the host, another node
//! sharing the subnet, EC2 catching up, time; one seeded choice per step, and after every step
//! the invariant against the ground truth the harness keeps (which sandbox really holds which
//! address, what EC2 really assigned: the fake's state, not a lagging view).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use ipamd::aws::fake::FakeCloud;
use ipamd::pool::manager::Manager;
use ipamd::pool::policy::Targets;
use ipamd::pool::reconciler::Reconciler;
use ipamd::rpc::Backend;
use ipamd_proto::rpc::cni_backend_server::CniBackend as _;
use ipamd_proto::rpc::{AddNetworkReply, AddNetworkRequest, DelNetworkReply, DelNetworkRequest};
use ipnet::Ipv4Net;
use tokio_util::sync::CancellationToken;

use super::cloud::{Knobs, SimCloud};
use super::daemon::{self, DaemonConfig, Mode, Node, Provider, SimIpam, Started, VETH_PREFIX};
use super::disk::{DiskFaults, SimCheckpoint};
use super::exec::Executor;
use super::host::{SimEniHost, SimHost};
use super::rng::{Rng, SplitMix64, Tape};
use super::trace::{SimClock, Trace};

/// Which fault families a run uses, and whether instances take the node lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    pub name: &'static str,
    pub modes: &'static [Mode],
    /// Lagging Describe/IMDS views.
    pub lag: bool,
    /// Unassign/Detach applied late.
    pub late: bool,
    /// Throttling, failures before EC2, ambiguous failures.
    pub faults: bool,
    /// SIGKILL at any step.
    pub crashes: bool,
    /// Rolling updates (SIGTERM, a new instance started at once).
    pub updates: bool,
    /// A new instance waits for the old one's exit (`instance::NodeLock`). Off: it waits only
    /// until the old one stops accepting (the behaviour before issue 28 finding 3's fix).
    pub lock: bool,
    /// Routes flushed, veths gone.
    pub perturb: bool,
    /// Another node takes addresses of the shared subnet.
    pub tenant: bool,
    /// A restart may come with other pool targets (a rollout lowering WARM_IP_TARGET, ...).
    pub retarget: bool,
    /// Weight of crashes and rolling updates among the events (1: rare).
    pub churn: u64,
    /// A run may be a node with two network cards and `ENABLE_MULTI_NIC`, multi-NIC pods
    /// among the plain ones (issue 38).
    pub multi_nic: bool,
    /// A card's checkpoint file may be lost or garbage when an ipamd starts (issue 38).
    pub disk: bool,
    /// A run may have `ENABLE_POD_ENI`: branch pods among the plain ones, the controller's
    /// stand-in attaching the trunk and giving (and reusing) VLAN ids (issue 38).
    pub branch: bool,
}

const ALL_MODES: &[Mode] = &[Mode::V4, Mode::V4Prefix, Mode::DualStack, Mode::V6];

impl Profile {
    /// Everything at once, with the node lock (the daemon as shipped).
    pub const ALL: Self = Self {
        name: "all",
        modes: ALL_MODES,
        lag: true,
        late: true,
        faults: true,
        crashes: true,
        updates: true,
        lock: true,
        perturb: true,
        tenant: true,
        retarget: true,
        churn: 1,
        multi_nic: true,
        disk: true,
        branch: true,
    };
    /// Restarts and rollouts meeting a lagging EC2 (finding 1's ground).
    pub const RESTARTS: Self = Self {
        name: "restarts",
        modes: &[Mode::V4, Mode::V4Prefix],
        lag: true,
        late: true,
        faults: false,
        crashes: true,
        updates: true,
        lock: true,
        perturb: false,
        tenant: true,
        retarget: true,
        churn: 1,
        multi_nic: true,
        disk: true,
        branch: true,
    };
    /// Host perturbations under dual-stack pods (finding 2's ground).
    pub const HOST: Self = Self {
        name: "host",
        modes: &[Mode::DualStack, Mode::V6, Mode::V4],
        lag: false,
        late: false,
        faults: false,
        crashes: false,
        updates: false,
        lock: true,
        perturb: true,
        tenant: true,
        retarget: false,
        churn: 1,
        multi_nic: true,
        disk: false,
        branch: false,
    };
    /// Rolling updates with two overlapping instances and no node lock (finding 3's ground).
    pub const NO_LOCK: Self = Self {
        name: "no-lock",
        modes: &[Mode::V4, Mode::V4Prefix, Mode::DualStack],
        lag: false,
        late: false,
        faults: false,
        crashes: true,
        updates: true,
        lock: false,
        perturb: true,
        tenant: true,
        retarget: true,
        churn: 2,
        multi_nic: false,
        disk: false,
        branch: false,
    };

    pub fn named(name: &str) -> Option<Self> {
        [Self::ALL, Self::RESTARTS, Self::HOST, Self::NO_LOCK]
            .into_iter()
            .find(|p| p.name == name)
    }
}

/// Everything a run is configured with, drawn from its seed (not from the tape: a shrunk
/// tape keeps the configuration).
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub seed: u64,
    pub profile: Profile,
    pub daemon: DaemonConfig,
    pub knobs: Knobs,
    pub steps: u64,
    /// Per-mille chance a launch draws new pool targets.
    pub retarget_per_mille: u64,
    /// Network cards of the instance (2 with `ENABLE_MULTI_NIC`, else 1).
    pub network_cards: u32,
    /// Per-mille chance, for each card's checkpoint file, that it is lost or garbage when an
    /// ipamd starts after the first (nothing else touching the files then).
    pub checkpoint_loss_per_mille: u64,
    /// Per-mille chance, per card and start, that the side file (cooldowns, release log) is
    /// lost (the checkpoint kept).
    pub side_loss_per_mille: u64,
    /// Per-mille chance a new pod is a multi-NIC pod (annotated
    /// `k8s.amazonaws.com/nicConfig: multi-nic-attachment`).
    pub multi_nic_pod_per_mille: u64,
    /// Per-mille chance a new pod is a branch pod (security groups for pods; only with
    /// `ENABLE_POD_ENI`, IPv4).
    pub branch_pod_per_mille: u64,
    /// Seconds the controller keeps a deleted pod's branch ENI (and VLAN id) before it
    /// deletes it.
    pub branch_cooldown: u64,
    /// Also fail when EC2 refused the pool's address assignments (`AddressLimit`) this many
    /// times in a row (`SIM_LIVENESS`; 0: off): a pool that keeps asking for what EC2 cannot
    /// give while pods may wait. Not part of the invariant.
    pub liveness_refusals: u32,
    /// Polls the runnable task of highest priority, priorities redrawn now and then (PCT),
    /// instead of a uniformly chosen runnable task: one task runs far ahead of the others.
    pub priority_scheduler: bool,
}

fn pick<T: Copy>(r: &mut SplitMix64, v: &[T]) -> T {
    let n = u64::try_from(v.len()).unwrap_or(u64::MAX);
    v[usize::try_from(r.next_u64() % n).unwrap_or(0)]
}

fn draw_targets(r: &mut SplitMix64, mode: Mode) -> Targets {
    let pd = mode == Mode::V4Prefix;
    Targets {
        warm_eni: pick(r, &[0, 1, 1]),
        warm_ip: pick(r, &[0, 0, 1, 2, 3, 5]),
        minimum_ip: pick(r, &[0, 0, 2, 4, 8]),
        warm_prefix: if pd { pick(r, &[0, 1, 1, 2]) } else { 0 },
        prefix_delegation: pd,
        max_enis: 3,
        cidrs_per_eni: 9,
        max_pods: None,
    }
}

impl RunConfig {
    pub fn from_seed(seed: u64, profile: Profile) -> Self {
        let mut r = SplitMix64::new(seed ^ 0x5151_0028_0000_0000);
        let mode = pick(&mut r, profile.modes);
        let daemon = DaemonConfig {
            mode,
            targets: draw_targets(&mut r, mode),
            cooldown: Duration::from_secs(pick(&mut r, &[0, 1, 5, 30])),
            grace: pick(&mut r, &[None, Some(2), Some(5), Some(20), Some(60)])
                .map(Duration::from_secs),
            tick: Duration::from_secs(pick(&mut r, &[1, 2, 5])),
            add_wait: Duration::from_secs(pick(&mut r, &[1, 5, 20])),
            host_fail_per_mille: if profile.faults {
                pick(&mut r, &[0, 20, 100])
            } else {
                0
            },
            multi_nic: false,
            pod_eni: false,
        };
        let on = |r: &mut SplitMix64, yes: bool, v: &[u64]| if yes { pick(r, v) } else { 0 };
        let knobs = Knobs {
            lag_per_mille: on(&mut r, profile.lag, &[100, 300, 600]),
            describe_lag_max: on(&mut r, profile.lag, &[1, 3, 8]),
            imds_lag_max: on(&mut r, profile.lag, &[1, 3, 8]),
            late_per_mille: on(&mut r, profile.late, &[100, 300, 600]),
            late_max: on(&mut r, profile.late, &[1, 3, 8]),
            throttle_per_mille: on(&mut r, profile.faults, &[0, 20, 80]),
            ambiguous_per_mille: on(&mut r, profile.faults, &[0, 20, 80]),
            fail_per_mille: on(&mut r, profile.faults, &[0, 20, 80]),
            applied_throttle_per_mille: 0,
        };
        let steps = pick(&mut r, &[400, 800, 1500]);
        let priority_scheduler = pick(&mut r, &[false, true]);
        // Drawn last, so the draws above (every seed's configuration before issue 38) stay.
        let knobs = Knobs {
            applied_throttle_per_mille: on(&mut r, profile.faults, &[0, 20, 80]),
            ..knobs
        };
        // Issue 38's draws, after every earlier one: a seed that draws none of them runs as
        // before (no tape draw happens for a knob that is 0).
        let multi_nic = profile.multi_nic && pick(&mut r, &[false, true]);
        let daemon = DaemonConfig {
            multi_nic,
            ..daemon
        };
        let multi_nic_pod_per_mille = if multi_nic {
            pick(&mut r, &[300, 600])
        } else {
            0
        };
        let checkpoint_loss_per_mille = on(&mut r, profile.disk, &[0, 0, 100, 400]);
        // Security groups for pods, after every earlier draw (IPv4 clusters here).
        let pod_eni = profile.branch
            && matches!(mode, Mode::V4 | Mode::V4Prefix)
            && pick(&mut r, &[false, true]);
        let daemon = DaemonConfig { pod_eni, ..daemon };
        let branch_pod_per_mille = if pod_eni {
            pick(&mut r, &[300, 600])
        } else {
            0
        };
        let branch_cooldown = if pod_eni {
            pick(&mut r, &[0, 5, 60])
        } else {
            0
        };
        let side_loss_per_mille = on(&mut r, profile.disk, &[0, 0, 100, 400]);
        Self {
            seed,
            profile,
            daemon,
            knobs,
            steps,
            retarget_per_mille: if profile.retarget { 500 } else { 0 },
            network_cards: if multi_nic { 2 } else { 1 },
            checkpoint_loss_per_mille,
            side_loss_per_mille,
            multi_nic_pod_per_mille,
            branch_pod_per_mille,
            branch_cooldown,
            priority_scheduler,
            liveness_refusals: std::env::var("SIM_LIVENESS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "seed {} profile {} steps {} scheduler {}\n  ipamd: {}\n  node: {} network card(s), \
             multi-NIC pods {}‰, checkpoint loss {}‰ and side-file loss {}‰ per file and \
             start, branch pods {}‰ \
             (branch ENI cooldown {}s)\n  ec2: {:?}",
            self.seed,
            self.profile.name,
            self.steps,
            if self.priority_scheduler {
                "priority"
            } else {
                "uniform"
            },
            self.daemon.describe(),
            self.network_cards,
            self.multi_nic_pod_per_mille,
            self.checkpoint_loss_per_mille,
            self.side_loss_per_mille,
            self.branch_pod_per_mille,
            self.branch_cooldown,
            self.knobs
        )
    }
}

/// The invariant broken, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: &'static str,
    pub detail: String,
}

/// One run's result.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub violation: Option<Violation>,
    pub trace: Vec<String>,
    pub steps: u64,
    pub tape: Vec<u64>,
    /// Where each step's choices begin on the tape (step-aligned shrinking).
    pub step_starts: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SbState {
    /// ADD in flight.
    Adding,
    /// ADD answered: the pod uses its addresses.
    Live,
    /// Its containers are gone (deleted, died, ADD failed); the kubelet's DEL is due.
    Stopped,
    /// DEL in flight (the pod no longer uses its addresses).
    Deleting,
    /// DEL done.
    Deleted,
}

#[derive(Debug, Clone)]
struct Sandbox {
    cid: String,
    pod: String,
    veth: String,
    state: SbState,
    v4: Option<Ipv4Addr>,
    /// The network card `v4` must be on: 0 for a multi-NIC pod (its first interface is card
    /// 0's); for any other pod the card of the route table ipamd answered (card 0 had none:
    /// upstream's fallback to the next card), which the plugin routes it by.
    v4_card: u32,
    v6: Option<Ipv6Addr>,
    /// Annotated `multi-nic-attachment`: the plugin asks for one interface per card.
    multi_nic: bool,
    /// A multi-NIC pod's addresses on the cards other than 0 (interface 1, 2, …), with the
    /// card.
    cards: Vec<(u32, Ipv4Addr)>,
    /// The instance that answered its ADD.
    served_by: u32,
    /// Its pod object's UID (the runtime's `K8S_POD_UID`).
    uid: String,
    /// A branch pod's VLAN id, from ipamd's answer.
    vlan: Option<u16>,
}

impl Sandbox {
    fn addrs(&self) -> Vec<IpAddr> {
        self.card_addrs().into_iter().map(|(_, ip)| ip).collect()
    }

    /// Every address with the network card it must be on (IPv6: card 0's).
    fn card_addrs(&self) -> Vec<(u32, IpAddr)> {
        self.v4
            .map(|ip| (self.v4_card, IpAddr::V4(ip)))
            .into_iter()
            .chain(self.v6.map(|ip| (0, IpAddr::V6(ip))))
            .chain(self.cards.iter().map(|(c, ip)| (*c, IpAddr::V4(*ip))))
            .collect()
    }

    /// The host veths the plugin wires, one per interface (upstream
    /// `GeneratePodHostVethName`: `<pod>.<index>` past the first), each with its addresses.
    fn interfaces(&self) -> Vec<(String, Vec<IpAddr>)> {
        let first: Vec<IpAddr> = self
            .v4
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.v6.map(IpAddr::V6))
            .collect();
        let mut out = vec![(self.veth.clone(), first)];
        for (i, (_, ip)) in self.cards.iter().enumerate() {
            let index = u32::try_from(i + 1).unwrap_or(u32::MAX);
            out.push((
                dataplane::conventions::host_veth_name_at(VETH_PREFIX, "default", &self.pod, index),
                vec![IpAddr::V4(*ip)],
            ));
        }
        out
    }

    /// Every veth name the plugin may have wired for it (all of a multi-NIC pod's, whatever
    /// it got).
    fn veths(&self, cards: u32) -> Vec<String> {
        let n = if self.multi_nic { cards.max(1) } else { 1 };
        (0..n)
            .map(|i| {
                dataplane::conventions::host_veth_name_at(VETH_PREFIX, "default", &self.pod, i)
            })
            .collect()
    }

    fn name(&self) -> String {
        format!("{}/{}", self.pod, self.cid)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Launched, waiting for the node lock (or the old socket).
    Waiting,
    Starting,
    /// Restored, its loops spawned, about to bind the socket (`run_composed`'s order).
    Binding,
    Serving,
    /// SIGTERM: no new calls; in-flight ones and the current loop passes finish.
    Draining,
}

struct Inst {
    id: u32,
    /// The aws-node pod it runs in (a rolling update makes a new one; the kubelet restarts a
    /// crashed container in the same pod).
    pod: u32,
    cfg: DaemonConfig,
    phase: Phase,
    ipam: Option<Arc<SimIpam>>,
    backend: Option<Arc<Backend>>,
    token: CancellationToken,
    /// The cards its pools serve, 0 first (a reply's interfaces in order).
    cards: Vec<u32>,
}

enum Done {
    Started(Box<Result<Started, String>>),
    Bound,
    Add(Result<AddNetworkReply, tonic::Status>),
    Del(Result<DelNetworkReply, tonic::Status>),
    Loop,
}

#[derive(Debug, Clone)]
enum Op {
    Add(String),
    /// A DEL; true for the plugin undoing an ADD it could not wire.
    Del(String),
}

struct Sim {
    cfg: RunConfig,
    node: Node,
    exec: Executor<Done>,
    instances: Vec<Inst>,
    next_inst: u32,
    next_cfg: DaemonConfig,
    sandboxes: BTreeMap<String, Sandbox>,
    /// Pod name → its newest sandbox.
    pods: BTreeMap<String, String>,
    /// Pods annotated `multi-nic-attachment` (their re-created sandboxes are too).
    multi_nic_pods: BTreeSet<String>,
    /// Branch pods (their re-created objects are too).
    branch_pods: BTreeSet<String>,
    next_pod: u32,
    next_cid: u32,
    inflight: BTreeMap<u64, Op>,
    tenant_enis: Vec<String>,
    step: u64,
    step_starts: Vec<usize>,
    /// The newest aws-node pod.
    aws_node_pod: u32,
    /// aws-node pods that exist and are not being deleted (the kubelet restarts their crashed
    /// container).
    aws_node_pods: BTreeSet<u32>,
    /// Reconcilers `build` restored, for loops spawned once the socket is bound.
    pending_loops: BTreeMap<u32, (Reconciler, Provider)>,
    /// Pool targets drawn at a launch (from the seed, not the tape).
    retarget: SplitMix64,
}

const MAX_PODS: usize = 30;
const INSTANCE_ID_LABEL: &str = "ipamd";

impl Sim {
    fn rng(&self) -> &Rng {
        &self.node.rng
    }

    fn log(&self, msg: impl AsRef<str>) {
        self.node.trace.log(msg);
    }

    fn alive(&self) -> bool {
        !self.instances.is_empty()
    }

    fn serving(&self) -> Option<&Inst> {
        self.instances.iter().find(|i| i.phase == Phase::Serving)
    }

    fn inst_mut(&mut self, id: u32) -> Option<&mut Inst> {
        self.instances.iter_mut().find(|i| i.id == id)
    }

    // ---- ipamd processes ---------------------------------------------------------------

    /// A new ipamd process in aws-node pod `pod`.
    fn launch(&mut self, pod: u32, why: &str) {
        self.next_inst += 1;
        let mut cfg = self.next_cfg.clone();
        if self.cfg.retarget_per_mille > 0
            && self.next_inst > 1
            && self.retarget.next_u64() % 1000 < self.cfg.retarget_per_mille
        {
            cfg.targets = draw_targets(&mut self.retarget, cfg.mode);
            self.next_cfg = cfg.clone();
        }
        self.log(format!(
            "{INSTANCE_ID_LABEL}#{} launched in aws-node pod {pod} ({why}): {}",
            self.next_inst,
            cfg.describe()
        ));
        self.instances.push(Inst {
            id: self.next_inst,
            pod,
            cfg,
            phase: Phase::Waiting,
            ipam: None,
            backend: None,
            token: CancellationToken::new(),
            cards: vec![0],
        });
    }

    /// Starts waiting instances when they may (node lock: once every older one exited;
    /// without it: once none serves), and retires drained ones.
    fn progress(&mut self) {
        let ids: Vec<u32> = self.instances.iter().map(|i| i.id).collect();
        for id in ids {
            let Some(i) = self.instances.iter().find(|i| i.id == id) else {
                continue;
            };
            match i.phase {
                Phase::Waiting => {
                    let may = if self.cfg.profile.lock {
                        // flock: nobody else holds it; waiters take it oldest first.
                        self.instances
                            .iter()
                            .all(|o| o.id == id || (o.phase == Phase::Waiting && o.id > id))
                    } else {
                        self.serving().is_none()
                    };
                    if may {
                        let fut = daemon::start(self.node.clone(), i.cfg.clone());
                        self.exec.spawn(
                            id,
                            self.rng().below(1 << 20),
                            format!("ipamd#{id} start"),
                            async move { Done::Started(Box::new(fut.await)) },
                        );
                        self.inst_mut(id).expect("present").phase = Phase::Starting;
                        self.log(format!("ipamd#{id} starts (reads EC2, host, checkpoint)"));
                    }
                }
                Phase::Draining if self.exec.count_owner(id) == 0 => {
                    self.instances.retain(|i| i.id != id);
                    self.log(format!("ipamd#{id} exited"));
                }
                _ => {}
            }
        }
    }

    fn started(&mut self, id: u32, r: Result<Started, String>) {
        let started = match r {
            Ok(s) => s,
            Err(e) => {
                self.log(format!("ipamd#{id} failed to start and exits: {e}"));
                self.instances.retain(|i| i.id != id);
                return;
            }
        };
        let cluster = self.node.cluster.clone();
        let Some(inst) = self.inst_mut(id) else {
            return;
        };
        inst.backend = Some(daemon::backend(&started.ipam, &inst.cfg, &cluster));
        inst.cards = started.ipam.index.cards();
        inst.ipam = Some(started.ipam.clone());
        inst.phase = Phase::Binding;
        if daemon::LOOPS_BEFORE_BIND {
            self.spawn_loops(id, started.reconciler, started.provider);
        } else {
            self.pending_loops
                .insert(id, (started.reconciler, started.provider));
        }
        let prio = self.rng().below(1 << 20);
        self.exec
            .spawn(id, prio, format!("ipamd#{id} bind"), async {
                super::exec::yield_now().await;
                Done::Bound
            });
    }

    /// The pool loop (with the reconciler `build` restored) and reclaim of instance `id`.
    fn spawn_loops(&mut self, id: u32, reconciler: Reconciler, provider: Provider) {
        let Some(inst) = self.instances.iter().find(|i| i.id == id) else {
            return;
        };
        let Some(ipam) = inst.ipam.clone() else {
            return;
        };
        let cfg = inst.cfg.clone();
        let token = inst.token.clone();
        let tag = format!("ipamd#{id}");
        if cfg.mode != Mode::V6 {
            let host = SimEniHost {
                rng: self.node.rng.clone(),
                trace: self.node.trace.clone(),
                fail_per_mille: cfg.host_fail_per_mille,
            };
            let f = daemon::pool_loop(
                ipam.clone(),
                reconciler,
                Manager::with_host(provider, host)
                    .with_every_ipv6_prefix(cfg.mode == Mode::DualStack),
                cfg.tick,
                token.clone(),
                self.node.trace.clone(),
                tag.clone(),
            );
            let prio = self.rng().below(1 << 20);
            self.exec
                .spawn(id, prio, format!("{tag} pool loop"), async move {
                    f.await;
                    Done::Loop
                });
        }
        if let Some(grace) = cfg.grace {
            let f = daemon::reclaim_loop(
                ipam,
                grace,
                self.node.host.clone(),
                token,
                self.node.trace.clone(),
                tag.clone(),
            );
            let prio = self.rng().below(1 << 20);
            self.exec
                .spawn(id, prio, format!("{tag} reclaim"), async move {
                    f.await;
                    Done::Loop
                });
        }
    }

    fn bound(&mut self, id: u32) {
        if let Some(other) = self.serving() {
            let other = other.id;
            self.log(format!(
                "ipamd#{id} cannot bind: ipamd#{other} serves the socket; exits"
            ));
            self.pending_loops.remove(&id);
            self.crash_quietly(id);
            return;
        }
        if let Some(inst) = self.inst_mut(id)
            && inst.phase == Phase::Binding
        {
            inst.phase = Phase::Serving;
            self.log(format!("ipamd#{id} serves"));
            if let Some((reconciler, provider)) = self.pending_loops.remove(&id) {
                self.spawn_loops(id, reconciler, provider);
            }
        }
    }

    /// SIGKILL: the process's futures are dropped wherever they are.
    fn crash(&mut self, id: u32) {
        self.kill(id, "SIGKILLED");
    }

    /// The process ends with an error (it could not bind): its tasks are dropped.
    fn crash_quietly(&mut self, id: u32) {
        self.kill(id, "exits");
    }

    fn kill(&mut self, id: u32, how: &str) {
        let killed = self.exec.kill_owner(id);
        self.instances.retain(|i| i.id != id);
        self.pending_loops.remove(&id);
        self.node.cloud.forget_callers();
        self.log(format!(
            "ipamd#{id} {how} (in flight: {})",
            killed
                .iter()
                .map(|(_, l)| l.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for (task, _) in killed {
            match self.inflight.remove(&task) {
                Some(Op::Add(cid)) => self.add_failed(&cid, "ipamd gone"),
                Some(Op::Del(cid)) => self.del_done(&cid, "ipamd gone"),
                None => {}
            }
        }
    }

    /// SIGTERM (a rolling update): no new calls, no new assignments; what is in flight
    /// finishes; the process exits when it has.
    fn terminate(&mut self, id: u32) {
        if let Some(i) = self.inst_mut(id) {
            if let Some(ipam) = &i.ipam {
                ipam.begin_shutdown();
            }
            i.token.cancel();
            if matches!(i.phase, Phase::Starting | Phase::Waiting | Phase::Binding) {
                // Not serving yet: it stops where it is.
                self.crash(id);
                return;
            }
            i.phase = Phase::Draining;
        }
        self.log(format!("ipamd#{id} SIGTERM: stops accepting, drains"));
    }

    /// An aws-node pod whose ipamd container is not running (the kubelet restarts it).
    fn restartable(&self) -> Option<u32> {
        self.aws_node_pods
            .iter()
            .rev()
            .find(|p| !self.instances.iter().any(|i| i.pod == **p))
            .copied()
    }

    /// The old aws-node pods of a rolling update are deleted: SIGTERM, never restarted.
    fn delete_old_pods(&mut self) {
        let newest = self.aws_node_pod;
        let old: Vec<u32> = self
            .aws_node_pods
            .iter()
            .copied()
            .filter(|p| *p < newest)
            .collect();
        for pod in old {
            self.aws_node_pods.remove(&pod);
            self.log(format!("aws-node pod {pod} deleted (rolling update)"));
            let ids: Vec<u32> = self
                .instances
                .iter()
                .filter(|i| i.pod == pod && i.phase != Phase::Draining)
                .map(|i| i.id)
                .collect();
            for id in ids {
                self.terminate(id);
            }
        }
    }

    // ---- the kubelet and the plugin ------------------------------------------------------

    fn request_add(&mut self, cid: &str) {
        let sb = self.sandboxes.get(cid).expect("sandbox").clone();
        let Some((id, backend)) = self
            .serving()
            .and_then(|i| i.backend.clone().map(|b| (i.id, b)))
        else {
            self.log(format!("ADD {}: ipamd unreachable", sb.name()));
            if sb.state == SbState::Adding {
                self.add_failed(cid, "ipamd unreachable");
            }
            return;
        };
        let req = AddNetworkRequest {
            client_version: ipamd_proto::BUILD_VERSION.into(),
            k8s_pod_name: sb.pod.clone(),
            k8s_pod_namespace: "default".into(),
            container_id: sb.cid.clone(),
            if_name: "eth0".into(),
            network_name: "aws-cni".into(),
            netns: format!("/var/run/netns/{}", sb.cid),
            requires_multi_nic_attachment: sb.multi_nic,
            k8s_pod_uid: sb.uid.clone(),
            ..Default::default()
        };
        let task = self.exec.spawn(
            id,
            self.rng().below(1 << 20),
            format!("ADD {}", sb.name()),
            async move {
                Done::Add(
                    backend
                        .add_network(tonic::Request::new(req))
                        .await
                        .map(tonic::Response::into_inner),
                )
            },
        );
        self.inflight.insert(task, Op::Add(cid.to_owned()));
        self.log(format!("ADD {} sent to ipamd#{id}", sb.name()));
        if let Some(s) = self.sandboxes.get_mut(cid) {
            s.served_by = id;
        }
    }

    fn request_del(&mut self, cid: &str, why: &str) {
        let sb = self.sandboxes.get(cid).expect("sandbox").clone();
        // Phase 1: what is provably this sandbox's goes first (each of its veths).
        let mut removed = false;
        for veth in sb.veths(self.cfg.network_cards) {
            removed |= self.node.host.teardown(&sb.cid, &veth);
        }
        let Some((id, backend)) = self
            .serving()
            .and_then(|i| i.backend.clone().map(|b| (i.id, b)))
        else {
            self.log(format!(
                "DEL {} ({why}){}: ipamd unreachable, the plugin's DEL succeeds without it",
                sb.name(),
                if removed { ", veth removed" } else { "" }
            ));
            self.del_done(cid, "");
            return;
        };
        self.log(format!(
            "DEL {} ({why}) -> ipamd#{id}{}",
            sb.name(),
            if removed { ", veth removed" } else { "" }
        ));
        let req = DelNetworkRequest {
            client_version: ipamd_proto::BUILD_VERSION.into(),
            k8s_pod_name: sb.pod.clone(),
            k8s_pod_namespace: "default".into(),
            container_id: sb.cid.clone(),
            if_name: "eth0".into(),
            network_name: "aws-cni".into(),
            reason: ipamd_proto::del_reason::POD_DELETED.into(),
            k8s_pod_uid: sb.uid.clone(),
            ..Default::default()
        };
        let task = self.exec.spawn(
            id,
            self.rng().below(1 << 20),
            format!("DEL {}", sb.name()),
            async move {
                Done::Del(
                    backend
                        .del_network(tonic::Request::new(req))
                        .await
                        .map(tonic::Response::into_inner),
                )
            },
        );
        self.inflight.insert(task, Op::Del(cid.to_owned()));
        if let Some(s) = self.sandboxes.get_mut(cid)
            && matches!(s.state, SbState::Live | SbState::Stopped)
        {
            s.state = SbState::Deleting;
        }
    }

    fn add_failed(&mut self, cid: &str, why: &str) {
        if let Some(s) = self.sandboxes.get_mut(cid)
            && s.state == SbState::Adding
        {
            s.state = SbState::Stopped;
            let name = s.name();
            self.log(format!(
                "ADD {name} failed ({why}): the kubelet will DEL it"
            ));
        }
    }

    fn del_done(&mut self, cid: &str, answer: &str) {
        if let Some(s) = self.sandboxes.get_mut(cid) {
            if matches!(s.state, SbState::Deleting | SbState::Stopped) {
                s.state = SbState::Deleted;
            }
            if !answer.is_empty() {
                let name = s.name();
                self.log(format!("DEL {name} answered: {answer}"));
            }
        }
    }

    fn add_answered(&mut self, id: u32, cid: &str, r: Result<AddNetworkReply, tonic::Status>) {
        let reply = match r {
            Ok(reply) if reply.success => reply,
            Ok(_) => return self.add_failed(cid, &format!("ipamd#{id}: Success=false")),
            Err(s) => return self.add_failed(cid, &format!("ipamd#{id}: {}", s.message())),
        };
        let meta = reply
            .ip_allocation_metadata
            .first()
            .cloned()
            .unwrap_or_default();
        let v4: Option<Ipv4Addr> = meta.i_pv4_addr.parse().ok();
        let v6: Option<Ipv6Addr> = meta.i_pv6_addr.parse().ok();
        // the card of the answered table (10000 + 100 × card + device past card 0)
        let v4_card = if self.multi_nic_pods.contains(&self.sandboxes[cid].pod) {
            0
        } else {
            u32::try_from(meta.route_table_id)
                .ok()
                .filter(|t| *t >= 10_000)
                .map_or(0, |t| (t - 10_000) / 100)
        };
        let vlan = u16::try_from(reply.pod_vlan_id).ok().filter(|v| *v != 0);
        // A multi-NIC pod's further interfaces, one per serving card in card order.
        let inst_cards = self
            .instances
            .iter()
            .find(|i| i.id == id)
            .map(|i| i.cards.clone())
            .unwrap_or_default();
        let cards: Vec<(u32, Ipv4Addr)> = reply
            .ip_allocation_metadata
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(i, m)| {
                let card = inst_cards
                    .get(i)
                    .copied()
                    .unwrap_or(u32::try_from(i).unwrap_or(u32::MAX));
                m.i_pv4_addr.parse().ok().map(|ip| (card, ip))
            })
            .collect();
        let sb = self.sandboxes.get(cid).expect("sandbox").clone();
        match sb.state {
            SbState::Adding => {
                let s = self.sandboxes.get_mut(cid).expect("sandbox");
                s.state = SbState::Live;
                s.v4 = v4;
                s.v4_card = v4_card;
                s.v6 = v6;
                s.cards = cards;
                s.served_by = id;
                s.vlan = vlan;
                let (addrs, wired) = self.wire(cid);
                self.log(format!(
                    "ADD {} -> {}{} (ipamd#{id}), wired on {wired}",
                    sb.name(),
                    fmt_addrs(&addrs),
                    vlan.map(|v| format!(" VLAN {v}")).unwrap_or_default(),
                ));
            }
            SbState::Live => {
                if (v4, v4_card, v6, &cards, vlan) != (sb.v4, sb.v4_card, sb.v6, &sb.cards, sb.vlan)
                {
                    self.log(format!(
                        "retried ADD {} got {:?}/{:?}/{:?}, had {:?}/{:?}/{:?}",
                        sb.name(),
                        v4,
                        v6,
                        cards,
                        sb.v4,
                        sb.v6,
                        sb.cards
                    ));
                    // The plugin rewires the pod with what ipamd answered now.
                    let s = self.sandboxes.get_mut(cid).expect("sandbox");
                    s.v4 = v4;
                    s.v4_card = v4_card;
                    s.v6 = v6;
                    s.cards = cards;
                    s.vlan = vlan;
                    self.wire(cid);
                }
            }
            _ => {
                // A retried ADD answered after its sandbox was deleted: the plugin cannot
                // wire a netns that is gone and gives the address back.
                self.log(format!(
                    "late ADD answer for {} (gone): the plugin undoes it",
                    sb.name()
                ));
                self.request_del(cid, "ADD undo");
            }
        }
    }

    /// The plugin wires sandbox `cid`: one veth per interface with its addresses' routes.
    /// Returns every address and the veths.
    fn wire(&self, cid: &str) -> (Vec<IpAddr>, String) {
        let s = &self.sandboxes[cid];
        let mut veths = Vec::new();
        for (veth, ips) in s.interfaces() {
            // A branch pod's address is routed in its VLAN's table (and is the controller's
            // branch ENI's: never host evidence for ipamd, `host_pod_evidence`).
            let ips = if s.vlan.is_some() { Vec::new() } else { ips };
            self.node.host.wire(&s.cid, &veth, &ips);
            veths.push(veth);
        }
        (s.addrs(), veths.join(" "))
    }

    /// A new sandbox of pod `pod`; `new_object`: for a new pod object (a new pod, or one
    /// re-created under the name of a deleted one: a new UID), else for the pod object there
    /// is (the kubelet making another sandbox for it).
    fn new_sandbox(&mut self, pod: String, new_object: bool) -> String {
        self.next_cid += 1;
        let cid = format!("c{}", self.next_cid);
        let veth = dataplane::conventions::host_veth_name(VETH_PREFIX, "default", &pod);
        let uid = match self.node.cluster.uid(&pod) {
            Some(uid) if !new_object => uid,
            _ => {
                self.delete_pod_object(&pod);
                let uid = format!("uid-{cid}");
                self.node
                    .cluster
                    .create_pod(&pod, &uid, self.branch_pods.contains(&pod));
                uid
            }
        };
        self.sandboxes.insert(
            cid.clone(),
            Sandbox {
                cid: cid.clone(),
                pod: pod.clone(),
                veth,
                state: SbState::Adding,
                v4: None,
                v4_card: 0,
                v6: None,
                multi_nic: self.multi_nic_pods.contains(&pod),
                cards: Vec::new(),
                served_by: 0,
                uid,
                vlan: None,
            },
        );
        self.pods.insert(pod, cid.clone());
        cid
    }

    /// The pod object `pod` is deleted from the API server (its branch ENI cools).
    fn delete_pod_object(&mut self, pod: &str) {
        let now = self.node.clock.secs();
        if let Some(b) = self
            .node
            .cluster
            .delete_pod(pod, now, self.cfg.branch_cooldown)
        {
            self.log(format!(
                "controller: pod {pod} gone, branch ENI {} (VLAN {}, {}) cools {}s",
                b.eni, b.vlan, b.ip, self.cfg.branch_cooldown
            ));
        }
    }

    fn in_state(&self, states: &[SbState]) -> Vec<String> {
        self.sandboxes
            .values()
            .filter(|s| states.contains(&s.state))
            .map(|s| s.cid.clone())
            .collect()
    }

    fn choose(&self, v: &[String]) -> Option<String> {
        if v.is_empty() {
            return None;
        }
        Some(v[self.rng().index(v.len())].clone())
    }

    // ---- time ----------------------------------------------------------------------------

    async fn second(&mut self) {
        self.node.clock.advance(Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        self.node.cloud.apply_due();
        let now = self.node.clock.secs();
        for (eni, vlan) in self.node.cluster.free_due(&self.node.cloud.fake, now) {
            self.node
                .cloud
                .record(&format!("controller deletes branch ENI {eni}"));
            self.log(format!(
                "controller: branch ENI {eni} deleted, VLAN {vlan} free for the next branch pod"
            ));
        }
    }

    fn poll_one(&mut self) -> bool {
        let id = if self.cfg.priority_scheduler {
            let Some(id) = self.exec.highest_runnable() else {
                return false;
            };
            if self.rng().chance(50) {
                let prio = self.rng().below(1 << 20);
                self.exec.reprioritize(id, prio);
            }
            id
        } else {
            let runnable = self.exec.runnable();
            if runnable.is_empty() {
                return false;
            }
            runnable[self.rng().index(runnable.len())]
        };
        let label = self.exec.label(id).unwrap_or_default().to_owned();
        self.node.trace.set_actor(&label);
        let polled = self.exec.poll(id);
        self.node.trace.set_actor("");
        if let Some((owner, _label, out)) = polled {
            let op = self.inflight.remove(&id);
            match out {
                Done::Started(r) => self.started(owner, *r),
                Done::Bound => self.bound(owner),
                Done::Add(r) => {
                    if let Some(Op::Add(cid)) = op {
                        self.add_answered(owner, &cid, r);
                    }
                }
                Done::Del(r) => {
                    if let Some(Op::Del(cid)) = op {
                        let answer = match &r {
                            Ok(reply) => {
                                let m = reply.ip_allocation_metadata.first();
                                format!(
                                    "released {}",
                                    m.map(|m| format!("{} {}", m.i_pv4_addr, m.i_pv6_addr))
                                        .unwrap_or_default()
                                        .trim()
                                )
                            }
                            Err(s) => s.message().to_owned(),
                        };
                        self.del_done(&cid, &answer);
                    }
                }
                Done::Loop => {}
            }
        }
        true
    }

    // ---- one step --------------------------------------------------------------------------

    /// `n` seconds pass: each second every runnable task runs (in seeded order) until none
    /// is; the invariant is checked after every poll.
    async fn pass(&mut self, n: u64) -> Result<(), Violation> {
        for _ in 0..n {
            self.second().await;
            self.progress();
            self.check()?;
            for _ in 0..400 {
                if !self.poll_one() {
                    break;
                }
                self.progress();
                self.check()?;
            }
        }
        Ok(())
    }

    async fn step(&mut self) -> Result<(), Violation> {
        let p = self.cfg.profile;
        let live = self.in_state(&[SbState::Live]);
        let stopped = self.in_state(&[SbState::Stopped]);
        let deleted = self.in_state(&[SbState::Deleted, SbState::Deleting]);
        let adding = self.in_state(&[SbState::Adding]);
        let recreatable: Vec<String> = self
            .pods
            .iter()
            .filter(|(_, cid)| {
                matches!(
                    self.sandboxes[*cid].state,
                    SbState::Stopped | SbState::Deleting | SbState::Deleted
                )
            })
            .map(|(pod, _)| pod.clone())
            .collect();
        let runnable = !self.exec.runnable().is_empty();
        let active = self
            .sandboxes
            .values()
            .filter(|s| matches!(s.state, SbState::Live | SbState::Adding))
            .count();
        let b = |c: bool, w: u64| if c { w } else { 0 };
        let mid = self.node.cloud.mid_mutation();
        // Security groups for pods (weights 0 without it: older seeds draw as before).
        let sgp = self.cfg.daemon.pod_eni;
        let no_trunk = sgp && self.node.cluster.trunk().is_none();
        let unannotated = if sgp {
            self.node.cluster.unannotated()
        } else {
            Vec::new()
        };
        // Pods whose object lives on while their newest sandbox is gone (it died, or its ADD
        // failed): the kubelet makes another sandbox for the same object.
        let resandbox: Vec<String> = if sgp {
            self.pods
                .iter()
                .filter(|(pod, cid)| {
                    let sb = &self.sandboxes[*cid];
                    matches!(
                        sb.state,
                        SbState::Stopped | SbState::Deleting | SbState::Deleted
                    ) && self.node.cluster.uid(pod).as_ref() == Some(&sb.uid)
                })
                .map(|(pod, _)| pod.clone())
                .collect()
        } else {
            Vec::new()
        };
        let weights = [
            b(runnable, 60),                                    // 0 poll a task
            if runnable { 8 } else { 40 },                      // 1 a second passes
            2,                                                  // 2 a while passes
            b(active < MAX_PODS, 8),                            // 3 new pod
            b(!live.is_empty(), 6),                             // 4 pod deleted
            b(!stopped.is_empty(), 5),                          // 5 kubelet DELs a stopped sandbox
            b(!deleted.is_empty(), 2),                          // 6 DEL retried
            b(!live.is_empty() || !adding.is_empty(), 1),       // 7 ADD retried
            b(!recreatable.is_empty() && active < MAX_PODS, 3), // 8 same-name re-create
            b(p.perturb && !live.is_empty(), 1),                // 9 sandbox dies
            b(p.perturb && !live.is_empty(), 2),                // 10 a route deleted
            b(p.perturb, 1),                                    // 11 IPv4 routes flushed
            b(
                p.crashes && self.alive(),
                if mid { 4 * p.churn } else { p.churn },
            ), // 12 SIGKILL
            b(
                p.updates && self.alive(),
                if mid { 2 * p.churn } else { p.churn },
            ), // 13 rolling update
            b(self.restartable().is_some(), 30),                // 14 kubelet restarts ipamd
            b(p.tenant && self.tenant_enis.len() < 4, 2),       // 15 node B takes addresses
            b(p.tenant && !self.tenant_enis.is_empty(), 1),     // 16 node B gives them back
            b(self.aws_node_pods.len() > 1, 3 * p.churn),       // 17 old aws-node pod deleted
            b(no_trunk, 3),                                     // 18 controller attaches the trunk
            b(!unannotated.is_empty(), 6),                      // 19 controller annotates a pod
            b(!resandbox.is_empty() && active < MAX_PODS, 3),   // 20 kubelet: another sandbox
        ];
        match self.rng().weighted(&weights) {
            0 => {
                self.poll_one();
            }
            1 => self.second().await,
            2 => {
                let n = self.rng().range(2, 90);
                self.log(format!("... {n}s pass"));
                self.pass(n).await?;
            }
            3 => {
                self.next_pod += 1;
                let pod = format!("p{}", self.next_pod);
                // No draw unless the run has multi-NIC pods (older seeds run as before).
                if self.rng().chance(self.cfg.multi_nic_pod_per_mille) {
                    self.multi_nic_pods.insert(pod.clone());
                } else if self.rng().chance(self.cfg.branch_pod_per_mille) {
                    // (no draw without ENABLE_POD_ENI)
                    self.branch_pods.insert(pod.clone());
                }
                let cid = self.new_sandbox(pod, true);
                self.request_add(&cid);
            }
            4 => {
                let cid = self.choose(&live).expect("live");
                let s = self.sandboxes.get_mut(&cid).expect("sandbox");
                s.state = SbState::Stopped;
                let name = s.name();
                let (pod, uid) = (s.pod.clone(), s.uid.clone());
                if self.node.cluster.uid(&pod) == Some(uid) {
                    self.delete_pod_object(&pod);
                }
                if self.rng().chance(500) {
                    // Containers stopped; the sandbox (netns, veth) and its DEL come later.
                    self.log(format!(
                        "pod {name} deleted: containers gone, sandbox DEL later"
                    ));
                } else {
                    self.request_del(&cid, "pod deleted");
                }
            }
            5 => {
                let cid = self.choose(&stopped).expect("stopped");
                self.request_del(&cid, "kubelet clean-up");
            }
            6 => {
                let cid = self.choose(&deleted).expect("deleted");
                self.request_del(&cid, "retried");
            }
            7 => {
                let mut v = live.clone();
                v.extend(adding.iter().cloned());
                let cid = self.choose(&v).expect("some");
                let name = self.sandboxes[&cid].name();
                self.log(format!("ADD {name} retried"));
                self.request_add(&cid);
            }
            8 => {
                let pod = self.choose(&recreatable).expect("pod");
                let cid = self.new_sandbox(pod.clone(), true);
                self.log(format!("pod {pod} re-created as {cid} (same name)"));
                self.request_add(&cid);
            }
            9 => {
                let cid = self.choose(&live).expect("live");
                let s = self.sandboxes.get_mut(&cid).expect("sandbox");
                s.state = SbState::Stopped;
                let (name, veths) = (s.name(), s.veths(self.cfg.network_cards));
                for veth in &veths {
                    self.node.host.kill(&cid, veth);
                }
                self.log(format!(
                    "sandbox {name} died: veth {} gone (no DEL yet)",
                    veths.join(" ")
                ));
            }
            10 => {
                let cid = self.choose(&live).expect("live");
                let s = &self.sandboxes[&cid];
                let addrs = s.addrs();
                let name = s.name();
                if !addrs.is_empty() {
                    let ip = addrs[self.rng().index(addrs.len())];
                    if self.node.host.del_route(ip) {
                        self.log(format!("host route of {ip} ({name}) deleted; veth kept"));
                    }
                }
            }
            11 => {
                let n = self.node.host.flush_v4();
                if n > 0 {
                    self.log(format!("{n} IPv4 pod routes flushed from the main table"));
                }
            }
            12 => {
                // Mostly the newest instance; the old one of an overlap now and then.
                let ids: Vec<u32> = self.instances.iter().map(|i| i.id).collect();
                let id = if self.rng().chance(800) {
                    ids[self.rng().index(ids.len())]
                } else {
                    *ids.last().expect("alive")
                };
                let pod = self.instances.iter().find(|i| i.id == id).map(|i| i.pod);
                self.crash(id);
                if let Some(pod) = pod
                    && self.aws_node_pods.contains(&pod)
                    && self.rng().chance(500)
                {
                    self.launch(pod, "container restarted by the kubelet");
                }
            }
            13 => {
                self.aws_node_pod += 1;
                let pod = self.aws_node_pod;
                self.aws_node_pods.insert(pod);
                self.log(format!(
                    "rolling update (maxSurge): aws-node pod {pod} created beside the old one"
                ));
                self.launch(pod, "rolling update");
                if self.rng().chance(500) {
                    self.delete_old_pods();
                }
            }
            14 => {
                let pod = self.restartable().expect("a pod without its container");
                self.launch(pod, "container restarted by the kubelet");
            }
            15 => {
                let k = u32::try_from(self.rng().range(1, 6)).unwrap_or(1);
                if self.node.cloud.fake.subnet_free() > usize::try_from(k).unwrap_or(0) + 1 {
                    let id = self
                        .node
                        .cloud
                        .fake
                        .add_foreign_eni(Default::default(), k, None);
                    let e = self.node.cloud.fake.eni(&id).expect("created");
                    self.node
                        .cloud
                        .record(&format!("node B takes {:?}", e.secondary_ips));
                    self.log(format!(
                        "node B takes {} (its pods use them)",
                        fmt_addrs(
                            &e.secondary_ips
                                .iter()
                                .map(|ip| IpAddr::V4(*ip))
                                .collect::<Vec<_>>()
                        )
                    ));
                    self.tenant_enis.push(id);
                }
            }
            17 => self.delete_old_pods(),
            16 => {
                let i = self.rng().index(self.tenant_enis.len());
                let id = self.tenant_enis.remove(i);
                self.node.cloud.fake.remove_eni(&id);
                self.node.cloud.record("node B releases addresses");
                self.log(format!("node B releases the addresses of {id}"));
            }
            18 => {
                let max = self.cfg.daemon.targets.max_enis;
                match self.node.cluster.attach_trunk(&self.node.cloud.fake, max) {
                    Some(id) => {
                        self.node
                            .cloud
                            .record(&format!("controller attaches trunk {id}"));
                        self.log(format!("controller: trunk ENI {id} attached"));
                    }
                    None => self.log("controller: no free ENI slot for the trunk"),
                }
            }
            19 => {
                let pod = self.choose(&unannotated).expect("pod");
                match self.node.cluster.annotate(&self.node.cloud.fake, &pod) {
                    Some(b) => {
                        self.node
                            .cloud
                            .record(&format!("controller creates branch ENI {}", b.eni));
                        self.log(format!(
                            "controller: pod {pod} annotated: branch ENI {} VLAN {} {}",
                            b.eni, b.vlan, b.ip
                        ));
                    }
                    None => self.log(format!(
                        "controller: pod {pod} not annotated (no trunk or subnet full)"
                    )),
                }
            }
            20 => {
                let pod = self.choose(&resandbox).expect("pod");
                let cid = self.new_sandbox(pod.clone(), false);
                self.log(format!("kubelet: another sandbox {cid} for pod {pod}"));
                self.request_add(&cid);
            }
            _ => unreachable!(),
        }
        self.progress();
        Ok(())
    }

    // ---- the invariant -------------------------------------------------------------------

    fn check(&self) -> Result<(), Violation> {
        let v = |kind, detail: String| Err(Violation { kind, detail });
        let me = self.node.cloud.fake.instance_id();
        let enis = self.node.cloud.fake.all_enis();
        // EC2 never assigns an address (or /80) to two ENIs.
        let mut where4: BTreeMap<Ipv4Addr, String> = BTreeMap::new();
        let mut where6: BTreeMap<ipnet::Ipv6Net, String> = BTreeMap::new();
        for e in &enis {
            let mut blocks = e.pod_cidrs();
            blocks.push(Ipv4Net::from(e.primary_ip));
            for c in blocks {
                for ip in every(c) {
                    if let Some(other) = where4.insert(ip, e.eni_id.clone()) {
                        return v(
                            "ec2-double-assignment",
                            format!("EC2 assigns {ip} to {other} and {}", e.eni_id),
                        );
                    }
                }
            }
            for p in &e.ipv6_prefixes {
                if let Some(other) = where6.insert(*p, e.eni_id.clone()) {
                    return v(
                        "ec2-double-assignment",
                        format!("EC2 delegates {p} to {other} and {}", e.eni_id),
                    );
                }
            }
        }
        // The trunk is never assigned from (it carries the branch ENIs' VLANs only).
        if let Some(t) = enis
            .iter()
            .find(|e| e.interface_type == "trunk" && !e.pod_cidrs().is_empty())
        {
            return v(
                "trunk-assigned",
                format!(
                    "the trunk ENI {} has pod addresses {:?}",
                    t.eni_id,
                    t.pod_cidrs()
                ),
            );
        }
        // The network card an ENI is attached to this node at (None: not attached here).
        let card_of = |eni: &str| {
            enis.iter()
                .find(|e| e.eni_id == eni)
                .and_then(|e| e.attachment.as_ref())
                .filter(|a| a.instance_id == me)
                .map(|a| a.network_card)
        };
        let ours = |eni: &str| card_of(eni).is_some();
        let ec2_of = |ip: Ipv4Addr| {
            where4.get(&ip).map_or_else(
                || "free in the subnet".to_owned(),
                |e| {
                    if self.tenant_enis.contains(e) {
                        format!("on {e}, node B's")
                    } else if ours(e) {
                        format!("on {e}, attached to this node")
                    } else {
                        format!("on {e}, not attached to this node")
                    }
                },
            )
        };
        // Every live pod: its own addresses, really this node's in EC2.
        let live: Vec<&Sandbox> = self
            .sandboxes
            .values()
            .filter(|s| s.state == SbState::Live)
            .collect();
        self.node
            .disk
            .set_live(live.iter().flat_map(|s| s.card_addrs()).collect());
        let mut holder: BTreeMap<IpAddr, &Sandbox> = BTreeMap::new();
        let mut vlans: BTreeMap<u16, &Sandbox> = BTreeMap::new();
        for s in &live {
            if let Some(vlan) = s.vlan
                && let Some(o) = vlans.insert(vlan, s)
            {
                return v(
                    "vlan-shared",
                    format!(
                        "VLAN {vlan} is used by live branch pods {} and {}",
                        o.name(),
                        s.name()
                    ),
                );
            }
            for ip in s.addrs() {
                if let Some(o) = holder.insert(ip, s) {
                    return v(
                        "two-live-pods",
                        format!(
                            "{ip} is used by {} (ADD answered by ipamd#{}) and {} (ipamd#{})",
                            o.name(),
                            o.served_by,
                            s.name(),
                            s.served_by
                        ),
                    );
                }
            }
            let v4s = s
                .card_addrs()
                .into_iter()
                .filter_map(|(card, ip)| match ip {
                    IpAddr::V4(ip) => Some((card, ip)),
                    IpAddr::V6(_) => None,
                });
            for (card, ip) in v4s {
                if s.vlan.is_some() {
                    // A branch pod's address is its branch ENI's, attached to the trunk.
                    let on = where4
                        .get(&ip)
                        .and_then(|e| enis.iter().find(|x| x.eni_id == *e));
                    if on.is_none_or(|e| e.interface_type != "branch") {
                        return v(
                            "branch-address-lost",
                            format!(
                                "{ip} of live branch pod {} (ipamd#{}) is {} in EC2",
                                s.name(),
                                s.served_by,
                                ec2_of(ip)
                            ),
                        );
                    }
                    continue;
                }
                match where4.get(&ip) {
                    Some(e) if self.tenant_enis.contains(e) => {
                        return v(
                            "two-nodes",
                            format!(
                                "{ip} of live pod {} (ipamd#{}) is used by node B's pods ({e})",
                                s.name(),
                                s.served_by
                            ),
                        );
                    }
                    Some(e) if card_of(e) == Some(card) => {}
                    Some(e) if ours(e) => {
                        return v(
                            "wrong-card",
                            format!(
                                "{ip}, live pod {}'s card-{card} address (ipamd#{}), is on {e}, \
                                 attached to this node at network card {:?}",
                                s.name(),
                                s.served_by,
                                card_of(e)
                            ),
                        );
                    }
                    _ => {
                        return v(
                            "not-assigned-to-node",
                            format!(
                                "{ip} of live pod {} (ipamd#{}) is {} in EC2",
                                s.name(),
                                s.served_by,
                                ec2_of(ip)
                            ),
                        );
                    }
                }
            }
            if let Some(ip) = s.v6 {
                let on = enis
                    .iter()
                    .find(|e| e.ipv6_prefixes.iter().any(|p| p.contains(&ip)));
                if !on.is_some_and(|e| ours(&e.eni_id)) {
                    return v(
                        "not-assigned-to-node",
                        format!(
                            "{ip} of live pod {} (ipamd#{}) is in no /80 of this node in EC2 ({:?})",
                            s.name(),
                            s.served_by,
                            on.map(|e| e.eni_id.clone())
                        ),
                    );
                }
            }
        }
        let refused = self.node.cloud.refused_in_a_row();
        if self.cfg.liveness_refusals > 0 && refused >= self.cfg.liveness_refusals {
            return v(
                "liveness",
                format!("EC2 refused the pool's address assignments {refused} times in a row"),
            );
        }
        // The serving ipamd holds every live pod's addresses (never free, never another's
        // to hand out).
        if let Some(inst) = self.serving()
            && let Some(ipam) = &inst.ipam
        {
            // (card, address): each card's pool holds its own.
            let mut held: BTreeSet<(u32, IpAddr)> = BTreeSet::new();
            for card in ipam.index.cards() {
                for e in ipam.index.allocations(ipamd::ipam::Scope::V4OfCard(card)) {
                    if let Some(ip) = e.ip() {
                        held.insert((card, ip));
                    }
                }
            }
            for e in ipam.index.allocations(ipamd::ipam::Scope::V6) {
                if let Some(ip) = e.ip() {
                    held.insert((0, ip));
                }
            }
            // Any card's pool may hold it: start-up gives host evidence in no pool's CIDRs
            // (a Describe that lags behind the card's assign) to card 0's, kept pending.
            let held_any: BTreeSet<IpAddr> = held.iter().map(|(_, ip)| *ip).collect();
            for s in &live {
                if s.vlan.is_some() {
                    // The controller's address: never in a pool.
                    if let Some(ip) = s.addrs().into_iter().find(|ip| held_any.contains(ip)) {
                        return v(
                            "branch-address-in-pool",
                            format!(
                                "{ip} of live branch pod {} is in serving ipamd#{}'s pool",
                                s.name(),
                                inst.id
                            ),
                        );
                    }
                    continue;
                }
                for (card, ip) in s.card_addrs() {
                    if !held_any.contains(&ip) {
                        let routed = self.node.host.routed(ip);
                        let link = self.node.host.has_link(&s.veth);
                        let file = self.node.checkpoints.get(card as usize);
                        let in_checkpoint = file
                            .and_then(SimCheckpoint::snapshot)
                            .and_then(|d| {
                                d.allocations
                                    .into_iter()
                                    .find(|e| e.ip() == Some(ip))
                                    .map(|e| e.key.to_string())
                            })
                            .unwrap_or_else(|| "absent".into());
                        return v(
                            "live-address-not-held",
                            format!(
                                "{ip} (card {card}) of live pod {} (ADD answered by ipamd#{}) is \
                                 not held by serving ipamd#{} (host: route {}, veth {}; {} now: \
                                 {})",
                                s.name(),
                                s.served_by,
                                inst.id,
                                if routed { "present" } else { "gone" },
                                if link { "present" } else { "gone" },
                                file.map_or("no file", SimCheckpoint::name),
                                in_checkpoint,
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    async fn run(&mut self) -> Option<Violation> {
        self.launch(1, "node boots");
        self.progress();
        for step in 1..=self.cfg.steps {
            self.step = step;
            self.step_starts.push(self.node.rng.pos());
            self.node.trace.set_step(step);
            if let Err(v) = self.step().await {
                return Some(v);
            }
            if let Err(v) = self.check() {
                return Some(v);
            }
        }
        // Quiet end: every instance gets to run, time passes (reclaim, cooldowns, reconcile).
        self.log("end: quiet for 120s");
        if let Some(pod) = self.restartable() {
            self.launch(pod, "container restarted by the kubelet");
        }
        self.step += 1;
        self.node.trace.set_step(self.step);
        self.pass(120).await.err()
    }
}

/// Every address of a block (a /28's sixteen: all usable for pods).
fn every(c: Ipv4Net) -> impl Iterator<Item = Ipv4Addr> {
    let a = u32::from(c.network());
    let b = u32::from(c.broadcast());
    (a..=b).map(Ipv4Addr::from)
}

fn fmt_addrs(v: &[IpAddr]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cfg` on `tape` in a fresh paused runtime. A panic inside ipamd is a violation too.
pub fn run(cfg: &RunConfig, tape: Tape) -> Outcome {
    let clock = SimClock::new();
    let trace = Trace::new(clock.clone());
    let rng = Rng::new(tape);
    let fake = if cfg.network_cards > 1 {
        // An m5.large's ENIs and addresses on each of `network_cards` cards: a type the
        // built-in limits table does not know, so the provider asks (the fake's)
        // DescribeInstanceTypes.
        let m5 = ipamd::aws::limits::lookup("m5.large").expect("m5.large in table");
        FakeCloud::new(
            "sim9.multicard",
            ipamd::aws::InstanceTypeLimits {
                network_cards: cfg.network_cards,
                ..m5
            },
            "198.18.0.0/24",
        )
    } else {
        FakeCloud::m5_large()
    };
    let cloud = Arc::new(SimCloud::new(
        fake,
        rng.clone(),
        clock.clone(),
        trace.clone(),
        cfg.knobs.clone(),
    ));
    let node = Node {
        cloud,
        host: SimHost::default(),
        checkpoints: (0..cfg.network_cards).map(SimCheckpoint::new).collect(),
        cluster: super::cluster::SimCluster::default(),
        disk: DiskFaults::new(cfg.checkpoint_loss_per_mille, cfg.side_loss_per_mille),
        clock,
        rng: rng.clone(),
        trace: trace.clone(),
    };
    let mut sim = Sim {
        cfg: cfg.clone(),
        node,
        exec: Executor::default(),
        instances: Vec::new(),
        next_inst: 0,
        next_cfg: cfg.daemon.clone(),
        sandboxes: BTreeMap::new(),
        pods: BTreeMap::new(),
        multi_nic_pods: BTreeSet::new(),
        branch_pods: BTreeSet::new(),
        next_pod: 0,
        next_cid: 0,
        inflight: BTreeMap::new(),
        tenant_enis: Vec::new(),
        step: 0,
        step_starts: Vec::new(),
        pending_loops: BTreeMap::new(),
        aws_node_pod: 1,
        aws_node_pods: [1].into(),
        retarget: SplitMix64::new(cfg.seed ^ 0x7e7a_2ae7),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let v = rt.block_on(sim.run());
        (v, sim.step, std::mem::take(&mut sim.step_starts))
    }));
    let (violation, steps, step_starts) = match result {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            (
                Some(Violation {
                    kind: "panic",
                    detail: msg,
                }),
                0,
                Vec::new(),
            )
        }
    };
    drop(rt);
    Outcome {
        violation,
        trace: trace.lines(),
        steps,
        tape: rng.used(),
        step_starts,
    }
}
