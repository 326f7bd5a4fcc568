#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs what the tests need when it is missing,
# then builds every test tier with `cargo test --workspace --no-run` and runs the test binaries in
# parallel lanes (integration/run-tests.py).
#
# Needs root: kernel tests create (and always delete) their own network namespaces. Nothing in
# the machine's root network namespace is changed.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v ip >/dev/null || need_apt+=(iproute2)
command -v iptables >/dev/null || need_apt+=(iptables)
command -v nft >/dev/null || need_apt+=(nftables)
command -v ctr >/dev/null || need_apt+=(containerd)
command -v runc >/dev/null || need_apt+=(runc)
command -v podman >/dev/null || need_apt+=(podman)
[ -x /usr/lib/cni/ptp ] || need_apt+=(containernetworking-plugins)
command -v promtool >/dev/null || need_apt+=(prometheus)
[ -x /bin/busybox ] || need_apt+=(busybox-static)
command -v jq >/dev/null || need_apt+=(jq)
# The support collector test lints scripts/aws-cni-support.sh.
command -v shellcheck >/dev/null || need_apt+=(shellcheck)
command -v curl >/dev/null || need_apt+=(curl)
# The integration crate's CRI client (k8s-cri: cri-api's api.proto, compiled with protoc).
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
# The image test (integration/tests/image.rs): podman builds the Dockerfile (buildah inside),
# debootstrap bootstraps debian:bookworm-slim from
# Debian's packages (no registry pull), uidmap is podman's id-mapping helper.
command -v buildah >/dev/null || need_apt+=(buildah)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v newuidmap >/dev/null || need_apt+=(uidmap)
# The migration tests (integration/tests/migration.rs) build integration/upstream-ipam with Go.
command -v go >/dev/null || need_apt+=(golang-go)
# e2e_ipv6.rs builds integration/cnitool (a CNI client on libcni) from Debian's libcni source.
[ -d /usr/share/gocode/src/github.com/containernetworking/cni/libcni ] \
  || need_apt+=(golang-github-appc-cni-dev)
# scripts/build-reference-plugins.sh builds the reference plugins the image ships (portmap,
# host-local, ...) static from Debian's source package: Go sources of their imports, and
# dpkg-source to unpack the plugins' own.
[ -d /usr/share/gocode/src/github.com/containernetworking/plugins ] \
  || need_apt+=(golang-github-containernetworking-plugins-dev)
[ -d /usr/share/gocode/src/github.com/mattn/go-shellwords ] \
  || need_apt+=(golang-github-mattn-go-shellwords-dev)
[ -d /usr/share/gocode/src/github.com/networkplumbing/go-nft ] \
  || need_apt+=(golang-github-networkplumbing-go-nft-dev)
[ -d /usr/share/gocode/src/github.com/godbus/dbus ] || need_apt+=(golang-dbus-dev)
[ -d /usr/share/gocode/src/github.com/d2g/dhcp4 ] || need_apt+=(golang-github-d2g-dhcp4-dev)
[ -d /usr/share/gocode/src/github.com/d2g/dhcp4client ] \
  || need_apt+=(golang-github-d2g-dhcp4client-dev)
[ -d /usr/share/gocode/src/github.com/coreos/go-systemd ] \
  || need_apt+=(golang-github-coreos-go-systemd-dev)
command -v dpkg-source >/dev/null || need_apt+=(dpkg-dev)
command -v readelf >/dev/null || need_apt+=(binutils)
# The test VM (integration/vm/run.sh, docs/testing.md "Tests in a VM"): qemu with its
# virtiofsd, and Debian's cloud kernel with the modules this machine's kernel lacks.
command -v qemu-system-x86_64 >/dev/null || need_apt+=(qemu-system-x86)
# (Debian 12 ships virtiofsd with qemu; from Debian 13 on it is its own package.)
[ -x /usr/lib/qemu/virtiofsd ] || [ -x /usr/libexec/virtiofsd ] \
  || { apt-cache show virtiofsd >/dev/null 2>&1 && need_apt+=(virtiofsd); } \
  || need_apt+=(qemu-system-x86)
ls /boot/vmlinuz-*-cloud-amd64 >/dev/null 2>&1 || need_apt+=(linux-image-cloud-amd64)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "test.sh: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Debian's kubectl (kubernetes-client) for kubesim's cross-check. Its /usr/bin/kubectl clashes
# with another package's kubectl on some images, so it is unpacked into its own prefix.
KUBECTL_PREFIX=/usr/local/lib/kubernetes-client
if [ ! -x "$KUBECTL_PREFIX/usr/bin/kubectl" ]; then
  echo "test.sh: unpacking Debian's kubernetes-client into $KUBECTL_PREFIX" >&2
  deb_dir=$(mktemp -d)
  (cd "$deb_dir" && { apt-get download kubernetes-client 2>/dev/null || { apt-get update -qq && apt-get download kubernetes-client; }; })
  mkdir -p "$KUBECTL_PREFIX"
  dpkg-deb -x "$deb_dir"/kubernetes-client_*.deb "$KUBECTL_PREFIX"
  rm -rf "$deb_dir"
fi
need_pip=()
command -v moto_server >/dev/null || need_pip+=('moto[server,ec2]>=5.1,<6')
python3 -c 'import helm_python' 2>/dev/null || need_pip+=('helm-python-sdk>=0.2,<0.3')
python3 -c 'import kubernetes_validate, yaml' 2>/dev/null || need_pip+=('kubernetes-validate>=1.30' pyyaml)
python3 -c 'import kubernetes' 2>/dev/null || need_pip+=('kubernetes>=30')
if [ ${#need_pip[@]} -gt 0 ]; then
  echo "test.sh: installing ${need_pip[*]} from PyPI" >&2
  python3 -m pip install -q --root-user-action=ignore "${need_pip[@]}"
  if command -v pyenv >/dev/null; then pyenv rehash; fi
  hash -r
fi

# One build (scripts/static-build-env.sh, docs/testing.md "One build"): the workspace's test build
# is itself the static build the image ships its node-run plugins and ipamd as, so the tests find
# aws-cni, egress-cni and ipamd static beside them (integration::binaries::STATIC_TEST_BUILD)
# and nothing compiles ipamd's dependencies a second time with other flags.
. scripts/static-build-env.sh
# The reference plugins, static, into <target dir>/reference-plugins/ (where the tests' lookup,
# integration::binaries::reference_plugin, finds them; cached: a no-op when up to date).
scripts/build-reference-plugins.sh "${CARGO_TARGET_DIR:-target}/reference-plugins"
# With arguments: exactly `cargo test --workspace <args>` (one suite, a filter, `--no-run`).
if [ $# -gt 0 ]; then
  exec cargo test --workspace "$@"
fi
# Without: the same build, then every test binary and the doctests in parallel lanes, longest
# first, within a CPU budget (integration/run-tests.py, docs/testing.md "The runner";
# TEST_CPU_BUDGET=cores, default all; TEST_LANES=N, default 6).
# (Running the reference plugins' Go build beside the Rust build at the lowest CPU priority was
# measured and not kept: the Rust build took about as much longer as the Go build had taken,
# docs/performance.md round 11.)
exec python3 integration/run-tests.py
