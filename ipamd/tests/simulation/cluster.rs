//! The API server's pods as security groups for pods needs them, and the VPC Resource
//! Controller's stand-in: pod objects (UID, whether a container asks for
//! `vpc.amazonaws.com/pod-eni`, the `vpc.amazonaws.com/pod-eni` annotation), the trunk ENI,
//! one branch ENI per annotated pod with a VLAN id (the lowest free one: a freed id is reused
//! by the next branch pod, as the controller does), and the branch ENI deleted a cooldown
//! after its pod object went. ipamd reads the pods through `sgp::PodDirectory` and the trunk's
//! link through `sgp::LinkIndex`, each read an await point. Must not decide anything ipamd or
//! the plugin decides.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use ipamd::aws::fake::FakeCloud;
use ipamd::k8s::{POD_ENI_ANNOTATION, PodFacts};
use ipamd::sgp::{LinkIndex, PodDirectory, SeamFuture};

use super::exec::yield_now;

/// A branch ENI the controller gave a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Branch {
    pub eni: String,
    pub vlan: u16,
    pub ip: Ipv4Addr,
    pub mac: String,
}

#[derive(Debug, Clone)]
struct Pod {
    uid: String,
    /// A container's limits name `vpc.amazonaws.com/pod-eni` (the webhook's doing for a pod
    /// a `SecurityGroupPolicy` selects).
    wants_branch: bool,
    branch: Option<Branch>,
}

#[derive(Debug, Default)]
struct State {
    pods: BTreeMap<String, Pod>,
    trunk: Option<String>,
    /// VLAN id → the branch ENI holding it (annotated on a pod, or cooling).
    vlans: BTreeMap<u16, String>,
    /// Branch ENIs of deleted pods: (ENI, VLAN id, the second it is deleted).
    cooling: Vec<(String, u16, u64)>,
}

/// The cluster (clones share it).
#[derive(Debug, Clone, Default)]
pub struct SimCluster(Arc<Mutex<State>>);

/// The trunk ENI's link index on the host (any: the plugin is not run).
pub const TRUNK_LINK_INDEX: u32 = 3;

impl SimCluster {
    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A pod object created (a new pod, or one re-created under the name of a deleted one).
    pub fn create_pod(&self, name: &str, uid: &str, wants_branch: bool) {
        self.st().pods.insert(
            name.to_owned(),
            Pod {
                uid: uid.to_owned(),
                wants_branch,
                branch: None,
            },
        );
    }

    /// The pod object is gone from the API server; its branch ENI (if any) cools for
    /// `cooldown` seconds from `now`, then is deleted and its VLAN id is free.
    pub fn delete_pod(&self, name: &str, now: u64, cooldown: u64) -> Option<Branch> {
        let mut st = self.st();
        let pod = st.pods.remove(name)?;
        let b = pod.branch?;
        st.cooling.push((b.eni.clone(), b.vlan, now + cooldown));
        Some(b)
    }

    /// The pod's UID now (None: no such pod).
    pub fn uid(&self, name: &str) -> Option<String> {
        self.st().pods.get(name).map(|p| p.uid.clone())
    }

    pub fn trunk(&self) -> Option<String> {
        self.st().trunk.clone()
    }

    /// The controller attaches a trunk ENI at the lowest free device index of card 0 below
    /// `max_enis` (none free: not now).
    pub fn attach_trunk(&self, fake: &FakeCloud, max_enis: u32) -> Option<String> {
        if self.st().trunk.is_some() {
            return None;
        }
        let me = fake.instance_id();
        let used: Vec<u32> = fake
            .all_enis()
            .iter()
            .filter_map(|e| e.attachment.as_ref())
            .filter(|a| a.instance_id == me && a.network_card == 0)
            .map(|a| a.device_index)
            .collect();
        let free = (0..max_enis).find(|d| !used.contains(d))?;
        let id = fake.add_trunk_eni(free);
        self.st().trunk = Some(id.clone());
        Some(id)
    }

    /// Branch pods the controller has not annotated yet.
    pub fn unannotated(&self) -> Vec<String> {
        self.st()
            .pods
            .iter()
            .filter(|(_, p)| p.wants_branch && p.branch.is_none())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The controller gives pod `name` a branch ENI (trunk attached, room in the subnet) and
    /// the lowest free VLAN id, and writes the annotation.
    pub fn annotate(&self, fake: &FakeCloud, name: &str) -> Option<Branch> {
        let trunk = self.trunk()?;
        if !self.unannotated().iter().any(|n| n == name) {
            return None;
        }
        let vlan = {
            let st = self.st();
            (1..=4094u16).find(|v| !st.vlans.contains_key(v))?
        };
        let eni = fake.add_branch_eni(&trunk)?;
        let e = fake.eni(&eni)?;
        let b = Branch {
            eni: eni.clone(),
            vlan,
            ip: e.primary_ip,
            mac: e.mac,
        };
        let mut st = self.st();
        st.vlans.insert(vlan, eni);
        if let Some(p) = st.pods.get_mut(name) {
            p.branch = Some(b.clone());
        }
        Some(b)
    }

    /// Branch ENIs whose cooldown ended are deleted (their address back in the subnet, their
    /// VLAN id free).
    pub fn free_due(&self, fake: &FakeCloud, now: u64) -> Vec<(String, u16)> {
        let mut st = self.st();
        let (due, keep): (Vec<_>, Vec<_>) = st.cooling.drain(..).partition(|c| c.2 <= now);
        st.cooling = keep;
        let mut out = Vec::new();
        for (eni, vlan, _) in due {
            fake.remove_eni(&eni);
            st.vlans.remove(&vlan);
            out.push((eni, vlan));
        }
        out
    }

    fn facts(&self, name: &str) -> Option<PodFacts> {
        let st = self.st();
        let p = st.pods.get(name)?;
        let mut annotations = BTreeMap::new();
        if let Some(b) = &p.branch {
            annotations.insert(
                POD_ENI_ANNOTATION.to_owned(),
                serde_json::json!([{
                    "eniId": b.eni,
                    "ifAddress": b.mac,
                    "privateIp": b.ip.to_string(),
                    "vlanId": b.vlan,
                    "subnetCidr": "198.18.0.0/24",
                }])
                .to_string(),
            );
        }
        Some(PodFacts {
            uid: p.uid.clone(),
            annotations,
            requests_pod_eni: p.wants_branch,
        })
    }
}

impl PodDirectory for SimCluster {
    fn pod<'a>(
        &'a self,
        _namespace: &'a str,
        name: &'a str,
    ) -> SeamFuture<'a, Result<Option<PodFacts>, ipamd::sgp::SeamError>> {
        Box::pin(async move {
            // The API call: the pod is read when the answer comes.
            yield_now().await;
            Ok(self.facts(name))
        })
    }

    fn annotated_pods_on_node<'a>(
        &'a self,
        _annotation: &'a str,
    ) -> SeamFuture<'a, Result<ipamd::sgp::AnnotatedPods, ipamd::sgp::SeamError>> {
        Box::pin(async move { Ok(Vec::new()) })
    }
}

/// The host's trunk link (found by any MAC: the simulation has one trunk).
#[derive(Debug, Clone, Copy)]
pub struct SimLinks;

impl LinkIndex for SimLinks {
    fn link_index<'a>(
        &'a self,
        _mac: &'a str,
    ) -> SeamFuture<'a, Result<u32, ipamd::sgp::SeamError>> {
        Box::pin(async move {
            yield_now().await;
            Ok(TRUNK_LINK_INDEX)
        })
    }
}
