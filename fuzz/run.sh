#!/usr/bin/env bash
# run.sh - runs fuzz targets (built by `make fuzz` into $BUILD/fuzz/) for FUZZ_SECONDS each, with
# the committed seed corpus fuzz/corpus/<target>/ and dictionary fuzz/dict/<target>.dict. New
# inputs go to $BUILD/corpus/<target>/ (scratch, never the committed corpus); a crash, leak,
# UBSan report or timeout fails the run, and the input that caused it is saved under
# $BUILD/crashes/<target>/. FUZZ_SECONDS=0 runs the corpora once without fuzzing. Usage:
# fuzz/run.sh [TARGET...] (default: every fuzz/*.c).
# FUZZ_ARGS adds libFuzzer flags (-max_len=65536, ...); fuzz/README.md says more.
set -uo pipefail
cd "$(dirname "$0")/.."

build=${BUILD:-build-fuzz}
secs=${FUZZ_SECONDS:-60}
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*.c; do targets+=("$(basename "$f" .c)"); done
fi

# Leaks are reported per input; UBSan stops at its first report and prints the stack.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=()
for t in "${targets[@]}"; do
  bin="$build/fuzz/$t"
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is not built (make fuzz builds it)" >&2
    failed+=("$t")
    continue
  fi
  scratch="$build/corpus/$t"
  crashes="$build/crashes/$t"
  log="$build/logs/$t.log"
  mkdir -p "$scratch" "$crashes" "$(dirname "$log")" "fuzz/corpus/$t"
  args=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$crashes/")
  if [ "$secs" -gt 0 ]; then
    args+=(-max_total_time="$secs")
  else
    args+=(-runs=0) # the corpora once: a regression check
  fi
  [ -f "fuzz/dict/$t.dict" ] && args+=(-dict="fuzz/dict/$t.dict")
  # shellcheck disable=SC2206
  [ -n "${FUZZ_ARGS:-}" ] && args+=($FUZZ_ARGS)
  if [ "$secs" -gt 0 ]; then echo "fuzz: $t for ${secs}s"; else echo "fuzz: $t over its corpora"; fi
  "$bin" "${args[@]}" "$scratch" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    failed+=("$t")
    echo "fuzz: $t FAILED (exit $rc) after ${execs:-?} executions; the end of $log:" >&2
    tail -n 60 "$log" >&2
    saved=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    if [ -n "$saved" ]; then
      echo "fuzz: the input is saved in $saved; reproduce with: $bin $saved" >&2
    fi
  else
    echo "fuzz: $t ok: ${execs:-?} executions, ${cov:-cov: ?}, new inputs in $scratch"
  fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ok"
