//! [`TestNode`]: a throwaway "node" network namespace playing the EC2 host, with pod
//! namespaces below it, an optional simulated VPC (primary ENI `eth0` on table main, secondary
//! ENI `eth1` on table 2), and the processes started inside it. All of it goes on drop (processes
//! by PID, then namespaces, through [`crate::supervisor`]); a crashed run's namespaces (with the
//! processes still in them) and temp dirs go at the next run's first [`TestNode`].

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::supervisor::{self, OwnedNetns, Stop, Supervised};

/// Prefix of every namespace and temp dir the fixtures create: `cnit-<pid>-<n>-...`.
pub const PREFIX: &str = "cnit-";

static COUNTER: AtomicU32 = AtomicU32::new(0);
static STALE: Once = Once::new();
/// How long a node's ipamd (real or stand-in) may take to open its socket. Generous: inside the
/// VM suites' emulated (TCG) guest on a 2-core machine busy with other suites, a debug
/// stand-in once took more than 10 s (CI, `sgp_fabric_vm`); a start that fails costs this wait.
const START_WAIT: Duration = Duration::from_secs(60);

/// Simulated VPC: primary ENI subnet (node `eth0`, table main).
pub const PRIMARY_SUBNET_GW: &str = "198.18.0.1";
/// Node's primary IP on `eth0`.
pub const NODE_PRIMARY_IP: &str = "198.18.0.5";
/// Secondary ENI subnet gateway (node `eth1`, table 2).
pub const SECONDARY_SUBNET_GW: &str = "198.18.1.1";
/// Primary IP of the secondary ENI.
pub const SECONDARY_ENI_IP: &str = "198.18.1.5";
/// Route table of the secondary ENI (device 1).
pub const SECONDARY_TABLE: u32 = 2;
/// An address "outside" reachable only through the VPC namespace.
pub const VPC_SERVICE_IP: &str = "203.0.113.1";

/// A pod network namespace created below a node.
#[derive(Debug, Clone)]
pub struct PodNs {
    /// Netns name (`ip netns`).
    pub name: String,
    /// `/var/run/netns/<name>`.
    pub path: PathBuf,
}

/// A running `test-ipamd`.
#[derive(Debug, Clone)]
pub struct TestIpamd {
    /// Its unix socket.
    pub socket: PathBuf,
    /// Its allocation table (JSON list, rewritten on every change).
    pub state: PathBuf,
    /// Process id.
    pub pid: u32,
}

impl TestIpamd {
    /// Current allocations (each with `containerID`, `ifname`, `ip`, `deviceNumber`,
    /// `routeTableId`).
    #[must_use]
    pub fn allocations(&self) -> Vec<serde_json::Value> {
        let raw = std::fs::read(&self.state).unwrap_or_default();
        serde_json::from_slice(&raw).unwrap_or_default()
    }
}

/// A throwaway node netns and everything below it.
#[derive(Debug)]
pub struct TestNode {
    base: String,
    name: String,
    dir: PathBuf,
    // field order is drop order: cleanups run by hand in Drop, then processes, then namespaces
    children: Vec<Supervised>,
    netns: OwnedNetns,
    cleanups: Vec<Command>,
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
}

fn must(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &[&str]) -> String {
    must(Command::new("ip").args(args))
}

/// Removes namespaces (killing what still runs in them) and temp dirs of earlier runs whose
/// process is gone, through the shared [`supervisor`].
pub fn remove_stale() {
    supervisor::remove_stale_dirs(&std::env::temp_dir(), PREFIX, |dir| {
        let root = dir.join("podman/root");
        if root.exists() {
            let _ = run(Command::new("podman")
                .arg("--root")
                .arg(&root)
                .arg("--runroot")
                .arg(dir.join("podman/runroot"))
                .args(["--storage-driver", "vfs", "rm", "-fa", "-t", "0"])
                .env("CONTAINERS_CONF", dir.join("podman/containers.conf")));
        }
    });
    supervisor::remove_stale_netns(PREFIX);
}

impl TestNode {
    /// Creates a node netns (`cnit-<pid>-<n>-<tag>`) with forwarding on, and a temp dir.
    #[must_use]
    pub fn new(tag: &str) -> Self {
        STALE.call_once(remove_stale);
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let base = format!("{PREFIX}{}-{n}", std::process::id());
        let name = format!("{base}-{tag}");
        let dir = std::env::temp_dir().join(&base);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let mut netns = OwnedNetns::default();
        netns.create(&name).unwrap_or_else(|e| panic!("{e}"));
        let node = Self {
            base,
            name,
            dir,
            children: Vec::new(),
            netns,
            cleanups: Vec::new(),
        };
        for (k, v) in [
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv6/conf/all/forwarding", "1"),
            ("net/ipv4/conf/all/rp_filter", "0"),
            ("net/ipv4/conf/default/rp_filter", "0"),
        ] {
            node.sysctl(k, v);
        }
        node
    }

    /// Netns name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/var/run/netns/<name>`.
    #[must_use]
    pub fn netns_path(&self) -> PathBuf {
        supervisor::netns_path(&self.name)
    }

    /// This node's temp dir (sockets, logs, configs).
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A command that runs `program` inside the node netns (`nsenter --net`, mounts untouched
    /// so cgroups stay visible for container runtimes).
    #[must_use]
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        supervisor::nsenter_net(&self.name, program)
    }

    /// `ip -n <node> <args>`; panics on failure.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// Writes a sysctl (key relative to `/proc/sys`) inside the node.
    pub fn sysctl(&self, key: &str, value: &str) {
        must(
            self.command("sh")
                .args(["-c", &format!("echo {value} > /proc/sys/{key}")]),
        );
    }

    /// Creates a pod netns below this node (`lo` up).
    #[must_use]
    pub fn add_pod_netns(&mut self, tag: &str) -> PodNs {
        let name = format!("{}-{tag}", self.base);
        self.netns.create(&name).unwrap_or_else(|e| panic!("{e}"));
        PodNs {
            path: supervisor::netns_path(&name),
            name,
        }
    }

    /// Deletes a pod netns now (as a runtime does before DEL).
    pub fn delete_pod_netns(&mut self, pod: &PodNs) {
        self.netns.delete(&pod.name);
    }

    /// Runs a process inside the node; it is killed on drop.
    pub fn spawn(&mut self, cmd: Command) -> u32 {
        let what = format!("{cmd:?}");
        let child = Supervised::spawn(cmd, false, None, Stop::Kill)
            .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        let pid = child.pid();
        self.children.push(child);
        pid
    }

    /// Kills a process started with [`TestNode::spawn`].
    pub fn kill(&mut self, pid: u32) {
        if let Some(pos) = self.children.iter().position(|c| c.pid() == pid) {
            self.children.remove(pos).stop(Stop::Kill);
        }
    }

    /// Registers a command run on drop, before the namespaces go (e.g. `podman rm`).
    pub fn on_drop(&mut self, cmd: Command) {
        self.cleanups.push(cmd);
    }

    /// Starts `test-ipamd` inside the node and waits for its socket.
    pub fn start_test_ipamd(&mut self) -> TestIpamd {
        self.start_test_ipamd_with(&[])
    }

    /// [`TestNode::start_test_ipamd`] with extra arguments (e.g. `--ipv6`).
    pub fn start_test_ipamd_with(&mut self, args: &[&str]) -> TestIpamd {
        let socket = self.dir.join("ipamd.sock");
        let state = self.dir.join("ipamd-state.json");
        let _ = std::fs::remove_file(&socket);
        let mut cmd = self.command(crate::built_binary("test-ipamd"));
        cmd.arg("--socket").arg(&socket).arg("--state").arg(&state);
        cmd.args(args);
        let pid = self.spawn(cmd);
        let deadline = Instant::now() + START_WAIT;
        while !socket.exists() {
            assert!(Instant::now() < deadline, "test-ipamd did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        TestIpamd { socket, state, pid }
    }

    /// Starts the real `ipamd` inside the node with the in-memory ENI provider (EC2 stand-in,
    /// its "EC2" kept in `ec2.json` across restarts), the checkpoint, socket and log in the
    /// node's directory and `WARM_IP_TARGET=1`, plus `extra_env` (later wins), and waits for
    /// its socket. `enis` is the provider's shape, e.g. `max_enis=2,ipv4_per_eni=4`.
    pub fn start_ipamd(&mut self, enis: &str, extra_env: &[(&str, &str)]) -> u32 {
        let socket = self.dir.join("ipamd.sock");
        let _ = std::fs::remove_file(&socket);
        let mut cmd = self.command(crate::built_binary("ipamd"));
        cmd.env("ENABLE_IPv4", "true")
            .env("IPAMD_ENI_PROVIDER", "memory")
            .env(
                "IPAMD_MEMORY_PROVIDER",
                format!(
                    "subnet=198.18.0.0/24,vpc=198.18.0.0/16,{enis},state={}",
                    self.dir.join("ec2.json").display()
                ),
            )
            .env("AWS_VPC_K8S_CNI_BACKING_STORE", self.dir.join("ipam.json"))
            .env("IPAMD_SOCKET_PATH", &socket)
            .env("AWS_VPC_K8S_CNI_LOG_FILE", self.dir.join("ipamd.log"))
            .env("WARM_IP_TARGET", "1")
            .envs(extra_env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let pid = self.spawn(cmd);
        let deadline = Instant::now() + START_WAIT;
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "ipamd did not start; log:\n{}",
                self.ipamd_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        pid
    }

    /// What the real ipamd started by [`TestNode::start_ipamd`] logged so far.
    #[must_use]
    pub fn ipamd_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("ipamd.log")).unwrap_or_default()
    }

    /// The `aws-cni` network configuration for this node's ipamd (socket and plugin log in the
    /// node's directory).
    #[must_use]
    pub fn aws_cni_conf(&self) -> String {
        format!(
            r#"{{"cniVersion":"1.0.0","name":"aws-cni","type":"aws-cni","mtu":"9001","vethPrefix":"eni",
            "ipamdSocket":"{}","pluginLogFile":"{}","pluginLogLevel":"Debug"}}"#,
            self.dir.join("ipamd.sock").display(),
            self.dir.join("plugin.log").display()
        )
    }

    /// Wires a simulated VPC: a `vpc` netns joined to the node by two veth pairs playing the
    /// primary ENI (`eth0`, 198.18.0.5/24, default route in main) and a secondary ENI (`eth1`,
    /// 198.18.1.5/24, routes in table 2 and `from 198.18.1.5 lookup 2`, its main-table subnet
    /// route removed, as ipamd does). The VPC side answers on 203.0.113.1 with strict
    /// rp_filter, so a packet from a secondary-ENI pod only gets through if it left via `eth1`.
    /// ENI interfaces proxy-ARP for pod addresses, like the VPC fabric delivering to an ENI.
    pub fn attach_vpc(&mut self) {
        let vpc = format!("{}-vpc", self.base);
        self.netns.create(&vpc).unwrap_or_else(|e| panic!("{e}"));
        ip(&[
            "-n",
            &vpc,
            "addr",
            "add",
            &format!("{VPC_SERVICE_IP}/32"),
            "dev",
            "lo",
        ]);
        for (eth, peer, node_ip, gw) in [
            ("eth0", "ve0", NODE_PRIMARY_IP, PRIMARY_SUBNET_GW),
            ("eth1", "ve1", SECONDARY_ENI_IP, SECONDARY_SUBNET_GW),
        ] {
            self.ip(&[
                "link", "add", eth, "type", "veth", "peer", "name", peer, "netns", &vpc,
            ]);
            self.ip(&["addr", "add", &format!("{node_ip}/24"), "dev", eth]);
            self.ip(&["link", "set", eth, "up"]);
            self.sysctl(&format!("net/ipv4/conf/{eth}/proxy_arp"), "1");
            ip(&["-n", &vpc, "addr", "add", &format!("{gw}/24"), "dev", peer]);
            ip(&["-n", &vpc, "link", "set", peer, "up"]);
        }
        for key in ["all", "default", "ve0", "ve1"] {
            must(Command::new("ip").args([
                "netns",
                "exec",
                &vpc,
                "sh",
                "-c",
                &format!("echo 1 > /proc/sys/net/ipv4/conf/{key}/rp_filter"),
            ]));
        }
        let table = SECONDARY_TABLE.to_string();
        self.ip(&[
            "route",
            "add",
            "default",
            "via",
            PRIMARY_SUBNET_GW,
            "dev",
            "eth0",
        ]);
        self.ip(&[
            "route",
            "del",
            "198.18.1.0/24",
            "dev",
            "eth1",
            "table",
            "main",
        ]);
        self.ip(&[
            "route",
            "add",
            SECONDARY_SUBNET_GW,
            "dev",
            "eth1",
            "scope",
            "link",
            "table",
            &table,
        ]);
        self.ip(&[
            "route",
            "add",
            "default",
            "via",
            SECONDARY_SUBNET_GW,
            "dev",
            "eth1",
            "table",
            &table,
        ]);
        self.ip(&[
            "rule",
            "add",
            "pref",
            "32765",
            "from",
            SECONDARY_ENI_IP,
            "lookup",
            &table,
        ]);
    }

    /// `ip -o <args>` lines, whitespace-normalised.
    #[must_use]
    pub fn ip_lines(&self, args: &[&str]) -> Vec<String> {
        self.ip(args)
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// Pod-related state left in the node: veth links, non-default rules, routes through
    /// veths, and neighbours on veths. Empty after a clean DEL.
    #[must_use]
    pub fn pod_leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        left.extend(
            self.ip_lines(&["-o", "link", "show", "type", "veth"])
                .into_iter()
                .filter(|l| !l.contains(": eth0@") && !l.contains(": eth1@")),
        );
        for fam in ["-4", "-6"] {
            left.extend(
                self.ip_lines(&[fam, "rule", "show"])
                    .into_iter()
                    .filter(|l| l.starts_with("512:") || l.starts_with("1536:")),
            );
            left.extend(
                self.ip_lines(&[fam, "route", "show", "table", "all"])
                    .into_iter()
                    .filter(|l| l.contains(" dev eni") || l.contains(" dev cnit")),
            );
            left.extend(
                self.ip_lines(&[fam, "neigh", "show"])
                    .into_iter()
                    .filter(|l| l.contains(" dev eni")),
            );
        }
        left
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        for mut cmd in self.cleanups.drain(..) {
            let _ = run(&mut cmd);
        }
        self.children.clear();
        self.netns.delete_all();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
