"""CUPTI counters per kernel (`kprof-analyze counters`, `kprofctl counters`, analyzer/counters.h)
end to end, through `kprofctl import` and a real kprof-collectord.

1. A Kineto trace as the CUPTI range profiler writes it (../shared/specs/hta-analyses.md §10,
   torch-trace-formats.md B.4): cpu_ops nested on two threads, cudaLaunchKernel calls (one in
   no op, one cudaMemcpyAsync that is no launch), and one `cuda_profiler_range` event per
   kernel (name = kernel, pid = device, synthetic ts/dur, args = one key per metric, no
   correlation; one event has its args before its cat). Stored rows: one counters row per
   numeric metric plus the range's name row. Every row of `counters --json` is checked against
   values computed here: the positional pairing with the launches (HTA), top/bottom op and the
   op stack, every counter (a missing one and a "N/A" one are null, not 0), FLOPs per precision
   (add + mul + 2 fma) and in total, the duration (gpu__time_duration.sum) and FLOP/s.
   `kprofctl counters` prints the same; CSV leaves unknown cells empty; bad usage exits 2, an
   unknown run or rank 3.
2. The same trace with one more cudaLaunchKernel: counts differ, so (as HTA) nothing is paired:
   counters stay, op stacks are null and the message says why.
3. Ranges that carry args.correlation, with their kernels in the trace: joined by correlation;
   the duration is the kernel's.
4. A run without counters: an empty table and a clear message (JSON, text on stderr), exit 0.
"""
import csv
import io
import json
import math
import os
import subprocess
import tempfile

import kpfix

kpfix.require_env()

DB = "kp_it_counters"
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
ANALYZE = os.path.join(kpfix.BIN, "analyzer", "kprof-analyze")
PID = 4242
PRECS = ("d", "f", "h")
OPS = ("add", "mul", "fma")
DUR = "gpu__time_duration.sum"
TENSOR = "sm__inst_executed_pipe_tensor.sum"


def metric(p, o):
    return "smsp__sass_thread_inst_executed_op_%s%s_pred_on.sum" % (p, o)


def run(args, what, rc=0):
    p = subprocess.run(args, capture_output=True, text=True, timeout=300 * kpfix.SCALE)
    if p.returncode != rc:
        raise AssertionError("%s exited %d (want %d):\nstdout: %s\nstderr: %s"
                             % (what, p.returncode, rc, p.stdout[-2000:], p.stderr))
    for bad in ("Sanitizer", "runtime error:"):
        assert bad not in p.stderr, p.stderr
    return p


def analyze(ci, run_id, *extra, rc=0, rank=0):
    return run([ANALYZE, "--pg", ci, "--run", str(run_id), "--rank", str(rank), "counters"]
               + list(extra), "kprof-analyze counters", rc)


def ctl(ci, run_id, *extra, rc=0, rank=0):
    return run([KPROFCTL, "counters", "--pg", ci, "--run", str(run_id), "--rank", str(rank)]
               + list(extra), "kprofctl counters", rc)


def X(cat, name, tid, ts, dur, pid=PID, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def op(name, tid, ts, dur, ext):
    return X("cpu_op", name, tid, ts, dur, **{"External id": ext})


def rt(name, tid, ts, corr, ext=None, dur=2):
    a = {"cbid": 211, "correlation": corr}
    if ext is not None:
        a["External id"] = ext
    return X("cuda_runtime", name, tid, ts, dur, **a)


def counters_of(i):
    """Range i's metrics (a dict; absent = not recorded; a string = not a number)."""
    c = {}
    for pi, p in enumerate(PRECS):
        for oi, o in enumerate(OPS):
            c[metric(p, o)] = 1000003 * (i + 1) * (pi + 2) + 7919 * (oi + 1) + 123456789 * pi
    c[TENSOR] = 4096 * i
    c[DUR] = 5000 + 1000 * i
    return c


# The kernels in launch order: (kernel name, tid, launch ts, stack outermost first, counters).
def synthetic_kernels():
    k = []
    c0 = counters_of(0)
    k.append(("void gemm_kernel<float>(float*, int)", 100, 20.0, ["aten::linear", "aten::addmm"],
              c0))
    c1 = counters_of(1)
    del c1[DUR]  # no duration: FLOP/s unknown
    k.append(("void relu_kernel<float>(float*)", 100, 70.0,
              ["aten::linear", "aten::relu", "aten::clamp_min"], c1))
    c2 = counters_of(2)
    del c2[metric("f", "fma")]  # fp32 unknown, so the total too
    c2[metric("h", "mul")] = "N/A"  # not a number: unknown, not 0
    k.append(("elementwise_mul_kernel", 100, 130.5, ["aten::mul"], c2))
    c3 = counters_of(3)
    c3[metric("f", "add")] = 1500000.0  # written as a float
    k.append(("kernel_outside_ops", 100, 200.0, [], c3))
    k.append(("reduce_kernel", 200, 310.0, ["aten::sum"], counters_of(4)))
    return k


def synthetic_trace(extra_launch=False):
    ev = [
        X("user_annotation", "ProfilerStep#1", 100, 0, 260, **{"External id": 1}),
        op("aten::linear", 100, 10, 90, 2),
        op("aten::addmm", 100, 12, 48, 3),
        op("aten::relu", 100, 62, 28, 4),
        op("aten::clamp_min", 100, 64, 24, 5),
        op("aten::mul", 100, 120, 30, 6),
        op("aten::sum", 200, 300, 100, 7),
        rt("cudaMemcpyAsync", 100, 14, 499, ext=3),  # not a launch
    ]
    exts = {"aten::addmm": 3, "aten::clamp_min": 5, "aten::mul": 6, "aten::sum": 7}
    for i, (name, tid, ts, stack, c) in enumerate(synthetic_kernels()):
        ev.append(rt("cudaLaunchKernel", tid, ts, 501 + i, ext=exts.get(stack[-1]) if stack
                     else None))
        args = dict(c)
        if i == 4:  # args before cat, as a non-Kineto writer may put them
            e = {"args": args, "ph": "X", "name": name, "pid": 0, "tid": 1,
                 "ts": 1000 + 100 * i, "dur": 100, "cat": "cuda_profiler_range"}
        else:
            e = X("cuda_profiler_range", name, 1, 1000 + 100 * i, 100, pid=0, **args)
        ev.append(e)
    if extra_launch:
        ev.append(rt("cudaLaunchKernel", 100, 240, 600))
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0,
                                                     "world_size": 1},
            "traceEvents": ev}


def expected_synthetic(extra_launch=False):
    rows = []
    for i, (name, tid, ts, stack, c) in enumerate(synthetic_kernels()):
        vals = {m: (v if isinstance(v, (int, float)) else None) for m, v in c.items()}
        prec = {}
        for p in PRECS:
            parts = [vals.get(metric(p, o)) for o in OPS]
            prec[p] = None if None in parts else parts[0] + parts[1] + 2 * parts[2]
        total = None if None in prec.values() else sum(prec.values())
        dur = vals.get(DUR)
        paired = not extra_launch
        rows.append({
            "idx": i + 1, "range": i, "kernel": name, "device": 0,
            "correlation": 501 + i if paired else None, "tid": tid if paired else None,
            "top_op": stack[0] if paired and stack else None,
            "bottom_op": stack[-1] if paired and stack else None,
            "op_stack": stack if paired else [],
            "dur_ns": dur, "flops": total, "flops_fp64": prec["d"], "flops_fp32": prec["f"],
            "flops_fp16": prec["h"],
            "flops_per_s": total / (dur * 1e-9) if total is not None and dur else None,
            "counters": vals})
    return rows


def close(a, b):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0)
    return a == b


def compare(got, want, what):
    bad = []
    assert len(got) == len(want), "%s: %d rows, want %d" % (what, len(got), len(want))
    for g, w in zip(got, want):
        for k, v in w.items():
            if k == "counters":
                names = set(g["counters"])
                for m, x in v.items():
                    if not close(g["counters"].get(m, "absent"), x):
                        bad.append("%s row %d counter %s: got %r want %r"
                                   % (what, w["idx"], m, g["counters"].get(m, "absent"), x))
                for m in names - set(v):
                    if g["counters"][m] is not None:
                        bad.append("%s row %d counter %s: got %r, want null (not recorded)"
                                   % (what, w["idx"], m, g["counters"][m]))
            elif not close(g.get(k, "absent"), v):
                bad.append("%s row %d %s: got %r want %r" % (what, w["idx"], k, g.get(k), v))
    for b in bad:
        print("MISMATCH " + b)
    assert not bad, "%s: %d mismatches" % (what, len(bad))


def import_trace(grpc, tmp, job, trace):
    path = os.path.join(tmp, job + ".json")
    with open(path, "w") as f:
        json.dump(trace, f)
    res = json.loads(run([KPROFCTL, "import", "--collector", grpc, "--job", job, "--json",
                          "--rank", "0", path], "kprofctl import " + job).stdout)
    return res["run_id"]


def check_synthetic(ci, grpc, tmp):
    run_id = import_trace(grpc, tmp, "ctr-synth", synthetic_trace())
    # stored: per range one row per numeric metric and one name row
    want_rows = sum(1 + sum(isinstance(v, (int, float)) for v in c.values())
                    for (_n, _t, _ts, _s, c) in synthetic_kernels())
    n = int(kpfix.psql("SELECT count(*) FROM counters WHERE run_id = %d" % run_id, db=DB))
    assert n == want_rows, "counters rows: %d, want %d" % (n, want_rows)
    pos = kpfix.psql("SELECT count(DISTINCT correlation) FROM counters WHERE run_id = %d AND "
                     "correlation >= 4611686018427387904" % run_id, db=DB)
    assert pos == "5", pos

    d = json.loads(analyze(ci, run_id, "--json").stdout)
    assert d["run"] == run_id and d["rank"] == 0 and d["message"] is None, d["message"]
    want = expected_synthetic()
    assert sorted(d["metrics"]) == d["metrics"]
    assert set(d["metrics"]) == set(want[0]["counters"]), d["metrics"]
    compare(d["rows"], want, "synthetic")
    print("synthetic: %d rows match (counters, op stacks, FLOPs)" % len(want))

    # kprofctl prints the same
    d2 = json.loads(ctl(ci, run_id, "--json").stdout)
    assert d2 == d, "kprofctl counters --json differs from kprof-analyze"

    # CSV: every column, unknown cells empty
    text = ctl(ci, run_id, "--csv").stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(want)
    assert rows[2]["flops"] == "" and rows[2][metric("h", "mul")] == "", rows[2]
    assert rows[2][metric("f", "fma")] == "" and rows[3]["top_op"] == "", rows[3]
    assert rows[1]["op_stack"] == "aten::linear > aten::relu > aten::clamp_min", rows[1]
    assert float(rows[0]["flops"]) == want[0]["flops"], (rows[0]["flops"], want[0]["flops"])

    # text: the default columns, "-" for unknown
    p = analyze(ci, run_id)
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["idx", "kernel", "device", "top_op", "bottom_op", "dur_ns",
                                "flops", "flops_per_s"], lines[0]
    assert len(lines) == 1 + len(want), p.stdout
    p = ctl(ci, run_id, "-c", "idx,bottom_op," + metric("f", "fma"))
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["idx", "bottom_op", metric("f", "fma")], lines[0]
    assert lines[3].split() == ["3", "aten::mul", "-"], lines[3]

    # usage and unknown run/rank
    ctl(ci, run_id, "-c", "idx,nosuch", rc=2)
    analyze(ci, run_id, "-c", "idx,nosuch", rc=2)
    ctl(ci, run_id, "--json", "--csv", rc=2)
    ctl(ci, 999999, rc=3)
    ctl(ci, run_id, rc=3, rank=5)
    analyze(ci, 999999, rc=3)


def check_unpaired(ci, grpc, tmp):
    run_id = import_trace(grpc, tmp, "ctr-unpaired", synthetic_trace(extra_launch=True))
    d = json.loads(analyze(ci, run_id, "--json").stdout)
    assert d["message"] and "not mapped" in d["message"], d["message"]
    compare(d["rows"], expected_synthetic(extra_launch=True), "unpaired")
    p = ctl(ci, run_id)
    assert "not mapped" in p.stderr, p.stderr
    print("unpaired: counters kept, op stacks null, message: %s" % d["message"])


def check_correlated(ci, grpc, tmp):
    ev = [op("aten::matmul", 100, 10, 50, 2), op("aten::mm", 100, 12, 40, 3),
          op("aten::add", 100, 70, 20, 4)]
    want = []
    for i, (name, ts, stack, ext) in enumerate([
            ("sm80_xmma_gemm_f32f32", 20, ["aten::matmul", "aten::mm"], 3),
            ("vectorized_add_kernel", 75, ["aten::add"], 4)]):
        corr = 700 + i
        ev.append(rt("cudaLaunchKernel", 100, ts, corr, ext=ext))
        ev.append(X("kernel", name, 7, 500 + 10 * i, 3.25 + i, pid=0,
                    **{"External id": ext, "device": 0, "stream": 7, "correlation": corr}))
        c = counters_of(i + 10)
        del c[DUR]  # the duration comes from the kernel
        ev.append(X("cuda_profiler_range", name, 1, 2000 + 10 * i, 10, pid=0,
                    correlation=corr, **c))
        prec = [c[metric(p, "add")] + c[metric(p, "mul")] + 2 * c[metric(p, "fma")]
                for p in PRECS]
        dur = int(round((3.25 + i) * 1000))
        want.append({"idx": i + 1, "range": i, "kernel": name, "correlation": corr, "tid": 100,
                     "top_op": stack[0], "bottom_op": stack[-1], "op_stack": stack,
                     "dur_ns": dur, "flops": sum(prec), "flops_fp64": prec[0],
                     "flops_fp32": prec[1], "flops_fp16": prec[2],
                     "flops_per_s": sum(prec) / (dur * 1e-9), "counters": c})
    run_id = import_trace(grpc, tmp, "ctr-corr", {"traceEvents": ev})
    corrs = kpfix.psql("SELECT string_agg(DISTINCT correlation::text, ',') FROM counters "
                       "WHERE run_id = %d" % run_id, db=DB)
    assert corrs == "700,701", corrs
    d = json.loads(analyze(ci, run_id, "--json").stdout)
    assert d["message"] is None, d["message"]
    compare(d["rows"], want, "correlated")
    print("correlated: %d rows joined by correlation to launches and kernels" % len(want))


def check_empty(ci, grpc, tmp):
    ev = [op("aten::mm", 100, 10, 40, 3), rt("cudaLaunchKernel", 100, 20, 900, ext=3),
          X("kernel", "gemm", 7, 50, 4, pid=0, **{"External id": 3, "device": 0, "stream": 7,
                                                    "correlation": 900})]
    run_id = import_trace(grpc, tmp, "ctr-empty", {"traceEvents": ev})
    d = json.loads(analyze(ci, run_id, "--json").stdout)
    assert d["rows"] == [] and d["metrics"] == [], d
    assert d["message"] and "no CUPTI counters" in d["message"], d["message"]
    p = ctl(ci, run_id)
    assert p.stdout.splitlines()[0].split()[0] == "idx" and len(p.stdout.splitlines()) == 1
    assert "no CUPTI counters in run %d rank 0" % run_id in p.stderr, p.stderr
    text = ctl(ci, run_id, "--csv").stdout
    assert text.splitlines()[0].startswith("idx,range,kernel") and len(text.splitlines()) == 1
    print("empty: %s" % d["message"])


def main():
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_counters", ci)
    tmp = tempfile.mkdtemp(prefix="kp_counters_", dir=kpfix.TEST_DIR)
    try:
        check_synthetic(ci, cd.grpc, tmp)
        check_unpaired(ci, cd.grpc, tmp)
        check_correlated(ci, cd.grpc, tmp)
        check_empty(ci, cd.grpc, tmp)
    finally:
        cd.stop()
    cd.assert_clean_log()
    print("ok")


if __name__ == "__main__":
    main()
