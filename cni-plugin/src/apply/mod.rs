//! Applies a [`PodNetworkPlan`] to the kernel through `dataplane` (with an undo log so a
//! failed ADD leaves nothing behind), reads the host state DEL plans from and tears a pod down
//! best-effort; `check.rs` compares live wiring with a previous result for CHECK. Must not:
//! talk to ipamd or decide what to program.

mod check;

use std::net::IpAddr;

use dataplane::conventions::MAIN_TABLE;
use dataplane::{
    Address, Family, MacAddr, NetNs, NetNsError, Netlink, NetlinkError, Rule, SysctlError, VethSpec,
};

use crate::plan::{
    BranchPlan, BranchTeardown, HostLink, InterfacePlan, LinkPlan, PodEnd, PodNetworkPlan,
    TeardownPlan, TeardownView,
};

/// A pod interface's veth pair created ahead of its addresses ([`Datapath::prepare`]), both ends
/// still down.
#[derive(Debug)]
pub struct PreparedLink {
    /// The host end's current name.
    host_veth: String,
    /// What it was created for.
    plan: LinkPlan,
    host_index: u32,
    host_mac: MacAddr,
    /// A netlink connection bound to the pod's namespace.
    pod_nl: Netlink,
}

/// A failed datapath step.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The host netns handle could not be opened.
    #[error("open host netns")]
    HostNetNs(#[source] NetNsError),
    /// A netlink operation failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// A sysctl write failed.
    #[error(transparent)]
    Sysctl(#[from] SysctlError),
    /// The container end reports no MAC.
    #[error("link {0} has no mac")]
    NoMac(String),
    /// A link already has the host veth's name, and another pod interface computes that name
    /// too: it may be that pod's, so it is not deleted.
    #[error(
        "host veth name {name} is in use, and {other} has the same name: refused rather than deleting what may be that pod's link"
    )]
    VethNameInUse {
        /// The host veth name.
        name: String,
        /// The other pod interface ([`crate::plan::veth_name_shared_with`]).
        other: String,
    },
    /// IPv6 duplicate address detection did not finish (or failed) in time (the message operators
    /// know).
    #[error(
        "setup NS network: failed while waiting for v6 addresses to be stable: link {link} still has tentative addresses after {V6_DAD_TIMEOUT:?}: {addrs:?}"
    )]
    DadTimeout {
        /// The pod interface.
        link: String,
        /// The addresses still tentative or DAD-failed.
        addrs: Vec<ipnet::IpNet>,
    },
}

/// How long ADD waits for the pod's IPv6 addresses to pass duplicate address detection polling
/// every [`V6_DAD_INTERVAL`] (`WAIT_INTERVAL`).
pub const V6_DAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// See [`V6_DAD_TIMEOUT`].
pub const V6_DAD_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// ADD failed: the cause, plus whatever went wrong while undoing.
#[derive(Debug, thiserror::Error)]
#[error("{cause}")]
pub struct SetupError {
    /// The step that failed.
    #[source]
    pub cause: ApplyError,
    /// Failures while undoing the steps already done.
    pub cleanup: Vec<ApplyError>,
}

/// What ADD produced: what the result needs, and what [`Datapath::unwire`] takes back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Host veth MAC (also the pod's gateway neighbour).
    pub host_mac: MacAddr,
    /// Container interface MAC.
    pub container_mac: MacAddr,
    /// The host veth's index (this ADD created it).
    host_index: u32,
    /// A branch-ENI pod's VLAN link index (this ADD created it).
    vlan_index: Option<u32>,
    /// The host rules this ADD added (not those a retried ADD found in place).
    added_rules: Vec<Rule>,
    /// A multi-card pod's interfaces on its other cards: (host MAC, container MAC, host veth
    /// index) each.
    other_cards: Vec<(MacAddr, MacAddr, u32)>,
}

impl Applied {
    /// Host and container MAC of every interface, in the plan's order (for the result).
    #[must_use]
    pub fn macs(&self) -> Vec<(MacAddr, MacAddr)> {
        std::iter::once((self.host_mac, self.container_mac))
            .chain(self.other_cards.iter().map(|(h, c, _)| (*h, *c)))
            .collect()
    }
}

/// One reversible ADD step.
#[derive(Debug)]
enum Undo {
    /// Deleting the host veth also removes the pod end, its addresses, routes and neighbour,
    /// and the host route through it.
    HostLink(String),
    HostRule(Rule),
}

/// The host side of the datapath: the netns the plugin runs in, and a netlink connection.
#[derive(Debug)]
pub struct Datapath {
    host: NetNs,
    host_nl: Netlink,
}

impl Datapath {
    /// Opens the calling thread's netns as the host. Needs a tokio runtime.
    pub async fn open_current() -> Result<Self, ApplyError> {
        let host = NetNs::current().map_err(ApplyError::HostNetNs)?;
        let host_nl = host.connect().await?;
        Ok(Self { host, host_nl })
    }

    /// Wires a pod: every interface of the plan (a multi-card pod has one per network card). On
    /// failure every step done so far, of every interface, is undone in reverse: a pod gets all
    /// its interfaces or none.
    pub async fn setup(&self, plan: &PodNetworkPlan, pod: &NetNs) -> Result<Applied, SetupError> {
        let mut undo = Vec::new();
        let done = async {
            let link = self
                .link_steps(&plan.interface.link(), pod, &mut undo)
                .await?;
            self.address_steps(link, plan, pod, &mut undo).await
        }
        .await;
        self.finish(done, undo).await
    }

    /// The first part of ADD, before ipamd has answered: `link`'s veth pair created (an earlier
    /// sandbox's leftover of that name replaced), both ends down, the host end's sysctls
    /// written. On failure what was created is deleted again. Complete it with
    /// [`setup_prepared`](Self::setup_prepared), or take it back with
    /// [`discard`](Self::discard).
    pub async fn prepare(&self, link: &LinkPlan, pod: &NetNs) -> Result<PreparedLink, SetupError> {
        let mut undo = Vec::new();
        match self.link_steps(link, pod, &mut undo).await {
            Ok(prepared) => Ok(prepared),
            Err(cause) => Err(SetupError {
                cause,
                cleanup: self.undo_all(undo).await,
            }),
        }
    }

    /// Completes a [`prepare`](Self::prepare)d link with `plan`: when the plan names its host
    /// veth otherwise (a branch-ENI pod's), the link is renamed (after the same leftover check
    /// and removal [`setup`](Self::setup) does); then everything that depends on the addresses.
    /// On failure every step, the prepared link included, is undone.
    pub async fn setup_prepared(
        &self,
        prepared: PreparedLink,
        plan: &PodNetworkPlan,
        pod: &NetNs,
    ) -> Result<Applied, SetupError> {
        let mut undo = vec![Undo::HostLink(prepared.host_veth.clone())];
        let done = async {
            let link = self
                .adopt(prepared, &plan.interface.link(), pod, &mut undo)
                .await?;
            self.address_steps(link, plan, pod, &mut undo).await
        }
        .await;
        self.finish(done, undo).await
    }

    /// Deletes a [`prepare`](Self::prepare)d link that will not be used (ipamd refused the pod);
    /// a link already gone is not an error.
    pub async fn discard(&self, prepared: PreparedLink) -> Vec<ApplyError> {
        self.undo_all(vec![Undo::HostLink(prepared.host_veth)])
            .await
    }

    async fn finish(
        &self,
        done: Result<Applied, ApplyError>,
        undo: Vec<Undo>,
    ) -> Result<Applied, SetupError> {
        match done {
            Ok(mut applied) => {
                applied.added_rules = undo
                    .into_iter()
                    .filter_map(|step| match step {
                        Undo::HostRule(rule) => Some(rule),
                        Undo::HostLink(_) => None,
                    })
                    .collect();
                Ok(applied)
            }
            Err(cause) => Err(SetupError {
                cause,
                cleanup: self.undo_all(undo).await,
            }),
        }
    }

    async fn undo_all(&self, mut undo: Vec<Undo>) -> Vec<ApplyError> {
        let mut cleanup = Vec::new();
        while let Some(step) = undo.pop() {
            if let Err(e) = self.undo(step).await {
                cleanup.push(e);
            }
        }
        cleanup
    }

    /// The plan's first interface on the prepared link: renamed when the plan's host veth name
    /// differs (the link is still down, so the kernel allows it), its sysctls written again
    /// under the new name. Any other difference (none exists today: every pod's first link has
    /// `CNI_IFNAME` and the configured MTU) replaces the link by a new one.
    async fn adopt(
        &self,
        prepared: PreparedLink,
        link: &LinkPlan,
        pod: &NetNs,
        undo: &mut Vec<Undo>,
    ) -> Result<PreparedLink, ApplyError> {
        if prepared.plan == *link {
            return Ok(prepared);
        }
        let only_the_name = LinkPlan {
            host_veth: link.host_veth.clone(),
            host_sysctls: link.host_sysctls.clone(),
            host_veth_shared_with: link.host_veth_shared_with.clone(),
            ..prepared.plan.clone()
        } == *link;
        if !only_the_name {
            // Not a case of today's plans; kept correct rather than fast. The undo log keeps
            // the prepared link until it is gone, so a failed deletion is retried by `finish`.
            self.undo(Undo::HostLink(prepared.host_veth.clone()))
                .await?;
            undo.clear();
            return self.link_steps(link, pod, undo).await;
        }
        self.make_room_for(link).await?;
        self.host_nl
            .set_link_name(prepared.host_index, &link.host_veth)
            .await?;
        undo.clear();
        undo.push(Undo::HostLink(link.host_veth.clone()));
        ignore_missing_key(self.host.write_sysctls(&link.host_sysctls))?;
        Ok(PreparedLink {
            host_veth: link.host_veth.clone(),
            plan: link.clone(),
            ..prepared
        })
    }

    /// A leftover of an earlier sandbox with `link`'s host veth name is deleted, unless another
    /// pod interface has that name too: then it may be that one's.
    async fn make_room_for(&self, link: &LinkPlan) -> Result<(), ApplyError> {
        if let Some(other) = &link.host_veth_shared_with
            && self
                .host_nl
                .link_with_peer(&link.host_veth)
                .await?
                .is_some()
        {
            return Err(ApplyError::VethNameInUse {
                name: link.host_veth.clone(),
                other: other.clone(),
            });
        }
        self.host_nl.delete_link_by_name(&link.host_veth).await?;
        Ok(())
    }

    /// Takes back a completed [`setup`](Self::setup) (ADD failed after wiring, e.g. the
    /// network-policy agent refused the pod): the rules it added, then its host veth, by index
    /// (the pod end, its addresses and neighbour, and the host route through it go with it).
    /// Objects already gone are not errors; the other failures are returned.
    pub async fn unwire(&self, applied: &Applied) -> Vec<ApplyError> {
        let mut errors = Vec::new();
        for rule in applied.added_rules.iter().rev() {
            if let Err(e) = self.host_nl.delete_rule(rule).await
                && !e.is_not_found()
            {
                errors.push(e.into());
            }
        }
        let links = std::iter::once(applied.host_index)
            .chain(applied.vlan_index)
            .chain(applied.other_cards.iter().map(|m| m.2));
        for index in links {
            if let Err(e) = self.host_nl.delete_link(index).await
                && !e.is_not_found()
            {
                errors.push(e.into());
            }
        }
        errors
    }

    async fn undo(&self, step: Undo) -> Result<(), ApplyError> {
        let res = match &step {
            Undo::HostLink(name) => self.host_nl.delete_link_by_name(name).await.map(|_| ()),
            Undo::HostRule(rule) => self.host_nl.delete_rule(rule).await,
        };
        match res {
            Err(e) if !e.is_not_found() => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Creates one interface's veth pair (after [`Self::make_room_for`]), its host end named and
    /// its sysctls written; both ends stay down until [`Self::interface_steps`].
    async fn link_steps(
        &self,
        link: &LinkPlan,
        pod: &NetNs,
        undo: &mut Vec<Undo>,
    ) -> Result<PreparedLink, ApplyError> {
        let pod_nl = pod.connect().await?;
        self.make_room_for(link).await?;
        // Set explicitly (udev's MACAddressPolicy leaves a set address alone, so the pod's
        // static neighbour entry stays right); random 46 bits, as the kernel's own choice is.
        let host_mac = MacAddr::random_local();
        pod_nl
            .add_veth(&VethSpec {
                name: &link.container_ifname,
                mtu: link.mtu,
                peer_name: &link.host_veth,
                peer_mac: Some(host_mac),
                peer_netns: Some(&self.host),
            })
            .await?;
        undo.push(Undo::HostLink(link.host_veth.clone()));
        let host_link = self.host_nl.require_link(&link.host_veth).await?;
        ignore_missing_key(self.host.write_sysctls(&link.host_sysctls))?;
        Ok(PreparedLink {
            host_veth: link.host_veth.clone(),
            plan: link.clone(),
            host_index: host_link.index,
            host_mac,
            pod_nl,
        })
    }

    /// Every interface of `plan` on its prepared first link: the first with the branch VLAN,
    /// then a multi-card pod's others (each created here).
    async fn address_steps(
        &self,
        first: PreparedLink,
        plan: &PodNetworkPlan,
        pod: &NetNs,
        undo: &mut Vec<Undo>,
    ) -> Result<Applied, ApplyError> {
        let mut applied = self
            .interface_steps(first, &plan.interface, plan.branch.as_ref(), pod, undo)
            .await?;
        for card in &plan.other_cards {
            let link = self.link_steps(&card.link(), pod, undo).await?;
            let a = self.interface_steps(link, card, None, pod, undo).await?;
            applied
                .other_cards
                .push((a.host_mac, a.container_mac, a.host_index));
        }
        Ok(applied)
    }

    /// Wires one interface of the plan on its created link, and `branch`'s VLAN link (a
    /// branch-ENI pod's one interface) between the pod's side and the host's routes and rules.
    async fn interface_steps(
        &self,
        link: PreparedLink,
        plan: &InterfacePlan,
        branch: Option<&BranchPlan>,
        pod: &NetNs,
        undo: &mut Vec<Undo>,
    ) -> Result<Applied, ApplyError> {
        let PreparedLink {
            host_index,
            host_mac,
            pod_nl,
            ..
        } = link;
        self.host_nl.set_link_up(host_index).await?;

        let pod_link = pod_nl.require_link(&plan.container_ifname).await?;
        let container_mac = pod_link
            .mac
            .ok_or_else(|| ApplyError::NoMac(plan.container_ifname.clone()))?;
        if !plan.pod_sysctls.is_empty() {
            ignore_missing_key(pod.write_sysctls(&plan.pod_sysctls))?;
        }
        pod_nl.set_link_up(pod_link.index).await?;
        for route in plan.pod_routes(pod_link.index) {
            pod_nl.replace_route(&route).await?;
        }
        for a in plan.addresses() {
            pod_nl
                .add_address(
                    &Address {
                        ifindex: pod_link.index,
                        prefix: a.address,
                    },
                    // The address goes through DAD; ADD waits for it below.
                    false,
                )
                .await?;
        }
        for neigh in plan.gateway_neighbours(pod_link.index, host_mac) {
            pod_nl.replace_neighbour(&neigh).await?;
        }
        // A multi-NIC pod's further interface routes by its own table (the pod netns goes
        // with the sandbox: not undone).
        for rule in &plan.pod_rules {
            match pod_nl.add_rule(rule).await {
                Ok(()) => {}
                Err(e) if e.is_exists() => {}
                Err(e) => return Err(e.into()),
            }
        }
        if plan.addresses().iter().any(|a| a.address.addr().is_ipv6()) {
            let unsettled = pod_nl
                .wait_ipv6_settled(pod_link.index, V6_DAD_TIMEOUT, V6_DAD_INTERVAL)
                .await?;
            if !unsettled.is_empty() {
                return Err(ApplyError::DadTimeout {
                    link: plan.container_ifname.clone(),
                    addrs: unsettled,
                });
            }
        }

        let vlan_index = match branch {
            Some(branch) => Some(self.setup_vlan(plan, branch, undo).await?),
            None => None,
        };
        for route in plan.host_routes(host_index) {
            self.host_nl.replace_route(&route).await?;
        }
        // The address is this sandbox's now: an earlier owner's `from` rule to another table
        // would shadow ours. Not undone on failure (it was stale either way).
        let mut families = Vec::new();
        for a in plan.addresses() {
            let f = Family::of(a.address.addr());
            if !families.contains(&f) {
                families.push(f);
            }
        }
        for family in families {
            let existing = self.host_nl.rules(family).await?;
            for stale in plan.stale_rules(&existing) {
                match self.host_nl.delete_rule(&stale).await {
                    Err(e) if !e.is_not_found() => return Err(e.into()),
                    _ => tracing::warn!(rule = ?stale, "removed a stale rule of the pod's address"),
                }
            }
        }
        for rule in &plan.host_rules {
            match self.host_nl.add_rule(rule).await {
                Ok(()) => undo.push(Undo::HostRule(rule.clone())),
                // Already there (a retried ADD): keep it, and do not remove it on undo.
                Err(e) if e.is_exists() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Applied {
            host_mac,
            container_mac,
            host_index,
            vlan_index,
            added_rules: Vec::new(),
            other_cards: Vec::new(),
        })
    }

    /// A branch-ENI pod's VLAN link (after the removal of an earlier sandbox's `iif <host veth>`
    /// rules and of every rule into the VLAN's table, [`BranchPlan::is_stale_rule`]): an existing
    /// `vlan.eth.<id>` is replaced (the trunk may have changed), the new one gets the branch MAC,
    /// the IPv6 sysctls, goes up, and its table gets the gateway and default routes. Returns its
    /// index.
    async fn setup_vlan(
        &self,
        plan: &InterfacePlan,
        branch: &BranchPlan,
        undo: &mut Vec<Undo>,
    ) -> Result<u32, ApplyError> {
        let family = Family::of(plan.address.addr());
        for rule in self.host_nl.rules(family).await? {
            if branch.is_stale_rule(&rule, &plan.host_veth) {
                match self.host_nl.delete_rule(&rule).await {
                    Err(e) if !e.is_not_found() => return Err(e.into()),
                    _ => {}
                }
            }
        }
        self.host_nl.delete_link_by_name(&branch.vlan_link).await?;
        self.host_nl
            .add_vlan(
                &branch.vlan_link,
                branch.parent_index,
                branch.vlan_id,
                branch.mac,
            )
            .await?;
        undo.push(Undo::HostLink(branch.vlan_link.clone()));
        let vlan = self.host_nl.require_link(&branch.vlan_link).await?;
        ignore_missing_key(self.host.write_sysctls(&branch.sysctls()))?;
        self.host_nl.set_link_up(vlan.index).await?;
        for route in branch.routes(vlan.index) {
            self.host_nl.replace_route(&route).await?;
        }
        Ok(vlan.index)
    }

    /// The host's rules (both families) and its routes in every table, for
    /// [`crate::plan::plan_branch_teardown`].
    pub async fn observe_branch(&self) -> Result<(Vec<Rule>, Vec<dataplane::Route>), ApplyError> {
        let mut rules = Vec::new();
        let mut routes = Vec::new();
        for family in [Family::V4, Family::V6] {
            rules.extend(self.host_nl.rules(family).await?);
            routes.extend(self.host_nl.routes(family).await?);
        }
        Ok((rules, routes))
    }

    /// Removes a branch-ENI pod's VLAN objects, going on after failures; objects already gone
    /// are not errors.
    pub async fn teardown_branch(&self, plan: &BranchTeardown) -> Vec<ApplyError> {
        let mut errors = Vec::new();
        let mut keep = |r: Result<(), NetlinkError>| {
            if let Err(e) = r
                && !e.is_not_found()
            {
                errors.push(ApplyError::from(e));
            }
        };
        for rule in &plan.rules {
            keep(self.host_nl.delete_rule(rule).await);
        }
        for route in &plan.routes {
            keep(self.host_nl.delete_route(route).await);
        }
        if let Some(link) = &plan.vlan_link {
            keep(self.host_nl.delete_link_by_name(link).await.map(|_| ()));
        }
        errors
    }

    /// Reads what DEL decides on: host links named `veth_names` (with their veth peers), the
    /// sandbox's own interface `pod` (netns, ifname) when it still exists, and the host's
    /// main-table routes.
    /// `other_cards`: a multi-card pod's interfaces on its other cards, (host veth name,
    /// interface name in the pod) each.
    pub async fn observe_teardown(
        &self,
        veth_names: &[String],
        pod: Option<(&NetNs, &str)>,
        other_cards: &[(String, String)],
    ) -> Result<TeardownView, ApplyError> {
        let mut view = TeardownView::default();
        for name in veth_names {
            if let Some((link, peer_index)) = self.host_nl.link_with_peer(name).await? {
                view.host_links.push(HostLink {
                    index: link.index,
                    name: link.name,
                    mac: link.mac,
                    peer_index,
                });
            }
        }
        if let Some((ns, ifname)) = pod {
            let pod_nl = ns.connect().await?;
            view.pod_end = pod_nl
                .link_with_peer(ifname)
                .await?
                .map(|(link, peer_index)| PodEnd {
                    index: link.index,
                    peer_index,
                });
            for (host, pod_if) in other_cards {
                if let Some((link, peer_index)) = pod_nl.link_with_peer(pod_if).await? {
                    view.other_card_pod_ends.push((
                        host.clone(),
                        PodEnd {
                            index: link.index,
                            peer_index,
                        },
                    ));
                }
            }
        }
        for family in [Family::V4, Family::V6] {
            view.host_routes.extend(
                self.host_nl
                    .routes(family)
                    .await?
                    .into_iter()
                    .filter(|r| r.table == MAIN_TABLE),
            );
        }
        Ok(view)
    }

    /// Removes what the plan names, going on after failures; objects already gone are not
    /// errors. `pod` is the sandbox's netns and interface, when the netns still exists: that
    /// interface is the sandbox's by definition (deleting it removes its veth pair).
    pub async fn teardown(
        &self,
        plan: &TeardownPlan,
        pod: Option<(&NetNs, &str)>,
    ) -> Vec<ApplyError> {
        let mut errors = Vec::new();
        let mut keep = |r: Result<(), NetlinkError>| {
            if let Err(e) = r
                && !e.is_not_found()
            {
                errors.push(ApplyError::from(e));
            }
        };
        for family in plan.families() {
            match self.host_nl.rules(family).await {
                Ok(rules) => {
                    for rule in rules.iter().filter(|r| plan.owns_rule(r)) {
                        keep(self.host_nl.delete_rule(rule).await);
                    }
                }
                Err(e) => keep(Err(e)),
            }
        }
        for route in &plan.routes {
            keep(self.host_nl.delete_route(route).await);
        }
        for link in &plan.host_veths {
            keep(self.host_nl.delete_link(link.index).await);
        }
        if let Some((ns, ifname)) = pod {
            match ns.connect().await {
                Ok(pod_nl) => {
                    keep(pod_nl.delete_link_by_name(ifname).await.map(|_| ()));
                    // A multi-NIC pod's further interfaces (`mNicIf<i>`) are the sandbox's too.
                    match pod_nl.links().await {
                        Ok(links) => {
                            for l in links.iter().filter(|l| is_multi_nic_interface(&l.name)) {
                                keep(pod_nl.delete_link(l.index).await);
                            }
                        }
                        Err(e) => keep(Err(e)),
                    }
                }
                Err(e) => keep(Err(e)),
            }
        }
        errors
    }

    /// The indexes of a multi-NIC pod's further interfaces present in `pod` (`mNicIf<i>`).
    pub async fn multi_nic_interfaces(&self, pod: &NetNs) -> Result<Vec<u32>, ApplyError> {
        let pod_nl = pod.connect().await?;
        Ok(pod_nl
            .links()
            .await?
            .iter()
            .filter_map(|l| l.name.strip_prefix("mNicIf")?.parse().ok())
            .collect())
    }
}
fn ignore_missing_key(r: Result<(), SysctlError>) -> Result<(), ApplyError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other.map_err(ApplyError::from),
    }
}

/// Addresses in an ipamd reply.
#[must_use]
pub fn reply_addresses(meta: &[ipamd_proto::rpc::IpAllocationMetadata]) -> Vec<IpAddr> {
    meta.iter()
        .flat_map(|m| [m.i_pv4_addr.as_str(), m.i_pv6_addr.as_str()])
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// A multi-NIC pod's further interface (`mNicIf<i>`).
fn is_multi_nic_interface(name: &str) -> bool {
    name.strip_prefix("mNicIf")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}
