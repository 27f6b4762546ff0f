# kiln_cluster.sh - sourced by bench scripts that need a real cluster on this machine: a
# throwaway PostgreSQL, one kilnd (TLS and tokens on, an artifact store) and one kiln-agent with
# its sandbox as AGENT_SANDBOX says (default on; the sandbox needs root). After cluster_start:
# KILN_URL, KILN_TOKEN, KILN_TLS_CA, CL_WORK (a temporary directory) and CL_DATA (the agent's
# data root) are set; everything stops when the sourcing script exits.
#   source bench/kiln_cluster.sh; cluster_start SLOTS [extra kiln-agent flags...]
# cluster_agent_restart MODE stops the agent (SIGTERM, as a shutdown) and starts it again with
# --sandbox MODE (on|off) and everything else as before; it comes back as the same worker.
# Needs BUILD (the build directory with bin/kilnd and bin/kiln-agent); HEARTBEAT_MS is kilnd's
# --heartbeat-interval-ms (default 1000), AGENT_LOG_LEVEL the agent's log level (default warn),
# KILND_FLAGS more kilnd flags (split on spaces; e.g. "--tune-promoted-restart").
source scripts/pg.sh
CL_PIDS=()
cluster_stop() {
  local p
  for p in "${CL_PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  CL_PIDS=()
  pg_stop
  [ -n "${CL_WORK:-}" ] && rm -rf "$CL_WORK"
}
cl_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cluster_start() {  # cluster_start SLOTS [extra kiln-agent flags...]
  local slots=$1
  shift
  trap cluster_stop EXIT
  export KILN_PG_PORT=${KILN_PG_PORT:-$((20000 + RANDOM % 20000))}
  pg_start || { echo "kiln_cluster.sh: could not start PostgreSQL"; exit 1; }
  CL_WORK=$(mktemp -d /tmp/kiln-bench-cluster.XXXXXX)
  chmod 755 "$CL_WORK"
  CL_DATA="$CL_WORK/data"
  mkdir -p "$CL_DATA" "$CL_WORK/agent"
  chmod 755 "$CL_DATA"
  bash scripts/make-certs.sh "$CL_WORK/tls" >/dev/null || exit 1
  local db http grpc
  db=$(pg_createdb "benchcl_$$") || exit 1
  http=$(cl_port)
  grpc=$(cl_port)
  KILN_LOG_LEVEL=warn "$BUILD/bin/kilnd" --database-url "$db" --http-addr "127.0.0.1:$http" \
    --grpc-addr "127.0.0.1:$grpc" --tls-cert "$CL_WORK/tls/server.pem" --tls-key "$CL_WORK/tls/server.key" \
    --tls-ca "$CL_WORK/tls/ca.pem" --bootstrap-token-file "$CL_WORK/admin.token" \
    --join-token-file "$CL_WORK/tls/join.token" --artifact-dir "$CL_WORK/artifacts" \
    --heartbeat-interval-ms "${HEARTBEAT_MS:-1000}" ${KILND_FLAGS:-} >>"$CL_WORK/kilnd.log" 2>&1 &
  CL_PIDS+=($!)
  export KILN_URL="https://127.0.0.1:$http" KILN_TLS_CA="$CL_WORK/tls/ca.pem"
  local i
  for i in $(seq 100); do
    curl -sf --cacert "$KILN_TLS_CA" "$KILN_URL/readyz" >/dev/null && break
    sleep 0.1
  done
  KILN_TOKEN=$(cat "$CL_WORK/admin.token") || { echo "kilnd did not start:"; cat "$CL_WORK/kilnd.log"; exit 1; }
  export KILN_TOKEN
  CL_AGENT_ARGS=(--server "127.0.0.1:$grpc" --slots "$slots" --slot-type cpu \
    --work-dir "$CL_WORK/agent" --data-root "$CL_DATA" --join-token-file "$CL_WORK/tls/join.token" \
    --tls-ca "$CL_WORK/tls/ca.pem" --tls-cert "$CL_WORK/tls/agent.pem" --tls-key "$CL_WORK/tls/agent.key" --python /usr/bin/python3 \
    "$@")
  cl_agent_start "${AGENT_SANDBOX:-on}"
}
# Starts the agent (CL_AGENT_ARGS, --sandbox $1) and waits until its worker is ALIVE, not draining,
# with every slot free.
cl_agent_start() {
  KILN_LOG_LEVEL=${AGENT_LOG_LEVEL:-warn} "$BUILD/bin/kiln-agent" "${CL_AGENT_ARGS[@]}" --sandbox "$1" \
    >>"$CL_WORK/agent.log" 2>&1 &
  CL_AGENT_PID=$!
  CL_PIDS+=($!)
  local i
  for i in $(seq 300); do
    curl -sf --cacert "$KILN_TLS_CA" -H "Authorization: Bearer $KILN_TOKEN" "$KILN_URL/v1/workers" 2>/dev/null |
      python3 -c 'import json,sys; w=json.load(sys.stdin)["workers"]
sys.exit(not any(x["state"] == "ALIVE" and not x.get("draining") and x["slots_free"] == x["slots"] for x in w))' &&
      return 0
    sleep 0.1
  done
  echo "kiln-agent did not register:"; cat "$CL_WORK/agent.log"; exit 1
}
cluster_agent_restart() {  # cluster_agent_restart on|off
  kill "$CL_AGENT_PID" 2>/dev/null && wait "$CL_AGENT_PID" 2>/dev/null
  local p keep=()
  for p in "${CL_PIDS[@]}"; do [ "$p" != "$CL_AGENT_PID" ] && keep+=("$p"); done
  CL_PIDS=("${keep[@]}")
  cl_agent_start "$1"
}
