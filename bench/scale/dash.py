#!/usr/bin/env python3
"""bench/scale/dash.py: the Grafana dashboard's panel queries on one run, timed (run.sh).

usage: dash.py --pg CONNINFO --run R --job JOB --dashboard deploy/grafana/kprof-dashboard.json

Every panel's SQL of the dashboard, interpolated as Grafana does with every rank selected
(the multi-value variable's "All", as a list of the run's ranks), runs once in one psql
session with \\timing; prints one JSON object: {"panels": {title: seconds}, "total_s": sum,
"rows": total rows returned}. A query that fails makes it exit non-zero (psql's
ON_ERROR_STOP). The figures are the server's round trips as psql measures them.
"""
import argparse
import json
import re
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", required=True)
    ap.add_argument("--run", type=int, required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--dashboard", required=True)
    a = ap.parse_args()

    def psql(args, inp=None):
        p = subprocess.run(["psql", a.pg, "-qtAX", "-v", "ON_ERROR_STOP=1"] + args, input=inp,
                           capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("dash.py: psql failed: " + p.stderr.strip())
        return p.stdout

    ranks = psql(["-c", "SELECT string_agg(DISTINCT rank::text, ',') FROM steps WHERE run_id = "
                  "%d" % a.run]).strip()
    if not ranks:
        sys.exit("dash.py: run %d has no steps" % a.run)
    dash = json.load(open(a.dashboard))
    panels = [(p["title"], p["targets"][0]["rawSql"]) for p in dash["panels"] if p.get("targets")]
    script = ["\\timing on"]
    for title, sql in panels:
        sql = sql.replace("${run}", str(a.run)).replace("$run", str(a.run))
        job = a.job.replace("'", "''")
        sql = sql.replace("${job}", job).replace("$job", job)
        sql = sql.replace("${rank}", ranks).replace("$rank", ranks)
        if "$" in sql:
            sys.exit("dash.py: a variable left in %r" % title)
        script.append("\\echo ::panel")
        script.append(sql.rstrip().rstrip(";") + ";")
    out = psql(["-f", "-"], "\n".join(script) + "\n")
    times, rows, cur = [], 0, None
    for line in out.splitlines():
        if line == "::panel":
            cur = 0
            continue
        m = re.match(r"Time: ([0-9.]+) ms", line)
        if m:
            times.append(float(m.group(1)) / 1e3)
            rows += cur or 0
            cur = None
        elif cur is not None and line:
            cur += 1
    if len(times) != len(panels):
        sys.exit("dash.py: %d timings for %d panels" % (len(times), len(panels)))
    print(json.dumps({"panels": {t: round(s, 4) for (t, _), s in zip(panels, times)},
                      "total_s": round(sum(times), 4), "rows": rows}))


if __name__ == "__main__":
    main()
