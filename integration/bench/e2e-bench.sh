#!/usr/bin/env bash
# End-to-end benchmarks on the simulated VPC (printed, never asserted):
#  - empty-pool ADD latency against the simulated EC2 latency (target <= EC2 latency + 50 ms);
#  - EC2 calls per pod created / deleted and per idle node-hour (target: no mutating call at
#    steady state, at most one Describe per 5 min per idle node).
#
#   sudo integration/bench/e2e-bench.sh [--latencies 0,100,250,500] [--adds 6] [--pods 20] [--idle-seconds 330]
#
# Root (network namespaces). Debug build by default (ADD latency here is dominated by the
# simulated EC2 latency); PROFILE=release builds release binaries (slow: ~12 min cold).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "e2e-bench.sh: run as root" >&2; exit 2; }
target="${CARGO_TARGET_DIR:-$PWD/target}"
profile="${PROFILE:-debug}"
if [ "$profile" = release ]; then
  cargo build --release --workspace --bins
else
  cargo build --workspace --bins
fi
exec "$target/$profile/demo" bench "$@"
