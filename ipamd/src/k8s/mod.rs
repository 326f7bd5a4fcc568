//! ipamd's view of Kubernetes, shaped like the domain: this node's facts ([`NodeFacts`]), the
//! cluster's ENIConfigs, events on the aws-node pod and pod annotations. The pure rules live
//! here (ENIConfig name precedence, where a new ENI goes, max-pods fallback, event dedup, the
//! node's warm-target annotations, the address-capacity condition and taint);
//! [`cluster`] is the thin `kube` implementation (client, watches, writes); [`tasks`] the
//! client's long-running work and its supervision, [`event_queue`] the queue of Events posted
//! without waiting. Must not: read env (settings come from `config`), touch EC2 or the
//! datastore, spawn detached work.

pub mod cluster;
pub mod event_queue;
pub mod node_follower;
pub mod startup;
pub mod tasks;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

pub use cluster::{Cluster, ConfigMapRead, KubeError};
pub use tasks::ClusterTasks;

/// The node label that, when present, names the ENIConfig (managed out of band).
pub const EXTERNAL_ENI_CONFIG_LABEL: &str = "vpc.amazonaws.com/externalEniConfig";
/// The ENIConfig name used when the node names none.
pub const DEFAULT_ENI_CONFIG_NAME: &str = "default";
/// The fallback max-pods when neither the Node nor the instance table knows it.
pub const DEFAULT_MAX_PODS: u32 = 110;
/// The taint a cordoned node carries.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
/// The pod annotation `ANNOTATE_POD_IP` writes.
pub const POD_IPS_ANNOTATION: &str = "vpc.amazonaws.com/pod-ips";
/// The Warning reason when EC2 answers `UnauthorizedOperation`.
pub const REASON_MISSING_IAM: &str = "MissingIAMPermissions";
/// Ours: a new ENI could not be placed by custom networking.
pub const REASON_ENI_CONFIG: &str = "ENIConfigNotUsable";
/// Ours: the primary interface filters reverse paths strictly (`rp_filter` 1), which the privileged
/// init container should have set to 2.
pub const REASON_RP_FILTER: &str = "StrictReversePathFilter";
/// The VPC Resource Controller's pod annotation naming a branch pod's branch ENI(s).
pub const POD_ENI_ANNOTATION: &str = "vpc.amazonaws.com/pod-eni";
/// The extended resource a branch pod requests (names starting with it match).
pub const POD_ENI_RESOURCE: &str = "vpc.amazonaws.com/pod-eni";
/// `CNINode` feature: ipamd asks the VPC Resource Controller for a trunk ENI.
pub const FEATURE_SECURITY_GROUPS_FOR_PODS: &str = "SecurityGroupsForPods";
/// `CNINode` feature: the node's ENIConfig, for the controller's trunk and branches.
pub const FEATURE_CUSTOM_NETWORKING: &str = "CustomNetworking";

/// Ours: the Node annotations that override the environment's warm targets on this node
/// (precedence node > env; ENIConfig carries no warm targets, here or upstream), each with the
/// variable it overrides.
pub const WARM_ANNOTATIONS: [(&str, &str); 4] = [
    ("networking.k8s.aws/warm-ip-target", "WARM_IP_TARGET"),
    ("networking.k8s.aws/minimum-ip-target", "MINIMUM_IP_TARGET"),
    ("networking.k8s.aws/warm-eni-target", "WARM_ENI_TARGET"),
    (
        "networking.k8s.aws/warm-prefix-target",
        "WARM_PREFIX_TARGET",
    ),
];
/// Ours: the Warning reason when the node's warm-target annotations are refused.
pub const REASON_WARM_TARGETS_REFUSED: &str = "WarmTargetsRefused";

/// The node's warm-target annotations ([`WARM_ANNOTATIONS`]) read into overrides, with the
/// annotations given (key, value). A value that is not a count refuses the whole set: the
/// environment's targets stay in force (never half a node's settings).
pub fn warm_overrides(
    annotations: &BTreeMap<String, String>,
) -> Result<
    (
        ipam_core::pool::warm_override::WarmOverrides,
        Vec<(String, String)>,
    ),
    ipam_core::pool::warm_override::OverrideRefusal,
> {
    use ipam_core::pool::warm_override::WarmOverrides;
    let mut o = WarmOverrides::default();
    let mut given = Vec::new();
    for (key, var) in WARM_ANNOTATIONS {
        let Some(value) = annotations.get(key) else {
            continue;
        };
        given.push((key.to_owned(), value.clone()));
        let n = WarmOverrides::count(key, value)?;
        let slot = match var {
            "WARM_IP_TARGET" => &mut o.warm_ip,
            "MINIMUM_IP_TARGET" => &mut o.minimum_ip,
            "WARM_ENI_TARGET" => &mut o.warm_eni,
            _ => &mut o.warm_prefix,
        };
        *slot = Some(n);
    }
    Ok((o, given))
}

/// Ours: the Node condition ipamd publishes (status `True` while the node can still obtain an
/// address for a new pod); see docs/kubernetes.md.
pub const ADDRESS_CAPACITY_CONDITION: &str = "networking.k8s.aws/AddressCapacity";
/// Ours: the `NoSchedule` taint ipamd puts on its Node while it can obtain no further address
/// (`IPAMD_ADDRESS_CAPACITY_TAINT=true`).
pub const ADDRESS_CAPACITY_TAINT: &str = "networking.k8s.aws/address-capacity-exhausted";

/// The address-capacity condition as ipamd publishes it (`lastTransitionTime` is set by the
/// writer when the status changes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapacityCondition {
    /// `True` (addresses can be had) or `False`.
    pub available: bool,
    /// `reason` (CamelCase).
    pub reason: &'static str,
    /// `message`.
    pub message: String,
}

/// The condition for a node that `exhausted` or not, with its figure and cni-metrics-helper's
/// forecast of its subnets' exhaustion (`subnets_run_out`, when there is one).
#[must_use]
pub fn capacity_condition(
    exhausted: bool,
    c: &ipam_core::pool::capacity::AddressCapacity,
    subnets_run_out: Option<std::time::SystemTime>,
) -> CapacityCondition {
    let mut message = format!(
        "{} address(es) obtainable for new pods: {} free, {} cooling down, {} more from EC2 (bound: {})",
        c.obtainable,
        c.free,
        c.cooling,
        c.from_ec2,
        c.bound.as_str()
    );
    if let Some(at) = subnets_run_out {
        message.push_str(&format!(
            "; subnets forecast to run out at {} (cni-metrics-helper)",
            ipam_core::pool::subnet_inventory::rfc3339(at)
        ));
    }
    if exhausted {
        CapacityCondition {
            available: false,
            reason: "AddressesExhausted",
            message,
        }
    } else {
        CapacityCondition {
            available: true,
            reason: "AddressesAvailable",
            message,
        }
    }
}

/// What ipamd needs of a pod (security groups for pods: AddNetwork/DelNetwork of a branch pod).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodFacts {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// The first container's limits name a resource starting with `vpc.amazonaws.com/pod-eni`.
    pub requests_pod_eni: bool,
}

/// One `CNINode` `spec.features[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct CniNodeFeature {
    /// `name` (`SecurityGroupsForPods`, `CustomNetworking`).
    pub name: String,
    /// `value` (the ENIConfig name for custom networking; empty otherwise).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// The `CNINode` features with `name=value` added, or None when that exact entry is already there.
/// An entry of the same name with another value (the ENIConfig name changed while the node lived)
/// is replaced.
#[must_use]
pub fn with_feature(
    existing: &[CniNodeFeature],
    name: &str,
    value: &str,
) -> Option<Vec<CniNodeFeature>> {
    if existing.iter().any(|f| f.name == name && f.value == value) {
        return None;
    }
    let mut out: Vec<CniNodeFeature> = existing
        .iter()
        .filter(|f| f.name != name)
        .cloned()
        .collect();
    out.push(CniNodeFeature {
        name: name.to_owned(),
        value: value.to_owned(),
    });
    Some(out)
}

/// What ipamd needs of its Node object.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `status.capacity.pods`, when it is an integer.
    pub capacity_pods: Option<u32>,
    /// `spec.taints` holds `node.kubernetes.io/unschedulable` with effect `NoSchedule` (what
    /// `kubectl cordon` leads to; key and effect both match).
    pub unschedulable: bool,
    /// Every taint key in `spec.taints`, sorted (`REMOVE_STARTUP_TAINT` looks for its key).
    pub taint_keys: Vec<String>,
    /// The status of the Node's [`ADDRESS_CAPACITY_CONDITION`] (`True`/`False`/…), None
    /// without one: what the address-capacity task compares with what it wrote.
    pub capacity_condition: Option<String>,
}

/// An ENIConfig's spec as ipamd uses it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EniConfigSpec {
    /// `spec.subnet`.
    pub subnet: String,
    /// `spec.securityGroups` (empty: the subnet's VPC default group, as EC2 does).
    pub security_groups: Vec<String>,
    /// Ours: its warm-target annotations ([`WARM_ANNOTATIONS`]: the level between the node's
    /// and the environment's, docs/kubernetes.md), only those keys (key → value).
    pub warm_annotations: BTreeMap<String, String>,
}

/// The cluster's ENIConfigs by name.
pub type EniConfigs = BTreeMap<String, EniConfigSpec>;

/// How ENIConfig names are found on the node: a setting, so its type lives in `config`.
pub use crate::config::EniConfigKeys;

/// The node's ENIConfig name: the label `vpc.amazonaws.com/externalEniConfig`, then the annotation,
/// then the label, then `default`. A key present with an empty value wins.
#[must_use]
pub fn eni_config_name(facts: &NodeFacts, keys: &EniConfigKeys) -> String {
    facts
        .labels
        .get(EXTERNAL_ENI_CONFIG_LABEL)
        .or_else(|| facts.annotations.get(&keys.annotation))
        .or_else(|| facts.labels.get(&keys.label))
        .cloned()
        .unwrap_or_else(|| DEFAULT_ENI_CONFIG_NAME.to_owned())
}

/// Where a new ENI goes: the EC2 port's own type (the core crate), which [`placement`] fills.
pub use ipam_core::pool::ec2_port::EniPlacement;

/// Why custom networking refuses to create an ENI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementRefusal {
    /// The Node object has not been read (API server unreachable so far).
    #[error("the Node object is not known yet (API server not reached)")]
    NodeUnknown,
    /// No ENIConfig of that name.
    #[error("ENIConfig {name:?} not found")]
    MissingEniConfig {
        /// The ENIConfig name the node resolves to.
        name: String,
    },
    /// The ENIConfig's subnet is in another availability zone.
    #[error("ENIConfig {name:?}: subnet {subnet} is in {subnet_az}, this instance in {node_az}")]
    WrongZone {
        /// ENIConfig name.
        name: String,
        /// Its subnet.
        subnet: String,
        /// The subnet's zone.
        subnet_az: String,
        /// The instance's zone.
        node_az: String,
    },
    /// EC2 does not know the subnet.
    #[error("ENIConfig {name:?}: subnet {subnet} not found in EC2")]
    UnknownSubnet {
        /// ENIConfig name.
        name: String,
        /// Its subnet.
        subnet: String,
    },
}

impl PlacementRefusal {
    /// Short label for the metric.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NodeUnknown => "node_unknown",
            Self::MissingEniConfig { .. } => "missing_eniconfig",
            Self::WrongZone { .. } => "wrong_zone",
            Self::UnknownSubnet { .. } => "unknown_subnet",
        }
    }
}

/// The ENIConfig a new ENI must use: step one of the placement (before the subnet's zone is
/// known).
pub fn chosen_eni_config(
    facts: Option<&NodeFacts>,
    configs: &EniConfigs,
    keys: &EniConfigKeys,
) -> Result<(String, EniConfigSpec), PlacementRefusal> {
    let facts = facts.ok_or(PlacementRefusal::NodeUnknown)?;
    let name = eni_config_name(facts, keys);
    match configs.get(&name) {
        Some(spec) => Ok((name, spec.clone())),
        None => Err(PlacementRefusal::MissingEniConfig { name }),
    }
}

/// Step two: the subnet must be in the instance's zone (`subnet_az` None: EC2 does not know it).
pub fn placement(
    name: &str,
    spec: &EniConfigSpec,
    subnet_az: Option<&str>,
    node_az: &str,
) -> Result<EniPlacement, PlacementRefusal> {
    match subnet_az {
        None => Err(PlacementRefusal::UnknownSubnet {
            name: name.to_owned(),
            subnet: spec.subnet.clone(),
        }),
        Some(az) if az != node_az => Err(PlacementRefusal::WrongZone {
            name: name.to_owned(),
            subnet: spec.subnet.clone(),
            subnet_az: az.to_owned(),
            node_az: node_az.to_owned(),
        }),
        Some(_) => Ok(EniPlacement {
            eni_config: name.to_owned(),
            subnet_id: spec.subnet.clone(),
            security_groups: spec.security_groups.clone(),
        }),
    }
}

/// Max pods: our `IPAMD_MAX_PODS` override, else the Node's `status.capacity.pods`, else the
/// instance type's eni-max-pods value, else 110.
#[must_use]
pub fn effective_max_pods(
    override_: Option<u32>,
    node_capacity: Option<u32>,
    table: Option<u32>,
) -> u32 {
    override_
        .or(node_capacity)
        .or(table)
        .unwrap_or(DEFAULT_MAX_PODS)
}

/// A Kubernetes event on the aws-node pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodEvent {
    /// `Normal` or `Warning`.
    pub warning: bool,
    /// Reason (CamelCase).
    pub reason: String,
    /// Action (the EC2 API name).
    pub action: String,
    /// Message.
    pub message: String,
}

/// Drops an event identical to one sent less than `window` ago (client-go's recorder
/// aggregates the same way; a pool loop retrying every 5 s must not flood the API server).
#[derive(Debug)]
pub struct EventDedup {
    window: Duration,
    sent: Mutex<HashMap<PodEvent, Instant>>,
}

impl EventDedup {
    /// Dedup with this window.
    #[must_use]
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            sent: Mutex::new(HashMap::new()),
        }
    }

    /// True if `ev` should be sent at `now` (and remembers it).
    pub fn admit(&self, ev: &PodEvent, now: Instant) -> bool {
        let mut sent = self
            .sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        sent.retain(|_, at| now.saturating_duration_since(*at) < self.window);
        if sent.contains_key(ev) {
            return false;
        }
        sent.insert(ev.clone(), now);
        true
    }

    /// Forgets that `ev` was admitted (it was not sent after all: an identical one may go
    /// at once).
    pub fn forget(&self, ev: &PodEvent) {
        self.sent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(ev);
    }
}

/// How long a Warning on a pod keeps being bumped (count, lastTimestamp) rather than a new
/// Event created: client-go's event correlator's 10 minutes, as kubelet's events.
pub const POD_EVENT_SERIES_WINDOW: Duration = Duration::from_secs(600);
/// How many (pod, reason) series are remembered (client-go's LRU holds 4096).
const POD_EVENT_SERIES_MAX: usize = 4096;

/// What to do with a failure Warning on a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodEventWrite {
    /// Create a new Event of this name (count 1).
    Create {
        /// `metadata.name`.
        name: String,
    },
    /// Bump the existing Event: this count, lastTimestamp now, the latest message.
    Bump {
        /// `metadata.name`.
        name: String,
        /// The new `count`.
        count: u32,
    },
}

/// The Warning Events written on pods, deduplicated as kubelet's are (client-go's event
/// correlator): the same pod (namespace, name, uid) and reason within
/// [`POD_EVENT_SERIES_WINDOW`] of the last one bumps that Event's `count` and
/// `lastTimestamp` (and takes the latest message) instead of creating another.
#[derive(Debug, Default)]
pub struct PodEventSeries {
    series: Mutex<HashMap<SeriesKey, (String, u32, Instant)>>,
}

/// A series: (namespace, name, uid, reason).
type SeriesKey = (String, String, String, String);

impl PodEventSeries {
    /// Decides the write for a failure of pod `ns/name` (`uid`) with `reason` at `now`;
    /// `stamp` makes a new Event's name unique (kubelet: the time in hex).
    pub fn next(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        reason: &str,
        now: Instant,
        stamp: u128,
    ) -> PodEventWrite {
        let mut series = self
            .series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (
            ns.to_owned(),
            name.to_owned(),
            uid.to_owned(),
            reason.to_owned(),
        );
        if let Some((event, count, last)) = series.get_mut(&key)
            && now.saturating_duration_since(*last) < POD_EVENT_SERIES_WINDOW
        {
            *count += 1;
            *last = now;
            return PodEventWrite::Bump {
                name: event.clone(),
                count: *count,
            };
        }
        if series.len() >= POD_EVENT_SERIES_MAX {
            series.retain(|_, (_, _, last)| {
                now.saturating_duration_since(*last) < POD_EVENT_SERIES_WINDOW
            });
            if series.len() >= POD_EVENT_SERIES_MAX {
                series.clear();
            }
        }
        let event = format!("{name}.{stamp:x}");
        series.insert(key, (event.clone(), 1, now));
        PodEventWrite::Create { name: event }
    }

    /// Forgets a series whose Event could not be bumped (deleted meanwhile): the next failure
    /// creates a new one.
    pub fn forget(&self, ns: &str, name: &str, uid: &str, reason: &str) {
        self.series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&(
                ns.to_owned(),
                name.to_owned(),
                uid.to_owned(),
                reason.to_owned(),
            ));
    }
}

/// Reports a refused placement (log line, metric, event): supplied by the composition root.
pub type RefusalReporter = Arc<dyn Fn(&PlacementRefusal) + Send + Sync>;

/// Custom networking's inputs for the EC2 provider: the live Node facts and ENIConfigs and the
/// name keys, plus who to tell when no ENI can be placed.
#[derive(Clone)]
pub struct CustomNetwork {
    /// This node's facts (None until first read).
    pub node: watch::Receiver<Option<NodeFacts>>,
    /// The cluster's ENIConfigs.
    pub eni_configs: watch::Receiver<Arc<EniConfigs>>,
    /// Name keys.
    pub keys: EniConfigKeys,
    /// Refusal reporter.
    pub report: RefusalReporter,
}

impl std::fmt::Debug for CustomNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomNetwork")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl CustomNetwork {
    /// Step one on the current facts.
    pub fn choose(&self) -> Result<(String, EniConfigSpec), PlacementRefusal> {
        let node = self.node.borrow().clone();
        let configs = self.eni_configs.borrow().clone();
        chosen_eni_config(node.as_ref(), &configs, &self.keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> EniConfigKeys {
        EniConfigKeys {
            annotation: "k8s.amazonaws.com/eniConfig".into(),
            label: "topology.kubernetes.io/zone".into(),
        }
    }

    fn facts(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            capacity_pods: None,
            unschedulable: false,
            taint_keys: Vec::new(),
            capacity_condition: None,
        }
    }

    #[test]
    fn warm_annotations_are_read_or_refused_as_a_whole() {
        let a = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let (o, given) = warm_overrides(&a(&[
            ("networking.k8s.aws/warm-ip-target", "3"),
            ("networking.k8s.aws/minimum-ip-target", "10"),
            ("other", "x"),
        ]))
        .unwrap();
        assert_eq!(
            (o.warm_ip, o.minimum_ip, o.warm_eni),
            (Some(3), Some(10), None)
        );
        assert_eq!(given.len(), 2);
        assert!(warm_overrides(&a(&[])).unwrap().0.is_empty());
        let e = warm_overrides(&a(&[
            ("networking.k8s.aws/warm-ip-target", "3"),
            ("networking.k8s.aws/warm-eni-target", "lots"),
        ]))
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("networking.k8s.aws/warm-eni-target=\"lots\""),
            "{e}"
        );
    }

    /// upstream pkg/eniconfig GetNodeSpecificENIConfigName
    #[test]
    fn name_precedence_is_upstreams() {
        let k = keys();
        let ext = (EXTERNAL_ENI_CONFIG_LABEL, "ext");
        let ann = ("k8s.amazonaws.com/eniConfig", "ann");
        let lab = ("topology.kubernetes.io/zone", "us-west-2a");
        assert_eq!(eni_config_name(&facts(&[ext, lab], &[ann]), &k), "ext");
        assert_eq!(eni_config_name(&facts(&[lab], &[ann]), &k), "ann");
        assert_eq!(eni_config_name(&facts(&[lab], &[]), &k), "us-west-2a");
        assert_eq!(eni_config_name(&facts(&[], &[]), &k), "default");
        // the annotation key as a label does not count
        assert_eq!(
            eni_config_name(&facts(&[("k8s.amazonaws.com/eniConfig", "x")], &[]), &k),
            "default"
        );
        // present but empty wins, as a Go map lookup
        assert_eq!(
            eni_config_name(&facts(&[lab], &[("k8s.amazonaws.com/eniConfig", "")]), &k),
            ""
        );
    }

    #[test]
    fn placement_needs_node_config_and_zone() {
        let k = keys();
        let mut configs = EniConfigs::new();
        assert_eq!(
            chosen_eni_config(None, &configs, &k),
            Err(PlacementRefusal::NodeUnknown)
        );
        let f = facts(&[("topology.kubernetes.io/zone", "us-west-2a")], &[]);
        assert_eq!(
            chosen_eni_config(Some(&f), &configs, &k),
            Err(PlacementRefusal::MissingEniConfig {
                name: "us-west-2a".into()
            })
        );
        let spec = EniConfigSpec {
            subnet: "subnet-a".into(),
            security_groups: vec!["sg-1".into(), "sg-2".into()],
            warm_annotations: BTreeMap::new(),
        };
        configs.insert("us-west-2a".into(), spec.clone());
        let (name, got) = chosen_eni_config(Some(&f), &configs, &k).unwrap();
        assert_eq!((name.as_str(), &got), ("us-west-2a", &spec));
        assert_eq!(
            placement(&name, &got, Some("us-west-2b"), "us-west-2a")
                .unwrap_err()
                .kind(),
            "wrong_zone"
        );
        assert_eq!(
            placement(&name, &got, None, "us-west-2a")
                .unwrap_err()
                .kind(),
            "unknown_subnet"
        );
        let p = placement(&name, &got, Some("us-west-2a"), "us-west-2a").unwrap();
        assert_eq!(p.subnet_id, "subnet-a");
        assert_eq!(p.security_groups, vec!["sg-1", "sg-2"]);
    }

    /// upstream ipamd.go nodeInit: node capacity, else eni-max-pods.txt, else 110
    #[test]
    fn max_pods_fallback_is_upstreams() {
        assert_eq!(effective_max_pods(None, Some(58), Some(29)), 58);
        assert_eq!(effective_max_pods(None, None, Some(29)), 29);
        assert_eq!(effective_max_pods(None, None, None), 110);
        assert_eq!(effective_max_pods(Some(7), Some(58), Some(29)), 7);
    }

    #[test]
    fn a_pods_warnings_of_one_reason_bump_one_event_within_the_window() {
        let s = PodEventSeries::default();
        let t0 = Instant::now();
        let first = s.next("default", "web", "u1", "SubnetFull", t0, 0xa);
        assert_eq!(
            first,
            PodEventWrite::Create {
                name: "web.a".into()
            }
        );
        assert_eq!(
            s.next(
                "default",
                "web",
                "u1",
                "SubnetFull",
                t0 + Duration::from_secs(30),
                0xb
            ),
            PodEventWrite::Bump {
                name: "web.a".into(),
                count: 2
            }
        );
        // another reason, another pod (or a re-created one: another uid): new Events
        assert!(matches!(
            s.next("default", "web", "u1", "MaxPods", t0, 0xc),
            PodEventWrite::Create { .. }
        ));
        assert!(matches!(
            s.next("default", "web", "u2", "SubnetFull", t0, 0xd),
            PodEventWrite::Create { .. }
        ));
        // the window runs from the last bump
        assert!(matches!(
            s.next(
                "default",
                "web",
                "u1",
                "SubnetFull",
                t0 + Duration::from_secs(600),
                0xe
            ),
            PodEventWrite::Bump { count: 3, .. }
        ));
        assert_eq!(
            s.next(
                "default",
                "web",
                "u1",
                "SubnetFull",
                t0 + Duration::from_secs(1300),
                0xf
            ),
            PodEventWrite::Create {
                name: "web.f".into()
            }
        );
        s.forget("default", "web", "u1", "SubnetFull");
        assert!(matches!(
            s.next(
                "default",
                "web",
                "u1",
                "SubnetFull",
                t0 + Duration::from_secs(1301),
                0x10
            ),
            PodEventWrite::Create { .. }
        ));
    }

    #[test]
    fn identical_events_are_sent_once_per_window() {
        let d = EventDedup::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let ev = PodEvent {
            warning: true,
            reason: REASON_MISSING_IAM.into(),
            action: "ec2:CreateNetworkInterface".into(),
            message: "m".into(),
        };
        assert!(d.admit(&ev, t0));
        assert!(!d.admit(&ev, t0 + Duration::from_secs(59)));
        let other = PodEvent {
            action: "ec2:AssignPrivateIpAddresses".into(),
            ..ev.clone()
        };
        assert!(d.admit(&other, t0 + Duration::from_secs(1)));
        assert!(d.admit(&ev, t0 + Duration::from_secs(61)));
    }

    #[test]
    fn cninode_features_are_added_once_and_replaced_by_name() {
        let sgp = CniNodeFeature {
            name: FEATURE_SECURITY_GROUPS_FOR_PODS.into(),
            value: String::new(),
        };
        let added = with_feature(&[], FEATURE_SECURITY_GROUPS_FOR_PODS, "").unwrap();
        assert_eq!(added, std::slice::from_ref(&sgp));
        assert_eq!(
            with_feature(&added, FEATURE_SECURITY_GROUPS_FOR_PODS, ""),
            None
        );
        let cn = with_feature(&added, FEATURE_CUSTOM_NETWORKING, "az-a").unwrap();
        assert_eq!(cn.len(), 2);
        let renamed = with_feature(&cn, FEATURE_CUSTOM_NETWORKING, "az-b").unwrap();
        assert_eq!(
            renamed,
            [
                sgp,
                CniNodeFeature {
                    name: FEATURE_CUSTOM_NETWORKING.into(),
                    value: "az-b".into()
                }
            ]
        );
    }
}
