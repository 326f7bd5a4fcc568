#!/usr/bin/env python3
"""Lints and renders charts/aws-vpc-cni with real Helm (helm-python-sdk bundles Helm's Go SDK)
and validates every rendered manifest against the Kubernetes OpenAPI schemas
(kubernetes-validate). Exits non-zero with the findings on any problem.

Value sets: the defaults, and one with every optional feature switched on.
"""
import json
import pathlib
import sys

import helm_python as helm
import kubernetes_validate
import yaml

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "aws-vpc-cni"
KUBE_VERSION = "1.30.0"

VALUE_SETS = {
    "defaults": {},
    "custom-mtu": {"env": {"POD_MTU": "1500", "AWS_VPC_K8S_CNI_VETHPREFIX": "pod"}},
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

# Kinds served by CRDs: their schema is not in the Kubernetes OpenAPI set.
CRD_KINDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("crd.k8s.amazonaws.com/v1alpha1", "ENIConfig")}


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
        for path, text in sorted(rendered.items()):
            if not path.endswith(".yaml"):
                continue
            for doc in yaml.safe_load_all(text):
                if not doc:
                    continue
                kinds.append(doc["kind"])
                if doc["kind"] == "ConfigMap" and "10-aws.conflist" in doc.get("data", {}):
                    try:
                        conf = json.loads(doc["data"]["10-aws.conflist"])
                        first = conf["plugins"][0]
                        if first["type"] != "aws-cni" or not first.get("mtu") or not first.get("vethPrefix"):
                            problems.append(f"{name}: conflist's first plugin is not a complete aws-cni entry: {first}")
                    except (ValueError, KeyError, IndexError) as e:
                        problems.append(f"{name}: 10-aws.conflist is not a valid conflist: {e!r}")
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
        print(f"{name}: rendered {len(kinds)} objects: {', '.join(sorted(kinds))}")
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
