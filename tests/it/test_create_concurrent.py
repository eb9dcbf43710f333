"""CreateRun at once on two collectord replicas of one database (the scale-out layout: ingest
replicas behind one address). Creating a run inserts its `runs` row and creates its partitions
(each made apart, then attached: migration 0016) in one transaction; two such transactions
must not deadlock. 8 clients create 5 runs each, alternating replicas: every call succeeds,
and every run has its partitions. Then CreateRun while another session holds the event
tables' parents as a summary of an ended run does (ACCESS SHARE, for seconds at a thousand
ranks): it does not wait for it, and a DropRun's partitions (ACCESS EXCLUSIVE) do."""
import subprocess
import threading

import kpfix

kpfix.require_env()
import kprof_pb2 as pb  # noqa: E402

DB = "kp_it_create_concurrent"


def main():
    conninfo = kpfix.fresh_db(DB)
    reps = [kpfix.Collectord("create_concurrent_%d" % i, conninfo) for i in range(2)]
    stubs = [kpfix.Stubs(r.grpc) for r in reps]
    errors, ids = [], []
    lock = threading.Lock()

    def client(n):
        for k in range(5):
            try:
                run = stubs[(n + k) % 2].create(
                    pb.CreateRunRequest(job="cc-%d" % n, world_size=2), timeout=60)
                with lock:
                    ids.append(run.id)
            except Exception as e:  # noqa: BLE001 (the test reports every failure)
                with lock:
                    errors.append("client %d call %d: %s" % (n, k, e))
    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, "%d of 40 CreateRun calls failed:\n%s" % (len(errors),
                                                                   "\n".join(errors[:5]))
        assert len(set(ids)) == 40, ids
        parts = int(kpfix.psql("SELECT count(*) FROM pg_inherits i JOIN pg_class p ON "
                               "p.oid = i.inhparent WHERE p.relname IN ('kernel_rows', "
                               "'kernel_chunks')", db=DB))
        assert parts == 80, "kernel_rows and kernel_chunks have %d partitions, want 80" % parts
        print("ok 40 runs created at once on 2 replicas")

        # the summary's lock (collectord/summary.c tables_sql), held by a session of ours
        lock = subprocess.Popen([kpfix.PSQL, conninfo, "-qtAX", "-v", "ON_ERROR_STOP=1"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            lock.stdin.write("BEGIN; LOCK TABLE ONLY api_calls, ONLY kernel_chunks, ONLY "
                             "kernel_rows, ONLY memcpys, ONLY memsets, ONLY ops, ONLY steps IN "
                             "ACCESS SHARE MODE; SELECT 'locked';\n")
            lock.stdin.flush()
            assert lock.stdout.readline().strip() == "locked"
            run = stubs[0].create(pb.CreateRunRequest(job="cc-locked", world_size=2),
                                  timeout=20 * kpfix.SCALE)
            assert kpfix.psql("SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = "
                              "i.inhrelid WHERE c.relname = 'kernel_rows_r%d'" % run.id,
                              db=DB) == "1"
            # while the lock is held, a run's partitions cannot be dropped (the parents'
            # ACCESS EXCLUSIVE): the attempt times out instead
            p = subprocess.run([kpfix.PSQL, conninfo, "-qtAX", "-c", "SET lock_timeout = "
                                "'300ms'", "-c", "SELECT kp_drop_run(%d)" % run.id],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode != 0 and "lock timeout" in p.stderr, (p.returncode, p.stderr)
        finally:
            lock.stdin.write("COMMIT;\n")
            lock.stdin.close()
            lock.wait(30)
        print("ok CreateRun does not wait for a summary's locks; dropping a run does")
    finally:
        for s in stubs:
            s.close()
        for r in reps:
            r.stop()
            r.assert_clean_log()


if __name__ == "__main__":
    main()
