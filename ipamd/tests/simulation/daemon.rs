//! One ipamd process of the simulation: the real `Ipam` (checkpoint restore, host evidence,
//! IPv6 init), the real `rpc::Backend` (ADD/DEL as the plugin's gRPC calls reach it), and the
//! production loop bodies: `pool::run::pass` (the real `Manager` and `Reconciler`) and
//! `reclaim::round` (the real `Reclaimer`), with the host read from `SimHost` instead of the
//! kernel. Only the waits between passes are the simulation's: their `select!`s are `biased`
//! here (tokio's unbiased one draws from a per-process random seed, which a seeded run must not
//! depend on), mirroring `pool::run::run` and `reclaim::run`.

use std::sync::Arc;
use std::time::Duration;

use ipamd::aws::provider::{Ec2Provider, ProviderSettings};
use ipamd::config::AddressFamily;
use ipamd::datastore::checkpoint::Checkpoint;
use ipamd::ipam::{Ipam, IpamSettings};
use ipamd::metrics::Metrics;
use ipamd::pool::ec2_port::NodeDescription;
use ipamd::pool::policy::Targets;
use ipamd::pool::reconciler::{Outcome, Reconciler};
use ipamd::pool::run::{self, manager::Manager};
use ipamd::reclaim::{self, DEL_SEEN_PERIOD, PodRules, Reclaimer};
use ipamd::rpc::{Backend, ReplySettings};
use tokio_util::sync::CancellationToken;

use super::cloud::{SimCloud, cidrs_str};
use super::cluster::{SimCluster, SimLinks};
use super::disk::{DiskFaults, SimCheckpoint};
use super::exec::yield_now;
use super::host::{SimEniHost, SimHost};
use super::rng::Rng;
use super::trace::{SimClock, Trace};

pub type Provider = Ec2Provider<SimCloud, SimCloud>;
pub type SimIpam = Ipam;

/// The pods' address family and the pool's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// IPv4, secondary /32s.
    V4,
    /// IPv4, /28 prefixes (`ENABLE_PREFIX_DELEGATION`).
    V4Prefix,
    /// IPv4 pool, each pod also a /128 of its ENI's /80 (`ENABLE_DUAL_STACK_PODS`).
    DualStack,
    /// Upstream's IPv6 mode: /128s of the primary ENI's /80, no pool.
    V6,
}

impl Mode {
    pub fn family(self) -> AddressFamily {
        match self {
            Self::V4 | Self::V4Prefix => AddressFamily::V4,
            Self::DualStack => AddressFamily::DualStack,
            Self::V6 => AddressFamily::V6,
        }
    }
}

/// What one ipamd process is configured with (may change across a rollout).
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub mode: Mode,
    pub targets: Targets,
    pub cooldown: Duration,
    /// `IPAMD_RECLAIM_UNWIRED_SECONDS` (None: 0, off).
    pub grace: Option<Duration>,
    pub tick: Duration,
    pub add_wait: Duration,
    pub host_fail_per_mille: u64,
    /// `ENABLE_MULTI_NIC`.
    pub multi_nic: bool,
    /// `ENABLE_POD_ENI` (security groups for pods): a trunk slot kept, every ADD reads its
    /// pod, branch pods answered from their annotation.
    pub pod_eni: bool,
}

impl DaemonConfig {
    pub fn describe(&self) -> String {
        let t = &self.targets;
        format!(
            "{:?} WARM_ENI_TARGET={} WARM_IP_TARGET={} MINIMUM_IP_TARGET={} WARM_PREFIX_TARGET={} \
             IP_COOLDOWN_PERIOD={}s reclaim={:?} tick={:?} add_wait={:?}{}{}",
            self.mode,
            t.warm_eni,
            t.warm_ip,
            t.minimum_ip,
            t.warm_prefix,
            self.cooldown.as_secs(),
            self.grace,
            self.tick,
            self.add_wait,
            if self.multi_nic {
                " ENABLE_MULTI_NIC=true"
            } else {
                ""
            },
            if self.pod_eni {
                " ENABLE_POD_ENI=true"
            } else {
                ""
            }
        )
    }
}

/// What outlives an ipamd process: EC2, the host, the checkpoint files (one per network card
/// of the instance, each with its side file).
#[derive(Debug, Clone)]
pub struct Node {
    pub cloud: Arc<SimCloud>,
    pub host: SimHost,
    /// Indexed by network card.
    pub checkpoints: Vec<SimCheckpoint>,
    /// The API server's pods and the VPC Resource Controller (security groups for pods).
    pub cluster: SimCluster,
    /// What may happen to them before a start reads them.
    pub disk: DiskFaults,
    pub clock: Arc<SimClock>,
    pub rng: Rng,
    pub trace: Trace,
}

pub const VETH_PREFIX: &str = "eni";

/// Whether the pool loop and reclaim start before the socket is bound (`run_composed` before
/// issue 28 finding 3's fix) or after (`Daemon::serve`: bind first).
pub const LOOPS_BEFORE_BIND: bool = false;

/// The cards whose pools serve pods, 0 first: `lib.rs::serving_cards` (every card of the
/// instance with `ENABLE_MULTI_NIC` in an IPv4 cluster, card 0 alone otherwise; the simulation
/// attaches no EFA ENI).
pub fn pool_cards(cfg: &DaemonConfig, network_cards: u32) -> Vec<u32> {
    let more = cfg.multi_nic && cfg.mode.family() == AddressFamily::V4;
    std::iter::once(0)
        .chain((1..network_cards).filter(|_| more))
        .collect()
}

/// ipamd's start-up as `run` → `build` does it on EC2: identity and ONE Describe (node init),
/// then the host read, then every serving card's checkpoint restore (`Ipam::start_pools`, one
/// pool per card with its own file, as `build` makes them), then IPv6 mode's /80, then the
/// reconciler's restore of the releases recorded before the restart. No socket is served
/// before this returns.
pub async fn start(node: Node, cfg: DaemonConfig) -> Result<Started, String> {
    let settings = ProviderSettings {
        cluster_name: "sim".into(),
        additional_tags: Default::default(),
        // Few attempts: their jittered sleeps (rand, not the tape) then always end within the
        // harness's one-second quantum, so a run stays a function of its seed.
        imds_wait_attempts: 3,
        delete_attempts: 2,
        manage_untagged: true,
        imds_only: false,
        // upstream's default: the fake's primary subnet is untagged, so every new ENI still
        // goes there (DescribeSubnets is answered outside the tape, as subnet_zone)
        subnet_discovery: true,
    };
    let provider = Ec2Provider::new(node.cloud.clone(), node.cloud.clone(), settings);
    provider
        .identity()
        .await
        .map_err(|e| format!("identity: {e}"))?;
    provider
        .prime()
        .await
        .map_err(|e| format!("node init: {e}"))?;
    let network_cards = u32::try_from(node.checkpoints.len()).unwrap_or(1);
    let cards = pool_cards(&cfg, network_cards);
    // The files and the host are read at one moment (no await between): what may happen to
    // a file is decided against the host read with it.
    for card in &cards {
        node.disk.strike(
            &node.checkpoints[*card as usize],
            *card,
            &node.host,
            &node.rng,
            &node.trace,
        );
    }
    let evidence = node.host.evidence();
    let files: Vec<String> = cards
        .iter()
        .map(|c| node.checkpoints[*c as usize].describe())
        .collect();
    node.trace.log(format!(
        "    reads the checkpoint ({}) and {} host routes",
        files.join(", "),
        evidence.len()
    ));
    let settings = IpamSettings {
        targets: cfg.targets.clone(),
        add_wait_timeout: cfg.add_wait,
        busy_pool_wait: ipamd::ipam::BUSY_POOL_WAIT,
        veth_prefix: VETH_PREFIX.into(),
        provisioning: true,
    };
    let described = NodeDescription::describe(&provider)
        .await
        .map_err(|e| format!("start: {e}"))?;
    let pools: Vec<(u32, Box<dyn Checkpoint>)> = cards
        .iter()
        .map(|c| {
            let f: Box<dyn Checkpoint> = Box::new(node.checkpoints[*c as usize].clone());
            (*c, f)
        })
        .collect();
    let (ipam, outcomes) = Ipam::start_pools(
        described,
        settings,
        cfg.cooldown,
        pools,
        move || Ok(evidence),
        node.clock.clone(),
        Arc::new(Metrics::new()),
    )
    .map_err(|e| format!("start: {e}"))?;
    let one = outcomes.len() == 1;
    for (card, outcome) in outcomes {
        if one {
            node.trace.log(format!("    restore: {outcome:?}"));
        } else {
            node.trace
                .log(format!("    restore of card {card}: {outcome:?}"));
        }
    }
    if cfg.mode == Mode::V6 {
        let p = ipamd::pool::run::init_ipv6_mode(&ipam, &provider)
            .await
            .map_err(|e| format!("IPv6 init: {e}"))?;
        node.trace
            .log(format!("    IPv6 mode: pods from {}", p.net));
    }
    // `build`: a trunking-capable instance with `ENABLE_POD_ENI` keeps an ENI slot for the
    // trunk until the controller attached it.
    ipam.node_state.reserve_trunk_slot(cfg.pod_eni);
    let ipam = Arc::new(ipam);
    // `build`: releases recorded before the restart are withdrawn before the socket serves.
    let mut reconciler = Reconciler::new();
    reconciler.restore(&ipam);
    Ok(Started {
        ipam,
        reconciler,
        provider,
    })
}

/// A started ipamd, not serving yet.
pub struct Started {
    pub ipam: Arc<SimIpam>,
    pub reconciler: Reconciler,
    /// The EC2 port its pool loop acts through.
    pub provider: Provider,
}

/// The gRPC backend the plugin's calls reach.
pub fn backend(ipam: &Arc<SimIpam>, cfg: &DaemonConfig, cluster: &SimCluster) -> Arc<Backend> {
    let pod_eni = cfg.pod_eni.then(|| {
        ipamd::sgp::BranchPods::new(
            Arc::new(cluster.clone()),
            ipam.clone(),
            Some(Arc::new(SimLinks)),
            cfg.mode == Mode::V6,
        )
    });
    let reply = ReplySettings {
        pod_eni,
        vpc_v4_cidrs: vec!["198.18.0.0/22".into()],
        family: cfg.mode.family(),
        multi_nic: cfg.multi_nic,
        vpc_v6_cidrs: vec![ipamd::aws::fake::FAKE_VPC_IPV6.into()],
        ..ReplySettings::default()
    };
    let failures = Arc::new(ipamd::failures::AddFailures::new(ipam.metrics.clone()));
    Arc::new(Backend::new(ipam.clone(), reply, failures))
}

fn plan_summary(plan: &ipamd::pool::reconcile_plan::Plan) -> String {
    let mut parts = Vec::new();
    if !plan.add_enis.is_empty() {
        let v: Vec<String> = plan
            .add_enis
            .iter()
            .map(|e| {
                let mut c: Vec<ipnet::Ipv4Net> =
                    e.secondary_ips.iter().map(|ip| (*ip).into()).collect();
                c.extend(e.prefixes.iter().copied());
                format!("{} {}", e.id, cidrs_str(&c))
            })
            .collect();
        parts.push(format!("adopt ENIs {}", v.join(", ")));
    }
    let join = |v: &[(String, ipnet::Ipv4Net)]| {
        v.iter()
            .map(|(e, c)| format!("{e}:{}", cidrs_str(&[*c])))
            .collect::<Vec<_>>()
            .join(" ")
    };
    if !plan.add_cidrs.is_empty() {
        parts.push(format!("ADD back as free {}", join(&plan.add_cidrs)));
    }
    if !plan.remove_cidrs.is_empty() {
        parts.push(format!("drop {}", join(&plan.remove_cidrs)));
    }
    if !plan.remove_enis.is_empty() {
        parts.push(format!("drop ENIs {:?}", plan.remove_enis));
    }
    if !plan.kept_in_use.is_empty() {
        parts.push(format!("quarantine {}", join(&plan.kept_in_use)));
    }
    parts.join("; ")
}

/// `pool::run::run`: the production [`pool::run::pass`] between the simulation's waits.
pub async fn pool_loop(
    ipam: Arc<SimIpam>,
    mut reconciler: Reconciler,
    mut manager: Manager<Provider, SimEniHost>,
    tick: Duration,
    token: CancellationToken,
    trace: Trace,
    tag: String,
) {
    reconciler.restore(&ipam);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = token.cancelled() => return,
            _ = interval.tick() => {}
            () = ipam.signal.demanded() => {}
        }
        if ipam.is_shutting_down() {
            return;
        }
        match run::pass(&mut manager, &mut reconciler, &ipam).await {
            Some(Outcome::Applied(plan)) if !plan.is_empty() || !plan.kept_in_use.is_empty() => {
                trace.log(format!("{tag} reconcile: {}", plan_summary(&plan)));
            }
            Some(Outcome::Failed(e)) => trace.log(format!("{tag} reconcile failed: {e}")),
            _ => {}
        }
    }
}

/// The simulated host's pod rules: none are kept, but their removal is an await point, as
/// the kernel's is.
struct SimRules;

impl PodRules for SimRules {
    async fn pod_rule_addresses_v4(
        &self,
    ) -> Result<Vec<std::net::Ipv4Addr>, ipamd::host::SeamError> {
        Ok(Vec::new())
    }

    async fn delete_pod_rules(
        &self,
        _ips: &[std::net::Ipv4Addr],
    ) -> Result<(), ipamd::host::SeamError> {
        yield_now().await;
        Ok(())
    }

    async fn forget_conntrack(
        &self,
        _ips: &[std::net::IpAddr],
    ) -> Result<(), ipamd::host::SeamError> {
        yield_now().await;
        Ok(())
    }
}

/// `reclaim::run`: the production [`reclaim::round`] between the simulation's waits.
pub async fn reclaim_loop(
    ipam: Arc<SimIpam>,
    grace: Duration,
    host: SimHost,
    token: CancellationToken,
    trace: Trace,
    tag: String,
) {
    let mut reclaimer = Reclaimer::new(grace, VETH_PREFIX);
    let period = (grace / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let fast = if ipam.del_seen().is_empty() {
            Duration::MAX
        } else {
            DEL_SEEN_PERIOD
        };
        tokio::select! {
            biased;
            () = token.cancelled() => return,
            _ = interval.tick() => {}
            () = ipam.reclaim_asks.wanted() => {}
            () = tokio::time::sleep(fast) => {}
        }
        if ipam.is_shutting_down() {
            return;
        }
        // The host read (`spawn_blocking` in production) is an await point.
        let wiring = host.wiring();
        yield_now().await;
        for (key, ip) in reclaim::round(&ipam, &mut reclaimer, &wiring, Some(&SimRules)).await {
            trace.log(format!("{tag} reclaim released {ip} of {key}"));
        }
    }
}
