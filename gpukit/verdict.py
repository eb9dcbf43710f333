#!/usr/bin/env python3
"""gpukit/verdict.py: the GPU validation kit's verdict, computed from what run-on-gpu.sh wrote.

    python3 gpukit/verdict.py RESULTS [--report FILE] [--dur-tol 0.15] [--json FILE]

RESULTS is gpukit-results.tar.gz (or the results/ folder inside it). The report (--report,
default gpukit-report.txt beside RESULTS) is written and printed; --json also writes the
figures as JSON.

Checks, per rank and per step of kprof's captured window (each must hold for PASS):
  steps      kprof captured exactly the steps torch.profiler recorded (ProfilerStep#N), both
             numbered by the training loop's iteration
  kernels    the same kernels: names and count per step
  ops        every kernel attributed to the same op (the innermost operator that launched it:
             kprof's op id, torch.profiler's "External id") - compared as (kernel, op) counts
  durations  per step, the median relative difference of paired kernels' durations (the same
             kernel name, paired in GPU order) is at most --dur-tol (different runs: different
             timings; 0.15 by default)
  memcpy     the same memcpys and memsets per step (names and count)
             (CUPTI's own overhead records, where either side has them, are summed per step
             and shown beside, not compared)
  analyzer   kprof-analyzer's kernel view (kprofctl kernels --json, by name: every kernel)
             counts the same calls per kernel name as torch.profiler over the window
  drops      kprof dropped nothing: the capture's per-rank "dropped", and the library's
             records_dropped, cupti_dropped, ranges_dropped and buffers_declined are 0
  phases     every phase of run-on-gpu.sh ran
Reported without deciding PASS/FAIL (WARN lines when high): the median step time of each run
(steps 5.. of baseline and dormant, the captured window under kprof and under torch.profiler)
and the step-time cost ratios: dormant / baseline, capturing / baseline, torch.profiler /
baseline, and kprof's dormant and capture costs (step time over the baseline's) as fractions
of torch.profiler's.
Exit status: 0 PASS; 1 FAIL; 2 the results cannot be read.
"""

import argparse
import collections
import gzip
import json
import os
import re
import statistics
import sys
import tarfile
import tempfile

GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "overhead": "overhead"}
API_CATS = ("cuda_runtime", "cuda_driver")
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
WARMUP_STEPS = 5  # steps left out of the baseline and dormant medians


class Unusable(Exception):
    pass


def load_json(path):
    try:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise Unusable("%s: %s" % (path, e))


def load_trace(path):
    """Kineto-dialect trace -> {step: [{"kind", "name", "op", "dur", "ts"}]}, and its steps."""
    doc = load_json(path)
    evs = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    steps, ext_op, ext_ts, launch = {}, {}, {}, {}
    gpu = []
    for e in evs:
        if e.get("ph") != "X":
            continue
        cat, name, args = e.get("cat", ""), e.get("name", ""), e.get("args") or {}
        m = STEP_RE.match(name)
        if m and cat in ("user_annotation", "cpu_op"):
            steps[int(m.group(1))] = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            continue
        if cat in GPU_CATS:
            gpu.append(e)
        elif cat in API_CATS:
            if "correlation" in args:
                launch[args["correlation"]] = float(e["ts"])
        elif "External id" in args and cat in ("cpu_op", "user_annotation", "python_function"):
            ext_op.setdefault(args["External id"], name)
            ext_ts.setdefault(args["External id"], float(e["ts"]))
    by_step = collections.defaultdict(list)
    order = sorted(steps.items(), key=lambda kv: kv[1][0])
    for e in gpu:
        args = e.get("args") or {}
        # The step is the one the launch happened in (the GPU runs later): the launch call's
        # time, else its op's, else (neither recorded) the activity's own.
        t = launch.get(args.get("correlation"))
        if t is None:
            t = ext_ts.get(args.get("External id"), float(e["ts"])) if args.get("External id") else float(e["ts"])
        step = None
        for n, (lo, hi) in order:
            if lo <= t <= hi:
                step = n
                break
        if step is None:
            continue
        by_step[step].append({
            "kind": GPU_CATS[e["cat"]],
            "name": e.get("name", ""),
            "op": ext_op.get(args.get("External id"), "") if args.get("External id") else "",
            "dur": float(e.get("dur", 0)),
            "ts": float(e["ts"]),
        })
    return by_step, sorted(steps)


def counter_diff(a, b, fmt):
    """Lines naming what a has more or fewer of than b."""
    out = []
    for k in sorted(set(a) | set(b), key=str):
        if a.get(k, 0) != b.get(k, 0):
            out.append("%s: kprof %d, torch.profiler %d" % (fmt(k), a.get(k, 0), b.get(k, 0)))
    return out


def short(name, n=70):
    return name if len(name) <= n else name[: n - 3] + "..."


def median_ms(rec, steps=None, first=WARMUP_STEPS):
    v = [s["ms"] for s in rec.get("steps", []) if (steps is None and s["step"] >= first) or (steps is not None and s["step"] in steps)]
    return statistics.median(v) if v else None


def find_rank_files(folder, pattern):
    out = {}
    if not os.path.isdir(folder):
        return out
    for f in os.listdir(folder):
        m = re.search(pattern, f)
        if m:
            out[int(m.group(1))] = os.path.join(folder, f)
    return out


def verdict(res, dur_tol):
    rep, fails, warns = [], [], []
    figures = {"ranks": {}, "dur_tol": dur_tol}

    def fail(msg):
        fails.append(msg)

    summ = load_json(os.path.join(res, "summary.json"))
    figures["dry_run"] = summ.get("dry_run")
    rep.append("kprof GPU validation kit - verdict%s" % (" (DRY RUN: fake libcupti and kprof-test-worker)" if summ.get("dry_run") else ""))
    setup = {}
    if os.path.exists(os.path.join(res, "setup.json")):
        setup = load_json(os.path.join(res, "setup.json"))
        rep.append("libcupti: %s; libkprof_inject.so: %s" % (setup.get("libcupti"), setup.get("inject_how")))
    for p in summ.get("phases", []):
        rep.append("phase %-9s %-6s %4ss  %s" % (p["phase"], p["status"], p["seconds"], p["detail"]))
        if p["status"] != "ok":
            fail("phase %s failed: %s" % (p["phase"], p["detail"]))
    names = [p["phase"] for p in summ.get("phases", [])]
    for want in ("setup", "stack", "baseline", "dormant", "capture", "torchprof"):
        if want not in names:
            fail("phase %s did not run" % want)

    cap = os.path.join(res, "capture")
    status = []
    if os.path.exists(os.path.join(cap, "status.json")):
        try:
            status = load_json(os.path.join(cap, "status.json"))
        except Unusable as e:
            fail("capture status unreadable: %s" % e)
    window = None
    for row in status:
        if row.get("state") != "done":
            fail("rank %s: capture state %s (%s)" % (row.get("rank"), row.get("state"), row.get("reason")))
        if row.get("dropped"):
            fail("rank %s: kprof dropped %s records in the capture" % (row.get("rank"), row.get("dropped")))
        if row.get("steps"):
            a, b = (int(x) for x in row["steps"].split("-"))
            window = set(range(a, b + 1)) if window is None else window
            if set(range(a, b + 1)) != window:
                fail("ranks captured different steps: %s" % row["steps"])
    if window:
        run_id = "?"
        if os.path.exists(os.path.join(cap, "run")):
            with open(os.path.join(cap, "run")) as f:
                run_id = f.read().strip()
        rep.append("kprof captured steps %d-%d (run %s)" % (min(window), max(window), run_id))
    figures["window"] = sorted(window) if window else None

    kx = find_rank_files(os.path.join(cap, "export"), r"rank-(\d+)\.pt\.trace\.json$")
    tx = find_rank_files(os.path.join(res, "torchprof"), r"^torch-trace\.rank-(\d+)\.json$")
    if not kx:
        fail("no kprof export in capture/export/")
    if not tx:
        fail("no torch.profiler trace in torchprof/")
    all_pairs = []
    kprof_steps = figures["kprof_steps"] = {}  # rank -> step -> kprof's kernels, memcpys, memsets
    for rank in sorted(set(kx) | set(tx)):
        fr = figures["ranks"].setdefault(rank, {})
        if rank not in kx or rank not in tx:
            fail("rank %d: %s missing" % (rank, "kprof's export" if rank not in kx else "torch.profiler's trace"))
            continue
        ks, ksteps = load_trace(kx[rank])
        ts, tsteps = load_trace(tx[rank])
        kset = {s for s in ks if any(e["kind"] != "overhead" for e in ks[s])}
        tset = {s for s in ts if any(e["kind"] != "overhead" for e in ts[s])}
        if window is not None and kset != window:
            fail("rank %d: kprof's export has GPU activity in steps %s, the capture says %s" % (rank, sorted(kset), sorted(window)))
        if kset != tset:
            fail("rank %d: steps differ: kprof %s, torch.profiler %s" % (rank, sorted(kset), sorted(tset)))
        rep.append("")
        rep.append("rank %d: steps kprof %s, torch.profiler %s" % (rank, fmt_steps(kset), fmt_steps(tset)))
        rep.append("  %-5s %8s %8s %8s %10s %9s %9s %12s %12s" % (
            "step", "kernels", "torch", "ops ok", "dur.med.%", "memcpy", "torch", "overhead.us", "torch"))
        tot_t = collections.Counter()
        for step in sorted(kset & tset):
            kk = [e for e in ks[step] if e["kind"] == "kernel"]
            tk = [e for e in ts[step] if e["kind"] == "kernel"]
            tot_t.update(e["name"] for e in tk)
            kn, tn = collections.Counter(e["name"] for e in kk), collections.Counter(e["name"] for e in tk)
            ko = collections.Counter((e["name"], e["op"]) for e in kk)
            to = collections.Counter((e["name"], e["op"]) for e in tk)
            for d in counter_diff(kn, tn, lambda k: "kernel " + short(k)):
                fail("rank %d step %d: %s" % (rank, step, d))
            op_bad = counter_diff(ko, to, lambda k: "kernel %s under op %s" % (short(k[0], 50), k[1] or "(none)"))
            for d in op_bad:
                fail("rank %d step %d: %s" % (rank, step, d))
            ops_ok = sum((ko & to).values())
            diffs = []
            for name in tn:
                a = sorted((e for e in kk if e["name"] == name), key=lambda e: e["ts"])
                b = sorted((e for e in tk if e["name"] == name), key=lambda e: e["ts"])
                for x, y in zip(a, b):
                    if y["dur"] > 0:
                        diffs.append(abs(x["dur"] - y["dur"]) / y["dur"])
            med = statistics.median(diffs) if diffs else 0.0
            all_pairs += diffs
            if med > dur_tol:
                fail("rank %d step %d: kernel durations differ by %.1f%% (median), over the %.0f%% tolerance" % (rank, step, 100 * med, 100 * dur_tol))
            km = collections.Counter(e["name"] for e in ks[step] if e["kind"] in ("memcpy", "memset"))
            tm = collections.Counter(e["name"] for e in ts[step] if e["kind"] in ("memcpy", "memset"))
            ko_us = sum(e["dur"] for e in ks[step] if e["kind"] == "overhead")
            to_us = sum(e["dur"] for e in ts[step] if e["kind"] == "overhead")
            for d in counter_diff(km, tm, lambda k: k):
                fail("rank %d step %d: %s" % (rank, step, d))
            kprof_steps.setdefault(rank, {})[step] = [
                {k: e[k] for k in ("kind", "name", "op", "dur")} for e in sorted(ks[step], key=lambda e: e["ts"])
                if e["kind"] != "overhead"]
            fr[step] = {"kernels": len(kk), "torch_kernels": len(tk), "ops_agree": ops_ok, "dur_median_rel_diff": med,
                        "memcpy_memset": sum(km.values()), "torch_memcpy_memset": sum(tm.values()),
                        "cupti_overhead_us": ko_us, "torch_cupti_overhead_us": to_us}
            rep.append("  %-5d %8d %8d %8d %10.2f %9d %9d %12.1f %12.1f" % (
                step, len(kk), len(tk), ops_ok, 100 * med, sum(km.values()), sum(tm.values()), ko_us, to_us))
        # kprof-analyzer's kernel view against torch.profiler's totals over the window.
        ap = os.path.join(cap, "analyzer-kernels.rank-%d.json" % rank)
        if os.path.exists(ap):
            try:
                rows = load_json(ap)
                ac = collections.Counter()
                for r in rows:
                    ac[r["name"]] += int(r["calls"])
                bad = counter_diff(ac, tot_t, lambda k: "analyzer: kernel %s" % short(k))
                for d in bad:
                    fail("rank %d: %s" % (rank, d))
                rep.append("  kprof-analyzer kernel view: %d calls, torch.profiler %d: %s" % (sum(ac.values()), sum(tot_t.values()), "agree" if not bad else "DIFFER"))
            except (Unusable, KeyError, TypeError, ValueError) as e:
                fail("rank %d: analyzer kernel view unreadable: %s" % (rank, e))
        else:
            fail("rank %d: no analyzer kernel view (capture/analyzer-kernels.rank-%d.json)" % (rank, rank))

    # Step times and kprof's own counters.
    rep.append("")
    runs = {}
    for ph in ("baseline", "dormant", "capture", "torchprof"):
        runs[ph] = {r: load_json(p) for r, p in find_rank_files(os.path.join(res, ph), r"^steps\.rank-(\d+)\.json$").items()}
    for ph in ("capture", "torchprof"):
        for r, rec in sorted(runs[ph].items()):
            if r == 0:
                rep.append("%s: %s, torch %s, CUDA %s, backend %s, libcupti mapped: %s" % (
                    ph, rec.get("device"), rec.get("torch", "-"), rec.get("cuda", "-"), rec.get("backend"),
                    ", ".join(rec.get("cupti_loaded") or []) or "none"))
            if len(rec.get("cupti_loaded") or []) > 1:
                warns.append("rank %d (%s): two libcupti copies in one process: %s" % (r, ph, rec["cupti_loaded"]))
    for r, rec in sorted(runs["capture"].items()):
        st = rec.get("kprof_stats") or {}
        if "error" in st:
            warns.append("rank %d: kprof counters unreadable: %s" % (r, st["error"]))
        for k in ("records_dropped", "cupti_dropped", "ranges_dropped", "buffers_declined", "names_overflow"):
            if st.get(k):
                fail("rank %d: kprof's %s = %d" % (r, k, st[k]))
        if st:
            rep.append("rank %d kprof counters: %s" % (r, ", ".join("%s=%s" % (k, st.get(k)) for k in (
                "records_sent", "records_dropped", "cupti_dropped", "ranges", "ranges_dropped", "buffers_declined", "captures"))))
    tw = window or set()
    med = {}
    for ph, recs in runs.items():
        vals = []
        for r, rec in sorted(recs.items()):
            m = median_ms(rec, tw if ph in ("capture", "torchprof") and tw else None)
            if m is not None:
                vals.append(m)
        med[ph] = statistics.mean(vals) if vals else None
    figures["step_ms"] = med
    rep.append("median step time (ms, mean of the ranks): baseline %s, kprof dormant %s, kprof capturing %s, torch.profiler %s" % tuple(
        "%.3f" % med[p] if med[p] is not None else "n/a" for p in ("baseline", "dormant", "capture", "torchprof")))
    ratios = {}
    b = med.get("baseline")
    if b:
        for p in ("dormant", "capture", "torchprof"):
            if med.get(p):
                ratios[p + "/baseline"] = med[p] / b
        if med.get("torchprof") and med["torchprof"] - b > 0:
            for p, label in (("dormant", "kprof dormant cost"), ("capture", "kprof capture cost")):
                if med.get(p):
                    ratios[label + " / torch.profiler cost"] = (med[p] - b) / (med["torchprof"] - b)
    figures["ratios"] = ratios
    for k, v in ratios.items():
        rep.append("  %-42s %.3f" % (k, v))
    if ratios.get("dormant/baseline", 1) > 1.02:
        warns.append("kprof dormant costs %.1f%% of the step time" % (100 * (ratios["dormant/baseline"] - 1)))
    if ratios.get("capture/baseline", 1) > max(1.02, ratios.get("torchprof/baseline", 1)):
        warns.append("capturing with kprof costs more step time than torch.profiler")
    if all_pairs:
        figures["dur_median_rel_diff_all"] = statistics.median(all_pairs)
        rep.append("kernel durations: median relative difference %.2f%% over %d paired kernels (tolerance %.0f%% per step)" % (
            100 * figures["dur_median_rel_diff_all"], len(all_pairs), 100 * dur_tol))
    rep.append("")
    for w in warns:
        rep.append("WARN " + w)
    for f in fails[:60]:
        rep.append("FAIL " + f)
    if len(fails) > 60:
        rep.append("FAIL ... and %d more" % (len(fails) - 60))
    rep.append("VERDICT: %s" % ("PASS" if not fails else "FAIL (%d problems)" % len(fails)))
    figures["verdict"] = "PASS" if not fails else "FAIL"
    figures["failures"] = fails
    figures["warnings"] = warns
    return "\n".join(rep) + "\n", figures


def fmt_steps(s):
    s = sorted(s)
    if not s:
        return "none"
    if s == list(range(s[0], s[-1] + 1)):
        return "%d-%d" % (s[0], s[-1])
    return ",".join(map(str, s))


def main(argv):
    ap = argparse.ArgumentParser(description="gpukit verdict: kprof's capture against torch.profiler")
    ap.add_argument("results", help="gpukit-results.tar.gz or its results/ folder")
    ap.add_argument("--report", help="report file (default: gpukit-report.txt beside RESULTS)")
    ap.add_argument("--json", help="also write the figures as JSON here")
    ap.add_argument("--dur-tol", type=float, default=0.15, help="largest median relative kernel duration difference per step (0.15)")
    a = ap.parse_args(argv)
    if not os.path.exists(a.results):
        print("verdict: %s does not exist" % a.results, file=sys.stderr)
        return 2
    report = a.report or os.path.join(os.path.dirname(os.path.abspath(a.results)), "gpukit-report.txt")
    tmp = None
    res = a.results
    try:
        if os.path.isfile(res):
            tmp = tempfile.TemporaryDirectory(prefix="gpukit-verdict.")
            with tarfile.open(res) as t:
                for m in t.getmembers():  # only plain files and folders, inside the folder
                    if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in m.name.split("/"):
                        raise Unusable("%s: unexpected member %s" % (res, m.name))
                t.extractall(tmp.name)
            res = os.path.join(tmp.name, "results")
        text, figures = verdict(res, a.dur_tol)
    except (Unusable, tarfile.TarError) as e:
        print("verdict: cannot read the results: %s" % e, file=sys.stderr)
        return 2
    finally:
        if tmp:
            tmp.cleanup()
    with open(report, "w") as f:
        f.write(text)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=1, default=str)
    sys.stdout.write(text)
    print("report: %s" % report)
    return 0 if figures["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
