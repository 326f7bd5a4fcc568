#!/bin/sh
# Regenerates the code layout lists (docs/performance.md, "Code layout"): the functions a
# workload executes, by key (demangled path without hashes: scripts/code-layout.sh), which the
# workspace's linker puts first and together in `.text` of every optimised build.
#   ipamd   the release ipamd (`cargo build --release --workspace --bins --example ipamd_bench`:
#           the image's command, plus the benchmark) under the benchmark's workload: start, pool
#           fill, ADD/DEL from one client and 16, 250 pods, SIGTERM (ipamd-bench.sh);
#   image   the same ipamd on the EC2 path: a 2-node fleet on the simulated VPC (node init, IMDS,
#           EC2 through the SDK, netlink, iptables, 30 pods per node, one real aws-cni pod each);
#   plugin  the static release aws-cni the image ships, under plugin-bench.sh's ADD and DEL (with
#           and without the network-policy agent).
# `ipamd` and `image` write ipamd/code-order.txt, `plugin` cni-plugin/code-order.txt. A list whose
# workloads all ran is written afresh; otherwise the old entries stay behind the new ones.
# Each binary runs under valgrind's callgrind (function level; no timings are used);
# scripts/code-order.py lists what executed. Root (namespaces), valgrind, binutils.
# Usage: sudo scripts/code-order.sh [ipamd|image|plugin]...   (all three by default)
set -eu
cd "$(dirname "$0")/.."
root=$PWD
valgrind=$(command -v valgrind) || { echo "code-order.sh: needs valgrind (apt install valgrind)" >&2; exit 1; }
work=$(mktemp -d /tmp/code-order.XXXXXX)
target=${CARGO_TARGET_DIR:-$root/target}
rel=$target/release
restore=""
trap 'if [ -n "$restore" ]; then mv "$rel/ipamd.orig" "$rel/ipamd"; rm -f "$rel/demo-profile"; fi; rm -rf "$work"' EXIT
wrap() { # wrapper binary name: a script that runs binary under callgrind
  cat > "$work/$1" <<EOW
#!/bin/sh
exec $valgrind -q --tool=callgrind --demangle=no --callgrind-out-file=$work/$1.%p.cg "$2" "\$@"
EOW
  chmod +x "$work/$1"
}
what=${*:-ipamd image plugin}
case " $what " in *" ipamd "* | *" image "*)
  # CODE_ORDER_BUILT=1: profile the release build already there (keys name functions, so a
  # build a commit behind profiles the same list but for what that commit changed)
  [ -n "${CODE_ORDER_BUILT:-}" ] \
    || CARGO_TARGET_DIR=$target cargo build --release -q --workspace --bins --example ipamd_bench
  # both workloads profile this one copy (callgrind names the object by its path)
  cp "$rel/ipamd" "$work/ipamd" ;;
esac
ipamd_profiles="" ipamd_runs=0 plugin_profiles=""
for w in $what; do
  case $w in
    ipamd)
      wrap ipamd-bench "$work/ipamd"
      IPAMD_BENCH_DIR=/dev/shm "$rel/examples/ipamd_bench" "$work/ipamd-bench" 64
      ipamd_profiles="$ipamd_profiles $(ls "$work"/ipamd-bench.*.cg)"
      ipamd_runs=$((ipamd_runs + 1))
      ;;
    image)
      # The fleet driver runs the `ipamd` next to itself: the debug `demo` is copied into
      # target/release and ipamd is swapped for the profiling wrapper meanwhile.
      out=$(cargo test --workspace --no-run -q 2>&1) || { echo "$out" >&2; exit 1; }  # the debug demo
      mv "$rel/ipamd" "$rel/ipamd.orig"
      restore=yes
      wrap ipamd-image "$work/ipamd"
      cp "$work/ipamd-image" "$rel/ipamd"
      cp "$target/debug/demo" "$rel/demo-profile"
      "$rel/demo-profile" fleet --nodes 2 --pods 30 --cni-pods 1 --churn-seconds 0 \
        --idle-seconds 0 --shrink-pods 0 --out "$work/fleet" >"$work/fleet.log" 2>&1 \
        || { tail -20 "$work/fleet.log" >&2; exit 1; }
      tail -3 "$work/fleet.log"
      mv "$rel/ipamd.orig" "$rel/ipamd"
      rm -f "$rel/demo-profile"
      restore=""
      # the EC2 path first: it is what nodes run
      ipamd_profiles="$(ls "$work"/ipamd-image.*.cg) $ipamd_profiles"
      ipamd_runs=$((ipamd_runs + 1))
      ;;
    plugin)
      scripts/build-static-plugins.sh --release -q
      host=$(rustc -vV | sed -n 's/^host: //p')
      wrap aws-cni "$target/$host/release/aws-cni"
      # (the plugin's profile does not depend on which ipamd answers: a release ipamd already
      # built serves, else the bench builds the static one)
      if [ -x "$rel/ipamd" ]; then
        AWS_CNI="$work/aws-cni" IPAMD="$rel/ipamd" integration/bench/plugin-bench.sh 4
      else
        AWS_CNI="$work/aws-cni" integration/bench/plugin-bench.sh 4
      fi
      plugin_profiles=$(ls "$work"/aws-cni.*.cg)
      ;;
    *) echo "code-order.sh: unknown '$w' (ipamd, image, plugin)" >&2; exit 2 ;;
  esac
done
if [ -n "$ipamd_profiles" ]; then
  keep=""
  [ "$ipamd_runs" -lt 2 ] && keep="--keep ipamd/code-order.txt"
  # shellcheck disable=SC2086 # word splitting of the profile list and the option is meant
  python3 scripts/code-order.py ipamd/code-order.txt ipamd $ipamd_profiles $keep
fi
if [ -n "$plugin_profiles" ]; then
  # shellcheck disable=SC2086
  python3 scripts/code-order.py cni-plugin/code-order.txt aws-cni $plugin_profiles
fi
