"""kprof-collectord --sink kafka against kprof-kafka-mock (3 brokers, librdkafka's mock
cluster): kprof-loadgen's batches all land in the topic, each keyed "<run>/<rank>" with the
encoded Batch as value, one partition per rank, in seq order, none lost and none duplicated;
with a broker taken down mid-stream and partition leaders moved, still every batch (a copy
is allowed there: the consumers recognise it by (run, rank, stream, seq)); with every broker down the producer's push does not complete, its
batches are not acknowledged and collectord's queued bytes stay under --queue-max-bytes; once
the brokers are back it completes. A batch into a run that does not exist is refused NOT_FOUND
before Kafka. /metrics counts what was produced."""
import json
import os
import re
import subprocess
import time
import urllib.request

import kpfix

kpfix.require_env()
import kprof_pb2  # noqa: E402  (KPROF_PROTO_PY, put on sys.path by kpfix)

DB = "kp_it_kafka_produce"
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
QUEUE_MAX = 1 << 20


def loadgen(cd, *args, rows=300):
    # --no-end-run: no sink consumer stores the topic here, and EndRun with loadgen's marks
    # waits until PostgreSQL holds every batch (test_kafka_sink covers that)
    return subprocess.Popen([LOADGEN, "--collector", cd.grpc, "--json", "--kernels-per-step", "20",
                             "--batch-rows", str(rows), "--give-up", "120s", "--no-end-run"]
                            + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p, timeout=120):
    out, err = p.communicate(timeout=timeout * kpfix.SCALE)
    assert p.returncode == 0, "loadgen failed (%d): %s" % (p.returncode, err)
    return json.loads(out)


def metric(cd, name):
    with urllib.request.urlopen("http://%s/metrics" % cd.http, timeout=5) as r:
        text = r.read().decode()
    m = re.search(r"^kprof_collectord_%s (\d+)$" % name, text, re.M)
    assert m, "no %s in /metrics" % name
    return int(m.group(1))


def rss_kib(cd):
    with open("/proc/%d/status" % cd.proc.pid) as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))


def check_topic(mock, summaries, allow_copies=False):
    """Every batch loadgen sent is in the topic under the right key, in one partition per
    rank, first copies in seq order; copies only where allowed (loadgen resent)."""
    recs = mock.records()
    seen = {}
    part_of = {}
    last_seq = {}
    copies = 0
    for part, off, key, val in sorted(recs):
        b = kprof_pb2.Batch()
        b.ParseFromString(val)
        assert key == "%d/%d" % (b.run_id, b.rank), (key, b.run_id, b.rank)
        assert part_of.setdefault((b.run_id, b.rank), part) == part, "a rank in two partitions"
        k = (b.run_id, b.rank, b.stream, b.seq)
        if k in seen:
            copies += 1
            continue
        seen[k] = (part, off)
        prev = last_seq.get(k[:3])
        assert prev is None or b.seq > prev, "seq %d after %d in %s" % (b.seq, prev, k[:3])
        last_seq[k[:3]] = b.seq
    for s in summaries:
        for r in s["expected"]:
            got = sum(1 for k in seen if k[0] == s["run_id"] and k[1] == r["rank"])
            assert got == r["batches"], "run %d rank %d: %d batches in Kafka, sent %d" % (
                s["run_id"], r["rank"], got, r["batches"])
    runs = {s["run_id"] for s in summaries}
    assert {k[0] for k in seen} <= runs, "records of runs nobody sent"
    if not allow_copies:
        assert copies == 0, "%d duplicated records" % copies
    return len(seen), copies


def main():
    conninfo = kpfix.fresh_db(DB)
    mock = kpfix.KafkaMock("kafkaproduce", brokers=3, partitions=4)
    cd = None
    try:
        # 0. --kafka-properties-file: refused unless private, a bad line named by number
        props = os.path.join(kpfix.TEST_DIR, "kafkaproduce-props")
        base = [os.path.join(kpfix.BIN, "collectord", "kprof-collectord"), "--listen",
                "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--pg-conninfo", conninfo,
                "--sink", "kafka", "--kafka-brokers", mock.bootstrap,
                "--kafka-properties-file", props]
        for mode, text, want in ((0o644, "linger.ms=2\n", "readable by others"),
                                 (0o600, "# ok\n\nlinger.ms=2\nno-equals-sign\n", "line 4"),
                                 (0o600, "no.such.property=1\n", "line 1")):
            with open(props, "w") as f:
                f.write(text)
            os.chmod(props, mode)
            p = subprocess.run(base, capture_output=True, text=True, timeout=60)
            assert p.returncode != 0 and want in p.stderr, (mode, text, p.returncode, p.stderr)
        with open(props, "w") as f:
            f.write("# secrets live here, not on the command line\n  linger.ms = 2  \n"
                    "sasl.password=s3cr3t-never-logged\n")
        os.chmod(props, 0o600)
        cd = kpfix.Collectord("kafkaproduce-cd", conninfo, extra=[
            "--sink", "kafka", "--kafka-brokers", mock.bootstrap,
            "--queue-max-bytes", str(QUEUE_MAX), "--kafka-properties-file", props])
        kpfix.wait_for(lambda: kpfix.Daemon.get(cd, "/readyz")[0] == 200, 30, "readyz")

        assert "s3cr3t" not in cd.log_text()
        # 1. Plain: 3 ranks, every batch once.
        s1 = finish(loadgen(cd, "--ranks", "3", "--steps", "10"))
        n1, _ = check_topic(mock, [s1])
        assert n1 == s1["batches"], (n1, s1["batches"])
        assert metric(cd, "kafka_records_produced_total") == n1
        assert metric(cd, "kafka_delivery_failures_total") == 0
        assert metric(cd, "kafka_bytes_produced_total") > 0

        # 2. A broker down mid-stream and the partitions' leaders moved: nothing lost.
        for b in (1, 2, 3):
            assert mock.command("rtt %d 100" % b) == "ok"
        # One batch in flight per rank and 100 ms a round trip: the push lasts seconds.
        p = loadgen(cd, "--ranks", "4", "--steps", "100", "--window", "1")
        kpfix.wait_for(lambda: metric(cd, "kafka_records_produced_total") > n1 + 10, 60,
                       "records flowing")
        for part in range(4):
            assert mock.command("leader kprof.batches %d 1" % part) == "ok"
        time.sleep(0.5)
        assert mock.command("down 1") == "ok"
        at_down = metric(cd, "kafka_records_produced_total")
        time.sleep(1.0)
        for part in range(4):
            assert mock.command("leader kprof.batches %d %d" % (part, 2 + part % 2)) == "ok"
        time.sleep(1.0)
        assert mock.command("up 1") == "ok"
        s2 = finish(p)
        print("phase 2: %d batches, %d produced before the broker went down, %.1f s, resent %d"
              % (s2["batches"], at_down - n1, s2["seconds"], s2["resent"]))
        assert at_down - n1 < s2["batches"], "loadgen was done before the broker went down"
        n2, copies = check_topic(mock, [s1, s2], allow_copies=True)
        assert n2 == s1["batches"] + s2["batches"]
        # Copies are allowed here: a record in flight to the broker that went down may have
        # been written before the connection broke, and librdkafka, unsure, writes it again
        # under a new producer epoch. The consumers store it once, by (run, rank, stream, seq).
        print("phase 2: %d copies in Kafka" % copies)

        # 3. Every broker down: the push does not complete, collectord holds at most its queue.
        for b in (1, 2, 3):
            assert mock.command("rtt %d 0" % b) == "ok"
        produced = metric(cd, "kafka_records_produced_total")
        for b in (1, 2, 3):
            assert mock.command("down %d" % b) == "ok"
        rss0 = rss_kib(cd)
        p = loadgen(cd, "--ranks", "6", "--steps", "400", "--window", "1024", rows=3000)
        time.sleep(6)
        assert p.poll() is None, "loadgen finished while Kafka was down: " + p.stderr.read()
        assert metric(cd, "kafka_records_produced_total") == produced
        queued = metric(cd, "queued_bytes")
        rss1 = rss_kib(cd)
        # The producers had more to send than the queue holds: it filled up to its bound.
        assert queued >= QUEUE_MAX * 3 // 4, "queued %d bytes, bound %d" % (queued, QUEUE_MAX)
        print("phase 3 (down): queued %d, pauses %d" % (queued, metric(cd, "stream_pauses_total")))
        assert metric(cd, "stream_pauses_total") > 0
        for b in (1, 2, 3):
            assert mock.command("up %d" % b) == "ok"
        s3 = finish(p, timeout=240)
        # A stream stops reading once the queue is over its bound: each at most one batch over.
        batch = s3["bytes"] // s3["batches"]
        assert queued <= QUEUE_MAX + 6 * 2 * batch, "queued %d, bound %d" % (queued, QUEUE_MAX)
        print("phase 3: %d batches of %d bytes, %d bytes queued while Kafka was down, "
              "RSS %d -> %d KiB" % (s3["batches"], batch, queued, rss0, rss1))
        assert s3["bytes"] > 4 * QUEUE_MAX, "phase 3 sent too little to test the bound"
        assert rss1 - rss0 < 32 * 1024, "collectord grew %d KiB while Kafka was down" % (
            rss1 - rss0)
        check_topic(mock, [s1, s2, s3], allow_copies=True)
        assert metric(cd, "kafka_delivery_failures_total") == 0

        # 4. A run that does not exist is refused before Kafka.
        before = len(mock.records())
        p = subprocess.run([LOADGEN, "--collector", cd.grpc, "--run-id", "999999", "--ranks", "1",
                            "--steps", "1", "--give-up", "10s"], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode != 0 and "does not exist" in p.stderr, p.stderr
        assert len(mock.records()) == before
        assert metric(cd, "kafka_batches_rejected_total") >= 1
        cd.assert_clean_log()
    finally:
        if cd is not None:
            cd.stop()
        mock.stop()
    print("ok")


main()
