"""PostgreSQL roles (docs/postgres-roles.md), against the real schema after every migration and
real login users that authenticate with scram-sha-256 passwords:
  1. `kprof-collectord --migrate`, connected as the owner of a fresh database (not a superuser),
     applies every migration, prints each, exits 0; a second run applies none;
  2. a login in kprof_reader cannot INSERT, UPDATE, DELETE, TRUNCATE, CREATE (temporary tables
     included) or call the partition functions; it can SELECT;
  3. a login in kprof_writer cannot CREATE, ALTER or DROP tables, write kp_schema_migrations or
     kp_run_tables, or re-apply the grants;
  4. a login in kprof_dashboard cannot SELECT the raw tables, but reads the kprof_dash views;
  5. kprof-collectord as the writer ingests (kprofctl import, and a run dropped: its partitions
     go through the owner's functions) and summarises the ended run for compare (and settles
     its partitions: kp_settle_run), and kprof-analyzer as the reader answers a breakdown and
     compare;
  6. with a migration pending, kprof-collectord as the writer refuses to start, saying the
     schema's version, the one it needs and to run --migrate as the owner; --migrate as the
     writer fails the same way; --migrate as the owner applies it, and the writer starts; a
     login in none of the roles is told to run --migrate and to join kprof_writer;
  7. no trust: the test cluster's and kprof-stack's pg_hba.conf have no trust line, their
     sockets are not reachable by others (0770), a login without its password is refused, and
     kprof-stack's daemons connect over TCP with the generated 0600 password files."""
import glob
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile

import kpfix
import test_analyzer_service as tas

DB = "it_pg_roles"
COLLECTORD = os.path.join(kpfix.BIN, "collectord", "kprof-collectord")
KPROFCTL = tas.KPROFCTL
SRC = os.environ.get("KPROF_SOURCE_DIR", "")
PG_ARGS = dict(p.split("=", 1) for p in kpfix.PG.split())
PG_DIR, PG_PORT = PG_ARGS["host"], PG_ARGS["port"]
# Login users of this test (cluster-wide: dropped at the start and the end).
USERS = {"owner": "kprof_t_owner", "writer": "kprof_t_writer", "reader": "kprof_t_reader",
         "dash": "kprof_t_dash", "nobody": "kprof_t_nobody"}
GROUPS = {"writer": "kprof_writer", "reader": "kprof_reader", "dash": "kprof_dashboard"}
DENIED = ("permission denied", "must be owner")


def conninfo(who):
    return "host=%s port=%s user=%s dbname=%s" % (PG_DIR, PG_PORT, USERS[who], DB)


def as_user(who, sql, passfile):
    env = dict(os.environ, PGPASSFILE=passfile)
    return subprocess.run([kpfix.PSQL, conninfo(who), "-qtAXw", "-v", "ON_ERROR_STOP=1", "-c",
                           sql], capture_output=True, text=True, env=env, timeout=60)


def allowed(who, sql, passfile):
    p = as_user(who, sql, passfile)
    assert p.returncode == 0, "as %s, %r failed: %s" % (who, sql, p.stderr)
    return p.stdout.strip()


def refused(who, sql, passfile):
    p = as_user(who, sql, passfile)
    assert p.returncode != 0, "as %s, %r succeeded: %s" % (who, sql, p.stdout)
    assert any(d in p.stderr for d in DENIED), "as %s, %r: %s" % (who, sql, p.stderr)


def drop_users():
    kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
    for u in USERS.values():
        kpfix.psql("DROP ROLE IF EXISTS %s" % u, db="postgres")


def migrate(who, pwfiles):
    return subprocess.run([COLLECTORD, "--migrate", "--pg-conninfo", conninfo(who),
                           "--pg-password-file", pwfiles[who]], capture_output=True, text=True,
                          timeout=120 * kpfix.SCALE)


def newest_version():
    return max(int(os.path.basename(p).split("_", 1)[0])
               for p in glob.glob(os.path.join(SRC, "sql", "migrations", "*.sql")))


def check_no_trust(hba, socket_path, what):
    lines = [l.split() for l in open(hba) if l.strip() and not l.lstrip().startswith("#")]
    assert lines, "%s: %s is empty" % (what, hba)
    for l in lines:
        assert "trust" not in l, "%s: trust in %s: %s" % (what, hba, " ".join(l))
    mode = stat.S_IMODE(os.stat(socket_path).st_mode)
    assert mode & 0o007 == 0, "%s: socket %s is mode %o" % (what, socket_path, mode)
    print("%s: %d pg_hba lines, none trust; socket mode %o" % (what, len(lines), mode))


def test_migrate_as_owner(pwfiles):
    p = migrate("owner", pwfiles)
    assert p.returncode == 0, p.stderr
    names = sorted(os.path.basename(f)[:-4]
                   for f in glob.glob(os.path.join(SRC, "sql", "migrations", "*.sql")))
    for n in names:
        assert "applied %s (" % n in p.stdout, (n, p.stdout)
    assert "schema at version %d: %d migrations applied" % (newest_version(), len(names)) \
        in p.stdout, p.stdout
    p = migrate("owner", pwfiles)
    assert p.returncode == 0 and "0 migrations applied" in p.stdout and "applied 0" not in \
        p.stdout, (p.stdout, p.stderr)
    print("--migrate as the owner: %d applied, then none" % len(names))


def test_reader(pf):
    assert allowed("reader", "SELECT count(*) FROM runs", pf) is not None
    for sql in ("INSERT INTO names (name) VALUES ('x')", "UPDATE runs SET job = 'x'",
                "DELETE FROM runs", "TRUNCATE kernel_rows", "CREATE TABLE t_reader (i int)",
                "CREATE TEMP TABLE t_reader (i int)", "SELECT kp_create_run_partitions(9999)",
                "SELECT kp_drop_run(9999)", "SELECT kp_settle_run(9999)",
                "COPY names (name) FROM STDIN"):
        refused("reader", sql, pf)
    print("reader: SELECT only")


def test_writer(pf):
    allowed("writer", "INSERT INTO names (name) VALUES ('it_pg_roles writer') "
                      "ON CONFLICT DO NOTHING", pf)
    for sql in ("CREATE TABLE t_writer (i int)", "CREATE TEMP TABLE t_writer (i int)",
                "ALTER TABLE runs ADD COLUMN x int", "DROP TABLE names CASCADE",
                "CREATE INDEX ON names (name)", "CREATE VIEW v_writer AS SELECT 1",
                "INSERT INTO kp_schema_migrations (version, name) VALUES (9999, 'x')",
                "DELETE FROM kp_schema_migrations", "INSERT INTO kp_run_tables VALUES ('names')",
                "SELECT kp_grant_roles()", "TRUNCATE kernel_rows",
                "TRUNCATE kernel_chunks"):
        refused("writer", sql, pf)
    print("writer: no CREATE, ALTER, DROP, no write to the schema's own tables")


def test_dash(pf):
    for t in ("runs", "kernels", "names", "kp_schema_migrations", "kprof_dash.gpu_events"):
        refused("dash", "SELECT count(*) FROM %s" % t, pf)
    allowed("dash", "SELECT count(*) FROM kprof_dash.runs", pf)
    allowed("dash", "SELECT count(*) FROM kprof_dash.rank_breakdown WHERE run_id = 1", pf)
    print("dashboard: kprof_dash views only")


def test_daemons(pwfiles, tmp):
    cd = an = None
    try:
        cd = kpfix.Collectord("it_pg_roles_cd", conninfo("writer"),
                              ["--pg-password-file", pwfiles["writer"]])
        path = os.path.join(tmp, "no_shapes.json")
        with open(path, "w") as f:
            json.dump(tas.no_shapes_trace(), f)
        out = tas.run([KPROFCTL, "import", "--collector", cd.grpc, "--job", "pgroles", "--json",
                       "--rank", "0", "--progress", "off", path], "kprofctl import as writer")
        run_id = json.loads(out)["run_id"]
        n = int(kpfix.psql("SELECT count(*) FROM kernels WHERE run_id = %d" % run_id, db=DB))
        assert n > 0, "no kernels stored for run %d" % run_id
        an = tas.Analyzer("it_pg_roles_an", conninfo("reader"),
                          ["--pg-password-file", pwfiles["reader"]])
        bd = tas.ctl(an, "breakdown", "--run", str(run_id), "--rank", "0")
        assert bd, "empty breakdown"
        # the run's compare summary, made by collectord as the writer, read by the reader
        kpfix.wait_for(lambda: kpfix.psql("SELECT count(*) FROM compare_runs WHERE run_id = %d"
                                          % run_id, db=DB) == "1", 60, "the compare summary")
        cmp = tas.ctl(an, "compare", "--run", str(run_id))
        assert [r["rank"] for r in cmp["ranks"]] == [0], cmp
        # the summariser, as the writer, moved the run's kernels into chunks (migration 0015);
        # the reader may not move them back, the writer may
        kpfix.wait_for(lambda: kpfix.psql("SELECT count(*) FROM kernel_rows WHERE run_id = %d"
                                          % run_id, db=DB) == "0", 60, "the kernels moved")
        # and settled its partitions (migration 0017) through the owner's function
        kpfix.wait_for(lambda: "run partitions settled run=%d " % run_id in cd.log_text(), 60,
                       "the run's partitions settled")
        pf = os.path.join(tmp, "pgpass")  # main's, every user's password
        refused("reader", "SELECT kp_expand_kernels(%d)" % run_id, pf)
        assert allowed("writer", "SELECT kp_expand_kernels(%d)" % run_id, pf) == str(n), \
            "the writer could not move the kernels"
        assert allowed("writer", "SELECT kp_compact_kernels(%d)" % run_id, pf) == str(n)
        # a second run, dropped: kp_drop_run drops its partitions as their owner
        out = tas.run([KPROFCTL, "import", "--collector", cd.grpc, "--job", "pgroles2", "--json",
                       "--rank", "0", "--progress", "off", path], "kprofctl import as writer")
        run2 = json.loads(out)["run_id"]
        st = kpfix.Stubs(cd.grpc)
        import kprof_pb2 as pb
        drop = st.channel.unary_unary("/kprof.v1.Control/DropRun",
                                      request_serializer=pb.DropRunRequest.SerializeToString,
                                      response_deserializer=pb.Run.FromString)
        drop(pb.DropRunRequest(run_id=run2), timeout=60)
        st.close()
        assert kpfix.psql("SELECT count(*) FROM runs WHERE id = %d" % run2, db=DB) == "0"
        for t in ("kernel_rows", "kernel_chunks", "steps"):
            assert kpfix.psql("SELECT to_regclass('%s_r%d') IS NULL" % (t, run2), db=DB) == "t"
        print("collectord as writer: run %d imported (%d kernels), run %d dropped; analyzer as "
              "reader: breakdown of %d rows" % (run_id, n, run2, len(bd)))
    finally:
        if an is not None:
            an.stop()
        if cd is not None:
            rc = cd.stop()
            assert rc == 0, cd.log_text()
            cd.assert_clean_log()


def test_pending(pwfiles):
    newest = newest_version()
    name = os.path.basename(sorted(glob.glob(os.path.join(SRC, "sql", "migrations",
                                                          "%04d_*.sql" % newest)))[0])[:-4]
    allowed("owner", "DELETE FROM kp_schema_migrations WHERE version = %d" % newest,
            pwfiles["pf"])
    at = int(allowed("owner", "SELECT max(version) FROM kp_schema_migrations", pwfiles["pf"]))
    want = ("the schema is at version %d, this binary needs %d: run kprof-collectord --migrate "
            "as the database owner" % (at, newest))
    p = subprocess.run([COLLECTORD, "--listen", "127.0.0.1:0", "--http-listen", "",
                        "--pg-conninfo", conninfo("writer"), "--pg-password-file",
                        pwfiles["writer"]], capture_output=True, text=True,
                       timeout=60 * kpfix.SCALE)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert want in p.stderr and "missing: %s)" % name in p.stderr, p.stderr
    p = migrate("writer", pwfiles)
    assert p.returncode == 1 and want in p.stderr, (p.returncode, p.stderr)
    p = migrate("owner", pwfiles)
    assert p.returncode == 0, p.stderr
    assert "applied %s (version %d)" % (name, newest) in p.stdout, p.stdout
    assert "1 migration applied" in p.stdout, p.stdout
    cd = kpfix.Collectord("it_pg_roles_cd2", conninfo("writer"),
                          ["--pg-password-file", pwfiles["writer"]])
    rc = cd.stop()
    assert rc == 0, cd.log_text()
    # a login in none of the roles: told what to do, not just "permission denied"
    p = subprocess.run([COLLECTORD, "--listen", "127.0.0.1:0", "--http-listen", "",
                        "--pg-conninfo", conninfo("nobody"), "--pg-password-file",
                        pwfiles["nobody"]], capture_output=True, text=True,
                       timeout=60 * kpfix.SCALE)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "may not read kp_schema_migrations: run kprof-collectord --migrate as the database " \
        "owner, and connect as a member of kprof_writer" in p.stderr, p.stderr
    print("pending migration: the writer refuses (%r), --migrate as the owner applies %s" %
          (want, name))


def test_stack(tmp):
    """kprof-stack up in a directory of its own, on free ports, then down."""
    d = os.path.join(kpfix.TEST_DIR, "it_pg_roles_stack")
    shutil.rmtree(d, ignore_errors=True)
    port = kpfix.free_port()
    env = dict(os.environ, KPROF_STACK_DIR=d, KPROF_BUILD_DIR=kpfix.BIN,
               KPROF_PG_PORT=str(port), KPROF_COLLECTOR_PORT=str(kpfix.free_port()),
               KPROF_COLLECTOR_HTTP_PORT=str(kpfix.free_port()),
               KPROF_ANALYZER_PORT=str(kpfix.free_port()),
               KPROF_ANALYZER_HTTP_PORT=str(kpfix.free_port()),
               KPROF_ANALYZER_WEB_PORT=str(kpfix.free_port()))
    stack = os.path.join(SRC, "deploy", "local", "kprof-stack")
    try:
        p = subprocess.run([stack, "up"], capture_output=True, text=True, env=env,
                           timeout=180 * kpfix.SCALE)
        assert p.returncode == 0, p.stdout + p.stderr
        m = re.search(r"PostgreSQL\s+(host=\S+ port=\d+ user=\S+ dbname=\S+ passfile=\S+)",
                      p.stdout)
        assert m, p.stdout
        ci = m.group(1)
        assert "host=127.0.0.1" in ci and "password" not in ci.replace("passfile", ""), ci
        pgdir = os.path.join(d, "pg")
        if not os.path.isdir(pgdir):
            import hashlib
            pgdir = "/var/tmp/kprof-stack-" + hashlib.md5(d.encode()).hexdigest()[:10]
        check_no_trust(os.path.join(pgdir, "db", "pg_hba.conf"),
                       os.path.join(pgdir, ".s.PGSQL.%d" % port), "kprof-stack")
        for f in ("pg-kprof.password", "pgpass"):
            mode = stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode)
            assert mode == 0o600, (f, oct(mode))
        # with its passfile, over TCP: the daemons' way in; without, refused
        q = subprocess.run([kpfix.PSQL, ci, "-qtAXc", "SELECT max(version) FROM "
                            "kp_schema_migrations"], capture_output=True, text=True, timeout=60)
        assert q.returncode == 0 and q.stdout.strip() == str(newest_version()), q.stderr
        empty = os.path.join(tmp, "empty.pgpass")
        open(empty, "w").close()
        os.chmod(empty, 0o600)
        q = subprocess.run([kpfix.PSQL, ci.replace(m.group(1).split()[-1], "passfile=" + empty),
                            "-qtAXwc", "SELECT 1"], capture_output=True, text=True, timeout=60)
        assert q.returncode != 0 and "password" in q.stderr, (q.returncode, q.stderr)
        print("kprof-stack: scram-sha-256 over TCP with a 0600 passfile; no password, no entry")
    finally:
        subprocess.run([stack, "down"], capture_output=True, text=True, env=env, timeout=120)
        shutil.rmtree(d, ignore_errors=True)


def main():
    kpfix.require_env()
    check_no_trust(os.path.join(PG_DIR, "db", "pg_hba.conf"),
                   os.path.join(PG_DIR, ".s.PGSQL.%s" % PG_PORT), "test cluster")
    drop_users()
    with tempfile.TemporaryDirectory(dir=kpfix.TEST_DIR) as tmp:
        pw = {who: secrets.token_hex(16) for who in USERS}
        pwfiles = {}
        for who, secret in pw.items():
            pwfiles[who] = os.path.join(tmp, who + ".password")
            with open(pwfiles[who], "w") as f:
                f.write(secret + "\n")
            os.chmod(pwfiles[who], 0o600)
        pf = os.path.join(tmp, "pgpass")
        with open(pf, "w") as f:
            for who, secret in pw.items():
                f.write("*:*:*:%s:%s\n" % (USERS[who], secret))
        os.chmod(pf, 0o600)
        pwfiles["pf"] = pf
        try:
            # The owner: not a superuser; CREATEROLE so that the migrations may create the
            # group roles where they do not exist yet.
            kpfix.psql("CREATE ROLE %s LOGIN CREATEROLE PASSWORD '%s'" %
                       (USERS["owner"], pw["owner"]), db="postgres")
            kpfix.psql("CREATE DATABASE %s OWNER %s" % (DB, USERS["owner"]), db="postgres")
            test_migrate_as_owner(pwfiles)
            for who, group in GROUPS.items():
                kpfix.psql("CREATE ROLE %s LOGIN PASSWORD '%s' IN ROLE %s" %
                           (USERS[who], pw[who], group), db="postgres")
            kpfix.psql("CREATE ROLE %s LOGIN PASSWORD '%s'" % (USERS["nobody"], pw["nobody"]),
                       db="postgres")
            # a login without its password is refused (scram-sha-256, not trust)
            empty = os.path.join(tmp, "empty")
            open(empty, "w").close()
            os.chmod(empty, 0o600)
            p = as_user("reader", "SELECT 1", empty)
            assert p.returncode != 0 and "password" in p.stderr, (p.returncode, p.stderr)
            test_reader(pf)
            test_writer(pf)
            test_dash(pf)
            test_daemons(pwfiles, tmp)
            test_pending(pwfiles)
            test_stack(tmp)
        finally:
            drop_users()
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
