#!/usr/bin/env python3
"""Lints and renders charts/aws-vpc-cni with real Helm (helm-python-sdk bundles Helm's Go SDK)
and validates every rendered manifest against the Kubernetes OpenAPI schemas
(kubernetes-validate). Exits non-zero with the findings on any problem.

Value sets: the defaults, a custom MTU, the optional chained plugins (ENABLE_BANDWIDTH_PLUGIN,
DISABLE_POD_V6), and one with every optional feature switched on. For the conflist the chart
renders itself, the exact plugin chain after aws-cni is checked against upstream's entrypoint.
The init container must install every reference plugin that chain can name, and the Dockerfile
must put each of them into /app.
"""
import json
import pathlib
import re
import sys

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "aws-vpc-cni"
DOCKERFILE = ROOT / "Dockerfile"
KUBE_VERSION = "1.30.0"

VALUE_SETS = {
    "defaults": {},
    "custom-mtu": {"env": {"POD_MTU": "1500", "AWS_VPC_K8S_CNI_VETHPREFIX": "pod"}},
    "bandwidth-and-no-pod-v6": {"env": {"ENABLE_BANDWIDTH_PLUGIN": "true", "DISABLE_POD_V6": "true"}},
    # Upstream parses both with strconv.ParseBool: "1" is true, "False" is false.
    "no-pod-v6-only": {"env": {"ENABLE_BANDWIDTH_PLUGIN": "False", "DISABLE_POD_V6": "1"}},
    "bandwidth-only": {"env": {"ENABLE_BANDWIDTH_PLUGIN": "True", "DISABLE_POD_V6": "false"}},
    # A user's template in upstream's style: placeholders, then the optional plugins appended.
    "custom-template": {
        "cniConfig": {"enabled": True, "fileContents": json.dumps({
            "cniVersion": "0.4.0", "name": "aws-cni", "disableCheck": True,
            "plugins": [
                {"name": "aws-cni", "type": "aws-cni", "vethPrefix": "__VETHPREFIX__", "mtu": "__MTU__",
                 "podSGEnforcingMode": "__PODSGENFORCINGMODE__", "pluginLogFile": "__PLUGINLOGFILE__",
                 "pluginLogLevel": "__PLUGINLOGLEVEL__"},
                {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
            ]})},
        "env": {"POD_MTU": "1500", "AWS_VPC_K8S_PLUGIN_LOG_LEVEL": "INFO", "ENABLE_BANDWIDTH_PLUGIN": "true"},
    },
    "everything-on": {
        "cniConfig": {"enabled": True, "fileContents": json.dumps({"cniVersion": "0.4.0", "name": "aws-cni", "plugins": [{"type": "aws-cni", "mtu": "9001", "vethPrefix": "eni"}]})},
        "podMonitor": {"create": True, "labels": {"release": "prom"}},
        "eniConfig": {"create": True, "subnets": {"us-west-2a": {"id": "subnet-1", "securityGroups": ["sg-1"]}}},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/cni"}},
        "env": {"ENABLE_PREFIX_DELEGATION": "true", "ANNOTATE_POD_IP": "true"},
        "extraEnv": [{"name": "CLUSTER_NAME", "value": "demo"}],
        "originalMatchLabels": True,
    },
}

# The plugins upstream's entrypoint chains after aws-cni (egress-cni is not shipped here).
PORTMAP = {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}
BANDWIDTH = {"type": "bandwidth", "capabilities": {"bandwidth": True}}
TUNING = {
    "type": "tuning",
    "sysctl": {
        "net.ipv6.conf.all.disable_ipv6": "1",
        "net.ipv6.conf.default.disable_ipv6": "1",
        "net.ipv6.conf.lo.disable_ipv6": "1",
    },
}
# Expected plugins after aws-cni, per value set (absent: the user's cniConfig, not checked).
EXPECTED_CHAIN = {
    "defaults": [PORTMAP],
    "custom-mtu": [PORTMAP],
    "bandwidth-and-no-pod-v6": [PORTMAP, BANDWIDTH, TUNING],
    "no-pod-v6-only": [PORTMAP, TUNING],
    "bandwidth-only": [PORTMAP, BANDWIDTH],
    "custom-template": [PORTMAP, BANDWIDTH],
}
# The aws-cni entry a value set must end up with (placeholders replaced).
EXPECTED_AWS_CNI = {
    "custom-template": {
        "name": "aws-cni", "type": "aws-cni", "vethPrefix": "eni", "mtu": "1500",
        "podSGEnforcingMode": "strict", "pluginLogFile": "/var/log/aws-routed-eni/plugin.log",
        "pluginLogLevel": "INFO",
    },
}
# What the init container must copy into /opt/cni/bin (a superset is fine).
INIT_MUST_INSTALL = {"aws-cni", "portmap", "loopback", "bandwidth", "tuning"}

# Kinds served by CRDs: their schema is not in the Kubernetes OpenAPI set.
CRD_KINDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("crd.k8s.amazonaws.com/v1alpha1", "ENIConfig")}


def check_chain(name: str, conf: dict) -> list:
    """The plugins after aws-cni, exactly as upstream's entrypoint would chain them."""
    if name not in EXPECTED_CHAIN:
        return []
    chain = conf["plugins"][1:]
    if chain != EXPECTED_CHAIN[name]:
        return [f"{name}: conflist chain after aws-cni is {json.dumps(chain)}, expected {json.dumps(EXPECTED_CHAIN[name])}"]
    return []


def init_installs(daemonset: dict) -> set:
    """The binaries the init container's `for b in ...; do` loop copies."""
    inits = daemonset["spec"]["template"]["spec"].get("initContainers") or []
    for c in inits:
        m = re.search(r"for b in ([^;]+);", "\n".join(c.get("command", [])))
        if m:
            return set(m.group(1).split())
    return set()


def init_script(daemonset: dict) -> str:
    """The init container's shell script (`/bin/sh -ec <script>`)."""
    for c in daemonset["spec"]["template"]["spec"].get("initContainers") or []:
        cmd = c.get("command", [])
        if len(cmd) == 3 and cmd[0] == "/bin/sh":
            return cmd[2]
    return ""


def run_init_script(script: str, env: dict) -> list:
    """Runs the init script for real, as root, in a network namespace of its own (`unshare
    --net`: the sysctl it writes is per-netns, the machine's own is untouched), with /app and
    /host/opt/cni/bin pointed at temporary directories. Returns problems."""
    import os
    import subprocess
    import tempfile

    if os.geteuid() != 0:
        print("SKIP init-script run: needs root (unshare --net)")
        return []
    problems = []
    for demux_env, want in [("true", "0"), ("false", "1"), (None, "1")]:
        with tempfile.TemporaryDirectory() as tmp:
            app, bin_dir = pathlib.Path(tmp, "app"), pathlib.Path(tmp, "bin")
            app.mkdir()
            bin_dir.mkdir()
            for b in INIT_MUST_INSTALL:
                (app / b).write_text(f"#!/bin/sh\n# {b}\n")
            body = script.replace("/host/opt/cni/bin", str(bin_dir)).replace("/app/", f"{app}/")
            run_env = {k: v for k, v in env.items() if k != "DISABLE_TCP_EARLY_DEMUX"}
            run_env["PATH"] = "/usr/bin:/bin"
            if demux_env is not None:
                run_env["DISABLE_TCP_EARLY_DEMUX"] = demux_env
            out = subprocess.run(
                ["unshare", "--net", "/bin/sh", "-ec", body + "\ncat /proc/sys/net/ipv4/tcp_early_demux\n"],
                env=run_env, capture_output=True, text=True,
            )
            label = f"init script (DISABLE_TCP_EARLY_DEMUX={demux_env})"
            if out.returncode != 0:
                problems.append(f"{label}: exit {out.returncode}: {out.stderr.strip()}")
                continue
            if out.stdout.strip().splitlines()[-1:] != [want]:
                problems.append(f"{label}: tcp_early_demux is {out.stdout.strip()!r}, expected {want}")
            copied = {f.name for f in bin_dir.iterdir()}
            if copied != INIT_MUST_INSTALL:
                problems.append(f"{label}: installed {sorted(copied)}, expected {sorted(INIT_MUST_INSTALL)}")
    print(f"init script: ran in a throwaway netns {3 - len(problems)}/3 times as expected")
    return problems


def dockerfile_app_binaries() -> set:
    """Binaries the Dockerfile puts into /app: the reference plugins copied from /usr/lib/cni, and
    the cargo-built ones copied to /out (COPY --from=build /out/ /app/)."""
    text = DOCKERFILE.read_text()
    found = set(re.findall(r"/usr/lib/cni/([\w-]+)", text))
    found |= set(re.findall(r"target/release/([\w-]+)", text))
    return found


def main() -> int:
    problems = []
    report = helm.lint(str(CHART), strict=True, kube_version=f"v{KUBE_VERSION}")
    for m in report.get("messages", []):
        if m.get("severity", 0) >= 2:
            problems.append(f"lint: {m}")
    problems += [f"lint: {e}" for e in report.get("errors", []) or []]

    chart = helm.Chart.load(str(CHART))
    for name, values in VALUE_SETS.items():
        rendered = chart.render(values, name="aws-vpc-cni", namespace="kube-system", is_install=True)
        kinds = []
        conflists = 0
        chain = "?"
        for path, text in sorted(rendered.items()):
            if not path.endswith(".yaml"):
                continue
            for doc in yaml.safe_load_all(text):
                if not doc:
                    continue
                kinds.append(doc["kind"])
                if doc["kind"] == "ConfigMap" and "10-aws.conflist" in doc.get("data", {}):
                    conflists += 1
                    try:
                        conf = json.loads(doc["data"]["10-aws.conflist"])
                        first = conf["plugins"][0]
                        if first["type"] != "aws-cni" or not first.get("mtu") or not first.get("vethPrefix"):
                            problems.append(f"{name}: conflist's first plugin is not a complete aws-cni entry: {first}")
                        problems += check_chain(name, conf)
                        if name in EXPECTED_AWS_CNI and first != EXPECTED_AWS_CNI[name]:
                            problems.append(f"{name}: aws-cni entry is {json.dumps(first)}, expected {json.dumps(EXPECTED_AWS_CNI[name])}")
                        if "__" in doc["data"]["10-aws.conflist"]:
                            problems.append(f"{name}: a placeholder is left in the conflist")
                        chain = " -> ".join(p.get("type", "?") for p in conf["plugins"])
                    except (ValueError, KeyError, IndexError, TypeError) as e:
                        problems.append(f"{name}: 10-aws.conflist is not a valid conflist: {e!r}")
                if doc["kind"] == "DaemonSet":
                    installed = init_installs(doc)
                    if not INIT_MUST_INSTALL <= installed:
                        problems.append(f"{name}: init container installs {sorted(installed)}, missing {sorted(INIT_MUST_INSTALL - installed)}")
                    if name == "defaults":
                        problems += run_init_script(init_script(doc), {})
                    missing = installed - dockerfile_app_binaries()
                    if missing:
                        problems.append(f"{name}: init container installs {sorted(missing)}, which the Dockerfile does not put into /app")
                if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
                    if not doc.get("spec"):
                        problems.append(f"{name}: {path}: {doc['kind']} without spec")
                    continue
                try:
                    kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
                except kubernetes_validate.ValidationError as e:
                    problems.append(f"{name}: {path}: {doc['kind']}: {e.message} at {list(e.path)}")
        for must in ["DaemonSet", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "ConfigMap"]:
            if must not in kinds:
                problems.append(f"{name}: no {must} rendered")
        if conflists != 1:
            problems.append(f"{name}: {conflists} ConfigMaps carry 10-aws.conflist, expected 1")
        print(f"{name}: rendered {len(kinds)} objects: {', '.join(sorted(kinds))}; conflist: {chain}")
    for crd in CHART.glob("crds/*.yaml"):
        for doc in yaml.safe_load_all(crd.read_text()):
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{crd.name}: {e.message}")

    for p in problems:
        print(f"PROBLEM {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
