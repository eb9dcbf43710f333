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

-- A chunk's range of correlations (c0, c1: its kernels' least and greatest, NULL where it has
-- none or was made before this migration): the analyzer's windows (an_window.c) take a window's
-- kernels by correlation, and with the range they read only the chunks that may hold some
-- instead of every chunk of the rank after the window's start. kp_compact_kernels (0015) is
-- the same, with the two columns filled. Chunks made before are not backfilled (that would
-- read every chunk stored): windows read them all, as they would without the columns.
ALTER TABLE kernel_chunks ADD COLUMN IF NOT EXISTS c0 bigint, ADD COLUMN IF NOT EXISTS c1 bigint;

CREATE OR REPLACE FUNCTION kp_compact_kernels(rid integer, first_page bigint DEFAULT 0,
                                              pages bigint DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    moved bigint;
    range text := '';
BEGIN
    IF to_regclass(format('kernel_rows_r%s', rid)) IS NULL OR
       to_regclass(format('kernel_chunks_r%s', rid)) IS NULL THEN
        RETURN 0;
    END IF;
    LOCK TABLE kernel_chunks, kernel_rows IN ACCESS SHARE MODE;
    IF pages IS NOT NULL THEN
        range := format(' WHERE ctid >= ''(%s,0)''::tid AND ctid < ''(%s,0)''::tid',
                        first_page, first_page + pages);
    END IF;
    EXECUTE format($q$
        WITH gone AS (DELETE FROM %I%s RETURNING *),
        cut AS (SELECT g.*, (row_number() OVER (PARTITION BY rank ORDER BY start_ns, dur_ns,
                                                correlation) - 1) AS i
                FROM gone g),
        made AS (
            INSERT INTO %I
            SELECT run_id, rank, min(start_ns), max(start_ns + dur_ns), count(*),
                   array_agg(start_ns),
                   array_agg(dur_ns),
                   array_agg(correlation),
                   array_agg(external_id),
                   array_agg(graph_node_id),
                   array_agg(name),
                   array_agg(context),
                   array_agg(stream),
                   array_agg(grid_x),
                   array_agg(grid_y),
                   array_agg(grid_z),
                   array_agg(static_smem),
                   array_agg(dynamic_smem),
                   array_agg(graph_id),
                   array_agg(step),
                   array_agg(device),
                   array_agg(block_x),
                   array_agg(block_y),
                   array_agg(block_z),
                   array_agg(registers),
                   min(correlation),
                   max(correlation)
            FROM (SELECT *, i / 1024 AS chunk FROM cut ORDER BY run_id, rank, chunk, i) o
            GROUP BY run_id, rank, chunk
            RETURNING n)
        SELECT coalesce(sum(n), 0) FROM made $q$,
        'kernel_rows_r' || rid, range, 'kernel_chunks_r' || rid) INTO moved;
    RETURN moved;
END $$;

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
            -- and by start where the table has one: a rank's rows come about in time order,
            -- so a time window of a rank (the analyzer's windows, an_window.c) prunes too
            EXECUTE format('CREATE INDEX %I ON %s USING brin (rank%s) '
                           'WITH (pages_per_range = 16)', t || '_r' || rid || '_rank_brin', p,
                           CASE WHEN EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = p
                                             AND a.attname = 'start_ns' AND NOT a.attisdropped)
                                THEN ', start_ns' ELSE '' END);
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
