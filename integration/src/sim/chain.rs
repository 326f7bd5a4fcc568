//! The CNI chain of a simulated node as aws-node installs it: the init container's IPv6
//! sysctls, the chart's conflist template filled in by the real `aws-cni-conflist` inside the
//! node (egress-cni's `nodeIP` read from vpcsim's IMDS), and the chain run as libcni runs a
//! conflist (ADD through every plugin in order, each result the next one's `prevResult`; CHECK
//! in order and DEL in reverse order with the cached result). Must not: touch namespaces other
//! than the run's, or files outside the run directory (the rendered conflist's host paths —
//! ipamd socket, log files, host-local's `dataDir` — are moved into the node's directory).

use super::plugin::exec_in_node;
use super::*;

/// Where the standard plugins (`host-local`, `portmap`, ...) are installed (Debian's
/// containernetworking-plugins); also the chain's `CNI_PATH`.
pub const STANDARD_PLUGINS: &str = "/usr/lib/cni";

/// The default conflist template of charts/aws-vpc-cni (`files/10-aws.conflist`: the ConfigMap
/// renders it and the image bakes it in at `/app/10-aws.conflist`), placeholders and all.
#[must_use]
pub fn chart_conflist_template() -> String {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/aws-vpc-cni/files/10-aws.conflist");
    std::fs::read_to_string(&path).unwrap_or_default()
}

fn is_true(v: &str) -> bool {
    // Go's strconv.ParseBool, as upstream's GetBoolAsStringEnvVar
    matches!(v, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

impl Sim {
    /// Install node `i`'s CNI chain as the aws-node pod does, with `env` the container's
    /// settings (e.g. `ENABLE_V6_EGRESS=true`, or `ENABLE_IPv6=true` + `ENABLE_IPv4=false`):
    /// the init container's sysctls (upstream's `aws-vpc-cni-init`: with `ENABLE_IPv6`
    /// `disable_ipv6=0`; with `ENABLE_IPv6` or `ENABLE_V6_EGRESS` `all.forwarding=1` and
    /// `accept_ra=2` on `eth0`; ours: the same for `ENABLE_DUAL_STACK_PODS`), then the real
    /// `aws-cni-conflist` run inside the node on the chart's template (IMDS at 169.254.169.254
    /// is vpcsim's). Returns the conflist exactly as rendered
    /// (`node<i>/10-aws.conflist.rendered`); the node's installed copy (`net.d/10-aws.conflist`,
    /// [`SimNode::conflist`]) differs only in this run's paths: `ipamdSocket`, `npaSocket`, the
    /// plugins' log files and egress-cni's lease `dataDir`. From now on the node's pods go
    /// through the whole chain.
    pub fn install_conflist(
        &mut self,
        i: usize,
        env: &[(&str, &str)],
    ) -> Result<serde_json::Value, SimError> {
        let get = |k: &str| env.iter().find(|(ek, _)| *ek == k).map(|(_, v)| *v);
        let v6_mode = get("ENABLE_IPv6").is_some_and(is_true);
        let v6_egress = get("ENABLE_V6_EGRESS").is_some_and(is_true);
        // Ours: dual-stack pods are routed by the node like IPv6 mode's (not upstream's init).
        let dual = get("ENABLE_DUAL_STACK_PODS").is_some_and(is_true);
        let ns = self.nodes[i].netns.clone();
        let mut sysctls = Vec::new();
        if v6_mode {
            sysctls.push("net.ipv6.conf.all.disable_ipv6=0");
        }
        if v6_mode || v6_egress || dual {
            sysctls.push("net.ipv6.conf.all.forwarding=1");
            sysctls.push("net.ipv6.conf.eth0.accept_ra=2");
        }
        // The init container's DISABLE_TCP_EARLY_DEMUX (kubelet's TCP probes to strict-mode
        // branch pods); left alone when the caller does not name it.
        match get("DISABLE_TCP_EARLY_DEMUX").map(is_true) {
            Some(true) => sysctls.push("net.ipv4.tcp_early_demux=0"),
            Some(false) => sysctls.push("net.ipv4.tcp_early_demux=1"),
            None => {}
        }
        for s in sysctls {
            let out = exec_in(&ns, &["sysctl", "-q", "-w", s]);
            if !out.status.success() {
                return Err(SimError::Launch(format!(
                    "init sysctl {s} in {ns}: {}",
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
        }
        let tool = crate::binaries::find_built("aws-cni-conflist")
            .map_err(|p| SimError::NotBuilt(p.display().to_string()))?;
        let dir = self.nodes[i].dir.clone();
        let template = dir.join("10-aws.conflist.template");
        std::fs::write(&template, chart_conflist_template())
            .map_err(io(format!("write {}", template.display())))?;
        let rendered_path = dir.join("10-aws.conflist.rendered");
        let mut cmd = crate::supervisor::netns_exec(&ns, &tool);
        cmd.arg(&template)
            .arg(&rendered_path)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .envs(env.iter().copied());
        let out = cmd.output().map_err(io("run aws-cni-conflist"))?;
        if !out.status.success() {
            return Err(SimError::Launch(format!(
                "aws-cni-conflist: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let text = std::fs::read_to_string(&rendered_path)
            .map_err(io(format!("read {}", rendered_path.display())))?;
        let rendered: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| SimError::Launch(format!("rendered conflist not JSON ({e}): {text}")))?;
        let node = &self.nodes[i];
        let mut installed = rendered.clone();
        if let Some(plugins) = installed["plugins"].as_array_mut() {
            for p in plugins {
                match p["type"].as_str() {
                    Some("aws-cni") => {
                        p["ipamdSocket"] = node.socket().display().to_string().into();
                        p["npaSocket"] = node.npa_socket().display().to_string().into();
                        p["pluginLogFile"] = node.plugin_log().display().to_string().into();
                    }
                    Some("egress-cni") => {
                        p["pluginLogFile"] = node.egress_plugin_log().display().to_string().into();
                        p["ipam"]["dataDir"] = node.egress_lease_dir().display().to_string().into();
                    }
                    _ => {}
                }
            }
        }
        let netd = node.netconf_dir();
        std::fs::create_dir_all(&netd).map_err(io(format!("create {}", netd.display())))?;
        let conf_path = netd.join("10-aws.conflist");
        std::fs::write(&conf_path, installed.to_string())
            .map_err(io(format!("write {}", conf_path.display())))?;
        self.nodes[i].conflist = Some(installed);
        Ok(rendered)
    }

    /// The binary of plugin `kind` (`type`): ours next to the test, the rest from
    /// [`STANDARD_PLUGINS`].
    fn plugin_binary(&self, kind: &str) -> PathBuf {
        match kind {
            "aws-cni" => self.bins.aws_cni.clone(),
            "egress-cni" => crate::binaries::find_built("egress-cni").unwrap_or_else(|p| p),
            other => Path::new(STANDARD_PLUGINS).join(other),
        }
    }

    /// Run node `node`'s installed conflist for `sandbox` as libcni does: `ADD` through every
    /// plugin in order (each result the next `prevResult`; the last one is returned), `CHECK`
    /// in order and `DEL` in reverse order, both with `cached` (the ADD result) as
    /// `prevResult`. The first failing plugin stops the walk, as in libcni.
    pub(super) fn run_chain(
        &self,
        command: &str,
        sandbox: Sandbox<'_>,
        node: usize,
        cached: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, CniFailure> {
        let list = self.nodes[node]
            .conflist
            .as_ref()
            .ok_or_else(|| CniFailure {
                code: -1,
                output: format!("node {node} has no conflist"),
            })?;
        let plugins = list["plugins"].as_array().cloned().unwrap_or_default();
        let order: Vec<&serde_json::Value> = if command == "DEL" {
            plugins.iter().rev().collect()
        } else {
            plugins.iter().collect()
        };
        let mut prev = cached.cloned();
        for p in order {
            let kind = p["type"].as_str().unwrap_or_default();
            let mut conf = p.clone();
            conf["name"] = list["name"].clone();
            conf["cniVersion"] = list["cniVersion"].clone();
            if let Some(prev) = &prev {
                conf["prevResult"] = prev.clone();
            }
            let bin = self.plugin_binary(kind);
            let out = exec_in_node(&bin, &self.nodes[node].netns, command, sandbox, &conf)
                .map_err(|(code, output)| CniFailure {
                    code,
                    output: format!("{kind} {command}: {output}"),
                })?;
            if command == "ADD" {
                let result: serde_json::Value =
                    serde_json::from_str(&out.stdout).map_err(|e| CniFailure {
                        code: 0,
                        output: format!("{kind}: result not JSON ({e}): {}", out.stdout),
                    })?;
                prev = Some(result);
            }
        }
        Ok(if command == "ADD" {
            prev.unwrap_or_default()
        } else {
            serde_json::Value::Null
        })
    }

    /// `CHECK` for `pod` through its node's chain (or `aws-cni` alone without a conflist), with
    /// its ADD result as `prevResult`.
    pub fn check_pod(&self, pod: &Pod) -> Result<(), CniFailure> {
        self.pod_cni("CHECK", pod.sandbox(), pod.node, Some(&pod.result))
            .map(drop)
    }

    /// `DEL` for `pod` again (the namespace may be gone), as a runtime retries it: must succeed
    /// and change nothing.
    pub fn del_pod_again(&self, pod: &Pod) -> Result<(), CniFailure> {
        self.pod_cni("DEL", pod.sandbox(), pod.node, Some(&pod.result))
            .map(drop)
    }

    /// One plugin call for a pod of node `node`: its chain when it has a conflist, else `aws-cni`
    /// with the node's netconf.
    pub(super) fn pod_cni(
        &self,
        command: &str,
        sandbox: Sandbox<'_>,
        node: usize,
        prev_result: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, CniFailure> {
        if self.nodes[node].conflist.is_some() {
            return self.run_chain(command, sandbox, node, prev_result);
        }
        run_plugin(
            &self.bins.aws_cni,
            &PluginTarget::of(self, node),
            command,
            sandbox,
            prev_result,
        )
        .map_err(|(code, output)| CniFailure { code, output })
    }

    /// egress-cni's host-local leases left in node `i`'s lease directory (file names; the
    /// `last_reserved_ip.*` bookkeeping and `lock` are not leases).
    #[must_use]
    pub fn egress_leases(&self, i: usize) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.nodes[i].egress_lease_dir().join("aws-cni")) else {
            return Vec::new();
        };
        rd.filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("last_reserved_ip") && n != "lock")
            .collect()
    }
}

/// `cnitool` (`integration/cnitool/main.go`): a CNI client on libcni, the library container
/// runtimes use, with the CNI project's cnitool command line. Built with Debian's `golang-go`
/// and `golang-github-appc-cni-dev` (GOPATH mode, offline; `integration/test.sh` installs both).
#[derive(Debug, Clone)]
pub struct Cnitool {
    bin: PathBuf,
}

impl Cnitool {
    /// `go build` it into `dir`.
    pub fn build(dir: &Path) -> Result<Self, String> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("cnitool/main.go");
        let bin = dir.join("cnitool");
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg(&src)
            .env("GO111MODULE", "off")
            .env("GOPATH", "/usr/share/gocode")
            .env("GOCACHE", "/tmp/aws-vpc-cni-rs-gocache")
            .current_dir(dir)
            .output()
            .map_err(|e| format!("go build (golang-go installed? integration/test.sh): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "go build cnitool (golang-github-appc-cni-dev installed?): {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(Self { bin })
    }
}

impl Sim {
    /// `cnitool <action> aws-cni <pod netns>` inside node `i` on the node's installed conflist
    /// (`NETCONFPATH` = [`SimNode::netconf_dir`]), plugins from the test's target directory and
    /// [`STANDARD_PLUGINS`], libcni's result cache under the node's directory, the sandbox named
    /// as kubelet names it. Its stdout (ADD: the result libcni cached), or the failure.
    pub fn cnitool(
        &self,
        tool: &Cnitool,
        i: usize,
        action: &str,
        sandbox: Sandbox<'_>,
    ) -> Result<String, String> {
        let node = &self.nodes[i];
        let ours = self
            .bins
            .aws_cni
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let out = crate::supervisor::netns_exec(&node.netns, &tool.bin)
            .args([action, "aws-cni", &netns_path(sandbox.netns)])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("NETCONFPATH", node.netconf_dir())
            .env("CNI_PATH", format!("{}:{STANDARD_PLUGINS}", ours.display()))
            .env("CNI_CACHE_DIR", node.dir.join("cni-cache"))
            .env("CNI_CONTAINERID", sandbox.container_id)
            .env(
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
                    sandbox.pod_name, sandbox.container_id
                ),
            )
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("run cnitool: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "cnitool {action}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Rewrite node `i`'s installed conflist with `f` (e.g. `disableCheck` off so that a
    /// client's CHECK reaches the plugins).
    pub fn edit_conflist(
        &mut self,
        i: usize,
        f: impl FnOnce(&mut serde_json::Value),
    ) -> Result<(), SimError> {
        let node = &mut self.nodes[i];
        let path = node.netconf_dir().join("10-aws.conflist");
        let Some(conf) = node.conflist.as_mut() else {
            return Err(SimError::Launch(format!("node {i} has no conflist")));
        };
        f(conf);
        std::fs::write(&path, conf.to_string()).map_err(io(format!("write {}", path.display())))
    }

    /// A new pod namespace below the run (for a runtime other than the harness's own to wire);
    /// deleted with the run.
    pub fn new_pod_netns(&mut self) -> Result<String, SimError> {
        self.pod_seq += 1;
        let netns = format!("{}p{}", self.prefix(), self.pod_seq);
        crate::supervisor::add_netns(&netns).map_err(SimError::Launch)?;
        Ok(netns)
    }
}
