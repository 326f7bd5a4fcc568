#!/bin/sh
# Builds ipamd fully static against glibc, non-PIE: the same flags as the two CNI plugins
# (scripts/build-static-plugins.sh: `+crt-static`, `-C relocation-model=static`, v0 mangling),
# into the same per-target directory, target/<host triple>/<profile>/ipamd. Why ipamd runs
# static although it runs in the image beside Debian's glibc: memory (no shared libraries
# mapped: libc, libm, ld.so and libgcc_s were 2.1 MiB of its RSS; no relocated data), and why
# its name lookups still work: docs/performance.md, "Round 5", and docs/image.md ("glibc").
# Used by the Dockerfile (`--release --locked`), by the benchmarks (`--release --features
# memory-provider`: the test-only in-memory EC2, which the image's build never has) and by the
# image test's lookup in a plain dynamic test build (integration/test.sh's own build is static
# already: docs/testing.md, "One build"). The flags: scripts/static-build-env.sh.
#
# `-p ipamd` is fine here: this target directory holds only the static builds. Extra arguments
# go to `cargo build` (`--release`, `--locked`, `--offline`, `-q`, `--features ...`).
set -eu
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
# --target <host triple> and the static flags (and the host check): scripts/static-build-env.sh.
. scripts/static-build-env.sh
exec "$cargo" build -p ipamd --bin ipamd "$@"
