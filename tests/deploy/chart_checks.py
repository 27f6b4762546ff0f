"""chart_checks.py - what operators expect of the Helm chart's output, read from rendered
manifests (tests/deploy/test_deploy.c renders them): the defaults (argv[1]), everything
switched on with other numbers (argv[2]: kilnd.replicas 3, minAvailable 2, GPU agents with 4 GPUs
a node, 6 CPU slots, the monitors, PostgreSQL at a CIDR) and one replica on a ReadWriteOnce
volume (argv[3]). The artifacts persist on a volume, the database URL is a mounted file, the
images are the chart's appVersion, and NetworkPolicies fence kilnd and the agents both ways."""
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


def kilnd_pod(docs):
    return one(docs, "Deployment", "kilnd")["spec"]["template"]["spec"]


app_version = yaml.safe_load(open("deploy/helm/kiln/Chart.yaml"))["appVersion"]
rwo = [x for x in yaml.safe_load_all(open(sys.argv[3])) if x]
for docs, mode in ((d, "ReadWriteMany"), (a, "ReadWriteMany"), (rwo, "ReadWriteOnce")):
    pvc = one(docs, "PersistentVolumeClaim", "kilnd-artifacts")
    assert pvc["spec"]["accessModes"] == [mode], pvc
    assert pvc["spec"]["resources"]["requests"]["storage"], pvc
    pod = kilnd_pod(docs)
    c = pod["containers"][0]
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["artifacts"]["persistentVolumeClaim"]["claimName"] == "kilnd-artifacts", vols
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert env(c)["KILN_ARTIFACT_DIR"] == mounts["artifacts"], (env(c), mounts)
    # the database URL: a file from the Secret, never an environment variable
    assert env(c)["KILN_DATABASE_URL_FILE"] == mounts["secrets"] + "/database.url", env(c)
    assert "KILN_DATABASE_URL" not in env(c) and all("secretRef" not in e for e in c.get("envFrom", [])), c
    srcs = [s["secret"] for s in vols["secrets"]["projected"]["sources"]]
    assert {"key": "KILN_DATABASE_URL", "path": "database.url"} in [i for s in srcs for i in s["items"]], srcs
    assert c["image"] == "kiln:" + app_version, c["image"]
assert one(rwo, "Deployment", "kilnd")["spec"]["replicas"] == 1
assert container(a, "kiln-agent-gpu")["image"] == "kiln:%s-cuda" % app_version
assert container(d, "kiln-agent-cpu")["image"] == "kiln:" + app_version


def ports(rule):
    return {(p["port"], p.get("protocol", "TCP")) for p in rule.get("ports", [])}


for docs in (d, a):
    k = one(docs, "NetworkPolicy", "kilnd")["spec"]
    g = one(docs, "NetworkPolicy", "kiln-agent")["spec"]
    for spec in (k, g):
        assert spec["policyTypes"] == ["Ingress", "Egress"], spec
        assert any(ports(r) == {(53, "UDP"), (53, "TCP")} for r in spec["egress"]), "no DNS: %s" % spec
    assert k["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "kilnd"
    assert g["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "kiln-agent"
    assert any((8080, "TCP") in ports(r) for r in k["ingress"]), k
    assert any((9090, "TCP") in ports(r) and any("ipBlock" in f for f in r.get("from", [])) for r in k["ingress"]), \
        "the agents (hostNetwork) reach kilnd's gRPC from the nodes: %s" % k
    assert any(ports(r) == {(5432, "TCP")} for r in k["egress"]), "no PostgreSQL: %s" % k
    assert any(t.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") == "kilnd"
               for r in g["egress"] for t in r.get("to", [])), "agents cannot reach kilnd: %s" % g
    assert any(not r.get("ports") and any("ipBlock" in f for f in r.get("from", [])) for r in g["ingress"]), \
        "peers reach the agents on any port: %s" % g
    assert any(not r.get("ports") and any("ipBlock" in t for t in r.get("to", [])) for r in g["egress"]), g
assert one(a, "NetworkPolicy", "kilnd")["spec"]["egress"][0]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
print("chart ok")
