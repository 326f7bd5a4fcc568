//! Running `ip`, `sysctl` and `iptables-restore` against the simulator's own namespaces, and
//! reading their JSON back. Must not run anything without a namespace (the root netns is
//! never touched).

use std::io::Write;
use std::process::{Command, Stdio};

/// A command against one of our namespaces failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The program could not be started.
    #[error("spawn {program}: {source}")]
    Spawn {
        /// program name
        program: String,
        /// cause
        source: std::io::Error,
    },
    /// The program exited non-zero.
    #[error("`{command}` failed: {stderr}")]
    Failed {
        /// the command line
        command: String,
        /// its stderr, trimmed
        stderr: String,
    },
    /// Its output was not what we parse.
    #[error("unexpected output of `{command}`: {reason}")]
    Output {
        /// the command line
        command: String,
        /// what was wrong
        reason: String,
    },
}

impl ExecError {
    /// The object did not exist (used to make deletes idempotent).
    pub fn is_missing(&self) -> bool {
        match self {
            Self::Failed { stderr, .. } => {
                // iproute2's messages for ENODEV / ESRCH / ENOENT / EADDRNOTAVAIL
                [
                    "Cannot find device",
                    "No such process",
                    "No such file",
                    "Cannot assign requested",
                ]
                .iter()
                .any(|m| stderr.contains(m))
            }
            _ => false,
        }
    }
}

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ExecError> {
    run_command(Command::new(program), None, program, args, stdin)
}

/// `program args` inside namespace `ns`, entered as `ip netns exec` enters it but without its
/// process (`crate::netns_exec`).
fn run_in(
    ns: &str,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, ExecError> {
    run_command(
        crate::netns_exec::command_in(ns, program),
        Some(ns),
        program,
        args,
        stdin,
    )
}

fn run_command(
    mut cmd: Command,
    ns: Option<&str>,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, ExecError> {
    let command = match ns {
        Some(ns) => format!("(in netns {ns}) {program} {}", args.join(" ")),
        None => format!("{program} {}", args.join(" ")),
    };
    let mut child = cmd
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| ExecError::Spawn {
            program: program.to_owned(),
            source,
        })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(|source| ExecError::Spawn {
                program: program.to_owned(),
                source,
            })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| ExecError::Spawn {
            program: program.to_owned(),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ExecError::Failed {
            command,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// `ip -n <ns> <args>`.
pub fn ip(ns: &str, args: &[&str]) -> Result<String, ExecError> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    run("ip", &all, None)
}

/// `ip -n <ns> -j <args>`, parsed.
pub fn ip_json(ns: &str, args: &[&str]) -> Result<serde_json::Value, ExecError> {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    let out = ip(ns, &all)?;
    if out.trim().is_empty() {
        return Ok(serde_json::Value::Array(Vec::new()));
    }
    serde_json::from_str(&out).map_err(|e| ExecError::Output {
        command: format!("ip -n {ns} -j {}", args.join(" ")),
        reason: e.to_string(),
    })
}

/// `ip -n <ns> -j <flags> -batch -` with `commands` (one per line, without `ip` and without
/// options: a batch line cannot carry `-6` or `-d`, so `flags` apply to all), parsed: one JSON
/// array per command, in order. One process for what would be `N`: under the test VM's TCG
/// every `ip` start-up costs ~0.12 CPU-seconds (docs/testing.md).
pub fn ip_json_batch<const N: usize>(
    ns: &str,
    flags: &[&str],
    commands: [&str; N],
) -> Result<[serde_json::Value; N], ExecError> {
    let mut args = vec!["-n", ns, "-j"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["-batch", "-"]);
    let mut input = commands.join("\n");
    input.push('\n');
    let out = run("ip", &args, Some(&input))?;
    let describe = || format!("ip {} <<< {}", args.join(" "), commands.join("; "));
    let values = serde_json::Deserializer::from_str(&out)
        .into_iter::<serde_json::Value>()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ExecError::Output {
            command: describe(),
            reason: e.to_string(),
        })?;
    <[serde_json::Value; N]>::try_from(values).map_err(|v| ExecError::Output {
        command: describe(),
        reason: format!("{} JSON values for {N} commands", v.len()),
    })
}

/// `ip netns add <ns>`.
pub fn netns_add(ns: &str) -> Result<(), ExecError> {
    run("ip", &["netns", "add", ns], None).map(drop)
}

/// `ip netns del <ns>`; a missing namespace is not an error.
pub fn netns_del(ns: &str) -> Result<(), ExecError> {
    match run("ip", &["netns", "del", ns], None) {
        Err(e) if e.is_missing() => Ok(()),
        r => r.map(drop),
    }
}

/// Set sysctls inside `ns` (`key=value`).
pub fn sysctl(ns: &str, settings: &[&str]) -> Result<(), ExecError> {
    let mut args = vec!["-q", "-w"];
    args.extend_from_slice(settings);
    run_in(ns, "sysctl", &args, None).map(drop)
}

/// `iptables-save` inside `ns`.
pub fn iptables_save(ns: &str) -> Result<String, ExecError> {
    run_in(ns, "iptables-save", &[], None)
}

/// `iptables-restore` inside `ns` (replaces the tables present in `rules`).
pub fn iptables_restore(ns: &str, rules: &str) -> Result<(), ExecError> {
    run_in(ns, "iptables-restore", &[], Some(rules)).map(drop)
}

/// `iptables-save -c` inside `ns` (rules with their counters).
pub fn iptables_save_counters(ns: &str) -> Result<String, ExecError> {
    run_in(ns, "iptables-save", &["-c"], None)
}

/// `iptables-restore --counters` inside `ns` (rules may carry `[packets:bytes]`).
pub fn iptables_restore_counters(ns: &str, rules: &str) -> Result<(), ExecError> {
    run_in(ns, "iptables-restore", &["--counters"], Some(rules)).map(drop)
}

/// `ip6tables-save -c` inside `ns`.
pub fn ip6tables_save_counters(ns: &str) -> Result<String, ExecError> {
    run_in(ns, "ip6tables-save", &["-c"], None)
}

/// `ip6tables-restore --counters` inside `ns`.
pub fn ip6tables_restore_counters(ns: &str, rules: &str) -> Result<(), ExecError> {
    run_in(ns, "ip6tables-restore", &["--counters"], Some(rules)).map(drop)
}

/// `ip6tables-save` inside `ns`.
pub fn ip6tables_save(ns: &str) -> Result<String, ExecError> {
    run_in(ns, "ip6tables-save", &[], None)
}

/// `ip6tables-restore` inside `ns` (replaces the tables present in `rules`).
pub fn ip6tables_restore(ns: &str, rules: &str) -> Result<(), ExecError> {
    run_in(ns, "ip6tables-restore", &[], Some(rules)).map(drop)
}

/// Run any program inside `ns` (tests, diagnostics).
pub fn in_netns(ns: &str, program: &str, args: &[&str]) -> Result<String, ExecError> {
    run_in(ns, program, args, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace of this test's own, deleted on drop.
    struct Ns(String);

    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = netns_del(&self.0);
        }
    }

    #[test]
    fn a_batch_answers_each_command_in_order_and_fails_with_any() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP: needs root (a network namespace of its own)");
            return;
        }
        let ns = Ns(format!("vpcsim-batch-{}", std::process::id()));
        netns_add(&ns.0).expect("netns add");
        let values = ip_json_batch(&ns.0, &[], ["link show", "route show", "addr show dev lo"])
            .expect("batch");
        assert_eq!(values[0][0]["ifname"], "lo", "{values:?}");
        // an empty table is an empty array, not a missing value
        assert_eq!(values[1], serde_json::json!([]), "{values:?}");
        assert_eq!(values[2][0]["ifname"], "lo", "{values:?}");
        let v6 = ip_json_batch(&ns.0, &["-6"], ["route show"]).expect("-6 batch");
        assert_eq!(v6, [serde_json::json!([])]);
        assert!(matches!(
            ip_json_batch(&ns.0, &[], ["link show", "no-such-object"]),
            Err(ExecError::Failed { .. })
        ));
    }
}
