#!/usr/bin/env bash
# A throwaway PostgreSQL server for orch's tests and for trying ORCH_DB_URL against a real server.
#
#   deploy/postgres/pg.sh up       install (if missing), initdb, start, create role + DB; print the URL (idempotent)
#   deploy/postgres/pg.sh down     stop the server (its data is kept under $ORCH_PG_STATE)
#   deploy/postgres/pg.sh status   exit 0 iff the server accepts connections
#   deploy/postgres/pg.sh url      print the URL (starts nothing)
#
# Our own cluster (initdb + pg_ctl from /usr/lib/postgresql/*/bin): its own data dir, port and socket dir,
# so the Debian package's cluster (15/main, port 5432) is never started, stopped or changed. As root the
# server runs as the postgres user; as anyone else it runs as that user (then ORCH_PG_STATE must be
# writable and the package installed). Only `up` prints on stdout — the URL — so `URL=$(pg.sh up)` works.
#
# NOT for data you want to keep: fsync, full_page_writes and synchronous_commit are off (a crash of
# the machine may lose or corrupt it; the tests do not need durability, and run faster without it).
set -euo pipefail

STATE=${ORCH_PG_STATE:-/var/lib/orch-pg}
PORT=${ORCH_PG_PORT:-5499}
DB=${ORCH_PG_DB:-orch}
ROLE=${ORCH_PG_USER:-orch}
PASSWORD=${ORCH_PG_PASSWORD:-orchdev}  # listens on 127.0.0.1 only
DATA=$STATE/data
RUN=$STATE/run
LOG=$STATE/log
URL="postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"

say() { printf '[pg.sh] %s\n' "$*" >&2; }
die() { printf '[pg.sh] ERROR: %s\n' "$*" >&2; exit 1; }

bindir() {  # the newest installed server's bin dir, or nothing
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
    [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

as_owner() {  # run a server command as the user who owns the cluster
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

install_packages() {
    [ -n "$(bindir)" ] && return 0
    [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed and only root can install it (apt-get install postgresql)"
    say "installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-cache show postgresql >/dev/null 2>&1 || apt-get update -qq
    # policy-rc.d 101: the package's postinst must not start its own cluster (no systemd here).
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e $policy ]; then
        printf '#!/bin/sh\nexit 101\n' >$policy && chmod +x $policy && created_policy=1
    fi
    mkdir -p "$STATE"
    if ! apt-get install -y -qq --no-install-recommends postgresql >"$STATE/apt.log" 2>&1; then
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends postgresql >"$STATE/apt.log" 2>&1 \
            || { [ $created_policy = 1 ] && rm -f $policy; tail -20 "$STATE/apt.log" >&2; die "apt-get install failed"; }
    fi
    [ $created_policy = 1 ] && rm -f $policy
    [ -n "$(bindir)" ] || die "postgresql installed but no /usr/lib/postgresql/*/bin/initdb"
    say "installed"
}

init_cluster() {
    local bin=$1 me
    mkdir -p "$STATE" "$RUN" "$LOG"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$STATE" "$RUN" "$LOG"
    if [ ! -s "$DATA/PG_VERSION" ]; then
        say "initdb in $DATA"
        me=$(as_owner id -un)
        as_owner "$bin/initdb" -D "$DATA" -U "$me" -E UTF8 --no-locale --auth-local=peer \
            --auth-host=scram-sha-256 >"$LOG/initdb.log" 2>&1 || die "initdb failed (see $LOG/initdb.log)"
        echo "include_if_exists = 'orch.conf'" | as_owner tee -a "$DATA/postgresql.conf" >/dev/null
    fi
    local want
    want=$(cat <<EOF
# Written by deploy/postgres/pg.sh (a throwaway test server: no durability).
port = $PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$RUN'
max_connections = 200
fsync = off
full_page_writes = off
synchronous_commit = off
EOF
)
    if [ "$(cat "$DATA/orch.conf" 2>/dev/null)" != "$want" ]; then
        printf '%s\n' "$want" | as_owner tee "$DATA/orch.conf" >/dev/null
        CONF_CHANGED=1
    fi
}

ready() { "$1/pg_isready" -q -h "$RUN" -p "$PORT"; }

psql_admin() { as_owner "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$RUN" -p "$PORT" -d postgres "$@"; }

cmd_up() {
    local t0=$SECONDS
    install_packages
    BIN=$(bindir)
    CONF_CHANGED=0
    init_cluster "$BIN"
    if [ "$CONF_CHANGED" = 1 ] && as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null
    fi
    if ! as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG/postgres.log" -w -t 60 start >/dev/null \
            || die "the server did not start (see $LOG/postgres.log)"
    fi
    ready "$BIN" || die "the server does not accept connections (see $LOG/postgres.log)"
    # The role may create databases: the tests make a fresh one per test.
    psql_admin -v role="$ROLE" -v pw="$PASSWORD" <<'EOF'
SELECT format('CREATE ROLE %I LOGIN CREATEDB', :'role') WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role')
\gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'role', :'pw')
\gexec
EOF
    psql_admin -v role="$ROLE" -v db="$DB" <<'EOF'
SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'role') WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db')
\gexec
EOF
    say "up on 127.0.0.1:$PORT in $((SECONDS - t0)) s"
    echo "$URL"
}

cmd_down() {
    local bin
    bin=$(bindir) || return 0
    if [ -s "$DATA/PG_VERSION" ] && as_owner "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        as_owner "$bin/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null && say "stopped"
    fi
}

cmd_status() {
    local bin
    bin=$(bindir) || { say "not installed"; return 1; }
    if ready "$bin"; then say "up on 127.0.0.1:$PORT"; else say "DOWN"; return 1; fi
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    url) echo "$URL" ;;
    *) echo "usage: $0 {up|down|status|url}" >&2; exit 2 ;;
esac
