#!/usr/bin/env bash
# sandbox_bench.sh - what the ranks' sandbox costs kiln-train: the same small GPT job (2 layers,
# 128 wide, 64 tokens, 8 sequences per rank) started through the agent's launcher with the
# sandbox off and on, 1 rank and 2 ranks (one host, shm), in interleaved rounds (the order flips
# every round), each run reporting rank 0's median step time after a warm-up and the time from
# the start to the first step (bench/sandbox_bench.c); then what starting a rank costs: STARTS
# one-rank jobs of /bin/true, off and on, twice each. Prints the machine, date and load for
# bench/RESULTS.md, every run, then the medians of the runs per configuration.
#   BUILD=build bash bench/sandbox_bench.sh      (as root; make BUILD=... bench first)
# Environment: ROUNDS (default 4), STEPS (default 40), RANKS (default "1 2"), STARTS (default 20; 0: none).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-4}
STEPS=${STEPS:-40}
RANKS=${RANKS:-"1 2"}
STARTS=${STARTS:-20}
BENCH="$BUILD/bench/sandbox_bench"
[ -x "$BENCH" ] || { echo "sandbox_bench.sh: $BENCH is missing (make BUILD=$BUILD bench)"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "sandbox_bench.sh: the sandbox needs root"; exit 1; }
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs), kernel $(uname -r)"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
out=$(mktemp /tmp/kiln-sbbench.XXXXXX)
trap 'rm -f "$out"' EXIT
for round in $(seq "$ROUNDS"); do
  order="off on"
  [ $((round % 2)) -eq 0 ] && order="on off"
  for r in $RANKS; do
    for mode in $order; do
      line=$("$BENCH" --train-bin "$BUILD/bin/kiln-train" --data data/tinyshakespeare.txt --sandbox "$mode" \
             --ranks "$r" --steps "$STEPS" 2>/dev/null | tail -1)
      echo "round $round: $line"
      echo "$line" >>"$out"
    done
  done
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== medians over $ROUNDS rounds (of each run's median step time; of its time to the first step)"
# median of the numbers on stdin, one a line
median() { sort -n | awk '{v[NR]=$1} END {if (!NR) print "-"; else printf "%.2f\n", NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
for r in $RANKS; do
  for mode in off on; do
    runs=$(grep -c "^sandbox=$mode ranks=$r " "$out")
    step=$(grep "^sandbox=$mode ranks=$r " "$out" | sed 's/.*median_ms=\([0-9.]*\).*/\1/' | median)
    lo=$(grep "^sandbox=$mode ranks=$r " "$out" | sed 's/.*median_ms=\([0-9.]*\).*/\1/' | sort -n | head -1)
    hi=$(grep "^sandbox=$mode ranks=$r " "$out" | sed 's/.*median_ms=\([0-9.]*\).*/\1/' | sort -n | tail -1)
    start=$(grep "^sandbox=$mode ranks=$r " "$out" | sed 's/.*start_ms=\([0-9.]*\).*/\1/' | median)
    echo "sandbox=$mode ranks=$r runs=$runs step_ms median $step (runs from $lo to $hi), start_ms median $start"
  done
done
[ "$STARTS" -gt 0 ] || exit 0
echo "== starting a one-rank job of /bin/true ($STARTS in a row): the launcher's start call, and to its exit"
for mode in off on on off; do
  "$BENCH" --train-bin /bin/true --data data/tinyshakespeare.txt --sandbox "$mode" --starts "$STARTS" 2>/dev/null | tail -1
done
