//! Running the host's firewall tools (`iptables-save`, `iptables-restore`, `iptables --version`,
//! `nft`) as child processes, optionally behind a namespace prefix such as
//! `ip netns exec <ns>` so tests can aim them at a throwaway namespace. Owns process spawning
//! only; must not decide which rules exist.

use std::fmt;
use std::io::Write;
use std::process::{Command, Stdio};

/// A command that could not be run or exited non-zero.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The program could not be started (missing binary, no permission).
    #[error("spawn {program}")]
    Spawn {
        /// Program name.
        program: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The program ran and failed.
    #[error("{command} exited with {status}: {stderr}")]
    Failed {
        /// The full command line.
        command: String,
        /// Exit status as printed by the OS.
        status: String,
        /// Trimmed standard error.
        stderr: String,
    },
}

impl CommandError {
    /// Whether the program does not exist on this host.
    #[must_use]
    pub fn is_missing_program(&self) -> bool {
        matches!(self, Self::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// Runs host programs. Blocking: call from a blocking thread, never a runtime worker.
pub trait CommandRunner: fmt::Debug + Send + Sync {
    /// Runs `program args...`, feeding `stdin` if given, and returns standard output.
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, CommandError>;
}

/// Runs programs directly (in the caller's namespace) or behind a fixed prefix such as
/// `ip netns exec <ns>`.
#[derive(Debug, Clone, Default)]
pub struct Exec {
    prefix: Vec<String>,
}

impl Exec {
    /// Programs run in this process's own network namespace (production: ipamd already runs
    /// inside the node's namespace).
    #[must_use]
    pub fn current() -> Self {
        Self::default()
    }

    /// Programs run inside the named namespace via `ip netns exec <name>`.
    #[must_use]
    pub fn in_netns(name: &str) -> Self {
        Self {
            prefix: vec!["ip".into(), "netns".into(), "exec".into(), name.into()],
        }
    }
}

impl CommandRunner for Exec {
    fn run(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, CommandError> {
        let mut argv: Vec<&str> = self.prefix.iter().map(String::as_str).collect();
        argv.push(program);
        argv.extend_from_slice(args);
        let command_line = argv.join(" ");
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawn_err = |source| CommandError::Spawn {
            program: argv[0].to_owned(),
            source,
        };
        let mut child = cmd.spawn().map_err(spawn_err)?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A write error shows up as a failed exit status below.
            let _ = pipe.write_all(input.as_bytes());
        }
        let out = child.wait_with_output().map_err(spawn_err)?;
        if !out.status.success() {
            return Err(CommandError::Failed {
                command: command_line,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
