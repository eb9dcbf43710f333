"""kprof-kafka-mock, the test-only host of librdkafka's mock Kafka cluster: it starts with 3
brokers and writes their bootstrap list; a record produced with librdkafka (kprof-kafka-cat,
idempotent, acks=all) is read back whole with its key; a broker taken down (the partition's
leader) and moved away from still lets records through, and the broker comes back up; bad
commands are answered with an error, and end of stdin stops the process."""
import kpfix

kpfix.require_env()


def main():
    mock = kpfix.KafkaMock("kafkamock", brokers=3, partitions=1)
    try:
        assert len(mock.bootstrap.split(",")) == 3, mock.bootstrap
        assert all(b.startswith("127.0.0.1:") for b in mock.bootstrap.split(",")), mock.bootstrap
        rc, _, err = mock.cat("produce", "7/0", "first")
        assert rc == 0, err
        recs = mock.records()
        assert [(r[2], r[3]) for r in recs] == [("7/0", b"first")], recs

        # The leader goes down and the partition moves to broker 2: records still get through.
        assert mock.command("leader kprof.batches 0 1") == "ok"
        assert mock.command("down 1") == "ok"
        assert mock.command("leader kprof.batches 0 2") == "ok"
        rc, _, err = mock.cat("produce", "7/0", "second")
        assert rc == 0, err
        assert mock.command("up 1") == "ok"
        assert mock.command("rtt 3 5") == "ok"
        rc, _, err = mock.cat("produce", "7/0", "third")
        assert rc == 0, err
        recs = mock.records()
        assert [(r[2], r[3]) for r in recs] == [("7/0", b"first"), ("7/0", b"second"),
                                               ("7/0", b"third")], recs

        assert mock.command("down 9").startswith("error: broker must be 1..3")
        assert mock.command("leader kprof.batches x 1").startswith("error: usage")
        assert mock.command("frobnicate").startswith("error: unknown command")
        # End of stdin: the host exits 0.
        mock.proc.stdin.close()
        assert mock.proc.wait(timeout=30) == 0
    finally:
        mock.stop()
    print("ok")


main()
