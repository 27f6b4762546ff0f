"""sandbox_checks.py - the ranks' sandbox is on in every Kubernetes object that runs kiln-agent,
with the least privilege it works with (docs/security.md; deploy/README.md, "The agents'
sandbox"): the agent container runs as root with exactly the sandbox's capabilities, not
privileged, no_new_privs, seccomp and AppArmor unconfined (RuntimeDefault refuses pivot_root,
the runtimes' AppArmor mount), the sandbox's state directory on the node, and nothing turns the
sandbox off; kilnd stays uid 10001 without capabilities. Reads rendered manifests (argv)."""
import sys

import yaml

SANDBOX_CAPS = {"SYS_ADMIN", "SYS_CHROOT", "SETUID", "SETGID", "SETPCAP", "CHOWN", "DAC_READ_SEARCH", "KILL",
                "SYS_PTRACE"}

docs = [d for path in sys.argv[1:] for d in yaml.safe_load_all(open(path)) if d]
agents = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"].startswith("kiln-agent-")]
kilnds = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "kilnd"]
assert agents, "no kiln-agent DaemonSet"


def user(pod, c):
    sc = {**(pod.get("securityContext") or {}), **(c.get("securityContext") or {})}
    return sc.get("runAsUser"), sc


for ds in agents:
    name = ds["metadata"]["name"]
    pod = ds["spec"]["template"]["spec"]
    agent = [c for c in pod["containers"] if c["name"] == "agent"][0]
    uid, sc = user(pod, agent)
    csc = agent["securityContext"]
    assert uid == 0 and not sc.get("runAsNonRoot"), f"{name}: the agent must run as root for the sandbox ({uid})"
    assert not csc.get("privileged"), f"{name}: privileged"
    assert csc.get("allowPrivilegeEscalation") is False, f"{name}: no_new_privs"
    assert csc["capabilities"]["drop"] == ["ALL"], f"{name}: capabilities not dropped"
    assert set(csc["capabilities"]["add"]) == SANDBOX_CAPS, f"{name}: capabilities {csc['capabilities']['add']}"
    assert csc["seccompProfile"]["type"] == "Unconfined" and csc["appArmorProfile"]["type"] == "Unconfined", name
    env = {e["name"]: e.get("value") for e in agent.get("env", [])}
    assert env.get("KILN_SANDBOX", "on") == "on", f"{name}: KILN_SANDBOX={env['KILN_SANDBOX']}"
    assert any(m["mountPath"] == "/var/lib/kiln-sandbox" for m in agent["volumeMounts"]), f"{name}: no sandbox state"
    for c in pod.get("initContainers", []):
        caps = set(c["securityContext"]["capabilities"].get("add", []))
        assert caps <= {"CHOWN"}, f"{name}: init container {c['name']} has {caps}"

for d in kilnds:
    pod = d["spec"]["template"]["spec"]
    for c in pod["containers"]:
        uid, sc = user(pod, c)
        assert uid == 10001 and sc.get("runAsNonRoot"), f"kilnd runs as {uid}"
        assert not (c.get("securityContext") or {}).get("capabilities", {}).get("add"), "kilnd holds capabilities"
print(f"sandbox ok: {len(agents)} agent DaemonSet(s), {len(kilnds)} kilnd")
