"""The roofline (analyzer/roofline.h) and PyProf's table through kprof-analyzer, end to end.

1. A small Kineto trace built here, imported with `kprofctl import` through a real
   kprof-collectord: an H100 (device 0, found in the built-in table by its name) and an
   unknown GPU "Acme X1" (device 1), with aten::mm (bf16 on a Hopper gmma kernel, fp32 on a
   CUDA-core sgemm and on a TF32 xmma kernel) and aten::gelu kernels of known durations. Every
   figure of `kprof-analyze roofline --json`, by kernel and by op, is compared exactly with
   values computed here: FLOPs and bytes by hand from the spec's formulas
   (docs/specs/flops-bytes.md: mm 2MNK and S(MK + KN + MN), gelu 24E and 2ES), achieved
   FLOP/s and bytes/s, intensity, each kernel's peak from its dtype and Tensor Core use
   (datasheet figures), the fractions of peak compute and bandwidth. The unknown GPU first
   has no peaks (fractions null, the source says why); once its row carries a capture's
   properties (clock, bandwidth) its peaks come from them: SMs x lanes x 2 x clock.
2. The TensorBoard plugin's resnet50 trace (Tesla V100-DGXS-32GB): the V100 SXM2 entry is
   used and said so; fractions are consistent with the figures.
3. The service: `kprofctl roofline` (text, --csv, --json, --by op, --top) and `kprofctl prof`
   (default columns, -c, -w, --csv, --json) print exactly what kprof-analyze prints, on both
   runs; a repeated roofline is a cache hit (prof streams its rows, never cached); an unknown run
   exits 3; bad flags exit 2.
"""
import csv
import glob
import io
import json
import os
import signal
import subprocess
import tempfile
import urllib.request

import kpfix

kpfix.require_env()

DB = "kp_it_roofline"
# The repository's test data: the peers' traces and figures (tests/data/peers/README.md).
SHARED = os.path.join(os.environ.get("KPROF_SOURCE_DIR", "."), "tests", "data")
RESNET = os.path.join(SHARED, "peers", "tbplugin", "resnet50", "traces", "resnet50_num_workers_0")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
ANALYZE = os.path.join(kpfix.BIN, "analyzer", "kprof-analyze")
ANALYZER = os.path.join(kpfix.BIN, "analyzer", "kprof-analyzer")
SANITIZER = ("Sanitizer", "runtime error:", "LeakSanitizer")
T, G = 1e12, 1e9


def run(args, what, rc=0):
    p = subprocess.run(args, capture_output=True, text=True, timeout=300 * kpfix.SCALE)
    if p.returncode != rc:
        raise AssertionError("%s exited %d (want %d):\n%s" % (what, p.returncode, rc, p.stderr))
    for bad in SANITIZER:
        assert bad not in p.stderr, p.stderr
    return p.stdout


def analyze(ci, run_id, *verb):
    return run([ANALYZE, "--pg", ci, "--run", str(run_id), "--rank", "0"] + list(verb),
               "kprof-analyze " + " ".join(verb))


# ---- the synthetic trace --------------------------------------------------------------

PID, TID = 100, 100
GMMA = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cluster1x2x1_gmma_se82"
SGEMM = "ampere_sgemm_128x64_nn"
TF32 = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32"
GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>"
        "(int, at::native::GeluCUDAKernelImpl)")
HMMA = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn"
SGEMM64 = "ampere_sgemm_64x64_nn"

# (external id, op, shapes, dtypes, kernel, device, duration µs)
OPS = [
    (10, "aten::mm", [[256, 512], [512, 1024]], ["c10::BFloat16"] * 2, GMMA, 0, 2),
    (20, "aten::mm", [[128, 256], [256, 64]], ["float"] * 2, SGEMM, 0, 4),
    (30, "aten::mm", [[128, 256], [256, 64]], ["float"] * 2, TF32, 0, 1),
    (40, "aten::gelu", [[4096, 1024], []], ["float", ""], GELU, 1, 40),
    (50, "aten::mm", [[256, 512], [512, 1024]], ["c10::BFloat16"] * 2, HMMA, 1, 8),
    # 1.1 TFLOP in 1 µs: far above any peak (a wrong shape or duration); flagged, not hidden
    (60, "aten::mm", [[8192, 8192], [8192, 8192]], ["float"] * 2, SGEMM64, 0, 1),
]


def trace():
    ev = []
    for i, (ext, name, dims, types, kname, dev, dur) in enumerate(OPS):
        ts = 10 + 20 * i
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": TID, "ts": ts,
                   "dur": 10, "args": {"External id": ext, "Input Dims": dims,
                                       "Input type": types, "Sequence number": i + 1}})
        corr = 1000 + i
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID,
                   "tid": TID, "ts": ts + 1, "dur": 1,
                   "args": {"correlation": corr, "External id": ext}})
        ev.append({"ph": "X", "cat": "kernel", "name": kname, "pid": dev, "tid": 7,
                   "ts": 300 + 20 * i, "dur": dur,
                   "args": {"correlation": corr, "External id": ext, "device": dev,
                            "stream": 7, "context": 1, "grid": [8, 1, 1],
                            "block": [128, 1, 1]}})
    return {"schemaVersion": 1, "traceEvents": ev,
            "deviceProperties": [
                {"id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9,
                 "computeMinor": 0, "numSms": 132},
                {"id": 1, "name": "Acme X1", "computeMajor": 8, "computeMinor": 0,
                 "numSms": 100}]}


# ---- expected figures -----------------------------------------------------------------

H100 = {"fp32": 67 * T, "tf32": 494.5 * T, "fp16": 989.5 * T, "fp8": 1979 * T, "bw": 3350 * G}
# Acme X1 once its row carries a capture's properties: 100 SMs at 1 GHz, cc 8.0 (64 FP32
# lanes and 2048 dense FP16 Tensor Core FLOP per clock per SM), 1 TB/s.
ACME = {"fp32": 100 * 64 * 2 * 1e9, "tf32": 100 * 2048 * 1e9 / 2, "fp16": 100 * 2048 * 1e9,
        "fp8": None, "bw": 1e12}


def mm(m, k, n, s):
    return 2 * m * n * k, s * (m * k + k * n + m * n)


# per kernel: (name, op, device, peak class, flops, bytes, ns)
def kernels():
    f_bf, b_bf = mm(256, 512, 1024, 2)   # 268435456 FLOPs, 1835008 bytes
    f_32, b_32 = mm(128, 256, 64, 4)     # 4194304 FLOPs, 229376 bytes
    f_big, b_big = mm(8192, 8192, 8192, 4)
    e = 4096 * 1024
    # rows by kernel are keyed by the full name, as `kprofctl kernels` shows it
    return [(GMMA, "mm", 0, "fp16", f_bf, b_bf, 2000),
            (SGEMM, "mm", 0, "fp32", f_32, b_32, 4000),
            (TF32, "mm", 0, "tf32", f_32, b_32, 1000),
            (GELU, "gelu", 1, "fp32", 24 * e, 2 * e * 4, 40000),
            (HMMA, "mm", 1, "fp16", f_bf, b_bf, 8000),
            (SGEMM64, "mm", 0, "fp32", f_big, b_big, 1000)]


def expected(by, peaks_of):
    """The rows as roofline.c computes them, the same sums in the same order."""
    groups = {}
    order = []
    for name, op, dev, cls, f, b, ns in kernels():
        key = (op, "fprop") if by == "op" else (name, "")
        if key not in groups:
            groups[key] = {"name": key[0], "device": dev, "kernels": 0, "time": 0, "flops": 0.0,
                           "bytes": 0.0, "ft": 0.0, "bt": 0.0, "work": 0.0, "missing": False,
                           "peak": None, "bw": peaks_of[dev]["bw"] or 0}
            order.append(key)
        g = groups[key]
        p = peaks_of[dev][cls] or 0
        g["kernels"] += 1
        g["time"] += ns
        g["flops"] += f
        g["ft"] += ns
        g["work"] += p * ns
        g["missing"] = g["missing"] or p <= 0
        g["peak"] = cls if g["peak"] in (None, cls) else "mixed"
        g["bytes"] += b
        g["bt"] += ns
        if (peaks_of[dev]["bw"] or 0) != g["bw"]:
            g["bw"] = 0
    rows = []
    for key in order:
        g = groups[key]
        r = {"name": g["name"], "device": g["device"], "peak": g["peak"],
             "kernels": g["kernels"], "time_ns": g["time"], "flops": g["flops"],
             "bytes": g["bytes"], "flop_per_s": g["flops"] / (g["ft"] * 1e-9),
             "bytes_per_s": g["bytes"] / (g["bt"] * 1e-9), "intensity": g["flops"] / g["bytes"],
             "peak_flop_per_s": None, "compute_fraction": None,
             "bandwidth_bytes_per_s": g["bw"] or None, "bandwidth_fraction": None}
        if by == "op":
            r["dir"] = "fprop"
        if not g["missing"]:
            r["peak_flop_per_s"] = g["work"] / g["ft"]
            r["compute_fraction"] = g["flops"] / (g["work"] * 1e-9)
        if g["bw"]:
            r["bandwidth_fraction"] = r["bytes_per_s"] / g["bw"]
        above = [k for k, f in (("compute", r["compute_fraction"]),
                                ("bandwidth", r["bandwidth_fraction"])) if f is not None and f > 1]
        r["above_peak"] = ",".join(above) or None
        rows.append(r)
    rows.sort(key=lambda r: (-r["time_ns"], r["name"]))
    return rows


def check_rows(what, got, want):
    assert len(got) == len(want), (what, got, want)
    for g, w in zip(got, want):
        for k, v in w.items():
            assert k in g, (what, k, g)
            if isinstance(v, float) and g[k] is not None:
                assert float(g[k]) == v, (what, w["name"], k, g[k], v)
            else:
                assert g[k] == v, (what, w["name"], k, g[k], v)


def check_synthetic(ci, cd_grpc, tmp):
    path = os.path.join(tmp, "roofline.json")
    with open(path, "w") as f:
        json.dump(trace(), f)
    res = json.loads(run([KPROFCTL, "import", "--collector", cd_grpc, "--job", "roofline",
                          "--json", "--rank", "0", path], "kprofctl import"))
    run_id = res["run_id"]
    # The PyProf table the roofline reads: the FLOPs and bytes above, and tc.
    prof = json.loads(analyze(ci, run_id, "prof", "-c", "kernel,op,tc,params,flops,bytes,sil",
                              "--json"))["rows"]
    want = kernels()
    assert [(r["op"], r["tc"], r["flops"], r["bytes"], r["sil_ns"]) for r in prof] == \
        [(op, "0" if cls == "fp32" and op == "mm" else ("1" if op == "mm" else "-"), f, b, ns)
         for _n, op, _d, cls, f, b, ns in want], prof
    unknown = {"fp32": None, "tf32": None, "fp16": None, "fp8": None, "bw": None}
    for step, acme in (("before", unknown), ("after", ACME)):
        if step == "after":
            # What a capture records and an imported trace lacks: the clock and bandwidth.
            kpfix.psql("UPDATE devices SET clock_khz = 1000000, memory_bandwidth_bytes_per_s "
                       "= 1000000000000 WHERE run_id = %d AND id = 1" % run_id, db=DB)
        peaks = {0: H100, 1: acme}
        for by in ("kernel", "op"):
            got = json.loads(analyze(ci, run_id, "roofline", "--by", by, "--json"))
            assert got["by"] == by, got
            check_rows("%s %s" % (step, by), got["rows"], expected(by, peaks))
        devs = {d["id"]: d for d in got["devices"]}
        h = devs[0]
        assert h["entry"] == "H100 SXM" and "NVIDIA H100 80GB HBM3" in h["source"], h
        assert (h["peak_fp32_flop_per_s"], h["peak_tf32_flop_per_s"], h["peak_fp16_flop_per_s"],
                h["peak_fp8_flop_per_s"], h["bandwidth_bytes_per_s"]) == \
            (H100["fp32"], H100["tf32"], H100["fp16"], H100["fp8"], H100["bw"]), h
        a = devs[1]
        assert a["entry"] is None, a
        if step == "before":
            assert a["source"].startswith("none") and "Acme X1" in a["source"], a
            assert a["peak_fp32_flop_per_s"] is None and a["bandwidth_bytes_per_s"] is None, a
        else:
            assert a["source"].startswith("device properties") and "clock_khz=1000000" in \
                a["source"], a
            assert (a["peak_fp32_flop_per_s"], a["peak_tf32_flop_per_s"],
                    a["peak_fp16_flop_per_s"], a["peak_fp8_flop_per_s"],
                    a["bandwidth_bytes_per_s"]) == \
                (ACME["fp32"], ACME["tf32"], ACME["fp16"], None, ACME["bw"]), a
    # by op: one mm row over both GPUs (bandwidth undefined: two bandwidths), mixed peaks
    mm_row = [r for r in got["rows"] if r["name"] == "mm"][0]
    assert mm_row["peak"] == "mixed" and mm_row["bandwidth_fraction"] is None, mm_row
    # text: each device's peaks and why, then the rows
    text = analyze(ci, run_id, "roofline")
    assert 'device 0 "NVIDIA H100 80GB HBM3": peaks from built-in table entry "H100 SXM"' in \
        text, text
    assert 'device 1 "Acme X1": peaks from device properties' in text, text
    # the row above its peaks is flagged in every format, under the full kernel name
    lines = text.splitlines()
    assert "above_peak" in lines[2] and "time_us" in lines[2], lines[2]
    flagged = [l for l in lines if l.endswith(SGEMM64)]
    assert len(flagged) == 1 and " compute,bandwidth  " in flagged[0], lines
    assert lines[-1].startswith("1 row(s) above 100 % of a peak"), lines[-1]
    assert any(l.endswith(GELU) for l in lines), lines
    csv_rows = list(csv.DictReader(io.StringIO(analyze(ci, run_id, "roofline", "--csv"))))
    assert [r["above_peak"] for r in csv_rows if r["name"] == SGEMM64] == ["compute,bandwidth"], \
        [r for r in csv_rows if r["name"] == SGEMM64]
    by_name = {r["name"]: r for r in csv_rows}
    assert by_name[SGEMM]["time_us"] == "4.000" and by_name[GELU]["time_us"] == "40.000", \
        [r for r in csv_rows if r["name"] == SGEMM64]
    top = json.loads(analyze(ci, run_id, "roofline", "--top", "2", "--json"))["rows"]
    assert len(top) == 2, top
    print("synthetic (run %d): FLOP/s, bytes/s, intensity and peak fractions by kernel and by "
          "op match the hand-computed figures (H100 from the built-in table; the unknown GPU "
          "without peaks, then from its properties)" % run_id)
    return run_id


def check_resnet(ci, cd_grpc):
    path = sorted(glob.glob(os.path.join(RESNET, "*.json*")))[0]
    res = json.loads(run([KPROFCTL, "import", "--collector", cd_grpc, "--job", "roofline-r50",
                          "--json", "--rank", "0", path], "kprofctl import resnet50"))
    run_id = res["run_id"]
    got = json.loads(analyze(ci, run_id, "roofline", "--json"))
    devs = got["devices"]
    assert devs and all(d["entry"] == "V100 SXM2" and "Tesla V100-DGXS-32GB" in d["source"]
                        for d in devs), devs
    assert devs[0]["peak_fp32_flop_per_s"] == 15.7 * T and \
        devs[0]["peak_fp16_flop_per_s"] == 125 * T and \
        devs[0]["bandwidth_bytes_per_s"] == 900 * G, devs[0]
    prof = json.loads(analyze(ci, run_id, "prof", "-c", "sil", "--json"))["rows"]
    rows = got["rows"]
    assert sum(r["kernels"] for r in rows) == len(prof), (len(rows), len(prof))
    assert sum(r["time_ns"] for r in rows) == sum(r["sil_ns"] for r in prof)
    n_frac = 0
    # an op's work is shared among its kernels by duration, so a kernel is above a peak only
    # where its op is (Winograd convolutions beat the direct-convolution FLOP count; batch
    # norm's single-read kernels the byte model): every such row is flagged
    above = 0
    for r in rows:
        want = [k for k, f in (("compute", r["compute_fraction"]),
                               ("bandwidth", r["bandwidth_fraction"])) if f is not None and f > 1]
        assert r["above_peak"] == (",".join(want) or None), r
        above += bool(want)
    top_c = max((r["compute_fraction"] or 0, r["name"][:50]) for r in rows)
    top_b = max((r["bandwidth_fraction"] or 0, r["name"][:50]) for r in rows)
    for r in rows:
        if r["compute_fraction"] is not None:
            n_frac += 1
            assert abs(r["compute_fraction"] - r["flop_per_s"] / r["peak_flop_per_s"]) <= \
                1e-9 * r["compute_fraction"], r
            # Σ(peak × duration) / Σ duration: the class's peak up to rounding
            assert r["peak"] == "mixed" or any(
                abs(r["peak_flop_per_s"] - p) <= 1e-12 * p for p in (15.7 * T, 125 * T)), r
        if r["bandwidth_fraction"] is not None:
            assert abs(r["bandwidth_fraction"] - r["bytes_per_s"] / (900 * G)) <= \
                1e-9 * r["bandwidth_fraction"], r
    assert n_frac > 0, rows[:5]
    print("resnet50 (run %d): V100 SXM2 peaks from the built-in table (Tesla V100-DGXS-32GB); "
          "%d kernel rows with a compute fraction; %d flagged above a peak (highest: %.1f %% of "
          "compute, %s; %.1f %% of bandwidth, %s)"
          % (run_id, n_frac, above, 100 * top_c[0], top_c[1], 100 * top_b[0], top_b[1]))
    return run_id


# ---- the service ----------------------------------------------------------------------

class Analyzer:
    def __init__(self, ci):
        self.dir = os.path.join(kpfix.TEST_DIR, "it_roofline_analyzer")
        os.makedirs(self.dir, exist_ok=True)
        self.ready = os.path.join(self.dir, "ready")
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.log_path = os.path.join(self.dir, "analyzer.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [ANALYZER, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--pg-conninfo", ci, "--ready-file", self.ready], stdout=self.log,
            stderr=subprocess.STDOUT)
        kpfix.wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30,
                       "kprof-analyzer ready")
        assert self.proc.poll() is None, open(self.log_path).read()
        addrs = dict(l.strip().split("=", 1) for l in open(self.ready) if "=" in l)
        self.grpc, self.http = addrs["grpc"], addrs["http"]

    def hits(self):
        with urllib.request.urlopen("http://%s/metrics" % self.http, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("kprof_analyzer_cache_hits_total "):
                    return float(line.split()[1])
        return None

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30 * kpfix.SCALE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def check_service(ci, runs):
    an = Analyzer(ci)
    try:
        ctl = [KPROFCTL, None, "--analyzer", an.grpc]
        for run_id in runs:
            r = ["--run", str(run_id)]
            for verb, flags in (
                    ("roofline", []), ("roofline", ["--json"]), ("roofline", ["--csv"]),
                    ("roofline", ["--by", "op"]), ("roofline", ["--by", "op", "--json"]),
                    ("roofline", ["--by", "op", "--csv", "--top", "3"]),
                    ("roofline", ["--top", "2", "--json"]),
                    ("prof", []), ("prof", ["--json"]), ("prof", ["--csv"]),
                    ("prof", ["-c", "idx,seq,altseq,tid,layer,trace,dir,sub,mod,op,kernel,"
                                    "params,sil,tc,device,stream,grid,block,flops,bytes"]),
                    ("prof", ["-c", "kernel,params,flops,bytes", "-w", "90"]),
                    ("prof", ["-c", "idx,seq,altseq,tid,layer,trace,dir,sub,mod,op,kernel,"
                                    "params,sil,tc,device,stream,grid,block,flops,bytes",
                              "--json"])):
                want = analyze(ci, run_id, verb, *flags)
                got = run([KPROFCTL, verb, "--analyzer", an.grpc] + r + flags,
                          "kprofctl %s %s" % (verb, " ".join(flags)))
                assert got == want, (verb, flags, got[:2000], want[:2000])
        h0 = an.hits()
        run(ctl[:1] + ["roofline"] + ctl[2:] + ["--run", str(runs[0])], "kprofctl roofline")
        run(ctl[:1] + ["prof"] + ctl[2:] + ["--run", str(runs[0])], "kprofctl prof")
        assert an.hits() == h0 + 1, (h0, an.hits())  # prof streams its rows: never cached
        for verb in ("roofline", "prof"):
            run([KPROFCTL, verb, "--analyzer", an.grpc, "--run", "999999"], verb, rc=3)
            run([KPROFCTL, verb, "--analyzer", an.grpc], verb, rc=2)
        run([KPROFCTL, "roofline", "--analyzer", an.grpc, "--run", str(runs[0]), "--by",
             "shapes"], "roofline --by shapes", rc=2)
        run([KPROFCTL, "prof", "--analyzer", an.grpc, "--run", str(runs[0]), "-c", "nope"],
            "prof -c nope", rc=2)
        # help and behaviour agree: roofline's -c does not apply (exit 2, and --help says so);
        # -w cuts names with "…" as in every verb
        help_text = run([KPROFCTL, "roofline", "--help"], "roofline --help")
        assert "does not apply" in help_text and "-w" in help_text, help_text
        run([KPROFCTL, "roofline", "--analyzer", an.grpc, "--run", str(runs[0]), "-c", "name"],
            "roofline -c", rc=2)
        full = run([KPROFCTL, "roofline", "--analyzer", an.grpc, "--run", str(runs[0])], "rl")
        cut = run([KPROFCTL, "roofline", "--analyzer", an.grpc, "--run", str(runs[0]), "-w",
                   "20"], "roofline -w 20")
        assert GELU in full and GELU not in cut and GELU[:19] + "\u2026" in cut, cut
        assert an.stop() == 0
        log = open(an.log_path).read()
        for bad in SANITIZER:
            assert bad not in log, log
    finally:
        an.stop()
    print("service: kprofctl roofline and prof print exactly what kprof-analyze prints (text, "
          "CSV, JSON, --by op, --top, -c, -w), roofline cached on repeat; unknown run exits 3, bad "
          "flags 2")


def main():
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_roofline", ci)
    tmp = tempfile.mkdtemp(prefix="kp_roofline_", dir=kpfix.TEST_DIR)
    try:
        synth = check_synthetic(ci, cd.grpc, tmp)
        r50 = check_resnet(ci, cd.grpc)
        check_service(ci, [synth, r50])
    finally:
        cd.stop()
    cd.assert_clean_log()
    print("ok")


if __name__ == "__main__":
    main()
