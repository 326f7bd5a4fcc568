//! The ipamd processes of a [`Sim`]: their environment inside the node namespaces, start,
//! readiness, restart (SIGKILL or SIGTERM), stop, logs and introspection. Must kill only the
//! processes it started (by PID).

use super::*;

/// The allocator setting the image's start-up (`charts/aws-vpc-cni/files/aws-node.sh`) gives
/// ipamd: every simulated node starts ipamd as a real node does (an `env` entry may override
/// it). A test below keeps the two the same.
pub const IPAMD_GLIBC_TUNABLES: &str = "glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0";

impl Sim {
    /// The environment ipamd gets inside node `i` (AWS SDK endpoints of the simulator, per-node
    /// paths), plus `extra` (later entries win).
    #[must_use]
    pub fn ipamd_env(&self, i: usize, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let n = &self.nodes[i];
        let region = self.world.config().region.clone();
        let mut env = names::node_env(&region, &n.netns, &n.instance_id);
        env.extend([
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("IPAMD_SOCKET_PATH".into(), n.socket().display().to_string()),
            (
                "AWS_VPC_K8S_CNI_BACKING_STORE".into(),
                n.checkpoint().display().to_string(),
            ),
            (
                "AWS_VPC_K8S_CNI_LOG_FILE".into(),
                n.ipamd_log().display().to_string(),
            ),
            ("AWS_VPC_K8S_CNI_LOGLEVEL".into(), "DEBUG".into()),
            // as the DaemonSet manifest sets it (the code default is false)
            ("ENABLE_IPv4".into(), "true".into()),
            ("MY_NODE_NAME".into(), format!("node{i}")),
            ("CLUSTER_NAME".into(), "vpcsim-e2e".into()),
        ]);
        if let Some(k) = &self.kube {
            env.retain(|(key, _)| key != "MY_NODE_NAME");
            env.extend(k.node_env(i));
        }
        for (k, v) in extra {
            env.retain(|(ek, _)| ek != k);
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
        env
    }

    /// The run's list of started processes (killed by the next run if this one crashes).
    #[must_use]
    pub fn pid_list(&self) -> PidList {
        PidList::at(self.dir.join("pids"))
    }

    /// Spawn ipamd binary `bin` inside node `i` with exactly `env`, stdout/stderr appended to
    /// `ipamd.stdout` in the node's directory, in its own process group, recorded in the run's
    /// [`Sim::pid_list`]; stopped on drop with SIGTERM (10 s grace, then SIGKILL). Does not
    /// wait (see [`Sim::ipamd_ready`]). Shared by the harness's own ipamd, a chosen build's
    /// ([`crate::upstream_node::IpamdBuild`]) and the fleet's.
    pub fn spawn_ipamd_process(
        &self,
        i: usize,
        bin: &Path,
        env: &[(String, String)],
    ) -> Result<Supervised, SimError> {
        let node = &self.nodes[i];
        let _ = std::fs::remove_file(node.socket());
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.dir.join("ipamd.stdout"))
            .map_err(io("ipamd stdout file"))?;
        let err = out.try_clone().map_err(io("ipamd stdout file"))?;
        let mut cmd = crate::supervisor::netns_exec(&node.netns, bin);
        cmd.env_clear()
            .env("GLIBC_TUNABLES", IPAMD_GLIBC_TUNABLES)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(out)
            .stderr(err);
        Supervised::spawn(
            cmd,
            true,
            Some(&self.pid_list()),
            Stop::Term(Duration::from_secs(10)),
        )
        .map_err(io(format!("spawn {}", bin.display())))
    }

    /// Whether node `i`'s ipamd serves its socket and introspection.
    #[must_use]
    pub fn ipamd_ready(&self, i: usize) -> bool {
        self.nodes[i].socket().exists() && self.introspect(i, "/v1/enis").is_ok()
    }

    /// Start ipamd in node `i` with [`Sim::ipamd_env`]`(i, extra)` and wait (up to `timeout`)
    /// until its socket and introspection answer.
    pub fn start_ipamd(
        &mut self,
        i: usize,
        extra: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<(), SimError> {
        let env = self.ipamd_env(i, extra);
        self.nodes[i].ipamd_env = env;
        self.restart_ipamd_process(i, timeout)
    }

    /// Start node `i`'s ipamd again (after [`Self::stop_ipamd`]) with the same environment and
    /// wait until ready.
    pub fn restart_ipamd_process(&mut self, i: usize, timeout: Duration) -> Result<(), SimError> {
        let env = self.nodes[i].ipamd_env.clone();
        let child = self.spawn_ipamd_process(i, &self.bins.ipamd.clone(), &env)?;
        self.nodes[i].ipamd = Some(child);
        self.wait_ipamd_ready(i, timeout)
    }

    /// Wait (up to `timeout`) until node `i`'s running ipamd serves its socket and
    /// introspection (after a [`Sim::start_ipamd`] that timed out while ipamd was still
    /// starting, e.g. waiting for the API server).
    pub fn wait_ipamd(&mut self, i: usize, timeout: Duration) -> Result<(), SimError> {
        self.wait_ipamd_ready(i, timeout)
    }

    fn wait_ipamd_ready(&mut self, i: usize, timeout: Duration) -> Result<(), SimError> {
        let deadline = Instant::now() + timeout;
        loop {
            let node = &mut self.nodes[i];
            if let Some(child) = node.ipamd.as_mut()
                && let Some(status) = child.exited()
            {
                node.ipamd = None;
                return Err(SimError::IpamdNotReady {
                    node: i,
                    why: format!("exited: {status}"),
                    log: self.ipamd_log_tail(i, 30),
                });
            }
            if self.ipamd_ready(i) {
                return Ok(());
            }
            if Instant::now() >= deadline || self.cancelled() {
                return Err(SimError::IpamdNotReady {
                    node: i,
                    why: format!("no socket/introspection after {timeout:?}"),
                    log: self.ipamd_log_tail(i, 30),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Restart node `i`'s ipamd with the same environment: SIGKILL (crash) when `kill`, else
    /// SIGTERM (graceful), then start and wait until ready.
    pub fn restart_ipamd(
        &mut self,
        i: usize,
        kill: bool,
        timeout: Duration,
    ) -> Result<(), SimError> {
        self.stop_ipamd(i, kill);
        self.restart_ipamd_process(i, timeout)
    }

    /// SIGKILL node `i`'s ipamd, delete its checkpoint (a lost node volume, a changed path),
    /// and start it again with the same environment: the pods it served keep running.
    pub fn restart_ipamd_without_checkpoint(
        &mut self,
        i: usize,
        timeout: Duration,
    ) -> Result<(), SimError> {
        self.stop_ipamd(i, true);
        let path = self.nodes[i].checkpoint();
        std::fs::remove_file(&path).map_err(super::io(format!("delete {}", path.display())))?;
        self.restart_ipamd_process(i, timeout)
    }

    /// Stop node `i`'s ipamd (SIGKILL when `kill`, else SIGTERM with a 10 s grace, then SIGKILL).
    pub fn stop_ipamd(&mut self, i: usize, kill: bool) {
        if let Some(mut child) = self.nodes[i].ipamd.take() {
            child.stop(if kill {
                Stop::Kill
            } else {
                Stop::Term(Duration::from_secs(10))
            });
        }
    }

    /// The last `n` lines of node `i`'s ipamd log (file log, then stdout/stderr).
    #[must_use]
    pub fn ipamd_log_tail(&self, i: usize, n: usize) -> String {
        let node = &self.nodes[i];
        let mut text = String::new();
        for f in [node.ipamd_log(), node.dir.join("ipamd.stdout")] {
            let content = std::fs::read_to_string(&f).unwrap_or_default();
            let lines: Vec<&str> = content.lines().collect();
            let start = lines.len().saturating_sub(n);
            text.push_str(&format!(
                "[{}]\n{}\n",
                f.display(),
                lines[start..].join("\n")
            ));
        }
        text
    }

    /// `GET <path>` on node `i`'s introspection endpoint, as JSON.
    pub fn introspect(&self, i: usize, path: &str) -> Result<serde_json::Value, String> {
        let body = self.http_get(i, INTROSPECTION, path)?;
        serde_json::from_str(&body).map_err(|e| format!("{path}: not JSON ({e}): {body}"))
    }

    /// `GET http://<addr><path>` from inside node `i` (plain HTTP/1.0, 5 s).
    pub fn http_get(&self, i: usize, addr: &str, path: &str) -> Result<String, String> {
        let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        let raw = in_netns(&self.nodes[i].netns, move || {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.write_all(req.as_bytes())?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })?;
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw.as_str(), ""));
        if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") {
            Ok(body.to_owned())
        } else {
            Err(format!("GET {path}: {}", head.lines().next().unwrap_or("")))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ipamd_gets_the_allocator_setting_of_the_image() {
        let script = include_str!("../../../charts/aws-vpc-cni/files/aws-node.sh");
        let line = script
            .lines()
            .find(|l| l.contains("\"$app/ipamd\" &"))
            .expect("aws-node.sh starts ipamd");
        assert!(
            line.starts_with(&format!("GLIBC_TUNABLES=\"{}", super::IPAMD_GLIBC_TUNABLES)),
            "{line}"
        );
    }
}
