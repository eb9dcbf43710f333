#!/usr/bin/env bash
# bench/ingest: how fast synthetic DDP traffic gets into PostgreSQL through kprof, against a
# raw COPY of the same rows, and what TLS and authentication cost.
#
#   (a) end-to-end: kprof-loadgen pushes N ranks through kprof-collectord's Ingest.Push;
#       events/s from the first send until the last ack (acks mean committed). Its rows are
#       checked against what loadgen says it sent (rows and sum(dur_ns) per rank and kind).
#       Three variants, plain on one collectord, token and mtls on a second one, both
#       writing to the same PostgreSQL:
#         plain  plaintext and anonymous (--plaintext --allow-anonymous, loopback only);
#         token  TLS, an agent's bearer token (--tls-cert/--tls-key/--token-file);
#         mtls   TLS, an agent's client certificate (--tls-client-ca) and no token.
#       The CA, the certificates (EC P-256) and the token are made with the openssl CLI in
#       the run's temp dir (bench/stack.sh bench_secure_up). Before measuring, the second
#       collectord is checked to refuse a push without a credential and a plaintext push;
#       after, the token is checked to appear in no log.
#   (b) baseline: kprof-bench-copy generates the same rows (same seed and start), encodes
#       them with kp_codec_copy_text (names already in the database) and COPYs them into a
#       fresh run's tables on one connection (encoding overlaps the COPY); events/s.
# Measurements alternate (plain, token, mtls, raw; the order rotates by one each rep so that
# none always runs first), --reps times each, after one untimed warm-up push per variant
# (it fills the names table). Reported: each one's median and spread (min..max), the ratio
# e2e/raw of plain (target >= 0.5), the ratios token/plain and mtls/plain (of the medians, and
# the median of each rep's own ratio, which drift of a shared machine affects less), the CPU
# seconds per million events of collectord (its /proc/PID/stat, throwaway stack only) and of
# kprof-loadgen (getrusage) in each variant, which a busy machine disturbs less than events/s,
# and the stored bytes per kernel: the raw COPY's rows (its kernel_rows partition / its rows)
# and the end-to-end run's once it has ended and collectord has moved its kernels into chunks
# (kernel_rows + kernel_chunks partitions, after a VACUUM, / its kernels; each push waits for
# that move, which happens after the last ack and is not in events/s). The move itself is timed
# on the last plain run, in the same run as the baseline: kp_expand_kernels, then
# kp_compact_kernels timed from psql; reported as kernels/s and as the share of a raw COPY's
# time for the run's events that it adds. Output: a human summary on stderr, one JSON line on
# stdout.
#
# usage: bench/ingest/run.sh [--quick] [--build DIR] [--ranks N] [--steps S]
#                            [--kernels-per-step K] [--reps R] [--no-secure] [--keep]
#   --quick      a smoke run (2 ranks, 20 steps, 1 rep): checks the pipeline, not the speed
#   --no-secure  only the plain variant and the baseline
#   --keep       keep the runs (default: each is dropped after it is measured)
# Environment: KPROF_BUILD_DIR (default: the first of ./build, ./build-c, /tmp/build-c that
# has kprof-loadgen); KPROF_BENCH_PG (libpq conninfo) with KPROF_COLLECTOR (gRPC address) to
# use a running PostgreSQL and the collectord that writes to it (then the plain variant
# only); without KPROF_BENCH_PG, throwaway ones are started (tests/it/pgfix.sh and
# <build>/collectord/kprof-collectord) and stopped at exit. Runtime with the defaults: about
# 75 s on 2 cores.
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
secure=1

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
    --no-secure) secure=0 ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,40p' "$0"; exit 0 ;;
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

# Run $1's kernels on disk (rows and chunks, indexes and TOAST included) per kernel, once the
# dead rows the compaction left are vacuumed (autovacuum's job in production).
bytes_per_kernel() {
    sql "VACUUM kernel_rows_r$1" >/dev/null
    sql "SELECT round((pg_total_relation_size('kernel_rows_r$1') + pg_total_relation_size('kernel_chunks_r$1'))::numeric / greatest(count(*), 1), 1) FROM kernels WHERE run_id = $1"
}

# Waits until collectord has moved ended run $1's kernel rows into chunks (its summariser, a
# moment after EndRun).
wait_compacted() {
    local i
    for i in $(seq 1 600); do
        [ "$(sql "SELECT count(*) FROM kernel_rows WHERE run_id = $1")" = 0 ] && return 0
        sleep 0.2
    done
    die "run $1: its kernels were not compacted within 120 s"
}

# Times kp_compact_kernels on run $1 (moved back into rows first): "KERNELS SECONDS".
time_compaction() {
    local n t0 t1
    sql "SELECT kp_expand_kernels($1)" >/dev/null
    sql "VACUUM kernel_chunks_r$1" >/dev/null
    t0=$(date +%s.%N)
    n=$(sql "SELECT kp_compact_kernels($1)")
    t1=$(date +%s.%N)
    echo "$n $(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')"
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

if [ "$secure" = 1 ] && [ -n "${KPROF_BENCH_PG:-}" ]; then
    echo "bench/ingest: KPROF_BENCH_PG is set: the plain variant only" >&2
    secure=0
fi
variants=(plain)
declare -A target flags
target[plain]=$addr
flags[plain]=
if [ "$secure" = 1 ]; then
    bench_secure_up
    variants=(plain token mtls)
    target[token]=$saddr
    target[mtls]=$saddr
    flags[token]=${sec_token[*]}
    flags[mtls]=${sec_mtls[*]}
    # The secured collectord must refuse what the plain one takes.
    if "$loadgen" --collector "$saddr" --tls-ca "$work/tls/ca.pem" --ranks 1 --steps 1 \
        --give-up 5s --job bench-anonymous >/dev/null 2>"$work/anonymous.err"; then
        die "the secured collectord took a push without a credential"
    fi
    grep -q UNAUTHENTICATED "$work/anonymous.err" || {
        cat "$work/anonymous.err" >&2
        die "a push without a credential was not refused as UNAUTHENTICATED"
    }
    if "$loadgen" --collector "$saddr" --token-file "$work/tls/agent.token" --ranks 1 --steps 1 \
        --give-up 5s --job bench-plaintext >/dev/null 2>"$work/plaintext.err"; then
        die "the secured collectord took a plaintext push"
    fi
    echo "bench/ingest: the secured collectord refuses a push without a credential and a plaintext one" >&2
fi

# CPU ticks (user + system) process $1 has used so far; 0 when it is not ours to read.
cpu_ticks() {
    if [ -n "$1" ] && [ -r "/proc/$1/stat" ]; then
        sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
    else
        echo 0
    fi
}
hz=$(getconf CLK_TCK)
declare -A dpid
dpid[plain]=$cpid
dpid[token]=$spid
dpid[mtls]=$spid

# Pushes variant $1's traffic (job bench-$1) with its loadgen JSON into $2, checks the rows
# it stored and sets events, last_run and dcpu (the collectord's CPU seconds for the push).
push() {
    local t0
    t0=$(cpu_ticks "${dpid[$1]}")
    # shellcheck disable=SC2086 # flags[] holds bench_secure_up's paths (no spaces: mktemp)
    "$loadgen" --collector "${target[$1]}" ${flags[$1]} "${common[@]}" --json --job "bench-$1" \
        >"$2" || die "kprof-loadgen failed ($1)"
    dcpu=$(awk -v a="$t0" -v b="$(cpu_ticks "${dpid[$1]}")" -v hz="$hz" 'BEGIN { print (b - a) / hz }')
    last_run=$(field "$2" run_id)
    check_totals "$2" "$last_run" || die "$1: stored rows differ from the sent ones"
    wait_compacted "$last_run"
    events=$(field "$2" events)
}

echo "bench/ingest: warm-up (fills the names table; not measured)" >&2
for v in "${variants[@]}"; do
    # shellcheck disable=SC2086
    "$loadgen" --collector "${target[$v]}" ${flags[$v]} "${common[@]}" --ranks 1 --json \
        --job "bench-warmup-$v" >"$work/warm-$v.json" || die "the warm-up push ($v) failed"
    [ "$keep" = 1 ] || sql "SELECT kp_drop_run($(field "$work/warm-$v.json" run_id))" >/dev/null
done

declare -A got dcpus lcpus
e2e_bpk=
raw_bpk=
compaction=
events=
last_run=
order=("${variants[@]}" raw)
for i in $(seq 1 "$reps"); do
    for k in "${!order[@]}"; do
        v=${order[$(((k + i - 1) % ${#order[@]}))]}
        if [ "$v" = raw ]; then
            keepflag=--drop
            [ "$keep" = 1 ] && keepflag=--no-drop
            "$copy" --pg-conninfo "$pg" "${common[@]}" "$keepflag" >"$work/raw$i.json" ||
                die "kprof-bench-copy failed (rep $i)"
            raw_bpk=$(field "$work/raw$i.json" kernel_bytes_per_row)
            [ -z "$events" ] || [ "$(field "$work/raw$i.json" events)" = "$events" ] ||
                die "the baseline generated $(field "$work/raw$i.json" events) events, loadgen $events"
        else
            push "$v" "$work/$v$i.json"
            dcpus[$v]+="$dcpu "
            lcpus[$v]+="$(field "$work/$v$i.json" cpu_seconds) "
            if [ "$v" = plain ]; then
                e2e_bpk=$(bytes_per_kernel "$last_run")
                [ "$i" = "$reps" ] && compaction=$(time_compaction "$last_run")
            fi
            [ "$keep" = 1 ] || sql "SELECT kp_drop_run($last_run)" >/dev/null
        fi
        rate=$(field "$work/$v$i.json" events_per_s)
        got[$v]+="$rate "
        echo "bench/ingest: rep $i $v $(printf %.0f "$rate") events/s" >&2
    done
done

# Neither collectord's log nor loadgen's refusals may hold the token.
if [ "$secure" = 1 ] && grep -sqF -- "$(cat "$work/tls/agent.token")" "$work"/*.log "$work"/*.err; then
    die "the agent token appears in a log or an error message"
fi

"$py" - "$ranks" "$steps" "$kernels" "$reps" "$events" "$e2e_bpk" "$raw_bpk" "$quick" \
    "${got[plain]}" "${got[raw]}" "${got[token]:-}" "${got[mtls]:-}" \
    "${dcpus[plain]}" "${dcpus[token]:-}" "${dcpus[mtls]:-}" \
    "${lcpus[plain]}" "${lcpus[token]:-}" "${lcpus[mtls]:-}" "$([ -n "$cpid" ] && echo 1)" \
    "$compaction" <<'EOF'
import json, statistics, sys
ranks, steps, kernels, reps, events = (int(x) for x in sys.argv[1:6])
e2e_bpk, raw_bpk = float(sys.argv[6]), float(sys.argv[7])
quick = sys.argv[8] == "1"
e2e, raw, token, mtls = ([float(x) for x in a.split()] for a in sys.argv[9:13])
dcpu = dict(zip(("plain", "tls_token", "mtls"), ([float(x) for x in a.split()] for a in sys.argv[13:16])))
lcpu = dict(zip(("plain", "tls_token", "mtls"), ([float(x) for x in a.split()] for a in sys.argv[16:19])))
have_dcpu = sys.argv[19] == "1"  # a throwaway collectord whose /proc we read
comp_kernels, comp_s = (float(x) for x in sys.argv[20].split())
me, mr = statistics.median(e2e), statistics.median(raw)
ratio = me / mr if mr > 0 else 0.0
note = "  [quick: not a measurement]" if quick else ""


def line(label, xs):
    print(f"  {label:<44} median {statistics.median(xs):>11,.0f} events/s  "
          f"spread {min(xs):,.0f}..{max(xs):,.0f}  {[round(x) for x in xs]}", file=sys.stderr)


print(f"bench/ingest: {ranks} ranks x {steps} steps x {kernels} kernels/step = {events} events per run, "
      f"{reps} reps each", file=sys.stderr)
line("end-to-end plain (loadgen -> collectord -> PG)", e2e)
line("raw COPY baseline", raw)
print(f"  ratio e2e/raw {ratio:.2f} (target >= 0.5, aim 0.8){note}", file=sys.stderr)
out = {"bench": "ingest", "quick": quick, "ranks": ranks, "steps": steps,
       "kernels_per_step": kernels, "reps": reps, "events": events,
       "e2e_events_per_s": e2e, "raw_events_per_s": raw,
       "e2e_median": me, "raw_median": mr, "ratio": round(ratio, 3)}
for name, xs, label in (("tls_token", token, "end-to-end TLS + agent token"),
                        ("mtls", mtls, "end-to-end mutual TLS (agent certificate)")):
    if not xs:
        continue
    m = statistics.median(xs)
    r = m / me if me > 0 else 0.0
    paired = statistics.median(x / p for x, p in zip(xs, e2e) if p > 0)
    line(label, xs)
    print(f"    ratio {name}/plain {r:.3f} of the medians, {paired:.3f} the median of each rep's{note}",
          file=sys.stderr)
    out.update({f"{name}_events_per_s": xs, f"{name}_median": m,
                f"ratio_{name}_plain": round(r, 3), f"ratio_{name}_plain_paired": round(paired, 3)})
print("  CPU per million events (median; collectord's from /proc, loadgen's from getrusage):",
      file=sys.stderr)
for name in ("plain", "tls_token", "mtls"):
    if not lcpu[name]:
        continue
    d = statistics.median(dcpu[name]) * 1e6 / events if have_dcpu else None
    g = statistics.median(lcpu[name]) * 1e6 / events
    dtxt = f"{d:.3f} s" if d is not None else "n/a"
    print(f"    {name:<10} collectord {dtxt:>9}  loadgen {g:.3f} s", file=sys.stderr)
    out.update({f"{name}_collectord_cpu_s_per_mevent": None if d is None else round(d, 4),
                f"{name}_loadgen_cpu_s_per_mevent": round(g, 4)})
print(f"  stored bytes per kernel: as rows (raw COPY) {raw_bpk}, after the run ended (chunks) {e2e_bpk}",
      file=sys.stderr)
# The compaction's time against the raw COPY's time for one run's events (median rate).
comp_share = comp_s / (events / mr) if mr > 0 and events > 0 else 0.0
comp_rate = comp_kernels / comp_s if comp_s > 0 else 0.0
print(f"  compaction at the run's end: {comp_kernels:,.0f} kernels in {comp_s:.3f} s "
      f"({comp_rate:,.0f} kernels/s), {comp_share:.2f}x a raw COPY of the run's events; "
      f"e2e/raw counting it {me / mr / (1 + comp_share * me / mr) if mr > 0 else 0:.2f}{note}",
      file=sys.stderr)
out.update({"kernel_bytes_per_row_raw": raw_bpk, "kernel_bytes_per_kernel_e2e": e2e_bpk,
            "compaction_kernels": comp_kernels, "compaction_s": round(comp_s, 4),
            "compaction_kernels_per_s": round(comp_rate), "compaction_vs_raw_copy": round(comp_share, 3)})
print(json.dumps(out))
EOF
