#!/usr/bin/env bash
# demo.sh - kiln's main job on one machine: a throwaway PostgreSQL, kilnd, one kiln-agent, and a
# real GPT training job on tinyshakespeare submitted over REST and followed to completion.
# Everything runs the way a shared cluster does: TLS on both APIs (a throwaway CA), mutual TLS
# for the agent, the first admin's API token from --bootstrap-token-file, the agent registering
# with the join token and reading only its --data-root.
# Run through `make demo` (which installs packages and builds first). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN:-$ROOT/build/bin}
source scripts/pg.sh

WORK=$(mktemp -d /tmp/kiln-demo.XXXXXX)
HTTP_PORT=${KILN_DEMO_HTTP_PORT:-8080}
GRPC_PORT=${KILN_DEMO_GRPC_PORT:-9090}
TLS=$WORK/tls
export KILN_URL="https://127.0.0.1:$HTTP_PORT"
export KILN_TLS_CA="$TLS/ca.pem"
pids=()

cleanup() {
  # newest first: the agent drains while kilnd still answers its last heartbeat, then kilnd
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  pg_stop
  echo "demo: stopped kilnd, the agent and PostgreSQL (their logs, the job's output and checkpoints stay in $WORK)"
}
trap cleanup EXIT

echo "demo: making a throwaway certificate authority and certificates ($TLS)"
bash scripts/make-certs.sh "$TLS"
echo "demo: starting PostgreSQL"
pg_start
echo "demo: starting kilnd (REST $KILN_URL, gRPC 127.0.0.1:$GRPC_PORT, TLS, tokens)"
"$BIN/kilnd" --database-url "$KILN_PG_URL" --http-addr "127.0.0.1:$HTTP_PORT" \
  --grpc-addr "127.0.0.1:$GRPC_PORT" --tls-cert "$TLS/server.pem" --tls-key "$TLS/server.key" \
  --tls-ca "$TLS/ca.pem" --bootstrap-token-file "$WORK/admin.token" \
  --join-token-file "$WORK/join.token" --artifact-dir "$WORK/artifacts" >"$WORK/kilnd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -fs --cacert "$KILN_TLS_CA" "$KILN_URL/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs --cacert "$KILN_TLS_CA" "$KILN_URL/readyz" >/dev/null || {
  echo "demo: kilnd did not become ready"; tail -20 "$WORK/kilnd.log"; exit 1; }
# The first start on an empty database made the cluster admin; its token is in admin.token.
KILN_TOKEN=$(cat "$WORK/admin.token")
export KILN_TOKEN
echo "demo: kilnd created the cluster admin; its API token is in $WORK/admin.token (mode 0600)"
# The web UI, over the same TLS: the browser warns about the demo's throwaway CA ($TLS/ca.pem).
UI_LINK=$("$BIN/kiln" ui --print 2>/dev/null || true)
cat <<MSG
demo: the web UI is at $KILN_URL/ (accept the demo's throwaway certificate, or import $TLS/ca.pem)
      log in by pasting the token of $WORK/admin.token, or open this one-time link within 2 minutes:
      $UI_LINK
      (\`build/bin/kiln ui\` makes a new one; KILN_DEMO_KEEP=1 keeps everything up after the job)
MSG

# The ranks' sandbox needs root (docs/security.md); run as another user, the demo's ranks run
# unconfined (--sandbox off), which the agent's log says loudly.
SANDBOX=on
[ "$(id -u)" = 0 ] || SANDBOX=off
echo "demo: starting kiln-agent with 1 CPU slot (work dir $WORK/agent, data root $ROOT/data, sandbox $SANDBOX)"
"$BIN/kiln-agent" --server "127.0.0.1:$GRPC_PORT" --slots 1 --slot-type cpu --sandbox "$SANDBOX" \
  --work-dir "$WORK/agent" --join-token-file "$WORK/join.token" --data-root "$ROOT/data" \
  --tls-ca "$TLS/ca.pem" --tls-cert "$TLS/agent.pem" --tls-key "$TLS/agent.key" \
  >"$WORK/agent.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  "$BIN/kiln" workers 2>/dev/null | grep -q ALIVE && break
  sleep 0.1
done
"$BIN/kiln" workers

sed "s|@ROOT@|$ROOT|" examples/demo.json >"$WORK/job.json"
echo
echo "demo: submitting $WORK/job.json (a 4-layer GPT on tinyshakespeare, 600 steps, about a minute)"
JOB=$("$BIN/kiln" submit "$WORK/job.json" | awk '{print $1; exit}')
echo "demo: job $JOB submitted; following its logs"
echo
"$BIN/kiln" logs -f "$JOB" || true
echo
"$BIN/kiln" describe "$JOB"
echo
"$BIN/kiln" metrics "$JOB"
echo
"$BIN/kiln" artifacts "$JOB"
if [ -n "${KILN_DEMO_KEEP:-}" ]; then
  NEXT="demo: done. Where to look next:"
else
  NEXT="demo: done. kilnd and the agent stop now: the files below stay, but the REST, UI and CLI
      commands need them up (KILN_DEMO_KEEP=1 make demo keeps them until Ctrl-C). Where to look next:"
fi
cat <<MSG

$NEXT
  - the job over REST:      curl --cacert $KILN_TLS_CA -H "Authorization: Bearer \$(cat $WORK/admin.token)" \\
                              $KILN_URL/v1/jobs/$JOB   (events, logs, metrics under it)
  - the web UI:             $KILN_URL/ (build/bin/kiln ui opens it logged in)
  - the CLI:                export KILN_URL=$KILN_URL KILN_TLS_CA=$KILN_TLS_CA
                            build/bin/kiln login < $WORK/admin.token
                            build/bin/kiln jobs | describe | logs -f | metrics
  - users and projects:     build/bin/kiln users create alice; build/bin/kiln tokens create alice
                            build/bin/kiln projects add-member default alice editor
  - the trained model:      build/bin/kiln artifacts $JOB --get model_llmc.bin (the UI's job page
                            has download buttons; search and compare are on its jobs page)
  - samples and checkpoints: $WORK/agent/jobs/$JOB/output and .../checkpoints
  - server logs:            $WORK/kilnd.log, $WORK/agent.log
  - more job specs:         examples/ ; the API: api/openapi.yaml ; the Python SDK: sdk/python
MSG
if [ -n "${KILN_DEMO_KEEP:-}" ]; then
  echo "demo: KILN_DEMO_KEEP is set: servers stay up until you press Ctrl-C"
  wait
fi
