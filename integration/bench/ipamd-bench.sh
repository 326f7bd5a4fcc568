#!/usr/bin/env bash
# ipamd benchmark: AddNetwork+DelNetwork round trip over the unix socket (p50/p99, throughput)
# and ipamd resident memory with 250 assignments. Prints figures; asserts nothing.
# Release build in its own target dir so it never disturbs debug builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/bench}"
cargo build --release -q -p ipamd --bin ipamd --example ipamd_bench
# How much of the code layout (docs/performance.md) this build matches: a low count means
# ipamd/code-order.txt is stale for it (scripts/code-order.sh).
have=$(nm "$CARGO_TARGET_DIR/release/ipamd" 2>/dev/null | awk '{print $NF}' | grep -cxF -f ipamd/code-order.txt || true)
echo "code layout: $have of $(grep -c . ipamd/code-order.txt) listed functions are in this ipamd"
for dir in /dev/shm /tmp; do
  echo "== checkpoint on $dir ($(stat -f -c %T "$dir"))"
  IPAMD_BENCH_DIR="$dir" "$CARGO_TARGET_DIR/release/examples/ipamd_bench" "$CARGO_TARGET_DIR/release/ipamd" "${1:-2000}"
done
