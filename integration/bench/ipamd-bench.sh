#!/usr/bin/env bash
# ipamd benchmark: AddNetwork+DelNetwork round trip over the unix socket (p50/p99, throughput)
# and ipamd resident memory with 250 assignments. Prints figures; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
# The driver (the example), and ipamd as the image ships it: the static build
# (scripts/build-static-ipamd.sh, the layout of ipamd/code-order.txt linked in) with the test-only
# in-memory provider, which the image's build never has. IPAMD=<path> measures another build
# instead, e.g. the dynamic one: `cargo build --release --workspace --bin ipamd --example
# ipamd_bench`, IPAMD=$CARGO_TARGET_DIR/release/ipamd.
cargo build --release -q --workspace --example ipamd_bench
if [ -z "${IPAMD:-}" ]; then
  scripts/build-static-ipamd.sh --release -q --features memory-provider
  IPAMD=$CARGO_TARGET_DIR/$(rustc -vV | sed -n 's/^host: //p')/release/ipamd
fi
# How much of the code layout (docs/performance.md) this build has: a low count means
# ipamd/code-order.txt is stale (scripts/code-order.sh).
echo "code layout: $(scripts/code-layout.sh count ipamd/code-order.txt "$IPAMD") listed functions are in this ipamd ($IPAMD)"
for dir in ${IPAMD_BENCH_DIRS:-/dev/shm /tmp}; do
  echo "== checkpoint on $dir ($(stat -f -c %T "$dir"))"
  IPAMD_BENCH_DIR="$dir" "$CARGO_TARGET_DIR/release/examples/ipamd_bench" "$IPAMD" "${1:-2000}"
done
