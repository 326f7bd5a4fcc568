#!/bin/sh
# Builds the two CNI plugins that run on the node, `aws-cni` and `egress-cni`, fully static
# against glibc (`-C target-feature=+crt-static`: no ELF interpreter, no NEEDED libraries) and
# non-PIE (`-C relocation-model=static`: ET_EXEC at a fixed address, nothing to relocate at
# start; without it, a static-pie), as upstream's Go plugins are. docs/image.md ("glibc") says
# why glibc and not musl, and what the fixed address costs (no ASLR for the binary's image).
# scripts/build-static-ipamd.sh builds ipamd with the same flags (scripts/static-rustflags.sh).
# Used by the Dockerfile (`--release --locked`) and, through integration::binaries::find_built,
# by every test of a plain dynamic test build that executes a plugin (integration/test.sh's own
# build is static already, and there the lookup returns its plugins: docs/testing.md "One
# build").
#
# The explicit `--target <host triple>` keeps this build in its own directory,
# target/<host triple>/<profile>/, and keeps the flag away from build scripts and proc-macros:
# the workspace's normal build (target/<profile>/, everything else dynamic, ipamd with RELR) is
# not rebuilt or changed. `-p aws-cni` is fine here: this target directory holds nothing else.
# Extra arguments go to `cargo build` (`--release`, `--locked`, `--offline`, `-q`).
set -eu
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
host=$(rustc -vV | sed -n 's/^host: //p')
case "$host" in
  *-linux-gnu) ;;
  *) echo "build-static-plugins.sh: host $host is not a *-linux-gnu target" >&2; exit 1 ;;
esac
# CARGO_ENCODED_RUSTFLAGS outranks RUSTFLAGS and config rustflags: the result is the same
# whatever the caller's environment says. It replaces .cargo/config.toml's flags, so the v0
# mangling the code layout lists are keyed to (docs/performance.md) is repeated here.
CARGO_ENCODED_RUSTFLAGS=$(sh scripts/static-rustflags.sh) \
  exec "$cargo" build --target "$host" -p aws-cni --bin aws-cni --bin egress-cni "$@"
