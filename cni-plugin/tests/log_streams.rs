//! `pluginLogFile` naming a stream: the built `aws-cni` and `egress-cni` binaries write their
//! log lines to that stream and create no file named so, as upstream's plugin logger does
//! (pkg/utils/logger/zaplogger.go v1.23.1 `getPluginLogFilePath`, L139-151: `stderr` (any case)
//! → os.Stderr, `stdout` (any case) → os.Stdout, anything else a lumberjack file). Each run uses
//! a verb that touches no kernel state (STATUS against a socket that does not exist; egress-cni
//! DEL while disabled) with a temporary directory as its working directory, where a relative
//! file named `stderr`/`stdout` would have appeared.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn exec(bin: &str, cwd: &Path, command: &str, conf: &serde_json::Value) -> Output {
    let mut child = Command::new(bin)
        .current_dir(cwd)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "log-streams")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_NETNS", cwd.join("no-such-netns"))
        .env("CNI_PATH", cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the plugin");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(conf.to_string().as_bytes())
        .expect("write the configuration");
    child.wait_with_output().expect("plugin output")
}

/// The JSON log lines of `text` (zap's shape: `level`, `ts`, `msg`), skipping anything else.
fn log_lines(text: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("level").is_some() && v.get("ts").is_some() && v.get("msg").is_some())
        .collect()
}

fn no_stream_files(dir: &Path) {
    let names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the working directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    for stream in ["stderr", "stdout", "STDERR", "Stdout"] {
        assert!(
            !names.iter().any(|n| n == stream),
            "a file named {stream}: {names:?}"
        );
    }
}

fn aws_cni_conf(dir: &Path, log: &str) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.1.0", "name": "aws-cni", "type": "aws-cni",
        "pluginLogFile": log, "pluginLogLevel": "Debug",
        "ipamdSocket": dir.join("no-ipamd.sock"),
    })
}

#[test]
fn aws_cni_logs_to_stderr_when_named_stderr() {
    for name in ["stderr", "STDERR"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = exec(
            env!("CARGO_BIN_EXE_aws-cni"),
            dir.path(),
            "STATUS",
            &aws_cni_conf(dir.path(), name),
        );
        // ipamd unreachable: error 50 on stdout, alone
        assert_ne!(out.status.code(), Some(0));
        let result: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("stdout is the error alone");
        assert_eq!(result["code"], 50, "{result}");
        let lines = log_lines(&out.stderr);
        assert!(
            lines.iter().any(|l| l["level"] == "error"),
            "{name}: stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        no_stream_files(dir.path());
    }
}

/// Issue 39: an empty or absent `pluginLogFile` is stderr, as upstream's
/// `getPluginLogFilePath` (`logFilePath == ""` → os.Stderr); before, it logged nothing.
#[test]
fn aws_cni_logs_to_stderr_when_the_log_file_is_empty_or_absent() {
    for conf in ["", "absent"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut c = aws_cni_conf(dir.path(), conf);
        if conf == "absent" {
            c.as_object_mut().expect("object").remove("pluginLogFile");
        }
        let out = exec(env!("CARGO_BIN_EXE_aws-cni"), dir.path(), "STATUS", &c);
        assert_ne!(out.status.code(), Some(0));
        let result: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("stdout is the error alone");
        assert_eq!(result["code"], 50, "{result}");
        assert!(
            log_lines(&out.stderr).iter().any(|l| l["level"] == "error"),
            "{conf:?}: stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        no_stream_files(dir.path());
    }
}

#[test]
fn aws_cni_logs_to_stdout_before_the_result_when_named_stdout() {
    // Upstream's plugin writes its lines to stdout ahead of the result (which a runtime then
    // cannot parse; upstream's entrypoint and ipamd here refuse AWS_VPC_K8S_PLUGIN_LOG_FILE=stdout).
    for name in ["stdout", "Stdout"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = exec(
            env!("CARGO_BIN_EXE_aws-cni"),
            dir.path(),
            "STATUS",
            &aws_cni_conf(dir.path(), name),
        );
        assert_ne!(out.status.code(), Some(0));
        let text = String::from_utf8_lossy(&out.stdout);
        let lines = log_lines(&out.stdout);
        assert!(
            lines.iter().any(|l| l["level"] == "error"),
            "{name}: stdout {text:?}"
        );
        let last: serde_json::Value =
            serde_json::from_str(text.lines().last().expect("a last line"))
                .expect("the result is the last line");
        assert_eq!(last["code"], 50, "{text}");
        assert!(
            log_lines(&out.stderr).is_empty(),
            "{name}: stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        no_stream_files(dir.path());
    }
}

#[test]
fn egress_cni_logs_to_the_named_stream() {
    for (name, on_stdout) in [("stderr", false), ("stdout", true)] {
        let dir = tempfile::tempdir().expect("temp dir");
        let conf = serde_json::json!({
            "cniVersion": "1.0.0", "name": "aws-cni", "type": "egress-cni", "enabled": "false",
            "pluginLogFile": name, "pluginLogLevel": "DEBUG",
        });
        let out = exec(env!("CARGO_BIN_EXE_egress-cni"), dir.path(), "DEL", &conf);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let (logged, other) = if on_stdout {
            (&out.stdout, &out.stderr)
        } else {
            (&out.stderr, &out.stdout)
        };
        assert!(!log_lines(logged).is_empty(), "{name}: {out:?}");
        assert!(log_lines(other).is_empty(), "{name}: {out:?}");
        no_stream_files(dir.path());
    }
}
