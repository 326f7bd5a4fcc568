//! kubesim: a Kubernetes API server simulator for tests (no real kube-apiserver can run on
//! these machines). Serves discovery, generic JSON storage for core/apps/rbac/apiextensions
//! types and CRD-defined ones, watches with resourceVersions, bookmarks and 410 Expired,
//! selectors, patches, RBAC from Role/ClusterRole objects, bearer tokens, the pod proxy, and
//! fault knobs — over HTTPS with a CA it generates. This module is the public API: start one
//! in-process on loopback and get its URL, CA, tokens and kubeconfigs.
//! It must not reach beyond loopback or touch the machine's network configuration.

pub mod api;
pub mod catalog;
pub mod chart;
pub mod cluster;
mod control;
pub mod error;
mod events;
pub mod patch;
pub mod proxy;
pub mod rbac;
pub mod schema;
pub mod selector;
pub mod server;
pub mod store;
pub mod table;
pub mod tls;
pub mod watch_stream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rand::Rng as _;
use serde_json::{Value, json};
use tokio::sync::watch;

pub use cluster::{AuditEntry, Cluster, Knobs, Outage};
pub use error::ApiError;
pub use rbac::UserInfo;

/// The CNINode CRD (`vpcresources.k8s.aws/v1alpha1`, cluster-scoped) that ipamd patches. On
/// EKS it comes from the VPC resource controller, not from the aws-vpc-cni chart; this schema
/// covers the fields ipamd uses (`spec.features[].name/value`, `spec.tags`).
pub const CNINODE_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: cninodes.vpcresources.k8s.aws
spec:
  group: vpcresources.k8s.aws
  scope: Cluster
  names: {plural: cninodes, singular: cninode, kind: CNINode, listKind: CNINodeList, shortNames: [cnd]}
  versions:
    - name: v1alpha1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                features:
                  type: array
                  items:
                    type: object
                    properties:
                      name: {type: string, enum: [SecurityGroupsForPods, CustomNetworking]}
                      value: {type: string}
                tags:
                  type: object
                  additionalProperties: {type: string}
            status:
              type: object
              x-kubernetes-preserve-unknown-fields: true
"#;

/// The SecurityGroupPolicy CRD (`vpcresources.k8s.aws/v1beta1`, namespaced) the VPC Resource
/// Controller matches pods against (security groups for pods). Not in the aws-vpc-cni chart;
/// this schema covers the fields the controller reads (`spec.podSelector`,
/// `spec.serviceAccountSelector`, `spec.securityGroups.groupIds`).
pub const SECURITY_GROUP_POLICY_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: securitygrouppolicies.vpcresources.k8s.aws
spec:
  group: vpcresources.k8s.aws
  scope: Namespaced
  names: {plural: securitygrouppolicies, singular: securitygrouppolicy, kind: SecurityGroupPolicy, listKind: SecurityGroupPolicyList, shortNames: [sgp]}
  versions:
    - name: v1beta1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                podSelector:
                  type: object
                  x-kubernetes-preserve-unknown-fields: true
                serviceAccountSelector:
                  type: object
                  x-kubernetes-preserve-unknown-fields: true
                securityGroups:
                  type: object
                  properties:
                    groupIds:
                      type: array
                      minItems: 1
                      items: {type: string}
"#;

/// How to start a simulator.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where ca.crt and kubeconfigs are written.
    pub dir: PathBuf,
    /// HTTPS listen address (`127.0.0.1:0` for an ephemeral port).
    pub https_addr: SocketAddr,
    /// Optional plain-HTTP listener.
    pub http_addr: Option<SocketAddr>,
    pub knobs: Knobs,
    /// A fixed admin token (random if `None`).
    pub admin_token: Option<String>,
    /// Extra subject alternative names (IP addresses or DNS names) on the serving certificate,
    /// e.g. `169.254.169.201`, where vpcsim's fabric relays the API into node namespaces.
    pub extra_sans: Vec<String>,
}

impl Config {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            https_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            http_addr: None,
            knobs: Knobs::default(),
            admin_token: None,
            extra_sans: Vec::new(),
        }
    }
}

/// What a client of one identity needs.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub user: String,
    pub token: String,
    pub kubeconfig: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("binding {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("writing {0}: {1}")]
    Write(PathBuf, std::io::Error),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// A running simulator; stops when dropped (or on `shutdown`).
#[derive(Debug)]
pub struct KubeSim {
    cluster: Arc<Cluster>,
    url: String,
    http_url: Option<String>,
    addr: SocketAddr,
    ca_pem: String,
    ca_der: Vec<u8>,
    admin: Credentials,
    dir: PathBuf,
    shutdown: watch::Sender<bool>,
}

fn write(path: &Path, contents: &str) -> Result<(), StartError> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).map_err(|e| StartError::Write(p.to_path_buf(), e))?;
    }
    std::fs::write(path, contents).map_err(|e| StartError::Write(path.to_path_buf(), e))
}

/// A kubeconfig (YAML) for `server` with an embedded CA and a bearer token.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, token: &str, namespace: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kubesim\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user:?}\n  user:\n    token: {token}\ncontexts:\n- name: kubesim\n  context:\n    cluster: kubesim\n    user: {user:?}\n    namespace: {namespace}\ncurrent-context: kubesim\n"
    )
}

impl KubeSim {
    /// Starts serving on loopback (needs a Tokio runtime).
    pub async fn start(cfg: Config) -> Result<Self, StartError> {
        let pki = tls::Pki::generate_with(&cfg.extra_sans)?;
        let cluster = Cluster::new(cfg.knobs.clone());
        let listener = tokio::net::TcpListener::bind(cfg.https_addr)
            .await
            .map_err(|e| StartError::Bind(cfg.https_addr, e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| StartError::Bind(cfg.https_addr, e))?;
        let url = format!("https://{addr}");
        let admin_token = cfg.admin_token.clone().unwrap_or_else(|| {
            format!(
                "kubesim-admin.{}",
                hex::encode(rand::rng().random::<[u8; 24]>())
            )
        });
        let ctx = Arc::new(api::Ctx {
            cluster: cluster.clone(),
            admin_token: admin_token.clone(),
            server_address: addr.to_string(),
        });
        let router = api::router(ctx);
        let (shutdown, rx) = watch::channel(false);
        server::spawn(
            listener,
            Some(tokio_rustls::TlsAcceptor::from(pki.server_config.clone())),
            router.clone(),
            cluster.clone(),
            rx.clone(),
        );
        let http_url = match cfg.http_addr {
            Some(a) => {
                let l = tokio::net::TcpListener::bind(a)
                    .await
                    .map_err(|e| StartError::Bind(a, e))?;
                let la = l.local_addr().map_err(|e| StartError::Bind(a, e))?;
                server::spawn(l, None, router, cluster.clone(), rx);
                Some(format!("http://{la}"))
            }
            None => None,
        };
        write(&cfg.dir.join("ca.crt"), &pki.ca_pem)?;
        let admin_path = cfg.dir.join("admin.kubeconfig");
        write(
            &admin_path,
            &kubeconfig(&url, &pki.ca_pem, "kubesim-admin", &admin_token, "default"),
        )?;
        Ok(Self {
            cluster,
            url,
            http_url,
            addr,
            ca_der: pki.ca_der,
            ca_pem: pki.ca_pem,
            admin: Credentials {
                user: "kubesim-admin".into(),
                token: admin_token,
                kubeconfig: admin_path,
            },
            dir: cfg.dir,
            shutdown,
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// `http://127.0.0.1:<port>` when plain HTTP was asked for.
    pub fn http_url(&self) -> Option<&str> {
        self.http_url.as_deref()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate (DER), for clients that build their own trust store.
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The admin (system:masters) token and kubeconfig.
    pub fn admin(&self) -> &Credentials {
        &self.admin
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// A token and kubeconfig for ServiceAccount `ns/name` (created if missing). Also writes
    /// the in-cluster files (`token`, `ca.crt`, `namespace`) under
    /// `<dir>/serviceaccounts/<ns>/<name>/`, as mounted at /var/run/secrets/kubernetes.io/serviceaccount.
    pub fn service_account(&self, ns: &str, name: &str) -> Result<Credentials, StartError> {
        let token = self.cluster.issue_service_account_token(ns, name)?;
        let user = format!("system:serviceaccount:{ns}:{name}");
        let kc = self.dir.join(format!("sa-{ns}-{name}.kubeconfig"));
        write(&kc, &kubeconfig(&self.url, &self.ca_pem, &user, &token, ns))?;
        let mount = self.service_account_dir(ns, name);
        write(&mount.join("token"), &token)?;
        write(&mount.join("ca.crt"), &self.ca_pem)?;
        write(&mount.join("namespace"), ns)?;
        Ok(Credentials {
            user,
            token,
            kubeconfig: kc,
        })
    }

    /// `KUBERNETES_SERVICE_HOST` / `KUBERNETES_SERVICE_PORT` for a client using in-cluster
    /// configuration (with `service_account_dir` mounted as the service-account directory).
    pub fn in_cluster_env(&self) -> Vec<(String, String)> {
        vec![
            ("KUBERNETES_SERVICE_HOST".into(), self.addr.ip().to_string()),
            (
                "KUBERNETES_SERVICE_PORT".into(),
                self.addr.port().to_string(),
            ),
        ]
    }

    /// Where `service_account` wrote the in-cluster files.
    pub fn service_account_dir(&self, ns: &str, name: &str) -> PathBuf {
        self.dir.join("serviceaccounts").join(ns).join(name)
    }

    /// Creates or updates every object in a multi-document YAML (as admin).
    pub fn apply_yaml(&self, text: &str) -> Result<Vec<Value>, ApiError> {
        self.cluster.apply_yaml(text)
    }

    pub fn apply_file(&self, path: &Path) -> Result<Vec<Value>, ApiError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ApiError::bad_request(format!("{}: {e}", path.display())))?;
        self.apply_yaml(&text)
    }

    /// A Node (with `status.addresses` InternalIP, capacity pods) and its labels.
    pub fn add_node(
        &self,
        name: &str,
        internal_ip: &str,
        labels: Value,
    ) -> Result<Value, ApiError> {
        self.cluster.apply_object(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {},
            "status": {"addresses": [{"type": "InternalIP", "address": internal_ip}, {"type": "Hostname", "address": name}],
                       "capacity": {"pods": "110", "cpu": "2", "memory": "8Gi"},
                       "allocatable": {"pods": "110", "cpu": "2", "memory": "8Gi"}},
        }))
    }

    /// A Node as the kubelet of an EKS node registers it: the well-known labels
    /// (`kubernetes.io/hostname`, `topology.kubernetes.io/{zone,region}`,
    /// `failure-domain.beta.kubernetes.io/zone`, `node.kubernetes.io/instance-type`, plus
    /// `kubernetes.io/os`/`arch`), `spec.providerID` `aws:///<zone>/<instance id>`,
    /// InternalIP/Hostname addresses and `status.capacity.pods` = `allocatable.pods` = `max_pods`.
    pub fn add_eks_node(&self, node: &EksNode) -> Result<Value, ApiError> {
        self.cluster.apply_object(eks_node_object(node))
    }

    /// A running Pod on `node` with `ip` (created, then its status written through the status
    /// subresource, as kubelet does).
    pub fn add_pod(
        &self,
        ns: &str,
        name: &str,
        node: &str,
        ip: &str,
        labels: Value,
    ) -> Result<Value, ApiError> {
        self.cluster.apply_object(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.invalid/pause"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip},
        }))
    }

    /// The pod proxy sends `ns/pod:port` to `to` instead of `status.podIP:port` (tests' pod
    /// servers listen on loopback ephemeral ports).
    pub fn route_pod_port(&self, ns: &str, pod: &str, port: u16, to: SocketAddr) {
        self.cluster.route_pod_port(ns, pod, port, to);
    }

    /// Object `kind` (`apiVersion` `api_version`) named `name` in `ns` (`None` for
    /// cluster-scoped kinds), as admin.
    pub fn get_object(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.on_kind(api_version, kind, ns, |t| self.cluster.get(t, name))
    }

    /// Every object of `kind` in `ns` (all namespaces when `None`), as admin.
    pub fn list_objects(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
    ) -> Result<Vec<Value>, ApiError> {
        let list = self.on_kind(api_version, kind, ns, |t| {
            self.cluster.list(t, &cluster::ListOptions::default())
        })?;
        Ok(list
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default())
    }

    /// Deletes object `kind`/`name` in `ns`, as admin.
    pub fn delete_object(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        self.on_kind(api_version, kind, ns, |t| {
            self.cluster.delete(t, name, None)
        })
    }

    /// Runs `f` on the cluster target of `kind` (`api_version`) in `ns`.
    fn on_kind<T>(
        &self,
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        f: impl FnOnce(&cluster::Target<'_>) -> Result<T, ApiError>,
    ) -> Result<T, ApiError> {
        let (rt, version) = self.kind(api_version, kind)?;
        f(&cluster::Target {
            rt: &rt,
            version: &version,
            namespace: ns,
        })
    }

    fn kind(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<(catalog::ResourceType, String), ApiError> {
        self.cluster
            .catalog()
            .find_kind(api_version, kind)
            .map(|(t, v)| (t.clone(), v))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "no matches for kind \"{kind}\" in version \"{api_version}\""
                ))
            })
    }

    /// Every resource request so far (user, verb, resource, namespace, name, answer code).
    pub fn audit(&self) -> Vec<AuditEntry> {
        self.cluster.audit()
    }

    pub fn set_knobs(&self, k: Knobs) {
        self.cluster.set_knobs(k);
    }

    pub fn drop_watches(&self) {
        self.cluster.drop_watches();
    }

    pub fn compact(&self) {
        self.cluster.compact();
    }

    pub fn outage(&self, d: Duration, mode: Outage) {
        self.cluster.set_outage(d, mode);
    }

    pub fn shutdown(&self) {
        let _ = self.shutdown.send(true);
    }
}

/// What a kubelet on an EKS node knows about itself when it registers its Node.
#[derive(Debug, Clone)]
pub struct EksNode {
    /// Node name (the instance's private DNS name, `ip-a-b-c-d.<region>.compute.internal`).
    pub name: String,
    /// The node's primary private IPv4 address.
    pub internal_ip: String,
    /// EC2 instance id.
    pub instance_id: String,
    /// Instance type.
    pub instance_type: String,
    /// Availability zone.
    pub zone: String,
    /// Region.
    pub region: String,
    /// `status.capacity.pods` (the max-pods the node was started with).
    pub max_pods: u32,
    /// Extra labels (win over the well-known ones).
    pub labels: serde_json::Map<String, Value>,
}

/// The Node object `add_eks_node` stores.
pub fn eks_node_object(n: &EksNode) -> Value {
    let mut labels = json!({
        "kubernetes.io/hostname": n.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": n.instance_type,
        "node.kubernetes.io/instance-type": n.instance_type,
        "topology.kubernetes.io/zone": n.zone,
        "topology.kubernetes.io/region": n.region,
        "failure-domain.beta.kubernetes.io/zone": n.zone,
        "failure-domain.beta.kubernetes.io/region": n.region,
    });
    if let Some(map) = labels.as_object_mut() {
        map.extend(n.labels.clone());
    }
    let pods = n.max_pods.to_string();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n.name, "labels": labels},
        "spec": {"providerID": format!("aws:///{}/{}", n.zone, n.instance_id)},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": n.internal_ip},
                {"type": "Hostname", "address": n.name},
                {"type": "InternalDNS", "address": n.name},
            ],
            "capacity": {"pods": pods, "cpu": "2", "memory": "8Gi"},
            "allocatable": {"pods": pods, "cpu": "2", "memory": "8Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })
}

impl Drop for KubeSim {
    fn drop(&mut self) {
        self.shutdown();
    }
}
