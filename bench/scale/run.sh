#!/usr/bin/env bash
# bench/scale: where kprof stands at LLM scale, measured before anything is changed
# (FINDINGS.md next to this script holds the figures and where the time goes).
#
#   (a) one big rank: kprof-loadgen makes a 1-rank run (--rank-of N: an N-rank run, every
#       rank as big, the views asked for rank 0) of --steps steps x --kernels-per-step
#       kernels (kp_synth's mix: per kernel its launch API call and its op, plus copies,
#       memsets, collectives, syncs and steps; 500 x 400 is about 1 M events). Then, per view
#       (breakdown, ops, kernels, prof, roofline, memory), a fresh kprof-analyzer (--cache-bytes 0,
#       --max-rows 0: cold, every call computes) answers `kprofctl VIEW --run R --rank 0`;
#       timed end to end, with the analyzer's peak RSS (VmHWM) after that one view, and kprofctl's
#       (GNU time, when /usr/bin/time is there).
#       Baselines, in the same run on the same rows: "read the rank's rows once", i.e. psql
#       `COPY (SELECT the columns the views load) TO STDOUT` of the rank's ops, API calls,
#       kernels (kernel_rows and kernel_chunks' arrays), copies and memsets, text and binary,
#       to /dev/null; and a plain
#       `SELECT count(*), sum(dur_ns)` scan of each of those tables for the rank.
#       Each view is reported in seconds and as a ratio to the text COPY baseline.
#   (b) compare at each of --compare-ranks (default 64,256,1024) ranks x 10 steps x
#       --compare-kernels (default 200; the goal's size is 2000: 1024 x 10 x 2000 is 20.6 M
#       kernel rows, 98 M events, about 15 GB of disk at its peak and 5 minutes of generation
#       on 2 cores, so it is opt-in: --compare-kernels 2000, about 8 minutes in all):
#       kprofctl compare
#       through a fresh analyzer (cache off) vs the baseline `SELECT count(*), sum(dur_ns)
#       FROM kernels WHERE run_id = R`, with the analyzer's VmHWM. With a collectord that
#       summarises ended runs for compare (migration 0014), compare waits for the run's
#       summary and reads it; the summary's own time (compare_runs.seconds, on collectord's
#       end path) is reported as "summary at the end". Then the Grafana dashboard's panels
#       (bench/scale/dash.py: every panel query, every rank selected), from the run's
#       dashboard sums (migration 0016) and from its events, against the same scan.
#   For every run: bytes on disk per row (pg_total_relation_size of the run's partition,
#   indexes and TOAST included, / its rows) of kernels, ops and api_calls, and the run's
#   generation (ingest) rate. With --ingest, bench/ingest/run.sh --no-secure --reps 1 is run
#   too (its own stack) and its end-to-end vs raw COPY ratio reported.
# Output: a human summary on stderr, one JSON line on stdout.
#
# usage: bench/scale/run.sh [--quick] [--build DIR] [--steps S] [--kernels-per-step K]
#                           [--compare-ranks LIST] [--compare-kernels K] [--reps R]
#                           [--ingest] [--keep] [--variant LABEL=PATH]... [--no-compare]
#                           [--rank-of N] [--scan-too] [--windows-too N] [--views LIST]
#   --quick   a smoke run (20 steps x 50 kernels; compare at 8 ranks x 3 steps x 50 kernels)
#   --reps R  timed repetitions of each baseline and view (medians; default 1: each view
#             restarts the analyzer, cold)
#   --keep    keep the generated runs (default: dropped at the end; a throwaway database is
#             removed anyway)
#   --variant LABEL=PATH  (repeatable) also time the kprof-analyzer binary at PATH on the same
#             rows, in the same reps, right after this build's (e.g. main's build, for a before
#             and after side by side), asked by the kprofctl of its build tree when PATH is in one
#             (BUILD/analyzer/kprof-analyzer: BUILD/kprofctl/kprofctl), else this build's;
#             reported as VIEW@LABEL
#   --no-compare  skip (b)
#   --rows-too  in every rep, also time the baselines and views with the rank's kernels as rows
#             (kp_expand_kernels, then VACUUM ANALYZE; kp_compact_kernels after), reported as
#             VIEW@rows and copy_text@rows: the layout before migration 0015 against the
#             chunks an ended run has now, on the same kernels
#   --rank-of N  the big rank is rank 0 of an N-rank run (default 1), every rank the same size:
#             a per-rank read then has N ranks' rows beside its own in each partition
#   --scan-too  in every rep, also time the baselines and views with the planner's bitmap scans
#             off (PGOPTIONS, for psql and the analyzer), reported as VIEW@scan and
#             copy_text@scan: a rank's rows read as before migration 0017 (a scan of the run's
#             partitions) against its BRIN index by rank, on the same rows
#   --views LIST  the per-rank views to time (default breakdown,ops,kernels,prof,roofline,memory;
#             prof streams its rows, the others answer in one reply)
#   --windows-too N  in every rep, also time the views that read by windows (breakdown, ops,
#             kernels, memory, prof, roofline) with kprof-analyzer --window-events N, reported as
#             VIEW@win; the others run with --window-events 0 (the rank read whole), so that the
#             two stand side by side
# Environment: KPROF_BUILD_DIR; KPROF_BENCH_PG with KPROF_COLLECTOR to use a running
# PostgreSQL and its collectord, else throwaway ones (bench/stack.sh). The default run takes
# about 1.5 minutes on 2 shared cores (--reps 3: about 3) and about 2 GB of disk.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${KPROF_BUILD_DIR:-}
steps=500 kernels=400 cranks=64,256,1024 ckernels=200 csteps=10 reps=1 quick=0 ingest=0 keep=0
variants=() compare=1 rows_too=0 rank_of=1 scan_too=0 windows_too=0
view_list=breakdown,ops,kernels,prof,roofline,memory

die() {
    echo "bench/scale: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 steps=20 kernels=50 cranks=8 csteps=3 ckernels=50 ;;
    --build) build=$2; shift ;;
    --steps) steps=$2; shift ;;
    --kernels-per-step) kernels=$2; shift ;;
    --compare-ranks) cranks=$2; shift ;;
    --compare-kernels) ckernels=$2; shift ;;
    --reps) reps=$2; shift ;;
    --ingest) ingest=1 ;;
    --keep) keep=1 ;;
    --variant) variants+=("$2"); shift ;;
    --no-compare) compare=0 ;;
    --rows-too) rows_too=1 ;;
    --rank-of) rank_of=$2; shift ;;
    --scan-too) scan_too=1 ;;
    --windows-too) windows_too=$2; shift ;;
    --views) view_list=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
for v in steps kernels ckernels reps rank_of; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v} must be a positive integer"
done
[[ $cranks =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--compare-ranks must be a list like 64,256"
[[ $windows_too =~ ^[0-9]+$ ]] || die "--windows-too takes a count of host events"
[ -n "$build" ] || build=$root/build
kprofctl=$build/kprofctl/kprofctl
loadgen=$build/tools/kprof-loadgen
collectord=$build/collectord/kprof-collectord
analyzer=$build/analyzer/kprof-analyzer
[ -x "$kprofctl" ] && [ -x "$loadgen" ] && [ -x "$analyzer" ] ||
    die "$build lacks kprofctl, kprof-loadgen or kprof-analyzer; build them"
this_analyzer=$analyzer
for v in "${variants[@]}"; do
    [[ $v =~ ^[A-Za-z0-9_.-]+=. ]] && [ -x "${v#*=}" ] ||
        die "--variant $v: LABEL=PATH of a kprof-analyzer binary"
done
py=/usr/bin/python3
[ -x "$py" ] || py=python3

work=$(mktemp -d /tmp/kprof-bench-scale.XXXXXX)
pgdir=/tmp/kprof-bench-scale-pg.$$
pgport=$((5500 + $$ % 400))
bench=bench/scale
# shellcheck source=../stack.sh
. "$root/bench/stack.sh"
bench_stack_up
[ "$windows_too" = 0 ] || an_extra=(--window-events 0) # the other views: the rank read whole

now() { date +%s.%N; }
secs() { "$py" -c "print($2 - $1)"; }
q() { psql "$pg" -qtAX -v ON_ERROR_STOP=1 -c "$1"; }
runs=()
drop_runs() {
    [ "$keep" = 1 ] && return 0
    for r in "${runs[@]}"; do
        q "SELECT kp_drop_run($r)" >/dev/null 2>&1 || true
    done
}
# A fresh analyzer for every timed call: cold, and its VmHWM is that call's.
an_restart() {
    if [ -n "$apid" ]; then
        kill -TERM "$apid" 2>/dev/null || true
        wait "$apid" 2>/dev/null || true
        apid=
    fi
    rm -f "$work/analyzer.ready"
    bench_analyzer_up
}
an_hwm() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$an_pid/status" 2>/dev/null || echo 0; }

# Generates a run (ranks, steps, kernels, job) and prints "run_id events seconds".
gen() {
    local t0 t1 r
    t0=$(now)
    "$loadgen" --collector "$addr" --ranks "$1" --steps "$2" --kernels-per-step "$3" \
        --straggler "$(($1 - 1)):1.3" --job "$4" --threads 2 --give-up 10m --json \
        >"$work/gen.json" || die "kprof-loadgen failed"
    t1=$(now)
    r=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$work/gen.json")
    # collectord summarises the run for compare after EndRun's answer (migration 0014; a
    # build without it has no compare_runs): wait for it, so that compare reads it, and keep
    # the time it took (compare_runs.seconds; "-" without summaries)
    local sum_s=- until_s=$(($(date +%s) + 1800))
    if [ "$(q "SELECT to_regclass('compare_runs') IS NOT NULL")" = t ]; then
        while [ -z "$(q "SELECT 1 FROM compare_runs WHERE run_id = $r")" ]; do
            [ "$(date +%s)" -lt "$until_s" ] || die "run $r was not summarised in 30 min"
            sleep 0.2
        done
        sum_s=$(q "SELECT round(seconds::numeric, 3) FROM compare_runs WHERE run_id = $r")
    fi
    # then it moves the run's kernels into chunks (migration 0015), in steps after the summary
    if [ "$(q "SELECT to_regclass('kernel_rows') IS NOT NULL")" = t ]; then
        while [ "$(q "SELECT count(*) FROM kernel_rows WHERE run_id = $r")" != 0 ]; do
            [ "$(date +%s)" -lt "$until_s" ] || die "run $r's kernels were not moved in 30 min"
            sleep 0.2
        done
    fi
    # and last settles its partitions (migration 0017: indexed by rank, analysed); the VACUUM
    # below would otherwise wait for it, or run beside it and leave kernel_rows untruncated
    if [ "$(q "SELECT to_regproc('kp_settle_run') IS NOT NULL")" = t ]; then
        while [ "$(q "SELECT to_regclass('ops_r${r}_rank_brin') IS NOT NULL")" != t ]; do
            [ "$(date +%s)" -lt "$until_s" ] || die "run $r was not settled in 30 min"
            sleep 0.2
        done
    fi
    q "VACUUM ANALYZE kernel_rows_r$r, kernel_chunks_r$r, ops_r$r, api_calls_r$r, memcpys_r$r,
        memsets_r$r, steps_r$r" >/dev/null || die "VACUUM ANALYZE failed"
    echo "$r $("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['events'])" "$work/gen.json") $(secs "$t0" "$t1") $sum_s"
}

# Bytes per row of a run's partitions: "kernels ops api_calls" (indexes and TOAST included);
# kernels: its kernel_rows and kernel_chunks partitions (migration 0015) per kernel of the run.
bytes_per_row() {
    q "SELECT round((pg_total_relation_size('kernel_rows_r$1') +
        pg_total_relation_size('kernel_chunks_r$1'))::numeric / greatest((SELECT count(*) FROM
        kernels WHERE run_id = $1), 1), 1) || ' ' || string_agg(round(pg_total_relation_size(
        format('%s_r%s', t, $1)::regclass)::numeric / greatest((xpath('/row/c/text()',
        query_to_xml(format('SELECT count(*) AS c FROM %s_r%s', t, $1), false, true,
        '')))[1]::text::numeric, 1), 1)::text, ' ' ORDER BY o)
        FROM unnest(ARRAY['ops', 'api_calls']) WITH ORDINALITY AS u(t, o)"
}

# label command...: runs it, appends "label seconds" to $work/times and, for kprofctl (with GNU
# time), "label KiB" of its peak RSS to $work/cli_hwm
timed() {
    local t0 t1 rss=()
    [ "${2##*/}" = kprofctl ] && [ -x /usr/bin/time ] && rss=(/usr/bin/time -f %M -o "$work/cli.rss")
    t0=$(now)
    "${rss[@]}" "${@:2}" >"$work/out.$1" || die "$1 failed (see $work/analyzer.log)"
    t1=$(now)
    echo "$1 $(secs "$t0" "$t1")" >>"$work/times"
    [ ${#rss[@]} = 0 ] || echo "$1 $(tail -n 1 "$work/cli.rss")" >>"$work/cli_hwm"
}

: >"$work/times"
: >"$work/hwm"
# ---- (a) one big rank ----------------------------------------------------------------------
echo "bench/scale: generating $rank_of rank(s) x $steps steps x $kernels kernels (not timed)" >&2
read -r brun bevents bgen _ < <(gen "$rank_of" "$steps" "$kernels" bench-scale-rank)
[ -n "$brun" ] || die "the big rank's run was not generated"
runs+=("$brun")
rr="run_id = $brun AND rank = 0"
read -r nk no na < <(q "SELECT (SELECT count(*) FROM kernels WHERE $rr), (SELECT count(*) FROM ops
    WHERE $rr), (SELECT count(*) FROM api_calls WHERE $rr)" | tr '|' ' ')
echo "bench/scale: run $brun: $bevents events in $bgen s ($nk kernels, $no ops, $na API calls)" >&2
# The columns the views load (analyzer/an.c: kp_an_load's queries), one COPY per table; the
# kernels as the analyzer reads them: kernel_rows' rows and kernel_chunks' arrays (0015).
copy_sql=(
    "SELECT start_ns, dur_ns, tid, external_id, name, input_shapes, kind, input_dtypes FROM ops WHERE $rr"
    "SELECT start_ns, dur_ns, tid, correlation, external_id FROM api_calls WHERE $rr"
    "SELECT start_ns, dur_ns, correlation, external_id, name, grid_x, grid_y, grid_z, block_x, block_y, block_z, registers, static_smem, dynamic_smem, device FROM kernel_rows WHERE $rr"
    "SELECT start_ns, dur_ns, correlation, external_id, name, grid_x, grid_y, grid_z, block_x, block_y, block_z, registers, static_smem, dynamic_smem, device FROM kernel_chunks WHERE $rr"
    "SELECT start_ns, dur_ns, correlation, external_id FROM memcpys WHERE $rr"
    "SELECT start_ns, dur_ns, correlation, external_id FROM memsets WHERE $rr")
# One psql session (one connection) for the five statements, as the analyzer has one.
copy_all() { # format
    local s
    for s in "${copy_sql[@]}"; do
        echo "COPY ($s) TO STDOUT (FORMAT $1);"
    done | psql "$pg" -qtAX -v ON_ERROR_STOP=1 -f - >/dev/null
}
scan_all() {
    local t
    for t in ops api_calls kernels memcpys memsets; do
        echo "SELECT count(*), sum(dur_ns) FROM $t WHERE $rr;"
    done | psql "$pg" -qtAX -v ON_ERROR_STOP=1 -f - >/dev/null
}
IFS=, read -r -a views <<<"$view_list"
for v in "${views[@]}"; do
    [[ $v =~ ^(breakdown|ops|kernels|prof|roofline|memory)$ ]] || die "--views: no view $v"
done
for i in $(seq 1 "$reps"); do
    timed copy_text copy_all text
    timed copy_binary copy_all binary
    timed scan scan_all
    for v in "${views[@]}"; do
        for va in "=$this_analyzer" "${variants[@]}"; do
            analyzer=${va#*=}
            lab=${va%%=*}
            label=$v${lab:+@$lab}
            ctl=$kprofctl # a variant's own kprofctl where it is a build tree (its calls are its own)
            [ -x "${analyzer%/*}/../kprofctl/kprofctl" ] && ctl=${analyzer%/*}/../kprofctl/kprofctl
            an_restart
            timed "$label" "$ctl" "$v" --analyzer "$an_addr" --timeout 3600s --run "$brun" \
                --rank 0 --json
            echo "$label $(an_hwm)" >>"$work/hwm"
        done
    done
    analyzer=$this_analyzer
    if [ "$windows_too" != 0 ]; then
        an_extra=(--window-events "$windows_too")
        for v in breakdown ops kernels memory prof roofline; do
            [[ ,$view_list, == *,$v,* ]] || continue
            an_restart
            timed "$v@win" "$kprofctl" "$v" --analyzer "$an_addr" --timeout 3600s --run "$brun" \
                --rank 0 --json
            echo "$v@win $(an_hwm)" >>"$work/hwm"
            cmp -s "$work/out.$v" "$work/out.$v@win" || echo "bench/scale: $v by windows differs \
from the whole read (the means' last digits may: the sums are added in another order)" >&2
        done
        an_extra=(--window-events 0)
        an_restart
    fi
    if [ "$scan_too" = 1 ]; then
        export PGOPTIONS="-c enable_bitmapscan=off"
        timed copy_text@scan copy_all text
        for v in "${views[@]}"; do
            an_restart
            timed "$v@scan" "$kprofctl" "$v" --analyzer "$an_addr" --timeout 3600s --run "$brun" \
                --rank 0 --json
            echo "$v@scan $(an_hwm)" >>"$work/hwm"
        done
        unset PGOPTIONS
        an_restart
    fi
    if [ "$rows_too" = 1 ]; then
        q "SELECT kp_expand_kernels($brun)" >/dev/null
        q "VACUUM ANALYZE kernel_rows_r$brun, kernel_chunks_r$brun" >/dev/null
        timed copy_text@rows copy_all text
        timed scan@rows scan_all
        for v in "${views[@]}"; do
            an_restart
            timed "$v@rows" "$kprofctl" "$v" --analyzer "$an_addr" --timeout 3600s --run "$brun" \
                --rank 0 --json
            echo "$v@rows $(an_hwm)" >>"$work/hwm"
        done
        bpr_rows=$(bytes_per_row "$brun")
        q "SELECT kp_compact_kernels($brun)" >/dev/null
        q "VACUUM ANALYZE kernel_rows_r$brun, kernel_chunks_r$brun" >/dev/null
    fi
    echo "bench/scale: rep $i: $(tail -n $((3 + ${#views[@]} * (1 + ${#variants[@]} + rows_too + scan_too) + 2 * rows_too + scan_too + 6 * (windows_too > 0))) "$work/times" | tr '\n' ' ')" >&2
done
[ ! -e "$work/out.breakdown" ] ||
"$py" - "$work/out.breakdown" "$steps" <<'PYEOF' || die "the breakdown is wrong"
import json, sys
d = json.load(open(sys.argv[1]))
n = len(d["breakdown"]["steps"]) if "breakdown" in d else len(d["steps"])
if n < int(sys.argv[2]) - 2:
    sys.exit(f"breakdown has {n} steps; {sys.argv[2]} were generated")
PYEOF
bpr_rank=$(bytes_per_row "$brun")
bpr_rows=${bpr_rows:-}

# ---- (b) compare at each rank count ---------------------------------------------------------
: >"$work/cmp"
IFS=, read -r -a clist <<<"$cranks"
[ "$compare" = 1 ] || clist=()
for n in "${clist[@]}"; do
    [ "$n" -ge 2 ] || die "--compare-ranks: $n: 2 ranks or more"
    echo "bench/scale: generating $n ranks x $csteps steps x $ckernels kernels (not timed)" >&2
    read -r crun cevents cgen csum < <(gen "$n" "$csteps" "$ckernels" "bench-scale-$n")
    [ -n "$crun" ] || die "the $n-rank run was not generated"
    runs+=("$crun")
    ckn=$(q "SELECT count(*) FROM kernels WHERE run_id = $crun")
    for i in $(seq 1 "$reps"); do
        t0=$(now)
        q "SELECT count(*), sum(dur_ns) FROM kernels WHERE run_id = $crun" >/dev/null
        b=$(secs "$t0" "$(now)")
        an_restart
        t0=$(now)
        "$kprofctl" compare --analyzer "$an_addr" --timeout 3600s --run "$crun" --json \
            >"$work/cmp.json" || die "kprofctl compare failed (see $work/analyzer.log)"
        c=$(secs "$t0" "$(now)")
        "$py" - "$work/cmp.json" "$((n - 1))" <<'PYEOF' || die "compare gave a wrong answer"
import json, sys
d = json.load(open(sys.argv[1]))
got = [(s["rank"], s["cause"]) for s in d["stragglers"]]
if got != [(int(sys.argv[2]), "compute")]:
    sys.exit("expected rank %s (compute), got %s: %s" % (sys.argv[2], got, d["verdict"]))
PYEOF
        # the dashboard's panels (every rank selected): from the run's dashboard sums
        # (migration 0016), then from its events (without the dash_runs row that makes the
        # sums count; put back after)
        ds=- de=-
        if [ "$(q "SELECT to_regclass('dash_runs') IS NOT NULL")" = t ]; then
            ds=$("$py" "$root/$bench/dash.py" --pg "$pg" --run "$crun" --job "bench-scale-$n" \
                --dashboard "$root/deploy/grafana/kprof-dashboard.json" | "$py" -c \
                "import json,sys; print(json.load(sys.stdin)['total_s'])") || die "dash.py failed"
            q "DELETE FROM dash_runs WHERE run_id = $crun" >/dev/null
            de=$("$py" "$root/$bench/dash.py" --pg "$pg" --run "$crun" --job "bench-scale-$n" \
                --dashboard "$root/deploy/grafana/kprof-dashboard.json" | "$py" -c \
                "import json,sys; print(json.load(sys.stdin)['total_s'])") || die "dash.py failed"
            q "INSERT INTO dash_runs (run_id) VALUES ($crun)" >/dev/null
        fi
        echo "$n $ckn $cevents $cgen $b $c $(an_hwm) $(bytes_per_row "$crun" | tr ' ' ,) $csum $ds $de" >>"$work/cmp"
        echo "bench/scale: $n ranks ($ckn kernels): scan $b s, compare $c s, summary $csum s, dashboard $ds s (from the events $de s)" >&2
    done
    drop_runs
    runs=()
done
runs=("$brun")
drop_runs

ingest_json=
if [ "$ingest" = 1 ]; then
    echo "bench/scale: bench/ingest/run.sh --no-secure --reps 1" >&2
    ingest_json=$(env -u KPROF_BENCH_PG -u KPROF_COLLECTOR bash "$root/bench/ingest/run.sh" \
        --no-secure --reps 1 --build "$build" | tail -n 1) || die "bench/ingest failed"
fi

"$py" - "$quick" "$steps" "$kernels" "$bevents" "$bgen" "$nk" "$no" "$na" "$bpr_rank" \
    "$work/times" "$work/hwm" "$work/cmp" "$ingest_json" "$bpr_rows" "$rank_of" <<'PYEOF'
import json, statistics, sys
quick = sys.argv[1] == "1"
steps, kernels, events = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gen_s = float(sys.argv[5])
nk, no, na = (int(x) for x in sys.argv[6:9])
bpr = dict(zip(("kernels", "ops", "api_calls"), (float(x) for x in sys.argv[9].split())))
times = {}
for line in open(sys.argv[10]):
    k, v = line.split()
    times.setdefault(k, []).append(float(v))
hwm = {}
for line in open(sys.argv[11]):
    k, v = line.split()
    hwm[k] = max(hwm.get(k, 0), int(v))
cli_hwm = {}  # kprofctl's own peak (GNU time), beside the file of the analyzer's
try:
    for line in open(sys.argv[11].rsplit("/", 1)[0] + "/cli_hwm"):
        k, v = line.split()
        cli_hwm[k] = max(cli_hwm.get(k, 0), int(v))
except FileNotFoundError:
    pass
med = {k: statistics.median(v) for k, v in times.items()}
base = med["copy_text"]
tag = "  [quick: not a measurement]" if quick else ""
err = sys.stderr
rank_of = int(sys.argv[15])
print(f"bench/scale: one rank{f' (rank 0 of {rank_of})' if rank_of > 1 else ''}, {steps} steps x "
      f"{kernels} kernels: {events // rank_of} events ({nk} kernels, {no} ops, {na} API calls), "
      f"generated at {events / gen_s:,.0f} events/s", file=err)
print(f"  read the rank once, COPY text    {med['copy_text']:8.3f} s", file=err)
print(f"  read the rank once, COPY binary  {med['copy_binary']:8.3f} s", file=err)
print(f"  count/sum scan of the rank       {med['scan']:8.3f} s", file=err)
if "copy_text@scan" in med:
    print(f"  the same, bitmap scans off (a scan of the run's partitions): COPY text "
          f"{med['copy_text@scan']:.3f} s", file=err)
if "copy_text@rows" in med:
    print(f"  the same, kernels as rows: COPY text {med['copy_text@rows']:.3f} s, scan "
          f"{med['scan@rows']:.3f} s", file=err)
views = {}
view_names = ("breakdown", "ops", "kernels", "prof", "roofline", "memory")
labels = [k for k in times if k.split("@")[0] in view_names]
for v in sorted(labels, key=lambda k: (view_names.index(k.split("@")[0]), "@" in k, k)):
    # a view on the rows layout (or with bitmap scans off) against reading the rows once so,
    # the others (variants too) against the chunks through the index
    b = med.get("copy_text@" + v.split("@")[1], base) if "@" in v else base  # @win: base
    views[v] = {"s": times[v], "ratio": round(med[v] / b, 2), "max_rss_kb": hwm.get(v),
                "kprofctl_max_rss_kb": cli_hwm.get(v)}
    print(f"  {v:18s} cold {med[v]:8.3f} s ({min(times[v]):.3f}..{max(times[v]):.3f})  "
          f"{med[v] / b:6.1f}x COPY  peak RSS {hwm.get(v, 0) / 1024:7.1f} MiB"
          f"{f' (kprofctl {cli_hwm[v] / 1024:.1f} MiB)' if v in cli_hwm else ''}{tag}", file=err)
print(f"  bytes per row on disk: kernels {bpr['kernels']:.1f}, ops {bpr['ops']:.0f}, "
      f"API calls {bpr['api_calls']:.0f}", file=err)
bpr_rows = float(sys.argv[14].split()[0]) if sys.argv[14] else None
if bpr_rows is not None:
    print(f"  bytes per kernel as rows (before the run's compaction): {bpr_rows:.1f}", file=err)
cmps = {}
for line in open(sys.argv[12]):
    n, ckn, cev, cgen, b, c, h, bp, sm, ds, de = line.split()
    e = cmps.setdefault(n, {"kernel_rows": int(ckn), "events": int(cev),
                            "generate_events_per_s": round(int(cev) / float(cgen)),
                            "scan_s": [], "compare_s": [], "max_rss_kb": 0,
                            "dashboard_s": [], "dashboard_events_s": [],
                            "summary_s": None if sm == "-" else float(sm),
                            "bytes_per_row": dict(zip(("kernels", "ops", "api_calls"),
                                                      (float(x) for x in bp.split(","))))})
    e["scan_s"].append(float(b))
    e["compare_s"].append(float(c))
    if ds != "-":
        e["dashboard_s"].append(float(ds))
        e["dashboard_events_s"].append(float(de))
    e["max_rss_kb"] = max(e["max_rss_kb"], int(h))
for n, e in cmps.items():
    mb, mc = statistics.median(e["scan_s"]), statistics.median(e["compare_s"])
    e["ratio"] = round(mc / mb, 2)
    print(f"  compare {n:>5s} ranks ({e['kernel_rows']} kernels): {mc:7.3f} s, scan {mb:6.3f} s, "
          f"{mc / mb:5.1f}x, peak RSS {e['max_rss_kb'] / 1024:6.1f} MiB, "
          f"{e['bytes_per_row']['kernels']:.0f} B/kernel, summary at the end "
          f"{'-' if e['summary_s'] is None else '%.3f s' % e['summary_s']}{tag}", file=err)
    if e["dashboard_s"]:
        md, mde = statistics.median(e["dashboard_s"]), statistics.median(e["dashboard_events_s"])
        e["dashboard_ratio"] = round(md / mb, 2)
        print(f"  dashboard {n:>5s} ranks (every panel, every rank): {md:7.3f} s from the sums, "
              f"{md / mb:5.2f}x scan; {mde:7.3f} s from the events{tag}", file=err)
ing = json.loads(sys.argv[13]) if sys.argv[13] else None
if ing:
    print(f"  ingest (bench/ingest): {json.dumps({k: v for k, v in ing.items() if 'ratio' in k})}",
          file=err)
print(json.dumps({"bench": "scale", "quick": quick,
                  "rank": {"steps": steps, "kernels_per_step": kernels, "events": events,
                           "ranks_in_run": rank_of, "copy_text_scan_s": times.get("copy_text@scan"),
                           "kernels": nk, "ops": no, "api_calls": na,
                           "generate_events_per_s": round(events / gen_s),
                           "copy_text_s": times["copy_text"], "copy_binary_s": times["copy_binary"],
                           "scan_s": times["scan"], "views": views, "bytes_per_row": bpr,
                           "kernel_bytes_as_rows": bpr_rows,
                           "copy_text_rows_s": times.get("copy_text@rows"),
                           "scan_rows_s": times.get("scan@rows")},
                  "compare": cmps, "ingest": ing}))
PYEOF
