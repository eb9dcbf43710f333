"""HTA's per-rank analyses (analyzer/hta.h) against HTA's own figures, both ways kprof serves
them: `kprofctl hta ANALYSIS` through kprof-analyzer (Analyzer.Hta) and the offline mode
`kprof-analyze ... hta ANALYSIS` (which was kprof-hta).

Both peer folders of tests/data/peers/hta are imported with `kprofctl import` through a real
kprof-collectord: trace_filter_2rank (ranks 0 and 1 of a 128-rank NCCL job) and
ns_resolution_rank0 (one rank, sub-µs timestamps). Each analysis, by each path, is compared
with the CSV HTA wrote (docs/specs/hta-analyses.md): percentages within 0.1 percentage point,
times within the CSVs' µs, ratios and statistics within the rounding HTA applied before
writing them. Every analysis prints, per folder and rank, how many figures matched; any
mismatch fails the test.

kprof's deliberate differences are options, off by default, and checked on their own terms:
--exact-ns (HTA rounds every time to whole µs: start up, end down) and --include-last-step
(HTA drops the last ProfilerStep and GPU work without a kept launch). With them, the window
and the sums are checked against the rows in PostgreSQL.
"""
import csv
import glob
import json
import math
import os
import random
import subprocess
import tempfile

import kpfix

kpfix.require_env()
from test_analyzer_service import Analyzer  # noqa: E402

DB = "kp_it_hta"
# The repository's test data: the peers' traces and figures (tests/data/peers/README.md).
SHARED = os.path.join(os.environ.get("KPROF_SOURCE_DIR", "."), "tests", "data")
PEERS = os.path.join(SHARED, "peers", "hta")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
ANALYZE = os.path.join(kpfix.BIN, "analyzer", "kprof-analyze")

BAD = []
# Which path hta() takes: None for the offline kprof-analyze, else the kprof-analyzer.
VIA = {"analyzer": None}


def run(args, what, rc=0):
    p = subprocess.run(args, capture_output=True, text=True, timeout=300 * kpfix.SCALE)
    if p.returncode != rc:
        raise AssertionError("%s exited %d (want %d):\n%s" % (what, p.returncode, rc, p.stderr))
    for bad in ("Sanitizer", "runtime error:"):
        assert bad not in p.stderr, p.stderr
    return p.stdout


def hta(ci, run_id, rank, analysis, *extra, rc=0):
    """One analysis as kprof-analyze's JSON (times in µs), by the path VIA names."""
    if VIA["analyzer"] is not None:
        return hta_ctl(VIA["analyzer"], run_id, rank, analysis, *extra, rc=rc)
    out = run([ANALYZE, "--pg", ci, "--run", str(run_id), "--rank", str(rank), "hta", analysis,
               "--json"] + list(extra), "kprof-analyze hta " + analysis, rc)
    return json.loads(out) if rc == 0 else None


def ctl(an, run_id, rank, analysis, extra, rc=0):
    return run([KPROFCTL, "hta", analysis, "--analyzer", an.grpc, "--run", str(run_id), "--rank",
                str(rank), "--json"] + list(extra), "kprofctl hta " + analysis, rc)


STATS = (("count", "count"), ("mean", "mean"), ("std", "std"), ("min", "min"), ("25%", "p25"),
         ("50%", "p50"), ("75%", "p75"), ("max", "max"))


def hta_ctl(an, run_id, rank, analysis, *extra, rc=0):
    """kprofctl hta's tables (--json) reshaped as kprof-analyze hta's JSON, so that the same
    checks read both."""
    out = ctl(an, run_id, rank, "launches" if analysis == "launch" else analysis, extra, rc)
    if rc != 0:
        return None
    t = json.loads(out)
    if analysis == "temporal":
        r = t[0]
        d = {k + "_time_us": r[k + "_us"] for k in ("idle", "compute", "non_compute", "kernel")}
        d.update({k + "_time_pctg": r[k + "_pct"] for k in ("idle", "compute", "non_compute")})
        return d
    if analysis == "idle":
        streams = {}
        for r in t:
            streams.setdefault(r["stream"], []).append({
                "idle_category": r["category"], "idle_time_us": r["idle_us"],
                "idle_time_ratio": r["idle_ratio"],
                "interval_stats_us": {h: r[c if c == "count" else c + "_us"] for h, c in STATS}})
        return {"streams": [{"stream": s, "categories": c} for s, c in streams.items()]}
    if analysis == "overlap":
        return {"comm_time_us": t[0]["comm_us"], "overlap_time_us": t[0]["overlap_us"],
                "comp_comm_overlap_pctg": t[0]["overlap_pct"]}
    if analysis == "kernels":
        types = json.loads(ctl(an, run_id, rank, "kernel-types", extra))
        return {"kernel_types": [{"kernel_type": k["kernel_type"], "sum_us": k["sum_us"]}
                                 for k in types], "kernels": t}
    if analysis == "launch":
        s = json.loads(ctl(an, run_id, rank, "launch", extra))[0]
        return {"launches": [{"correlation": l["correlation"], "cpu_duration_us": l["cpu_us"],
                              "gpu_duration_us": l["gpu_us"], "launch_delay_us": l["delay_us"]}
                             for l in t],
                "summary": {"n": s["launches"], "cpu_duration_mean_us": s["cpu_mean_us"],
                            "gpu_duration_mean_us": s["gpu_mean_us"],
                            "launch_delay_mean_us": s["delay_mean_us"],
                            "launch_delay_p50_us": s["delay_p50_us"],
                            "launch_delay_max_us": s["delay_max_us"],
                            "n_gpu_shorter_than_cpu": s["gpu_shorter"],
                            "n_runtime_outliers": s["runtime_outliers"],
                            "n_launch_delay_outliers": s["delay_outliers"]}}
    if analysis == "membw":
        return {"kinds": [{"name": r["name"], "memory_bw_gbps": {h: r[c if c == "count" else
                                                                    c + "_gbps"] for h, c in STATS},
                           "events": r["events"],
                           "bandwidth_from_bytes_per_ns": r["bw_from_bytes_per_ns"]} for r in t]}
    assert analysis == "queue", analysis
    return {"streams": [{"stream": r["stream"],
                         "queue_length": {h: r[c] for h, c in STATS},
                         "duration_at_max_queue_length_us": r["blocked_us"],
                         "relative_duration_at_max_queue_length": r["blocked_rel"]} for r in t]}


def rows(path, skip=0):
    with open(path) as f:
        lines = f.read().splitlines()[skip:]
    return list(csv.reader(lines))


def dict_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def num(s):
    return float("nan") if s in ("", None) else float(s)


class Tally:
    def __init__(self, what):
        self.what, self.ok, self.bad = what, 0, []

    def check(self, label, got, want, tol):
        """got None stands for NaN (JSON null)."""
        g = float("nan") if got is None else float(got)
        w = float(want)
        if (math.isnan(g) and math.isnan(w)) or (not math.isnan(g) and not math.isnan(w)
                                                 and abs(g - w) <= tol):
            self.ok += 1
        else:
            self.bad.append("%s: kprof %r, HTA %r (tolerance %g)" % (label, got, want, tol))

    def done(self):
        print("%s: %d figures match, %d mismatch" % (self.what, self.ok, len(self.bad)))
        for b in self.bad[:20]:
            print("  MISMATCH " + b)
        BAD.extend(self.what + ": " + b for b in self.bad)


US = 0.5      # the CSVs hold whole µs
PCT = 0.1     # percentage points
R2 = 0.0051   # values HTA rounded to 2 decimals


def check_temporal(ci, folder, runs):
    for r in dict_rows(os.path.join(PEERS, folder, "temporal_breakdown.csv")):
        rank = int(r["rank"])
        t = Tally("%s temporal rank %d" % (folder, rank))
        g = hta(ci, runs, rank, "temporal")
        for k in ("idle_time", "compute_time", "non_compute_time", "kernel_time"):
            t.check(k, g[k + "_us"], r[k + "(us)"], US)
        for k in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
            t.check(k, g[k], r[k], PCT)
        t.done()


def check_idle(ci, folder, runs):
    want = {}
    for r in dict_rows(os.path.join(PEERS, folder, "idle_time_breakdown.csv")):
        want[(int(r["rank"]), int(r["stream"]), r["idle_category"])] = r
    stats = {}
    for r in dict_rows(os.path.join(PEERS, folder, "idle_interval_stats.csv")):
        stats[(int(r["rank"]), int(r["stream"]), r["idle_category"])] = r
    for rank in sorted({k[0] for k in want}):
        t = Tally("%s idle rank %d" % (folder, rank))
        g = hta(ci, runs, rank, "idle")
        got = {}
        for s in g["streams"]:
            for c in s["categories"]:
                got[(rank, s["stream"], c["idle_category"])] = c
        mine = {k for k in want if k[0] == rank}
        if set(got) != mine:
            t.bad.append("categories: kprof %s, HTA %s" % (sorted(got), sorted(mine)))
        for k in sorted(mine & set(got)):
            w, c = want[k], got[k]
            lbl = "stream %d %s" % (k[1], k[2])
            t.check(lbl + " idle_time", c["idle_time_us"], w["idle_time"], US)
            t.check(lbl + " idle_time_ratio", c["idle_time_ratio"], num(w["idle_time_ratio"]), R2)
            st = stats.get(k)
            if st is None:
                continue
            t.check(lbl + " count", c["interval_stats_us"]["count"], st["count"], 0)
            for f in ("mean", "std", "min", "25%", "50%", "75%", "max"):
                t.check(lbl + " " + f, c["interval_stats_us"][f], num(st[f]), R2)
        t.done()


def check_overlap(ci, folder, runs):
    for r in dict_rows(os.path.join(PEERS, folder, "comm_comp_overlap.csv")):
        rank = int(r["rank"])
        t = Tally("%s overlap rank %d" % (folder, rank))
        g = hta(ci, runs, rank, "overlap")
        t.check("comp_comm_overlap_pctg", g["comp_comm_overlap_pctg"],
                num(r["comp_comm_overlap_pctg"]), PCT)
        t.done()


def check_kernels(ci, folder, runs, ranks):
    types, per_rank = {}, {}
    for rank in ranks:
        g = hta(ci, runs, rank, "kernels")
        per_rank[rank] = g
        for k in g["kernel_types"]:
            types[k["kernel_type"]] = types.get(k["kernel_type"], 0) + k["sum_us"]
    # table 1 is summed over the ranks (HTA returns no per-rank version)
    t = Tally("%s kernel types (all ranks)" % folder)
    want = dict_rows(os.path.join(PEERS, folder, "gpu_kernel_type_breakdown.csv"))
    total = sum(types.values())
    if {w["kernel_type"] for w in want} != {k for k, v in types.items() if v}:
        t.bad.append("labels: kprof %s, HTA %s" % (sorted(types), [w["kernel_type"] for w in want]))
    for w in want:
        got = types.get(w["kernel_type"], 0)
        t.check(w["kernel_type"] + " sum", got, w["sum"], US)
        t.check(w["kernel_type"] + " percentage", 100.0 * got / total, w["percentage"], PCT)
    t.done()
    # table 2 per rank: top kernels after folding
    want = {}
    for r in dict_rows(os.path.join(PEERS, folder, "gpu_kernel_breakdown.csv")):
        want[(int(r["rank"]), r["kernel_type"], r["name"])] = r
    for rank in ranks:
        t = Tally("%s kernel breakdown rank %d" % (folder, rank))
        got = {(rank, k["kernel_type"], k["name"]): k for k in per_rank[rank]["kernels"]}
        mine = {k for k in want if k[0] == rank}
        for k in sorted(mine ^ set(got)):
            t.bad.append("row only in %s: %s %s" % ("HTA" if k in mine else "kprof", k[1], k[2]))
        for k in sorted(mine & set(got)):
            w, g = want[k], got[k]
            lbl = "%s %s" % (k[1], k[2][:60])
            for f, col in (("sum", "sum (us)"), ("max", "max (us)"), ("min", "min (us)")):
                t.check(lbl + " " + f, g[f + "_us"], w[col], US)
            t.check(lbl + " mean", g["mean_us"], w["mean (us)"], 1e-6 * max(1, abs(num(w["mean (us)"]))))
            t.check(lbl + " std", g["std_us"], w["stddev"], 1e-6 * max(1, abs(num(w["stddev"]))))
        t.done()


def check_launch(ci, folder, runs):
    want = {}
    for r in dict_rows(os.path.join(PEERS, folder, "cuda_kernel_launch_stats.csv")):
        want.setdefault(int(r["rank"]), {})[int(r["correlation"])] = r
    summ = {int(r["rank"]): r for r in
            dict_rows(os.path.join(PEERS, folder, "cuda_kernel_launch_stats_summary.csv"))}
    for rank in sorted(want):
        t = Tally("%s launch rank %d" % (folder, rank))
        g = hta(ci, runs, rank, "launch")
        got = {l["correlation"]: l for l in g["launches"]}
        w = want[rank]
        for c in sorted(set(w) ^ set(got))[:10]:
            t.bad.append("correlation %d only in %s" % (c, "HTA" if c in w else "kprof"))
        if set(w) != set(got):
            t.bad.append("%d correlations in kprof, %d in HTA" % (len(got), len(w)))
        n_rows = 0
        for c in sorted(set(w) & set(got)):
            ok = all(abs(got[c][f + "_us"] - float(w[c][f])) <= US
                     for f in ("cpu_duration", "gpu_duration", "launch_delay"))
            if ok:
                n_rows += 1
            else:
                t.bad.append("correlation %d: kprof %r, HTA %r" % (c, got[c], dict(w[c])))
        t.ok += 3 * n_rows
        s, ws = g["summary"], summ[rank]
        t.check("n", s["n"], ws["n"], 0)
        for f in ("cpu_duration_mean", "gpu_duration_mean", "launch_delay_mean"):
            t.check(f, s[f + "_us"], ws[f], 0.0006)
        t.check("launch_delay_p50", s["launch_delay_p50_us"], ws["launch_delay_p50"], US)
        t.check("launch_delay_max", s["launch_delay_max_us"], ws["launch_delay_max"], US)
        t.check("n_gpu_shorter_than_cpu", s["n_gpu_shorter_than_cpu"],
                ws["n_gpu_shorter_than_cpu(cpu<=50)"], 0)
        t.check("n_runtime_outliers", s["n_runtime_outliers"], ws["n_runtime_outliers(cpu>50)"], 0)
        t.check("n_launch_delay_outliers", s["n_launch_delay_outliers"],
                ws["n_launch_delay_outliers(>100)"], 0)
        t.done()


def check_queue(ci, folder, runs):
    want = {}
    for r in rows(os.path.join(PEERS, folder, "queue_length_summary.csv"), skip=3):
        want[(int(r[0]), int(r[1]))] = [float(x) if x else float("nan") for x in r[2:]]
    blocked = dict_rows(os.path.join(PEERS, folder, "time_blocked_on_full_queue.csv"))
    for rank in sorted({k[0] for k in want}):
        t = Tally("%s queue rank %d" % (folder, rank))
        g = hta(ci, runs, rank, "queue")
        got = {(rank, s["stream"]): s for s in g["streams"]}
        mine = {k for k in want if k[0] == rank}
        if set(got) != mine:
            t.bad.append("streams: kprof %s, HTA %s" % (sorted(got), sorted(mine)))
        for k in sorted(mine & set(got)):
            q = got[k]["queue_length"]
            for i, f in enumerate(("count", "mean", "std", "min", "25%", "50%", "75%", "max")):
                w = want[k][i]
                t.check("stream %d %s" % (k[1], f), q[f], w, 1e-9 * max(1, abs(w)))
        # HTA's blocked-on-full-queue table lists the streams with time at length >= 1024
        want_b = {(int(r["rank"]), int(r["stream"])) for r in blocked}
        got_b = {(rank, s["stream"]) for s in g["streams"]
                 if s["duration_at_max_queue_length_us"] > 0}
        t.check("streams blocked on a full queue", len(got_b),
                len({k for k in want_b if k[0] == rank}), 0)
        t.done()


def check_membw(ci, folder, runs):
    """§11: describe() of the summed bandwidth at the change points, per rank and memory kind;
    every figure comes from the trace's own "memory bandwidth (GB/s)" (none computed)."""
    want = {}
    for r in rows(os.path.join(PEERS, folder, "memory_bw_summary.csv"), skip=3):
        want[(int(r[0]), r[1])] = [float(x) if x else float("nan") for x in r[2:]]
    for rank in sorted({k[0] for k in want}):
        t = Tally("%s membw rank %d" % (folder, rank))
        g = hta(ci, runs, rank, "membw")
        got = {(rank, k["name"]): k for k in g["kinds"]}
        mine = {k for k in want if k[0] == rank}
        if set(got) != mine:
            t.bad.append("kinds: kprof %s, HTA %s" % (sorted(got), sorted(mine)))
        for k in sorted(mine & set(got)):
            q = got[k]["memory_bw_gbps"]
            for i, f in enumerate(("count", "mean", "std", "min", "25%", "50%", "75%", "max")):
                w = want[k][i]
                t.check("%s %s" % (k[1], f), q[f], w, 1e-9 * max(1, abs(w)))
            t.check("%s events without the trace's figure" % k[1],
                    got[k]["bandwidth_from_bytes_per_ns"], 0, 0)
        an = VIA["analyzer"]
        if an is not None:
            # --csv and the text table: the same rows, units in the column names
            base = [KPROFCTL, "hta", "membw", "--analyzer", an.grpc, "--run", str(runs),
                    "--rank", str(rank)]
            c = list(csv.DictReader(run(base + ["--csv"], "kprofctl hta membw --csv")
                                    .splitlines()))
            t.check("CSV rows", len(c), len(mine), 0)
            for r in c:
                w = want.get((rank, r["name"]), [float("nan")] * 8)
                t.check("CSV %s max_gbps (6 digits)" % r["name"], r["max_gbps"], w[7],
                        5e-6 * abs(w[7]))
            text = run(base, "kprofctl hta membw").splitlines()
            assert text[0].lower().split() == ["name", "count", "mean_gbps", "std_gbps", "min_gbps",
                                       "p25_gbps", "p50_gbps", "p75_gbps", "max_gbps",
                                       "events", "bw_from_bytes_per_ns"], text[0]
            t.check("text rows", len(text) - 1, len(mine), 0)
        t.done()


def check_options(ci, folder, runs, rank):
    """kprof's departures, checked against the rows in PostgreSQL."""
    # --exact-ns --include-last-step: the window is the GPU rows' exact span
    lo, hi = kpfix.psql_rows(
        "SELECT min(start_ns), max(start_ns + dur_ns) FROM (SELECT start_ns, dur_ns FROM kernels "
        "WHERE run_id = %d AND rank = %d AND stream IS NOT NULL UNION ALL SELECT start_ns, dur_ns "
        "FROM memcpys WHERE run_id = %d AND rank = %d UNION ALL SELECT start_ns, dur_ns FROM "
        "memsets WHERE run_id = %d AND rank = %d) g" % ((runs, rank) * 3), db=DB)[0]
    g = hta(ci, runs, rank, "temporal", "--exact-ns", "--include-last-step")
    assert abs(g["kernel_time_us"] - (int(hi) - int(lo)) / 1000.0) < 1e-9, (g, lo, hi)
    parts = g["idle_time_us"] + g["compute_time_us"] + g["non_compute_time_us"]
    assert abs(parts - g["kernel_time_us"]) < 1e-6, g
    if VIA["analyzer"] is None:
        assert g["hta_compat"] == {"rounded_to_us": False, "last_step_dropped": False,
                                   "consecutive_kernel_delay_us": 30}, g["hta_compat"]
    d = hta(ci, runs, rank, "temporal")
    print("%s rank %d --exact-ns --include-last-step: window %.3f us (HTA's %.0f us), "
          "idle %.2f%% (HTA's %.2f%%)" % (folder, rank, g["kernel_time_us"], d["kernel_time_us"],
                                          g["idle_time_pctg"], d["idle_time_pctg"]))
    # launch rows with exact ns: every delay >= 0 and as many rows as with the last step
    l = hta(ci, runs, rank, "launch", "--exact-ns", "--include-last-step")
    assert all(x["launch_delay_us"] >= 0 for x in l["launches"])
    assert l["summary"]["n"] >= hta(ci, runs, rank, "launch")["summary"]["n"]


# ---- a trace with a time base: HTA's rounding on the trace's own relative µs -------------

TB_BASE = 1_700_000_000_123_456_789  # baseTimeNanoseconds, with sub-µs digits
TB_SGEMM, TB_EW = "volta_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4>"
TB_NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
TB_MEMCPY = "Memcpy HtoD (Pageable -> Device)"


def time_base_trace(seed=11):
    """Three ProfilerSteps of launches (µs relative to TB_BASE, 3 decimals as Kineto writes
    ns): kernels on streams 7 and 13, memcpys on 7, NCCL kernels on 20 overlapping compute;
    gaps below and above HTA's 30 µs kernel-wait limit, some with the host late."""
    rnd = random.Random(seed)
    r3 = lambda x: round(x, 3)
    cpu, gpu, free = [], [], {7: 0.0, 13: 0.0, 20: 0.0}
    t, corr = 1000.0 + rnd.random(), 1
    for step in range(3):
        s0 = t
        for i in range(40):
            u = rnd.random()
            name, cat, stream, rt = TB_SGEMM if i % 2 else TB_EW, "kernel", 7, "cudaLaunchKernel"
            if u < 0.15:
                name, cat, rt = TB_MEMCPY, "gpu_memcpy", "cudaMemcpyAsync"
            elif u < 0.3:
                name, stream = TB_NCCL, 20
            elif u < 0.55:
                stream = 13
            rt_ts, rt_dur = r3(t), r3(rnd.uniform(2, 9))
            gap = rnd.choice([0.3, 1.7, 4.41, 12.5, 29.6, 31.2, 80.05])
            g_ts = r3(max(free[stream] + gap, rt_ts + rt_dur + rnd.uniform(0.4, 25)))
            g_dur = r3(rnd.uniform(1.5, 120 if stream == 20 else 60))
            free[stream] = g_ts + g_dur
            cpu.append({"ph": "X", "cat": "cuda_runtime", "name": rt, "pid": 1, "tid": 1,
                        "ts": rt_ts, "dur": rt_dur, "args": {"correlation": corr}})
            gpu.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream,
                        "ts": g_ts, "dur": g_dur,
                        "args": {"device": 0, "stream": stream, "correlation": corr}})
            if cat == "gpu_memcpy":  # bytes, but no "memory bandwidth (GB/s)", as a capture
                gpu[-1]["args"]["bytes"] = 37 * 4096 * (corr % 7 + 1)
            corr += 1
            t = rt_ts + rt_dur + rnd.uniform(0.2, 12) + (rnd.random() < 0.1) * rnd.uniform(50, 150)
        cpu.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d" % (step + 1),
                    "pid": 1, "tid": 1, "ts": r3(s0 - 0.5), "dur": r3(t - s0 + 0.9), "args": {}})
        t += 2.25
    gpu.sort(key=lambda e: e["ts"])
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "baseTimeNanoseconds": TB_BASE, "traceEvents": cpu + gpu}


def hta_ktype(n):
    """docs/specs/hta-analyses.md §0 kernel classes."""
    if n.startswith(("nccl", "hip", "hccl")) or "ncclKernel" in n:
        return "COMMUNICATION"
    if n.startswith(("Memcpy", "Memset", "dma")):
        return "MEMORY"
    if any(x in n for x in ("Memcpy", "Memset", "dma", "Sync", "Stream Wait Event")):
        return "OTHER"
    return "COMPUTATION"


def hta_union(iv):
    """HTA's merge_kernel_intervals: sorted by start, a row after the latest end opens a group."""
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def hta_oracle(trace):
    """HTA's pipeline (§0) and analyses §2-§6 on the trace as json.loads reads it: float µs
    relative to its base, start rounded up and end down; the last ProfilerStep dropped."""
    rows = []
    for e in trace["traceEvents"]:
        if "dur" in e and "cat" in e and e["cat"] != "Trace":
            ts, end = math.ceil(e["ts"]), math.floor(e["ts"] + e["dur"])
            a = e.get("args", {})
            rows.append({"name": e["name"], "cat": e["cat"], "ts": ts, "end": end,
                         "stream": a.get("stream", -1), "corr": a.get("correlation", -1),
                         "bytes": a.get("bytes", 0), "dur_ns": round(e["dur"] * 1000)})
    is_gpu = lambda r: r["stream"] >= 0 and r["corr"] >= 0
    steps = [r for r in rows if not is_gpu(r) and r["name"].startswith("ProfilerStep#")]
    if len({r["name"] for r in steps}) >= 2:
        cut = max(r["ts"] for r in steps)
        cpu = [r for r in rows if not is_gpu(r) and r["ts"] < cut]
        corrs = {r["corr"] for r in cpu}
        rows = cpu + [r for r in rows if is_gpu(r) and r["corr"] in corrs]
    rt = {r["corr"]: r for r in rows if not is_gpu(r) and r["corr"] >= 0}
    gpu = [r for r in rows if r["stream"] != -1]
    out = {}
    length = lambda u: sum(b - a for a, b in u)
    lo, hi = min(r["ts"] for r in gpu), max(r["end"] for r in gpu)
    unions = {k: hta_union([(r["ts"], r["end"]) for r in gpu if hta_ktype(r["name"]) == k])
              for k in ("COMPUTATION", "COMMUNICATION", "MEMORY")}
    window, busy = hi - lo, length(hta_union([(r["ts"], r["end"]) for r in gpu]))
    comp = length(unions["COMPUTATION"])
    out["temporal"] = {"kernel_time_us": window, "idle_time_us": window - busy,
                       "compute_time_us": comp, "non_compute_time_us": busy - comp,
                       "idle_time_pctg": 100.0 * (window - busy) / window,
                       "compute_time_pctg": 100.0 * comp / window}
    # overlap: communication time under computation
    both = [(max(a, c), min(b, d)) for a, b in unions["COMMUNICATION"]
            for c, d in unions["COMPUTATION"] if min(b, d) > max(a, c)]
    comm = length(unions["COMMUNICATION"])
    out["overlap"] = {"comm_time_us": comm, "overlap_time_us": length(both),
                      "comp_comm_overlap_pctg": 100.0 * length(both) / comm}
    # kernel types: exclusive time per set of types active
    cuts = sorted({x for u in unions.values() for iv in u for x in iv})
    types = {}
    for a, b in zip(cuts, cuts[1:]):
        on = [k for k in ("COMPUTATION", "COMMUNICATION", "MEMORY")
              if any(c <= a and b <= d for c, d in unions[k])]
        if on:
            label = " overlapping ".join(on)
            types[label] = types.get(label, 0) + b - a
    out["types"] = types
    # idle time per stream and category
    idle = {}
    for s in sorted({r["stream"] for r in gpu}):
        evs = sorted((r for r in gpu if r["stream"] == s and r["cat"] in
                      ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda r: r["ts"])
        for prev, r in zip(evs, evs[1:]):
            gap = r["ts"] - prev["end"]
            launch = rt.get(r["corr"])
            cat = ("host_wait" if launch is not None and launch["ts"] > prev["end"] else
                   "kernel_wait" if gap < 30 else "other")
            idle[(s, cat)] = idle.get((s, cat), 0) + gap
    out["idle"] = idle
    # launch statistics per correlation
    out["launch"] = {r["corr"]: (rt[r["corr"]]["end"] - rt[r["corr"]]["ts"], r["end"] - r["ts"],
                                 max(0, r["ts"] - rt[r["corr"]]["end"]))
                     for r in gpu if r["corr"] in rt and rt[r["corr"]]["name"] in
                     ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaMemcpyAsync",
                      "cudaMemsetAsync")}
    # §11 memory bandwidth, each copy's bytes / exact ns (the trace has no figure): +bw at the
    # start, -bw at the end (0 µs counted as 1), the running sum in time order, the sums > 0
    mem = [r for r in gpu if hta_ktype(r["name"]) == "MEMORY"]
    pts = sorted([(r["ts"], r["bytes"] / r["dur_ns"]) for r in mem] +
                 [(r["end"] if r["end"] != r["ts"] else r["ts"] + 1, -r["bytes"] / r["dur_ns"])
                  for r in mem], key=lambda p: p[0])
    # ties would leave the order to numpy's unstable quicksort; this trace has none
    assert len({p[0] for p in pts}) == len(pts), "the time base trace has tied memcpy points"
    sums, acc = [], 0.0
    for _, bw in pts:
        acc += bw
        if acc > 0:
            sums.append(acc)
    sums.sort()
    q = lambda f: sums[int(f * (len(sums) - 1))] + (
        sums[min(int(f * (len(sums) - 1)) + 1, len(sums) - 1)] - sums[int(f * (len(sums) - 1))]) * (
        f * (len(sums) - 1) - int(f * (len(sums) - 1)))
    mean = sum(sums) / len(sums)
    out["membw"] = {"events": len(mem), "count": len(sums), "mean": mean,
                    "std": math.sqrt(sum((x - mean) ** 2 for x in sums) / (len(sums) - 1)),
                    "min": sums[0], "25%": q(0.25), "50%": q(0.5), "75%": q(0.75),
                    "max": sums[-1]}
    return out


def check_time_base(ci, grpc, tmp):
    """A trace with baseTimeNanoseconds and fractional µs: every figure equals the oracle's,
    which rounds the trace's own relative µs as HTA does."""
    trace = time_base_trace()
    path = os.path.join(tmp, "time_base_rank0.json")
    with open(path, "w") as f:
        json.dump(trace, f)
    run_id = json.loads(run([KPROFCTL, "import", "--collector", grpc, "--job", "hta-time-base",
                             "--json", path], "kprofctl import time_base"))["run_id"]
    want = hta_oracle(trace)
    t = Tally("time base trace temporal, overlap, kernel types, idle, launch")
    g = hta(ci, run_id, 0, "temporal")
    for k, v in want["temporal"].items():
        t.check(k, g[k], v, 1e-9)
    g = hta(ci, run_id, 0, "overlap")
    for k, v in want["overlap"].items():
        t.check(k, g[k], v, 1e-9)
    g = hta(ci, run_id, 0, "kernels")
    got = {k["kernel_type"]: k["sum_us"] for k in g["kernel_types"]}
    if set(got) != set(want["types"]):
        t.bad.append("kernel type labels: kprof %s, HTA %s" % (sorted(got), sorted(want["types"])))
    for k, v in want["types"].items():
        t.check(k, got.get(k), v, 1e-9)
    g = hta(ci, run_id, 0, "idle")
    got = {(s["stream"], c["idle_category"]): c["idle_time_us"] for s in g["streams"]
           for c in s["categories"] if c["idle_time_us"] is not None}
    for k, v in want["idle"].items():
        t.check("idle stream %d %s" % k, got.get(k), v, 1e-9)
    g = hta(ci, run_id, 0, "launch")
    got = {l["correlation"]: (l["cpu_duration_us"], l["gpu_duration_us"], l["launch_delay_us"])
           for l in g["launches"]}
    if set(got) != set(want["launch"]):
        t.bad.append("launch correlations: kprof %d, HTA %d" % (len(got), len(want["launch"])))
    for c, v in sorted(want["launch"].items()):
        for f, x, y in zip(("cpu", "gpu", "delay"), got.get(c, (None,) * 3), v):
            t.check("launch %d %s" % (c, f), x, y, 1e-9)
    t.done()
    # §11 without the trace's figure: kprof says so and divides bytes by the exact ns
    t = Tally("time base trace membw (bytes / exact ns)")
    g = hta(ci, run_id, 0, "membw")["kinds"]
    if [k["name"] for k in g] != ["Memcpy HtoD"]:
        t.bad.append("kinds: kprof %s, want ['Memcpy HtoD']" % [k["name"] for k in g])
    else:
        w = want["membw"]
        t.check("events", g[0]["events"], w["events"], 0)
        t.check("events without the trace's figure", g[0]["bandwidth_from_bytes_per_ns"],
                w["events"], 0)
        for f in ("count", "mean", "std", "min", "25%", "50%", "75%", "max"):
            t.check(f, g[0]["memory_bw_gbps"][f], w[f], 1e-9 * max(1, abs(w[f])))
    t.done()
    print("time base trace: idle %.2f%% (%d us), compute %d us, overlap %.2f%%, %d launches"
          % (want["temporal"]["idle_time_pctg"], want["temporal"]["idle_time_us"],
             want["temporal"]["compute_time_us"], want["overlap"]["comp_comm_overlap_pctg"],
             len(want["launch"])))


def import_folder(grpc, folder, job):
    traces = sorted(glob.glob(os.path.join(PEERS, folder, "*.json.gz")))
    assert traces, "no trace under " + folder
    res = json.loads(run([KPROFCTL, "import", "--collector", grpc, "--job", job, "--json"]
                         + traces, "kprofctl import " + job))
    return res["run_id"]


def check_all(ci, folder, run_id, ranks):
    check_temporal(ci, folder, run_id)
    check_idle(ci, folder, run_id)
    check_overlap(ci, folder, run_id)
    check_kernels(ci, folder, run_id, ranks)
    check_launch(ci, folder, run_id)
    check_queue(ci, folder, run_id)
    check_membw(ci, folder, run_id)
    for rank in ranks:
        check_options(ci, folder, run_id, rank)


def norm(x):
    """x with every number a float (JSON's 3 and 3.0 are the same figure)."""
    if isinstance(x, dict):
        return {k: norm(v) for k, v in x.items()}
    if isinstance(x, list):
        return [norm(v) for v in x]
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    return x


def check_same(an, ci, run_id, rank):
    """kprofctl hta and kprof-analyze hta give the very same figures (the same compute)."""
    for analysis in ("temporal", "idle", "overlap", "kernels", "launch", "queue", "membw"):
        VIA["analyzer"] = an
        got = hta(ci, run_id, rank, analysis)
        VIA["analyzer"] = None
        want = hta(ci, run_id, rank, analysis)
        want.pop("hta_compat")
        want.pop("analysis")
        for k in ("max_queue_length",):
            want.pop(k, None)
        if analysis == "launch":
            for k in ("runtime_cutoff_us", "launch_delay_cutoff_us"):
                want["summary"].pop(k)
        assert norm(got) == norm(want), (analysis, got, want)
    print("run %d rank %d: kprofctl hta = kprof-analyze hta, every analysis" % (run_id, rank))


def main():
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_hta", ci)
    an = Analyzer("it_hta_analyzer", ci)
    try:
        for folder, ranks in (("trace_filter_2rank", [0, 1]), ("ns_resolution_rank0", [0])):
            run_id = import_folder(cd.grpc, folder, "hta-" + folder)
            print("%s: run %d" % (folder, run_id))
            for via in (None, an):
                VIA["analyzer"] = via
                print("-- %s" % ("kprofctl hta (kprof-analyzer)" if via else "kprof-analyze hta"))
                check_all(ci, folder, run_id, ranks)
            VIA["analyzer"] = None
            check_same(an, ci, run_id, ranks[-1])
            print("%s stragglers: kprofctl compare --hta (test_compare.py)" % folder)
        for via in (None, an):
            VIA["analyzer"] = via
            check_time_base(ci, cd.grpc, tempfile.mkdtemp(prefix="kp_hta_", dir=kpfix.TEST_DIR))
        # exit codes: unknown run or rank 3, usage 2, by both paths
        for via in (None, an):
            VIA["analyzer"] = via
            hta(ci, 99999, 0, "temporal", rc=3)
            hta(ci, run_id, 7, "temporal", rc=3)
            hta(ci, run_id, 0, "nosuch", rc=2)
        VIA["analyzer"] = None
        run([ANALYZE, "--run", "1", "hta", "temporal"], "kprof-analyze hta without --pg", rc=2)
        run([KPROFCTL, "hta", "temporal", "--analyzer", an.grpc], "kprofctl hta without --run",
            rc=2)
        run([KPROFCTL, "hta", "idle", "--analyzer", an.grpc, "--run", str(run_id),
             "--consecutive-kernel-delay-us", "-5"], "kprofctl hta: a negative delay", rc=2)
    finally:
        an.stop()
        cd.stop()
    cd.assert_clean_log()
    print("frequent kernel sequences: not reproduced (docs/specs/hta-analyses.md §8)")
    assert not BAD, "%d mismatches with HTA" % len(BAD)
    print("ok")


if __name__ == "__main__":
    main()
