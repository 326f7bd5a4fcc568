//! [`Podman`]: a real CNI client (podman 4 with its CNI backend) running inside a
//! [`TestNode`], with private storage, config and plugin directories under the node's temp
//! dir, and a busybox rootfs (no image pulls). Containers are removed on the node's drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::node::TestNode;

/// A podman configured for one node and one CNI network.
#[derive(Debug, Clone)]
pub struct Podman {
    dir: PathBuf,
    node_netns: PathBuf,
    /// CNI network name (the conflist's `name`).
    pub network: String,
}

impl Podman {
    /// Sets up podman for `node` with a conflist named `network` whose plugin list is
    /// `plugins` (JSON array). `plugin_bins` are copied into the private CNI bin dir.
    pub fn new(node: &mut TestNode, network: &str, plugins: &str, plugin_bins: &[&Path]) -> Self {
        let dir = node.dir().join("podman");
        for sub in ["root", "runroot", "tmp", "conf", "bin", "rootfs/bin"] {
            std::fs::create_dir_all(dir.join(sub)).expect("mkdir");
        }
        for d in ["proc", "sys", "dev", "etc", "tmp"] {
            std::fs::create_dir_all(dir.join("rootfs").join(d)).expect("mkdir");
        }
        std::fs::copy("/bin/busybox", dir.join("rootfs/bin/busybox")).expect("busybox-static");
        for applet in ["sh", "ping", "ip", "sleep", "cat"] {
            let _ = std::os::unix::fs::symlink("busybox", dir.join("rootfs/bin").join(applet));
        }
        for bin in plugin_bins {
            let name = bin.file_name().expect("plugin name");
            std::fs::copy(bin, dir.join("bin").join(name)).expect("copy plugin");
        }
        let conf = format!(
            "[network]\nnetwork_backend = \"cni\"\ncni_plugin_dirs = [\"{bin}\"]\n\
             network_config_dir = \"{conf}\"\n[engine]\ncgroup_manager = \"cgroupfs\"\n\
             events_logger = \"file\"\nevents_logfile_path = \"{d}/events.log\"\n\
             tmp_dir = \"{d}/tmp\"\n[containers]\nlog_driver = \"k8s-file\"\n",
            bin = dir.join("bin").display(),
            conf = dir.join("conf").display(),
            d = dir.display(),
        );
        std::fs::write(dir.join("containers.conf"), conf).expect("containers.conf");
        std::fs::write(
            dir.join("conf").join(format!("{network}.conflist")),
            format!(r#"{{"cniVersion":"1.0.0","name":"{network}","plugins":{plugins}}}"#),
        )
        .expect("conflist");
        let podman = Self {
            dir,
            node_netns: node.netns_path(),
            network: network.to_owned(),
        };
        let mut cleanup = podman.command();
        cleanup.args(["rm", "-fa", "-t", "0"]);
        node.on_drop(cleanup);
        podman
    }

    fn command(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.node_netns.display()))
            .arg("--")
            .arg("podman")
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("runroot"))
            .args(["--storage-driver", "vfs"])
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .stdin(Stdio::null());
        c
    }

    /// Runs `podman <args>`.
    #[must_use]
    pub fn raw(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("spawn podman")
    }

    /// Starts a detached container `name` on the network (CNI ADD); returns its id.
    pub fn run(&self, name: &str) -> Result<String, String> {
        let rootfs = self.dir.join("rootfs");
        let out = self.raw(&[
            "run",
            "-d",
            // The sandbox's hard RLIMIT_NOFILE is below podman's default.
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--name",
            name,
            "--network",
            &self.network,
            "--rootfs",
            rootfs.to_str().expect("utf8"),
            "/bin/sleep",
            "600",
        ]);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `podman exec <name> <cmd...>`.
    #[must_use]
    pub fn exec(&self, name: &str, cmd: &[&str]) -> Output {
        let mut args = vec!["exec", name];
        args.extend_from_slice(cmd);
        self.raw(&args)
    }

    /// Removes a container (CNI DEL).
    pub fn rm(&self, name: &str) -> Result<(), String> {
        let out = self.raw(&["rm", "-f", "-t", "0", name]);
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The CNI result libcni cached for a container (what it would hand to CHECK/DEL as
    /// `prevResult`), from `/var/lib/cni/results`.
    #[must_use]
    pub fn cached_result(&self, container_id: &str, ifname: &str) -> Option<serde_json::Value> {
        let path = Path::new("/var/lib/cni/results")
            .join(format!("{}-{container_id}-{ifname}", self.network));
        let raw = std::fs::read(path).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&raw).ok()?;
        v.get("result").cloned()
    }
}
