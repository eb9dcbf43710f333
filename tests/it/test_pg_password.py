"""The PostgreSQL password stays off the command line and out of what the daemons print, against
the real kprof-collectord and kprof-analyzer and the test PostgreSQL (where kprof authenticates
by peer, so the password itself is not checked by the server; what is checked is how the daemons
handle it; tests/it/test_pg_roles.py logs in with real passwords):
  1. --pg-password-file with a 0600 file: collectord starts, serves, and its log never holds the
     password (nor one written into --pg-conninfo);
  2. a file the group or others may read is refused: exit 1, the message names the file and
     chmod 600, and never the password; so is a missing file;
  3. --print-config shows the password file's path, never its contents, and masks
     --pg-conninfo in both its key=value and postgresql:// URI forms, for both daemons and for
     the setting given in the environment (KPROF_PG_PASSWORD_FILE) and the config file;
  4. --help says how to keep the password off the command line (PGPASSWORD, PGPASSFILE)."""
import os
import subprocess
import sys

from kpfix import BIN, TEST_DIR, Collectord, Stubs, fresh_db, require_env

SECRET = "pw-in-file-5b1f"
CONN_SECRET = "pw-in-conninfo-93ac"
DAEMONS = (("collectord", "kprof-collectord"), ("analyzer", "kprof-analyzer"))


def write_file(path, text, mode):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def run(daemon, args, env=None):
    sub, exe = daemon
    return subprocess.run([os.path.join(BIN, sub, exe)] + args, capture_output=True, text=True,
                          timeout=60, env=env)


def test_starts_with_file(conninfo, pwfile):
    d = Collectord("pgpw", conninfo + " password=" + CONN_SECRET,
                   ["--pg-password-file", pwfile, "--log-level", "debug"])
    try:
        st = Stubs(d.grpc)
        import kprof_pb2 as pb
        runs = st.list_runs(pb.ListRunsRequest(), timeout=30)
        assert runs is not None
        st.close()
    finally:
        rc = d.stop()
    log = d.log_text()
    assert rc == 0, log
    assert SECRET not in log and CONN_SECRET not in log, log
    d.assert_clean_log()


def test_refused(conninfo, d_dir):
    open_file = os.path.join(d_dir, "pw-open")
    write_file(open_file, SECRET + "\n", 0o644)
    missing = os.path.join(d_dir, "pw-missing")
    for daemon in DAEMONS:
        p = run(daemon, ["--listen", "127.0.0.1:0", "--http-listen", "", "--pg-conninfo", conninfo,
                         "--pg-password-file", open_file])
        out = p.stdout + p.stderr
        assert p.returncode == 1, (daemon, p.returncode, out)
        assert open_file in out and "chmod 600" in out, out
        assert SECRET not in out, out
        p = run(daemon, ["--listen", "127.0.0.1:0", "--http-listen", "", "--pg-conninfo", conninfo,
                         "--pg-password-file", missing])
        out = p.stdout + p.stderr
        assert p.returncode == 1 and missing in out, (daemon, p.returncode, out)
        # garbage in the file's place: an empty file and a directory, each named in the error
        empty = os.path.join(d_dir, "pw-empty")
        write_file(empty, "", 0o600)
        for bad in (empty, d_dir):
            p = run(daemon, ["--listen", "127.0.0.1:0", "--http-listen", "", "--pg-conninfo",
                             conninfo, "--pg-password-file", bad])
            out = p.stdout + p.stderr
            assert p.returncode == 1 and bad in out, (daemon, bad, p.returncode, out)
        # a flag the daemon does not know, and one without its value: usage, exit 2
        for args in (["--no-such-flag"], ["--pg-password-file"]):
            p = run(daemon, args)
            out = p.stdout + p.stderr
            assert p.returncode == 2 and args[0] in out, (daemon, args, p.returncode, out)


def test_print_config(pwfile, d_dir):
    forms = ("host=/tmp port=5432 user=kprof password=" + CONN_SECRET + " dbname=kprof",
             "postgresql://kprof:" + CONN_SECRET + "@127.0.0.1:5432/kprof?password=" + CONN_SECRET)
    conf = os.path.join(d_dir, "daemon.conf")
    write_file(conf, "pg-password-file = %s\npg-conninfo = %s\n" % (pwfile, forms[0]), 0o600)
    for daemon in DAEMONS:
        for form in forms:
            p = run(daemon, ["--pg-conninfo", form, "--pg-password-file", pwfile, "--print-config"])
            assert p.returncode == 0, p.stderr
            assert "pg-password-file = %s\n" % pwfile in p.stdout, p.stdout
            assert SECRET not in p.stdout + p.stderr, p.stdout
            assert CONN_SECRET not in p.stdout + p.stderr, p.stdout
        env = dict(os.environ, KPROF_PG_PASSWORD_FILE=pwfile)
        p = run(daemon, ["--print-config"], env=env)
        assert p.returncode == 0 and "pg-password-file = %s\n" % pwfile in p.stdout, p.stdout
        p = run(daemon, ["--config", conf, "--print-config"])
        assert p.returncode == 0 and "pg-password-file = %s\n" % pwfile in p.stdout, p.stdout
        assert CONN_SECRET not in p.stdout and SECRET not in p.stdout, p.stdout


def test_help():
    for daemon in DAEMONS:
        p = run(daemon, ["--help"])
        assert p.returncode == 0, p.stderr
        for word in ("--pg-password-file", "PGPASSWORD", "PGPASSFILE", "KPROF_PG_PASSWORD_FILE"):
            assert word in p.stdout, (word, p.stdout)


def main():
    require_env()
    conninfo = fresh_db("kp_pgpw")
    d_dir = os.path.join(TEST_DIR, "pgpw-files")
    os.makedirs(d_dir, exist_ok=True)
    pwfile = os.path.join(d_dir, "pw")
    write_file(pwfile, SECRET + "\n", 0o600)
    test_starts_with_file(conninfo, pwfile)
    test_refused(conninfo, d_dir)
    test_print_config(pwfile, d_dir)
    test_help()
    print("pg password: 4 passed, 0 failed")


if __name__ == "__main__":
    sys.exit(main())
