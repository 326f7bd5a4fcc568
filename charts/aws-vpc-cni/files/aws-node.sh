#!/bin/sh
# Start-up of the aws-node container: the readiness handshake upstream's entrypoint performs.
# The image's ENTRYPOINT (/app/aws-node.sh, as upstream's image starts /app/aws-vpc-cni), so
# the chart and upstream's manifests (no `command`) both run it (docs/image.md).
# Start ipamd; once it answers its health check, fill in the conflist template from this
# container's real environment (aws-cni-conflist: upstream's placeholders and the optional
# bandwidth/tuning plugins) and install it, because kubelet treats the conflist's presence as
# "CNI ready". Then wait for ipamd. Paths can be moved for tests (AWS_NODE_APP_DIR) and, as
# upstream's entrypoint allows, the host conflist directory (HOST_CNI_CONFDIR_PATH) and the host
# CNI bin directory (HOST_CNI_BIN_PATH).
set -eu
app="${AWS_NODE_APP_DIR:-/app}"
conf_dir="${HOST_CNI_CONFDIR_PATH:-/host/etc/cni/net.d}"
bin_dir="${HOST_CNI_BIN_PATH:-/host/opt/cni/bin}"
# Install this image's plugins on the host at every start, atomically (copy, then rename over
# the old one), as upstream's aws-node start-up does (cmd/aws-vpc-cni installs aws-cni and
# egress-cni itself): an aws-node image swapped alone, or restarted, puts the plugin that speaks
# its ipamd's protocol on the node, whichever init image ran before (upstream's installs only the
# reference plugins). The init container installs them too.
for b in aws-cni egress-cni; do
  if ! { cp "$app/$b" "$bin_dir/.$b.aws-node.tmp" && mv -f "$bin_dir/.$b.aws-node.tmp" "$bin_dir/$b"; }; then
    rm -f "$bin_dir/.$b.aws-node.tmp"
    echo "aws-node: could not install $b into $bin_dir (the cni-bin-dir hostPath mount)" >&2
    exit 1
  fi
done
# One malloc arena for ipamd (docs/performance.md, "Memory"): glibc's per-thread arenas keep
# ~2 MiB of freed heap after a burst of ADDs; ipamd waits on I/O, not on the allocator lock. No
# per-thread cache (tcache_count=0, "Round 5"): each runtime and blocking-pool thread's cache
# kept ~1 MiB of freed chunks between them. A GLIBC_TUNABLES of the container's own comes after
# ours and wins.
GLIBC_TUNABLES="glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0${GLIBC_TUNABLES:+:$GLIBC_TUNABLES}" "$app/ipamd" &
pid=$!
# On SIGTERM (kubelet, podman stop) pass it on and exit with ipamd's own status: a bare
# `wait` interrupted by the trapped signal would report 143 instead.
trap 'kill -TERM "$pid" 2>/dev/null || true; wait "$pid"; exit $?' TERM INT
until "$app/grpc-health-probe" -addr=unix:///var/run/aws-node/ipamd.sock >/dev/null 2>&1; do
  kill -0 "$pid" 2>/dev/null || { wait "$pid"; exit $?; }
  sleep 1
done
if ! "$app/aws-cni-conflist" "$app/10-aws.conflist" "$conf_dir/10-aws.conflist"; then
  echo "aws-node: the conflist was not installed; stopping ipamd" >&2
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" || true
  exit 1
fi
wait "$pid"
