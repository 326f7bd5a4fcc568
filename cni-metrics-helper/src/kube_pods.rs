//! The Kubernetes adapter: lists the `aws-node` pods (`k8s-app=aws-node` in `kube-system`) and
//! fetches one pod's `/metrics` through the API server's pod proxy. Owns no aggregation.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

/// ipamd's metrics port.
pub const IPAMD_METRICS_PORT: u16 = 61678;
pub const NAMESPACE: &str = "kube-system";
pub const SELECTOR: &str = "k8s-app=aws-node";

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error("in-cluster config: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    #[error("Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("listing aws-node pods: {0}")]
    List(#[source] kube::Error),
    #[error("listing ENIConfigs: {0}")]
    EniConfigs(#[source] kube::Error),
    #[error("writing the ConfigMap {namespace}/{name}: {source}")]
    WriteConfigMap {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the ConfigMap {0} kept changing while it was written")]
    ConfigMapConflict(String),
    #[error("scraping {pod} through the pod proxy: {source}")]
    Scrape {
        pod: String,
        #[source]
        source: kube::Error,
    },
}

/// The API server, as the helper uses it.
#[derive(Clone)]
pub struct AwsNodePods {
    client: kube::Client,
}

impl std::fmt::Debug for AwsNodePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AwsNodePods")
    }
}

impl AwsNodePods {
    /// In-cluster configuration (ServiceAccount token and CA) by default; the file named by
    /// `kubeconfig` (the `KUBECONFIG` variable, for tests and out-of-cluster runs) if given.
    /// TLS is rustls, trusting the configuration's CA.
    pub async fn connect(kubeconfig: Option<&std::path::Path>) -> Result<Self, KubeError> {
        let config = match kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path)?;
                kube::Config::from_custom_kubeconfig(
                    file,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await?
            }
            None => kube::Config::incluster()?,
        };
        let client = kube::Client::try_from(config).map_err(KubeError::Client)?;
        Ok(AwsNodePods { client })
    }

    /// Names of the aws-node pods.
    pub async fn list(&self) -> Result<Vec<String>, KubeError> {
        Ok(self
            .list_with_hosts()
            .await?
            .into_iter()
            .map(|(n, _)| n)
            .collect())
    }

    /// Names of the aws-node pods with their node's address (`status.hostIP`: the node's
    /// primary private IPv4 address, as aws-node runs in the host network).
    pub async fn list_with_hosts(
        &self,
    ) -> Result<Vec<(String, Option<std::net::Ipv4Addr>)>, KubeError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let list = pods
            .list(&ListParams::default().labels(SELECTOR))
            .await
            .map_err(KubeError::List)?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|p| {
                let host = p
                    .status
                    .as_ref()
                    .and_then(|s| s.host_ip.as_deref())
                    .and_then(|ip| ip.parse().ok());
                Some((p.metadata.name?, host))
            })
            .collect())
    }

    /// The subnets custom networking's ENIConfigs name (`crd.k8s.amazonaws.com/v1alpha1`,
    /// `spec.subnet`). No ENIConfig CRD (404): none.
    pub async fn eniconfig_subnets(&self) -> Result<Vec<String>, KubeError> {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
        let gvk = GroupVersionKind::gvk("crd.k8s.amazonaws.com", "v1alpha1", "ENIConfig");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "eniconfigs");
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(list
                .items
                .iter()
                .filter_map(|o| o.data.get("spec")?.get("subnet")?.as_str())
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
            Err(e) => Err(KubeError::EniConfigs(e)),
        }
    }

    /// Sets `data[key] = value` of the ConfigMap `namespace`/`name`, creating it when absent:
    /// read, then create (RBAC `create` on configmaps: not restrictable by name) or replace
    /// carrying the `resourceVersion` read (RBAC `get`/`update` on that name), so a concurrent
    /// writer is never overwritten blindly (409: read again, up to 5 times). Other data keys,
    /// labels and annotations are kept.
    pub async fn write_config_map(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(), KubeError> {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::PostParams;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let failed = |source| KubeError::WriteConfigMap {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        };
        let params = PostParams {
            field_manager: Some("cni-metrics-helper".into()),
            ..PostParams::default()
        };
        for _ in 0..5 {
            let r = match api.get_opt(name).await.map_err(failed)? {
                None => {
                    let cm = ConfigMap {
                        metadata: kube::api::ObjectMeta {
                            name: Some(name.to_owned()),
                            namespace: Some(namespace.to_owned()),
                            labels: Some(
                                [(
                                    "app.kubernetes.io/managed-by".to_owned(),
                                    "cni-metrics-helper".to_owned(),
                                )]
                                .into(),
                            ),
                            ..kube::api::ObjectMeta::default()
                        },
                        data: Some([(key.to_owned(), value.to_owned())].into()),
                        ..ConfigMap::default()
                    };
                    api.create(&params, &cm).await.map(|_| ())
                }
                Some(mut cm) => {
                    if cm
                        .data
                        .as_ref()
                        .and_then(|d| d.get(key))
                        .map(String::as_str)
                        == Some(value)
                    {
                        return Ok(());
                    }
                    cm.data
                        .get_or_insert_with(Default::default)
                        .insert(key.to_owned(), value.to_owned());
                    // the resourceVersion read stays in metadata: the replace's precondition
                    api.replace(name, &params, &cm).await.map(|_| ())
                }
            };
            match r {
                Ok(()) => return Ok(()),
                // created or changed since it was read
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(failed(e)),
            }
        }
        Err(KubeError::ConfigMapConflict(format!("{namespace}/{name}")))
    }

    /// `GET /api/v1/namespaces/kube-system/pods/<pod>:61678/proxy/metrics`.
    pub async fn scrape(&self, pod: &str) -> Result<String, KubeError> {
        let path = proxy_path(pod);
        let request = http::Request::get(path)
            .body(Vec::new())
            .expect("valid request");
        self.client
            .request_text(request)
            .await
            .map_err(|source| KubeError::Scrape {
                pod: pod.to_string(),
                source,
            })
    }
}

/// The pod proxy path for one pod's ipamd metrics.
pub fn proxy_path(pod: &str) -> String {
    format!("/api/v1/namespaces/{NAMESPACE}/pods/{pod}:{IPAMD_METRICS_PORT}/proxy/metrics")
}
