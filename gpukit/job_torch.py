#!/usr/bin/env python3
"""gpukit/job_torch.py: the GPU validation kit's PyTorch job: 2 ranks, a few linear layers, an
all-reduce, a plain SGD step; deterministic (fixed seeds, fixed shapes, no data loading).

    python3 gpukit/job_torch.py --out DIR [--steps 30] [--world 2] [--hold-file F]
                                [--profile-steps S:E]

The parent process starts one child per rank (this script with --rank R; no torchrun, so the
same command runs under kprof-run, whose environment the children inherit) and waits for them.
It never imports torch itself. The ranks share one GPU through gloo when there are fewer GPUs
than ranks, else each takes its own with NCCL.

Each iteration i (counted from 0) is the step kprof's hook numbers i and torch.profiler names
ProfilerStep#i: H2D copy of a pinned vector, L x (linear, gelu) forward, a loss, backward, an
all-reduce of the last layer's bias gradient, (i % 3) + 1 small in-place adds (so the kernel
count differs from one step to the next and a step numbered off by one shows), SGD (foreach)
step, zero_grad, then torch.cuda.synchronize() so the step's wall time includes its GPU work.

--hold-file F: after --steps, keep stepping while F exists (at most 400 steps): the kit's
capture phase holds the job until kprof's window is over. --profile-steps S:E: record steps S..E
with torch.profiler (CPU and CUDA activities; no kprof in that run) and write its trace.

The job contract gpukit/job_fake.py keeps too; per rank R, in DIR:
  steps.rank-R.json  {"rank", "world", "backend", "device", "steps": [{"step", "ms"}],
                      "kprof_stats": the injection library's counters (kprof_get_stats) or
                      null, "cupti_loaded": the libcupti files mapped in the process, ...}
  torch-trace.rank-R.json  torch.profiler's Chrome trace (--profile-steps only)
Exit status: 0 every rank finished; 1 a rank failed (its stderr says why); 2 usage.

Sizes: GPUKIT_HIDDEN (2048), GPUKIT_LAYERS (6), GPUKIT_BATCH (16384), float32: about 2.5 TFLOP
per rank and step, some 100 ms a step for two ranks sharing an H100.
"""

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time

MAX_STEPS = 400


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--hold-file")
    ap.add_argument("--profile-steps")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.steps < 1 or a.steps > MAX_STEPS or a.world < 1:
        ap.error("--steps must be 1..%d and --world at least 1" % MAX_STEPS)
    a.prof = None
    if a.profile_steps:
        try:
            s, e = (int(x) for x in a.profile_steps.split(":"))
        except ValueError:
            ap.error("--profile-steps wants S:E, e.g. 20:24")
        if s < 1 or e < s:
            ap.error("--profile-steps S:E needs 1 <= S <= E")
        a.prof = (s, e)
        a.steps = max(a.steps, e + 2)
    return a


# ---- kprof's counters, read through the library the driver loaded ------------------------------
class KprofStats(ctypes.Structure):  # agent/inject/kprof.h, struct kprof_stats
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("state", ctypes.c_uint32),
        ("current_step", ctypes.c_int64),
        ("buffers_requested", ctypes.c_uint64),
        ("buffers_declined", ctypes.c_uint64),
        ("buffers_completed", ctypes.c_uint64),
        ("records_decoded", ctypes.c_uint64),
        ("records_sent", ctypes.c_uint64),
        ("records_dropped", ctypes.c_uint64),
        ("cupti_dropped", ctypes.c_uint64),
        ("ranges", ctypes.c_uint64),
        ("ranges_dropped", ctypes.c_uint64),
        ("names", ctypes.c_uint64),
        ("names_overflow", ctypes.c_uint64),
        ("agent_connects", ctypes.c_uint64),
        ("captures", ctypes.c_uint64),
        ("connected", ctypes.c_uint32),
        ("enabled_kinds", ctypes.c_uint32),
    ]


def kprof_stats():
    path = os.environ.get("CUDA_INJECTION64_PATH")
    if not path:
        return None
    try:
        lib = ctypes.CDLL(path)
        st = KprofStats()
        st.size = ctypes.sizeof(KprofStats)
        if lib.kprof_get_stats(ctypes.byref(st)) != 0:
            return {"error": "kprof_get_stats refused the struct size"}
        return {name: getattr(st, name) for name, _ in KprofStats._fields_ if name != "size"}
    except Exception as e:  # the report says so; the job's figures are still worth having
        return {"error": "%s: %s" % (type(e).__name__, e)}


def cupti_loaded():
    try:
        with open("/proc/self/maps") as f:
            return sorted({ln.split()[-1] for ln in f if "libcupti" in ln})
    except OSError:
        return []


# ---- one rank --------------------------------------------------------------------------------
def rank_main(a):
    import torch
    import torch.distributed as dist

    rank, world = a.rank, a.world
    ngpu = torch.cuda.device_count()
    if ngpu == 0:
        print("job_torch: rank %d: no CUDA device" % rank, file=sys.stderr)
        return 1
    dev = torch.device("cuda", rank % ngpu)
    torch.cuda.set_device(dev)
    backend = "nccl" if ngpu >= world else "gloo"
    dist.init_process_group(
        backend,
        init_method="tcp://127.0.0.1:%d" % a.port,
        rank=rank,
        world_size=world,
        timeout=__import__("datetime").timedelta(seconds=120),
    )
    hidden = int(os.environ.get("GPUKIT_HIDDEN", "2048"))
    layers = int(os.environ.get("GPUKIT_LAYERS", "6"))
    batch = int(os.environ.get("GPUKIT_BATCH", "16384"))
    torch.manual_seed(1234)  # the same weights on every rank
    torch.backends.cuda.matmul.allow_tf32 = False
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*mods).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, foreach=True)
    gen = torch.Generator(device=dev)
    gen.manual_seed(99 + rank)
    x = torch.randn(batch, hidden, device=dev, generator=gen)
    host_vec = torch.randn(hidden).pin_memory()
    tag = torch.zeros(1024, device=dev)
    last_bias = model[2 * (layers - 1)].bias

    prof = None
    if a.prof:
        s, e = a.prof
        trace = os.path.join(a.out, "torch-trace.rank-%d.json" % rank)

        def ready(p):
            p.export_chrome_trace(trace)

        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
            schedule=torch.profiler.schedule(wait=s - 1, warmup=1, active=e - s + 1, repeat=1),
            on_trace_ready=ready,
        )
        prof.__enter__()

    times = []
    i = 0
    while True:
        if i >= a.steps and not (a.hold_file and os.path.exists(a.hold_file) and i < MAX_STEPS):
            break
        t0 = time.perf_counter()
        v = host_vec.to(dev, non_blocking=True)
        out = model(x + v)
        loss = out.pow(2).mean()
        loss.backward()
        dist.all_reduce(last_bias.grad)
        for _ in range(i % 3 + 1):
            tag.add_(1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(dev)
        times.append({"step": i, "ms": (time.perf_counter() - t0) * 1e3})
        if prof is not None:
            prof.step()
        i += 1
    if prof is not None:
        prof.__exit__(None, None, None)
    dist.barrier()
    rec = {
        "rank": rank,
        "world": world,
        "backend": backend,
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sizes": {"hidden": hidden, "layers": layers, "batch": batch},
        "tag_sum": float(tag.sum().item()),
        "steps": times,
        "kprof_stats": kprof_stats(),
        "cupti_loaded": cupti_loaded(),
    }
    write_json(os.path.join(a.out, "steps.rank-%d.json" % rank), rec)
    ms = sorted(t["ms"] for t in times)
    print("job_torch: rank %d on %s (%s): %d steps, median %.2f ms" % (
        rank, rec["device"], backend, len(times), ms[len(ms) // 2]), flush=True)
    dist.destroy_process_group()
    return 0


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parent_main(a, argv):
    os.makedirs(a.out, exist_ok=True)
    port = free_port()
    kids = []
    for r in range(a.world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.world))
        kids.append(
            subprocess.Popen(
                [sys.executable, os.path.abspath(__file__)] + argv + ["--rank", str(r), "--port", str(port)],
                env=env,
            )
        )

    def stop(signum, frame):  # the driver's time limit: take the ranks down too
        for k in kids:
            if k.poll() is None:
                k.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # One rank failing leaves the other blocked in a collective: take it down at once.
    rc = 0
    left = set(range(len(kids)))
    while left:
        for r in sorted(left):
            if kids[r].poll() is None:
                continue
            left.discard(r)
            if kids[r].returncode != 0:
                print("job_torch: rank %d exited with status %d" % (r, kids[r].returncode), file=sys.stderr)
                rc = 1
                for k in kids:
                    if k.poll() is None:
                        k.kill()
        time.sleep(0.05)
    return rc


def main(argv):
    a = parse_args(argv)
    if a.rank is None:
        return parent_main(a, argv)
    try:
        return rank_main(a)
    except Exception:  # the log says where; the kit's summary says the phase failed
        import traceback

        traceback.print_exc()
        print("job_torch: rank %d failed" % a.rank, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
