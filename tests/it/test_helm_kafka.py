"""The helm chart's Kafka values (helm/kprof: kafka.*, sink.*, collectord.replicas), without helm:
  1. kafka off (the default, and with kafka.brokers set but kafka.enabled false): the render is
     the chart's without Kafka: collectord a Deployment, no sink, no headless Service, no Kafka
     setting in the ConfigMap or the pods' environment;
  2. kafka on, with a CA Secret, a client certificate Secret, a SASL Secret and properties:
     collectord is a StatefulSet of collectord.replicas behind a headless Service, each pod
     advertising POD.SERVICE.NAMESPACE.svc:PORT (downward API); the sink Deployment has
     sink.replicas and its own configuration (role sink, the group, the brokers, the topic);
     librdkafka's properties name the mounted files and refer to SASL's user and password in
     the environment, which come from the Secret (secretKeyRef): no password in the ConfigMap
     or the pod spec; the generated certificate names the replicas; the ServiceMonitor
     scrapes the sinks; every object matches its Kubernetes model;
  3. kprof-collectord takes the rendered configurations (collectord's and the sink's, with
     the environment as the pod would have it): --print-config shows the Kafka settings;
  4. refusals: kafka.enabled without brokers, a secret in kafka.properties, a property value
     with ',' (render errors with a message), and values.schema.json rejects them too.
Skips (77) when go, sprig or python3-kubernetes is missing (CI installs them)."""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile

import kpfix

SRC = os.environ.get("KPROF_SOURCE_DIR") or os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(SRC, "helm", "kprof")
COLLECTORD = os.path.join(kpfix.BIN, "collectord", "kprof-collectord")
NS = "ml"
FULL = "kp-kprof"


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


try:
    import jsonschema
    import kubernetes.client
    import yaml
except ImportError as e:
    skip("%s (deploy/local/install-deps.sh installs python3-kubernetes and python3-jsonschema)"
         % e)
GO = shutil.which("go")
if GO is None or not os.path.isdir("/usr/share/gocode/src/github.com/Masterminds/sprig"):
    skip("go or Debian's sprig is missing (deploy/local/install-deps.sh installs them)")

kpfix.require_env()
WORK = tempfile.mkdtemp(prefix="helm-kafka.", dir=kpfix.TEST_DIR)
RENDER = os.path.join(WORK, "render")
SCHEMA = json.load(open(os.path.join(CHART, "values.schema.json")))
DEFAULTS = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))
MODELS = {"Deployment": "V1Deployment", "DaemonSet": "V1DaemonSet",
          "StatefulSet": "V1StatefulSet", "Service": "V1Service", "ConfigMap": "V1ConfigMap",
          "Secret": "V1Secret"}
SASL_PASSWORD = "sasl-password-in-a-secret"
KAFKA = {"kafka": {"enabled": True, "brokers": "k0.kafka:9093,k1.kafka:9093",
                   "topic": "kprof.batches.prod",
                   "properties": {"sasl.mechanisms": "SCRAM-SHA-512",
                                  "message.timeout.ms": 600000},
                   "tls": {"caSecret": "kafka-ca", "clientSecret": "kafka-client"},
                   "sasl": {"existingSecret": "kafka-sasl"}},
         "collectord": {"replicas": 3}, "sink": {"replicas": 4, "group": "kprof-prod"},
         "serviceMonitor": {"enabled": True}}


def build_renderer():
    env = dict(os.environ, GOPATH="/usr/share/gocode", GO111MODULE="off", GOFLAGS="",
               GOPROXY="off", GOCACHE=os.path.join(kpfix.TEST_DIR, "helm-gocache"))
    p = subprocess.run([GO, "build", "-o", RENDER, "."], cwd=os.path.join(SRC, "tests", "helm",
                       "render"), env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, "go build of the renderer failed:\n" + p.stderr


def render(values, notes=False):
    path = os.path.join(WORK, "values-%d.yaml" % len(os.listdir(WORK)))
    with open(path, "w") as f:
        yaml.safe_dump(values, f)
    return subprocess.run([RENDER, "-chart", CHART, "-name", "kp", "-namespace", NS, "-f", path,
                           "-api", "monitoring.coreos.com/v1"] + (["-notes"] if notes else []),
                          capture_output=True, text=True, timeout=60)


def docs_of(values):
    p = render(values)
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
    return merge(json.loads(json.dumps(DEFAULTS)), values)


def by(docs, kind, name):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    raise AssertionError("no %s %s in the render: %s" % (
        kind, name, [(d["kind"], d["metadata"]["name"]) for d in docs]))


def conf(text):
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


class _Resp:
    def __init__(self, obj):
        self.data = json.dumps(obj)


def strip_empty(v):
    if isinstance(v, dict):
        return {k: strip_empty(x) for k, x in v.items() if x is not None and x != []}
    if isinstance(v, list):
        return [strip_empty(x) for x in v]
    return v


def check_models(docs):
    api = kubernetes.client.ApiClient()
    for d in docs:
        if d["kind"] == "ServiceMonitor":
            continue
        obj = api.deserialize(_Resp(d), MODELS[d["kind"]])
        a = strip_empty(json.loads(json.dumps(d)))
        b = strip_empty(api.sanitize_for_serialization(obj))
        assert a == b, "%s %s does not survive its model" % (d["kind"], d["metadata"]["name"])


def without_secrets(docs):
    return [d for d in docs if d["kind"] != "Secret"]


def case_off():
    base = docs_of({})
    names = {(d["kind"], d["metadata"]["name"]) for d in base}
    assert ("Deployment", FULL + "-collectord") in names, names
    for kind, name in (("Deployment", FULL + "-sink"), ("Service", FULL + "-collectord-pods"),
                       ("StatefulSet", FULL + "-collectord")):
        assert (kind, name) not in names, (kind, name)
    cm = by(base, "ConfigMap", FULL + "-config")["data"]
    assert "kprof-sink.conf" not in cm, cm.keys()
    assert not [k for k in conf(cm["kprof-collectord.conf"]) if k.startswith("kafka") or k == "sink"]
    for d in base:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            for c in d["spec"]["template"]["spec"]["containers"]:
                assert not [e for e in env_of(c) if "KAFKA" in e or "ADVERTISE" in e], c
    # Kafka values without kafka.enabled change nothing (Secrets are generated anew each time).
    off = docs_of({"kafka": dict(KAFKA["kafka"], enabled=False), "sink": KAFKA["sink"]})
    assert without_secrets(off) == without_secrets(base), "kafka.enabled false changed the render"
    n = render({}, notes=True)
    assert n.returncode == 0 and "collectord" in n.stdout and "Kafka" not in n.stdout, n
    print("kafka off: %d objects, no Kafka in them" % len(base))


def case_on():
    docs = docs_of(KAFKA)
    check_models(docs)
    pods = FULL + "-collectord-pods"
    sts = by(docs, "StatefulSet", FULL + "-collectord")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["serviceName"] == pods, sts["spec"]
    hs = by(docs, "Service", pods)
    assert hs["spec"]["clusterIP"] == "None", hs["spec"]
    assert hs["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"], hs["spec"]
    # The headless Service is not a second scrape target of the same pods.
    assert hs["metadata"]["labels"]["app.kubernetes.io/component"] != "collectord"
    cd = sts["spec"]["template"]["spec"]["containers"][0]
    env = env_of(cd)
    assert env["KPROF_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", env
    assert env["KPROF_ADVERTISE_ADDRESS"]["value"] == "$(KPROF_POD_NAME).%s.%s.svc:7070" % (
        pods, NS), env
    names = [e["name"] for e in cd["env"]]
    assert names.index("KPROF_POD_NAME") < names.index("KPROF_ADVERTISE_ADDRESS"), names

    sink = by(docs, "Deployment", FULL + "-sink")
    assert sink["spec"]["replicas"] == 4, sink["spec"]
    sc = sink["spec"]["template"]["spec"]["containers"][0]
    assert sc["args"] == ["--config=/etc/kprof/kprof-sink.conf"], sc["args"]
    by(docs, "Service", FULL + "-sink")
    sm = [d for d in docs if d["kind"] == "ServiceMonitor"][0]
    comps = sm["spec"]["selector"]["matchExpressions"][0]["values"]
    assert "sink" in comps and "collectord-pods" not in comps, comps

    cm = by(docs, "ConfigMap", FULL + "-config")["data"]
    c = conf(cm["kprof-collectord.conf"])
    assert c["sink"] == "kafka" and c["kafka-brokers"] == KAFKA["kafka"]["brokers"], c
    assert c["kafka-topic"] == "kprof.batches.prod", c
    s = conf(cm["kprof-sink.conf"])
    assert s["role"] == "sink" and s["kafka-group"] == "kprof-prod", s
    assert s["kafka-brokers"] == KAFKA["kafka"]["brokers"] and "sink" not in s, s
    assert s["http-listen"].endswith(":%d" % sc["ports"][0]["containerPort"]), (s, sc["ports"])
    assert "kafka-property" not in c and "kafka-property" not in s, (c, s)

    for name, ct in (("collectord", cd), ("sink", sc)):
        e = env_of(ct)
        props = e["KPROF_KAFKA_PROPERTY"]["value"].split(",")
        for want in ("sasl.mechanisms=SCRAM-SHA-512", "message.timeout.ms=600000",
                     "security.protocol=SASL_SSL", "ssl.ca.location=/etc/kprof/kafka-ca/ca.crt",
                     "ssl.certificate.location=/etc/kprof/kafka-client/tls.crt",
                     "ssl.key.location=/etc/kprof/kafka-client/tls.key",
                     "sasl.username=$(KAFKA_SASL_USERNAME)",
                     "sasl.password=$(KAFKA_SASL_PASSWORD)"):
            assert want in props, (name, want, props)
        for var, key in (("KAFKA_SASL_USERNAME", "username"), ("KAFKA_SASL_PASSWORD", "password")):
            ref = e[var]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "kafka-sasl", "key": key}, (name, ref)
        names = [x["name"] for x in ct["env"]]
        assert names.index("KAFKA_SASL_PASSWORD") < names.index("KPROF_KAFKA_PROPERTY"), names
        pod = sts if name == "collectord" else sink
        vols = {v["name"]: v for v in pod["spec"]["template"]["spec"]["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in ct["volumeMounts"]}
        assert vols["kafka-ca"]["secret"]["secretName"] == "kafka-ca", vols
        assert vols["kafka-client"]["secret"]["secretName"] == "kafka-client", vols
        assert mounts["kafka-ca"] == "/etc/kprof/kafka-ca", mounts
        assert mounts["kafka-client"] == "/etc/kprof/kafka-client", mounts

    # No secret in the ConfigMaps or the workloads' specs (the SASL password lives only in
    # the user's Secret; the generated ones are the chart's own).
    for d in docs:
        if d["kind"] != "Secret":
            assert SASL_PASSWORD not in json.dumps(d)
            assert "sasl.password=" not in json.dumps(d).replace(
                "sasl.password=$(KAFKA_SASL_PASSWORD)", ""), d["metadata"]["name"]

    # The generated certificate names every replica.
    tls = by(docs, "Secret", FULL + "-tls")
    pem = base64.b64decode(tls["data"]["tls.crt"])
    p = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"], input=pem,
                       capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    san = {x.strip() for x in p.stdout.decode().splitlines()[-1].split(",")}
    for want in ("DNS:*.%s.%s.svc" % (pods, NS), "DNS:*.%s.%s.svc.cluster.local" % (pods, NS),
                 "DNS:%s-collectord.%s.svc" % (FULL, NS)):
        assert want in san, (want, san)

    notes = render(KAFKA, notes=True).stdout
    assert "Kafka       %s topic kprof.batches.prod" % KAFKA["kafka"]["brokers"] in notes, notes
    assert "POD.%s.%s.svc" % (pods, NS) in notes, notes

    # The daemon takes what the chart renders, with the environment the pod would have.
    penv = dict((k, v) for k, v in os.environ.items() if not k.startswith("KPROF_"))
    penv["KPROF_KAFKA_PROPERTY"] = env_of(sc)["KPROF_KAFKA_PROPERTY"]["value"].replace(
        "$(KAFKA_SASL_USERNAME)", "kprof").replace("$(KAFKA_SASL_PASSWORD)", SASL_PASSWORD)
    for key, want in (("kprof-collectord.conf", "sink = kafka"), ("kprof-sink.conf", "role = sink")):
        path = os.path.join(WORK, key)
        with open(path, "w") as f:
            f.write(cm[key])
        q = subprocess.run([COLLECTORD, "--config=" + path, "--print-config"], env=penv,
                           capture_output=True, text=True, timeout=30)
        assert q.returncode == 0, (key, q.stderr)
        assert want in q.stdout and "kafka-property = ***" in q.stdout, q.stdout
        assert SASL_PASSWORD not in q.stdout + q.stderr
    print("kafka on: collectord StatefulSet of 3 behind %s, 4 sinks, properties and secrets "
          "as files and references" % pods)


def case_refusals():
    v = jsonschema.Draft7Validator(SCHEMA)
    assert not list(v.iter_errors(merged(KAFKA))), list(v.iter_errors(merged(KAFKA)))
    bad = [({"kafka": {"enabled": True}}, "kafka.brokers is required"),
           ({"kafka": {"enabled": True, "brokers": "k:9092",
                       "properties": {"sasl.password": "x"}}}, "kafka.sasl.existingSecret"),
           ({"kafka": {"enabled": True, "brokers": "k:9092",
                       "properties": {"sasl.jaas.config": "a,b"}}}, "may not hold ','")]
    for values, msg in bad:
        p = render(values)
        assert p.returncode != 0 and msg in p.stderr, (values, p.returncode, p.stderr)
        assert list(v.iter_errors(merged(values))), "the schema takes %s" % values
    assert list(v.iter_errors(merged({"kafka": {"brokers": "no-port"}})))
    assert list(v.iter_errors(merged({"sink": {"replicas": -1}})))
    print("refusals: %d values refused by the render and the schema" % len(bad))


def main():
    try:
        build_renderer()
        case_off()
        case_on()
        case_refusals()
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
