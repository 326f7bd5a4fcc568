//! A kubelet-shaped node for the tests: Debian's containerd inside a simulated node's network
//! namespace ([`containerd`]), a CRI client generated from cri-api's `api.proto` (the `k8s-cri`
//! crate, tonic/prost), the decision of what kubelet asks the CRI for a pod spec ([`pod`]) and
//! a kubelet stand-in that runs it — init containers, probes, restarts, deletion ([`standin`]).
//! Also the chart as rendered by real Helm, read as the API server would hand it to kubelet
//! ([`RenderedChart`]). Must not: touch the root network namespace, the machine's containerd,
//! or processes it did not start.

pub mod containerd;
pub mod pod;
pub mod standin;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, PodSpec};

pub use containerd::{NodeRuntime, PAUSE_IMAGE, RuntimeError};
pub use pod::{NodeContext, PodMeta, PodPlan, plan_pod};
pub use standin::{Kubelet, PodState};

/// The aws-vpc-cni chart rendered by real Helm: the `aws-node` DaemonSet and every ConfigMap.
#[derive(Debug, Clone)]
pub struct RenderedChart {
    /// The DaemonSet.
    pub daemonset: DaemonSet,
    /// ConfigMaps by name: their data.
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
}

impl RenderedChart {
    /// Renders `charts/aws-vpc-cni` with `values` (helm-python-sdk, as kubesim's chart tests).
    pub fn render(values: &serde_json::Value) -> Result<Self, String> {
        let yaml = kubesim::chart::render_chart(values).map_err(|e| e.to_string())?;
        Self::parse(&yaml)
    }

    /// Reads the DaemonSet and ConfigMaps of a multi-document rendering.
    pub fn parse(yaml: &str) -> Result<Self, String> {
        let mut daemonset = None;
        let mut config_maps = BTreeMap::new();
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let v = <serde_yaml::Value as serde::Deserialize>::deserialize(doc)
                .map_err(|e| e.to_string())?;
            match v.get("kind").and_then(serde_yaml::Value::as_str) {
                Some("DaemonSet") => {
                    daemonset =
                        Some(serde_yaml::from_value::<DaemonSet>(v).map_err(|e| e.to_string())?);
                }
                Some("ConfigMap") => {
                    let cm: ConfigMap = serde_yaml::from_value(v).map_err(|e| e.to_string())?;
                    config_maps.insert(
                        cm.metadata.name.unwrap_or_default(),
                        cm.data.unwrap_or_default().into_iter().collect(),
                    );
                }
                _ => {}
            }
        }
        Ok(Self {
            daemonset: daemonset.ok_or("no DaemonSet in the rendering")?,
            config_maps,
        })
    }

    /// The DaemonSet's pod template spec.
    #[must_use]
    pub fn pod_spec(&self) -> PodSpec {
        self.daemonset
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .unwrap_or_default()
    }

    /// The pod template's labels.
    #[must_use]
    pub fn pod_labels(&self) -> BTreeMap<String, String> {
        self.daemonset
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
            .into_iter()
            .collect()
    }
}

/// Replaces the image of every container and init container named in `images` (name → image):
/// the one edit a test makes to the rendered pod spec besides the downward-API values.
pub fn set_images(spec: &mut PodSpec, images: &BTreeMap<&str, String>) {
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        if let Some(img) = images.get(c.name.as_str()) {
            c.image = Some(img.clone());
        }
    }
}
