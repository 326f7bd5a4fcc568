//! The workspace's binaries marked `test = false` hold no tests: such a binary builds no test
//! harness in `cargo test` (docs/testing.md, "Binaries without tests"), so a test written in it
//! would never run. Read from `cargo metadata` (the targets as cargo sees them) and each such
//! binary's sources (its file and the modules it declares). The control: the binaries that keep
//! their harness (`grpc-health-probe`, `npa-standin`) are found to hold tests by the same reader.
//! Must not: write anything.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// What marks a test in our sources.
const TEST_MARKS: [&str; 4] = ["#[test]", "#[tokio::test", "proptest!", "#[cfg(test)]"];

/// (package, binary name, its `test` flag, its root source file) of every workspace binary.
fn workspace_bins() -> Vec<(String, String, bool, PathBuf)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata json");
    let mut bins = Vec::new();
    for pkg in meta["packages"].as_array().expect("packages") {
        for t in pkg["targets"].as_array().expect("targets") {
            let kinds: Vec<&str> = t["kind"]
                .as_array()
                .expect("kind")
                .iter()
                .filter_map(|k| k.as_str())
                .collect();
            if kinds == ["bin"] {
                bins.push((
                    pkg["name"].as_str().expect("name").to_owned(),
                    t["name"].as_str().expect("name").to_owned(),
                    t["test"].as_bool().expect("test flag"),
                    PathBuf::from(t["src_path"].as_str().expect("src_path")),
                ));
            }
        }
    }
    bins
}

/// The binary's source files: its root and, recursively, every `mod name;` it declares
/// (`name.rs` or `name/mod.rs` where rustc looks: beside a crate root or `mod.rs`, in the
/// directory named after any other file). A module it cannot find fails the read, loudly.
fn sources(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.to_owned()];
    let mut i = 0;
    while i < files.len() {
        let file = files[i].clone();
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
        let beside = file.parent().expect("dir");
        let dir = if i == 0 || file.file_name().is_some_and(|n| n == "mod.rs") {
            beside.to_owned()
        } else {
            beside.join(file.file_stem().expect("stem"))
        };
        for line in text.lines() {
            let l = line.trim_start().trim_start_matches("pub ");
            if let Some(name) = l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                let flat = dir.join(format!("{name}.rs"));
                let nested = dir.join(name).join("mod.rs");
                files.push(if flat.exists() { flat } else { nested });
            }
        }
        i += 1;
    }
    files
}

fn holds_tests(root: &Path) -> Vec<PathBuf> {
    sources(root)
        .into_iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).expect("read");
            TEST_MARKS.iter().any(|m| text.contains(m))
        })
        .collect()
}

#[test]
fn binaries_without_a_test_harness_hold_no_tests() {
    let bins = workspace_bins();
    let mut wrong = Vec::new();
    let mut harnessed = Vec::new();
    for (pkg, name, test, src) in &bins {
        let with_tests = holds_tests(src);
        if *test {
            if !with_tests.is_empty() {
                harnessed.push(name.clone());
            }
        } else if !with_tests.is_empty() {
            wrong.push(format!("{pkg}/{name}: {with_tests:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "binaries marked `test = false` that hold tests (they would never run; drop the flag): {wrong:?}"
    );
    // the control: the reader finds the tests of the binaries that keep their harness
    for expected in ["grpc-health-probe", "npa-standin"] {
        assert!(
            harnessed.iter().any(|n| n == expected),
            "{expected}'s tests not found by the reader; bins: {bins:?}"
        );
    }
    // and the flag is set where it saves a build: most binaries have no tests
    let without = bins.iter().filter(|b| !b.2).count();
    assert!(
        without >= 11,
        "only {without} binaries are `test = false`: {bins:?}"
    );
}
