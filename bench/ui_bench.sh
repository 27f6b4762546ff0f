#!/usr/bin/env bash
# ui_bench.sh - the web UI's load times (issue 16) in Debian's Chromium against a real kilnd:
# the jobs page with 10,000 jobs and a job page with 100,000 points per metric, each beside a
# baseline of the same page with no data, in one run (tests/ui/bench.mjs). Prints the machine,
# date and load so the numbers can go in RESULTS.md.
#   make BUILD=build all && BUILD=build bash bench/ui_bench.sh
# Environment: JOBS (10000), POINTS (100000), RUNNING_POINTS (50000), ROUNDS (5 page loads each).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export KILN_BIN_DIR="$PWD/$BUILD/bin" KILN_ROOT="$PWD"
[ -x "$KILN_BIN_DIR/kilnd" ] || { echo "ui_bench.sh: $KILN_BIN_DIR/kilnd is missing (make BUILD=$BUILD all)"; exit 1; }
source scripts/pg.sh
export KILN_PG_PORT=${KILN_PG_PORT:-$((20000 + RANDOM % 20000))}
pg_start || { echo "ui_bench.sh: could not start PostgreSQL"; exit 1; }
KILN_TEST_TLS_DIR=$(mktemp -d /tmp/kiln-uibench.XXXXXX)
export KILN_TEST_TLS_DIR KILN_TEST_OUT="$KILN_TEST_TLS_DIR/out"
trap 'pg_stop; rm -rf "$KILN_TEST_TLS_DIR"' EXIT
bash scripts/make-certs.sh "$KILN_TEST_TLS_DIR" >/dev/null 2>&1
echo "machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores), $(free -g | awk '/Mem:/ {print $2}') GiB"
echo "chromium: $(/usr/bin/chromium --version 2>/dev/null), node $(node --version)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
node tests/ui/bench.mjs
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
