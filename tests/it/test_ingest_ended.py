"""A run that has ended takes no new batches, against a real PostgreSQL and kprof-collectord:
  1. a batch with a new sequence pushed into an ENDED run is refused with FAILED_PRECONDITION
     (run R ended at ...; start a new run), stores nothing, the run stays ENDED, the refusal is
     logged once for the stream, and a stream of another run that is open at the same time
     goes on and stores everything;
  2. a producer's resend of batches it sent before the end is acknowledged as duplicate and
     stores nothing twice; an older batch that had not arrived by the end (its seq under the
     highest its stream stored) is still taken; the first new seq after them is refused;
  3. a FAILED run likewise;
  4. in a capture run (where a restarted collectord ends the run before the agent is back to
     send what it spooled), a batch whose events start before the end is taken, a later one
     refused;
  5. EndRun while a stream is pushing: whatever was acknowledged is stored, exactly, the rest
     is refused, and the run's keys do not change after the end."""
import queue
import sys
import threading
import time

import grpc

import kpfix

kpfix.require_env()
import kprof_pb2 as pb  # noqa: E402

DB = "kp_it_ingest_ended"
FP = grpc.StatusCode.FAILED_PRECONDITION


def batch(run_id, rank, stream, seq, n=20):
    """A batch of n kernels whose durations name its key (so a stored copy is countable)."""
    b = pb.Batch(run_id=run_id, rank=rank, stream=stream, seq=seq,
                 base_ns=1_760_000_000_000_000_000 + seq * 10_000_000)
    b.strings.extend(["", "volta_sgemm_128x64_nn"])
    b.kernels.start_ns.extend([1000] * n)
    b.kernels.dur_ns.extend([seq * 100 + i for i in range(n)])
    b.kernels.name.extend([1] * n)
    return b


def rows(run_id):
    return int(kpfix.psql("SELECT count(*) FROM kernels WHERE run_id = %d" % run_id, db=DB))


def keys(run_id):
    out = kpfix.psql("SELECT string_agg(rank || ':' || stream || ':' || seq, ',' "
                     "ORDER BY rank, stream, seq) FROM ingest_batches WHERE run_id = %d" % run_id,
                     db=DB)
    return out.split(",") if out else []


def state(run_id):
    return int(kpfix.psql("SELECT state FROM runs WHERE id = %d" % run_id, db=DB))


def push_all(push, batches):
    """Pushes batches on one stream; returns ([(seq, duplicate)] acknowledged, error or None)."""
    refs = []
    try:
        for ack in push(iter(batches), timeout=60):
            refs.extend((r.seq, r.duplicate) for r in ack.batches)
    except grpc.RpcError as e:
        return refs, e
    return refs, None


def assert_refused(err, run_id, word):
    assert err is not None, "the batch into the %s run was taken" % word
    assert err.code() == FP, (err.code(), err.details())
    d = err.details()
    assert ("run %d %s at " % (run_id, word)) in d and "start a new run" in d, d


def test_ended_run(st, d):
    run = st.create(pb.CreateRunRequest(job="it-ended", world_size=2), timeout=30)
    other = st.create(pb.CreateRunRequest(job="it-ended-other", world_size=1), timeout=30)
    refs, err = push_all(st.push, [batch(run.id, 0, 10, s) for s in (1, 2, 3, 5)])
    assert err is None and refs == [(1, False), (2, False), (3, False), (5, False)], (refs, err)
    before_rows, before_keys = rows(run.id), keys(run.id)
    # A stream of an open run, pushing before, during and after the refusals.
    q = queue.Queue()
    other_refs = []

    def gen():
        while (b := q.get()) is not None:
            yield b
    other_call = st.push(gen(), timeout=60)
    reader = threading.Thread(target=lambda: other_refs.extend(
        r.seq for a in other_call for r in a.batches))
    reader.start()
    q.put(batch(other.id, 0, 20, 1))
    kpfix.wait_for(lambda: other_refs == [1], 30, "the open run's first ack")

    ended = st.end(pb.EndRunRequest(run_id=run.id), timeout=30)
    assert ended.state == pb.RUN_STATE_ENDED
    # 1: new sequences, on the same stream id and on a new one, are refused.
    log_before = d.log_text().count("run %d ended at" % run.id)
    refs, err = push_all(st.push, [batch(run.id, 0, 10, s) for s in (6, 7, 8)])
    assert refs == [], refs
    assert_refused(err, run.id, "ended")
    assert d.log_text().count("run %d ended at" % run.id) - log_before == 1, \
        "the refusal should be logged once for the stream:\n" + d.log_text()
    refs, err = push_all(st.push, [batch(run.id, 1, 11, 1)])
    assert refs == [], refs
    assert_refused(err, run.id, "ended")
    assert rows(run.id) == before_rows and keys(run.id) == before_keys, keys(run.id)
    assert state(run.id) == pb.RUN_STATE_ENDED
    q.put(batch(other.id, 0, 20, 2))
    kpfix.wait_for(lambda: other_refs == [1, 2], 30, "the open run's second ack")

    # 2: the producer reconnects and resends what it had sent (acknowledged or not: seq 4
    # never arrived, 5 did), then a batch made after the end.
    refs, err = push_all(st.push, [batch(run.id, 0, 10, s) for s in (1, 2, 3, 4, 5, 6)])
    assert refs == [(1, True), (2, True), (3, True), (4, False), (5, True)], refs
    assert_refused(err, run.id, "ended")
    assert rows(run.id) == before_rows + 20, (rows(run.id), before_rows)
    assert keys(run.id) == ["0:10:%d" % s for s in (1, 2, 3, 4, 5)], keys(run.id)
    assert state(run.id) == pb.RUN_STATE_ENDED

    q.put(batch(other.id, 0, 20, 3))
    q.put(None)
    reader.join(60)
    assert other_refs == [1, 2, 3], other_refs
    assert rows(other.id) == 60 and state(other.id) == pb.RUN_STATE_OPEN
    print("ended run: new batches refused, resends acknowledged as duplicates, the open run's "
          "stream unharmed")


def test_failed_run(st):
    run = st.create(pb.CreateRunRequest(job="it-failed", world_size=1), timeout=30)
    refs, err = push_all(st.push, [batch(run.id, 0, 30, s) for s in (1, 2)])
    assert err is None and len(refs) == 2, (refs, err)
    failed = st.end(pb.EndRunRequest(run_id=run.id, failed=True), timeout=30)
    assert failed.state == pb.RUN_STATE_FAILED
    refs, err = push_all(st.push, [batch(run.id, 0, 30, s) for s in (2, 3)])
    assert refs == [(2, True)], refs
    assert_refused(err, run.id, "failed")
    assert rows(run.id) == 40 and keys(run.id) == ["0:30:1", "0:30:2"], keys(run.id)
    assert state(run.id) == pb.RUN_STATE_FAILED
    print("failed run: new batches refused, resends acknowledged")


def test_capture_run(st):
    run = st.create(pb.CreateRunRequest(job="it-capture", world_size=1,
                                        source=pb.RUN_SOURCE_CAPTURE), timeout=30)
    ended = st.end(pb.EndRunRequest(run_id=run.id, failed=True), timeout=30)
    spooled = batch(run.id, 0, 60, 1)
    spooled.base_ns = ended.ended_ns - 5_000_000_000
    refs, err = push_all(st.push, [spooled])
    assert err is None and refs == [(1, False)], (refs, err)
    late = batch(run.id, 0, 60, 2)
    late.base_ns = ended.ended_ns + 5_000_000_000
    refs, err = push_all(st.push, [late])
    assert refs == [], refs
    assert_refused(err, run.id, "failed")
    assert keys(run.id) == ["0:60:1"] and rows(run.id) == 20, keys(run.id)
    print("capture run: a batch from before the end taken, one from after refused")


def test_end_while_pushing(st):
    run = st.create(pb.CreateRunRequest(job="it-race", world_size=1), timeout=30)
    batches = [batch(run.id, 0, 40, s, n=5) for s in range(1, 401)]
    acked = []
    err = None

    def gen():  # paced, so that the end lands mid-stream
        for b in batches:
            time.sleep(0.002)
            yield b
    call = st.push(gen(), timeout=120)
    try:
        for ack in call:
            acked.extend(r.seq for r in ack.batches)
            if len(acked) >= 20 and state(run.id) == pb.RUN_STATE_OPEN:
                st.end(pb.EndRunRequest(run_id=run.id), timeout=30)
    except grpc.RpcError as e:
        err = e
    assert state(run.id) == pb.RUN_STATE_ENDED
    stored = keys(run.id)
    # The flushes commit in order, so what was taken is a prefix, exactly what was
    # acknowledged, with each batch's rows once.
    assert stored == ["0:40:%d" % s for s in sorted(acked)], (stored[-3:], acked[-3:])
    assert sorted(acked) == list(range(1, len(acked) + 1)), acked
    assert rows(run.id) == 5 * len(acked)
    assert len(acked) < 400, "the end came ~20 batches in, yet every batch was taken"
    assert_refused(err, run.id, "ended")
    # A resend of everything: the stored prefix is acknowledged, the rest refused.
    refs, err2 = push_all(st.push, batches)
    assert refs == [(s, True) for s in sorted(acked)], refs[-3:]
    assert_refused(err2, run.id, "ended")
    assert keys(run.id) == stored and rows(run.id) == 5 * len(acked)
    print("EndRun while pushing: %d of 400 batches taken before the end, the rest refused"
          % len(acked))


def main():
    conninfo = kpfix.fresh_db(DB)
    d = kpfix.Collectord("ingest-ended", conninfo, ["--flush-interval", "2ms"])
    st = kpfix.Stubs(d.grpc)
    try:
        test_ended_run(st, d)
        test_failed_run(st)
        test_capture_run(st)
        test_end_while_pushing(st)
    finally:
        st.close()
        rc = d.stop()
    assert rc == 0, d.log_text()
    d.assert_clean_log()
    print("ingest into ended runs: 4 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
