#!/usr/bin/env python3
"""Turns callgrind profiles into a code layout list (docs/performance.md, "Code layout").

Usage: code-order.py OUT BINARY_NAME STEADY_PROFILE... [-- STARTUP_PROFILE...] [--keep OLD_LIST]

Every function callgrind saw executing in the object whose path ends with /BINARY_NAME, one per
line, named by its key: the demangled path without crate hashes (scripts/code-layout.sh key),
which the workspace's linker translates back into the symbols of whatever build links the list.
With `--`, the steady state's functions (the profiles before it) come first, **by how often they
run per pod**: each workload's calls of a function (callgrind's `calls=` lines, summed over that
workload's profiles: the files named alike up to the first dot) divided by its AddNetwork calls,
the largest of the workloads' ratios first; so what every ADD and DEL runs lies together at the
front, what a pool pass or an EC2 call runs after it, and what ran only once or twice (an ENI's
set-up) at the end. Ties keep the order the profiles first list them. Then the functions only
start-up ran (the profiles after `--`), in that order. Without `--` (the plugin's list: no
start-up to cut) every function comes in the order the profiles first list them. Entries of an existing list given with
--keep stay (after the new ones): a run that profiled only some of a list's workloads must not
drop the others'. Reads only; writes OUT.
"""

import os
import re
import subprocess
import sys


def executed(path, binary):
    """One callgrind file: the mangled names of the functions executed in `binary`, in the order
    the file first lists them, and how often each was called (its `calls=` lines, any caller)."""
    names = {"ob": {}, "fn": {}}
    ob = None
    seen = []
    calls = {}
    callee = None
    line_re = re.compile(r"^(c?)(ob|fn)=\((\d+)\)(?: (.*))?$")
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("calls="):
                if callee:
                    n = int(line[6:].split()[0])
                    calls[callee] = calls.get(callee, 0) + n
                continue
            m = line_re.match(line)
            if not m:
                continue
            is_callee, kind, ident, name = m.groups()
            table = names[kind]
            if name is not None:
                table[ident] = name
            name = table.get(ident, "")
            if is_callee:
                # cob=/cfn= name the callee of the next calls= line (callgrind's name
                # compression shares one table between fn= and cfn=)
                if kind == "fn":
                    callee = name.split("'")[0]
                continue
            callee = None
            if kind == "ob":
                ob = name
            elif ob is not None and ob.endswith("/" + binary):
                # `name'2`: a deeper recursion level of the same function
                seen.append(name.split("'")[0])
    return seen, calls


ADD_NETWORK = re.compile(r"ipamd::rpc::Backend as .*>::add_network::\{closure#0\}$")


def keys_of(symbols):
    """Keys of mangled names, in order (scripts/code-layout.sh key)."""
    layout = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code-layout.sh")
    out = subprocess.run(
        [layout, "key"], input="\n".join(symbols) + "\n", capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return dict(zip(symbols, out))


def workload(path):
    """The workload a profile belongs to: its file name up to the first dot."""
    return os.path.basename(path).split(".")[0]


def main(argv):
    keep = None
    if "--keep" in argv:
        i = argv.index("--keep")
        keep = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
        if not os.path.exists(keep):
            keep = None
    out, binary, profiles = argv[1], argv[2], argv[3:]
    if "--" in profiles:
        i = profiles.index("--")
        steady, startup = profiles[:i], profiles[i + 1 :]
    else:
        steady, startup = profiles, []
    runs = [(p, *executed(p, binary)) for p in steady + startup]
    # callgrind names unknown code by address; those are not symbols
    symbols = sorted({s for _, seen, calls in runs for s in [*seen, *calls] if s and not s.startswith("0x")})
    key = keys_of(symbols)

    # the steady state: calls per AddNetwork call, per workload, the largest ratio
    per_workload = {}
    for p, _, calls in runs[: len(steady)]:
        w = per_workload.setdefault(workload(p), {})
        for s, n in calls.items():
            k = key.get(s)
            if k:
                w[k] = w.get(k, 0) + n
    score = {}
    for name, w in per_workload.items():
        adds = max([n for k, n in w.items() if ADD_NETWORK.search(k)], default=0)
        if "--" in profiles and not adds:
            print(
                f"code-order.py: no AddNetwork call in workload {name}: its functions are "
                "ranked by raw call counts (was add_network renamed? see ADD_NETWORK)",
                file=sys.stderr,
            )
        adds = adds or 1
        for k, n in w.items():
            score[k] = max(score.get(k, 0.0), n / adds)
    first_seen = []
    for _, seen, _ in runs[: len(steady)]:
        first_seen.extend(key[s] for s in seen if s in key)
    rank = {}
    for k in first_seen:
        rank.setdefault(k, len(rank))
    if "--" in profiles:
        steady_order = sorted(rank, key=lambda k: (-score.get(k, 0.0), rank[k]))
    else:
        steady_order = list(rank)  # one group (the plugin's): the order profiles list them

    order, known = [], set()

    def add(k):
        if k and k not in known:
            known.add(k)
            order.append(k)

    for k in steady_order:
        add(k)
    for _, seen, _ in runs[len(steady) :]:
        for s in seen:
            add(key.get(s))
    fresh = len(order)
    if keep:
        with open(keep, encoding="utf-8") as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    add(line.strip())
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(order) + "\n")
    print(
        f"{out}: {fresh} executed functions from {len(steady) + len(startup)} profile(s) "
        f"({len(steady_order)} in the first group), {len(order)} in all"
    )


if __name__ == "__main__":
    main(sys.argv)
