#!/usr/bin/env bash
# bench/import: how fast `kprofctl import` loads a torch.profiler (Kineto) trace, in MB/s of
# the trace's decompressed JSON, end to end (scan + convert + gRPC + collectord + COPY into
# PostgreSQL; kprofctl's wall time, the run committed), next to `gzip -dc FILE >/dev/null`
# of the same file (the floor any importer of a .json.gz pays) and kprof-bench-parse's
# scan alone (kp_kineto without network).
#
# The trace: the biggest .json.gz under tests/data/peers (or --trace FILE), its traceEvents
# repeated --copies times with shifted timestamps (bench/import/mktrace.py: deterministic,
# every event's text as Kineto wrote it), gzip-compressed. The run's rows in PostgreSQL are
# checked against what kprofctl says it sent (rows per table). Measurements alternate
# (import, gzip, scan, import, gzip, scan, ...), --reps times each, after one untimed warm-up
# import that fills the names table; medians are reported with the ratio import/gzip.
# Output: a human summary on stderr, one JSON line on stdout.
#
# usage: bench/import/run.sh [--quick] [--build DIR] [--trace FILE] [--copies N] [--reps R]
#                            [--keep]
#   --quick   a smoke run (the peer trace once, 1 rep): checks the pipeline, not the speed
#   --keep    keep the runs (default: each is dropped after it is measured)
# Environment: KPROF_BUILD_DIR; KPROF_PEERS (default tests/data/peers); KPROF_BENCH_PG with
# KPROF_COLLECTOR to use a running PostgreSQL and its collectord; without KPROF_BENCH_PG,
# throwaway ones are started (tests/it/pgfix.sh, <build>/collectord/kprof-collectord) and
# stopped at exit. Runtime with the defaults: about 30 s on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${KPROF_BUILD_DIR:-}
peers=${KPROF_PEERS:-$root/tests/data/peers}
trace=
copies=3
reps=3
quick=0
keep=0

die() {
    echo "bench/import: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 copies=1 reps=1 ;;
    --build) build=$2; shift ;;
    --trace) trace=$2; shift ;;
    --copies) copies=$2; shift ;;
    --reps) reps=$2; shift ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
for v in copies reps; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--$v must be a positive integer"
done
if [ -z "$build" ]; then
    for d in "$root/build" "$root/build-c" /tmp/build-c; do
        if [ -x "$d/kprofctl/kprofctl" ] && [ -x "$d/bench/import/kprof-bench-parse" ]; then
            build=$d
            break
        fi
    done
fi
[ -n "$build" ] || die "no build found; build first (cmake -S . -B build && cmake --build build) or pass --build DIR"
kprofctl=$build/kprofctl/kprofctl
parse=$build/bench/import/kprof-bench-parse
collectord=$build/collectord/kprof-collectord
[ -x "$kprofctl" ] && [ -x "$parse" ] || die "$build lacks kprofctl or kprof-bench-parse; build them"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
command -v psql >/dev/null || die "psql is needed"
command -v gzip >/dev/null || die "gzip is needed"

if [ -z "$trace" ]; then
    trace=$(find "$peers" -type f -name '*.json.gz' -printf '%s %p\n' 2>/dev/null |
        sort -k1,1nr -k2 | head -n1 | cut -d' ' -f2-)
    [ -n "$trace" ] || die "no .json.gz trace under $peers; pass --trace FILE"
fi
[ -r "$trace" ] || die "$trace: cannot read it"

work=$(mktemp -d /tmp/kprof-bench-import.XXXXXX)
pgdir=/tmp/kprof-bench-pg.$$
pgport=$((5500 + $$ % 400))
bench=bench/import
# shellcheck source=../stack.sh
. "$root/bench/stack.sh"

# The file kprofctl reads: named rank-0 so that it needs no --rank.
file=$work/rank-0.pt.trace.json.gz
echo "bench/import: building the trace: $trace x $copies" >&2
"$py" "$here/mktrace.py" "$trace" "$copies" "$file" >"$work/json_bytes" ||
    die "mktrace.py failed"
json_bytes=$(cat "$work/json_bytes")

bench_stack_up

sql() { psql "$pg" -qtAX -v ON_ERROR_STOP=1 -c "$1"; }
field() { "$py" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
now() { date +%s.%N; }

# Checks that PostgreSQL holds, per table, the rows kprofctl says it sent.
check_rows() {
    local json=$1 run=$2 t
    for t in kernels memcpys memsets api_calls ops steps collectives syncs; do
        echo "$t|$(sql "SELECT count(*) FROM $t WHERE run_id = $run")"
    done >"$work/got"
    "$py" - "$json" "$work/got" <<'PYEOF'
import json, sys
sent = json.load(open(sys.argv[1]))["rows"]
bad = []
for line in open(sys.argv[2]):
    t, n = line.strip().split("|")
    if int(n) != sent.get(t, 0):
        bad.append(f"{t}: stored {n}, sent {sent.get(t, 0)}")
if bad:
    print("bench/import: PostgreSQL does not hold what was sent:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
PYEOF
}

import_once() { # $1: output json; prints the wall seconds
    local t0 t1
    t0=$(now)
    "$kprofctl" import --collector "$addr" --job "$2" --progress off --json "$file" >"$1" ||
        die "kprofctl import failed (see above)"
    t1=$(now)
    "$py" -c "print($t1 - $t0)"
}

echo "bench/import: warm-up import (fills the names table; not measured)" >&2
import_once "$work/warm.json" bench-warmup >/dev/null
[ "$(field "$work/warm.json" json_bytes)" = "$json_bytes" ] ||
    die "kprofctl read $(field "$work/warm.json" json_bytes) bytes of JSON, the file has $json_bytes"
run=$(field "$work/warm.json" run_id)
check_rows "$work/warm.json" "$run" || die "warm-up: stored rows differ from the sent ones"
[ "$keep" = 1 ] || sql "SELECT kp_drop_run($run)" >/dev/null

imp=()
gz=()
scan=()
for i in $(seq 1 "$reps"); do
    s=$(import_once "$work/imp$i.json" bench-import)
    run=$(field "$work/imp$i.json" run_id)
    check_rows "$work/imp$i.json" "$run" || die "rep $i: stored rows differ from the sent ones"
    [ "$keep" = 1 ] || sql "SELECT kp_drop_run($run)" >/dev/null
    imp+=("$s")

    t0=$(now)
    gzip -dc "$file" >/dev/null
    t1=$(now)
    gz+=("$("$py" -c "print($t1 - $t0)")")

    "$parse" --reps 1 "$file" >"$work/scan$i.json" || die "kprof-bench-parse failed"
    scan+=("$(field "$work/scan$i.json" scan_s)")
    echo "bench/import: rep $i import ${imp[-1]} s, gzip -dc ${gz[-1]} s, scan ${scan[-1]} s" >&2
done
events=$(field "$work/imp1.json" events)

"$py" - "$json_bytes" "$events" "$(stat -c %s "$file")" "$reps" "$copies" "$quick" "$trace" \
    "${imp[*]}" "${gz[*]}" "${scan[*]}" <<'PYEOF'
import json, statistics, sys
json_bytes, events, gz_bytes, reps, copies = (int(x) for x in sys.argv[1:6])
quick, src = sys.argv[6] == "1", sys.argv[7]
imp, gz, scan = ([float(x) for x in a.split()] for a in sys.argv[8:11])
mb = json_bytes / 1e6
mi, mg, ms = (mb / statistics.median(v) for v in (imp, gz, scan))
ratio = mi / mg if mg > 0 else 0.0
print(f"bench/import: {src} x {copies} = {mb:.1f} MB of JSON ({gz_bytes / 1e6:.1f} MB gzip), "
      f"{events} events, {reps} reps each", file=sys.stderr)
print(f"  kprofctl import end to end (to PostgreSQL): median {mi:.1f} MB/s  "
      f"{[round(mb / x, 1) for x in imp]}", file=sys.stderr)
print(f"  gzip -dc FILE >/dev/null:                   median {mg:.1f} MB/s  "
      f"{[round(mb / x, 1) for x in gz]}", file=sys.stderr)
print(f"  kp_kineto scan alone (kprof-bench-parse):   median {ms:.1f} MB/s  "
      f"{[round(mb / x, 1) for x in scan]}", file=sys.stderr)
print(f"  ratio import/gzip {ratio:.2f}; target >= 100 MB/s end to end"
      f"{'  [quick: not a measurement]' if quick else ''}", file=sys.stderr)
print(json.dumps({"bench": "import", "quick": quick, "source": src, "copies": copies,
                  "json_bytes": json_bytes, "gzip_bytes": gz_bytes, "events": events,
                  "reps": reps, "import_s": imp, "gzip_s": gz, "scan_s": scan,
                  "import_mb_s": round(mi, 1), "gzip_mb_s": round(mg, 1),
                  "scan_mb_s": round(ms, 1), "ratio_import_gzip": round(ratio, 3)}))
PYEOF
