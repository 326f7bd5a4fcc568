# shellcheck shell=sh
# Sourced (POSIX sh) by every fully static build: scripts/build-static-plugins.sh,
# scripts/build-static-ipamd.sh, and integration/test.sh and integration/demo.sh, whose whole test
# build is static (docs/testing.md, "One build"). Exports, for every cargo command after it:
# - CARGO_BUILD_TARGET=<host triple>: `--target`, so the result lands in
#   target/<host triple>/<profile>/ and the flags reach target units only (build scripts and
#   proc-macros stay dynamic host code; the workspace's plain build in target/<profile>/ is
#   neither rebuilt nor changed);
# - CARGO_ENCODED_RUSTFLAGS (separated by 0x1f; it outranks RUSTFLAGS and config rustflags, so
#   the result is the same whatever the caller's environment says): glibc linked in
#   (`-C target-feature=+crt-static`: no ELF interpreter, no NEEDED libraries), non-PIE
#   (`-C relocation-model=static`: ET_EXEC at a fixed address, nothing to relocate at start),
#   and the v0 mangling the code layout lists are keyed to, repeated from .cargo/config.toml
#   because this variable replaces its flags. docs/image.md ("glibc") says why;
# - CARGO_INCREMENTAL=0 unless the caller chose otherwise: these builds are one-shot (CI, a
#   newcomer's first run, the image), and incremental compilation's bookkeeping and finer
#   codegen split cost a clean build of the workspace's crates a fifth more CPU
#   (docs/performance.md, round 9). It is part of the build's fingerprint, so test.sh and
#   demo.sh share one build only because both get it from here.
# integration/tests/static_resolver.rs reads the flags from this file.
host=$(rustc -vV | sed -n 's/^host: //p')
case "$host" in
  *-linux-gnu) ;;
  *) echo "static-build-env.sh: host $host is not a *-linux-gnu target (docs/image.md, glibc)" >&2; exit 1 ;;
esac
CARGO_BUILD_TARGET=$host
CARGO_ENCODED_RUSTFLAGS=$(printf '%s\037%s\037%s' -Ctarget-feature=+crt-static -Crelocation-model=static \
  -Csymbol-mangling-version=v0)
CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_BUILD_TARGET CARGO_ENCODED_RUSTFLAGS CARGO_INCREMENTAL
