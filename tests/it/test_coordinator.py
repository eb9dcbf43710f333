#!/usr/bin/env python3
"""it.test_coordinator: one capture coordinator among several collectord replicas on one
PostgreSQL, elected through an advisory lock (docs/design.md "Coordinator election").

  two          two replicas: exactly one is the coordinator (the gauge), Control.Coordinator
               answers the same from both, the standby refuses the capture RPCs UNAVAILABLE
               naming the coordinator's address, and kprofctl jobs/start/status given the
               standby's address follow it; a real kprof-agent given the standby attaches to
               the coordinator
  failover     a capture of two ranks on two hosts is running; the coordinator is SIGKILLed;
               the standby takes over within a few seconds and adopts the capture; the agent
               of node-a reattaches and finishes its rank, node-b never comes back and its rank
               fails saying the coordinator changed and it did not reattach; the run ends
               (bounded: it never hangs); the real agent is attached again
  lock_lost    the coordinator's lock connection is terminated (pg_terminate_backend): it steps
               down and a coordinator is elected again, and never are two replicas
               coordinators at once (gauges sampled throughout)
  ingest_only  a --no-coordinator replica never becomes the coordinator, even alone, and then
               answers "no coordinator elected yet"
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import kpfix

kpfix.require_env()

import grpc  # noqa: E402
import kprof_pb2 as pb  # noqa: E402

DB = "kp_it_coordinator"
JOB = "ddp-coord"
RS = pb.RankState
K = pb.CaptureCommand
POLL = "200"  # --coordinator-poll-ms: the fence is then 200 ms + 1 s + 1 s
GRACE = "4s"  # --agent-grace
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
AGENT = os.path.join(kpfix.BIN, "agent", "kprof-agent")
DIR = os.path.join(kpfix.TEST_DIR, "coordinator-it")
PROCS = []


def collectord(name, extra=()):
    c = kpfix.Collectord(os.path.join("coordinator-it", name), CONNINFO,
                         ["--coordinator-poll-ms", POLL, "--agent-grace", GRACE,
                          "--log-level", "debug"] + list(extra))
    PROCS.append(c)
    return c


def metric(c, name):
    try:
        with urllib.request.urlopen("http://%s/metrics" % c.http, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = re.search(r"^kprof_collectord_%s (\d+)$" % name, text, re.M)
    assert m is not None, "no %s in the metrics of %s" % (name, c.grpc)
    return int(m.group(1))


def coordinator_info(addr):
    with grpc.insecure_channel(addr) as ch:
        f = ch.unary_unary("/kprof.v1.Control/Coordinator",
                           request_serializer=pb.CoordinatorRequest.SerializeToString,
                           response_deserializer=pb.CoordinatorInfo.FromString)
        return f(pb.CoordinatorRequest(), timeout=10)


def rpc_error(addr, method, req, resp):
    with grpc.insecure_channel(addr) as ch:
        f = ch.unary_unary("/kprof.v1.Control/" + method, request_serializer=req.SerializeToString,
                           response_deserializer=resp.FromString)
        try:
            f(req, timeout=10)
        except grpc.RpcError as e:
            return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def kprofctl(*args):
    p = subprocess.run([KPROFCTL] + list(args), capture_output=True, text=True,
                       timeout=60 * kpfix.SCALE)
    return p.returncode, p.stdout, p.stderr


def actives(colls):
    return [c for c in colls if c.proc.poll() is None and metric(c, "coordinator") == 1]


class FakeAgent(kpfix.AttachAgent):
    """kpfix.AttachAgent whose reported rank states carry steps, on a channel it owns."""

    def __init__(self, addr, host, agent_id, ranks):
        self.ch = grpc.insecure_channel(addr)
        super().__init__(self.ch, [], host, agent_id, JOB, ranks=ranks, world=2)

    def close(self):
        super().close()
        self.ch.close()


class RealAgent:
    def __init__(self, collector):
        os.makedirs(DIR, exist_ok=True)
        self.ready = os.path.join(DIR, "agent.ready")
        self.log_path = os.path.join(DIR, "agent.log")
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [AGENT, "--socket", os.path.join(DIR, "agent.sock"), "--socket-mode", "0600",
             "--collector", collector, "--spool-dir", os.path.join(DIR, "spool"),
             "--http-listen", "127.0.0.1:0", "--ready-file", self.ready, "--log-level", "debug"],
            stdout=self.log, stderr=subprocess.STDOUT)
        kpfix.wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30,
                       "kprof-agent ready")
        assert self.proc.poll() is None, "kprof-agent exited: " + self.text()
        addrs = dict(l.strip().split("=", 1) for l in open(self.ready) if "=" in l)
        self.http = addrs["http"]

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def attached(self):
        with urllib.request.urlopen("http://%s/metrics" % self.http, timeout=5) as r:
            m = re.search(r"^kprof_agent_attached (\d+)$", r.read().decode(), re.M)
        return m is not None and m.group(1) == "1"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def wait_cap(ctl_addr, run, pred, timeout, what):
    def get():
        with grpc.insecure_channel(ctl_addr) as ch:
            f = ch.unary_unary("/kprof.v1.Control/CaptureStatus",
                               request_serializer=pb.CaptureStatusRequest.SerializeToString,
                               response_deserializer=pb.CaptureStatusResponse.FromString)
            c = f(pb.CaptureStatusRequest(run_id=run), timeout=10).captures[0]
        return c if pred(c) else None
    return kpfix.wait_for(get, timeout, what)


def test_two(a, b, agent):
    """Returns (coordinator, standby)."""
    kpfix.wait_for(lambda: len(actives([a, b])) == 1, 10, "one coordinator")
    coord = actives([a, b])[0]
    standby = b if coord is a else a
    assert metric(standby, "coordinator") == 0
    ia, ib = coordinator_info(coord.grpc), coordinator_info(standby.grpc)
    assert ia.elected and ia.is_self and ib.elected and not ib.is_self, (ia, ib)
    assert (ia.address, ia.epoch, ia.pid, ia.since_ns) == (ib.address, ib.epoch, ib.pid,
                                                            ib.since_ns), (ia, ib)
    assert ia.address == coord.grpc and ia.pid == coord.proc.pid, (ia, coord.grpc)
    code, details = rpc_error(standby.grpc, "StartCapture", pb.StartCaptureRequest(job=JOB),
                              pb.Capture)
    assert code == grpc.StatusCode.UNAVAILABLE and \
        "not the capture coordinator; it is at %s" % coord.grpc in details, (code, details)
    code, details = rpc_error(standby.grpc, "ListJobs", pb.ListJobsRequest(),
                              pb.ListJobsResponse)
    assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
    # ingest and run RPCs work on the standby
    rc, out, err = kprofctl("runs", "--collector", standby.grpc, "--json")
    assert rc == 0, (rc, out, err)
    # the real agent, given the standby, attached to the coordinator
    kpfix.wait_for(agent.attached, 15, "the kprof-agent attached")
    assert "capture coordinator is at %s" % coord.grpc in agent.text(), agent.text()[-3000:]
    # kprofctl's capture verbs through the standby
    fa = FakeAgent(coord.grpc, "node-a", 0xA1, [0, 1])
    try:
        kpfix.wait_for(lambda: kprofctl("jobs", "--collector", standby.grpc, "--json")[1]
                       .count(JOB) > 0, 10, "kprofctl jobs via the standby listing " + JOB)
        rc, out, err = kprofctl("start", "--collector", standby.grpc, "--job", JOB, "--steps",
                                "2", "--json")
        assert rc == 0, (rc, out, err)
        run = json.loads(out)["run"]
        arm = fa.wait_arm(run)
        for r in (0, 1):
            fa.set_state(run, r, RS.RANK_STATE_DONE)
        wait_cap(coord.grpc, run, lambda c: c.run.state == pb.RUN_STATE_ENDED, 15,
                 "the capture through the standby ended")
        rc, out, err = kprofctl("status", "--collector", standby.grpc, "--run", str(run),
                                "--json")
        assert rc == 0 and "done" in out.lower(), (rc, out, err)
        assert arm.run_id == run
    finally:
        fa.close()
    print("ok two coordinator=%s standby=%s" % (coord.grpc, standby.grpc), flush=True)
    return coord, standby


def test_failover(coord, standby, agent):
    fa = FakeAgent(coord.grpc, "node-a", 0xA2, [0])
    fb = FakeAgent(coord.grpc, "node-b", 0xB2, [1])
    try:
        with grpc.insecure_channel(coord.grpc) as ch:
            start = ch.unary_unary("/kprof.v1.Control/StartCapture",
                                   request_serializer=pb.StartCaptureRequest.SerializeToString,
                                   response_deserializer=pb.Capture.FromString)
            kpfix.wait_for(lambda: len(re.findall("agent attached host=node-[ab]",
                                                  coord.log_text())) >= 2, 10,
                           "both fake agents attached")
            run = start(pb.StartCaptureRequest(job=JOB, steps=50, deadline_ms=60000),
                        timeout=10).run.id
        fa.wait_arm(run)
        fb.wait_arm(run)
        fa.set_state(run, 0, RS.RANK_STATE_CAPTURING)
        fb.set_state(run, 1, RS.RANK_STATE_CAPTURING)
        wait_cap(coord.grpc, run, lambda c: all(r.state == RS.RANK_STATE_CAPTURING
                                                for r in c.ranks), 10, "both ranks capturing")
        epoch = coordinator_info(coord.grpc).epoch
        # a kprofctl watch through the standby rides the failover out
        watch = subprocess.Popen([KPROFCTL, "status", "--collector", standby.grpc, "--run",
                                  str(run), "--watch", "--interval", "200ms", "--log-level",
                                  "debug"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        time.sleep(0.5)
        assert watch.poll() is None, watch.communicate()
        coord.proc.kill()  # SIGKILL, by pid
        coord.proc.wait()
        t0 = time.monotonic()
        kpfix.wait_for(lambda: metric(standby, "coordinator") == 1, 10,
                       "the standby taking over")
        took = time.monotonic() - t0
        info = coordinator_info(standby.grpc)
        assert info.is_self and info.epoch == epoch + 1 and info.address == standby.grpc, info
        assert metric(standby, "coordinator_takeovers_total") == 1
        # node-a reattaches to the new coordinator (as the agent does: it asks Coordinator)
        fa.close()
        fb.close()
        fa = FakeAgent(info.address, "node-a", 0xA2, [0])
        fa.set_state(run, 0, RS.RANK_STATE_CAPTURING)
        wait_cap(standby.grpc, run, lambda c: c.ranks[0].state == RS.RANK_STATE_CAPTURING, 10,
                 "the adopted capture in the new coordinator's memory")
        fa.set_state(run, 0, RS.RANK_STATE_DONE)
        c = wait_cap(standby.grpc, run, lambda c: c.run.state == pb.RUN_STATE_FAILED, 20,
                     "the adopted capture ended (node-b never came back)")
        r0, r1 = c.ranks
        assert r0.state == RS.RANK_STATE_DONE, r0
        assert r1.state == RS.RANK_STATE_FAILED and "coordinator changed" in r1.reason and \
            "node-b did not reattach" in r1.reason, r1
        assert "capture adopted run=%d" % run in standby.log_text()
        out, err = watch.communicate(timeout=30 * kpfix.SCALE)
        assert watch.returncode == 1 and "did not reattach" in out, (watch.returncode, out, err)
        # the real agent is attached again (to the new coordinator)
        kpfix.wait_for(agent.attached, 15, "the kprof-agent attached again")
    finally:
        fa.close()
    print("ok failover run=%d takeover_s=%.2f" % (run, took), flush=True)


def test_lock_lost(colls):
    coord = actives(colls)[0]
    before = metric(coord, "coordinator_step_downs_total")
    n = kpfix.psql("SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a JOIN "
                   "pg_locks l ON l.pid = a.pid WHERE a.application_name = "
                   "'kprof-collectord-coordinator' AND l.locktype = 'advisory' AND l.granted "
                   "AND a.datname = '%s'" % DB, db=DB)
    assert n.strip() == "1", n
    seen_two, elected_again = [], False
    end = time.monotonic() + 8 * kpfix.SCALE
    while time.monotonic() < end:
        act = actives(colls)
        if len(act) > 1:
            seen_two.append([c.grpc for c in act])
        if metric(coord, "coordinator_step_downs_total") > before and len(act) == 1:
            elected_again = True
        time.sleep(0.05)
    assert not seen_two, "two coordinators at once (%d samples): %s" % (len(seen_two), seen_two[:3])
    assert metric(coord, "coordinator_step_downs_total") == before + 1
    assert elected_again and len(actives(colls)) == 1, "no coordinator elected again"
    # the exact order, from the logs (one clock): the next coordinator began after the old one
    # stepped down
    down = re.findall(r"^(\S+) warn leader: stepped down as capture coordinator epoch=(\d+)",
                      coord.log_text(), re.M)
    assert down, coord.log_text()[-3000:]
    t_down, epoch = down[-1]
    up = [m for c in colls for m in re.findall(
        r"^(\S+) info leader: became capture coordinator epoch=%d " % (int(epoch) + 1),
        c.log_text(), re.M)]
    assert len(up) == 1 and up[0] > t_down, (
        "coordinator epoch %d began at %s, before epoch %s stepped down at %s" % (
            int(epoch) + 1, up, epoch, t_down))
    print("ok lock_lost now=%s" % actives(colls)[0].grpc, flush=True)


def test_ingest_only(ingest_only, colls):
    assert metric(ingest_only, "coordinator") == 0
    info = coordinator_info(ingest_only.grpc)
    assert info.elected and not info.is_self, info
    for c in colls:
        c.stop()
    kpfix.wait_for(lambda: not coordinator_info(ingest_only.grpc).elected, 10,
                   "no coordinator elected once the others are gone")
    time.sleep(1.5)
    assert metric(ingest_only, "coordinator") == 0
    code, details = rpc_error(ingest_only.grpc, "StartCapture",
                              pb.StartCaptureRequest(job=JOB), pb.Capture)
    assert code == grpc.StatusCode.UNAVAILABLE and "no coordinator is elected yet" in details, \
        (code, details)
    rc, out, err = kprofctl("runs", "--collector", ingest_only.grpc, "--json")
    assert rc == 0, (rc, out, err)
    # kprofctl quotes the answer (exit 5, unreachable), not "is collectord running?"
    rc, out, err = kprofctl("jobs", "--collector", ingest_only.grpc)
    assert rc == 5 and "answered UNAVAILABLE" in err and "no coordinator is elected yet" in err, \
        (rc, out, err)
    print("ok ingest_only", flush=True)


def main():
    global CONNINFO
    CONNINFO = kpfix.fresh_db(DB)
    agent = None
    try:
        a = collectord("a")
        b = collectord("b")
        d = collectord("d", ["--no-coordinator"])
        agent = RealAgent(b.grpc if metric(a, "coordinator") == 1 else a.grpc)
        coord, standby = test_two(a, b, agent)
        test_failover(coord, standby, agent)
        c = collectord("c")
        test_lock_lost([standby, c, d])
        test_ingest_only(d, [standby, c])
        agent.stop()
        for p in PROCS:
            p.stop()
            p.assert_clean_log()
    except BaseException:
        for p in PROCS:
            print("--- %s ---\n%s" % (p.log_path, p.log_text()[-5000:]), file=sys.stderr)
        if agent is not None:
            print("--- agent ---\n" + agent.text()[-4000:], file=sys.stderr)
        raise
    finally:
        if agent is not None:
            agent.stop()
        for p in PROCS:
            p.stop(signal.SIGKILL)


if __name__ == "__main__":
    main()
