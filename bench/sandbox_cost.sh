#!/usr/bin/env bash
# sandbox_cost.sh - what the ranks' sandbox costs a training step (issue 26), two ways:
#   1. kiln-train: the same small GPT job through the agent's launcher with the sandbox off
#      (kiln-agent --sandbox off) and on, interleaved rounds (bench/sandbox_bench.sh, RANKS ranks);
#   2. PyTorch: bench/torch_step.py (DDP, gloo) as a kiln script job on a real kilnd and agent
#      (sandbox on) against the same script under plain torchrun on the same cores, interleaved
#      rounds (bench/sandbox_cost.py). The issue's target: kiln within 3% of torchrun.
# Prints the machine, date and load for bench/RESULTS.md.
#   BUILD=build bash bench/sandbox_cost.sh        (as root; make BUILD=... all bench first)
# Environment: ROUNDS (default 3), STEPS (default 60), RANKS (default 2), PARTS (default "train torch").
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-60} RANKS=${RANKS:-2}
[ "$(id -u)" = 0 ] || { echo "sandbox_cost.sh: the sandbox needs root"; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "sandbox_cost.sh: /usr/bin/python3 has no torch (python3-torch)"; exit 1; }
for part in ${PARTS:-train torch}; do
  case $part in
    train)
      echo "==== 1. kiln-train, sandbox off and on"
      STARTS=0 BUILD=$BUILD bash bench/sandbox_bench.sh ;;
    torch)
      echo "==== 2. PyTorch DDP: kiln script job (sandbox on) and plain torchrun"
      echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs), kernel $(uname -r)"
      echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
      echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
      ( source bench/kiln_cluster.sh
        cluster_start "$RANKS"
        /usr/bin/python3 bench/sandbox_cost.py "$KILN_URL" "$KILN_TOKEN" "$KILN_TLS_CA" "$CL_DATA" || {
          echo "== agent log:"; tail -20 "$CL_WORK/agent.log"; exit 1; } )
      echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)" ;;
  esac
done
