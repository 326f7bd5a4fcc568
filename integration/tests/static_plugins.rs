//! `aws-cni` and `egress-cni` run on any node: the binaries the tests execute (and the image
//! ships, `scripts/build-static-plugins.sh`) are fully static, as upstream's Go plugins are
//! (upstream `Makefile`: `export CGO_ENABLED = 0`, so `go build` links no libc). Read with
//! binutils' `readelf` from the same lookup every kernel test uses
//! (`integration::binaries::find_built`): no `PT_INTERP` program header (no ELF interpreter, so
//! the node's `ld-linux` and glibc version do not matter), no `DT_NEEDED` entry, and no glibc
//! name-service lookup linked in (static glibc would load the node's NSS modules for those;
//! docs/image.md, "glibc"). As root, each plugin answers `VERSION` in a `chroot` holding nothing
//! but the binary, where the dynamic build of the same plugin cannot even start (the control).
//!
//! The same for everything else the init container puts on the node: the ELF binaries named by
//! `charts/aws-vpc-cni/files/aws-vpc-cni-init.sh`'s install loop (the two plugins above and the
//! reference plugins portmap, host-local, loopback, bandwidth, tuning from
//! `scripts/build-reference-plugins.sh`, which the image ships) carry no `PT_INTERP` and no
//! `DT_NEEDED` (read by a small ELF reader here; Debian's dynamic `/usr/lib/cni/portmap`, which
//! the image shipped before and Amazon Linux 2 cannot run, is the control), and each reference
//! plugin answers `VERSION` (in an empty `chroot` as root) with the embedded upstream version.
//! The image's ipamd (`scripts/build-static-ipamd.sh`) is checked the same way, and for the
//! built-in `files`/`dns` name lookups it relies on. All of them are `ET_EXEC` (static non-PIE:
//! nothing to relocate at start; upstream's Go plugins are too), not static-pie.
//! Must not: change anything outside a temporary directory.

// An integration-test crate is test-only code; the lint targets unit tests in library code.
#![allow(clippy::tests_outside_test_module)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use integration::binaries::{REFERENCE_PLUGINS, STATIC_PLUGINS, reference_plugin};
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

/// A dynamically linked executable for the controls: the workspace's dynamic `aws-cni` in a
/// plain `cargo test --workspace`; in the test command's static build (docs/testing.md, "One
/// build") there is none, and Debian's `/bin/sh` (dash, dynamic) stands in.
fn dynamic_control() -> PathBuf {
    if integration::binaries::STATIC_TEST_BUILD {
        PathBuf::from("/bin/sh")
    } else {
        dynamic_build("aws-cni")
    }
}

#[test]
fn plugins_have_no_interpreter_no_needed_libraries_and_no_nss_lookups() {
    for name in STATIC_PLUGINS {
        let bin = built_binary(name);
        // (The test command's build is static throughout: there the binary beside the test is
        // the static one, and the checks below are what tell.)
        if !integration::binaries::STATIC_TEST_BUILD {
            assert_ne!(
                bin,
                dynamic_build(name),
                "{name}: the lookup returned the dynamic build"
            );
        }
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
    // The control: the same checks see a dynamic binary's interpreter and libraries.
    let control = dynamic_control();
    if control.exists() {
        assert!(
            readelf("-l", &control).contains("INTERP"),
            "{}",
            control.display()
        );
        assert!(
            readelf("-d", &control).contains("(NEEDED)"),
            "{}",
            control.display()
        );
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
    // The control: a dynamic binary cannot start there (no ld-linux, no libc.so.6).
    let control = dynamic_control();
    if control.exists() {
        let root = tempfile::tempdir().expect("temp dir");
        let out = version_in_empty_root(root.path(), &control, "aws-cni");
        assert!(
            !out.status.success(),
            "the dynamic {} ran without a libc: the empty root proves nothing",
            control.display()
        );
    }
}

/// The init container's install loop: the names in `for b in ...; do` of the chart's init script.
fn init_installs() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/aws-vpc-cni/files/aws-vpc-cni-init.sh"
    );
    let script = std::fs::read_to_string(path).expect("read the init script");
    let line = script
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("for b in ") && l.ends_with("; do"))
        .unwrap_or_else(|| panic!("no `for b in ...; do` install loop in {path}"));
    line["for b in ".len()..line.len() - "; do".len()]
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// What decides whether an ELF file runs on a node whatever its userland.
#[derive(Debug, PartialEq, Eq)]
struct Linkage {
    /// A `PT_INTERP` program header (the node's `ld-linux` would load it).
    interpreter: bool,
    /// `DT_NEEDED` entries of its `PT_DYNAMIC` segment (shared libraries it needs).
    needed: usize,
    /// ELF type `ET_DYN` (a position-independent executable, relocated at every start) rather
    /// than `ET_EXEC` (linked at a fixed address, nothing to relocate: upstream's Go plugins,
    /// and ours since issue 40's round 5, docs/image.md "glibc").
    position_independent: bool,
}

fn u16_at(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes(
        b[at..at + 2].try_into().expect("2 bytes"),
    ))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> usize {
    usize::try_from(u64::from_le_bytes(
        b[at..at + 8].try_into().expect("8 bytes"),
    ))
    .expect("offset fits")
}

/// Reads the program headers of a 64-bit little-endian ELF file (x86-64, arm64).
fn linkage(bin: &Path) -> Linkage {
    const PT_DYNAMIC: u32 = 2;
    const PT_INTERP: u32 = 3;
    const DT_NULL: usize = 0;
    const DT_NEEDED: usize = 1;
    const ET_DYN: usize = 3;
    let b = std::fs::read(bin).unwrap_or_else(|e| panic!("read {}: {e}", bin.display()));
    assert!(
        b.len() >= 64 && b[..4] == *b"\x7fELF" && b[4] == 2 && b[5] == 1,
        "{}: not a 64-bit little-endian ELF file",
        bin.display()
    );
    let (phoff, phentsize, phnum) = (u64_at(&b, 0x20), u16_at(&b, 0x36), u16_at(&b, 0x38));
    let mut found = Linkage {
        interpreter: false,
        needed: 0,
        position_independent: u16_at(&b, 0x10) == ET_DYN,
    };
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        match u32_at(&b, ph) {
            PT_INTERP => found.interpreter = true,
            PT_DYNAMIC => {
                let (offset, size) = (u64_at(&b, ph + 8), u64_at(&b, ph + 0x20));
                for entry in (offset..offset + size).step_by(16) {
                    match u64_at(&b, entry) {
                        DT_NULL => break,
                        DT_NEEDED => found.needed += 1,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    found
}

/// Debian's dynamically linked build (containernetworking-plugins), when installed.
const DEBIAN_PORTMAP: &str = "/usr/lib/cni/portmap";

#[test]
fn every_binary_the_init_container_installs_is_static() {
    let installs = init_installs();
    let mut elves: Vec<&str> = installs
        .iter()
        .map(String::as_str)
        .filter(|b| !b.ends_with(".sh"))
        .collect();
    elves.sort_unstable();
    let mut known: Vec<&str> = STATIC_PLUGINS
        .iter()
        .chain(&REFERENCE_PLUGINS)
        .copied()
        .collect();
    known.sort_unstable();
    assert_eq!(
        elves, known,
        "the init script installs {installs:?}; every binary must be one this test checks"
    );
    for name in elves {
        let bin = if STATIC_PLUGINS.contains(&name) {
            built_binary(name)
        } else {
            reference_plugin(name)
        };
        let found = linkage(&bin);
        assert_eq!(
            found,
            Linkage {
                interpreter: false,
                needed: 0,
                position_independent: false,
            },
            "{name} ({}) is not static non-PIE: a node whose glibc differs (Amazon Linux 2: \
             2.26) cannot run a dynamic one, and a static-pie relocates itself at every start\n{}{}",
            bin.display(),
            readelf("-l", &bin),
            readelf("-d", &bin)
        );
    }
    // The control: the reader sees Debian's dynamic build for what it is.
    let debian = Path::new(DEBIAN_PORTMAP);
    if debian.exists() {
        let found = linkage(debian);
        assert!(
            found.interpreter && found.needed > 0,
            "{DEBIAN_PORTMAP}: {found:?}"
        );
    }
}

/// The image's ipamd (`scripts/build-static-ipamd.sh`) is static non-PIE as the plugins are, and
/// its name lookups are glibc's built-in `files` and `dns` sources (linked into the binary, so
/// no `libnss_*.so` is needed for the image's `hosts: files dns`; `static_resolver.rs` runs
/// them).
#[test]
fn the_image_ipamd_is_static_with_built_in_name_lookups() {
    let bin = integration::binaries::static_ipamd();
    assert_eq!(
        linkage(&bin),
        Linkage {
            interpreter: false,
            needed: 0,
            position_independent: false,
        },
        "{} is not static non-PIE\n{}{}",
        bin.display(),
        readelf("-l", &bin),
        readelf("-d", &bin)
    );
    let symbols = readelf("-s", &bin);
    for f in [
        "getaddrinfo",
        "_nss_files_gethostbyname4_r",
        "_nss_dns_gethostbyname4_r",
    ] {
        assert!(
            symbols.split_whitespace().any(|w| w == f),
            "{}: no {f} in the symbol table",
            bin.display()
        );
    }
}

/// Runs `bin` with `env` and `stdin`; as root in a chroot of a temp dir holding only the binary
/// (no libc, no loader), else directly.
fn run_alone(bin: &Path, env: &[(&str, &str)], stdin: &str) -> std::process::Output {
    let root = tempfile::tempdir().expect("temp dir");
    let mut cmd = if can_run_kernel_tests() {
        let name = bin.file_name().expect("file name");
        std::fs::copy(bin, root.path().join(name)).expect("copy plugin");
        let mut c = Command::new("chroot");
        c.arg(root.path()).arg(Path::new("/").join(name));
        c
    } else {
        Command::new(bin)
    };
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().copied())
        .current_dir(root.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the plugin (chroot: coreutils)");
    // A plugin may exit without reading stdin (libcni's skel never reads it for VERSION): a
    // broken pipe is no failure, the output says what it did.
    match child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("write stdin: {e}"),
        _ => {}
    }
    child.wait_with_output().expect("wait for the plugin")
}

/// The upstream version Debian's installed source package carries (`1.1.1+ds1-3` -> `v1.1.1`).
fn debian_upstream_version() -> Option<String> {
    let out = Command::new("dpkg-query")
        .args([
            "-W",
            "-f=${Version}",
            "golang-github-containernetworking-plugins-dev",
        ])
        .output()
        .ok()?;
    let v = String::from_utf8(out.stdout).ok()?;
    let v = v.rsplit_once(':').map_or(v.as_str(), |(_, v)| v);
    let upstream = v.split(['+', '~', '-']).next()?;
    (out.status.success() && !upstream.is_empty()).then(|| format!("v{upstream}"))
}

#[test]
fn reference_plugins_answer_version_with_the_embedded_upstream_version() {
    let version = debian_upstream_version();
    for name in REFERENCE_PLUGINS {
        let bin = reference_plugin(name);
        let out = run_alone(
            &bin,
            &[("CNI_COMMAND", "VERSION")],
            r#"{"cniVersion":"0.4.0"}"#,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name} VERSION: {}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: serde_json::Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{name}: VERSION answer is not JSON ({e}): {stdout}"));
        let supported = answer["supportedVersions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        // (firewall starts at 0.4.0 upstream; every other plugin also speaks 0.3.1)
        let wanted: &[&str] = if name == "firewall" {
            &["0.4.0", "1.0.0"]
        } else {
            &["0.3.1", "0.4.0", "1.0.0"]
        };
        for v in wanted {
            assert!(
                supported.iter().any(|s| s == v),
                "{name} lacks {v}: {answer}"
            );
        }
        // Without CNI_COMMAND the plugin prints its "about" line: the version the script embedded.
        let about = run_alone(&bin, &[], "");
        let about = String::from_utf8_lossy(&about.stderr);
        let expected = format!("CNI {name} plugin {}", version.as_deref().unwrap_or("v"));
        assert!(
            about.starts_with(&expected) && !about.contains("version unknown"),
            "{name}: about line {about:?}, expected {expected:?}"
        );
    }
    // The control: as root, Debian's dynamic build cannot start in a root without its libc.
    let debian = Path::new(DEBIAN_PORTMAP);
    if can_run_kernel_tests() && debian.exists() {
        let out = run_alone(
            debian,
            &[("CNI_COMMAND", "VERSION")],
            r#"{"cniVersion":"0.4.0"}"#,
        );
        assert!(
            !out.status.success(),
            "{DEBIAN_PORTMAP} ran without a libc: the empty root proves nothing"
        );
    }
}

/// Upstream's init image carries every Linux plugin of containernetworking-plugins (its
/// `make plugins` runs the plugins' `build_linux.sh`: `plugins/{meta,main,ipam}/*` but
/// `windows`), so clusters chaining others (Multus delegating to `macvlan`, `bridge`, `sbr`,
/// ...) find them. Every one of the source the image builds from is shipped and installed.
#[test]
fn the_image_ships_every_linux_reference_plugin_of_its_source() {
    let out = reference_plugin("portmap")
        .parent()
        .expect("the reference plugins' directory")
        .to_owned();
    let src = out.join(".build/gopath/src/github.com/containernetworking/plugins/plugins");
    let mut linux: Vec<String> = ["meta", "main", "ipam"]
        .iter()
        .flat_map(|kind| {
            std::fs::read_dir(src.join(kind))
                .unwrap_or_else(|e| panic!("{}: {e}", src.join(kind).display()))
                .filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != "windows")
                .collect::<Vec<_>>()
        })
        .collect();
    linux.sort();
    let mut shipped: Vec<String> = REFERENCE_PLUGINS.iter().map(|p| (*p).to_owned()).collect();
    shipped.sort();
    assert_eq!(shipped, linux, "every Linux plugin of the source");
    let installs = init_installs();
    for p in &linux {
        assert!(installs.contains(p), "the init container installs {p}");
        assert!(out.join(p).exists(), "{p} built");
    }
}
