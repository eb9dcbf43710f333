-- kprof schema, version 15: an ended run's kernels are stored in chunks of 1024, one row per
-- chunk holding each column as an array, compressed with lz4 (docs/storage.md).
--
-- A kernel row costs 126 bytes in a heap table (a 24-byte tuple header and a line pointer
-- before 106 bytes of columns); a chunk row costs 20-25 bytes per kernel on kprof's synthetic
-- and captured traffic: the per-row overhead is paid once per 1024 kernels, and the columns
-- that repeat (names, grids, blocks, registers, streams, steps) compress to almost nothing.
-- Rows are what ingest writes fast (COPY), so the sink keeps writing rows, into kernel_rows;
-- when a run ends, collectord moves its rows into kernel_chunks (kp_compact_kernels, in the
-- transaction that also makes the run's compare summary). Late rows (a batch stored after the
-- end) stay rows until the next end of that run.
--
-- `kernels` becomes a view with the row shape it always had: the rows, then the chunks
-- unnested. Readers (the analyzer, the dashboards' views, ad-hoc SQL) keep reading `kernels`
-- and see every kernel once, whichever side it is on; a compaction swaps rows for chunks in
-- one statement, so no reader sees a kernel twice or not at all.
--
-- Idempotent, as every migration: it may be applied again.

-- 1. The row table and its partitions take the name kernel_rows; triggers, the occupancy side
--    table and the sink's COPY (common/kp_codec.c: the kind's store) follow it.
DO $$
DECLARE
    p record;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('kernels')) = 'p' THEN
        ALTER TABLE kernels RENAME TO kernel_rows;
        FOR p IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = 'kernel_rows'::regclass LOOP
            EXECUTE format('ALTER TABLE %I RENAME TO %I', p.relname,
                           'kernel_rows' || substr(p.relname, length('kernels') + 1));
        END LOOP;
        UPDATE kp_run_tables SET name = 'kernel_rows' WHERE name = 'kernels';
    END IF;
END $$;

-- 2. The chunks: up to 1024 kernels of one rank each, in start order (ties by duration, then
--    correlation), every column of kernel_rows as an array of the same type, element i of
--    every array being kernel i. t0 and t1 bound the chunk's kernels in time (first start,
--    last end) for readers that want a window. Arrays are stored out of line and compressed
--    (lz4: 3-4x faster to decompress than pglz at the same ratio here).
CREATE TABLE IF NOT EXISTS kernel_chunks (
    run_id        integer NOT NULL,
    rank          integer NOT NULL,
    t0            bigint NOT NULL,
    t1            bigint NOT NULL,
    n             integer NOT NULL,
    start_ns      bigint[] COMPRESSION lz4 NOT NULL,
    dur_ns        bigint[] COMPRESSION lz4 NOT NULL,
    correlation   bigint[] COMPRESSION lz4 NOT NULL,
    external_id   bigint[] COMPRESSION lz4 NOT NULL,
    graph_node_id bigint[] COMPRESSION lz4 NOT NULL,
    name          integer[] COMPRESSION lz4 NOT NULL,
    context       integer[] COMPRESSION lz4 NOT NULL,
    stream        integer[] COMPRESSION lz4 NOT NULL,
    grid_x        integer[] COMPRESSION lz4 NOT NULL,
    grid_y        integer[] COMPRESSION lz4 NOT NULL,
    grid_z        integer[] COMPRESSION lz4 NOT NULL,
    static_smem   integer[] COMPRESSION lz4 NOT NULL,
    dynamic_smem  integer[] COMPRESSION lz4 NOT NULL,
    graph_id      integer[] COMPRESSION lz4 NOT NULL,
    step          integer[] COMPRESSION lz4 NOT NULL,
    device        smallint[] COMPRESSION lz4 NOT NULL,
    block_x       smallint[] COMPRESSION lz4 NOT NULL,
    block_y       smallint[] COMPRESSION lz4 NOT NULL,
    block_z       smallint[] COMPRESSION lz4 NOT NULL,
    registers     smallint[] COMPRESSION lz4 NOT NULL
) PARTITION BY LIST (run_id);
CREATE INDEX IF NOT EXISTS kernel_chunks_rank_t0 ON kernel_chunks (rank, t0);
INSERT INTO kp_run_tables (name) VALUES ('kernel_chunks') ON CONFLICT DO NOTHING;
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT id FROM runs LOOP
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF kernel_chunks FOR VALUES IN (%s)',
                       'kernel_chunks_r' || r.id, r.id);
    END LOOP;
END $$;

-- 3. The row shape, as `kernels` always had it (column for column, in 0001's order). A chunk's
--    kernels come out of kp_chunk_kernels rather than an unnest in the view: the planner takes
--    a multi-array unnest for about 10 rows, so a join over the view (a dashboard's, an ad-hoc
--    one) planned as if a rank had 100x fewer kernels than it has chose nested loops that
--    took minutes; the function says 1024 (ROWS), and pinning its search_path (SET) keeps the
--    planner from inlining it back into an unnest. It is also a little faster (one call per
--    chunk, measured 0.32 s vs 0.39 s for 200 k kernels).
CREATE OR REPLACE FUNCTION kp_chunk_kernels(c kernel_chunks)
RETURNS TABLE (start_ns bigint, dur_ns bigint, correlation bigint, external_id bigint,
               graph_node_id bigint, name integer, context integer, stream integer,
               grid_x integer, grid_y integer, grid_z integer, static_smem integer,
               dynamic_smem integer, graph_id integer, step integer, device smallint,
               block_x smallint, block_y smallint, block_z smallint, registers smallint)
LANGUAGE sql IMMUTABLE PARALLEL SAFE ROWS 1024 SET search_path = pg_catalog, pg_temp AS $$
    SELECT * FROM unnest(c.start_ns, c.dur_ns, c.correlation, c.external_id, c.graph_node_id,
                         c.name, c.context, c.stream, c.grid_x, c.grid_y, c.grid_z,
                         c.static_smem, c.dynamic_smem, c.graph_id, c.step, c.device,
                         c.block_x, c.block_y, c.block_z, c.registers)
$$;

CREATE OR REPLACE VIEW kernels AS
SELECT run_id, rank, start_ns, dur_ns, correlation, external_id, graph_node_id, name, context,
       stream, grid_x, grid_y, grid_z, static_smem, dynamic_smem, graph_id, step, device, block_x,
       block_y, block_z, registers
FROM kernel_rows
UNION ALL
SELECT c.run_id, c.rank, u.start_ns, u.dur_ns, u.correlation, u.external_id, u.graph_node_id,
       u.name, u.context, u.stream, u.grid_x, u.grid_y, u.grid_z, u.static_smem, u.dynamic_smem,
       u.graph_id, u.step, u.device, u.block_x, u.block_y, u.block_z, u.registers
FROM kernel_chunks c, kp_chunk_kernels(c) u;
COMMENT ON VIEW kernels IS 'every kernel, one row each: kernel_rows and the unnested kernel_chunks';

-- The dashboards' views that read kernels were bound to the table (now kernel_rows) when 0005
-- made them; made again here, word for word, they read the view.
CREATE OR REPLACE VIEW kprof_dash.gpu_events AS
SELECT k.run_id, k.rank, k.step, k.start_ns, k.dur_ns,
       CASE WHEN k.name IN (SELECT id FROM kprof_dash.nccl_names) THEN 'nccl' ELSE 'kernel' END
           AS kind
FROM kernels k
UNION ALL
SELECT m.run_id, m.rank, m.step, m.start_ns, m.dur_ns, 'memcpy' FROM memcpys m
UNION ALL
SELECT s.run_id, s.rank, s.step, s.start_ns, s.dur_ns, 'memset' FROM memsets s;

CREATE OR REPLACE VIEW kprof_dash.top_kernels AS
SELECT a.run_id, r.job, a.rank,
       coalesce(n.name, '(unnamed)') AS kernel,
       a.name IN (SELECT id FROM kprof_dash.nccl_names) AS is_nccl,
       a.calls,
       a.total_ns / 1e6::double precision AS total_ms,
       a.total_ns / 1e3::double precision / a.calls AS mean_us,
       a.min_ns / 1e3::double precision AS min_us,
       a.max_ns / 1e3::double precision AS max_us,
       100 * a.total_ns::double precision /
           nullif(sum(a.total_ns) OVER (PARTITION BY a.run_id, a.rank), 0) AS pct_of_rank,
       row_number() OVER (PARTITION BY a.run_id, a.rank
                          ORDER BY a.total_ns DESC, coalesce(n.name, '')) AS position
FROM (SELECT run_id, rank, name, count(*) AS calls, sum(dur_ns) AS total_ns,
             min(dur_ns) AS min_ns, max(dur_ns) AS max_ns
      FROM kernels
      GROUP BY run_id, rank, name) a
JOIN runs r ON r.id = a.run_id
LEFT JOIN names n ON n.id = a.name;

-- 4. A hand-made change to the chunks makes the compare summaries stale, as one to the rows
--    does (0014's triggers, which followed the rename). kp_compact_kernels writes the run's
--    partitions directly, which these statement triggers on the parents do not see: moving a
--    kernel from a row to a chunk changes no answer.
DO $$
BEGIN
    DROP TRIGGER IF EXISTS compare_stale_update ON kernel_chunks;
    DROP TRIGGER IF EXISTS compare_stale_delete ON kernel_chunks;
    DROP TRIGGER IF EXISTS compare_stale_insert ON kernel_chunks;
    CREATE TRIGGER compare_stale_update AFTER UPDATE ON kernel_chunks REFERENCING OLD TABLE AS
        changed FOR EACH STATEMENT EXECUTE FUNCTION kp_compare_stale_rows();
    CREATE TRIGGER compare_stale_delete AFTER DELETE ON kernel_chunks REFERENCING OLD TABLE AS
        changed FOR EACH STATEMENT EXECUTE FUNCTION kp_compare_stale_rows();
    CREATE TRIGGER compare_stale_insert AFTER INSERT ON kernel_chunks
        FOR EACH STATEMENT EXECUTE FUNCTION kp_compare_stale_all();
END $$;

-- 5. Moves run rid's kernel rows into chunks, in one statement (the rows it deletes are the
--    rows it chunks: one snapshot); rows stored later stay rows. Returns the kernels moved.
--    With first_page and pages, only the rows on those pages of the run's kernel_rows
--    partition (a TID range scan): the summariser moves a big run in steps of its own
--    transactions, so that a run created meanwhile (whose partitions need the parents'
--    ACCESS EXCLUSIVE lock, which this one's INSERT and DELETE conflict with) waits for one
--    step, not for the whole run. Chunks are cut per rank by position in start order (ties by
--    duration, then correlation), so each call makes a rank's chunks of 1024 kernels each but
--    the last; another call (the next step, late rows) adds chunks of its own. The parents
--    are locked first, in the order kp_create_run_partitions takes them (by name), so that a
--    run created meanwhile waits instead of deadlocking. The arrays line up
--    because one aggregation step feeds every array_agg the same rows in the same order (the
--    subquery's); an ORDER BY per aggregate would sort twenty times, and differently where
--    rows tie. The caller holds the run against new batches if it wants all of them (the
--    summariser does: runs row FOR NO KEY UPDATE). jit off: compiling this statement costs
--    more than it saves at any run size measured.
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
                   array_agg(registers)
            FROM (SELECT *, i / 1024 AS chunk FROM cut ORDER BY run_id, rank, chunk, i) o
            GROUP BY run_id, rank, chunk
            RETURNING n)
        SELECT coalesce(sum(n), 0) FROM made $q$,
        'kernel_rows_r' || rid, range, 'kernel_chunks_r' || rid) INTO moved;
    RETURN moved;
END $$;

-- 6. The inverse, for hand edits: moves run rid's chunks back into rows (where UPDATE and
--    DELETE work as they did on the table), in one statement. Returns the kernels moved. The
--    next end of the run (EndRun) compacts them again. Changing the rows afterwards makes the
--    run's compare summary stale, as 0014's triggers on kernel_rows see to.
CREATE OR REPLACE FUNCTION kp_expand_kernels(rid integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    moved bigint;
BEGIN
    IF to_regclass(format('kernel_rows_r%s', rid)) IS NULL OR
       to_regclass(format('kernel_chunks_r%s', rid)) IS NULL THEN
        RETURN 0;
    END IF;
    LOCK TABLE kernel_chunks, kernel_rows IN ACCESS SHARE MODE; -- as kp_compact_kernels
    EXECUTE format($q$
        WITH gone AS (DELETE FROM %I RETURNING *),
        made AS (
            INSERT INTO %I (run_id, rank, start_ns, dur_ns, correlation, external_id,
                            graph_node_id, name, context, stream, grid_x, grid_y, grid_z,
                            static_smem, dynamic_smem, graph_id, step, device, block_x, block_y,
                            block_z, registers)
            SELECT g.run_id, g.rank, u.*
            FROM gone g,
                 unnest(g.start_ns, g.dur_ns, g.correlation, g.external_id, g.graph_node_id,
                        g.name, g.context, g.stream, g.grid_x, g.grid_y, g.grid_z,
                        g.static_smem, g.dynamic_smem, g.graph_id, g.step, g.device, g.block_x,
                        g.block_y, g.block_z, g.registers) AS u
            RETURNING 1)
        SELECT count(*) FROM made $q$,
        'kernel_chunks_r' || rid, 'kernel_rows_r' || rid) INTO moved;
    RETURN moved;
END $$;

-- 7. The kernels of the runs that have ended move now; open runs' at their end.
SELECT kp_compact_kernels(id) FROM runs WHERE state <> 1 ORDER BY id;

-- The writer and reader roles of 0012 get their rights by its default privileges when this
-- runs as the same user; kp_grant_roles() covers a migration run by another owner.
SELECT kp_grant_roles();
