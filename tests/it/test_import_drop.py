"""kprofctl import whose batches collectord refuses half-way: the run is ended FAILED and then
dropped with DropRun, so nothing is left behind. And an import cut short by collectord going
away (frozen and killed right after the run is created): the import exits 5 (unreachable)
and says the run stays open; a new collectord with --open-run-timeout ends that run as FAILED
with the reason in runs.end_reason (and summarises it for compare), and leaves ended runs
and runs with data alone. And an
import whose collectord is frozen (SIGSTOP, not killed) mid-stream: after --give-up without an
acknowledgement the import cancels its stream and exits 5 naming the address, instead of
waiting on the frozen collectord forever."""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import kpfix

kpfix.require_env()
DB = "kp_it_import_drop"
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
PEERS = os.environ.get("KPROF_PEERS_DIR", os.path.join(os.environ.get("KPROF_SOURCE_DIR", "."), "tests", "data", "peers"))


def cut_short(conninfo):
    """collectord stops under an import: exit 5, and the run left open is ended by the next
    collectord's open-run deadline."""
    big = sorted(glob.glob(os.path.join(PEERS, "hta", "ns_resolution_rank0", "*.json.gz")))[0]
    cd = kpfix.Collectord("importcut", conninfo)
    p = subprocess.Popen([KPROFCTL, "import", "--collector", cd.grpc, "--job", "cut",
                          "--progress", "off", "--give-up", "2s", big],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        kpfix.wait_for(lambda: kpfix.psql("SELECT count(*) FROM runs WHERE job = 'cut'",
                                          db=DB) != "0" or p.poll() is not None, 60, "the run")
        cd.proc.send_signal(signal.SIGSTOP)  # gone at once, whatever the import was doing
        cd.proc.kill()
        out, err = p.communicate(timeout=120 * kpfix.SCALE)
    finally:
        cd.proc.kill()
        cd.stop()
    assert p.returncode == 5, (p.returncode, err)
    assert "could not be ended" in err and "psql" not in err, err
    run = int(kpfix.psql("SELECT id FROM runs WHERE job = 'cut'", db=DB))
    assert kpfix.psql("SELECT state FROM runs WHERE id = %d" % run, db=DB) == "1"
    # an ended run with data beside it must stay as it is
    cd = kpfix.Collectord("importcut2", conninfo, ["--open-run-timeout", "1s"])
    try:
        good = subprocess.run([KPROFCTL, "import", "--collector", cd.grpc, "--job", "kept",
                               "--progress", "off", big], capture_output=True, text=True,
                              timeout=120 * kpfix.SCALE)
        assert good.returncode == 0, good.stderr
        kpfix.wait_for(lambda: kpfix.psql("SELECT state FROM runs WHERE id = %d" % run,
                                          db=DB) == "3", 30, "the open run ended as failed")
        reason = kpfix.psql("SELECT end_reason FROM runs WHERE id = %d" % run, db=DB)
        assert "no live producer stream" in reason, reason
        assert kpfix.psql("SELECT state, end_reason IS NULL FROM runs WHERE job = 'kept'",
                          db=DB) == "2|t"
        assert "run ended as failed run=%d" % run in cd.log_text()
        # what it holds is summarised for compare, as at any end
        kpfix.wait_for(lambda: kpfix.psql("SELECT count(*) FROM compare_runs WHERE run_id = %d"
                                          % run, db=DB) == "1", 30, "the failed run's summary")
    finally:
        assert cd.stop() == 0
    print("import cut short: exit 5, run %d ended FAILED by the open-run deadline (%s)" % (
        run, reason))


def frozen(conninfo):
    """collectord frozen under an import: --give-up (2 s) ends the import with exit 5 in
    bounded time; collectord, thawed, is still healthy and stops cleanly."""
    big = sorted(glob.glob(os.path.join(PEERS, "hta", "ns_resolution_rank0", "*.json.gz")))[0]
    cd = kpfix.Collectord("importfrozen", conninfo)
    p = subprocess.Popen([KPROFCTL, "import", "--collector", cd.grpc, "--job", "frozen",
                          "--progress", "off", "--give-up", "2s", big],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    thawed = False
    try:
        kpfix.wait_for(lambda: kpfix.psql("SELECT count(*) FROM runs WHERE job = 'frozen'",
                                          db=DB) != "0" or p.poll() is not None, 60, "the run")
        cd.proc.send_signal(signal.SIGSTOP)
        assert p.poll() is None, "the import ended before collectord was frozen"
        t0 = time.monotonic()
        try:
            out, err = p.communicate(timeout=40 * kpfix.SCALE)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError("import still waiting on a frozen collectord after 40 s "
                                 "(--give-up 2s):\n" + err)
        took = time.monotonic() - t0
        cd.proc.send_signal(signal.SIGCONT)
        thawed = True
    finally:
        if not thawed:
            cd.proc.send_signal(signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.wait()
        rc = cd.stop()
    assert p.returncode == 5, (p.returncode, err)
    assert "collectord at %s made no progress for 2s" % cd.grpc in err, err
    assert "could not be ended" in err and "start it" not in err, err
    assert rc == 0, (rc, cd.log_text())
    # thawed, collectord may still run what reached it frozen (batches, even the EndRun that
    # timed out here, which asks for FAILED): the run is open or failed, never looks whole
    state = kpfix.psql("SELECT state FROM runs WHERE job = 'frozen'", db=DB)
    assert state in ("1", "3"), state
    print("import on a frozen collectord: exit 5 after %.1f s (--give-up 2s), run state %s:\n%s" % (
        took, state, err))


def main():
    conninfo = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("importdrop", conninfo, ["--max-name-bytes", "64"])
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t-rank0.json")
            with open(path, "w") as f:
                f.write('{"traceEvents": [\n'
                        '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1},\n'
                        '{"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2,'
                        ' "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512}},\n'
                        '{"ph": "X", "cat": "kernel", "name": "' + "x" * 200 + '", "ts": 3,'
                        ' "dur": 1}]}')
            p = subprocess.run([KPROFCTL, "import", "--collector", cd.grpc, "--job", "drop", path],
                               capture_output=True, text=True, timeout=120)
            assert p.returncode == 1, (p.returncode, p.stderr)
            assert "was dropped" in p.stderr, p.stderr
            assert kpfix.psql("SELECT count(*) FROM runs", db=DB) == "0"
            assert kpfix.psql("SELECT count(*) FROM pg_tables WHERE tablename ~ '_r[0-9]+$'",
                              db=DB) == "0"
            print(p.stderr)
    finally:
        rc = cd.stop()
    assert rc == 0, rc
    cut_short(conninfo)
    frozen(conninfo)
    print("import drop: 3 passed")


if __name__ == "__main__":
    sys.exit(main())
