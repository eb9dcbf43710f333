"""The analyzer against the PyTorch Profiler TensorBoard plugin's own test cases
(tests/data/peers/tbplugin/cases, format and comparison rule in its README.md).

Every case with a trace is imported with `kprofctl import` through a real kprof-collectord into
a fresh database, then `kprof-analyze` computes the views kprof has so far (step breakdown,
operator view, kernel view, memory view; for distributed cases the overlap per rank and
`kprof-analyze distributed` across the run's ranks: wait view and communication-ops table)
and each expected figure is compared under the README's rule:
exact, except |a-b| < 5e-8 under an `approx` path; rows matched by their key fields; `count` is
the number of rows; `null` means absent. Keys of views kprof does not compute yet are printed
as "not implemented yet" and neither pass nor fail. Range cases are the C unit test
tests/unit/test_analyzer_ranges.c.

The double-count bug (spec tbplugin-views.md §4): once one category covers every step, the
plugin takes the next category unmasked and counts that time twice. The case's step figures
are checked against `kprof-analyze --plugin-compat`; kprof's own figure is checked against one
derived here from the plugin-compatible one: identical up to the category that used up the
last free step time, 0 after it, so the categories always sum to the step time. Where the two
differ, the test prints both.

The recommendations (spec §11) follow the same pattern: the plugin's HTML texts of resnet50 are
matched byte for byte (its quirks included), and kprof's own plain texts against those derived
from them without the quirks. The rules resnet50 does not fire are checked on small traces
written here, with their exact texts. The utilization timeline spans the trace's
"PyTorch Profiler (0)" event, which import keeps."""
import csv
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import kpfix

kpfix.require_env()

DB = "kp_it_analyzer"
# The repository's test data: the peers' traces and figures (tests/data/peers/README.md).
SHARED = os.path.join(os.environ.get("KPROF_SOURCE_DIR", "."), "tests", "data")
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


NCCL_KERNEL = re.compile(r"^nccl.*Kernel")


def union_len(iv):
    total, end = 0, None
    for a, b in sorted(iv):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def comm_by_name(events):
    """The time kprof's own breakdown moves from Kernel to Communication: kernels named as a
    collective's (nccl*Kernel*) that no nccl:*/gloo:* op of their external id launched (the
    plugin counts them as Kernel), outside every other kernel. Returns (µs, whether the move
    may touch memcpy, memset or another communication interval, which this derivation does
    not model)."""
    ext = lambda e: e.get("args", {}).get("External id", e.get("args", {}).get("external id"))
    comm_ext = {ext(e) for e in events if e.get("name", "").startswith(("nccl:", "gloo:"))}
    kern = [e for e in events if e.get("ph") == "X" and e.get("cat", "").lower() == "kernel"]
    moved = [e for e in kern if NCCL_KERNEL.match(e["name"]) and ext(e) not in comm_ext]
    if not moved:
        return 0, False
    iv = lambda es: [(e["ts"], e["ts"] + e["dur"]) for e in es]
    rest = [e for e in kern if e not in moved]
    alone = union_len(iv(moved) + iv(rest)) - union_len(iv(rest))
    others = [e for e in events if e.get("ph") == "X" and (e.get("cat", "").lower() in
              ("memcpy", "memset", "gpu_memcpy", "gpu_memset") or ext(e) in comm_ext)
              and e not in kern]
    touches = union_len(iv(moved) + iv(others)) < union_len(iv(moved)) + union_len(iv(others))
    return alone, touches


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
                    # The range is the trace's "PyTorch Profiler (0)" span, which import
                    # keeps; these cases have none, so it is min..max of the events.
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


def trace_events(t):
    return t["traceEvents"] if isinstance(t, dict) else t


def check_double_count(name, compat, own, events=()):
    """kprof's own figure against the one derived from the plugin-compatible figure, with
    collective kernels by name moved from Kernel to Communication."""
    moved, touches = comm_by_name(events)
    if moved:
        assert len(compat["steps"]) == 1 and not touches, (name, "not derivable here")
        compat = json.loads(json.dumps(compat))
        compat["steps"][0]["kernel_us"] -= moved
        compat["steps"][0]["communication_us"] += moved
        print("    kprof's own breakdown counts %s us of NCCL kernels without an nccl:* op as "
              "Communication (the plugin: Kernel)" % moved)
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


LINK = re.compile(r'<a href="([^"]*)" target="_blank">([^<]*)</a>')
TUPLE_HREF = "('https://pytorch.org/docs/stable/ddp_comm_hooks.html',)"


def check_util_timeline(chk, p, gm, gpu):
    """The GPU utilization timeline over the trace's "PyTorch Profiler (0)" span (which import
    keeps): each [bucket start µs, busy fraction] point and the final [end, 0], approximately,
    and the bucket size as the plugin names it."""
    for dev, pts in gm["util_timeline"].items():
        q = "%s/gpu/util_timeline/%s" % (p, dev)
        mine = gpu["util_timeline"].get(dev) or []
        chk.value(q + "/count", len(pts), len(mine))
        for i, pt in enumerate(pts):
            chk.value("%s/%d" % (q, i), pt, mine[i] if i < len(mine) else None)
        if len(mine) >= 3:  # two buckets at least: the first one's width is the bucket size
            size, unit = round(mine[1][0] - mine[0][0]), "us"
            for u in ("ms", "s"):
                if size >= 1000:
                    size, unit = size // 1000, u
            chk.value(q + "/unit", gm["util_timeline_unit"], [size, unit])


def derive_own_recs(items, compat_avg, own_avg):
    """kprof's own recommendation texts derived from the plugin's: links as "title (url)" and
    without the plugin's quirks (the Gradient Compression href that is a tuple's repr; "has"
    chosen by the GPU list's string length and its bare "and"; the CPU's memory measured
    against the last GPU, "on GPU-1"), the DataLoader and communication shares from kprof's
    own breakdown figure. Holds while the CPU line is the only memory line the plugin shows."""
    out = []
    for s in items:
        if s.startswith("Device memory usage") and "on GPU-1)" in s:
            continue
        s = LINK.sub(lambda m: "%s (%s)" % (m.group(2), m.group(1)), s.replace(
            TUPLE_HREF, "https://pytorch.org/docs/stable/ddp_comm_hooks.html"))
        m = re.match(r"GPU (.*) (has|have) low utilization", s)
        if m:
            ids = re.split(r", |and ", m.group(1))
            lst = ids[0] if len(ids) == 1 else ", ".join(ids[:-1]) + " and " + ids[-1]
            s = "GPU %s %s%s" % (lst, "has" if len(ids) == 1 else "have", s[m.end(2):])
        for key, cat, limit in (("in DataLoader.", "dataloader_us", 0.05),
                                ("in communication.", "communication_us", 0.1)):
            if key in s and compat_avg[cat] != own_avg[cat]:
                share = own_avg[cat] / own_avg["total_us"]
                s = re.sub(r"[0-9.]+% of the step", "%.1f%% of the step" % (100 * share), s)
                if not share > limit:
                    s = None
        if s is not None:
            out.append(s)
    return out


def check_recommendations(chk, p, want_items, want_overview, top, compat, own):
    """The plugin's recommendation texts (its HTML list items and the overview's <ul>) exactly,
    and kprof's own plain texts against those derived from them."""
    plug = top["plugin_recommendations"]
    chk.value(p + "/gpu/recommendations_html", want_items, plug["items_html"])
    chk.value(p + "/overview/recommendations", want_overview, plug["overview_html"])
    derived = derive_own_recs(want_items, compat["avg_step"], own["avg_step"])
    chk.value(p + "/recommendations(kprof)", derived, top["recommendations"])
    if derived != want_items:
        print("    recommendations: kprof's own texts are plain text (links as \"title (url)\")"
              "%s" % ("" if len(derived) == len(want_items) else
                      " and drop the plugin's quirks (%d of its %d lines differ)"
                      % (len(want_items) - len(derived), len(want_items))))


def synthetic_trace(events, devices):
    return {"schemaVersion": 1, "deviceProperties": devices, "traceEvents": events}


def op(name, ts, dur, ext):
    return {"ph": "X", "cat": "Operator", "name": name, "pid": 100, "tid": "1", "ts": ts,
            "dur": dur, "args": {"Input Dims": [], "External id": ext}}


def launch(ts, corr, ext, kts, device, kernel="volta_sgemm_128x64_nn"):
    """A runtime launch and its kernel (100 µs) on device."""
    return [{"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": "1",
             "ts": ts, "dur": 10, "args": {"correlation": corr, "external id": ext}},
            {"ph": "X", "cat": "Kernel", "name": kernel, "pid": device, "tid": "stream 7",
             "ts": kts, "dur": 100, "args": {"correlation": corr, "external id": ext,
                                             "device": device}}]


def memory(ts, dev_type, dev_id, addr, total):
    return {"ph": "i", "s": "t", "name": "[memory]", "pid": 100, "tid": 1, "ts": ts,
            "args": {"Device Type": dev_type, "Device Id": dev_id, "Addr": addr, "Bytes": total,
                     "Total Allocated": total, "Total Reserved": total}}


def device(i, major, minor, mem):
    return {"id": i, "name": "Synthetic GPU", "totalGlobalMem": mem, "computeMajor": major,
            "computeMinor": minor, "numSms": 80, "maxThreadsPerMultiprocessor": 2048}


def check_recommendation_rules(ci, grpc, tmp):
    """The rules resnet50 does not fire (spec §11), on two small traces written here, with the
    exact texts: the plugin's HTML (peer quirks included) and kprof's plain text. Also the
    utilization timeline over the trace's "PyTorch Profiler (0)" span rather than its events."""
    t = 1000000
    dl = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    # A: DataLoader 20% of the step; DataParallel over GPUs 0 and 1, each busy 10%; aten::mm
    # (Tensor Core eligible) launches FP32 kernels on a 7.0 device; the CPU's allocator peaks at
    # 95% of the *last* GPU's 2 GiB, GPU 0's at 1000 bytes.
    a = ([op("ProfilerStep#1", t, 1000, 1), op(dl, t, 200, 2),
          op("DataParallel.forward", t + 200, 700, 3), op("aten::mm", t + 210, 50, 4),
          op("aten::mm", t + 300, 50, 5)] + launch(t + 220, 11, 4, t + 300, 0) +
         launch(t + 310, 12, 5, t + 400, 1) +
         [memory(t + 215, 0, -1, 4096, 2040109466), memory(t + 225, 1, 0, 8192, 1000),
          {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Traces",
           "tid": "PyTorch Profiler", "ts": t - 100, "dur": 1300, "args": {"Op count": 0}}])
    # B: DDP with Gloo only, on a 3.5 device: communication 30% of the step; the one kernel
    # runs on GPU 12, busy 10%.
    b = ([op("ProfilerStep#1", t, 1000, 1), op("DistributedDataParallel.forward", t, 300, 2),
          op("aten::relu", t + 10, 50, 3), op("gloo:all_reduce", t + 400, 300, 4)] +
         launch(t + 20, 21, 3, t + 100, 12, "void at::native::vectorized_elementwise_kernel"))
    dl_url = "https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading"
    ddp_url = "https://pytorch.org/docs/stable/notes/cuda.html#cuda-nn-ddp-instead"
    amp_url = "https://pytorch.org/docs/stable/amp.html"
    ckp_url = "https://pytorch.org/docs/stable/checkpoint.html"
    hooks_url = "https://pytorch.org/docs/stable/ddp_comm_hooks.html"
    acc_url = "https://towardsdatascience.com/what-is-gradient-accumulation-in-deep-learning-ec034122cfa"
    lamb_url = "https://nvidia.github.io/apex/optimizers.html#apex.optimizers.FusedLAMB"

    def a_(url, title):
        return '<a href="%s" target="_blank">%s</a>' % (url, title)

    low = (" low utilization. You could try to increase batch size to improve. Note: Increasing "
           "batch size may affect the speed and stability of model convergence.")
    dl_txt = ("This run has high time cost on input data loading. 20.0%% of the step time is in "
              "DataLoader. You could try to set num_workers on DataLoader's construction and %s.")
    dp_txt = "It is recommended to %s to do multi-GPU training."
    amp_txt = ("Kernels with 100%% time are launched by Tensor Cores eligible operators. You could "
               "enable %s to speedup by using FP16.")
    nccl_txt = ("Nccl backend is currently the fastest and highly recommended backend when using "
                "DDP for training.")
    comm_txt = ("This run has high time cost on communication. 30.0%% of the step time is in "
                "communication. You could try %s or %s or increase the batch size. Note: Gradient "
                "accumulation will increase global effective batch size, which may hurt model "
                "convergence and accuracy. For such case, you may want to evaluate %s.")
    cases = {
        "rules_dp_memory": (
            synthetic_trace(a, [device(0, 7, 0, 4294967296), device(1, 7, 0, 2147483648)]),
            [dl_txt % a_(dl_url, "enable multi-processes on data loading"),
             dp_txt % a_(ddp_url, "use DistributedDataParallel instead of DataParallel"),
             "GPU 0and 1 have" + low,
             amp_txt % a_(amp_url, "Automatic Mixed Precision"),
             "Device memory usage is at the limit of device memory capacity (95.0%% of 2.0GB on "
             "GPU-1). To get better value of your GPU or to use larger batch size for training, "
             "please refer to %s or %s." % (a_(ckp_url, "Gradient Checkpoint"),
                                            a_(amp_url, "Automatic Mixed Precision"))],
            [dl_txt % ("enable multi-processes on data loading (%s)" % dl_url),
             dp_txt % ("use DistributedDataParallel instead of DataParallel (%s)" % ddp_url),
             "GPU 0 and 1 have" + low,
             amp_txt % ("Automatic Mixed Precision (%s)" % amp_url)]),
        "rules_ddp_gloo": (
            synthetic_trace(b, [device(0, 3, 5, 4294967296)]),
            [nccl_txt,
             comm_txt % (a_(TUPLE_HREF, "Gradient Compression"),
                         a_(acc_url, "Gradient Accumulation"), a_(lamb_url, "LAMB optimizer")),
             "GPU 12 have" + low],
            [nccl_txt,
             comm_txt % ("Gradient Compression (%s)" % hooks_url,
                         "Gradient Accumulation (%s)" % acc_url, "LAMB optimizer (%s)" % lamb_url),
             "GPU 12 has" + low]),
    }
    for name, (trace, want_html, want_text) in sorted(cases.items()):
        path = os.path.join(tmp, name + ".json")
        with open(path, "w") as f:
            json.dump(trace, f)
        res = json.loads(run([KPROFCTL, "import", "--collector", grpc, "--job", "tb-" + name,
                              "--json", "--rank", "0", path], "kprofctl import " + name))
        top = analyze(ci, res["run_id"], 0, "breakdown")
        plug = top["plugin_recommendations"]
        assert plug["items_html"] == want_html, (name, plug["items_html"], want_html)
        assert plug["overview_html"] == "<ul>%s</ul>" % "".join(
            "<li>%s</li>" % s for s in want_html), (name, plug["overview_html"])
        assert top["recommendations"] == want_text, (name, top["recommendations"], want_text)
        other = analyze(ci, res["run_id"], 0, "--plugin-compat", "breakdown")
        for k in ("recommendations", "plugin_recommendations"):  # the same either way
            assert other[k] == top[k], (name, k, other[k], top[k])
        text = run([ANALYZE, "--pg", ci, "--run", str(res["run_id"]), "--rank", "0", "breakdown"],
                   "kprof-analyze breakdown (text)")
        lines = text.splitlines()
        at = lines.index("recommendations:")
        assert lines[at + 1:] == ["  - " + s for s in want_text], (name, lines[at:])
        if name == "rules_dp_memory":  # the timeline spans the Trace event: 13 buckets of 100 µs
            tl = top["breakdown"]["gpu"]["util_timeline"]
            assert tl["0"][0] == [t - 100, 0] and tl["0"][-1] == [t + 1200, 0], tl["0"]
            assert len(tl["0"]) == 14 and tl["0"][4] == [t + 300, 1] and tl["1"][5] == [t + 400, 1], tl
    # none: "N/A" in the plugin's overview, "none" in kprof's text
    path = os.path.join(tmp, "rules_none.json")
    with open(path, "w") as f:
        json.dump(synthetic_trace([op("ProfilerStep#1", t, 100, 1)], []), f)
    res = json.loads(run([KPROFCTL, "import", "--collector", grpc, "--job", "tb-rules-none",
                          "--json", "--rank", "0", path], "kprofctl import rules_none"))
    top = analyze(ci, res["run_id"], 0, "breakdown")
    assert top["recommendations"] == [] and top["plugin_recommendations"] == {
        "items_html": [], "overview_html": "<ul><li>N/A</li></ul>"}, top
    text = run([ANALYZE, "--pg", ci, "--run", str(res["run_id"]), "--rank", "0", "breakdown"],
               "kprof-analyze breakdown (text)")
    assert text.splitlines()[-1] == "recommendations: none", text
    print("recommendations: DataLoader, DataParallel, NCCL backend, communication, low "
          "utilization, AMP and memory rules fire with the plugin's exact texts (its quirks "
          "included) and kprof's own; none gives N/A / none")


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
        check_util_timeline(chk, p, gm, got["gpu"])
        with open(stem + ".ui_payloads.json") as f:
            overview = json.load(f)["overview"]["recommendations"]
        check_recommendations(chk, p, gm["recommendations_html"], overview,
                              analyze(ci, res["run_id"], 0, "breakdown"), compat, own)

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


def analyze_run(ci, run_id, verb):
    """A verb across the run's ranks (no --rank)."""
    return json.loads(run([ANALYZE, "--pg", ci, "--run", str(run_id), verb, "--json"],
                          "kprof-analyze " + verb))


def check_distributed(chk, want, by_worker, ranks, dist):
    """The distributed view: overlap per rank (the breakdown's steps); wait and comm_ops across
    the run's ranks (`kprof-analyze distributed`). Steps are keyed by index, as the plugin keys
    them by name and a run without ProfilerStep has the one step "0"."""
    if not dist["enabled"]:
        print("    no distributed view: %s" % dist["reason"])
    by_rank = {r["rank"]: r for r in dist["ranks"]}
    for view, v in want.items():
        if view == "overlap":
            for step, workers in v.items():
                for w, m in workers.items():
                    g = by_worker[w]["steps"][int(step)]["overlap"]
                    for f, x in m.items():
                        chk.value("/distributed/overlap/%s/%s/%s" % (step, w, f), x, g.get(f))
        elif view == "wait":
            for step, workers in v.items():
                for w, m in workers.items():
                    rows = [x for x in by_rank.get(ranks[w], {}).get("wait", [])
                            if x["index"] == int(step)]
                    g = rows[0] if len(rows) == 1 else {}
                    for f, x in m.items():
                        chk.value("/distributed/wait/%s/%s/%s" % (step, w, f), x, g.get(f))
        elif view == "comm_ops":  # whole lists, in order
            for w, rows in v.items():
                got = by_rank.get(ranks[w], {}).get("comm_ops", [])
                q = "/distributed/comm_ops/" + w
                chk.value(q + "/count", len(rows), len(got))
                for i, row in enumerate(rows):
                    for f, x in row.items():
                        chk.value("%s/%d/%s" % (q, i, f), x, got[i].get(f) if i < len(got) else None)
        else:
            chk.todo.append("/distributed/" + view)


def check_distributed_disabled(ci, grpc, tmp):
    """Runs whose ranks fail the distributed view's enable condition (spec §9) get no view and
    say why, instead of figures from mismatched nodes."""
    with open(os.path.join(CASES, "test_distributed_nccl.json")) as f:
        base = json.load(f)["traces"]

    def events(t, keep=lambda e: True):
        return {"schemaVersion": 1, "traceEvents": [dict(e) for e in t["traceEvents"] if keep(e)]}

    def variant(name, w0, w1):
        d = os.path.join(tmp, "dist_" + name)
        os.makedirs(d, exist_ok=True)
        for w, t in (("worker0", w0), ("worker1", w1)):
            with open(os.path.join(d, w + ".json"), "w") as f:
                json.dump(t, f)
        res = json.loads(run([KPROFCTL, "import", "--collector", grpc, "--job", "tb-dist-" + name,
                              "--json", d], "kprofctl import " + name))
        rk = {os.path.basename(f["path"])[:-5]: f["rank"] for f in res["files"]}
        p = subprocess.run([ANALYZE, "--pg", ci, "--run", str(res["run_id"]), "distributed",
                            "--json"], capture_output=True, text=True, timeout=60 * kpfix.SCALE)
        assert p.returncode == 0, (name, p.returncode, p.stderr)
        out = json.loads(p.stdout)
        assert out["enabled"] is False and out["ranks"] == [], (name, out)
        assert "no distributed view: " + out["reason"] in p.stderr, (name, p.stderr)
        return out["reason"], rk

    w0, w1 = base["worker0"], base["worker1"]
    no_ar = lambda e: e.get("args", {}).get("External id", e.get("args", {}).get("external id")) != 2513
    why, rk = variant("count", events(w0), events(w1, no_ar))
    w1_has_1 = ("rank %d has 1 communication ops" % rk["worker1"], "and rank %d has 1" % rk["worker1"])
    assert any(x in why for x in w1_has_1) and "match one to one" in why, why
    extra = events(w1)
    extra["traceEvents"].append({"ph": "X", "cat": "Kernel", "name": "ncclKernel_Broadcast_extra",
                                 "pid": 0, "tid": "stream 16", "ts": 40, "dur": 5,
                                 "args": {"device": 0, "correlation": 28507, "external id": 146}})
    why, rk = variant("intervals", events(w0), extra)
    assert "#0 (nccl:broadcast) has" in why and "intervals" in why and "must match" in why, why
    mixed = events(w0)
    mixed["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "gloo:broadcast",
                                 "pid": 23803, "tid": "23803", "ts": 125, "dur": 3,
                                 "args": {"External id": 999, "Input Dims": [[4]],
                                          "Input type": ["float"]}})
    why, rk = variant("mixed", mixed, events(w1))
    assert why.startswith("rank %d has both NCCL and Gloo" % rk["worker0"]), why
    renamed = events(w1)
    for e in renamed["traceEvents"]:
        if e["name"].startswith("nccl:"):
            e["name"] = "aten::copy_"
    why, rk = variant("none", events(w0), renamed)
    assert why.startswith("rank %d has no communication ops" % rk["worker1"]), why
    p = subprocess.run([ANALYZE, "--pg", ci, "--run", "999999", "distributed", "--json"],
                       capture_output=True, text=True, timeout=60 * kpfix.SCALE)
    assert p.returncode == 3 and "run 999999 does not exist" in p.stderr, (p.returncode, p.stderr)
    print("distributed: op count, interval count, NCCL+Gloo, no comm ops and an unknown run "
          "give no view and say why")


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
                dc.append(check_double_count(name, compat, own, trace_events(c["trace"])))
            else:
                ranks = {os.path.basename(f["path"])[:-5]: f["rank"] for f in res["files"]}
                by_worker = {}
                for w, rank in sorted(ranks.items()):
                    got, compat, own = results(ci, res["run_id"], rank)
                    by_worker[w] = got
                    dc.append(check_double_count(name + "/" + w, compat, own,
                                                 trace_events(c["traces"][w])))
                for key, want in c["expected"].items():
                    if key == "per_worker":
                        for w, wexp in want.items():
                            check_rank(chk, "/per_worker/" + w, wexp, by_worker[w])
                        continue
                    if key != "distributed":
                        chk.todo.append("/" + key)
                        continue
                    check_distributed(chk, want, by_worker, ranks,
                                      analyze_run(ci, res["run_id"], "distributed"))
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
        check_distributed_disabled(ci, cd.grpc, tmp)
        chk = Checker("resnet50", [])
        check_resnet50(ci, cd.grpc, chk)
        check_recommendation_rules(ci, cd.grpc, tmp)
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
