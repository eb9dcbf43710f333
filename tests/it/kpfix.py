"""Fixtures for kprof's script tests: a fresh database on the test PostgreSQL and a
kprof-collectord child process, stopped by pid. Used by tests/it/test_*.py."""
import os
import signal
import subprocess
import sys
import tempfile
import time

PG = os.environ.get("KPROF_TEST_PG", "")
BIN = os.environ.get("KPROF_BIN_DIR", "")
TEST_DIR = os.environ.get("KPROF_TEST_DIR", tempfile.gettempdir())
sys.path.insert(0, os.environ.get("KPROF_PROTO_PY", ""))
PSQL = "/usr/bin/psql"
SCALE = float(os.environ.get("KPROF_TEST_TIMEOUT_MULTIPLIER", "1"))


def require_env():
    if not PG or not BIN:
        print("KPROF_TEST_PG and KPROF_BIN_DIR must be set (run through ctest)", file=sys.stderr)
        sys.exit(1)


def conninfo(db):
    parts = [p for p in PG.split() if not p.startswith("dbname=")]
    return " ".join(parts + ["dbname=" + db])


def psql(sql, db="kprof"):
    out = subprocess.run([PSQL, conninfo(db), "-qtAX", "-v", "ON_ERROR_STOP=1", "-c", sql],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip()


def psql_rows(sql, db="kprof"):
    """The rows of a query as tuples of strings (NULL is ""). Fields are split on \\x1f, not
    '|', so names with any printable character survive; rows on \\n only."""
    out = subprocess.run([PSQL, conninfo(db), "-qtAX", "-F", "\x1f", "-v", "ON_ERROR_STOP=1",
                          "-c", sql], check=True, capture_output=True, text=True)
    return [tuple(line.split("\x1f")) for line in out.stdout.split("\n") if line]


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago (for a server that must come back on
    the same port after a restart)."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def fresh_db(name):
    psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name, db="postgres")
    psql("CREATE DATABASE %s" % name, db="postgres")
    return conninfo(name)


def wait_for(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s * SCALE
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


class Collectord:
    """kprof-collectord as a child process on 127.0.0.1:0, ready when its ready file exists."""

    def __init__(self, name, conninfo_, extra=()):
        self.dir = os.path.join(TEST_DIR, name)
        os.makedirs(self.dir, exist_ok=True)
        self.ready = os.path.join(self.dir, "ready")
        self.log_path = os.path.join(self.dir, "collectord.log")
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "collectord", "kprof-collectord"), "--listen", "127.0.0.1:0",
             "--http-listen", "127.0.0.1:0", "--pg-conninfo", conninfo_,
             "--ready-file", self.ready] + list(extra),
            stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30,
                     "collectord ready")
        except AssertionError:
            self.proc.kill()  # not ready in time: do not leave it running
            self.proc.wait()
            self.log.close()
            raise AssertionError("collectord not ready in 30 s:\n" + self.log_text())
        if self.proc.poll() is not None:
            raise AssertionError("collectord exited: " + open(self.log_path).read())
        addrs = dict(l.strip().split("=", 1) for l in open(self.ready) if "=" in l)
        self.grpc = addrs["grpc"]
        self.http = addrs.get("http")

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30 * SCALE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def log_text(self):
        with open(self.log_path) as f:
            return f.read()

    def assert_clean_log(self):
        text = self.log_text()
        for bad in ("Sanitizer", "runtime error:", "LeakSanitizer"):
            assert bad not in text, "sanitizer report in collectord log:\n" + text


class Stubs:
    """Hand-made grpcio stubs of kprof's services (no generated _pb2_grpc needed)."""

    def __init__(self, addr):
        import grpc
        import kprof_pb2 as pb
        self.channel = ch = grpc.insecure_channel(addr)

        def unary(path, req, resp):
            return ch.unary_unary(path, request_serializer=req.SerializeToString,
                                  response_deserializer=resp.FromString)
        self.create = unary("/kprof.v1.Control/CreateRun", pb.CreateRunRequest, pb.Run)
        self.end = unary("/kprof.v1.Control/EndRun", pb.EndRunRequest, pb.Run)
        self.list_runs = unary("/kprof.v1.Control/ListRuns", pb.ListRunsRequest,
                               pb.ListRunsResponse)
        self.push = ch.stream_stream("/kprof.v1.Ingest/Push",
                                     request_serializer=pb.Batch.SerializeToString,
                                     response_deserializer=pb.Ack.FromString)
        self.push_raw = ch.stream_stream("/kprof.v1.Ingest/Push",
                                         request_serializer=lambda b: b,
                                         response_deserializer=pb.Ack.FromString)

    def close(self):
        self.channel.close()


def expect_rpc_error(f, code, text):
    """Calls f(), a grpcio call that must fail with status code `code` and `text` in its
    details."""
    import grpc
    try:
        f()
    except grpc.RpcError as e:
        assert e.code() == code and text in e.details(), (e.code(), e.details())
        return
    raise AssertionError("expected " + str(code))
