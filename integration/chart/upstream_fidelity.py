#!/usr/bin/env python3
"""Renders charts/aws-vpc-cni with real Helm (helm-python-sdk) for value sets an upstream user
may have (every-upstream-key.yaml sets every key of upstream v1.23.1's values.yaml) and checks
the labels, selectors, ConfigMap keys, env, images and sidecar of the result against what
upstream's chart renders for the same values. The expectations are written here as tables, each
row citing the upstream file (amazon-vpc-cni-k8s v1.23.1) the fact comes from; upstream's files
are not needed to run this. Deliberate differences are rows too, marked OURS with the reason.
Exits non-zero with the findings on any mismatch.
"""
import json
import pathlib
import sys

import helm_python as helm
import yaml

HERE = pathlib.Path(__file__).resolve().parent
CHART = HERE.parents[1] / "charts" / "aws-vpc-cni"
RELEASE, NAMESPACE = "aws-vpc-cni", "kube-system"

UP_DS = "charts/aws-vpc-cni/templates/daemonset.yaml"
UP_CM = "charts/aws-vpc-cni/templates/configmap.yaml"
UP_HELPERS = "charts/aws-vpc-cni/templates/_helpers.tpl"
UP_PM = "charts/aws-vpc-cni/templates/podmonitor.yaml"
UP_CR = "charts/aws-vpc-cni/templates/clusterrole.yaml"
UP_VALUES = "charts/aws-vpc-cni/values.yaml"

FULL = yaml.safe_load((HERE / "every-upstream-key.yaml").read_text())

# The labels upstream's "aws-vpc-cni.labels" puts on every object (helm.sh/chart and
# app.kubernetes.io/version carry each chart's own version and are only checked for presence).
COMMON = {"app.kubernetes.io/name": "vpc-node", "app.kubernetes.io/instance": RELEASE,
          "k8s-app": "aws-node", "app.kubernetes.io/managed-by": "Helm"}

# aws-node's env for every-upstream-key.yaml: .Values.env in key order, then extraEnv, then the
# downward-API pair with apiVersion v1.
FULL_ENV = [
    ("ADDITIONAL_ENI_TAGS", '{"team":"net"}'), ("AWS_VPC_CNI_NODE_PORT_SUPPORT", "false"),
    ("AWS_VPC_ENI_MTU", "1500"), ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "false"),
    ("AWS_VPC_K8S_CNI_EXTERNALSNAT", "true"), ("AWS_VPC_K8S_CNI_LOGLEVEL", "INFO"),
    ("AWS_VPC_K8S_CNI_LOG_FILE", "stdout"), ("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "hashrandom"),
    ("AWS_VPC_K8S_CNI_VETHPREFIX", "pod"), ("AWS_VPC_K8S_PLUGIN_LOG_FILE", "/var/log/aws-routed-eni/p.log"),
    ("AWS_VPC_K8S_PLUGIN_LOG_LEVEL", "INFO"), ("DISABLE_INTROSPECTION", "true"), ("DISABLE_METRICS", "true"),
    ("DISABLE_NETWORK_RESOURCE_PROVISIONING", "false"), ("ENABLE_IMDS_ONLY_MODE", "false"),
    ("ENABLE_IPv4", "true"), ("ENABLE_IPv6", "false"), ("ENABLE_MULTI_NIC", "false"),
    ("ENABLE_POD_ENI", "false"), ("ENABLE_PREFIX_DELEGATION", "true"), ("ENABLE_SUBNET_DISCOVERY", "false"),
    ("NETWORK_POLICY_ENFORCING_MODE", "strict"), ("VPC_CNI_VERSION", "v9.9.0"),
    ("WARM_ENI_TARGET", "2"), ("WARM_PREFIX_TARGET", "3"),
    ("CLUSTER_NAME", {"configMapKeyRef": {"name": "cluster-info", "key": "name"}}),
    ("MY_NODE_NAME", {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}),
    ("MY_POD_NAME", {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}),
]
# The defaults: upstream values.yaml's env, in key order (VPC_CNI_VERSION differs: OURS).
DEFAULT_ENV = [
    ("ADDITIONAL_ENI_TAGS", "{}"), ("AWS_VPC_CNI_NODE_PORT_SUPPORT", "true"), ("AWS_VPC_ENI_MTU", "9001"),
    ("AWS_VPC_K8S_CNI_CUSTOM_NETWORK_CFG", "false"), ("AWS_VPC_K8S_CNI_EXTERNALSNAT", "false"),
    ("AWS_VPC_K8S_CNI_LOGLEVEL", "DEBUG"), ("AWS_VPC_K8S_CNI_LOG_FILE", "/host/var/log/aws-routed-eni/ipamd.log"),
    ("AWS_VPC_K8S_CNI_RANDOMIZESNAT", "prng"), ("AWS_VPC_K8S_CNI_VETHPREFIX", "eni"),
    ("AWS_VPC_K8S_PLUGIN_LOG_FILE", "/var/log/aws-routed-eni/plugin.log"), ("AWS_VPC_K8S_PLUGIN_LOG_LEVEL", "DEBUG"),
    ("DISABLE_INTROSPECTION", "false"), ("DISABLE_METRICS", "false"), ("DISABLE_NETWORK_RESOURCE_PROVISIONING", "false"),
    ("ENABLE_IMDS_ONLY_MODE", "false"), ("ENABLE_IPv4", "true"), ("ENABLE_IPv6", "false"), ("ENABLE_MULTI_NIC", "false"),
    ("ENABLE_POD_ENI", "false"), ("ENABLE_PREFIX_DELEGATION", "false"), ("ENABLE_SUBNET_DISCOVERY", "true"),
    ("NETWORK_POLICY_ENFORCING_MODE", "standard"), ("VPC_CNI_VERSION", "APPVERSION"),
    ("WARM_ENI_TARGET", "1"), ("WARM_PREFIX_TARGET", "1"),
    ("MY_NODE_NAME", {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}),
    ("MY_POD_NAME", {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}),
]


def with_values(base: dict, **changes) -> dict:
    out = json.loads(json.dumps(base))
    for path, value in changes.items():
        d = out
        keys = path.split("__")
        for k in keys[:-1]:
            d = d.setdefault(k, {})
        d[keys[-1]] = value
    return out


VALUE_SETS = {
    "every-upstream-key": FULL,
    "defaults": {},
    # Upstream's image keys with our `repository` cleared: upstream's ECR form.
    "ecr-form": {"image": {"repository": "", "tag": "v1.23.1"}, "init": {"image": {"repository": "", "tag": "v1.23.1"}}},
    "overrides": {"image": {"override": "reg.example/cni:1"}, "init": {"image": {"overrideRepository": "reg.example/init", "tag": "v2"}},
                  "nodeAgent": {"image": {"overrideRepository": "reg.example/npa", "tag": "v3"}}},
    "original-match-labels": with_values(FULL, originalMatchLabels=True),
    "node-agent-off": with_values(FULL, nodeAgent__enabled=False),
    "cni-config": {"cniConfig": {"enabled": True, "fileContents": '{"cniVersion":"0.4.0","name":"aws-cni","plugins":[{"type":"aws-cni"}]}'}},
}

# (value set, object kind/name, what, expected, upstream source).
def ds(name="vpc-node-full"):
    return ("DaemonSet", name)


ROWS = [
    # Labels and selectors.
    ("every-upstream-key", ds(), "metadata.labels⊇", COMMON, UP_HELPERS + ' "aws-vpc-cni.labels"'),
    ("every-upstream-key", ("ConfigMap", "amazon-vpc-cni"), "metadata.labels⊇", COMMON, UP_CM),
    ("every-upstream-key", ("ClusterRole", "vpc-node-full"), "metadata.labels⊇", COMMON, UP_CR),
    ("every-upstream-key", ("ServiceAccount", "vpc-sa"), "metadata.labels⊇", COMMON, "charts/aws-vpc-cni/templates/serviceaccount.yaml"),
    ("every-upstream-key", ds(), "spec.selector.matchLabels",
     {"app.kubernetes.io/name": "vpc-node", "app.kubernetes.io/instance": RELEASE, "tier": "network"},
     UP_DS + " (selector: name, instance and podLabels unless originalMatchLabels)"),
    ("every-upstream-key", ds(), "spec.template.metadata.labels",
     {"app.kubernetes.io/name": "vpc-node", "app.kubernetes.io/instance": RELEASE, "k8s-app": "aws-node", "tier": "network"},
     UP_DS + " (pod labels always carry k8s-app: aws-node)"),
    ("every-upstream-key", ds(), "spec.template.metadata.annotations", {"team": "net"}, UP_DS),
    ("original-match-labels", ds(), "spec.selector.matchLabels", {"k8s-app": "aws-node"}, UP_DS),
    ("original-match-labels", ds(), "spec.template.metadata.labels",
     {"app.kubernetes.io/name": "vpc-node", "app.kubernetes.io/instance": RELEASE, "k8s-app": "aws-node", "tier": "network"}, UP_DS),
    ("defaults", ds("aws-node"), "spec.selector.matchLabels",
     {"app.kubernetes.io/name": "aws-node", "app.kubernetes.io/instance": RELEASE}, UP_DS + ", " + UP_VALUES),
    ("defaults", ds("aws-node"), "spec.template.metadata.labels",
     {"app.kubernetes.io/name": "aws-node", "app.kubernetes.io/instance": RELEASE, "k8s-app": "aws-node"}, UP_DS),
    # The cluster ConfigMap.
    ("every-upstream-key", ("ConfigMap", "amazon-vpc-cni"), "data",
     {"enable-windows-ipam": "true", "enable-network-policy-controller": "true", "enable-windows-prefix-delegation": "true",
      "warm-prefix-target": "2", "warm-ip-target": "5", "minimum-ip-target": "7", "branch-eni-cooldown": "90"}, UP_CM),
    ("defaults", ("ConfigMap", "amazon-vpc-cni"), "data",
     {"enable-windows-ipam": "false", "enable-network-policy-controller": "false", "enable-windows-prefix-delegation": "false",
      "warm-prefix-target": "0", "warm-ip-target": "1", "minimum-ip-target": "3", "branch-eni-cooldown": "60"}, UP_CM + ", " + UP_VALUES),
    # Environment.
    ("every-upstream-key", ds(), "container aws-node env", FULL_ENV, UP_DS + " (env range, extraEnv, MY_NODE_NAME, MY_POD_NAME)"),
    ("defaults", ds("aws-node"), "container aws-node env", DEFAULT_ENV,
     UP_VALUES + " env; OURS: VPC_CNI_VERSION defaults to this chart's appVersion (upstream's values hold its own tag)"),
    ("node-agent-off", ds(), "container aws-node env names",
     [n for n, _ in FULL_ENV if n != "NETWORK_POLICY_ENFORCING_MODE"], UP_DS + " ($skipKey without nodeAgent)"),
    ("every-upstream-key", ds(), "initContainer aws-vpc-cni-init env",
     [("DISABLE_TCP_EARLY_DEMUX", "true"), ("ENABLE_IPv6", "false")], UP_DS),
    # Images, pull policies, resources, mounts.
    ("ecr-form", ds("aws-node"), "container aws-node image", "602401143452.dkr.ecr.us-west-2.amazonaws.com/amazon-k8s-cni:v1.23.1", UP_HELPERS + ' "aws-vpc-cni.image"'),
    ("ecr-form", ds("aws-node"), "initContainer aws-vpc-cni-init image", "602401143452.dkr.ecr.us-west-2.amazonaws.com/amazon-k8s-cni-init:v1.23.1", UP_HELPERS + ' "aws-vpc-cni.initImage"'),
    ("overrides", ds("aws-node"), "container aws-node image", "reg.example/cni:1", UP_HELPERS + " (override)"),
    ("overrides", ds("aws-node"), "initContainer aws-vpc-cni-init image", "reg.example/init:v2", UP_HELPERS + " (overrideRepository:tag)"),
    ("overrides", ds("aws-node"), "container aws-eks-nodeagent image", "reg.example/npa:v3", UP_HELPERS + ' "aws-vpc-cni.nodeAgentImage"'),
    ("every-upstream-key", ds(), "container aws-node image", "ghcr.io/example/aws-vpc-cni-rs:v9.9.0",
     "OURS: `repository` (this project's image) wins over the ECR form, whose registry holds upstream's image"),
    ("every-upstream-key", ds(), "container aws-node imagePullPolicy", "Always", UP_DS),
    ("every-upstream-key", ds(), "initContainer aws-vpc-cni-init imagePullPolicy", "Always", UP_DS),
    ("every-upstream-key", ds(), "initContainer aws-vpc-cni-init resources", {"requests": {"cpu": "11m"}}, UP_DS),
    ("defaults", ds("aws-node"), "initContainer aws-vpc-cni-init resources", {"requests": {"cpu": "25m"}}, UP_DS + " (default .Values.resources .Values.init.resources)"),
    ("every-upstream-key", ds(), "initContainer aws-vpc-cni-init volumeMounts",
     [{"mountPath": "/host/opt/cni/bin", "name": "cni-bin-dir"}, {"mountPath": "/extra", "name": "extra"}], UP_DS + " (extraVolumeMounts)"),
    ("every-upstream-key", ds(), "container aws-node resources", {"requests": {"cpu": "30m"}}, UP_DS),
    ("every-upstream-key", ds(), "spec.template.spec.priorityClassName", "system-cluster-critical", UP_DS),
    ("every-upstream-key", ds(), "spec.template.spec.serviceAccountName", "vpc-sa", UP_DS),
    ("every-upstream-key", ds(), "spec.template.spec.imagePullSecrets", [{"name": "regcred"}], UP_DS),
    # The network policy agent.
    ("every-upstream-key", ds(), "container aws-eks-nodeagent image",
     "444455556666.dkr.ecr-fips.cn-north-1.amazonaws.com.cn/amazon/aws-network-policy-agent:v9.9.2", UP_HELPERS),
    ("defaults", ds("aws-node"), "container aws-eks-nodeagent image",
     "602401143452.dkr.ecr.us-west-2.amazonaws.com/amazon/aws-network-policy-agent:v1.4.2", UP_HELPERS + ", " + UP_VALUES),
    ("every-upstream-key", ds(), "container aws-eks-nodeagent args",
     ["--enable-ipv6=true", "--enable-network-policy=true", "--enable-cloudwatch-logs=true",
      "--enable-policy-event-logs=true", "--log-file=/var/log/aws-routed-eni/npa.log",
      "--metrics-bind-addr=:9162", "--health-probe-bind-addr=:9163", "--conntrack-cache-cleanup-period=600",
      "--conntrack-cache-table-size=1048576", "--log-level=info"],
     UP_DS + "; OURS: whole numbers are written as integers (upstream writes 1048576 as 1.048576e+06, "
     "which the agent's integer flag cannot parse)"),
    ("every-upstream-key", ds(), "container aws-eks-nodeagent ports", [{"containerPort": 9162, "name": "agentmetrics"}], UP_DS),
    ("every-upstream-key", ds(), "container aws-eks-nodeagent env",
     [("MY_NODE_NAME", {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}})], UP_DS),
    ("every-upstream-key", ds(), "container aws-eks-nodeagent securityContext",
     {"capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"]}, "privileged": True}, UP_DS),
    ("every-upstream-key", ds(), "container aws-eks-nodeagent resources", {"requests": {"cpu": "12m"}}, UP_DS),
    ("every-upstream-key", ds(), "container aws-eks-nodeagent volumeMounts",
     [{"mountPath": "/host/opt/cni/bin", "name": "cni-bin-dir"}, {"mountPath": "/sys/fs/bpf", "name": "bpf-pin-path"},
      {"mountPath": "/var/log/aws-routed-eni", "name": "log-dir"}, {"mountPath": "/var/run/aws-node", "name": "run-dir"}], UP_DS),
    ("every-upstream-key", ds(), "volume bpf-pin-path", {"name": "bpf-pin-path", "hostPath": {"path": "/sys/fs/bpf"}}, UP_DS),
    ("node-agent-off", ds(), "container names", ["aws-node"], UP_DS),
    ("every-upstream-key", ds(), "container names", ["aws-node", "aws-eks-nodeagent"], UP_DS),
    # PodMonitor.
    ("every-upstream-key", ("PodMonitor", "vpc-node-full"), "metadata.labels", {"release": "prom"}, UP_PM),
    ("every-upstream-key", ("PodMonitor", "vpc-node-full"), "spec.selector", {"matchLabels": {"k8s-app": "aws-node"}}, UP_PM),
    ("every-upstream-key", ("PodMonitor", "vpc-node-full"), "spec.jobLabel", "vpc-node-full", UP_PM),
    ("every-upstream-key", ("PodMonitor", "vpc-node-full"), "spec.podMetricsEndpoints",
     [{"interval": "15s", "scrapeTimeout": "10s", "path": "/metrics", "port": port,
       "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]}
      for port in ("metrics", "agentmetrics")], UP_PM),
    # RBAC the agent needs.
    ("every-upstream-key", ("ClusterRole", "vpc-node-full"), "rule networking.k8s.aws",
     [["policyendpoints", "clusterpolicyendpoints"], ["policyendpoints/status", "clusterpolicyendpoints/status"]], UP_CR),
    # Object names.
    ("defaults", ds("aws-node"), "metadata.name", "aws-node", UP_HELPERS + ' "aws-vpc-cni.fullname", ' + UP_VALUES),
    ("cni-config", ds("aws-node"), "metadata.name", "aws-node", UP_HELPERS),
]


def get(doc: dict, what: str):
    """The value a row names: a dotted path, or a container's / volume's field."""
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    words = what.split(" ")
    if words[0] in ("container", "initContainer") and len(words) >= 3:
        key = "containers" if words[0] == "container" else "initContainers"
        c = next((c for c in spec.get(key, []) if c["name"] == words[1]), None)
        if c is None:
            return f"<no {words[0]} {words[1]}>"
        if words[2] == "env":
            env = [(e["name"], e.get("value", e.get("valueFrom"))) for e in c.get("env", [])]
            return [n for n, _ in env] if words[3:] == ["names"] else env
        return c.get(words[2])
    if what == "container names":
        return [c["name"] for c in spec.get("containers", [])]
    if words[0] == "volume":
        return next((v for v in spec.get("volumes", []) if v["name"] == words[1]), None)
    if what == "rule networking.k8s.aws":
        return [r["resources"] for r in doc["rules"] if "networking.k8s.aws" in r.get("apiGroups", [])]
    cur = doc
    for k in what.rstrip("⊇").split("."):
        cur = cur.get(k) if isinstance(cur, dict) else None
    return cur


def main() -> int:
    chart = helm.Chart.load(str(CHART))
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    rendered = {}
    for name, values in VALUE_SETS.items():
        objects = {}
        for path, text in chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True).items():
            if path.endswith(".yaml"):
                for doc in yaml.safe_load_all(text):
                    if doc:
                        objects[(doc["kind"], doc["metadata"]["name"])] = doc
        rendered[name] = objects
    problems, checked = [], {}
    for value_set, obj, what, want, source in ROWS:
        doc = rendered[value_set].get(obj)
        if doc is None:
            problems.append(f"{value_set}: no {obj} rendered ({source})")
            continue
        got = get(doc, what)
        want = json.loads(json.dumps(want).replace("APPVERSION", app_version))
        if isinstance(want, list) and want and isinstance(want[0], list) and isinstance(got, list):
            want = [tuple(w) if len(w) == 2 and isinstance(w[0], str) else w for w in want]
            got = [tuple(g) if isinstance(g, (list, tuple)) and len(g) == 2 and isinstance(g[0], str) else g for g in got]
        if what.endswith("⊇"):
            ok = isinstance(got, dict) and all(got.get(k) == v for k, v in want.items()) \
                and "helm.sh/chart" in got and "app.kubernetes.io/version" in got
        else:
            ok = json.loads(json.dumps(got)) == json.loads(json.dumps(want))
        if not ok:
            problems.append(f"{value_set}: {obj[0]}/{obj[1]} {what}:\n   got  {json.dumps(got)}\n   want {json.dumps(want)}\n   ({source})")
        checked[value_set] = checked.get(value_set, 0) + 1
    for name in VALUE_SETS:
        bad = [p for p in problems if p.startswith(name + ":")]
        print(f"{name}: {'matches' if not bad else 'DIFFERS'} ({checked.get(name, 0)} rows)")
    for p in problems:
        print(f"PROBLEM {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
