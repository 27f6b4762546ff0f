#!/usr/bin/env bash
# engine_bench.sh - kiln's GPT training step against PyTorch's, same configurations and thread
# count, one after the other in the same run (bench/RESULTS.md, engine section). Waits (up to
# KILN_BENCH_WAIT seconds, default 600) for the 1-minute load average to drop below
# KILN_BENCH_MAXLOAD (default 1.0) so shared machines are measured quiet, and records the load.
# Per configuration: kiln, PyTorch (its settings variants, fastest kept), kiln again.
#   BUILD=build bash bench/engine_bench.sh [threads] [steps]
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
THREADS=${1:-2}
STEPS=${2:-10}
MAXLOAD=${KILN_BENCH_MAXLOAD:-1.0}
WAIT=${KILN_BENCH_WAIT:-600}
# PyTorch settings tried (blas build / OMP_WAIT_POLICY / OPENBLAS_CORETYPE); the spinning
# policy is left out of the 124M run only when KILN_BENCH_QUICK=1 (it is slow on a loaded box).
SMALL_VARIANTS=${KILN_BENCH_TORCH_SMALL:-}
BIG_VARIANTS=${KILN_BENCH_TORCH_124M:-}
make --no-print-directory BUILD="$BUILD" "$BUILD/bench/engine_bench" >/dev/null || exit 1
for ((i = 0; i < WAIT; i += 10)); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  awk -v l="$load" -v m="$MAXLOAD" 'BEGIN{exit !(l < m)}' && break
  sleep 10
done
echo "# $(date -u +%FT%TZ) $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "# load before: $(cat /proc/loadavg)"
for cfg in small 124m; do
  variants=$SMALL_VARIANTS
  [ "$cfg" = 124m ] && variants=$BIG_VARIANTS
  "$BUILD/bench/engine_bench" --config "$cfg" --threads "$THREADS" --steps "$STEPS" --warmup 3
  echo "# load: $(cat /proc/loadavg)"
  /usr/bin/python3 bench/torch_gpt.py --config "$cfg" --threads "$THREADS" --steps "$STEPS" --warmup 3 \
    ${variants:+--variants "$variants"}
  echo "# load: $(cat /proc/loadavg)"
  "$BUILD/bench/engine_bench" --config "$cfg" --threads "$THREADS" --steps "$STEPS" --warmup 3
done
echo "# load after: $(cat /proc/loadavg)"
