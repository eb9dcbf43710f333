"""kprofctl's surface is one thing: every verb agrees with docs/cli.md.

For every verb that `kprofctl --help` lists (so a new verb is covered without touching this
file):
  1. `--help` exits 0 and ends with an "Exit status:" block whose codes are the table's and
     whose lines start with the table's words for them (docs/cli.md "Exit statuses");
  2. text table columns that carry a time say µs (`_us`), never ms, ns or s; the credential
     flags (--tls-ca, --tls-cert, --tls-key, --token-file) are there, and exit 7 (refused);
  3. an unknown flag exits 2 with a message that starts "kprofctl VERB:";
  4. with its server not listening, the verb exits 5 and says which address it tried;
  5. against a real collectord and kprof-analyzer over an empty database, a verb about a run
     given a run that does not exist exits 3 and points at `kprofctl runs`.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kpfix  # noqa: E402
from test_analyzer_service import Analyzer  # noqa: E402

CTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")

# docs/cli.md's table: the code and the words its --help line starts with.
EXIT_WORDS = {
    0: None,  # each verb says what success is
    1: "failed",
    2: "usage:",
    3: "not found:",
    4: "busy:",
    5: None,  # "<server> unreachable"
    6: "no agent:",
    7: "refused:",
    130: "interrupted",
}

# The least a verb needs to reach its server. A verb not listed gets DEFAULT (a per-rank
# analysis verb); a verb with sub-verbs lists one.
DEFAULT = ["--run", "999999", "--rank", "0"]
ARGS = {
    "import": ["--job", "surface", "TRACE"],
    "export": ["--run", "999999", "-o", "OUTDIR"],
    "runs": [],
    "jobs": [],
    "start": ["--job", "surface-job", "--steps", "2"],
    "stop": ["--run", "999999"],
    "status": ["--run", "999999"],
    "compare": ["--run", "999999"],
    "distributed": ["--run", "999999"],
    "diff": ["--run", "999999", "--run", "999998"],
    "hta": ["temporal", "--run", "999999", "--rank", "0"],
}
# Verbs that are about one run: an unknown run is exit 3 for each.
NOT_RUN = {"import", "runs", "jobs", "start"}


def verbs():
    p = subprocess.run([CTL, "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    out = p.stdout.split("verbs:", 1)[1]
    names = [l.split()[0] for l in out.splitlines() if l.startswith("  ") and l.split()]
    assert len(names) >= 14, "kprofctl --help lists too few verbs: %s" % names
    return names


def ctl(args, env_extra=None, timeout=120):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("KPROF_") and k not in ("KPROF_TEST_PG", "KPROF_BIN_DIR"):
            del env[k]
    env.update(env_extra or {})
    return subprocess.run([CTL] + args, capture_output=True, text=True, timeout=timeout * kpfix.SCALE,
                          env=env, stdin=subprocess.DEVNULL)


def help_of(verb):
    first = ARGS.get(verb, [])[:1] if verb == "hta" else []
    p = ctl([verb] + first + ["--help"])
    assert p.returncode == 0, "%s --help exited %d: %s" % (verb, p.returncode, p.stderr)
    return p.stdout


FAILURES = []


def expect(cond, msg):
    """Records a disagreement; every one is listed at the end, so a run shows them all."""
    if not cond:
        FAILURES.append(msg)
    return cond


def check_help(verb, text):
    if not expect("Exit status:" in text, "%s --help has no Exit status block" % verb):
        return {}
    block = text.split("Exit status:", 1)[1]
    codes = {}
    for line in block.splitlines():
        m = re.match(r"^  (\d+)\s+(.*)$", line)
        if m:
            codes[int(m.group(1))] = m.group(2)
    expect(0 in codes and 2 in codes and 7 in codes,
           "%s --help: exit block lacks 0, 2 or 7: %s" % (verb, codes))
    for flag in ("--tls-ca", "--tls-cert", "--tls-key", "--token-file"):
        expect(flag in text, "%s --help lacks %s" % (verb, flag))
    for code, words in codes.items():
        if not expect(code in EXIT_WORDS, "%s --help lists exit %d, not in docs/cli.md"
                      % (verb, code)):
            continue
        want = EXIT_WORDS[code]
        if want is not None:
            expect(words.startswith(want), "%s --help: exit %d says %r, the table says %r..."
                   % (verb, code, words, want))
        if code == 5:
            expect("unreachable" in words, "%s --help: exit 5 says %r" % (verb, words))
    # Columns of the text table: a time is in µs.
    m = re.search(r"-c: comma-separated columns to show, in order \(([^)]*)\)", text)
    cols = [c.strip() for c in m.group(1).split(",")] if m else []
    for c in cols:
        expect(not re.search(r"_(ms|ns|s)$", c), "%s: column %s is not in µs (docs/cli.md "
               "Units)" % (verb, c))
    return codes


def closed_port():
    return "127.0.0.1:%d" % kpfix.free_port()


def fill(args, trace, outdir):
    return [trace if a == "TRACE" else outdir if a == "OUTDIR" else a for a in args]


def main():
    kpfix.require_env()
    tmp = tempfile.mkdtemp(prefix="kprof-cli-surface-", dir=kpfix.TEST_DIR)
    trace = os.path.join(tmp, "rank-0.pt.trace.json")
    with open(trace, "w") as f:
        f.write('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, '
                '"tid": 1, "ts": 10, "dur": 5, "args": {}}]}')
    outdir = os.path.join(tmp, "out")
    names = verbs()
    helped = {}
    for v in names:
        helped[v] = check_help(v, help_of(v))
        p = ctl([v] + ARGS.get(v, DEFAULT)[:1 if v == "hta" else 0] + ["--no-such-flag"])
        expect(p.returncode == 2, "%s --no-such-flag exited %d: %s" % (v, p.returncode,
                                                                      p.stderr.strip()))
        expect(p.stderr.startswith("kprofctl %s" % v), "%s --no-such-flag says %r"
               % (v, p.stderr.strip()))
    print("help, exit table and units checked for %d verbs" % len(names))

    # Nothing listening: exit 5, naming the address.
    down = closed_port()
    env = {"KPROF_COLLECTOR": down, "KPROF_ANALYZER": down, "KPROF_TIMEOUT": "3s",
           "KPROF_GIVE_UP": "3s"}
    for v in names:
        args = fill(ARGS.get(v, DEFAULT), trace, outdir)
        p = ctl([v] + args, env)
        expect(p.returncode == 5, "%s with nothing at %s exited %d (want 5): %s" % (
            v, down, p.returncode, p.stderr.strip()))
        expect(down in p.stderr, "%s: the message does not name %s: %s" % (v, down,
                                                                         p.stderr.strip()))
        expect(5 in helped[v], "%s exits 5 but its --help does not list it" % v)
    print("unreachable checked for %d verbs" % len(names))

    # A real collectord and analyzer over an empty database: an unknown run is 3.
    ci = kpfix.fresh_db("it_cli_surface")
    cd = kpfix.Collectord("it_cli_surface", ci)
    an = Analyzer("it_cli_surface_an", ci)
    try:
        env = {"KPROF_COLLECTOR": cd.grpc, "KPROF_ANALYZER": an.grpc}
        checked = 0
        for v in names:
            if v in NOT_RUN:
                continue
            args = fill(ARGS.get(v, DEFAULT), trace, outdir)
            p = ctl([v] + args, env)
            expect(p.returncode == 3, "%s on an unknown run exited %d (want 3): %s" % (
                v, p.returncode, p.stderr.strip()))
            expect("999999" in p.stderr and "kprofctl runs" in p.stderr,
                   "%s: an unknown run should be named and `kprofctl runs` suggested: %s"
                   % (v, p.stderr.strip()))
            expect(3 in helped[v], "%s exits 3 but its --help does not list it" % v)
            checked += 1
        print("unknown run checked for %d verbs" % checked)
    finally:
        an.stop()
        cd.stop()
        kpfix.psql("DROP DATABASE IF EXISTS it_cli_surface WITH (FORCE)", db="postgres")
        shutil.rmtree(tmp, ignore_errors=True)
    assert not FAILURES, "%d disagreements with docs/cli.md:\n  %s" % (
        len(FAILURES), "\n  ".join(FAILURES))
    print("ok")


if __name__ == "__main__":
    main()
