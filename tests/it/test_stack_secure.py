"""The local stack is secure by default: deploy/local/kprof-stack up in a temporary directory.

Checks that `up`
  - makes the stack's CA, a certificate for each daemon and the token files, each mode 0600,
    and reuses them on a second `up`;
  - starts kprof-collectord and kprof-analyzer so that a plaintext client is refused and a call
    without a credential is UNAUTHENTICATED (kprofctl: exit 7, naming --token-file);
  - starts the agent with its own token (NAME: this host), so it attaches;
and that kprofctl with KPROF_TLS_CA and KPROF_TOKEN_FILE (the operator token, as `kprof-stack
env` prints) imports a trace, lists the run and reads its breakdown, while the viewer token
lists but may not drop or stop a run (PERMISSION_DENIED: exit 7, naming the operator role).
The analyzer serves the web UI at the https address `up` and `status` print
(KPROF_ANALYZER_WEB_PORT), with the stack's CA: its page without a credential, its API only with
the viewer token (the token file `up` names), which lists the imported run.
The stack is stopped by the pids in its pid files.
"""
import json
import os
import re
import shutil
import signal
import ssl
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kpfix  # noqa: E402

SRC = os.environ.get("KPROF_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STACK = os.path.join(SRC, "deploy", "local", "kprof-stack")
CTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
PIDS = ("agent.pid", "analyzer.pid", "collectord.pid")


def clean_env(extra):
    """The environment without the test suite's KPROF_PLAINTEXT/KPROF_ALLOW_ANONYMOUS (and any
    other KPROF_ setting), plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPROF_")}
    env.update(extra)
    return env


def stack(env, *args, timeout=180):
    return subprocess.run([STACK] + list(args), capture_output=True, text=True, env=env,
                          timeout=timeout * kpfix.SCALE, stdin=subprocess.DEVNULL)


def ctl(env, *args):
    return subprocess.run([CTL] + list(args), capture_output=True, text=True, env=env,
                          timeout=120 * kpfix.SCALE, stdin=subprocess.DEVNULL)


def trace(path):
    """A two-step Kineto trace (one rank) for kprofctl import."""
    ev = []
    for step in range(2):
        base = 1000 + step * 1000
        ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#%d" % (step + 1),
                   "pid": 1, "tid": 1, "ts": base, "dur": 900, "args": {}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                   "ts": base + 100, "dur": 500, "args": {}})
    with open(path, "w") as f:
        json.dump({"traceEvents": ev}, f)


def stop_by_pid(sdir):
    """Stops the daemons by the pids in the stack's pid files (what `down` does)."""
    for name in PIDS:
        path = os.path.join(sdir, name)
        if not os.path.exists(path):
            continue
        pid = int(open(path).read().strip())
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 20 * kpfix.SCALE
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)


def grpc_checks(cd_addr, an_addr, ca, viewer_token):
    """Plaintext refused, TLS without a credential UNAUTHENTICATED, the viewer token may not
    DropRun: straight over grpcio, so the daemons (not kprofctl) are what is checked."""
    sys.path.insert(0, os.environ["KPROF_PROTO_PY"])
    import grpc
    import kprof_pb2 as pb

    def unary(ch, path, req, resp):
        return ch.unary_unary(path, request_serializer=req.SerializeToString,
                              response_deserializer=resp.FromString)

    calls = {cd_addr: ("/kprof.v1.Control/ListRuns", pb.ListRunsRequest(), pb.ListRunsResponse),
             an_addr: ("/kprof.v1.Analyzer/Breakdown", pb.BreakdownRequest(run_id=1),
                       pb.BreakdownResponse)}
    creds = grpc.ssl_channel_credentials(root_certificates=open(ca, "rb").read())
    for addr, (path, req, resp) in calls.items():
        # A plaintext client: the TLS server does not speak to it.
        with grpc.insecure_channel(addr) as ch:
            try:
                unary(ch, path, req, resp)(req, timeout=5 * kpfix.SCALE)
                raise AssertionError("%s answered a plaintext call" % addr)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE, (addr, e.code(), e.details())
        # TLS, no credential.
        with grpc.secure_channel(addr, creds) as ch:
            kpfix.expect_rpc_error(lambda: unary(ch, path, req, resp)(req, timeout=10 * kpfix.SCALE),
                                   grpc.StatusCode.UNAUTHENTICATED, "no credential")
            # A wrong token.
            kpfix.expect_rpc_error(
                lambda: unary(ch, path, req, resp)(
                    req, timeout=10 * kpfix.SCALE,
                    metadata=[("authorization", "Bearer " + "x" * 48)]),
                grpc.StatusCode.UNAUTHENTICATED, "")
    with grpc.secure_channel(cd_addr, creds) as ch:
        drop = unary(ch, "/kprof.v1.Control/DropRun", pb.DropRunRequest, pb.Run)
        kpfix.expect_rpc_error(
            lambda: drop(pb.DropRunRequest(run_id=1), timeout=10 * kpfix.SCALE,
                         metadata=[("authorization", "Bearer " + viewer_token)]),
            grpc.StatusCode.PERMISSION_DENIED, "operator")


def web_checks(up, status, port, ca, viewer, run):
    """The web UI at the address up and status print, over TLS with the stack's CA."""
    url = "https://localhost:%s/" % port
    m = re.search(r"web UI\s+(\S+)\s+\(sign in with the viewer token: (\S+)\)", up)
    assert m and m.group(1) == url and m.group(2) == viewer, "up does not print the web UI:\n" + up
    assert url in status and viewer in status, "status does not print the web UI:\n" + status
    tls = ssl.create_default_context(cafile=ca)

    def get(path, token=None):
        req = urllib.request.Request(url + path, headers={"Authorization": "Bearer " + token}
                                     if token else {})
        try:
            with urllib.request.urlopen(req, context=tls, timeout=30 * kpfix.SCALE) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    st, h, body = get("")
    with open(os.path.join(SRC, "web", "index.html"), "rb") as f:
        assert st == 200 and body == f.read(), (st, body[:200])
    assert "frame-ancestors 'none'" in h["Content-Security-Policy"], dict(h)
    st, _, body = get("api/v1/runs")
    assert st == 401, (st, body)
    st, _, body = get("api/v1/runs", open(viewer).read().strip())
    assert st == 200 and [r for r in json.loads(body)["runs"] if r["id"] == run], (st, body)
    print("web UI: %s over the stack's TLS; the API with the viewer token" % url)


def main():
    kpfix.require_env()
    tmp = tempfile.mkdtemp(prefix="kprof-stack-secure-", dir=kpfix.TEST_DIR)
    os.chmod(tmp, 0o755)  # as root, the postgres user must reach the data directory inside
    sdir = os.path.join(tmp, "stack")
    ports = {k: str(kpfix.free_port()) for k in (
        "KPROF_PG_PORT", "KPROF_COLLECTOR_PORT", "KPROF_COLLECTOR_HTTP_PORT",
        "KPROF_ANALYZER_PORT", "KPROF_ANALYZER_HTTP_PORT", "KPROF_ANALYZER_WEB_PORT")}
    env = clean_env(dict(ports, KPROF_STACK_DIR=sdir, KPROF_BUILD_DIR=kpfix.BIN))
    try:
        p = stack(env, "up")
        assert p.returncode == 0, "kprof-stack up exited %d:\n%s\n%s" % (
            p.returncode, p.stdout, p.stderr)
        files = ["tls/ca.pem", "tls/ca.key", "tls/collectord.pem", "tls/collectord.key",
                 "tls/analyzer.pem", "tls/analyzer.key", "auth/tokens", "auth/agent.token",
                 "auth/operator.token", "auth/viewer.token"]
        before = {}
        for f in files:
            path = os.path.join(sdir, f)
            assert os.path.isfile(path), "kprof-stack up made no " + f
            mode = stat.S_IMODE(os.stat(path).st_mode)
            assert mode == 0o600, "%s has mode %o, not 600" % (f, mode)
            before[f] = open(path).read()
        table = [l.split() for l in before["auth/tokens"].splitlines() if l.strip()]
        roles = {r[0]: r for r in table}
        assert set(roles) == {"agent", "operator", "viewer"}, table
        for role in roles:
            assert roles[role][2] == before["auth/%s.token" % role].strip(), role
        assert roles["agent"][1] != "*", "the agent token names its node, not every node"

        # What `env` prints is what a user exports.
        exports = dict(l.strip()[len("export "):].split("=", 1)
                       for l in stack(env, "env").stdout.splitlines()
                       if l.strip().startswith("export "))
        for k in ("KPROF_COLLECTOR", "KPROF_ANALYZER", "KPROF_TLS_CA", "KPROF_TOKEN_FILE"):
            assert k in exports, "kprof-stack env does not export %s: %s" % (k, exports)
        assert exports["KPROF_TLS_CA"] == os.path.join(sdir, "tls/ca.pem"), exports
        assert exports["KPROF_TOKEN_FILE"] == os.path.join(sdir, "auth/operator.token"), exports
        viewer = os.path.join(sdir, "auth/viewer.token")
        assert viewer in p.stdout, "up does not tell where the viewer token is:\n" + p.stdout
        user = clean_env({k: exports[k] for k in ("KPROF_COLLECTOR", "KPROF_ANALYZER",
                                                  "KPROF_TLS_CA", "KPROF_TOKEN_FILE")})

        # The daemons refuse plaintext and anonymous callers (grpcio, then kprofctl).
        grpc_checks(exports["KPROF_COLLECTOR"], exports["KPROF_ANALYZER"],
                    exports["KPROF_TLS_CA"], before["auth/viewer.token"].strip())
        q = ctl(dict(user, KPROF_TLS_CA="", KPROF_TOKEN_FILE=""), "runs")
        assert q.returncode == 5 and "--tls-ca" in q.stderr, (q.returncode, q.stderr)
        for verb in (["runs"], ["breakdown", "--run", "1", "--rank", "0"]):
            q = ctl(dict(user, KPROF_TOKEN_FILE=""), *verb)
            assert q.returncode == 7, (verb, q.returncode, q.stderr)
            assert "UNAUTHENTICATED" in q.stderr and "--token-file" in q.stderr, q.stderr

        # The agent attached with its own token.
        log = os.path.join(sdir, "collectord.log")
        kpfix.wait_for(lambda: "agent attached host=%s " % roles["agent"][1] in open(log).read(),
                       20, "the stack's agent to attach:\n" + open(log).read())

        # The operator token (KPROF_TOKEN_FILE): import, list, breakdown.
        tr = os.path.join(tmp, "rank-0.pt.trace.json")
        trace(tr)
        q = ctl(user, "import", "--job", "secure", "--json", tr)
        assert q.returncode == 0, (q.returncode, q.stderr)
        run = json.loads(q.stdout)["run_id"]
        q = ctl(user, "runs", "--json")
        assert q.returncode == 0, q.stderr
        assert [r for r in json.loads(q.stdout) if r["id"] == run and r["job"] == "secure"], q.stdout
        q = ctl(user, "breakdown", "--run", str(run), "--rank", "0", "--json")
        assert q.returncode == 0, (q.returncode, q.stderr)
        assert json.loads(q.stdout), q.stdout

        # The daemons hold their PostgreSQL sessions as their own logins, in the least role
        # that does their work (collectord kprof_writer, the analyzer kprof_reader), never as
        # the schema owner.
        pgport = ports["KPROF_PG_PORT"]
        conn = "host=127.0.0.1 port=%s user=kprof dbname=kprof passfile=%s" % (
            pgport, os.path.join(sdir, "pgpass"))
        q = subprocess.run(["psql", conn, "-qtAXc",
                            "SELECT DISTINCT usename || ':' || application_name FROM "
                            "pg_stat_activity WHERE datname = 'kprof' AND usename <> 'kprof'"],
                           capture_output=True, text=True, timeout=30)
        assert q.returncode == 0, q.stderr
        sessions = set(q.stdout.split())
        assert any(x.startswith("kprof_collectord:") for x in sessions), sessions
        assert any(x.startswith("kprof_analyzer:") for x in sessions), sessions
        q = subprocess.run(["psql", conn, "-qtAXc",
                            "SELECT r.rolname || '>' || g.rolname FROM pg_auth_members m "
                            "JOIN pg_roles r ON r.oid = m.member JOIN pg_roles g ON g.oid = m.roleid "
                            "WHERE r.rolname IN ('kprof_collectord', 'kprof_analyzer')"],
                           capture_output=True, text=True, timeout=30)
        assert set(q.stdout.split()) == {"kprof_collectord>kprof_writer",
                                         "kprof_analyzer>kprof_reader"}, q.stdout

        # The viewer token reads, but may not stop, drop (over grpcio above) or import.
        as_viewer = dict(user, KPROF_TOKEN_FILE=viewer)
        q = ctl(as_viewer, "runs", "--json")
        assert q.returncode == 0 and str(run) in q.stdout, (q.returncode, q.stderr)
        q = ctl(as_viewer, "stop", "--run", str(run))
        assert q.returncode == 7, (q.returncode, q.stderr)
        assert "PERMISSION_DENIED" in q.stderr and "operator role" in q.stderr, q.stderr
        q = ctl(as_viewer, "import", "--job", "secure-viewer", tr)
        assert q.returncode == 7 and "operator role" in q.stderr, (q.returncode, q.stderr)

        web_checks(p.stdout, stack(env, "status").stdout, ports["KPROF_ANALYZER_WEB_PORT"],
                   exports["KPROF_TLS_CA"], viewer, run)

        # A second up reuses every credential.
        p = stack(env, "up")
        assert p.returncode == 0, p.stderr
        for f in files:
            assert open(os.path.join(sdir, f)).read() == before[f], f + " changed on a second up"
        print("ok")
    finally:
        stop_by_pid(sdir)
        stack(env, "down", timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
