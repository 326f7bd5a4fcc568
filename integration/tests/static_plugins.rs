//! `aws-cni` and `egress-cni` run on any node: the binaries the tests execute (and the image
//! ships, `scripts/build-static-plugins.sh`) are fully static, as upstream's Go plugins are
//! (upstream `Makefile`: `export CGO_ENABLED = 0`, so `go build` links no libc). Read with
//! binutils' `readelf` from the same lookup every kernel test uses
//! (`integration::binaries::find_built`): no `PT_INTERP` program header (no ELF interpreter, so
//! the node's `ld-linux` and glibc version do not matter), no `DT_NEEDED` entry, and no glibc
//! name-service lookup linked in (static glibc would load the node's NSS modules for those;
//! docs/image.md, "glibc"). As root, each plugin answers `VERSION` in a `chroot` holding nothing
//! but the binary, where the dynamic build of the same plugin cannot even start (the control).
//! Must not: change anything outside a temporary directory.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::path::{Path, PathBuf};
use std::process::Command;

use integration::binaries::STATIC_PLUGINS;
use integration::{built_binary, can_run_kernel_tests};

/// glibc entry points that go through NSS (`/etc/nsswitch.conf`, modules such as `libnss_sss`
/// dlopened from the node): resolver, users, groups, services, protocols.
const NSS_LOOKUPS: &[&str] = &[
    "getaddrinfo",
    "getnameinfo",
    "gethostbyname",
    "gethostbyname_r",
    "gethostbyname2",
    "gethostbyname2_r",
    "gethostbyaddr",
    "gethostbyaddr_r",
    "getpwnam",
    "getpwnam_r",
    "getpwuid",
    "getpwuid_r",
    "getgrnam",
    "getgrnam_r",
    "getgrgid",
    "getgrgid_r",
    "getgrouplist",
    "initgroups",
    "getservbyname",
    "getservbyname_r",
    "getservbyport",
    "getprotobyname",
    "getprotobyname_r",
];

fn readelf(flag: &str, bin: &Path) -> String {
    let out = Command::new("readelf")
        .args([flag, "-W"])
        .arg(bin)
        .output()
        .expect("run readelf (binutils)");
    assert!(
        out.status.success(),
        "readelf {flag} {}: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Names of the functions `bin`'s symbol table defines (the test build is not stripped).
fn defined_functions(bin: &Path) -> Vec<String> {
    readelf("-s", bin)
        .lines()
        .filter_map(|l| {
            // `Num: Value Size Type Bind Vis Ndx Name`
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[3] == "FUNC" && f[6] != "UND").then(|| f[7].to_owned())
        })
        .collect()
}

/// The dynamic build `cargo test --workspace` links beside the test (not what tests execute).
fn dynamic_build(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").join(name)
}

#[test]
fn plugins_have_no_interpreter_no_needed_libraries_and_no_nss_lookups() {
    for name in STATIC_PLUGINS {
        let bin = built_binary(name);
        assert_ne!(
            bin,
            dynamic_build(name),
            "{name}: the lookup returned the dynamic build"
        );
        let headers = readelf("-l", &bin);
        assert!(
            headers.contains("Elf file type is DYN") || headers.contains("Elf file type is EXEC"),
            "{name}: not an executable:\n{headers}"
        );
        assert!(
            !headers.contains("INTERP"),
            "{name}: has an ELF interpreter (PT_INTERP):\n{headers}"
        );
        let dynamic = readelf("-d", &bin);
        assert!(
            !dynamic.contains("(NEEDED)"),
            "{name}: needs shared libraries:\n{dynamic}"
        );
        let functions = defined_functions(&bin);
        assert!(
            functions.iter().any(|f| f == "main"),
            "{name}: symbol table missing (stripped?), the NSS check would be vacuous"
        );
        let lookups: Vec<&str> = NSS_LOOKUPS
            .iter()
            .copied()
            .filter(|l| functions.iter().any(|f| f == l))
            .collect();
        assert!(
            lookups.is_empty(),
            "{name}: links glibc NSS lookups {lookups:?}; static glibc would load the node's NSS \
             modules for them (docs/image.md, glibc)"
        );
    }
    // The control: the same checks see the dynamic build's interpreter and libraries.
    let control = dynamic_build("aws-cni");
    if control.exists() {
        assert!(readelf("-l", &control).contains("INTERP"));
        assert!(readelf("-d", &control).contains("(NEEDED)"));
    }
}

/// Runs `/<name>` with `CNI_COMMAND=VERSION` in a chroot of `dir`, which holds only that file.
fn version_in_empty_root(dir: &Path, bin: &Path, name: &str) -> std::process::Output {
    std::fs::copy(bin, dir.join(name)).expect("copy plugin");
    Command::new("chroot")
        .arg(dir)
        .arg(format!("/{name}"))
        .env_clear()
        // for finding `chroot`; the plugin needs nothing but CNI_COMMAND
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", "VERSION")
        .output()
        .expect("run chroot (coreutils)")
}

#[test]
fn plugins_answer_version_in_a_root_without_libc() {
    if !can_run_kernel_tests() {
        return;
    }
    for name in STATIC_PLUGINS {
        let root = tempfile::tempdir().expect("temp dir");
        let out = version_in_empty_root(root.path(), &built_binary(name), name);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name} in an empty root: {}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: serde_json::Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{name}: VERSION answer is not JSON ({e}): {stdout}"));
        assert!(
            answer["supportedVersions"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v == "1.0.0")),
            "{name}: {answer}"
        );
    }
    // The control: the dynamic build cannot start there (no ld-linux, no libc.so.6).
    let control = dynamic_build("aws-cni");
    if control.exists() {
        let root = tempfile::tempdir().expect("temp dir");
        let out = version_in_empty_root(root.path(), &control, "aws-cni");
        assert!(
            !out.status.success(),
            "the dynamic aws-cni ran without a libc: the empty root proves nothing"
        );
    }
}
