//! `egress-cni`, the egress plugin chained after `aws-cni`: with `enabled` = "true" it gives the
//! pod a second interface for the other IP family — `v4if0` with an IPv4 from `169.254.172.0/22`
//! for IPv6 pods (`nodeIP` is the node's IPv4), or `v6if0` with an IPv6 from `fd00::ac:00/118` for
//! IPv4 pods (`nodeIP` is the node's global IPv6) — leased by the `host-local` IPAM plugin from
//! `CNI_PATH` and SNATed to `nodeIP` in a per-container `CNI-E4-*`/`CNI-E6-*` chain. Disabled
//! (anything but "true") ADD hands `prevResult` on in the configuration's version, DEL and CHECK
//! succeed silently. This module owns configuration parsing and the verbs; `plan` decides, `apply`
//! executes. Must not: write stdout (its `main` does), talk to ipamd.

pub mod apply;
pub mod plan;

use std::collections::HashMap;
use std::net::IpAddr;

use serde::Deserialize;

use crate::Outcome;
use crate::spec::netconf::sniff_version;
use crate::spec::result::{WireInterface, WireResult};
use crate::spec::{CniEnv, CniVersion, Command, ErrorCode, SpecError};

/// The fields of the egress NetConf this plugin reads; all strings, so a number is a decoding error
/// (as existing conflists were validated).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Wire {
    #[serde(default)]
    cni_version: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    mtu: String,
    #[serde(default)]
    enabled: String,
    #[serde(default, rename = "nodeIP")]
    node_ip: String,
    #[serde(default)]
    prev_result: Option<serde_json::Value>,
    #[serde(default, rename = "randomizeSNAT")]
    randomize_snat: String,
    #[serde(default)]
    ipam: Option<IpamWire>,
}

#[derive(Deserialize)]
struct IpamWire {
    #[serde(default, rename = "type")]
    kind: String,
}

/// Where and how much to log (`pluginLogFile`/`pluginLogLevel`, read before anything else so that
/// refusals are logged too).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct LogWire {
    #[serde(default)]
    plugin_log_file: String,
    #[serde(default)]
    plugin_log_level: String,
}

/// The logger level names (`DEBUG`, `Info`, ...); anything else is debug.
fn log_level(name: &str) -> crate::spec::netconf::LogLevel {
    use crate::spec::netconf::LogLevel;
    match name.to_ascii_lowercase().as_str() {
        "info" => LogLevel::Info,
        "warn" | "warning" => LogLevel::Warn,
        "error" | "fatal" => LogLevel::Error,
        _ => LogLevel::Debug,
    }
}

/// Runs one invocation: `vars` is the process environment, `stdin` the configuration.
pub fn run(vars: &HashMap<String, String>, stdin: &[u8]) -> Outcome {
    let version = sniff_version(stdin).unwrap_or(CniVersion::LATEST);
    let log: LogWire = serde_json::from_slice(stdin).unwrap_or_default();
    let _log = crate::logging::init_sink(
        &crate::spec::netconf::LogSink::parse(&log.plugin_log_file),
        log_level(&log.plugin_log_level),
    );
    let command = vars.get("CNI_COMMAND").map_or("", String::as_str);
    let container_id = vars.get("CNI_CONTAINERID").map_or("", String::as_str);
    let netns = vars.get("CNI_NETNS").map_or("", String::as_str);
    tracing::debug!(
        command,
        container_id,
        netns,
        "egress-cni: received a {command} request"
    );
    match invoke(vars, stdin) {
        Ok(stdout) => {
            tracing::debug!(command, container_id, "egress-cni: {command} done");
            Outcome {
                stdout,
                exit_code: 0,
            }
        }
        Err((e, v)) => {
            tracing::error!(command, container_id, code = ?e.code, details = %e.details,
                "egress-cni: {command} failed: {}", e.msg);
            Outcome {
                stdout: e.to_json(v.unwrap_or(version).as_str()),
                exit_code: 1,
            }
        }
    }
}

type Failure = (SpecError, Option<CniVersion>);

fn invoke(vars: &HashMap<String, String>, stdin: &[u8]) -> Result<String, Failure> {
    let env = CniEnv::from_vars(vars).map_err(|e| {
        (
            SpecError::new(ErrorCode::InvalidEnvironment, e.to_string(), &e),
            None,
        )
    })?;
    if env.command == Command::Version {
        return Ok(crate::spec::result::version_json(
            sniff_version(stdin).unwrap_or(CniVersion::LATEST),
        ));
    }
    let wire: Wire = serde_json::from_slice(stdin).map_err(|e| {
        (
            SpecError::new(ErrorCode::Decode, "decode network config", &e),
            None,
        )
    })?;
    let version = CniVersion::parse(&wire.cni_version).ok_or_else(|| {
        (
            SpecError::msg(
                ErrorCode::IncompatibleVersion,
                format!(
                    "incompatible CNI versions: config is {:?}",
                    wire.cni_version
                ),
            ),
            None,
        )
    })?;
    let fail = |code, msg: String| (SpecError::msg(code, msg), Some(version));
    if wire.name.is_empty() {
        return Err(fail(
            ErrorCode::InvalidNetworkConfig,
            "missing network name".into(),
        ));
    }
    if !version.allows(env.command) {
        return Err(fail(
            ErrorCode::IncompatibleVersion,
            format!("config version does not allow {}", env.command.as_str()),
        ));
    }
    if !wire.node_ip.is_empty() && wire.node_ip.parse::<IpAddr>().is_err() {
        return Err(fail(
            ErrorCode::Decode,
            format!(
                "failed to parse config: invalid IP address: {}",
                wire.node_ip
            ),
        ));
    }
    let prev = match wire.prev_result.clone() {
        None | Some(serde_json::Value::Null) => None,
        Some(v) => Some(WireResult::from_value(v, version).map_err(|e| {
            (
                SpecError::new(
                    ErrorCode::InvalidNetworkConfig,
                    "could not parse prevResult",
                    &e,
                ),
                Some(version),
            )
        })?),
    };
    let enabled = wire.enabled == "true";
    let node_ip = (!wire.node_ip.is_empty())
        .then(|| wire.node_ip.parse::<IpAddr>().ok())
        .flatten();
    let ctx = || -> Result<Ctx<'_>, Failure> {
        Ok(Ctx {
            vars,
            stdin,
            env: &env,
            wire: &wire,
            version,
            node_ip,
            ipam_type: ipam_type(&wire, version)?,
        })
    };
    match env.command {
        Command::Add => {
            let prev = prev.ok_or_else(|| {
                fail(
                    ErrorCode::InvalidNetworkConfig,
                    "must be called as a chained plugin".into(),
                )
            })?;
            // The MTU is parsed before `enabled` is looked at (a bad MTU fails a disabled ADD).
            let mtu = wire.mtu.parse::<i64>().map_err(|_| {
                fail(
                    ErrorCode::InvalidNetworkConfig,
                    format!("failed to parse MTU: {:?}", wire.mtu),
                )
            })?;
            if !enabled {
                return prev
                    .to_json(version)
                    .map_err(|e| fail(ErrorCode::InvalidNetworkConfig, e.to_string()));
            }
            let ctx = ctx()?;
            let mtu = u32::try_from(mtu).map_err(|_| {
                fail(
                    ErrorCode::InvalidNetworkConfig,
                    format!("failed to parse MTU: {:?}", wire.mtu),
                )
            })?;
            ctx.add(prev, mtu).map_err(|e| (e, Some(version)))
        }
        Command::Del if enabled => {
            let ctx = ctx()?;
            ctx.del()
                .map(|()| String::new())
                .map_err(|e| (e, Some(version)))
        }
        Command::Check if enabled => {
            let ctx = ctx()?;
            ctx.check(prev.as_ref())
                .map(|()| String::new())
                .map_err(|e| (e, Some(version)))
        }
        Command::Del | Command::Check | Command::Status | Command::Gc | Command::Version => {
            Ok(String::new())
        }
    }
}

/// One enabled invocation's inputs.
struct Ctx<'a> {
    vars: &'a HashMap<String, String>,
    stdin: &'a [u8],
    env: &'a CniEnv,
    wire: &'a Wire,
    version: CniVersion,
    node_ip: Option<IpAddr>,
    ipam_type: String,
}

/// The IPAM plugin named by the netconf's `ipam.type`, which an enabled call needs.
fn ipam_type(wire: &Wire, version: CniVersion) -> Result<String, Failure> {
    wire.ipam
        .as_ref()
        .map(|i| i.kind.clone())
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            (
                SpecError::msg(
                    ErrorCode::InvalidNetworkConfig,
                    "IPAM config missing 'type' key",
                ),
                Some(version),
            )
        })
}

fn setup_error(msg: &str, e: &dyn std::error::Error) -> SpecError {
    SpecError::new(ErrorCode::SetupFailed, msg, e)
}

impl<'a> Ctx<'a> {
    fn runtime() -> Result<tokio::runtime::Runtime, SpecError> {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| SpecError::new(ErrorCode::Io, "start runtime", &e))
    }

    fn ipam(&self) -> Result<apply::Ipam, SpecError> {
        apply::Ipam::find(&self.ipam_type, self.vars)
            .map_err(|e| SpecError::new(ErrorCode::Io, "running IPAM plugin failed", &e))
    }

    fn chain_and_comment(&self, kind: plan::EgressKind) -> (String, String) {
        (
            plan::chain_name(&self.wire.name, &self.env.container_id, kind),
            plan::snat_comment(&self.wire.name, &self.env.container_id),
        )
    }

    /// The pod's network namespace (`CNI_NETNS`, required by ADD and CHECK): its path and an
    /// open handle.
    fn pod_netns(&self) -> Result<(std::path::PathBuf, dataplane::NetNs), SpecError> {
        let path = self
            .env
            .netns
            .clone()
            .ok_or_else(|| SpecError::msg(ErrorCode::UnknownContainer, "CNI_NETNS is empty"))?;
        let pod = apply::open_netns(&path)
            .map_err(|e| SpecError::new(ErrorCode::UnknownContainer, "open netns", &e))?;
        Ok((path, pod))
    }

    fn add(&self, prev: WireResult, mtu: u32) -> Result<String, SpecError> {
        let kind = plan::EgressKind::for_node_ip(self.node_ip)
            .map_err(|e| SpecError::new(ErrorCode::InvalidNetworkConfig, e.to_string(), &e))?;
        let node_ip = self
            .node_ip
            .ok_or_else(|| SpecError::msg(ErrorCode::InvalidNetworkConfig, "nodeIP missing"))?;
        let (netns_path, pod) = self.pod_netns()?;
        let host = dataplane::NetNs::current()
            .map_err(|e| SpecError::new(ErrorCode::Io, "open host netns", &e))?;
        let iptables = apply::Iptables::find(kind, self.vars)
            .map_err(|e| SpecError::new(ErrorCode::Io, "iptables", &e))?;
        let ipam = self.ipam()?;
        let ips = ipam.add(self.stdin, self.version).map_err(|e| {
            SpecError::new(
                ErrorCode::Io,
                "failed to get one ip address from host-local ipam",
                &e,
            )
        })?;
        // From here on a failure gives the lease back and removes what was created.
        let undo = |err: SpecError| -> SpecError {
            let mut err = err;
            let (chain, comment) = self.chain_and_comment(kind);
            let cleanup = Self::runtime()
                .map_err(|e| e.msg.clone())
                .and_then(|rt| {
                    rt.block_on(apply::delete_link(&pod, kind.ifname()))
                        .map_err(|e| e.to_string())
                })
                .err()
                .into_iter()
                .chain(
                    iptables
                        .delete_chain(&chain, &comment, &[])
                        .err()
                        .map(|e| e.to_string()),
                )
                .chain(
                    ipam.del(self.stdin, self.version)
                        .err()
                        .map(|e| e.to_string()),
                )
                .collect::<Vec<_>>();
            if !cleanup.is_empty() {
                err.details = format!("{}; cleanup: {}", err.details, cleanup.join("; "));
            }
            err
        };
        let lease = plan::EgressLease::from_ipam(kind, &ips)
            .map_err(|e| undo(SpecError::new(ErrorCode::Io, e.to_string(), &e)))?;
        let random = dataplane::MacAddr::random_local().0;
        let input = plan::EgressInput {
            network: &self.wire.name,
            container_id: &self.env.container_id,
            pod_ifname: &self.env.ifname,
            node_ip,
            mtu,
            randomize: &self.wire.randomize_snat,
            has_random_fully: iptables.has_random_fully(),
            host_veth: format!("veth{}", hex::encode(&random[2..6])),
        };
        let egress = plan::plan_add(kind, &input, lease);
        let rt = Self::runtime().map_err(undo)?;
        let applied = rt
            .block_on(apply::setup_links(&egress, &host, &pod))
            .map_err(|e| undo(setup_error("setup egress interface", &e)))?;
        iptables
            .add_rules(&egress.nat_rules)
            .map_err(|e| undo(setup_error("setup host snat", &e)))?;
        let mut result = prev;
        result.interfaces.push(WireInterface {
            name: egress.host_veth.clone(),
            mac: applied.host_mac,
            ..WireInterface::default()
        });
        result.interfaces.push(WireInterface {
            name: egress.container_ifname.clone(),
            mac: applied.container_mac,
            sandbox: netns_path.display().to_string(),
            ..WireInterface::default()
        });
        result
            .to_json(self.version)
            .map_err(|e| SpecError::new(ErrorCode::InvalidNetworkConfig, e.to_string(), &e))
    }

    /// The kind on DEL: IPv4 `nodeIP` means IPv4 egress, anything else IPv6.
    fn del_kind(&self) -> plan::EgressKind {
        match self.node_ip {
            Some(IpAddr::V4(_)) => plan::EgressKind::V4,
            _ => plan::EgressKind::V6,
        }
    }

    fn del(&self) -> Result<(), SpecError> {
        self.ipam()?
            .del(self.stdin, self.version)
            .map_err(|e| SpecError::new(ErrorCode::Io, "running IPAM plugin failed", &e))?;
        let kind = self.del_kind();
        let (chain, comment) = self.chain_and_comment(kind);
        let mut sources = Vec::new();
        if let Some(path) = &self.env.netns
            && let Ok(pod) = apply::open_netns(path)
        {
            let rt = Self::runtime()?;
            let addrs = rt
                .block_on(apply::pod_addresses(&pod, kind.ifname()))
                .unwrap_or_default();
            sources = plan::snat_sources(kind, &addrs);
            rt.block_on(apply::delete_link(&pod, kind.ifname()))
                .map_err(|e| setup_error("delete egress interface", &e))?;
        }
        let iptables = apply::Iptables::find(kind, self.vars)
            .map_err(|e| SpecError::new(ErrorCode::Io, "iptables", &e))?;
        iptables
            .delete_chain(&chain, &comment, &sources)
            .map_err(|e| setup_error("failed to remove iptables chain", &e))
    }

    fn check(&self, prev: Option<&WireResult>) -> Result<(), SpecError> {
        let prev = prev.ok_or_else(|| {
            SpecError::msg(
                ErrorCode::InvalidNetworkConfig,
                "must be called as a chained plugin",
            )
        })?;
        let kind = plan::EgressKind::for_node_ip(self.node_ip)
            .map_err(|e| SpecError::new(ErrorCode::InvalidNetworkConfig, e.to_string(), &e))?;
        let mut drift = Vec::new();
        if !prev.interfaces.iter().any(|i| i.name == kind.ifname()) {
            drift.push(format!("prevResult has no {} interface", kind.ifname()));
        }
        let (_, pod) = self.pod_netns()?;
        let rt = Self::runtime()?;
        let addrs = rt
            .block_on(apply::pod_addresses(&pod, kind.ifname()))
            .map_err(|e| setup_error("read egress interface", &e))?;
        let sources = plan::snat_sources(kind, &addrs);
        match sources.first() {
            None => drift.push(format!("{} has no egress address", kind.ifname())),
            Some(src) => {
                let prefix = addrs
                    .iter()
                    .find(|a| a.addr() == *src)
                    .copied()
                    .unwrap_or_else(|| ipnet::IpNet::from(*src));
                drift.extend(
                    rt.block_on(apply::check_links(&pod, kind.ifname(), prefix))
                        .map_err(|e| setup_error("read egress interface", &e))?,
                );
                let iptables = apply::Iptables::find(kind, self.vars)
                    .map_err(|e| SpecError::new(ErrorCode::Io, "iptables", &e))?;
                let (chain, comment) = self.chain_and_comment(kind);
                let node_ip = self.node_ip.unwrap_or(*src);
                // The SNAT rule's flag depends on the iptables version; check the others.
                for rule in
                    plan::snat_rules(kind, node_ip, *src, &chain, &comment, plan::SnatRandom::Off)
                        .iter()
                        .filter(|r| !r.args.iter().any(|a| a == "SNAT"))
                {
                    if !iptables.has_rule(rule) {
                        drift.push(format!(
                            "missing nat rule {} {}",
                            rule.chain,
                            rule.args.join(" ")
                        ));
                    }
                }
                if !iptables.chain_exists(&chain).unwrap_or(false) {
                    drift.push(format!("missing nat chain {chain}"));
                }
            }
        }
        if drift.is_empty() {
            Ok(())
        } else {
            Err(SpecError::msg(ErrorCode::Drift, drift.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(command: &str) -> HashMap<String, String> {
        [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", "/var/run/netns/x"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn conf(version: &str, enabled: &str, prev: Option<serde_json::Value>) -> Vec<u8> {
        let mut c = serde_json::json!({"cniVersion": version, "name": "aws-cni", "type": "egress-cni",
            "mtu": "9001", "enabled": enabled, "nodeIP": "", "randomizeSNAT": "prng",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "fd00::ac:00/118"}]],
                     "routes": [{"dst": "::/0"}], "dataDir": "/run/cni/v4pd/egress-v6-ipam"},
            "pluginLogFile": "/var/log/aws-routed-eni/egress-v6-plugin.log", "pluginLogLevel": "DEBUG"});
        if let Some(p) = prev {
            c["prevResult"] = p;
        }
        serde_json::to_vec(&c).unwrap()
    }

    fn prev_v1(version: &str) -> serde_json::Value {
        serde_json::json!({"cniVersion": version,
            "interfaces": [{"name": "eni1"}, {"name": "eth0", "sandbox": "/var/run/netns/x"}],
            "ips": [{"address": "198.18.0.5/32", "gateway": "169.254.1.1", "interface": 1}],
            "dns": {}})
    }

    /// Disabled: ADD prints prevResult in the configuration's version (upstream:
    /// types.PrintResult(current.GetResult(prevResult), conf.CNIVersion)); DEL and CHECK print
    /// nothing and succeed (cmdCheck is nil in upstream's skel.PluginMain call).
    #[test]
    fn disabled_passes_prev_result_through() {
        for version in ["1.1.0", "1.0.0"] {
            let out = run(
                &vars("ADD"),
                &conf(version, "false", Some(prev_v1(version))),
            );
            assert_eq!(out.exit_code, 0, "{out:?}");
            let got: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
            let mut want = prev_v1(version);
            want.as_object_mut().unwrap().remove("dns"); // empty dns is dropped in 1.x
            assert_eq!(got, want);
        }
        let prev04 = serde_json::json!({"cniVersion": "0.4.0", "interfaces": [{"name": "eth0"}],
            "ips": [{"version": "4", "address": "198.18.0.5/32", "interface": 0}], "dns": {}});
        let out = run(&vars("ADD"), &conf("0.4.0", "false", Some(prev04.clone())));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap(),
            prev04
        );
        let prev02 =
            serde_json::json!({"cniVersion": "0.2.0", "ip4": {"ip": "198.18.0.5/32"}, "dns": {}});
        let out = run(&vars("ADD"), &conf("0.2.0", "false", Some(prev02.clone())));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap(),
            prev02
        );
        // Anything but exactly "true" is disabled, as upstream's `Enabled != "true"`.
        let out = run(&vars("ADD"), &conf("1.0.0", "True", Some(prev_v1("1.0.0"))));
        assert_eq!(out.exit_code, 0, "{out:?}");
        for cmd in ["DEL", "CHECK"] {
            let out = run(&vars(cmd), &conf("1.0.0", "false", Some(prev_v1("1.0.0"))));
            assert_eq!((out.exit_code, out.stdout.as_str()), (0, ""), "{cmd}");
        }
        let out = run(&vars("VERSION"), b"");
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), 7);
    }

    /// Enabled without what it needs: spec errors, before anything is created.
    #[test]
    fn enabled_refusals_are_spec_errors() {
        // No global node IPv6 (empty nodeIP picks IPv6 egress, as upstream).
        let out = run(&vars("ADD"), &conf("1.0.0", "true", Some(prev_v1("1.0.0"))));
        assert_eq!(out.exit_code, 1);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["code"], 7);
        assert_eq!(v["cniVersion"], "1.0.0");
        assert!(
            v["msg"].as_str().unwrap().contains("global unicast IPv6"),
            "{v}"
        );
        // No IPAM type.
        let mut c: serde_json::Value =
            serde_json::from_slice(&conf("1.0.0", "true", Some(prev_v1("1.0.0")))).unwrap();
        c["nodeIP"] = "198.18.0.10".into();
        c["ipam"] = serde_json::json!({});
        let out = run(&vars("ADD"), &serde_json::to_vec(&c).unwrap());
        assert_eq!(out.exit_code, 1);
        assert!(out.stdout.contains("IPAM"), "{out:?}");
        // host-local not in CNI_PATH: DEL fails as upstream ("running IPAM plugin failed").
        let mut v = vars("DEL");
        v.insert("CNI_PATH".into(), "/nonexistent".into());
        let out = run(&v, &conf("1.0.0", "true", None));
        assert_eq!(out.exit_code, 1);
        assert!(out.stdout.contains("IPAM"), "{out:?}");
    }

    /// Upstream's refusals before `enabled` is looked at: no prevResult on ADD ("must be called
    /// as a chained plugin"), an MTU that is not an integer, CHECK below 0.4.0.
    #[test]
    fn refusals_as_upstream() {
        let out = run(&vars("ADD"), &conf("1.0.0", "false", None));
        assert!(out.stdout.contains("chained plugin"), "{out:?}");
        let mut c: serde_json::Value =
            serde_json::from_slice(&conf("1.0.0", "false", Some(prev_v1("1.0.0")))).unwrap();
        c["mtu"] = "__MTU__".into();
        let out = run(&vars("ADD"), &serde_json::to_vec(&c).unwrap());
        assert_eq!(out.exit_code, 1);
        assert!(out.stdout.contains("MTU"), "{out:?}");
        let out = run(&vars("CHECK"), &conf("0.3.1", "false", None));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()["code"],
            1
        );
        let out = run(&vars("ADD"), &conf("0.9.0", "false", None));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()["code"],
            1
        );
    }
}
