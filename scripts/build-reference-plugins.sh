#!/bin/sh
# Builds the reference CNI plugins the image ships and the init container installs on the node
# — every Linux plugin of containernetworking-plugins, as upstream's init image carries
# (`make plugins` runs the plugins' build_linux.sh: plugins/{meta,main,ipam}/* but windows) —
# fully STATIC, as upstream's releases are
# (containernetworking/plugins scripts/release.sh: CGO_ENABLED=0): no ELF interpreter, no NEEDED
# library, so any node runs them whatever its glibc (Amazon Linux 2 has 2.26, Ubuntu 20.04 2.31;
# Debian's containernetworking-plugins binaries need GLIBC_2.34). docs/image.md, "Reference
# plugins".
#
#   scripts/build-reference-plugins.sh [OUT_DIR]     (default: target/reference-plugins)
#
# Source: Debian's source package of golang-github-containernetworking-plugins-dev (bookworm:
# 1.1.1+ds1-3), the exact version installed, fetched with `apt-get source` through a private apt
# state (its own sources list, lists and cache under OUT_DIR/.build; the machine's apt
# configuration is not touched) and checked by apt against Debian's signed Sources index. The
# installed -dev package itself carries only the importable packages (its rules delete every
# `package main`), so the plugins' main packages come from the source package; their imports
# (netlink, go-iptables, go-shellwords, libcni, ...) come from Debian's installed -dev packages in
# /usr/share/gocode. Built with Debian's golang-go in GOPATH mode (GO111MODULE=off; there is no
# Go module proxy here), CGO_ENABLED=0, -trimpath, -ldflags "-s -w -X
# .../buildversion.BuildVersion=v<upstream version>" (what upstream's release embeds).
#
# Needs: golang-go, golang-github-containernetworking-plugins-dev, and the Go sources of the
# imports its -dev package does not depend on: golang-github-mattn-go-shellwords-dev (portmap),
# golang-github-networkplumbing-go-nft-dev (bridge), golang-dbus-dev (firewall),
# golang-github-d2g-dhcp4-dev, golang-github-d2g-dhcp4client-dev and
# golang-github-coreos-go-systemd-dev (dhcp); dpkg-dev (dpkg-source), binutils (readelf),
# util-linux (flock), and deb.debian.org on a cold run.
# Idempotent: skipped when every output exists, were built from the same inputs (the installed
# versions of golang-go and every golang-*-dev package, this script) and nothing in the unpacked
# source is newer. Concurrent runs for one OUT_DIR wait for each other.
set -eu
cd "$(dirname "$0")/.."
out=${1:-target/reference-plugins}
pkg=golang-github-containernetworking-plugins-dev
# <main package under plugins/>: the binary is its last path element. Every Linux plugin of
# v1.1.1; a source with a plugin this list lacks is refused below (none may go missing).
plugins="ipam/dhcp ipam/host-local ipam/static main/bridge main/host-device main/ipvlan main/loopback main/macvlan main/ptp main/vlan meta/bandwidth meta/firewall meta/portmap meta/sbr meta/tuning meta/vrf"
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

die() { echo "build-reference-plugins.sh: $*" >&2; exit 1; }

deb_version=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null) || deb_version=
[ -n "$deb_version" ] || die "$pkg is not installed (apt-get install golang-go $pkg golang-github-mattn-go-shellwords-dev dpkg-dev)"
command -v go >/dev/null || die "go is not installed (apt-get install golang-go)"
# 1.1.1+ds1-3 -> v1.1.1 (epoch, Debian revision and repack suffix dropped)
upstream=${deb_version#*:}
upstream=v${upstream%%[+~-]*}

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$out/.build
mkdir -p "$work"
exec 9>"$work/lock"
flock 9

stamp="$pkg $deb_version
$(dpkg-query -W -f='${Package} ${Version}\n' golang-go 'golang-*-dev' 2>/dev/null | sort)
$(go version)
script $(sha256sum < "$0" | cut -d' ' -f1)"
gopath=$work/gopath
src=$gopath/src/github.com/containernetworking/plugins

up_to_date() {
  [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ] || return 1
  for p in $plugins; do [ -x "$out/${p##*/}" ] || return 1; done
  [ -z "$(find "$src" -newer "$out/.stamp" -print 2>/dev/null | head -n 1)" ]
}
if up_to_date; then
  echo "build-reference-plugins.sh: containernetworking-plugins $upstream (Debian $deb_version), static, up to date in $out"
  exit 0
fi
rm -f "$out/.stamp"

# The source package, unpacked once per Debian version.
if [ "$(cat "$src/.debian-version" 2>/dev/null)" != "$deb_version" ]; then
  # shellcheck source=/dev/null
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || die "no VERSION_CODENAME in /etc/os-release"
  rm -rf "$work/apt" "$work/fetch" "$src"
  mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/fetch"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $codename main" \
    > "$work/apt/sources.list"
  set -- -q -o "Dir::Etc::SourceList=$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null \
    -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache" \
    -o APT::Sandbox::User=root
  apt-get "$@" update >&2
  (cd "$work/fetch" && apt-get "$@" source "$pkg=$deb_version" >&2)
  unpacked=$(find "$work/fetch" -mindepth 1 -maxdepth 1 -type d -name 'golang-github-containernetworking-plugins-*')
  [ -d "$unpacked/plugins/meta/portmap" ] || die "apt-get source gave no plugins/meta/portmap in $work/fetch"
  mkdir -p "$(dirname "$src")"
  mv "$unpacked" "$src"
  echo "$deb_version" > "$src/.debian-version"
  rm -rf "$work/apt" "$work/fetch"
fi

# every Linux plugin of the source is in the list (upstream's build_linux.sh builds them all)
for d in "$src"/plugins/meta/* "$src"/plugins/main/* "$src"/plugins/ipam/*; do
  [ -d "$d" ] || continue
  name=${d##*/}
  [ "$name" = windows ] && continue
  case " $plugins " in
    *"/$name "*) ;;
    *) die "the source has plugins/${d#"$src"/plugins/} that the list lacks: add it" ;;
  esac
done

start=$(date +%s)
for p in $plugins; do
  name=${p##*/}
  (cd "$src" && CGO_ENABLED=0 GO111MODULE=off GOFLAGS='' GOPATH="$gopath:/usr/share/gocode" \
    GOCACHE="$work/go-cache" \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$upstream" \
      -o "$out/.$name.tmp" "./plugins/$p")
  # Static or nothing: no program interpreter, no needed library.
  if readelf -lW "$out/.$name.tmp" | grep -q 'INTERP' \
    || readelf -dW "$out/.$name.tmp" | grep -q '(NEEDED)'; then
    readelf -ldW "$out/.$name.tmp" >&2
    rm -f "$out/.$name.tmp"
    die "$name is not static"
  fi
  mv "$out/.$name.tmp" "$out/$name"
done
echo "$stamp" > "$out/.stamp"
echo "build-reference-plugins.sh: built containernetworking-plugins $upstream (Debian $deb_version), static (CGO_ENABLED=0), in $(($(date +%s) - start)) s: $(echo "$plugins" | wc -w) plugins in $out"
