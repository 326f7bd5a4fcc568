#!/usr/bin/env python3
"""Runs the workspace's test binaries in parallel lanes (docs/testing.md, "The runner").

Owns: building every test target once (`cargo test --workspace --no-run`), running each test
binary (each top-level module of a SUITES binary as its own job) as cargo would (cwd = its
package's directory, cargo's run-time environment), longest first, as many at a time as fit
in the CPU budget by what each used in the last run (at most N), at most one CPU-heavy binary
(the qemu TCG VMs) at a time, each binary's output captured and printed when it fails,
and a summary of every binary's wall and CPU time.
Must not: change what a test asserts or skip a binary; every test binary cargo builds runs, and
so do the doctests (`cargo test --workspace --doc`).

    integration/run-tests.py [--lanes N] [--cpu-budget CORES] [--times FILE] [--write-times]
                             [--only NAME ...]

The order and each binary's CPU share come from the checked-in times file
(`integration/test-times.txt`: "<seconds> <binary> <CPU-seconds>" per line); a binary it does
not list is assumed to take 20 s with one core busy. Every run writes
the measured times to `<target dir>/test-times.txt`; `--write-times` also rewrites the
checked-in file from them.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMES = os.path.join(ROOT, "integration", "test-times.txt")
# Binaries that keep both cores busy on their own (the qemu TCG VMs, ~1.6 cores each): never two
# of them at once. (The 10-node fleet was one until round 11: 13 CPU-s over 17 s, it runs beside
# the others instead of adding its 17 s to the VM suites' chain, the test phase's critical path.)
HEAVY = {
    "integration/sgp_ipamd_vm",
    "integration/sgp_fabric_vm",
    "integration/sgp_branch_vm",
}
# Test binaries that hold many suites, one per top-level module (integration/tests/suite.rs):
# each module runs as its own job and process, named `<package>/<module>` as its own binary
# was before, so the order, HEAVY and the times file work per suite.
SUITES = {
    "integration/suite",
    "ipamd/suite",
    "vpcsim/suite",
    "kubesim/suite",
    "cni-metrics-helper/suite",
}
# A binary the times file does not list is assumed to take this long (seconds).
UNKNOWN_SECONDS = 20.0
DOCTESTS = "workspace/doctests"


class Job:
    def __init__(self, name, argv, cwd, env):
        self.name = name
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.seconds = None
        self.cpu = 0.0
        self.code = None
        self.output = b""


def cargo():
    return os.environ.get("CARGO") or shutil.which("cargo") or "cargo"


def build(cargo_args):
    """Builds every test target once; returns [(name, executable, manifest_path, package)]."""
    cmd = [cargo(), "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]
    cmd += cargo_args
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, check=False)
    if proc.returncode != 0:
        # the compiler's messages are already on stderr (json-render-diagnostics)
        sys.exit(f"run-tests.py: {' '.join(cmd)} failed ({proc.returncode})")
    found = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        manifest = msg["manifest_path"]
        package = package_name(msg["package_id"], manifest)
        kind = target["kind"][0]
        # integration tests by their file name, a crate's own unit tests as <package>/<kind>
        if kind == "test":
            name = f"{package}/{target['name']}"
        elif kind == "lib":
            name = f"{package}/lib"
        else:
            name = f"{package}/{kind}-{target['name']}"
        found.append((name, msg["executable"], manifest, package))
    return found


def package_name(package_id, manifest):
    # "path+file:///dir/pkg#name@0.1.0" or "path+file:///dir/pkg#0.1.0" (name = dir name)
    frag = package_id.rsplit("#", 1)[-1]
    if "@" in frag:
        return frag.split("@", 1)[0]
    with open(manifest, encoding="utf-8") as f:
        in_package = False
        for line in f:
            s = line.strip()
            if s.startswith("["):
                in_package = s == "[package]"
            elif in_package and s.startswith("name"):
                return s.split("=", 1)[1].strip().strip('"')
    return os.path.basename(os.path.dirname(manifest))


def cargo_env(executable, manifest, package):
    """The environment `cargo test` gives a test binary at run time (the parts tests use)."""
    env = dict(os.environ)
    pkg_dir = os.path.dirname(manifest)
    deps = os.path.dirname(executable)
    env.update(
        {
            "CARGO": cargo(),
            "CARGO_MANIFEST_DIR": pkg_dir,
            "CARGO_MANIFEST_PATH": manifest,
            "CARGO_PKG_NAME": package,
            "CARGO_CRATE_NAME": package.replace("-", "_"),
        }
    )
    sysroot = subprocess.run(
        ["rustc", "--print", "sysroot"], capture_output=True, text=True, check=False
    ).stdout.strip()
    paths = [deps, os.path.dirname(deps)]
    if sysroot:
        paths.append(os.path.join(sysroot, "lib"))
    if env.get("LD_LIBRARY_PATH"):
        paths.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(paths)
    return env


def split_suite(package, exe, cwd, env):
    """One job per top-level module of a SUITES binary, running exactly that module's tests."""
    listed = subprocess.run(
        [exe, "--list", "--format", "terse"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        sys.exit(f"run-tests.py: {exe} --list failed ({listed.returncode}):\n{listed.stderr}")
    modules = {}
    for line in listed.stdout.splitlines():
        if line.endswith(": test"):
            test = line[: -len(": test")]
            modules.setdefault(test.split("::", 1)[0], []).append(test)
    if not modules:
        sys.exit(f"run-tests.py: {exe} lists no tests")
    return [
        Job(f"{package}/{module}", [exe, "--exact", *tests], cwd, env)
        for module, tests in sorted(modules.items())
    ]


def read_times(path):
    """name -> (wall seconds, CPU-seconds or None) of one earlier run."""
    times = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if line.startswith("#") or len(parts) not in (2, 3):
                    continue
                cpu = float(parts[2]) if len(parts) == 3 else None
                times[parts[1]] = (float(parts[0]), cpu)
    except FileNotFoundError:
        pass
    return times


def write_times(path, jobs):
    with open(path, "w", encoding="utf-8") as f:
        f.write("# <seconds> <binary> <CPU-seconds>: one run's wall and CPU time per test binary,\n")
        f.write("# longest first (integration/run-tests.py --write-times rewrites it; the runner's\n")
        f.write("# order, and each binary's share of the CPU budget)\n")
        for j in sorted(jobs, key=lambda j: -(j.seconds or 0)):
            f.write(f"{j.seconds:.0f} {j.name} {j.cpu:.0f}\n")


def cpu_rate(times, name):
    """Cores `name` kept busy on average in the earlier run (1 when unknown)."""
    seconds, cpu = times.get(name, (UNKNOWN_SECONDS, None))
    if cpu is None or seconds < 1:
        return 1.0
    return min(max(cpu / seconds, 0.05), float(os.cpu_count() or 1))


def machine_cpu():
    """(busy, total) CPU-seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / hz, sum(fields) / hz


def run_lanes(jobs, lanes, budget, times, log_dir):
    """Runs `jobs` longest expected first, at most `lanes` at a time, while the CPU their earlier
    runs used (cores on average, `cpu_rate`) fits in `budget` cores, never two HEAVY ones at once."""
    pending = sorted(jobs, key=lambda j: -times.get(j.name, (UNKNOWN_SECONDS, None))[0])
    lock = threading.Condition()
    running = {}
    done = []

    def pick():
        heavy_running = any(n in HEAVY for n in running)
        used = sum(running.values())
        for j in pending:
            if j.name in HEAVY and heavy_running:
                continue
            if running and used + cpu_rate(times, j.name) > budget:
                continue
            return j
        return None

    def worker():
        while True:
            with lock:
                while True:
                    if not pending:
                        return
                    j = pick()
                    if j is not None:
                        break
                    lock.wait()
                pending.remove(j)
                running[j.name] = cpu_rate(times, j.name)
                print(f"run-tests: start {j.name}", flush=True)
            started = time.monotonic()
            log = os.path.join(log_dir, j.name.replace("/", "__") + ".log")
            with open(log, "wb") as out:
                try:
                    proc = subprocess.Popen(
                        j.argv,
                        cwd=j.cwd,
                        env=j.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                    # wait4: the job's CPU time, its reaped descendants' included (qemu, ipamd,
                    # containerd, the plugins), user + system.
                    _, status, usage = os.wait4(proc.pid, 0)
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    j.code, j.cpu = proc.returncode, usage.ru_utime + usage.ru_stime
                except OSError as e:
                    out.write(str(e).encode())
                    j.code = 127
            j.seconds = time.monotonic() - started
            with open(log, "rb") as f:
                j.output = f.read()
            with lock:
                running.pop(j.name, None)
                done.append(j)
                verdict = "ok" if j.code == 0 else f"FAILED (exit {j.code})"
                print(f"run-tests: {verdict} {j.name} {j.seconds:.0f} s, {j.cpu:.0f} CPU-s", flush=True)
                if j.code != 0:
                    sys.stdout.flush()
                    sys.stdout.buffer.write(j.output)
                    sys.stdout.buffer.write(f"\n--- end of {j.name} ---\n".encode())
                    sys.stdout.flush()
                lock.notify_all()

    threads = [threading.Thread(target=worker) for _ in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lanes", type=int, default=int(os.environ.get("TEST_LANES", "6")))
    ap.add_argument(
        "--cpu-budget",
        type=float,
        default=float(os.environ.get("TEST_CPU_BUDGET", os.cpu_count() or 1)),
        help="cores the running binaries may use together, by their earlier runs (default: all)",
    )
    ap.add_argument("--times", default=TIMES)
    ap.add_argument("--write-times", action="store_true")
    ap.add_argument("--only", nargs="*", default=None, help="binary names to run (default all)")
    args = ap.parse_args()

    wall = time.monotonic()
    built = build([])
    build_seconds = time.monotonic() - wall
    print(f"run-tests: built {len(built)} test binaries in {build_seconds:.0f} s", flush=True)
    jobs = []
    env_cache = {}
    for name, exe, manifest, package in built:
        key = (os.path.dirname(exe), manifest, package)
        if key not in env_cache:
            env_cache[key] = cargo_env(exe, manifest, package)
        if name in SUITES:
            jobs += split_suite(package, exe, os.path.dirname(manifest), env_cache[key])
        else:
            jobs.append(Job(name, [exe], os.path.dirname(manifest), env_cache[key]))
    jobs.append(Job(DOCTESTS, [cargo(), "test", "--workspace", "--doc"], ROOT, dict(os.environ)))
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        sys.exit(f"run-tests.py: two test binaries share a name: {sorted(names)}")
    if args.only is not None:
        unknown = set(args.only) - set(names)
        if unknown:
            sys.exit(f"run-tests.py: no such binary {sorted(unknown)}; there are {sorted(names)}")
        jobs = [j for j in jobs if j.name in args.only]

    target_dir = os.path.dirname(os.path.dirname(os.path.dirname(built[0][1]))) if built else ROOT
    log_dir = os.path.join(target_dir, "test-logs")
    os.makedirs(log_dir, exist_ok=True)
    print(f"run-tests: each binary's output in {log_dir}/", flush=True)
    busy0, total0 = machine_cpu()
    done = run_lanes(jobs, max(1, args.lanes), args.cpu_budget, read_times(args.times), log_dir)
    busy1, total1 = machine_cpu()
    failed = [j for j in done if j.code != 0]
    print("\nrun-tests: wall and CPU time per test binary (s), longest first:")
    for j in sorted(done, key=lambda j: -j.seconds):
        print(f"  {j.seconds:7.1f} {j.cpu:7.1f}  {'ok    ' if j.code == 0 else 'FAILED'}  {j.name}")
    total = time.monotonic() - wall
    serial = sum(j.seconds for j in done)
    cpu = sum(j.cpu for j in done)
    print(
        f"run-tests: {len(done)} binaries, {len(failed)} failed; build {build_seconds:.0f} s, "
        f"tests {total - build_seconds:.0f} s wall ({serial:.0f} s summed, {cpu:.0f} CPU-s) in up to {args.lanes} lanes, "
        f"{args.cpu_budget:g} cores",
        flush=True,
    )
    print(
        f"run-tests: the machine was busy {busy1 - busy0:.0f} of {total1 - total0:.0f} CPU-s "
        f"while the tests ran ({os.cpu_count()} CPUs)",
        flush=True,
    )
    if args.only is None:
        write_times(os.path.join(target_dir, "test-times.txt"), done)
        if args.write_times:
            write_times(args.times, done)
    if failed:
        print("run-tests: FAILED: " + " ".join(j.name for j in failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
