#!/usr/bin/env bash
# bench/ingest: how fast synthetic DDP traffic gets into PostgreSQL through kprof, against a
# raw COPY of the same rows.
#
#   (a) end-to-end: kprof-loadgen pushes N ranks through kprof-collectord's Ingest.Push;
#       events/s from the first send until the last ack (acks mean committed). Its rows are
#       checked against what loadgen says it sent (rows and sum(dur_ns) per rank and kind).
#   (b) baseline: kprof-bench-copy generates the same rows (same seed and start), encodes
#       them with kp_codec_copy_text (names already in the database) and COPYs them into a
#       fresh run's tables on one connection (encoding overlaps the COPY); events/s.
# Measurements alternate (e2e, raw, e2e, raw, ...), --reps times each, after one untimed
# warm-up push that fills the names table; medians are reported with the ratio e2e/raw
# (target >= 0.5) and the stored bytes per kernel row (pg_total_relation_size of the run's
# kernels partition / its rows). Output: a human summary on stderr, one JSON line on stdout.
#
# usage: bench/ingest/run.sh [--quick] [--build DIR] [--ranks N] [--steps S]
#                            [--kernels-per-step K] [--reps R] [--keep]
#   --quick   a smoke run (2 ranks, 20 steps, 1 rep): checks the pipeline, not the speed
#   --keep    keep the runs (default: each is dropped after it is measured)
# Environment: KPROF_BUILD_DIR (default: the first of ./build, ./build-c, /tmp/build-c that
# has kprof-loadgen); KPROF_BENCH_PG (libpq conninfo) with KPROF_COLLECTOR (gRPC address) to
# use a running PostgreSQL and the collectord that writes to it; without KPROF_BENCH_PG,
# throwaway ones are started (tests/it/pgfix.sh and <build>/collectord/kprof-collectord)
# and stopped at exit. Runtime with the defaults: about 25 s on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${KPROF_BUILD_DIR:-}
ranks=4
steps=500
kernels=200
reps=3
quick=0
keep=0

die() {
    echo "bench/ingest: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ranks=2 steps=20 kernels=50 reps=1 ;;
    --build) build=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --steps) steps=$2; shift ;;
    --kernels-per-step) kernels=$2; shift ;;
    --reps) reps=$2; shift ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
for v in ranks steps kernels reps; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--$v must be a positive integer"
done
if [ -z "$build" ]; then
    for d in "$root/build" "$root/build-c" /tmp/build-c; do
        if [ -x "$d/tools/kprof-loadgen" ]; then
            build=$d
            break
        fi
    done
fi
[ -n "$build" ] || die "no build found; build first (cmake -S . -B build && cmake --build build) or pass --build DIR"
loadgen=$build/tools/kprof-loadgen
copy=$build/bench/ingest/kprof-bench-copy
collectord=$build/collectord/kprof-collectord
[ -x "$loadgen" ] && [ -x "$copy" ] || die "$build lacks kprof-loadgen or kprof-bench-copy; build them"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
command -v psql >/dev/null || die "psql is needed"

work=$(mktemp -d /tmp/kprof-bench-ingest.XXXXXX)
pgdir=/tmp/kprof-bench-pg.$$
pgport=$((5500 + $$ % 400))
bench=bench/ingest
# shellcheck source=../stack.sh
. "$root/bench/stack.sh"

bench_stack_up

common=(--ranks "$ranks" --steps "$steps" --kernels-per-step "$kernels" --seed 1
    --start-ns 1700000000000000000)

sql() { psql "$pg" -qtAX -v ON_ERROR_STOP=1 -c "$1"; }

bytes_per_kernel() {
    sql "SELECT round(pg_total_relation_size('kernels_r$1')::numeric / greatest(count(*), 1), 1) FROM kernels_r$1"
}

# Checks that PostgreSQL holds exactly what loadgen says it sent.
check_totals() {
    local json=$1 run=$2 t q
    for t in kernel:kernels memcpy:memcpys memset:memsets api:api_calls op:ops step:steps \
        counter:counters collective:collectives sync:syncs memory:memory_events; do
        q="SELECT rank, count(*), coalesce(sum(dur_ns), 0) FROM ${t#*:} WHERE run_id = $run GROUP BY rank ORDER BY rank"
        # no dur_ns: counters and memory events (instants)
        case ${t%%:*} in counter | memory)
            q="SELECT rank, count(*), 0 FROM ${t#*:} WHERE run_id = $run GROUP BY rank ORDER BY rank" ;;
        esac
        sql "$q" | sed "s/^/${t%%:*}|/"
    done >"$work/got"
    "$py" - "$json" "$work/got" <<'EOF'
import json, sys
exp = json.load(open(sys.argv[1]))
got = {}
for line in open(sys.argv[2]):
    kind, rank, rows, dur = line.strip().split("|")
    got[(kind, int(rank))] = (int(rows), int(dur))
bad = []
for r in exp["expected"]:
    for kind, v in r["kinds"].items():
        g = got.get((kind, r["rank"]), (0, 0))
        if g != (v["rows"], v["dur_ns"]):
            bad.append(f"rank {r['rank']} {kind}: stored {g}, sent {(v['rows'], v['dur_ns'])}")
if bad:
    print("bench/ingest: PostgreSQL does not hold what was sent:\n  " + "\n  ".join(bad[:10]), file=sys.stderr)
    sys.exit(1)
EOF
}

field() { "$py" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

echo "bench/ingest: warm-up (fills the names table; not measured)" >&2
"$loadgen" --collector "$addr" "${common[@]}" --ranks 1 --json --job bench-warmup >"$work/warm.json" ||
    die "the warm-up push failed"
[ "$keep" = 1 ] || sql "SELECT kp_drop_run($(field "$work/warm.json" run_id))" >/dev/null

e2e=()
raw=()
e2e_bpk=
raw_bpk=
events=
for i in $(seq 1 "$reps"); do
    "$loadgen" --collector "$addr" "${common[@]}" --json --job bench-e2e >"$work/e2e$i.json" ||
        die "kprof-loadgen failed (rep $i)"
    run=$(field "$work/e2e$i.json" run_id)
    check_totals "$work/e2e$i.json" "$run" || die "rep $i: stored rows differ from the sent ones"
    e2e+=("$(field "$work/e2e$i.json" events_per_s)")
    events=$(field "$work/e2e$i.json" events)
    e2e_bpk=$(bytes_per_kernel "$run")
    [ "$keep" = 1 ] || sql "SELECT kp_drop_run($run)" >/dev/null
    echo "bench/ingest: rep $i e2e $(printf %.0f "${e2e[-1]}") events/s" >&2

    keepflag=--drop
    [ "$keep" = 1 ] && keepflag=--no-drop
    "$copy" --pg-conninfo "$pg" "${common[@]}" "$keepflag" >"$work/raw$i.json" ||
        die "kprof-bench-copy failed (rep $i)"
    raw+=("$(field "$work/raw$i.json" events_per_s)")
    raw_bpk=$(field "$work/raw$i.json" kernel_bytes_per_row)
    [ "$(field "$work/raw$i.json" events)" = "$events" ] ||
        die "the baseline generated $(field "$work/raw$i.json" events) events, loadgen $events"
    echo "bench/ingest: rep $i raw $(printf %.0f "${raw[-1]}") events/s" >&2
done

"$py" - "$ranks" "$steps" "$kernels" "$reps" "$events" "$e2e_bpk" "$raw_bpk" "$quick" \
    "${e2e[*]}" "${raw[*]}" <<'EOF'
import json, statistics, sys
ranks, steps, kernels, reps, events = (int(x) for x in sys.argv[1:6])
e2e_bpk, raw_bpk = float(sys.argv[6]), float(sys.argv[7])
quick = sys.argv[8] == "1"
e2e = [float(x) for x in sys.argv[9].split()]
raw = [float(x) for x in sys.argv[10].split()]
me, mr = statistics.median(e2e), statistics.median(raw)
ratio = me / mr if mr > 0 else 0.0
print(f"bench/ingest: {ranks} ranks x {steps} steps x {kernels} kernels/step = {events} events per run, "
      f"{reps} reps each", file=sys.stderr)
print(f"  end-to-end (loadgen -> collectord -> PostgreSQL): median {me:,.0f} events/s  {[round(x) for x in e2e]}",
      file=sys.stderr)
print(f"  raw COPY baseline:                                median {mr:,.0f} events/s  {[round(x) for x in raw]}",
      file=sys.stderr)
print(f"  ratio e2e/raw {ratio:.2f} (target >= 0.5, aim 0.8){'  [quick: not a measurement]' if quick else ''}",
      file=sys.stderr)
print(f"  stored bytes per kernel row: e2e {e2e_bpk}, raw {raw_bpk}", file=sys.stderr)
print(json.dumps({"bench": "ingest", "quick": quick, "ranks": ranks, "steps": steps,
                  "kernels_per_step": kernels, "reps": reps, "events": events,
                  "e2e_events_per_s": e2e, "raw_events_per_s": raw,
                  "e2e_median": me, "raw_median": mr, "ratio": round(ratio, 3),
                  "kernel_bytes_per_row_e2e": e2e_bpk, "kernel_bytes_per_row_raw": raw_bpk}))
EOF
