#!/usr/bin/env bash
# dp_netns.sh - data parallelism across hosts, emulated on one machine: 2 ranks of the small GPT
# (bench/dp_bench.sh's configuration: L=4 H=4 C=256 V=256 T=128, 16 sequences per step,
# bucket_mb 1, 1 thread per rank) in two network namespaces joined by a veth pair, over
# libfabric tcp;ofi_rxm (the provider kiln uses between hosts), the link shaped with tc tbf to
# each rate of DP_NETNS_RATES. Each emulated host has a CPU of its own: every process in namespace
# A runs bound to the first CPU, every process in B to the second (KILN_CPUS, what kiln-agent
# --cpus gives a slot's ranks), and the reference process, one host with both, to the two. For every rate, round by round (interleaved, so a load change on
# the shared machine hits every configuration): one 2-thread process of the same configuration,
# two independent 1-thread processes with a rank's half of the batch each, started together (what
# the 2 ranks would reach if communication were free: the `nocomm` columns), the 2 ranks with
# gradient overlap on, with it off, with ZeRO-1 (shard_optimizer_state: the reduce-scatter during
# backward, the parameter all-gather during the next forward, so the link carries half the bytes
# in each), with the gradients sent as bf16 (gradient_dtype "bf16", overlap on: half the bytes),
# and the same gradient all-reduced alone
# (bench/comm_bench --buckets, the buckets dp plans for this model) to see the collective's rate
# against the shaped link's. Throughput is global tokens/s from rank 0's step lines, median over
# the steps after the first 3; the gradient wait is dp's "s waiting for gradients" over the
# steps. Not part of `make test`: it needs root (ip netns, tc) and takes minutes.
#
# Usage (root): BUILD=build bash bench/dp_netns.sh [rounds] [steps]
#   DP_NETNS_RATES="10gbit 1gbit 200mbit"  link rates (tc syntax: kbit, mbit, gbit)
#   DP_NETNS_NICE=0        niceness of every process it starts; with autogroup scheduling
#                          (/proc/sys/kernel/sched_autogroup_enabled) also of this session's
#                          autogroup, restored on exit: other sessions' work (builds, tests) then
#                          takes less of the cores, which approximates a quiet machine
#   DP_NETNS_KEEP_LOGS=1   keep the runs' logs (the directory is printed)
#   DP_NETNS_BASE=DIR      also run the ranks and the all-reduce with DIR/bin/kiln-train and
#                          DIR/bench/comm_bench (another build, e.g. of an older commit), in the
#                          same rounds, for a before/after comparison (its all-reduce alone moves
#                          this build's bucket plan; a build older than gradient_dtype runs its
#                          bf16 column with fp32 gradients)
#   DP_NETNS_BATCH=16 DP_NETNS_BUCKET_MB=1
#   DP_NETNS_BIND=0        no CPU binding: the kernel places every process on either CPU, so one
#                          emulated host's threads also run on the other's CPU
#   DP_NETNS_UNBOUND=1     also run the 2 ranks unbound in every round (the on_unbound columns)
#   DP_NETNS_DEFAULTS=1    also run the 2 ranks at default settings in every round: the spec
#                          without bucket_mb (dp chooses it from the model), overlap on, fp32
#                          and bf16 gradients (the def and defbf16 columns), against the tuned
#                          bucket_mb of the on and bf16 columns; with DP_NETNS_BASE, the base
#                          build's defaults (an older build's fixed 25 MiB) in the same rounds
# The tbf of each direction: `rate R burst max(64 KiB, R x 1 ms) latency 8ms` (the queue holds
# 8 ms at the rate): packets leave at the rate with no more than a millisecond's burst, as from
# a real NIC, and a TCP stream keeps ~95% of the rate in both directions at once. Namespaces,
# veth and qdiscs are removed on exit, also after a failure or Ctrl-C.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ROUNDS=${1:-3}
STEPS=${2:-20}
RATES=${DP_NETNS_RATES:-10gbit 1gbit 200mbit}
BIND=${DP_NETNS_BIND:-1}
UNBOUND=${DP_NETNS_UNBOUND:-0}
DEFAULTS=${DP_NETNS_DEFAULTS:-0}
DP_NETNS_BASE=${DP_NETNS_BASE:-}
NICE=${DP_NETNS_NICE:-0}
G=${DP_NETNS_BATCH:-16}
BUCKET=${DP_NETNS_BUCKET_MB:-1}
TRAIN=$PWD/$BUILD/bin/kiln-train
COMM=$PWD/$BUILD/bench/comm_bench

[ "$(id -u)" = 0 ] || { echo "dp_netns.sh: needs root (ip netns, tc)" >&2; exit 1; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "dp_netns.sh: needs ip and tc (iproute2)" >&2; exit 1; }
make --no-print-directory BUILD="$BUILD" "$BUILD/bin/kiln-train" "$BUILD/bench/comm_bench" >/dev/null || exit 1

ID=$$
NSA=kiln-dpa-$ID NSB=kiln-dpb-$ID
VA=kdpa$ID VB=kdpb$ID
ADDRA=10.231.$((ID % 250)).1 ADDRB=10.231.$((ID % 250)).2
WORK=$(mktemp -d /tmp/kiln-dpnetns.XXXXXX)
PIDS=()

AUTOGROUP_WAS=
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  # deleting a namespace deletes its end of the veth pair (and so both ends) and their qdiscs
  ip netns del "$NSA" 2>/dev/null
  ip netns del "$NSB" 2>/dev/null
  ip link del "$VA" 2>/dev/null
  [ -n "$AUTOGROUP_WAS" ] && echo "$AUTOGROUP_WAS" > /proc/$$/autogroup 2>/dev/null
  if [ -n "${KEEP:-}" ]; then echo "# logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
KEEP=${DP_NETNS_KEEP_LOGS:-}
trap 'exit 130' INT TERM HUP

if [ "$NICE" != 0 ] && [ -w /proc/$$/autogroup ]; then
  AUTOGROUP_WAS=$(sed -n 's/.* nice \(-\{0,1\}[0-9]*\)$/\1/p' /proc/$$/autogroup)
  echo "$NICE" > /proc/$$/autogroup || AUTOGROUP_WAS=
fi

# the first two CPUs this script may run on: host A's, host B's
source bench/cpus.sh
read -r CPU_A CPU_B _ < <(allowed_cpus)
[ -n "$CPU_B" ] || { [ "$BIND" = 0 ] || { echo "dp_netns.sh: needs 2 CPUs to give each emulated host its own (DP_NETNS_BIND=0 runs unbound)" >&2; exit 1; }; }
cpus_of() { # $1 = a, b or both: KILN_CPUS=... for that host's processes (nothing unbound)
  [ "$BIND" = 1 ] || return 0
  case $1 in a) echo "KILN_CPUS=$CPU_A" ;; b) echo "KILN_CPUS=$CPU_B" ;; both) echo "KILN_CPUS=$CPU_A,$CPU_B" ;; esac
}

ip netns add "$NSA" && ip netns add "$NSB" &&
  ip link add "$VA" netns "$NSA" type veth peer name "$VB" netns "$NSB" &&
  ip -n "$NSA" addr add "$ADDRA/30" dev "$VA" && ip -n "$NSB" addr add "$ADDRB/30" dev "$VB" &&
  ip -n "$NSA" link set "$VA" up && ip -n "$NSB" link set "$VB" up &&
  ip -n "$NSA" link set lo up && ip -n "$NSB" link set lo up ||
  { echo "dp_netns.sh: could not set up the namespaces" >&2; exit 1; }

# bytes per second of a tc rate
rate_bps() {
  awk -v r="$1" 'BEGIN { n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u);
    m = u == "gbit" ? 1e9 : u == "mbit" ? 1e6 : u == "kbit" ? 1e3 : u == "bit" ? 1 : -1;
    if (m < 0) exit 1; printf "%.0f", n * m / 8 }'
}

shape() { # $1 = rate: the same tbf on both ends
  local bps burst
  bps=$(rate_bps "$1") || { echo "dp_netns.sh: bad rate \"$1\"" >&2; exit 1; }
  burst=$((bps / 1000 > 65536 ? bps / 1000 : 65536))
  TBF="rate $1 burst $burst latency 8ms"
  tc -n "$NSA" qdisc replace dev "$VA" root tbf $TBF && tc -n "$NSB" qdisc replace dev "$VB" root tbf $TBF ||
    { echo "dp_netns.sh: could not shape the link with tbf $TBF" >&2; exit 1; }
}

cat > "$WORK/spec.json" <<EOF
{"name": "dp-netns",
 "model": {"type": "gpt", "n_layer": 4, "n_head": 4, "n_embd": 256, "seq_len": 128, "vocab": "bytes"},
 "data": {"train": "$PWD/data/tinyshakespeare.txt"},
 "hyperparameters": {"lr": 1e-3, "global_batch_size": $G, "max_steps": $STEPS, "warmup_steps": 2,
                     "eval_every": 0, "sample_every": 0, "sample_tokens": 0, "seed": 1},
 "resources": {"device": "cpu", "nodes": 2, "slots_per_node": 1},
 "distribution": {"data_parallel": {"bucket_mb": $BUCKET}},
 "checkpoint": {"every_steps": 0}}
EOF
# a rank's half of the batch in a process of its own (the nocomm columns)
sed -e "s/\"global_batch_size\": $G/\"global_batch_size\": $((G / 2))/" -e 's/"nodes": 2/"nodes": 1/' \
  "$WORK/spec.json" > "$WORK/half.json"
grep -q "\"global_batch_size\": $((G / 2))," "$WORK/half.json" && grep -q '"nodes": 1,' "$WORK/half.json" ||
  { echo "dp_netns.sh: could not derive the half-batch spec for the nocomm columns" >&2; exit 1; }
# the same job at default settings: no bucket_mb (the def columns)
sed -e "s/\"data_parallel\": {\"bucket_mb\": $BUCKET}/\"data_parallel\": {}/" "$WORK/spec.json" > "$WORK/default.json"
grep -q '"data_parallel": {}' "$WORK/default.json" ||
  { echo "dp_netns.sh: could not derive the default spec for the def columns" >&2; exit 1; }

# The gradient buckets dp plans for this model (engine/dp/dp.c plan_buckets, ranges of
# engine/gpt.c eng_gpt_block_ranges): backward order head (ln_f), then per layer from the last
# the MLP half (fcproj, fc, ln2 weights and biases, in that order) and the attention half
# (attproj, qkv, ln1), then the embeddings (wte, tied with the head, and wpe); a bucket closes
# after a range once it holds bucket_mb MiB. Checked against the count dp prints.
BUCKETS=$(awk -v L=4 -v C=256 -v V=256 -v T=128 -v mb="$BUCKET" '
  function add(n) { cur += n; if (cur >= cap) { out = out "," cur; cur = 0 } }
  BEGIN {
  cap = mb * 1048576 / 4; cur = 0; out = ""
  add(C); add(C)
  for (l = L - 1; l >= 0; l--) {
    add(4 * C * C); add(C); add(4 * C * C); add(4 * C); add(C); add(C)
    add(C * C); add(C); add(3 * C * C); add(3 * C); add(C); add(C)
  }
  add(V * C); add(T * C); if (cur > 0) out = out "," cur; print substr(out, 2) }')
NBUCKETS=$(echo "$BUCKETS" | tr ',' '\n' | wc -l)
GRAD_BYTES=$(echo "$BUCKETS" | tr ',' '\n' | awk '{ s += $1 } END { print s * 4 }')

# median tokens/s of rank 0's step lines after the first 3 steps
median_tps() {
  grep -E '^step [0-9]+/' "$1" | awk -F'|' 'NR > 3 { gsub(/[^0-9.]/, "", $6); print $6 }' |
    sort -n | awk '{ a[NR] = $1 } END { if (NR == 0) print 0; else print a[int((NR + 1) / 2)] }'
}

# Every run sets globals (no $(...) subshells, so a failure stops the script and the cleanup
# sees the processes it must stop).
run_single() { # $1 = log; sets TPS
  env $(cpus_of both) KILN_PEAK_GFLOPS=100 nice -n "$NICE" "$TRAIN" --spec "$WORK/spec.json" --threads 2 > "$1" 2>&1 &
  PIDS=($!)
  wait "${PIDS[@]}" || { echo "dp_netns.sh: the 1-process run failed: $(tail -n 3 "$1")" >&2; exit 1; }
  PIDS=()
  TPS=$(median_tps "$1")
}

run_nocomm() { # $1 = tag; sets TPS (the two processes' tokens/s added)
  local r failed=0
  PIDS=()
  for r in 0 1; do
    env $(cpus_of "$([ $r = 0 ] && echo a || echo b)") KILN_PEAK_GFLOPS=100 nice -n "$NICE" "$TRAIN" \
      --spec "$WORK/half.json" --threads 1 > "$WORK/$1.p$r.log" 2>&1 &
    PIDS+=($!)
  done
  for r in "${PIDS[@]}"; do wait "$r" || failed=1; done
  PIDS=()
  [ $failed = 0 ] || { echo "dp_netns.sh: the nocomm pair failed: $(tail -n 3 "$WORK/$1.p0.log")" >&2; exit 1; }
  TPS=$(awk -v a="$(median_tps "$WORK/$1.p0.log")" -v b="$(median_tps "$WORK/$1.p1.log")" 'BEGIN { print a + b }')
}

PAIR_BIND=1
run_pair() { # $1 = tag, rest: env assignments and command; rank 0 in A, rank 1 in B (bound to
  # their host's CPU unless PAIR_BIND=0)
  local tag=$1 r ns host port=$((30000 + RANDOM % 20000)) failed=0 cpus
  shift
  PIDS=()
  for r in 1 0; do
    ns=$NSB host=b; [ $r = 0 ] && ns=$NSA host=a
    cpus=; [ "$PAIR_BIND" = 1 ] && cpus=$(cpus_of $host)
    ip netns exec "$ns" env $cpus KILN_RANK=$r KILN_WORLD_SIZE=2 KILN_LOCAL_RANK=0 KILN_MASTER_ADDR="$ADDRA" \
      KILN_MASTER_PORT=$port KILN_COMM_PROVIDER=tcp KILN_COMM_TIMEOUT_S=120 \
      nice -n "$NICE" env "$@" > "$WORK/$tag.r$r.log" 2>&1 &
    PIDS+=($!)
  done
  for r in "${PIDS[@]}"; do wait "$r" || failed=1; done
  PIDS=()
  [ $failed = 0 ] || { echo "dp_netns.sh: $tag failed: $(tail -n 3 "$WORK/$tag.r0.log" "$WORK/$tag.r1.log")" >&2; exit 1; }
}

run_dp() { # $1 = overlap 1|0, $2 = tag, $3 = ZeRO-1 1|0 (default 0), $4 = gradient dtype (default
  # fp32), $5 = spec (default the tuned one); sets TPS and WAIT (s per step)
  local spec=${5:-$WORK/spec.json}
  run_pair "$2" KILN_THREADS=1 KILN_PEAK_GFLOPS=100 KILN_DP_OVERLAP="$1" KILN_DP_ZERO="${3:-0}" \
    KILN_DP_GRADIENT_DTYPE="${4:-fp32}" "$TRAIN" --spec "$spec"
  local log=$WORK/$2.r0.log dpline
  dpline=$(grep -m1 '^dp: rank 0/2' "$log")
  # another build may plan other buckets (its all-reduce alone moves this build's); at default
  # settings this build says what it chose
  if [ "$TRAIN" = "$PWD/$BUILD/bin/kiln-train" ]; then
    if [ "$spec" = "$WORK/spec.json" ] && [[ "$dpline" != *" $NBUCKETS gradient buckets"* ]]; then
      echo "dp_netns.sh: dp planned other buckets than this script assumes ($NBUCKETS): $dpline" >&2; exit 1
    fi
    if [ "$spec" != "$WORK/spec.json" ] && ! grep -q '^dp: bucket_mb .* chosen from the model' "$log"; then
      echo "dp_netns.sh: dp did not say which bucket size it chose: $dpline" >&2; exit 1
    fi
    [ "$spec" != "$WORK/spec.json" ] && DEFPLAN="$(grep -m1 '^dp: bucket_mb' "$log" | cut -d: -f2 | cut -d' ' -f3) MiB, ${dpline#*: }"
  fi
  TPS=$(median_tps "$log")
  WAIT=$(grep -m1 's waiting for gradients' "$log" | sed -E 's/.* ([0-9.]+) s waiting for gradients.*/\1/' |
    awk -v n="$STEPS" '{ printf "%.4f", $1 / n }')
}

run_comm() { # $1 = tag; sets AR (median all-reduce rate in MB/s)
  run_pair "$1" "$COMM" --buckets "$BUCKETS" 10
  AR=$(awk '/^buckets_median/ { print $4 }' "$WORK/$1.r0.log")
}

med() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print 0 }'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f%%", (b > 0 ? 100 * a / b : 0) }'; }

row() { # round rate build 1x2 on on_wait off off_wait ar link zero nocomm bf16 unbound def defbf16
  printf "%-6s %-8s %-5s %9s %12s %8s %9s %7s %10s %9s %7s %10s %9s %7s %10s %7s %9s %6s" "$1" "$2" "$3" "$4" \
    "${12}" "$(pct "${12}" "$4")" "$5" "$(pct "$5" "$4")" "$6" "$7" "$(pct "$7" "$4")" "$8" "${11}" \
    "$(pct "${11}" "$4")" "${13}" "$(pct "${13}" "$4")" "$9" "$(pct "$9" "$(awk -v l="${10}" 'BEGIN { print l / 1e6 }')")"
  [ "$UNBOUND" = 1 ] && printf " %10s %7s" "${14}" "$(pct "${14}" "$4")"
  [ "$DEFAULTS" = 1 ] && printf " %10s %7s %13s %9s" "${15}" "$(pct "${15}" "$4")" "${16}" "$(pct "${16}" "$4")"
  echo
}

BUILDS=this
if [ -n "${DP_NETNS_BASE:-}" ]; then
  [ -x "$DP_NETNS_BASE/bin/kiln-train" ] && [ -x "$DP_NETNS_BASE/bench/comm_bench" ] ||
    { echo "dp_netns.sh: DP_NETNS_BASE=$DP_NETNS_BASE has no bin/kiln-train and bench/comm_bench" >&2; exit 1; }
  BUILDS="this base"
fi
use_build() {
  if [ "$1" = base ]; then TRAIN=$DP_NETNS_BASE/bin/kiln-train COMM=$DP_NETNS_BASE/bench/comm_bench
  else TRAIN=$PWD/$BUILD/bin/kiln-train COMM=$PWD/$BUILD/bench/comm_bench; fi
}

echo "# $(date -u +%FT%TZ) $(uname -n): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset: OpenBLAS picks its kernels for this CPU)}"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); niceness $NICE$([ -n "$AUTOGROUP_WAS" ] && echo " (and this session's autogroup)")"
echo "# small GPT L=4 H=4 C=256 V=256 T=128, global batch $G, $STEPS steps, bucket_mb $BUCKET ($NBUCKETS buckets, $GRAD_BYTES bytes)"
echo "# 2 ranks x 1 thread in namespaces $NSA/$NSB over tcp;ofi_rxm; 1 process x 2 threads for reference"
if [ "$BIND" = 1 ]; then echo "# CPUs: namespace A's processes on CPU $CPU_A, B's on CPU $CPU_B, the reference on both (KILN_CPUS)"
else echo "# CPUs: unbound (DP_NETNS_BIND=0)"; fi
[ -n "${DP_NETNS_BASE:-}" ] && echo "# build \"base\": $DP_NETNS_BASE (ranks and all-reduce only; the 1x2 reference is this build's)"
echo "# nocomm: 2 independent 1-thread processes, half the batch each (no communication; this build);"
echo "# on/off: gradient overlap; wait_s: rank 0's wait for gradients per step; zero: ZeRO-1 (overlap on);"
echo "# bf16: the gradients sent as bf16 (gradient_dtype \"bf16\", overlap on);"
echo "# ar: the gradient's buckets all-reduced alone$([ "$UNBOUND" = 1 ] && echo "; unb: overlap on, the ranks unbound")"
[ "$DEFAULTS" = 1 ] && echo "# def/defbf16: default settings (no bucket_mb: chosen from the model), fp32 / bf16 gradients, overlap on"
printf "%-6s %-8s %-5s %9s %12s %8s %9s %7s %10s %9s %7s %10s %9s %7s %10s %7s %9s %6s" round rate build \
  "1x2_tok/s" "nocomm_tok/s" "nocomm_%" "on_tok/s" "on_%" "on_wait_s" "off_tok/s" "off_%" "off_wait_s" "zero_tok/s" \
  "zero_%" "bf16_tok/s" "bf16_%" "ar_MB/s" "ar_%"
[ "$UNBOUND" = 1 ] && printf " %10s %7s" "unb_tok/s" "unb_%"
[ "$DEFAULTS" = 1 ] && printf " %10s %7s %13s %9s" "def_tok/s" "def_%" "defbf16_tok/s" "defbf16_%"
echo
declare -A S P O OW N NW A Z H U D DH
DEFPLAN=
for i in $(seq 1 "$ROUNDS"); do
  for rate in $RATES; do
    shape "$rate"
    link=$(rate_bps "$rate")
    use_build this
    run_single "$WORK/single.$i.$rate.log"; s=$TPS
    run_nocomm "nocomm.$i.$rate"; p=$TPS
    S[$rate]="${S[$rate]:-} $s"; P[$rate]="${P[$rate]:-} $p"
    for b in $BUILDS; do
      use_build "$b"
      k="$rate $b"
      run_dp 1 "on.$i.$rate.$b"; o=$TPS ow=$WAIT
      run_dp 0 "off.$i.$rate.$b"; n=$TPS nw=$WAIT
      run_dp 1 "zero.$i.$rate.$b" 1; z=$TPS
      run_dp 1 "bf16.$i.$rate.$b" 0 bf16; h=$TPS
      run_comm "comm.$i.$rate.$b"; a=$AR
      u=
      if [ "$UNBOUND" = 1 ]; then PAIR_BIND=0; run_dp 1 "unb.$i.$rate.$b"; u=$TPS; PAIR_BIND=1; fi
      df= dh=
      if [ "$DEFAULTS" = 1 ]; then
        run_dp 1 "def.$i.$rate.$b" 0 fp32 "$WORK/default.json"; df=$TPS
        run_dp 1 "defbf16.$i.$rate.$b" 0 bf16 "$WORK/default.json"; dh=$TPS
      fi
      row "$i" "$rate" "$b" "$s" "$o" "$ow" "$n" "$nw" "$a" "$link" "$z" "$p" "$h" "$u" "$df" "$dh"
      O[$k]="${O[$k]:-} $o"; OW[$k]="${OW[$k]:-} $ow"; N[$k]="${N[$k]:-} $n"; NW[$k]="${NW[$k]:-} $nw"
      A[$k]="${A[$k]:-} $a"; Z[$k]="${Z[$k]:-} $z"; H[$k]="${H[$k]:-} $h"; U[$k]="${U[$k]:-} $u"
      D[$k]="${D[$k]:-} $df"; DH[$k]="${DH[$k]:-} $dh"
    done
  done
done
echo "# medians over the rounds (% of the 1x2 median of the same rate's rounds; ar_% of the link rate)"
for rate in $RATES; do
  for b in $BUILDS; do
    k="$rate $b"
    row median "$rate" "$b" "$(echo "${S[$rate]}" | med)" "$(echo "${O[$k]}" | med)" "$(echo "${OW[$k]}" | med)" \
      "$(echo "${N[$k]}" | med)" "$(echo "${NW[$k]}" | med)" "$(echo "${A[$k]}" | med)" "$(rate_bps "$rate")" \
      "$(echo "${Z[$k]}" | med)" "$(echo "${P[$rate]}" | med)" "$(echo "${H[$k]}" | med)" "$(echo "${U[$k]:-}" | med)" \
      "$(echo "${D[$k]:-}" | med)" "$(echo "${DH[$k]:-}" | med)"
  done
done
echo "# tbf per direction: rate R burst max(65536, R/1000 bytes) latency 8ms; link MB/s = R/8/1e6"
[ -n "$DEFPLAN" ] && echo "# at defaults this build chose bucket_mb $DEFPLAN"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
