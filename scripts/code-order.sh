#!/bin/sh
# Regenerates the linker symbol-ordering files (docs/performance.md, "Code layout"):
#   ipamd   ipamd/code-order.txt: the functions ipamd executes while it starts, fills its pool,
#           serves ADD/DEL (one client and 16), holds 250 pods and stops
#           (integration/bench/ipamd-bench.sh's workload, on that benchmark's build);
#   plugin  cni-plugin/code-order.txt: the functions aws-cni executes for ADD and DEL, with and
#           without the network-policy agent (integration/bench/plugin-bench.sh's workload, on
#           the static build the image ships);
#   image   ipamd/code-order.txt for the image's build of ipamd on the EC2 path (a 2-node fleet
#           on the simulated VPC, see below).
# Each binary runs under valgrind's callgrind (function level; no timings are used);
# scripts/code-order.py lists what executed. The new entries go first and the old file's stay
# behind them (another build variant's symbols: see code-order.py). Root (namespaces), valgrind.
# Usage: scripts/code-order.sh [ipamd|plugin|image]...   (ipamd and plugin by default)
set -eu
cd "$(dirname "$0")/.."
root=$PWD
valgrind=$(command -v valgrind) || { echo "code-order.sh: needs valgrind (apt install valgrind)" >&2; exit 1; }
work=$(mktemp -d /tmp/code-order.XXXXXX)
trap 'rm -rf "$work"' EXIT
wrap() { # wrapper binary name: a script that runs binary under callgrind
  cat > "$work/$1" <<EOF
#!/bin/sh
exec $valgrind -q --tool=callgrind --demangle=no --callgrind-out-file=$work/$1.%p.cg "$2" "\$@"
EOF
  chmod +x "$work/$1"
}
for what in ${@:-ipamd plugin}; do
  case $what in
    ipamd)
      target=${CARGO_TARGET_DIR:-$root/target/bench}
      CARGO_TARGET_DIR=$target cargo build --release -q -p ipamd --bin ipamd --example ipamd_bench
      wrap ipamd "$target/release/ipamd"
      IPAMD_BENCH_DIR=/dev/shm "$target/release/examples/ipamd_bench" "$work/ipamd" 64
      python3 scripts/code-order.py ipamd/code-order.txt ipamd "$work"/ipamd.*.cg \
        --keep ipamd/code-order.txt
      ;;
    plugin)
      target=${CARGO_TARGET_DIR:-$root/target}
      scripts/build-static-plugins.sh --release -q
      host=$(rustc -vV | sed -n 's/^host: //p')
      wrap aws-cni "$target/$host/release/aws-cni"
      AWS_CNI="$work/aws-cni" integration/bench/plugin-bench.sh 4
      python3 scripts/code-order.py cni-plugin/code-order.txt aws-cni "$work"/aws-cni.*.cg \
        --keep cni-plugin/code-order.txt
      ;;
    image)
      # The image's ipamd (`cargo build --release --workspace --bins`: the workspace's feature
      # set, so other symbol hashes than the benchmark's) on the EC2 path: a 2-node fleet on the
      # simulated VPC (node init, IMDS, EC2, netlink, iptables, a storm of 30 pods per node, one
      # real aws-cni pod each). The driver runs the `ipamd` next to itself: the debug `demo` is
      # copied into target/release and ipamd is swapped for the profiling wrapper meanwhile.
      target=${CARGO_TARGET_DIR:-$root/target}
      cargo build --release -q --workspace --bins
      out=$(cargo test --workspace --no-run -q 2>&1) || { echo "$out" >&2; exit 1; }  # the debug demo
      rel=$target/release
      mv "$rel/ipamd" "$rel/ipamd.profiled"
      trap 'mv "$rel/ipamd.profiled" "$rel/ipamd"; rm -f "$rel/demo-profile"; rm -rf "$work"' EXIT
      wrap ipamd "$rel/ipamd.profiled"
      cp "$work/ipamd" "$rel/ipamd"
      cp "$target/debug/demo" "$rel/demo-profile"
      "$rel/demo-profile" fleet --nodes 2 --pods 30 --cni-pods 1 --churn-seconds 0 \
        --idle-seconds 0 --shrink-pods 0 --out "$work/fleet" >"$work/fleet.log" 2>&1 \
        || { tail -20 "$work/fleet.log" >&2; exit 1; }
      tail -3 "$work/fleet.log"
      python3 scripts/code-order.py ipamd/code-order.txt ipamd.profiled "$work"/ipamd.*.cg \
        --keep ipamd/code-order.txt
      ;;
    *) echo "code-order.sh: unknown '$what' (ipamd, plugin, image)" >&2; exit 2 ;;
  esac
done
