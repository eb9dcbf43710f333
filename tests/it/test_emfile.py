"""A client that exhausts a daemon's file descriptors must not end its gRPC service.

gRPC 1.51's listener stops accepting for good after one failed accept4 (EMFILE). Each daemon
(kprof-collectord, kprof-analyzer) runs here under a low open-file limit (soft = hard = 256,
set on the child, so the daemon cannot raise it): the test opens 300 idle TCP connections to
its gRPC port, which take every descriptor the daemon has. Then:
  - /readyz answers 503 and says gRPC stopped accepting, within 15 s, while /healthz stays
    200 (the HTTP server answers from its spare descriptor);
  - once the idle connections are closed, a real gRPC call (ListRuns, or an analyzer view
    answering NOT_FOUND) on a new channel succeeds within 15 s, /readyz is 200 again and
    /metrics counts the listener restart;
  - SIGTERM: the daemon exits 0."""
import os
import resource
import socket
import time

import kpfix

kpfix.require_env()
import grpc  # noqa: E402
import kprof_pb2 as pb  # noqa: E402

LIMIT = 256
IDLE = 300


def low_nofile():
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def exhaust_and_recover(d, call):
    """call(timeout) makes one real gRPC call on a new channel and raises if it fails."""
    # Ready first (the analyzer answers 503 until its first PostgreSQL check has passed).
    kpfix.wait_for(lambda: d.get("/readyz")[0] == 200, 15, "/readyz ok before the test")
    call(10)
    host, port = d.grpc.rsplit(":", 1)
    idle = []
    try:
        for _ in range(IDLE):
            s = socket.socket()
            s.settimeout(5)
            s.connect((host, int(port)))
            idle.append(s)
        status, body = kpfix.wait_for(
            lambda: (lambda r: r if r[0] == 503 else None)(d.get("/readyz")), 15,
            "/readyz to say not ready while gRPC cannot accept")
        assert "accepting" in body or "listening" in body, body
        assert d.get("/healthz") == (200, "ok\n"), d.get("/healthz")
    finally:
        for s in idle:
            s.close()
    t0 = time.monotonic()

    def works():
        try:
            call(2)
            return True
        except grpc.RpcError:
            return False
    kpfix.wait_for(works, 15, "a gRPC call to succeed after the idle connections closed")
    took = time.monotonic() - t0
    kpfix.wait_for(lambda: d.get("/readyz")[0] == 200, 5, "/readyz ok again")
    status, text = d.get("/metrics")
    assert status == 200, (status, text)
    restarts = [l for l in text.splitlines()
                if not l.startswith("#") and "grpc_listener_restarts_total " in l]
    assert restarts and float(restarts[0].split()[-1]) >= 1, text
    return took


def list_runs(d):
    def call(timeout):
        ch = grpc.insecure_channel(d.grpc)
        try:
            ch.unary_unary("/kprof.v1.Control/ListRuns",
                           request_serializer=pb.ListRunsRequest.SerializeToString,
                           response_deserializer=pb.ListRunsResponse.FromString)(
                pb.ListRunsRequest(), timeout=timeout)
        finally:
            ch.close()
    return call


def breakdown(d):
    def call(timeout):
        ch = grpc.insecure_channel(d.grpc)
        try:
            ch.unary_unary("/kprof.v1.Analyzer/Breakdown",
                           request_serializer=pb.BreakdownRequest.SerializeToString,
                           response_deserializer=pb.BreakdownResponse.FromString)(
                pb.BreakdownRequest(run_id=424242), timeout=timeout)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:  # the daemon's own answer
                raise
        finally:
            ch.close()
    return call


def main():
    ci = kpfix.fresh_db("kp_it_emfile")
    cd = kpfix.Daemon("it_emfile_cd", [os.path.join(kpfix.BIN, "collectord", "kprof-collectord"),
                                       "--pg-conninfo", ci], preexec=low_nofile)
    try:
        took_cd = exhaust_and_recover(cd, list_runs(cd))
    finally:
        rc = cd.stop()
    assert rc == 0, cd.log_text()
    an = kpfix.Daemon("it_emfile_an", [os.path.join(kpfix.BIN, "analyzer", "kprof-analyzer"),
                                       "--pg-conninfo", ci], preexec=low_nofile)
    try:
        took_an = exhaust_and_recover(an, breakdown(an))
    finally:
        rc = an.stop()
    assert rc == 0, an.log_text()
    print("emfile: gRPC served again %.1f s (collectord) and %.1f s (analyzer) after %d idle "
          "connections under a %d-descriptor limit closed" % (took_cd, took_an, IDLE, LIMIT))


if __name__ == "__main__":
    main()
