#!/usr/bin/env bash
# tune_sim_rules.sh OUT_DIR: bench/tune_sim built once for each ASHA promotion rule below, the rule
# replacing the one in service/tune_search.c's tune_decide, for the replay (bench/tune_sim.py,
# SIM=...); kiln's own rule is "floor". Needs the build (make tests) first. TUNE_SEARCH_REV (a git
# revision): vary that revision's service/tune_search.c instead of the working tree's, e.g. 36c4851^,
# whose draws are not yet rounded to 15 digits, as the replay's curves caches of 2026-11-29/30 were
# trained (today's draws miss every curve there). OUT_DIR/tune_sim-RULE for each RULE (k: the rung
# promoted from, nr: the rungs):
#   floor:  a trial is promoted when its rank at its rung (in its bracket) r < floor(n/eta), n the
#           trials that finished the rung so far (kiln's rule)
#   optuna: r < max(1, floor(n/eta)): also the best of fewer than eta (Optuna's successive halving)
#   ceil:   r < ceil(n/eta) (Ray Tune's AsyncHyperBandScheduler: its (1 - 1/eta) quantile cutoff)
#   topceil: ceil(n/eta) for the promotion into the top rung (k == nr - 2), floor(n/eta) below it
#   endsceil: ceil(n/eta) for the promotions out of the first rung (k == 0; for one bracket) and
#           into the top rung, floor(n/eta) between
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/tune_sim_rules.sh OUT_DIR}
BUILD=${BUILD:-build}
mkdir -p "$out"
CFLAGS=$(make -s -p -n BUILD="$BUILD" 2>/dev/null | sed -n 's/^CFLAGS := //p' | head -1)
LDLIBS=$(make -s -p -n BUILD="$BUILD" 2>/dev/null | sed -n 's/^LDLIBS := //p' | head -1)
LIBS=$(make -s -p -n BUILD="$BUILD" 2>/dev/null | sed -n 's/^ALL_LIBS := //p' | head -1)
src=service/tune_search.c
if [ -n "${TUNE_SEARCH_REV:-}" ]; then
  src=$out/tune_search-base.c
  git show "$TUNE_SEARCH_REV:service/tune_search.c" > "$src"
fi
grep -q 'r < n / t->reduction_factor' "$src" || { echo "tune_sim_rules.sh: the rule's line is not in $src" >&2; exit 1; }
declare -A Q=([floor]='(n / t->reduction_factor)' [optuna]='(n < t->reduction_factor ? 1 : n / t->reduction_factor)'
              [ceil]='((n + t->reduction_factor - 1) / t->reduction_factor)'
              [topceil]='(k == nr - 2 ? (n + t->reduction_factor - 1) / t->reduction_factor : n / t->reduction_factor)'
              [endsceil]='(k == 0 || k == nr - 2 ? (n + t->reduction_factor - 1) / t->reduction_factor : n / t->reduction_factor)')
gcc $CFLAGS -c bench/tune_sim.c -o "$out/tune_sim.o"
for v in floor optuna ceil topceil endsceil; do
  sed "s#r < n / t->reduction_factor#r < ${Q[$v]}#" "$src" > "$out/tune_search-$v.c"
  gcc $CFLAGS -I. -c "$out/tune_search-$v.c" -o "$out/tune_search-$v.o"
  # the variant's object first: the archive's tune_search.o is then never pulled in
  gcc -o "$out/tune_sim-$v" "$out/tune_sim.o" "$out/tune_search-$v.o" $LIBS $LDLIBS -lssl -lcrypto
  echo "$out/tune_sim-$v"
done
