#!/bin/sh
# Regenerates the linker symbol-ordering files (docs/performance.md, "Code layout"):
#   ipamd/code-order.txt       the functions ipamd executes while it starts, fills its pool,
#                              serves ADD/DEL (one client and 16), holds 250 pods and stops
#                              (integration/bench/ipamd-bench.sh's workload, its build);
#   cni-plugin/code-order.txt  the functions aws-cni executes for ADD and DEL, with and without
#                              the network-policy agent (integration/bench/plugin-bench.sh's
#                              workload, on the static build the image ships).
# Each binary runs under valgrind's callgrind (function-level, no timing use); scripts/
# code-order.py lists what executed. Entries of the old file stay behind the new ones (another
# build's symbols: see code-order.py). Root (the plugin workload makes namespaces), valgrind.
# Usage: scripts/code-order.sh [ipamd|plugin]...   (both by default)
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
    *) echo "code-order.sh: unknown '$what' (ipamd, plugin)" >&2; exit 2 ;;
  esac
done
