# KPROF_SITECUSTOMIZE: this marker tells copies of this file apart from a site's own
# sitecustomize when chaining (see _chain below); keep it in the first lines.
"""kprof's sitecustomize: installs the kprof step hook, then runs the site's own sitecustomize.

kprof-run puts this directory first on PYTHONPATH, so Python's site module imports this file as
`sitecustomize` at start-up in every Python process of the job. It must never break start-up:
any failure of the hook is reported once on stderr ("kprof: hook disabled: <why>") and swallowed.
A sitecustomize further down sys.path (the distribution's, a site's, a virtualenv's) would be
hidden by this one, so it is looked up and executed afterwards; its errors propagate exactly as
they would without kprof (site.py reports them).
"""


def _kprof_install():
    import sys

    try:
        import kprof_hook

        kprof_hook.install()
    except Exception as e:  # never let the hook break interpreter start-up
        try:
            sys.stderr.write("kprof: hook disabled: %s: %s\n" % (type(e).__name__, e))
        except Exception:
            pass


def _kprof_chain():
    """Finds the next sitecustomize on sys.path that is not a kprof copy and executes it."""
    import os
    import sys
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    def _real(p):
        try:
            return os.path.realpath(p or os.curdir)
        except Exception:
            return p

    skip = {_real(os.path.dirname(os.path.abspath(__file__)))}
    for _ in range(16):  # bounded: each round skips one more kprof copy
        path = [p for p in sys.path if isinstance(p, str) and _real(p) not in skip]
        spec = PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return None
        origin = spec.origin or ""
        try:
            with open(origin, "rb") as f:
                head = f.read(512)
        except OSError:
            head = b""
        if b"KPROF_SITECUSTOMIZE" in head:  # another kprof copy (installed and source tree)
            skip.add(_real(os.path.dirname(origin)))
            continue
        module = module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return None


def _kprof_export(chained):
    # Code that does `import sitecustomize; sitecustomize.X` still finds the site's names.
    g = globals()
    for k, v in vars(chained).items():
        if not k.startswith("__") and k not in g:
            g[k] = v


_kprof_install()
_kprof_chained = _kprof_chain()
if _kprof_chained is not None:
    _kprof_export(_kprof_chained)
