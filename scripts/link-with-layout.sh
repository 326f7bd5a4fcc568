#!/usr/bin/env bash
# The linker this workspace gives rustc (.cargo/config.toml): `cc` with one change. When
# ipamd/build.rs asked for a code layout (`-Wl,--symbol-ordering-file=<package>/code-order.txt`,
# a list of functions by demangled path: scripts/code-layout.sh), the list is translated into
# this link's own symbols and lld gets the translation; everything else passes through as is.
# A list entry this link does not define is skipped: a stale list costs memory, never a link.
# A static link (`-static`, `-static-pie`: ipamd's and the plugins' builds) also takes libc's
# functions from libc.a, which comes in through `-lc`, not as a path: its functions are mapped
# too, by their C names, so the ones a profile saw running join the hot region.
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
    -static | -static-pie) static=yes ;;
  esac
done
if [ -n "${static:-}" ]; then
  libc=$("$cc" -print-file-name=libc.a)
  [ ! -f "$libc" ] || objects+=("$libc")
fi
order=$(mktemp "${TMPDIR:-/tmp}/symbol-order.XXXXXX")
trap 'rm -f "$order"' EXIT
"$here/code-layout.sh" map "$list" "${objects[@]}" > "$order"
"$cc" "${args[@]}" "-Wl,--symbol-ordering-file=$order"
