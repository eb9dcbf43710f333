#!/usr/bin/env python3
"""gpukit/job_fake.py: the dry run's stand-in for gpukit/job_torch.py, without GPU or PyTorch.

    python3 gpukit/job_fake.py --worker PATH [--step-ms 20] --out DIR [--steps 30] [--world 2]
                               [--hold-file F] [--profile-steps S:E]

Same command line and same output files as job_torch.py (its docstring has the contract), but
each rank is tests/fakecupti's kprof-test-worker: it loads libkprof_inject.so as the CUDA
driver would when CUDA_INJECTION64_PATH is set (under kprof-run), emits NVTX op ranges and
plays the GPU with the fake libcupti. Its --expect file (every op range and every GPU record it
issued, with the duration the fake gave it) becomes:
  * steps.rank-R.json: the step times (from the first op of one step to the first of the
    next) and the library's counters (the worker's --stats);
  * with --profile-steps S:E, torch-trace.rank-R.json: what torch.profiler would have written
    for steps S..E in Kineto's dialect (ProfilerStep#N annotations, cpu_op events, launch calls
    and kernels, memcpys and memsets linked by "External id" and "correlation"), so the verdict
    reads the same format from the dry run as from the GPU.
--hold-file F: the worker runs until the library completed one capture (--until-captures 1)
instead of watching F, when the library is injected.
The worker's seed is fixed, so the fake's kernel durations are the same in every run.
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import job_torch  # noqa: E402  (argument parsing and the output format; it imports no torch)

SEED = 7


def parse(argv):
    worker, step_ms, rest = None, 20, []
    i = 0
    while i < len(argv):
        if argv[i] == "--worker" and i + 1 < len(argv):
            worker = argv[i + 1]
            i += 2
        elif argv[i] == "--step-ms" and i + 1 < len(argv):
            step_ms = int(argv[i + 1])
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    if not worker:
        print("job_fake: --worker PATH (kprof-test-worker) is required", file=sys.stderr)
        sys.exit(2)
    return worker, step_ms, job_torch.parse_args(rest)


def read_expect(path):
    with open(path) as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def step_times(lines):
    start, end = {}, {}
    for e in lines:
        if e["type"] != "range":
            continue
        s = e["step"]
        start[s] = min(start.get(s, e["start_ns"]), e["start_ns"])
        end[s] = max(end.get(s, e["end_ns"]), e["end_ns"])
    steps = sorted(start)
    out = []
    for i, s in enumerate(steps):
        stop = start[steps[i + 1]] if i + 1 < len(steps) else end[s]
        out.append({"step": s, "ms": (stop - start[s]) / 1e6})
    return out


def kineto_trace(lines, rank, world, first, last):
    """Kineto-dialect trace of steps first..last from the worker's --expect lines."""
    ev = []
    pending = {}  # tid -> GPU records waiting for their innermost range to close
    ext = [0]
    step_span = {}

    def us(ns):
        return ns / 1000.0

    for e in lines:
        if e["type"] == "gpu":
            pending.setdefault(e["tid"], []).append(e)
            continue
        s = e["step"]
        lo, hi = step_span.get(s, (e["start_ns"], e["end_ns"]))
        step_span[s] = (min(lo, e["start_ns"]), max(hi, e["end_ns"]))
        ext[0] += 1
        eid = ext[0]
        mine = [g for g in pending.get(e["tid"], []) if len(g["stack"]) == e["depth"] + 1]
        pending[e["tid"]] = [g for g in pending.get(e["tid"], []) if len(g["stack"]) != e["depth"] + 1]
        if first <= s <= last:
            ev.append(
                {"ph": "X", "cat": "cpu_op", "name": e["name"], "pid": 1, "tid": e["tid"],
                 "ts": us(e["start_ns"]), "dur": us(e["end_ns"] - e["start_ns"]),
                 "args": {"External id": eid}}
            )
        for g in mine:
            if first <= g["step"] <= last:
                ev.extend(gpu_events(g, eid, us))
    for g in (g for lst in pending.values() for g in lst):  # launched outside any op
        if first <= g["step"] <= last:
            ev.extend(gpu_events(g, 0, us))
    for s in range(first, last + 1):
        if s in step_span:
            lo, hi = step_span[s]
            ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d" % s, "pid": 1,
                       "tid": 0, "ts": us(lo), "dur": us(hi - lo), "args": {"External id": 0}})
    ev.sort(key=lambda x: x["ts"])
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world},
            "deviceProperties": [], "traceEvents": ev,
            "gpukit_note": "written by gpukit/job_fake.py from kprof-test-worker --expect"}


def gpu_events(g, eid, us):
    kinds = {
        "kernel": ("kernel", None, "cudaLaunchKernel"),
        "memcpy": ("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", "cudaMemcpyAsync"),
        "memset": ("gpu_memset", "Memset (Device)", "cudaMemsetAsync"),
    }
    if g["kind"] not in kinds:
        return []  # syncs: not compared
    cat, name, api = kinds[g["kind"]]
    args = {"External id": eid, "correlation": g["correlation"]}
    return [
        {"ph": "X", "cat": "cuda_runtime", "name": api, "pid": 1, "tid": g["tid"],
         "ts": us(g["launch_ns"]), "dur": 1.0, "args": dict(args)},
        {"ph": "X", "cat": cat, "name": name or g["name"], "pid": g["device"], "tid": g["stream"],
         "ts": us(g["launch_ns"]) + 2.0, "dur": us(g["dur_ns"]),
         "args": dict(args, device=g["device"], stream=g["stream"])},
    ]


def main(argv):
    worker, step_ms, a = parse(argv)
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ)
    # The worker finds its fake libcupti next to it (the bundle keeps it in lib/).
    libdir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(worker))))), "lib")
    if os.path.isdir(libdir):
        env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    injected = bool(env.get("CUDA_INJECTION64_PATH"))
    kids = []
    for r in range(a.world):
        cmd = [worker, "--step-ms", str(step_ms), "--expect", os.path.join(a.out, "expect.rank-%d.jsonl" % r),
               "--stats", "--seed", str(SEED), "--timeout-s", "150"]
        if a.hold_file and injected:
            cmd += ["--until-captures", "1", "--max-steps", str(job_torch.MAX_STEPS)]
        else:
            cmd += ["--steps", str(a.steps)]
        kids.append(subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK="0", WORLD_SIZE=str(a.world)),
                                     stdout=subprocess.PIPE, text=True))
    rc = 0
    for r, k in enumerate(kids):
        out, _ = k.communicate()
        if k.returncode != 0:
            print("job_fake: rank %d (kprof-test-worker) exited with status %d" % (r, k.returncode), file=sys.stderr)
            rc = 1
            continue
        stats = json.loads(out.strip().splitlines()[-1])
        lines = read_expect(os.path.join(a.out, "expect.rank-%d.jsonl" % r))
        kstats = None
        if stats.get("library"):
            kstats = {n: stats.get(n) for n, _ in job_torch.KprofStats._fields_ if n != "size"}
        job_torch.write_json(os.path.join(a.out, "steps.rank-%d.json" % r), {
            "rank": r, "world": a.world, "backend": "fake", "device": "kprof-test-worker (fake libcupti)",
            "steps": step_times(lines), "kprof_stats": kstats, "cupti_loaded": [],
        })
        if a.prof:
            job_torch.write_json(os.path.join(a.out, "torch-trace.rank-%d.json" % r),
                                 kineto_trace(lines, r, a.world, a.prof[0], a.prof[1]))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
