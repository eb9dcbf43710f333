"""kprof-agent's start-up check of the GPU profiling permission (agent/preflight.h).

The agent reads the NVIDIA driver's parameters (--nvidia-params, here fake files in the driver's
format). With "RmProfilingAdminOnly: 1" it logs one warning that names the module parameter
NVreg_RestrictProfilingToAdminUsers and CAP_SYS_ADMIN (what an admin does about it) and its
/metrics shows kprof_agent_gpu_profiling_admin_only 1; with 0 no warning and 0; with no file (a
node without the NVIDIA driver) or --nvidia-params "" no warning and -1. The agent serves in
every case."""
import os

import kpfix

kpfix.require_env()
from test_emfile import Daemon  # noqa: E402

AGENT = os.path.join(kpfix.BIN, "agent", "kprof-agent")
DIR = os.path.join(kpfix.TEST_DIR, "it_agent_preflight")
PARAMS = ("ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\n"
          "RmProfilingAdminOnly: %d\nEnableMSI: 1\n")


def agent_with(name, params_arg):
    d = Daemon("it_agent_preflight_" + name,
               [AGENT, "--socket", os.path.join(DIR, name + ".sock"), "--collector", "127.0.0.1:1",
                "--spool-dir", os.path.join(DIR, "spool-" + name), "--nvidia-params", params_arg],
               preexec=None, grpc=False)
    try:
        status, body = d.get("/metrics")
        assert status == 200, (status, body)
        gauge = [l for l in body.splitlines()
                 if l.startswith("kprof_agent_gpu_profiling_admin_only ")]
        assert len(gauge) == 1, body
        assert d.get("/healthz")[0] == 200
    finally:
        assert d.stop() == 0, d.log_text()
    return float(gauge[0].split()[1]), d.log_text()


def main():
    os.makedirs(DIR, exist_ok=True)
    for v in (1, 0):
        path = os.path.join(DIR, "params%d" % v)
        with open(path, "w") as f:
            f.write(PARAMS % v)
        value, log = agent_with("v%d" % v, path)
        assert value == v, (v, value, log)
        warned = [l for l in log.splitlines() if "RmProfilingAdminOnly: 1" in l]
        if v == 1:
            assert len(warned) == 1, log
            for what in ("NVreg_RestrictProfilingToAdminUsers=0", "CAP_SYS_ADMIN",
                         "/etc/modprobe.d/", path, " warn agent: "):
                assert what in warned[0], (what, warned[0])
        else:
            assert not warned, log
    for name, arg in (("missing", os.path.join(DIR, "no-such-params")), ("off", "")):
        value, log = agent_with(name, arg)
        assert value == -1, (name, value, log)
        assert "RmProfilingAdminOnly: 1" not in log, log
    print("agent preflight: RmProfilingAdminOnly 1 warned with the fix and shown as 1 on "
          "/metrics; 0 quiet and 0; no file or disabled: -1")


if __name__ == "__main__":
    main()
