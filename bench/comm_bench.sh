#!/usr/bin/env bash
# comm_bench.sh - all-reduce bus bandwidth against the provider's point-to-point bandwidth, over
# shm and over tcp;ofi_rxm, 2 ranks (2 processes on this host), 1 MiB to 256 MiB
# (bench/RESULTS.md, comm section). Waits (up to KILN_BENCH_WAIT seconds, default 600) for the
# 1-minute load average to drop below KILN_BENCH_MAXLOAD (default 1.0) and records the load.
#   BUILD=build bash bench/comm_bench.sh [min_MiB] [max_MiB]
# KILN_COMM_CHUNK_BYTES and KILN_COMM_DEPTH pass through to the ranks. KILN_BENCH_NICE=-10 runs
# the ranks at a higher priority when the shared machine never gets quiet (recorded below).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
MIN=${1:-1}
MAX=${2:-256}
MAXLOAD=${KILN_BENCH_MAXLOAD:-1.0}
WAIT=${KILN_BENCH_WAIT:-600}
make --no-print-directory BUILD="$BUILD" "$BUILD/bench/comm_bench" >/dev/null || exit 1
for ((i = 0; i < WAIT; i += 10)); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  awk -v l="$load" -v m="$MAXLOAD" 'BEGIN{exit !(l < m)}' && break
  sleep 10
done
echo "# $(date -u +%FT%TZ) $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "# chunk ${KILN_COMM_CHUNK_BYTES:-1048576} B, depth ${KILN_COMM_DEPTH:-4}"
echo "# load before: $(cat /proc/loadavg); ranks at nice ${KILN_BENCH_NICE:-0}"
port=$((20000 + RANDOM % 20000))
for prov in shm tcp; do
  port=$((port + 1))
  while ss -Htln "sport = :$port" | grep -q .; do port=$((port + 1)); done
  pids=()
  for rank in 1 0; do
    KILN_RANK=$rank KILN_WORLD_SIZE=2 KILN_LOCAL_RANK=$rank KILN_MASTER_ADDR=127.0.0.1 \
      KILN_MASTER_PORT=$port KILN_COMM_PROVIDER=$prov KILN_COMM_TIMEOUT_S=60 \
      nice -n "${KILN_BENCH_NICE:-0}" "$BUILD/bench/comm_bench" "$MIN" "$MAX" | { [ $rank = 0 ] && { [ $prov = shm ] && cat || tail -n +2; } || cat; } &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
done
echo "# load after: $(cat /proc/loadavg)"
