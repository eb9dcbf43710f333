#!/usr/bin/env python3
"""it.test_control: `kprofctl start / status / stop / jobs` across several nodes, end to end.

Three kprof-agents play three nodes (separate processes, each with its own socket, spool and
--host), all attached to one real kprof-collectord with PostgreSQL. Each job's six ranks run
as kprof-test-worker processes (the real libkprof_inject.so with the fake libcupti, launched
through agent/kprof-run), two per node. Everything is driven through the kprofctl binary, as
a user would.

  jobs        `kprofctl jobs` lists the six ranks on three hosts; unknown job (exit 3), a rank
              outside the world size (exit 2), an unreachable collector (exit 5)
  selected    `start --ranks 1,3-4 --steps 3`: `status --json` is polled throughout and never
              lies: a rank's state only moves forward, and once it says done, PostgreSQL
              already holds exactly that rank's rows. Then PostgreSQL holds exactly ranks
              1,3,4, steps start..start+2 on each, and GPU rows and op stacks equal to what
              each worker emitted in them
  rank_dies   `start --ranks all`: one rank's worker is SIGKILLed inside the window; `status
              --watch` ends with exit 1, that rank failed with its reason, the other five done
              with every step of the window stored
  stop        `start --steps 100000`; a second start is refused while it runs (exit 4); then
              `stop --run R`: every rank ends its window early,
              the run ends, each rank's stored steps are contiguous from the start step and
              its rows equal what the worker emitted in the whole steps; the rows at the
              edge where the stop landed are a subset of what the worker emitted there
  no_agent    the agent of node 2 is SIGKILLed: `jobs` shows four ranks, `start --ranks all`
              exits 6 naming ranks 4-5; `start --ranks 0-3` still works

Reuses test_capture.py's worker and database checks (its DIR and DB are pointed here).
Env as test_capture.py; KPROF_CONTROL_ONLY=a,b runs only the named scenarios.
"""
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback

import kpfix
import test_capture as tc

kpfix.require_env()

DIR = os.path.join(kpfix.TEST_DIR, "control-it")
DB = "kp_it_control"
tc.DIR = DIR
tc.DB = DB
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
AGENT = tc.AGENT
WORLD = 6
NODES = 3
ORDER = {"pending": 0, "capturing": 1, "flushing": 2, "done": 3, "failed": 3}

log = tc.log
secs = tc.secs


class Node:
    """One kprof-agent as a node: its own socket, spool and --host."""

    def __init__(self, i, collector):
        self.i = i
        self.host = "node%d" % i
        self.sock = os.path.join(DIR, "%s.sock" % self.host)
        self.spool = os.path.join(DIR, "%s.spool" % self.host)
        self.ready = os.path.join(DIR, "%s.ready" % self.host)
        self.log_path = os.path.join(DIR, "%s.log" % self.host)
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.proc = tc.spawn([AGENT, "--socket", self.sock, "--socket-mode", "0600",
                              "--collector", collector, "--spool-dir", self.spool,
                              "--ready-file", self.ready, "--host", self.host,
                              "--batch-ms", "30ms", "--log-level", "debug"], self.log_path)
        kpfix.wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30,
                       "kprof-agent %s ready" % self.host)
        assert self.proc.poll() is None, "agent %s exited:\n%s" % (self.host,
                                                                   tc.read(self.log_path))

    def stop(self):
        tc.stop_proc(self.proc)
        tc.assert_no_sanitizer("agent " + self.log_path, tc.read(self.log_path))


class Ctl:
    """The kprofctl binary against the test's collectord."""

    def __init__(self, addr):
        self.addr = addr

    def run(self, *args, timeout=60, collector=None):
        cmd = [KPROFCTL] + list(args) + ["--collector", collector or self.addr]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=secs(timeout))
        tc.assert_no_sanitizer("`%s` stderr" % " ".join(cmd), p.stderr)
        return p.returncode, p.stdout, p.stderr

    def ok(self, *args, **kw):
        rc, out, err = self.run(*args, **kw)
        assert rc == 0, "`kprofctl %s` exited %d: %s %s" % (" ".join(args), rc, out, err)
        return out

    def json(self, *args, **kw):
        return json.loads(self.ok(*args, "--json", **kw))

    def status(self, run):
        return {r["rank"]: r for r in self.json("status", "--run", str(run))}

    def jobs(self, job):
        return [r for r in self.json("jobs") if r["job"] == job]

    def start(self, job, *args):
        rc, out, err = self.run("start", "--job", job, *args)
        assert rc == 0, "`kprofctl start --job %s %s` exited %d: %s" % (job, " ".join(args), rc,
                                                                       err)
        run = int(out.strip())
        log("  %s" % err.strip().splitlines()[-1] if err.strip() else "  run %d" % run)
        return run


class Stack:
    def __init__(self):
        self.conninfo = kpfix.fresh_db(DB)
        self.coll = kpfix.Collectord(os.path.join("control-it", "coll"), self.conninfo,
                                     ["--agent-grace", "3s", "--log-level", "debug"])
        tc.PROCS.append(self.coll.proc)
        self.nodes = [Node(i, self.coll.grpc) for i in range(NODES)]
        self.ctl = Ctl(self.coll.grpc)

    def node_of(self, rank):
        return self.nodes[rank * NODES // WORLD]

    def workers(self, tag, job, flags, ranks=range(WORLD)):
        return [tc.Worker(tag, job, self.node_of(r).sock, r, WORLD, flags) for r in ranks]

    def stop(self):
        for n in self.nodes:
            n.stop()
        self.coll.stop()
        self.coll.assert_clean_log()

    def dump_logs(self):
        for n in self.nodes:
            sys.stderr.write("--- %s ---\n%s\n" % (n.log_path, tc.read(n.log_path, 8000)))
        sys.stderr.write("--- collectord ---\n%s\n" % tc.read(self.coll.log_path, 8000))


def flags(captures=1, step_ms=20, timeout_s=180):
    return ["--step-ms", str(step_ms), "--until-captures", str(captures), "--max-steps",
            "1000000", "--timeout-s", str(int(secs(timeout_s)))]


def wait_jobs(st, job, n, moving=True):
    """Until `kprofctl jobs` lists n ranks of job, each on its node, with steps moving."""
    first = kpfix.wait_for(
        lambda: (lambda r: r if len(r) == n and all(x["step"] is not None for x in r) else None)(
            st.ctl.jobs(job)), 30, "%d ranks of %s stepping in kprofctl jobs" % (n, job))
    if moving:
        base = {r["rank"]: r["step"] for r in first}
        kpfix.wait_for(lambda: all(r["step"] is not None and r["step"] > base[r["rank"]]
                                   for r in st.ctl.jobs(job)), 30, "steps moving in jobs")
    return {r["rank"]: r for r in st.ctl.jobs(job)}


def pg_rows_of(run, rank):
    return int(tc.one("SELECT (SELECT count(*) FROM kernels WHERE run_id = %d AND rank = %d) + "
                      "(SELECT count(*) FROM steps WHERE run_id = %d AND rank = %d)"
                      % (run, rank, run, rank)))


def follow(st, run, workers, on_poll=None, timeout=120):
    """Polls `kprofctl status --run R --json` until every rank is done or failed. Checks that
    states only move forward, that a rank with rows in PostgreSQL is never shown pending, and
    that once a rank is shown done PostgreSQL already holds exactly the steps status names
    for it, with their kernels. Returns the last status and each rank's sequence of states."""
    seen = collections.defaultdict(list)
    checked = set()
    by_rank = {w.rank: w for w in workers}
    deadline = time.monotonic() + secs(timeout)
    while True:
        stored_before = {r: pg_rows_of(run, r) for r in by_rank}
        stat = st.ctl.status(run)
        assert set(stat) == set(by_rank), "status ranks %s, want %s" % (sorted(stat),
                                                                        sorted(by_rank))
        for r, row in stat.items():
            s = row["state"]
            if not seen[r] or seen[r][-1] != s:
                seen[r].append(s)
            assert ORDER[s] >= ORDER[seen[r][-2]] if len(seen[r]) > 1 else True, (
                "rank %d went back from %s to %s" % (r, seen[r][-2], s))
            if stored_before[r] > 0:
                assert s != "pending", "rank %d has rows in PostgreSQL but status says " \
                    "pending" % r
            if s == "done" and r not in checked:
                # done means every row of the rank is committed: its steps are all there now
                stored = [int(x) for (x,) in tc.rows(
                    "SELECT step FROM steps WHERE run_id = %d AND rank = %d ORDER BY 1"
                    % (run, r))]
                assert row["steps"] and stored == list(steps_range(row)), (
                    "status said rank %d done with steps %s, but PostgreSQL holds steps %s"
                    % (r, row["steps"], stored))
                assert pg_rows_of(run, r) > len(stored), "rank %d done without kernels" % r
                checked.add(r)
        if on_poll is not None:
            on_poll(stat)
        if all(row["state"] in ("done", "failed") and row["run_state"] != "open"
               for row in stat.values()):
            return stat, seen
        assert time.monotonic() < deadline, "capture %d not over in %ds: %s" % (
            run, secs(timeout), {r: (x["state"], x["reason"]) for r, x in stat.items()})
        time.sleep(0.05)


def steps_range(row):
    first, last = (int(x) for x in row["steps"].split("-"))
    return range(first, last + 1)


def wait_expect(workers):
    """The workers exit after their capture (--until-captures): then --expect is complete."""
    for w in workers:
        w.assert_exit0()


# ---- scenarios ----

def test_jobs(st):
    """jobs across three nodes; error exits"""
    job = "ctl-jobs"
    workers = st.workers("jobs", job, flags(captures=1))
    try:
        jobs = wait_jobs(st, job, WORLD)
        got = {r: (row["host"], row["pid"], row["world_size"]) for r, row in jobs.items()}
        want = {w.rank: (st.node_of(w.rank).host, w.pid, WORLD) for w in workers}
        assert got == want, "kprofctl jobs: got %s, want %s" % (got, want)
        rc, out, err = st.ctl.run("start", "--job", "no-such-job")
        assert rc == 3 and "no-such-job" in err and not out.strip(), (rc, out, err)
        rc, out, err = st.ctl.run("start", "--job", job, "--ranks", "9")
        assert rc == 2 and "world size 6" in err, (rc, out, err)
        rc, out, err = st.ctl.run("jobs", collector="127.0.0.1:1", timeout=60)
        assert rc == 5 and "collectord" in err, (rc, out, err)
        text = st.ctl.ok("jobs")
        assert text.splitlines()[0].split()[:3] == ["JOB", "WORLD_SIZE", "RANK"], text
        assert tc.one("SELECT count(*) FROM runs") == "0", "a refused start left a run"
    finally:
        tc.stop_workers(workers)


def test_selected(st):
    """--ranks 1,3-4 --steps 3: status told the truth throughout; exactly those rows stored"""
    job, sel = "ctl-sel", [1, 3, 4]
    workers = st.workers("sel", job, flags(captures=1))
    chosen = [w for w in workers if w.rank in sel]
    try:
        wait_jobs(st, job, WORLD)
        run = st.ctl.start(job, "--ranks", "1,3-4", "--steps", "3", "--name", "selected")
        # a rank is done only once its window is over and every row is committed: the
        # worker may still be stepping, so its --expect file is read after it exits; here
        # the live check is on the rows of the steps status names
        stat, seen = follow(st, run, chosen)
        for r, row in stat.items():
            assert row["state"] == "done" and row["run_state"] == "ended", row
        for r in sel:
            # (the first poll may already find a rank done: the window is 3 short steps)
            assert seen[r][-1] == "done", seen
        first = steps_range(stat[1])[0]
        for r in sel:
            assert steps_range(stat[r]) == range(first, first + 3), stat[r]
        wait_expect(chosen)
        tc.check_run_ended(run, job, WORLD)
        tc.check_steps(run, sel, first, 3)
        tc.check_capture_data(run, chosen, range(first, first + 3))
        got = {int(r[0]) for r in tc.rows("SELECT rank FROM ranks WHERE run_id = %d" % run)}
        assert got == set(sel), "ranks rows %s, want %s" % (got, sel)
        assert tc.rows("SELECT rank, state FROM capture_ranks WHERE run_id = %d ORDER BY rank"
                       % run) == [(str(r), "4") for r in sel]
        listed = [r for r in st.ctl.json("status") if r["run"] == run]
        assert sorted(r["rank"] for r in listed) == sel, listed
        log("  run %d: ranks %s, steps %d..%d, states seen %s" % (
            run, sel, first, first + 2, dict(seen)))
    finally:
        tc.stop_workers(workers)


def test_rank_dies(st):
    """a rank SIGKILLed mid-window fails with its reason; the others finish"""
    job, victim = "ctl-die", 5
    workers = st.workers("die", job, flags(captures=1))
    try:
        wait_jobs(st, job, WORLD)
        run = st.ctl.start(job, "--ranks", "all", "--steps", "150")
        watch = subprocess.Popen([KPROFCTL, "status", "--run", str(run), "--watch", "--interval",
                                  "200ms", "--collector", st.coll.grpc], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        tc.PROCS.append(watch)
        kpfix.wait_for(lambda: st.ctl.status(run)[victim]["state"] == "capturing", 60,
                       "rank %d capturing" % victim)
        workers[victim].proc.kill()
        workers[victim].proc.wait()
        kpfix.wait_for(lambda: st.ctl.status(run)[victim]["state"] == "failed", 30,
                       "rank %d failed" % victim)
        mid = st.ctl.status(run)
        others = [r for r in range(WORLD) if r != victim]
        assert all(mid[r]["state"] in ("capturing", "flushing", "done") for r in others), mid
        out, err = watch.communicate(timeout=secs(120))
        assert watch.returncode == 1, "status --watch exited %d, want 1 (a rank failed): %s" % (
            watch.returncode, err)
        # --watch ends when every rank is over; the coordinator ends the run on its next tick
        kpfix.wait_for(lambda: all(row["run_state"] != "open"
                                   for row in st.ctl.status(run).values()), 30, "run ended")
        stat = st.ctl.status(run)
        reason = stat[victim]["reason"]
        assert "exited" in reason or "closed" in reason, stat[victim]
        assert str(workers[victim].pid) in reason, stat[victim]
        for r in others:
            assert stat[r]["state"] == "done", stat[r]
            assert stat[r]["run_state"] == "failed", stat[r]
        first = steps_range(stat[0])[0]
        wait_expect([w for w in workers if w.rank != victim])
        got = collections.defaultdict(list)
        for rank, step in tc.rows("SELECT rank, step FROM steps WHERE run_id = %d ORDER BY 1, 2"
                                  % run):
            got[int(rank)].append(int(step))
        for r in others:
            assert got[r] == list(range(first, first + 150)), (r, got[r][:3], len(got[r]))
        assert tc.one("SELECT state FROM runs WHERE id = %d" % run) == "3"
        assert "failed" in out, out
        log("  run %d: rank %d failed (%s); %d others done" % (run, victim, reason[:80],
                                                                len(others)))
    finally:
        tc.stop_workers(workers)


def test_stop(st):
    """stop --run R ends every window early; the rows of the steps taken are stored"""
    job = "ctl-stop"
    workers = st.workers("stop", job, flags(captures=1))
    try:
        wait_jobs(st, job, WORLD)
        run = st.ctl.start(job, "--steps", "100000")
        kpfix.wait_for(lambda: all(r["state"] == "capturing"
                                   for r in st.ctl.status(run).values()), 60, "all capturing")
        # the window is 100000 steps: the run is certainly still open here
        rc, out, err = st.ctl.run("start", "--job", job)
        assert rc == 4 and "already capturing" in err and not out.strip(), (rc, out, err)
        time.sleep(0.3)
        st.ctl.ok("stop", "--run", str(run))
        stat, seen = follow(st, run, workers)
        first = None
        wait_expect(workers)
        for r, row in stat.items():
            assert row["state"] == "done" and row["run_state"] == "ended", row
            steps = steps_range(row)
            first = steps[0] if first is None else first
            assert steps[0] == first and len(steps) < 100000, row
            stored = [int(s) for (s,) in tc.rows("SELECT step FROM steps WHERE run_id = %d AND "
                                                 "rank = %d ORDER BY 1" % (run, r))]
            assert stored == list(steps), (r, stored[:3], len(stored), row["steps"])
            # The STOP lands inside a step: the windows ends there. The steps before it are
            # whole and must match exactly; the rows of the edge (the last stored step and the
            # one after) are whatever was recorded before recording stopped, so they must be
            # a subset of what the worker emitted there. (The worker's own "recorded" flag
            # races with the stop at that edge, so it is not used for the edge.)
            whole, edge = list(steps)[:-1], (steps[-1], steps[-1] + 1)
            got = tc.db_gpu(run, r)
            at_edge = collections.Counter({k: v for k, v in got.items() if k[1] in edge})
            tc.assert_same_records("run %d rank %d (stopped)" % (run, r), got - at_edge,
                                   tc.expect_gpu(workers[r], whole))
            emitted = collections.Counter(
                (e["kind"], e["step"], e["name"] if e["kind"] == "kernel" else "",
                 e["correlation"]) for e in workers[r].expect()
                if e["type"] == "gpu" and e["step"] in edge)
            assert not at_edge - emitted, (
                "rank %d: rows of the edge steps %s that the worker did not emit: %s" % (
                    r, edge, list((at_edge - emitted).elements())[:3]))
        assert tc.one("SELECT stopped FROM captures WHERE run_id = %d" % run) == "t"
        log("  run %d stopped: steps per rank %s" % (
            run, {r: row["steps"] for r, row in stat.items()}))
    finally:
        tc.stop_workers(workers)


def test_no_agent(st):
    """node 2's agent killed: start --ranks all exits 6 naming ranks 4-5"""
    job = "ctl-noagent"
    workers = st.workers("noagent", job, flags(captures=1))
    try:
        wait_jobs(st, job, WORLD)
        st.nodes[2].proc.kill()
        st.nodes[2].proc.wait()
        wait_jobs(st, job, 4, moving=False)
        rc, out, err = st.ctl.run("start", "--job", job, "--ranks", "all")
        assert rc == 6 and "rank(s) 4-5" in err, (rc, out, err)
        run = st.ctl.start(job, "--ranks", "0-3", "--steps", "2")
        stat, _ = follow(st, run, workers[:4])
        assert all(r["state"] == "done" for r in stat.values()), stat
    finally:
        tc.stop_workers(workers)
        st.nodes[2] = Node(2, st.coll.grpc)


SCENARIOS = [("jobs", test_jobs), ("selected", test_selected), ("rank_dies", test_rank_dies),
             ("stop", test_stop), ("no_agent", test_no_agent)]


def main():
    for path in (AGENT, tc.LIB, tc.WORKER, KPROFCTL):
        if not os.path.exists(path):
            print("missing %s: build the tree first" % path, file=sys.stderr)
            return 1
    shutil.rmtree(DIR, ignore_errors=True)
    os.makedirs(DIR)
    tc.USE_KPROF_RUN = tc.kprof_run_works()
    only = set(filter(None, os.environ.get("KPROF_CONTROL_ONLY", "").split(",")))
    failed, st, ok = [], None, False
    try:
        st = Stack()
        for name, fn in SCENARIOS:
            if only and name not in only:
                continue
            t0 = time.monotonic()
            log("--- %s: %s" % (name, fn.__doc__.strip().splitlines()[0]))
            try:
                fn(st)
                log("ok %s (%.1fs)" % (name, time.monotonic() - t0))
            except Exception:
                failed.append(name)
                log("FAIL %s (%.1fs)" % (name, time.monotonic() - t0))
                traceback.print_exc()
                sys.stdout.flush()
                st.dump_logs()
        st.stop()
        ok = not failed
    finally:
        for p in tc.PROCS:
            if p.poll() is None:
                p.kill()
                p.wait()
        if os.environ.get("KPROF_KEEP_TEST_DIR"):
            print("scratch files kept in %s" % DIR, file=sys.stderr)
        else:
            shutil.rmtree(DIR, ignore_errors=True)
        if ok and not os.environ.get("KPROF_KEEP_TEST_DIR"):
            kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
    n = len(SCENARIOS) if not only else len(only)
    print("%d passed, %d failed" % (n - len(failed), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
