"""The operator and kernel views read a rank by windows (analyzer/an_window.c, --window-events),
with the real kprof-collectord, kprof-analyze, kprof-analyzer, kprofctl and PostgreSQL:
  1. On kprof-loadgen's ranks and on real traces imported (HTA's sampled rank 0, whose
     microsecond timestamps give ops of the same thread, start and duration; the plugin's
     resnet50 span; HTA's nanosecond rank), kprofctl ops (by name, by shapes) and kernels (by
     name, by op) read by windows of 20 host events (the log says how many windows: two or
     more) answer what the rank read whole answers: every field equal, the duration-weighted
     means to 1e-12 (their sums are added in another order).
  2. A rank that cannot be cut (an op spanning all of it, added here) is read whole, and
     answers the same.
  3. kprof-analyzer --window-events 20 with a --memory-budget below what a whole read of the
     rank is estimated to take: the operator and kernel views answer (two windows' estimate
     fits), the breakdown, which reads the rank whole, is refused naming the budget.
  4. --window-events that is not a count is refused (exit 2) by kprof-analyze and
     kprof-analyzer."""
import json
import os
import subprocess

import kpfix

kpfix.require_env()
import test_analyzer_service as tas  # noqa: E402

DB = "kp_it_analyzer_windows"
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "peers")
TRACES = ("hta/trace_filter_2rank/sampled_rank-0.json.gz",
          "tbplugin/resnet50/traces/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
          "hta/ns_resolution_rank0/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
VIEWS = (("ops", "--group-by", "name"), ("ops", "--group-by", "shapes"),
         ("kernels", "--group-by", "name"), ("kernels", "--group-by", "op"))
WINDOW = 20


def offline(run_id, rank, window, view):
    """kprofctl VIEW in process (kprof-analyze kprofctl): the rows and the windows logged."""
    p = subprocess.run([tas.ANALYZE, "--pg", kpfix.conninfo(DB), "--window-events", str(window),
                        "kprofctl"] + list(view) + ["--run", str(run_id), "--rank", str(rank),
                                                    "--json", "--log-level", "info"],
                       capture_output=True, text=True, timeout=300 * kpfix.SCALE)
    assert p.returncode == 0, (view, p.returncode, p.stderr)
    for bad in tas.SANITIZER:
        assert bad not in p.stderr, p.stderr
    windows = [int(w.split("=")[1]) for line in p.stderr.splitlines()
               if "rank read by windows" in line for w in line.split() if w.startswith("windows=")]
    return json.loads(p.stdout), windows


def same(whole, win, where):
    assert len(whole) == len(win), (where, len(whole), len(win))
    for a, b in zip(whole, win):
        assert set(a) == set(b), (where, a, b)
        for k in a:
            if k in tas.OCC:
                assert abs(a[k] - b[k]) <= 1e-12 * max(abs(a[k]), abs(b[k]), 1.0), (where, k, a, b)
            else:
                assert a[k] == b[k], (where, k, a, b)


def check_rank(run_id, rank, what, cut=True):
    for view in VIEWS:
        whole, w0 = offline(run_id, rank, 0, view)
        win, w = offline(run_id, rank, WINDOW, view)
        assert w0 == [], w0
        if cut:
            assert len(w) == 1 and w[0] >= 2, (what, view, w)
        else:
            assert w == [], (what, view, w)
        assert whole, (what, view, "no rows")
        same(whole, win, (what, view))
    return w[0] if cut else 1


def import_trace(cd, path):
    out = tas.run([tas.KPROFCTL, "import", "--collector", cd.grpc, "--job", "windows", "--json",
                   "--rank", "0", "--progress", "off", path], "kprofctl import " + path)
    return json.loads(out)["run_id"]


def check_bad_flags():
    """--window-events takes a count: anything else is refused with exit 2 and says so."""
    for bad in ("abc", "-5", ""):
        p = subprocess.run([tas.ANALYZE, "--pg", kpfix.conninfo(DB), "--window-events", bad,
                            "kprofctl", "ops", "--run", "1"], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and "--window-events takes a count" in p.stderr, (bad, p)
    for bad in ("abc", "-1"):
        p = subprocess.run([tas.ANALYZER, "--window-events", bad, "--dry-run"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and "window-events" in p.stderr, (bad, p.returncode, p.stderr)
    print("--window-events refuses what is not a count (kprof-analyze and kprof-analyzer)")


def main():
    kpfix.fresh_db(DB)
    check_bad_flags()
    cd = kpfix.Collectord("analyzer_windows", kpfix.conninfo(DB))
    an = None
    try:
        out = tas.run([LOADGEN, "--collector", cd.grpc, "--json", "--ranks", "2", "--steps", "12",
                       "--kernels-per-step", "40", "--job", "windows"], "kprof-loadgen")
        gen = json.loads(out)["run_id"]
        for rank in (0, 1):
            n = check_rank(gen, rank, "loadgen rank %d" % rank)
            print("loadgen run %d rank %d: %d windows, the same tables" % (gen, rank, n))
        for t in TRACES:
            rid = import_trace(cd, os.path.join(PEERS, t))
            n = check_rank(rid, 0, t)
            print("%s: %d windows, the same tables" % (os.path.basename(t), n))

        # one op over all of rank 0's host time: no quiet point, read whole
        kpfix.psql("INSERT INTO ops (run_id, rank, start_ns, dur_ns, tid, name, kind) SELECT "
                   "run_id, rank, min(start_ns) - 1, max(start_ns + dur_ns) - min(start_ns) + 2, "
                   "min(tid), (SELECT id FROM names WHERE name = 'aten::mm'), 1 FROM ops WHERE "
                   "run_id = %d AND rank = 0 GROUP BY run_id, rank" % gen, db=DB)
        check_rank(gen, 0, "loadgen rank 0 with an op over it all", cut=False)
        print("a rank with an op over all of it: read whole, the same tables")

        # the service: windows keep the operator and kernel views inside a budget a whole read
        # of the rank would pass (bytes_per_event 150 for ops and kernels; breakdown's 168)
        events = int(kpfix.psql("SELECT records FROM ranks WHERE run_id = %d AND rank = 1" % gen,
                                db=DB))
        budget = events * 100
        assert 2 * WINDOW * 150 < budget < events * 150, (events, budget)
        an = tas.Analyzer("analyzer_windows_an", kpfix.conninfo(DB),
                          ["--window-events", str(WINDOW), "--memory-budget", str(budget),
                           "--cache-bytes", "0"])
        for view in VIEWS:
            got = tas.ctl(an, *(list(view) + ["--run", str(gen), "--rank", "1"]))
            same(offline(gen, 1, 0, view)[0], got, ("service", view))
        rc, _, err = tas.ctl_status(an.grpc, "breakdown", "--run", str(gen), "--rank", "1")
        assert rc == 1 and "--memory-budget" in err, (rc, err)
        assert "rank read by windows method=Ops run=%d rank=1" % gen in an.log_text()
        print("kprof-analyzer --window-events %d --memory-budget %d B: ops and kernels of run %d "
              "rank 1 (%d events) answered by windows, breakdown refused" % (WINDOW, budget, gen,
                                                                             events))
    finally:
        if an is not None:
            an.stop()
        cd.stop()
    kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
    print("ok")


if __name__ == "__main__":
    main()
