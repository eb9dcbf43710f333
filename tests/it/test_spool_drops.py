"""it.test_spool_drops: records the agent's spool refuses reach PostgreSQL as counts.

A real kprof-collectord (fresh database) and the real kprof-agent with a small
--spool-max-bytes, cutting batches of BATCH_ROWS rows only (a long --batch-ms); a Python
stand-in for libkprof_inject.so (tests/it/kpwire.py) captures one step with N_API API records
and N_API kernels, and reports LIB_DROPPED drops of its own at WINDOW_END. collectord is
frozen (SIGSTOP) for the whole window, so nothing is acknowledged, the spool fills and most
batches are refused, the last one (most of a batch of records, and the step row) included;
then it is thawed. The rank's final drop count must still arrive (the agent's count-only last
batch, admitted from the spool's tail reserve).

The capture must still complete, and:
  - ranks.records_dropped of the run's rank is > 0 and equals what the agent's metrics count
    as its own drops (spool full) plus the library's;
  - the rows stored plus ranks.records_dropped are every record produced (the API and kernel
    records sent, the step row, the library's drops): nothing vanishes;
  - `kprofctl status` shows the rank done with that same dropped count and a reason that
    names the spool: a partial capture, not a plain done.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import kpfix
import kpwire as kw

kpfix.require_env()

DB = "kp_it_spool_drops"
T = 1_760_000_000_000_000_000
AGENT = os.path.join(kpfix.BIN, "agent", "kprof-agent")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
DIR = os.path.join(kpfix.TEST_DIR, "spool-drops-it")
SPOOL_MAX = "128KiB"  # a few batches of the window's 40000 rows
N_API = 19900  # 2 * N_API rows: full batches, then a last batch of 3800 rows and the step
BATCH_ROWS = 4000
LIB_DROPPED = 7


def q(sql):
    return kpfix.psql(sql, db=DB)


class Agent:
    def __init__(self, collector):
        self.sock = os.path.join(DIR, "agent.sock")
        self.ready = os.path.join(DIR, "agent.ready")
        self.log_path = os.path.join(DIR, "agent.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [AGENT, "--socket", self.sock, "--socket-mode", "0600", "--collector", collector,
             "--spool-dir", os.path.join(DIR, "spool"), "--spool-max-bytes", SPOOL_MAX,
             "--ready-file", self.ready, "--batch-rows", str(BATCH_ROWS), "--batch-ms", "60s",
             "--http-listen", "127.0.0.1:0",
             "--log-level", "debug"], stdout=self.log, stderr=subprocess.STDOUT)
        kpfix.wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30,
                       "agent ready")
        assert self.proc.poll() is None, "agent exited:\n" + self.text()
        addrs = dict(l.strip().split("=", 1) for l in open(self.ready) if "=" in l)
        self.http = addrs["http"]

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def metrics(self):
        """{(name, reason label or None): value} from the agent's /metrics."""
        with urllib.request.urlopen("http://%s/metrics" % self.http, timeout=10) as r:
            body = r.read().decode()
        out = {}
        for line in body.splitlines():
            m = re.match(r'^(\w+)(?:\{reason="(\w+)"\})? (\d+)$', line)
            if m:
                out[(m.group(1), m.group(2))] = int(m.group(3))
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30 * kpfix.SCALE)
        self.log.close()
        assert "Sanitizer" not in self.text() and "runtime error:" not in self.text(), (
            "sanitizer report in the agent log:\n" + self.text())
        return self.proc.returncode


def ctl(addr, *args, wait=True):
    cmd = [KPROFCTL] + list(args) + ["--collector", addr]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    out, err = p.communicate(timeout=60 * kpfix.SCALE)
    return p.returncode, out, err


def library(agent, job):
    lib = kw.Conn(agent.sock)
    lib.send(kw.hello(job, 0, local_rank=0, world_size=1, device=0, step=5))
    mtype, payload = lib.recv()
    assert mtype == kw.WELCOME
    accepted, reason = kw.parse_welcome(payload)
    assert accepted == 1, reason
    lib.send(kw.status(0, kw.ST_DORMANT, 5))
    return lib


def send_window(lib, arm):
    """One step: N_API API records and their kernels, LIB_DROPPED dropped by the library."""
    cid, run, s = arm["capture_id"], arm["run_id"], arm["target_step"]
    base = T + 1_000_000_000
    lib.send(kw.status(cid, kw.ST_ARMED, s - 1))
    lib.send(kw.step(s, base))
    lib.send(kw.window(kw.WINDOW_BEGIN, cid, run, base, 0, s, -1))
    for at in range(0, N_API, 100):
        chunk = range(at, min(at + 100, N_API))
        lib.send(kw.records(kw.REC_API, [kw.api(base + 1000 + i * 1000, base + 1100 + i * 1000,
                                                i + 1, 2) for i in chunk]))
        lib.send(kw.records(kw.REC_KERNEL, [kw.kernel(base + 1200 + i * 1000,
                                                      base + 1700 + i * 1000, i + 1, 1)
                                            for i in chunk]))
    end = base + 1000 + N_API * 1000 + 1000
    lib.send(kw.step(s + 1, end))
    lib.send(kw.window(kw.WINDOW_END, cid, run, base, end, s, s, records_=2 * N_API,
                       dropped=LIB_DROPPED))
    lib.send(kw.status(cid, kw.ST_DONE, s + 1, dropped=LIB_DROPPED))


def test_spool_full(agent, coll, addr):
    lib = library(agent, "spooljob")
    kpfix.wait_for(lambda: "spooljob" in ctl(addr, "jobs", "--json")[1], 30, "job listed")
    cap = ctl(addr, "start", "--job", "spooljob", "--steps", "1", wait=False)
    mtype, payload = lib.recv()
    assert mtype == kw.ARM, mtype
    arm = kw.parse_arm(payload)
    out, err = cap.communicate(timeout=60 * kpfix.SCALE)
    assert cap.returncode == 0, (cap.returncode, out, err)
    run = int(out.strip())
    assert run == arm["run_id"], (run, arm)
    coll.proc.send_signal(signal.SIGSTOP)
    try:
        send_window(lib, arm)
        kpfix.wait_for(lambda: "window ended run=%d" % run in agent.text(), 30, "window end")
        time.sleep(0.5)  # every batch of the window has been offered to the spool
    finally:
        coll.proc.send_signal(signal.SIGCONT)
    kpfix.wait_for(lambda: re.search(r"capture complete run=%d " % run, agent.text()), 60,
                   "the agent's capture complete, acknowledged")
    # every batch the spool took is acknowledged (so stored) before the counts are read
    kpfix.wait_for(lambda: agent.metrics().get(("kprof_agent_batches_acked_total", None)) ==
                   agent.metrics().get(("kprof_agent_batches_spooled_total", None)), 60,
                   "every spooled batch acknowledged")
    m = agent.metrics()
    spool_batches = m.get(("kprof_agent_batches_dropped_total", "spool_full"), 0)
    agent_dropped = m.get(("kprof_agent_records_dropped_total", "agent"), 0)
    lib_dropped = m.get(("kprof_agent_records_dropped_total", "library"), 0)
    assert spool_batches > 0 and agent_dropped > 0, (
        "the spool (%s) refused nothing: the test needs it full; metrics %s" % (SPOOL_MAX, m))
    assert lib_dropped == LIB_DROPPED, m
    stored = [int(q("SELECT count(*) FROM %s WHERE run_id = %d" % (t, run)))
              for t in ("api_calls", "kernels", "steps")]
    dropped = q("SELECT records_dropped FROM ranks WHERE run_id = %d AND rank = 0" % run)
    assert dropped != "", "run %d has no ranks row (its RankInfo was refused with its batch)" % run
    dropped = int(dropped)
    print("spool %s: %d batches refused, %d rows; stored api/kernels/steps %s; "
          "ranks.records_dropped %d" % (SPOOL_MAX, spool_batches, agent_dropped, stored, dropped))
    assert dropped == agent_dropped + lib_dropped, (
        "ranks.records_dropped of run %d is %d, want the agent's spool drops %d + the library's "
        "%d" % (run, dropped, agent_dropped, lib_dropped))
    assert stored[2] == 0, (
        "run %d: the step row was stored, so the last batch got into the spool: the test "
        "wants it refused (a smaller --spool-max-bytes)" % run)
    produced = 2 * N_API + 1 + LIB_DROPPED  # the records, the step row, the library's drops
    assert sum(stored) + dropped == produced, (
        "run %d: %d rows stored + %d dropped != %d produced: records vanished" % (
            run, sum(stored), dropped, produced))
    # what `kprofctl status` shows: the drops, and why
    last = {}

    def terminal():
        rc, out, err = ctl(addr, "status", "--run", str(run), "--json")
        assert rc in (0, 1), (rc, out, err)
        last["r"] = json.loads(out)
        return [r["state"] for r in last["r"]] in (["done"], ["failed"])
    kpfix.wait_for(terminal, 30, "the rank's final state in kprofctl status")
    r = last["r"][0]
    print("kprofctl status: state %s dropped %d reason %r" % (r["state"], r["dropped"],
                                                               r["reason"]))
    assert r["state"] == "done" and r["dropped"] == dropped and r["reason"] and (
        "spool" in r["reason"]), (
        "kprofctl status of run %d: want the rank done with dropped=%d and a reason naming the "
        "spool, got %s" % (run, dropped, r))
    lib.close()


def main():
    shutil.rmtree(DIR, ignore_errors=True)
    os.makedirs(DIR)
    conninfo = kpfix.fresh_db(DB)
    port = kpfix.free_port()
    addr = "127.0.0.1:%d" % port
    coll = kpfix.Collectord("spool-drops-coll", conninfo, ["--listen", addr])
    agent = Agent(addr)
    try:
        test_spool_full(agent, coll, addr)
        print("ok spool full")
    except BaseException:
        print("--- agent log ---\n" + agent.text()[-20000:], file=sys.stderr)
        print("--- collectord log ---\n" + coll.log_text()[-5000:], file=sys.stderr)
        raise
    finally:
        assert agent.stop() == 0
        coll.stop()
    coll.assert_clean_log()
    shutil.rmtree(DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
