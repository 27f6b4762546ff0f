#!/usr/bin/env bash
# tune_bench.sh - issue 29's tuning benchmark: kiln's hyperband against kiln's random search and
# against Optuna (TPE sampler, Hyperband pruner, driving kiln-train directly) on one search space
# over tiny GPT jobs on tinyshakespeare, the same budget of training steps, several seeds; and the
# steps hyperband's pause and resume saves over restarting promoted trials. A real kilnd, agent
# (sandbox on) and PostgreSQL (bench/kiln_cluster.sh); the driver is bench/tune_bench.py. Prints
# the machine, date and load for bench/RESULTS.md; the raw curves go to OUT (a JSON file).
#   BUILD=build bash bench/tune_bench.sh      (as root; needs python3-optuna)
# Environment: SEEDS (default "1 2 3"), RANDOM_TRIALS (4: the budget is 4 x MAX_RESOURCE steps),
# MIN_RESOURCE (50), MAX_RESOURCE (450), ETA (3), PARALLEL (2), OUT (/tmp/tune_bench.json),
# HEARTBEAT_MS (kilnd's, 500: a trial's pause and promotion wait on it less).
# HB_SAMPLER (hyperband.sampler of kiln's hyperband searches: random, the default, or tpe).
# WARMUP_MAX (300: the top of warmup_steps' range).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
for f in "$BUILD/bin/kilnd" "$BUILD/bin/kiln-agent" "$BUILD/bin/kiln-train"; do
  [ -x "$f" ] || { echo "tune_bench.sh: $f is missing (make BUILD=$BUILD)"; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "tune_bench.sh: the sandbox needs root"; exit 1; }
/usr/bin/python3 -c 'import optuna' 2>/dev/null || { echo "tune_bench.sh: apt-get install -y python3-optuna"; exit 1; }
source bench/kiln_cluster.sh
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs), kernel $(uname -r)"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# PARALLEL slots for each kiln search of each seed, all at once (one thread a slot)
export HEARTBEAT_MS=${HEARTBEAT_MS:-500}
cluster_start $(((1 + $(echo ${HB_BRACKETS:-1} | wc -w)) * ${PARALLEL:-2} * $(echo ${SEEDS:-1 2 3} | wc -w)))
cp data/tinyshakespeare.txt "$CL_DATA/" && chmod 644 "$CL_DATA/tinyshakespeare.txt"
/usr/bin/python3 bench/tune_bench.py "$KILN_URL" "$KILN_TOKEN" "$KILN_TLS_CA" "$PWD/$BUILD/bin/kiln-train" \
  "$CL_DATA/tinyshakespeare.txt" "${OUT:-/tmp/tune_bench.json}" || {
  echo "== kilnd log:"; tail -20 "$CL_WORK/kilnd.log"; echo "== agent log:"; tail -20 "$CL_WORK/agent.log"; exit 1; }
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit 0
