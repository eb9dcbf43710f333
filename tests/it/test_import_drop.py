"""kprofctl import whose batches collectord refuses half-way: the run is ended FAILED and then
dropped with DropRun, so nothing is left behind."""
import os
import subprocess
import sys
import tempfile

import kpfix

kpfix.require_env()
DB = "kp_it_import_drop"
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")


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
    print("import drop: 1 passed")


if __name__ == "__main__":
    sys.exit(main())
