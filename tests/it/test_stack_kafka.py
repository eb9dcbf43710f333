"""The local stack's Kafka mode: deploy/local/kprof-stack up --kafka in a temporary directory.

Checks that `up --kafka`
  - starts kprof-kafka-mock (librdkafka's mock cluster, 3 brokers), collectord with --sink kafka
    (and a second ingest replica; the two elect one capture coordinator), two
    `kprof-collectord --role sink` consumers, the analyzer and the agent; `status` names each,
    and `env` prints the same client addresses as without Kafka, plus the cluster's;
  - lands a job in PostgreSQL through Kafka: kprof-loadgen (with the operator token, over TLS,
    as a user of `kprof-stack env` would) pushes a 2-rank job to the stack's collectord, every
    batch is stored once, the sinks' consumed and stored counters move by as many records as
    collectord produced, and kprofctl reads the run's breakdown from the analyzer; loadgen
    and `kprofctl import` of a real 2-rank trace end their runs, and ended means stored;
  - the mock cluster takes failure commands on the FIFO kafka-mock.in (answers in its log);
  - a second `up` keeps the Kafka mode (same cluster, same pids);
and that `down` stops every process the stack started (by the pids in its files), leaving none
that runs from the stack directory.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kpfix  # noqa: E402

SRC = os.environ.get("KPROF_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
STACK = os.path.join(SRC, "deploy", "local", "kprof-stack")
CTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
COLLECTORD = os.path.join(kpfix.BIN, "collectord", "kprof-collectord")
PORTS = ("KPROF_PG_PORT", "KPROF_COLLECTOR_PORT", "KPROF_COLLECTOR_HTTP_PORT",
         "KPROF_ANALYZER_PORT", "KPROF_ANALYZER_HTTP_PORT", "KPROF_ANALYZER_WEB_PORT",
         "KPROF_COLLECTOR2_PORT", "KPROF_COLLECTOR2_HTTP_PORT", "KPROF_SINK_HTTP_PORT",
         "KPROF_SINK2_HTTP_PORT")


def clean_env(extra):
    """The environment without the test suite's KPROF_ settings, plus extra."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPROF_")}
    env.update(extra)
    return env


def stack(env, *args, timeout=180):
    return subprocess.run([STACK] + list(args), capture_output=True, text=True, env=env,
                          timeout=timeout * kpfix.SCALE, stdin=subprocess.DEVNULL)


def metrics(port):
    """The counters and gauges of /metrics on 127.0.0.1:port, name{labels} -> value."""
    with urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def pids_of(sdir):
    """The pid of each daemon the stack wrote a pid file for, name -> pid."""
    return {f[:-4]: int(open(os.path.join(sdir, f)).read().strip())
            for f in os.listdir(sdir) if f.endswith(".pid")}


def running(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def from_dir(sdir):
    """Pids of the processes whose command line names the stack directory (the daemons all
    take a file inside it), other than this test's."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = open("/proc/%s/cmdline" % d, "rb").read().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        if sdir in cmd and running(int(d)):
            found.append((int(d), cmd))
    return found


def main():
    kpfix.require_env()
    tmp = tempfile.mkdtemp(prefix="kprof-stack-kafka-", dir=kpfix.TEST_DIR)
    os.chmod(tmp, 0o755)  # as root, the postgres user must reach the data directory inside
    sdir = os.path.join(tmp, "stack")
    ports = {k: str(kpfix.free_port()) for k in PORTS}
    env = clean_env(dict(ports, KPROF_STACK_DIR=sdir, KPROF_BUILD_DIR=kpfix.BIN))
    started = {}
    try:
        # Bad options are a usage error (2), before anything starts.
        p = stack(env, "up", "--kafka-brokers")
        assert p.returncode == 2 and "--kafka-brokers" in p.stderr, (p.returncode, p.stderr)
        p = stack(env, "up", "--kafak")
        assert p.returncode == 2 and "usage" in p.stderr, (p.returncode, p.stderr)
        assert not os.path.exists(os.path.join(sdir, "collectord.pid"))

        p = stack(env, "up", "--kafka")
        assert p.returncode == 0, "kprof-stack up --kafka exited %d:\n%s\n%s" % (
            p.returncode, p.stdout, p.stderr)
        assert "Kafka" in p.stdout and "kprof-kafka-mock" in p.stdout, p.stdout
        started = pids_of(sdir)
        want = {"kafka-mock", "collectord", "collectord2", "sink", "sink2", "analyzer", "agent"}
        assert want <= set(started), (sorted(started), sorted(want))
        for name, pid in started.items():
            assert running(pid), "%s (pid %d) is not running" % (name, pid)

        st = stack(env, "status")
        assert st.returncode == 0, (st.returncode, st.stdout, st.stderr)
        for name in ("kprof-kafka-mock: running", "(sink): running", "(sink2): running",
                     "kprof-collectord: running", "kprof-analyzer: running"):
            assert name in st.stdout, "status does not say %r:\n%s" % (name, st.stdout)
        assert "kprof-collectord (2): running" in st.stdout, st.stdout
        # the two ingest replicas elect one capture coordinator
        kpfix.wait_for(lambda: sum(metrics(ports[k]).get("kprof_collectord_coordinator", 0)
                                   for k in ("KPROF_COLLECTOR_HTTP_PORT",
                                             "KPROF_COLLECTOR2_HTTP_PORT")) == 1, 30,
                       "exactly one coordinator among the two replicas")
        brokers = open(os.path.join(sdir, "kafka.brokers")).read().strip()
        assert len(brokers.split(",")) == 3, brokers
        # The mock cluster takes failure commands on its FIFO and answers in its log.
        mlog = os.path.join(sdir, "kafka-mock.log")
        with open(os.path.join(sdir, "kafka-mock.in"), "w") as f:
            f.write("rtt 1 0\nrtt 9 0\n")
        kpfix.wait_for(lambda: "ok" in open(mlog).read() and "error" in open(mlog).read(), 20,
                       "the mock's answers in %s" % mlog)

        exports = dict(l.strip()[len("export "):].split("=", 1)
                       for l in stack(env, "env").stdout.splitlines()
                       if l.strip().startswith("export "))
        assert exports["KPROF_COLLECTOR"] == "127.0.0.1:" + ports["KPROF_COLLECTOR_PORT"], exports
        user = clean_env({k: exports[k] for k in ("KPROF_COLLECTOR", "KPROF_ANALYZER",
                                                  "KPROF_TLS_CA", "KPROF_TOKEN_FILE")})

        # The collectord replicas produce into Kafka, the sinks store: a 2-rank job, ended by
        # kprof-loadgen with its streams' marks, so ended means every batch is stored.
        p = subprocess.run([LOADGEN, "--json", "--ranks", "2", "--steps", "4",
                            "--job", "stack-kafka", "--give-up", "120s"],
                           capture_output=True, text=True, env=user, timeout=300 * kpfix.SCALE)
        assert p.returncode == 0, (p.returncode, p.stderr)
        s = json.loads(p.stdout)
        run = s["run_id"]
        conn = "host=127.0.0.1 port=%s user=kprof dbname=kprof passfile=%s" % (
            ports["KPROF_PG_PORT"], os.path.join(sdir, "pgpass"))

        def psql(sql):
            q = subprocess.run(["psql", conn, "-qtAXc", sql], capture_output=True, text=True,
                               timeout=30)
            assert q.returncode == 0, q.stderr
            return q.stdout.strip()

        assert psql("SELECT state FROM runs WHERE id = %d" % run) == "2", "run not ENDED"
        got = {int(r): (int(b), int(e)) for r, b, e in (
            l.split("|") for l in psql("SELECT rank, count(*), sum(rows) FROM ingest_batches "
                                       "WHERE run_id = %d GROUP BY rank" % run).splitlines())}
        want_rows = {e["rank"]: (e["batches"], e["events"]) for e in s["expected"]}
        assert got == want_rows, (got, want_rows)
        kernels = int(psql("SELECT count(*) FROM kernels WHERE run_id = %d" % run))
        assert kernels == sum(e["kinds"]["kernel"]["rows"] for e in s["expected"]), kernels

        # Kafka carried them: what collectord produced the sinks consumed and stored.
        produced = metrics(ports["KPROF_COLLECTOR_HTTP_PORT"])
        assert produced["kprof_collectord_kafka_records_produced_total"] >= s["batches"], produced
        sinks = [metrics(ports[k]) for k in ("KPROF_SINK_HTTP_PORT", "KPROF_SINK2_HTTP_PORT")]
        consumed = sum(m["kprof_collectord_kafka_records_consumed_total"] for m in sinks)
        stored = sum(m["kprof_collectord_kafka_records_stored_total"] for m in sinks)
        assert consumed >= s["batches"] and stored == s["batches"], (consumed, stored, s)
        assert produced["kprof_collectord_batches_received_total"] >= s["batches"], produced

        q = subprocess.run([CTL, "breakdown", "--run", str(run), "--rank", "0", "--json"],
                           capture_output=True, text=True, env=user, timeout=60 * kpfix.SCALE)
        assert q.returncode == 0 and json.loads(q.stdout), (q.returncode, q.stderr)

        # kprofctl import through Kafka: it returns once the run is ended, and ended means
        # stored: both ranks' rows are there at once.
        traces = os.path.join(os.environ["KPROF_SOURCE_DIR"], "tests", "data", "peers", "hta",
                              "trace_filter_2rank")
        q = subprocess.run([CTL, "import", "--job", "stack-kafka-import", "--json", traces],
                           capture_output=True, text=True, env=user, timeout=120 * kpfix.SCALE)
        assert q.returncode == 0, (q.returncode, q.stderr)
        irun = int(psql("SELECT max(id) FROM runs WHERE job = 'stack-kafka-import'"))
        assert psql("SELECT state FROM runs WHERE id = %d" % irun) == "2", "import run not ENDED"
        assert psql("SELECT string_agg(DISTINCT rank::text, ',') FROM kernels WHERE run_id = %d"
                    % irun) == "0,1"

        # A second up (without --kafka) keeps the running Kafka stack as it is.
        p = stack(env, "up")
        assert p.returncode == 0, p.stderr
        assert pids_of(sdir) == started, (pids_of(sdir), started)
        assert open(os.path.join(sdir, "kafka.brokers")).read().strip() == brokers

        p = stack(env, "down", timeout=120)
        assert p.returncode == 0, (p.stdout, p.stderr)
        for name, pid in started.items():
            assert not running(pid), "down left %s (pid %d) running" % (name, pid)
        left = from_dir(sdir)
        assert not left, "down left processes running from the stack directory: %s" % left
        st = stack(env, "status")
        assert st.returncode == 3 and "kafka" not in st.stdout.lower(), (st.returncode, st.stdout)
        print("ok: %d batches through Kafka (%d ingest replica(s), 2 sinks), down left nothing"
              % (s["batches"], 2))
    finally:
        stack(env, "down", timeout=120)
        for name, pid in started.items():
            if running(pid):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
