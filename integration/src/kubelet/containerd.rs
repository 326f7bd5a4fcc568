//! One simulated node's container runtime: Debian's containerd started inside the node's network
//! namespace and a private mount namespace in which `/opt`, `/etc/cni`, `/run` and `/var/log` are
//! the node's own directories — so the CNI plugins containerd executes (`/opt/cni/bin`, conflists
//! in `/etc/cni/net.d`), the hostPath volumes it mounts, the sockets and logs are the node's —
//! with its own root, state, socket and configuration, and the CRI client on that socket.
//! Must not: share anything with the machine's own containerd, touch the root network namespace,
//! or signal a process it did not start (its containerd by PID; shims and containers only through
//! the CRI, or, when that failed, the shims whose command line names this node's socket).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::supervisor::{PidList, Stop, Supervised, nsenter_net};

/// The node directories containerd sees at their usual paths (bind mounts in its mount
/// namespace): what kubelet's hostPath volumes and the CNI configuration refer to.
pub const NODE_DIRS: [&str; 4] = ["/opt", "/etc/cni", "/run", "/var/log"];

/// The sandbox ("pause") image every node's containerd runs pod sandboxes with.
pub const PAUSE_IMAGE: &str = "localhost/pause:kubelet-node";

/// Errors of the node runtime (start, CRI, images).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A file or process.
    #[error("{what}: {source}")]
    Io {
        /// What was done.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// containerd did not serve the CRI in time.
    #[error("containerd did not start: {0}")]
    NotStarted(String),
    /// A CRI call failed.
    #[error("CRI {call}: {status}")]
    Cri {
        /// The call.
        call: &'static str,
        /// Its status.
        status: Box<tonic::Status>,
    },
    /// `ctr images import` failed.
    #[error("ctr images import {archive}: {stderr}")]
    Import {
        /// The archive.
        archive: String,
        /// ctr's stderr.
        stderr: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let what = what.into();
    move |source| RuntimeError::Io { what, source }
}

/// A CRI error of `call`.
pub fn cri(call: &'static str) -> impl FnOnce(tonic::Status) -> RuntimeError {
    move |status| RuntimeError::Cri {
        call,
        status: Box::new(status),
    }
}

/// A node's containerd: started in [`NodeRuntime::start`], stopped (every pod sandbox stopped
/// and removed through the CRI first) on drop.
#[derive(Debug)]
pub struct NodeRuntime {
    dir: PathBuf,
    netns: String,
    process: Option<Supervised>,
}

impl NodeRuntime {
    /// Start containerd for the node whose network namespace is `netns`, with everything under
    /// `dir` (created; must not be below `/run`, which the node's mount namespace replaces).
    /// Waits until the CRI answers.
    pub fn start(netns: &str, dir: &Path, pids: Option<&PidList>) -> Result<Self, RuntimeError> {
        for d in [
            "host/opt/cni/bin",
            "host/etc/cni/net.d",
            "host/run",
            "host/var/log",
        ] {
            std::fs::create_dir_all(dir.join(d)).map_err(io(format!("create {d}")))?;
        }
        for d in ["root", "state", "pods", "logs"] {
            std::fs::create_dir_all(dir.join(d)).map_err(io(format!("create {d}")))?;
        }
        let config = dir.join("containerd.toml");
        std::fs::write(&config, config_toml(dir)).map_err(io("containerd.toml"))?;
        let mut binds = String::from("set -e\n");
        for d in NODE_DIRS {
            binds.push_str(&format!(
                "mount --bind '{}' '{d}'\n",
                dir.join("host").join(d.trim_start_matches('/')).display()
            ));
        }
        binds.push_str(&format!(
            "exec containerd --config '{}' --log-level info\n",
            config.display()
        ));
        let log =
            std::fs::File::create(dir.join("containerd.log")).map_err(io("containerd log"))?;
        let log2 = log.try_clone().map_err(io("containerd log"))?;
        let mut cmd = nsenter_net(netns, "unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(binds)
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdout(log)
            .stderr(log2);
        let process = Supervised::spawn(cmd, true, pids, Stop::Term(Duration::from_secs(10)))
            .map_err(io("spawn containerd"))?;
        let mut rt = Self {
            dir: dir.to_owned(),
            netns: netns.to_owned(),
            process: Some(process),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(p) = rt.process.as_mut()
                && let Some(status) = p.exited()
            {
                return Err(RuntimeError::NotStarted(format!(
                    "exited {status}\n{}",
                    rt.log_tail(30)
                )));
            }
            if rt.socket().exists() && rt.block_on(rt.version()).is_ok() {
                return Ok(rt);
            }
            if Instant::now() > deadline {
                return Err(RuntimeError::NotStarted(rt.log_tail(30)));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The node's directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node's network namespace.
    #[must_use]
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// containerd's socket (CRI and containerd API).
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// Where `node_path` (a path as the node and its pods see it) is in this machine's file
    /// system: below the node's directory for the node's own directories ([`NODE_DIRS`];
    /// `/var/run` is `/run`), else the machine's own path.
    #[must_use]
    pub fn host_path(&self, node_path: &str) -> PathBuf {
        let p = node_path
            .strip_prefix("/var/run")
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .map_or_else(|| node_path.to_owned(), |rest| format!("/run{rest}"));
        for d in NODE_DIRS {
            if p == d || p.starts_with(&format!("{d}/")) {
                return self.dir.join("host").join(p.trim_start_matches('/'));
            }
        }
        PathBuf::from(p)
    }

    /// The last `n` lines of containerd's log.
    #[must_use]
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// A channel to the CRI (a fresh connection; containerd serves the CRI on its socket).
    pub async fn channel(&self) -> Result<Channel, RuntimeError> {
        crate::unix_channel(self.socket())
            .await
            .map_err(RuntimeError::NotStarted)
    }

    /// The CRI runtime service.
    pub async fn runtime(&self) -> Result<RuntimeServiceClient<Channel>, RuntimeError> {
        Ok(RuntimeServiceClient::new(self.channel().await?))
    }

    async fn version(&self) -> Result<String, RuntimeError> {
        let v = self
            .runtime()
            .await?
            .version(k8s_cri::v1::VersionRequest::default())
            .await
            .map_err(cri("Version"))?
            .into_inner();
        Ok(format!("{} {}", v.runtime_name, v.runtime_version))
    }

    fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
            .block_on(f)
    }

    /// Import a `docker-archive` (one or more images, `podman save -m`) into the CRI's image
    /// namespace (`k8s.io`), as a node's images are pre-loaded; no registry is reached.
    pub fn import(&self, archive: &Path) -> Result<(), RuntimeError> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .map_err(io("ctr"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(RuntimeError::Import {
                archive: archive.display().to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }

    /// Stop and remove every pod sandbox through the CRI (containers stopped, CNI DEL run, shims
    /// gone), then containerd itself. What the CRI could not remove is killed through runc by
    /// the shims whose command line names this node's socket.
    pub fn shutdown(&mut self) {
        if self.process.is_none() {
            return;
        }
        let cleaned = self.block_on(async {
            let mut rs = self.runtime().await?;
            let pods = rs
                .list_pod_sandbox(k8s_cri::v1::ListPodSandboxRequest::default())
                .await
                .map_err(cri("ListPodSandbox"))?
                .into_inner()
                .items;
            for p in pods {
                let _ = rs
                    .stop_pod_sandbox(k8s_cri::v1::StopPodSandboxRequest {
                        pod_sandbox_id: p.id.clone(),
                    })
                    .await;
                let _ = rs
                    .remove_pod_sandbox(k8s_cri::v1::RemovePodSandboxRequest {
                        pod_sandbox_id: p.id,
                    })
                    .await;
            }
            Ok::<(), RuntimeError>(())
        });
        if let Err(e) = cleaned {
            eprintln!("kubelet node {}: CRI clean-up: {e}", self.netns);
        }
        delete_runc_containers(&self.dir);
        if let Some(mut p) = self.process.take() {
            p.stop(Stop::Term(Duration::from_secs(10)));
        }
        // the shims exit once their tasks are deleted; give them a moment
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.shim_pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        for pid in self.shim_pids() {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// PIDs of the containerd shims serving this node (their `-address` is this node's socket).
    fn shim_pids(&self) -> Vec<u32> {
        processes_naming(&self.dir)
            .into_iter()
            .filter(|(_, args)| {
                args.first()
                    .is_some_and(|a| a.ends_with("containerd-shim-runc-v2"))
            })
            .map(|(pid, _)| pid)
            .collect()
    }
}

/// Containers runc still lists in node `dir`'s runc root (the CRI clean-up failed or never
/// ran): killed and deleted by runc itself.
fn delete_runc_containers(dir: &Path) {
    let root = dir.join("host/run/containerd/runc/k8s.io");
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    for e in entries.flatten() {
        let id = e.file_name().to_string_lossy().into_owned();
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["delete", "--force", &id])
            .output();
    }
}

/// Processes (pid, argv) with an argument inside `dir`: a node's containerd (`--config`) and
/// shims (`-address`). Only a test run can have started a process naming a directory of ours.
fn processes_naming(dir: &Path) -> Vec<(u32, Vec<String>)> {
    let needle = format!("{}/", dir.display());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a.starts_with(&needle)) {
            out.push((pid, args));
        }
    }
    out
}

/// Prefix of the directories a run keeps its nodes in: `/var/tmp/kubelet-nodes-<pid>-*`.
pub const NODES_DIR_PREFIX: &str = "kubelet-nodes-";

/// A fresh directory for this run's nodes (`/var/tmp/kubelet-nodes-<pid>-*`, removed on drop),
/// after removing what crashed runs left: their containers (runc), shims and containerds (the
/// processes naming their directory), then the directories.
pub fn nodes_dir() -> std::io::Result<tempfile::TempDir> {
    crate::supervisor::remove_stale_dirs(Path::new("/var/tmp"), NODES_DIR_PREFIX, |run| {
        for node in std::fs::read_dir(run).into_iter().flatten().flatten() {
            delete_runc_containers(&node.path());
            for (pid, _) in processes_naming(&node.path()) {
                if let Ok(pid) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    });
    tempfile::Builder::new()
        .prefix(&format!("{NODES_DIR_PREFIX}{}-", std::process::id()))
        .tempdir_in("/var/tmp")
}

impl Drop for NodeRuntime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// containerd's configuration for a node: its own root, state and sockets; the CRI with the
/// node's CNI directories at their usual paths, the local pause image, runc with cgroupfs.
fn config_toml(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/root/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  # this machine's sandbox refuses an oom_score_adj below containerd's own (the pause
  # container's -998): clamp it, as nested and rootless nodes do
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_paths_map_below_the_node_directory() {
        let rt = NodeRuntime {
            dir: PathBuf::from("/var/tmp/k/node0"),
            netns: "n".into(),
            process: None,
        };
        assert_eq!(
            rt.host_path("/var/run/aws-node"),
            Path::new("/var/tmp/k/node0/host/run/aws-node")
        );
        assert_eq!(
            rt.host_path("/run/xtables.lock"),
            Path::new("/var/tmp/k/node0/host/run/xtables.lock")
        );
        assert_eq!(
            rt.host_path("/opt/cni/bin"),
            Path::new("/var/tmp/k/node0/host/opt/cni/bin")
        );
        assert_eq!(
            rt.host_path("/var/log/aws-routed-eni"),
            Path::new("/var/tmp/k/node0/host/var/log/aws-routed-eni")
        );
        // not a node directory: the machine's own (e.g. /sys/fs/bpf)
        assert_eq!(rt.host_path("/sys/fs/bpf"), Path::new("/sys/fs/bpf"));
        assert_eq!(rt.host_path("/optional"), Path::new("/optional"));
        assert_eq!(rt.host_path("/var/running"), Path::new("/var/running"));
    }
}
