//! Glue between the simulated VPC and kubesim (the simulated Kubernetes API): start kubesim
//! with a certificate valid at the fabric's relay address, apply the CRDs ipamd needs, and
//! register each instance as an EKS kubelet would (Node with its real labels and max-pods, an
//! aws-node Pod, a kubeconfig for aws-node pointing at the relay). Used by `vpcsim up --kube`
//! and the e2e harness. Must not touch the kernel or decide EC2 rules.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use kubesim::{EksNode, KubeSim};
use serde_json::json;

use crate::fabric::names;
use crate::view::InstanceView;

/// Namespace of aws-node.
pub const KUBE_SYSTEM: &str = "kube-system";
/// aws-node's ServiceAccount user name.
pub const AWS_NODE_USER: &str = "system:serviceaccount:kube-system:aws-node";

/// Starting or filling the Kubernetes API failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// kubesim did not start.
    #[error("kubesim: {0}")]
    Start(#[from] kubesim::StartError),
    /// kubesim refused an object.
    #[error("kubesim {what}: {source}")]
    Api {
        /// which object
        what: String,
        /// why
        source: kubesim::ApiError,
    },
    /// The chart could not be rendered.
    #[error(transparent)]
    Chart(#[from] kubesim::chart::ChartError),
    /// Writing a kubeconfig.
    #[error("writing {0}: {1}")]
    Write(PathBuf, std::io::Error),
}

fn api(what: &str) -> impl FnOnce(kubesim::ApiError) -> KubeError + '_ {
    move |source| KubeError::Api {
        what: what.to_owned(),
        source,
    }
}

/// Start kubesim on loopback with files in `dir`, its serving certificate also valid for the
/// relay address 169.254.169.201, with the ENIConfig CRD (the chart's), the CNINode and the
/// SecurityGroupPolicy CRDs.
pub async fn start(dir: &Path) -> Result<KubeSim, KubeError> {
    let mut cfg = kubesim::Config::new(dir);
    cfg.extra_sans = vec![names::KUBE_API_ADDR.to_string()];
    let sim = KubeSim::start(cfg).await?;
    sim.apply_file(&kubesim::chart::eniconfig_crd())
        .map_err(api("ENIConfig CRD"))?;
    sim.apply_yaml(kubesim::CNINODE_CRD)
        .map_err(api("CNINode CRD"))?;
    sim.apply_yaml(kubesim::SECURITY_GROUP_POLICY_CRD)
        .map_err(api("SecurityGroupPolicy CRD"))?;
    Ok(sim)
}

/// The name an EKS node registers under: its private DNS name (IMDS `local-hostname`).
pub fn node_name(primary_ip: Ipv4Addr, region: &str) -> String {
    format!(
        "ip-{}.{region}.compute.internal",
        primary_ip.to_string().replace('.', "-")
    )
}

/// EKS's max-pods for an instance type: `enis × (IPv4 per ENI − 1) + 2`.
pub fn max_pods(instance_type: &str) -> u32 {
    crate::limits::lookup(instance_type).map_or(110, |l| l.max_enis * (l.ipv4_per_eni - 1) + 2)
}

/// What `register_node` made.
#[derive(Debug, Clone)]
pub struct RegisteredNode {
    /// Node name.
    pub name: String,
    /// The aws-node Pod's name (namespace kube-system).
    pub pod: String,
    /// aws-node's kubeconfig for this node (server `https://169.254.169.201:443`).
    pub kubeconfig: PathBuf,
}

/// Register `inst` (running, with its primary ENI visible) as an EKS kubelet would: its Node,
/// an aws-node Pod on it, and aws-node's kubeconfig (`token`) at `kubeconfig`.
pub fn register_node(
    sim: &KubeSim,
    inst: &InstanceView,
    region: &str,
    token: &str,
    kubeconfig: &Path,
) -> Result<RegisteredNode, KubeError> {
    let ip = inst
        .primary()
        .map_or(Ipv4Addr::UNSPECIFIED, |e| e.primary_ip);
    let name = node_name(ip, region);
    sim.add_eks_node(&EksNode {
        name: name.clone(),
        internal_ip: ip.to_string(),
        instance_id: inst.instance_id.clone(),
        instance_type: inst.instance_type.clone(),
        zone: inst.availability_zone.clone(),
        region: region.to_owned(),
        max_pods: max_pods(&inst.instance_type),
        labels: serde_json::Map::new(),
    })
    .map_err(api("Node"))?;
    let id = &inst.instance_id;
    let pod = format!("aws-node-{}", &id[id.len().saturating_sub(5)..]);
    sim.cluster()
        .apply_object(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": KUBE_SYSTEM, "labels": {"k8s-app": "aws-node"}},
            "spec": {"nodeName": name, "hostNetwork": true, "serviceAccountName": "aws-node",
                     "containers": [{"name": "aws-node", "image": "registry.invalid/aws-node"}]},
            "status": {"phase": "Running", "podIP": ip.to_string(), "hostIP": ip.to_string()},
        }))
        .map_err(api("aws-node Pod"))?;
    let text = kubesim::kubeconfig(
        &names::kube_api_url(),
        sim.ca_pem(),
        AWS_NODE_USER,
        token,
        KUBE_SYSTEM,
    );
    if let Some(p) = kubeconfig.parent() {
        std::fs::create_dir_all(p).map_err(|e| KubeError::Write(p.to_path_buf(), e))?;
    }
    std::fs::write(kubeconfig, text).map_err(|e| KubeError::Write(kubeconfig.to_path_buf(), e))?;
    Ok(RegisteredNode {
        name,
        pod,
        kubeconfig: kubeconfig.to_path_buf(),
    })
}

/// The environment ipamd needs to find the API and itself on `node`.
pub fn node_env(node: &RegisteredNode) -> Vec<(String, String)> {
    vec![
        ("KUBECONFIG".into(), node.kubeconfig.display().to_string()),
        ("MY_NODE_NAME".into(), node.name.clone()),
        ("MY_POD_NAME".into(), node.pod.clone()),
        ("MY_POD_NAMESPACE".into(), KUBE_SYSTEM.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_and_max_pods_are_ekss() {
        assert_eq!(
            node_name(Ipv4Addr::new(198, 18, 0, 4), "us-west-2"),
            "ip-198-18-0-4.us-west-2.compute.internal"
        );
        assert_eq!(max_pods("m5.large"), 29);
        assert_eq!(max_pods("t3.medium"), 17);
    }
}
