-- kprof schema, version 14: what compare reads, summarised once per run when it ends
-- (collectord/summary.c writes them, analyzer/compare_load.c reads them; docs/specs/compare.md
-- §1). Each table holds exactly the rows of one of compare's live queries over the run's
-- events, so an ended run is compared from a few rows per (rank, step) instead of its events.
-- A run's summary counts only once its compare_runs row exists, with the format version the
-- analyzer knows: a run without one (open, ended before this migration, a summary that failed,
-- or one a late batch made stale: the sink deletes the row) is compared from its events.
-- Idempotent, as every migration: it may be applied again.
CREATE TABLE IF NOT EXISTS compare_runs (
    run_id     integer PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    version    integer NOT NULL,          -- the format (KP_COMPARE_SUMMARY_VERSION)
    made_at    timestamptz NOT NULL DEFAULT now(),
    seconds    double precision NOT NULL  -- how long the summary took
);

-- Per (rank, step; NULL: rows without a step) the sums of the kernels' durations (every
-- kernel), of the runtime API calls' but the synchronising ones, and of the copies' and
-- memsets'; NULL where the table has no row of that (rank, step).
CREATE TABLE IF NOT EXISTS compare_sums (
    run_id     integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank       integer NOT NULL,
    step       integer,
    kernel_ns  bigint,
    api_ns     bigint,
    mem_ns     bigint
);
CREATE INDEX IF NOT EXISTS compare_sums_run ON compare_sums (run_id);

-- The NCCL kernels, one row each.
CREATE TABLE IF NOT EXISTS compare_colls (
    run_id     integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank       integer NOT NULL,
    step       integer,
    start_ns   bigint NOT NULL,
    dur_ns     bigint NOT NULL,
    name       integer
);
CREATE INDEX IF NOT EXISTS compare_colls_run ON compare_colls (run_id);

-- The ops compare reads, one row each: ProfilerStep#N, data loading, Gloo collectives.
CREATE TABLE IF NOT EXISTS compare_ops (
    run_id     integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank       integer NOT NULL,
    step       integer,
    name       integer,
    start_ns   bigint NOT NULL,
    dur_ns     bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS compare_ops_run ON compare_ops (run_id);

-- Each rank's kernels' span: the first start, the last end.
CREATE TABLE IF NOT EXISTS compare_spans (
    run_id     integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank       integer NOT NULL,
    kmin       bigint NOT NULL,
    kmax       bigint NOT NULL,
    PRIMARY KEY (run_id, rank)
);

-- The rows without a step (imports), summed per interval [start_ns, end_ns) of the rank that
-- may be one of its steps: every ProfilerStep# op's, every steps row's and the kernels' span
-- (end + 1). Kernels here leave the NCCL ones out (they come one by one). An interval that
-- the analyzer's steps hold and this table lacks sends it to the events.
CREATE TABLE IF NOT EXISTS compare_ranges (
    run_id     integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank       integer NOT NULL,
    start_ns   bigint NOT NULL,
    end_ns     bigint NOT NULL,
    kernel_ns  bigint NOT NULL,
    api_ns     bigint NOT NULL,
    mem_ns     bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS compare_ranges_run ON compare_ranges (run_id);

-- A summary holds only while the events it was made from stay as they were. kprof never
-- changes a stored event; the sink's late batches into an ended run delete the run's
-- compare_runs row themselves (collectord/sink_pg.c). Rows changed or deleted by hand delete
-- the summaries of their runs; rows inserted by hand (not by the sink, whose flushes set
-- kprof.sink) delete every summary, since which runs they went to is not known without keeping
-- every inserted row, which the sink's COPYs must not pay for.
CREATE OR REPLACE FUNCTION kp_compare_stale_rows() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- FOR SHARE waits for a summary being made (it holds the run FOR NO KEY UPDATE), so that
    -- one made from the rows before this change is deleted once it is committed
    PERFORM 1 FROM runs WHERE id IN (SELECT DISTINCT run_id FROM changed) FOR SHARE;
    DELETE FROM compare_runs WHERE run_id IN (SELECT DISTINCT run_id FROM changed);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION kp_compare_stale_all() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('kprof.sink', true) IS DISTINCT FROM 'on' THEN
        PERFORM 1 FROM runs WHERE state <> 1 FOR SHARE;
        DELETE FROM compare_runs;
    END IF;
    RETURN NULL;
END $$;

DO $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['kernels', 'ops', 'api_calls', 'memcpys', 'memsets', 'steps'] LOOP
        -- applied again after 0015, which made kernels a view over kernel_rows and
        -- kernel_chunks: the rows' table is kernel_rows (0015 sees to kernel_chunks)
        IF (SELECT relkind FROM pg_class WHERE oid = to_regclass(t)) = 'v' THEN
            t := 'kernel_rows';
        END IF;
        EXECUTE format('DROP TRIGGER IF EXISTS compare_stale_update ON %I', t);
        EXECUTE format('DROP TRIGGER IF EXISTS compare_stale_delete ON %I', t);
        EXECUTE format('DROP TRIGGER IF EXISTS compare_stale_insert ON %I', t);
        EXECUTE format('CREATE TRIGGER compare_stale_update AFTER UPDATE ON %I REFERENCING '
                       'OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION '
                       'kp_compare_stale_rows()', t);
        EXECUTE format('CREATE TRIGGER compare_stale_delete AFTER DELETE ON %I REFERENCING '
                       'OLD TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION '
                       'kp_compare_stale_rows()', t);
        EXECUTE format('CREATE TRIGGER compare_stale_insert AFTER INSERT ON %I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION kp_compare_stale_all()', t);
    END LOOP;
END $$;

-- The writer and reader roles of 0012 get their rights by its default privileges when this
-- runs as the same user; kp_grant_roles() covers a migration run by another owner.
SELECT kp_grant_roles();
