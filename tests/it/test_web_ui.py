"""kprof's web UI in Debian's headless Chromium (tests/browser/ui_test.mjs, playwright-core)
against the real kprof-collectord, kprof-analyzer (--web-listen, --web-root web/, tokens: no
anonymous access) and PostgreSQL.

Runs: real traces imported with `kprofctl import` (the TensorBoard plugin's ResNet-50 trace,
twice: two spans of the same job, for the diff; HTA's two-rank NCCL pair; the plugin's memory
case), and a synthetic 64-rank DDP run from kprof-loadgen with two planted stragglers (rank 5
computes 1.5x slower, rank 41 loads its data 3x slower). Then, in the browser:
  - the sign-in page refuses a wrong token with a visible message, and takes the viewer's;
  - every page (the runs; each run across its ranks; a rank's eight tabs; HTA's analyses; the
    trace; the diff of the two ResNet-50 spans) loads with no console error or warning, no
    failed request, no HTTP error and no CSP violation, and every figure and table cell it
    takes from the API equals the API's answer (each page checks at least one);
  - the run page of the synthetic run names exactly the planted ranks as stragglers, which is
    what `kprofctl compare --json` says too; the rank page's average step time is kprofctl
    breakdown's; the diff page's verdict is kprofctl diff's;
  - "Open in Perfetto" on the trace page hands the rank's whole trace to the Perfetto tab by
    Perfetto's postMessage protocol (PING, PONG, the buffer), ui.perfetto.dev played by a stub
    page the browser gets in its place (no network here);
  - without a session the API answers 401.
Screenshots of every page: build/tests/artifacts/web/*.png (printed at the end).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
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
BROWSER = os.path.join(SRC, "tests", "browser")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
CHROMIUM = os.environ.get("KPROF_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = os.path.join(kpfix.BIN, "tests", "artifacts", "web")
VIEWER = "viewer-token-web-ui-0123456789"
PLANTED = {5: "COMPARE_CAUSE_COMPUTE", 41: "COMPARE_CAUSE_HOST"}  # host: data loading
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


def check_toolchain():
    node = shutil.which("node")
    assert node, "node is not installed: deploy/local/install-deps.sh installs it"
    assert os.path.exists(os.path.join(BROWSER, "node_modules", "playwright-core")), \
        "tests/browser/node_modules is missing: deploy/local/install-deps.sh runs npm ci there"
    assert os.access(CHROMIUM, os.X_OK), \
        "%s is missing: deploy/local/install-deps.sh installs Debian's chromium" % CHROMIUM
    return node


def main():
    node = check_toolchain()
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
        out = run([LOADGEN, "--collector", cd.grpc, "--ranks", "64", "--steps", "20",
                   "--kernels-per-step", "40", "--job", "ddp-64", "--straggler", "5:1.5",
                   "--dataload-straggler", "41:3", "--json"], "kprof-loadgen").stdout
        synth = json.loads(out)["run_id"]
        print("runs: resnet50 %d and %d, HTA pair %d, memory %d, synthetic 64 ranks %d"
              % (span1, span2, pair, mem, synth))

        # without a session: 401
        try:
            urllib.request.urlopen(base + "/api/v1/runs", timeout=30)
            raise AssertionError("the API answered without a credential")
        except urllib.error.HTTPError as e:
            assert e.code == 401, e.code

        pages = [{"name": "runs", "hash": "#/runs"}]
        for name, r in (("run-synthetic", synth), ("run-hta-pair", pair),
                        ("run-resnet50", span1)):
            pages.append({"name": name, "hash": "#/runs/%d" % r})
        pages[1]["view"] = 1900  # the README's pictures (docs/img), from these two
        for tab in TABS:
            pages.append({"name": "rank-resnet50-" + tab,
                          "hash": "#/runs/%d/ranks/0?tab=%s" % (span1, tab)})
        pages[4]["view"] = 1500
        pages += [
            {"name": "rank-synthetic-5", "hash": "#/runs/%d/ranks/5" % synth},
            {"name": "rank-hta-pair-distributed", "hash": "#/runs/%d/ranks/1?tab=distributed" % pair},
            {"name": "rank-memory", "hash": "#/runs/%d/ranks/0?tab=memory" % mem},
            {"name": "hta", "hash": "#/runs/%d/hta?rank=0" % pair},
            {"name": "hta-idle", "hash": "#/runs/%d/hta?rank=0&analysis=HTA_IDLE" % pair},
            {"name": "trace", "hash": "#/runs/%d/trace?rank=0" % span1},
            {"name": "diff", "hash": "#/diff?a=%d&ra=0&b=%d&rb=0" % (span1, span2)},
        ]
        spec = {"base": base, "token": VIEWER, "bad_token": "wrong-token-0123456789abc",
                "artifacts": ARTIFACTS, "chromium": CHROMIUM, "pages": pages,
                "perfetto": [{"name": "trace", "hash": "#/runs/%d/trace?rank=0" % span1,
                              "export_url": "/api/v1/runs/%d/export?rank=0&format=json"
                              % span1}],
                "timeout_ms": int(120000 * kpfix.SCALE)}
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        p = subprocess.run([node, os.path.join(BROWSER, "ui_test.mjs"), spec_path],
                           capture_output=True, text=True, timeout=1200 * kpfix.SCALE,
                           cwd=BROWSER)
        if p.returncode == 2 or not p.stdout.strip():
            raise AssertionError("ui_test.mjs failed to run (%d):\n%s" % (p.returncode,
                                                                          p.stderr[-4000:]))
        report = json.loads(p.stdout.strip().splitlines()[-1])
        bad = []
        refused = report["login_refused"]
        assert refused["message"].strip(), "the sign-in page showed nothing for a wrong token"
        print("sign-in: a wrong token is refused (\"%s\"), the viewer's signs in"
              % refused["message"].strip())
        bad += ["sign-in: " + x for x in report["login"]["problems"] + refused["problems"]]
        for pg in report["pages"]:
            print("%-28s %-7s %5d ms  %4d figures, %5d cells checked" % (
                pg["name"], pg["state"], pg["ms"], pg["figures_checked"], pg["cells_checked"]))
            bad += ["%s (%s): %s" % (pg["name"], pg["hash"], x) for x in pg["problems"]]
        for pf in report["perfetto"]:
            bad += ["%s: %s" % (pf["name"], x) for x in pf["problems"]]
            print("Perfetto handoff: the (stub) ui.perfetto.dev tab got %s, the export has %d "
                  "events" % (pf.get("got"), pf["export_events"]))
        assert not bad, "the browser saw %d problems:\n  %s" % (len(bad), "\n  ".join(bad[:80]))
        assert p.returncode == 0, p.stderr[-4000:]
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
        assert ctl_stragglers == shown, (ctl_stragglers, shown)
        print("verdict: the run page names ranks %s (causes %s), as kprofctl compare does"
              % (sorted(shown), causes))
        # a rank's average step time and the diff's verdict, as kprofctl prints them
        bd = ctl_json(an, viewer_file, "breakdown", "--run", span1, "--rank", 0)
        ov = by["rank-resnet50-overview"]["figures"]
        step_ns = [v for k, v in ov.items() if k.endswith("average.total_ns")]
        assert step_ns, sorted(ov)[:40]
        avg = [r for r in bd["steps"] if r["step"] == "average"][0]
        assert abs(float(step_ns[0]) / 1000 - avg["total_us"]) < 1e-3, (step_ns, avg)
        print("rank page: average step %.3f µs, as kprofctl breakdown" % avg["total_us"])
        d = ctl_json(an, viewer_file, "diff", "--run", span1, "--run", span2, "--rank", 0,
                     "--other-rank", 0)
        assert by["diff"]["figures"]["diff:verdict"] == d["verdict"], \
            (by["diff"]["figures"]["diff:verdict"], d["verdict"])
        print("diff page: the verdict is kprofctl diff's: " + d["verdict"])
        print("screenshots:\n  " + "\n  ".join(pg["screenshot"] for pg in report["pages"]))
    finally:
        rc = an.stop()
        cd.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    assert rc == 0, rc
    print("ok")


if __name__ == "__main__":
    main()
