#!/usr/bin/env python3
"""Lints and renders charts/aws-vpc-cni with real Helm (helm-python-sdk bundles Helm's Go SDK)
and validates every rendered manifest against the Kubernetes OpenAPI schemas
(kubernetes-validate). Exits non-zero with the findings on any problem.

Value sets: the defaults, a custom MTU, the optional chained plugins (ENABLE_BANDWIDTH_PLUGIN,
DISABLE_POD_V6), settings given through extraEnv/valueFrom, user templates, and one with every
optional feature switched on. The chart ships a conflist TEMPLATE; the aws-node container's
start-up script (files/aws-node.sh, the image's ENTRYPOINT) fills it in from the container's real
environment. So for each value set the start-up script is run for real (/bin/sh), with the rendered container environment
(valueFrom entries resolved as the kubelet would), stub ipamd/health probe and the real
aws-cni-conflist binary (path in $AWS_CNI_CONFLIST_BIN), and the installed conflist is checked
against what upstream's entrypoint (cmd/aws-vpc-cni/main.go) would install. The init container
must install every plugin that chain can name, and the Dockerfile must put each into /app; the
Dockerfile's aws-node and init targets must run the chart's scripts as their default entrypoints.
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "aws-vpc-cni"
DOCKERFILE = ROOT / "Dockerfile"
# The scripts the image carries in /app and the chart runs by those names (docs/image.md): the
# aws-node start-up (the image's ENTRYPOINT; the chart's aws-node container has no command, as
# upstream's) and the init script (the chart's init `command`, the init target's CMD).
START_SCRIPT = CHART / "files" / "aws-node.sh"
INIT_SCRIPT = CHART / "files" / "aws-vpc-cni-init.sh"
INIT_COMMAND = ["/app/aws-vpc-cni-init.sh"]
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
    # Settings that reach the container only at run time (extraEnv, valueFrom): upstream's
    # entrypoint reads them from the real environment, so must ours.
    "extra-env-value-from": {
        "extraEnv": [
            {"name": "POD_MTU", "valueFrom": {"configMapKeyRef": {"name": "net", "key": "mtu"}}},
            {"name": "ENABLE_BANDWIDTH_PLUGIN", "valueFrom": {"configMapKeyRef": {"name": "net", "key": "bw"}}},
        ],
    },
    # A template shaped like upstream's misc/10-aws.conflist (written here field by field):
    # aws-cni, egress-cni with its IPAM placeholders, portmap.
    "upstream-style-template": {
        "cniConfig": {"enabled": True, "fileContents": json.dumps({
            "cniVersion": "0.4.0", "name": "aws-cni", "disableCheck": True,
            "plugins": [
                {"name": "aws-cni", "type": "aws-cni", "vethPrefix": "__VETHPREFIX__", "mtu": "__MTU__",
                 "podSGEnforcingMode": "__PODSGENFORCINGMODE__", "pluginLogFile": "__PLUGINLOGFILE__",
                 "pluginLogLevel": "__PLUGINLOGLEVEL__", "capabilities": {"io.kubernetes.cri.pod-annotations": True}},
                {"name": "egress-cni", "type": "egress-cni", "mtu": "__MTU__", "enabled": "__EGRESSPLUGINENABLED__",
                 "randomizeSNAT": "__RANDOMIZESNAT__", "nodeIP": "__NODEIP__",
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": "__EGRESSPLUGINIPAMSUBNET__"}]],
                          "routes": [{"dst": "__EGRESSPLUGINIPAMDST__"}], "dataDir": "__EGRESSPLUGINIPAMDATADIR__"},
                 "pluginLogFile": "__EGRESSPLUGINLOGFILE__", "pluginLogLevel": "__PLUGINLOGLEVEL__"},
                {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
            ]}, indent=2)},
        "env": {"DISABLE_POD_V6": "true"},
    },
    "everything-on": {
        "cniConfig": {"enabled": True, "fileContents": json.dumps({"cniVersion": "0.4.0", "name": "aws-cni", "plugins": [{"type": "aws-cni", "mtu": "9001", "vethPrefix": "eni"}]})},
        "podMonitor": {"create": True, "labels": {"release": "prom"}},
        "eniConfig": {"create": True, "subnets": {"us-west-2a": {"id": "subnet-1", "securityGroups": ["sg-1"]}}},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/cni"}},
        "env": {"ENABLE_PREFIX_DELEGATION": "true", "ANNOTATE_POD_IP": "true"},
        "extraEnv": [{"name": "CLUSTER_NAME", "value": "demo"}],
        "originalMatchLabels": True,
        "startupTaint": {"enabled": True, "key": "example.com/agent-not-ready"},
        "addressCapacity": {"condition": True, "taint": True},
    },
    # Ours (issue 41): each address-capacity publication alone grants only its own right.
    "address-capacity-condition": {"addressCapacity": {"condition": True}},
    "address-capacity-taint": {"addressCapacity": {"taint": True}},
    # Ours (issue 29): alert rules and dashboard; the PrometheusRule's expressions are checked
    # by promtool in integration/tests/observability.rs.
    "observability": {
        "prometheusRule": {"create": True, "labels": {"release": "prom"}, "exhaustionHours": 12},
        "dashboard": {"create": True, "namespace": "monitoring"},
    },
}

# What kubelet would resolve each valueFrom entry to, per value set.
VALUE_FROM = {"extra-env-value-from": {"POD_MTU": "1400", "ENABLE_BANDWIDTH_PLUGIN": "true"}}

# The plugins upstream's entrypoint installs after aws-cni: its template's egress-cni (disabled
# unless ENABLE_V6_EGRESS; IPv4-cluster constants egressPluginIpam*V6) and portmap, then
# bandwidth (ENABLE_BANDWIDTH_PLUGIN) and tuning (DISABLE_POD_V6), in that order.
EGRESS = {
    "name": "egress-cni", "type": "egress-cni", "mtu": "9001", "enabled": "false",
    "randomizeSNAT": "prng", "nodeIP": "",
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "fd00::ac:00/118"}]],
             "routes": [{"dst": "::/0"}], "dataDir": "/run/cni/v4pd/egress-v6-ipam"},
    "pluginLogFile": "/var/log/aws-routed-eni/egress-v6-plugin.log", "pluginLogLevel": "DEBUG",
}
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
# Expected plugins after aws-cni in the INSTALLED conflist, per value set.
EXPECTED_CHAIN = {
    "defaults": [EGRESS, PORTMAP],
    "custom-mtu": [dict(EGRESS, mtu="1500"), PORTMAP],
    "bandwidth-and-no-pod-v6": [EGRESS, PORTMAP, BANDWIDTH, TUNING],
    "no-pod-v6-only": [EGRESS, PORTMAP, TUNING],
    "bandwidth-only": [EGRESS, PORTMAP, BANDWIDTH],
    "custom-template": [PORTMAP, BANDWIDTH],
    "extra-env-value-from": [dict(EGRESS, mtu="1400"), PORTMAP, BANDWIDTH],
    "upstream-style-template": [EGRESS, PORTMAP, TUNING],
    "everything-on": [],
    "observability": [EGRESS, PORTMAP],
}
AWS_CNI = {
    "name": "aws-cni", "type": "aws-cni", "vethPrefix": "eni", "mtu": "9001",
    "podSGEnforcingMode": "strict", "pluginLogFile": "/var/log/aws-routed-eni/plugin.log",
    "pluginLogLevel": "DEBUG", "capabilities": {"io.kubernetes.cri.pod-annotations": True},
}
# The aws-cni entry each value set must end up with (placeholders replaced from the chart's env
# values: AWS_VPC_K8S_PLUGIN_LOG_LEVEL is DEBUG there; POD_MTU over AWS_VPC_ENI_MTU).
EXPECTED_AWS_CNI = {
    "defaults": AWS_CNI,
    "custom-mtu": dict(AWS_CNI, mtu="1500", vethPrefix="pod"),
    "custom-template": {k: v for k, v in dict(AWS_CNI, mtu="1500", pluginLogLevel="INFO").items() if k != "capabilities"},
    "extra-env-value-from": dict(AWS_CNI, mtu="1400"),
    "upstream-style-template": AWS_CNI,
}
# What the init container must copy into /opt/cni/bin (a superset is fine).
# aws-cni-support.sh: upstream's init image installs its support collector there too
# (scripts/dockerfiles/Dockerfile.init copies it into /init, cmd/aws-vpc-cni-init/main.go:156
# installs every file of /init).
INIT_MUST_INSTALL = {"aws-cni", "egress-cni", "host-local", "portmap", "loopback", "bandwidth", "tuning", "aws-cni-support.sh"}

# Kinds served by CRDs: their schema is not in the Kubernetes OpenAPI set.
CRD_KINDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule"), ("crd.k8s.amazonaws.com/v1alpha1", "ENIConfig")}


def startup_taint_problems(name: str, values: dict, doc: dict) -> list:
    """startupTaint and addressCapacity (ours): REMOVE_STARTUP_TAINT /
    IPAMD_ADDRESS_CAPACITY_CONDITION / IPAMD_ADDRESS_CAPACITY_TAINT on aws-node, patch on nodes
    (start-up taint or address-capacity taint) and on nodes/status (condition), only when
    enabled."""
    enabled = values.get("startupTaint", {}).get("enabled", False)
    condition = values.get("addressCapacity", {}).get("condition", False)
    taint = values.get("addressCapacity", {}).get("taint", False)
    if doc["kind"] == "ClusterRole":
        problems = []
        verbs = [r["verbs"] for r in doc["rules"] if r.get("resources") == ["nodes"]]
        if verbs != [["list", "watch", "get"] + (["patch"] if enabled or taint else [])]:
            problems.append(f"{name}: nodes verbs {verbs} with startupTaint.enabled={enabled} addressCapacity.taint={taint}")
        status = [r["verbs"] for r in doc["rules"] if r.get("resources") == ["nodes/status"]]
        if status != ([["patch"]] if condition else []):
            problems.append(f"{name}: nodes/status verbs {status} with addressCapacity.condition={condition}")
        return problems
    env = {e["name"]: e.get("value") for e in container(doc, "aws-node").get("env", [])}
    want = values["startupTaint"]["key"] if enabled else None
    problems = []
    if env.get("REMOVE_STARTUP_TAINT") != want:
        problems.append(f"{name}: REMOVE_STARTUP_TAINT {env.get('REMOVE_STARTUP_TAINT')!r}, want {want!r}")
    for var, on in (("IPAMD_ADDRESS_CAPACITY_CONDITION", condition), ("IPAMD_ADDRESS_CAPACITY_TAINT", taint)):
        if env.get(var) != ("true" if on else None):
            problems.append(f"{name}: {var} {env.get(var)!r} with it {'on' if on else 'off'}")
    return problems


def check_installed(name: str, conf: dict) -> list:
    """The installed conflist: the aws-cni entry and the plugins after it, exactly as upstream's
    entrypoint would install them for the same environment."""
    problems = []
    chain = conf["plugins"][1:]
    if name in EXPECTED_CHAIN and chain != EXPECTED_CHAIN[name]:
        problems.append(f"{name}: installed chain after aws-cni is {json.dumps(chain)}, expected {json.dumps(EXPECTED_CHAIN[name])}")
    if name in EXPECTED_AWS_CNI and conf["plugins"][0] != EXPECTED_AWS_CNI[name]:
        problems.append(f"{name}: installed aws-cni entry is {json.dumps(conf['plugins'][0])}, expected {json.dumps(EXPECTED_AWS_CNI[name])}")
    if "__" in json.dumps(conf):
        problems.append(f"{name}: a placeholder is left in the installed conflist")
    return problems


def container(daemonset: dict, name: str) -> dict:
    return next(c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def run_start_script(name: str, daemonset: dict, template: str, resolved: dict, conflist_bin: str):
    """Runs the aws-node container's start-up script (files/aws-node.sh, the image's ENTRYPOINT:
    the container has no `command`, as upstream's) with /bin/sh, as the container would: its
    rendered environment (valueFrom entries resolved from `resolved`), a stub ipamd that stays up
    until the conflist appears, a health probe that answers at once, and the real
    aws-cni-conflist. Returns (installed conflist text or None, problems)."""
    node = container(daemonset, "aws-node")
    if "command" in node or "args" in node:
        return None, [f"{name}: aws-node has command {node.get('command')} / args {node.get('args')}; "
                      "expected none (the image's ENTRYPOINT, as upstream's manifests)"]
    env = {"PATH": "/usr/bin:/bin"}
    for e in node.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e["name"] in resolved:
            env[e["name"]] = resolved[e["name"]]
    with tempfile.TemporaryDirectory() as tmp:
        app, conf_dir = pathlib.Path(tmp, "app"), pathlib.Path(tmp, "net.d")
        app.mkdir()
        conf_dir.mkdir()
        out = conf_dir / "10-aws.conflist"
        (app / "ipamd").write_text(f"#!/bin/sh\nfor i in $(seq 300); do [ -e '{out}' ] && exit 0; sleep 0.1; done\nexit 3\n")
        (app / "grpc-health-probe").write_text("#!/bin/sh\nexit 0\n")
        for f in ("ipamd", "grpc-health-probe"):
            (app / f).chmod(0o755)
        (app / "aws-cni-conflist").symlink_to(conflist_bin)
        (app / "10-aws.conflist").write_text(template)
        # the plugins aws-node installs itself at every start (as upstream's aws-node does)
        bin_dir = pathlib.Path(tmp, "bin")
        bin_dir.mkdir()
        for f in ("aws-cni", "egress-cni"):
            (app / f).write_text(f"#!/bin/sh\n# {f} of this image\n")
            (app / f).chmod(0o755)
        (bin_dir / "aws-cni").write_text("#!/bin/sh\n# another image's aws-cni\n")
        env.update(AWS_NODE_APP_DIR=str(app), HOST_CNI_CONFDIR_PATH=str(conf_dir), HOST_CNI_BIN_PATH=str(bin_dir))
        run = subprocess.run(["/bin/sh", str(START_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        if run.returncode != 0:
            return None, [f"{name}: start-up script exit {run.returncode}: {run.stderr.strip()}"]
        if not out.exists():
            return None, [f"{name}: start-up script installed no conflist: {run.stderr.strip()}"]
        for f in ("aws-cni", "egress-cni"):
            installed = bin_dir / f
            if not installed.exists() or installed.read_text() != (app / f).read_text():
                return None, [f"{name}: start-up script did not install this image's {f} into HOST_CNI_BIN_PATH"]
        if sorted(p.name for p in bin_dir.iterdir()) != ["aws-cni", "egress-cni"]:
            return None, [f"{name}: start-up script left {sorted(p.name for p in bin_dir.iterdir())} in HOST_CNI_BIN_PATH"]
        return out.read_text(), []


def start_script_refuses_broken_template(daemonset: dict, conflist_bin: str) -> list:
    """A template that is not JSON once filled in: nothing installed, ipamd stopped, exit 1
    (upstream's entrypoint: log.Fatalf)."""
    with tempfile.TemporaryDirectory() as tmp:
        app, conf_dir = pathlib.Path(tmp, "app"), pathlib.Path(tmp, "net.d")
        app.mkdir()
        conf_dir.mkdir()
        (app / "ipamd").write_text("#!/bin/sh\ntrap 'exit 0' TERM\nsleep 30 & wait\n")
        (app / "grpc-health-probe").write_text("#!/bin/sh\nexit 0\n")
        for f in ("ipamd", "grpc-health-probe"):
            (app / f).chmod(0o755)
        (app / "aws-cni-conflist").symlink_to(conflist_bin)
        (app / "10-aws.conflist").write_text('{"plugins": [__MTU__')
        bin_dir = pathlib.Path(tmp, "bin")
        bin_dir.mkdir()
        for f in ("aws-cni", "egress-cni"):
            (app / f).write_text("#!/bin/sh\n")
        env = {"PATH": "/usr/bin:/bin", "AWS_NODE_APP_DIR": str(app), "HOST_CNI_CONFDIR_PATH": str(conf_dir),
               "HOST_CNI_BIN_PATH": str(bin_dir)}
        run = subprocess.run(["/bin/sh", str(START_SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        if run.returncode != 1 or any(conf_dir.iterdir()):
            return [f"broken template: exit {run.returncode}, installed {[p.name for p in conf_dir.iterdir()]}: {run.stderr.strip()}"]
    return []


def init_command_problems(name: str, daemonset: dict) -> list:
    """The init container runs the image's init script by name (files/aws-vpc-cni-init.sh)."""
    inits = daemonset["spec"]["template"]["spec"].get("initContainers") or []
    cmds = [c.get("command") for c in inits if c["name"] == "aws-vpc-cni-init"]
    if cmds != [INIT_COMMAND]:
        return [f"{name}: aws-vpc-cni-init command is {cmds}, expected {INIT_COMMAND}"]
    return []


def init_installs() -> set:
    """The binaries the init script's `for b in ...; do` loop copies."""
    m = re.search(r"for b in ([^;]+);", INIT_SCRIPT.read_text())
    return set(m.group(1).split()) if m else set()


def init_script() -> str:
    """The init script (files/aws-vpc-cni-init.sh), run below with `/bin/sh -ec`."""
    return INIT_SCRIPT.read_text()


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
    # DISABLE_TCP_EARLY_DEMUX as upstream's init reads it (cmd/aws-vpc-cni-init/main.go v1.23.1
    # L85 GetBoolAsStringEnvVar, utils/utils.go L12-21: strconv.ParseBool; any other value
    # gives the default false with "Failed to parse variable ... as boolean", and the init
    # goes on: exit 0).
    demux_rows = [("true", "0"), ("false", "1"), (None, "1")]
    demux_rows += [(v, "0") for v in ["1", "t", "T", "TRUE", "True"]]
    demux_rows += [(v, "1") for v in ["0", "f", "F", "FALSE", "False", "yes", "tRUE", ""]]
    for demux_env, want in demux_rows:
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
            parse_error = f"Failed to parse variable DISABLE_TCP_EARLY_DEMUX with value {demux_env} as boolean"
            if (parse_error in out.stderr) != (demux_env in ("yes", "tRUE", "")):
                problems.append(f"{label}: stderr {out.stderr.strip()!r} (upstream's parse error line expected only for a non-boolean)")
    print(f"init script: ran in a throwaway netns {len(demux_rows) - len(problems)}/{len(demux_rows)} times as expected")
    # HOST_CNI_BIN_PATH moves where the binaries go (cmd/aws-vpc-cni-init/main.go v1.23.1 L153-156:
    # utils.GetEnv(HOST_CNI_BIN_PATH, "/host/opt/cni/bin")); nothing lands in the default dir.
    with tempfile.TemporaryDirectory() as tmp:
        app, bin_dir, moved = pathlib.Path(tmp, "app"), pathlib.Path(tmp, "bin"), pathlib.Path(tmp, "moved")
        for d in (app, bin_dir, moved):
            d.mkdir()
        for b in INIT_MUST_INSTALL:
            (app / b).write_text(f"#!/bin/sh\n# {b}\n")
        body = script.replace("/host/opt/cni/bin", str(bin_dir)).replace("/app/", f"{app}/")
        run_env = {k: v for k, v in env.items() if k != "HOST_CNI_BIN_PATH"}
        run_env.update(PATH="/usr/bin:/bin", HOST_CNI_BIN_PATH=str(moved))
        out = subprocess.run(["unshare", "--net", "/bin/sh", "-ec", body], env=run_env, capture_output=True, text=True)
        label = "init script (HOST_CNI_BIN_PATH)"
        if out.returncode != 0:
            problems.append(f"{label}: exit {out.returncode}: {out.stderr.strip()}")
        else:
            in_moved = {f.name for f in moved.iterdir()}
            in_default = {f.name for f in bin_dir.iterdir()}
            if in_moved != INIT_MUST_INSTALL or in_default:
                problems.append(f"{label}: installed {sorted(in_moved)} there and {sorted(in_default)} in the default dir")
            else:
                print("init script: HOST_CNI_BIN_PATH honoured")
    # ENABLE_V6_EGRESS=true: IPv6 forwarding on (upstream's init); off otherwise.
    for v6_egress, want in [("true", "1"), (None, "0")]:
        with tempfile.TemporaryDirectory() as tmp:
            app, bin_dir = pathlib.Path(tmp, "app"), pathlib.Path(tmp, "bin")
            app.mkdir()
            bin_dir.mkdir()
            for b in INIT_MUST_INSTALL:
                (app / b).write_text(f"#!/bin/sh\n# {b}\n")
            body = script.replace("/host/opt/cni/bin", str(bin_dir)).replace("/app/", f"{app}/")
            run_env = {k: v for k, v in env.items() if k != "ENABLE_V6_EGRESS"}
            run_env["PATH"] = "/usr/bin:/bin"
            if v6_egress is not None:
                run_env["ENABLE_V6_EGRESS"] = v6_egress
            out = subprocess.run(
                ["unshare", "--net", "/bin/sh", "-ec", body + "\ncat /proc/sys/net/ipv6/conf/all/forwarding\n"],
                env=run_env, capture_output=True, text=True,
            )
            label = f"init script (ENABLE_V6_EGRESS={v6_egress})"
            if out.returncode != 0:
                problems.append(f"{label}: exit {out.returncode}: {out.stderr.strip()}")
            elif out.stdout.strip().splitlines()[-1:] != [want]:
                problems.append(f"{label}: ipv6 forwarding is {out.stdout.strip()!r}, expected {want}")
    # ENABLE_IPv6=true: IPv6 on (`all`, and `default` for ENIs attached later: ipamd only
    # checks it), forwarding on, accept_ra=2 on the interface of the default route (a veth of
    # the throwaway netns); unset: those four as the kernel left them. Always: rp_filter=2 on
    # that interface (strict beforehand), which ipamd may not write (issue 37).
    prelude = (
        "ip link add prim0 type veth peer name prim1\n"
        "ip link set prim0 up\n"
        "ip addr add 198.18.0.2/24 dev prim0\n"
        "ip route add default via 198.18.0.1 dev prim0\n"
        "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6\n"
        "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6\n"
        "echo 1 > /proc/sys/net/ipv4/conf/prim0/rp_filter\n"
        "echo 1 > /proc/sys/net/ipv4/conf/prim1/rp_filter\n"
    )
    probe = (
        "\necho $(cat /proc/sys/net/ipv6/conf/all/disable_ipv6"
        " /proc/sys/net/ipv6/conf/default/disable_ipv6"
        " /proc/sys/net/ipv6/conf/all/forwarding /proc/sys/net/ipv6/conf/prim0/accept_ra"
        " /proc/sys/net/ipv4/conf/prim0/rp_filter /proc/sys/net/ipv4/conf/prim1/rp_filter)\n"
    )
    for v6, want in [("true", "0 0 1 2 2 1"), ("dual", "0 0 1 2 2 1"), (None, "1 1 0 1 2 1")]:
        with tempfile.TemporaryDirectory() as tmp:
            app, bin_dir = pathlib.Path(tmp, "app"), pathlib.Path(tmp, "bin")
            app.mkdir()
            bin_dir.mkdir()
            for b in INIT_MUST_INSTALL:
                (app / b).write_text(f"#!/bin/sh\n# {b}\n")
            body = script.replace("/host/opt/cni/bin", str(bin_dir)).replace("/app/", f"{app}/")
            run_env = {
                k: v for k, v in env.items()
                if k not in ("ENABLE_IPv6", "ENABLE_V6_EGRESS", "ENABLE_DUAL_STACK_PODS")
            }
            run_env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
            if v6 == "dual":
                run_env["ENABLE_DUAL_STACK_PODS"] = "true"
            elif v6 is not None:
                run_env["ENABLE_IPv6"] = v6
            out = subprocess.run(
                ["unshare", "--net", "/bin/sh", "-ec", prelude + body + probe],
                env=run_env, capture_output=True, text=True,
            )
            label = f"init script (ENABLE_IPv6={v6})" if v6 != "dual" else "init script (ENABLE_DUAL_STACK_PODS=true)"
            if out.returncode != 0:
                problems.append(f"{label}: exit {out.returncode}: {out.stderr.strip()}")
            elif out.stdout.strip().splitlines()[-1:] != [want]:
                problems.append(
                    f"{label}: disable_ipv6 all/default, forwarding, accept_ra, rp_filter of the default "
                    f"route's interface and of another are {out.stdout.strip()!r}, expected {want!r}"
                )
    return problems


def reference_plugins() -> set:
    """Every reference plugin scripts/build-reference-plugins.sh builds (its `plugins=` list:
    every Linux plugin of containernetworking-plugins), which the Dockerfile copies into /app
    as one directory (`COPY --from=bins /out/reference/ /app/`)."""
    script = (ROOT / "scripts" / "build-reference-plugins.sh").read_text()
    m = re.search(r'^plugins="([^"]+)"', script, re.M)
    return {p.rsplit("/", 1)[-1] for p in m.group(1).split()} if m else set()


# What the init container must install: ours, the support collector and every Linux reference
# plugin (upstream's init image carries them all; issue 39).
INIT_MUST_INSTALL = INIT_MUST_INSTALL | reference_plugins()


def dockerfile_app_binaries() -> set:
    """Binaries the Dockerfile puts into /app: the reference plugins copied from /usr/lib/cni, the
    cargo-built ones copied to /out (COPY --from=build /out/ /app/; the static plugins from
    target/<triple>/release/), and files of the repository
    copied there (COPY scripts/<name> /app/<name>)."""
    text = DOCKERFILE.read_text()
    found = set(re.findall(r"/usr/lib/cni/([\w-]+)", text))
    found |= set(re.findall(r"target/release/([\w-]+)", text))
    # the static plugins, from their own target dir (target/<triple>/release/<name>)
    found |= set(re.findall(r"target/[^\n\"]*?/release/([\w-]+)", text))
    found |= set(re.findall(r"^COPY scripts/[\w.-]+ /app/([\w.-]+)$", text, re.M))
    # what the stages copy out of the `bins` stage (/out/<name>), the reference plugins among them
    found |= set(re.findall(r"/out/([\w-]+)", text)) - {"reference"}
    if "/out/reference/ /app/" in text:
        found |= reference_plugins()
    return found


def dockerfile_problems() -> list:
    """The aws-node stage copies the chart's scripts and template into /app and starts
    aws-node.sh; the init stage copies exactly what the init script installs, plus the script,
    and runs it as its CMD; the last stage (the default target) is the aws-node image."""
    text = DOCKERFILE.read_text()
    problems = []
    stages = re.split(r"^FROM ", text, flags=re.M)
    by_name = {}
    for s in stages[1:]:
        head = s.split("\n", 1)[0].split()
        if len(head) >= 3 and head[1].upper() == "AS":
            by_name[head[2]] = s
    node, init = by_name.get("aws-node", ""), by_name.get("init", "")
    for f in ("aws-node.sh", "aws-vpc-cni-init.sh", "10-aws.conflist"):
        if f"charts/aws-vpc-cni/files/{f}" not in node:
            problems.append(f"Dockerfile: the aws-node stage does not copy files/{f} into /app")
    if 'ENTRYPOINT ["/app/aws-node.sh"]' not in node:
        problems.append("Dockerfile: the aws-node stage's ENTRYPOINT is not /app/aws-node.sh")
    copied = set(re.findall(r"/app/([\w.-]+)", init.split("CMD")[0])) - {""}
    if "/out/reference/ /app/" in init:
        copied |= reference_plugins()
    if copied != init_installs() | {"aws-vpc-cni-init.sh"}:
        problems.append(f"Dockerfile: the init stage copies {sorted(copied)}, the init script installs {sorted(init_installs())}")
    if f"CMD {json.dumps(INIT_COMMAND)}" not in init:
        problems.append(f"Dockerfile: the init stage's CMD is not {INIT_COMMAND}")
    if stages[-1].split("\n", 1)[0].strip() != "aws-node":
        problems.append("Dockerfile: the last stage (default target) is not `FROM aws-node`")
    for f in (START_SCRIPT, INIT_SCRIPT):
        if not os.access(f, os.X_OK):
            problems.append(f"{f.name} is not executable (the image runs it by name)")
    return problems


def main() -> int:
    problems = []
    conflist_bin = os.environ.get("AWS_CNI_CONFLIST_BIN", "")
    if not conflist_bin or not os.access(conflist_bin, os.X_OK):
        print("PROBLEM AWS_CNI_CONFLIST_BIN must name the built aws-cni-conflist binary", file=sys.stderr)
        return 1
    problems += dockerfile_problems()
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
                    template = doc["data"]["10-aws.conflist"]
                    user = values.get("cniConfig", {}).get("fileContents")
                    if user is not None and template != user:
                        problems.append(f"{name}: the user's template is not shipped verbatim")
                if doc["kind"] in ("DaemonSet", "ClusterRole"):
                    problems += startup_taint_problems(name, values, doc)
                if doc["kind"] == "DaemonSet":
                    daemonset = doc
                    problems += init_command_problems(name, doc)
                    installed = init_installs()
                    if not INIT_MUST_INSTALL <= installed:
                        problems.append(f"{name}: init container installs {sorted(installed)}, missing {sorted(INIT_MUST_INSTALL - installed)}")
                    if name == "defaults":
                        problems += run_init_script(init_script(), {})
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
        else:
            text, found = run_start_script(name, daemonset, template, VALUE_FROM.get(name, {}), conflist_bin)
            problems += found
            if text is not None:
                try:
                    conf = json.loads(text)
                    problems += check_installed(name, conf)
                    chain = " -> ".join(p.get("type", "?") for p in conf["plugins"])
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    problems.append(f"{name}: installed 10-aws.conflist is not a valid conflist: {e!r}")
            if name == "defaults":
                problems += start_script_refuses_broken_template(daemonset, conflist_bin)
        print(f"{name}: rendered {len(kinds)} objects: {', '.join(sorted(kinds))}; conflist: {chain}")
    # crds/kustomization.yaml (kubectl apply -k, as upstream ships it) must name the CRD file and
    # stay out of the Helm package (.helmignore), or Helm would install it as a CRD.
    kust = yaml.safe_load((CHART / "crds" / "kustomization.yaml").read_text())
    if kust.get("resources") != ["customresourcedefinition.yaml"]:
        problems.append(f"crds/kustomization.yaml resources are {kust.get('resources')}")
    if "crds/kustomization.yaml" not in (CHART / ".helmignore").read_text().split():
        problems.append(".helmignore does not keep crds/kustomization.yaml out of the chart")
    for crd in CHART.glob("crds/customresourcedefinition.yaml"):
        for doc in yaml.safe_load_all(crd.read_text()):
            if "status" not in doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]:
                problems.append("ENIConfig CRD has no status schema (upstream's has one)")
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{crd.name}: {e.message}")

    for p in problems:
        print(f"PROBLEM {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
