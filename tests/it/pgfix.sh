#!/usr/bin/env bash
# The throwaway PostgreSQL of the "it" tests (the ctest fixture "pg").
#
#   pgfix.sh start DIR PORT   initdb DIR/db if absent, start it listening only on a unix
#                             socket in DIR (no TCP: no port clashes), create database kprof.
#                             Starting a running cluster is fine.
#   pgfix.sh stop DIR PORT    stop it (pg_ctl -m fast, by its pid file) and remove DIR.
#
# Tests connect with "host=DIR port=PORT user=kprof dbname=kprof". No trust anywhere: kprof
# (the superuser that owns the test databases) authenticates by peer, and only the OS user
# that runs the tests (and postgres, when that is root) maps to it; every other user, such as
# the login users of tests/it/test_pg_roles.py, needs its password (scram-sha-256). The socket
# is mode 0770, not world-writable. pg_hba.conf, pg_ident.conf and the socket mode are
# written on every start. As root, initdb and pg_ctl run as the postgres user (initdb refuses
# root). fsync stays on:
# what the tests measure should behave like a real server; --no-sync only skips initdb's
# own flush of the template files, which a crash of the throwaway cluster cannot hurt.
set -euo pipefail

usage() {
    echo "usage: $0 start|stop DIR [PORT]" >&2
    exit 2
}

cmd=${1:-}
dir=${2:-}
port=${3:-5439}
[ -n "$cmd" ] && [ -n "$dir" ] || usage
case "$dir" in
/*) ;;
*) dir="$PWD/$dir" ;;
esac

find_bindir() {
    local d
    if [ -n "${KPROF_PG_BINDIR:-}" ]; then
        echo "$KPROF_PG_BINDIR"
        return
    fi
    # Debian keeps the server binaries out of PATH; take the newest major version.
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ]; then
            echo "$d"
            return
        fi
    done
    d=$(pg_config --bindir 2>/dev/null || true)
    if [ -n "$d" ] && [ -x "$d/initdb" ]; then
        echo "$d"
        return
    fi
    echo "pgfix: no PostgreSQL server binaries found (set KPROF_PG_BINDIR)" >&2
    exit 1
}

bindir=$(find_bindir)

# Runs a command as the cluster's owner: postgres when we are root, else ourselves.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# The cluster's authentication: see the header. Written as the cluster's owner.
write_auth() {
    local me
    me=$(id -un)
    {
        echo "# written by pgfix.sh on every start: no trust"
        echo "local all kprof peer map=kprof"
        echo "local all all scram-sha-256"
    } | as_owner tee "$dir/db/pg_hba.conf" >/dev/null
    {
        echo "kprof $me kprof"
        if [ "$(id -u)" = 0 ]; then
            echo "kprof postgres kprof"
        fi
    } | as_owner tee "$dir/db/pg_ident.conf" >/dev/null
    printf "unix_socket_permissions = 0770\npassword_encryption = 'scram-sha-256'\n" |
        as_owner tee "$dir/db/conf.d-pgfix.conf" >/dev/null
    if ! as_owner grep -q "^include_if_exists = 'conf.d-pgfix.conf'" "$dir/db/postgresql.conf"; then
        echo "include_if_exists = 'conf.d-pgfix.conf'" | as_owner tee -a "$dir/db/postgresql.conf" >/dev/null
    fi
}

start() {
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$dir"
    fi
    if ! as_owner test -w "$dir"; then
        echo "pgfix: $dir is not writable by the cluster owner (are its parents searchable?)" >&2
        exit 1
    fi
    if [ ! -s "$dir/db/PG_VERSION" ]; then
        if ! as_owner "$bindir/initdb" -D "$dir/db" --auth-local=peer \
            --auth-host=scram-sha-256 -U kprof -E UTF8 --locale=C \
            --no-sync >"$dir/initdb.log" 2>&1; then
            cat "$dir/initdb.log" >&2
            exit 1
        fi
    fi
    write_auth
    if as_owner "$bindir/pg_ctl" -D "$dir/db" status >/dev/null 2>&1; then
        echo "pgfix: already running in $dir"
        as_owner "$bindir/pg_ctl" -D "$dir/db" reload >/dev/null
    else
        if ! as_owner "$bindir/pg_ctl" -D "$dir/db" -w -t 120 -l "$dir/postgres.log" \
            -o "-c listen_addresses= -k '$dir' -p $port" start >/dev/null; then
            tail -n 50 "$dir/postgres.log" >&2 || true
            exit 1
        fi
    fi
    if [ "$(as_owner "$bindir/psql" -h "$dir" -p "$port" -U kprof -d postgres -XtAq \
        -c "SELECT count(*) FROM pg_database WHERE datname = 'kprof'")" != 1 ]; then
        as_owner "$bindir/psql" -h "$dir" -p "$port" -U kprof -d postgres -Xq \
            -c "CREATE DATABASE kprof"
    fi
    echo "pgfix: ready host=$dir port=$port user=kprof dbname=kprof"
}

stop() {
    if [ -s "$dir/db/postmaster.pid" ]; then
        # pg_ctl signals the pid in postmaster.pid; nothing here looks processes up by name.
        if ! as_owner "$bindir/pg_ctl" -D "$dir/db" -m fast -w -t 60 stop >/dev/null; then
            if as_owner "$bindir/pg_ctl" -D "$dir/db" status >/dev/null 2>&1; then
                echo "pgfix: could not stop the cluster in $dir" >&2
                exit 1
            fi
        fi
    fi
    rm -rf "$dir"
    echo "pgfix: stopped and removed $dir"
}

case "$cmd" in
start) start ;;
stop) stop ;;
*) usage ;;
esac
