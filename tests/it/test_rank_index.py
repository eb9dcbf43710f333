"""A rank's rows without reading the whole run (migration 0017, collectord/summary.c), with the
real kprof-collectord, kprof-analyze and PostgreSQL:
  1. When a run ends, collectord's summariser settles it (kp_settle_run): every event
     partition (but kernel_chunks' and ingest_batches', which have their own indexes by rank)
     gets a BRIN index on rank, and every partition planner statistics; /metrics counts it, and
     settling it again indexes nothing more. An open run's partitions have no such index (ingest
     does not maintain one) until it is settled. A collectord that starts settles an ended run
     left unsettled (its index dropped by hand, here).
  2. The index prunes: rank 0 of a 4-rank run written concurrently reads at most half of the
     ops partition's pages through it (a plain scan reads all), the same count of rows, and
     none of kernel_rows' pages, dead since the kernels moved into chunks; the
     analyzer's breakdown and operator table of rank 1 are the same byte for byte with bitmap
     scans off (the plan before this migration).
  3. Migration: a database built by migrations 0001-0016 with an ended and an open run's ops
     and API calls in it, migrated by `kprof-collectord --migrate`: the ended run's partitions
     are indexed (settling finds nothing left to index), the same rows through the index; the
     open run's are not, nor a new run's; a second --migrate applies none."""
import json
import os
import subprocess

import kpfix

kpfix.require_env()

DB = "kp_it_rank_index"
DB_OLD = "kp_it_rank_index_old"
LOADGEN = os.path.join(kpfix.BIN, "tools", "kprof-loadgen")
ANALYZE = os.path.join(kpfix.BIN, "analyzer", "kprof-analyze")
# The tables a per-rank read filters by rank through the BRIN index.
INDEXED = ("api_calls", "collectives", "counters", "kernel_occupancy", "kernel_rows",
           "memcpy_bandwidth", "memcpys", "memory_events", "memset_bandwidth", "memsets", "ops",
           "steps", "syncs")


def run(args, env=None):
    p = subprocess.run(args, capture_output=True, text=True, env=env,
                       timeout=300 * kpfix.SCALE)
    assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
    return p.stdout


def brin_indexes(part, db):
    return int(kpfix.psql(
        "SELECT count(*) FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
        "JOIN pg_am m ON m.oid = c.relam WHERE x.indrelid = to_regclass('%s') "
        "AND m.amname = 'brin'" % part, db=db))


def check_partitions(rid, db, indexed=True):
    tables = set(kpfix.psql("SELECT string_agg(name, ' ') FROM kp_run_tables", db=db).split())
    assert set(INDEXED) | {"kernel_chunks", "ingest_batches"} == tables, tables
    for t in INDEXED:
        assert brin_indexes("%s_r%d" % (t, rid), db) == int(indexed), \
            "%s_r%d: %s BRIN index expected" % (t, rid, "a" if indexed else "no")
    for t in ("kernel_chunks", "ingest_batches"):
        assert brin_indexes("%s_r%d" % (t, rid), db) == 0, t


def rank_read(table, rid, rank, db, settings):
    """(rows, heap pages read) of a read of one rank, under the planner settings given."""
    plan = json.loads(kpfix.psql(
        "SET max_parallel_workers_per_gather = 0; %s EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT count(*) FROM %s WHERE run_id = %d "
        "AND rank = %d" % (settings, table, rid, rank), db=db))[0]["Plan"]
    nodes, found = [plan], {}
    while nodes:
        n = nodes.pop()
        found.setdefault(n["Node Type"], n)
        nodes.extend(n.get("Plans", []))
    if "Bitmap Heap Scan" in found:
        assert found["Bitmap Index Scan"]["Index Name"] == "%s_r%d_rank_brin" % (table, rid), \
            found
        h = found["Bitmap Heap Scan"]
        return h["Actual Rows"], h.get("Exact Heap Blocks", 0) + h.get("Lossy Heap Blocks", 0)
    s = found["Seq Scan"]
    return s["Actual Rows"], s["Shared Hit Blocks"] + s["Shared Read Blocks"]


def analyzer_json(view, rid, rank, env=None):
    e = dict(os.environ)
    e.pop("PGOPTIONS", None)
    e.update(env or {})
    return run([ANALYZE, "--pg", kpfix.conninfo(DB), "kprofctl", view, "--run", str(rid),
                "--rank", str(rank), "--json"], env=e)


def check_new_runs(cd):
    base = cd.metric("kprof_collectord_runs_settled_total")
    out = run([LOADGEN, "--collector", cd.grpc, "--json", "--ranks", "4", "--threads", "4",
               "--steps", "30", "--kernels-per-step", "100", "--job", "rank_index"])
    rid = json.loads(out)["run_id"]
    kpfix.wait_for(lambda: cd.metric("kprof_collectord_runs_settled_total") > base, 120,
                   "run %d settled" % rid)
    check_partitions(rid, DB)
    assert "run partitions settled run=%d " % rid in cd.log_text(), cd.log_text()
    assert cd.metric("kprof_collectord_run_settle_milliseconds_total") > 0  # 13 index builds
    kpfix.wait_for(lambda: kpfix.psql(
        "SELECT count(*) FROM pg_stat_user_tables WHERE relname IN ('ops_r%d', 'api_calls_r%d') "
        "AND last_analyze IS NOT NULL" % (rid, rid), db=DB) == "2", 30,
        "run %d's partitions analysed" % rid)
    assert kpfix.psql("SELECT kp_settle_run(%d)" % rid, db=DB) == "0", "indexed twice"

    out = run([LOADGEN, "--collector", cd.grpc, "--json", "--ranks", "2", "--steps", "10",
               "--job", "rank_index_open", "--end-run=false"])
    open_rid = json.loads(out)["run_id"]
    check_partitions(open_rid, DB, indexed=False)
    assert kpfix.psql("SELECT kp_settle_run(%d)" % open_rid, db=DB) == str(len(INDEXED))
    check_partitions(open_rid, DB)

    # pruning: rank 0 of 4, through the index, against the scan every read was before
    n_idx, pages_idx = rank_read("ops", rid, 0, DB, "SET enable_seqscan = off;")
    n_scan, pages_scan = rank_read("ops", rid, 0, DB, "SET enable_bitmapscan = off;")
    relpages = int(kpfix.psql("SELECT pg_relation_size('ops_r%d') / "
                              "current_setting('block_size')::int" % rid, db=DB))
    assert n_idx == n_scan > 0, (n_idx, n_scan)
    assert pages_scan >= relpages > 0 and pages_idx * 2 <= relpages, \
        (pages_idx, pages_scan, relpages)
    # the kernels moved into chunks: kernel_rows' partition is dead rows until a VACUUM, and
    # its ranges are summarised as empty (a build leaves them out), so a rank reads none
    assert rank_read("kernel_rows", rid, 0, DB, "SET enable_seqscan = off;") == (0, 0)
    for view in ("breakdown", "ops"):
        a = analyzer_json(view, rid, 1)
        b = analyzer_json(view, rid, 1, {"PGOPTIONS": "-c enable_bitmapscan=off"})
        assert a == b and len(a) > 100, (view, a[:200], b[:200])
    print("run %d: every partition indexed by rank, settled when it ended; rank 0 reads %d of "
          "%d ops pages (a scan: %d), the same %d rows; the analyzer's answers unchanged"
          % (rid, pages_idx, relpages, pages_scan, n_idx))
    return rid


def check_sweep(rid):
    kpfix.psql("DROP INDEX ops_r%d_rank_brin" % rid, db=DB)
    cd = kpfix.Collectord("rank_index_sweep", kpfix.conninfo(DB))
    try:
        kpfix.wait_for(lambda: "run partitions settled run=%d indexed=1 " % rid in cd.log_text(),
                       60, "run %d settled by the start's sweep" % rid)
        check_partitions(rid, DB)
    finally:
        rc = cd.stop()
    assert rc == 0, cd.log_text()
    print("a collectord starting settled run %d, whose ops were not indexed" % rid)


def old_schema_db():
    """A database as migrations 0001-0016 left it (what the previous release's --migrate made),
    with runs 1 (ended) and 2 (open): ops and API calls of ranks 0 and 1, written rank by
    rank."""
    kpfix.schema_before(DB_OLD, 17)
    for rid, state in ((1, 2), (2, 1)):
        kpfix.psql("INSERT INTO runs (id, job, world_size, state) VALUES (%d, 'old', 2, %d); "
                   "SELECT kp_create_run_partitions(%d)" % (rid, state, rid), db=DB_OLD)
        for rank in (0, 1):
            kpfix.psql("INSERT INTO ops (run_id, rank, start_ns, dur_ns, tid, name, kind) "
                       "SELECT %d, %d, i * 1000, 500, 1, NULL, 1 FROM generate_series(1, 40000) "
                       "i; INSERT INTO api_calls (run_id, rank, start_ns, dur_ns, tid, "
                       "correlation) SELECT %d, %d, i * 1000, 100, 1, i FROM "
                       "generate_series(1, 40000) i" % (rid, rank, rid, rank), db=DB_OLD)


def check_migration():
    old_schema_db()
    kpfix.migrate(DB_OLD, "applied 0017_rank_brin")
    check_partitions(1, DB_OLD)
    check_partitions(2, DB_OLD, indexed=False)
    assert kpfix.psql("SELECT kp_settle_run(1)", db=DB_OLD) == "0"
    relpages = int(kpfix.psql("SELECT pg_relation_size('ops_r1') / "
                              "current_setting('block_size')::int", db=DB_OLD))
    for rank in (0, 1):
        n, pages = rank_read("ops", 1, rank, DB_OLD, "SET enable_seqscan = off;")
        assert n == 40000 and pages <= relpages // 2 + 16, (rank, n, pages, relpages)
    kpfix.psql("INSERT INTO runs (id, job, world_size) VALUES (3, 'new', 1); "
               "SELECT kp_create_run_partitions(3)", db=DB_OLD)
    check_partitions(3, DB_OLD, indexed=False)
    kpfix.migrate(DB_OLD, "0 migrations applied")
    print("migration from 0016: the ended run's partitions indexed by rank, a rank read through "
          "the index (%d pages of ops); the open run's and a new run's not" % relpages)


def main():
    kpfix.fresh_db(DB)
    cd = kpfix.Collectord("rank_index", kpfix.conninfo(DB))
    try:
        rid = check_new_runs(cd)
    finally:
        rc = cd.stop()
    assert rc == 0, cd.log_text()
    cd.assert_clean_log()
    check_sweep(rid)
    check_migration()
    kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB_OLD, db="postgres")
    kpfix.psql("DROP DATABASE IF EXISTS %s WITH (FORCE)" % DB, db="postgres")
    print("ok")


if __name__ == "__main__":
    main()
