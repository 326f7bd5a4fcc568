//! The `kube` implementation of ipamd's Kubernetes seam: builds the client (kubeconfig or
//! in-cluster, `CLUSTER_ENDPOINT` overriding the server), waits for the API server at start, keeps
//! this Node and the ENIConfigs in `watch` channels through `kube::runtime::watcher` (relist on 410
//! and back-off come from the watcher: no polling), posts events on the aws-node pod (directly, or
//! queued for its event poster) and patches pod annotations. The watches and the poster are tasks
//! `connect` returns ([`ClusterTasks`]), never spawned here. Must not decide anything (the rules
//! are in the parent module), read env, or crash the daemon when the API server is away.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{CustomResource, ResourceExt as _};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::event_queue::{EVENT_QUEUE_CAPACITY, EventQueue, QueuedEvent};
use super::{
    ClusterTasks, EniConfigSpec, EniConfigs, EventDedup, NodeFacts, PodEvent, PodEventSeries,
    PodEventWrite,
};
use crate::config::{KubeSettings, KubeSource};

/// The ENIConfig CRD (`crd.k8s.amazonaws.com/v1alpha1`, cluster-scoped).
#[derive(CustomResource, Debug, Clone, Deserialize, Serialize, PartialEq, Eq, Default)]
#[kube(
    group = "crd.k8s.amazonaws.com",
    version = "v1alpha1",
    kind = "ENIConfig",
    plural = "eniconfigs",
    schema = "disabled"
)]
pub struct ENIConfigCrdSpec {
    /// Subnet id.
    pub subnet: String,
    /// Security group ids.
    #[serde(
        rename = "securityGroups",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub security_groups: Vec<String>,
}

/// The VPC Resource Controller's `CNINode` (`vpcresources.k8s.aws/v1alpha1`, cluster-scoped,
/// named after the node): the fields ipamd reads and patches.
#[derive(CustomResource, Debug, Clone, Deserialize, Serialize, PartialEq, Eq, Default)]
#[kube(
    group = "vpcresources.k8s.aws",
    version = "v1alpha1",
    kind = "CNINode",
    plural = "cninodes",
    schema = "disabled"
)]
pub struct CNINodeSpec {
    /// `spec.features`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<super::CniNodeFeature>,
    /// `spec.tags` (the controller's; kept as read).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// Failures of the Kubernetes layer.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig (ours or the in-cluster one) could not be read.
    #[error("kube config: {0}")]
    Config(#[from] kube::config::KubeconfigError),
    /// The server URL is not a URL.
    #[error("CLUSTER_ENDPOINT {0:?} is not a URL")]
    Endpoint(String),
    /// The API call failed.
    #[error("kubernetes api: {0}")]
    Api(#[from] kube::Error),
    /// DEL: the pod's annotation names another address (not blanked).
    #[error(
        "released IP {released} does not match existing annotation {current:?}. Not patching pod"
    )]
    AnnotationMismatch {
        /// The address released.
        released: String,
        /// The annotation's value.
        current: String,
    },
    /// An object kept changing under a read-modify-write.
    #[error("{0}")]
    Conflict(String),
}

/// What ipamd last read of one followed ConfigMap ([`Cluster::follow_config_map`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ConfigMapRead {
    /// Not read yet.
    #[default]
    Pending,
    /// Its `data`.
    Found(BTreeMap<String, String>),
    /// It does not exist (not yet written, or deleted).
    Missing,
    /// The watch fails (refused without the chart's RBAC, API server away); retried with the
    /// watcher's back-off. The last good read is dropped: nothing is used that cannot be
    /// followed.
    Failed(String),
}

/// How long identical events are suppressed.
pub const EVENT_DEDUP_WINDOW: Duration = Duration::from_secs(300);
/// The interval while ipamd must have the API server (custom networking, annotations).
pub const BLOCKING_POLL: Duration = Duration::from_secs(2);
/// The interval and deadline otherwise.
pub const OPTIONAL_POLL: Duration = Duration::from_secs(5);
/// See [`OPTIONAL_POLL`].
pub const OPTIONAL_TIMEOUT: Duration = Duration::from_secs(30);

/// ipamd's handle on the cluster. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    client: kube::Client,
    settings: Arc<KubeSettings>,
    node: watch::Receiver<Option<NodeFacts>>,
    eni_configs: watch::Receiver<Arc<EniConfigs>>,
    dedup: Arc<EventDedup>,
    pod_series: Arc<PodEventSeries>,
    events: EventQueue,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node", &self.settings.node_name)
            .finish_non_exhaustive()
    }
}

/// The client configuration: the kubeconfig file (tests, `KUBECONFIG`) or the in-cluster service
/// account, with `CLUSTER_ENDPOINT` replacing the server.
pub async fn client_config(settings: &KubeSettings) -> Result<kube::Config, KubeError> {
    let kubeconfig = match &settings.source {
        KubeSource::Kubeconfig(path) => kube::config::Kubeconfig::read_from(path)?,
        KubeSource::InCluster {
            host,
            port,
            account_dir,
        } => {
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host.clone()
            };
            let text = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "in-cluster", "cluster": {
                    "server": format!("https://{host}:{port}"),
                    "certificate-authority": account_dir.join("ca.crt"),
                }}],
                "users": [{"name": "sa", "user": {"tokenFile": account_dir.join("token")}}],
                "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "sa"}}],
                "current-context": "in-cluster",
            })
            .to_string();
            kube::config::Kubeconfig::from_yaml(&text)?
        }
    };
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    if let Some(endpoint) = &settings.cluster_endpoint {
        config.cluster_url = endpoint
            .parse()
            .map_err(|_| KubeError::Endpoint(endpoint.clone()))?;
    }
    // the connectivity checks' timeout
    config.connect_timeout = Some(Duration::from_secs(5));
    let program = std::env::args_os().next().unwrap_or_default();
    let agent = user_agent(&program.to_string_lossy(), &settings.vpc_cni_version);
    match hyper::header::HeaderValue::from_str(&agent) {
        Ok(v) => config.headers.push((hyper::header::USER_AGENT, v)),
        Err(_) => tracing::warn!(
            user_agent = agent,
            "VPC_CNI_VERSION cannot be sent in a header; the Kubernetes client sends no User-Agent"
        ),
    }
    Ok(config)
}

/// The Kubernetes client's User-Agent: the program as it was started (`argv[0]`), `-`, and
/// `VPC_CNI_VERSION` (started by aws-node.sh: `/app/ipamd-<version>`).
#[must_use]
pub fn user_agent(program: &str, vpc_cni_version: &str) -> String {
    format!("{program}-{vpc_cni_version}")
}

/// Whether start-up must have the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiDependence {
    /// Custom networking, pod annotation (or SGP): wait until it answers, however long.
    Required,
    /// Otherwise: try for 30 s, then go on (the watches keep connecting in the background).
    Optional,
}

impl Cluster {
    /// Builds the client and makes, without starting them, its tasks: the Node watch, the
    /// ENIConfig watch (when `watch_eni_configs`) and the event poster ([`Self::queue_event`]).
    /// The caller runs them ([`ClusterTasks::beside`], or [`ClusterTasks::run`]); the watches
    /// retry with back-off, so an unreachable API server is never fatal. Every task ends once
    /// `shutdown` is cancelled.
    pub async fn connect(
        settings: KubeSettings,
        watch_eni_configs: bool,
        shutdown: &CancellationToken,
    ) -> Result<(Self, ClusterTasks), KubeError> {
        let config = client_config(&settings).await?;
        let client = kube::Client::try_from(config)?;
        let (node_tx, node) = watch::channel(None);
        let (cfg_tx, eni_configs) = watch::channel(Arc::new(EniConfigs::new()));
        let (events, queued) = EventQueue::new(EVENT_QUEUE_CAPACITY);
        let mut tasks = ClusterTasks::new(shutdown.child_token());
        let stop = tasks.stop_token();
        tasks.push(
            "Node watch",
            watch_node(
                Api::all(client.clone()),
                settings.node_name.clone(),
                node_tx,
                stop.clone(),
            ),
        );
        if watch_eni_configs {
            tasks.push(
                "ENIConfig watch",
                watch_eni_configs_task(Api::all(client.clone()), cfg_tx, stop.clone()),
            );
        }
        let cluster = Self {
            client,
            settings: Arc::new(settings),
            node,
            eni_configs,
            dedup: Arc::new(EventDedup::new(EVENT_DEDUP_WINDOW)),
            pod_series: Arc::new(PodEventSeries::default()),
            events,
        };
        tasks.push("event poster", post_queued(cluster.clone(), queued, stop));
        Ok((cluster, tasks))
    }

    /// One `/version` call.
    pub async fn reachable(&self) -> Result<String, KubeError> {
        Ok(self.client.apiserver_version().await?.git_version)
    }

    /// The start-up wait: `Required` polls every 2 s until the API server answers (a refused
    /// connection is retried, never a crash loop); `Optional` polls every 5 s for up to 30 s.
    /// Returns whether it answered; false also when `shutdown` came first.
    pub async fn wait_reachable(
        &self,
        dependence: ApiDependence,
        shutdown: &CancellationToken,
    ) -> bool {
        let (interval, deadline) = match dependence {
            ApiDependence::Required => (BLOCKING_POLL, None),
            ApiDependence::Optional => (OPTIONAL_POLL, Some(Instant::now() + OPTIONAL_TIMEOUT)),
        };
        loop {
            match self.reachable().await {
                Ok(version) => {
                    tracing::info!(%version, "Successful communication with the Cluster");
                    return true;
                }
                Err(e) => tracing::warn!(error = %e, "Unable to reach API Server"),
            }
            if deadline.is_some_and(|d| Instant::now() + interval > d) {
                tracing::warn!(
                    "Proceeding without API server connectivity; the Node and ENIConfig watches keep connecting in the background"
                );
                return false;
            }
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// Follows the ConfigMap `namespace`/`name` into `tx` until `shutdown`: a watch of that one
    /// object (field selector `metadata.name`, so RBAC `list`/`watch` restricted by
    /// `resourceNames` admits it), relisted and backed off by the watcher. RBAC `get`, `list`,
    /// `watch` on that ConfigMap.
    pub async fn follow_config_map(
        &self,
        namespace: &str,
        name: &str,
        tx: watch::Sender<ConfigMapRead>,
        shutdown: CancellationToken,
    ) {
        use k8s_openapi::api::core::v1::ConfigMap;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut stream = watcher(api, config).default_backoff().boxed();
        // whether the current (re)list found it
        let mut listed = false;
        loop {
            let item = tokio::select! {
                () = shutdown.cancelled() => return,
                item = stream.next() => item,
            };
            let next = match item {
                None => return,
                Some(Ok(watcher::Event::Init)) => {
                    listed = false;
                    continue;
                }
                Some(Ok(watcher::Event::InitApply(c))) => {
                    listed = true;
                    ConfigMapRead::Found(c.data.unwrap_or_default())
                }
                Some(Ok(watcher::Event::Apply(c))) => {
                    ConfigMapRead::Found(c.data.unwrap_or_default())
                }
                Some(Ok(watcher::Event::InitDone)) if listed => continue,
                Some(Ok(watcher::Event::InitDone | watcher::Event::Delete(_))) => {
                    ConfigMapRead::Missing
                }
                Some(Err(e)) => ConfigMapRead::Failed(e.to_string()),
            };
            tx.send_if_modified(|cur| {
                let changed = *cur != next;
                *cur = next;
                changed
            });
        }
    }

    /// This node's facts (None until the Node was first read).
    #[must_use]
    pub fn node(&self) -> watch::Receiver<Option<NodeFacts>> {
        self.node.clone()
    }

    /// The cluster's ENIConfigs (empty until listed).
    #[must_use]
    pub fn eni_configs(&self) -> watch::Receiver<Arc<EniConfigs>> {
        self.eni_configs.clone()
    }

    /// Posts an `events.k8s.io/v1` Event on the aws-node pod (`MY_POD_NAME` in `MY_POD_NAMESPACE`).
    /// Identical events within [`EVENT_DEDUP_WINDOW`] are dropped; returns whether one was sent.
    pub async fn post_event(&self, ev: PodEvent) -> Result<bool, KubeError> {
        if !self.admit(&ev) {
            return Ok(false);
        }
        self.create_event(ev).await?;
        Ok(true)
    }

    /// [`Self::post_event`] without waiting, for code that must not wait on the API server
    /// (node init, the EC2 client's hook, the pool's custom networking): the Event is
    /// deduplicated as `post_event` does, then queued for the event poster (a task of
    /// [`Self::connect`]). A full queue (or a stopped poster) drops it, counted
    /// ([`Self::events_dropped`]) and logged; `what` names it in that warning and in the
    /// poster's if the API call fails ("`what` not posted"). Returns whether it was queued.
    pub fn queue_event(&self, ev: PodEvent, what: &'static str) -> bool {
        if !self.admit(&ev) {
            return false;
        }
        match self.events.offer(ev, what) {
            Ok(()) => true,
            Err((_, ev)) => {
                // not sent: an identical Event may go as soon as there is room
                self.dedup.forget(&ev);
                false
            }
        }
    }

    /// Events [`Self::queue_event`] dropped so far (queue full, poster stopped).
    #[must_use]
    pub fn events_dropped(&self) -> u64 {
        self.events.dropped()
    }

    /// Whether `ev` goes out: there is an aws-node pod to put it on, and no identical Event
    /// went out within [`EVENT_DEDUP_WINDOW`] (remembered as sent).
    fn admit(&self, ev: &PodEvent) -> bool {
        !self.settings.pod_name.is_empty() && self.dedup.admit(ev, Instant::now())
    }

    /// Creates `ev` on the aws-node pod (no dedup).
    async fn create_event(&self, ev: PodEvent) -> Result<(), KubeError> {
        let ns = &self.settings.pod_namespace;
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!(
                    "{}.{:x}",
                    self.settings.pod_name,
                    now.as_nanosecond()
                )),
                namespace: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(ev.action),
            reason: Some(ev.reason),
            note: Some(ev.message),
            type_: Some(if ev.warning { "Warning" } else { "Normal" }.into()),
            reporting_controller: Some("aws-node".into()),
            reporting_instance: Some(self.settings.pod_name.clone()),
            regarding: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(self.settings.pod_name.clone()),
                namespace: Some(ns.clone()),
                ..ObjectReference::default()
            }),
            ..Event::default()
        };
        Api::<Event>::namespaced(self.client.clone(), ns)
            .create(&PostParams::default(), &event)
            .await?;
        Ok(())
    }

    /// Removes every taint with `key` from this node's Node (`REMOVE_STARTUP_TAINT`, the
    /// address-capacity taint): [`Self::edit_taints`]. Returns whether a taint was removed.
    pub async fn remove_node_taint(&self, key: &str) -> Result<bool, KubeError> {
        self.edit_taints(key, |taints| {
            if !taints.iter().any(|t| t.key == key) {
                return false;
            }
            taints.retain(|t| t.key != key);
            true
        })
        .await
    }

    /// Adds the taint `key` with `effect` (no value) to this node's Node unless a taint of that
    /// key is there: [`Self::edit_taints`]. Returns whether it was added.
    pub async fn add_node_taint(&self, key: &str, effect: &str) -> Result<bool, KubeError> {
        self.edit_taints(key, |taints| {
            if taints.iter().any(|t| t.key == key) {
                return false;
            }
            taints.push(k8s_openapi::api::core::v1::Taint {
                key: key.to_owned(),
                effect: effect.to_owned(),
                ..k8s_openapi::api::core::v1::Taint::default()
            });
            true
        })
        .await
    }

    /// Changes this node's `spec.taints` with `edit` (false: nothing to change): read, then a
    /// merge patch of `spec.taints` carrying the `resourceVersion` read as a precondition (a
    /// concurrent change, e.g. the node lifecycle controller adding a taint, is never
    /// overwritten: 409, read again and retry). Nothing but `spec.taints` is written. RBAC
    /// `patch` on nodes. Returns whether it patched.
    async fn edit_taints(
        &self,
        key: &str,
        edit: impl Fn(&mut Vec<k8s_openapi::api::core::v1::Taint>) -> bool,
    ) -> Result<bool, KubeError> {
        let api = Api::<Node>::all(self.client.clone());
        for _ in 0..5 {
            let node = api.get(&self.settings.node_name).await?;
            let mut taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            if !edit(&mut taints) {
                return Ok(false);
            }
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": node.resource_version().unwrap_or_default()},
                "spec": {"taints": taints},
            });
            match api
                .patch(
                    &self.settings.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => return Ok(true),
                // the precondition failed: the Node changed since it was read
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(KubeError::Conflict(format!(
            "the Node {} kept changing while its taint {key} was changed",
            self.settings.node_name
        )))
    }

    /// Sets one condition of this node's Node status (`type` = `type_`): a strategic merge
    /// patch of the `status` subresource holding only that condition (conditions merge by
    /// `type`, so kubelet's and every other writer's stay as they are; nothing else of the Node
    /// changes). `lastTransitionTime` and `lastHeartbeatTime` are now. RBAC `patch` on
    /// `nodes/status`.
    pub async fn set_node_condition(
        &self,
        type_: &str,
        available: bool,
        reason: &str,
        message: &str,
    ) -> Result<(), KubeError> {
        let now = k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
            .to_string();
        let patch = serde_json::json!({
            "status": {"conditions": [{
                "type": type_,
                "status": if available { "True" } else { "False" },
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "lastHeartbeatTime": now,
            }]},
        });
        Api::<Node>::all(self.client.clone())
            .patch_status(
                &self.settings.node_name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await?;
        Ok(())
    }

    /// A Warning on pod `namespace/name` (a failed ADD: `reason` is its code), as kubelet
    /// writes its own: a core/v1 Event (`involvedObject` with the pod's uid, so `kubectl
    /// describe pod` lists it), created once and then bumped (`count`, `lastTimestamp`, the
    /// latest message) while the same reason repeats ([`PodEventSeries`]). Returns false when
    /// the pod does not exist (nothing written). RBAC: `get` pods, `create`/`patch` events.
    pub async fn pod_warning(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
        message: &str,
    ) -> Result<bool, KubeError> {
        use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let Some(pod) = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?
        else {
            return Ok(false);
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let events = Api::<CoreEvent>::namespaced(self.client.clone(), namespace);
        let now = k8s_openapi::jiff::Timestamp::now();
        let stamp = u128::try_from(now.as_nanosecond()).unwrap_or_default();
        let write = self
            .pod_series
            .next(namespace, name, &uid, reason, Instant::now(), stamp);
        if let PodEventWrite::Bump { name: event, count } = &write {
            let patch = serde_json::json!({
                "count": count,
                "lastTimestamp": Time(now),
                "message": message,
            });
            match events
                .patch(event, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    self.pod_series.forget(namespace, name, &uid, reason);
                }
                Err(e) => return Err(e.into()),
            }
        }
        let event_name = match write {
            PodEventWrite::Create { name } => name,
            PodEventWrite::Bump { .. } => {
                match self
                    .pod_series
                    .next(namespace, name, &uid, reason, Instant::now(), stamp)
                {
                    PodEventWrite::Create { name } | PodEventWrite::Bump { name, .. } => name,
                }
            }
        };
        let event = CoreEvent {
            metadata: ObjectMeta {
                name: Some(event_name),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                uid: pod.metadata.uid.clone(),
                resource_version: pod.metadata.resource_version.clone(),
                ..ObjectReference::default()
            },
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some("Warning".into()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some("aws-node".into()),
                host: Some(self.settings.node_name.clone()),
            }),
            reporting_component: Some("aws-node".into()),
            reporting_instance: Some(self.settings.node_name.clone()),
            ..CoreEvent::default()
        };
        events.create(&PostParams::default(), &event).await?;
        Ok(true)
    }

    /// Sets annotation `key` on a pod (a merge patch; RBAC `patch` on pods).
    pub async fn annotate_pod(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), KubeError> {
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// On ADD: `vpc.amazonaws.com/pod-ips` = the pod's address (no patch when it already says so).
    pub async fn annotate_pod_ip(
        &self,
        namespace: &str,
        name: &str,
        ip: &str,
    ) -> Result<(), KubeError> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let pod = pods.get(name).await?;
        if pod
            .annotations()
            .get(super::POD_IPS_ANNOTATION)
            .map(String::as_str)
            == Some(ip)
        {
            return Ok(());
        }
        self.annotate_pod(namespace, name, super::POD_IPS_ANNOTATION, ip)
            .await
    }

    /// The pod `namespace/name` as ipamd needs it (security groups for pods); None when the
    /// API server says it does not exist. RBAC `get` on pods.
    pub async fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<super::PodFacts>, KubeError> {
        let pod = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?;
        Ok(pod.map(|p| pod_facts(&p)))
    }

    /// Reads this node's `CNINode` and, unless it already has the feature `name=value`,
    /// merge-patches `spec.features` with the read resourceVersion (optimistic lock). Returns
    /// whether it patched. The `CNINode` is the controller's to create: a missing one is an error.
    pub async fn add_cninode_feature(&self, name: &str, value: &str) -> Result<bool, KubeError> {
        let api = Api::<CNINode>::all(self.client.clone());
        let node = api.get(&self.settings.node_name).await?;
        let Some(features) = super::with_feature(&node.spec.features, name, value) else {
            return Ok(false);
        };
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": node.resource_version()},
            "spec": {"features": features},
        });
        api.patch(
            &self.settings.node_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        Ok(true)
    }

    /// The pods scheduled on this node that carry `annotation` (`spec.nodeName` field
    /// selector; RBAC `list` on pods): `(namespace, name, annotation value)`.
    pub async fn annotated_pods_on_node(
        &self,
        annotation: &str,
    ) -> Result<Vec<(String, String, String)>, KubeError> {
        let params = kube::api::ListParams::default()
            .fields(&format!("spec.nodeName={}", self.settings.node_name));
        let pods = Api::<Pod>::all(self.client.clone()).list(&params).await?;
        Ok(pods
            .items
            .iter()
            .filter_map(|p| {
                let value = p.annotations().get(annotation)?;
                Some((
                    p.namespace().unwrap_or_default(),
                    p.name_any(),
                    value.clone(),
                ))
            })
            .collect())
    }

    /// The node's name (`MY_NODE_NAME`).
    #[must_use]
    pub fn node_name(&self) -> &str {
        &self.settings.node_name
    }

    /// On DEL: blanks `vpc.amazonaws.com/pod-ips` when it names the released address; a pod already
    /// gone is fine; another address is an error.
    pub async fn clear_pod_ip(
        &self,
        namespace: &str,
        name: &str,
        released: &str,
    ) -> Result<(), KubeError> {
        let pods = Api::<Pod>::namespaced(self.client.clone(), namespace);
        let pod = match pods.get_opt(name).await? {
            Some(p) => p,
            None => return Ok(()),
        };
        match pod.annotations().get(super::POD_IPS_ANNOTATION) {
            None => Ok(()),
            Some(current) if current == released => {
                self.annotate_pod(namespace, name, super::POD_IPS_ANNOTATION, "")
                    .await
            }
            Some(current) => Err(KubeError::AnnotationMismatch {
                released: released.to_owned(),
                current: current.clone(),
            }),
        }
    }
}

/// Pod → what ipamd needs of it.
#[must_use]
pub fn pod_facts(pod: &Pod) -> super::PodFacts {
    let requests_pod_eni = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.resources.as_ref())
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|l| l.keys().any(|k| k.starts_with(super::POD_ENI_RESOURCE)));
    super::PodFacts {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        annotations: pod.annotations().clone(),
        requests_pod_eni,
    }
}

/// Node → facts.
#[must_use]
pub fn node_facts(node: &Node) -> NodeFacts {
    let capacity_pods = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("pods"))
        .and_then(|q| q.0.parse::<u32>().ok());
    let unschedulable = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints
                .iter()
                .any(|t| t.key == super::UNSCHEDULABLE_TAINT && t.effect == "NoSchedule")
        });
    let mut taint_keys: Vec<String> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default();
    taint_keys.sort();
    taint_keys.dedup();
    let capacity_condition = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == super::ADDRESS_CAPACITY_CONDITION)
        })
        .map(|c| c.status.clone());
    NodeFacts {
        labels: node.labels().clone(),
        annotations: node.annotations().clone(),
        capacity_pods,
        unschedulable,
        taint_keys,
        capacity_condition,
    }
}

/// The event poster: posts the queued Events one at a time until `stop` (an Event still
/// queued or in flight then is dropped, as ipamd stops).
async fn post_queued(
    cluster: Cluster,
    mut queued: tokio::sync::mpsc::Receiver<QueuedEvent>,
    stop: CancellationToken,
) {
    loop {
        let q = tokio::select! {
            () = stop.cancelled() => return,
            q = queued.recv() => match q {
                Some(q) => q,
                None => return,
            },
        };
        let what = q.what;
        tokio::select! {
            () = stop.cancelled() => return,
            r = cluster.create_event(q.event) => {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "{what} not posted");
                }
            }
        }
    }
}

async fn watch_node(
    api: Api<Node>,
    name: String,
    tx: watch::Sender<Option<NodeFacts>>,
    shutdown: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    loop {
        let item = tokio::select! {
            () = shutdown.cancelled() => return,
            item = stream.next() => item,
        };
        match item {
            None => return,
            Some(Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n))) => {
                let facts = node_facts(&n);
                tx.send_if_modified(|cur| {
                    if cur.as_ref() == Some(&facts) {
                        false
                    } else {
                        tracing::info!(node = %name, labels = ?facts.labels, capacity_pods = ?facts.capacity_pods, "node facts updated");
                        *cur = Some(facts);
                        true
                    }
                });
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => tracing::warn!(node = %name, error = %e, "node watch failed; retrying"),
        }
    }
}

async fn watch_eni_configs_task(
    api: Api<ENIConfig>,
    tx: watch::Sender<Arc<EniConfigs>>,
    shutdown: CancellationToken,
) {
    let (reader, writer) = reflector::store();
    let mut stream = reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .boxed();
    loop {
        let item = tokio::select! {
            () = shutdown.cancelled() => return,
            item = stream.next() => item,
        };
        match item {
            None => return,
            Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
            Some(Ok(_)) => {
                let now: EniConfigs = reader
                    .state()
                    .iter()
                    .map(|c| {
                        (
                            c.name_any(),
                            EniConfigSpec {
                                subnet: c.spec.subnet.clone(),
                                security_groups: c.spec.security_groups.clone(),
                                warm_annotations: c
                                    .annotations()
                                    .iter()
                                    .filter(|(k, _)| {
                                        super::WARM_ANNOTATIONS
                                            .iter()
                                            .any(|(w, _)| *w == k.as_str())
                                    })
                                    .map(|(k, v)| (k.clone(), v.clone()))
                                    .collect(),
                            },
                        )
                    })
                    .collect::<BTreeMap<_, _>>();
                tx.send_if_modified(|cur| {
                    if **cur == now {
                        false
                    } else {
                        tracing::info!(eniconfigs = ?now.keys().collect::<Vec<_>>(), "ENIConfigs updated");
                        *cur = Arc::new(now);
                        true
                    }
                });
            }
            Some(Err(e)) => tracing::warn!(error = %e, "ENIConfig watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// upstream pkg/k8sapi/k8sutils.go v1.23.1 `GetRestConfig` L223: `restCfg.UserAgent =
    /// os.Args[0] + "-" + utils.GetEnv("VPC_CNI_VERSION", "")`. The header is read off the
    /// wire: the client's first request reaches a loopback listener standing in for the API
    /// server.
    #[tokio::test]
    async fn the_client_sends_upstreams_user_agent_with_vpc_cni_version() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        let text = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": format!("http://{addr}")}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        });
        std::fs::write(&kubeconfig, text.to_string()).expect("write kubeconfig");
        let settings = KubeSettings {
            source: KubeSource::Kubeconfig(kubeconfig),
            cluster_endpoint: None,
            node_name: "n1".into(),
            pod_name: String::new(),
            pod_namespace: "kube-system".into(),
            vpc_cni_version: "v1.23.1-eksbuild.1".into(),
        };
        let client = kube::Client::try_from(client_config(&settings).await.expect("config"))
            .expect("client");
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            let mut request = Vec::new();
            let mut buf = [0_u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.expect("read");
                assert_ne!(n, 0, "connection closed mid-request");
                request.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"major":"1","minor":"31","gitVersion":"v1.31.0"}"#;
            let reply = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(reply.as_bytes()).await.expect("reply");
            String::from_utf8_lossy(&request).into_owned()
        });
        client.apiserver_version().await.expect("GET /version");
        let request = server.await.expect("server task");
        let agents: Vec<&str> = request
            .lines()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.eq_ignore_ascii_case("user-agent"))
            .map(|(_, v)| v.trim())
            .collect();
        let program = std::env::args().next().expect("argv[0]");
        assert_eq!(
            agents,
            [format!("{program}-v1.23.1-eksbuild.1")],
            "{request}"
        );
        // unset: upstream's GetEnv default "", so the name and a bare dash
        assert_eq!(user_agent("./aws-k8s-agent", ""), "./aws-k8s-agent-");
    }

    /// `queue_event` never waits: with the poster not running, the queue fills and what does
    /// not fit is dropped and counted; a duplicate is refused by the dedup (not a drop), and a
    /// dropped Event is not remembered as sent (offered again, it is tried again).
    #[tokio::test]
    async fn queued_events_are_deduplicated_and_a_full_queue_drops_them() {
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        let text = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        });
        std::fs::write(&kubeconfig, text.to_string()).expect("write kubeconfig");
        let settings = KubeSettings {
            source: KubeSource::Kubeconfig(kubeconfig),
            cluster_endpoint: None,
            node_name: "n1".into(),
            pod_name: "aws-node-1".into(),
            pod_namespace: "kube-system".into(),
            vpc_cni_version: String::new(),
        };
        let stop = CancellationToken::new();
        let (cluster, tasks) = Cluster::connect(settings, true, &stop)
            .await
            .expect("client");
        assert_eq!(
            tasks.names(),
            ["Node watch", "ENIConfig watch", "event poster"]
        );
        let ev = |n: usize| PodEvent {
            warning: true,
            reason: super::super::REASON_MISSING_IAM.into(),
            action: format!("ec2:Api{n}"),
            message: "m".into(),
        };
        for n in 0..EVENT_QUEUE_CAPACITY {
            assert!(cluster.queue_event(ev(n), "test event"), "{n}");
        }
        assert!(!cluster.queue_event(ev(0), "test event"), "a duplicate");
        assert_eq!(cluster.events_dropped(), 0);
        let over = ev(EVENT_QUEUE_CAPACITY);
        assert!(!cluster.queue_event(over.clone(), "test event"));
        assert_eq!(cluster.events_dropped(), 1);
        assert!(!cluster.queue_event(over, "test event"));
        assert_eq!(cluster.events_dropped(), 2, "tried again, not deduplicated");
        drop(tasks);
    }

    fn node(taints: serde_json::Value) -> Node {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1"},
            "spec": {"taints": taints},
            "status": {"capacity": {"pods": "29"}}
        }))
        .expect("a Node")
    }

    /// upstream `isNodeNonSchedulable`: the taint `node.kubernetes.io/unschedulable` with
    /// effect `NoSchedule` (what `kubectl cordon` leads to) marks the node; another key or
    /// effect does not.
    #[test]
    fn the_cordon_taint_marks_the_node_unschedulable() {
        let cordoned = node(serde_json::json!([
            {"key": "dedicated", "value": "x", "effect": "NoSchedule"},
            {"key": crate::k8s::UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": "2026-11-25T18:00:00Z"}
        ]));
        let f = node_facts(&cordoned);
        assert!(f.unschedulable);
        assert_eq!(f.capacity_pods, Some(29));
        assert!(!node_facts(&node(serde_json::json!([]))).unschedulable);
        assert!(
            !node_facts(&node(serde_json::json!([
                {"key": crate::k8s::UNSCHEDULABLE_TAINT, "effect": "NoExecute"}
            ])))
            .unschedulable
        );
        assert!(
            !node_facts(&node(serde_json::json!([
                {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
            ])))
            .unschedulable
        );
    }
}
