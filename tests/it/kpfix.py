"""Fixtures for kprof's script tests: a fresh database on the test PostgreSQL, kprof-collectord
and kprof-analyzer child processes (stopped by pid), and for the security tests a throwaway PKI
(make_pki), token files (write_tokens), grpcio channels with credentials (channel) and an agent
played over Control.Attach (AttachAgent). Used by
tests/it/test_*.py."""
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

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
    the same port after a restart, or a stack whose ports are given ahead). Taken below the
    kernel's ephemeral range: a port from bind(0) is one any outgoing connection (a daemon's
    to PostgreSQL or Kafka) may take as its local port before the server binds it, which made
    kprof-stack fail with "Address already in use" in CI."""
    import random
    import socket
    lo = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    for _ in range(200):
        port = random.randrange(max(1024, lo - 12000), lo)
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            s.close()
    raise AssertionError("no free TCP port below %d on 127.0.0.1" % lo)


def fresh_db(name):
    psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name, db="postgres")
    psql("CREATE DATABASE %s" % name, db="postgres")
    return conninfo(name)


MIGRATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sql",
                          "migrations")


def schema_before(db, version):
    """A fresh database db as the migrations before version left it (what an earlier release's
    --migrate made): the same files, each in one transaction, recorded in
    kp_schema_migrations."""
    import re
    fresh_db(db)
    psql("CREATE TABLE kp_schema_migrations (version integer PRIMARY KEY, name text NOT NULL, "
         "applied_at timestamptz NOT NULL DEFAULT now())", db=db)
    for f in sorted(os.listdir(MIGRATIONS)):
        m = re.match(r"(\d{4})_(.*)\.sql$", f)
        if not m or int(m.group(1)) >= version:
            continue
        p = subprocess.run([PSQL, conninfo(db), "-qX", "-1", "-v", "ON_ERROR_STOP=1", "-f",
                            os.path.join(MIGRATIONS, f)], capture_output=True, text=True)
        assert p.returncode == 0, (f, p.stderr)
        psql("INSERT INTO kp_schema_migrations (version, name) VALUES (%d, '%s')"
             % (int(m.group(1)), f[:-4]), db=db)


def migrate(db, expect):
    """`kprof-collectord --migrate` on db: it exits 0 and prints expect (e.g. "applied
    0017_rank_brin", "0 migrations applied")."""
    p = subprocess.run([os.path.join(BIN, "collectord", "kprof-collectord"), "--migrate",
                        "--pg-conninfo", conninfo(db)], capture_output=True, text=True,
                       timeout=300 * SCALE)
    assert p.returncode == 0 and expect in p.stdout, (expect, p.stdout, p.stderr)


def wait_for(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s * SCALE
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


OPENSSL = "/usr/bin/openssl"


class Pki:
    """A throwaway PKI in a directory: a CA, a server certificate for localhost/127.0.0.1, client
    certificates whose SAN URI is urn:kprof:ROLE:NAME (client()), and a second CA that the
    daemons do not trust (other_client()). Paths are attributes; every key has mode 0600."""

    def __init__(self, d):
        self.dir = d
        os.makedirs(d, exist_ok=True)
        self.ca, self.ca_key = self._ca("ca", "kprof test CA")
        self.other_ca, self.other_ca_key = self._ca("other-ca", "another CA")
        self.server, self.server_key = self._leaf("server", self.ca, self.ca_key, "localhost",
                                                  "DNS:localhost,IP:127.0.0.1", "serverAuth")

    def _run(self, *args):
        subprocess.run([OPENSSL] + list(args), check=True, capture_output=True)

    def _key(self, name):
        path = os.path.join(self.dir, name + ".key")
        self._run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out",
                  path)
        os.chmod(path, 0o600)
        return path

    def _ca(self, name, cn):
        key = self._key(name)
        cert = os.path.join(self.dir, name + ".pem")
        self._run("req", "-x509", "-new", "-key", key, "-subj", "/CN=" + cn, "-days", "2",
                  "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", cert)
        return cert, key

    def _leaf(self, name, ca, ca_key, cn, san, usage):
        key = self._key(name)
        csr = os.path.join(self.dir, name + ".csr")
        cert = os.path.join(self.dir, name + ".pem")
        ext = os.path.join(self.dir, name + ".ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n"
                    % (san, usage))
        self._run("req", "-new", "-key", key, "-subj", "/CN=" + cn, "-out", csr)
        self._run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                  "-days", "2", "-extfile", ext, "-out", cert)
        return cert, key

    def client(self, role, name, uri=None):
        """A client certificate of this CA for urn:kprof:ROLE:NAME (or uri): (cert, key)."""
        tag = "client-%s-%s" % (role, name.replace("*", "any"))
        return self._leaf(tag, self.ca, self.ca_key, name,
                          "URI:" + (uri or "urn:kprof:%s:%s" % (role, name)), "clientAuth")

    def other_client(self, role, name):
        """A client certificate for urn:kprof:ROLE:NAME signed by the CA nobody trusts."""
        return self._leaf("other-%s-%s" % (role, name), self.other_ca, self.other_ca_key, name,
                          "URI:urn:kprof:%s:%s" % (role, name), "clientAuth")

    def daemon_flags(self, token_file=None, client_ca=True):
        """The flags that make a daemon serve TLS with authentication (no plaintext, no
        anonymous callers, whatever KPROF_PLAINTEXT / KPROF_ALLOW_ANONYMOUS say)."""
        flags = ["--no-plaintext", "--no-allow-anonymous", "--tls-cert", self.server,
                 "--tls-key", self.server_key]
        if token_file:
            flags += ["--auth-tokens", token_file]
        if client_ca:
            flags += ["--tls-client-ca", self.ca]
        return flags


def make_pki(d):
    """A Pki in directory d (made with Debian's openssl CLI)."""
    return Pki(d)


def write_tokens(path, lines, mode=0o600):
    """Writes a token file (each line "ROLE NAME TOKEN [expires=...]") atomically (a rename, as
    an operator rotating tokens would), with mode."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(l + "\n" for l in lines))
    os.chmod(tmp, mode)
    os.rename(tmp, path)
    return path


def channel(addr, pki=None, cert=None, root=None):
    """A grpcio channel to addr: plaintext without pki, else TLS trusting pki's CA (or root),
    offering the client certificate cert=(cert, key) if given. Tokens go per call:
    metadata=bearer(token)."""
    import grpc
    if pki is None:
        return grpc.insecure_channel(addr)

    def read(p):
        with open(p, "rb") as f:
            return f.read()
    creds = grpc.ssl_channel_credentials(read(root or pki.ca),
                                         read(cert[1]) if cert else None,
                                         read(cert[0]) if cert else None)
    return grpc.secure_channel(addr, creds, options=[("grpc.ssl_target_name_override",
                                                      "localhost")])


def bearer(token):
    """The metadata of a call that brings token."""
    return [("authorization", "Bearer " + token)] if token else []


class Daemon:
    """A daemon child (collectord, the analyzer with grpc=True; the agent without) on
    127.0.0.1:0, ready once its ready file exists; preexec runs in the child before exec
    (e.g. a lower open-file limit). get() asks its HTTP server."""

    def __init__(self, name, argv, preexec=None, grpc=True):
        self.dir = os.path.join(TEST_DIR, name)
        os.makedirs(self.dir, exist_ok=True)
        ready = os.path.join(self.dir, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        self.log_path = os.path.join(self.dir, "daemon.log")
        self.log = open(self.log_path, "w")
        listen = ["--listen", "127.0.0.1:0"] if grpc else []
        self.proc = subprocess.Popen(argv + listen + ["--http-listen", "127.0.0.1:0",
                                                      "--ready-file", ready],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec)
        wait_for(lambda: os.path.exists(ready) or self.proc.poll() is not None, 30,
                       name + " ready")
        assert self.proc.poll() is None, self.log_text()
        addrs = dict(l.strip().split("=", 1) for l in open(ready) if "=" in l)
        self.grpc, self.http = addrs.get("grpc"), addrs["http"]
        self.web = addrs.get("web")  # the analyzer with --web-listen

    def get(self, path, headers=None):
        """(status, body), or (None, why) when the request got no answer; the answer's
        headers in self.last_headers."""
        req = urllib.request.Request("http://%s%s" % (self.http, path), headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                self.last_headers = r.headers
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            self.last_headers = e.headers
            return e.code, e.read().decode()
        except (urllib.error.URLError, OSError) as e:
            return None, str(e)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
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



class Collectord:
    """kprof-collectord as a child process on 127.0.0.1:0, ready when its ready file exists.
    secure=(pki, token_file): serve TLS with tokens and client certificates (Pki.daemon_flags)."""

    BINARY = ("collectord", "kprof-collectord")
    WHAT = "collectord"

    def __init__(self, name, conninfo_, extra=(), secure=None):
        if secure is not None:
            extra = list(secure[0].daemon_flags(secure[1])) + list(extra)
        self.dir = os.path.join(TEST_DIR, name)
        os.makedirs(self.dir, exist_ok=True)
        self.ready = os.path.join(self.dir, "ready")
        self.log_path = os.path.join(self.dir, self.BINARY[0] + ".log")
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, *self.BINARY), "--listen", "127.0.0.1:0",
             "--http-listen", "127.0.0.1:0", "--pg-conninfo", conninfo_,
             "--ready-file", self.ready] + list(extra),
            stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: os.path.exists(self.ready) or self.proc.poll() is not None, 30,
                     self.WHAT + " ready")
        except AssertionError:
            self.proc.kill()  # not ready in time: do not leave it running
            self.proc.wait()
            self.log.close()
            raise AssertionError(self.WHAT + " not ready in 30 s:\n" + self.log_text())
        if self.proc.poll() is not None:
            raise AssertionError(self.WHAT + " exited: " + open(self.log_path).read())
        addrs = dict(l.strip().split("=", 1) for l in open(self.ready) if "=" in l)
        self.grpc = addrs["grpc"]
        self.http = addrs.get("http")
        self.web = addrs.get("web")  # the analyzer with --web-listen

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

    def metric(self, name):
        """The value of one unlabelled metric on the daemon's /metrics."""
        with urllib.request.urlopen("http://%s/metrics" % self.http, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError("no metric " + name)

    def assert_clean_log(self):
        text = self.log_text()
        for bad in ("Sanitizer", "runtime error:", "LeakSanitizer"):
            assert bad not in text, "sanitizer report in collectord log:\n" + text


class Analyzer(Collectord):
    """kprof-analyzer as a child process on 127.0.0.1:0 (like Collectord; secure= alike)."""

    BINARY = ("analyzer", "kprof-analyzer")
    WHAT = "kprof-analyzer"


class AttachAgent:
    """kprof-agent played with grpcio: one Control.Attach call on channel ch with metadata md
    (kpfix.bearer(token), or [] with a client certificate), reporting host, agent_id and the
    processes of job's ranks (world size world); set_state reports a capture rank's state,
    commands from collectord are collected (wait_arm), wait_end gives the call's status."""

    def __init__(self, ch, md, host, agent_id, job, ranks=(), world=2):
        import grpc
        import kprof_pb2 as pb
        self.pb, self.grpc = pb, grpc
        self.host, self.agent_id, self.procs, self.world = host, agent_id, list(ranks), world
        self.job = job
        self.states = {}
        self.commands, self.error, self.done = [], None, False
        self.cv = threading.Condition()
        self.q = queue.Queue()
        stub = ch.stream_stream("/kprof.v1.Control/Attach", request_serializer=lambda m: m,
                                response_deserializer=self.pb.CaptureCommand.FromString)
        self.call = stub(self._gen(), metadata=md)
        threading.Thread(target=self._recv, daemon=True).start()
        self.report()

    def _gen(self):
        while True:
            m = self.q.get()
            if m is None:
                return
            yield m

    def _recv(self):
        try:
            for c in self.call:
                with self.cv:
                    self.commands.append(c)
                    self.cv.notify_all()
        except self.grpc.RpcError as e:
            self.error = e
        with self.cv:
            self.done = True
            self.cv.notify_all()

    def report(self):
        r = self.pb.AgentReport(host=self.host, agent_id=self.agent_id, version="test")
        for rank in self.procs:
            r.processes.add(job=self.job, rank=rank, local_rank=rank, world_size=self.world,
                            pid=4000 + rank, device=rank, step=10, step_ms=50, step_age_ms=0)
        for (run, rank), st in sorted(self.states.items()):
            r.ranks.add(run_id=run, rank=rank, state=st, pid=4000 + rank, records=3,
                        first_step=1, last_step=2)
        self.q.put(r.SerializeToString())

    def set_state(self, run, rank, st):
        self.states[(run, rank)] = st
        self.report()

    def wait_end(self, timeout=15):
        wait_for(lambda: self.done, timeout, "the Attach call of %s to end" % self.host)
        return self.error.code() if self.error else self.grpc.StatusCode.OK, \
            self.error.details() if self.error else ""

    def wait_arm(self, run, timeout=15):
        def found():
            with self.cv:
                return [c for c in self.commands if c.kind == self.pb.CaptureCommand.KIND_ARM
                        and c.run_id == run]
        return wait_for(found, timeout, "ARM of run %d on %s" % (run, self.host))[0]

    def close(self):
        self.q.put(None)
        self.call.cancel()


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


class KafkaMock:
    """build/tools/kprof-kafka-mock (librdkafka's mock cluster) as a child process on loopback,
    stopped by pid; command() sends one stdin command ("down 2", "leader T 0 3", ...) and
    returns its answer. self.bootstrap is the brokers' address list. cat() runs
    kprof-kafka-cat against it."""

    def __init__(self, name, brokers=3, partitions=4, topic="kprof.batches"):
        self.dir = os.path.join(TEST_DIR, name)
        os.makedirs(self.dir, exist_ok=True)
        ready = os.path.join(self.dir, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        self.log_path = os.path.join(self.dir, "kafka-mock.log")
        self.log = open(self.log_path, "w")
        self.topic = topic
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "tools", "kprof-kafka-mock"), "--brokers", str(brokers),
             "--partitions", str(partitions), "--topic", topic, "--ready-file", ready],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        wait_for(lambda: os.path.exists(ready) or self.proc.poll() is not None, 30,
                 "kafka mock ready")
        assert self.proc.poll() is None, open(self.log_path).read()
        addrs = dict(l.strip().split("=", 1) for l in open(ready) if "=" in l)
        self.bootstrap = addrs["bootstrap"]

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def cat(self, *args, timeout_ms=30000):
        """kprof-kafka-cat ARGS: (exit status, stdout, stderr)."""
        p = subprocess.run([os.path.join(BIN, "tools", "kprof-kafka-cat"), "--brokers",
                            self.bootstrap, "--topic", self.topic, "--timeout-ms",
                            str(timeout_ms)] + list(args), capture_output=True, text=True,
                           timeout=timeout_ms / 1000 + 60)
        return p.returncode, p.stdout, p.stderr

    def records(self, timeout_ms=30000):
        """Every record of the topic: [(partition, offset, key, value bytes)]."""
        rc, out, err = self.cat("consume", timeout_ms=timeout_ms)
        assert rc == 0, "kprof-kafka-cat consume failed: " + err
        recs = []
        for line in out.splitlines():
            part, off, key, val = line.split(" ")
            recs.append((int(part), int(off), key, bytes.fromhex(val)))
        return recs

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30 * SCALE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
