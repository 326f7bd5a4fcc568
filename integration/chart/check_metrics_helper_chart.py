#!/usr/bin/env python3
"""Lints and renders charts/cni-metrics-helper with real Helm (helm-python-sdk) and validates
every rendered object against the Kubernetes schemas (kubernetes-validate). With `--emit PATH`
it also writes the default rendering (namespace kube-system), which the e2e test applies to
the API simulator so the helper runs with exactly the chart's RBAC.
"""
import pathlib
import sys

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "cni-metrics-helper"
KUBE_VERSION = "1.30.0"

VALUE_SETS = {
    "defaults": {},
    "prometheus": {"env": {"USE_PROMETHEUS": "true", "USE_CLOUDWATCH": "false", "AWS_CLUSTER_ID": "prod"}},
    "existing-sa-upstream-image": {"serviceAccount": {"create": False}, "image": {"repository": "", "tag": "v9"}},
    "override-everything": {
        "image": {"override": "reg/x:1"}, "resources": {"limits": {"memory": "64Mi"}},
        "tolerations": [{"operator": "Exists"}], "podAnnotations": {"a": "b"},
        "updateStrategy": {"type": "RollingUpdate"}, "nodeSelector": {"kubernetes.io/os": "linux"},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}},
    },
}


def main() -> int:
    emit = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--emit" else None
    problems = []
    report = helm.lint(str(CHART), strict=True, kube_version=f"v{KUBE_VERSION}")
    problems += [f"lint: {m}" for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    problems += [f"lint: {e}" for e in report.get("errors", []) or []]
    chart = helm.Chart.load(str(CHART))
    for name, values in VALUE_SETS.items():
        rendered = chart.render(values, name="cni-metrics-helper", namespace="kube-system", is_install=True)
        docs = [d for p, t in sorted(rendered.items()) if p.endswith(".yaml") for d in yaml.safe_load_all(t) if d]
        kinds = {d["kind"]: d for d in docs}
        for d in docs:
            try:
                kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{name}: {d['kind']}: {e.message} at {list(e.path)}")
        dep = kinds.get("Deployment")
        if dep is None or "ClusterRole" not in kinds or "ClusterRoleBinding" not in kinds:
            problems.append(f"{name}: missing Deployment/ClusterRole/ClusterRoleBinding")
            continue
        c = dep["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in c["env"]}
        ports = [p["containerPort"] for p in c.get("ports", [])]
        sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
        if name == "defaults":
            want = {"USE_CLOUDWATCH": "true", "USE_PROMETHEUS": "false", "AWS_CLUSTER_ID": "", "AWS_VPC_K8S_CNI_LOGLEVEL": "INFO"}
            if env != want or ports or sa != "cni-metrics-helper" or "ServiceAccount" not in kinds:
                problems.append(f"defaults: env {env} ports {ports} sa {sa}")
            if c["image"] != "ghcr.io/example/cni-metrics-helper-rs:0.1.0":
                problems.append(f"defaults: image {c['image']}")
            rules = kinds["ClusterRole"]["rules"]
            if rules != [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                         {"apiGroups": [""], "resources": ["pods/proxy"], "verbs": ["get"]},
                         {"apiGroups": ["crd.k8s.amazonaws.com"], "resources": ["eniconfigs"], "verbs": ["list"]}]:
                problems.append(f"defaults: rules {rules}")
            if emit:
                pathlib.Path(emit).write_text(yaml.safe_dump_all(docs))
        if name == "prometheus" and (ports != [61681] or env["AWS_CLUSTER_ID"] != "prod"):
            problems.append(f"prometheus: ports {ports} env {env}")
        if name == "existing-sa-upstream-image":
            if "ServiceAccount" in kinds or sa != "aws-vpc-cni":
                problems.append(f"existing-sa: sa {sa}")
            if c["image"] != "602401143452.dkr.ecr.us-west-2.amazonaws.com/cni-metrics-helper:v9":
                problems.append(f"existing-sa: image {c['image']}")
        if name == "override-everything" and c["image"] != "reg/x:1":
            problems.append(f"override: image {c['image']}")
        print(f"{name}: rendered {sorted(kinds)}")
    for p in problems:
        print("PROBLEM", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
