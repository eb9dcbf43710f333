"""CreateRun at once on two collectord replicas of one database (the scale-out layout: ingest
replicas behind one address). Creating a run inserts its `runs` row and creates its partitions
(CREATE TABLE ... PARTITION OF, with foreign keys to `runs`) in one transaction; two such
transactions must not deadlock. 8 clients create 5 runs each, alternating replicas: every
call succeeds, and every run has its partitions."""
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
    finally:
        for s in stubs:
            s.close()
        for r in reps:
            r.stop()
            r.assert_clean_log()


if __name__ == "__main__":
    main()
