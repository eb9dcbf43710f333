#!/usr/bin/env python3
"""it.test_kprof_run: the kprof-run launcher and the Python step hook (agent/python).

No PyTorch here: a fake `torch` package (optimizer with the >= 2.0 global post-hook API, or the
< 2.0 API without it, and an emit_nvtx that logs enter/exit) is written to a scratch dir, and a
tiny training loop runs under kprof-run. The hook calls a stand-in library compiled here with cc
(kprof_step logs its argument and returns 1 for steps 3..5); when the real libkprof_inject.so is
built, its kprof_get_stats().current_step is checked too.

Env (from tests/CMakeLists.txt): KPROF_SOURCE_DIR, KPROF_BIN_DIR, KPROF_TEST_DIR (scratch).
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import unittest

SRC = os.environ.get("KPROF_SOURCE_DIR") or os.path.realpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
)
BIN = os.environ.get("KPROF_BIN_DIR", os.path.join(SRC, "build"))
KPROF_RUN = os.path.join(SRC, "agent", "kprof-run")
HOOK_DIR = os.path.realpath(os.path.join(SRC, "agent", "python"))
REAL_LIB = os.path.join(BIN, "agent", "inject", "libkprof_inject.so")

sys.dont_write_bytecode = True
_base = os.environ.get("KPROF_TEST_DIR")
if _base:
    os.makedirs(_base, exist_ok=True)
T = tempfile.mkdtemp(prefix="kprof_run.", dir=_base or None)

FAKE_TORCH = {
    "torch/__init__.py": """
        # fake torch: like the real one, `import torch` imports torch.optim
        from torch import optim
        from torch import autograd
        __version__ = "0.0-fake"
    """,
    "torch/optim/__init__.py": """
        from .optimizer import Optimizer
        from .sgd import SGD
    """,
    "torch/optim/sgd.py": """
        from .optimizer import Optimizer

        class SGD(Optimizer):
            def step(self, closure=None):
                self.steps += 1
    """,
    "torch/optim/optimizer.py": """
        import os

        _global_optimizer_post_hooks = {}
        _next_id = [0]

        class RemovableHandle:
            def __init__(self, d, k):
                self.d, self.k = d, k

            def remove(self):
                self.d.pop(self.k, None)

        def register_optimizer_step_post_hook(hook):
            if os.environ.get("FAKE_TORCH_REGISTER_RAISES"):
                raise RuntimeError("fake torch refuses hooks")
            k = _next_id[0]
            _next_id[0] += 1
            _global_optimizer_post_hooks[k] = hook
            return RemovableHandle(_global_optimizer_post_hooks, k)

        class Optimizer:
            def __init__(self, params):
                self.params = list(params)
                self.steps = 0

            def __init_subclass__(cls, **kw):
                super().__init_subclass__(**kw)
                inner = cls.__dict__.get("step")
                if inner is None or LEGACY:
                    return
                def step(self, *args, **kwargs):  # like torch's profile_hook_step
                    out = inner(self, *args, **kwargs)
                    for h in list(_global_optimizer_post_hooks.values()):
                        h(self, args, kwargs)
                    return out
                cls.step = step

            def step(self, closure=None):
                raise NotImplementedError

        LEGACY = bool(os.environ.get("FAKE_TORCH_LEGACY"))
        if LEGACY:  # PyTorch < 2.0: no global optimizer hooks
            del register_optimizer_step_post_hook
    """,
    "torch/autograd/__init__.py": """
        from . import profiler
    """,
    "torch/autograd/profiler.py": """
        import os

        def _log(msg):
            p = os.environ.get("KPROF_TEST_LOG")
            if p:
                with open(p, "a") as f:
                    f.write(msg + "\\n")

        class emit_nvtx:
            def __init__(self, enabled=True, record_shapes=False):
                self.record_shapes = record_shapes
                self.entered = False

            def __enter__(self):
                if os.environ.get("FAKE_TORCH_NVTX_RAISES"):
                    raise RuntimeError("profiler already enabled on this thread")
                if self.entered:
                    raise RuntimeError("NVTX annotation context manager is not reentrant")
                self.entered = True
                _log("nvtx enter shapes=%s" % self.record_shapes)
                return self

            def __exit__(self, *exc):
                _log("nvtx exit")
                return False
    """,
}

TRAIN = """
import os, sys

def log(msg):
    p = os.environ.get("KPROF_TEST_LOG")
    if p:
        with open(p, "a") as f:
            f.write(msg + "\\n")

log("import torch")
import torch
log("imported torch")
steps = int(os.environ.get("TRAIN_STEPS", "8"))
opts = [torch.optim.SGD([1.0]) for _ in range(int(os.environ.get("TRAIN_OPTIMIZERS", "1")))]
for i in range(steps):
    log("step %d" % i)
    for o in opts:
        o.step()
print("trained %d" % steps)
if os.environ.get("TRAIN_STATS"):
    import ctypes

    class Stats(ctypes.Structure):  # struct kprof_stats, agent/inject/kprof.h
        _fields_ = [("size", ctypes.c_uint32), ("state", ctypes.c_uint32),
                    ("current_step", ctypes.c_int64)] + \\
                   [("u%d" % i, ctypes.c_uint64) for i in range(13)] + \\
                   [("connected", ctypes.c_uint32), ("enabled_kinds", ctypes.c_uint32)]

    lib = ctypes.CDLL(os.environ["CUDA_INJECTION64_PATH"])
    s = Stats()
    s.size = ctypes.sizeof(Stats)
    rc = lib.kprof_get_stats(ctypes.byref(s))
    print("stats rc=%d current_step=%d" % (rc, s.current_step))
"""

NOTORCH = """
import os, sys
print("ctypes" in sys.modules, "_ctypes" in sys.modules, "torch" in sys.modules,
      "kprof_hook" in sys.modules, len([f for f in sys.meta_path if type(f).__name__ == "_Finder"]))
"""

STANDIN_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
/* Stand-in for libkprof_inject.so: logs each step, "records" steps 3..5. */
int kprof_step(int64_t step) {
    const char *p = getenv("KPROF_TEST_LOG");
    FILE *f = p ? fopen(p, "a") : NULL;
    if (f) {
        fprintf(f, "kprof_step %lld\n", (long long)step);
        fclose(f);
    }
    return step >= 3 && step <= 5;
}
"""

NOSTEP_C = "int not_kprof(void) { return 0; }\n"


def write_tree(root, files):
    for rel, text in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(textwrap.dedent(text).lstrip())


def compile_lib(name, source):
    cc = shutil.which("cc")
    if not cc:
        return None
    c = os.path.join(T, name + ".c")
    so = os.path.join(T, name + ".so")
    with open(c, "w") as f:
        f.write(source)
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", so, c], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        return None
    return so


FAKE_DIR = os.path.join(T, "faketorch")
write_tree(FAKE_DIR, FAKE_TORCH)
write_tree(T, {"train.py": TRAIN, "notorch.py": NOTORCH})
STANDIN = compile_lib("standin", STANDIN_C)
NOSTEP = compile_lib("nostep", NOSTEP_C)
DUMMY = os.path.join(T, "dummy_inject.so")  # a file kprof-run accepts; never loaded
open(DUMMY, "w").close()

# A listening socket so that kprof-run does not warn about a missing agent.
SOCK = os.path.join(T, "agent.sock")
_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
_listener.bind(SOCK)
_listener.listen(1)

EXPECTED_STEPS = ["kprof_step %d" % i for i in range(9)]
# Hook registration at import, one kprof_step per step, emit_nvtx while kprof_step returns 1.
EXPECTED_LOG = (
    ["import torch", "kprof_step 0", "imported torch"]
    + ["step 0", "kprof_step 1", "step 1", "kprof_step 2", "step 2", "kprof_step 3"]
    + ["nvtx enter shapes=True", "step 3", "kprof_step 4", "step 4", "kprof_step 5", "step 5"]
    + ["kprof_step 6", "nvtx exit", "step 6", "kprof_step 7", "step 7", "kprof_step 8"]
)


def base_env(**extra):
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "KPROF_AGENT_SOCKET": SOCK,
        "PYTHONDONTWRITEBYTECODE": "1",  # no __pycache__ in the source tree
    }
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def run(args, env, timeout=60, **kw):
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def print_env(args, env, cwd=None):
    r = run([KPROF_RUN, "--print-env"] + args, env, cwd=cwd)
    out = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^export ([A-Z0-9_]+)='(.*)'$", line)
        assert m, "bad --print-env line: %r" % line
        out[m.group(1)] = m.group(2).replace("'\\''", "'")
    return r, out


def env_of(stdout):
    return dict(l.split("=", 1) for l in stdout.splitlines() if "=" in l)


class Launcher(unittest.TestCase):
    def test_usage(self):
        r = run([KPROF_RUN, "--help"], base_env())
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: kprof-run", r.stdout)
        r = run([KPROF_RUN, "--version"], base_env())
        self.assertEqual(r.returncode, 0)
        with open(os.path.join(SRC, "CMakeLists.txt")) as f:
            ver = re.search(r"project\(kprof VERSION ([0-9.]+)", f.read()).group(1)
        self.assertEqual(r.stdout.strip(), "kprof-run " + ver)
        r = run([KPROF_RUN, "--bogus", "true"], base_env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("unknown option: --bogus", r.stderr)
        r = run([KPROF_RUN, "--lib", DUMMY], base_env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("no COMMAND", r.stderr)
        r = run([KPROF_RUN, "--job"], base_env())
        self.assertEqual(r.returncode, 2)
        r = run([KPROF_RUN, "--lib", DUMMY, "no-such-command-kprof"], base_env())
        self.assertEqual(r.returncode, 127)
        self.assertIn("command not found", r.stderr)

    def test_print_env_matches_env(self):
        env = base_env(PYTHONPATH="/opt/site-a:/opt/site-b")
        r, pe = print_env(["--lib", DUMMY, "--job", "j1", "--step-range", "iter "], env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(pe["CUDA_INJECTION64_PATH"], DUMMY)
        self.assertEqual(pe["NVTX_INJECTION64_PATH"], DUMMY)
        self.assertEqual(pe["PYTHONPATH"], HOOK_DIR + ":/opt/site-a:/opt/site-b")
        self.assertEqual(pe["KPROF_AGENT_SOCKET"], SOCK)
        self.assertEqual(pe["KPROF_JOB"], "j1")
        self.assertEqual(pe["KPROF_STEP_RANGE"], "iter ")
        r = run([KPROF_RUN, "--lib", DUMMY, "--job", "j1", "--step-range", "iter ", "env"], env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("kprof: job j1", r.stderr)
        got = env_of(r.stdout)
        for k, v in pe.items():
            self.assertEqual(got.get(k), v, k)
        # Relative --lib becomes absolute; no PYTHONPATH before => no trailing ':' (cwd).
        r, pe = print_env(["--lib", os.path.basename(DUMMY)], base_env(), cwd=T)
        self.assertEqual(pe["CUDA_INJECTION64_PATH"], DUMMY)
        self.assertEqual(pe["PYTHONPATH"], HOOK_DIR)
        # Nested kprof-run does not add the hook dir twice; --no-hook leaves PYTHONPATH alone.
        r, pe = print_env(["--lib", DUMMY], base_env(PYTHONPATH=HOOK_DIR + ":/x"))
        self.assertNotIn("PYTHONPATH", pe)
        r, pe = print_env(["--lib", DUMMY, "--no-hook"], base_env(PYTHONPATH="/x"))
        self.assertNotIn("PYTHONPATH", pe)
        # Default socket when neither --socket nor the env give one.
        env = base_env()
        del env["KPROF_AGENT_SOCKET"]
        r, pe = print_env(["--lib", DUMMY], env)
        self.assertEqual(pe["KPROF_AGENT_SOCKET"], "/run/kprof/agent.sock")
        r, pe = print_env(["--lib", DUMMY, "--socket=/tmp/other.sock"], base_env())
        self.assertEqual(pe["KPROF_AGENT_SOCKET"], "/tmp/other.sock")

    def test_job_name(self):
        _, pe = print_env(["--lib", DUMMY], base_env(KPROF_JOB="kept"))
        self.assertEqual(pe["KPROF_JOB"], "kept")
        _, pe = print_env(["--lib", DUMMY, "--job", "flag"], base_env(KPROF_JOB="kept"))
        self.assertEqual(pe["KPROF_JOB"], "flag")
        _, pe = print_env(["--lib", DUMMY], base_env(TORCHELASTIC_RUN_ID="te-123"))
        self.assertEqual(pe["KPROF_JOB"], "te-123")
        _, pe = print_env(["--lib", DUMMY], base_env(SLURM_JOB_ID="4242"))
        self.assertEqual(pe["KPROF_JOB"], "4242")
        r, pe = print_env(["--lib", DUMMY, "--", "python3", "-u", "/some/where/train.py", "x"],
                          base_env(TORCHELASTIC_RUN_ID="none"))
        m = re.search(r"^kprof: job (\S+) \(generated", r.stderr, re.M)
        self.assertTrue(m, r.stderr)
        self.assertEqual(m.group(1), pe["KPROF_JOB"])
        self.assertRegex(pe["KPROF_JOB"], r"^train-\d{8}-\d{6}-[A-Za-z0-9._-]+$")
        _, pe = print_env(["--lib", DUMMY, "--", "torchrun", "--nproc_per_node", "8", "-m",
                           "pkg.trainer"], base_env())
        self.assertRegex(pe["KPROF_JOB"], r"^trainer-\d{8}-\d{6}-")
        _, pe = print_env(["--lib", DUMMY, "--", "/bin/true"], base_env())
        self.assertRegex(pe["KPROF_JOB"], r"^true-\d{8}-\d{6}-")

    def test_options_end_at_command(self):
        r = run([KPROF_RUN, "-q", "--lib", DUMMY, "sh", "-c", 'echo "$*"; echo "$KPROF_JOB"', "sh",
                 "--job", "inner"], base_env(KPROF_JOB="outer"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines(), ["--job inner", "outer"])
        self.assertEqual(r.stderr, "")  # -q, and the agent socket exists
        r = run([KPROF_RUN, "-q", "--lib", DUMMY, "--", "sh", "-c", "echo ok"], base_env())
        self.assertEqual(r.stdout, "ok\n")

    def test_exec_exit_status_and_signals(self):
        r = run([KPROF_RUN, "-q", "--lib", DUMMY, "sh", "-c", "exit 7"], base_env())
        self.assertEqual(r.returncode, 7)
        r = run([KPROF_RUN, "-q", "--lib", DUMMY, "sh", "-c", "kill -TERM $$"], base_env())
        self.assertEqual(r.returncode, -signal.SIGTERM)
        # exec: the command has kprof-run's pid, so a signal sent to kprof-run reaches it.
        p = subprocess.Popen([KPROF_RUN, "-q", "--lib", DUMMY, sys.executable, "-c", textwrap.dedent("""
            import os, signal, sys, time
            def h(*a):
                os.write(1, b"got USR1\\n")
                os._exit(5)
            signal.signal(signal.SIGUSR1, h)
            print("pid", os.getpid(), flush=True)
            time.sleep(30)
            """)], env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = p.stdout.readline().split()
            self.assertEqual(line, ["pid", str(p.pid)])
            os.kill(p.pid, signal.SIGUSR1)
            out, err = p.communicate(timeout=20)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(p.returncode, 5, err)
        self.assertIn("got USR1", out)

    def test_slot_taken(self):
        other = "/opt/nsight/libToolsInjection64.so"
        env = base_env(CUDA_INJECTION64_PATH=other)
        r = run([KPROF_RUN, "--lib", DUMMY, "env"], env)
        self.assertEqual(r.returncode, 0)
        self.assertIn("injection slot taken by " + other, r.stderr)
        self.assertIn("cannot capture this job's CUDA activity", r.stderr)
        got = env_of(r.stdout)
        self.assertEqual(got["CUDA_INJECTION64_PATH"], other)
        self.assertEqual(got["NVTX_INJECTION64_PATH"], DUMMY)
        self.assertEqual(got["KPROF_HOOK_LIB"], DUMMY)  # the hook calls our library, not Nsight's
        # Both slots taken: no hook on PYTHONPATH (nothing for it to talk to).
        env["NVTX_INJECTION64_PATH"] = other
        r = run([KPROF_RUN, "--lib", DUMMY, "env"], env)
        self.assertIn("cannot capture this job's NVTX ranges", r.stderr)
        got = env_of(r.stdout)
        self.assertEqual(got["NVTX_INJECTION64_PATH"], other)
        self.assertNotIn("PYTHONPATH", got)
        # --force takes them.
        r = run([KPROF_RUN, "--force", "--lib", DUMMY, "env"], env)
        self.assertNotIn("slot taken", r.stderr)
        got = env_of(r.stdout)
        self.assertEqual(got["CUDA_INJECTION64_PATH"], DUMMY)
        self.assertEqual(got["NVTX_INJECTION64_PATH"], DUMMY)
        # Already ours (nested kprof-run): no warning.
        r = run([KPROF_RUN, "--lib", DUMMY, "true"],
                base_env(CUDA_INJECTION64_PATH=DUMMY, NVTX_INJECTION64_PATH=DUMMY))
        self.assertNotIn("slot taken", r.stderr)

    def test_missing_library(self):
        missing = os.path.join(T, "nope", "libkprof_inject.so")
        r = run([KPROF_RUN, "--lib", missing, "env"], base_env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot inject kprof: " + missing, r.stderr)
        self.assertIn("does not exist", r.stderr)
        self.assertIn("--allow-missing", r.stderr)
        self.assertEqual(r.stdout, "")
        r = run([KPROF_RUN, "--lib", T, "true"], base_env())  # a directory
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a readable file", r.stderr)
        r = run([KPROF_RUN, "true"], base_env(KPROF_INJECT_LIB=missing))
        self.assertEqual(r.returncode, 2)
        self.assertIn("KPROF_INJECT_LIB", r.stderr)
        r = run([KPROF_RUN, "--allow-missing", "--lib", missing, "sh", "-c", "env; exit 3"],
                base_env(PYTHONPATH="/x"))
        self.assertEqual(r.returncode, 3)
        self.assertIn("running the command unprofiled", r.stderr)
        got = env_of(r.stdout)
        self.assertNotIn("CUDA_INJECTION64_PATH", got)
        self.assertNotIn("NVTX_INJECTION64_PATH", got)
        self.assertEqual(got["PYTHONPATH"], "/x")

    def test_library_search(self):
        lib_src = STANDIN or DUMMY
        # Installed layout: <prefix>/bin/kprof-run, <prefix>/lib/kprof/{lib, python/}; run through
        # a symlink as from /usr/local/bin.
        prefix = os.path.join(T, "prefix")
        os.makedirs(os.path.join(prefix, "bin"))
        os.makedirs(os.path.join(prefix, "lib", "kprof"))
        shutil.copy(KPROF_RUN, os.path.join(prefix, "bin", "kprof-run"))
        shutil.copytree(HOOK_DIR, os.path.join(prefix, "lib", "kprof", "python"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.makedirs(os.path.join(T, "links"))
        link = os.path.join(T, "links", "kprof-run")
        os.symlink(os.path.join(prefix, "bin", "kprof-run"), link)
        r = run([link, "--print-env"], base_env())
        self.assertEqual(r.returncode, 2)
        self.assertIn("libkprof_inject.so not found", r.stderr)
        shutil.copy(lib_src, os.path.join(prefix, "lib", "kprof", "libkprof_inject.so"))
        r = run([link, "--print-env"], base_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        pe = env_of(r.stdout.replace("export ", "").replace("'", ""))
        real_prefix = os.path.realpath(prefix)
        self.assertEqual(pe["CUDA_INJECTION64_PATH"],
                         os.path.join(real_prefix, "lib", "kprof", "libkprof_inject.so"))
        self.assertEqual(pe["PYTHONPATH"], os.path.join(real_prefix, "lib", "kprof", "python"))
        # Debian's ${CMAKE_INSTALL_LIBDIR} with prefix /usr: lib/<multiarch>/kprof.
        deb = os.path.join(T, "debprefix")
        os.makedirs(os.path.join(deb, "bin"))
        kdir = os.path.join(deb, "lib", "x86_64-linux-gnu", "kprof")
        os.makedirs(kdir)
        shutil.copy(KPROF_RUN, os.path.join(deb, "bin", "kprof-run"))
        shutil.copytree(HOOK_DIR, os.path.join(kdir, "python"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(lib_src, os.path.join(kdir, "libkprof_inject.so"))
        r = run([os.path.join(deb, "bin", "kprof-run"), "--print-env"], base_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        kdir = os.path.realpath(kdir)
        self.assertIn("CUDA_INJECTION64_PATH='%s/libkprof_inject.so'" % kdir, r.stdout)
        self.assertIn("PYTHONPATH='%s/python'" % kdir, r.stdout)
        # KPROF_INJECT_LIB wins over the search.
        r = run([link, "--print-env"], base_env(KPROF_INJECT_LIB=DUMMY))
        self.assertIn("CUDA_INJECTION64_PATH='%s'" % DUMMY, r.stdout)
        # Source tree: agent/kprof-run next to build*/agent/inject/ (./build preferred, else newest).
        tree = os.path.join(T, "tree")
        os.makedirs(os.path.join(tree, "agent"))
        shutil.copy(KPROF_RUN, os.path.join(tree, "agent", "kprof-run"))
        shutil.copytree(HOOK_DIR, os.path.join(tree, "agent", "python"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        libs = {}
        for i, b in enumerate(["build-a", "build-b"]):
            d = os.path.join(tree, b, "agent", "inject")
            os.makedirs(d)
            libs[b] = os.path.join(os.path.realpath(d), "libkprof_inject.so")
            shutil.copy(lib_src, libs[b])
            os.utime(libs[b], (1000000000 + i * 1000, 1000000000 + i * 1000))
        r = run([os.path.join(tree, "agent", "kprof-run"), "--print-env"], base_env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("CUDA_INJECTION64_PATH='%s'" % libs["build-b"], r.stdout)
        self.assertIn("kprof: using " + libs["build-b"], r.stderr)
        self.assertIn("PYTHONPATH='%s'" % os.path.realpath(os.path.join(tree, "agent", "python")),
                      r.stdout)


@unittest.skipUnless(STANDIN, "no cc: cannot build the stand-in library")
class Hook(unittest.TestCase):
    def setUp(self):
        self.log = os.path.join(T, "log.%s" % self._testMethodName)
        if os.path.exists(self.log):
            os.unlink(self.log)

    def train(self, extra_env=None, lib=None, script="train.py", args=()):
        if os.path.exists(self.log):
            os.unlink(self.log)
        env = base_env(PYTHONPATH=FAKE_DIR, KPROF_TEST_LOG=self.log)
        env.update(extra_env or {})
        r = run([KPROF_RUN, "-q", "--lib", lib or STANDIN] + list(args) +
                ["--", sys.executable, os.path.join(T, script)], env)
        return r, self.read_log()

    def read_log(self):
        if not os.path.exists(self.log):
            return []
        with open(self.log) as f:
            return f.read().splitlines()

    def test_steps_and_emit_nvtx(self):
        r, log = self.train()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "trained 8\n")
        self.assertEqual(r.stderr, "")
        self.assertEqual(log, EXPECTED_LOG)

    def test_several_optimizers_count_once_per_step(self):
        r, log = self.train({"TRAIN_OPTIMIZERS": "3"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(log, EXPECTED_LOG)

    def test_legacy_torch_wraps_step(self):
        r, log = self.train({"FAKE_TORCH_LEGACY": "1", "TRAIN_OPTIMIZERS": "2"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertEqual(log, EXPECTED_LOG)

    def test_nvtx_and_shapes_knobs(self):
        r, log = self.train({"KPROF_HOOK_NVTX": "0"})
        self.assertEqual([l for l in log if l.startswith("kprof_step")], EXPECTED_STEPS)
        self.assertFalse([l for l in log if l.startswith("nvtx")])
        r, log = self.train({"KPROF_HOOK_SHAPES": "0"})
        self.assertIn("nvtx enter shapes=False", log)

    def test_hook_off(self):
        r, log = self.train({"KPROF_HOOK": "0"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "trained 8\n")
        self.assertFalse([l for l in log if l.startswith(("kprof_step", "nvtx"))])
        r, log = self.train(args=["--no-hook"])
        self.assertFalse([l for l in log if l.startswith(("kprof_step", "nvtx"))])

    def test_hook_lib_override(self):
        # KPROF_HOOK_LIB is called instead of CUDA_INJECTION64_PATH (here a file that is no ELF).
        r, log = self.train({"KPROF_HOOK_LIB": STANDIN}, lib=DUMMY)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(log, EXPECTED_LOG)
        # Another tool holds the CUDA slot: kprof-run points the hook at our library.
        r, log = self.train({"CUDA_INJECTION64_PATH": DUMMY})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("injection slot taken by " + DUMMY, r.stderr)
        self.assertEqual(log, EXPECTED_LOG)

    def test_process_without_torch_unaffected(self):
        r, log = self.train(script="notorch.py")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        # no ctypes, no torch, hook module loaded with its finder waiting
        self.assertEqual(r.stdout, "False False False True 1\n")
        self.assertEqual(log, [])
        # Without any kprof library in the env the hook loads nothing even with torch.
        env = base_env(PYTHONPATH=HOOK_DIR + ":" + FAKE_DIR, KPROF_TEST_LOG=self.log)
        r = run([sys.executable, os.path.join(T, "train.py")], env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertEqual([l for l in self.read_log() if l.startswith(("kprof", "nvtx"))], [])

    def test_existing_sitecustomize_still_runs(self):
        site = os.path.join(T, "site")
        write_tree(site, {"sitecustomize.py": """
            import os
            SITE_VALUE = 42
            with open(os.environ["KPROF_TEST_LOG"], "a") as f:
                f.write("site sitecustomize ran\\n")
        """})
        probe = os.path.join(T, "probe_site.py")
        with open(probe, "w") as f:
            f.write("import sitecustomize\nprint(sitecustomize.SITE_VALUE)\nimport torch\n")
        env = {"PYTHONPATH": FAKE_DIR + ":" + site}
        r, log = self.train(env, script="probe_site.py")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "42\n")
        self.assertEqual(log, ["site sitecustomize ran", "kprof_step 0"])
        # A second kprof copy on the path (installed + source tree) is skipped, not run twice.
        dup = os.path.join(T, "hookcopy")
        if not os.path.exists(dup):
            shutil.copytree(HOOK_DIR, dup, ignore=shutil.ignore_patterns("__pycache__"))
        env = {"PYTHONPATH": dup + ":" + FAKE_DIR + ":" + site}
        r, log = self.train(env, script="probe_site.py")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(log, ["site sitecustomize ran", "kprof_step 0"])

    def test_hook_failures_never_break_the_job(self):
        r, log = self.train({"FAKE_TORCH_REGISTER_RAISES": "1"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "trained 8\n")
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertRegex(lines[0], r"^kprof: hook disabled: .*fake torch refuses hooks")
        self.assertFalse([l for l in log if l.startswith(("kprof_step", "nvtx"))])
        # A library without kprof_step.
        if NOSTEP:
            r, log = self.train({"KPROF_HOOK_LIB": NOSTEP})
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, "trained 8\n")
            self.assertRegex(r.stderr, r"^kprof: hook disabled: .*has no kprof_step.*\n$")
        # emit_nvtx refuses (the app runs its own profiler): one line, steps still counted.
        r, log = self.train({"FAKE_TORCH_NVTX_RAISES": "1"})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "trained 8\n")
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn("could not enable PyTorch NVTX op ranges", lines[0])
        self.assertEqual(log, [l for l in EXPECTED_LOG if not l.startswith("nvtx")])
        # A hook module that cannot even be imported: sitecustomize reports it, the job runs.
        broken = os.path.join(T, "brokenhook")
        if not os.path.exists(broken):
            shutil.copytree(HOOK_DIR, broken, ignore=shutil.ignore_patterns("__pycache__"))
            with open(os.path.join(broken, "kprof_hook.py"), "w") as f:
                f.write("raise ImportError('simulated broken install')\n")
        env = base_env(PYTHONPATH=broken + ":" + FAKE_DIR, KPROF_TEST_LOG=self.log,
                       CUDA_INJECTION64_PATH=STANDIN)
        r = run([sys.executable, os.path.join(T, "train.py")], env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, "trained 8\n")
        self.assertEqual(r.stderr,
                         "kprof: hook disabled: ImportError: simulated broken install\n")


class Clock(unittest.TestCase):
    """_StepClock directly: one tick per training step."""

    def setUp(self):
        sys.path.insert(0, HOOK_DIR)
        try:
            import kprof_hook
        finally:
            sys.path.remove(HOOK_DIR)
        self.new_clock = kprof_hook._StepClock
        self.clock = self.new_clock()

    def test_patterns(self):
        class Opt:
            pass

        a, b = Opt(), Opt()
        ticks = [self.clock.tick(o) for o in (a, b, a, b, a, b)]
        self.assertEqual(ticks, [1, None, 2, None, 3, None])
        # Wrapper optimizer: inner's post-hook fires first, then the wrapper's.
        c = self.clock = self.new_clock()
        inner, outer = Opt(), Opt()
        start = c.n
        for _ in range(3):
            c.tick(inner)
            c.tick(outer)
        self.assertEqual(c.n - start, 3)
        # An optimizer re-created every step (the previous one is gone): still one tick a step.
        c = self.clock = self.new_clock()
        start = c.n
        for _ in range(4):
            o = Opt()
            c.tick(o)
            del o
        self.assertEqual(c.n - start, 4)
        # Objects that refuse weak references are tracked by id.
        c = self.clock = self.new_clock()
        start = c.n
        x = 1.5
        for _ in range(3):
            c.tick(x)
        self.assertEqual(c.n - start, 3)
        # Switching to a new optimizer while the old one lives on costs one step, then counts.
        c = self.clock = self.new_clock()
        old, new = Opt(), Opt()
        ticks = [c.tick(o) for o in (old, old, new, new, new)]
        self.assertEqual(ticks, [1, 2, None, 3, 4])


def sanitizer_preload(lib):
    """An ASan build of the library needs the ASan runtime loaded first when the program
    (python3 here) is not instrumented: the LD_PRELOAD and options for it, or {}."""
    try:
        out = subprocess.run(["ldd", lib], capture_output=True, text=True, check=False).stdout
    except OSError:
        return {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("libasan.so") and len(parts) >= 3:
            return {"LD_PRELOAD": parts[2], "ASAN_OPTIONS": "detect_leaks=0"}
    return {}


@unittest.skipUnless(os.path.exists(REAL_LIB), "libkprof_inject.so not built at " + REAL_LIB)
class RealLibrary(unittest.TestCase):
    def test_current_step_matches(self):
        env = base_env(PYTHONPATH=FAKE_DIR, TRAIN_STATS="1", TRAIN_STEPS="11",
                       KPROF_AGENT_SOCKET=os.path.join(T, "no-agent.sock"),
                       **sanitizer_preload(REAL_LIB))
        r = run([KPROF_RUN, "-q", "--lib", REAL_LIB, "--", sys.executable,
                 os.path.join(T, "train.py")], env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("hook disabled", r.stderr)
        self.assertIn("trained 11", r.stdout)
        self.assertIn("stats rc=0 current_step=11", r.stdout)


if __name__ == "__main__":
    ok = False
    try:
        ok = unittest.main(exit=False, verbosity=2).result.wasSuccessful()
    finally:
        _listener.close()
        if ok:
            shutil.rmtree(T, ignore_errors=True)
        else:
            sys.stderr.write("scratch kept for inspection: %s\n" % T)
    sys.exit(0 if ok else 1)
