"""The dashboard views (sql/migrations/0005_dashboard_views.sql), the read-only role
kprof_dashboard and the Grafana dashboard (deploy/grafana/kprof-dashboard.json) against the
real schema, applied by kprof-collectord:
  1. runs: two kprof-loadgen runs of 4 ranks with a planted straggler (slow compute on rank 2;
     slow data loading on rank 1) and the HTA 2-rank peer traces imported with kprofctl; one
     loadgen run gets a capture (captures and capture_ranks rows, as collectord writes them);
  2. (a) every template variable's and every panel's SQL, with the variables substituted as
     Grafana does (a list of ranks, and the "All" value), runs AS kprof_dashboard (SET ROLE)
     and returns rows; it names only kprof_dash views; each view reads only the partitions of
     the run asked for (EXPLAIN);
  3. (b) the figures: step times equal the steps table's dur_ns, step medians equal Python's
     median; the per-rank breakdown and NCCL time per step equal sums computed here in Python
     from the raw rows; the top kernels panel equals an aggregate of the kernels table; the
     straggler flag names the planted rank and only it; (a) and (b) run twice: on the runs'
     summaries (migration 0016's dashboard sums, which collectord makes when a run ends),
     then on the events (the sums' dash_runs rows deleted, as a stale summary leaves them);
  4. (c) kprof_dashboard can log in nowhere, reads no base table or helper view, writes
     nothing, and holds SELECT on the public views only (and EXECUTE on the two functions
     they call, which nobody else holds);
  5. (d) a second database of the same cluster migrates (the role exists already) and its
     views work for the role."""
import json
import os
import re
import statistics
import subprocess
import tempfile

import kpfix

kpfix.require_env()

DB = "kp_it_dashboards"
DB2 = "kp_it_dashboards2"
SRC = os.environ.get("KPROF_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
HTA = os.path.join(SRC, "tests", "data", "peers", "hta", "trace_filter_2rank")
DASH = os.path.join(SRC, "deploy", "grafana", "kprof-dashboard.json")
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
ROLE = "kprof_dashboard"
PUBLIC_VIEWS = {"runs", "step_times", "rank_step_breakdown", "rank_breakdown", "top_kernels",
                "stragglers", "straggler_ranks", "capture_status"}
THRESHOLD = 1.2


def q(sql, db=DB):
    return kpfix.psql_rows(sql, db=db)


def as_role(sql, db=DB):
    """Rows of sql run as kprof_dashboard, with the column names first (psql's header)."""
    out = subprocess.run([kpfix.PSQL, kpfix.conninfo(db), "-qAX", "-F", "\x1f", "-P",
                          "footer=off", "-v", "ON_ERROR_STOP=1", "-c",
                          "SET ROLE %s" % ROLE, "-c", sql],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise AssertionError("as %s: %s\n%s" % (ROLE, sql, out.stderr))
    lines = [l for l in out.stdout.split("\n") if l]
    return lines[0].split("\x1f"), [tuple(l.split("\x1f")) for l in lines[1:]]


def as_role_fails(sql, want="permission denied", db=DB):
    out = subprocess.run([kpfix.PSQL, kpfix.conninfo(db), "-qtAX", "-v", "ON_ERROR_STOP=1",
                          "-c", "SET ROLE %s" % ROLE, "-c", sql],
                         capture_output=True, text=True)
    assert out.returncode != 0, "as %s, %r succeeded: %s" % (ROLE, sql, out.stdout)
    assert want in out.stderr, "as %s, %r: %s" % (ROLE, sql, out.stderr)


def loadgen(collector, job, *extra):
    p = subprocess.run([LOADGEN, "--collector=" + collector, "--ranks=4", "--steps=8",
                        "--kernels-per-step=40", "--job=" + job, "--json"] + list(extra),
                       capture_output=True, text=True, timeout=300 * kpfix.SCALE)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["run_id"]


def substitute(sql, run, job, ranks):
    """Grafana's interpolation for the SQL data sources: a single-value variable as is (quotes
    doubled), a multi-value one as a list of quoted literals (or its allValue)."""
    sql = sql.replace("${run}", str(run)).replace("$run", str(run))
    sql = sql.replace("${job}", job.replace("'", "''")).replace("$job", job.replace("'", "''"))
    sql = sql.replace("${rank}", ranks).replace("$rank", ranks)
    assert "$" not in sql, sql
    return sql


def f(v):
    return float(v) if v != "" else None


def close(a, b, tol=1e-6):
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def expected_breakdown(run):
    """Per (rank, step): step ns and the sums of compute, NCCL, memcpy and memset ns, from the
    raw rows: each row in its own step, else in the step whose host range holds its start."""
    steps = {}
    for rank, step, start, dur in q("SELECT rank, step, start_ns, dur_ns FROM steps "
                                    "WHERE run_id = %d" % run):
        steps[(int(rank), int(step))] = (int(start), int(dur))
    nccl = {i for (i, n) in q("SELECT id, name FROM names")
            if n.startswith("ncclKernel_") or n.startswith("ncclDevKernel_")}
    out = {k: {"step": v[1], "kernel": 0, "nccl": 0, "memcpy": 0, "memset": 0, "n": 0}
           for k, v in steps.items()}

    def home(rank, step, start):
        if step != "":
            return (rank, int(step))
        for (r, s), (st, d) in steps.items():
            if r == rank and st <= start < st + d:
                return (r, s)
        return None

    for table, kind in (("kernels", None), ("memcpys", "memcpy"), ("memsets", "memset")):
        cols = "rank, step, start_ns, dur_ns" + (", coalesce(name, 0)" if kind is None else "")
        for row in q("SELECT %s FROM %s WHERE run_id = %d" % (cols, table, run)):
            key = home(int(row[0]), row[1], int(row[2]))
            if key not in out:
                continue
            k = kind or ("nccl" if row[4] in nccl else "kernel")
            out[key][k] += int(row[3])
            out[key]["n"] += kind is None
    return out


def main():
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_dashboards", ci)
    cd2 = None
    try:
        # 1. the runs
        run_c = loadgen(cd.grpc, "dash-compute", "--straggler=2:1.6")
        run_d = loadgen(cd.grpc, "dash-data's", "--dataload-straggler=1:3")
        hta = sorted(os.path.join(HTA, n) for n in os.listdir(HTA) if n.endswith(".json.gz"))
        p = subprocess.run([KPROFCTL, "import", "--collector", cd.grpc, "--job", "dash-hta",
                            "--json"] + hta, capture_output=True, text=True,
                           timeout=300 * kpfix.SCALE)
        assert p.returncode == 0, p.stderr
        run_h = json.loads(p.stdout)["run_id"]
        runs = {run_c: ("dash-compute", 4, 2), run_d: ("dash-data's", 4, 1),
                run_h: ("dash-hta", 2, None)}
        q("INSERT INTO captures (run_id, start_step, steps, duration_ms, activities, "
          "deadline_at) VALUES (%d, 0, 8, 0, 'kernel,memcpy', now() + interval '10 min')"
          % run_c)
        q("INSERT INTO capture_ranks (run_id, rank, state, host, pid, records, first_step, "
          "last_step, reason) SELECT %d, r, CASE WHEN r = 3 THEN 5 ELSE 4 END, 'node' || r, "
          "100 + r, 1000, 0, 7, CASE WHEN r = 3 THEN 'agent gone' ELSE '' END "
          "FROM generate_series(0, 3) r" % run_c)

        # 2a. every variable and panel query, as the role
        with open(DASH) as fh:
            dash = json.load(fh)
        assert 36 <= dash["schemaVersion"] <= 41, dash["schemaVersion"]
        tvars = {v["name"]: v for v in dash["templating"]["list"]}
        assert tvars["DS_KPROF"]["type"] == "datasource"
        assert "postgres" in tvars["DS_KPROF"]["query"]
        assert {"job", "run", "rank"} <= set(tvars)
        panels = [p for p in dash["panels"] if p.get("targets")]
        assert {p["type"] for p in panels} >= {"table", "barchart"}, [p["type"] for p in panels]
        assert len(panels) >= 5
        for p in panels:
            assert p["datasource"]["uid"] == "${DS_KPROF}", p["title"]
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${DS_KPROF}", p["title"]
        queries = [(v["name"], v["query"]) for v in tvars.values() if v["type"] == "query"]
        queries += [(p["title"], t["rawSql"]) for p in panels for t in p["targets"]]
        for name, sql in queries:
            # only the public views: every relation after FROM/JOIN is kprof_dash.<view>
            for rel in re.findall(r"\b(?:FROM|JOIN)\s+([\w.]+)", sql, re.I):
                assert rel.startswith("kprof_dash.") and rel[11:] in PUBLIC_VIEWS, (name, rel)

        _, jobs = as_role(substitute(tvars["job"]["query"], 0, "", "rank"))
        assert {j for (j,) in jobs} >= {"dash-compute", "dash-data's", "dash-hta"}, jobs
        # every public view reads only the partitions of the run asked for
        for v in sorted(PUBLIC_VIEWS):
            plan = "\n".join(r[0] for r in q("EXPLAIN SELECT * FROM kprof_dash.%s "
                                             "WHERE run_id = %d" % (v, run_d)))
            parts = set(re.findall(r"\b[a-z_]+_r(\d+)\b", plan))
            assert parts <= {str(run_d)}, (v, parts, plan)

        # 2a and 3b twice: with the runs' summaries (collectord makes them when a run ends:
        # migration 0016's dashboard sums), then from the events (without the dash_runs row
        # that makes the sums count, as a late batch or a change by hand leaves a run)
        kpfix.wait_for(lambda: len(q("SELECT run_id FROM dash_runs WHERE run_id IN (%d, %d, %d)"
                                    % (run_c, run_d, run_h))) == 3, 120 * kpfix.SCALE,
                       "the runs' summaries")
        for mode in ("summary", "events"):
            if mode == "events":
                q("DELETE FROM dash_runs")
            rows_by_panel = {}
            for run, (job, nranks, _) in runs.items():
                _, rr = as_role(substitute(tvars["run"]["query"], run, job, "rank"))
                assert str(run) in {r[0] for r in rr}, (job, rr)
                _, rk = as_role(substitute(tvars["rank"]["query"], run, job, "rank"))
                assert [int(r[0]) for r in rk] == list(range(nranks)), rk
                for ranks in ("rank", ",".join("'%d'" % r for r in range(nranks)), "'0'"):
                    for p in panels:
                        sql = substitute(p["targets"][0]["rawSql"], run, job, ranks)
                        head, rows = as_role(sql)
                        rows_by_panel[(run, ranks, p["title"])] = (head, rows)
                        empty_ok = run != run_c and p["title"] in ("Straggler steps",
                                                                   "Capture status")
                        assert rows or empty_ok, (p["title"], run, ranks, sql)
            print("%s: %d variable and panel queries ran as %s" % (mode, len(queries), ROLE))

            # 3b. the figures
            panel = {p["title"]: p for p in panels}
            for run, (job, nranks, slow) in runs.items():
                allr = "rank"
                # step times: the panel's rows are the steps table's
                head, rows = rows_by_panel[(run, allr, "Step time per rank")]
                got = {(int(r[head.index("rank")]), int(r[head.index("step")])):
                       f(r[head.index("dur_ms")]) for r in rows}
                want = {(int(r), int(s)): int(d) for r, s, d in
                        q("SELECT rank, step, dur_ns FROM steps WHERE run_id = %d" % run)}
                assert got.keys() == want.keys() and len(want) >= 2, (got, want)
                for k, d in want.items():
                    assert round(got[k] * 1e6) == d, (k, got[k], d)
                # the medians and deviations of step_times
                by_step = {}
                for (r, s), d in want.items():
                    by_step.setdefault(s, []).append(d)
                for r, s, med, dev in q("SELECT rank, step, median_ms, deviation_ms FROM "
                                        "kprof_dash.step_times WHERE run_id = %d" % run):
                    m = statistics.median(by_step[int(s)]) / 1e6
                    assert close(f(med), m), (s, med, m)
                    assert close(f(dev), want[(int(r), int(s))] / 1e6 - m, 1e-4), (r, s, dev)

                # the breakdown per rank and step, and per rank
                exp = expected_breakdown(run)
                got = {(int(r[0]), int(r[1])): r[2:] for r in q(
                    "SELECT rank, step, step_ms, compute_kernel_ms, nccl_ms, memcpy_ms, "
                    "memset_ms, kernels FROM kprof_dash.rank_step_breakdown WHERE run_id = %d"
                    % run)}
                assert got.keys() == exp.keys(), (got.keys(), exp.keys())
                for k, e in exp.items():
                    g = got[k]
                    for i, name in enumerate(("step", "kernel", "nccl", "memcpy", "memset")):
                        assert round(f(g[i]) * 1e6) == e[name], (run, k, name, g, e)
                    assert int(g[5]) == e["n"], (run, k, g, e)
                assert sum(e["nccl"] for e in exp.values()) > 0, run
                head, rows = rows_by_panel[(run, allr, "Per-rank breakdown (mean per step)")]
                assert [int(r[0]) for r in rows] == list(range(nranks)), rows
                for r in rows:
                    mine = [e for (rk, _), e in exp.items() if rk == int(r[0])]
                    for col, name in (("step", "step"), ("compute kernels", "kernel"),
                                      ("NCCL kernels", "nccl"), ("memcpy", "memcpy"),
                                      ("memset", "memset")):
                        m = sum(e[name] for e in mine) / len(mine) / 1e6
                        assert close(f(r[head.index(col)]), m), (run, r, col, m)

                # top kernels: the panel's rows are an aggregate of the kernels table
                head, rows = rows_by_panel[(run, allr, "Top kernels")]
                want = q("SELECT coalesce(n.name, '(unnamed)'), count(*), sum(k.dur_ns), "
                         "max(k.dur_ns), count(DISTINCT k.rank) FROM kernels k LEFT JOIN names n "
                         "ON n.id = k.name WHERE k.run_id = %d GROUP BY 1 "
                         "ORDER BY 3 DESC, 1 LIMIT 25" % run)
                assert len(rows) == len(want) and len(rows) >= 3, (len(rows), len(want))
                for g, w in zip(rows, want):
                    assert g[head.index("kernel")] == w[0], (g, w)
                    assert int(g[head.index("calls")]) == int(w[1]), (g, w)
                    assert round(f(g[head.index("total_ms")]) * 1e6) == int(w[2]), (g, w)
                    assert round(f(g[head.index("max_us")]) * 1e3) == int(w[3]), (g, w)
                    assert close(f(g[head.index("mean_us")]), int(w[2]) / int(w[1]) / 1e3), (g, w)
                    assert int(g[head.index("ranks")]) == int(w[4]), (g, w)
                    nccl = w[0].startswith("ncclKernel_") or w[0].startswith("ncclDevKernel_")
                    assert g[head.index("nccl")] == ("t" if nccl else "f"), (g, w)
                # one rank selected: that rank's kernels only
                head1, rows1 = rows_by_panel[(run, "'0'", "Top kernels")]
                top0 = q("SELECT sum(k.dur_ns) FROM kernels k WHERE run_id = %d AND rank = 0 "
                         "GROUP BY name ORDER BY 1 DESC LIMIT 1" % run)[0][0]
                assert round(f(rows1[0][head1.index("total_ms")]) * 1e6) == int(top0)
                assert int(rows1[0][head1.index("ranks")]) == 1

                # stragglers: the planted rank, and only it (none in the HTA pair)
                head, rows = rows_by_panel[(run, allr, "Stragglers by rank")]
                flagged = [int(r[head.index("rank")]) for r in rows
                           if r[head.index("straggler")] == "t"]
                assert flagged == ([slow] if slow is not None else []), (run, flagged, rows)
                if slow is not None:
                    assert int(rows[0][head.index("rank")]) == slow, rows  # sorted first
                    head, rows = rows_by_panel[(run, allr, "Straggler steps")]
                    assert {int(r[head.index("rank")]) for r in rows} == {slow}, rows
                    assert len(rows) == 8, rows  # every step
                # the flags, recomputed from the breakdown with Python's median
                for s in {s for (_, s) in exp}:
                    mine = {rk: e for (rk, st), e in exp.items() if st == s}
                    work = {rk: max(e["step"] - e["nccl"], 0) for rk, e in mine.items()}
                    mw = statistics.median(work.values())
                    ms = statistics.median(e["step"] for e in mine.values())
                    for rk, flag, late, spread in q(
                            "SELECT rank, is_straggler, late_rank, nccl_spread_ms FROM "
                            "kprof_dash.stragglers WHERE run_id = %d AND step = %d" % (run, s)):
                        rk = int(rk)
                        want_late = work[rk] > THRESHOLD * mw
                        want_flag = want_late or mine[rk]["step"] > THRESHOLD * ms
                        assert (late == "t") == want_late and (flag == "t") == want_flag, (run, s, rk)
                        ns = [e["nccl"] for e in mine.values()]
                        assert close(f(spread), (max(ns) - min(ns)) / 1e6, 1e-4), (run, s, spread)

        # capture status
        head, rows = rows_by_panel[(run_c, "rank", "Capture status")]
        states = {int(r[head.index("rank")]): (r[head.index("rank_state")],
                                               r[head.index("reason")]) for r in rows}
        assert states == {0: ("done", ""), 1: ("done", ""), 2: ("done", ""),
                          3: ("failed", "agent gone")}, states
        print("figures checked on runs %d, %d (loadgen) and %d (HTA import)"
              % (run_c, run_d, run_h))

        # 4c. the role: read-only, the public views only
        attrs = q("SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolinherit "
                  "FROM pg_roles WHERE rolname = '%s'" % ROLE)
        assert attrs and attrs[0][:4] == ("f", "f", "f", "f"), attrs
        for t in ("kernels", "kernel_rows", "kernel_chunks", "kernel_rows_r%d" % run_c, "steps", "runs", "names", "captures",
                  "capture_ranks", "kp_schema_migrations", "kprof_dash.gpu_events",
                  "kprof_dash.nccl_names"):
            as_role_fails("SELECT count(*) FROM %s" % t)
        for sql in ("INSERT INTO runs (job, world_size) VALUES ('x', 1)",
                    "INSERT INTO kprof_dash.runs (job, world_size) VALUES ('x', 1)",
                    "UPDATE kprof_dash.runs SET job = 'x'",
                    "DELETE FROM kprof_dash.runs",
                    "DELETE FROM kernel_rows",
                    "CREATE TABLE kprof_dash.mine (x int)",
                    "CREATE VIEW kprof_dash.mine AS SELECT 1",
                    "SELECT kprof_dash.grant_dashboard_role()",
                    "TRUNCATE runs"):
            as_role_fails(sql)
        as_role_fails("SELECT kp_drop_run(%d)" % run_c, want="")
        # the dashboard sums' functions: the role calls the two the views call (they run as
        # their owner), nobody else may; the events' ones run as the caller, who reads no table
        as_role_fails("SELECT count(*) FROM kprof_dash.step_sums_events(%d)" % run_c)
        as_role_fails("SELECT count(*) FROM kprof_dash.kernel_sums_events(%d)" % run_c)
        for fn in ("step_sums", "kernel_sums"):
            assert q("SELECT has_function_privilege('public', 'kprof_dash.%s(integer)', "
                     "'EXECUTE'), has_function_privilege('%s', 'kprof_dash.%s(integer)', "
                     "'EXECUTE')" % (fn, ROLE, fn)) == [("f", "t")], fn
        assert q("SELECT count(*) FROM runs WHERE id = %d" % run_c) == [("1",)]
        if int(q("SHOW server_version_num")[0][0]) >= 150000:
            as_role_fails("CREATE TABLE public.mine (x int)")
        grants = q("SELECT table_schema, table_name, privilege_type FROM "
                   "information_schema.role_table_grants WHERE grantee = '%s'" % ROLE)
        assert {(s, t) for s, t, _ in grants} == {("kprof_dash", v) for v in PUBLIC_VIEWS}, \
            grants
        assert {p for _, _, p in grants} == {"SELECT"}, grants
        print("%s: SELECT on %d views, nothing else" % (ROLE, len(PUBLIC_VIEWS)))

        # 5d. a second database of the cluster: the role exists already
        ci2 = kpfix.fresh_db(DB2)
        cd2 = kpfix.Collectord("it_dashboards2", ci2)
        assert q("SELECT max(version) FROM kp_schema_migrations", db=DB2) == \
            q("SELECT max(version) FROM kp_schema_migrations")
        run2 = loadgen(cd2.grpc, "dash-second", "--straggler=3:1.6")
        _, rows = as_role("SELECT rank, is_straggler FROM kprof_dash.straggler_ranks "
                          "WHERE run_id = %d ORDER BY rank" % run2, db=DB2)
        assert [r[1] for r in rows] == ["f", "f", "f", "t"], rows
        as_role_fails("SELECT count(*) FROM steps", db=DB2)
        assert q("SELECT count(*) FROM pg_roles WHERE rolname = '%s'" % ROLE) == [("1",)]
        # and the migration's role block once more on a database where all of it exists
        block = open(os.path.join(SRC, "sql", "migrations", "0005_dashboard_views.sql")).read()
        block = block[block.rindex("DO $$"):]
        q(block, db=DB2)
        print("second database migrated with the role in place")
    finally:
        rcs = [cd.stop()] + ([cd2.stop()] if cd2 else [])
        cd.assert_clean_log()
        if cd2:
            cd2.assert_clean_log()
    assert rcs == [0] * len(rcs), rcs


if __name__ == "__main__":
    main()
