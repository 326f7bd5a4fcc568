//! Host networking that ipamd programs in the node's network namespace: secondary ENI links,
//! per-ENI route tables and rules, node-wide ip rules, the SNAT/connmark iptables chains, and on
//! nf_tables nodes the native nftables connmark table (`ip aws-cni`). Each part is a pure planner
//! over a snapshot plus a thin apply step; [`HostNetwork`] ties them to one namespace. Must not:
//! decide which ENIs or IPs exist (the pool manager does), program pod veths or pod routes (the CNI
//! plugin does), run anything outside the namespace it was built for, or write a kernel setting
//! (sysctl tree, sysfs): the aws-node container may not, the privileged init container sets them
//! and ipamd only reads them ([`sysctl`]).

pub mod command;
pub mod eni;
pub mod iptables;
pub mod nft;
pub mod node;
pub mod ops;
pub mod snat;
pub mod sysctl;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use dataplane::{NetNs, Netlink, NetlinkError, SysctlError};

pub use command::{CommandError, CommandRunner, Exec};
pub use eni::{EniPlanError, EniSpec};
pub use iptables::{Backend, BackendChoice, IptablesError, IptablesOp, IptablesRule};
pub use nft::{ConnmarkBackend, NftError, NftOp};
pub use node::{NodePlanError, NodeSpec, RpFilter};
pub use ops::{HostOp, Observed};
pub use snat::{RandomizeSnat, SnatConfig};
pub use sysctl::SysctlRead;

/// A failed host-networking step.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// Installing iptables rules failed.
    #[error(transparent)]
    Iptables(#[from] IptablesError),
    /// Reading or programming the nftables connmark table failed.
    #[error(transparent)]
    Nft(#[from] NftError),
    /// An ENI could not be planned (e.g. its link is not there yet: retry).
    #[error(transparent)]
    Eni(#[from] EniPlanError),
    /// The node could not be planned.
    #[error(transparent)]
    Node(#[from] NodePlanError),
    /// A kernel setting could not be read (ipamd writes none).
    #[error(transparent)]
    SysctlRead(#[from] SysctlError),
    /// A blocking worker panicked or was cancelled.
    #[error("host networking worker failed")]
    Worker,
    /// The conntrack entries of released addresses could not be deleted.
    #[error(transparent)]
    Conntrack(#[from] dataplane::conntrack::ConntrackError),
    /// This `HostNetwork` was built without its namespace's handle
    /// ([`HostNetwork::with_conntrack`]): it never touches the caller's own conntrack table.
    #[error("no network namespace handle for conntrack")]
    NoConntrackNamespace,
}

/// What a call changed; empty when the host already matched (the idempotency signal).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Routing changes, in order.
    pub routing: Vec<HostOp>,
    /// iptables changes, in order.
    pub iptables: Vec<IptablesOp>,
    /// nftables connmark changes (the table `ip aws-cni`).
    pub nftables: Vec<NftOp>,
    /// Where the pod connmark lives after this call (`None`: not reconciled, e.g. IPv6 mode or
    /// a call that does not touch SNAT). Not a change: [`Applied::is_noop`] ignores it.
    pub connmark_backend: Option<ConnmarkBackend>,
    /// Reverse-path filtering on the primary interface as read by [`HostNetwork::setup_node`]
    /// (`None`: another call, or unreadable). Read, never set: the init container sets it.
    pub rp_filter: Option<RpFilter>,
    /// [`HostNetwork::setup_eni`]: the table the node's OS already routes the ENI by, which
    /// the ENI's routes and its pods' rules use ([`eni::os_table`]); `None`: ipamd's own.
    pub os_table: Option<u32>,
}

impl Applied {
    /// Nothing was changed.
    #[must_use]
    pub fn is_noop(&self) -> bool {
        self.routing.is_empty() && self.iptables.is_empty() && self.nftables.is_empty()
    }
}

/// A seam's failure (the host's, the API server's): any error, rendered where it is logged
/// (the ports of `reclaim` and `sgp`, whose implementations live outside the domain).
pub type SeamError = Box<dyn std::error::Error + Send + Sync>;

/// Host networking of one namespace: a netlink connection bound to it and a runner whose
/// programs run in it. Cheap to share behind an `Arc`; calls may run concurrently (iptables
/// batches are serialised).
#[derive(Debug)]
pub struct HostNetwork {
    netlink: Netlink,
    runner: Arc<dyn CommandRunner>,
    sysctls: Arc<dyn SysctlRead>,
    backend: BackendChoice,
    iptables_lock: Arc<Mutex<()>>,
    conntrack: Option<Arc<NetNs>>,
}

impl HostNetwork {
    /// Host networking of the namespace `netlink` is bound to; `runner` must run programs in
    /// that same namespace and `sysctls` read its settings (a [`NetNs`] handle of it does).
    #[must_use]
    pub fn new(
        netlink: Netlink,
        runner: Arc<dyn CommandRunner>,
        sysctls: Arc<dyn SysctlRead>,
        backend: BackendChoice,
    ) -> Self {
        Self {
            netlink,
            runner,
            sysctls,
            backend,
            iptables_lock: Arc::new(Mutex::new(())),
            conntrack: None,
        }
    }

    /// The same, deleting conntrack entries in `ns` (the namespace `netlink` is bound to).
    #[must_use]
    pub fn with_conntrack(mut self, ns: NetNs) -> Self {
        self.conntrack = Some(Arc::new(ns));
        self
    }

    /// Host networking of the namespace this process runs in (production: ipamd runs inside
    /// the node's namespace). Must be called within a tokio runtime.
    pub async fn for_current_netns(backend: BackendChoice) -> Result<Self, HostError> {
        let ns = NetNs::current().map_err(NetlinkError::NetNs)?;
        let netlink = ns.connect().await?;
        let own = NetNs::current().map_err(NetlinkError::NetNs)?;
        Ok(
            Self::new(netlink, Arc::new(Exec::current()), Arc::new(ns), backend)
                .with_conntrack(own),
        )
    }

    /// Deletes the conntrack entries (NAT bindings included) whose original or reply tuple
    /// names one of `ips`, in this host's namespace: run before a released address may go to
    /// another pod (docs/host-networking.md, "Conntrack-safe address reuse").
    pub async fn forget_conntrack(
        &self,
        ips: Vec<IpAddr>,
    ) -> Result<dataplane::conntrack::Forgotten, HostError> {
        let ns = self
            .conntrack
            .clone()
            .ok_or(HostError::NoConntrackNamespace)?;
        self.blocking(move || {
            ns.run(|| dataplane::conntrack::forget_addresses(&ips))
                .map_err(|e| HostError::Netlink(NetlinkError::NetNs(e)))?
                .map_err(HostError::from)
        })
        .await?
    }

    /// Subscribes to the new conntrack entries of this host's namespace (`flows` keeps the
    /// ledger of addresses no entry names from them). Must be called within a tokio runtime.
    pub fn watch_new_entries(&self) -> Result<dataplane::conntrack::NewEntries, HostError> {
        let ns = self
            .conntrack
            .clone()
            .ok_or(HostError::NoConntrackNamespace)?;
        let runtime = tokio::runtime::Handle::current();
        ns.run(|| {
            let _entered = runtime.enter();
            dataplane::conntrack::NewEntries::subscribe()
        })
        .map_err(|e| HostError::Netlink(NetlinkError::NetNs(e)))?
        .map_err(HostError::from)
    }

    /// Whether this namespace's kernel sends conntrack events to a listener
    /// (`net.netfilter.nf_conntrack_events` is not 0; unreadable: no).
    pub async fn conntrack_events_sent(&self) -> bool {
        let sysctls = self.sysctls.clone();
        self.blocking(move || sysctls.read(dataplane::conntrack::EVENTS_SYSCTL))
            .await
            .ok()
            .and_then(Result::ok)
            .is_some_and(|v| v.trim() != "0")
    }

    /// Reads the routing snapshot the planners work on.
    pub async fn observe(&self) -> Result<Observed, HostError> {
        Ok(Observed::read(&self.netlink).await?)
    }

    /// Node-wide setup: primary ENI MTU, rules 1024/1535, and the SNAT/connmark iptables
    /// rules; reads (never sets) the primary interface's reverse-path filtering into
    /// [`Applied::rp_filter`] for the caller to judge. Idempotent.
    pub async fn setup_node(&self, node: &NodeSpec) -> Result<Applied, HostError> {
        let observed = self.observe().await?;
        let (routing, primary_interface) = node::plan(node, &observed)?;
        ops::apply(&self.netlink, &routing).await?;
        // Loose reverse-path filtering on the primary ENI is the init container's
        // (aws-vpc-cni-init, privileged): read here only.
        let rp_filter = self.read_rp_filter(&primary_interface).await?;
        if node.ipv6 {
            // IPv6 mode: no SNAT or connmark rules (traffic leaves by the ENI it came in on); IPv4
            // egress through egress-cni must not reach other pods.
            self.block_node_local_access(false).await?;
            // No connmark is programmed, but the node's backend is still reported
            // (`awscni_connmark_backend` is set whatever the family).
            let connmark_backend = Some(self.connmark_backend().await?);
            return Ok(Applied {
                routing,
                connmark_backend,
                rp_filter,
                ..Applied::default()
            });
        }
        if node.block_v6_egress_range {
            // IPv4 mode with ENABLE_V6_EGRESS.
            self.block_node_local_access(true).await?;
        }
        let snat = self
            .update_snat(&node.snat_config(&primary_interface))
            .await?;
        Ok(Applied {
            routing,
            rp_filter,
            ..snat
        })
    }

    /// The primary interface's effective reverse-path filtering ([`RpFilter::effective`]); `None`
    /// (and a WARN) when a value is unreadable or not a number: the check is advisory, so an odd
    /// kernel must not stop the node.
    async fn read_rp_filter(&self, interface: &str) -> Result<Option<RpFilter>, HostError> {
        let sysctls = Arc::clone(&self.sysctls);
        let key = RpFilter::key(interface);
        self.blocking(move || {
            let read = |k: &str| {
                sysctls
                    .read(k)
                    .inspect_err(|e| tracing::warn!(key = k, error = %e, "rp_filter not read"))
                    .ok()
            };
            let (all, iface) = (read(RpFilter::ALL_KEY)?, read(&key)?);
            let found = RpFilter::effective(&all, &iface);
            if found.is_none() {
                tracing::warn!(all, interface = iface, "rp_filter values are not numbers");
            }
            found
        })
        .await
    }

    /// Where this node's pod connmark lives: follows the iptables backend. Blocking work on a
    /// helper thread.
    pub async fn connmark_backend(&self) -> Result<ConnmarkBackend, HostError> {
        let runner = Arc::clone(&self.runner);
        let backend = self.backend;
        self.blocking(move || {
            ConnmarkBackend::for_iptables(
                iptables::Iptables::detect(runner.as_ref(), backend).backend(),
            )
        })
        .await
    }

    /// Inserts the FORWARD reject of the egress-cni range (`v6`: `fd00::ac:00/118` with ip6tables,
    /// else `169.254.172.0/22`) at position 1 unless present ([`snat::node_local_block_spec`]).
    /// Returns whether it was inserted.
    pub async fn block_node_local_access(&self, v6: bool) -> Result<bool, HostError> {
        let runner = Arc::clone(&self.runner);
        let lock = Arc::clone(&self.iptables_lock);
        let backend = self.backend;
        self.blocking(move || {
            let _serial = lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let chosen = iptables::Iptables::detect(runner.as_ref(), backend).backend();
            let program = match (chosen, v6) {
                (Backend::Legacy, false) => "iptables-legacy",
                (Backend::Nft, false) => "iptables-nft",
                (Backend::Legacy, true) => "ip6tables-legacy",
                (Backend::Nft, true) => "ip6tables-nft",
            };
            let spec = snat::node_local_block_spec(v6);
            let args = |op: &'static str, pos: Option<&'static str>| {
                let mut a: Vec<String> = vec!["-w".into(), "-t".into(), "filter".into()];
                a.push(op.into());
                a.push("FORWARD".into());
                a.extend(pos.map(str::to_owned));
                a.extend(spec.iter().cloned());
                a
            };
            let check = args("-C", None);
            let check: Vec<&str> = check.iter().map(String::as_str).collect();
            if runner.run(program, &check, None).is_ok() {
                return Ok(false);
            }
            let insert = args("-I", Some("1"));
            let insert: Vec<&str> = insert.iter().map(String::as_str).collect();
            runner
                .run(program, &insert, None)
                .map(|_| true)
                .map_err(|e| HostError::Iptables(IptablesError::Insert(e)))
        })
        .await?
    }

    /// Converges the SNAT/connmark rules to `cfg` (also when VPC CIDRs change). The iptables
    /// backend decides where the pod connmark lives: legacy → the iptables `AWS-CONNMARK-CHAIN-0`
    /// layout and no `ip aws-cni` table; nf_tables → the native table and none of the iptables
    /// connmark chain. The new layout is installed before the other is removed, so pods'
    /// connections are marked throughout a switch. Removes chains and rules of older layouts, and
    /// ours in the other iptables backend.
    pub async fn update_snat(&self, cfg: &SnatConfig) -> Result<Applied, HostError> {
        let runner = Arc::clone(&self.runner);
        let lock = Arc::clone(&self.iptables_lock);
        let (backend, cfg) = (self.backend, cfg.clone());
        self.blocking(move || {
            let _serial = lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let ipt = iptables::Iptables::detect(runner.as_ref(), backend);
            let connmark = ConnmarkBackend::for_iptables(ipt.backend());
            let rules = snat::desired_iptables_rules(&cfg, ipt.random_fully(), connmark);
            let nft = nft::Nft::new(runner.as_ref());
            let (iptables, nftables) = match connmark {
                ConnmarkBackend::Nftables => {
                    let table = nft::desired_table(&cfg);
                    let nftables = nft.converge(table.as_ref())?;
                    (ipt.converge(&rules)?, nftables)
                }
                ConnmarkBackend::Iptables => {
                    let iptables = ipt.converge(&rules)?;
                    // A host without a usable nf_tables (no `nft`, no kernel support) cannot hold
                    // the table; not an error.
                    let nftables = match nft.observe() {
                        Ok(Some(_)) => nft.converge(None)?,
                        Ok(None) => None,
                        Err(e) => {
                            tracing::warn!(error = %e, "skipping the nftables connmark clean-up: nf_tables unavailable");
                            None
                        }
                    };
                    (iptables, nftables)
                }
            };
            Ok::<_, HostError>(Applied {
                routing: Vec::new(),
                iptables,
                nftables: nftables.into_iter().collect(),
                connmark_backend: Some(connmark),
                rp_filter: None,
                os_table: None,
            })
        })
        .await?
    }

    /// Sets up one secondary ENI: link up with `mtu`, its primary address, its route table (with
    /// [`EniSpec::ipv6_routes`] also the IPv6 gateway routes), rule 32765, no main-table subnet
    /// route. [`EniPlanError::NoLink`] means the link is not visible yet; retry later. With IPv6
    /// routes, IPv6 must already be on on the link (new links inherit `default/disable_ipv6`, which
    /// the init container sets to 0): otherwise [`EniPlanError::Ipv6Disabled`] and nothing is
    /// changed. Idempotent.
    pub async fn setup_eni(&self, eni: &EniSpec, mtu: u32) -> Result<Applied, HostError> {
        let observed = self.observe().await?;
        let routing = eni::plan(eni, mtu, &observed)?;
        if let Some((link, key)) = eni::ipv6_setting(eni, &observed) {
            let sysctls = Arc::clone(&self.sysctls);
            let value = self.blocking(move || sysctls.read(&key)).await??;
            eni::check_ipv6(eni, &link, &value)?;
        }
        ops::apply(&self.netlink, &routing).await?;
        Ok(Applied {
            routing,
            os_table: eni::os_table(eni, &observed),
            ..Applied::default()
        })
    }

    /// A trunk ENI's host set-up (security groups for pods): MTU, up, its primary address, its
    /// table's routes, no main-table subnet route, and no rule for its primary IP (nothing is
    /// sourced from it; branch pods use their VLAN's own table). Idempotent.
    pub async fn setup_trunk_eni(&self, eni: &EniSpec, mtu: u32) -> Result<Applied, HostError> {
        let observed = self.observe().await?;
        let routing = eni::plan_trunk(eni, mtu, &observed)?;
        ops::apply(&self.netlink, &routing).await?;
        Ok(Applied {
            routing,
            ..Applied::default()
        })
    }

    /// Security groups for pods in strict mode: the local table's lookup moved from priority 0
    /// to [`dataplane::conventions::LOCAL_RULE_PRIORITY`] (`family`: the pods' family).
    /// Idempotent.
    pub async fn move_local_rule(&self, family: dataplane::Family) -> Result<Applied, HostError> {
        let observed = self.observe().await?;
        let routing = node::plan_local_rule(family, &observed);
        ops::apply(&self.netlink, &routing).await?;
        Ok(Applied {
            routing,
            ..Applied::default()
        })
    }

    /// The index of the link carrying `mac` in this netns, if any (the trunk's `ParentIfIndex`).
    pub async fn link_index_by_mac(
        &self,
        mac: dataplane::MacAddr,
    ) -> Result<Option<u32>, HostError> {
        Ok(self.observe().await?.link_by_mac(mac).map(|l| l.index))
    }

    /// Removes a freed ENI's rules and route table. Idempotent; works after the link is gone.
    pub async fn teardown_eni(&self, eni: &EniSpec) -> Result<Applied, HostError> {
        let observed = self.observe().await?;
        let routing = eni::plan_teardown(eni, &observed);
        ops::apply(&self.netlink, &routing).await?;
        Ok(Applied {
            routing,
            ..Applied::default()
        })
    }

    /// Deletes per-pod rules (512, 1536) of IPs not in `assigned`. Call at startup after the
    /// checkpoint is restored.
    pub async fn prune_pod_rules(&self, assigned: &[IpAddr]) -> Result<Applied, HostError> {
        let observed = self.observe().await?;
        let routing = node::plan_prune_pod_rules(assigned, &observed);
        ops::apply(&self.netlink, &routing).await?;
        Ok(Applied {
            routing,
            ..Applied::default()
        })
    }

    /// IPv4 addresses named by per-pod rules (512/1536).
    pub async fn pod_rule_addresses_v4(&self) -> Result<Vec<std::net::Ipv4Addr>, HostError> {
        Ok(node::pod_rule_addresses(&self.observe().await?)
            .into_iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(v4) => Some(v4),
                IpAddr::V6(_) => None,
            })
            .collect())
    }

    /// Deletes the per-pod rules (512/1536) of `ips` (a pod gone, or a teardown that failed).
    pub async fn delete_pod_rules(&self, ips: &[std::net::Ipv4Addr]) -> Result<Applied, HostError> {
        let observed = self.observe().await?;
        let routing = node::plan_delete_pod_rules(ips, &observed);
        ops::apply(&self.netlink, &routing).await?;
        Ok(Applied {
            routing,
            ..Applied::default()
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, HostError> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|_| HostError::Worker)
    }
}

/// Why the host's pod evidence could not be read (ipamd then does not start: it cannot tell
/// which addresses pods use).
#[derive(Debug, thiserror::Error)]
pub enum EvidenceError {
    /// The main table's routes.
    #[error("read host routes: {0}")]
    Routes(String),
    /// The node namespace's netlink socket.
    #[error("host netlink: {0}")]
    Netlink(String),
    /// The policy rules.
    #[error("read host rules: {0}")]
    Rules(#[source] NetlinkError),
}

/// What the host netns shows of pods, read before any address is handed out: every `/32`
/// route of the main table and every `/128` IPv6 route with its device
/// (`dataplane::host_state`), plus the addresses only a pod rule (512/1536) names, with an empty
/// device; branch-ENI pods' addresses left out. See `ipam::HostPodRoutes`.
pub async fn pod_evidence() -> Result<Vec<(std::net::IpAddr, String)>, EvidenceError> {
    let mut out: Vec<(std::net::IpAddr, String)> =
        tokio::task::spawn_blocking(|| dataplane::host_state::pod_host_routes(""))
            .await
            .map_err(|e| EvidenceError::Routes(e.to_string()))?
            .map_err(|e| EvidenceError::Routes(e.to_string()))?;
    let netlink = dataplane::NetNs::current()
        .map_err(|e| EvidenceError::Netlink(e.to_string()))?
        .connect()
        .await
        .map_err(|e| EvidenceError::Netlink(e.to_string()))?;
    let observed = Observed::read(&netlink)
        .await
        .map_err(EvidenceError::Rules)?;
    for ip in node::pod_rule_addresses(&observed) {
        if !out.iter().any(|(a, _)| *a == ip) {
            out.push((ip, String::new()));
        }
    }
    // A standard-mode branch pod's main-table route (through a veth with the pods' prefix)
    // names an address of the controller's branch ENI: never ipamd's.
    let branch = node::branch_pod_addresses(&observed);
    out.retain(|(ip, _)| !branch.contains(ip));
    Ok(out)
}
