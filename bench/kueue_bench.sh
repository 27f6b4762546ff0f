#!/usr/bin/env bash
# kueue_bench.sh - Kueue's scheduler benchmark replayed on kiln (issue 28): a throwaway PostgreSQL
# (default durability), then bench/kueue_bench: the service with its real scheduler thread, jobs
# submitted through svc_job_create at Kueue's rates, simulated agents on the agent RPC functions;
# then a 10,000-job backlog for the scheduler pass times. Prints the machine, date and load so the
# numbers can go in bench/RESULTS.md.
#   make BUILD=build build/bench/kueue_bench && BUILD=build bash bench/kueue_bench.sh [kueue_bench flags]
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN="$BUILD/bench/kueue_bench"
[ -x "$BIN" ] || { echo "kueue_bench.sh: $BIN is missing (make BUILD=$BUILD $BIN)"; exit 1; }

source scripts/pg.sh
export KILN_PG_PORT=${KILN_PG_PORT:-$((20000 + RANDOM % 20000))}
export KILN_PG_OPTS="${KILN_PG_OPTS:-} -c shared_preload_libraries=pg_stat_statements"
pg_start || { echo "kueue_bench.sh: could not start PostgreSQL"; exit 1; }
trap pg_stop EXIT
psql_q() { "$(pg_bindir)/psql" -qAt -h "$KILN_PG_HOST" -p "$KILN_PG_PORT" -U postgres -d postgres -c "$1"; }

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs), $(free -g | awk '/Mem:/ {print $2}') GiB"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== postgres: $(psql_q 'select version()' | cut -d' ' -f1-2), shared_buffers=$(psql_q 'show shared_buffers'), fsync=$(psql_q 'show fsync'), synchronous_commit=$(psql_q 'show synchronous_commit')"
echo "== command: $BIN $*"
"$BIN" --database-url "$KILN_PG_URL" "$@"
rc=$?
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
