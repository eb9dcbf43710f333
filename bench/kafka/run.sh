#!/usr/bin/env bash
# bench/kafka: the scale-out ingest path (Kafka between the collectord replicas and the sink
# consumers) against the direct path (one collectord writing PostgreSQL) and a raw COPY of the
# same rows, in one run on one throwaway PostgreSQL (bench/stack.sh).
#
#   (k) kafka:  P kprof-loadgen processes (--ranks R each, their own run each), split over two
#               kprof-collectord --sink kafka replicas -> kprof-kafka-mock (3 brokers, 32
#               partitions) -> two kprof-collectord --role sink in one consumer group ->
#               PostgreSQL. Done when PostgreSQL holds every batch loadgen sent (ingest_batches
#               polled every 50 ms); loadgen's own end (Kafka's acks) is reported beside it.
#   (d) direct: the same P loadgens against bench/stack.sh's collectord (--sink postgres);
#               its acks mean committed, and the same poll ends it.
#   (c) copy:   P kprof-bench-copy runs one after the other (bench/ingest/copybench.c), the
#               same rows (same seed, steps and start as each loadgen), COPY on one
#               connection; events / the sum of their own timed seconds (their setup, the
#               names lookup, is not timed). Not at once: two of them deadlock in PostgreSQL
#               (one creates its run's partitions while the other COPYs into the parents).
# events/s of (k) and (d): all events / (last batch committed, as the poll saw it - the first
# batch any loadgen handed to its push). Latency (k, d): per batch, PostgreSQL's commit time
# of its ingest_batches row (pg_xact_commit_timestamp(xmin): the run turns
# track_commit_timestamp on) - the CLOCK_REALTIME at which loadgen's kp_push_send took it
# (kprof-loadgen --send-log); p50, p99, max. Both clocks are this machine's. Memory: VmHWM (peak
# RSS) of each daemon from /proc at the end of its path (the direct collectord's includes its
# warm-up). Correctness, per path and run: rows and sum(dur_ns) per rank and kind equal what
# loadgen (or copybench) generated, ingest_batches holds each sent (stream, seq) exactly once
# and no other, and the sinks counted no duplicate, rejected or malformed record; otherwise
# the bench fails.
#
# What the mock does to the figures: kprof-kafka-mock is librdkafka's mock cluster in one
# process on loopback. It keeps the records in memory (no disk, no fsync), "replicates" by
# bookkeeping only (acks=all costs no second broker's write), and its three brokers share that
# process's threads and this machine's cores with everything else. A real cluster adds disk
# and network round trips to (k)'s latency, and takes the brokers' CPU off this machine. The
# mock keeps only the newest few MiB of each partition (seen here: 4 MiB a partition kept, 20
# MiB not; librdkafka's mock sizes it, kprof-kafka-mock sets nothing):
# what the producers push faster than the sinks read must fit that, or the mock drops records
# before they are read (the sinks log them as deleted by the topic's retention and count
# them in kafka_records_lost_total: those batches are lost, and the bench fails at once). A partition holds the batches of the
# run/rank keys that hash to it (each key about 12 KiB a step with 100 kernels a step), so
# the defaults keep each key under 1 MiB and have as many partitions as keys; --scale grows
# both. The sinks run with collectord's librdkafka settings unless --sink-property says
# otherwise (README.md: "The consumer's fetch wait"). The runs are created before the timed
# push, so that creating them is not timed.
#
# usage: bench/kafka/run.sh [--quick] [--build DIR] [--producers P] [--ranks R] [--steps S]
#                           [--kernels-per-step K] [--partitions N] [--scale X]
#                           [--sink-property K=V]...
#   --quick    a smoke run (2 producers x 2 ranks, 10 steps): checks the pipeline, not speed
#   --scale X  multiplies --ranks and the partitions (default KPROF_BENCH_SCALE, else 1)
#   --sink-property K=V  a librdkafka property for the sinks (--kafka-property), repeatable
# Environment: KPROF_BUILD_DIR as in bench/ingest; always a throwaway PostgreSQL (the Kafka
# path needs track_commit_timestamp and its own daemons). Output: a human summary on stderr,
# one JSON line on stdout. Runtime with the defaults: about 60 s on 2 shared cores.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${KPROF_BUILD_DIR:-}
producers=4
ranks=8
steps=60
kernels=100
scale=${KPROF_BENCH_SCALE:-1}
quick=0
partitions=32
topic=kprof.batches
sink_props=

die() {
    echo "bench/kafka: $*" >&2
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 producers=2 ranks=2 steps=10 kernels=50 partitions=4 ;;
    --build) build=$2; shift ;;
    --producers) producers=$2; shift ;;
    --ranks) ranks=$2; shift ;;
    --steps) steps=$2; shift ;;
    --kernels-per-step) kernels=$2; shift ;;
    --scale) scale=$2; shift ;;
    --partitions) partitions=$2; shift ;;
    --sink-property) sink_props=${sink_props:+$sink_props;}$2; shift ;;
    -h | --help) sed -n '2,54p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
    shift
done
for v in producers ranks steps kernels scale partitions; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--$v must be a positive integer"
done
# More keys (run/rank) and partitions, not longer streams: the mock keeps about 5 MiB a
# partition (see the header), and the producers outrun the sinks.
ranks=$((ranks * scale))
partitions=$((partitions * scale))
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
mock=$build/tools/kprof-kafka-mock
for b in "$loadgen" "$copy" "$collectord" "$mock"; do
    [ -x "$b" ] || die "$b is missing; build it (kprof-kafka-mock needs librdkafka)"
done
py=/usr/bin/python3
[ -x "$py" ] || py=python3
command -v psql >/dev/null || die "psql is needed"
[ -z "${KPROF_BENCH_PG:-}" ] ||
    echo "bench/kafka: KPROF_BENCH_PG is ignored: this bench needs its own PostgreSQL" >&2
unset KPROF_BENCH_PG KPROF_COLLECTOR

work=$(mktemp -d /tmp/kprof-bench-kafka.XXXXXX)
pgdir=/tmp/kprof-bench-pg.$$
pgport=$((5500 + $$ % 400))
bench=bench/kafka
# shellcheck source=../stack.sh
. "$root/bench/stack.sh"

# The Kafka daemons, stopped by pid before bench/stack.sh's cleanup (the sinks before the
# mock, or they log its disappearance).
kpids=()
mockpid=
kafka_cleanup() {
    local p
    for p in "${kpids[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${kpids[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    if [ -n "$mockpid" ]; then
        exec 7>&- # end of stdin: the mock exits
        kill -TERM "$mockpid" 2>/dev/null || true
        wait "$mockpid" 2>/dev/null || true
    fi
    bench_stack_cleanup
}
trap kafka_cleanup EXIT

bench_pg_settings=("track_commit_timestamp = on")
bench_stack_up
direct_addr=$addr

sql() { psql "$pg" -qtAX -v ON_ERROR_STOP=1 -c "$1"; }
field() { "$py" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
hwm_kib() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status" 2>/dev/null || echo 0; }

# Waits for KEY= in a ready file (pid, file, key, log, name) and prints its value.
wait_key() {
    for _ in $(seq 1 300); do
        grep -q "^$3=" "$2" 2>/dev/null && break
        kill -0 "$1" 2>/dev/null || { cat "$4" >&2; die "$5 exited"; }
        sleep 0.1
    done
    grep -q "^$3=" "$2" 2>/dev/null || { cat "$4" >&2; die "$5 did not get ready in 30 s"; }
    sed -n "s/^$3=//p" "$2"
}

# --- the Kafka side: mock cluster, two replicas, two sinks ---------------------------------
mkfifo "$work/mock.in"
"$mock" --brokers 3 --partitions "$partitions" --topic "$topic" --ready-file "$work/mock.ready" \
    <"$work/mock.in" >"$work/mock.out" 2>"$work/mock.log" &
mockpid=$!
exec 7>"$work/mock.in"
bootstrap=$(wait_key "$mockpid" "$work/mock.ready" bootstrap "$work/mock.log" kprof-kafka-mock)

rep_addr=()
rep_pid=()
for i in 0 1; do
    "$collectord" --sink kafka --kafka-brokers "$bootstrap" --kafka-topic "$topic" \
        --listen 127.0.0.1:0 --http-listen "" --pg-conninfo "$pg" --plaintext --allow-anonymous \
        --open-run-timeout 0 --ready-file "$work/replica$i.ready" --log-level warn \
        >"$work/replica$i.log" 2>&1 &
    kpids+=($!)
    rep_pid+=($!)
    rep_addr+=("$(bench_wait_ready "$!" "$work/replica$i.ready" "$work/replica$i.log" "replica $i")")
done
sink_http=()
sink_pid=()
for i in 0 1; do
    # A dead member leaves the group in seconds (as in tests/it/test_kafka_sink.py).
    "$collectord" --role sink --kafka-brokers "$bootstrap" --kafka-topic "$topic" \
        --kafka-group kprof-bench --kafka-property "session.timeout.ms=6000;heartbeat.interval.ms=500${sink_props:+;$sink_props}" \
        --http-listen 127.0.0.1:0 --pg-conninfo "$pg" --ready-file "$work/sink$i.ready" \
        --log-level warn >"$work/sink$i.log" 2>&1 &
    kpids+=($!)
    sink_pid+=($!)
    sink_http+=("$(wait_key "$!" "$work/sink$i.ready" http "$work/sink$i.log" "sink $i")")
done

# The sinks' counters, summed: "stored duplicate rejected malformed assigned_partitions pauses
# rebalances fewest_partitions_of_one_sink".
sink_counters() {
    "$py" - "${sink_http[@]}" <<'EOF'
import re, sys, urllib.request
tot = {"stored": 0, "duplicate": 0, "rejected": 0, "malformed": 0, "pauses": 0, "rebalances": 0}
parts, fewest = 0, 1 << 30
for a in sys.argv[1:]:
    try:
        body = urllib.request.urlopen("http://%s/metrics" % a, timeout=5).read().decode()
    except OSError:
        print("-1 0 0 0 0 0 0 0")
        sys.exit(0)
    for k in tot:
        m = re.search(r"^kprof_collectord_kafka_records_%s_total (\d+)$" % k, body, re.M)
        tot[k] += int(m.group(1)) if m else 0
    mine = len(re.findall(r"^kprof_collectord_kafka_consumer_lag\{", body, re.M))
    parts += mine
    fewest = min(fewest, mine)
print(tot["stored"], tot["duplicate"], tot["rejected"], tot["malformed"], parts, tot["pauses"],
      tot["rebalances"], fewest)
EOF
}

# --- loadgen, polling, checks --------------------------------------------------------------
common=(--ranks "$ranks" --steps "$steps" --kernels-per-step "$kernels" --seed 1
    --start-ns 1700000000000000000)

# Polls until ingest_batches holds $2 rows of runs $1 (comma list); prints CLOCK_REALTIME ns
# of the poll that saw them. Fails after 120 s without progress.
wait_batches() {
    local n last=-1 since
    since=$(date +%s)
    while :; do
        n=$(sql "SELECT count(*) FROM ingest_batches WHERE run_id IN ($1)")
        if grep -qs "deleted by the topic's retention" "$work"/sink*.log; then
            grep -hs "deleted by the topic's retention" "$work"/sink*.log | head -3 >&2
            die "the mock cluster dropped records before the sinks read them (it keeps ~5 MiB a partition): lower --steps or --kernels-per-step"
        fi
        if [ "$n" -ge "$2" ]; then
            date +%s%N
            return 0
        fi
        if [ "$n" != "$last" ]; then
            last=$n
            since=$(date +%s)
        elif [ $(($(date +%s) - since)) -ge 120 ]; then
            die "PostgreSQL holds $n of $2 batches and has made no progress for 120 s"
        fi
        sleep 0.05
    done
}

# Checks that PostgreSQL holds exactly what loadgen JSON $1 says it sent into run $2, and, with
# a send log $3, each of its (rank, stream, seq) once in ingest_batches and no other.
check_run() {
    local json=$1 run=$2 t q
    for t in kernel:kernels memcpy:memcpys memset:memsets api:api_calls op:ops step:steps \
        counter:counters collective:collectives sync:syncs memory:memory_events; do
        q="SELECT rank, count(*), coalesce(sum(dur_ns), 0) FROM ${t#*:} WHERE run_id = $run GROUP BY rank"
        case ${t%%:*} in counter | memory) # instants: no dur_ns
            q="SELECT rank, count(*), 0 FROM ${t#*:} WHERE run_id = $run GROUP BY rank" ;;
        esac
        sql "$q" | sed "s/^/${t%%:*}|/"
    done >"$work/got.$run"
    if [ -n "${3:-}" ]; then
        sql "SELECT rank, stream, seq FROM ingest_batches WHERE run_id = $run" >"$work/keys.$run"
    fi
    "$py" - "$json" "$work/got.$run" "${3:-}" "$work/keys.$run" <<'EOF'
import json, sys
exp = json.load(open(sys.argv[1]))
got = {}
for line in open(sys.argv[2]):
    kind, rank, rows, dur = line.strip().split("|")
    got[(kind, int(rank))] = (int(rows), int(dur))
bad = []
want = set()
for r in exp["expected"]:
    for kind, v in r["kinds"].items():
        g = got.pop((kind, r["rank"]), (0, 0))
        if g != (v["rows"], v["dur_ns"]):
            bad.append(f"rank {r['rank']} {kind}: stored (rows, dur_ns) {g}, sent {(v['rows'], v['dur_ns'])}")
bad += [f"rank {k[1]} {k[0]}: stored {v}, sent nothing" for k, v in got.items() if v[0]]
if sys.argv[3]:
    sent = [tuple(l.split()[1:4]) for l in open(sys.argv[3])]
    stored = [tuple(l.strip().split("|")) for l in open(sys.argv[4]) if l.strip()]
    if len(sent) != exp["batches"]:
        bad.append(f"the send log has {len(sent)} batches, loadgen says {exp['batches']}")
    lost, extra = set(sent) - set(stored), set(stored) - set(sent)
    if lost or extra or len(stored) != len(set(stored)):
        bad.append(f"ingest_batches: {len(lost)} sent batches missing, {len(extra)} not sent, "
                   f"{len(stored) - len(set(stored))} twice")
if bad:
    print(f"bench/kafka: run {exp['run_id']}: PostgreSQL does not hold what was sent:\n  "
          + "\n  ".join(bad[:10]), file=sys.stderr)
    sys.exit(1)
EOF
}

# Commit time (CLOCK_REALTIME ns, from PostgreSQL's commit timestamps) of every batch of runs
# $1 into file $2: "run rank stream seq ns".
commit_times() {
    sql "SELECT run_id, rank, stream, seq,
                (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1e9)::bigint
           FROM ingest_batches WHERE run_id IN ($1)" | tr '|' ' ' >"$2"
}

# One path: P loadgens against the addresses in $2.. (round robin), label $1. Sets
# <label>_runs (comma list), and writes $work/<label>.{p<i>.json,p<i>.send,t_end,commit}.
push_path() {
    local label=$1 i a pids=() runs=() batches=0
    shift
    local addrs=("$@") rid=()
    # The runs first, untimed (a loadgen of 0 steps creates one and sends nothing).
    for i in $(seq 0 $((producers - 1))); do
        "$loadgen" --collector "${addrs[$((i % ${#addrs[@]}))]}" "${common[@]}" --steps 0 --json \
            --no-end-run --job "bench-kafka-$label" >"$work/$label.c$i.json" ||
            die "kprof-loadgen could not create run $i ($label)"
        rid+=("$(field "$work/$label.c$i.json" run_id)")
    done
    for i in $(seq 0 $((producers - 1))); do
        a=${addrs[$((i % ${#addrs[@]}))]}
        # --no-end-run: a run ended while its batches wait in Kafka would turn them away.
        "$loadgen" --collector "$a" "${common[@]}" --run-id "${rid[$i]}" --json --no-end-run \
            --give-up 120s --send-log "$work/$label.p$i.send" \
            >"$work/$label.p$i.json" 2>"$work/$label.p$i.err" &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { cat "$work/$label.p$i.err" >&2; die "kprof-loadgen $i failed ($label)"; }
    done
    for i in $(seq 0 $((producers - 1))); do
        runs+=("$(field "$work/$label.p$i.json" run_id)")
        batches=$((batches + $(field "$work/$label.p$i.json" batches)))
    done
    local list
    list=$(
        IFS=,
        echo "${runs[*]}"
    )
    wait_batches "$list" "$batches" >"$work/$label.t_end"
    commit_times "$list" "$work/$label.commit"
    for i in $(seq 0 $((producers - 1))); do
        check_run "$work/$label.p$i.json" "${runs[$i]}" "$work/$label.p$i.send" ||
            die "$label: the stored rows differ from the sent ones"
    done
    printf -v "${label}_runs" %s "$list"
}

# --- warm-up: names, the consumer group's assignment, the first connections ----------------
echo "bench/kafka: $producers producers x $ranks ranks x $steps steps x $kernels kernels/step, $partitions partitions; warm-up" >&2
wruns=()
for a in "$direct_addr" "${rep_addr[@]}"; do
    "$loadgen" --collector "$a" "${common[@]}" --ranks 1 --steps 2 --json --no-end-run \
        --job bench-kafka-warmup >"$work/warm.json" || die "the warm-up push to $a failed"
    wruns+=("$(field "$work/warm.json" run_id)")
    wb=$(field "$work/warm.json" batches)
    wait_batches "${wruns[-1]}" "$wb" >/dev/null
done
for _ in $(seq 1 300); do
    # every partition assigned, and to both sinks (not all to the first while the second joins)
    read -r _ _ _ _ assigned _ _ fewest < <(sink_counters)
    [ "$assigned" -ge "$partitions" ] && [ "$fewest" -gt 0 ] && break
    sleep 0.1
done
[ "$assigned" -ge "$partitions" ] || die "the two sinks hold $assigned of $partitions partitions after 30 s"
read -r base_stored base_dup base_rej base_mal _ base_pauses base_reb _ < <(sink_counters)
for r in "${wruns[@]}"; do
    sql "SELECT kp_drop_run($r)" >/dev/null
done

# --- the three paths -------------------------------------------------------------------------
echo "bench/kafka: kafka path (${#rep_addr[@]} replicas, $partitions partitions, 2 sinks)" >&2
push_path kafka "${rep_addr[@]}"
read -r k_stored k_dup k_rej k_mal _ k_pauses k_reb _ < <(sink_counters)
[ $((k_dup - base_dup)) = 0 ] && [ $((k_rej - base_rej)) = 0 ] && [ $((k_mal - base_mal)) = 0 ] ||
    die "the sinks counted $((k_dup - base_dup)) duplicate, $((k_rej - base_rej)) rejected, $((k_mal - base_mal)) malformed records"
declare -A hwm
hwm[replica0]=$(hwm_kib "${rep_pid[0]}")
hwm[replica1]=$(hwm_kib "${rep_pid[1]}")
hwm[sink0]=$(hwm_kib "${sink_pid[0]}")
hwm[sink1]=$(hwm_kib "${sink_pid[1]}")
hwm[mock]=$(hwm_kib "$mockpid")

echo "bench/kafka: direct path (one collectord --sink postgres)" >&2
push_path direct "$direct_addr"
hwm[direct]=$(hwm_kib "$cpid")

echo "bench/kafka: raw COPY ($producers kprof-bench-copy, one after the other)" >&2
for i in $(seq 0 $((producers - 1))); do
    "$copy" --pg-conninfo "$pg" "${common[@]}" --job bench-kafka-copy --no-drop \
        >"$work/copy.p$i.json" 2>"$work/copy.p$i.err" ||
        { cat "$work/copy.p$i.err" >&2; die "kprof-bench-copy $i failed"; }
done
for i in $(seq 0 $((producers - 1))); do
    # the same rows as loadgen's: check them against the direct path's JSON of producer i
    "$py" -c "import json,sys; d=json.load(open(sys.argv[1])); d['run_id']=int(sys.argv[2]); print(json.dumps(d))" \
        "$work/direct.p$i.json" "$(field "$work/copy.p$i.json" run_id)" >"$work/copy.p$i.expect"
    check_run "$work/copy.p$i.expect" "$(field "$work/copy.p$i.json" run_id)" ||
        die "copy: the stored rows differ from the generated ones"
done

"$py" - "$work" "$producers" "$ranks" "$steps" "$kernels" "$quick" \
    "${hwm[replica0]}" "${hwm[replica1]}" "${hwm[sink0]}" "${hwm[sink1]}" "${hwm[mock]}" \
    "${hwm[direct]}" "$((k_stored - base_stored))" "$((k_pauses - base_pauses))" "$partitions" "$((k_reb - base_reb))" "$sink_props" <<'EOF'
import glob, json, os, sys
work = sys.argv[1]
producers, ranks, steps, kernels = (int(x) for x in sys.argv[2:6])
quick = sys.argv[6] == "1"
hwm = dict(zip(("replica0", "replica1", "sink0", "sink1", "mock", "direct"),
               (int(x) for x in sys.argv[7:13])))
stored, pauses, partitions, rebalances = (int(x) for x in sys.argv[13:17])
sink_props = sys.argv[17]
note = "  [quick: not a measurement]" if quick else ""


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def path(label):
    sends = {}
    for f in glob.glob(os.path.join(work, label + ".p*.send")):
        for line in open(f):
            run, rank, stream, seq, ns = line.split()
            sends[(run, rank, stream, seq)] = int(ns)
    commits = {}
    for line in open(os.path.join(work, label + ".commit")):
        run, rank, stream, seq, ns = line.split()
        commits[(run, rank, stream, seq)] = int(ns)
    lat = [(commits[k] - t) / 1e6 for k, t in sends.items()]
    js = [json.load(open(f)) for f in glob.glob(os.path.join(work, label + ".p*.json"))]
    events = sum(j["events"] for j in js)
    t0 = min(sends.values())
    t_end = int(open(os.path.join(work, label + ".t_end")).read())
    secs = (t_end - t0) / 1e9
    # when the batches landed: seconds after the first push by which 10/50/90/100 % committed
    cs = sorted(commits[k] for k in sends)
    landed = [round((pct(cs, q) - t0) / 1e9, 2) for q in (10, 50, 90, 100)]
    return {"events": events, "batches": len(sends), "seconds": round(secs, 3),
            "events_per_s": round(events / secs, 1),
            "loadgen_seconds_max": max(j["seconds"] for j in js),
            "latency_ms_p50": round(pct(lat, 50), 2), "latency_ms_p99": round(pct(lat, 99), 2),
            "latency_ms_max": round(max(lat), 2), "committed_10_50_90_100_pct_at_s": landed}


k, d = path("kafka"), path("direct")
cj = [json.load(open(f)) for f in glob.glob(os.path.join(work, "copy.p*.json"))]
c = {"events": sum(j["events"] for j in cj), "seconds": round(sum(j["seconds"] for j in cj), 3)}
c["events_per_s"] = round(c["events"] / c["seconds"], 1)
assert k["events"] == d["events"] == c["events"], (k["events"], d["events"], c["events"])
if stored != k["batches"]:
    print(f"bench/kafka: the sinks stored {stored} records, loadgen sent {k['batches']} batches",
          file=sys.stderr)
    sys.exit(1)
r = lambda a, b: round(a / b, 3) if b > 0 else 0.0
out = {"bench": "kafka", "quick": quick, "producers": producers, "ranks_per_producer": ranks,
       "steps": steps, "kernels_per_step": kernels, "events": k["events"],
       "kafka": k, "direct": d, "copy": c,
       "ratio_kafka_direct": r(k["events_per_s"], d["events_per_s"]),
       "ratio_kafka_copy": r(k["events_per_s"], c["events_per_s"]),
       "ratio_direct_copy": r(d["events_per_s"], c["events_per_s"]),
       "partitions": partitions, "sink_pauses": pauses, "sink_rebalances": rebalances, "sink_properties": sink_props, "vmhwm_kib": hwm,
       "mock": "librdkafka mock cluster: one process, loopback, records in memory, no disk, "
               "no fsync, replication by bookkeeping only"}
e = sys.stderr
print(f"bench/kafka: {producers} producers x {ranks} ranks x {steps} steps x {kernels} kernels/step "
      f"= {k['events']} events, {k['batches']} batches per path; {partitions} partitions, the sinks "
      f"paused {pauses} times (queue full), rebalanced {rebalances} times; sink properties: "
      f"{sink_props or 'the defaults'}", file=e)
for name, p, what in (("kafka", k, "loadgen -> 2 replicas -> mock Kafka -> 2 sinks -> PG"),
                      ("direct", d, "loadgen -> 1 collectord -> PG")):
    print(f"  {name:<7} {p['events_per_s']:>11,.0f} events/s  {p['seconds']:7.2f} s first push to last "
          f"commit ({what}); loadgen done after {p['loadgen_seconds_max']:.2f} s", file=e)
    print(f"          latency push -> commit  p50 {p['latency_ms_p50']:.1f} ms  p99 "
          f"{p['latency_ms_p99']:.1f} ms  max {p['latency_ms_max']:.1f} ms; 10/50/90/100 % of the "
          f"batches committed {p['committed_10_50_90_100_pct_at_s']} s after the first push", file=e)
print(f"  copy    {c['events_per_s']:>11,.0f} events/s  {c['seconds']:7.2f} s ({producers} raw COPYs "
      f"of one producer's rows each, one connection, one after the other)", file=e)
print(f"  ratios  kafka/direct {out['ratio_kafka_direct']:.2f}  kafka/copy {out['ratio_kafka_copy']:.2f}  "
      f"direct/copy {out['ratio_direct_copy']:.2f}{note}", file=e)
print("  peak RSS (VmHWM): " + "  ".join(f"{n} {v / 1024:.0f} MiB" for n, v in hwm.items()), file=e)
print("  correctness: every path's rows equal the sent ones; 0 lost, 0 duplicated", file=e)
print("  note: the Kafka is librdkafka's mock cluster (in-process, loopback, in memory, no disk,\n"
      "        no fsync, no real replication): a real cluster adds latency and takes CPU elsewhere",
      file=e)
print(json.dumps(out))
EOF
