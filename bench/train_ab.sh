#!/usr/bin/env bash
# train_ab.sh - the training loop's step time in two builds of kiln-train, interleaved round by
# round (A, B, A, B, ...) on the small GPT (4 layers, C=256, T=128, batch 8, byte vocabulary, the
# configuration of engine_bench --config small) through kiln-train itself, so a change to the loop,
# the model interface or the setup shows up where engine_bench (which calls the GPT directly) does
# not look. Each run prints its step lines; the summary gives each build's median ms per step over
# steps 6.. of every round, per precision, and the B/A ratio of the medians per round. On a shared
# machine only the interleaved comparison means anything.
#   bash bench/train_ab.sh BIN_A BIN_B [rounds] [threads] [precisions]
#   e.g. bash bench/train_ab.sh /tmp/main/build/bin/kiln-train build/bin/kiln-train 5 2 "fp32 bf16"
set -u
cd "$(dirname "$0")/.."
A=$1
B=$2
ROUNDS=${3:-5}
THREADS=${4:-2}
PRECISIONS=${5:-fp32}
dir=$(mktemp -d /tmp/kiln-train-ab.XXXXXX)
trap 'rm -rf "$dir"' EXIT
for p in $PRECISIONS; do
  mp='"none"'
  [ "$p" = bf16 ] && mp='"bf16"'
  cat >"$dir/$p.json" <<EOF
{"name": "ab", "model": {"type": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 256, "seq_len": 128,
 "vocab": "bytes"}, "data": {"train": "$PWD/data/tinyshakespeare.txt"},
 "hyperparameters": {"lr": 3e-4, "global_batch_size": 8, "max_steps": 40, "eval_every": 0,
 "eval_batches": 1, "sample_tokens": 0}, "resources": {"device": "cpu"},
 "distribution": {"mixed_precision": $mp}, "checkpoint": {"every_steps": 0}}
EOF
done
echo "# $(date -u +%FT%TZ) $(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "# A=$A B=$B rounds=$ROUNDS threads=$THREADS; load before: $(cat /proc/loadavg)"
for ((r = 1; r <= ROUNDS; r++)); do
  for p in $PRECISIONS; do
    for side in A B; do
      bin=$A
      [ $side = B ] && bin=$B
      "$bin" --spec "$dir/$p.json" --threads "$THREADS" --peak-gflops 100 2>&1 |
        sed -n "s/^step \([0-9]*\)\/40 .*| \([0-9.]*\) ms .*/$r $p $side \1 \2/p" >>"$dir/steps"
    done
  done
  echo "# round $r done, load: $(cat /proc/loadavg)"
done
/usr/bin/python3 - "$dir/steps" "$PRECISIONS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for p in sys.argv[2].split():
    med = {}
    for r, prec, side, step, ms in rows:
        if prec == p and int(step) >= 6:
            med.setdefault((int(r), side), []).append(float(ms))
    rounds = sorted({r for r, _ in med})
    a = [statistics.median(med[(r, "A")]) for r in rounds if (r, "A") in med and (r, "B") in med]
    b = [statistics.median(med[(r, "B")]) for r in rounds if (r, "A") in med and (r, "B") in med]
    if not a:
        print(f"# {p}: no complete round")
        continue
    print(f"# {p}: median ms/step A {statistics.median(a):.1f}, B {statistics.median(b):.1f}; "
          f"B/A per round {', '.join(f'{y / x:.3f}' for x, y in zip(a, b))}; "
          f"median of the ratios {statistics.median([y / x for x, y in zip(a, b)]):.3f}")
PY
