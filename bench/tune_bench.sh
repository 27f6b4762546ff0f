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
# Pause and resume against restarting promoted trials, both run: HB_RESTART=1 starts kilnd with
# --tune-promoted-restart (a promoted trial trains again from step 0); HB_RESTART=both runs the
# bench twice at once, each on its own cluster (OUT's name with -resume and -restart), and
# compares the two by seed (tune_bench.py --compare). For the same promotions in both, use
# PARALLEL=1 (results arrive in one order), HB_MAX_JOBS (the searches run to their end instead of
# being stopped at the budget) and HB_ONLY=1 (no random search, no Optuna), e.g.
#   HB_RESTART=both HB_ONLY=1 PARALLEL=1 HB_MAX_JOBS=18 BUILD=build bash bench/tune_bench.sh
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
if [ "${HB_RESTART:-0}" = both ]; then
  out=${OUT:-/tmp/tune_bench.json}
  out=${out%.json}
  echo "== resume and restart at once: $out-resume.{json,log}, $out-restart.{json,log}"
  (unset KILN_PG_PORT; HB_RESTART=0 OUT="$out-resume.json" bash bench/tune_bench.sh >"$out-resume.log" 2>&1) &
  a=$!
  (unset KILN_PG_PORT; HB_RESTART=1 OUT="$out-restart.json" bash bench/tune_bench.sh >"$out-restart.log" 2>&1) &
  b=$!
  wait $a; ra=$?
  wait $b; rb=$?
  echo "== resume run (exit $ra):"; cat "$out-resume.log"
  echo "== restart run (exit $rb):"; cat "$out-restart.log"
  [ $ra = 0 ] && [ $rb = 0 ] || exit 1
  exec /usr/bin/python3 bench/tune_bench.py --compare "$out-resume.json" "$out-restart.json"
fi
[ "${HB_RESTART:-0}" = 1 ] && export KILND_FLAGS="${KILND_FLAGS:-} --tune-promoted-restart"
for f in "$BUILD/bin/kilnd" "$BUILD/bin/kiln-agent" "$BUILD/bin/kiln-train"; do
  [ -x "$f" ] || { echo "tune_bench.sh: $f is missing (make BUILD=$BUILD)"; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "tune_bench.sh: the sandbox needs root"; exit 1; }
[ "${HB_ONLY:-0}" = 1 ] || [ "${OPTUNA:-1}" = 0 ] || /usr/bin/python3 -c 'import optuna' 2>/dev/null || { echo "tune_bench.sh: apt-get install -y python3-optuna"; exit 1; }
source bench/kiln_cluster.sh
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs), kernel $(uname -r)"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== promoted trials: $([ "${HB_RESTART:-0}" = 1 ] && echo "restart from step 0 (kilnd --tune-promoted-restart)" || echo "resume from their checkpoint")"
# PARALLEL slots for each kiln search of each seed, all at once (one thread a slot)
export HEARTBEAT_MS=${HEARTBEAT_MS:-500}
others=1
[ "${HB_ONLY:-0}" = 1 ] && others=0
cluster_start $(((others + $(echo ${HB_BRACKETS:-1} | wc -w)) * ${PARALLEL:-2} * $(echo ${SEEDS:-1 2 3} | wc -w)))
cp data/tinyshakespeare.txt "$CL_DATA/" && chmod 644 "$CL_DATA/tinyshakespeare.txt"
/usr/bin/python3 bench/tune_bench.py "$KILN_URL" "$KILN_TOKEN" "$KILN_TLS_CA" "$PWD/$BUILD/bin/kiln-train" \
  "$CL_DATA/tinyshakespeare.txt" "${OUT:-/tmp/tune_bench.json}" || {
  echo "== kilnd log:"; tail -20 "$CL_WORK/kilnd.log"; echo "== agent log:"; tail -20 "$CL_WORK/agent.log"; exit 1; }
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit 0
