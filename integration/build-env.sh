# Sourced by integration/test.sh and integration/demo.sh (bash): the workspace's one build
# (docs/testing.md, "One build"). Every cargo command after it builds for `--target <host
# triple>` with the static flags of scripts/static-rustflags.sh, into
# target/<host triple>/debug/: the test build is the static build the image ships the node's
# plugins and ipamd as, and the demo runs that same build (nothing is rebuilt between them).
# Must not: apply to build scripts or proc-macros (`--target` keeps the flags to target units).
host=$(rustc -vV | sed -n 's/^host: //p')
case "$host" in
  *-linux-gnu) ;;
  *) echo "build-env.sh: host $host is not a *-linux-gnu target (docs/image.md, glibc)" >&2; exit 1 ;;
esac
export CARGO_BUILD_TARGET="$host"
CARGO_ENCODED_RUSTFLAGS=$(sh scripts/static-rustflags.sh)
export CARGO_ENCODED_RUSTFLAGS
