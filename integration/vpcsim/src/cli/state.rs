//! The state file `vpcsim up` writes (`<state dir>/vpcsim.json`) and the other subcommands read:
//! endpoints, namespace names, nodes. Must not hold anything that is not on disk.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/vpcsim/default";

/// What a running `vpcsim up` publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// Pid of the `vpcsim up` process.
    pub pid: u32,
    /// Run id (namespace prefix `vsim<run id>-`).
    pub run_id: String,
    /// AWS region the world reports.
    pub region: String,
    /// EC2 Query API in the root netns (loopback).
    pub ec2_api: SocketAddr,
    /// Control API in the root netns (loopback).
    pub control_api: SocketAddr,
    /// VPC router namespace.
    pub router_netns: String,
    /// Internet namespace.
    pub internet_netns: String,
    /// Internet host (answers ping, TCP echo on port 7).
    pub internet_host: Ipv4Addr,
    /// The IPv6 internet host behind the egress-only gateway (when the VPC has an IPv6 CIDR).
    #[serde(default)]
    pub internet_host6: Option<std::net::Ipv6Addr>,
    /// EC2 endpoint URL inside every node namespace.
    pub node_ec2_endpoint: String,
    /// IMDS URL inside every node namespace.
    pub node_imds_endpoint: String,
    /// Nodes in launch order.
    pub nodes: Vec<NodeState>,
    /// The admin kubeconfig of the simulated Kubernetes API (`up --kube`).
    #[serde(default)]
    pub kube_admin_kubeconfig: Option<PathBuf>,
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    /// EC2 instance id.
    pub instance_id: String,
    /// Its namespace.
    pub netns: String,
    /// Primary private IP (on `eth0`).
    pub primary_ip: Option<Ipv4Addr>,
    /// The primary ENI's IPv6 address (on `eth0`; `up --ipv6`).
    #[serde(default)]
    pub primary_ipv6: Option<std::net::Ipv6Addr>,
    /// Availability zone.
    #[serde(default)]
    pub availability_zone: Option<String>,
    /// Its Node in the simulated Kubernetes API (`up --kube`).
    #[serde(default)]
    pub kube: Option<NodeKube>,
}

/// A node's identity in the simulated Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeKube {
    /// Node name (`MY_NODE_NAME`).
    pub node_name: String,
    /// aws-node Pod name (`MY_POD_NAME`, namespace kube-system).
    pub pod_name: String,
    /// aws-node's kubeconfig for this node (`KUBECONFIG`).
    pub kubeconfig: PathBuf,
}

/// Reading or writing the state file failed.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// No file: nothing is up (or another `--state-dir`).
    #[error("no vpcsim running (no {0})")]
    Missing(PathBuf),
    /// I/O.
    #[error("{path}: {source}")]
    Io {
        /// file
        path: PathBuf,
        /// cause
        source: std::io::Error,
    },
    /// Not our JSON.
    #[error("{path}: {source}")]
    Json {
        /// file
        path: PathBuf,
        /// cause
        source: serde_json::Error,
    },
}

/// `<dir>/vpcsim.json`.
pub fn path_in(dir: &Path) -> PathBuf {
    dir.join("vpcsim.json")
}

impl RunState {
    /// Write atomically (temp file + rename).
    pub fn write(&self, dir: &Path) -> Result<(), StateFileError> {
        let path = path_in(dir);
        let tmp = dir.join(".vpcsim.json.tmp");
        let text = serde_json::to_string_pretty(self).map_err(|source| StateFileError::Json {
            path: path.clone(),
            source,
        })?;
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|source| StateFileError::Io { path, source })
    }

    /// Read the state of the run in `dir`.
    pub fn read(dir: &Path) -> Result<Self, StateFileError> {
        let path = path_in(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StateFileError::Missing(path));
            }
            Err(source) => return Err(StateFileError::Io { path, source }),
        };
        serde_json::from_str(&text).map_err(|source| StateFileError::Json { path, source })
    }

    /// The node named by `key`: an index (`0`), an instance id, or a namespace name.
    pub fn node(&self, key: &str) -> Option<&NodeState> {
        if let Ok(i) = key.parse::<usize>() {
            return self.nodes.get(i);
        }
        self.nodes
            .iter()
            .find(|n| n.instance_id == key || n.netns == key)
    }
}

/// The environment to run ipamd (or any AWS SDK client) inside `node`, as `(name, value)`.
pub fn node_env(state: &RunState, node: &NodeState) -> Vec<(String, String)> {
    let mut env = crate::fabric::names::node_env(&state.region, &node.netns, &node.instance_id);
    if let Some(k) = &node.kube {
        env.extend(crate::kube::node_env(&crate::kube::RegisteredNode {
            name: k.node_name.clone(),
            pod: k.pod_name.clone(),
            kubeconfig: k.kubeconfig.clone(),
        }));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RunState {
        RunState {
            pid: 1,
            run_id: "abc123".into(),
            region: "us-west-2".into(),
            ec2_api: "127.0.0.1:1".parse().unwrap(),
            control_api: "127.0.0.1:2".parse().unwrap(),
            router_netns: "vsimabc123-vpc".into(),
            internet_netns: "vsimabc123-inet".into(),
            internet_host: Ipv4Addr::new(203, 0, 113, 10),
            internet_host6: None,
            node_ec2_endpoint: "http://169.254.169.200:80".into(),
            node_imds_endpoint: "http://169.254.169.254:80".into(),
            nodes: vec![NodeState {
                instance_id: "i-1".into(),
                netns: "vsimabc123-i-1".into(),
                primary_ip: Some(Ipv4Addr::new(198, 18, 0, 10)),
                primary_ipv6: None,
                availability_zone: Some("us-west-2a".into()),
                kube: Some(NodeKube {
                    node_name: "ip-198-18-0-10.us-west-2.compute.internal".into(),
                    pod_name: "aws-node-1".into(),
                    kubeconfig: "/run/vpcsim/default/kube/i-1.kubeconfig".into(),
                }),
            }],
            kube_admin_kubeconfig: None,
        }
    }

    #[test]
    fn env_of_a_kube_node_names_it_and_its_kubeconfig() {
        let s = sample();
        let env = node_env(&s, &s.nodes[0]);
        let get = |k: &str| {
            env.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            get("MY_NODE_NAME"),
            Some("ip-198-18-0-10.us-west-2.compute.internal")
        );
        assert_eq!(
            get("KUBECONFIG"),
            Some("/run/vpcsim/default/kube/i-1.kubeconfig")
        );
        assert_eq!(get("MY_POD_NAMESPACE"), Some("kube-system"));
    }

    #[test]
    fn nodes_by_index_id_or_netns() {
        let s = sample();
        assert_eq!(s.node("0").unwrap().instance_id, "i-1");
        assert_eq!(s.node("i-1").unwrap().instance_id, "i-1");
        assert_eq!(s.node("vsimabc123-i-1").unwrap().instance_id, "i-1");
        assert!(s.node("1").is_none());
    }

    #[test]
    fn state_file_round_trips() {
        let dir = std::env::temp_dir().join(format!("vpcsim-state-test-{}", std::process::id()));
        let s = sample();
        s.write(&dir).unwrap();
        assert_eq!(RunState::read(&dir).unwrap(), s);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(
            RunState::read(&dir),
            Err(StateFileError::Missing(_))
        ));
    }
}
