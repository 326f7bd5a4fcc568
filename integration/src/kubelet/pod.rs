//! What kubelet asks the CRI for, decided from a pod spec: the sandbox (host network or the pod
//! network), every init container and container as a CRI `ContainerConfig` (image, command and
//! args, env with the downward-API values and the API-server service variables, volume mounts,
//! the security context as kubelet synthesizes it — privileged, capabilities, read-only root,
//! and for non-privileged containers the default masked and read-only `/proc` paths), and the
//! probes. Pure: no I/O; the volumes' host directories are decided here and made by the
//! stand-in (`standin`). Must not: call the CRI, touch files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, PodSpec, Probe};

/// `/proc` paths kubelet masks in every non-privileged container (its `defaultMaskedPaths`,
/// `ProcMount: Default`).
pub const DEFAULT_MASKED_PATHS: [&str; 10] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];

/// `/proc` paths kubelet makes read-only in every non-privileged container (its
/// `defaultReadonlyPaths`): `/proc/sys` among them, which is why a non-privileged container
/// cannot write a sysctl.
pub const DEFAULT_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Where kubelet mounts a pod's service-account token, CA and namespace.
pub const SERVICE_ACCOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A pod's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// UID (a new one for every pod object, also for a re-created StatefulSet pod).
    pub uid: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// What the node gives a pod: the downward-API field values, the API-server service
/// variables, the service account, where a pod's volumes and logs live.
#[derive(Debug, Clone)]
pub struct NodeContext {
    /// `spec.nodeName`.
    pub node_name: String,
    /// `status.hostIP` (the node's primary address).
    pub host_ip: String,
    /// `status.podIP` of a host-network pod (the node's address).
    pub pod_ip: Option<String>,
    /// `KUBERNETES_SERVICE_HOST`/`PORT` (kubelet adds them to every container).
    pub api_service: Option<(String, u16)>,
    /// The directory holding the pod's service-account token, `ca.crt` and `namespace`
    /// (mounted read-only at [`SERVICE_ACCOUNT_PATH`]), when the pod has one.
    pub service_account_dir: Option<PathBuf>,
    /// Directory of this pod's kubelet-managed volumes (`<pods>/<uid>/volumes`).
    pub volumes_dir: PathBuf,
    /// Directory of this pod's logs (`/var/log/pods/<ns>_<name>_<uid>` on a node).
    pub log_dir: PathBuf,
}

/// A probe as kubelet runs it (exec, or TCP to the pod's address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePlan {
    /// What it runs.
    pub action: ProbeAction,
    /// `initialDelaySeconds`.
    pub initial_delay: u64,
    /// `periodSeconds` (10).
    pub period: u64,
    /// `timeoutSeconds` (1).
    pub timeout: u64,
    /// `failureThreshold` (3).
    pub failure_threshold: u32,
    /// `successThreshold` (1).
    pub success_threshold: u32,
}

/// A probe's action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAction {
    /// `exec.command`, run with `ExecSync` in the container.
    Exec(Vec<String>),
    /// `tcpSocket.port` on the pod's address.
    Tcp(u16),
}

/// One container: its CRI configuration and probes.
#[derive(Debug, Clone)]
pub struct ContainerPlan {
    /// Container name.
    pub name: String,
    /// The CRI configuration (attempt 0; the stand-in counts restarts).
    pub config: cri::ContainerConfig,
    /// `livenessProbe`.
    pub liveness: Option<ProbePlan>,
    /// `readinessProbe`.
    pub readiness: Option<ProbePlan>,
}

/// A hostPath volume kubelet must check or create before it mounts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPathPlan {
    /// The path on the node.
    pub path: String,
    /// `DirectoryOrCreate` / `FileOrCreate` create it; others use it as is.
    pub create: Option<CreateKind>,
}

/// What a `*OrCreate` hostPath creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateKind {
    /// `DirectoryOrCreate`.
    Directory,
    /// `FileOrCreate`.
    File,
}

/// A configMap volume: written by the stand-in into `dir` from the ConfigMap named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapPlan {
    /// The ConfigMap's name (the pod's namespace).
    pub name: String,
    /// Where its keys go as files.
    pub dir: PathBuf,
}

/// Everything kubelet does for one pod, decided up front.
#[derive(Debug, Clone)]
pub struct PodPlan {
    /// The pod.
    pub meta: PodMeta,
    /// The sandbox.
    pub sandbox: cri::PodSandboxConfig,
    /// Init containers, run to completion in order.
    pub init: Vec<ContainerPlan>,
    /// Containers.
    pub containers: Vec<ContainerPlan>,
    /// hostPath volumes to check or create on the node.
    pub host_paths: Vec<HostPathPlan>,
    /// configMap volumes to write.
    pub config_maps: Vec<ConfigMapPlan>,
    /// `terminationGracePeriodSeconds` (30).
    pub grace_seconds: i64,
    /// `hostNetwork`.
    pub host_network: bool,
}

/// Why a pod spec cannot be run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A container mounts a volume the pod does not declare.
    #[error("container {container} mounts {volume}, which the pod does not declare")]
    UnknownVolume {
        /// Container.
        container: String,
        /// Volume.
        volume: String,
    },
    /// A feature of the spec this stand-in does not implement (refused, never ignored).
    #[error("{0} is not supported by the kubelet stand-in")]
    Unsupported(String),
    /// A container without an image.
    #[error("container {0} has no image")]
    NoImage(String),
}

/// Where a declared volume comes from.
enum VolumeSource {
    Host(String),
    Dir(PathBuf),
}

/// The plan for `spec` of pod `meta` on the node `node`.
pub fn plan_pod(meta: &PodMeta, spec: &PodSpec, node: &NodeContext) -> Result<PodPlan, PlanError> {
    let host_network = spec.host_network.unwrap_or(false);
    let mut volumes: BTreeMap<String, VolumeSource> = BTreeMap::new();
    let mut host_paths = Vec::new();
    let mut config_maps = Vec::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(h) = &v.host_path {
            let create = match h.type_.as_deref() {
                Some("DirectoryOrCreate") => Some(CreateKind::Directory),
                Some("FileOrCreate") => Some(CreateKind::File),
                _ => None,
            };
            host_paths.push(HostPathPlan {
                path: h.path.clone(),
                create,
            });
            volumes.insert(v.name.clone(), VolumeSource::Host(h.path.clone()));
        } else if let Some(cm) = &v.config_map {
            let dir = node.volumes_dir.join("configmap").join(&v.name);
            config_maps.push(ConfigMapPlan {
                name: cm.name.clone(),
                dir: dir.clone(),
            });
            volumes.insert(v.name.clone(), VolumeSource::Dir(dir));
        } else if v.empty_dir.is_some() {
            volumes.insert(
                v.name.clone(),
                VolumeSource::Dir(node.volumes_dir.join("empty-dir").join(&v.name)),
            );
        } else {
            return Err(PlanError::Unsupported(format!(
                "volume {}'s source",
                v.name
            )));
        }
    }
    let ns_mode = if host_network {
        cri::NamespaceMode::Node
    } else {
        cri::NamespaceMode::Pod
    };
    let namespaces = cri::NamespaceOption {
        network: ns_mode as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    };
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            namespace: meta.namespace.clone(),
            attempt: 0,
        }),
        hostname: if host_network {
            String::new()
        } else {
            meta.name.clone()
        },
        log_directory: node.log_dir.display().to_string(),
        labels: meta
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain([
                ("io.kubernetes.pod.name".to_owned(), meta.name.clone()),
                (
                    "io.kubernetes.pod.namespace".to_owned(),
                    meta.namespace.clone(),
                ),
                ("io.kubernetes.pod.uid".to_owned(), meta.uid.clone()),
            ])
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces.clone()),
                // kubelet marks the sandbox privileged when any container is
                privileged: spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .any(privileged),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let plan_all = |cs: &[Container]| -> Result<Vec<ContainerPlan>, PlanError> {
        cs.iter()
            .map(|c| plan_container(c, meta, node, &volumes, namespaces.clone()))
            .collect()
    };
    Ok(PodPlan {
        meta: meta.clone(),
        sandbox,
        init: plan_all(spec.init_containers.as_deref().unwrap_or_default())?,
        containers: plan_all(&spec.containers)?,
        host_paths,
        config_maps,
        grace_seconds: spec.termination_grace_period_seconds.unwrap_or(30),
        host_network,
    })
}

fn privileged(c: &Container) -> bool {
    c.security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}

/// The downward-API value of `field` for this pod, as kubelet resolves `fieldRef`.
fn field_value(field: &str, meta: &PodMeta, node: &NodeContext) -> Result<String, PlanError> {
    Ok(match field {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => node.node_name.clone(),
        "status.hostIP" => node.host_ip.clone(),
        "status.podIP" => node
            .pod_ip
            .clone()
            .ok_or_else(|| PlanError::Unsupported("status.podIP of a pod-network pod".into()))?,
        other => return Err(PlanError::Unsupported(format!("fieldRef {other}"))),
    })
}

fn plan_container(
    c: &Container,
    meta: &PodMeta,
    node: &NodeContext,
    volumes: &BTreeMap<String, VolumeSource>,
    namespaces: cri::NamespaceOption,
) -> Result<ContainerPlan, PlanError> {
    let image = c
        .image
        .clone()
        .ok_or_else(|| PlanError::NoImage(c.name.clone()))?;
    if c.env_from.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(PlanError::Unsupported(format!("{}: envFrom", c.name)));
    }
    let mut envs = Vec::new();
    // kubelet's service variables first (the API server's), then the container's own env
    if let Some((host, port)) = &node.api_service {
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", host.clone()),
            ("KUBERNETES_SERVICE_PORT", port.to_string()),
            ("KUBERNETES_SERVICE_PORT_HTTPS", port.to_string()),
            ("KUBERNETES_PORT", format!("tcp://{host}:{port}")),
        ] {
            envs.push(cri::KeyValue {
                key: k.to_owned(),
                value: v,
            });
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (_, Some(from)) => match &from.field_ref {
                Some(f) => field_value(&f.field_path, meta, node)?,
                None => {
                    return Err(PlanError::Unsupported(format!(
                        "{}: env {} valueFrom other than fieldRef",
                        c.name, e.name
                    )));
                }
            },
            (Some(v), None) => v.clone(),
            (None, None) => String::new(),
        };
        envs.retain(|kv| kv.key != e.name);
        envs.push(cri::KeyValue {
            key: e.name.clone(),
            value,
        });
    }
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let src = volumes
            .get(&m.name)
            .ok_or_else(|| PlanError::UnknownVolume {
                container: c.name.clone(),
                volume: m.name.clone(),
            })?;
        let base = match src {
            VolumeSource::Host(p) => PathBuf::from(p),
            VolumeSource::Dir(d) => d.clone(),
        };
        let host_path = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => base.join(sub),
            None => base,
        };
        mounts.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host_path.display().to_string(),
            readonly: m.read_only.unwrap_or(false),
            ..Default::default()
        });
    }
    if let Some(dir) = &node.service_account_dir {
        mounts.push(cri::Mount {
            container_path: SERVICE_ACCOUNT_PATH.to_owned(),
            host_path: dir.display().to_string(),
            readonly: true,
            ..Default::default()
        });
    }
    let sc = c.security_context.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    if sc.proc_mount.as_deref().is_some_and(|p| p != "Default") {
        return Err(PlanError::Unsupported(format!("{}: procMount", c.name)));
    }
    let caps = sc.capabilities.clone().unwrap_or_default();
    let security_context = cri::LinuxContainerSecurityContext {
        capabilities: Some(cri::Capability {
            add_capabilities: caps.add.unwrap_or_default(),
            drop_capabilities: caps.drop.unwrap_or_default(),
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(namespaces),
        run_as_user: sc.run_as_user.map(|v| cri::Int64Value { value: v }),
        run_as_group: sc.run_as_group.map(|v| cri::Int64Value { value: v }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: if privileged {
            Vec::new()
        } else {
            DEFAULT_MASKED_PATHS.map(str::to_owned).to_vec()
        },
        readonly_paths: if privileged {
            Vec::new()
        } else {
            DEFAULT_READONLY_PATHS.map(str::to_owned).to_vec()
        },
        ..Default::default()
    };
    let resources = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("cpu"))
        .map(|q| cri::LinuxContainerResources {
            cpu_shares: cpu_shares(&q.0),
            ..Default::default()
        });
    let config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.clone(),
            user_specified_image: image,
            ..Default::default()
        }),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        labels: [
            ("io.kubernetes.container.name".to_owned(), c.name.clone()),
            ("io.kubernetes.pod.name".to_owned(), meta.name.clone()),
            (
                "io.kubernetes.pod.namespace".to_owned(),
                meta.namespace.clone(),
            ),
            ("io.kubernetes.pod.uid".to_owned(), meta.uid.clone()),
        ]
        .into_iter()
        .collect(),
        log_path: format!("{}/0.log", c.name),
        linux: Some(cri::LinuxContainerConfig {
            resources,
            security_context: Some(security_context),
        }),
        ..Default::default()
    };
    Ok(ContainerPlan {
        name: c.name.clone(),
        config,
        liveness: c.liveness_probe.as_ref().map(probe_plan).transpose()?,
        readiness: c.readiness_probe.as_ref().map(probe_plan).transpose()?,
    })
}

/// CPU shares for a CPU request as kubelet computes them (milli-CPU × 1024 / 1000, at least 2).
fn cpu_shares(quantity: &str) -> i64 {
    let milli = quantity.strip_suffix('m').map_or_else(
        || quantity.parse::<f64>().map(|c| c * 1000.0).unwrap_or(0.0),
        |m| m.parse::<f64>().unwrap_or(0.0),
    );
    #[allow(clippy::cast_possible_truncation)]
    let shares = (milli * 1024.0 / 1000.0) as i64;
    shares.max(2)
}

fn probe_plan(p: &Probe) -> Result<ProbePlan, PlanError> {
    let action = if let Some(e) = &p.exec {
        ProbeAction::Exec(e.command.clone().unwrap_or_default())
    } else if let Some(t) = &p.tcp_socket {
        match &t.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => ProbeAction::Tcp(
                u16::try_from(*n).map_err(|_| PlanError::Unsupported(format!("probe port {n}")))?,
            ),
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => {
                return Err(PlanError::Unsupported(format!("named probe port {s}")));
            }
        }
    } else {
        return Err(PlanError::Unsupported("httpGet/grpc probes".into()));
    };
    let secs = |v: Option<i32>, d: u64| v.and_then(|v| u64::try_from(v).ok()).unwrap_or(d);
    Ok(ProbePlan {
        action,
        initial_delay: secs(p.initial_delay_seconds, 0),
        period: secs(p.period_seconds, 10),
        timeout: secs(p.timeout_seconds, 1),
        failure_threshold: p
            .failure_threshold
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(3),
        success_threshold: p
            .success_threshold
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(1),
    })
}

/// The per-pod directories of a node's kubelet (`<pods>/<uid>/volumes`, logs).
#[must_use]
pub fn pod_dirs(pods: &Path, logs: &Path, meta: &PodMeta) -> (PathBuf, PathBuf) {
    (
        pods.join(&meta.uid).join("volumes"),
        logs.join(format!("{}_{}_{}", meta.namespace, meta.name, meta.uid)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> PodSpec {
        serde_yaml::from_str(yaml).expect("pod spec")
    }

    fn node() -> NodeContext {
        NodeContext {
            node_name: "node-a".into(),
            host_ip: "198.18.0.4".into(),
            pod_ip: Some("198.18.0.4".into()),
            api_service: Some(("169.254.169.201".into(), 443)),
            service_account_dir: None,
            volumes_dir: PathBuf::from("/k/pods/u1/volumes"),
            log_dir: PathBuf::from("/k/logs/kube-system_p_u1"),
        }
    }

    fn meta() -> PodMeta {
        PodMeta {
            name: "aws-node-x".into(),
            namespace: "kube-system".into(),
            uid: "u1".into(),
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn a_non_privileged_host_network_container_gets_kubelets_read_only_proc_sys() {
        let s = spec(
            r"
hostNetwork: true
containers:
- name: aws-node
  image: img:1
  securityContext: {capabilities: {add: [NET_ADMIN, NET_RAW]}}
  env:
  - {name: A, value: b}
  - name: MY_NODE_NAME
    valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
  volumeMounts:
  - {name: run-dir, mountPath: /var/run/aws-node}
  - {name: cni-config, mountPath: /app/10-aws.conflist, subPath: 10-aws.conflist}
  readinessProbe: {exec: {command: [/app/probe]}, initialDelaySeconds: 1}
initContainers:
- name: init
  image: img:1
  securityContext: {privileged: true}
volumes:
- {name: run-dir, hostPath: {path: /var/run/aws-node, type: DirectoryOrCreate}}
- {name: cni-config, configMap: {name: cm}}
",
        );
        let plan = plan_pod(&meta(), &s, &node()).expect("plan");
        let ns = plan
            .sandbox
            .linux
            .as_ref()
            .unwrap()
            .security_context
            .as_ref()
            .unwrap();
        assert_eq!(
            ns.namespace_options.as_ref().unwrap().network,
            cri::NamespaceMode::Node as i32
        );
        let c = &plan.containers[0].config;
        let sc = c.linux.as_ref().unwrap().security_context.as_ref().unwrap();
        assert!(!sc.privileged);
        assert!(sc.readonly_paths.contains(&"/proc/sys".to_owned()));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().add_capabilities,
            ["NET_ADMIN", "NET_RAW"]
        );
        let env: BTreeMap<_, _> = c.envs.iter().map(|kv| (&*kv.key, &*kv.value)).collect();
        assert_eq!(env["MY_NODE_NAME"], "node-a");
        assert_eq!(env["A"], "b");
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], "169.254.169.201");
        assert_eq!(c.mounts[0].host_path, "/var/run/aws-node");
        assert_eq!(
            c.mounts[1].host_path,
            "/k/pods/u1/volumes/configmap/cni-config/10-aws.conflist"
        );
        assert_eq!(
            plan.host_paths,
            [HostPathPlan {
                path: "/var/run/aws-node".into(),
                create: Some(CreateKind::Directory)
            }]
        );
        let init = &plan.init[0].config;
        let isc = init
            .linux
            .as_ref()
            .unwrap()
            .security_context
            .as_ref()
            .unwrap();
        assert!(isc.privileged);
        assert!(isc.readonly_paths.is_empty());
        let r = plan.containers[0].readiness.as_ref().unwrap();
        assert_eq!(r.action, ProbeAction::Exec(vec!["/app/probe".into()]));
        assert_eq!((r.initial_delay, r.period, r.failure_threshold), (1, 10, 3));
    }

    #[test]
    fn what_the_stand_in_cannot_do_is_refused() {
        let s = spec(
            r"
containers:
- name: c
  image: i
  volumeMounts: [{name: nope, mountPath: /x}]
",
        );
        assert!(matches!(
            plan_pod(&meta(), &s, &node()),
            Err(PlanError::UnknownVolume { .. })
        ));
        let s = spec(
            r"
containers:
- name: c
  image: i
  env: [{name: X, valueFrom: {secretKeyRef: {name: s, key: k}}}]
",
        );
        assert!(matches!(
            plan_pod(&meta(), &s, &node()),
            Err(PlanError::Unsupported(_))
        ));
    }

    #[test]
    fn cpu_requests_become_kubelets_shares() {
        assert_eq!(cpu_shares("25m"), 25);
        assert_eq!(cpu_shares("1"), 1024);
        assert_eq!(cpu_shares("1m"), 2);
    }
}
