//! Finds the workspace's built binaries (`ipamd`, `aws-cni`, `test-ipamd`, ...) next to the
//! running test or driver: the one lookup behind [`built_binary`], the simulated VPC's
//! [`crate::sim::Bins`] and the upstream-node fixture's builds.
//!
//! The plugins the node's container runtime executes ([`STATIC_PLUGINS`]) are the fully static
//! build of `scripts/build-static-plugins.sh` (docs/image.md, "glibc"), never the dynamic ones
//! `cargo test --workspace` links beside the test: the first lookup in a process runs that
//! script for the running test's profile and target directory (a no-op when nothing changed), so
//! every test that executes a plugin executes the binary the image ships, built from the current
//! sources. The reference plugins the image ships beside them ([`REFERENCE_PLUGINS`]: portmap,
//! host-local, ...) are the static builds of `scripts/build-reference-plugins.sh`, found (and
//! built once per process) by [`reference_plugin`]. The image's ipamd is static too
//! (`scripts/build-static-ipamd.sh`): [`static_ipamd`] builds and finds it for the image test;
//! the other tests run the `ipamd` of the test build.
//!
//! The test command (`integration/test.sh`) builds the whole workspace with the static flags
//! ([`STATIC_TEST_BUILD`], docs/testing.md "One build"): then every binary beside the test is
//! already the static build, and both lookups return it without running a script (which would
//! compile ipamd's and the plugins' dependencies a second time). Must not: fall back to the
//! dynamic plugins, or to Debian's dynamic reference plugins in `/usr/lib/cni`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The binaries built fully static into `target/<host triple>/<profile>/`.
pub const STATIC_PLUGINS: [&str; 2] = ["aws-cni", "egress-cni"];

/// Whether the running test was itself built with the static flags (`-C
/// target-feature=+crt-static` for `--target <host triple>`, as `integration/test.sh` builds
/// the workspace): then the `aws-cni`, `egress-cni` and `ipamd` beside it are static builds of
/// the current sources, the binaries the image ships in their test profile.
pub const STATIC_TEST_BUILD: bool = cfg!(target_feature = "crt-static");

/// The reference CNI plugins (containernetworking-plugins) the image ships and the init
/// container installs on the node, built fully static by `scripts/build-reference-plugins.sh`
/// into `<target root>/reference-plugins/`.
/// Every Linux plugin of containernetworking-plugins v1.1.1, as upstream's init image carries
/// them (the script refuses a source with one this list lacks).
pub const REFERENCE_PLUGINS: [&str; 16] = [
    "dhcp",
    "host-local",
    "static",
    "bridge",
    "host-device",
    "ipvlan",
    "loopback",
    "macvlan",
    "ptp",
    "vlan",
    "bandwidth",
    "firewall",
    "portmap",
    "sbr",
    "tuning",
    "vrf",
];

/// Path of the binary `name` in the target directory the running executable was built into
/// (`target/<profile>/deps/<test>` -> `target/<profile>/<name>`; for [`STATIC_PLUGINS`]
/// `target/<host triple>/<profile>/<name>`, built first), or the path it was looked for at when
/// it does not exist.
pub fn find_built(name: &str) -> Result<PathBuf, PathBuf> {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    if STATIC_PLUGINS.contains(&name) && !STATIC_TEST_BUILD {
        return find_static_plugin(&dir, name);
    }
    let path = dir.join(name);
    if path.exists() { Ok(path) } else { Err(path) }
}

/// Path of the binary `name` in the target directory the running test was built into.
/// Panics with a hint when it has not been built (`cargo test --workspace` builds all but the
/// static plugins, which the lookup builds itself).
#[must_use]
pub fn built_binary(name: &str) -> PathBuf {
    find_built(name).unwrap_or_else(|path| {
        let hint = if STATIC_PLUGINS.contains(&name) {
            "scripts/build-static-plugins.sh failed (its output is above)"
        } else {
            "run `cargo test --workspace --no-run` first"
        };
        panic!("{} not built; {hint}", path.display())
    })
}

/// The host's Rust target triple as `scripts/build-static-plugins.sh` names its directory
/// (the script refuses hosts that are not `*-linux-gnu`).
fn host_triple() -> String {
    format!("{}-unknown-linux-gnu", std::env::consts::ARCH)
}

/// `<target root>/<host triple>/<profile>/<name>` for the profile directory `dir` the running
/// executable lives in, after one run of the static build per process.
fn find_static_plugin(dir: &Path, name: &str) -> Result<PathBuf, PathBuf> {
    let triple = host_triple();
    let profile = dir
        .file_name()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut root = dir.parent().map(Path::to_path_buf).unwrap_or_default();
    // A test built with `--target <host triple>` already lives under that directory.
    if root.file_name().is_some_and(|f| *f == *triple) {
        root.pop();
    }
    let path = root.join(&triple).join(&profile).join(name);
    static BUILT: OnceLock<bool> = OnceLock::new();
    // Inside the test VM the host has built them before booting it (`crate::vm::in_vm`'s
    // preparation); the VM has no toolchain on its PATH.
    let built = *BUILT.get_or_init(|| crate::vm::inside() || build_static_plugins(&root, &profile));
    if built && path.exists() {
        Ok(path)
    } else {
        Err(path)
    }
}

/// Runs `scripts/build-static-plugins.sh` into the target directory `root` for `profile`;
/// prints its output and returns false when it fails.
fn build_static_plugins(root: &Path, profile: &str) -> bool {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/build-static-plugins.sh"
    );
    build_static(script, root, profile, &[])
}

/// The image's ipamd as the image ships it, fully static (`scripts/build-static-ipamd.sh`,
/// docs/image.md "glibc"), with the test-only in-memory EC2 (`memory-provider`, which the
/// test build's ipamd has too): in a [`STATIC_TEST_BUILD`] the test build's own `ipamd`, else
/// `<target root>/<host triple>/<profile>/ipamd` for the running test's profile, built once per
/// process (a no-op when up to date; cold, it compiles ipamd's dependencies once more with the
/// static flags). The image test ships it; every other test runs the `ipamd` [`built_binary`]
/// finds. Panics when the build failed.
#[must_use]
pub fn static_ipamd() -> PathBuf {
    if STATIC_TEST_BUILD {
        return built_binary("ipamd");
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let profile = dir
        .file_name()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let root = target_root();
    let path = root.join(host_triple()).join(&profile).join("ipamd");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/build-static-ipamd.sh"
    );
    static BUILT: OnceLock<bool> = OnceLock::new();
    let built = *BUILT.get_or_init(|| {
        crate::vm::inside()
            || build_static(script, &root, &profile, &["--features", "memory-provider"])
    });
    assert!(
        built && path.exists(),
        "{} not built; scripts/build-static-ipamd.sh failed (its output is above)",
        path.display()
    );
    path
}

/// Runs one of the static build scripts into the target directory `root` for `profile`, with
/// `extra` arguments for cargo; prints its output and returns false when it fails.
fn build_static(script: &str, root: &Path, profile: &str, extra: &[&str]) -> bool {
    let mut cmd = Command::new("sh");
    cmd.arg(script)
        .arg("--offline")
        .arg("--quiet")
        .arg("--target-dir")
        .arg(root)
        .args(extra);
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    run_script(script, &mut cmd)
}

/// Runs a build script's command; prints its output and returns false when it fails.
fn run_script(script: &str, cmd: &mut Command) -> bool {
    match cmd.output() {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            eprintln!(
                "{script} failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            false
        }
        Err(e) => {
            eprintln!("run {script}: {e}");
            false
        }
    }
}

/// Path of the static reference plugin `name` (one of [`REFERENCE_PLUGINS`]) in
/// `<target root>/reference-plugins/`, where the image test copies it from. The first call in a
/// process runs `scripts/build-reference-plugins.sh` into that directory (a no-op of ~0.1 s when
/// up to date; cold it fetches Debian's source package and builds in about 20 s). Panics when
/// `name` is not a reference plugin or the build failed.
#[must_use]
pub fn reference_plugin(name: &str) -> PathBuf {
    assert!(
        REFERENCE_PLUGINS.contains(&name),
        "{name} is not one of {REFERENCE_PLUGINS:?}"
    );
    let dir = target_root().join("reference-plugins");
    static BUILT: OnceLock<bool> = OnceLock::new();
    // Inside the test VM there is no Go toolchain: the host built them before booting it.
    let built = *BUILT.get_or_init(|| crate::vm::inside() || build_reference_plugins(&dir));
    let path = dir.join(name);
    assert!(
        built && path.exists(),
        "{} not built; scripts/build-reference-plugins.sh failed (its output is above)",
        path.display()
    );
    path
}

/// The target directory the running executable was built into (`target/<profile>/deps/<test>`
/// or `target/<host triple>/<profile>/deps/<test>` -> `target`).
fn target_root() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.pop();
    if dir.file_name().is_some_and(|f| *f == *host_triple()) {
        dir.pop();
    }
    dir
}

/// Runs `scripts/build-reference-plugins.sh <dir>`; prints its output and returns false when it
/// fails.
fn build_reference_plugins(dir: &Path) -> bool {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/build-reference-plugins.sh"
    );
    run_script(script, Command::new("sh").arg(script).arg(dir))
}
