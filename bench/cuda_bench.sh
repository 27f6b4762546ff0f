#!/usr/bin/env bash
# cuda_bench.sh - kiln's CUDA backend against PyTorch (bf16 autocast + torch.compile) on the same
# GPU in the same run: GPT-2 124M, T=1024, the largest batch that fits each, tokens/s and MFU
# (bench/RESULTS.md, CUDA section). Without a GPU both sides print {"skipped": ...}.
#   BUILD=build bash bench/cuda_bench.sh [steps] [python]
# python: an interpreter with a CUDA build of torch (default python3; Debian's torch is CPU-only).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
STEPS=${1:-20}
PY=${2:-python3}
make --no-print-directory BUILD="$BUILD" "$BUILD/lib/libkiln_cuda.so" "$BUILD/bench/cuda_gpt_bench" >/dev/null || exit 1
echo "# $(date -u +%FT%TZ) $(uname -n)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader | sed 's/^/# gpu: /'
else
  echo "# gpu: none (no nvidia-smi)"
fi
"$BUILD/bench/cuda_gpt_bench" --config 124m --T 1024 --steps "$STEPS" --warmup 5 --precision bf16
"$BUILD/bench/cuda_gpt_bench" --config 124m --T 1024 --steps "$STEPS" --warmup 5 --precision fp32 --matmul tf32
"$BUILD/bench/cuda_gpt_bench" --config 124m --T 1024 --steps "$STEPS" --warmup 5 --precision bf16 --deterministic 0
"$PY" bench/torch_gpt_cuda.py --config 124m --T 1024 --steps "$STEPS" --warmup 5
"$PY" bench/torch_gpt_cuda.py --config 124m --T 1024 --steps "$STEPS" --warmup 5 --no-compile
