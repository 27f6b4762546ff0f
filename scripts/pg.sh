# pg.sh - start and stop a throwaway PostgreSQL cluster on a unix socket in a temporary directory.
# Source it, then: pg_start (exports KILN_PG_DIR, KILN_PG_HOST, KILN_PG_PORT, KILN_PG_URL);
# pg_stop removes the cluster; pg_crash and pg_resume stop it as a crash would and start it again.
# PostgreSQL refuses to run as root, so as root it runs as `postgres`.

pg_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    if [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  done
  echo "pg.sh: initdb not found (apt-get install postgresql)" >&2
  return 1
}

pg_as() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_start() {
  local bin; bin=$(pg_bindir) || return 1
  KILN_PG_DIR=$(mktemp -d /tmp/kpg.XXXXXX)
  chmod 755 "$KILN_PG_DIR"
  if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$KILN_PG_DIR"; fi
  KILN_PG_PORT=${KILN_PG_PORT:-5432}
  pg_as "$bin/initdb" --no-sync -A trust -U postgres -D "$KILN_PG_DIR/data" >"$KILN_PG_DIR/initdb.log" 2>&1 || {
    cat "$KILN_PG_DIR/initdb.log" >&2; return 1; }
  pg_resume || return 1
  export KILN_PG_DIR KILN_PG_PORT
  export KILN_PG_HOST="$KILN_PG_DIR"
  export KILN_PG_URL="host=$KILN_PG_DIR port=$KILN_PG_PORT user=postgres dbname=postgres"
}

pg_resume() {  # starts the cluster of KILN_PG_DIR again (after pg_crash)
  local bin; bin=$(pg_bindir) || return 1
  pg_as "$bin/pg_ctl" -D "$KILN_PG_DIR/data" -l "$KILN_PG_DIR/server.log" -w \
    -o "-k $KILN_PG_DIR -c listen_addresses='' -p ${KILN_PG_PORT:-5432} -c max_connections=200 -c shared_buffers=256MB ${KILN_PG_OPTS:-}" start >/dev/null || {
    cat "$KILN_PG_DIR/server.log" >&2; return 1; }
}

pg_crash() {  # stops the cluster of KILN_PG_DIR as a crash would (no shutdown checkpoint); keeps its data
  local bin; bin=$(pg_bindir) || return 1
  pg_as "$bin/pg_ctl" -D "$KILN_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1
}

pg_createdb() {  # pg_createdb NAME -> prints a connection string for a fresh database
  local bin; bin=$(pg_bindir) || return 1
  "$bin/psql" -q -h "$KILN_PG_HOST" -p "$KILN_PG_PORT" -U postgres -d postgres -c "CREATE DATABASE \"$1\"" >/dev/null || return 1
  echo "host=$KILN_PG_HOST port=$KILN_PG_PORT user=postgres dbname=$1"
}

pg_stop() {
  [ -n "${KILN_PG_DIR:-}" ] || return 0
  local bin; bin=$(pg_bindir) || return 1
  pg_as "$bin/pg_ctl" -D "$KILN_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$KILN_PG_DIR"
  unset KILN_PG_DIR
}
