#!/usr/bin/env python3
"""bench/scale/probe.py: where a cold view's time goes, for FINDINGS.md (run by hand).

usage: probe.py --pg CONNINFO --pglog FILE --run R [--rank N] --analyzer-addr ADDR
                --analyzer-pid PID --kprofctl PATH [--views breakdown,prof] [--perf]

The PostgreSQL behind CONNINFO must be one this probe may reconfigure (a throwaway one, e.g.
tests/it/pgfix.sh's, whose server log is FILE): it sets log_min_duration_statement = 0 for
the duration of each view, so the server's log gives every statement the analyzer sent, with
its parameters and the time the server spent on it (parse, bind, execute: the execute time
includes producing and sending the rows). Then, for each distinct statement, with the
parameters substituted:
  - EXPLAIN (ANALYZE, BUFFERS, TIMING OFF): the plan, its planning time and the execution
    time without producing text rows (the rows are computed and thrown away);
  - psql text result to /dev/null (what the analyzer does: text rows over libpq);
  - COPY (...) TO STDOUT (FORMAT binary) to /dev/null;
  - the bytes of the text and the binary forms.
With --perf, `perf record -a -g` runs over the whole view call, and the CPU samples are
split by process (kprof-analyzer, postgres, kprofctl) and, per process, by top symbols.
Prints a report (markdown) on stdout.
"""
import argparse
import os
import re
import subprocess
import sys
import time


def psql(pg, sql, fmt_out=None):
    cmd = ["psql", pg, "-qtAX", "-v", "ON_ERROR_STOP=1", "-c", sql]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
    return r.stdout


def timed_bytes(pg, sql):
    t0 = time.monotonic()
    out = psql(pg, sql)
    return time.monotonic() - t0, len(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", required=True)
    ap.add_argument("--pglog", required=True)
    ap.add_argument("--run", required=True, type=int)
    ap.add_argument("--rank", default=0, type=int)
    ap.add_argument("--analyzer-addr", required=True)
    ap.add_argument("--analyzer-pid", required=True, type=int)
    ap.add_argument("--kprofctl", required=True)
    ap.add_argument("--views", default="breakdown,prof")
    ap.add_argument("--perf", action="store_true")
    a = ap.parse_args()
    out = sys.stdout
    for view in a.views.split(","):
        psql(a.pg, "ALTER SYSTEM SET log_min_duration_statement = 0")
        psql(a.pg, "SELECT pg_reload_conf()")
        time.sleep(0.5)
        pos = os.path.getsize(a.pglog)
        perf = None
        if a.perf:
            perf = subprocess.Popen(["perf", "record", "-a", "-g", "-F", "499", "-o",
                                     f"/tmp/kprof-scale-{view}.perf"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1)
        t0 = time.monotonic()
        subprocess.run([a.kprofctl, view, "--analyzer", a.analyzer_addr, "--timeout", "3600s",
                        "--run", str(a.run), "--rank", str(a.rank), "--json"],
                       stdout=subprocess.DEVNULL, check=True)
        wall = time.monotonic() - t0
        if perf:
            perf.send_signal(2)
            perf.wait()
        psql(a.pg, "ALTER SYSTEM RESET log_min_duration_statement")
        psql(a.pg, "SELECT pg_reload_conf()")
        with open(a.pglog, errors="replace") as f:
            f.seek(pos)
            log = f.read()
        # Extended protocol: "duration: X ms  parse|bind|execute <unnamed>: SQL" then
        # "DETAIL:  Parameters: $1 = '...', $2 = '...'"; simple: "duration: X ms  statement: SQL".
        stmts = []
        cur = None
        for line in log.splitlines():
            m = re.search(r"duration: ([0-9.]+) ms\s+(parse|bind|execute|statement)[^:]*: (.*)", line)
            if m:
                cur = {"ms": float(m.group(1)), "phase": m.group(2), "sql": m.group(3),
                       "params": {}}
                stmts.append(cur)
                continue
            m = re.search(r"(?:DETAIL|PARAMETERS):\s+[Pp]arameters: (.*)", line)
            if m and cur is not None:
                for k, v in re.findall(r"\$(\d+) = '([^']*)'", m.group(1)):
                    cur["params"][k] = v
            elif cur is not None and line.startswith(("\t", " ")) and "duration:" not in line:
                cur["sql"] += " " + line.strip()
        hwm = 0
        with open(f"/proc/{a.analyzer_pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM"):
                    hwm = int(line.split()[1])
        out.write(f"\n## {view}: {wall:.3f} s end to end (kprofctl), analyzer VmHWM {hwm / 1024:.0f} MiB\n\n")
        byphase = {}
        for s in stmts:
            byphase[s["phase"]] = byphase.get(s["phase"], 0) + s["ms"]
        out.write("server time by protocol phase (ms): " +
                  ", ".join(f"{k} {v:.0f}" for k, v in byphase.items()) + "\n\n")
        out.write("| server ms (execute) | EXPLAIN ANALYZE exec ms | plan ms | psql text s | text MB | COPY binary s | binary MB | statement |\n|---|---|---|---|---|---|---|---|\n")
        seen = set()
        for s in stmts:
            if s["phase"] not in ("execute", "statement"):
                continue
            sql = s["sql"]
            for k in sorted(s["params"], key=int, reverse=True):
                sql = sql.replace("$" + k, "'" + s["params"][k] + "'")
            if not sql.lstrip().upper().startswith("SELECT") or sql in seen:
                continue
            seen.add(sql)
            try:
                ex = psql(a.pg, "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + sql).decode()
                pm = re.search(r"Planning Time: ([0-9.]+)", ex)
                em = re.search(r"Execution Time: ([0-9.]+)", ex)
                tt, tb = timed_bytes(a.pg, sql)
                bt, bb = timed_bytes(a.pg, f"COPY ({sql}) TO STDOUT (FORMAT binary)")
            except subprocess.CalledProcessError as e:
                out.write(f"| {s['ms']:.0f} | error {e.stderr.decode()[:80]} | | | | | | |\n")
                continue
            short = re.sub(r"\s+", " ", sql)[:160].replace("|", "\\|")
            out.write(f"| {s['ms']:.0f} | {em.group(1) if em else '?'} | {pm.group(1) if pm else '?'} "
                      f"| {tt:.3f} | {tb / 1e6:.1f} | {bt:.3f} | {bb / 1e6:.1f} | `{short}` |\n")
            if s["ms"] > 200:
                out.write("\n<details><summary>plan</summary>\n\n```\n" + ex + "```\n</details>\n\n")
        if perf:
            rep = subprocess.run(["perf", "report", "-i", f"/tmp/kprof-scale-{view}.perf",
                                  "--no-children", "--sort", "comm", "--stdio", "-g", "none"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode()
            out.write("\nCPU samples by process (perf record -a):\n\n```\n" +
                      "\n".join(l for l in rep.splitlines() if l.strip() and not l.startswith("#"))[:1500] +
                      "\n```\n")
            rep = subprocess.run(["perf", "report", "-i", f"/tmp/kprof-scale-{view}.perf",
                                  "--no-children", "--sort", "comm,dso,sym", "--stdio", "-g", "none"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode()
            lines = [l for l in rep.splitlines() if l.strip() and not l.startswith("#")][:40]
            out.write("\ntop symbols:\n\n```\n" + "\n".join(lines) + "\n```\n")
        out.flush()


if __name__ == "__main__":
    main()
