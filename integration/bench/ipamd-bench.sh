#!/usr/bin/env bash
# ipamd benchmark: AddNetwork+DelNetwork round trip over the unix socket (p50/p99, throughput)
# and ipamd resident memory with 250 assignments. Prints figures; asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
# The image's build command (`--workspace --bins`, the layout of ipamd/code-order.txt linked in)
# plus the benchmark, whose dev-dependency compiles the test-only in-memory provider into ipamd.
cargo build --release -q --workspace --bins --example ipamd_bench
# How much of the code layout (docs/performance.md) this build has: a low count means
# ipamd/code-order.txt is stale (scripts/code-order.sh).
echo "code layout: $(scripts/code-layout.sh count ipamd/code-order.txt "$CARGO_TARGET_DIR/release/ipamd") listed functions are in this ipamd"
for dir in /dev/shm /tmp; do
  echo "== checkpoint on $dir ($(stat -f -c %T "$dir"))"
  IPAMD_BENCH_DIR="$dir" "$CARGO_TARGET_DIR/release/examples/ipamd_bench" "$CARGO_TARGET_DIR/release/ipamd" "${1:-2000}"
done
