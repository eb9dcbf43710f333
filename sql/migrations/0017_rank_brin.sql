-- kprof schema, version 17: a rank's rows without reading the whole run (docs/storage.md).
--
-- The event tables are partitioned by run, and every per-rank read (the analyzer's views, the
-- exports, the dashboards' per-rank panels) filters a partition by rank. Without an index on
-- rank that is a scan of every rank's rows: rank 0 of a 16-rank run read 16 ranks (51 k pages
-- for 3 k of its own). A BRIN index on rank is a few pages per run (96 KiB for 420 MiB of ops);
-- it prunes because a rank's rows come in batches, each COPY filling pages of its own, so that
-- a range of 16 pages (128 KiB) holds one rank's rows most of the time (1.5 ranks on average
-- with 16 ranks writing at once).
--
-- The index is made when a run ends, not with its partitions: maintained during ingest it
-- cost 15% of a raw COPY of ops rows, and an open run's ranges would stay unsummarised (so
-- unpruned) until autovacuum came by. collectord's summariser calls kp_settle_run when a run
-- ends, after its kernels moved into chunks: it indexes the run's partitions by rank,
-- summarises what late rows added to ranges indexed before (EndRun again), and ANALYZEs the
-- partitions (a fresh partition has no planner statistics, and without them the planner scans
-- it whole). Reading a rank of a run not settled (open, or ended by a collectord that failed
-- to settle it) is what it was before this migration: correct, a scan.
--
-- kernel_chunks has its own index by (rank, t0) (0015), and ingest_batches its primary key
-- (run_id, rank, stream, seq): they get none.
--
-- Applying it indexes the partitions of every ended run: one read of their events, each
-- partition under a SHARE lock for the time of its build (a late batch into an ended run
-- waits for it); their planner statistics are autovacuum's, as before. Idempotent, as every
-- migration: it may be applied again.

-- Indexes run rid's partitions by rank (those not indexed yet) and summarises the ranges not
-- summarised yet: pages after the last live row at the build, pages late rows added. Returns the partitions indexed now. SECURITY DEFINER: an
-- index and a summary need the tables' owner, and the writer is not; it touches only the
-- partitions of run rid.
CREATE OR REPLACE FUNCTION kp_index_run(rid integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    p regclass;
    i regclass;
    n integer := 0;
BEGIN
    FOR t IN SELECT k.name FROM kp_run_tables k
             WHERE k.name NOT IN ('kernel_chunks', 'ingest_batches')
               AND EXISTS (SELECT 1 FROM pg_attribute a
                           WHERE a.attrelid = to_regclass(k.name) AND a.attname = 'rank'
                             AND NOT a.attisdropped)
             ORDER BY k.name LOOP
        p := to_regclass(t || '_r' || rid);
        CONTINUE WHEN p IS NULL;
        i := to_regclass(t || '_r' || rid || '_rank_brin');
        IF i IS NULL THEN
            EXECUTE format('CREATE INDEX %I ON %s USING brin (rank) '
                           'WITH (pages_per_range = 16)', t || '_r' || rid || '_rank_brin', p);
            i := to_regclass(t || '_r' || rid || '_rank_brin');
            n := n + 1;
        END IF;
        -- The build leaves unsummarised (so read by every query) the ranges after the last
        -- live row: all of kernel_rows' once its rows moved into chunks, which stay dead
        -- pages until a VACUUM. Summarised, they are empty ranges, pruned.
        PERFORM brin_summarize_new_values(i);
    END LOOP;
    RETURN n;
END
$$;

-- When a run ends (collectord's summariser): kp_index_run, then ANALYZE of every partition of
-- the run. Returns the partitions indexed now. SECURITY DEFINER, as kp_index_run.
CREATE OR REPLACE FUNCTION kp_settle_run(rid integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    p regclass;
    n integer := kp_index_run(rid);
BEGIN
    FOR t IN SELECT name FROM kp_run_tables ORDER BY name LOOP
        p := to_regclass(t || '_r' || rid);
        CONTINUE WHEN p IS NULL;
        EXECUTE format('ANALYZE %s', p);
    END LOOP;
    RETURN n;
END
$$;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION kp_index_run(integer) SECURITY DEFINER '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION kp_settle_run(integer) SECURITY DEFINER '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;
REVOKE ALL ON FUNCTION kp_index_run(integer), kp_settle_run(integer) FROM PUBLIC;

-- The runs that have ended, indexed now (open runs are when they end).
DO $$
BEGIN
    PERFORM kp_index_run(id) FROM runs WHERE state <> 1 ORDER BY id;
END
$$;

-- The roles' grants (0016's kp_grant_roles), with kp_settle_run for the writer.
CREATE OR REPLACE FUNCTION kp_grant_roles() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'kprof_writer') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO kprof_writer', s);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I '
                       'TO kprof_writer', s);
        EXECUTE format('GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA %I '
                       'TO kprof_writer', s);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I '
                       'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO kprof_writer', s);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I '
                       'GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO kprof_writer', s);
        REVOKE INSERT, UPDATE, DELETE ON kp_schema_migrations, kp_run_tables FROM kprof_writer;
        GRANT EXECUTE ON FUNCTION kp_create_run_partitions(integer), kp_drop_run(integer),
            kp_settle_run(integer) TO kprof_writer;
        -- collectord's summariser makes the dashboards' sums (0016) through the functions the
        -- views use, which read these two helper views
        GRANT USAGE ON SCHEMA kprof_dash TO kprof_writer;
        GRANT SELECT ON kprof_dash.gpu_events, kprof_dash.nccl_names TO kprof_writer;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'kprof_reader') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO kprof_reader', s);
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO kprof_reader', s);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I '
                       'GRANT SELECT ON TABLES TO kprof_reader', s);
    END IF;
END
$$;
REVOKE ALL ON FUNCTION kp_grant_roles() FROM PUBLIC;

SELECT kp_grant_roles();
