//! `egress-cni`, the stand-in for upstream's egress plugin (cmd/egress-cni-plugin) until pod
//! IPv6 egress (IPv4 clusters) and IPv4 egress (IPv6 clusters) land (issue 11). It exists so
//! that upstream's chain (aws-cni, egress-cni, portmap; misc/10-aws.conflist) works as is.
//! Disabled (`enabled` is anything but "true", upstream's test), it does what upstream's does:
//! ADD hands `prevResult` on in the configuration's version, DEL and CHECK succeed silently.
//! Enabled, ADD fails with a spec-shaped error saying egress is not implemented; DEL succeeds,
//! since this plugin never set anything up. Must not: touch the network, call IPAM, write stdout
//! (its `main` does).

use std::collections::HashMap;
use std::net::IpAddr;

use serde::Deserialize;

use crate::Outcome;
use crate::spec::netconf::sniff_version;
use crate::spec::result::WireResult;
use crate::spec::{CniEnv, CniVersion, Command, ErrorCode, SpecError};

/// The fields of upstream's egress NetConf (cmd/egress-cni-plugin/netconf.go) this stand-in
/// reads; all strings there, so a number is a decoding error, as in Go.
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
}

/// Runs one invocation: `vars` is the process environment, `stdin` the configuration.
pub fn run(vars: &HashMap<String, String>, stdin: &[u8]) -> Outcome {
    let version = sniff_version(stdin).unwrap_or(CniVersion::LATEST);
    match invoke(vars, stdin) {
        Ok(stdout) => Outcome {
            stdout,
            exit_code: 0,
        },
        Err((e, v)) => Outcome {
            stdout: e.to_json(v.unwrap_or(version).as_str()),
            exit_code: 1,
        },
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
    let prev = match wire.prev_result {
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
    match env.command {
        Command::Add => {
            let prev = prev.ok_or_else(|| {
                fail(
                    ErrorCode::InvalidNetworkConfig,
                    "must be called as a chained plugin".into(),
                )
            })?;
            // Upstream parses the MTU before looking at `enabled`.
            wire.mtu.parse::<i64>().map_err(|_| {
                fail(
                    ErrorCode::InvalidNetworkConfig,
                    format!("failed to parse MTU: {:?}", wire.mtu),
                )
            })?;
            if enabled {
                return Err(fail(
                    ErrorCode::UnsupportedField,
                    "egress-cni: pod egress over the other IP family (ENABLE_V6_EGRESS / \
                     ENABLE_V4_EGRESS) is not implemented yet; set it to false"
                        .into(),
                ));
            }
            prev.to_json(version)
                .map_err(|e| fail(ErrorCode::InvalidNetworkConfig, e.to_string()))
        }
        Command::Del | Command::Check | Command::Status | Command::Gc | Command::Version => {
            Ok(String::new())
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

    #[test]
    fn enabled_add_is_a_spec_error_and_del_succeeds() {
        let out = run(&vars("ADD"), &conf("1.0.0", "true", Some(prev_v1("1.0.0"))));
        assert_eq!(out.exit_code, 1);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["code"], 2);
        assert_eq!(v["cniVersion"], "1.0.0");
        assert!(
            v["msg"].as_str().unwrap().contains("not implemented"),
            "{v}"
        );
        let out = run(&vars("DEL"), &conf("1.0.0", "true", None));
        assert_eq!((out.exit_code, out.stdout.as_str()), (0, ""));
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
