#!/usr/bin/env bash
# replicas_bench.sh - two kilnd replicas (real processes, TLS and tokens on, as deployed) on one
# throwaway PostgreSQL at default durability:
#   1. job creation across both: bench/rest_bench against each replica at once (closed loop,
#      CONNS/2 connections each), jobs/s summed; before it, as the baseline of the same session,
#      all CONNS connections to one replica;
#   2. a live follower on one replica while an agent pushes metric points and log lines into the
#      other (bench/follow_bench): ingest rates reached and the latency from a line's sending to
#      its SSE event on the other replica.
# With each creation round, the CPU time each replica and PostgreSQL spent per created job, and
# how busy the machine was (busy, idle, iowait, steal).
# Prints the machine, date and load so the numbers can go in RESULTS.md.
#   BUILD=build bash bench/replicas_bench.sh            (make BUILD=... bench first)
# Environment: DURATION (s, default 10), CONNS (default 32), ROUNDS (default 2), POINTS_RATE
# (default 200000), LINES_RATE (default 1000), THREADS (metric push threads, default 2),
# PG_PROFILE=1 (PostgreSQL loads pg_stat_statements; after the creation rounds the statements
# that took its time are printed, with calls and the mean time of each).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DURATION=${DURATION:-10}
CONNS=${CONNS:-32}
ROUNDS=${ROUNDS:-2}
POINTS_RATE=${POINTS_RATE:-200000}
LINES_RATE=${LINES_RATE:-1000}
THREADS=${THREADS:-2}
KILND="$BUILD/bin/kilnd"
for f in "$KILND" "$BUILD/bench/rest_bench" "$BUILD/bench/follow_bench"; do
  [ -x "$f" ] || { echo "replicas_bench.sh: $f is missing (make BUILD=$BUILD bench)"; exit 1; }
done

source scripts/pg.sh
if [ "${PG_PROFILE:-0}" = 1 ]; then
  export KILN_PG_OPTS="-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
fi
export KILN_PG_PORT=${KILN_PG_PORT:-$((20000 + RANDOM % 20000))}
pg_start || { echo "replicas_bench.sh: could not start PostgreSQL"; exit 1; }
WORK=$(mktemp -d /tmp/kiln-replbench.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  pg_stop
  rm -rf "$WORK"
}
trap cleanup EXIT
bash scripts/make-certs.sh "$WORK/tls" >/dev/null || exit 1
DB=$(pg_createdb "replbench_$$") || exit 1
if [ "${PG_PROFILE:-0}" = 1 ]; then
  "$(pg_bindir)/psql" -q -h "$KILN_PG_HOST" -p "$KILN_PG_PORT" -U postgres -d "replbench_$$" \
    -c 'CREATE EXTENSION pg_stat_statements' || exit 1
fi
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP=(); GRPC=(); URL=()
start_replica() {  # start_replica I
  HTTP[$1]=$(port); GRPC[$1]=$(port)
  KILN_LOG_LEVEL=warn "$KILND" --database-url "$DB" --http-addr "127.0.0.1:${HTTP[$1]}" \
    --grpc-addr "127.0.0.1:${GRPC[$1]}" --tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key" \
    --tls-ca "$WORK/tls/ca.pem" --bootstrap-token-file "$WORK/admin.token" \
    --join-token-file "$WORK/tls/join.token" >>"$WORK/kilnd$1.log" 2>&1 &
  PIDS+=($!)
  URL[$1]="https://127.0.0.1:${HTTP[$1]}"
  for _ in $(seq 100); do
    curl -sf --cacert "$WORK/tls/ca.pem" "${URL[$1]}/readyz" >/dev/null && return 0
    sleep 0.1
  done
  echo "kilnd replica $1 did not become ready:"; cat "$WORK/kilnd$1.log"; exit 1
}
start_replica 0
start_replica 1
leader() { for i in 0 1; do curl -s --cacert "$WORK/tls/ca.pem" "${URL[$i]}/healthz" | grep -q '"leader": *true' && echo "$i"; done; }
TCK=$(getconf CLK_TCK)
PGPID=$(head -1 "$KILN_PG_DIR/data/postmaster.pid")
cpu_of() { awk -v t="$TCK" '{s += $14 + $15} END {printf "%.3f", s / t}' "$@" 2>/dev/null; }
cpu_pg() { cpu_of /proc/$PGPID/stat $(for p in $(ps -o pid= --ppid "$PGPID"); do echo /proc/$p/stat; done); }
cpu_all() { echo "$(cpu_of /proc/${PIDS[0]}/stat) $(cpu_of /proc/${PIDS[1]}/stat) $(cpu_pg)"; }
# the machine's CPU counters (/proc/stat: busy, idle, iowait, steal ticks), and the share of each
# between two readings: a round that leaves the cores idle is bound by waits, not by CPU
machine() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $5, $6, $9}' /proc/stat; }
machine_share() {
  awk -v b="$1" -v a="$2" 'BEGIN { split(b, x, " "); split(a, y, " "); t = 0;
    for (i = 1; i <= 4; i++) t += y[i] - x[i];
    if (t > 0) printf "  machine: busy %.0f%%, idle %.0f%%, iowait %.0f%%, steal %.0f%%\n",
      100 * (y[1] - x[1]) / t, 100 * (y[2] - x[2]) / t, 100 * (y[3] - x[3]) / t, 100 * (y[4] - x[4]) / t }'
}
# cpu_per_job BEFORE AFTER JOBS: the CPU each replica and PostgreSQL spent per created job
cpu_per_job() {
  awk -v b="$1" -v a="$2" -v n="$3" 'BEGIN { split(b, x, " "); split(a, y, " ");
    if (n > 0) printf "  cpu per job: replica 0 %.3f ms, replica 1 %.3f ms, postgres %.3f ms\n",
      (y[1] - x[1]) * 1000 / n, (y[2] - x[2]) * 1000 / n, (y[3] - x[3]) * 1000 / n }'
}
sent() { sed -n 's/.*warm-up included: \([0-9]*\).*/\1/p' "$@" | awk '{s += $1} END {print s + 0}'; }
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs)"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== kilnd replicas: ${URL[0]} and ${URL[1]} (leader: replica $(leader)), security on (TLS, tokens, agent mTLS)"
half=$((CONNS / 2))
for round in $(seq "$ROUNDS"); do
  # baseline in the same session: every connection to replica 0 (replica 1 up and idle)
  echo
  echo "== round $round: job creation on replica 0 alone ($CONNS connections, ${DURATION} s)"
  c0=$(cpu_all); m0=$(machine)
  "$BUILD/bench/rest_bench" --url "${URL[0]}" --ca "$WORK/tls/ca.pem" --token-file "$WORK/admin.token" \
    --mode throughput --connections "$CONNS" --duration "$DURATION" >"$WORK/rest.out" 2>&1
  grep -E 'throughput|latency|status [0-9]' "$WORK/rest.out"
  cpu_per_job "$c0" "$(cpu_all)" "$(sent "$WORK/rest.out")"
  machine_share "$m0" "$(machine)"
  echo
  echo "== round $round: job creation on both replicas at once ($half connections each, ${DURATION} s)"
  RB=()
  c0=$(cpu_all); m0=$(machine)
  for i in 0 1; do
    "$BUILD/bench/rest_bench" --url "${URL[$i]}" --ca "$WORK/tls/ca.pem" --token-file "$WORK/admin.token" \
      --mode throughput --connections "$half" --duration "$DURATION" >"$WORK/rest$i.out" 2>&1 &
    RB+=($!)
  done
  wait "${RB[@]}"
  c1=$(cpu_all); m1=$(machine)
  total=0
  for i in 0 1; do
    echo "-- replica $i:"; cat "$WORK/rest$i.out"
    r=$(sed -n 's/.*throughput: *\([0-9.]*\) jobs\/s.*/\1/p' "$WORK/rest$i.out" | head -1)
    [ -z "$r" ] && r=$(grep -oE '[0-9.]+ jobs/s' "$WORK/rest$i.out" | head -1 | cut -d' ' -f1)
    total=$(awk -v a="$total" -v b="${r:-0}" 'BEGIN {print a + b}')
  done
  echo "-- both replicas: $total jobs/s"
  cpu_per_job "$c0" "$c1" "$(sent "$WORK/rest0.out" "$WORK/rest1.out")"
  machine_share "$m0" "$m1"
done
if [ "${PG_PROFILE:-0}" = 1 ]; then
  echo
  echo "== PostgreSQL's statements during the creation rounds (pg_stat_statements, by total time)"
  "$(pg_bindir)/psql" -q -h "$KILN_PG_HOST" -p "$KILN_PG_PORT" -U postgres -d "replbench_$$" -P pager=off <<'SQL'
\pset format aligned
SELECT calls, round(total_exec_time::numeric, 0) AS total_ms, round(mean_exec_time::numeric, 3) AS mean_ms,
       round(total_plan_time::numeric, 0) AS plan_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS query
FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 25;
SQL
fi
# After every creation round: the bench agent registers without data roots, after which kilnd
# refuses the creation bench's specs (their file is inside no agent's data root).
for round in $(seq "$ROUNDS"); do
  echo
  echo "== round $round: follower on replica 1, agent pushing into replica 0 ($POINTS_RATE points/s, $LINES_RATE lines/s, ${DURATION} s)"
  "$BUILD/bench/follow_bench" --grpc "127.0.0.1:${GRPC[0]}" --url "${URL[1]}" --ca "$WORK/tls/ca.pem" \
    --token-file "$WORK/admin.token" --tls-dir "$WORK/tls" --seconds "$DURATION" \
    --points-rate "$POINTS_RATE" --lines-rate "$LINES_RATE" --threads "$THREADS"
done
echo
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== jobs stored: $("$(pg_bindir)/psql" -qAt -h "$KILN_PG_HOST" -p "$KILN_PG_PORT" -U postgres -d "replbench_$$" -c 'select count(*) from jobs' 2>/dev/null)"
for i in 0 1; do
  if grep -qE "ERROR|WARN" "$WORK/kilnd$i.log"; then
    echo "== kilnd replica $i warnings:"; grep -E "ERROR|WARN" "$WORK/kilnd$i.log" | grep -v 'join-token\|can be read' | tail -5
  fi
done
