#!/bin/sh
# Regenerates the code layout lists (docs/performance.md, "Code layout"): the functions a
# workload executes, by key (demangled path without hashes: scripts/code-layout.sh; a C
# function of the static build's libc by its name), which the workspace's linker puts first and
# together in `.text` of every optimised build.
#   ipamd   the image's static release ipamd (scripts/build-static-ipamd.sh, with the test-only
#           in-memory EC2 the benchmark drives) under the benchmark's workload: start, pool
#           fill, ADD/DEL from one client and 16, 250 pods, SIGTERM (ipamd-bench.sh);
#   image   the same ipamd on the EC2 path: a 2-node fleet on the simulated VPC (node init, IMDS,
#           EC2 through the SDK, netlink, iptables, 30 pods per node, one real aws-cni pod each);
#   plugin  the static release aws-cni the image ships, under plugin-bench.sh's ADD and DEL (with
#           and without the network-policy agent).
# ipamd's profiles are cut where start-up ends: callgrind dumps when ipamd first gives its code
# pages back (ipamd::residency::release, called once it can hand out an address), so the list
# holds the steady state's functions first (what runs again after the release: ADD/DEL, the
# pool's passes, EC2 calls of a growing pool) and start-up's own after them — the pages the
# release gives back for good.
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
host=$(rustc -vV | sed -n 's/^host: //p')
restore=""
trap 'if [ -n "$restore" ]; then rm -f "$rel/ipamd"; [ ! -e "$rel/ipamd.orig" ] || mv "$rel/ipamd.orig" "$rel/ipamd"; rm -f "$rel/demo-profile"; fi; rm -rf "$work"' EXIT
wrap() { # wrapper binary name [callgrind option]: a script that runs binary under callgrind
  cat > "$work/$1" <<EOW
#!/bin/sh
exec $valgrind -q --tool=callgrind --demangle=no ${3:-} --callgrind-out-file=$work/$1.%p.cg "$2" "\$@"
EOW
  chmod +x "$work/$1"
}
# where ipamd's start-up ends (v0 symbol of ipamd::residency::release): a dump, part .1
cut="--dump-before=*9residency7release"
# profiles of one workload: the steady state's parts (after the first release: .2, .3, ... and
# the last, unnumbered one), or start-up's (.1)
steady() { ls "$work/$1".*.cg; ls "$work/$1".*.cg.* 2>/dev/null | grep -v '\.cg\.1$' || true; }
startup() { ls "$work/$1".*.cg.1 2>/dev/null || true; }
what=${*:-ipamd image plugin}
case " $what " in *" ipamd "* | *" image "*)
  # CODE_ORDER_BUILT=1: profile the release builds already there (keys name functions, so a
  # build a commit behind profiles the same list but for what that commit changed)
  if [ -z "${CODE_ORDER_BUILT:-}" ]; then
    CARGO_TARGET_DIR=$target cargo build --release -q --workspace --example ipamd_bench
    CARGO_TARGET_DIR=$target scripts/build-static-ipamd.sh --release -q --features memory-provider
  fi
  # both workloads profile this one copy (callgrind names the object by its path)
  cp "$target/$host/release/ipamd" "$work/ipamd" ;;
esac
ipamd_steady="" ipamd_startup="" ipamd_runs=0 plugin_profiles=""
for w in $what; do
  case $w in
    ipamd)
      wrap ipamd-bench "$work/ipamd" "$cut"
      IPAMD_BENCH_DIR=/dev/shm "$rel/examples/ipamd_bench" "$work/ipamd-bench" 64
      ipamd_steady="$ipamd_steady $(steady ipamd-bench)"
      ipamd_startup="$ipamd_startup $(startup ipamd-bench)"
      ipamd_runs=$((ipamd_runs + 1))
      ;;
    image)
      # The fleet driver runs the `ipamd` next to itself: the debug `demo` is copied into
      # target/release and ipamd is swapped for the profiling wrapper meanwhile.
      out=$(cargo test --workspace --no-run -q 2>&1) || { echo "$out" >&2; exit 1; }  # the debug demo
      [ ! -e "$rel/ipamd" ] || mv "$rel/ipamd" "$rel/ipamd.orig"
      restore=yes
      wrap ipamd-image "$work/ipamd" "$cut"
      cp "$work/ipamd-image" "$rel/ipamd"
      cp "$target/debug/demo" "$rel/demo-profile"
      "$rel/demo-profile" fleet --nodes 2 --pods 30 --cni-pods 1 --churn-seconds 0 \
        --idle-seconds 0 --shrink-pods 0 --out "$work/fleet" >"$work/fleet.log" 2>&1 \
        || { tail -20 "$work/fleet.log" >&2; exit 1; }
      tail -3 "$work/fleet.log"
      rm -f "$rel/ipamd" "$rel/demo-profile"
      [ ! -e "$rel/ipamd.orig" ] || mv "$rel/ipamd.orig" "$rel/ipamd"
      restore=""
      # the EC2 path first: it is what nodes run
      ipamd_steady="$(steady ipamd-image) $ipamd_steady"
      ipamd_startup="$(startup ipamd-image) $ipamd_startup"
      ipamd_runs=$((ipamd_runs + 1))
      ;;
    plugin)
      scripts/build-static-plugins.sh --release -q
      wrap aws-cni "$target/$host/release/aws-cni"
      # (the plugin's profile does not depend on which ipamd answers: a release ipamd already
      # built serves, else the bench builds the static one)
      if [ -x "$target/$host/release/ipamd" ]; then
        AWS_CNI="$work/aws-cni" IPAMD="$target/$host/release/ipamd" integration/bench/plugin-bench.sh 4
      else
        AWS_CNI="$work/aws-cni" integration/bench/plugin-bench.sh 4
      fi
      plugin_profiles=$(ls "$work"/aws-cni.*.cg)
      ;;
    *) echo "code-order.sh: unknown '$w' (ipamd, image, plugin)" >&2; exit 2 ;;
  esac
done
if [ -n "$ipamd_steady" ]; then
  keep=""
  [ "$ipamd_runs" -lt 2 ] && keep="--keep ipamd/code-order.txt"
  # the steady state's functions first, then what only start-up ran
  # shellcheck disable=SC2086 # word splitting of the profile list and the option is meant
  python3 scripts/code-order.py ipamd/code-order.txt ipamd $ipamd_steady -- $ipamd_startup $keep
fi
if [ -n "$plugin_profiles" ]; then
  # shellcheck disable=SC2086
  python3 scripts/code-order.py cni-plugin/code-order.txt aws-cni $plugin_profiles
fi
