"""The operator, kernel, memory, breakdown, roofline and prof views read a rank by windows
(analyzer/an_window.c, an_bdwin.c, an_memory.c; PyProf's windows for roofline and prof;
--window-events), with the real kprof-collectord, kprof-analyze, kprof-analyzer, kprofctl and
PostgreSQL:
  1. On kprof-loadgen's ranks (ProfilerStep ops and recorded steps, with python functions added
     over all of rank 0 and over its middle third; then recorded steps only, which the
     breakdown's windows cut through and PyProf's do not) and on real traces imported (HTA's
     sampled rank 0, whose microsecond timestamps give ops of the same thread, start and
     duration; the plugin's resnet50 span, with backward ops and memory events; HTA's
     nanosecond rank, with NCCL kernels), kprofctl ops (by name, by shapes), kernels (by name,
     by op), memory, breakdown (kprof's figure and the plugin's, with the recommendations and
     the GPUs' figures), roofline (by kernel, by op) and prof (all 20 columns: the python
     functions' trace column included) read by windows of 20 host events (the log says how
     many windows: two or more; and of 600, more than a step, cut where steps start) answer
     what the rank read whole answers: every field equal, the kernels' duration-weighted means
     and the GPUs' SM efficiency and occupancy to 1e-12 (their double sums are added in another
     order).
  2. A rank that cannot be cut (an op spanning all of it, added here) is read whole, and
     answers the same; so are the breakdown, roofline and prof of a rank without steps (the one
     step over every CPU op spans it; PyProf's windows have no steps to cut between), while its
     operator table is still read by windows.
  3. kprof-analyzer --window-events 20 with a --memory-budget below what a whole read of the
     rank is estimated to take: the operator, kernel, memory, breakdown and roofline views
     answer (two windows' estimate fits), and so does kprofctl prof, whose rows stream in pages
     (Analyzer.ProfRows), in text, CSV and JSON, byte for byte kprof-analyze's whole table;
     the unary Prof, whose one reply holds every kernel, is refused naming the budget and
     ProfRows; so are the operator and roofline views and ProfRows of the rank that cannot be
     cut, which the estimate for windows admitted but which would read it whole.
  4. ProfRows through a plain gRPC client (grpcio) on a rank of 41 k kernels: pages of a
     window's rows, at most 4096 each, the last one marked with the count of rows and windows,
     the rows those of Prof; a client that goes away after the first page stops the table there
     (logged) and the next call is answered; a bad rank, an unknown run and a call that sends
     no request are refused with INVALID_ARGUMENT, NOT_FOUND and INVALID_ARGUMENT.
  5. --window-events that is not a count is refused (exit 2) by kprof-analyze and
     kprof-analyzer."""
import json
import os
import subprocess

import kpfix

kpfix.require_env()
import grpc  # noqa: E402
import kprof_pb2 as pb  # noqa: E402
import test_analyzer_service as tas  # noqa: E402

DB = "kp_it_analyzer_windows"
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "peers")
TRACES = ("hta/trace_filter_2rank/sampled_rank-0.json.gz",
          "tbplugin/resnet50/traces/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
          "hta/ns_resolution_rank0/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
TABLES = (("ops", "--group-by", "name"), ("ops", "--group-by", "shapes"),
          ("kernels", "--group-by", "name"), ("kernels", "--group-by", "op"), ("memory",))
BREAKDOWN = (("breakdown",), ("breakdown", "--plugin-compat"))
PROF = ("prof", "-c", "idx,seq,altseq,tid,layer,trace,dir,sub,mod,op,kernel,params,sil,tc,"
        "device,stream,grid,block,flops,bytes")
ROOFLINE = (("roofline", "--by", "kernel"), ("roofline", "--by", "op"), PROF)  # PyProf's windows
VIEWS = TABLES + BREAKDOWN + ROOFLINE
MODULE = "train.py(10): <module>"  # a python function over all of a rank


def add_python_functions(run_id, rank):
    """Python functions on the rank's busiest thread: one over all of it (a script's top frame),
    one over its middle third; both cross cuts, so every PyProf window must read them."""
    kpfix.psql("INSERT INTO names (name) VALUES ('%s'), ('train.py(42): step') ON CONFLICT DO "
               "NOTHING" % MODULE, db=DB)
    tid = ("(SELECT tid FROM ops WHERE run_id = %d AND rank = %d AND kind = 1 GROUP BY tid "
           "ORDER BY count(*) DESC LIMIT 1)" % (run_id, rank))
    for start, dur, name in (("min(start_ns) - 1", "max(start_ns + dur_ns) - min(start_ns) + 2",
                              MODULE),
                             ("min(start_ns) + (max(start_ns) - min(start_ns)) / 3",
                              "(max(start_ns) - min(start_ns)) / 3", "train.py(42): step")):
        kpfix.psql("INSERT INTO ops (run_id, rank, start_ns, dur_ns, tid, name, kind) SELECT "
                   "run_id, rank, %s, %s, %s, (SELECT id FROM names WHERE name = '%s'), 4 FROM "
                   "ops WHERE run_id = %d AND rank = %d GROUP BY run_id, rank" % (
                       start, dur, tid, name, run_id, rank), db=DB)
# the breakdown's figures made of double sums
GPU_SUMS = ("est_sm_efficiency_pct", "est_achieved_occupancy_pct")
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


def close(a, b):
    return abs(a - b) <= 1e-12 * max(abs(a), abs(b), 1.0)


def same(whole, win, where):
    if isinstance(whole, dict):  # the breakdown
        assert set(whole) == set(win), (where, whole, win)
        for k in whole:
            if k == "gpus":
                assert len(whole[k]) == len(win[k]), (where, whole[k], win[k])
                for a, b in zip(whole[k], win[k]):
                    assert set(a) == set(b), (where, a, b)
                    for f in a:
                        ok = (close(a[f], b[f]) if f in GPU_SUMS and a[f] is not None and
                              b[f] is not None else a[f] == b[f])
                        assert ok, (where, f, a, b)
            else:
                assert whole[k] == win[k], (where, k, whole[k], win[k])
        return
    assert len(whole) == len(win), (where, len(whole), len(win))
    for a, b in zip(whole, win):
        assert set(a) == set(b), (where, a, b)
        for k in a:
            if k in tas.OCC:
                assert close(a[k], b[k]), (where, k, a, b)
            else:
                assert a[k] == b[k], (where, k, a, b)


def check_rank(run_id, rank, what, cut=True, views=VIEWS, window=WINDOW):
    for view in views:
        whole, w0 = offline(run_id, rank, 0, view)
        win, w = offline(run_id, rank, window, view)
        assert w0 == [], w0
        if cut:
            assert len(w) == 1 and w[0] >= 2, (what, view, w)
        else:
            assert w == [], (what, view, w)
        assert whole or view[0] == "memory", (what, view, "no rows")
        if view[0] == "breakdown":
            assert whole["steps"] and whole["gpus"], (what, view, whole)
        if view[0] in ("roofline", "prof"):
            assert whole["rows"], (what, view, whole)
        same(whole, win, (what, view))
    return w[0] if cut else 1


def import_trace(cd, path):
    out = tas.run([tas.KPROFCTL, "import", "--collector", cd.grpc, "--job", "windows", "--json",
                   "--rank", "0", "--progress", "off", path], "kprofctl import " + path)
    return json.loads(out)["run_id"]


def prof_rows(ch, run_id, rank, first_only=False):
    """Analyzer.ProfRows through grpcio: the pages (the first one only: then cancelled)."""
    it = ch.unary_stream("/kprof.v1.Analyzer/ProfRows",
                         request_serializer=pb.ProfRequest.SerializeToString,
                         response_deserializer=pb.ProfPage.FromString)(
        pb.ProfRequest(run_id=run_id, rank=rank), timeout=120 * kpfix.SCALE)
    if first_only:
        page = next(it)
        it.cancel()
        return [page]
    return list(it)


def status_of(fn):
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def check_prof_rows(cd):
    """ProfRows as any gRPC client sees it: pages, their end, the client going away, bad input.
    The rank's 40 windows take the analyzer a second or two: a client gone after the first page
    is seen long before the last."""
    gen = json.loads(tas.run([LOADGEN, "--collector", cd.grpc, "--json", "--ranks", "1",
                              "--steps", "100", "--kernels-per-step", "400", "--job",
                              "windows-pages"], "kprof-loadgen"))["run_id"]
    an = tas.Analyzer("analyzer_windows_pages", kpfix.conninfo(DB),
                      ["--window-events", "5000", "--cache-bytes", "0"])
    try:  # Prof's one reply of 41 k rows is 6 MB, over grpcio's default 4 MiB a message
        with grpc.insecure_channel(an.grpc, options=[("grpc.max_receive_message_length",
                                                      64 << 20)]) as ch:
            pages = prof_rows(ch, gen, 0)
            whole = ch.unary_unary("/kprof.v1.Analyzer/Prof",
                                   request_serializer=pb.ProfRequest.SerializeToString,
                                   response_deserializer=pb.ProfResponse.FromString)(
                pb.ProfRequest(run_id=gen, rank=0), timeout=120 * kpfix.SCALE)
            rows = [r for p in pages for r in p.rows]
            assert len(whole.rows) > 2 * 4096, len(whole.rows)
            assert len(pages) >= 3 and all(0 < len(p.rows) <= 4096 for p in pages[:-1]), [
                len(p.rows) for p in pages]
            assert [p.last for p in pages] == [False] * (len(pages) - 1) + [True]
            assert pages[-1].total_rows == len(rows) == len(whole.rows), pages[-1]
            assert pages[-1].windows >= 2, pages[-1]
            assert all(p.run_id == gen and p.rank == 0 for p in pages)
            assert rows == list(whole.rows)
            assert [r.idx for r in rows] == list(range(1, len(rows) + 1))
            # a client that goes away after the first page: the table stops there
            first = prof_rows(ch, gen, 0, first_only=True)
            assert 0 < len(first[0].rows) <= 4096 and not first[0].last, first[0]
            kpfix.wait_for(lambda: "stream stopped method=ProfRows run=%d" % gen in
                           an.log_text(), 60, "the stopped stream's log line")
            assert prof_rows(ch, gen, 0)[-1].total_rows == len(rows)  # still serving
            # bad input
            code, det = status_of(lambda: prof_rows(ch, gen, -5))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, det)
            code, det = status_of(lambda: prof_rows(ch, 999999, 0))
            assert code == grpc.StatusCode.NOT_FOUND and "999999" in det, (code, det)
            code, det = status_of(lambda: list(ch.stream_stream(
                "/kprof.v1.Analyzer/ProfRows", request_serializer=pb.ProfRequest.SerializeToString,
                response_deserializer=pb.ProfPage.FromString)(iter([]), timeout=60)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "none was sent" in det, (code, det)
    finally:
        an.stop()
    print("ProfRows through grpcio: %d rows in %d pages (%d windows), the rows of Prof; a client "
          "gone after a page stops it; bad input refused" % (len(rows), len(pages),
                                                             pages[-1].windows))


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
        add_python_functions(gen, 0)
        win, _ = offline(gen, 0, WINDOW, PROF)
        assert {MODULE, "train.py(42): step"} <= {r["trace"] for r in win["rows"]}, "no spans"
        for rank in (0, 1):
            n = check_rank(gen, rank, "loadgen rank %d" % rank)
            print("loadgen run %d rank %d: %d windows, the same tables" % (gen, rank, n))
        # windows of more events than a step (about 220 here): cut where steps start, found
        # from one count per step rather than by sorting every host event
        n = check_rank(gen, 1, "loadgen rank 1, windows of steps", window=600)
        assert 2 <= n <= 6, n
        print("loadgen run %d rank 1: %d windows of whole steps, the same tables" % (gen, n))
        assert any(r["alloc_count"] for r in offline(gen, 0, 0, ("memory",))[0])
        for t in TRACES:
            rid = import_trace(cd, os.path.join(PEERS, t))
            if "resnet50" in t:  # the trace with memory events
                assert any(r["alloc_count"] for r in offline(rid, 0, 0, ("memory",))[0])
            n = check_rank(rid, 0, t)
            print("%s: %d windows, the same tables" % (os.path.basename(t), n))

        # one op over all of rank 0's host time: no quiet point, read whole
        kpfix.psql("INSERT INTO ops (run_id, rank, start_ns, dur_ns, tid, name, kind) SELECT "
                   "run_id, rank, min(start_ns) - 1, max(start_ns + dur_ns) - min(start_ns) + 2, "
                   "min(tid), (SELECT id FROM names WHERE name = 'aten::mm'), 1 FROM ops WHERE "
                   "run_id = %d AND rank = 0 GROUP BY run_id, rank" % gen, db=DB)
        check_rank(gen, 0, "loadgen rank 0 with an op over it all", cut=False)
        print("a rank with an op over all of it: read whole, the same tables")

        # a capture's steps: the recorded ones (kprof_step), which windows cut through, as no
        # ProfilerStep op keeps a cut out of them
        gen2 = json.loads(tas.run([LOADGEN, "--collector", cd.grpc, "--json", "--ranks", "1",
                                   "--steps", "6", "--kernels-per-step", "40", "--job",
                                   "windows-nosteps"], "kprof-loadgen"))["run_id"]
        kpfix.psql("DELETE FROM ops WHERE run_id = %d AND kind = 6" % gen2, db=DB)
        add_python_functions(gen2, 0)
        n = check_rank(gen2, 0, "recorded steps", views=BREAKDOWN)
        assert n > 6, n  # more windows than steps: steps cut
        m = check_rank(gen2, 0, "recorded steps", views=ROOFLINE)
        assert m <= 7, m  # PyProf's windows: between steps only
        print("recorded steps: %d windows, the same breakdown; %d, the same roofline" % (n, m))
        # no steps at all: the breakdown's one step spans the rank, and PyProf's windows have no
        # steps to cut between, so both read the rank whole; the operator table still by windows
        kpfix.psql("DELETE FROM steps WHERE run_id = %d" % gen2, db=DB)
        check_rank(gen2, 0, "a rank without steps", views=TABLES)
        check_rank(gen2, 0, "a rank without steps", cut=False, views=BREAKDOWN + ROOFLINE)
        print("a rank without steps: its breakdown and roofline read whole, its operator table "
              "by windows")

        # the service: windows keep the operator, kernel and breakdown views inside a budget a
        # whole read of the rank would pass (bytes_per_event 150 for ops and kernels, 168 for the
        # breakdown, 180 for prof)
        events = int(kpfix.psql("SELECT records FROM ranks WHERE run_id = %d AND rank = 1" % gen,
                                db=DB))
        budget = events * 100
        assert 2 * WINDOW * 170 < budget < events * 150, (events, budget)
        an = tas.Analyzer("analyzer_windows_an", kpfix.conninfo(DB),
                          ["--window-events", str(WINDOW), "--memory-budget", str(budget),
                           "--cache-bytes", "0"])
        for view in TABLES + BREAKDOWN + ROOFLINE[:2]:  # prof: estimated whole, refused below
            got = tas.ctl(an, *(list(view) + ["--run", str(gen), "--rank", "1"]))
            same(offline(gen, 1, 0, view)[0], got, ("service", view))
        # prof streams its rows (ProfRows), by windows: inside the budget, in every format
        for fmt in ((), ("--csv",), ("--json",)):
            args = list(PROF) + ["--run", str(gen), "--rank", "1"] + list(fmt)
            got = tas.run([tas.KPROFCTL, args[0], "--analyzer", an.grpc] + args[1:],
                          "kprofctl prof " + " ".join(fmt))
            want = tas.run([tas.ANALYZE, "--pg", kpfix.conninfo(DB), "--window-events", "0",
                            "kprofctl"] + args, "kprof-analyze kprofctl prof")
            assert got == want, (fmt, got[:400], want[:400])
        assert "rank read by windows method=ProfRows run=%d rank=1" % gen in an.log_text()
        # the unary Prof holds every row in one reply: estimated whole, refused, naming ProfRows
        with grpc.insecure_channel(an.grpc) as ch:
            try:
                ch.unary_unary("/kprof.v1.Analyzer/Prof",
                               request_serializer=pb.ProfRequest.SerializeToString,
                               response_deserializer=pb.ProfResponse.FromString)(
                    pb.ProfRequest(run_id=gen, rank=1), timeout=60)
                raise AssertionError("Prof answered over the budget")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
                assert "--memory-budget of %d KiB" % (budget >> 10) in e.details(), e.details()
                assert "ProfRows" in e.details(), e.details()
        # rank 0 cannot be cut (the op over all of it): held for two windows, it is not read
        # whole under that estimate but estimated again as a whole read, which the budget
        # refuses
        for verb, method in (("ops", "Ops"), ("roofline", "Roofline"), ("prof", "ProfRows")):
            rc, _, err = tas.ctl_status(an.grpc, verb, "--run", str(gen), "--rank", "0")
            assert rc == 1 and "--memory-budget" in err, (verb, rc, err)
            assert "rank cannot be read by windows method=%s run=%d rank=0" % (
                method, gen) in an.log_text(), verb
            if verb == "prof":  # the stream's refusal names it
                assert "ProfRows of run %d rank 0" % gen in err, err
        for method in ("Ops", "Kernels", "Memory", "Breakdown", "Roofline"):
            assert "rank read by windows method=%s run=%d rank=1" % (method, gen) in \
                an.log_text(), method
        print("kprof-analyzer --window-events %d --memory-budget %d B: ops, kernels, breakdown, "
              "roofline and prof (streamed) of run %d rank 1 (%d events) answered by windows, "
              "the unary Prof refused" % (WINDOW, budget, gen, events))
        an.stop()
        an = None
        check_prof_rows(cd)
    finally:
        if an is not None:
            an.stop()
        cd.stop()
    kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
    print("ok")


if __name__ == "__main__":
    main()
