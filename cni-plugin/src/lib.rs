//! The `aws-cni` CNI plugin library: spec types, commands, ipamd's allocation, the pod network
//! plan and its application, the ipamd and network-policy agent clients. Must not: write stdout (only `main`
//! does), keep state on disk (the failure spool it appends to for ipamd is no state: never
//! read back, [`failure`]), link kube/aws.

pub mod allocation;
pub mod apply;
pub mod command;
pub mod conflist;
pub mod egress;
pub mod failure;
pub mod ipam;
mod logging;
pub mod plan;
pub mod pod_lock;
pub mod policy;
pub mod setup_timings;
pub mod spec;
pub mod uds;

use std::collections::HashMap;

use spec::netconf::sniff_version;
use spec::{CniEnv, CniVersion, Command, ErrorCode, NetConf, NetConfError, SpecError};

/// What `main` writes to stdout and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Result or error JSON; empty for verbs without output.
    pub stdout: String,
    /// 0 on success.
    pub exit_code: i32,
}

impl Outcome {
    fn error(err: &SpecError, version: CniVersion) -> Self {
        Self {
            stdout: err.to_json(version.as_str()),
            exit_code: 1,
        }
    }
}

/// When [`run`] began (the ADD's phase log counts from it).
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// When this process's [`run`] began (now, if it has not).
pub(crate) fn started() -> std::time::Instant {
    *STARTED.get_or_init(std::time::Instant::now)
}

/// Runs one CNI invocation: `vars` is the process environment, `stdin` the configuration.
pub fn run(vars: &HashMap<String, String>, stdin: &[u8]) -> Outcome {
    started();
    let version = sniff_version(stdin).unwrap_or(CniVersion::LATEST);
    let env = match CniEnv::from_vars(vars) {
        Ok(env) => env,
        Err(e) => {
            return Outcome::error(
                &SpecError::new(ErrorCode::InvalidEnvironment, e.to_string(), &e),
                version,
            );
        }
    };
    if env.command == Command::Version {
        return Outcome {
            stdout: spec::result::version_json(version),
            exit_code: 0,
        };
    }
    let conf = match NetConf::parse(stdin) {
        Ok(conf) => conf,
        Err(e) => {
            let code = match e {
                NetConfError::Decode(_) => ErrorCode::Decode,
                NetConfError::UnsupportedVersion(_) => ErrorCode::IncompatibleVersion,
                _ => ErrorCode::InvalidNetworkConfig,
            };
            return Outcome::error(&SpecError::new(code, e.to_string(), &e), version);
        }
    };
    if !conf.cni_version.allows(env.command) {
        // skel's answer: CHECK needs 0.4.0, STATUS and GC need 1.1.0.
        return Outcome::error(
            &SpecError::msg(
                ErrorCode::IncompatibleVersion,
                format!("config version does not allow {}", env.command.as_str()),
            ),
            conf.cni_version,
        );
    }
    let _log = logging::init(&conf);
    let span = tracing::info_span!(
        "cni",
        command = ?env.command,
        container_id = %env.container_id,
        ifname = %env.ifname,
        pod = %env.k8s.pod_name,
        namespace = %env.k8s.pod_namespace,
    );
    let _entered = span.enter();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return Outcome::error(&SpecError::new(ErrorCode::Io, "start runtime", &e), version);
        }
    };
    match runtime.block_on(command::dispatch(&env, &conf)) {
        Ok(out) => {
            tracing::debug!("done");
            Outcome {
                stdout: out.unwrap_or_default(),
                exit_code: 0,
            }
        }
        Err(e) => {
            tracing::error!(code = e.code.code(), msg = %e.msg, details = %e.details, "failed");
            Outcome::error(&e, conf.cni_version)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn add_env() -> HashMap<String, String> {
        vars(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/var/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ])
    }

    fn code(o: &Outcome) -> (u64, String) {
        let j: serde_json::Value = serde_json::from_str(&o.stdout).expect("error JSON");
        (
            j["code"].as_u64().unwrap_or(0),
            j["cniVersion"].as_str().unwrap_or("").to_owned(),
        )
    }

    /// Errors carry the CNI spec's codes (upstream answers 999 for everything) and the
    /// configuration's `cniVersion`: invalid environment 4, undecodable configuration 6,
    /// invalid configuration 7.
    #[test]
    fn errors_carry_the_specs_codes_and_the_config_version() {
        let o = run(&vars(&[]), br#"{"cniVersion":"0.4.0"}"#);
        assert_eq!((o.exit_code, code(&o).0), (1, 4), "{o:?}");
        let o = run(&add_env(), b"not json");
        assert_eq!(code(&o).0, 6, "{o:?}");
        let o = run(&add_env(), br#"{"cniVersion":"0.4.0","type":"aws-cni"}"#);
        assert_eq!(code(&o), (7, "0.4.0".to_owned()), "{o:?}");
    }

    /// VERSION echoes the requested `cniVersion` (upstream prints 1.1.0); runtimes read only
    /// `supportedVersions`.
    #[test]
    fn version_echoes_the_requested_version() {
        let o = run(
            &vars(&[("CNI_COMMAND", "VERSION")]),
            br#"{"cniVersion":"0.4.0"}"#,
        );
        let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
        assert_eq!(j["cniVersion"], "0.4.0", "{j}");
        assert!(
            j["supportedVersions"]
                .as_array()
                .is_some_and(|v| v.iter().any(|x| x == "1.1.0"))
        );
    }
}
