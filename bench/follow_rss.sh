#!/usr/bin/env bash
# follow_rss.sh - kilnd's memory with many live log followers, and after they leave: a throwaway
# PostgreSQL, a real kilnd (TLS, tokens, no per-address limit: the followers all come from one
# address) and a real kiln-agent with one CPU slot; for each follower count, bench/follow_rss
# submits a fast job (a tiny GPT printing a line a step) and follows it that many times at once,
# sampling kilnd's RSS before, during and after. Each count runs on a fresh kilnd (its idle figure
# measured after the agent registered and one warm-up job with one follower ran). Prints the
# machine, date and load for bench/RESULTS.md.
#   BUILD=build bash bench/follow_rss.sh        (make BUILD=... bench first)
# Environment: FOLLOWERS (counts, default "200 1000"), STEPS (the job's steps, default 400),
# AFTER_S (the wait after the last follower ended before "after" is read, default 10), HANDSHAKE_MS
# (kilnd's --handshake-timeout-ms, default 300000: one client process opens all the followers at
# once and, while it reads the first streams, it finishes the last of 1,000 TLS handshakes after
# kilnd's default 30 s on 2 busy cores).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
FOLLOWERS=${FOLLOWERS:-200 1000}
STEPS=${STEPS:-400}
AFTER_S=${AFTER_S:-10}
HANDSHAKE_MS=${HANDSHAKE_MS:-300000}
KILND="$BUILD/bin/kilnd"
AGENT="$BUILD/bin/kiln-agent"
BENCH="$BUILD/bench/follow_rss"
for f in "$KILND" "$AGENT" "$BENCH"; do
  [ -x "$f" ] || { echo "follow_rss.sh: $f is missing (make BUILD=$BUILD bench)"; exit 1; }
done
source scripts/pg.sh
export KILN_PG_PORT=${KILN_PG_PORT:-$((20000 + RANDOM % 20000))}
pg_start || { echo "follow_rss.sh: could not start PostgreSQL"; exit 1; }
WORK=$(mktemp -d /tmp/kiln-followrss.XXXXXX)
KPID=; APID=
stop_all() {
  [ -n "$APID" ] && kill "$APID" 2>/dev/null && wait "$APID" 2>/dev/null
  [ -n "$KPID" ] && kill "$KPID" 2>/dev/null && wait "$KPID" 2>/dev/null
  APID=; KPID=
}
trap 'stop_all; pg_stop; rm -rf "$WORK"' EXIT
bash scripts/make-certs.sh "$WORK/tls" >/dev/null || exit 1
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cat >"$WORK/job.json" <<EOF
{"name": "follow-rss", "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "seq_len": 16,
 "vocab": "bytes"}, "data": {"train": "$PWD/data/tinyshakespeare.txt", "val_fraction": 0.1},
 "hyperparameters": {"lr": 0.003, "global_batch_size": 2, "max_steps": $STEPS, "warmup_steps": 2, "seed": 7,
 "eval_every": 0, "sample_every": 0}, "resources": {"nodes": 1, "slots_per_node": 1, "slot_type": "cpu"}}
EOF
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs), $(free -g | awk '/Mem:/ {print $2}') GB"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== job: tiny GPT, $STEPS steps, one log line a step"
n=0
for count in $FOLLOWERS; do
  n=$((n + 1))
  DB=$(pg_createdb "followrss_$$_$n") || exit 1
  HTTP=$(port); GRPC=$(port)
  rm -rf "$WORK/w" "$WORK/admin.token" "$WORK/join.token"; mkdir -p "$WORK/w"
  # no per-address limit and a long handshake deadline (through the environment, so that a kilnd
  # older than them runs too, for a baseline): the followers all come from one client at once
  KILN_LOG_LEVEL=warn KILN_MAX_CONNECTIONS_PER_ADDRESS=0 KILN_HANDSHAKE_TIMEOUT_MS=$HANDSHAKE_MS \
    "$KILND" --database-url "$DB" --http-addr "127.0.0.1:$HTTP" --grpc-addr "127.0.0.1:$GRPC" \
    --tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key" --bootstrap-token-file "$WORK/admin.token" \
    --join-token-file "$WORK/join.token" >>"$WORK/kilnd.log" 2>&1 &
  KPID=$!
  URL="https://127.0.0.1:$HTTP"
  for _ in $(seq 100); do
    curl -sf --cacert "$WORK/tls/ca.pem" "$URL/readyz" >/dev/null 2>&1 && break; sleep 0.2
  done
  "$AGENT" --server "127.0.0.1:$GRPC" --slots 1 --slot-type cpu --work-dir "$WORK/w" --data-root "$PWD/data" \
    --join-token-file "$WORK/join.token" --tls-ca "$WORK/tls/ca.pem" >>"$WORK/agent.log" 2>&1 &
  APID=$!
  for _ in $(seq 100); do
    curl -sf --cacert "$WORK/tls/ca.pem" -H "Authorization: Bearer $(cat "$WORK/admin.token")" "$URL/v1/workers" \
      2>/dev/null | grep -q '"ALIVE"' && break; sleep 0.2
  done
  ARGS=(--url "$URL" --ca "$WORK/tls/ca.pem" --token-file "$WORK/admin.token" --spec "$WORK/job.json" --pid "$KPID")
  "$BENCH" "${ARGS[@]}" --followers 1 --after-s 2 >/dev/null || { echo "follow_rss.sh: the warm-up failed"; exit 1; }
  echo
  echo "== $count followers"
  "$BENCH" "${ARGS[@]}" --followers "$count" --after-s "$AFTER_S"
  echo "kilnd refused or cut off: $(curl -s --cacert "$WORK/tls/ca.pem" "$URL/metrics" | grep '^kiln_connections_refused_total' | tr '\n' ' ')"
  stop_all
done
echo
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
