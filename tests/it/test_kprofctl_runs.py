"""kprofctl runs against the real kprof-collectord and PostgreSQL:
  1. runs made by kprof-loadgen (jobs with plain, comma/quote and CJK names) are listed newest
     first; --json equals the runs table (states, sources, ISO-8601 UTC times, batch counts);
     --csv parses with python's csv module to the same values; the text table equals the
     layout recomputed here from the JSON (display widths: CJK two columns), numeric columns
     right-aligned;
  2. -c picks and orders columns (an unknown one exits 2 listing the valid ones); -w cuts text
     cells with "…" and never numbers; --job and --limit filter; KPROF_COLLECTOR is honoured;
  3. exit codes: 2 for bad usage, 5 with "is kprof-collectord running at ADDR?" when nothing
     listens."""
import csv
import io
import json
import os
import subprocess
import unicodedata

import kpfix

kpfix.require_env()

DB = "kp_it_kprofctl_runs"
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
COLS = ["id", "job", "name", "state", "source", "world_size", "created", "ended", "batches"]
NUMERIC = {"id", "world_size", "batches"}
STATES = {"1": "open", "2": "ended", "3": "failed"}
SOURCES = {"0": "unknown", "1": "capture", "2": "import", "3": "synthetic"}
WEIRD_JOB = 'w\u00e9,ird "job"'
CJK_NAME = "\u65e5\u672c\u8a9e\u306e\u9577\u3044\u540d\u524d"  # 10 columns wide


def run(args, env=None, check=True):
    e = dict(os.environ)
    e.pop("KPROF_COLLECTOR", None)
    e.update(env or {})
    p = subprocess.run(args, capture_output=True, text=True, env=e, timeout=120 * kpfix.SCALE)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s\n%s" % (args, p.returncode, p.stdout, p.stderr))
    return p


def width(s):
    w = 0
    for ch in s:
        if unicodedata.combining(ch):
            continue
        w += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return w


def cut(s, limit):
    """What the text format shows of s with -w limit (0: all)."""
    if limit == 0 or width(s) <= limit:
        return s
    out, w = "", 0
    for ch in s:
        cw = width(ch)
        if w + cw > limit - 1:
            break
        out, w = out + ch, w + cw
    return out + "\u2026"


def expected_text(rows, cols, limit=0):
    """The aligned text table of rows (dicts as --json gives them)."""
    cells = []
    for r in rows:
        line = []
        for c in cols:
            v = r[c]
            s = "-" if v is None else str(v)
            line.append(s if c in NUMERIC else cut(s, limit))
        cells.append(line)
    widths = [max([len(c)] + [width(line[j]) for line in cells]) for j, c in enumerate(cols)]
    out = []
    for line in [[c.upper() for c in cols]] + cells:
        parts = []
        for j, c in enumerate(cols):
            pad = " " * (widths[j] - width(line[j]))
            if c in NUMERIC:
                parts.append(pad + line[j])
            elif j + 1 < len(cols):
                parts.append(line[j] + pad)
            else:
                parts.append(line[j])
        out.append("  ".join(parts))
    return "\n".join(out) + "\n"


def db_runs(job=None):
    ts = "to_char(%s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
    where = "WHERE job = '%s'" % job.replace("'", "''") if job else ""
    rows = kpfix.psql_rows(
        "SELECT id, job, name, state, source, world_size, %s, coalesce(%s, ''), "
        "(SELECT count(*) FROM ingest_batches b WHERE b.run_id = r.id) "
        "FROM runs r %s ORDER BY id DESC" % (ts % "created_at", ts % "ended_at", where), db=DB)
    out = []
    for r in rows:
        out.append({"id": int(r[0]), "job": r[1], "name": r[2] or None,
                    "state": STATES[r[3]], "source": SOURCES[r[4]],
                    "world_size": int(r[5]), "created": r[6], "ended": r[7] or None,
                    "batches": int(r[8])})
    return out


def main():
    conninfo = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("kprofctl_runs", conninfo)
    addr = cd.grpc
    try:
        runs = lambda *a, **kw: run([KPROFCTL, "runs", "--collector", addr] + list(a), **kw)

        # An empty database: a header only, and an empty array.
        assert runs().stdout == expected_text([], COLS)
        assert json.loads(runs("--json").stdout) == []

        def loadgen(job, ranks, name=""):
            run([LOADGEN, "--collector", addr, "--job", job, "--ranks", str(ranks),
                 "--steps", "2", "--kernels-per-step", "8", "--name", name, "--json"])

        loadgen("alpha", 2, "first")
        loadgen(WEIRD_JOB, 1, CJK_NAME)
        loadgen("alpha", 3)
        db = db_runs()
        assert len(db) == 3, db
        assert all(r["batches"] > 0 for r in db), db

        # --json equals the database, newest first.
        js = json.loads(runs("--json").stdout)
        assert js == db, (js, db)
        assert [r["id"] for r in js] == sorted((r["id"] for r in js), reverse=True)
        assert js[0]["name"] is None and js[1]["name"] == CJK_NAME and js[1]["job"] == WEIRD_JOB
        assert all(list(r.keys()) == COLS for r in js)

        # --csv parses to the same values (NULL as an empty field).
        rows = list(csv.reader(io.StringIO(runs("--csv").stdout)))
        assert rows[0] == COLS, rows[0]
        assert rows[1:] == [["" if r[c] is None else str(r[c]) for c in COLS] for r in db], rows

        # Text: exactly the aligned layout, and a fixed column position for STATE on each line.
        text = runs().stdout
        assert text == expected_text(db, COLS), "\n" + text + "\n" + expected_text(db, COLS)
        lines = text.splitlines()
        pos = {width(l[:l.index(s)]) for l, s in zip(lines, ["STATE"] + [r["state"] for r in db])}
        assert len(pos) == 1, text

        # -c picks and orders (short and long forms); -w cuts text, never numbers.
        js = json.loads(runs("--json", "-c", "name,id").stdout)
        assert [list(r.keys()) for r in js] == [["name", "id"]] * 3, js
        assert [r["id"] for r in js] == [r["id"] for r in db]
        assert runs("--columns=state,ID").stdout == expected_text(db, ["state", "id"])
        text = runs("-c", "id,job,name,batches", "-w", "6").stdout
        assert text == expected_text(db, ["id", "job", "name", "batches"], 6), text
        assert "w\u00e9,ir\u2026" in text and "\u65e5\u672c\u2026" in text, text
        text = runs("-w3").stdout
        assert text == expected_text(db, COLS, 3), text
        p = runs("-c", "id,bogus", check=False)
        assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout)
        assert 'unknown column "bogus"' in p.stderr and ", ".join(COLS) in p.stderr, p.stderr

        # --job and --limit.
        js = json.loads(runs("--json", "--job", WEIRD_JOB).stdout)
        assert js == db_runs(WEIRD_JOB) and len(js) == 1, js
        js = json.loads(runs("--json", "--job=alpha").stdout)
        assert js == db_runs("alpha") and len(js) == 2, js
        assert json.loads(runs("--json", "--job", "nope").stdout) == []
        js = json.loads(runs("--json", "--limit", "1").stdout)
        assert js == db[:1], js

        # The address from the environment.
        p = run([KPROFCTL, "runs", "--csv"], env={"KPROF_COLLECTOR": addr})
        assert len(list(csv.reader(io.StringIO(p.stdout)))) == 4, p.stdout

        # Bad usage: exit 2, nothing on stdout.
        for bad in (["--json", "--csv"], ["extra"], ["--limit", "0"], ["--width=-1"],
                    ["--bogus"]):
            p = runs(*bad, check=False)
            assert p.returncode == 2 and p.stdout == "", (bad, p.returncode, p.stdout, p.stderr)
            assert p.stderr.startswith("kprofctl runs: "), (bad, p.stderr)
        p = run([KPROFCTL, "runs", "--help"])
        assert "--job" in p.stdout and "--columns" in p.stdout, p.stdout
    finally:
        rc = cd.stop()
    cd.assert_clean_log()
    assert rc == 0, rc

    # Nothing listens: exit 5 and a message that says what to do.
    port = kpfix.free_port()
    dead = "127.0.0.1:%d" % port
    p = run([KPROFCTL, "runs", "--collector", dead, "--json"], check=False)
    assert p.returncode == 5, (p.returncode, p.stderr)
    assert p.stdout == "", p.stdout
    assert ("is kprof-collectord running at %s? (set --collector or KPROF_COLLECTOR)" % dead
            in p.stderr), p.stderr
    p = run([KPROFCTL, "runs"], env={"KPROF_COLLECTOR": dead}, check=False)
    assert p.returncode == 5 and dead in p.stderr, (p.returncode, p.stderr)
    print("ok")


if __name__ == "__main__":
    main()
