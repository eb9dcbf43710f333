"""kprofctl export against the real kprof-collectord and PostgreSQL: the import -> export ->
import round trip.
  1. Peer traces (the HTA 2-rank pair, HTA's ns-resolution rank, a tbplugin ResNet50 trace and
     every tbplugin case) are imported, the run is exported (one file per rank into a
     directory, or one file, gzip or not), each exported file is checked as a Chrome trace
     (json.load; every event has ph/ts/pid/tid; X durations >= 0; ts and dur with 3 decimals;
     every ac2g s has its f with the same id, s on an API call's start and f on a GPU
     activity's start; metadata names every track), the export is imported again and the two
     runs are compared table by table: row counts and the multisets of every column that
     import fills (names as text; NULL read as import's default, since whether an all-default
     column is sent as NULL depends on the batch) must be equal, devices and ranks included,
     and each rank's time base (ranks.time_base_ns: the trace's baseTimeNanoseconds) comes
     back as it was; a rank without one gets the base the export wrote.
     A two-rank trace of its own with bases that have sub-µs digits and fractional-µs ts: the
     export writes each rank's base and its ts relative to it (the original's very ts), and
     HTA's temporal figures (kprofctl hta temporal, rounding the trace's own relative µs) of
     the re-imported run equal the original's.
  2. A captured-style run (kprof-loadgen's synthetic DDP traffic, 2 ranks) is exported: every
     GPU row's External id names an op's External id, every GPU activity with a launching API
     call has its ac2g flow, and the event counts per category equal the rows in PostgreSQL.
  3. Errors: unknown run (exit 3), a rank not in the run (3), several ranks into one file (2),
     missing --run (2), PostgreSQL unreachable (1), an unwritable output (1, nothing left
     behind).
Prints the export rate (MB/s of JSON) for the biggest peer trace."""
import collections
import decimal
import glob
import gzip
import json
import os
import random
import re
import subprocess
import tempfile

import kpfix

kpfix.require_env()

DB = "kp_it_export"
PEERS = os.environ.get("KPROF_PEERS_DIR") or os.path.join(
    os.environ.get("KPROF_SOURCE_DIR", "."), "tests", "data", "peers")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
ANALYZER = os.path.join(kpfix.BIN, "analyzer", "kprof-analyzer")
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
D = decimal.Decimal
US3 = re.compile(r'"(ts|dur)": (-?\d+\.\d{3})[,}]')

# Per table: the columns import fills, each as an SQL expression over t (names joined as text,
# NULL read as import's default).
NM = "coalesce((SELECT name FROM names WHERE id = t.%s), '')"
# A memcpy's or memset's bandwidth as kprof-hta reads it (migration 0010): the trace's figure,
# else bytes / ns (what export writes when the import kept none).
BW = "coalesce(bandwidth_gbps, bytes::float8 / nullif(dur_ns, 0))::text"
COLS = {
    "kernels": ["start_ns", "dur_ns", NM % "name", "coalesce(device, 0)", "coalesce(stream, 0)",
                "coalesce(context, 0)", "coalesce(correlation, 0)", "coalesce(external_id, 0)",
                "coalesce(grid_x, 0)", "coalesce(grid_y, 0)", "coalesce(grid_z, 0)",
                "coalesce(block_x, 0)", "coalesce(block_y, 0)", "coalesce(block_z, 0)",
                "coalesce(registers, 0)", "coalesce(static_smem, 0) + coalesce(dynamic_smem, 0)",
                "coalesce(graph_id, 0)", "coalesce(graph_node_id, 0)",
                "coalesce(blocks_per_sm::text, '')", "coalesce(est_occupancy::text, '')"],
    "memcpys": ["start_ns", "dur_ns", "coalesce(bytes, 0)", "coalesce(copy_kind, 0)",
                "coalesce(src_kind, 0)", "coalesce(dst_kind, 0)", "coalesce(device, 0)",
                "coalesce(context, 0)", "coalesce(stream, 0)", "coalesce(correlation, 0)",
                "coalesce(external_id, 0)", "coalesce(src_device, 0)", "coalesce(dst_device, 0)",
                BW],
    "memsets": ["start_ns", "dur_ns", "coalesce(bytes, 0)", "coalesce(mem_kind, 0)",
                "coalesce(device, 0)", "coalesce(context, 0)", "coalesce(stream, 0)",
                "coalesce(correlation, 0)", "coalesce(external_id, 0)", BW],
    "api_calls": ["start_ns", "dur_ns", "coalesce(domain, 0)", "coalesce(cbid, 0)", NM % "name",
                  "coalesce(tid, 0)", "coalesce(correlation, 0)", "coalesce(external_id, 0)"],
    "ops": ["start_ns", "dur_ns", NM % "name", "coalesce(kind, 0)", "coalesce(tid, 0)",
            "coalesce(op_id, 0)", "coalesce(parent_id, 0)", "coalesce(seq, -1)",
            "coalesce(fwd_tid, 0)", NM % "input_shapes", NM % "input_dtypes",
            "coalesce(external_id, 0)", "coalesce(device, -1)", "coalesce(stream, 0)"],
    "steps": ["start_ns", "step", "dur_ns"],
    "collectives": ["start_ns", "dur_ns", NM % "name", "coalesce(in_nelems, 0)",
                    "coalesce(out_nelems, 0)", NM % "dtype", "coalesce(group_size, 0)",
                    NM % "process_group", "coalesce(coll_seq, 0)", "coalesce(external_id, 0)",
                    "coalesce(tid, 0)"],
    "syncs": ["start_ns", "dur_ns", "coalesce(sync_type, 0)", "coalesce(device, 0)",
              "coalesce(context, 0)", "coalesce(stream, 0)", "coalesce(cuda_event, 0)",
              "coalesce(correlation, 0)"],
    "devices": ["id", "name", "coalesce(global_memory_bytes, 0)", "coalesce(sm_count, 0)",
                "coalesce(max_threads_per_block, 0)", "coalesce(max_threads_per_sm, 0)",
                "coalesce(regs_per_sm, 0)", "coalesce(regs_per_block, 0)",
                "coalesce(smem_per_sm, 0)", "coalesce(smem_per_block, 0)",
                "coalesce(warp_size, 0)", "coalesce(cc_major, 0)", "coalesce(cc_minor, 0)"],
    "ranks": ["coalesce(host, '')", "coalesce(pid, 0)", "coalesce(device, 0)",
              "coalesce(distributed_info, '')"],
    "counters": ["coalesce(correlation, 0)", "value", NM % "metric", "coalesce(device, 0)"],
    "kernel_occupancy": ["start_ns", "correlation", "stream", "device", "blocks_per_sm::text",
                         "est_occupancy::text"],
}
# Tables read through a join: kernels with their occupancy figures (migration 0006).
FROM = {
    "kernels": "(SELECT k.*, o.blocks_per_sm, o.est_occupancy FROM kernels k "
               "LEFT JOIN kernel_occupancy o ON o.run_id = k.run_id AND o.rank = k.rank "
               "AND o.start_ns = k.start_ns AND o.correlation = coalesce(k.correlation, 0) "
               "AND o.stream = coalesce(k.stream, 0) AND o.device = coalesce(k.device, 0))",
}
for _kind in ("memcpy", "memset"):
    FROM[_kind + "s"] = (
        "(SELECT m.*, b.bandwidth_gbps FROM %ss m LEFT JOIN %s_bandwidth b ON b.run_id = "
        "m.run_id AND b.rank = m.rank AND b.start_ns = m.start_ns AND b.correlation = "
        "coalesce(m.correlation, 0) AND b.stream = coalesce(m.stream, 0) AND b.device = "
        "coalesce(m.device, 0))" % (_kind, _kind))
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HAS_MEMORY = False


def run(cmd, ok=True, timeout=300):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * kpfix.SCALE)
    if ok and p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s" % (cmd, p.returncode, p.stderr))
    for bad in ("Sanitizer", "runtime error:"):
        assert bad not in p.stderr, p.stderr
    return p


def kimport(*args):
    p = run([KPROFCTL, "import", "--collector", COLLECTOR, "--json", "--progress", "off"] +
            list(args))
    return json.loads(p.stdout)


def kexport(run_id, out, *extra, ok=True, analyzer=None):
    return run([KPROFCTL, "export", "--run", str(run_id), "-o", out, "--analyzer",
                analyzer if analyzer is not None else AN.grpc] + list(extra), ok=ok)


class Analyzer:
    """kprof-analyzer (which serves Analyzer.Export) on 127.0.0.1:0."""

    def __init__(self, name, conninfo):
        d = os.path.join(kpfix.TEST_DIR, name)
        os.makedirs(d, exist_ok=True)
        self.ready = os.path.join(d, "ready")
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.log_path = os.path.join(d, "analyzer.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [ANALYZER, "--listen", "127.0.0.1:0", "--http-listen", "", "--pg-conninfo", conninfo,
             "--ready-file", self.ready], stdout=self.log, stderr=subprocess.STDOUT)
        kpfix.wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30,
                       "kprof-analyzer ready")
        assert self.proc.poll() is None, open(self.log_path).read()
        addrs = dict(l.strip().split("=", 1) for l in open(self.ready) if "=" in l)
        self.grpc = addrs["grpc"]

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(timeout=60 * kpfix.SCALE)
        self.log.close()
        log = open(self.log_path).read()
        for bad in ("Sanitizer", "runtime error:"):
            assert bad not in log, log
        return rc


def ranks_of(run_id):
    return [int(r) for r in kpfix.psql("SELECT rank FROM ranks WHERE run_id = %d ORDER BY rank"
                                       % run_id, db=DB).split()]


def time_bases(run_id):
    """rank -> ranks.time_base_ns (None: NULL, the times are absolute)."""
    rows = kpfix.psql_rows("SELECT rank, coalesce(time_base_ns::text, '') FROM ranks WHERE "
                           "run_id = %d" % run_id, db=DB)
    return {int(r[0]): int(r[1]) if r[1] else None for r in rows}


def compare_runs(a, b, rank_map):
    """Every table of run a equals run b's, rank by rank (rank_map: a's rank -> b's)."""
    total = 0
    for ra, rb in rank_map.items():
        for table, cols in COLS.items():
            sel = ", ".join(cols)
            where = "run_id = %d AND rank = %d"
            src = FROM.get(table, table)
            qa = "SELECT %s FROM %s t WHERE %s" % (sel, src, where % (a, ra))
            qb = "SELECT %s FROM %s t WHERE %s" % (sel, src, where % (b, rb))
            na = int(kpfix.psql("SELECT count(*) FROM (%s) x" % qa, db=DB))
            nb = int(kpfix.psql("SELECT count(*) FROM (%s) x" % qb, db=DB))
            assert na == nb, "%s rank %d: %d rows in run %d, %d after the round trip" % (
                table, ra, na, a, nb)
            only_a = kpfix.psql_rows("(%s) EXCEPT ALL (%s) LIMIT 5" % (qa, qb), db=DB)
            only_b = kpfix.psql_rows("(%s) EXCEPT ALL (%s) LIMIT 5" % (qb, qa), db=DB)
            only_a = [str(r)[:300] for r in only_a]
            only_b = [str(r)[:300] for r in only_b]
            assert not only_a and not only_b, (
                "%s rank %d differs after the round trip (columns %s):\n only in run %d: %s\n"
                " only in run %d: %s" % (table, ra, cols, a, only_a, b, only_b))
            total += na
    return total


def load(path):
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            raw = f.read()
    else:
        with open(path, "rb") as f:
            raw = f.read()
    return raw, json.loads(raw, parse_float=D)


def check_chrome(path, run_id, rank):
    """Checks one exported file as a Chrome trace and against the run's rows."""
    raw, t = load(path)
    assert t["schemaVersion"] == 1 and t["displayTimeUnit"] == "ns", list(t)
    ws = int(kpfix.psql("SELECT world_size FROM runs WHERE id = %d" % run_id, db=DB))
    stored = kpfix.psql("SELECT coalesce(distributed_info, '') FROM ranks WHERE run_id = %d AND "
                        "rank = %d" % (run_id, rank), db=DB)
    imported = kpfix.psql("SELECT source FROM runs WHERE id = %d" % run_id, db=DB) == "2"
    if stored:  # the imported trace's own, pg_config and nccl_version included
        assert t["distributedInfo"] == json.loads(stored, parse_float=D), t["distributedInfo"]
    elif imported:  # the trace had none: none is invented
        assert "distributedInfo" not in t, t["distributedInfo"]
    elif ws > 1 or rank != 0:
        assert t["distributedInfo"]["rank"] == rank, t["distributedInfo"]
        assert t["distributedInfo"]["world_size"] == ws
    else:  # a one-rank run is not distributed: Kineto writes no distributedInfo for it
        assert "distributedInfo" not in t, t["distributedInfo"]
    assert isinstance(t["baseTimeNanoseconds"], int) and t["baseTimeNanoseconds"] >= 0
    ndev = int(kpfix.psql("SELECT count(*) FROM devices WHERE run_id = %d AND rank = %d"
                          % (run_id, rank), db=DB))
    assert len(t["deviceProperties"]) == ndev
    evs = t["traceEvents"]
    cats = collections.Counter()
    starts, tracks, named = set(), set(), set()
    flows = {"s": collections.Counter(), "f": collections.Counter()}
    flow_ev = []
    for e in evs:
        for k in ("ph", "ts", "pid", "tid"):
            assert k in e, (k, e)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        ph = e["ph"]
        if ph == "X":
            assert e["dur"] >= 0 and "name" in e and "cat" in e, e
            cats[e["cat"]] += 1
            starts.add((e["pid"], e["tid"], e["ts"], e["cat"]))
            tracks.add((e["pid"], e["tid"]))
        elif ph in ("s", "f"):
            assert e["cat"] == "ac2g" and isinstance(e["id"], int), e
            flows[ph][e["id"]] += 1
            flow_ev.append(e)
            if ph == "f":
                assert e["bp"] == "e", e
        elif ph == "i":
            cats["[memory]"] += 1
            tracks.add((e["pid"], e["tid"]))
        elif ph == "M":
            if e["name"] == "thread_name":
                named.add((e["pid"], e["tid"]))
        else:
            raise AssertionError("unexpected phase %r" % e)
    # every ts/dur is written with exactly 3 decimals (ns)
    n_times = len(US3.findall(raw.decode()))
    n_expected = sum(1 + (e["ph"] == "X") for e in evs)
    assert n_times == n_expected, (n_times, n_expected)
    # one start per launching API call, one end per GPU activity (a CUDA-graph launch: one
    # start, an end on each of its kernels)
    assert set(flows["s"]) == set(flows["f"]), "unmatched ac2g flows"
    api_per_corr = collections.Counter(e["args"]["correlation"] for e in evs if e.get("ph") == "X"
                                       and e.get("cat") in ("cuda_runtime", "cuda_driver",
                                                            "overhead"))
    for i, n in flows["s"].items():
        assert n == api_per_corr[i], ("flow starts for correlation", i, n, api_per_corr[i])
    for e in flow_ev:
        if e["ph"] == "s":
            assert any((e["pid"], e["tid"], e["ts"], c) in starts
                       for c in ("cuda_runtime", "cuda_driver", "overhead")), e
        else:
            assert any((e["pid"], e["tid"], e["ts"], c) in starts for c in GPU_CATS), e
    assert tracks <= named, "tracks without a thread_name: %s" % (tracks - named)
    # event counts equal the rows
    def rows(sql):
        return int(kpfix.psql(sql % (run_id, rank), db=DB))
    assert cats["kernel"] == rows("SELECT count(*) FROM kernels WHERE run_id = %d AND rank = %d")
    assert cats["gpu_memcpy"] == rows("SELECT count(*) FROM memcpys WHERE run_id = %d AND "
                                      "rank = %d")
    assert cats["gpu_memset"] == rows("SELECT count(*) FROM memsets WHERE run_id = %d AND "
                                      "rank = %d")
    assert cats["cuda_sync"] == rows("SELECT count(*) FROM syncs WHERE run_id = %d AND rank = %d")
    assert cats["cuda_runtime"] + cats["cuda_driver"] + cats["overhead"] == rows(
        "SELECT count(*) FROM api_calls WHERE run_id = %d AND rank = %d")
    n_mem = rows("SELECT count(*) FROM ops WHERE run_id = %d AND rank = %d AND kind = 0")
    if HAS_MEMORY:
        n_mem += rows("SELECT count(*) FROM memory_events WHERE run_id = %d AND rank = %d")
    assert cats["[memory]"] == n_mem, (cats["[memory]"], n_mem)
    n_ops = rows("SELECT count(*) FROM ops WHERE run_id = %d AND rank = %d")
    assert sum(cats[c] for c in ("cpu_op", "user_annotation", "gpu_user_annotation",
                                 "python_function", "[memory]")) >= n_ops
    # counters: one cuda_profiler_range event per range (correlation, device)
    assert cats["cuda_profiler_range"] == rows(
        "SELECT count(*) FROM (SELECT DISTINCT correlation, device FROM counters WHERE "
        "run_id = %d AND rank = %d) x"), cats["cuda_profiler_range"]
    return t, cats, sum(flows["f"].values())


def flow_rows(run_id, rank):
    q = ("SELECT count(*) FROM api_calls a JOIN (SELECT correlation FROM kernels WHERE run_id = "
         "{r} AND rank = {k} UNION ALL SELECT correlation FROM memcpys WHERE run_id = {r} AND "
         "rank = {k} UNION ALL SELECT correlation FROM memsets WHERE run_id = {r} AND rank = {k}"
         ") g ON g.correlation = a.correlation WHERE a.run_id = {r} AND a.rank = {k} AND "
         "a.correlation > 0").format(r=run_id, k=rank)
    return int(kpfix.psql(q, db=DB))


def round_trip(job, paths, out, extra_import=(), extra_export=()):
    """Imports paths, exports to out (a directory or a file), checks and imports the export,
    and compares the runs. Returns (rows compared, export JSON bytes, export seconds)."""
    res = kimport("--job", job, *extra_import, *paths)
    a = res["run_id"]
    p = kexport(a, out, "--json", *extra_export)
    ex = json.loads(p.stdout)
    assert ex["run_id"] == a and len(ex["files"]) == len(ranks_of(a)), ex
    written = {}
    for f in ex["files"]:
        t, cats, nflows = check_chrome(f["path"], a, f["rank"])
        assert nflows == flow_rows(a, f["rank"]) == f["flows"], (nflows, f)
        written[f["rank"]] = t["baseTimeNanoseconds"]
    again = kimport("--job", job + "-again", *extra_import, out)
    b = again["run_id"]
    assert ranks_of(a) == ranks_of(b), (ranks_of(a), ranks_of(b))
    ws = kpfix.psql("SELECT world_size FROM runs WHERE id IN (%d, %d) ORDER BY id" % (a, b),
                    db=DB).split()
    assert ws[0] == ws[1], ws
    n = compare_runs(a, b, {r: r for r in ranks_of(a)})
    # the time base HTA rounds with: a rank's own comes back; one without gets the export's
    # (import stores a base of 0 as none)
    ba, bb = time_bases(a), time_bases(b)
    for r in ranks_of(a):
        want = ba[r] if ba[r] is not None else (written[r] or None)
        assert bb[r] == want, ("rank %d: time_base_ns %s in run %d, %s after the round trip "
                               "(the export wrote baseTimeNanoseconds %d)"
                               % (r, ba[r], a, bb[r], written[r]))
    return n, ex["json_bytes"], ex["seconds"]


def time_base_trace(rank, base, seed):
    """One rank of a two-rank trace with a time base (baseTimeNanoseconds, sub-µs digits) and
    ts/dur in µs relative to it with 3 decimals, as Kineto writes them (docs/specs/
    torch-trace-formats.md B.2, B.3); mirrors test_analyzer_hta.py's time_base_trace: three
    ProfilerSteps of launches, kernels on stream 7 and NCCL kernels on stream 20, gaps below
    and above HTA's 30 µs kernel-wait limit. Rank 1 also has an op before its base."""
    rnd = random.Random(seed)
    r3 = lambda x: round(x, 3)
    ev, free, corr, t = [], {7: 0.0, 20: 0.0}, 1, 500.0 + rnd.random()
    if rank == 1:
        ev.append({"ph": "X", "cat": "user_annotation", "name": "setup", "pid": 1, "tid": 1,
                   "ts": -3.217, "dur": 2.5, "args": {}})
    for step in range(3):
        s0 = t
        for i in range(20):
            stream = 20 if rnd.random() < 0.3 else 7
            name = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL" if stream == 20 else
                    "volta_sgemm_128x64_nn" if i % 2 else "elementwise_kernel")
            rt_ts, rt_dur = r3(t), r3(rnd.uniform(2, 9))
            gap = rnd.choice([0.3, 1.7, 4.41, 12.5, 29.6, 31.2, 80.05])
            g_ts = r3(max(free[stream] + gap, rt_ts + rt_dur + rnd.uniform(0.4, 25)))
            g_dur = r3(rnd.uniform(1.5, 60))
            free[stream] = g_ts + g_dur
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1,
                       "tid": 1, "ts": rt_ts, "dur": rt_dur, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                       "ts": g_ts, "dur": g_dur,
                       "args": {"device": 0, "stream": stream, "correlation": corr}})
            corr += 1
            t = rt_ts + rt_dur + rnd.uniform(0.2, 12) + (rnd.random() < 0.1) * 80
        ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d" % (step + 1),
                   "pid": 1, "tid": 1, "ts": r3(s0 - 0.5), "dur": r3(t - s0 + 0.9), "args": {}})
        t += 2.25
    return {"schemaVersion": 1,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "baseTimeNanoseconds": base, "traceEvents": ev}


def hta_temporal(run_id, rank):
    """kprofctl hta temporal --json through kprof-analyzer: the rank's one row."""
    p = run([KPROFCTL, "hta", "temporal", "--analyzer", AN.grpc, "--run", str(run_id), "--rank",
             str(rank), "--json"])
    (row,) = json.loads(p.stdout)
    return {k: v for k, v in row.items() if k not in ("run", "run_id")}


def same_hta(job):
    """HTA's temporal figures of job's run and of its round trip (job-again) are equal on every
    rank. Not for a trace whose ts are epoch µs without a base (ns_resolution): HTA reads those
    as doubles, a quarter µs apart, while the export writes exact µs relative to its base, so
    HTA rounds the export (and kprof the re-imported run) a little differently."""
    a, b = (int(kpfix.psql("SELECT max(id) FROM runs WHERE job = '%s'" % j, db=DB))
            for j in (job, job + "-again"))
    for r in ranks_of(a):
        got, want = hta_temporal(b, r), hta_temporal(a, r)
        assert got == want, ("%s rank %d: HTA temporal %s after the round trip, %s before"
                             % (job, r, got, want))
    return len(ranks_of(a))


def check_time_base(tmp):
    """The time-base trace through import -> export -> import: each rank's base and ts come
    back exactly, and so do HTA's temporal figures."""
    bases = {0: 1_700_000_000_123_456_789, 1: 1_700_000_000_987_654_321}
    src = os.path.join(tmp, "time-base")
    os.makedirs(src)
    traces = {r: time_base_trace(r, b, 11 + r) for r, b in bases.items()}
    for r, t in traces.items():
        with open(os.path.join(src, "rank%d.json" % r), "w") as f:
            json.dump(t, f)
    out = os.path.join(tmp, "time-base-out")
    os.makedirs(out)
    n, _, _ = round_trip("time-base", [src], out)
    a = int(kpfix.psql("SELECT max(id) FROM runs WHERE job = 'time-base'", db=DB))
    b = int(kpfix.psql("SELECT max(id) FROM runs WHERE job = 'time-base-again'", db=DB))
    assert time_bases(a) == bases, time_bases(a)
    for r, base in bases.items():
        _, t = load(os.path.join(out, "kprof-run%d.rank-%d.pt.trace.json" % (a, r)))
        assert t["baseTimeNanoseconds"] == base, (r, t["baseTimeNanoseconds"])
        # the very ts the trace had (json.dump wrote them as floats of 3 decimals)
        ts = lambda tr: sorted((e["cat"], e["name"], D(str(e["ts"])), D(str(e["dur"])))
                               for e in tr["traceEvents"] if e.get("ph") == "X")
        assert ts(t) == ts(traces[r]), (r, ts(t)[:3], ts(traces[r])[:3])
        got, want = hta_temporal(b, r), hta_temporal(a, r)
        assert got == want, "rank %d: HTA temporal %s after the round trip, %s before" % (
            r, got, want)
        print("time base rank %d: base %d and every ts back; HTA temporal equal (idle %s us "
              "of %s us)" % (r, base, want["idle_us"], want["kernel_us"]))
    return n


def synthetic_trace():
    """A one-rank trace (no distributedInfo) with a CUDA-graph launch (one correlation, three
    kernels), a plain launch, and CUPTI range-profiler counters (one range with its own
    correlation, one without)."""
    def X(cat, name, pid, tid, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                "dur": dur, "args": args}

    def kernel(name, ts, corr, **extra):
        return X("kernel", name, 0, 7, ts, 5, device=0, stream=7, correlation=corr,
                 grid=[1, 1, 1], block=[32, 1, 1], **{"External id": 5,
                                                      "registers per thread": 8,
                                                      "shared memory": 0}, **extra)
    ev = [X("cpu_op", "aten::mm", 100, 100, 10, 200, **{"External id": 5}),
          X("cuda_runtime", "cudaGraphLaunch", 100, 100, 20, 10, correlation=77, cbid=311,
            **{"External id": 5})]
    ev += [kernel("graph_k%d" % i, 40 + 10 * i, 77, **{"graph id": 3, "graph node id": i + 1})
           for i in range(3)]
    ev += [X("cuda_runtime", "cudaLaunchKernel", 100, 100, 100, 5, correlation=78, cbid=211,
             **{"External id": 5}), kernel("plain_k", 120, 78)]
    ev += [X("cuda_profiler_range", "graph_k0", 0, 1, 1000, 100,
             **{"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 12,
                "gpu__time_duration.sum": 1.5}),
           X("cuda_profiler_range", "plain_k", 0, 1, 1100, 100, correlation=78,
             **{"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 3.25e20})]
    return {"schemaVersion": 1, "traceEvents": ev}


def figure_kernels(paths):
    """Kernel events of the traces at paths with blocks per SM or est. achieved occupancy %
    as a number: the kernels import must give a kernel_occupancy row."""
    n = 0
    for path in paths:
        _, t = load(path)
        for e in t["traceEvents"]:
            a = e.get("args") or {}
            if e.get("ph") != "X" or str(e.get("cat", "")).lower() != "kernel":
                continue
            if any(isinstance(a.get(k), (int, D)) and not isinstance(a.get(k), bool) and
                   not D(a[k]).is_nan() for k in ("blocks per SM", "est. achieved occupancy %")):
                n += 1
    return n


def check_occupancy_rows(run_id, paths):
    """kernel_occupancy holds exactly one row per kernel that carries a figure, each row
    naming exactly one kernel of its run and rank."""
    want = figure_kernels(paths)
    got = int(kpfix.psql("SELECT count(*) FROM kernel_occupancy WHERE run_id = %d" % run_id,
                         db=DB))
    assert got == want, "run %d: %d kernel_occupancy rows, %d kernels carry figures" % (
        run_id, got, want)
    joined = kpfix.psql(
        # one join, not a subquery per row: each would read the run's kernels again
        "SELECT count(*), count(*) FILTER (WHERE n <> 1) FROM (SELECT count(k.start_ns) AS n "
        "FROM kernel_occupancy o LEFT JOIN kernels k ON k.run_id = %d AND k.rank = o.rank AND "
        "k.start_ns = o.start_ns AND coalesce(k.correlation, 0) = o.correlation AND "
        "coalesce(k.stream, 0) = o.stream AND coalesce(k.device, 0) = o.device "
        "WHERE o.run_id = %d GROUP BY o.ctid) x" % (run_id, run_id), db=DB).split("|")
    assert joined == [str(got), "0"], "run %d: rows naming other than one kernel: %s" % (
        run_id, joined)
    return got


def check_bandwidth_rows(run_id, paths):
    """memcpy_bandwidth and memset_bandwidth hold one row per event that carries "memory
    bandwidth (GB/s)", each with the trace's very figure (not bytes / dur, which whole-µs
    traces round). Returns the rows."""
    total = 0
    for kind in ("memcpy", "memset"):
        want = []
        for path in paths:
            _, t = load(path)
            for e in t["traceEvents"]:
                a = e.get("args") or {}
                v = a.get("memory bandwidth (GB/s)")
                if (e.get("ph") == "X" and str(e.get("cat", "")).lower() in (kind, "gpu_" + kind)
                        and isinstance(v, (int, D)) and not isinstance(v, bool)):
                    want.append(float(v))
        got = [float(x) for x in kpfix.psql(
            "SELECT bandwidth_gbps FROM %s_bandwidth WHERE run_id = %d" % (kind, run_id),
            db=DB).split()]
        assert sorted(got) == sorted(want), "run %d: %d %s_bandwidth rows, %d events carry " \
            "the figure (or the figures differ)" % (run_id, len(got), kind, len(want))
        joined = kpfix.psql(
            "SELECT count(*) FILTER (WHERE n <> 1) FROM (SELECT (SELECT count(*) FROM %ss m "
            "WHERE m.run_id = b.run_id AND m.rank = b.rank AND m.start_ns = b.start_ns AND "
            "coalesce(m.correlation, 0) = b.correlation AND coalesce(m.stream, 0) = b.stream "
            "AND coalesce(m.device, 0) = b.device) AS n FROM %s_bandwidth b WHERE b.run_id = %d"
            ") x" % (kind, kind, run_id), db=DB)
        assert joined == "0", "run %d: %s_bandwidth rows naming other than one event: %s" % (
            run_id, kind, joined)
        total += len(got)
    return total


def main():
    global COLLECTOR, CONNINFO
    CONNINFO = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_export", CONNINFO)
    COLLECTOR = cd.grpc
    global AN
    AN = Analyzer("it_export_analyzer", CONNINFO)
    global HAS_MEMORY
    # schema 2 (migration 0002) adds memory_events: compare it too when this build has it
    HAS_MEMORY = kpfix.psql("SELECT to_regclass('memory_events') IS NOT NULL", db=DB) == "t"
    if HAS_MEMORY:
        COLS["memory_events"] = ["start_ns", NM % "name", "coalesce(tid, 0)", "coalesce(addr, 0)",
                                 "coalesce(bytes, 0)", "coalesce(total_allocated, 0)",
                                 "coalesce(total_reserved, 0)", "coalesce(device, -1)",
                                 "coalesce(device_type, 0)"]
    tmp = tempfile.mkdtemp(prefix="kp_export_", dir=kpfix.TEST_DIR)
    try:
        # 1. round trips
        hta2 = sorted(glob.glob(os.path.join(PEERS, "hta", "trace_filter_2rank", "*.json.gz")))
        d = os.path.join(tmp, "hta2")
        os.makedirs(d)
        n, _, _ = round_trip("hta-2rank", hta2, d)
        assert len(os.listdir(d)) == 2, os.listdir(d)
        print("HTA 2-rank: %d rows equal after the round trip" % n)
        print("HTA 2-rank: HTA temporal equal on %d ranks after the round trip" % same_hta("hta-2rank"))

        big = glob.glob(os.path.join(PEERS, "hta", "ns_resolution_rank0", "*.json.gz"))[0]
        out = os.path.join(tmp, "ns.json.gz")
        n, nbytes, secs = round_trip("hta-ns", [big], out)
        with open(out, "rb") as f:
            assert f.read(2) == b"\x1f\x8b", "not gzip"
        # its distributedInfo (pg_config, nccl_version) comes back as it was
        _, orig = load(big)
        _, back = load(out)
        assert orig["distributedInfo"]["pg_config"] and orig["distributedInfo"]["nccl_version"]
        assert back["distributedInfo"] == orig["distributedInfo"], back["distributedInfo"]
        assert not glob.glob(out + ".tmp.*")
        print("HTA ns-resolution: %d rows equal; export %.1f MB of JSON in %.3f s = %.1f MB/s "
              "(gzip level 1)" % (n, nbytes / 1e6, secs, nbytes / 1e6 / secs))
        out = os.path.join(tmp, "ns-plain.json")
        res = kimport("--job", "hta-ns-plain", big)
        p = kexport(res["run_id"], out, "--json")
        ex = json.loads(p.stdout)
        print("HTA ns-resolution plain: export %.1f MB of JSON in %.3f s = %.1f MB/s" % (
            ex["json_bytes"] / 1e6, ex["seconds"], ex["json_bytes"] / 1e6 / ex["seconds"]))
        assert os.path.getsize(out) == ex["json_bytes"]

        tb = sorted(glob.glob(os.path.join(PEERS, "tbplugin", "resnet50", "traces", "*",
                                           "*.json.gz")))[0]
        n, _, _ = round_trip("tb-resnet", [tb], os.path.join(tmp, "resnet.json"))
        print("tbplugin resnet50: %d rows equal" % n)

        # counters, a CUDA-graph launch, no distributedInfo: all survive the round trip
        src = os.path.join(tmp, "synthetic.json")
        with open(src, "w") as f:
            json.dump(synthetic_trace(), f)
        d = os.path.join(tmp, "synth-out", "new") + "/"  # -o DIR/ is created
        n, _, _ = round_trip("synthetic-trace", [src], d)
        (path,) = glob.glob(d + "*.json")
        _, t = load(path)
        evs = t["traceEvents"]
        starts = [e for e in evs if e.get("ph") == "s"]
        ends = [e for e in evs if e.get("ph") == "f"]
        assert sorted(e["id"] for e in starts) == [77, 78], starts
        assert sorted(e["id"] for e in ends) == [77, 77, 77, 78], ends
        ranges = [e for e in evs if e.get("cat") == "cuda_profiler_range"]
        assert [r["name"] for r in ranges] == ["graph_k0", "plain_k"], ranges
        assert "correlation" not in ranges[0]["args"] and ranges[1]["args"]["correlation"] == 78
        assert ranges[1]["args"]["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] == \
            D("3.25e+20"), ranges[1]
        assert "distributedInfo" not in t
        nctr = int(kpfix.psql("SELECT count(*) FROM counters c JOIN runs r ON r.id = c.run_id "
                              "WHERE r.job = 'synthetic-trace-again'", db=DB))
        assert nctr == 5, nctr  # 3 metrics + 2 range-name rows
        print("synthetic trace: %d rows equal (counters, graph launch flows)" % n)

        n = check_time_base(tmp)
        print("time base trace: %d rows equal, each rank's time base back" % n)

        # kernel_occupancy: one row per imported kernel with a figure (none without)
        for job, paths in (("occ-resnet", [tb]), ("occ-ns", [big]), ("occ-hta2", hta2)):
            rid = kimport("--job", job, *paths)["run_id"]
            n = check_occupancy_rows(rid, paths)
            assert n > 0 or job == "occ-hta2", (job, n)
            print("%s: %d kernel_occupancy rows, one per kernel with figures" % (job, n))
            n = check_bandwidth_rows(rid, paths)
            assert n > 0, (job, n)
            print("%s: %d memcpy/memset_bandwidth rows, the trace's figures" % (job, n))

        ncases = 0
        for case in sorted(glob.glob(os.path.join(PEERS, "tbplugin", "cases", "*.json"))):
            with open(case) as f:
                c = json.load(f)
            name = os.path.basename(case)[:-5]
            src = os.path.join(tmp, "case-" + name)
            os.makedirs(src)
            if "trace" in c:
                path = os.path.join(src, name + ".json")
                with open(path, "w") as f:
                    json.dump(c["trace"], f)
                od = os.path.join(tmp, "case-out-" + name + ".json")
                round_trip("tbcase", [path], od, extra_import=("--rank", "0"))
                ncases += 1
            elif "traces" in c:
                for w, t in c["traces"].items():
                    with open(os.path.join(src, w + ".json"), "w") as f:
                        json.dump(t, f)
                od = os.path.join(tmp, "case-out-" + name)
                os.makedirs(od)
                round_trip("tbcase", [src], od)
                ncases += 1
        print("tbplugin cases: %d round trips equal" % ncases)
        assert ncases >= 10, ncases

        # 2. a captured-style run (synthetic DDP traffic)
        p = run([LOADGEN, "--collector", COLLECTOR, "--ranks", "2", "--steps", "3",
                 "--kernels-per-step", "40", "--job", "synthetic", "--json"])
        lg = json.loads(p.stdout)
        rid = lg.get("run_id") or int(kpfix.psql("SELECT max(id) FROM runs WHERE job = "
                                                  "'synthetic'", db=DB))
        d = os.path.join(tmp, "synth")
        os.makedirs(d)
        ex = json.loads(kexport(rid, d, "--json", "--gzip").stdout)
        assert len(ex["files"]) == 2, ex
        for f in ex["files"]:
            assert f["path"].endswith(".json.gz")
            t, cats, nflows = check_chrome(f["path"], rid, f["rank"])
            assert nflows == flow_rows(rid, f["rank"]) and nflows > 0, nflows
            evs = t["traceEvents"]
            op_ext = {e["args"]["External id"] for e in evs if e.get("cat") in (
                "cpu_op", "user_annotation") and "External id" in e.get("args", {})}
            gpu = [e for e in evs if e.get("cat") in GPU_CATS]
            linked = [e for e in gpu if "External id" in e["args"]]
            assert gpu and len(linked) == len(gpu), (len(gpu), len(linked))
            missing = [e for e in linked if e["args"]["External id"] not in op_ext]
            assert not missing, "GPU rows whose External id names no op: %s" % missing[:3]
            # each launch links to its kernel through the flow, and both carry the same op
            api = {e["args"]["correlation"]: e for e in evs if e.get("cat") == "cuda_runtime"}
            for e in gpu:
                a = api.get(e["args"]["correlation"])
                assert a is not None, e
                assert a["args"].get("External id") in (None, e["args"]["External id"]), (a, e)
            kernels = int(kpfix.psql("SELECT count(*) FROM kernels WHERE run_id = %d AND "
                                     "rank = %d" % (rid, f["rank"]), db=DB))
            assert cats["kernel"] == kernels > 0
        # a capture carries no occupancy figures: no kernel_occupancy rows at all
        assert kpfix.psql("SELECT count(*) FROM kernel_occupancy WHERE run_id = %d" % rid,
                          db=DB) == "0"
        # nor bandwidth figures: export writes bytes / ns for them
        for kind in ("memcpy", "memset"):
            assert kpfix.psql("SELECT count(*) FROM %s_bandwidth WHERE run_id = %d" % (kind, rid),
                              db=DB) == "0", kind
        print("captured-style run %d: %d files, op<->kernel ids and flows OK, no "
              "kernel_occupancy rows" % (rid, len(ex["files"])))

        # the stream itself (grpcio): chunks of at most 1 MiB, ranks in order, each ended with
        # its figures; a client that goes away mid-stream leaves the analyzer serving
        import grpc
        import kprof_pb2 as pb
        ch = grpc.insecure_channel(AN.grpc)
        export = ch.unary_stream("/kprof.v1.Analyzer/Export",
                                 request_serializer=pb.ExportRequest.SerializeToString,
                                 response_deserializer=pb.ExportChunk.FromString)
        big_run = int(kpfix.psql("SELECT min(id) FROM runs WHERE job = 'hta-ns'", db=DB))
        chunks = list(export(pb.ExportRequest(run_id=big_run, all_ranks=True), timeout=120))
        assert len(chunks) > 2 and all(len(c.data) <= 1 << 20 for c in chunks), len(chunks)
        assert chunks[-1].end_of_rank and not any(c.end_of_rank for c in chunks[:-1])
        body = b"".join(c.data for c in chunks)
        assert len(body) == chunks[-1].json_bytes and json.loads(body)["traceEvents"]
        call = export(pb.ExportRequest(run_id=big_run, all_ranks=True), timeout=120)
        next(call)
        call.cancel()
        try:
            list(export(pb.ExportRequest(run_id=big_run, rank=5), timeout=30))
            raise AssertionError("rank 5 exported")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND and "no rank 5" in e.details(), e
        ch.close()
        p = kexport(big_run, os.path.join(tmp, "after-cancel.json"), "--json")
        assert json.loads(p.stdout)["json_bytes"] == chunks[-1].json_bytes
        print("Export stream: %d chunks of at most 1 MiB; a cancelled call leaves the analyzer "
              "serving" % len(chunks))

        # 3. errors
        p = kexport(999999, os.path.join(tmp, "x.json"), ok=False)
        assert p.returncode == 3 and "run 999999 not found; `kprofctl runs` lists runs" in \
            p.stderr and "psql" not in p.stderr, p.stderr
        p = kexport(rid, os.path.join(tmp, "x.json"), "--rank", "7", ok=False)
        assert p.returncode == 3 and "has no rank 7" in p.stderr and "0, 1" in p.stderr, p.stderr
        p = kexport(rid, os.path.join(tmp, "x.json"), ok=False)
        assert p.returncode == 2 and "--rank" in p.stderr, p.stderr
        p = run([KPROFCTL, "export", "-o", os.path.join(tmp, "x.json")], ok=False)
        assert p.returncode == 2 and "--run is required" in p.stderr, p.stderr
        bad = Analyzer("it_export_nopg", "host=/nonexistent-socket-dir port=1 dbname=x "
                       "connect_timeout=2")
        try:
            p = kexport(rid, os.path.join(tmp, "x.json"), "--rank", "0", ok=False,
                        analyzer=bad.grpc)
        finally:
            assert bad.stop() == 0
        assert p.returncode == 5 and "PostgreSQL" in p.stderr, p.stderr
        assert not os.path.exists(os.path.join(tmp, "x.json"))
        assert not glob.glob(os.path.join(tmp, "x.json.tmp.*"))
        p = kexport(rid, os.path.join(tmp, "x.json"), "--rank", "0", ok=False,
                    analyzer="127.0.0.1:%d" % kpfix.free_port())
        assert p.returncode == 5 and "KPROF_ANALYZER" in p.stderr, p.stderr
        p = kexport(rid, os.path.join(tmp, "no-such-dir", "x.json"), "--rank", "0", ok=False)
        assert p.returncode == 1 and "cannot write" in p.stderr, p.stderr
        assert not os.path.exists(os.path.join(tmp, "x.json"))
        # stdout
        p = kexport(rid, "-", "--rank", "1")
        t = json.loads(p.stdout)
        assert t["distributedInfo"]["rank"] == 1 and t["traceEvents"]
        print("error cases OK")
    finally:
        arc = AN.stop()
        rc = cd.stop()
        cd.assert_clean_log()
    assert rc == 0, rc
    assert arc == 0, arc


if __name__ == "__main__":
    main()
