# bench/stack.sh: the database and collectord a benchmark runs against, for bench/*/run.sh
# (sourced). With KPROF_BENCH_PG and KPROF_COLLECTOR set, those; otherwise a throwaway
# PostgreSQL (tests/it/pgfix.sh) and kprof-collectord on loopback, stopped by pid at exit.
#
# The caller sets: root (source tree), work (a scratch directory, removed at exit), pgdir,
# pgport, collectord (the binary), bench (its name, for messages), and a die function.
# bench_stack_up sets pg (a conninfo) and addr (collectord's host:port).
# bench_analyzer_up (after it; needs analyzer, the kprof-analyzer binary) starts a throwaway
# kprof-analyzer on pg, stopped by pid at exit, and sets an_addr and an_pid. Its cache is off
# (--cache-bytes 0) and it has no row limit (--max-rows 0), so that every timed call computes.

cpid=
apid=
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
    "$collectord" --listen 127.0.0.1:0 --http-listen "" --pg-conninfo "$pg" --plaintext --allow-anonymous \
        --ready-file "$work/ready" --log-level warn >"$work/collectord.log" 2>&1 &
    cpid=$!
    for _ in $(seq 1 300); do
        [ -s "$work/ready" ] && grep -q '^grpc=' "$work/ready" && break
        kill -0 "$cpid" 2>/dev/null || { cat "$work/collectord.log" >&2; die "collectord exited"; }
        sleep 0.1
    done
    grep -q '^grpc=' "$work/ready" 2>/dev/null || die "collectord did not get ready in 30 s"
    addr=$(sed -n 's/^grpc=//p' "$work/ready")
}

bench_analyzer_up() {
    [ -x "$analyzer" ] || die "$analyzer is missing; build it"
    "$analyzer" --listen 127.0.0.1:0 --http-listen "" --pg-conninfo "$pg" --cache-bytes 0 --plaintext --allow-anonymous \
        --max-rows 0 --workers 1 --ready-file "$work/analyzer.ready" --log-level warn \
        >"$work/analyzer.log" 2>&1 &
    apid=$!
    for _ in $(seq 1 300); do
        [ -s "$work/analyzer.ready" ] && grep -q '^grpc=' "$work/analyzer.ready" && break
        kill -0 "$apid" 2>/dev/null ||
            { cat "$work/analyzer.log" >&2; die "kprof-analyzer exited"; }
        sleep 0.1
    done
    grep -q '^grpc=' "$work/analyzer.ready" 2>/dev/null ||
        die "kprof-analyzer did not get ready in 30 s"
    an_addr=$(sed -n 's/^grpc=//p' "$work/analyzer.ready")
    an_pid=$apid
}
