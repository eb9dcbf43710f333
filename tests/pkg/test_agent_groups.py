"""kprof-agent's --allow-group, as the kprof-agent unit uses it (--allow-group=kprof-users).

An agent runs with its socket open to everyone on the file system (mode 0666), so only its own
check decides. A process of another user (uid 65534) connects:
  - with no --allow-group and no --allow-uid it is refused (the refusal counted on /metrics and
    logged with the uid);
  - with --allow-group naming a group it has as a supplementary group (by name, and by gid) it
    is taken: it stays connected and /metrics counts one session;
  - with that group as its primary group and no supplementary groups, likewise;
  - in neither, with --allow-group set, it is refused.
A group name that does not exist stops the agent at start with status 1 and a message.
Needs root (to connect as another user): exits 77 (skipped) otherwise."""
import grp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN = os.environ.get("KPROF_BIN_DIR", "")
AGENT = os.path.join(BIN, "agent", "kprof-agent")
NOBODY = 65534


def metrics(http):
    with urllib.request.urlopen("http://%s/metrics" % http, timeout=5) as r:
        body = r.read().decode()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class Agent:
    def __init__(self, d, name, extra):
        self.sock = os.path.join(d, name + ".sock")
        ready = os.path.join(d, name + ".ready")
        self.log_path = os.path.join(d, name + ".log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [AGENT, "--socket", self.sock, "--socket-mode", "0666", "--collector", "127.0.0.1:1",
             "--spool-dir", os.path.join(d, name + ".spool"), "--http-listen", "127.0.0.1:0",
             "--ready-file", ready, "--nvidia-params", ""] + extra,
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(ready) and self.proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert self.proc.poll() is None and os.path.exists(ready), self.text()
        self.http = dict(l.strip().split("=", 1) for l in open(ready) if "=" in l)["http"]

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.log.close()


def connect_as(path, gid, groups, wait_s):
    """A child that becomes uid 65534 with primary gid and supplementary groups, connects to
    path and holds the connection until killed; returns the child and a pipe that says whether
    the agent closed the connection within wait_s ("closed") or not ("open")."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(NOBODY)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(path)
            s.settimeout(wait_s)
            state = b"open"
            try:
                while True:
                    data = s.recv(65536)
                    if not data:
                        state = b"closed"
                        break
            except socket.timeout:
                pass
            os.write(w, state)
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def check(d, name, extra, gid, groups, want_taken):
    a = Agent(d, name, extra)
    try:
        # a refusal closes at once, but a loaded machine may take seconds to get there: wait
        # long for a close that must come, and until the agent has counted the connection
        pid, r = connect_as(a.sock, gid, groups, 2 if want_taken else 20)
        try:
            state = os.read(r, 16).decode()
            deadline = time.time() + 20
            while True:
                m = metrics(a.http)
                if (m.get("kprof_agent_connections_refused_total", 0) +
                        m.get("kprof_agent_sessions", 0) >= 1 or time.time() > deadline):
                    break
                time.sleep(0.05)
            refused = m.get("kprof_agent_connections_refused_total", -1)
            sessions = m.get("kprof_agent_sessions", -1)
            if want_taken:
                assert state == "open", (name, state, a.text())
                assert refused == 0 and sessions == 1, (name, refused, sessions, a.text())
            else:
                assert state == "closed", (name, state, a.text())
                assert refused == 1 and sessions == 0, (name, refused, sessions, a.text())
                assert "uid=%d" % NOBODY in a.text(), a.text()
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
    finally:
        a.stop()


def main():
    if not BIN:
        print("KPROF_BIN_DIR must be set (run through ctest)", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("SKIP: needs root to connect as another user", file=sys.stderr)
        return 77
    g = grp.getgrnam("users")  # Debian's group 100; any group the test user is not in will do
    other = grp.getgrnam("daemon").gr_gid
    d = tempfile.mkdtemp(prefix="kp_agent_groups.")
    os.chmod(d, 0o755)
    try:
        check(d, "none", [], NOBODY, [], False)
        check(d, "by_name", ["--allow-group", "daemon," + g.gr_name], NOBODY, [g.gr_gid], True)
        check(d, "by_gid", ["--allow-group", str(g.gr_gid)], NOBODY, [other, g.gr_gid], True)
        check(d, "primary", ["--allow-group", g.gr_name], g.gr_gid, [], True)
        check(d, "outside", ["--allow-group", g.gr_name], NOBODY, [other], False)
        p = subprocess.run([AGENT, "--socket", os.path.join(d, "x.sock"), "--spool-dir",
                            os.path.join(d, "x.spool"), "--allow-group", "no-such-group-kp",
                            "--nvidia-params", ""],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 1 and "no group named no-such-group-kp" in p.stderr, p
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("agent groups: refused without --allow-group; taken by supplementary group (name, "
          "gid) and by primary group; refused outside them; an unknown group stops the start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
