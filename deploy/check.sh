#!/usr/bin/env bash
# check.sh - static checks of deploy/ that need no Docker engine, cluster or running systemd:
#   * every Kubernetes manifest parses as YAML and each document has apiVersion, kind, name;
#     every volume mounted is declared, and every file a KILN_TLS_* or *_FILE variable names
#     lies under a mount (and is one of its Secret's items, when the volume lists them);
#   * every KILN_* variable named in deploy/ is one the code reads (flags of cmd/*.c, the rank
#     contract's names in rank/rank.h, or a getenv() or the CLI's cli_env() of the sources),
#     and every binary the files name is one
#     the Makefile builds;
#   * the systemd units pass `systemd-analyze verify` (when systemd-analyze is installed),
#     against a scratch root holding the built binaries (BUILD=..., default build/).
# Run from the repository root: bash deploy/check.sh   (exit status 0 when all pass)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
fail=0
say() { printf '%s\n' "$*"; }

# ---- YAML ----------------------------------------------------------------------------------------
if /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
  /usr/bin/python3 - deploy/k8s/*.yaml <<'PY' || fail=1
import sys, yaml
bad = 0
for path in sys.argv[1:]:
    try:
        docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    except yaml.YAMLError as e:
        print(f"FAIL {path}: {e}"); bad += 1; continue
    for d in docs:
        kind = d.get("kind")
        if kind == "Kustomization":
            for r in d.get("resources", []):
                try: open("deploy/k8s/" + r).close()
                except OSError: print(f"FAIL {path}: resource {r} missing"); bad += 1
            continue
        name = (d.get("metadata") or {}).get("name")
        if not d.get("apiVersion") or not kind or not name:
            print(f"FAIL {path}: a document lacks apiVersion, kind or metadata.name"); bad += 1
            continue
        spec = d.get("spec") or {}
        tmpl = (spec.get("template") or {}).get("spec")
        if tmpl:
            sel = (spec.get("selector") or {}).get("matchLabels") or {}
            labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if any(labels.get(k) != v for k, v in sel.items()):
                print(f"FAIL {path}: {kind}/{name} selector does not match its pod labels"); bad += 1
            vols = {v["name"] for v in tmpl.get("volumes", [])}
            vols |= {(v.get("metadata") or {}).get("name") for v in spec.get("volumeClaimTemplates", [])}
            for c in tmpl.get("initContainers", []) + tmpl.get("containers", []):
                for m in c.get("volumeMounts", []):
                    if m["name"] not in vols:
                        print(f"FAIL {path}: {c['name']} mounts unknown volume {m['name']}"); bad += 1
            # Files the environment names (TLS files, token files) lie under a mount, and, when
            # the volume lists its Secret items, are one of them.
            byname = {v["name"]: v for v in tmpl.get("volumes", [])}
            def items(v):
                srcs = [v["secret"]] if "secret" in v else \
                       [s.get("secret") or s.get("configMap") or {} for s in (v.get("projected") or {}).get("sources", [])]
                if not srcs or any("items" not in s for s in srcs):
                    return None
                return {i["path"] for s in srcs for i in s["items"]}
            for c in tmpl.get("containers", []):
                for e in c.get("env", []):
                    val = str(e.get("value", ""))
                    if not (e["name"].startswith("KILN_TLS_") or e["name"].endswith("_FILE")) or not val.startswith("/"):
                        continue
                    m = [m for m in c.get("volumeMounts", []) if val.startswith(m["mountPath"].rstrip("/") + "/")]
                    if not m:
                        print(f"FAIL {path}: {c['name']}: {e['name']}={val} is under no volume mount"); bad += 1
                        continue
                    known = items(byname.get(m[0]["name"], {}))
                    if known is not None and val[len(m[0]["mountPath"].rstrip("/")) + 1:] not in known:
                        print(f"FAIL {path}: {c['name']}: {e['name']}={val} is not a file of volume {m[0]['name']}"); bad += 1
        print(f"ok   {path}: {kind}/{name}")
sys.exit(1 if bad else 0)
PY
else
  say "skip YAML: /usr/bin/python3 has no yaml module (apt-get install python3-yaml)"
fi

# ---- KILN_* variables and binaries -------------------------------------------------------------
known=$( { grep -ho '"KILN_[A-Z0-9_]*"' cmd/*.c; \
           grep -rhoE '(getenv|cli_env)\("KILN_[A-Z0-9_]*"\)' --include='*.c' base spec store service api agent engine cli cmd; \
           grep -rho '"KILN_[A-Z0-9_]*"' rank; } | grep -o 'KILN_[A-Z0-9_]*' | sort -u)
# KILN_MARCH is a build argument of the Dockerfiles, not a variable the programs read.
used=$(grep -rhoE 'KILN_[A-Z0-9_]+' deploy --exclude=check.sh | grep -vx KILN_MARCH | sort -u)
vfail=0
for v in $used; do
  if ! grep -qx "$v" <<<"$known"; then say "FAIL unknown variable $v (not read by the code)"; vfail=1; fi
done
[ $vfail -eq 0 ] && say "ok   $(wc -w <<<"$used") KILN_* variables in deploy/ are all read by the code"
fail=$((fail | vfail))
for b in kilnd kiln-agent kiln-train kiln; do
  grep -q "(BUILD)/bin/$b:" Makefile || { say "FAIL Makefile builds no $b"; fail=1; }
done

# ---- systemd ---------------------------------------------------------------------------------------
if command -v systemd-analyze >/dev/null && [ -x "$BUILD/bin/kilnd" ]; then
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  mkdir -p "$root/usr/local/bin" "$root/etc/kiln" "$root/etc/systemd/system" "$root/usr/lib/systemd"
  cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
  cp "$BUILD"/bin/kilnd "$BUILD"/bin/kiln-agent "$root/usr/local/bin/"
  cp deploy/systemd/kilnd.env deploy/systemd/kiln-agent.env "$root/etc/kiln/"
  cp deploy/systemd/*.service "$root/etc/systemd/system/"
  out=$(systemd-analyze verify --root="$root" kilnd.service kiln-agent.service 2>&1) || fail=1
  if [ -n "$out" ]; then say "FAIL systemd-analyze verify:"; say "$out"; fail=1; else say "ok   systemd-analyze verify kilnd.service kiln-agent.service"; fi
else
  say "skip systemd: no systemd-analyze or no $BUILD/bin/kilnd (make BUILD=$BUILD first)"
fi
exit $fail
