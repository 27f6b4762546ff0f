#!/usr/bin/env bash
# submit_latency.sh - from POST /v1/jobs to every rank started (the job RUNNING) for a script job
# of 1 node x 2 ranks on an idle agent (sandbox on): JOBS jobs whose code the agent's cache holds
# (p50/p99; the issue's target is under 1 s), then COLD jobs each with a fresh COLD_MB MiB archive
# of random bytes (the agent fetches, checks and extracts it first). A real kilnd, agent and
# PostgreSQL (bench/kiln_cluster.sh); the driver is bench/submit_latency.py. Prints the machine,
# date and load for bench/RESULTS.md.
#   BUILD=build bash bench/submit_latency.sh        (as root)
# Environment: JOBS (default 20), COLD (default 3), COLD_MB (default 50), RANKS (default 2).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
for f in "$BUILD/bin/kilnd" "$BUILD/bin/kiln-agent"; do
  [ -x "$f" ] || { echo "submit_latency.sh: $f is missing (make BUILD=$BUILD)"; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "submit_latency.sh: the sandbox needs root"; exit 1; }
source bench/kiln_cluster.sh
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) CPUs), kernel $(uname -r)"
echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "== load before: $(cut -d' ' -f1-3 /proc/loadavg)"
cluster_start "${RANKS:-2}"
/usr/bin/python3 bench/submit_latency.py "$KILN_URL" "$KILN_TOKEN" "$KILN_TLS_CA" || {
  echo "== kilnd log:"; tail -20 "$CL_WORK/kilnd.log"; echo "== agent log:"; tail -20 "$CL_WORK/agent.log"; exit 1; }
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "${SHOW_AGENT_LOG:-}" ] && cat "$CL_WORK/agent.log"
exit 0
