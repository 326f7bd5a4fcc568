"""Renders charts/aws-vpc-cni with real Helm (default values, or the JSON values given as the first
argument, e.g. '{"nodeAgent":{"enabled":false}}') and prints, as JSON, what the image test
(integration/tests/image.rs) and the network-policy test (integration/tests/network_policy.rs) run: the init and aws-node containers' command (null: the image's own), environment
(valueFrom entries resolved to fixed test values), securityContext, probes, and the conflist
template the ConfigMap mounts at /app/10-aws.conflist."""
import json
import pathlib
import sys

import helm_python as helm
import yaml

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "aws-vpc-cni"


def env_of(c: dict) -> dict:
    out = {}
    for e in c.get("env", []):
        out[e["name"]] = e["value"] if "value" in e else "image-test-" + e["name"].lower()
    return out


def main() -> None:
    values = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    rendered = helm.Chart.load(str(CHART)).render(values, name="aws-vpc-cni", namespace="kube-system", is_install=True)
    ds, template = None, None
    for path, text in rendered.items():
        if not path.endswith(".yaml"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc and doc.get("kind") == "DaemonSet":
                ds = doc
            if doc and doc.get("kind") == "ConfigMap" and "10-aws.conflist" in doc.get("data", {}):
                template = doc["data"]["10-aws.conflist"]
    spec = ds["spec"]["template"]["spec"]
    init = spec["initContainers"][0]
    node = next(c for c in spec["containers"] if c["name"] == "aws-node")
    print(json.dumps({
        "containers": [c["name"] for c in spec["containers"]],
        "init": {"command": init.get("command"), "env": env_of(init), "securityContext": init.get("securityContext", {})},
        "node": {"command": node.get("command"), "env": env_of(node), "securityContext": node.get("securityContext", {}),
                 "liveness": node["livenessProbe"]["exec"]["command"],
                 "readiness": node["readinessProbe"]["exec"]["command"]},
        "conflist_template": template,
    }))


main()
