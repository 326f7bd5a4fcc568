//! The `CNI_*` environment contract: which variables each verb needs, `CNI_ARGS` (`K=V;...`,
//! including the K8S pod identity), and their validation. Parsed once from a map the caller
//! provides; nothing else reads the environment. Must not: read the process environment
//! itself (`main` hands it over), or decide what a verb does.

use std::collections::HashMap;
use std::path::PathBuf;

use dataplane::conventions::MAX_IFNAME_LEN;

/// The CNI verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `ADD`.
    Add,
    /// `DEL`.
    Del,
    /// `CHECK`.
    Check,
    /// `VERSION`.
    Version,
    /// `STATUS` (spec 1.1.0).
    Status,
    /// `GC` (spec 1.1.0).
    Gc,
}

impl Command {
    /// The `CNI_COMMAND` spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Add => "ADD",
            Self::Del => "DEL",
            Self::Check => "CHECK",
            Self::Version => "VERSION",
            Self::Status => "STATUS",
            Self::Gc => "GC",
        }
    }
}

/// Why the environment is refused (CNI error code 4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// `CNI_COMMAND` is missing.
    #[error("CNI_COMMAND is not set")]
    MissingCommand,
    /// `CNI_COMMAND` is not a known verb.
    #[error("unknown CNI_COMMAND {0:?}")]
    UnknownCommand(String),
    /// A variable this verb needs is missing or empty.
    #[error("{0} is required")]
    Missing(&'static str),
    /// A variable has an invalid value.
    #[error("invalid {var}: {reason}")]
    Invalid {
        /// Variable name.
        var: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// Pod identity from `CNI_ARGS`; all empty when the runtime passes none (`ctr run --cni`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct K8sArgs {
    /// `K8S_POD_NAME`.
    pub pod_name: String,
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: String,
    /// `K8S_POD_INFRA_CONTAINER_ID`.
    pub infra_container_id: String,
    /// `K8S_POD_UID`.
    pub pod_uid: String,
}

impl K8sArgs {
    /// Whether both pod name and namespace are known.
    #[must_use]
    pub fn has_pod(&self) -> bool {
        !self.pod_name.is_empty() && !self.pod_namespace.is_empty()
    }
}

/// The validated invocation environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    /// The verb.
    pub command: Command,
    /// `CNI_CONTAINERID` (empty for VERSION/STATUS/GC).
    pub container_id: String,
    /// `CNI_NETNS`; `None` when empty (allowed for DEL).
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME` (empty for VERSION/STATUS/GC).
    pub ifname: String,
    /// Parsed `CNI_ARGS`.
    pub k8s: K8sArgs,
}

impl CniEnv {
    /// Parses and validates the variables `command` needs.
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Self, EnvError> {
        let get = |k: &str| vars.get(k).map(String::as_str).unwrap_or_default();
        let command = match get("CNI_COMMAND") {
            "" => return Err(EnvError::MissingCommand),
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            other => return Err(EnvError::UnknownCommand(other.to_owned())),
        };
        let per_container = matches!(command, Command::Add | Command::Del | Command::Check);
        let mut env = Self {
            command,
            container_id: String::new(),
            netns: None,
            ifname: String::new(),
            k8s: K8sArgs::default(),
        };
        if !per_container {
            return Ok(env);
        }
        env.container_id = required(get("CNI_CONTAINERID"), "CNI_CONTAINERID")?;
        validate_container_id(&env.container_id)?;
        env.ifname = required(get("CNI_IFNAME"), "CNI_IFNAME")?;
        validate_ifname(&env.ifname)?;
        let netns = get("CNI_NETNS");
        if netns.is_empty() {
            if command != Command::Del {
                return Err(EnvError::Missing("CNI_NETNS"));
            }
        } else {
            if !netns.starts_with('/') {
                return Err(EnvError::Invalid {
                    var: "CNI_NETNS",
                    reason: "must be an absolute path".into(),
                });
            }
            env.netns = Some(PathBuf::from(netns));
        }
        env.k8s = parse_cni_args(get("CNI_ARGS"))?;
        Ok(env)
    }
}

fn required(v: &str, var: &'static str) -> Result<String, EnvError> {
    if v.is_empty() {
        Err(EnvError::Missing(var))
    } else {
        Ok(v.to_owned())
    }
}

fn validate_container_id(id: &str) -> Result<(), EnvError> {
    let ok = id.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(EnvError::Invalid {
            var: "CNI_CONTAINERID",
            reason: "must start alphanumeric and contain only [A-Za-z0-9_.-]".into(),
        })
    }
}

fn validate_ifname(name: &str) -> Result<(), EnvError> {
    let reason = if name.len() > MAX_IFNAME_LEN {
        "longer than 15 bytes"
    } else if name == "." || name == ".." {
        "reserved name"
    } else if name
        .bytes()
        .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b.is_ascii_control())
    {
        "contains '/', ':', whitespace or control characters"
    } else {
        return Ok(());
    };
    Err(EnvError::Invalid {
        var: "CNI_IFNAME",
        reason: reason.into(),
    })
}

/// Parses `CNI_ARGS` (`K=V;K=V`). Unknown keys are ignored (runtimes add their own, such as
/// `IgnoreUnknown`); a pair without `=` is an error.
pub fn parse_cni_args(raw: &str) -> Result<K8sArgs, EnvError> {
    let mut args = K8sArgs::default();
    for pair in raw.split(';').filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(EnvError::Invalid {
                var: "CNI_ARGS",
                reason: format!("{pair:?} is not KEY=VALUE"),
            });
        };
        match k {
            "K8S_POD_NAME" => v.clone_into(&mut args.pod_name),
            "K8S_POD_NAMESPACE" => v.clone_into(&mut args.pod_namespace),
            "K8S_POD_INFRA_CONTAINER_ID" => v.clone_into(&mut args.infra_container_id),
            "K8S_POD_UID" => v.clone_into(&mut args.pod_uid),
            _ => {}
        }
    }
    Ok(args)
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

    #[test]
    fn add_needs_netns_del_does_not() {
        let base = [
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns",
            ),
        ];
        let mut v = vars(&base);
        v.insert("CNI_COMMAND".into(), "ADD".into());
        assert_eq!(CniEnv::from_vars(&v), Err(EnvError::Missing("CNI_NETNS")));
        v.insert("CNI_COMMAND".into(), "DEL".into());
        let env = CniEnv::from_vars(&v).unwrap();
        assert_eq!(env.netns, None);
        assert_eq!(env.k8s.pod_name, "p");
        assert!(env.k8s.has_pod());
    }

    #[test]
    fn version_needs_nothing_else() {
        let env = CniEnv::from_vars(&vars(&[("CNI_COMMAND", "VERSION")])).unwrap();
        assert_eq!(env.command, Command::Version);
    }

    #[test]
    fn rejects_bad_values() {
        let mk = |id: &str, ifname: &str, args: &str| {
            CniEnv::from_vars(&vars(&[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", id),
                ("CNI_IFNAME", ifname),
                ("CNI_NETNS", "/var/run/netns/x"),
                ("CNI_ARGS", args),
            ]))
        };
        assert!(mk("abc", "eth0", "").is_ok());
        assert!(mk("-abc", "eth0", "").is_err());
        assert!(mk("a b", "eth0", "").is_err());
        assert!(mk("abc", "a/b", "").is_err());
        assert!(mk("abc", "0123456789abcdef", "").is_err());
        assert!(mk("abc", "eth0", "novalue").is_err());
        assert_eq!(
            CniEnv::from_vars(&vars(&[("CNI_COMMAND", "FOO")])),
            Err(EnvError::UnknownCommand("FOO".into()))
        );
    }
}
