//! The `aws-cni` CNI plugin library: spec types, commands, the pod network plan and its
//! application, the ipamd and network-policy agent clients. Must not: write stdout (only `main`
//! does), keep state on disk (the failure spool it appends to for ipamd is no state: never
//! read back, [`failure`]), link kube/aws.

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

/// Runs one CNI invocation: `vars` is the process environment, `stdin` the configuration.
pub fn run(vars: &HashMap<String, String>, stdin: &[u8]) -> Outcome {
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
