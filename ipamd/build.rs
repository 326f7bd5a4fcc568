//! Link policy for our binaries (ipamd's; cni-metrics-helper and aws-cni point their `build` key
//! at this one file). It only adds linker arguments for `[[bin]]` targets; it must not generate
//! code or touch tests, examples or libraries.
//!
//! `-z pack-relative-relocs` (DT_RELR): a PIE Rust binary carries one 24-byte `.rela.dyn` entry
//! per pointer in `.data.rel.ro` (~32 000 in ipamd, 0.77 MB), which the dynamic loader reads in
//! full at every start: file-backed pages that stay resident for the daemon's life. RELR packs
//! them into a bitmap (9 KB for ipamd); ipamd's idle RSS drops by ~0.7 MiB (docs/testing.md,
//! "Relative relocations"). The binary stays a PIE (ASLR kept). The linker (lld, Rust's default
//! here, or GNU ld >= 2.38) emits RELR only when the libc it links against defines
//! `GLIBC_ABI_DT_RELR` and then records that version as a requirement, so a binary never starts
//! on a loader that would misread it; older GNU ld ignores the option with a warning.
//!
//! That requirement is glibc >= 2.36: the images are Debian bookworm (2.36). `aws-cni` and
//! `egress-cni` are copied to the host and executed there by the container runtime; they are
//! linked fully static by `scripts/build-static-plugins.sh` (docs/image.md) and need no glibc
//! of the node's: a `crt-static` build gets no RELR (its own start-up code relocates it).
//!
//! No `rerun-if` line on purpose: a package that borrows this file has no `build.rs` of its own
//! to name, and cargo's default (rerun when the package's files change) costs nothing here.
//!
//! `--symbol-ordering-file=<package>/code-order.txt` (optimised builds, when the package has
//! one): the functions a profile saw executing are laid out first and together, so the few
//! hundred of them occupy a few hundred KiB of `.text` instead of being spread over all 13 MB of
//! it, where each one drags its 64 KiB fault-around window into the resident set
//! (docs/performance.md, "Code layout"; `scripts/code-order.sh` writes the file). The file names
//! functions by demangled path; the workspace's linker (`scripts/link-with-layout.sh`,
//! .cargo/config.toml) translates it into this link's symbols before lld sees it. A function
//! the build does not have is skipped: a stale file costs memory, never correctness
//! (`integration/tests/code_layout.rs` fails when the list has gone stale). The option is
//! lld's (Rust's default linker on x86_64 Linux since 1.90, and the image's); GNU ld does not
//! know it and fails the link, loudly.
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        if !features.split(',').any(|f| f == "crt-static") {
            println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
        }
        let order = std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default())
            .join("code-order.txt");
        let optimised = std::env::var("OPT_LEVEL").is_ok_and(|o| o != "0");
        if optimised && order.is_file() {
            println!(
                "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
                order.display()
            );
            println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
        }
    }
}
