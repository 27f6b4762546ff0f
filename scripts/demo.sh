#!/usr/bin/env bash
# demo.sh - kiln's main job on one machine: a throwaway PostgreSQL, kilnd, one kiln-agent, and a
# real GPT training job on tinyshakespeare submitted over REST and followed to completion.
# Run through `make demo` (which installs packages and builds first). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN:-$ROOT/build/bin}
source scripts/pg.sh

WORK=$(mktemp -d /tmp/kiln-demo.XXXXXX)
HTTP_PORT=${KILN_DEMO_HTTP_PORT:-8080}
GRPC_PORT=${KILN_DEMO_GRPC_PORT:-9090}
export KILN_URL="http://127.0.0.1:$HTTP_PORT"
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pg_stop
  echo "demo: stopped kilnd, the agent and PostgreSQL (logs kept in $WORK)"
}
trap cleanup EXIT

echo "demo: starting PostgreSQL"
pg_start
echo "demo: starting kilnd (REST $KILN_URL, gRPC 127.0.0.1:$GRPC_PORT)"
"$BIN/kilnd" --database-url "$KILN_PG_URL" --http-addr "127.0.0.1:$HTTP_PORT" \
  --grpc-addr "127.0.0.1:$GRPC_PORT" >"$WORK/kilnd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  curl -fs "$KILN_URL/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs "$KILN_URL/readyz" >/dev/null || { echo "demo: kilnd did not become ready"; tail -20 "$WORK/kilnd.log"; exit 1; }

echo "demo: starting kiln-agent with 1 CPU slot (work dir $WORK/agent)"
"$BIN/kiln-agent" --server "127.0.0.1:$GRPC_PORT" --slots 1 --slot-type cpu \
  --work-dir "$WORK/agent" --data-root "$ROOT/data" --insecure >"$WORK/agent.log" 2>&1 &
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
cat <<MSG

demo: done. Where to look next:
  - the job over REST:      curl $KILN_URL/v1/jobs/$JOB   (events, logs, metrics under it)
  - the CLI:                KILN_URL=$KILN_URL build/bin/kiln jobs | describe | logs -f | metrics
  - samples and checkpoints: $WORK/agent/jobs/$JOB/output and .../checkpoints
  - server logs:            $WORK/kilnd.log, $WORK/agent.log
  - more job specs:         examples/ ; the API: api/openapi.yaml ; the Python SDK: sdk/python
MSG
if [ -n "${KILN_DEMO_KEEP:-}" ]; then
  echo "demo: KILN_DEMO_KEEP is set: servers stay up until you press Ctrl-C"
  wait
fi
