"""kprofctl links no libpq: every verb that reads PostgreSQL does it through a kprof service
(export through kprof-analyzer's Analyzer.Export), so the client installs without the
PostgreSQL client library. Checked on the built binary twice: readelf's NEEDED entries (what the
binary itself asks for) and ldd (what the loader would map, transitively)."""
import os
import subprocess

import kpfix

KPROFCTL = os.path.join(kpfix.BIN, "kprofctl", "kprofctl")


def main():
    assert os.path.exists(KPROFCTL), KPROFCTL
    needed = subprocess.run(["readelf", "-d", KPROFCTL], capture_output=True, text=True,
                            check=True).stdout
    libs = [l.split("[", 1)[1].rstrip("]") for l in needed.splitlines() if "(NEEDED)" in l]
    assert libs, needed
    assert not [l for l in libs if l.startswith("libpq")], "kprofctl needs %s" % libs
    ldd = subprocess.run(["ldd", KPROFCTL], capture_output=True, text=True, check=True).stdout
    assert "libpq" not in ldd, "kprofctl maps libpq:\n" + ldd
    print("kprofctl links no libpq (NEEDED: %s)" % ", ".join(libs))


if __name__ == "__main__":
    main()
