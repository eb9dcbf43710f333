"""kprofctl import against the real kprof-collectord and PostgreSQL:
  1. every trace under tests/data/peers imports (the HTA pair as one 2-rank run, the rest one
     run each; the tbplugin cases' embedded traces are written out to files first), and the
     rows per table and kind in PostgreSQL equal the events per category in the file, counted
     here independently with Python's json (plus trace_facts.md's published counts for the HTA
     traces); times are exact to the ns (sums of start and duration compared);
  2. bad input (bad gzip, truncated gzip, truncated JSON, wrong types, a huge string, deep
     nesting, a missing ts, two files of one rank) fails with the file and the position and
     leaves no run behind; --partial keeps the part before the error, exits 0 (a partial
     success) and says so on stderr;
  3. an empty trace imports with a warning; collectord unreachable exits 5 and creates
     nothing."""
import decimal
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile

import kpfix

kpfix.require_env()

DB = "kp_it_import"
PEERS = os.environ.get("KPROF_PEERS_DIR") or os.path.join(
    os.environ.get("KPROF_SOURCE_DIR", "."), "tests", "data", "peers")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
D = decimal.Decimal

# HTA's trace_facts.md, by category (raw traceEvents counts).
FACTS = {
    "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": {
        "cpu_op": 23910, "ac2g": 21424, "cuda_runtime": 15329, "kernel": 4350, "fwdbwd": 1810,
        "gpu_memcpy": 1600, "gpu_memset": 145, "user_annotation": 70, "gpu_user_annotation": 15},
    "sampled_rank-0.json.gz": {"cpu_op": 2329, "cuda_runtime": 1204, "kernel": 1154,
                               "user_annotation": 73, "gpu_memcpy": 40, "gpu_memset": 10},
    "sampled_rank-1.json.gz": {"cpu_op": 2302, "cuda_runtime": 1154, "kernel": 1104,
                               "user_annotation": 65, "gpu_memcpy": 40, "gpu_memset": 10},
}


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f, parse_float=D)


def us_to_ns(v):
    return int((D(v) * 1000).to_integral_value(rounding=decimal.ROUND_HALF_UP))


def expected(trace):
    """Rows per (table, key) that the file should give, and ns sums for checking times."""
    if isinstance(trace, list):
        events, base = trace, 0
    else:
        events, base = trace["traceEvents"], int(trace.get("baseTimeNanoseconds", 0))
    exp, cats, sums = {}, {}, {}

    def add(key, ts, dur):
        exp[key] = exp.get(key, 0) + 1
        s = sums.setdefault(key[0], [0, 0])
        s[0] += base + us_to_ns(ts)
        s[1] += max(us_to_ns(dur), 0)

    for e in events:
        ph, cat = e.get("ph"), (e.get("cat") or "").lower()
        name, args = e.get("name", ""), e.get("args") or {}
        cats[cat] = cats.get(cat, 0) + 1
        if ph == "i" and name in ("[memory]", "[OutOfMemory]"):
            add(("memory_events",), e["ts"], 0)
        if ph != "X":
            continue
        step = name.startswith("ProfilerStep#") and name[13:].isdigit()
        if cat in ("cpu_op", "operator", "user_annotation"):
            add(("ops", 6 if step else (1 if cat != "user_annotation" else 2)), e["ts"], e["dur"])
            if step:
                add(("steps",), e["ts"], e["dur"])
            if cat != "user_annotation" and "Collective name" in args:
                add(("collectives",), e["ts"], e["dur"])
        elif cat in ("gpu_user_annotation", "user"):
            add(("ops", 3), e["ts"], e["dur"])
        elif cat == "python_function":
            add(("ops", 4), e["ts"], e["dur"])
        elif cat in ("cuda_runtime", "runtime"):
            add(("api_calls", 1), e["ts"], e["dur"])
        elif cat == "cuda_driver":
            add(("api_calls", 2), e["ts"], e["dur"])
        elif cat == "kernel":
            add(("kernels",), e["ts"], e["dur"])
        elif cat in ("gpu_memcpy", "memcpy"):
            add(("memcpys",), e["ts"], e["dur"])
        elif cat in ("gpu_memset", "memset"):
            add(("memsets",), e["ts"], e["dur"])
        elif cat == "cuda_sync":
            add(("syncs",), e["ts"], e["dur"])
    flows = {"ac2g": sum(v for k, v in cats.items() if k in ("ac2g", "async", "async_gpu",
                                                             "async_cpu_to_gpu")),
             "fwdbwd": sum(v for k, v in cats.items() if k in ("fwdbwd", "forward_backward"))}
    return exp, sums, cats, flows


def stored(run_id, rank):
    got, sums = {}, {}
    for table, kcol in (("kernels", None), ("memcpys", None), ("memsets", None),
                        ("api_calls", "domain"), ("ops", "kind"), ("steps", None),
                        ("collectives", None), ("syncs", None), ("memory_events", None)):
        sel = (kcol + ", ") if kcol else ""
        grp = (" GROUP BY " + kcol) if kcol else ""
        dur = "0" if table == "memory_events" else "coalesce(sum(dur_ns), 0)"  # instants
        for row in kpfix.psql_rows("SELECT %scount(*), coalesce(sum(start_ns), 0)::text, "
                                   "%s::text FROM %s WHERE run_id = %d AND "
                                   "rank = %d%s" % (sel, dur, table, run_id, rank, grp), db=DB):
            if kcol:
                key, n, s, d = (table, int(row[0])), int(row[1]), int(row[2]), int(row[3])
            else:
                key, n, s, d = (table,), int(row[0]), int(row[1]), int(row[2])
            if n:
                got[key] = n
                t = sums.setdefault(table, [0, 0])
                t[0] += s
                t[1] += d
    return got, sums


def kprofctl(*args, ok=True):
    p = subprocess.run([KPROFCTL, "import", "--collector", COLLECTOR] + list(args),
                       capture_output=True, text=True, timeout=300 * kpfix.SCALE)
    if ok and p.returncode != 0:
        raise AssertionError("kprofctl import %s failed (%d):\n%s" % (args, p.returncode, p.stderr))
    for bad in ("Sanitizer", "runtime error:"):
        assert bad not in p.stderr, p.stderr
    return p


def n_runs():
    return int(kpfix.psql("SELECT count(*) FROM runs", db=DB))


def check_import(job, paths, extra=()):
    p = kprofctl("--job", job, "--json", *extra, *paths)
    res = json.loads(p.stdout)
    run = res["run_id"]
    state = kpfix.psql("SELECT state, source, world_size FROM runs WHERE id = %d" % run, db=DB)
    assert state.split("|")[:2] == ["2", "2"], state  # ENDED, IMPORT
    total = 0
    for f in res["files"]:
        trace = load(f["path"])
        exp, exp_sums, cats, flows = expected(trace)
        got, got_sums = stored(run, f["rank"])
        assert got == exp, "%s: rows in PG %s != events in the file %s" % (f["path"], got, exp)
        for table, (s, d) in exp_sums.items():
            assert got_sums[table] == [s, d], "%s %s: ns sums %s != %s" % (
                f["path"], table, got_sums[table], [s, d])
        assert f["categories"]["ac2g"] == flows["ac2g"], (f["categories"], flows)
        assert f["categories"]["fwdbwd"] == flows["fwdbwd"], (f["categories"], flows)
        facts = FACTS.get(os.path.basename(f["path"]))
        if facts:
            for cat, n in facts.items():
                mine = f["categories"][cat]
                assert mine == n, "%s: %s %d != trace_facts %d" % (f["path"], cat, mine, n)
        if not isinstance(trace, list):
            ndev = len(trace.get("deviceProperties") or [])
            got_dev = int(kpfix.psql("SELECT count(*) FROM devices WHERE run_id = %d AND "
                                     "rank = %d" % (run, f["rank"]), db=DB))
            assert got_dev == min(ndev, 64), (f["path"], got_dev, ndev)
            di = trace.get("distributedInfo") or {}
            if "rank" in di:
                assert f["rank"] == di["rank"], (f["rank"], di)
        total += sum(exp.values())
    return run, total, res


def main():
    global COLLECTOR
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_import", ci)
    COLLECTOR = cd.grpc
    tmp = tempfile.mkdtemp(prefix="kp_import_", dir=kpfix.TEST_DIR)
    imported, rows = 0, 0
    try:
        # 1. every peer trace
        hta = sorted(glob.glob(os.path.join(PEERS, "hta", "trace_filter_2rank", "*.json.gz")))
        run, n, res = check_import("hta-2rank", hta)
        assert res["world_size"] == 128 and sorted(f["rank"] for f in res["files"]) == [0, 1]
        imported, rows = imported + len(hta), rows + n
        for path in sorted(glob.glob(os.path.join(PEERS, "hta", "ns_resolution_rank0", "*.gz")) +
                           glob.glob(os.path.join(PEERS, "tbplugin", "resnet50", "traces", "*",
                                                  "*.json.gz"))):
            run, n, res = check_import("peer", [path])
            imported, rows = imported + 1, rows + n
        for case in sorted(glob.glob(os.path.join(PEERS, "tbplugin", "cases", "*.json"))):
            with open(case) as f:
                c = json.load(f)
            name = os.path.basename(case)[:-5]
            if "trace" in c:
                path = os.path.join(tmp, name + ".json")
                with open(path, "w") as f:
                    json.dump(c["trace"], f)
                run, n, res = check_import("tbcase", [path], ("--rank", "0"))
                imported, rows = imported + 1, rows + n
            elif "traces" in c:
                d = os.path.join(tmp, name)
                os.makedirs(d, exist_ok=True)
                for w, t in c["traces"].items():
                    with open(os.path.join(d, w + ".json"), "w") as f:
                        json.dump(t, f)
                run, n, res = check_import("tbcase", [d])
                assert len(res["files"]) == len(c["traces"])
                imported, rows = imported + len(c["traces"]), rows + n
        print("imported %d peer traces, %d rows checked" % (imported, rows))
        assert imported >= 20, imported

        # 2. bad input: clear errors, nothing left behind
        good = os.path.join(tmp, "good-rank0.json")
        with open(good, "w") as f:
            json.dump({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0,
                                        "tid": 7, "ts": 1, "dur": 2}] * 10}, f)
        src = os.path.join(PEERS, "hta", "ns_resolution_rank0",
                           "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
        raw = open(src, "rb").read()
        cases = {
            "badgz-rank1.json.gz": (b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"garbage" * 100,
                                    "gzip"),
            "truncgz-rank1.json.gz": (raw[:len(raw) // 2], "gzip"),
            "truncjson-rank1.json": (gzip.decompress(raw)[:100000], "ends early"),
            "type-rank1.json": (b'{"traceEvents": [\n {"ph": "X", "cat": "kernel", "name": "k",'
                                b' "ts": {"a": 1}, "dur": 1}]}', "line 2, column"),
            "huge-rank1.json": (b'{"traceEvents": [{"ph": "X", "name": "' + b"a" * (2 << 20) +
                                b'"}]}', "longer than"),
            "deep-rank1.json": (b'{"traceEvents": [{"ph": "X", "args": {"x": ' + b"[" * 200 +
                                b"]" * 200 + b"}}]}", "nesting deeper"),
            "missing-rank1.json": (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k",'
                                   b' "dur": 1}]}', 'no "ts"'),
            "range-rank1.json": (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k",'
                                 b' "ts": 1, "dur": 1, "args": {"block": [1, 1, 99999]}}]}',
                                 "out of range"),
        }
        before = n_runs()
        for fname, (data, want) in cases.items():
            path = os.path.join(tmp, fname)
            with open(path, "wb") as f:
                f.write(data)
            p = kprofctl("--job", "bad", good, path, ok=False)
            assert p.returncode == 1, (fname, p.returncode, p.stderr)
            assert path in p.stderr and want in p.stderr, (fname, p.stderr)
            assert "nothing was imported" in p.stderr, p.stderr
            assert n_runs() == before, (fname, "a run was left behind")
        # two files of one rank
        p = kprofctl("--job", "dup", good, good, ok=False)
        assert p.returncode == 1 and "both rank 0" in p.stderr, p.stderr
        assert n_runs() == before

        # --partial: the good file and the part of the truncated one before the error
        # (the truncated file keeps distributedInfo.rank 0 from its head: the good one is rank 1)
        trunc = os.path.join(tmp, "truncjson-rank1.json")
        good1 = os.path.join(tmp, "good-rank1.json")
        os.rename(good, good1)
        p = kprofctl("--job", "partial", "--partial", "--json", good1, trunc, ok=False)
        assert p.returncode == 0, (p.returncode, p.stderr)
        assert "partial import: run" in p.stderr and "1 of 2 files whole" in p.stderr, p.stderr
        res = json.loads(p.stdout)
        assert res["ok"] is False, res
        assert kpfix.psql("SELECT state FROM runs WHERE id = %d" % res["run_id"], db=DB) == "2"
        assert n_runs() == before + 1
        kern = int(kpfix.psql("SELECT count(*) FROM kernels WHERE run_id = %d AND rank = 1"
                              % res["run_id"], db=DB))
        assert kern == 10, kern
        part = int(kpfix.psql("SELECT count(*) FROM ops WHERE run_id = %d AND rank = 0"
                              % res["run_id"], db=DB))
        f1 = [f for f in res["files"] if f["rank"] == 0][0]
        assert "error" in f1 and part == f1["rows"]["ops"] and part > 0, (part, f1)
        print("error cases OK; --partial kept %d ops of the truncated file" % part)

        # 3. an empty trace: a warning, not an error; collectord unreachable: 5, nothing made
        empty = os.path.join(tmp, "empty.json")
        with open(empty, "w") as f:
            json.dump({"schemaVersion": 1, "traceEvents": []}, f)
        p = kprofctl("--job", "empty", "--json", empty)
        assert "warning" in p.stderr and "empty trace" in p.stderr, p.stderr
        res = json.loads(p.stdout)
        assert kpfix.psql("SELECT state FROM runs WHERE id = %d" % res["run_id"], db=DB) == "2"
        before = n_runs()
        p = subprocess.run([KPROFCTL, "import", "--collector", "127.0.0.1:%d" % kpfix.free_port(),
                            "--job", "down", good1], capture_output=True, text=True,
                           timeout=120 * kpfix.SCALE)
        assert p.returncode == 5 and "cannot reach collectord" in p.stderr, (p.returncode,
                                                                              p.stderr)
        assert n_runs() == before
        print("empty trace imported with a warning; collectord down: exit 5")
    finally:
        rc = cd.stop()
        cd.assert_clean_log()
    assert rc == 0, rc


if __name__ == "__main__":
    main()
