#!/usr/bin/env bash
# sched_sim.sh - the scheduler simulator (bench/sched_sim.c) over the traces bench/RESULTS.md
# reports: the default mix at offered loads 1.1 and 0.9, the gang-heavy mix and the mix with large
# training runs (6-12 whole workers, borrowing from the cohort) at 1.1, and the default and large-run
# mixes oversubscribed (1.5), five seeds each, kiln's queues policy beside today's (strict priority,
# FIFO, head-of-line blocking) on the same traces. Pure CPU, no database; prints the machine and date for bench/RESULTS.md.
#   make BUILD=build build/bench/sched_sim && BUILD=build bash bench/sched_sim.sh
# Environment: SEEDS (5), JOBS (2000). Exit status: 1 when an invariant broke.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SIM="$BUILD/bench/sched_sim"
[ -x "$SIM" ] || { echo "sched_sim.sh: $SIM is missing (make BUILD=$BUILD $SIM)"; exit 1; }
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPU(s): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
rc=0
for cfg in "--load 1.1" "--load 0.9" "--load 1.1 --mix wide" "--load 1.1 --mix big" "--load 1.5" "--load 1.5 --mix big"; do
  # shellcheck disable=SC2086
  "$SIM" --seeds "${SEEDS:-5}" --jobs "${JOBS:-2000}" $cfg || rc=1
  echo
done
exit $rc
