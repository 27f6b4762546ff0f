#!/usr/bin/env bash
# create_cost.sh - what one job creation costs in CPU: one kilnd (TLS and tokens on, as deployed)
# on a throwaway PostgreSQL at default durability, POST /v1/jobs at a fixed rate (open loop, below
# saturation so that waiting does not inflate the figures), and the CPU time kilnd and every
# PostgreSQL process spent over the run divided by the jobs created.
#   BUILD=build bash bench/create_cost.sh            (make BUILD=... bench first)
# Environment: RATE (jobs/s, default 800), DURATION (s, default 8), CONNS (default 32), ROUNDS
# (default 2). BUILD may name another tree's build directory (e.g. a worktree of an older commit)
# to compare two versions in one session; that tree's kilnd migrates the database itself.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
RATE=${RATE:-800}
DURATION=${DURATION:-8}
CONNS=${CONNS:-32}
ROUNDS=${ROUNDS:-2}
KILND="$BUILD/bin/kilnd"
BENCH="$BUILD/bench/rest_bench"
for f in "$KILND" "$BENCH"; do
  [ -x "$f" ] || { echo "create_cost.sh: $f is missing (make BUILD=$BUILD bench)"; exit 1; }
done
source scripts/pg.sh
export KILN_PG_PORT=${KILN_PG_PORT:-$((20000 + RANDOM % 20000))}
pg_start || { echo "create_cost.sh: could not start PostgreSQL"; exit 1; }
WORK=$(mktemp -d /tmp/kiln-createcost.XXXXXX)
KPID=
cleanup() {
  [ -n "$KPID" ] && kill "$KPID" 2>/dev/null && wait "$KPID" 2>/dev/null
  pg_stop
  rm -rf "$WORK"
}
trap cleanup EXIT
bash scripts/make-certs.sh "$WORK/tls" >/dev/null || exit 1
DB=$(pg_createdb "createcost_$$") || exit 1
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP_PORT=$(port); GRPC_PORT=$(port)
KILN_LOG_LEVEL=warn "$KILND" --database-url "$DB" --http-addr "127.0.0.1:$HTTP_PORT" --grpc-addr "127.0.0.1:$GRPC_PORT" \
  --tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key" --bootstrap-token-file "$WORK/admin.token" \
  --join-token-file "$WORK/tls/join.token" >>"$WORK/kilnd.log" 2>&1 &
KPID=$!
URL="https://127.0.0.1:$HTTP_PORT"
for _ in $(seq 100); do
  curl -sf --cacert "$WORK/tls/ca.pem" "$URL/readyz" >/dev/null && break
  sleep 0.1
done
curl -sf --cacert "$WORK/tls/ca.pem" "$URL/readyz" >/dev/null || { echo "kilnd did not become ready:"; cat "$WORK/kilnd.log"; exit 1; }
TCK=$(getconf CLK_TCK)
PGPID=$(head -1 "$KILN_PG_DIR/data/postmaster.pid")
cpu_of() { awk -v t="$TCK" '{s += $14 + $15} END {printf "%.3f", s / t}' "$@" 2>/dev/null; }
cpu_pg() { cpu_of /proc/$PGPID/stat $(for p in $(ps -o pid= --ppid "$PGPID"); do echo /proc/$p/stat; done); }
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs)"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== kilnd: $KILND, $RATE jobs/s open loop over $CONNS connections, ${DURATION} s a round"
for round in $(seq "$ROUNDS"); do
  k0=$(cpu_of /proc/$KPID/stat); p0=$(cpu_pg)
  out=$("$BENCH" --url "$URL" --ca "$WORK/tls/ca.pem" --token-file "$WORK/admin.token" --mode latency \
    --rate "$RATE" --connections "$CONNS" --duration "$DURATION")
  n=$(echo "$out" | sed -n 's/.*warm-up included: \([0-9]*\).*/\1/p')
  bad=$(echo "$out" | sed -n 's/.*other status: \([0-9]*\).*/\1/p')
  awk -v r="$round" -v n="${n:-0}" -v k0="$k0" -v k1="$(cpu_of /proc/$KPID/stat)" -v p0="$p0" -v p1="$(cpu_pg)" \
      -v lat="$(echo "$out" | grep -o 'p99 [0-9.]*' | head -1)" -v bad="${bad:-?}" 'BEGIN {
    if (n > 0) printf "round %d: %d jobs (%s not 201), %s ms; CPU per job: PostgreSQL %.3f ms, kilnd %.3f ms\n",
      r, n, bad, lat, (p1 - p0) * 1000 / n, (k1 - k0) * 1000 / n }'
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
