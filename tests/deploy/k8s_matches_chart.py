"""k8s_matches_chart.py - deploy/k8s says what the Helm chart's defaults say on the points where
they drifted apart before: argv[1] is the chart rendered with its defaults, argv[2:] the
manifests of deploy/k8s (kustomize's output and networkpolicy.yaml). The same replicas on an
artifact volume of the same access mode, the database URL from a mounted file, the same kilnd
environment for artifacts and the database, and NetworkPolicies of the same names, directions
and ports."""
import sys

import yaml

chart = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x]
k8s = [x for f in sys.argv[2:] for x in yaml.safe_load_all(open(f)) if x]


def one(docs, kind, name):
    m = [x for x in docs if x["kind"] == kind and x["metadata"]["name"] == name]
    assert len(m) == 1, (kind, name, len(m))
    return m[0]


def kilnd(docs):
    dep = one(docs, "Deployment", "kilnd")
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    srcs = [i for s in next(v for v in pod["volumes"] if v["name"] == "secrets")["projected"]["sources"]
            for i in s["secret"]["items"]]
    pvc = one(docs, "PersistentVolumeClaim", "kilnd-artifacts")
    return {
        "replicas": dep["spec"]["replicas"],
        "access": pvc["spec"]["accessModes"],
        "artifact dir": (env.get("KILN_ARTIFACT_DIR"), mounts.get("artifacts")),
        "database url file": env.get("KILN_DATABASE_URL_FILE"),
        "database url in env": "KILN_DATABASE_URL" in env or any("secretRef" in e for e in c.get("envFrom", [])),
        "database secret item": {"key": "KILN_DATABASE_URL", "path": "database.url"} in srcs,
    }


def policy(docs, name):
    spec = one(docs, "NetworkPolicy", name)["spec"]

    def rules(key):
        return sorted(sorted((p["port"], p.get("protocol", "TCP")) for p in r.get("ports", [])) for r in spec[key])
    return {"types": spec["policyTypes"], "ingress": rules("ingress"), "egress": rules("egress"),
            "selects": spec["podSelector"]["matchLabels"]["app.kubernetes.io/name"]}


a, b = kilnd(chart), kilnd(k8s)
assert a == b, "kilnd: the chart says %s, deploy/k8s says %s" % (a, b)
assert b["access"] == ["ReadWriteMany"] or b["replicas"] == 1, b
for name in ("kilnd", "kiln-agent"):
    a, b = policy(chart, name), policy(k8s, name)
    assert a == b, "NetworkPolicy %s: the chart says %s, deploy/k8s says %s" % (name, a, b)
print("k8s matches the chart")
