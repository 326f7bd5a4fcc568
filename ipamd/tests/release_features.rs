//! The shipped daemon carries no test double: the in-memory provider (`aws::memory`,
//! `IPAMD_ENI_PROVIDER=memory`) lives behind the cargo feature `memory-provider`, which only
//! dev-dependencies enable. This asks cargo how a normal (non-test) build of the workspace
//! resolves ipamd's features, without building anything. Must not: run a release build.

// Integration tests live at the top level of their own crate.
#![allow(clippy::tests_outside_test_module)]

use std::process::Command;

/// `cargo tree` over normal and build edges only (what `cargo build --release --workspace
/// --bins` resolves): ipamd is there, without `memory-provider` and the `fake` cloud under it.
#[test]
fn normal_build_has_no_memory_provider() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--manifest-path",
            manifest,
            "--workspace",
            "-e",
            "normal,build",
            "-i",
            "ipamd",
            "-f",
            "{p} [{f}]",
            "--prefix",
            "none",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let ipamd: Vec<&str> = text.lines().filter(|l| l.starts_with("ipamd ")).collect();
    assert!(!ipamd.is_empty(), "ipamd missing from the tree:\n{text}");
    for line in ipamd {
        assert!(
            !line.contains("memory-provider") && !line.contains("fake"),
            "a normal build enables the test-only provider or the fake cloud: {line}"
        );
    }
}

/// The same question with dev-dependencies: the test build does enable it (so the check
/// above can fail, and the tests that drive `IPAMD_ENI_PROVIDER=memory` get it).
#[test]
fn test_build_has_memory_provider() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "--manifest-path",
            manifest,
            "--workspace",
            "-e",
            "normal,build,dev",
            "-i",
            "ipamd",
            "-f",
            "{p} [{f}]",
            "--prefix",
            "none",
        ])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("ipamd ") && l.contains("memory-provider")),
        "the test build lacks the in-memory provider:\n{text}"
    );
}
