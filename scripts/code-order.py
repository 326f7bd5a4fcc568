#!/usr/bin/env python3
"""Turns callgrind profiles into a code layout list (docs/performance.md, "Code layout").

Usage: code-order.py OUT BINARY_NAME PROFILE... [--keep OLD_LIST]

Every function callgrind saw executing in the object whose path ends with /BINARY_NAME, in the
order the profiles first list them (profiles named first come first), one per line, named by
its key: the demangled path without crate hashes (scripts/code-layout.sh key), which the
workspace's linker translates back into the symbols of whatever build links the list. Entries of
an existing list given with --keep stay (after the new ones): a run that profiled only some of
a list's workloads must not drop the others'. Reads only; writes OUT.
"""

import os
import re
import subprocess
import sys


def executed(path, binary):
    """Mangled names of the functions executed in `binary` according to one callgrind file."""
    names = {"ob": {}, "fn": {}}
    ob = None
    seen = []
    line_re = re.compile(r"^(c?)(ob|fn)=\((\d+)\)(?: (.*))?$")
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = line_re.match(line.rstrip("\n"))
            if not m:
                continue
            callee, kind, ident, name = m.groups()
            table = names[kind]
            if name is not None:
                table[ident] = name
            name = table.get(ident, "")
            if callee:
                continue  # cob=/cfn= only define names; the callee has its own fn= block
            if kind == "ob":
                ob = name
            elif ob is not None and ob.endswith("/" + binary):
                # `name'2`: a deeper recursion level of the same function
                seen.append(name.split("'")[0])
    return seen


def main(argv):
    keep = None
    if "--keep" in argv:
        i = argv.index("--keep")
        keep = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
        if not os.path.exists(keep):
            keep = None
    out, binary, profiles = argv[1], argv[2], argv[3:]
    order, known = [], set()

    def add(key):
        if key and key not in known:
            known.add(key)
            order.append(key)

    symbols = []
    for p in profiles:
        symbols.extend(executed(p, binary))
    # callgrind names unknown code by address; those are not symbols
    symbols = [s for s in symbols if s and not s.startswith("0x")]
    layout = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code-layout.sh")
    keys = subprocess.run(
        [layout, "key"], input="\n".join(symbols) + "\n", capture_output=True, text=True, check=True
    ).stdout.splitlines()
    for k in keys:
        add(k)
    fresh = len(order)
    if keep:
        with open(keep, encoding="utf-8") as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    add(line.strip())
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(order) + "\n")
    print(f"{out}: {fresh} executed functions from {len(profiles)} profile(s), {len(order)} in all")


if __name__ == "__main__":
    main(sys.argv)
