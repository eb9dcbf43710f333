"""kprof's Python step hook (installed by sitecustomize.py, which kprof-run puts on PYTHONPATH).

What it does, in a PyTorch training process:
  * when torch.optim.optimizer is first imported, it loads libkprof_inject.so with ctypes (from
    KPROF_HOOK_LIB, else CUDA_INJECTION64_PATH: the path the CUDA driver loads, so both share one
    mapped copy), calls kprof_step(0) so the library knows a step source exists, and registers a
    global optimizer step post-hook (torch.optim.optimizer.register_optimizer_step_post_hook,
    PyTorch >= 2.0; with older PyTorch it wraps each optimizer's step() instead);
  * the hook counts training steps and calls kprof_step(n) after each (n = steps completed);
  * while kprof_step returns 1 (the library is recording a capture) it keeps
    torch.autograd.profiler.emit_nvtx(record_shapes=True) entered, so PyTorch emits one NVTX range
    per op that the library ties to the op's kernels; when it returns 0 it leaves it again.

Rules: it costs nothing in processes that never import torch.optim (one string comparison per
import until then, nothing after), and it never breaks the job: any failure disables it with one
stderr line ("kprof: hook disabled: <why>"), never an exception into the training loop. The hook
only flips state: no I/O, no network, no waiting (docs/specs/capture.md §6 pitfall 12).

Environment: KPROF_HOOK=0 disables it; KPROF_HOOK_LIB=<path> makes it call that library instead of
CUDA_INJECTION64_PATH (an override for tests and for jobs where another tool holds the CUDA
injection slot); KPROF_HOOK_NVTX=0 never enters emit_nvtx; KPROF_HOOK_SHAPES=0 enters it without
shapes; KPROF_LOG=debug prints what it does. If neither library variable is set (no kprof in this
process) it does nothing at all.
"""

import os
import sys

_TARGET = "torch.optim.optimizer"
_MAX_SEEN = 64  # optimizers tracked per step (bounds memory; more than that ends the step)


def _env_off(name):
    return os.environ.get(name, "").strip().lower() in ("0", "false", "off", "no")


class _State:
    installed = False
    registered = False
    disabled = False
    lib_path = None
    kprof_step = None  # the ctypes function
    handle = None  # RemovableHandle of the global post-hook (PyTorch >= 2.0)
    legacy = None  # (Optimizer class, original __init__) when step() is wrapped instead
    nvtx = None  # the entered emit_nvtx context manager, while recording
    nvtx_skip = False  # emit_nvtx could not be entered: do not retry until the window ends
    nvtx_warned = False
    step = 0
    debug = False
    lock = None  # threading.RLock, created at registration


_st = _State()


def _say(msg):
    try:
        sys.stderr.write("kprof: %s\n" % msg)
        sys.stderr.flush()
    except Exception:
        pass


def _debug(msg):
    if _st.debug:
        _say(msg)


def _disable(why):
    """Turns the hook off for good, once, with one line on stderr. Never raises."""
    if _st.disabled:
        return
    _st.disabled = True
    _say("hook disabled: %s" % why)
    try:
        _remove_finder()
        if _st.handle is not None:
            _st.handle.remove()
            _st.handle = None
        if _st.legacy is not None:
            cls, init = _st.legacy
            cls.__init__ = init
            _st.legacy = None
        _leave_nvtx()
    except Exception:
        pass


def _why(e):
    return "%s: %s" % (type(e).__name__, e)


# ---- counting steps ---------------------------------------------------------------------------
class _StepClock(object):
    """One tick per training step, however many optimizers step in it.

    A step ends (the clock ticks) when an optimizer steps and either no optimizer has stepped yet
    in the current step, or this optimizer already has (the loop came round again), or one that
    has is gone (garbage-collected: optimizers re-created every step or at a stage change).
    Otherwise the optimizer joins the current step (several optimizers stepping once each, a
    wrapper optimizer whose inner optimizer steps too: one tick).

    Why not "count only the first optimizer instance that steps": that stops counting for good when
    that instance is kept alive but no longer stepped, and miscounts when the first one steps only
    every other iteration. Kineto's own counter (KinetoStepTracker) ticks once per optimizer, i.e.
    twice per step with two optimizers. Known limit: an optimizer stepped k times per step (a GAN
    discriminator) ticks k times, on every rank alike, so ranks still agree on step numbers.
    """

    def __init__(self):
        self.n = 0
        self.seen = []  # a weakref.ref (or id) per optimizer stepped in the current step

    @staticmethod
    def _ref(obj):
        import weakref

        try:
            return weakref.ref(obj)
        except TypeError:  # not weak-referenceable: keep its id (never reported as gone)
            return id(obj)

    def tick(self, opt):
        """Records that `opt` stepped. Returns the new step count if a step ended, else None."""
        ended = not self.seen or len(self.seen) >= _MAX_SEEN
        if not ended:
            for r in self.seen:
                if isinstance(r, int):
                    ended = r == id(opt)
                else:
                    o = r()
                    ended = o is None or o is opt
                if ended:
                    break
        if ended:
            self.n += 1
            self.seen = [self._ref(opt)]
            return self.n
        self.seen.append(self._ref(opt))
        return None


_clock = _StepClock()


# ---- emit_nvtx while recording ----------------------------------------------------------------
def _enter_nvtx():
    try:
        from torch.autograd import profiler

        ctx = profiler.emit_nvtx(record_shapes=not _env_off("KPROF_HOOK_SHAPES"))
        ctx.__enter__()
        _st.nvtx = ctx
        _debug("step %d: recording, emit_nvtx entered" % _st.step)
    except Exception as e:  # e.g. the app runs its own profiler: keep counting steps
        _st.nvtx_skip = True
        if not _st.nvtx_warned:
            _st.nvtx_warned = True
            _say(
                "could not enable PyTorch NVTX op ranges (emit_nvtx) for the capture: %s; "
                "kernels are captured without op names" % _why(e)
            )


def _leave_nvtx():
    ctx, _st.nvtx = _st.nvtx, None
    if ctx is None:
        return
    try:
        ctx.__exit__(None, None, None)
        _debug("step %d: capture over, emit_nvtx left" % _st.step)
    except Exception as e:
        if not _st.nvtx_warned:
            _st.nvtx_warned = True
            _say("leaving emit_nvtx failed: %s" % _why(e))


def _advance(n):
    _st.step = n
    recording = _st.kprof_step(n) == 1
    if recording:
        if _st.nvtx is None and not _st.nvtx_skip and not _env_off("KPROF_HOOK_NVTX"):
            _enter_nvtx()
    else:
        _st.nvtx_skip = False
        if _st.nvtx is not None:
            _leave_nvtx()


def _post_hook(optimizer, args=None, kwargs=None):
    """Global optimizer step post-hook: (optimizer, args, kwargs) -> None."""
    if _st.disabled:
        return
    try:
        with _st.lock:  # optimizers stepped from several threads: one clock
            n = _clock.tick(optimizer)
            if n is not None:
                _advance(n)
    except Exception as e:
        _disable("step hook failed: %s" % _why(e))


# ---- registration -----------------------------------------------------------------------------
def _load_library():
    path = os.environ.get("KPROF_HOOK_LIB") or os.environ.get("CUDA_INJECTION64_PATH")
    if not path:
        return False  # no kprof library in this process: nothing to do
    import ctypes

    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise RuntimeError("cannot load %s: %s" % (path, e))
    try:
        fn = lib.kprof_step
    except AttributeError:
        raise RuntimeError("%s has no kprof_step (not libkprof_inject.so?)" % path)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int64]
    _st.lib_path = path
    _st.kprof_step = fn
    return True


def _wrap_legacy(optimizer_cls):
    """PyTorch < 2.0 has no global post-hook: wrap each optimizer instance's step() at the end of
    Optimizer.__init__. A bound method (not a plain function) so that torch 1.x's LR schedulers,
    which re-wrap optimizer.step through __self__/__func__, keep working."""
    import functools
    import types

    orig_init = optimizer_cls.__init__

    def _kprof_step_wrapper(self, *args, **kwargs):
        out = type(self).step(self, *args, **kwargs)
        _post_hook(self, args, kwargs)
        return out

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        if not _st.disabled and "step" not in vars(self):
            try:
                self.step = types.MethodType(_kprof_step_wrapper, self)
            except Exception as e:
                _disable("cannot wrap %s.step: %s" % (type(self).__name__, _why(e)))

    optimizer_cls.__init__ = __init__
    _st.legacy = (optimizer_cls, orig_init)


def _register(module):
    """Runs right after torch.optim.optimizer has executed (torch itself may still be importing:
    touch nothing else of torch here)."""
    if _st.registered or _st.disabled:
        return
    _st.registered = True
    try:
        if not _load_library():
            _debug("no CUDA_INJECTION64_PATH/KPROF_HOOK_LIB: step hook not registered")
            return
        import threading

        _st.lock = threading.RLock()
        reg = getattr(module, "register_optimizer_step_post_hook", None)
        if reg is not None:
            _st.handle = reg(_post_hook)
            how = "register_optimizer_step_post_hook"
        else:
            _wrap_legacy(module.Optimizer)
            how = "wrapped Optimizer.step (PyTorch < 2.0)"
        # Announce the step source. Not entering emit_nvtx here even if the library records
        # already: torch is half imported; the first optimizer step does it.
        _st.kprof_step(0)
        _debug("step hook registered (%s) with %s" % (how, _st.lib_path))
    except Exception as e:
        _disable(_why(e))


class _Loader(object):
    """Wraps the real loader of torch.optim.optimizer to run _register after it executed, then
    puts the real loader back on the module and its spec."""

    def __init__(self, real):
        self._kprof_real = real

    def create_module(self, spec):
        create = getattr(self._kprof_real, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        real = self._kprof_real
        try:
            real.exec_module(module)
        finally:
            try:
                module.__loader__ = real
                if getattr(module, "__spec__", None) is not None:
                    module.__spec__.loader = real
            except Exception:
                pass
        _register(module)

    def __getattr__(self, name):
        if name == "_kprof_real":
            raise AttributeError(name)
        return getattr(self._kprof_real, name)


class _Finder(object):
    """Meta-path finder that only ever answers for torch.optim.optimizer, then removes itself."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TARGET:
            return None
        try:
            _remove_finder()
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is None:
                    continue
                if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                    return None  # let the import system handle it; no hook
                spec.loader = _Loader(spec.loader)
                return spec
        except Exception as e:
            _disable("import hook failed: %s" % _why(e))
        return None

    def invalidate_caches(self):
        pass


_finder = _Finder()


def _remove_finder():
    try:
        while _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
    except Exception:
        pass


def install():
    """Installs the import hook (idempotent). Called by sitecustomize at interpreter start-up."""
    if _st.installed:
        return
    _st.installed = True
    if _env_off("KPROF_HOOK"):
        return
    _st.debug = os.environ.get("KPROF_LOG", "").lower() in ("debug", "trace")
    mod = sys.modules.get(_TARGET)
    if mod is not None:  # already imported (by an earlier sitecustomize, say)
        _register(mod)
        return
    sys.meta_path.insert(0, _finder)


def current_step():
    """The number of training steps counted so far (for tests and debugging)."""
    return _st.step
