#!/usr/bin/env bash
# Before/after comparison of ipamd-bench (issue 16: "the benchmarks' figures do not get worse"):
# builds ipamd + ipamd_bench at two revisions with one profile (release without LTO, the AWS SDK
# at opt-level 0: it is off the benchmark's path, the in-memory provider serves), then runs them
# interleaved (A B A B ...) with the checkpoint on tmpfs so machine load hits both alike, and
# prints each run's figures. Prints figures; asserts nothing.
#
# Each run starts with its two binaries dropped from the page cache: the idle RSS is mostly the
# binary's code pages, and a read fault maps the whole cached folio / fault-around window around
# it, so how a file got into the cache (the linker's writes, cp, an earlier run) moves the figure
# by more than a redesign does (docs/testing.md, "Before/after").
#
# IPAMD_BENCH_PROFILE=shipped builds both with the workspace's own release profile instead (fat
# LTO, one codegen unit: what the image ships; ~40 min per revision on 2 cores, so the two builds
# run side by side, each in its own target dir).
#
# Usage: integration/bench/ipamd-bench-compare.sh <rev-a> <rev-b> [rounds] [pairs]
set -euo pipefail
cd "$(dirname "$0")/../.."
A=${1:?rev-a}
B=${2:?rev-b}
ROUNDS=${3:-3}
N=${4:-2000}
WORK=${IPAMD_BENCH_WORK:-target/bench-compare}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
PROFILE=${IPAMD_BENCH_PROFILE:-cheap}
case "$PROFILE" in cheap | shipped) ;; *) echo "IPAMD_BENCH_PROFILE: cheap or shipped" >&2; exit 2 ;; esac
cleanup() {
  for rev in a b; do git worktree remove --force "$WORK/src-$rev" 2>/dev/null || true; done
}
trap cleanup EXIT
build() { # build <a|b> <rev>
  rm -rf "$WORK/src-$1"
  git worktree add -q --detach "$WORK/src-$1" "$2"
  if [ "$PROFILE" = cheap ]; then
    mkdir -p "$WORK/src-$1/.cargo"
    cat > "$WORK/src-$1/.cargo/config.toml" <<'TOML'
[profile.release]
lto = false
codegen-units = 16
[profile.release.package.aws-sdk-ec2]
opt-level = 0
TOML
  fi
  local target="$WORK/target-$PROFILE"
  [ "$PROFILE" = shipped ] && target="$WORK/target-shipped-$1"
  (cd "$WORK/src-$1" && CARGO_TARGET_DIR="$target" cargo build --release -q -p ipamd --bin ipamd --example ipamd_bench)
  mkdir -p "$WORK/bin-$1"
  cp "$target/release/ipamd" "$target/release/examples/ipamd_bench" "$WORK/bin-$1/"
}
if [ "$PROFILE" = shipped ]; then
  build a "$A" & pa=$!
  build b "$B" & pb=$!
  wait "$pa"
  wait "$pb"
else
  build a "$A"
  build b "$B"
fi
for round in $(seq "$ROUNDS"); do
  for rev in a b; do
    label=$A; [ "$rev" = b ] && label=$B
    echo "== round $round: $label"
    for f in "$WORK/bin-$rev/ipamd" "$WORK/bin-$rev/ipamd_bench"; do
      # drops this file's pages from the page cache (GNU dd: fadvise DONTNEED on the whole file)
      dd if=/dev/null of="$f" oflag=nocache conv=notrunc,fdatasync count=0 status=none
    done
    IPAMD_BENCH_DIR=/dev/shm "$WORK/bin-$rev/ipamd_bench" "$WORK/bin-$rev/ipamd" "$N"
  done
done
