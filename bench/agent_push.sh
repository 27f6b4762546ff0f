#!/usr/bin/env bash
# agent_push.sh - the agent -> kilnd ingestion path (bench/agent_push: the agent's own gRPC client
# against an in-process kilnd), with security off (plain text, no credentials) and on (mutual
# TLS, the agent's credential on every call, each batch checked against the ranks kilnd assigned
# it), alternating, each run on a fresh database of one throwaway PostgreSQL at default
# durability. Prints the machine, date and load for bench/RESULTS.md.
#   BUILD=build bash bench/agent_push.sh     (make BUILD=... bench first)
# Environment: SECONDS_EACH (default 5), THREADS (default 2), ROUNDS (default 2), MODES (default
# "off on"), GATES (default "gate"; "gate direct" also runs gRPC accepting its connections itself,
# without kilnd's per-address gate, to measure what the gate costs).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SECONDS_EACH=${SECONDS_EACH:-5}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-2}
MODES=${MODES:-off on}
GATES=${GATES:-gate}
BENCH="$BUILD/bench/agent_push"
[ -x "$BENCH" ] || { echo "agent_push.sh: $BENCH is missing (make BUILD=$BUILD bench)"; exit 1; }
source scripts/pg.sh
export KILN_PG_PORT=${KILN_PG_PORT:-$((20000 + RANDOM % 20000))}
pg_start || { echo "agent_push.sh: could not start PostgreSQL"; exit 1; }
WORK=$(mktemp -d /tmp/kiln-pushbench.XXXXXX)
trap 'pg_stop; rm -rf "$WORK"' EXIT
bash scripts/make-certs.sh "$WORK/tls" || exit 1
export KILN_TEST_TLS_DIR="$WORK/tls"
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs)"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
n=0
for round in $(seq "$ROUNDS"); do
  order=$MODES
  [ $((round % 2)) -eq 0 ] && order=$(echo $MODES | tr ' ' '\n' | tac | tr '\n' ' ')
  gates=$GATES
  [ $((round % 2)) -eq 0 ] && gates=$(echo $GATES | tr ' ' '\n' | tac | tr '\n' ' ')
  for mode in $order; do
    for gate in $gates; do
      n=$((n + 1))
      KILN_DATABASE_URL=$(pg_createdb "push_$$_$n") || exit 1
      echo
      echo "== round $round, security $mode, $gate"
      KILN_DATABASE_URL="$KILN_DATABASE_URL" "$BENCH" "$SECONDS_EACH" "$THREADS" "$mode" "$gate"
    done
  done
done
echo
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
