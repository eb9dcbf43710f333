"""One Push stream cannot hold the whole of collectord's queue.

kprof-collectord runs with --queue-max-bytes 8MiB; PostgreSQL's kernels table is locked by an
open transaction, so no flush can commit. One grpcio stream pushes 60 batches of 20,000
kernels each (about 12 MiB encoded) and reads no acks. Then:
  - the stream stops being read (stream_pauses_total counts it) with at most a quarter of the
    queue (2 MiB) plus one batch waiting for PostgreSQL (queued_bytes), not the whole 8 MiB;
  - a second stream's batch is still taken into the queue meanwhile;
  - once the lock is released every batch of both streams is acknowledged and stored."""
import threading
import time
import urllib.request

import kpfix

kpfix.require_env()
import grpc  # noqa: E402
import kprof_pb2 as pb  # noqa: E402
from test_grpcio_interop import batch  # noqa: E402

DB = "kp_it_ingest_share"
N, ROWS = 60, 20000
QUEUE = 8 << 20


def metric(cd, name):
    text = urllib.request.urlopen("http://%s/metrics" % cd.http, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("kprof_collectord_" + name + " "):
            return int(line.split()[1])
    raise AssertionError(name + " not in /metrics:\n" + text)


def main():
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_ingest_share", ci, extra=["--queue-max-bytes", "8MiB"])
    lock = None
    try:
        st = kpfix.Stubs(cd.grpc)
        run = st.create(pb.CreateRunRequest(job="share", name="one", world_size=2), timeout=30)
        size = len(batch(run.id, 0, 1, n=ROWS).SerializeToString())
        lock = kpfix.subprocess.Popen([kpfix.PSQL, ci, "-qtAX", "-v", "ON_ERROR_STOP=1"],
                                      stdin=kpfix.subprocess.PIPE, stdout=kpfix.subprocess.PIPE,
                                      text=True)
        lock.stdin.write("BEGIN; LOCK TABLE kernel_rows IN ACCESS EXCLUSIVE MODE; SELECT 'locked';\n")
        lock.stdin.flush()
        assert lock.stdout.readline().strip() == "locked"
        acks = {}

        def push(rank, n):
            got = list(st.push(iter([batch(run.id, rank, i, n=ROWS) for i in range(1, n + 1)]),
                               timeout=120))
            acks[rank] = sorted(a.seq for ack in got for a in ack.batches)

        # The acks of rank 0 are read only at the end (list() waits for the call to end).
        t0 = threading.Thread(target=push, args=(0, N))
        t0.start()
        kpfix.wait_for(lambda: metric(cd, "stream_pauses_total") >= 1, 30,
                       "the stream to stop being read")
        time.sleep(1.0)
        queued = metric(cd, "queued_bytes")
        assert queued <= QUEUE // 4 + 2 * size, (queued, size)
        received = metric(cd, "batches_received_total")
        assert received < N, received
        before = metric(cd, "queued_batches")
        t1 = threading.Thread(target=push, args=(1, 1))
        t1.start()
        kpfix.wait_for(lambda: metric(cd, "queued_batches") > before, 30,
                       "another stream's batch to be queued")
        lock.stdin.write("COMMIT;\n")
        lock.stdin.close()
        lock.wait(30)
        t0.join(120)
        t1.join(120)
        assert acks.get(0) == list(range(1, N + 1)), acks.get(0)
        assert acks.get(1) == [1], acks.get(1)
        stored = kpfix.psql("SELECT count(*) FROM kernels WHERE run_id = %d" % run.id, db=DB)
        assert int(stored) == (N + 1) * ROWS, stored
        st.close()
    finally:
        if lock is not None and lock.poll() is None:
            lock.kill()
            lock.wait()
        rc = cd.stop()
    assert rc == 0, cd.log_text()
    print("ingest share: %d bytes queued for one stream (batch %d bytes, queue %d), "
          "%d of %d batches read while PostgreSQL was locked" % (queued, size, QUEUE, received, N))


if __name__ == "__main__":
    main()
