"""kprofctl's and kprof-agent's credential flags: --tls-ca, --tls-cert, --tls-key, --token-file.

Bad input is refused before any call, naming the path or the flag, with the documented exit
status (kprofctl 2, kprof-agent 1): a missing token file, one others may read (and what to
chmod), a client certificate without the CA or without its key, a token to a non-loopback
address without TLS. Against a collectord that serves TLS with client certificates
(--tls-client-ca) and a token file: a viewer's certificate (mutual TLS) lists runs, but may not
stop a capture (exit 7 naming the operator role); an operator's token file in KPROF_TOKEN_FILE
(also read from the config file, as every flag) passes that check; a wrong token is exit 7
naming the file.
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kpfix  # noqa: E402

CTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
AGENT = os.path.join(kpfix.BIN, "agent", "kprof-agent")


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KPROF_")}
    env.update(extra or {})
    return env


def ctl(args, env=None):
    return subprocess.run([CTL] + args, capture_output=True, text=True, env=clean_env(env),
                          timeout=60 * kpfix.SCALE, stdin=subprocess.DEVNULL)


def openssl(*args):
    subprocess.run(["openssl"] + list(args), check=True, capture_output=True)


def make_pki(d):
    """A CA, a server certificate for localhost/127.0.0.1, and a viewer's client certificate."""
    def key(name):
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out",
                os.path.join(d, name + ".key"))

    def sign(name, subject, ext):
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write(ext)
        openssl("req", "-new", "-key", os.path.join(d, name + ".key"), "-subj", subject, "-out",
                os.path.join(d, name + ".csr"))
        openssl("x509", "-req", "-in", os.path.join(d, name + ".csr"), "-CA",
                os.path.join(d, "ca.pem"), "-CAkey", os.path.join(d, "ca.key"),
                "-CAcreateserial", "-days", "2", "-sha256", "-extfile",
                os.path.join(d, name + ".ext"), "-out", os.path.join(d, name + ".pem"))

    key("ca")
    openssl("req", "-x509", "-new", "-key", os.path.join(d, "ca.key"), "-days", "2", "-subj",
            "/CN=test ca", "-addext", "basicConstraints=critical,CA:TRUE", "-out",
            os.path.join(d, "ca.pem"))
    key("server")
    sign("server", "/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    key("viewer")
    sign("viewer", "/CN=alice", "subjectAltName=URI:urn:kprof:viewer:alice\n")
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o600)


def secret(path, text, mode=0o600):
    with open(path, "w") as f:
        f.write(text + "\n")
    os.chmod(path, mode)
    return path


def bad_input(tmp):
    missing = os.path.join(tmp, "no-such.token")
    loose = secret(os.path.join(tmp, "loose.token"), "y" * 40, 0o644)
    ok = secret(os.path.join(tmp, "ok.token"), "z" * 40)
    cert = os.path.join(tmp, "pki", "viewer.pem")
    key = os.path.join(tmp, "pki", "viewer.key")
    ca = os.path.join(tmp, "pki", "ca.pem")
    cases = [
        (["--token-file", missing], [missing]),
        (["--token-file", loose], [loose, "chmod 600"]),
        (["--tls-cert", cert, "--tls-key", key], ["--tls-cert needs --tls-ca"]),
        (["--tls-ca", ca, "--tls-cert", cert], ["--tls-cert and --tls-key go together"]),
        (["--collector", "10.255.0.1:7070", "--token-file", ok], ["clear text", "--tls-ca"]),
    ]
    for flags, words in cases:
        # A Control verb, an Analyzer verb and import: one channel code for all.
        for verb in (["runs"], ["breakdown", "--run", "1", "--rank", "0"]):
            args = verb + [("--analyzer" if f == "--collector" and verb[0] != "runs" else f)
                           for f in flags]
            p = ctl(args)
            assert p.returncode == 2, (args, p.returncode, p.stderr)
            for w in words:
                assert w in p.stderr, (args, w, p.stderr)
            assert p.stderr.startswith("kprofctl %s: " % verb[0]), p.stderr
    # The same from the environment, for import (after its files are scanned).
    tr = os.path.join(tmp, "rank-0.pt.trace.json")
    with open(tr, "w") as f:
        f.write('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, '
                '"tid": 1, "ts": 10, "dur": 5, "args": {}}]}')
    p = ctl(["import", "--job", "creds", tr], {"KPROF_TOKEN_FILE": loose})
    assert p.returncode == 2 and loose in p.stderr and "chmod 600" in p.stderr, (p.returncode,
                                                                           p.stderr)
    # kprof-agent: exit 1 (failed to start), naming what is wrong.
    for flags, word in ((["--token-file", missing], missing),
                        (["--token-file", loose], "chmod"),
                        (["--tls-ca", ca, "--tls-cert", cert], "--tls-key")):
        p = subprocess.run([AGENT, "--socket", os.path.join(tmp, "a.sock"), "--spool-dir",
                            os.path.join(tmp, "spool"), "--collector", "127.0.0.1:1"] + flags,
                           capture_output=True, text=True, env=clean_env(),
                           timeout=30 * kpfix.SCALE, stdin=subprocess.DEVNULL)
        assert p.returncode == 1 and word in p.stderr, (flags, p.returncode, p.stderr)
    p = subprocess.run([AGENT, "--help"], capture_output=True, text=True, env=clean_env())
    assert p.returncode == 0 and "--token-file" in p.stdout and "urn:kprof:agent:NAME" in p.stdout
    print("bad input refused")


def against_tls_collectord(tmp):
    pki = os.path.join(tmp, "pki")
    op_token = "o" * 40
    tokens = secret(os.path.join(tmp, "tokens"), "operator bob " + op_token)
    ci = kpfix.fresh_db("it_kprofctl_creds")
    cd = kpfix.Collectord("it_kprofctl_creds", ci, [
        "--no-plaintext", "--no-allow-anonymous", "--tls-cert", os.path.join(pki, "server.pem"),
        "--tls-key", os.path.join(pki, "server.key"), "--tls-client-ca",
        os.path.join(pki, "ca.pem"), "--auth-tokens", tokens])
    try:
        base = {"KPROF_COLLECTOR": cd.grpc, "KPROF_TLS_CA": os.path.join(pki, "ca.pem")}
        mtls = ["--tls-cert", os.path.join(pki, "viewer.pem"), "--tls-key",
                os.path.join(pki, "viewer.key")]
        p = ctl(["runs"] + mtls, base)
        assert p.returncode == 0, (p.returncode, p.stderr)
        p = ctl(["stop", "--run", "424242"] + mtls, base)
        assert p.returncode == 7 and "operator role" in p.stderr, (p.returncode, p.stderr)
        # The operator's token passes the role check: the run is then unknown (3).
        op = secret(os.path.join(tmp, "op.token"), op_token)
        p = ctl(["stop", "--run", "424242"], dict(base, KPROF_TOKEN_FILE=op))
        assert p.returncode == 3, (p.returncode, p.stderr)
        # ... and from the config file too.
        conf = os.path.join(tmp, "kprofctl.conf")
        with open(conf, "w") as f:
            f.write("token-file = %s\n" % op)
        p = ctl(["stop", "--run", "424242", "--config=" + conf], base)
        assert p.returncode == 3, (p.returncode, p.stderr)
        # A token the daemon does not know.
        wrong = secret(os.path.join(tmp, "wrong.token"), "w" * 40)
        p = ctl(["runs", "--token-file", wrong], base)
        assert p.returncode == 7 and wrong in p.stderr and "UNAUTHENTICATED" in p.stderr, (
            p.returncode, p.stderr)
        # No credential at all: exit 7, saying which flag.
        p = ctl(["runs"], base)
        assert p.returncode == 7 and "--token-file" in p.stderr, (p.returncode, p.stderr)
        # Plaintext to a TLS collectord: unreachable (5), with the hint to give --tls-ca.
        p = ctl(["runs", "--timeout", "3s"], {"KPROF_COLLECTOR": cd.grpc})
        assert p.returncode == 5 and "--tls-ca" in p.stderr, (p.returncode, p.stderr)
        print("TLS collectord checked")
    finally:
        cd.stop()
        kpfix.psql("DROP DATABASE IF EXISTS it_kprofctl_creds WITH (FORCE)", db="postgres")


def main():
    kpfix.require_env()
    tmp = tempfile.mkdtemp(prefix="kprof-creds-", dir=kpfix.TEST_DIR)
    try:
        os.mkdir(os.path.join(tmp, "pki"))
        make_pki(os.path.join(tmp, "pki"))
        bad_input(tmp)
        against_tls_collectord(tmp)
        print("ok")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
