"""kprof's OCI image (deploy/image/build.sh) serves: built from the kprof .debs on a clean
Debian 12, unpacked with umoci, and its daemons started from its root filesystem.

Builds the image (or reuses it: the build stamps the .debs' contents), checks the configuration
it declares (a non-root User by uid, CMD kprof-collectord and no ENTRYPOINT, ports 7070-7073,
the OCI labels), unpacks it with umoci into a bundle and, from that root filesystem, as the
image's User with its Env (the runtime configuration umoci writes) and its own /etc/kprof
configuration (the packages'; TLS files, token table and database passwords put at the paths it
names, the rest from KPROF_ variables): `kprof-collectord --migrate` as the database's owner,
then kprof-collectord as a kprof_writer login and kprof-analyzer as a kprof_reader login (TLS
and a token table, nothing plaintext or anonymous: the daemons' defaults) against the test
PostgreSQL, and a kprof-agent with an agent token. The analyzer, given KPROF_WEB_LISTEN only,
serves the package's web UI (its default --web-root) over TLS. kprofctl from the image then
imports a real trace (tests/data/peers) with the operator token and reads its step breakdown,
which must hold every step of the trace. Each daemon must run as the image's user
(/proc/PID/status). Without podman that runs here (its runtime cannot set its rlimits in this
machine's container), each process is chroot into the root filesystem in a mount namespace of
its own (unshare), where the PostgreSQL socket directory and /proc are mounted: nothing is
mounted on the host, and the mounts go with the process. Needs root, mmdebstrap, umoci and the
.debs (the build's target debs, or a directory in KPROF_IMAGE_DEBS); exits 77 (skipped) without root or the
tools. Stops every process by pid and removes the bundle.
"""
import glob
import gzip
import json
import os
import secrets
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kpfix  # noqa: E402

SRC = os.environ.get("KPROF_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD_SH = os.path.join(SRC, "deploy", "image", "build.sh")
TRACE = os.path.join(SRC, "tests", "data", "peers", "hta", "trace_filter_2rank",
                     "sampled_rank-0.json.gz")
DB = "kp_it_image"
# Login users of this test, as docs/postgres-roles.md sets them up (cluster-wide: dropped at the
# start and the end): the owner runs --migrate, collectord logs in as a kprof_writer, the
# analyzer as a kprof_reader, each with its password (scram-sha-256 on the test cluster).
USERS = {"owner": "kprof_i_owner", "writer": "kprof_i_writer", "reader": "kprof_i_reader"}
NODE = "image-node"


def drop_users():
    kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
    for u in USERS.values():
        kpfix.psql("DROP ROLE IF EXISTS %s" % u, db="postgres")


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def debs_dir():
    """The directory of the kprof .debs: KPROF_IMAGE_DEBS, else the build tree's packages/,
    made from the binaries as they are (the build's "debs" target: cpack)."""
    d = os.environ.get("KPROF_IMAGE_DEBS")
    if d:
        return d
    p = subprocess.run(["cmake", "--build", kpfix.BIN, "--target", "debs"], capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert p.returncode == 0, "cmake --build --target debs failed:\n%s\n%s" % (p.stdout,
                                                                               p.stderr)
    return os.path.join(kpfix.BIN, "packages")


def blob(layout, digest):
    algo, hexd = digest.split(":", 1)
    with open(os.path.join(layout, "blobs", algo, hexd)) as f:
        return json.load(f)


def image_config(layout, tag):
    """The OCI image configuration of layout:tag, read as a runtime reads it."""
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    refs = [m for m in index["manifests"]
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
    assert len(refs) == 1, "%s has no single tag %s: %s" % (layout, tag, index)
    manifest = blob(layout, refs[0]["digest"])
    assert len(manifest["layers"]) >= 1, manifest
    return blob(layout, manifest["config"]["digest"])


def trace_steps(path):
    with gzip.open(path, "rt") as f:
        tr = json.load(f)
    events = tr["traceEvents"] if isinstance(tr, dict) else tr
    return {e["name"][len("ProfilerStep#"):] for e in events
            if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")}


class Image:
    """The unpacked bundle: its root filesystem and the process the runtime config declares."""

    def __init__(self, bundle, pg_dir, pg_gid):
        self.root = os.path.join(bundle, "rootfs")
        with open(os.path.join(bundle, "config.json")) as f:
            self.spec = json.load(f)
        proc = self.spec["process"]
        self.uid, self.gid = proc["user"]["uid"], proc["user"]["gid"]
        self.env = proc.get("env", [])
        self.cwd = proc.get("cwd", "/")
        self.args = proc["args"]
        self.pg_dir = pg_dir
        # The group of the PostgreSQL socket (mode 0770): the test's stand-in for a network
        # path to the database, added to the image user's groups.
        self.groups = [self.gid] + ([pg_gid] if pg_gid is not None else [])

    def path(self, inside):
        return os.path.join(self.root, inside.lstrip("/"))

    def put(self, src, inside, mode=0o600):
        """Copies a host file into the root filesystem, owned by the image's user."""
        dst = self.path(inside)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        os.chown(dst, self.uid, self.gid)
        os.chmod(dst, mode)
        return inside

    def conf(self, daemon):
        """The image's /etc/kprof/DAEMON.conf as a dict ("key = value" lines)."""
        out = {}
        with open(self.path("/etc/kprof/%s.conf" % daemon)) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    k, v = line.split("=", 1)
                    out[k.strip()] = v.strip()
        return out

    def argv(self, args, env=()):
        """The host command that runs args in the image as its user, with its Env (plus env) and
        working directory: unshare a mount namespace, mount /proc and the PostgreSQL socket
        directory into the root filesystem, chroot. unshare, sh, chroot and env exec one
        another, so the pid returned is the program's."""
        mounts = ["mount -t proc proc %s" % shlex.quote(self.path("/proc"))]
        if self.pg_dir:
            mounts.append("mount --bind %s %s" % (shlex.quote(self.pg_dir),
                                                 shlex.quote(self.path(self.pg_dir))))
        script = " && ".join(mounts) + ' && exec chroot --userspec=%d:%d --groups=%s %s ' \
            '/usr/bin/env -i -C %s "$@"' % (self.uid, self.gid,
                                            ",".join(str(g) for g in self.groups),
                                            shlex.quote(self.root), shlex.quote(self.cwd))
        return ["unshare", "--mount", "--propagation", "private", "sh", "-ec", script, "sh"] + \
            list(self.env) + list(env) + list(args)

    def run(self, args, env=(), timeout=120):
        return subprocess.run(self.argv(args, env), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout * kpfix.SCALE)

    def start(self, args, log, env=()):
        return subprocess.Popen(self.argv(args, env), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def ids(pid):
    """(real uid, effective uid, real gid) of a live process."""
    with open("/proc/%d/status" % pid) as f:
        st = dict(l.split(":", 1) for l in f if ":" in l)
    u, g = st["Uid"].split(), st["Gid"].split()
    return int(u[0]), int(u[1]), int(g[0])


def ready(img, name):
    """The ready file's fields (grpc=..., http=...) once the daemon wrote it."""
    path = img.path("/run/kprof/%s.ready" % name)
    if not os.path.exists(path):
        return None
    fields = dict(l.strip().split("=", 1) for l in open(path) if "=" in l)
    return fields if fields.get("grpc") else None


def stop(procs):
    for name, p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for name, p in procs:
        try:
            p.wait(timeout=20 * kpfix.SCALE)
        except subprocess.TimeoutExpired:
            print("%s (pid %d) did not stop in 20 s; killing it" % (name, p.pid))
            p.kill()
            p.wait()


def main():
    kpfix.require_env()
    if os.geteuid() != 0:
        skip("needs root (mmdebstrap's root mode, chroot and mounts)")
    for tool in ("mmdebstrap", "umoci", "unshare", "chroot", "openssl", "dpkg-deb"):
        if not shutil.which(tool):
            skip("%s is not installed (deploy/local/install-deps.sh)" % tool)

    debs = debs_dir()
    out = os.path.join(kpfix.BIN, "image")
    t0 = time.monotonic()
    p = subprocess.run([BUILD_SH, "--debs", debs, "--out", out], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=900)
    assert p.returncode == 0, "build.sh exited %d:\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    print(p.stdout.strip())
    print("image built or reused in %.1f s" % (time.monotonic() - t0))
    layout = os.path.join(out, "kprof-oci")
    assert os.path.isfile(os.path.join(out, "kprof-oci.tar")), "no oci-archive beside the layout"

    # What the image declares (every daemon from one image; the command picks it).
    cfg = image_config(layout, "latest")
    c = cfg["config"]
    version = subprocess.run(["dpkg-deb", "-f", glob.glob(os.path.join(
        debs, "kprof-collectord_*.deb"))[0], "Version"], capture_output=True, text=True,
        check=True).stdout.strip()
    uid, gid = (int(x) for x in c["User"].split(":"))
    assert uid != 0 and gid != 0, "the image's default user is root: %s" % c["User"]
    assert c.get("Cmd") == ["kprof-collectord"], c.get("Cmd")
    assert not c.get("Entrypoint"), "an ENTRYPOINT would stand before every command: %s" % c
    assert set(c.get("ExposedPorts", {})) == {"%d/tcp" % p for p in range(7070, 7074)}, c
    labels = c.get("Labels", {})
    assert labels.get("org.opencontainers.image.version") == version, labels
    assert labels.get("org.opencontainers.image.title") == "kprof", labels
    assert cfg["os"] == "linux" and cfg["architecture"], cfg
    assert any(e.startswith("PATH=") for e in c.get("Env", [])), c

    tmp = tempfile.mkdtemp(prefix="kprof-image-", dir=kpfix.TEST_DIR)
    procs, logs = [], {}
    try:
        bundle = os.path.join(tmp, "bundle")
        t0 = time.monotonic()
        subprocess.run(["umoci", "unpack", "--image", layout + ":latest", bundle], check=True,
                       capture_output=True, stdin=subprocess.DEVNULL)
        print("unpacked in %.1f s" % (time.monotonic() - t0))

        # The test PostgreSQL: a unix socket directory (bind-mounted at the same path) or TCP
        # on loopback (the namespaces share the network).
        kv = dict(x.split("=", 1) for x in kpfix.PG.split() if "=" in x)
        host = kv.get("host", "")
        pg_gid = None
        if host.startswith("/"):
            pg_gid = os.stat(os.path.join(host, ".s.PGSQL.%s" % kv.get("port", "5432"))).st_gid
        img = Image(bundle, host if host.startswith("/") else None, pg_gid)
        pw = {who: secrets.token_hex(16) for who in USERS}
        drop_users()
        kpfix.psql("CREATE ROLE %s LOGIN CREATEROLE PASSWORD '%s'" % (USERS["owner"],
                                                                      pw["owner"]), db="postgres")
        kpfix.psql("CREATE DATABASE %s OWNER %s" % (DB, USERS["owner"]), db="postgres")
        assert (img.uid, img.gid) == (uid, gid), (img.spec["process"]["user"], c["User"])
        assert img.args == ["kprof-collectord"], img.args
        for inside in ("/proc",) + ((img.pg_dir,) if img.pg_dir else ()):
            os.makedirs(img.path(inside), exist_ok=True)
        # The packages are installed (dpkg's database in the image), apt left no lists or
        # downloaded packages behind.
        q = subprocess.run(["dpkg-query", "--admindir", img.path("/var/lib/dpkg"), "-W",
                            "-f", "${Package} ${Version} ${db:Status-Abbrev}\n",
                            "kprof-collectord", "kprof-analyzer", "kprof-agent", "kprofctl"],
                           capture_output=True, text=True)
        rows = sorted(l.split() for l in q.stdout.splitlines())
        assert q.returncode == 0 and len(rows) == 4 and all(
            r[1] == version and r[2] == "ii" for r in rows), (q.stdout, q.stderr)
        left = [os.path.join(d, f) for sub in ("/var/lib/apt/lists", "/var/cache/apt")
                for d, _, fs in os.walk(img.path(sub)) for f in fs if f != "lock"]
        assert not left, "apt left files in the image: %s" % left[:10]
        for name, entry in (("passwd", uid), ("group", gid)):
            with open(img.path("/etc/" + name)) as f:
                owners = [l.split(":") for l in f]
            assert [o for o in owners if o[0] == "kprof" and int(o[2]) == entry], \
                "the image's User %s is not kprof in its /etc/%s" % (c["User"], name)

        # TLS material and tokens, made on the host and put where the image's own configuration
        # (the packages' /etc/kprof/<daemon>.conf) expects them, as a deployment mounts its
        # Secrets, owned by the image's user. The environment sets what a deployment sets:
        # addresses (port 0 here), the database, the agent's collector and node.
        pki = kpfix.make_pki(os.path.join(tmp, "pki"))
        toks = {r: subprocess.run(["openssl", "rand", "-hex", "24"], capture_output=True,
                                  text=True, check=True).stdout.strip()
                for r in ("agent", "operator")}
        table = kpfix.write_tokens(os.path.join(tmp, "tokens"), [
            "agent %s %s" % (NODE, toks["agent"]), "operator operator %s" % toks["operator"]])
        for role in toks:
            with open(os.path.join(tmp, role + ".token"), "w") as f:
                f.write(toks[role] + "\n")
        conf = {d: img.conf(d) for d in ("kprof-collectord", "kprof-analyzer", "kprof-agent")}
        for d in ("kprof-collectord", "kprof-analyzer"):
            for key, src in (("tls-cert", pki.server), ("tls-key", pki.server_key),
                             ("auth-tokens", table)):
                assert conf[d].get(key), "the image's %s.conf sets no %s" % (d, key)
                img.put(src, conf[d][key])
        for key, src in (("tls-ca", pki.ca), ("token-file", os.path.join(tmp, "agent.token"))):
            assert conf["kprof-agent"].get(key), "the image's kprof-agent.conf sets no " + key
            img.put(src, conf["kprof-agent"][key])
        ca = img.put(pki.ca, "/var/lib/kprof/user/ca.pem")
        operator = img.put(os.path.join(tmp, "operator.token"), "/var/lib/kprof/user/token")
        trace_in = img.put(TRACE, "/var/lib/kprof/user/" + os.path.basename(TRACE), 0o644)
        # The passwords where the image's configuration reads them (pg-password-file); the
        # owner's only for --migrate.
        for who in USERS:
            with open(os.path.join(tmp, who + ".password"), "w") as f:
                f.write(pw[who] + "\n")
        pwfile = {"owner": img.put(os.path.join(tmp, "owner.password"),
                                   "/var/lib/kprof/user/owner.password")}
        for who, d in (("writer", "kprof-collectord"), ("reader", "kprof-analyzer")):
            assert conf[d].get("pg-password-file"), "the image's %s.conf sets no " \
                "pg-password-file" % d
            pwfile[who] = img.put(os.path.join(tmp, who + ".password"),
                                  conf[d]["pg-password-file"])

        def db(who):
            return ["KPROF_PG_CONNINFO=%s user=%s dbname=%s" % (
                " ".join("%s=%s" % x for x in kv.items() if x[0] not in ("user", "dbname")),
                USERS[who], DB), "KPROF_PG_PASSWORD_FILE=" + pwfile[who]]

        def serve(name, who):
            return db(who) + ["KPROF_LISTEN=127.0.0.1:0", "KPROF_HTTP_LISTEN=127.0.0.1:0",
                              "KPROF_READY_FILE=/run/kprof/%s.ready" % name]

        # The schema, by kprof-collectord --migrate from the image as the database's owner;
        # then the daemons' login users.
        q = img.run(["kprof-collectord", "--migrate"], db("owner"))
        assert q.returncode == 0, "kprof-collectord --migrate exited %d: %s" % (q.returncode,
                                                                              q.stderr)
        for who, group in (("writer", "kprof_writer"), ("reader", "kprof_reader")):
            kpfix.psql("CREATE ROLE %s LOGIN PASSWORD '%s' IN ROLE %s" % (USERS[who], pw[who],
                                                                           group), db="postgres")

        def launch(name, args, env):
            logs[name] = os.path.join(tmp, name + ".log")
            p = img.start(args, open(logs[name], "w"), env)
            procs.append((name, p))
            return p

        def wait_ready(name, p):
            def check():
                assert p.poll() is None, "%s exited %s:\n%s" % (name, p.returncode,
                                                               open(logs[name]).read())
                return ready(img, name)
            return kpfix.wait_for(check, 60, "%s to be ready:\n%s" % (
                name, open(logs[name]).read()))

        # collectord is the image's default command; the analyzer and the agent are its
        # documented overrides (the command names the daemon).
        cd = launch("collectord", img.args, serve("collectord", "writer"))
        cd_ready = wait_ready("collectord", cd)
        cd_addr = cd_ready["grpc"]
        an = launch("analyzer", ["kprof-analyzer"],
                    serve("analyzer", "reader") + ["KPROF_WEB_LISTEN=127.0.0.1:0"])
        an_ready = wait_ready("analyzer", an)
        an_addr = an_ready["grpc"]
        # The probes a deployment points at the daemons' HTTP port.
        for name, r in (("collectord", cd_ready), ("analyzer", an_ready)):
            for path in ("/healthz", "/readyz"):
                with urllib.request.urlopen("http://%s%s" % (r["http"], path),
                                            timeout=10 * kpfix.SCALE) as resp:
                    assert resp.status == 200, (name, path, resp.status)
        # The web UI: the package's pages (the analyzer's default --web-root) over its TLS.
        tls = ssl.create_default_context(cafile=pki.ca)
        with urllib.request.urlopen("https://localhost:%s/" % an_ready["web"].rsplit(":", 1)[1],
                                    context=tls, timeout=10 * kpfix.SCALE) as resp:
            assert resp.status == 200, resp.status
            assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"], \
                dict(resp.headers)
            with open(img.path("/usr/share/kprof/web/index.html"), "rb") as f:
                assert resp.read() == f.read(), "/ is not the package's index.html"
        assert "serving the web UI root=/usr/share/kprof/web " in open(logs["analyzer"]).read()
        ag = launch("agent", ["kprof-agent"], [
            "KPROF_COLLECTOR=" + cd_addr, "KPROF_HOST=" + NODE,
            "KPROF_READY_FILE=/run/kprof/agent.ready"])
        kpfix.wait_for(lambda: ag.poll() is None and os.path.exists(
            img.path("/run/kprof/agent.ready")), 60, "the agent to be ready:\n" +
            open(logs["agent"]).read())
        kpfix.wait_for(lambda: "agent attached host=%s " % NODE in open(logs["collectord"]).read(),
                       30, "the agent to attach:\n" + open(logs["collectord"]).read())
        # The agent's socket (its default path, in the image's /run/kprof).
        assert os.path.exists(img.path("/run/kprof/agent.sock")), "the agent made no socket"

        # Every daemon runs as the image's user, not root.
        for name, p in procs:
            assert p.poll() is None, name + " exited"
            ruid, euid, rgid = ids(p.pid)
            assert (ruid, euid, rgid) == (uid, uid, gid), \
                "%s (pid %d) runs as uid %d/%d gid %d, not %s" % (name, p.pid, ruid, euid, rgid,
                                                                  c["User"])
            with open("/proc/%d/cmdline" % p.pid, "rb") as f:
                argv0 = f.read().split(b"\0")[0].decode()
            assert os.path.basename(argv0) == "kprof-" + name, (name, argv0)

        # kprofctl from the image, with the operator token: import a real trace, read its
        # breakdown.
        user = ["KPROF_COLLECTOR=" + cd_addr, "KPROF_ANALYZER=" + an_addr,
                "KPROF_TLS_CA=" + ca, "KPROF_TOKEN_FILE=" + operator]
        q = img.run(["kprofctl", "import", "--job", "image", "--json", trace_in], user)
        assert q.returncode == 0, "kprofctl import exited %d: %s" % (q.returncode, q.stderr)
        run_id = json.loads(q.stdout)["run_id"]
        q = img.run(["kprofctl", "breakdown", "--run", str(run_id), "--rank", "0", "--json"],
                    user)
        assert q.returncode == 0, "kprofctl breakdown exited %d: %s" % (q.returncode, q.stderr)
        bd = json.loads(q.stdout)
        assert bd["run"] == run_id and bd["rank"] == 0, q.stdout[:2000]
        steps = {s["step"]: s for s in bd["steps"] if s["step"] != "average"}
        want = trace_steps(TRACE)
        assert want and set(steps) == want, \
            "breakdown's steps %s, the trace's %s" % (sorted(steps), sorted(want))
        for s in steps.values():
            assert s["total_us"] > 0 and s["kernel_us"] > 0, s
        # Without a token, kprofctl from the image is refused (the daemons' defaults).
        q = img.run(["kprofctl", "runs"], user[:3])
        assert q.returncode == 7 and "UNAUTHENTICATED" in q.stderr, (q.returncode, q.stderr)
        print("ok: run %d, %d steps, daemons as uid %d" % (run_id, len(steps), uid))
    finally:
        stop([x for x in procs if x[0] == "agent"])
        stop([x for x in procs if x[0] != "agent"])
        for name, p in procs:
            if p.returncode not in (0, -signal.SIGTERM):
                print("%s exited %s:\n%s" % (name, p.returncode, open(logs[name]).read()))
        # The mounts lived in the processes' own namespaces: none is left on the host.
        with open("/proc/self/mountinfo") as f:
            left = [l for l in f if tmp in l]
        assert not left, "mounts left under %s: %s" % (tmp, left)
        shutil.rmtree(tmp, ignore_errors=True)
        drop_users()


if __name__ == "__main__":
    main()
