#!/usr/bin/env bash
# The linker this workspace gives rustc (.cargo/config.toml): `cc` with one change. When
# ipamd/build.rs asked for a code layout (`-Wl,--symbol-ordering-file=<package>/code-order.txt`,
# a list of functions by demangled path: scripts/code-layout.sh), the list is translated into
# this link's own symbols and lld gets the translation; everything else passes through as is.
# A list entry this link does not define is skipped: a stale list costs memory, never a link.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cc=${CODE_LAYOUT_CC:-cc}
list=""
args=()
for a in "$@"; do
  case $a in
    -Wl,--symbol-ordering-file=*/code-order.txt) list=${a#-Wl,--symbol-ordering-file=} ;;
    *) args+=("$a") ;;
  esac
done
[ -n "$list" ] || exec "$cc" "$@"
objects=()
for a in "${args[@]}"; do
  case $a in
    *.o | *.a | *.rlib) [ -f "$a" ] && objects+=("$a") ;;
  esac
done
order=$(mktemp "${TMPDIR:-/tmp}/symbol-order.XXXXXX")
trap 'rm -f "$order"' EXIT
"$here/code-layout.sh" map "$list" "${objects[@]}" > "$order"
"$cc" "${args[@]}" "-Wl,--symbol-ordering-file=$order"
