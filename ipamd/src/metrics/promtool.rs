//! Test support: runs Debian's `promtool check metrics` over an exposition text, for ipamd's
//! own unit tests and the integration suites that scrape a live ipamd. Not in the shipped
//! daemon (feature `fake`); it must not know which metrics exist.

use std::io::Write;
use std::process::{Command, Stdio};

/// `promtool check metrics` on `text`: (exit code, its findings on stdout and stderr).
///
/// # Panics
/// When `promtool` is not installed (`integration/test.sh` installs it).
pub fn check(text: &str) -> (Option<i32>, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed (integration/test.sh)");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(text.as_bytes())
        .expect("promtool reads its stdin");
    let out = child.wait_with_output().expect("promtool runs");
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), findings)
}
