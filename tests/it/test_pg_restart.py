"""PostgreSQL restarting under running daemons: the first call after the restart works.

kprof-collectord's Control and kprof-analyzer keep one PostgreSQL connection per worker. A
restart (pg_ctl restart -m fast, and -m immediate: a crash and recovery) kills those
connections while they sit idle; the first call after it must reconnect and answer, not fail
with UNAVAILABLE from the dead connection (kprof-loadgen's EndRun did, leaving its run OPEN).
For each mode, PostgreSQL restarts before each of: kprofctl runs (ListRuns), CreateRun and
EndRun over grpcio, kprofctl start (StartCapture, which finds no agent: exit 6, not 5),
kprofctl breakdown and ops (Analyzer views) and kprofctl export; each is the first call after
its restart and must succeed. With PostgreSQL stopped, kprofctl runs and breakdown exit 5
(docs/cli.md) and say that PostgreSQL is unreachable, not "is kprof-collectord running?".

The test runs its own PostgreSQL (tests/it/pgfix.sh) in KPROF_TEST_DIR, so restarting it
disturbs no other test."""
import glob
import json
import os
import subprocess
import sys

import kpfix
import test_analyzer_service as tas

kpfix.require_env()
import grpc  # noqa: E402
import kprof_pb2 as pb  # noqa: E402

PGFIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pgfix.sh")
PG_DIR = os.path.join(kpfix.TEST_DIR, "pg_restart_cluster")
PG_PORT = "5447"
KPROFCTL = tas.KPROFCTL


def pg_bindir():
    if os.environ.get("KPROF_PG_BINDIR"):
        return os.environ["KPROF_PG_BINDIR"]
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                    key=lambda p: [int(x) if x.isdigit() else 0 for x in p.split("/")],
                    reverse=True):
        if os.path.exists(os.path.join(d, "pg_ctl")):
            return d
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
    return out.stdout.strip()


def pg_ctl(*args):
    """pg_ctl on the test's cluster, as its owner (postgres when we are root, like pgfix.sh)."""
    cmd = [os.path.join(pg_bindir(), "pg_ctl"), "-D", os.path.join(PG_DIR, "db"), "-w",
           "-t", "120"] + list(args)
    if os.getuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180 * kpfix.SCALE)
    assert p.returncode == 0, ("pg_ctl", args, p.stdout, p.stderr)


def restart(mode):
    # -l keeps the log where pgfix.sh put it; -o the same socket-only options.
    pg_ctl("-m", mode, "-l", os.path.join(PG_DIR, "postgres.log"),
           "-o", "-c listen_addresses= -k '%s' -p %s" % (PG_DIR, PG_PORT), "restart")


def ctl(args):
    p = subprocess.run([KPROFCTL] + args, capture_output=True, text=True,
                       timeout=120 * kpfix.SCALE)
    for bad in tas.SANITIZER:
        assert bad not in p.stderr, p.stderr
    return p


def ok(p, what):
    assert p.returncode == 0, "%s exited %d:\n%s" % (what, p.returncode, p.stderr)
    return p


def import_run(cd_addr, tmp):
    path = os.path.join(tmp, "no_shapes.json")
    with open(path, "w") as f:
        json.dump(tas.no_shapes_trace(), f)
    p = ok(ctl(["import", "--collector", cd_addr, "--job", "pgrestart", "--json", "--rank", "0",
                "--progress", "off", path]), "kprofctl import")
    return json.loads(p.stdout)["run_id"]


def step(failures, what, f):
    """Runs one first call; a failure is noted, so that one run of the test names every call
    that does not survive the restart."""
    try:
        f()
    except (AssertionError, grpc.RpcError) as e:
        failures.append("%s: %s" % (what, e))


def first_calls(mode, cd, an, stubs, run_id, ci, tmp, failures):
    """Each call is the first one after its own restart."""
    def runs():
        p = ok(ctl(["runs", "--collector", cd.grpc, "--json"]), "kprofctl runs")
        assert any(r["id"] == run_id for r in json.loads(p.stdout)), p.stdout

    def create_end():
        restart(mode)
        run = stubs.create(pb.CreateRunRequest(job="pgrestart-" + mode, world_size=1), timeout=60)
        assert run.id > 0 and run.state == pb.RUN_STATE_OPEN, run
        restart(mode)
        ended = stubs.end(pb.EndRunRequest(run_id=run.id), timeout=60)
        assert ended.state == pb.RUN_STATE_ENDED, ended
        got = subprocess.run([kpfix.PSQL, ci, "-qtAX", "-c", "SELECT state, ended_at IS NOT NULL "
                              "FROM runs WHERE id = %d" % run.id], capture_output=True, text=True,
                             check=True).stdout.strip()
        assert got == "%d|t" % pb.RUN_STATE_ENDED, got

    def start():
        p = ctl(["start", "--collector", cd.grpc, "--job", "pgrestart-nobody", "--duration", "1s"])
        # No agent serves that job: the coordinator answers (3 or 6), not PostgreSQL's 5.
        assert p.returncode in (3, 6), (p.returncode, p.stderr)

    def view(verb):
        p = ok(ctl([verb, "--analyzer", an.grpc, "--run", str(run_id), "--rank", "0", "--json"]),
               "kprofctl " + verb)
        assert json.loads(p.stdout), p.stdout

    def export():
        out = os.path.join(tmp, "export-%s.json" % mode)
        ok(ctl(["export", "--run", str(run_id), "-o", out, "--analyzer", an.grpc]),
           "kprofctl export")
        assert os.path.getsize(out) > 0

    restart(mode)
    step(failures, "kprofctl runs after restart -m " + mode, runs)
    # create_end restarts before each of its two calls.
    step(failures, "CreateRun/EndRun after restart -m " + mode, create_end)
    restart(mode)
    step(failures, "kprofctl start after restart -m " + mode, start)
    for verb in ("breakdown", "ops"):
        restart(mode)
        step(failures, "kprofctl %s after restart -m %s" % (verb, mode), lambda: view(verb))
    restart(mode)
    step(failures, "kprofctl export after restart -m " + mode, export)


def pg_down(cd, an, run_id):
    pg_ctl("-m", "fast", "stop")
    try:
        for args, who in ((["runs", "--collector", cd.grpc], "collectord"),
                          (["breakdown", "--analyzer", an.grpc, "--run", str(run_id), "--rank",
                            "0"], "kprof-analyzer")):
            p = ctl(args)
            assert p.returncode == 5, (args, p.returncode, p.stderr)  # docs/cli.md: unreachable
            assert "PostgreSQL" in p.stderr, p.stderr
            # The daemon answered; the hint for a daemon that is not there would mislead.
            assert "is %s running" % who not in p.stderr and "is kprof-collectord running" \
                not in p.stderr and "(set --" not in p.stderr, p.stderr
            assert who in p.stderr, p.stderr
    finally:
        restart_cmd = ["-l", os.path.join(PG_DIR, "postgres.log"),
                       "-o", "-c listen_addresses= -k '%s' -p %s" % (PG_DIR, PG_PORT), "start"]
        pg_ctl(*restart_cmd)


def main():
    import tempfile
    subprocess.run([PGFIX, "stop", PG_DIR, PG_PORT], capture_output=True)
    p = subprocess.run([PGFIX, "start", PG_DIR, PG_PORT], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    ci = "host=%s port=%s user=kprof dbname=kprof" % (PG_DIR, PG_PORT)
    cd = an = stubs = None
    try:
        cd = kpfix.Collectord("it_pg_restart_cd", ci)
        an = tas.Analyzer("it_pg_restart_an", ci)
        stubs = kpfix.Stubs(cd.grpc)
        with tempfile.TemporaryDirectory(dir=kpfix.TEST_DIR) as tmp:
            run_id = import_run(cd.grpc, tmp)
            failures = []
            for mode in ("fast", "immediate"):
                first_calls(mode, cd, an, stubs, run_id, ci, tmp, failures)
            step(failures, "kprofctl with PostgreSQL down", lambda: pg_down(cd, an, run_id))
            assert not failures, "\n".join(failures)
            print("first calls after pg_ctl restart -m fast and -m immediate: ok")
            print("PostgreSQL down: kprofctl exits 5 naming PostgreSQL")
    finally:
        if stubs is not None:
            stubs.close()
        for d in (an, cd):
            if d is not None:
                d.stop()
        subprocess.run([PGFIX, "stop", PG_DIR, PG_PORT], capture_output=True)
    print("ok")


if __name__ == "__main__":
    main()
