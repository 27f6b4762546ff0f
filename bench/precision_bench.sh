#!/usr/bin/env bash
# precision_bench.sh - kiln's GPT training step in fp32 and in bf16 (mixed precision: bf16 GEMMs,
# fp32 master weights) beside PyTorch's fp32 step, interleaved round by round in one run, on the
# small configuration and GPT-2 124M (bench/RESULTS.md, "Mixed precision on the CPU"). Each round
# runs kiln fp32, kiln bf16, PyTorch fp32 (its fastest setting in earlier runs), so a slow spell
# of the shared machine hits all three alike; the summary gives the medians over rounds and the
# ratios of tokens/s. PyTorch's own bf16 (torch.autocast on the CPU) runs once on the small
# configuration for reference.
#   BUILD=build bash bench/precision_bench.sh [rounds] [threads]
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ROUNDS=${1:-3}
THREADS=${2:-2}
make --no-print-directory BUILD="$BUILD" "$BUILD/bench/engine_bench" >/dev/null || exit 1
out=$(mktemp /tmp/kiln-precision.XXXXXX)
{
  echo "# $(date -u +%FT%TZ) $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset: OpenBLAS picks its kernels for this CPU)}"
  echo "# cpu flags: $(grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512_bf16|amx_bf16|amx_tile)$' | xargs)"
  echo "# load before: $(cat /proc/loadavg)"
  for cfg in small 124m; do
    if [ "$cfg" = small ]; then steps=30; variant=openmp/default/default; else steps=10; variant=openmp/spin5000/default; fi
    for ((r = 1; r <= ROUNDS; r++)); do
      "$BUILD/bench/engine_bench" --config "$cfg" --threads "$THREADS" --steps "$steps" --warmup 3 --precision fp32
      "$BUILD/bench/engine_bench" --config "$cfg" --threads "$THREADS" --steps "$steps" --warmup 3 --precision bf16
      /usr/bin/python3 bench/torch_gpt.py --config "$cfg" --threads "$THREADS" --steps "$steps" --warmup 3 \
        --variants "$variant" 2>/dev/null
      echo "# load: $(cat /proc/loadavg)"
    done
  done
  /usr/bin/python3 bench/torch_gpt.py --config small --threads "$THREADS" --steps 5 --warmup 2 \
    --variants openmp/default/default --precision bf16 2>/dev/null
  echo "# load after: $(cat /proc/loadavg)"
} | tee "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for cfg in ("small", "124m"):
    def ms(impl, prec):
        return [r["ms_per_step"] for r in rows if r["config"] == cfg and r["impl"] == impl
                and r.get("precision", "fp32") == prec]
    kf, kb, tf = ms("kiln", "fp32"), ms("kiln", "bf16"), ms("pytorch", "fp32")
    if not (kf and kb and tf):
        continue
    per_round = [(f / b, t / f) for f, b, t in zip(kf, kb, tf)]
    print(f"# {cfg}: median ms/step kiln fp32 {statistics.median(kf):.1f}, kiln bf16 "
          f"{statistics.median(kb):.1f}, pytorch fp32 {statistics.median(tf):.1f}; "
          f"bf16/fp32 tokens/s {statistics.median(kf) / statistics.median(kb):.2f}x "
          f"(rounds {', '.join(f'{a:.2f}' for a, _ in per_round)}); kiln fp32/pytorch "
          f"{statistics.median(tf) / statistics.median(kf):.2f}x (rounds "
          f"{', '.join(f'{b:.2f}' for _, b in per_round)})")
PY
rm -f "$out"
