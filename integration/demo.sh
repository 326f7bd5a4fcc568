#!/usr/bin/env bash
# The main job, one command: bring up a simulated VPC (vpcsim) with 2 m5.large nodes, run the
# real ipamd in each node namespace, create pods with aws-cni, show connectivity and /v1/enis,
# print how to explore, and tear everything down on Ctrl-C (or at the end with --no-hold).
#
#   sudo integration/demo.sh [--pods-per-node N] [--no-hold]
#
# Needs root (network namespaces). Nothing in the machine's root network namespace changes:
# only 127.0.0.1 listeners (the simulator's control API). Builds debug binaries with cargo
# (first build compiles aws-sdk-ec2: several minutes). CARGO_TARGET_DIR is honoured.
#
# The build is `cargo test --workspace --no-run` with scripts/static-build-env.sh's environment,
# the same build `integration/test.sh` makes (static, in target/<host triple>/debug/): `cargo
# build --bins` would resolve dependency features without the dev-dependencies (tokio's
# test-util, for one) and recompile the dependency tree after the tests, and the tests would
# recompile it again after the demo.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "demo.sh: run as root (it creates network namespaces)" >&2
  exit 2
fi
need_apt=()
command -v ip >/dev/null || need_apt+=(iproute2)
command -v iptables >/dev/null || need_apt+=(iptables)
[ -x /bin/busybox ] || need_apt+=(busybox-static)
command -v curl >/dev/null || need_apt+=(curl)
# The integration crate's CRI client (k8s-cri) compiles cri-api's api.proto with protoc.
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "demo.sh: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

. scripts/static-build-env.sh
target="${CARGO_TARGET_DIR:-$PWD/target}"
echo "demo.sh: building the workspace (debug; the same build as the tests, so nothing is rebuilt after integration/test.sh; a first build takes minutes) ..." >&2
start=$(date +%s)
cargo test --workspace --no-run
echo "demo.sh: build done in $(( $(date +%s) - start )) s" >&2
exec "$target/$CARGO_BUILD_TARGET/debug/demo" "$@"
