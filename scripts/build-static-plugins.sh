#!/bin/sh
# Builds the two CNI plugins that run on the node, `aws-cni` and `egress-cni`, fully static
# against glibc (`-C target-feature=+crt-static`: no ELF interpreter, no NEEDED libraries) and
# non-PIE (`-C relocation-model=static`: ET_EXEC at a fixed address, nothing to relocate at
# start; without it, a static-pie), as upstream's Go plugins are. docs/image.md ("glibc") says
# why glibc and not musl, and what the fixed address costs (no ASLR for the binary's image).
# scripts/build-static-ipamd.sh builds ipamd with the same flags (scripts/static-build-env.sh).
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
# --target <host triple> and the static flags (and the host check): scripts/static-build-env.sh.
. scripts/static-build-env.sh
exec "$cargo" build -p aws-cni --bin aws-cni --bin egress-cni "$@"
