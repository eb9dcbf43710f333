"""One client cannot refuse the analyzer to everyone else.

kprof-analyzer runs with one worker, --queue-max 16 and two bearer tokens (viewers "flood" and
"other"). PostgreSQL's runs table is locked by an open transaction, so every analysis blocks
on its first query and the queue fills. Then:
  - "flood" sends 40 Breakdown requests at once: half the queue's capacity (8 of 17) is
    accepted, the rest answered RESOURCE_EXHAUSTED at once;
  - "other" sends one request meanwhile: it is accepted (not RESOURCE_EXHAUSTED);
  - once the lock is released, "other" gets the daemon's own answer (NOT_FOUND: no such run)
    after at most two of flood's, the one that was running and the one the turn had already
    picked for the worker (clients are served in turn; first in, first out would answer it
    after all 8 of flood's; seen: third, every time). The order is the worker's, read from its debug
    log ("no such run method=Breakdown run=N"), not from when the test's threads see their answers: those
    come within a millisecond or two of each other, in whatever order the threads wake;
  - the analyzer's log names the client it refused ("client=id:flood")."""
import os
import re
import secrets
import subprocess
import threading
import time

import kpfix

kpfix.require_env()
import grpc  # noqa: E402
import kprof_pb2 as pb  # noqa: E402

DIR = os.path.join(kpfix.TEST_DIR, "it_fairness")
ANALYZER = os.path.join(kpfix.BIN, "analyzer", "kprof-analyzer")
FLOOD = 40


def main():
    os.makedirs(DIR, exist_ok=True)
    tok_flood, tok_other = secrets.token_hex(16), secrets.token_hex(16)
    tokens = os.path.join(DIR, "tokens")
    with open(tokens, "w") as f:
        f.write("viewer flood %s\nviewer other %s\n" % (tok_flood, tok_other))
    os.chmod(tokens, 0o600)
    ci = kpfix.fresh_db("kp_it_fairness")
    cd = kpfix.Collectord("it_fairness_cd", ci)  # creates the schema
    assert cd.stop() == 0, cd.log_text()
    an = kpfix.Daemon("it_fairness_an", [ANALYZER, "--pg-conninfo", ci, "--workers", "1",
                                   "--queue-max", "16", "--auth-tokens", tokens,
                                   "--no-allow-anonymous", "--log-level", "debug"], preexec=None)
    lock = subprocess.Popen([kpfix.PSQL, ci, "-qtAX", "-v", "ON_ERROR_STOP=1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    results = {}  # (who, i) -> (status code, time answered)
    try:
        lock.stdin.write("BEGIN; LOCK TABLE runs IN ACCESS EXCLUSIVE MODE; SELECT 'locked';\n")
        lock.stdin.flush()
        assert lock.stdout.readline().strip() == "locked"
        ch = grpc.insecure_channel(an.grpc)
        call = ch.unary_unary("/kprof.v1.Analyzer/Breakdown",
                              request_serializer=pb.BreakdownRequest.SerializeToString,
                              response_deserializer=pb.BreakdownResponse.FromString)

        def ask(who, tok, i):
            try:
                call(pb.BreakdownRequest(run_id=(950000 if who == "other" else 900000) + i),
                     timeout=60,
                     metadata=[("authorization", "Bearer " + tok)])
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            results[(who, i)] = (code, time.monotonic())

        threads = [threading.Thread(target=ask, args=("flood", tok_flood, i))
                   for i in range(FLOOD)]
        for t in threads:
            t.start()
        # The refused ones come back at once; the accepted ones wait on the lock.
        kpfix.wait_for(lambda: sum(1 for k, v in list(results.items())
                                   if v[0] == grpc.StatusCode.RESOURCE_EXHAUSTED) >= FLOOD // 2,
                       30, "flood's requests past its share to be refused")
        time.sleep(0.5)
        refused = sum(1 for v in results.values() if v[0] == grpc.StatusCode.RESOURCE_EXHAUSTED)
        accepted = FLOOD - refused
        assert accepted == 8, (accepted, results)
        other = threading.Thread(target=ask, args=("other", tok_other, 0))
        other.start()
        time.sleep(1.0)
        assert ("other", 0) not in results, results[("other", 0)]  # queued, not refused
        released = time.monotonic()
        lock.stdin.write("COMMIT;\n")
        lock.stdin.close()
        other.join(60)
        for t in threads:
            t.join(60)
        code, at = results[("other", 0)]
        assert code == grpc.StatusCode.NOT_FOUND, code
        after_flood = sorted(v[1] for k, v in results.items()
                             if k[0] == "flood" and v[0] == grpc.StatusCode.NOT_FOUND)
        assert len(after_flood) == accepted, (after_flood, accepted)
        ch.close()
    finally:
        if lock.poll() is None:
            lock.kill()
            lock.wait()
        rc = an.stop()
    assert rc == 0, an.log_text()
    log = an.log_text()
    assert "client=id:flood" in log, log
    order = re.findall(r"no such run method=Breakdown run=(\d+)", log)
    assert len(order) == accepted + 1 and order.count("950000") == 1, order
    before_other = order.index("950000")
    assert before_other <= 2, ("the other client's request was answered after %d of flood's"
                               % before_other, order)
    print("fairness: flood got %d of %d accepted, the other client's request was queued and "
          "answered after %d of flood's (first in, first out: after %d), %.2f s after the "
          "lock was released" % (accepted, FLOOD, before_other, accepted, at - released))


if __name__ == "__main__":
    main()
