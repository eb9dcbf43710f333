"""it.test_agent_credential: the agent keeps its captured batches while collectord refuses its
credential, and delivers them once the credential is good again.

A real kprof-collectord that takes only callers with a token (a token file with an agent
token for node "nodeq" and an operator token), and the real kprof-agent with --host nodeq and
that agent token. Once the agent is attached and its worker (a Python stand-in for
libkprof_inject.so, tests/it/kpwire.py) registered, the agent's token is taken out of the
token file (rotated out by mistake), and kprofctl (the operator token) starts a capture: the
agent's pushes are refused (UNAUTHENTICATED). The agent must say so in its log naming
--token-file, store nothing, drop nothing; once a new agent token is in the daemon's table
and in the agent's token file (read again by the running agent: rotation without a restart),
every record of the window reaches PostgreSQL.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import kpfix
import kpwire as kw

kpfix.require_env()

DB = "kp_it_agent_credential"
T = 1_760_000_000_000_000_000
AGENT = os.path.join(kpfix.BIN, "agent", "kprof-agent")
KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")
DIR = os.path.join(kpfix.TEST_DIR, "agent-credential-it")
N_API = 600
AGENT_LINE = "agent nodeq " + "a" * 40 + "\n"
OPERATOR_LINE = "operator oncall " + "o" * 40 + "\n"


def q(sql):
    return kpfix.psql(sql, db=DB)


def secret(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def ctl(addr, env, *args, wait=True):
    p = subprocess.Popen([KPROFCTL] + list(args) + ["--collector", addr], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    if not wait:
        return p
    out, err = p.communicate(timeout=60 * kpfix.SCALE)
    return p.returncode, out, err


def main():
    shutil.rmtree(DIR, ignore_errors=True)
    os.makedirs(DIR)
    tokens = secret(os.path.join(DIR, "tokens"), AGENT_LINE + OPERATOR_LINE)
    agent_token = secret(os.path.join(DIR, "agent.token"), AGENT_LINE.split()[2] + "\n")
    op_token = secret(os.path.join(DIR, "operator.token"), OPERATOR_LINE.split()[2] + "\n")
    env = dict(os.environ, KPROF_TOKEN_FILE=op_token)
    conninfo = kpfix.fresh_db(DB)
    coll = kpfix.Collectord("agent-credential-coll", conninfo,
                            ["--no-allow-anonymous", "--auth-tokens", tokens])
    addr = coll.grpc
    sock = os.path.join(DIR, "agent.sock")
    ready = os.path.join(DIR, "agent.ready")
    log_path = os.path.join(DIR, "agent.log")
    log = open(log_path, "w")
    agent = subprocess.Popen(
        [AGENT, "--socket", sock, "--socket-mode", "0600", "--collector", addr, "--spool-dir",
         os.path.join(DIR, "spool"), "--ready-file", ready, "--batch-rows", "200",
         "--batch-ms", "50ms", "--host", "nodeq", "--token-file", agent_token],
        stdout=log, stderr=subprocess.STDOUT)

    def text():
        with open(log_path) as f:
            return f.read()
    try:
        kpfix.wait_for(lambda: os.path.exists(ready) or agent.poll() is not None, 30,
                       "agent ready")
        assert agent.poll() is None, "agent exited:\n" + text()
        kpfix.wait_for(lambda: "attached to collectord" in text(), 30, "the agent attached")
        lib = kw.Conn(sock)
        lib.send(kw.hello("credjob", 0, local_rank=0, world_size=1, device=0, step=5))
        mtype, payload = lib.recv()
        assert mtype == kw.WELCOME and kw.parse_welcome(payload)[0] == 1
        lib.send(kw.status(0, kw.ST_DORMANT, 5))
        kpfix.wait_for(lambda: "credjob" in ctl(addr, env, "jobs", "--json")[1], 30,
                       "job listed")

        # The agent's token leaves the file (its open Attach call stays); the daemon reads the
        # file again at most once a second.
        secret(tokens, OPERATOR_LINE)
        time.sleep(1.5)
        cap = ctl(addr, env, "start", "--job", "credjob", "--steps", "1", wait=False)
        mtype, payload = lib.recv()
        assert mtype == kw.ARM, mtype
        arm = kw.parse_arm(payload)
        out, err = cap.communicate(timeout=60 * kpfix.SCALE)
        assert cap.returncode == 0, (cap.returncode, out, err)
        run = arm["run_id"]
        cid, s = arm["capture_id"], arm["target_step"]
        base = T + 1_000_000_000
        lib.send(kw.status(cid, kw.ST_ARMED, s - 1))
        lib.send(kw.step(s, base))
        lib.send(kw.window(kw.WINDOW_BEGIN, cid, run, base, 0, s, -1))
        for at in range(0, N_API, 100):
            chunk = range(at, min(at + 100, N_API))
            lib.send(kw.records(kw.REC_API, [kw.api(base + 1000 + i * 1000,
                                                    base + 1100 + i * 1000, i + 1, 2)
                                             for i in chunk]))
            lib.send(kw.records(kw.REC_KERNEL, [kw.kernel(base + 1200 + i * 1000,
                                                          base + 1700 + i * 1000, i + 1, 1)
                                                for i in chunk]))
        end = base + 1000 + N_API * 1000 + 1000
        lib.send(kw.step(s + 1, end))
        lib.send(kw.window(kw.WINDOW_END, cid, run, base, end, s, s, records_=2 * N_API))
        lib.send(kw.status(cid, kw.ST_DONE, s + 1))

        kpfix.wait_for(lambda: "refuses this agent's credential" in text() or
                       "refused a batch; it is dropped" in text(), 30,
                       "the agent to log the refused credential")
        assert "refused a batch; it is dropped" not in text(), (
            "the agent dropped batches because its credential was refused:\n" + text()[-3000:])
        line = [l for l in text().splitlines() if "refuses this agent's credential" in l][0]
        assert "UNAUTHENTICATED" in line and "--token-file" in line, line
        kernels = int(q("SELECT count(*) FROM kernels WHERE run_id = %d" % run))
        assert kernels == 0, "%d kernels stored with a refused token" % kernels

        # A new agent token is issued (rotation): into the daemon's table and the agent's token
        # file, which the running agent reads again (no restart). The spooled batches go in,
        # every one of them.
        new_line = "agent nodeq " + "n" * 40 + "\n"
        secret(tokens, new_line + OPERATOR_LINE)
        secret(agent_token, new_line.split()[2] + "\n")
        kpfix.wait_for(lambda: int(q("SELECT count(*) FROM kernels WHERE run_id = %d" % run))
                       == N_API, 60, "every kernel of run %d stored" % run)
        api = int(q("SELECT count(*) FROM api_calls WHERE run_id = %d" % run))
        assert api == N_API, (api, N_API)
        assert "refused a batch; it is dropped" not in text(), text()[-5000:]
        assert "token file reloaded" in text(), text()[-5000:]
        print("run %d: refused while the token was out, %d kernels and %d API records stored "
              "after a new token was put in the agent's token file" % (run, N_API, api))
        lib.close()
        print("ok")
    except BaseException:
        print("--- agent log ---\n" + text()[-20000:], file=sys.stderr)
        print("--- collectord log ---\n" + coll.log_text()[-5000:], file=sys.stderr)
        raise
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30 * kpfix.SCALE)
        log.close()
        coll.stop()
        kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
    shutil.rmtree(DIR, ignore_errors=True)


if __name__ == "__main__":
    main()
