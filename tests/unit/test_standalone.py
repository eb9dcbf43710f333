"""The repository stands alone: a fresh clone has everything its code, tests and benches use.

1. No tracked text file points outside the tree: no parent-relative `shared` folder (as a
   path or as Python path parts) and no absolute path into the machine the project was built
   on. The patterns are assembled below so that this file does not match itself.
2. Every document cited as docs/specs/<name>.md, docs/design.md or docs/style.md exists, and
   every section cited as `NAME.md §N` (or §N.M) is a heading of that document (`§N ...`),
   so a citation always leads to the right text.
3. The peer data the tests read is in tests/data/peers, with its README.
4. Code says why in its own words: no source file (C, Python, shell, SQL, CMake) refers to an
   issue by its number; the tracker is not part of the repository.

Files are the tracked ones (`git ls-files`) when KPROF_SOURCE_DIR is a git checkout, else
every file under it (a source tarball). Exit status 0 when all hold, 1 with one line per
offence otherwise."""
import os
import re
import subprocess
import sys

SRC = os.environ.get("KPROF_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")

# Files left out of check 1. README.md is rewritten by the integrator of the standalone
# change; remove it from this list when it no longer points outside the tree.
EXEMPT = ()
EXEMPT_DIRS = ("docs/history/",)

PARENT = "." + "./" + "shared"
OUTSIDE = re.compile("|".join([
    re.escape(PARENT),
    r'"\.\."\s*,\s*"' + "shared" + '"',
    re.escape("/" + "work" + "/"),
]))
CODE = (".c", ".h", ".py", ".sh", ".sql", ".txt", ".cmake", ".proto")
ISSUE_REF = re.compile(r"\b[Ii]ssues?\s*#?\d+|\(#\d+\)|\bGH-\d+")
CITED_DOC = re.compile(r"docs/(?:specs/[\w.-]+\.md|design\.md|style\.md)")
# "tbplugin-views.md §9", "docs/style.md §6", "hta-analyses.md §5-§7" (each § after the name)
CITED_SECTION = re.compile(r"([\w-]+\.md)((?:\s*(?:§[\d.]*\d|,|-|and))+)")


def tracked():
    try:
        out = subprocess.run(["git", "-C", SRC, "ls-files", "-z"], check=True,
                             capture_output=True).stdout
        return [p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(SRC):
            dirs[:] = [x for x in dirs if not x.startswith(".") and not x.startswith("build")]
            files += [os.path.relpath(os.path.join(d, n), SRC) for n in names]
        return files


def text(path):
    try:
        with open(os.path.join(SRC, path), "rb") as f:
            b = f.read()
    except OSError:
        return None
    if b"\0" in b:
        return None
    return b.decode("utf-8", "replace")


def doc_path(name):
    """The document a bare file name cites (tbplugin-views.md -> docs/specs/...)."""
    if name in ("design.md", "style.md"):
        return "docs/" + name
    if os.path.exists(os.path.join(SRC, "docs", "specs", name)):
        return "docs/specs/" + name
    return None


def headings(path):
    t = text(path) or ""
    return set(re.findall(r"^#+\s*§([\d.]*\d)", t, re.M))


def main():
    bad = []
    files = tracked()
    for p in files:
        t = text(p)
        if t is None:
            continue
        for i, line in enumerate(t.splitlines(), 1):
            if (p not in EXEMPT and not p.startswith(EXEMPT_DIRS) and
                    not p.startswith("tests/unit/test_standalone") and OUTSIDE.search(line)):
                bad.append("%s:%d points outside the repository: %s" % (p, i, line.strip()))
            for d in CITED_DOC.findall(line):
                if not os.path.isfile(os.path.join(SRC, d)):
                    bad.append("%s:%d cites %s, which does not exist" % (p, i, d))
            if (p.endswith(CODE) and not p.startswith("tests/unit/test_standalone") and
                    ISSUE_REF.search(line)):
                bad.append("%s:%d refers to an issue number; say the reason instead: %s" %
                           (p, i, line.strip()))
            if p.startswith(("docs/", "tests/data/")):
                continue
            for name, secs in CITED_SECTION.findall(line):
                doc = doc_path(name)
                if doc is None:
                    continue
                have = headings(doc)
                for s in re.findall(r"§([\d.]*\d)", secs):
                    if s not in have:
                        bad.append("%s:%d cites %s §%s, which has no such section" %
                                   (p, i, doc, s))
    for need in ("docs/design.md", "docs/style.md", "tests/data/peers/README.md",
                 "tests/data/peers/hta", "tests/data/peers/tbplugin"):
        if not os.path.exists(os.path.join(SRC, need)):
            bad.append("%s is missing" % need)
    for line in bad:
        print(line)
    print("%d files checked, %d problems" % (len(files), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
