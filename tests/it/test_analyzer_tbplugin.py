"""The analyzer against the PyTorch Profiler TensorBoard plugin's own test cases
(../shared/peers/tbplugin/cases, format and comparison rule in its README.md).

Every case with a trace is imported with `kprofctl import` through a real kprof-collectord into
a fresh database, then `kprof-analyze` computes the views kprof has so far (step breakdown,
operator view, kernel view) and each expected figure is compared under the README's rule:
exact, except |a-b| < 5e-8 under an `approx` path; rows matched by their key fields; `count` is
the number of rows; `null` means absent. Keys of views kprof does not compute yet are printed
as "not implemented yet" and neither pass nor fail. Range cases are the C unit test
tests/unit/test_analyzer_ranges.c.

The double-count bug (spec tbplugin-views.md §4): once one category covers every step, the
plugin takes the next category unmasked and counts that time twice. The case's step figures
are checked against `kprof-analyze --plugin-compat`; kprof's own figure is checked against one
derived here from the plugin-compatible one: identical up to the category that used up the
last free step time, 0 after it, so the categories always sum to the step time. Where the two
differ, the test prints both."""
import csv
import glob
import json
import os
import subprocess
import sys
import tempfile

import kpfix

kpfix.require_env()

DB = "kp_it_analyzer"
SHARED = os.path.join(os.environ.get("KPROF_SOURCE_DIR", "."), "..", "shared")
CASES = os.path.join(SHARED, "peers", "tbplugin", "cases")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
ANALYZE = os.path.join(kpfix.BIN, "analyzer", "kprof-analyze")
CATS = ["kernel_us", "memcpy_us", "memset_us", "communication_us", "runtime_us",
        "dataloader_us", "cpu_exec_us", "other_us"]
# The expected keys each implemented view answers (top level, and inside per_worker[w]).
IMPLEMENTED = {"flags", "step_count", "steps", "avg_step", "operators_by_name",
               "operators_by_name_and_input_shape", "kernels_by_name", "kernels_by_name_op",
               "operators_absent", "tensor_cores", "gpu", "comm_node_count", "memory_stats"}
ROW_KEYS = {"operators_by_name": ("name",), "operators_by_name_and_input_shape": ("name", "input_shape"),
            "kernels_by_name": ("name",), "steps": ("index",),
            "kernels_by_name_op": ("name", "op_name", "grid", "block", "registers_per_thread",
                                   "shared_memory")}


def run(args, what):
    p = subprocess.run(args, capture_output=True, text=True, timeout=300 * kpfix.SCALE)
    if p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s" % (what, p.returncode, p.stderr))
    for bad in ("Sanitizer", "runtime error:"):
        assert bad not in p.stderr, p.stderr
    return p.stdout


def analyze(ci, run_id, rank, *verb):
    return json.loads(run([ANALYZE, "--pg", ci, "--run", str(run_id), "--rank", str(rank)] +
                          list(verb) + ["--json"], "kprof-analyze " + " ".join(verb)))


def derive_kprof(compat):
    """kprof's figure from the plugin-compatible one: equal up to the category after which no
    step time was left free, zero after it (and Other zero)."""
    steps = compat["steps"]
    total = sum(s["total_us"] for s in steps)
    cum, cut = 0, None
    for i, c in enumerate(CATS[:-1]):
        cum += sum(s[c] for s in steps)
        if total > 0 and cum >= total:
            cut = i
            break
    out = []
    for s in steps:
        d = dict(s)
        if cut is not None:
            for c in CATS[cut + 1:]:
                d[c] = 0
        out.append(d)
    return out, (CATS[cut] if cut is not None else None)


class Checker:
    def __init__(self, case, approx):
        self.case, self.approx = case, [a.strip("/").split("/") for a in approx or []]
        self.ok, self.bad, self.todo = [], [], []

    def is_approx(self, path):
        segs = path.strip("/").split("/")
        for a in self.approx:
            if len(a) <= len(segs) and all(x == "*" or x == y for x, y in zip(a, segs)):
                return True
        return False

    def value(self, path, want, got):
        if want is None:
            good = got is None
        elif isinstance(want, bool) or isinstance(want, str):
            good = got == want
        elif isinstance(want, (int, float)):
            if not isinstance(got, (int, float)) or isinstance(got, bool):
                good = False
            elif self.is_approx(path):
                good = abs(float(want) - float(got)) < 5e-8
            else:
                good = float(want) == float(got)
        elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
            good = all(self.value_quiet(path, w, g) for w, g in zip(want, got))
        else:
            good = want == got
        (self.ok if good else self.bad).append((path, want, got))
        return good

    def value_quiet(self, path, want, got):
        if isinstance(want, (int, float)) and isinstance(got, (int, float)):
            return (abs(want - got) < 5e-8) if self.is_approx(path) else float(want) == float(got)
        return want == got

    def table(self, path, name, want, got_rows):
        if "count" in want:
            self.value(path + "/count", want["count"], len(got_rows))
        keys = ROW_KEYS.get(name, ("name",))
        if want.get("ordered"):
            print("    %s: 'ordered' (the plugin's internal first-seen order); kprof sorts by "
                  "total time, so rows are matched by their key fields" % path)
        for i, w in enumerate(want.get("rows", [])):
            k = [f for f in keys if f in w]
            match = [g for g in got_rows if all(g.get(f) == w[f] for f in k)]
            rp = "%s/rows/%d" % (path, i)
            if len(match) != 1:
                self.bad.append((rp, {f: w[f] for f in k}, "%d matching rows" % len(match)))
                continue
            for f, v in w.items():
                if f in k:
                    continue
                if f not in match[0]:
                    self.todo.append(rp + "/" + f)
                else:
                    self.value(rp + "/" + f, v, match[0][f])


def check_rank(chk, prefix, exp, got):
    for key, want in exp.items():
        path = prefix + "/" + key
        if key not in IMPLEMENTED:
            chk.todo.append(path)
        elif key == "flags":
            for f, v in want.items():
                chk.value(path + "/" + f, v, got["flags"].get(f))
        elif key in ("step_count", "comm_node_count"):
            chk.value(path, want, got[key])
        elif key == "steps":
            chk.table(path, "steps", {"rows": want}, got["steps"])
        elif key == "avg_step":
            for f, v in want.items():
                chk.value(path + "/" + f, v, got["avg_step"].get(f))
        elif key == "gpu":
            g = got["gpu"]
            for k, v in want.items():
                if k == "gpu_ids":
                    chk.value(path + "/gpu_ids", v, g["gpu_ids"])
                elif k == "per_device":
                    for dev, m in v.items():
                        for f, x in m.items():
                            q = "%s/per_device/%s/%s" % (path, dev, f)
                            if f in ("utilization", "est_sm_efficiency",
                                     "est_achieved_occupancy"):
                                chk.value(q, x, g["per_device"].get(dev, {}).get(f))
                            else:
                                chk.todo.append(q)
                elif k in ("util_timeline", "sm_efficiency_ranges"):
                    # The range is min..max of the events: import drops the "PyTorch
                    # Profiler (0)" span, and these cases have none.
                    for dev, pts in v.items():
                        q = "%s/%s/%s" % (path, k, dev)
                        mine = g[k].get(dev) or []
                        chk.value(q + "/count", len(pts), len(mine))
                        for i, pt in enumerate(pts):  # each point approx, by position
                            chk.value("%s/%d" % (q, i), pt, mine[i] if i < len(mine) else None)
                else:
                    chk.todo.append(path + "/" + k)
        elif key == "tensor_cores":
            t = got["tensor_cores"]
            for g, v in want.get("tc_ratio_per_gpu", {}).items():
                chk.value(path + "/tc_ratio_per_gpu/" + g, v, (t["tc_ratio_per_gpu"] or {}).get(g))
            if "tc_eligible_ops_kernel_ratio" in want:
                chk.value(path + "/tc_eligible_ops_kernel_ratio", want["tc_eligible_ops_kernel_ratio"],
                          t["tc_eligible_ops_kernel_ratio"])
        elif key == "memory_stats":
            m = got["memory_stats"]
            chk.value(path + "/device_count", want["device_count"], m["device_count"])
            for dev, ops in want.get("devices", {}).items():
                for op, fields in ops.items():
                    for f, v in fields.items():
                        chk.value("%s/devices/%s/%s/%s" % (path, dev, op, f), v,
                                  m["devices"].get(dev, {}).get(op, {}).get(f))
        elif key == "operators_absent":
            names = {r["name"] for r in got["operators_by_name"]["rows"]}
            for n in want:
                chk.value(path + "/" + n, True, n not in names)
        else:
            chk.table(path, key, want, got[key]["rows"])


def results(ci, run_id, rank):
    compat = analyze(ci, run_id, rank, "--plugin-compat", "breakdown")["breakdown"]
    own = analyze(ci, run_id, rank, "breakdown")["breakdown"]
    got = dict(compat)  # flags, steps, avg_step, gpu
    got.update({k: v for k, v in analyze(ci, run_id, rank, "ops").items() if k not in ("run", "rank")})
    got.update({k: v for k, v in analyze(ci, run_id, rank, "kernels").items() if k not in ("run", "rank")})
    got["memory_stats"] = analyze(ci, run_id, rank, "memory")["memory_stats"]
    return got, compat, own


def check_double_count(name, compat, own):
    """kprof's own figure against the one derived from the plugin-compatible figure."""
    derived, cut = derive_kprof(compat)
    assert len(own["steps"]) == len(derived), (name, own, derived)
    for s, d in zip(own["steps"], derived):
        parts = sum(s[c] for c in CATS)
        assert abs(parts - s["total_us"]) < 1e-6, (name, "kprof's categories must sum to the step", s)
        for c in CATS:
            assert abs(s[c] - d[c]) < 1e-6, (name, s["index"], c, s[c], d[c])
    if cut is None:
        return "same"
    diff = ["step %d %s: plugin %s, kprof %s" % (s["index"], c, p[c], s[c])
            for s, p in zip(own["steps"], compat["steps"]) for c in CATS if s[c] != p[c]]
    if not diff:
        return "same"
    print("    double count: once %s is counted no step time is left free; the plugin then "
          "takes the next categories unmasked and counts that time again (%s); kprof keeps "
          "them at 0" % (cut, "; ".join(diff)))
    return "differs"


def yes(b):
    return "Yes" if b else "No"


def check_resnet50(ci, grpc, chk):
    """The resnet50 traces: the plugin's step breakdown (per step, unrounded, and the average)
    and its top-20 operator, kernel and kernel-by-op tables (rounded as the UI shows them)."""
    base = os.path.join(SHARED, "peers", "tbplugin", "resnet50")
    for bd_path in sorted(glob.glob(os.path.join(base, "*.step_breakdown.json"))):
        with open(bd_path) as f:
            ref = json.load(f)
        stem = bd_path[:-len(".step_breakdown.json")]
        span = os.path.basename(stem)
        trace = glob.glob(os.path.join(base, "traces", "*", ref["trace_file"]))[0]
        res = json.loads(run([KPROFCTL, "import", "--collector", grpc, "--job", "resnet50",
                              "--json", "--rank", "0", trace], "kprofctl import " + trace))
        got, compat, own = results(ci, res["run_id"], 0)
        print("%s (run %d):" % (span, res["run_id"]))
        n0 = len(chk.ok), len(chk.bad)
        p = "/" + span
        for f, v in ref["flags"].items():
            chk.value(p + "/flags/" + f, v, got["flags"].get(f))
        chk.value(p + "/step_count", ref["step_count"], got["step_count"])
        by_name = {s["name"]: s for s in got["steps"]}
        for s in ref["steps"]:
            g = by_name.get(s["step"])
            if g is None:
                chk.bad.append((p + "/steps/" + s["step"], s, "no such step"))
                continue
            for c in CATS + ["total_us"]:
                chk.value("%s/steps/%s/%s" % (p, s["step"], c), s[c], g[c])
        for c, v in ref["average"].items():  # float means: |a-b| < 5e-8
            chk.approx.append([span, "average", c])
            chk.value("%s/average/%s" % (p, c), v, got["avg_step"][c])
        check_double_count(span, compat, own)
        with open(stem + ".gpu_metrics.json") as f:
            gm = json.load(f)
        chk.value(p + "/gpu_ids", gm["gpu_ids"], got["gpu"]["gpu_ids"])
        chk.approx.append([span, "gpu"])
        for dev, m in gm["per_device"].items():
            q = "%s/gpu/%s/" % (p, dev)
            chk.value(q + "gpu_utilization", m["gpu_utilization"],
                      got["gpu"]["per_device"][dev]["utilization"])
            chk.value(q + "tensor_core_kernel_time_ratio", m["tensor_core_kernel_time_ratio"],
                      got["tensor_cores"]["tc_ratio_per_gpu"][dev])
            dev_got = got["gpu"]["per_device"][dev]
            chk.value(q + "est_sm_efficiency", m["est_sm_efficiency"], dev_got["est_sm_efficiency"])
            chk.value(q + "est_achieved_occupancy_percent", m["est_achieved_occupancy_percent"],
                      dev_got["est_achieved_occupancy"])
        chk.value(p + "/gpu/tc_eligible_ops_kernel_ratio", gm["tc_eligible_ops_kernel_ratio"],
                  got["tensor_cores"]["tc_eligible_ops_kernel_ratio"])
        chk.todo += [p + "/gpu/util_timeline", p + "/gpu/recommendations_html"]

        def rows(csv_name):
            with open(stem + "." + csv_name) as f:
                return list(csv.DictReader(f))

        ops = {r["name"]: r for r in got["operators_by_name"]["rows"]}
        for r in rows("operators_top20.csv"):
            g = ops.get(r["name"])
            q = "%s/operators/%s" % (p, r["name"])
            if g is None:
                chk.bad.append((q, r, "missing"))
                continue
            chk.value(q + "/calls", int(r["calls"]), g["calls"])
            for k in ("device_self", "device_total", "host_self", "host_total"):
                chk.value("%s/%s_us" % (q, k), int(r[k + "_us"]), round(g[k + "_us"]))
            chk.value(q + "/tc_eligible", r["tc_eligible"], yes(g["tc_eligible"]))
            for k in ("self", "total"):
                chk.value("%s/tc_%s_percent" % (q, k), float(r["tc_%s_percent" % k]),
                          round(100 * g["tc_%s_ratio" % k], 2))
        kern = {r["name"]: r for r in got["kernels_by_name"]["rows"]}
        for r in rows("kernels_top20.csv"):
            g = kern.get(r["Name"])
            q = "%s/kernels/%s" % (p, r["Name"][:60])
            if g is None:
                chk.bad.append((q, r, "missing"))
                continue
            chk.value(q + "/tc_used", r["Tensor Cores Used"], yes(g["tc_used"]))
            chk.value(q + "/calls", int(r["Calls"]), g["calls"])
            for k, col in (("total", "Total"), ("mean", "Mean"), ("max", "Max"), ("min", "Min")):
                chk.value("%s/%s_us" % (q, k), int(r[col + " Duration (us)"]), round(g[k + "_us"]))
            chk.value(q + "/mean_blocks_per_sm", float(r["Mean Blocks Per SM"]),
                      round(g["mean_blocks_per_sm"], 2))
            chk.value(q + "/mean_est_achieved_occupancy",
                      float(r["Mean Est. Achieved Occupancy (%)"]),
                      round(g["mean_est_achieved_occupancy"], 2))
        for r in rows("kernels_by_op_top20.csv"):
            key = (r["Name"], r["Operator"], r["Grid"], r["Block"], int(r["Register Per Thread"]),
                   int(r["Shared Memory"]))
            m = [g for g in got["kernels_by_name_op"]["rows"]
                 if (g["name"], g["op_name"], str(g["grid"]), str(g["block"]),
                     g["registers_per_thread"], g["shared_memory"]) == key]
            q = "%s/kernels_by_op/%s/%s/%s" % (p, r["Name"][:40], r["Operator"], r["Grid"])
            if len(m) != 1:
                chk.bad.append((q, key, "%d matching rows" % len(m)))
                continue
            g = m[0]
            chk.value(q + "/tc_used", r["Kernel Uses Tensor Cores"], yes(g["tc_used"]))
            chk.value(q + "/op_tc_eligible", r["Op is Tensor Cores eligible"], yes(g["op_tc_eligible"]))
            chk.value(q + "/calls", int(r["Calls"]), g["calls"])
            for k, col in (("total", "Total"), ("mean", "Mean"), ("max", "Max"), ("min", "Min")):
                chk.value("%s/%s_us" % (q, k), int(r[col + " Duration (us)"]), round(g[k + "_us"]))
            chk.value(q + "/mean_blocks_per_sm", float(r["Mean Blocks Per SM"]),
                      round(g["mean_blocks_per_sm"], 2))
            chk.value(q + "/mean_est_achieved_occupancy",
                      float(r["Mean Est. Achieved Occupancy (%)"]),
                      round(g["mean_est_achieved_occupancy"], 2))
        print("    %d figures match, %d mismatch" % (len(chk.ok) - n0[0], len(chk.bad) - n0[1]))


def check_errors(ci):
    """Unknown runs and ranks, and the row limit: clear messages and exit codes."""
    def fails(args):
        p = subprocess.run([ANALYZE, "--pg", ci] + args + ["breakdown", "--json"],
                           capture_output=True, text=True, timeout=60 * kpfix.SCALE)
        return p.returncode, p.stderr

    rc, err = fails(["--run", "999999"])
    assert rc == 3 and "run 999999 does not exist" in err and "kprofctl runs" in err, (rc, err)
    rc, err = fails(["--run", "1", "--rank", "7"])
    assert rc == 3 and "has no rank 7" in err and "(0)" in err, (rc, err)
    rc, err = fails(["--run", "1", "--max-rows", "3"])
    assert rc == 1 and "more than 3 rows" in err, (rc, err)
    rc, err = fails(["--run", "x"])
    assert rc == 2, (rc, err)
    print("errors: unknown run, unknown rank, row limit and usage say what to do")


def main():
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_analyzer", ci)
    tmp = tempfile.mkdtemp(prefix="kp_analyzer_", dir=kpfix.TEST_DIR)
    totals = {"ok": 0, "bad": 0, "todo": 0}
    failed = []
    try:
        for case in sorted(glob.glob(os.path.join(CASES, "*.json"))):
            with open(case) as f:
                c = json.load(f)
            name = os.path.basename(case)[:-5]
            if c.get("kind") == "range_utils":
                print("%s: range case, checked by tests/unit/test_analyzer_ranges.c" % name)
                continue
            if "trace" in c:
                path = os.path.join(tmp, name + ".json")
                with open(path, "w") as f:
                    json.dump(c["trace"], f)
                paths, extra = [path], ["--rank", "0"]
            else:
                d = os.path.join(tmp, name)
                os.makedirs(d, exist_ok=True)
                for w, t in c["traces"].items():
                    with open(os.path.join(d, w + ".json"), "w") as f:
                        json.dump(t, f)
                paths, extra = [d], []
            res = json.loads(run([KPROFCTL, "import", "--collector", cd.grpc, "--job", "tb-" + name,
                                  "--json"] + extra + paths, "kprofctl import " + name))
            chk = Checker(name, c.get("approx"))
            print("%s (run %d):" % (name, res["run_id"]))
            dc = []
            if "trace" in c:
                got, compat, own = results(ci, res["run_id"], 0)
                check_rank(chk, "", c["expected"], got)
                dc.append(check_double_count(name, compat, own))
            else:
                ranks = {os.path.basename(f["path"])[:-5]: f["rank"] for f in res["files"]}
                by_worker = {}
                for w, rank in sorted(ranks.items()):
                    got, compat, own = results(ci, res["run_id"], rank)
                    by_worker[w] = got
                    dc.append(check_double_count(name + "/" + w, compat, own))
                for key, want in c["expected"].items():
                    if key == "per_worker":
                        for w, wexp in want.items():
                            check_rank(chk, "/per_worker/" + w, wexp, by_worker[w])
                        continue
                    if key != "distributed":
                        chk.todo.append("/" + key)
                        continue
                    for view, v in want.items():
                        if view != "overlap":  # wait, comm_ops: across ranks, not yet
                            chk.todo.append("/distributed/" + view)
                            continue
                        for step, workers in v.items():
                            for w, m in workers.items():
                                g = by_worker[w]["steps"][int(step)]["overlap"]
                                for f, x in m.items():
                                    chk.value("/distributed/overlap/%s/%s/%s" % (step, w, f), x,
                                              g.get(f))
            for p, w, g in chk.bad:
                print("    MISMATCH %s: expected %r, kprof %r" % (p, w, g))
            for p in sorted(set(chk.todo)):
                print("    not implemented yet: %s" % p)
            print("    %d figures match, %d mismatch, %d not implemented yet; kprof's own "
                  "breakdown vs the plugin's: %s" % (len(chk.ok), len(chk.bad), len(set(chk.todo)),
                                                      ", ".join(dc)))
            totals["ok"] += len(chk.ok)
            totals["bad"] += len(chk.bad)
            totals["todo"] += len(set(chk.todo))
            if chk.bad:
                failed.append(name)
        check_errors(ci)
        chk = Checker("resnet50", [])
        check_resnet50(ci, cd.grpc, chk)
        for p, w, g in chk.bad:
            print("    MISMATCH %s: expected %r, kprof %r" % (p, w, g))
        totals["ok"] += len(chk.ok)
        totals["bad"] += len(chk.bad)
        totals["todo"] += len(set(chk.todo))
        if chk.bad:
            failed.append("resnet50")
    finally:
        cd.stop()
    print("total: %d figures match, %d mismatch, %d not implemented yet" %
          (totals["ok"], totals["bad"], totals["todo"]))
    if failed:
        print("cases with mismatches: " + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
