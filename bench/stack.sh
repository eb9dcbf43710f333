# bench/stack.sh: the database and collectord a benchmark runs against, for bench/*/run.sh
# (sourced). With KPROF_BENCH_PG and KPROF_COLLECTOR set, those; otherwise a throwaway
# PostgreSQL (tests/it/pgfix.sh) and kprof-collectord on loopback, stopped by pid at exit.
#
# The caller sets: root (source tree), work (a scratch directory, removed at exit), pgdir,
# pgport, collectord (the binary), bench (its name, for messages), and a die function.
# bench_stack_up sets pg (a conninfo) and addr (collectord's host:port).
# bench_analyzer_up (after it; needs analyzer, the kprof-analyzer binary) starts a throwaway
# kprof-analyzer on pg, stopped by pid at exit, and sets an_addr and an_pid. Its cache is off
# (--cache-bytes 0) and it has no row limit (--max-rows 0), so that every timed call computes;
# the array an_extra (the caller's, may be empty) adds flags.
# bench_secure_up (after bench_stack_up, on a throwaway stack only) makes a CA, a server
# certificate for 127.0.0.1, an agent's client certificate (urn:kprof:agent:bench-node) and an
# agent token with the openssl CLI in $work/tls, starts a second kprof-collectord on pg that
# serves TLS and takes only those credentials (--no-plaintext --no-allow-anonymous), stopped by
# pid at exit, and sets saddr (its address) and the arrays sec_token and sec_mtls (the
# kprof-loadgen flags of the token over TLS, and of the client certificate).
# bench_pg_settings (an array the caller may set before bench_stack_up; throwaway stack only):
# "NAME = VALUE" settings made with ALTER SYSTEM, PostgreSQL then restarted (pg_ctl restart
# keeps pgfix.sh's options) before collectord starts, for settings that need a restart, such as
# track_commit_timestamp.

cpid=
apid=
an_extra=()
spid=
started_pg=0
bench_stack_cleanup() {
    if [ -n "$apid" ]; then
        kill -TERM "$apid" 2>/dev/null || true
        wait "$apid" 2>/dev/null || true
    fi
    if [ -n "$cpid" ]; then
        kill -TERM "$cpid" 2>/dev/null || true
        wait "$cpid" 2>/dev/null || true
    fi
    if [ -n "$spid" ]; then
        kill -TERM "$spid" 2>/dev/null || true
        wait "$spid" 2>/dev/null || true
    fi
    if [ "$started_pg" = 1 ]; then
        "$root/tests/it/pgfix.sh" stop "$pgdir" "$pgport" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap bench_stack_cleanup EXIT

bench_stack_up() {
    if [ -n "${KPROF_BENCH_PG:-}" ]; then
        [ -n "${KPROF_COLLECTOR:-}" ] ||
            die "KPROF_BENCH_PG is set: set KPROF_COLLECTOR too (a collectord writing to that database)"
        pg=$KPROF_BENCH_PG
        addr=$KPROF_COLLECTOR
        return 0
    fi
    [ -z "${KPROF_COLLECTOR:-}" ] ||
        echo "$bench: KPROF_COLLECTOR is set but KPROF_BENCH_PG is not; using throwaway ones" >&2
    [ -x "$collectord" ] || die "$collectord is missing; build it"
    echo "$bench: starting a throwaway PostgreSQL in $pgdir" >&2
    started_pg=1
    "$root/tests/it/pgfix.sh" start "$pgdir" "$pgport" >"$work/pgfix.log" 2>&1 ||
        { cat "$work/pgfix.log" >&2; die "PostgreSQL did not start"; }
    pg="host=$pgdir port=$pgport user=kprof dbname=kprof"
    if [ "${#bench_pg_settings[@]}" -gt 0 ]; then
        bench_pg_restart_with
    fi
    "$collectord" --listen 127.0.0.1:0 --http-listen "" --pg-conninfo "$pg" --plaintext --allow-anonymous \
        --ready-file "$work/ready" --log-level warn >"$work/collectord.log" 2>&1 &
    cpid=$!
    addr=$(bench_wait_ready "$cpid" "$work/ready" "$work/collectord.log" collectord)
}

bench_pg_settings=()
bench_pg_restart_with() {
    local kv bin owner=()
    for kv in "${bench_pg_settings[@]}"; do
        psql "$pg" -qtAX -v ON_ERROR_STOP=1 -c "ALTER SYSTEM SET $kv" >/dev/null ||
            die "PostgreSQL refused ALTER SYSTEM SET $kv"
    done
    # the running postmaster's own pg_ctl (the first line of postmaster.pid is its pid)
    bin=$(dirname "$(readlink "/proc/$(head -1 "$pgdir/db/postmaster.pid")/exe")")
    [ "$(id -u)" = 0 ] && owner=(runuser -u postgres --)
    "${owner[@]}" "$bin/pg_ctl" -D "$pgdir/db" -w -t 120 -m fast restart >>"$work/pgfix.log" 2>&1 ||
        { cat "$work/pgfix.log" >&2; die "PostgreSQL did not restart"; }
}

bench_analyzer_up() {
    [ -x "$analyzer" ] || die "$analyzer is missing; build it"
    "$analyzer" --listen 127.0.0.1:0 --http-listen "" --pg-conninfo "$pg" --cache-bytes 0 --plaintext --allow-anonymous \
        --max-rows 0 --workers 1 --ready-file "$work/analyzer.ready" --log-level warn \
        "${an_extra[@]}" \
        >"$work/analyzer.log" 2>&1 &
    apid=$!
    an_addr=$(bench_wait_ready "$apid" "$work/analyzer.ready" "$work/analyzer.log" kprof-analyzer)
    an_pid=$apid
}

# Waits for a daemon's ready file (pid, ready file, log, name) and prints its gRPC address.
bench_wait_ready() {
    for _ in $(seq 1 300); do
        [ -s "$2" ] && grep -q '^grpc=' "$2" && break
        kill -0 "$1" 2>/dev/null || { cat "$3" >&2; die "$4 exited"; }
        sleep 0.1
    done
    grep -q '^grpc=' "$2" 2>/dev/null || die "$4 did not get ready in 30 s"
    sed -n 's/^grpc=//p' "$2"
}

bench_secure_up() {
    local t=$work/tls ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
    [ "$started_pg" = 1 ] || die "the secured variant needs the throwaway stack (unset KPROF_BENCH_PG)"
    command -v openssl >/dev/null || die "openssl (the CLI) is needed for the secured variant"
    mkdir -m 700 "$t"
    {
        openssl req -x509 "${ec[@]}" -keyout "$t/ca.key" -out "$t/ca.pem" -days 2 \
            -subj /CN=kprof-bench-ca &&
            openssl req "${ec[@]}" -keyout "$t/server.key" -out "$t/server.csr" -subj /CN=localhost &&
            printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$t/server.ext" &&
            openssl x509 -req -in "$t/server.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" \
                -CAcreateserial -out "$t/server.pem" -days 2 -extfile "$t/server.ext" &&
            openssl req "${ec[@]}" -keyout "$t/agent.key" -out "$t/agent.csr" -subj /CN=bench-node &&
            printf 'subjectAltName=URI:urn:kprof:agent:bench-node\n' >"$t/agent.ext" &&
            openssl x509 -req -in "$t/agent.csr" -CA "$t/ca.pem" -CAkey "$t/ca.key" \
                -CAcreateserial -out "$t/agent.pem" -days 2 -extfile "$t/agent.ext" &&
            (umask 077 && openssl rand -hex 24 >"$t/agent.token") &&
            (umask 077 && printf 'agent bench-node %s\n' "$(cat "$t/agent.token")" >"$t/tokens")
    } >"$t/openssl.log" 2>&1 || { cat "$t/openssl.log" >&2; die "openssl could not make the certificates"; }
    chmod 600 "$t"/*.key
    "$collectord" --listen 127.0.0.1:0 --http-listen "" --pg-conninfo "$pg" --no-plaintext \
        --no-allow-anonymous --tls-cert "$t/server.pem" --tls-key "$t/server.key" \
        --auth-tokens "$t/tokens" --tls-client-ca "$t/ca.pem" \
        --ready-file "$work/secure.ready" --log-level warn >"$work/collectord-secure.log" 2>&1 &
    spid=$!
    saddr=$(bench_wait_ready "$spid" "$work/secure.ready" "$work/collectord-secure.log" \
        "the secured collectord")
    sec_token=(--tls-ca "$t/ca.pem" --token-file "$t/agent.token")
    sec_mtls=(--tls-ca "$t/ca.pem" --tls-cert "$t/agent.pem" --tls-key "$t/agent.key")
}
