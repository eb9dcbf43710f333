"""kprof's web UI in Debian's headless Chromium (tests/browser/ui_test.mjs, playwright-core)
against the real kprof-collectord, kprof-analyzer (--web-listen, --web-root web/, tokens: no
anonymous access) and PostgreSQL.

Runs: real traces imported with `kprofctl import` (the TensorBoard plugin's ResNet-50 trace,
twice: two spans of the same job, for the diff; the multi-rank ones: HTA's two-rank NCCL pair
and the plugin's two-rank NCCL case; the plugin's memory case), and a synthetic 64-rank DDP
run from kprof-loadgen with two planted stragglers (rank 5 computes 1.5x slower, rank 41 loads
its data 3x slower). Then, in the browser:
  - without a session the API answers 401 (to the test and to the page's own fetch) and a
    page sends the browser to the sign-in page;
  - the sign-in page refuses a wrong token with a visible message, and takes the viewer's;
  - every page (the runs; each run across its ranks; the eight tabs of a rank of each run; HTA's
    analyses; the trace; two diffs) loads with no console error or warning, no failed
    request, no HTTP error and no CSP violation (under the analyzer's policy, which the page
    must carry), and every figure and table cell it takes from the API equals the API's
    answer (each page and each table checks at least one);
  - the run page of the synthetic run names exactly the planted ranks as stragglers (with
    their causes), as the API's Compare and `kprofctl compare --json` do; a rank's average
    step breakdown and top operator are kprofctl breakdown's and ops' (µs against the API's
    ns); the diff page's verdict is kprofctl diff's;
  - the harness catches what it must: pages with planted faults (tests/browser/fault_page.js
    served in place of the diff page: a console error, a warning, an HTTP 404, an aborted
    request, an inline style against the CSP, an uncaught exception, a thrown error, a figure
    or a table cell that is not the API's, a figure of no API answer, a column of no field,
    a page with no figure, with or without the empty-state waiver; and the page shell served
    without the analyzer's CSP) each fail with the problem named;
  - "Open in Perfetto" on the trace page hands the rank's whole trace to the Perfetto tab by
    Perfetto's postMessage protocol (PING, PONG, the buffer), ui.perfetto.dev played by a stub
    page the browser gets in its place (no network here);
Screenshots of every page: build/tests/artifacts/web/*.png (printed at the end).
"""
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import kpfix

kpfix.require_env()

DB = "kp_it_web_ui"
SRC = os.environ.get("KPROF_SOURCE_DIR", ".")
PEERS = os.path.join(SRC, "tests", "data", "peers")
RESNET = os.path.join(PEERS, "tbplugin", "resnet50", "traces", "resnet50_num_workers_0")
SPAN1 = os.path.join(RESNET, "worker0.1623143089861.pt.trace.json.gz")
SPAN2 = os.path.join(RESNET, "worker0.1623143566756.pt.trace.json.gz")
HTA_PAIR = os.path.join(PEERS, "hta", "trace_filter_2rank")
MEMORY_CASE = os.path.join(PEERS, "tbplugin", "cases", "test_memory_view.json")
NCCL_CASE = os.path.join(PEERS, "tbplugin", "cases", "test_distributed_nccl.json")
BROWSER = os.path.join(SRC, "tests", "browser")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
CHROMIUM = os.environ.get("KPROF_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = os.path.join(kpfix.BIN, "tests", "artifacts", "web")
VIEWER = "viewer-token-web-ui-0123456789"
PLANTED = {5: "COMPARE_CAUSE_COMPUTE", 41: "COMPARE_CAUSE_HOST"}  # host: data loading
# the planted faults of tests/browser/fault_page.js and what ui_test.mjs must say of each
FAULTS = {
    "console": ["console error: planted console error"],
    "warning": ["console warning: planted console warning"],
    "http": ["HTTP 404 ", "/api/v1/runs/999999"],
    "request": ["request failed: ", "ERR_ABORTED"],
    "csp": ["CSP violation: style-src"],
    "uncaught": ["uncaught exception: planted uncaught error"],
    "throw": ["state error: ", "planted page error"],
    "figure": ["figure runs:runs[0].id: the page shows"],
    "cell": ["table runs:runs row 0 job: the page shows"],
    "alias": ["figure nosuch:runs[0].id: no API answer named nosuch"],
    "key": ["table runs:runs row 0 run_id: the API's row has no such field"],
    "nothing": ["no figure or table cell of the API was checked"],
}
# Known gaps of the pages (a page that shows an empty state but no figure of the API, so the
# check cannot tell it from a page that lost its figures): only the zero-figure rule is waived
# there, and only while the page shows its [data-kp-empty] state. Drop an entry once the page
# shows its empty state through ui.fig (e.g. fig('memory:devices', devices, ...)).
NO_FIGURES = {}
PLANTED_EXPECT = {}  # name of a planted page -> what it must cause
TABS = ("overview", "operators", "kernels", "memory", "distributed", "pyprof", "roofline",
        "counters")


def run(args, what, rc=0, timeout=300):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout * kpfix.SCALE)
    if p.returncode != rc:
        raise AssertionError("%s exited %d (want %d):\n%s%s" % (what, p.returncode, rc,
                                                                p.stdout[-4000:], p.stderr[-4000:]))
    return p


def import_run(cd, job, paths, rank=True):
    out = run([KPROFCTL, "import", "--collector", cd.grpc, "--job", job, "--json"] +
              (["--rank", "0"] if rank else []) + paths, "kprofctl import " + job).stdout
    return json.loads(out)["run_id"]


def ctl_json(an, token_file, verb, *args):
    out = run([KPROFCTL, verb, "--analyzer", an.grpc, "--token-file", token_file, "--json"] +
              [str(a) for a in args], "kprofctl %s %s" % (verb, " ".join(map(str, args)))).stdout
    return json.loads(out)


def api(base, path):
    req = urllib.request.Request(base + "/api/v1" + path,
                                 headers={"Authorization": "Bearer " + VIEWER})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def same_us(ctl, api_row, what):
    """kprofctl's --json row ctl shows api_row's figures: X_us is the API's X_ns in µs and a
    field of the same name is equal. Returns how many were compared."""
    n = 0
    for k, v in ctl.items():
        if k.endswith("_us") and k[:-3] + "_ns" in api_row:
            want = float(api_row[k[:-3] + "_ns"]) / 1000.0
            assert math.isclose(v, want, rel_tol=1e-9, abs_tol=1e-3), (what, k, v, want)
            n += 1
        elif k in api_row and isinstance(v, (int, float, str)) and \
                type(v) is type(api_row[k]):
            assert v == api_row[k], (what, k, v, api_row[k])
            n += 1
    return n


def check_toolchain():
    node = shutil.which("node")
    assert node, "node is not installed: deploy/local/install-deps.sh installs it"
    ver = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    assert re.match(r"v(1[89]|[2-9]\d)\.", ver), \
        "node %s is too old for playwright-core: Node.js 18 or later is needed" % ver
    assert os.path.exists(os.path.join(BROWSER, "node_modules", "playwright-core")), \
        "tests/browser/node_modules is missing: deploy/local/install-deps.sh runs npm ci there"
    assert os.access(CHROMIUM, os.X_OK), \
        "%s is missing: deploy/local/install-deps.sh installs Debian's chromium" % CHROMIUM
    return node


def main():
    node = check_toolchain()
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="kp_web_ui_", dir=kpfix.TEST_DIR)
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    os.makedirs(ARTIFACTS)
    tokens = kpfix.write_tokens(os.path.join(tmp, "tokens"), ["viewer vic " + VIEWER])
    viewer_file = os.path.join(tmp, "viewer.token")
    with open(viewer_file, "w") as f:
        f.write(VIEWER + "\n")
    os.chmod(viewer_file, 0o600)
    ci = kpfix.fresh_db(DB)
    cd = kpfix.Collectord("it_web_ui_cd", ci)
    an = kpfix.Analyzer("it_web_ui_an", ci, extra=[
        "--no-allow-anonymous", "--auth-tokens", tokens, "--web-listen", "127.0.0.1:0",
        "--web-root", os.path.join(SRC, "web")])
    try:
        base = "http://" + an.web
        # the runs: real traces, and the synthetic job with its planted stragglers
        span1 = import_run(cd, "resnet50", [SPAN1])
        span2 = import_run(cd, "resnet50", [SPAN2])
        pair = import_run(cd, "hta-pair", [HTA_PAIR], rank=False)
        with open(MEMORY_CASE) as f:
            case = json.load(f)
        mem_path = os.path.join(tmp, "memory.json")
        with open(mem_path, "w") as f:
            json.dump(case["trace"], f)
        mem = import_run(cd, "memory", [mem_path])
        with open(NCCL_CASE) as f:
            case = json.load(f)
        nccl_dir = os.path.join(tmp, "nccl")
        os.makedirs(nccl_dir)
        for w, t in case["traces"].items():
            with open(os.path.join(nccl_dir, w + ".json"), "w") as f:
                json.dump(t, f)
        nccl = import_run(cd, "nccl-pair", [nccl_dir], rank=False)
        out = run([LOADGEN, "--collector", cd.grpc, "--ranks", "64", "--steps", "20",
                   "--kernels-per-step", "40", "--job", "ddp-64", "--straggler", "5:1.5",
                   "--dataload-straggler", "41:3", "--json"], "kprof-loadgen").stdout
        synth = json.loads(out)["run_id"]
        print("runs: resnet50 %d and %d, HTA pair %d, memory %d, NCCL pair %d, synthetic 64 "
              "ranks %d" % (span1, span2, pair, mem, nccl, synth))

        # without a session: 401
        try:
            urllib.request.urlopen(base + "/api/v1/runs", timeout=30)
            raise AssertionError("the API answered without a credential")
        except urllib.error.HTTPError as e:
            assert e.code == 401, e.code

        pages = [{"name": "runs", "hash": "#/runs"}]
        named = (("synthetic", synth, 5), ("hta-pair", pair, 1), ("resnet50", span1, 0),
                 ("resnet50-span2", span2, 0), ("memory", mem, 0), ("nccl-pair", nccl, 1))
        for name, r, _ in named:
            pages.append({"name": "run-" + name, "hash": "#/runs/%d" % r})
        for name, r, rank in named:
            if name == "resnet50-span2":
                continue  # the same trace's other span: resnet50's tabs cover it
            for tab in TABS:
                pg = {"name": "rank-%s-%d-%s" % (name, rank, tab),
                      "hash": "#/runs/%d/ranks/%d?tab=%s" % (r, rank, tab)}
                if (name, tab) in NO_FIGURES:
                    pg["no_figures"] = NO_FIGURES[(name, tab)]
                pages.append(pg)
        # the README's pictures (docs/img) come from the top of these two
        VIEW = {"run-synthetic": 1900, "rank-resnet50-0-overview": 1500}
        for pg in pages:
            if pg["name"] in VIEW:
                pg["view"] = VIEW[pg["name"]]
        pages += [
            {"name": "rank-synthetic-41", "hash": "#/runs/%d/ranks/41" % synth},
            {"name": "hta", "hash": "#/runs/%d/hta?rank=0" % pair},
            {"name": "hta-idle", "hash": "#/runs/%d/hta?rank=0&analysis=HTA_IDLE" % pair},
            {"name": "hta-resnet50", "hash": "#/runs/%d/hta?rank=0" % span1},
            {"name": "trace", "hash": "#/runs/%d/trace?rank=0" % span1},
            {"name": "trace-hta-pair", "hash": "#/runs/%d/trace?rank=1" % pair},
            {"name": "diff", "hash": "#/diff?a=%d&ra=0&b=%d&rb=0" % (span1, span2)},
            {"name": "diff-ranks", "hash": "#/diff?a=%d&ra=0&b=%d&rb=5" % (synth, synth)},
            {"name": "diff-pick", "hash": "#/diff"},
            {"name": "runs-of-job", "hash": "#/runs?job=resnet50"},
        ]
        # the harness's own trials, last (a planted page must not linger in the cache)
        fault_page = os.path.join(BROWSER, "fault_page.js")
        for fault, expect in FAULTS.items():
            pages.append({"name": "planted-" + fault, "hash": "#/diff?fault=" + fault,
                          "serve": {"/js/pages/diff.js": fault_page}, "expect": expect})
        # a document without the analyzer's Content-Security-Policy (the shell served bare)
        pages.append({"name": "planted-no-csp", "hash": "#/runs",
                      "serve": {"/": os.path.join(SRC, "web", "index.html")},
                      "expect": ["the page came without its Content-Security-Policy"]})
        # the waiver of the zero-figure rule holds only for a page showing an empty state
        pages.append({"name": "planted-nothing-waived", "hash": "#/diff?fault=nothing",
                      "serve": {"/js/pages/diff.js": fault_page}, "no_figures": "a trial",
                      "expect": FAULTS["nothing"]})
        PLANTED_EXPECT.update((pg["name"], pg["expect"]) for pg in pages if "expect" in pg)
        spec = {"base": base, "token": VIEWER, "bad_token": "wrong-token-0123456789abc",
                "artifacts": ARTIFACTS, "chromium": CHROMIUM, "pages": pages,
                "no_session": ["#/runs/%d" % synth],
                "perfetto": [{"name": "trace", "hash": "#/runs/%d/trace?rank=0" % span1,
                              "export_url": "/api/v1/runs/%d/export?rank=0&format=json"
                              % span1}],
                "timeout_ms": int(120000 * kpfix.SCALE)}
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        t1 = time.monotonic()
        p = subprocess.run([node, os.path.join(BROWSER, "ui_test.mjs"), spec_path],
                           capture_output=True, text=True, timeout=1200 * kpfix.SCALE,
                           cwd=BROWSER)
        t2 = time.monotonic()
        print("time: services and runs %.1f s, the browser's %d pages %.1f s"
              % (t1 - t0, len(pages), t2 - t1))
        if p.returncode == 2 or not p.stdout.strip():
            raise AssertionError("ui_test.mjs failed to run (%d):\n%s" % (p.returncode,
                                                                          p.stderr[-4000:]))
        report = json.loads(p.stdout.strip().splitlines()[-1])
        bad = []
        for ns in report["no_session"]:
            print("no session: the page's GET /api/v1/runs is %d, %s ends on %s"
                  % (ns["api_status"], ns["hash"], ns["landed"]))
            bad += ["no session %s: %s" % (ns["hash"], x) for x in ns["problems"]]
        refused = report["login_refused"]
        assert refused["message"].strip(), "the sign-in page showed nothing for a wrong token"
        print("sign-in: a wrong token is refused (\"%s\"), the viewer's signs in"
              % refused["message"].strip())
        bad += ["sign-in: " + x for x in report["login"]["problems"] + refused["problems"]]
        total = [0, 0]
        for pg in report["pages"]:
            if "expect" in pg or pg["name"].startswith("planted-"):
                print("%-36s caught: %s" % (pg["name"], " | ".join(
                    x for x in pg.get("expected", []) if any(e in x for e in
                                                             PLANTED_EXPECT[pg["name"]]))[:200]))
            else:
                print("%-36s %-6s %5d ms %4d figures, %5d cells checked%s" % (
                    pg["name"], pg["state"], pg["ms"], pg["figures_checked"],
                    pg["cells_checked"], "  (WAIVED: %s)" % pg["waived"] if pg.get("waived") else ""))
                if pg["ms"] > 1000:
                    print("%-36s slow: its slowest API call took %d ms: %s" % (
                        "", pg["slowest_api"]["ms"], pg["slowest_api"]["url"]))
                total[0] += pg["figures_checked"]
                total[1] += pg["cells_checked"]
            bad += ["%s (%s): %s" % (pg["name"], pg["hash"], x) for x in pg["problems"]]
        for pf in report["perfetto"]:
            bad += ["%s: %s" % (pf["name"], x) for x in pf["problems"]]
            print("Perfetto handoff: the (stub) ui.perfetto.dev tab got %s, the export has %d "
                  "events" % (pf.get("got"), pf["export_events"]))
        assert not bad, "the browser saw %d problems:\n  %s" % (len(bad), "\n  ".join(bad[:120]))
        assert p.returncode == 0, p.stderr[-4000:]
        print("%d pages: %d figures and %d table cells equal to the API's answers"
              % (len(report["pages"]) - len(PLANTED_EXPECT), total[0], total[1]))
        by = {pg["name"]: pg for pg in report["pages"]}

        # the verdict: the planted ranks, as kprofctl says
        figs = by["run-synthetic"]["figures"]
        shown = {int(v) for k, v in figs.items()
                 if re.fullmatch(r"compare:stragglers\[\d+\]\.rank", k)}
        assert shown == set(PLANTED), ("the run page names %s as stragglers, planted %s"
                                       % (sorted(shown), sorted(PLANTED)))
        causes = {int(figs["compare:stragglers[%d].rank" % i]): figs.get(
            "compare:stragglers[%d].cause" % i) for i in range(len(shown))}
        assert causes == PLANTED, causes
        cmp = ctl_json(an, viewer_file, "compare", "--run", synth)
        ctl_stragglers = {s["rank"] for s in cmp["stragglers"]}
        api_stragglers = {s["rank"] for s in api(base, "/runs/%d/views/compare" % synth)[
            "stragglers"]}
        assert ctl_stragglers == api_stragglers == shown, (ctl_stragglers, api_stragglers, shown)
        print("verdict: the run page names ranks %s (causes %s), as the API's Compare and "
              "kprofctl compare do" % (sorted(shown), causes))
        # a rank's average step breakdown and top operator, as kprofctl prints them (µs)
        bd = ctl_json(an, viewer_file, "breakdown", "--run", span1, "--rank", 0)
        avg = [r for r in bd["steps"] if r["step"] == "average"][0]
        api_avg = api(base, "/runs/%d/views/breakdown?rank=0" % span1)["average"]
        n = same_us(avg, api_avg, "breakdown average")
        assert n >= 8, (n, avg, api_avg)
        ov = by["rank-resnet50-0-overview"]["figures"]
        assert ov["breakdown:average.total_ns"] == str(api_avg["total_ns"]), \
            (ov["breakdown:average.total_ns"], api_avg["total_ns"])
        print("rank page: average step %.3f µs, as kprofctl breakdown (%d figures of its "
              "average row equal the API's)" % (avg["total_us"], n))
        ops = ctl_json(an, viewer_file, "ops", "--run", span1, "--rank", 0)
        api_ops = api(base, "/runs/%d/views/ops?rank=0" % span1)["rows"]
        assert ops and api_ops and ops[0]["name"] == api_ops[0]["name"], (ops[:1], api_ops[:1])
        n = same_us(ops[0], api_ops[0], "top op")
        assert n >= 6, (n, ops[0], api_ops[0])
        opf = by["rank-resnet50-0-operators"]["figures"]
        top = [k for k in opf if k.startswith("ops:rows[0].")]
        print("top operator: %s, %.3f µs device self, as kprofctl ops (%d figures; the page "
              "shows %s)" % (ops[0]["name"], ops[0].get("device_self_us", float("nan")), n,
                             ", ".join(top) or "its row in the table"))
        d = ctl_json(an, viewer_file, "diff", "--run", span1, "--run", span2, "--rank", 0,
                     "--other-rank", 0)
        assert by["diff"]["figures"]["diff:verdict"] == d["verdict"], \
            (by["diff"]["figures"]["diff:verdict"], d["verdict"])
        print("diff page: the verdict is kprofctl diff's: " + d["verdict"])
        print("screenshots:\n  " + "\n  ".join(
            [os.path.join(ARTIFACTS, "login-refused.png")] +
            [pg["screenshot"] for pg in report["pages"]]))
    finally:
        rc = an.stop()
        cd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    assert rc == 0, rc
    print("ok")


if __name__ == "__main__":
    main()
