"""kprof's OCI image (deploy/image/build.sh) serves: built from the kprof .debs on a clean
Debian 12, unpacked with umoci, and its daemons started from its root filesystem.

Builds the image (or reuses it: the build stamps the .debs' contents), checks the configuration
it declares (a non-root User by uid, CMD kprof-collectord and no ENTRYPOINT, ports 7070-7073,
the OCI labels), unpacks it with umoci into a bundle and, from that root filesystem, as the
image's User with its Env (the runtime configuration umoci writes), starts kprof-collectord and
kprof-analyzer (TLS and a token table, nothing plaintext or anonymous: the daemons' defaults)
against the test PostgreSQL and a kprof-agent with an agent token. kprofctl from the image then
imports a real trace (tests/data/peers) with the operator token and reads its step breakdown,
which must hold every step of the trace. Each daemon must run as the image's user
(/proc/PID/status). Without podman that runs here (its runtime cannot set its rlimits in this
machine's container), each process is chroot into the root filesystem in a mount namespace of
its own (unshare), where the PostgreSQL socket directory and /proc are mounted: nothing is
mounted on the host, and the mounts go with the process. Needs root, mmdebstrap, umoci and the
.debs (cpack in the build tree, or KPROF_IMAGE_DEBS); exits 77 (skipped) without root or the
tools. Stops every process by pid and removes the bundle.
"""
import glob
import gzip
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kpfix  # noqa: E402

SRC = os.environ.get("KPROF_SOURCE_DIR",
                     os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD_SH = os.path.join(SRC, "deploy", "image", "build.sh")
TRACE = os.path.join(SRC, "tests", "data", "peers", "hta", "trace_filter_2rank",
                     "sampled_rank-0.json.gz")
DB = "kp_it_image"
NODE = "image-node"


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def debs_dir():
    """The directory of the kprof .debs: KPROF_IMAGE_DEBS, else the build tree's packages/,
    made there with cpack when a package is missing."""
    d = os.environ.get("KPROF_IMAGE_DEBS")
    if d:
        return d
    d = os.path.join(kpfix.BIN, "packages")
    names = ("kprof-collectord", "kprof-analyzer", "kprof-agent", "kprofctl")
    if all(glob.glob(os.path.join(d, n + "_*.deb")) for n in names):
        return d
    cfg = os.path.join(kpfix.BIN, "CPackConfig.cmake")
    assert os.path.exists(cfg), "no %s: the build tree has no packaging (CPack)" % cfg
    p = subprocess.run(["cpack", "--config", cfg, "-G", "DEB"], cwd=kpfix.BIN,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, "cpack failed:\n%s\n%s" % (p.stdout, p.stderr)
    missing = [n for n in names if not glob.glob(os.path.join(d, n + "_*.deb"))]
    assert not missing, "cpack made no %s in %s" % (missing, d)
    return d


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

    def __init__(self, bundle, pg_dir):
        self.root = os.path.join(bundle, "rootfs")
        with open(os.path.join(bundle, "config.json")) as f:
            self.spec = json.load(f)
        proc = self.spec["process"]
        self.uid, self.gid = proc["user"]["uid"], proc["user"]["gid"]
        self.env = proc.get("env", [])
        self.cwd = proc.get("cwd", "/")
        self.args = proc["args"]
        self.pg_dir = pg_dir

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

    def argv(self, args, env=()):
        """The host command that runs args in the image as its user, with its Env (plus env) and
        working directory: unshare a mount namespace, mount /proc and the PostgreSQL socket
        directory into the root filesystem, chroot. unshare, sh, chroot and env exec one
        another, so the pid returned is the program's."""
        mounts = ["mount -t proc proc %s" % shlex.quote(self.path("/proc"))]
        if self.pg_dir:
            mounts.append("mount --bind %s %s" % (shlex.quote(self.pg_dir),
                                                 shlex.quote(self.path(self.pg_dir))))
        script = " && ".join(mounts) + ' && exec chroot --userspec=%d:%d --groups=%d %s ' \
            '/usr/bin/env -i -C %s "$@"' % (self.uid, self.gid, self.gid,
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
        conninfo = kpfix.fresh_db(DB)
        kv = dict(x.split("=", 1) for x in conninfo.split() if "=" in x)
        host = kv.get("host", "")
        img = Image(bundle, host if host.startswith("/") else None)
        assert (img.uid, img.gid) == (uid, gid), (img.spec["process"]["user"], c["User"])
        assert img.args == ["kprof-collectord"], img.args
        for inside in ("/proc",) + ((img.pg_dir,) if img.pg_dir else ()):
            os.makedirs(img.path(inside), exist_ok=True)
        for name, entry in (("passwd", uid), ("group", gid)):
            with open(img.path("/etc/" + name)) as f:
                owners = [l.split(":") for l in f]
            assert [o for o in owners if o[0] == "kprof" and int(o[2]) == entry], \
                "the image's User %s is not kprof in its /etc/%s" % (c["User"], name)
        pgenv = []
        if os.environ.get("PGPASSFILE"):
            pgenv = ["PGPASSFILE=" + img.put(os.environ["PGPASSFILE"], "/etc/kprof/test/pgpass")]

        # TLS material and tokens, made on the host and copied in (owned by the image's user).
        pki = kpfix.make_pki(os.path.join(tmp, "pki"))
        toks = {r: subprocess.run(["openssl", "rand", "-hex", "24"], capture_output=True,
                                  text=True, check=True).stdout.strip()
                for r in ("agent", "operator")}
        table = kpfix.write_tokens(os.path.join(tmp, "tokens"), [
            "agent %s %s" % (NODE, toks["agent"]), "operator operator %s" % toks["operator"]])
        sec = "/etc/kprof/test"
        files = {}
        for key, src in (("ca", pki.ca), ("cert", pki.server), ("key", pki.server_key),
                         ("tokens", table)):
            files[key] = img.put(src, "%s/%s" % (sec, os.path.basename(src)))
        for role in toks:
            path = os.path.join(tmp, role + ".token")
            with open(path, "w") as f:
                f.write(toks[role] + "\n")
            files[role] = img.put(path, "%s/%s.token" % (sec, role))
        trace_in = img.put(TRACE, "/var/lib/kprof/" + os.path.basename(TRACE), 0o644)
        serve = ["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
                 "--tls-cert", files["cert"], "--tls-key", files["key"],
                 "--auth-tokens", files["tokens"], "--pg-conninfo", conninfo]

        helptext = img.run(["kprof-collectord", "--help"]).stdout
        if "--migrate" in helptext:
            q = img.run(["kprof-collectord", "--migrate", "--pg-conninfo", conninfo], pgenv)
            assert q.returncode == 0, "kprof-collectord --migrate: %s" % q.stderr

        def launch(name, args):
            logs[name] = os.path.join(tmp, name + ".log")
            p = img.start(args, open(logs[name], "w"), pgenv)
            procs.append((name, p))
            return p

        def wait_ready(name, p):
            def check():
                assert p.poll() is None, "%s exited %s:\n%s" % (name, p.returncode,
                                                               open(logs[name]).read())
                return ready(img, name)
            return kpfix.wait_for(check, 60, "%s to be ready:\n%s" % (
                name, open(logs[name]).read()))

        # collectord: the image's default command, with the flags a deployment adds.
        cd = launch("collectord", img.args + serve + [
            "--ready-file", "/run/kprof/collectord.ready"])
        cd_addr = wait_ready("collectord", cd)["grpc"]
        an = launch("analyzer", ["kprof-analyzer"] + serve + [
            "--ready-file", "/run/kprof/analyzer.ready"])
        an_addr = wait_ready("analyzer", an)["grpc"]
        ag = launch("agent", [
            "kprof-agent", "--socket", "/run/kprof/agent.sock",
            "--spool-dir", "/var/lib/kprof/spool", "--collector", cd_addr,
            "--tls-ca", files["ca"], "--token-file", files["agent"], "--host", NODE,
            "--ready-file", "/run/kprof/agent.ready"])
        kpfix.wait_for(lambda: ag.poll() is None and os.path.exists(
            img.path("/run/kprof/agent.ready")), 60, "the agent to be ready:\n" +
            open(logs["agent"]).read())
        kpfix.wait_for(lambda: "agent attached host=%s " % NODE in open(logs["collectord"]).read(),
                       30, "the agent to attach:\n" + open(logs["collectord"]).read())

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
                "KPROF_TLS_CA=" + files["ca"], "KPROF_TOKEN_FILE=" + files["operator"]]
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
        try:
            kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
        except subprocess.CalledProcessError:
            pass


if __name__ == "__main__":
    main()
