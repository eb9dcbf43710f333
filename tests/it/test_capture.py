#!/usr/bin/env python3
"""it.test_capture: kprof's capture path end to end, without a GPU.

kprof-test-worker processes (each loads the real libkprof_inject.so the way the CUDA driver
does and plays the GPU with the fake libcupti; launched through agent/kprof-run) -> the real
kprof-agent -> the real kprof-collectord -> PostgreSQL; captures are started and followed with
the kprofctl binary (start, status, jobs) through collectord's coordinator. Every worker writes what it emitted to
its --expect file (tests/fakecupti/worker.c); the database must hold exactly the part of it
that falls in the captured steps.

  main           4 ranks, a 3-step capture: the run, steps, GPU rows one for one, each
                 kernel's op stack, ops rows, ranks rows, no drops
  no_agent       no agent listening: the worker runs all its steps unharmed, nothing enabled
  agent_killed   the agent SIGKILLed inside a 200-step window: the workers keep stepping, the
                 capture fails visibly (`kprofctl status`: contact lost), they re-register
                 with a restarted agent, a second capture succeeds
  collectord_down collectord SIGKILLed inside the window: the agent spools, collectord comes
                 back on the same port, every row is stored exactly once, and the agent's
                 capture completes only once they are acknowledged
  fork           a worker forks inside the window: the capture succeeds, the child exits 0,
                 nothing from the child reaches the database
  many           64 ranks on one agent: all register, a 2-step capture has steps and kernels
                 for every rank
  kafka          2 ranks through collectord --sink kafka, the mock cluster and a sink
                 consumer: `kprofctl start --wait` returns once every row is in PostgreSQL
                 (the coordinator holds a rank FLUSHING until its batches are stored)

Env (tests/CMakeLists.txt): KPROF_TEST_PG, KPROF_TEST_DIR, KPROF_BIN_DIR, KPROF_SOURCE_DIR,
KPROF_PROTO_PY. KPROF_TEST_TIMEOUT_MULTIPLIER scales every wait; KPROF_CAPTURE_ONLY=a,b runs
only the named scenarios. Every process started here is stopped by pid; the scratch directory
is removed at the end.
"""
import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

import kpfix

kpfix.require_env()

SCALE = kpfix.SCALE
BIN = kpfix.BIN
SRC = os.environ.get("KPROF_SOURCE_DIR") or os.path.realpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
AGENT = os.path.join(BIN, "agent", "kprof-agent")
KPROFCTL = os.path.join(BIN, "kprofctl", "kprofctl")
LIB = os.path.join(BIN, "agent", "inject", "libkprof_inject.so")
WORKER = os.path.join(BIN, "tests", "fakecupti", "kprof-test-worker")
KPROF_RUN = os.path.join(SRC, "agent", "kprof-run")
DIR = os.path.join(kpfix.TEST_DIR, "capture-it")
DB = "kp_it_capture"
GPU_KINDS = ("kernel", "memcpy", "memset", "sync")
SAN_MARKS = ("Sanitizer", "runtime error:")
# collectord forgets an agent (and fails its unfinished ranks) this long after it went away:
# short, so that a killed agent's processes leave `kprofctl jobs` before the restarted one's
# register
AGENT_GRACE = "1s"

PROCS = []  # every child process started here: stopped by pid in main()'s finally


def secs(s):
    return s * SCALE


def log(msg):
    print(msg, flush=True)


def spawn(cmd, out_path, err_path=None, env=None):
    out = open(out_path, "w")
    err = open(err_path, "w") if err_path else subprocess.STDOUT
    try:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, stdin=subprocess.DEVNULL)
    finally:
        out.close()
        if err_path:
            err.close()
    PROCS.append(p)
    return p


def stop_proc(p, sig=signal.SIGTERM, timeout=20):
    """Signals one child by pid and reaps it (SIGKILL if it does not go in time)."""
    if p.poll() is None:
        try:
            p.send_signal(sig)
            p.wait(timeout=secs(timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def read(path, tail=None):
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        return "(cannot read %s: %s)" % (path, e)
    return text[-tail:] if tail else text


def assert_no_sanitizer(what, text):
    for bad in SAN_MARKS:
        assert bad not in text, "sanitizer report (%r) in %s:\n%s" % (bad, what, text[-6000:])


# ---- the daemons ----

class Agent:
    """kprof-agent on DIR/agent.sock with its spool in DIR/spool; each start has its own log.
    Its captures are driven with kprofctl against the collectord it is attached to."""
    starts = 0

    def __init__(self, collector):
        Agent.starts += 1
        self.n = Agent.starts
        self.collector = collector
        self.sock = os.path.join(DIR, "agent.sock")
        self.spool = os.path.join(DIR, "spool")
        self.ready = os.path.join(DIR, "agent%d.ready" % self.n)
        self.log_path = os.path.join(DIR, "agent%d.log" % self.n)
        self.proc = spawn([AGENT, "--socket", self.sock, "--socket-mode", "0600", "--collector",
                           collector, "--spool-dir", self.spool, "--ready-file", self.ready,
                           "--batch-ms", "30ms", "--log-level", "debug"], self.log_path)
        kpfix.wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30,
                       "kprof-agent ready file " + self.ready)
        assert self.proc.poll() is None, "kprof-agent exited at start:\n" + self.text()

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc.poll() is None

    def text(self):
        return read(self.log_path)

    def kill(self):
        self.proc.kill()  # SIGKILL, by pid
        self.proc.wait(timeout=secs(20))

    def stop(self):
        rc = stop_proc(self.proc)
        assert_no_sanitizer("the kprof-agent log " + self.log_path, self.text())
        return rc

    def ctl(self, *args, wait=True, timeout=60):
        """`kprofctl VERB ARGS... --collector C`: (rc, stdout, stderr), or the Popen."""
        cmd = [KPROFCTL] + list(args) + ["--collector", self.collector]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if not wait:
            PROCS.append(p)
            return p
        try:
            out, err = p.communicate(timeout=secs(timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError("`%s` did not answer in %ds; stdout %r stderr %r"
                                 % (" ".join(cmd), secs(timeout), out, err))
        assert_no_sanitizer("`%s` stderr" % " ".join(cmd), err)
        return p.returncode, out, err

    def ps(self, job=None):
        """The processes collectord lists (`kprofctl jobs`; of job; step -1 before the first),
        or None when it does not answer."""
        rc, out, err = self.ctl("jobs", "--json", timeout=20)
        if rc != 0:
            return None
        procs = json.loads(out)
        for p in procs:
            if p["step"] is None:
                p["step"] = -1  # no step reported yet
        return [p for p in procs if job is None or p["job"] == job]

    def status(self, run):
        """The run's ranks by rank (`kprofctl status --json`)."""
        rc, out, err = self.ctl("status", "--run", str(run), "--json", timeout=20)
        assert rc == 0, "`kprofctl status --run %d` exited %d: %s" % (run, rc, err)
        return {r["rank"]: r for r in json.loads(out)}

    def capture(self, job, *args, timeout=120):
        """`kprofctl start --job J ARGS --json`: the capture object; fails the test unless it
        started (with --wait: unless every rank is done)."""
        rc, out, err = self.ctl("start", "--job", job, *args, "--json", timeout=timeout)
        assert rc == 0 and out.strip(), (
            "`kprofctl start --job %s %s` exited %d, want 0; stdout %s; stderr %s" % (
                job, " ".join(args), rc, out.strip(), err.strip()))
        return json.loads(out)


class Stack:
    """collectord (fixed port, so it can come back on it) and the agent, restartable."""

    def __init__(self):
        self.conninfo = kpfix.fresh_db(DB)
        self.port = kpfix.free_port()
        self.coll = None
        self.colls = []
        self.agent = None
        self.agents = []

    def start_collectord(self):
        name = os.path.join("capture-it", "coll%d" % (len(self.colls) + 1))
        self.coll = kpfix.Collectord(name, self.conninfo,
                                     ["--listen", "127.0.0.1:%d" % self.port,
                                      "--agent-grace", AGENT_GRACE])
        PROCS.append(self.coll.proc)
        self.colls.append(self.coll)
        return self.coll

    def start_agent(self):
        self.agent = Agent("127.0.0.1:%d" % self.port)
        self.agents.append(self.agent)
        return self.agent

    def ensure(self):
        """Both daemons up (a failed scenario may have left one down)."""
        if self.coll is None or self.coll.proc.poll() is not None:
            restart = self.coll is not None
            self.start_collectord()
            if restart and self.agent is not None and self.agent.alive():
                # A scenario failed with collectord down: the agent's gRPC channel retries
                # the connection at most every 2 s (kp_rpc.c); until it has reattached,
                # collectord knows none of its processes.
                time.sleep(2.5)
        if self.agent is None or not self.agent.alive():
            self.start_agent()

    def stop(self):
        for a in self.agents:
            a.stop()
        for c in self.colls:
            c.stop()
            c.assert_clean_log()

    def dump_logs(self):
        for a in self.agents:
            sys.stderr.write("--- %s ---\n%s\n" % (a.log_path, read(a.log_path, 12000)))
        for c in self.colls:
            sys.stderr.write("--- %s ---\n%s\n" % (c.log_path, read(c.log_path, 4000)))


# ---- workers ----

def worker_env(job, sock, rank, world):
    env = dict(os.environ)
    for k in ("CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH", "KPROF_CUPTI_PATH", "KPROF_JOB",
              "KPROF_AGENT_SOCKET", "KPROF_INJECT_LIB", "KPROF_STEP_RANGE", "KPROF_HOOK_LIB",
              "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        env.pop(k, None)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               KPROF_LOG="info")  # the library says on stderr when a capture fails
    if not USE_KPROF_RUN:  # what kprof-run would set
        env.update(CUDA_INJECTION64_PATH=LIB, NVTX_INJECTION64_PATH=LIB, KPROF_JOB=job,
                   KPROF_AGENT_SOCKET=sock)
    return env


def kprof_run_works():
    """kprof-run exists and sets the variables this test relies on."""
    if not os.access(KPROF_RUN, os.X_OK):
        return False
    out = subprocess.run([KPROF_RUN, "--job", "probe", "--socket", "/nonexistent.sock", "--lib",
                          LIB, "--print-env"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and all(
        k in out.stdout for k in ("CUDA_INJECTION64_PATH=", "NVTX_INJECTION64_PATH=",
                                  "KPROF_JOB='probe'", "KPROF_AGENT_SOCKET="))


USE_KPROF_RUN = False  # set in main()


class Worker:
    """One kprof-test-worker rank (through kprof-run: exec, so the pid is the worker's)."""

    def __init__(self, tag, job, sock, rank, world, flags, expect=True):
        self.rank = rank
        self.tag = "%s.r%d" % (tag, rank)
        base = os.path.join(DIR, self.tag)
        self.out_path, self.err_path = base + ".out", base + ".err"
        self.expect_path = base + ".expect" if expect else None
        cmd = [WORKER, "--stats", "--seed", str(rank + 1)] + list(flags)
        if self.expect_path:
            cmd += ["--expect", self.expect_path]
        if USE_KPROF_RUN:
            cmd = [KPROF_RUN, "-q", "--job", job, "--socket", sock, "--lib", LIB, "--"] + cmd
        self.proc = spawn(cmd, self.out_path, self.err_path, worker_env(job, sock, rank, world))
        self._expect = None

    @property
    def pid(self):
        return self.proc.pid

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=secs(timeout))
        except subprocess.TimeoutExpired:
            raise AssertionError("worker %s (pid %d) did not exit within %ds; stderr:\n%s"
                                 % (self.tag, self.pid, secs(timeout), read(self.err_path, 3000)))

    def assert_exit0(self, timeout=60):
        rc = self.wait(timeout)
        assert rc == 0, "worker %s (pid %d) exited %d, want 0; stderr:\n%s" % (
            self.tag, self.pid, rc, read(self.err_path, 3000))
        assert_no_sanitizer("worker %s stderr" % self.tag, read(self.err_path))

    def stats(self):
        lines = [l for l in read(self.out_path).splitlines() if l.startswith("{")]
        assert len(lines) == 1, "worker %s: want one --stats line on stdout, got %r" % (
            self.tag, lines)
        return json.loads(lines[0])

    def expect(self):
        if self._expect is None:
            with open(self.expect_path) as f:
                self._expect = [json.loads(l) for l in f if l.strip()]
        return self._expect


def start_workers(tag, job, sock, world, flags, ranks=None, expect=True):
    return [Worker(tag, job, sock, r, world, flags, expect)
            for r in (range(world) if ranks is None else ranks)]


def stop_workers(workers):
    for w in workers:
        stop_proc(w.proc, signal.SIGKILL)


def wait_registered(agent, job, ranks, min_step=0, timeout=30):
    """Until `kprofctl jobs` lists every rank of ranks for job, each at step >= min_step."""
    want = set(ranks)
    last = [None]

    def ok():
        procs = agent.ps(job)
        last[0] = procs
        if procs is None:
            return False
        got = {p["rank"]: p for p in procs}
        return set(got) >= want and all(got[r]["step"] >= min_step for r in want)
    try:
        kpfix.wait_for(ok, timeout, "ranks registered")
    except AssertionError:
        raise AssertionError("`kprofctl jobs` did not list ranks %s of job %s at step >= %d "
                             "within %ds; last: %s" % (sorted(want), job, min_step,
                                                         secs(timeout), last[0]))
    return {p["rank"]: p for p in last[0]}


# ---- the database ----

def rows(sql):
    return kpfix.psql_rows(sql, db=DB)


def one(sql):
    r = rows(sql)
    return r[0][0] if r else None


def db_gpu(run, rank):
    """The GPU rows of (run, rank): Counter of (kind, step, name, correlation)."""
    got = rows("""
        SELECT 'kernel', k.step, n.name, k.correlation FROM kernels k
            LEFT JOIN names n ON n.id = k.name WHERE k.run_id = {r} AND k.rank = {k}
        UNION ALL SELECT 'memcpy', step, '', correlation FROM memcpys
            WHERE run_id = {r} AND rank = {k}
        UNION ALL SELECT 'memset', step, '', correlation FROM memsets
            WHERE run_id = {r} AND rank = {k}
        UNION ALL SELECT 'sync', step, '', correlation FROM syncs
            WHERE run_id = {r} AND rank = {k}""".format(r=run, k=rank))
    return collections.Counter((kind, int(step or -1), name, int(corr or 0))
                               for kind, step, name, corr in got)


def expect_gpu(worker, steps):
    """What the worker says it emitted during steps and the fake wrote into a CUPTI buffer."""
    return collections.Counter(
        (e["kind"], e["step"], e["name"] if e["kind"] == "kernel" else "", e["correlation"])
        for e in worker.expect() if e["type"] == "gpu" and e["recorded"] and e["step"] in steps)


def short(rec):
    kind, step, name, corr = rec
    return "%s step=%d corr=%d%s" % (kind, step, corr, " " + name[:40] if name else "")


def assert_same_records(what, got, want, limit=6):
    """got, want: Counters. Equal, or a message naming what is missing / extra (duplicates
    show as extra)."""
    if got == want:
        return
    missing, extra = want - got, got - want
    by_kind = lambda c: dict(collections.Counter(k[0] for k in c.elements()))
    raise AssertionError(
        "%s: PostgreSQL rows (kind, step, name, correlation) differ from the worker's --expect "
        "records with recorded=true in the captured steps: database %d %s, expected %d %s; "
        "missing from the database %d: %s; in the database but not expected once (extra or "
        "duplicate) %d: %s" % (
            what, sum(got.values()), by_kind(got), sum(want.values()), by_kind(want),
            sum(missing.values()), [short(r) for r in list(missing.elements())[:limit]],
            sum(extra.values()), [short(r) for r in list(extra.elements())[:limit]]))


def check_steps(run, ranks, first, n):
    """Each rank has exactly the steps first..first+n-1 in the steps table."""
    got = collections.defaultdict(list)
    for rank, step in rows("SELECT rank, step FROM steps WHERE run_id = %d ORDER BY rank, step"
                           % run):
        got[int(rank)].append(int(step))
    want = list(range(first, first + n))
    bad = {r: got.get(r, []) for r in ranks if got.get(r, []) != want}
    assert not bad, ("steps rows of run %d: want steps %s (consecutive, the same on every "
                     "rank) for ranks %s; got per rank %s" % (run, want, list(ranks), bad))
    assert set(got) <= set(ranks), "steps rows of run %d for unexpected ranks %s" % (
        run, sorted(set(got) - set(ranks)))


def check_run_ended(run, job, world):
    """The run is ended (collectord ends it once every rank is over: waited for)."""
    try:
        kpfix.wait_for(lambda: one("SELECT state FROM runs WHERE id = %d" % run) != "1", 30,
                       "run %d ended" % run)
    except AssertionError:
        pass  # the assertion below says what the row holds
    r = rows("SELECT job, state, world_size, ended_at IS NOT NULL FROM runs WHERE id = %d" % run)
    assert r, "run %d is not in the runs table" % run
    assert r[0] == (job, "2", str(world), "t"), (
        "runs row of run %d: got (job, state, world_size, ended) %r, want (%r, 2 = ended, %d, "
        "t)" % (run, r[0], job, world))


def parse_range(e):
    """(seq or -1, shapes text or '') from an NVTX message "name, seq = N, ..., sizes = [..]"."""
    m = re.search(r", seq = (-?\d+)", e["message"])
    s = e["message"].find(", sizes = ")
    return (int(m.group(1)) if m else -1,
            e["message"][s + len(", sizes = "):] if s >= 0 else "")


def db_ops(run, rank):
    out = {}
    for op_id, parent, tid, start, dur, seq, step, name, shapes in rows(
            "SELECT o.op_id, o.parent_id, o.tid, o.start_ns, o.dur_ns, o.seq, o.step, n.name, "
            "coalesce(s.name, '') FROM ops o LEFT JOIN names n ON n.id = o.name "
            "LEFT JOIN names s ON s.id = o.input_shapes WHERE o.run_id = %d AND o.rank = %d"
            % (run, rank)):
        out[int(op_id)] = dict(parent=int(parent or 0), tid=int(tid), start=int(start),
                               end=int(start) + int(dur), seq=int(seq) if seq else -1,
                               step=int(step), name=name, shapes=shapes)
    return out


def check_ops(run, worker, steps):
    """ops rows == the worker's ranges in steps: each range matches one row on its thread with
    the same name, lying inside the range's [start, end] as the worker timed it, with the
    same step, seq, input_shapes and parent; no other rows."""
    ops = db_ops(run, worker.rank)
    by_key = collections.defaultdict(list)
    for op_id, o in ops.items():
        by_key[(o["tid"], o["name"])].append(op_id)
    want = [e for e in worker.expect() if e["type"] == "range" and e["step"] in steps]
    used, problems = set(), []
    for e in want:
        cands = [i for i in by_key.get((e["tid"], e["name"]), [])
                 if e["start_ns"] <= ops[i]["start"] and ops[i]["end"] <= e["end_ns"]]
        if len(cands) != 1:
            problems.append("range %r (tid %d step %d) matches %d ops rows" % (
                e["message"][:60], e["tid"], e["step"], len(cands)))
            continue
        o = ops[cands[0]]
        used.add(cands[0])
        seq, shapes = parse_range(e)
        parent = ops.get(o["parent"], {}).get("name", "") if o["parent"] else ""
        want_parent = e["stack"][-1] if e["stack"] else ""
        got_t = (o["step"], o["seq"], o["shapes"], parent)
        want_t = (e["step"], seq, shapes, want_parent)
        if got_t != want_t:
            problems.append("range %r: ops row (step, seq, input_shapes, parent name) %r, want "
                            "%r" % (e["message"][:60], got_t, want_t))
    extra = [ops[i]["name"] for i in ops if i not in used]
    if extra:
        problems.append("%d ops rows not emitted by the worker in steps %s: %s" % (
            len(extra), list(steps), extra[:8]))
    assert not problems, "run %d rank %d: ops rows vs the worker's NVTX ranges (%d rows, %d " \
        "ranges): %s" % (run, worker.rank, len(ops), len(want), "; ".join(problems[:8]))
    return ops


def check_op_stacks(run, worker, ops, steps):
    """Every kernel/memcpy/memset row: its external_id names an ops row of the same run and
    rank whose name is the worker's innermost op, and the parent_id chain is the whole stack."""
    exp = {(e["kind"], e["correlation"]): e for e in worker.expect()
           if e["type"] == "gpu" and e["recorded"] and e["step"] in steps}
    problems, n = [], 0
    for kind, table in (("kernel", "kernels"), ("memcpy", "memcpys"), ("memset", "memsets")):
        for corr, ext in rows("SELECT correlation, coalesce(external_id, 0) FROM %s "
                              "WHERE run_id = %d AND rank = %d" % (table, run, worker.rank)):
            e = exp.get((kind, int(corr)))
            if e is None:
                continue  # reported by the one-for-one comparison
            n += 1
            chain, cur = [], int(ext)
            while cur and cur in ops and len(chain) < 64:
                chain.append(ops[cur]["name"])
                cur = ops[cur]["parent"]
            if cur:
                chain.append("<op %d not in ops>" % cur)
            chain.reverse()
            if chain != e["stack"] or (chain and chain[-1] != e["op"]):
                problems.append("%s corr=%d external_id=%s: op stack from ops.parent_id %s, want "
                                "%s" % (kind, int(corr), ext, chain, e["stack"]))
    assert not problems, "run %d rank %d: %d of %d GPU rows have the wrong op stack: %s" % (
        run, worker.rank, len(problems), n, "; ".join(problems[:6]))
    assert n > 0, "run %d rank %d: no GPU rows to check op stacks on" % (run, worker.rank)


def check_rank_rows(run, workers, job, drops=True):
    host = socket.gethostname()
    got = {int(r[0]): r[1:] for r in rows(
        "SELECT rank, job, host, pid, local_rank, records_dropped, cupti_dropped FROM ranks "
        "WHERE run_id = %d" % run)}
    want = {w.rank: (job, host, str(w.pid), str(w.rank), "0", "0") for w in workers}
    if not drops:
        got = {k: v[:4] for k, v in got.items()}
        want = {k: v[:4] for k, v in want.items()}
    assert got == want, ("ranks rows of run %d: got rank -> (job, host, pid, local_rank%s) %s, "
                         "want %s" % (run, ", records_dropped, cupti_dropped" if drops else "",
                                      got, want))


def check_capture_data(run, workers, steps, ops=True):
    for w in workers:
        assert_same_records("run %d rank %d" % (run, w.rank), db_gpu(run, w.rank),
                            expect_gpu(w, steps))
        if ops:
            o = check_ops(run, w, steps)
            check_op_stacks(run, w, o, steps)


def check_reply(res, ranks):
    """A `kprofctl start --wait --json` reply: every rank of ranks done, no other."""
    want = {r: "done" for r in ranks}
    got = {r["rank"]: r["state"] for r in res["ranks"]}
    assert got == want, "capture reply per rank: got %s, want %s (reply %s)" % (got, want, res)


def wait_stepping(agent, job, ranks, timeout=30):
    """Until every rank is registered and `kprofctl jobs` has shown its step move: the agent
    then reports a step rate for each, which collectord's coordinator extrapolates when it
    picks the start step. (Right after registration there is none, the coordinator assumes no
    progress, and a fast job may be past the start step before the ARM lands: the capture
    fails with "target step already passed".)"""
    first = wait_registered(agent, job, ranks, min_step=0, timeout=timeout)
    last = [first]

    def moved():
        procs = agent.ps(job) or []
        got = {p["rank"]: p["step"] for p in procs}
        last[0] = got
        return all(got.get(r, -1) > first[r]["step"] for r in ranks)
    try:
        kpfix.wait_for(moved, timeout, "steps moving")
    except AssertionError:
        raise AssertionError("job %s: `kprofctl jobs` showed no step progress on every rank "
                             "within %ds: first %s, last %s" % (
                                 job, secs(timeout), {r: first[r]["step"] for r in ranks},
                                 last[0]))


def wait_state(agent, run, ranks, states, timeout=30):
    """Until `kprofctl status` shows every rank of ranks of run in one of the capture states
    `states` (a name or a tuple of names); returns the status rows by rank."""
    last = {}
    states = (states,) if isinstance(states, str) else tuple(states)

    def ok():
        last.clear()
        last.update(agent.status(run))
        return set(last) >= set(ranks) and all(last[r]["state"] in states for r in ranks)
    try:
        kpfix.wait_for(ok, timeout, "status state in %s" % (states,))
    except AssertionError:
        raise AssertionError("run %d: `kprofctl status` did not show ranks %s in state %s "
                             "within %ds; last: %s" % (run, list(ranks), "|".join(states),
                                                       secs(timeout),
                                                       {r: p["state"] for r, p in last.items()}))
    return dict(last)


def step_rate(agent, job, ranks, span=1.0):
    """Slowest rank's steps per second, from two `kprofctl jobs` samples span seconds apart."""
    a = wait_registered(agent, job, ranks)
    t0 = time.monotonic()
    time.sleep(span)
    b = wait_registered(agent, job, ranks)
    dt = time.monotonic() - t0
    return min((b[r]["step"] - a[r]["step"]) / dt for r in ranks), b


def stepping_flags(timeout_s=180):
    return ["--until-captures", "1", "--max-steps", "1000000",
            "--timeout-s", str(int(secs(timeout_s)))]


# ---- the scenarios ----

def test_main(st):
    """4 ranks, one job, one agent; a 3-step capture with the default start step."""
    st.ensure()
    job, ranks = "capmain", range(4)
    workers = start_workers("main", job, st.agent.sock, 4, ["--step-ms", "20"] + stepping_flags())
    try:
        wait_stepping(st.agent, job, ranks)
        res = st.agent.capture(job, "--steps", "3", "--wait")
        run, first = res["run"], res["start_step"]
        check_reply(res, ranks)
        assert res["steps"] == 3 and first is not None and first >= 0, (
            "capture reply %s: want steps=3, a step window" % res)
        for w in workers:
            w.assert_exit0()
        steps = range(first, first + 3)
        check_run_ended(run, job, 4)
        check_steps(run, ranks, first, 3)
        check_capture_data(run, workers, steps)
        check_rank_rows(run, workers, job)
        for w in workers:
            s = w.stats()
            got = {k: s.get(k) for k in ("captures", "connected", "agent_connects",
                                         "records_dropped", "cupti_dropped", "ranges_dropped",
                                         "names_overflow")}
            want = dict(captures=1, connected=1, agent_connects=1, records_dropped=0,
                        cupti_dropped=0, ranges_dropped=0, names_overflow=0)
            assert got == want, "worker %s library stats: got %s, want %s" % (w.tag, got, want)
        n = one("SELECT count(*) FROM kernels WHERE run_id = %d" % run)
        log("  run %d steps %d..%d: %s kernels, all ranks equal to --expect" % (
            run, first, first + 2, n))
    finally:
        stop_workers(workers)


def test_no_agent(st):
    """KPROF_AGENT_SOCKET names no socket: the worker finishes every step, nothing enabled."""
    t0 = time.monotonic()
    w = Worker("noagent", "capnoagent", os.path.join(DIR, "no-agent.sock"), 0, 1,
               ["--steps", "30", "--step-ms", "2", "--timeout-s", str(int(secs(60)))],
               expect=False)
    try:
        w.assert_exit0(timeout=60)
        s = w.stats()
        got = {k: s.get(k) for k in ("steps", "library", "connected", "enabled_kinds",
                                     "agent_connects", "captures", "current_step")}
        want = dict(steps=30, library=True, connected=0, enabled_kinds=0, agent_connects=0,
                    captures=0, current_step=29)
        assert got == want, "worker without an agent: stats %s, want %s" % (got, want)
        assert s["fake"]["enable_calls"] == 0, "CUPTI kinds enabled without an agent: %s" % s
        log("  30 steps in %.1fs, exit 0, connected=0 enabled_kinds=0"
            % (time.monotonic() - t0))
    finally:
        stop_proc(w.proc, signal.SIGKILL)


def test_agent_killed(st):
    """SIGKILL the agent inside a long window; workers must not stall; re-register; recapture."""
    st.ensure()
    job, ranks = "capkill", range(2)
    workers = start_workers("kill", job, st.agent.sock, 2, ["--step-ms", "20"] + stepping_flags())
    try:
        wait_stepping(st.agent, job, ranks)
        rate_before, _ = step_rate(st.agent, job, ranks)
        res = st.agent.capture(job, "--steps", "200")  # no --wait: returns once armed
        run1 = res["run"]
        wait_state(st.agent, run1, ranks, "capturing")
        time.sleep(0.3)
        at_kill = {p["rank"]: p["step"] for p in st.agent.ps(job)}
        st.agent.kill()
        t_kill = time.monotonic()
        time.sleep(1.5)
        for w in workers:
            assert w.proc.poll() is None, "worker %s exited (rc %s) after the agent died: %s" % (
                w.tag, w.proc.returncode, read(w.err_path, 2000))
        st.start_agent()
        procs = wait_registered(st.agent, job, ranks, timeout=30)
        outage = time.monotonic() - t_kill
        # The failed capture is visible: collectord failed its ranks when the agent stayed
        # away past --agent-grace.
        failed = wait_state(st.agent, run1, ranks, "failed", timeout=10)
        for r in ranks:
            assert "lost contact with the kprof-agent" in (failed[r]["reason"] or ""), failed[r]
        progressed = {r: procs[r]["step"] - at_kill[r] for r in ranks}
        floor = rate_before * outage * 0.25
        assert all(v >= floor for v in progressed.values()), (
            "workers stalled while the agent was gone: steps made in %.1fs of outage %s, want >= "
            "%.0f each (25%% of the rate before, %.1f steps/s)" % (outage, progressed, floor,
                                                                  rate_before))
        rate_after, _ = step_rate(st.agent, job, ranks)
        assert rate_after >= 0.25 * rate_before, (
            "step rate after the agent was killed and restarted %.1f/s, before %.1f/s: want at "
            "least a quarter of it" % (rate_after, rate_before))
        res = st.agent.capture(job, "--steps", "3", "--wait")
        run2, first = res["run"], res["start_step"]
        check_reply(res, ranks)
        for w in workers:
            w.assert_exit0()
        check_run_ended(run2, job, 2)
        check_steps(run2, ranks, first, 3)
        check_capture_data(run2, workers, range(first, first + 3), ops=False)
        dropped = []
        for w in workers:
            s = w.stats()
            assert s["captures"] == 1 and s["agent_connects"] == 2, (
                "worker %s stats: captures=%s agent_connects=%s, want 1 (only the second "
                "capture completed) and 2 (registered again with the new agent)" % (
                    w.tag, s["captures"], s["agent_connects"]))
            err = read(w.err_path)
            assert re.search(r"capture \d+ failed: agent connection lost", err), (
                "worker %s: the library did not report the failed capture on stderr "
                "(KPROF_LOG=info):\n%s" % (w.tag, err[-2000:]))
            # What CUPTI held when the link went is drained and counted as dropped in the
            # library's totals (logged: how much depends on where the kill fell in its flush)
            dropped.append(s["records_dropped"])
        log("  run %d cut off after %.1fs outage (steps made meanwhile %s, %.0f/s before, "
            "%.0f/s after; records dropped and counted %s); run %d ok" % (
                run1, outage, progressed, rate_before, rate_after, dropped, run2))
    finally:
        stop_workers(workers)


def spool_segments(agent):
    try:
        return [f for f in os.listdir(agent.spool) if f.startswith("seg-")]
    except OSError:
        return []


def test_collectord_down(st):
    """SIGKILL collectord inside the window; the agent spools; collectord comes back."""
    st.ensure()
    job, ranks, n = "capcoll", range(2), 20
    workers = start_workers("coll", job, st.agent.sock, 2, ["--step-ms", "20"] + stepping_flags())
    try:
        wait_stepping(st.agent, job, ranks)
        ended_before = len(re.findall(r"window ended run=\d+ rank=[01] ", st.agent.text()))
        res = st.agent.capture(job, "--steps", str(n))
        run, first = res["run"], res["start_step"]
        wait_state(st.agent, run, ranks, ("capturing", "flushing"))  # the window began
        st.coll.stop(signal.SIGKILL)
        # The workers exit once their window is over (--until-captures 1: WINDOW_END sent).
        for w in workers:
            w.assert_exit0()
        kpfix.wait_for(lambda: len(re.findall(r"window ended run=\d+ rank=[01] ",
                                              st.agent.text())) >= 2 + ended_before, 30,
                       "the agent's \"window ended\" for both ranks")
        kpfix.wait_for(lambda: spool_segments(st.agent), 10, "unacknowledged batches spooled")
        time.sleep(0.3)
        done = "capture complete run=%d ranks=2 failed=0" % run
        assert done not in st.agent.text(), (
            "the agent completed run %d while collectord was down: it must wait for the "
            "acknowledgement" % run)
        st.start_collectord()
        # (the restarted collectord adopts the capture and the reattached agent reports it on:
        # what counts here is the rows, and the agent completing it once they are acknowledged)
        kpfix.wait_for(lambda: done in st.agent.text(), 120,
                       "the agent's capture complete, every batch acknowledged")
        steps = range(first, first + n)
        check_steps(run, ranks, first, n)
        # count(*) per (rank, kind) first: the plainest statement of exactly-once
        counts = collections.Counter()
        for rank, kind, c in rows(
                "SELECT rank, 'kernel', count(*) FROM kernels WHERE run_id = {r} GROUP BY 1 "
                "UNION ALL SELECT rank, 'memcpy', count(*) FROM memcpys WHERE run_id = {r} "
                "GROUP BY 1 UNION ALL SELECT rank, 'memset', count(*) FROM memsets "
                "WHERE run_id = {r} GROUP BY 1 UNION ALL SELECT rank, 'sync', count(*) "
                "FROM syncs WHERE run_id = {r} GROUP BY 1 UNION ALL SELECT rank, 'range', "
                "count(*) FROM ops WHERE run_id = {r} GROUP BY 1".format(r=run)):
            counts[(int(rank), kind)] = int(c)
        want = collections.Counter()
        for w in workers:
            for e in w.expect():
                if e["step"] in steps and (e["type"] == "range" or e["recorded"]):
                    want[(w.rank, e["kind"] if e["type"] == "gpu" else "range")] += 1
        assert counts == want, ("run %d (collectord killed mid-window): count(*) per (rank, "
                                "kind) in PostgreSQL %s, worker --expect %s" % (
                                    run, dict(counts), dict(want)))
        dup = one("SELECT count(*) FROM (SELECT 1 FROM ingest_batches WHERE run_id = %d "
                  "GROUP BY rank, stream, seq HAVING count(*) > 1) d" % run)
        assert dup == "0", "run %d: %s (rank, stream, seq) stored more than once" % (run, dup)
        check_capture_data(run, workers, steps, ops=False)
        kpfix.wait_for(lambda: not spool_segments(st.agent), 30,
                       "the spool acknowledged and emptied")
        nb = one("SELECT count(*) FROM ingest_batches WHERE run_id = %d" % run)
        log("  run %d: %s batches, %d rows, exactly once" % (run, nb, sum(counts.values())))
    finally:
        stop_workers(workers)


def test_fork(st):
    """A worker forks a DataLoader-like child at step 8, inside the window (8 steps)."""
    st.ensure()
    job, fork_at, n = "capfork", 8, 8
    # Slow steps: the coordinator's start step (the rank's step, plus 2, plus what it steps in
    # a second) must come at or before the fork, and the window of n steps cover it.
    w = Worker("fork", job, st.agent.sock, 0, 1,
               ["--fork-step", str(fork_at), "--step-ms", str(int(800 * SCALE))] +
               stepping_flags())
    try:
        wait_stepping(st.agent, job, [0])
        res = st.agent.capture(job, "--steps", str(n), "--wait", timeout=180)
        check_reply(res, [0])
        run, first = res["run"], res["start_step"]
        assert first <= fork_at < first + n, (
            "the window starts at step %d: too late for the fork at step %d (slow machine? "
            "raise KPROF_TEST_TIMEOUT_MULTIPLIER)" % (first, fork_at))
        w.assert_exit0()  # the worker exits 1 when its child fails or hangs
        assert "fork child" not in read(w.err_path), read(w.err_path)
        check_run_ended(run, job, 1)
        check_steps(run, [0], first, n)
        check_capture_data(run, [w], range(first, first + n))
        check_rank_rows(run, [w], job)
        tids = {e["tid"] for e in w.expect()}
        for table in ("ops", "api_calls"):
            bad = rows("SELECT DISTINCT tid FROM %s WHERE run_id = %d" % (table, run))
            bad = [t for (t,) in bad if int(t) not in tids]
            assert not bad, "%s rows of run %d from threads %s, not the parent's %s: the " \
                "forked child leaked records" % (table, run, bad, sorted(tids))
        dl = one("SELECT count(*) FROM ops o JOIN names n ON n.id = o.name "
                 "WHERE o.run_id = %d AND n.name = 'DataLoader.__next__'" % run)
        assert dl == "0", "run %d: %s ops rows of the child's DataLoader.__next__" % (run, dl)
        regs = re.findall(r"process registered pid=(\d+) uid=\d+ job=%s " % job,
                          st.agent.text())
        assert regs == [str(w.pid)], "agent log: processes registered for job %s: %s, want " \
            "only the parent %d" % (job, regs, w.pid)
        log("  run %d ok, child exited 0, rows only from pid %d" % (run, w.pid))
    finally:
        stop_proc(w.proc, signal.SIGKILL)


def test_many(st):
    """64 ranks on one agent, a 2-step capture of all of them."""
    st.ensure()
    job, world = "capmany", 64
    t0 = time.monotonic()
    workers = start_workers("many", job, st.agent.sock, world,
                            ["--layers", "1", "--step-ms", "50"] + stepping_flags(240))
    try:
        wait_stepping(st.agent, job, range(world), timeout=90)
        t_reg = time.monotonic() - t0
        res = st.agent.capture(job, "--steps", "2", "--wait", timeout=180)
        check_reply(res, range(world))
        run, first = res["run"], res["start_step"]
        for w in workers:
            w.assert_exit0(timeout=120)
        check_run_ended(run, job, world)
        check_steps(run, range(world), first, 2)
        got = {int(r): int(c) for r, c in rows(
            "SELECT rank, count(*) FROM kernels WHERE run_id = %d GROUP BY rank" % run)}
        steps = range(first, first + 2)
        want = {w.rank: sum(1 for e in w.expect() if e["type"] == "gpu" and e["recorded"] and
                            e["kind"] == "kernel" and e["step"] in steps) for w in workers}
        bad = {r: (got.get(r, 0), want[r]) for r in want if got.get(r, 0) != want[r]}
        assert not bad and min(want.values()) > 0, (
            "run %d: kernels per rank (database, --expect) differ for %d ranks: %s" % (
                run, len(bad), dict(list(bad.items())[:10])))
        n = one("SELECT count(*) FROM ranks WHERE run_id = %d" % run)
        assert n == str(world), "run %d: %s ranks rows, want %d" % (run, n, world)
        log("  64 registered in %.1fs; run %d: steps %d..%d and kernels on every rank (%d in "
            "all); %.1fs in all" % (t_reg, run, first, first + 1, sum(got.values()),
                              time.monotonic() - t0))
    finally:
        stop_workers(workers)


def test_kafka(st):
    """Through Kafka: collectord --sink kafka, librdkafka's mock cluster, a sink consumer."""
    # The stack's collectord (direct path) stays up and, holding the election, coordinates:
    # the agent pushes to the Kafka replica given to it and attaches to the coordinator it
    # names, as agents of a scaled-out deployment do. The agent's socket and spool are the
    # stack's: this scenario runs its own agent instead.
    st.ensure()
    if st.agent is not None and st.agent.alive():
        st.agent.stop()
    st.agent = None
    mock = kpfix.KafkaMock(os.path.join("capture-it", "kafka-mock"), brokers=3, partitions=4)
    PROCS.append(mock.proc)
    ing = kpfix.Collectord(os.path.join("capture-it", "kafka-ingest"), st.conninfo,
                           ["--sink", "kafka", "--kafka-brokers", mock.bootstrap,
                            "--agent-grace", AGENT_GRACE])
    PROCS.append(ing.proc)
    sink = kpfix.Daemon(os.path.join("capture-it", "kafka-sink"), [
        os.path.join(BIN, "collectord", "kprof-collectord"), "--role", "sink", "--pg-conninfo",
        st.conninfo, "--kafka-brokers", mock.bootstrap, "--flush-interval", "20ms"], grpc=False)
    PROCS.append(sink.proc)
    agent = Agent(ing.grpc)
    st.agents.append(agent)
    job, ranks = "capkafka", range(2)
    workers = start_workers("kafka", job, agent.sock, 2, ["--step-ms", "20"] + stepping_flags())
    try:
        wait_stepping(agent, job, ranks)
        res = agent.capture(job, "--steps", "3", "--wait")
        run, first = res["run"], res["start_step"]
        check_reply(res, ranks)
        # --wait returned: every rank DONE, which behind Kafka means stored in PostgreSQL, so
        # the rows are there now, not eventually
        check_capture_data(run, workers, range(first, first + 3))
        check_run_ended(run, job, 2)
        text = read(ing.log_path) + read(st.coll.log_path)
        assert len(re.findall(r"capture rank run=%d rank=\d+ host=\S+ state=done \(its \d+ "
                              r"batches are stored\)" % run, text)) == 2, (
            "the coordinator did not hold the ranks until stored:\n" + text[-3000:])
        for w in workers:
            w.assert_exit0()
        log("  run %d through Kafka: ranks held FLUSHING until stored, rows equal to --expect"
            % run)
    finally:
        stop_workers(workers)
        agent.stop()
        st.agents.remove(agent)
        sink.stop()
        ing.stop()
        mock.stop()


SCENARIOS = [("main", test_main), ("no_agent", test_no_agent),
             ("agent_killed", test_agent_killed), ("collectord_down", test_collectord_down),
             ("fork", test_fork), ("many", test_many), ("kafka", test_kafka)]


def main():
    global USE_KPROF_RUN
    for path in (AGENT, LIB, WORKER):
        if not os.path.exists(path):
            print("missing %s: build the tree first" % path, file=sys.stderr)
            return 1
    shutil.rmtree(DIR, ignore_errors=True)
    os.makedirs(DIR)
    USE_KPROF_RUN = kprof_run_works()
    log("workers launched %s" % ("through agent/kprof-run" if USE_KPROF_RUN else
                                 "with the injection env set here (kprof-run unusable)"))
    only = set(filter(None, os.environ.get("KPROF_CAPTURE_ONLY", "").split(",")))
    failed = []
    st = None
    ok = False
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
        if st is not None:
            st.stop()
        ok = not failed
    finally:
        for p in PROCS:  # by pid; SIGKILL whatever is still running
            if p.poll() is None:
                p.kill()
                p.wait()
        if os.environ.get("KPROF_KEEP_TEST_DIR"):
            print("scratch files kept in %s (KPROF_KEEP_TEST_DIR)" % DIR, file=sys.stderr)
        else:
            shutil.rmtree(DIR, ignore_errors=True)
        if ok and not os.environ.get("KPROF_KEEP_TEST_DIR"):
            kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
    if failed:
        print("FAILED: %s" % ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
