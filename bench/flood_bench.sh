#!/usr/bin/env bash
# flood_bench.sh - one client address holding 10,000 idle connections to each of kilnd's ports,
# and another address's requests meanwhile: a throwaway PostgreSQL, a real kilnd (TLS, tokens, its
# default connection limits), then bench/flood_bench from 127.0.0.1 and 127.0.0.2. Prints the
# machine, date and load for bench/RESULTS.md.
#   BUILD=build bash bench/flood_bench.sh       (make BUILD=... bench first)
# Environment: FLOOD (connections per port, default 10000), SAMPLES (requests per measurement,
# default 200).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
FLOOD=${FLOOD:-10000}
SAMPLES=${SAMPLES:-200}
KILND="$BUILD/bin/kilnd"
BENCH="$BUILD/bench/flood_bench"
for f in "$KILND" "$BENCH"; do
  [ -x "$f" ] || { echo "flood_bench.sh: $f is missing (make BUILD=$BUILD bench)"; exit 1; }
done
source scripts/pg.sh
export KILN_PG_PORT=${KILN_PG_PORT:-$((20000 + RANDOM % 20000))}
pg_start || { echo "flood_bench.sh: could not start PostgreSQL"; exit 1; }
WORK=$(mktemp -d /tmp/kiln-floodbench.XXXXXX)
KPID=
trap '[ -n "$KPID" ] && kill "$KPID" 2>/dev/null && wait "$KPID" 2>/dev/null; pg_stop; rm -rf "$WORK"' EXIT
bash scripts/make-certs.sh "$WORK/tls" >/dev/null || exit 1
DB=$(pg_createdb "floodbench_$$") || exit 1
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HTTP=$(port); GRPC=$(port)
# The idle connections kilnd keeps must outlive the measurement: a handshake deadline of 10 minutes
# (through the environment, so that a kilnd older than the flag runs too, for a baseline).
KILN_LOG_LEVEL=warn KILN_HANDSHAKE_TIMEOUT_MS=600000 "$KILND" --database-url "$DB" \
  --http-addr "127.0.0.1:$HTTP" --grpc-addr "127.0.0.1:$GRPC" --tls-cert "$WORK/tls/server.pem" \
  --tls-key "$WORK/tls/server.key" --bootstrap-token-file "$WORK/admin.token" \
  --join-token-file "$WORK/join.token" >>"$WORK/kilnd.log" 2>&1 &
KPID=$!
for _ in $(seq 100); do
  curl -sf --cacert "$WORK/tls/ca.pem" "https://127.0.0.1:$HTTP/readyz" >/dev/null 2>&1 && break; sleep 0.2
done
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs)"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== kilnd: $("$KILND" --help 2>&1 | grep -c max-connections-per-address | sed 's/^0$/without per-address limits/; s/^1$/per-address limit 256 (default)/')"
"$BENCH" --url "https://127.0.0.1:$HTTP" --grpc-port "$GRPC" --ca "$WORK/tls/ca.pem" \
  --token-file "$WORK/admin.token" --flood "$FLOOD" --samples "$SAMPLES"
echo "== kilnd refused: $(curl -s --cacert "$WORK/tls/ca.pem" "https://127.0.0.1:$HTTP/metrics" | grep '^kiln_connections_refused_total' | tr '\n' ' ')"
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
