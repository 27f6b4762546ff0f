"""chart_checks.py - what operators expect of the Helm chart's output, read from rendered
manifests (tests/deploy/test_deploy.c renders them): the defaults (argv[1]) and everything
switched on with other numbers (argv[2]: kilnd.replicas 3, minAvailable 2, GPU agents with 4 GPUs
a node, 6 CPU slots, the monitors)."""
import sys

import yaml

d = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x]
a = [x for x in yaml.safe_load_all(open(sys.argv[2])) if x]


def one(docs, kind, name=None):
    m = [x for x in docs if x["kind"] == kind and (name is None or x["metadata"]["name"] == name)]
    assert len(m) == 1, (kind, name, len(m))
    return m[0]


def container(docs, name):
    return one(docs, "DaemonSet", name)["spec"]["template"]["spec"]["containers"][0]


def env(c):
    return {e["name"]: e.get("value") for e in c["env"]}


assert not [x for x in d + a if x["kind"] == "Secret"], "the chart writes a Secret"
assert one(d, "Deployment", "kilnd")["spec"]["replicas"] == 2
assert one(d, "PodDisruptionBudget", "kilnd")["spec"]["minAvailable"] == 1
one(d, "ServiceAccount")
one(d, "PriorityClass")
assert not [x for x in d if x["kind"] == "DaemonSet" and x["metadata"]["name"] == "kiln-agent-gpu"]
cpu = container(d, "kiln-agent-cpu")
assert cpu["livenessProbe"]["httpGet"]["path"] == "/healthz", cpu
assert env(cpu)["KILN_SLOTS"] == "2" and env(cpu)["KILN_METRICS_ADDR"] == "0.0.0.0:9102", env(cpu)
assert one(a, "Deployment", "kilnd")["spec"]["replicas"] == 3
assert one(a, "PodDisruptionBudget", "kilnd")["spec"]["minAvailable"] == 2
gpu = container(a, "kiln-agent-gpu")
assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 4, gpu["resources"]
assert gpu["readinessProbe"]["httpGet"]["path"] == "/healthz"
assert "KILN_SLOTS" not in env(gpu), "GPU agents take one slot per GPU they are given"
assert env(container(a, "kiln-agent-cpu"))["KILN_SLOTS"] == "6"
one(a, "ServiceMonitor", "kilnd")
one(a, "PodMonitor", "kiln-agent")
assert all(x["metadata"].get("namespace") in (None, "ml") for x in a)
print("chart ok")
