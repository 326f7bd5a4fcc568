//! The shipped daemon carries no test double: the in-memory provider (`aws::memory`,
//! `IPAMD_ENI_PROVIDER=memory`) lives behind the cargo feature `memory-provider`, which only
//! dev-dependencies enable. This asks cargo how a normal (non-test) build of the workspace
//! resolves ipamd's features, without building anything. Also: the workspace's own builds of
//! ipamd and cni-metrics-helper stay dynamic and are linked with packed relative relocations
//! (`ipamd/build.rs`); the CNI plugins, which run on the node, and the ipamd the image ships are
//! built fully static by other commands (`scripts/build-static-plugins.sh`,
//! `scripts/build-static-ipamd.sh`, checked by `integration/tests/static_plugins.rs`), whose
//! flags must not leak into a plain build. The test command builds everything with those flags
//! on purpose (docs/testing.md, "One build"); a test built so checks that instead. Must not:
//! run a release build.

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

/// `ipamd/build.rs` links the binaries that run in our bookworm images with `-z
/// pack-relative-relocs`: the dynamic section has a `RELR` table, the binary requires
/// `GLIBC_ABI_DT_RELR` (so an older loader refuses it by name instead of misreading it), and
/// `.rela.dyn` keeps only the few non-relative relocations (ipamd had ~32 000 entries without
/// it). They stay dynamic PIEs on the image's glibc (interpreter and `libc.so.6`): the static
/// builds (the node-run plugins, the image's ipamd) have their own commands, which must not leak
/// into this one.
/// Reads the test build's binaries (`cargo test --workspace` links every `[[bin]]` of the
/// workspace beside ipamd's). The test command builds the workspace with the static flags on
/// purpose (docs/testing.md, "One build"): a test compiled with `crt-static` checks the other
/// promise instead, [`the_static_test_build_is_static_throughout`].
#[cfg(all(
    target_os = "linux",
    target_env = "gnu",
    not(target_feature = "crt-static")
))]
#[test]
fn image_binaries_are_dynamic_and_pack_relative_relocations() {
    let ipamd = std::path::Path::new(env!("CARGO_BIN_EXE_ipamd"));
    let dir = ipamd.parent().expect("target dir");
    let readelf = |flag: &str, bin: &std::path::Path| {
        assert!(
            bin.is_file(),
            "{} not built (cargo test --workspace)",
            bin.display()
        );
        let out = Command::new("readelf")
            .args([flag, "-W"])
            .arg(bin)
            .output()
            .expect("run readelf (binutils)");
        assert!(out.status.success(), "readelf {flag} {}", bin.display());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for name in ["ipamd", "cni-metrics-helper"] {
        let bin = dir.join(name);
        let headers = readelf("-l", &bin);
        assert!(
            headers.contains("Requesting program interpreter"),
            "{name}: no ELF interpreter (the static plugin flags leaked?):\n{headers}"
        );
        let dynamic = readelf("-d", &bin);
        assert!(
            dynamic.contains("(NEEDED)") && dynamic.contains("libc.so.6"),
            "{name}: not linked against the image's glibc:\n{dynamic}"
        );
        assert!(
            dynamic.contains("(RELR)"),
            "{name}: no RELR table:\n{dynamic}"
        );
        assert!(
            readelf("-V", &bin).contains("GLIBC_ABI_DT_RELR"),
            "{name}: RELR without the GLIBC_ABI_DT_RELR requirement"
        );
        let rela_bytes = readelf("-S", &bin)
            .lines()
            .find(|l| l.contains(" .rela.dyn "))
            .map_or(0, |l| {
                // `[Nr] Name Type Address Off Size ...`: the size is 4 fields after the name.
                let f: Vec<&str> = l.split_whitespace().collect();
                let at = f.iter().position(|w| *w == ".rela.dyn").expect("name");
                f.get(at + 4)
                    .and_then(|size| u64::from_str_radix(size, 16).ok())
                    .unwrap_or_else(|| panic!("{name}: unreadable .rela.dyn line: {l}"))
            });
        assert!(
            rela_bytes < 24 * 2000,
            "{name}: .rela.dyn still {rela_bytes} bytes (relative relocations not packed)"
        );
    }
}

/// The test command's build (`integration/test.sh`: `--target <host triple>` with
/// `scripts/static-build-env.sh`) is the static build the image's ipamd and the node's plugins
/// are: `ipamd/build.rs` adds no RELR there (a static binary relocates itself) and every binary
/// beside the test has no interpreter and needs no shared library.
#[cfg(all(target_os = "linux", target_env = "gnu", target_feature = "crt-static"))]
#[test]
fn the_static_test_build_is_static_throughout() {
    let ipamd = std::path::Path::new(env!("CARGO_BIN_EXE_ipamd"));
    let dir = ipamd.parent().expect("target dir");
    for name in ["ipamd", "cni-metrics-helper", "aws-cni"] {
        let bin = dir.join(name);
        assert!(bin.is_file(), "{} not built", bin.display());
        let out = Command::new("readelf")
            .args(["-l", "-d", "-W"])
            .arg(&bin)
            .output()
            .expect("run readelf (binutils)");
        assert!(out.status.success(), "readelf {}", bin.display());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("Elf file type is EXEC"),
            "{name}: not a non-PIE executable:\n{text}"
        );
        assert!(
            !text.contains("Requesting program interpreter") && !text.contains("(NEEDED)"),
            "{name}: dynamically linked in the static build:\n{text}"
        );
        assert!(
            !text.contains("(RELR)"),
            "{name}: RELR in a static binary:\n{text}"
        );
    }
}
