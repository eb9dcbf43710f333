"""The helm chart (helm/kprof), without helm or a cluster:
  1. it renders (tests/helm/render: Go's text/template with sprig, helm's built-ins) for the
     default values and variants: external PostgreSQL with existing Secrets, mutual TLS with
     per-node agent certificates, ServiceMonitor on with other agent resources; and refuses
     inconsistent values with a message;
  2. values.yaml (and each variant) passes values.schema.json, a bad value does not, and every
     value in values.yaml has a comment;
  3. every object deserializes into python3-kubernetes' model of its kind and serializes back
     to the same document (a misspelt or misplaced field is dropped by the model, so it shows);
  4. structure: each Secret and ConfigMap a pod uses is in the render (or is an existing one
     the values named); ports agree with each daemon's flags (the chart's default ports are the
     daemons' defaults, and the Services, containerPorts and probes use the ports the rendered
     configuration listens on); probes are /healthz and /readyz on the http port; every
     container is non-root, read-only, drops every capability, under RuntimeDefault seccomp,
     except the agent's install init container (root, CHOWN, DAC_OVERRIDE and FOWNER only);
     the agent's --host is the node's name; the generated certificate names the Services;
  5. the hostPath contract: the agent's install script, run against a root made of the build
     tree, lays out a directory from which kprof-run (as README.md's PyTorchJob calls it) finds
     libkprof_inject.so and the Python hook, and whose socket is the agent's; the README's
     snippet mounts the chart's directories;
  6. the daemons start with what the chart renders for them (their configuration files, the
     migrate init container's arguments, the generated TLS material, tokens and passwords, and
     the bundled PostgreSQL's init script run against the test PostgreSQL), on loopback: the
     migration applies as the owner, collectord and the analyzer become ready as the writer
     and reader users, the agent attaches with the generated agent token over TLS, and
     kprofctl reads collectord and the analyzer with the generated operator token; again with
     one token per node and with mutual TLS from existing Secrets, where a new version of the
     token Secret (swapped in as kubelet does) reaches the daemons without a restart.
Skips (77) when go, sprig or python3-kubernetes is missing (CI installs them)."""
import base64
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import kpfix

SRC = os.environ.get("KPROF_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(SRC, "helm", "kprof")
SKIP = 77


def skip(why):
    print("SKIP: " + why)
    sys.exit(SKIP)


try:
    import jsonschema
    import kubernetes.client
    import yaml
except ImportError as e:
    skip("%s (deploy/local/install-deps.sh installs python3-kubernetes and python3-jsonschema)"
         % e)
GO = shutil.which("go")
if GO is None or not os.path.isdir("/usr/share/gocode/src/github.com/Masterminds/sprig"):
    skip("go or Debian's sprig is missing (deploy/local/install-deps.sh installs golang-go and "
         "golang-github-masterminds-sprig-dev)")

kpfix.require_env()
WORK = tempfile.mkdtemp(prefix="helm.", dir=kpfix.TEST_DIR)
RENDER = os.path.join(WORK, "render")
NS = "ml"
RELEASE = "kp"
FULL = "kp-kprof"


def build_renderer():
    env = dict(os.environ, GOPATH="/usr/share/gocode", GO111MODULE="off", GOFLAGS="",
               GOPROXY="off", GOCACHE=os.path.join(kpfix.TEST_DIR, "helm-gocache"))
    p = subprocess.run([GO, "build", "-o", RENDER, "."], cwd=os.path.join(SRC, "tests", "helm",
                       "render"), env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, "go build of the renderer failed:\n" + p.stderr


def render(values=None, sets=(), notes=False):
    args = [RENDER, "-chart", CHART, "-name", RELEASE, "-namespace", NS]
    if values is not None:
        path = os.path.join(WORK, "values-%d.yaml" % len(os.listdir(WORK)))
        with open(path, "w") as f:
            yaml.safe_dump(values, f)
        args += ["-f", path]
    for s in sets:
        args += ["-set", s]
    if notes:
        args.append("-notes")
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def render_docs(values=None, sets=()):
    p = render(values, sets)
    assert p.returncode == 0, "render failed (%s):\n%s" % (values, p.stderr)
    return [d for d in yaml.safe_load_all(p.stdout) if d]


def merged(values):
    def merge(d, s):
        for k, v in s.items():
            if isinstance(v, dict) and isinstance(d.get(k), dict):
                merge(d[k], v)
            else:
                d[k] = v
        return d
    return merge(copy.deepcopy(DEFAULTS), values or {})


DEFAULTS = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))
SCHEMA = json.load(open(os.path.join(CHART, "values.schema.json")))

VARIANTS = {
    "default": {},
    "external": {
        "postgresql": {"bundled": {"enabled": False},
                       "external": {"host": "pg.db.svc", "sslRootCertSecret": "pg-ca",
                                    "extraConninfo": "connect_timeout=5"},
                       "existingSecret": "kprof-pg"},
        "tls": {"existingSecret": "kprof-tls"}, "auth": {"existingSecret": "kprof-auth"},
        "agent": {"credentials": {"perNodeSecret": "kprof-agent-tokens"}, "allowUids": [1000]},
    },
    "mtls": {
        "tls": {"clientCA": True},
        "agent": {"credentials": {"mode": "certificate", "perNodeSecret": "kprof-agent-certs"},
                  "hostPID": True},
    },
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "agent": {"resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                "limits": {"cpu": "500m", "memory": "256Mi"}}},
        "dashboard": {"namespace": "monitoring"},
        "collectord": {"extraConfig": {"queue-max-bytes": "512MiB"}},
        "analyzer": {"web": {"enabled": False}},
    },
}
# Secrets a variant names as existing (not rendered).
EXISTING = {"kprof-pg", "kprof-tls", "kprof-auth", "kprof-agent-tokens", "kprof-agent-certs",
            "pg-ca"}

MODELS = {"Deployment": "V1Deployment", "DaemonSet": "V1DaemonSet",
          "StatefulSet": "V1StatefulSet", "Service": "V1Service", "ConfigMap": "V1ConfigMap",
          "Secret": "V1Secret"}


class _Resp:
    def __init__(self, obj):
        self.data = json.dumps(obj)


def strip_empty(v):
    """Drops None and the empty values a model serializes away, to compare documents."""
    if isinstance(v, dict):
        return {k: strip_empty(x) for k, x in v.items() if x is not None and x != []}
    if isinstance(v, list):
        return [strip_empty(x) for x in v]
    return v


def check_models(docs, what):
    api = kubernetes.client.ApiClient()
    for d in docs:
        kind = d["kind"]
        if kind == "ServiceMonitor":
            assert d["apiVersion"] == "monitoring.coreos.com/v1", d["apiVersion"]
            for ep in d["spec"]["endpoints"]:
                assert ep["port"] == "http" and ep["path"] == "/metrics", ep
            continue
        assert kind in MODELS, "%s: unexpected kind %s" % (what, kind)
        obj = api.deserialize(_Resp(d), MODELS[kind])
        back = api.sanitize_for_serialization(obj)
        a, b = strip_empty(json.loads(json.dumps(d))), strip_empty(back)
        assert a == b, "%s: %s %s does not survive its model:\n%s\n!=\n%s" % (
            what, kind, d["metadata"]["name"], json.dumps(a, sort_keys=True),
            json.dumps(b, sort_keys=True))
    print("%s: %d objects match their Kubernetes models" % (what, len(docs)))


def pods(docs):
    """(object, pod spec) of every workload."""
    return [(d, d["spec"]["template"]["spec"]) for d in docs
            if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]


def by(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise AssertionError("no %s %s in the render" % (kind, name))


def conf(docs, prog):
    """The rendered key = value configuration of prog, as a dict."""
    text = by(docs, "ConfigMap", FULL + "-config")["data"][prog + ".conf"]
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def check_references(docs, what):
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    n = 0
    for d, spec in pods(docs):
        refs = []
        for v in spec.get("volumes", []):
            if "secret" in v:
                refs.append(("Secret", v["secret"]["secretName"]))
            if "configMap" in v:
                refs.append(("ConfigMap", v["configMap"]["name"]))
            for s in v.get("projected", {}).get("sources", []):
                if "secret" in s:
                    refs.append(("Secret", s["secret"]["name"]))
        for c in spec.get("initContainers", []) + spec["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.append(("Secret", ref["name"]))
        for r in refs:
            assert r in names or (r[0] == "Secret" and r[1] in EXISTING), \
                "%s: %s %s uses %s %s, which is neither rendered nor named as existing" % (
                    what, d["kind"], d["metadata"]["name"], r[0], r[1])
            n += 1
        # Each volume a container mounts is declared.
        vols = {v["name"] for v in spec.get("volumes", [])} | {
            t["metadata"]["name"] for t in d["spec"].get("volumeClaimTemplates", [])}
        for c in spec.get("initContainers", []) + spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in vols, "%s: %s mounts undeclared %s" % (what, c["name"],
                                                                          m["name"])
    print("%s: %d Secret and ConfigMap references resolve" % (what, n))


def check_security(docs, what):
    for d, spec in pods(docs):
        pod_sc = spec.get("securityContext", {})
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c.get("securityContext", {})
            name = "%s/%s" % (d["metadata"]["name"], c["name"])
            assert sc.get("allowPrivilegeEscalation") is False, name
            assert sc.get("readOnlyRootFilesystem") is True, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            seccomp = sc.get("seccompProfile") or pod_sc.get("seccompProfile")
            if d["kind"] != "StatefulSet":
                assert seccomp == {"type": "RuntimeDefault"}, name
            assert "resources" in c and c["resources"].get("limits"), name + ": no limits"
            if d["kind"] == "DaemonSet" and c["name"] == "install":
                assert sorted(sc["capabilities"]["add"]) == ["CHOWN", "DAC_OVERRIDE",
                                                             "FOWNER"], sc
                continue
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, name
            assert sc.get("runAsUser", pod_sc.get("runAsUser")) not in (None, 0), name
            assert not sc["capabilities"].get("add"), name
        assert spec.get("automountServiceAccountToken") is False, d["metadata"]["name"]
    print("%s: every container non-root (but the agent's install step), read-only, no "
          "capabilities, RuntimeDefault seccomp" % what)


def check_ports(docs, what, vals):
    for prog, comp in (("kprof-collectord", "collectord"), ("kprof-analyzer", "analyzer"),
                       ("kprof-agent", "agent")):
        c = conf(docs, prog)
        http = port_of(c["http-listen"])
        wl = by(docs, "DaemonSet" if comp == "agent" else "Deployment", FULL + "-" + comp)
        ctr = wl["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
        assert ports["http"] == http == vals[comp]["httpPort"], (what, comp, ports, http)
        assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}, comp
        assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}, comp
        svc = by(docs, "Service", FULL + "-" + comp)
        sports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
        assert sports["http"] == (http, "http"), (comp, sports)
        if comp != "agent":
            grpc = port_of(c["listen"])
            assert ports["grpc"] == grpc == vals[comp]["grpcPort"], (comp, ports, grpc)
            assert sports["grpc"] == (grpc, "grpc"), (comp, sports)
        if comp == "analyzer":
            web = vals[comp].get("web", {"enabled": True, "port": 7080})
            if web["enabled"]:
                assert port_of(c["web-listen"]) == ports["web"] == web["port"], (what, c, ports)
                assert sports["web"] == (web["port"], "web"), (what, sports)
            else:
                assert "web-listen" not in c and "web" not in ports and "web" not in sports, \
                    (what, c, ports, sports)
        sel = svc["spec"]["selector"]
        labels = wl["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in sel.items()), (comp, sel, labels)
    agent_conf = conf(docs, "kprof-agent")
    col = by(docs, "Service", FULL + "-collectord")
    want = "%s-collectord.%s.svc:%d" % (FULL, NS, col["spec"]["ports"][0]["port"])
    assert agent_conf["collector"] == want, (agent_conf["collector"], want)
    ds = by(docs, "DaemonSet", FULL + "-agent")["spec"]["template"]["spec"]
    agent = ds["containers"][0]
    assert "--host=$(NODE_NAME)" in agent["args"], agent["args"]
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    print("%s: ports agree with the daemons' configuration, probes on /healthz and /readyz"
          % what)


def daemon_defaults(prog, rel):
    """The daemon's own effective configuration with no file (its defaults)."""
    empty = os.path.join(WORK, "empty.conf")
    open(empty, "w").close()
    p = subprocess.run([os.path.join(kpfix.BIN, rel, prog), "--config=" + empty,
                        "--print-config"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def check_default_ports():
    for prog, rel, comp in (("kprof-collectord", "collectord", "collectord"),
                            ("kprof-analyzer", "analyzer", "analyzer")):
        d = daemon_defaults(prog, rel)
        assert port_of(d["listen"]) == DEFAULTS[comp]["grpcPort"], (prog, d["listen"])
        assert port_of(d["http-listen"]) == DEFAULTS[comp]["httpPort"], (prog, d["http-listen"])
    print("the chart's default ports are the daemons' defaults")


def check_values_documented():
    lines = open(os.path.join(CHART, "values.yaml")).read().splitlines()
    stack = []  # (indent, documented)
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z0-9_./-]+):", line)
        if not m:
            continue
        ind = len(m.group(1))
        while stack and stack[-1][0] >= ind:
            stack.pop()
        prev = lines[i - 1].strip() if i else ""
        documented = prev.startswith("#")
        assert documented or (stack and stack[-1][1]), \
            "values.yaml line %d: %s has no comment (nor has its parent)" % (i + 1, m.group(2))
        stack.append((ind, documented))
    print("every value in values.yaml is documented")


def check_schema():
    jsonschema.validate(DEFAULTS, SCHEMA)
    for name, v in VARIANTS.items():
        jsonschema.validate(merged(v), SCHEMA)
    for bad in ({"logLevel": "loud"}, {"agent": {"credentials": {"mode": "password"}}},
                {"collectord": {"grpcPort": 70700}}, {"collectord": {"grpcprot": 1}},
                {"postgresql": {"external": {"extraConninfo": "password=x"}}}):
        try:
            jsonschema.validate(merged(bad), SCHEMA)
        except jsonschema.ValidationError:
            continue
        raise AssertionError("values.schema.json accepts %s" % bad)
    print("values.yaml and the variants pass values.schema.json; 5 bad values do not")


def check_refusals():
    for sets, msg in ((["agent.credentials.mode=certificate",
                        "agent.credentials.perNodeSecret=x"], "needs tls.clientCA"),
                      (["postgresql.bundled.enabled=false"], "postgresql.external.host is "
                                                             "required")):
        p = render(sets=sets)
        assert p.returncode != 0 and msg in p.stderr, (sets, p.returncode, p.stderr)
    print("inconsistent values are refused with a message")


def check_generated_cert(docs):
    tls = by(docs, "Secret", FULL + "-tls")["data"]
    crt = os.path.join(WORK, "gen.crt")
    with open(crt, "wb") as f:
        f.write(base64.b64decode(tls["tls.crt"]))
    p = subprocess.run([kpfix.OPENSSL, "x509", "-in", crt, "-noout", "-ext", "subjectAltName"],
                       capture_output=True, text=True, check=True)
    for comp in ("collectord", "analyzer"):
        assert "DNS:%s-%s.%s.svc," % (FULL, comp, NS) in p.stdout, p.stdout
    assert "IP Address:127.0.0.1" in p.stdout, p.stdout
    print("the generated certificate names both Services")


# What the image holds, from the build tree: an init container's script runs against it.
IMAGE = os.path.join(WORK, "image")


def make_image():
    lib = os.path.join(IMAGE, "usr", "lib", "x86_64-linux-gnu", "kprof")
    os.makedirs(os.path.join(lib, "python"))
    os.makedirs(os.path.join(IMAGE, "usr", "bin"))
    shutil.copy(os.path.join(SRC, "agent", "kprof-run"), os.path.join(IMAGE, "usr", "bin"))
    shutil.copy(os.path.join(kpfix.BIN, "agent", "inject", "libkprof_inject.so"), lib)
    for f in ("sitecustomize.py", "kprof_hook.py"):
        shutil.copy(os.path.join(SRC, "agent", "python", f), os.path.join(lib, "python"))


def rendered_secrets(docs):
    out = {}
    for d in docs:
        if d["kind"] == "Secret":
            m = {k: base64.b64decode(v).decode() for k, v in d.get("data", {}).items()}
            m.update(d.get("stringData", {}))
            out[d["metadata"]["name"]] = m
    return out


def layout_secret_volume(vol, d, secrets, what, version=1):
    """A secret or projected volume as kubelet lays it out in d: the files in a directory of
    this version, with the volume's mode, ..data a link to it, and a link ..data/PATH for each
    file; a later version swaps ..data in one rename, as kubelet updates a Secret. Every Secret
    and key the volume names must exist."""
    ver = "..v%d" % version
    os.makedirs(os.path.join(d, ver))
    if "secret" in vol:
        srcs, mode = [vol["secret"] | {"name": vol["secret"]["secretName"]}], \
            vol["secret"].get("defaultMode", 0o644)
    else:
        srcs, mode = [x["secret"] for x in vol["projected"]["sources"]], \
            vol["projected"].get("defaultMode", 0o644)
    links = []
    for src in srcs:
        assert src["name"] in secrets, "%s: Secret %s is neither rendered nor provided" % (
            what, src["name"])
        sec = secrets[src["name"]]
        items = src.get("items") or [{"key": k, "path": k} for k in sec]
        for it in items:
            assert it["key"] in sec, "%s: Secret %s has no key %s" % (what, src["name"],
                                                                      it["key"])
            path = os.path.join(d, ver, it["path"])
            with open(path, "w") as f:
                f.write(sec[it["key"]])
            os.chmod(path, mode)
            links.append(it["path"])
    os.symlink(ver, os.path.join(d, "..data_tmp"))
    os.replace(os.path.join(d, "..data_tmp"), os.path.join(d, "..data"))
    for path in links:
        if not os.path.lexists(os.path.join(d, path)):
            os.symlink(os.path.join("..data", path), os.path.join(d, path))


def run_pod_init(docs, spec, init_name, name, provided=None, node="gpu-node-1", check=True):
    """Runs the pod's init container init_name as its pod would: each volume it mounts made in
    a directory of its own (Secret volumes from the rendered Secrets and the provided ones, a
    hostPath or emptyDir empty), its script's paths moved there and the image's under IMAGE,
    NODE_NAME node. As root, as in the pod; otherwise its chown lines are left out. Returns
    ({mountPath: directory}, the finished process); with check, it must succeed and leave the
    files of /run/kprof-secrets to their owner alone."""
    secrets = rendered_secrets(docs)
    secrets.update(provided or {})
    base = os.path.join(WORK, name)
    vols = {v["name"]: v for v in spec["volumes"]}
    init = [c for c in spec["initContainers"] if c["name"] == init_name][0]
    paths = {}
    for m in init["volumeMounts"]:
        d = os.path.join(base, m["name"])
        vol = vols[m["name"]]
        if "secret" in vol or "projected" in vol:
            os.makedirs(d)
            layout_secret_volume(vol, d, secrets, name)
        else:
            os.makedirs(d)
        paths[m["mountPath"]] = d
    s = init["args"][0].replace("/usr/bin/", IMAGE + "/usr/bin/")
    s = s.replace("/usr/lib/", IMAGE + "/usr/lib/")
    for mp in sorted(paths, key=len, reverse=True):
        s = s.replace(mp, paths[mp])
    if os.getuid() != 0:
        s = re.sub(r"(?m)^\s*chown .*$", ":", s)
    p = subprocess.run(["/bin/sh", "-ec", s], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, NODE_NAME=node))
    if check:
        assert p.returncode == 0, "%s: init container %s failed:\n%s" % (name, init_name,
                                                                         p.stderr)
        out = paths["/run/kprof-secrets"]
        for f in os.listdir(out):
            mode = os.stat(os.path.join(out, f)).st_mode
            assert mode & 0o077 == 0, "%s: %s is mode %o" % (name, f, mode & 0o777)
    return paths, p


# ---- the hostPath contract -----------------------------------------------------------------

def check_hostpath_contract(docs):
    ds = by(docs, "DaemonSet", FULL + "-agent")["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in ds["volumes"]}
    assert vols["dist"]["hostPath"]["path"] == DEFAULTS["agent"]["distDir"]
    assert vols["socket"]["hostPath"]["path"] == DEFAULTS["agent"]["socketDir"]
    paths, _ = run_pod_init(docs, ds, "install", "hostpath")
    node = {k: paths["/host/" + k] for k in ("dist", "socket", "spool")}
    sock_mode = os.stat(node["socket"]).st_mode & 0o7777
    assert sock_mode == 0o2750, oct(sock_mode)
    # A training container mounts the node's dist directory at /opt/kprof (README.md); here
    # it runs kprof-run from where the install put it.
    dist = node["dist"]
    p = subprocess.run([os.path.join(dist, "bin", "kprof-run"), "--print-env", "true"],
                       capture_output=True, text=True, timeout=30,
                       env={k: v for k, v in os.environ.items()
                            if not k.startswith(("KPROF_", "CUDA_INJ", "NVTX_INJ"))})
    assert p.returncode == 0, p.stderr
    env = dict(re.findall(r"^export ([A-Z0-9_]+)='?([^'\n]*)'?$", p.stdout, re.M))
    real = os.path.realpath(dist)
    assert env.get("CUDA_INJECTION64_PATH") == real + "/lib/kprof/libkprof_inject.so", p.stdout
    assert env.get("NVTX_INJECTION64_PATH") == env["CUDA_INJECTION64_PATH"], p.stdout
    assert env.get("PYTHONPATH", "").split(":")[0] == real + "/lib/kprof/python", p.stdout
    # kprof-run's default socket is the agent's.
    assert env.get("KPROF_AGENT_SOCKET") == conf(docs, "kprof-agent")["socket"], \
        (p.stdout, conf(docs, "kprof-agent")["socket"])
    # README.md's snippet: the chart's host paths, mounted where it calls kprof-run.
    readme = open(os.path.join(CHART, "README.md")).read()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    job = [yaml.safe_load(b) for b in blocks if "PyTorchJob" in b]
    assert job, "helm/kprof/README.md has no PyTorchJob yaml block"
    tmpl = job[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    hp = {v["name"]: v["hostPath"]["path"] for v in tmpl["volumes"] if "hostPath" in v}
    ctr = tmpl["containers"][0]
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    by_path = {p_: n for n, p_ in hp.items()}
    dist_v = by_path[DEFAULTS["agent"]["distDir"]]
    sock_v = by_path[DEFAULTS["agent"]["socketDir"]]
    assert mounts[dist_v]["mountPath"] == "/opt/kprof" and mounts[dist_v].get("readOnly"), mounts
    assert mounts[sock_v]["mountPath"] == conf(docs, "kprof-agent")["socket"].rsplit("/", 1)[0]
    cmd = " ".join(ctr.get("command", []) + ctr.get("args", []))
    assert "/opt/kprof/bin/kprof-run" in cmd, cmd
    print("hostPath contract: the install lays out %s so that kprof-run finds the library, "
          "the hook and the agent's socket; the README's PyTorchJob mounts it" % dist)


# ---- the daemons, started with what the chart renders ----------------------------------------

# The environment of a container: none of the test suite's KPROF_* settings (KPROF_PLAINTEXT,
# ...), which would override the rendered configuration.
POD_ENV = {k: v for k, v in os.environ.items() if not k.startswith("KPROF_")}


def start(name, argv):
    log = open(os.path.join(WORK, name + ".log"), "w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=POD_ENV), log


def http_ok(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=2) as r:
            return r.status == 200 and r.read().decode()
    except OSError:
        return False


def check_daemons_start(name, values, provided):
    """Starts the daemons with what the chart renders for values, the Secrets it names as
    existing taken from provided ({name: {key: content}})."""
    pg = dict(p.split("=", 1) for p in kpfix.PG.split())
    tag = "%d_%s" % (os.getpid(), name.replace("-", "_"))
    users = {"owner": "kprof_h_owner_" + tag, "collectord": "kprof_h_c_" + tag,
             "analyzer": "kprof_h_a_" + tag}
    db = "it_helm_" + tag
    docs = render_docs(values, sets=["postgresql.users.%s=%s" % kv for kv in users.items()] +
                       ["postgresql.database=" + db])
    secrets = rendered_secrets(docs)
    secrets.update(provided)
    secrets = secrets[FULL + "-pg"]
    specs = {c: by(docs, "Deployment", FULL + "-" + c)["spec"]["template"]["spec"]
             for c in ("collectord", "analyzer")}
    specs["agent"] = by(docs, "DaemonSet", FULL + "-agent")["spec"]["template"]["spec"]
    mounts = {c: run_pod_init(docs, specs[c], "install" if c == "agent" else "secrets",
                              "%s-%s" % (name, c), provided)[0] for c in specs}
    sec = {c: mounts[c]["/run/kprof-secrets"] for c in specs}
    ports = {n: kpfix.free_port() for n in ("cg", "ch", "ag", "ah", "aw", "h")}
    base = os.path.join(WORK, name)
    etc = os.path.join(base, "etc")
    os.makedirs(etc)

    def local(text, comp):
        for mp in sorted(mounts[comp], key=len, reverse=True):
            text = text.replace(mp + "/", mounts[comp][mp] + "/")
        text = text.replace("/etc/kprof/", etc + "/")
        text = text.replace("host=%s-postgresql port=5432" % FULL,
                            "host=%s port=%s" % (pg["host"], pg["port"]))
        for old, new in (("0.0.0.0:7070", ports["cg"]), ("0.0.0.0:7071", ports["ch"]),
                         ("0.0.0.0:7072", ports["ag"]), ("0.0.0.0:7073", ports["ah"]),
                         ("0.0.0.0:7080", ports["aw"]),
                         ("0.0.0.0:7074", ports["h"]),
                         ("%s-collectord.%s.svc:7070" % (FULL, NS), ports["cg"])):
            text = text.replace(old, "127.0.0.1:%d" % new)
        return text

    cm = by(docs, "ConfigMap", FULL + "-config")["data"]
    for k, v in cm.items():
        with open(os.path.join(etc, k), "w") as f:
            f.write(local(v, k.split("-", 1)[1].split(".")[0]))
    # The database as the bundled PostgreSQL's first start leaves it: the owner (its
    # POSTGRES_USER), its database, then the init script's roles and users.
    for u in users.values():
        kpfix.psql("DROP ROLE IF EXISTS %s" % u, db="postgres")
    kpfix.psql("CREATE ROLE %s LOGIN PASSWORD '%s'" % (users["owner"], secrets["owner-password"]),
               db="postgres")
    kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % db, db="postgres")
    kpfix.psql("CREATE DATABASE %s OWNER %s" % (db, users["owner"]), db="postgres")
    procs = []
    try:
        init = by(docs, "ConfigMap", FULL + "-postgresql-init")["data"]["10-kprof-roles.sh"]
        pgsec = os.path.join(base, "pg-secrets")
        os.makedirs(pgsec)
        for k in ("collectord-password", "analyzer-password"):
            with open(os.path.join(pgsec, k), "w") as f:
                f.write(secrets[k])
        init = init.replace("/etc/kprof/pg-secrets", pgsec)
        superuser = pg.get("user", os.environ.get("USER", "kprof"))
        p = subprocess.run(["/bin/sh", "-c", init], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, POSTGRES_USER=superuser, POSTGRES_DB=db,
                                    PGHOST=pg["host"], PGPORT=pg["port"]))
        assert p.returncode == 0, "the bundled PostgreSQL's init script failed:\n" + p.stderr
        # The migrate init container, then the daemons, as the chart runs them.
        mig = [c for c in specs["collectord"]["initContainers"] if c["name"] == "migrate"][0]
        p = subprocess.run([os.path.join(kpfix.BIN, "collectord", "kprof-collectord")] +
                           [local(a, "collectord") for a in mig["args"]], capture_output=True,
                           text=True, timeout=120 * kpfix.SCALE, env=POD_ENV)
        assert p.returncode == 0, "the migrate init container failed:\n" + p.stdout + p.stderr
        assert "migrations applied" in p.stdout, p.stdout
        for comp, rel, hport in (("collectord", "collectord", "ch"),
                                 ("analyzer", "analyzer", "ah")):
            ctr = specs[comp]["containers"][0]
            argv = [os.path.join(kpfix.BIN, rel, os.path.basename(ctr["command"][0]))]
            procs.append(start(name + "-" + comp, argv + [local(a, comp) for a in ctr["args"]]))
            kpfix.wait_for(lambda: http_ok(ports[hport], "/readyz") or
                           procs[-1][0].poll() is not None, 30, comp + " /readyz")
            assert procs[-1][0].poll() is None, comp + " exited:\n" + open(
                os.path.join(WORK, name + "-" + comp + ".log")).read()
            print("%s: %s ready with the chart's configuration, as %s" % (name, comp,
                                                                          users[comp]))
        ctr = specs["agent"]["containers"][0]
        sock = os.path.join(base, "sock")
        os.makedirs(sock)
        spool = os.path.join(base, "spool")
        args = [local(a, "agent").replace("$(NODE_NAME)", "gpu-node-1") for a in ctr["args"]]
        args += ["--socket=" + os.path.join(sock, "agent.sock"), "--spool-dir=" + spool]
        procs.append(start(name + "-agent", [os.path.join(kpfix.BIN, "agent", "kprof-agent")] +
                           args))

        def attached():
            m = http_ok(ports["h"], "/metrics")
            return (m and re.search(r"^kprof_agent_attached 1$", m, re.M)) or \
                procs[-1][0].poll() is not None
        kpfix.wait_for(attached, 30, "the agent attached to collectord")
        assert procs[-1][0].poll() is None, "agent exited:\n" + open(
            os.path.join(WORK, name + "-agent.log")).read()
        assert http_ok(ports["h"], "/readyz") and http_ok(ports["h"], "/healthz")
        print("%s: agent attached over TLS with its %s, --host from the node" % (
            name, "certificate" if "tls-cert" in conf(docs, "kprof-agent") else "token"))
        kprofctl = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
        # The client tokens, as NOTES.txt tells a user to fetch them.
        toks = os.path.join(base, "client")
        os.makedirs(toks)
        for k in ("operator.token", "viewer.token"):
            with open(os.path.join(toks, k), "w") as f:
                f.write(dict(rendered_secrets(docs), **provided)[
                    values.get("auth", {}).get("existingSecret") or FULL + "-auth"][k])
            os.chmod(os.path.join(toks, k), 0o600)

        def ctl(verb, token, *args):
            # As NOTES.txt sets it up (there through port-forwards to the default ports).
            env = dict(POD_ENV, KPROF_COLLECTOR="127.0.0.1:%d" % ports["cg"],
                       KPROF_ANALYZER="127.0.0.1:%d" % ports["ag"],
                       KPROF_TLS_CA=os.path.join(mounts["agent"]["/etc/kprof/secrets-in"],
                                                 "ca.crt"),
                       KPROF_TOKEN_FILE=os.path.join(toks, token))
            return subprocess.run([kprofctl, verb] + list(args), capture_output=True, text=True,
                                  timeout=60, env=env)
        for verb in ("runs", "jobs"):
            p = ctl(verb, "operator.token")
            assert p.returncode == 0, "kprofctl %s: %s" % (verb, p.stderr)
        # The analyzer answers the viewer: no such run (3), not unreachable (5) or refused (1).
        p = ctl("breakdown", "viewer.token", "--run", "999999", "--rank", "0")
        assert p.returncode == 3, "kprofctl breakdown: %d %s" % (p.returncode, p.stderr)
        print("%s: kprofctl reads collectord with the operator token, the analyzer with the "
              "viewer token" % name)
        auth = values.get("auth", {}).get("existingSecret")
        if auth:
            # A new version of the Secret: the daemons take the new operator token and refuse
            # the old one, without a restart.
            new_tok = os.urandom(24).hex()
            old_tok = provided[auth]["operator.token"]
            rotated = dict(provided, **{auth: dict(
                provided[auth], tokens=provided[auth]["tokens"].replace(old_tok, new_tok))})
            for c in ("collectord", "analyzer"):
                vol = [v for v in specs[c]["volumes"] if v["name"] == "secrets-in"][0]
                layout_secret_volume(vol, mounts[c]["/etc/kprof/secrets-in"],
                                     dict(rendered_secrets(docs), **rotated), name, version=2)
            with open(os.path.join(toks, "operator.token"), "w") as f:
                f.write(new_tok)
            kpfix.wait_for(lambda: ctl("runs", "operator.token").returncode == 0, 10,
                           "collectord taking the rotated operator token")
            with open(os.path.join(toks, "operator.token"), "w") as f:
                f.write(old_tok)
            p = ctl("runs", "operator.token")
            assert p.returncode == 7, "the old token: %d %s" % (p.returncode, p.stderr)
            assert all(proc.poll() is None for proc, _ in procs)
            print("%s: a rotated token table reaches the daemons without a restart" % name)
    finally:
        for proc, log in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()
        kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % db, db="postgres")
        for u in users.values():
            kpfix.psql("DROP ROLE IF EXISTS %s" % u, db="postgres")


def main():
    build_renderer()
    make_image()
    check_values_documented()
    check_schema()
    check_refusals()
    check_default_ports()
    for name, v in VARIANTS.items():
        docs = render_docs(v)
        check_models(docs, name)
        check_references(docs, name)
        check_security(docs, name)
        check_ports(docs, name, merged(v))
        kinds = sorted({d["kind"] for d in docs})
        if name == "default":
            check_generated_cert(docs)
            check_hostpath_contract(docs)
            assert "StatefulSet" in kinds and "ServiceMonitor" not in kinds, kinds
            # The postgres entrypoint executes an executable init script; one it would source
            # instead runs inside its shell, under the script's set -eu.
            pg = by(docs, "StatefulSet", FULL + "-postgresql")["spec"]["template"]["spec"]
            init = [v for v in pg["volumes"] if v["name"] == "init"][0]["configMap"]
            assert init.get("defaultMode", 0o644) & 0o111 == 0o111, init
        if name == "external":
            assert "StatefulSet" not in kinds and not [d for d in docs if d["kind"] == "Secret"]
            c = conf(docs, "kprof-collectord")["pg-conninfo"]
            assert "host=pg.db.svc" in c and "sslmode=verify-full" in c and \
                "sslrootcert=" in c and "password" not in c, c
        if name == "monitoring":
            assert "ServiceMonitor" in kinds, kinds
            dash = [d for d in docs if d["kind"] == "ConfigMap" and
                    d["metadata"]["name"].endswith("-dashboard")][0]
            assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
            assert dash["metadata"]["namespace"] == "monitoring"
            src = open(os.path.join(SRC, "deploy", "grafana", "kprof-dashboard.json")).read()
            assert json.loads(dash["data"]["kprof-dashboard.json"]) == json.loads(src), \
                "helm/kprof/dashboards/kprof-dashboard.json differs from deploy/grafana's: copy it"
            ds = by(docs, "DaemonSet", FULL + "-agent")["spec"]["template"]["spec"]
            assert ds["containers"][0]["resources"] == v["agent"]["resources"]
        if name == "mtls":
            for comp in ("kprof-collectord", "kprof-analyzer"):
                assert "tls-client-ca" in conf(docs, comp), comp
            a = conf(docs, "kprof-agent")
            assert "tls-cert" in a and "token-file" not in a, a
    p = render(notes=True)
    assert p.returncode == 0 and "kprof-run" in p.stdout and "WARNING" in p.stdout, p.stderr
    assert "export KPROF_TLS_CA=" in p.stdout and "KPROF_TOKEN_FILE=" in p.stdout, p.stdout
    check_daemons_start("start-default", {}, {})
    # One token per node, from existing Secrets.
    tok = {k: os.urandom(24).hex() for k in ("op", "view", "n1", "n2")}
    per_node = {
        "kprof-auth": {"tokens": "operator admin %(op)s\nviewer v %(view)s\n"
                                 "agent gpu-node-1 %(n1)s\nagent gpu-node-2 %(n2)s\n" % tok,
                       "operator.token": tok["op"], "viewer.token": tok["view"]},
        "kprof-agent-tokens": {"gpu-node-1.token": tok["n1"], "gpu-node-2.token": tok["n2"]}}
    pv = {"auth": {"existingSecret": "kprof-auth"},
          "agent": {"credentials": {"perNodeSecret": "kprof-agent-tokens"}}}
    check_daemons_start("start-pernode", pv, per_node)
    docs = render_docs(pv)
    ds = by(docs, "DaemonSet", FULL + "-agent")["spec"]["template"]["spec"]
    _, p = run_pod_init(docs, ds, "install", "pernode-missing", per_node, node="gpu-node-9",
                        check=False)
    assert p.returncode != 0 and "kprof-agent-tokens has no key gpu-node-9.token" in p.stderr, \
        p.stderr
    print("a node without its key in agent.credentials.perNodeSecret: the agent's init says so")
    # Mutual TLS: the daemons' certificate and the agents' from existing Secrets.
    pki = kpfix.make_pki(os.path.join(WORK, "pki"))
    acrt, akey = pki.client("agent", "gpu-node-1")
    rd = lambda f: open(f).read()  # noqa: E731
    mtls = {"kprof-tls": {"ca.crt": rd(pki.ca), "tls.crt": rd(pki.server),
                          "tls.key": rd(pki.server_key)},
            "kprof-agent-certs": {"gpu-node-1.crt": rd(acrt), "gpu-node-1.key": rd(akey)}}
    check_daemons_start("start-mtls", {"tls": {"existingSecret": "kprof-tls", "clientCA": True},
                                       "agent": {"credentials": {
                                           "mode": "certificate",
                                           "perNodeSecret": "kprof-agent-certs"}}}, mtls)
    shutil.rmtree(WORK, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
