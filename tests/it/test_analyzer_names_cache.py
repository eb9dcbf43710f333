"""kprof-analyzer's names cache (analyzer/an.c): one analyzer process keeps the names dictionary
it has read and asks PostgreSQL only for ids it has not seen. Names imported after the cache
was filled must still come out right.

Two TensorBoard-plugin peer cases are imported with `kprofctl import` through a real
kprof-collectord, the second one only after the running analyzer has answered views of the first
(so its kernel and op names get ids the cache has never seen). Then, for both runs, each per-rank
view that reads names (breakdown, ops, kernels, prof, roofline) answered by that analyzer is
byte for byte what `kprof-analyze --pg CI kprofctl VERB` prints (a fresh process, an empty
cache), and the second run's kernels include its NCCL kernel, a name first read after the cache
was filled.
"""
import json
import os
import subprocess
import tempfile

import kpfix

kpfix.require_env()
from test_analyzer_service import Analyzer  # noqa: E402

DB = "kp_it_analyzer_names_cache"
CASES = os.path.join(os.environ.get("KPROF_SOURCE_DIR", "."), "tests", "data", "peers",
                     "tbplugin", "cases")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
ANALYZE = os.path.join(kpfix.BIN, "analyzer", "kprof-analyze")
VIEWS = (["breakdown", "--json"], ["ops", "--json"], ["ops", "--group-by", "shapes", "--json"],
         ["kernels", "--json"], ["prof", "--json"], ["roofline", "--json"])


def run(args, what):
    p = subprocess.run(args, capture_output=True, text=True, timeout=300 * kpfix.SCALE)
    if p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s%s" % (what, p.returncode, p.stdout, p.stderr))
    return p.stdout


def import_case(grpc_addr, tmp, name):
    with open(os.path.join(CASES, name + ".json")) as f:
        case = json.load(f)
    path = os.path.join(tmp, name)
    os.makedirs(path, exist_ok=True)
    if "trace" in case:
        traces, extra = {"r0": case["trace"]}, ["--rank", "0"]
    else:
        traces, extra = case["traces"], []
    for w, t in traces.items():
        with open(os.path.join(path, w + ".json"), "w") as f:
            json.dump(t, f)
    res = json.loads(run([KPROFCTL, "import", "--collector", grpc_addr, "--job",
                          "names-" + name, "--json"] + extra + [path], "kprofctl import " + name))
    return res["run_id"]


def same_as_offline(an, ci, run_id):
    for verb in VIEWS:
        args = [verb[0], "--run", str(run_id), "--rank", "0"] + verb[1:]
        got = run([KPROFCTL] + args + ["--analyzer", an.grpc], "kprofctl " + " ".join(args))
        want = run([ANALYZE, "--pg", ci, "kprofctl"] + args, "kprof-analyze kprofctl " +
                   " ".join(args))
        assert got == want, (args, got, want)


def main():
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_names_cache", ci)
    an = Analyzer("it_names_cache_analyzer", ci, ["--cache-bytes", "0"])
    tmp = tempfile.mkdtemp(prefix="kp_names_", dir=kpfix.TEST_DIR)
    try:
        first = import_case(cd.grpc, tmp, "test_tensor_core")
        same_as_offline(an, ci, first)  # fills the analyzer's names cache
        second = import_case(cd.grpc, tmp, "test_distributed_nccl")
        same_as_offline(an, ci, second)
        same_as_offline(an, ci, first)
        kernels = json.loads(run([KPROFCTL, "kernels", "--run", str(second), "--rank", "0",
                                  "--json", "--analyzer", an.grpc], "kprofctl kernels"))
        names = json.dumps(kernels)
        assert "nccl" in names, names[:2000]
        print("names cache: runs %d then %d, %d views each, as a fresh process prints them"
              % (first, second, len(VIEWS)))
    finally:
        rc = an.stop()
        cd.stop()
    assert rc == 0, rc
    cd.assert_clean_log()
    print("ok")


if __name__ == "__main__":
    main()
