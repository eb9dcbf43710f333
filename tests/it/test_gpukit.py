#!/usr/bin/env python3
"""it.test_gpukit: the GPU validation kit (gpukit/) without a GPU, so it cannot rot between loans.

Builds the bundle from the build tree (gpukit/bundle.sh: binaries, their libraries, PostgreSQL,
the ldd check), runs the GPU-side command in its dry-run mode from the tarball (kprof-test-worker
and the fake libcupti stand in for PyTorch and the GPU, kprof's whole local stack runs from the
bundle), and checks the verdict: PASS on what came back, FAIL on results altered in each way the
verdict must catch (a kernel missing, a kernel under another op, steps numbered off by one,
durations off, drops, a failed phase), and the ldd check failing on a library taken out.

Env (from tests/CMakeLists.txt): KPROF_SOURCE_DIR, KPROF_BIN_DIR, KPROF_TEST_DIR (scratch).
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

SRC = os.environ.get("KPROF_SOURCE_DIR") or os.path.realpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
BIN = os.environ.get("KPROF_BIN_DIR", os.path.join(SRC, "build"))
KIT = os.path.join(SRC, "gpukit")
PEERS = os.path.join(SRC, "tests", "data", "peers", "hta")
SCALE = float(os.environ.get("KPROF_TEST_TIMEOUT_MULTIPLIER", "1"))

sys.dont_write_bytecode = True
_base = os.environ.get("KPROF_TEST_DIR")
if _base:
    os.makedirs(_base, exist_ok=True)
T = tempfile.mkdtemp(prefix="gpukit.", dir=_base or None)
os.chmod(T, 0o755)  # PostgreSQL (another user when run as root) reads the unpacked bundle below


def load(path):
    with open(path) as f:
        return json.load(f)


def run(cmd, timeout=120, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * SCALE, env=env)


def verdict(res):
    return run([sys.executable, os.path.join(KIT, "verdict.py"), res, "--report", os.path.join(T, "report.txt")])


class GpuKit(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bundle = os.path.join(T, "bundle")
        cls.b = run(["bash", os.path.join(KIT, "bundle.sh"), "--build", BIN, "--out", cls.bundle], timeout=300)
        if cls.b.returncode != 0:
            raise AssertionError("bundle.sh failed:\n" + cls.b.stdout + cls.b.stderr)
        cls.out = os.path.join(T, "out")
        env = dict(os.environ, TMPDIR=T)
        cls.d = run(["bash", os.path.join(KIT, "run-on-gpu.sh"), "--dry-run", "--bundle",
                     os.path.join(cls.bundle, "kprof-gpukit.tar.gz"), "--out", cls.out], timeout=400, env=env)
        cls.res = os.path.join(T, "res")
        with tarfile.open(os.path.join(cls.out, "gpukit-results.tar.gz")) as t:
            t.extractall(cls.res)
        cls.res = os.path.join(cls.res, "results")

    # ---- the bundle ---------------------------------------------------------------------------
    def test_bundle_is_complete_and_small(self):
        self.assertIn("ldd check passed", self.b.stdout)
        tgz = os.path.join(self.bundle, "kprof-gpukit.tar.gz")
        self.assertLessEqual(os.path.getsize(tgz), 48 << 20)
        with open(os.path.join(self.bundle, "root", "MANIFEST")) as f:
            manifest = f.read()
        for f in ("./build/agent/inject/libkprof_inject.so", "./build/collectord/kprof-collectord",
                  "./build/kprofctl/kprofctl", "./deploy/local/kprof-stack", "./agent/kprof-run",
                  "./agent/python/kprof_hook.py", "./gpukit/run-on-gpu.sh", "./gpukit/verdict.py"):
            self.assertIn(" " + f + "\n", manifest)
        self.assertRegex(manifest, r"\./pg/lib/postgresql/\d+/bin/postgres\n")
        self.assertRegex(manifest, r"GLIBC_MAX 2\.\d+")
        grpc = glob.glob(os.path.join(self.bundle, "root", "lib", "libgrpc.so*"))
        self.assertTrue(grpc, "gRPC's library is not in the bundle")

    def test_fits_the_device_limits(self):
        """What travels (tracked files + the tarball) fits 64 MiB; what comes back from $OUT is
        at most 8 plain files of at most 16 MiB, named in letters, digits, '.', '_', '-'."""
        tracked = subprocess.run(["git", "-C", SRC, "ls-files", "-z"], capture_output=True, check=True).stdout
        size = sum(os.path.getsize(os.path.join(SRC, f)) for f in tracked.decode().split("\0")
                   if f and os.path.isfile(os.path.join(SRC, f)))
        size += os.path.getsize(os.path.join(self.bundle, "kprof-gpukit.tar.gz"))
        self.assertLess(size, 64 << 20)
        names = os.listdir(self.out)
        self.assertLessEqual(len(names), 8)
        self.assertIn("gpukit-results.tar.gz", names)
        self.assertIn("gpukit-report.txt", names)
        for n in names:
            self.assertRegex(n, r"^[A-Za-z0-9._-]+$")
            self.assertTrue(os.path.isfile(os.path.join(self.out, n)))
            self.assertLessEqual(os.path.getsize(os.path.join(self.out, n)), 16 << 20)

    def test_ldd_check_names_a_missing_library(self):
        lib = sorted(glob.glob(os.path.join(self.bundle, "root", "lib", "libprotobuf-c.so*")))[0]
        moved = os.path.join(T, os.path.basename(lib))
        shutil.move(lib, moved)
        try:
            r = run(["bash", os.path.join(KIT, "bundle.sh"), "--out", self.bundle, "--check-only"])
        finally:
            shutil.move(moved, lib)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(os.path.basename(lib), r.stderr)
        self.assertRegex(r.stderr, r"(not found in the bundle|outside the bundle)")
        r = run(["bash", os.path.join(KIT, "bundle.sh"), "--out", self.bundle, "--check-only"])
        self.assertEqual(r.returncode, 0, r.stderr)

    # ---- the dry run --------------------------------------------------------------------------
    def test_dry_run_passes(self):
        self.assertEqual(self.d.returncode, 0, self.d.stdout[-4000:] + self.d.stderr[-2000:])
        summ = load(os.path.join(self.res, "summary.json"))
        self.assertTrue(summ["dry_run"])
        self.assertEqual([p["phase"] for p in summ["phases"]],
                         ["setup", "stack", "baseline", "dormant", "capture", "torchprof"])
        self.assertTrue(all(p["status"] == "ok" for p in summ["phases"]), summ)
        for ph in ("baseline", "dormant", "capture", "torchprof"):
            for r in (0, 1):
                rec = load(os.path.join(self.res, ph, "steps.rank-%d.json" % r))
                self.assertGreaterEqual(len(rec["steps"]), 30 if ph != "capture" else 5)
                self.assertEqual(rec["kprof_stats"] is not None, ph in ("dormant", "capture"), ph)
        for r in (0, 1):
            for v in ("breakdown", "kernels", "ops"):
                self.assertTrue(load(os.path.join(self.res, "capture", "analyzer-%s.rank-%d.json" % (v, r))))
        v = run([sys.executable, os.path.join(KIT, "verdict.py"), os.path.join(self.out, "gpukit-results.tar.gz"),
                 "--json", os.path.join(T, "verdict.json")])
        self.assertEqual(v.returncode, 0, v.stdout + v.stderr)
        self.assertIn("VERDICT: PASS", v.stdout)
        with open(os.path.join(self.out, "gpukit-report.txt")) as f:
            report = f.read()
        self.assertEqual(report, v.stdout.split("report: ")[0])
        fig = load(os.path.join(T, "verdict.json"))
        self.assertEqual(len(fig["window"]), 5)
        for r in ("0", "1"):
            self.assertEqual(sorted(map(int, fig["ranks"][r])), fig["window"])
            for step, f in fig["ranks"][r].items():
                self.assertGreater(f["kernels"], 0)
                self.assertEqual(f["kernels"], f["torch_kernels"])
                self.assertEqual(f["ops_agree"], f["kernels"])
                self.assertGreater(f["memcpy_memset"], 0)
            self.assertEqual(sorted(map(int, fig["kprof_steps"][r])), fig["window"])
        for k in ("dormant/baseline", "capture/baseline", "torchprof/baseline"):
            self.assertGreater(fig["ratios"][k], 0.5)

    # ---- the verdict catches what it must -------------------------------------------------------
    def altered(self, fn):
        """A copy of the results with fn(results_dir) applied; the verdict's status and output."""
        d = tempfile.mkdtemp(dir=T)
        shutil.copytree(self.res, os.path.join(d, "results"))
        fn(os.path.join(d, "results"))
        return verdict(os.path.join(d, "results"))

    @staticmethod
    def edit_json(path, fn):
        with open(path) as f:
            doc = json.load(f)
        doc = fn(doc) or doc
        with open(path, "w") as f:
            json.dump(doc, f)

    def torch_trace(self, res, rank=0):
        return os.path.join(res, "torchprof", "torch-trace.rank-%d.json" % rank)

    def test_unaltered_copy_passes(self):
        v = self.altered(lambda res: None)
        self.assertEqual(v.returncode, 0, v.stdout)

    def test_missing_kernel_fails(self):
        def drop(doc):
            evs = doc["traceEvents"]
            k = next(i for i, e in enumerate(evs) if e.get("cat") == "kernel" and "gelu" in e["name"].lower())
            del evs[k]
        v = self.altered(lambda res: self.edit_json(self.torch_trace(res), drop))
        self.assertEqual(v.returncode, 1, v.stdout)
        m = re.search(r"FAIL rank 0 step \d+: kernel .*Gelu.*: kprof (\d+), torch.profiler (\d+)\n", v.stdout)
        self.assertTrue(m, v.stdout)
        self.assertEqual(int(m.group(1)) - int(m.group(2)), 1)

    def test_kernel_under_another_op_fails(self):
        def reattribute(doc):
            evs = doc["traceEvents"]
            ext = next(e["args"]["External id"] for e in evs if e.get("cat") == "kernel" and "sgemm" in e["name"])
            op = next(e for e in evs if e.get("cat") == "cpu_op" and e["args"].get("External id") == ext)
            op["name"] = "aten::bmm"
        v = self.altered(lambda res: self.edit_json(self.torch_trace(res), reattribute))
        self.assertEqual(v.returncode, 1, v.stdout)
        self.assertRegex(v.stdout, r"FAIL rank 0 step \d+: kernel .*sgemm.* under op aten::bmm: kprof 0, torch.profiler 1")

    def test_steps_numbered_off_by_one_fail(self):
        def shift(doc):
            for e in doc["traceEvents"]:
                if e.get("name", "").startswith("ProfilerStep#"):
                    e["name"] = "ProfilerStep#%d" % (int(e["name"].split("#")[1]) + 1)
        v = self.altered(lambda res: self.edit_json(self.torch_trace(res, 1), shift))
        self.assertEqual(v.returncode, 1, v.stdout)
        self.assertIn("FAIL rank 1: steps differ", v.stdout)

    def test_durations_out_of_tolerance_fail(self):
        def slow(doc):
            for e in doc["traceEvents"]:
                if e.get("cat") == "kernel":
                    e["dur"] *= 1.3
        v = self.altered(lambda res: self.edit_json(self.torch_trace(res), slow))
        self.assertEqual(v.returncode, 1, v.stdout)
        self.assertRegex(v.stdout, r"FAIL rank 0 step \d+: kernel durations differ by 2\d\.\d% \(median\)")
        # within the tolerance: a 5% difference passes
        def bit(doc):
            for e in doc["traceEvents"]:
                if e.get("cat") == "kernel":
                    e["dur"] *= 1.05
        v = self.altered(lambda res: self.edit_json(self.torch_trace(res), bit))
        self.assertEqual(v.returncode, 0, v.stdout)

    def test_drops_fail(self):
        def drops(rows):
            rows[1]["dropped"] = 3
        v = self.altered(lambda res: self.edit_json(os.path.join(res, "capture", "status.json"), drops))
        self.assertEqual(v.returncode, 1, v.stdout)
        self.assertIn("FAIL rank 1: kprof dropped 3 records in the capture", v.stdout)

        def lib_drops(rec):
            rec["kprof_stats"]["cupti_dropped"] = 2
        v = self.altered(lambda res: self.edit_json(os.path.join(res, "capture", "steps.rank-0.json"), lib_drops))
        self.assertEqual(v.returncode, 1, v.stdout)
        self.assertIn("FAIL rank 0: kprof's cupti_dropped = 2", v.stdout)

    def test_analyzer_disagreement_fails(self):
        def fewer(rows):
            rows[0]["calls"] -= 1
        v = self.altered(lambda res: self.edit_json(os.path.join(res, "capture", "analyzer-kernels.rank-0.json"), fewer))
        self.assertEqual(v.returncode, 1, v.stdout)
        self.assertIn("FAIL rank 0: analyzer: kernel", v.stdout)

    def test_unreadable_results(self):
        self.assertEqual(verdict(os.path.join(T, "nothing-here")).returncode, 2)
        bad = os.path.join(T, "bad.tar.gz")
        with open(bad, "w") as f:
            f.write("not a tarball")
        v = verdict(bad)
        self.assertEqual(v.returncode, 2)
        self.assertIn("cannot read the results", v.stderr)

    def test_verdict_reads_a_real_torch_profiler_trace(self):
        """The verdict's reader on a trace torch.profiler wrote (HTA's ns-resolution peer trace,
        5 steps of a training job): every kernel lands in a step and under an op."""
        sys.path.insert(0, KIT)
        import verdict as vd

        path = os.path.join(PEERS, "ns_resolution_rank0", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
        by_step, steps = vd.load_trace(path)
        doc = vd.load_json(path)
        kernels = sum(1 for e in doc["traceEvents"] if e.get("cat") == "kernel")
        self.assertEqual(steps, [101, 102, 103, 104, 105])
        got = [e for s in steps for e in by_step[s] if e["kind"] == "kernel"]
        self.assertEqual(len(got), kernels)
        self.assertTrue(all(e["op"] for e in got))
        self.assertEqual(len({len([e for e in by_step[s] if e["kind"] == "kernel"]) for s in steps}), 1)

    # ---- the GPU-side command's limits ----------------------------------------------------------
    def test_deadline_keeps_finished_phases(self):
        """A phase killed at its time limit, and those skipped after it for want of time, lose
        nothing of what ran before: every phase is packed into $OUT as it ends."""
        out = os.path.join(T, "out-short")
        # 2 s steps: the baseline's 30 steps outlast what a 45 s deadline leaves it.
        env = dict(os.environ, TMPDIR=T, GPUKIT_DEADLINE_S="45", GPUKIT_FAKE_STEP_MS="2000")
        r = run(["bash", os.path.join(KIT, "run-on-gpu.sh"), "--dry-run", "--bundle",
                 os.path.join(self.bundle, "kprof-gpukit.tar.gz"), "--out", out], timeout=150, env=env)
        self.assertEqual(r.returncode, 1, r.stdout[-3000:])
        with tarfile.open(os.path.join(out, "gpukit-results.tar.gz")) as t:
            names = t.getnames()
            summ = json.load(t.extractfile("results/summary.json"))
        st = {p["phase"]: p for p in summ["phases"]}
        self.assertEqual([st[p]["status"] for p in ("setup", "stack")], ["ok", "ok"], summ)
        self.assertEqual(st["baseline"]["status"], "failed", summ)
        self.assertIn("killed at its time limit", st["baseline"]["detail"])
        self.assertEqual([st[p]["status"] for p in ("dormant", "capture", "torchprof")], ["skipped"] * 3, summ)
        for f in ("results/setup.json", "results/stack/up.txt", "results/baseline/job.log", "results/gpukit.log"):
            self.assertIn(f, names)
        v = verdict(os.path.join(out, "gpukit-results.tar.gz"))
        self.assertEqual(v.returncode, 1)
        self.assertIn("FAIL phase baseline failed", v.stdout)

    def test_job_torch_usage_needs_no_torch(self):
        r = run([sys.executable, os.path.join(KIT, "job_torch.py"), "--out", T, "--steps", "0"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--steps must be", r.stderr)
        r = run([sys.executable, os.path.join(KIT, "job_torch.py"), "--out", T, "--profile-steps", "x"])
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(T, ignore_errors=True)
