#!/usr/bin/env bash
# run.sh - runs every test binary under $BUILD/tests with one throwaway PostgreSQL cluster
# (store, api and end-to-end suites create their own databases in it), then prints one
# closing line: "N passed, N failed". KILN_TESTS names the suites to run (default: all).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export KILN_BIN_DIR="$PWD/$BUILD/bin"
export KILN_ROOT="$PWD"
source scripts/pg.sh
pg_start || { echo "tests: could not start PostgreSQL"; exit 1; }
# One test CA and certificates for every suite (TLS and mutual TLS), removed at the end.
KILN_TEST_TLS_DIR=$(mktemp -d /tmp/kiln-tls.XXXXXX)
export KILN_TEST_TLS_DIR
bash scripts/make-certs.sh "$KILN_TEST_TLS_DIR" || { echo "tests: could not make test certificates"; exit 1; }
# The clients' settings of whoever runs the tests stay out of them: no KILN_URL, KILN_TOKEN,
# KILN_TLS_CA or KILN_PROFILE (kilnd would even take KILN_TLS_CA as its own --tls-ca), and an
# empty config directory instead of the saved logins of `kiln login`.
unset KILN_URL KILN_TOKEN KILN_TLS_CA KILN_PROFILE
XDG_CONFIG_HOME=$(mktemp -d /tmp/kiln-cfg.XXXXXX)
export XDG_CONFIG_HOME
trap 'pg_stop; rm -rf "$KILN_TEST_TLS_DIR" "$XDG_CONFIG_HOME"' EXIT

if [ "${KILN_SAN:-0}" = 1 ]; then
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi

passed=0; failed=0; bad_bins=()
logdir=$(mktemp -d /tmp/kiln-tests.XXXXXX)
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  # KILN_TESTS="test_api test_e2e" runs only those suites (and skips the browser's unless it
  # names "ui"); KILN_TEST_ARGS passes Criterion's flags, such as --filter 'authz/*'.
  if [ -n "${KILN_TESTS:-}" ] && [[ " $KILN_TESTS " != *" $name "* ]]; then continue; fi
  echo "== $name"
  start=$(date +%s)
  "$t" --jobs "${KILN_TEST_JOBS:-2}" ${KILN_TEST_ARGS:-} >"$logdir/$name.log" 2>&1
  rc=$?
  grep -avE '^\s*$' "$logdir/$name.log" | grep -aE '\[(FAIL|----)\]|Synthesis|WARN|ERROR:|runtime error|LeakSanitizer|AddressSanitizer' | tail -n 40
  syn=$(grep -a 'Synthesis' "$logdir/$name.log" | tail -1)
  p=$(echo "$syn" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p'); p=${p:-0}
  f=$(echo "$syn" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p'); f=${f:-0}
  c=$(echo "$syn" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p'); c=${c:-0}
  passed=$((passed + p)); failed=$((failed + f + c))
  if [ $rc -ne 0 ] || [ -z "$syn" ]; then
    bad_bins+=("$name")
    [ -z "$syn" ] && { failed=$((failed + 1)); tail -n 30 "$logdir/$name.log"; }
  fi
  # No token, join token or agent credential in anything a suite printed or a server logged.
  if grep -qaE 'SECRET IN LOG|kiln_(join_|agent_)?[A-Za-z0-9_-]{43}' "$logdir/$name.log"; then
    echo "$name: a secret (API token, join token or agent credential) appears in its output"
    bad_bins+=("$name(secret)"); failed=$((failed + 1))
  fi
  if [ "${KILN_SAN:-0}" = 1 ] && grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$logdir/$name.log"; then
    echo "$name: sanitizer reported errors (log: $logdir/$name.log)"
    bad_bins+=("$name(sanitizer)"); failed=$((failed + 1))
  fi
  echo "   ($(( $(date +%s) - start ))s)"
done

# The web UI in a real browser: node's test runner drives Debian's Chromium (playwright-core from
# ui/'s lockfile) against a real kilnd, agents and this PostgreSQL (tests/ui/). Screenshots go to
# $logdir/ui. Chromium is installed by scripts/install-deps.sh: without it the tests fail.
if [ -f tests/ui/ui.test.mjs ] && { [ -z "${KILN_TESTS:-}" ] || [[ " $KILN_TESTS " == *" ui "* ]]; }; then
  echo "== ui (browser)"
  start=$(date +%s)
  KILN_TEST_OUT="$logdir" node --test --test-reporter=tap tests/ui/ui.test.mjs >"$logdir/ui.log" 2>&1
  rc=$?
  grep -aE '^\s*(not ok|ok) .*# SKIP|^\s*not ok|^# (pass|fail|skipped)' "$logdir/ui.log" | tail -n 20
  p=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$logdir/ui.log" | tail -1)
  f=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$logdir/ui.log" | tail -1)
  # every browser test runs: one that skipped counts as failed
  s=$(sed -n 's/^# skipped \([0-9]*\)$/\1/p' "$logdir/ui.log" | tail -1)
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0} + ${s:-0}))
  [ "${s:-0}" -gt 0 ] && bad_bins+=("ui(skipped)")
  if [ $rc -ne 0 ] || [ -z "$p" ]; then
    bad_bins+=("ui")
    [ -z "$p" ] && { failed=$((failed + 1)); tail -n 30 "$logdir/ui.log"; }
  fi
  if grep -qaE 'kiln_(join_|agent_|login_)?[A-Za-z0-9_-]{43}' "$logdir/ui.log"; then
    echo "ui: a secret appears in its output"; bad_bins+=("ui(secret)"); failed=$((failed + 1))
  fi
  echo "   ($(( $(date +%s) - start ))s; screenshots in $logdir/ui)"
fi

if [ ${#bad_bins[@]} -ne 0 ]; then
  # Repeat what went wrong at the very end, so that a log cut to its last lines (CI keeps only
  # the tail) still says which test failed and why.
  for b in "${bad_bins[@]}"; do
    log="$logdir/${b%(*}.log"
    echo "---- $b: failures ----"
    grep -aE -A8 '\[(FAIL|----)\]|ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|^\s*not ok' "$log" | cut -c1-400 | head -n 80
    echo "---- $b: last lines ----"
    tail -n 15 "$log" | cut -c1-400
  done
  # and last of all, shortest: each failed test with the first line of why
  for b in "${bad_bins[@]}"; do
    log="$logdir/${b%(*}.log"
    echo "---- $b: in short ----"
    grep -aE -A2 '\[FAIL\]|:[0-9]+: Assertion Failed|Timed out|ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|^\s*not ok' "$log" \
      | grep -avE '^\[----\]\s*$|^--$|Synthesis' | cut -c1-300 | head -n 8
  done
  echo "failing: ${bad_bins[*]} (logs in $logdir)"
fi
echo "tests: $passed passed, $failed failed"
[ $failed -eq 0 ] && [ ${#bad_bins[@]} -eq 0 ] && [ $passed -gt 0 ]
