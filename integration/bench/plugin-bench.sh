#!/usr/bin/env bash
# Benchmark (not a test): N sequential pods, ADD then DEL, through the same client (cni-bench,
# a libcni-style executor) inside a throwaway node netns, for
#   aws-cni   the static release plugin the image ships, with the real ipamd: the static release
#             build the image ships, plus the test-only in-memory EC2, started as the image
#             starts it (one malloc arena, no tcache), checkpoint on tmpfs, host
#             networking in the node namespace (conntrack ledger included);
#   stand-in  the same plugin with test-ipamd (debug), the answer without a daemon behind it;
#   ptp       the reference ptp + host-local plugins (/usr/lib/cni).
# Prints ADD/DEL p50/p90 side by side with ratios against ptp, each plugin's peak RSS, the ADD's
# per-phase breakdown (the plugin's `ADD phases` log line and ipamd's `AddNetwork assigned`), then
# aws-cni's ADD/DEL with the network-policy agent call (a second test-ipamd answering
# NetworkPolicyMode "none", the npa-standin agent answering without touching the kernel).
#
# Usage: integration/bench/plugin-bench.sh [N]   (root)
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-100}
WARMUP=5
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# aws-cni and ipamd as the image ships them: the fully static release builds
# (scripts/build-static-plugins.sh, scripts/build-static-ipamd.sh with the test-only in-memory
# EC2; target/<host triple>/release/). The helpers (stand-in ipamd, client, agent stand-in) come
# from the workspace's debug build. AWS_CNI=<path> / IPAMD=<path>: other builds in their place
# (scripts/code-order.sh profiles the plugin; a comparison runs an older build).
# IPAMD_READ_CODE_ON_DEMAND=false: the real ipamd keeps readahead (docs/ipamd.md).
host=$(rustc -vV | sed -n 's/^host: //p')
scripts/build-static-plugins.sh --release -q
if [ -z "${IPAMD:-}" ]; then
  scripts/build-static-ipamd.sh --release -q --features memory-provider
fi
out=$(cargo test --workspace --no-run -q 2>&1) || { echo "$out" >&2; exit 1; }
BIN=$CARGO_TARGET_DIR/debug
IPAMD=${IPAMD:-$CARGO_TARGET_DIR/$host/release/ipamd}
# AWS_CNI: another plugin binary in its place (scripts/code-order.sh runs it under a profiler)
AWS_CNI=${AWS_CNI:-$CARGO_TARGET_DIR/$host/release/aws-cni}

# How much of the code layout (docs/performance.md) the plugin matches: a low count means
# cni-plugin/code-order.txt is stale for it (scripts/code-order.sh plugin).
echo "code layout: $(scripts/code-layout.sh count cni-plugin/code-order.txt "$AWS_CNI") listed functions are in this aws-cni"

TAG="cnit-$$-bench"
NODE="$TAG-node"
DIR=$(mktemp -d "/tmp/$TAG.XXXX")
# the real ipamd's checkpoint on tmpfs, as /var/run on a node
SHM=$(mktemp -d "/dev/shm/$TAG.XXXX")
IPAMD_PID=""
REAL_PID=""
NP_PIDS=""
cleanup() {
  [ -n "$IPAMD_PID" ] && kill "$IPAMD_PID" 2>/dev/null && wait "$IPAMD_PID" 2>/dev/null || true
  [ -n "$REAL_PID" ] && kill "$REAL_PID" 2>/dev/null && wait "$REAL_PID" 2>/dev/null || true
  for p in $NP_PIDS; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  for ns in $(ip netns list | awk '{print $1}' | grep "^$TAG-" || true); do ip netns del "$ns"; done
  rm -rf "$DIR" "$SHM"
}
trap cleanup EXIT

ip netns add "$NODE"
ip -n "$NODE" link set lo up
ip netns exec "$NODE" sysctl -qw net.ipv4.ip_forward=1
nsenter --net="/var/run/netns/$NODE" -- "$BIN/test-ipamd" --socket "$DIR/ipamd.sock" &
IPAMD_PID=$!
nsenter --net="/var/run/netns/$NODE" -- env -i PATH="$PATH" ENABLE_IPv4=true \
  IPAMD_ENI_PROVIDER=memory IPAMD_MEMORY_PROVIDER=subnet=198.18.0.0/22,max_enis=10,ipv4_per_eni=50 \
  AWS_VPC_K8S_CNI_BACKING_STORE="$SHM/ipam.json" IPAMD_SOCKET_PATH="$DIR/real.sock" \
  AWS_VPC_K8S_CNI_LOG_FILE="$DIR/ipamd.log" AWS_VPC_K8S_CNI_LOGLEVEL=INFO \
  IPAMD_READ_CODE_ON_DEMAND="${IPAMD_READ_CODE_ON_DEMAND:-true}" \
  GLIBC_TUNABLES=glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0 "$IPAMD" >"$DIR/ipamd.out" 2>&1 &
REAL_PID=$!
nsenter --net="/var/run/netns/$NODE" -- "$BIN/test-ipamd" --socket "$DIR/ipamd-np.sock" \
  --network-policy-mode none &
NP_PIDS="$!"
nsenter --net="/var/run/netns/$NODE" -- "$BIN/npa-standin" --socket "$DIR/npa.sock" \
  --state-dir "$DIR/npa" 2>"$DIR/npa.log" &
NP_PIDS="$NP_PIDS $!"
for s in ipamd ipamd-np npa real; do
  for _ in $(seq 100); do [ -S "$DIR/$s.sock" ] && break; sleep 0.05; done
done

cat > "$DIR/aws-cni.json" <<JSON
{"cniVersion":"1.0.0","name":"bench-aws","type":"aws-cni","mtu":"9001","vethPrefix":"eni",
 "ipamdSocket":"$DIR/real.sock","pluginLogFile":"$DIR/aws-cni.log","pluginLogLevel":"Warn"}
JSON
cat > "$DIR/stand-in.json" <<JSON
{"cniVersion":"1.0.0","name":"bench-aws","type":"aws-cni","mtu":"9001","vethPrefix":"eni",
 "ipamdSocket":"$DIR/ipamd.sock","pluginLogFile":"$DIR/stand-in.log","pluginLogLevel":"Warn"}
JSON
cat > "$DIR/phases.json" <<JSON
{"cniVersion":"1.0.0","name":"bench-aws","type":"aws-cni","mtu":"9001","vethPrefix":"eni",
 "ipamdSocket":"$DIR/real.sock","pluginLogFile":"$DIR/phases.log","pluginLogLevel":"Debug"}
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
for half in 1 2; do
  n=$H; [ $half = 2 ] && n=$((N - H))
  run aws-cni "$AWS_CNI" "$DIR/aws-cni.json" "$n" > "$DIR/aws-cni.$half"
  run ptp /usr/lib/cni/ptp "$DIR/ptp.json" "$n" > "$DIR/ptp.$half"
  run stand-in "$AWS_CNI" "$DIR/stand-in.json" "$n" > "$DIR/stand-in.$half"
  run aws-cni-np "$AWS_CNI" "$DIR/aws-cni-np.json" "$n" > "$DIR/aws-cni-np.$half"
done
run aws-cni-rss "$AWS_CNI" "$DIR/aws-cni.json" 10 --rss > "$DIR/aws-cni.rss"
run ptp-rss /usr/lib/cni/ptp "$DIR/ptp.json" 10 --rss > "$DIR/ptp.rss"
# the breakdown's pass: the plugin logs its phases at debug level (their cost stays out of the
# timing passes above)
run phases "$AWS_CNI" "$DIR/phases.json" "$H" > "$DIR/phases.times"
IPAMD_RSS=$(awk '/^VmHWM/ {print $2}' "/proc/$REAL_PID/status")
# pages ipamd waited to read from a file: its binary's code, read on demand after start-up
# (docs/performance.md, "Pages touched, not windows"); the 12th field of /proc/<pid>/stat
IPAMD_MAJFLT=$(awk '{print $12}' "/proc/$REAL_PID/stat")

python3 - "$DIR" "$N" "$AWS_CNI" "$IPAMD_RSS" <<'PY'
import json, os, sys
d, n, binary, ipamd_rss = sys.argv[1:5]
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
aws, ptp, stand = load("aws-cni"), load("ptp"), load("stand-in", rss=False)
print(f"N={n} sequential pods per plugin (ADD then DEL), times in ms")
print(f"{'':10}{'aws-cni+ipamd':>14}{'ptp+host-local':>16}{'ratio':>8}{'aws-cni+stand-in':>18}{'ratio':>8}")
for op in ("add", "del"):
    for p in (50, 90, 99):
        a, r, s = pct(aws[f"{op}_ms"], p), pct(ptp[f"{op}_ms"], p), pct(stand[f"{op}_ms"], p)
        print(f"{op.upper()} p{p:<5}{a:>14.2f}{r:>16.2f}{a / r:>8.2f}{s:>18.2f}{s / r:>8.2f}")
print(f"ipamd (release, real) peak RSS over the run: {int(ipamd_rss) / 1024:.2f} MiB")
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
# Per-phase breakdown of aws-cni's ADD (the debug-level pass): the plugin's own phases, and the
# process start before `run` (the client's wall time minus the plugin's total).
def lines(path, msg):
    out = []
    for l in open(path):
        try:
            j = json.loads(l)
        except ValueError:
            continue
        if j.get("msg") == msg:
            out.append(j)
    return out
ph = lines(f"{d}/phases.log", "ADD phases")
wall = json.load(open(f"{d}/phases.times"))["add_ms"]
if ph:
    us = lambda k: [int(p[k]) / 1000 for p in ph]
    rows = [("process start to run()", [w - t for w, t in zip(sorted(wall), sorted(us("total_us")))]),
            ("config, logging, runtime, netns, netlink", us("start_us")),
            ("address and veth pair, overlapped:", us("address_and_link_us")),
            ("  ipamd connect + AddNetwork", us("ipamd_us")),
            ("  veth pair created (pod netns)", us("link_us")),
            ("decode and plan", us("plan_us")),
            ("netlink: addresses, routes, rules, ARP", us("wiring_us")),
            ("network-policy agent (not enabled)", us("policy_us"))]
    print("aws-cni ADD per phase (debug-level pass), p50 in ms")
    for name, xs in rows:
        print(f"  {name:<42}{pct(xs, 50):>8.2f}")
    print(f"  {'total (client wall time)':<42}{pct(wall, 50):>8.2f}")
ip = lines(f"{d}/ipamd.log", "AddNetwork assigned")
if ip:
    print("inside ipamd's AddNetwork, p50 in ms (all passes)")
    print(f"  {'index and checkpoint write':<42}{pct([int(x['assign_us']) / 1000 for x in ip], 50):>8.2f}")
    print(f"  {'conntrack check (ledger or walk)':<42}{pct([int(x['conntrack_us']) / 1000 for x in ip], 50):>8.2f}")
print("targets (issue 40): ADD p50 ratio <= 0.33 with the real ipamd, aws-cni peak RSS <= 0.75x ptp's; DEL is the kernel's veth deletion for both")
PY
echo "ipamd: $IPAMD_MAJFLT major page faults over the run (pages read from a file, its binary's code among them)"
