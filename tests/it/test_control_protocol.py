#!/usr/bin/env python3
"""it.test_control_protocol: collectord's capture coordinator over real gRPC, driven by
Python grpcio clients that play the agents (so every message is under the test's control).

Two fake agents attach with Control.Attach and report the processes of a 4-rank job (ranks
0,1 on node-a, 2,3 on node-b); the test then checks, against the real collectord and
PostgreSQL:

  jobs         ListJobs groups the ranks by job with their hosts
  errors       unknown job NOT_FOUND, a rank outside the world size INVALID_ARGUMENT, bad rank
               lists and activities INVALID_ARGUMENT, metrics UNIMPLEMENTED, a rank with no
               agent FAILED_PRECONDITION, a job already capturing ALREADY_EXISTS; nothing of
               them leaves a run behind
  lifecycle    StartCapture --ranks 1-2: the run is created OPEN, only node-a gets ARM for
               rank 1 and node-b for rank 2 with the same future start step; reported states
               move pending -> capturing -> flushing -> done and CaptureStatus follows them
               (an older report never moves a rank back); when both are done the run is ENDED,
               the agents get FORGET, and captures/capture_ranks in PostgreSQL hold the final
               states; status of the ended run after a collectord restart comes from
               PostgreSQL
  failure      one rank reported FAILED with a reason: the other finishes, the run ends
               FAILED, the reason is kept
  stored       a rank reported DONE with a StreamMark (its batches acknowledged, maybe only by
               Kafka) stays FLUSHING until every marked batch is in ingest_batches; EndRun
               with marks answers UNAVAILABLE until then, INVALID_ARGUMENT for a bad mark
  stop         StopCapture sends STOP to both agents; the run ends once they report done
  agent_lost   an agent's call breaks mid-capture and stays away past --agent-grace: its rank
               fails with a reason naming the host; the run ends FAILED
  deadline     a capture whose ranks never finish fails them at its deadline
  bad_report   a malformed report ends only that agent's call (INVALID_ARGUMENT); the daemon
               keeps serving
  restart      a capture left open when collectord is killed is adopted by the next one, and
               fails once its agent has not reattached within the agent grace
"""
import os
import queue
import signal
import sys
import threading
import time

import kpfix

kpfix.require_env()

import grpc  # noqa: E402
import kprof_pb2 as pb  # noqa: E402

DB = "kp_it_control_proto"
JOB = "ddp-proto"
RS = pb.RankState
K = pb.CaptureCommand


def code_of(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return grpc.StatusCode.OK, ""


class FakeAgent:
    """One Attach call: reports go out from a queue, commands are collected."""

    def __init__(self, addr, host, agent_id, procs):
        self.host = host
        self.agent_id = agent_id
        self.procs = procs          # list of (rank, pid, step, step_ms)
        self.ranks = {}             # (run_id, rank) -> AgentCaptureRank fields
        self.commands = []
        self.cv = threading.Condition()
        self.q = queue.Queue()
        self.done = False
        self.error = None
        self.channel = grpc.insecure_channel(addr)
        attach = self.channel.stream_stream(
            "/kprof.v1.Control/Attach", request_serializer=lambda m: m,
            response_deserializer=pb.CaptureCommand.FromString)
        self.call = attach(self._requests())
        self.thread = threading.Thread(target=self._recv, daemon=True)
        self.thread.start()
        self.report()

    def _requests(self):
        while True:
            m = self.q.get()
            if m is None:
                return
            yield m

    def _recv(self):
        try:
            for cmd in self.call:
                with self.cv:
                    self.commands.append(cmd)
                    self.cv.notify_all()
        except grpc.RpcError as e:
            self.error = e
        with self.cv:
            self.done = True
            self.cv.notify_all()

    def msg(self, agent_id=None):
        r = pb.AgentReport(host=self.host, agent_id=agent_id or self.agent_id, version="test")
        for rank, pid, step, step_ms in self.procs:
            run = 0
            for (run_id, rk), st in self.ranks.items():
                if rk == rank and st["state"] in (RS.RANK_STATE_PENDING,
                                                  RS.RANK_STATE_CAPTURING):
                    run = run_id
            r.processes.add(job=JOB, rank=rank, local_rank=rank % 2, world_size=4, pid=pid,
                            device=rank % 2, step=step, step_ms=step_ms, step_age_ms=0,
                            run_id=run)
        for (run_id, rank), st in sorted(self.ranks.items()):
            r.ranks.add(run_id=run_id, rank=rank, **st)
        return r.SerializeToString()

    def report(self, raw=None):
        self.q.put(raw if raw is not None else self.msg())

    def set_rank(self, run_id, rank, state, **kw):
        st = dict(state=state, records=kw.get("records", 0), dropped=kw.get("dropped", 0),
                  reason=kw.get("reason", ""), pid=kw.get("pid", 100 + rank),
                  first_step=kw.get("first_step", -1), last_step=kw.get("last_step", -1))
        if "mark" in kw:
            st["mark"] = kw["mark"]
        self.ranks[(run_id, rank)] = st
        self.report()

    def wait_cmd(self, pred, what, timeout=15):
        deadline = time.monotonic() + timeout * kpfix.SCALE
        with self.cv:
            while True:
                for c in self.commands:
                    if pred(c):
                        return c
                left = deadline - time.monotonic()
                assert left > 0, "%s: no command %s; got %s" % (self.host, what, self.commands)
                self.cv.wait(left)

    def cmds(self, kind, run_id):
        with self.cv:
            return [c for c in self.commands if c.kind == kind and c.run_id == run_id]

    def close(self):
        self.q.put(None)
        self.call.cancel()
        self.thread.join(10)
        self.channel.close()


class Ctl:
    def __init__(self, addr):
        self.ch = grpc.insecure_channel(addr)

        def u(name, req, resp):
            return self.ch.unary_unary("/kprof.v1.Control/" + name,
                                       request_serializer=req.SerializeToString,
                                       response_deserializer=resp.FromString)
        self.jobs = u("ListJobs", pb.ListJobsRequest, pb.ListJobsResponse)
        self.start = u("StartCapture", pb.StartCaptureRequest, pb.Capture)
        self.stop = u("StopCapture", pb.StopCaptureRequest, pb.Capture)
        self.status = u("CaptureStatus", pb.CaptureStatusRequest, pb.CaptureStatusResponse)

    def cap(self, run_id):
        return self.status(pb.CaptureStatusRequest(run_id=run_id), timeout=10).captures[0]

    def states(self, run_id):
        return {r.rank: r.state for r in self.cap(run_id).ranks}

    def wait_run_state(self, run_id, state, timeout=20):
        return kpfix.wait_for(lambda: self.cap(run_id).run.state == state, timeout,
                              "run %d in state %d" % (run_id, state))

    def close(self):
        self.ch.close()


def runs_count():
    return int(kpfix.psql("SELECT count(*) FROM runs", db=DB))


def new_stack(conninfo, extra=()):
    coll = kpfix.Collectord(os.path.join("control-proto", "coll"), conninfo,
                            ["--agent-grace", "1s", "--log-level", "debug"] + list(extra))
    return coll


def main():
    conninfo = kpfix.fresh_db(DB)
    coll = new_stack(conninfo)
    agents = []
    ctl = None
    try:
        ctl = Ctl(coll.grpc)
        a = FakeAgent(coll.grpc, "node-a", 0xA1, [(0, 100, 40, 20), (1, 101, 42, 20)])
        b = FakeAgent(coll.grpc, "node-b", 0xB2, [(2, 102, 41, 25), (3, 103, 39, 25)])
        agents += [a, b]

        # jobs
        def jobs_ready():
            r = ctl.jobs(pb.ListJobsRequest(), timeout=10)
            return r if r.jobs and len(r.jobs[0].ranks) == 4 else None
        jobs = kpfix.wait_for(jobs_ready, 10, "both agents' processes in ListJobs")
        j = jobs.jobs[0]
        assert j.name == JOB and j.world_size == 4 and j.hosts == 2 and j.run_id == 0, j
        assert [(r.rank, r.host, r.pid) for r in j.ranks] == [
            (0, "node-a", 100), (1, "node-a", 101), (2, "node-b", 102), (3, "node-b", 103)], j
        assert not ctl.jobs(pb.ListJobsRequest(job="nope"), timeout=10).jobs
        print("ok jobs", flush=True)

        # errors
        S = grpc.StatusCode
        cases = [
            (pb.StartCaptureRequest(job="nope"), S.NOT_FOUND, "not registered"),
            (pb.StartCaptureRequest(job=JOB, ranks="7"), S.INVALID_ARGUMENT, "world size 4"),
            (pb.StartCaptureRequest(job=JOB, ranks="1-x"), S.INVALID_ARGUMENT, "not a rank list"),
            (pb.StartCaptureRequest(job=JOB, ranks="2-1"), S.INVALID_ARGUMENT, "not a rank list"),
            (pb.StartCaptureRequest(job=JOB, activities="kernel,gpu"), S.INVALID_ARGUMENT,
             "gpu"),
            (pb.StartCaptureRequest(job=JOB, metrics=["sm__inst"]), S.UNIMPLEMENTED, "metrics"),
            (pb.StartCaptureRequest(job=JOB, steps=100001), S.INVALID_ARGUMENT, "steps"),
            (pb.StartCaptureRequest(job=""), S.INVALID_ARGUMENT, "job is required"),
        ]
        for req, want, text in cases:
            code, details = code_of(ctl.start, req, timeout=10)
            assert code == want and text in details, (req, code, details)
        assert runs_count() == 0, "a refused StartCapture left a run"
        # a rank without an agent: node-b's agent reports only rank 2 for a moment
        b.procs = [(2, 102, 41, 25)]
        b.report()
        kpfix.wait_for(lambda: len(ctl.jobs(pb.ListJobsRequest(), timeout=10).jobs[0].ranks) == 3,
                       10, "rank 3 gone from ListJobs")
        code, details = code_of(ctl.start, pb.StartCaptureRequest(job=JOB), timeout=10)
        assert code == S.FAILED_PRECONDITION and "rank(s) 3 of job" in details, (code, details)
        b.procs = [(2, 102, 41, 25), (3, 103, 39, 25)]
        b.report()
        kpfix.wait_for(lambda: len(ctl.jobs(pb.ListJobsRequest(), timeout=10).jobs[0].ranks) == 4,
                       10, "rank 3 back")
        assert runs_count() == 0
        print("ok errors", flush=True)

        # lifecycle
        cap = ctl.start(pb.StartCaptureRequest(job=JOB, ranks="1-2", steps=3, name="proto"),
                        timeout=10)
        run = cap.run.id
        assert run > 0 and cap.run.state == pb.RUN_STATE_OPEN and cap.steps == 3, cap
        assert [(r.rank, r.host, r.state) for r in cap.ranks] == [
            (1, "node-a", RS.RANK_STATE_PENDING), (2, "node-b", RS.RANK_STATE_PENDING)], cap
        # start step: ahead of the most advanced selected rank (42) by warm-up + margin
        assert cap.start_step >= 44, cap.start_step
        assert kpfix.psql("SELECT state, source, world_size, name FROM runs WHERE id=%d" % run,
                          db=DB) == "1|1|4|proto"
        arm_a = a.wait_cmd(lambda c: c.kind == K.KIND_ARM and c.run_id == run, "ARM")
        arm_b = b.wait_cmd(lambda c: c.kind == K.KIND_ARM and c.run_id == run, "ARM")
        assert list(arm_a.ranks) == [1] and list(arm_b.ranks) == [2], (arm_a, arm_b)
        assert arm_a.start_step == arm_b.start_step == cap.start_step and arm_a.steps == 3
        assert arm_a.job == JOB and arm_a.world_size == 4 and arm_a.activities == 0x7f
        assert kpfix.psql("SELECT string_agg(rank || ':' || state, ',' ORDER BY rank) FROM "
                          "capture_ranks WHERE run_id=%d" % run, db=DB) == "1:1,2:1"
        # a second start while it runs
        code, details = code_of(ctl.start, pb.StartCaptureRequest(job=JOB, ranks="0"), timeout=10)
        assert code == S.ALREADY_EXISTS and "run %d" % run in details, (code, details)
        assert ctl.jobs(pb.ListJobsRequest(), timeout=10).jobs[0].run_id == run
        s0 = cap.start_step
        a.set_rank(run, 1, RS.RANK_STATE_CAPTURING, first_step=s0)
        kpfix.wait_for(lambda: ctl.states(run)[1] == RS.RANK_STATE_CAPTURING, 10, "capturing")
        assert ctl.states(run)[2] == RS.RANK_STATE_PENDING
        b.set_rank(run, 2, RS.RANK_STATE_CAPTURING, first_step=s0)
        a.set_rank(run, 1, RS.RANK_STATE_FLUSHING, records=500, first_step=s0, last_step=s0 + 2)
        kpfix.wait_for(lambda: ctl.states(run) == {1: RS.RANK_STATE_FLUSHING,
                                                   2: RS.RANK_STATE_CAPTURING}, 10, "flushing")
        # an older picture does not move a rank back
        a.set_rank(run, 1, RS.RANK_STATE_PENDING)
        time.sleep(0.3)
        assert ctl.states(run)[1] == RS.RANK_STATE_FLUSHING
        a.set_rank(run, 1, RS.RANK_STATE_DONE, records=500, dropped=2, first_step=s0,
                   last_step=s0 + 2)
        kpfix.wait_for(lambda: ctl.states(run)[1] == RS.RANK_STATE_DONE, 10, "done")
        assert ctl.cap(run).run.state == pb.RUN_STATE_OPEN, "ended before every rank was done"
        b.set_rank(run, 2, RS.RANK_STATE_DONE, records=700, first_step=s0, last_step=s0 + 2)
        ctl.wait_run_state(run, pb.RUN_STATE_ENDED)
        a.wait_cmd(lambda c: c.kind == K.KIND_FORGET and c.run_id == run, "FORGET")
        b.wait_cmd(lambda c: c.kind == K.KIND_FORGET and c.run_id == run, "FORGET")
        assert not a.cmds(K.KIND_ARM, run)[1:], "ARM sent twice to an agent that knew it"
        rows = kpfix.psql_rows("SELECT rank, state, host, records, dropped, first_step, "
                               "last_step FROM capture_ranks WHERE run_id=%d ORDER BY rank" % run,
                               db=DB)
        assert rows == [("1", "4", "node-a", "500", "2", str(s0), str(s0 + 2)),
                        ("2", "4", "node-b", "700", "0", str(s0), str(s0 + 2))], rows
        assert kpfix.psql("SELECT state FROM runs WHERE id=%d" % run, db=DB) == "2"
        assert ctl.jobs(pb.ListJobsRequest(), timeout=10).jobs[0].run_id == 0
        print("ok lifecycle run=%d start_step=%d" % (run, s0), flush=True)

        # failure: one rank fails, the other finishes
        cap = ctl.start(pb.StartCaptureRequest(job=JOB, ranks="0,3", steps=2), timeout=10)
        run2 = cap.run.id
        a.wait_cmd(lambda c: c.kind == K.KIND_ARM and c.run_id == run2, "ARM")
        b.wait_cmd(lambda c: c.kind == K.KIND_ARM and c.run_id == run2, "ARM")
        b.set_rank(run2, 3, RS.RANK_STATE_FAILED, reason="process 103 exited during the window")
        kpfix.wait_for(lambda: ctl.states(run2)[3] == RS.RANK_STATE_FAILED, 10, "failed")
        assert ctl.cap(run2).run.state == pb.RUN_STATE_OPEN
        a.set_rank(run2, 0, RS.RANK_STATE_DONE, records=10)
        ctl.wait_run_state(run2, pb.RUN_STATE_FAILED)
        r3 = [r for r in ctl.cap(run2).ranks if r.rank == 3][0]
        assert r3.reason == "process 103 exited during the window", r3
        print("ok failure run=%d" % run2, flush=True)

        # stored: DONE with a StreamMark (an agent behind --sink kafka: acknowledged is not
        # yet stored) stays FLUSHING until every marked batch is in ingest_batches
        import random
        import test_ingest_durability as tid
        cap = ctl.start(pb.StartCaptureRequest(job=JOB, ranks="0,2", steps=2), timeout=10)
        run7 = cap.run.id
        a.wait_cmd(lambda c: c.kind == K.KIND_ARM and c.run_id == run7, "ARM")
        b.wait_cmd(lambda c: c.kind == K.KIND_ARM and c.run_id == run7, "ARM")
        # the agent's spool stream carries other ranks too: rank 0's batches are seqs 5, 7, 9
        mark = pb.StreamMark(rank=0, stream=77, first_seq=5, last_seq=9, count=3)
        a.set_rank(run7, 0, RS.RANK_STATE_DONE, records=30, mark=mark)
        b.set_rank(run7, 2, RS.RANK_STATE_DONE, records=20)
        kpfix.wait_for(lambda: ctl.states(run7) == {0: RS.RANK_STATE_FLUSHING,
                                                    2: RS.RANK_STATE_DONE}, 10,
                       "rank 0 flushing while its batches are not stored")
        rng = random.Random(7)
        stubs = kpfix.Stubs(coll.grpc)
        try:
            def push(*keys):
                acks = list(stubs.push(iter([tid.make_batch(run7, r, 77, q, rng)[0]
                                             for r, q in keys]), timeout=30))
                assert sum(len(x.batches) for x in acks) == len(keys), acks
            push((0, 5), (2, 6), (0, 7))  # rank 2's seq 6 on the same stream does not count
            time.sleep(1.0)
            assert ctl.states(run7)[0] == RS.RANK_STATE_FLUSHING, "DONE with a batch missing"
            assert ctl.cap(run7).run.state == pb.RUN_STATE_OPEN
            push((0, 9))
        finally:
            stubs.close()
        ctl.wait_run_state(run7, pb.RUN_STATE_ENDED)
        assert ctl.states(run7) == {0: RS.RANK_STATE_DONE, 2: RS.RANK_STATE_DONE}
        # EndRun with marks waits the same way (UNAVAILABLE until stored)
        stubs = kpfix.Stubs(coll.grpc)
        try:
            r8 = stubs.create(pb.CreateRunRequest(job="marks", world_size=1), timeout=10).id
            list(stubs.push(iter([tid.make_batch(r8, 0, 5, 1, rng)[0]]), timeout=30))
            m = pb.StreamMark(rank=-1, stream=5, first_seq=1, last_seq=2, count=2)
            kpfix.expect_rpc_error(lambda: stubs.end(pb.EndRunRequest(run_id=r8, marks=[m]),
                                                     timeout=10),
                                   grpc.StatusCode.UNAVAILABLE, "1 batches of 1 producer streams")
            bad = pb.StreamMark(rank=-1, stream=5, first_seq=3, last_seq=2, count=1)
            kpfix.expect_rpc_error(lambda: stubs.end(pb.EndRunRequest(run_id=r8, marks=[bad]),
                                                     timeout=10),
                                   grpc.StatusCode.INVALID_ARGUMENT, "marks[0]")
            assert kpfix.psql("SELECT state FROM runs WHERE id=%d" % r8, db=DB) == "1"
            list(stubs.push(iter([tid.make_batch(r8, 0, 5, 2, rng)[0]]), timeout=30))
            assert stubs.end(pb.EndRunRequest(run_id=r8, marks=[m]), timeout=10).state == \
                pb.RUN_STATE_ENDED
        finally:
            stubs.close()
        print("ok stored run=%d" % run7, flush=True)

        # stop
        cap = ctl.start(pb.StartCaptureRequest(job=JOB, steps=1000), timeout=10)
        run3 = cap.run.id
        assert len(cap.ranks) == 4
        code, details = code_of(ctl.stop, pb.StopCaptureRequest(run_id=9999), timeout=10)
        assert code == S.NOT_FOUND, (code, details)
        code, details = code_of(ctl.stop, pb.StopCaptureRequest(), timeout=10)
        assert code == S.INVALID_ARGUMENT, (code, details)
        st = ctl.stop(pb.StopCaptureRequest(job=JOB), timeout=10)
        assert st.run.id == run3 and st.stopped
        a.wait_cmd(lambda c: c.kind == K.KIND_STOP and c.run_id == run3, "STOP")
        b.wait_cmd(lambda c: c.kind == K.KIND_STOP and c.run_id == run3, "STOP")
        for ag, ranks in ((a, (0, 1)), (b, (2, 3))):
            for r in ranks:
                ag.ranks[(run3, r)] = dict(state=RS.RANK_STATE_DONE, records=0, dropped=0,
                                           reason="stopped before its window began", pid=0,
                                           first_step=-1, last_step=-1)
            ag.report()
        ctl.wait_run_state(run3, pb.RUN_STATE_ENDED)
        assert kpfix.psql("SELECT stopped FROM captures WHERE run_id=%d" % run3, db=DB) == "t"
        print("ok stop run=%d" % run3, flush=True)

        # agent lost: node-b's call breaks and does not come back within --agent-grace
        cap = ctl.start(pb.StartCaptureRequest(job=JOB, ranks="1,2", steps=2), timeout=10)
        run4 = cap.run.id
        b.wait_cmd(lambda c: c.kind == K.KIND_ARM and c.run_id == run4, "ARM")
        a.set_rank(run4, 1, RS.RANK_STATE_CAPTURING)
        b.close()
        agents.remove(b)
        a.set_rank(run4, 1, RS.RANK_STATE_DONE, records=5)
        ctl.wait_run_state(run4, pb.RUN_STATE_FAILED)
        r2 = [r for r in ctl.cap(run4).ranks if r.rank == 2][0]
        assert r2.state == RS.RANK_STATE_FAILED and "node-b" in r2.reason, r2
        kpfix.wait_for(lambda: len(ctl.jobs(pb.ListJobsRequest(), timeout=10).jobs[0].ranks) == 2,
                       10, "node-b's ranks gone from ListJobs")
        print("ok agent_lost run=%d" % run4, flush=True)

        # deadline
        cap = ctl.start(pb.StartCaptureRequest(job=JOB, ranks="0", steps=2, deadline_ms=1500),
                        timeout=10)
        run5 = cap.run.id
        ctl.wait_run_state(run5, pb.RUN_STATE_FAILED)
        r0 = ctl.cap(run5).ranks[0]
        assert "deadline" in r0.reason, r0
        a.wait_cmd(lambda c: c.kind == K.KIND_STOP and c.run_id == run5, "STOP at deadline")
        print("ok deadline run=%d" % run5, flush=True)

        # bad report: only that call ends
        bad = FakeAgent(coll.grpc, "node-x", 0xC3, [])
        agents.append(bad)
        bad.report(b"\x0a\x02\xff\xfe" + b"\x10\x05")  # host is not UTF-8
        kpfix.wait_for(lambda: bad.done, 10, "the bad agent's call to end")
        assert bad.error is not None and bad.error.code() == S.INVALID_ARGUMENT, bad.error
        assert ctl.jobs(pb.ListJobsRequest(), timeout=10).jobs
        print("ok bad_report", flush=True)

        # restart: a capture left open is adopted by the next collectord; its agent does not
        # come back, so it fails once the agent grace has passed, saying why
        cap = ctl.start(pb.StartCaptureRequest(job=JOB, ranks="0", steps=2), timeout=10)
        run6 = cap.run.id
        for ag in agents:
            ag.close()
        agents.clear()
        ctl.close()
        ctl = None
        coll.stop(signal.SIGKILL)
        coll = new_stack(conninfo)
        ctl = Ctl(coll.grpc)
        kpfix.wait_for(lambda: ctl.cap(run6).run.state == pb.RUN_STATE_FAILED, 20,
                       "the orphaned capture marked failed")
        r0 = ctl.cap(run6).ranks[0]
        assert r0.state == RS.RANK_STATE_FAILED and "coordinator changed" in r0.reason and \
            "node-a did not reattach" in r0.reason, r0
        # an ended capture's status from PostgreSQL
        c1 = ctl.cap(run)
        assert c1.run.state == pb.RUN_STATE_ENDED and [r.records for r in c1.ranks] == [500, 700]
        code, details = code_of(ctl.status, pb.CaptureStatusRequest(run_id=424242), timeout=10)
        assert code == S.NOT_FOUND and "no run" in details, (code, details)
        print("ok restart run=%d" % run6, flush=True)
        rc = coll.stop()
        assert rc == 0, "collectord exited %s" % rc
        coll.assert_clean_log()
    except BaseException:
        print(coll.log_text()[-6000:], file=sys.stderr)
        raise
    finally:
        for ag in agents:
            ag.close()
        if ctl is not None:
            ctl.close()
        coll.stop()
        kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
