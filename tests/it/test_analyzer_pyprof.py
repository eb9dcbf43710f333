"""PyProf's per-kernel table (`kprof-analyze prof`, analyzer/pyprof.h) end to end.

1. A small Kineto trace built here (aten::addmm, aten::conv2d over cudnn_convolution with two
   kernels, aten::scaled_dot_product_attention over its flash op, aten::layer_norm, aten::gelu,
   AddmmBackward0 and GeluBackward0 sharing their forward ops' seq on the autograd thread, a
   layer: annotation, a python_function frame and a kernel without any op) is imported with
   `kprofctl import` through a real kprof-collectord; every column of every row of
   `prof --json` is compared with values computed here from the spec's formulas
   (docs/specs/flops-bytes.md), not read from kprof. --csv and the columnated output are
   checked for shape, and a bad column name for its exit code.
2. A real trace (the TensorBoard plugin's resnet50, with shapes and dtypes) is imported and the
   table checked for invariants: one row per kernel, sil sums to the kernels' total, every
   conv/GEMM op invocation with known shapes gets FLOPs > 0, bprop rows have a seq, no crash.
3. HTA's ns_resolution trace (no shapes recorded) for the same structure: one row per kernel,
   sil sums up, bprop rows with a seq, FLOPs unknown rather than invented.
"""
import csv
import glob
import io
import json
import os
import subprocess
import sys
import tempfile

import kpfix

kpfix.require_env()

DB = "kp_it_pyprof"
# The repository's test data: the peers' traces and figures (tests/data/peers/README.md).
SHARED = os.path.join(os.environ.get("KPROF_SOURCE_DIR", "."), "tests", "data")
RESNET = os.path.join(SHARED, "peers", "tbplugin", "resnet50", "traces", "resnet50_num_workers_0")
HTA = os.path.join(SHARED, "peers", "hta", "ns_resolution_rank0")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
ANALYZE = os.path.join(kpfix.BIN, "analyzer", "kprof-analyze")
ALL = ("idx,seq,altseq,tid,layer,trace,dir,sub,mod,op,kernel,params,sil,tc,device,stream,grid,"
       "block,flops,bytes")
ALL_JSON = ALL.replace("sil,", "sil_ns,")  # JSON keeps exact ns


def run(args, what, rc=0):
    p = subprocess.run(args, capture_output=True, text=True, timeout=300 * kpfix.SCALE)
    if p.returncode != rc:
        raise AssertionError("%s exited %d (want %d):\n%s" % (what, p.returncode, rc, p.stderr))
    for bad in ("Sanitizer", "runtime error:"):
        assert bad not in p.stderr, p.stderr
    return p.stdout


def prof(ci, run_id, *extra, rc=0):
    return run([ANALYZE, "--pg", ci, "--run", str(run_id), "--rank", "0", "prof"] + list(extra),
               "kprof-analyze prof", rc)


# ---- the synthetic trace --------------------------------------------------------------

PID, FWD, BWD = 100, 100, 200


def X(cat, name, tid, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def op(name, tid, ts, dur, ext, dims=None, types=None, seq=None, fwd=None):
    a = {"External id": ext}
    if dims is not None:
        a["Input Dims"] = dims
        a["Input type"] = types
    if seq is not None:
        a["Sequence number"] = seq
        a["Fwd thread id"] = fwd if fwd is not None else 0
    return X("cpu_op", name, tid, ts, dur, **a)


KERNELS = []  # (corr, ext, launching tid, name, ts, dur, grid, block)


def launch(events, ext, tid, ts, name, kts, kdur, grid=(4, 2, 1), block=(128, 1, 1)):
    corr = 1000 + len(KERNELS)
    events.append(X("cuda_runtime", "cudaLaunchKernel", tid, ts, 1, **{"correlation": corr,
                                                                       "External id": ext}))
    KERNELS.append((corr, ext, tid, name, kts, kdur, list(grid), list(block)))


def trace():
    f32, bf = "float", "c10::BFloat16"
    ev = [
        X("python_function", "model.py(12): forward", FWD, 1, 150,
          **{"Python id": 1, "Python parent id": 0}),
        X("user_annotation", "layer:block1", FWD, 5, 50, **{"External id": 5}),
        op("aten::addmm", FWD, 10, 10, 10, [[128], [32, 64], [64, 128], [], []],
           [f32, f32, f32, "Scalar", "Scalar"], seq=1),
        op("aten::conv2d", FWD, 30, 20, 20, [[8, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []],
           [f32, f32, f32, "ScalarList", "ScalarList", "ScalarList", "Int"], seq=2),
        op("aten::convolution", FWD, 31, 18, 21, [[8, 3, 32, 32], [16, 3, 3, 3], [16]],
           [f32, f32, f32]),
        op("aten::cudnn_convolution", FWD, 32, 16, 22, [[8, 3, 32, 32], [16, 3, 3, 3]], [f32, f32]),
        op("aten::scaled_dot_product_attention", FWD, 60, 20, 30,
           [[2, 4, 128, 64]] * 3 + [[], [], []], [bf] * 3 + ["", "Double", "Bool"], seq=3),
        op("aten::_scaled_dot_product_flash_attention", FWD, 61, 18, 31, [[2, 4, 128, 64]] * 3,
           [bf] * 3),
        op("aten::layer_norm", FWD, 90, 10, 40, [[4, 10], [], [10], [10], [], []],
           [f32, "ScalarList", f32, f32, "Double", "Bool"], seq=4),
        op("aten::native_layer_norm", FWD, 91, 8, 41, [[4, 10], [], [10], [10], []],
           [f32, "ScalarList", f32, f32, "Double"]),
        op("aten::gelu", FWD, 110, 5, 50, [[4, 10], []], [f32, ""], seq=5),
        # backward, on the autograd thread
        op("autograd::engine::evaluate_function: AddmmBackward0", BWD, 200, 30, 60),
        op("AddmmBackward0", BWD, 201, 28, 61, [[32, 128]], [f32], seq=1, fwd=FWD),
        op("aten::mm", BWD, 202, 5, 62, [[32, 128], [128, 64]], [f32, f32]),
        op("aten::mm", BWD, 210, 5, 63, [[64, 32], [32, 128]], [f32, f32]),
        op("aten::sum", BWD, 220, 5, 64, [[32, 128], [], []], [f32, "ScalarList", "Bool"]),
        op("autograd::engine::evaluate_function: GeluBackward0", BWD, 240, 12, 70),
        op("GeluBackward0", BWD, 241, 10, 71, [[4, 10]], [f32], seq=5, fwd=FWD),
        op("aten::gelu_backward", BWD, 242, 8, 72, [[4, 10], [4, 10], []], [f32, f32, ""]),
    ]
    launch(ev, 10, FWD, 12, "ampere_sgemm_128x64_tn", 300, 5)
    launch(ev, 22, FWD, 33, "cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)",
           305, 1)
    launch(ev, 22, FWD, 35, "void cudnn::cnn::implicit_convolve_sgemm<float, 1024, 6, 7, 3, "
           "3, 5, 1, false, false, true>(int, int, int, float const*, int, float*)", 310, 7)
    launch(ev, 22, FWD, 40, "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x64x16", 320, 6)
    launch(ev, 31, FWD, 65, "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, "
           "128, 64, 4, false, false, cutlass::bfloat16_t> >(Flash_fwd_params)", 330, 9)
    launch(ev, 41, FWD, 93, "void at::native::(anonymous namespace)::vectorized_layer_norm_"
           "kernel<float, float>(int, float, float const*, float const*, float const*, float*, "
           "float*, float*)", 340, 2)
    launch(ev, 50, FWD, 112, "void at::native::vectorized_elementwise_kernel<4, at::native::"
           "GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}>(int, "
           "at::native::GeluCUDAKernelImpl)", 350, 3)
    launch(ev, 62, BWD, 203, "ampere_sgemm_64x64_nn", 400, 4)
    launch(ev, 63, BWD, 211, "ampere_sgemm_32x32_sliced1x4_nt", 410, 4)
    launch(ev, 64, BWD, 221, "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<"
           "float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>"
           "::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >"
           "(at::native::ReduceOp<float>)", 420, 2)
    launch(ev, 72, BWD, 243, "void at::native::vectorized_elementwise_kernel<4, at::native::"
           "GeluBackwardCUDAKernelImpl>(int)", 430, 2)
    # a kernel no op launched (no runtime call, no External id)
    KERNELS.append((1000 + len(KERNELS), None, None, "void my_kernel<int>(int*)", 440, 1, [1, 1, 1], [32, 1, 1]))
    for corr, ext, _tid, name, ts, dur, grid, block in KERNELS:
        a = {"correlation": corr, "device": 0, "stream": 7, "context": 1, "grid": grid,
             "block": block, "registers per thread": 32, "shared memory": 0}
        if ext is not None:
            a["External id"] = ext
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts,
                   "dur": dur, "args": a})
    return {"schemaVersion": 1, "traceEvents": ev,
            "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-40GB",
                                  "computeMajor": 8, "computeMinor": 0}]}


# ---- expected values, from the spec ---------------------------------------------------

def short_kernel(name):
    """flops-bytes.md §4: before '<', drop void/at::/cuda::/native::/(anonymous namespace)::,
    before '(', spaces to '_'."""
    s = name.split("<", 1)[0]
    for strip in ("void ", "at::", "cuda::", "native::", "(anonymous namespace)::"):
        s = s.replace(strip, "")
    return s.split("(", 1)[0].replace(" ", "_")


def gemm(m, n, k, s, bias, bwd):
    """§3.1: 2mnk; bytes S(mk + kn + mn); backward dgrad, wgrad, bias grad (mn, 2mnS)."""
    f, b = 2 * m * n * k, s * (m * k + k * n + m * n)
    if not bwd:
        return [(f, b)]
    return [(f, b), (f, b)] + ([(m * n, 2 * m * n * s)] if bias else [])


def conv2d(N, C, H, W, K, R, S_, g, s):
    """§3.2 with stride 1, padding 0, dilation 1 (Kineto records no IntList values)."""
    P, Q = H - R + 1, W - S_ + 1
    return [(2 * N * K * P * Q * (C // g) * R * S_,
             s * (N * C * H * W + K * (C // g) * R * S_ + N * K * P * Q))], "%dx%d" % (P, Q)


def sdpa(b, h, sq, sk, d, dv, s):
    """§8 flop_counter: 2bhSqSkD + 2bhSqSkDv; bytes S(q + k + v + out)."""
    return [(2 * b * h * sq * sk * d + 2 * b * h * sq * sk * dv,
             s * (b * h * sq * d + 2 * b * h * sk * d + b * h * sq * dv))]


def expected_rows():
    f32 = 4
    # the forward ops (op, mod, seq, parts fwd, parts bwd, params, tc kind)
    conv_parts, conv_out = conv2d(8, 3, 32, 32, 16, 3, 3, 1, f32)
    ln_e = 40
    ops = {
        10: ("addmm", "torch", 1, gemm(32, 128, 64, f32, True, False),
             gemm(32, 128, 64, f32, True, True), "M=32,N=128,K=64,type=fp32", "gemm"),
        22: ("conv2d", "torch.nn.functional", 2, conv_parts, None,
             "N=8,C=3,K=16,in=32x32,out=%s,kernel=3x3,g=1,type=fp32" % conv_out, "conv"),
        31: ("scaled_dot_product_attention", "torch.nn.functional", 3, sdpa(2, 4, 128, 128, 64, 64, 2),
             None, "B=2,H=4,Sq=128,Sk=128,D=64,Dv=64,type=bf16", "gemm"),
        # layer_norm (kprof's estimate): 8E; bytes 2B(x) + weight + bias
        41: ("layer_norm", "torch.nn.functional", 4, [(8 * ln_e, 2 * ln_e * f32 + 2 * 10 * f32)],
             None, "[4,10]fp32;[10]fp32;[10]fp32", None),
        # gelu: 24 FLOPs per element; bytes 2B fwd, 3B bwd
        50: ("gelu", "torch.nn.functional", 5, [(24 * ln_e, 2 * ln_e * f32)],
             [(24 * ln_e, 3 * ln_e * f32)], "[4,10]fp32", None),
    }
    bwd_of = {62: 10, 63: 10, 64: 10, 72: 50}  # backward kernel's op -> forward op (by seq)
    tids = {10: FWD, 22: FWD, 31: FWD, 41: FWD, 50: FWD, 62: BWD, 63: BWD, 64: BWD, 72: BWD}
    rows, sub_of, share = [], {}, {}
    for i, (corr, ext, _tid, name, _ts, dur, grid, block) in enumerate(sorted(KERNELS)):
        r = {"idx": i + 1, "kernel": short_kernel(name), "sil_ns": dur * 1000, "device": 0,
             "stream": 7, "grid": ",".join(map(str, grid)), "block": ",".join(map(str, block)),
             "layer": "-", "trace": "-", "altseq": "-"}
        if ext is None:
            r.update(seq=None, tid=0, dir="fprop", sub=0, mod="na", op="na", params="na",
                     tc="na", flops=None, bytes=None)
            rows.append(r)
            continue
        bwd = ext in bwd_of
        fop = bwd_of.get(ext, ext)
        opn, mod, seq, pf, pb, params, tck = ops[fop]
        group = ("bwd", fop) if bwd else fop  # sub counts within the node / the op
        sub = sub_of.get(group, 0)
        sub_of[group] = sub + 1
        parts = pb if bwd else pf
        # the op's whole work is shared among its kernels (helpers included) in proportion
        # to their durations
        f, b = sum(x[0] for x in parts), sum(x[1] for x in parts)
        share.setdefault(group, []).append((len(rows), dur))
        tc = "-"
        if tck == "gemm":  # SDPA counts as GEMM-like; flash kernels use tensor cores
            tc = "1" if ("xmma_gemm" in name or "flash_fwd_kernel" in name) else "0"
        elif tck == "conv":
            tc = "1" if "xmma_gemm" in name else "-"
        r.update(seq=seq, tid=tids[ext], dir="bprop" if bwd else "fprop", sub=sub, mod=mod, op=opn,
                 params=params, tc=tc, flops=f, bytes=b)
        if not bwd:
            r["trace"] = "model.py(12): forward"
            if fop in (10, 22):
                r["layer"] = "block1"
        rows.append(r)
    for members in share.values():
        total = sum(d for _, d in members)
        for i, d in members:
            rows[i]["flops"] = rows[i]["flops"] * (d / total)
            rows[i]["bytes"] = rows[i]["bytes"] * (d / total)
    return rows


def check_synthetic(ci, grpc, tmp):
    path = os.path.join(tmp, "synthetic.json")
    with open(path, "w") as f:
        json.dump(trace(), f)
    res = json.loads(run([KPROFCTL, "import", "--collector", grpc, "--job", "pyprof-synth",
                          "--json", "--rank", "0", path], "kprofctl import"))
    run_id = res["run_id"]
    got = json.loads(prof(ci, run_id, "-c", ALL, "--json"))
    assert got["columns"] == ALL_JSON.split(","), got["columns"]
    want = expected_rows()
    assert len(got["rows"]) == len(want), (len(got["rows"]), len(want))
    bad = []
    for w, g in zip(want, got["rows"]):
        for col in ALL_JSON.split(","):
            if g.get(col) != w[col]:
                bad.append("row %d %s: kprof %r, expected %r" % (w["idx"], col, g.get(col), w[col]))
    for b in bad:
        print("MISMATCH " + b)
    assert not bad, "%d mismatches" % len(bad)
    print("synthetic: %d rows x %d columns match" % (len(want), len(ALL.split(","))))

    # default columns, CSV and the columnated text
    d = json.loads(prof(ci, run_id, "--json"))
    assert d["columns"] == ["idx", "dir", "sub", "mod", "op", "kernel", "params", "sil_ns"]
    text = prof(ci, run_id, "--csv", "-c", "idx,op,flops,sil")
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["Idx", "Op", "FLOPs", "Sil(us)"], rows[0]
    assert len(rows) == len(want) + 1
    assert all(line.startswith('"') for line in text.splitlines()), text
    assert rows[1][2] == "%.0f" % want[0]["flops"], rows[1]
    # time in µs with the unit in the header, exact (3 decimals of whole ns)
    assert [r[3] for r in rows[1:]] == ["%.3f" % (w["sil_ns"] / 1000) for w in want], rows
    # text: every column as wide as its longest cell, nothing cut; -w cuts cells with "…"
    full = prof(ci, run_id, "-c", "op,kernel,sil").splitlines()
    assert full[0].split() == ["Op", "Kernel", "Sil(us)"], full[0]
    longest = max(len(w["kernel"]) for w in want)
    assert any(w["kernel"] in l for w in want if len(w["kernel"]) == longest for l in full)
    assert "scaled_dot_product_attention" in "\n".join(full), full
    text = prof(ci, run_id, "-c", "op,kernel,sil", "-w", "20")
    lines = text.splitlines()
    assert len(lines) == len(want) + 1, text
    assert "scaled_dot_product_\u2026" in text and "scaled_dot_product_attention" not in text, \
        text
    prof(ci, run_id, "-c", "idx,nosuch", rc=2)
    prof(ci, run_id, "-w", "x", rc=2)


def import_table(ci, grpc, folder, job):
    traces = sorted(glob.glob(os.path.join(folder, "*.json.gz")))
    if not traces:
        print("%s: no trace under %s, skipped" % (job, folder))
        return None, None
    res = json.loads(run([KPROFCTL, "import", "--collector", grpc, "--job", job, "--json",
                          "--rank", "0", traces[0]], "kprofctl import " + job))
    run_id = res["run_id"]
    got = json.loads(prof(ci, run_id, "-c", ALL, "--json"))["rows"]
    n, total = kpfix.psql_rows("SELECT count(*), coalesce(sum(dur_ns), 0) FROM kernels WHERE "
                               "run_id = %d AND rank = 0" % run_id, db=DB)[0]
    assert len(got) == int(n), (len(got), n)
    assert sum(r["sil_ns"] for r in got) == int(total)
    assert [r["idx"] for r in got] == list(range(1, len(got) + 1))
    for r in got:
        assert r["dir"] in ("fprop", "bprop") and r["sub"] >= 0, r
        assert r["flops"] is None or r["flops"] >= 0, r
        assert r["bytes"] is None or r["bytes"] >= 0, r
        assert (r["op"] == "na") == (r["tc"] == "na"), r
    return run_id, got


def check_hta(ci, grpc):
    """HTA's trace has no shapes: structure only, FLOPs unknown."""
    run_id, got = import_table(ci, grpc, HTA, "pyprof-hta")
    if got is None:
        return
    n_bwd = sum(r["dir"] == "bprop" for r in got)
    assert n_bwd > 0 and all(r["seq"] is not None for r in got if r["dir"] == "bprop")
    print("hta ns_resolution (run %d): %d kernels, %d bprop, %d with FLOPs" %
          (run_id, len(got), n_bwd, sum(r["flops"] is not None for r in got)))


def check_real(ci, grpc):
    run_id, got = import_table(ci, grpc, RESNET, "pyprof-resnet50")
    if got is None:
        return
    by_inv, n_bwd, n_known = {}, 0, 0
    for r in got:
        assert r["dir"] in ("fprop", "bprop")
        assert r["flops"] is None or r["flops"] >= 0
        assert r["bytes"] is None or r["bytes"] >= 0
        if r["dir"] == "bprop":
            n_bwd += 1
            assert r["seq"] is not None, r
        if r["flops"] is not None:
            n_known += 1
        # one invocation: consecutive rows of the same op, dir and seq; sub restarts at 0
        if r["op"] in ("conv2d", "convolution", "cudnn_convolution", "addmm", "mm", "linear",
                       "matmul", "bmm") and r["params"] not in ("na", "-") and r["flops"] is not None:
            key = (r["op"], r["dir"], r["seq"], r["tid"])
            if r["sub"] == 0:
                by_inv[key] = by_inv.get(key, 0)
            by_inv[key] = by_inv.get(key, 0) + r["flops"]
    assert by_inv, "no conv/GEMM rows with known shapes"
    zero = [k for k, v in by_inv.items() if v <= 0]
    assert not zero, "conv/GEMM invocations without FLOPs: %r" % zero[:5]
    assert n_bwd > 0, "no bprop rows"
    print("resnet50 (run %d): %d kernels, %d bprop, %d with FLOPs, %d conv/GEMM invocations "
          "all > 0" % (run_id, len(got), n_bwd, n_known, len(by_inv)))


def main():
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_pyprof", ci)
    tmp = tempfile.mkdtemp(prefix="kp_pyprof_", dir=kpfix.TEST_DIR)
    try:
        check_synthetic(ci, cd.grpc, tmp)
        check_real(ci, cd.grpc)
        check_hta(ci, cd.grpc)
    finally:
        cd.stop()
    cd.assert_clean_log()
    print("ok")


if __name__ == "__main__":
    main()
