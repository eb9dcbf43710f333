"""Ingest durability against a real PostgreSQL and the real kprof-collectord:
  1. several ranks stream at once; the rows in PostgreSQL equal what was sent, exactly
     (counts and sums of durations per rank and kind);
  2. a stream cut mid-way and retried from the start leaves no duplicates and no gaps;
  3. collectord SIGKILLed mid-stream and restarted loses nothing it acknowledged, and a
     producer that resends what it sent ends with exactly one copy of everything;
  4. --open-run-timeout: an open run whose producer stream stays open (idle) is left open; once
     the stream is gone, it is ended FAILED with the reason in runs.end_reason, and so is an
     open run that never got a batch; an ended run stays ended."""
import random
import signal
import sys
import threading
import time

import grpc

import kpfix

kpfix.require_env()
import kprof_pb2 as pb  # noqa: E402

DB = "kp_it_durability"
KERNEL_NAMES = ["volta_sgemm_128x64_nn", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >"]


def make_batch(run_id, rank, stream, seq, rng):
    """A batch of kernels, ops and API calls; returns (batch, {kind: (rows, sum_dur)})."""
    b = pb.Batch(run_id=run_id, rank=rank, stream=stream, seq=seq,
                 base_ns=1_760_000_000_000_000_000 + seq * 10_000_000)
    b.strings.extend([""] + KERNEL_NAMES + ["aten::mm", "cudaLaunchKernel"])
    nk = rng.randint(50, 200)
    k = b.kernels
    k.start_ns.extend(rng.randint(0, 3000) for _ in range(nk))
    kd = [rng.randint(1000, 900_000) for _ in range(nk)]
    k.dur_ns.extend(kd)
    k.name.extend(rng.randint(1, len(KERNEL_NAMES)) for _ in range(nk))
    k.correlation.extend(range(seq * 1000, seq * 1000 + nk))
    no = rng.randint(10, 40)
    o = b.ops
    o.start_ns.extend(rng.randint(0, 20000) for _ in range(no))
    od = [rng.randint(5000, 2_000_000) for _ in range(no)]
    o.dur_ns.extend(od)
    o.name.extend([len(KERNEL_NAMES) + 1] * no)
    o.seq.extend(rng.randint(-1, 10000) for _ in range(no))
    a = b.api_calls
    a.start_ns.extend(rng.randint(0, 3000) for _ in range(nk))
    ad = [rng.randint(2000, 9000) for _ in range(nk)]
    a.dur_ns.extend(ad)
    a.name.extend([len(KERNEL_NAMES) + 2] * nk)
    a.domain.extend([pb.API_DOMAIN_RUNTIME] * nk)
    return b, {"kernels": (nk, sum(kd)), "ops": (no, sum(od)), "api_calls": (nk, sum(ad))}


def add(tot, rank, kinds):
    for kind, (n, d) in kinds.items():
        r, s = tot.get((rank, kind), (0, 0))
        tot[(rank, kind)] = (r + n, s + d)


def stored(run_id):
    out = {}
    for kind in ("kernels", "ops", "api_calls"):
        rows = kpfix.psql("SELECT rank, count(*), sum(dur_ns) FROM %s WHERE run_id = %d "
                          "GROUP BY rank ORDER BY rank" % (kind, run_id), db=DB)
        for line in rows.splitlines():
            rank, n, d = map(int, line.split("|"))
            out[(rank, kind)] = (n, d)
    return out


def stubs(addr):
    st = kpfix.Stubs(addr)
    return st.channel, st.create, st.push


def test_concurrent_ranks(addr):
    ch, create, push = stubs(addr)
    run = create(pb.CreateRunRequest(job="it-concurrent", world_size=4), timeout=30)
    expected, acked, errors = {}, {}, []
    batches = {}
    for rank in range(4):
        rng = random.Random(rank)
        batches[rank] = []
        for seq in range(1, 61):
            b, kinds = make_batch(run.id, rank, 100 + rank, seq, rng)
            batches[rank].append(b)
            add(expected, rank, kinds)

    def stream(rank):
        try:
            acks = push(iter(batches[rank]), timeout=120)
            acked[rank] = sorted(r.seq for a in acks for r in a.batches)
        except grpc.RpcError as e:  # reported below
            errors.append((rank, e.code(), e.details()))

    threads = [threading.Thread(target=stream, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for rank in range(4):
        assert acked[rank] == list(range(1, 61)), (rank, acked[rank])
    assert stored(run.id) == expected, (stored(run.id), expected)
    ch.close()


def test_cut_and_retry(addr):
    ch, create, push = stubs(addr)
    run = create(pb.CreateRunRequest(job="it-cut", world_size=1), timeout=30)
    rng = random.Random(7)
    expected = {}
    all_batches = []
    for seq in range(1, 101):
        b, kinds = make_batch(run.id, 0, 5, seq, rng)
        all_batches.append(b)
        add(expected, 0, kinds)
    # Send the first 40, read a few acks, then cancel the call mid-stream.
    first = push(iter(all_batches[:40] + [None] * 0), timeout=60)
    got = 0
    for ack in first:
        got += len(ack.batches)
        if got >= 5:
            first.cancel()
            break
    # Retry everything from seq 1 on a new stream.
    acks = list(push(iter(all_batches), timeout=120))
    refs = [(r.seq, r.duplicate) for a in acks for r in a.batches]
    assert sorted(s for s, _ in refs) == list(range(1, 101)), refs
    assert any(d for _, d in refs), "the retried stream should have met stored batches"
    seqs = kpfix.psql("SELECT string_agg(seq::text, ',' ORDER BY seq) FROM ingest_batches "
                      "WHERE run_id = %d" % run.id, db=DB)
    assert seqs == ",".join(str(s) for s in range(1, 101)), seqs
    assert stored(run.id) == expected
    ch.close()


def test_kill_restart(conninfo):
    d = kpfix.Collectord("durability-kill", conninfo, ["--flush-interval", "5ms"])
    ch, create, push = stubs(d.grpc)
    run = create(pb.CreateRunRequest(job="it-kill", world_size=2), timeout=30)
    rng = random.Random(11)
    expected = {}
    batches = []
    for seq in range(1, 301):
        rank = seq % 2
        b, kinds = make_batch(run.id, rank, 9, seq, rng)
        batches.append(b)
        add(expected, rank, kinds)
    acked = set()
    killed = threading.Event()

    def gen():
        for b in batches:
            if killed.is_set():
                return
            yield b

    call = push(gen(), timeout=120)
    try:
        for ack in call:
            acked.update((r.rank, r.seq) for r in ack.batches)
            if len(acked) >= 40 and not killed.is_set():
                d.proc.send_signal(signal.SIGKILL)
                killed.set()
    except grpc.RpcError as e:
        assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                            grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), e
    d.stop()
    ch.close()
    assert killed.is_set() and len(acked) >= 40
    # Every acknowledged batch is in PostgreSQL.
    in_pg = set()
    for line in kpfix.psql("SELECT rank, seq FROM ingest_batches WHERE run_id = %d" % run.id,
                           db=DB).splitlines():
        r, s = map(int, line.split("|"))
        in_pg.add((r, s))
    missing = acked - in_pg
    assert not missing, "acknowledged but not stored: %s" % sorted(missing)[:10]
    # Restart and resend everything: exactly one copy of each batch.
    d2 = kpfix.Collectord("durability-kill2", conninfo)
    try:
        ch2, _, push2 = stubs(d2.grpc)
        acks = list(push2(iter(batches), timeout=120))
        refs = [r for a in acks for r in a.batches]
        assert len(refs) == 300
        dup = sum(1 for r in refs if r.duplicate)
        assert dup >= len(acked), (dup, len(acked))
        print("kill test: acked before kill=%d stored before restart=%d duplicates on resend=%d" % (len(acked), len(in_pg), dup))
        assert stored(run.id) == expected
        assert kpfix.psql("SELECT count(*) FROM ingest_batches WHERE run_id = %d" % run.id,
                          db=DB) == "300"
        ch2.close()
    finally:
        assert d2.stop() == 0
    d2.assert_clean_log()


def test_open_run_deadline(conninfo):
    d = kpfix.Collectord("durability-deadline", conninfo, ["--open-run-timeout", "2s"])
    ch, create, push = stubs(d.grpc)
    st = kpfix.Stubs(d.grpc)
    try:
        live = create(pb.CreateRunRequest(job="it-live", world_size=1), timeout=30)
        idle = create(pb.CreateRunRequest(job="it-idle", world_size=1), timeout=30)
        ended = create(pb.CreateRunRequest(job="it-ended", world_size=1), timeout=30)
        st.end(pb.EndRunRequest(run_id=ended.id), timeout=30)
        b, _ = make_batch(live.id, 0, 21, 1, random.Random(3))
        release = threading.Event()

        def gen():
            yield b
            release.wait(60)  # the stream stays open, idle, until released

        call = push(gen(), timeout=120)
        acks = []
        reader = threading.Thread(target=lambda: acks.extend(call), daemon=True)
        reader.start()
        state = lambda r: kpfix.psql("SELECT state FROM runs WHERE id = %d" % r, db=DB)
        kpfix.wait_for(lambda: state(idle.id) == "3", 30, "the run with no producer ended")
        reason = kpfix.psql("SELECT end_reason FROM runs WHERE id = %d" % idle.id, db=DB)
        assert "no live producer stream" in reason, reason
        time.sleep(5)  # 2.5 timeouts past its batch: the live stream keeps it open
        assert state(live.id) == "1", "a run with a live producer stream was ended"
        assert state(ended.id) == "2"
        release.set()
        reader.join(60)
        assert [r.seq for a in acks for r in a.batches] == [1], acks
        kpfix.wait_for(lambda: state(live.id) == "3", 30, "the run whose stream ended")
        assert state(ended.id) == "2" and kpfix.psql(
            "SELECT end_reason IS NULL FROM runs WHERE id = %d" % ended.id, db=DB) == "t"
        print("open-run deadline: idle run and stream-less run ended FAILED, live and ended "
              "runs kept")
    finally:
        st.close()
        ch.close()
        assert d.stop() == 0
    d.assert_clean_log()


def main():
    conninfo = kpfix.fresh_db(DB)
    d = kpfix.Collectord("durability", conninfo)
    try:
        test_concurrent_ranks(d.grpc)
        test_cut_and_retry(d.grpc)
    finally:
        rc = d.stop()
    assert rc == 0, d.log_text()
    d.assert_clean_log()
    test_kill_restart(conninfo)
    test_open_run_deadline(conninfo)
    print("ingest durability: 4 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
