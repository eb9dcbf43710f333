"""kprof-agent end to end: a real kprof-collectord (fresh database), the real kprof-agent and a
Python stand-in for libkprof_inject.so (tests/it/kpwire.py); captures are started with the
kprofctl binary through collectord's coordinator, the agent's only control plane:
  1. `kprofctl start --wait`: HELLO, ARM (the coordinator's start step), STEP / WINDOW_BEGIN /
     STRINGS / RECORDS / WINDOW_END; the exact rows in PostgreSQL (kernels with external_id
     and step, ops, steps, api_calls), warm-up and after-window records left out, the run
     ended;
  2. a malformed message and a refused uid only close that connection; the good one is still
     listed by `kprofctl jobs`; start errors (no such job, a rank outside the world size) have
     their exit codes; `kprof-agent capture` (removed) exits 2 naming kprofctl; a HELLO with
     an impossible identity (rank -7, rank >= world size, world size 0, a control character
     in the job) or a (job, rank) a live session holds is refused with its reason, logged once,
     and only that connection closed; once the holder closes, the same (job, rank) is accepted;
  3. collectord stopped during the capture: the agent spools, collectord comes back, every
     row is stored exactly once, and only then is the agent's capture complete;
  4. the agent restarted while records are spooled and unacknowledged: replayed after the
     restart, no duplicates;
  5. collectord frozen (SIGSTOP, not killed) under the uplink: the agent still stops promptly,
     and once collectord is thawed its records are stored exactly once;
  6. the same (job, rank) live on two agents: `kprofctl start` refuses (exit 6) naming both
     hosts, rather than capturing one of them."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import kpfix
import kpwire as kw

kpfix.require_env()

DB = "kp_it_agent"
T = 1_760_000_000_000_000_000
AGENT = os.path.join(kpfix.BIN, "agent", "kprof-agent")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
DIR = os.path.join(kpfix.TEST_DIR, "agent-it")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Agent:
    def __init__(self, name, collector, extra=(), sock="agent.sock", spool="spool"):
        self.sock = os.path.join(DIR, sock)
        self.spool = os.path.join(DIR, spool)
        self.ready = os.path.join(DIR, name + ".ready")
        self.log_path = os.path.join(DIR, name + ".log")
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [AGENT, "--socket", self.sock, "--socket-mode", "0666", "--collector", collector,
             "--spool-dir", self.spool, "--ready-file", self.ready, "--batch-ms", "30ms",
             "--http-listen", "127.0.0.1:0", "--log-level", "debug"] + list(extra),
            stdout=self.log, stderr=subprocess.STDOUT)
        kpfix.wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30,
                       "agent ready")
        assert self.proc.poll() is None, "agent exited:\n" + self.text()

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30 * kpfix.SCALE)
        self.log.close()
        text = self.text()
        for bad in ("Sanitizer", "runtime error:"):
            assert bad not in text, "sanitizer report in the agent log:\n" + text
        return self.proc.returncode


class Ctl:
    """The kprofctl binary against the test's collectord (its address set in main)."""
    addr = None

    @staticmethod
    def run(*args, wait=True):
        cmd = [KPROFCTL] + list(args) + ["--collector", Ctl.addr]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if not wait:
            return p
        out, err = p.communicate(timeout=60 * kpfix.SCALE)
        return p.returncode, out, err

    @staticmethod
    def jobs(job):
        rc, out, err = Ctl.run("jobs", "--json")
        assert rc == 0, (rc, out, err)
        return [r for r in json.loads(out) if r["job"] == job]

    @staticmethod
    def wait_job(job, pid):
        """Until collectord lists process pid of job (the agent reported it)."""
        kpfix.wait_for(lambda: any(r["pid"] == pid for r in Ctl.jobs(job)), 30,
                       "job %s listed by kprofctl jobs" % job)

    @staticmethod
    def start(job, *args):
        """`kprofctl start --job J ARGS` in the background (it returns once the ranks are
        armed, so the test answers the ARM meanwhile)."""
        Ctl.wait_job(job, os.getpid())
        return Ctl.run("start", "--job", job, *args, wait=False)

    @staticmethod
    def status(run):
        """The run's ranks as `kprofctl status --json` lists them."""
        rc, out, err = Ctl.run("status", "--run", str(run), "--json")
        assert rc == 0, (rc, out, err)
        return json.loads(out)


def started_run(cap):
    """The run id `kprofctl start` (no --wait) printed."""
    out, err = cap.communicate(timeout=60 * kpfix.SCALE)
    assert cap.returncode == 0, (cap.returncode, out, err)
    return int(out.strip())


def wait_run_state(run, state):
    kpfix.wait_for(lambda: q("SELECT state FROM runs WHERE id = %d" % run) == state, 30,
                   "run %d in state %s" % (run, state))


def q(sql):
    return kpfix.psql(sql, db=DB)


def rows(sql):
    out = q(sql)
    return [tuple(line.split("|")) for line in out.splitlines()] if out else []


def eq(got, want):
    assert got == want, "got %r, want %r" % (got, want)


def library(agent, job, rank=0, world=1, step=-1):
    lib = kw.Conn(agent.sock)
    lib.send(kw.hello(job, rank, local_rank=rank, world_size=world, device=rank, step=step))
    mtype, payload = lib.recv()
    assert mtype == kw.WELCOME
    accepted, reason = kw.parse_welcome(payload)
    assert accepted == 1, reason
    return lib


def recv_arm(lib):
    mtype, payload = lib.recv()
    assert mtype == kw.ARM, mtype
    return kw.parse_arm(payload)


def test_capture_rows(agent):
    lib = library(agent, "itjob", step=5)
    lib.send(kw.status(0, kw.ST_DORMANT, 5))
    cap = Ctl.start("itjob", "--steps", "2", "--wait", "--json")
    arm = recv_arm(lib)
    # the coordinator's start step: a margin ahead of the rank's step (test_capture.py checks
    # that real workers make it); s is the window's first step
    s = arm["target_step"]
    assert s > 6 and arm["n_steps"] == 2, arm
    cid, run = arm["capture_id"], arm["run_id"]
    assert run > 0
    lib.send(kw.strings({1: "volta_sgemm_128x64_nn", 2: "cudaLaunchKernel", 3: "aten::mm",
                         4: "[[2, 3], [3, 4]]"}))
    lib.send(kw.status(cid, kw.ST_ARMED, s - 1))
    lib.send(kw.step(s - 1, T))
    # warm-up: launched before the window, so its kernel is left out too
    lib.send(kw.records(kw.REC_API, [kw.api(T + 100, T + 110, 1, 2)]))
    lib.send(kw.records(kw.REC_KERNEL, [kw.kernel(T + 1100, T + 1150, 1, 1)]))
    lib.send(kw.step(s, T + 1000))
    lib.send(kw.window(kw.WINDOW_BEGIN, cid, run, T + 1000, 0, s, -1))
    lib.send(kw.records(kw.REC_KERNEL, [kw.kernel(T + 1300, T + 1390, 2, 1)]))  # before its API
    lib.send(kw.records(kw.REC_API, [kw.api(T + 1200, T + 1210, 2, 2, external_id=50)]))
    lib.send(kw.records(kw.REC_RANGE, [kw.range_(T + 1150, T + 1400, 50, 3, seq=9, op_id=4,
                                                 shapes=4)]))
    lib.send(kw.step(s + 1, T + 2000))
    lib.send(kw.records(kw.REC_API, [kw.api(T + 2100, T + 2120, 3, 2)]))
    lib.send(kw.records(kw.REC_KERNEL, [kw.kernel(T + 2200, T + 2300, 3, 1)]))
    lib.send(kw.step(s + 2, T + 3000))
    lib.send(kw.records(kw.REC_API, [kw.api(T + 3100, T + 3120, 4, 2)]))  # after the window
    lib.send(kw.window(kw.WINDOW_END, cid, run, T + 1000, T + 3000, s, s + 1, records_=8,
                       dropped=2))
    lib.send(kw.status(cid, kw.ST_DONE, s + 2))
    out, err = cap.communicate(timeout=60 * kpfix.SCALE)
    assert cap.returncode == 0, (cap.returncode, out, err)
    res = json.loads(out)
    assert res["run"] == run and [r["state"] for r in res["ranks"]] == ["done"], res
    s0, s1 = str(s), str(s + 1)
    eq(rows("SELECT k.start_ns - %d, k.dur_ns, k.step, k.external_id, k.correlation, n.name "
            "FROM kernels k JOIN names n ON n.id = k.name WHERE run_id = %d ORDER BY 1"
            % (T, run)), [("1300", "90", s0, "50", "2", "volta_sgemm_128x64_nn"),
                          ("2200", "100", s1, "0", "3", "volta_sgemm_128x64_nn")])
    eq(rows("SELECT a.start_ns - %d, a.step, a.external_id, a.correlation, a.domain, n.name "
            "FROM api_calls a JOIN names n ON n.id = a.name WHERE run_id = %d ORDER BY 1"
            % (T, run)), [("1200", s0, "50", "2", "1", "cudaLaunchKernel"),
                          ("2100", s1, "0", "3", "1", "cudaLaunchKernel")])
    eq(rows("SELECT o.start_ns - %d, o.dur_ns, o.op_id, o.external_id, o.step, o.seq, "
            "n.name, s.name FROM ops o JOIN names n ON n.id = o.name "
            "JOIN names s ON s.id = o.input_shapes WHERE run_id = %d" % (T, run)),
       [("1150", "250", "50", "50", s0, "9", "aten::mm", "[[2, 3], [3, 4]]")])
    eq(rows("SELECT step, start_ns - %d, dur_ns FROM steps WHERE run_id = %d ORDER BY 1"
            % (T, run)), [(s0, "1000", "1000"), (s1, "2000", "1000")])
    eq(rows("SELECT job, host, pid, records_dropped FROM ranks WHERE run_id = %d" % run),
       [("itjob", "testhost", str(os.getpid()), "2")])
    wait_run_state(run, "2")  # ended
    return lib


def test_bad_peers(agent, lib):
    # a malformed message closes only that connection
    bad = kw.Conn(agent.sock)
    bad.send(b"\x00" * 40)
    assert bad.closed(), "a malformed message must close the connection"
    bad.close()
    # a record count that does not match its payload, after a valid HELLO
    bad = library(agent, "otherjob", rank=0)
    m = bytearray(kw.records(kw.REC_API, [kw.api(T, T + 1, 9, 0)]))
    m[12] = 3  # count = 3, payload has 1
    bad.send(bytes(m))
    assert bad.closed()
    bad.close()
    # a refused uid is answered WELCOME accepted=0 at accept (needs root to become another user)
    if os.getuid() == 0:
        code = ("import sys; sys.path.insert(0, %r); import kpwire as kw; c = kw.Conn(%r); "
                "t, p = c.recv(); a, r = kw.parse_welcome(p); "
                "print(a, r)" % (os.path.dirname(os.path.abspath(__file__)), agent.sock))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)), timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("0 uid 65534 is not allowed"), out.stdout
        assert "connection refused" in agent.text()
    else:
        print("skip: refused-uid check needs root")
    # an impossible identity or a taken (job, rank) is refused, that connection closed
    for job, rank, world, want in (("rankjob", -7, 4, "rank -7 is out of range"),
                                   ("rankjob", 4, 4, "rank 4 is out of range"),
                                   ("rankjob", 0, 0, "world size 0 is out of range"),
                                   ("rank\njob", 0, 1, "control character"),
                                   ("itjob", 0, 1, "itjob rank 0 is already registered by pid")):
        bad = kw.Conn(agent.sock)
        bad.send(kw.hello(job, rank, local_rank=0, world_size=world))
        mtype, payload = bad.recv()
        assert mtype == kw.WELCOME, mtype
        accepted, reason = kw.parse_welcome(payload)
        assert accepted == 0 and want in reason, (job, rank, world, accepted, reason)
        assert bad.closed(), "a refused HELLO must close the connection"
        bad.close()
    # the pid's refusals are logged once, not once per connection
    kpfix.wait_for(lambda: "process refused" in agent.text(), 10, "refusal logged")
    assert agent.text().count("process refused") == 1, agent.text()[-3000:]
    # a valid rank of the same job is accepted; after its holder closes, the rank is free again
    first = library(agent, "rankjob", rank=3, world=4)
    again = kw.Conn(agent.sock)
    again.send(kw.hello("rankjob", 3, local_rank=0, world_size=4))
    accepted, reason = kw.parse_welcome(again.recv()[1])
    assert accepted == 0 and "already registered" in reason, reason
    again.close()
    first.close()
    library(agent, "rankjob", rank=3, world=4).close()
    # the good connection is still registered and reported, the closed one no longer
    Ctl.wait_job("itjob", os.getpid())
    kpfix.wait_for(lambda: not Ctl.jobs("otherjob"), 30, "otherjob gone from kprofctl jobs")
    procs = Ctl.jobs("itjob")
    assert [p["pid"] for p in procs] == [os.getpid()], procs
    # start errors
    rc, out, err = Ctl.run("start", "--job", "nosuchjob")
    assert rc == 3 and "registered jobs: itjob" in err, (rc, err)
    rc, out, err = Ctl.run("start", "--job", "itjob", "--ranks", "3")
    assert rc == 2 and "outside job itjob's world size" in err, (rc, err)
    # the agent's own control plane is gone: its old verbs say where captures start now
    for verb in ("capture", "ps"):
        p = subprocess.run([AGENT, verb, "--socket", agent.sock], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 2 and "kprofctl start" in p.stderr, (verb, p.returncode,
                                                                     p.stderr)


def test_rank_two_hosts(port):
    """The same (job, rank) live on two agents: StartCapture refuses, naming both hosts."""
    other = Agent("agent-nodeb", "127.0.0.1:%d" % port, ["--host", "nodeb"], sock="nodeb.sock",
                  spool="spool-nodeb")
    try:
        libs = []
        for agent_sock, rank in ((os.path.join(DIR, "agent.sock"), 0),
                                 (other.sock, 0), (other.sock, 1)):
            c = kw.Conn(agent_sock)
            c.send(kw.hello("dupjob", rank, local_rank=rank, world_size=2))
            accepted, reason = kw.parse_welcome(c.recv()[1])
            assert accepted == 1, reason
            libs.append(c)
        kpfix.wait_for(lambda: len(Ctl.jobs("dupjob")) == 3, 30, "dupjob's 3 processes listed")
        # kprofctl jobs flags the conflict for on-call: rank 0's two rows, not rank 1's.
        flagged = {(r["rank"], r["host"]): r["conflict"] for r in Ctl.jobs("dupjob")}
        assert flagged[(1, "nodeb")] is None, flagged
        assert [v for k, v in flagged.items() if k[0] == 0] == ["live on 2 hosts"] * 2, flagged
        rc, out, err = Ctl.run("jobs")
        assert rc == 0 and "CONFLICT" in out and "rank 0 is live on 2 hosts" in err, (out, err)
        rc, out, err = Ctl.run("start", "--job", "dupjob")
        assert rc == 6 and "rank 0 of job dupjob is registered on two hosts" in err, (rc, err)
        assert "nodeb" in err, err
        for c in libs:
            c.close()
    except BaseException:
        print("--- nodeb agent log ---\n" + other.text()[-5000:], file=sys.stderr)
        raise
    finally:
        assert other.stop() == 0


def send_window(lib, arm, first, n_api, start_step):
    """A window of two steps with n_api API records + kernels; returns the expected rows."""
    cid, run = arm["capture_id"], arm["run_id"]
    base = T + first * 1_000_000_000
    lib.send(kw.step(start_step, base))
    lib.send(kw.window(kw.WINDOW_BEGIN, cid, run, base, 0, start_step, -1))
    chunk = []
    for i in range(n_api):
        corr = first * 100000 + i + 1
        t = base + 1000 + i * 1000
        chunk.append((kw.api(t, t + 100, corr, 2), kw.kernel(t + 200, t + 700, corr, 1)))
        if len(chunk) == 100:
            lib.send(kw.records(kw.REC_API, [a for a, _ in chunk]))
            lib.send(kw.records(kw.REC_KERNEL, [k for _, k in chunk]))
            chunk = []
    if chunk:
        lib.send(kw.records(kw.REC_API, [a for a, _ in chunk]))
        lib.send(kw.records(kw.REC_KERNEL, [k for _, k in chunk]))
    end = base + 1000 + n_api * 1000 + 1000
    lib.send(kw.step(start_step + 1, end))
    lib.send(kw.window(kw.WINDOW_END, cid, run, base, end, start_step, start_step))
    lib.send(kw.status(cid, kw.ST_DONE, start_step + 1))


def counts(run):
    return (int(q("SELECT count(*) FROM api_calls WHERE run_id = %d" % run)),
            int(q("SELECT count(DISTINCT correlation) FROM api_calls WHERE run_id = %d" % run)),
            int(q("SELECT count(*) FROM kernels WHERE run_id = %d" % run)))


def segments(agent):
    return [f for f in os.listdir(agent.spool) if f.startswith("seg-")]


def test_collectord_down(agent, coll, conninfo, port, lib):
    cap = Ctl.start("itjob", "--steps", "1")
    arm = recv_arm(lib)
    run = started_run(cap)
    assert arm["run_id"] == run, (arm, run)
    coll.stop(signal.SIGKILL)
    send_window(lib, arm, 1, 1000, arm["target_step"])
    kpfix.wait_for(lambda: len(segments(agent)) > 0, 30, "records spooled")
    time.sleep(0.3)  # the agent keeps retrying meanwhile; nothing may be lost
    done = "capture complete run=%d ranks=1 failed=0" % run
    assert done not in agent.text(), "the capture must wait for collectord's acknowledgement"
    coll = kpfix.Collectord("agent-coll2", conninfo, ["--listen", "127.0.0.1:%d" % port])
    # (the restarted collectord adopts the capture it did not see end; the agent finishes it
    # once its rows are acknowledged, and the run ends as ENDED, not FAILED)
    kpfix.wait_for(lambda: done in agent.text(), 60, "the agent's capture complete, acknowledged")
    assert counts(run) == (1000, 1000, 1000), counts(run)
    kpfix.wait_for(lambda: q("SELECT state FROM runs WHERE id = %d" % run) != "1", 10,
                   "the adopted capture's run ended")
    assert q("SELECT state FROM runs WHERE id = %d" % run) == "2", "run %d did not end ENDED" % run
    return coll


def test_agent_restart(agent, coll, conninfo, port):
    lib = library(agent, "itjob", step=30)
    cap = Ctl.start("itjob", "--steps", "1")
    arm = recv_arm(lib)
    run = started_run(cap)
    assert run == arm["run_id"], (run, arm)
    coll.stop(signal.SIGKILL)
    send_window(lib, arm, 2, 700, arm["target_step"])
    kpfix.wait_for(lambda: "window ended run=%d" % run in agent.text(), 30, "window end")
    kpfix.wait_for(lambda: len(segments(agent)) > 0, 30, "records spooled")
    lib.close()
    assert agent.stop() == 0
    assert segments(agent), "the spool must keep unacknowledged records across a restart"
    agent = Agent("agent2", "127.0.0.1:%d" % port)
    assert "spool recovered" in agent.text()
    coll = kpfix.Collectord("agent-coll3", conninfo, ["--listen", "127.0.0.1:%d" % port])
    kpfix.wait_for(lambda: counts(run)[0] >= 700 and counts(run)[2] >= 700, 60, "replay stored")
    kpfix.wait_for(lambda: not segments(agent), 30, "spool acknowledged and deleted")
    assert counts(run) == (700, 700, 700), counts(run)
    # the restarted collectord adopted the capture; the agent came back without it (it was
    # restarted too), so the rank fails at once, saying so
    kpfix.wait_for(lambda: q("SELECT state FROM runs WHERE id = %d" % run) == "3", 10,
                   "the adopted capture failed")
    reason = q("SELECT reason FROM capture_ranks WHERE run_id = %d" % run)
    assert "came back without the rank's capture" in reason, reason
    dup = q("SELECT count(*) FROM (SELECT seq FROM ingest_batches WHERE run_id = %d "
            "GROUP BY stream, seq HAVING count(*) > 1) d" % run)
    assert dup == "0"
    return agent, coll


def stop_within(agent, when):
    """SIGTERM stops the agent within 20 s (its exit status 0); returns how long it took."""
    t0 = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    try:
        agent.proc.wait(timeout=20 * kpfix.SCALE)
    except subprocess.TimeoutExpired:
        agent.proc.kill()
        agent.proc.wait()
        raise AssertionError("the agent did not stop in 20 s %s" % when)
    took = time.monotonic() - t0
    assert agent.stop() == 0
    return took


def test_collectord_frozen(agent, coll, conninfo, port):
    """The uplink's push retries forever, but a collectord that is frozen mid-stream (the
    connection stays up, nothing is read or acknowledged) must not hang the agent's threads:
    SIGTERM still stops it. Thawed, collectord gets the records from the spool exactly once."""
    lib = library(agent, "itjob", step=40)
    cap = Ctl.start("itjob", "--steps", "1")
    arm = recv_arm(lib)
    run = started_run(cap)
    coll.proc.send_signal(signal.SIGSTOP)
    try:
        send_window(lib, arm, 3, 20000, arm["target_step"])
        kpfix.wait_for(lambda: "window ended run=%d" % run in agent.text(), 30, "window end")
        kpfix.wait_for(lambda: len(segments(agent)) > 0, 30, "records spooled")
        time.sleep(0.5)  # the uplink pushes into the frozen collectord meanwhile
        lib.close()
        took = stop_within(agent, "with collectord frozen")
    finally:
        coll.proc.send_signal(signal.SIGCONT)
    assert segments(agent), "unacknowledged records must stay spooled"
    agent = Agent("agent-thawed", "127.0.0.1:%d" % port)
    kpfix.wait_for(lambda: counts(run) == (20000, 20000, 20000) and not segments(agent), 60,
                   "spooled records stored once collectord is thawed")
    dup = q("SELECT count(*) FROM (SELECT seq FROM ingest_batches WHERE run_id = %d "
            "GROUP BY stream, seq HAVING count(*) > 1) d" % run)
    assert dup == "0"
    # its push sent 20000 records through a call that is now idle: cancelling it on stop
    # must end it too
    took_thawed = stop_within(agent, "after its uplink caught up")
    print("agent stopped in %.1f s with collectord frozen, in %.1f s once thawed" % (
        took, took_thawed))
    return agent


def test_window_timeout(agent):
    """A rank that begins its window and then goes silent (a stuck training loop) is failed at
    --window-timeout with a reason, and DISARMed; the capture ends instead of waiting forever."""
    lib = library(agent, "stuckjob", step=5)
    lib.send(kw.status(0, kw.ST_DORMANT, 5))
    cap = Ctl.start("stuckjob", "--steps", "2", "--wait")
    arm = recv_arm(lib)
    cid, run, s = arm["capture_id"], arm["run_id"], arm["target_step"]
    lib.send(kw.step(s, T + 1000))
    lib.send(kw.window(kw.WINDOW_BEGIN, cid, run, T + 1000, 0, s, -1))
    out, err = cap.communicate(timeout=60 * kpfix.SCALE)
    assert cap.returncode == 1, (cap.returncode, out, err)
    assert "began its window (step %d) but did not end it in time" % s in out + err, (out, err)
    mtype, payload = lib.recv()
    assert mtype == kw.DISARM, mtype
    wait_run_state(run, "3")  # failed
    lib.close()


def main():
    shutil.rmtree(DIR, ignore_errors=True)
    os.makedirs(DIR)
    conninfo = kpfix.fresh_db(DB)
    port = free_port()
    Ctl.addr = "127.0.0.1:%d" % port
    coll = kpfix.Collectord("agent-coll", conninfo, ["--listen", "127.0.0.1:%d" % port])
    agent = Agent("agent", "127.0.0.1:%d" % port)
    try:
        lib = test_capture_rows(agent)
        print("ok capture rows")
        test_bad_peers(agent, lib)
        print("ok bad peers")
        test_rank_two_hosts(port)
        print("ok rank on two hosts")
        coll = test_collectord_down(agent, coll, conninfo, port, lib)
        print("ok collectord down")
        lib.close()
        agent, coll = test_agent_restart(agent, coll, conninfo, port)
        print("ok agent restart")
        agent = test_collectord_frozen(agent, coll, conninfo, port)
        print("ok collectord frozen")
        assert agent.stop() == 0
        agent = Agent("agent3", "127.0.0.1:%d" % port, ["--window-timeout", "1s"])
        test_window_timeout(agent)
        print("ok window timeout")
    except BaseException:
        print("--- agent log ---\n" + agent.text()[-20000:], file=sys.stderr)
        print("--- collectord log ---\n" + coll.log_text()[-5000:], file=sys.stderr)
        raise
    finally:
        agent.stop()
        coll.stop()
    coll.assert_clean_log()


if __name__ == "__main__":
    main()
