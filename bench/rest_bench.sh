#!/usr/bin/env bash
# rest_bench.sh - REST job creation benchmark: a throwaway PostgreSQL at default durability
# (fsync and synchronous_commit on; initdb --no-sync only skips syncing initdb's own files),
# a real kilnd process, then bench/rest_bench: closed-loop throughput and open-loop latency
# at a fixed rate. Each round runs kilnd twice on the same build and database, once with
# security off (--insecure --no-auth: plain HTTP, no token) and once on (TLS, every request with
# a bearer token checked against the database), so the cost of security is measured in one run.
# Prints the machine, date and load so the numbers can go in RESULTS.md.
#   BUILD=build bash bench/rest_bench.sh            (make BUILD=... bench first)
# Environment: DURATION (s, default 10), RATE (default 200), CONNS (default 32), ROUNDS
# (default 2), MODES ("off on" by default).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
DURATION=${DURATION:-10}
RATE=${RATE:-200}
CONNS=${CONNS:-32}
ROUNDS=${ROUNDS:-2}
MODES=${MODES:-off on}
KILND="$BUILD/bin/kilnd"
BENCH="$BUILD/bench/rest_bench"
for f in "$KILND" "$BENCH"; do
  [ -x "$f" ] || { echo "rest_bench.sh: $f is missing (make BUILD=$BUILD bench)"; exit 1; }
done

source scripts/pg.sh
export KILN_PG_PORT=${KILN_PG_PORT:-$((20000 + RANDOM % 20000))}
pg_start || { echo "rest_bench.sh: could not start PostgreSQL"; exit 1; }
WORK=$(mktemp -d /tmp/kiln-restbench.XXXXXX)
KPID=
cleanup() {
  [ -n "$KPID" ] && kill "$KPID" 2>/dev/null && wait "$KPID" 2>/dev/null
  pg_stop
  rm -rf "$WORK"
}
trap cleanup EXIT
bash scripts/make-certs.sh "$WORK/tls" || exit 1

DB=$(pg_createdb "restbench_$$") || exit 1
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP_PORT=$(port); GRPC_PORT=$(port)
LOG="$WORK/kilnd.log"
TCK=$(getconf CLK_TCK)
PGPID=$(head -1 "$KILN_PG_DIR/data/postmaster.pid")

start_kilnd() {  # start_kilnd off|on
  [ -n "$KPID" ] && kill "$KPID" 2>/dev/null && wait "$KPID" 2>/dev/null
  local sec scheme=http curl_tls=()
  if [ "$1" = on ]; then
    sec=(--tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key"
         --bootstrap-token-file "$WORK/admin.token" --join-token-file "$WORK/join.token")
    scheme=https; curl_tls=(--cacert "$WORK/tls/ca.pem")
  else
    sec=(--insecure --no-auth)
  fi
  KILN_LOG_LEVEL=warn "$KILND" --database-url "$DB" --http-addr "127.0.0.1:$HTTP_PORT" \
    --grpc-addr "127.0.0.1:$GRPC_PORT" "${sec[@]}" >>"$LOG" 2>&1 &
  KPID=$!
  URL="$scheme://127.0.0.1:$HTTP_PORT"
  for _ in $(seq 100); do
    curl -sf "${curl_tls[@]}" "$URL/readyz" >/dev/null && break
    sleep 0.1
  done
  curl -sf "${curl_tls[@]}" "$URL/readyz" >/dev/null || { echo "kilnd did not become ready:"; cat "$LOG"; exit 1; }
  BENCH_ARGS=(--url "$URL")
  [ "$1" = on ] && BENCH_ARGS+=(--ca "$WORK/tls/ca.pem" --token-file "$WORK/admin.token")
}

# CPU seconds used so far by kilnd and by this cluster's PostgreSQL processes: a figure that,
# unlike jobs/s, does not depend on what else the shared cores are doing.
cpu_of() { awk -v t="$TCK" '{s += $14 + $15} END {printf "%.2f", s / t}' "$@" 2>/dev/null; }
cpu_kilnd() { cpu_of /proc/$KPID/stat; }
cpu_pg() { cpu_of /proc/$PGPID/stat $(for p in $(ps -o pid= --ppid "$PGPID"); do echo /proc/$p/stat; done); }
run_bench() {  # run_bench ARGS... : the bench, then the CPU it cost per created job
  local k0 p0 out
  k0=$(cpu_kilnd); p0=$(cpu_pg)
  out=$("$BENCH" "${BENCH_ARGS[@]}" "$@"); echo "$out"
  local n; n=$(echo "$out" | sed -n 's/.*warm-up included: \([0-9]*\).*/\1/p')
  awk -v k0="$k0" -v k1="$(cpu_kilnd)" -v p0="$p0" -v p1="$(cpu_pg)" -v n="${n:-0}" 'BEGIN {
    if (n > 0) printf "  cpu per request: kilnd %.3f ms, postgres %.3f ms\n", (k1 - k0) * 1000 / n, (p1 - p0) * 1000 / n }'
}
psql_q() { "$(pg_bindir)/psql" -qAt -h "$KILN_PG_HOST" -p "$KILN_PG_PORT" -U postgres -d postgres -c "$1"; }
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs)"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== postgres: fsync=$(psql_q 'show fsync') synchronous_commit=$(psql_q 'show synchronous_commit') wal_sync_method=$(psql_q 'show wal_sync_method')"
echo "== kilnd: $KILND, http 127.0.0.1:$HTTP_PORT, threads ${KILN_HTTP_THREADS:-default}"
for round in $(seq "$ROUNDS"); do
  # Alternate the order: the jobs table grows with every run, and the later run of a round would
  # always pay for the larger indexes.
  order=$MODES
  [ $((round % 2)) -eq 0 ] && order=$(echo $MODES | tr ' ' '\n' | tac | tr '\n' ' ')
  for mode in $order; do
    start_kilnd "$mode"
    echo
    echo "== round $round, security $mode ($URL)"
    run_bench --mode throughput --connections "$CONNS" --duration "$DURATION"
    echo
    run_bench --mode latency --rate "$RATE" --connections "$CONNS" --duration "$DURATION"
  done
done
echo
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== jobs stored: $("$(pg_bindir)/psql" -qAt -h "$KILN_PG_HOST" -p "$KILN_PG_PORT" -U postgres -d "restbench_$$" -c 'select count(*) from jobs' 2>/dev/null)"
if grep -qE "ERROR|WARN" "$LOG"; then echo "== kilnd warnings:"; grep -E "ERROR|WARN" "$LOG" | grep -v 'PLAIN TEXT\|AUTHENTICATION IS OFF\|join-token' | tail -5; fi
