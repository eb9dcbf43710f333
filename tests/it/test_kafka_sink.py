"""kprof-collectord --role sink: Kafka (librdkafka's mock cluster, 3 brokers) into PostgreSQL.

Batches (kprof.v1.Batch, keyed "RUN/RANK" as --sink kafka produces them) are produced with an
idempotent producer (python3-confluent-kafka, acks=all) into a topic of 4 partitions; sink
consumers in one group store them through the PostgreSQL sink. Each case ends with the batch
keys in ingest_batches equal to the keys produced, per (run, rank, stream, seq), and the rows
of every kind and rank equal, in count and in sum of durations, to what was produced: nothing
lost, nothing stored twice. And the consumer lag on /metrics comes back to 0. Cases:
  0. end to end: kprof-loadgen pushes to collectord --sink kafka, which produces the topic;
  1. steady state, plus a record that is not a Batch and one for an unknown run (skipped and
     counted, never retried);
  2. a sink SIGKILLed while it flushes, restarted;
  3. PostgreSQL restarted (pg_ctl -m immediate) while the sink consumes, then stopped while
     records keep coming: the sink stays up, pauses its partitions (its queue is small), the
     lag grows; PostgreSQL back, everything is stored;
  4. a rebalance from 1 to 2 sinks and back to 1 while records keep coming;
  5. a broker taken down mid-stream (and a partition's leader moved), then back.
The test runs its own PostgreSQL (tests/it/pgfix.sh) so that it can restart it."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import kpfix
import test_ingest_durability as tid
import test_pg_restart as tpr

kpfix.require_env()
import kprof_pb2 as pb  # noqa: E402

try:
    import confluent_kafka as ck
except ImportError:
    print("python3-confluent-kafka is missing: run deploy/local/install-deps.sh", file=sys.stderr)
    sys.exit(1)

PG_DIR = os.path.join(kpfix.TEST_DIR, "kafka_sink_cluster")
PG_PORT = "5451"
CI = "host=%s port=%s user=kprof dbname=kprof" % (PG_DIR, PG_PORT)
TOPIC = "kprof.batches"
BIN = os.path.join(kpfix.BIN, "collectord", "kprof-collectord")
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
# A dead member leaves the group in seconds, not the default 45 s.
GROUP_PROPS = "session.timeout.ms=6000;heartbeat.interval.ms=500"


def psql(sql):
    out = subprocess.run([kpfix.PSQL, CI, "-qtAX", "-v", "ON_ERROR_STOP=1", "-c", sql],
                         check=True, capture_output=True, text=True, timeout=60 * kpfix.SCALE)
    return out.stdout.strip()


def pg_ctl(*args):
    """pg_ctl on this test's cluster, as its owner."""
    cmd = [os.path.join(tpr.pg_bindir(), "pg_ctl"), "-D", os.path.join(PG_DIR, "db"), "-w",
           "-t", "120"] + list(args)
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180 * kpfix.SCALE)
    assert p.returncode == 0, ("pg_ctl", args, p.stdout, p.stderr)


def pg_opts():
    return ["-l", os.path.join(PG_DIR, "postgres.log"),
            "-o", "-c listen_addresses= -k '%s' -p %s" % (PG_DIR, PG_PORT)]


class Producer:
    """An idempotent producer (acks=all) of Batches keyed "RUN/RANK"; remembers what it
    produced: the keys and the rows per (rank, kind)."""

    def __init__(self, bootstrap, run_id, seed):
        self.p = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                              "acks": "all", "linger.ms": 5, "message.timeout.ms": 300000})
        self.run_id = run_id
        self.rng = random.Random(seed)
        self.keys = set()
        self.rows = {}
        self.errors = []

    def _cb(self, err, msg):
        if err is not None:
            self.errors.append(str(err))

    def send(self, rank, stream, seq):
        b, kinds = tid.make_batch(self.run_id, rank, stream, seq, self.rng)
        self.send_raw("%d/%d" % (self.run_id, rank), b.SerializeToString())
        self.keys.add((rank, stream, seq))
        tid.add(self.rows, rank, kinds)

    def send_raw(self, key, value):
        while True:
            try:
                self.p.produce(TOPIC, key=key, value=value, on_delivery=self._cb)
                break
            except BufferError:
                self.p.poll(0.05)
        self.p.poll(0)

    def send_many(self, ranks, streams, seqs, pause_s=0.0):
        for seq in seqs:
            for rank in range(ranks):
                for stream in streams:
                    self.send(rank, stream, seq)
            if pause_s:
                time.sleep(pause_s)

    def close(self):
        """Drops the client (before the mock cluster goes, or it logs its reconnects)."""
        self.p = None

    def flush(self):
        left = self.p.flush(120 * kpfix.SCALE)
        assert left == 0, "%d records not acknowledged by Kafka" % left
        assert not self.errors, self.errors


class Sink(kpfix.Daemon):
    """kprof-collectord --role sink on the mock cluster."""

    def __init__(self, name, bootstrap, extra=()):
        super().__init__(name, [BIN, "--role", "sink", "--pg-conninfo", CI,
                                "--kafka-brokers", bootstrap, "--kafka-property", GROUP_PROPS,
                                "--flush-interval", "20ms", "--retry-max", "500ms",
                                "--shutdown-grace", "5s", "--kafka-revoke-wait", "5s"]
                         + list(extra), grpc=False)

    def metrics(self):
        code, body = self.get("/metrics")
        if code != 200:
            return None
        out = {}
        for line in body.splitlines():
            m = re.match(r'^kprof_collectord_(\w+)(\{partition="(\d+)"\}|\{[^}]*partition="(\d+)"\})?'
                         r' (\d+)$', line)
            if m:
                part = m.group(3) or m.group(4)
                out[m.group(1) if part is None else "%s/%s" % (m.group(1), part)] = int(m.group(5))
        return out

    def lag_partitions(self):
        m = self.metrics() or {}
        return sorted(int(k.split("/")[1]) for k in m if k.startswith("kafka_consumer_lag/"))


def stored_keys(run_id):
    rows = psql("SELECT rank, stream, seq FROM ingest_batches WHERE run_id = %d" % run_id)
    return [tuple(map(int, l.split("|"))) for l in rows.splitlines() if l]


def stored_rows(run_id):
    out = {}
    for kind in ("kernels", "ops", "api_calls"):
        rows = psql("SELECT rank, count(*), sum(dur_ns) FROM %s WHERE run_id = %d "
                    "GROUP BY rank ORDER BY rank" % (kind, run_id))
        for line in rows.splitlines():
            rank, n, d = map(int, line.split("|"))
            out[(rank, kind)] = (n, d)
    return out


def wait_lag_zero(sinks, what):
    def lag_zero():
        ms = [s.metrics() for s in sinks]
        if any(m is None for m in ms):
            return False
        parts = [k for m in ms for k in m if k.startswith("kafka_consumer_lag/")]
        return len(parts) == 4 and all(m["kafka_consumer_lag_sum"] == 0 for m in ms)
    kpfix.wait_for(lag_zero, 60, what + ": consumer lag 0 on /metrics for all 4 partitions")


def settle(prod, sinks, what):
    """Waits until PostgreSQL holds every key produced, then checks it holds them exactly once
    and the rows exactly, and that the lag on the sinks' /metrics is 0 everywhere."""
    prod.flush()
    want = len(prod.keys)
    kpfix.wait_for(lambda: len(stored_keys(prod.run_id)) >= want, 120,
                   "%s: %d batches in PostgreSQL" % (what, want))
    keys = stored_keys(prod.run_id)
    assert len(keys) == len(set(keys)), what + ": a key stored twice"
    assert set(keys) == prod.keys, "%s: lost %s, unexpected %s" % (
        what, sorted(prod.keys - set(keys))[:5], sorted(set(keys) - prod.keys)[:5])
    assert stored_rows(prod.run_id) == prod.rows, what + ": rows differ from what was produced"
    wait_lag_zero(sinks, what)
    print("%s: %d batches, %d rows, stored once each; lag 0" % (
        what, want, sum(n for n, _ in prod.rows.values())))


def committed_sum(bootstrap):
    """The group's committed offsets, summed over the 4 partitions (none: 0)."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "kprof-sink"})
    try:
        tps = c.committed([ck.TopicPartition(TOPIC, i) for i in range(4)], timeout=10)
    finally:
        c.close()
    return sum(max(tp.offset, 0) for tp in tps)


def new_run(stubs, job, world):
    return stubs.create(pb.CreateRunRequest(job=job, world_size=world), timeout=30).id


def case_steady(stubs, n):
    mock = kpfix.KafkaMock("kafka_sink_steady_mock", brokers=3, partitions=4, topic=TOPIC)
    sink = prod = None
    try:
        prod = Producer(mock.bootstrap, new_run(stubs, "kafka-steady", 4), 1)
        prod.send_many(4, (1, 2), range(1, n + 1))
        prod.send_raw("%d/0" % prod.run_id, b"\xff\xfe not a batch")
        bad = pb.Batch(run_id=999999, rank=0, stream=1, seq=1, base_ns=1)
        prod.send_raw("999999/0", bad.SerializeToString())
        sink = Sink("it_kafka_sink_steady", mock.bootstrap)
        settle(prod, [sink], "steady state")
        m = sink.metrics()
        assert m["kafka_records_malformed_total"] == 1, m
        assert m["kafka_records_rejected_total"] == 1, m
        assert m["kafka_records_stored_total"] == len(prod.keys), m
        assert m["kafka_records_consumed_total"] == len(prod.keys) + 2, m
    finally:
        if sink is not None:
            sink.stop()
        if prod is not None:
            prod.close()
        mock.stop()


def case_sigkill(stubs, n):
    mock = kpfix.KafkaMock("kafka_sink_kill_mock", brokers=3, partitions=4, topic=TOPIC)
    sink = prod = None
    try:
        prod = Producer(mock.bootstrap, new_run(stubs, "kafka-kill", 4), 2)
        prod.send_many(4, (1, 2), range(1, n + 1))
        prod.flush()
        # Small flushes: the kill lands between and during transactions.
        sink = Sink("it_kafka_sink_kill", mock.bootstrap, ["--flush-max-rows", "500"])
        kpfix.wait_for(lambda: len(stored_keys(prod.run_id)) > len(prod.keys) // 4 and
                       committed_sum(mock.bootstrap) > 0, 60,
                       "a quarter stored and offsets committed before the kill")
        sink.proc.send_signal(signal.SIGKILL)
        sink.proc.wait(timeout=30)
        sink.log.close()
        before = len(stored_keys(prod.run_id))
        # Offsets never run ahead of PostgreSQL: at most as many records committed in Kafka as
        # batches stored (each record here is one batch).
        done = committed_sum(mock.bootstrap)
        assert done <= before, "offsets of %d records committed, %d stored" % (done, before)
        assert before < len(prod.keys), "all stored before the kill: the case shows nothing"
        sink = Sink("it_kafka_sink_kill2", mock.bootstrap)
        settle(prod, [sink], "sink SIGKILLed at %d of %d and restarted" % (before, len(prod.keys)))
        print("  the restarted sink found %d batches already stored (redelivered)"
              % sink.metrics()["kafka_records_duplicate_total"])
    finally:
        if sink is not None:
            sink.stop()
        if prod is not None:
            prod.close()
        mock.stop()


def case_pg_restart(stubs, n):
    mock = kpfix.KafkaMock("kafka_sink_pg_mock", brokers=3, partitions=4, topic=TOPIC)
    sink = prod = None
    try:
        prod = Producer(mock.bootstrap, new_run(stubs, "kafka-pg", 4), 3)
        sink = Sink("it_kafka_sink_pg", mock.bootstrap, ["--queue-max-bytes", "1MiB"])
        prod.send_many(4, (1, 2), range(1, n + 1))
        prod.flush()
        kpfix.wait_for(lambda: len(stored_keys(prod.run_id)) > 0, 60, "a first batch stored")
        pg_ctl("-m", "immediate", *pg_opts(), "restart")
        prod.send_many(4, (1, 2), range(n + 1, 2 * n + 1))
        settle(prod, [sink], "PostgreSQL restarted (-m immediate) while consuming")
        # Down for a while: Kafka holds what comes, the partitions pause, the lag grows.
        pg_ctl("-m", "fast", "stop")
        try:
            prod.send_many(4, (1, 2), range(2 * n + 1, 6 * n + 1))
            prod.flush()
            kpfix.wait_for(lambda: (sink.metrics() or {}).get("kafka_consumer_lag_sum", 0) > 0,
                           30, "lag on /metrics while PostgreSQL is down")
            kpfix.wait_for(lambda: (sink.metrics() or {}).get("kafka_pauses_total", 0) > 0, 30,
                           "partitions paused while PostgreSQL is down")
            time.sleep(2)
            held = committed_sum(mock.bootstrap)
            time.sleep(1)
            assert committed_sum(mock.bootstrap) == held, "offsets moved with PostgreSQL down"
            assert held < len(prod.keys), "every offset committed with PostgreSQL down"
            assert sink.proc.poll() is None, sink.log_text()
            m = sink.metrics()
            assert m["queued_bytes"] < 4 * 1024 * 1024, m  # bounded: the rest waits in Kafka
        finally:
            pg_ctl(*pg_opts(), "start")
        settle(prod, [sink], "PostgreSQL down with records coming, then back")
    finally:
        if sink is not None:
            sink.stop()
        if prod is not None:
            prod.close()
        mock.stop()


def case_rebalance(stubs, n):
    mock = kpfix.KafkaMock("kafka_sink_rebalance_mock", brokers=3, partitions=4, topic=TOPIC)
    a = b = prod = None
    try:
        prod = Producer(mock.bootstrap, new_run(stubs, "kafka-rebalance", 8), 4)
        a = Sink("it_kafka_sink_a", mock.bootstrap)
        kpfix.wait_for(lambda: len(a.lag_partitions()) == 4, 60, "sink a holds 4 partitions")
        stop = threading.Event()
        errors = []

        def produce():
            # Until told to stop: records keep coming through both rebalances.
            try:
                seq = 0
                while not stop.is_set() and seq < n:
                    seq += 1
                    prod.send_many(8, (1,), (seq,), pause_s=0.05)
            except Exception as e:  # noqa: BLE001 -- reported by the main thread
                errors.append(e)
        t = threading.Thread(target=produce)
        t.start()
        try:
            b = Sink("it_kafka_sink_b", mock.bootstrap)
            kpfix.wait_for(lambda: len(a.lag_partitions()) == 2 and len(b.lag_partitions()) == 2,
                           60, "partitions shared 2 and 2")
            kpfix.wait_for(lambda: (b.metrics() or {}).get("kafka_records_stored_total", 0) > 0,
                           60, "sink b storing")
            b_stored = b.metrics()["kafka_records_stored_total"]
            assert b.stop() == 0, b.log_text()
            kpfix.wait_for(lambda: len(a.lag_partitions()) == 4, 60,
                           "sink a holds 4 partitions again")
            time.sleep(1)
        finally:
            stop.set()
            t.join(timeout=120 * kpfix.SCALE)
        assert not t.is_alive() and not errors, errors
        settle(prod, [a], "rebalance 1 -> 2 -> 1 sinks")
        sb = b.log_text()
        assert "assigned 2 partitions" in sb and "revoked 2 partitions" in sb, sb
        print("  sink b stored %d batches while it held 2 partitions" % b_stored)
    finally:
        for s in (b, a):
            if s is not None:
                s.stop()
        if prod is not None:
            prod.close()
        mock.stop()


def case_broker_down(stubs, n):
    mock = kpfix.KafkaMock("kafka_sink_broker_mock", brokers=3, partitions=4, topic=TOPIC)
    sink = prod = None
    try:
        prod = Producer(mock.bootstrap, new_run(stubs, "kafka-broker", 4), 5)
        sink = Sink("it_kafka_sink_broker", mock.bootstrap)
        prod.send_many(4, (1,), range(1, n + 1), pause_s=0.01)
        assert mock.command("down 2") == "ok"
        prod.send_many(4, (1,), range(n + 1, 2 * n + 1), pause_s=0.01)
        time.sleep(2)
        assert mock.command("up 2") == "ok"
        assert mock.command("leader %s 0 3" % TOPIC) == "ok"
        prod.send_many(4, (1,), range(2 * n + 1, 3 * n + 1), pause_s=0.01)
        settle(prod, [sink], "broker 2 down mid-stream and back, partition 0's leader moved")
    finally:
        if sink is not None:
            sink.stop()
        if prod is not None:
            prod.close()
        mock.stop()


def case_end_to_end(stubs, n):
    """kprof-loadgen -> collectord --sink kafka -> the mock cluster -> collectord --role sink."""
    mock = kpfix.KafkaMock("kafka_sink_e2e_mock", brokers=3, partitions=4, topic=TOPIC)
    ing = sink = None
    try:
        ing = kpfix.Collectord("it_kafka_sink_ingest", CI, extra=[
            "--sink", "kafka", "--kafka-brokers", mock.bootstrap, "--open-run-timeout", "0"])
        kpfix.wait_for(lambda: kpfix.Daemon.get(ing, "/readyz")[0] == 200, 30, "ingest ready")
        sink = Sink("it_kafka_sink_e2e", mock.bootstrap)
        # loadgen ends the run with its streams' marks: collectord ends it only once every
        # batch is stored (an Ack means durable in Kafka; ended earlier, the run would refuse
        # what the sinks store after the end), so when loadgen returns, all of it is there.
        p = subprocess.run([LOADGEN, "--collector", ing.grpc, "--json", "--ranks", "4",
                            "--steps", str(n), "--kernels-per-step", "20", "--batch-rows", "300",
                            "--give-up", "120s"],
                           capture_output=True, text=True, timeout=300 * kpfix.SCALE)
        assert p.returncode == 0, p.stderr
        s = json.loads(p.stdout)
        run = s["run_id"]
        assert psql("SELECT state FROM runs WHERE id = %d" % run) == "2", "run not ENDED"
        keys = stored_keys(run)
        assert len(keys) == s["batches"] == len(set(keys)), (len(keys), s["batches"])
        got = {int(r): (int(b), int(e)) for r, b, e in (
            l.split("|") for l in psql("SELECT rank, count(*), sum(rows) FROM ingest_batches "
                                       "WHERE run_id = %d GROUP BY rank" % run).splitlines())}
        want = {e["rank"]: (e["batches"], e["events"]) for e in s["expected"]}
        assert got == want, (got, want)
        rows = stored_rows(run)
        for e in s["expected"]:
            for kind, label in (("kernels", "kernel"), ("ops", "op"), ("api_calls", "api")):
                k = e["kinds"][label]
                assert rows.get((e["rank"], kind), (0, 0)) == (k["rows"], k["dur_ns"]), (
                    e["rank"], kind, rows.get((e["rank"], kind)), k)
        wait_lag_zero([sink], "end to end")
        print("end to end (loadgen -> collectord --sink kafka -> sink): %d batches, %d events, "
              "stored once each; lag 0" % (s["batches"], s["events"]))
    finally:
        for d in (sink, ing):
            if d is not None:
                d.stop()
        mock.stop()


def case_retention_loss(stubs, n):
    """Records deleted by the topic's retention before the group stored them (the mock cluster
    keeps about 5 MB a partition) are reported: an error naming the offsets and
    kafka_records_lost_total, never a silent skip; what is left is read on."""
    mock = kpfix.KafkaMock("kafka_sink_loss_mock", brokers=3, partitions=4, topic=TOPIC)
    sink = prod = None
    try:
        prod = Producer(mock.bootstrap, new_run(stubs, "kafka-loss", 1), 7)
        sink = Sink("it_kafka_sink_loss", mock.bootstrap)
        prod.send_many(1, (1,), range(1, 21))
        prod.flush()
        kpfix.wait_for(lambda: len(stored_keys(prod.run_id)) == 20 and
                       committed_sum(mock.bootstrap) >= 20, 60, "20 batches stored and committed")
        sink.stop()
        # n records of 100 KB into rank 0's partition while no sink reads: more than the
        # partition keeps, so the oldest go before anyone stored them
        for i in range(n):
            prod.send_raw("%d/0" % prod.run_id, bytes([i % 251]) * 100000)
        prod.flush()
        sink = Sink("it_kafka_sink_loss2", mock.bootstrap)
        kpfix.wait_for(lambda: (sink.metrics() or {}).get("kafka_records_lost_total", 0) > 0 and
                       sink.metrics()["kafka_records_lost_total"] +
                       sink.metrics()["kafka_records_malformed_total"] == n, 60,
                       "every record either read (malformed: not a Batch) or counted lost")
        m = sink.metrics()
        assert 0 < m["kafka_records_lost_total"] < n, m
        assert "deleted by the topic's retention" in sink.log_text(), sink.log_text()
        print("retention: %d of %d records deleted before the sink read them, counted lost and "
              "logged" % (m["kafka_records_lost_total"], n))
    finally:
        if sink is not None:
            sink.stop()
        if prod is not None:
            prod.close()
        mock.stop()


def case_replica_killed(stubs, n):
    """Two ingest replicas behind one target (gRPC's pick_first over both addresses); the one
    loadgen pushes through is SIGKILLed mid-stream: loadgen resends what it had not been
    acknowledged through the other, and every batch is stored once."""
    mock = kpfix.KafkaMock("kafka_sink_replica_mock", brokers=3, partitions=4, topic=TOPIC)
    reps, sink, lg = [], None, None
    try:
        for i in range(2):
            reps.append(kpfix.Collectord("it_kafka_sink_rep%d" % i, CI, extra=[
                "--sink", "kafka", "--kafka-brokers", mock.bootstrap, "--open-run-timeout", "0"]))
        for r in reps:
            kpfix.wait_for(lambda: kpfix.Daemon.get(r, "/readyz")[0] == 200, 30, "replica ready")
        sink = Sink("it_kafka_sink_rep_sink", mock.bootstrap)
        # in the group before the first record: the mock cluster keeps only about 5 MB a
        # partition, and what it drops before the sink reads it is lost (case_retention_loss)
        kpfix.wait_for(lambda: "assigned 4 partitions" in sink.log_text(), 30, "sink assigned")
        target = "ipv4:" + ",".join(r.grpc for r in reps)
        lg = subprocess.Popen([LOADGEN, "--collector", target, "--json", "--ranks", "4",
                               "--steps", str(n), "--kernels-per-step", "20",
                               "--batch-rows", "300", "--give-up", "120s"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def produced(r):
            code, body = kpfix.Daemon.get(r, "/metrics")
            m = re.search(r"^kprof_collectord_kafka_records_produced_total (\d+)$", body or "",
                          re.M)
            return int(m.group(1)) if code == 200 and m else 0
        kpfix.wait_for(lambda: any(produced(r) >= 50 for r in reps) or lg.poll() is not None,
                       60, "a replica producing")
        assert lg.poll() is None, "loadgen ended before a replica could be killed"
        victim = max(reps, key=produced)
        before = produced(victim)
        victim.proc.kill()
        victim.proc.wait()
        out, err = lg.communicate(timeout=300 * kpfix.SCALE)
        assert lg.returncode == 0, err
        s = json.loads(out)
        run = s["run_id"]
        survivor = [r for r in reps if r is not victim][0]
        assert produced(survivor) > 0, "nothing went through the surviving replica"
        assert psql("SELECT state FROM runs WHERE id = %d" % run) == "2", "run not ENDED"
        keys = stored_keys(run)
        assert len(keys) == s["batches"] == len(set(keys)), (len(keys), s["batches"])
        rows = stored_rows(run)
        for e in s["expected"]:
            for kind, label in (("kernels", "kernel"), ("ops", "op"), ("api_calls", "api")):
                k = e["kinds"][label]
                assert rows.get((e["rank"], kind), (0, 0)) == (k["rows"], k["dur_ns"]), (
                    e["rank"], kind, rows.get((e["rank"], kind)), k)
        wait_lag_zero([sink], "replica killed")
        m = sink.metrics()
        print("replica killed after %d records: loadgen resent %d batches through the other; "
              "%d batches stored once each, %d duplicates recognised" % (
                  before, s.get("resent", -1), s["batches"], m.get("kafka_records_duplicate_total", -1)))
    finally:
        if lg is not None and lg.poll() is None:
            lg.kill()
            lg.wait()
        for d in [sink] + reps:
            if d is not None:
                d.stop()
        mock.stop()


def main():
    subprocess.run([tpr.PGFIX, "stop", PG_DIR, PG_PORT], capture_output=True)
    p = subprocess.run([tpr.PGFIX, "start", PG_DIR, PG_PORT], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    cd = stubs = None
    only = sys.argv[1:]
    try:
        # The direct path, for CreateRun (and the schema).
        cd = kpfix.Collectord("it_kafka_sink_cd", CI, extra=["--open-run-timeout", "0"])
        stubs = kpfix.Stubs(cd.grpc)
        for name, f, n in (("end_to_end", case_end_to_end, 60), ("steady", case_steady, 30), ("sigkill", case_sigkill, 60),
                           ("pg_restart", case_pg_restart, 20), ("rebalance", case_rebalance, 400),
                           ("broker_down", case_broker_down, 20),
                           ("retention_loss", case_retention_loss, 100),
                           ("replica_killed", case_replica_killed, 300)):
            if not only or name in only:
                f(stubs, n)
    finally:
        if stubs is not None:
            stubs.close()
        if cd is not None:
            cd.stop()
        subprocess.run([tpr.PGFIX, "stop", PG_DIR, PG_PORT], capture_output=True)
    print("ok")


if __name__ == "__main__":
    main()
