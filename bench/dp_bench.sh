#!/usr/bin/env bash
# dp_bench.sh - data-parallel overlap on this machine: the small GPT (L=4 H=4 C=256 V=256 T=128)
# with a fixed global batch, 1 rank x 2 threads against 2 ranks x 1 thread (gradient buckets
# all-reduced during backward, and with overlap disabled: all buckets after backward), and the 2
# ranks with overlap each bound to a CPU of its own (KILN_CPUS, what kiln-agent --cpus gives
# the ranks of its 2 slots).
# Throughput is global tokens per second from rank 0's step lines, median over the steps after
# the first 3; configurations are interleaved, REPS rounds, so a load change hits all of them.
# Usage: BUILD=build-dp [DP_BENCH_NICE=-10] bash bench/dp_bench.sh [steps] [reps]
# DP_BENCH_NICE runs every rank at that niceness (root only for negative values): on a machine
# shared with other work it approximates an idle one.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=$PWD/$BUILD/bin/kiln-train
STEPS=${1:-20}
REPS=${2:-3}
G=${DP_BENCH_BATCH:-16}
BUCKET=${DP_BENCH_BUCKET_MB:-1}
NICE=${DP_BENCH_NICE:-0}
WORK=$(mktemp -d /tmp/kiln-dpbench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
[ -x "$BIN" ] || { echo "build $BIN first (make BUILD=$BUILD $BUILD/bin/kiln-train)"; exit 1; }

cat > "$WORK/spec.json" <<EOF
{"name": "dp-bench",
 "model": {"type": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 256, "seq_len": 128, "vocab": "bytes"},
 "data": {"train": "$PWD/data/tinyshakespeare.txt"},
 "hyperparameters": {"lr": 1e-3, "global_batch_size": $G, "max_steps": $STEPS, "warmup_steps": 2,
                     "eval_every": 0, "sample_every": 0, "sample_tokens": 0, "seed": 1},
 "resources": {"device": "cpu", "nodes": 1, "slots_per_node": 2},
 "distribution": {"data_parallel": {"bucket_mb": $BUCKET}},
 "checkpoint": {"every_steps": 0}}
EOF

# median tokens/s of rank 0's step lines after the first 3 steps
median_tps() {
  grep -E '^step [0-9]+/' "$1" | awk -F'|' 'NR > 3 { gsub(/[^0-9.]/, "", $6); print $6 }' |
    sort -n | awk '{ a[NR] = $1 } END { if (NR == 0) print 0; else print a[int((NR + 1) / 2)] }'
}

run_single() { # 1 rank x 2 threads
  KILN_PEAK_GFLOPS=100 nice -n "$NICE" "$BIN" --spec "$WORK/spec.json" --threads 2 > "$WORK/single.log" 2>&1
  median_tps "$WORK/single.log"
}

# the first two CPUs this script may run on, one for each rank when they are bound
source bench/cpus.sh
read -r CPU0 CPU1 _ < <(allowed_cpus)

run_dp() { # $1 = overlap 1|0, $2 = bound 1|0 (default 0); 2 ranks x 1 thread over shm
  local port=$((30000 + RANDOM % 20000)) r tag=$1${2:-0} cpus
  for r in 0 1; do
    cpus=; [ "${2:-0}" = 1 ] && cpus=KILN_CPUS=$([ $r = 0 ] && echo "$CPU0" || echo "$CPU1")
    env $cpus KILN_RANK=$r KILN_WORLD_SIZE=2 KILN_LOCAL_RANK=$r KILN_LOCAL_WORLD_SIZE=2 KILN_MASTER_ADDR=127.0.0.1 \
    KILN_MASTER_PORT=$port KILN_COMM_TIMEOUT_S=120 KILN_THREADS=1 KILN_PEAK_GFLOPS=100 KILN_DP_OVERLAP=$1 \
      nice -n "$NICE" "$BIN" --spec "$WORK/spec.json" > "$WORK/dp$tag.r$r.log" 2>&1 &
  done
  wait
  grep -h '^dp:' "$WORK/dp$tag.r0.log" | tail -1 >&2
  median_tps "$WORK/dp$tag.r0.log"
}

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(nproc) cores, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# niceness $NICE"
echo "# small GPT L=4 H=4 C=256 V=256 T=128, global batch $G, $STEPS steps, bucket_mb $BUCKET"
[ -n "${CPU1:-}" ] || { echo "dp_bench.sh: needs 2 CPUs" >&2; exit 1; }
echo "# bound: rank 0 on CPU $CPU0, rank 1 on CPU $CPU1 (KILN_CPUS)"
printf "%-5s %14s %14s %14s %14s\n" round "1x2 tok/s" "2x1 overlap" "2x1 no-overlap" "2x1 bound"
s_all=""; o_all=""; n_all=""; b_all=""
for i in $(seq 1 "$REPS"); do
  s=$(run_single); o=$(run_dp 1); n=$(run_dp 0); b=$(run_dp 1 1)
  printf "%-5s %14s %14s %14s %14s\n" "$i" "$s" "$o" "$n" "$b"
  s_all="$s_all $s"; o_all="$o_all $o"; n_all="$n_all $n"; b_all="$b_all $b"
done
med() { echo "$@" | tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
S=$(med $s_all); O=$(med $o_all); N=$(med $n_all); B=$(med $b_all)
printf "%-5s %14s %14s %14s %14s\n" median "$S" "$O" "$N" "$B"
awk -v s="$S" -v o="$O" -v n="$N" -v b="$B" 'BEGIN { printf "2 ranks x 1 thread vs 1 rank x 2 threads: %.1f%% with overlap, %.1f%% without, %.1f%% bound with overlap\n", 100 * o / s, 100 * n / s, 100 * b / s }'
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
