//! Property tests: whatever the runtime passes on stdin and in `CNI_*`, the plugin never
//! panics and answers malformed input with a spec-shaped error (right code, non-zero exit).
//! Every generated case fails validation before any kernel or ipamd call, so these run
//! without privileges and change nothing.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};

use proptest::prelude::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn valid_env(command: &str) -> HashMap<String, String> {
    env(&[
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_NETNS", "/var/run/netns/does-not-exist-cnit"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns",
        ),
        ("CNI_PATH", "/opt/cni/bin"),
    ])
}

/// Asserts a spec-shaped error with `code`, and returns it.
fn assert_error(out: &aws_cni::Outcome, code: u64) -> serde_json::Value {
    assert_ne!(out.exit_code, 0, "{out:?}");
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("error is JSON");
    assert_eq!(v["code"].as_u64(), Some(code), "{v}");
    assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v["cniVersion"].as_str().is_some(), "{v}");
    v
}

const COMMANDS: [&str; 5] = ["ADD", "DEL", "CHECK", "STATUS", "GC"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary bytes on stdin never decode into a configuration: code 6 (or 7 when they
    /// happen to be JSON of the wrong shape), never a panic.
    #[test]
    fn arbitrary_stdin_is_rejected(stdin in proptest::collection::vec(any::<u8>(), 0..256),
                                   cmd in 0..COMMANDS.len()) {
        let out = aws_cni::run(&valid_env(COMMANDS[cmd]), &stdin);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
        let code = v["code"].as_u64().unwrap();
        prop_assert!(out.exit_code != 0);
        prop_assert!([1, 6, 7].contains(&code), "code {}", code);
    }

    /// Arbitrary JSON objects without a valid name/version are invalid configurations.
    #[test]
    fn arbitrary_json_objects_are_rejected(
        fields in proptest::collection::btree_map("[a-zA-Z]{1,12}", "[ -~]{0,16}", 0..6),
        cmd in 0..COMMANDS.len(),
    ) {
        let obj: serde_json::Map<String, serde_json::Value> = fields
            .into_iter()
            .filter(|(k, _)| k != "name")
            .map(|(k, v)| (k, serde_json::Value::String(v)))
            .collect();
        let stdin = serde_json::Value::Object(obj).to_string();
        let out = aws_cni::run(&valid_env(COMMANDS[cmd]), stdin.as_bytes());
        let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
        prop_assert!(out.exit_code != 0);
        prop_assert!([1, 6, 7].contains(&v["code"].as_u64().unwrap()));
    }

    /// Broken environments are code 4 whatever stdin says.
    #[test]
    fn broken_env_is_code_4(
        which in 0..6_usize,
        junk in "[ -~]{0,20}",
        stdin in "[ -~]{0,40}",
    ) {
        let mut vars = valid_env("ADD");
        match which {
            0 => { vars.remove("CNI_COMMAND"); }
            1 => { vars.insert("CNI_COMMAND".into(), format!("X{junk}")); }
            2 => { vars.remove("CNI_CONTAINERID"); }
            3 => { vars.insert("CNI_IFNAME".into(), format!("{junk}/toolong-interface")); }
            4 => { vars.remove("CNI_NETNS"); }
            _ => { vars.insert("CNI_ARGS".into(), format!("K8S_POD_NAME{}", junk.replace(['=', ';'], ""))); }
        }
        let out = aws_cni::run(&vars, stdin.as_bytes());
        assert_error(&out, 4);
    }

    /// VERSION answers whatever stdin holds.
    #[test]
    fn version_always_answers(stdin in proptest::collection::vec(any::<u8>(), 0..64)) {
        let out = aws_cni::run(&env(&[("CNI_COMMAND", "VERSION")]), &stdin);
        prop_assert_eq!(out.exit_code, 0);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        prop_assert!(v["supportedVersions"].as_array().unwrap().len() == 7);
    }
}

#[test]
fn each_invalid_field_has_its_code() {
    let base = r#""cniVersion":"1.0.0","name":"aws-cni""#;
    for (stdin, code) in [
        (format!(r#"{{{base},"mtu":"nine"}}"#), 7),
        (format!(r#"{{{base},"mtu":70000}}"#), 7),
        (format!(r#"{{{base},"mtu":true}}"#), 6),
        (format!(r#"{{{base},"vethPrefix":"toolong"}}"#), 7),
        (format!(r#"{{{base},"vethPrefix":"eth"}}"#), 7),
        (format!(r#"{{{base},"podSGEnforcingMode":"loose"}}"#), 7),
        (format!(r#"{{{base},"pluginLogLevel":"chatty"}}"#), 7),
        (
            format!(r#"{{{base},"prevResult":{{"ips":[{{"address":"nope"}}]}}}}"#),
            7,
        ),
        (r#"{"cniVersion":"0.5.0","name":"aws-cni"}"#.to_owned(), 1),
        (r#"{"cniVersion":"1.0.0"}"#.to_owned(), 7),
        ("[]".to_owned(), 6),
        (String::new(), 6),
    ] {
        let out = aws_cni::run(&valid_env("ADD"), stdin.as_bytes());
        assert_error(&out, code);
    }
    // Errors answer in the caller's version when it is readable.
    let out = aws_cni::run(
        &valid_env("ADD"),
        br#"{"cniVersion":"0.4.0","name":"n","mtu":"x"}"#,
    );
    assert_eq!(assert_error(&out, 7)["cniVersion"], "0.4.0");
}

/// Verbs a configuration's version does not allow are refused with code 1 before anything
/// else, as the CNI library's skel does (pkg/skel/skel.go: CHECK needs 0.4.0, STATUS and GC
/// 1.1.0); a configuration without cniVersion is 0.1.0 and goes on to ADD (here: the netns
/// does not exist, code 3).
#[test]
fn verbs_gated_by_config_version() {
    for (version, command, code) in [
        ("0.3.1", "CHECK", Some(1)),
        ("0.2.0", "CHECK", Some(1)),
        ("1.0.0", "STATUS", Some(1)),
        ("1.0.0", "GC", Some(1)),
        ("0.4.0", "GC", Some(1)),
        ("1.1.0", "GC", None),
    ] {
        let conf = format!(
            r#"{{"cniVersion":"{version}","name":"aws-cni","ipamdSocket":"/nonexistent/cnit.sock"}}"#
        );
        let out = aws_cni::run(&valid_env(command), conf.as_bytes());
        match code {
            Some(code) => {
                let v = assert_error(&out, code);
                assert_eq!(v["cniVersion"], version);
            }
            None => assert_eq!(out.exit_code, 0, "{version} {command}: {out:?}"),
        }
    }
    let out = aws_cni::run(
        &valid_env("ADD"),
        br#"{"name":"aws-cni","ipamdSocket":"/nonexistent/cnit.sock"}"#,
    );
    assert_eq!(assert_error(&out, 3)["cniVersion"], "0.1.0");
}

#[test]
fn check_without_prev_result_and_add_without_netns_are_refused() {
    let conf = br#"{"cniVersion":"1.0.0","name":"aws-cni","ipamdSocket":"/nonexistent/cnit.sock"}"#;
    let out = aws_cni::run(&valid_env("CHECK"), conf);
    assert_error(&out, 7);
    // The pod netns does not exist: container unknown, before ipamd is asked.
    let out = aws_cni::run(&valid_env("ADD"), conf);
    assert_error(&out, 3);
}

#[test]
fn binary_writes_only_the_error_to_stdout_and_exits_non_zero() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aws-cni"))
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "abc")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_NETNS", "/var/run/netns/x")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"{not json").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], 6);
    assert!(out.stderr.is_empty());

    let out = Command::new(env!("CARGO_BIN_EXE_aws-cni"))
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["supportedVersions"][6], "1.1.0");
}
