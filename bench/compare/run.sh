#!/usr/bin/env bash
# bench/compare: how long `kprofctl compare` takes on a big run, through kprof-analyzer
# (Analyzer.Compare: the RPC, the analyzer's queries and computation, and kprofctl printing
# the reply; the analyzer is a throwaway one with its cache off, so every call computes): by
# default 64 ranks x 10 steps x 20k compute kernels per step and rank (kprof-loadgen's
# synthetic DDP traffic, one planted compute straggler, rank N-1 at 1.3x), i.e. 12.8M kernels
# plus their ops, API calls, copies and collectives. The data is generated, committed and
# ANALYZEd before anything is timed.
#
# The baseline, in the same run on the same rows: `SELECT count(*), sum(dur_ns) FROM kernels
# WHERE run_id = R` through psql, i.e. reading the run's kernels once. compare reads more: one
# pass over the run's ops (steps, data loading), two over its kernels (sums per rank and step,
# then the collectives), one over its API calls and its copies and memsets (sums), all ranks at
# once; so the ratio says what the whole analysis costs in units of one scan.
# The analyzer's peak RSS (VmHWM, over all the reps: it does the work) is reported beside the
# time.
#
# Measurements alternate (baseline, compare, ...), --reps times each; medians are reported.
# Each compare answer is checked: exactly the planted rank is the straggler, cause compute.
# Output: a human summary on stderr, one JSON line on stdout.
#
# usage: bench/compare/run.sh [--quick] [--build DIR] [--ranks N] [--steps S] [--kernels K]
#                             [--reps R] [--run R]
#   --quick   a smoke run (8 ranks, 3 steps, 200 kernels, 1 rep): checks the pipeline only
#   --run R   time an existing run of KPROF_BENCH_PG instead of generating one (made by an
#             earlier kprof-loadgen with --straggler RANKS-1:1.3 and the same --ranks)
# Environment: KPROF_BUILD_DIR; KPROF_BENCH_PG with KPROF_COLLECTOR to use a running PostgreSQL
# and its collectord, else throwaway ones (bench/stack.sh); the kprof-analyzer is always a
# throwaway one on that PostgreSQL (bench_analyzer_up). The full size needs about 10 GB
# of disk for PostgreSQL and takes many minutes to generate on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${KPROF_BUILD_DIR:-}
ranks=64 steps=10 kernels=20000 reps=3 quick=0 run=

die() {
    echo "bench/compare: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ranks=8 steps=3 kernels=200 reps=1 ;;
    --build) build=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --steps) steps=$2; shift ;;
    --kernels) kernels=$2; shift ;;
    --reps) reps=$2; shift ;;
    --run) run=$2; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
for v in ranks steps kernels reps; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--$v must be a positive integer"
done
[ "$ranks" -ge 2 ] || die "--ranks must be 2 or more"
[ -n "$build" ] || build=$root/build
kprofctl=$build/kprofctl/kprofctl
loadgen=$build/tools/kprof-loadgen
collectord=$build/collectord/kprof-collectord
analyzer=$build/analyzer/kprof-analyzer
[ -x "$kprofctl" ] && [ -x "$loadgen" ] && [ -x "$analyzer" ] ||
    die "$build lacks kprofctl, kprof-loadgen or kprof-analyzer; build them"
py=/usr/bin/python3
[ -x "$py" ] || py=python3

work=$(mktemp -d /tmp/kprof-bench-compare.XXXXXX)
pgdir=/tmp/kprof-bench-cmp-pg.$$
pgport=$((5500 + $$ % 400))
bench=bench/compare
# shellcheck source=../stack.sh
. "$root/bench/stack.sh"
bench_stack_up
bench_analyzer_up

now() { date +%s.%N; }
secs() { "$py" -c "print($2 - $1)"; }
straggler=$((ranks - 1))

gen_s=0
if [ -z "$run" ]; then
    echo "bench/compare: generating $ranks ranks x $steps steps x $kernels kernels (not timed)" >&2
    t0=$(now)
    "$loadgen" --collector "$addr" --ranks "$ranks" --steps "$steps" \
        --kernels-per-step "$kernels" --straggler "$straggler:1.3" --job bench-compare \
        --threads 2 --give-up 10m --json >"$work/gen.json" || die "kprof-loadgen failed"
    gen_s=$(secs "$t0" "$(now)")
    run=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['run_id'])" "$work/gen.json")
    psql "$pg" -qtAX -c "VACUUM ANALYZE kernel_rows_r$run, kernel_chunks_r$run, ops_r$run, api_calls_r$run, memcpys_r$run,
        memsets_r$run, steps_r$run" >/dev/null || die "VACUUM ANALYZE failed"
fi
[[ $run =~ ^[1-9][0-9]*$ ]] || die "--run must be a run id"
n_kernels=$(psql "$pg" -qtAX -c "SELECT count(*) FROM kernels WHERE run_id = $run")
echo "bench/compare: run $run generated in $gen_s s ($n_kernels kernels)" >&2

base=() cmp=() rss=()
for i in $(seq 1 "$reps"); do
    t0=$(now)
    psql "$pg" -qtAX -c "SELECT count(*), sum(dur_ns) FROM kernels WHERE run_id = $run" \
        >"$work/base.txt" || die "baseline query failed"
    t1=$(now)
    base+=("$(secs "$t0" "$t1")")
    t0=$(now)
    "$kprofctl" compare --analyzer "$an_addr" --timeout 3600s --run "$run" --json \
        >"$work/cmp.json" || die "kprofctl compare failed (see $work/analyzer.log)"
    t1=$(now)
    cmp+=("$(secs "$t0" "$t1")")
    "$py" - "$work/cmp.json" "$straggler" <<'PYEOF' || die "compare gave a wrong answer"
import json, sys
d = json.load(open(sys.argv[1]))
got = [(s["rank"], s["cause"]) for s in d["stragglers"]]
if got != [(int(sys.argv[2]), "compute")]:
    sys.exit("expected rank %s (compute), got %s: %s" % (sys.argv[2], got, d["verdict"]))
PYEOF
    echo "bench/compare: rep $i baseline ${base[-1]} s, compare ${cmp[-1]} s" >&2
done
verdict=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['verdict'])" "$work/cmp.json")
rss=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$an_pid/status" 2>/dev/null || true)

"$py" - "$ranks" "$steps" "$kernels" "$n_kernels" "$reps" "$quick" "$gen_s" "${base[*]}" \
    "${cmp[*]}" "$verdict" "$rss" <<'PYEOF'
import json, statistics, sys
ranks, steps, kernels, n_kernels, reps = (int(x) for x in sys.argv[1:6])
quick, gen_s = sys.argv[6] == "1", float(sys.argv[7])
base, cmp = ([float(x) for x in a.split()] for a in sys.argv[8:10])
rss = int(sys.argv[11]) if sys.argv[11] else None
mb, mc = statistics.median(base), statistics.median(cmp)
print(f"bench/compare: {ranks} ranks x {steps} steps x {kernels} kernels ({n_kernels} kernel rows),"
      f" {reps} reps, medians:", file=sys.stderr)
print(f"  baseline (count, sum over the run's kernels) {mb * 1000:10.1f} ms", file=sys.stderr)
print(f"  kprofctl compare via kprof-analyzer (RPC)    {mc * 1000:10.1f} ms", file=sys.stderr)
print(f"  compare / baseline: {mc / mb:.1f}{'  [quick: not a measurement]' if quick else ''}",
      file=sys.stderr)
if rss is not None:
    print(f"  kprof-analyzer peak RSS (over all reps)      {rss / 1024:10.1f} MiB",
          file=sys.stderr)
print(f"  verdict: {sys.argv[10]}", file=sys.stderr)
print(json.dumps({"bench": "compare", "quick": quick, "ranks": ranks, "steps": steps,
                  "kernels_per_step": kernels, "kernel_rows": n_kernels, "reps": reps,
                  "generate_s": gen_s, "baseline_s": base, "compare_s": cmp,
                  "ratio": round(mc / mb, 2),
                  "compare_via": "kprof-analyzer (Analyzer.Compare RPC)",
                  "analyzer_max_rss_kb": rss}))
PYEOF
