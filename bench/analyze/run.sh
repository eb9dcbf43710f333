#!/usr/bin/env bash
# bench/analyze: how long kprof takes to answer the TensorBoard plugin's questions about a
# real trace: `kprofctl import` of a ResNet50 trace (end to end, committed in PostgreSQL),
# then kprof-analyze's step breakdown, operator view and kernel view of it (each a fresh
# process: loading the rank from PostgreSQL plus the computation).
#
# The baseline, measured in the same run on the same file: Python's json.load of the trace
# (/usr/bin/python3, gzip module). It is the first step of the plugin's own parser, which
# then builds its trees and tables on top; the plugin itself cannot be installed here (it is
# not packaged by Debian), so it is not timed. Ratios below 1 mean kprof's whole analysis
# finished before Python had even parsed the file.
#
# Measurements alternate (import, breakdown, ops, kernels, json.load, ...), --reps times
# each; medians are reported. Every breakdown's step count is checked against the plugin's
# own output for the trace (its step_breakdown.json), so a wrong answer is never timed.
# Output: a human summary on stderr, one JSON line on stdout.
#
# usage: bench/analyze/run.sh [--quick] [--build DIR] [--trace FILE] [--reps R]
#   --quick   a smoke run (1 rep): checks the pipeline, not the speed
# Environment: KPROF_BUILD_DIR; KPROF_PEERS (default tests/data/peers in the checkout);
# KPROF_BENCH_PG with KPROF_COLLECTOR to use a running PostgreSQL and
# its collectord, else throwaway ones (bench/stack.sh). About 20 s on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${KPROF_BUILD_DIR:-}
peers=${KPROF_PEERS:-$root/tests/data/peers}
trace=
reps=5
quick=0

die() {
    echo "bench/analyze: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 reps=1 ;;
    --build) build=$2; shift ;;
    --trace) trace=$2; shift ;;
    --reps) reps=$2; shift ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "--reps must be a positive integer"
[ -n "$build" ] || build=$root/build
kprofctl=$build/kprofctl/kprofctl
analyze=$build/analyzer/kprof-analyze
collectord=$build/collectord/kprof-collectord
[ -x "$kprofctl" ] && [ -x "$analyze" ] || die "$build lacks kprofctl or kprof-analyze; build them"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
# The plugin's output for span 1 names its trace file; its step count checks our breakdown.
ref=$(find "$peers/tbplugin/resnet50" -name '*span1.step_breakdown.json' 2>/dev/null | head -n1)
want_steps=
if [ -z "$trace" ]; then
    [ -n "$ref" ] || die "no ResNet50 reference under $peers/tbplugin/resnet50; pass --trace FILE"
    name=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['trace_file'])" "$ref")
    trace=$(find "$peers/tbplugin/resnet50/traces" -name "$name" | head -n1)
    [ -n "$trace" ] || die "the trace $name is missing under $peers/tbplugin/resnet50/traces"
    want_steps=$("$py" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['steps']))" "$ref")
fi
[ -r "$trace" ] || die "$trace: cannot read it"

work=$(mktemp -d /tmp/kprof-bench-analyze.XXXXXX)
pgdir=/tmp/kprof-bench-an-pg.$$
pgport=$((5500 + $$ % 400))
bench=bench/analyze
# shellcheck source=../stack.sh
. "$root/bench/stack.sh"
bench_stack_up

file=$work/rank-0.pt.trace.json.gz
cp "$trace" "$file"
now() { date +%s.%N; }
secs() { "$py" -c "print($2 - $1)"; }

imp=() bd=() op=() kn=() jl=()
for i in $(seq 1 "$reps"); do
    t0=$(now)
    "$kprofctl" import --collector "$addr" --job bench-analyze --progress off --json "$file" \
        >"$work/imp.json" || die "kprofctl import failed"
    t1=$(now)
    imp+=("$(secs "$t0" "$t1")")
    run=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$work/imp.json")

    t0=$(now)
    "$analyze" --pg "$pg" --run "$run" --rank 0 breakdown --json >"$work/bd.json" ||
        die "kprof-analyze breakdown failed"
    t1=$(now)
    bd+=("$(secs "$t0" "$t1")")
    got=$("$py" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['breakdown']['steps']))" "$work/bd.json")
    [ -z "$want_steps" ] || [ "$got" = "$want_steps" ] ||
        die "breakdown of run $run has $got steps; the plugin found $want_steps"

    t0=$(now)
    "$analyze" --pg "$pg" --run "$run" --rank 0 ops --json >"$work/ops.json" || die "ops failed"
    t1=$(now)
    op+=("$(secs "$t0" "$t1")")
    t0=$(now)
    "$analyze" --pg "$pg" --run "$run" --rank 0 kernels --json >"$work/kn.json" ||
        die "kernels failed"
    t1=$(now)
    kn+=("$(secs "$t0" "$t1")")

    t0=$(now)
    "$py" -c "import gzip,json,sys; json.load(gzip.open(sys.argv[1]))" "$file" ||
        die "python json.load failed"
    t1=$(now)
    jl+=("$(secs "$t0" "$t1")")
    psql "$pg" -qtAX -c "SELECT kp_drop_run($run)" >/dev/null 2>&1 ||
        psql "$pg" -qtAX -c "UPDATE runs SET state = 2 WHERE id = $run; SELECT kp_drop_run($run)" >/dev/null
    echo "bench/analyze: rep $i import ${imp[-1]} s, breakdown ${bd[-1]} s, ops ${op[-1]} s," \
        "kernels ${kn[-1]} s, python json.load ${jl[-1]} s" >&2
done

"$py" - "$trace" "$reps" "$quick" "${imp[*]}" "${bd[*]}" "${op[*]}" "${kn[*]}" "${jl[*]}" <<'PYEOF'
import json, os, statistics, sys
src, reps, quick = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
imp, bd, op, kn, jl = ([float(x) for x in a.split()] for a in sys.argv[4:9])
m = {k: statistics.median(v) for k, v in
     (("import", imp), ("breakdown", bd), ("ops", op), ("kernels", kn), ("json_load", jl))}
views = m["breakdown"] + m["ops"] + m["kernels"]
print(f"bench/analyze: {os.path.basename(src)}, {reps} reps, medians:", file=sys.stderr)
for k in ("import", "breakdown", "ops", "kernels", "json_load"):
    print(f"  {k:10s} {m[k] * 1000:9.1f} ms", file=sys.stderr)
print(f"  the three views together / Python's json.load of the file: {views / m['json_load']:.2f}; "
      f"import + views / json.load: {(m['import'] + views) / m['json_load']:.2f}"
      f"{'  [quick: not a measurement]' if quick else ''}", file=sys.stderr)
print(json.dumps({"bench": "analyze", "quick": quick, "source": os.path.basename(src),
                  "reps": reps, "import_s": imp, "breakdown_s": bd, "ops_s": op, "kernels_s": kn,
                  "json_load_s": jl,
                  "ratio_views_json_load": round(views / m["json_load"], 3),
                  "ratio_all_json_load": round((m["import"] + views) / m["json_load"], 3)}))
PYEOF
