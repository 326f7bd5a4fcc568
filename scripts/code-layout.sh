#!/usr/bin/env bash
# Code layout lists (`<package>/code-order.txt`, docs/performance.md "Code layout") hold
# functions by *demangled path without hashes* — `<ipamd::rpc::Backend>::add_network`,
# `core::ptr::drop_in_place::<ipamd::pods::Added>` — so a list stays valid across feature sets,
# dependency versions and toolchains wherever the function itself still exists. The workspace
# mangles with Rust's v0 scheme (.cargo/config.toml), whose names carry generic arguments, so
# one key names one instantiation. This script turns keys into the symbols of given objects.
#
#   code-layout.sh key [SYMBOL...]           the key of each mangled symbol (stdin if none)
#   code-layout.sh map LIST OBJECT...        the symbols of OBJECTs the LIST names, in the
#                                            LIST's order (lld's --symbol-ordering-file)
#   code-layout.sh count LIST OBJECT...      "N of M": how many of the LIST's keys the
#                                            OBJECTs define
# Needs nm and c++filt (binutils >= 2.36 demangle v0).
set -euo pipefail

keys() { # mangled symbols on stdin -> "key<TAB>symbol"
  local syms
  syms=$(mktemp "${TMPDIR:-/tmp}/code-layout.XXXXXX")
  cat > "$syms"
  # crate disambiguators ([0123abcd...]) and legacy hashes (::h0123...) go; nothing else does
  c++filt < "$syms" | sed -E 's/\[[0-9a-f]{5,16}\]//g; s/::h[0-9a-f]{16}$//' | paste - "$syms"
  rm -f "$syms"
}

defined() { # the functions the objects define, mangled, one per line
  nm --defined-only -P "$@" 2>/dev/null | awk '$2 ~ /^[TtWw]$/ { print $1 }' | sort -u
}

what=${1:-}
shift || true
case $what in
  key)
    if [ $# -gt 0 ]; then printf '%s\n' "$@" | keys | cut -f1; else keys | cut -f1; fi
    ;;
  map)
    list=$1; shift
    defined "$@" | keys \
      | awk -F'\t' 'NR == FNR { if (!($0 in want)) want[$0] = FNR; next }
                    ($1 in want) { print want[$1] "\t" $2 }' "$list" - \
      | sort -n -s -k1,1 | cut -f2
    ;;
  count)
    list=$1; shift
    have=$(defined "$@" | keys | cut -f1 | sort -u \
      | awk 'NR == FNR { have[$0] = 1; next } ($0 in have) { n++ } END { print n + 0 }' - "$list")
    echo "$have of $(grep -c . "$list")"
    ;;
  *)
    echo "usage: code-layout.sh key|map|count ..." >&2
    exit 2
    ;;
esac
