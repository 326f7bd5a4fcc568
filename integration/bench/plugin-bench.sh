#!/usr/bin/env bash
# Benchmark (not a test): N sequential pods, ADD then DEL, through the same client (cni-bench,
# a libcni-style executor: cnitool is not packaged here) for aws-cni with test-ipamd and for
# the reference ptp + host-local plugins (/usr/lib/cni), inside a throwaway node netns.
# Prints ADD/DEL p50/p90 side by side, the ratios, and each plugin's peak RSS; then aws-cni's
# ADD/DEL with the network-policy agent call (a second test-ipamd answering NetworkPolicyMode
# "none", the npa-standin agent answering without touching the kernel), so the difference is
# the plugin's cost of the call: the dial and one unix-socket round trip.
#
# Usage: integration/bench/plugin-bench.sh [N]   (root; static release aws-cni, debug helpers)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-100}
WARMUP=5
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# aws-cni as the image ships it: the fully static release build (scripts/build-static-plugins.sh,
# target/<host triple>/release/). The helpers (stand-in ipamd, client, agent stand-in) come from
# the workspace's debug build, `cargo test --workspace --no-run`, which the test suite has made
# anyway: a release build of the integration crate compiles the AWS SDK and kube with fat LTO
# for 20 minutes. The debug stand-in ipamd answers more slowly than a release one, and that
# time counts in aws-cni's ADD and DEL, never in ptp's: the ratios are on the safe side.
scripts/build-static-plugins.sh --release -q
out=$(cargo test --workspace --no-run -q 2>&1) || { echo "$out" >&2; exit 1; }
BIN=$CARGO_TARGET_DIR/debug
# AWS_CNI: another plugin binary in its place (scripts/code-order.sh runs it under a profiler)
AWS_CNI=${AWS_CNI:-$CARGO_TARGET_DIR/$(rustc -vV | sed -n 's/^host: //p')/release/aws-cni}

# How much of the code layout (docs/performance.md) the plugin matches: a low count means
# cni-plugin/code-order.txt is stale for it (scripts/code-order.sh plugin).
have=$(nm "$AWS_CNI" 2>/dev/null | awk '{print $NF}' | grep -cxF -f cni-plugin/code-order.txt || true)
echo "code layout: $have of $(grep -c . cni-plugin/code-order.txt) listed functions are in this aws-cni"

TAG="cnit-$$-bench"
NODE="$TAG-node"
DIR=$(mktemp -d "/tmp/$TAG.XXXX")
IPAMD_PID=""
NP_PIDS=""
cleanup() {
  [ -n "$IPAMD_PID" ] && kill "$IPAMD_PID" 2>/dev/null && wait "$IPAMD_PID" 2>/dev/null || true
  for p in $NP_PIDS; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  for ns in $(ip netns list | awk '{print $1}' | grep "^$TAG-" || true); do ip netns del "$ns"; done
  rm -rf "$DIR"
}
trap cleanup EXIT

ip netns add "$NODE"
ip -n "$NODE" link set lo up
ip netns exec "$NODE" sysctl -qw net.ipv4.ip_forward=1
nsenter --net="/var/run/netns/$NODE" -- "$BIN/test-ipamd" --socket "$DIR/ipamd.sock" &
IPAMD_PID=$!
nsenter --net="/var/run/netns/$NODE" -- "$BIN/test-ipamd" --socket "$DIR/ipamd-np.sock" \
  --network-policy-mode none &
NP_PIDS="$!"
nsenter --net="/var/run/netns/$NODE" -- "$BIN/npa-standin" --socket "$DIR/npa.sock" \
  --state-dir "$DIR/npa" 2>"$DIR/npa.log" &
NP_PIDS="$NP_PIDS $!"
for s in ipamd ipamd-np npa; do
  for _ in $(seq 100); do [ -S "$DIR/$s.sock" ] && break; sleep 0.05; done
done

cat > "$DIR/aws-cni.json" <<JSON
{"cniVersion":"1.0.0","name":"bench-aws","type":"aws-cni","mtu":"9001","vethPrefix":"eni",
 "ipamdSocket":"$DIR/ipamd.sock","pluginLogFile":"$DIR/aws-cni.log","pluginLogLevel":"Warn"}
JSON
cat > "$DIR/aws-cni-np.json" <<JSON
{"cniVersion":"1.0.0","name":"bench-aws-np","type":"aws-cni","mtu":"9001","vethPrefix":"eni",
 "ipamdSocket":"$DIR/ipamd-np.sock","npaSocket":"$DIR/npa.sock",
 "pluginLogFile":"$DIR/aws-cni-np.log","pluginLogLevel":"Warn"}
JSON
cat > "$DIR/ptp.json" <<JSON
{"cniVersion":"1.0.0","name":"bench-ptp","type":"ptp","ipMasq":false,"mtu":9001,
 "ipam":{"type":"host-local","subnet":"203.0.113.0/24","dataDir":"$DIR/host-local"}}
JSON

run() { # label plugin conf n extra-args...
  local label=$1 plugin=$2 conf=$3 n=$4; shift 4
  local total=$((n + WARMUP))
  for i in $(seq 0 $((total - 1))); do ip netns add "$TAG-$label-$i"; done
  nsenter --net="/var/run/netns/$NODE" -- "$BIN/cni-bench" --plugin "$plugin" --conf "$conf" \
    --n "$n" --warmup "$WARMUP" --netns-prefix "$TAG-$label" --label "$label" "$@"
  for i in $(seq 0 $((total - 1))); do ip netns del "$TAG-$label-$i"; done
}
# Timing passes (interleaved halves so machine load hits both plugins alike), then RSS passes.
H=$((N / 2))
run aws-cni "$AWS_CNI" "$DIR/aws-cni.json" "$H" > "$DIR/aws-cni.1"
run ptp /usr/lib/cni/ptp "$DIR/ptp.json" "$H" > "$DIR/ptp.1"
run aws-cni-np "$AWS_CNI" "$DIR/aws-cni-np.json" "$H" > "$DIR/aws-cni-np.1"
run aws-cni "$AWS_CNI" "$DIR/aws-cni.json" "$((N - H))" > "$DIR/aws-cni.2"
run ptp /usr/lib/cni/ptp "$DIR/ptp.json" "$((N - H))" > "$DIR/ptp.2"
run aws-cni-np "$AWS_CNI" "$DIR/aws-cni-np.json" "$((N - H))" > "$DIR/aws-cni-np.2"
run aws-cni-rss "$AWS_CNI" "$DIR/aws-cni.json" 10 --rss > "$DIR/aws-cni.rss"
run ptp-rss /usr/lib/cni/ptp "$DIR/ptp.json" 10 --rss > "$DIR/ptp.rss"

python3 - "$DIR" "$N" "$AWS_CNI" <<'PY'
import json, os, sys
d, n, binary = sys.argv[1:4]
def load(label, rss=True):
    parts = [json.load(open(f"{d}/{label}.{i}")) for i in (1, 2)]
    out = {k: parts[0][k] + parts[1][k] for k in ("add_ms", "del_ms")}
    if rss:
        out["rss_kib"] = json.load(open(f"{d}/{label}.rss"))["plugin_maxrss_kib"]
    return out
def pct(xs, p):
    xs = sorted(xs); k = (len(xs) - 1) * p / 100
    lo = int(k); hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
aws, ptp = load("aws-cni"), load("ptp")
print(f"N={n} sequential pods per plugin (ADD then DEL), times in ms")
print(f"{'':10}{'aws-cni':>12}{'ptp+host-local':>16}{'ratio':>8}")
for op in ("add", "del"):
    for p in (50, 90):
        a, r = pct(aws[f"{op}_ms"], p), pct(ptp[f"{op}_ms"], p)
        print(f"{op.upper()} p{p:<5}{a:>12.2f}{r:>16.2f}{a / r:>8.2f}")
ka, kr = aws["rss_kib"], ptp["rss_kib"]
print(f"{'peak RSS':10}{ka / 1024:>10.2f}Mi{kr / 1024:>14.2f}Mi{ka / kr:>8.2f}"
      "   (busybox time, max over 10 ADD+DEL)")
print(f"aws-cni binary: {os.path.getsize(binary) / 1048576:.2f} MiB")
np = load("aws-cni-np", rss=False)
print("network-policy agent call (NetworkPolicyMode=none: EnforceNpToPod/DeletePodNp answered,")
print("nothing enforced), same pods interleaved with the runs above, times in ms")
print(f"{'':10}{'without':>12}{'with agent':>16}{'cost':>8}")
for op in ("add", "del"):
    a, w = pct(aws[f"{op}_ms"], 50), pct(np[f"{op}_ms"], 50)
    print(f"{op.upper()} p50    {a:>12.2f}{w:>16.2f}{w - a:>8.2f}")
print("targets (issue 30): ADD p50 ratio <= 0.50, aws-cni peak RSS <= ptp's; DEL is the kernel's veth deletion for both")
PY
