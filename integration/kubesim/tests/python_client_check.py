#!/usr/bin/env python3
"""Cross-checks kubesim with the official Python client (PyPI `kubernetes`), which we did not
write: get/list/watch/label/annotate/apply/create/delete, CRD objects, 422/409/404/403 as
ApiException codes, watch resume and 410. Run by tests/real_clients.rs with the admin and the
aws-node ServiceAccount kubeconfigs of a running simulator whose RBAC is the chart's.
Exits non-zero with the failed check.
"""
import sys
import threading
import time

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

ADMIN_KC, SA_KC = sys.argv[1], sys.argv[2]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)
    checks += 1


def status_of(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except ApiException as e:
        return e.status
    return 200


admin = config.new_client_from_config(config_file=ADMIN_KC)
sa = config.new_client_from_config(config_file=SA_KC)
core, crd = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
sa_core, sa_crd = client.CoreV1Api(sa), client.CustomObjectsApi(sa)
G, V, P = "crd.k8s.amazonaws.com", "v1alpha1", "eniconfigs"

# discovery
groups = [g.name for g in client.ApisApi(admin).get_api_versions().groups]
check("crd.k8s.amazonaws.com" in groups, f"ENIConfig group in discovery: {groups}")
check(client.VersionApi(admin).get_code().git_version.startswith("v1.30"), "version")

# nodes: create, label (strategic merge), annotate (merge patch), list with selector
node = client.V1Node(metadata=client.V1ObjectMeta(name="py-node", labels={"topology.kubernetes.io/zone": "us-west-2a"}))
created = core.create_node(node)
check(created.metadata.uid and created.metadata.resource_version, "node created with uid and rv")
core.patch_node("py-node", {"metadata": {"labels": {"vpc.amazonaws.com/externalEniConfig": "custom"}}},
                _content_type="application/strategic-merge-patch+json")
core.patch_node("py-node", {"metadata": {"annotations": {"k8s.amazonaws.com/eniConfig": "ann"}}},
                _content_type="application/merge-patch+json")
core.patch_node("py-node", [{"op": "add", "path": "/metadata/labels/jp", "value": "1"}])
got = core.read_node("py-node")
check(got.metadata.labels.get("vpc.amazonaws.com/externalEniConfig") == "custom", "label via strategic merge")
check(got.metadata.annotations.get("k8s.amazonaws.com/eniConfig") == "ann", "annotation via merge patch")
check(got.metadata.labels.get("jp") == "1", "label via JSON patch")
sel = core.list_node(label_selector="topology.kubernetes.io/zone=us-west-2a,jp")
check([n.metadata.name for n in sel.items] == ["py-node"], "label selector list")
check(core.list_node(label_selector="topology.kubernetes.io/zone=us-west-2b").items == [], "non-matching selector")

# configmaps: create, 409 AlreadyExists, stale update 409 Conflict, 404, server-side apply
cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cni-test-config"), data={"enable-network-policy-controller": "false"})
core.create_namespaced_config_map("kube-system", cm)
check(status_of(core.create_namespaced_config_map, "kube-system", cm) == 409, "AlreadyExists 409")
cur = core.read_namespaced_config_map("cni-test-config", "kube-system")
stale = cur.metadata.resource_version
cur.data["x"] = "1"
core.replace_namespaced_config_map("cni-test-config", "kube-system", cur)
cur.metadata.resource_version = stale
check(status_of(core.replace_namespaced_config_map, "cni-test-config", "kube-system", cur) == 409, "stale update 409 Conflict")
check(status_of(core.read_namespaced_config_map, "missing", "kube-system") == 404, "404")
applied = core.patch_namespaced_config_map(
    "applied", "kube-system",
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"k": "v"}},
    field_manager="python", _content_type="application/apply-patch+yaml")
check(applied.data == {"k": "v"}, "server-side apply creates")

# ENIConfig (custom objects): create, schema 422, merge patch, list, delete
eni = {"apiVersion": f"{G}/{V}", "kind": "ENIConfig", "metadata": {"name": "us-west-2a"},
       "spec": {"subnet": "subnet-0a", "securityGroups": ["sg-1"]}}
crd.create_cluster_custom_object(G, V, P, eni)
bad = {"apiVersion": f"{G}/{V}", "kind": "ENIConfig", "metadata": {"name": "bad"}, "spec": {"securityGroups": ["sg-1"]}}
try:
    crd.create_cluster_custom_object(G, V, P, bad)
    check(False, "missing spec.subnet must be refused")
except ApiException as e:
    check(e.status == 422 and "spec.subnet: Required value" in e.body, f"422 Invalid: {e.body}")
crd.patch_cluster_custom_object(G, V, P, "us-west-2a", {"spec": {"subnet": "subnet-0b"}})
check(crd.get_cluster_custom_object(G, V, P, "us-west-2a")["spec"]["subnet"] == "subnet-0b", "merge patch on a CR")
items = crd.list_cluster_custom_object(G, V, P)["items"]
check([i["metadata"]["name"] for i in items] == ["us-west-2a"], "list CRs")

# watch: from a list's resourceVersion, in order, with the client's own stream parser
rv = core.list_node().metadata.resource_version
events = []


def watcher():
    w = watch.Watch()
    for ev in w.stream(core.list_node, resource_version=rv, timeout_seconds=3):
        events.append((ev["type"], ev["object"].metadata.name, int(ev["object"].metadata.resource_version)))
        if len(events) == 3:
            w.stop()


t = threading.Thread(target=watcher)
t.start()
time.sleep(0.3)
core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="py-node-2")))
core.patch_node("py-node-2", {"metadata": {"labels": {"a": "b"}}}, _content_type="application/merge-patch+json")
core.delete_node("py-node-2")
t.join(10)
check([e[:2] for e in events] == [("ADDED", "py-node-2"), ("MODIFIED", "py-node-2"), ("DELETED", "py-node-2")], f"watch events {events}")
check(events[0][2] < events[1][2] < events[2][2], "increasing resourceVersions")

# 410: a watch from a resourceVersion the history no longer holds (test sets history to 5)
for i in range(8):
    core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=f"churn-{i}")))
try:
    for _ in watch.Watch().stream(core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=2):
        pass
    check(False, "watch from a compacted resourceVersion must fail")
except ApiException as e:
    check(e.status == 410 and "Expired" in str(e.reason), f"410 Expired: {e.status} {e.reason}")

# RBAC: the aws-node ServiceAccount under the chart's ClusterRole
check(len(sa_core.list_node().items) >= 1, "aws-node may list nodes")
check(len(sa_crd.list_cluster_custom_object(G, V, P)["items"]) == 1, "aws-node may list ENIConfigs")
check(status_of(sa_core.create_namespaced_config_map, "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"))) == 403, "403 create configmap")
check(status_of(sa_core.delete_node, "py-node") == 403, "403 delete node")
check(status_of(sa_crd.delete_cluster_custom_object, G, V, P, "us-west-2a") == 403, "403 delete ENIConfig")
check(status_of(sa_core.patch_node, "py-node", {"metadata": {"labels": {"x": "y"}}}, _content_type="application/merge-patch+json") == 403, "403 patch node")

# delete
core.delete_node("py-node")
crd.delete_cluster_custom_object(G, V, P, "us-west-2a")
check(status_of(core.read_node, "py-node") == 404, "deleted node is gone")
print(f"python client cross-check: {checks} checks passed", flush=True)
