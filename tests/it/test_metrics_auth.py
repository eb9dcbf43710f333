"""/metrics of kprof-collectord, kprof-analyzer and kprof-agent: what it shows and who may read it.

Each daemon runs with --metrics-token-file (a 0600 file, the token on its first line). Then:
  - /metrics without a token, with a wrong one or with another scheme answers 401 with
    "WWW-Authenticate: Bearer" and shows no metric; with "Authorization: Bearer <token>" it
    answers 200 with the daemon's metrics;
  - /healthz and /readyz answer 200 without a token and say only "ok";
  - nothing /metrics, /healthz or /readyz answers carries the token, the token file's path,
    the PostgreSQL conninfo, the test's directories or a run's job and name (a run is created
    first, and the analyzer is asked about it);
  - a token file others may read (0644) is refused: the daemon exits 1 naming the file."""
import os
import secrets
import subprocess

import kpfix

kpfix.require_env()
import grpc  # noqa: E402
import kprof_pb2 as pb  # noqa: E402

COLLECTORD = os.path.join(kpfix.BIN, "collectord", "kprof-collectord")
ANALYZER = os.path.join(kpfix.BIN, "analyzer", "kprof-analyzer")
AGENT = os.path.join(kpfix.BIN, "agent", "kprof-agent")
DIR = os.path.join(kpfix.TEST_DIR, "it_metrics_auth")


def check(d, token, token_file, secrets_):
    status, body = d.get("/metrics")
    assert status == 401, (status, body)
    assert d.last_headers.get("WWW-Authenticate", "").startswith("Bearer"), d.last_headers
    assert "kprof_" not in body, body
    for wrong in ("Bearer " + token + "x", "Bearer " + token[:-1], "Basic " + token, "Bearer"):
        status, body = d.get("/metrics", {"Authorization": wrong})
        assert status == 401 and "kprof_" not in body, (wrong, status, body)
    status, body = d.get("/metrics", {"Authorization": "Bearer " + token})
    assert status == 200 and "kprof_" in body, (status, body)
    pages = [body]
    for path in ("/healthz", "/readyz"):
        status, text = d.get(path)
        assert (status, text) == (200, "ok\n"), (path, status, text)
        pages.append(text)
    for page in pages:
        for s in [token, token_file, DIR, kpfix.TEST_DIR] + secrets_:
            assert s not in page, "%r leaks %r:\n%s" % (d.log_path, s, page)


def main():
    os.makedirs(DIR, exist_ok=True)
    token = "mt-" + secrets.token_hex(16)
    token_file = os.path.join(DIR, "metrics.token")
    with open(token_file, "w") as f:
        f.write(token + "\n")
    os.chmod(token_file, 0o600)
    ci = kpfix.fresh_db("kp_it_metrics_auth")
    job, name = "job-" + secrets.token_hex(6), "run-" + secrets.token_hex(6)
    leaks = [ci, job, name, "kp_it_metrics_auth"]

    cd = kpfix.Daemon("it_metrics_auth_cd", [COLLECTORD, "--pg-conninfo", ci,
                                       "--metrics-token-file", token_file], preexec=None)
    an = ag = None
    try:
        ch = grpc.insecure_channel(cd.grpc)
        run = ch.unary_unary("/kprof.v1.Control/CreateRun",
                             request_serializer=pb.CreateRunRequest.SerializeToString,
                             response_deserializer=pb.Run.FromString)(
            pb.CreateRunRequest(job=job, name=name, world_size=1), timeout=30)
        ch.close()
        check(cd, token, token_file, leaks)
        an = kpfix.Daemon("it_metrics_auth_an", [ANALYZER, "--pg-conninfo", ci,
                                           "--metrics-token-file", token_file], preexec=None)
        ch = grpc.insecure_channel(an.grpc)
        try:
            ch.unary_unary("/kprof.v1.Analyzer/Breakdown",
                           request_serializer=pb.BreakdownRequest.SerializeToString,
                           response_deserializer=pb.BreakdownResponse.FromString)(
                pb.BreakdownRequest(run_id=run.id), timeout=30)
        except grpc.RpcError:
            pass  # an empty run: only the counters it moves matter here
        ch.close()
        check(an, token, token_file, leaks)
        ag = kpfix.Daemon("it_metrics_auth_ag", [AGENT, "--socket", os.path.join(DIR, "agent.sock"),
                                           "--collector", cd.grpc, "--spool-dir",
                                           os.path.join(DIR, "spool"),
                                           "--metrics-token-file", token_file],
                    preexec=None, grpc=False)
        check(ag, token, token_file, leaks + [os.path.join(DIR, "agent.sock")])
    finally:
        for d in (ag, an, cd):
            if d is not None:
                assert d.stop() == 0, d.log_text()
    # A token file others may read is refused at start, naming the file.
    os.chmod(token_file, 0o644)
    for argv in ([COLLECTORD, "--pg-conninfo", ci], [ANALYZER, "--pg-conninfo", ci],
                 [AGENT, "--socket", os.path.join(DIR, "agent2.sock"), "--collector",
                  "127.0.0.1:1", "--spool-dir", os.path.join(DIR, "spool2")]):
        extra = ["--listen", "127.0.0.1:0"] if argv[0] != AGENT else []
        p = subprocess.run(argv + extra + ["--http-listen", "127.0.0.1:0",
                                           "--metrics-token-file", token_file],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and token_file in p.stderr + p.stdout, (argv[0], p)
        assert token not in p.stderr + p.stdout
    print("metrics auth: /metrics 401 without the bearer token on collectord, analyzer and "
          "agent; nothing sensitive on /metrics, /healthz, /readyz")


if __name__ == "__main__":
    main()
