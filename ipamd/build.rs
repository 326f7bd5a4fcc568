//! Link policy for the binaries that run inside our images (ipamd's; cni-metrics-helper points
//! its `build` key at this one file). It only adds linker arguments for `[[bin]]` targets; it
//! must not generate code or touch tests, examples or libraries, and it must not be used by
//! `aws-cni`, whose plugins run on the node (see below).
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
//! of the node's, so the plugin package has no link policy here.
//!
//! No `rerun-if` line on purpose: a package that borrows this file has no `build.rs` of its own
//! to name, and cargo's default (rerun when the package's files change) costs nothing here.
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
